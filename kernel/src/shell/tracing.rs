//! `kmemtrace start|stop|print|reset [CACHE|all]`: the per-cache trace
//! table (Akaros semantics; the mechanism is in `magpie-slab`).

use alloc::vec::Vec;
use core::fmt::Write;

use magpie_slab::{KmemCache, TraceRecord};

use super::{Command, Result, Shell, ShellError};
use crate::kmem::{KernelPlatform, SLAB};
use crate::symbols::Symbolized;

pub(super) const KMEMTRACE: Command = Command {
    name: "kmemtrace",
    help: &[
        (
            "kmemtrace start|stop|print|reset [CACHE|all]",
            "trace a cache's outstanding objects",
        ),
        (
            "kmemtrace record start [--stacks [DEPTH]] [CACHE|all]",
            "record every alloc and free as events (per-CPU rings)",
        ),
        (
            "kmemtrace record stop|status",
            "stop recording; events, overruns and fill per CPU",
        ),
        (
            "kmemtrace dump",
            "send the events to the host (target/kmemtrace/latest.kmt)",
        ),
    ],
    context: "shell kmemtrace",
    run: cmd_kmemtrace,
};

type Cache = KmemCache<KernelPlatform>;

fn cmd_kmemtrace<'a>(_: &mut Shell, args: &[&'a str], out: &mut dyn Write) -> Result<'a> {
    // The event stream: `record ...` and `dump` (shell/kmemtrace.rs).
    match args {
        ["record", rest @ ..] => return super::kmemtrace::cmd_record(rest, out),
        ["dump", rest @ ..] => return super::kmemtrace::cmd_dump(rest, out),
        _ => {}
    }
    let (verb, target) = match args {
        [verb] => (*verb, "all"),
        [verb, target] => (*verb, *target),
        _ => return Err(ShellError::Usage(&KMEMTRACE)),
    };
    if !matches!(verb, "start" | "stop" | "print" | "reset") {
        return Err(ShellError::Usage(&KMEMTRACE));
    }
    let caches = select_caches(target)?;
    match verb {
        "start" => {
            if target != "all" {
                let cache = caches[0];
                cache
                    .trace_start()
                    .map_err(|error| ShellError::Trace(cache.name(), error))?;
                let _ = writeln!(out, "tracing {}", cache.name());
            } else {
                // `all`: every cache that may be traced (NOTRACE ones are skipped).
                let started = caches
                    .iter()
                    .filter(|cache| cache.trace_start().is_ok())
                    .count();
                let _ = writeln!(out, "tracing {started} caches (NOTRACE caches skipped)");
            }
        }
        "stop" => {
            for cache in &caches {
                cache.trace_stop();
            }
            let _ = writeln!(out, "stopped tracing {}", target);
        }
        "reset" => {
            let mut nr_dropped = 0;
            for cache in &caches {
                nr_dropped += cache.trace_stats().nr_records;
                cache.trace_reset();
            }
            let _ = writeln!(out, "dropped {nr_dropped} records from {target}");
        }
        _ => {
            for cache in &caches {
                let stats = cache.trace_stats();
                // `print all` shows the caches that have something to show.
                if target == "all"
                    && stats.nr_records == 0
                    && stats.nr_dropped == 0
                    && !stats.tracing
                {
                    continue;
                }
                trace_print(cache, out);
            }
        }
    }
    Ok(())
}

fn select_caches(target: &str) -> Result<'_, Vec<&'static Cache>> {
    if target == "all" {
        let mut caches = Vec::new();
        SLAB.for_each_cache(|cache| caches.push(cache));
        return Ok(caches);
    }
    SLAB.find_cache(target)
        .map(|cache| alloc::vec![cache])
        .ok_or(ShellError::UnknownCache(target))
}

/// Prints one record as an Akaros trace block: `Obj <address>, size, cpu,
/// tsc, from <context>:`, then `#NN [<address>] function+0xoff` per frame
/// and a blank line. Used by `kmemtrace print` and `allocinfo ctx print`.
pub fn write_record(out: &mut dyn Write, record: &TraceRecord) {
    let _ = writeln!(
        out,
        "Obj {:#x}, size {}, cpu {}, tsc {}, from {}:",
        record.addr,
        record.size,
        record.cpu,
        record.timestamp,
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

/// Objects and bytes per call site (the first frame outside the allocator).
#[derive(Clone, Copy)]
struct Site {
    address: usize,
    nr_objects: usize,
    bytes: usize,
}

/// Prints one block per outstanding record, a per-site summary and a count.
///
/// The records are copied out first and printed after the cache's trace
/// lock is released: printing may allocate (into a `String` sink, say), and
/// an allocation from a traced cache takes that same lock. The copy goes into
/// a buffer reserved up front, so nothing allocates while the lock is held;
/// records added between the reservation and the copy are counted as not
/// shown rather than dropped silently.
fn trace_print(cache: &'static Cache, out: &mut dyn Write) {
    let reserve = cache.trace_stats().nr_records + 16;
    let mut records: Vec<TraceRecord> = Vec::with_capacity(reserve);
    let mut nr_not_shown = 0usize;
    cache.trace_for_each(|record: &TraceRecord| {
        if records.len() < records.capacity() {
            records.push(*record);
        } else {
            nr_not_shown += 1;
        }
    });
    let stats = cache.trace_stats();

    let _ = writeln!(out, "Dumping outstanding allocs from {}", cache.name());
    let _ = writeln!(out, "-------------------------");
    let mut sites: Vec<Site> = Vec::new();
    for record in &records {
        write_record(out, record);
        let site = record.frames().first().copied().unwrap_or(0);
        match sites.iter_mut().find(|s| s.address == site) {
            Some(slot) => {
                slot.nr_objects += 1;
                slot.bytes += record.size;
            }
            None => sites.push(Site {
                address: site,
                nr_objects: 1,
                bytes: record.size,
            }),
        }
    }
    if !sites.is_empty() {
        sites.sort_by_key(|site| core::cmp::Reverse(site.bytes));
        let _ = writeln!(out, "By call site:");
        for site in &sites {
            let _ = writeln!(
                out,
                "  {:>6} objects {:>10} bytes  {}",
                site.nr_objects,
                site.bytes,
                Symbolized(site.address)
            );
        }
    }
    if nr_not_shown > 0 {
        let _ = writeln!(
            out,
            "{nr_not_shown} records added while printing were not shown"
        );
    }
    let nr_shown = records.len();
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
