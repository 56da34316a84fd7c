//! Per-CPU GDT and TSS. The TSS holds the double-fault IST stack, so a
//! kernel stack overflow (a fault while pushing onto the guard page) still
//! reaches the double-fault handler with a good stack.

use alloc::boxed::Box;
use alloc::vec;

use x86_64::VirtAddr;
use x86_64::instructions::segmentation::{CS, DS, ES, SS, Segment};
use x86_64::instructions::tables::load_tss;
use x86_64::structures::gdt::{Descriptor, GlobalDescriptorTable, SegmentSelector};
use x86_64::structures::tss::TaskStateSegment;

/// IST slot (0-based) used by the double-fault handler.
pub const DOUBLE_FAULT_IST_INDEX: u16 = 0;
/// Size of each CPU's double-fault stack.
pub const DOUBLE_FAULT_STACK_SIZE: usize = 16 * 1024;

/// Builds and loads a GDT (kernel code, kernel data, TSS) for this CPU.
/// `double_fault_stack_top` overrides the freshly allocated IST stack.
pub(crate) fn init_this_cpu(double_fault_stack_top: Option<VirtAddr>) {
    let stack_top = double_fault_stack_top.unwrap_or_else(|| {
        let stack: &'static mut [u8] =
            Box::leak(vec![0u8; DOUBLE_FAULT_STACK_SIZE].into_boxed_slice());
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
