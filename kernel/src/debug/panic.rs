//! Panic and exception reports: message or vector, location, symbolized
//! backtrace, then exit QEMU with failure. The exception report is
//! registered with `arch::idt` at boot ([`EXCEPTION_REPORTER`]): `arch/`
//! imports neither the console nor the symbols.

use core::fmt::Write;
use core::panic::PanicInfo;
use core::sync::atomic::{AtomicBool, Ordering};

use x86_64::registers::control::Cr2;
use x86_64::structures::idt::PageFaultErrorCode;

use crate::arch::idt::{ExceptionInfo, ExceptionReporter};
use crate::debug::symbols::{self, Symbolized};
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
    let _ = symbols::write_backtrace(&mut out, "      ");
}

/// The kernel binary's panic handler body: report, then exit QEMU with failure.
pub fn panic_handler(info: &PanicInfo<'_>) -> ! {
    crate::arch::irq_save();
    report(info);
    // The runner takes a core (docs/VMCORE.md), then ends QEMU.
    crate::debug::findleaks::forget_command_frames();
    crate::dev::qemu::pvpanic(crate::dev::qemu::PvpanicEvent::Panicked);
    exit_qemu(QemuExitCode::Failed)
}

/// Prints an exception report on the serial console: the vector's name,
/// the error code, RIP (symbolized), CR2 for page faults and a symbolized
/// frame-pointer backtrace of the interrupted code. A `nested` exception
/// (one while another was being reported) gets one line.
fn report_exception(info: &ExceptionInfo<'_>, nested: bool) {
    let mut out = emergency_writer();
    if nested {
        let _ = writeln!(
            out,
            "\n!!! nested exception {} while reporting; giving up",
            info.name
        );
        return;
    }
    let frame = info.frame;
    let rip = frame.instruction_pointer.as_u64() as usize;
    let _ = writeln!(
        out,
        "\n!!! EXCEPTION: {} (vector {}) on cpu {}",
        info.name,
        info.vector,
        crate::arch::cpu_id()
    );
    if let Some(code) = info.error_code {
        if info.vector == 14 {
            let flags = PageFaultErrorCode::from_bits_truncate(code);
            let _ = writeln!(out, "    error code: {code:#x} {flags:?}");
        } else {
            let _ = writeln!(out, "    error code: {code:#x}");
        }
    }
    let _ = writeln!(out, "    RIP: {:#018x} {}", rip, Symbolized(rip));
    if info.vector == 14 {
        match Cr2::read() {
            Ok(address) => {
                let _ = writeln!(
                    out,
                    "    CR2: {:#018x} (faulting address)",
                    address.as_u64()
                );
            }
            Err(error) => {
                let _ = writeln!(out, "    CR2: {:#018x} (non-canonical)", error.0);
            }
        }
    }
    let _ = writeln!(
        out,
        "    RSP: {:#018x}  RFLAGS: {:#x}  CS: {:#x}",
        frame.stack_pointer.as_u64(),
        frame.cpu_flags.bits(),
        frame.code_segment.0
    );
    let mut trace = [0usize; 32];
    let depth = symbols::backtrace_from(info.frame_pointer, &mut trace);
    let _ = writeln!(out, "    backtrace:");
    let _ = writeln!(out, "      #0  {:#018x} {}", rip, Symbolized(rip));
    let _ = symbols::write_trace(&mut out, "      ", 1, &trace[..depth]);
}

/// Exits QEMU with failure after a fatal exception.
fn exit_failed() -> ! {
    crate::debug::findleaks::forget_command_frames();
    crate::dev::qemu::pvpanic(crate::dev::qemu::PvpanicEvent::Panicked);
    exit_qemu(QemuExitCode::Failed)
}

/// What `arch::idt` calls on an exception (registered by `kernel_entry`).
pub const EXCEPTION_REPORTER: ExceptionReporter = ExceptionReporter {
    report: report_exception,
    exit: exit_failed,
};
