//! Typed errors. The allocator never panics on bad input or when memory
//! runs out; it returns one of these. Only the `GlobalAlloc` shim turns an
//! error into a null pointer.

use core::fmt;

/// Why an allocation (or cache creation, or `init`) failed.
///
/// Word-sized (`repr(usize)`), so that `Result<NonNull<u8>, AllocError>`
/// is a pair of words, which every allocation path returns in two
/// registers (a byte-sized error makes it an aggregate returned through
/// memory: the `GlobalAlloc` hit then paid a stack frame and a store and
/// load of the result, `docs/BENCHMARKS.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(usize)]
pub enum AllocError {
    /// The page source (or a metadata cache) had no memory.
    OutOfMemory,
    /// Size 0, alignment not a power of two, alignment above
    /// [`PAGE_SIZE`](crate::PAGE_SIZE), or a size that overflows.
    InvalidLayout,
    /// The cache's constructor failed; the object went back to its slab.
    ConstructorFailed,
    /// [`Kmem::init`](crate::Kmem::init) has not completed.
    NotInitialized,
    /// [`Kmem::init`](crate::Kmem::init) was called twice.
    AlreadyInitialized,
    /// [`Kmem::init`](crate::Kmem::init) was given a page source
    /// too small to hold the allocator's metadata and a few slabs:
    /// [`Kmem::init_cost`](crate::Kmem::init_cost) has the
    /// figures (its `Display` prints them).
    SourceTooSmall,
}

impl fmt::Display for AllocError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AllocError::OutOfMemory => f.write_str("out of memory"),
            AllocError::InvalidLayout => {
                f.write_str("invalid layout (size 0, bad alignment or too large)")
            }
            AllocError::ConstructorFailed => f.write_str("object constructor failed"),
            AllocError::NotInitialized => f.write_str("slab allocator not initialised"),
            AllocError::AlreadyInitialized => f.write_str("slab allocator already initialised"),
            AllocError::SourceTooSmall => f.write_str(
                "page source too small for the slab allocator (Kmem::init_cost has the figures)",
            ),
        }
    }
}

/// Why a free was refused. Every variant carries the address, and only
/// the address; nothing was changed by the refused free.
///
/// Two words (the variant and the address), so that `Result<(),
/// FreeError>` is a pair of scalars, which every free path returns in two
/// registers (with a third word, the name of a wrong cache's owner, it was
/// an aggregate returned through memory: each caller that looks at the
/// result paid a stack frame for it, e.g. 64 -> 60 instructions an
/// alloc+free pair of `KmemCache::free`, `docs/BENCHMARKS.md`). Who owns
/// a pointer freed to the wrong cache is in the free's error report
/// ([`ErrorReport::owner`](crate::reports::ErrorReport::owner)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FreeError {
    /// The object was already free. Always detected for a debug cache
    /// (any [`DebugFlags`](crate::flags::DebugFlags)); without flags, when
    /// the object is on top of this CPU's `loaded` or `prev` magazine, or
    /// back in its slab (a bufctl cache off the primary source cannot tell
    /// that from a stray pointer and reports `NotAllocated`). A
    /// page-granular kmalloc block freed twice, as long as its first page
    /// was not used again by the allocator (the page map keeps a freed
    /// mark on it until then).
    DoubleFree {
        /// The pointer passed to free.
        addr: usize,
    },
    /// The pointer was never returned by this allocator (not slab memory).
    NotAllocated {
        /// The pointer passed to free.
        addr: usize,
    },
    /// The pointer belongs to another cache, or to the page-granular
    /// kmalloc (or is a KFENCE sample of another cache); the error report
    /// names the owning cache
    /// ([`ErrorReport::owner`](crate::reports::ErrorReport::owner)).
    WrongCache {
        /// The pointer passed to free.
        addr: usize,
    },
    /// The pointer lies inside slab memory but not at the start of an
    /// object (or inside a page-granular allocation but not at its start).
    Misaligned {
        /// The pointer passed to free.
        addr: usize,
    },
}

impl FreeError {
    /// The address the failed free was given.
    pub fn addr(&self) -> usize {
        match *self {
            FreeError::DoubleFree { addr }
            | FreeError::NotAllocated { addr }
            | FreeError::WrongCache { addr }
            | FreeError::Misaligned { addr } => addr,
        }
    }
}

impl fmt::Display for FreeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            FreeError::DoubleFree { addr } => write!(f, "double free of {addr:#x}"),
            FreeError::NotAllocated { addr } => {
                write!(f, "free of {addr:#x}, which was never allocated")
            }
            FreeError::WrongCache { addr } => {
                write!(f, "free of {addr:#x} to the wrong cache")
            }
            FreeError::Misaligned { addr } => {
                write!(f, "free of {addr:#x}, which is not the start of an object")
            }
        }
    }
}

/// Why tracing could not start.
#[cfg(feature = "trace-table")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TraceError {
    /// The cache was created with [`CacheFlags::NOTRACE`](crate::CacheFlags::NOTRACE).
    NoTrace,
}

#[cfg(feature = "trace-table")]
impl fmt::Display for TraceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TraceError::NoTrace => f.write_str("cache is NOTRACE and cannot be traced"),
        }
    }
}

/// Why a cache could not be destroyed. The cache is left intact.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DestroyError {
    /// Objects are still allocated to callers.
    Busy {
        /// Objects still out.
        nr_allocated: usize,
    },
    /// A bootstrap or kmalloc cache; these live as long as the allocator.
    Permanent,
}

impl fmt::Display for DestroyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DestroyError::Busy { nr_allocated } => {
                write!(f, "cache busy: {nr_allocated} objects still allocated")
            }
            DestroyError::Permanent => {
                f.write_str("bootstrap and kmalloc caches cannot be destroyed")
            }
        }
    }
}
