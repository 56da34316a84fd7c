//! The kernel's virtual address space, fixed at build time: where the
//! direct map, the MMIO window and the kernel image are, and the image's
//! sections from the linker script (`boot/linker.ld`).
//!
//! ```text
//! 0xffff_8000_0000_0000  direct map: physical 0.. (2 MiB pages, RAM only), NX
//! 0xffff_c000_0000_0000  MMIO window (4 KiB pages, uncached), see paging::map_mmio
//! 0xffff_ffff_8000_0000  kernel image (4 KiB pages: text RX, rodata R, data RW NX);
//!                        the page below the boot stack is left unmapped (guard)
//! ```
//!
//! Until [`crate::mm::paging::init`] runs, the boot page tables from
//! `boot/entry.S` map physical `[0, 4 GiB)` at the same direct-map offset,
//! so [`phys_to_virt`] works from the first line of `kernel_entry`. This
//! file imports nothing of the crate: the boot info, the frame allocator,
//! the page tables and `arch/` all build on it.

/// Base of the direct map: physical address `p` is at `DIRECT_MAP_BASE + p`.
pub const DIRECT_MAP_BASE: u64 = 0xffff_8000_0000_0000;
/// Base of the MMIO window used by [`crate::mm::paging::map_mmio`].
pub const MMIO_BASE: u64 = 0xffff_c000_0000_0000;
/// Size of the MMIO window.
pub const MMIO_SIZE: u64 = 1 << 39;
/// The kernel image's virtual address minus its physical address.
pub const KERNEL_VMA: u64 = 0xffff_ffff_8000_0000;

unsafe extern "C" {
    static __kernel_start: u8;
    static __text_start: u8;
    static __text_end: u8;
    static __rodata_end: u8;
    static __boot_stack_guard: u8;
    static __boot_stack_bottom: u8;
    static __boot_stack_top: u8;
    static __kernel_end: u8;
}

/// Addresses of the kernel image's parts (higher-half virtual).
#[derive(Debug, Clone, Copy)]
pub struct KernelLayout {
    /// Start of the image (its load address in the higher half).
    pub start: u64,
    /// Start of `.text`.
    pub text_start: u64,
    /// End of `.text` (page-aligned).
    pub text_end: u64,
    /// End of read-only data (page-aligned); writable data follows.
    pub rodata_end: u64,
    /// The unmapped guard page below the boot stack.
    pub boot_stack_guard: u64,
    /// Lowest address of the boot stack.
    pub boot_stack_bottom: u64,
    /// Top of the boot stack.
    pub boot_stack_top: u64,
    /// End of the image (.bss included).
    pub end: u64,
}

/// The kernel image's layout from the linker script.
pub fn kernel_layout() -> KernelLayout {
    // Linker-script symbols: only their addresses are taken (no unsafe needed).
    {
        KernelLayout {
            start: core::ptr::addr_of!(__kernel_start) as u64,
            text_start: core::ptr::addr_of!(__text_start) as u64,
            text_end: core::ptr::addr_of!(__text_end) as u64,
            rodata_end: core::ptr::addr_of!(__rodata_end) as u64,
            boot_stack_guard: core::ptr::addr_of!(__boot_stack_guard) as u64,
            boot_stack_bottom: core::ptr::addr_of!(__boot_stack_bottom) as u64,
            boot_stack_top: core::ptr::addr_of!(__boot_stack_top) as u64,
            end: core::ptr::addr_of!(__kernel_end) as u64,
        }
    }
}

/// Physical `[start, end)` of the kernel image.
pub fn kernel_image_phys() -> (u64, u64) {
    let layout = kernel_layout();
    (layout.start - KERNEL_VMA, layout.end - KERNEL_VMA)
}

/// Whether `address` lies in the kernel's `.text`.
pub fn is_kernel_text(address: usize) -> bool {
    let layout = kernel_layout();
    (layout.text_start..layout.text_end).contains(&(address as u64))
}

/// The direct-map address of physical address `phys`.
#[inline]
pub fn phys_to_virt(phys: u64) -> usize {
    (DIRECT_MAP_BASE + phys) as usize
}
