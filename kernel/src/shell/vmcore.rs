//! `vmcore`: ask the runner for a memory image of the running kernel (a
//! QEMU `dump-guest-memory` ELF core, default `target/vmcore/latest.core`)
//! that `magpie-kmem core CORE REPORT` reads with no shell (docs/VMCORE.md).
//!
//! The request is a write to QEMU's pvpanic device ("crash loaded": QEMU
//! lets the guest run on), which the runner (boot/run-qemu.sh,
//! boot/vmcore.py) hears as a QMP event; it stops the VM, dumps it and
//! lets it go on. The command waits half a second for the stop, so the
//! image is of the kernel sitting in this command, with nothing else
//! typed: the caches as the last command left them.
//!
//! `vmcore crash` panics the kernel on purpose (Linux's sysrq-c, which
//! tests kdump): the panic handler tells the runner, which takes the core
//! of the dead kernel and ends QEMU.

use core::fmt::Write;

use super::{Command, Result, Shell, no_args, shell_error};
use crate::dev::qemu::{PvpanicEvent, pvpanic, pvpanic_supports};

pub(super) const VMCORE: Command = Command {
    name: "vmcore",
    help: &[
        ("vmcore", "take a memory image for magpie-kmem core"),
        (
            "vmcore crash",
            "panic the kernel (the runner takes its core)",
        ),
    ],
    context: "shell",
    run: cmd_vmcore,
};

/// How long the command waits for the runner to stop the VM.
const WAIT_US: u64 = 500_000;

fn cmd_vmcore<'a>(_: &mut Shell, args: &[&'a str], out: &mut dyn Write) -> Result<'a> {
    if args == ["crash"] {
        panic!("vmcore crash: a panic on purpose");
    }
    no_args(args, &VMCORE)?;
    if !pvpanic_supports(PvpanicEvent::CrashLoaded) {
        return Err(shell_error!(
            "no runner takes cores: boot with boot/run-qemu.sh, MAGPIE_VMCORE not none"
        ));
    }
    pvpanic(PvpanicEvent::CrashLoaded);
    crate::arch::tsc::delay_us(WAIT_US);
    let _ = writeln!(out, "vmcore: requested (the runner says where it wrote it)");
    Ok(())
}
