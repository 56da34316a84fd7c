//! The debug machinery's handle ([`Kmem::debug`]): the error ring and
//! hooks, above the allocator (the trailer and the boot line's
//! configuration, in the rest of `debug/`, sit below the caches).

#[cfg(feature = "debug")]
use super::SlabDebugConfig;
use crate::allocator::Kmem;
use crate::platform::Platform;
use crate::reports::error::ErrorReport;
use crate::sync::IrqGuard;

/// The allocator's error reports, debug configuration and walkers, from
/// [`Kmem::debug`]: the error ring and hooks, the boot line's debug
/// flags, `verify`, `whatis` and (debug builds) the invariant check.
#[derive(Clone, Copy)]
pub struct SlabDebug<'a, P: Platform> {
    pub(crate) heap: &'a Kmem<P>,
}

impl<P: Platform> Kmem<P> {
    /// Error reports, debug configuration and walkers: [`SlabDebug`].
    pub fn debug(&self) -> SlabDebug<'_, P> {
        SlabDebug { heap: self }
    }
}

impl<P: Platform> SlabDebug<'_, P> {
    /// Called with every error a `GlobalAlloc::dealloc` (or
    /// `core::alloc::Allocator::deallocate`) hits; the kernel can log or
    /// panic. The error has already been counted in
    /// [`SlabDebug::nr_bad_frees`] and nothing was changed.
    pub fn set_free_error_hook(&self, hook: Option<fn(&crate::FreeError)>) {
        *self.heap.free_error_hook.lock::<P>() = hook;
    }

    /// Refused frees seen at the `GlobalAlloc` / `core::alloc::Allocator`
    /// edge.
    pub fn nr_bad_frees(&self) -> u64 {
        self.heap
            .nr_bad_frees
            .load(core::sync::atomic::Ordering::Relaxed)
    }
}

/// Feature `debug`: the boot-line configuration.
#[cfg(feature = "debug")]
impl<P: Platform> SlabDebug<'_, P> {
    /// The boot-line debug configuration (`slab_debug=`, `kmem_flags=`;
    /// see [`SlabDebugConfig`]): call before [`Kmem::init`] so the
    /// kmalloc caches get it; caches created later get it too (by name).
    /// Caches that exist already keep their flags.
    pub fn set_config(&self, config: SlabDebugConfig) {
        *self.heap.debug_config.lock::<P>() = config;
    }

    /// The debug configuration in force.
    pub fn config(&self) -> SlabDebugConfig {
        *self.heap.debug_config.lock::<P>()
    }
}

impl<P: Platform> SlabDebug<'_, P> {
    /// Called with every error report, after it is kept in the error ring,
    /// with no allocator lock held; the kernel prints it (and may panic).
    /// The hook must not allocate from this allocator.
    pub fn set_error_hook(&self, hook: Option<fn(&ErrorReport)>) {
        *self.heap.error_hook.lock::<P>() = hook;
    }

    /// Errors reported since the allocator was created (the ring keeps the
    /// latest [`ERROR_RING_SIZE`](crate::reports::error::ERROR_RING_SIZE)).
    pub fn nr_errors(&self) -> u64 {
        let _irq = IrqGuard::<P>::new();
        self.heap.errors.nr_reported()
    }

    /// Copy the kept reports numbered after `after` into `out`, oldest
    /// first; returns how many.
    pub fn read_errors(&self, after: u64, out: &mut [ErrorReport]) -> usize {
        let _irq = IrqGuard::<P>::new();
        self.heap.errors.read(after, out)
    }
}
