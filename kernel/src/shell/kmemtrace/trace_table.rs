//! `kmemtrace start|stop|print|reset [CACHE|all]`: the per-cache trace
//! table (Akaros semantics; the mechanism is in `magpie-slab`). Reached
//! from the `kmemtrace` row in `mod.rs`, whose help lists these forms.
//!
//! # Printing with no free memory
//!
//! `kmemtrace print` allocates nothing: it is the tool people reach for
//! when memory has run out. It streams the records through a fixed chunk
//! reserved at boot ([`CHUNK`] records, `.bss`), in address order: each
//! pass takes the cache's trace lock once, copies the next [`CHUNK`]
//! records above the last address printed, releases the lock, and prints
//! them. So nothing is printed while the lock is held (printing may
//! allocate from the traced cache, into a `String` sink say, which takes
//! that lock), and nothing allocates under it.
//!
//! What the print shows if objects come and go while it runs: every
//! object outstanding for the whole print is printed exactly once; an
//! object allocated meanwhile is printed if its address is above the
//! cursor; one freed meanwhile may already have been printed. The last
//! line gives the count printed, and the table's count at the end when it
//! differs. The per-site summary (at most [`MAX_SITES`] sites, the rest
//! folded into one "other sites" line) covers exactly the records printed.

use core::fmt::Write;

use magpie_slab::{KmemCache, TraceRecord};
use spin::Mutex;

use super::KMEMTRACE;
use crate::debug::symbols::Symbolized;
use crate::kmem::{KernelPlatform, SLAB};
use crate::shell::{Result, ShellError};

type Cache = KmemCache<KernelPlatform>;

/// `kmemtrace start|stop|print|reset [CACHE|all]`.
pub(super) fn cmd_trace_table<'a>(args: &[&'a str], out: &mut dyn Write) -> Result<'a> {
    let (verb, target) = match args {
        [verb] => (*verb, "all"),
        [verb, target] => (*verb, *target),
        _ => return Err(ShellError::Usage(&KMEMTRACE)),
    };
    if !matches!(verb, "start" | "stop" | "print" | "reset") {
        return Err(ShellError::Usage(&KMEMTRACE));
    }
    let one = match target {
        "all" => None,
        name => Some(
            SLAB.find_cache(name)
                .ok_or(ShellError::UnknownCache(name))?,
        ),
    };
    // Each verb visits `one` or every cache; the cache list lock is held
    // only by `for_each_cache` calls that neither allocate nor print.
    let each = |f: &mut dyn FnMut(&'static Cache)| match one {
        Some(cache) => f(cache),
        None => SLAB.for_each_cache(f),
    };
    match verb {
        "start" => match one {
            Some(cache) => {
                cache
                    .trace_start()
                    .map_err(|error| ShellError::Trace(cache.name(), error))?;
                let _ = writeln!(out, "tracing {}", cache.name());
            }
            None => {
                // `all`: every cache that may be traced (NOTRACE ones are skipped).
                let mut started = 0;
                each(&mut |cache| started += usize::from(cache.trace_start().is_ok()));
                let _ = writeln!(out, "tracing {started} caches (NOTRACE caches skipped)");
            }
        },
        "stop" => {
            each(&mut |cache| cache.trace_stop());
            let _ = writeln!(out, "stopped tracing {}", target);
        }
        "reset" => {
            let mut nr_dropped = 0;
            each(&mut |cache| {
                nr_dropped += cache.trace_stats().nr_records;
                cache.trace_reset();
            });
            let _ = writeln!(out, "dropped {nr_dropped} records from {target}");
        }
        _ => match one {
            Some(cache) => trace_print(cache, out),
            None => {
                // Printing happens outside the cache list lock: take the
                // caches one by one by position.
                // `print all` shows the caches that have something to show
                // (records, or records it could not keep); caches that are
                // traced but hold nothing get one line, not a block each.
                let mut index = 0;
                let mut nr_quiet = 0usize;
                while let Some(cache) = nth_cache(index) {
                    let stats = cache.trace_stats();
                    if stats.nr_records != 0 || stats.nr_dropped != 0 {
                        trace_print(cache, out);
                    } else if stats.tracing {
                        nr_quiet += 1;
                    }
                    index += 1;
                }
                if nr_quiet != 0 {
                    let _ = writeln!(out, "{nr_quiet} more traced caches: no outstanding objects");
                }
            }
        },
    }
    Ok(())
}

/// The `index`-th cache in list order (the list lock is released on return).
fn nth_cache(index: usize) -> Option<&'static Cache> {
    let mut seen = 0;
    let mut found = None;
    SLAB.for_each_cache(|cache| {
        if seen == index {
            found = Some(cache);
        }
        seen += 1;
    });
    found
}

/// Prints one record as an Akaros trace block: `Obj <address>, size, cpu,
/// at <ns since boot> ns, from <context>:`, then `#NN [<address>] function+0xoff` per frame
/// and a blank line. Used by `kmemtrace print` and `allocinfo ctx print`.
pub fn write_record(out: &mut dyn Write, record: &TraceRecord) {
    let _ = writeln!(
        out,
        "Obj {:#x}, size {}, cpu {}, at {} ns, from {}:",
        record.addr,
        record.size,
        record.cpu,
        crate::arch::tsc::cycles_to_ns(record.timestamp),
        record.ctx()
    );
    for (index, &address) in record.frames().iter().enumerate() {
        let _ = writeln!(
            out,
            "#{:02} [<{address:#018x}>] {}",
            index + 1,
            Symbolized(address)
        );
    }
    let _ = writeln!(out);
}

/// Records copied per pass of [`trace_print`].
pub const CHUNK: usize = 64;
/// Call sites the per-site summary of [`trace_print`] tells apart.
pub const MAX_SITES: usize = 32;

/// Objects and bytes per call site (the first frame outside the allocator).
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

/// What `kmemtrace print` works in: reserved at boot, so a print needs no
/// free memory. One print at a time.
struct PrintReserve {
    /// Records of the current pass, in the order they were copied.
    records: [TraceRecord; CHUNK],
    /// `(address, index in records)` of the current pass, sorted by address.
    order: [(usize, usize); CHUNK],
    sites: [Site; MAX_SITES],
}

static PRINT_RESERVE: Mutex<PrintReserve> = Mutex::new(PrintReserve {
    records: [crate::profiling::EMPTY_RECORD; CHUNK],
    order: [(0, 0); CHUNK],
    sites: [NO_SITE; MAX_SITES],
});

impl PrintReserve {
    /// Copies the (at most [`CHUNK`]) records of `cache` with the lowest
    /// addresses above `cursor` (all of them for `None`), under the trace
    /// lock. Returns how many, sorted in `order`.
    fn copy_next(&mut self, cache: &Cache, cursor: Option<usize>) -> usize {
        let mut len = 0;
        let Self { records, order, .. } = self;
        cache.trace_for_each(|record: &TraceRecord| {
            if cursor.is_some_and(|cursor| record.addr <= cursor) {
                return;
            }
            // Slot for the record: a free one, or the highest address's
            // if this one is lower.
            let slot = if len < CHUNK {
                len += 1;
                len - 1
            } else if record.addr < order[CHUNK - 1].0 {
                order[CHUNK - 1].1
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

    fn add_site(&mut self, record: &TraceRecord, other: &mut Site) {
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
            None => other,
        };
        site.nr_objects += 1;
        site.bytes += record.size;
    }
}

/// Prints one block per outstanding record (streamed in address order, see
/// the module documentation), a per-site summary and a count.
fn trace_print(cache: &'static Cache, out: &mut dyn Write) {
    let mut reserve = PRINT_RESERVE.lock();
    reserve.sites = [NO_SITE; MAX_SITES];
    let mut other = NO_SITE;
    let _ = writeln!(out, "Dumping outstanding allocs from {}", cache.name());
    let _ = writeln!(out, "-------------------------");
    let mut cursor = None;
    let mut nr_shown = 0usize;
    loop {
        let len = reserve.copy_next(cache, cursor);
        for index in 0..len {
            let (addr, slot) = reserve.order[index];
            let record = reserve.records[slot];
            write_record(out, &record);
            reserve.add_site(&record, &mut other);
            cursor = Some(addr);
        }
        nr_shown += len;
        if len < CHUNK {
            break;
        }
    }
    let stats = cache.trace_stats();

    let sites = &mut reserve.sites;
    let nr_sites = sites.iter().take_while(|site| site.nr_objects > 0).count();
    let sites = &mut sites[..nr_sites];
    if !sites.is_empty() {
        sites.sort_unstable_by_key(|site| (core::cmp::Reverse(site.bytes), site.address));
        let _ = writeln!(out, "By call site:");
        for site in sites.iter() {
            let _ = writeln!(
                out,
                "  {:>6} objects {:>10} bytes  {}",
                site.nr_objects,
                site.bytes,
                Symbolized(site.address)
            );
        }
        if other.nr_objects > 0 {
            let _ = writeln!(
                out,
                "  {:>6} objects {:>10} bytes  (other sites)",
                other.nr_objects, other.bytes
            );
        }
    }
    if stats.nr_records != nr_shown {
        let _ = writeln!(
            out,
            "{} records at the end of the print (objects came and went while it ran)",
            stats.nr_records
        );
    }
    let _ = writeln!(
        out,
        "{} outstanding object{} in {}, {} record{} dropped (tracing {})",
        nr_shown,
        if nr_shown == 1 { "" } else { "s" },
        cache.name(),
        stats.nr_dropped,
        if stats.nr_dropped == 1 { "" } else { "s" },
        if stats.tracing { "on" } else { "off" }
    );
}
