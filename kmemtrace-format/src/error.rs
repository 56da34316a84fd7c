//! Why bytes are not a dump: one typed error, each variant with the byte
//! offset (from the start of the dump) and the numbers its message needs.

use core::fmt;

use crate::{
    CACHE_BODY_SIZE, CPU_BODY_SIZE, EVENT_SIZE, FRAME_SIZE, HEADER_SIZE, KMEMTRACE_ABI_VERSION,
    RECORD_HEADER_SIZE, TRAILER_BODY_SIZE, record_name,
};

/// Why a byte string is not a (valid) dump.
///
/// [`DumpFormatError::offset`] says where, [`DumpFormatError::class`] how
/// a tool should call it (truncated, corrupt, ABI mismatch); the
/// `Display` text says what, with the numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum DumpFormatError {
    /// Fewer than [`HEADER_SIZE`] bytes, and those that are there begin
    /// like a dump (offset 0).
    Truncated,
    /// Does not start with [`KMEMTRACE_MAGIC`](crate::KMEMTRACE_MAGIC)
    /// (offset 0).
    BadMagic,
    /// Written by another ABI version (offset 8).
    AbiVersion(u32),
    /// The header's `header_size` is not [`HEADER_SIZE`] (offset 12).
    HeaderSize(u32),
    /// The header's `event_size` is not [`EVENT_SIZE`] (offset 16).
    EventSize(u32),
    /// The header's `nr_cpus` is 0 or above `u16::MAX` (offset 20).
    NrCpus(u32),
    /// The bytes end where a record should start: no trailer.
    NoTrailer {
        /// Where the next record would be.
        offset: usize,
        /// Records read before the end.
        nr_records: u64,
    },
    /// The bytes end inside a record header.
    RecordHeaderCutShort {
        /// Offset of the record.
        offset: usize,
        /// Bytes left from there.
        remaining: usize,
    },
    /// A record's length runs past the end of the bytes.
    RecordCutShort {
        /// Offset of the record.
        offset: usize,
        /// The record's kind.
        kind: u16,
        /// Its length (header and body).
        length: u32,
        /// Bytes left from its start.
        remaining: usize,
    },
    /// A record length below [`RECORD_HEADER_SIZE`] or not a multiple of 8.
    RecordLength {
        /// Offset of the record.
        offset: usize,
        /// The record's kind.
        kind: u16,
        /// The bad length.
        length: u32,
    },
    /// A record body shorter than its kind's fixed part.
    BodyTooShort {
        /// Offset of the body.
        offset: usize,
        /// The record's kind.
        kind: u16,
        /// Bytes in the body.
        length: usize,
        /// Bytes its fixed part needs.
        needed: usize,
    },
    /// The trailer's checksum does not match the bytes before it.
    Checksum {
        /// Offset of the checksum field.
        offset: usize,
        /// What the trailer says.
        stored: u32,
        /// What the bytes hash to.
        computed: u32,
        /// Bytes hashed (the trailer's offset).
        covered: usize,
    },
    /// The trailer's record count does not match the records before it.
    RecordCount {
        /// Offset of the count field.
        offset: usize,
        /// What the trailer says.
        stored: u64,
        /// Records found.
        found: u64,
    },
    /// The trailer's event count does not match the CPU records.
    EventCount {
        /// Offset of the count field.
        offset: usize,
        /// What the trailer says.
        stored: u64,
        /// Events the CPU records hold.
        found: u64,
    },
    /// The trailer's overrun count does not match the CPU records.
    OverrunCount {
        /// Offset of the count field.
        offset: usize,
        /// What the trailer says.
        stored: u64,
        /// Overruns the CPU records report.
        found: u64,
    },
    /// A CACHE or STACK record with id 0 (which means "none").
    ZeroId {
        /// Offset of the body.
        offset: usize,
        /// [`RECORD_CACHE`](crate::RECORD_CACHE) or
        /// [`RECORD_STACK`](crate::RECORD_STACK).
        kind: u16,
    },
    /// A second CACHE or STACK record for one id.
    DuplicateId {
        /// Offset of the second record's body.
        offset: usize,
        /// [`RECORD_CACHE`](crate::RECORD_CACHE) or
        /// [`RECORD_STACK`](crate::RECORD_STACK).
        kind: u16,
        /// The id.
        id: u32,
    },
    /// A CACHE name longer than its record.
    CacheNameLength {
        /// Offset of the `name_len` field.
        offset: usize,
        /// What it says.
        name_len: usize,
        /// Bytes left in the record for the name.
        available: usize,
    },
    /// A CACHE name that is not UTF-8.
    CacheNameUtf8 {
        /// Offset of the name.
        offset: usize,
    },
    /// A STACK depth longer than its record.
    StackLength {
        /// Offset of the `depth` field.
        offset: usize,
        /// What it says.
        depth: usize,
        /// Bytes left in the record for the frames.
        available: usize,
    },
    /// A STACK deeper than the header's `stack_depth`.
    StackDepth {
        /// Offset of the `depth` field.
        offset: usize,
        /// What it says.
        depth: usize,
        /// The header's `stack_depth`.
        max: u32,
    },
    /// A CPU record for a CPU the header does not have.
    CpuId {
        /// Offset of the body.
        offset: usize,
        /// The record's CPU.
        cpu: u32,
        /// The header's `nr_cpus`.
        nr_cpus: u32,
    },
    /// A CPU record announcing more events than it holds.
    CpuEventCount {
        /// Offset of the `nr_events` field.
        offset: usize,
        /// What it says.
        nr_events: usize,
        /// Bytes left in the record for events.
        available: usize,
    },
    /// An event whose kind byte is not an [`EventKind`](crate::EventKind).
    EventKind {
        /// Offset of the event.
        offset: usize,
        /// The byte.
        value: u8,
    },
    /// An event whose type byte is not an [`EventType`](crate::EventType).
    EventType {
        /// Offset of the type byte.
        offset: usize,
        /// The byte.
        value: u8,
    },
    /// An event of another CPU than its CPU record's.
    EventCpu {
        /// Offset of the event's `cpu` field.
        offset: usize,
        /// The event's CPU.
        event_cpu: u16,
        /// The record's CPU.
        cpu: u32,
    },
}

/// How a tool reports a [`DumpFormatError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// The bytes end before a structure they announce.
    Truncated,
    /// The bytes are not well formed (bad magic, length, checksum, value).
    Corrupt,
    /// A dump of another ABI version or layout.
    Abi,
}

impl DumpFormatError {
    /// Byte offset of the fault from the start of the dump.
    pub fn offset(&self) -> usize {
        use DumpFormatError::*;
        match *self {
            Truncated | BadMagic => 0,
            AbiVersion(_) => 8,
            HeaderSize(_) => 12,
            EventSize(_) => 16,
            NrCpus(_) => 20,
            NoTrailer { offset, .. }
            | RecordHeaderCutShort { offset, .. }
            | RecordCutShort { offset, .. }
            | RecordLength { offset, .. }
            | BodyTooShort { offset, .. }
            | Checksum { offset, .. }
            | RecordCount { offset, .. }
            | EventCount { offset, .. }
            | OverrunCount { offset, .. }
            | ZeroId { offset, .. }
            | DuplicateId { offset, .. }
            | CacheNameLength { offset, .. }
            | CacheNameUtf8 { offset }
            | StackLength { offset, .. }
            | StackDepth { offset, .. }
            | CpuId { offset, .. }
            | CpuEventCount { offset, .. }
            | EventKind { offset, .. }
            | EventType { offset, .. }
            | EventCpu { offset, .. } => offset,
        }
    }

    /// Truncated, corrupt or another ABI.
    pub fn class(&self) -> ErrorClass {
        use DumpFormatError::*;
        match self {
            Truncated | NoTrailer { .. } | RecordHeaderCutShort { .. } | RecordCutShort { .. } => {
                ErrorClass::Truncated
            }
            AbiVersion(_) | HeaderSize(_) | EventSize(_) => ErrorClass::Abi,
            _ => ErrorClass::Corrupt,
        }
    }
}

impl fmt::Display for DumpFormatError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use DumpFormatError::*;
        match *self {
            Truncated => write!(f, "the {HEADER_SIZE}-byte header is cut short"),
            BadMagic => write!(
                f,
                "not a kmemtrace dump: bad magic (expected \"MAGPKMT\\0\")"
            ),
            AbiVersion(version) => write!(
                f,
                "dump has ABI version {version}, this reader reads version {KMEMTRACE_ABI_VERSION}"
            ),
            HeaderSize(size) => write!(
                f,
                "header_size is {size}, ABI version {KMEMTRACE_ABI_VERSION} has {HEADER_SIZE}"
            ),
            EventSize(size) => write!(
                f,
                "event_size is {size}, ABI version {KMEMTRACE_ABI_VERSION} has {EVENT_SIZE}"
            ),
            NrCpus(nr) => write!(f, "nr_cpus is {nr}"),
            NoTrailer { nr_records, .. } => write!(
                f,
                "no trailer record: the file ends after {nr_records} records"
            ),
            RecordHeaderCutShort { remaining, .. } => write!(
                f,
                "record header needs {RECORD_HEADER_SIZE} bytes, the file ends {remaining} bytes later"
            ),
            RecordCutShort {
                kind,
                length,
                remaining,
                ..
            } => write!(
                f,
                "record (kind {kind:#x}) of {length} bytes runs past the end of the file ({remaining} bytes left)"
            ),
            RecordLength { kind, length, .. } => write!(
                f,
                "record (kind {kind:#x}) has length {length}, not a multiple of 8 of at least {RECORD_HEADER_SIZE}"
            ),
            BodyTooShort {
                kind,
                length,
                needed,
                ..
            } => {
                if kind == crate::RECORD_TRAILER {
                    write!(f, "trailer body is {length} bytes, it needs {needed}")
                } else {
                    let name = record_name(kind);
                    write!(
                        f,
                        "{name} body is {length} bytes, it needs at least {needed}"
                    )
                }
            }
            Checksum {
                stored,
                computed,
                covered,
                ..
            } => write!(
                f,
                "checksum mismatch: the trailer says {stored:#010x}, bytes 0..{covered} hash to {computed:#010x}"
            ),
            RecordCount { stored, found, .. } => write!(
                f,
                "trailer counts {stored} records before it, the file has {found}"
            ),
            EventCount { stored, found, .. } => write!(
                f,
                "trailer counts {stored} events, the CPU records hold {found}"
            ),
            OverrunCount { stored, found, .. } => write!(
                f,
                "trailer counts {stored} overruns, the CPU records report {found}"
            ),
            ZeroId { kind, .. } => {
                if kind == crate::RECORD_CACHE {
                    write!(
                        f,
                        "CACHE record with cache id 0 (reserved for \"no cache\")"
                    )
                } else {
                    write!(
                        f,
                        "{} record with stack id 0 (0 means \"no stack\")",
                        record_name(kind)
                    )
                }
            }
            DuplicateId { kind, id, .. } => {
                let what = if kind == crate::RECORD_CACHE {
                    "cache"
                } else {
                    "stack"
                };
                write!(f, "second {} record for {what} id {id}", record_name(kind))
            }
            CacheNameLength {
                name_len,
                available,
                ..
            } => write!(
                f,
                "CACHE name_len {name_len} exceeds the {available} bytes left in the record"
            ),
            CacheNameUtf8 { .. } => write!(f, "CACHE name is not UTF-8"),
            StackLength {
                depth, available, ..
            } => write!(
                f,
                "STACK depth {depth} needs {} bytes, the record has {available}",
                depth.saturating_mul(FRAME_SIZE)
            ),
            StackDepth { depth, max, .. } => write!(
                f,
                "STACK depth {depth} exceeds the header's stack_depth {max}"
            ),
            CpuId { cpu, nr_cpus, .. } => write!(
                f,
                "CPU record for cpu {cpu}, the header says {nr_cpus} CPUs"
            ),
            CpuEventCount {
                nr_events,
                available,
                ..
            } => write!(
                f,
                "CPU record says {nr_events} events ({} bytes), the record has {available} bytes for them",
                nr_events.saturating_mul(EVENT_SIZE)
            ),
            EventKind { value, .. } => write!(f, "event kind {value} is not 1..=4"),
            EventType { value, .. } => write!(f, "event type {value} is not 1..=3"),
            EventCpu { event_cpu, cpu, .. } => write!(
                f,
                "event of cpu {event_cpu} inside the CPU record of cpu {cpu}"
            ),
        }
    }
}

impl core::error::Error for DumpFormatError {}

/// The fixed part of a body of `kind`, in bytes (0 for unknown kinds).
pub(crate) fn fixed_body_size(kind: u16) -> usize {
    match kind {
        crate::RECORD_CACHE => CACHE_BODY_SIZE,
        crate::RECORD_STACK => crate::STACK_BODY_SIZE,
        crate::RECORD_CPU => CPU_BODY_SIZE,
        crate::RECORD_TRAILER => TRAILER_BODY_SIZE,
        crate::RECORD_MARK => crate::MARK_BODY_SIZE,
        _ => 0,
    }
}
