//! Every record type encodes and decodes back to itself (proptest), a
//! whole dump written by `DumpWriter` reads back record for record, and
//! bad input is refused with the error, offset and message that name it.

use magpie_kmemtrace_format::{
    CacheRecord, CpuRecord, DecodedEvent, DumpFormatError, DumpLayout, DumpSummary, DumpWriter,
    EVENT_SIZE, ErrorClass, EventKind, EventType, HEADER_SIZE, KmemtraceEvent, KmemtraceHeader,
    MarkRecord, RECORD_CACHE, RECORD_CPU, RECORD_HEADER_SIZE, RECORD_MARK, RECORD_STACK,
    RECORD_TRAILER, Record, RecordBody, RecordHeader, StackRecord, TRAILER_SIZE, Trailer,
};
use proptest::prelude::*;

fn collect(encode: impl FnOnce(&mut dyn FnMut(&[u8]))) -> Vec<u8> {
    let mut bytes = Vec::new();
    encode(&mut |chunk: &[u8]| bytes.extend_from_slice(chunk));
    bytes
}

/// The one record in `bytes`, framed as a reader frames it.
fn only_record(bytes: &[u8]) -> Record<'_> {
    let header = RecordHeader::read(bytes, 0, 0).expect("framing");
    assert_eq!(
        header.length as usize,
        bytes.len(),
        "length covers the record"
    );
    assert_eq!(bytes.len() % 8, 0, "padded to 8");
    Record {
        kind: header.kind,
        offset: 0,
        body: &bytes[RECORD_HEADER_SIZE..],
    }
}

fn header(nr_cpus: u32, stack_depth: u32) -> KmemtraceHeader {
    KmemtraceHeader {
        nr_cpus,
        stack_depth,
        ..KmemtraceHeader::default()
    }
}

fn event_strategy(cpu: u16) -> impl Strategy<Value = KmemtraceEvent> {
    (
        (1u8..=4, 1u8..=3, any::<u32>(), any::<u64>(), any::<u64>()),
        (any::<u64>(), any::<u64>(), any::<u64>(), any::<u64>()),
        (any::<u32>(), any::<u32>()),
    )
        .prop_map(
            move |(
                (event, type_id, cache_id, timestamp_ns, seq),
                (call_site, ptr, bytes_req, bytes_alloc),
                (flags, stack_id),
            )| KmemtraceEvent {
                event,
                type_id,
                cpu,
                cache_id,
                timestamp_ns,
                seq,
                call_site,
                ptr,
                bytes_req,
                bytes_alloc,
                flags,
                stack_id,
            },
        )
}

proptest! {
    #[test]
    fn events_round_trip(raw in any::<[u8; EVENT_SIZE]>()) {
        let event = KmemtraceEvent::from_bytes(&raw);
        prop_assert_eq!(event.to_bytes(), raw);
        prop_assert_eq!(KmemtraceEvent::from_bytes(&event.to_bytes()), event);
    }

    #[test]
    fn headers_round_trip(
        nr_cpus in 1u32..=u32::from(u16::MAX),
        build_id in any::<[u8; 20]>(),
        flags in any::<u32>(),
        record_start_ns in any::<u64>(),
        stack_depth in any::<u32>(),
    ) {
        let header = KmemtraceHeader { nr_cpus, build_id, flags, record_start_ns, stack_depth };
        prop_assert_eq!(KmemtraceHeader::from_bytes(&header.to_bytes()), Ok(header));
    }

    #[test]
    fn cache_records_round_trip(
        id in 1u32..,
        obj_size in any::<u32>(),
        align in any::<u32>(),
        flags in any::<u32>(),
        name in "\\PC{0,40}",
    ) {
        let cache = CacheRecord { id, obj_size, align, flags, name: name.as_str() };
        let bytes = collect(|out| cache.encode(out));
        let record = only_record(&bytes);
        prop_assert_eq!(record.kind, RECORD_CACHE);
        prop_assert_eq!(record.decode(&header(1, 0)), Ok(RecordBody::Cache(cache)));
    }

    #[test]
    fn mark_records_round_trip(timestamp_ns in any::<u64>(), cpu in any::<u32>(), text in "\\PC{0,80}") {
        let mark = MarkRecord { timestamp_ns, cpu, text: text.as_str() };
        let bytes = collect(|out| mark.encode(out));
        prop_assert_eq!(bytes.len() % 8, 0);
        let record = only_record(&bytes);
        prop_assert_eq!(record.kind, RECORD_MARK);
        prop_assert_eq!(record.decode(&header(1, 0)), Ok(RecordBody::Mark(mark)));
    }

    #[test]
    fn stack_records_round_trip(id in 1u32.., frames in prop::collection::vec(any::<u64>(), 0..20)) {
        let bytes = collect(|out| StackRecord::encode(id, &frames, out));
        let record = only_record(&bytes);
        prop_assert_eq!(record.kind, RECORD_STACK);
        let RecordBody::Stack(stack) = record.decode(&header(1, 0)).unwrap() else {
            panic!("not a stack");
        };
        prop_assert_eq!(stack.id, id);
        prop_assert_eq!(stack.depth(), frames.len());
        prop_assert_eq!(stack.frames().collect::<Vec<_>>(), frames);
    }

    #[test]
    fn cpu_records_round_trip(
        cpu in 0u16..8,
        nr_overruns in any::<u64>(),
        events in prop::collection::vec(event_strategy(3), 0..12),
    ) {
        // Every event of the record is of the record's CPU.
        let events: Vec<_> = events.into_iter().map(|e| KmemtraceEvent { cpu, ..e }).collect();
        let bytes = collect(|out| CpuRecord::encode(u32::from(cpu), nr_overruns, events.iter().copied(), out));
        let record = only_record(&bytes);
        prop_assert_eq!(record.kind, RECORD_CPU);
        let RecordBody::Cpu(decoded) = record.decode(&header(8, 0)).unwrap() else {
            panic!("not a CPU record");
        };
        prop_assert_eq!(decoded.cpu, u32::from(cpu));
        prop_assert_eq!(decoded.nr_overruns, nr_overruns);
        prop_assert_eq!(decoded.nr_events(), events.len());
        let read: Vec<DecodedEvent> = decoded.events().collect::<Result<_, _>>().unwrap();
        for (index, (read, written)) in read.iter().zip(&events).enumerate() {
            prop_assert_eq!(read.raw, *written);
            prop_assert_eq!(read.kind as u8, written.event);
            prop_assert_eq!(read.event_type as u8, written.type_id);
            prop_assert_eq!(read.offset as usize, RECORD_HEADER_SIZE + 24 + index * EVENT_SIZE);
        }
    }

    #[test]
    fn trailers_round_trip(
        nr_events in any::<u64>(),
        nr_overruns in any::<u64>(),
        nr_records in any::<u64>(),
        checksum in any::<u32>(),
    ) {
        let trailer = Trailer { nr_events, nr_overruns, nr_records, checksum };
        let bytes = trailer.to_bytes();
        let record = only_record(&bytes);
        prop_assert_eq!(record.kind, RECORD_TRAILER);
        prop_assert_eq!(record.decode(&header(1, 0)), Ok(RecordBody::Trailer(trailer)));
    }

    #[test]
    fn whole_dumps_round_trip(
        per_cpu in prop::collection::vec(prop::collection::vec(event_strategy(0), 0..6), 1..4),
        names in prop::collection::vec("[a-z0-9-]{1,20}", 0..4),
        stacks in prop::collection::vec(prop::collection::vec(any::<u64>(), 1..5), 0..3),
    ) {
        let header = KmemtraceHeader {
            nr_cpus: per_cpu.len() as u32,
            stack_depth: 4,
            build_id: [7; 20],
            ..KmemtraceHeader::default()
        };
        let mut bytes = Vec::new();
        let mut sink = |chunk: &[u8]| bytes.extend_from_slice(chunk);
        let mut writer = DumpWriter::new(&header, &mut sink);
        for (index, name) in names.iter().enumerate() {
            writer.cache(&CacheRecord { id: index as u32 + 1, obj_size: 64, align: 8, flags: 0, name });
        }
        for (index, frames) in stacks.iter().enumerate() {
            writer.stack(index as u32 + 1, frames);
        }
        for (cpu, events) in per_cpu.iter().enumerate() {
            let events = events.iter().map(|e| KmemtraceEvent { cpu: cpu as u16, ..*e });
            writer.cpu(cpu as u32, cpu as u64, events);
        }
        let summary: DumpSummary = writer.finish();
        prop_assert_eq!(summary.nr_bytes as usize, bytes.len());

        let layout = DumpLayout::parse(&bytes).unwrap();
        prop_assert_eq!(layout.len(), bytes.len());
        prop_assert_eq!(layout.header, header);
        prop_assert_eq!(layout.trailer.checksum, summary.checksum);
        prop_assert_eq!(layout.trailer.nr_records, summary.nr_records);
        prop_assert_eq!(layout.trailer_offset + TRAILER_SIZE, bytes.len());
        let nr_events: usize = per_cpu.iter().map(Vec::len).sum();
        prop_assert_eq!(layout.trailer.nr_events, nr_events as u64);
        let nr_records = names.len() + stacks.len() + per_cpu.len();
        prop_assert_eq!(layout.records().count(), nr_records);
        let (mut caches, mut stacks_read, mut cpus) = (0, 0, 0);
        for record in layout.records() {
            match record.decode(&layout.header).unwrap() {
                RecordBody::Cache(cache) => {
                    prop_assert_eq!(cache.name, names[caches].as_str());
                    caches += 1;
                }
                RecordBody::Stack(stack) => {
                    prop_assert_eq!(stack.frames().collect::<Vec<_>>(), stacks[stacks_read].clone());
                    stacks_read += 1;
                }
                RecordBody::Cpu(cpu) => {
                    prop_assert_eq!(cpu.nr_overruns, cpus as u64);
                    prop_assert_eq!(cpu.nr_events(), per_cpu[cpus].len());
                    for event in cpu.events() {
                        prop_assert!(event.is_ok());
                    }
                    cpus += 1;
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        prop_assert_eq!((caches, stacks_read, cpus), (names.len(), stacks.len(), per_cpu.len()));

        // Cut anywhere, the dump is refused as truncated; a flipped bit
        // before the trailer is a checksum mismatch (or a framing error).
        for cut in [0, 5, HEADER_SIZE - 1, HEADER_SIZE, bytes.len() - 1] {
            let error = DumpLayout::parse(&bytes[..cut]).unwrap_err();
            prop_assert_eq!(error.class(), ErrorClass::Truncated, "cut at {}: {}", cut, error);
        }
    }
}

/// A small valid dump: one cache, one stack, one CPU record with one event.
fn small_dump() -> Vec<u8> {
    let mut bytes = Vec::new();
    let mut sink = |chunk: &[u8]| bytes.extend_from_slice(chunk);
    let mut writer = DumpWriter::new(&header(2, 4), &mut sink);
    writer.cache(&CacheRecord {
        id: 1,
        obj_size: 64,
        align: 8,
        flags: 0,
        name: "kmalloc-64",
    });
    writer.stack(1, &[0x10, 0x20]);
    let event = KmemtraceEvent {
        event: EventKind::Alloc as u8,
        type_id: EventType::Kmalloc as u8,
        cpu: 1,
        ..KmemtraceEvent::default()
    };
    writer.cpu(1, 0, [event].into_iter());
    writer.finish();
    bytes
}

/// Offsets of the records in `small_dump`.
const CACHE_AT: usize = HEADER_SIZE;
const STACK_AT: usize = CACHE_AT + 48;
const CPU_AT: usize = STACK_AT + 32;
const TRAILER_AT: usize = CPU_AT + 96;

/// Decode every record of `bytes` (a dump that frames and checksums).
fn decode_all(bytes: &[u8]) -> Result<(), DumpFormatError> {
    let layout = DumpLayout::parse(bytes)?;
    for record in layout.records() {
        if let RecordBody::Cpu(cpu) = record.decode(&layout.header)? {
            for event in cpu.events() {
                event?;
            }
        }
    }
    Ok(())
}

/// `bytes` with `edit` applied and the trailer's checksum redone, so the
/// body checks are reached.
fn edited(edit: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let mut bytes = small_dump();
    edit(&mut bytes);
    let checksum = crc32fast::hash(&bytes[..TRAILER_AT]);
    bytes[TRAILER_AT + 32..TRAILER_AT + 36].copy_from_slice(&checksum.to_le_bytes());
    bytes
}

fn put32(bytes: &mut [u8], at: usize, value: u32) {
    bytes[at..at + 4].copy_from_slice(&value.to_le_bytes());
}

#[test]
fn the_small_dump_has_the_documented_layout() {
    let bytes = small_dump();
    assert_eq!(bytes.len(), TRAILER_AT + TRAILER_SIZE);
    assert_eq!(decode_all(&bytes), Ok(()));
    let kinds: Vec<u16> = DumpLayout::parse(&bytes)
        .unwrap()
        .records()
        .map(|r| r.kind)
        .collect();
    assert_eq!(kinds, [RECORD_CACHE, RECORD_STACK, RECORD_CPU]);
    // Two dumps back to back: the first's length is where the second starts.
    let mut two = bytes.clone();
    two.extend_from_slice(&bytes);
    assert_eq!(DumpLayout::parse(&two).unwrap().len(), bytes.len());
}

#[test]
fn bad_headers_are_refused_in_order() {
    let good = small_dump();
    let cases: [(usize, u32, DumpFormatError); 4] = [
        (8, 2, DumpFormatError::AbiVersion(2)),
        (12, 32, DumpFormatError::HeaderSize(32)),
        (16, 32, DumpFormatError::EventSize(32)),
        (20, 0, DumpFormatError::NrCpus(0)),
    ];
    for (at, value, expected) in cases {
        let mut bytes = good.clone();
        put32(&mut bytes, at, value);
        let error = KmemtraceHeader::from_bytes(&bytes).unwrap_err();
        assert_eq!(error, expected);
        assert_eq!(error.offset(), at);
    }
    assert_eq!(
        KmemtraceHeader::from_bytes(b"MAGP"),
        Err(DumpFormatError::Truncated)
    );
    assert_eq!(
        KmemtraceHeader::from_bytes(b"ELF"),
        Err(DumpFormatError::BadMagic)
    );
    let mut other = good.clone();
    other[0] = b'X';
    assert_eq!(
        DumpLayout::parse(&other).unwrap_err().to_string(),
        "not a kmemtrace dump: bad magic (expected \"MAGPKMT\\0\")"
    );
    assert_eq!(
        DumpFormatError::AbiVersion(2).class(),
        ErrorClass::Abi,
        "another version is an ABI mismatch"
    );
}

#[test]
fn bad_framing_is_refused_with_the_offset() {
    let good = small_dump();
    let error = DumpLayout::parse(&good[..HEADER_SIZE]).unwrap_err();
    assert_eq!(
        error,
        DumpFormatError::NoTrailer {
            offset: HEADER_SIZE,
            nr_records: 0
        }
    );
    assert_eq!(
        error.to_string(),
        "no trailer record: the file ends after 0 records"
    );
    let error = DumpLayout::parse(&good[..HEADER_SIZE + 4]).unwrap_err();
    assert_eq!(
        error.to_string(),
        "record header needs 8 bytes, the file ends 4 bytes later"
    );
    let error = DumpLayout::parse(&good[..HEADER_SIZE + 16]).unwrap_err();
    assert_eq!(
        error.to_string(),
        "record (kind 0x1) of 48 bytes runs past the end of the file (16 bytes left)"
    );
    let mut bytes = good.clone();
    put32(&mut bytes, CACHE_AT + 4, 12);
    let error = DumpLayout::parse(&bytes).unwrap_err();
    assert_eq!(
        (error.offset(), error.class()),
        (CACHE_AT, ErrorClass::Corrupt)
    );
    assert_eq!(
        error.to_string(),
        "record (kind 0x1) has length 12, not a multiple of 8 of at least 8"
    );
    // A flipped bit anywhere before the trailer: the checksum names it.
    let mut bytes = good.clone();
    bytes[CPU_AT + 40] ^= 1;
    let error = DumpLayout::parse(&bytes).unwrap_err();
    assert!(
        matches!(error, DumpFormatError::Checksum { offset, covered, .. }
            if offset == TRAILER_AT + 8 + 24 && covered == TRAILER_AT),
        "{error:?}"
    );
    let bytes = edited(|bytes| bytes[TRAILER_AT + 24] = 9);
    assert_eq!(
        DumpLayout::parse(&bytes).unwrap_err().to_string(),
        "trailer counts 9 records before it, the file has 3"
    );
}

#[test]
fn bad_bodies_are_refused_with_the_offset() {
    let cases: Vec<(Vec<u8>, DumpFormatError, &str)> = vec![
        (
            edited(|b| put32(b, CACHE_AT + 8, 0)),
            DumpFormatError::ZeroId {
                offset: CACHE_AT + 8,
                kind: RECORD_CACHE,
            },
            "CACHE record with cache id 0 (reserved for \"no cache\")",
        ),
        (
            edited(|b| put32(b, CACHE_AT + 8 + 16, 99)),
            DumpFormatError::CacheNameLength {
                offset: CACHE_AT + 8 + 16,
                name_len: 99,
                available: 16,
            },
            "CACHE name_len 99 exceeds the 16 bytes left in the record",
        ),
        (
            edited(|b| b[CACHE_AT + 8 + 24] = 0xff),
            DumpFormatError::CacheNameUtf8 {
                offset: CACHE_AT + 8 + 24,
            },
            "CACHE name is not UTF-8",
        ),
        (
            edited(|b| put32(b, STACK_AT + 8, 0)),
            DumpFormatError::ZeroId {
                offset: STACK_AT + 8,
                kind: RECORD_STACK,
            },
            "STACK record with stack id 0 (0 means \"no stack\")",
        ),
        (
            edited(|b| put32(b, STACK_AT + 12, 3)),
            DumpFormatError::StackLength {
                offset: STACK_AT + 12,
                depth: 3,
                available: 16,
            },
            "STACK depth 3 needs 24 bytes, the record has 16",
        ),
        (
            edited(|b| put32(b, 56, 1)),
            DumpFormatError::StackDepth {
                offset: STACK_AT + 12,
                depth: 2,
                max: 1,
            },
            "STACK depth 2 exceeds the header's stack_depth 1",
        ),
        (
            edited(|b| put32(b, CPU_AT + 8, 2)),
            DumpFormatError::CpuId {
                offset: CPU_AT + 8,
                cpu: 2,
                nr_cpus: 2,
            },
            "CPU record for cpu 2, the header says 2 CPUs",
        ),
        (
            edited(|b| put32(b, CPU_AT + 12, 2)),
            DumpFormatError::CpuEventCount {
                offset: CPU_AT + 12,
                nr_events: 2,
                available: 64,
            },
            "CPU record says 2 events (128 bytes), the record has 64 bytes for them",
        ),
        (
            edited(|b| b[CPU_AT + 32] = 5),
            DumpFormatError::EventKind {
                offset: CPU_AT + 32,
                value: 5,
            },
            "event kind 5 is not 1..=4",
        ),
        (
            edited(|b| b[CPU_AT + 33] = 0),
            DumpFormatError::EventType {
                offset: CPU_AT + 33,
                value: 0,
            },
            "event type 0 is not 1..=3",
        ),
        (
            edited(|b| b[CPU_AT + 34] = 0),
            DumpFormatError::EventCpu {
                offset: CPU_AT + 34,
                event_cpu: 0,
                cpu: 1,
            },
            "event of cpu 0 inside the CPU record of cpu 1",
        ),
    ];
    for (bytes, expected, message) in cases {
        let error = decode_all(&bytes).unwrap_err();
        assert_eq!(error, expected);
        assert_eq!(error.to_string(), message);
        assert_eq!(error.class(), ErrorClass::Corrupt);
        assert_eq!(error.offset(), expected.offset());
    }
}

#[test]
fn short_bodies_are_refused() {
    for (kind, needed, name) in [
        (RECORD_CACHE, 24, "CACHE"),
        (RECORD_STACK, 8, "STACK"),
        (RECORD_CPU, 24, "CPU"),
    ] {
        let record = Record {
            kind,
            offset: 100,
            body: &[0; 0],
        };
        let error = record.decode(&header(1, 0)).unwrap_err();
        assert_eq!(
            error,
            DumpFormatError::BodyTooShort {
                offset: 108,
                kind,
                length: 0,
                needed
            }
        );
        assert_eq!(
            error.to_string(),
            format!("{name} body is 0 bytes, it needs at least {needed}")
        );
    }
    assert_eq!(
        Trailer::decode(&[0; 8], 100).unwrap_err().to_string(),
        "trailer body is 8 bytes, it needs 32"
    );
    let unknown = Record {
        kind: 0x77,
        offset: 0,
        body: &[],
    };
    assert_eq!(unknown.decode(&header(1, 0)), Ok(RecordBody::Unknown(0x77)));
}

#[test]
fn a_mark_longer_than_its_record_is_refused_and_bad_text_is_cut() {
    let mark = MarkRecord {
        timestamp_ns: 5,
        cpu: 1,
        text: "kmalloc 64 10",
    };
    let mut bytes = collect(|out| mark.encode(out));
    // text_len (body offset 12) says 200 bytes.
    bytes[RECORD_HEADER_SIZE + 12..RECORD_HEADER_SIZE + 16].copy_from_slice(&200u32.to_le_bytes());
    let error = only_record(&bytes).decode(&header(1, 0)).unwrap_err();
    assert!(
        matches!(
            error,
            DumpFormatError::BodyTooShort {
                kind: RECORD_MARK,
                ..
            }
        ),
        "{error:?}"
    );
    // A byte that is not UTF-8 ends the text.
    let mut bytes = collect(|out| mark.encode(out));
    bytes[RECORD_HEADER_SIZE + 16 + 7] = 0xff;
    let Ok(RecordBody::Mark(decoded)) = only_record(&bytes).decode(&header(1, 0)) else {
        panic!("not a mark");
    };
    assert_eq!(decoded.text, "kmalloc");
}
