//! The trace table's print (Akaros `kmem_trace_print`): one block per
//! outstanding object with its backtrace, then a summary by call site.
//!
//! # Printing with no free memory
//!
//! The print allocates nothing: it is the tool people reach for when
//! memory has run out. It streams the records through a
//! [`TracePrintBuffer`] the caller reserved (a `static`, say), in address
//! order: each pass takes the cache's trace lock once, copies the next
//! [`TRACE_PRINT_CHUNK`] records above the last address printed, releases
//! the lock and writes them. So nothing is written while the lock is held
//! (the sink may allocate from the traced cache, which takes that lock),
//! and nothing allocates under it.
//!
//! What the print shows if objects come and go while it runs: every
//! object outstanding for the whole print is printed exactly once; an
//! object allocated meanwhile is printed if its address is above the
//! cursor; one freed meanwhile may already have been printed. The last
//! line gives the count printed, and the table's count at the end when it
//! differs. The by-site summary (at most [`TRACE_PRINT_MAX_SITES`] sites,
//! the rest folded into one "other sites" line) covers exactly the
//! records printed.

use core::fmt::{self, Write};

use super::Nanoseconds;
use crate::allocator::Kmem;
use crate::cache::KmemCache;
use crate::platform::Platform;
use crate::reports::error::ReportFormat;
use crate::trace_table::{TRACE_MAX_FRAMES, TraceRecord};

/// Records copied per pass of [`trace_print`].
pub const TRACE_PRINT_CHUNK: usize = 64;
/// Call sites the by-site summary of [`trace_print`] tells apart.
pub const TRACE_PRINT_MAX_SITES: usize = 32;

/// A record holding nothing (for filling buffers in `const` context).
pub const EMPTY_TRACE_RECORD: TraceRecord = TraceRecord {
    addr: 0,
    size: 0,
    cpu: 0,
    timestamp: 0,
    context: [0; 32],
    context_len: 0,
    nr_frames: 0,
    frames: [0; TRACE_MAX_FRAMES],
};

/// Objects and bytes per call site (the first frame of the record).
#[derive(Clone, Copy)]
struct Site {
    address: usize,
    nr_objects: usize,
    bytes: usize,
}

const NO_SITE: Site = Site {
    address: 0,
    nr_objects: 0,
    bytes: 0,
};

/// The by-site summary of a trace block: objects and bytes per call site
/// (a record's first frame), at most [`TRACE_PRINT_MAX_SITES`] sites told
/// apart, the rest folded into "other sites". [`trace_print`] keeps one;
/// a reader of records from elsewhere (a memory image) adds its records
/// in the order it writes them and writes the summary after them.
#[derive(Clone, Copy)]
pub struct TraceSites {
    sites: [Site; TRACE_PRINT_MAX_SITES],
    other: Site,
}

impl Default for TraceSites {
    fn default() -> Self {
        TraceSites::new()
    }
}

impl TraceSites {
    /// No sites yet.
    pub const fn new() -> TraceSites {
        TraceSites {
            sites: [NO_SITE; TRACE_PRINT_MAX_SITES],
            other: NO_SITE,
        }
    }

    /// Count `record` at its call site.
    pub fn add(&mut self, record: &TraceRecord) {
        let address = record.frames().first().copied().unwrap_or(0);
        let site = match self
            .sites
            .iter_mut()
            .find(|site| site.nr_objects == 0 || site.address == address)
        {
            Some(site) => {
                site.address = address;
                site
            }
            None => &mut self.other,
        };
        site.nr_objects += 1;
        site.bytes += record.size;
    }

    /// Write the summary (most bytes first; nothing without records):
    ///
    /// ```text
    /// By call site:
    ///        1 objects         64 bytes  function+0xoff
    /// ```
    ///
    /// # Errors
    ///
    /// The error of `out`, as is.
    pub fn write(&mut self, out: &mut dyn Write, format: &dyn ReportFormat) -> fmt::Result {
        let nr_sites = self
            .sites
            .iter()
            .take_while(|site| site.nr_objects > 0)
            .count();
        let sites = &mut self.sites[..nr_sites];
        if sites.is_empty() {
            return Ok(());
        }
        sites.sort_unstable_by_key(|site| (core::cmp::Reverse(site.bytes), site.address));
        writeln!(out, "By call site:")?;
        for site in sites.iter() {
            write!(
                out,
                "  {:>6} objects {:>10} bytes  ",
                site.nr_objects, site.bytes
            )?;
            format.symbol(site.address, out)?;
            writeln!(out)?;
        }
        if self.other.nr_objects > 0 {
            writeln!(
                out,
                "  {:>6} objects {:>10} bytes  (other sites)",
                self.other.nr_objects, self.other.bytes
            )?;
        }
        Ok(())
    }
}

/// A trace block's first two lines: `Dumping outstanding allocs from NAME`
/// and a rule.
///
/// # Errors
///
/// The error of `out`, as is.
pub fn write_trace_header(out: &mut dyn Write, cache: &str) -> fmt::Result {
    writeln!(out, "Dumping outstanding allocs from {cache}")?;
    writeln!(out, "-------------------------")
}

/// A trace block's last line (after [`TraceSites::write`]): the records
/// shown, and, when `nr_records` (the table's count at the end) differs,
/// a line saying so before it.
///
/// # Errors
///
/// The error of `out`, as is.
pub fn write_trace_footer(
    out: &mut dyn Write,
    cache: &str,
    nr_shown: usize,
    nr_records: usize,
    nr_dropped: u64,
    tracing: bool,
) -> fmt::Result {
    if nr_records != nr_shown {
        writeln!(
            out,
            "{nr_records} records at the end of the print (objects came and went while it ran)"
        )?;
    }
    writeln!(
        out,
        "{} outstanding object{} in {}, {} record{} dropped (tracing {})",
        nr_shown,
        if nr_shown == 1 { "" } else { "s" },
        cache,
        nr_dropped,
        if nr_dropped == 1 { "" } else { "s" },
        if tracing { "on" } else { "off" }
    )
}

/// The line after every block of [`trace_print_all`]: how many traced
/// caches hold nothing (nothing when none).
///
/// # Errors
///
/// The error of `out`, as is.
pub fn write_trace_quiet(out: &mut dyn Write, nr_quiet: usize) -> fmt::Result {
    if nr_quiet != 0 {
        writeln!(out, "{nr_quiet} more traced caches: no outstanding objects")?;
    }
    Ok(())
}

/// What [`trace_print`] works in (about 20 KiB): reserve one at boot so a
/// print needs no free memory. One print at a time per buffer.
pub struct TracePrintBuffer {
    /// Records of the current pass, in the order they were copied.
    records: [TraceRecord; TRACE_PRINT_CHUNK],
    /// `(address, index in records)` of the current pass, sorted by address.
    order: [(usize, usize); TRACE_PRINT_CHUNK],
    sites: TraceSites,
}

impl Default for TracePrintBuffer {
    fn default() -> Self {
        TracePrintBuffer::new()
    }
}

impl TracePrintBuffer {
    /// An empty buffer (usable in a `static`).
    pub const fn new() -> TracePrintBuffer {
        TracePrintBuffer {
            records: [EMPTY_TRACE_RECORD; TRACE_PRINT_CHUNK],
            order: [(0, 0); TRACE_PRINT_CHUNK],
            sites: TraceSites::new(),
        }
    }

    /// Copies the (at most [`TRACE_PRINT_CHUNK`]) records of `cache` with
    /// the lowest addresses above `cursor` (all of them for `None`), under
    /// the trace lock. Returns how many, sorted in `order`.
    fn copy_next<P: Platform>(&mut self, cache: &KmemCache<P>, cursor: Option<usize>) -> usize {
        let mut len = 0;
        let Self { records, order, .. } = self;
        cache.trace_table().for_each(|record: &TraceRecord| {
            if cursor.is_some_and(|cursor| record.addr <= cursor) {
                return;
            }
            // Slot for the record: a free one, or the highest address's
            // if this one is lower.
            let slot = if len < TRACE_PRINT_CHUNK {
                len += 1;
                len - 1
            } else if record.addr < order[TRACE_PRINT_CHUNK - 1].0 {
                order[TRACE_PRINT_CHUNK - 1].1
            } else {
                return;
            };
            records[slot] = *record;
            // Insert (addr, slot) in address order among the first `len`
            // (the last entry is the slot being replaced or the new one).
            let mut at = len - 1;
            while at > 0 && order[at - 1].0 > record.addr {
                order[at] = order[at - 1];
                at -= 1;
            }
            order[at] = (record.addr, slot);
        });
        len
    }
}

/// One record as an Akaros trace block, used by [`trace_print`] and for
/// any other list of records (a kernel's context capture):
///
/// ```text
/// Obj 0xffff8000005f9040, size 64, cpu 0, at 128.058 ms, from cpu0 shell kmalloc:
/// #01 [<0xffffffff8010963c>] magpie::shell::kmem::cmd_kmalloc+0x3d5
///
/// ```
///
/// The time is `format`'s nanoseconds since the clock's zero, written by
/// [`Nanoseconds`]; frames are symbolized by `format`.
///
/// # Errors
///
/// The error of `out`, as is.
pub fn write_trace_record(
    out: &mut dyn Write,
    record: &TraceRecord,
    format: &dyn ReportFormat,
) -> fmt::Result {
    writeln!(
        out,
        "Obj {:#x}, size {}, cpu {}, at {}, from {}:",
        record.addr,
        record.size,
        record.cpu,
        Nanoseconds(format.nanoseconds(record.timestamp)),
        record.ctx()
    )?;
    for (index, &address) in record.frames().iter().enumerate() {
        write!(out, "#{:02} [<{address:#018x}>] ", index + 1)?;
        format.symbol(address, out)?;
        writeln!(out)?;
    }
    writeln!(out)
}

/// Prints the outstanding objects of `cache`'s trace table (streamed in
/// address order, see the module documentation), then the by-site summary
/// (most bytes first) and a count:
///
/// ```text
/// Dumping outstanding allocs from kmalloc-64
/// -------------------------
/// Obj 0x..., size 64, cpu 0, at 1.234 s, from cpu0 shell kmalloc:
/// #01 [<0x...>] function+0xoff
///
/// By call site:
///        1 objects         64 bytes  function+0xoff
/// 1 outstanding object in kmalloc-64, 0 records dropped (tracing on)
/// ```
///
/// # Errors
///
/// The error of `out`, as is.
pub fn trace_print<P: Platform>(
    out: &mut dyn Write,
    cache: &KmemCache<P>,
    buffer: &mut TracePrintBuffer,
    format: &dyn ReportFormat,
) -> fmt::Result {
    buffer.sites = TraceSites::new();
    write_trace_header(out, cache.name())?;
    let mut cursor = None;
    let mut nr_shown = 0usize;
    loop {
        let len = buffer.copy_next(cache, cursor);
        for index in 0..len {
            let (addr, slot) = buffer.order[index];
            let record = buffer.records[slot];
            write_trace_record(out, &record, format)?;
            buffer.sites.add(&record);
            cursor = Some(addr);
        }
        nr_shown += len;
        if len < TRACE_PRINT_CHUNK {
            break;
        }
    }
    let stats = cache.trace_table().stats();
    buffer.sites.write(out, format)?;
    write_trace_footer(
        out,
        cache.name(),
        nr_shown,
        stats.nr_records,
        stats.nr_dropped,
        stats.tracing,
    )
}

/// [`trace_print`] for every cache that has something to show (records,
/// or records it could not keep); caches that are traced but hold nothing
/// get one line at the end (`N more traced caches: no outstanding
/// objects`), not a block each. Caches are taken one at a time by
/// position, so nothing is written under the cache list lock.
///
/// # Errors
///
/// The error of `out`, as is.
pub fn trace_print_all<P: Platform>(
    out: &mut dyn Write,
    allocator: &Kmem<P>,
    buffer: &mut TracePrintBuffer,
    format: &dyn ReportFormat,
) -> fmt::Result {
    let mut index = 0;
    let mut nr_quiet = 0usize;
    while let Some(cache) = nth_cache(allocator, index) {
        let stats = cache.trace_table().stats();
        if stats.nr_records != 0 || stats.nr_dropped != 0 {
            trace_print(out, cache, buffer, format)?;
        } else if stats.tracing {
            nr_quiet += 1;
        }
        index += 1;
    }
    write_trace_quiet(out, nr_quiet)
}

/// The `index`-th cache in list order (the list lock is released on return).
fn nth_cache<P: Platform>(allocator: &Kmem<P>, index: usize) -> Option<&'static KmemCache<P>> {
    let mut seen = 0;
    let mut found = None;
    allocator.for_each_cache(|cache| {
        if seen == index {
            found = Some(cache);
        }
        seen += 1;
    });
    found
}
