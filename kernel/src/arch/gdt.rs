//! Per-CPU GDT and TSS. The TSS holds the double-fault IST stack, so a
//! kernel stack overflow (a fault while pushing onto the guard page) still
//! reaches the double-fault handler with a good stack.

use alloc::boxed::Box;
use alloc::vec;
use core::sync::atomic::{AtomicUsize, Ordering};

use x86_64::VirtAddr;
use x86_64::instructions::segmentation::{CS, DS, ES, SS, Segment};
use x86_64::instructions::tables::load_tss;
use x86_64::structures::gdt::{Descriptor, GlobalDescriptorTable, SegmentSelector};
use x86_64::structures::tss::TaskStateSegment;

use super::MAX_CPUS;

/// IST slot (0-based) used by the double-fault handler.
pub const DOUBLE_FAULT_IST_INDEX: u16 = 0;
/// Size of each CPU's double-fault stack.
pub const DOUBLE_FAULT_STACK_SIZE: usize = 16 * 1024;

/// Each CPU's GDT, TSS and double-fault stack (their starts), as plain
/// words in `.bss`: the CPU names them only through GDTR, the TSS
/// descriptor's split base and the IST's end-of-stack address, which the
/// leak scan (`kmem findleaks`) cannot read as pointers. Never read
/// otherwise (kmemleak's `kmemleak_not_leak`, done as a root), hence
/// `#[used]`: without it the never-read stores are optimised away.
#[used]
static CPU_TABLES: [[AtomicUsize; 3]; MAX_CPUS] =
    [const { [const { AtomicUsize::new(0) }; 3] }; MAX_CPUS];

/// Builds and loads a GDT (kernel code, kernel data, TSS) for this CPU.
/// `double_fault_stack_top` overrides the freshly allocated IST stack.
pub(crate) fn init_this_cpu(double_fault_stack_top: Option<VirtAddr>) {
    let tables = &CPU_TABLES[super::percpu::cpu_id()];
    let stack_top = double_fault_stack_top.unwrap_or_else(|| {
        let stack: &'static mut [u8] =
            Box::leak(vec![0u8; DOUBLE_FAULT_STACK_SIZE].into_boxed_slice());
        tables[2].store(stack.as_ptr() as usize, Ordering::Relaxed);
        // 16-byte aligned top of the stack.
        VirtAddr::from_ptr(stack.as_ptr_range().end).align_down(16u64)
    });

    let mut tss = TaskStateSegment::new();
    tss.interrupt_stack_table[DOUBLE_FAULT_IST_INDEX as usize] = stack_top;
    let tss: &'static TaskStateSegment = Box::leak(Box::new(tss));

    let mut gdt = GlobalDescriptorTable::new();
    let code: SegmentSelector = gdt.append(Descriptor::kernel_code_segment());
    let data: SegmentSelector = gdt.append(Descriptor::kernel_data_segment());
    let tss_selector: SegmentSelector = gdt.append(Descriptor::tss_segment(tss));
    let gdt: &'static GlobalDescriptorTable = Box::leak(Box::new(gdt));
    tables[0].store(core::ptr::from_ref(gdt) as usize, Ordering::Relaxed);
    tables[1].store(core::ptr::from_ref(tss) as usize, Ordering::Relaxed);

    gdt.load();
    // SAFETY: the selectors index the GDT just loaded, which lives forever
    // (leaked); the TSS descriptor is fresh (not busy) and points at a
    // leaked TSS.
    unsafe {
        CS::set_reg(code);
        DS::set_reg(data);
        ES::set_reg(data);
        SS::set_reg(data);
        load_tss(tss_selector);
    }
}
