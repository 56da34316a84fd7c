//! The feature hooks, each called from one place of the one alloc
//! (`cache/alloc.rs`, `alloc_off_hit`) or the one free (`cache/free.rs`,
//! `free_off_hit`), and dispatching to the feature's own function (as in
//! Linux `mm/slub.c`: `slab_pre_alloc_hook`, `slab_post_alloc_hook`,
//! `slab_free_hook`). A cache reaches them only with a feature on (one
//! `hot_flags` test on the hit: [`HotFlags::ALLOC_SLOW`],
//! [`HotFlags::FREE_SLOW`]).
//!
//! ```text
//!  alloc_off_hit ─► alloc_usual: usual words on a hit: post_alloc_hook
//!       │           inline, its event a tail call (alloc_done)
//!       └─► else alloc_hooked_cold: no flag: alloc_slow
//!             UNBORN: not ready; a class born now
//!             pre_alloc_hook   bootstrap refusal, KFENCE sample
//!             the hit, or the miss
//!             post_alloc_hook  cold: free key or keyless mark, debug
//!                              (debug/object.rs), trace table
//!                              (trace_table/cache.rs);
//!                              profiling (profiling.rs)
//!  every way out: alloc_done / alloc_event  the kmemtrace event
//!  free_off_hit ─► free_usual: profiling's word: free_hook inline, the hit
//!       └─► else free_off_usual: no flag: free_slow
//!             recording: free_recorded (hook, hit, event; interrupts off)
//!             else free_hooked: kmemtrace_free_guard, free_hook
//!             (cold: bootstrap refusal, bufctl state, debug, trace
//!             record; the tag uncharged), the hit or the miss
//!  every way out: free_event    the kmemtrace event (ok or refused)
//! ```
//!
//! What a hook needs from the allocator (KFENCE's pool, the kmemtrace
//! rings, the error reports, the unborn classes) it asks the cache's
//! owner for ([`CacheOwner`](super::CacheOwner)).

use core::ptr::NonNull;

use super::{HotFlags, KmemCache, double_free};
use crate::alloc_tag::AllocTagRef;
use crate::error::{AllocError, FreeError};
use crate::kmemtrace::{EventFields, EventKind, EventType, head_word};
use crate::layout::geometry::SlabKind;
use crate::platform::Platform;
use crate::slab::Slab;
use crate::sync::IrqGuard;

impl<P: Platform> KmemCache<P> {
    /// Before the hit (Linux `slab_pre_alloc_hook`): callers may not
    /// allocate from a bootstrap cache; an armed KFENCE sample may serve
    /// the allocation from the guarded pool (the cache's bit cleared
    /// either way). `Some`: the allocation is served (or refused) here.
    #[cold]
    #[inline(never)]
    #[cfg_attr(
        not(feature = "kfence"),
        expect(unused_variables, reason = "the sample's size and tag, KFENCE's only")
    )]
    pub(super) fn pre_alloc_hook(
        &self,
        hot: HotFlags,
        tag: &dyn Fn() -> Option<AllocTagRef>,
        bytes_req: usize,
    ) -> Option<Result<NonNull<u8>, AllocError>> {
        if hot.contains(HotFlags::BOOTSTRAP) {
            return Some(Err(AllocError::InvalidLayout));
        }
        #[cfg(feature = "kfence")]
        if hot.contains(HotFlags::SAMPLE) {
            return self.owner().kfence_alloc(self, bytes_req, tag).map(Ok);
        }
        None
    }

    /// After the hit or the miss (Linux `slab_post_alloc_hook`): off the
    /// keyed hit (which took the free key) the key cleared, or a keyless
    /// cache's mark; the debug checks and trailer; the trace record; the
    /// tag charged and stored (profiling; `tag` is asked only with
    /// profiling on); then the kmemtrace event ([`Self::alloc_event`]).
    /// Cannot fail: returns `obj`, each way out a tail call, so the usual
    /// words' path needs no stack frame (`alloc.rs`, `alloc_usual`).
    ///
    /// `RARE`: `obj` may come from elsewhere than the keyed hit and `hot`
    /// may have a bit of [`HotFlags::ALLOC_HOOKED_RARE`] (else those
    /// tests are compiled out: the usual words' path).
    #[inline(always)]
    pub(super) fn post_alloc_hook<const RARE: bool>(
        &self,
        obj: NonNull<u8>,
        hot: HotFlags,
        tag: &impl Fn() -> Option<AllocTagRef>,
        bytes_req: usize,
    ) -> NonNull<u8> {
        if RARE {
            if hot.contains(HotFlags::DEBUG) {
                // Unmarked (`KeyPlace::Unmarked`): the state word is the
                // debug cache's mark.
                self.debug_alloc_hook(obj, bytes_req);
            } else if hot.contains(HotFlags::KEYLESS) {
                // SAFETY: just taken from our magazines or slab layer.
                unsafe { self.mark_key(obj, false) };
            } else {
                // SAFETY: as above; a keyed cache.
                unsafe { double_free::clear_key(obj) };
            }
            #[cfg(feature = "trace-table")]
            if hot.contains(HotFlags::TRACED) {
                self.trace.record_alloc(self, obj);
            }
        }
        #[cfg(feature = "alloc-profiling")]
        if hot.contains(HotFlags::PROFILING)
            && let Some(tag) = tag()
            && !self.profiling_alloc_hook::<RARE>(obj, hot, tag)
        {
            return self.profiling_alloc_cold(obj, hot, tag, bytes_req);
        }
        #[cfg(not(feature = "alloc-profiling"))]
        let _ = tag;
        self.alloc_done(obj, hot, bytes_req)
    }

    /// A successful allocation's way out: its kmemtrace event if this
    /// cache is recorded (a tail call that hands the object back:
    /// [`Self::kmemtrace_alloc_hook`]), and `obj`.
    #[inline(always)]
    pub(super) fn alloc_done(
        &self,
        obj: NonNull<u8>,
        hot: HotFlags,
        bytes_req: usize,
    ) -> NonNull<u8> {
        if hot.contains(HotFlags::KMEMTRACE) {
            return self.kmemtrace_alloc_hook(obj, bytes_req);
        }
        obj
    }

    /// The allocation's way out: its kmemtrace event if this cache is
    /// recorded ([`Self::alloc_done`], or the failed allocation's), and
    /// `result` handed back.
    #[inline(always)]
    pub(super) fn alloc_event(
        &self,
        result: Result<NonNull<u8>, AllocError>,
        hot: HotFlags,
        bytes_req: usize,
    ) -> Result<NonNull<u8>, AllocError> {
        match result {
            Ok(obj) => Ok(self.alloc_done(obj, hot, bytes_req)),
            Err(error) if hot.contains(HotFlags::KMEMTRACE) => {
                self.kmemtrace_failed_alloc(error, bytes_req)
            }
            Err(error) => Err(error),
        }
    }

    /// kmemtrace: the allocation's event, into this CPU's ring of the
    /// owner's recorder (handed down at creation: [`KmemCache::recorder`]).
    /// Returns `obj`.
    #[inline(never)]
    fn kmemtrace_alloc_hook(&self, obj: NonNull<u8>, bytes_req: usize) -> NonNull<u8> {
        let ptr = self.kmemtrace_alloc_event(obj.as_ptr() as usize, bytes_req);
        // SAFETY: the recorder hands `obj`'s address back.
        unsafe { NonNull::new_unchecked(ptr as *mut u8) }
    }

    /// kmemtrace: a failed allocation's event; returns the error.
    #[cold]
    #[inline(never)]
    fn kmemtrace_failed_alloc(
        &self,
        error: AllocError,
        bytes_req: usize,
    ) -> Result<NonNull<u8>, AllocError> {
        let _ = self.kmemtrace_alloc_event(0, bytes_req);
        Err(error)
    }

    /// The event of an allocation of `ptr` (0: a failed one): a
    /// `kmem_cache_alloc` when `bytes_req` is 0, else a kmalloc of
    /// `bytes_req` bytes. Returns `ptr`.
    #[inline(always)]
    fn kmemtrace_alloc_event(&self, ptr: usize, bytes_req: usize) -> usize {
        const CACHE_TO_KMALLOC: u64 =
            head_word(0, EventType::Cache as u8 ^ EventType::Kmalloc as u8, 0, 0);
        const ALLOC_TO_FAILED: u64 = head_word(
            EventKind::Alloc as u8 ^ EventKind::FailedAlloc as u8,
            0,
            0,
            0,
        );
        let head = self.event_head;
        let head = if ptr != 0 {
            head
        } else {
            head ^ ALLOC_TO_FAILED
        };
        let (head, bytes_req) = if bytes_req == 0 {
            (head, self.params.obj_size)
        } else {
            (head ^ CACHE_TO_KMALLOC, bytes_req)
        };
        self.recorder().record::<P>(EventFields {
            head,
            ptr,
            bytes_req,
            bytes_alloc: self.params.obj_size,
        })
    }

    /// Before a free goes to the magazines (Linux `slab_free_hook`): the
    /// checks that can refuse (each refusal reported: bootstrap caches, a
    /// bufctl object that is not busy, a debug cache's state word), a
    /// bufctl object's tag uncharged, the trace record removed (compiled
    /// out of the usual words' path), then the small object's tag
    /// uncharged (profiling; only once every check passed: a refused free
    /// changes nothing).
    ///
    /// # Safety
    /// As for [`Self::free_hooked`].
    ///
    /// `RARE`: `hot` may have a bit of [`HotFlags::FREE_HOOKED_RARE`] and
    /// `slab` may be null (else those tests are compiled out).
    #[inline(always)]
    pub(super) unsafe fn free_hook<const RARE: bool>(
        &self,
        obj: NonNull<u8>,
        slab: *mut Slab,
        index: usize,
        hot: HotFlags,
    ) -> Result<(), FreeError> {
        if RARE {
            let addr = obj.as_ptr() as usize;
            if hot.contains(HotFlags::BOOTSTRAP) {
                return Err(self.refuse(FreeError::NotAllocated { addr }));
            }
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
                if let Some(token) = tag {
                    // SAFETY: the bufctl's token, stored at the alloc and taken
                    // (cleared) just now: uncharged once.
                    unsafe {
                        crate::alloc_tag::uncharge_off_hit::<P>(token, obj, self.params.obj_size)
                    };
                }
                #[cfg(not(feature = "alloc-profiling"))]
                let _ = tag;
            }
            if hot.contains(HotFlags::DEBUG) {
                // SAFETY: an object start of ours (the owner check, or the
                // hash above off the primary source), given up by the caller.
                unsafe { self.debug_free_hook(addr, slab) }?;
            }
            #[cfg(feature = "trace-table")]
            if hot.contains(HotFlags::EVER_TRACED) {
                self.trace.record_free(self, addr);
            }
        }
        #[cfg(feature = "alloc-profiling")]
        if hot.contains(HotFlags::TAGGED) {
            debug_assert!(self.kind == SlabKind::Small, "TAGGED is a small cache's");
            // SAFETY: per our caller, object `index` of the live small
            // slab `slab` (only small caches are `TAGGED`), given up.
            unsafe { self.profiling_free_hook(obj, slab, index, hot) };
        }
        #[cfg(not(feature = "alloc-profiling"))]
        let _ = index;
        Ok(())
    }

    /// kmemtrace: whether the free and its event run with interrupts
    /// off (`Some`: the guard). Not for an object holding the free key:
    /// its free's double-free confirmation searches every CPU's
    /// magazines, which needs interrupts on (then the free is a double
    /// free, refused; or, if the owner wrote the key, a free recorded a
    /// moment late).
    ///
    /// # Safety
    /// `obj` is an object start of this cache.
    #[inline(always)]
    pub(super) unsafe fn kmemtrace_free_guard(
        &self,
        obj: NonNull<u8>,
        hot: HotFlags,
    ) -> Option<IrqGuard<P>> {
        // SAFETY: per our caller; keyed objects hold a word.
        let suspect = !hot.contains(HotFlags::KEYLESS)
            && unsafe { double_free::holds_key(obj, double_free::free_key()) };
        (!suspect).then(IrqGuard::<P>::new)
    }

    /// The free's way out: its kmemtrace event if this cache is recorded
    /// (a tail call: [`Self::kmemtrace_freed`], or
    /// [`Self::kmemtrace_refused_free`]), the interrupt guard `irq`
    /// dropped after it, and `result` handed back.
    #[inline(always)]
    pub(super) fn free_event(
        &self,
        obj: NonNull<u8>,
        result: Result<(), FreeError>,
        hot: HotFlags,
        irq: Option<IrqGuard<P>>,
    ) -> Result<(), FreeError> {
        if hot.contains(HotFlags::KMEMTRACE) {
            return match result {
                Ok(()) => self.kmemtrace_freed(obj, irq),
                Err(error) => self.kmemtrace_refused_free(obj, error, irq),
            };
        }
        drop(irq);
        result
    }

    /// kmemtrace: a free's event, then `irq` dropped; returns `Ok`,
    /// made here, so the caller passes nothing in memory.
    #[inline(never)]
    pub(super) fn kmemtrace_freed(
        &self,
        obj: NonNull<u8>,
        irq: Option<IrqGuard<P>>,
    ) -> Result<(), FreeError> {
        self.kmemtrace_free_event(obj, true);
        drop(irq);
        Ok(())
    }

    /// kmemtrace: a refused free's event, then `irq` dropped; returns
    /// the error.
    #[cold]
    #[inline(never)]
    fn kmemtrace_refused_free(
        &self,
        obj: NonNull<u8>,
        error: FreeError,
        irq: Option<IrqGuard<P>>,
    ) -> Result<(), FreeError> {
        self.kmemtrace_free_event(obj, false);
        drop(irq);
        Err(error)
    }

    /// The event of a free (a refused one unless `ok`), as
    /// [`Self::kmemtrace_alloc_event`]. Frees to kmalloc caches are
    /// `kfree`s (the cache's free head says which).
    #[inline(always)]
    fn kmemtrace_free_event(&self, obj: NonNull<u8>, ok: bool) {
        const ALLOC_TO_FREE: u64 =
            head_word(EventKind::Alloc as u8 ^ EventKind::Free as u8, 0, 0, 0);
        const ALLOC_TO_BAD: u64 =
            head_word(EventKind::Alloc as u8 ^ EventKind::BadFree as u8, 0, 0, 0);
        const CACHE_TO_KMALLOC: u64 =
            head_word(0, EventType::Cache as u8 ^ EventType::Kmalloc as u8, 0, 0);
        let head = self.event_head ^ if ok { ALLOC_TO_FREE } else { ALLOC_TO_BAD };
        let head = head ^ (u64::from(self.permanent) * CACHE_TO_KMALLOC);
        let _ = self.recorder().record::<P>(EventFields {
            head,
            ptr: obj.as_ptr() as usize,
            bytes_req: 0,
            bytes_alloc: self.params.obj_size,
        });
    }

    /// Report a free this cache refuses, and hand the error back.
    #[cold]
    #[inline(never)]
    pub(crate) fn refuse(&self, error: FreeError) -> FreeError {
        self.owner().report_bad_free(self.name(), error);
        error
    }
}
