//! `kmemtrace record start|stop|status` and `kmemtrace dump`: the event
//! stream (the rings are `magpie_slab::kmemtrace`, the boot arguments,
//! clock and dump channel `crate::tracing::event_stream`). Reached from the
//! `kmemtrace` row in `mod.rs`, whose help lists these forms.

use core::fmt::Write;
use core::sync::atomic::{AtomicBool, Ordering};

use magpie_slab::PAGE_SIZE;
use magpie_slab::kmemtrace::KmemtraceStatus;
use magpie_slab::kmemtrace::{MAX_STACK_DEPTH, SUBBUF_EVENTS, SUBBUF_PAGES};
use magpie_slab::reports::Nanoseconds;

use super::KMEMTRACE;
use crate::arch;
use crate::kmem::SLAB;
use crate::shell::{Result, ShellError, parse_number, shell_error};
use crate::tracing::event_stream;

/// Frames per event with `--stacks` and no DEPTH.
const DEFAULT_STACK_DEPTH: usize = 8;

/// A recording was started and has not been sent with `kmemtrace dump`
/// since: `record start` over it asks for `--force`.
static UNREAD: AtomicBool = AtomicBool::new(false);

/// `kmemtrace record start [--stacks [DEPTH]] [CACHE|all]`,
/// `kmemtrace record stop`, `kmemtrace record status`.
pub(super) fn cmd_record<'a>(args: &[&'a str], out: &mut dyn Write) -> Result<'a> {
    match args {
        ["start", rest @ ..] => record_start(rest, out),
        ["stop"] => {
            let before = SLAB.kmemtrace().status();
            if before.nr_cpus == 0 {
                return Err(shell_error!(
                    "not recording: nothing to stop ('kmemtrace record start' first)"
                ));
            }
            if !before.recording {
                return Err(shell_error!(
                    "not recording: stopped already ({} events kept; 'kmemtrace dump' sends them)",
                    before.nr_events
                ));
            }
            SLAB.kmemtrace().stop();
            let status = SLAB.kmemtrace().status();
            let _ = writeln!(
                out,
                "recording stopped: {} events, {} overruns; 'kmemtrace dump' sends them",
                status.nr_events, status.nr_overruns
            );
            Ok(())
        }
        ["status"] => {
            record_status(out);
            Ok(())
        }
        [verb, ..] if !matches!(*verb, "start" | "stop" | "status") => {
            Err(ShellError::Unexpected(verb, &KMEMTRACE))
        }
        [_, extra, ..] => Err(ShellError::Unexpected(extra, &KMEMTRACE)),
        _ => Err(ShellError::Usage(&KMEMTRACE)),
    }
}

fn record_start<'a>(args: &[&'a str], out: &mut dyn Write) -> Result<'a> {
    let mut stack_depth = 0;
    let mut target = "all";
    let mut force = false;
    let mut rest = args;
    while let [word, tail @ ..] = rest {
        rest = tail;
        if *word == "--force" {
            force = true;
        } else if *word == "--stacks" {
            stack_depth = DEFAULT_STACK_DEPTH;
            if let [depth, tail @ ..] = rest
                && depth.starts_with(|c: char| c.is_ascii_digit())
            {
                stack_depth = parse_number(depth)?;
                if !(1..=MAX_STACK_DEPTH).contains(&stack_depth) {
                    return Err(shell_error!(
                        "stack depth {stack_depth} out of range: give 1 to {MAX_STACK_DEPTH}"
                    ));
                }
                rest = tail;
            }
        } else if word.starts_with("--") {
            return Err(ShellError::UnknownOption(word, &KMEMTRACE));
        } else if target == "all" && rest.is_empty() {
            target = word;
        } else {
            return Err(ShellError::Unexpected(word, &KMEMTRACE));
        }
    }
    let cache = if target == "all" {
        None
    } else {
        let cache = SLAB
            .find_cache(target)
            .ok_or(ShellError::UnknownCache(target))?;
        if cache.is_bootstrap() {
            return Err(shell_error!(
                "{} holds the allocator's own metadata: nothing to record",
                cache.name()
            ));
        }
        Some(cache)
    };
    let before = SLAB.kmemtrace().status();
    if before.recording {
        return Err(shell_error!(
            "already recording ({} events so far): 'kmemtrace record stop' first",
            before.nr_events
        ));
    }
    // A recording nobody has read yet is not dropped silently.
    let unread = UNREAD.load(Ordering::Relaxed) && before.nr_events > 0;
    if unread && !force {
        return Err(shell_error!(
            "{} events recorded and not dumped: 'kmemtrace dump' first, or 'record start --force'",
            before.nr_events
        ));
    }
    event_stream::start(stack_depth, cache.map(|cache| cache.id()))
        .map_err(|error| shell_error!("cannot record: {error}"))?;
    UNREAD.store(true, Ordering::Relaxed);
    if unread {
        let _ = writeln!(
            out,
            "dropped the last recording: {} events ({} overruns) never dumped",
            before.nr_events, before.nr_overruns
        );
    }
    let status = SLAB.kmemtrace().status();
    let _ = write!(
        out,
        "recording {}",
        cache.map_or("all caches", |c| c.name())
    );
    if stack_depth > 0 {
        let _ = write!(out, " with stacks of {stack_depth} frames");
    }
    let _ = writeln!(
        out,
        " ({} CPUs x {} sub-buffers of {} events, {} KiB per CPU)",
        status.nr_cpus,
        status.nr_subbufs,
        SUBBUF_EVENTS,
        status.nr_subbufs * SUBBUF_PAGES * PAGE_SIZE / 1024
    );
    if event_stream::dump_channel().is_none() {
        let _ = writeln!(
            out,
            "note: no dump channel (no virtio console): 'kmemtrace dump' cannot send this record"
        );
    }
    Ok(())
}

fn record_status(out: &mut dyn Write) {
    let status: KmemtraceStatus = SLAB.kmemtrace().status();
    if status.nr_cpus == 0 {
        let _ = writeln!(
            out,
            "kmemtrace: never started ('kmemtrace record start'); {} sub-buffers per CPU at start",
            event_stream::nr_subbufs()
        );
        return;
    }
    let what = match status.cache_id {
        None => "all caches",
        Some(_) => "one cache",
    };
    let mut name = "";
    if let Some(id) = status.cache_id {
        SLAB.for_each_cache(|cache| {
            if cache.id() == id {
                name = cache.name();
            }
        });
    }
    let _ = write!(
        out,
        "kmemtrace: {} {}{}{}",
        if status.recording {
            "recording"
        } else {
            "stopped,"
        },
        what,
        if name.is_empty() { "" } else { " " },
        name
    );
    if status.stack_depth > 0 {
        let _ = write!(
            out,
            ", stacks of {} frames ({} distinct, {} dropped)",
            status.stack_depth, status.nr_stacks, status.nr_stacks_dropped
        );
    }
    let _ = writeln!(out, ", {} sub-buffers per CPU", status.nr_subbufs);
    let _ = writeln!(
        out,
        "{:>5} {:>10} {:>10} {:>7}",
        "cpu", "events", "overruns", "fill"
    );
    for cpu in 0..status.nr_cpus {
        let ring = SLAB.kmemtrace().cpu_status(cpu);
        let permille = ring.nr_events * 1000 / ring.capacity.max(1);
        let _ = writeln!(
            out,
            "{:>5} {:>10} {:>10} {:>5}.{}%",
            cpu,
            ring.nr_events,
            ring.nr_overruns,
            permille / 10,
            permille % 10
        );
    }
    let _ = writeln!(
        out,
        "total {:>10} {:>10}",
        status.nr_events, status.nr_overruns
    );
    if status.nr_overruns > 0 {
        let _ = writeln!(
            out,
            "overruns: events were dropped; boot with a larger kmemtrace.subbufs=N (now {})",
            status.nr_subbufs
        );
    }
}

/// `kmemtrace dump`: sends the record to the host over the dump channel
/// (the virtio console set up at boot) and says how much was sent, or that
/// nothing was.
pub(super) fn cmd_dump<'a>(args: &[&'a str], out: &mut dyn Write) -> Result<'a> {
    if let Some(extra) = args.first() {
        return Err(ShellError::Unexpected(extra, &KMEMTRACE));
    }
    if SLAB.kmemtrace().status().nr_cpus == 0 {
        return Err(shell_error!(
            "nothing recorded yet: 'kmemtrace record start' first"
        ));
    }
    let start = arch::rdtsc();
    let (summary, channel) =
        event_stream::dump().map_err(|error| shell_error!("kmemtrace dump: {error}"))?;
    UNREAD.store(false, Ordering::Relaxed);
    let elapsed_ns = event_stream::ticks_to_ns(arch::rdtsc().wrapping_sub(start)).max(1);
    let _ = writeln!(
        out,
        "sent {} events ({} overruns) in {} records, {} bytes, crc32 {:#010x}, over the {}",
        summary.nr_events,
        summary.nr_overruns,
        summary.nr_records,
        summary.nr_bytes,
        summary.checksum,
        channel
    );
    let _ = writeln!(
        out,
        "took {} ({} events/s, {} KiB/s)",
        Nanoseconds(elapsed_ns),
        u128::from(summary.nr_events) * 1_000_000_000 / u128::from(elapsed_ns),
        u128::from(summary.nr_bytes) * 1_000_000_000 / 1024 / u128::from(elapsed_ns)
    );
    Ok(())
}
