//! # magpie-kmemtrace-format: the kmemtrace dump format, written once
//!
//! The Magpie slab allocator (`magpie-slab`) records every caller-visible
//! allocation and free as a 64-byte event in per-CPU rings and dumps them
//! as one binary file; the host tool `magpie-kmem` reads that file. This
//! crate is the one place where the bytes are laid out: the writer encodes
//! with it and the reader decodes with it, as `object`/`gimli` are the one
//! definition of ELF/DWARF for many tools. `no_std`, no `alloc`, no
//! `unsafe`; its only dependency is `crc32fast` for the trailer's checksum.
//!
//! ## Design source
//!
//! The 2008 kmemtrace RFC (Eduard-Gabriel Munteanu, Pekka Enberg):
//! fixed-size binary events in per-CPU relay buffers, an overrun counter,
//! and the analysis done offline by a separate tool; the event fields are
//! those of Linux's `kmem:kmalloc`/`kmem:kfree`/`kmem:kmem_cache_alloc`
//! tracepoints as `perf kmem stat` reads them (call site, pointer, bytes
//! requested, bytes allocated). The public description of the ABI is
//! `docs/KMEMTRACE-ABI.md`.
//!
//! ## Shape (ABI version [`KMEMTRACE_ABI_VERSION`])
//!
//! All integers are little-endian; all sizes are bytes; all times are
//! nanoseconds since boot.
//!
//! ```text
//! dump    = HEADER (64) | RECORD* | TRAILER record (40)
//! record  = kind u16 | reserved u16 | length u32 | body, zero-padded to 8
//! CACHE   = cache_id u32, obj_size u32, align u32, flags u32,
//!           name_len u32, reserved u32, name [u8; name_len]
//! STACK   = stack_id u32, depth u32, frames [u64; depth]
//! CPU     = cpu u32, nr_events u32, nr_overruns u64, reserved u64,
//!           events [64 bytes; nr_events]
//! TRAILER = nr_events u64, nr_overruns u64, nr_records u64,
//!           checksum u32 (CRC-32 of every byte before the trailer), reserved u32
//! ```
//!
//! | type | bytes |
//! | --- | --- |
//! | [`KmemtraceHeader`] | [`HEADER_SIZE`] |
//! | [`RecordHeader`] | [`RECORD_HEADER_SIZE`] |
//! | [`CacheRecord`] | [`CACHE_BODY_SIZE`] + name, padded |
//! | [`StackRecord`] | [`STACK_BODY_SIZE`] + 8 per frame |
//! | [`CpuRecord`] | [`CPU_BODY_SIZE`] + [`EVENT_SIZE`] per event |
//! | [`KmemtraceEvent`] | [`EVENT_SIZE`] |
//! | [`Trailer`] | [`TRAILER_SIZE`] (header and body) |
//!
//! A file may hold several dumps back to back (each `kmemtrace dump` of a
//! boot appends one): [`DumpLayout::len`] is where the next one starts.
//!
//! ## Writing and reading
//!
//! - **Writing**: [`DumpWriter`] streams a dump into a sink (`FnMut(&[u8])`)
//!   record by record, counting records, events and overruns and hashing
//!   every byte for the trailer; nothing is buffered.
//! - **Reading**: [`DumpLayout::parse`] checks the header, the framing of
//!   every record up to the trailer, the checksum and the record count (a
//!   flipped bit anywhere is a checksum mismatch, not a strange event);
//!   [`DumpLayout::records`] then yields each [`Record`], whose
//!   [`Record::decode`] checks its body against the header
//!   ([`RecordBody`]). Every error is a [`DumpFormatError`] that names the
//!   byte offset, from the start of the dump, where it was found.
//!
//! The event is `#[repr(C)]` in dump order, so the recorder stores a
//! [`KmemtraceEvent`] straight into its ring slot (eight stores, no
//! encoding on the allocation path) and converts only at dump time.
#![no_std]
#![forbid(unsafe_code)]

mod error;
mod event;
mod header;
mod read;
mod record;
mod write;

pub use error::{DumpFormatError, ErrorClass};
pub use event::{DecodedEvent, EventKind, EventType, KmemtraceEvent};
pub use header::KmemtraceHeader;
pub use read::{DumpLayout, Records};
pub use record::{
    CacheRecord, CpuRecord, MarkRecord, Record, RecordBody, RecordHeader, StackRecord, Trailer,
    record_name,
};
pub use write::{DumpSummary, DumpWriter};

/// Version of the dump format; bumped on any incompatible change.
pub const KMEMTRACE_ABI_VERSION: u32 = 1;
/// First 8 bytes of a dump.
pub const KMEMTRACE_MAGIC: [u8; 8] = *b"MAGPKMT\0";
/// Size of the dump header in bytes.
pub const HEADER_SIZE: usize = 64;
/// Size of one event in bytes (in the recorder's rings and in the dump).
pub const EVENT_SIZE: usize = 64;
/// Size of a record header (kind, reserved, length) in bytes.
pub const RECORD_HEADER_SIZE: usize = 8;
/// Record lengths (header and padded body) are multiples of this.
pub const RECORD_ALIGN: usize = 8;
/// Size of a CACHE body before the name, in bytes.
pub const CACHE_BODY_SIZE: usize = 24;
/// Size of a STACK body before the frames, in bytes.
pub const STACK_BODY_SIZE: usize = 8;
/// Size of one stack frame (a return address) in bytes.
pub const FRAME_SIZE: usize = 8;
/// Size of a CPU body before the events, in bytes.
pub const CPU_BODY_SIZE: usize = 24;
/// Size of the trailer body in bytes.
pub const TRAILER_BODY_SIZE: usize = 32;
/// Size of a trailer record in bytes (header and body).
pub const TRAILER_SIZE: usize = RECORD_HEADER_SIZE + TRAILER_BODY_SIZE;

/// Record kind: a cache's id, geometry and name.
pub const RECORD_CACHE: u16 = 1;
/// Record kind: one distinct backtrace.
pub const RECORD_STACK: u16 = 2;
/// Record kind: a batch of one CPU's events (one record per sub-buffer).
pub const RECORD_CPU: u16 = 3;
/// Record kind: a marker, what happened at a time (a shell command line).
pub const RECORD_MARK: u16 = 4;
/// Size of the fixed part of a MARK body (timestamp, CPU, text length).
pub const MARK_BODY_SIZE: usize = 16;
/// Record kind: the trailer (counts and checksum), last in a complete dump.
pub const RECORD_TRAILER: u16 = 0xFFFF;

/// Header flag: events carry stack ids and the dump has STACK records.
pub const HEADER_FLAG_STACKS: u32 = 1 << 0;
/// Header flag: recording began at boot (`kmemtrace=on`), so every live
/// object was allocated inside the record.
pub const HEADER_FLAG_FROM_BOOT: u32 = 1 << 1;

/// Event flag: the allocation was zeroed.
pub const EVENT_FLAG_ZEROED: u32 = 1;

const _: () = assert!(core::mem::size_of::<KmemtraceEvent>() == EVENT_SIZE);
const _: () = assert!(TRAILER_SIZE.is_multiple_of(RECORD_ALIGN));
const _: () = assert!(HEADER_SIZE.is_multiple_of(RECORD_ALIGN));
// STACK and CPU records need no padding: their fixed parts and their
// frames and events are whole multiples of the record alignment.
const _: () = assert!(
    STACK_BODY_SIZE.is_multiple_of(RECORD_ALIGN)
        && FRAME_SIZE.is_multiple_of(RECORD_ALIGN)
        && CPU_BODY_SIZE.is_multiple_of(RECORD_ALIGN)
        && EVENT_SIZE.is_multiple_of(RECORD_ALIGN)
);

/// The little-endian `u16` at `offset` of `bytes`.
///
/// # Panics
/// If `bytes` is shorter than `offset + 2` (callers check lengths first).
pub(crate) fn le_u16(bytes: &[u8], offset: usize) -> u16 {
    u16::from_le_bytes([bytes[offset], bytes[offset + 1]])
}

/// The little-endian `u32` at `offset` of `bytes` (panics as [`le_u16`]).
pub(crate) fn le_u32(bytes: &[u8], offset: usize) -> u32 {
    u32::from_le_bytes(le_array(&bytes[offset..offset + 4]))
}

/// The little-endian `u64` at `offset` of `bytes` (panics as [`le_u16`]).
pub(crate) fn le_u64(bytes: &[u8], offset: usize) -> u64 {
    u64::from_le_bytes(le_array(&bytes[offset..offset + 8]))
}

/// `bytes` as an array (`bytes.len()` must be `N`).
pub(crate) fn le_array<const N: usize>(bytes: &[u8]) -> [u8; N] {
    let mut out = [0u8; N];
    out.copy_from_slice(bytes);
    out
}
