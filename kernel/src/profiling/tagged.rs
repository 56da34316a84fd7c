//! The allocation call sites: [`kmalloc!`](crate::kmalloc),
//! [`kmem_cache_alloc!`](crate::kmem_cache_alloc),
//! [`kmalloc_box!`](crate::kmalloc_box),
//! [`kmem_cache_alloc_box!`](crate::kmem_cache_alloc_box) and the
//! `Kmem` handle [`TaggedAlloc`] ([`tagged_alloc!`](crate::tagged_alloc)):
//! each charged to its own allocation tag and, for the macros, a fault
//! point ([`crate::debug::fault`]). Above [`SLAB`], which they call.

use core::ptr::NonNull;
use core::sync::atomic::{AtomicU8, Ordering};

use magpie_codetag::alloc_tag::AllocTag;
use magpie_slab::{AllocError, AllocTagRef};

use super::alloc_tag;
use crate::kmem::SLAB;

/// An `Kmem` handle that charges its allocations to one call site:
/// `Box::new_in(value, tagged_alloc!())`. See
/// [`tagged_alloc!`](crate::tagged_alloc).
#[derive(Clone, Copy)]
pub struct TaggedAlloc {
    tag: Option<&'static AllocTag>,
}

impl TaggedAlloc {
    /// A handle for `tag` (`None`: charge like an untagged allocation).
    pub const fn new(tag: Option<&'static AllocTag>) -> Self {
        Self { tag }
    }
}

// SAFETY: blocks come from the 'static slab allocator (kmalloc's contract:
// at least `layout.size()` bytes aligned to `layout.align()`), stay valid
// until `deallocate`, and every copy of a handle frees into the same
// allocator.
unsafe impl core::alloc::Allocator for TaggedAlloc {
    fn allocate(
        &self,
        layout: core::alloc::Layout,
    ) -> Result<NonNull<[u8]>, core::alloc::AllocError> {
        if layout.size() == 0 {
            let dangling = NonNull::new(core::ptr::without_provenance_mut::<u8>(layout.align()))
                .ok_or(core::alloc::AllocError)?;
            return Ok(NonNull::slice_from_raw_parts(dangling, 0));
        }
        let tag = match self.tag {
            Some(tag) => alloc_tag::explicit_tag(tag),
            None => alloc_tag::current_tag(),
        };
        let ptr = SLAB
            .kmalloc_with(magpie_slab::KmallocArgs::new(layout.size(), layout.align()).tag(tag))
            .map_err(|_| core::alloc::AllocError)?;
        Ok(NonNull::slice_from_raw_parts(ptr, layout.size()))
    }

    unsafe fn deallocate(&self, ptr: NonNull<u8>, layout: core::alloc::Layout) {
        if layout.size() == 0 {
            return;
        }
        // SAFETY: per the Kmem contract, ptr is a live block from us.
        if let Err(error) = unsafe { SLAB.kfree(ptr) } {
            log::error!("TaggedAlloc: {error}; nothing was freed");
        }
    }
}

/// This call site's tag argument for the `*_tagged` calls of the
/// allocation macros: `explicit_tag(alloc_tag!())` (the site's own tag
/// while profiling is on, `None` while it is off). Not for direct use.
#[cfg(feature = "alloc-profiling")]
#[doc(hidden)]
#[macro_export]
#[collapse_debuginfo(yes)]
macro_rules! __site_tag {
    () => {
        $crate::profiling::alloc_tag::explicit_tag($crate::magpie_codetag::alloc_tag!())
    };
}

/// This call site's tag argument with profiling compiled out: `None` (the
/// `*_tagged` calls then ignore it, as the plain calls would).
#[cfg(not(feature = "alloc-profiling"))]
#[doc(hidden)]
#[macro_export]
#[collapse_debuginfo(yes)]
macro_rules! __site_tag {
    () => {
        ::core::option::Option::None
    };
}

/// The body of every allocation macro: a fault point ([`crate::debug::fault`];
/// armed, `Err(AllocError::OutOfMemory)` without allocating), else
/// `$alloc`, a `*_tagged` call given [`__site_tag!`](crate::__site_tag).
/// Not for direct use.
#[doc(hidden)]
#[macro_export]
#[collapse_debuginfo(yes)]
macro_rules! __alloc_site {
    ($alloc:expr) => {
        if $crate::alloc_fault!() {
            ::core::result::Result::Err($crate::debug::fault::AllocError::OutOfMemory)
        } else {
            $alloc
        }
    };
}

/// The boot argument that keeps [`kmalloc!`](crate::kmalloc) sites on the
/// normal `kmalloc-<size>` classes: `random_kmalloc_caches=0` (default 1:
/// partitioned). For sessions that must name a site's cache before it
/// allocates (the end-to-end tests boot with it, as they boot with KFENCE
/// off); Linux has the choice at build time only
/// (`CONFIG_RANDOM_KMALLOC_CACHES`).
pub const RANDOM_KMALLOC_ARG: &str = "random_kmalloc_caches";

/// [`RANDOM_KMALLOC_ARG`] as read on the first `kmalloc!`: 0 not yet
/// read, [`RANDOM_ON`] or [`RANDOM_OFF`].
static RANDOM_KMALLOC: AtomicU8 = AtomicU8::new(0);
const RANDOM_ON: u8 = 1;
const RANDOM_OFF: u8 = 2;

/// Whether `kmalloc!` sites are partitioned this boot ([`RANDOM_KMALLOC_ARG`]).
pub fn random_kmalloc_caches() -> bool {
    match RANDOM_KMALLOC.load(Ordering::Relaxed) {
        RANDOM_ON => true,
        RANDOM_OFF => false,
        _ => read_random_kmalloc_arg(),
    }
}

/// Partition `kmalloc!` sites from now on (`true`) or keep them on the
/// normal classes, overriding [`RANDOM_KMALLOC_ARG`]: for tests that name
/// `kmalloc-<size>` caches (`tests/shell_commands.rs`).
pub fn set_random_kmalloc_caches(on: bool) {
    RANDOM_KMALLOC.store(if on { RANDOM_ON } else { RANDOM_OFF }, Ordering::Relaxed);
}

/// Read [`RANDOM_KMALLOC_ARG`] from the boot line, once (a wrong value:
/// a warning, and the default).
#[cold]
fn read_random_kmalloc_arg() -> bool {
    let on = match crate::mm::boot_info::get().and_then(|boot| boot.arg(RANDOM_KMALLOC_ARG)) {
        None | Some("1") => true,
        Some("0") => false,
        Some(value) => {
            log::warn!("{RANDOM_KMALLOC_ARG}={value}: expected 0 or 1; using 1");
            true
        }
    };
    RANDOM_KMALLOC.store(if on { RANDOM_ON } else { RANDOM_OFF }, Ordering::Relaxed);
    on
}

/// The allocation of a [`kmalloc!`](crate::kmalloc) site: partitioned
/// ([`KmallocArgs::site`](magpie_slab::KmallocArgs::site), Linux
/// `RANDOM_KMALLOC_CACHES`: one of `NR_KMALLOC_RANDOM` copies of the size
/// class, `kmalloc-rnd-<NN>-<size>`, chosen by the site's tag, or its
/// source location while profiling is off, hashed with a per-boot seed),
/// or the normal class under `random_kmalloc_caches=0`. Not for direct
/// use. Out of line and placed in the allocator's text (`boot/linker.ld`),
/// as the slab library is: the first return address outside it, the
/// call site kmemtrace records, is the `kmalloc!` line's.
#[doc(hidden)]
#[inline(never)]
#[track_caller]
pub fn kmalloc_site(
    size: usize,
    align: usize,
    tag: Option<AllocTagRef>,
) -> Result<NonNull<u8>, AllocError> {
    let args = magpie_slab::KmallocArgs::new(size, align).tag(tag);
    SLAB.kmalloc_with(if random_kmalloc_caches() {
        args.site()
    } else {
        args
    })
}

/// `kmalloc!(size)` / `kmalloc!(size, align)`: [`SLAB`]
/// `.kmalloc` charged to this call site, from the site's own random copy
/// of the size class (`kmalloc-rnd-<NN>-<size>`: [`kmalloc_site`]), so
/// same-size objects of unrelated sites rarely share a slab. `align` defaults to 8. (Linux
/// takes GFP flags here; this kernel has none, so the second argument is
/// the alignment.) The site is also a fault point ([`crate::debug::fault`]): armed,
/// it returns `Err(AllocError::OutOfMemory)` without allocating. Its code
/// carries the caller's file and line in the debug info
/// (`collapse_debuginfo`), so symbolizers name the call site, not this
/// file.
#[macro_export]
#[collapse_debuginfo(yes)]
macro_rules! kmalloc {
    ($size:expr) => {
        $crate::kmalloc!($size, 8)
    };
    ($size:expr, $align:expr) => {{
        let (size, align): (usize, usize) = ($size, $align);
        $crate::__alloc_site!($crate::profiling::tagged::kmalloc_site(
            size,
            align,
            $crate::__site_tag!()
        ))
    }};
}

/// `kmem_cache_alloc!(cache)`: `cache.alloc()` charged to this call site,
/// and a fault point ([`crate::debug::fault`]) like [`kmalloc!`](crate::kmalloc).
#[macro_export]
#[collapse_debuginfo(yes)]
macro_rules! kmem_cache_alloc {
    ($cache:expr) => {{
        let cache = &$cache;
        $crate::__alloc_site!(cache.alloc_tagged($crate::__site_tag!()))
    }};
}

/// `kmalloc_box!(size, align)`: [`kmalloc!`](crate::kmalloc) as an owned
/// [`SlabBox`](magpie_slab::SlabBox) (written, read and freed without
/// `unsafe`, on any CPU), charged to this call site; a fault point too.
#[macro_export]
#[collapse_debuginfo(yes)]
macro_rules! kmalloc_box {
    ($size:expr, $align:expr) => {{
        let (size, align): (usize, usize) = ($size, $align);
        $crate::__alloc_site!($crate::kmem::SLAB.profiling().kmalloc_box(
            size,
            align,
            $crate::__site_tag!()
        ))
    }};
}

/// `kmem_cache_alloc_box!(cache)` (`cache`: a `&'static KmemCache`):
/// [`kmem_cache_alloc!`](crate::kmem_cache_alloc) as an owned
/// [`SlabBox`](magpie_slab::SlabBox), charged to this call site; a fault
/// point too.
#[macro_export]
#[collapse_debuginfo(yes)]
macro_rules! kmem_cache_alloc_box {
    ($cache:expr) => {{
        let cache = $cache;
        $crate::__alloc_site!(cache.alloc_box_tagged($crate::__site_tag!()))
    }};
}

/// `tagged_alloc!()`: a [`TaggedAlloc`] handle for this call site, for
/// `Box::new_in(x, tagged_alloc!())`, `Vec::new_in(tagged_alloc!())`.
#[cfg(feature = "alloc-profiling")]
#[macro_export]
macro_rules! tagged_alloc {
    () => {
        $crate::profiling::tagged::TaggedAlloc::new(Some($crate::magpie_codetag::alloc_tag!()))
    };
}

/// `tagged_alloc!()` with profiling compiled out.
#[cfg(not(feature = "alloc-profiling"))]
#[macro_export]
macro_rules! tagged_alloc {
    () => {
        $crate::profiling::tagged::TaggedAlloc::new(None)
    };
}
