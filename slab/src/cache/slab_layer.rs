//! The cache and its slab layer ([`crate::slab::SlabLayer`]): the
//! cache's calls into it, and what the layer asks of the cache
//! ([`SlabOwner`]: identity, error sink, bootstrap caches, debug hooks).

use core::ptr::{self, NonNull};

use core::sync::atomic::Ordering;

use super::double_free::KeyPlace;
use super::{KmemCache, OwnerCache};
use crate::constructor::{ObjectInit, ObjectRef};
use crate::error::AllocError;
use crate::layout::geometry::SlabKind;
use crate::magazine::{
    MAG_MAX_ROUNDS, MAGAZINE_ROUNDS, Magazine, PcpuSynced, no_magazine, rounds_of,
};
use crate::platform::Platform;
use crate::platform::{PAGE_SIZE, PageSource};
use crate::reports::error::ErrorReport;
use crate::slab::{Metadata, Slab, SlabLayer, SlabOwner, SlabParams};
use crate::sync::IrqGuard;

/// A refill's batch may reach this many objects even where a page holds
/// fewer ([`KmemCache::refill_batch`]): objects above 512 bytes, of which
/// a page held one to seven, so every allocation of a 3008-byte class
/// went down alone (the shell replay's 20 such: 9.6 Ir/op of its 111).
/// The batch still stops at half a magazine and one (4 objects above
/// 4.5 KiB) and at its slab's end: it takes no page the one object
/// would not have. Linux SLAB's `batchcount` is 12 for objects of
/// 1-4 KiB.
const REFILL_MIN_BATCH: usize = 8;

/// Most objects one refill takes: half the largest magazine and one
/// ([`KmemCache::refill_batch`]).
const MAX_REFILL_BATCH: usize = MAG_MAX_ROUNDS / 2 + 1;

/// The slab layer's entry points used by the rest of the crate.
impl<P: Platform> KmemCache<P> {
    /// The alloc miss's trip to the slab layer (`loaded`, `prev` and the
    /// depot had no round): one object for the caller and, taken in the
    /// same pass under one slab lock, up to a magazine's worth more for
    /// this CPU's `loaded` (Bonwick & Adams 2001 leave the magazine empty
    /// and go down once per object; SLUB's `kmem_cache_alloc_bulk` and
    /// Linux SLAB's `cache_alloc_refill` take a batch): the next
    /// allocations are hits. From one slab only (the one the layer would
    /// give the next object from, or one new slab), so a refill never
    /// takes a page the single object would not have. The rounds hold the
    /// free key, as every free leaves them (`double_free.rs`). Keyed
    /// caches only; the others take one object, as before.
    ///
    /// # Errors
    /// As for [`SlabLayer::alloc_batch`];
    /// [`AllocError::ConstructorFailed`] if the cache's constructor
    /// refused the object (given back to the slab layer).
    pub(crate) fn slab_refill(&self) -> Result<NonNull<u8>, AllocError> {
        let nr_wanted = self.refill_batch();
        if nr_wanted <= 1 {
            // One object, constructed here (the slab layer hands out raw
            // objects), and given back unconstructed if the constructor
            // refuses.
            let obj = SlabLayer::alloc(self)?;
            if let Some(ctor) = self.params.ctor
                // SAFETY: a fresh object of our slab layer: obj_size
                // bytes, 8-aligned (every stride is a multiple of 8 and
                // slabs start on a page), nobody else's until we return it.
                && ctor(unsafe { ObjectInit::new(obj, self.params.obj_size) }).is_err()
            {
                // SAFETY: obj came from our slab layer just now,
                // unconstructed: no destructor to run.
                unsafe { SlabLayer::free_objects(self, &[obj.as_ptr()]) };
                return Err(AllocError::ConstructorFailed);
            }
            self.nr_allocs_direct.fetch_add(1, Ordering::Relaxed);
            return Ok(obj);
        }
        let mut batch = [ptr::null_mut(); MAX_REFILL_BATCH];
        let nr = SlabLayer::alloc_batch(self, &mut batch[..nr_wanted])?;
        let (&first, rounds) = batch[..nr].split_first().ok_or(AllocError::OutOfMemory)?;
        if self.kind == SlabKind::Bufctl {
            // A bufctl slab never touches its objects: the rounds get
            // their key here (a small slab's hold it already, checked as
            // they were taken).
            for &round in rounds {
                // SAFETY: an object of ours, nobody else's.
                unsafe { self.mark_key(NonNull::new_unchecked(round), true) };
            }
        }
        let nr_loaded = self.load_rounds(rounds);
        if nr_loaded < rounds.len() {
            // SAFETY: objects of our slabs, nobody else's (no destructor:
            // a keyed cache).
            unsafe { self.slab_free_objects(&rounds[nr_loaded..]) };
        }
        self.nr_allocs_direct.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the slab layer hands out no null object.
        Ok(unsafe { NonNull::new_unchecked(first) })
    }

    /// How many objects [`Self::slab_refill`] takes in one trip down: 1
    /// for a cache that is not keyed (no constructor, destructor or debug
    /// flags, not `NOTOUCH` nor bootstrap: `double_free::keyed`; the
    /// others go down once per object, as before; a keyed cache's refill
    /// costs no constructor calls, and its rounds need only their key)
    /// and for a cache's first allocation (boot's); else a batch that
    /// doubles with each trip down (1, 2, 4, ... objects), up to half a
    /// magazine and one (Linux SLAB's `batchcount`, leaving room for the
    /// frees that follow) and a page of objects, or
    /// [`REFILL_MIN_BATCH`] if a page holds fewer: a cache allocated
    /// from once takes one object, and the rounds resting in magazines
    /// stay few (`partitioning_memory_cost`: with two pages, 8
    /// partitioned copies of every class held +5.05 % of live against
    /// the 5 % bound; one page costs the shell replay ~8 Ir/op,
    /// docs/BENCHMARKS.md; no page bound at all, the stress replay +17
    /// pages); and no more than this CPU's magazine has room for, and
    /// one ([`Self::refill_room`]: a magazine is made when the CPU has
    /// none).
    fn refill_batch(&self) -> usize {
        if self.key_place != KeyPlace::Word(0) || !self.has_magazines() {
            return 1;
        }
        let nr_trips = self.nr_allocs_direct.load(Ordering::Relaxed);
        if nr_trips == 0 {
            return 1;
        }
        let capacity = MAGAZINE_ROUNDS[self.depot.magtype()];
        let nr_wanted = (capacity / 2 + 1)
            .min(MAX_REFILL_BATCH)
            .min(1 << nr_trips.min(6))
            .min((PAGE_SIZE / self.params.stride).max(REFILL_MIN_BATCH));
        if nr_wanted <= 1 {
            return 1;
        }
        nr_wanted.min(self.refill_room(nr_wanted - 1) + 1)
    }

    /// Room for up to `nr_rounds` rounds of a refill in this CPU's
    /// `loaded` (an empty `prev` swapped in if `loaded` is gone): how
    /// many it has room for now. A CPU with no magazine, or whose empty
    /// `loaded` holds fewer than the refill would and is smaller than its
    /// type, gets a new empty magazine of that type, the old one freed.
    /// The type: the depot's once a free has made a magazine for the
    /// cache (its objects come back: a small magazine would only add
    /// misses, the stress replay's +6 Ir/op); before that
    /// ([`refill_magtype`]) a cache only allocated from holds one
    /// 14-round magazine (128 B), made on its first batch, where a
    /// magazine of the depot's type (496 B for a small object) would
    /// cost every cold copy of a partitioned class as much
    /// (`partitioning_memory_cost`). Bonwick & Adams 2001 §3.3 grow a
    /// cache's magazines on depot contention. Once the cache has freed,
    /// an empty `loaded` smaller than the depot's type gives way to one
    /// of that type even where its room would do: a 14-round refill
    /// magazine kept by a class a page holds 14 or fewer objects of
    /// (refills of 8) sent every 14th allocation down for good
    /// (`bench/profile.sh mixed magpie`: 55.2 against 54.1 instructions
    /// an operation; the free miss's part:
    /// [`crate::magazine::is_refill_magazine`]).
    /// 0 in an interrupt handler that interrupted this CPU's hit, or
    /// when no magazine can be had.
    fn refill_room(&self, nr_rounds: usize) -> usize {
        let (room, capacity) = self.loaded_room();
        let magtype = self.depot.new_magtype(false);
        if capacity >= MAGAZINE_ROUNDS[magtype]
            || (room >= nr_rounds && (room < capacity || !self.depot.freed()))
        {
            return room;
        }
        // Made with no lock held and interrupts on, as the free's new
        // magazines (`free_slow`): allocating from a magazine cache
        // cannot deadlock.
        let Ok(mag) = self.new_magazine_of(magtype) else {
            return room;
        };
        let irq = IrqGuard::<P>::new();
        let (room, unused) = match self.pcpu_lock_here(&irq) {
            None => (0, mag),
            Some(mut locked) => {
                let mut pcc = PcpuSynced::new(locked.get());
                // Checked again: an interrupt handler may have freed
                // rounds into `loaded` or given this CPU a magazine.
                let loaded = pcc.loaded;
                // SAFETY: this CPU's magazines (or the absent one, of
                // capacity 0), interrupts off; `mag` a live magazine.
                let unused = unsafe {
                    if rounds_of(loaded) == 0 && (*loaded).capacity < (*mag).capacity {
                        pcc.loaded = mag;
                        loaded
                    } else {
                        mag
                    }
                };
                let loaded = pcc.loaded;
                // SAFETY: as above.
                let room = unsafe { (*loaded).capacity as usize - rounds_of(loaded) };
                (room, unused)
            }
        };
        drop(irq);
        if unused != no_magazine() {
            // SAFETY: an empty magazine no per-CPU cache or depot list
            // holds (a per-CPU cache's has a null `next`, as a new one):
            // ours alone.
            unsafe { self.free_magazines(&[unused]) };
        }
        room
    }

    /// This CPU's `loaded` (an empty `prev` swapped in if `loaded` is
    /// gone): `(room, capacity)`, rounds it has room for and rounds it
    /// holds when full; `(0, 0)` with no magazine, `(0, usize::MAX)` in
    /// an interrupt handler that interrupted this CPU's hit (no magazine
    /// is made then).
    fn loaded_room(&self) -> (usize, usize) {
        let irq = IrqGuard::<P>::new();
        let Some(mut locked) = self.pcpu_lock_here(&irq) else {
            return (0, usize::MAX);
        };
        let mut pcc = PcpuSynced::new(locked.get());
        if pcc.loaded == no_magazine()
            && pcc.prev != no_magazine()
            // SAFETY: this CPU's magazines, interrupts off.
            && unsafe { rounds_of(pcc.prev) } == 0
        {
            pcc.swap_magazines();
        }
        let loaded = pcc.loaded;
        // SAFETY: a real magazine owned by this CPU, or the absent one
        // (capacity 0, no rounds), interrupts off, its header exact.
        unsafe {
            let capacity = (*loaded).capacity as usize;
            (capacity - rounds_of(loaded), capacity)
        }
    }

    /// Push `rounds` (objects of a keyed cache from the slab layer) onto this
    /// CPU's `loaded`, each marked freed, as far as it has room; a CPU
    /// whose `loaded` is gone gets an empty `prev` swapped in (the
    /// magazine `refill_room` found or made; the caller gives back what
    /// did not go in, if an interrupt handler took the room since).
    /// Returns how many went in (0 in an interrupt handler that
    /// interrupted this CPU's hit, or with no magazine to be had).
    fn load_rounds(&self, rounds: &[*mut u8]) -> usize {
        let irq = IrqGuard::<P>::new();
        let Some(mut locked) = self.pcpu_lock_here(&irq) else {
            return 0;
        };
        let mut pcc = PcpuSynced::new(locked.get());
        if pcc.loaded == no_magazine() {
            // SAFETY: this CPU's magazines, interrupts off.
            if pcc.prev != no_magazine() && unsafe { rounds_of(pcc.prev) } == 0 {
                pcc.swap_magazines();
            } else {
                return 0;
            }
        }
        // The rounds hold the free key: copied as they are, as many
        // as `loaded` has room for.
        let loaded = pcc.loaded;
        // SAFETY: a real magazine owned by this CPU, interrupts off,
        // its header exact (`PcpuSynced`); its slots up to `capacity`
        // are in its object.
        let nr = unsafe {
            let nr_rounds = (*loaded).nr_rounds as usize;
            let nr = rounds
                .len()
                .min(((*loaded).capacity as usize).saturating_sub(nr_rounds));
            ptr::copy_nonoverlapping(rounds.as_ptr(), Magazine::slots(loaded).add(nr_rounds), nr);
            (*loaded).nr_rounds = (nr_rounds + nr) as u32;
            nr
        };
        pcc.nr_rounds_exchanged = pcc.nr_rounds_exchanged.wrapping_add(nr as u64);
        nr
    }

    /// Destruct `objs` (the cache's destructor, if any) and return them
    /// to the slab layer ([`SlabLayer::free_objects`]: one lock
    /// acquisition).
    ///
    /// # Safety
    /// As [`SlabLayer::free_objects`]; the objects are constructed.
    pub(crate) unsafe fn slab_free_objects(&self, objs: &[*mut u8]) {
        if let Some(dtor) = self.params.dtor {
            let constructed = self.params.ctor.is_some();
            for &obj in objs {
                if let Some(obj) = NonNull::new(obj) {
                    // SAFETY: per the caller, an object of ours (8-aligned)
                    // with nobody else; constructed, so initialised, if the
                    // cache has a constructor (callers give objects back
                    // constructed: `Ctor`).
                    dtor(unsafe { ObjectRef::new(obj, self.params.obj_size, constructed) });
                }
            }
        }
        // SAFETY: per the caller, destructed now.
        unsafe { SlabLayer::free_objects(self, objs) }
    }

    /// [`SlabLayer::reap`].
    pub(crate) fn reap_slabs(&self) -> usize {
        SlabLayer::reap(self)
    }

    /// [`SlabLayer::discard_all`].
    ///
    /// # Safety
    /// As [`SlabLayer::discard_all`].
    pub(crate) unsafe fn discard_all_slabs(&self) {
        // SAFETY: per the caller.
        unsafe { SlabLayer::discard_all(self) }
    }
}

impl<P: Platform> SlabOwner for KmemCache<P> {
    type Platform = P;

    #[inline]
    fn id(&self) -> *const () {
        (self as *const Self).cast()
    }

    fn name(&self) -> &str {
        KmemCache::name(self)
    }

    fn report(&self, report: ErrorReport) {
        self.owner().report_error(report);
    }

    fn reap_for_pressure(
        &self,
        source: &'static dyn PageSource,
        nr_pages: usize,
    ) -> Option<NonNull<u8>> {
        self.owner().reap_for_pressure(source, nr_pages)
    }

    #[inline]
    fn slab(&self) -> (&SlabLayer<P>, &SlabParams) {
        (&self.slab, &self.params)
    }

    fn metadata(&self, which: Metadata) -> &Self {
        self.owner().cache(owner_cache(which))
    }

    fn metadata_source(&self) -> &'static dyn PageSource {
        self.owner().primary_source()
    }

    unsafe fn debug_slab(&self, slab: *mut Slab, fresh: bool) {
        let Some(layout) = self.debug.as_ref() else {
            return;
        };
        // SAFETY: per our caller, the slab is alive.
        let base = unsafe { (*slab).base };
        for index in 0..self.params.nr_objs_per_slab {
            let addr = base + index * self.params.stride;
            // SAFETY: object `index` of a slab of ours nobody else
            // touches (per our caller); its stride holds the debug slot.
            unsafe {
                if fresh {
                    self.debug_init_object(layout, addr);
                } else if let Some(report) =
                    self.debug_verify_object(layout, addr, slab as usize, true)
                {
                    self.owner().report_error(report);
                }
            }
        }
    }
}

/// The bootstrap cache of a kind of slab metadata.
fn owner_cache(which: Metadata) -> OwnerCache {
    match which {
        Metadata::Slab => OwnerCache::Slab,
        Metadata::Bufctl => OwnerCache::Bufctl,
        #[cfg(feature = "trace-table")]
        Metadata::TraceRecord => OwnerCache::Trace,
        #[cfg(feature = "alloc-profiling")]
        Metadata::TagArray(bytes) => OwnerCache::TagArray(bytes),
    }
}
