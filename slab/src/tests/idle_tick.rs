//! The working-set tick gives slabs back: a cache idle for two whole
//! intervals ends with its CPUs' magazines drained and its empty slabs
//! returned; a cache in use keeps its magazines.

use crate::CacheArgs;
use std::vec::Vec;

use super::support::*;

#[test]
fn a_cache_idle_for_two_intervals_returns_its_empty_slabs() {
    let (alloc, source) = setup_default();
    let cache = alloc
        .cache_create(
            "idle-tick",
            128,
            &CacheArgs {
                align: 8,
                ..CacheArgs::DEFAULT
            },
        )
        .unwrap();
    // A burst on two CPUs, all freed: the objects rest in both CPUs'
    // magazines and in the depot, pinning their slabs.
    for cpu in 0..2 {
        set_cpu(cpu);
        let objs: Vec<_> = (0..500).map(|_| cache.alloc_box().unwrap()).collect();
        for obj in objs {
            obj.free().unwrap();
        }
    }
    set_cpu(0);
    let stats = cache.stats();
    assert!(stats.nr_cpu_cached_objs > 0 && stats.nr_slabs > 0);
    let before = source.pages_outstanding();
    // Tick 1 sees the burst's activity; tick 2 ends the first idle
    // interval (the depot beyond the working set goes back, the CPUs'
    // magazines stay); tick 3 ends the second: everything goes back.
    alloc.kmem_update();
    alloc.kmem_update();
    let stats = cache.stats();
    assert!(
        stats.nr_cpu_cached_objs > 0,
        "one idle interval keeps the CPUs' magazines"
    );
    let after_one = source.pages_outstanding();
    alloc.kmem_update();
    let stats = cache.stats();
    assert_eq!(stats.nr_cpu_cached_objs, 0);
    assert_eq!(stats.nr_depot_objs, 0);
    assert_eq!(
        stats.nr_slabs, 0,
        "idle for two intervals: every empty slab returned"
    );
    std::println!(
        "idle tick: {before} pages outstanding before, {after_one} after one idle interval, {} after two",
        source.pages_outstanding()
    );
    assert!(source.pages_outstanding() < before);
}

#[test]
fn a_cache_used_between_ticks_keeps_its_magazines() {
    let (alloc, _) = setup_default();
    let cache = alloc
        .cache_create(
            "busy-tick",
            128,
            &CacheArgs {
                align: 8,
                ..CacheArgs::DEFAULT
            },
        )
        .unwrap();
    for _ in 0..4 {
        let obj = cache.alloc_box().unwrap();
        obj.free().unwrap();
        alloc.kmem_update();
    }
    assert!(cache.stats().nr_cpu_cached_objs > 0);
    assert!(cache.stats().nr_slabs > 0);
    // Live objects keep their slabs whatever the tick does.
    let live = cache.alloc_box().unwrap();
    for _ in 0..4 {
        alloc.kmem_update();
    }
    assert_eq!(cache.stats().nr_slabs, 1);
    assert_eq!(cache.stats().nr_cpu_cached_objs, 0);
    live.free().unwrap();
}
