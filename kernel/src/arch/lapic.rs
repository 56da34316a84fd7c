//! The local APIC in xAPIC mode (memory-mapped registers): enabling it on
//! each CPU, its id, end of interrupt, and inter-processor interrupts
//! (INIT, STARTUP and the fixed wake-up vector of [`crate::smp`]), and the
//! LAPIC timer ([`timer_start`]: periodic, on [`TIMER_VECTOR`], its period
//! calibrated against the TSC).
//!
//! Every CPU's LAPIC answers at the same physical address; the kernel maps
//! that page once ([`init`], on the boot CPU) in the shared MMIO window, and
//! each CPU reaches its own LAPIC through that one mapping.

use core::sync::atomic::{AtomicU64, Ordering};

use crate::mm::paging;

/// Vector of the wake-up IPI (handled by `idt`: EOI only).
pub const WAKE_VECTOR: u8 = 0xf0;
/// Vector of the LAPIC timer (handled by `idt`: the registered timer
/// handler, then EOI).
pub const TIMER_VECTOR: u8 = 0x30;
/// Vector of spurious LAPIC interrupts (no EOI).
pub const SPURIOUS_VECTOR: u8 = 0xff;

const REG_ID: usize = 0x20;
const REG_VERSION: usize = 0x30;
const REG_TPR: usize = 0x80;
const REG_EOI: usize = 0xb0;
const REG_SVR: usize = 0xf0;
const REG_ESR: usize = 0x280;
const REG_ICR_LOW: usize = 0x300;
const REG_ICR_HIGH: usize = 0x310;
const REG_LVT_TIMER: usize = 0x320;
const REG_TIMER_INITIAL: usize = 0x380;
const REG_TIMER_CURRENT: usize = 0x390;
const REG_TIMER_DIVIDE: usize = 0x3e0;

const SVR_ENABLE: u32 = 1 << 8;
const ICR_DELIVERY_PENDING: u32 = 1 << 12;
const ICR_LEVEL_ASSERT: u32 = 1 << 14;
const ICR_FIXED: u32 = 0b000 << 8;
const ICR_INIT: u32 = 0b101 << 8;
const ICR_STARTUP: u32 = 0b110 << 8;

const LVT_MASKED: u32 = 1 << 16;
const LVT_TIMER_PERIODIC: u32 = 1 << 17;
/// Divide configuration 0b0011: the timer counts at bus clock / 16.
const TIMER_DIVIDE_16: u32 = 0b0011;
/// TSC time the timer's count rate is measured over.
const TIMER_CALIBRATION_US: u64 = 10_000;

/// LAPIC timer counts per millisecond (divide by 16), 0 until the first
/// [`timer_start`] measured it. Every CPU's LAPIC timer runs off the same
/// bus clock.
static TIMER_COUNTS_PER_MS: AtomicU64 = AtomicU64::new(0);

/// Virtual address of the LAPIC registers (0 until [`init`]).
static BASE: AtomicU64 = AtomicU64::new(0);

fn base() -> u64 {
    let base = BASE.load(Ordering::Acquire);
    assert!(base != 0, "lapic used before lapic::init");
    base
}

fn read(register: usize) -> u32 {
    // SAFETY: `base()` maps the LAPIC register page (uncached) for the
    // kernel's lifetime; `register` is one of the 16-byte aligned register
    // offsets above, inside that page. LAPIC registers are read 32 bits wide.
    unsafe { core::ptr::read_volatile((base() + register as u64) as *const u32) }
}

fn write(register: usize, value: u32) {
    // SAFETY: as in `read`; writes go to this CPU's own LAPIC.
    unsafe { core::ptr::write_volatile((base() + register as u64) as *mut u32, value) }
}

/// Maps the LAPIC registers at physical `phys` (from the MADT) and enables
/// the boot CPU's LAPIC. Idempotent; call after `paging::init`.
///
/// # Panics
///
/// If the LAPIC registers cannot be mapped (MMIO window or frames
/// exhausted at boot).
pub fn init(phys: u64) {
    if BASE.load(Ordering::Acquire) == 0 {
        let virt = paging::map_mmio(phys, 4096).expect("lapic: cannot map the LAPIC registers");
        BASE.store(virt.as_u64(), Ordering::Release);
        log::debug!(
            "{phys:#x} mapped at {:#x}, version {:#x}",
            virt.as_u64(),
            read(REG_VERSION)
        );
    }
    enable_this_cpu();
}

/// Whether [`init`] has run.
pub fn is_ready() -> bool {
    BASE.load(Ordering::Acquire) != 0
}

/// Enables this CPU's LAPIC: software enable with the spurious vector, all
/// priorities accepted. LVT entries stay as reset left them (masked).
pub fn enable_this_cpu() {
    write(REG_TPR, 0);
    write(REG_SVR, SVR_ENABLE | u32::from(SPURIOUS_VECTOR));
    // Clear any error latched during startup (ESR needs a write before a read).
    write(REG_ESR, 0);
    let _ = read(REG_ESR);
}

/// This CPU's local APIC id.
pub fn id() -> u32 {
    read(REG_ID) >> 24
}

/// Signals end of interrupt to this CPU's LAPIC.
pub fn eoi() {
    write(REG_EOI, 0);
}

fn wait_for_delivery() {
    let mut spins = 0u32;
    while read(REG_ICR_LOW) & ICR_DELIVERY_PENDING != 0 {
        spins += 1;
        if spins > 1_000_000 {
            log::warn!("IPI still pending after {spins} polls");
            return;
        }
        core::hint::spin_loop();
    }
}

fn send_ipi(apic_id: u32, command: u32) {
    // Both ICR writes with interrupts off: an interrupt handler sending its
    // own IPI in between would pair our high half with its low half.
    let _irq = super::IrqGuard::new();
    wait_for_delivery();
    write(REG_ICR_HIGH, apic_id << 24);
    write(REG_ICR_LOW, command);
    wait_for_delivery();
}

/// Sends INIT (assert) to the CPU with LAPIC id `apic_id`.
pub fn send_init(apic_id: u32) {
    send_ipi(apic_id, ICR_INIT | ICR_LEVEL_ASSERT);
}

/// Sends STARTUP with `vector`: the AP starts in real mode at `vector << 12`.
pub fn send_startup(apic_id: u32, vector: u8) {
    send_ipi(apic_id, ICR_STARTUP | ICR_LEVEL_ASSERT | u32::from(vector));
}

/// Sends the fixed [`WAKE_VECTOR`] interrupt to `apic_id` (wakes it from `hlt`).
pub fn send_wake(apic_id: u32) {
    send_ipi(
        apic_id,
        ICR_FIXED | ICR_LEVEL_ASSERT | u32::from(WAKE_VECTOR),
    );
}

/// LAPIC timer counts per millisecond at divide-by-16: counted from the
/// maximum down over [`TIMER_CALIBRATION_US`] of TSC time (`tsc::delay_us`,
/// so after `tsc::calibrate`), once; the timer is left stopped and masked.
fn timer_counts_per_ms() -> u64 {
    let known = TIMER_COUNTS_PER_MS.load(Ordering::Relaxed);
    if known != 0 {
        return known;
    }
    let _irq = super::IrqGuard::new();
    write(REG_LVT_TIMER, LVT_MASKED | u32::from(TIMER_VECTOR));
    write(REG_TIMER_DIVIDE, TIMER_DIVIDE_16);
    write(REG_TIMER_INITIAL, u32::MAX);
    super::tsc::delay_us(TIMER_CALIBRATION_US);
    let elapsed = u32::MAX - read(REG_TIMER_CURRENT);
    write(REG_TIMER_INITIAL, 0);
    let per_ms = (u64::from(elapsed) * 1000 / TIMER_CALIBRATION_US).max(1);
    TIMER_COUNTS_PER_MS.store(per_ms, Ordering::Relaxed);
    log::debug!("timer: {per_ms} counts/ms at divide-by-16");
    per_ms
}

/// Starts this CPU's LAPIC timer, periodic every `period_us` microseconds
/// (at least one count) on [`TIMER_VECTOR`]; the IDT runs the handler set
/// by `idt::set_timer_handler`. The first call measures the timer's rate
/// against the TSC (about 10 ms of busy wait). Call after [`init`].
pub fn timer_start(period_us: u64) {
    let per_ms = timer_counts_per_ms();
    let counts = (per_ms * period_us / 1000).clamp(1, u64::from(u32::MAX));
    write(REG_TIMER_DIVIDE, TIMER_DIVIDE_16);
    write(REG_LVT_TIMER, LVT_TIMER_PERIODIC | u32::from(TIMER_VECTOR));
    write(REG_TIMER_INITIAL, counts as u32);
}

/// Stops this CPU's LAPIC timer (masked, count zero). An interrupt already
/// pending may still arrive once.
pub fn timer_stop() {
    write(REG_LVT_TIMER, LVT_MASKED | u32::from(TIMER_VECTOR));
    write(REG_TIMER_INITIAL, 0);
}
