//! The bad-free matrix: nine kinds of bad free on a small-slab cache and
//! on a bufctl cache (18 in all), with no debug flags. Every one is
//! refused at the free with the right error, changes no counter but the
//! error count, and nothing is handed out twice afterwards (issue 19: the
//! free key of `cache/double_free.rs` refuses the double frees of objects
//! resting anywhere in the magazine layer or back in their slab).

use crate::CacheArgs;
use std::vec::Vec;

use super::support::*;
use crate::layout::geometry::SlabKind;
use crate::{CacheStats, FreeError, KmemCache};

type Cache = KmemCache<TestPlatform>;

fn same_counts(a: &CacheStats, b: &CacheStats) -> bool {
    (
        a.nr_allocated,
        a.nr_allocs_ever,
        a.nr_frees_ever,
        a.nr_cpu_cached_objs,
        a.nr_depot_objs,
        a.nr_slabs,
    ) == (
        b.nr_allocated,
        b.nr_allocs_ever,
        b.nr_frees_ever,
        b.nr_cpu_cached_objs,
        b.nr_depot_objs,
        b.nr_slabs,
    )
}

/// Free `addr` to `cache` (on CPU 0) and check that it is refused with
/// `want`, reported once, and that no counter moved.
fn refused(alloc: &TestAlloc, cache: &Cache, addr: usize, want: FreeError) -> bool {
    set_cpu(0);
    let before = cache.stats();
    let errors = alloc.debug().nr_errors();
    let ptr = core::ptr::NonNull::new(addr as *mut u8).unwrap();
    // SAFETY: a deliberate bad free; refused.
    let result = unsafe { cache.free(ptr) };
    result == Err(want)
        && alloc.debug().nr_errors() == errors + 1
        && same_counts(&before, &cache.stats())
}

/// The nine kinds on a fresh cache of `size`-byte objects; returns each
/// kind's name and whether it was refused as it should be.
fn bad_free_kinds(size: usize, kind: SlabKind) -> Vec<(&'static str, bool)> {
    let (alloc, _) = setup(4096);
    let cache = alloc
        .cache_create(
            "bad-free",
            size,
            &CacheArgs {
                align: 8,
                ..CacheArgs::DEFAULT
            },
        )
        .unwrap();
    let other = alloc
        .cache_create(
            "other",
            size,
            &CacheArgs {
                align: 8,
                ..CacheArgs::DEFAULT
            },
        )
        .unwrap();
    assert_eq!(cache.stats().kind, kind);
    let mut results = Vec::new();
    // CPU 1 frees a few objects: they rest in its `loaded`.
    set_cpu(1);
    let on_cpu1: Vec<_> = (0..5).map(|_| cache.alloc_box().unwrap()).collect();
    for obj in on_cpu1 {
        obj.free().unwrap();
    }
    // CPU 0 frees enough to fill `loaded`, `prev` and the depot.
    set_cpu(0);
    let keep = cache.alloc_box().unwrap();
    let mut live: Vec<_> = (0..400).map(|_| cache.alloc_box().unwrap()).collect();
    let first = live[0].as_ptr().as_ptr() as usize;
    live.reverse();
    // Free until the depot holds some and `loaded` and `prev` two or more.
    while let Some(obj) = live.pop() {
        obj.free().unwrap();
        let (loaded, prev) = cache.cpu_rounds(0);
        if loaded.len() >= 2 && prev.len() >= 2 && !cache.depot_rounds().is_empty() {
            break;
        }
    }
    let (loaded, prev) = cache.cpu_rounds(0);
    let depot = cache.depot_rounds();
    let (cpu1_loaded, _) = cache.cpu_rounds(1);
    let shape = (loaded.len(), prev.len(), depot.len(), cpu1_loaded.len());
    assert!(
        shape.0 >= 2 && shape.1 >= 2 && shape.2 > 0 && shape.3 >= 2,
        "{shape:?}"
    );
    let double = |addr| FreeError::DoubleFree { addr };
    let cases = [
        ("top of loaded", *loaded.last().unwrap()),
        ("deep in loaded", loaded[0]),
        ("top of prev", *prev.last().unwrap()),
        ("deep in prev", prev[0]),
        ("in the depot", depot[depot.len() / 2]),
        ("in another CPU's magazine", cpu1_loaded[0]),
    ];
    for (name, addr) in cases {
        results.push((name, refused(alloc, cache, addr, double(addr))));
    }
    // Back in its slab: the reap drains every magazine (`keep` holds
    // the first slab).
    cache.reap();
    // The first freed; it shares `keep`'s slab.
    let addr = first;
    assert_eq!(
        cache.stats().nr_cpu_cached_objs + cache.stats().nr_depot_objs,
        0
    );
    // A loaded magazine with room, so that the free takes the hit.
    let warm = cache.alloc_box().unwrap();
    assert_ne!(warm.as_ptr().as_ptr() as usize, addr);
    warm.free().unwrap();
    results.push((
        "back in its slab",
        refused(alloc, cache, addr, double(addr)),
    ));
    let interior = keep.as_ptr().as_ptr() as usize + 8;
    results.push((
        "interior pointer",
        refused(
            alloc,
            cache,
            interior,
            FreeError::Misaligned { addr: interior },
        ),
    ));
    let foreign = other.alloc_box().unwrap();
    let addr = foreign.as_ptr().as_ptr() as usize;
    results.push((
        "to the wrong cache",
        refused(alloc, cache, addr, FreeError::WrongCache { addr }),
    ));
    // Nothing is handed out twice, and the counts never wrapped.
    let mut again: Vec<_> = (0..500).map(|_| cache.alloc_box().unwrap()).collect();
    again.extend(live);
    again.push(keep);
    assert_eq!(cache.stats().nr_allocated, again.len());
    let mut addrs: Vec<_> = again.iter().map(|obj| obj.as_ptr()).collect();
    addrs.sort_unstable();
    addrs.dedup();
    assert_eq!(addrs.len(), again.len(), "an object was handed out twice");
    for obj in again {
        obj.free().unwrap();
    }
    foreign.free().unwrap();
    assert_eq!(cache.stats().nr_allocated, 0);
    results
}

#[test]
fn every_bad_free_refused_without_flags() {
    let mut results = bad_free_kinds(64, SlabKind::Small);
    results.extend(bad_free_kinds(12288, SlabKind::Bufctl));
    set_cpu(0);
    let nr_refused = results.iter().filter(|(_, ok)| *ok).count();
    std::println!(
        "bad-free kinds refused, no flags: {nr_refused}/{}",
        results.len()
    );
    let missed: Vec<_> = results.iter().filter(|(_, ok)| !ok).collect();
    assert!(missed.is_empty(), "not refused: {missed:?}");
    assert_eq!(results.len(), 18);
}
