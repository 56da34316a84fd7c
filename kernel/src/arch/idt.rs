//! The interrupt descriptor table and CPU exception reports.
//!
//! Every CPU exception prints a report on the serial console: the vector's
//! name, the error code, RIP (symbolized), CR2 for page faults and a
//! symbolized frame-pointer backtrace of the interrupted code; then the
//! kernel exits QEMU with failure. `#BP` (int3) reports and continues.
//!
//! Two device vectors: the `smp` wake-up IPI and the LAPIC spurious vector.
//!
//! A test may install a hook ([`set_exception_hook`]) that runs after the
//! report, e.g. to turn an expected double fault into success.

use core::fmt::Write;
use core::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use spin::Once;
use x86_64::registers::control::Cr2;
use x86_64::structures::idt::{InterruptDescriptorTable, InterruptStackFrame, PageFaultErrorCode};

use super::gdt::DOUBLE_FAULT_IST_INDEX;
use crate::debug::symbols::Symbolized;
use crate::dev::console::emergency_writer;

/// What an exception handler saw; passed to the hook.
pub struct ExceptionInfo<'a> {
    /// The vector number (0–31).
    pub vector: u8,
    /// Human-readable name, e.g. `"Page fault (#PF)"`.
    pub name: &'static str,
    /// The CPU-pushed error code, for vectors that have one.
    pub error_code: Option<u64>,
    /// The interrupted context.
    pub frame: &'a InterruptStackFrame,
    /// The interrupted code's frame pointer (start of the backtrace).
    pub frame_pointer: usize,
}

static IDT: Once<InterruptDescriptorTable> = Once::new();
static HOOK: AtomicUsize = AtomicUsize::new(0);
static IN_REPORT: AtomicBool = AtomicBool::new(false);

/// Installs a function called after each fatal exception report (before the
/// kernel exits QEMU with failure). A hook may itself exit (e.g. with
/// success for an expected double fault).
pub fn set_exception_hook(hook: fn(&ExceptionInfo<'_>)) {
    HOOK.store(hook as usize, Ordering::Release);
}

/// Reads the interrupted code's frame pointer. Must be expanded directly in
/// the `x86-interrupt` handler: its prologue pushed the interrupted RBP at
/// `[rbp]` (the kernel is built with forced frame pointers).
macro_rules! interrupted_frame_pointer {
    () => {{
        let rbp: usize;
        // SAFETY: reads this handler's own RBP; no memory access.
        unsafe { core::arch::asm!("mov {}, rbp", out(reg) rbp, options(nomem, nostack, preserves_flags)) };
        crate::debug::symbols::read_frame_word(rbp).unwrap_or(0)
    }};
}

macro_rules! fatal_handler {
    ($fn_name:ident, $vector:expr, $name:expr) => {
        extern "x86-interrupt" fn $fn_name(frame: InterruptStackFrame) {
            let frame_pointer = interrupted_frame_pointer!();
            fatal(&ExceptionInfo {
                vector: $vector,
                name: $name,
                error_code: None,
                frame: &frame,
                frame_pointer,
            });
        }
    };
    ($fn_name:ident, $vector:expr, $name:expr, error_code) => {
        extern "x86-interrupt" fn $fn_name(frame: InterruptStackFrame, error_code: u64) {
            let frame_pointer = interrupted_frame_pointer!();
            fatal(&ExceptionInfo {
                vector: $vector,
                name: $name,
                error_code: Some(error_code),
                frame: &frame,
                frame_pointer,
            });
        }
    };
}

fatal_handler!(divide_error, 0, "Divide error (#DE)");
fatal_handler!(debug, 1, "Debug (#DB)");
fatal_handler!(nmi, 2, "Non-maskable interrupt (NMI)");
fatal_handler!(overflow, 4, "Overflow (#OF)");
fatal_handler!(bound_range, 5, "BOUND range exceeded (#BR)");
fatal_handler!(invalid_opcode, 6, "Invalid opcode (#UD)");
fatal_handler!(device_not_available, 7, "Device not available (#NM)");
fatal_handler!(invalid_tss, 10, "Invalid TSS (#TS)", error_code);
fatal_handler!(
    segment_not_present,
    11,
    "Segment not present (#NP)",
    error_code
);
fatal_handler!(stack_segment, 12, "Stack-segment fault (#SS)", error_code);
fatal_handler!(
    general_protection,
    13,
    "General protection fault (#GP)",
    error_code
);
fatal_handler!(x87_floating_point, 16, "x87 floating-point exception (#MF)");
fatal_handler!(alignment_check, 17, "Alignment check (#AC)", error_code);
fatal_handler!(
    simd_floating_point,
    19,
    "SIMD floating-point exception (#XM)"
);
fatal_handler!(virtualization, 20, "Virtualization exception (#VE)");
fatal_handler!(
    control_protection,
    21,
    "Control protection exception (#CP)",
    error_code
);
fatal_handler!(security, 30, "Security exception (#SX)", error_code);

extern "x86-interrupt" fn breakpoint(frame: InterruptStackFrame) {
    let frame_pointer = interrupted_frame_pointer!();
    let info = ExceptionInfo {
        vector: 3,
        name: "Breakpoint (#BP)",
        error_code: None,
        frame: &frame,
        frame_pointer,
    };
    report(&info);
}

extern "x86-interrupt" fn page_fault(frame: InterruptStackFrame, error_code: PageFaultErrorCode) {
    let frame_pointer = interrupted_frame_pointer!();
    fatal(&ExceptionInfo {
        vector: 14,
        name: "Page fault (#PF)",
        error_code: Some(error_code.bits()),
        frame: &frame,
        frame_pointer,
    });
}

extern "x86-interrupt" fn double_fault(frame: InterruptStackFrame, error_code: u64) -> ! {
    let frame_pointer = interrupted_frame_pointer!();
    fatal(&ExceptionInfo {
        vector: 8,
        name: "Double fault (#DF)",
        error_code: Some(error_code),
        frame: &frame,
        frame_pointer,
    })
}

extern "x86-interrupt" fn machine_check(frame: InterruptStackFrame) -> ! {
    let frame_pointer = interrupted_frame_pointer!();
    fatal(&ExceptionInfo {
        vector: 18,
        name: "Machine check (#MC)",
        error_code: None,
        frame: &frame,
        frame_pointer,
    })
}

/// The `smp` wake-up IPI: ends a `hlt`, and runs a pending cross-CPU call
/// (`smp::cross_cpu_call`).
extern "x86-interrupt" fn wake(_frame: InterruptStackFrame) {
    super::lapic::eoi();
    crate::smp::run_pending_call();
}

/// Spurious LAPIC interrupt: no EOI (the LAPIC did not set an in-service bit).
extern "x86-interrupt" fn spurious(_frame: InterruptStackFrame) {}

/// Builds the shared IDT (once).
pub(crate) fn init() {
    IDT.call_once(|| {
        let mut idt = InterruptDescriptorTable::new();
        idt.divide_error.set_handler_fn(divide_error);
        idt.debug.set_handler_fn(debug);
        idt.non_maskable_interrupt.set_handler_fn(nmi);
        idt.breakpoint.set_handler_fn(breakpoint);
        idt.overflow.set_handler_fn(overflow);
        idt.bound_range_exceeded.set_handler_fn(bound_range);
        idt.invalid_opcode.set_handler_fn(invalid_opcode);
        idt.device_not_available
            .set_handler_fn(device_not_available);
        // SAFETY: IST slot DOUBLE_FAULT_IST_INDEX holds a valid, otherwise unused
        // stack on every CPU (gdt::init_this_cpu runs before idt::load).
        unsafe {
            idt.double_fault
                .set_handler_fn(double_fault)
                .set_stack_index(DOUBLE_FAULT_IST_INDEX);
        }
        idt.invalid_tss.set_handler_fn(invalid_tss);
        idt.segment_not_present.set_handler_fn(segment_not_present);
        idt.stack_segment_fault.set_handler_fn(stack_segment);
        idt.general_protection_fault
            .set_handler_fn(general_protection);
        idt.page_fault.set_handler_fn(page_fault);
        idt.x87_floating_point.set_handler_fn(x87_floating_point);
        idt.alignment_check.set_handler_fn(alignment_check);
        idt.machine_check.set_handler_fn(machine_check);
        idt.simd_floating_point.set_handler_fn(simd_floating_point);
        idt.virtualization.set_handler_fn(virtualization);
        idt.cp_protection_exception
            .set_handler_fn(control_protection);
        idt.security_exception.set_handler_fn(security);
        idt[super::lapic::WAKE_VECTOR].set_handler_fn(wake);
        idt[super::lapic::SPURIOUS_VECTOR].set_handler_fn(spurious);
        idt
    });
}

/// Loads the shared IDT on this CPU.
pub(crate) fn load() {
    IDT.get().expect("idt::init before idt::load").load();
}

fn report(info: &ExceptionInfo<'_>) {
    let mut out = emergency_writer();
    let frame = info.frame;
    let rip = frame.instruction_pointer.as_u64() as usize;
    let _ = writeln!(
        out,
        "\n!!! EXCEPTION: {} (vector {}) on cpu {}",
        info.name,
        info.vector,
        super::cpu_id()
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
    let depth = crate::debug::symbols::backtrace_from(info.frame_pointer, &mut trace);
    let _ = writeln!(out, "    backtrace:");
    let _ = writeln!(out, "      #0  {:#018x} {}", rip, Symbolized(rip));
    let _ = crate::debug::symbols::write_trace(&mut out, "      ", 1, &trace[..depth]);
}

fn fatal(info: &ExceptionInfo<'_>) -> ! {
    if IN_REPORT.swap(true, Ordering::AcqRel) {
        let _ = writeln!(
            emergency_writer(),
            "\n!!! nested exception {} while reporting; giving up",
            info.name
        );
        crate::dev::qemu::exit_qemu(crate::dev::qemu::QemuExitCode::Failed);
    }
    report(info);
    let hook = HOOK.load(Ordering::Acquire);
    if hook != 0 {
        // SAFETY: HOOK only ever holds a `fn(&ExceptionInfo)` stored by set_exception_hook.
        let hook: fn(&ExceptionInfo<'_>) =
            unsafe { core::mem::transmute::<usize, fn(&ExceptionInfo<'_>)>(hook) };
        hook(info);
    }
    crate::dev::qemu::exit_qemu(crate::dev::qemu::QemuExitCode::Failed)
}
