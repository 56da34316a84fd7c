//! Allocation profiling in the kernel: call-site counts through every
//! call-site form (kmalloc!, kmem_cache_alloc!, scopes over Box/Vec/String,
//! tagged_alloc! handles), the untagged bucket, the on/off switch, context
//! capture, and the shell's allocinfo and timestats commands.
//!
//! Bytes are class-rounded: `kmalloc!(100)` is charged 104 (kmalloc-104),
//! a cache object its cache's object size, page-granular kmalloc whole pages.
//!
//! With `--no-default-features` (profiling compiled out) the same kernel
//! checks that the macros still allocate and `allocinfo` says so.

#![no_std]
#![no_main]
#![feature(custom_test_frameworks)]
#![feature(allocator_api)]
#![test_runner(magpie::test_runner)]
#![reexport_test_harness_main = "test_main"]
#![allow(
    missing_docs,
    clippy::missing_panics_doc,
    reason = "#[test_case] functions are named for what they check and fail by panicking"
)]

use alloc::string::String;
use alloc::vec::Vec;
use core::ptr::NonNull;

use magpie::kmem::SLAB;
use magpie::shell::Shell;

magpie::test_kernel!();

fn run(line: &str) -> String {
    let mut out = String::new();
    Shell::new().execute(line, &mut out);
    out
}

fn free_all(objs: Vec<NonNull<u8>>) {
    for obj in objs {
        // SAFETY: each pointer came from the slab allocator and is freed once.
        unsafe { SLAB.kfree(obj) }.expect("kfree");
    }
}

/// N = 10 objects of S = 100 bytes from one known call site.
#[inline(never)]
fn ten_from_a_known_site() -> Vec<NonNull<u8>> {
    (0..10)
        .map(|_| magpie::kmalloc!(100).expect("kmalloc"))
        .collect()
}

#[cfg(feature = "alloc-profiling")]
mod profiled {
    use alloc::boxed::Box;
    use alloc::string::{String, ToString};
    use alloc::vec;
    use alloc::vec::Vec;
    use core::ptr::NonNull;

    use magpie::kmem::SLAB;
    use magpie::profiling::{self, SWITCH, counts_of_function, untagged_counts};
    use magpie_codetag::alloc_tag::AllocTagCounts;

    use super::{free_all, run, ten_from_a_known_site};

    /// The first tag in `function`.
    fn tag_of(function: &str) -> &'static magpie_codetag::alloc_tag::AllocTag {
        magpie_codetag::alloc_tag::AllocTag::all()
            .iter()
            .find(|tag| tag.tag.function() == function)
            .unwrap_or_else(|| panic!("no tag in {function}"))
    }

    fn counts(function: &str) -> AllocTagCounts {
        counts_of_function(function).unwrap_or_else(|| panic!("no tag in {function}"))
    }

    #[test_case]
    fn n_objects_from_a_site_show_n_calls_and_n_times_class_size() {
        assert!(SWITCH.is_on(), "on by default (mem_profiling=1)");
        let objs = ten_from_a_known_site();
        // kmalloc(100) comes from kmalloc-104: 10 x 104 bytes.
        assert_eq!(
            counts("ten_from_a_known_site"),
            AllocTagCounts {
                bytes: 1040,
                calls: 10
            }
        );
        let text = run("allocinfo --file tests/alloc_profiling.rs");
        let row = text
            .lines()
            .find(|line| line.ends_with("func:ten_from_a_known_site"))
            .unwrap_or_else(|| panic!("no row in:\n{text}"));
        let fields: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(&fields[..2], &["1040", "10"], "{row}");
        // The site is the caller's kmalloc! line, not the macro's body.
        let line = include_str!("alloc_profiling.rs")
            .lines()
            .position(|line| line.contains("magpie::kmalloc!(100).expect"))
            .expect("the kmalloc! line in this file")
            + 1;
        // (file!() is relative to the kernel package: kernel/../tests/...)
        assert!(
            fields[2].ends_with(&alloc::format!("/tests/alloc_profiling.rs:{line}")),
            "{row}"
        );
        assert!(text.starts_with("allocinfo - version: 1.0\n#     <size>  <calls> <tag info>\n"));
        free_all(objs);
        assert_eq!(counts("ten_from_a_known_site"), AllocTagCounts::default());
    }

    #[inline(never)]
    fn from_a_cache(
        cache: &'static magpie_slab::KmemCache<magpie::kmem::KernelPlatform>,
    ) -> NonNull<u8> {
        magpie::kmem_cache_alloc!(cache).expect("cache alloc")
    }

    #[inline(never)]
    fn page_granular() -> NonNull<u8> {
        magpie::kmalloc!(20_000).expect("large kmalloc")
    }

    #[test_case]
    fn bufctl_and_page_granular_objects_are_counted_and_uncounted() {
        let cache = SLAB
            .cache_create(
                "profiled-1500",
                1500,
                &magpie_slab::CacheArgs {
                    align: 8,
                    ..magpie_slab::CacheArgs::DEFAULT
                },
            )
            .expect("cache");
        let objs: Vec<_> = (0..4).map(|_| from_a_cache(cache)).collect();
        let large = page_granular();
        assert_eq!(
            counts("from_a_cache"),
            AllocTagCounts {
                bytes: 6000,
                calls: 4
            }
        );
        assert_eq!(
            counts("page_granular"),
            AllocTagCounts {
                bytes: 5 * 4096,
                calls: 1
            }
        );
        for obj in objs {
            // SAFETY: allocated from `cache` above, freed once.
            unsafe { cache.free(obj) }.expect("free");
        }
        free_all(vec![large]);
        assert_eq!(counts("from_a_cache"), AllocTagCounts::default());
        assert_eq!(counts("page_granular"), AllocTagCounts::default());
        // SAFETY: empty now; nothing uses it afterwards.
        unsafe { magpie::kmem::cache_destroy(cache) }.expect("destroy");
    }

    #[inline(never)]
    fn outer_scope() -> (Box<[u8; 64]>, Vec<u32>, String, Box<u64>) {
        let _scope = magpie::alloc_tag_scope!();
        let boxed = Box::new([7u8; 64]);
        let inner = inner_scope();
        // Restored after the inner scope ended.
        let string = "scoped".to_string();
        let numbers = vec![1u32, 2, 3, 4];
        (boxed, numbers, string, inner)
    }

    #[inline(never)]
    fn inner_scope() -> Box<u64> {
        let _scope = magpie::alloc_tag_scope!();
        Box::new(5)
    }

    #[test_case]
    fn scopes_charge_box_vec_string_and_the_innermost_wins() {
        let held = outer_scope();
        // Box<[u8; 64]> 64, Vec of 4 u32 16, String of 6 bytes 8.
        assert_eq!(
            counts("outer_scope"),
            AllocTagCounts {
                bytes: 64 + 16 + 8,
                calls: 3
            }
        );
        assert_eq!(counts("inner_scope"), AllocTagCounts { bytes: 8, calls: 1 });
        drop(held);
        assert_eq!(counts("outer_scope"), AllocTagCounts::default());
        assert_eq!(counts("inner_scope"), AllocTagCounts::default());
    }

    #[inline(never)]
    fn with_a_handle() -> (
        Box<[u64; 4], profiling::TaggedAlloc>,
        Vec<u8, profiling::TaggedAlloc>,
    ) {
        let boxed = Box::new_in([1u64; 4], magpie::tagged_alloc!());
        let mut bytes = Vec::with_capacity_in(200, magpie::tagged_alloc!());
        bytes.push(1u8);
        (boxed, bytes)
    }

    #[test_case]
    fn allocator_handles_tag_their_call_site() {
        let (boxed, bytes) = with_a_handle();
        // Two call sites in one function: the first tag found is the Box's.
        let total: u64 = magpie_codetag::alloc_tag::AllocTag::all()
            .iter()
            .filter(|tag| tag.tag.function() == "with_a_handle")
            .map(|tag| profiling::COUNTERS.read(tag.tag_ref()).bytes)
            .sum();
        assert_eq!(
            total,
            32 + 208,
            "Box of 32 bytes, Vec of 200 -> kmalloc-208"
        );
        drop((boxed, bytes));
        assert_eq!(counts("with_a_handle"), AllocTagCounts::default());
    }

    #[test_case]
    fn untagged_allocations_land_in_the_visible_bucket() {
        let before = untagged_counts();
        let loose = core::hint::black_box(Box::new([0u8; 512]));
        let during = untagged_counts();
        assert_eq!(during.calls, before.calls + 1);
        assert_eq!(during.bytes, before.bytes + 512);
        drop(loose);
        assert_eq!(untagged_counts(), before);
        assert!(run("allocinfo").contains(" untagged:0 func:untagged"));
    }

    #[test_case]
    fn switching_off_and_on_never_underflows() {
        assert_eq!(run("allocinfo off"), "allocation profiling off\n");
        let while_off = ten_from_a_known_site();
        assert_eq!(counts("ten_from_a_known_site"), AllocTagCounts::default());
        assert!(run("allocinfo").contains("# profiling is off"));
        assert_eq!(run("allocinfo on"), "allocation profiling on\n");
        assert!(SWITCH.is_inaccurate());
        let while_on = ten_from_a_known_site();
        free_all(while_off);
        // Freeing the untagged objects subtracted nothing.
        assert_eq!(
            counts("ten_from_a_known_site"),
            AllocTagCounts {
                bytes: 1040,
                calls: 10
            }
        );
        let row = run("allocinfo --file tests/alloc_profiling.rs");
        assert!(
            row.contains("func:ten_from_a_known_site accurate:no"),
            "{row}"
        );
        free_all(while_on);
        assert_eq!(counts("ten_from_a_known_site"), AllocTagCounts::default());
    }

    #[test_case]
    fn context_capture_records_each_live_object_of_one_site() {
        let tag = tag_of("ten_from_a_known_site");
        let location = alloc::format!("{}:{}", tag.tag.file, tag.tag.line);
        let enabled = run(&alloc::format!("allocinfo ctx {location} enable"));
        assert!(enabled.starts_with("capturing context of "), "{enabled}");
        let mut objs = ten_from_a_known_site();
        let records = profiling::ctx_records();
        assert_eq!(records.len(), 10);
        assert!(
            records
                .iter()
                .all(|record| record.size == 104 && record.nr_frames > 0)
        );
        free_all(objs.split_off(4));
        let printed = run(&alloc::format!("allocinfo ctx {location} print"));
        assert_eq!(printed.matches("Obj 0x").count(), 4, "{printed}");
        assert!(
            printed.contains("4 live objects recorded, 0 records dropped (capture on)"),
            "{printed}"
        );
        assert!(
            printed.contains("ten_from_a_known_site"),
            "backtraces name the site:\n{printed}"
        );
        run(&alloc::format!("allocinfo ctx {location} disable"));
        assert!(profiling::ctx_records().is_empty());
        free_all(objs);
        assert!(run("allocinfo ctx nowhere.rs:1 print").starts_with("error: no allocation tag"));
    }

    #[test_case]
    fn a_forged_reference_charges_and_uncharges_nothing() {
        // The kernel's charge returns a token (the counter's offset) only
        // for a real tag; the free uses the token unchecked, so a reference
        // past the last tag from a safe caller must charge nothing and
        // leave nothing to uncharge, for a small object, a bufctl object
        // and whole pages alike.
        let forged = magpie_codetag::alloc_tag::AllocTagRef::new(u32::MAX).expect("non-zero");
        let before = profiling::totals();
        for size in [64, 3000, 20_000] {
            let ptr = SLAB
                .kmalloc_with(magpie_slab::KmallocArgs::new(size, 8).tag(Some(forged)))
                .expect("kmalloc");
            assert_eq!(profiling::totals(), before, "{size} bytes");
            // SAFETY: from the slab allocator just above, freed once.
            unsafe { SLAB.kfree(ptr) }.expect("kfree");
            assert_eq!(profiling::totals(), before, "{size} bytes");
        }
    }

    /// `n` boxes of 64 bytes through the global allocator, charged to this
    /// function's scope; each holds its own index in every word.
    #[inline(never)]
    #[expect(
        clippy::vec_box,
        reason = "one global-allocator object per box: the boxes are what is captured"
    )]
    fn boxes_in_a_scope(n: u64) -> Vec<Box<[u64; 8]>> {
        let mut boxes = Vec::with_capacity(n as usize);
        let _scope = magpie::alloc_tag_scope!();
        for index in 0..n {
            boxes.push(Box::new([index; 8]));
        }
        boxes
    }

    #[test_case]
    fn context_capture_through_the_global_allocator_hit() {
        // While a site is captured, every allocation and free leaves the
        // profiled GlobalAlloc hit (`alloc_profiled`, `free_off_hit`, which
        // call out to nothing) for the paths that call the platform's tag
        // hooks, where the capture runs: the records show every box was
        // seen, the boxes' contents and the counts after the frees that
        // nothing else changed.
        let tag = tag_of("boxes_in_a_scope");
        let warm = boxes_in_a_scope(16);
        drop(warm);
        magpie::kmem::ctx_capture_enable(profiling::alloc_tag::token(tag.tag_ref()));
        assert!(
            magpie::kmem::SLAB.profiling().tag_hooks(),
            "capture sends allocations off the hits"
        );
        let mut boxes = boxes_in_a_scope(12);
        let records = profiling::ctx_records();
        // The Vec's buffer is reserved before the scope opens: 12 boxes.
        assert_eq!(records.len(), 12, "one record per box");
        for boxed in &boxes {
            let addr = core::ptr::from_ref::<[u64; 8]>(boxed) as usize;
            assert!(
                records
                    .iter()
                    .any(|record| record.addr == addr && record.size == 64 && record.nr_frames > 0),
                "no record of {addr:#x}"
            );
        }
        // The backtrace reaches the caller.
        assert!(records.iter().all(|record| {
            record.frames[..usize::from(record.nr_frames)]
                .iter()
                .any(|&frame| {
                    magpie::debug::symbols::lookup(frame)
                        .is_some_and(|(name, _)| name.contains("boxes_in_a_scope"))
                })
        }));
        for (index, boxed) in boxes.iter().enumerate() {
            assert_eq!(**boxed, [index as u64; 8]);
        }
        drop(boxes.split_off(5));
        assert_eq!(profiling::ctx_records().len(), 5);
        assert_eq!(
            counts("boxes_in_a_scope"),
            AllocTagCounts {
                bytes: 5 * 64,
                calls: 5
            }
        );
        for (index, boxed) in boxes.iter().enumerate() {
            assert_eq!(**boxed, [index as u64; 8]);
        }
        magpie::kmem::ctx_capture_disable();
        assert!(!magpie::kmem::SLAB.profiling().tag_hooks(), "and back");
        drop(boxes);
        assert!(profiling::ctx_records().is_empty());
        assert_eq!(counts("boxes_in_a_scope"), AllocTagCounts::default());
        assert_eq!(profiling::ctx_nr_dropped(), 0);
    }

    /// N = 5 page frames from one known call site.
    #[inline(never)]
    fn five_frames() -> magpie::mm::frame::PhysAddr {
        magpie::alloc_pages!(5).expect("5 frames")
    }

    /// 3 pages of the kpages arena from one known call site.
    #[inline(never)]
    fn three_kpages() -> NonNull<u8> {
        magpie::kpages_alloc!(3).expect("3 kpages")
    }

    #[test_case]
    fn page_frames_show_at_their_site_as_pages_times_4096_until_freed() {
        use magpie::mm::frame::{self, PAGE_SIZE};
        use magpie_slab::PageSource;

        let first = five_frames();
        assert_eq!(
            counts("five_frames"),
            AllocTagCounts {
                bytes: 5 * 4096,
                calls: 1
            }
        );
        let text = run("allocinfo --function five_frames");
        let row = text
            .lines()
            .find(|line| line.ends_with("func:five_frames"))
            .unwrap_or_else(|| panic!("no row in:\n{text}"));
        let fields: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(&fields[..2], &["20480", "1"], "{row}");
        let line = include_str!("alloc_profiling.rs")
            .lines()
            .position(|line| line.contains("magpie::alloc_pages!(5)"))
            .expect("the alloc_pages! line in this file")
            + 1;
        assert!(
            fields[2].ends_with(&alloc::format!("/tests/alloc_profiling.rs:{line}")),
            "{row}"
        );
        // A sub-range without the first frame gives back its bytes only;
        // the rest (with the first frame) the call too.
        frame::free(first + (3 * PAGE_SIZE) as u64, 2);
        assert_eq!(
            counts("five_frames"),
            AllocTagCounts {
                bytes: 3 * 4096,
                calls: 1
            }
        );
        frame::free(first, 3);
        assert_eq!(counts("five_frames"), AllocTagCounts::default());

        let pages = three_kpages();
        assert_eq!(
            counts("three_kpages"),
            AllocTagCounts {
                bytes: 3 * 4096,
                calls: 1
            }
        );
        // SAFETY: the 3 pages came from KPAGES above and are freed once.
        unsafe { magpie::kmem::KPAGES.free_pages(pages, 3) };
        assert_eq!(counts("three_kpages"), AllocTagCounts::default());
        // The plain calls (the slab allocator's pages) are not counted.
        let totals_before = profiling::totals();
        let plain = frame::alloc_contiguous(4).expect("4 frames");
        assert_eq!(profiling::totals(), totals_before);
        frame::free(plain, 4);
        assert_eq!(profiling::totals(), totals_before);
    }

    #[test_case]
    fn allocinfo_options_and_timestats() {
        let objs = ten_from_a_known_site();
        let top = run("allocinfo --top 1 --sort calls");
        assert_eq!(top.lines().count(), 3, "{top}");
        let human = run("allocinfo -h --file tests/alloc_profiling.rs");
        assert!(human.contains("        1.0K       10 "), "{human}");
        assert_eq!(
            run("allocinfo --sort size"),
            "error: unknown sort key 'size'; expected bytes or calls\n"
        );
        free_all(objs);
        let stats = run("timestats");
        for function in ["func:grow", "func:exchange_for_full"] {
            assert!(stats.contains(function), "{stats}");
        }
        assert!(
            stats.contains("avg duration:") && stats.contains("rate:"),
            "{stats}"
        );
        assert!(
            !stats.contains("cycles"),
            "times in ns/us, never cycles: {stats}"
        );
    }
}

#[cfg(not(feature = "alloc-profiling"))]
#[test_case]
fn compiled_out_macros_still_allocate_and_allocinfo_says_so() {
    let objs = ten_from_a_known_site();
    assert_eq!(objs.len(), 10);
    free_all(objs);
    let _scope = magpie::alloc_tag_scope!();
    let boxed = alloc::boxed::Box::new_in(5u32, magpie::tagged_alloc!());
    assert_eq!(*boxed, 5);
    assert!(run("allocinfo").starts_with("error: allocation profiling is compiled out"));
}
