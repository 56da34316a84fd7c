//! The shims: `GlobalAlloc` (for `#[global_allocator]`) and
//! `core::alloc::Allocator` over [`Kmem`], and the free-error report
//! they feed. Only here does an error become a null pointer.

use core::alloc::{GlobalAlloc, Layout};
use core::ptr::{self, NonNull};
use core::sync::atomic::Ordering;

use super::Kmem;
use crate::allocator::kmalloc::KMALLOC_MAX_SIZE;
use crate::cache::{HotFlags, KmemCache, Located};
use crate::error::FreeError;
use crate::platform::{PAGE_SIZE, Platform};

/// `Kmem::alloc_pages_or_null`'s `old_size` for `GlobalAlloc::alloc`: no
/// block is moved (no block is that big).
const NOT_MOVED: usize = usize::MAX;

impl<P: Platform> Kmem<P> {
    /// `GlobalAlloc::alloc` past the cache's hit (a feature on, a miss):
    /// the cache the hit found goes on to the usual words' hit
    /// ([`KmemCache::alloc_usual`], inlined: the class is not looked up
    /// again), else to [`Self::alloc_hooked_or_null`]. Out of line,
    /// reached by a tail call, so the hit needs no stack frame; no stack
    /// frame either, every way out a tail call.
    ///
    /// # Safety
    /// `cache` is a class's cache, an unborn stub or the unready entry
    /// ([`Kmem::class_cache`]).
    #[inline(never)]
    unsafe fn alloc_off_hit(cache: *const KmemCache<P>, size: usize) -> *mut u8 {
        let tag = crate::alloc_tag::current::<P>;
        // SAFETY: per our caller.
        if let Some(obj) = unsafe { KmemCache::alloc_usual(cache, &tag, size) } {
            return obj.as_ptr();
        }
        // SAFETY: per our caller; nothing changed.
        unsafe { Self::alloc_off_usual(cache, size) }
    }

    /// [`Self::alloc_off_hit`] off the usual words' hit: the recorded
    /// words' hit ([`KmemCache::alloc_usual_recorded`], inlined), else
    /// [`Self::alloc_hooked_or_null`]. Out of line, reached by a tail
    /// call: the kmemtrace event's work stays out of `alloc_off_hit`
    /// (whose profiled hit needs no stack frame); no stack frame either,
    /// every way out a tail call.
    ///
    /// # Safety
    /// As for [`Self::alloc_off_hit`].
    #[inline(never)]
    unsafe fn alloc_off_usual(cache: *const KmemCache<P>, size: usize) -> *mut u8 {
        let tag = crate::alloc_tag::current::<P>;
        // SAFETY: per our caller.
        if let Some(obj) = unsafe { KmemCache::alloc_usual_recorded(cache, &tag, size) } {
            return obj.as_ptr();
        }
        // SAFETY: per our caller; nothing changed.
        unsafe { Self::alloc_hooked_or_null(cache, size) }
    }

    /// [`Self::alloc_off_usual`] off the recorded words' hit:
    /// [`KmemCache::alloc_hooked_cold`], an error a null pointer.
    ///
    /// # Safety
    /// As for [`Self::alloc_off_hit`].
    #[inline(never)]
    unsafe fn alloc_hooked_or_null(cache: *const KmemCache<P>, size: usize) -> *mut u8 {
        let tag = crate::alloc_tag::current::<P>;
        // SAFETY: per our caller.
        unsafe { KmemCache::alloc_hooked_cold(cache, &tag, size) }
            .map_or(ptr::null_mut(), NonNull::as_ptr)
    }

    /// A block no size class's hit gives, an error a null pointer:
    /// `GlobalAlloc::alloc` of a request no size class serves
    /// (`old_size` [`NOT_MOVED`]: [`Kmem::kmalloc_pages`], page-granular,
    /// or refused before `init`), or the new block of a `realloc` that moves
    /// a block of `old_size` bytes to `layout`: a growth past a page takes
    /// whole pages, where it can grow again in place (`TO_GROW`,
    /// page-aligned): a block grown that far is mostly a buffer that
    /// keeps growing (a `Vec` doubling), and its next growths then copy
    /// nothing (a `Vec` pushed to 1 MiB copied 8 KiB more when its
    /// 4,097..8,192-byte step took a size class); any other move is
    /// [`GlobalAlloc::alloc`]. The layout first: `GlobalAlloc::alloc`'s
    /// own arguments stay in the registers they came in (no copies on its
    /// hit: plain pair 68 -> 66 instructions). Out of line: the moves
    /// between size classes (`realloc-grow`, [`Self::realloc_move`]) call
    /// it only past a page and then keep one compare and no register
    /// saves for it (inline, the row was 168.3 -> 174.9 net instructions
    /// an operation, `make bench`).
    #[inline(never)]
    fn alloc_pages_or_null(layout: Layout, this: &Self, old_size: usize) -> *mut u8 {
        let tag = crate::alloc_tag::current::<P>;
        let pages = if old_size == NOT_MOVED {
            this.kmalloc_pages::<false>(layout.size(), layout.align(), tag)
        } else if layout.size() > PAGE_SIZE
            && layout.size() > old_size
            && layout.align() <= PAGE_SIZE
        {
            this.kmalloc_pages::<true>(layout.size(), PAGE_SIZE, tag)
        } else {
            // SAFETY: a valid layout (GlobalAlloc allows size 0 here;
            // kmalloc gets max(size, 1)).
            return unsafe { this.alloc(layout) };
        };
        pages.map_or(ptr::null_mut(), NonNull::as_ptr)
    }

    /// `GlobalAlloc::dealloc` past the cache's hit (a feature on, a
    /// miss): the usual words' hit ([`KmemCache::free_usual`], inlined),
    /// else [`Self::dealloc_off_usual`]. Out of line, reached by a tail
    /// call, so the hit needs no stack frame; no stack frame either.
    ///
    /// # Safety
    /// `ptr` is object `at.index` of the live slab of `cache` that
    /// `at.slot` names, given up by the caller; the hit changed nothing.
    #[inline(never)]
    unsafe fn dealloc_off_hit(cache: &KmemCache<P>, ptr: NonNull<u8>, at: Located, this: &Self) {
        // SAFETY: per our caller.
        if unsafe { cache.free_usual(ptr, at) } {
            return;
        }
        // SAFETY: per our caller; nothing changed (a tag the hook
        // uncharged is not found again).
        unsafe { Self::dealloc_off_usual(cache, ptr, at, this) }
    }

    /// [`Self::dealloc_off_hit`] off the usual words' hit: a recorded
    /// word's hit ([`KmemCache::free_recorded`], inlined), else
    /// [`Self::dealloc_hooked`]. Out of line, reached by a tail call, as
    /// [`Self::alloc_off_usual`]; no stack frame either.
    ///
    /// # Safety
    /// As for [`Self::dealloc_off_hit`].
    #[inline(never)]
    unsafe fn dealloc_off_usual(cache: &KmemCache<P>, ptr: NonNull<u8>, at: Located, this: &Self) {
        // SAFETY: per our caller.
        if unsafe { cache.free_recorded(ptr, at) } {
            return;
        }
        // SAFETY: per our caller; nothing changed.
        unsafe { Self::dealloc_hooked(cache, ptr, at, this) }
    }

    /// [`Self::dealloc_off_usual`] off a recorded word's hit:
    /// [`KmemCache::free_off_usual`], a refused free reported to `this`.
    /// The allocator last here and in [`Self::dealloc_off_hit`], so that
    /// the free's arguments stay in the registers they came in (kmemtrace
    /// recording pair 176 -> 173 instructions).
    ///
    /// # Safety
    /// As for [`Self::dealloc_off_hit`].
    #[inline(never)]
    unsafe fn dealloc_hooked(cache: &KmemCache<P>, ptr: NonNull<u8>, at: Located, this: &Self) {
        // SAFETY: per our caller.
        if let Err(error) = unsafe { cache.free_off_usual::<true>(ptr, at) } {
            this.report_free_error(error);
        }
    }

    #[cold]
    pub(crate) fn report_free_error(&self, error: FreeError) {
        self.nr_bad_frees.fetch_add(1, Ordering::Relaxed);
        let hook = *self.free_error_hook.lock::<P>();
        if let Some(hook) = hook {
            hook(&error);
        }
    }
}

// SAFETY: `alloc` returns either null or memory of at least `layout.size()`
// bytes aligned to `layout.align()` (kmalloc's contract) that no one else
// owns until `dealloc`; `dealloc` frees exactly what `alloc`/`realloc`
// returned (and refuses anything else without touching it).
unsafe impl<P: Platform> GlobalAlloc for Kmem<P> {
    /// `kmalloc(max(size, 1), align)`; null on any error (including before
    /// init: the unready entry's hit refuses, no readiness test here). The one
    /// place an allocation error becomes a null pointer. Inline: the hit
    /// is a few instructions and a tail call (the free key's check on it,
    /// issue 33, left it just past the inliner's threshold).
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // A Layout's alignment is a power of two; size 0 gets kmalloc-8.
        let Some(cache) = self.class_cache(layout.size(), layout.align()) else {
            // Unlikely. (Here, not a `#[cold]` on the callee: a cold
            // callee moved `realloc_move`'s registers, +3 instructions an
            // operation on `realloc-grow`.)
            core::hint::cold_path();
            return Self::alloc_pages_or_null(layout, self, NOT_MOVED);
        };
        const SLOW: u32 = HotFlags::ALLOC_SLOW.bits();
        // SAFETY: a class's cache, an unborn stub or the unready entry.
        if let Some(obj) = unsafe { KmemCache::alloc_hit::<SLOW, true>(cache) } {
            return obj.as_ptr();
        }
        // SAFETY: as above; the hit changed nothing.
        unsafe { Self::alloc_off_hit(cache, layout.size()) }
    }

    /// [`GlobalAlloc::alloc`] zeroed; whole pages from a source that
    /// [zeroes its pages](crate::PageSource::zeroes_pages) are not
    /// cleared again.
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: per our caller.
        let ptr = unsafe { self.alloc(layout) };
        if let Some(block) = NonNull::new(ptr) {
            self.zero_new(block, layout.size().max(1), layout.align());
        }
        ptr
    }

    /// `kfree`; a refused free is reported to the free-error hook.
    /// Inline, as `alloc`: in a kernel's `__rust_dealloc` the allocator
    /// is a constant address (no argument moves, no tail jump: 5
    /// instructions of the hobby kernel's free).
    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        // SAFETY: the GlobalAlloc contract: ptr came from this allocator
        // with this layout and is given up. (Null, which the contract
        // excludes, is not in the page map: the slow path ignores it.)
        // The contract also puts init before this call: no readiness test
        // on the hit (`locate_allocated`; the slow path tests).
        match KmemCache::<P>::locate_allocated(self.page_map(), ptr as usize) {
            Some((cache, at)) => {
                // SAFETY: as above; located in `cache`, so on a slab page,
                // never null (page sources hand out non-null pages).
                let ptr = unsafe { NonNull::new_unchecked(ptr) };
                // SAFETY: as above.
                if unsafe { cache.free_hit::<{ HotFlags::FREE_SLOW.bits() }>(ptr, true) } {
                    return;
                }
                // SAFETY: as above; the hit changed nothing.
                unsafe { Self::dealloc_off_hit(cache, ptr, at, self) }
            }
            None => {
                // SAFETY: as above; nothing changed. (A refused free is
                // reported there.)
                let _ = unsafe { self.kfree_slow::<true>(ptr) };
            }
        }
    }

    /// Keeps the block if the new size still fits and uses more than half
    /// of it (a size in the same kmalloc class always does: each class is
    /// at most twice the one below); a page-granular block grows or
    /// shrinks in place when its page source can
    /// ([`PageSource::resize_pages`](crate::PageSource::resize_pages));
    /// otherwise allocate, copy, free. The pointer is located once: a
    /// slab object's page-map slot serves the size test and the free.
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // A pointer of ours (the contract): located without a readiness
        // test, as in `dealloc`.
        let Some((cache, at)) = KmemCache::<P>::locate_allocated(self.page_map(), ptr as usize)
        else {
            // SAFETY: per our caller.
            return unsafe { self.realloc_off_slab(ptr, layout, new_size) };
        };
        let usable = cache.obj_size();
        if new_size <= usable && new_size.max(1) * 2 > usable {
            if cache.debug.is_some() {
                // SAFETY: the caller's live block of `cache`, kept
                // (GlobalAlloc contract).
                unsafe { cache.debug_resized(ptr as usize, at.slab(), new_size) };
            }
            return ptr;
        }
        // SAFETY: per our caller; located in `cache` just now.
        unsafe { self.realloc_move(cache, ptr, layout, new_size) }
    }
}

impl<P: Platform> Kmem<P> {
    /// [`GlobalAlloc::realloc`] of a located slab object that does not
    /// keep its block: allocate, copy, and free the old one by its
    /// cache's free hit (located again only if that misses). Out of line
    /// and in six registers, so the keeping path needs no stack frame and
    /// reaches it by a tail call.
    ///
    /// # Safety
    /// As for [`GlobalAlloc::realloc`]; `ptr` is an allocated object of
    /// `cache` ([`KmemCache::locate_allocated`]).
    #[inline(never)]
    unsafe fn realloc_move(
        &self,
        cache: &KmemCache<P>,
        ptr: *mut u8,
        layout: Layout,
        new_size: usize,
    ) -> *mut u8 {
        // SAFETY: the GlobalAlloc contract: `new_size`, rounded up to
        // `layout.align()`, does not overflow `isize`.
        let new_layout = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        // A growth past a page: [`Self::alloc_pages_or_null`], out of
        // line, so the moves between size classes keep one compare and no
        // register saves for it.
        let new = if new_size > PAGE_SIZE {
            Self::alloc_pages_or_null(new_layout, self, layout.size())
        } else {
            // SAFETY: a valid layout (size 0 gets kmalloc-8).
            unsafe { self.alloc(new_layout) }
        };
        if !new.is_null() {
            // SAFETY: located in `cache`, so on a slab page, never null.
            let old = unsafe { NonNull::new_unchecked(ptr) };
            // SAFETY: both blocks are at least min(old, new) bytes and
            // distinct (new is freshly allocated); the old one is an
            // allocated object of `cache`, given up per the GlobalAlloc
            // contract.
            unsafe {
                ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size));
                if !cache.free_hit::<{ HotFlags::FREE_SLOW.bits() }>(old, true) {
                    self.dealloc(ptr, layout);
                }
            }
        }
        new
    }

    /// [`GlobalAlloc::realloc`] of anything but a located slab object: a
    /// page-granular block resized in place if its source can, else (and
    /// for anything else: a KFENCE sample, a stray pointer) keep, or
    /// allocate, copy and free, with the old block's size from `ksize`.
    ///
    /// # Safety
    /// As for [`GlobalAlloc::realloc`].
    #[inline(never)]
    unsafe fn realloc_off_slab(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let old = NonNull::new(ptr);
        if let Some(old) = old
            && layout.align() <= PAGE_SIZE
            && new_size > KMALLOC_MAX_SIZE
            && let Some(kept) = self.large_resize(old, new_size)
        {
            return kept.as_ptr();
        }
        let usable = old.and_then(|old| self.ksize(old).ok());
        if let Some(usable) = usable
            && new_size <= usable
            && new_size.max(1) * 2 > usable
        {
            if let Some(old) = old {
                // SAFETY: a live block of the caller's, kept.
                unsafe { self.kmalloc_resized(old, new_size) };
            }
            return ptr;
        }
        let Ok(new_layout) = Layout::from_size_align(new_size, layout.align()) else {
            return ptr::null_mut();
        };
        let new = Self::alloc_pages_or_null(new_layout, self, layout.size());
        if !new.is_null() && !ptr.is_null() {
            // SAFETY: both blocks are at least min(old, new) bytes and
            // distinct (new is freshly allocated); ptr is given up per the
            // GlobalAlloc contract.
            unsafe {
                ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size));
                self.dealloc(ptr, layout);
            }
        }
        new
    }
}

// SAFETY: blocks returned by `allocate` stay valid until `deallocate` (the
// allocator is 'static, copies of the handle are the same allocator), and
// are at least `layout.size()` bytes aligned to `layout.align()`.
// Feature `nightly`: `core::alloc::Allocator` is unstable (allocator_api).
#[cfg(feature = "nightly")]
unsafe impl<P: Platform> core::alloc::Allocator for &'static Kmem<P> {
    fn allocate(&self, layout: Layout) -> Result<NonNull<[u8]>, core::alloc::AllocError> {
        if layout.size() == 0 {
            let dangling = NonNull::new(ptr::without_provenance_mut::<u8>(layout.align()))
                .ok_or(core::alloc::AllocError)?;
            return Ok(NonNull::slice_from_raw_parts(dangling, 0));
        }
        let ptr = self
            .kmalloc(layout.size(), layout.align())
            .map_err(|_| core::alloc::AllocError)?;
        let usable = self.ksize(ptr).unwrap_or(layout.size());
        // The caller may use all of it (a REDZONE cache moves the redzone).
        // SAFETY: the block just allocated, ours to hand out.
        unsafe { self.kmalloc_resized(ptr, usable) };
        Ok(NonNull::slice_from_raw_parts(ptr, usable))
    }

    unsafe fn deallocate(&self, ptr: NonNull<u8>, layout: Layout) {
        if layout.size() == 0 {
            return;
        }
        // SAFETY: per the Kmem contract, ptr is a live block from us.
        if let Err(error) = unsafe { self.kfree(ptr) } {
            self.report_free_error(error);
        }
    }
}
