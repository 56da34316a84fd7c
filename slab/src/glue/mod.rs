//! Glue for adopting the allocator in a kernel, shipped: a page source
//! over an already-mapped region ([`RegionSource`]), a uniprocessor
//! x86_64 [`Platform`] (`X86Uniprocessor`, feature
//! `x86_64-uniprocessor`), and [`Heap`], the two with an [`Kmem`]
//! in one `static`, so that a one-CPU kernel adopts with two lines:
//!
//! ```no_run,standalone_crate
//! # #[cfg(feature = "x86_64-uniprocessor")]
//! # mod example {
//! use magpie_slab::glue::{Heap, X86Uniprocessor};
//!
//! #[global_allocator]
//! static HEAP: Heap<X86Uniprocessor> = Heap::new();
//! # const HEAP_START: usize = 0x4444_4444_0000;
//! # const HEAP_SIZE: usize = 100 * 1024;
//!
//! fn kernel_main() {
//!     // Once the heap range is mapped:
//!     // SAFETY: it is mapped, writable and the heap's alone.
//!     unsafe { HEAP.init_region(HEAP_START, HEAP_SIZE) }.expect("heap");
//! }
//! # }
//! # fn main() {}
//! ```
//!
//! (`examples/` and `docs/ADOPTING.md` show it in a kernel.)

mod region;
#[cfg(all(feature = "x86_64-uniprocessor", target_arch = "x86_64"))]
mod x86_64_up;

use core::alloc::{GlobalAlloc, Layout};

pub use self::region::RegionSource;
#[cfg(all(feature = "x86_64-uniprocessor", target_arch = "x86_64"))]
pub use self::x86_64_up::X86Uniprocessor;
use crate::{AllocError, Kmem, Platform};

/// An [`Kmem`] over a [`RegionSource`], in one `static`: the global
/// allocator of a kernel whose heap is one mapped range. Dereferences to
/// the [`Kmem`] (kmalloc, caches, statistics, reports).
pub struct Heap<P: Platform> {
    allocator: Kmem<P>,
    source: RegionSource<P>,
}

impl<P: Platform> Default for Heap<P> {
    fn default() -> Self {
        Self::new()
    }
}

impl<P: Platform> Heap<P> {
    /// A heap with no memory yet (allocations fail, return null through
    /// `GlobalAlloc`) until [`Heap::init_region`].
    pub const fn new() -> Self {
        Heap {
            allocator: Kmem::new(),
            source: RegionSource::new(),
        }
    }

    /// Give the heap the `len` bytes at `start` and bring the allocator
    /// up on them. What it costs: the region's bitmap (one page per
    /// 128 MiB) and `Kmem::init`'s page map (one page up to 512
    /// KiB); a region under 1 MiB gets its size classes on first use
    /// ([`InitCost`](crate::InitCost)).
    ///
    /// # Errors
    /// [`AllocError::SourceTooSmall`] below
    /// [`InitCost::min_source_bytes`](crate::InitCost) (68 KiB on one CPU:
    /// `Kmem::init_cost(&source)` of a [`RegionSource`] given the
    /// same region has the figures), and as for
    /// [`RegionSource::init`] and [`Kmem::init`].
    ///
    /// A refused `init_region` leaves the heap as it was: the source
    /// forgets the region (the allocator gave back every page it took)
    /// and the allocator is not ready, so the call may be retried, e.g.
    /// with a larger region after `SourceTooSmall`. The refused region is
    /// not touched again. After a successful call, a second one is
    /// refused with [`AllocError::AlreadyInitialized`] and changes nothing.
    ///
    /// # Safety
    /// The region is mapped, readable and writable, and used by nothing
    /// else from now on, for ever.
    pub unsafe fn init_region(&'static self, start: usize, len: usize) -> Result<(), AllocError> {
        // SAFETY: per our caller.
        unsafe { self.source.init(start, len)? };
        self.init_allocator()
    }

    /// Bring the allocator up on the source just given its region; if it
    /// refuses, the source forgets the region (so a retry can give one).
    fn init_allocator(&'static self) -> Result<(), AllocError> {
        self.allocator.init(&self.source).inspect_err(|_| {
            let forgotten = self.source.forget();
            debug_assert!(forgotten, "a refused Kmem::init gives every page back");
        })
    }

    /// [`Heap::init_region`] on a region the borrow checker vouches for
    /// (a `'static` exclusive slice: mapped, writable, ours for ever).
    ///
    /// # Errors
    /// As [`Heap::init_region`]; a refused call leaves the heap as it was
    /// and may be retried (with another region: the refused one stays
    /// borrowed, untouched).
    pub fn init_static(&'static self, region: &'static mut [u8]) -> Result<(), AllocError> {
        self.source.init_static(region)?;
        self.init_allocator()
    }

    /// The page source.
    pub fn source(&self) -> &RegionSource<P> {
        &self.source
    }
}

impl<P: Platform> core::ops::Deref for Heap<P> {
    type Target = Kmem<P>;

    fn deref(&self) -> &Kmem<P> {
        &self.allocator
    }
}

// SAFETY: every method forwards to the Allocator's GlobalAlloc, with the
// caller's guarantees unchanged.
unsafe impl<P: Platform> GlobalAlloc for Heap<P> {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: per our caller.
        unsafe { self.allocator.alloc(layout) }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: per our caller.
        unsafe { self.allocator.alloc_zeroed(layout) }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: per our caller.
        unsafe { self.allocator.dealloc(ptr, layout) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: per our caller.
        unsafe { self.allocator.realloc(ptr, layout, new_size) }
    }
}
