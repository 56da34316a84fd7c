//! Tag side arrays (Linux `slabobj_ext`): one per small slab, allocated
//! with its first tagged object, freed with the slab, installed once
//! under a race; the fixtures are the parent module's.

use super::*;
use crate::CacheArgs;

#[test]
fn tag_refs_live_in_side_arrays_not_in_the_slab() {
    let (_serial, alloc) = setup();
    for size in [8usize, 64, 96, 192, 512] {
        let cache = alloc.stats().kmalloc_cache_for(size, 8).unwrap();
        let stats = cache.stats();
        let geometry = crate::layout::geometry::Geometry::new(
            size,
            crate::natural_align(size),
            CacheFlags::empty(),
            true,
        )
        .unwrap();
        assert_eq!(
            (stats.nr_pages_per_slab, stats.objs_per_slab),
            (geometry.nr_pages_per_slab, geometry.nr_objs_per_slab),
            "{size}"
        );
        // Two slabs' worth of tagged objects: every object remembers its
        // tag in its slab's side array (one per slab).
        let tag = site_small();
        let objs: Vec<_> = (0..2 * stats.objs_per_slab)
            .map(|_| cache.alloc_box_tagged(Some(tag.tag_ref())).unwrap())
            .collect();
        assert_eq!(counts(tag).calls, objs.len() as u64);
        for obj in &objs {
            assert!(cache.has_tag_array(obj.as_ptr()), "{size}");
            assert_eq!(
                cache.small_tag_ref(obj.as_ptr()),
                Some(tag.tag_ref()),
                "{size}"
            );
        }
        for obj in objs {
            obj.free().unwrap();
        }
        assert_eq!(counts(tag), AllocTagCounts::default());
    }
    assert_eq!(alloc.profiling().nr_tag_array_misses(), 0);
}

#[test]
fn side_arrays_come_with_the_first_tagged_object_and_go_with_the_slab() {
    let (_serial, alloc, source) = setup_with_source();
    alloc.reap_all();
    let pages_before = source.pages_outstanding();
    let metadata_before = alloc.stats().metadata().tag_array_bytes;
    // 64-byte objects, one-page slabs of 62: a 256-byte side array each.
    let cache = alloc
        .cache_create(
            "side-64",
            64,
            &CacheArgs {
                align: 8,
                ..CacheArgs::DEFAULT
            },
        )
        .unwrap();
    let tag = site_side_array();
    let before = side_arrays(alloc, 256);
    // Untagged objects (profiling off) get no side array.
    alloc.profiling().set_enabled(false);
    let untagged: Vec<_> = (0..3 * 62).map(|_| cache.alloc_box().unwrap()).collect();
    assert_eq!(side_arrays(alloc, 256), before);
    assert!(
        untagged
            .iter()
            .all(|obj| !cache.has_tag_array(obj.as_ptr()))
    );
    // Tagged ones: one side array per slab they land in.
    alloc.profiling().set_enabled(true);
    let tagged: Vec<_> = (0..5 * 62)
        .map(|_| cache.alloc_box_tagged(Some(tag.tag_ref())).unwrap())
        .collect();
    let nr_slabs = cache.stats().nr_slabs;
    assert_eq!(nr_slabs, 8, "3 untagged slabs, 5 tagged ones");
    assert_eq!(side_arrays(alloc, 256), before + 5);
    assert!(alloc.stats().metadata().tag_array_bytes > metadata_before);
    // Free everything (some through the slab layer: reap drains the
    // magazines) and reap: every side array goes back with its slab.
    for obj in untagged.into_iter().chain(tagged) {
        obj.free().unwrap();
    }
    assert_eq!(counts(tag), AllocTagCounts::default());
    cache.reap();
    assert_eq!(cache.stats().nr_slabs, 0);
    assert_eq!(side_arrays(alloc, 256), before, "no side array leaked");
    // SAFETY: no object of the cache is allocated.
    unsafe { cache.destroy() }.unwrap();
    alloc.reap_all();
    assert_eq!(alloc.stats().metadata().tag_array_bytes, metadata_before);
    assert_eq!(source.pages_outstanding(), pages_before);
}

#[test]
fn profiling_switched_on_late_tags_only_new_objects_of_old_slabs() {
    let (_serial, alloc) = setup();
    let cache = alloc
        .cache_create(
            "late-96",
            96,
            &CacheArgs {
                align: 8,
                ..CacheArgs::DEFAULT
            },
        )
        .unwrap();
    let tag = site_side_array();
    let before = counts(tag);
    alloc.profiling().set_enabled(false);
    let old: Vec<_> = (0..10)
        .map(|_| cache.alloc_box_tagged(Some(tag.tag_ref())).unwrap())
        .collect();
    assert!(!cache.has_tag_array(old[0].as_ptr()));
    alloc.profiling().set_enabled(true);
    // The same partial slab: its side array comes now, with every older
    // object's slot None.
    let new: Vec<_> = (0..10)
        .map(|_| cache.alloc_box_tagged(Some(tag.tag_ref())).unwrap())
        .collect();
    assert_eq!(cache.stats().nr_slabs, 1);
    assert!(cache.has_tag_array(old[0].as_ptr()));
    for obj in &old {
        assert_eq!(cache.small_tag_ref(obj.as_ptr()), None);
    }
    for obj in &new {
        assert_eq!(cache.small_tag_ref(obj.as_ptr()), Some(tag.tag_ref()));
    }
    let charged = counts(tag);
    assert_eq!(charged.calls, before.calls + 10);
    // Old objects uncharge nothing (no underflow), new ones once each.
    for obj in old {
        obj.free().unwrap();
    }
    assert_eq!(counts(tag), charged);
    for obj in new {
        obj.free().unwrap();
    }
    assert_eq!(counts(tag), before);
}

#[test]
fn a_side_array_that_cannot_be_allocated_costs_the_tag_not_the_object() {
    let (_serial, alloc, source) = setup_with_source();
    let cache = alloc
        .cache_create(
            "miss-64",
            64,
            &CacheArgs {
                align: 8,
                ..CacheArgs::DEFAULT
            },
        )
        .unwrap();
    let tag = site_side_array();
    let before = counts(tag);
    // A slab and a magazine holding one of its objects, untagged.
    alloc.profiling().set_enabled(false);
    let kept = cache.alloc_box().unwrap();
    let cached = cache.alloc_box().unwrap();
    let cached_ptr = cached.as_ptr();
    cached.free().unwrap();
    alloc.profiling().set_enabled(true);
    // No page for a side array: the profiled magazine hit, then the slab
    // layer (the magazine is empty) hand out their objects untagged.
    source.set_fail(true);
    let by_hit = cache.alloc_box_tagged(Some(tag.tag_ref())).unwrap();
    assert_eq!(by_hit.as_ptr(), cached_ptr, "the magazine's round");
    assert_eq!(alloc.profiling().nr_tag_array_misses(), 1);
    let by_slab = cache.alloc_box_tagged(Some(tag.tag_ref())).unwrap();
    assert_eq!(alloc.profiling().nr_tag_array_misses(), 2);
    source.set_fail(false);
    assert_eq!(counts(tag), before, "nothing charged for them");
    let [kept, by_hit, by_slab] = [kept, by_hit, by_slab].map(|obj| {
        assert!(!cache.has_tag_array(obj.as_ptr()));
        fill_box(obj, 0x5a)
    });
    // With pages back, the next tagged object installs the side array.
    let tagged = cache.alloc_box_tagged(Some(tag.tag_ref())).unwrap();
    assert_eq!(cache.small_tag_ref(tagged.as_ptr()), Some(tag.tag_ref()));
    assert_eq!(cache.small_tag_ref(by_hit.as_ptr()), None);
    assert_eq!(counts(tag).calls, before.calls + 1);
    for obj in [kept, by_hit, by_slab] {
        obj.free().unwrap();
    }
    tagged.free().unwrap();
    assert_eq!(counts(tag), before, "untagged frees uncharge nothing");
    assert_eq!(alloc.profiling().nr_tag_array_misses(), 2);
}

#[test]
fn concurrent_first_tagged_allocations_install_one_side_array() {
    let (_serial, alloc, source) = setup_with_source();
    alloc.reap_all();
    let pages_before = source.pages_outstanding();
    // 24-byte objects: slabs of 2 pages holding 336, a 1536-byte side
    // array (1344 bytes used).
    let cache = alloc
        .cache_create(
            "race-24",
            24,
            &CacheArgs {
                align: 8,
                ..CacheArgs::DEFAULT
            },
        )
        .unwrap();
    let tag = site_cross_cpu();
    let before = counts(tag);
    let arrays_before = side_arrays(alloc, 1536);
    for round in 0..20 {
        // Every CPU races for the first tagged objects of fresh slabs.
        let start = std::sync::Barrier::new(NR_CPUS);
        let objs: Vec<Vec<_>> = std::thread::scope(|scope| {
            let workers: Vec<_> = (0..NR_CPUS)
                .map(|cpu_id| {
                    let start = &start;
                    scope.spawn(move || {
                        set_cpu(cpu_id);
                        start.wait();
                        (0..50)
                            .map(|_| cache.alloc_box_tagged(Some(tag.tag_ref())).unwrap())
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            workers.into_iter().map(|w| w.join().unwrap()).collect()
        });
        let nr_objs: usize = objs.iter().map(Vec::len).sum();
        assert_eq!(
            counts(tag).calls,
            before.calls + nr_objs as u64,
            "round {round}"
        );
        for obj in objs.iter().flatten() {
            assert_eq!(cache.small_tag_ref(obj.as_ptr()), Some(tag.tag_ref()));
        }
        assert!(side_arrays(alloc, 1536) - arrays_before <= cache.stats().nr_slabs);
        // Freed on other CPUs than their own.
        std::thread::scope(|scope| {
            for (index, list) in objs.into_iter().enumerate() {
                scope.spawn(move || {
                    set_cpu((index + 1) % NR_CPUS);
                    for obj in list {
                        obj.free().unwrap();
                    }
                });
            }
        });
        assert_eq!(counts(tag), before, "round {round}");
        cache.reap();
        assert_eq!(side_arrays(alloc, 1536), arrays_before, "round {round}");
    }
    assert_eq!(alloc.profiling().nr_tag_array_misses(), 0);
    // SAFETY: no object of the cache is allocated.
    unsafe { cache.destroy() }.unwrap();
    alloc.reap_all();
    assert_eq!(source.pages_outstanding(), pages_before);
}

#[test]
fn the_loser_of_an_install_race_frees_its_copy() {
    let (_serial, alloc) = setup();
    let cache = alloc
        .cache_create(
            "loser-64",
            64,
            &CacheArgs {
                align: 8,
                ..CacheArgs::DEFAULT
            },
        )
        .unwrap();
    let tag = site_side_array();
    let obj = cache.alloc_box_tagged(Some(tag.tag_ref())).unwrap();
    let arrays = side_arrays(alloc, 256);
    let slab = cache.small_slab_of(obj.as_ptr().as_ptr() as usize);
    // SAFETY: `obj` is a busy object of this live slab.
    let installed = unsafe { (*slab).tags.load(core::sync::atomic::Ordering::Acquire) };
    assert_ne!(installed, crate::alloc_tag::no_tags());
    // A CPU that found no side array a moment ago installs one now: its
    // compare-exchange fails, it frees its copy and takes the winner's.
    // SAFETY: as above.
    let taken = unsafe { cache.install_tag_array(slab) };
    assert_eq!(taken, installed);
    assert_eq!(side_arrays(alloc, 256), arrays, "the loser's copy is freed");
    assert_eq!(cache.small_tag_ref(obj.as_ptr()), Some(tag.tag_ref()));
    obj.free().unwrap();
}
