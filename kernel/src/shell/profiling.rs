//! `allocinfo` and `timestats`: allocation profiling and latency statistics
//! (the mechanisms are in `crate::profiling` and `magpie-codetag`).

use alloc::vec::Vec;
use core::fmt::Write;

use magpie_codetag::alloc_tag::{AllocTag, write_allocinfo_header, write_allocinfo_row};
use magpie_codetag::time_stats::{TimeStats, write_time_stats};

use super::{Command, Result, Shell, ShellError, shell_error, write_record};
use crate::profiling::{self, COMPILED_IN, SWITCH};

pub(super) const ALLOCINFO: Command = Command {
    name: "allocinfo",
    help: &[
        (
            "allocinfo [--sort bytes|calls] [--top N] [--file PATTERN] [-h]",
            "live bytes and calls per allocation site (/proc/allocinfo 1.0)",
        ),
        (
            "allocinfo on|off",
            "switch allocation profiling at run time",
        ),
        (
            "allocinfo ctx FILE:LINE enable|disable|print",
            "capture context of each live object from one site",
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

#[derive(Clone, Copy, PartialEq, Eq)]
enum SortKey {
    Section,
    Bytes,
    Calls,
}

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
            profiling::set_enabled(on).map_err(|error| shell_error!("{error}"))?;
            let _ = writeln!(
                out,
                "allocation profiling {}",
                if on { "on" } else { "off" }
            );
            return Ok(());
        }
        ["ctx", location, verb] => return cmd_ctx(location, verb, out),
        ["ctx", ..] => return Err(usage),
        _ => {}
    }
    let mut sort = SortKey::Section;
    let mut top = usize::MAX;
    let mut file: Option<&str> = None;
    let mut human = false;
    let mut words = args.iter();
    while let Some(&word) = words.next() {
        match word {
            "--sort" => {
                sort = match words.next().copied() {
                    Some("bytes") => SortKey::Bytes,
                    Some("calls") => SortKey::Calls,
                    _ => return Err(usage),
                }
            }
            "--top" => {
                let Some(number) = words.next().and_then(|text| text.parse().ok()) else {
                    return Err(usage);
                };
                top = number;
                if sort == SortKey::Section {
                    sort = SortKey::Bytes;
                }
            }
            "--file" => {
                let Some(&pattern) = words.next() else {
                    return Err(usage);
                };
                file = Some(pattern);
            }
            "-h" => human = true,
            _ => return Err(usage),
        }
    }
    let _scope = crate::alloc_tag_scope!();
    let mut rows = profiling::snapshot();
    if let Some(pattern) = file {
        rows.retain(|row| row.tag.tag.file.contains(pattern));
    }
    match sort {
        SortKey::Section => {}
        SortKey::Bytes => rows.sort_by_key(|row| core::cmp::Reverse(row.counts.bytes)),
        SortKey::Calls => rows.sort_by_key(|row| core::cmp::Reverse(row.counts.calls)),
    }
    let inaccurate = SWITCH.is_inaccurate();
    let _ = write_allocinfo_header(out);
    for row in rows.iter().take(top) {
        let _ = write_allocinfo_row(out, row.tag, row.counts, human, inaccurate);
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

/// `allocinfo ctx FILE:LINE enable|disable|print`.
fn cmd_ctx<'a>(location: &'a str, verb: &'a str, out: &mut dyn Write) -> Result<'a> {
    if !matches!(verb, "enable" | "disable" | "print") {
        return Err(ShellError::Usage(&ALLOCINFO));
    }
    let Some(tag) = AllocTag::all()
        .iter()
        .find(|tag| tag.tag.matches_location(location))
    else {
        return Err(ShellError::NoAllocTag(location));
    };
    match verb {
        "enable" => {
            profiling::ctx_enable(tag);
            let _ = writeln!(
                out,
                "capturing context of {} func:{}",
                tag.tag.location(),
                tag.tag.function()
            );
        }
        "disable" => {
            if profiling::ctx_is_capturing(tag) {
                profiling::ctx_disable();
            }
            let _ = writeln!(out, "stopped capturing context of {}", tag.tag.location());
        }
        _ => {
            let _scope = crate::alloc_tag_scope!();
            let capturing = profiling::ctx_is_capturing(tag);
            let records = if capturing {
                profiling::ctx_records()
            } else {
                Vec::new()
            };
            let _ = writeln!(
                out,
                "Context of live objects from {} func:{}",
                tag.tag.location(),
                tag.tag.function()
            );
            let _ = writeln!(out, "-------------------------");
            for record in &records {
                write_record(out, record);
            }
            let nr_dropped = if capturing {
                profiling::ctx_nr_dropped()
            } else {
                0
            };
            let _ = writeln!(
                out,
                "{} live object{} recorded, {} record{} dropped (capture {})",
                records.len(),
                if records.len() == 1 { "" } else { "s" },
                nr_dropped,
                if nr_dropped == 1 { "" } else { "s" },
                if capturing { "on" } else { "off" }
            );
        }
    }
    Ok(())
}

/// `timestats [reset]`: every latency statistic point, in TSC cycles.
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
                let _ = write_time_stats(out, stats, "cycles");
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
