//! The cache's locks (depot, slab layer, trace table) behind one name so
//! the `loom` model tests can swap them, and [`IrqGuard`], the interrupts-
//! off guard through which a CPU reaches its own per-CPU caches.
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

use core::marker::PhantomData;

#[cfg(not(all(test, loom)))]
pub(crate) use spin::{Mutex, MutexGuard};

#[cfg(all(test, loom))]
pub(crate) use loom_mutex::{Mutex, MutexGuard};

use crate::platform::Platform;

/// Interrupts disabled on this CPU (through [`Platform::irq_save`]) until
/// dropped, which restores the previous state. While one exists, the
/// running CPU owns its per-CPU caches: nothing else on this CPU runs
/// (no interrupt handler), and other CPUs reach them only through
/// [`Platform::cross_cpu_call`], which runs on this CPU, hence not now.
///
/// Not `Send`: the guard belongs to the CPU that made it.
#[must_use = "interrupts are restored when the guard is dropped"]
pub struct IrqGuard<P: Platform> {
    state: usize,
    _not_send: PhantomData<NotSend<P>>,
}

/// Makes [`IrqGuard`] neither `Send` nor `Sync` (a raw pointer), and ties
/// it to its platform.
type NotSend<P> = (*const (), fn() -> P);

impl<P: Platform> IrqGuard<P> {
    /// Disable interrupts until the guard is dropped.
    #[inline(always)]
    pub fn new() -> Self {
        IrqGuard {
            state: P::irq_save(),
            _not_send: PhantomData,
        }
    }
}

impl<P: Platform> Default for IrqGuard<P> {
    #[inline(always)]
    fn default() -> Self {
        Self::new()
    }
}

impl<P: Platform> Drop for IrqGuard<P> {
    #[inline(always)]
    fn drop(&mut self) {
        P::irq_restore(self.state);
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
