//! The one free, top to bottom (Akaros `kmem_cache_free`, SLUB
//! `slab_free`): [`KmemCache::free`], `kfree` and `GlobalAlloc::dealloc`
//! locate the pointer (the owner check and the object index: one
//! page-map slot, one multiply) and come through
//! [`KmemCache::free_located`]:
//!
//! 1. the hit ([`KmemCache::free_hit`], the one copy): one test of the
//!    hot flags (`HotFlags::FREE_SLOW`: no feature on for this cache),
//!    then this CPU's in-use flag taken, the free key tested and
//!    written, and the push on its `loaded`, written out there;
//! 2. else [`KmemCache::free_off_hit`], out of line: the usual word
//!    ([`KmemCache::free_usual`], inlined there): one load and one
//!    compare of the hot flags, and for profiling alone on a keyed
//!    cache the free hook (below: the tag uncharged) and the same hit
//!    right there, no stack frame;
//! 3. else a tail call of [`KmemCache::free_off_usual`]: for kmemtrace
//!    recording on a keyed cache (profiled or not) the hook, the hit and
//!    its event with interrupts off right there
//!    ([`KmemCache::free_recorded`]; out of `free_off_hit`, so that the
//!    event's work costs the profiled hit no stack frame); no feature
//!    on, the one slow function for the miss ([`KmemCache::free_slow`]:
//!    the double-free confirmation, `prev`, the depot, a new magazine,
//!    the slab layer); anything else (and a recorded miss)
//!    [`KmemCache::free_hooked`]: the free hook (`free_hook`, here:
//!    bootstrap refusal, bufctl state, debug checks in
//!    `debug/object.rs`, trace record, tag uncharged in
//!    `profiling.rs`), the same hit and miss, the kmemtrace event
//!    (`free_event`, here too).
//!
//! `GlobalAlloc::dealloc` calls the hit and, past it, out-of-line
//! functions of its own that inline `free_usual` and `free_recorded`
//! too and call `free_off_usual` otherwise, reporting a refused free:
//! every way out of its hit is then a tail call.
//!
//! A pointer the page map does not vouch for (another page source, a
//! KFENCE sample, a bad pointer) takes [`KmemCache::free_unlocated`],
//! which finds it or says why not.

use core::ptr::{self, NonNull};

use super::{HotFlags, KmemCache, double_free};
use crate::error::FreeError;
use crate::kmemtrace::{EventFields, EventKind, head_word};
use crate::layout::geometry::SlabKind;
use crate::layout::pagemap::{PageEntry, PageMap, PageSlot};
use crate::magazine::{MAG_FREE_RETRIES, Magazine, PcpuCache};
use crate::platform::Platform;
use crate::slab::{SLAB_MAGIC, Slab, small_header};
use crate::sync::{IrqGuard, LocalLocked};

/// Where the page map put a freed pointer: its object index and its
/// page-map slot (the slab struct is read from the slot only off the
/// hit: [`Located::slab`]).
#[derive(Clone, Copy)]
pub(crate) struct Located {
    /// The object's index in its slab.
    pub(crate) index: usize,
    /// The page-map slot of the object's page.
    pub(crate) slot: *const PageSlot,
}

impl Located {
    /// The slab struct of the located object (its slot's entry, one load).
    ///
    /// # Safety
    /// `self` came from a free's owner check of a busy object (its slab
    /// and slot stay while the caller frees it).
    #[inline(always)]
    pub(crate) unsafe fn slab(self) -> *mut Slab {
        // SAFETY: per our caller, a slot of the page map, alive.
        unsafe { (*self.slot).slab() as *mut Slab }
    }
}

/// The bits [`KmemCache::free_usual`] takes its path without: the
/// free's slow bits but `TAGGED`, and a bufctl cache's (no small slab).
const FREE_USUAL_NOT: HotFlags = HotFlags::FREE_SLOW
    .difference(HotFlags::TAGGED)
    .union(HotFlags::BUFCTL);

impl<P: Platform> KmemCache<P> {
    /// Free an object back to this cache.
    ///
    /// Checked: the pointer must be slab memory (`NotAllocated`), of this
    /// cache (`WrongCache`), at an object start (`Misaligned`), and not
    /// free (`DoubleFree`: anywhere, by the free key
    /// (`cache/double_free.rs`) or a debug cache's state word;
    /// for the other keyless caches, on top of this CPU's magazines or back
    /// in its slab). On error nothing has changed, and the error is
    /// reported ([`crate::reports`]).
    ///
    /// # Safety
    /// If `obj` is an allocated object of this cache, the caller gives it
    /// up: nothing uses it afterwards; for a cache with a constructor, in
    /// its constructed state, every byte initialised ([`Ctor`](crate::Ctor)).
    /// (Bad pointers are detected as above
    /// and are safe to pass, except a double free of an object resting
    /// deeper in a magazine of a keyless cache without debug flags (a
    /// constructor's, `NOTOUCH`), which is undetected: the object is later
    /// handed out twice. The slab layer still refuses it when it comes
    /// back there.)
    ///
    /// # Errors
    /// See above; [`FreeError::NotAllocated`] for bootstrap caches.
    #[inline]
    pub unsafe fn free(&self, obj: NonNull<u8>) -> Result<(), FreeError> {
        // The common case of locating a freed pointer: the page map (so:
        // on the primary source) names this cache as the page's owner and
        // `obj` is an object start; anything else takes the slow path,
        // which says why. The object's page-map slot only, no slab
        // header: the owner test is one compare with `self`, and the slot
        // holds the slab's first object and the stride magic for the
        // index (a page that is not a slab page has magic 0, refused by
        // the object-start test even if its owner word still names this
        // cache). Off the primary source the map is empty.
        let addr = obj.as_ptr() as usize;
        let located = self.params.page_map.slot(addr).and_then(|slot| {
            // The magic first (Acquire), as above.
            let magic = slot.magic();
            if slot.cache() != self as *const Self as usize {
                return None;
            }
            self.index_with(magic, slot.base(), addr)
                .map(|index| Located { index, slot })
        });
        match located {
            // SAFETY: per our caller; located in this cache.
            Some(at) => unsafe { self.free_located(obj, at) },
            // SAFETY: per our caller; nothing changed.
            None => unsafe { self.free_unlocated(obj) },
        }
    }

    /// Locate a freed pointer (`Kmem::kfree`, `GlobalAlloc::dealloc`
    /// and `realloc`, in the allocator's page map `map`): its page-map slot gives the stride magic
    /// (0 for a page that is not a slab page) and the slab's first
    /// object, and one multiply checks the object start and gives the
    /// index; then the slot names the owning cache, for the index bound. No slab header is read. `None` for anything else, with
    /// nothing changed. No readiness test: `init` publishes the page map
    /// (READY, Release) before any allocation; before it the map is empty
    /// (no pages), every address misses and goes to the slow path, which
    /// tests.
    #[inline(always)]
    pub(crate) fn locate_allocated(map: PageMap, addr: usize) -> Option<(&'static Self, Located)> {
        let slot = map.slot(addr)?;
        // The object-start test by the slot's magic (Acquire, first): 0
        // on any page that is no slab page, so it refuses those too and
        // the owner needs no null test.
        let (index, exact) = obj_index_with(slot.magic(), slot.offset_in_slab(addr));
        if !exact {
            return None;
        }
        // SAFETY: the magic was non-zero, so the owner written before it
        // (Release) is visible and non-null (never cleared once set): a
        // cache of this allocator (same P) with a live slab on the page,
        // alive while it has slabs (a cache in use is never destroyed:
        // `destroy` requires no objects allocated); the magic is cleared
        // before the slab goes.
        let cache: &'static Self = unsafe { &*(slot.cache() as *const Self) };
        if index >= cache.params.nr_objs_per_slab {
            return None;
        }
        Some((cache, Located { index, slot }))
    }

    /// The free, once the owner check passed (`KmemCache::free`,
    /// `Kmem::kfree`): [`Self::free_hit`], else
    /// [`Self::free_off_hit`].
    ///
    /// # Safety
    /// `obj` is object `at.index` of the live slab of this cache that
    /// `at.slot` names; if it is allocated, the caller gives it up.
    #[inline(always)]
    pub(crate) unsafe fn free_located(
        &self,
        obj: NonNull<u8>,
        at: Located,
    ) -> Result<(), FreeError> {
        // SAFETY: per our caller; a cache without slow flags is keyed.
        if unsafe { self.free_hit::<{ HotFlags::FREE_SLOW.bits() }>(obj, true) } {
            return Ok(());
        }
        // SAFETY: per our caller; the hit changed nothing.
        unsafe { self.free_off_hit(obj, at) }
    }

    /// The free past a failed [`Self::free_hit`] (`KmemCache::free`,
    /// `kfree`), out of line and reached by a tail call (the plain hit
    /// stays a leaf): the usual words' hit ([`Self::free_usual`]), else
    /// [`Self::free_off_usual`].
    ///
    /// # Safety
    /// As for [`Self::free_located`].
    #[inline(never)]
    pub(crate) unsafe fn free_off_hit(
        &self,
        obj: NonNull<u8>,
        at: Located,
    ) -> Result<(), FreeError> {
        // SAFETY: per our caller.
        if unsafe { self.free_usual(obj, at) } {
            return Ok(());
        }
        // SAFETY: per our caller; the hit changed nothing (a tag the hook
        // uncharged is not found again).
        unsafe { self.free_off_usual::<false>(obj, at) }
    }

    /// The usual words past a failed [`Self::free_hit`], inlined into
    /// each edge's out-of-line function ([`Self::free_off_hit`], and
    /// `GlobalAlloc`'s): one load and one compare of the hot flags; the
    /// usual word without recording (profiling's `TAGGED` on a keyed
    /// cache: no other bit of [`HotFlags::FREE_SLOW`]) runs the free
    /// hook and the same magazine hit right here: the tag uncharged
    /// before the push (once pushed, an interrupt handler's alloc may
    /// take the object), no stack frame. False for anything else (no
    /// feature on: the miss; recording: [`Self::free_recorded`]; a rare
    /// feature; a full `loaded`); the caller then calls
    /// [`Self::free_off_usual`].
    ///
    /// # Safety
    /// As for [`Self::free_located`]; if this returns true, `obj` was
    /// freed.
    #[inline(always)]
    pub(crate) unsafe fn free_usual(&self, obj: NonNull<u8>, at: Located) -> bool {
        // One test: of the free's slow bits at most `TAGGED` (the rare
        // ones and `KMEMTRACE` clear), on a small-object cache; what the
        // hook tests of it is then known. With no slow bit (the plain
        // hit's miss) the hook finds no tag (a cache that never had
        // `TAGGED` stored none: its slabs' slots are all `None`) and the
        // hit misses again.
        if !crate::sync::flags_any::<{ FREE_USUAL_NOT.bits() }>(&self.hot_flags) {
            // SAFETY: per our caller; no rare bit, so nothing refuses.
            let _ = unsafe { self.free_hook::<false>(obj, at.slab(), at.index, HotFlags::TAGGED) };
            // SAFETY: per our caller; no `KEYLESS`: a keyed cache.
            return unsafe { self.free_hit::<0>(obj, true) };
        }
        false
    }

    /// The recorded words past [`Self::free_usual`], inlined into each
    /// edge's function off it ([`Self::free_off_usual`], and
    /// `GlobalAlloc`'s): kmemtrace recording with no rare bit (a keyed
    /// cache, profiled or not) runs the free hook, the same hit and its
    /// event ([`Self::free_event`]) with interrupts off, so that nothing
    /// on this CPU reuses the object before its free is recorded. False
    /// for anything else and for a miss or a suspect key (the tag the
    /// hook uncharged is not found again by [`Self::free_hooked`]).
    ///
    /// # Safety
    /// As for [`Self::free_located`]; if this returns true, `obj` was
    /// freed.
    #[inline(always)]
    pub(crate) unsafe fn free_recorded(&self, obj: NonNull<u8>, at: Located) -> bool {
        let hot = self.hot();
        if hot.intersects(HotFlags::FREE_HOOKED_RARE) || !hot.contains(HotFlags::KMEMTRACE) {
            return false;
        }
        let irq = IrqGuard::<P>::new();
        // Only profiling's hook reads the slab here.
        let slab = if cfg!(feature = "alloc-profiling") {
            // SAFETY: per our caller.
            unsafe { at.slab() }
        } else {
            ptr::null_mut()
        };
        // SAFETY: per our caller; no rare bit, so nothing refuses.
        let _ = unsafe { self.free_hook::<false>(obj, slab, at.index, hot) };
        // SAFETY: per our caller; no `KEYLESS`: a keyed cache.
        if unsafe { self.free_hit::<0>(obj, true) } {
            let _ = self.free_event(obj, Ok(()), HotFlags::KMEMTRACE, Some(irq));
            return true;
        }
        false
    }

    /// [`Self::free_off_hit`] off the usual words' hit: a recorded word's
    /// hit ([`Self::free_recorded`]); with no feature on for this cache,
    /// the miss ([`Self::free_slow`]); anything else (and a recorded
    /// word's miss) [`Self::free_hooked`], which runs every hook in
    /// order.
    /// Out of line, reached by a tail call: the event's work (interrupt
    /// state, a kernel's call-site walk) stays out of `free_off_hit`,
    /// whose profiled hit needs no stack frame. `RECORDED_TRIED`: the
    /// caller tried [`Self::free_recorded`] already (`GlobalAlloc`'s
    /// `dealloc_off_usual`, which takes it with no frame of its own), so
    /// it is not tried twice.
    ///
    /// # Safety
    /// As for [`Self::free_located`].
    #[inline(never)]
    pub(crate) unsafe fn free_off_usual<const RECORDED_TRIED: bool>(
        &self,
        obj: NonNull<u8>,
        at: Located,
    ) -> Result<(), FreeError> {
        // SAFETY: per our caller.
        if !RECORDED_TRIED && unsafe { self.free_recorded(obj, at) } {
            return Ok(());
        }
        if !self.hot().intersects(HotFlags::FREE_SLOW) {
            // SAFETY: per our caller; the hit changed nothing.
            return unsafe { self.free_slow(obj) };
        }
        // SAFETY: per our caller; the hit changed nothing.
        unsafe { self.free_hooked(obj, at.slab(), at.index) }
    }

    /// [`Self::free_off_hit`] for every word and on a miss, and the free
    /// of an object located off the hit (`kfree`'s slow path,
    /// [`Self::free_unlocated`]): the free hook, the hit or the miss, the
    /// kmemtrace event.
    ///
    /// # Safety
    /// `obj` is an object start in `slab`, a live slab of this cache
    /// (null for a bufctl cache off the primary source: the hash
    /// decides), at `index` (small slabs); if it is allocated, the caller
    /// gives it up.
    #[cold]
    #[inline(never)]
    pub(crate) unsafe fn free_hooked(
        &self,
        obj: NonNull<u8>,
        slab: *mut Slab,
        index: usize,
    ) -> Result<(), FreeError> {
        let hot = self.hot();
        // kmemtrace: the free and its event with interrupts off (the
        // guard), but for an object holding the free key: its free's
        // double-free confirmation searches every CPU's magazines, which
        // needs interrupts on (then the free is a double free, refused;
        // or, if the owner wrote the key, a free recorded a moment late).
        let irq = if hot.contains(HotFlags::KMEMTRACE) {
            // SAFETY: per our caller, an object start of ours; keyed
            // objects hold a word.
            let suspect = !hot.contains(HotFlags::KEYLESS)
                && unsafe { double_free::holds_key(obj, double_free::free_key()) };
            (!suspect).then(IrqGuard::<P>::new)
        } else {
            None
        };
        // SAFETY: per our caller.
        let result = unsafe { self.free_hook::<true>(obj, slab, index, hot) }.and_then(|()| {
            // The hit (keyed or not, as the cache is), else the miss
            // (`free_slow`, which refuses every double free the key
            // finds, and that of the object on top of `loaded` or
            // `prev`). Keyless, marked elsewhere (`double_free.rs`): the
            // miss tests and sets the mark.
            // (A debug cache keeps no mark: its state word is checked.)
            let keyless = hot.contains(HotFlags::KEYLESS);
            let marks = keyless && !hot.contains(HotFlags::DEBUG) && self.key_place.marks();
            let hit = !marks
                // SAFETY: per our caller, checked by the hook; keyed as
                // the cache says.
                && unsafe { self.free_hit::<0>(obj, !keyless) };
            if hit {
                return Ok(());
            }
            // SAFETY: as above; the hit changed nothing.
            unsafe { self.free_slow(obj) }
        });
        self.free_event(obj, result, hot, irq)
    }

    /// The free hook, called before a free goes to the magazines (Linux
    /// `slab_free_hook`): the checks that can refuse (each refusal
    /// reported: bootstrap caches, a bufctl object that is not busy, a
    /// debug cache's state word, `debug/object.rs`), a bufctl object's
    /// tag uncharged, the trace record removed (compiled out of the usual
    /// words' path), then the small object's tag uncharged (profiling,
    /// `profiling.rs`; only once every check passed: a refused free
    /// changes nothing).
    ///
    /// # Safety
    /// As for [`Self::free_hooked`].
    ///
    /// `RARE`: `hot` may have a bit of [`HotFlags::FREE_HOOKED_RARE`] and
    /// `slab` may be null (else those tests are compiled out).
    #[inline(always)]
    unsafe fn free_hook<const RARE: bool>(
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
            #[cfg(feature = "debug")]
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

    /// The free's way out (Linux `trace_kmem_cache_free`, Akaros
    /// `kmem_trace_free`): if this cache is recorded, its kmemtrace event
    /// (a free, or a refused one for an error) into this CPU's ring of the
    /// owner's recorder, as [`Self::kmemtrace_alloc`]'s (frees to kmalloc
    /// caches are `kfree`s: the cache's free head says which); then the
    /// interrupt guard `irq` dropped, and `result` handed back. Inlined:
    /// out of line, the compiler would fold a recorded free's constant
    /// `Ok` into the caller, turning its tail call into a call and a stack
    /// frame (+4 instructions a recorded pair: a free's result is two
    /// registers, `FreeError`).
    #[inline(always)]
    fn free_event(
        &self,
        obj: NonNull<u8>,
        result: Result<(), FreeError>,
        hot: HotFlags,
        irq: Option<IrqGuard<P>>,
    ) -> Result<(), FreeError> {
        if hot.contains(HotFlags::KMEMTRACE) {
            const FREE_TO_BAD: u64 =
                head_word(EventKind::Free as u8 ^ EventKind::BadFree as u8, 0, 0, 0);
            let head = if result.is_ok() {
                self.free_event_head
            } else {
                self.free_event_head ^ FREE_TO_BAD
            };
            // SAFETY: our callers saw this cache's `KMEMTRACE` bit in
            // [`Self::hot`] (Acquire).
            let _ = unsafe {
                self.recorder().record_recorded::<P>(EventFields {
                    head,
                    ptr: obj.as_ptr() as usize,
                    bytes_req: 0,
                    bytes_alloc: self.params.obj_size,
                })
            };
        }
        drop(irq);
        result
    }

    /// Report a free this cache refuses, and hand the error back.
    #[cold]
    #[inline(never)]
    pub(crate) fn refuse(&self, error: FreeError) -> FreeError {
        self.owner().report_bad_free(self.name(), error);
        error
    }

    /// The hit, the one copy (SLUB `slab_free`'s `free_to_pcs`, Akaros
    /// `kmem_cache_free`'s magazine push), top to bottom: the hot-flags
    /// test (any bit of `SLOW` set: a feature is on for this cache, so
    /// false); this CPU's per-CPU cache taken by its in-use flag (false
    /// if held: an interrupt handler that interrupted its holder); room
    /// in `loaded` (false if full or absent); the double-free test (false
    /// if `obj` holds the free key (`keyed`) or is on top of `loaded`
    /// (keyless: Linux's naive check)), the key written; `obj` pushed;
    /// the flag given back (the guard's drop). False changes nothing.
    ///
    /// `SLOW` is [`HotFlags::FREE_SLOW`]'s bits from the front doors
    /// (`free_located`, `GlobalAlloc::dealloc`), 0 from the hooked paths,
    /// which tested the flags already. With restartable hits
    /// ([`crate::restart`]) a keyed push is that file's sequence instead.
    ///
    /// # Safety
    /// `obj` is a constructed, busy object of this cache that the caller
    /// gives up if this returns true; `keyed` only if the cache is keyed
    /// (with `SLOW` non-zero, a cache without slow flags is keyed).
    #[inline(always)]
    pub(crate) unsafe fn free_hit<const SLOW: u32>(&self, obj: NonNull<u8>, keyed: bool) -> bool {
        if SLOW != 0 && crate::sync::flags_any::<SLOW>(&self.hot_flags) {
            return false;
        }
        let offset = P::cpu_offset();
        if keyed && crate::restart::enabled::<P>() {
            // SAFETY: this CPU's per-CPU cache, PCPU_OFFSET bytes after
            // the cache; the platform's hits are restartable; per our
            // caller, obj is a busy object of this keyed cache, given up
            // if pushed.
            return unsafe {
                crate::restart::push::<Self>((self as *const Self).cast(), offset, obj)
            };
        }
        // Only caches with a magazine layer get here (the bootstrap ones
        // are refused on their `BOOTSTRAP` paths first).
        debug_assert!(self.has_magazines() && P::cpu_id() <= self.last_cpu);
        // This CPU's per-CPU cache: the array lies PCPU_OFFSET bytes
        // after the cache (`pcpu_array`), this CPU's line `offset` into it.
        let array: *const PcpuCache = core::ptr::with_exposed_provenance(
            (self as *const Self).addr().wrapping_add(Self::PCPU_OFFSET),
        );
        // SAFETY: the array has nr_cpus lines of CPU_SLOT_BYTES, alive as
        // long as the cache; cpu_offset() is cpu_id() * CPU_SLOT_BYTES
        // with cpu_id() < nr_cpus (the Platform contract): this CPU's.
        let line = unsafe { &*array.byte_add(offset) };
        // SAFETY: this CPU's line; its flag is at array + offset +
        // IN_USE_AT, and `inner` is reached only under it.
        let Some(mut pcpu) = (unsafe {
            LocalLocked::<P, _>::try_lock::<{ PcpuCache::IN_USE_AT }>(
                array.cast(),
                offset,
                &line.in_use,
                &line.inner,
            )
        }) else {
            return false;
        };
        let pcc = pcpu.get();
        // `loaded`'s top and end, kept in the per-CPU cache: equal for a
        // full or absent magazine, never room.
        let top = pcc.top;
        if top >= pcc.limit {
            return false;
        }
        crate::sync::interrupt_point::<P>();
        if keyed {
            // The free key ([`super::double_free`]): an object holding it
            // was freed already (the miss confirms and refuses); else it
            // gets it. Load, compare, store.
            let key = pcc.free_key;
            #[expect(
                clippy::cast_ptr_alignment,
                reason = "objects start 8-aligned: every alignment is at least 8"
            )]
            let word = obj.as_ptr().cast::<usize>();
            // The low byte first, then the word (why: `double_free::holds_key`,
            // a store-forwarding stall avoided).
            // SAFETY: per our caller, an object of this keyed cache: at
            // least 8 bytes of its stride, 8-aligned, ours to read.
            if unsafe { obj.as_ptr().read() == key as u8 && word.read() == key } {
                return false;
            }
            // SAFETY: as above; the caller gives it up (pushed below).
            unsafe { word.write(key) };
        } else {
            // Linux's naive double-free check: the object already on top
            // of `loaded` (the miss path refuses it). With no rounds the
            // word below `top` is the header's null `next`: no object.
            // SAFETY: a real magazine (room above), `top` at or above its
            // slot 0: the word below is in its object.
            if unsafe { *top.sub(1) } == obj.as_ptr() {
                return false;
            }
        }
        // SAFETY: a real magazine owned by this CPU under its flag; `top`
        // below `limit`, a slot of its object.
        unsafe { *top = obj.as_ptr() };
        // SAFETY: at most `limit`, the end of its slots.
        pcc.top = unsafe { top.add(1) };
        true
    }

    /// The one slow function of the free: `loaded` is full (or absent, or
    /// the object looked freed already): confirm or refuse a double free,
    /// then swap, trade with the depot, make a new magazine, or free to
    /// the slab layer.
    ///
    /// # Safety
    /// `obj` is a constructed, busy object of this cache that the caller
    /// gives up (validated by the caller).
    #[cold]
    #[inline(never)]
    pub(crate) unsafe fn free_slow(&self, obj: NonNull<u8>) -> Result<(), FreeError> {
        // SAFETY: per our caller, obj is an object start of a live slab of
        // ours.
        if unsafe { self.is_double_free(obj) } {
            return Err(self.refuse(FreeError::DoubleFree {
                addr: obj.as_ptr() as usize,
            }));
        }
        // SAFETY: per our caller, given up.
        unsafe { self.mark_key(obj, true) };
        if self.magazine_free_miss(obj) {
            return Ok(());
        }
        // An interrupt handler that interrupted a magazine hit on this CPU
        // finds the per-CPU cache held: no magazine it made could be used
        // (the miss leaves the magazines alone), so straight to the slab
        // layer (the checks above kept).
        let retries = if self.pcpu_busy() {
            0
        } else {
            MAG_FREE_RETRIES
        };
        for _ in 0..retries {
            // No room and no empty magazine in the depot: make one. No
            // lock is held and interrupts are on, so allocating from a
            // magazine cache cannot deadlock.
            match self.new_magazine() {
                // SAFETY: a fresh empty magazine, owned by nobody yet.
                // The depot lock with interrupts off: an interrupt
                // handler's free on this CPU may need it.
                Ok(mag) => unsafe {
                    let _irq = IrqGuard::<P>::new();
                    self.depot.lock().push_empty(mag);
                },
                Err(_) => break,
            }
            if self.magazine_free_miss(obj) {
                return Ok(());
            }
        }
        self.nr_frees_direct
            .fetch_add(1, core::sync::atomic::Ordering::Relaxed);
        // SAFETY: per our caller, obj is a constructed busy object of ours.
        unsafe { self.slab_free_objects(&[obj.as_ptr()]) };
        Ok(())
    }

    /// Whether this CPU's per-CPU cache is held by the code this runs
    /// under: an interrupt handler (or a cross-CPU call) that interrupted
    /// a magazine hit.
    fn pcpu_busy(&self) -> bool {
        let irq = IrqGuard::<P>::new();
        self.pcpu_lock_here(&irq).is_none()
    }

    /// [`KmemCache::free`] of a pointer the page map does not vouch for:
    /// a KFENCE sample, a cache on another page source, or a bad pointer
    /// (refused and reported). Every flag's free, plain ones included.
    ///
    /// # Safety
    /// As for [`KmemCache::free`].
    #[cold]
    #[inline(never)]
    pub(super) unsafe fn free_unlocated(&self, obj: NonNull<u8>) -> Result<(), FreeError> {
        let addr = obj.as_ptr() as usize;
        // KFENCE: a sampled object is in no slab page (and off the
        // primary source a bufctl cache's hash would not know it).
        #[cfg(feature = "kfence")]
        if let Some(result) = self.owner().kfence_free(addr, Some(self)) {
            return self.free_event(obj, result, self.hot(), None);
        }
        let slab = match self.locate(addr) {
            Ok(slab) => slab,
            Err(error) => {
                // kmemtrace: kmem_cache_free of a pointer not ours.
                let error = self.refuse(error);
                return self.free_event(obj, Err(error), self.hot(), None);
            }
        };
        // Off the primary source (the fast path locates every other
        // pointer it accepts): a small slab by its header, or null for a
        // bufctl cache, where the hash decides.
        let index = if slab.is_null() {
            0
        } else {
            // SAFETY: `locate` checked the slab is ours and addr an
            // object start in it.
            unsafe { self.object_index(slab, addr) }.unwrap_or(0)
        };
        // SAFETY: per our caller; `locate` checked the slab is ours (or
        // left it to the hash) and addr an object start.
        unsafe { self.free_hooked(obj, slab, index) }
    }

    /// Whether `obj`, an object of ours, is back in its slab (small slabs:
    /// on the free list; bufctl slabs: not in the hash): a double free.
    /// Checked on the free miss only: on the hit it would cost 7
    /// instructions per alloc+free pair (measured: 56 → 63 on `cache-pair`).
    ///
    /// # Safety
    /// `obj` is an object start of a live slab of this cache.
    pub(super) unsafe fn is_free_in_slab(&self, obj: NonNull<u8>) -> bool {
        let addr = obj.as_ptr() as usize;
        if self.kind != SlabKind::Small {
            // Bufctl slabs: a busy object has its bufctl in the hash (one
            // locked lookup, on the miss only).
            // The slab layer's lock with interrupts off, as every lock an
            // interrupt handler's alloc or free can reach must be taken.
            let _irq = IrqGuard::<P>::new();
            return self.slab.lock().hash.find(addr).is_null();
        }
        let slab = self.small_slab_of(addr);
        // SAFETY: per our caller, a live small slab of ours.
        let (index, _) = self.obj_index(addr - unsafe { (*slab).base });
        // SAFETY: as above.
        crate::layout::freelist::map_test(unsafe { &(*slab).free_map }, index)
    }
}

impl<P: Platform> KmemCache<P> {
    /// Find and check the slab of a pointer freed to this cache. Returns
    /// null for bufctl caches off the primary source (the hash decides).
    ///
    /// On the primary source: one page-map load, a tag test, one compare
    /// of the slab's owner, then [`Self::check_object`].
    #[inline]
    pub(crate) fn locate(&self, addr: usize) -> Result<*mut Slab, FreeError> {
        if !self.on_primary {
            return self.locate_off_primary(addr);
        }
        let entry = self.params.page_map.get(addr);
        let ours = entry.slab().map(|slab| slab as *mut Slab).filter(|&slab| {
            // SAFETY: a slab entry names a registered slab, alive (entries
            // are cleared before a slab is destroyed).
            let owner = unsafe { (*slab).cache };
            owner == (self as *const Self).cast()
        });
        let Some(slab) = ours else {
            return Err(self.locate_error(addr, entry));
        };
        // SAFETY: a live slab of ours (above).
        unsafe { self.check_object(slab, addr) }?;
        Ok(slab)
    }

    /// Why `addr` (page-map entry `entry`) is not one of our slabs' pages
    /// (the owner of a pointer of another cache goes in the error report:
    /// `allocator/cache_owner.rs`).
    #[cold]
    #[inline(never)]
    pub(super) fn locate_error(&self, addr: usize, entry: PageEntry) -> FreeError {
        if !entry.is_live() {
            return FreeError::NotAllocated { addr };
        }
        FreeError::WrongCache { addr }
    }

    /// [`Self::locate`] for a cache on another page source: small slabs
    /// by header magic and owner, bufctl slabs by the hash (null here).
    #[inline(never)]
    pub(super) fn locate_off_primary(&self, addr: usize) -> Result<*mut Slab, FreeError> {
        if self.kind != SlabKind::Small {
            return Ok(ptr::null_mut());
        }
        let (start, end) = self.params.source.span();
        if addr < start || addr >= end {
            return Err(FreeError::NotAllocated { addr });
        }
        let slab = small_header(addr);
        // SAFETY: the page lies in our source's span, which the source
        // promises is memory it manages (readable); a page that is not
        // one of our slabs fails the magic/owner test.
        let ours =
            unsafe { (*slab).magic == SLAB_MAGIC && (*slab).cache == (self as *const Self).cast() };
        if !ours {
            return Err(FreeError::NotAllocated { addr });
        }
        // SAFETY: a live slab of ours (above).
        unsafe { self.check_object(slab, addr) }?;
        Ok(slab)
    }

    /// Check that `addr`, inside one of `slab`'s pages, is an object start
    /// (`Misaligned` otherwise): one multiply (`obj_index`) and two
    /// compares. (`addr >= base` holds: the page map, or the small slab's
    /// header, put `addr` in the slab; so the offset is below the slab
    /// size, below 2^32.)
    ///
    /// # Safety
    /// `slab` is a live slab of this cache and `addr` lies in its pages.
    #[inline(always)]
    pub(crate) unsafe fn check_object(
        &self,
        slab: *mut Slab,
        addr: usize,
    ) -> Result<(), FreeError> {
        // SAFETY: per our caller.
        if unsafe { self.object_index(slab, addr) }.is_some() {
            Ok(())
        } else {
            Err(misaligned(addr))
        }
    }

    /// The index of the object starting at `addr` in `slab`, or `None`
    /// if `addr` is not an object start: one multiply (`obj_index`) and
    /// two compares.
    ///
    /// # Safety
    /// As for [`Self::check_object`].
    #[inline(always)]
    pub(crate) unsafe fn object_index(&self, slab: *mut Slab, addr: usize) -> Option<usize> {
        // SAFETY: per the caller; base never changes.
        self.index_from(unsafe { (*slab).base }, addr)
    }

    /// [`Self::object_index`] with the slab's first object `base` given
    /// (from the page-map slot on the free hit). `addr` lies in the slab's
    /// pages.
    #[inline(always)]
    pub(crate) fn index_from(&self, base: usize, addr: usize) -> Option<usize> {
        self.index_with(self.stride_magic, base, addr)
    }

    /// [`Self::index_from`] with the stride magic given: the page-map
    /// slot's (the cache's own for a slab page, 0 for any other page,
    /// where nothing is an object start).
    #[inline(always)]
    pub(crate) fn index_with(&self, magic: u64, base: usize, addr: usize) -> Option<usize> {
        let (index, exact) = obj_index_with(magic, addr.wrapping_sub(base));
        if exact && index < self.params.nr_objs_per_slab {
            Some(index)
        } else {
            None
        }
    }

    /// Index of the object at `offset` bytes into a slab, and whether
    /// `offset` is an object start: one 64×64→128 multiply (see
    /// `stride_magic`). `offset` must be below 2^32 (every slab is).
    #[inline(always)]
    pub(crate) fn obj_index(&self, offset: usize) -> (usize, bool) {
        obj_index_with(self.stride_magic, offset)
    }

    /// The header of the small slab holding `addr` (an object of this
    /// cache in a live slab): [`SlabParams::small_slab_of`](crate::slab::SlabParams::small_slab_of).
    #[inline]
    pub(crate) fn small_slab_of(&self, addr: usize) -> *mut Slab {
        self.params.small_slab_of(addr)
    }
}

/// [`KmemCache::obj_index`] by a given stride magic
/// ([`stride_magic`](crate::layout::pagemap::stride_magic)); with magic
/// 0, no offset is an object start.
#[inline(always)]
pub(crate) fn obj_index_with(magic: u64, offset: usize) -> (usize, bool) {
    debug_assert!(magic == 0 || offset < 1 << 32);
    let product = (offset as u64 as u128) * (magic as u128);
    ((product >> 64) as usize, (product as u64) < magic)
}

/// The `Misaligned` error, built out of line.
#[cold]
#[inline(never)]
pub(super) fn misaligned(addr: usize) -> FreeError {
    FreeError::Misaligned { addr }
}

/// The round on top of a magazine holding `nr_rounds` rounds, as an
/// address. For an empty magazine held by a per-CPU cache this is the
/// header word before slot 0, its null `next` (asserted in
/// magazine/mod.rs), so never an object, and no branch for the case.
///
/// # Safety
/// `mag` is a live magazine (not the absent one) holding `nr_rounds ≤
/// capacity` rounds, owned by the caller.
#[inline(always)]
pub(super) unsafe fn top_round(mag: *mut Magazine, nr_rounds: usize) -> usize {
    // SAFETY: slot nr_rounds - 1, or for nr_rounds == 0 the header word
    // right before slot 0: inside the magazine's object either way.
    unsafe {
        Magazine::slots(mag)
            .cast::<usize>()
            .wrapping_add(nr_rounds)
            .wrapping_sub(1)
            .read()
    }
}
