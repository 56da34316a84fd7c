//! Records: the 8-byte record header, the CACHE, STACK and CPU bodies and
//! the trailer, each with its encoder and its checked decoder.

use crate::error::fixed_body_size;
use crate::event::event_bytes;
use crate::{
    CACHE_BODY_SIZE, CPU_BODY_SIZE, DecodedEvent, DumpFormatError, EVENT_SIZE, FRAME_SIZE,
    KmemtraceEvent, KmemtraceHeader, MARK_BODY_SIZE, RECORD_ALIGN, RECORD_CACHE, RECORD_CPU,
    RECORD_HEADER_SIZE, RECORD_MARK, RECORD_STACK, RECORD_TRAILER, STACK_BODY_SIZE,
    TRAILER_BODY_SIZE, TRAILER_SIZE, le_u16, le_u32, le_u64,
};

/// The name of a record kind in messages (`CACHE`, `STACK`, `CPU`,
/// `TRAILER`; `unknown` for others).
pub fn record_name(kind: u16) -> &'static str {
    match kind {
        RECORD_CACHE => "CACHE",
        RECORD_STACK => "STACK",
        RECORD_CPU => "CPU",
        RECORD_TRAILER => "TRAILER",
        RECORD_MARK => "MARK",
        _ => "unknown",
    }
}

/// A record's first 8 bytes: `kind u16, reserved u16, length u32`, the
/// length counting these 8 bytes and the body zero-padded to 8.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordHeader {
    /// `RECORD_*`; readers skip kinds they do not know.
    pub kind: u16,
    /// Bytes of the whole record, a multiple of [`RECORD_ALIGN`].
    pub length: u32,
}

impl RecordHeader {
    /// The header of a record of `kind` whose body has `body_len` bytes
    /// before padding.
    ///
    /// # Panics
    /// If the padded record does not fit the 32-bit length (4 GiB).
    pub fn for_body(kind: u16, body_len: usize) -> Self {
        let length = (RECORD_HEADER_SIZE + body_len).next_multiple_of(RECORD_ALIGN);
        RecordHeader {
            kind,
            length: u32::try_from(length).expect("a kmemtrace record is below 4 GiB"),
        }
    }

    /// The 8 bytes.
    pub fn to_bytes(&self) -> [u8; RECORD_HEADER_SIZE] {
        let mut out = [0u8; RECORD_HEADER_SIZE];
        out[0..2].copy_from_slice(&self.kind.to_le_bytes());
        out[4..8].copy_from_slice(&self.length.to_le_bytes());
        out
    }

    /// The record header at `offset` of `dump`, checked against the bytes
    /// left: the record fits and its length is a multiple of 8 of at least
    /// 8. `nr_records` (records before it) is for the no-trailer error.
    ///
    /// # Errors
    /// [`DumpFormatError::NoTrailer`] at the very end,
    /// [`DumpFormatError::RecordHeaderCutShort`],
    /// [`DumpFormatError::RecordLength`],
    /// [`DumpFormatError::RecordCutShort`].
    pub fn read(dump: &[u8], offset: usize, nr_records: u64) -> Result<Self, DumpFormatError> {
        let remaining = dump.len().saturating_sub(offset);
        if remaining == 0 {
            return Err(DumpFormatError::NoTrailer { offset, nr_records });
        }
        if remaining < RECORD_HEADER_SIZE {
            return Err(DumpFormatError::RecordHeaderCutShort { offset, remaining });
        }
        let kind = le_u16(dump, offset);
        let length = le_u32(dump, offset + 4);
        let size = length as usize;
        if size < RECORD_HEADER_SIZE || !size.is_multiple_of(RECORD_ALIGN) {
            return Err(DumpFormatError::RecordLength {
                offset,
                kind,
                length,
            });
        }
        if size > remaining {
            return Err(DumpFormatError::RecordCutShort {
                offset,
                kind,
                length,
                remaining,
            });
        }
        Ok(RecordHeader { kind, length })
    }
}

/// Write the header of a record of `kind` and the `fixed` part of its
/// body; the caller writes the `tail_len` bytes that follow, then the
/// padding this returns (in bytes).
fn begin_record(kind: u16, fixed: &[u8], tail_len: usize, out: &mut dyn FnMut(&[u8])) -> usize {
    let body_len = fixed.len() + tail_len;
    let header = RecordHeader::for_body(kind, body_len);
    out(&header.to_bytes());
    out(fixed);
    header.length as usize - RECORD_HEADER_SIZE - body_len
}

/// Write a whole record: header, `fixed`, `tail`, padding.
fn encode_record(kind: u16, fixed: &[u8], tail: &[u8], out: &mut dyn FnMut(&[u8])) {
    let padding = begin_record(kind, fixed, tail.len(), out);
    out(tail);
    out(&[0u8; RECORD_ALIGN][..padding]);
}

/// One framed record of a dump: its kind, where it is, its body (padding
/// included).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record<'a> {
    /// `RECORD_*`.
    pub kind: u16,
    /// Offset of the record (its header) in the dump.
    pub offset: usize,
    /// The bytes after the record header.
    pub body: &'a [u8],
}

impl<'a> Record<'a> {
    /// Offset of the body in the dump.
    pub fn body_offset(&self) -> usize {
        self.offset + RECORD_HEADER_SIZE
    }

    /// Decode the body, checked against `header` (CPU ids, stack depth).
    ///
    /// # Errors
    /// The [`DumpFormatError`] of the first fault, see each record's
    /// `decode`.
    pub fn decode(&self, header: &KmemtraceHeader) -> Result<RecordBody<'a>, DumpFormatError> {
        let offset = self.body_offset();
        Ok(match self.kind {
            RECORD_CACHE => RecordBody::Cache(CacheRecord::decode(self.body, offset)?),
            RECORD_STACK => RecordBody::Stack(StackRecord::decode(self.body, offset, header)?),
            RECORD_CPU => RecordBody::Cpu(CpuRecord::decode(self.body, offset, header)?),
            RECORD_TRAILER => RecordBody::Trailer(Trailer::decode(self.body, self.offset)?),
            RECORD_MARK => RecordBody::Mark(MarkRecord::decode(self.body, offset)?),
            kind => RecordBody::Unknown(kind),
        })
    }
}

/// A decoded record body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordBody<'a> {
    /// [`RECORD_CACHE`].
    Cache(CacheRecord<&'a str>),
    /// [`RECORD_STACK`].
    Stack(StackRecord<'a>),
    /// [`RECORD_CPU`].
    Cpu(CpuRecord<'a>),
    /// [`RECORD_TRAILER`].
    Trailer(Trailer),
    /// [`RECORD_MARK`].
    Mark(MarkRecord<&'a str>),
    /// A kind this version does not know (skipped).
    Unknown(u16),
}

/// The fixed part of a body of `kind` is there.
fn check_body(kind: u16, body: &[u8], offset: usize) -> Result<(), DumpFormatError> {
    let needed = fixed_body_size(kind);
    if body.len() < needed {
        return Err(DumpFormatError::BodyTooShort {
            offset,
            kind,
            length: body.len(),
            needed,
        });
    }
    Ok(())
}

/// A MARK record: what happened at a time, e.g. the shell command line
/// typed while recording (`timestamp_ns u64, cpu u32, text_len u32,
/// text`). Readers of ABI 1 that predate it skip it (an unknown kind).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MarkRecord<Text> {
    /// Nanoseconds since boot.
    pub timestamp_ns: u64,
    /// The CPU it happened on.
    pub cpu: u32,
    /// What happened, UTF-8.
    pub text: Text,
}

impl<Text: AsRef<str>> MarkRecord<Text> {
    /// Write the record (header, body, padding) to `out`.
    ///
    /// # Panics
    /// If the text is 4 GiB or longer.
    pub fn encode(&self, out: &mut dyn FnMut(&[u8])) {
        let text = self.text.as_ref().as_bytes();
        let text_len = u32::try_from(text.len()).expect("a mark is below 4 GiB");
        let mut fixed = [0u8; MARK_BODY_SIZE];
        fixed[..8].copy_from_slice(&self.timestamp_ns.to_le_bytes());
        fixed[8..12].copy_from_slice(&self.cpu.to_le_bytes());
        fixed[12..16].copy_from_slice(&text_len.to_le_bytes());
        encode_record(RECORD_MARK, &fixed, text, out);
    }
}

impl<'a> MarkRecord<&'a str> {
    /// Decode a MARK body found at `offset`. Text that is not UTF-8 is cut
    /// at its first bad byte (a mark is for people, not checked data).
    ///
    /// # Errors
    /// [`DumpFormatError::BodyTooShort`] when the body is shorter than its
    /// fixed part plus the text length it states.
    pub fn decode(body: &'a [u8], offset: usize) -> Result<Self, DumpFormatError> {
        check_body(RECORD_MARK, body, offset)?;
        let text_len = le_u32(body, 12) as usize;
        let Some(bytes) = body.get(MARK_BODY_SIZE..MARK_BODY_SIZE.saturating_add(text_len)) else {
            return Err(DumpFormatError::BodyTooShort {
                offset,
                kind: RECORD_MARK,
                length: body.len(),
                needed: MARK_BODY_SIZE.saturating_add(text_len),
            });
        };
        let text = match core::str::from_utf8(bytes) {
            Ok(text) => text,
            Err(error) => core::str::from_utf8(&bytes[..error.valid_up_to()]).unwrap_or_default(),
        };
        Ok(MarkRecord {
            timestamp_ns: le_u64(body, 0),
            cpu: le_u32(body, 8),
            text,
        })
    }
}

/// A CACHE record: a cache's id, geometry and name (one per cache at dump
/// time). `Name` is `&str` when decoded from bytes; a reader may keep an
/// owned `String`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CacheRecord<Name> {
    /// Cache id, from 1 (0 means "no cache": page-granular kmalloc).
    pub id: u32,
    /// Object size in bytes.
    pub obj_size: u32,
    /// Alignment in bytes.
    pub align: u32,
    /// The cache's `CacheFlags` bits (1 `NOTOUCH`, 2 `NOTRACE`, 4 `AUDIT`).
    pub flags: u32,
    /// The cache's name (`kmalloc-128`, ...), UTF-8.
    pub name: Name,
}

impl<Name> CacheRecord<Name> {
    /// The same record with its name converted (`str::to_string` to keep
    /// a decoded record after the bytes are gone).
    pub fn map_name<Other>(self, convert: impl FnOnce(Name) -> Other) -> CacheRecord<Other> {
        CacheRecord {
            id: self.id,
            obj_size: self.obj_size,
            align: self.align,
            flags: self.flags,
            name: convert(self.name),
        }
    }
}

impl<Name: AsRef<str>> CacheRecord<Name> {
    /// Write the record (header, body, padding) to `out`.
    ///
    /// # Panics
    /// If the name is 4 GiB or longer.
    pub fn encode(&self, out: &mut dyn FnMut(&[u8])) {
        let name = self.name.as_ref().as_bytes();
        let name_len = u32::try_from(name.len()).expect("a cache name is below 4 GiB");
        let mut fixed = [0u8; CACHE_BODY_SIZE];
        let words = [self.id, self.obj_size, self.align, self.flags, name_len];
        for (index, word) in words.iter().enumerate() {
            fixed[index * 4..index * 4 + 4].copy_from_slice(&word.to_le_bytes());
        }
        encode_record(RECORD_CACHE, &fixed, name, out);
    }
}

impl<'a> CacheRecord<&'a str> {
    /// Decode a CACHE body found at `offset`.
    ///
    /// # Errors
    /// [`DumpFormatError::BodyTooShort`], [`DumpFormatError::CacheNameLength`],
    /// [`DumpFormatError::CacheNameUtf8`], [`DumpFormatError::ZeroId`].
    pub fn decode(body: &'a [u8], offset: usize) -> Result<Self, DumpFormatError> {
        check_body(RECORD_CACHE, body, offset)?;
        let name_len = le_u32(body, 16) as usize;
        let available = body.len() - CACHE_BODY_SIZE;
        if name_len > available {
            return Err(DumpFormatError::CacheNameLength {
                offset: offset + 16,
                name_len,
                available,
            });
        }
        let name = core::str::from_utf8(&body[CACHE_BODY_SIZE..CACHE_BODY_SIZE + name_len])
            .map_err(|_| DumpFormatError::CacheNameUtf8 {
                offset: offset + CACHE_BODY_SIZE,
            })?;
        let id = le_u32(body, 0);
        if id == 0 {
            return Err(DumpFormatError::ZeroId {
                offset,
                kind: RECORD_CACHE,
            });
        }
        Ok(CacheRecord {
            id,
            obj_size: le_u32(body, 4),
            align: le_u32(body, 8),
            flags: le_u32(body, 12),
            name,
        })
    }
}

/// A STACK record, decoded: one distinct backtrace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct StackRecord<'a> {
    /// Stack id, from 1 (events name it; 0 means "no stack").
    pub id: u32,
    /// The frames' bytes (`depth` little-endian u64s).
    frames: &'a [u8],
}

impl<'a> StackRecord<'a> {
    /// Write a STACK record of `frames` (return addresses, innermost first:
    /// `frames[0]` is the call site) to `out`.
    ///
    /// # Panics
    /// If there are 2^32 frames or more.
    pub fn encode(id: u32, frames: &[u64], out: &mut dyn FnMut(&[u8])) {
        let depth = u32::try_from(frames.len()).expect("a stack is below 2^32 frames");
        let mut fixed = [0u8; STACK_BODY_SIZE];
        fixed[0..4].copy_from_slice(&id.to_le_bytes());
        fixed[4..8].copy_from_slice(&depth.to_le_bytes());
        // Frames are 8 bytes: no padding.
        begin_record(RECORD_STACK, &fixed, frames.len() * FRAME_SIZE, out);
        for frame in frames {
            out(&frame.to_le_bytes());
        }
    }

    /// Decode a STACK body found at `offset`, checked against the header's
    /// `stack_depth` (when it is not 0).
    ///
    /// # Errors
    /// [`DumpFormatError::BodyTooShort`], [`DumpFormatError::ZeroId`],
    /// [`DumpFormatError::StackLength`], [`DumpFormatError::StackDepth`].
    pub fn decode(
        body: &'a [u8],
        offset: usize,
        header: &KmemtraceHeader,
    ) -> Result<Self, DumpFormatError> {
        check_body(RECORD_STACK, body, offset)?;
        let id = le_u32(body, 0);
        if id == 0 {
            return Err(DumpFormatError::ZeroId {
                offset,
                kind: RECORD_STACK,
            });
        }
        let depth = le_u32(body, 4) as usize;
        let available = body.len() - STACK_BODY_SIZE;
        if depth > available / FRAME_SIZE {
            return Err(DumpFormatError::StackLength {
                offset: offset + 4,
                depth,
                available,
            });
        }
        if header.stack_depth != 0 && depth > header.stack_depth as usize {
            return Err(DumpFormatError::StackDepth {
                offset: offset + 4,
                depth,
                max: header.stack_depth,
            });
        }
        Ok(StackRecord {
            id,
            frames: &body[STACK_BODY_SIZE..STACK_BODY_SIZE + depth * FRAME_SIZE],
        })
    }

    /// Number of frames.
    pub fn depth(&self) -> usize {
        self.frames.len() / FRAME_SIZE
    }

    /// The frames, innermost first.
    pub fn frames(&self) -> impl ExactSizeIterator<Item = u64> + 'a {
        self.frames
            .chunks_exact(FRAME_SIZE)
            .map(|frame| le_u64(frame, 0))
    }
}

/// A CPU record, decoded: a batch of one CPU's events, in sequence order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CpuRecord<'a> {
    /// The CPU (below the header's `nr_cpus`).
    pub cpu: u32,
    /// Events dropped for a full ring that this record reports (a CPU's
    /// overruns ride in its first record, so the records sum to the
    /// total).
    pub nr_overruns: u64,
    /// Offset of the first event in the dump.
    events_offset: usize,
    /// `nr_events` events' bytes.
    events: &'a [u8],
}

impl<'a> CpuRecord<'a> {
    /// Write a CPU record of `events` to `out`.
    ///
    /// # Panics
    /// If there are 2^32 events or more.
    pub fn encode(
        cpu: u32,
        nr_overruns: u64,
        events: impl ExactSizeIterator<Item = KmemtraceEvent>,
        out: &mut dyn FnMut(&[u8]),
    ) {
        let nr_events = events.len();
        let mut fixed = [0u8; CPU_BODY_SIZE];
        fixed[0..4].copy_from_slice(&cpu.to_le_bytes());
        let count = u32::try_from(nr_events).expect("a CPU record holds below 2^32 events");
        fixed[4..8].copy_from_slice(&count.to_le_bytes());
        fixed[8..16].copy_from_slice(&nr_overruns.to_le_bytes());
        // Events are 64 bytes: no padding.
        begin_record(RECORD_CPU, &fixed, nr_events * EVENT_SIZE, out);
        for event in events {
            out(&event.to_bytes());
        }
    }

    /// Decode a CPU body found at `offset`, checked against the header's
    /// `nr_cpus`. The events are checked as [`Self::events`] yields them.
    ///
    /// # Errors
    /// [`DumpFormatError::BodyTooShort`], [`DumpFormatError::CpuId`],
    /// [`DumpFormatError::CpuEventCount`].
    pub fn decode(
        body: &'a [u8],
        offset: usize,
        header: &KmemtraceHeader,
    ) -> Result<Self, DumpFormatError> {
        check_body(RECORD_CPU, body, offset)?;
        let cpu = le_u32(body, 0);
        if cpu >= header.nr_cpus {
            return Err(DumpFormatError::CpuId {
                offset,
                cpu,
                nr_cpus: header.nr_cpus,
            });
        }
        let nr_events = le_u32(body, 4) as usize;
        let available = body.len() - CPU_BODY_SIZE;
        if nr_events > available / EVENT_SIZE {
            return Err(DumpFormatError::CpuEventCount {
                offset: offset + 4,
                nr_events,
                available,
            });
        }
        Ok(CpuRecord {
            cpu,
            nr_overruns: le_u64(body, 8),
            events_offset: offset + CPU_BODY_SIZE,
            events: &body[CPU_BODY_SIZE..CPU_BODY_SIZE + nr_events * EVENT_SIZE],
        })
    }

    /// Number of events.
    pub fn nr_events(&self) -> usize {
        self.events.len() / EVENT_SIZE
    }

    /// The events, each checked (kind, type, and the record's CPU).
    pub fn events(
        &self,
    ) -> impl ExactSizeIterator<Item = Result<DecodedEvent, DumpFormatError>> + 'a {
        let cpu = self.cpu;
        let events_offset = self.events_offset;
        self.events
            .chunks_exact(EVENT_SIZE)
            .enumerate()
            .map(move |(index, bytes)| {
                let offset = events_offset + index * EVENT_SIZE;
                let event = DecodedEvent::decode(&event_bytes(bytes), offset)?;
                if u32::from(event.cpu) != cpu {
                    return Err(DumpFormatError::EventCpu {
                        offset: offset + 2,
                        event_cpu: event.cpu,
                        cpu,
                    });
                }
                Ok(event)
            })
    }
}

/// The trailer record, last in a dump: counts and the checksum.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Trailer {
    /// Events in all CPU records.
    pub nr_events: u64,
    /// Overruns of all CPUs (the CPU records' sum).
    pub nr_overruns: u64,
    /// Records before the trailer.
    pub nr_records: u64,
    /// CRC-32/IEEE (as `crc32fast` computes it) of every byte of the dump
    /// before the trailer record.
    pub checksum: u32,
}

impl Trailer {
    /// The whole trailer record (header and body).
    pub fn to_bytes(&self) -> [u8; TRAILER_SIZE] {
        let mut out = [0u8; TRAILER_SIZE];
        let header = RecordHeader::for_body(RECORD_TRAILER, TRAILER_BODY_SIZE);
        out[0..8].copy_from_slice(&header.to_bytes());
        out[8..16].copy_from_slice(&self.nr_events.to_le_bytes());
        out[16..24].copy_from_slice(&self.nr_overruns.to_le_bytes());
        out[24..32].copy_from_slice(&self.nr_records.to_le_bytes());
        out[32..36].copy_from_slice(&self.checksum.to_le_bytes());
        out
    }

    /// Decode a trailer body; `record_offset` is the trailer record's.
    ///
    /// # Errors
    /// [`DumpFormatError::BodyTooShort`] (at the record's offset).
    pub fn decode(body: &[u8], record_offset: usize) -> Result<Self, DumpFormatError> {
        check_body(RECORD_TRAILER, body, record_offset)?;
        Ok(Trailer {
            nr_events: le_u64(body, 0),
            nr_overruns: le_u64(body, 8),
            nr_records: le_u64(body, 16),
            checksum: le_u32(body, 24),
        })
    }
}
