//! KFENCE in the real kernel, without slab debug flags: the 18 corruption
//! kinds of `slab/src/tests/corruption_kinds.rs` (write after free at
//! offsets 0/8/32/last, overflow by 1 and 64, underflow by 1 and 8, read
//! after free; a small and a bufctl cache) committed on a sampled object,
//! each detected (a fault in a guard page or an unmapped freed page, or the
//! canary at the free) with the kernel alive after it; in both placements.
//! Double and invalid frees of samples refused and reported; the boot
//! argument; sampling by time on the magazine-miss path; `kmem kfence`.

#![no_std]
#![no_main]
#![feature(custom_test_frameworks)]
#![test_runner(magpie::test_runner)]
#![reexport_test_harness_main = "test_main"]
#![allow(
    missing_docs,
    clippy::missing_panics_doc,
    reason = "#[test_case] functions are named for what they check and fail by panicking"
)]

use alloc::string::String;
use alloc::vec::Vec;
use core::ptr::NonNull;
use magpie_slab::CacheArgs;

use magpie::debug::kfence;
use magpie::kmem::{KPAGES, KernelPlatform, SLAB};
use magpie::shell::Shell;
use magpie_slab::kfence::{KfenceBug, KfencePlace};
use magpie_slab::{AllocError, ArenaStats, FreeError, KmemCache, PageSource, SlabKind};

type Cache = KmemCache<KernelPlatform>;

magpie::test_kernel!();

/// A page source other than the primary one (its pages are `KPAGES`').
struct Other;

impl PageSource for Other {
    fn name(&self) -> &str {
        "kfence-test"
    }
    fn alloc_pages(&self, nr_pages: usize) -> Result<NonNull<u8>, AllocError> {
        KPAGES.alloc_pages(nr_pages)
    }
    unsafe fn free_pages(&self, addr: NonNull<u8>, nr_pages: usize) {
        // SAFETY: per our caller, pages from our alloc_pages: KPAGES'.
        unsafe { KPAGES.free_pages(addr, nr_pages) }
    }
    fn span(&self) -> (usize, usize) {
        KPAGES.span()
    }
    fn stats(&self) -> ArenaStats {
        ArenaStats::default()
    }
}

static OTHER: Other = Other;

const KINDS: [&str; 9] = [
    "write after free at 0",
    "write after free at 8",
    "write after free at 32",
    "write after free at the last byte",
    "overflow by 1",
    "overflow by 64",
    "underflow by 1",
    "underflow by 8",
    "read after free",
];

fn nr_bugs() -> u64 {
    SLAB.kfence().stats().nr_bugs
}

/// A byte written at `offset` (negative: before the object) of `obj`.
fn poke(obj: NonNull<u8>, offset: isize) {
    let at = (obj.as_ptr() as usize).wrapping_add_signed(offset);
    // SAFETY: the bug this test commits, on a KFENCE sample: `at` is in
    // the sample's page (canary), a guard page beside it, or its unmapped
    // page after the free; a fault is reported and the page mapped back
    // in, so the write lands in pool memory nobody uses.
    unsafe { core::ptr::write_volatile(at as *mut u8, 0x41) };
}

/// The kernel still allocates and frees.
fn alive() {
    let v: Vec<u64> = (0..100).collect();
    assert_eq!(v.iter().sum::<u64>(), 4950);
}

/// Commits `kind` on a sample of `cache` placed at `place`; whether KFENCE
/// reported it.
fn detected(cache: &'static Cache, kind: &str, place: KfencePlace) -> bool {
    let size = cache.obj_size() as isize;
    assert!(SLAB.kfence().force_sample_of(cache, Some(place)));
    let obj = cache.alloc().unwrap();
    assert!(
        SLAB.kfence().contains(obj.as_ptr() as usize),
        "{kind}: not sampled"
    );
    let before = nr_bugs();
    match kind {
        "overflow by 1" => poke(obj, size),
        "overflow by 64" => (size..size + 64).for_each(|at| poke(obj, at)),
        "underflow by 1" => poke(obj, -1),
        "underflow by 8" => (-8..0).for_each(|at| poke(obj, at)),
        _ => {}
    }
    // SAFETY: allocated above, given up (the corruption is the pool's to find).
    unsafe { cache.free(obj) }.unwrap();
    match kind {
        "write after free at 0" => poke(obj, 0),
        "write after free at 8" => poke(obj, 8),
        "write after free at 32" => poke(obj, 32),
        "write after free at the last byte" => poke(obj, size - 1),
        "read after free" => {
            // SAFETY: the bug this test commits: a read of a freed sample
            // (faults, reported, page mapped back in); it changes nothing.
            let _ = unsafe { core::ptr::read_volatile(obj.as_ptr().add(8)) };
        }
        _ => {}
    }
    nr_bugs() > before
}

#[test_case]
fn every_corruption_kind_is_detected_on_a_sample_without_flags() {
    let mut missed = Vec::new();
    let mut nr = 0;
    // 1024-byte objects on a source other than the primary one: bufctl
    // slabs (on the primary source they would be packed small slabs).
    for (size, slab_kind, source) in [
        (64, SlabKind::Small, None),
        (
            1024,
            SlabKind::Bufctl,
            Some(&OTHER as &'static dyn PageSource),
        ),
    ] {
        let cache = SLAB
            .cache_create(
                "kfence-test",
                size,
                &CacheArgs {
                    align: 8,
                    source,
                    ..CacheArgs::DEFAULT
                },
            )
            .unwrap();
        assert_eq!(cache.stats().kind, slab_kind);
        // Overflows faulting in the right guard page and underflows in the
        // left one, then the other way round (the canary finds them at the
        // free).
        for places in [
            [KfencePlace::Right, KfencePlace::Left],
            [KfencePlace::Left, KfencePlace::Right],
        ] {
            for kind in KINDS {
                nr += 1;
                let place = if kind.starts_with("underflow") {
                    places[1]
                } else {
                    places[0]
                };
                if !detected(cache, kind, place) {
                    missed.push((size, kind, place));
                }
                alive();
            }
        }
        // SAFETY: the test's own cache; samples are not its objects, and
        // every one of its own objects was freed.
        unsafe { magpie::kmem::cache_destroy(cache) }.unwrap();
    }
    magpie::println!(
        "corruption kinds detected, no flags, on a KFENCE sample: {}/{nr}",
        nr - missed.len()
    );
    assert!(missed.is_empty(), "missed: {missed:?}");
    assert_eq!(nr, 36);
}

#[test_case]
fn double_and_invalid_frees_of_samples_are_refused_and_reported() {
    let before = nr_bugs();
    assert!(SLAB.kfence().force_sample(None));
    let obj = SLAB.kmalloc(100, 8).unwrap();
    let addr = obj.as_ptr() as usize;
    assert!(SLAB.kfence().contains(addr));
    assert_eq!(SLAB.ksize(obj), Ok(100));
    let inner = NonNull::new((addr + 16) as *mut u8).unwrap();
    // SAFETY: a bad free (refused, nothing touched), the right one, then a
    // double free (refused).
    unsafe {
        assert_eq!(
            SLAB.kfree(inner),
            Err(FreeError::NotAllocated { addr: addr + 16 })
        );
        SLAB.kfree(obj).unwrap();
        assert_eq!(SLAB.kfree(obj), Err(FreeError::DoubleFree { addr }));
    }
    assert_eq!(nr_bugs(), before + 2);
    let report = kfence::last_report().unwrap();
    assert_eq!(report.kind, KfenceBug::InvalidFree);
    assert_eq!(report.addr, addr);
    alive();
}

#[test_case]
fn the_boot_argument_sets_the_interval() {
    assert_eq!(kfence::sample_interval(""), 100);
    assert_eq!(kfence::sample_interval("quiet kfence.sample_interval=0"), 0);
    assert_eq!(kfence::sample_interval("kfence.sample_interval=250 x"), 250);
    assert_eq!(kfence::sample_interval("kfence.sample_interval=abc"), 100);
    assert_eq!(SLAB.kfence().stats().interval_ms, 100, "on by default");
}

#[test_case]
fn allocations_are_sampled_by_time_without_forcing() {
    let before = SLAB.kfence().stats().nr_allocs;
    SLAB.kfence().set_interval(1);
    let start = magpie::arch::rdtsc();
    let limit = magpie::arch::tsc::khz() * 3000;
    // kmalloc-64 objects, more than the magazines hold, so misses check
    // the clock.
    while SLAB.kfence().stats().nr_allocs < before + 3 && magpie::arch::rdtsc() - start < limit {
        let objs: Vec<_> = (0..300)
            .map(|_| alloc::boxed::Box::new([0u64; 8]))
            .collect();
        drop(objs);
    }
    SLAB.kfence().set_interval(100);
    assert!(
        SLAB.kfence().stats().nr_allocs >= before + 3,
        "{:?}",
        SLAB.kfence().stats()
    );
    assert_eq!(SLAB.kfence().stats().nr_in_use, 0);
}

#[test_case]
fn kmem_kfence_shows_the_pool() {
    let mut shell = Shell::new();
    let mut out = String::new();
    shell.execute("kmem kfence", &mut out);
    assert!(out.contains("enabled: 1\n"), "{out}");
    assert!(out.contains("sample interval: 100 ms\n"), "{out}");
    assert!(out.contains("pool: 128 pages, 63 objects\n"), "{out}");
    assert!(out.contains("currently allocated: 0\n"), "{out}");
    assert!(out.contains("total bugs: "), "{out}");
}
