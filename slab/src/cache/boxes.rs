//! [`SlabBox`](crate::SlabBox) and [`InitBox`](crate::InitBox) from a
//! cache.

use super::KmemCache;
use crate::alloc_tag::AllocTagRef;
use crate::error::AllocError;
use crate::object::SlabBox;
use crate::platform::Platform;

impl<P: Platform> KmemCache<P> {
    /// [`KmemCache::alloc`] as an owned [`SlabBox`], freed without `unsafe`.
    ///
    /// # Errors
    /// As for [`KmemCache::alloc`].
    pub fn alloc_box(&'static self) -> Result<SlabBox<P>, AllocError> {
        self.alloc().map(|ptr| SlabBox::from_cache(self, ptr))
    }

    /// [`KmemCache::alloc_tagged`] as an owned [`SlabBox`].
    ///
    /// # Errors
    /// As for [`KmemCache::alloc`].
    pub fn alloc_box_tagged(
        &'static self,
        tag: Option<AllocTagRef>,
    ) -> Result<SlabBox<P>, AllocError> {
        self.alloc_tagged(tag)
            .map(|ptr| SlabBox::from_cache(self, ptr))
    }
}
