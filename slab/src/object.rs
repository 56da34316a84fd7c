//! [`SlabBox`]: an owned object, so callers allocate and free without
//! `unsafe` (Asterinas' one-shot `HeapSlot`): the handle can be freed only
//! once, by consuming it (or dropping it), and only to where it came from.
//! The raw `unsafe` [`KmemCache::free`] and [`Allocator::kfree`] stay for
//! the shims and for callers that keep raw pointers.

use core::mem::MaybeUninit;
use core::ptr::NonNull;

use crate::allocator::Allocator;
use crate::cache::KmemCache;
use crate::error::{AllocError, FreeError};
use crate::platform::Platform;

/// Where a [`SlabBox`] goes back to.
enum Owner<P: Platform> {
    Cache(&'static KmemCache<P>),
    Kmalloc(&'static Allocator<P>),
}

impl<P: Platform> Clone for Owner<P> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<P: Platform> Copy for Owner<P> {}

/// An object a caller owns: from [`KmemCache::alloc_box`] (`obj_size()`
/// bytes) or [`Allocator::kmalloc_box`] (at least the requested size).
/// Freed by [`SlabBox::free`], or when dropped. `Send`: any CPU may free
/// it.
pub struct SlabBox<P: Platform> {
    ptr: NonNull<u8>,
    len: usize,
    owner: Owner<P>,
}

// SAFETY: the handle owns its object exclusively; the allocator may be
// called from any CPU.
unsafe impl<P: Platform> Send for SlabBox<P> {}
// SAFETY: shared access gives only the address and length.
unsafe impl<P: Platform> Sync for SlabBox<P> {}

impl<P: Platform> SlabBox<P> {
    /// The object's address.
    pub fn as_ptr(&self) -> NonNull<u8> {
        self.ptr
    }

    /// The object's size in bytes (the cache's object size; the requested
    /// size for kmalloc).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the object has no bytes (never: objects are at least one
    /// byte).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The object's bytes, possibly uninitialised (a constructed object's
    /// bytes are what its constructor wrote).
    pub fn as_uninit_mut(&mut self) -> &mut [MaybeUninit<u8>] {
        // SAFETY: the object is `len` bytes we own exclusively (`&mut self`);
        // MaybeUninit<u8> accepts any contents.
        unsafe { core::slice::from_raw_parts_mut(self.ptr.as_ptr().cast(), self.len) }
    }

    /// The object's first `len / 8` 8-byte words (objects are 8-aligned),
    /// possibly uninitialised.
    #[expect(
        clippy::cast_ptr_alignment,
        reason = "every object is at least 8-aligned (debug-asserted)"
    )]
    pub fn as_uninit_words_mut(&mut self) -> &mut [MaybeUninit<u64>] {
        debug_assert!(self.ptr.as_ptr().cast::<u64>().is_aligned());
        // SAFETY: as above; every object is at least 8-aligned, so the
        // words lie inside the object and are aligned.
        unsafe { core::slice::from_raw_parts_mut(self.ptr.as_ptr().cast(), self.len / 8) }
    }

    /// Give the object up as a raw pointer (to be freed with the unsafe
    /// `free` / `kfree`).
    pub fn into_raw(self) -> NonNull<u8> {
        let ptr = self.ptr;
        core::mem::forget(self);
        ptr
    }

    /// Free the object. Cannot fail for an object the handle owns; an
    /// error means the allocator found its state corrupted (reported, the
    /// object kept).
    ///
    /// # Errors
    /// The [`FreeError`] the allocator refused with.
    pub fn free(self) -> Result<(), FreeError> {
        let ptr = self.ptr;
        let result = match self.owner {
            // SAFETY: the object came from this cache and is owned by the
            // handle, which is consumed (forgotten below).
            Owner::Cache(cache) => unsafe { cache.free(ptr) },
            // SAFETY: as above, from this allocator's kmalloc.
            Owner::Kmalloc(alloc) => unsafe { alloc.kfree(ptr) },
        };
        core::mem::forget(self);
        result
    }
}

impl<P: Platform> Drop for SlabBox<P> {
    fn drop(&mut self) {
        let ptr = self.ptr;
        let result = match self.owner {
            // SAFETY: as in `free`; the handle is being dropped.
            Owner::Cache(cache) => unsafe { cache.free(ptr) },
            // SAFETY: as above.
            Owner::Kmalloc(alloc) => unsafe { alloc.kfree(ptr) },
        };
        debug_assert!(result.is_ok(), "{result:?}");
    }
}

impl<P: Platform> KmemCache<P> {
    /// [`KmemCache::alloc`] as an owned [`SlabBox`], freed without `unsafe`.
    ///
    /// # Errors
    /// As for [`KmemCache::alloc`].
    pub fn alloc_box(&'static self) -> Result<SlabBox<P>, AllocError> {
        let ptr = self.alloc()?;
        Ok(SlabBox {
            ptr,
            len: self.obj_size(),
            owner: Owner::Cache(self),
        })
    }
}

impl<P: Platform> Allocator<P> {
    /// [`Allocator::kmalloc`] as an owned [`SlabBox`] of `size` bytes,
    /// freed without `unsafe`.
    ///
    /// # Errors
    /// As for [`Allocator::kmalloc`].
    pub fn kmalloc_box(&'static self, size: usize, align: usize) -> Result<SlabBox<P>, AllocError> {
        let ptr = self.kmalloc(size, align)?;
        Ok(SlabBox {
            ptr,
            len: size,
            owner: Owner::Kmalloc(self),
        })
    }
}
