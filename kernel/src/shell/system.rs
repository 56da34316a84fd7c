//! `help` and `poweroff`.

use core::fmt::Write;

use super::{COMMANDS, Command, Result, Shell, no_args};
use crate::{QemuExitCode, exit_qemu};

pub(super) const HELP: Command = Command {
    name: "help",
    help: &[("help", "this list")],
    context: "shell",
    run: cmd_help,
};

pub(super) const POWEROFF: Command = Command {
    name: "poweroff",
    help: &[("poweroff", "leave QEMU")],
    context: "shell",
    run: cmd_poweroff,
};

/// Width of the usage column in `help`.
const USAGE_WIDTH: usize = 36;

/// `help`: every row of the command table, one line per usage; a usage
/// too long for its column puts the description on the next line.
fn cmd_help<'a>(_: &mut Shell, args: &[&'a str], out: &mut dyn Write) -> Result<'a> {
    no_args(args, &HELP)?;
    let _ = write!(out, "commands:");
    for command in COMMANDS {
        for (usage, what) in command.help {
            if usage.len() > USAGE_WIDTH {
                let _ = write!(out, "\n  {usage}\n  {:USAGE_WIDTH$} {what}", "");
            } else {
                let _ = write!(out, "\n  {usage:USAGE_WIDTH$} {what}");
            }
        }
    }
    let _ = writeln!(out);
    Ok(())
}

/// `poweroff`: leaves QEMU with success.
fn cmd_poweroff<'a>(_: &mut Shell, args: &[&'a str], out: &mut dyn Write) -> Result<'a> {
    no_args(args, &POWEROFF)?;
    let _ = writeln!(out, "powering off");
    exit_qemu(QemuExitCode::Success)
}
