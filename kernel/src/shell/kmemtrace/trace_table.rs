//! `kmemtrace start|stop|print|reset [CACHE|all]`: the per-cache trace
//! table (Akaros semantics; the mechanism and the print are in
//! `magpie-slab`: `reports::trace_print`, which allocates nothing and
//! writes with no allocator lock held). Reached from the `kmemtrace` row
//! in `mod.rs`, whose help lists these forms.

use core::fmt::Write;

use magpie_slab::reports::{self, TracePrintBuffer};
use magpie_slab::{KmemCache, TraceRecord};
use spin::Mutex;

use super::KMEMTRACE;
use crate::debug::slab_debug::KernelFormat;
use crate::kmem::{KernelPlatform, SLAB};
use crate::shell::{Result, ShellError, shell_error};

type Cache = KmemCache<KernelPlatform>;

/// `kmemtrace start|stop|print|reset [CACHE|all]`.
pub(super) fn cmd_trace_table<'a>(args: &[&'a str], out: &mut dyn Write) -> Result<'a> {
    let (verb, target) = match args {
        [verb] => (*verb, "all"),
        [verb, target] => (*verb, *target),
        [_, _, extra, ..] => return Err(ShellError::Unexpected(extra, &KMEMTRACE)),
        [] => return Err(ShellError::Usage(&KMEMTRACE)),
    };
    if !matches!(verb, "start" | "stop" | "print" | "reset") {
        return Err(ShellError::Unexpected(verb, &KMEMTRACE));
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
                    .trace_table()
                    .start()
                    .map_err(|error| ShellError::Trace(cache.name(), error))?;
                let _ = writeln!(out, "tracing {}", cache.name());
            }
            None => {
                // `all`: every cache that may be traced (NOTRACE ones are skipped).
                let mut started = 0;
                each(&mut |cache| started += usize::from(cache.trace_table().start().is_ok()));
                let _ = writeln!(out, "tracing {started} caches (NOTRACE caches skipped)");
            }
        },
        "stop" => {
            let mut nr_stopped = 0;
            each(&mut |cache| {
                nr_stopped += usize::from(cache.trace_table().is_on());
                cache.trace_table().stop();
            });
            if nr_stopped == 0 {
                return Err(shell_error!(
                    "not tracing {}: nothing to stop",
                    if one.is_some() { target } else { "any cache" }
                ));
            }
            let _ = writeln!(out, "stopped tracing {}", target);
        }
        "reset" => {
            let mut nr_dropped = 0;
            each(&mut |cache| {
                nr_dropped += cache.trace_table().stats().nr_records;
                cache.trace_table().reset();
            });
            let _ = writeln!(out, "dropped {nr_dropped} records from {target}");
        }
        _ => match one {
            Some(cache) => trace_print(cache, out),
            None => {
                let (mut nr_traced, mut nr_records) = (0, 0);
                each(&mut |cache| {
                    let stats = cache.trace_table().stats();
                    nr_traced += usize::from(stats.tracing);
                    nr_records += stats.nr_records;
                });
                if nr_traced == 0 && nr_records == 0 {
                    let _ = writeln!(
                        out,
                        "no cache traced, no records kept: 'kmemtrace start CACHE' first"
                    );
                    return Ok(());
                }
                // Caches with records get a block each, quiet traced ones
                // one line in all.
                let _ =
                    reports::trace_print_all(out, &SLAB, &mut PRINT_BUFFER.lock(), &KernelFormat);
            }
        },
    }
    Ok(())
}

/// What `kmemtrace print` works in: reserved at boot, so a print needs no
/// free memory. One print at a time.
static PRINT_BUFFER: Mutex<TracePrintBuffer> = Mutex::new(TracePrintBuffer::new());

/// Prints one cache's outstanding records, by-site summary and count.
fn trace_print(cache: &'static Cache, out: &mut dyn Write) {
    let _ = reports::trace_print(out, cache, &mut PRINT_BUFFER.lock(), &KernelFormat);
}

/// Prints one record as an Akaros trace block (`Obj <address>, size, cpu,
/// at <ns since boot> ns, from <context>:`, then `#NN [<address>]
/// function+0xoff` per frame and a blank line). Used by `kmemtrace print`
/// and `allocinfo ctx print`.
pub fn write_record(out: &mut dyn Write, record: &TraceRecord) {
    let _ = reports::write_trace_record(out, record, &KernelFormat);
}
