//! x86_64 architecture layer: CPU tables, exceptions, per-CPU data,
//! interrupt-flag control, the TSC, the ACPI processor list, the local
//! APIC and application-processor startup.
//!
//! Per-CPU state is reached through GS base ([`cpu_id`], [`this_cpu`]).
//! The boot CPU runs [`init_bsp`]; each application processor, started by
//! [`crate::smp`] through [`ap`], runs [`init_ap_percpu`] and [`init_ap`]: its own GDT and TSS
//! (with its own double-fault stack), the shared IDT, its LAPIC.

pub mod acpi;
pub mod ap;
pub mod gdt;
pub mod idt;
pub mod lapic;
pub mod percpu;
pub mod tsc;

use x86_64::instructions::port::Port;

pub use percpu::{
    CPU_SLOT_BYTES, CpuState, MAX_CPUS, PerCpu, alloc_tag_base, alloc_tag_current, cpu_id,
    cpu_offset, in_interrupt, irq_enter, irq_exit, this_cpu,
};

/// The number of CPUs the platform reports (enabled or online-capable
/// processors in the ACPI MADT, at most [`MAX_CPUS`]; 1 if there is no
/// MADT). Known from `acpi::init` on, before the slab allocator starts.
pub fn max_cpus() -> usize {
    acpi::nr_cpus().clamp(1, MAX_CPUS)
}

/// Disables interrupts and returns the previous RFLAGS, for [`irq_restore`].
#[inline]
pub fn irq_save() -> usize {
    let flags: u64;
    // SAFETY: pushfq/pop reads RFLAGS; cli only masks interrupts on this CPU.
    unsafe {
        // No `nomem`: the `cli` must act as a compiler barrier (a lock
        // acquire), or the compiler could move the memory accesses of the
        // section it opens, a lock's acquisition among them, above it.
        core::arch::asm!("pushfq", "pop {}", "cli", out(reg) flags, options(preserves_flags));
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

/// Sets up an application processor, first step: its per-CPU data with
/// `cpu_id` (GS base: the allocator needs it). Must run on that CPU, once,
/// with interrupts off, on the kernel's page tables, before [`init_ap`].
pub fn init_ap_percpu(cpu_id: usize) {
    percpu::init_this_cpu(cpu_id, lapic::id());
}

/// Sets up an application processor, second step (after
/// [`init_ap_percpu`]): a GDT/TSS with a freshly allocated double-fault
/// stack, the shared IDT, and its local APIC. The caller chooses the
/// allocation tag the GDT, TSS and stack are charged to.
pub fn init_ap() {
    gdt::init_this_cpu(None);
    idt::load();
    lapic::enable_this_cpu();
}

/// Halts the CPU forever with interrupts disabled.
pub fn halt_loop() -> ! {
    loop {
        x86_64::instructions::interrupts::disable();
        x86_64::instructions::hlt();
    }
}
