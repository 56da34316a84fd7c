//! riscv64 on QEMU `virt`, in one of two modes:
//!
//! - machine mode (`-bios none`): every hart starts at 0x8000_0000; the
//!   CLINT (0x200_0000) gives the timer (`mtimecmp`, 10 MHz) and the IPIs
//!   (`msip`);
//! - supervisor mode (feature `smode`: under OpenSBI, QEMU's default
//!   firmware): the boot hart starts at 0x8020_0000 and starts the others
//!   (SBI `hart_start`); the SBI gives the timer (`set_timer`) and the IPIs
//!   (`send_ipi`).
//!
//! The NS16550 UART (0x1000_0000) is the console, `sifive_test`
//! (0x10_0000) the exit code.

use core::arch::{asm, global_asm};
use core::fmt::Write;
use core::sync::atomic::{AtomicBool, Ordering};

use crate::NR_CPUS;

/// The shipped platform: riscv64 in machine mode.
#[cfg(not(feature = "smode"))]
pub type Platform<K> = magpie_slab::glue::Riscv64Machine<K>;
/// The shipped platform: riscv64 in supervisor mode.
#[cfg(feature = "smode")]
pub type Platform<K> = magpie_slab::glue::Riscv64<K>;

/// For the banner.
#[cfg(not(feature = "smode"))]
pub const NAME: &str = "riscv64, machine mode";
/// For the banner.
#[cfg(feature = "smode")]
pub const NAME: &str = "riscv64, supervisor mode under OpenSBI";

/// The privilege level's CSRs and instructions.
#[cfg(not(feature = "smode"))]
macro_rules! mode {
    (status) => {
        "mstatus"
    };
    (ie) => {
        "mie"
    };
    (tvec) => {
        "mtvec"
    };
    (cause) => {
        "mcause"
    };
    (epc) => {
        "mepc"
    };
    (tval) => {
        "mtval"
    };
    (ret) => {
        "mret"
    };
    (hartid) => {
        "csrr a0, mhartid"
    };
    // Every hart enters at `_start`: hart 0 boots.
    (boot) => {
        "seqz a1, a0"
    };
}
/// The privilege level's CSRs and instructions.
#[cfg(feature = "smode")]
macro_rules! mode {
    (status) => {
        "sstatus"
    };
    (ie) => {
        "sie"
    };
    (tvec) => {
        "stvec"
    };
    (cause) => {
        "scause"
    };
    (epc) => {
        "sepc"
    };
    (tval) => {
        "stval"
    };
    (ret) => {
        "sret"
    };
    // The SBI passes the hart id in a0.
    (hartid) => {
        "nop"
    };
    // `_start` is the boot hart's alone.
    (boot) => {
        "li a1, 1"
    };
}

/// Interrupt causes and enable bits: timer and software (IPI).
#[cfg(not(feature = "smode"))]
const TIMER_CAUSE: usize = 7;
#[cfg(not(feature = "smode"))]
const IPI_CAUSE: usize = 3;
#[cfg(feature = "smode")]
const TIMER_CAUSE: usize = 5;
#[cfg(feature = "smode")]
const IPI_CAUSE: usize = 1;

const UART: usize = 0x1000_0000;
#[cfg(not(feature = "smode"))]
const CLINT_MSIP: usize = 0x200_0000;
#[cfg(not(feature = "smode"))]
const CLINT_MTIMECMP: usize = 0x200_4000;
#[cfg(not(feature = "smode"))]
const CLINT_MTIME: usize = 0x200_bff8;
const SIFIVE_TEST: usize = 0x10_0000;
/// Timer period: 1 ms of the 10 MHz `mtime`.
const TICK: u64 = 10_000;

/// Set by hart 0 when the others may run. In `.data`, which the loader
/// writes: the other harts read it while hart 0 clears `.bss`.
#[unsafe(link_section = ".data.start")]
static START: AtomicBool = AtomicBool::new(false);

// The entry of the harts (a0 = the hart id): machine mode, every hart at
// _start; supervisor mode, the boot hart at _start and the others at
// secondary_start (SBI hart_start). Each: its index into tp, a 64 KiB
// stack, a null frame pointer, the FPU on (riscv64gc code may use it), the
// trap vector; the boot hart (machine mode: hart 0) clears .bss, the
// others must not (in machine mode they all start at once: a late hart
// cleared .bss under a running hart 0, its allocator statics among it);
// harts beyond NR_CPUS park.
global_asm!(
    ".section .text.entry, \"ax\"",
    ".globl _start",
    "_start:",
    mode!(hartid),
    mode!(boot),
    "    j 1f",
    ".globl secondary_start",
    "secondary_start:",
    "    li a1, 0",
    concat!("1:  csrw ", mode!(ie), ", zero"),
    "    li t0, {nr_cpus}",
    "    bgeu a0, t0, 3f",
    "    mv tp, a0",
    "    la sp, __stack_top",
    "    slli t0, a0, 16",
    "    sub sp, sp, t0",
    "    li s0, 0",
    "    li t0, 0x2000",
    concat!("    csrs ", mode!(status), ", t0"),
    "    la t0, {trap}",
    concat!("    csrw ", mode!(tvec), ", t0"),
    "    beqz a1, 2f",
    "    la t0, __bss_start",
    "    la t1, __bss_end",
    "4:  bgeu t0, t1, 2f",
    "    sd zero, 0(t0)",
    "    addi t0, t0, 8",
    "    j 4b",
    "2:  call {entry}",
    "3:  wfi",
    "    j 3b",
    nr_cpus = const NR_CPUS,
    trap = sym trap_entry,
    entry = sym rust_entry,
);

// Traps: save the caller-saved registers on the interrupted stack, call
// trap_handler with interrupts off (xstatus.xIE cleared by the trap), xret.
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
    mode!(ret),
    handler = sym trap_handler,
);

unsafe extern "C" {
    fn trap_entry();
    static __heap_start: u8;
}

/// From the entry code, on the hart's stack: the boot hart (machine mode:
/// every hart enters as one; hart 0 boots) runs the kernel, the others
/// wait for it.
extern "C" fn rust_entry(hart: usize, boot: usize) -> ! {
    if boot != 0 {
        crate::kernel_main()
    }
    while !START.load(Ordering::Acquire) {
        core::hint::spin_loop();
    }
    crate::secondary_main(hart)
}

/// Machine-mode traps, as interrupt context for the allocator.
extern "C" fn trap_handler() {
    crate::Platform::handle_interrupt(handle_trap);
}

/// The trap's work.
fn handle_trap() {
    let (cause, epc, tval): (usize, usize, usize);
    // SAFETY: reads the trap CSRs; no memory.
    unsafe {
        asm!(concat!("csrr {}, ", mode!(cause)), concat!("csrr {}, ", mode!(epc)),
            concat!("csrr {}, ", mode!(tval)),
            out(reg) cause, out(reg) epc, out(reg) tval, options(nomem, nostack));
    }
    let hart = cpu_index();
    match cause {
        c if c == (1 << 63) | TIMER_CAUSE => {
            set_timer(hart);
            crate::on_tick(hart);
        }
        // The software interrupt: an IPI.
        c if c == (1 << 63) | IPI_CAUSE => {
            clear_ipi(hart);
            crate::Platform::handle_cross_cpu_calls();
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
#[cfg(not(feature = "smode"))]
fn set_timer(hart: usize) {
    // SAFETY: the CLINT's mtime and this hart's mtimecmp.
    unsafe {
        let now = (CLINT_MTIME as *const u64).read_volatile();
        ((CLINT_MTIMECMP + 8 * hart) as *mut u64).write_volatile(now + TICK);
    }
}

/// The next tick of this hart in `TICK` (SBI TIME `set_timer`, which also
/// clears the pending timer interrupt).
#[cfg(feature = "smode")]
fn set_timer(_hart: usize) {
    let now: u64;
    // SAFETY: reads the time CSR (the SBI lets supervisor mode read it).
    unsafe { asm!("rdtime {}", out(reg) now, options(nomem, nostack)) };
    sbi(0x5449_4d45, 0, [(now + TICK) as usize, 0, 0]);
}

/// An SBI call: extension `ext`, function `fid`; the error code.
#[cfg(feature = "smode")]
fn sbi(ext: usize, fid: usize, args: [usize; 3]) -> isize {
    let error: isize;
    // SAFETY: an environment call to the SBI, which reads a0-a2, a6, a7
    // and returns in a0-a1.
    unsafe {
        asm!("ecall", inlateout("a0") args[0] => error, inlateout("a1") args[1] => _,
            in("a2") args[2], in("a6") fid, in("a7") ext, options(nostack));
    }
    error
}

/// Start this hart's timer and take interrupts (timer and IPI).
pub fn timer_start() {
    set_timer(cpu_index());
    // SAFETY: enables the timer and software interrupts, then interrupts:
    // the trap vector is set.
    unsafe {
        asm!(concat!("csrs ", mode!(ie), ", {}"), concat!("csrsi ", mode!(status), ", {bit}"),
            in(reg) (1 << TIMER_CAUSE) | (1 << IPI_CAUSE),
            bit = const if cfg!(feature = "smode") { 2 } else { 8 },
            options(nostack));
    }
}

/// Release harts 1.. (machine mode: spinning in `rust_entry`; supervisor
/// mode: started with SBI HSM `hart_start` at `secondary_start`).
pub fn start_secondaries() {
    START.store(true, Ordering::Release);
    #[cfg(feature = "smode")]
    for hart in (0..NR_CPUS).filter(|&hart| hart != cpu_index()) {
        let entry = secondary_start as *const () as usize;
        assert_eq!(
            sbi(0x0048_534d, 0, [hart, entry, 0]),
            0,
            "SBI hart_start {hart}"
        );
    }
}

unsafe extern "C" {
    #[cfg(feature = "smode")]
    fn secondary_start();
}

/// Interrupt `hart`, after the stores before.
pub fn send_ipi(hart: usize) {
    // SAFETY: orders earlier stores (the mailbox) before the interrupt.
    unsafe { asm!("fence w, o", options(nostack)) };
    #[cfg(not(feature = "smode"))]
    // SAFETY: that hart's msip word of the CLINT.
    unsafe {
        ((CLINT_MSIP + 4 * hart) as *mut u32).write_volatile(1);
    }
    #[cfg(feature = "smode")]
    sbi(0x0073_5049, 0, [1 << hart, 0, 0]);
}

/// Acknowledge this hart's IPI.
fn clear_ipi(hart: usize) {
    #[cfg(not(feature = "smode"))]
    // SAFETY: this hart's msip word of the CLINT.
    unsafe {
        ((CLINT_MSIP + 4 * hart) as *mut u32).write_volatile(0);
    }
    #[cfg(feature = "smode")]
    {
        let _ = hart;
        // SAFETY: clears the supervisor software interrupt pending bit.
        unsafe { asm!("csrci sip, 2", options(nomem, nostack)) };
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
