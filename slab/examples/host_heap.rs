//! magpie-slab in an ordinary program: a 100 KiB heap from the shipped
//! glue ([`Heap`] over a region), a `Vec` and a `BTreeMap` in it, an
//! object cache, the statistics a kernel's `kmemstat` prints, and the
//! last step of docs/ADOPTING.md: allocation profiling (feature
//! `alloc-profiling`, and magpie-codetag) to an `allocinfo` table — who
//! holds the memory, by call site.
//!
//! ```text
//! cargo run -p magpie-slab --example host_heap --target x86_64-unknown-linux-gnu
//! ```

#![feature(allocator_api, btreemap_alloc)]

use core::ptr::NonNull;
use magpie_slab::CacheArgs;
use std::collections::BTreeMap;

use magpie_codetag::alloc_tag::{ALLOC_TAGS, AllocTag, AllocTagCounters, AllocTagRef, UNTAGGED};
use magpie_slab::glue::Heap;
use magpie_slab::reports::{self, AllocinfoOptions, AllocinfoRow, AllocinfoSort};
use magpie_slab::{
    AllocTagHooks, KmallocArgs, Kmem, PAGE_SIZE, PageSource, Platform, PlatformHooks,
};

/// Per-CPU `{bytes, calls}` of every allocation tag (one CPU here).
static COUNTERS: AllocTagCounters = AllocTagCounters::new();

/// One CPU, one thread: "interrupts off" needs nothing. And the three
/// profiling hooks.
struct OneThread;

// SAFETY: only the main thread uses the heap (CPU 0 of 1), and nothing
// interrupts it, so interrupts-off sections are trivially exclusive.
unsafe impl Platform for OneThread {
    fn max_cpus() -> usize {
        1
    }
    fn cpu_id() -> usize {
        0
    }
    fn irq_save() -> usize {
        0
    }
    fn irq_restore(_state: usize) {}
    fn now() -> u64 {
        0
    }
}

// SAFETY: the hooks keep PlatformHooks' contract: the KFENCE pool (if any) is
// mapped and the platform's own, and charge tokens are the ones the token hooks
// return.
unsafe impl PlatformHooks for OneThread {
    fn backtrace(_frames: &mut [usize]) -> usize {
        0
    }
    fn context(buf: &mut [u8; 32]) -> usize {
        buf[..4].copy_from_slice(b"main");
        4
    }
}

// SAFETY: `charge` and `uncharge` accept every token that `token` and
// `current_token` return (the defaults, or as the hooks below say).
unsafe impl AllocTagHooks for OneThread {
    // Allocations that name no tag are charged to the catch-all
    // "untagged" row.
    fn current() -> Option<AllocTagRef> {
        Some(UNTAGGED.tag_ref())
    }

    fn add(tag: AllocTagRef, _ptr: NonNull<u8>, bytes: usize) {
        COUNTERS.add(0, tag, bytes);
    }

    fn sub(tag: AllocTagRef, _ptr: NonNull<u8>, bytes: usize) {
        COUNTERS.sub(0, tag, bytes);
    }
}

static HEAP: Heap<OneThread> = Heap::new();
const HEAP_SIZE: usize = 100 * 1024;

fn main() {
    // The "already-mapped region": 100 KiB of the process's memory, for ever.
    let region = Box::leak(vec![0u8; HEAP_SIZE].into_boxed_slice());
    // SAFETY: the region is ours, writable, and used by the heap alone.
    unsafe { HEAP.init_region(region.as_mut_ptr() as usize, region.len()) }.expect("heap");
    let cost = Kmem::<OneThread>::init_cost(HEAP.source()).expect("a span");
    println!("{cost}");

    let heap: &'static Kmem<OneThread> = &HEAP;
    let mut numbers = Vec::new_in(heap);
    numbers.extend(0..1000_u64);
    let mut words = BTreeMap::new_in(heap);
    for (index, word) in ["slab", "magazine", "depot", "bufctl"].iter().enumerate() {
        words.insert(*word, index);
    }
    let dentry = heap
        .cache_create(
            "dentry",
            192,
            &CacheArgs {
                align: 64,
                ..CacheArgs::DEFAULT
            },
        )
        .expect("cache");
    let object = dentry.alloc_box().expect("object").fill(0);
    println!(
        "sum {}, {} words, a {}-byte dentry",
        numbers.iter().sum::<u64>(),
        words.len(),
        object.as_bytes().len()
    );

    // kmemstat: the page source with every cache beneath it.
    let mut out = String::new();
    reports::kmemstat(&mut out, heap, "region", HEAP.source().stats()).unwrap();
    print!("{out}");
    drop((object, numbers, words));
    allocinfo();
}

/// Allocation profiling: counters, tagged call sites, the table.
fn allocinfo() {
    // The counters' memory: 16 bytes a tag a CPU, from the heap's source.
    let nr_pages = AllocTagCounters::bytes_needed(1).div_ceil(PAGE_SIZE);
    let pages = HEAP.source().alloc_pages(nr_pages).expect("counter pages");
    // SAFETY: fresh pages of the source, never freed, used by nothing else.
    assert!(unsafe { COUNTERS.init(pages, nr_pages * PAGE_SIZE, 1) });

    // Call sites that name their tag (a kernel's `kmalloc!` macro does this).
    let buffers: Vec<_> = (0..10)
        .map(|_| {
            let here: &'static AllocTag = magpie_codetag::alloc_tag!();
            HEAP.kmalloc_with(KmallocArgs::new(300, 8).tag(Some(here.tag_ref())))
                .expect("kmalloc")
        })
        .collect();
    let table = HEAP
        .kmalloc_with(KmallocArgs::new(2000, 8).tag(Some(magpie_codetag::alloc_tag!().tag_ref())));

    // allocinfo: every tag with live objects, biggest first (the rows
    // are reserved beforehand: the report allocates nothing).
    let mut rows = vec![AllocinfoRow::default(); ALLOC_TAGS.len()];
    let options = AllocinfoOptions {
        sort: AllocinfoSort::Bytes,
        filter: reports::AllocinfoFilter {
            min_bytes: Some(1),
            ..Default::default()
        },
        ..Default::default()
    };
    let read = |tag: &'static AllocTag| COUNTERS.read(tag.tag_ref());
    let mut out = String::new();
    reports::allocinfo(&mut out, &ALLOC_TAGS, &read, &mut rows, &options).unwrap();
    print!("{out}");

    for buffer in buffers {
        // SAFETY: from kmalloc_with above, not used again.
        unsafe { HEAP.kfree(buffer) }.unwrap();
    }
    // SAFETY: as above.
    unsafe { HEAP.kfree(table.unwrap()) }.unwrap();
}
