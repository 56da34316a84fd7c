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
    // Out-of-range CPU ids are folded, not trusted blindly.
    set_cpu(NR_CPUS + 3);
    let p = cache.alloc().unwrap();
    // SAFETY: allocated above.
    unsafe { cache.free(p) }.unwrap();
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
