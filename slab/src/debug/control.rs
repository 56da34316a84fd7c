//! The debug machinery's handle ([`Kmem::debug`]): the error ring and
//! hooks, above the allocator (the trailer and the boot line's
//! configuration, in the rest of `debug/`, sit below the caches).

use crate::allocator::Kmem;
use crate::platform::Platform;

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
        self.heap.set_free_error_hook(hook);
    }

    /// Refused frees seen at the `GlobalAlloc` / `core::alloc::Allocator`
    /// edge.
    pub fn nr_bad_frees(&self) -> u64 {
        self.heap.nr_bad_frees()
    }
}
