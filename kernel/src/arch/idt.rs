//! The interrupt descriptor table and CPU exception reports.
//!
//! Every CPU exception prints a report on the serial console: the vector's
//! name, the error code, RIP (symbolized), CR2 for page faults and a
//! symbolized frame-pointer backtrace of the interrupted code; then the
//! kernel exits QEMU with failure. `#BP` (int3) reports and continues.
//!
//! Three device vectors: the `smp` wake-up IPI, the LAPIC timer (the
//! handler [`set_timer_handler`] registered, in interrupt context:
//! `arch::in_interrupt`) and the LAPIC spurious vector.
//!
//! A test may install a hook ([`set_exception_hook`]) that runs after the
//! report, e.g. to turn an expected double fault into success.
//!
//! `arch/` calls up into nothing: what the handlers need from the kernel
//! above is registered at boot, before the IDT is loaded. The report
//! (console, symbolized backtrace) and the exit (QEMU) are an
//! [`ExceptionReporter`] ([`set_reporter`], by `kernel_entry`); the wake
//! IPI's work (`smp`'s pending cross-CPU call) is [`set_wake_handler`]'s.

use core::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use spin::Once;
use x86_64::structures::idt::{InterruptDescriptorTable, InterruptStackFrame, PageFaultErrorCode};

use super::gdt::DOUBLE_FAULT_IST_INDEX;

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

/// What the exception handlers need from the kernel above `arch/`.
#[derive(Clone, Copy)]
pub struct ExceptionReporter {
    /// Prints the report of an exception. `nested`: a fatal exception
    /// happened while another one was being reported (say so in one line).
    pub report: fn(info: &ExceptionInfo<'_>, nested: bool),
    /// Ends the kernel after a fatal exception (QEMU exits with failure).
    pub exit: fn() -> !,
}

static IDT: Once<InterruptDescriptorTable> = Once::new();
static REPORTER: Once<ExceptionReporter> = Once::new();
static WAKE_HANDLER: Once<fn()> = Once::new();
static PAGE_FAULT_HANDLER: Once<fn(&ExceptionInfo<'_>, usize) -> bool> = Once::new();
/// The LAPIC timer's work (a `fn()` as `usize`; 0: none).
static TIMER_HANDLER: AtomicUsize = AtomicUsize::new(0);
static HOOK: AtomicUsize = AtomicUsize::new(0);
static IN_REPORT: AtomicBool = AtomicBool::new(false);

/// Sets how exceptions are reported and how the kernel ends after a fatal
/// one (once, at boot, before [`init`]; later calls are ignored). Until
/// then an exception prints nothing and halts the CPU.
pub fn set_reporter(reporter: ExceptionReporter) {
    REPORTER.call_once(|| reporter);
}

/// Sets the work of the wake-up IPI, run after its EOI: `smp`'s pending
/// cross-CPU call (once; later calls are ignored).
pub fn set_wake_handler(handler: fn()) {
    WAKE_HANDLER.call_once(|| handler);
}

/// Installs the page-fault handler's first resort (once; later calls are
/// ignored): called with the fault and the faulting address (CR2); if it
/// returns true the fault was handled and the interrupted code resumes
/// (KFENCE, `crate::debug::kfence`), otherwise the fault is fatal.
pub fn set_page_fault_handler(handler: fn(&ExceptionInfo<'_>, usize) -> bool) {
    PAGE_FAULT_HANDLER.call_once(|| handler);
}

/// Sets the work of the LAPIC timer interrupt (`lapic::timer_start`), run
/// in interrupt context before its EOI; replaces the previous one.
pub fn set_timer_handler(handler: fn()) {
    TIMER_HANDLER.store(handler as usize, Ordering::Release);
}

/// Installs a function called after each fatal exception report (before the
/// kernel exits QEMU with failure). A hook may itself exit (e.g. with
/// success for an expected double fault).
pub fn set_exception_hook(hook: fn(&ExceptionInfo<'_>)) {
    HOOK.store(hook as usize, Ordering::Release);
}

/// Reads the interrupted code's frame pointer. Must be expanded directly in
/// the `x86-interrupt` handler: its prologue pushed the interrupted RBP at
/// `[rbp]` (the kernel is built with frame pointers in every non-leaf
/// function, and the handlers that expand this call out).
macro_rules! interrupted_frame_pointer {
    () => {{
        let rbp: usize;
        // SAFETY: reads this handler's own RBP; no memory access.
        unsafe { core::arch::asm!("mov {}, rbp", out(reg) rbp, options(nomem, nostack, preserves_flags)) };
        // SAFETY: `rbp` is this handler's frame pointer (forced frame
        // pointers): its prologue pushed the interrupted RBP there, on the
        // stack the handler runs on (the interrupted one or an IST stack),
        // mapped and 8-byte aligned.
        unsafe { core::ptr::read_volatile(rbp as *const usize) }
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
    let info = ExceptionInfo {
        vector: 14,
        name: "Page fault (#PF)",
        error_code: Some(error_code.bits()),
        frame: &frame,
        frame_pointer,
    };
    if let Some(handler) = PAGE_FAULT_HANDLER.get() {
        let address = x86_64::registers::control::Cr2::read_raw() as usize;
        if handler(&info, address) {
            // Handled (a KFENCE report; the page is mapped back in): the
            // faulting instruction runs again.
            return;
        }
    }
    fatal(&info);
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

/// Sends an interrupted restartable magazine hit back to its start
/// (`magpie_slab::restart`: the kernel's `RESTARTABLE_HITS`), before the
/// handler runs allocator code. Called first by every handler that can
/// (the wake IPI's cross-CPU calls, the timer's work); not by exception
/// handlers (single-stepping a hit must step through it).
pub fn restart_interrupted_hit(frame: &mut InterruptStackFrame) {
    let ip = frame.instruction_pointer.as_u64() as usize;
    if let Some(start) = magpie_slab::restart::restart_ip(ip) {
        // SAFETY: `start` is the first instruction of the restartable
        // sequence the interrupted code was in (the ranges table): the
        // code it interrupted resumes there with the same registers, the
        // sequence's inputs (it wrote none of them), and no other field
        // of the frame changes.
        unsafe {
            frame
                .as_mut()
                .update(|value| value.instruction_pointer = x86_64::VirtAddr::new(start as u64));
        }
        RESTARTS.fetch_add(1, Ordering::Relaxed);
    }
}

/// Interrupted restartable hits sent back to their start, ever, on every
/// CPU ([`restarts`]).
static RESTARTS: AtomicU64 = AtomicU64::new(0);

/// How many interrupts landed in a restartable magazine hit and sent it
/// back to its start (`magpie_slab::restart`), since boot, all CPUs.
pub fn restarts() -> u64 {
    RESTARTS.load(Ordering::Relaxed)
}

/// The `smp` wake-up IPI: ends a `hlt`, and runs the registered wake
/// handler ([`set_wake_handler`]: a pending `smp::cross_cpu_call`).
extern "x86-interrupt" fn wake(mut frame: InterruptStackFrame) {
    restart_interrupted_hit(&mut frame);
    super::lapic::eoi();
    if let Some(handler) = WAKE_HANDLER.get() {
        handler();
    }
}

/// The LAPIC timer: the registered handler between `irq_enter` and
/// `irq_exit`, then EOI.
extern "x86-interrupt" fn timer(mut frame: InterruptStackFrame) {
    restart_interrupted_hit(&mut frame);
    let handler = TIMER_HANDLER.load(Ordering::Acquire);
    if handler != 0 {
        // SAFETY: TIMER_HANDLER only ever holds a `fn()` stored by
        // set_timer_handler.
        let handler: fn() = unsafe { core::mem::transmute::<usize, fn()>(handler) };
        super::irq_enter();
        handler();
        super::irq_exit();
    }
    super::lapic::eoi();
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
        idt[super::lapic::TIMER_VECTOR].set_handler_fn(timer);
        idt[super::lapic::SPURIOUS_VECTOR].set_handler_fn(spurious);
        idt
    });
}

/// Loads the shared IDT on this CPU.
pub(crate) fn load() {
    IDT.get().expect("idt::init before idt::load").load();
}

fn report(info: &ExceptionInfo<'_>) {
    if let Some(reporter) = REPORTER.get() {
        (reporter.report)(info, false);
    }
}

/// Ends the kernel: the registered exit, else a halt.
fn exit() -> ! {
    match REPORTER.get() {
        Some(reporter) => (reporter.exit)(),
        None => super::halt_loop(),
    }
}

fn fatal(info: &ExceptionInfo<'_>) -> ! {
    if IN_REPORT.swap(true, Ordering::AcqRel) {
        if let Some(reporter) = REPORTER.get() {
            (reporter.report)(info, true);
        }
        exit();
    }
    report(info);
    let hook = HOOK.load(Ordering::Acquire);
    if hook != 0 {
        // SAFETY: HOOK only ever holds a `fn(&ExceptionInfo)` stored by set_exception_hook.
        let hook: fn(&ExceptionInfo<'_>) =
            unsafe { core::mem::transmute::<usize, fn(&ExceptionInfo<'_>)>(hook) };
        hook(info);
    }
    exit()
}
