//! The alloc entry points ([`KmemCache::alloc`], `zalloc`, `alloc_tagged`;
//! `kmalloc` comes through [`KmemCache::alloc_with`] too), the magazine
//! hit, the profiled hit, and the one slow function (`alloc_slow`: the
//! magazine miss, then the slab layer). Caches with any other flag take
//! [`hooks`](super::hooks).

use core::ptr::NonNull;
#[cfg(feature = "alloc-profiling")]
use core::sync::atomic::Ordering;

use super::{AllocOut, HotFlags, KmemCache, double_free, pack};
use crate::alloc_tag::AllocTagRef;
use crate::error::AllocError;
use crate::magazine::PcpuCache;
use crate::platform::Platform;

impl<P: Platform> KmemCache<P> {
    /// Allocate one constructed object of `obj_size()` bytes, aligned to
    /// `align()`.
    ///
    /// With feature `alloc-profiling`, the object is charged to the tag
    /// [`PlatformHooks::alloc_tag_current`](crate::PlatformHooks::alloc_tag_current) names (nothing if it says `None`), which
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
        self.alloc_with(crate::alloc_tag::current::<P>, CacheAlloc)
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
        self.alloc_with(move || crate::alloc_tag::explicit::<P>(tag), CacheAlloc)
    }

    /// Allocate, charging the tag `tag()` names (asked only with profiling
    /// on). Plain (no flag): one `hot_flags` test, then the hit. Profiling
    /// on and nothing else (small slabs): the hit, then the tag reference
    /// stored and charged inline. Recording on and nothing else:
    /// [`Self::alloc_recorded_hit`], tested here (off the plain hit; with
    /// profiling compiled in, in `alloc_off_hit`), so the recorded hit
    /// tests no flag. Anything else: out of line.
    /// `bytes_req` is what a kmalloc caller asked for (a `usize`, 0 read
    /// as a `kmem_cache_alloc`) or [`CacheAlloc`] (a `kmem_cache_alloc`,
    /// known at compile time), for kmemtrace only.
    ///
    /// The result type `O` is the caller's ([`AllocOut`]: a `Result`, or a
    /// pointer that is null on error for `GlobalAlloc`), so the out-of-line
    /// paths return it directly and every way out of the hit is a tail
    /// call.
    #[inline(always)]
    pub(crate) fn alloc_with<O: AllocOut, B: BytesReq>(
        &self,
        tag: impl Fn() -> Option<AllocTagRef>,
        bytes_req: B,
    ) -> O {
        // SAFETY: a reference: a live cache.
        unsafe { Self::alloc_at::<O, B, false>(self, tag, bytes_req) }
    }

    /// [`Self::alloc_with`] on a cache named by a pointer that may be the
    /// [`unready`] entry (`UNREADY`: the kmalloc by-8 table's, before
    /// `init`), which the one flag test sends off the hit like any flagged
    /// cache; there, after the profiled cache's test (whose word it never
    /// has), it is told apart by its address before anything else is read,
    /// and refused: [`AllocError::NotInitialized`]. So the table needs no
    /// readiness test, no null test and no published limit: its size
    /// bound is a constant.
    ///
    /// # Safety
    /// `this` is a live cache, or `UNREADY` and the [`unready`] entry.
    #[inline(always)]
    pub(crate) unsafe fn alloc_at<O: AllocOut, B: BytesReq, const UNREADY: bool>(
        this: *const Self,
        tag: impl Fn() -> Option<AllocTagRef>,
        bytes_req: B,
    ) -> O {
        // The flags tested in memory (`test dword ptr [flags], ALLOC_SLOW`
        // and a branch), and read again by each test off the hit: a load
        // kept for those would cost the plain hit an instruction.
        // SAFETY: per our caller, `this` points at a hot-flags word (a
        // cache's first field, or the unready entry's only one), read
        // through this place only until the entry is ruled out.
        let hot_flags = unsafe { &(*this).hot_flags };
        if crate::sync::flags_any::<{ HotFlags::ALLOC_SLOW.bits() }>(hot_flags) {
            #[cfg(feature = "alloc-profiling")]
            {
                // The whole word against a profiled cache's usual one (one
                // compare of the word in memory and a branch, no mask): any
                // other word with the same meaning (an `EVER_TRACED` past,
                // say) is told apart in `alloc_off_hit`.
                if crate::sync::flags_eq::<{ HotFlags::PROFILED_USUAL.bits() }>(hot_flags) {
                    // SAFETY: the unready entry's word is all ones, never
                    // this: a live cache.
                    let this = unsafe { &*this };
                    if O::INLINE_PROFILED {
                        return O::from_raw(this.alloc_profiled_body::<O, true>(tag));
                    }
                    return O::from_raw(this.alloc_profiled::<O, true>(tag));
                }
            }
            // SAFETY: per our caller (the unready entry is refused inside,
            // after the profiled and recorded tests).
            #[cfg(feature = "alloc-profiling")]
            return O::from_raw(unsafe {
                Self::alloc_off_hit::<O, B, UNREADY>(this, bytes_req, tag)
            });
            #[cfg(not(feature = "alloc-profiling"))]
            {
                if crate::sync::flags_only::<
                    { HotFlags::ALLOC_SLOW.bits() },
                    { HotFlags::KMEMTRACE.bits() },
                >(hot_flags)
                {
                    // SAFETY: the unready entry's word has every slow bit:
                    // a live cache.
                    let this = unsafe { &*this };
                    return O::from_raw(this.alloc_recorded_hit::<O, B>(tag, bytes_req));
                }
                if UNREADY && is_unready(this) {
                    return O::from_raw(not_initialized_out::<O>());
                }
                // SAFETY: per our caller, not the unready entry: a live cache.
                let this = unsafe { &*this };
                return O::from_raw(this.alloc_flagged::<O>(bytes_req.get(), this.hot(), tag));
            }
        }
        // SAFETY: no slow flag, so not the unready entry: a live cache.
        let this = unsafe { &*this };
        match this.magazine_alloc_hit_in::<true>() {
            Some(obj) => {
                // SAFETY: just popped; a plain cache is keyed.
                unsafe { double_free::clear_key(obj) };
                O::from_obj(obj)
            }
            None => O::from_raw(this.alloc_slow::<O>(None)),
        }
    }

    /// The magazine hit of an allocation: pop a round from this CPU's
    /// `loaded` and count it. `None` (nothing changed) if `loaded` is
    /// empty or absent. Not for bootstrap caches.
    #[inline(always)]
    pub(crate) fn magazine_alloc_hit(&self) -> Option<NonNull<u8>> {
        self.magazine_alloc_hit_in::<false>()
    }

    /// [`Self::magazine_alloc_hit`]; `IN_RAX`: a restartable hit pops into
    /// the return register (the plain hit: see [`crate::restart::pop`]).
    #[inline(always)]
    fn magazine_alloc_hit_in<const IN_RAX: bool>(&self) -> Option<NonNull<u8>> {
        if crate::restart::enabled::<P>() {
            debug_assert!(self.has_magazines() && P::cpu_id() <= self.last_cpu);
            // SAFETY: pcpu has nr_cpus slots, alive as long as the cache,
            // PCPU_OFFSET bytes after the cache (`ArrayAt`); cpu_offset() is this
            // CPU's slot (the Platform contract), whose hits are
            // restartable.
            return unsafe {
                PcpuCache::restartable_pop::<Self, IN_RAX>(
                    (self as *const Self).cast(),
                    P::cpu_offset(),
                )
            };
        }
        self.magazine_alloc_hit_with(|obj| obj)
    }

    /// [`Self::magazine_alloc_hit`], running `then` on the object inside
    /// the hit's section (the recorded alloc's event) and returning what
    /// it returns (so that a call ending `then` can be a tail call).
    #[inline(always)]
    fn magazine_alloc_hit_with<R>(&self, then: impl FnOnce(NonNull<u8>) -> R) -> Option<R> {
        let mut pcpu = self.pcpu_lock()?;
        let pcc = pcpu.get();
        // The word below `loaded`'s top (kept in the per-CPU cache): the
        // top round, or null for an empty or absent magazine (the
        // header's `next`: see `PcpuInner::top`).
        let top = pcc.top;
        // SAFETY: `top` is at or above slot 0 of `loaded` (or of the
        // absent magazine), owned by this CPU under its flag: the word
        // below it is in the magazine's object.
        let round = unsafe { *top.sub(1) };
        let obj = NonNull::new(round)?;
        crate::sync::interrupt_point::<P>();
        pcc.nr_allocs += 1;
        // SAFETY: a round was below `top`, so slot 0 is at or below it.
        pcc.top = unsafe { top.sub(1) };
        Some(then(obj))
    }

    /// With profiling compiled in, an alloc with a slow flag whose word is
    /// not [`HotFlags::PROFILED_USUAL`]: profiled all the same (the word
    /// says so under the mask: [`Self::alloc_profiled`], a tail call),
    /// recorded ([`Self::alloc_recorded_hit`], a tail call)
    /// or [`Self::alloc_flagged`]. Its own function, so that the plain
    /// hit tests the flags once and keeps nothing of the test for here.
    /// `bytes_req` first: a kmalloc's size stays in the register it came
    /// in (no copy on the plain hit). `this` may be the [`unready`] entry
    /// (`UNREADY`, as for [`Self::alloc_at`]), whose all-ones word fails
    /// both tests and is refused after them, so the profiled and recorded
    /// paths pay nothing for it.
    ///
    /// # Safety
    /// As for [`Self::alloc_at`].
    #[cfg(feature = "alloc-profiling")]
    #[inline(never)]
    unsafe fn alloc_off_hit<O: AllocOut, B: BytesReq, const UNREADY: bool>(
        this: *const Self,
        bytes_req: B,
        tag: impl Fn() -> Option<AllocTagRef>,
    ) -> O::Raw {
        // SAFETY: per our caller, a hot-flags word first (see alloc_at).
        let hot = HotFlags::from_bits_retain(unsafe { &(*this).hot_flags }.load(Ordering::Relaxed));
        if hot.intersection(HotFlags::ALLOC_SLOW | HotFlags::BUFCTL) == HotFlags::PROFILING {
            // SAFETY: not the unready entry's word: a live cache.
            return unsafe { &*this }.alloc_profiled::<O, false>(tag);
        }
        if hot.intersection(HotFlags::ALLOC_SLOW) == HotFlags::KMEMTRACE {
            // SAFETY: as above.
            return unsafe { &*this }.alloc_recorded_hit::<O, B>(tag, bytes_req);
        }
        if UNREADY && is_unready(this) {
            return not_initialized_out::<O>();
        }
        // SAFETY: per our caller, not the unready entry: a live cache.
        unsafe { &*this }.alloc_flagged::<O>(bytes_req.get(), hot, tag)
    }

    /// A recorded allocation (kmemtrace on, no other slow flag: the
    /// caller tested): the magazine hit with its event written inside the
    /// hit's section (the CPU read once, no second guard), else the
    /// recorded slow path ([`Self::alloc_flagged`], which records the
    /// miss's result). Its own function, reached by a call the caller's
    /// result follows (as [`Self::alloc_slow`]; or a tail call from
    /// `alloc_off_hit` with profiling compiled in); the event's write is its
    /// last act, a tail call when the ring needs its cold path, so no
    /// register is saved.
    #[inline(never)]
    fn alloc_recorded_hit<O: AllocOut, B: BytesReq>(
        &self,
        tag: impl Fn() -> Option<AllocTagRef>,
        bytes_req: B,
    ) -> O::Raw {
        let record = |obj: NonNull<u8>, bytes_req: usize| {
            // SAFETY: just popped; no slow bit but KMEMTRACE: the cache is
            // keyed.
            unsafe { double_free::clear_key(obj) };
            // SAFETY: inside the hit's section: this CPU's ring is ours.
            let obj = unsafe {
                self.owner()
                    .kmemtrace_alloc_on(P::cpu_offset(), self, obj, bytes_req)
            };
            O::raw_from_obj(obj)
        };
        // Two copies for a kmalloc (one for a `CacheAlloc`), so that each
        // knows the event's type (kmem_cache or kmalloc) without a test
        // inside the event.
        let bytes_req = bytes_req.get();
        let hit = if bytes_req == 0 {
            self.magazine_alloc_hit_with(|obj| record(obj, 0))
        } else {
            self.magazine_alloc_hit_with(|obj| record(obj, bytes_req))
        };
        if let Some(raw) = hit {
            return raw;
        }
        self.alloc_flagged::<O>(bytes_req, self.hot(), tag)
    }
}

/// The `bytes_req` of an allocation, for kmemtrace: what a kmalloc caller
/// asked for (a `usize`; 0 is recorded as a `kmem_cache_alloc`, as it
/// always was), or [`CacheAlloc`].
pub(crate) trait BytesReq: Copy {
    /// The size asked for; 0 for a `kmem_cache_alloc`.
    fn get(self) -> usize;
}

impl BytesReq for usize {
    #[inline(always)]
    fn get(self) -> usize {
        self
    }
}

/// The `bytes_req` of a `kmem_cache_alloc` (0), as a type: no argument,
/// and the recorded hit has one copy, its event's type known at compile
/// time.
#[derive(Clone, Copy)]
pub(crate) struct CacheAlloc;

impl BytesReq for CacheAlloc {
    #[inline(always)]
    fn get(self) -> usize {
        0
    }
}

impl<P: Platform> KmemCache<P> {
    /// The profiled alloc of a small-object cache (`PROFILING` the only
    /// flag): the magazine hit, then the tag reference stored in the
    /// slab's side array (one multiply for the object's index) and the tag
    /// charged — no flag test (`TAGGED` comes with `PROFILING`). Out of
    /// line but not cold, reached by a tail call and returning in one
    /// register, so the plain hit stays a leaf when profiling is compiled
    /// in; a slab without a side array yet is a tail call too (so this
    /// needs no callee-saved register).
    #[cfg(feature = "alloc-profiling")]
    #[inline(never)]
    pub(super) fn alloc_profiled<O: AllocOut, const IN_PAGE: bool>(
        &self,
        tag: impl Fn() -> Option<AllocTagRef>,
    ) -> O::Raw {
        self.alloc_profiled_body::<O, IN_PAGE>(tag)
    }

    /// The body of [`Self::alloc_profiled`], inlined as it is into the
    /// `GlobalAlloc` hit ([`AllocOut::INLINE_PROFILED`]).
    #[cfg(feature = "alloc-profiling")]
    #[inline(always)]
    fn alloc_profiled_body<O: AllocOut, const IN_PAGE: bool>(
        &self,
        tag: impl Fn() -> Option<AllocTagRef>,
    ) -> O::Raw {
        let Some(obj) = self.magazine_alloc_hit() else {
            return self.alloc_slow::<O>(tag());
        };
        // SAFETY: just popped; a profiled cache on this path is keyed.
        unsafe { double_free::clear_key(obj) };
        let Some(tag) = tag() else {
            return O::raw_from_obj(obj);
        };
        // SAFETY: obj is a busy object of one of our small slabs (just
        // popped from this CPU's magazine).
        let Some(slot) = (unsafe { self.alloc_tag_slot::<IN_PAGE>(obj) }) else {
            return self.charge_first_in_slab::<O>(obj, tag);
        };
        // SAFETY: `tag` is a charge token (the tag closures return the
        // platform's tokens: alloc_tag::current, explicit_tag).
        unsafe { P::alloc_tag_charge_token(tag, obj, self.params.obj_size) };
        // SAFETY: the object's own slot; the object is ours until freed,
        // and so is its slot.
        unsafe { slot.write(Some(tag)) };
        O::raw_from_obj(obj)
    }

    /// [`Self::alloc_slow_packed`] out of line, in the caller's result type.
    #[cold]
    #[inline(never)]
    pub(super) fn alloc_slow<O: AllocOut>(&self, tag: Option<AllocTagRef>) -> O::Raw {
        O::raw_from_packed(self.alloc_slow_packed(tag))
    }

    /// The magazine miss (no bookkeeping flag), then charge `tag` (`None`:
    /// nothing). Its result packed in one register.
    #[inline(always)]
    pub(super) fn alloc_slow_packed(&self, tag: Option<AllocTagRef>) -> usize {
        let obj = match self.magazine_alloc_or_miss() {
            Ok(obj) => obj,
            Err(error) => return pack(Err(error)),
        };
        // SAFETY: just taken; every cache on this path is keyed.
        unsafe { double_free::clear_key(obj) };
        // The cache is a small one: bufctl caches with profiling on take
        // alloc_flagged.
        #[cfg(feature = "alloc-profiling")]
        if let Some(tag) = tag {
            self.tag_small_object(obj, tag, self.hot());
        }
        #[cfg(not(feature = "alloc-profiling"))]
        let _ = tag;
        pack(Ok(obj))
    }

    /// The magazines, hit or miss; on a miss of both magazines and the
    /// depot, the slab layer (constructed). Not traced, not marked.
    pub(crate) fn magazine_alloc_or_miss(&self) -> Result<NonNull<u8>, AllocError> {
        if let Some(obj) = self.magazine_alloc_hit() {
            return Ok(obj);
        }
        // KFENCE HOOK: the sample interval is checked on the miss.
        self.owner().kfence_tick();
        if let Some(obj) = self.magazine_alloc_miss() {
            return Ok(obj);
        }
        self.slab_alloc_constructed()
    }
}

/// The kmalloc by-8 table's entry before `init` (`Allocator::new` fills
/// the table with it, [`unready`]): a hot-flags word with every bit set,
/// so an allocation through it leaves the hit at its one flag test and
/// [`KmemCache::alloc_at`] refuses it by its address. Not a cache: read
/// only as that word.
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
fn is_unready<P: Platform>(entry: *const KmemCache<P>) -> bool {
    core::ptr::eq(entry, unready::<P>())
}

/// `NotInitialized` in the caller's result type, out of line (the
/// unready entry's refusal, and kmalloc's general path before `init`).
#[cold]
#[inline(never)]
pub(crate) fn not_initialized_out<O: AllocOut>() -> O::Raw {
    O::raw_from_packed(pack(Err(AllocError::NotInitialized)))
}
