//! What each CPU is doing ("shell kmalloc", "smp work", "boot"): the
//! context string that trace records, kmemtrace's trace table and context
//! capture store with each object (`PlatformHooks::context`). Set for the span
//! of a guard ([`enter_context`]); there is no scheduler, so one string per
//! CPU is all there is.

use spin::Mutex;

use crate::arch::{self, MAX_CPUS};

/// What each CPU is doing, for trace records ("shell kmalloc", "boot").
/// Each lock is taken with interrupts off only: [`write_this_cpu`] runs in
/// allocations, an interrupt handler's too, and an interrupt handler that
/// spun on the slot the code it interrupted held would never return (the
/// issue 29 hang: the LAPIC timer allocating from a traced cache while
/// the shell's `stress` did too).
static CONTEXT: [Mutex<&'static str>; MAX_CPUS] = [const { Mutex::new("boot") }; MAX_CPUS];

/// Sets this CPU's context string until the returned guard is dropped.
pub fn enter_context(what: &'static str) -> ContextGuard {
    let cpu = arch::cpu_id().min(MAX_CPUS - 1);
    let _irq = arch::IrqGuard::new();
    let previous = core::mem::replace(&mut *CONTEXT[cpu].lock(), what);
    ContextGuard { cpu, previous }
}

/// Restores the previous context string when dropped.
pub struct ContextGuard {
    cpu: usize,
    previous: &'static str,
}

impl Drop for ContextGuard {
    fn drop(&mut self) {
        let _irq = arch::IrqGuard::new();
        *CONTEXT[self.cpu].lock() = self.previous;
    }
}

/// Writes `cpuN CONTEXT` (this CPU's id and context string) into `buf`, cut
/// at its length; returns the bytes written. Allocates nothing; callable
/// in any context (the slot's lock is taken with interrupts off).
pub fn write_this_cpu(buf: &mut [u8; 32]) -> usize {
    let what = {
        let _irq = arch::IrqGuard::new();
        let cpu = arch::cpu_id();
        (cpu, *CONTEXT[cpu.min(MAX_CPUS - 1)].lock())
    };
    let (cpu, what) = what;
    let mut writer = ByteWriter { buf, len: 0 };
    let _ = core::fmt::write(&mut writer, format_args!("cpu{cpu} {what}"));
    writer.len
}

struct ByteWriter<'a> {
    buf: &'a mut [u8; 32],
    len: usize,
}

impl core::fmt::Write for ByteWriter<'_> {
    fn write_str(&mut self, s: &str) -> core::fmt::Result {
        let room = self.buf.len() - self.len;
        let take = s.len().min(room);
        self.buf[self.len..self.len + take].copy_from_slice(&s.as_bytes()[..take]);
        self.len += take;
        Ok(())
    }
}
