//! magpie-slab in an ordinary program: a 100 KiB heap from the shipped
//! glue ([`Heap`] over a region), a `Vec` and a `BTreeMap` in it, an
//! object cache, and the statistics a kernel's `kmemstat` prints.
//!
//! ```text
//! cargo run -p magpie-slab --example host_heap --target x86_64-unknown-linux-gnu
//! ```

#![feature(allocator_api, btreemap_alloc)]

use std::collections::BTreeMap;

use magpie_slab::glue::Heap;
use magpie_slab::{Allocator, CacheFlags, PageSource, Platform};

/// One CPU, one thread: "interrupts off" needs nothing.
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
    fn backtrace(_frames: &mut [usize]) -> usize {
        0
    }
    fn context(buf: &mut [u8; 32]) -> usize {
        buf[..4].copy_from_slice(b"main");
        4
    }
}

static HEAP: Heap<OneThread> = Heap::new();
const HEAP_SIZE: usize = 100 * 1024;

fn main() {
    // The "already-mapped region": 100 KiB of the process's memory, for ever.
    let region = Box::leak(vec![0u8; HEAP_SIZE].into_boxed_slice());
    // SAFETY: the region is ours, writable, and used by the heap alone.
    unsafe { HEAP.init_region(region.as_mut_ptr() as usize, region.len()) }.expect("heap");
    let cost = Allocator::<OneThread>::init_cost(HEAP.source()).expect("a span");
    println!("{cost}");

    let heap: &'static Allocator<OneThread> = &HEAP;
    let mut numbers = Vec::new_in(heap);
    numbers.extend(0..1000_u64);
    let mut words = BTreeMap::new_in(heap);
    for (index, word) in ["slab", "magazine", "depot", "bufctl"].iter().enumerate() {
        words.insert(*word, index);
    }
    let dentry = heap
        .cache_create("dentry", 192, 64, CacheFlags::empty(), None, None, None)
        .expect("cache");
    let object = dentry.alloc_box().expect("object").fill(0);
    println!(
        "sum {}, {} words, a {}-byte dentry",
        numbers.iter().sum::<u64>(),
        words.len(),
        object.as_bytes().len()
    );

    heap.for_each_cache(|cache| {
        let stats = cache.stats();
        if stats.nr_slabs > 0 {
            println!(
                "{:<16} {:>5} objects of {:>4} bytes in {} slabs of {} pages",
                cache.name(),
                stats.nr_allocated,
                stats.obj_size,
                stats.nr_slabs,
                stats.nr_pages_per_slab
            );
        }
    });
    let source = HEAP.source().stats();
    println!(
        "heap: {} of {} KiB in use",
        source.alloc_bytes / 1024,
        source.total_bytes / 1024
    );
    drop((object, numbers, words));
}
