//! The 64-byte event: what happened ([`EventKind`]), through which
//! interface ([`EventType`]), and the raw record ([`KmemtraceEvent`]).

use core::ops::Deref;

use crate::{DumpFormatError, EVENT_SIZE, le_array, le_u16, le_u32, le_u64};

/// What happened (event byte 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(u8)]
pub enum EventKind {
    /// A caller got memory.
    Alloc = 1,
    /// A caller gave memory back.
    Free = 2,
    /// An allocation failed (pointer 0).
    FailedAlloc = 3,
    /// A free was refused (double free, foreign pointer, wrong cache...).
    BadFree = 4,
}

impl EventKind {
    /// The kind for event byte `value`, if it is one.
    pub fn from_u8(value: u8) -> Option<Self> {
        Some(match value {
            1 => EventKind::Alloc,
            2 => EventKind::Free,
            3 => EventKind::FailedAlloc,
            4 => EventKind::BadFree,
            _ => return None,
        })
    }

    /// The name reports use (`alloc`, `free`, `failed alloc`, `bad free`).
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
#[repr(u8)]
pub enum EventType {
    /// `kmalloc`/`kfree`, including `GlobalAlloc`, `Allocator`, `krealloc`.
    Kmalloc = 1,
    /// `kmem_cache_alloc`/`kmem_cache_free`.
    Cache = 2,
    /// Page-granular kmalloc (above the largest kmalloc size class, 8 KiB).
    Pages = 3,
}

impl EventType {
    /// The type for event byte `value`, if it is one.
    pub fn from_u8(value: u8) -> Option<Self> {
        Some(match value {
            1 => EventType::Kmalloc,
            2 => EventType::Cache,
            3 => EventType::Pages,
            _ => return None,
        })
    }

    /// The name reports use (`kmalloc`, `cache`, `pages`).
    pub fn name(self) -> &'static str {
        match self {
            EventType::Kmalloc => "kmalloc",
            EventType::Cache => "cache",
            EventType::Pages => "pages",
        }
    }
}

/// One event, 64 bytes, exactly as it appears in a dump (little-endian
/// fields in this order, no padding). The recorder stores it as is into
/// its ring slots; there `timestamp_ns` holds the raw clock reading, which
/// the dump converts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[repr(C)]
pub struct KmemtraceEvent {
    /// [`EventKind`] as a number (offset 0).
    pub event: u8,
    /// [`EventType`] as a number (offset 1).
    pub type_id: u8,
    /// CPU that recorded the event (offset 2).
    pub cpu: u16,
    /// Cache id (0: page-granular, or no cache) (offset 4).
    pub cache_id: u32,
    /// Nanoseconds since boot (offset 8).
    pub timestamp_ns: u64,
    /// Per-CPU sequence number; counts dropped events too, so a gap is an
    /// overrun (offset 16).
    pub seq: u64,
    /// Return address of the caller, the first frame outside the
    /// allocator (offset 24).
    pub call_site: u64,
    /// The object (0 for a failed allocation) (offset 32).
    pub ptr: u64,
    /// Bytes the caller asked for (0 for frees) (offset 40).
    pub bytes_req: u64,
    /// Bytes the allocator gave: object size, or whole pages (offset 48).
    pub bytes_alloc: u64,
    /// [`EVENT_FLAG_ZEROED`](crate::EVENT_FLAG_ZEROED); other bits 0
    /// (offset 56).
    pub flags: u32,
    /// Stack id (0: none) (offset 60).
    pub stack_id: u32,
}

impl KmemtraceEvent {
    /// The 64 little-endian bytes of the dump format.
    pub fn to_bytes(&self) -> [u8; EVENT_SIZE] {
        let mut out = [0u8; EVENT_SIZE];
        out[0] = self.event;
        out[1] = self.type_id;
        out[2..4].copy_from_slice(&self.cpu.to_le_bytes());
        out[4..8].copy_from_slice(&self.cache_id.to_le_bytes());
        let words = [
            self.timestamp_ns,
            self.seq,
            self.call_site,
            self.ptr,
            self.bytes_req,
            self.bytes_alloc,
        ];
        for (index, word) in words.iter().enumerate() {
            out[8 + index * 8..16 + index * 8].copy_from_slice(&word.to_le_bytes());
        }
        out[56..60].copy_from_slice(&self.flags.to_le_bytes());
        out[60..64].copy_from_slice(&self.stack_id.to_le_bytes());
        out
    }

    /// Parse the dump format (the inverse of [`Self::to_bytes`]); any bytes
    /// are an event, [`Self::kind`] and [`Self::event_type`] say whether
    /// its first two are valid.
    pub fn from_bytes(bytes: &[u8; EVENT_SIZE]) -> Self {
        KmemtraceEvent {
            event: bytes[0],
            type_id: bytes[1],
            cpu: le_u16(bytes, 2),
            cache_id: le_u32(bytes, 4),
            timestamp_ns: le_u64(bytes, 8),
            seq: le_u64(bytes, 16),
            call_site: le_u64(bytes, 24),
            ptr: le_u64(bytes, 32),
            bytes_req: le_u64(bytes, 40),
            bytes_alloc: le_u64(bytes, 48),
            flags: le_u32(bytes, 56),
            stack_id: le_u32(bytes, 60),
        }
    }

    /// The event's kind, if byte 0 names one.
    pub fn kind(&self) -> Option<EventKind> {
        EventKind::from_u8(self.event)
    }

    /// The event's interface, if byte 1 names one.
    pub fn event_type(&self) -> Option<EventType> {
        EventType::from_u8(self.type_id)
    }
}

/// An event of a dump, checked (valid kind and type) and located: what a
/// reader works with. Its raw fields read through (`event.ptr`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct DecodedEvent {
    /// Alloc, free, failed alloc, bad free.
    pub kind: EventKind,
    /// kmalloc, cache or pages.
    pub event_type: EventType,
    /// Byte offset of the event (from the start of the dump, or wherever
    /// the reader moves it: a file of several dumps).
    pub offset: u64,
    /// The event's fields.
    pub raw: KmemtraceEvent,
}

impl DecodedEvent {
    /// Decode the event at `offset` (its 64 bytes).
    ///
    /// # Errors
    /// [`DumpFormatError::EventKind`] or [`DumpFormatError::EventType`]
    /// for a byte that names no kind or type.
    pub fn decode(bytes: &[u8; EVENT_SIZE], offset: usize) -> Result<Self, DumpFormatError> {
        let raw = KmemtraceEvent::from_bytes(bytes);
        let kind = raw.kind().ok_or(DumpFormatError::EventKind {
            offset,
            value: raw.event,
        })?;
        let event_type = raw.event_type().ok_or(DumpFormatError::EventType {
            offset: offset + 1,
            value: raw.type_id,
        })?;
        Ok(DecodedEvent {
            kind,
            event_type,
            offset: offset as u64,
            raw,
        })
    }
}

impl Deref for DecodedEvent {
    type Target = KmemtraceEvent;

    fn deref(&self) -> &KmemtraceEvent {
        &self.raw
    }
}

/// `bytes` (at least [`EVENT_SIZE`] long) as one event's bytes.
pub(crate) fn event_bytes(bytes: &[u8]) -> [u8; EVENT_SIZE] {
    le_array(&bytes[..EVENT_SIZE])
}
