//! aarch64 on QEMU `virt` (`-kernel` ELF, no firmware): CPU 0 starts at
//! `_start` at EL1, the others are started through PSCI `CPU_ON` (`hvc`).
//! An identity map (1 GiB blocks: devices, then RAM) turns the MMU and
//! caches on; the GICv2 (0x0800_0000) routes the virtual timer (PPI 27)
//! and the IPI (SGI 0); the PL011 UART (0x0900_0000) is the console;
//! semihosting `SYS_EXIT` the exit code.

use core::arch::{asm, global_asm};
use core::fmt::Write;

use crate::NR_CPUS;

/// The shipped platform: aarch64 at EL1.
pub type Platform<K> = magpie_slab::glue::Aarch64<K>;

/// For the banner.
pub const NAME: &str = "aarch64, EL1";

const UART: usize = 0x0900_0000;
const GICD: usize = 0x0800_0000;
const GICC: usize = 0x0801_0000;
/// The EL1 virtual timer's interrupt (PPI 11).
const TIMER_IRQ: u32 = 27;
/// The IPI: software-generated interrupt 0.
const IPI_SGI: u32 = 0;
/// Ticks a second.
const HZ: u64 = 1000;

/// The identity map: level 1, 1 GiB blocks. 0-1 GiB devices (nGnRnE,
/// never executed), 1-2 GiB RAM (normal, write-back, inner shareable).
#[repr(C, align(4096))]
struct PageTable([u64; 512]);

static PAGE_TABLE: PageTable = {
    let mut entries = [0_u64; 512];
    // Block, AF, AttrIndx 0 (device), PXN and UXN.
    entries[0] = 1 | (1 << 10) | (1 << 53) | (1 << 54);
    // Block, AF, inner shareable, AttrIndx 1 (normal).
    entries[1] = 0x4000_0000 | 1 | (1 << 10) | (3 << 8) | (1 << 2);
    PageTable(entries)
};

// CPU 0's entry (`_start`) and the others' (`secondary_start`, x0 = the CPU
// index from CPU_ON): the index into TPIDR_EL1, FP/SIMD on, a 64 KiB
// stack, null frame pointer and link register, the vectors, the MMU on;
// CPU 0 clears .bss.
global_asm!(
    ".section .text.entry, \"ax\"",
    ".globl _start",
    "_start:",
    "    mov x19, #0",
    "    b 1f",
    ".globl secondary_start",
    "secondary_start:",
    "    mov x19, x0",
    "1:  msr tpidr_el1, x19",
    "    mov x1, #(3 << 20)",
    "    msr cpacr_el1, x1",
    "    isb",
    "    adrp x1, __stack_top",
    "    add x1, x1, :lo12:__stack_top",
    "    lsl x2, x19, #16",
    "    sub sp, x1, x2",
    "    mov x29, #0",
    "    mov x30, #0",
    "    adrp x1, {vectors}",
    "    add x1, x1, :lo12:{vectors}",
    "    msr vbar_el1, x1",
    "    ldr x1, =0xff00",
    "    msr mair_el1, x1",
    "    ldr x1, =0x100803519",
    "    msr tcr_el1, x1",
    "    adrp x1, {table}",
    "    add x1, x1, :lo12:{table}",
    "    msr ttbr0_el1, x1",
    "    tlbi vmalle1",
    "    dsb ish",
    "    isb",
    "    mrs x1, sctlr_el1",
    "    ldr x2, =0x1005",
    "    orr x1, x1, x2",
    "    bic x1, x1, #2",
    "    msr sctlr_el1, x1",
    "    isb",
    "    cbnz x19, 3f",
    "    adrp x1, __bss_start",
    "    add x1, x1, :lo12:__bss_start",
    "    adrp x2, __bss_end",
    "    add x2, x2, :lo12:__bss_end",
    "2:  cmp x1, x2",
    "    b.hs 3f",
    "    str xzr, [x1], #8",
    "    b 2b",
    "3:  mov x0, x19",
    "    bl {entry}",
    "4:  wfi",
    "    b 4b",
    vectors = sym vectors,
    table = sym PAGE_TABLE,
    entry = sym rust_entry,
);

// The vector table: IRQs from EL1 (either stack) save x0-x18, x29, x30
// (0..168), FPSR and FPCR (176) and q0-q31 (192..704: Rust code uses the
// SIMD registers), call irq_handler, eret;
// everything else is fatal.
global_asm!(
    ".section .text",
    ".balign 0x800",
    ".globl vectors",
    "vectors:",
    ".balign 0x80", "b 5f",
    ".balign 0x80", "b 6f",
    ".balign 0x80", "b 5f",
    ".balign 0x80", "b 5f",
    ".balign 0x80", "b 5f",
    ".balign 0x80", "b 6f",
    ".balign 0x80", "b 5f",
    ".balign 0x80", "b 5f",
    ".balign 0x80", "b 5f",
    ".balign 0x80", "b 5f",
    ".balign 0x80", "b 5f",
    ".balign 0x80", "b 5f",
    ".balign 0x80", "b 5f",
    ".balign 0x80", "b 5f",
    ".balign 0x80", "b 5f",
    ".balign 0x80", "b 5f",
    "5:  mrs x0, esr_el1",
    "    mrs x1, elr_el1",
    "    mrs x2, far_el1",
    "    bl {fatal}",
    "6:  sub sp, sp, #704",
    "    stp x0, x1, [sp, #0]",
    "    stp x2, x3, [sp, #16]",
    "    stp x4, x5, [sp, #32]",
    "    stp x6, x7, [sp, #48]",
    "    stp x8, x9, [sp, #64]",
    "    stp x10, x11, [sp, #80]",
    "    stp x12, x13, [sp, #96]",
    "    stp x14, x15, [sp, #112]",
    "    stp x16, x17, [sp, #128]",
    "    stp x18, x29, [sp, #144]",
    "    str x30, [sp, #160]",
    "    stp q0, q1, [sp, #192]",
    "    stp q2, q3, [sp, #224]",
    "    stp q4, q5, [sp, #256]",
    "    stp q6, q7, [sp, #288]",
    "    stp q8, q9, [sp, #320]",
    "    stp q10, q11, [sp, #352]",
    "    stp q12, q13, [sp, #384]",
    "    stp q14, q15, [sp, #416]",
    "    stp q16, q17, [sp, #448]",
    "    stp q18, q19, [sp, #480]",
    "    stp q20, q21, [sp, #512]",
    "    stp q22, q23, [sp, #544]",
    "    stp q24, q25, [sp, #576]",
    "    stp q26, q27, [sp, #608]",
    "    stp q28, q29, [sp, #640]",
    "    stp q30, q31, [sp, #672]",
    "    mrs x0, fpsr",
    "    mrs x1, fpcr",
    "    stp x0, x1, [sp, #176]",
    "    bl {irq}",
    "    ldp x0, x1, [sp, #176]",
    "    msr fpsr, x0",
    "    msr fpcr, x1",
    "    ldp q0, q1, [sp, #192]",
    "    ldp q2, q3, [sp, #224]",
    "    ldp q4, q5, [sp, #256]",
    "    ldp q6, q7, [sp, #288]",
    "    ldp q8, q9, [sp, #320]",
    "    ldp q10, q11, [sp, #352]",
    "    ldp q12, q13, [sp, #384]",
    "    ldp q14, q15, [sp, #416]",
    "    ldp q16, q17, [sp, #448]",
    "    ldp q18, q19, [sp, #480]",
    "    ldp q20, q21, [sp, #512]",
    "    ldp q22, q23, [sp, #544]",
    "    ldp q24, q25, [sp, #576]",
    "    ldp q26, q27, [sp, #608]",
    "    ldp q28, q29, [sp, #640]",
    "    ldp q30, q31, [sp, #672]",
    "    ldp x0, x1, [sp, #0]",
    "    ldp x2, x3, [sp, #16]",
    "    ldp x4, x5, [sp, #32]",
    "    ldp x6, x7, [sp, #48]",
    "    ldp x8, x9, [sp, #64]",
    "    ldp x10, x11, [sp, #80]",
    "    ldp x12, x13, [sp, #96]",
    "    ldp x14, x15, [sp, #112]",
    "    ldp x16, x17, [sp, #128]",
    "    ldp x18, x29, [sp, #144]",
    "    ldr x30, [sp, #160]",
    "    add sp, sp, #704",
    "    eret",
    fatal = sym fatal,
    irq = sym irq_handler,
);

unsafe extern "C" {
    fn vectors();
    fn secondary_start();
    static __heap_start: u8;
}

/// From the entry code, on the CPU's stack.
extern "C" fn rust_entry(cpu: usize) -> ! {
    if cpu == 0 {
        crate::kernel_main()
    }
    crate::secondary_main(cpu)
}

/// A synchronous exception or an unexpected vector.
extern "C" fn fatal(esr: usize, elr: usize, far: usize) -> ! {
    panic!("exception: ESR {esr:#x} ELR {elr:#x} FAR {far:#x}")
}

/// IRQs, interrupts masked, as interrupt context for the allocator.
extern "C" fn irq_handler() {
    crate::Platform::handle_interrupt(handle_irq);
}

/// The IRQ's work.
fn handle_irq() {
    // SAFETY: the GIC CPU interface's acknowledge register.
    let iar = unsafe { ((GICC + 0x0c) as *const u32).read_volatile() };
    match iar & 0x3ff {
        TIMER_IRQ => {
            set_timer();
            crate::on_tick(cpu_index());
        }
        IPI_SGI => crate::Platform::handle_cross_cpu_calls(),
        1023 => return,
        other => panic!("unexpected interrupt {other}"),
    }
    // SAFETY: the GIC CPU interface's end-of-interrupt register.
    unsafe { ((GICC + 0x10) as *mut u32).write_volatile(iar) };
}

/// This CPU's index (`TPIDR_EL1`).
pub fn cpu_index() -> usize {
    let cpu: usize;
    // SAFETY: reads TPIDR_EL1; no memory.
    unsafe { asm!("mrs {}, tpidr_el1", out(reg) cpu, options(nomem, nostack)) };
    cpu
}

/// Where the heap starts: the end of the image.
pub fn heap_start() -> usize {
    &raw const __heap_start as usize
}

/// The next tick of this CPU's virtual timer.
fn set_timer() {
    let frequency: u64;
    // SAFETY: reads the counter frequency and sets the timer's countdown.
    unsafe {
        asm!("mrs {}, cntfrq_el0", out(reg) frequency, options(nomem, nostack));
        asm!("msr cntv_tval_el0, {}", in(reg) frequency / HZ, options(nomem, nostack));
    }
}

/// Start this CPU's timer and take interrupts (timer and IPI).
pub fn timer_start() {
    // SAFETY: the GIC distributor (enabled once, idempotent) and this
    // CPU's banked enable register and CPU interface; then the timer and
    // IRQs unmasked (the vectors are set).
    unsafe {
        (GICD as *mut u32).write_volatile(1);
        ((GICD + 0x100) as *mut u32).write_volatile((1 << TIMER_IRQ) | (1 << IPI_SGI));
        ((GICC + 0x04) as *mut u32).write_volatile(0xf0);
        (GICC as *mut u32).write_volatile(1);
    }
    set_timer();
    // SAFETY: enables the virtual timer, then unmasks IRQs.
    unsafe {
        asm!("msr cntv_ctl_el0, {}", in(reg) 1_u64, options(nomem, nostack));
        asm!("msr daifclr, #2", options(nostack));
    }
}

/// Start CPUs 1.. with PSCI CPU_ON and wait until they are online (for
/// the allocator: `crate::online`).
pub fn start_secondaries() {
    for cpu in 1..NR_CPUS {
        let result: isize;
        // SAFETY: PSCI CPU_ON (SMC64 function 0xc400_0003) through the
        // hypervisor call QEMU's virt machine answers: MPIDR Aff0 = the
        // index, the entry's physical address (identity map), the index
        // as context id.
        unsafe {
            asm!("hvc #0",
                inout("x0") 0xc400_0003_usize => result,
                in("x1") cpu, in("x2") secondary_start as *const () as usize, in("x3") cpu,
                options(nostack));
        }
        assert_eq!(result, 0, "PSCI CPU_ON {cpu}");
    }
    for cpu in 1..NR_CPUS {
        while !crate::Platform::is_online(cpu) {
            core::hint::spin_loop();
        }
    }
}

/// Interrupt `cpu` (SGI 0 to it), after the stores before.
pub fn send_ipi(cpu: usize) {
    // SAFETY: orders earlier stores (the mailbox) before the distributor's
    // software-interrupt register write, which targets CPU interface `cpu`.
    unsafe {
        asm!("dsb ishst", options(nostack));
        ((GICD + 0xf00) as *mut u32).write_volatile((1 << (16 + cpu)) | IPI_SGI);
    }
}

/// Wait for an interrupt (interrupts on).
pub fn wait_for_interrupt() {
    // SAFETY: waits; no memory.
    unsafe { asm!("wfi", options(nomem, nostack)) };
}

/// One byte to the PL011.
pub fn putc(byte: u8) {
    // SAFETY: the PL011's flag (TXFF) and data registers.
    unsafe {
        while ((UART + 0x18) as *const u32).read_volatile() & (1 << 5) != 0 {}
        (UART as *mut u32).write_volatile(u32::from(byte));
    }
}

/// The UART without the console lock (the panic handler's).
pub struct RawConsole;

impl Write for RawConsole {
    fn write_str(&mut self, s: &str) -> core::fmt::Result {
        s.bytes().for_each(putc);
        Ok(())
    }
}

/// End QEMU with `code` (0: pass): semihosting SYS_EXIT,
/// ADP_Stopped_ApplicationExit.
pub fn exit(code: u32) -> ! {
    let block = [0x20026_u64, u64::from(code)];
    // SAFETY: the semihosting call (QEMU -semihosting) reads the block.
    unsafe {
        asm!("hlt #0xf000", in("x0") 0x18_usize, in("x1") block.as_ptr(), options(nostack));
    }
    loop {
        wait_for_interrupt();
    }
}
