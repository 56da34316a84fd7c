//! `lkdtm`: commit a known heap bug on purpose (the mechanism is
//! `crate::debug::lkdtm`).

use core::fmt::Write;

use super::{Command, Result, Shell, ShellError};
use crate::debug::lkdtm::{self, LkdtmType};

pub(super) const LKDTM: Command = Command {
    name: "lkdtm",
    help: &[
        (
            "lkdtm TYPE",
            "commit a heap bug on a scratch cache and show what the allocator reports",
        ),
        ("lkdtm list", "the TYPEs (Linux LKDTM names)"),
    ],
    context: "shell lkdtm",
    run: cmd_lkdtm,
};

/// `lkdtm TYPE` and `lkdtm list`.
fn cmd_lkdtm<'a>(_: &mut Shell, args: &[&'a str], out: &mut dyn Write) -> Result<'a> {
    match args {
        ["list"] => {
            for kind in LkdtmType::ALL {
                let _ = writeln!(out, "{kind}");
            }
            Ok(())
        }
        [name] => {
            let kind = LkdtmType::parse(name).ok_or(ShellError::UnknownLkdtmType(name))?;
            if let Err(error) = lkdtm::run(kind, out) {
                // A run-time failure, after the arguments were accepted.
                let _ = writeln!(out, "error: lkdtm {kind}: {error}");
            }
            Ok(())
        }
        _ => Err(ShellError::Usage(&LKDTM)),
    }
}
