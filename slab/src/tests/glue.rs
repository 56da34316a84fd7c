//! The shipped glue: [`RegionSource`] and [`Heap`] on a host buffer, one CPU.

use core::alloc::{GlobalAlloc, Layout};
use core::ptr::NonNull;
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
    // The refused heap forgot the region: the figures come from a source
    // given the same size of region.
    let source: &'static RegionSource<UpPlatform> = Box::leak(Box::new(RegionSource::new()));
    source.init_static(region(8)).unwrap();
    let cost = crate::Kmem::<UpPlatform>::init_cost(source).unwrap();
    assert_eq!(cost.min_source_bytes, 68 * 1024);
    assert_eq!(cost.span_bytes, 7 * PAGE_SIZE);
}

/// Issue 29: a refused `init_region` leaves the heap as it was, so a
/// retry with a larger region works (it used to answer
/// `AlreadyInitialized` for ever, the heap never ready).
#[test]
fn heap_init_region_is_retried_after_a_region_too_small() {
    set_cpu(0);
    let heap: &'static Heap<UpPlatform> = Box::leak(Box::new(Heap::new()));
    let small = region(8); // 32 KiB
    let range = small.as_mut_ptr_range();
    // SAFETY: leaked host memory, ours for ever.
    let refused = unsafe { heap.init_region(range.start as usize, 8 * PAGE_SIZE) };
    assert_eq!(refused, Err(AllocError::SourceTooSmall));
    assert!(!heap.is_ready());
    assert_eq!(heap.source().span(), (0, 0), "the source forgot the region");
    assert_eq!(heap.source().stats().total_bytes, 0);
    let large = region(256); // 1 MiB
    let start = large.as_mut_ptr() as usize;
    // SAFETY: as above.
    unsafe { heap.init_region(start, 256 * PAGE_SIZE) }.expect("the retry");
    assert!(heap.is_ready());
    let (span_start, span_end) = heap.source().span();
    assert!(span_start >= start && span_end <= start + 256 * PAGE_SIZE);
    let layout = Layout::from_size_align(100, 8).unwrap();
    // SAFETY: a valid layout.
    let ptr = unsafe { heap.alloc(layout) };
    assert!(!ptr.is_null());
    assert!((span_start..span_end).contains(&(ptr as usize)));
    // SAFETY: allocated above with this layout.
    unsafe { heap.dealloc(ptr, layout) };
    // A second init after success is refused and changes nothing.
    // SAFETY: as above.
    let again = unsafe { heap.init_region(region(256).as_mut_ptr() as usize, 256 * PAGE_SIZE) };
    assert_eq!(again, Err(AllocError::AlreadyInitialized));
    assert_eq!(heap.source().span(), (span_start, span_end));
    heap.debug().check_invariants().unwrap();
}

/// As above through `init_static`.
#[test]
fn heap_init_static_is_retried_after_a_region_too_small() {
    set_cpu(0);
    let heap: &'static Heap<UpPlatform> = Box::leak(Box::new(Heap::new()));
    assert_eq!(heap.init_static(region(8)), Err(AllocError::SourceTooSmall));
    assert!(!heap.is_ready());
    assert_eq!(heap.source().span(), (0, 0));
    heap.init_static(region(256)).expect("the retry");
    assert!(heap.is_ready());
    let boxed = heap.kmalloc_box(64, 8).expect("kmalloc after the retry");
    boxed.free().unwrap();
    assert_eq!(
        heap.init_static(region(256)),
        Err(AllocError::AlreadyInitialized)
    );
}

/// A region source whose `init` is refused keeps no region, and one that
/// was given a region refuses another without changing.
#[test]
fn region_source_refused_init_changes_nothing() {
    let source: &'static RegionSource<UpPlatform> = Box::leak(Box::new(RegionSource::new()));
    assert_eq!(
        source.init_static(&mut region(2)[..PAGE_SIZE]),
        Err(AllocError::InvalidLayout)
    );
    assert_eq!(source.span(), (0, 0));
    source.init_static(region(4)).unwrap();
    let span = source.span();
    assert_eq!(
        source.init_static(region(4)),
        Err(AllocError::AlreadyInitialized)
    );
    assert_eq!(source.span(), span);
}

#[test]
fn region_source_resizes_a_run_in_place() {
    set_cpu(0);
    let source: &'static RegionSource<UpPlatform> = Box::leak(Box::new(RegionSource::new()));
    source.init_static(region(10)).unwrap();
    // 9 pages to hand out (the first is the bitmap).
    let a = source.alloc_pages(2).unwrap();
    // SAFETY: a is a live run of 2 pages of this source, and so on below.
    unsafe {
        assert!(source.resize_pages(a, 2, 5), "the pages after it are free");
        assert_eq!(source.stats().alloc_bytes, 5 * PAGE_SIZE);
        let b = source.alloc_pages(1).unwrap();
        assert_eq!(b.as_ptr() as usize, a.as_ptr() as usize + 5 * PAGE_SIZE);
        assert!(!source.resize_pages(a, 5, 6), "the next page is taken");
        assert_eq!(source.stats().alloc_bytes, 6 * PAGE_SIZE, "nothing changed");
        assert!(!source.resize_pages(b, 1, 10), "past the region");
        assert!(
            source.resize_pages(a, 5, 1),
            "a shrink gives the last pages back"
        );
        assert_eq!(source.stats().alloc_bytes, 2 * PAGE_SIZE);
        assert_eq!(
            source.alloc_pages(4).unwrap().as_ptr() as usize,
            a.as_ptr() as usize + PAGE_SIZE,
            "the pages given back are reused"
        );
        assert!(!source.resize_pages(a, 1, 0), "a run keeps a page");
    }
}

#[test]
fn realloc_grows_and_shrinks_a_page_granular_block_in_place() {
    set_cpu(0);
    let heap: &'static Heap<UpPlatform> = Box::leak(Box::new(Heap::new()));
    heap.init_static(region(200)).unwrap();
    let layout = Layout::from_size_align(20_000, 8).unwrap();
    // SAFETY: valid layouts; every block is used within its size and
    // given back once.
    unsafe {
        let block = heap.alloc(layout);
        assert!(!block.is_null());
        for i in 0..20_000 {
            block.add(i).write(i as u8);
        }
        let live = heap.stats().large().live_bytes;
        let grown = heap.realloc(block, layout, 100_000);
        assert_eq!(grown, block, "grown in place: the pages after it are free");
        assert_eq!(heap.stats().large().live_bytes, live + 20 * PAGE_SIZE);
        assert_eq!(
            heap.ksize(core::ptr::NonNull::new(grown).unwrap()),
            Ok(25 * PAGE_SIZE)
        );
        assert!((0..20_000).all(|i| grown.add(i).read() == i as u8));
        grown.add(99_999).write(7);
        // A pointer into the grown part is inside the block, not ours to free.
        let inner = core::ptr::NonNull::new(grown.add(20 * PAGE_SIZE)).unwrap();
        assert!(heap.owns(inner.as_ptr()));
        assert!(matches!(
            heap.kfree(inner),
            Err(crate::FreeError::Misaligned { .. })
        ));
        let big = Layout::from_size_align(100_000, 8).unwrap();
        let shrunk = heap.realloc(grown, big, 9000);
        assert_eq!(shrunk, block, "shrunk in place");
        assert_eq!(heap.stats().large().live_bytes, live - 2 * PAGE_SIZE);
        assert!((0..9000).all(|i| shrunk.add(i).read() == i as u8));
        // Another block right after it: growing must move now.
        let small = Layout::from_size_align(9000, 8).unwrap();
        let next = heap.alloc(small);
        assert_eq!(next as usize, block as usize + 3 * PAGE_SIZE);
        let moved = heap.realloc(shrunk, small, 50_000);
        assert!(!moved.is_null() && moved != block);
        assert!((0..9000).all(|i| moved.add(i).read() == i as u8));
        heap.dealloc(moved, Layout::from_size_align(50_000, 8).unwrap());
        heap.dealloc(next, small);
    }
    assert_eq!(heap.stats().large().nr_live, 0);
    heap.debug().check_invariants().unwrap();
}

#[test]
fn realloc_past_a_page_takes_whole_pages_that_grow_in_place() {
    set_cpu(0);
    let heap: &'static Heap<UpPlatform> = Box::leak(Box::new(Heap::new()));
    heap.init_static(region(200)).unwrap();
    let small = Layout::from_size_align(3000, 8).unwrap();
    // SAFETY: valid layouts; every block is used within its size and
    // given back once.
    unsafe {
        let block = heap.alloc(small);
        assert!(!block.is_null());
        for i in 0..3000 {
            block.add(i).write(i as u8);
        }
        let live = heap.stats().large();
        // Past a page: moved (a slab object cannot grow) to whole pages.
        let pages = heap.realloc(block, small, 6000);
        assert!(!pages.is_null() && pages != block);
        assert!(pages.addr().is_multiple_of(PAGE_SIZE));
        let pages_nn = NonNull::new(pages).unwrap();
        assert_eq!(heap.ksize(pages_nn), Ok(2 * PAGE_SIZE), "whole pages");
        assert_eq!(heap.stats().large().nr_live, live.nr_live + 1);
        assert!((0..3000).all(|i| pages.add(i).read() == i as u8));
        // Its next growths copy nothing.
        let grown = heap.realloc(pages, Layout::from_size_align(6000, 8).unwrap(), 12_000);
        assert_eq!(grown, pages, "grown in place");
        let grown = heap.realloc(grown, Layout::from_size_align(12_000, 8).unwrap(), 24_000);
        assert_eq!(grown, pages, "grown in place again");
        assert_eq!(heap.ksize(pages_nn), Ok(6 * PAGE_SIZE));
        assert!((0..3000).all(|i| grown.add(i).read() == i as u8));
        let big = Layout::from_size_align(24_000, 8).unwrap();
        // Bad pointers are refused as before, and change nothing: a
        // pointer into the grown pages, then (after the free) the block
        // again.
        let inner = NonNull::new(grown.add(4 * PAGE_SIZE)).unwrap();
        assert!(matches!(
            heap.kfree(inner),
            Err(crate::FreeError::Misaligned { .. })
        ));
        assert_eq!(heap.ksize(pages_nn), Ok(6 * PAGE_SIZE), "still whole");
        assert!(matches!(
            heap.krealloc(Some(inner), 50_000, 8),
            Err(AllocError::InvalidLayout)
        ));
        assert_eq!(heap.ksize(pages_nn), Ok(6 * PAGE_SIZE), "still whole");
        heap.dealloc(grown, big);
        assert!(matches!(
            heap.kfree(pages_nn),
            Err(crate::FreeError::DoubleFree { .. })
        ));
        assert_eq!(heap.stats().large().nr_live, live.nr_live);
        assert_eq!(heap.stats().large().live_bytes, live.live_bytes);
        // A growth within a page keeps a size class.
        let b = heap.alloc(small);
        let c = heap.realloc(b, small, 4000);
        assert!(!c.is_null());
        assert_eq!(heap.stats().large().nr_live, live.nr_live, "a size class");
        heap.dealloc(c, Layout::from_size_align(4000, 8).unwrap());
    }
    assert_eq!(heap.stats().large().nr_live, 0);
    heap.debug().check_invariants().unwrap();
}

#[test]
fn region_source_finds_first_fit_runs_across_bitmap_words() {
    set_cpu(0);
    // 199 pages to hand out: four bitmap words, the last one partial.
    let source: &'static RegionSource<UpPlatform> = Box::leak(Box::new(RegionSource::new()));
    source.init_static(region(200)).unwrap();
    let (base, end) = source.span();
    let nr_pages = (end - base) / PAGE_SIZE;
    assert_eq!(nr_pages, 199);
    // The model: a flag a page, first fit by brute force.
    let mut used = std::vec![false; nr_pages];
    let first_fit =
        |used: &[bool], n: usize| (0..=nr_pages - n).find(|&p| !used[p..p + n].contains(&true));
    // alloc_pages_to_grow: halfway along the free run that ends highest,
    // else first fit (page by page from the top).
    let to_grow = |used: &[bool], n: usize| {
        let mut end = nr_pages;
        while end > 0 && used[end - 1] {
            end -= 1;
        }
        let mut start = end;
        while start > 0 && !used[start - 1] {
            start -= 1;
        }
        if end - start >= n {
            Some(start + (end - start - n) / 2)
        } else {
            first_fit(used, n)
        }
    };
    let mut live: Vec<(usize, usize)> = Vec::new();
    let mut seed = 0x2545_f491_u64;
    for step in 0..3000 {
        seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        let pick = (seed >> 33) as usize;
        if live.is_empty() || pick % 5 < 3 {
            // Runs of 1..=70 pages: some longer than a word, most short.
            let n = if pick.is_multiple_of(7) {
                1 + pick / 7 % 70
            } else {
                1 + pick / 7 % 4
            };
            let grow = pick % 5 == 2;
            let expected = match (n <= nr_pages, grow) {
                (false, _) => None,
                (true, false) => first_fit(&used, n),
                (true, true) => to_grow(&used, n),
            };
            let got = if grow {
                source.alloc_pages_to_grow(n)
            } else {
                source.alloc_pages(n)
            };
            match (got, expected) {
                (Ok(pages), Some(page)) => {
                    assert_eq!(
                        pages.as_ptr() as usize,
                        base + page * PAGE_SIZE,
                        "step {step}: {n} pages (to grow: {grow})"
                    );
                    used[page..page + n].fill(true);
                    live.push((page, n));
                }
                (Err(AllocError::OutOfMemory), None) => {}
                (got, want) => panic!("step {step}: {n} pages: got {got:?}, model {want:?}"),
            }
        } else {
            let (page, n) = live.swap_remove(pick % live.len());
            // SAFETY: a run alloc_pages gave, freed once.
            unsafe {
                source.free_pages(
                    NonNull::new((base + page * PAGE_SIZE) as *mut u8).unwrap(),
                    n,
                )
            };
            used[page..page + n].fill(false);
        }
        let nr_used = used.iter().filter(|&&u| u).count();
        assert_eq!(
            source.stats().alloc_bytes,
            nr_used * PAGE_SIZE,
            "step {step}"
        );
    }
    // The last page is handed out, the bits past it never are.
    for (page, n) in live.drain(..) {
        // SAFETY: as above.
        unsafe {
            source.free_pages(
                NonNull::new((base + page * PAGE_SIZE) as *mut u8).unwrap(),
                n,
            )
        };
    }
    let all = source.alloc_pages(nr_pages).unwrap();
    assert_eq!(all.as_ptr() as usize, base);
    assert_eq!(source.alloc_pages(1), Err(AllocError::OutOfMemory));
}
