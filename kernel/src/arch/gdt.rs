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
    keep_in_memory(
        gdt as *const GlobalDescriptorTable as usize,
        tss as *const TaskStateSegment as usize,
    );

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

/// Every CPU's GDT and TSS, by address: a CPU names them only in its GDTR
/// and task register (the TSS's address is split across a descriptor), so
/// they are kept here too, where a scan of the kernel's memory sees them
/// (`kmem findleaks`: a CPU's registers are roots). `#[used]`: written,
/// never read by code, so the stores must not be optimised away.
#[used]
static TABLES: [AtomicUsize; 2 * crate::arch::percpu::MAX_CPUS] =
    [const { AtomicUsize::new(0) }; 2 * crate::arch::percpu::MAX_CPUS];
/// Slots of [`TABLES`] taken.
static NR_TABLES: AtomicUsize = AtomicUsize::new(0);

/// Note a CPU's GDT and TSS in [`TABLES`].
fn keep_in_memory(gdt: usize, tss: usize) {
    for address in [gdt, tss] {
        let slot = NR_TABLES.fetch_add(1, Ordering::Relaxed);
        if let Some(slot) = TABLES.get(slot) {
            slot.store(address, Ordering::Relaxed);
        }
    }
}
