//! Memory coming back: the depot's working set after idle intervals
//! (`kmem_update`), and the reap an allocation runs before it fails.

use std::vec::Vec;

use super::support::*;
use crate::{AllocError, InitBox, PAGE_SIZE};

const NR_CPUS_USED: usize = 2;

/// The pattern of the `i`-th object of a burst.
fn word(i: usize) -> impl Fn(usize) -> u64 {
    move |index| ((i as u64) << 32) | index as u64
}

/// Allocate `count` objects of `size` bytes on CPU 0, each written with
/// its pattern.
fn burst(alloc: &'static TestAlloc, count: usize, size: usize) -> Vec<InitBox<TestPlatform>> {
    set_cpu(0);
    (0..count)
        .map(|i| alloc.kmalloc_box(size, 8).unwrap().write_words(word(i)))
        .collect()
}

#[test]
fn working_set_reap_gives_back_a_burst_after_one_idle_interval() {
    // A burst of 200,000 objects (2,000 under Miri); 90 % freed (the older ones, half of
    // them on another CPU); then the periodic tick twice: the first
    // starts the interval, the second finds the depot untouched for a
    // whole interval and gives its magazines, then the empty slabs, back.
    let (alloc, source) = setup(16384);
    alloc.reap_all();
    let baseline = source.pages_outstanding();
    let size = 64;
    let mut objs = burst(alloc, scaled(200_000), size);
    let keep_from = objs.len() * 9 / 10;
    for (i, obj) in objs.drain(..keep_from).enumerate() {
        set_cpu(i % NR_CPUS_USED);
        obj.free().unwrap();
    }
    set_cpu(0);
    let live_bytes = objs.len() * size;
    let held = (source.pages_outstanding() - baseline) * PAGE_SIZE;
    assert!(held > 5 * live_bytes, "the freed objects sit in magazines");
    // The first tick only starts an interval: the depot may be needed.
    alloc.kmem_update();
    let after_first = (source.pages_outstanding() - baseline) * PAGE_SIZE;
    assert!(
        after_first > 5 * live_bytes,
        "no reap within the first interval"
    );
    // One idle interval later, memory beyond the working set comes back.
    let returned = alloc.kmem_update();
    let after = (source.pages_outstanding() - baseline) * PAGE_SIZE;
    std::println!(
        "burst: {} B live, {held} B held after the frees, {after} B after one idle \
         interval ({returned} pages returned)",
        live_bytes
    );
    assert!(returned > 0);
    assert!(
        after * 2 <= live_bytes * 3,
        "{after} B held for {live_bytes} B live"
    );
    // Nothing live was lost.
    for (i, obj) in objs.into_iter().enumerate() {
        let i = keep_from + i;
        assert_eq!(obj.check_words(word(i)), Ok(()), "live object {i} changed");
        obj.free().unwrap();
    }
    alloc.reap_all();
    assert_eq!(source.pages_outstanding(), baseline);
}

#[test]
fn a_steady_load_keeps_its_magazines() {
    let (alloc, _) = setup_default();
    let cache = alloc.stats().kmalloc_cache_for(64, 8).unwrap();
    // Warm up: magazines in the depot. Over three intervals: the first
    // burst's refills leave rounds beyond the load's 2,000 objects (a
    // magazine the load never takes, which the working-set reap returns
    // an interval later) and a small refill magazine (the cache had no
    // free yet) that the next bursts replace with the depot's type.
    for _ in 0..3 {
        alloc.kmem_update();
        for obj in burst(alloc, 2000, 64) {
            obj.free().unwrap();
        }
    }
    let full_before = cache.stats().depot_nr_full;
    assert!(full_before > 0);
    // Every interval the load takes every depot magazine and puts it
    // back: the working set is the whole depot, nothing is reaped.
    for _ in 0..3 {
        alloc.kmem_update();
        for obj in burst(alloc, 2000, 64) {
            obj.free().unwrap();
        }
    }
    alloc.kmem_update();
    assert_eq!(cache.stats().depot_nr_full, full_before);
}

#[test]
#[cfg_attr(
    miri,
    ignore = "fills a 32 MiB arena 64 bytes at a time (500,000 kmallocs); the pressure reap runs under Miri in oom"
)]
fn out_of_memory_reaps_every_cpu_before_failing() {
    // Fill a 32 MiB source with kmalloc(64), free it all (half on another
    // CPU, whose magazines only a cross-CPU drain reaches), then ask for
    // 1 MiB with no explicit reap: the page source is dry, the allocator
    // reaps and retries.
    let (alloc, source) = setup(8192);
    let keep: Vec<_> = burst(alloc, 100, 200);
    let mut objs = Vec::new();
    loop {
        match alloc.kmalloc_box(64, 8) {
            Ok(obj) => objs.push(obj),
            Err(AllocError::OutOfMemory) => break,
            Err(error) => panic!("{error:?}"),
        }
    }
    assert!(objs.len() > 300_000, "{} objects", objs.len());
    // The frees need magazines, which need pages: they may reap already.
    let reaps = alloc.stats().nr_pressure_reaps();
    for (i, obj) in objs.into_iter().enumerate() {
        set_cpu(i % NR_CPUS_USED);
        obj.free().unwrap();
    }
    set_cpu(0);
    let big = alloc
        .kmalloc_box(1 << 20, 8)
        .expect("1 MiB after freeing everything");
    assert!(alloc.stats().nr_pressure_reaps() > reaps);
    let big = big.write_words(word(usize::MAX));
    // A slab-sized request works the same way.
    let k = alloc.kmalloc_box(4000, 8).unwrap();
    // Nothing live was lost.
    for (i, obj) in keep.iter().enumerate() {
        assert_eq!(obj.check_words(word(i)), Ok(()));
    }
    assert_eq!(big.check_words(word(usize::MAX)), Ok(()));
    big.free().unwrap();
    k.free().unwrap();
    for obj in keep {
        obj.free().unwrap();
    }
    // A request no reap can satisfy still fails cleanly.
    assert_eq!(alloc.kmalloc(64 << 20, 8), Err(AllocError::OutOfMemory));
    let _ = source;
}
