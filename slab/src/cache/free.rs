//! The free entry point ([`KmemCache::free`]; `kfree` and
//! `GlobalAlloc::dealloc` locate in `allocator/kmalloc.rs` and join at
//! [`KmemCache::finish_free`]), locating a freed pointer (the owner check
//! and the object index), the magazine hit, and the one slow function
//! (`magazine_free_slow`: the double-free checks of the miss, then the
//! magazine miss, a new magazine, or the slab layer). Frees with a
//! bookkeeping flag take [`hooks`](super::hooks).

use core::ptr::{self, NonNull};

use super::{FreeOut, HotFlags, KmemCache, Located, double_free};
use crate::error::FreeError;
use crate::layout::geometry::SlabKind;
use crate::layout::pagemap::{PageEntry, PageSlot};
use crate::magazine::{MAG_FREE_RETRIES, Magazine};
use crate::platform::Platform;
use crate::slab::{SLAB_MAGIC, Slab, small_header};
use crate::sync::IrqGuard;

impl<P: Platform> KmemCache<P> {
    /// Free an object back to this cache.
    ///
    /// Checked: the pointer must be slab memory (`NotAllocated`), of this
    /// cache (`WrongCache`), at an object start (`Misaligned`), and not
    /// free (`DoubleFree`: anywhere, by the free key
    /// (`cache/double_free.rs`) or a debug cache's state word;
    /// for the other keyless caches, on top of this CPU's magazines or back
    /// in its slab). On error nothing has changed, and the error is
    /// reported ([`crate::report`]).
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
        match self.free_locate(obj) {
            // SAFETY: per our caller; located in this cache.
            Some(at) => unsafe { self.finish_free::<Result<(), FreeError>>(obj, at) },
            // SAFETY: per our caller; nothing changed.
            None => unsafe { self.free_slow(obj) },
        }
    }

    /// The common case of locating a freed pointer: the page map (so: on
    /// the primary source) names this cache as the page's owner and `obj`
    /// is an object start. `None` for anything else (the slow path says
    /// why). Reads the object's page-map slot only, no slab header: the
    /// owner test is one compare with `self`, and the slot holds the
    /// slab's first object and the stride magic for the index (a page
    /// that is not a slab page has magic 0, refused by the object-start
    /// test even if its owner word still names this cache).
    #[inline(always)]
    pub(super) fn free_locate(&self, obj: NonNull<u8>) -> Option<Located> {
        let addr = obj.as_ptr() as usize;
        // Off the primary source the map is empty: slow path.
        let slot = self.params.page_map.slot(addr)?;
        // The magic first (Acquire): 0 on a page that is no slab page,
        // whose owner may be stale; the object-start test refuses it.
        let magic = slot.magic();
        if slot.cache() != self as *const Self as usize {
            return None;
        }
        self.index_with(magic, slot.base(), addr)
            .map(|index| Located { index, slot })
    }

    /// Finish a free whose owner check passed — for all three callers
    /// (`KmemCache::free`, `Allocator::kfree`, `GlobalAlloc::dealloc`).
    /// Plain: the magazine hit. Any `FREE_SLOW` flag (profiling's `TAGGED`
    /// included): one test of the flags (in memory with profiling compiled
    /// in), so a cache with profiling compiled in but off pays nothing
    /// more than a plain one. Then, with profiling compiled in, the
    /// profiled free (the whole word equal to
    /// [`HotFlags::PROFILED_USUAL`], whose only free bit is `TAGGED`)
    /// inline, behind a `cold_path` weight that keeps it off the plain
    /// hit's layout: the tag reference at the index the owner check
    /// computed, cleared and uncharged, then the magazine hit.
    /// Without profiling compiled in, recording (`KMEMTRACE` the only
    /// flag) is told apart here instead and goes straight to
    /// [`Self::free_recorded_hit`]. Anything else: a tail call to
    /// [`Self::free_off_hit`]. The result type `O`
    /// is the caller's ([`FreeOut`]: a `Result`, or `()` for the
    /// `GlobalAlloc` edge, where a refused free goes to the free-error
    /// report), so every way out of the hit is a tail call.
    ///
    /// # Safety
    /// `obj` is object `at.index` of the live slab of this cache that
    /// `at.slot` names; if it is allocated, the caller gives it up.
    #[inline(always)]
    pub(crate) unsafe fn finish_free<O: FreeOut>(&self, obj: NonNull<u8>, at: Located) -> O {
        // With profiling compiled in (the kernel), the flags tested in
        // memory (one `test` and a branch), read again off the hit, as in
        // the alloc. Without, loaded once: the recorded free's dispatch
        // uses the loaded word, which LLVM turns into conditional tail
        // calls (the `asm!` test's branch cannot be one) with fewer
        // register moves around the paths off the hit.
        #[cfg(feature = "alloc-profiling")]
        let slow = self.hot_any::<{ HotFlags::FREE_SLOW.bits() }>();
        #[cfg(not(feature = "alloc-profiling"))]
        let hot = self.hot().intersection(HotFlags::FREE_SLOW);
        #[cfg(not(feature = "alloc-profiling"))]
        let slow = !hot.is_empty();
        if slow {
            #[cfg(not(feature = "alloc-profiling"))]
            if hot == HotFlags::KMEMTRACE {
                // Off the hit (else LLVM tests this first, on the plain
                // hit too).
                core::hint::cold_path();
                // SAFETY: per our caller.
                return unsafe { Self::free_recorded_hit::<O>(obj, self, at) };
            }
            // The usual profiled word (whose only free bit is `TAGGED`),
            // compared whole in memory; any other word with `TAGGED` alone
            // of the free bits (profiling switched off, slabs with the
            // header outside the page) is told apart in `free_off_hit`.
            #[cfg(feature = "alloc-profiling")]
            if self.hot_is::<{ HotFlags::PROFILED_USUAL.bits() }>() {
                core::hint::cold_path();
                // SAFETY: per our caller; `TAGGED` is only set for caches
                // with small slabs and tag arrays. The object is given up.
                // (A double free the magazines refuse finds the reference
                // cleared: nothing is uncharged twice.)
                unsafe { self.untag_small_object::<true>(obj, at.slab(), at.index) };
                // SAFETY: per our caller.
                if unsafe { self.magazine_free_hit(obj) } {
                    return O::ok();
                }
                // SAFETY: per our caller; the hit changed nothing.
                return unsafe { self.magazine_free_miss_out::<O>(obj) };
            }
            // SAFETY: per our caller.
            return unsafe { O::off_hit(self, obj, at) };
        }
        // SAFETY: per our caller.
        if unsafe { self.magazine_free_hit(obj) } {
            return O::ok();
        }
        // SAFETY: per our caller; the hit changed nothing.
        unsafe { self.magazine_free_miss_out::<O>(obj) }
    }

    /// A free with some `FREE_SLOW` flag (`hot`, read by the caller) other
    /// than the profiled one ([`Self::finish_free`] takes that inline):
    /// recorded ([`Self::free_recorded_hit`], `KMEMTRACE` the only flag),
    /// else [`Self::free_flagged`]. Out of line, reached by a tail call, so
    /// the plain hit stays a leaf.
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
        slot: *const PageSlot,
    ) -> O {
        // SAFETY: per our caller.
        unsafe { cache.free_off_hit_body(obj, Located { index, slot }) }
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
        slot: *const PageSlot,
    ) -> O {
        // SAFETY: per our caller.
        unsafe { self.free_off_hit_body(obj, Located { index, slot }) }
    }

    /// The body of [`Self::free_off_hit`].
    ///
    /// # Safety
    /// As for [`Self::finish_free`].
    #[inline(always)]
    pub(super) unsafe fn free_off_hit_body<O: FreeOut>(&self, obj: NonNull<u8>, at: Located) -> O {
        // The flags read again (the hit tested them in memory).
        let hot = self.hot().intersection(HotFlags::FREE_SLOW);
        if hot == HotFlags::KMEMTRACE {
            // SAFETY: per our caller (a tail call, the arguments in the
            // order they came).
            return unsafe { Self::free_recorded_hit::<O>(obj, self, at) };
        }
        #[cfg(feature = "alloc-profiling")]
        if hot == HotFlags::TAGGED {
            // SAFETY: per our caller; `TAGGED` is only set for caches with
            // small slabs and tag arrays. As the inline profiled free in
            // `finish_free`, for the other words whose only free bit is
            // `TAGGED`.
            unsafe { self.untag_small_object::<true>(obj, at.slab(), at.index) };
            // SAFETY: per our caller.
            if unsafe { self.magazine_free_hit(obj) } {
                return O::ok();
            }
            // SAFETY: per our caller; the hit changed nothing.
            return unsafe { self.magazine_free_miss_out::<O>(obj) };
        }
        // SAFETY: per our caller (a tail call: no frame on the way to the
        // recorded hit).
        unsafe { self.free_flagged_result::<O>(obj, at) }
    }

    /// A recorded free (kmemtrace on, no other slow flag, so the cache is
    /// keyed): the magazine hit with its event written inside the hit's
    /// section (the CPU read once, no second guard, nothing on this CPU
    /// reuses the object before its free is recorded), else the recorded
    /// slow path ([`Self::free_flagged`], which records the outcome).
    ///
    /// # Safety
    /// As for [`Self::finish_free`].
    /// Its own function, reached by a tail call (or, for a `Result`
    /// returned through memory, by the caller's call), and a leaf on the hit
    /// (the miss is a tail call of [`Self::free_flagged_result`]): no
    /// register saved, no stack frame.
    #[inline(never)]
    unsafe fn free_recorded_hit<O: FreeOut>(obj: NonNull<u8>, cache: &Self, at: Located) -> O {
        let record = || {
            // SAFETY: inside the hit's section: this CPU's ring is ours.
            unsafe { cache.owner().kmemtrace_free_on(P::cpu_offset(), cache, obj) };
        };
        // SAFETY: per our caller (keyed: see above).
        let pushed = unsafe { cache.magazine_free_hit_then::<true>(obj, record) };
        if pushed {
            return O::ok();
        }
        // SAFETY: per our caller; the hit changed nothing.
        unsafe { cache.free_flagged_result::<O>(obj, at) }
    }

    /// [`Self::free_flagged`] in the caller's result type, out of line.
    ///
    /// # Safety
    /// As for [`Self::finish_free`].
    #[inline(never)]
    unsafe fn free_flagged_result<O: FreeOut>(&self, obj: NonNull<u8>, at: Located) -> O {
        // SAFETY: per our caller.
        O::from_result(self, unsafe { self.free_flagged(obj, at.slab()) })
    }

    /// [`Self::magazine_free_slow`] in the caller's result type.
    ///
    /// # Safety
    /// As for [`Self::magazine_free`].
    #[cold]
    #[inline(never)]
    pub(super) unsafe fn magazine_free_miss_out<O: FreeOut>(&self, obj: NonNull<u8>) -> O {
        // SAFETY: per our caller.
        O::from_result(self, unsafe { self.magazine_free_slow(obj) })
    }

    /// The hit (keyed or not, as the cache is), else the out-of-line miss
    /// (which refuses every double free the key finds, and that of the
    /// object on top of `loaded` or `prev`).
    ///
    /// # Safety
    /// `obj` is a constructed, busy object of this cache that the caller
    /// gives up (validated by the caller).
    #[inline(always)]
    pub(crate) unsafe fn magazine_free(&self, obj: NonNull<u8>) -> Result<(), FreeError> {
        // SAFETY: per our caller; keyed as the cache says.
        let hit = unsafe {
            if self.is_keyed() {
                self.magazine_free_hit_as::<true>(obj)
            } else if self.key_place.marks() {
                // Keyless, marked elsewhere (`double_free.rs`): the miss
                // tests and sets the mark.
                false
            } else {
                self.magazine_free_hit_as::<false>(obj)
            }
        };
        if hit {
            return Ok(());
        }
        // SAFETY: per our caller; the hit changed nothing.
        unsafe { self.magazine_free_slow(obj) }
    }

    /// The magazine hit of a free of a keyed cache (every cache on the
    /// plain and profiled hits): [`Self::magazine_free_hit_as`].
    ///
    /// # Safety
    /// As for [`Self::magazine_free_hit_as`], the cache keyed.
    #[inline(always)]
    pub(crate) unsafe fn magazine_free_hit(&self, obj: NonNull<u8>) -> bool {
        // SAFETY: per our caller.
        unsafe { self.magazine_free_hit_as::<true>(obj) }
    }

    /// The magazine hit of a free: push `obj` on this CPU's `loaded`.
    /// False (nothing changed but the key's test) if `loaded` is full or
    /// absent, or if `obj` holds the free key (`KEYED`) or is on top of
    /// `loaded` (keyless).
    ///
    /// # Safety
    /// `obj` is a constructed, busy object of this cache that the caller
    /// gives up if this returns true; `KEYED` only if the cache is keyed.
    #[inline(always)]
    pub(crate) unsafe fn magazine_free_hit_as<const KEYED: bool>(&self, obj: NonNull<u8>) -> bool {
        if KEYED && crate::restart::enabled::<P>() {
            debug_assert!(self.has_magazines() && P::cpu_id() <= self.last_cpu);
            // SAFETY: as in `magazine_alloc_hit`; per our caller, obj is a
            // busy object of this keyed cache, given up if pushed.
            return unsafe {
                crate::magazine::PcpuCache::restartable_push::<Self>(
                    (self as *const Self).cast(),
                    P::cpu_offset(),
                    obj,
                )
            };
        }
        // SAFETY: per our caller.
        unsafe { self.magazine_free_hit_then::<KEYED>(obj, || {}) }
    }

    /// [`Self::magazine_free_hit_as`], running `then` inside the hit's
    /// section once `obj` is pushed (the recorded free's event).
    ///
    /// # Safety
    /// As for [`Self::magazine_free_hit_as`].
    #[inline(always)]
    unsafe fn magazine_free_hit_then<const KEYED: bool>(
        &self,
        obj: NonNull<u8>,
        then: impl FnOnce(),
    ) -> bool {
        let Some(mut pcpu) = self.pcpu_lock() else {
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
        if KEYED {
            // The free key ([`super::double_free`]): an object holding it
            // was freed already (the miss confirms and refuses); else it
            // gets it. Load, compare, store.
            let key = pcc.free_key;
            // SAFETY: per our caller, an object of this keyed cache.
            if unsafe { double_free::holds_key(obj, key) } {
                return false;
            }
            // SAFETY: as above; the caller gives it up (pushed below).
            unsafe { double_free::write_key(obj, key) };
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
        then();
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
        if unsafe { self.is_double_free(obj) } {
            return Err(self.refuse(FreeError::DoubleFree {
                addr: obj.as_ptr() as usize,
            }));
        }
        // SAFETY: per our caller, given up.
        unsafe { self.key_freed(obj) };
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

    /// [`KmemCache::free`] past the fast path: locate with error reports,
    /// then finish.
    ///
    /// # Safety
    /// As for [`KmemCache::free`].
    #[cold]
    #[inline(never)]
    pub(super) unsafe fn free_slow(&self, obj: NonNull<u8>) -> Result<(), FreeError> {
        let addr = obj.as_ptr() as usize;
        // KFENCE HOOK: a sampled object is in no slab page (and off the
        // primary source a bufctl cache's hash would not know it).
        if let Some(result) = self.owner().kfence_free(addr, Some(self)) {
            if self.hot().contains(HotFlags::KMEMTRACE) {
                self.owner().kmemtrace_free(Some(self), obj, result.is_ok());
            }
            return result;
        }
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
        // Off the primary source (the fast path locates every other
        // pointer it accepts): a small slab by its header, or null for a
        // bufctl cache, where the hash decides. Every flag's free with
        // it, plain ones included.
        // SAFETY: per our caller; `locate` checked the slab is ours (or
        // left it to the hash) and addr an object start.
        unsafe { self.free_flagged(obj, slab) }
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

    /// Why `addr` (page-map entry `entry`) is not one of our slabs' pages.
    #[cold]
    #[inline(never)]
    pub(super) fn locate_error(&self, addr: usize, entry: PageEntry) -> FreeError {
        if !entry.is_live() {
            return FreeError::NotAllocated { addr };
        }
        let Some(slab) = entry.slab() else {
            return FreeError::WrongCache { addr, owner: None };
        };
        let slab = slab as *mut Slab;
        // SAFETY: registered slabs are alive; slabs on the primary source
        // belong to caches of this allocator (same P), alive while they
        // have slabs.
        let other = unsafe { &*(*slab).cache.cast::<KmemCache<P>>() };
        FreeError::WrongCache {
            addr,
            owner: Some(other.static_name()),
        }
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

    /// Name with the cache's lifetime, for error reports.
    pub(super) fn static_name(&'static self) -> &'static str {
        self.name()
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
