//! What a constructor and a destructor see of an object, below every
//! layer that calls them (the slab layer runs them): [`Ctor`] is handed
//! an [`ObjectInit`] and proves it wrote the whole object by returning
//! the [`Constructed`] that only writing it yields; [`Dtor`] is handed an
//! [`ObjectRef`], readable when the cache has a constructor. Also the
//! volatile word-pattern writes and checks these views share with
//! [`SlabBox`](crate::SlabBox) and [`InitBox`](crate::InitBox).

use core::marker::PhantomData;
use core::mem::MaybeUninit;
use core::ptr::NonNull;

/// Object constructor: runs when an object leaves the slab layer towards
/// callers (it then stays constructed in the magazines). It is handed the
/// object (the cache's object size in bytes, possibly uninitialised) and
/// returns the [`Constructed`] that writing all of it yields; an `Err`
/// fails the allocation. Callers get the objects of a cache with a
/// constructor constructed, and give them back constructed (Bonwick 1994):
/// every byte initialised, so they can be read
/// ([`SlabBox::into_constructed`](crate::SlabBox::into_constructed)).
pub type Ctor = for<'a> fn(obj: ObjectInit<'a>) -> Result<Constructed<'a>, ()>;

/// Object destructor: runs when an object goes back from the magazine
/// layer to the slab layer; readable if the cache has a constructor
/// ([`ObjectRef::as_bytes`](crate::ObjectRef::as_bytes)).
pub type Dtor = for<'a> fn(obj: ObjectRef<'a>);

/// Where a word pattern first differs from what an object holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WordMismatch {
    /// Byte offset of the first differing word (or tail byte).
    pub offset: usize,
    /// What the pattern says (a tail byte: that byte).
    pub expected: u64,
    /// What the object holds.
    pub found: u64,
}

/// Write `word(i)` over the `len` bytes at `ptr`: whole little-endian words,
/// then the low bytes of `word(len / 8)` for the tail. Volatile stores.
///
/// # Safety
/// `ptr` is 8-aligned and valid for writes of `len` bytes nobody else
/// accesses meanwhile.
#[expect(
    clippy::cast_ptr_alignment,
    reason = "`ptr` is 8-aligned (the Safety contract; every object is)"
)]
pub(crate) unsafe fn write_words_at(ptr: NonNull<u8>, len: usize, word: impl Fn(usize) -> u64) {
    debug_assert!(ptr.as_ptr().cast::<u64>().is_aligned());
    let nr_words = len / 8;
    let words = ptr.as_ptr().cast::<u64>();
    for index in 0..nr_words {
        // SAFETY: per the caller; (index + 1) * 8 <= len, 8-aligned.
        unsafe { words.add(index).write_volatile(word(index).to_le()) };
    }
    let tail = word(nr_words).to_le_bytes();
    for (offset, &byte) in tail.iter().enumerate().take(len % 8) {
        // SAFETY: per the caller; nr_words * 8 + offset < len.
        unsafe { ptr.as_ptr().add(nr_words * 8 + offset).write_volatile(byte) };
    }
}

/// Compare the `len` bytes at `ptr` with what [`write_words_at`] writes.
/// Volatile loads.
///
/// # Safety
/// `ptr` is 8-aligned and valid for reads of `len` initialised bytes.
#[expect(
    clippy::cast_ptr_alignment,
    reason = "`ptr` is 8-aligned (the Safety contract; every object is)"
)]
pub(crate) unsafe fn check_words_at(
    ptr: NonNull<u8>,
    len: usize,
    word: impl Fn(usize) -> u64,
) -> Result<(), WordMismatch> {
    let nr_words = len / 8;
    let words = ptr.as_ptr().cast::<u64>();
    for index in 0..nr_words {
        // SAFETY: per the caller; inside the object, 8-aligned.
        let found = u64::from_le(unsafe { words.add(index).read_volatile() });
        if found != word(index) {
            return Err(WordMismatch {
                offset: index * 8,
                expected: word(index),
                found,
            });
        }
    }
    let tail = word(nr_words).to_le_bytes();
    for (offset, &byte) in tail.iter().enumerate().take(len % 8) {
        // SAFETY: per the caller; nr_words * 8 + offset < len.
        let found = unsafe { ptr.as_ptr().add(nr_words * 8 + offset).read_volatile() };
        if found != byte {
            return Err(WordMismatch {
                offset: nr_words * 8 + offset,
                expected: u64::from(byte),
                found: u64::from(found),
            });
        }
    }
    Ok(())
}

/// The object a constructor ([`Ctor`](crate::Ctor)) is handed: `len`
/// bytes, 8-aligned, possibly uninitialised, the constructor's alone for
/// the call. Writing all of it yields the [`Constructed`] the constructor
/// returns.
pub struct ObjectInit<'a> {
    ptr: NonNull<u8>,
    len: usize,
    _object: PhantomData<fn(&'a ()) -> &'a ()>,
}

/// Proof that every byte of the object of an [`ObjectInit`] was written:
/// what a constructor returns. Only the `ObjectInit<'a>` of the same call
/// makes a `Constructed<'a>` (`'a` is invariant).
pub struct Constructed<'a> {
    _object: PhantomData<fn(&'a ()) -> &'a ()>,
}

impl<'a> ObjectInit<'a> {
    /// # Safety
    /// `ptr` is 8-aligned, valid for writes of `len` bytes nobody else
    /// accesses during `'a`.
    pub(crate) unsafe fn new(ptr: NonNull<u8>, len: usize) -> Self {
        ObjectInit {
            ptr,
            len,
            _object: PhantomData,
        }
    }

    /// The object's address.
    pub fn as_ptr(&self) -> NonNull<u8> {
        self.ptr
    }

    /// The object's size in bytes (the cache's object size).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the object has no bytes (never).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The object's bytes, possibly uninitialised.
    pub fn as_uninit_mut(&mut self) -> &mut [MaybeUninit<u8>] {
        // SAFETY: `len` bytes the constructor owns for `'a` (`new`).
        unsafe { core::slice::from_raw_parts_mut(self.ptr.as_ptr().cast(), self.len) }
    }

    /// Write a word pattern over the whole object, as
    /// [`SlabBox::write_words`](crate::SlabBox::write_words).
    pub fn write_words(self, word: impl Fn(usize) -> u64) -> Constructed<'a> {
        // SAFETY: `len` bytes the constructor owns (`new`), 8-aligned.
        unsafe { write_words_at(self.ptr, self.len, word) };
        Constructed {
            _object: PhantomData,
        }
    }

    /// Fill the whole object with `byte`.
    pub fn fill(mut self, byte: u8) -> Constructed<'a> {
        for slot in self.as_uninit_mut() {
            slot.write(byte);
        }
        Constructed {
            _object: PhantomData,
        }
    }

    /// The object is constructed: every byte was written through
    /// [`ObjectInit::as_ptr`] or [`ObjectInit::as_uninit_mut`].
    ///
    /// # Safety
    /// Every one of the `len` bytes is initialised.
    pub unsafe fn assume_init(self) -> Constructed<'a> {
        Constructed {
            _object: PhantomData,
        }
    }
}

/// The object a destructor ([`Dtor`](crate::Dtor)) is handed, on its way
/// back to the slab layer: `len` bytes, 8-aligned, nobody else's during
/// the call.
pub struct ObjectRef<'a> {
    ptr: NonNull<u8>,
    len: usize,
    constructed: bool,
    _object: PhantomData<&'a [u8]>,
}

impl ObjectRef<'_> {
    /// # Safety
    /// `ptr` is 8-aligned, valid for reads of `len` bytes nobody else
    /// writes during the borrow; if `constructed`, every byte is
    /// initialised.
    pub(crate) unsafe fn new(ptr: NonNull<u8>, len: usize, constructed: bool) -> Self {
        ObjectRef {
            ptr,
            len,
            constructed,
            _object: PhantomData,
        }
    }

    /// The object's address.
    pub fn as_ptr(&self) -> NonNull<u8> {
        self.ptr
    }

    /// The object's size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the object has no bytes (never).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The object's bytes, if the cache has a constructor (every byte is
    /// then written: the constructor's state, or what the caller that
    /// freed the object left); `None` for a cache without one.
    pub fn as_bytes(&self) -> Option<&[u8]> {
        if !self.constructed {
            return None;
        }
        // SAFETY: `new`'s contract: initialised when `constructed`.
        Some(unsafe { core::slice::from_raw_parts(self.ptr.as_ptr(), self.len) })
    }

    /// Compare the object with a word pattern, as
    /// [`InitBox::check_words`](crate::InitBox::check_words); `None` for a cache without a constructor.
    pub fn check_words(&self, word: impl Fn(usize) -> u64) -> Option<Result<(), WordMismatch>> {
        if !self.constructed {
            return None;
        }
        // SAFETY: as above; 8-aligned (`new`).
        Some(unsafe { check_words_at(self.ptr, self.len, word) })
    }
}
