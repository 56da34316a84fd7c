//! Leaks by reachability (`crate::leak_scan`): exactly the objects nothing
//! points to, grouped by cache and site; free rounds never counted.

use crate::CacheArgs;
use std::vec::Vec;

use super::support::*;
use crate::PAGE_SIZE;
use crate::leak_scan::{LeakEntry, LeakGroup, LeakScanError, LeakSummary};

/// Scan with `roots` as the only root, with a table of `table_len`
/// entries (`None`: enough); the groups found and the summary.
fn scan_with(
    alloc: &TestAlloc,
    table_len: Option<usize>,
    roots: &[usize],
) -> Result<(Vec<LeakGroup>, LeakSummary), LeakScanError> {
    let len = table_len.unwrap_or(crate::leak_scan::LeakScan::capacity(alloc) + 16);
    let mut table: Vec<LeakEntry> = (0..len).map(|_| LeakEntry::empty()).collect();
    // SAFETY: nothing reaps or destroys during the scan (this thread only).
    let mut scan = unsafe { crate::leak_scan::LeakScan::new(alloc, &mut table) }?;
    scan.scan_slice(roots);
    let mut groups = Vec::new();
    let summary = scan.finish(|group| groups.push(*group));
    Ok((groups, summary))
}

fn scan(alloc: &TestAlloc, roots: &[usize]) -> (Vec<LeakGroup>, LeakSummary) {
    scan_with(alloc, None, roots).unwrap()
}

#[test]
fn finds_exactly_the_unreachable_objects() {
    let (alloc, _) = setup_default();
    let cache = alloc
        .cache_create(
            "leaky",
            64,
            &CacheArgs {
                align: 8,
                ..CacheArgs::DEFAULT
            },
        )
        .unwrap();
    // Held: pointed to from the root.
    let held: Vec<_> = (0..5).map(|_| cache.alloc_box().unwrap()).collect();
    // Reached only through a held object (its first word), and one by an
    // interior pointer.
    let behind = cache.alloc_box().unwrap().fill(0).into_raw();
    let inner = cache.alloc_box().unwrap().into_raw();
    let mut head = cache
        .alloc_box()
        .unwrap()
        .write_words(|i| if i == 0 { behind.as_ptr() as u64 } else { 0 });
    // Freed: resting in this CPU's magazines, not a leak.
    let freed: Vec<_> = (0..40).map(|_| cache.alloc_box().unwrap()).collect();
    for obj in freed {
        obj.free().unwrap();
    }
    // Leaked: three of this cache, one page-granular kmalloc.
    let leaked: Vec<usize> = (0..3)
        .map(|_| cache.alloc_box().unwrap().into_raw().as_ptr() as usize)
        .collect();
    let big = alloc.kmalloc(3 * PAGE_SIZE, 8).unwrap().as_ptr() as usize;
    let mut roots: Vec<usize> = held.iter().map(|b| b.as_ptr().as_ptr() as usize).collect();
    roots.push(head.as_ptr().as_ptr() as usize);
    roots.push(inner.as_ptr() as usize + 24);

    let (groups, summary) = scan(alloc, &roots);
    assert_eq!(groups.len(), 2, "{groups:?}");
    assert_eq!(groups[0].cache.as_str(), "leaky");
    assert_eq!(groups[0].nr_leaked, 3);
    assert_eq!(groups[0].bytes, 3 * 64);
    assert_eq!(groups[0].first, *leaked.iter().min().unwrap());
    assert_eq!(groups[1].cache.as_str(), "kmalloc-pages");
    assert_eq!((groups[1].nr_leaked, groups[1].first), (1, big));
    assert_eq!(groups[1].bytes, 3 * PAGE_SIZE);
    assert_eq!(summary.nr_leaked, 4);
    assert_eq!(summary.nr_reached, 5 + 3);
    assert!(summary.nr_resting >= 1, "{summary:?}");

    // Cut the chain: `behind` leaks too.
    head.write_words(|_| 0);
    let (groups, _) = scan(alloc, &roots);
    assert_eq!(groups[0].nr_leaked, 4);
    drop(head);
}

#[test]
fn a_quiet_allocator_has_no_leaks_and_a_small_table_is_refused() {
    let (alloc, _) = setup_default();
    let (groups, summary) = scan(alloc, &[]);
    assert!(groups.is_empty(), "{groups:?}");
    assert_eq!(summary.nr_leaked, 0);
    let _objs: Vec<_> = (0..10)
        .map(|_| alloc.kmalloc_box(100, 8).unwrap())
        .collect();
    // The misses' refills left free rounds in the magazines (the scan
    // counts them): back to the slabs.
    alloc.reap_all();
    let refused = scan_with(alloc, Some(3), &[]).err();
    assert_eq!(refused, Some(LeakScanError::TableTooSmall { needed: 10 }));
}

/// Issue 29: a KFENCE sample freed during a scan (by another CPU or an
/// interrupt handler) has its page unmapped; the scan reads samples only
/// while they are allocated (under the pool's lock), so it does not
/// fault (a kernel's KFENCE reported a use after free by the scan). Here
/// the sample is the only path to another object: freed mid-scan, it is
/// not read, and that object is reported leaked.
#[test]
fn a_kfence_sample_freed_during_the_scan_is_not_read() {
    let (alloc, _) = setup_default();
    alloc.kfence().init(0).unwrap();
    let sampled = alloc
        .cache_create(
            "leak-kf",
            64,
            &CacheArgs {
                align: 8,
                ..CacheArgs::DEFAULT
            },
        )
        .unwrap();
    let other = alloc
        .cache_create(
            "leak-kf-other",
            64,
            &CacheArgs {
                align: 8,
                ..CacheArgs::DEFAULT
            },
        )
        .unwrap();
    assert!(alloc.kfence().force_sample_of(sampled, None));
    let sample = sampled.alloc().unwrap();
    assert!(alloc.kfence().contains(sample.as_ptr() as usize));
    let target = other.alloc().unwrap();
    // SAFETY: the sample is ours, 64 bytes.
    unsafe {
        sample
            .as_ptr()
            .cast::<usize>()
            .write_unaligned(target.as_ptr() as usize)
    };

    // Scanned while allocated: the target is reached through it.
    let (groups, summary) = scan(alloc, &[sample.as_ptr() as usize]);
    assert_eq!(summary.nr_leaked, 0, "{groups:?}");

    let mut table: Vec<LeakEntry> = (0..crate::leak_scan::LeakScan::capacity(alloc) + 16)
        .map(|_| LeakEntry::empty())
        .collect();
    // SAFETY: nothing reaps or destroys during the scan.
    let mut scan = unsafe { crate::leak_scan::LeakScan::new(alloc, &mut table) }.unwrap();
    // Freed after the scan recorded it, before it is scanned.
    // SAFETY: allocated above, not used again.
    unsafe { sampled.free(sample) }.unwrap();
    assert!(kfence_protected(
        sample.as_ptr() as usize & !(PAGE_SIZE - 1)
    ));
    scan.scan_slice(&[sample.as_ptr() as usize]);
    let mut groups = Vec::new();
    let summary = scan.finish(|group| groups.push(*group));
    assert_eq!(summary.nr_leaked, 1, "{groups:?}");
    assert_eq!(groups[0].first, target.as_ptr() as usize);
    // SAFETY: allocated above, not used again.
    unsafe { other.free(target) }.unwrap();
}
