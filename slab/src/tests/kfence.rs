//! KFENCE's pool (`crate::kfence`): placement between guard pages,
//! the canary checked at the free, reuse order, bad frees, the fault
//! classification, the sample bit and the interval, kmalloc and
//! `GlobalAlloc` served from the pool.

use crate::CacheArgs;
use std::alloc::{GlobalAlloc, Layout};
use std::format;
use std::ptr::NonNull;
use std::string::ToString;
use std::sync::Mutex;
use std::sync::atomic::Ordering;
use std::vec::Vec;

use super::debug::{read_u64, write};
use super::support::*;
use crate::kfence::{
    KFENCE_NUM_OBJECTS, KfenceBug, KfencePlace, KfenceReport, KfenceStack, KfenceState,
};
use crate::reports::error::RawFormat;
use crate::{CacheFlags, FreeError, KmemCache, PAGE_SIZE};

type Cache = KmemCache<TestPlatform>;

static REPORTS: Mutex<Vec<KfenceReport>> = Mutex::new(Vec::new());

fn hook(report: &KfenceReport) {
    REPORTS.lock().unwrap().push(*report);
}

/// The reports about `alloc`'s pool made so far.
fn reports(alloc: &TestAlloc) -> Vec<KfenceReport> {
    REPORTS
        .lock()
        .unwrap()
        .iter()
        .filter(|r| alloc.kfence().contains(r.addr))
        .copied()
        .collect()
}

fn kfence_setup() -> (&'static TestAlloc, &'static Cache) {
    let (alloc, _) = setup_default();
    alloc.kfence().init(0).unwrap();
    alloc.kfence().set_hook(Some(hook));
    let cache = alloc
        .cache_create(
            "kf-64",
            64,
            &CacheArgs {
                align: 8,
                ..CacheArgs::DEFAULT
            },
        )
        .unwrap();
    (alloc, cache)
}

fn page_of(addr: usize) -> usize {
    addr & !(PAGE_SIZE - 1)
}

fn byte(addr: usize) -> u8 {
    (read_u64(NonNull::new(addr as *mut u8).unwrap(), 0) & 0xff) as u8
}

fn poke(addr: usize, value: u8) {
    write(NonNull::new(addr as *mut u8).unwrap(), 0, value);
}

#[test]
fn sampled_objects_sit_between_guards_right_then_left_with_canary() {
    let (alloc, cache) = kfence_setup();
    assert!(alloc.kfence().force_sample(None));
    let right = cache.alloc_box().unwrap();
    let addr = right.as_ptr().as_ptr() as usize;
    assert!(alloc.kfence().contains(addr));
    assert_eq!((addr + 64) % PAGE_SIZE, 0, "right end of its page");
    assert!(kfence_protected(addr + 64), "guard page on the right");
    assert!(
        kfence_protected(page_of(addr) - PAGE_SIZE),
        "guard page on the left"
    );
    assert!(
        !kfence_protected(page_of(addr)),
        "the object's page is mapped"
    );
    let first = page_of(addr);
    assert_eq!(byte(first), crate::kfence::canary(first));
    assert_eq!(byte(addr - 1), crate::kfence::canary(addr - 1));

    assert!(alloc.kfence().force_sample(None));
    let left = cache.alloc_box().unwrap();
    let laddr = left.as_ptr().as_ptr() as usize;
    assert!(alloc.kfence().contains(laddr));
    assert_eq!(laddr % PAGE_SIZE, 0, "left end of its page");
    assert_eq!(byte(laddr + 64), crate::kfence::canary(laddr + 64));

    // Not sampled: no sample armed.
    let plain = cache.alloc_box().unwrap();
    assert!(!alloc.kfence().contains(plain.as_ptr().as_ptr() as usize));
    right.free().unwrap();
    left.free().unwrap();
    plain.free().unwrap();
    assert!(
        kfence_protected(page_of(addr)),
        "a freed object's page is unmapped"
    );
    let stats = alloc.kfence().stats();
    assert_eq!(
        (stats.nr_allocs, stats.nr_frees, stats.nr_in_use),
        (2, 2, 0)
    );
    assert_eq!(stats.nr_bugs, 0);
    assert!(reports(alloc).is_empty());
    let cache_stats = cache.stats();
    assert_eq!(cache_stats.nr_allocated, 0);
    assert_eq!(
        (cache_stats.nr_allocs_ever, cache_stats.nr_frees_ever),
        (3, 3),
        "samples count"
    );
}

#[test]
fn canary_overwrite_is_reported_at_the_free_which_goes_on() {
    let (alloc, cache) = kfence_setup();
    // Overflow by 1 of a left-placed object, underflow by 1 of a
    // right-placed one: both land in the canary.
    for (place, offset) in [(KfencePlace::Left, 64isize), (KfencePlace::Right, -1)] {
        alloc.kfence().force_sample(Some(place));
        let obj = cache.alloc_box().unwrap();
        let addr = obj.as_ptr().as_ptr() as usize;
        let at = addr.wrapping_add_signed(offset);
        poke(at, 0x41);
        obj.free().unwrap();
        let report = *reports(alloc).last().expect("a report");
        assert_eq!(report.kind, KfenceBug::Corruption);
        assert_eq!(report.addr, at);
        assert_eq!(report.bytes[0], Some((0x41, true)));
        let object = report.object.unwrap();
        assert_eq!(
            (object.addr, object.size, object.state),
            (addr, 64, KfenceState::Freed)
        );
        let text = report.display(&RawFormat).to_string();
        assert!(text.contains("BUG: KFENCE: memory corruption in"), "{text}");
        assert!(text.contains("Corrupted memory at"), "{text}");
        assert!(text.contains(" 0x41"), "{text}");
    }
    assert_eq!(alloc.kfence().stats().nr_bugs, 2);
    assert_eq!(alloc.kfence().stats().nr_in_use, 0);
}

#[test]
fn double_invalid_and_wrong_cache_frees_are_refused() {
    let (alloc, cache) = kfence_setup();
    let other = alloc
        .cache_create(
            "kf-other",
            64,
            &CacheArgs {
                align: 8,
                ..CacheArgs::DEFAULT
            },
        )
        .unwrap();
    alloc.kfence().force_sample(None);
    let obj = cache.alloc().unwrap();
    let addr = obj.as_ptr() as usize;
    let inner = NonNull::new((addr + 8) as *mut u8).unwrap();
    // SAFETY: bad frees, refused without touching anything.
    unsafe {
        assert_eq!(
            alloc.kfree(inner),
            Err(FreeError::NotAllocated { addr: addr + 8 })
        );
        assert_eq!(other.free(obj), Err(FreeError::WrongCache { addr }));
        cache.free(obj).unwrap();
        assert_eq!(cache.free(obj), Err(FreeError::DoubleFree { addr }));
        assert_eq!(alloc.kfree(obj), Err(FreeError::DoubleFree { addr }));
    }
    let kinds: Vec<_> = reports(alloc).iter().map(|r| r.kind).collect();
    assert_eq!(kinds, [KfenceBug::InvalidFree; 4]);
    let text = reports(alloc)[2].display(&RawFormat).to_string();
    assert!(text.contains("BUG: KFENCE: invalid free in"), "{text}");
    assert!(
        text.contains(&format!("Invalid free of {addr:#x} (in kfence-#")),
        "{text}"
    );
    assert!(text.contains("freed by task"), "{text}");
    assert_eq!(alloc.kfence().stats().nr_frees, 1);
}

#[test]
fn freed_objects_are_reused_last() {
    let (alloc, cache) = kfence_setup();
    alloc.kfence().force_sample(None);
    let first = cache.alloc_box().unwrap();
    let first_page = page_of(first.as_ptr().as_ptr() as usize);
    first.free().unwrap();
    let mut seen = Vec::new();
    for _ in 0..KFENCE_NUM_OBJECTS - 1 {
        alloc.kfence().force_sample(None);
        let obj = cache.alloc_box().unwrap();
        let page = page_of(obj.as_ptr().as_ptr() as usize);
        assert!(alloc.kfence().contains(page));
        assert_ne!(
            page, first_page,
            "the freed object waits for all the others"
        );
        seen.push(obj);
    }
    alloc.kfence().force_sample(None);
    let last = cache.alloc_box().unwrap();
    assert_eq!(page_of(last.as_ptr().as_ptr() as usize), first_page);
    // The pool is full: the next sample is skipped, the slab serves.
    alloc.kfence().force_sample(None);
    let plain = cache.alloc_box().unwrap();
    assert!(!alloc.kfence().contains(plain.as_ptr().as_ptr() as usize));
    assert_eq!(alloc.kfence().stats().nr_skipped, 1);
    for obj in seen.into_iter().chain([last, plain]) {
        obj.free().unwrap();
    }
}

#[test]
fn faults_are_classified_and_the_page_mapped_back() {
    let (alloc, cache) = kfence_setup();
    let stack = KfenceStack::from_frames(&[0x1234], 0, 7);
    alloc.kfence().force_sample(Some(KfencePlace::Right));
    let right = cache.alloc_box().unwrap();
    let raddr = right.as_ptr().as_ptr() as usize;
    let report = alloc.kfence().fault(raddr + 64, true, stack).unwrap();
    assert_eq!(report.kind, KfenceBug::OutOfBounds);
    assert_eq!(report.relation(), Some((1, "right")));
    assert!(!kfence_protected(raddr + 64), "mapped in for the access");
    let text = report.display(&RawFormat).to_string();
    assert!(
        text.contains("BUG: KFENCE: out-of-bounds write in ?"),
        "{text}"
    );
    assert!(text.contains("(1B right of kfence-#"), "{text}");
    assert!(text.contains("size=64, cache=kf-64"), "{text}");

    alloc.kfence().force_sample(Some(KfencePlace::Left));
    let left = cache.alloc_box().unwrap();
    let laddr = left.as_ptr().as_ptr() as usize;
    let report = alloc.kfence().fault(laddr - 8, false, stack).unwrap();
    assert_eq!(report.kind, KfenceBug::OutOfBounds);
    assert_eq!(report.relation(), Some((8, "left")));
    assert!(
        report
            .display(&RawFormat)
            .to_string()
            .contains("out-of-bounds read")
    );

    left.free().unwrap();
    let report = alloc.kfence().fault(laddr + 32, true, stack).unwrap();
    assert_eq!(report.kind, KfenceBug::UseAfterFree);
    let text = report.display(&RawFormat).to_string();
    assert!(text.contains("Use-after-free write at"), "{text}");
    assert!(text.contains("(in kfence-#"), "{text}");
    assert!(text.contains("freed by task"), "{text}");
    assert!(
        alloc.kfence().fault(0x1000, false, stack).is_none(),
        "not a pool address"
    );
    right.free().unwrap();
    // A re-use of the right object's slot protects its guard again.
    assert_eq!(alloc.kfence().stats().nr_bugs, 3);
}

#[test]
fn the_sample_bit_serves_one_allocation_of_any_cache_and_clears() {
    let (alloc, cache) = kfence_setup();
    let other = alloc
        .cache_create(
            "kf-128",
            128,
            &CacheArgs {
                align: 8,
                ..CacheArgs::DEFAULT
            },
        )
        .unwrap();
    // Warm both: the plain hit.
    let warm: Vec<_> = (0..4)
        .map(|_| (cache.alloc_box().unwrap(), other.alloc_box().unwrap()))
        .collect();
    drop(warm);
    alloc.kfence().force_sample(None);
    let sample = crate::cache::HotFlags::SAMPLE;
    assert!(cache.hot().contains(sample) && other.hot().contains(sample));
    let sampled = other.alloc_box().unwrap();
    assert!(alloc.kfence().contains(sampled.as_ptr().as_ptr() as usize));
    assert!(
        !other.hot().contains(sample),
        "cleared by the sampled allocation"
    );
    let plain = cache.alloc_box().unwrap();
    assert!(
        !alloc.kfence().contains(plain.as_ptr().as_ptr() as usize),
        "one per sample"
    );
    assert!(
        !cache.hot().contains(sample),
        "cleared by its next allocation"
    );
    sampled.free().unwrap();
    plain.free().unwrap();
}

#[test]
fn constructed_and_debug_caches_are_not_sampled() {
    let (alloc, _) = kfence_setup();
    let debug = alloc
        .cache_create(
            "kf-debug",
            64,
            &CacheArgs {
                align: 8,
                flags: CacheFlags::REDZONE,
                ..CacheArgs::DEFAULT
            },
        )
        .unwrap();
    alloc.kfence().force_sample(None);
    let obj = debug.alloc_box().unwrap();
    assert!(!alloc.kfence().contains(obj.as_ptr().as_ptr() as usize));
    obj.free().unwrap();
}

#[test]
fn kmalloc_and_global_alloc_are_sampled_at_the_size_asked() {
    let (alloc, _) = kfence_setup();
    alloc.kfence().force_sample(Some(KfencePlace::Right));
    let obj = alloc.kmalloc(40, 8).unwrap();
    let addr = obj.as_ptr() as usize;
    assert!(alloc.kfence().contains(addr));
    assert_eq!(alloc.ksize(obj), Ok(40));
    // At the page's end, aligned down as its class's objects are (the
    // slack, if any, is canary).
    let class = alloc.find_cache("kmalloc-40").map_or(8, |c| c.align());
    assert_eq!(addr % class.max(8), 0);
    assert!((40..40 + 64).contains(&(page_of(addr) + PAGE_SIZE - addr)));
    // SAFETY: ours, given up.
    unsafe { alloc.kfree(obj).unwrap() };

    alloc.kfence().force_sample(None);
    let layout = Layout::from_size_align(100, 16).unwrap();
    // SAFETY: a valid layout; freed below with it.
    let ptr = unsafe { GlobalAlloc::alloc(alloc, layout) };
    assert!(alloc.kfence().contains(ptr as usize));
    // SAFETY: ours, with its layout.
    unsafe { GlobalAlloc::dealloc(alloc, ptr, layout) };
    let stats = alloc.kfence().stats();
    assert_eq!((stats.nr_allocs, stats.nr_frees, stats.nr_bugs), (2, 2, 0));
}

#[test]
fn the_interval_arms_a_sample_on_the_miss() {
    let (alloc, _) = setup_default();
    KFENCE_CLOCK.fetch_max(1_000_000_000, Ordering::Relaxed);
    alloc.kfence().init(100).unwrap();
    let cache = alloc
        .cache_create(
            "kf-tick",
            64,
            &CacheArgs {
                align: 8,
                ..CacheArgs::DEFAULT
            },
        )
        .unwrap();
    assert_eq!(alloc.kfence().stats().interval_ms, 100);
    KFENCE_CLOCK.fetch_add(200_000_000, Ordering::Relaxed);
    // Misses check the clock and arm; a later allocation is sampled.
    let objs: Vec<_> = (0..200).map(|_| cache.alloc_box().unwrap()).collect();
    let nr_sampled = objs
        .iter()
        .filter(|o| alloc.kfence().contains(o.as_ptr().as_ptr() as usize))
        .count();
    assert_eq!(nr_sampled, 1, "one sample per interval");
    drop(objs);
    alloc.kfence().set_interval(0);
    assert_eq!(alloc.kfence().stats().interval_ms, 0);
}

#[test]
fn a_sample_forced_for_one_cache_skips_the_others() {
    let (alloc, cache) = kfence_setup();
    let other = alloc
        .cache_create(
            "kf-target",
            64,
            &CacheArgs {
                align: 8,
                ..CacheArgs::DEFAULT
            },
        )
        .unwrap();
    assert!(
        alloc
            .kfence()
            .force_sample_of(other, Some(KfencePlace::Left))
    );
    let plain = cache.alloc_box().unwrap();
    assert!(!alloc.kfence().contains(plain.as_ptr().as_ptr() as usize));
    let sampled = other.alloc_box().unwrap();
    let addr = sampled.as_ptr().as_ptr() as usize;
    assert!(alloc.kfence().contains(addr));
    assert_eq!(addr % PAGE_SIZE, 0, "placed left as asked");
    let debug = alloc
        .cache_create(
            "kf-target-debug",
            64,
            &CacheArgs {
                align: 8,
                flags: CacheFlags::POISON,
                ..CacheArgs::DEFAULT
            },
        )
        .unwrap();
    assert!(
        !alloc.kfence().force_sample_of(debug, None),
        "debug caches are not sampled"
    );
    plain.free().unwrap();
    sampled.free().unwrap();
}

#[test]
fn a_leaked_sample_is_found_by_the_leak_scan() {
    let (alloc, cache) = kfence_setup();
    alloc.kfence().force_sample(None);
    let obj = cache.alloc().unwrap();
    let addr = obj.as_ptr() as usize;
    let mut seen = Vec::new();
    alloc.kfence().for_each_object(|object| {
        if object.state == KfenceState::Allocated {
            seen.push((object.addr, object.addr + object.size));
        }
    });
    assert_eq!(seen, [(addr, addr + 64)]);
    let mut table: Vec<_> = (0..4096)
        .map(|_| crate::leak_scan::LeakEntry::empty())
        .collect();
    // SAFETY: the fake source's pages stay mapped; nothing runs meanwhile.
    let scan = unsafe { crate::leak_scan::LeakScan::new(alloc, &mut table) }.unwrap();
    let mut leaked = Vec::new();
    let summary = scan.finish(|group| {
        leaked.push((
            group.cache.as_str().to_string(),
            group.nr_leaked,
            group.first,
        ))
    });
    assert_eq!(summary.nr_leaked, 1, "{leaked:?}");
    assert_eq!(leaked, [("kf-64".to_string(), 1, addr)]);
    // SAFETY: allocated above, ours.
    unsafe { cache.free(obj) }.unwrap();
    seen.clear();
    alloc.kfence().for_each_object(|object| {
        if object.state == KfenceState::Allocated {
            seen.push((object.addr, object.addr + object.size));
        }
    });
    assert!(seen.is_empty());
}

#[test]
fn samples_count_in_their_caches_statistics_and_traced_caches_are_not_sampled() {
    let (alloc, cache) = kfence_setup();
    alloc.kfence().force_sample(None);
    let obj = cache.alloc_box().unwrap();
    assert!(alloc.kfence().contains(obj.as_ptr().as_ptr() as usize));
    assert_eq!(cache.stats().nr_allocated, 1);
    obj.free().unwrap();
    assert_eq!(cache.stats().nr_allocated, 0);
    cache.trace_table().start().unwrap();
    assert!(
        !alloc.kfence().force_sample_of(cache, None),
        "a traced cache is not sampled"
    );
    alloc.kfence().force_sample(None);
    let traced = cache.alloc_box().unwrap();
    assert!(!alloc.kfence().contains(traced.as_ptr().as_ptr() as usize));
    traced.free().unwrap();
}

#[test]
fn the_tick_never_waits_for_the_cache_list() {
    let (alloc, _) = setup_default();
    alloc.kfence().init(1).unwrap();
    let cache = alloc
        .cache_create(
            "kf-list",
            64,
            &CacheArgs {
                align: 8,
                ..CacheArgs::DEFAULT
            },
        )
        .unwrap();
    KFENCE_CLOCK.fetch_add(1_000_000_000, Ordering::Relaxed);
    // Misses under the cache-list lock (a for_each_cache callback may
    // allocate): the tick must not take the lock again (it deadlocked).
    let mut objs = Vec::new();
    alloc.for_each_cache(|c| {
        if std::ptr::eq(c, cache) {
            objs.extend((0..200).map(|_| cache.alloc_box().unwrap()));
        }
    });
    assert_eq!(objs.len(), 200);
    drop(objs);
    // Outside the lock the next miss arms a sample.
    let later: Vec<_> = (0..200).map(|_| cache.alloc_box().unwrap()).collect();
    assert!(
        later
            .iter()
            .any(|o| alloc.kfence().contains(o.as_ptr().as_ptr() as usize))
    );
}

#[test]
fn whatis_names_an_allocated_sample() {
    let (alloc, cache) = kfence_setup();
    alloc.kfence().force_sample(Some(KfencePlace::Right));
    let obj = cache.alloc_box().unwrap();
    let addr = obj.as_ptr().as_ptr() as usize;
    let info = alloc.debug().whatis(addr + 8).expect("a sample");
    assert!(core::ptr::eq(info.cache, cache));
    assert_eq!((info.object, info.offset, info.allocated), (addr, 8, true));
    assert_eq!(info.region, crate::ObjectRegion::Object);
    assert_eq!(
        alloc.debug().whatis(addr - 1).unwrap().region,
        crate::ObjectRegion::Redzone
    );
    assert!(alloc.debug().whatis(addr + 64).is_none(), "a guard page");
    obj.free().unwrap();
    assert!(alloc.debug().whatis(addr).is_none(), "a freed sample");
}

/// A sample freed by an interrupt handler that interrupted a magazine hit
/// (this CPU's per-CPU cache held: the free cannot count it there) is
/// still counted: `nr_allocated` back to 0 (it stayed at 1).
#[test]
fn a_sample_freed_while_the_per_cpu_cache_is_held_is_counted() {
    let (alloc, cache) = kfence_setup();
    assert!(alloc.kfence().force_sample(None));
    let obj = cache.alloc_box().unwrap();
    assert!(alloc.kfence().contains(obj.as_ptr().as_ptr() as usize));
    assert_eq!(cache.stats().nr_allocated, 1);
    {
        // The interrupted hit: this CPU's per-CPU cache held.
        let irq = crate::IrqGuard::<TestPlatform>::new();
        let _hit = cache.pcpu_lock_here(&irq).expect("per-CPU cache free");
        obj.free().unwrap();
    }
    let stats = cache.stats();
    assert_eq!(stats.nr_allocated, 0, "{stats:?}");
    assert_eq!(stats.nr_allocs_ever, stats.nr_frees_ever, "{stats:?}");
}

/// Issue 29: a sample armed while every cache that allocates is
/// ineligible (the trace table on every cache) used to stay armed with
/// every cache's bit cleared, and KFENCE never sampled again; the next
/// interval sets the bits again.
#[test]
fn a_sample_armed_while_no_cache_is_eligible_is_taken_later() {
    let (alloc, _) = setup_default();
    KFENCE_CLOCK.fetch_max(1_000_000_000, Ordering::Relaxed);
    alloc.kfence().init(100).unwrap();
    let cache = alloc
        .cache_create(
            "kf-rearm",
            64,
            &CacheArgs {
                align: 8,
                ..CacheArgs::DEFAULT
            },
        )
        .unwrap();
    let mut traced = Vec::new();
    alloc.for_each_cache(|cache| {
        if !cache.is_bootstrap() && cache.trace_table().start().is_ok() {
            traced.push(cache);
        }
    });
    KFENCE_CLOCK.fetch_add(200_000_000, Ordering::Relaxed);
    // Misses arm a sample; every cache clears its bit at its next
    // allocation, none eligible (traced).
    let objs: Vec<_> = (0..200).map(|_| cache.alloc_box().unwrap()).collect();
    for other in &traced {
        other.alloc_box().unwrap().free().unwrap();
    }
    assert!(
        objs.iter()
            .all(|o| !alloc.kfence().contains(o.as_ptr().as_ptr() as usize))
    );
    drop(objs);
    for other in &traced {
        other.trace_table().stop();
        other.trace_table().reset();
    }
    KFENCE_CLOCK.fetch_add(200_000_000, Ordering::Relaxed);
    let objs: Vec<_> = (0..200).map(|_| cache.alloc_box().unwrap()).collect();
    let nr_sampled = objs
        .iter()
        .filter(|o| alloc.kfence().contains(o.as_ptr().as_ptr() as usize))
        .count();
    assert_eq!(nr_sampled, 1, "the next interval samples again");
    drop(objs);
}
