//! The allocator's KFENCE state ([`KfencePool`], a field of the allocator)
//! and the pool's mutable state. The allocator's KFENCE calls are in the
//! parent module; this one names no allocator or cache type, so the
//! allocator can hold it.

use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};

use super::object::{KFENCE_NUM_OBJECTS, KFENCE_POOL_PAGES, KfenceObject, KfencePlace};
use super::report::KfenceReport;
use crate::platform::PAGE_SIZE;

/// The pool's mutable state, under [`KfencePool::lock`].
pub(crate) struct PoolState {
    /// Free object indices, least recently freed first (a ring).
    pub(crate) free: [u8; KFENCE_NUM_OBJECTS],
    pub(crate) head: usize,
    pub(crate) len: usize,
    /// The placement of the next object (alternates).
    pub(crate) next_right: bool,
    /// A placement forced for the next sample.
    pub(crate) forced: Option<KfencePlace>,
    /// The objects' metadata (in pages from the primary source).
    pub(crate) meta: *mut KfenceObject,
}

impl PoolState {
    pub(crate) fn meta(&mut self, index: usize) -> &mut KfenceObject {
        debug_assert!(index < KFENCE_NUM_OBJECTS);
        // SAFETY: `meta` holds KFENCE_NUM_OBJECTS initialised entries
        // (kfence_init) once a pool exists, and only the lock's holder
        // reaches them.
        unsafe { &mut *self.meta.add(index) }
    }
}

/// The allocator's KFENCE state.
pub(crate) struct KfencePool {
    /// The pool's first page (0: no pool).
    pub(crate) pool: AtomicUsize,
    /// Sample interval in ns (0: off).
    pub(crate) interval_ns: AtomicU64,
    /// When the next sample is due ([`PlatformHooks::kfence_clock_ns`](crate::PlatformHooks::kfence_clock_ns)).
    pub(crate) next_ns: AtomicU64,
    /// A sample is armed: the next eligible allocation takes it.
    pub(crate) armed: AtomicBool,
    /// The cache a forced sample is for (0: any).
    pub(crate) target: AtomicUsize,
    pub(crate) lock: crate::sync::SpinIrq<PoolState>,
    pub(crate) nr_allocs: AtomicU64,
    pub(crate) nr_frees: AtomicU64,
    pub(crate) nr_skipped: AtomicU64,
    pub(crate) nr_bugs: AtomicU64,
    /// The meta array (also in `lock`'s state), for the hook-free lookups.
    pub(crate) meta: AtomicPtr<KfenceObject>,
    pub(crate) hook: crate::sync::SpinIrq<Option<fn(&KfenceReport)>>,
}

// SAFETY: the raw pointer in PoolState is only reached under the lock.
unsafe impl Send for PoolState {}

impl KfencePool {
    pub(crate) const fn new() -> KfencePool {
        KfencePool {
            pool: AtomicUsize::new(0),
            interval_ns: AtomicU64::new(0),
            next_ns: AtomicU64::new(0),
            armed: AtomicBool::new(false),
            target: AtomicUsize::new(0),
            lock: crate::sync::SpinIrq::new(PoolState {
                free: [0; KFENCE_NUM_OBJECTS],
                head: 0,
                len: 0,
                next_right: true,
                forced: None,
                meta: core::ptr::null_mut(),
            }),
            nr_allocs: AtomicU64::new(0),
            nr_frees: AtomicU64::new(0),
            nr_skipped: AtomicU64::new(0),
            nr_bugs: AtomicU64::new(0),
            meta: AtomicPtr::new(core::ptr::null_mut()),
            hook: crate::sync::SpinIrq::new(None),
        }
    }

    /// Whether `addr` lies in the pool.
    #[inline]
    pub(crate) fn contains(&self, addr: usize) -> bool {
        let pool = self.pool.load(Ordering::Acquire);
        pool != 0 && addr.wrapping_sub(pool) < KFENCE_POOL_PAGES * PAGE_SIZE
    }
}

/// The object whose page is pool page `page` (`None`: a guard page).
pub(crate) const fn object_of_page(page: usize) -> Option<usize> {
    if page >= 2 && page.is_multiple_of(2) {
        Some((page - 2) / 2)
    } else {
        None
    }
}

/// The page index (in the pool) of object `index`.
pub(crate) const fn object_page(index: usize) -> usize {
    2 + 2 * index
}
