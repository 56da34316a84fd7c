//! The flagged paths: what happens on alloc and on free when a cache is
//! debugged (`DEBUG`), traced (the trace table), profiled with bufctl
//! slabs (`BUFCTL_TAGGED`), recorded (kmemtrace) or a bootstrap cache
//! (refused). The hits send every such cache here with one `hot_flags`
//! test (see [`HotFlags::ALLOC_SLOW`], [`HotFlags::FREE_SLOW`]). As in
//! Linux `mm/slub.c`, everything debug-related sits behind three hooks,
//! each called from one place:
//!
//! ```text
//!  alloc_flagged ─► alloc_recorded (KMEMTRACE: the event after the alloc)
//!        └─► alloc_cold: pre_alloc_hook ─► magazines ─► post_alloc_hook
//!  free_flagged ──► free_recorded (KMEMTRACE: the event after the free)
//!        └─► free_flagged_with: free_hook ─► magazines
//! ```

use core::ptr::NonNull;

use super::debug::DebugFree;
use super::{AllocOut, HotFlags, KmemCache, pack};
use crate::alloc_tag::AllocTagRef;
use crate::error::{AllocError, FreeError};
use crate::layout::geometry::SlabKind;
use crate::platform::Platform;
use crate::slab::Slab;
use crate::sync::IrqGuard;

impl<P: Platform> KmemCache<P> {
    /// With some flag other than those the plain hit ignores: profiling
    /// on a bufctl cache, or bookkeeping (audit, tracing, bootstrap,
    /// kmemtrace). `tag` is called only if `PROFILING` is set. The size
    /// comes second, where the kmalloc hit keeps it: no register copy on
    /// the hit for this tail call.
    #[cold]
    #[inline(never)]
    pub(super) fn alloc_flagged<O: AllocOut>(
        &self,
        bytes_req: usize,
        hot: HotFlags,
        tag: impl Fn() -> Option<AllocTagRef>,
    ) -> O::Raw {
        O::raw_from_packed(self.alloc_flagged_packed(hot, tag, bytes_req))
    }

    /// [`Self::alloc_flagged`], its result packed.
    pub(super) fn alloc_flagged_packed(
        &self,
        hot: HotFlags,
        tag: impl Fn() -> Option<AllocTagRef>,
        bytes_req: usize,
    ) -> usize {
        if hot.contains(HotFlags::UNBORN) {
            // A size class's first kmalloc on a small source: create it.
            return self.owner().kmalloc_unborn(self, tag, bytes_req);
        }
        if hot.contains(HotFlags::KMEMTRACE) {
            // KMEMTRACE HOOK: kmalloc, kmem_cache_alloc, GlobalAlloc (ok or failed).
            return self.alloc_recorded(hot - HotFlags::KMEMTRACE, tag, bytes_req);
        }
        let mut hot = hot;
        if hot.contains(HotFlags::SAMPLE) {
            // KFENCE HOOK: a sample is armed; served from the guarded pool
            // (this cache's bit cleared either way).
            if let Some(obj) = self.owner().kfence_alloc(self, bytes_req, &tag) {
                return pack(Ok(obj));
            }
            hot -= HotFlags::SAMPLE;
        }
        let tag = if hot.contains(HotFlags::PROFILING) {
            tag()
        } else {
            None
        };
        pack(self.alloc_cold(hot, tag, bytes_req))
    }

    /// An allocation kmemtrace records: the alloc as without the bit, then
    /// the event (alloc or failed alloc).
    #[inline(never)]
    pub(super) fn alloc_recorded(
        &self,
        hot: HotFlags,
        tag: impl Fn() -> Option<AllocTagRef>,
        bytes_req: usize,
    ) -> usize {
        let packed = if !hot.intersects(HotFlags::ALLOC_SLOW) {
            match self.magazine_alloc_hit() {
                Some(obj) => {
                    // SAFETY: just popped; no slow bit: the cache is keyed.
                    unsafe { super::double_free::clear_key(obj) };
                    pack(Ok(obj))
                }
                None => self.alloc_slow_packed(None),
            }
        } else {
            self.alloc_flagged_packed(hot, tag, bytes_req)
        };
        self.owner().kmemtrace_alloc(self, packed, bytes_req);
        packed
    }

    /// Alloc with bookkeeping (Linux `slab_alloc_node` with its hooks):
    /// [`Self::pre_alloc_hook`], the magazines (hit or miss), then
    /// [`Self::post_alloc_hook`]. `bytes_req`: what a kmalloc caller asked
    /// for (0: the whole object), where a `REDZONE` cache starts the
    /// redzone.
    pub(super) fn alloc_cold(
        &self,
        hot: HotFlags,
        tag: Option<AllocTagRef>,
        bytes_req: usize,
    ) -> Result<NonNull<u8>, AllocError> {
        self.pre_alloc_hook(hot)?;
        let obj = self.magazine_alloc_or_miss()?;
        // SAFETY: just taken from our magazines or slab layer.
        unsafe { self.key_allocated(obj) };
        self.post_alloc_hook(obj, hot, tag, bytes_req);
        Ok(obj)
    }

    /// Before an alloc with bookkeeping (Linux `slab_pre_alloc_hook`):
    /// callers may not allocate from a bootstrap cache.
    #[inline(always)]
    fn pre_alloc_hook(&self, hot: HotFlags) -> Result<(), AllocError> {
        if hot.contains(HotFlags::BOOTSTRAP) {
            return Err(AllocError::InvalidLayout);
        }
        Ok(())
    }

    /// After an alloc with bookkeeping (Linux `slab_post_alloc_hook`): the
    /// debug checks and trailer (debug caches), the tag charged and its
    /// token stored (profiling: bufctl caches, and small ones whose hit
    /// missed), the trace record (traced caches).
    #[inline(always)]
    fn post_alloc_hook(
        &self,
        obj: NonNull<u8>,
        hot: HotFlags,
        tag: Option<AllocTagRef>,
        bytes_req: usize,
    ) {
        #[cfg(not(feature = "alloc-profiling"))]
        let _ = tag;
        let addr = obj.as_ptr() as usize;
        if let Some(layout) = self.debug.as_ref() {
            let slab = match self.kind {
                SlabKind::Small => self.small_slab_of(addr) as usize,
                SlabKind::Bufctl => self.params.page_map.get(addr).slab_unchecked(),
            };
            // SAFETY: just taken from our magazines or slab layer: ours
            // until returned (its stride holds the debug slot).
            if let Some(report) = unsafe { self.debug_on_alloc(layout, addr, slab, bytes_req) } {
                self.owner().report_error(report);
            }
        }
        // Charged, and the charge token stored: in the bufctl, or in the
        // small slab's side array (not charged if there is none and none
        // can be allocated).
        #[cfg(feature = "alloc-profiling")]
        if let Some(tag) = tag {
            if self.kind == SlabKind::Bufctl {
                // SAFETY: `tag` is a charge token (see alloc_profiled).
                unsafe { crate::alloc_tag::charge_off_hit::<P>(tag, obj, self.params.obj_size) };
                self.bufctl_mark_allocated(addr, tag);
            } else {
                self.tag_small_object(obj, tag, hot);
            }
        }
        #[cfg(not(feature = "alloc-profiling"))]
        let _ = (tag, addr);
        if hot.contains(HotFlags::TRACED) {
            self.trace_alloc(obj);
        }
    }

    /// A bufctl object leaves for a caller charged to a tag: state
    /// `Allocated` and the charge `token` stored.
    #[cfg(feature = "alloc-profiling")]
    pub(super) fn bufctl_mark_allocated(&self, addr: usize, token: AllocTagRef) {
        if !self.hot().contains(HotFlags::BUFCTL_TAGGED) {
            // Before the store: whoever frees the object sees the flag.
            self.set_hot(HotFlags::BUFCTL_TAGGED);
        }
        let busy = self.slab.lock().mark_allocated(addr, Some(token));
        debug_assert!(busy);
    }

    /// Free with bookkeeping (a `FREE_SLOW` flag other than the profiled
    /// case): the checks that can refuse, tracing, uncharging, then the
    /// magazines.
    ///
    /// # Safety
    /// As for [`Self::finish_free`] (`slab` may be null for a bufctl cache
    /// off the primary source: the hash decides).
    #[inline(never)]
    pub(crate) unsafe fn free_flagged(
        &self,
        obj: NonNull<u8>,
        slab: *mut Slab,
    ) -> Result<(), FreeError> {
        let hot = self.hot().intersection(HotFlags::FREE_SLOW);
        if hot.contains(HotFlags::KMEMTRACE) {
            // KMEMTRACE HOOK: kfree, kmem_cache_free, GlobalAlloc::dealloc
            // (ok or refused).
            // SAFETY: per our caller.
            return unsafe { self.free_recorded(obj, slab, hot - HotFlags::KMEMTRACE) };
        }
        // SAFETY: per our caller.
        unsafe { self.free_flagged_with(obj, slab, hot) }
    }

    /// [`Self::free_flagged`] with the flags read.
    ///
    /// # Safety
    /// As for [`Self::free_flagged`].
    #[inline(always)]
    pub(super) unsafe fn free_flagged_with(
        &self,
        obj: NonNull<u8>,
        slab: *mut Slab,
        hot: HotFlags,
    ) -> Result<(), FreeError> {
        self.free_hook(obj, slab, hot)?;
        // SAFETY: validated above; the caller gives the object up.
        unsafe { self.magazine_free(obj) }
    }

    /// A free kmemtrace records: the free as without the bit, then the
    /// event (free or bad free), with interrupts off throughout so that
    /// nothing on this CPU reuses the object before its free is recorded.
    ///
    /// # Safety
    /// As for [`Self::free_flagged`].
    #[inline(never)]
    pub(super) unsafe fn free_recorded(
        &self,
        obj: NonNull<u8>,
        slab: *mut Slab,
        hot: HotFlags,
    ) -> Result<(), FreeError> {
        // An object holding the free key is confirmed by a search of every
        // CPU's magazines, which needs interrupts on (cross-CPU calls):
        // then the free runs with them on (a double free, refused; or, if
        // the owner wrote the key, a free recorded a moment late).
        // SAFETY: per our caller, an object start of ours; keyed objects
        // hold a word.
        let suspect = self.is_keyed()
            && unsafe { super::double_free::holds_key(obj, super::double_free::free_key()) };
        let irq = (!suspect).then(IrqGuard::<P>::new);
        // SAFETY: per our caller.
        let result = unsafe { self.free_flagged_with(obj, slab, hot) };
        self.owner().kmemtrace_free(Some(self), obj, result.is_ok());
        drop(irq);
        result
    }

    /// Before a free with bookkeeping goes to the magazines (Linux
    /// `slab_free_hook`): the checks that can refuse (each refusal
    /// reported: bootstrap caches, a bufctl object not busy, a debug
    /// cache's state word), the debug trailer, then the trace record
    /// removed and the tag uncharged.
    pub(super) fn free_hook(
        &self,
        obj: NonNull<u8>,
        slab: *mut Slab,
        hot: HotFlags,
    ) -> Result<(), FreeError> {
        let addr = obj.as_ptr() as usize;
        if hot.contains(HotFlags::BOOTSTRAP) {
            return Err(self.refuse(FreeError::NotAllocated { addr }));
        }
        #[cfg(feature = "alloc-profiling")]
        let mut bufctl_tag = None;
        if self.kind == SlabKind::Bufctl
            && (hot.contains(HotFlags::BUFCTL_TAGGED) || slab.is_null())
        {
            let Ok(tag) = self.slab.lock().mark_cached(addr) else {
                // Not busy in the slab layer. If the page map located an
                // exact object start in a live slab of ours, the object is
                // free in its slab. Without a slab (a cache off the
                // primary source: the hash alone decides) we cannot tell
                // it from a stray pointer.
                return Err(self.refuse(if slab.is_null() {
                    FreeError::NotAllocated { addr }
                } else {
                    FreeError::DoubleFree { addr }
                }));
            };
            #[cfg(feature = "alloc-profiling")]
            {
                bufctl_tag = tag;
            }
            #[cfg(not(feature = "alloc-profiling"))]
            let _ = tag;
        }
        if let Some(layout) = self.debug.as_ref() {
            // SAFETY: an object start of ours (the owner check, or the
            // hash above off the primary source), given up by the caller.
            match unsafe { self.debug_on_free(layout, addr, slab as usize) } {
                DebugFree::Clean => {}
                DebugFree::Repaired(report) => self.owner().report_error(report),
                DebugFree::Duplicate(report) => {
                    self.owner().report_error(report);
                    return Err(FreeError::DoubleFree { addr });
                }
            }
        }
        if hot.contains(HotFlags::EVER_TRACED) {
            self.trace_free(addr);
        }
        // Uncharge only once every check above has passed: a refused free
        // changes nothing. No lock is held here.
        #[cfg(feature = "alloc-profiling")]
        if self.kind == SlabKind::Bufctl {
            if let Some(token) = bufctl_tag {
                // SAFETY: the bufctl's token, stored by alloc_cold from
                // the charge of this object and taken (cleared) by
                // mark_cached above: uncharged once.
                unsafe {
                    crate::alloc_tag::uncharge_off_hit::<P>(token, obj, self.params.obj_size)
                };
            }
        } else if hot.contains(HotFlags::TAGGED) {
            // SAFETY: `slab` is the located, alive small slab of addr.
            let (index, _) = self.obj_index(addr - unsafe { (*slab).base });
            // SAFETY: a located small-slab object of ours, given up.
            unsafe { self.untag_small_object::<false>(obj, slab, index) };
        }
        Ok(())
    }
}

impl<P: Platform> KmemCache<P> {
    /// Report a free this cache refuses, and hand the error back.
    #[cold]
    #[inline(never)]
    pub(crate) fn refuse(&self, error: FreeError) -> FreeError {
        self.owner().report_bad_free(self.name(), error);
        error
    }
}
