//! The allocation's feature hooks, each called from one place of the one
//! alloc (`cache/alloc.rs`, `alloc_off_hit`), dispatching to the
//! feature's own function (as in Linux `mm/slub.c`:
//! `slab_pre_alloc_hook`, `slab_post_alloc_hook`), and the allocation's
//! one kmemtrace event (Akaros `kmem_trace_alloc`). The free's hook and
//! event sit in `cache/free.rs`, so that the free reads top to bottom in
//! one file (SLUB `slab_free`: `slab_free_hook()` once, then the hit or
//! the slow path). A cache reaches them only with a feature on (one
//! `hot_flags` test on the hit: [`HotFlags::ALLOC_SLOW`]).
//!
//! ```text
//!  alloc_off_hit ─► alloc_usual: profiled words on a hit:
//!       │           post_alloc_hook inline
//!       └─► else alloc_off_usual ─► alloc_usual_recorded: recorded
//!             │     words on a hit: post_alloc_hook and its event
//!             │     (alloc_event) inline
//!             └─► else alloc_hooked_cold: no flag: alloc_slow
//!             UNBORN: not ready; a class born now
//!             pre_alloc_hook   bootstrap refusal, KFENCE sample
//!             the hit, or the miss
//!             post_alloc_hook  cold: free key or keyless mark, debug
//!                              (debug/object.rs), trace table
//!                              (trace_table/cache.rs);
//!                              profiling (profiling.rs)
//!  every way out: alloc_event ► kmemtrace_alloc  the kmemtrace event
//!                 (a failed allocation's: kmemtrace_alloc::<false>)
//! ```
//!
//! What a hook needs from the allocator (KFENCE's pool, the kmemtrace
//! rings, the error reports, the unborn classes) it asks the cache's
//! owner for ([`CacheOwner`](super::CacheOwner)).

use core::ptr::NonNull;

use super::{HotFlags, KmemCache, double_free};
use crate::alloc_tag::AllocTagRef;
use crate::error::AllocError;
use crate::kmemtrace::{EventFields, EventKind, EventType, head_word};
use crate::platform::Platform;

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
    /// Cannot fail: returns `obj`; inline, so the usual words' path needs
    /// no stack frame (`alloc.rs`, `alloc_usual`).
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
                #[cfg(feature = "debug")]
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
        self.alloc_event(obj, hot, bytes_req)
    }

    /// The allocation's way out (Linux `trace_kmem_cache_alloc`, Akaros
    /// `kmem_trace_alloc`): its kmemtrace event if this cache is
    /// recorded ([`Self::kmemtrace_alloc`], inline), and `obj`. A failed allocation's
    /// event is `kmemtrace_alloc::<false>`, from the one place that
    /// sees the failure (`alloc.rs`, `alloc_hooked_cold`).
    #[inline(always)]
    pub(super) fn alloc_event(
        &self,
        obj: NonNull<u8>,
        hot: HotFlags,
        bytes_req: usize,
    ) -> NonNull<u8> {
        if hot.contains(HotFlags::KMEMTRACE) {
            // SAFETY: the recorder hands `obj`'s address back.
            return unsafe {
                NonNull::new_unchecked(self.kmemtrace_alloc::<true>(obj.as_ptr(), bytes_req))
            };
        }
        obj
    }

    /// kmemtrace: the event of an allocation of `obj` (`OK`), or of a
    /// failed one (`obj` null), into this CPU's ring of the owner's
    /// recorder (handed down at creation: [`KmemCache::recorder`]): a
    /// `kmem_cache_alloc` when `bytes_req` is 0, else a kmalloc of
    /// `bytes_req` bytes. Returns `obj`.
    #[inline(always)]
    pub(super) fn kmemtrace_alloc<const OK: bool>(
        &self,
        obj: *mut u8,
        bytes_req: usize,
    ) -> *mut u8 {
        const CACHE_TO_KMALLOC: u64 =
            head_word(0, EventType::Cache as u8 ^ EventType::Kmalloc as u8, 0, 0);
        const ALLOC_TO_FAILED: u64 = head_word(
            EventKind::Alloc as u8 ^ EventKind::FailedAlloc as u8,
            0,
            0,
            0,
        );
        let head = self.event_head;
        let head = if OK { head } else { head ^ ALLOC_TO_FAILED };
        let (head, bytes_req) = if bytes_req == 0 {
            (head, self.params.obj_size)
        } else {
            (head ^ CACHE_TO_KMALLOC, bytes_req)
        };
        // SAFETY: our callers saw this cache's `KMEMTRACE` bit in hot
        // flags loaded with Acquire (`alloc.rs`).
        let ptr = unsafe {
            self.recorder().record_recorded::<P>(EventFields {
                head,
                ptr: obj as usize,
                bytes_req,
                bytes_alloc: self.params.obj_size,
            })
        };
        ptr as *mut u8
    }
}
