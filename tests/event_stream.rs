//! The kmemtrace event stream (`kmemtrace record`, `kmemtrace dump`) in the
//! real kernel: events of a known workload read back from a dump (the same
//! bytes `kmemtrace dump` sends), call sites that name the allocating
//! function (the frame-pointer walk over the allocator's linker range),
//! nanosecond timestamps, the kernel's build id in the header, stacks,
//! recording off, and the dump channel.

#![no_std]
#![no_main]
#![feature(custom_test_frameworks)]
#![test_runner(magpie::test_runner)]
#![reexport_test_harness_main = "test_main"]
#![allow(
    missing_docs,
    clippy::missing_panics_doc,
    reason = "#[test_case] functions are named for what they check and fail by panicking"
)]

use alloc::boxed::Box;
use alloc::vec::Vec;
use core::ptr::NonNull;

use magpie::arch;
use magpie::debug::symbols;
use magpie::kmem::SLAB;
use magpie::tracing::event_stream;
use magpie_slab::kmemtrace::DumpInfo;
use magpie_slab::kmemtrace::format::KmemtraceEvent;
use magpie_slab::kmemtrace::format::{
    EVENT_SIZE, HEADER_FLAG_STACKS, HEADER_SIZE, KmemtraceHeader, RECORD_CPU, RECORD_STACK,
    RECORD_TRAILER,
};

magpie::test_kernel!();

const ALLOC: u8 = 1;
const FREE: u8 = 2;

/// The dump of the current record, parsed: header, events, stacks.
struct Dump {
    header: KmemtraceHeader,
    events: Vec<KmemtraceEvent>,
    stacks: Vec<(u32, Vec<u64>)>,
}

fn dump() -> Dump {
    let status = SLAB.kmemtrace().status();
    // Reserved up front: the sink must not allocate while the cache list
    // is locked (it would not deadlock, but keep the dump allocation-free).
    let mut bytes: Vec<u8> = Vec::with_capacity(
        (status.nr_events as usize + 64) * EVENT_SIZE + 64 * 1024 + status.nr_stacks * 160,
    );
    let info = DumpInfo {
        build_id: event_stream::build_id(),
        ticks_to_ns: &event_stream::ticks_to_ns,
    };
    let summary = SLAB.kmemtrace().dump(&info, &mut |chunk| {
        assert!(
            bytes.len() + chunk.len() <= bytes.capacity(),
            "dump larger than reserved"
        );
        bytes.extend_from_slice(chunk)
    });
    assert_eq!(summary.nr_bytes as usize, bytes.len());
    let header = KmemtraceHeader::from_bytes(&bytes).expect("header");
    let le32 = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
    let le64 = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap());
    let mut at = HEADER_SIZE;
    let mut events = Vec::new();
    let mut stacks = Vec::new();
    loop {
        let kind = u16::from_le_bytes([bytes[at], bytes[at + 1]]);
        let length = le32(at + 4) as usize;
        match kind {
            RECORD_CPU => {
                let count = le32(at + 12) as usize;
                for index in 0..count {
                    let start = at + 32 + index * EVENT_SIZE;
                    let raw: &[u8; EVENT_SIZE] =
                        bytes[start..start + EVENT_SIZE].try_into().unwrap();
                    events.push(KmemtraceEvent::from_bytes(raw));
                }
            }
            RECORD_STACK => {
                let depth = le32(at + 12) as usize;
                let frames = (0..depth).map(|i| le64(at + 16 + i * 8)).collect();
                stacks.push((le32(at + 8), frames));
            }
            RECORD_TRAILER => {
                assert_eq!(le64(at + 8), events.len() as u64);
                break;
            }
            _ => {}
        }
        at += length;
    }
    Dump {
        header,
        events,
        stacks,
    }
}

fn function_name(address: u64) -> &'static str {
    symbols::lookup(address as usize).map_or("?", |(name, _)| name)
}

#[inline(never)]
fn allocate_here(nr: usize) -> Vec<NonNull<u8>> {
    let mut held = Vec::with_capacity(nr);
    for _ in 0..nr {
        held.push(SLAB.kmalloc(100, 8).expect("kmalloc"));
    }
    held
}

#[inline(never)]
fn free_here(held: Vec<NonNull<u8>>) {
    for ptr in held {
        // SAFETY: from SLAB.kmalloc in allocate_here, freed once.
        unsafe { SLAB.kfree(ptr) }.expect("kfree");
    }
}

#[inline(never)]
fn box_here() -> Box<[u64; 40]> {
    Box::new([7; 40])
}

#[test_case]
fn kmalloc_events_name_the_calling_function_with_exact_sizes() {
    event_stream::start(0, None).expect("start");
    let held = allocate_here(5);
    let addresses: Vec<u64> = held.iter().map(|p| p.as_ptr() as u64).collect();
    free_here(held);
    let boxed = box_here();
    drop(boxed);
    SLAB.kmemtrace().stop();
    let dump = dump();
    assert_ne!(
        dump.header.build_id, [0; 20],
        "kernel linked with a build id"
    );
    let mine: Vec<&KmemtraceEvent> = dump
        .events
        .iter()
        .filter(|e| addresses.contains(&e.ptr))
        .collect();
    let allocs: Vec<_> = mine.iter().filter(|e| e.event == ALLOC).collect();
    let frees: Vec<_> = mine.iter().filter(|e| e.event == FREE).collect();
    assert_eq!((allocs.len(), frees.len()), (5, 5));
    for event in &allocs {
        assert_eq!(
            (event.bytes_req, event.bytes_alloc, event.type_id),
            (100, 104, 1)
        );
        let name = function_name(event.call_site);
        assert!(name.contains("allocate_here"), "alloc call site in {name}");
    }
    for event in &frees {
        let name = function_name(event.call_site);
        assert!(name.contains("free_here"), "free call site in {name}");
    }
    // Box (GlobalAlloc, through alloc's glue) names the function too.
    let boxes: Vec<_> = dump
        .events
        .iter()
        .filter(|e| e.event == ALLOC && e.bytes_req == 320)
        .collect();
    assert!(
        boxes
            .iter()
            .any(|e| function_name(e.call_site).contains("box_here")),
        "Box call site"
    );
}

#[test_case]
fn timestamps_are_nanoseconds_since_boot() {
    let before = event_stream::ticks_to_ns(arch::rdtsc());
    event_stream::start(0, None).expect("start");
    free_here(allocate_here(3));
    SLAB.kmemtrace().stop();
    let after = event_stream::ticks_to_ns(arch::rdtsc());
    let dump = dump();
    assert!(dump.header.record_start_ns >= before && dump.header.record_start_ns <= after);
    for event in &dump.events {
        assert!(event.timestamp_ns >= before && event.timestamp_ns <= after);
    }
    // Boot took more than a millisecond of TSC time: these are not ticks
    // of a 1 GHz-or-faster clock divided wrongly, but plausible ns.
    assert!(before > 1_000_000, "ns since boot: {before}");
}

#[test_case]
fn stacks_start_at_the_call_site_and_are_deduplicated() {
    event_stream::start(4, None).expect("start with stacks");
    free_here(allocate_here(6));
    SLAB.kmemtrace().stop();
    let dump = dump();
    assert_eq!(dump.header.flags & HEADER_FLAG_STACKS, HEADER_FLAG_STACKS);
    let allocs: Vec<_> = dump
        .events
        .iter()
        .filter(|e| e.event == ALLOC && e.bytes_req == 100)
        .collect();
    assert_eq!(allocs.len(), 6);
    let ids: Vec<u32> = allocs.iter().map(|e| e.stack_id).collect();
    assert!(
        ids.iter().all(|&id| id == ids[0] && id != 0),
        "one stack: {ids:?}"
    );
    let (_, frames) = dump
        .stacks
        .iter()
        .find(|(id, _)| *id == ids[0])
        .expect("stack record");
    assert_eq!(frames[0], allocs[0].call_site);
    assert!(frames.len() >= 2 && frames.len() <= 4);
    assert!(function_name(frames[1]).contains("stacks_start_at_the_call_site"));
}

#[test_case]
fn recording_off_records_nothing() {
    event_stream::start(0, None).expect("start");
    SLAB.kmemtrace().stop();
    let before = SLAB.kmemtrace().status().nr_events;
    free_here(allocate_here(10));
    assert_eq!(SLAB.kmemtrace().status().nr_events, before);
}

/// The runner connects a virtio console; the channel is set up before the
/// dump (at boot), and the dump goes out over it.
#[test_case]
fn dump_goes_out_over_the_virtio_console_set_up_at_boot() {
    assert_eq!(
        event_stream::dump_channel(),
        Some(event_stream::Channel::VirtioConsole)
    );
    event_stream::start(0, None).expect("start");
    free_here(allocate_here(2));
    SLAB.kmemtrace().stop();
    let (summary, channel) = event_stream::dump().expect("dump");
    assert_eq!(channel, event_stream::Channel::VirtioConsole);
    assert_eq!(summary.nr_events, SLAB.kmemtrace().status().nr_events);
    assert!(summary.nr_bytes >= (HEADER_SIZE + 4 * EVENT_SIZE) as u64);
}
