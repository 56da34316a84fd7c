//! `allocinfo` and `timestats`: allocation profiling and latency statistics
//! (the mechanisms are in `crate::profiling` and `magpie-codetag`).
//!
//! Neither allocates: `allocinfo` reads every tag's counters once into a
//! table reserved at boot ([`MAX_ROWS`] rows), sorts that in place and
//! prints it (a consistent snapshot: each row is read once);
//! `allocinfo ctx print` copies the capture pool a chunk at a time and
//! prints each chunk after releasing the pool lock.

use core::fmt::Write;

use magpie_codetag::alloc_tag::{AllocTag, AllocTagCounts};
use magpie_codetag::time_stats::TimeStats;
use magpie_slab::reports::{
    self, AllocinfoError, AllocinfoOptions, AllocinfoRow, AllocinfoSort, Nanoseconds,
    write_time_stats,
};
use spin::Mutex;

use super::{Command, Result, Shell, ShellError, out_of_memory, shell_error, write_record};
use crate::profiling::{self, COMPILED_IN, COUNTERS, SWITCH};

pub(super) const ALLOCINFO: Command = Command {
    name: "allocinfo",
    help: &[
        (
            "allocinfo [--sort bytes|calls] [--top N] [-h] [--function NAME] [--file PART] \
             [--line N] [--min-size BYTES] [--max-size BYTES] [--accurate yes|no]",
            "live bytes and calls per allocation site (/proc/allocinfo), the sites matching every filter",
        ),
        (
            "allocinfo on|off",
            "switch allocation profiling at run time",
        ),
        (
            "allocinfo ctx FILE:LINE enable|disable|print",
            "capture context of each live object from one site (FILE: its path or last components)",
        ),
        (
            "allocinfo mark",
            "remember every site's live bytes and calls now",
        ),
        (
            "allocinfo diff [--top N]",
            "what grew (bytes, calls) per site since the mark",
        ),
    ],
    context: "shell",
    run: cmd_allocinfo,
};

pub(super) const TIMESTATS: Command = Command {
    name: "timestats",
    help: &[(
        "timestats [reset]",
        "latency statistics (slab refill, depot exchange)",
    )],
    context: "shell",
    run: cmd_timestats,
};

/// Allocation tags `allocinfo` can show (the kernel has a few dozen).
pub const MAX_ROWS: usize = 1024;

/// The snapshot `allocinfo` sorts and prints: reserved at boot (24 KiB).
static ROWS: Mutex<[AllocinfoRow; MAX_ROWS]> = Mutex::new(
    [AllocinfoRow {
        index: 0,
        counts: AllocTagCounts { bytes: 0, calls: 0 },
    }; MAX_ROWS],
);

/// Records `allocinfo ctx print` copies per pass.
const CTX_CHUNK: usize = 16;

/// `allocinfo ...`.
fn cmd_allocinfo<'a>(_: &mut Shell, args: &[&'a str], out: &mut dyn Write) -> Result<'a> {
    if !COMPILED_IN {
        return Err(shell_error!(
            "allocation profiling is compiled out (kernel feature alloc-profiling)"
        ));
    }
    let usage = ShellError::Usage(&ALLOCINFO);
    match args {
        [switch @ ("on" | "off")] => {
            let on = *switch == "on";
            crate::kmem::set_alloc_profiling(on).map_err(|error| shell_error!("{error}"))?;
            let _ = writeln!(
                out,
                "allocation profiling {}",
                if on { "on" } else { "off" }
            );
            return Ok(());
        }
        ["ctx", location, verb] => return cmd_ctx(location, verb, out),
        ["mark"] => {
            let nr_sites = profiling::mark()
                .map_err(|_| out_of_memory!("a copy of every site's counts for the mark"))?;
            let _ = writeln!(
                out,
                "marked {nr_sites} sites; 'allocinfo diff' shows what grew since"
            );
            return Ok(());
        }
        ["diff", rest @ ..] => return cmd_diff(rest, out),
        ["ctx", ..] => return Err(usage),
        ["on" | "off" | "mark", extra, ..] => {
            return Err(ShellError::Unexpected(extra, &ALLOCINFO));
        }
        _ => {}
    }
    let mut options = AllocinfoOptions::default();
    let mut words = args.iter();
    while let Some(&word) = words.next() {
        let mut value = || {
            words
                .next()
                .copied()
                .ok_or(ShellError::MissingValue(word, &ALLOCINFO))
        };
        match word {
            "--sort" => {
                options.sort = match value()? {
                    "bytes" => AllocinfoSort::Bytes,
                    "calls" => AllocinfoSort::Calls,
                    key => {
                        return Err(shell_error!(
                            "unknown sort key '{key}'; expected bytes or calls"
                        ));
                    }
                }
            }
            "--top" => {
                options.top = super::parse_number(value()?)?;
                if options.sort == AllocinfoSort::Section {
                    options.sort = AllocinfoSort::Bytes;
                }
            }
            "--file" => options.filter.file = Some(value()?),
            "--function" => options.filter.function = Some(value()?),
            "--line" => {
                let line = super::parse_u64(value()?)?;
                options.filter.line = Some(u32::try_from(line).unwrap_or(u32::MAX));
            }
            "--min-size" => options.filter.min_bytes = Some(super::parse_u64(value()?)?),
            "--max-size" => options.filter.max_bytes = Some(super::parse_u64(value()?)?),
            "--accurate" => {
                options.filter.accurate = match value()? {
                    "yes" => Some(true),
                    "no" => Some(false),
                    other => {
                        return Err(shell_error!("--accurate takes yes or no, not '{other}'"));
                    }
                }
            }
            "-h" => options.human = true,
            option if option.starts_with('-') => {
                return Err(ShellError::UnknownOption(option, &ALLOCINFO));
            }
            other => return Err(ShellError::Unexpected(other, &ALLOCINFO)),
        }
    }
    options.inaccurate = SWITCH.is_inaccurate();
    let read = |tag: &'static AllocTag| COUNTERS.read(tag.tag_ref());
    match reports::allocinfo(out, AllocTag::all(), &read, &mut *ROWS.lock(), &options) {
        Err(error @ AllocinfoError::TooManyTags { .. }) => return Err(shell_error!("{error}")),
        Err(AllocinfoError::Format) | Ok(_) => {}
    }
    if !SWITCH.is_on() {
        let _ = writeln!(
            out,
            "# profiling is {}: counts cover objects allocated while it was on",
            if SWITCH.is_never() {
                "off for good (mem_profiling=never)"
            } else {
                "off"
            }
        );
    }
    Ok(())
}

/// `allocinfo diff [--top N]`: the change of each site's live bytes and
/// calls since `allocinfo mark`, most bytes grown first, in the allocinfo
/// layout with signed figures.
fn cmd_diff<'a>(args: &[&'a str], out: &mut dyn Write) -> Result<'a> {
    let top = match args {
        [] => usize::MAX,
        ["--top", number] => super::parse_number(number)?,
        ["--top"] => return Err(ShellError::MissingValue("--top", &ALLOCINFO)),
        [option, ..] if option.starts_with("--") => {
            return Err(ShellError::UnknownOption(option, &ALLOCINFO));
        }
        [word, ..] => return Err(ShellError::Unexpected(word, &ALLOCINFO)),
    };
    let _scope = crate::alloc_tag_scope!();
    // The diff's own rows are charged to this scope's tag and live while
    // the counters are read: their charge is taken back out below, so the
    // diff does not count itself.
    let own = profiling::current_tag();
    let charged = || own.map(|tag| COUNTERS.read(tag)).unwrap_or_default();
    let before = charged();
    let diff = profiling::diff().map_err(|_| out_of_memory!("one row per site for the diff"))?;
    let Some((elapsed_ns, mut rows)) = diff else {
        return Err(shell_error!("no mark yet: 'allocinfo mark' first"));
    };
    let after = charged();
    if let Some(own) = own
        && let Some(index) = rows.iter().position(|row| row.tag.tag_ref() == own)
    {
        let row = &mut rows[index];
        row.bytes -= after.bytes.wrapping_sub(before.bytes) as i64;
        row.calls -= after.calls.wrapping_sub(before.calls) as i64;
        if row.bytes == 0 && row.calls == 0 {
            rows.remove(index);
        }
    }
    let _ = writeln!(
        out,
        "allocinfo diff - since mark {} ago, {} site{} changed",
        Nanoseconds(elapsed_ns),
        rows.len(),
        if rows.len() == 1 { "" } else { "s" }
    );
    let _ = writeln!(out, "#     <size>  <calls> <tag info>");
    for row in rows.iter().take(top) {
        let _ = writeln!(
            out,
            "{:>+12} {:>+8} {} func:{}",
            row.bytes,
            row.calls,
            row.tag.tag.location(),
            row.tag.tag.function()
        );
    }
    if SWITCH.is_inaccurate() || !SWITCH.is_on() {
        let _ = writeln!(
            out,
            "# profiling was off for a while: objects allocated then are not counted"
        );
    }
    Ok(())
}

/// `allocinfo ctx FILE:LINE enable|disable|print`.
fn cmd_ctx<'a>(location: &'a str, verb: &'a str, out: &mut dyn Write) -> Result<'a> {
    if !matches!(verb, "enable" | "disable" | "print") {
        return Err(shell_error!(
            "unknown ctx action '{verb}'; expected enable, disable or print"
        ));
    }
    let mut matching = AllocTag::all()
        .iter()
        .filter(|tag| location_matches(tag.tag.file, tag.tag.line, location));
    let Some(tag) = matching.next() else {
        return Err(ShellError::NoAllocTag(location));
    };
    if let Some(other) = matching.next() {
        let nr_sites = 2 + matching.count();
        return Err(shell_error!(
            "'{location}' names {nr_sites} sites ({}, {}{}): give more of the path",
            tag.tag.location(),
            other.tag.location(),
            if nr_sites > 2 { ", ..." } else { "" }
        ));
    }
    match verb {
        "enable" => {
            crate::kmem::ctx_capture_enable(profiling::alloc_tag::token(tag.tag_ref()));
            let _ = writeln!(
                out,
                "capturing context of {} func:{}",
                tag.tag.location(),
                tag.tag.function()
            );
        }
        "disable" => {
            if profiling::ctx_is_capturing(profiling::alloc_tag::token(tag.tag_ref())) {
                crate::kmem::ctx_capture_disable();
            }
            let _ = writeln!(out, "stopped capturing context of {}", tag.tag.location());
        }
        _ => {
            let capturing = profiling::ctx_is_capturing(profiling::alloc_tag::token(tag.tag_ref()));
            let _ = writeln!(
                out,
                "Context of live objects from {} func:{}",
                tag.tag.location(),
                tag.tag.function()
            );
            let _ = writeln!(out, "-------------------------");
            // A chunk at a time, printed after the pool lock is released.
            let mut nr_shown = 0;
            let mut slot = 0;
            let mut chunk = [crate::profiling::EMPTY_RECORD; CTX_CHUNK];
            while capturing && slot < profiling::CTX_MAX_RECORDS {
                let (nr_copied, next) = profiling::ctx_copy(slot, &mut chunk);
                for record in &chunk[..nr_copied] {
                    write_record(out, record);
                }
                nr_shown += nr_copied;
                slot = next;
            }
            let nr_dropped = if capturing {
                profiling::ctx_nr_dropped()
            } else {
                0
            };
            let _ = writeln!(
                out,
                "{} live object{} recorded, {} record{} dropped (capture {})",
                nr_shown,
                if nr_shown == 1 { "" } else { "s" },
                nr_dropped,
                if nr_dropped == 1 { "" } else { "s" },
                if capturing { "on" } else { "off" }
            );
        }
    }
    Ok(())
}

/// Whether `spec` (`FILE:LINE`) names the site at `file`:`line`: the line
/// exactly, and FILE the whole path or its last components
/// (`kmem.rs:179`, `shell/kmem.rs:179`), as `fault` takes them.
fn location_matches(file: &str, line: u32, spec: &str) -> bool {
    let Some((spec_file, spec_line)) = spec.rsplit_once(':') else {
        return false;
    };
    if spec_line.parse::<u32>() != Ok(line) || spec_file.is_empty() {
        return false;
    }
    file == spec_file
        || file
            .strip_suffix(spec_file)
            .is_some_and(|head| head.ends_with('/'))
}

/// `timestats [reset]`: every latency statistic point, each time in
/// ns/µs/ms/s with its unit (TSC cycles converted with the boot-time
/// calibration).
fn cmd_timestats<'a>(_: &mut Shell, args: &[&'a str], out: &mut dyn Write) -> Result<'a> {
    let all = TimeStats::all();
    match args {
        [] => {
            if all.is_empty() {
                let _ = writeln!(
                    out,
                    "no time-stats points (kernel feature time-stats is compiled out)"
                );
            }
            for (index, stats) in all.iter().enumerate() {
                if index > 0 {
                    let _ = writeln!(out);
                }
                let _ = write_time_stats(out, stats, &crate::arch::tsc::cycles_to_ns);
            }
            Ok(())
        }
        ["reset"] => {
            for stats in all {
                stats.reset();
            }
            let _ = writeln!(out, "reset {} time-stats points", all.len());
            Ok(())
        }
        _ => Err(ShellError::Usage(&TIMESTATS)),
    }
}
