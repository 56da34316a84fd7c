//! The depot (Bonwick & Adams 2001 §3.2): a cache's full and empty
//! magazines behind the depot lock, the exchanges a per-CPU cache makes
//! with it, its working set, and its move to a larger magazine type
//! under contention. It knows magazines, not slabs.

use core::ptr;
use core::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use super::{
    MAG_HANDOFF_THRESHOLD, MAG_RESIZE_INTERVAL, MAG_RESIZE_THRESHOLD, MAGAZINE_ROUNDS, Magazine,
    PcpuInner, no_magazine,
};
use crate::platform::Platform;
use crate::sync::{IrqMutex, IrqMutexGuard};

/// The depot's state, under the depot lock.
pub(crate) struct DepotInner {
    pub(crate) full: *mut Magazine,
    pub(crate) nr_full: usize,
    pub(crate) empty: *mut Magazine,
    pub(crate) nr_empty: usize,
    /// The type (index into [`MAGAZINE_ROUNDS`]) of the magazines the depot
    /// hands out and keeps empty: new magazines are made of it, older
    /// smaller ones are freed when they come back empty.
    pub(crate) magtype: usize,
    /// The largest type contention may grow `magtype` to.
    max_magtype: usize,
    nr_visits: u32,
    contention_at_mark: u64,
    /// Times `magtype` grew (Bonwick & Adams 2001 §3.7: the magazine
    /// size grows when the depot lock is contended), ever: at most
    /// `NR_MAG_TYPES - 1`. A `u16` beside `nr_handoffs` (at most
    /// `MAG_RESIZE_INTERVAL`), so the pair fills the word `nr_handoffs`
    /// had and the cache keeps its size.
    pub(crate) nr_resizes: u16,
    /// Visits in this interval by another per-CPU cache than the one
    /// before (`last_visitor`, a per-CPU cache's address).
    nr_handoffs: u16,
    last_visitor: usize,
    /// Working set: fewest full / empty magazines since the last update.
    full_min: usize,
    empty_min: usize,
    /// Working set: `min` of the previous interval (what a working-set
    /// reap may free).
    full_reaplimit: usize,
    empty_reaplimit: usize,
}

// SAFETY: the magazines are owned by the depot and only touched under its lock.
unsafe impl Send for DepotInner {}

/// A cache's depot of full and empty magazines.
///
/// Cache-line aligned: every CPU writes it (the lock, the contention count)
/// on its exchanges, and it must not share a line with the read-mostly
/// fields at the head of [`KmemCache`](crate::KmemCache) that every alloc
/// and free reads.
#[repr(align(64))]
pub(crate) struct Depot<P: Platform> {
    pub(crate) inner: IrqMutex<P, DepotInner>,
    pub(crate) nr_contention: AtomicU64,
    /// `magtype` as of the last change, read without the lock by a free
    /// that makes a new magazine (a stale value makes a magazine the
    /// depot frees when it next pops it); and in its top bit
    /// ([`FREED`]), whether a free ever had to make a magazine for this
    /// cache ([`Depot::new_magtype`]). Changed under the depot lock
    /// only, the bit by `fetch_or` (one word: the cache keeps its 15
    /// lines).
    magtype: AtomicUsize,
}

/// The top bit of [`Depot`]'s `magtype` word: a free made a magazine for
/// the cache, so its objects come back; a refill on a CPU with no
/// magazine then makes one of the depot's type, and until then small
/// ones that grow with its trips down (`KmemCache::slab_refill`). Set
/// from birth on a small source, where a cache is born with a magazine
/// for its frees (`KmemCache::load_first_magazine`) and a magazine of
/// every type is the same 496-byte object (`magazine/mod.rs`): growing
/// 1, 3, 6, 14 rounds there only added misses and a new magazine each
/// (the hobby kernel's `btreemap_churn`: 52,399 -> 40,551 instructions
/// cold, 28,320 -> 21,670 warm).
const FREED: usize = 1 << (usize::BITS - 1);

/// Magazines detached from a depot under its lock, to be freed after it
/// is dropped (linked through `next`; null: none).
#[must_use]
pub(crate) struct Stale(pub(crate) *mut Magazine);

impl Stale {
    /// No magazine.
    pub(crate) const NONE: Stale = Stale(ptr::null_mut());

    /// Both lists as one.
    pub(crate) fn join(self, other: Stale) -> Stale {
        if self.0.is_null() {
            return other;
        }
        let mut last = self.0;
        // SAFETY: a detached list, owned by whoever holds the value.
        unsafe {
            while !(*last).next.is_null() {
                last = (*last).next;
            }
            (*last).next = other.0;
        }
        self
    }
}

impl<P: Platform> Depot<P> {
    /// A depot of `magtype` magazines that contention may grow up to
    /// `max_magtype`.
    /// `one_size`: a small source's, every magazine one size, the cache
    /// born with one for its frees ([`FREED`] from the start).
    pub(crate) fn new(magtype: usize, max_magtype: usize, one_size: bool) -> Self {
        Depot {
            inner: IrqMutex::new(DepotInner {
                full: ptr::null_mut(),
                nr_full: 0,
                empty: ptr::null_mut(),
                nr_empty: 0,
                magtype,
                max_magtype: max_magtype.max(magtype),
                nr_visits: 0,
                contention_at_mark: 0,
                nr_resizes: 0,
                nr_handoffs: 0,
                last_visitor: 0,
                full_min: 0,
                empty_min: 0,
                full_reaplimit: 0,
                empty_reaplimit: 0,
            }),
            nr_contention: AtomicU64::new(0),
            magtype: AtomicUsize::new(if one_size { magtype | FREED } else { magtype }),
        }
    }

    /// The magazine type a new magazine should be (read without the lock).
    pub(crate) fn magtype(&self) -> usize {
        self.magtype.load(Ordering::Relaxed) & !FREED
    }

    /// The type of a new magazine: for a free (`for_free`), the depot's,
    /// and the cache is noted as one whose objects come back ([`FREED`]);
    /// for a refill, the depot's once a free has made one, else at most
    /// [`REFILL_MAX_MAGTYPE`](super::REFILL_MAX_MAGTYPE) rounds
    /// ([`refill_magtype`](super::refill_magtype)). Read without the lock.
    pub(crate) fn new_magtype(&self, for_free: bool) -> usize {
        let word = self.magtype.load(Ordering::Relaxed);
        let magtype = word & !FREED;
        if word & FREED != 0 {
            magtype
        } else if for_free {
            self.magtype.fetch_or(FREED, Ordering::Relaxed);
            magtype
        } else {
            super::refill_magtype(magtype)
        }
    }

    /// Whether a free ever made a magazine for this cache ([`FREED`]).
    pub(crate) fn freed(&self) -> bool {
        self.magtype.load(Ordering::Relaxed) & FREED != 0
    }

    /// Set the magazine type (and raise its growth limit to it): empty
    /// magazines of another type are freed as they leave the depot.
    #[cfg(test)]
    pub(crate) fn set_magtype(&self, magtype: usize) {
        let mut depot = self.lock();
        depot.magtype = magtype;
        depot.max_magtype = depot.max_magtype.max(magtype);
        // The FREED bit kept (set meanwhile by a free or not).
        self.magtype.fetch_and(FREED, Ordering::Relaxed);
        self.magtype.fetch_or(magtype, Ordering::Relaxed);
    }

    /// Lock the depot, counting contention (Akaros: a failed try-lock).
    pub(crate) fn lock(&self) -> IrqMutexGuard<'_, P, DepotInner> {
        if let Some(guard) = self.inner.try_lock() {
            return guard;
        }
        self.nr_contention.fetch_add(1, Ordering::Relaxed);
        self.inner.lock()
    }

    /// Lock for an exchange by the per-CPU cache `pcc`: also runs the
    /// resize heuristic.
    fn lock_for_exchange(&self, pcc: &PcpuInner) -> IrqMutexGuard<'_, P, DepotInner> {
        let mut depot = self.lock();
        let visitor = ptr::from_ref(pcc) as usize;
        if depot.note_visit(self.nr_contention.load(Ordering::Relaxed), visitor) {
            // The type grew by one (`note_visit`), and only changes
            // under the depot lock: the word's type is one less. The
            // FREED bit kept.
            self.magtype.fetch_add(1, Ordering::Relaxed);
        }
        depot
    }

    /// The alloc miss's exchange: `pcc`'s `loaded` and `prev` are empty
    /// (or absent). Trade the empty `prev` for a full magazine, which
    /// becomes `loaded`; `prev` stays in the depot if it is of the depot's
    /// type, else it is returned to be freed (with no lock held). False if
    /// the depot has no full magazine. (The `time-stats` point
    /// `func:exchange_for_full`.)
    pub(crate) fn exchange_for_full(&self, pcc: &mut PcpuInner) -> (bool, Stale) {
        let start = time_stats_start!(P);
        let mut depot = self.lock_for_exchange(pcc);
        let full = depot.pop_full();
        let mut stale = Stale::NONE;
        if !full.is_null() {
            if pcc.prev != no_magazine() {
                // SAFETY: prev is empty (our caller's case) and leaves the pcc.
                stale = unsafe { depot.keep_empty(pcc.prev) };
            }
            pcc.prev = pcc.loaded;
            pcc.loaded = full;
            // SAFETY: a live magazine, ours now.
            let nr_rounds = unsafe { (*full).nr_rounds };
            pcc.nr_rounds_exchanged = pcc.nr_rounds_exchanged.wrapping_add(u64::from(nr_rounds));
        }
        drop(depot);
        time_stats_end!(P, start);
        (!full.is_null(), stale)
    }

    /// The free miss's exchange: `loaded` is full (or absent) and `prev`
    /// not empty. Trade `prev` for an empty magazine of the depot's type,
    /// which becomes `loaded`; but a full `loaded` that is a refill's
    /// magazine ([`is_refill_magazine`](super::is_refill_magazine)) moves
    /// its rounds into that empty magazine and is freed, `prev` staying.
    /// False if the depot has none. Empty
    /// magazines of an older type met on the way are returned to be freed
    /// (with no lock held). (The `time-stats` point
    /// `func:exchange_for_empty`.)
    pub(crate) fn exchange_for_empty(&self, pcc: &mut PcpuInner) -> (bool, Stale) {
        let start = time_stats_start!(P);
        let mut depot = self.lock_for_exchange(pcc);
        // Empty magazines of an older type leave as they come up.
        let mut stale = Stale::NONE;
        let magsize = depot.magsize();
        let empty = loop {
            let mag = depot.pop_empty();
            // SAFETY: popped, alive and ours; `next` is ours to link.
            unsafe {
                if mag.is_null() || (*mag).capacity as usize == magsize {
                    break mag;
                }
                (*mag).next = stale.0;
            }
            stale = Stale(mag);
        };
        let loaded = pcc.loaded;
        // SAFETY: this CPU's `loaded` (the pcc's, interrupts off), or the
        // absent one (capacity 0: not a refill's).
        let loaded_capacity = unsafe { (*loaded).capacity } as usize;
        if super::is_refill_magazine(loaded_capacity, magsize) && !empty.is_null() {
            // A refill's magazine, full: its rounds move to the empty one
            // of the depot's type, which becomes `loaded` (`prev` stays),
            // and it is freed.
            // SAFETY: both live and ours (the pcc's, interrupts off; the
            // popped one), distinct; the empty one has room for the
            // smaller one's rounds; `loaded` leaves the pcc empty.
            unsafe {
                let nr_rounds = (*loaded).nr_rounds;
                ptr::copy_nonoverlapping(
                    Magazine::slots(loaded),
                    Magazine::slots(empty),
                    nr_rounds as usize,
                );
                (*empty).nr_rounds = nr_rounds;
                (*loaded).nr_rounds = 0;
                (*loaded).next = stale.0;
            }
            stale = Stale(loaded);
            pcc.loaded = empty;
        } else if !empty.is_null() {
            let prev = pcc.prev;
            if prev != no_magazine() {
                // SAFETY: a live magazine leaving the pcc.
                let nr_rounds = unsafe { (*prev).nr_rounds };
                pcc.nr_rounds_exchanged =
                    pcc.nr_rounds_exchanged.wrapping_sub(u64::from(nr_rounds));
                // SAFETY: as above, on no list; empty or not as pushed.
                unsafe {
                    if nr_rounds == 0 {
                        let more = depot.keep_empty(prev);
                        if !more.0.is_null() {
                            (*more.0).next = stale.0;
                            stale = more;
                        }
                    } else {
                        depot.push_full(prev);
                    }
                }
            }
            pcc.prev = pcc.loaded;
            pcc.loaded = empty;
        }
        drop(depot);
        time_stats_end!(P, start);
        (!empty.is_null(), stale)
    }

    /// Detach both lists (for reap and destroy), linked through `next`:
    /// call [`Magazine::next_of`] to walk them.
    pub(crate) fn take_all(&self) -> (*mut Magazine, *mut Magazine) {
        self.lock().take_all()
    }

    /// Start a new working-set interval (illumos `kmem_depot_ws_update`):
    /// each list's reap limit becomes the fewest magazines it held during
    /// the interval that ends.
    pub(crate) fn ws_update(&self) {
        let mut depot = self.lock();
        depot.full_reaplimit = depot.full_min;
        depot.full_min = depot.nr_full;
        depot.empty_reaplimit = depot.empty_min;
        depot.empty_min = depot.nr_empty;
    }

    /// Detach the magazines beyond the working set (illumos
    /// `kmem_depot_ws_reap`): `min(reaplimit, min)` of each list, linked
    /// through `next`.
    pub(crate) fn ws_take(&self) -> (*mut Magazine, *mut Magazine) {
        let mut depot = self.lock();
        let nr_full = depot.full_reaplimit.min(depot.full_min);
        let nr_empty = depot.empty_reaplimit.min(depot.empty_min);
        let mut full = ptr::null_mut();
        for _ in 0..nr_full {
            let mag = depot.pop_full();
            // SAFETY: popped, ours; `next` links the detached list.
            unsafe { (*mag).next = full };
            full = mag;
        }
        let mut empty = ptr::null_mut();
        for _ in 0..nr_empty {
            let mag = depot.pop_empty();
            // SAFETY: as above.
            unsafe { (*mag).next = empty };
            empty = mag;
        }
        (full, empty)
    }
}

impl DepotInner {
    /// Rounds per magazine of the depot's type.
    pub(crate) fn magsize(&self) -> usize {
        MAGAZINE_ROUNDS[self.magtype]
    }

    /// Count a visit by `visitor` (a per-CPU cache's address); at the end
    /// of an interval, move to the next magazine type (up to
    /// `max_magtype`) if the depot lock was contended too often during
    /// it, or the depot handed off between CPUs too often. True if the
    /// type changed.
    pub(crate) fn note_visit(&mut self, nr_contention: u64, visitor: usize) -> bool {
        if visitor != self.last_visitor {
            self.last_visitor = visitor;
            self.nr_handoffs += 1;
        }
        self.nr_visits += 1;
        if self.nr_visits < MAG_RESIZE_INTERVAL {
            return false;
        }
        let grow = (nr_contention.wrapping_sub(self.contention_at_mark) >= MAG_RESIZE_THRESHOLD
            || u32::from(self.nr_handoffs) >= MAG_HANDOFF_THRESHOLD)
            && self.magtype < self.max_magtype;
        if grow {
            self.magtype += 1;
            self.nr_resizes += 1;
        }
        self.nr_visits = 0;
        self.nr_handoffs = 0;
        self.contention_at_mark = nr_contention;
        grow
    }

    /// Put an empty magazine leaving a per-CPU cache on the empty list if
    /// it is of the depot's type; else return it to be freed.
    ///
    /// # Safety
    /// As for [`DepotInner::push_empty`].
    unsafe fn keep_empty(&mut self, mag: *mut Magazine) -> Stale {
        // SAFETY: per the caller, alive.
        if unsafe { (*mag).capacity } as usize == self.magsize() {
            // SAFETY: per the caller.
            unsafe { self.push_empty(mag) };
            return Stale::NONE;
        }
        // SAFETY: per the caller, on no list: `next` is ours to link.
        unsafe { (*mag).next = ptr::null_mut() };
        Stale(mag)
    }

    fn pop_full(&mut self) -> *mut Magazine {
        let mag = self.full;
        if !mag.is_null() {
            // SAFETY: magazines on the depot lists are alive and ours; it
            // leaves the list with a null `next`, as a per-CPU cache
            // holds it (the alloc hit's empty test).
            unsafe {
                self.full = (*mag).next;
                (*mag).next = ptr::null_mut();
            }
            self.nr_full -= 1;
            self.full_min = self.full_min.min(self.nr_full);
        }
        mag
    }

    fn pop_empty(&mut self) -> *mut Magazine {
        let mag = self.empty;
        if !mag.is_null() {
            // SAFETY: as in `pop_full`.
            unsafe {
                self.empty = (*mag).next;
                (*mag).next = ptr::null_mut();
            }
            self.nr_empty -= 1;
            self.empty_min = self.empty_min.min(self.nr_empty);
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
                total += (*mag).nr_rounds as usize;
                mag = (*mag).next;
            }
        }
        total
    }

    /// Call `f` with every magazine on both lists (tests, `whatis`, the
    /// invariant walker).
    pub(crate) fn for_each_magazine(&self, mut f: impl FnMut(*mut Magazine)) {
        for list in [self.full, self.empty] {
            let mut mag = list;
            while !mag.is_null() {
                f(mag);
                // SAFETY: magazines on the depot lists are alive and ours.
                mag = unsafe { (*mag).next };
            }
        }
    }

    /// `(capacity, nr_rounds)` of every magazine on both lists, full list
    /// first (the tests' view of which magazine types the depot keeps).
    #[cfg(all(test, not(loom)))]
    pub(crate) fn magazine_shapes(&self) -> std::vec::Vec<(usize, usize)> {
        let mut shapes = std::vec::Vec::new();
        self.for_each_magazine(|mag| {
            // SAFETY: a magazine on one of our lists: alive, and read
            // under `&self` (the depot lock the caller holds).
            let (capacity, nr_rounds) = unsafe { ((*mag).capacity, (*mag).nr_rounds) };
            shapes.push((capacity as usize, nr_rounds as usize));
        });
        shapes
    }

    fn take_all(&mut self) -> (*mut Magazine, *mut Magazine) {
        let lists = (self.full, self.empty);
        self.full = ptr::null_mut();
        self.empty = ptr::null_mut();
        self.nr_full = 0;
        self.nr_empty = 0;
        self.full_min = 0;
        self.empty_min = 0;
        lists
    }
}
