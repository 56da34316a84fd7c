//! The kmemtrace dump reader (ABI version 1, `docs/KMEMTRACE-ABI.md`).
//!
//! A dump is `HEADER (64 bytes) | RECORD* | TRAILER record`, all integers
//! little-endian. [`Dump::parse`] reads it in two passes:
//!
//! 1. **Framing**: the header, then each record's 8-byte header (kind,
//!    length), up to the trailer. A record that runs past the end of the
//!    file, or a file with no trailer, is *truncated*; a length that is not
//!    a multiple of 8 (or below 8) is *corrupt*.
//! 2. **Checksum**, then **bodies**: the trailer's CRC-32/IEEE must match
//!    every byte before the trailer, so a flipped bit anywhere is reported
//!    as a checksum mismatch rather than as a strange event; then CACHE,
//!    STACK and CPU bodies are decoded and checked against the header (CPU
//!    ids, event kinds) and the trailer's counts.
//!
//! Every error names the byte offset where it was found ([`DumpError`]).

use std::collections::BTreeMap;
use std::fmt;

/// `b"MAGPKMT\0"`, the first 8 bytes of a dump.
pub const MAGIC: [u8; 8] = *b"MAGPKMT\0";
/// The ABI version this reader understands (`KMEMTRACE_ABI_VERSION`).
pub const ABI_VERSION: u32 = 1;
/// Size of the dump header in bytes.
pub const HEADER_SIZE: usize = 64;
/// Size of one event in bytes.
pub const EVENT_SIZE: usize = 64;
/// Size of a record header (kind, reserved, length) in bytes.
pub const RECORD_HEADER_SIZE: usize = 8;

/// Record kind: a cache id → name record.
pub const KIND_CACHE: u16 = 1;
/// Record kind: one deduplicated backtrace.
pub const KIND_STACK: u16 = 2;
/// Record kind: a batch of one CPU's events.
pub const KIND_CPU: u16 = 3;
/// Record kind: the trailer (counts and checksum), always last.
pub const KIND_TRAILER: u16 = 0xFFFF;
/// Size of the trailer body in bytes.
pub const TRAILER_BODY_SIZE: usize = 32;

/// Header flag bit 0: events carry stack ids and STACK records exist.
pub const FLAG_STACKS: u32 = 1 << 0;
/// Header flag bit 1: recording began at boot (`kmemtrace=on`), so every
/// live object was allocated inside the record.
pub const FLAG_FROM_BOOT: u32 = 1 << 1;

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

/// The 64-byte dump header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// ABI version (always [`ABI_VERSION`] once parsed).
    pub abi_version: u32,
    /// Number of CPUs the kernel ran; event CPU ids are `0..nr_cpus`.
    pub nr_cpus: u32,
    /// The kernel ELF's GNU build id (SHA-1); all zero if none.
    pub build_id: [u8; 20],
    /// [`FLAG_STACKS`], [`FLAG_FROM_BOOT`].
    pub flags: u32,
    /// Timestamp of `record start`, in nanoseconds since boot.
    pub record_start_ns: u64,
    /// Maximum frames per stack (0 without stacks).
    pub stack_depth: u32,
}

impl Header {
    /// Whether events carry stack ids.
    pub fn has_stacks(&self) -> bool {
        self.flags & FLAG_STACKS != 0
    }
    /// Whether recording began at boot.
    pub fn from_boot(&self) -> bool {
        self.flags & FLAG_FROM_BOOT != 0
    }
    /// Whether the build id is set (not all zero).
    pub fn has_build_id(&self) -> bool {
        self.build_id.iter().any(|&b| b != 0)
    }
    /// The build id as lowercase hex.
    pub fn build_id_hex(&self) -> String {
        hex(&self.build_id)
    }
}

/// Lowercase hex of a byte string.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// What happened (event byte 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum EventKind {
    /// An allocation that succeeded.
    Alloc,
    /// A free.
    Free,
    /// An allocation that failed (`ptr` is 0).
    FailedAlloc,
    /// A free the allocator refused (double free, unknown pointer, ...).
    BadFree,
}

impl EventKind {
    fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            1 => EventKind::Alloc,
            2 => EventKind::Free,
            3 => EventKind::FailedAlloc,
            4 => EventKind::BadFree,
            _ => return None,
        })
    }
    /// The name used in reports.
    pub fn name(self) -> &'static str {
        match self {
            EventKind::Alloc => "alloc",
            EventKind::Free => "free",
            EventKind::FailedAlloc => "failed alloc",
            EventKind::BadFree => "bad free",
        }
    }
}

/// Which interface the event came through (event byte 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum AllocType {
    /// `kmalloc`/`kfree`, including `GlobalAlloc`, `Allocator`, `krealloc`.
    Kmalloc,
    /// `kmem_cache_alloc`/`kmem_cache_free`.
    Cache,
    /// Page-granular kmalloc (larger than 8 KiB).
    Pages,
}

impl AllocType {
    fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            1 => AllocType::Kmalloc,
            2 => AllocType::Cache,
            3 => AllocType::Pages,
            _ => return None,
        })
    }
    /// The name used in reports.
    pub fn name(self) -> &'static str {
        match self {
            AllocType::Kmalloc => "kmalloc",
            AllocType::Cache => "cache",
            AllocType::Pages => "pages",
        }
    }
}

/// One 64-byte event, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// Alloc, free, failed alloc, bad free.
    pub kind: EventKind,
    /// kmalloc, cache or pages.
    pub alloc_type: AllocType,
    /// CPU that produced the event.
    pub cpu: u16,
    /// Cache id (0: no cache, e.g. pages).
    pub cache_id: u32,
    /// Nanoseconds since boot.
    pub timestamp_ns: u64,
    /// Per-CPU sequence number (a gap = events lost to overruns).
    pub seq: u64,
    /// Return address of the caller (first frame outside the allocator).
    pub call_site: u64,
    /// Object address (0 for a failed alloc).
    pub ptr: u64,
    /// Bytes requested (0 for a free unless known).
    pub bytes_req: u64,
    /// Bytes the allocator gave (object size or whole pages).
    pub bytes_alloc: u64,
    /// Bit 0: zeroed allocation.
    pub flags: u32,
    /// Stack id (0: none).
    pub stack_id: u32,
    /// Byte offset of this event in the dump file.
    pub offset: u64,
}

/// A CACHE record: cache id → name and geometry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cache {
    /// Cache id (>= 1).
    pub id: u32,
    /// Object size in bytes.
    pub obj_size: u32,
    /// Alignment in bytes.
    pub align: u32,
    /// The cache's flags word.
    pub flags: u32,
    /// Cache name (`kmalloc-128`, ...).
    pub name: String,
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
    pub events: Vec<Event>,
}

/// The trailer record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trailer {
    /// Total events in the dump.
    pub nr_events: u64,
    /// Total overruns, all CPUs.
    pub nr_overruns: u64,
    /// Records before the trailer.
    pub nr_records: u64,
    /// CRC-32/IEEE of every byte before the trailer record.
    pub checksum: u32,
    /// Offset of the trailer record.
    pub offset: u64,
}

/// A whole dump, decoded and validated.
#[derive(Debug, Clone)]
pub struct Dump {
    /// The header.
    pub header: Header,
    /// CACHE records by id.
    pub caches: BTreeMap<u32, Cache>,
    /// STACK records by id: frames innermost first.
    pub stacks: BTreeMap<u32, Vec<u64>>,
    /// CPU records in file order.
    pub cpu_records: Vec<CpuRecord>,
    /// The trailer.
    pub trailer: Trailer,
    /// Records of unknown kind that were skipped: (offset, kind).
    pub skipped: Vec<(u64, u16)>,
    /// Size of the file in bytes.
    pub file_size: u64,
    /// Offset of this dump in the file.
    pub offset: u64,
    /// Dumps before this one in the file (read, validated, not analysed).
    pub nr_earlier_dumps: usize,
}

fn u16_at(b: &[u8], o: usize) -> u16 {
    u16::from_le_bytes([b[o], b[o + 1]])
}
fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"))
}
fn u64_at(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"))
}

fn truncated(offset: usize, what: String) -> DumpError {
    DumpError::Truncated {
        offset: offset as u64,
        what,
    }
}
fn corrupt(offset: usize, what: String) -> DumpError {
    DumpError::Corrupt {
        offset: offset as u64,
        what,
    }
}

/// Record framing found by the first pass.
struct Frame {
    kind: u16,
    offset: usize,
    length: usize,
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
            if !(rest.starts_with(&MAGIC) || MAGIC.starts_with(rest)) {
                return Err(corrupt(
                    next,
                    format!(
                        "{} bytes after the trailer record that do not begin another dump",
                        rest.len()
                    ),
                ));
            }
            nr_earlier_dumps += 1;
            base = next;
        }
    }

    /// Adds `base` to every offset (the dump starts `base` bytes into the
    /// file).
    fn relocate(&mut self, base: u64) {
        self.offset += base;
        self.trailer.offset += base;
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
        let header = parse_header(bytes)?;
        let (frames, trailer_frame) = frame_records(bytes)?;
        let trailer = parse_trailer(bytes, &trailer_frame, frames.len())?;

        let mut dump = Dump {
            header,
            caches: BTreeMap::new(),
            stacks: BTreeMap::new(),
            cpu_records: Vec::new(),
            trailer,
            skipped: Vec::new(),
            file_size: bytes.len() as u64,
            offset: 0,
            nr_earlier_dumps: 0,
        };
        for frame in &frames {
            let body = &bytes[frame.offset + RECORD_HEADER_SIZE..frame.offset + frame.length];
            let body_offset = frame.offset + RECORD_HEADER_SIZE;
            match frame.kind {
                KIND_CACHE => {
                    let cache = parse_cache(body, body_offset)?;
                    if cache.id == 0 {
                        return Err(corrupt(
                            body_offset,
                            "CACHE record with cache id 0 (reserved for \"no cache\")".into(),
                        ));
                    }
                    if dump.caches.insert(cache.id, cache.clone()).is_some() {
                        return Err(corrupt(
                            body_offset,
                            format!("second CACHE record for cache id {}", cache.id),
                        ));
                    }
                }
                KIND_STACK => {
                    let (id, frames) = parse_stack(body, body_offset, &dump.header)?;
                    if dump.stacks.insert(id, frames).is_some() {
                        return Err(corrupt(
                            body_offset,
                            format!("second STACK record for stack id {id}"),
                        ));
                    }
                }
                KIND_CPU => {
                    let record = parse_cpu(body, frame.offset, &dump.header)?;
                    dump.cpu_records.push(record);
                }
                kind => dump.skipped.push((frame.offset as u64, kind)),
            }
        }

        let nr_events: u64 = dump.cpu_records.iter().map(|r| r.events.len() as u64).sum();
        if nr_events != dump.trailer.nr_events {
            return Err(corrupt(
                trailer_frame.offset + RECORD_HEADER_SIZE,
                format!(
                    "trailer counts {} events, the CPU records hold {nr_events}",
                    dump.trailer.nr_events
                ),
            ));
        }
        let nr_overruns: u64 = dump.cpu_records.iter().map(|r| r.nr_overruns).sum();
        if nr_overruns != dump.trailer.nr_overruns {
            return Err(corrupt(
                trailer_frame.offset + RECORD_HEADER_SIZE + 8,
                format!(
                    "trailer counts {} overruns, the CPU records report {nr_overruns}",
                    dump.trailer.nr_overruns
                ),
            ));
        }
        Ok((dump, trailer_frame.offset + trailer_frame.length))
    }

    /// Every event of every CPU record, in file order.
    pub fn events(&self) -> impl Iterator<Item = &Event> {
        self.cpu_records.iter().flat_map(|r| r.events.iter())
    }

    /// Number of events in the dump.
    pub fn nr_events(&self) -> u64 {
        self.trailer.nr_events
    }

    /// Events of all CPUs merged by timestamp (ties: frees before allocs,
    /// then CPU, then seq), the order every replay uses.
    pub fn merged_events(&self) -> Vec<&Event> {
        let mut all: Vec<&Event> = self.events().collect();
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

fn parse_header(bytes: &[u8]) -> Result<Header, DumpError> {
    if bytes.len() < 8 || bytes[..8] != MAGIC {
        if bytes.len() < 8 && MAGIC.starts_with(bytes) {
            return Err(truncated(
                0,
                format!(
                    "the {HEADER_SIZE}-byte header is cut short: {} bytes remain",
                    bytes.len()
                ),
            ));
        }
        return Err(corrupt(
            0,
            "not a kmemtrace dump: bad magic (expected \"MAGPKMT\\0\")".into(),
        ));
    }
    if bytes.len() < HEADER_SIZE {
        return Err(truncated(
            0,
            format!(
                "the {HEADER_SIZE}-byte header is cut short: {} bytes remain",
                bytes.len()
            ),
        ));
    }
    let abi_version = u32_at(bytes, 8);
    if abi_version != ABI_VERSION {
        return Err(DumpError::Abi {
            offset: 8,
            what: format!(
                "dump has ABI version {abi_version}, this magpie-kmem reads version {ABI_VERSION}"
            ),
        });
    }
    let header_size = u32_at(bytes, 12);
    if header_size as usize != HEADER_SIZE {
        return Err(DumpError::Abi {
            offset: 12,
            what: format!("header_size is {header_size}, ABI version 1 has {HEADER_SIZE}"),
        });
    }
    let event_size = u32_at(bytes, 16);
    if event_size as usize != EVENT_SIZE {
        return Err(DumpError::Abi {
            offset: 16,
            what: format!("event_size is {event_size}, ABI version 1 has {EVENT_SIZE}"),
        });
    }
    let nr_cpus = u32_at(bytes, 20);
    if nr_cpus == 0 || nr_cpus > u32::from(u16::MAX) {
        return Err(corrupt(20, format!("nr_cpus is {nr_cpus}")));
    }
    let mut build_id = [0u8; 20];
    build_id.copy_from_slice(&bytes[24..44]);
    Ok(Header {
        abi_version,
        nr_cpus,
        build_id,
        flags: u32_at(bytes, 44),
        record_start_ns: u64_at(bytes, 48),
        stack_depth: u32_at(bytes, 56),
    })
}

/// First pass: record framing up to and including the trailer (the bytes
/// after it, if any, are the next dump's).
fn frame_records(bytes: &[u8]) -> Result<(Vec<Frame>, Frame), DumpError> {
    let mut frames = Vec::new();
    let mut offset = HEADER_SIZE;
    loop {
        if offset == bytes.len() {
            return Err(truncated(
                offset,
                format!(
                    "no trailer record: the file ends after {} records",
                    frames.len()
                ),
            ));
        }
        if bytes.len() - offset < RECORD_HEADER_SIZE {
            return Err(truncated(
                offset,
                format!(
                    "record header needs {RECORD_HEADER_SIZE} bytes, the file ends {} bytes later",
                    bytes.len() - offset
                ),
            ));
        }
        let kind = u16_at(bytes, offset);
        let length = u32_at(bytes, offset + 4) as usize;
        if length < RECORD_HEADER_SIZE || !length.is_multiple_of(8) {
            return Err(corrupt(
                offset,
                format!(
                    "record (kind {kind:#x}) has length {length}, not a multiple of 8 of at least {RECORD_HEADER_SIZE}"
                ),
            ));
        }
        if length > bytes.len() - offset {
            return Err(truncated(
                offset,
                format!(
                    "record (kind {kind:#x}) of {length} bytes runs past the end of the file ({} bytes left)",
                    bytes.len() - offset
                ),
            ));
        }
        let frame = Frame {
            kind,
            offset,
            length,
        };
        offset += length;
        if kind == KIND_TRAILER {
            return Ok((frames, frame));
        }
        frames.push(frame);
    }
}

fn parse_trailer(bytes: &[u8], frame: &Frame, nr_records: usize) -> Result<Trailer, DumpError> {
    let body_offset = frame.offset + RECORD_HEADER_SIZE;
    if frame.length - RECORD_HEADER_SIZE < TRAILER_BODY_SIZE {
        return Err(corrupt(
            frame.offset,
            format!(
                "trailer body is {} bytes, it needs {TRAILER_BODY_SIZE}",
                frame.length - RECORD_HEADER_SIZE
            ),
        ));
    }
    let trailer = Trailer {
        nr_events: u64_at(bytes, body_offset),
        nr_overruns: u64_at(bytes, body_offset + 8),
        nr_records: u64_at(bytes, body_offset + 16),
        checksum: u32_at(bytes, body_offset + 24),
        offset: frame.offset as u64,
    };
    let computed = crc32fast::hash(&bytes[..frame.offset]);
    if computed != trailer.checksum {
        return Err(corrupt(
            body_offset + 24,
            format!(
                "checksum mismatch: the trailer says {:#010x}, bytes 0..{} hash to {computed:#010x}",
                trailer.checksum, frame.offset
            ),
        ));
    }
    if trailer.nr_records != nr_records as u64 {
        return Err(corrupt(
            body_offset + 16,
            format!(
                "trailer counts {} records before it, the file has {nr_records}",
                trailer.nr_records
            ),
        ));
    }
    Ok(trailer)
}

fn parse_cache(body: &[u8], body_offset: usize) -> Result<Cache, DumpError> {
    if body.len() < 24 {
        return Err(corrupt(
            body_offset,
            format!("CACHE body is {} bytes, it needs at least 24", body.len()),
        ));
    }
    let name_len = u32_at(body, 16) as usize;
    if name_len > body.len() - 24 {
        return Err(corrupt(
            body_offset + 16,
            format!(
                "CACHE name_len {name_len} exceeds the {} bytes left in the record",
                body.len() - 24
            ),
        ));
    }
    let name = std::str::from_utf8(&body[24..24 + name_len])
        .map_err(|_| corrupt(body_offset + 24, "CACHE name is not UTF-8".into()))?;
    Ok(Cache {
        id: u32_at(body, 0),
        obj_size: u32_at(body, 4),
        align: u32_at(body, 8),
        flags: u32_at(body, 12),
        name: name.to_string(),
    })
}

fn parse_stack(
    body: &[u8],
    body_offset: usize,
    header: &Header,
) -> Result<(u32, Vec<u64>), DumpError> {
    if body.len() < 8 {
        return Err(corrupt(
            body_offset,
            format!("STACK body is {} bytes, it needs at least 8", body.len()),
        ));
    }
    let id = u32_at(body, 0);
    if id == 0 {
        return Err(corrupt(
            body_offset,
            "STACK record with stack id 0 (0 means \"no stack\")".into(),
        ));
    }
    let depth = u32_at(body, 4) as usize;
    if depth > (body.len() - 8) / 8 {
        return Err(corrupt(
            body_offset + 4,
            format!(
                "STACK depth {depth} needs {} bytes, the record has {}",
                depth * 8,
                body.len() - 8
            ),
        ));
    }
    if header.stack_depth != 0 && depth > header.stack_depth as usize {
        return Err(corrupt(
            body_offset + 4,
            format!(
                "STACK depth {depth} exceeds the header's stack_depth {}",
                header.stack_depth
            ),
        ));
    }
    let frames = (0..depth).map(|i| u64_at(body, 8 + 8 * i)).collect();
    Ok((id, frames))
}

fn parse_cpu(body: &[u8], record_offset: usize, header: &Header) -> Result<CpuRecord, DumpError> {
    let body_offset = record_offset + RECORD_HEADER_SIZE;
    if body.len() < 24 {
        return Err(corrupt(
            body_offset,
            format!("CPU body is {} bytes, it needs at least 24", body.len()),
        ));
    }
    let cpu = u32_at(body, 0);
    if cpu >= header.nr_cpus {
        return Err(corrupt(
            body_offset,
            format!(
                "CPU record for cpu {cpu}, the header says {} CPUs",
                header.nr_cpus
            ),
        ));
    }
    let nr_events = u32_at(body, 4) as usize;
    if nr_events > (body.len() - 24) / EVENT_SIZE {
        return Err(corrupt(
            body_offset + 4,
            format!(
                "CPU record says {nr_events} events ({} bytes), the record has {} bytes for them",
                nr_events * EVENT_SIZE,
                body.len() - 24
            ),
        ));
    }
    let nr_overruns = u64_at(body, 8);
    let mut events = Vec::with_capacity(nr_events);
    for i in 0..nr_events {
        let at = 24 + i * EVENT_SIZE;
        let e = &body[at..at + EVENT_SIZE];
        let offset = body_offset + at;
        let kind = EventKind::from_u8(e[0])
            .ok_or_else(|| corrupt(offset, format!("event kind {} is not 1..=4", e[0])))?;
        let alloc_type = AllocType::from_u8(e[1])
            .ok_or_else(|| corrupt(offset + 1, format!("event type {} is not 1..=3", e[1])))?;
        let event_cpu = u16_at(e, 2);
        if u32::from(event_cpu) != cpu {
            return Err(corrupt(
                offset + 2,
                format!("event of cpu {event_cpu} inside the CPU record of cpu {cpu}"),
            ));
        }
        events.push(Event {
            kind,
            alloc_type,
            cpu: event_cpu,
            cache_id: u32_at(e, 4),
            timestamp_ns: u64_at(e, 8),
            seq: u64_at(e, 16),
            call_site: u64_at(e, 24),
            ptr: u64_at(e, 32),
            bytes_req: u64_at(e, 40),
            bytes_alloc: u64_at(e, 48),
            flags: u32_at(e, 56),
            stack_id: u32_at(e, 60),
            offset: offset as u64,
        });
    }
    Ok(CpuRecord {
        cpu,
        nr_overruns,
        offset: record_offset as u64,
        events,
    })
}
