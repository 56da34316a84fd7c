//! riscv64 on QEMU `virt` with `-bios none`: every hart starts at
//! 0x8000_0000 in machine mode. The CLINT (0x200_0000) gives the timer
//! (`mtimecmp`, 10 MHz) and the IPIs (`msip`), the NS16550 UART
//! (0x1000_0000) the console, `sifive_test` (0x10_0000) the exit code.

use core::arch::{asm, global_asm};
use core::fmt::Write;
use core::sync::atomic::{AtomicBool, Ordering};

use crate::NR_CPUS;

/// The shipped platform: riscv64 in machine mode.
pub type Platform<K> = magpie_slab::glue::Riscv64Machine<K>;

/// For the banner.
pub const NAME: &str = "riscv64, machine mode";

const UART: usize = 0x1000_0000;
const CLINT_MSIP: usize = 0x200_0000;
const CLINT_MTIMECMP: usize = 0x200_4000;
const CLINT_MTIME: usize = 0x200_bff8;
const SIFIVE_TEST: usize = 0x10_0000;
/// Timer period: 1 ms of the 10 MHz `mtime`.
const TICK: u64 = 10_000;

/// Set by hart 0 when the others may run.
static START: AtomicBool = AtomicBool::new(false);

// The entry of every hart (a0 = mhartid): its index into tp, a 64 KiB
// stack, a null frame pointer, the FPU on (riscv64gc code may use it), the
// trap vector; hart 0 clears .bss; harts beyond NR_CPUS park.
global_asm!(
    ".section .text.entry, \"ax\"",
    ".globl _start",
    "_start:",
    "    csrw mie, zero",
    "    csrr a0, mhartid",
    "    li t0, {nr_cpus}",
    "    bgeu a0, t0, 3f",
    "    mv tp, a0",
    "    la sp, __stack_top",
    "    slli t0, a0, 16",
    "    sub sp, sp, t0",
    "    li s0, 0",
    "    li t0, 0x2000",
    "    csrs mstatus, t0",
    "    la t0, {trap}",
    "    csrw mtvec, t0",
    "    bnez a0, 2f",
    "    la t0, __bss_start",
    "    la t1, __bss_end",
    "1:  bgeu t0, t1, 2f",
    "    sd zero, 0(t0)",
    "    addi t0, t0, 8",
    "    j 1b",
    "2:  call {entry}",
    "3:  wfi",
    "    j 3b",
    nr_cpus = const NR_CPUS,
    trap = sym trap_entry,
    entry = sym rust_entry,
);

// Traps: save the caller-saved registers on the interrupted stack, call
// trap_handler with interrupts off (mstatus.MIE cleared by the trap), mret.
global_asm!(
    ".section .text",
    ".align 4",
    ".globl trap_entry",
    "trap_entry:",
    "    addi sp, sp, -128",
    "    sd ra, 0(sp)",
    "    sd t0, 8(sp)",
    "    sd t1, 16(sp)",
    "    sd t2, 24(sp)",
    "    sd a0, 32(sp)",
    "    sd a1, 40(sp)",
    "    sd a2, 48(sp)",
    "    sd a3, 56(sp)",
    "    sd a4, 64(sp)",
    "    sd a5, 72(sp)",
    "    sd a6, 80(sp)",
    "    sd a7, 88(sp)",
    "    sd t3, 96(sp)",
    "    sd t4, 104(sp)",
    "    sd t5, 112(sp)",
    "    sd t6, 120(sp)",
    "    call {handler}",
    "    ld ra, 0(sp)",
    "    ld t0, 8(sp)",
    "    ld t1, 16(sp)",
    "    ld t2, 24(sp)",
    "    ld a0, 32(sp)",
    "    ld a1, 40(sp)",
    "    ld a2, 48(sp)",
    "    ld a3, 56(sp)",
    "    ld a4, 64(sp)",
    "    ld a5, 72(sp)",
    "    ld a6, 80(sp)",
    "    ld a7, 88(sp)",
    "    ld t3, 96(sp)",
    "    ld t4, 104(sp)",
    "    ld t5, 112(sp)",
    "    ld t6, 120(sp)",
    "    addi sp, sp, 128",
    "    mret",
    handler = sym trap_handler,
);

unsafe extern "C" {
    fn trap_entry();
    static __heap_start: u8;
}

/// From `_start`, on the hart's stack.
extern "C" fn rust_entry(hart: usize) -> ! {
    if hart == 0 {
        crate::kernel_main()
    }
    while !START.load(Ordering::Acquire) {
        core::hint::spin_loop();
    }
    crate::secondary_main(hart)
}

/// Machine-mode traps, as interrupt context for the allocator.
extern "C" fn trap_handler() {
    Platform::<crate::Smp>::handle_interrupt(handle_trap);
}

/// The trap's work.
fn handle_trap() {
    let (cause, epc, tval): (usize, usize, usize);
    // SAFETY: reads the trap CSRs; no memory.
    unsafe {
        asm!("csrr {}, mcause", "csrr {}, mepc", "csrr {}, mtval",
            out(reg) cause, out(reg) epc, out(reg) tval, options(nomem, nostack));
    }
    let hart = cpu_index();
    match cause {
        // Machine timer.
        c if c == (1 << 63) | 7 => {
            set_timer(hart);
            crate::on_tick(hart);
        }
        // Machine software interrupt: an IPI.
        c if c == (1 << 63) | 3 => {
            // SAFETY: this hart's msip word of the CLINT.
            unsafe { ((CLINT_MSIP + 4 * hart) as *mut u32).write_volatile(0) };
            Platform::<crate::Smp>::handle_cross_cpu_calls();
        }
        _ => panic!("trap: mcause {cause:#x} mepc {epc:#x} mtval {tval:#x}"),
    }
}

/// This hart's index (`tp`).
pub fn cpu_index() -> usize {
    let hart: usize;
    // SAFETY: reads tp; no memory.
    unsafe { asm!("mv {}, tp", out(reg) hart, options(nomem, nostack)) };
    hart
}

/// Where the heap starts: the end of the image.
pub fn heap_start() -> usize {
    &raw const __heap_start as usize
}

/// The next tick of this hart in `TICK`.
fn set_timer(hart: usize) {
    // SAFETY: the CLINT's mtime and this hart's mtimecmp.
    unsafe {
        let now = (CLINT_MTIME as *const u64).read_volatile();
        ((CLINT_MTIMECMP + 8 * hart) as *mut u64).write_volatile(now + TICK);
    }
}

/// Start this hart's timer and take interrupts (timer and IPI).
pub fn timer_start() {
    set_timer(cpu_index());
    // SAFETY: enables the machine timer and software interrupts, then
    // interrupts: the trap vector is set.
    unsafe {
        asm!("csrs mie, {}", "csrsi mstatus, 8", in(reg) (1 << 7) | (1 << 3), options(nostack))
    };
}

/// Release harts 1.. (spinning in `rust_entry`).
pub fn start_secondaries() {
    START.store(true, Ordering::Release);
}

/// Interrupt `hart` (its msip), after the stores before.
pub fn send_ipi(hart: usize) {
    // SAFETY: orders earlier stores (the mailbox) before the device write;
    // that hart's msip word of the CLINT.
    unsafe {
        asm!("fence w, o", options(nostack));
        ((CLINT_MSIP + 4 * hart) as *mut u32).write_volatile(1);
    }
}

/// Wait for an interrupt (interrupts on).
pub fn wait_for_interrupt() {
    // SAFETY: waits; no memory.
    unsafe { asm!("wfi", options(nomem, nostack)) };
}

/// One byte to the UART.
pub fn putc(byte: u8) {
    // SAFETY: the NS16550's line status and transmit registers.
    unsafe {
        while ((UART + 5) as *const u8).read_volatile() & 0x20 == 0 {}
        (UART as *mut u8).write_volatile(byte);
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

/// End QEMU with `code` (0: pass) through `sifive_test`.
pub fn exit(code: u32) -> ! {
    let value = if code == 0 {
        0x5555
    } else {
        (code << 16) | 0x3333
    };
    // SAFETY: the sifive_test device's register: QEMU exits.
    unsafe { (SIFIVE_TEST as *mut u32).write_volatile(value) };
    loop {
        wait_for_interrupt();
    }
}
