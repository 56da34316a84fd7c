//! The kernel's global allocator.
//!
//! Until the slab allocator is up, allocations are served by the *bootstrap
//! heap*: a `linked_list_allocator` over a static region in `.bss`, usable
//! from the first line of `kernel_entry`. Once [`crate::kmem::init`] has run,
//! every new allocation goes through the slab allocator's magazines; frees
//! are routed by address ([`bootstrap_contains`] tells a bootstrap-heap block
//! from a slab object), so blocks allocated early can still be freed late.

use core::alloc::{GlobalAlloc, Layout};
use core::cell::UnsafeCell;
use core::ptr::{self, NonNull};
use core::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use linked_list_allocator::Heap;
use magpie_slab::descriptor::{ArenaDescription, ArenaFigure};
use spin::Mutex;

use crate::arch::IrqGuard;
use crate::kmem::SLAB;

/// Size of the bootstrap heap.
pub const BOOTSTRAP_HEAP_SIZE: usize = 4 << 20;

#[repr(C, align(4096))]
struct Region(UnsafeCell<[u8; BOOTSTRAP_HEAP_SIZE]>);

// SAFETY: the region is only accessed through the allocator below, which
// hands out disjoint blocks under BOOTSTRAP's lock.
unsafe impl Sync for Region {}

static REGION: Region = Region(UnsafeCell::new([0; BOOTSTRAP_HEAP_SIZE]));
static BOOTSTRAP: Mutex<Heap> = Mutex::new(Heap::empty());
static READY: AtomicBool = AtomicBool::new(false);
/// The heap's used bytes, stored after every change under its lock: where
/// a reader of a memory image finds them (`kmemstat`'s `bootstrap-heap`
/// row from a core; the heap's own counter is private to its crate).
static USED: AtomicUsize = AtomicUsize::new(0);

fn region_range() -> (usize, usize) {
    let start = REGION.0.get() as usize;
    (start, start + BOOTSTRAP_HEAP_SIZE)
}

/// Whether `ptr` points into the bootstrap heap's region.
pub fn bootstrap_contains(ptr: *const u8) -> bool {
    let (start, end) = region_range();
    (start..end).contains(&(ptr as usize))
}

/// Initializes the bootstrap heap (idempotent).
pub fn init() {
    let _irq = IrqGuard::new();
    let mut heap = BOOTSTRAP.lock();
    if READY.load(Ordering::Acquire) {
        return;
    }
    // SAFETY: REGION is a static, 'static region used by nothing but this
    // heap; READY (checked under the lock) ensures it is handed over once.
    unsafe { heap.init(REGION.0.get().cast::<u8>(), BOOTSTRAP_HEAP_SIZE) };
    READY.store(true, Ordering::Release);
}

/// Bootstrap heap usage: (used bytes, free bytes).
pub fn bootstrap_usage() -> (usize, usize) {
    let _irq = IrqGuard::new();
    let heap = BOOTSTRAP.lock();
    (heap.used(), heap.free())
}

/// Allocates from the bootstrap heap; null if it is exhausted.
pub fn bootstrap_alloc(layout: Layout) -> *mut u8 {
    if !READY.load(Ordering::Acquire) {
        init();
    }
    let _irq = IrqGuard::new();
    let mut heap = BOOTSTRAP.lock();
    let block = heap
        .allocate_first_fit(layout)
        .map_or(ptr::null_mut(), NonNull::as_ptr);
    USED.store(heap.used(), Ordering::Relaxed);
    block
}

/// Returns a block to the bootstrap heap.
///
/// # Safety
///
/// `ptr` must have been returned by [`bootstrap_alloc`] with this `layout`
/// and not freed since.
pub unsafe fn bootstrap_dealloc(ptr: *mut u8, layout: Layout) {
    let _irq = IrqGuard::new();
    let mut heap = BOOTSTRAP.lock();
    // SAFETY: per the contract, ptr came from this heap with this layout; it is non-null.
    unsafe { heap.deallocate(NonNull::new_unchecked(ptr), layout) };
    USED.store(heap.used(), Ordering::Relaxed);
}

/// The `bootstrap-heap` row of `kmemstat` (indent 0, quantum 1), for
/// readers of a memory image (`magpie_slab::descriptor::describe_kmemstat`).
pub fn bootstrap_description() -> ArenaDescription {
    ArenaDescription {
        indent: 0,
        name: "bootstrap-heap",
        quantum: 1,
        total: ArenaFigure::constant(BOOTSTRAP_HEAP_SIZE as u64),
        alloc: ArenaFigure::word(USED.as_ptr(), 1),
        nr_allocs_ever: ArenaFigure::constant(0),
    }
}

/// The `#[global_allocator]` shim: Box, Vec, String and friends land here.
pub struct KernelAllocator;

// SAFETY: alloc returns blocks valid for `layout` (or null) from the slab
// allocator once it is ready, from the bootstrap heap before; dealloc returns
// each block to the allocator whose address range holds it.
unsafe impl GlobalAlloc for KernelAllocator {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if SLAB.is_ready() {
            // SAFETY: forwarded GlobalAlloc contract (layout has non-zero size).
            unsafe { SLAB.alloc(layout) }
        } else {
            bootstrap_alloc(layout)
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if bootstrap_contains(ptr) {
            // SAFETY: GlobalAlloc's contract: ptr was allocated by us with layout; it is in the bootstrap region.
            unsafe { bootstrap_dealloc(ptr, layout) }
        } else {
            // SAFETY: forwarded GlobalAlloc contract: not a bootstrap block,
            // so it came from SLAB. Bad frees are caught and reported there.
            unsafe { SLAB.dealloc(ptr, layout) }
        }
    }
}

#[global_allocator]
static ALLOCATOR: KernelAllocator = KernelAllocator;
