//! Everything in the cache paths that exists only to steer code
//! generation, in one place. None of it changes what the paths do; each
//! keeps a hit a leaf that needs no callee-saved register, or keeps an
//! argument in the register it arrives in (`docs/BENCHMARKS.md`, "Hit
//! paths" in the crate docs; introduced in 023d691 and 7623d53, where
//! the `GlobalAlloc` pair went from 128 to 119 Ir with profiling on):
//!
//! - [`pack`]/[`unpack`]: a `Result<NonNull<u8>, AllocError>` is returned
//!   through memory (a hidden result pointer the caller must set up and
//!   read back); packed into one `usize` it comes back in `rax`, so the
//!   out-of-line alloc paths are reached by tail calls.
//! - [`AllocOut`]/[`FreeOut`]: the out-of-line paths return the caller's
//!   own result type (`Result` for the library API, a raw pointer or `()`
//!   for `GlobalAlloc`), so no conversion is left after the call and every
//!   way out of a hit is a tail call. `FreeOut::off_hit` picks, per result
//!   type, the entry point of `free_off_hit` whose parameter order leaves
//!   every register where the hit has it.
//! - [`Located`]: the index first, where the owner check's multiply
//!   leaves it (`rdx`).
//!
//! Measured with `bench/profile.sh` (per-line instruction counts): a
//! change here shows on every row of the instruction-count table.

use core::ptr::NonNull;

use super::KmemCache;
use crate::error::{AllocError, FreeError};
use crate::layout::pagemap::PageSlot;
use crate::platform::{PAGE_SIZE, Platform};
use crate::slab::Slab;

/// A `Result<NonNull<u8>, AllocError>` in one register, for the return
/// of the out-of-line alloc paths (the `Result` itself would be returned
/// through memory): an object address (at least `PAGE_SIZE`: pages are
/// non-null and page-aligned) or an error's discriminant.
#[inline(always)]
pub(crate) fn pack(result: Result<NonNull<u8>, AllocError>) -> usize {
    match result {
        Ok(obj) => obj.as_ptr() as usize,
        Err(error) => error as usize,
    }
}

/// The inverse of [`pack`].
#[inline(always)]
pub(crate) fn unpack(packed: usize) -> Result<NonNull<u8>, AllocError> {
    if packed >= PAGE_SIZE {
        // SAFETY: non-zero (above).
        return Ok(unsafe { NonNull::new_unchecked(packed as *mut u8) });
    }
    Err(unpack_error(packed))
}

#[cold]
fn unpack_error(code: usize) -> AllocError {
    const ERRORS: [AllocError; 5] = [
        AllocError::OutOfMemory,
        AllocError::InvalidLayout,
        AllocError::ConstructorFailed,
        AllocError::NotInitialized,
        AllocError::AlreadyInitialized,
    ];
    ERRORS
        .into_iter()
        .find(|&error| error as usize == code)
        .unwrap_or(AllocError::OutOfMemory)
}

/// What an alloc path returns to its caller: `Result` (the library API) or
/// a raw pointer, null on error (`GlobalAlloc`). The out-of-line paths
/// return [`AllocOut::Raw`], one register: the [`pack`]ed result for
/// `Result` (unpacked inline: a `Result` would come back through memory),
/// the pointer itself for `GlobalAlloc` (so its misses are tail calls).
pub(crate) trait AllocOut {
    /// What the out-of-line paths return.
    type Raw;
    /// An object.
    fn from_obj(obj: NonNull<u8>) -> Self;
    /// A [`pack`]ed result as `Raw` (in the out-of-line function).
    fn raw_from_packed(packed: usize) -> Self::Raw;
    /// An object as `Raw` (in the out-of-line function; no test).
    #[cfg_attr(
        not(feature = "alloc-profiling"),
        allow(dead_code, reason = "the profiled alloc's")
    )]
    fn raw_from_obj(obj: NonNull<u8>) -> Self::Raw;
    /// `Raw` as the caller's result (inline, after the call).
    fn from_raw(raw: Self::Raw) -> Self;
    /// Whether the usual profiled alloc is inlined into the caller's hit
    /// rather than reached by a tail call: for the `GlobalAlloc` edge
    /// (one call site, `__rust_alloc`, and the kernel's usual path with
    /// profiling on: the tail call cost a `je` to a `jmp`, the hit's
    /// flag test being an `asm!` branch), not for the library API, whose
    /// every `kmem_cache_alloc` site would grow by the profiled path.
    #[cfg_attr(
        not(feature = "alloc-profiling"),
        allow(dead_code, reason = "the profiled alloc's")
    )]
    const INLINE_PROFILED: bool = false;
}

impl AllocOut for Result<NonNull<u8>, AllocError> {
    type Raw = usize;
    #[inline(always)]
    fn from_obj(obj: NonNull<u8>) -> Self {
        Ok(obj)
    }
    #[inline(always)]
    fn raw_from_packed(packed: usize) -> usize {
        packed
    }
    #[inline(always)]
    fn raw_from_obj(obj: NonNull<u8>) -> usize {
        pack(Ok(obj))
    }
    #[inline(always)]
    fn from_raw(packed: usize) -> Self {
        unpack(packed)
    }
}

impl AllocOut for *mut u8 {
    const INLINE_PROFILED: bool = true;
    type Raw = *mut u8;
    #[inline(always)]
    fn from_obj(obj: NonNull<u8>) -> Self {
        obj.as_ptr()
    }
    #[inline(always)]
    fn raw_from_packed(packed: usize) -> *mut u8 {
        match unpack(packed) {
            Ok(obj) => obj.as_ptr(),
            Err(_) => core::ptr::null_mut(),
        }
    }
    #[inline(always)]
    fn raw_from_obj(obj: NonNull<u8>) -> *mut u8 {
        obj.as_ptr()
    }
    #[inline(always)]
    fn from_raw(ptr: *mut u8) -> Self {
        ptr
    }
}

/// Where the page map put a freed pointer: its object index and its
/// page-map slot (the slab struct is read from the slot only off the
/// hit: [`Located::slab`]).
#[derive(Clone, Copy)]
/// (The index first: it is where the owner check's multiply leaves it,
/// `rdx`, when a `Located` is passed on in two registers.)
pub(crate) struct Located {
    #[cfg_attr(
        not(feature = "alloc-profiling"),
        allow(dead_code, reason = "read by the profiled free")
    )]
    pub(crate) index: usize,
    pub(crate) slot: *const PageSlot,
}

impl Located {
    /// The slab struct of the located object (its slot's entry, one load;
    /// its tag subtracted in the next load's displacement).
    ///
    /// # Safety
    /// `self` came from a free's owner check of a busy object (its slab
    /// and slot stay while the caller frees it).
    #[inline(always)]
    pub(crate) unsafe fn slab(self) -> *mut Slab {
        // SAFETY: per our caller, a slot of the page map, alive.
        unsafe { (*self.slot).slab() as *mut Slab }
    }
}

/// What a free path returns to its caller: `Result` (the library API), or
/// `()` for the `GlobalAlloc` edge, which reports a refused free to the
/// allocator's free-error hook ([`SlabDebug::set_free_error_hook`](crate::debug::SlabDebug::set_free_error_hook)) and
/// counts it in [`SlabDebug::nr_bad_frees`](crate::debug::SlabDebug::nr_bad_frees). Returned by the out-of-line
/// paths directly, so the hit's ways out are tail calls.
pub(crate) trait FreeOut {
    /// The free happened.
    fn ok() -> Self;
    /// The result of a free by `cache`, as the caller takes it.
    fn from_result<P: Platform>(cache: &KmemCache<P>, result: Result<(), FreeError>) -> Self;
    /// [`KmemCache::free_off_hit`] or its `sret` twin, whichever keeps
    /// the index in place for this result type.
    ///
    /// # Safety
    /// As for [`KmemCache::finish_free`].
    unsafe fn off_hit<P: Platform>(cache: &KmemCache<P>, obj: NonNull<u8>, at: Located) -> Self;
}

impl FreeOut for Result<(), FreeError> {
    #[inline(always)]
    fn ok() -> Self {
        Ok(())
    }
    #[inline(always)]
    fn from_result<P: Platform>(_cache: &KmemCache<P>, result: Result<(), FreeError>) -> Self {
        result
    }
    #[inline(always)]
    unsafe fn off_hit<P: Platform>(cache: &KmemCache<P>, obj: NonNull<u8>, at: Located) -> Self {
        // SAFETY: per our caller.
        unsafe { cache.free_off_hit_sret::<Self>(at.index, obj, at.slot) }
    }
}

impl FreeOut for () {
    #[inline(always)]
    fn ok() -> Self {}
    #[inline(always)]
    fn from_result<P: Platform>(cache: &KmemCache<P>, result: Result<(), FreeError>) -> Self {
        if let Err(error) = result {
            cache.owner().report_free_error(error);
        }
    }
    #[inline(always)]
    unsafe fn off_hit<P: Platform>(cache: &KmemCache<P>, obj: NonNull<u8>, at: Located) -> Self {
        // SAFETY: per our caller.
        unsafe { KmemCache::free_off_hit::<Self>(obj, cache, at.index, at.slot) }
    }
}
