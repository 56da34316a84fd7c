//! [`SlabBox`]: an owned object, so callers allocate and free without
//! `unsafe` (Asterinas' one-shot `HeapSlot`): the handle can be freed only
//! once, by consuming it (or dropping it), and only to where it came from.
//! The raw `unsafe` [`KmemCache::free`] and [`Kmem::kfree`] stay for
//! the shims and for callers that keep raw pointers.
//!
//! Reading an object is safe only once every byte of it is known to be
//! written, and the types say when that is:
//!
//! - a [`SlabBox`] may hold uninitialised bytes (a fresh object): it has
//!   no view to read them, and none that could leave a byte uninitialised;
//!   [`SlabBox::write_words`] and [`SlabBox::fill`] write every byte and
//!   return an [`InitBox`], which can be read ([`InitBox::as_bytes`],
//!   [`InitBox::check_words`]); [`SlabBox::into_constructed`] makes one
//!   without writing for an object of a cache with a constructor (callers
//!   always get those constructed);
//! - a constructor ([`Ctor`](crate::Ctor)) is handed an [`ObjectInit`] and
//!   proves it wrote the whole object by returning the [`Constructed`]
//!   that only writing it yields; a destructor ([`Dtor`](crate::Dtor)) is
//!   handed an [`ObjectRef`], readable when the cache has a constructor.
//!
//! Word patterns ([`SlabBox::write_words`], [`InitBox::check_words`]) are
//! written and read with volatile accesses, so a check really reads the
//! memory (a stress test looking for overlapping objects or stray writes).
//!
//! Everything about the boxes is here: the types, and the constructors on
//! [`KmemCache`] ([`KmemCache::alloc_box`]) and [`Kmem`]
//! ([`Kmem::kmalloc_box`], the profiling handle's `kmalloc_box`) at the
//! end of this file.

use core::ptr::NonNull;

use crate::alloc_tag::{AllocProfiling, AllocTagRef};
use crate::allocator::Kmem;
use crate::allocator::kmalloc::KmallocObj;
use crate::cache::KmemCache;
use crate::constructor::{WordMismatch, check_words_at, write_words_at};
use crate::error::{AllocError, FreeError};
use crate::platform::Platform;

/// Where a [`SlabBox`] goes back to.
enum Owner<P: Platform> {
    Cache(&'static KmemCache<P>),
    Kmalloc(&'static Kmem<P>),
}

impl<P: Platform> Clone for Owner<P> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<P: Platform> Copy for Owner<P> {}

/// An object a caller owns: from [`KmemCache::alloc_box`] (`obj_size()`
/// bytes) or [`Kmem::kmalloc_box`] (at least the requested size).
/// Freed by [`SlabBox::free`], or when dropped. `Send`: any CPU may free
/// it. Its bytes may be uninitialised, so it gives no view to read them:
/// [`SlabBox::write_words`] and [`SlabBox::fill`] write all of them and
/// return a readable [`InitBox`]. No safe view leaves a byte of a
/// constructed object uninitialised (what [`SlabBox::into_constructed`]
/// relies on).
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

    /// Fill the whole object with `byte`: every byte written, so the
    /// result can be read.
    pub fn fill(self, byte: u8) -> InitBox<P> {
        // SAFETY: the object is `len` bytes we own exclusively (consumed).
        unsafe { self.ptr.as_ptr().write_bytes(byte, self.len) };
        InitBox(self)
    }

    /// Give the object up as a raw pointer (to be freed with the unsafe
    /// `free` / `kfree`).
    pub fn into_raw(self) -> NonNull<u8> {
        let ptr = self.ptr;
        core::mem::forget(self);
        ptr
    }

    /// Write `word(i)` to the object's i-th 8-byte word (little-endian; for
    /// a length not a multiple of 8, the low bytes of the next word fill the
    /// tail): every byte written, so the result can be read.
    pub fn write_words(self, word: impl Fn(usize) -> u64) -> InitBox<P> {
        // SAFETY: the object is `len` bytes we own exclusively (consumed),
        // 8-aligned (every object is).
        unsafe { write_words_at(self.ptr, self.len, word) };
        InitBox(self)
    }

    /// The object as an [`InitBox`] if it comes from a cache with a
    /// constructor: callers always get such objects in their constructed
    /// state, every byte written by the constructor ([`Constructed`](crate::Constructed)) or
    /// by the caller that freed it. Otherwise the box back, unchanged.
    ///
    /// # Errors
    /// `Err(self)` for a kmalloc object or one of a cache without a
    /// constructor.
    pub fn into_constructed(self) -> Result<InitBox<P>, SlabBox<P>> {
        match self.owner {
            Owner::Cache(cache) if cache.params.ctor.is_some() => Ok(InitBox(self)),
            _ => Err(self),
        }
    }

    /// Resize a kmalloc object ([`Kmem::krealloc`]) to `new_size`
    /// bytes aligned to `align`: in place when the block's usable size
    /// holds them and it is so aligned, otherwise a new block gets the
    /// first `min(usable size, new_size)` bytes and this one is freed. The
    /// result may hold uninitialised bytes, so it is a [`SlabBox`].
    ///
    /// # Errors
    /// `Err((self, error))`, the object untouched and still the caller's:
    /// [`AllocError::InvalidLayout`] for an object of a cache (only
    /// kmalloc objects resize), a `new_size` of 0 or an `align` that is not
    /// a power of two; otherwise as for [`Kmem::kmalloc`].
    pub fn krealloc(
        self,
        new_size: usize,
        align: usize,
    ) -> Result<SlabBox<P>, (SlabBox<P>, AllocError)> {
        let Owner::Kmalloc(alloc) = self.owner else {
            return Err((self, AllocError::InvalidLayout));
        };
        // SAFETY: a live kmalloc block the handle owns; on success it is
        // given up (the handle is forgotten below), on error untouched.
        match unsafe { alloc.krealloc(Some(self.ptr), new_size, align) } {
            Ok(ptr) => {
                core::mem::forget(self);
                Ok(SlabBox {
                    ptr,
                    len: new_size,
                    owner: Owner::Kmalloc(alloc),
                })
            }
            Err(error) => Err((self, error)),
        }
    }

    /// Free the object. Cannot fail for an object the handle owns; an
    /// error means the allocator found its state corrupted (reported, the
    /// object kept).
    ///
    /// # Errors
    /// The [`FreeError`] the allocator refused with.
    pub fn free(self) -> Result<(), FreeError> {
        // SAFETY: the handle is consumed (forgotten below).
        let result = unsafe { self.give_back() };
        core::mem::forget(self);
        result
    }

    /// Free the object to its cache or kmalloc (`free` and `drop`).
    ///
    /// # Safety
    /// The handle is not used again (consumed or being dropped).
    unsafe fn give_back(&self) -> Result<(), FreeError> {
        match self.owner {
            // SAFETY: the object came from this cache and is owned by the
            // handle, given up per our caller.
            Owner::Cache(cache) => unsafe { cache.free(self.ptr) },
            // SAFETY: as above, from this allocator's kmalloc.
            Owner::Kmalloc(alloc) => unsafe { alloc.kfree(self.ptr) },
        }
    }
}

/// A [`SlabBox`] whose every byte is written: readable. From
/// [`SlabBox::write_words`] or [`SlabBox::into_constructed`]; freed by
/// [`InitBox::free`] or when dropped. Its views keep every byte
/// initialised.
pub struct InitBox<P: Platform>(SlabBox<P>);

impl<P: Platform> InitBox<P> {
    /// [`Kmem::kmalloc_with`] zeroed ([`KmallocArgs::zeroed`](crate::KmallocArgs::zeroed), Linux `kzalloc`) as an owned [`InitBox`] of `size` bytes, all
    /// zero (so readable at once), aligned to `align`; freed without
    /// `unsafe`, like a [`Kmem::kmalloc_box`].
    ///
    /// # Errors
    /// As for [`Kmem::kmalloc`].
    pub fn kzalloc(
        alloc: &'static Kmem<P>,
        size: usize,
        align: usize,
    ) -> Result<InitBox<P>, AllocError> {
        let ptr = alloc.kmalloc_with(crate::KmallocArgs::new(size, align).zeroed())?;
        // Every one of the `size` bytes is zero (kzalloc): initialised.
        Ok(InitBox(SlabBox {
            ptr,
            len: size,
            owner: Owner::Kmalloc(alloc),
        }))
    }

    /// The object's address.
    pub fn as_ptr(&self) -> NonNull<u8> {
        self.0.ptr
    }

    /// The object's size in bytes (as [`SlabBox::len`]).
    pub fn len(&self) -> usize {
        self.0.len
    }

    /// Whether the object has no bytes (never).
    pub fn is_empty(&self) -> bool {
        self.0.len == 0
    }

    /// The object's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        // SAFETY: `len` bytes we own, every one initialised (the type's
        // invariant); shared borrow of the handle.
        unsafe { core::slice::from_raw_parts(self.0.ptr.as_ptr(), self.0.len) }
    }

    /// The object's bytes, to change.
    pub fn as_bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, exclusively borrowed; `u8` writes keep every
        // byte initialised.
        unsafe { core::slice::from_raw_parts_mut(self.0.ptr.as_ptr(), self.0.len) }
    }

    /// Write a word pattern over the object, as [`SlabBox::write_words`].
    pub fn write_words(&mut self, word: impl Fn(usize) -> u64) {
        // SAFETY: `len` bytes we own exclusively (`&mut self`), 8-aligned.
        unsafe { write_words_at(self.0.ptr, self.0.len, word) };
    }

    /// Compare the object with the pattern [`InitBox::write_words`] writes
    /// (volatile loads: the memory is really read).
    ///
    /// # Errors
    /// The first word (or tail byte) that differs.
    pub fn check_words(&self, word: impl Fn(usize) -> u64) -> Result<(), WordMismatch> {
        // SAFETY: `len` initialised bytes we own, 8-aligned.
        unsafe { check_words_at(self.0.ptr, self.0.len, word) }
    }

    /// Free the object, as [`SlabBox::free`].
    ///
    /// # Errors
    /// As for [`SlabBox::free`].
    pub fn free(self) -> Result<(), FreeError> {
        self.0.free()
    }

    /// Give the object up as a raw pointer, as [`SlabBox::into_raw`].
    pub fn into_raw(self) -> NonNull<u8> {
        self.0.into_raw()
    }
}

/// How the cache paths make a [`SlabBox`] (the kmalloc paths write the
/// literal: the box of `ptr`, `size` bytes, owned by the allocator).
impl<P: Platform> SlabBox<P> {
    /// The box of `ptr`, an object of `cache` just allocated.
    pub(crate) fn from_cache(cache: &'static KmemCache<P>, ptr: NonNull<u8>) -> SlabBox<P> {
        SlabBox {
            ptr,
            len: cache.obj_size(),
            owner: Owner::Cache(cache),
        }
    }
}

impl<P: Platform> Drop for SlabBox<P> {
    fn drop(&mut self) {
        // SAFETY: the handle is being dropped.
        let result = unsafe { self.give_back() };
        debug_assert!(result.is_ok(), "{result:?}");
    }
}

// ---------------------------------------------------------------------------
// Boxes from a cache

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

// ---------------------------------------------------------------------------
// Boxes from kmalloc

impl<P: Platform> Kmem<P> {
    /// [`Kmem::kmalloc`] as an owned [`SlabBox`] of `size` bytes,
    /// freed without `unsafe`.
    ///
    /// # Errors
    /// As for [`Kmem::kmalloc`].
    pub fn kmalloc_box(&'static self, size: usize, align: usize) -> Result<SlabBox<P>, AllocError> {
        let ptr = self.kmalloc(size, align)?;
        Ok(SlabBox {
            ptr,
            len: size,
            owner: Owner::Kmalloc(self),
        })
    }
}

impl<P: Platform> AllocProfiling<'static, P> {
    /// [`Kmem::kmalloc_with`] charged to `tag` ([`KmallocArgs::tag`](crate::KmallocArgs::tag)) as an owned [`SlabBox`] of `size`
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
        let ptr = self
            .heap
            .kmalloc_with(crate::KmallocArgs::new(size, align).tag(tag))?;
        Ok(SlabBox {
            ptr,
            len: size,
            owner: Owner::Kmalloc(self.heap),
        })
    }
}

// ---------------------------------------------------------------------------
// Typed boxes

/// A `T` a caller owns, from its type's own kmalloc partition
/// ([`KmallocArgs::of`](crate::KmallocArgs::of): `kmalloc-data-<size>` for a pointer-free type,
/// a random copy chosen by the type for every other), so a buffer an
/// attacker fills never shares a slab with objects holding pointers
/// (issue 33; Linux's typed `kmalloc_obj`). Rust for Linux's `KBox<T>`,
/// partitioned: made by [`Kmem::kbox`], read and written through
/// `Deref`/`DerefMut`, and on drop `T` is dropped and the object freed.
/// `Send`/`Sync` as `T` is: any CPU may free it.
pub struct KBox<T: KmallocObj, P: Platform> {
    ptr: NonNull<T>,
    heap: &'static Kmem<P>,
}

// SAFETY: the box owns its `T` exclusively (as `Box<T>` does); the
// allocator may be called from any CPU.
unsafe impl<T: KmallocObj + Send, P: Platform> Send for KBox<T, P> {}
// SAFETY: shared access gives `&T` only.
unsafe impl<T: KmallocObj + Sync, P: Platform> Sync for KBox<T, P> {}

impl<P: Platform> Kmem<P> {
    /// `value` in a [`KBox`], from `T`'s partition
    /// ([`KmallocArgs::of`](crate::KmallocArgs::of)). Charged to the current tag.
    ///
    /// # Errors
    /// As for [`Kmem::kmalloc`] (`InvalidLayout` for a zero-sized `T`);
    /// `value` is dropped, as `Box::try_new` drops it.
    pub fn kbox<T: KmallocObj>(&'static self, value: T) -> Result<KBox<T, P>, AllocError> {
        let ptr = self
            .kmalloc_with(crate::KmallocArgs::of::<T>())?
            .cast::<T>();
        // SAFETY: a fresh object of at least `size_of::<T>()` bytes,
        // aligned for `T` (kmalloc's contract), ours.
        unsafe { ptr.as_ptr().write(value) };
        Ok(KBox { ptr, heap: self })
    }
}

impl<T: KmallocObj, P: Platform> KBox<T, P> {
    /// The object's address.
    pub fn as_ptr(&self) -> NonNull<T> {
        self.ptr
    }

    /// The `T`, out of the box; the object is freed.
    pub fn into_inner(self) -> T {
        let this = core::mem::ManuallyDrop::new(self);
        // SAFETY: the box holds an initialised `T`, read once: the box is
        // not dropped (ManuallyDrop), so `T` is not dropped twice.
        let value = unsafe { this.ptr.as_ptr().read() };
        this.release();
        value
    }

    /// Free the object (its `T` already dropped or moved out).
    fn release(&self) {
        // SAFETY: our object, from this heap's kmalloc, freed once
        // (by drop or into_inner, which consume the box).
        let freed = unsafe { self.heap.kfree(self.ptr.cast()) };
        debug_assert!(freed.is_ok(), "KBox: {freed:?}");
    }
}

impl<T: KmallocObj, P: Platform> core::ops::Deref for KBox<T, P> {
    type Target = T;

    fn deref(&self) -> &T {
        // SAFETY: the box holds an initialised `T` it owns.
        unsafe { self.ptr.as_ref() }
    }
}

impl<T: KmallocObj, P: Platform> core::ops::DerefMut for KBox<T, P> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as for `deref`, and `&mut self` is exclusive.
        unsafe { self.ptr.as_mut() }
    }
}

impl<T: KmallocObj, P: Platform> Drop for KBox<T, P> {
    fn drop(&mut self) {
        // SAFETY: the box holds an initialised `T`, dropped once, here.
        unsafe { self.ptr.as_ptr().drop_in_place() };
        self.release();
    }
}

impl<T: KmallocObj + core::fmt::Debug, P: Platform> core::fmt::Debug for KBox<T, P> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        core::fmt::Debug::fmt(&**self, f)
    }
}
