//! The one allocation, top to bottom (Akaros `kmem_cache_alloc`, SLUB
//! `slab_alloc_node`): [`KmemCache::alloc`], `zalloc`, `alloc_tagged`,
//! kmalloc's size classes and `GlobalAlloc::alloc` all come through
//! [`KmemCache::alloc_at`]:
//!
//! 1. the hit ([`KmemCache::alloc_hit`], the one copy): one test of the
//!    hot flags (`HotFlags::ALLOC_SLOW`: no feature on for this cache),
//!    then this CPU's in-use flag taken and a round popped from its
//!    `loaded`, written out there;
//! 2. else [`KmemCache::alloc_off_hit`], out of line: the usual words
//!    ([`KmemCache::alloc_usual`], inlined there): one load of the hot
//!    flags, and for profiling on a keyed small-object cache the same
//!    hit and the post-alloc hook (`cache/hooks.rs`) right there, no
//!    stack frame (profiling's commonest word, `PROFILED_USUAL`, told by
//!    one compare and its hook's tests folded away);
//! 3. else a tail call of [`KmemCache::alloc_off_usual`]: for kmemtrace
//!    recording on a keyed small-object cache (profiled or not) the same
//!    hit, the post-alloc hook and its event right there
//!    ([`KmemCache::alloc_usual_recorded`]; out of `alloc_off_hit`, so
//!    that the event's work (interrupt state, a kernel's call-site walk)
//!    costs the profiled hit no stack frame); else
//!    [`KmemCache::alloc_hooked_cold`]: no feature on, the one slow
//!    function for the miss ([`KmemCache::alloc_slow`]: `prev`, the
//!    depot, the slab layer); anything else the feature hooks in order
//!    around the same hit and miss: an unborn class, the pre-alloc hook
//!    (bootstrap refusal, KFENCE sample), the post-alloc hook (free key,
//!    debug, profiling, trace table), the kmemtrace event.
//!
//! `GlobalAlloc::alloc` calls the hit and, past it, out-of-line
//! functions of its own that inline `alloc_usual` and
//! `alloc_usual_recorded` too (the object handed back as a pointer) and
//! call `alloc_hooked_cold` otherwise, turning an error into null: every
//! way out of its hit is then a tail call.
//!
//! Every path returns `Result<NonNull<u8>, AllocError>`; only the
//! `GlobalAlloc` edge (`allocator/global_alloc.rs`) turns an error into
//! a null pointer.

use core::ptr::NonNull;
use core::sync::atomic::Ordering;

use super::{HotFlags, KmemCache, double_free};
use crate::alloc_tag::AllocTagRef;
use crate::error::AllocError;
use crate::magazine::PcpuCache;
use crate::platform::Platform;
use crate::sync::LocalLocked;

impl<P: Platform> KmemCache<P> {
    /// Allocate one constructed object of `obj_size()` bytes, aligned to
    /// `align()`.
    ///
    /// With feature `alloc-profiling`, the object is charged to the tag
    /// [`AllocTagHooks::current`](crate::AllocTagHooks::current) names (nothing if it says `None`), which
    /// is asked only while profiling is switched on in the allocator
    /// ([`crate::AllocProfiling::set_enabled`]).
    ///
    /// # Errors
    /// [`AllocError::OutOfMemory`] if neither the magazines, the slabs nor
    /// the page source have an object; [`AllocError::ConstructorFailed`] if
    /// the constructor refused (the object went back to its slab);
    /// [`AllocError::InvalidLayout`] for a bootstrap cache.
    #[inline]
    pub fn alloc(&self) -> Result<NonNull<u8>, AllocError> {
        // SAFETY: a reference: a live cache.
        unsafe { Self::alloc_at(self, crate::alloc_tag::current::<P>, 0) }
    }

    /// [`KmemCache::alloc`] with the object's `obj_size()` bytes zeroed
    /// (Linux `kmem_cache_zalloc`; the constructor's work, if any, is
    /// overwritten).
    ///
    /// # Errors
    /// As for [`KmemCache::alloc`].
    pub fn zalloc(&self) -> Result<NonNull<u8>, AllocError> {
        let obj = self.alloc()?;
        // SAFETY: a fresh object of obj_size bytes, ours.
        unsafe { core::ptr::write_bytes(obj.as_ptr(), 0, self.params.obj_size) };
        Ok(obj)
    }

    /// [`KmemCache::alloc`] charging the object to the allocation tag
    /// `tag` (an [`AllocTagRef`](crate::AllocTagRef); `None` charges nothing),
    /// for call sites that name their own tag (`kmem_cache_alloc!`). The
    /// object remembers the tag, so whoever frees it, on whatever CPU,
    /// uncharges the same tag. Without feature `alloc-profiling` the tag
    /// is ignored, and so it is while profiling is switched off in the
    /// allocator.
    ///
    /// # Errors
    /// As for [`KmemCache::alloc`].
    #[inline]
    pub fn alloc_tagged(&self, tag: Option<crate::AllocTagRef>) -> Result<NonNull<u8>, AllocError> {
        // SAFETY: a reference: a live cache.
        unsafe { Self::alloc_at(self, move || crate::alloc_tag::explicit::<P>(tag), 0) }
    }

    /// The allocation: [`Self::alloc_hit`], else [`Self::alloc_off_hit`],
    /// charging the tag `tag()` names (asked only with profiling on).
    /// `bytes_req` is what a kmalloc caller asked for (0: a
    /// `kmem_cache_alloc`), for the debug redzone and kmemtrace.
    ///
    /// # Safety
    /// `this` is a live cache, or the [`unready`] entry.
    #[inline(always)]
    pub(crate) unsafe fn alloc_at(
        this: *const Self,
        tag: impl Fn() -> Option<AllocTagRef>,
        bytes_req: usize,
    ) -> Result<NonNull<u8>, AllocError> {
        // SAFETY: per our caller.
        if let Some(obj) = unsafe { Self::alloc_hit::<{ HotFlags::ALLOC_SLOW.bits() }, true>(this) }
        {
            return Ok(obj);
        }
        // SAFETY: per our caller.
        unsafe { Self::alloc_off_hit(this, tag, bytes_req) }
    }

    /// The allocation past a failed [`Self::alloc_hit`] (`KmemCache::alloc`,
    /// kmalloc), out of line and reached by a tail call (the plain hit
    /// stays a leaf): the usual words' hit ([`Self::alloc_usual`]), else
    /// [`Self::alloc_off_usual`].
    ///
    /// # Safety
    /// As for [`Self::alloc_at`].
    #[inline(never)]
    pub(crate) unsafe fn alloc_off_hit(
        this: *const Self,
        tag: impl Fn() -> Option<AllocTagRef>,
        bytes_req: usize,
    ) -> Result<NonNull<u8>, AllocError> {
        // SAFETY: per our caller.
        if let Some(obj) = unsafe { Self::alloc_usual(this, &tag, bytes_req) } {
            return Ok(obj);
        }
        // SAFETY: per our caller; nothing changed.
        unsafe { Self::alloc_off_usual(this, tag, bytes_req) }
    }

    /// [`Self::alloc_off_hit`] off the usual words' hit: the recorded
    /// words' hit ([`Self::alloc_usual_recorded`]), else
    /// [`Self::alloc_hooked_cold`]. Out of line, reached by a tail call:
    /// the kmemtrace event's work (interrupt state, a kernel's call-site
    /// walk) stays out of `alloc_off_hit`, whose profiled hit needs no
    /// stack frame.
    ///
    /// # Safety
    /// As for [`Self::alloc_at`].
    #[inline(never)]
    unsafe fn alloc_off_usual(
        this: *const Self,
        tag: impl Fn() -> Option<AllocTagRef>,
        bytes_req: usize,
    ) -> Result<NonNull<u8>, AllocError> {
        // SAFETY: per our caller.
        if let Some(obj) = unsafe { Self::alloc_usual_recorded(this, &tag, bytes_req) } {
            return Ok(obj);
        }
        // SAFETY: per our caller; nothing changed.
        unsafe { Self::alloc_hooked_cold(this, tag_ref(&tag), bytes_req) }
    }

    /// The usual words past a failed [`Self::alloc_hit`], inlined into
    /// each edge's out-of-line function ([`Self::alloc_off_hit`], and
    /// `GlobalAlloc`'s, which hands the object back as a pointer): one
    /// load of the hot flags; a profiled word without recording (on a
    /// keyed small-object cache: no bit of
    /// [`HotFlags::ALLOC_HOOKED_RARE`]; the commonest,
    /// [`HotFlags::PROFILED_USUAL`], told by one compare, its hook's
    /// tests folded away) takes the same magazine hit and the post-alloc
    /// hook right here, no stack frame. `None` (nothing changed) for
    /// anything else; the caller then calls its function off the usual
    /// words' hit ([`Self::alloc_off_usual`]), which tries
    /// [`Self::alloc_usual_recorded`] (recording).
    ///
    /// # Safety
    /// As for [`Self::alloc_at`].
    #[inline(always)]
    pub(crate) unsafe fn alloc_usual(
        this: *const Self,
        tag: &impl Fn() -> Option<AllocTagRef>,
        bytes_req: usize,
    ) -> Option<NonNull<u8>> {
        // SAFETY: per our caller, a hot-flags word first.
        let word = unsafe { &(*this).hot_flags };
        if crate::sync::flags_eq::<{ HotFlags::PROFILED_USUAL.bits() }>(word) {
            // The word known: the hook's tests fold away.
            // SAFETY: per our caller; a usual word.
            return unsafe {
                Self::alloc_hit_hooked(this, HotFlags::PROFILED_USUAL, tag, bytes_req)
            };
        }
        let hot = HotFlags::from_bits_retain(word.load(Ordering::Relaxed));
        // Recorded words are [`Self::alloc_usual_recorded`]'s.
        if hot.intersects(HotFlags::ALLOC_HOOKED_RARE.union(HotFlags::KMEMTRACE))
            || !hot.intersects(HotFlags::ALLOC_SLOW)
        {
            return None;
        }
        // The other profiled words (tags off the slab's page), laid out
        // after the usual one (whose path then ends in its own `ret`, not
        // in a jump to a tail the two share).
        core::hint::cold_path();
        // SAFETY: per our caller; a usual word.
        unsafe { Self::alloc_hit_hooked(this, hot, tag, bytes_req) }
    }

    /// The recorded usual words, past [`Self::alloc_usual`], inlined into
    /// each edge's function off it ([`Self::alloc_off_usual`], and
    /// `GlobalAlloc`'s): one load of the hot flags; kmemtrace recording
    /// (profiled or not) on a keyed small-object cache (no bit of
    /// [`HotFlags::ALLOC_HOOKED_RARE`]) takes the same magazine hit and
    /// the post-alloc hook right here, the event inline. `None` (nothing
    /// changed) for anything else (no feature on: the miss; a rare
    /// feature; an unborn class; the unready entry) and a hooked miss;
    /// the caller then calls [`Self::alloc_hooked_cold`].
    ///
    /// # Safety
    /// As for [`Self::alloc_at`].
    #[inline(always)]
    pub(crate) unsafe fn alloc_usual_recorded(
        this: *const Self,
        tag: &impl Fn() -> Option<AllocTagRef>,
        bytes_req: usize,
    ) -> Option<NonNull<u8>> {
        // SAFETY: per our caller, a hot-flags word first. Acquire, as
        // `KmemCache::hot`: the kmemtrace event needs it.
        let hot = HotFlags::from_bits_retain(unsafe { &(*this).hot_flags }.load(Ordering::Acquire));
        if hot.intersects(HotFlags::ALLOC_HOOKED_RARE) || !hot.contains(HotFlags::KMEMTRACE) {
            return None;
        }
        // SAFETY: per our caller; a usual word (the bit known: the
        // event's test folds away).
        unsafe { Self::alloc_hit_hooked(this, hot, tag, bytes_req) }
    }

    /// [`Self::alloc_usual`]'s hit and post-alloc hook for the word
    /// `hot`.
    ///
    /// # Safety
    /// As for [`Self::alloc_at`]; `hot` is a usual word (so not the
    /// unready entry's, which has `UNBORN`: a keyed cache with
    /// magazines, no `KEYLESS`).
    #[inline(always)]
    unsafe fn alloc_hit_hooked(
        this: *const Self,
        hot: HotFlags,
        tag: &impl Fn() -> Option<AllocTagRef>,
        bytes_req: usize,
    ) -> Option<NonNull<u8>> {
        // SAFETY: per our caller.
        let obj = unsafe { Self::alloc_hit::<0, true>(this) }?;
        // SAFETY: as above.
        Some(unsafe { &*this }.post_alloc_hook::<false>(obj, hot, tag, bytes_req))
    }

    /// [`Self::alloc_off_hit`] off the usual words' hit: with no feature
    /// on for this cache, the miss ([`Self::alloc_slow`]); else, for
    /// every word and on a miss, the pre-alloc hook, the hit or the
    /// miss, the post-alloc hooks (or, for an allocation the pre-alloc
    /// hook served or that failed, only the kmemtrace event).
    ///
    /// # Safety
    /// As for [`Self::alloc_at`].
    #[cold]
    #[inline(never)]
    pub(crate) unsafe fn alloc_hooked_cold(
        this: *const Self,
        tag: &dyn Fn() -> Option<AllocTagRef>,
        bytes_req: usize,
    ) -> Result<NonNull<u8>, AllocError> {
        // SAFETY: per our caller, a hot-flags word first. Acquire, as
        // `KmemCache::hot`: the kmemtrace hook needs it.
        let hot = HotFlags::from_bits_retain(unsafe { &(*this).hot_flags }.load(Ordering::Acquire));
        if !hot.intersects(HotFlags::ALLOC_SLOW) {
            // SAFETY: no slow flag, so not the unready entry: a live cache.
            return unsafe { &*this }.alloc_slow::<true>();
        }
        if hot.contains(HotFlags::UNBORN) {
            // No cache behind it yet: the unready entry (before `init`)
            // or an unborn size class's stub (its first allocation
            // creates the class and allocates from it:
            // `allocator/classes.rs`).
            if is_unready(this) {
                return Err(AllocError::NotInitialized);
            }
            // SAFETY: per our caller, not the unready entry: a live stub.
            let stub = unsafe { &*this };
            let class = stub.owner().unborn_class(stub, bytes_req)?;
            // SAFETY: a reference: a live cache.
            return unsafe { Self::alloc_at(class, tag, bytes_req) };
        }
        // SAFETY: not the unready entry (its word has `UNBORN`): a cache.
        let this = unsafe { &*this };
        let served = if hot.intersects(HotFlags::PRE_ALLOC) {
            this.pre_alloc_hook(hot, tag, bytes_req)
        } else {
            None
        };
        let result = match served {
            // Served by the pre-alloc hook (a KFENCE sample): only the
            // kmemtrace event.
            Some(Ok(obj)) => return Ok(this.alloc_event(obj, hot, bytes_req)),
            Some(Err(error)) => Err(error),
            None => {
                let hit = if hot.contains(HotFlags::DEBUG) {
                    // SAFETY: as below. A debug cache keeps no mark: the
                    // debug hook checks the round's state word.
                    unsafe { Self::alloc_hit::<0, false>(this) }
                } else if hot.contains(HotFlags::KEYLESS) {
                    // SAFETY: a live cache with magazines (the hooked path
                    // of a born cache); just popped, not handed out.
                    unsafe { Self::alloc_hit::<0, false>(this) }
                        .and_then(|obj| unsafe { this.take_round_hooked(obj) })
                } else {
                    // SAFETY: as above.
                    unsafe { Self::alloc_hit::<0, true>(this) }
                };
                hit.map_or_else(|| this.alloc_slow::<false>(), Ok)
            }
        };
        match result {
            Ok(obj) => Ok(this.post_alloc_hook::<true>(obj, hot, &tag, bytes_req)),
            Err(error) => {
                // The failed allocation's kmemtrace event.
                if hot.contains(HotFlags::KMEMTRACE) {
                    let _ = this.kmemtrace_alloc::<false>(core::ptr::null_mut(), bytes_req);
                }
                Err(error)
            }
        }
    }

    /// The hit, the one copy (SLUB `slab_alloc_node`'s fast path, Akaros
    /// `kmem_cache_alloc`'s magazine pop), top to bottom: the hot-flags
    /// test (any bit of `SLOW` set: a feature is on for this cache, so
    /// `None`); this CPU's per-CPU cache taken by its in-use flag (`None`
    /// if held: an interrupt handler that interrupted its holder, which
    /// takes the slow path and leaves the magazines alone); the round on
    /// top of `loaded` popped (`None` if `loaded` is empty or absent), its
    /// free key taken (`KEYED`); the pop counted; the flag given back
    /// (the guard's drop). `None` changes nothing but a keyless round's
    /// key (below).
    ///
    /// `SLOW` is [`HotFlags::ALLOC_SLOW`]'s bits from the front doors
    /// (`KmemCache::alloc`, `alloc_at`, `GlobalAlloc::alloc`), and 0 from
    /// the hooked paths, which tested the flags already. `this` may be
    /// the [`unready`] entry (the kmalloc by-8 table's before `init`)
    /// only with `SLOW` non-zero: its hot-flags word has every bit set,
    /// so the flag test fails and nothing else is read; so the table
    /// needs no readiness or null test. With restartable hits
    /// ([`crate::restart`], a kernel's option) the pop is that file's
    /// sequence instead, and no flag is taken.
    ///
    /// # Safety
    /// As for [`Self::alloc_at`]; with `SLOW` 0, `this` is a live cache
    /// with magazines (not a bootstrap cache, not the unready entry).
    #[inline(always)]
    pub(crate) unsafe fn alloc_hit<const SLOW: u32, const KEYED: bool>(
        this: *const Self,
    ) -> Option<NonNull<u8>> {
        // SAFETY: per our caller, `this` points at a hot-flags word (a
        // cache's first field, or the unready entry's only one).
        if SLOW != 0 && crate::sync::flags_any::<SLOW>(unsafe { &(*this).hot_flags }) {
            return None;
        }
        let offset = P::cpu_offset();
        if crate::restart::enabled::<P>() {
            // SAFETY: no slow flag, so a live cache: this CPU's per-CPU
            // cache, PCPU_OFFSET bytes after the cache; the platform's
            // hits are restartable; KEYED as our caller says.
            return unsafe { crate::restart::pop::<Self, KEYED>(this.cast(), offset) };
        }
        // SAFETY: no slow flag (or our caller's word): a live cache.
        let cache = unsafe { &*this };
        debug_assert!(cache.has_magazines() && P::cpu_id() <= cache.last_cpu);
        // This CPU's per-CPU cache: the array lies PCPU_OFFSET bytes
        // after the cache (`pcpu_array`), this CPU's line `offset` into it.
        let array: *const PcpuCache =
            core::ptr::with_exposed_provenance(this.addr().wrapping_add(Self::PCPU_OFFSET));
        // SAFETY: the array has nr_cpus lines of CPU_SLOT_BYTES, alive as
        // long as the cache; cpu_offset() is cpu_id() * CPU_SLOT_BYTES
        // with cpu_id() < nr_cpus (the Platform contract): this CPU's.
        let line = unsafe { &*array.byte_add(offset) };
        // SAFETY: this CPU's line; its flag is at array + offset +
        // IN_USE_AT, and `inner` is reached only under it.
        let mut pcpu = unsafe {
            LocalLocked::<P, _>::try_lock::<{ PcpuCache::IN_USE_AT }>(
                array.cast(),
                offset,
                &line.in_use,
                &line.inner,
            )
        }?;
        let pcc = pcpu.get();
        // The word below `loaded`'s top (kept in the per-CPU cache): the
        // top round, or null for an empty or absent magazine (the
        // header's `next`: see `PcpuInner::top`).
        let top = pcc.top;
        // SAFETY: `top` is at or above slot 0 of `loaded` (or of the
        // absent magazine), owned by this CPU under its flag: the word
        // below it is in the magazine's object.
        let obj = NonNull::new(unsafe { *top.sub(1) })?;
        if KEYED {
            // The round's free key taken ([`double_free`]): every object
            // entering a magazine holds it (every free writes it) and
            // every object leaving one for a caller has it cleared (glibc
            // `e->key = 0`), so a round without it is a use after free's
            // write or the second copy of a double free: left where it
            // is (its word less the key: still not the key) for the miss,
            // which pops it again, reports it and keeps it from every
            // caller (`round_intact`). The word less the key, stored with
            // no undo, so that the compiler folds load, subtract and
            // store into one `sub` to memory whose flags the branch
            // tests: +2 instructions a pair over storing 0.
            #[expect(
                clippy::cast_ptr_alignment,
                reason = "objects start 8-aligned: every alignment is at least 8"
            )]
            let word = obj.as_ptr().cast::<usize>();
            // SAFETY: a round of this keyed cache's magazine, held under
            // the flag: its first word is ours to read and write.
            let left = unsafe { word.read() }.wrapping_sub(pcc.free_key);
            // SAFETY: as above.
            unsafe { word.write(left) };
            if left != 0 {
                return None;
            }
        }
        crate::sync::interrupt_point::<P>();
        pcc.nr_allocs += 1;
        // SAFETY: a round was below `top`, so slot 0 is at or below it.
        pcc.top = unsafe { top.sub(1) };
        Some(obj)
    }

    /// The one slow function of the allocation: the magazine miss
    /// (`prev`, the depot), then the slab layer (constructed; a batch
    /// that also refills `loaded`: `KmemCache::slab_refill`). Not
    /// marked, not traced. `KEYED` (the plain allocation of a keyed
    /// cache): the free key cleared; else the caller's post-alloc hook
    /// clears it or the mark.
    #[cold]
    #[inline(never)]
    pub(crate) fn alloc_slow<const KEYED: bool>(&self) -> Result<NonNull<u8>, AllocError> {
        // KFENCE: the sample interval is checked on the miss.
        self.owner().kfence_tick();
        let obj = match self.magazine_alloc_miss() {
            Some(obj) => obj,
            None => self.slab_refill()?,
        };
        if KEYED {
            // SAFETY: just taken; a keyed cache.
            unsafe { double_free::clear_key(obj) };
        }
        Ok(obj)
    }
}

/// The kmalloc by-8 table's entry before `init` (`Kmem::new` fills
/// the table with it, [`unready`]): a hot-flags word with every bit set,
/// so an allocation through it leaves the hit at its one flag test and
/// [`KmemCache::alloc_hooked_cold`] refuses it by its address. Not a cache:
/// read only as that word.
#[repr(C, align(64))]
pub(crate) struct Unready {
    hot_flags: core::sync::atomic::AtomicU32,
}

/// The one [`Unready`] entry.
static UNREADY_ENTRY: Unready = Unready {
    hot_flags: core::sync::atomic::AtomicU32::new(u32::MAX),
};

/// [`UNREADY_ENTRY`] as a table entry (never dereferenced as a cache:
/// [`KmemCache::alloc_at`]).
pub(crate) const fn unready<P: Platform>() -> *mut KmemCache<P> {
    (&raw const UNREADY_ENTRY).cast_mut().cast()
}

/// Whether a table entry is [`unready`]'s (by address: nothing is read).
#[inline(always)]
pub(super) fn is_unready<P: Platform>(entry: *const KmemCache<P>) -> bool {
    core::ptr::eq(entry, unready::<P>())
}

/// `tag` as the `&dyn Fn` the cold paths take, without a stack slot when
/// its type has no bytes (`alloc_tag::current`, every untagged call): a
/// reference to a zero-sized value at its type's dangling address, so
/// `alloc_off_hit` needs no stack frame for it (measured in the kernel,
/// frame pointers on: push, mov, sub, add, pop on every profiled alloc).
#[inline(always)]
fn tag_ref<F: Fn() -> Option<AllocTagRef>>(tag: &F) -> &(dyn Fn() -> Option<AllocTagRef> + '_) {
    if core::mem::size_of::<F>() == 0 {
        // SAFETY: a zero-sized `F`: every aligned non-null address holds
        // its one value, and `tag` (borrowed for the same lifetime) is a
        // value of it.
        unsafe { &*NonNull::<F>::dangling().as_ptr() }
    } else {
        tag
    }
}
