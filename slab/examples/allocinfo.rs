//! The last step of docs/ADOPTING.md, on the host: allocation profiling
//! (feature `alloc-profiling` of magpie-slab, and magpie-codetag), from a
//! heap of 100 KiB to an `allocinfo` table — who holds the memory, by
//! call site. A kernel does the same with its own platform.
//!
//! ```text
//! cargo run -p magpie-slab --example allocinfo --target x86_64-unknown-linux-gnu
//! ```

use core::ptr::NonNull;

use magpie_codetag::alloc_tag::{
    self, ALLOC_TAGS, AllocTag, AllocTagCounters, AllocTagRef, UNTAGGED,
};
use magpie_slab::glue::Heap;
use magpie_slab::{PAGE_SIZE, Platform};

/// Per-CPU `{bytes, calls}` of every tag (one CPU here).
static COUNTERS: AllocTagCounters = AllocTagCounters::new();

/// One CPU, one thread, and the three profiling hooks.
struct Profiled;

// SAFETY: only the main thread uses the heap (CPU 0 of 1) and nothing
// interrupts it: interrupts-off sections are trivially exclusive.
unsafe impl Platform for Profiled {
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
    fn context(_buf: &mut [u8; 32]) -> usize {
        0
    }
    // Allocations that name no tag (Box, Vec: the GlobalAlloc path) are
    // charged to the catch-all "untagged" row.
    fn alloc_tag_current() -> Option<AllocTagRef> {
        Some(UNTAGGED.tag_ref())
    }
    fn alloc_tag_add(tag: AllocTagRef, _ptr: NonNull<u8>, bytes: usize) {
        COUNTERS.add(0, tag, bytes);
    }
    fn alloc_tag_sub(tag: AllocTagRef, _ptr: NonNull<u8>, bytes: usize) {
        COUNTERS.sub(0, tag, bytes);
    }
}

static HEAP: Heap<Profiled> = Heap::new();

fn main() {
    let region = Box::leak(vec![0u8; 100 * 1024].into_boxed_slice());
    // SAFETY: the region is ours, writable, and used by the heap alone.
    unsafe { HEAP.init_region(region.as_mut_ptr() as usize, region.len()) }.expect("heap");
    // The counters' memory: 16 bytes a tag a CPU, from the heap's source.
    let bytes = AllocTagCounters::bytes_needed(1);
    let pages = magpie_slab::PageSource::alloc_pages(HEAP.source(), bytes.div_ceil(PAGE_SIZE))
        .expect("counter pages");
    // SAFETY: fresh pages of the source, never freed, used by nothing else.
    assert!(unsafe { COUNTERS.init(pages, bytes.div_ceil(PAGE_SIZE) * PAGE_SIZE, 1) });

    // Call sites that name their tag (a kernel's `kmalloc!` macro does this).
    let buffers: Vec<_> = (0..10)
        .map(|_| {
            let here: &'static AllocTag = magpie_codetag::alloc_tag!();
            HEAP.kmalloc_tagged(300, 8, Some(here.tag_ref()))
                .expect("kmalloc")
        })
        .collect();
    let table = HEAP.kmalloc_tagged(2000, 8, Some(magpie_codetag::alloc_tag!().tag_ref()));

    // allocinfo: every tag with live objects, biggest first.
    let mut rows: Vec<(&AllocTag, alloc_tag::AllocTagCounts)> = ALLOC_TAGS
        .iter()
        .map(|tag| (tag, COUNTERS.read(tag.tag_ref())))
        .filter(|(_, counts)| counts.calls > 0)
        .collect();
    rows.sort_by_key(|(_, counts)| core::cmp::Reverse(counts.bytes));
    let mut out = String::new();
    alloc_tag::write_allocinfo_header(&mut out).unwrap();
    for (tag, counts) in rows {
        alloc_tag::write_allocinfo_row(&mut out, tag, counts, false, false).unwrap();
    }
    print!("{out}");

    for buffer in buffers {
        // SAFETY: from kmalloc_tagged above, not used again.
        unsafe { HEAP.kfree(buffer) }.unwrap();
    }
    // SAFETY: as above.
    unsafe { HEAP.kfree(table.unwrap()) }.unwrap();
}
