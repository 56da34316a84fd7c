//! The allocators under test, behind one small trait so the workloads are
//! monomorphized per allocator (no dynamic dispatch in the measured loops).
//!
//! Like for like: every row is reached the way a Rust program reaches its
//! `#[global_allocator]`: through `GlobalAlloc` (`alloc`, `dealloc`,
//! `realloc`), each call one out-of-line function ([`call`], the
//! `__rust_alloc` of a real program). The only exception is the labelled
//! `magpie-cache` row: objects from a pre-resolved `kmem_cache`, the
//! kernel-internal interface no peer has.

use magpie_slab::CacheArgs;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::UnsafeCell;
use std::ptr::NonNull;

use magpie_slab::{Kmem, KmemCache, PAGE_SIZE, PageSource, Platform};
use slabmalloc::{AllocationError, LargeObjectPage, ObjectPage, ZoneAllocator};

use crate::host::{self, BenchPlatform, HostPages, ProfPlatform, region, set_cpu};

/// Bytes of memory each region-based allocator manages (untouched pages
/// cost nothing: the region is fresh anonymous memory).
pub const HEAP_BYTES: usize = 1 << 30;

/// The object of the 64-byte pair, `batch`-free, `remote-free` and
/// `cross-free` workloads.
pub const OBJ: Layout = match Layout::from_size_align(64, 8) {
    Ok(layout) => layout,
    Err(_) => panic!(),
};

/// One allocator under test.
pub trait BenchAlloc: Sync + 'static {
    /// Called on every benchmark thread before it allocates; `cpu` is the
    /// thread's index (magpie and slabmalloc: its CPU id).
    fn thread_init(&self, cpu: usize) {
        set_cpu(cpu);
    }
    /// `GlobalAlloc::alloc` (null on failure).
    ///
    /// # Safety
    /// `layout` has non-zero size.
    unsafe fn alloc(&self, layout: Layout) -> *mut u8;
    /// `GlobalAlloc::dealloc`.
    ///
    /// # Safety
    /// `ptr` came from `alloc(layout)` of this allocator.
    unsafe fn free(&self, ptr: *mut u8, layout: Layout);
    /// `GlobalAlloc::realloc`.
    ///
    /// # Safety
    /// As `GlobalAlloc::realloc`.
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8;
    /// Allocate one object of `layout` (always [`OBJ`], passed at run
    /// time by the workloads; `magpie-cache`: from a 64-byte `kmem_cache`,
    /// which takes no layout).
    #[inline(always)]
    fn obj_alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: OBJ has non-zero size.
        unsafe { self.alloc(layout) }
    }
    /// Free one object of `layout`.
    ///
    /// # Safety
    /// `ptr` came from `obj_alloc(layout)` of this allocator.
    #[inline(always)]
    unsafe fn obj_free(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: per our caller.
        unsafe { self.free(ptr, layout) }
    }
    /// What the allocator offers to hand free memory back to its source,
    /// called once by the memory workloads after the frees (magpie:
    /// `reap_all`; glibc: `malloc_trim(0)`; mimalloc: `mi_collect(true)`;
    /// slabmalloc: `try_reclaim_*_pages` of every zone). Returns its name,
    /// or `None` if the allocator has no such call.
    fn give_back(&self) -> Option<&'static str> {
        None
    }
    /// What the allocator does on its own while the system is idle, run
    /// once by the burst workloads before [`BenchAlloc::give_back`]
    /// (magpie: one working-set interval, i.e. two `kmem_update` ticks;
    /// nothing for the others). Returns its name, or `None`.
    fn idle(&self) -> Option<&'static str> {
        None
    }
    /// Bytes of the allocator's own metadata, where the allocator can say.
    fn metadata_bytes(&self) -> Option<usize> {
        None
    }
    /// Where the allocator's memory goes beyond the objects' bytes, by
    /// part (`name`, bytes), where the allocator can say (the `half`
    /// workload's breakdown; magpie: [`MemoryParts`]).
    fn memory_parts(&self) -> Option<MemoryParts> {
        None
    }
}

/// Magpie's memory by part (the `half` workload's breakdown): what its
/// statistics say each byte of its slab pages and page-source pages holds.
#[derive(Debug, Default, Clone, Copy)]
pub struct MemoryParts {
    /// Objects with callers, at their class's size
    /// (`Σ nr_allocated × obj_size` over the size classes).
    pub class_bytes: usize,
    /// Free objects in slabs (not in a magazine).
    pub free_in_slabs: usize,
    /// Free objects held in per-CPU and depot magazines.
    pub free_in_magazines: usize,
    /// Slab bytes that hold no object: tails and in-slab headers.
    pub tails: usize,
    /// Page-granular blocks (pages outside every slab, but the page map).
    pub page_granular: usize,
    /// The page map (set up and cleared at init).
    pub page_map: usize,
    /// Slab headers off slab (`kmem_slab`).
    pub slab_headers: usize,
    /// Bufctls (`kmem_bufctl`).
    pub bufctls: usize,
    /// Magazines (`kmem_magazine_*`).
    pub magazines: usize,
    /// Tag side arrays (`kmem_tags_*`).
    pub tag_arrays: usize,
    /// The other `kmem_*` caches (cache structs, per-CPU arrays, trace
    /// records).
    pub other_metadata: usize,
}

/// The out-of-line calls the workloads make: one function per operation
/// and allocator, as `__rust_alloc` / `__rust_dealloc` / `__rust_realloc`
/// are in a real program. The `null` row pays the same calls, so
/// subtracting it removes them for everyone alike.
pub mod call {
    use super::*;

    /// `a.alloc(layout)`, out of line.
    #[inline(never)]
    pub fn alloc<A: BenchAlloc>(a: &A, layout: Layout) -> *mut u8 {
        // SAFETY: every workload layout has a non-zero size.
        unsafe { a.alloc(layout) }
    }
    /// `a.free(ptr, layout)`, out of line.
    ///
    /// # Safety
    /// As [`BenchAlloc::free`].
    #[inline(never)]
    pub unsafe fn free<A: BenchAlloc>(a: &A, ptr: *mut u8, layout: Layout) {
        // SAFETY: per our caller.
        unsafe { a.free(ptr, layout) }
    }
    /// `a.realloc(ptr, layout, new_size)`, out of line.
    ///
    /// # Safety
    /// As [`BenchAlloc::realloc`].
    #[inline(never)]
    pub unsafe fn realloc<A: BenchAlloc>(
        a: &A,
        ptr: *mut u8,
        layout: Layout,
        new_size: usize,
    ) -> *mut u8 {
        // SAFETY: per our caller.
        unsafe { a.realloc(ptr, layout, new_size) }
    }
    /// `a.obj_alloc(layout)`, out of line: the layout is a run-time
    /// value inside, as `__rust_alloc` gets it (the workloads pass
    /// [`obj_layout`]).
    #[inline(never)]
    pub fn obj_alloc<A: BenchAlloc>(a: &A, layout: Layout) -> *mut u8 {
        a.obj_alloc(layout)
    }
    /// `a.obj_free(ptr, layout)`, out of line.
    ///
    /// # Safety
    /// As [`BenchAlloc::obj_free`].
    #[inline(never)]
    pub unsafe fn obj_free<A: BenchAlloc>(a: &A, ptr: *mut u8, layout: Layout) {
        // SAFETY: per our caller.
        unsafe { a.obj_free(ptr, layout) }
    }
    /// `a.obj_alloc(OBJ)` with the layout a constant inside the call, so
    /// a Rust allocator's size-class lookup folds away (a C allocator
    /// behind FFI cannot fold it): the labelled `pair64-const` row only.
    #[inline(never)]
    pub fn obj_alloc_const<A: BenchAlloc>(a: &A) -> *mut u8 {
        a.obj_alloc(OBJ)
    }
    /// `a.obj_free(ptr, OBJ)`, the layout a constant inside the call.
    ///
    /// # Safety
    /// As [`BenchAlloc::obj_free`].
    #[inline(never)]
    pub unsafe fn obj_free_const<A: BenchAlloc>(a: &A, ptr: *mut u8) {
        // SAFETY: per our caller.
        unsafe { a.obj_free(ptr, OBJ) }
    }
}

/// [`OBJ`] as a run-time value: the compiler cannot see through it, so
/// every allocator gets the 64-byte layout the way `__rust_alloc` passes
/// a layout, and none can fold its size-class lookup away.
#[inline(always)]
pub fn obj_layout() -> Layout {
    std::hint::black_box(OBJ)
}

/// Any `GlobalAlloc` is a `BenchAlloc`; `give_back` is the allocator's own
/// call for returning memory, if it has one.
pub struct Global<A> {
    inner: A,
    give_back: Option<(&'static str, fn())>,
}

impl<A> Global<A> {
    fn new(inner: A) -> Self {
        Global {
            inner,
            give_back: None,
        }
    }
}

impl<A: GlobalAlloc + Sync + 'static> BenchAlloc for Global<A> {
    #[inline(always)]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: per our caller.
        unsafe { self.inner.alloc(layout) }
    }
    #[inline(always)]
    unsafe fn free(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: per our caller.
        unsafe { self.inner.dealloc(ptr, layout) }
    }
    #[inline(always)]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: per our caller.
        unsafe { self.inner.realloc(ptr, layout, new_size) }
    }
    fn give_back(&self) -> Option<&'static str> {
        let (name, f) = self.give_back?;
        f();
        Some(name)
    }
}

// ---------------------------------------------------------------- magpie

/// The magpie allocator of this process (plain platform).
pub static MAGPIE: Kmem<BenchPlatform> = Kmem::new();
/// The magpie allocator of the `magpie-prof-*` runs ([`ProfPlatform`]).
pub static MAGPIE_PROF: Kmem<ProfPlatform> = Kmem::new();

/// A platform with its process-wide magpie allocator.
pub trait MagpieHost: Platform + Sync + Sized {
    /// The allocator of this platform.
    fn allocator() -> &'static Kmem<Self>;
}

impl MagpieHost for BenchPlatform {
    #[inline(always)]
    fn allocator() -> &'static Kmem<Self> {
        &MAGPIE
    }
}

impl MagpieHost for ProfPlatform {
    #[inline(always)]
    fn allocator() -> &'static Kmem<Self> {
        &MAGPIE_PROF
    }
}

/// magpie-slab through its `GlobalAlloc` (kmalloc / kfree / realloc);
/// with `CACHE`, `OBJ`s come from a pre-resolved 64-byte `kmem_cache`
/// ("bench-64") instead. (A const parameter, so the choice costs no
/// instruction.)
pub struct Magpie<P: MagpieHost, const CACHE: bool> {
    cache: &'static KmemCache<P>,
    pages: &'static HostPages,
}

impl<P: MagpieHost, const CACHE: bool> Magpie<P, CACHE> {
    /// Initialise the process's magpie allocator for `P` (once) over its
    /// own region. (One allocator per process: the suite runs each
    /// configuration in a fresh process.)
    pub fn new() -> Magpie<P, CACHE> {
        Self::with_heap(HEAP_BYTES)
    }

    /// [`Magpie::new`] over a page source of `heap_bytes` bytes (the
    /// replay sizes it to the recorded workload: the page map is 32 bytes
    /// a page of it).
    pub fn with_heap(heap_bytes: usize) -> Magpie<P, CACHE> {
        set_cpu(0);
        let alloc = P::allocator();
        assert!(!alloc.is_ready(), "one magpie allocator per process");
        // MAGPIE_SLAB_DEBUG=<slab_debug= value> measures the debug flags
        // (e.g. `FZPU`, `F,bench-64`): every cache it names, bench-64 and
        // the kmalloc caches included, becomes a debug cache.
        if let Ok(value) = std::env::var("MAGPIE_SLAB_DEBUG") {
            let config = magpie_slab::debug::SlabDebugConfig::parse_slab_debug(Some(&value))
                .expect("MAGPIE_SLAB_DEBUG: a slab_debug= value");
            alloc.debug().set_config(config);
        }
        let pages = HostPages::new("bench", heap_bytes, PAGE_SIZE);
        alloc.init(pages).expect("magpie init");
        let cache = alloc
            .cache_create(
                "bench-64",
                64,
                &CacheArgs {
                    align: 8,
                    ..CacheArgs::DEFAULT
                },
            )
            .expect("bench-64 cache");
        Magpie { cache, pages }
    }

    /// The page source's high-water mark, in pages.
    pub fn peak_pages(&self) -> usize {
        self.pages.peak_pages()
    }

    /// Bytes of slab pages held by every cache (kmalloc classes, the
    /// bench cache, and the allocator's own metadata caches).
    pub fn slab_bytes(&self) -> usize {
        let mut bytes = 0;
        P::allocator().for_each_cache(|c| bytes += c.stats().total_bytes);
        bytes
    }
}

impl<P: MagpieHost, const CACHE: bool> BenchAlloc for Magpie<P, CACHE> {
    #[inline(always)]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: per our caller.
        unsafe { P::allocator().alloc(layout) }
    }
    #[inline(always)]
    unsafe fn free(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: per our caller.
        unsafe { P::allocator().dealloc(ptr, layout) }
    }
    #[inline(always)]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: per our caller.
        unsafe { P::allocator().realloc(ptr, layout, new_size) }
    }
    #[inline(always)]
    fn obj_alloc(&self, layout: Layout) -> *mut u8 {
        if CACHE {
            match self.cache.alloc() {
                Ok(ptr) => ptr.as_ptr(),
                Err(_) => std::ptr::null_mut(),
            }
        } else {
            // SAFETY: OBJ has non-zero size.
            unsafe { self.alloc(layout) }
        }
    }
    #[inline(always)]
    unsafe fn obj_free(&self, ptr: *mut u8, layout: Layout) {
        if CACHE {
            // SAFETY: per our caller: an object of this cache.
            let _ = unsafe { self.cache.free(NonNull::new_unchecked(ptr)) };
        } else {
            // SAFETY: per our caller.
            unsafe { self.free(ptr, layout) }
        }
    }
    fn idle(&self) -> Option<&'static str> {
        // The first tick opens a working-set interval, the second reaps
        // what the interval did not use (illumos kmem_update).
        P::allocator().kmem_update();
        P::allocator().kmem_update();
        Some("2 × kmem_update")
    }
    fn give_back(&self) -> Option<&'static str> {
        P::allocator().reap_all();
        Some("reap_all")
    }
    /// Page-source bytes not in any slab (the page map, set up at init)
    /// plus the slabs of the allocator's own `kmem_*` caches (cache
    /// structs, per-CPU blocks, slab structs, bufctls, magazines, trace
    /// records).
    fn metadata_bytes(&self) -> Option<usize> {
        let mut internal = 0;
        P::allocator().for_each_cache(|c| {
            if c.name().starts_with("kmem_") {
                internal += c.stats().total_bytes;
            }
        });
        let outside_slabs = self.pages.outstanding_bytes() - self.slab_bytes();
        Some(outside_slabs + internal)
    }
    fn memory_parts(&self) -> Option<MemoryParts> {
        let alloc = P::allocator();
        let mut parts = MemoryParts {
            page_map: alloc.stats().metadata().page_map_bytes,
            ..MemoryParts::default()
        };
        alloc.for_each_cache(|c| {
            let stats = c.stats();
            let name = c.name();
            let kind = if name.starts_with("kmem_slab") {
                &mut parts.slab_headers
            } else if name.starts_with("kmem_bufctl") {
                &mut parts.bufctls
            } else if name.starts_with("kmem_magazine") {
                &mut parts.magazines
            } else if name.starts_with("kmem_tags") {
                &mut parts.tag_arrays
            } else if name.starts_with("kmem_") {
                &mut parts.other_metadata
            } else {
                let held = stats.nr_cpu_cached_objs + stats.nr_depot_objs;
                parts.class_bytes += stats.nr_allocated * stats.obj_size;
                parts.free_in_magazines += held * stats.obj_size;
                parts.free_in_slabs += stats
                    .nr_total_objs
                    .saturating_sub(stats.nr_allocated + held)
                    * stats.obj_size;
                &mut parts.tails
            };
            *kind += if name.starts_with("kmem_") {
                stats.total_bytes
            } else {
                stats.waste_bytes
            };
        });
        parts.page_granular = self.pages.outstanding_bytes() - self.slab_bytes() - parts.page_map;
        Some(parts)
    }
}

/// Sub-buffers per CPU for the `*-kmt-on` rows: 1,048,576 events per CPU
/// (64 MiB), more than any of their runs records, so every event is
/// written (no overrun path).
pub const KMT_SUBBUFS: usize = 1024;

/// Start kmemtrace recording (every cache, no stacks) on [`MAGPIE`],
/// with CPU 0's ring already resident: it is filled once (recording
/// events until it overruns) and recording is restarted (same rings,
/// emptied). A kernel's rings are resident memory; without this the
/// host would charge a page fault per 64 events to recording.
pub fn kmemtrace_on() {
    let config = magpie_slab::kmemtrace::KmemtraceConfig {
        nr_subbufs: KMT_SUBBUFS,
        ..Default::default()
    };
    let start = || {
        MAGPIE.kmemtrace().start(config).expect("kmemtrace start");
    };
    start();
    set_cpu(0);
    let events = KMT_SUBBUFS * magpie_slab::kmemtrace::SUBBUF_EVENTS;
    for _ in 0..events.div_ceil(2) + 1 {
        // SAFETY: OBJ has non-zero size; the block is freed at once.
        unsafe {
            let p = MAGPIE.alloc(OBJ);
            assert!(!p.is_null(), "out of memory");
            MAGPIE.dealloc(p, OBJ);
        }
    }
    start();
}

// ---------------------------------------------------------------- peers

/// `linked_list_allocator::LockedHeap` over a region.
pub fn linked_list() -> Global<linked_list_allocator::LockedHeap> {
    let heap = linked_list_allocator::LockedHeap::empty();
    let (base, len) = region(HEAP_BYTES, PAGE_SIZE);
    // SAFETY: a fresh region owned by this heap alone, forever.
    unsafe { heap.lock().init(base as *mut u8, len) };
    Global::new(heap)
}

/// The talc allocator type: spin-locked, claiming the region on first use.
pub type Talc =
    talc::sync::TalcLock<spinning_top::RawSpinlock, talc::source::Claim, talc::DefaultBinning>;

/// `talc` (spin-locked) over a region.
pub fn talc() -> Global<Talc> {
    let (base, len) = region(HEAP_BYTES, PAGE_SIZE);
    // SAFETY: a fresh region owned by this heap alone, forever.
    let claim = unsafe { talc::source::Claim::new(base as *mut u8, len) };
    Global::new(Talc::new(claim))
}

/// `buddy_system_allocator::LockedHeap` (spin-locked) over a region.
pub fn buddy() -> Global<buddy_system_allocator::LockedHeap<32>> {
    let heap = buddy_system_allocator::LockedHeap::<32>::new();
    let (base, len) = region(HEAP_BYTES, PAGE_SIZE);
    // SAFETY: a fresh region owned by this heap alone, forever.
    unsafe { heap.lock().init(base, len) };
    Global::new(heap)
}

unsafe extern "C" {
    fn malloc_trim(pad: usize) -> i32;
    fn mi_collect(force: bool);
}

/// The system allocator (glibc malloc).
pub fn system() -> Global<System> {
    Global {
        inner: System,
        give_back: Some(("malloc_trim(0)", || {
            // SAFETY: glibc's malloc_trim has no preconditions.
            unsafe { malloc_trim(0) };
        })),
    }
}

/// mimalloc (the C library, statically linked).
pub fn mimalloc() -> Global<mimalloc::MiMalloc> {
    Global {
        inner: mimalloc::MiMalloc,
        give_back: Some(("mi_collect(true)", || {
            // SAFETY: mi_collect has no preconditions.
            unsafe { mi_collect(true) };
        })),
    }
}

/// One `ZoneAllocator` per CPU, on its own cache lines.
#[repr(align(128))]
struct Zone(UnsafeCell<ZoneAllocator<'static>>);

/// slabmalloc as its authors intend for several threads ("give every
/// thread its own instance of a ZoneAllocator; the dealloc can deal with
/// deallocating any pointer on any thread", README): one `ZoneAllocator`
/// per CPU with no lock, a free through the freeing CPU's zone (its
/// per-page bitfield updates are atomic), refilled from a page source with
/// 4 KiB `ObjectPage`s up to 256 B and 2 MiB `LargeObjectPage`s above (as
/// its `global_alloc` example does).
pub struct SlabMalloc {
    zones: Box<[Zone]>,
    pages: &'static HostPages,
}

const LARGE_PAGE: usize = 2 << 20;

impl SlabMalloc {
    /// Zone allocators for every CPU with one page source.
    pub fn new() -> SlabMalloc {
        SlabMalloc {
            zones: (0..host::NR_CPUS)
                .map(|_| Zone(UnsafeCell::new(ZoneAllocator::new())))
                .collect(),
            // 8 GiB of address space (untouched pages cost nothing): a
            // `LargeObjectPage` is 2 MiB but holds at most 512 objects
            // (its bitfield), so classes above 256 B use a lot of it.
            pages: HostPages::new("slabmalloc", 8 * HEAP_BYTES, LARGE_PAGE),
        }
    }

    /// This CPU's zone.
    ///
    /// # Safety
    /// Only the thread acting as this CPU uses it, and not reentrantly.
    #[allow(clippy::mut_from_ref, reason = "one zone per CPU, see Safety")]
    #[inline(always)]
    unsafe fn zone(&self) -> &mut ZoneAllocator<'static> {
        let cpu = BenchPlatform::cpu_id().min(host::NR_CPUS - 1);
        // SAFETY: per our caller, the zone is this thread's alone.
        unsafe { &mut *self.zones.get_unchecked(cpu).0.get() }
    }

    #[cold]
    #[inline(never)]
    #[expect(
        clippy::cast_ptr_alignment,
        reason = "alloc_aligned returns page-aligned (4 KiB or 2 MiB) memory"
    )]
    fn refill(&self, zone: &mut ZoneAllocator<'static>, layout: Layout) -> bool {
        use slabmalloc::Allocator as _;
        if layout.size() <= ZoneAllocator::MAX_BASE_ALLOC_SIZE {
            let Some(page) = self.pages.alloc_aligned(1, PAGE_SIZE) else {
                return false;
            };
            // SAFETY: a fresh zeroed 4 KiB page, ours until reclaimed.
            unsafe { zone.refill(layout, &mut *page.as_ptr().cast::<ObjectPage<'static>>()) }
                .is_ok()
        } else {
            let Some(page) = self.pages.alloc_aligned(LARGE_PAGE / PAGE_SIZE, LARGE_PAGE) else {
                return false;
            };
            // SAFETY: a fresh zeroed 2 MiB-aligned 2 MiB page, ours until reclaimed.
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

// SAFETY: each zone is used by the thread acting as its CPU only (`zone`);
// frees from other threads touch only the page's atomic bitfield.
unsafe impl Sync for SlabMalloc {}
// SAFETY: as above.
unsafe impl Send for SlabMalloc {}

// SAFETY: returns slabmalloc's blocks, which are at least layout.size()
// bytes aligned to layout.align(), or null.
unsafe impl GlobalAlloc for SlabMalloc {
    #[inline(always)]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        use slabmalloc::Allocator as _;
        // SAFETY: this thread's zone (thread-local CPU id).
        let zone = unsafe { self.zone() };
        loop {
            match zone.allocate(layout) {
                Ok(ptr) => return ptr.as_ptr(),
                Err(AllocationError::OutOfMemory) => {
                    if !self.refill(zone, layout) {
                        return std::ptr::null_mut();
                    }
                }
                Err(_) => return std::ptr::null_mut(),
            }
        }
    }
    #[inline(always)]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        use slabmalloc::Allocator as _;
        // SAFETY: per our caller, ptr is a live allocation (non-null).
        let ptr = unsafe { NonNull::new_unchecked(ptr) };
        // SAFETY: this thread's zone.
        let _ = unsafe { self.zone() }.deallocate(ptr, layout);
    }
}

/// Bench wrapper of [`SlabMalloc`] (its `give_back` reclaims empty pages
/// of every zone).
pub struct SlabMallocBench(SlabMalloc);

impl SlabMallocBench {
    /// A fresh slabmalloc.
    pub fn new() -> Self {
        SlabMallocBench(SlabMalloc::new())
    }
}

impl BenchAlloc for SlabMallocBench {
    #[inline(always)]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: per our caller.
        unsafe { self.0.alloc(layout) }
    }
    #[inline(always)]
    unsafe fn free(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: per our caller.
        unsafe { self.0.dealloc(ptr, layout) }
    }
    #[inline(always)]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: per our caller (GlobalAlloc's default realloc:
        // allocate, copy, free, as slabmalloc's example gets).
        unsafe { self.0.realloc(ptr, layout, new_size) }
    }
    fn give_back(&self) -> Option<&'static str> {
        let pages = self.0.pages;
        for cpu in 0..host::NR_CPUS {
            // SAFETY: called with no other thread running (memory workloads).
            let zone = unsafe { &mut *self.0.zones[cpu].0.get() };
            zone.try_reclaim_base_pages(usize::MAX, |page| {
                // SAFETY: an empty page the zone gave up.
                unsafe { pages.free_pages(NonNull::new_unchecked(page.cast()), 1) };
            });
            zone.try_reclaim_large_pages(usize::MAX, |page| {
                // SAFETY: as above, a 2 MiB page.
                unsafe {
                    pages.free_pages(NonNull::new_unchecked(page.cast()), LARGE_PAGE / PAGE_SIZE)
                };
            });
        }
        Some("try_reclaim_{base,large}_pages")
    }
}

/// No allocator at all: every alloc returns the same per-thread buffer,
/// realloc returns its argument. Its instruction count is the harness
/// (loop, random stream, byte writes, the out-of-line calls) that every
/// other row also pays; its 2-thread throughput is how well the machine
/// itself scales (no shared memory at all).
pub struct Null;

/// Big enough for every block of every workload (`realloc-1m`'s last is
/// 1 MiB); thread-local zeroes (`.tbss`), so only the pages written are
/// resident.
#[repr(align(4096))]
#[allow(dead_code, reason = "only its address is used")]
struct NullBuf([u8; crate::workloads::CHAIN_MAX]);

std::thread_local! {
    static NULL_BUF: UnsafeCell<NullBuf> =
        const { UnsafeCell::new(NullBuf([0; crate::workloads::CHAIN_MAX])) };
}

/// An empty `asm!` block that "uses" `p`'s address: no instruction, and
/// (no outputs) never `pure`, so the compiler must assume it has side
/// effects. Without it, LLVM sees (in a one-codegen-unit build) that
/// `null`'s out-of-line `call::*` functions do nothing and deletes or
/// hoists the calls themselves, and `null` stops paying the calls every
/// other row pays: its `pair64` fell from 12 to 3 instructions and every
/// net figure rose by about 10.
#[inline(always)]
pub fn opaque(p: *mut u8) -> *mut u8 {
    // SAFETY: the template is empty: it reads and writes no memory, keeps
    // the stack and the flags; it only receives the address as an integer.
    unsafe {
        std::arch::asm!("/* {0} */", in(reg) p.addr(), options(nomem, nostack, preserves_flags));
    }
    p
}

impl BenchAlloc for Null {
    #[inline(always)]
    unsafe fn alloc(&self, _layout: Layout) -> *mut u8 {
        opaque(NULL_BUF.with(|b| b.get().cast()))
    }
    #[inline(always)]
    unsafe fn free(&self, ptr: *mut u8, _layout: Layout) {
        opaque(ptr);
    }
    #[inline(always)]
    unsafe fn realloc(&self, ptr: *mut u8, _layout: Layout, _new_size: usize) -> *mut u8 {
        opaque(ptr)
    }
}

/// Names accepted on the command line, in table order.
pub const ALLOCATORS: &[&str] = &[
    "magpie",
    "mimalloc",
    "system",
    "talc",
    "buddy_system_allocator",
    "slabmalloc",
    "linked_list_allocator",
    "null",
    // The pre-resolved kmem_cache interface (not like for like; its own
    // labelled row).
    "magpie-cache",
    // magpie over a platform with allocation profiling wired to
    // magpie-codetag, switch off / on from boot (a build with feature
    // alloc-profiling).
    "magpie-prof-off",
    "magpie-prof-on",
    "magpie-cache-prof-off",
    "magpie-cache-prof-on",
    // magpie with kmemtrace recording on (every cache, no stacks).
    "magpie-kmt-on",
    "magpie-cache-kmt-on",
];

/// The like-for-like rows (every allocator through `GlobalAlloc`).
pub const PEERS: &[&str] = &[
    "magpie",
    "mimalloc",
    "system",
    "talc",
    "buddy_system_allocator",
    "slabmalloc",
    "linked_list_allocator",
];
