//! The kmemtrace dump reader (ABI version 1, `docs/KMEMTRACE-ABI.md`).
//!
//! The layout is the `magpie-kmemtrace-format` crate's, which the writer
//! (`magpie-slab`) encodes with; this module checks a file with it and
//! builds the tables the analysis works on. A dump is
//! `HEADER (64 bytes) | RECORD* | TRAILER record`, all integers
//! little-endian. [`Dump::parse`] reads it in two passes:
//!
//! 1. **Framing** ([`DumpLayout::parse`]): the header, then each record's
//!    8-byte header (kind, length), up to the trailer. A record that runs
//!    past the end of the file, or a file with no trailer, is *truncated*;
//!    a length that is not a multiple of 8 (or below 8) is *corrupt*.
//! 2. **Checksum**, then **bodies**: the trailer's CRC-32/IEEE must match
//!    every byte before the trailer, so a flipped bit anywhere is reported
//!    as a checksum mismatch rather than as a strange event; then CACHE,
//!    STACK and CPU bodies are decoded and checked against the header (CPU
//!    ids, event kinds) and the trailer's counts.
//!
//! Every error names the byte offset where it was found ([`DumpError`]).

use std::collections::BTreeMap;
use std::fmt;

pub use magpie_kmemtrace_format::{
    CacheRecord, DecodedEvent, EventKind, EventType, KMEMTRACE_ABI_VERSION, KMEMTRACE_MAGIC,
    KmemtraceHeader, Trailer,
};
use magpie_kmemtrace_format::{
    DumpFormatError, DumpLayout, ErrorClass, RECORD_HEADER_SIZE, RecordBody,
};

/// Why a dump could not be read. Every variant names a byte offset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DumpError {
    /// The file ends before the structure it announces (no trailer, a
    /// record longer than what is left).
    Truncated {
        /// Offset of the structure that is cut short.
        offset: u64,
        /// What was being read.
        what: String,
    },
    /// The bytes are not a well-formed dump (bad magic, bad length, bad
    /// checksum, impossible field values).
    Corrupt {
        /// Offset of the bad field or record.
        offset: u64,
        /// What is wrong.
        what: String,
    },
    /// A dump of another ABI version or layout than this reader's.
    Abi {
        /// Offset of the mismatching header field.
        offset: u64,
        /// What is wrong.
        what: String,
    },
}

impl fmt::Display for DumpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DumpError::Truncated { offset, what } => {
                write!(f, "truncated dump at offset {offset} ({offset:#x}): {what}")
            }
            DumpError::Corrupt { offset, what } => {
                write!(f, "corrupt dump at offset {offset} ({offset:#x}): {what}")
            }
            DumpError::Abi { offset, what } => {
                write!(f, "ABI mismatch at offset {offset} ({offset:#x}): {what}")
            }
        }
    }
}

impl std::error::Error for DumpError {}

impl DumpError {
    /// A format error of the dump at the start of `bytes`, in this tool's
    /// words.
    fn from_format(error: DumpFormatError, bytes: &[u8]) -> DumpError {
        let offset = error.offset() as u64;
        let what = match error {
            DumpFormatError::Truncated => format!("{error}: {} bytes remain", bytes.len()),
            DumpFormatError::AbiVersion(version) => format!(
                "dump has ABI version {version}, this magpie-kmem reads version {KMEMTRACE_ABI_VERSION}"
            ),
            _ => error.to_string(),
        };
        match error.class() {
            ErrorClass::Truncated => DumpError::Truncated { offset, what },
            ErrorClass::Corrupt => DumpError::Corrupt { offset, what },
            ErrorClass::Abi => DumpError::Abi { offset, what },
        }
    }

    /// The same error with `base` added to its offset.
    fn shifted(self, base: u64) -> DumpError {
        match self {
            DumpError::Truncated { offset, what } => DumpError::Truncated {
                offset: offset + base,
                what,
            },
            DumpError::Corrupt { offset, what } => DumpError::Corrupt {
                offset: offset + base,
                what,
            },
            DumpError::Abi { offset, what } => DumpError::Abi {
                offset: offset + base,
                what,
            },
        }
    }
}

/// A CACHE record with its name owned: cache id → name and geometry.
pub type Cache = CacheRecord<String>;

/// Lowercase hex of a byte string.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// One CPU record: a batch of one CPU's events.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuRecord {
    /// The CPU.
    pub cpu: u32,
    /// Overruns this record reports (events dropped for a full buffer).
    pub nr_overruns: u64,
    /// Offset of the record in the file.
    pub offset: u64,
    /// The events, in seq order.
    pub events: Vec<DecodedEvent>,
}

/// A MARK record: what happened at a time (a shell command line).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mark {
    /// Nanoseconds since boot.
    pub timestamp_ns: u64,
    /// The CPU.
    pub cpu: u32,
    /// What happened.
    pub text: String,
}

/// A whole dump, decoded and validated.
#[derive(Debug, Clone)]
pub struct Dump {
    /// The header.
    pub header: KmemtraceHeader,
    /// CACHE records by id.
    pub caches: BTreeMap<u32, Cache>,
    /// STACK records by id: frames innermost first.
    pub stacks: BTreeMap<u32, Vec<u64>>,
    /// CPU records in file order.
    pub cpu_records: Vec<CpuRecord>,
    /// The trailer.
    pub trailer: Trailer,
    /// Offset of the trailer record in the file.
    pub trailer_offset: u64,
    /// Records of unknown kind that were skipped: (offset, kind).
    pub skipped: Vec<(u64, u16)>,
    /// MARK records (what the shell ran while recording), by time.
    pub marks: Vec<Mark>,
    /// Size of the file in bytes.
    pub file_size: u64,
    /// Offset of this dump in the file.
    pub offset: u64,
    /// Dumps before this one in the file (read, validated, not analysed).
    pub nr_earlier_dumps: usize,
}

impl Dump {
    /// Reads and validates a dump file and returns its last dump.
    ///
    /// A file may hold several dumps back to back (each `kmemtrace dump`
    /// of one boot appends one): every dump is read and validated in
    /// order, and the last is returned ([`Dump::nr_earlier_dumps`] says how
    /// many came before it). Offsets in errors and events are offsets in
    /// the file.
    ///
    /// # Errors
    ///
    /// [`DumpError::Truncated`] when the file ends inside a structure,
    /// [`DumpError::Corrupt`] (or another [`DumpError`]) when a dump is not
    /// well formed; each carries the offset in the file.
    pub fn parse(bytes: &[u8]) -> Result<Dump, DumpError> {
        let mut base = 0usize;
        let mut nr_earlier_dumps = 0usize;
        loop {
            let (mut dump, length) =
                Dump::parse_one(&bytes[base..]).map_err(|e| e.shifted(base as u64))?;
            dump.relocate(base as u64);
            dump.nr_earlier_dumps = nr_earlier_dumps;
            dump.file_size = bytes.len() as u64;
            let next = base + length;
            let rest = &bytes[next..];
            if rest.is_empty() {
                return Ok(dump);
            }
            if !(rest.starts_with(&KMEMTRACE_MAGIC) || KMEMTRACE_MAGIC.starts_with(rest)) {
                return Err(DumpError::Corrupt {
                    offset: next as u64,
                    what: format!(
                        "{} bytes after the trailer record that do not begin another dump",
                        rest.len()
                    ),
                });
            }
            nr_earlier_dumps += 1;
            base = next;
        }
    }

    /// Adds `base` to every offset (the dump starts `base` bytes into the
    /// file).
    fn relocate(&mut self, base: u64) {
        self.offset += base;
        self.trailer_offset += base;
        for (offset, _) in &mut self.skipped {
            *offset += base;
        }
        for record in &mut self.cpu_records {
            record.offset += base;
            for e in &mut record.events {
                e.offset += base;
            }
        }
    }

    /// Reads one dump at the start of `bytes`; returns it and its length.
    fn parse_one(bytes: &[u8]) -> Result<(Dump, usize), DumpError> {
        let format_error = |error| DumpError::from_format(error, bytes);
        let layout = DumpLayout::parse(bytes).map_err(format_error)?;
        let mut dump = Dump {
            header: layout.header,
            caches: BTreeMap::new(),
            stacks: BTreeMap::new(),
            cpu_records: Vec::new(),
            trailer: layout.trailer,
            trailer_offset: layout.trailer_offset as u64,
            skipped: Vec::new(),
            marks: Vec::new(),
            file_size: bytes.len() as u64,
            offset: 0,
            nr_earlier_dumps: 0,
        };
        for record in layout.records() {
            let duplicate = |id| DumpFormatError::DuplicateId {
                offset: record.body_offset(),
                kind: record.kind,
                id,
            };
            match record.decode(&dump.header).map_err(format_error)? {
                RecordBody::Cache(cache) => {
                    if dump.caches.contains_key(&cache.id) {
                        return Err(format_error(duplicate(cache.id)));
                    }
                    dump.caches.insert(cache.id, cache.map_name(str::to_string));
                }
                RecordBody::Stack(stack) => {
                    if dump
                        .stacks
                        .insert(stack.id, stack.frames().collect())
                        .is_some()
                    {
                        return Err(format_error(duplicate(stack.id)));
                    }
                }
                RecordBody::Cpu(cpu) => dump.cpu_records.push(CpuRecord {
                    cpu: cpu.cpu,
                    nr_overruns: cpu.nr_overruns,
                    offset: record.offset as u64,
                    events: cpu
                        .events()
                        .collect::<Result<_, _>>()
                        .map_err(format_error)?,
                }),
                RecordBody::Mark(mark) => dump.marks.push(Mark {
                    timestamp_ns: mark.timestamp_ns,
                    cpu: mark.cpu,
                    text: mark.text.to_string(),
                }),
                // (The layout's records stop before the trailer.)
                RecordBody::Trailer(_) | RecordBody::Unknown(_) => {
                    dump.skipped.push((record.offset as u64, record.kind));
                }
            }
        }

        let trailer_body = layout.trailer_offset + RECORD_HEADER_SIZE;
        let nr_events: u64 = dump.cpu_records.iter().map(|r| r.events.len() as u64).sum();
        if nr_events != dump.trailer.nr_events {
            return Err(format_error(DumpFormatError::EventCount {
                offset: trailer_body,
                stored: dump.trailer.nr_events,
                found: nr_events,
            }));
        }
        let nr_overruns: u64 = dump.cpu_records.iter().map(|r| r.nr_overruns).sum();
        if nr_overruns != dump.trailer.nr_overruns {
            return Err(format_error(DumpFormatError::OverrunCount {
                offset: trailer_body + 8,
                stored: dump.trailer.nr_overruns,
                found: nr_overruns,
            }));
        }
        dump.marks.sort_by_key(|mark| mark.timestamp_ns);
        Ok((dump, layout.len()))
    }

    /// Every event of every CPU record, in file order.
    pub fn events(&self) -> impl Iterator<Item = &DecodedEvent> {
        self.cpu_records.iter().flat_map(|r| r.events.iter())
    }

    /// Number of events in the dump.
    pub fn nr_events(&self) -> u64 {
        self.trailer.nr_events
    }

    /// Events of all CPUs merged by timestamp (ties: frees before allocs,
    /// then CPU, then seq), the order every replay uses.
    pub fn merged_events(&self) -> Vec<&DecodedEvent> {
        let mut all: Vec<&DecodedEvent> = self.events().collect();
        all.sort_by_key(|e| {
            (
                e.timestamp_ns,
                e.kind != EventKind::Free,
                e.cpu,
                e.seq,
                e.offset,
            )
        });
        all
    }

    /// The cache's name, `(pages)` for id 0, `cache#N` when no CACHE
    /// record names it.
    pub fn cache_name(&self, id: u32) -> String {
        match self.caches.get(&id) {
            Some(c) => c.name.clone(),
            None if id == 0 => "(pages)".into(),
            None => format!("cache#{id}"),
        }
    }
}
