//! kmemtrace: events from every hook, per-CPU rings and overruns, the dump
//! format (parsed back here, checksum checked), stacks, recording off.

use crate::CacheArgs;
use std::ptr::NonNull;
use std::vec::Vec;

use super::support::*;
use crate::kmemtrace::format::{
    EVENT_SIZE, HEADER_FLAG_STACKS, HEADER_SIZE, KmemtraceEvent, KmemtraceHeader, RECORD_CACHE,
    RECORD_CPU, RECORD_STACK, RECORD_TRAILER, TRAILER_SIZE,
};
use crate::kmemtrace::{DumpInfo, KmemtraceConfig, KmemtraceError, SUBBUF_EVENTS};
use crate::{CacheFlags, FreeError, PAGE_SIZE};

const ALLOC: u8 = 1;
const FREE: u8 = 2;
const FAILED: u8 = 3;
const BAD_FREE: u8 = 4;
const KMALLOC: u8 = 1;
const CACHE: u8 = 2;
const PAGES: u8 = 3;

fn start(alloc: &'static TestAlloc, config: KmemtraceConfig) {
    alloc.kmemtrace().start(config).expect("kmemtrace start");
}

fn small(nr_subbufs: usize) -> KmemtraceConfig {
    KmemtraceConfig {
        nr_subbufs,
        ..KmemtraceConfig::default()
    }
}

/// A dump read back: header, caches (id, name), stacks, events per CPU
/// record, trailer fields; panics on any structural error.
struct Parsed {
    header: KmemtraceHeader,
    caches: Vec<(u32, u32, std::string::String)>,
    stacks: Vec<(u32, Vec<u64>)>,
    /// (cpu, nr_overruns, events) per CPU record.
    cpus: Vec<(u32, u64, Vec<KmemtraceEvent>)>,
    trailer: (u64, u64, u64, u32),
}

fn le32(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap())
}
fn le64(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap())
}

fn parse(bytes: &[u8]) -> Parsed {
    let header = KmemtraceHeader::from_bytes(bytes).unwrap();
    assert_eq!(le32(bytes, 12) as usize, HEADER_SIZE);
    assert_eq!(le32(bytes, 16) as usize, EVENT_SIZE);
    let mut parsed = Parsed {
        header,
        caches: Vec::new(),
        stacks: Vec::new(),
        cpus: Vec::new(),
        trailer: (0, 0, 0, 0),
    };
    let mut at = HEADER_SIZE;
    let mut nr_records = 0;
    loop {
        let kind = u16::from_le_bytes([bytes[at], bytes[at + 1]]);
        let length = le32(bytes, at + 4) as usize;
        assert_eq!(length % 8, 0, "record length {length} not a multiple of 8");
        let body = &bytes[at + 8..at + length];
        match kind {
            RECORD_CACHE => {
                let name_len = le32(body, 16) as usize;
                let name = std::str::from_utf8(&body[24..24 + name_len]).unwrap();
                parsed
                    .caches
                    .push((le32(body, 0), le32(body, 4), name.into()));
            }
            RECORD_STACK => {
                let depth = le32(body, 4) as usize;
                let frames = (0..depth).map(|i| le64(body, 8 + i * 8)).collect();
                parsed.stacks.push((le32(body, 0), frames));
            }
            RECORD_CPU => {
                let count = le32(body, 4) as usize;
                assert_eq!(length, 8 + 24 + count * EVENT_SIZE);
                let events = (0..count)
                    .map(|i| {
                        let start = 24 + i * EVENT_SIZE;
                        KmemtraceEvent::from_bytes(
                            body[start..start + EVENT_SIZE].try_into().unwrap(),
                        )
                    })
                    .collect();
                parsed.cpus.push((le32(body, 0), le64(body, 8), events));
            }
            RECORD_TRAILER => {
                assert_eq!(length, TRAILER_SIZE);
                assert_eq!(at + length, bytes.len(), "bytes after the trailer");
                parsed.trailer = (le64(body, 0), le64(body, 8), le64(body, 16), le32(body, 24));
                assert_eq!(crc32fast::hash(&bytes[..at]), parsed.trailer.3, "checksum");
                assert_eq!(parsed.trailer.2, nr_records);
                return parsed;
            }
            other => panic!("unknown record kind {other}"),
        }
        nr_records += 1;
        at += length;
    }
}

fn dump(alloc: &'static TestAlloc) -> (Vec<u8>, crate::kmemtrace::DumpSummary) {
    let mut bytes = Vec::new();
    let ticks_to_ns = |ticks: u64| ticks * 10;
    let info = DumpInfo {
        build_id: [0xab; 20],
        ticks_to_ns: &ticks_to_ns,
    };
    let summary = alloc
        .kmemtrace()
        .dump(&info, &mut |chunk| bytes.extend_from_slice(chunk));
    assert_eq!(summary.nr_bytes as usize, bytes.len());
    (bytes, summary)
}

fn events(parsed: &Parsed) -> Vec<KmemtraceEvent> {
    parsed
        .cpus
        .iter()
        .flat_map(|(_, _, events)| events.iter().copied())
        .collect()
}

#[test]
fn kmalloc_and_kfree_events_carry_sizes_cache_and_call_site() {
    let (alloc, _) = setup_default();
    set_caller(0xffff_8000_0000_1000);
    start(alloc, small(2));
    let obj = alloc.kmalloc_box(125, 8).unwrap();
    let p = obj.as_ptr();
    set_cpu(1);
    set_caller(0xffff_8000_0000_2000);
    obj.free().unwrap();
    set_cpu(0);
    alloc.kmemtrace().stop();
    let (bytes, summary) = dump(alloc);
    let parsed = parse(&bytes);
    assert_eq!(summary.nr_events, 2);
    assert_eq!(parsed.header.build_id, [0xab; 20]);
    assert_eq!(parsed.header.nr_cpus as usize, NR_CPUS);
    assert_eq!(
        parsed.cpus.len(),
        NR_CPUS,
        "one record per CPU, empty ones too"
    );
    let kmalloc_128 = alloc.find_cache("kmalloc-128").unwrap().id();
    assert!(
        parsed
            .caches
            .iter()
            .any(|(id, size, name)| *id == kmalloc_128 && *size == 128 && name == "kmalloc-128")
    );
    let all = events(&parsed);
    let (a, f) = (all[0], all[1]);
    assert_eq!(
        (a.event, a.type_id, a.cpu, a.cache_id),
        (ALLOC, KMALLOC, 0, kmalloc_128)
    );
    assert_eq!(
        (a.ptr, a.bytes_req, a.bytes_alloc),
        (p.as_ptr() as u64, 125, 128)
    );
    assert_eq!(
        (a.call_site, a.seq, a.stack_id),
        (0xffff_8000_0000_1000, 0, 0)
    );
    assert_eq!(
        (f.event, f.type_id, f.cpu, f.cache_id),
        (FREE, KMALLOC, 1, kmalloc_128)
    );
    assert_eq!(
        (f.ptr, f.bytes_req, f.bytes_alloc),
        (p.as_ptr() as u64, 0, 128)
    );
    assert_eq!(f.call_site, 0xffff_8000_0000_2000);
    // Timestamps went through ticks_to_ns (x10 here).
    assert!(a.timestamp_ns % 10 == 0 && f.timestamp_ns > a.timestamp_ns);
    assert!(parsed.header.record_start_ns <= a.timestamp_ns);
}

#[test]
fn cache_pages_global_and_failed_allocations() {
    let (alloc, source) = setup_default();
    let cache = alloc
        .cache_create("inode", 200, &CacheArgs::DEFAULT)
        .unwrap();
    start(alloc, small(2));
    cache.alloc_box().unwrap().free().unwrap();
    alloc.kmalloc_box(10_000, 8).unwrap().free().unwrap();
    let layout = core::alloc::Layout::new::<u64>();
    // SAFETY: a valid non-zero layout; the block is freed once, with it.
    unsafe {
        core::alloc::GlobalAlloc::dealloc(
            alloc,
            core::alloc::GlobalAlloc::alloc(alloc, layout),
            layout,
        )
    };
    source.set_fail(true);
    let _ = alloc.kmalloc(100_000, 8).unwrap_err();
    source.set_fail(false);
    alloc.kmemtrace().stop();
    let parsed = parse(&dump(alloc).0);
    let got: Vec<_> = events(&parsed)
        .iter()
        .map(|e| (e.event, e.type_id, e.cache_id, e.bytes_req, e.bytes_alloc))
        .collect();
    let kmalloc_8 = alloc.find_cache("kmalloc-8").unwrap().id();
    assert_eq!(
        got,
        [
            (ALLOC, CACHE, cache.id(), 200, 200),
            (FREE, CACHE, cache.id(), 0, 200),
            (ALLOC, PAGES, 0, 10_000, 3 * PAGE_SIZE as u64),
            (FREE, PAGES, 0, 0, 3 * PAGE_SIZE as u64),
            (ALLOC, KMALLOC, kmalloc_8, 8, 8),
            (FREE, KMALLOC, kmalloc_8, 0, 8),
            (FAILED, PAGES, 0, 100_000, 0),
        ]
    );
    // Sequence numbers count up per CPU.
    let seqs: Vec<_> = events(&parsed).iter().map(|e| e.seq).collect();
    assert_eq!(seqs, (0..7).collect::<Vec<_>>());
}

#[test]
fn bad_frees_are_recorded_and_still_refused() {
    let (alloc, _) = setup_default();
    let bufctl = alloc
        .cache_create(
            "big",
            2048,
            &CacheArgs {
                flags: CacheFlags::AUDIT,
                ..CacheArgs::DEFAULT
            },
        )
        .unwrap();
    start(alloc, small(1));
    let boxed = bufctl.alloc_box().unwrap();
    let obj = boxed.as_ptr();
    boxed.free().unwrap();
    // SAFETY: a double free, detected for AUDIT caches.
    let error = unsafe { bufctl.free(obj) }.unwrap_err();
    assert!(matches!(error, FreeError::DoubleFree { .. }));
    let mut stack_word = 0u64;
    let foreign = NonNull::from(&mut stack_word).cast::<u8>();
    // SAFETY: a foreign pointer, detected and refused.
    let error = unsafe { alloc.kfree(foreign) }.unwrap_err();
    assert!(matches!(error, FreeError::NotAllocated { .. }));
    alloc.kmemtrace().stop();
    let all = events(&parse(&dump(alloc).0));
    let kinds: Vec<_> = all.iter().map(|e| (e.event, e.cache_id, e.ptr)).collect();
    let addr = obj.as_ptr() as u64;
    assert_eq!(
        kinds,
        [
            (ALLOC, bufctl.id(), addr),
            (FREE, bufctl.id(), addr),
            (BAD_FREE, bufctl.id(), addr),
            (BAD_FREE, 0, foreign.as_ptr() as u64),
        ]
    );
}

#[test]
fn kfree_of_a_sample_is_its_class_free_and_of_no_object_a_bad_free() {
    let (alloc, _) = setup_default();
    alloc.kfence().init(0).unwrap();
    alloc
        .kfence()
        .force_sample(Some(crate::kfence::KfencePlace::Right));
    let obj = alloc.kmalloc(40, 8).unwrap();
    let addr = obj.as_ptr() as u64;
    assert!(alloc.kfence().contains(addr as usize));
    let class = alloc.stats().kmalloc_cache_for(40, 8).unwrap();
    // Sampled before recording starts (a recorded cache is not sampled).
    start(alloc, small(2));
    let inner = NonNull::new((addr + 8) as *mut u8).unwrap();
    // SAFETY: inside the sample, not its start: refused, nothing changed.
    let error = unsafe { alloc.kfree(inner) }.unwrap_err();
    assert_eq!(
        error,
        FreeError::NotAllocated {
            addr: inner.as_ptr() as usize
        }
    );
    // SAFETY: the sample, ours, given up.
    unsafe { alloc.kfree(obj).unwrap() };
    alloc.kmemtrace().stop();
    let all = events(&parse(&dump(alloc).0));
    let kinds: Vec<_> = all
        .iter()
        .map(|e| (e.event, e.type_id, e.cache_id, e.ptr, e.bytes_alloc))
        .collect();
    assert_eq!(
        kinds,
        [
            (BAD_FREE, KMALLOC, 0, addr + 8, 0),
            (FREE, KMALLOC, class.id(), addr, class.obj_size() as u64),
        ]
    );
}

#[test]
fn full_ring_counts_overruns_and_sequence_gaps() {
    let (alloc, _) = setup_default();
    start(alloc, small(1));
    let mut held = Vec::new();
    for _ in 0..SUBBUF_EVENTS + 100 {
        held.push(alloc.kmalloc_box(32, 8).unwrap());
    }
    let status = alloc.kmemtrace().status();
    assert_eq!(status.nr_events, SUBBUF_EVENTS as u64);
    assert_eq!(status.nr_overruns, 100);
    let cpu0 = alloc.kmemtrace().cpu_status(0);
    assert_eq!(
        (cpu0.nr_events, cpu0.nr_overruns, cpu0.capacity),
        (1024, 100, 1024)
    );
    assert_eq!(alloc.kmemtrace().cpu_status(1).nr_events, 0);
    alloc.kmemtrace().stop();
    let (bytes, summary) = dump(alloc);
    let parsed = parse(&bytes);
    assert_eq!((summary.nr_events, summary.nr_overruns), (1024, 100));
    assert_eq!((parsed.trailer.0, parsed.trailer.1), (1024, 100));
    let overruns: u64 = parsed.cpus.iter().map(|(_, overruns, _)| overruns).sum();
    assert_eq!(overruns, 100, "CPU records sum to the total");
    for p in held {
        p.free().unwrap();
    }
    // Recording is off: nothing more was recorded.
    assert_eq!(alloc.kmemtrace().status().nr_events, 1024);
}

#[test]
fn events_span_sub_buffers_in_order() {
    let (alloc, _) = setup_default();
    start(alloc, small(3));
    let mut held = Vec::new();
    for _ in 0..SUBBUF_EVENTS + 10 {
        held.push(alloc.kmalloc_box(16, 8).unwrap());
    }
    alloc.kmemtrace().stop();
    let parsed = parse(&dump(alloc).0);
    let cpu0: Vec<_> = parsed.cpus.iter().filter(|(cpu, _, _)| *cpu == 0).collect();
    assert_eq!(cpu0.len(), 2, "one CPU record per used sub-buffer");
    assert_eq!((cpu0[0].2.len(), cpu0[1].2.len()), (SUBBUF_EVENTS, 10));
    let all = events(&parsed);
    assert!(all.windows(2).all(|w| w[1].seq == w[0].seq + 1));
    assert!(
        all.iter()
            .zip(&held)
            .all(|(e, p)| e.ptr == p.as_ptr().as_ptr() as u64)
    );
    for p in held {
        p.free().unwrap();
    }
}

#[test]
fn one_cache_only_and_restart_empties_the_rings() {
    let (alloc, _) = setup_default();
    let inode = alloc
        .cache_create("inode", 64, &CacheArgs::DEFAULT)
        .unwrap();
    start(
        alloc,
        KmemtraceConfig {
            cache_id: Some(inode.id()),
            ..small(1)
        },
    );
    let p = alloc.kmalloc_box(64, 8).unwrap();
    let big = alloc.kmalloc_box(20_000, 8).unwrap();
    let obj = inode.alloc_box().unwrap();
    assert_eq!(alloc.kmemtrace().status().nr_events, 1);
    assert_eq!(alloc.kmemtrace().status().cache_id, Some(inode.id()));
    p.free().unwrap();
    big.free().unwrap();
    obj.free().unwrap();
    assert_eq!(alloc.kmemtrace().status().nr_events, 2);
    start(alloc, small(1));
    assert_eq!(alloc.kmemtrace().status().nr_events, 0);
    // Caches created while recording everything are recorded too.
    let late = alloc.cache_create("late", 48, &CacheArgs::DEFAULT).unwrap();
    let obj = late.alloc_box().unwrap();
    assert_eq!(alloc.kmemtrace().status().nr_events, 1);
    obj.free().unwrap();
    alloc.kmemtrace().stop();
}

#[test]
fn stacks_are_deduplicated() {
    let (alloc, _) = setup_default();
    start(
        alloc,
        KmemtraceConfig {
            stack_depth: 3,
            ..small(1)
        },
    );
    let mut held = Vec::new();
    for site in [0x1000usize, 0x2000, 0x1000, 0x1000] {
        set_caller(0xffff_8000_0000_0000 | site);
        held.push(alloc.kmalloc_box(24, 8).unwrap());
    }
    alloc.kmemtrace().stop();
    assert_eq!(alloc.kmemtrace().status().nr_stacks, 2);
    let parsed = parse(&dump(alloc).0);
    assert_eq!(parsed.header.flags & HEADER_FLAG_STACKS, HEADER_FLAG_STACKS);
    assert_eq!(parsed.header.stack_depth, 3);
    assert_eq!(parsed.stacks.len(), 2);
    let ids: Vec<_> = events(&parsed).iter().map(|e| e.stack_id).collect();
    assert_eq!(ids, [1, 2, 1, 1]);
    let (id, frames) = &parsed.stacks[0];
    assert_eq!(*id, 1);
    assert_eq!(
        frames,
        &[
            0xffff_8000_0000_1000,
            FAKE_FRAMES[0] as u64,
            FAKE_FRAMES[1] as u64
        ]
    );
    assert!(
        events(&parsed)
            .iter()
            .all(|e| e.call_site == parsed.stacks[e.stack_id as usize - 1].1[0])
    );
    for p in held {
        p.free().unwrap();
    }
}

#[test]
fn bad_configuration_and_no_memory_are_clear_errors() {
    let (alloc, source) = setup(512);
    let too_deep = KmemtraceConfig {
        stack_depth: 17,
        ..small(1)
    };
    let refused = alloc.kmemtrace().start(too_deep);
    assert_eq!(refused, Err(KmemtraceError::StackDepth(17)));
    let before = source.pages_outstanding();
    // 4 CPUs x 64 sub-buffers x 16 pages: more than the source has.
    let error = alloc.kmemtrace().start(small(64)).unwrap_err();
    assert!(matches!(error, KmemtraceError::OutOfMemory { .. }));
    assert_eq!(source.pages_outstanding(), before, "nothing kept");
    assert!(!alloc.kmemtrace().status().recording);
    // The allocator still works and records nothing.
    alloc.kmalloc_box(64, 8).unwrap().free().unwrap();
    assert_eq!(alloc.kmemtrace().status().nr_events, 0);
}

#[test]
fn recording_changes_no_statistic() {
    let (alloc, _) = setup_default();
    let cache = alloc.find_cache("kmalloc-64").unwrap();
    let run = || {
        let mut held = Vec::new();
        for _ in 0..100 {
            held.push(alloc.kmalloc_box(64, 8).unwrap());
        }
        for p in held {
            p.free().unwrap();
        }
    };
    run();
    let before = cache.stats();
    run();
    let plain = cache.stats();
    start(alloc, small(1));
    run();
    alloc.kmemtrace().stop();
    let recorded = cache.stats();
    assert_eq!(alloc.kmemtrace().status().nr_events, 200);
    let delta = |a: crate::CacheStats, b: crate::CacheStats| {
        (
            b.nr_allocs_ever - a.nr_allocs_ever,
            b.nr_allocated,
            b.nr_slabs,
        )
    };
    assert_eq!(delta(before, plain), delta(plain, recorded));
}

#[test]
fn truncated_or_foreign_headers_are_refused() {
    use crate::kmemtrace::format::DumpFormatError;
    let header = KmemtraceHeader::default().to_bytes();
    assert_eq!(
        KmemtraceHeader::from_bytes(&header[..10]),
        Err(DumpFormatError::Truncated)
    );
    let mut bad = header;
    bad[0] = b'X';
    assert_eq!(
        KmemtraceHeader::from_bytes(&bad),
        Err(DumpFormatError::BadMagic)
    );
    let mut other = header;
    other[8] = 9;
    assert_eq!(
        KmemtraceHeader::from_bytes(&other),
        Err(DumpFormatError::AbiVersion(9))
    );
    let event = KmemtraceEvent {
        event: 1,
        type_id: 2,
        cpu: 3,
        cache_id: 4,
        timestamp_ns: 5,
        seq: 6,
        call_site: 7,
        ptr: 8,
        bytes_req: 9,
        bytes_alloc: 10,
        flags: 11,
        stack_id: 12,
    };
    let bytes = event.to_bytes();
    assert_eq!(&bytes[..4], &[1, 2, 3, 0]);
    assert_eq!(bytes[60], 12);
    assert_eq!(KmemtraceEvent::from_bytes(&bytes), event);
}

/// kmalloc(64) + kfree pairs (through a `SlabBox`), recording off: the
/// loop `cost_loop_on` is compared with under callgrind (see
/// `kmemtrace_cost_loops`).
#[inline(never)]
fn cost_loop_off(alloc: &'static TestAlloc, nr: usize) {
    for _ in 0..nr {
        let p = alloc.kmalloc_box(64, 8).unwrap();
        std::hint::black_box(p).free().unwrap();
    }
}

/// The same pairs with recording on (two events each).
#[inline(never)]
fn cost_loop_on(alloc: &'static TestAlloc, nr: usize) {
    for _ in 0..nr {
        let p = alloc.kmalloc_box(64, 8).unwrap();
        std::hint::black_box(p).free().unwrap();
    }
}

/// Not a timed test: the two loops callgrind counts for the event cost
/// (`valgrind --tool=callgrind
/// --toggle-collect='*cost_loop_o*' TESTBINARY kmemtrace_cost_loops`,
/// instructions per pair = Ir / 10,000). Checks that the loops record
/// exactly what they should.
#[test]
fn kmemtrace_cost_loops() {
    let (alloc, _) = setup_default();
    alloc.profiling().set_enabled(false);
    cost_loop_off(alloc, 100);
    // 10,000 pairs natively (callgrind reads them), 100 under Miri.
    cost_loop_off(alloc, scaled(10_000));
    start(alloc, small(32));
    cost_loop_on(alloc, scaled(10_000));
    alloc.kmemtrace().stop();
    let status = alloc.kmemtrace().status();
    assert_eq!(
        (status.nr_events, status.nr_overruns),
        (2 * scaled(10_000) as u64, 0)
    );
}

/// The recorded magazine hits (the one hit, then the event:
/// `cache/alloc.rs`'s `alloc_usual_recorded`, `cache/free.rs`'s
/// `free_recorded`, with interrupts off), with stacks off and on: every alloc and free of a warm cache is one event,
/// in order, on its CPU, with its call site (and stack).
#[test]
fn recorded_hits_write_one_event_each() {
    for depth in [0, 2] {
        let (alloc, _) = setup_default();
        let cache = alloc
            .cache_create(
                "hits",
                64,
                &CacheArgs {
                    align: 8,
                    ..CacheArgs::DEFAULT
                },
            )
            .unwrap();
        // Warm this CPU's magazines: the recorded operations below hit.
        let warm: Vec<_> = (0..8).map(|_| cache.alloc().unwrap()).collect();
        for obj in warm {
            // SAFETY: allocated just above, given back once.
            unsafe { cache.free(obj) }.unwrap();
        }
        start(
            alloc,
            KmemtraceConfig {
                stack_depth: depth,
                ..small(1)
            },
        );
        set_caller(0xffff_8000_0000_3000);
        let mut ptrs = Vec::new();
        for _ in 0..4 {
            let obj = cache.alloc().unwrap();
            ptrs.push(obj.as_ptr() as u64);
            // SAFETY: allocated just above, given back once.
            unsafe { cache.free(obj) }.unwrap();
        }
        alloc.kmemtrace().stop();
        let parsed = parse(&dump(alloc).0);
        let all = events(&parsed);
        assert_eq!(all.len(), 8, "stack depth {depth}");
        for (i, e) in all.iter().enumerate() {
            let kind = if i % 2 == 0 { ALLOC } else { FREE };
            assert_eq!(
                (e.event, e.type_id, e.cpu, e.cache_id, e.ptr, e.seq),
                (kind, CACHE, 0, cache.id(), ptrs[i / 2], i as u64)
            );
            assert_eq!(
                (e.bytes_req, e.bytes_alloc),
                (if kind == ALLOC { 64 } else { 0 }, 64)
            );
            assert_eq!(e.call_site, 0xffff_8000_0000_3000);
            assert_eq!(e.stack_id != 0, depth != 0);
        }
        assert_eq!(cache.stats().nr_allocated, 0);
    }
}
