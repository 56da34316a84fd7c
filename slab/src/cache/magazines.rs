//! The cache's side of the magazine layer: this CPU's per-CPU cache
//! (its in-use flag), another CPU's by a cross-CPU call, the misses of
//! both directions (swap with `prev`, trade with the depot), new
//! magazines, and draining magazines back to the slab layer.

use core::ptr::{self, NonNull};

use super::free::top_round;
use super::{KmemCache, OwnerCache};
use crate::error::AllocError;
use crate::magazine::{
    Depot, MAGAZINE_ROUNDS, Magazine, PcpuCache, PcpuInner, PcpuSynced, Stale, no_magazine,
    rounds_of,
};
use crate::platform::Platform;
use crate::slab::SlabLayer;
use crate::sync::{IrqGuard, LocalLocked};

/// This CPU's per-CPU cache, held through its in-use flag.
pub(crate) type PcpuLocked<'a, P> = LocalLocked<'a, P, PcpuInner>;

/// A magazine pointer handed over by its CPU in a cross-CPU call.
struct SendMagazine(*mut Magazine);

// SAFETY: the magazine is owned by whoever holds the value (its CPU gave
// it up).
unsafe impl Send for SendMagazine {}

impl Default for SendMagazine {
    fn default() -> Self {
        SendMagazine(ptr::null_mut())
    }
}

impl<P: Platform> KmemCache<P> {
    /// Whether the cache has a magazine layer, hence a per-CPU array:
    /// every cache but the bootstrap ones (the unborn kmalloc stubs among
    /// them), whose allocs and frees never reach a magazine.
    #[inline]
    pub(crate) fn has_magazines(&self) -> bool {
        !self.is_bootstrap()
    }

    /// The per-CPU array, one `PcpuCache` per CPU (this CPU's at
    /// `+ Platform::cpu_offset()`): it follows the struct in its
    /// `kmem_cache` object at [`Self::PCPU_OFFSET`], so its address is
    /// computed from the cache's, with no load (the hits fold the offset
    /// into their displacements). Only for a cache with magazines
    /// ([`Self::has_magazines`]); a bootstrap cache's address means
    /// nothing. From the address as an integer, with its exposed
    /// provenance (the array lies past `self`'s struct, in the same
    /// `kmem_cache` object).
    #[inline(always)]
    pub(crate) fn pcpu_array(&self) -> *mut PcpuCache {
        core::ptr::with_exposed_provenance_mut(
            (self as *const Self).addr().wrapping_add(Self::PCPU_OFFSET),
        )
    }

    /// This CPU's per-CPU cache for code off the hits (the hits take it
    /// by its in-use flag themselves: `alloc_hit`,
    /// `free_hit`), with interrupts off
    /// (`irq`); `None` if a hit this code interrupted holds the per-CPU
    /// cache.
    #[inline]
    pub(crate) fn pcpu_lock_here<'g>(&'g self, irq: &'g IrqGuard<P>) -> Option<PcpuLocked<'g, P>> {
        let _ = irq;
        debug_assert!(self.has_magazines() && P::cpu_id() <= self.last_cpu);
        // SAFETY: pcpu has nr_cpus slots of CPU_SLOT_BYTES, alive as long
        // as the cache; cpu_offset() is cpu_id() * CPU_SLOT_BYTES with
        // cpu_id() < nr_cpus (the Platform contract): this CPU's slot;
        // interrupts are off (`irq`).
        unsafe { (*self.pcpu_array().byte_add(P::cpu_offset())).try_lock_here::<P>() }
    }

    /// Run `f` on CPU `cpu`'s per-CPU cache of this cache, on that CPU
    /// (a [cross-CPU call](Platform::cross_cpu_call)). Not for bootstrap
    /// caches; `cpu < nr_cpus`. Called with no allocator lock held.
    pub(crate) fn on_cpu<R: Send + Default>(
        &self,
        cpu: usize,
        f: impl Fn(&mut PcpuInner) -> R + Sync,
    ) -> R {
        debug_assert!(self.has_magazines() && cpu <= self.last_cpu);
        let result = spin::Mutex::new(None);
        // SAFETY: cpu < nr_cpus, the array's length; alive with the cache.
        let pcpu: &PcpuCache = unsafe { &*self.pcpu_array().add(cpu) };
        loop {
            P::cross_cpu_call(cpu, &|| {
                // SAFETY: runs as CPU `cpu`, exclusive with its
                // interrupts-off sections (the Platform contract); the
                // flag says whether it interrupted a hit there.
                if let Some(mut locked) = unsafe { pcpu.try_lock_here::<P>() } {
                    let mut pcc = PcpuSynced::new(locked.get());
                    *result.lock() = Some(f(&mut pcc));
                }
            });
            if let Some(value) = result.lock().take() {
                return value;
            }
            // The call interrupted a hit on that CPU, which finishes as
            // soon as the call returns: try again. Not from an interrupt
            // handler (this CPU's own hit cannot finish under it): then
            // nothing.
            if P::in_interrupt() {
                return R::default();
            }
            core::hint::spin_loop();
        }
    }

    /// Length of the per-CPU array (for caches that have one).
    #[inline]
    pub(crate) fn nr_cpus(&self) -> usize {
        self.last_cpu + 1
    }

    /// A new empty magazine of the depot's type, from its
    /// `kmem_magazine_<rounds>` bootstrap cache, for a free (noted in the
    /// depot: the cache's refills make magazines of its type from then).
    pub(crate) fn new_magazine(&self) -> Result<*mut Magazine, AllocError> {
        self.new_magazine_of(self.depot.new_magtype(true))
    }

    /// A new empty magazine of type `magtype` (an index into
    /// [`MAGAZINE_ROUNDS`]), from its `kmem_magazine_<rounds>` bootstrap
    /// cache.
    pub(crate) fn new_magazine_of(&self, magtype: usize) -> Result<*mut Magazine, AllocError> {
        let mem = SlabLayer::alloc(self.owner().cache(OwnerCache::Magazine(magtype)))?;
        // SAFETY: a fresh object of the magazine type's cache:
        // magazine_bytes(capacity) bytes, 8-aligned, ours.
        Ok(unsafe { Magazine::init(mem, MAGAZINE_ROUNDS[magtype]) })
    }

    /// Give this CPU an empty magazine of the depot's type as its
    /// `loaded`, if it has none (a new cache on a small source:
    /// `Kmem::create_cache`); nothing if no magazine can be had.
    pub(crate) fn load_first_magazine(&self) {
        if !self.has_magazines() {
            return;
        }
        let Ok(mag) = self.new_magazine_of(self.depot.magtype()) else {
            return;
        };
        let irq = IrqGuard::<P>::new();
        let unused = match self.pcpu_lock_here(&irq) {
            Some(mut locked) => {
                let mut pcc = PcpuSynced::new(locked.get());
                if pcc.loaded == no_magazine() {
                    pcc.loaded = mag;
                    no_magazine()
                } else {
                    mag
                }
            }
            None => mag,
        };
        drop(irq);
        if unused != no_magazine() {
            // SAFETY: a new empty magazine nobody else holds.
            unsafe { self.free_magazines(&[unused]) };
        }
    }

    /// Empty every per-CPU cache and the depot: rounds are destructed and
    /// go back to the slab layer, magazines to their `kmem_magazine_<N>`.
    ///
    /// CPU by CPU, a cross-CPU call hands that CPU's two magazines over;
    /// then the depot lock is held only to detach its lists. Nothing is
    /// freed on the other CPU or under a lock (destructors and the
    /// magazine caches run here with no lock held). CPUs may allocate and
    /// free throughout: whatever they put in magazines after their turn
    /// stays there.
    pub(crate) fn drain_magazines(&self) {
        if !self.has_magazines() {
            return;
        }
        for cpu in 0..self.nr_cpus() {
            let (loaded, prev) = self.on_cpu(cpu, |pcc| {
                let (loaded, prev) = pcc.take_magazines();
                (SendMagazine(loaded), SendMagazine(prev))
            });
            for mag in [loaded.0, prev.0] {
                if mag != crate::magazine::no_magazine() {
                    // SAFETY: handed over by its CPU; ours alone now (a
                    // per-CPU cache's magazine is linked to none: its
                    // `next` is null).
                    unsafe { self.free_magazines(&[mag]) };
                }
            }
        }
        let (full, empty) = self.depot.take_all();
        // SAFETY: detached from the depot; ours alone now.
        unsafe { self.free_magazines(&[full, empty]) };
    }

    /// Free detached lists of magazines (linked through `next`; null:
    /// none), rounds and all: each magazine's rounds (destructed) to the
    /// slab layer and the magazine itself to its
    /// `kmem_magazine_<capacity>` cache. No lock held: the lists are ours.
    ///
    /// # Safety
    /// Every magazine on the lists is a live magazine of this cache
    /// referenced by no per-CPU cache or depot list.
    pub(crate) unsafe fn free_magazines(&self, lists: &[*mut Magazine]) {
        for &list in lists {
            let mut mag = list;
            while !mag.is_null() {
                // SAFETY: per the caller, the magazine and its rounds are
                // ours.
                unsafe {
                    let next = Magazine::next_of(mag);
                    // Rounds without their free's mark stay out of the
                    // slab layer (`double_free.rs`: a use after free's
                    // write, or a copy of an object handed out already).
                    self.slab_free_objects(
                        self.intact_rounds(crate::magazine::held_rounds_mut(mag)),
                    );
                    let capacity = (*mag).capacity as usize;
                    let magtype = MAGAZINE_ROUNDS
                        .iter()
                        .position(|&rounds| rounds == capacity)
                        .expect("a magazine's capacity is a magazine type's");
                    self.owner()
                        .cache(OwnerCache::Magazine(magtype))
                        .slab_free_objects(&[mag.cast()]);
                    mag = next;
                }
            }
        }
    }

    /// Test support: call `f` with every round in every per-CPU cache
    /// (read on each CPU in turn) and in the depot, so a test can check
    /// that no object rests in two places.
    #[cfg(test)]
    pub(crate) fn for_each_round(&self, mut f: impl FnMut(*mut u8)) {
        extern crate alloc;
        if self.has_magazines() {
            for cpu in 0..self.nr_cpus() {
                let rounds = self.on_cpu(cpu, |pcc| {
                    let mut rounds = alloc::vec::Vec::new();
                    for mag in [pcc.loaded, pcc.prev] {
                        // SAFETY: this CPU's own magazines, read on it.
                        let held = unsafe { crate::magazine::held_rounds(mag) };
                        rounds.extend(held.iter().map(|&round| round as usize));
                    }
                    rounds
                });
                for round in rounds {
                    f(round as *mut u8);
                }
            }
        }
        let depot = self.depot.lock();
        depot.for_each_magazine(|mag| {
            // SAFETY: a magazine on a depot list, under the depot lock.
            for &round in unsafe { crate::magazine::held_rounds(mag) } {
                f(round);
            }
        });
    }
}

impl<P: Platform> KmemCache<P> {
    /// `loaded` is empty (or absent): swap with `prev` if it has rounds,
    /// else trade with the depot. `None` if the depot has no full
    /// magazine either (the caller goes to the slab layer). An empty
    /// magazine of an older type the depot did not keep is freed after
    /// interrupts are back on.
    /// A round without the mark its free left is reported and kept from
    /// every caller (`cache/alloc.rs`, `alloc_hit`): the next is taken.
    ///
    /// Until a free has made a magazine for the cache
    /// ([`Depot::freed`]), neither `prev` nor the depot can hold a round:
    /// every magazine the depot ever holds came from such a free (`push_empty` in
    /// `free_slow`, then the exchanges), and `prev` is only ever one the
    /// depot or a free gave. The miss is skipped then (~90 instructions
    /// a cache's first allocations save, the boot replay's); a stale
    /// read only sends an allocation to the slab layer. Never skipped on
    /// a small source, whose caches are born with a magazine for their
    /// frees (`load_first_magazine`, `FREED` set): a round the alloc hit
    /// left in `loaded` there (without its mark: a use after free's
    /// write, a double free's second copy) must reach the miss, which
    /// reports it (`attack_matrix`, on a 2 MiB source).
    pub(super) fn magazine_alloc_miss(&self) -> Option<NonNull<u8>> {
        if !self.depot.freed() {
            return None;
        }
        loop {
            let obj = self.magazine_miss(
                pop_round,
                // SAFETY: this CPU's magazines, interrupts off.
                |pcc| unsafe { rounds_of(pcc.prev) } > 0,
                |depot, pcc| depot.exchange_for_full(pcc),
            )?;
            // SAFETY: just taken from our magazines, not handed out.
            if unsafe { self.round_intact(obj) } {
                return Some(obj);
            }
        }
    }

    /// One pass of the free miss with interrupts off: store `obj` in
    /// `loaded`, swapping with `prev` or trading `prev` for an empty
    /// magazine from the depot as needed; false if there is no room and
    /// the depot has no empty magazine.
    pub(super) fn magazine_free_miss(&self, obj: NonNull<u8>) -> bool {
        self.magazine_miss(
            |pcc| push_round(pcc, obj).then_some(()),
            // SAFETY: this CPU's magazines, interrupts off.
            |pcc| unsafe {
                pcc.prev != no_magazine()
                    && (pcc.loaded == no_magazine() || rounds_of(pcc.prev) == 0)
            },
            |depot, pcc| depot.exchange_for_empty(pcc),
        )
        .is_some()
    }

    /// The one miss loop of both directions, with interrupts off: `round`
    /// (pop or push on `loaded`), else swap `loaded` and `prev` if
    /// `swap_helps` and try again, else `exchange` with the depot and
    /// start over; `None` when the depot has nothing to trade. Magazines
    /// of an older type the exchanges detached are freed after interrupts
    /// are back on.
    #[inline(always)]
    fn magazine_miss<R>(
        &self,
        mut round: impl FnMut(&mut PcpuInner) -> Option<R>,
        swap_helps: impl Fn(&PcpuInner) -> bool,
        exchange: impl Fn(&Depot<P>, &mut PcpuInner) -> (bool, Stale),
    ) -> Option<R> {
        let irq = IrqGuard::<P>::new();
        // A hit this interrupt handler interrupted holds the magazines:
        // leave them alone (the caller goes to the slab layer).
        let mut locked = self.pcpu_lock_here(&irq)?;
        let mut pcc = PcpuSynced::new(locked.get());
        let mut stale = Stale::NONE;
        let result = loop {
            if let Some(result) = round(&mut pcc) {
                break Some(result);
            }
            if swap_helps(&pcc) {
                pcc.swap_magazines();
                if let Some(result) = round(&mut pcc) {
                    break Some(result);
                }
            }
            let (found, left) = exchange(&self.depot, &mut pcc);
            stale = stale.join(left);
            if !found {
                break None;
            }
        };
        drop(pcc);
        drop(locked);
        drop(irq);
        if !stale.0.is_null() {
            // SAFETY: detached by the exchange (see [`Stale`]); ours alone.
            unsafe { self.free_magazines(&[stale.0]) };
        }
        result
    }

    /// Whether `obj` is the round on top of this CPU's `loaded` or `prev`
    /// (a double free Linux's naive check catches).
    pub(super) fn on_top_of_magazines(&self, obj: NonNull<u8>) -> bool {
        let irq = IrqGuard::<P>::new();
        // Under a hit this interrupt handler interrupted: not checked.
        let Some(mut locked) = self.pcpu_lock_here(&irq) else {
            return false;
        };
        let pcc = PcpuSynced::new(locked.get());
        [pcc.loaded, pcc.prev].into_iter().any(|mag| {
            // SAFETY: this CPU's magazines (or the absent one), interrupts off.
            let nr_rounds = unsafe { rounds_of(mag) };
            // SAFETY: a real magazine with nr_rounds > 0 rounds.
            nr_rounds != 0 && unsafe { top_round(mag, nr_rounds) } == obj.as_ptr() as usize
        })
    }
}

/// Pop a round from `loaded` (the miss paths' retry), counting it.
#[inline(always)]
pub(super) fn pop_round(pcc: &mut PcpuInner) -> Option<NonNull<u8>> {
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
pub(super) fn push_round(pcc: &mut PcpuInner, obj: NonNull<u8>) -> bool {
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
