//! The locks of a cache (per-CPU, depot, slab layer, trace table), behind
//! one name so the `loom` model tests can swap them.
//!
//! Normal builds: exactly [`spin::Mutex`] and [`spin::MutexGuard`]
//! re-exported, so this module costs nothing. Host tests built with
//! `RUSTFLAGS="--cfg loom"`: a thin wrapper over `loom::sync::Mutex` with
//! spin's API (`lock` returns the guard, `try_lock` an `Option`), so that
//! loom sees, and permutes, every acquisition of these locks (a spinning
//! lock would hang a loom model: loom only switches threads at its own
//! operations).
//!
//! The allocator-wide locks (the cache list, the free-error hook) stay
//! `spin::Mutex` in both builds: they must be constructible in a `const fn`
//! ([`Allocator::new`](crate::Allocator::new)), which loom's are not, and
//! the models never contend on them.

#[cfg(not(all(test, loom)))]
pub(crate) use spin::{Mutex, MutexGuard};

#[cfg(all(test, loom))]
pub(crate) use loom_mutex::{Mutex, MutexGuard};

/// The per-CPU cache lock: in normal builds a one-byte test-and-set lock
/// ([`pcpu_lock::PcpuLock`]: one `xchg` to acquire, a plain release store
/// to release, the spinning out of line); under loom, the loom mutex.
#[cfg(not(all(test, loom)))]
pub(crate) use pcpu_lock::{PcpuGuard, PcpuLock};

#[cfg(all(test, loom))]
pub(crate) use loom_mutex::{Mutex as PcpuLock, MutexGuard as PcpuGuard};

#[cfg(not(all(test, loom)))]
mod pcpu_lock {
    use core::cell::UnsafeCell;
    use core::ops::{Deref, DerefMut};
    use core::sync::atomic::{AtomicBool, Ordering};

    /// A spin lock for the per-CPU caches, cheapest when uncontended (the
    /// normal case: only its own CPU takes it, plus the rare drain or
    /// statistics reader): acquire is one `xchg`, release one store.
    pub(crate) struct PcpuLock<T> {
        locked: AtomicBool,
        value: UnsafeCell<T>,
    }

    // SAFETY: the value is only reached through a guard, and at most one
    // guard exists at a time (the `locked` flag, Acquire/Release).
    unsafe impl<T: Send> Sync for PcpuLock<T> {}
    // SAFETY: as above; the lock owns its value.
    unsafe impl<T: Send> Send for PcpuLock<T> {}

    /// Holds a [`PcpuLock`]; releases it when dropped.
    pub(crate) struct PcpuGuard<'a, T> {
        lock: &'a PcpuLock<T>,
    }

    impl<T> PcpuLock<T> {
        pub(crate) const fn new(value: T) -> Self {
            PcpuLock {
                locked: AtomicBool::new(false),
                value: UnsafeCell::new(value),
            }
        }

        #[inline(always)]
        pub(crate) fn lock(&self) -> PcpuGuard<'_, T> {
            if self.locked.swap(true, Ordering::Acquire) {
                self.lock_contended();
            }
            PcpuGuard { lock: self }
        }

        #[cold]
        #[inline(never)]
        fn lock_contended(&self) {
            loop {
                while self.locked.load(Ordering::Relaxed) {
                    core::hint::spin_loop();
                }
                if !self.locked.swap(true, Ordering::Acquire) {
                    return;
                }
            }
        }

        #[inline(always)]
        pub(crate) fn try_lock(&self) -> Option<PcpuGuard<'_, T>> {
            if self.locked.swap(true, Ordering::Acquire) {
                None
            } else {
                Some(PcpuGuard { lock: self })
            }
        }
    }

    impl<T> Deref for PcpuGuard<'_, T> {
        type Target = T;
        #[inline(always)]
        fn deref(&self) -> &T {
            // SAFETY: we hold the lock: no other reference to the value.
            unsafe { &*self.lock.value.get() }
        }
    }

    impl<T> DerefMut for PcpuGuard<'_, T> {
        #[inline(always)]
        fn deref_mut(&mut self) -> &mut T {
            // SAFETY: we hold the lock: no other reference to the value.
            unsafe { &mut *self.lock.value.get() }
        }
    }

    impl<T> Drop for PcpuGuard<'_, T> {
        #[inline(always)]
        fn drop(&mut self) {
            self.lock.locked.store(false, Ordering::Release);
        }
    }
}

#[cfg(all(test, loom))]
mod loom_mutex {
    /// `loom::sync::Mutex` with `spin::Mutex`'s API.
    pub(crate) struct Mutex<T>(loom::sync::Mutex<T>);

    pub(crate) type MutexGuard<'a, T> = loom::sync::MutexGuard<'a, T>;

    impl<T> Mutex<T> {
        pub(crate) fn new(value: T) -> Self {
            Mutex(loom::sync::Mutex::new(value))
        }

        pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
            self.0.lock().expect("loom mutex poisoned")
        }

        pub(crate) fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
            self.0.try_lock().ok()
        }

        #[allow(dead_code, reason = "used by host unit tests on a fresh Depot")]
        pub(crate) fn into_inner(self) -> T {
            self.0.into_inner().expect("loom mutex poisoned")
        }
    }
}
