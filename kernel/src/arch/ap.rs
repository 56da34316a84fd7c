//! Starting an application processor: the real-mode trampoline
//! (`boot/ap_trampoline.S`), its page tables, INIT–SIPI–SIPI, and the
//! AP's first Rust code.
//!
//! Low memory used (the frame allocator never hands out anything below
//! 1 MiB, so these pages are the kernel's):
//!
//! ```text
//! 0x8000  trampoline code and slots (SIPI vector 0x08)
//! 0x9000  trampoline PML4: [0] -> 0xa000, [256..512] = the kernel PML4's
//! 0xa000  PDPT: [0] -> 0xb000
//! 0xb000  PD: [0] = 2 MiB identity page at 0 (the trampoline runs there)
//! ```
//!
//! The AP leaves the trampoline on these tables, jumps to `smp::ap_entry` in
//! the higher half (mapped identically in both), and switches to the
//! kernel's own PML4 before anything else: every CPU runs on the same page
//! tables.

use core::sync::atomic::{AtomicU64, Ordering, fence};

use x86_64::PhysAddr;
use x86_64::registers::control::{Cr3, Cr3Flags, Cr4, Cr4Flags};
use x86_64::registers::model_specific::{Efer, EferFlags};
use x86_64::structures::paging::PhysFrame;

use super::{lapic, tsc};
use crate::mm::layout::phys_to_virt;
use crate::mm::paging;

core::arch::global_asm!(
    include_str!("../../../boot/ap_trampoline.S"),
    options(att_syntax)
);

unsafe extern "C" {
    static ap_trampoline_start: u8;
    static ap_trampoline_end: u8;
}

/// Physical address the trampoline is copied to (`.set` in the `.S` too).
pub const AP_TRAMPOLINE_PHYS: u64 = 0x8000;
const TRAMPOLINE_PML4_PHYS: u64 = 0x9000;
const TRAMPOLINE_PDPT_PHYS: u64 = 0xa000;
const TRAMPOLINE_PD_PHYS: u64 = 0xb000;
/// STARTUP IPI vector: the AP starts at `vector << 12`.
const SIPI_VECTOR: u8 = (AP_TRAMPOLINE_PHYS >> 12) as u8;

// Slot offsets inside the trampoline (two bytes of jmp, six of padding, then the slots).
const SLOT_CR3: u64 = 8;
const SLOT_STACK: u64 = 16;
const SLOT_ENTRY: u64 = 24;
const SLOT_ARG: u64 = 32;
const SLOT_EFER: u64 = 40;

/// [`crate::mm::frame::PAGE_SIZE`] as the `u64` that page-table arithmetic uses.
const PAGE_SIZE: u64 = crate::mm::frame::PAGE_SIZE as u64;
const PRESENT_WRITABLE: u64 = 0b11;
const HUGE: u64 = 1 << 7;

/// CR4 of the boot CPU, which each AP copies.
static BSP_CR4: AtomicU64 = AtomicU64::new(0);

/// The AP's Rust entry: called by the trampoline on the AP's own stack
/// with the argument given to [`start`]. Must not return.
pub type ApEntry = extern "C" fn(arg: u64) -> !;

fn write_u64(phys: u64, value: u64) {
    // SAFETY: only called on the trampoline pages 0x8000..0xc000, which are
    // RAM below 1 MiB that the frame allocator never hands out (reserved),
    // mapped in the direct map (2 MiB chunk 0 holds RAM), and touched only
    // by the boot CPU while no AP runs the trampoline.
    unsafe { core::ptr::write_volatile(phys_to_virt(phys) as *mut u64, value) }
}

/// Copies the trampoline to low memory and builds its page tables from the
/// kernel's PML4. Call on the boot CPU after `paging::init`, before [`start`].
pub(crate) fn prepare() {
    // Symbols from boot/ap_trampoline.S: only their addresses are taken.
    let start = core::ptr::addr_of!(ap_trampoline_start) as usize;
    let end = core::ptr::addr_of!(ap_trampoline_end) as usize;
    let len = end - start;
    assert!(
        len as u64 <= PAGE_SIZE,
        "AP trampoline is {len} bytes, more than a page"
    );
    assert!(
        paging::is_readable(phys_to_virt(AP_TRAMPOLINE_PHYS), 4 * PAGE_SIZE as usize),
        "AP trampoline pages are not RAM in the direct map"
    );
    // SAFETY: source: the trampoline bytes in .rodata; destination: the
    // reserved low pages (see `write_u64`); they do not overlap.
    unsafe {
        core::ptr::copy_nonoverlapping(
            start as *const u8,
            phys_to_virt(AP_TRAMPOLINE_PHYS) as *mut u8,
            len,
        );
        core::ptr::write_bytes(
            phys_to_virt(TRAMPOLINE_PML4_PHYS) as *mut u8,
            0,
            3 * PAGE_SIZE as usize,
        );
    }
    write_u64(TRAMPOLINE_PD_PHYS, PRESENT_WRITABLE | HUGE);
    write_u64(TRAMPOLINE_PDPT_PHYS, TRAMPOLINE_PD_PHYS | PRESENT_WRITABLE);
    write_u64(
        TRAMPOLINE_PML4_PHYS,
        TRAMPOLINE_PDPT_PHYS | PRESENT_WRITABLE,
    );
    let kernel_pml4 = paging::kernel_pml4();
    assert!(kernel_pml4 != 0, "ap::prepare before paging::init");
    for index in 256..512u64 {
        // SAFETY: the kernel PML4 is a live page table frame in the direct
        // map; reading its upper-half entries has no side effect.
        let entry = unsafe {
            core::ptr::read_volatile((phys_to_virt(kernel_pml4) + index as usize * 8) as *const u64)
        };
        write_u64(TRAMPOLINE_PML4_PHYS + index * 8, entry);
    }
    write_u64(AP_TRAMPOLINE_PHYS + SLOT_CR3, TRAMPOLINE_PML4_PHYS);
    let nxe = if Efer::read().contains(EferFlags::NO_EXECUTE_ENABLE) {
        EferFlags::NO_EXECUTE_ENABLE.bits()
    } else {
        0
    };
    write_u64(
        AP_TRAMPOLINE_PHYS + SLOT_EFER,
        EferFlags::LONG_MODE_ENABLE.bits() | nxe,
    );
    BSP_CR4.store(Cr4::read_raw(), Ordering::Relaxed);
}

/// Starts the AP with LAPIC id `apic_id` (INIT, 10 ms, STARTUP, 200 µs,
/// STARTUP unless `is_up` already says it runs). It enters `entry(arg)` on
/// the stack ending at `stack_top`.
///
/// # Safety
///
/// [`prepare`] has run; no other AP is between STARTUP and its entry (they
/// share the trampoline's slots); `stack_top` is the 16-byte aligned top of
/// a mapped, writable stack that nothing else uses; `entry` first calls
/// [`enter_kernel`] and never returns.
pub(crate) unsafe fn start(
    apic_id: u32,
    stack_top: u64,
    entry: ApEntry,
    arg: u64,
    is_up: &dyn Fn() -> bool,
) {
    write_u64(AP_TRAMPOLINE_PHYS + SLOT_STACK, stack_top);
    write_u64(AP_TRAMPOLINE_PHYS + SLOT_ENTRY, entry as usize as u64);
    write_u64(AP_TRAMPOLINE_PHYS + SLOT_ARG, arg);
    fence(Ordering::SeqCst);
    lapic::send_init(apic_id);
    tsc::delay_us(10_000);
    lapic::send_startup(apic_id, SIPI_VECTOR);
    tsc::delay_us(200);
    if !is_up() {
        lapic::send_startup(apic_id, SIPI_VECTOR);
        tsc::delay_us(200);
    }
}

/// First thing an AP does in Rust: switch to the kernel's page tables and
/// the boot CPU's CR4. Touches neither the stack's contents beyond this
/// frame nor GS (not set up yet).
///
/// # Safety
///
/// Runs once per AP, first, from an [`ApEntry`] that the trampoline called.
pub(crate) unsafe fn enter_kernel() {
    let pml4 = PhysFrame::containing_address(PhysAddr::new(paging::kernel_pml4()));
    // SAFETY: the kernel PML4 maps the higher half exactly as the
    // trampoline tables do (their upper entries are copies), so the code,
    // this stack (direct map) and the statics stay mapped across the switch.
    unsafe { Cr3::write(pml4, Cr3Flags::empty()) };
    let cr4 = Cr4Flags::from_bits_truncate(BSP_CR4.load(Ordering::Relaxed));
    // SAFETY: the boot CPU runs with these CR4 bits on the same CPU model
    // (QEMU gives every vCPU the same features); PAE is among them.
    unsafe { Cr4::write(cr4) };
}
