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
