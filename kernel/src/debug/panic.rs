//! Panic reporting for the kernel binary: message, location, symbolized
//! backtrace, then exit QEMU with failure.

use core::fmt::Write;
use core::panic::PanicInfo;
use core::sync::atomic::{AtomicBool, Ordering};

use crate::dev::console::emergency_writer;
use crate::dev::qemu::{QemuExitCode, exit_qemu};

static PANICKING: AtomicBool = AtomicBool::new(false);

/// Prints `info` and a backtrace (lock-free, so it works even if the panic
/// happened while printing). A nested panic prints one line only.
pub fn report(info: &PanicInfo<'_>) {
    let mut out = emergency_writer();
    if PANICKING.swap(true, Ordering::AcqRel) {
        let _ = writeln!(out, "\n!!! nested panic: {}", info.message());
        return;
    }
    let _ = writeln!(
        out,
        "\n!!! KERNEL PANIC on cpu {}: {}",
        crate::arch::cpu_id(),
        info.message()
    );
    if let Some(location) = info.location() {
        let _ = writeln!(
            out,
            "    at {}:{}:{}",
            location.file(),
            location.line(),
            location.column()
        );
    }
    let _ = writeln!(out, "    backtrace:");
    let _ = crate::debug::symbols::write_backtrace(&mut out, "      ");
}

/// The kernel binary's panic handler body: report, then exit QEMU with failure.
pub fn panic_handler(info: &PanicInfo<'_>) -> ! {
    crate::arch::irq_save();
    report(info);
    exit_qemu(QemuExitCode::Failed)
}
