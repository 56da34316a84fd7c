//! Bad frees are detected, reported with the right error, and change nothing.

use crate::CacheArgs;
use std::ptr::NonNull;

use super::support::*;
use crate::reports::error::ReportName;
use crate::{CacheFlags, CacheStats, FreeError, PageSource};

fn same_counts(a: &CacheStats, b: &CacheStats) {
    assert_eq!(a.nr_allocated, b.nr_allocated);
    assert_eq!(a.nr_frees_ever, b.nr_frees_ever);
    assert_eq!(a.nr_cpu_cached_objs, b.nr_cpu_cached_objs);
    assert_eq!(a.nr_slabs, b.nr_slabs);
    assert_eq!(a.nr_active_slabs, b.nr_active_slabs);
}

#[test]
fn double_free_on_bufctl_cache() {
    let (alloc, _) = setup_default();
    let cache = alloc
        .cache_create(
            "big",
            1000,
            &CacheArgs {
                align: 8,
                flags: CacheFlags::AUDIT,
                ..CacheArgs::DEFAULT
            },
        )
        .unwrap();
    let obj = cache.alloc_box().unwrap();
    let p = obj.as_ptr();
    let keep = cache.alloc_box().unwrap();
    obj.free().unwrap();
    let before = cache.stats();
    let addr = p.as_ptr() as usize;
    // SAFETY: refused.
    let refused = unsafe { cache.free(p) };
    assert_eq!(refused, Err(FreeError::DoubleFree { addr }));
    // SAFETY: refused.
    let refused = unsafe { alloc.kfree(p) };
    assert_eq!(refused, Err(FreeError::DoubleFree { addr }));
    same_counts(&before, &cache.stats());
    // Still usable: the object comes back exactly once.
    let q = cache.alloc_box().unwrap();
    assert_eq!(p, q.as_ptr());
    let r = cache.alloc_box().unwrap();
    assert_ne!(q.as_ptr(), r.as_ptr());
    q.free().unwrap();
    r.free().unwrap();
    keep.free().unwrap();
    // Reaped, slab and all: the page is no longer slab memory.
    cache.reap();
    assert_eq!(cache.stats().nr_slabs, 0);
    // SAFETY: refused.
    let refused = unsafe { cache.free(p) };
    assert_eq!(refused, Err(FreeError::NotAllocated { addr }));
    assert_eq!(cache.stats().nr_allocated, 0);
}

#[test]
fn double_free_on_bufctl_cache_after_drain_to_slab_layer() {
    let (alloc, _) = setup_default();
    let cache = alloc
        .cache_create(
            "big-drained",
            1000,
            &CacheArgs {
                align: 8,
                flags: CacheFlags::AUDIT,
                ..CacheArgs::DEFAULT
            },
        )
        .unwrap();
    let obj = cache.alloc_box().unwrap();
    let p = obj.as_ptr();
    // Keeps the slab alive through the reap below.
    let keep = cache.alloc_box().unwrap();
    assert_eq!(cache.stats().nr_slabs, 1);
    obj.free().unwrap();
    // The reap drains the magazines: p goes back to its slab (and out of
    // the bufctl hash); the slab stays, keep is in it.
    cache.reap();
    let before = cache.stats();
    assert_eq!(
        (
            before.nr_slabs,
            before.nr_cpu_cached_objs,
            before.nr_allocated
        ),
        (1, 0, 1)
    );
    let addr = p.as_ptr() as usize;
    // SAFETY: refused.
    unsafe {
        assert_eq!(cache.free(p), Err(FreeError::DoubleFree { addr }));
        assert_eq!(alloc.kfree(p), Err(FreeError::DoubleFree { addr }));
    }
    same_counts(&before, &cache.stats());
    // A never-allocated object start of the live slab is judged the same
    // (it is free in its slab): the lowest object that is neither p nor
    // keep (a new slab's free list is shuffled: any two objects).
    let slab = cache.small_slab_of(addr);
    // SAFETY: the live slab of p and keep.
    let base = unsafe { (*slab).base };
    let keep_addr = keep.as_ptr().as_ptr() as usize;
    let never = (0..3)
        .map(|index| base + index * cache.stride())
        .find(|&obj| obj != addr && obj != keep_addr)
        .unwrap();
    let never = NonNull::new(never as *mut u8).unwrap();
    // SAFETY: refused.
    let refused = unsafe { cache.free(never) };
    assert_eq!(
        refused,
        Err(FreeError::DoubleFree {
            addr: never.as_ptr() as usize
        })
    );
    // Still usable: p comes back (first on its slab's free list).
    let q = cache.alloc_box().unwrap();
    assert_eq!(q.as_ptr(), p);
    assert_eq!(cache.stats().nr_allocated, 2);
    q.free().unwrap();
    keep.free().unwrap();
    cache.reap();
    assert_eq!(cache.stats().nr_slabs, 0);
    // Slab gone: not slab memory any more.
    // SAFETY: refused.
    let refused = unsafe { cache.free(p) };
    assert_eq!(refused, Err(FreeError::NotAllocated { addr }));
}

#[test]
fn double_free_with_audit_on_small_cache() {
    let (alloc, _) = setup_default();
    let cache = alloc
        .cache_create(
            "audit",
            24,
            &CacheArgs {
                align: 8,
                flags: CacheFlags::AUDIT,
                ..CacheArgs::DEFAULT
            },
        )
        .unwrap();
    let obj = cache.alloc_box().unwrap();
    let p = obj.as_ptr();
    obj.free().unwrap();
    let before = cache.stats();
    // SAFETY: refused.
    let refused = unsafe { cache.free(p) };
    assert_eq!(
        refused,
        Err(FreeError::DoubleFree {
            addr: p.as_ptr() as usize
        })
    );
    same_counts(&before, &cache.stats());
    let q = cache.alloc_box().unwrap();
    let r = cache.alloc_box().unwrap();
    assert_ne!(q.as_ptr(), r.as_ptr());
    q.free().unwrap();
    r.free().unwrap();
}

#[test]
fn foreign_pointers_are_not_allocated() {
    let (alloc, source) = setup_default();
    let cache = alloc
        .cache_create(
            "f",
            64,
            &CacheArgs {
                align: 8,
                flags: CacheFlags::AUDIT,
                ..CacheArgs::DEFAULT
            },
        )
        .unwrap();
    let big = alloc
        .cache_create(
            "fb",
            3000,
            &CacheArgs {
                align: 8,
                ..CacheArgs::DEFAULT
            },
        )
        .unwrap();
    let keep = cache.alloc_box().unwrap();
    let before = cache.stats();
    let mut on_stack = 0u64;
    let stack = NonNull::from(&mut on_stack).cast::<u8>();
    let heap = std::boxed::Box::leak(std::boxed::Box::new(0u64));
    let heap = NonNull::from(heap).cast::<u8>();
    // Pages of the primary source that are not slab memory.
    let raw = source.alloc_pages(1).unwrap();
    for ptr in [stack, heap, raw] {
        let addr = ptr.as_ptr() as usize;
        // SAFETY: all refused.
        unsafe {
            assert_eq!(cache.free(ptr), Err(FreeError::NotAllocated { addr }));
            assert_eq!(big.free(ptr), Err(FreeError::NotAllocated { addr }));
            assert_eq!(alloc.kfree(ptr), Err(FreeError::NotAllocated { addr }));
        }
        assert!(!alloc.owns(ptr.as_ptr()));
        assert_eq!(alloc.ksize(ptr), Err(FreeError::NotAllocated { addr }));
    }
    assert!(alloc.owns(keep.as_ptr().as_ptr()));
    same_counts(&before, &cache.stats());
    // The metadata of the allocator is not the caller's to free.
    let kmem_cache_obj = NonNull::from(cache).cast::<u8>();
    // SAFETY: refused.
    let refused = unsafe { alloc.kfree(kmem_cache_obj) };
    assert!(matches!(refused, Err(FreeError::NotAllocated { .. })));
    // SAFETY: pages from the source above.
    unsafe { source.free_pages(raw, 1) };
    keep.free().unwrap();
}

#[test]
fn wrong_cache() {
    let (alloc, _) = setup_default();
    let a = alloc
        .cache_create(
            "a",
            64,
            &CacheArgs {
                align: 8,
                ..CacheArgs::DEFAULT
            },
        )
        .unwrap();
    let b = alloc
        .cache_create(
            "b",
            64,
            &CacheArgs {
                align: 8,
                ..CacheArgs::DEFAULT
            },
        )
        .unwrap();
    let k = alloc.kmalloc(64, 8).unwrap();
    let large = alloc.kmalloc(20000, 8).unwrap();
    let pa = a.alloc().unwrap();
    let before = b.stats();
    let seen = alloc.debug().nr_errors();
    // SAFETY: all refused.
    unsafe {
        for obj in [pa, k, large] {
            assert_eq!(
                b.free(obj),
                Err(FreeError::WrongCache {
                    addr: obj.as_ptr() as usize
                })
            );
        }
    }
    // The error reports name the owner (a page-granular kmalloc: none).
    let owners: std::vec::Vec<_> = super::debug::errors_since(alloc, seen)
        .iter()
        .map(|report| report.owner)
        .collect();
    assert_eq!(
        owners,
        [
            Some(ReportName::new("a")),
            Some(ReportName::new("kmalloc-64")),
            None
        ]
    );
    same_counts(&before, &b.stats());
    assert_eq!(a.stats().nr_allocated, 1);
    // kfree finds the owner of any pointer.
    // SAFETY: allocated above.
    unsafe {
        alloc.kfree(pa).unwrap();
        alloc.kfree(k).unwrap();
        alloc.kfree(large).unwrap();
    }
    assert_eq!(a.stats().nr_allocated, 0);
}

#[test]
fn misaligned_pointers() {
    let (alloc, _) = setup_default();
    for (size, flags) in [
        (48, CacheFlags::empty()),
        (48, CacheFlags::NOTOUCH),
        (1500, CacheFlags::empty()),
    ] {
        let cache = alloc
            .cache_create(
                "mis",
                size,
                &CacheArgs {
                    align: 8,
                    flags,
                    ..CacheArgs::DEFAULT
                },
            )
            .unwrap();
        let p = cache.alloc_box().unwrap();
        let before = cache.stats();
        for offset in [1, 8, size - 1] {
            let inner = NonNull::new(p.as_ptr().as_ptr().wrapping_add(offset)).unwrap();
            let addr = inner.as_ptr() as usize;
            // SAFETY: refused.
            unsafe {
                assert_eq!(cache.free(inner), Err(FreeError::Misaligned { addr }));
                assert_eq!(alloc.kfree(inner), Err(FreeError::Misaligned { addr }));
            }
            assert_eq!(alloc.ksize(inner), Err(FreeError::Misaligned { addr }));
        }
        same_counts(&before, &cache.stats());
        p.free().unwrap();
    }
    let large = alloc.kmalloc(3 * 4096, 8).unwrap();
    // SAFETY: inside the allocation; refused.
    unsafe {
        let inner = NonNull::new_unchecked(large.as_ptr().add(8));
        assert!(matches!(
            alloc.kfree(inner),
            Err(FreeError::Misaligned { .. })
        ));
        let tail = NonNull::new_unchecked(large.as_ptr().add(4096));
        assert!(matches!(
            alloc.kfree(tail),
            Err(FreeError::Misaligned { .. })
        ));
        alloc.kfree(large).unwrap();
        assert_eq!(
            alloc.kfree(large),
            Err(FreeError::DoubleFree {
                addr: large.as_ptr() as usize
            })
        );
    }
}

#[test]
fn cache_on_another_source() {
    let (alloc, _) = setup_default();
    let other = FakeSource::new(256);
    let small = alloc
        .cache_create(
            "other-s",
            32,
            &CacheArgs {
                align: 8,
                flags: CacheFlags::AUDIT,
                source: Some(other),
                ..CacheArgs::DEFAULT
            },
        )
        .unwrap();
    let big = alloc
        .cache_create(
            "other-b",
            2000,
            &CacheArgs {
                align: 8,
                flags: CacheFlags::AUDIT,
                source: Some(other),
                ..CacheArgs::DEFAULT
            },
        )
        .unwrap();
    let p = small.alloc().unwrap();
    let q = big.alloc().unwrap();
    assert!(other.contains(p.as_ptr() as usize) && other.contains(q.as_ptr() as usize));
    // Not in the page map: kfree refuses, the cache's own free works.
    assert!(!alloc.owns(p.as_ptr()));
    // SAFETY: refused / allocated above.
    unsafe {
        assert!(alloc.kfree(p).is_err());
        let inner = NonNull::new_unchecked(p.as_ptr().add(4));
        assert!(matches!(
            small.free(inner),
            Err(FreeError::Misaligned { .. })
        ));
        assert!(matches!(small.free(q), Err(FreeError::NotAllocated { .. })));
        assert!(matches!(big.free(p), Err(FreeError::NotAllocated { .. })));
        small.free(p).unwrap();
        assert!(matches!(small.free(p), Err(FreeError::DoubleFree { .. })));
        big.free(q).unwrap();
        assert!(matches!(big.free(q), Err(FreeError::DoubleFree { .. })));
    }
    alloc.reap_all();
    assert_eq!(other.pages_outstanding(), 0);
}

#[test]
fn error_messages_are_one_line() {
    let errors = [
        FreeError::DoubleFree { addr: 0x1000 },
        FreeError::NotAllocated { addr: 0x1000 },
        FreeError::WrongCache { addr: 0x1000 },
        FreeError::Misaligned { addr: 0x1000 },
    ];
    for e in errors {
        let text = std::format!("{e}");
        assert!(text.contains("0x1000") && !text.contains('\n'), "{text}");
        assert_eq!(e.addr(), 0x1000);
    }
    assert!(std::format!("{}", crate::AllocError::OutOfMemory).contains("out of memory"));
}
