//! The page map: one word per page of the primary source's span, like
//! Linux's `struct page` → slab pointer. It answers "who owns this
//! pointer?" for `kfree`, `ksize`, `owns` and wrong-cache detection.
//!
//! Entry encoding (low 3 bits are the tag; slab structs are 8-aligned):
//! - `0`: not slab memory (not handed out by the allocator, or free);
//! - `slab | TAG_SLAB`: a page of a slab (small or bufctl) whose
//!   [`Slab`](crate::slab::Slab) struct is at `slab`;
//! - `nr_pages << 3 | TAG_LARGE_HEAD`: first page of a page-granular
//!   kmalloc of `nr_pages` pages;
//! - `distance << 3 | TAG_LARGE_TAIL`: a later page of one;
//! - `trail << 32 | lead << 3 | TAG_LARGE_LEAD` / `TAG_LARGE_TRAIL`: the
//!   slack pages before (`lead` of them) and after (`trail`) a
//!   page-granular kmalloc aligned above a page, which took
//!   `lead + nr_pages + trail` pages from the source;
//! - `nr_pages << 3 | TAG_LARGE_FREED`: the first page of a page-granular
//!   kmalloc that `kfree` gave back, until the page is used again (a slab
//!   or another page-granular kmalloc overwrites the entry): a second
//!   `kfree` of it is told apart from a stray pointer and reported as a
//!   duplicate free (illumos `KMERR_DUPFREE`) with the block's size.

use core::sync::atomic::{AtomicUsize, Ordering};

use crate::platform::{PAGE_SHIFT, PAGE_SIZE};

pub(crate) const TAG_MASK: usize = 7;
pub(crate) const TAG_SLAB: usize = 1;
pub(crate) const TAG_LARGE_HEAD: usize = 2;
pub(crate) const TAG_LARGE_TAIL: usize = 3;
pub(crate) const TAG_LARGE_LEAD: usize = 4;
pub(crate) const TAG_LARGE_TRAIL: usize = 5;
pub(crate) const TAG_LARGE_FREED: usize = 6;

/// Whether a page-map entry says the allocator owns the page now (a slab
/// page or a live page-granular kmalloc): not 0, not a freed block's mark.
#[inline(always)]
pub(crate) const fn entry_is_live(entry: usize) -> bool {
    // Tags 1..=5 are live; 0 (nothing) and TAG_LARGE_FREED are not.
    (entry & TAG_MASK).wrapping_sub(1) < TAG_LARGE_TRAIL
}

/// Where the page map lives. Copied into every cache at creation; never
/// changes after `init`.
#[derive(Clone, Copy)]
pub(crate) struct PageMap {
    /// Address of the first page of the span.
    pub(crate) base: usize,
    pub(crate) nr_pages: usize,
    pub(crate) entries: *const AtomicUsize,
}

impl PageMap {
    pub(crate) const fn empty() -> Self {
        PageMap {
            base: 0,
            nr_pages: 0,
            entries: core::ptr::null(),
        }
    }

    /// Index of the page holding `addr`, if it is inside the span.
    #[inline]
    pub(crate) fn index(&self, addr: usize) -> Option<usize> {
        let index = addr.wrapping_sub(self.base) >> PAGE_SHIFT;
        if index < self.nr_pages {
            Some(index)
        } else {
            None
        }
    }

    #[inline]
    fn entry(&self, index: usize) -> &AtomicUsize {
        debug_assert!(index < self.nr_pages);
        // SAFETY: index < nr_pages, the length of the entry array, which
        // lives (from the primary source) as long as the allocator.
        unsafe { &*self.entries.add(index) }
    }

    /// The entry for `addr`, 0 if outside the span.
    #[inline]
    pub(crate) fn get(&self, addr: usize) -> usize {
        match self.index(addr) {
            Some(index) => self.entry(index).load(Ordering::Acquire),
            None => 0,
        }
    }

    /// Set the entries of `nr_pages` pages from `addr`. Returns false (and
    /// sets nothing) if any page is outside the span.
    pub(crate) fn set_range(
        &self,
        addr: usize,
        nr_pages: usize,
        value: impl Fn(usize) -> usize,
    ) -> bool {
        let Some(first) = self.index(addr) else {
            return false;
        };
        if nr_pages == 0 || first + nr_pages > self.nr_pages {
            return false;
        }
        for page in 0..nr_pages {
            self.entry(first + page)
                .store(value(page), Ordering::Release);
        }
        true
    }

    /// Clear the entries of `nr_pages` pages from `addr` (none for 0).
    pub(crate) fn clear_range(&self, addr: usize, nr_pages: usize) {
        self.set_range(addr, nr_pages, |_| 0);
    }

    /// Atomically claim a large-allocation head entry: replace `expected`
    /// by `freed` (its [`TAG_LARGE_FREED`] mark). False if someone else
    /// changed it first.
    pub(crate) fn claim(&self, addr: usize, expected: usize, freed: usize) -> bool {
        match self.index(addr) {
            Some(index) => self
                .entry(index)
                .compare_exchange(expected, freed, Ordering::AcqRel, Ordering::Acquire)
                .is_ok(),
            None => false,
        }
    }

    /// Bytes of entry array needed for a span of `nr_pages` pages, in pages.
    pub(crate) fn pages_for(nr_pages: usize) -> usize {
        (nr_pages * core::mem::size_of::<usize>()).div_ceil(PAGE_SIZE)
    }
}
