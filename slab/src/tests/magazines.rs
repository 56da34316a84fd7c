//! Magazine layer behaviour, observed through statistics.

use core::sync::atomic::Ordering;
use std::vec::Vec;

use super::support::*;
use crate::magazine::{
    DepotInner, MAG_GROW_STEP, MAG_INITIAL_ROUNDS, MAG_RESIZE_INTERVAL, MAG_RESIZE_THRESHOLD,
};
use crate::{CacheFlags, MAG_MAX_ROUNDS};

#[test]
fn freed_object_rests_in_a_magazine() {
    let (alloc, source) = setup_default();
    let cache = alloc
        .cache_create("m", 32, 8, CacheFlags::empty(), None, None, None)
        .unwrap();
    alloc.reap_all();
    let baseline = source.pages_outstanding();
    let p = cache.alloc().unwrap();
    let before = cache.stats();
    assert_eq!(before.nr_allocated, 1);
    assert_eq!(before.nr_slabs, 1);
    // SAFETY: allocated above.
    unsafe { cache.free(p) }.unwrap();
    let after = cache.stats();
    assert_eq!(after.nr_allocated, 0);
    assert_eq!(after.nr_cpu_cached_objs, 1);
    assert_eq!(after.nr_slabs, 1);
    assert_eq!(
        after.nr_active_slabs, 1,
        "the object is still busy in the slab layer"
    );
    // The next alloc on this CPU gets the same object back from the magazine.
    let q = cache.alloc().unwrap();
    assert_eq!(p, q);
    // SAFETY: allocated above.
    unsafe { cache.free(q) }.unwrap();
    let pages = cache.reap();
    assert!(pages >= 1);
    let reaped = cache.stats();
    assert_eq!(
        (
            reaped.nr_slabs,
            reaped.nr_cpu_cached_objs,
            reaped.nr_depot_objs
        ),
        (0, 0, 0)
    );
    alloc.reap_all();
    assert_eq!(source.pages_outstanding(), baseline);
}

#[test]
fn depot_exchanges_full_and_empty_magazines() {
    let (alloc, source) = setup_default();
    let cache = alloc
        .cache_create("depot", 64, 8, CacheFlags::empty(), None, None, None)
        .unwrap();
    alloc.reap_all();
    let baseline = source.pages_outstanding();
    let magsize = cache.stats().magsize;
    assert_eq!(magsize, MAG_INITIAL_ROUNDS);
    let n = 5 * magsize;
    set_cpu(0);
    let objs: Vec<_> = (0..n).map(|_| cache.alloc().unwrap()).collect();
    for &p in &objs {
        // SAFETY: allocated above.
        unsafe { cache.free(p) }.unwrap();
    }
    let st = cache.stats();
    // loaded + prev hold at most 2 magazines; the rest went to the depot full.
    assert!(st.nr_cpu_cached_objs <= 2 * magsize);
    assert_eq!(st.nr_cpu_cached_objs + st.nr_depot_objs, n);
    assert!(st.depot_nr_full >= 3, "{st:?}");
    let slabs = st.nr_slabs;

    // CPU 1 has empty per-CPU magazines: it takes full ones from the depot.
    set_cpu(1);
    let again: Vec<_> = (0..3 * magsize).map(|_| cache.alloc().unwrap()).collect();
    let st = cache.stats();
    assert_eq!(
        st.nr_slabs, slabs,
        "served from the depot, not the slab layer"
    );
    assert_eq!(st.nr_allocated, 3 * magsize);
    assert!(
        st.depot_nr_empty >= 1,
        "CPU 1 returned empty magazines: {st:?}"
    );
    for &p in &again {
        // SAFETY: allocated above.
        unsafe { cache.free(p) }.unwrap();
    }
    set_cpu(0);
    assert_eq!(cache.stats().nr_allocated, 0);
    alloc.reap_all();
    assert_eq!(source.pages_outstanding(), baseline);
}

#[test]
fn cross_cpu_free() {
    let (alloc, source) = setup_default();
    let cache = alloc
        .cache_create("x", 200, 8, CacheFlags::AUDIT, None, None, None)
        .unwrap();
    alloc.reap_all();
    let baseline = source.pages_outstanding();
    set_cpu(0);
    let objs: Vec<_> = (0..100)
        .map(|i| {
            let p = cache.alloc().unwrap();
            fill(p, 200, i);
            p
        })
        .collect();
    set_cpu(1);
    for (i, &p) in objs.iter().enumerate() {
        assert!(check(p, 200, i as u8));
        // SAFETY: allocated above on CPU 0.
        unsafe { cache.free(p) }.unwrap();
    }
    let st = cache.stats();
    assert_eq!(st.nr_allocated, 0);
    assert_eq!(st.nr_allocs_ever, 100);
    assert_eq!(st.nr_frees_ever, 100);
    set_cpu(0);
    alloc.reap_all();
    assert_eq!(source.pages_outstanding(), baseline);
}

#[test]
fn magazine_size_grows_with_contention() {
    let mut depot = crate::magazine::Depot::new(MAG_INITIAL_ROUNDS)
        .inner
        .into_inner();
    let grow = |depot: &mut DepotInner, contention: &mut u64, contended: bool| {
        for _ in 0..MAG_RESIZE_INTERVAL {
            if contended {
                *contention += 1;
            }
            depot.note_visit(*contention);
        }
    };
    let mut contention = 0;
    grow(&mut depot, &mut contention, false);
    assert_eq!(depot.magsize, MAG_INITIAL_ROUNDS);
    grow(&mut depot, &mut contention, true);
    assert_eq!(depot.magsize, MAG_INITIAL_ROUNDS + MAG_GROW_STEP);
    assert!(MAG_RESIZE_INTERVAL as u64 >= MAG_RESIZE_THRESHOLD);
    for _ in 0..100 {
        grow(&mut depot, &mut contention, true);
    }
    assert_eq!(depot.magsize, MAG_MAX_ROUNDS);
}

#[test]
fn contended_depot_lock_is_counted() {
    let (alloc, _) = setup_default();
    let cache = alloc
        .cache_create("contend", 64, 8, CacheFlags::empty(), None, None, None)
        .unwrap();
    let guard = cache.depot.inner.lock();
    std::thread::scope(|scope| {
        let t = scope.spawn(|| {
            set_cpu(2);
            // Loaded and prev are empty: this alloc visits the depot.
            let p = cache.alloc().unwrap();
            // SAFETY: allocated above.
            unsafe { cache.free(p) }.unwrap();
        });
        while cache.depot.nr_contention.load(Ordering::Relaxed) == 0 {
            std::thread::yield_now();
        }
        drop(guard);
        t.join().unwrap();
    });
    assert_eq!(cache.stats().depot_contention, 1);
}

#[test]
fn live_cache_adopts_a_grown_magazine_size() {
    let (alloc, _) = setup_default();
    let cache = alloc
        .cache_create("grow", 64, 8, CacheFlags::empty(), None, None, None)
        .unwrap();
    assert_eq!(cache.stats().magsize, MAG_INITIAL_ROUNDS);
    // Pretend the depot lock was contended often in this interval.
    cache
        .depot
        .nr_contention
        .fetch_add(MAG_RESIZE_THRESHOLD, Ordering::Relaxed);
    // Every alloc+free+reap cycle visits the depot at least once.
    for _ in 0..MAG_RESIZE_INTERVAL {
        let p = cache.alloc().unwrap();
        // SAFETY: allocated above.
        unsafe { cache.free(p) }.unwrap();
        cache.reap();
    }
    let magsize = cache.stats().magsize;
    assert_eq!(magsize, MAG_INITIAL_ROUNDS + MAG_GROW_STEP);
    // The per-CPU cache now holds magsize rounds per magazine.
    let objs: Vec<_> = (0..magsize).map(|_| cache.alloc().unwrap()).collect();
    for &p in &objs {
        // SAFETY: allocated above.
        unsafe { cache.free(p) }.unwrap();
    }
    let st = cache.stats();
    assert_eq!(st.nr_cpu_cached_objs, magsize, "{st:?}");
}

#[test]
fn cpu_stats_count_each_cpus_magazine_hits() {
    let (alloc, _) = setup_default();
    let cache = alloc
        .cache_create("per-cpu", 64, 8, CacheFlags::empty(), None, None, None)
        .unwrap();
    // Warm up: CPU 0 and CPU 1 each get a magazine (a first alloc on an
    // empty per-CPU cache misses to the slab layer and is not a hit).
    for cpu in [0, 1] {
        set_cpu(cpu);
        let p = cache.alloc().unwrap();
        // SAFETY: allocated above.
        unsafe { cache.free(p) }.unwrap();
    }
    set_cpu(0);
    let before: Vec<_> = (0..NR_CPUS).map(|cpu| cache.cpu_stats(cpu)).collect();
    let all_before: Vec<_> = (0..NR_CPUS).map(|cpu| alloc.cpu_stats(cpu)).collect();
    assert_eq!(before[0].nr_rounds_loaded, 1);

    // Allocated on CPU 0 (a hit in its loaded magazine), freed on CPU 1.
    let p = cache.alloc().unwrap();
    set_cpu(1);
    // SAFETY: allocated above.
    unsafe { cache.free(p) }.unwrap();
    set_cpu(0);

    let after: Vec<_> = (0..NR_CPUS).map(|cpu| cache.cpu_stats(cpu)).collect();
    assert_eq!(after[0].nr_allocs, before[0].nr_allocs + 1);
    assert_eq!(after[0].nr_frees, before[0].nr_frees);
    assert_eq!(after[0].nr_rounds_loaded + after[0].nr_rounds_prev, 0);
    assert_eq!(after[1].nr_allocs, before[1].nr_allocs);
    assert_eq!(after[1].nr_frees, before[1].nr_frees + 1);
    assert_eq!(after[1].nr_rounds_loaded + after[1].nr_rounds_prev, 2);
    for cpu in 2..NR_CPUS {
        assert_eq!(after[cpu], before[cpu]);
    }
    // The allocator-wide figure moved by exactly the same (every other
    // cache was idle; bootstrap caches have no magazines).
    for cpu in 0..NR_CPUS {
        let all = alloc.cpu_stats(cpu);
        assert_eq!(
            all.nr_allocs - all_before[cpu].nr_allocs,
            after[cpu].nr_allocs - before[cpu].nr_allocs
        );
        assert_eq!(
            all.nr_frees - all_before[cpu].nr_frees,
            after[cpu].nr_frees - before[cpu].nr_frees
        );
    }
    // Per-CPU figures add up to the cache's.
    let st = cache.stats();
    let cached: usize = after
        .iter()
        .map(|cpu| cpu.nr_rounds_loaded + cpu.nr_rounds_prev)
        .sum();
    assert_eq!(st.nr_cpu_cached_objs, cached);
    let hits: u64 = after.iter().map(|cpu| cpu.nr_allocs).sum();
    assert_eq!(hits, 1, "the warm-up allocations missed");
    // Out of range, and caches without magazines: all zero.
    assert_eq!(cache.cpu_stats(NR_CPUS), crate::CpuCacheStats::default());
    assert_eq!(alloc.cpu_stats(NR_CPUS), crate::CpuCacheStats::default());
    alloc.for_each_cache(|cache| {
        if cache.is_bootstrap() {
            assert_eq!(cache.cpu_stats(0), crate::CpuCacheStats::default());
        }
    });
}

/// Everything the magazine-hit paths read sits in the cache's first cache
/// lines, and nothing written after creation shares a line with it.
#[test]
fn hot_fields_first() {
    use core::mem::offset_of;
    type Cache = crate::KmemCache<TestPlatform>;
    let depot = offset_of!(Cache, depot);
    assert!(core::mem::align_of::<Cache>() >= 64);
    assert_eq!(depot % 64, 0);
    for (name, offset) in [
        ("hot_flags", offset_of!(Cache, hot_flags)),
        ("on_primary", offset_of!(Cache, on_primary)),
        ("kind", offset_of!(Cache, kind)),
        ("pcpu", offset_of!(Cache, pcpu)),
        ("last_cpu", offset_of!(Cache, last_cpu)),
        ("stride_magic", offset_of!(Cache, stride_magic)),
        ("nr_objs_per_slab", offset_of!(Cache, nr_objs_per_slab)),
        ("page_map", offset_of!(Cache, page_map)),
    ] {
        let size = if name == "page_map" { 24 } else { 1 };
        assert!(offset + size <= 64, "{name} at {offset}");
    }
    for offset in [
        offset_of!(Cache, stride),
        offset_of!(Cache, obj_size),
        offset_of!(Cache, ctor),
        offset_of!(Cache, owner),
        offset_of!(Cache, source),
    ] {
        assert!(offset < depot);
    }
    for offset in [
        offset_of!(Cache, slab),
        offset_of!(Cache, nr_allocs_direct),
        offset_of!(Cache, nr_frees_direct),
        offset_of!(Cache, trace),
        offset_of!(Cache, nr_trace_dropped),
        offset_of!(Cache, links),
    ] {
        assert!(offset > depot);
    }
}
