//! Feature `debug` off: the calls the slab layer, the resizes and the
//! walkers make into `object.rs`, as empty inline stubs. No cache has a
//! debug layout ([`DebugLayout`] is uninhabited: `DebugLayout::new`
//! returns `None`), so the stubs are never reached and the ones that take
//! a layout cannot be called. The alloc and free hooks have no stub:
//! their one call each (`cache/hooks.rs`, `cache/free.rs`) is compiled
//! out with the feature.

use super::layout::{DebugLayout, DebugObjectInfo};
use crate::cache::KmemCache;
use crate::platform::Platform;
use crate::reports::error::ErrorReport;
use crate::slab::Slab;

impl<P: Platform> KmemCache<P> {
    /// No debug cache: no redzone to move.
    ///
    /// # Safety
    /// None needed (nothing is touched); as for the feature's hook.
    #[inline(always)]
    pub(crate) unsafe fn debug_resized(&self, addr: usize, slab: *mut Slab, new_size: usize) {
        let _ = (addr, slab, new_size);
    }

    /// Never called: no layout exists.
    ///
    /// # Safety
    /// None needed (it cannot be called).
    #[inline(always)]
    pub(crate) unsafe fn debug_init_object(&self, layout: &DebugLayout, addr: usize) {
        let _ = addr;
        match layout.off {}
    }

    /// Never called: no layout exists.
    ///
    /// # Safety
    /// None needed (it cannot be called).
    #[inline(always)]
    pub(crate) unsafe fn debug_verify_object(
        &self,
        layout: &DebugLayout,
        addr: usize,
        slab: usize,
        free_in_slab: bool,
    ) -> Option<ErrorReport> {
        let _ = (addr, slab, free_in_slab);
        match layout.off {}
    }

    /// Never called: no layout exists.
    ///
    /// # Safety
    /// None needed (it cannot be called).
    #[inline(always)]
    pub(crate) unsafe fn debug_object_info(
        &self,
        layout: &DebugLayout,
        addr: usize,
    ) -> DebugObjectInfo {
        let _ = addr;
        match layout.off {}
    }
}
