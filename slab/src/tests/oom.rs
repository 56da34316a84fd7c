//! Running out of memory returns errors, never panics, and leaks nothing.

use crate::CacheArgs;
use std::vec::Vec;

use super::support::*;
use crate::{AllocError, Kmem, MIN_FREE_PAGES};

#[test]
fn init_fails_cleanly_at_every_point() {
    set_cpu(0);
    let mut budget = 0;
    loop {
        let source = FakeSource::new(1024);
        let alloc: &'static TestAlloc = std::boxed::Box::leak(std::boxed::Box::new(Kmem::new()));
        source.fail_after(Some(budget));
        match alloc.init(source) {
            Ok(()) => {
                source.fail_after(None);
                // Works after a successful init.
                alloc.kmalloc_box(100, 8).unwrap().free().unwrap();
                break;
            }
            Err(e) => {
                assert_eq!(e, AllocError::OutOfMemory);
                assert!(!alloc.is_ready());
                assert_eq!(
                    source.pages_outstanding(),
                    0,
                    "init leaked with budget {budget}"
                );
                // A failed init can be retried.
                source.fail_after(None);
                alloc.init(source).unwrap();
                assert!(alloc.kmalloc(64, 8).is_ok());
            }
        }
        budget += 1;
        assert!(budget < 100);
    }
    assert!(budget > 3, "init needs several pages");
}

#[test]
fn allocations_fail_without_panicking_and_recover() {
    let (alloc, source) = setup_default();
    let small = alloc
        .cache_create(
            "oom-s",
            100,
            &CacheArgs {
                align: 8,
                ..CacheArgs::DEFAULT
            },
        )
        .unwrap();
    let big = alloc
        .cache_create(
            "oom-b",
            3000,
            &CacheArgs {
                align: 8,
                ..CacheArgs::DEFAULT
            },
        )
        .unwrap();
    alloc.reap_all();
    let baseline = source.pages_outstanding();
    source.set_fail(true);
    assert_eq!(small.alloc(), Err(AllocError::OutOfMemory));
    assert_eq!(big.alloc(), Err(AllocError::OutOfMemory));
    assert_eq!(alloc.kmalloc(64, 8), Err(AllocError::OutOfMemory));
    assert_eq!(alloc.kmalloc(100_000, 8), Err(AllocError::OutOfMemory));
    assert!(
        alloc
            .cache_create(
                "oom-c",
                8,
                &CacheArgs {
                    align: 8,
                    ..CacheArgs::DEFAULT
                }
            )
            .is_ok()
            || source.pages_outstanding() == baseline
    );
    assert_eq!(source.pages_outstanding(), baseline);
    source.set_fail(false);

    // Fill up a small source completely, then free everything.
    let mut objs = Vec::new();
    source.fail_after(Some(50));
    loop {
        match big.alloc_box() {
            Ok(obj) => objs.push(obj),
            Err(e) => {
                assert_eq!(e, AllocError::OutOfMemory);
                break;
            }
        }
    }
    assert!(!objs.is_empty());
    // Frees never need memory to succeed, even with the source dry (new
    // magazines cannot be allocated: objects go straight to the slab layer).
    source.set_fail(true);
    for obj in objs.drain(..) {
        obj.free().unwrap();
    }
    source.set_fail(false);
    source.fail_after(None);
    assert_eq!(big.stats().nr_allocated, 0);
    alloc.reap_all();
    assert_eq!(source.pages_outstanding(), baseline);
}

#[test]
fn cache_create_out_of_memory() {
    let (alloc, source) = setup(2048);
    let baseline = source.pages_outstanding();
    source.set_fail(true);
    let mut created = Vec::new();
    // kmem_cache runs out sooner or later.
    let mut failed = false;
    for _ in 0..1000 {
        match alloc.cache_create(
            "c",
            8,
            &CacheArgs {
                align: 8,
                ..CacheArgs::DEFAULT
            },
        ) {
            Ok(c) => created.push(c),
            Err(e) => {
                assert_eq!(e, AllocError::OutOfMemory);
                failed = true;
                break;
            }
        }
    }
    assert!(failed);
    source.set_fail(false);
    for c in created {
        // SAFETY: empty caches, not used afterwards.
        unsafe { c.destroy() }.unwrap();
    }
    alloc.reap_all();
    assert!(source.pages_outstanding() <= baseline);
}

/// Issue 29: a refused `Kmem::init` leaves the allocator as a fresh
/// one: no cache listed, cache ids where they were, not ready; a retry
/// builds exactly what a first successful init builds.
#[test]
fn a_refused_init_leaves_the_allocator_as_it_was() {
    set_cpu(0);
    let fresh: &'static TestAlloc = std::boxed::Box::leak(std::boxed::Box::new(Kmem::new()));
    fresh.init(FakeSource::new(1024)).unwrap();
    let mut fresh_ids = Vec::new();
    fresh.for_each_cache(|cache| {
        fresh_ids.push((std::string::String::from(cache.name()), cache.id()))
    });

    let alloc: &'static TestAlloc = std::boxed::Box::leak(std::boxed::Box::new(Kmem::new()));
    let source = FakeSource::new(1024);
    // Refused halfway (the page source runs dry after 20 pages), then
    // refused too small, then retried.
    source.fail_after(Some(20));
    assert_eq!(alloc.init(source), Err(AllocError::OutOfMemory));
    assert_eq!(
        alloc.init(FakeSource::new(MIN_FREE_PAGES)),
        Err(AllocError::SourceTooSmall)
    );
    assert!(!alloc.is_ready());
    assert_eq!(source.pages_outstanding(), 0);
    let mut nr_listed = 0;
    alloc.for_each_cache(|_| nr_listed += 1);
    assert_eq!(nr_listed, 0, "a refused init lists no cache");
    assert!(alloc.kmalloc(64, 8).is_err());
    source.fail_after(None);
    alloc.init(source).unwrap();
    let mut ids = Vec::new();
    alloc.for_each_cache(|cache| ids.push((std::string::String::from(cache.name()), cache.id())));
    assert_eq!(ids, fresh_ids, "the same caches with the same ids");
    assert_eq!(alloc.init(source), Err(AllocError::AlreadyInitialized));
}
