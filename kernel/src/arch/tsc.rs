//! The time-stamp counter, calibrated once against the PIT, for short
//! busy-wait delays (the INIT–SIPI–SIPI waits) and for turning cycle
//! counts into time.
//!
//! Calibration counts TSC ticks over 10 ms of PIT channel 2 (the speaker
//! channel, polled through port 0x61; no interrupt). Under QEMU TCG the TSC
//! follows the host's, so figures in cycles are host cycles.

use core::sync::atomic::{AtomicU64, Ordering};

use x86_64::instructions::port::Port;

use super::rdtsc;

/// PIT input clock in Hz.
const PIT_HZ: u64 = 1_193_182;
/// Calibration interval in milliseconds.
const CALIBRATION_MS: u64 = 10;
/// Assumed TSC rate before calibration (and if it fails): 1 GHz.
const DEFAULT_TSC_KHZ: u64 = 1_000_000;

static TSC_KHZ: AtomicU64 = AtomicU64::new(0);

/// Measures the TSC rate against the PIT (once; later calls return the
/// first result). Call with interrupts off on the boot CPU.
pub fn calibrate() -> u64 {
    let known = TSC_KHZ.load(Ordering::Relaxed);
    if known != 0 {
        return known;
    }
    let _irq = super::IrqGuard::new();
    let count = PIT_HZ * CALIBRATION_MS / 1000;
    let mut gate = Port::<u8>::new(0x61);
    let mut command = Port::<u8>::new(0x43);
    let mut channel2 = Port::<u8>::new(0x42);
    // SAFETY: ports 0x61 (speaker gate), 0x42/0x43 (PIT channel 2) are
    // only used here; the speaker output stays off (bit 1 clear).
    let cycles = unsafe {
        let value = gate.read();
        gate.write((value & !0x02) & !0x01);
        // Channel 2, lobyte/hibyte, mode 0 (interrupt on terminal count), binary.
        command.write(0b1011_0000);
        channel2.write((count & 0xff) as u8);
        channel2.write((count >> 8) as u8);
        // Gate high starts the count; OUT2 (bit 5) rises at zero.
        gate.write((value & !0x02) | 0x01);
        let start = rdtsc();
        let mut spins = 0u64;
        while gate.read() & 0x20 == 0 {
            spins += 1;
            if spins > 100_000_000 {
                break;
            }
            core::hint::spin_loop();
        }
        let cycles = rdtsc() - start;
        gate.write(value);
        if spins > 100_000_000 { 0 } else { cycles }
    };
    let khz = if cycles == 0 {
        log::warn!("PIT calibration timed out; assuming 1 GHz");
        DEFAULT_TSC_KHZ
    } else {
        (cycles / CALIBRATION_MS).max(1)
    };
    TSC_KHZ.store(khz, Ordering::Relaxed);
    log::debug!("{}.{:03} MHz", khz / 1000, khz % 1000);
    khz
}

/// TSC ticks per millisecond (1 GHz until [`calibrate`] has run).
pub fn khz() -> u64 {
    match TSC_KHZ.load(Ordering::Relaxed) {
        0 => DEFAULT_TSC_KHZ,
        khz => khz,
    }
}

/// Busy-waits at least `microseconds`.
pub fn delay_us(microseconds: u64) {
    let ticks = khz() * microseconds / 1000;
    let start = rdtsc();
    while rdtsc().wrapping_sub(start) < ticks {
        core::hint::spin_loop();
    }
}

/// Nanoseconds in `cycles` TSC ticks (and, for a TSC reading, nanoseconds
/// since the TSC started: boot).
pub fn cycles_to_ns(cycles: u64) -> u64 {
    (u128::from(cycles) * 1_000_000 / u128::from(khz())) as u64
}

/// Microseconds in `cycles` TSC ticks.
pub fn cycles_to_us(cycles: u64) -> u64 {
    cycles.saturating_mul(1000) / khz()
}
