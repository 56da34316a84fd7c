//! Page-granular kmalloc: blocks above the largest size class
//! ([`KMALLOC_MAX_SIZE`](super::kmalloc::KMALLOC_MAX_SIZE)), whole pages
//! from the primary source, registered in the page map by their head
//! entry alone. Their allocation (`kmalloc_pages`), in-place resize
//! (`large_resize`, and `krealloc` over it), free (`kfree_slow`, which
//! also takes the other pointers `kfree`'s locate does not find) and
//! statistics.

use core::ptr::NonNull;
use core::sync::atomic::Ordering;

use super::Kmem;
use super::kmalloc::KMALLOC_MAX_SIZE;
use crate::alloc_tag::AllocTagRef;
use crate::cache::{CacheOwner, KmemCache};
use crate::error::{AllocError, FreeError};
#[cfg(feature = "kmemtrace")]
use crate::kmemtrace::EventKind;
use crate::layout::pagemap::{LARGE_MAX_PAGES, PageEntry, PageOwner, Slack};
use crate::platform::{PAGE_SIZE, Platform};
use crate::slab::Slab;

/// Largest alignment a page-granular kmalloc gives (1 GiB).
const LARGE_MAX_ALIGN: usize = 1 << 30;

/// The head entry of a live page-granular kmalloc of `nr_pages` pages
/// charged with `token`: the charge token of the allocation's tag
/// (`AllocTagHooks::token`; an `Option<AllocTagRef>`, 0 for `None`
/// and without profiling) rides in the entry ([`PageEntry::large_head`]).
#[inline]
fn large_head_entry(nr_pages: usize, token: Option<AllocTagRef>) -> PageEntry {
    PageEntry::large_head(nr_pages, token.map_or(0, AllocTagRef::get))
}

/// Page-granular kmalloc statistics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LargeStats {
    /// Live page-granular allocations.
    pub nr_live: usize,
    /// Bytes they occupy (whole pages).
    pub live_bytes: usize,
    /// Page-granular allocations ever.
    pub nr_allocs_ever: u64,
}

impl<P: Platform> Kmem<P> {
    /// Resize a kmalloc block (Linux `krealloc`): `None` allocates; a
    /// block whose usable size ([`Kmem::ksize`]) holds `new_size`
    /// and that is aligned to `align` is returned as is; otherwise a new
    /// block gets the first `min(old usable size, new_size)` bytes and the
    /// old one is freed. On error the old block is untouched and still
    /// the caller's.
    ///
    /// # Safety
    /// `ptr`, if given, is a live kmalloc block the caller owns; on
    /// success it is given up (unless returned).
    ///
    /// # Errors
    /// [`AllocError::InvalidLayout`] for `new_size` 0, a bad `align`, or a
    /// `ptr` this allocator did not hand out; otherwise as for
    /// [`Kmem::kmalloc`].
    pub unsafe fn krealloc(
        &self,
        ptr: Option<NonNull<u8>>,
        new_size: usize,
        align: usize,
    ) -> Result<NonNull<u8>, AllocError> {
        let Some(old) = ptr else {
            return self.kmalloc(new_size, align);
        };
        if new_size == 0 || !align.is_power_of_two() {
            return Err(AllocError::InvalidLayout);
        }
        let usable = self.ksize(old).map_err(|_| AllocError::InvalidLayout)?;
        if new_size <= usable && (old.as_ptr() as usize).is_multiple_of(align) {
            // SAFETY: a live block of the caller's, kept.
            unsafe { self.kmalloc_resized(old, new_size) };
            return Ok(old);
        }
        if new_size > KMALLOC_MAX_SIZE
            && align <= PAGE_SIZE
            && let Some(kept) = self.large_resize(old, new_size)
        {
            return Ok(kept);
        }
        let new = self.kmalloc(new_size, align)?;
        // SAFETY: distinct live blocks of at least min(usable, new_size)
        // bytes; the old one is the caller's and given up (a block ksize
        // vouched for frees without error).
        unsafe {
            core::ptr::copy_nonoverlapping(old.as_ptr(), new.as_ptr(), usable.min(new_size));
            let _ = self.kfree(old);
        }
        Ok(new)
    }

    /// [`Kmem::kmalloc_with`] for a request no size class serves
    /// ([`Self::class_cache`]): whole pages from the primary source
    /// (`align` above a page: the slack around the aligned block kept and
    /// marked, so its free finds it), charged to `tag()` (asked with
    /// profiling on), registered by its head entry, recorded by
    /// kmemtrace (ok or failed); or `NotInitialized` before init. Out of
    /// line, so the hit keeps nothing for it.
    ///
    /// `TO_GROW`: for `realloc` moving a block it could not keep or grow
    /// in place, the pages from
    /// [`PageSource::alloc_pages_to_grow`](crate::PageSource::alloc_pages_to_grow),
    /// so the block's next growth may be in place (`align` at most
    /// [`PAGE_SIZE`]).
    #[inline(never)]
    pub(super) fn kmalloc_pages<const TO_GROW: bool>(
        &self,
        size: usize,
        align: usize,
        tag: impl Fn() -> Option<AllocTagRef>,
    ) -> Result<NonNull<u8>, AllocError> {
        if !self.is_ready() {
            return Err(AllocError::NotInitialized);
        }
        let tag = if self.profiling().enabled() {
            tag()
        } else {
            None
        };
        let result = 'pages: {
            if align > LARGE_MAX_ALIGN || size > isize::MAX as usize {
                break 'pages Err(AllocError::InvalidLayout);
            }
            let nr_pages = size.div_ceil(PAGE_SIZE);
            // Aligned above a page: take `align / PAGE_SIZE - 1` pages more
            // and keep the slack before and after the aligned block.
            let nr_slack = align.max(PAGE_SIZE) / PAGE_SIZE - 1;
            if nr_pages + nr_slack > LARGE_MAX_PAGES {
                break 'pages Err(AllocError::OutOfMemory);
            }
            let nr_taken = nr_pages + nr_slack;
            #[cfg(not(feature = "alloc-profiling"))]
            let tag: Option<AllocTagRef> = {
                let _ = tag;
                None
            };
            let source = self.primary_source();
            let first_try = if TO_GROW {
                source.alloc_pages_to_grow(nr_taken)
            } else {
                source.alloc_pages(nr_taken)
            };
            let taken = match first_try {
                Ok(pages) => pages,
                // Out of memory: reap caches until the block fits.
                Err(error) => match self.reap_for_pressure(source, nr_taken) {
                    Some(pages) => pages,
                    None => break 'pages Err(error),
                },
            };
            let base = taken.as_ptr() as usize;
            let addr = base.next_multiple_of(align.max(PAGE_SIZE));
            // SAFETY: inside the block just taken, non-null.
            let pages = unsafe { NonNull::new_unchecked(addr as *mut u8) };
            // Charged first: the head entry keeps the charge token (the tag
            // closures return the platform's tokens: alloc_tag::current,
            // alloc_tag::explicit).
            let token = tag;
            #[cfg(feature = "alloc-profiling")]
            if let Some(token) = token {
                // SAFETY: a charge token, as above.
                unsafe {
                    crate::alloc_tag::charge_off_hit::<P>(token, pages, nr_pages * PAGE_SIZE)
                };
            }
            let lead = (addr - base) / PAGE_SIZE;
            let slack = Slack {
                lead,
                trail: nr_slack - lead,
            };
            // The head alone (O(1)); the slack pages of a block aligned above
            // a page are marked, so its free finds them.
            self.large_max_pages.fetch_max(nr_pages, Ordering::Relaxed);
            let map = self.page_map();
            let registered = map.covers(base, nr_taken);
            if registered {
                if lead > 0 {
                    map.set_range(base, lead, |_| PageEntry::large_lead(slack));
                }
                map.set_head(addr, nr_pages, large_head_entry(nr_pages, token));
                if slack.trail > 0 {
                    map.set_range(addr + nr_pages * PAGE_SIZE, slack.trail, |_| {
                        PageEntry::large_trail(slack)
                    });
                }
            }
            if !registered {
                #[cfg(feature = "alloc-profiling")]
                if let Some(token) = token {
                    // SAFETY: charged just above for this block, never stored.
                    unsafe {
                        crate::alloc_tag::uncharge_off_hit::<P>(token, pages, nr_pages * PAGE_SIZE)
                    };
                }
                // SAFETY: pages just allocated from this source, unused.
                unsafe { source.free_pages(taken, nr_taken) };
                break 'pages Err(AllocError::OutOfMemory);
            }
            self.large_nr_live.fetch_add(1, Ordering::Relaxed);
            self.large_live_pages.fetch_add(nr_pages, Ordering::Relaxed);
            self.large_nr_allocs_ever.fetch_add(1, Ordering::Relaxed);
            Ok(pages)
        };
        #[cfg(feature = "kmemtrace")]
        if self.kmemtrace.recording_all.load(Ordering::Relaxed) {
            // KMEMTRACE HOOK: page-granular kmalloc (ok or failed).
            let (kind, addr) = match result {
                Ok(pages) => (EventKind::Alloc, pages.as_ptr() as usize),
                Err(_) => (EventKind::FailedAlloc, 0),
            };
            self.kmemtrace_pages(kind, addr, size);
        }
        result
    }

    /// Resize the live page-granular block at `ptr` (its head, not aligned
    /// above a page) in place to hold `new_size` bytes: its page source
    /// grows it into the free pages after it, or takes back its last
    /// pages ([`PageSource::resize_pages`](crate::PageSource::resize_pages));
    /// one page-map entry changes (the head's). `None`: not such a block,
    /// or the source could not (nothing changed).
    pub(crate) fn large_resize(&self, ptr: NonNull<u8>, new_size: usize) -> Option<NonNull<u8>> {
        let addr = ptr.as_ptr() as usize;
        let map = self.page_map();
        let entry = map.get(addr);
        let PageOwner::LargeHead { nr_pages, token } = entry.owner() else {
            return None;
        };
        let new_nr_pages = new_size.div_ceil(PAGE_SIZE);
        if new_nr_pages == nr_pages {
            return Some(ptr);
        }
        // A block aligned above a page has slack pages around it: moved.
        let slack = matches!(
            map.get(addr.wrapping_sub(PAGE_SIZE)).owner(),
            PageOwner::LargeLead(_)
        ) || matches!(
            map.get(addr + nr_pages * PAGE_SIZE).owner(),
            PageOwner::LargeTrail(_)
        );
        if slack
            || !addr.is_multiple_of(PAGE_SIZE)
            || new_nr_pages > LARGE_MAX_PAGES
            || !map.covers(addr, new_nr_pages)
        {
            return None;
        }
        // SAFETY: a live page-granular block of the primary source, the
        // caller's (a head entry at a page start), of `nr_pages` pages (its
        // head says so: every resize rewrites it); on a shrink the pages
        // given back are past `new_size`, unused.
        if !unsafe {
            self.primary_source()
                .resize_pages(ptr, nr_pages, new_nr_pages)
        } {
            return None;
        }
        #[cfg(feature = "kmemtrace")]
        if self.kmemtrace.recording_all.load(Ordering::Relaxed) {
            // KMEMTRACE HOOK: a page-granular block resized in place is a
            // free of the old size and an allocation of the new one.
            self.kmemtrace_pages(EventKind::Free, addr, nr_pages * PAGE_SIZE);
            self.kmemtrace_pages(EventKind::Alloc, addr, new_size);
        }
        #[cfg(feature = "alloc-profiling")]
        if let Some(token) = AllocTagRef::new(token) {
            // SAFETY: the head entry's charge token, charged for the old
            // size at the allocation (or the last resize); charged again
            // for the new one, as a free and an allocation would be.
            unsafe {
                crate::alloc_tag::uncharge_off_hit::<P>(token, ptr, nr_pages * PAGE_SIZE);
                crate::alloc_tag::charge_off_hit::<P>(token, ptr, new_nr_pages * PAGE_SIZE);
            }
        }
        // `covers` held above: the head entry alone changes.
        map.replace_head(addr, PageEntry::large_head(new_nr_pages, token));
        if new_nr_pages > self.large_max_pages.load(Ordering::Relaxed) {
            self.large_max_pages
                .fetch_max(new_nr_pages, Ordering::Relaxed);
        }
        if new_nr_pages > nr_pages {
            self.large_live_pages
                .fetch_add(new_nr_pages - nr_pages, Ordering::Relaxed);
        } else {
            self.large_live_pages
                .fetch_sub(nr_pages - new_nr_pages, Ordering::Relaxed);
        }
        Some(ptr)
    }

    /// [`Kmem::kfree`] past the fast path (anything its locate did not
    /// find as an allocated slab object), with the error reports: a
    /// pointer inside a slab object, a KFENCE sample, a page-granular
    /// block, or refused.
    ///
    /// `EDGE`: `GlobalAlloc::dealloc`'s slow path (reached by a tail
    /// call): a null `ptr` is nothing to free, and a refused free is also
    /// counted and handed to the free-error hook
    /// ([`Self::report_free_error`]). Otherwise `ptr` is not null.
    ///
    /// # Safety
    /// As for [`Kmem::kfree`].
    #[cold]
    #[inline(never)]
    pub(crate) unsafe fn kfree_slow<const EDGE: bool>(
        &self,
        ptr: *mut u8,
    ) -> Result<(), FreeError> {
        let Some(ptr) = NonNull::new(ptr) else {
            debug_assert!(EDGE, "kfree of a null pointer");
            return Ok(());
        };
        let result = 'free: {
            let addr = ptr.as_ptr() as usize;
            if !self.is_ready() {
                break 'free Err(FreeError::NotAllocated { addr });
            }
            let entry = self.page_entry(addr);
            if let Some(slab) = entry.slab() {
                let slab = slab as *mut Slab;
                // SAFETY: registered slabs are alive and belong to caches of
                // this allocator (same P), alive while they have slabs.
                let cache = unsafe { &*(*slab).cache.cast::<KmemCache<P>>() };
                // SAFETY: the page map puts addr in this live slab of `cache`.
                let Some(index) = (unsafe { cache.object_index(slab, addr) }) else {
                    // KMEMTRACE HOOK: kfree of a pointer inside an object.
                    #[cfg(feature = "kmemtrace")]
                    if cache.hot().contains(crate::cache::HotFlags::KMEMTRACE) {
                        self.kmemtrace_free(Some(cache), ptr, false);
                    }
                    break 'free Err(cache.refuse(FreeError::Misaligned { addr }));
                };
                // SAFETY: located in `cache`, object `index` of `slab`; our
                // caller gives it up.
                break 'free unsafe { cache.free_hooked(ptr, slab, index) };
            }
            #[cfg(feature = "kfence")]
            if self.kfence_contains(addr) {
                // KFENCE HOOK: a sampled object is in no slab page.
                break 'free crate::cache::KfenceOwner::kfence_free(self, addr, None)
                    .unwrap_or(Err(FreeError::NotAllocated { addr }));
            }
            let map = self.page_map();
            // A page-granular block freed, or the error.
            let error = match entry.owner() {
                PageOwner::LargeHead { .. } if addr & (PAGE_SIZE - 1) != 0 => {
                    FreeError::Misaligned { addr }
                }
                // The head keeps a freed mark (until the page is used again),
                // so a second kfree is a duplicate free.
                PageOwner::LargeHead { nr_pages, .. }
                    if !map.claim(addr, entry, PageEntry::large_freed(nr_pages)) =>
                {
                    // Another CPU freed it first.
                    FreeError::DoubleFree { addr }
                }
                PageOwner::LargeHead { nr_pages, token } => {
                    #[cfg(not(feature = "alloc-profiling"))]
                    let _ = token;
                    #[cfg(feature = "kmemtrace")]
                    if self.kmemtrace.recording_all.load(Ordering::Relaxed) {
                        // KMEMTRACE HOOK: page-granular kfree (before the pages go back).
                        self.kmemtrace_pages(EventKind::Free, addr, nr_pages * PAGE_SIZE);
                    }
                    // The slack of a block aligned above a page: the page
                    // before it is our lead slack or not ours, the page after
                    // our trail slack or not ours.
                    let before = map.get(addr.wrapping_sub(PAGE_SIZE)).owner();
                    let after = map.get(addr + nr_pages * PAGE_SIZE).owner();
                    let Slack { lead, trail } = match (before, after) {
                        (PageOwner::LargeLead(slack), _) | (_, PageOwner::LargeTrail(slack)) => {
                            slack
                        }
                        _ => Slack::default(),
                    };
                    let base = addr - lead * PAGE_SIZE;
                    let nr_taken = lead + nr_pages + trail;
                    // The slack pages (the head keeps its freed mark; the
                    // block's later pages were never written).
                    map.clear_range(base, lead);
                    map.clear_range(addr + nr_pages * PAGE_SIZE, trail);
                    self.large_nr_live.fetch_sub(1, Ordering::Relaxed);
                    self.large_live_pages.fetch_sub(nr_pages, Ordering::Relaxed);
                    #[cfg(feature = "alloc-profiling")]
                    if let Some(token) = AllocTagRef::new(token) {
                        // SAFETY: the head entry's charge token, stored at the
                        // allocation; the claim above makes this free the one
                        // that uncharges it.
                        unsafe {
                            crate::alloc_tag::uncharge_off_hit::<P>(
                                token,
                                ptr,
                                nr_pages * PAGE_SIZE,
                            )
                        };
                    }
                    // SAFETY: a live page-granular allocation of nr_taken pages
                    // at base from the primary source, claimed by us alone (the
                    // CAS); base is non-null (a page of the source).
                    unsafe {
                        self.primary_source()
                            .free_pages(NonNull::new_unchecked(base as *mut u8), nr_taken)
                    };
                    break 'free Ok(());
                }
                PageOwner::LargeTail | PageOwner::LargeLead(_) | PageOwner::LargeTrail(_) => {
                    FreeError::Misaligned { addr }
                }
                // The head of a block kfree gave back, its pages not used again.
                PageOwner::LargeFreed { .. } if addr & (PAGE_SIZE - 1) == 0 => {
                    FreeError::DoubleFree { addr }
                }
                _ => FreeError::NotAllocated { addr },
            };
            #[cfg(feature = "kmemtrace")]
            if self.kmemtrace.recording_all.load(Ordering::Relaxed) {
                // KMEMTRACE HOOK: kfree of a pointer that is not ours.
                self.kmemtrace_free(None, ptr, false);
            }
            CacheOwner::report_bad_free(self, "kmalloc", error);
            Err(error)
        };
        if EDGE && let Err(error) = result {
            self.report_free_error(error);
        }
        result
    }

    /// A kmalloc block kept by a resize (`krealloc`, `GlobalAlloc::realloc`,
    /// `Allocator::allocate`) is now used for `new_size` bytes: a `REDZONE`
    /// cache moves the object's redzone there (after checking it where it
    /// was). Nothing for other caches and page-granular blocks.
    ///
    /// # Safety
    /// `ptr` is a live kmalloc block the caller owns.
    pub(crate) unsafe fn kmalloc_resized(&self, ptr: NonNull<u8>, new_size: usize) {
        let addr = ptr.as_ptr() as usize;
        if let Some((cache, at)) = KmemCache::<P>::locate_allocated(self.page_map(), addr)
            && cache.debug.is_some()
        {
            // SAFETY: an allocated object of `cache` (located by the page
            // map) that the caller owns.
            unsafe { cache.debug_resized(addr, at.slab(), new_size) };
        }
    }

    /// Page-granular kmalloc statistics.
    pub(crate) fn large_stats(&self) -> LargeStats {
        LargeStats {
            nr_live: self.large_nr_live.load(Ordering::Relaxed),
            live_bytes: self.large_live_pages.load(Ordering::Relaxed) * PAGE_SIZE,
            nr_allocs_ever: self.large_nr_allocs_ever.load(Ordering::Relaxed),
        }
    }
}
