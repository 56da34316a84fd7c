//! The page map: one slot per page of the primary source's span, like
//! Linux's `struct page` → slab pointer. It answers "who owns this
//! pointer?" for `kfree`, `ksize`, `owns` and wrong-cache detection.
//!
//! A slot ([`PageSlot`], 32 bytes, two to a cache line) is the entry
//! word below plus, for a slab page, what the free hit needs from the
//! slab so that it reads no slab header: the owning cache, the
//! address of the slab's first object (its colour included) and the
//! stride's magic, which is 0 on every other page: so the object-start
//! test refuses those pages, and the hit needs no owner null test. A free
//! then touches the object's page-map slot and the per-CPU line only
//! (issue 18; the header was a D1 and LL miss per free at 1M live
//! objects). Like SLUB's `struct slab` fields in `struct page`.
//!
//! Entry encoding ([`PageEntry`]; low 3 bits are the tag; slab structs
//! are 8-aligned):
//! - `0`: not slab memory (not handed out by the allocator, or free);
//! - `slab | TAG_SLAB`: a page of a slab (small or bufctl) whose
//!   [`Slab`](crate::slab::Slab) struct is at `slab`;
//! - `nr_pages << 3 | TAG_LARGE_HEAD`: first page of a page-granular
//!   kmalloc of `nr_pages` pages. Only the head is written (O(1) for any
//!   size, as TLSF's block header): the later pages of the block keep
//!   `0` (or a stale freed mark, below), and a pointer into them is
//!   found by walking back to the head ([`PageMap::large_block_of`], on
//!   the error paths only);
//! - `distance << 3 | TAG_LARGE_TAIL`: a later page of one, as
//!   [`PageMap::get_resolved`] reports it (never stored);
//! - `trail << 32 | lead << 3 | TAG_LARGE_LEAD` / `TAG_LARGE_TRAIL`: the
//!   slack pages before (`lead` of them) and after (`trail`) a
//!   page-granular kmalloc aligned above a page, which took
//!   `lead + nr_pages + trail` pages from the source;
//! - `nr_pages << 3 | TAG_LARGE_FREED`: the first page of a page-granular
//!   kmalloc that `kfree` gave back, until the page is used again (a slab
//!   or another page-granular kmalloc overwrites the entry): a second
//!   `kfree` of it is told apart from a stray pointer and reported as a
//!   duplicate free (illumos `KMERR_DUPFREE`) with the block's size.

use core::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use crate::platform::{PAGE_SHIFT, PAGE_SIZE};

pub(crate) const TAG_MASK: usize = 7;
const TAG_SLAB: usize = 1;
pub(crate) const TAG_LARGE_HEAD: usize = 2;
const TAG_LARGE_TAIL: usize = 3;
const TAG_LARGE_LEAD: usize = 4;
const TAG_LARGE_TRAIL: usize = 5;
const TAG_LARGE_FREED: usize = 6;

/// Where a page-granular head entry keeps its charge token (an
/// `Option<AllocTagRef>` as a `u32`, 0 for `None`), and a slack entry
/// its trail count.
pub(crate) const LARGE_HIGH_SHIFT: u32 = 32;
/// Most pages one page-granular kmalloc may span (its count must fit below
/// the token bits).
pub(crate) const LARGE_MAX_PAGES: usize = (1 << (LARGE_HIGH_SHIFT - 3)) - 1;

/// One page's page-map entry: who owns the page. A word (see the module
/// docs for the encoding), built by the named constructors and decoded
/// only here: [`PageEntry::owner`], or [`PageEntry::slab`] on the free
/// hit (one subtract and one test).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(transparent)]
pub(crate) struct PageEntry(usize);

/// A page-map entry decoded ([`PageEntry::owner`]).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum PageOwner {
    /// Not slab memory: not handed out by the allocator, or free.
    None,
    /// A page of a slab whose struct is at this (8-aligned) address.
    Slab(usize),
    /// The first page of a live page-granular kmalloc of `nr_pages`
    /// pages, charged with `token` (0: none).
    LargeHead {
        /// Pages of the allocation.
        nr_pages: usize,
        /// The charge token, 0 for none.
        token: u32,
    },
    /// A later page of a page-granular kmalloc.
    LargeTail,
    /// A slack page before a page-granular kmalloc aligned above a page.
    LargeLead(Slack),
    /// A slack page after one.
    LargeTrail(Slack),
    /// The first page of a page-granular kmalloc `kfree` gave back, until
    /// the page is used again.
    LargeFreed {
        /// Pages the allocation had.
        nr_pages: usize,
    },
}

/// The slack pages around a page-granular kmalloc aligned above a page.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub(crate) struct Slack {
    /// Pages before the block.
    pub(crate) lead: usize,
    /// Pages after it.
    pub(crate) trail: usize,
}

impl PageEntry {
    /// Not slab memory.
    pub(crate) const NONE: PageEntry = PageEntry(0);

    /// A page of the slab whose struct is at `slab` (8-aligned).
    #[inline(always)]
    pub(crate) fn slab_page(slab: usize) -> PageEntry {
        debug_assert!(slab & TAG_MASK == 0);
        PageEntry(slab | TAG_SLAB)
    }

    /// The head page of a live page-granular kmalloc.
    #[inline]
    pub(crate) fn large_head(nr_pages: usize, token: u32) -> PageEntry {
        debug_assert!(nr_pages <= LARGE_MAX_PAGES);
        PageEntry(((token as usize) << LARGE_HIGH_SHIFT) | (nr_pages << 3) | TAG_LARGE_HEAD)
    }

    /// Page `distance` (≥ 1) of a page-granular kmalloc.
    #[inline]
    pub(crate) fn large_tail(distance: usize) -> PageEntry {
        PageEntry((distance << 3) | TAG_LARGE_TAIL)
    }

    /// A slack page before an over-aligned page-granular kmalloc.
    #[inline]
    pub(crate) fn large_lead(slack: Slack) -> PageEntry {
        PageEntry(Self::slack_bits(slack) | TAG_LARGE_LEAD)
    }

    /// A slack page after one.
    #[inline]
    pub(crate) fn large_trail(slack: Slack) -> PageEntry {
        PageEntry(Self::slack_bits(slack) | TAG_LARGE_TRAIL)
    }

    /// The freed mark of a page-granular kmalloc's head.
    #[inline]
    pub(crate) fn large_freed(nr_pages: usize) -> PageEntry {
        PageEntry((nr_pages << 3) | TAG_LARGE_FREED)
    }

    fn slack_bits(slack: Slack) -> usize {
        (slack.trail << LARGE_HIGH_SHIFT) | (slack.lead << 3)
    }

    fn slack(self) -> Slack {
        Slack {
            lead: (self.0 >> 3) & LARGE_MAX_PAGES,
            trail: self.0 >> LARGE_HIGH_SHIFT,
        }
    }

    /// The slab struct's address if this is a slab page: one subtract and
    /// one test (a slab entry minus its tag is the 8-aligned slab). The
    /// free hit's decoding.
    #[inline(always)]
    pub(crate) fn slab(self) -> Option<usize> {
        let slab = self.0.wrapping_sub(TAG_SLAB);
        if slab & TAG_MASK != 0 {
            None
        } else {
            Some(slab)
        }
    }

    /// The slab struct's address of an entry known to be a slab page (a
    /// busy object's page: its slab cannot go meanwhile), or 0 for
    /// [`PageEntry::NONE`] (the empty page map of a cache off the primary
    /// source). One mask.
    #[inline(always)]
    pub(crate) fn slab_unchecked(self) -> usize {
        debug_assert!(self.0 == 0 || self.0 & TAG_MASK == TAG_SLAB);
        self.0 & !TAG_MASK
    }

    /// The slab struct's address of an entry that is a slab page's (a
    /// located object's: the free's owner check passed, so the tag is
    /// `TAG_SLAB`): one subtract, which a load from the slab struct folds
    /// into its displacement (no mask, as [`PageEntry::slab_unchecked`]
    /// needs for [`PageEntry::NONE`]).
    #[inline(always)]
    pub(crate) fn slab_of_slab_page(self) -> usize {
        debug_assert_eq!(self.0 & TAG_MASK, TAG_SLAB);
        self.0.wrapping_sub(TAG_SLAB)
    }

    /// What the entry says.
    #[inline]
    pub(crate) fn owner(self) -> PageOwner {
        match self.0 & TAG_MASK {
            TAG_SLAB => PageOwner::Slab(self.0 & !TAG_MASK),
            TAG_LARGE_HEAD => PageOwner::LargeHead {
                nr_pages: (self.0 >> 3) & LARGE_MAX_PAGES,
                token: (self.0 >> LARGE_HIGH_SHIFT) as u32,
            },
            TAG_LARGE_TAIL => PageOwner::LargeTail,
            TAG_LARGE_LEAD => PageOwner::LargeLead(self.slack()),
            TAG_LARGE_TRAIL => PageOwner::LargeTrail(self.slack()),
            TAG_LARGE_FREED => PageOwner::LargeFreed {
                nr_pages: (self.0 >> 3) & LARGE_MAX_PAGES,
            },
            _ => PageOwner::None,
        }
    }

    /// Whether the allocator owns the page now (a slab page or a live
    /// page-granular kmalloc): not 0, not a freed block's mark.
    #[inline(always)]
    pub(crate) const fn is_live(self) -> bool {
        // Tags 1..=5 are live; 0 (nothing) and TAG_LARGE_FREED are not.
        (self.0 & TAG_MASK).wrapping_sub(1) < TAG_LARGE_TRAIL
    }
}

/// One page's slot in the page map: the entry, and for a slab page the
/// owner, first-object address and stride magic the free hit checks the
/// pointer against ([`PageMap::slot`]). Zeroed: not slab memory.
#[repr(C, align(32))]
pub(crate) struct PageSlot {
    /// The [`PageEntry`] word.
    pub(crate) entry: AtomicUsize,
    /// The owning cache's address for a slab page. Not cleared when the
    /// page stops being one (`magic` is): once a slot has had an owner
    /// it never holds 0 again, so a reader that saw a non-zero `magic`
    /// (Acquire) reads a non-null owner.
    cache: AtomicUsize,
    /// The slab's first object (its base, colour included), for a slab
    /// page.
    base: AtomicUsize,
    /// The owner's [`stride_magic`] for a slab page, 0 for any other
    /// page (with 0 no offset is an object start). Cleared first and
    /// written last (Release): a reader that sees it non-zero sees that
    /// slab's owner and base.
    magic: AtomicU64,
}

/// `ceil(2^64 / stride)` (`stride >= 8`, so the quotient fits in 64
/// bits): for an offset `n < 2^32` into a slab, `n * magic` (128-bit) has
/// `n / stride` in its high word and is an object start iff its low word
/// is below `magic` (Lemire, Kaser and Kurz, "Faster remainder by direct
/// computation", 2019).
pub(crate) const fn stride_magic(stride: usize) -> u64 {
    (u64::MAX / stride as u64) + 1
}

impl PageSlot {
    /// The stride magic of a slab page's owner, 0 for any other page.
    /// Acquire: the slot's `cache` and `base` (and the slab's header)
    /// are visible after a non-zero one. Read first.
    #[inline(always)]
    pub(crate) fn magic(&self) -> u64 {
        self.magic.load(Ordering::Acquire)
    }

    /// The owning cache, once [`PageSlot::magic`] was non-zero (then
    /// never 0); a stale owner or 0 on any other page.
    #[inline(always)]
    pub(crate) fn cache(&self) -> usize {
        self.cache.load(Ordering::Relaxed)
    }

    /// The slab's first object, once [`PageSlot::magic`] was non-zero.
    #[inline(always)]
    pub(crate) fn base(&self) -> usize {
        self.base.load(Ordering::Relaxed)
    }

    /// `addr` less the slab's first object ([`PageSlot::base`]), once
    /// [`PageSlot::magic`] was non-zero. On x86-64 (Miri and the loom
    /// models aside) one `sub` with the base in memory, which reads it
    /// once as the relaxed load does (an aligned 8-byte read is
    /// single-copy atomic there): LLVM folds no atomic load into an
    /// arithmetic instruction (a load and a `sub` otherwise, one more
    /// on the free hit).
    #[inline(always)]
    pub(crate) fn offset_in_slab(&self, addr: usize) -> usize {
        #[cfg(all(target_arch = "x86_64", not(miri), not(all(test, loom))))]
        {
            let mut offset = addr;
            // SAFETY: `[slot + BASE_AT]` is this slot's `base`, an
            // aligned `AtomicUsize` alive for the call (a reference): the
            // block reads it once and writes only `offset` and the flags
            // (declared clobbered: no `preserves_flags`).
            unsafe {
                core::arch::asm!(
                    "sub {offset}, qword ptr [{slot} + {base_at}]",
                    offset = inout(reg) offset,
                    slot = in(reg) core::ptr::from_ref(self),
                    base_at = const core::mem::offset_of!(PageSlot, base),
                    options(nostack, readonly),
                );
            }
            offset
        }
        #[cfg(not(all(target_arch = "x86_64", not(miri), not(all(test, loom)))))]
        {
            addr.wrapping_sub(self.base())
        }
    }

    /// The slab struct of a slab page whose object the caller located
    /// (its slab cannot go meanwhile; the magic's Acquire made it
    /// visible): the entry untagged, one load (its tag subtracted in the
    /// displacement of the load that follows).
    #[inline(always)]
    pub(crate) fn slab(&self) -> usize {
        PageEntry(self.entry.load(Ordering::Relaxed)).slab_of_slab_page()
    }
}

/// Where the page map lives. Copied into every cache at creation; never
/// changes after `init`.
#[derive(Clone, Copy)]
pub(crate) struct PageMap {
    /// Address of the first page of the span.
    pub(crate) base: usize,
    pub(crate) nr_pages: usize,
    pub(crate) entries: *const PageSlot,
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
        &self.slot_at(index).entry
    }

    #[inline(always)]
    fn slot_at(&self, index: usize) -> &PageSlot {
        debug_assert!(index < self.nr_pages);
        // SAFETY: index < nr_pages, the length of the slot array, which
        // lives (from the primary source) as long as the allocator.
        unsafe { &*self.entries.add(index) }
    }

    /// The slot of the page holding `addr`, if it is inside the span: the
    /// free hit's lookup (a subtract, a shift, a bounds test; before
    /// `init` the span is empty, so every address is refused here without
    /// a readiness test of its own).
    #[inline(always)]
    pub(crate) fn slot(&self, addr: usize) -> Option<&PageSlot> {
        self.index(addr).map(|index| self.slot_at(index))
    }

    /// Register `nr_pages` pages from `addr` as pages of the slab whose
    /// struct is at `slab`, owned by the cache at `cache` (objects every
    /// `stride` bytes), whose first object is at `obj_base`. Returns false (and sets nothing) if any
    /// page is outside the span.
    pub(crate) fn set_slab(
        &self,
        addr: usize,
        nr_pages: usize,
        slab: usize,
        cache: usize,
        stride: usize,
        obj_base: usize,
    ) -> bool {
        let entry = PageEntry::slab_page(slab);
        let magic = stride_magic(stride);
        self.set_range_with(addr, nr_pages, |_| (entry, cache, obj_base, magic))
    }

    /// The entry for `addr`, [`PageEntry::NONE`] if outside the span.
    #[inline]
    pub(crate) fn get(&self, addr: usize) -> PageEntry {
        match self.index(addr) {
            Some(index) => PageEntry(self.entry(index).load(Ordering::Acquire)),
            None => PageEntry::NONE,
        }
    }

    /// Set the entries of `nr_pages` pages from `addr`. Returns false (and
    /// sets nothing) if any page is outside the span.
    pub(crate) fn set_range(
        &self,
        addr: usize,
        nr_pages: usize,
        value: impl Fn(usize) -> PageEntry,
    ) -> bool {
        self.set_range_with(addr, nr_pages, |page| (value(page), 0, 0, 0))
    }

    /// [`Self::set_range`] with each slot's owner, first object and
    /// stride magic (`0, 0, 0` for a page that is not a slab page: the
    /// owner is then left as it was). The magic is cleared first and
    /// written last, so a free hit that reads a non-zero magic reads that
    /// slab's owner and base.
    fn set_range_with(
        &self,
        addr: usize,
        nr_pages: usize,
        value: impl Fn(usize) -> (PageEntry, usize, usize, u64),
    ) -> bool {
        let Some(first) = self.index(addr) else {
            return false;
        };
        if nr_pages == 0 || first + nr_pages > self.nr_pages {
            return false;
        }
        for page in 0..nr_pages {
            let slot = self.slot_at(first + page);
            let (entry, cache, obj_base, magic) = value(page);
            debug_assert_eq!(cache == 0, magic == 0);
            slot.magic.store(0, Ordering::Release);
            slot.base.store(obj_base, Ordering::Relaxed);
            if cache != 0 {
                slot.cache.store(cache, Ordering::Relaxed);
            }
            slot.entry.store(entry.0, Ordering::Release);
            slot.magic.store(magic, Ordering::Release);
        }
        true
    }

    /// Set the entry of the one page holding `addr` (a page-granular
    /// kmalloc's head), after checking that the `nr_pages` pages from
    /// `addr` lie in the span. Returns false (and sets nothing) if not.
    pub(crate) fn set_head(&self, addr: usize, nr_pages: usize, entry: PageEntry) -> bool {
        self.covers(addr, nr_pages) && self.set_range(addr, 1, |_| entry)
    }

    /// Replace the entry of a live page-granular kmalloc's head at `addr`
    /// (in the span: its block was registered) by `entry`, another head
    /// entry (an in-place resize): one store, as the slot's other fields
    /// (stride magic 0, no slab) stay what a head page has.
    pub(crate) fn replace_head(&self, addr: usize, entry: PageEntry) {
        debug_assert!(matches!(
            self.get(addr).owner(),
            PageOwner::LargeHead { .. }
        ));
        debug_assert!(matches!(entry.owner(), PageOwner::LargeHead { .. }));
        if let Some(index) = self.index(addr) {
            self.entry(index).store(entry.0, Ordering::Release);
        }
    }

    /// Whether the `nr_pages` (at least one) pages from `addr` lie in the
    /// span.
    pub(crate) fn covers(&self, addr: usize, nr_pages: usize) -> bool {
        self.index(addr)
            .is_some_and(|first| nr_pages != 0 && first + nr_pages <= self.nr_pages)
    }

    /// The live page-granular kmalloc whose later pages hold `addr`, as
    /// `(head address, nr_pages)`: walks back from the page before
    /// `addr`'s over pages that are `0` or a freed mark (a block's later
    /// pages are never written: [`PageMap::set_head`]) to the first live
    /// entry, at most `max_pages` pages (the largest block ever
    /// registered); that entry must be a head whose block covers `addr`.
    /// O(distance): for the error paths and `owns`, never a hit.
    pub(crate) fn large_block_of(&self, addr: usize, max_pages: usize) -> Option<(usize, usize)> {
        let index = self.index(addr)?;
        for back in 1..=max_pages.min(index) {
            let head = index - back;
            let entry = PageEntry(self.entry(head).load(Ordering::Acquire));
            if !entry.is_live() {
                continue;
            }
            return match entry.owner() {
                PageOwner::LargeHead { nr_pages, .. } if back < nr_pages => {
                    Some((self.base + head * PAGE_SIZE, nr_pages))
                }
                _ => None,
            };
        }
        None
    }

    /// [`PageMap::get`], with a later page of a live page-granular kmalloc
    /// (stored as `0` or a stale freed mark) reported as
    /// [`PageOwner::LargeTail`] ([`PageMap::large_block_of`] with
    /// `max_pages`).
    pub(crate) fn get_resolved(&self, addr: usize, max_pages: usize) -> PageEntry {
        let entry = self.get(addr);
        if entry.is_live() {
            return entry;
        }
        match self.large_block_of(addr, max_pages) {
            Some((head, _)) => PageEntry::large_tail((addr - head) >> PAGE_SHIFT),
            None => entry,
        }
    }

    /// Clear the entries of `nr_pages` pages from `addr` (none for 0).
    pub(crate) fn clear_range(&self, addr: usize, nr_pages: usize) {
        self.set_range(addr, nr_pages, |_| PageEntry::NONE);
    }

    /// Atomically claim a large-allocation head entry: replace `expected`
    /// by `freed` (its [`PageEntry::large_freed`] mark). False if someone
    /// else changed it first.
    pub(crate) fn claim(&self, addr: usize, expected: PageEntry, freed: PageEntry) -> bool {
        match self.index(addr) {
            Some(index) => self
                .entry(index)
                .compare_exchange(expected.0, freed.0, Ordering::AcqRel, Ordering::Acquire)
                .is_ok(),
            None => false,
        }
    }

    /// Bytes of slot array needed for a span of `nr_pages` pages, in pages.
    pub(crate) fn pages_for(nr_pages: usize) -> usize {
        (nr_pages * core::mem::size_of::<PageSlot>()).div_ceil(PAGE_SIZE)
    }
}
