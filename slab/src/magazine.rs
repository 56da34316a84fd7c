//! The magazine layer (Bonwick & Adams 2001, as in Akaros).
//!
//! Each CPU has a [`PcpuCache`] holding two magazines, `loaded` and `prev`,
//! of object pointers ("rounds"), and the current `magsize` (rounds per
//! full magazine). Behind them is the cache's [`Depot`]: a list of
//! non-empty ("full") magazines and a list of empty ones.
//!
//! - **alloc**: pop from `loaded`; else swap with `prev` if it has rounds;
//!   else trade the empty `prev` for a full magazine from the depot; else
//!   go to the slab layer.
//! - **free**: push to `loaded`; else swap with `prev` if it is empty; else
//!   trade `prev` (full) for an empty magazine from the depot; else
//!   allocate a new magazine from `kmem_magazine` and retry; if that fails,
//!   destruct the object and free it to the slab layer. A free never waits
//!   for memory.
//! - **drain** (`reap`, `destroy`, from any CPU): detach each CPU's
//!   `loaded` and `prev` under that CPU's lock, one CPU at a time, then the
//!   depot's lists under the depot lock; free rounds and magazines with no
//!   lock held (the crate docs, "Draining", say why this is enough).
//!
//! Objects in magazines stay constructed. The depot counts how often its
//! lock was contended (a failed `try_lock`); past a threshold within an
//! interval the magazine size grows, and each per-CPU cache adopts the new
//! size the next time it visits the depot.

use core::ptr::{self, NonNull};
use core::sync::atomic::{AtomicU64, Ordering};

use crate::cache::{CpuCacheStats, KmemCache};
use crate::platform::Platform;
use crate::sync::{Mutex, MutexGuard, PcpuGuard, PcpuLock};
use crate::{AllocError, BootCache};

/// Rounds a magazine struct can hold: the largest magazine size.
pub const MAG_MAX_ROUNDS: usize = 62;
/// Starting magazine size.
pub(crate) const MAG_INITIAL_ROUNDS: usize = 8;
/// Rounds added each time contention makes the depot grow the size.
pub(crate) const MAG_GROW_STEP: usize = 4;
/// Depot visits per contention-measuring interval.
pub(crate) const MAG_RESIZE_INTERVAL: u32 = 64;
/// Contended depot acquisitions per interval that trigger growth.
pub(crate) const MAG_RESIZE_THRESHOLD: u64 = 8;
/// How often a free retries after allocating a fresh magazine that another
/// CPU took first, before freeing straight to the slab layer.
const MAG_FREE_RETRIES: usize = 3;

/// A magazine: a stack of up to `MAG_MAX_ROUNDS` constructed objects.
#[repr(C)]
pub(crate) struct Magazine {
    next: *mut Magazine,
    pub(crate) nr_rounds: usize,
    pub(crate) rounds: [*mut u8; MAG_MAX_ROUNDS],
}

const _: () = assert!(core::mem::size_of::<Magazine>() == 512);

/// The per-CPU state, under the per-CPU lock (taken with interrupts off).
pub(crate) struct PcpuInner {
    pub(crate) loaded: *mut Magazine,
    pub(crate) prev: *mut Magazine,
    pub(crate) magsize: usize,
    /// Allocations / frees served by this CPU's magazines.
    pub(crate) nr_allocs: u64,
    pub(crate) nr_frees: u64,
}

/// A per-CPU cache: cache-line aligned so CPUs do not share lines.
///
/// It has its own lock even though only its CPU uses it on the fast path:
/// the lock is uncontended there (one atomic swap), and it lets `reap`,
/// `destroy` and `stats` reach every CPU's magazines without IPIs, and keeps
/// everything sound if `Platform::cpu_id` ever misreports.
#[repr(align(64))]
pub(crate) struct PcpuCache {
    pub(crate) inner: PcpuLock<PcpuInner>,
}

#[cfg(not(all(test, loom)))]
const _: () = {
    assert!(core::mem::size_of::<PcpuCache>() == 64);
    assert!(core::mem::align_of::<PcpuCache>() == 64);
};

impl PcpuCache {
    pub(crate) fn new(magsize: usize) -> Self {
        PcpuCache {
            inner: PcpuLock::new(PcpuInner {
                loaded: ptr::null_mut(),
                prev: ptr::null_mut(),
                magsize,
                nr_allocs: 0,
                nr_frees: 0,
            }),
        }
    }
}

// SAFETY: the magazines the raw pointers name are owned by this per-CPU
// cache and only touched under its lock.
unsafe impl Send for PcpuInner {}

/// The depot's state, under the depot lock.
pub(crate) struct DepotInner {
    full: *mut Magazine,
    pub(crate) nr_full: usize,
    empty: *mut Magazine,
    pub(crate) nr_empty: usize,
    pub(crate) magsize: usize,
    nr_visits: u32,
    contention_at_mark: u64,
}

// SAFETY: the magazines are owned by the depot and only touched under its lock.
unsafe impl Send for DepotInner {}

/// A cache's depot of full and empty magazines.
///
/// Cache-line aligned: every CPU writes it (the lock, the contention count)
/// on its exchanges, and it must not share a line with the read-mostly
/// fields at the head of [`KmemCache`] that every alloc and free reads.
#[repr(align(64))]
pub(crate) struct Depot {
    pub(crate) inner: Mutex<DepotInner>,
    pub(crate) nr_contention: AtomicU64,
}

impl Depot {
    pub(crate) fn new(magsize: usize) -> Self {
        Depot {
            inner: Mutex::new(DepotInner {
                full: ptr::null_mut(),
                nr_full: 0,
                empty: ptr::null_mut(),
                nr_empty: 0,
                magsize,
                nr_visits: 0,
                contention_at_mark: 0,
            }),
            nr_contention: AtomicU64::new(0),
        }
    }

    /// Lock the depot, counting contention (Akaros: a failed try-lock).
    pub(crate) fn lock(&self) -> MutexGuard<'_, DepotInner> {
        if let Some(guard) = self.inner.try_lock() {
            return guard;
        }
        self.nr_contention.fetch_add(1, Ordering::Relaxed);
        self.inner.lock()
    }

    /// Lock for an exchange: also runs the resize heuristic.
    fn lock_for_exchange(&self) -> MutexGuard<'_, DepotInner> {
        let mut depot = self.lock();
        depot.note_visit(self.nr_contention.load(Ordering::Relaxed));
        depot
    }
}

impl DepotInner {
    /// Count a visit; at the end of an interval, grow the magazine size if
    /// the depot lock was contended too often during it.
    pub(crate) fn note_visit(&mut self, nr_contention: u64) {
        self.nr_visits += 1;
        if self.nr_visits < MAG_RESIZE_INTERVAL {
            return;
        }
        if nr_contention.wrapping_sub(self.contention_at_mark) >= MAG_RESIZE_THRESHOLD {
            self.magsize = (self.magsize + MAG_GROW_STEP).min(MAG_MAX_ROUNDS);
        }
        self.nr_visits = 0;
        self.contention_at_mark = nr_contention;
    }

    fn pop_full(&mut self) -> *mut Magazine {
        let mag = self.full;
        if !mag.is_null() {
            // SAFETY: magazines on the depot lists are alive and ours.
            unsafe { self.full = (*mag).next };
            self.nr_full -= 1;
        }
        mag
    }

    fn pop_empty(&mut self) -> *mut Magazine {
        let mag = self.empty;
        if !mag.is_null() {
            // SAFETY: magazines on the depot lists are alive and ours.
            unsafe { self.empty = (*mag).next };
            self.nr_empty -= 1;
        }
        mag
    }

    /// # Safety
    /// `mag` is alive, non-empty, and on no list and in no per-CPU cache.
    unsafe fn push_full(&mut self, mag: *mut Magazine) {
        // SAFETY: per the caller.
        unsafe { (*mag).next = self.full };
        self.full = mag;
        self.nr_full += 1;
    }

    /// # Safety
    /// `mag` is alive, empty, and on no list and in no per-CPU cache.
    pub(crate) unsafe fn push_empty(&mut self, mag: *mut Magazine) {
        // SAFETY: per the caller.
        unsafe { (*mag).next = self.empty };
        self.empty = mag;
        self.nr_empty += 1;
    }

    /// Rounds in the full list.
    pub(crate) fn nr_rounds(&self) -> usize {
        let mut total = 0;
        let mut mag = self.full;
        while !mag.is_null() {
            // SAFETY: magazines on the depot lists are alive and ours.
            unsafe {
                total += (*mag).nr_rounds;
                mag = (*mag).next;
            }
        }
        total
    }

    /// Detach both lists (for reap and destroy), linked through `next`.
    fn take_all(&mut self) -> (*mut Magazine, *mut Magazine) {
        let lists = (self.full, self.empty);
        self.full = ptr::null_mut();
        self.empty = ptr::null_mut();
        self.nr_full = 0;
        self.nr_empty = 0;
        lists
    }
}

/// Rounds in a (possibly null) magazine.
#[inline]
fn rounds_of(mag: *mut Magazine) -> usize {
    if mag.is_null() {
        0
    } else {
        // SAFETY: non-null magazines in a per-CPU cache are alive.
        unsafe { (*mag).nr_rounds }
    }
}

impl<P: Platform> KmemCache<P> {
    /// The per-CPU cache of the running CPU.
    ///
    /// Only for caches with a magazine layer: every cache but the bootstrap
    /// ones, which never reach the magazine paths (their allocs and frees
    /// are refused on the `HOT_BOOTSTRAP` cold paths first).
    #[inline(always)]
    fn this_pcpu(&self) -> &PcpuCache {
        debug_assert!(!self.pcpu.is_null());
        // A misreported id is clamped to the last CPU (a compare and a
        // conditional move, no branch): safe, every per-CPU cache has its
        // own lock.
        let cpu = P::cpu_id().min(self.last_cpu);
        // SAFETY: pcpu is non-null for every non-bootstrap cache (above)
        // and has nr_cpus entries, alive as long as the cache; cpu < nr_cpus.
        unsafe { &*self.pcpu.add(cpu) }
    }

    /// Length of the per-CPU array (for caches that have one).
    #[inline]
    pub(crate) fn nr_cpus(&self) -> usize {
        self.last_cpu + 1
    }

    /// The per-CPU cache of CPU `cpu` (< nr_cpus), if the cache has any.
    pub(crate) fn pcpu(&self, cpu: usize) -> Option<&PcpuCache> {
        if self.pcpu.is_null() || cpu > self.last_cpu {
            return None;
        }
        // SAFETY: cpu < nr_cpus, the length of the live per-CPU array.
        Some(unsafe { &*self.pcpu.add(cpu) })
    }

    /// CPU `cpu`'s magazines of this cache: allocations and frees they
    /// served, rounds they hold now. All zero for a CPU id out of range
    /// and for bootstrap caches (no magazine layer). Takes that CPU's
    /// per-CPU lock (with interrupts disabled) for the read: safe from any
    /// CPU, and the four figures are one consistent snapshot.
    pub fn cpu_stats(&self, cpu: usize) -> CpuCacheStats {
        let Some(pcpu) = self.pcpu(cpu) else {
            return CpuCacheStats::default();
        };
        let irq = P::irq_save();
        let stats = {
            let pcc = pcpu.inner.lock();
            CpuCacheStats {
                nr_allocs: pcc.nr_allocs,
                nr_frees: pcc.nr_frees,
                nr_rounds_loaded: rounds_of(pcc.loaded),
                nr_rounds_prev: rounds_of(pcc.prev),
            }
        };
        P::irq_restore(irq);
        stats
    }

    /// The magazine hit of an allocation: interrupts off, per-CPU lock,
    /// pop a round from `loaded`, count, unlock. `None` (nothing changed)
    /// if the lock is taken (a drain or a stats reader on another CPU) or
    /// `loaded` is empty or missing. Not for bootstrap caches.
    ///
    /// A leaf with no call that returns into it, so it needs no
    /// callee-saved registers: callers go to [`Self::magazine_alloc_or_miss`]'s
    /// out-of-line path on `None`.
    #[inline(always)]
    pub(crate) fn magazine_alloc_fast(&self) -> Option<NonNull<u8>> {
        let irq = P::irq_save();
        let Some(mut pcc) = self.this_pcpu().inner.try_lock() else {
            P::irq_restore(irq);
            return None;
        };
        let loaded = pcc.loaded;
        let mut obj = None;
        if !loaded.is_null() {
            // SAFETY: a non-null loaded magazine is alive and ours under
            // the per-CPU lock.
            let nr_rounds = unsafe { (*loaded).nr_rounds };
            if nr_rounds != 0 {
                // SAFETY: 0 < nr_rounds <= MAG_MAX_ROUNDS (a magazine never
                // holds more than its array), so index nr_rounds - 1 is in
                // bounds; rounds below nr_rounds are non-null objects.
                obj = unsafe {
                    (*loaded).nr_rounds = nr_rounds - 1;
                    Some(NonNull::new_unchecked(
                        *(*loaded).rounds.get_unchecked(nr_rounds - 1),
                    ))
                };
                pcc.nr_allocs += 1;
            }
        }
        drop(pcc);
        P::irq_restore(irq);
        obj
    }

    /// Allocate through the magazine layer; on a miss, from the slab layer
    /// (constructed). Not traced, not marked. Not for bootstrap caches.
    #[inline(always)]
    pub(crate) fn magazine_alloc_or_miss(&self) -> Result<NonNull<u8>, AllocError> {
        match self.magazine_alloc_fast() {
            Some(obj) => Ok(obj),
            None => self.magazine_alloc_slow(),
        }
    }

    /// [`Self::magazine_alloc_or_miss`] past the hit: wait for the per-CPU lock,
    /// then the miss path.
    #[cold]
    #[inline(never)]
    pub(crate) fn magazine_alloc_slow(&self) -> Result<NonNull<u8>, AllocError> {
        let irq = P::irq_save();
        let guard = self.this_pcpu().inner.lock();
        self.magazine_alloc(guard, irq)
    }

    /// The allocation miss: `loaded` is empty (or missing): swap with
    /// `prev`, trade with the depot, or go to the slab layer. Entered with
    /// the per-CPU lock held and interrupts saved as `irq`; releases both.
    /// (Named as before the hit was split out: its depot exchange is the
    /// `time-stats` point `func:magazine_alloc`.)
    #[inline(always)]
    fn magazine_alloc(
        &self,
        mut guard: PcpuGuard<'_, PcpuInner>,
        irq: usize,
    ) -> Result<NonNull<u8>, AllocError> {
        let pcc = &mut *guard;
        loop {
            let loaded = pcc.loaded;
            if rounds_of(loaded) > 0 {
                // SAFETY: loaded is non-null with at least one round.
                let obj = unsafe {
                    (*loaded).nr_rounds -= 1;
                    (*loaded).rounds[(*loaded).nr_rounds]
                };
                pcc.nr_allocs += 1;
                drop(guard);
                P::irq_restore(irq);
                // SAFETY: rounds are non-null object pointers.
                return Ok(unsafe { NonNull::new_unchecked(obj) });
            }
            if rounds_of(pcc.prev) > 0 {
                core::mem::swap(&mut pcc.loaded, &mut pcc.prev);
                continue;
            }
            // Both empty (or missing): trade with the depot.
            let start = time_stats_start!(P);
            let mut depot = self.depot.lock_for_exchange();
            pcc.magsize = depot.magsize;
            let full = depot.pop_full();
            if !full.is_null() {
                if !pcc.prev.is_null() {
                    // SAFETY: prev is empty (checked above) and leaves the pcc.
                    unsafe { depot.push_empty(pcc.prev) };
                }
                pcc.prev = pcc.loaded;
                pcc.loaded = full;
            }
            drop(depot);
            time_stats_end!(P, start);
            if full.is_null() {
                break;
            }
        }
        drop(guard);
        P::irq_restore(irq);
        self.slab_alloc_constructed()
    }

    /// The magazine hit of a free: push `obj` on `loaded` under the
    /// per-CPU lock. False (nothing changed) if the lock is taken or
    /// `loaded` is full or missing; a leaf like
    /// [`Self::magazine_alloc_fast`].
    ///
    /// # Safety
    /// `obj` is a constructed, busy object of this cache that the caller
    /// gives up if this returns true (validated by the caller).
    #[inline(always)]
    pub(crate) unsafe fn magazine_free_fast(&self, obj: NonNull<u8>) -> bool {
        let irq = P::irq_save();
        let Some(mut pcc) = self.this_pcpu().inner.try_lock() else {
            P::irq_restore(irq);
            return false;
        };
        let loaded = pcc.loaded;
        let mut stored = false;
        if !loaded.is_null() {
            // SAFETY: a non-null loaded magazine is alive and ours under
            // the per-CPU lock.
            let nr_rounds = unsafe { (*loaded).nr_rounds };
            if nr_rounds < pcc.magsize {
                // SAFETY: nr_rounds < magsize <= MAG_MAX_ROUNDS, in bounds.
                unsafe {
                    *(*loaded).rounds.get_unchecked_mut(nr_rounds) = obj.as_ptr();
                    (*loaded).nr_rounds = nr_rounds + 1;
                }
                pcc.nr_frees += 1;
                stored = true;
            }
        }
        drop(pcc);
        P::irq_restore(irq);
        stored
    }

    /// Free through the magazine layer; objects that do not fit are
    /// destructed and go to the slab layer. Not for bootstrap caches.
    ///
    /// # Safety
    /// `obj` is a constructed, busy object of this cache that the caller
    /// gives up (validated by the caller).
    #[inline(always)]
    pub(crate) unsafe fn magazine_free(&self, obj: NonNull<u8>) {
        // SAFETY: per our caller.
        if !unsafe { self.magazine_free_fast(obj) } {
            // SAFETY: per our caller; the fast path changed nothing.
            unsafe { self.magazine_free_slow(obj) }
        }
    }

    /// [`Self::magazine_free`] past the hit: wait for the per-CPU lock,
    /// then the miss path.
    ///
    /// # Safety
    /// As for [`Self::magazine_free`].
    #[cold]
    #[inline(never)]
    pub(crate) unsafe fn magazine_free_slow(&self, obj: NonNull<u8>) {
        let irq = P::irq_save();
        let guard = self.this_pcpu().inner.lock();
        // SAFETY: per our caller.
        unsafe { self.magazine_free_miss(guard, irq, obj) }
    }

    /// `loaded` is full (or missing): swap, trade with the depot, make a
    /// new magazine, or free to the slab layer. Entered with the per-CPU
    /// lock held and interrupts saved as `irq`; releases both.
    ///
    /// # Safety
    /// As for [`Self::magazine_free`].
    #[inline(always)]
    unsafe fn magazine_free_miss(
        &self,
        mut guard: PcpuGuard<'_, PcpuInner>,
        irq: usize,
        obj: NonNull<u8>,
    ) {
        let stored = self.try_magazine_free(&mut guard, obj);
        drop(guard);
        P::irq_restore(irq);
        if stored {
            return;
        }
        for _ in 0..MAG_FREE_RETRIES {
            // No room and no empty magazine in the depot: make one. No
            // lock is held here, so allocating from kmem_magazine cannot
            // deadlock even when this cache is kmem_magazine.
            match self.new_magazine() {
                // SAFETY: a fresh empty magazine, owned by nobody yet.
                Ok(mag) => unsafe { self.depot.lock().push_empty(mag) },
                Err(_) => break,
            }
            if self.try_magazine_free_locking(obj) {
                return;
            }
        }
        self.nr_frees_direct.fetch_add(1, Ordering::Relaxed);
        // SAFETY: per our caller, obj is a constructed busy object of ours.
        unsafe { self.slab_free_objects(&[obj.as_ptr()]) };
    }

    /// One pass of the free algorithm, taking the per-CPU lock; false if a
    /// new magazine is needed.
    fn try_magazine_free_locking(&self, obj: NonNull<u8>) -> bool {
        let irq = P::irq_save();
        let mut guard = self.this_pcpu().inner.lock();
        let stored = self.try_magazine_free(&mut guard, obj);
        drop(guard);
        P::irq_restore(irq);
        stored
    }

    /// One pass of the free algorithm under the per-CPU lock: store `obj`
    /// in `loaded`, swapping with `prev` or trading `prev` for an empty
    /// magazine from the depot as needed; false if there is no room and
    /// the depot has no empty magazine. (Its depot exchange is the
    /// `time-stats` point `func:try_magazine_free`.)
    fn try_magazine_free(&self, pcc: &mut PcpuInner, obj: NonNull<u8>) -> bool {
        loop {
            let loaded = pcc.loaded;
            if !loaded.is_null() && rounds_of(loaded) < pcc.magsize {
                // SAFETY: loaded is alive with room (magsize <= MAG_MAX_ROUNDS).
                unsafe {
                    (*loaded).rounds[(*loaded).nr_rounds] = obj.as_ptr();
                    (*loaded).nr_rounds += 1;
                }
                pcc.nr_frees += 1;
                return true;
            }
            if !pcc.prev.is_null() && (loaded.is_null() || rounds_of(pcc.prev) == 0) {
                core::mem::swap(&mut pcc.loaded, &mut pcc.prev);
                if !pcc.loaded.is_null() && rounds_of(pcc.loaded) < pcc.magsize {
                    continue;
                }
            }
            // loaded is full (or missing) and prev is not empty: trade
            // prev for an empty magazine from the depot.
            let start = time_stats_start!(P);
            let mut depot = self.depot.lock_for_exchange();
            pcc.magsize = depot.magsize;
            if !pcc.loaded.is_null() && rounds_of(pcc.loaded) < pcc.magsize {
                // The magazine size grew: room again (not timed: rare).
                let _: u64 = start;
                continue;
            }
            let empty = depot.pop_empty();
            if !empty.is_null() {
                let prev = pcc.prev;
                if !prev.is_null() {
                    if rounds_of(prev) == 0 {
                        // SAFETY: an empty magazine leaving the pcc.
                        unsafe { depot.push_empty(prev) };
                    } else {
                        // SAFETY: a non-empty magazine leaving the pcc.
                        unsafe { depot.push_full(prev) };
                    }
                }
                pcc.prev = pcc.loaded;
                pcc.loaded = empty;
            }
            drop(depot);
            time_stats_end!(P, start);
            if empty.is_null() {
                return false;
            }
        }
    }

    /// A new empty magazine from the `kmem_magazine` bootstrap cache.
    fn new_magazine(&self) -> Result<*mut Magazine, AllocError> {
        let mag = self.owner().boot(BootCache::Magazine).slab_alloc_raw()?;
        let mag = mag.as_ptr().cast::<Magazine>();
        // SAFETY: a fresh kmem_magazine object: 512 bytes, 8-aligned, ours.
        unsafe {
            mag.write(Magazine {
                next: ptr::null_mut(),
                nr_rounds: 0,
                rounds: [ptr::null_mut(); MAG_MAX_ROUNDS],
            })
        };
        Ok(mag)
    }

    /// Empty every per-CPU cache and the depot: rounds are destructed and
    /// go back to the slab layer, magazines go back to `kmem_magazine`.
    ///
    /// CPU by CPU, each per-CPU lock is held (interrupts off) only to
    /// detach that CPU's two magazines; the depot lock only to detach its
    /// lists. No two of these locks are ever held together, and nothing is
    /// freed under any of them (destructors and `kmem_magazine` run with
    /// no lock held). CPUs may allocate and free throughout: whatever they
    /// put in magazines after their turn stays there.
    pub(crate) fn drain_magazines(&self) {
        if self.pcpu.is_null() {
            return;
        }
        for cpu in 0..self.nr_cpus() {
            let Some(pcpu) = self.pcpu(cpu) else { continue };
            let irq = P::irq_save();
            let (loaded, prev) = {
                let mut pcc = pcpu.inner.lock();
                let mags = (pcc.loaded, pcc.prev);
                pcc.loaded = ptr::null_mut();
                pcc.prev = ptr::null_mut();
                mags
            };
            P::irq_restore(irq);
            for mag in [loaded, prev] {
                // SAFETY: detached from the pcc; ours alone now.
                unsafe { self.free_magazine(mag) };
            }
        }
        let (mut full, mut empty) = self.depot.lock().take_all();
        while !full.is_null() {
            // SAFETY: detached from the depot; ours alone now.
            unsafe {
                let next = (*full).next;
                self.free_magazine(full);
                full = next;
            }
        }
        while !empty.is_null() {
            // SAFETY: detached from the depot; ours alone now.
            unsafe {
                let next = (*empty).next;
                self.free_magazine(empty);
                empty = next;
            }
        }
    }

    /// Test support: call `f` with every round in every per-CPU cache and
    /// in the depot (taking each per-CPU lock, then the depot lock), so a
    /// test can check that no object rests in two places.
    #[cfg(test)]
    pub(crate) fn for_each_round(&self, mut f: impl FnMut(*mut u8)) {
        let mut visit = |mag: *mut Magazine| {
            for index in 0..rounds_of(mag) {
                // SAFETY: a magazine held by a per-CPU cache or the depot,
                // under its lock; index < nr_rounds.
                f(unsafe { (&(*mag).rounds)[index] });
            }
        };
        for cpu in 0..self.nr_cpus() {
            let Some(pcpu) = self.pcpu(cpu) else { break };
            let pcc = pcpu.inner.lock();
            visit(pcc.loaded);
            visit(pcc.prev);
        }
        let depot = self.depot.lock();
        for list in [depot.full, depot.empty] {
            let mut mag = list;
            while !mag.is_null() {
                // The empty list too: a round left on it would break the
                // caller's count against the depot's `nr_rounds`.
                visit(mag);
                // SAFETY: magazines on the depot lists are alive and ours.
                mag = unsafe { (*mag).next };
            }
        }
    }

    /// Free a detached magazine's rounds (destructed) to the slab layer
    /// and the magazine itself to `kmem_magazine`'s slab layer.
    ///
    /// # Safety
    /// `mag` is null or an alive magazine of this cache referenced by no
    /// per-CPU cache or depot list.
    unsafe fn free_magazine(&self, mag: *mut Magazine) {
        if mag.is_null() {
            return;
        }
        // SAFETY: per the caller, the magazine and its rounds are ours.
        unsafe {
            let nr_rounds = (*mag).nr_rounds;
            let rounds = &(&(*mag).rounds)[..nr_rounds];
            self.slab_free_objects(rounds);
            self.owner()
                .boot(BootCache::Magazine)
                .slab_free_raw(mag.cast());
        }
    }
}
