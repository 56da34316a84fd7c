//! x86_64 architecture layer: CPU tables, exceptions, per-CPU data,
//! interrupt-flag control, the TSC and the ACPI processor count.
//!
//! Only the boot CPU runs today, but nothing here assumes one CPU: per-CPU
//! state is reached through GS base ([`cpu_id`], [`this_cpu`]), and
//! [`init_ap`] sets up a further CPU's tables once SMP bring-up exists.

pub mod acpi;
pub mod gdt;
pub mod idt;
pub mod percpu;

use x86_64::instructions::port::Port;

pub use percpu::{MAX_CPUS, PerCpu, cpu_id, this_cpu};

/// The number of CPUs the platform reports (enabled or online-capable
/// processors in the ACPI MADT; 1 if there is no MADT).
pub fn max_cpus() -> usize {
    acpi::nr_cpus()
}

/// Disables interrupts and returns the previous RFLAGS, for [`irq_restore`].
#[inline]
pub fn irq_save() -> usize {
    let flags: u64;
    // SAFETY: pushfq/pop reads RFLAGS; cli only masks interrupts on this CPU.
    unsafe {
        core::arch::asm!("pushfq", "pop {}", "cli", out(reg) flags, options(nomem, preserves_flags));
    }
    flags as usize
}

/// Restores the interrupt flag saved by [`irq_save`].
#[inline]
pub fn irq_restore(flags: usize) {
    const RFLAGS_IF: usize = 1 << 9;
    if flags & RFLAGS_IF != 0 {
        x86_64::instructions::interrupts::enable();
    }
}

/// Whether interrupts are enabled on this CPU.
pub fn irqs_enabled() -> bool {
    x86_64::instructions::interrupts::are_enabled()
}

/// Interrupts-off guard: disables interrupts on creation and restores the
/// previous state when dropped.
pub struct IrqGuard {
    flags: usize,
}

impl IrqGuard {
    /// Disables interrupts until the guard is dropped.
    #[inline]
    pub fn new() -> Self {
        Self { flags: irq_save() }
    }
}

impl Default for IrqGuard {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for IrqGuard {
    #[inline]
    fn drop(&mut self) {
        irq_restore(self.flags);
    }
}

/// Reads the time-stamp counter.
#[inline]
pub fn rdtsc() -> u64 {
    // SAFETY: RDTSC is available on every x86_64 CPU and has no side effects.
    unsafe { core::arch::x86_64::_rdtsc() }
}

/// Masks both legacy 8259 PICs (the console is polled; no timer yet).
fn mask_pic() {
    // SAFETY: writing 0xff to the PIC data ports (OCW1) only masks all IRQ lines.
    unsafe {
        Port::<u8>::new(0x21).write(0xff);
        Port::<u8>::new(0xa1).write(0xff);
    }
}

/// Sets up the boot CPU: per-CPU data, GDT/TSS, IDT; masks the PIC.
pub(crate) fn init_bsp() {
    percpu::init_this_cpu(0, 0);
    gdt::init_this_cpu(None);
    idt::init();
    idt::load();
    mask_pic();
}

/// Sets up an application processor (for SMP bring-up): per-CPU data with
/// `cpu_id`, a GDT/TSS with a freshly allocated double-fault stack, and the
/// shared IDT. Must run on that CPU, once.
pub fn init_ap(cpu_id: usize, apic_id: u32) {
    percpu::init_this_cpu(cpu_id, apic_id);
    gdt::init_this_cpu(None);
    idt::load();
}
