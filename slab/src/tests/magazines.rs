//! Magazine layer behaviour, observed through statistics.

use crate::CacheArgs;
use core::sync::atomic::Ordering;
use std::vec::Vec;

use super::support::*;
use crate::magazine::{
    DepotInner, MAG_GROW_MAX_BYTES, MAG_HANDOFF_THRESHOLD, MAG_RESIZE_INTERVAL,
    MAG_RESIZE_THRESHOLD, MAG_START_BYTES, NR_MAG_TYPES, REFILL_MAX_MAGTYPE, magazine_bytes,
    max_magtype, start_magtype,
};
use crate::{CacheFlags, KmemCache, MAG_MAX_ROUNDS, MAGAZINE_ROUNDS, PAGE_SIZE};

#[test]
fn freed_object_rests_in_a_magazine() {
    let (alloc, source) = setup_default();
    let cache = alloc
        .cache_create(
            "m",
            32,
            &CacheArgs {
                align: 8,
                ..CacheArgs::DEFAULT
            },
        )
        .unwrap();
    alloc.reap_all();
    let baseline = source.pages_outstanding();
    let p = cache.alloc_box().unwrap();
    let p_ptr = p.as_ptr();
    let before = cache.stats();
    assert_eq!(before.nr_allocated, 1);
    assert_eq!(before.nr_slabs, 1);
    p.free().unwrap();
    let after = cache.stats();
    assert_eq!(after.nr_allocated, 0);
    assert_eq!(after.nr_cpu_cached_objs, 1);
    assert_eq!(after.nr_slabs, 1);
    assert_eq!(
        after.nr_active_slabs, 1,
        "the object is still busy in the slab layer"
    );
    // The next alloc on this CPU gets the same object back from the magazine.
    let q = cache.alloc_box().unwrap();
    assert_eq!(p_ptr, q.as_ptr());
    q.free().unwrap();
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
        .cache_create(
            "depot",
            64,
            &CacheArgs {
                align: 8,
                ..CacheArgs::DEFAULT
            },
        )
        .unwrap();
    alloc.reap_all();
    let baseline = source.pages_outstanding();
    let magsize = cache.stats().magsize;
    assert_eq!(magsize, MAGAZINE_ROUNDS[start_magtype(64)]);
    let n = 5 * magsize;
    set_cpu(0);
    let objs: Vec<_> = (0..n).map(|_| cache.alloc_box().unwrap()).collect();
    // The misses' refills left rounds in CPU 0's magazines: back to the
    // slabs, so that only the frees below fill magazines.
    cache.reap();
    for p in objs {
        p.free().unwrap();
    }
    let st = cache.stats();
    // loaded + prev hold at most 2 magazines; the rest went to the depot full.
    assert!(st.nr_cpu_cached_objs <= 2 * magsize);
    assert_eq!(st.nr_cpu_cached_objs + st.nr_depot_objs, n);
    assert!(st.depot_nr_full >= 3, "{st:?}");
    let slabs = st.nr_slabs;

    // CPU 1 has empty per-CPU magazines: it takes full ones from the depot.
    set_cpu(1);
    let again: Vec<_> = (0..3 * magsize)
        .map(|_| cache.alloc_box().unwrap())
        .collect();
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
    for p in again {
        p.free().unwrap();
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
        .cache_create(
            "x",
            200,
            &CacheArgs {
                align: 8,
                flags: CacheFlags::AUDIT,
                ..CacheArgs::DEFAULT
            },
        )
        .unwrap();
    alloc.reap_all();
    let baseline = source.pages_outstanding();
    set_cpu(0);
    let objs: Vec<_> = (0..100)
        .map(|i| fill_box(cache.alloc_box().unwrap(), i))
        .collect();
    set_cpu(1);
    for (i, p) in objs.into_iter().enumerate() {
        assert_eq!(p.len(), 200);
        assert!(check_box(&p, i as u8));
        p.free().unwrap();
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
fn magazine_type_grows_with_contention_up_to_its_limit() {
    let stride = 2048;
    let (start, max) = (start_magtype(stride), max_magtype(stride));
    assert!(start < max, "a 2 KiB cache may grow");
    let mut depot =
        crate::magazine::Depot::<crate::tests::support::TestPlatform>::new(start, max, false)
            .inner
            .into_inner();
    // One interval of depot visits, all by one per-CPU cache (no
    // hand-off); true if the type changed at its end.
    let interval = |depot: &mut DepotInner, contention: &mut u64, contended: bool| {
        let mut changed = false;
        for _ in 0..MAG_RESIZE_INTERVAL {
            if contended {
                *contention += 1;
            }
            changed |= depot.note_visit(*contention, 0x1000);
        }
        changed
    };
    let mut contention = 0;
    assert!(!interval(&mut depot, &mut contention, false));
    assert_eq!(depot.magtype, start);
    assert_eq!(depot.nr_resizes, 0);
    assert!(interval(&mut depot, &mut contention, true));
    assert_eq!(depot.magtype, start + 1);
    assert_eq!(depot.nr_resizes, 1);
    assert_eq!(depot.magsize(), MAGAZINE_ROUNDS[start + 1]);
    assert!(MAG_RESIZE_INTERVAL as u64 >= MAG_RESIZE_THRESHOLD);
    for _ in 0..100 {
        interval(&mut depot, &mut contention, true);
    }
    assert_eq!(depot.magtype, max);
    // One resize a step, none once at the limit.
    assert_eq!(usize::from(depot.nr_resizes), max - start);
    assert_eq!(
        max,
        NR_MAG_TYPES - 1,
        "2 KiB objects may reach the largest type"
    );
    assert_eq!(depot.magsize(), MAG_MAX_ROUNDS);
    // An 8 KiB object's cache stops growing where the rounds would hold
    // more than MAG_GROW_MAX_BYTES.
    let big = 8192;
    let mut depot = crate::magazine::Depot::<crate::tests::support::TestPlatform>::new(
        start_magtype(big),
        max_magtype(big),
        false,
    )
    .inner
    .into_inner();
    for _ in 0..100 {
        interval(&mut depot, &mut contention, true);
    }
    assert!(depot.magsize() * big <= MAG_GROW_MAX_BYTES);
    assert!(
        depot.magtype == NR_MAG_TYPES - 1
            || MAGAZINE_ROUNDS[depot.magtype + 1] * big > MAG_GROW_MAX_BYTES
    );
}

/// Visits that alternate between CPUs grow the type with no contention
/// at all; below the threshold they do not.
#[test]
fn magazine_type_grows_when_the_depot_hands_off_between_cpus() {
    let stride = 8192;
    let (start, max) = (start_magtype(stride), max_magtype(stride));
    assert!(start < max, "an 8 KiB cache may grow");
    let mut depot =
        crate::magazine::Depot::<crate::tests::support::TestPlatform>::new(start, max, false)
            .inner
            .into_inner();
    // `handoffs` visits of an interval change CPU, the rest stay.
    let interval = |depot: &mut DepotInner, handoffs: u32| {
        let mut changed = false;
        let mut cpu = 0;
        for visit in 0..MAG_RESIZE_INTERVAL {
            if visit < handoffs {
                cpu ^= 1;
            }
            changed |= depot.note_visit(0, 0x1000 + 64 * cpu);
        }
        changed
    };
    // Starts with a visit by CPU 0 after one by CPU 0: none counted.
    assert!(!interval(&mut depot, 0));
    assert!(!interval(&mut depot, MAG_HANDOFF_THRESHOLD - 1));
    assert_eq!(depot.magtype, start);
    assert!(interval(&mut depot, MAG_HANDOFF_THRESHOLD + 1));
    assert_eq!(depot.magtype, start + 1);
    for _ in 0..10 {
        interval(&mut depot, MAG_RESIZE_INTERVAL);
    }
    assert_eq!(depot.magtype, max);
}

/// A producer on one CPU and a consumer on another trade every object
/// through the depot: its magazines grow (fewer exchanges per object)
/// and nothing is lost; one CPU doing the same alone keeps the starting
/// type.
#[test]
fn producer_and_consumer_cpus_grow_the_magazines() {
    let (alloc, source) = setup(16384);
    alloc.reap_all();
    let baseline = source.pages_outstanding();
    let size = 8192;
    let start = MAGAZINE_ROUNDS[start_magtype(size)];
    let max = MAGAZINE_ROUNDS[max_magtype(size)];
    assert!(start < max);
    let run = |name: &str, consumer: usize| {
        let cache = alloc
            .cache_create(
                name,
                size,
                &CacheArgs {
                    align: 8,
                    ..CacheArgs::DEFAULT
                },
            )
            .unwrap();
        for _ in 0..4 * MAG_RESIZE_INTERVAL as usize {
            set_cpu(0);
            let objs: Vec<_> = (0..2 * start + 1)
                .map(|_| cache.alloc_box().unwrap())
                .collect();
            set_cpu(consumer);
            for p in objs {
                p.free().unwrap();
            }
        }
        set_cpu(0);
        let st = cache.stats();
        assert_eq!(st.nr_allocated, 0, "{name}");
        let magsize = st.magsize;
        // SAFETY: nothing allocated; not used again.
        unsafe { cache.destroy() }.unwrap();
        magsize
    };
    assert_eq!(run("one-cpu", 0), start);
    assert!(run("two-cpus", 1) > start);
    alloc.reap_all();
    assert_eq!(source.pages_outstanding(), baseline);
}

/// The starting rule: the largest magazine whose rounds hold at most
/// MAG_START_BYTES of objects, so magazines stay a small part of what
/// they cache (checked per kmalloc class).
#[test]
fn starting_magazine_follows_the_byte_rule() {
    for &size in crate::KMALLOC_SIZES.iter() {
        let magtype = start_magtype(size);
        let rounds = MAGAZINE_ROUNDS[magtype];
        assert!(rounds * size <= MAG_START_BYTES || magtype == 0, "{size}");
        assert!(
            magtype == NR_MAG_TYPES - 1 || MAGAZINE_ROUNDS[magtype + 1] * size > MAG_START_BYTES,
            "{size}: a larger magazine would fit"
        );
        // Page bytes of magazines per cached object (one-page bootstrap
        // slabs, 128-byte header): at most 8.6 bytes for objects up to
        // 128 B, at most 1/15 of the object above.
        let mags_per_page = (PAGE_SIZE - 128) / magazine_bytes(rounds);
        let per_round = PAGE_SIZE as f64 / (mags_per_page * rounds) as f64;
        if size <= 128 {
            assert!(per_round <= 8.6, "{size}: {per_round}");
        } else {
            assert!(per_round * 15.0 <= size as f64, "{size}: {per_round}");
        }
    }
}

#[test]
fn contended_depot_lock_is_counted() {
    let (alloc, _) = setup_default();
    let cache = alloc
        .cache_create(
            "contend",
            64,
            &CacheArgs {
                align: 8,
                ..CacheArgs::DEFAULT
            },
        )
        .unwrap();
    let guard = cache.depot.inner.lock();
    std::thread::scope(|scope| {
        let t = scope.spawn(|| {
            set_cpu(2);
            // Loaded and prev are empty: this alloc visits the depot.
            cache.alloc_box().unwrap().free().unwrap();
        });
        while cache.depot.nr_contention.load(Ordering::Relaxed) == 0 {
            std::thread::yield_now();
        }
        drop(guard);
        t.join().unwrap();
    });
    assert_eq!(cache.stats().depot_contention, 1);
}

/// Busy objects of each magazine cache (`kmem_magazine_<rounds>`).
fn magazines_in_use(alloc: &TestAlloc) -> [usize; NR_MAG_TYPES] {
    core::array::from_fn(|magtype| alloc.magazine_cache(magtype).stats().nr_allocated)
}

/// Make the depot's contention count look high enough to grow the type
/// at the end of the next interval, and visit it for an interval.
fn grow_once(cache: &'static KmemCache<TestPlatform>) {
    let before = cache.stats().magsize;
    cache
        .depot
        .nr_contention
        .fetch_add(MAG_RESIZE_THRESHOLD, Ordering::Relaxed);
    let mut visits = 0;
    while cache.stats().magsize == before {
        // Two magazines' worth out and back: at least one depot exchange
        // each way.
        let objs: Vec<_> = (0..2 * before + 1)
            .map(|_| cache.alloc_box().unwrap())
            .collect();
        for p in objs {
            p.free().unwrap();
        }
        visits += 1;
        assert!(visits <= MAG_RESIZE_INTERVAL as usize, "never grew");
    }
}

#[test]
fn magazine_of_capacity_n_holds_exactly_n_rounds_then_goes_to_the_depot() {
    let (alloc, _) = setup_default();
    for magtype in 0..NR_MAG_TYPES {
        let cache = alloc
            .cache_create(
                "cap",
                64,
                &CacheArgs {
                    align: 8,
                    ..CacheArgs::DEFAULT
                },
            )
            .unwrap();
        cache.depot.set_magtype(magtype);
        let n = MAGAZINE_ROUNDS[magtype];
        let before = magazines_in_use(alloc);
        set_cpu(0);
        let objs: Vec<_> = (0..2 * n + 1).map(|_| cache.alloc_box().unwrap()).collect();
        // The refills' rounds back to the slabs (and their magazines
        // freed): only the frees below fill magazines.
        cache.reap();
        let mut objs = objs.into_iter();
        for p in objs.by_ref().take(n) {
            p.free().unwrap();
        }
        let cpu = cache.cpu_stats(0);
        assert_eq!((cpu.nr_rounds_loaded, cpu.nr_rounds_prev), (n, 0), "{n}");
        for p in objs.by_ref().take(n) {
            p.free().unwrap();
        }
        let cpu = cache.cpu_stats(0);
        assert_eq!((cpu.nr_rounds_loaded, cpu.nr_rounds_prev), (n, n), "{n}");
        assert_eq!(cache.stats().depot_nr_full, 0);
        // One more: prev (full) goes to the depot, a new empty one is loaded.
        let last = objs.next().unwrap();
        assert!(objs.next().is_none());
        last.free().unwrap();
        let st = cache.stats();
        assert_eq!((st.depot_nr_full, st.nr_depot_objs), (1, n), "{n}");
        let cpu = cache.cpu_stats(0);
        assert_eq!((cpu.nr_rounds_loaded, cpu.nr_rounds_prev), (1, n), "{n}");
        // Three magazines, all of this type.
        let mut expected = before;
        expected[magtype] += 3;
        assert_eq!(magazines_in_use(alloc), expected, "{n}");
        // SAFETY: nothing allocated; not used again.
        unsafe { cache.destroy() }.unwrap();
        assert_eq!(magazines_in_use(alloc), before, "{n}: magazines freed");
    }
}

/// Freeing many small objects costs at most the magazine pages the
/// starting rule promises per cached object (was 64 bytes per object: a
/// 512-byte magazine per 8 rounds).
#[test]
fn magazines_cost_a_few_bytes_per_cached_object() {
    let (alloc, _) = setup(16384);
    for size in [8, 64, 128, 256, 512, 1024, 4096] {
        alloc.reap_all();
        let before = alloc.stats().metadata().magazine_total();
        let k = alloc.find_cache(&std::format!("kmalloc-{size}")).unwrap();
        let n = 20_000.min((32 << 20) / size);
        let objs: Vec<_> = (0..n)
            .map(|_| alloc.kmalloc_box(size, 8).unwrap())
            .collect();
        // The refills' rounds back to the slabs: only the frees below
        // fill magazines.
        alloc.reap_all();
        for p in objs {
            p.free().unwrap();
        }
        let st = k.stats();
        assert_eq!(
            st.nr_cpu_cached_objs + st.nr_depot_objs,
            n,
            "{size}: all cached"
        );
        let bytes = alloc.stats().metadata().magazine_total() - before;
        let per_obj = bytes as f64 / n as f64;
        // The bound of starting_magazine_follows_the_byte_rule, plus one
        // partly used page per magazine cache.
        let bound =
            if size <= 128 { 8.6 } else { size as f64 / 15.0 } + PAGE_SIZE as f64 / n as f64;
        assert!(
            per_obj <= bound,
            "kmalloc-{size}: {per_obj:.2} B per cached object > {bound:.2}"
        );
        std::eprintln!("kmalloc-{size}: {per_obj:.2} B of magazines per cached object");
        alloc.reap_all();
        assert_eq!(alloc.stats().metadata().magazine_total(), before, "{size}");
    }
}

#[test]
fn growing_the_magazine_type_switches_magazines_and_loses_nothing() {
    let (alloc, source) = setup_default();
    let baseline = source.pages_outstanding();
    let before = magazines_in_use(alloc);
    let cache = alloc
        .cache_create(
            "grow",
            64,
            &CacheArgs {
                align: 8,
                ..CacheArgs::DEFAULT
            },
        )
        .unwrap();
    // Start small so growth is quick to see.
    cache.depot.set_magtype(1);
    set_cpu(0);
    // CPU 1 caches 2 magazines' worth plus one in the depot, of type 1.
    set_cpu(1);
    let small = MAGAZINE_ROUNDS[1];
    let kept: Vec<_> = (0..2 * small + 1)
        .map(|_| cache.alloc_box().unwrap())
        .collect();
    for p in kept {
        p.free().unwrap();
    }
    set_cpu(0);
    grow_once(cache);
    let big = MAGAZINE_ROUNDS[2];
    assert_eq!(cache.stats().magsize, big);
    // CPU 0 frees into new magazines of the new type.
    let objs: Vec<_> = (0..4 * big).map(|_| cache.alloc_box().unwrap()).collect();
    for p in objs {
        p.free().unwrap();
    }
    let in_use = magazines_in_use(alloc);
    assert!(
        in_use[2] > before[2],
        "magazines of the new type: {in_use:?}"
    );
    // Nothing lost: every object freed is a round, each once.
    let mut rounds = std::collections::HashSet::new();
    cache.for_each_round(|round| assert!(rounds.insert(round as usize)));
    let st = cache.stats();
    assert_eq!(st.nr_allocated, 0);
    assert_eq!(rounds.len(), st.nr_cpu_cached_objs + st.nr_depot_objs);
    assert_eq!(cache.slab.lock().counts().nr_busy_objs, rounds.len());
    // CPU 1 empties its two old magazines and takes full ones from the
    // depot: the old ones come back empty and are freed, not kept (the
    // depot keeps empty magazines of the new type only).
    set_cpu(1);
    let old_in_use = magazines_in_use(alloc)[1];
    let again: Vec<_> = (0..3 * small + 1)
        .map(|_| cache.alloc_box().unwrap())
        .collect();
    assert!(
        magazines_in_use(alloc)[1] < old_in_use,
        "an old magazine freed"
    );
    let depot = cache.depot.lock();
    for (capacity, nr_rounds) in depot.magazine_shapes() {
        assert!(
            nr_rounds > 0 || capacity == big,
            "an old empty magazine kept"
        );
    }
    drop(depot);
    alloc.reap_all();
    let in_use = magazines_in_use(alloc);
    assert_eq!(in_use, before, "every magazine freed by the reap");
    for p in again {
        p.free().unwrap();
    }
    set_cpu(0);
    // SAFETY: nothing allocated; not used again.
    unsafe { cache.destroy() }.unwrap();
    alloc.reap_all();
    assert_eq!(source.pages_outstanding(), baseline);
    assert_eq!(magazines_in_use(alloc), before);
}

/// Reap and destroy with magazines of several types on several CPUs and
/// in the depot give every object back to its slab and every magazine to
/// its cache.
#[test]
fn reap_and_destroy_with_mixed_magazine_types_return_everything() {
    let (alloc, source) = setup_default();
    let before_pages = source.pages_outstanding();
    let before = magazines_in_use(alloc);
    let cache = alloc
        .cache_create(
            "mixed-mags",
            96,
            &CacheArgs {
                align: 8,
                ..CacheArgs::DEFAULT
            },
        )
        .unwrap();
    let mut held = Vec::new();
    for (cpu, magtype) in [(0, 0), (1, 2), (2, 4), (3, 5)] {
        cache.depot.set_magtype(magtype);
        set_cpu(cpu);
        let n = 3 * MAGAZINE_ROUNDS[magtype] + 1;
        let mut objs = (0..n)
            .map(|_| cache.alloc_box().unwrap())
            .collect::<Vec<_>>()
            .into_iter();
        // Keep one per CPU allocated until after the reap.
        held.push((cpu, objs.next().unwrap()));
        for p in objs {
            p.free().unwrap();
        }
    }
    let in_use = magazines_in_use(alloc);
    assert!(
        (0..NR_MAG_TYPES).filter(|&t| in_use[t] > before[t]).count() >= 3,
        "several magazine types in use: {in_use:?}"
    );
    set_cpu(0);
    cache.reap();
    let st = cache.stats();
    assert_eq!((st.nr_cpu_cached_objs, st.nr_depot_objs), (0, 0), "{st:?}");
    assert_eq!((st.depot_nr_full, st.depot_nr_empty), (0, 0), "{st:?}");
    assert_eq!(st.nr_allocated, held.len());
    assert_eq!(cache.slab.lock().counts().nr_busy_objs, held.len());
    assert_eq!(magazines_in_use(alloc), before, "every magazine back");
    // Refill magazines of several types again, then destroy.
    for (cpu, p) in held {
        set_cpu(cpu);
        p.free().unwrap();
    }
    set_cpu(0);
    // SAFETY: nothing allocated; not used again.
    unsafe { cache.destroy() }.unwrap();
    assert_eq!(magazines_in_use(alloc), before);
    alloc.reap_all();
    assert_eq!(source.pages_outstanding(), before_pages);
}

#[test]
fn cpu_stats_count_each_cpus_magazine_hits() {
    let (alloc, _) = setup_default();
    let cache = alloc
        .cache_create(
            "per-cpu",
            64,
            &CacheArgs {
                align: 8,
                ..CacheArgs::DEFAULT
            },
        )
        .unwrap();
    // Warm up: CPU 0 and CPU 1 each get a magazine (a first alloc on an
    // empty per-CPU cache misses to the slab layer and is not a hit).
    for cpu in [0, 1] {
        set_cpu(cpu);
        cache.alloc_box().unwrap().free().unwrap();
    }
    set_cpu(0);
    let before: Vec<_> = (0..NR_CPUS).map(|cpu| cache.cpu_stats(cpu)).collect();
    let all_before: Vec<_> = (0..NR_CPUS).map(|cpu| alloc.stats().cpu(cpu)).collect();
    assert_eq!(before[0].nr_rounds_loaded, 1);

    // Allocated on CPU 0 (a hit in its loaded magazine), freed on CPU 1.
    let p = cache.alloc_box().unwrap();
    set_cpu(1);
    p.free().unwrap();
    set_cpu(0);

    let after: Vec<_> = (0..NR_CPUS).map(|cpu| cache.cpu_stats(cpu)).collect();
    assert_eq!(after[0].nr_allocs, before[0].nr_allocs + 1);
    assert_eq!(after[0].nr_frees, before[0].nr_frees);
    assert_eq!(after[0].nr_rounds_loaded + after[0].nr_rounds_prev, 0);
    assert_eq!(after[1].nr_allocs, before[1].nr_allocs);
    assert_eq!(after[1].nr_frees, before[1].nr_frees + 1);
    // One round more on CPU 1 (its warm-up's refill may have left some).
    assert_eq!(
        after[1].nr_rounds_loaded + after[1].nr_rounds_prev,
        before[1].nr_rounds_loaded + before[1].nr_rounds_prev + 1
    );
    for cpu in 2..NR_CPUS {
        assert_eq!(after[cpu], before[cpu]);
    }
    // The allocator-wide figure moved by exactly the same (every other
    // cache was idle; bootstrap caches have no magazines).
    for cpu in 0..NR_CPUS {
        let all = alloc.stats().cpu(cpu);
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
    assert_eq!(alloc.stats().cpu(NR_CPUS), crate::CpuCacheStats::default());
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
    // One copy of the slab layer's parameters (`params`), not a second one
    // in the slab layer: the cache stays at 15 cache lines, and every
    // kmalloc and bootstrap cache with it.
    assert!(
        core::mem::size_of::<Cache>() <= 15 * 64,
        "{}",
        core::mem::size_of::<Cache>()
    );
    for (name, offset) in [
        ("hot_flags", offset_of!(Cache, hot_flags)),
        ("on_primary", offset_of!(Cache, on_primary)),
        ("kind", offset_of!(Cache, kind)),
        ("last_cpu", offset_of!(Cache, last_cpu)),
        ("stride_magic", offset_of!(Cache, stride_magic)),
        (
            "nr_objs_per_slab",
            offset_of!(Cache, params.nr_objs_per_slab),
        ),
        ("page_map", offset_of!(Cache, params.page_map)),
    ] {
        let size = if name == "page_map" { 24 } else { 1 };
        assert!(offset + size <= 64, "{name} at {offset}");
    }
    for offset in [
        offset_of!(Cache, params.stride),
        offset_of!(Cache, params.obj_size),
        offset_of!(Cache, params.ctor),
        offset_of!(Cache, owner),
        offset_of!(Cache, params.source),
    ] {
        assert!(offset < depot);
    }
    for offset in [
        offset_of!(Cache, slab),
        offset_of!(Cache, nr_allocs_direct),
        offset_of!(Cache, nr_frees_direct),
        offset_of!(Cache, trace),
        offset_of!(Cache, links),
    ] {
        assert!(offset > depot);
    }
}

/// Real contention on the depot lock (Bonwick & Adams 2001 §3.7): the
/// test holds a cache's depot lock while a thread on CPU 1 needs the
/// depot, until that thread's failed `try_lock` is counted; again and
/// again, from one CPU only (no hand-off). The magazine size grows, and
/// `CacheStats::nr_magazine_resizes`, `slabtop`'s RESIZE column and its
/// CONTEND column say so.
#[test]
fn a_contended_depot_lock_grows_the_magazines_and_counts_each_resize() {
    use crate::reports::{EMPTY_SLABTOP_ROW, SlabtopSort, slabtop};

    let (alloc, _) = setup(16384);
    let size = 2048;
    let cache = alloc
        .cache_create(
            "contended",
            size,
            &CacheArgs {
                align: 8,
                ..CacheArgs::DEFAULT
            },
        )
        .unwrap();
    let before = cache.stats();
    assert_eq!(before.nr_magazine_resizes, 0);
    assert_eq!(before.magsize, MAGAZINE_ROUNDS[start_magtype(size)]);
    let mut nr_rounds = 0;
    while cache.stats().nr_magazine_resizes == 0 {
        nr_rounds += 1;
        assert!(nr_rounds <= 200, "no resize after 200 contended visits");
        let contention = cache.depot.nr_contention.load(Ordering::Relaxed);
        let held = cache.depot.inner.lock();
        let worker = std::thread::spawn(move || {
            set_cpu(1);
            // Enough to miss the magazines both ways: the depot is visited.
            let nr_objs = 2 * MAGAZINE_ROUNDS[NR_MAG_TYPES - 1] + 1;
            let objs: Vec<_> = (0..nr_objs).map(|_| cache.alloc_box().unwrap()).collect();
            for obj in objs {
                obj.free().unwrap();
            }
        });
        while cache.depot.nr_contention.load(Ordering::Relaxed) == contention {
            std::thread::yield_now();
        }
        drop(held);
        worker.join().unwrap();
    }
    let after = cache.stats();
    assert_eq!(after.nr_magazine_resizes, 1, "{after:?}");
    assert!(after.magsize > before.magsize, "{after:?}");
    assert!(after.depot_contention >= MAG_RESIZE_THRESHOLD, "{after:?}");

    let mut rows = [EMPTY_SLABTOP_ROW; 256];
    let mut text = std::string::String::new();
    slabtop(&mut text, alloc, &mut rows, None, SlabtopSort::Name).unwrap();
    let row = text
        .lines()
        .find(|line| line.contains(" contended "))
        .unwrap_or_else(|| panic!("{text}"));
    let fields: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(fields[7], "contended", "{row}");
    assert_eq!(fields[8], std::format!("{}", after.magsize), "{row}");
    assert_eq!(
        fields[11],
        std::format!("{}", after.depot_contention),
        "{row}"
    );
    assert_eq!(fields[12], "1", "RESIZE: {row}");
}

/// A free that misses while this CPU's per-CPU cache is held (an
/// interrupt handler that interrupted a magazine hit) goes straight to the
/// slab layer: it makes no magazine for the depot (it made up to 3, none
/// of them usable by it), and its checks still refuse a double free.
#[test]
fn a_free_under_a_held_per_cpu_cache_goes_straight_to_the_slab_layer() {
    let (alloc, _) = setup_default();
    let cache = alloc
        .cache_create(
            "held-miss",
            64,
            &CacheArgs {
                align: 8,
                ..CacheArgs::DEFAULT
            },
        )
        .unwrap();
    let objs: Vec<_> = (0..4).map(|_| cache.alloc_box().unwrap()).collect();
    cache.reap();
    let before = cache.stats();
    assert_eq!(before.depot_nr_empty, 0, "{before:?}");
    {
        // The interrupted hit: this CPU's per-CPU cache held.
        let irq = crate::IrqGuard::<TestPlatform>::new();
        let _hit = cache.pcpu_lock_here(&irq).expect("per-CPU cache free");
        let mut objs = objs.into_iter();
        let first = objs.next().unwrap();
        let addr = first.as_ptr();
        first.free().unwrap();
        // SAFETY: freed just above: a double free, refused untouched.
        let again = unsafe { cache.free(addr.cast()) };
        assert!(
            matches!(again, Err(crate::FreeError::DoubleFree { .. })),
            "{again:?}"
        );
        for obj in objs {
            obj.free().unwrap();
        }
    }
    let after = cache.stats();
    assert_eq!(after.depot_nr_empty, 0, "no magazine made: {after:?}");
    assert_eq!(after.nr_allocated, 0, "{after:?}");
    assert_eq!(after.nr_cpu_cached_objs, 0, "{after:?}");
    assert_eq!(cache.slab.lock().counts().nr_busy_objs, 0);
}

/// The per-CPU in-use flag's take (`crate::sync::take_flag`, on x86-64
/// one `sub byte ptr [base + index + FLAG], 1` and a branch on its
/// borrow): a free flag (0) is taken and left non-zero; a held one is
/// refused and left exactly as it was, however often it is tried (an
/// interrupt handler that finds its CPU's hit in progress must not change
/// what the hit gives back); and it addresses the byte at base + index +
/// FLAG, no other.
#[test]
fn in_use_flag_take() {
    use core::sync::atomic::AtomicU8;

    let bytes: [AtomicU8; 16] = core::array::from_fn(|_| AtomicU8::new(0));
    let base = bytes[0].as_ptr().cast_const();
    // The flag at 3 + 5 = byte 8.
    // SAFETY: byte 8 of `bytes`, alive for the calls.
    let take = || unsafe { crate::sync::take_flag::<TestPlatform, 5>(base, 3) };
    assert!(take(), "a free flag is taken");
    let held = bytes[8].load(Ordering::Relaxed);
    assert_ne!(held, 0, "a taken flag reads as held");
    for _ in 0..300 {
        assert!(!take(), "a held flag is refused");
        assert_eq!(
            bytes[8].load(Ordering::Relaxed),
            held,
            "a refused take changes nothing"
        );
    }
    bytes[8].store(0, Ordering::Relaxed);
    assert!(take(), "a flag given back is taken again");
    for (i, byte) in bytes.iter().enumerate() {
        if i != 8 {
            assert_eq!(byte.load(Ordering::Relaxed), 0, "byte {i} untouched");
        }
    }
}

/// The restartable hits' sequences (`crate::restart`, which the kernel's
/// hits run; `tests/restartable_hit.rs` interrupts them in QEMU) on a
/// per-CPU line of our own: the alloc pops rounds LIFO, counts each and
/// changes nothing on an empty magazine; the free pushes while there is
/// room, writes the key into the object and refuses (changing nothing) a
/// full magazine or an object holding the key. And their ranges table:
/// every range this test instantiates is listed, and `restart_ip` sends
/// every address inside a range, and no other, to its start.
#[cfg(all(
    feature = "nightly",
    target_arch = "x86_64",
    target_os = "linux",
    not(miri)
))]
#[test]
fn restartable_sequences_and_their_ranges() {
    use core::ptr::NonNull;

    // A per-CPU line 64 bytes after `base` (where a cache's array follows
    // its struct: the sequences' `ArrayAt`): top at 8, limit at 16, key at
    // 24, nr_allocs at 32 in the line.
    const AT: usize = 64;
    struct Line;
    impl crate::restart::ArrayAt for Line {
        const AT: usize = AT;
        const TOP: usize = TOP;
        const LIMIT: usize = LIMIT;
        const NR_ALLOCS: usize = NR;
        const FREE_KEY: usize = KEY;
    }
    const TOP: usize = 8;
    const LIMIT: usize = 16;
    const KEY: usize = 24;
    const NR: usize = 32;
    const KEY_VALUE: usize = 0x8000_0000_0000_0001;
    // A magazine of 4 rounds after its null `next`.
    let mut magazine = [0usize; 5];
    let slots = magazine.as_mut_ptr().wrapping_add(1);
    let mut line = [0usize; 16];
    line[(AT + TOP) / 8] = slots as usize;
    line[(AT + LIMIT) / 8] = slots.wrapping_add(4) as usize;
    line[(AT + KEY) / 8] = KEY_VALUE;
    let base = line.as_mut_ptr().cast::<u8>().cast_const();
    let mut objects = [[0usize; 2]; 6];
    let object =
        |objects: &mut [[usize; 2]; 6], i: usize| NonNull::from(&mut objects[i]).cast::<u8>();
    // The line is a different CPU's at offset 0: the sequences add `offset`.
    // SAFETY: `base + AT + 0` is our line, its `top` at or above slot 0 of the
    // magazine with the null `next` below; nothing else runs.
    let pop = || unsafe { crate::restart::pop::<Line, true>(base, 0) };
    let push = |obj: NonNull<u8>| {
        // SAFETY: as above; `obj` is one of ours, 16 bytes, given up.
        unsafe { crate::restart::push::<Line>(base, 0, obj) }
    };
    assert_eq!(pop(), None, "empty: nothing popped");
    assert_eq!(line[(AT + NR) / 8], 0, "and nothing counted");
    for i in 0..4 {
        let obj = object(&mut objects, i);
        assert!(push(obj), "room for {i}");
        assert_eq!(objects[i][0], KEY_VALUE, "the key written into object {i}");
    }
    assert_eq!(
        magazine[1..],
        [0, 1, 2, 3].map(|i| object(&mut objects, i).as_ptr() as usize)
    );
    let full = object(&mut objects, 4);
    assert!(!push(full), "full");
    assert_eq!(objects[4][0], 0, "a refused push writes no key");
    assert_eq!(line[(AT + TOP) / 8], slots.wrapping_add(4) as usize);
    // Pop one (its key cleared), then push an object that already holds
    // the key.
    assert_eq!(pop(), Some(object(&mut objects, 3)), "LIFO");
    assert_eq!(objects[3][0], 0, "the popped round's key cleared");
    objects[5][0] = KEY_VALUE;
    let keyed = object(&mut objects, 5);
    assert!(!push(keyed), "holds the key");
    assert_eq!(
        line[(AT + TOP) / 8],
        slots.wrapping_add(3) as usize,
        "refused: top unchanged"
    );
    // A round whose key was written over after its free stays (the
    // miss reports it); a keyless cache's pop does not look.
    objects[2][0] = 0x4141;
    assert_eq!(pop(), None, "a round without its key is not popped");
    assert_eq!(line[(AT + TOP) / 8], slots.wrapping_add(3) as usize);
    assert_eq!(objects[2][0], 0x4141, "nothing written");
    // SAFETY: as for `pop`.
    let keyless = unsafe { crate::restart::pop::<Line, false>(base, 0) };
    assert_eq!(keyless, Some(object(&mut objects, 2)));
    assert_eq!(objects[2][0], 0x4141, "a keyless pop writes nothing");
    for i in (0..2).rev() {
        assert_eq!(pop(), Some(object(&mut objects, i)), "LIFO");
    }
    assert_eq!(pop(), None, "empty again");
    assert_eq!(line[(AT + NR) / 8], 4, "four pops counted");

    // The ranges: the anchor and at least this test's two sequences.
    let ranges: Vec<(usize, usize)> = crate::restart::ranges().collect();
    assert_eq!(ranges.len(), crate::restart::ranges().count());
    let real: Vec<_> = ranges.iter().filter(|(start, end)| end > start).collect();
    assert!(real.len() >= 2, "ranges {ranges:x?}");
    for &&(start, end) in &real {
        assert!(
            end - start < 64,
            "a sequence is a few instructions: {start:#x}..{end:#x}"
        );
        assert_eq!(crate::restart::restart_ip(start), Some(start));
        assert_eq!(crate::restart::restart_ip(end - 1), Some(start));
        if !real.iter().any(|&&(s, e)| (s..e).contains(&end)) {
            assert_eq!(
                crate::restart::restart_ip(end),
                None,
                "after the commit: no restart"
            );
        }
    }
    let outside = restartable_sequences_and_their_ranges as fn() as usize;
    assert_eq!(
        crate::restart::restart_ip(outside),
        None,
        "a function's entry"
    );
    assert_eq!(crate::restart::restart_ip(0), None);
}

/// A cache only allocated from (a cold partitioned copy, the shell's
/// caches) gets one 14-round magazine on its second trip to the slab
/// layer, smaller than the depot's type, and keeps it as its batches
/// double: few trips down, one magazine made, none freed. Before, the
/// magazine grew 1, 3, 6, 14 rounds, each step made and freed one;
/// before that a refill made no magazine, and every allocation was a
/// trip.
#[test]
fn a_cache_only_allocated_from_gets_one_refill_magazine() {
    let (alloc, _) = setup_default();
    let cache = alloc.cache_create("cold", 64, &CacheArgs::DEFAULT).unwrap();
    let before = magazines_in_use(alloc);
    set_cpu(0);
    // Trip 1 takes one object and makes no magazine.
    let first = cache.alloc_box().unwrap();
    assert_eq!(
        magazines_in_use(alloc),
        before,
        "one allocation: no magazine"
    );
    // Trip 2 makes the 14-round magazine and puts its one round there.
    let second = cache.alloc_box().unwrap();
    let mut expected = before;
    expected[REFILL_MAX_MAGTYPE] += 1;
    assert_eq!(magazines_in_use(alloc), expected, "kmem_magazine_14 made");
    assert_eq!(cache.cpu_stats(0).nr_rounds_loaded, 1);
    let mut objs: Vec<_> = (0..98).map(|_| cache.alloc_box().unwrap()).collect();
    objs.push(first);
    objs.push(second);
    let trips = cache.nr_allocs_direct.load(Ordering::Relaxed);
    // 1, 2, 4, 8, 15, 15, ... objects a trip (14 rounds and the
    // caller's object; a batch stops at its slab's end).
    assert!(trips <= 11, "100 allocations took {trips} trips down");
    // Still that one magazine: none made or freed since.
    assert_eq!(magazines_in_use(alloc), expected);
    assert!(REFILL_MAX_MAGTYPE < start_magtype(64));
    let mut addrs: Vec<usize> = objs.iter().map(|p| p.as_ptr().as_ptr() as usize).collect();
    addrs.sort_unstable();
    addrs.dedup();
    assert_eq!(addrs.len(), 100, "no object handed out twice");
    for p in objs {
        p.free().unwrap();
    }
    assert_eq!(cache.stats().nr_allocated, 0);
    // SAFETY: nothing allocated; not used again.
    unsafe { cache.destroy() }.unwrap();
    assert_eq!(magazines_in_use(alloc), before, "magazines freed");
}

/// The refill's magazine type: `kmem_magazine_14`, at most the cache's
/// own.
#[test]
fn refill_magazine_type_is_at_most_the_caches() {
    use crate::magazine::refill_magtype;
    assert_eq!(
        MAGAZINE_ROUNDS[REFILL_MAX_MAGTYPE], 14,
        "kmem_magazine_14 at most"
    );
    assert_eq!(refill_magtype(NR_MAG_TYPES - 1), REFILL_MAX_MAGTYPE);
    assert_eq!(refill_magtype(2), 2, "at most the cache's type");
    assert_eq!(refill_magtype(0), 0);
}

/// An object class a page holds fewer than 8 of (3008 bytes: one) still
/// refills in batches: 20 allocations take a few trips down, not 20
/// (the shell replay's), and no slab more than one at a time would.
#[test]
fn large_objects_refill_in_batches() {
    let (alloc, _) = setup_default();
    let cache = alloc
        .cache_create("large", 3008, &CacheArgs::DEFAULT)
        .unwrap();
    set_cpu(0);
    let objs: Vec<_> = (0..20).map(|_| cache.alloc_box().unwrap()).collect();
    let trips = cache.nr_allocs_direct.load(Ordering::Relaxed);
    // 1, 2, 4, 8, 5 objects a trip, or more trips at a slab's end.
    assert!(trips <= 8, "20 allocations took {trips} trips down");
    let stats = cache.stats();
    assert_eq!(stats.nr_allocated, 20);
    assert_eq!(
        stats.nr_slabs,
        20_usize.div_ceil(stats.objs_per_slab),
        "no slab more than the objects need"
    );
    for p in objs {
        p.free().unwrap();
    }
    // SAFETY: nothing allocated; not used again.
    unsafe { cache.destroy() }.unwrap();
}

/// Once a free has made a magazine for a cache (its objects come back),
/// a refill on a CPU with none makes one of the depot's type: small
/// magazines would only add misses as the frees fill them.
#[test]
fn a_cache_that_frees_refills_into_magazines_of_its_type() {
    let (alloc, _) = setup_default();
    let cache = alloc.cache_create("warm", 64, &CacheArgs::DEFAULT).unwrap();
    let depot_type = start_magtype(64);
    set_cpu(0);
    let a = cache.alloc_box().unwrap();
    // The free makes CPU 0's first magazine, of the depot's type.
    a.free().unwrap();
    let before = magazines_in_use(alloc);
    set_cpu(1);
    let objs: Vec<_> = (0..3).map(|_| cache.alloc_box().unwrap()).collect();
    let mut expected = before;
    expected[depot_type] += 1;
    assert_eq!(magazines_in_use(alloc), expected, "CPU 1's refill magazine");
    assert!(cache.cpu_stats(1).nr_rounds_loaded > 0);
    for p in objs {
        p.free().unwrap();
    }
    set_cpu(0);
    // SAFETY: nothing allocated; not used again.
    unsafe { cache.destroy() }.unwrap();
}

/// Once the cache frees, its 14-round refill magazine gives way to the
/// depot's type: the free that finds it full moves its rounds into an
/// empty magazine of that type and frees it; on another CPU, a refill
/// replaces an empty one even where its room would do (a class a page
/// holds 8 objects of refills 8 at a time). Kept, it sent a miss every
/// 14 rounds of steady churn.
#[test]
fn a_refill_magazine_gives_way_once_the_cache_frees() {
    let (alloc, _) = setup_default();
    let cache = alloc.cache_create("up", 512, &CacheArgs::DEFAULT).unwrap();
    let depot_type = start_magtype(512);
    assert!(REFILL_MAX_MAGTYPE < depot_type);
    let before = magazines_in_use(alloc);
    let refill_made = |cpus: usize| {
        let mut expected = before;
        expected[REFILL_MAX_MAGTYPE] += cpus;
        expected
    };
    // CPU 0 and CPU 1 each take a refill magazine (the cache never
    // freed yet).
    set_cpu(0);
    let mut on_cpu0: Vec<_> = (0..12).map(|_| cache.alloc_box().unwrap()).collect();
    set_cpu(1);
    let on_cpu1: Vec<_> = (0..12).map(|_| cache.alloc_box().unwrap()).collect();
    assert_eq!(magazines_in_use(alloc), refill_made(2));
    // CPU 0 frees until its `loaded` is full, and one more.
    set_cpu(0);
    let (loaded, prev) = cache.cpu_rounds(0);
    assert!(prev.is_empty());
    let room = MAGAZINE_ROUNDS[REFILL_MAX_MAGTYPE] - loaded.len();
    for p in on_cpu0.drain(..=room) {
        p.free().unwrap();
    }
    let mut expected = refill_made(1);
    expected[depot_type] += 1;
    assert_eq!(magazines_in_use(alloc), expected, "CPU 0's moved");
    let (loaded, prev) = cache.cpu_rounds(0);
    assert_eq!(loaded.len(), MAGAZINE_ROUNDS[REFILL_MAX_MAGTYPE] + 1);
    assert!(prev.is_empty());
    // CPU 1 allocates its rounds and then refills: a magazine of the
    // depot's type replaces its empty 14-round one.
    set_cpu(1);
    let (loaded, _) = cache.cpu_rounds(1);
    let more: Vec<_> = (0..=loaded.len())
        .map(|_| cache.alloc_box().unwrap())
        .collect();
    let mut expected = before;
    expected[depot_type] += 2;
    assert_eq!(magazines_in_use(alloc), expected, "CPU 1's replaced");
    assert!(cache.cpu_stats(1).nr_rounds_loaded > 0);
    let mut addrs: Vec<usize> = (on_cpu0.iter().chain(&on_cpu1).chain(&more))
        .map(|p| p.as_ptr().as_ptr() as usize)
        .collect();
    addrs.sort_unstable();
    addrs.dedup();
    assert_eq!(addrs.len(), on_cpu0.len() + on_cpu1.len() + more.len());
    for p in on_cpu1.into_iter().chain(more) {
        p.free().unwrap();
    }
    set_cpu(0);
    for p in on_cpu0 {
        p.free().unwrap();
    }
    // SAFETY: nothing allocated; not used again.
    unsafe { cache.destroy() }.unwrap();
    assert_eq!(magazines_in_use(alloc), before, "magazines freed");
}

/// Until a free has made a magazine for a cache, its allocation misses
/// skip the depot (it cannot hold a round yet): a worker allocating
/// while the test holds the depot lock never waits on it. Before, every
/// miss locked the depot and found nothing.
#[test]
fn allocations_before_any_free_skip_the_depot() {
    let (alloc, _) = setup_default();
    let cache = alloc
        .cache_create("no-depot", 64, &CacheArgs::DEFAULT)
        .unwrap();
    let held = cache.depot.inner.lock();
    let (done, finished) = std::sync::mpsc::channel();
    let worker = std::thread::spawn(move || {
        set_cpu(1);
        let objs: Vec<_> = (0..200).map(|_| cache.alloc_box().unwrap()).collect();
        done.send(()).unwrap();
        objs
    });
    let waited = finished
        .recv_timeout(std::time::Duration::from_secs(10))
        .is_err();
    drop(held);
    let objs = worker.join().unwrap();
    assert!(!waited, "the allocations waited on the depot lock");
    assert_eq!(cache.depot.nr_contention.load(Ordering::Relaxed), 0);
    assert_eq!(cache.stats().nr_allocated, 200);
    set_cpu(1);
    for obj in objs {
        obj.free().unwrap();
    }
}
