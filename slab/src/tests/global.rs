//! GlobalAlloc and core::alloc::Allocator shims.

use core::alloc::{GlobalAlloc, Layout};
use std::boxed::Box;
use std::vec::Vec;

use super::support::*;
use crate::{Kmem, PAGE_SIZE};

#[test]
fn null_before_init() {
    let alloc: &'static TestAlloc = Box::leak(Box::new(Kmem::new()));
    // SAFETY: valid layout.
    let p = unsafe { alloc.alloc(Layout::from_size_align(64, 8).unwrap()) };
    assert!(p.is_null());
}

#[test]
fn layouts_through_global_alloc() {
    let (alloc, source) = setup_default();
    alloc.reap_all();
    let baseline = source.pages_outstanding();
    let mut live = Vec::new();
    for size in [0, 1, 3, 8, 24, 100, 1000, 5000, 8192, 10_000, 70_000] {
        for align in [1, 2, 8, 16, 64, 128, 1024, 4096] {
            let layout = Layout::from_size_align(size, align).unwrap();
            // SAFETY: valid layout (size 0 is handled by the allocator).
            let p = unsafe { alloc.alloc(layout) };
            assert!(!p.is_null(), "{layout:?}");
            assert_eq!(p as usize % align, 0);
            let ptr = core::ptr::NonNull::new(p).unwrap();
            fill(ptr, size, size as u8);
            live.push((ptr, layout));
        }
    }
    // Alignment above a page: page-granular, aligned.
    let layout = Layout::from_size_align(64, 2 * PAGE_SIZE).unwrap();
    // SAFETY: valid layout.
    let p = unsafe { alloc.alloc(layout) };
    assert!(!p.is_null() && (p as usize).is_multiple_of(2 * PAGE_SIZE));
    let ptr = core::ptr::NonNull::new(p).unwrap();
    fill(ptr, 64, 64);
    live.push((ptr, layout));
    // Above 1 GiB: null, not a panic.
    // SAFETY: valid layout.
    assert!(unsafe { alloc.alloc(Layout::from_size_align(64, 2 << 30).unwrap()) }.is_null());
    for (ptr, layout) in live {
        assert!(check(ptr, layout.size(), layout.size() as u8));
        // SAFETY: allocated above with this layout.
        unsafe { alloc.dealloc(ptr.as_ptr(), layout) };
    }
    assert_eq!(alloc.debug().nr_bad_frees(), 0);
    alloc.reap_all();
    assert_eq!(source.pages_outstanding(), baseline);
}

#[test]
fn realloc_keeps_contents() {
    let (alloc, _) = setup_default();
    let layout = Layout::from_size_align(40, 8).unwrap();
    // SAFETY: valid layout; each pointer is used per the GlobalAlloc rules.
    unsafe {
        let p = alloc.alloc(layout);
        let ptr = core::ptr::NonNull::new(p).unwrap();
        fill(ptr, 40, 7);
        // Fits in kmalloc-40 and uses more than half of it: kept in place.
        let q = alloc.realloc(p, layout, 36);
        assert_eq!(p, q);
        let r = alloc.realloc(q, Layout::from_size_align(36, 8).unwrap(), 20_000);
        assert!(!r.is_null());
        assert!(check(core::ptr::NonNull::new(r).unwrap(), 36, 7));
        let s = alloc.realloc(r, Layout::from_size_align(20_000, 8).unwrap(), 10);
        assert!(check(core::ptr::NonNull::new(s).unwrap(), 10, 7));
        alloc.dealloc(s, Layout::from_size_align(10, 8).unwrap());
    }
    assert_eq!(alloc.debug().nr_bad_frees(), 0);
}

static BAD_FREES_SEEN: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

fn hook(_: &crate::FreeError) {
    BAD_FREES_SEEN.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
}

#[test]
fn bad_dealloc_is_reported_not_applied() {
    let (alloc, _) = setup_default();
    alloc.debug().set_free_error_hook(Some(hook));
    let layout = Layout::from_size_align(2000, 8).unwrap();
    // SAFETY: valid layout; the first dealloc is a deliberate interior
    // pointer, which is refused (and changes nothing).
    unsafe {
        let p = alloc.alloc(layout);
        alloc.dealloc(p.add(8), layout);
        alloc.dealloc(p, layout);
    }
    assert_eq!(alloc.debug().nr_bad_frees(), 1);
    assert_eq!(BAD_FREES_SEEN.load(std::sync::atomic::Ordering::SeqCst), 1);
}

/// Feature `nightly`: `core::alloc::Allocator`.
#[cfg(feature = "nightly")]
#[test]
fn collections_with_the_allocator_api() {
    let (alloc, source) = setup_default();
    alloc.reap_all();
    let baseline = source.pages_outstanding();
    {
        let mut v: Vec<u64, &'static TestAlloc> = Vec::new_in(alloc);
        for i in 0..10_000u64 {
            v.push(i);
        }
        assert_eq!(v.iter().sum::<u64>(), 10_000 * 9_999 / 2);
        let b = Box::new_in([7u8; 3000], alloc);
        assert!(b.iter().all(|&x| x == 7));
        #[repr(align(4096))]
        struct Page(#[allow(dead_code, reason = "only its alignment is used")] [u8; 4096]);
        let page = Box::new_in(Page([1; 4096]), alloc);
        assert_eq!((&raw const *page) as usize % 4096, 0);
        let zst = Box::new_in((), alloc);
        drop(zst);
    }
    assert_eq!(alloc.debug().nr_bad_frees(), 0);
    alloc.reap_all();
    assert_eq!(source.pages_outstanding(), baseline);
}

/// `realloc` within a size class keeps the block (no copy); leaving the
/// class moves it, contents kept.
#[test]
fn realloc_in_the_same_class_stays_in_place() {
    let (alloc, _) = setup_default();
    let layout = Layout::from_size_align(70, 8).unwrap();
    // SAFETY: valid layouts; every block is freed once.
    unsafe {
        let p = alloc.alloc(layout);
        assert!(!p.is_null());
        p.write_bytes(0x5a, 70);
        // kmalloc-72 serves 65..=72 bytes.
        for size in [72, 65, 68] {
            assert_eq!(alloc.realloc(p, layout, size), p, "{size}");
        }
        let q = alloc.realloc(p, layout, 200);
        assert_ne!(q, p);
        assert!((0..70).all(|i| q.add(i).read() == 0x5a));
        let r = alloc.realloc(q, Layout::from_size_align(200, 8).unwrap(), 40);
        assert_ne!(r, q, "40 bytes fit kmalloc-40: the block shrinks");
        alloc.dealloc(r, Layout::from_size_align(40, 8).unwrap());
    }
    assert_eq!(
        alloc
            .stats()
            .kmalloc_cache_for(72, 8)
            .unwrap()
            .stats()
            .nr_allocated,
        0
    );
}
