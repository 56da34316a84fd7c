//! The shipped glue: [`RegionSource`] and [`Heap`] on a host buffer, one CPU.

use core::alloc::{GlobalAlloc, Layout};
use std::boxed::Box;
use std::vec::Vec;

use super::small_heap::UpPlatform;
use super::support::set_cpu;
use crate::glue::{Heap, RegionSource};
use crate::{AllocError, PAGE_SIZE, PageSource};

/// `nr_pages` pages of leaked host memory, page-aligned.
fn region(nr_pages: usize) -> &'static mut [u8] {
    let memory = Vec::leak(std::vec![0u8; (nr_pages + 1) * PAGE_SIZE]);
    let start = memory.as_ptr().align_offset(PAGE_SIZE);
    &mut memory[start..start + nr_pages * PAGE_SIZE]
}

#[test]
fn region_source_hands_out_runs_and_takes_them_back() {
    set_cpu(0);
    let source: &'static RegionSource<UpPlatform> = Box::leak(Box::new(RegionSource::new()));
    assert_eq!(source.span(), (0, 0));
    assert_eq!(source.alloc_pages(1), Err(AllocError::OutOfMemory));
    // Unaligned on both ends: 10 whole pages inside, the first is the bitmap.
    let memory = region(12);
    let base = memory.as_ptr() as usize;
    source
        .init_static(&mut memory[100..100 + 11 * PAGE_SIZE])
        .unwrap();
    assert_eq!(source.span(), (base + 2 * PAGE_SIZE, base + 11 * PAGE_SIZE));
    assert_eq!(source.stats().total_bytes, 9 * PAGE_SIZE);
    let again = source.init_static(region(12));
    assert_eq!(again, Err(AllocError::AlreadyInitialized));
    let a = source.alloc_pages(3).unwrap();
    let b = source.alloc_pages(2).unwrap();
    assert_eq!(a.as_ptr() as usize, base + 2 * PAGE_SIZE);
    assert_eq!(b.as_ptr() as usize, a.as_ptr() as usize + 3 * PAGE_SIZE);
    // SAFETY: pages are ours: the whole run is writable.
    unsafe { core::ptr::write_bytes(a.as_ptr(), 0xaa, 3 * PAGE_SIZE) };
    assert_eq!(source.alloc_pages(5), Err(AllocError::OutOfMemory));
    let c = source.alloc_pages(4).unwrap();
    assert_eq!(source.stats().alloc_bytes, 9 * PAGE_SIZE);
    assert_eq!(source.alloc_pages(1), Err(AllocError::OutOfMemory));
    // SAFETY: from alloc_pages(3), not used again.
    unsafe { source.free_pages(a, 3) };
    // The freed run is reused first fit, in part.
    assert_eq!(source.alloc_pages(2).unwrap(), a);
    // SAFETY: as above.
    unsafe {
        source.free_pages(b, 2);
        source.free_pages(c, 4);
    }
    assert_eq!(source.stats().alloc_bytes, 2 * PAGE_SIZE);
    assert_eq!(source.stats().nr_allocs_ever, 4);
}

#[test]
fn region_source_refuses_a_region_without_a_page_to_give() {
    let source: &'static RegionSource<UpPlatform> = Box::leak(Box::new(RegionSource::new()));
    let one_page = source.init_static(&mut region(2)[..PAGE_SIZE]);
    assert_eq!(one_page, Err(AllocError::InvalidLayout));
    let unaligned = source.init_static(&mut region(2)[1..]);
    assert_eq!(unaligned, Err(AllocError::InvalidLayout));
}

#[test]
fn heap_adopts_a_region_in_one_call() {
    set_cpu(0);
    let heap: &'static Heap<UpPlatform> = Box::leak(Box::new(Heap::new()));
    let layout = Layout::from_size_align(40, 8).unwrap();
    // SAFETY: a valid layout; null before init.
    assert!(unsafe { heap.alloc(layout) }.is_null());
    heap.init_static(region(25)).unwrap();
    assert!(heap.is_ready());
    let mut objects = Vec::new();
    for size in [8, 40, 100, 832, 4000, 8192, 20000] {
        let layout = Layout::from_size_align(size, 8).unwrap();
        // SAFETY: a valid layout.
        let ptr = unsafe { heap.alloc_zeroed(layout) };
        assert!(!ptr.is_null(), "{size}");
        objects.push((ptr, layout));
    }
    for (ptr, layout) in objects {
        // SAFETY: allocated above with this layout.
        unsafe { heap.dealloc(ptr, layout) };
    }
    heap.debug().check_invariants().unwrap();
    assert!(heap.find_cache("kmalloc-832").is_some());
}

#[test]
fn heap_refuses_a_region_too_small_with_the_figures() {
    set_cpu(0);
    let heap: &'static Heap<UpPlatform> = Box::leak(Box::new(Heap::new()));
    let result = heap.init_static(region(8));
    assert_eq!(result, Err(AllocError::SourceTooSmall));
    let cost = crate::Allocator::<UpPlatform>::init_cost(heap.source()).unwrap();
    assert_eq!(cost.min_source_bytes, 68 * 1024);
    assert_eq!(cost.span_bytes, 7 * PAGE_SIZE);
}
