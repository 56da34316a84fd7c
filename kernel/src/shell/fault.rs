//! `fault`: fault injection by code tags (the mechanism is
//! `magpie_codetag::fault`; the kernel's side is `crate::debug::fault`).

use core::fmt::Write;

use magpie_codetag::fault::write_fault_row;

use super::{Command, Result, Shell, ShellError, shell_error};
use crate::debug::fault::{COMPILED_IN, FaultMode, FaultTag, points};

pub(super) const FAULT: Command = Command {
    name: "fault",
    help: &[
        (
            "fault list [PATTERN]",
            "fault points: file:line module func class state hits injected",
        ),
        (
            "fault FILE:LINE|PATTERN enable|disable|oneshot|every N|probability P",
            "make allocation sites fail (P in percent); PATTERN: all, a file, module or function",
        ),
    ],
    context: "shell fault",
    run: cmd_fault,
};

/// `fault list [PATTERN]` and `fault PATTERN MODE`.
fn cmd_fault<'a>(_: &mut Shell, args: &[&'a str], out: &mut dyn Write) -> Result<'a> {
    if !COMPILED_IN {
        return Err(shell_error!(
            "fault injection is compiled out (kernel feature fault-injection)"
        ));
    }
    match args {
        ["list"] => {
            list(sorted_points(), out);
            Ok(())
        }
        ["list", pattern] => {
            let selected = select(pattern)?;
            list(selected, out);
            Ok(())
        }
        [pattern, mode @ ..] if !mode.is_empty() => {
            // Check everything before arming anything.
            let mode = FaultMode::parse(mode).map_err(|error| shell_error!("{error}"))?;
            for point in select(pattern)? {
                point.set_mode(mode);
                let _ = write_fault_row(out, point);
            }
            Ok(())
        }
        _ => Err(ShellError::Usage(&FAULT)),
    }
}

/// Every fault point, by file and line. The section's own order is the
/// linker's, which moves with code generation (a clean build and an
/// incremental one can differ), so a list printed from two builds would
/// not compare. No allocation (`fault list` adds no call site of its own,
/// `tests/e2e/test_fault_sweep.py`): each step a pass over the section
/// for the next point after the last, by (file, line, index).
fn sorted_points() -> impl Iterator<Item = &'static FaultTag> {
    let all = points();
    let mut last: Option<(&'static str, u32, usize)> = None;
    core::iter::from_fn(move || {
        let next = all
            .iter()
            .enumerate()
            .map(|(index, point)| (point.tag.file, point.tag.line, index))
            .filter(|key| last.is_none_or(|last| *key > last))
            .min()?;
        last = Some(next);
        Some(&all[next.2])
    })
}

/// The points `pattern` selects, by file and line; an error if none.
fn select(pattern: &str) -> Result<'_, impl Iterator<Item = &'static FaultTag> + '_> {
    let mut selected = sorted_points()
        .filter(move |point| point.matches(pattern))
        .peekable();
    if selected.peek().is_none() {
        return Err(ShellError::NoFaultPoint(pattern));
    }
    Ok(selected)
}

fn list<'p>(selected: impl Iterator<Item = &'p FaultTag>, out: &mut dyn Write) {
    let (mut nr_points, mut nr_armed) = (0, 0);
    for point in selected {
        let _ = write_fault_row(out, point);
        nr_points += 1;
        nr_armed += usize::from(point.mode() != FaultMode::Disabled);
    }
    let _ = writeln!(out, "# {nr_points} fault points, {nr_armed} enabled");
}
