//! Error reports: one illumos-style report per detected error (after
//! `kmem_error` in illumos `usr/src/uts/common/os/kmem.c`), and a
//! fixed-size ring that keeps the latest ones for the shell (`kmem
//! errors`) and for tests.
//!
//! A report looks like this (frames symbolized by the platform's
//! [`ReportFormat`]; time is the transaction's [`Platform::now`] since the
//! clock's zero, `T` being boot in a kernel):
//!
//! ```text
//! kernel memory allocator: buffer modified after being freed
//! modification occurred at offset 0x18 (0xdeadbeefdeadbeef replaced by 0xdeadbeefde41beef)
//! buffer=0xffff8000005f9040  bufctl=0x0  cache: kmalloc-64
//! previous transaction on buffer 0xffff8000005f9040:
//! thread=cpu1  time=T+123.000 µs  slab=0xffff8000005f9f80  cache: kmalloc-64
//!   #01 [<0xffffffff8010963c>] magpie::shell::cmd_kfree+0x3c
//! ```
//!
//! Detection never panics the allocator: it reports (to the ring and to
//! the hook the kernel installs) and goes on safely; the kernel's policy
//! decides whether a report panics.
//!
//! [`Platform::now`]: crate::Platform::now

use core::fmt;

use super::time::Nanoseconds;
use crate::debug::{AuditRecord, CONTENTS_BYTES, Mismatch};

/// What went wrong (illumos `KMERR_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// A free object's poison was overwritten (a write after free).
    ModifiedAfterFree,
    /// A redzone was overwritten (a write past the end of an object).
    RedzoneViolation,
    /// A debug object's state word was neither allocated nor free (an
    /// overflow past the redzone, or a wild write).
    BadState,
    /// A free of an object that is already free.
    DuplicateFree,
    /// A free of a pointer inside slab memory but not at an object start,
    /// or in no live slab.
    InvalidFree,
    /// A free to a cache other than the object's own.
    WrongCache,
    /// A free of a pointer the allocator never handed out (not its memory).
    ForeignPointer,
    /// A slab's free-list link did not decode to a free object of that
    /// slab (the hardened free list caught an overwrite).
    FreeListCorrupted,
}

impl ErrorKind {
    /// The report's first line after `kernel memory allocator: `.
    pub fn headline(self) -> &'static str {
        match self {
            ErrorKind::ModifiedAfterFree => "buffer modified after being freed",
            ErrorKind::RedzoneViolation => "redzone violation: write past end of buffer",
            ErrorKind::BadState => "boundary tag corrupted",
            ErrorKind::DuplicateFree => "duplicate free: buffer freed twice",
            ErrorKind::InvalidFree => "invalid free: buffer not in cache",
            ErrorKind::WrongCache => "buffer freed to wrong cache",
            ErrorKind::ForeignPointer => "invalid free: pointer from another allocator",
            ErrorKind::FreeListCorrupted => "free list corrupted",
        }
    }

    /// A short name for tables and tests (`kmem errors` summary).
    pub fn name(self) -> &'static str {
        match self {
            ErrorKind::ModifiedAfterFree => "modified-after-free",
            ErrorKind::RedzoneViolation => "redzone",
            ErrorKind::BadState => "bad-state",
            ErrorKind::DuplicateFree => "duplicate-free",
            ErrorKind::InvalidFree => "invalid-free",
            ErrorKind::WrongCache => "wrong-cache",
            ErrorKind::ForeignPointer => "foreign-pointer",
            ErrorKind::FreeListCorrupted => "freelist-corrupted",
        }
    }
}

/// A cache name as stored in a report (at most 31 bytes).
#[derive(Clone, Copy, PartialEq, Eq, Default)]
pub struct ReportName {
    pub(crate) bytes: [u8; 31],
    pub(crate) len: u8,
}

impl ReportName {
    /// The empty name.
    pub const EMPTY: ReportName = ReportName {
        bytes: [0; 31],
        len: 0,
    };

    /// `name`, cut to 31 bytes at a character boundary.
    pub fn new(name: &str) -> ReportName {
        let mut len = name.len().min(31);
        while !name.is_char_boundary(len) {
            len -= 1;
        }
        let mut stored = ReportName::default();
        stored.bytes[..len].copy_from_slice(&name.as_bytes()[..len]);
        stored.len = len as u8;
        stored
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        core::str::from_utf8(&self.bytes[..self.len as usize]).unwrap_or("?")
    }
}

impl fmt::Debug for ReportName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl fmt::Display for ReportName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One detected error, with everything the report prints. Plain data
/// (`Copy`), so it can sit in the ring and be copied out under its lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ErrorReport {
    /// What went wrong.
    pub kind: ErrorKind,
    /// Number of this report since the allocator started (from 1).
    pub seq: u64,
    /// [`Platform::now`](crate::Platform::now) at detection.
    pub timestamp: u64,
    /// The CPU that detected it.
    pub cpu: u32,
    /// The cache the operation named (the caller's cache for a free).
    pub cache: ReportName,
    /// [`ErrorKind::WrongCache`]: the cache the buffer belongs to.
    pub owner: Option<ReportName>,
    /// The address the operation was given (or the object found bad).
    pub buffer: usize,
    /// Start of the object holding `buffer` (0 if none).
    pub object: usize,
    /// Bytes of a page-granular kmalloc block the report is about (whole
    /// pages; 0 for slab objects and unknown blocks).
    pub size: usize,
    /// The object's bufctl (bufctl caches; 0 otherwise).
    pub bufctl: usize,
    /// The object's slab (0 if none).
    pub slab: usize,
    /// Where the corruption is, and what it replaced (poison, redzone,
    /// state word, free-list link).
    pub corruption: Option<Mismatch>,
    /// Last allocation of the object (`AUDIT` caches).
    pub last_alloc: Option<AuditRecord>,
    /// Last free of the object (`AUDIT` caches).
    pub last_free: Option<AuditRecord>,
    /// The object's first bytes at its last free (`CONTENTS` caches).
    pub contents: Option<[u8; CONTENTS_BYTES]>,
}

impl ErrorReport {
    /// A report of `kind` about `buffer` in `cache`, with nothing else
    /// known yet (the detecting code fills in what it has).
    pub fn new(kind: ErrorKind, cache: &str, buffer: usize) -> ErrorReport {
        ErrorReport {
            kind,
            seq: 0,
            timestamp: 0,
            cpu: 0,
            cache: ReportName::new(cache),
            owner: None,
            buffer,
            object: 0,
            size: 0,
            bufctl: 0,
            slab: 0,
            corruption: None,
            last_alloc: None,
            last_free: None,
            contents: None,
        }
    }

    /// Offset of the corruption (or of `buffer`) from the object start.
    pub fn offset(&self) -> Option<usize> {
        match self.corruption {
            Some(mismatch) => Some(mismatch.offset),
            None if self.object != 0 => Some(self.buffer.wrapping_sub(self.object)),
            None => None,
        }
    }

    /// The report text, with frames and times as `format` renders them.
    pub fn display<'a>(&'a self, format: &'a dyn ReportFormat) -> impl fmt::Display + 'a {
        ReportDisplay {
            report: self,
            format,
        }
    }

    /// The recorded transactions, most recent first, with whether each is
    /// a free.
    fn transactions(&self) -> [Option<(AuditRecord, bool)>; 2] {
        let alloc = self
            .last_alloc
            .filter(AuditRecord::is_recorded)
            .map(|record| (record, false));
        let free = self
            .last_free
            .filter(AuditRecord::is_recorded)
            .map(|record| (record, true));
        match (alloc, free) {
            (Some(a), Some(f)) if a.0.timestamp > f.0.timestamp => [Some(a), Some(f)],
            (Some(a), Some(f)) => [Some(f), Some(a)],
            (a, f) => [f.or(a), None],
        }
    }
}

/// How a report renders what the allocator cannot know: symbol names and
/// the clock's unit. The defaults print raw addresses and clock ticks as
/// nanoseconds.
pub trait ReportFormat {
    /// Write `function+0xoff` for a return address (or nothing known: `?`).
    ///
    /// # Errors
    ///
    /// The error of `out` (`fmt::Error`), as is.
    fn symbol(&self, address: usize, out: &mut dyn fmt::Write) -> fmt::Result {
        let _ = address;
        out.write_str("?")
    }

    /// Nanoseconds since the clock's zero for a [`Platform::now`](crate::Platform::now)
    /// value.
    fn nanoseconds(&self, ticks: u64) -> u64 {
        ticks
    }
}

/// The default [`ReportFormat`]: no symbols, ticks as nanoseconds.
pub struct RawFormat;

impl ReportFormat for RawFormat {}

/// A report as text: see [`ErrorReport::display`].
pub(crate) struct ReportDisplay<'a> {
    report: &'a ErrorReport,
    format: &'a dyn ReportFormat,
}

impl fmt::Display for ReportDisplay<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let report = self.report;
        writeln!(f, "kernel memory allocator: {}", report.kind.headline())?;
        match report.kind {
            ErrorKind::WrongCache => {
                match report.owner {
                    Some(owner) => writeln!(f, "buffer was allocated from {owner},")?,
                    None => writeln!(f, "buffer was allocated as whole pages (kmalloc),")?,
                }
                writeln!(f, "caller attempting free to {}.", report.cache)?;
            }
            ErrorKind::DuplicateFree if report.size != 0 => writeln!(
                f,
                "buffer was allocated as whole pages (kmalloc): {} pages, {} bytes",
                report.size / crate::platform::PAGE_SIZE,
                report.size
            )?,
            ErrorKind::InvalidFree if report.object != 0 => writeln!(
                f,
                "not an object start: offset {:#x} into object {:#x}",
                report.buffer.wrapping_sub(report.object),
                report.object
            )?,
            ErrorKind::FreeListCorrupted => {
                if let Some(mismatch) = report.corruption {
                    writeln!(
                        f,
                        "free-list link at offset {:#x} decodes to {:#x}, not a free object of this slab",
                        mismatch.offset, mismatch.found
                    )?;
                }
            }
            _ => {
                if let Some(mismatch) = report.corruption {
                    // A left redzone's offsets are negative (wrapping).
                    let (sign, offset) = match mismatch.offset as isize {
                        ..0 => ("-", mismatch.offset.wrapping_neg()),
                        _ => ("", mismatch.offset),
                    };
                    writeln!(
                        f,
                        "modification occurred at offset {sign}{offset:#x} ({:#x} replaced by {:#x})",
                        mismatch.expected, mismatch.found
                    )?;
                }
            }
        }
        writeln!(
            f,
            "buffer={:#x}  bufctl={:#x}  cache: {}",
            report.buffer, report.bufctl, report.cache
        )?;
        let object = if report.object != 0 {
            report.object
        } else {
            report.buffer
        };
        for (index, transaction) in report.transactions().iter().enumerate() {
            let Some((record, _)) = transaction else {
                continue;
            };
            let which = if index == 0 { "previous" } else { "earlier" };
            let cache = report.owner.unwrap_or(report.cache);
            write_transaction(
                f,
                which,
                object,
                record,
                report.slab,
                cache.as_str(),
                self.format,
            )?;
        }
        if let Some(contents) = report.contents {
            f.write_str("contents at last free:")?;
            for byte in contents {
                write!(f, " {byte:02x}")?;
            }
            writeln!(f)?;
        }
        Ok(())
    }
}

/// One transaction block of a report (`which` is `previous`, `earlier`,
/// `last alloc`...):
///
/// ```text
/// previous transaction on buffer 0x...:
/// thread=cpu1  time=T+123.000 µs  slab=0x...  cache: kmalloc-64
///   #01 [<0x...>] function+0xoff
/// ```
///
/// # Errors
///
/// The error of `f` (`fmt::Error`), as is.
pub fn write_transaction(
    f: &mut dyn fmt::Write,
    which: &str,
    object: usize,
    record: &AuditRecord,
    slab: usize,
    cache: &str,
    format: &dyn ReportFormat,
) -> fmt::Result {
    writeln!(f, "{which} transaction on buffer {object:#x}:")?;
    writeln!(
        f,
        "thread=cpu{}  time=T+{}  slab={slab:#x}  cache: {cache}",
        record.cpu,
        Nanoseconds(format.nanoseconds(record.timestamp)),
    )?;
    for (depth, &frame) in record.frames().iter().enumerate() {
        write!(f, "  #{:02} [<{frame:#x}>] ", depth + 1)?;
        format.symbol(frame, f)?;
        writeln!(f)?;
    }
    Ok(())
}

/// Reports kept by the ring.
pub const ERROR_RING_SIZE: usize = 16;

/// Bytes of a report in the ring's wire form ([`ErrorReport::to_wire`]).
pub const ERROR_WIRE_SIZE: usize = 344;

/// The kinds in wire order (a kind's byte is its index).
const WIRE_KINDS: [ErrorKind; 8] = [
    ErrorKind::ModifiedAfterFree,
    ErrorKind::RedzoneViolation,
    ErrorKind::BadState,
    ErrorKind::DuplicateFree,
    ErrorKind::InvalidFree,
    ErrorKind::WrongCache,
    ErrorKind::ForeignPointer,
    ErrorKind::FreeListCorrupted,
];

/// Wire offsets (docs/VMCORE.md, "The error ring").
const W_KIND: usize = 1;
const W_FLAGS: usize = 2;
const W_CPU: usize = 4;
const W_SEQ: usize = 8;
const W_TIMESTAMP: usize = 16;
const W_CACHE: usize = 24;
const W_OWNER: usize = 56;
const W_WORDS: usize = 88;
const W_CORRUPTION: usize = 128;
const W_LAST_ALLOC: usize = 152;
const W_LAST_FREE: usize = 232;
const W_CONTENTS: usize = 312;
const _: () = assert!(W_CONTENTS + CONTENTS_BYTES == ERROR_WIRE_SIZE);
const _: () = assert!(crate::debug::AUDIT_FRAMES == 8);

const HAS_OWNER: u8 = 1;
const HAS_CORRUPTION: u8 = 2;
const HAS_LAST_ALLOC: u8 = 4;
const HAS_LAST_FREE: u8 = 8;
const HAS_CONTENTS: u8 = 16;

fn put(wire: &mut [u8], at: usize, bytes: &[u8]) {
    wire[at..at + bytes.len()].copy_from_slice(bytes);
}

fn get_u64(wire: &[u8], at: usize) -> u64 {
    let mut bytes = [0u8; 8];
    bytes.copy_from_slice(&wire[at..at + 8]);
    u64::from_le_bytes(bytes)
}

fn get_u32(wire: &[u8], at: usize) -> u32 {
    let mut bytes = [0u8; 4];
    bytes.copy_from_slice(&wire[at..at + 4]);
    u32::from_le_bytes(bytes)
}

/// A name as 32 wire bytes: its length, then its 31 bytes.
fn put_name(wire: &mut [u8], at: usize, name: &ReportName) {
    wire[at] = name.len;
    put(wire, at + 1, &name.bytes);
}

fn get_name(wire: &[u8], at: usize) -> Option<ReportName> {
    let len = wire[at];
    let mut name = ReportName {
        bytes: [0; 31],
        len,
    };
    name.bytes.copy_from_slice(&wire[at + 1..at + 32]);
    (usize::from(len) <= name.bytes.len()).then_some(name)
}

fn put_audit(wire: &mut [u8], at: usize, record: &AuditRecord) {
    put(wire, at, &record.timestamp.to_le_bytes());
    put(wire, at + 8, &record.cpu.to_le_bytes());
    put(wire, at + 12, &record.nr_frames.to_le_bytes());
    for (index, frame) in record.frames.iter().enumerate() {
        put(wire, at + 16 + 8 * index, &(*frame as u64).to_le_bytes());
    }
}

fn get_audit(wire: &[u8], at: usize) -> Option<AuditRecord> {
    let mut record = AuditRecord {
        timestamp: get_u64(wire, at),
        cpu: get_u32(wire, at + 8),
        nr_frames: get_u32(wire, at + 12),
        frames: [0; crate::debug::AUDIT_FRAMES],
    };
    for (index, frame) in record.frames.iter_mut().enumerate() {
        *frame = get_u64(wire, at + 16 + 8 * index) as usize;
    }
    (record.nr_frames as usize <= record.frames.len()).then_some(record)
}

impl ErrorReport {
    /// The report in the ring's wire form: fixed little-endian fields, so
    /// that a reader of a memory image (`magpie-kmem core CORE errors`)
    /// decodes it with [`ErrorReport::from_wire`] whatever the compiler
    /// made of this type's layout (byte 0 is 1: a report is there).
    pub fn to_wire(&self) -> [u8; ERROR_WIRE_SIZE] {
        let mut wire = [0u8; ERROR_WIRE_SIZE];
        wire[0] = 1;
        wire[W_KIND] = WIRE_KINDS
            .iter()
            .position(|kind| *kind == self.kind)
            .unwrap_or(0) as u8;
        let mut flags = 0;
        put(&mut wire, W_CPU, &self.cpu.to_le_bytes());
        put(&mut wire, W_SEQ, &self.seq.to_le_bytes());
        put(&mut wire, W_TIMESTAMP, &self.timestamp.to_le_bytes());
        put_name(&mut wire, W_CACHE, &self.cache);
        if let Some(owner) = &self.owner {
            flags |= HAS_OWNER;
            put_name(&mut wire, W_OWNER, owner);
        }
        for (index, word) in [self.buffer, self.object, self.size, self.bufctl, self.slab]
            .into_iter()
            .enumerate()
        {
            put(&mut wire, W_WORDS + 8 * index, &(word as u64).to_le_bytes());
        }
        if let Some(mismatch) = &self.corruption {
            flags |= HAS_CORRUPTION;
            put(
                &mut wire,
                W_CORRUPTION,
                &(mismatch.offset as u64).to_le_bytes(),
            );
            put(
                &mut wire,
                W_CORRUPTION + 8,
                &mismatch.expected.to_le_bytes(),
            );
            put(&mut wire, W_CORRUPTION + 16, &mismatch.found.to_le_bytes());
        }
        if let Some(record) = &self.last_alloc {
            flags |= HAS_LAST_ALLOC;
            put_audit(&mut wire, W_LAST_ALLOC, record);
        }
        if let Some(record) = &self.last_free {
            flags |= HAS_LAST_FREE;
            put_audit(&mut wire, W_LAST_FREE, record);
        }
        if let Some(contents) = &self.contents {
            flags |= HAS_CONTENTS;
            put(&mut wire, W_CONTENTS, contents);
        }
        wire[W_FLAGS] = flags;
        wire
    }

    /// A report from its wire form ([`ErrorReport::to_wire`]); `None` for
    /// an empty slot, fewer than `ERROR_WIRE_SIZE` (344) bytes, or bytes no
    /// report encodes to (an unknown kind, a name or stack too long).
    pub fn from_wire(wire: &[u8]) -> Option<ErrorReport> {
        if wire.len() < ERROR_WIRE_SIZE || wire[0] != 1 {
            return None;
        }
        let kind = *WIRE_KINDS.get(usize::from(wire[W_KIND]))?;
        let flags = wire[W_FLAGS];
        let word = |index: usize| get_u64(wire, W_WORDS + 8 * index) as usize;
        let mut report = ErrorReport::new(kind, "", word(0));
        report.seq = get_u64(wire, W_SEQ);
        report.timestamp = get_u64(wire, W_TIMESTAMP);
        report.cpu = get_u32(wire, W_CPU);
        report.cache = get_name(wire, W_CACHE)?;
        if flags & HAS_OWNER != 0 {
            report.owner = Some(get_name(wire, W_OWNER)?);
        }
        report.object = word(1);
        report.size = word(2);
        report.bufctl = word(3);
        report.slab = word(4);
        if flags & HAS_CORRUPTION != 0 {
            report.corruption = Some(Mismatch {
                offset: get_u64(wire, W_CORRUPTION) as usize,
                expected: get_u64(wire, W_CORRUPTION + 8),
                found: get_u64(wire, W_CORRUPTION + 16),
            });
        }
        if flags & HAS_LAST_ALLOC != 0 {
            report.last_alloc = Some(get_audit(wire, W_LAST_ALLOC)?);
        }
        if flags & HAS_LAST_FREE != 0 {
            report.last_free = Some(get_audit(wire, W_LAST_FREE)?);
        }
        if flags & HAS_CONTENTS != 0 {
            let mut contents = [0u8; CONTENTS_BYTES];
            contents.copy_from_slice(&wire[W_CONTENTS..W_CONTENTS + CONTENTS_BYTES]);
            report.contents = Some(contents);
        }
        Some(report)
    }
}

/// The latest [`ERROR_RING_SIZE`] reports, and how many there were. The
/// reports are kept in their wire form ([`ErrorReport::to_wire`]), which
/// a reader of a memory image decodes as the ring does.
pub struct ErrorRing {
    pub(crate) inner: spin::Mutex<RingInner>,
}

pub(crate) struct RingInner {
    /// Slot `(seq - 1) % ERROR_RING_SIZE` holds report `seq`; all zero:
    /// none.
    pub(crate) reports: [[u8; ERROR_WIRE_SIZE]; ERROR_RING_SIZE],
    /// Reports ever pushed (the seq of the newest).
    pub(crate) nr_reported: u64,
}

impl Default for ErrorRing {
    fn default() -> Self {
        ErrorRing::new()
    }
}

impl ErrorRing {
    /// An empty ring (usable in a `static`).
    pub const fn new() -> ErrorRing {
        ErrorRing {
            inner: spin::Mutex::new(RingInner {
                reports: [[0; ERROR_WIRE_SIZE]; ERROR_RING_SIZE],
                nr_reported: 0,
            }),
        }
    }

    /// Keep `report`, numbering it; returns its sequence number. The
    /// oldest report is overwritten when the ring is full.
    pub fn push(&self, mut report: ErrorReport) -> ErrorReport {
        let mut inner = self.inner.lock();
        inner.nr_reported += 1;
        report.seq = inner.nr_reported;
        let slot = (report.seq - 1) as usize % ERROR_RING_SIZE;
        inner.reports[slot] = report.to_wire();
        report
    }

    /// Reports ever pushed (including those overwritten since).
    pub fn nr_reported(&self) -> u64 {
        self.inner.lock().nr_reported
    }

    /// Copy the kept reports with `seq > after` into `out`, oldest first;
    /// returns how many were written (at most `out.len()`, the oldest
    /// first).
    pub fn read(&self, after: u64, out: &mut [ErrorReport]) -> usize {
        let inner = self.inner.lock();
        let first = inner
            .nr_reported
            .saturating_sub(ERROR_RING_SIZE as u64)
            .max(after)
            + 1;
        let mut written = 0;
        for seq in first..=inner.nr_reported {
            if written == out.len() {
                break;
            }
            let slot = &inner.reports[(seq - 1) as usize % ERROR_RING_SIZE];
            if let Some(report) = ErrorReport::from_wire(slot) {
                out[written] = report;
                written += 1;
            }
        }
        written
    }

    /// Forget every kept report (the count stays).
    #[cfg(test)]
    pub(crate) fn clear(&self) {
        self.inner.lock().reports = [[0; ERROR_WIRE_SIZE]; ERROR_RING_SIZE];
    }
}

/// `kmem errors`: how many reports there were since boot, then each kept
/// one (`reports`, oldest first) under a `--- error #SEQ (KIND)` line;
/// `no errors reported` when `nr_reported` is 0.
///
/// # Errors
///
/// The error of `out`, as is.
pub fn write_errors(
    out: &mut dyn fmt::Write,
    nr_reported: u64,
    reports: &[ErrorReport],
    format: &dyn ReportFormat,
) -> fmt::Result {
    if nr_reported == 0 {
        return writeln!(out, "no errors reported");
    }
    writeln!(
        out,
        "{nr_reported} error(s) reported since boot; the last {}:",
        reports.len()
    )?;
    for report in reports {
        writeln!(out, "--- error #{} ({})", report.seq, report.kind.name())?;
        write!(out, "{}", report.display(format))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::format;
    use std::string::String;

    use super::*;
    use crate::debug::{POISON_FREE, REDZONE_PATTERN};

    struct TestFormat;

    impl ReportFormat for TestFormat {
        fn symbol(&self, address: usize, out: &mut dyn fmt::Write) -> fmt::Result {
            write!(out, "func_{:x}+0x{:x}", address >> 8, address & 0xff)
        }
        fn nanoseconds(&self, ticks: u64) -> u64 {
            ticks * 1000
        }
    }

    fn audit(timestamp: u64, cpu: u32, frames: &[usize]) -> AuditRecord {
        let mut record = AuditRecord {
            timestamp,
            cpu,
            nr_frames: frames.len() as u32,
            frames: [0; 8],
        };
        record.frames[..frames.len()].copy_from_slice(frames);
        record
    }

    #[test]
    fn modified_after_free_report_is_illumos_style() {
        let mut report = ErrorReport::new(
            ErrorKind::ModifiedAfterFree,
            "kmalloc-64",
            0xffff_8000_005f_9040,
        );
        report.object = 0xffff_8000_005f_9040;
        report.slab = 0xffff_8000_005f_9f80;
        report.corruption = Some(Mismatch {
            offset: 0x18,
            expected: POISON_FREE,
            found: 0xdead_beef_de41_beef,
        });
        report.last_alloc = Some(audit(100, 0, &[0x1234]));
        report.last_free = Some(audit(123, 1, &[0x5678, 0x9abc]));
        let text = format!("{}", report.display(&TestFormat));
        let expected = "\
kernel memory allocator: buffer modified after being freed
modification occurred at offset 0x18 (0xdeadbeefdeadbeef replaced by 0xdeadbeefde41beef)
buffer=0xffff8000005f9040  bufctl=0x0  cache: kmalloc-64
previous transaction on buffer 0xffff8000005f9040:
thread=cpu1  time=T+123.000 µs  slab=0xffff8000005f9f80  cache: kmalloc-64
  #01 [<0x5678>] func_56+0x78
  #02 [<0x9abc>] func_9a+0xbc
earlier transaction on buffer 0xffff8000005f9040:
thread=cpu0  time=T+100.000 µs  slab=0xffff8000005f9f80  cache: kmalloc-64
  #01 [<0x1234>] func_12+0x34
";
        assert_eq!(text, expected);
        assert_eq!(report.offset(), Some(0x18));
    }

    #[test]
    fn wire_form_round_trips_every_field() {
        let mut report = ErrorReport::new(ErrorKind::WrongCache, "kmalloc-64", 0x1008);
        report.seq = 7;
        report.timestamp = 123_456;
        report.cpu = 3;
        report.owner = Some(ReportName::new("kmalloc-128"));
        report.object = 0x1000;
        report.size = 4096;
        report.bufctl = 0x2000;
        report.slab = 0x3000;
        report.corruption = Some(Mismatch {
            offset: usize::MAX - 7,
            expected: POISON_FREE,
            found: 1,
        });
        report.last_alloc = Some(audit(100, 0, &[0x1234]));
        report.last_free = Some(audit(123, 1, &[0x5678, 0x9abc]));
        report.contents = Some([0xab; CONTENTS_BYTES]);
        let wire = report.to_wire();
        assert_eq!(ErrorReport::from_wire(&wire), Some(report));
        for kind in WIRE_KINDS {
            let bare = ErrorReport::new(kind, "c", 1);
            assert_eq!(ErrorReport::from_wire(&bare.to_wire()), Some(bare));
        }
        // Empty, cut short, or no report's bytes: none.
        assert_eq!(ErrorReport::from_wire(&[0; ERROR_WIRE_SIZE]), None);
        assert_eq!(ErrorReport::from_wire(&wire[..100]), None);
        let mut bad = wire;
        bad[W_KIND] = 8;
        assert_eq!(ErrorReport::from_wire(&bad), None);
        let mut bad = wire;
        bad[W_CACHE] = 32;
        assert_eq!(ErrorReport::from_wire(&bad), None);
        let mut bad = wire;
        bad[W_LAST_FREE + 12] = 9;
        assert_eq!(ErrorReport::from_wire(&bad), None);
    }

    #[test]
    fn other_kinds() {
        let mut report = ErrorReport::new(ErrorKind::WrongCache, "kmalloc-64", 0x1000);
        report.owner = Some(ReportName::new("kmalloc-128"));
        let text = format!("{}", report.display(&RawFormat));
        assert!(text.starts_with(
            "kernel memory allocator: buffer freed to wrong cache\n\
             buffer was allocated from kmalloc-128,\n\
             caller attempting free to kmalloc-64.\n\
             buffer=0x1000  bufctl=0x0  cache: kmalloc-64\n"
        ));
        let mut report = ErrorReport::new(ErrorKind::RedzoneViolation, "dentry", 0x2000);
        report.corruption = Some(Mismatch {
            offset: 0x40,
            expected: REDZONE_PATTERN,
            found: 0xfeed_face_feed_fa41,
        });
        let text = format!("{}", report.display(&RawFormat));
        assert!(text.contains("redzone violation: write past end of buffer\n"));
        assert!(text.contains(
            "modification occurred at offset 0x40 (0xfeedfacefeedface replaced by 0xfeedfacefeedfa41)"
        ));
        let mut report = ErrorReport::new(ErrorKind::InvalidFree, "kmalloc-64", 0x3008);
        report.object = 0x3000;
        assert_eq!(report.offset(), Some(8));
        let text = format!("{}", report.display(&RawFormat));
        assert!(text.contains("not an object start: offset 0x8 into object 0x3000"));
        report.contents = Some([0x41; CONTENTS_BYTES]);
        let text = format!("{}", report.display(&RawFormat));
        assert!(text.ends_with(&format!("contents at last free:{}\n", " 41".repeat(32))));
        // Every kind has its own headline.
        let kinds = [
            ErrorKind::ModifiedAfterFree,
            ErrorKind::RedzoneViolation,
            ErrorKind::BadState,
            ErrorKind::DuplicateFree,
            ErrorKind::InvalidFree,
            ErrorKind::WrongCache,
            ErrorKind::ForeignPointer,
            ErrorKind::FreeListCorrupted,
        ];
        for (index, kind) in kinds.iter().enumerate() {
            for other in &kinds[index + 1..] {
                assert_ne!(kind.headline(), other.headline());
                assert_ne!(kind.name(), other.name());
            }
        }
    }

    #[test]
    fn names_are_cut_at_31_bytes() {
        let long: String = "x".repeat(40);
        assert_eq!(ReportName::new(&long).as_str().len(), 31);
        assert_eq!(ReportName::new("é".repeat(20).as_str()).as_str().len(), 30);
    }

    #[test]
    fn ring_keeps_the_latest_and_counts_all() {
        let ring = ErrorRing::new();
        let mut out = [ErrorReport::new(ErrorKind::InvalidFree, "", 0); ERROR_RING_SIZE];
        assert_eq!(ring.read(0, &mut out), 0);
        for index in 0..20 {
            let pushed = ring.push(ErrorReport::new(ErrorKind::DuplicateFree, "c", index));
            assert_eq!(pushed.seq, index as u64 + 1);
        }
        assert_eq!(ring.nr_reported(), 20);
        let nr = ring.read(0, &mut out);
        assert_eq!(nr, ERROR_RING_SIZE);
        assert_eq!(out[0].seq, 5);
        assert_eq!(out[0].buffer, 4);
        assert_eq!(out[nr - 1].seq, 20);
        // Only the newer ones.
        assert_eq!(ring.read(18, &mut out), 2);
        assert_eq!(out[0].seq, 19);
        // A small buffer gets the oldest first.
        let mut two = [out[0]; 2];
        assert_eq!(ring.read(0, &mut two), 2);
        assert_eq!(two[1].seq, 6);
        ring.clear();
        assert_eq!(ring.read(0, &mut out), 0);
        assert_eq!(ring.nr_reported(), 20);
    }
}
