//! The cache and its slab layer ([`crate::slab::SlabLayer`]): the
//! cache's calls into it, and what the layer asks of the cache
//! ([`SlabOwner`]: identity, error sink, bootstrap caches, debug hooks).

use core::ptr::NonNull;

use core::sync::atomic::Ordering;

use super::{KmemCache, OwnerCache};
#[cfg(feature = "alloc-profiling")]
use crate::alloc_tag::AllocTagRef;
use crate::error::AllocError;
use crate::platform::PageSource;
use crate::platform::Platform;
use crate::reports::error::ErrorReport;
use crate::slab::{Metadata, Slab, SlabOwner};

/// The slab layer's entry points used by the rest of the crate.
impl<P: Platform> KmemCache<P> {
    /// [`SlabLayer::alloc_raw`].
    pub(crate) fn slab_alloc_raw(&self) -> Result<NonNull<u8>, AllocError> {
        self.slab.alloc_raw(&self.params, self)
    }

    /// [`SlabLayer::alloc_constructed`].
    /// Counted in the cache's direct counters.
    pub(crate) fn slab_alloc_constructed(&self) -> Result<NonNull<u8>, AllocError> {
        let obj = self.slab.alloc_constructed(&self.params, self)?;
        self.nr_allocs_direct.fetch_add(1, Ordering::Relaxed);
        Ok(obj)
    }

    /// [`SlabLayer::free_raw`].
    ///
    /// # Safety
    /// As [`SlabLayer::free_raw`].
    pub(crate) unsafe fn slab_free_raw(&self, obj: *mut u8) {
        // SAFETY: per the caller.
        unsafe { self.slab.free_raw(&self.params, self, obj) }
    }

    /// [`SlabLayer::free_objects`].
    ///
    /// # Safety
    /// As [`SlabLayer::free_objects`].
    pub(crate) unsafe fn slab_free_objects(&self, objs: &[*mut u8]) {
        // SAFETY: per the caller.
        unsafe { self.slab.free_objects(&self.params, self, objs) }
    }

    /// [`SlabLayer::reap`].
    pub(crate) fn reap_slabs(&self) -> usize {
        self.slab.reap(&self.params, self)
    }

    /// [`SlabLayer::discard_all`].
    ///
    /// # Safety
    /// As [`SlabLayer::discard_all`].
    pub(crate) unsafe fn discard_all_slabs(&self) {
        // SAFETY: per the caller.
        unsafe { self.slab.discard_all(&self.params) }
    }

    /// [`SlabLayer::free_hash_table`].
    pub(crate) fn free_hash_table(&self) {
        self.slab.free_hash_table(self)
    }
}

impl<P: Platform> SlabOwner for KmemCache<P> {
    type Platform = P;

    #[inline]
    fn id(&self) -> *const () {
        (self as *const Self).cast()
    }

    fn name(&self) -> &str {
        KmemCache::name(self)
    }

    fn report(&self, report: ErrorReport) {
        self.owner().report_error(report);
    }

    fn reap_for_pressure(&self) -> bool {
        self.owner().reap_for_pressure()
    }

    fn alloc_metadata(&self, which: Metadata) -> Result<NonNull<u8>, AllocError> {
        self.owner().cache(owner_cache(which)).slab_alloc_raw()
    }

    unsafe fn free_metadata(&self, which: Metadata, obj: *mut u8) {
        // SAFETY: per our caller, an object of that bootstrap cache's
        // slab layer, unused.
        unsafe { self.owner().cache(owner_cache(which)).slab_free_raw(obj) }
    }

    fn metadata_source(&self) -> &'static dyn PageSource {
        self.owner().primary_source()
    }

    unsafe fn debug_init_object(&self, addr: usize) {
        if let Some(layout) = self.debug.as_ref() {
            // SAFETY: per our caller.
            unsafe { KmemCache::debug_init_object(self, layout, addr) };
        }
    }

    unsafe fn debug_verify_free_object(&self, addr: usize, slab: *mut Slab) -> Option<ErrorReport> {
        let layout = self.debug.as_ref()?;
        // SAFETY: per our caller.
        unsafe { self.debug_verify_object(layout, addr, slab as usize, true) }
    }

    #[cfg(feature = "alloc-profiling")]
    unsafe fn free_tag_array(&self, tags: *mut Option<AllocTagRef>) {
        // SAFETY: per our caller.
        unsafe { KmemCache::free_tag_array(self, tags) }
    }
}

/// The bootstrap cache of a kind of slab metadata.
fn owner_cache(which: Metadata) -> OwnerCache {
    match which {
        Metadata::Slab => OwnerCache::Slab,
        Metadata::Bufctl => OwnerCache::Bufctl,
    }
}
