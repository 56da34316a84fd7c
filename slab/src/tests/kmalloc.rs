//! kmalloc class selection, page-granular allocations, ksize.

use core::ptr::NonNull;
use std::vec::Vec;

use super::support::*;
use crate::{
    AllocError, CacheArgs, CacheFlags, FreeError, InitBox, KMALLOC_SIZES, PAGE_SIZE, natural_align,
};

#[test]
fn class_selection() {
    let (alloc, _) = setup_default();
    let name = |size, align| {
        alloc
            .stats()
            .kmalloc_cache_for(size, align)
            .map(|c| c.name())
    };
    assert_eq!(name(64, 8), Some("kmalloc-64"));
    assert_eq!(name(65, 8), Some("kmalloc-72"));
    assert_eq!(name(89, 8), Some("kmalloc-96"));
    assert_eq!(name(1, 1), Some("kmalloc-8"));
    assert_eq!(name(9, 8), Some("kmalloc-16"));
    assert_eq!(name(100, 8), Some("kmalloc-104"));
    assert_eq!(name(129, 8), Some("kmalloc-144"));
    assert_eq!(name(177, 8), Some("kmalloc-192"));
    assert_eq!(name(193, 8), Some("kmalloc-208"));
    assert_eq!(name(257, 8), Some("kmalloc-288"));
    assert_eq!(name(481, 8), Some("kmalloc-512"));
    assert_eq!(name(1025, 8), Some("kmalloc-1088"));
    assert_eq!(name(1089, 8), Some("kmalloc-1152"));
    assert_eq!(name(2049, 8), Some("kmalloc-2112"));
    assert_eq!(name(4104, 8), Some("kmalloc-4160"));
    assert_eq!(name(4225, 8), Some("kmalloc-4288"));
    assert_eq!(name(1025, 64), Some("kmalloc-1088"));
    assert_eq!(name(4225, 256), Some("kmalloc-4352"));
    assert_eq!(name(4225, 512), Some("kmalloc-4608"));
    assert_eq!(name(8192, 8), Some("kmalloc-8192"));
    assert_eq!(name(8193, 8), None);
    // Alignment: size 8 aligned 64 needs a class whose natural alignment is >= 64.
    let c = alloc.stats().kmalloc_cache_for(8, 64).unwrap();
    assert!(natural_align(c.obj_size()) >= 64 && c.align() >= 64);
    assert_eq!(c.name(), "kmalloc-64");
    assert_eq!(name(65, 64), Some("kmalloc-128"));
    assert_eq!(name(65, 16), Some("kmalloc-80"));
    assert_eq!(name(96, 64), Some("kmalloc-128"));
    assert_eq!(name(100, 4096), Some("kmalloc-4096"));
    assert_eq!(name(5000, 8192), None);
    // Every size/alignment pair picks the smallest fitting class.
    for size in 1..=8192 {
        for align in [1, 8, 16, 32, 64, 128, 512, 4096] {
            let c = alloc.stats().kmalloc_cache_for(size, align).unwrap();
            assert!(c.obj_size() >= size && natural_align(c.obj_size()) >= align);
            let smallest = KMALLOC_SIZES
                .iter()
                .find(|&&s| s >= size && natural_align(s) >= align)
                .unwrap();
            assert_eq!(c.obj_size(), *smallest);
        }
    }
}

#[test]
fn kmalloc_honours_size_and_alignment() {
    let (alloc, source) = setup_default();
    alloc.reap_all();
    let baseline = source.pages_outstanding();
    let mut live = Vec::new();
    for (i, size) in [1, 8, 9, 63, 64, 65, 96, 97, 200, 511, 1024, 4000, 8192]
        .into_iter()
        .enumerate()
    {
        for align in [1, 8, 32, 64, 512, 4096] {
            let p = alloc.kmalloc_box(size, align).unwrap();
            assert_eq!(p.as_ptr().as_ptr() as usize % align, 0);
            assert!(alloc.ksize(p.as_ptr()).unwrap() >= size);
            live.push((fill_box(p, i as u8), i as u8));
        }
    }
    for (p, seed) in live {
        assert!(check_box(&p, seed));
        p.free().unwrap();
    }
    alloc.reap_all();
    assert_eq!(source.pages_outstanding(), baseline);
}

#[test]
fn page_granular_allocations_aligned_above_a_page() {
    let (alloc, source) = setup_default();
    alloc.reap_all();
    let baseline = source.pages_outstanding();
    let mut live = Vec::new();
    // A one-page block first, so the source's next pages are not aligned.
    let skew = alloc.kmalloc_box(PAGE_SIZE, PAGE_SIZE).unwrap();
    for (i, (size, align)) in [
        (10, 8192),
        (100_000, 8192),
        (5000, 1 << 16),
        (1 << 16, 1 << 20),
    ]
    .into_iter()
    .enumerate()
    {
        let p = alloc.kmalloc_box(size, align).unwrap();
        let addr = p.as_ptr().as_ptr() as usize;
        assert_eq!(addr % align, 0, "{size} aligned {align}");
        assert_eq!(
            alloc.ksize(p.as_ptr()),
            Ok(size.div_ceil(PAGE_SIZE) * PAGE_SIZE)
        );
        let p = fill_box(p, i as u8);
        // Pointers into the slack (the page before may be another block:
        // only if ksize refuses it) or into the block are refused.
        for bad in [addr - PAGE_SIZE, addr + 8] {
            let bad_ptr = NonNull::new(bad as *mut u8).unwrap();
            if alloc.owns(bad as *const u8) && alloc.ksize(bad_ptr).is_err() {
                // SAFETY: refused (not a block start).
                let refused = unsafe { alloc.kfree(NonNull::new(bad as *mut u8).unwrap()) };
                assert!(refused.is_err(), "{bad:#x}");
            }
        }
        live.push((p, i as u8));
    }
    for (p, seed) in live {
        assert!(check_box(&p, seed));
        p.free().unwrap();
    }
    skew.free().unwrap();
    alloc.reap_all();
    assert_eq!(
        source.pages_outstanding(),
        baseline,
        "slack pages went back too"
    );
    let z = InitBox::kzalloc(alloc, 3 * PAGE_SIZE, 1 << 14).unwrap();
    assert_eq!(z.len(), 3 * PAGE_SIZE);
    assert!(z.as_bytes().iter().all(|&b| b == 0));
    z.free().unwrap();
}

#[test]
fn page_granular_allocations() {
    let (alloc, source) = setup_default();
    alloc.reap_all();
    let baseline = source.pages_outstanding();
    let p = alloc.kmalloc_box(8193, 8).unwrap();
    assert_eq!(p.as_ptr().as_ptr() as usize % PAGE_SIZE, 0);
    assert_eq!(alloc.ksize(p.as_ptr()), Ok(3 * PAGE_SIZE));
    assert_eq!(source.pages_outstanding(), baseline + 3);
    let q = alloc.kmalloc_box(100_000, 4096).unwrap();
    assert_eq!(alloc.ksize(q.as_ptr()), Ok(25 * PAGE_SIZE));
    let q = fill_box(q, 3);
    let ls = alloc.stats().large();
    assert_eq!(
        (ls.nr_live, ls.live_bytes, ls.nr_allocs_ever),
        (2, 28 * PAGE_SIZE, 2)
    );
    assert!(alloc.owns(q.as_ptr().as_ptr()));
    assert!(alloc.owns(q.as_ptr().as_ptr().wrapping_add(50_000)));
    assert!(check_box(&q, 3));
    p.free().unwrap();
    q.free().unwrap();
    assert_eq!(alloc.stats().large().nr_live, 0);
    assert_eq!(source.pages_outstanding(), baseline);
    assert_eq!(alloc.kmalloc(10, 2 << 30), Err(AllocError::InvalidLayout));
    assert_eq!(alloc.kmalloc(0, 8), Err(AllocError::InvalidLayout));
    assert_eq!(alloc.kmalloc(8, 3), Err(AllocError::InvalidLayout));
    assert_eq!(alloc.kmalloc(usize::MAX, 8), Err(AllocError::InvalidLayout));
    assert_eq!(alloc.kmalloc(1 << 40, 8), Err(AllocError::OutOfMemory));
}

#[test]
fn page_granular_blocks_register_their_head_only() {
    let (alloc, _) = setup_default();
    // Two blocks side by side, both freed (their heads keep freed marks),
    // then a block over both: b's stale freed mark lies inside it. (The
    // first round may see a slab take a freed page meanwhile: the
    // allocator's own first use of some cache.)
    let (b, c) = (0..3)
        .find_map(|_| {
            let a = alloc.kmalloc(3 * PAGE_SIZE, 8).unwrap();
            let b = alloc.kmalloc(3 * PAGE_SIZE, 8).unwrap();
            // SAFETY: allocated above, freed once.
            unsafe {
                alloc.kfree(b).unwrap();
                alloc.kfree(a).unwrap();
            }
            let c = alloc.kmalloc(6 * PAGE_SIZE, 8).unwrap();
            if c == a && b.as_ptr() as usize == a.as_ptr() as usize + 3 * PAGE_SIZE {
                return Some((b, c));
            }
            // SAFETY: allocated above.
            unsafe { alloc.kfree(c).unwrap() };
            None
        })
        .expect("first fit puts c over a and b");
    // Before c reached it, b's mark made a second kfree a double free
    // (`bad_free.rs`); inside c it is a pointer into a live block.
    assert!(alloc.owns(b.as_ptr()));
    assert_eq!(
        alloc.ksize(b),
        Err(FreeError::Misaligned {
            addr: b.as_ptr() as usize
        })
    );
    // SAFETY: b is inside c: refused, nothing changed.
    unsafe {
        assert_eq!(
            alloc.kfree(b),
            Err(FreeError::Misaligned {
                addr: b.as_ptr() as usize
            })
        );
    }
    let last = c.as_ptr() as usize + 5 * PAGE_SIZE;
    assert!(alloc.owns(last as *const u8));
    assert!(!alloc.owns((last + PAGE_SIZE) as *const u8));
    assert_eq!(alloc.stats().large().nr_live, 1);
    // SAFETY: allocated above.
    unsafe { alloc.kfree(c).unwrap() };
    assert!(!alloc.owns(last as *const u8));
}

#[test]
fn bufctl_hash_grows_and_shrinks() {
    let (alloc, source) = setup_default();
    // kmalloc classes use small-object slabs now: a bufctl cache.
    let cache = alloc
        .cache_create(
            "bufctl-1024",
            1024,
            &CacheArgs {
                align: 8,
                flags: CacheFlags::NOTOUCH,
                ..CacheArgs::DEFAULT
            },
        )
        .unwrap();
    // After the cache exists: its struct may need a new kmem_cache slab.
    alloc.reap_all();
    let baseline = source.pages_outstanding();
    let objs: Vec<_> = (0..600)
        .map(|i| fill_box(cache.alloc_box().unwrap(), i as u8))
        .collect();
    assert!(cache.slab.lock().hash.nr_buckets() > crate::layout::hash::INLINE_BUCKETS);
    for (i, p) in objs.into_iter().enumerate() {
        assert_eq!(p.len(), 1024);
        assert!(check_box(&p, i as u8));
        p.free().unwrap();
    }
    alloc.reap_all();
    assert_eq!(
        cache.slab.lock().hash.nr_buckets(),
        crate::layout::hash::INLINE_BUCKETS
    );
    assert_eq!(source.pages_outstanding(), baseline);
}

/// The bufctl hash shrinks on reap when its load falls (illumos
/// `kmem_hash_rescale`): one live object no longer keeps a 64-page table.
#[test]
fn bufctl_hash_shrinks_on_reap_with_live_objects() {
    let (alloc, source) = setup_default();
    let cache = alloc
        .cache_create(
            "bufctl-16",
            16,
            &CacheArgs {
                align: 8,
                flags: CacheFlags::NOTOUCH,
                ..CacheArgs::DEFAULT
            },
        )
        .unwrap();
    let buckets = || cache.slab.lock().hash.nr_buckets();
    let keep = cache.alloc_box().unwrap();
    alloc.reap_all();
    // One live object, the hash inline: the pages this costs.
    let with_one = source.pages_outstanding();
    // 16,385 objects: the hash grows to 32,768 buckets, 64 pages.
    let mut kept: Vec<_> = (0..16_384).map(|_| cache.alloc_box().unwrap()).collect();
    assert_eq!(buckets(), 32_768);
    let freed = kept.split_off(200);
    for p in freed {
        p.free().unwrap();
    }
    alloc.reap_all();
    // 201 objects in 32,768 buckets: down to one page (512 buckets).
    assert_eq!(buckets(), 512);
    for p in kept {
        p.free().unwrap();
    }
    alloc.reap_all();
    // One object: back to the inline buckets, and to the pages of before.
    assert_eq!(buckets(), crate::layout::hash::INLINE_BUCKETS);
    assert_eq!(source.pages_outstanding(), with_one);
    // Still found through the hash: it frees, and the cache empties.
    keep.free().unwrap();
    assert_eq!(cache.stats().nr_allocated, 0);
    // The table grows again when needed (checked when a slab is added).
    let again: Vec<_> = (0..2000).map(|_| cache.alloc_box().unwrap()).collect();
    assert!(buckets() >= 512);
    for p in again {
        p.free().unwrap();
    }
    // SAFETY: our cache, empty, not used afterwards.
    unsafe { cache.destroy() }.unwrap();
}
