//! [`SlabBox`](crate::SlabBox) and [`InitBox`](crate::InitBox) from
//! kmalloc.

use super::Kmem;
use crate::alloc_tag::AllocProfiling;
use crate::alloc_tag::AllocTagRef;
use crate::error::AllocError;
use crate::object::SlabBox;
use crate::platform::Platform;

impl<P: Platform> Kmem<P> {
    /// [`Kmem::kmalloc`] as an owned [`SlabBox`] of `size` bytes,
    /// freed without `unsafe`.
    ///
    /// # Errors
    /// As for [`Kmem::kmalloc`].
    pub fn kmalloc_box(&'static self, size: usize, align: usize) -> Result<SlabBox<P>, AllocError> {
        let ptr = self.kmalloc(size, align)?;
        Ok(SlabBox::from_kmalloc(self, ptr, size))
    }
}

impl<P: Platform> AllocProfiling<'static, P> {
    /// [`Kmem::kmalloc_tagged`] as an owned [`SlabBox`] of `size`
    /// bytes.
    ///
    /// # Errors
    /// As for [`Kmem::kmalloc`].
    pub fn kmalloc_box(
        &self,
        size: usize,
        align: usize,
        tag: Option<AllocTagRef>,
    ) -> Result<SlabBox<P>, AllocError> {
        let ptr = self.heap.kmalloc_tagged(size, align, tag)?;
        Ok(SlabBox::from_kmalloc(self.heap, ptr, size))
    }
}
