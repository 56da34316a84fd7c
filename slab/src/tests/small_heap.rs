//! Small heaps (issue 17): what `init` costs, a source too small refused
//! with the figures, size classes created on first use, slabs no larger
//! than the source allows, and the heap tests of a hobby kernel's
//! 100 KiB heap, on one CPU.

use std::boxed::Box;
use std::format;
use std::vec::Vec;

use super::support::*;
use crate::{
    AllocError, AllocTagHooks, InitCost, Kmem, MIN_FREE_PAGES, PAGE_SIZE, Platform, PlatformHooks,
};

/// One CPU (id 0), the emulated interrupts of CPU 0; in an interrupt
/// handler while this thread's [`IN_HANDLER`] is set.
pub(super) struct UpPlatform;

std::thread_local! {
    /// This test thread acts as an interrupt handler (`in_interrupt`).
    static IN_HANDLER: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

// SAFETY: one CPU, id 0; every test thread using it acts as CPU 0
// (`set_cpu(0)` in `up_setup`) and takes CPU 0's emulated interrupt lock,
// so interrupts-off sections exclude each other; the default
// cross_cpu_call is right for one CPU.
unsafe impl Platform for UpPlatform {
    fn max_cpus() -> usize {
        1
    }
    fn cpu_id() -> usize {
        0
    }
    fn in_interrupt() -> bool {
        IN_HANDLER.with(std::cell::Cell::get)
    }
    fn irq_save() -> usize {
        emulated_irq_save()
    }
    fn irq_restore(_state: usize) {
        emulated_irq_restore()
    }
    fn now() -> u64 {
        0
    }
}

// SAFETY: the hooks keep PlatformHooks' contract: the KFENCE pool (if any) is
// mapped and the platform's own, and charge tokens are the ones the token hooks
// return.
unsafe impl PlatformHooks for UpPlatform {
    fn backtrace(_frames: &mut [usize]) -> usize {
        0
    }
    fn context(_buf: &mut [u8; 32]) -> usize {
        0
    }
}

// SAFETY: the defaults: no tags.
unsafe impl AllocTagHooks for UpPlatform {}

type UpAlloc = Kmem<UpPlatform>;

/// A hobby kernel's heap: 100 KiB.
const HEAP_PAGES: usize = 100 * 1024 / PAGE_SIZE;

fn up_setup(nr_pages: usize) -> (&'static UpAlloc, &'static FakeSource) {
    set_cpu(0);
    let source = FakeSource::new(nr_pages);
    let alloc: &'static UpAlloc = Box::leak(Box::new(Kmem::new()));
    alloc.init(source).expect("init");
    (alloc, source)
}

#[test]
fn init_takes_one_page_of_a_100_kib_heap() {
    let (alloc, source) = up_setup(HEAP_PAGES);
    let cost = UpAlloc::init_cost(source).unwrap();
    std::println!("{cost}");
    assert_eq!(
        cost,
        InitCost {
            span_bytes: HEAP_PAGES * PAGE_SIZE,
            page_map_bytes: PAGE_SIZE,
            classes_bytes: 0,
            classes_on_first_use: true,
            max_slab_pages: 1,
            min_source_bytes: (1 + MIN_FREE_PAGES) * PAGE_SIZE,
        }
    );
    assert!(cost.init_bytes() <= 16 * 1024);
    // What init took is what it said: the page map.
    assert_eq!(source.pages_outstanding() * PAGE_SIZE, cost.init_bytes());
    // No size class exists yet.
    assert!(alloc.find_cache("kmalloc-64").is_none());
}

#[test]
fn init_on_a_large_source_creates_the_classes_as_before() {
    let (alloc, source) = up_setup(4096);
    let cost = UpAlloc::init_cost(source).unwrap();
    assert!(!cost.classes_on_first_use);
    assert_eq!(cost.max_slab_pages, 32);
    // A 32-byte page-map slot a page (InitCost's formula).
    assert_eq!(cost.page_map_bytes, 4096 * 32);
    // Each class one kmem_cache object: the struct, then at PCPU_OFFSET
    // its per-CPU array (one CPU here).
    assert_eq!(
        cost.classes_bytes,
        crate::KMALLOC_SIZES.len() * (crate::KmemCache::<UpPlatform>::PCPU_OFFSET + 64)
    );
    assert!(alloc.find_cache("kmalloc-64").is_some());
    assert!(alloc.find_cache("kmalloc-8192").is_some());
    // The struct and per-CPU arrays, in whole slabs, plus the page map.
    let taken = source.pages_outstanding() * PAGE_SIZE;
    assert!(
        taken >= cost.init_bytes(),
        "{taken} < {}",
        cost.init_bytes()
    );
}

#[test]
fn init_refuses_a_source_too_small_with_the_figures() {
    set_cpu(0);
    let source = FakeSource::new(MIN_FREE_PAGES);
    let alloc: &'static UpAlloc = Box::leak(Box::new(Kmem::new()));
    assert_eq!(alloc.init(source), Err(AllocError::SourceTooSmall));
    assert!(!alloc.is_ready());
    assert_eq!(source.pages_outstanding(), 0);
    let cost = UpAlloc::init_cost(source).unwrap();
    assert_eq!(
        format!("{cost}"),
        "source spans 64 KiB: init takes 4 KiB (page map 4 KiB, size classes 0 KiB: \
         created on first use), needs at least 68 KiB"
    );
    assert!(format!("{}", AllocError::SourceTooSmall).contains("init_cost"));
    // One page more is enough.
    let source = FakeSource::new(MIN_FREE_PAGES + 1);
    alloc.init(source).unwrap();
}

#[test]
fn a_class_is_created_by_its_first_allocation() {
    let (alloc, source) = up_setup(HEAP_PAGES);
    let before = source.pages_outstanding();
    let obj = alloc.kmalloc_box(832, 8).unwrap();
    let cache = alloc
        .find_cache("kmalloc-832")
        .expect("created on first use");
    let stats = cache.stats();
    assert_eq!(
        stats.nr_pages_per_slab, 1,
        "one page, not 8, on a small heap"
    );
    assert_eq!(stats.nr_allocated, 1);
    // The class's struct and per-CPU array (one kmem_cache object: the
    // metadata slabs it comes from) and one page of objects; with the tag
    // side array, well under the 20 KiB one 832-byte Vec took before.
    let taken = source.pages_outstanding() - before;
    assert!(taken <= 6, "the first kmalloc took {taken} pages");
    obj.free().unwrap();
    // Every class only once.
    alloc.kmalloc_box(832, 8).unwrap().free().unwrap();
    let mut nr_classes = 0;
    alloc.for_each_cache(|cache| nr_classes += usize::from(cache.name() == "kmalloc-832"));
    assert_eq!(nr_classes, 1);
    alloc.debug().check_invariants().unwrap();
}

/// Magazines allocated now (all of them `kmem_magazine_60` objects on a
/// small source).
fn magazines_in_use(alloc: &UpAlloc) -> usize {
    alloc
        .find_cache("kmem_magazine_60")
        .unwrap()
        .stats()
        .nr_allocated
}

/// On a small source every magazine is one 496-byte object, so a class
/// refills into a magazine of its depot's type from its first trip down
/// (not 1, 3, 6, 14 rounds as its misses repeat): the allocations and the
/// frees that follow share one magazine.
#[test]
fn a_small_source_refills_into_magazines_of_the_depots_type() {
    let (alloc, _) = up_setup(HEAP_PAGES);
    let magazines = || magazines_in_use(alloc);
    let objs: Vec<_> = (0..20).map(|_| alloc.kmalloc_box(64, 8).unwrap()).collect();
    let cache = alloc.find_cache("kmalloc-64").unwrap();
    let magsize = cache.stats().magsize;
    assert_eq!(magsize, 60);
    // The refills' one magazine, of the depot's type: no smaller one made
    // and freed (every type lives in kmem_magazine_60's objects).
    assert_eq!(magazines(), 1);
    let loaded = cache.cpu_stats(0).nr_rounds_loaded;
    for obj in objs {
        obj.free().unwrap();
    }
    // The frees fit in it: no magazine made, none freed to the slab layer.
    assert_eq!(magazines(), 1);
    assert_eq!(cache.cpu_stats(0).nr_rounds_loaded, loaded + 20);
    assert_eq!(
        cache
            .nr_frees_direct
            .load(core::sync::atomic::Ordering::Relaxed),
        0
    );
    alloc.debug().check_invariants().unwrap();
}

/// On a small source a class is born with an empty magazine of its
/// depot's type loaded on the CPU that made it: its first free goes in
/// by the hit, where it went slow to make a magazine.
#[test]
fn a_class_born_on_a_small_source_has_a_magazine_for_its_first_free() {
    let (alloc, _) = up_setup(HEAP_PAGES);
    let magazines = || magazines_in_use(alloc);
    let obj = alloc.kmalloc_box(96, 8).unwrap();
    let cache = alloc.find_cache("kmalloc-96").unwrap();
    assert_eq!(magazines(), 1, "the class's first magazine");
    assert_eq!(cache.cpu_stats(0).nr_rounds_loaded, 0);
    obj.free().unwrap();
    assert_eq!(cache.cpu_stats(0).nr_rounds_loaded, 1);
    assert_eq!(magazines(), 1, "no magazine made by the free");
    assert_eq!(cache.stats().nr_allocated, 0);
    alloc.debug().check_invariants().unwrap();
}

#[test]
fn an_unborn_class_keeps_the_alignment_asked_for() {
    let (alloc, _source) = up_setup(HEAP_PAGES);
    // 24 bytes aligned to 16: kmalloc-32 (kmalloc-24 is 8-aligned), though
    // the stub sees only the size.
    let obj = alloc.kmalloc_box(24, 16).unwrap();
    assert!((obj.as_ptr().as_ptr() as usize).is_multiple_of(16));
    assert!(alloc.find_cache("kmalloc-32").is_some());
    assert!(alloc.find_cache("kmalloc-24").is_none());
    obj.free().unwrap();
    for align in [8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096] {
        for size in [1, 24, 100, 1000, 3000, 5000, 8192] {
            let obj = alloc.kmalloc_box(size, align).unwrap();
            assert!(
                (obj.as_ptr().as_ptr() as usize).is_multiple_of(align),
                "{size} {align}"
            );
            assert!(alloc.ksize(obj.as_ptr()).unwrap() >= size);
            obj.free().unwrap();
        }
    }
    // The public lookup creates the class too.
    let cache = alloc.stats().kmalloc_cache_for(40, 8).unwrap();
    assert_eq!(cache.name(), "kmalloc-40");
    alloc.debug().check_invariants().unwrap();
}

/// From an interrupt handler the cache list and the size-class lock are
/// only tried, once: with the list held (by the code the handler
/// interrupted, a `for_each_cache` walk), the handler's first allocation
/// of an unborn class fails at once (`OutOfMemory`) and leaves it unborn;
/// the next allocation outside the walk makes it.
#[test]
fn a_handler_does_not_wait_for_the_cache_list_to_make_a_class() {
    let (alloc, _source) = up_setup(HEAP_PAGES);
    let mut result = None;
    alloc.for_each_cache(|_| {
        if result.is_none() {
            IN_HANDLER.with(|handler| handler.set(true));
            result = Some(alloc.kmalloc_box(100, 8).map(crate::SlabBox::free));
            IN_HANDLER.with(|handler| handler.set(false));
        }
    });
    assert!(
        matches!(result, Some(Err(AllocError::OutOfMemory))),
        "{result:?}"
    );
    assert!(alloc.find_cache("kmalloc-104").is_none());
    alloc.kmalloc_box(100, 8).unwrap().free().unwrap();
    assert!(alloc.find_cache("kmalloc-104").is_some());
    alloc.debug().check_invariants().unwrap();
}

/// The heap tests of a hobby kernel (blog_os `tests/heap_allocation.rs`)
/// through the `core::alloc::Allocator` shim (feature `nightly`), on a
/// 100 KiB source.
#[cfg(feature = "nightly")]
#[test]
fn hobby_kernel_heap_tests_fit_in_100_kib() {
    let (alloc, source) = up_setup(HEAP_PAGES);
    // A few boxes.
    let a = Box::new_in(41_u64, alloc);
    let b = Box::new_in(13_u64, alloc);
    assert_eq!(*a + *b, 54);
    drop((a, b));
    // An 8 KiB Vec, grown an element at a time.
    let mut vec = Vec::new_in(alloc);
    for i in 0..1000_u64 {
        vec.push(i);
    }
    assert_eq!(vec.iter().sum::<u64>(), 999 * 1000 / 2);
    drop(vec);
    // 10,000 boxes, one at a time.
    for i in 0..10_000_usize {
        let x = Box::new_in(i, alloc);
        assert_eq!(*x, i);
    }
    // Long-lived boxes among them.
    let long_lived = Box::new_in(1_usize, alloc);
    let more: Vec<_, _> = (0..100).map(|i| Box::new_in(i, alloc)).collect::<Vec<_>>();
    for i in 0..10_000_usize {
        let x = Box::new_in(i, alloc);
        assert_eq!(*x, i);
    }
    assert_eq!(*long_lived, 1);
    drop(more);
    // A BTreeMap churn.
    let mut map = std::collections::BTreeMap::new_in(alloc);
    for round in 0..20_u64 {
        for key in 0..500_u64 {
            map.insert(key * 7919 % 1000, round + key);
        }
        for key in 0..250_u64 {
            map.remove(&(key * 3));
        }
    }
    assert!(!map.is_empty());
    // Every magazine, of whatever type, lives in kmem_magazine_60's
    // objects: one slab for them all, not a page per type.
    let magazines = |name| alloc.find_cache(name).unwrap().stats().nr_allocated;
    assert!(magazines("kmem_magazine_60") > 0);
    for name in crate::magazine::MAG_CACHE_NAMES
        .iter()
        .filter(|&&name| name != "kmem_magazine_60")
    {
        assert_eq!(magazines(name), 0, "{name}");
    }
    drop(map);
    drop(long_lived);
    alloc.debug().check_invariants().unwrap();
    std::println!(
        "100 KiB heap: {} of {} pages used after the tests, {} pressure reaps",
        source.pages_outstanding(),
        HEAP_PAGES,
        alloc.stats().nr_pressure_reaps()
    );
}

/// Every class born on first use (in a scrambled order) is named
/// `kmalloc-<size>` and is published in exactly its own entries of the
/// small-size hit's by-8 table (each size's smallest class at least as
/// big), while the entries of classes still unborn keep their stubs.
#[test]
fn classes_born_on_first_use_are_named_and_published_by_size() {
    // Small enough that the classes come on first use; room for all 152
    // kmem_cache objects.
    let (alloc, source) = up_setup(64);
    assert!(UpAlloc::init_cost(source).unwrap().classes_on_first_use);
    let nr = crate::KMALLOC_SIZES.len();
    let class_of_entry = |entry: usize| {
        crate::KMALLOC_SIZES
            .iter()
            .position(|&size| size >= entry * 8)
            .unwrap()
    };
    let mut born = std::vec![false; nr];
    for step in 0..nr {
        // 37 is prime to 152: every class once.
        let index = step * 37 % nr;
        let size = crate::KMALLOC_SIZES[index];
        let align = crate::natural_align(size);
        let cache = alloc.stats().kmalloc_cache_for(size, align).unwrap();
        assert_eq!(cache.name(), format!("kmalloc-{size}"));
        born[index] = true;
        for (entry, slot) in alloc.kmalloc_by_8.iter().enumerate() {
            let class = class_of_entry(entry);
            let published = slot.load(core::sync::atomic::Ordering::Acquire);
            let in_slot = alloc.kmalloc[class].load(core::sync::atomic::Ordering::Acquire);
            assert_eq!(published, in_slot, "entry {entry} of class {class}");
            // SAFETY: published entries are permanent caches or stubs.
            let unborn = unsafe { (*published).hot() }.contains(crate::cache::HotFlags::UNBORN);
            assert_eq!(unborn, !born[class], "entry {entry} of class {class}");
        }
    }
    alloc.debug().check_invariants().unwrap();
}

/// A class's struct comes from kmem_cache's packed slabs (one page of
/// four 1 KiB objects, the header in kmem_slab): making classes takes no
/// kmem_bufctl object, as a bufctl slab of kmem_cache did (one a
/// struct, and kmem_bufctl's first slab for the first class).
#[test]
fn class_structs_take_no_bufctls() {
    let (alloc, _source) = up_setup(HEAP_PAGES);
    let boxes: Vec<_> = [8, 100, 832, 3000]
        .into_iter()
        .map(|size| alloc.kmalloc_box(size, 8).unwrap())
        .collect();
    let structs = alloc.find_cache("kmem_cache").unwrap().stats();
    assert_eq!(structs.nr_allocated, 4);
    assert_eq!(structs.nr_pages_per_slab, 1);
    assert_eq!(structs.objs_per_slab, 4);
    let bufctls = alloc.find_cache("kmem_bufctl").unwrap().stats();
    assert_eq!(bufctls.nr_allocated, 0);
    for obj in boxes {
        obj.free().unwrap();
    }
    alloc.debug().check_invariants().unwrap();
}

/// Four CPUs racing to the first allocations of the same classes on a
/// small source: each class is created once, and every object is good.
#[test]
fn classes_created_on_first_use_race_safely() {
    let (alloc, source) = setup(256);
    assert!(
        Kmem::<TestPlatform>::init_cost(source)
            .unwrap()
            .classes_on_first_use
    );
    let threads: Vec<_> = (0..NR_CPUS)
        .map(|cpu| {
            std::thread::spawn(move || {
                set_cpu(cpu);
                for round in 0..20 {
                    let mut held = Vec::new();
                    for size in [8, 24, 100, 500, 1000, 3000] {
                        let obj = alloc.kmalloc_box(size, 8).unwrap();
                        held.push(fill_box(obj, (cpu * 31 + round) as u8));
                    }
                    for obj in held {
                        assert!(check_box(&obj, (cpu * 31 + round) as u8));
                        obj.free().unwrap();
                    }
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    for name in [
        "kmalloc-8",
        "kmalloc-24",
        "kmalloc-104",
        "kmalloc-512",
        "kmalloc-1024",
        "kmalloc-3008",
    ] {
        let mut nr = 0;
        alloc.for_each_cache(|cache| nr += usize::from(cache.name() == name));
        assert_eq!(nr, 1, "{name}");
    }
    alloc.debug().check_invariants().unwrap();
}

/// The source fills up: every page it has left taken outside the
/// allocator (returned by [`give_back`]).
fn take_every_page(source: &'static FakeSource) -> Vec<core::ptr::NonNull<u8>> {
    let mut held = Vec::new();
    while let Ok(page) = crate::PageSource::alloc_pages(source, 1) {
        held.push(page);
    }
    held
}

fn give_back(source: &'static FakeSource, held: Vec<core::ptr::NonNull<u8>>) {
    for page in held {
        // SAFETY: taken from this source by take_every_page, one page each.
        unsafe { crate::PageSource::free_pages(source, page, 1) };
    }
}

/// A pressure reap stops once the request fits, and reaps the caches
/// with the largest objects first: a page for a new slab of kmalloc-2048
/// comes from kmalloc-4096's cached slab, and the small class's
/// magazines (a workload's churn) are left alone. A request that fits
/// only after every cache is reaped still succeeds.
#[test]
fn a_pressure_reap_stops_once_the_request_fits() {
    let (alloc, source) = up_setup(HEAP_PAGES);
    // kmalloc-2048 exists but holds no slab; kmalloc-8 and kmalloc-4096
    // hold theirs, their objects in this CPU's magazines.
    alloc.kmalloc_box(2048, 8).unwrap().free().unwrap();
    let class_2048 = alloc.find_cache("kmalloc-2048").unwrap();
    class_2048.reap();
    assert_eq!(class_2048.stats().nr_slabs, 0);
    let small: Vec<_> = (0..20).map(|_| alloc.kmalloc_box(8, 8).unwrap()).collect();
    small.into_iter().for_each(|obj| obj.free().unwrap());
    alloc.kmalloc_box(4096, 8).unwrap().free().unwrap();
    let class_8 = alloc.find_cache("kmalloc-8").unwrap();
    let class_4096 = alloc.find_cache("kmalloc-4096").unwrap();
    let cached_8 = class_8.stats().nr_cpu_cached_objs;
    assert!(cached_8 > 0);
    assert_eq!(class_4096.stats().nr_slabs, 1);

    let held = take_every_page(source);
    let reaps = alloc.stats().nr_pressure_reaps();
    let obj = alloc
        .kmalloc_box(2048, 8)
        .expect("a page from kmalloc-4096");
    assert_eq!(alloc.stats().nr_pressure_reaps(), reaps + 1);
    assert_eq!(class_4096.stats().nr_slabs, 0, "the largest objects first");
    assert_eq!(
        class_8.stats().nr_cpu_cached_objs,
        cached_8,
        "the small class's magazines kept"
    );
    obj.free().unwrap();

    // Three pages in a row: only the small classes (and the metadata)
    // have pages left to give; every cache is reaped, and it fits.
    give_back(source, held);
    let held = take_every_page(source);
    let big = alloc.kmalloc_box(3 * PAGE_SIZE, 8);
    assert_eq!(class_8.stats().nr_cpu_cached_objs, 0, "reaped in the end");
    big.unwrap().free().unwrap();
    give_back(source, held);
    alloc.debug().check_invariants().unwrap();
}

/// The pressure reap takes the cheapest pages first: those with the
/// fewest objects out of their slabs (magazine rounds to put back) a
/// page, not the largest objects: a page of kmalloc-512 whose every
/// object rests in a magazine stays, one of kmalloc-16 holding one
/// cached object goes.
#[test]
fn a_pressure_reap_takes_the_cheapest_pages_first() {
    let (alloc, source) = up_setup(HEAP_PAGES);
    alloc.kmalloc_box(2048, 8).unwrap().free().unwrap();
    alloc.find_cache("kmalloc-2048").unwrap().reap();
    alloc.kmalloc_box(16, 8).unwrap().free().unwrap();
    let class_16 = alloc.find_cache("kmalloc-16").unwrap();
    let first = alloc.kmalloc_box(512, 8).unwrap();
    let class_512 = alloc.find_cache("kmalloc-512").unwrap();
    let per_slab = class_512.stats().objs_per_slab;
    let mut full: Vec<_> = (1..per_slab)
        .map(|_| alloc.kmalloc_box(512, 8).unwrap())
        .collect();
    full.push(first);
    full.into_iter().for_each(|obj| obj.free().unwrap());
    let cached_512 = class_512.stats().nr_cpu_cached_objs + class_512.stats().nr_depot_objs;
    assert!(cached_512 >= per_slab, "{cached_512} of {per_slab}");
    assert_eq!(class_512.stats().nr_slabs, 1);
    assert_eq!(class_16.stats().nr_slabs, 1);

    let held = take_every_page(source);
    let obj = alloc.kmalloc_box(2048, 8).expect("a page from kmalloc-16");
    assert_eq!(class_16.stats().nr_slabs, 0, "the cheap page given back");
    assert_eq!(class_512.stats().nr_slabs, 1, "the dear one kept");
    assert_eq!(
        class_512.stats().nr_cpu_cached_objs + class_512.stats().nr_depot_objs,
        cached_512
    );
    obj.free().unwrap();
    give_back(source, held);
    alloc.debug().check_invariants().unwrap();
}

/// A kernel's page source that reaps on its own when it runs dry, as the
/// kernel's `kpages` does (`Kmem::reap_all`, which takes the cache-list
/// lock), then tries once more.
struct ReapingSource {
    inner: &'static FakeSource,
    alloc: std::sync::OnceLock<&'static UpAlloc>,
}

impl crate::PageSource for ReapingSource {
    fn name(&self) -> &str {
        "reaping"
    }
    fn alloc_pages(&self, nr_pages: usize) -> Result<core::ptr::NonNull<u8>, crate::AllocError> {
        self.inner.alloc_pages(nr_pages).or_else(|_| {
            if let Some(alloc) = self.alloc.get() {
                alloc.reap_all();
            }
            self.inner.alloc_pages(nr_pages)
        })
    }
    unsafe fn free_pages(&self, addr: core::ptr::NonNull<u8>, nr_pages: usize) {
        // SAFETY: the caller's promise, passed on: pages of this source,
        // which are the inner source's.
        unsafe { self.inner.free_pages(addr, nr_pages) }
    }
    fn span(&self) -> (usize, usize) {
        self.inner.span()
    }
    fn stats(&self) -> crate::ArenaStats {
        self.inner.stats()
    }
}

/// The pressure reap calls the page source with no lock of the
/// allocator's held: a source that reaps when it runs dry (the kernel's
/// `kpages`) would otherwise wait for the cache-list lock its own CPU
/// holds (the README's `kmalloc 1048576 1000` session hung that way).
/// Here that wait would be this test hanging.
#[test]
fn a_page_source_that_reaps_when_dry_does_not_deadlock_the_pressure_reap() {
    set_cpu(0);
    let inner = FakeSource::new(HEAP_PAGES);
    let source: &'static ReapingSource = Box::leak(Box::new(ReapingSource {
        inner,
        alloc: std::sync::OnceLock::new(),
    }));
    let alloc: &'static UpAlloc = Box::leak(Box::new(Kmem::new()));
    alloc.init(source).expect("init");
    source.alloc.set(alloc).ok().unwrap();
    // Classes with pages in their magazines, then a heap with no page.
    alloc.kmalloc_box(4096, 8).unwrap().free().unwrap();
    let small: Vec<_> = (0..20).map(|_| alloc.kmalloc_box(8, 8).unwrap()).collect();
    small.into_iter().for_each(|obj| obj.free().unwrap());
    let held = take_every_page(inner);
    // The source's own reap finds the page.
    let obj = alloc.kmalloc_box(2048, 8).expect("a page after the reap");
    // Eight pages in a row are not there even after its reap: the
    // pressure reap runs, calls the source (which reaps again), and the
    // allocation fails cleanly.
    let reaps = alloc.stats().nr_pressure_reaps();
    let error = alloc.kmalloc_box(8 * PAGE_SIZE, 8).err();
    assert_eq!(error, Some(crate::AllocError::OutOfMemory));
    assert_eq!(alloc.stats().nr_pressure_reaps(), reaps + 1);
    obj.free().unwrap();
    give_back(inner, held);
    alloc.kmalloc_box(8 * PAGE_SIZE, 8).unwrap().free().unwrap();
    alloc.debug().check_invariants().unwrap();
}
