//! The cache's calls into its slab layer ([`crate::slab::SlabLayer`]),
//! and the hardened free list of one of its small slabs.

use core::ptr::NonNull;

use super::KmemCache;
use crate::error::AllocError;
use crate::platform::Platform;

/// The slab layer's entry points used by the rest of the crate.
impl<P: Platform> KmemCache<P> {
    /// [`SlabLayer::alloc_raw`].
    pub(crate) fn slab_alloc_raw(&self) -> Result<NonNull<u8>, AllocError> {
        self.slab.alloc_raw(self)
    }

    /// [`SlabLayer::alloc_constructed`].
    pub(crate) fn slab_alloc_constructed(&self) -> Result<NonNull<u8>, AllocError> {
        self.slab.alloc_constructed(self)
    }

    /// [`SlabLayer::free_raw`].
    ///
    /// # Safety
    /// As [`SlabLayer::free_raw`].
    pub(crate) unsafe fn slab_free_raw(&self, obj: *mut u8) {
        // SAFETY: per the caller.
        unsafe { self.slab.free_raw(self, obj) }
    }

    /// [`SlabLayer::free_objects`].
    ///
    /// # Safety
    /// As [`SlabLayer::free_objects`].
    pub(crate) unsafe fn slab_free_objects(&self, objs: &[*mut u8]) {
        // SAFETY: per the caller.
        unsafe { self.slab.free_objects(self, objs) }
    }

    /// [`SlabLayer::reap`].
    pub(crate) fn reap_slabs(&self) -> usize {
        self.slab.reap(self)
    }

    /// [`SlabLayer::discard_all`].
    ///
    /// # Safety
    /// As [`SlabLayer::discard_all`].
    pub(crate) unsafe fn discard_all_slabs(&self) {
        // SAFETY: per the caller.
        unsafe { self.slab.discard_all(self) }
    }

    /// [`SlabLayer::free_hash_table`].
    pub(crate) fn free_hash_table(&self) {
        self.slab.free_hash_table(self)
    }
}

impl<P: Platform> KmemCache<P> {
    /// The hardened free list of the small slab whose object 0 is at
    /// `base`.
    pub(crate) fn free_list(&self, base: usize) -> crate::layout::freelist::FreeList {
        crate::layout::freelist::FreeList {
            base,
            stride: self.stride,
            nr_objs: self.nr_objs_per_slab,
            link_offset: self.freeptr_offset,
            secret: self.freelist_secret,
        }
    }
}
