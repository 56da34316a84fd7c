//! The allocators under test, behind one small trait so the workloads are
//! monomorphized per allocator (no dynamic dispatch in the measured loops).

use std::alloc::{GlobalAlloc, Layout, System};

use magpie_slab::{Allocator, CacheFlags, KmemCache, PAGE_SIZE, Platform};
use slabmalloc::{AllocationError, LargeObjectPage, ObjectPage, ZoneAllocator};

use crate::host::{BenchPlatform, HostPages, ProfPlatform, region, set_cpu};

/// Bytes of memory each region-based allocator manages.
pub const HEAP_BYTES: usize = 256 << 20;

/// The object of `cache-pair` and `cross-free`.
pub const OBJ: Layout = match Layout::from_size_align(64, 8) {
    Ok(layout) => layout,
    Err(_) => panic!(),
};

/// One allocator under test.
pub trait BenchAlloc: Sync + 'static {
    /// Called on every benchmark thread before it allocates; `cpu` is the
    /// thread's index (magpie: its CPU id).
    fn thread_init(&self, cpu: usize) {
        let _ = cpu;
    }
    /// Allocate (null on failure).
    ///
    /// # Safety
    /// `layout` has non-zero size.
    unsafe fn alloc(&self, layout: Layout) -> *mut u8;
    /// Free.
    ///
    /// # Safety
    /// `ptr` came from `alloc(layout)` of this allocator.
    unsafe fn free(&self, ptr: *mut u8, layout: Layout);
    /// Allocate one `OBJ` (magpie: from a 64-byte `kmem_cache`).
    #[inline]
    fn obj_alloc(&self) -> *mut u8 {
        // SAFETY: OBJ has non-zero size.
        unsafe { self.alloc(OBJ) }
    }
    /// Free one `OBJ`.
    ///
    /// # Safety
    /// `ptr` came from `obj_alloc` of this allocator.
    #[inline]
    unsafe fn obj_free(&self, ptr: *mut u8) {
        // SAFETY: per our caller.
        unsafe { self.free(ptr, OBJ) }
    }
}

/// Any `GlobalAlloc` is a `BenchAlloc`.
pub struct Global<A>(pub A);

impl<A: GlobalAlloc + Sync + 'static> BenchAlloc for Global<A> {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: per our caller.
        unsafe { self.0.alloc(layout) }
    }
    #[inline]
    unsafe fn free(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: per our caller.
        unsafe { self.0.dealloc(ptr, layout) }
    }
}

// ---------------------------------------------------------------- magpie

/// The magpie allocator of this process (plain platform).
pub static MAGPIE: Allocator<BenchPlatform> = Allocator::new();
/// The magpie allocator of the `magpie-prof-*` runs ([`ProfPlatform`]).
pub static MAGPIE_PROF: Allocator<ProfPlatform> = Allocator::new();

/// A platform with its process-wide magpie allocator.
pub trait MagpieHost: Platform + Sync + Sized {
    fn allocator() -> &'static Allocator<Self>;
}

impl MagpieHost for BenchPlatform {
    #[inline(always)]
    fn allocator() -> &'static Allocator<Self> {
        &MAGPIE
    }
}

impl MagpieHost for ProfPlatform {
    #[inline(always)]
    fn allocator() -> &'static Allocator<Self> {
        &MAGPIE_PROF
    }
}

/// magpie-slab: kmalloc (through its `GlobalAlloc`) for sized requests;
/// with `CACHE`, `OBJ`s come from a 64-byte `kmem_cache`, else from
/// `kmalloc(64)`. (A const parameter, so the choice costs no instruction.)
pub struct Magpie<P: MagpieHost, const CACHE: bool> {
    cache: &'static KmemCache<P>,
}

impl<P: MagpieHost, const CACHE: bool> Magpie<P, CACHE> {
    /// Initialise the process's magpie allocator for `P` (once) over its
    /// own region. (One allocator per process: the suite runs each
    /// configuration in a fresh process.)
    pub fn new() -> Magpie<P, CACHE> {
        set_cpu(0);
        let alloc = P::allocator();
        if !alloc.is_ready() {
            let pages = HostPages::new("bench", HEAP_BYTES, PAGE_SIZE);
            alloc.init(pages).expect("magpie init");
        }
        let cache = match alloc.find_cache("bench-64") {
            Some(cache) => cache,
            None => alloc
                .cache_create("bench-64", 64, 8, CacheFlags::empty(), None, None, None)
                .expect("bench-64 cache"),
        };
        Magpie { cache }
    }
}

impl<P: MagpieHost, const CACHE: bool> BenchAlloc for Magpie<P, CACHE> {
    fn thread_init(&self, cpu: usize) {
        set_cpu(cpu);
    }
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: per our caller.
        unsafe { P::allocator().alloc(layout) }
    }
    #[inline]
    unsafe fn free(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: per our caller.
        unsafe { P::allocator().dealloc(ptr, layout) }
    }
    #[inline]
    fn obj_alloc(&self) -> *mut u8 {
        if CACHE {
            match self.cache.alloc() {
                Ok(ptr) => ptr.as_ptr(),
                Err(_) => std::ptr::null_mut(),
            }
        } else {
            // SAFETY: OBJ has non-zero size.
            unsafe { self.alloc(OBJ) }
        }
    }
    #[inline]
    unsafe fn obj_free(&self, ptr: *mut u8) {
        if CACHE {
            // SAFETY: per our caller: an object of this cache.
            let _ = unsafe { self.cache.free(std::ptr::NonNull::new_unchecked(ptr)) };
        } else {
            // SAFETY: per our caller.
            unsafe { self.free(ptr, OBJ) }
        }
    }
}

// ---------------------------------------------------------------- peers

/// `linked_list_allocator::LockedHeap` over a region.
pub fn linked_list() -> Global<linked_list_allocator::LockedHeap> {
    let heap = linked_list_allocator::LockedHeap::empty();
    let (base, len) = region(HEAP_BYTES, PAGE_SIZE);
    // SAFETY: a fresh region owned by this heap alone, forever.
    unsafe { heap.lock().init(base as *mut u8, len) };
    Global(heap)
}

/// The talc allocator type: spin-locked, claiming the region on first use.
pub type Talc =
    talc::sync::TalcLock<spinning_top::RawSpinlock, talc::source::Claim, talc::DefaultBinning>;

/// `talc` (spin-locked) over a region.
pub fn talc() -> Global<Talc> {
    let (base, len) = region(HEAP_BYTES, PAGE_SIZE);
    // SAFETY: a fresh region owned by this heap alone, forever.
    let claim = unsafe { talc::source::Claim::new(base as *mut u8, len) };
    Global(Talc::new(claim))
}

/// `buddy_system_allocator::LockedHeap` (spin-locked) over a region.
pub fn buddy() -> Global<buddy_system_allocator::LockedHeap<32>> {
    let heap = buddy_system_allocator::LockedHeap::<32>::new();
    let (base, len) = region(HEAP_BYTES, PAGE_SIZE);
    // SAFETY: a fresh region owned by this heap alone, forever.
    unsafe { heap.lock().init(base, len) };
    Global(heap)
}

/// The system allocator (glibc malloc).
pub fn system() -> Global<System> {
    Global(System)
}

/// mimalloc (the C library, statically linked).
pub fn mimalloc() -> Global<mimalloc::MiMalloc> {
    Global(mimalloc::MiMalloc)
}

/// slabmalloc's `ZoneAllocator` behind a `spin::Mutex` (it is
/// single-threaded), refilled from a page source: 4 KiB `ObjectPage`s up to
/// 256 B, 2 MiB `LargeObjectPage`s above.
pub struct SlabMalloc {
    zone: spin::Mutex<ZoneAllocator<'static>>,
    pages: &'static HostPages,
}

const LARGE_PAGE: usize = 2 << 20;

impl SlabMalloc {
    /// A zone allocator with its own page source.
    pub fn new() -> SlabMalloc {
        SlabMalloc {
            zone: spin::Mutex::new(ZoneAllocator::new()),
            pages: HostPages::new("slabmalloc", HEAP_BYTES, LARGE_PAGE),
        }
    }

    #[cold]
    fn refill(&self, zone: &mut ZoneAllocator<'static>, layout: Layout) -> bool {
        use slabmalloc::Allocator as _;
        if layout.size() <= ZoneAllocator::MAX_BASE_ALLOC_SIZE {
            let Some(page) = self.pages.alloc_aligned(1, PAGE_SIZE) else {
                return false;
            };
            // SAFETY: a fresh zeroed 4 KiB page, ours forever.
            unsafe { zone.refill(layout, &mut *page.as_ptr().cast::<ObjectPage<'static>>()) }
                .is_ok()
        } else {
            let Some(page) = self.pages.alloc_aligned(LARGE_PAGE / PAGE_SIZE, LARGE_PAGE) else {
                return false;
            };
            // SAFETY: a fresh zeroed 2 MiB-aligned 2 MiB page, ours forever.
            unsafe {
                zone.refill_large(
                    layout,
                    &mut *page.as_ptr().cast::<LargeObjectPage<'static>>(),
                )
            }
            .is_ok()
        }
    }
}

// SAFETY: the zone is only reached through the mutex.
unsafe impl Sync for SlabMalloc {}
// SAFETY: as above.
unsafe impl Send for SlabMalloc {}

impl BenchAlloc for SlabMalloc {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        use slabmalloc::Allocator as _;
        let mut zone = self.zone.lock();
        loop {
            match zone.allocate(layout) {
                Ok(ptr) => return ptr.as_ptr(),
                Err(AllocationError::OutOfMemory) => {
                    if !self.refill(&mut zone, layout) {
                        return std::ptr::null_mut();
                    }
                }
                Err(_) => return std::ptr::null_mut(),
            }
        }
    }
    #[inline]
    unsafe fn free(&self, ptr: *mut u8, layout: Layout) {
        use slabmalloc::Allocator as _;
        // SAFETY: per our caller, ptr is a live allocation (non-null).
        let ptr = unsafe { std::ptr::NonNull::new_unchecked(ptr) };
        let _ = self.zone.lock().deallocate(ptr, layout);
    }
}

/// No allocator at all: every alloc returns the same per-thread buffer.
/// Its instruction count is the harness overhead (loop, random stream,
/// byte writes) that the other rows also pay, and its 2-thread throughput
/// shows how well the machine itself scales (no shared memory at all).
pub struct Null;

#[repr(align(4096))]
#[allow(dead_code)] // only its address is used
struct NullBuf([u8; PAGE_SIZE]);

std::thread_local! {
    static NULL_BUF: std::cell::UnsafeCell<NullBuf> =
        const { std::cell::UnsafeCell::new(NullBuf([0; PAGE_SIZE])) };
}

impl BenchAlloc for Null {
    #[inline]
    unsafe fn alloc(&self, _layout: Layout) -> *mut u8 {
        NULL_BUF.with(|b| b.get().cast())
    }
    #[inline]
    unsafe fn free(&self, _ptr: *mut u8, _layout: Layout) {}
}

/// Names accepted on the command line, in table order.
pub const ALLOCATORS: &[&str] = &[
    "magpie",
    "magpie-kmalloc",
    "system",
    "mimalloc",
    "linked_list_allocator",
    "talc",
    "buddy_system_allocator",
    "slabmalloc",
    "null",
    // magpie over a platform with allocation profiling wired to
    // magpie-codetag (`bench/profiling.sh`), switch off / on from boot.
    // Not in the suite's peer tables.
    "magpie-prof-off",
    "magpie-prof-on",
];
