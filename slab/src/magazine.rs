//! The magazine layer (Bonwick & Adams 2001, as in Akaros): per-CPU caches
//! of two magazines and the depot behind them.
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
//! - **drain** (`reap`, `destroy`): each CPU hands its `loaded` and `prev`
//!   over in a [cross-CPU call](crate::Platform::cross_cpu_call); then the
//!   depot's lists are detached under the depot lock; rounds and
//!   magazines are freed with no lock held.
//! - **working set** (Bonwick & Adams 2001 §3.7; illumos
//!   `kmem_depot_ws_update` / `kmem_depot_ws_reap`): each depot list
//!   remembers the fewest magazines it held since the last update
//!   (`min`). An update makes that the list's `reaplimit` and starts a
//!   new interval; a working-set reap frees `min(reaplimit, min)`
//!   magazines of each list — those nobody needed for a whole interval —
//!   and their rounds. So memory a burst left in the depot goes back after
//!   one idle interval, and a steady load keeps its magazines.
//!
//! A per-CPU cache belongs to its CPU: only that CPU touches it, with
//! interrupts off ([`IrqGuard`]), or code that CPU runs on another's
//! behalf in a cross-CPU call. So it has no lock and the hits no atomic
//! instruction. An absent magazine is the shared, never-written
//! [`NO_MAGAZINE`], whose round count (`usize::MAX`) fails both hit tests,
//! so the hits need no null test.
//!
//! Statistics are kept at exchanges: a CPU counts its magazine allocations
//! (one plain add on the alloc hit, in the line it writes anyway) and the
//! rounds that entered or left its magazines through the depot and drains;
//! its frees are derived exactly from those and the rounds it holds (see
//! [`PcpuInner::stats`]).
//!
//! Objects in magazines stay constructed. The depot counts how often its
//! lock was contended (a failed `try_lock`); past a threshold within an
//! interval the magazine size grows, and each per-CPU cache adopts the new
//! size the next time it visits the depot.

use core::cell::UnsafeCell;
use core::ptr::{self, NonNull};
use core::sync::atomic::{AtomicU64, Ordering};

use crate::platform::CPU_SLOT_BYTES;
use crate::stats::CpuCacheStats;
use crate::sync::{Mutex, MutexGuard};

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
pub(crate) const MAG_FREE_RETRIES: usize = 3;

/// A magazine: a stack of up to `MAG_MAX_ROUNDS` constructed objects.
#[repr(C)]
pub(crate) struct Magazine {
    next: *mut Magazine,
    pub(crate) nr_rounds: usize,
    pub(crate) rounds: [*mut u8; MAG_MAX_ROUNDS],
}

const _: () = assert!(core::mem::size_of::<Magazine>() == 512);

/// The absent magazine: a per-CPU cache without a `loaded` or `prev`
/// points here. Never written: its round count fails the alloc hit's test
/// (`nr_rounds - 1 < MAG_MAX_ROUNDS`) and the free hit's
/// (`nr_rounds < magsize`), and the miss paths test for it by address.
struct NoMagazine(Magazine);

// SAFETY: never written (see above); the null and dangling pointers in it
// are never dereferenced.
unsafe impl Sync for NoMagazine {}

static NO_MAGAZINE: NoMagazine = NoMagazine(Magazine {
    next: ptr::null_mut(),
    nr_rounds: usize::MAX,
    rounds: [ptr::null_mut(); MAG_MAX_ROUNDS],
});

/// The absent magazine's address (see [`NO_MAGAZINE`]).
#[inline(always)]
pub(crate) fn no_magazine() -> *mut Magazine {
    ptr::addr_of!(NO_MAGAZINE.0).cast_mut()
}

/// Rounds in a magazine held by a per-CPU cache (0 for [`no_magazine`]).
///
/// # Safety
/// `mag` is `no_magazine()` or a live magazine its caller owns.
#[inline]
pub(crate) unsafe fn rounds_of(mag: *mut Magazine) -> usize {
    if mag == no_magazine() {
        0
    } else {
        // SAFETY: per the caller, a live magazine.
        unsafe { (*mag).nr_rounds }
    }
}

/// A CPU's magazines of one cache, owned by that CPU (see the module
/// docs): reached through [`KmemCache`](crate::KmemCache)'s `pcpu_mut`
/// with interrupts off, or in a cross-CPU call.
pub(crate) struct PcpuInner {
    pub(crate) loaded: *mut Magazine,
    pub(crate) prev: *mut Magazine,
    /// Rounds per full magazine for this CPU (adopted from the depot at
    /// each visit).
    pub(crate) magsize: usize,
    /// Allocations served by this CPU's magazines, ever.
    pub(crate) nr_allocs: u64,
    /// Rounds that came into this CPU's magazines from the depot minus
    /// those that left to the depot or to a drain (wrapping).
    pub(crate) nr_rounds_exchanged: u64,
}

impl PcpuInner {
    /// This CPU's figures. Frees are derived: every round in its
    /// magazines came from a free here, an exchange, or a drain took it,
    /// and every allocation took one, so `frees = held - exchanged +
    /// allocs` exactly.
    pub(crate) fn stats(&self) -> CpuCacheStats {
        // SAFETY: the per-CPU cache's magazines are owned by whoever
        // holds `&self` (its CPU, interrupts off, or a cross-CPU call).
        let (loaded, prev) = unsafe { (rounds_of(self.loaded), rounds_of(self.prev)) };
        CpuCacheStats {
            nr_allocs: self.nr_allocs,
            nr_frees: ((loaded + prev) as u64)
                .wrapping_sub(self.nr_rounds_exchanged)
                .wrapping_add(self.nr_allocs),
            nr_rounds_loaded: loaded,
            nr_rounds_prev: prev,
        }
    }

    /// Hand both magazines over (drain): they leave this CPU, their rounds
    /// counted as exchanged away. Returns `(loaded, prev)`, each a live
    /// magazine or `no_magazine()`.
    pub(crate) fn take_magazines(&mut self) -> (*mut Magazine, *mut Magazine) {
        let mags = (self.loaded, self.prev);
        // SAFETY: our own magazines (see `stats`).
        let nr_rounds = unsafe { rounds_of(mags.0) + rounds_of(mags.1) };
        self.nr_rounds_exchanged = self.nr_rounds_exchanged.wrapping_sub(nr_rounds as u64);
        self.loaded = no_magazine();
        self.prev = no_magazine();
        mags
    }
}

/// A per-CPU cache: one cache line ([`CPU_SLOT_BYTES`]), so CPUs do not
/// share lines and [`Platform::cpu_offset`](crate::Platform::cpu_offset)
/// indexes an array of them.
#[repr(C, align(64))]
pub(crate) struct PcpuCache {
    inner: UnsafeCell<PcpuInner>,
}

const _: () = {
    assert!(core::mem::size_of::<PcpuCache>() == CPU_SLOT_BYTES);
    assert!(core::mem::align_of::<PcpuCache>() == CPU_SLOT_BYTES);
};

impl PcpuCache {
    pub(crate) fn new(magsize: usize) -> Self {
        PcpuCache {
            inner: UnsafeCell::new(PcpuInner {
                loaded: no_magazine(),
                prev: no_magazine(),
                magsize,
                nr_allocs: 0,
                nr_rounds_exchanged: 0,
            }),
        }
    }

    /// The owned state.
    ///
    /// # Safety
    /// The caller is this per-CPU cache's CPU with interrupts off, or runs
    /// in a cross-CPU call to it, and holds no other reference to it.
    #[inline(always)]
    #[allow(clippy::mut_from_ref, reason = "ownership is by CPU, see Safety")]
    pub(crate) unsafe fn get(&self) -> &mut PcpuInner {
        // SAFETY: per the caller, nobody else reaches the state now.
        unsafe { &mut *self.inner.get() }
    }
}

// SAFETY: the cell is reached only by its CPU (see `get`); the raw
// magazine pointers are owned by the per-CPU cache.
unsafe impl Sync for PcpuCache {}
// SAFETY: as above.
unsafe impl Send for PcpuCache {}

/// The depot's state, under the depot lock.
pub(crate) struct DepotInner {
    full: *mut Magazine,
    pub(crate) nr_full: usize,
    empty: *mut Magazine,
    pub(crate) nr_empty: usize,
    pub(crate) magsize: usize,
    nr_visits: u32,
    contention_at_mark: u64,
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
                full_min: 0,
                empty_min: 0,
                full_reaplimit: 0,
                empty_reaplimit: 0,
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

    /// The alloc miss's exchange: `pcc`'s `loaded` and `prev` are empty
    /// (or absent). Trade the empty `prev` for a full magazine, which
    /// becomes `loaded`. False if the depot has no full magazine. Adopts
    /// the depot's magazine size. (The `time-stats` point
    /// `func:exchange_for_full`.)
    pub(crate) fn exchange_for_full<P: crate::Platform>(&self, pcc: &mut PcpuInner) -> bool {
        let start = time_stats_start!(P);
        let mut depot = self.lock_for_exchange();
        pcc.magsize = depot.magsize;
        let full = depot.pop_full();
        if !full.is_null() {
            if pcc.prev != no_magazine() {
                // SAFETY: prev is empty (our caller's case) and leaves the pcc.
                unsafe { depot.push_empty(pcc.prev) };
            }
            pcc.prev = pcc.loaded;
            pcc.loaded = full;
            // SAFETY: a live magazine, ours now.
            let nr_rounds = unsafe { (*full).nr_rounds };
            pcc.nr_rounds_exchanged = pcc.nr_rounds_exchanged.wrapping_add(nr_rounds as u64);
        }
        drop(depot);
        time_stats_end!(P, start);
        !full.is_null()
    }

    /// The free miss's exchange: `loaded` is full (or absent) and `prev`
    /// not empty. Trade `prev` for an empty magazine, which becomes
    /// `loaded`. False if the depot has none. Adopts the depot's magazine
    /// size (a grown size may leave room in `loaded` at once). (The
    /// `time-stats` point `func:exchange_for_empty`.)
    pub(crate) fn exchange_for_empty<P: crate::Platform>(&self, pcc: &mut PcpuInner) -> bool {
        let start = time_stats_start!(P);
        let mut depot = self.lock_for_exchange();
        pcc.magsize = depot.magsize;
        // SAFETY: the pcc's magazines are owned by our caller.
        if pcc.loaded != no_magazine() && unsafe { rounds_of(pcc.loaded) } < pcc.magsize {
            // The magazine size grew: room again (not timed: rare).
            let _: u64 = start;
            return true;
        }
        let empty = depot.pop_empty();
        if !empty.is_null() {
            let prev = pcc.prev;
            if prev != no_magazine() {
                // SAFETY: a live magazine leaving the pcc.
                let nr_rounds = unsafe { (*prev).nr_rounds };
                pcc.nr_rounds_exchanged = pcc.nr_rounds_exchanged.wrapping_sub(nr_rounds as u64);
                // SAFETY: as above, on no list; empty or not as pushed.
                unsafe {
                    if nr_rounds == 0 {
                        depot.push_empty(prev);
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
        !empty.is_null()
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

impl Magazine {
    /// The next magazine of a detached depot list.
    ///
    /// # Safety
    /// `mag` is a live magazine from [`Depot::take_all`], owned by the caller.
    pub(crate) unsafe fn next_of(mag: *mut Magazine) -> *mut Magazine {
        // SAFETY: per the caller.
        unsafe { (*mag).next }
    }

    /// A new, empty magazine written at `mem`.
    ///
    /// # Safety
    /// `mem` is a fresh `kmem_magazine` object: 512 writable bytes,
    /// 8-aligned, owned by the caller.
    #[expect(
        clippy::cast_ptr_alignment,
        reason = "kmem_magazine objects are 8-aligned (see Safety)"
    )]
    pub(crate) unsafe fn init(mem: NonNull<u8>) -> *mut Magazine {
        let mag = mem.as_ptr().cast::<Magazine>();
        // SAFETY: per the caller.
        unsafe {
            mag.write(Magazine {
                next: ptr::null_mut(),
                nr_rounds: 0,
                rounds: [ptr::null_mut(); MAG_MAX_ROUNDS],
            })
        };
        mag
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
            self.full_min = self.full_min.min(self.nr_full);
        }
        mag
    }

    fn pop_empty(&mut self) -> *mut Magazine {
        let mag = self.empty;
        if !mag.is_null() {
            // SAFETY: magazines on the depot lists are alive and ours.
            unsafe { self.empty = (*mag).next };
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
                total += (*mag).nr_rounds;
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
