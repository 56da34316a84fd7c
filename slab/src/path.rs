//! The alloc and free paths, from every entry point down to the magazine
//! hit and its misses: the one file to read to know what an allocation
//! costs.
//!
//! ```text
//!  KmemCache::alloc / alloc_tagged          Allocator::kmalloc / kmalloc_tagged
//!            │                               GlobalAlloc::alloc, Allocator::allocate
//!            │                                        │ kmalloc_checked: size class
//!            ▼                                        ▼ (page-granular: kmalloc.rs)
//!  alloc_with ── plain ──► magazine_alloc_hit ──miss──► alloc_slow ► magazine_alloc_miss
//!       │                     (IrqGuard, pop)                         (prev, depot, slab)
//!       ├─ profiling on ─► alloc_profiled: magazine_alloc_hit + charge_small_object
//!       └─ other flags ──► alloc_flagged ► alloc_cold (bootstrap, debug, trace, bufctl tag)
//!
//!  KmemCache::free          Allocator::kfree           GlobalAlloc::dealloc
//!       │ free_locate            │ kfree_locate             │ kfree_locate
//!       │ (page map: owner       │ (page map: the slab      │
//!       │  is self, object       │  names the cache,        │
//!       │  start, index)         │  object start, index)    │
//!       └──────────────┬─────────┴──────────────────────────┘
//!                      ▼
//!                finish_free ── plain ──► magazine_free_hit ──miss──► magazine_free_slow
//!                      │                    (IrqGuard, push)           (prev, depot, new
//!                      └─ any flag ──► free_off_hit      (one mask test)  magazine, slab)
//!                           ├─ TAGGED only: untag (index known) + magazine_free_hit
//!                           └─ else: free_flagged ► free_cold (debug, trace, bufctl tag)
//!  (anything the page map does not vouch for: free_slow / kfree_slow,
//!   with the error reports; page-granular kfree: kmalloc.rs)
//! ```
//!
//! **The hits** take no lock and no atomic read-modify-write: interrupts
//! off ([`IrqGuard`]), this CPU's per-CPU cache at `pcpu +
//! Platform::cpu_offset()`, pop from (push to) `loaded`, count (alloc
//! only), interrupts back on. `loaded`'s round count and capacity are
//! kept in the per-CPU cache (Bonwick & Adams' `cc_rounds`,
//! `cc_magsize`): a hit reads the per-CPU line and one round slot, and no
//! load waits for the magazine's header. An absent magazine has count and
//! capacity 0 there, so there is no null test. Everything else — misses, errors,
//! bookkeeping flags — is a tail call to an out-of-line function, so a hit
//! needs no callee-saved register.
//!
//! **The free's owner check** is constant time: one page-map load (the
//! slab), its owner compared with the cache (`free`) or taken as the cache
//! (`kfree`), and one 64×64→128 multiply by `ceil(2^64 / stride)` that
//! both tests that the pointer is an object start and gives its index
//! (Lemire, Kaser and Kurz 2019) — the index the profiled free uses for
//! the tag reference. A free to the wrong cache, of a non-slab pointer or
//! of an interior pointer is an error, never corruption. Double frees: the
//! hit refuses the object already on top of `loaded` (Linux's naive check,
//! two instructions); the miss also checks the top of `prev` and the
//! slab's free map; every debug cache (any debug flag) checks the object's
//! state word on its cold path, which catches them all. Every refusal is
//! reported ([`crate::report`]).

use core::ptr::NonNull;

use crate::alloc_tag::AllocTagRef;
use crate::allocator::Allocator;
use crate::cache::{HotFlags, KmemCache, pack, unpack};
use crate::debug_cache::DebugFree;
use crate::error::{AllocError, FreeError};
use crate::geometry::SlabKind;
use crate::magazine::{MAG_FREE_RETRIES, Magazine, PcpuInner, Stale, no_magazine, rounds_of};
use crate::pagemap::{TAG_MASK, TAG_SLAB};
use crate::platform::Platform;
use crate::slab::Slab;
use crate::sync::IrqGuard;

// ---------------------------------------------------------------- alloc

/// What an alloc path returns to its caller: `Result` (the library API) or
/// a raw pointer, null on error (`GlobalAlloc`). The out-of-line paths
/// return [`AllocOut::Raw`], one register: the [`pack`]ed result for
/// `Result` (unpacked inline: a `Result` would come back through memory),
/// the pointer itself for `GlobalAlloc` (so its misses are tail calls).
pub(crate) trait AllocOut {
    /// What the out-of-line paths return.
    type Raw;
    /// An object.
    fn from_obj(obj: NonNull<u8>) -> Self;
    /// A [`pack`]ed result as `Raw` (in the out-of-line function).
    fn raw_from_packed(packed: usize) -> Self::Raw;
    /// An object as `Raw` (in the out-of-line function; no test).
    #[cfg_attr(
        not(feature = "alloc-profiling"),
        allow(dead_code, reason = "the profiled alloc's")
    )]
    fn raw_from_obj(obj: NonNull<u8>) -> Self::Raw;
    /// `Raw` as the caller's result (inline, after the call).
    fn from_raw(raw: Self::Raw) -> Self;
}

impl AllocOut for Result<NonNull<u8>, AllocError> {
    type Raw = usize;
    #[inline(always)]
    fn from_obj(obj: NonNull<u8>) -> Self {
        Ok(obj)
    }
    #[inline(always)]
    fn raw_from_packed(packed: usize) -> usize {
        packed
    }
    #[inline(always)]
    fn raw_from_obj(obj: NonNull<u8>) -> usize {
        pack(Ok(obj))
    }
    #[inline(always)]
    fn from_raw(packed: usize) -> Self {
        unpack(packed)
    }
}

impl AllocOut for *mut u8 {
    type Raw = *mut u8;
    #[inline(always)]
    fn from_obj(obj: NonNull<u8>) -> Self {
        obj.as_ptr()
    }
    #[inline(always)]
    fn raw_from_packed(packed: usize) -> *mut u8 {
        match unpack(packed) {
            Ok(obj) => obj.as_ptr(),
            Err(_) => core::ptr::null_mut(),
        }
    }
    #[inline(always)]
    fn raw_from_obj(obj: NonNull<u8>) -> *mut u8 {
        obj.as_ptr()
    }
    #[inline(always)]
    fn from_raw(ptr: *mut u8) -> Self {
        ptr
    }
}

impl<P: Platform> KmemCache<P> {
    /// Allocate one constructed object of `obj_size()` bytes, aligned to
    /// `align()`.
    ///
    /// With feature `alloc-profiling`, the object is charged to the tag
    /// [`Platform::alloc_tag_current`] names (nothing if it says `None`), which
    /// is asked only while profiling is switched on in the allocator
    /// ([`Allocator::set_alloc_profiling`]).
    ///
    /// # Errors
    /// [`AllocError::OutOfMemory`] if neither the magazines, the slabs nor
    /// the page source have an object; [`AllocError::ConstructorFailed`] if
    /// the constructor refused (the object went back to its slab);
    /// [`AllocError::InvalidLayout`] for a bootstrap cache.
    #[inline]
    pub fn alloc(&self) -> Result<NonNull<u8>, AllocError> {
        self.alloc_with(crate::alloc_tag::current::<P>, 0)
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
        unsafe { core::ptr::write_bytes(obj.as_ptr(), 0, self.obj_size) };
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
        self.alloc_with(move || crate::alloc_tag::explicit::<P>(tag), 0)
    }

    /// Allocate, charging the tag `tag()` names (asked only with profiling
    /// on). Plain (no flag): one `hot_flags` test, then the hit. Profiling
    /// on and nothing else (small slabs): the hit, then the tag reference
    /// stored and charged inline. Anything else: out of line. `bytes_req`
    /// is what a kmalloc caller asked for (0: a `kmem_cache_alloc`), for
    /// kmemtrace only.
    ///
    /// The result type `O` is the caller's ([`AllocOut`]: a `Result`, or a
    /// pointer that is null on error for `GlobalAlloc`), so the out-of-line
    /// paths return it directly and every way out of the hit is a tail
    /// call.
    #[inline(always)]
    pub(crate) fn alloc_with<O: AllocOut>(
        &self,
        tag: impl Fn() -> Option<AllocTagRef>,
        bytes_req: usize,
    ) -> O {
        let hot = self.hot();
        if hot.intersects(HotFlags::ALLOC_SLOW) {
            #[cfg(feature = "alloc-profiling")]
            if hot.intersection(HotFlags::ALLOC_SLOW | HotFlags::BUFCTL) == HotFlags::PROFILING {
                return O::from_raw(self.alloc_profiled::<O>(tag));
            }
            return O::from_raw(self.alloc_flagged::<O>(hot, tag, bytes_req));
        }
        match self.magazine_alloc_hit() {
            Some(obj) => O::from_obj(obj),
            None => O::from_raw(self.alloc_slow::<O>(None)),
        }
    }

    /// The magazine hit of an allocation: pop a round from this CPU's
    /// `loaded` and count it. `None` (nothing changed) if `loaded` is
    /// empty or absent. Not for bootstrap caches.
    #[inline(always)]
    pub(crate) fn magazine_alloc_hit(&self) -> Option<NonNull<u8>> {
        let mut irq = IrqGuard::<P>::new();
        let pcc = self.pcpu_mut(&mut irq);
        // `loaded`'s rounds, kept in the per-CPU cache: 0 for an empty or
        // absent magazine.
        let nr_rounds = pcc.rounds;
        if nr_rounds == 0 {
            return None;
        }
        pcc.nr_allocs += 1;
        pcc.rounds = nr_rounds - 1;
        // SAFETY: a real magazine (the absent one has no rounds) owned by
        // this CPU, interrupts off; its slots below nr_rounds are objects.
        unsafe {
            Some(NonNull::new_unchecked(
                *Magazine::slots(pcc.loaded).add(nr_rounds as usize - 1),
            ))
        }
    }

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
    fn alloc_profiled<O: AllocOut>(&self, tag: impl Fn() -> Option<AllocTagRef>) -> O::Raw {
        let Some(obj) = self.magazine_alloc_hit() else {
            return self.alloc_slow::<O>(tag());
        };
        let Some(tag) = tag() else {
            return O::raw_from_obj(obj);
        };
        // SAFETY: obj is a busy object of one of our small slabs (just
        // popped from this CPU's magazine).
        let Some(slot) = (unsafe { self.alloc_tag_slot(obj) }) else {
            return self.charge_first_in_slab::<O>(obj, tag);
        };
        // SAFETY: `tag` is a charge token (the tag closures return the
        // platform's tokens: alloc_tag::current, explicit_tag).
        unsafe { P::alloc_tag_charge_token(tag, obj, self.obj_size) };
        // SAFETY: the object's own slot; the object is ours until freed,
        // and so is its slot.
        unsafe { slot.write(Some(tag)) };
        O::raw_from_obj(obj)
    }

    /// [`Self::alloc_slow_packed`] out of line, in the caller's result type.
    #[cold]
    #[inline(never)]
    fn alloc_slow<O: AllocOut>(&self, tag: Option<AllocTagRef>) -> O::Raw {
        O::raw_from_packed(self.alloc_slow_packed(tag))
    }

    /// The magazine miss (no bookkeeping flag), then charge `tag` (`None`:
    /// nothing). Its result packed in one register.
    #[inline(always)]
    fn alloc_slow_packed(&self, tag: Option<AllocTagRef>) -> usize {
        let obj = match self.magazine_alloc_or_miss() {
            Ok(obj) => obj,
            Err(error) => return pack(Err(error)),
        };
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
        if let Some(obj) = self.magazine_alloc_miss() {
            return Ok(obj);
        }
        self.slab_alloc_constructed()
    }

    /// `loaded` is empty (or absent): swap with `prev` if it has rounds,
    /// else trade with the depot. `None` if the depot has no full
    /// magazine either (the caller goes to the slab layer). An empty
    /// magazine of an older type the depot did not keep is freed after
    /// interrupts are back on.
    fn magazine_alloc_miss(&self) -> Option<NonNull<u8>> {
        let mut irq = IrqGuard::<P>::new();
        let mut pcc = self.pcpu_synced(&mut irq);
        let mut stale = Stale::NONE;
        let obj = loop {
            if let Some(obj) = pop_round(&mut pcc) {
                break Some(obj);
            }
            // SAFETY: this CPU's magazines, interrupts off.
            if unsafe { rounds_of(pcc.prev) } > 0 {
                pcc.swap_magazines();
                continue;
            }
            let (found, left) = self.depot.exchange_for_full::<P>(&mut pcc);
            stale = stale.join(left);
            if !found {
                break None;
            }
        };
        drop(pcc);
        drop(irq);
        self.free_stale(stale);
        obj
    }

    /// With some flag other than those the plain hit ignores: profiling
    /// on a bufctl cache, or bookkeeping (audit, tracing, bootstrap,
    /// kmemtrace). `tag` is called only if `PROFILING` is set.
    #[cold]
    #[inline(never)]
    fn alloc_flagged<O: AllocOut>(
        &self,
        hot: HotFlags,
        tag: impl Fn() -> Option<AllocTagRef>,
        bytes_req: usize,
    ) -> O::Raw {
        O::raw_from_packed(self.alloc_flagged_packed(hot, tag, bytes_req))
    }

    /// [`Self::alloc_flagged`], its result packed.
    fn alloc_flagged_packed(
        &self,
        hot: HotFlags,
        tag: impl Fn() -> Option<AllocTagRef>,
        bytes_req: usize,
    ) -> usize {
        if hot.contains(HotFlags::KMEMTRACE) {
            // KMEMTRACE HOOK: kmalloc, kmem_cache_alloc, GlobalAlloc (ok or failed).
            return self.alloc_recorded(hot - HotFlags::KMEMTRACE, tag, bytes_req);
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
    fn alloc_recorded(
        &self,
        hot: HotFlags,
        tag: impl Fn() -> Option<AllocTagRef>,
        bytes_req: usize,
    ) -> usize {
        let packed = if !hot.intersects(HotFlags::ALLOC_SLOW) {
            match self.magazine_alloc_hit() {
                Some(obj) => pack(Ok(obj)),
                None => self.alloc_slow_packed(None),
            }
        } else {
            self.alloc_flagged_packed(hot, tag, bytes_req)
        };
        self.owner().kmemtrace_alloc(self, packed, bytes_req);
        packed
    }

    /// Alloc with bookkeeping: debug checks, bufctl tag, tracing.
    /// `bytes_req`: what a kmalloc caller asked for (0: the whole object),
    /// where a `REDZONE` cache starts the redzone.
    fn alloc_cold(
        &self,
        hot: HotFlags,
        tag: Option<AllocTagRef>,
        bytes_req: usize,
    ) -> Result<NonNull<u8>, AllocError> {
        if hot.contains(HotFlags::BOOTSTRAP) {
            return Err(AllocError::InvalidLayout);
        }
        #[cfg(not(feature = "alloc-profiling"))]
        let _ = tag;
        let obj = self.magazine_alloc_or_miss()?;
        let addr = obj.as_ptr() as usize;
        if let Some(layout) = self.debug.as_ref() {
            let slab = match self.kind {
                SlabKind::Small => self.small_slab_of(addr) as usize,
                SlabKind::Bufctl => self.page_map.get(addr) & !TAG_MASK,
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
                unsafe { P::alloc_tag_charge_token(tag, obj, self.obj_size) };
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
        Ok(obj)
    }

    /// A bufctl object leaves for a caller charged to a tag: state
    /// `Allocated` and the charge `token` stored.
    #[cfg(feature = "alloc-profiling")]
    fn bufctl_mark_allocated(&self, addr: usize, token: AllocTagRef) {
        if !self.hot().contains(HotFlags::BUFCTL_TAGGED) {
            // Before the store: whoever frees the object sees the flag.
            self.set_hot(HotFlags::BUFCTL_TAGGED);
        }
        let busy = self.slab.lock().mark_allocated(addr, Some(token));
        debug_assert!(busy);
    }
}

/// The round on top of a magazine holding `nr_rounds` rounds, as an
/// address. For an empty magazine this is the header word before slot 0,
/// `capacity` plus `nr_rounds << 32` (stale while loaded): never
/// 8-aligned, as no capacity is a multiple of 8 (asserted in
/// magazine.rs), so never an object, and no branch for the case.
///
/// # Safety
/// `mag` is a live magazine (not the absent one) holding `nr_rounds ≤
/// capacity` rounds, owned by the caller.
#[inline(always)]
unsafe fn top_round(mag: *mut Magazine, nr_rounds: usize) -> usize {
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

/// Pop a round from `loaded` (the miss paths' retry), counting it.
#[inline(always)]
fn pop_round(pcc: &mut PcpuInner) -> Option<NonNull<u8>> {
    let loaded = pcc.loaded;
    // SAFETY: the caller owns pcc (its CPU, interrupts off).
    if unsafe { rounds_of(loaded) } == 0 {
        return None;
    }
    pcc.nr_allocs += 1;
    // SAFETY: a real magazine with at least one round; its slots below
    // nr_rounds are objects.
    unsafe {
        (*loaded).nr_rounds -= 1;
        Some(NonNull::new_unchecked(
            *Magazine::slots(loaded).add((*loaded).nr_rounds as usize),
        ))
    }
}

/// Push a round on `loaded` if it has room (the miss paths' retry).
#[inline(always)]
fn push_round(pcc: &mut PcpuInner, obj: NonNull<u8>) -> bool {
    let loaded = pcc.loaded;
    // SAFETY: the caller owns pcc. The absent magazine has capacity 0
    // (never room); a real one has `capacity` slots.
    unsafe {
        let nr_rounds = (*loaded).nr_rounds;
        if nr_rounds >= (*loaded).capacity {
            return false;
        }
        *Magazine::slots(loaded).add(nr_rounds as usize) = obj.as_ptr();
        (*loaded).nr_rounds = nr_rounds + 1;
    }
    true
}

// ----------------------------------------------------------------- free

/// Where the page map put a freed pointer: its slab and object index.
#[derive(Clone, Copy)]
/// (The index first: it is where the owner check's multiply leaves it,
/// `rdx`, when a `Located` is passed on in two registers.)
pub(crate) struct Located {
    #[cfg_attr(
        not(feature = "alloc-profiling"),
        allow(dead_code, reason = "read by the profiled free")
    )]
    pub(crate) index: usize,
    pub(crate) slab: *mut Slab,
}

/// What a free path returns to its caller: `Result` (the library API), or
/// `()` for the `GlobalAlloc` edge, which reports a refused free to the
/// allocator's free-error hook ([`Allocator::set_free_error_hook`]) and
/// counts it in [`Allocator::nr_bad_frees`]. Returned by the out-of-line
/// paths directly, so the hit's ways out are tail calls.
pub(crate) trait FreeOut {
    /// The free happened.
    fn ok() -> Self;
    /// The result of a free by `cache`, as the caller takes it.
    fn from_result<P: Platform>(cache: &KmemCache<P>, result: Result<(), FreeError>) -> Self;
    /// [`KmemCache::free_off_hit`] or its `sret` twin, whichever keeps
    /// the index in place for this result type.
    ///
    /// # Safety
    /// As for [`KmemCache::finish_free`].
    unsafe fn off_hit<P: Platform>(
        cache: &KmemCache<P>,
        obj: NonNull<u8>,
        at: Located,
        hot: HotFlags,
    ) -> Self;
}

impl FreeOut for Result<(), FreeError> {
    #[inline(always)]
    fn ok() -> Self {
        Ok(())
    }
    #[inline(always)]
    fn from_result<P: Platform>(_cache: &KmemCache<P>, result: Result<(), FreeError>) -> Self {
        result
    }
    #[inline(always)]
    unsafe fn off_hit<P: Platform>(
        cache: &KmemCache<P>,
        obj: NonNull<u8>,
        at: Located,
        hot: HotFlags,
    ) -> Self {
        // SAFETY: per our caller.
        unsafe { cache.free_off_hit_sret::<Self>(at.index, obj, at.slab, hot) }
    }
}

impl FreeOut for () {
    #[inline(always)]
    fn ok() -> Self {}
    #[inline(always)]
    fn from_result<P: Platform>(cache: &KmemCache<P>, result: Result<(), FreeError>) -> Self {
        if let Err(error) = result {
            cache.owner().report_free_error(error);
        }
    }
    #[inline(always)]
    unsafe fn off_hit<P: Platform>(
        cache: &KmemCache<P>,
        obj: NonNull<u8>,
        at: Located,
        hot: HotFlags,
    ) -> Self {
        // SAFETY: per our caller.
        unsafe { KmemCache::free_off_hit::<Self>(obj, cache, at.index, at.slab, hot) }
    }
}

impl<P: Platform> KmemCache<P> {
    /// Free an object back to this cache.
    ///
    /// Checked: the pointer must be slab memory (`NotAllocated`), of this
    /// cache (`WrongCache`), at an object start (`Misaligned`), and not
    /// free (`DoubleFree`: always for the object on top of this CPU's
    /// magazines or back in its slab; anywhere for a debug cache). On error
    /// nothing has changed, and the error is reported ([`crate::report`]).
    ///
    /// # Safety
    /// If `obj` is an allocated object of this cache, the caller gives it
    /// up: nothing uses it afterwards; for a cache with a constructor, in
    /// its constructed state, every byte initialised ([`Ctor`](crate::Ctor)).
    /// (Bad pointers are detected as above
    /// and are safe to pass, except a double free of an object resting
    /// deeper in a magazine of a cache without debug flags, which is
    /// undetected: the object is later handed out twice. The slab layer
    /// still refuses it when it comes back there.)
    ///
    /// # Errors
    /// See above; [`FreeError::NotAllocated`] for bootstrap caches.
    #[inline]
    pub unsafe fn free(&self, obj: NonNull<u8>) -> Result<(), FreeError> {
        match self.free_locate(obj) {
            // SAFETY: per our caller; located in this cache.
            Some(at) => unsafe { self.finish_free::<Result<(), FreeError>>(obj, at) },
            // SAFETY: per our caller; nothing changed.
            None => unsafe { self.free_slow(obj) },
        }
    }

    /// The common case of locating a freed pointer: the page map (so: on
    /// the primary source) names one of our slabs and `obj` is an object
    /// start. `None` for anything else (the slow path says why).
    #[inline(always)]
    fn free_locate(&self, obj: NonNull<u8>) -> Option<Located> {
        let addr = obj.as_ptr() as usize;
        // Off the primary source the map is empty: entry 0, slow path.
        // A slab entry minus its tag is the 8-aligned slab: one subtract
        // and one test find it and check the tag.
        let slab = self.page_map.get(addr).wrapping_sub(TAG_SLAB);
        if slab & TAG_MASK != 0
            // SAFETY: a TAG_SLAB entry names a registered slab, alive
            // (entries are cleared before a slab is destroyed); `||` reads
            // it only then.
            || unsafe { (*(slab as *mut Slab)).cache } != (self as *const Self).cast()
        {
            return None;
        }
        let slab = slab as *mut Slab;
        // SAFETY: a live slab of ours whose pages hold addr.
        unsafe { self.object_index(slab, addr) }.map(|index| Located { slab, index })
    }

    /// Finish a free whose owner check passed — for all three callers
    /// (`KmemCache::free`, `Allocator::kfree`, `GlobalAlloc::dealloc`).
    /// Plain: the magazine hit. Any `FREE_SLOW` flag (profiling's `TAGGED`
    /// included): one test of the flags the hit loads anyway, then a tail
    /// call to [`Self::free_off_hit`], so a cache with profiling compiled
    /// in but off pays nothing more than a plain one. The result type `O`
    /// is the caller's ([`FreeOut`]: a `Result`, or `()` for the
    /// `GlobalAlloc` edge, where a refused free goes to the free-error
    /// report), so every way out of the hit is a tail call.
    ///
    /// # Safety
    /// `obj` is object `at.index` of `at.slab`, a live slab of this cache;
    /// if it is allocated, the caller gives it up.
    #[inline(always)]
    pub(crate) unsafe fn finish_free<O: FreeOut>(&self, obj: NonNull<u8>, at: Located) -> O {
        let hot = self.hot().intersection(HotFlags::FREE_SLOW);
        if !hot.is_empty() {
            // SAFETY: per our caller.
            return unsafe { O::off_hit(self, obj, at, hot) };
        }
        // SAFETY: per our caller.
        if unsafe { self.magazine_free_hit(obj) } {
            return O::ok();
        }
        // SAFETY: per our caller; the hit changed nothing.
        unsafe { self.magazine_free_miss_out::<O>(obj) }
    }

    /// A free with some `FREE_SLOW` flag (`hot`, read by the caller). The
    /// profiled free (`TAGGED` the only flag) first, inline: the tag
    /// reference at the index the owner check computed, cleared and
    /// uncharged, then the magazine hit — nothing here can refuse the
    /// free. Anything else: [`Self::free_flagged`]. Out of line but not
    /// cold, reached by a tail call, so the plain hit stays a leaf.
    ///
    /// Two entry points with one body, their parameters ordered so that
    /// no register moves on the hit: the owner check's index stays where
    /// its multiply left it (`rdx`, the third integer argument), and
    /// `GlobalAlloc::dealloc`'s pointer where it came (first, when LLVM
    /// drops the constant `&self` of a `#[global_allocator]`'s `dealloc`).
    /// This one has no result (`GlobalAlloc::dealloc`); `Result`'s has a
    /// hidden result pointer first ([`FreeOut::off_hit`] picks).
    ///
    /// # Safety
    /// As for [`Self::finish_free`].
    #[inline(never)]
    pub(crate) unsafe fn free_off_hit<O: FreeOut>(
        obj: NonNull<u8>,
        cache: &Self,
        index: usize,
        slab: *mut Slab,
        hot: HotFlags,
    ) -> O {
        // SAFETY: per our caller.
        unsafe { cache.free_off_hit_body(obj, Located { index, slab }, hot) }
    }

    /// [`Self::free_off_hit`] for a result returned through memory.
    ///
    /// # Safety
    /// As for [`Self::finish_free`].
    #[inline(never)]
    pub(crate) unsafe fn free_off_hit_sret<O: FreeOut>(
        &self,
        index: usize,
        obj: NonNull<u8>,
        slab: *mut Slab,
        hot: HotFlags,
    ) -> O {
        // SAFETY: per our caller.
        unsafe { self.free_off_hit_body(obj, Located { index, slab }, hot) }
    }

    /// The body of [`Self::free_off_hit`].
    ///
    /// # Safety
    /// As for [`Self::finish_free`].
    #[inline(always)]
    unsafe fn free_off_hit_body<O: FreeOut>(
        &self,
        obj: NonNull<u8>,
        at: Located,
        hot: HotFlags,
    ) -> O {
        #[cfg(feature = "alloc-profiling")]
        if hot == HotFlags::TAGGED {
            // SAFETY: per our caller; `TAGGED` is only set for caches with
            // small slabs and tag arrays. The object is given up. (A double
            // free the magazines refuse finds the reference cleared:
            // nothing is uncharged twice.)
            unsafe { self.untag_small_object(obj, at) };
            // SAFETY: per our caller.
            if unsafe { self.magazine_free_hit(obj) } {
                return O::ok();
            }
            // SAFETY: per our caller; the hit changed nothing.
            return unsafe { self.magazine_free_miss_out::<O>(obj) };
        }
        let _ = hot;
        // SAFETY: per our caller.
        unsafe { self.free_flagged_out::<O>(obj, at.slab) }
    }

    /// [`Self::free_flagged`] in the caller's result type (its own
    /// function, so that [`Self::free_off_hit`] needs no stack frame).
    ///
    /// # Safety
    /// As for [`Self::free_flagged`].
    #[inline(never)]
    unsafe fn free_flagged_out<O: FreeOut>(&self, obj: NonNull<u8>, slab: *mut Slab) -> O {
        // SAFETY: per our caller.
        O::from_result(self, unsafe { self.free_flagged(obj, slab) })
    }

    /// [`Self::magazine_free_slow`] in the caller's result type.
    ///
    /// # Safety
    /// As for [`Self::magazine_free`].
    #[cold]
    #[inline(never)]
    unsafe fn magazine_free_miss_out<O: FreeOut>(&self, obj: NonNull<u8>) -> O {
        // SAFETY: per our caller.
        O::from_result(self, unsafe { self.magazine_free_slow(obj) })
    }

    /// The hit, else the out-of-line miss (which refuses a double free of
    /// the object on top of `loaded` or `prev`).
    ///
    /// # Safety
    /// `obj` is a constructed, busy object of this cache that the caller
    /// gives up (validated by the caller).
    #[inline(always)]
    pub(crate) unsafe fn magazine_free(&self, obj: NonNull<u8>) -> Result<(), FreeError> {
        // SAFETY: per our caller.
        if unsafe { self.magazine_free_hit(obj) } {
            return Ok(());
        }
        // SAFETY: per our caller; the hit changed nothing.
        unsafe { self.magazine_free_slow(obj) }
    }

    /// The magazine hit of a free: push `obj` on this CPU's `loaded`.
    /// False (nothing changed) if `loaded` is full or absent.
    ///
    /// # Safety
    /// `obj` is a constructed, busy object of this cache that the caller
    /// gives up if this returns true.
    #[inline(always)]
    pub(crate) unsafe fn magazine_free_hit(&self, obj: NonNull<u8>) -> bool {
        let mut irq = IrqGuard::<P>::new();
        let pcc = self.pcpu_mut(&mut irq);
        // `loaded`'s rounds and capacity, kept in the per-CPU cache: the
        // absent magazine's capacity is 0, never room.
        let nr_rounds = pcc.rounds;
        if nr_rounds >= pcc.capacity {
            return false;
        }
        let loaded = pcc.loaded;
        // Linux's naive double-free check: the object already on top of
        // `loaded` (the miss path refuses it). Two instructions.
        // SAFETY: a real magazine (above), nr_rounds < capacity.
        if unsafe { top_round(loaded, nr_rounds as usize) } == obj.as_ptr() as usize {
            return false;
        }
        // SAFETY: a real magazine owned by this CPU, interrupts off;
        // nr_rounds < capacity, a slot of its object.
        unsafe { *Magazine::slots(loaded).add(nr_rounds as usize) = obj.as_ptr() };
        pcc.rounds = nr_rounds + 1;
        true
    }

    /// `loaded` is full (or absent): swap, trade with the depot, make a
    /// new magazine, or free to the slab layer.
    ///
    /// # Safety
    /// As for [`Self::magazine_free`].
    #[cold]
    #[inline(never)]
    pub(crate) unsafe fn magazine_free_slow(&self, obj: NonNull<u8>) -> Result<(), FreeError> {
        // SAFETY: per our caller, obj is an object start of a live slab of
        // ours.
        if self.on_top_of_magazines(obj) || unsafe { self.is_free_in_slab(obj) } {
            return Err(self.refuse(FreeError::DoubleFree {
                addr: obj.as_ptr() as usize,
            }));
        }
        if self.magazine_free_miss(obj) {
            return Ok(());
        }
        for _ in 0..MAG_FREE_RETRIES {
            // No room and no empty magazine in the depot: make one. No
            // lock is held and interrupts are on, so allocating from a
            // magazine cache cannot deadlock.
            match self.new_magazine() {
                // SAFETY: a fresh empty magazine, owned by nobody yet.
                Ok(mag) => unsafe { self.depot.lock().push_empty(mag) },
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

    /// Whether `obj`, an object of ours, is back in its slab (small slabs:
    /// on the free list; bufctl slabs: not in the hash): a double free.
    /// Checked on the free miss only: on the hit it would cost 7
    /// instructions per alloc+free pair (measured: 56 → 63 on `cache-pair`).
    ///
    /// # Safety
    /// `obj` is an object start of a live slab of this cache.
    unsafe fn is_free_in_slab(&self, obj: NonNull<u8>) -> bool {
        let addr = obj.as_ptr() as usize;
        if self.kind != SlabKind::Small {
            // Bufctl slabs: a busy object has its bufctl in the hash (one
            // locked lookup, on the miss only).
            return self.slab.lock().hash.find(addr).is_null();
        }
        let slab = self.small_slab_of(addr);
        // SAFETY: per our caller, a live small slab of ours.
        let (index, _) = self.obj_index(addr - unsafe { (*slab).base });
        // SAFETY: as above.
        crate::freelist::map_test(unsafe { &(*slab).free_map }, index)
    }

    /// Whether `obj` is the round on top of this CPU's `loaded` or `prev`
    /// (a double free Linux's naive check catches).
    fn on_top_of_magazines(&self, obj: NonNull<u8>) -> bool {
        let mut irq = IrqGuard::<P>::new();
        let pcc = self.pcpu_synced(&mut irq);
        [pcc.loaded, pcc.prev].into_iter().any(|mag| {
            // SAFETY: this CPU's magazines (or the absent one), interrupts off.
            let nr_rounds = unsafe { rounds_of(mag) };
            // SAFETY: a real magazine with nr_rounds > 0 rounds.
            nr_rounds != 0 && unsafe { top_round(mag, nr_rounds) } == obj.as_ptr() as usize
        })
    }

    /// One pass of the free miss with interrupts off: store `obj` in
    /// `loaded`, swapping with `prev` or trading `prev` for an empty
    /// magazine from the depot as needed; false if there is no room and
    /// the depot has no empty magazine.
    fn magazine_free_miss(&self, obj: NonNull<u8>) -> bool {
        let mut irq = IrqGuard::<P>::new();
        let mut pcc = self.pcpu_synced(&mut irq);
        let mut stale = Stale::NONE;
        let stored = loop {
            if push_round(&mut pcc, obj) {
                break true;
            }
            // SAFETY: this CPU's magazines, interrupts off.
            let swap = unsafe {
                pcc.prev != no_magazine()
                    && (pcc.loaded == no_magazine() || rounds_of(pcc.prev) == 0)
            };
            if swap {
                pcc.swap_magazines();
                if push_round(&mut pcc, obj) {
                    break true;
                }
            }
            let (found, left) = self.depot.exchange_for_empty::<P>(&mut pcc);
            stale = stale.join(left);
            if !found {
                break false;
            }
        };
        drop(pcc);
        drop(irq);
        // Empty magazines of an older type: freed with interrupts on.
        self.free_stale(stale);
        stored
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
    unsafe fn free_flagged_with(
        &self,
        obj: NonNull<u8>,
        slab: *mut Slab,
        hot: HotFlags,
    ) -> Result<(), FreeError> {
        self.free_cold(obj, slab, hot)?;
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
    unsafe fn free_recorded(
        &self,
        obj: NonNull<u8>,
        slab: *mut Slab,
        hot: HotFlags,
    ) -> Result<(), FreeError> {
        let irq = IrqGuard::<P>::new();
        // SAFETY: per our caller.
        let result = unsafe { self.free_flagged_with(obj, slab, hot) };
        self.owner().kmemtrace_free(Some(self), obj, result.is_ok());
        drop(irq);
        result
    }

    /// Free-side bookkeeping: the checks that can refuse (each refusal
    /// reported), then tracing and uncharging.
    fn free_cold(&self, obj: NonNull<u8>, slab: *mut Slab, hot: HotFlags) -> Result<(), FreeError> {
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
                unsafe { P::alloc_tag_uncharge(token, obj, self.obj_size) };
            }
        } else if hot.contains(HotFlags::TAGGED) {
            // SAFETY: `slab` is the located, alive small slab of addr.
            let (index, _) = self.obj_index(addr - unsafe { (*slab).base });
            // SAFETY: a located small-slab object of ours, given up.
            unsafe { self.untag_small_object(obj, Located { slab, index }) };
        }
        Ok(())
    }

    /// [`KmemCache::free`] past the fast path: locate with error reports,
    /// then finish.
    ///
    /// # Safety
    /// As for [`KmemCache::free`].
    #[cold]
    #[inline(never)]
    unsafe fn free_slow(&self, obj: NonNull<u8>) -> Result<(), FreeError> {
        let addr = obj.as_ptr() as usize;
        let slab = match self.locate(addr) {
            Ok(slab) => slab,
            Err(error) => {
                // KMEMTRACE HOOK: kmem_cache_free of a pointer not ours.
                if self.hot().contains(HotFlags::KMEMTRACE) {
                    self.owner().kmemtrace_free(Some(self), obj, false);
                }
                return Err(self.refuse(error));
            }
        };
        if slab.is_null() {
            // A bufctl cache off the primary source: the hash decides.
            // SAFETY: per our caller.
            return unsafe { self.free_flagged(obj, slab) };
        }
        // SAFETY: `locate` checked the slab is ours and addr an object start.
        let index = unsafe { self.object_index(slab, addr) }.unwrap_or(0);
        // SAFETY: per our caller; located in this cache.
        unsafe { self.finish_free::<Result<(), FreeError>>(obj, Located { slab, index }) }
    }
}

// -------------------------------------------------------- kmalloc / kfree

impl<P: Platform> Allocator<P> {
    /// [`Allocator::kmalloc_tagged`] once the allocator is known ready, the
    /// size non-zero and the alignment a power of two (a `Layout`'s): the
    /// size class's cache, or page-granular.
    /// (Size 0 is served by `kmalloc-8`: `GlobalAlloc` rounds it up.)
    #[inline(always)]
    pub(crate) fn kmalloc_checked<O: AllocOut>(
        &self,
        size: usize,
        align: usize,
        tag: impl Fn() -> Option<AllocTagRef>,
    ) -> O {
        debug_assert!(self.is_ready() && align.is_power_of_two());
        match Self::kmalloc_index(size, align) {
            Some(index) => self.kmalloc_cache(index).alloc_with(tag, size),
            None => O::from_raw(self.large_alloc_out::<O>(size, align, tag)),
        }
    }

    /// Page-granular kmalloc, out of line, in the caller's result type.
    #[inline(never)]
    fn large_alloc_out<O: AllocOut>(
        &self,
        size: usize,
        align: usize,
        tag: impl Fn() -> Option<AllocTagRef>,
    ) -> O::Raw {
        let tag = if self.alloc_profiling() { tag() } else { None };
        O::raw_from_packed(self.large_alloc_packed(size, align, tag))
    }

    /// Free memory from [`Allocator::kmalloc`] — or from any cache on the
    /// primary source (the owner is found through the page map).
    ///
    /// # Safety
    /// If `ptr` is allocated, the caller gives it up. Bad pointers are
    /// detected and refused as for [`KmemCache::free`] (same caveat for
    /// double frees without debug flags).
    ///
    /// # Errors
    /// [`FreeError::NotAllocated`] (outside the page map, not slab memory,
    /// or before init), [`FreeError::Misaligned`], [`FreeError::DoubleFree`].
    /// On error nothing changed.
    #[inline]
    pub unsafe fn kfree(&self, ptr: NonNull<u8>) -> Result<(), FreeError> {
        match self.kfree_locate(ptr.as_ptr() as usize) {
            // SAFETY: per our caller; located in `cache`.
            Some((cache, at)) => unsafe { cache.finish_free::<Result<(), FreeError>>(ptr, at) },
            // SAFETY: per our caller; nothing changed.
            None => unsafe { self.kfree_slow(ptr) },
        }
    }

    /// The common case of locating a `kfree`d pointer: one page-map read
    /// names the slab, hence the cache (its owner by construction: no
    /// second lookup); one multiply checks the object start and gives the
    /// index. `None` for anything else, with nothing changed.
    #[inline(always)]
    pub(crate) fn kfree_locate(&self, addr: usize) -> Option<(&'static KmemCache<P>, Located)> {
        if !self.is_ready() {
            return None;
        }
        // A slab entry minus its tag is the 8-aligned slab (see free_locate).
        let slab = self.page_map().get(addr).wrapping_sub(TAG_SLAB);
        if slab & TAG_MASK != 0 {
            return None;
        }
        let slab = slab as *mut Slab;
        // SAFETY: registered slabs are alive and belong to caches of this
        // allocator (same P), alive while they have slabs (a cache in use
        // is never destroyed: `destroy` requires no objects allocated).
        let cache: &'static KmemCache<P> = unsafe { &*(*slab).cache.cast::<KmemCache<P>>() };
        // SAFETY: the page map puts addr in this live slab of `cache`.
        let index = unsafe { cache.object_index(slab, addr) }?;
        Some((cache, Located { slab, index }))
    }

    /// [`Allocator::kfree`] past the fast path, with the error reports.
    ///
    /// # Safety
    /// As for [`Allocator::kfree`].
    #[cold]
    #[inline(never)]
    pub(crate) unsafe fn kfree_slow(&self, ptr: NonNull<u8>) -> Result<(), FreeError> {
        let addr = ptr.as_ptr() as usize;
        if !self.is_ready() {
            return Err(FreeError::NotAllocated { addr });
        }
        let entry = self.page_map().get(addr);
        if entry & TAG_MASK == TAG_SLAB {
            let slab = (entry & !TAG_MASK) as *mut Slab;
            // SAFETY: registered slabs are alive and belong to caches of
            // this allocator (same P), alive while they have slabs.
            let cache = unsafe { &*(*slab).cache.cast::<KmemCache<P>>() };
            // SAFETY: the page map puts addr in this live slab of `cache`.
            let Some(index) = (unsafe { cache.object_index(slab, addr) }) else {
                // KMEMTRACE HOOK: kfree of a pointer inside an object.
                if cache.hot().contains(HotFlags::KMEMTRACE) {
                    self.kmemtrace_free(Some(cache), ptr, false);
                }
                return Err(cache.refuse(FreeError::Misaligned { addr }));
            };
            // SAFETY: located in `cache`; our caller gives it up.
            return unsafe {
                cache.finish_free::<Result<(), FreeError>>(ptr, Located { slab, index })
            };
        }
        // SAFETY: per our caller.
        let result = unsafe { self.kfree_pages(ptr, entry) };
        if let Err(error) = result {
            if self
                .kmemtrace
                .recording_all
                .load(core::sync::atomic::Ordering::Relaxed)
            {
                // KMEMTRACE HOOK: kfree of a pointer that is not ours.
                self.kmemtrace_free(None, ptr, false);
            }
            self.report_bad_free("kmalloc", error);
        }
        result
    }
}
