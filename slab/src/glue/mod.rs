//! Glue for adopting the allocator in a kernel, shipped: a page source
//! over an already-mapped region ([`RegionSource`]), a [`Platform`] per
//! architecture, and [`Heap`], the allocator and its page source in one
//! `static`, so that a kernel adopts with two lines:
//!
//! ```no_run,standalone_crate
//! # #[cfg(feature = "x86_64")]
//! # mod example {
//! use magpie_slab::glue::{Heap, X86_64};
//!
//! #[global_allocator]
//! static HEAP: Heap<X86_64> = Heap::new();
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
//! **The platforms**, one per architecture, each behind the feature of its
//! name (which refuses to build for another `target_arch`):
//!
//! | feature | platform | CPU index (several CPUs) | interrupts | clock |
//! | --- | --- | --- | --- | --- |
//! | `x86_64` | `X86_64` (ring 0) | `IA32_TSC_AUX` (`rdtscp`; or [`Kernel::cpu_id`]) | `pushfq; cli` / `sti` | `rdtsc` |
//! | `riscv64` | `Riscv64` (S-mode), `Riscv64Machine` (M-mode) | `tp` | `sstatus.SIE` / `mstatus.MIE` | `rdtime` |
//! | `aarch64` | `Aarch64` (EL1) | `TPIDR_EL1` | `DAIF.I` | `CNTVCT_EL0` |
//!
//! Each is a [`Machine`]: the magazine hits take the in-use flag (no
//! interrupt masking on the hit, [`Platform::LOCAL_TRYLOCK`]), or on
//! x86_64 with feature `nightly`, for a [`Kernel`] that says
//! [`Kernel::RESTARTABLE_HITS`], are restartable sequences
//! ([`crate::restart`]: no flag, 3 instructions fewer a side); the slow
//! paths save and restore interrupts. Each is generic over a [`Kernel`]
//! (default [`OneCpu`]): the kernel's CPU count and IPI for several CPUs,
//! frame-pointer backtraces, and its own [`PlatformHooks`](crate::PlatformHooks) (allocation
//! profiling, KFENCE) passed on, so a kernel adds hooks without rewriting
//! the machine part: `Heap<Riscv64<MyKernel>>`. [`Cpus`] is the kernel of
//! several CPUs with no hooks: `Heap<Riscv64Machine<Cpus<4>>>`, each CPU
//! calling [`Machine::cpu_online_with`] with the kernel's IPI, the IPI
//! handler [`Machine::handle_cross_cpu_calls`]. A CPU that has not come
//! online ([`Machine::cpu_online`]) is sent no cross-CPU call.
//!
//! (`examples/` and `docs/ADOPTING.md` show it in a kernel.)

#[cfg(all(feature = "x86_64", not(target_arch = "x86_64"), not(docsrs)))]
compile_error!(
    "magpie-slab feature `x86_64` (glue::X86_64) is for target_arch = \"x86_64\": \
     enable the feature of the target's architecture (`riscv64`, `aarch64`)"
);
#[cfg(all(feature = "riscv64", not(target_arch = "riscv64"), not(docsrs)))]
compile_error!(
    "magpie-slab feature `riscv64` (glue::Riscv64) is for target_arch = \"riscv64\": \
     enable the feature of the target's architecture (`x86_64`, `aarch64`)"
);
#[cfg(all(feature = "aarch64", not(target_arch = "aarch64"), not(docsrs)))]
compile_error!(
    "magpie-slab feature `aarch64` (glue::Aarch64) is for target_arch = \"aarch64\": \
     enable the feature of the target's architecture (`x86_64`, `riscv64`)"
);

pub mod arch;
mod machine;
mod region;

use core::alloc::{GlobalAlloc, Layout};

pub use self::machine::{Arch, Cpus, Kernel, MAX_CPUS, Machine, OneCpu};
pub use self::region::RegionSource;
use crate::{AllocError, Kmem, Platform};

/// The platform of an x86_64 kernel in ring 0 (feature `x86_64`): see
/// [`Machine`] and [`arch::X86`]. `X86_64` alone is one CPU.
#[cfg(all(feature = "x86_64", target_arch = "x86_64"))]
pub type X86_64<K = OneCpu> = Machine<arch::X86, K>;
/// The one-CPU x86_64 platform (feature `x86_64-uniprocessor`, which turns
/// on `x86_64`): [`X86_64`] with one CPU.
#[cfg(all(feature = "x86_64", target_arch = "x86_64"))]
pub type X86Uniprocessor = X86_64<OneCpu>;
/// The platform of a riscv64 kernel in supervisor mode (feature
/// `riscv64`): see [`Machine`] and `arch::Riscv64Supervisor`.
#[cfg(all(feature = "riscv64", target_arch = "riscv64"))]
pub type Riscv64<K = OneCpu> = Machine<arch::Riscv64Supervisor, K>;
/// The platform of a riscv64 kernel in machine mode (feature `riscv64`;
/// QEMU `-bios none`): see [`Machine`] and `arch::Riscv64Machine`.
#[cfg(all(feature = "riscv64", target_arch = "riscv64"))]
pub type Riscv64Machine<K = OneCpu> = Machine<arch::Riscv64Machine, K>;
/// The platform of an aarch64 kernel at EL1 (feature `aarch64`): see
/// [`Machine`] and `arch::Aarch64El1`.
#[cfg(all(feature = "aarch64", target_arch = "aarch64"))]
pub type Aarch64<K = OneCpu> = Machine<arch::Aarch64El1, K>;

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
        // If the allocator refuses, the source forgets the region (so a
        // retry can give one).
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
        let range = region.as_mut_ptr_range();
        // SAFETY: a `'static mut` slice: mapped, readable and writable,
        // and exclusively ours for the rest of the program.
        unsafe { self.init_region(range.start as usize, region.len()) }
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
