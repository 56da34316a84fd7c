//! kmemtrace's rings sized to the page source by default, and starting
//! them safe (issue 17).

use super::small_heap::UpPlatform;
use super::support::*;
use crate::kmemtrace::{DEFAULT_SUBBUFS, SUBBUF_EVENTS, SUBBUF_PAGES};
use crate::kmemtrace::{KmemtraceConfig, KmemtraceError};
use crate::{Kmem, PAGE_SIZE};

#[test]
fn default_rings_take_at_most_a_quarter_of_the_source() {
    // 16 MiB on 4 CPUs: 4 MiB of rings, 1 MiB (16 sub-buffers) per CPU,
    // where 256 per CPU (64 MiB) could never be had.
    let (alloc, source) = setup(4096);
    assert_eq!(alloc.kmemtrace().default_subbufs(), 16);
    let before = source.pages_outstanding();
    alloc.kmemtrace().start(KmemtraceConfig::default()).unwrap();
    assert_eq!(alloc.kmemtrace().status().nr_subbufs, 16);
    assert_eq!(
        alloc.kmemtrace().cpu_status(3).capacity,
        (16 * SUBBUF_EVENTS) as u64
    );
    let taken = source.pages_outstanding() - before;
    assert!(
        taken >= 4 * 16 * SUBBUF_PAGES
            && taken * PAGE_SIZE <= 4096 * PAGE_SIZE / 4 + 16 * PAGE_SIZE
    );
    alloc.kmalloc_box(64, 8).unwrap().free().unwrap();
    assert_eq!(alloc.kmemtrace().status().nr_events, 2);
    alloc.kmemtrace().stop();
}

#[test]
fn a_large_source_keeps_the_16_mib_default() {
    set_cpu(0);
    let source = FakeSource::new(256 * 1024 / 4 * 4);
    let alloc: &'static Kmem<UpPlatform> = std::boxed::Box::leak(std::boxed::Box::new(Kmem::new()));
    assert_eq!(alloc.kmemtrace().default_subbufs(), 0, "before init");
    alloc.init(source).unwrap();
    // 256 MiB on one CPU: a quarter is 64 MiB, more than the default.
    assert_eq!(alloc.kmemtrace().default_subbufs(), DEFAULT_SUBBUFS);
}

#[test]
fn the_smallest_heap_gets_one_sub_buffer_and_a_clear_error() {
    set_cpu(0);
    // The smallest source init takes (68 KiB): 64 KiB of ring does not fit.
    let source = FakeSource::new(crate::MIN_FREE_PAGES + 1);
    let alloc: &'static Kmem<UpPlatform> = std::boxed::Box::leak(std::boxed::Box::new(Kmem::new()));
    alloc.init(source).unwrap();
    assert_eq!(alloc.kmemtrace().default_subbufs(), 1);
    let before = source.pages_outstanding();
    assert_eq!(
        alloc.kmemtrace().start(KmemtraceConfig::default()),
        Err(KmemtraceError::OutOfMemory {
            bytes: SUBBUF_PAGES * PAGE_SIZE
        })
    );
    assert_eq!(source.pages_outstanding(), before, "nothing kept");
    assert!(!alloc.kmemtrace().status().recording);
}
