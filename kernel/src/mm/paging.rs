//! Virtual memory: the kernel image mapping, the direct map of all physical
//! RAM, and MMIO mappings.
//!
//! Layout (four-level paging):
//!
//! ```text
//! 0xffff_8000_0000_0000  direct map: physical 0.. (2 MiB pages, RAM only), NX
//! 0xffff_c000_0000_0000  MMIO window (4 KiB pages, uncached), see map_mmio
//! 0xffff_ffff_8000_0000  kernel image (4 KiB pages: text RX, rodata R, data RW NX);
//!                        the page below the boot stack is left unmapped (guard)
//! ```
//!
//! The addresses of this layout are constants of [`crate::mm::layout`];
//! until [`init`] runs, the boot page tables from `boot/entry.S` map
//! physical `[0, 4 GiB)` at the same direct-map offset.

use core::sync::atomic::{AtomicU64, Ordering};

use spin::Mutex;
use x86_64::registers::control::{Cr3, Cr3Flags};
use x86_64::registers::model_specific::{Efer, EferFlags};
use x86_64::structures::paging::{
    FrameAllocator, Mapper, OffsetPageTable, Page, PageTable, PageTableFlags, PhysFrame, Size2MiB,
    Size4KiB,
};
pub use x86_64::{PhysAddr, VirtAddr};

use crate::mm::boot_info::BootInfo;
use crate::mm::frame;
use crate::mm::layout::{
    DIRECT_MAP_BASE, KERNEL_VMA, MMIO_BASE, MMIO_SIZE, kernel_layout, phys_to_virt,
};
use crate::mm::reserved;

const HUGE_PAGE_SIZE: u64 = 2 << 20;
/// [`crate::mm::frame::PAGE_SIZE`] as the `u64` that page-table arithmetic uses.
const PAGE_SIZE: u64 = crate::mm::frame::PAGE_SIZE as u64;

/// The physical address behind a direct-map or kernel-image address.
pub fn virt_to_phys(virt: usize) -> Option<u64> {
    let virt = virt as u64;
    let (start, end) = direct_map_span();
    if (start as u64..end as u64).contains(&virt) {
        return Some(virt - DIRECT_MAP_BASE);
    }
    let layout = kernel_layout();
    (layout.start..layout.end)
        .contains(&virt)
        .then(|| virt - KERNEL_VMA)
}

static DIRECT_MAP_END: AtomicU64 = AtomicU64::new(DIRECT_MAP_BASE + (4 << 30));
static KERNEL_PML4: AtomicU64 = AtomicU64::new(0);
static MMIO_NEXT: AtomicU64 = AtomicU64::new(MMIO_BASE);
static MAP_LOCK: Mutex<()> = Mutex::new(());

/// Virtual `[start, end)` of the direct map: it covers every RAM frame
/// (2 MiB chunks that hold no RAM inside the span are left unmapped).
pub fn direct_map_span() -> (usize, usize) {
    (
        DIRECT_MAP_BASE as usize,
        DIRECT_MAP_END.load(Ordering::Relaxed) as usize,
    )
}

/// Whether `[address, address + len)` is kernel memory that can be read
/// without faulting: the mapped kernel image (minus the stack guard page) or
/// RAM in the direct map. Used by the backtrace walker.
pub fn is_readable(address: usize, len: usize) -> bool {
    let Some(last) = address.checked_add(len.max(1) - 1) else {
        return false;
    };
    let (start, last) = (address as u64, last as u64);
    let layout = kernel_layout();
    if start >= layout.text_start && last < layout.end {
        let guard = layout.boot_stack_guard..layout.boot_stack_guard + PAGE_SIZE;
        return !guard.contains(&start) && !guard.contains(&last);
    }
    let (map_start, map_end) = direct_map_span();
    if start >= map_start as u64 && last < map_end as u64 {
        let Some(boot) = crate::mm::boot_info::get() else {
            return false;
        };
        let (phys_start, phys_last) = (start - DIRECT_MAP_BASE, last - DIRECT_MAP_BASE);
        return boot.memmap.iter().any(|region| {
            region.kind.is_ram()
                && phys_start >= region.start & !(HUGE_PAGE_SIZE - 1)
                && phys_last < region.end().next_multiple_of(HUGE_PAGE_SIZE)
        });
    }
    false
}

/// Hands page-table frames to the x86_64 crate's mapper.
struct TableFrames;

// SAFETY: frames come from the frame allocator, are unused, and the mapper
// zeroes them through the direct map before use.
unsafe impl FrameAllocator<Size4KiB> for TableFrames {
    fn allocate_frame(&mut self) -> Option<PhysFrame<Size4KiB>> {
        let phys = frame::alloc_contiguous(1)?;
        debug_assert!(
            phys.as_u64() < 4 << 30,
            "page table frame above the boot direct map"
        );
        Some(PhysFrame::containing_address(phys))
    }
}

fn nx_flag() -> PageTableFlags {
    if Efer::read().contains(EferFlags::NO_EXECUTE_ENABLE) {
        PageTableFlags::NO_EXECUTE
    } else {
        PageTableFlags::empty()
    }
}

/// # Safety
///
/// `pml4_phys` must be a page table frame owned by the kernel and reachable
/// through the direct map, and the caller must hold `MAP_LOCK` (or be the
/// only CPU, during boot).
unsafe fn mapper(pml4_phys: u64) -> OffsetPageTable<'static> {
    // SAFETY: per the function's contract the frame holds a page table reachable in the direct map.
    let pml4 = unsafe { &mut *(phys_to_virt(pml4_phys) as *mut PageTable) };
    // SAFETY: the direct map maps all RAM (where page tables live) at DIRECT_MAP_BASE.
    unsafe { OffsetPageTable::new(pml4, VirtAddr::new(DIRECT_MAP_BASE)) }
}

/// Builds the kernel's final page tables and switches to them.
pub(crate) fn init(boot: &BootInfo) {
    let pml4_phys = frame::alloc_contiguous(1)
        .expect("no frame for the PML4")
        .as_u64();
    // SAFETY: freshly allocated frame, reachable through the boot direct map.
    unsafe { core::ptr::write_bytes(phys_to_virt(pml4_phys) as *mut u8, 0, PAGE_SIZE as usize) };
    // SAFETY: the new PML4 is ours alone; boot runs on one CPU.
    let mut table = unsafe { mapper(pml4_phys) };
    let nx = nx_flag();
    let table_flags = PageTableFlags::PRESENT | PageTableFlags::WRITABLE;

    // Direct map: every 2 MiB chunk that holds RAM, and the ACPI tables
    // (which may sit in "reserved" memory) so they stay readable.
    let ram = boot
        .memmap
        .iter()
        .filter(|region| region.kind.is_ram() && region.size > 0)
        .map(|region| (region.start, region.end()));
    let mut map_end = 0u64;
    for (start, end) in ram.chain(reserved::ranges()) {
        let end = end.next_multiple_of(HUGE_PAGE_SIZE);
        let mut chunk = start & !(HUGE_PAGE_SIZE - 1);
        while chunk < end {
            let page = Page::<Size2MiB>::containing_address(VirtAddr::new(DIRECT_MAP_BASE + chunk));
            if table.translate_page(page).is_err() {
                let frame = PhysFrame::<Size2MiB>::containing_address(PhysAddr::new(chunk));
                let flags = PageTableFlags::PRESENT | PageTableFlags::WRITABLE | nx;
                // SAFETY: direct-map addresses alias physical memory; nothing else lives in this range.
                unsafe {
                    table.map_to_with_table_flags(page, frame, flags, table_flags, &mut TableFrames)
                }
                .expect("direct map")
                .ignore();
            }
            chunk += HUGE_PAGE_SIZE;
        }
        map_end = map_end.max(end);
    }

    // Kernel image, 4 KiB pages with per-section permissions.
    let layout = kernel_layout();
    let mut virt = layout.text_start;
    while virt < layout.end {
        let flags = if virt < layout.text_end {
            PageTableFlags::PRESENT
        } else if virt < layout.rodata_end {
            PageTableFlags::PRESENT | nx
        } else {
            PageTableFlags::PRESENT | PageTableFlags::WRITABLE | nx
        };
        if virt != layout.boot_stack_guard {
            let page = Page::<Size4KiB>::containing_address(VirtAddr::new(virt));
            let frame = PhysFrame::<Size4KiB>::containing_address(PhysAddr::new(virt - KERNEL_VMA));
            // SAFETY: maps the kernel image onto its own load address, as the boot tables did.
            unsafe {
                table.map_to_with_table_flags(page, frame, flags, table_flags, &mut TableFrames)
            }
            .expect("kernel image map")
            .ignore();
        }
        virt += PAGE_SIZE;
    }

    DIRECT_MAP_END.store(DIRECT_MAP_BASE + map_end, Ordering::Relaxed);
    KERNEL_PML4.store(pml4_phys, Ordering::Release);
    // SAFETY: the new tables map everything the kernel uses: its image
    // (including the current stack), and the direct map of all RAM.
    unsafe {
        Cr3::write(
            PhysFrame::containing_address(PhysAddr::new(pml4_phys)),
            Cr3Flags::empty(),
        )
    };
    log::debug!(
        "direct map {:#x}..{:#x}, kernel {:#x}..{:#x}",
        DIRECT_MAP_BASE,
        DIRECT_MAP_BASE + map_end,
        layout.start,
        layout.end
    );
}

/// Physical address of the kernel's PML4 (for loading CR3 on other CPUs).
pub fn kernel_pml4() -> u64 {
    KERNEL_PML4.load(Ordering::Acquire)
}

/// Maps `size` bytes of device memory at physical `phys` (uncached, NX) into
/// the MMIO window and returns the virtual address of `phys`. Mappings are
/// permanent. Returns `None` if the window or the frame allocator is exhausted.
///
/// # Panics
///
/// If called before `memory::init`.
pub fn map_mmio(phys: u64, size: usize) -> Option<VirtAddr> {
    let first = phys & !(PAGE_SIZE - 1);
    let end = (phys + size as u64).next_multiple_of(PAGE_SIZE);
    let flags = PageTableFlags::PRESENT
        | PageTableFlags::WRITABLE
        | PageTableFlags::NO_CACHE
        | PageTableFlags::WRITE_THROUGH
        | nx_flag();
    let base = map_window(first, (end - first) / PAGE_SIZE, flags)?;
    Some(VirtAddr::new(base + (phys - first)))
}

/// Maps the `nr_pages` frames from physical `first` at fresh pages of the
/// MMIO window with `flags`, permanently; their virtual address. `None` if
/// the window or the frame allocator (page tables) is exhausted.
fn map_window(first: u64, nr_pages: u64, flags: PageTableFlags) -> Option<u64> {
    let _lock = MAP_LOCK.lock();
    let base = MMIO_NEXT.fetch_add(nr_pages * PAGE_SIZE, Ordering::Relaxed);
    if base + nr_pages * PAGE_SIZE > MMIO_BASE + MMIO_SIZE {
        return None;
    }
    let pml4 = kernel_pml4();
    assert!(pml4 != 0, "map_mmio before memory::init");
    // SAFETY: the kernel PML4 is live and MAP_LOCK is held.
    let mut table = unsafe { mapper(pml4) };
    for index in 0..nr_pages {
        let page = Page::<Size4KiB>::containing_address(VirtAddr::new(base + index * PAGE_SIZE));
        let frame =
            PhysFrame::<Size4KiB>::containing_address(PhysAddr::new(first + index * PAGE_SIZE));
        // SAFETY: the page is fresh in the MMIO window (bump allocated); the
        // frame is device memory or RAM the caller owns for this mapping.
        unsafe {
            table.map_to_with_table_flags(
                page,
                frame,
                flags,
                PageTableFlags::PRESENT | PageTableFlags::WRITABLE,
                &mut TableFrames,
            )
        }
        .ok()?
        .flush();
    }
    Some(base)
}

/// Maps `nr_pages` fresh RAM frames (contiguous) with 4 KiB pages,
/// writable, NX and cached, into the MMIO window (a range no page source
/// spans): the KFENCE pool, whose pages [`set_present`] unmaps one by one.
/// Returns its virtual address; `None` if the window or the frames ran out.
///
/// # Panics
///
/// If called before `memory::init`.
pub fn map_kfence_pool(nr_pages: usize) -> Option<usize> {
    let phys = frame::alloc_contiguous(nr_pages)?.as_u64();
    let flags = PageTableFlags::PRESENT | PageTableFlags::WRITABLE | nx_flag();
    map_window(phys, nr_pages as u64, flags).map(|base| base as usize)
}

/// Makes the 4 KiB page at `page` (mapped by [`map_kfence_pool`]) present or
/// not, and flushes it from this CPU's TLB (as Linux KFENCE does: other
/// CPUs may see the old mapping until their next flush). False if the page
/// is not a 4 KiB mapping. Callable from the page-fault handler: it takes
/// no lock (the page's tables exist since [`map_kfence_pool`]; only its own
/// entry changes, one atomic store).
pub fn set_present(page: usize, present: bool) -> bool {
    let pml4 = kernel_pml4();
    if pml4 == 0 {
        return false;
    }
    let virt = VirtAddr::new(page as u64);
    let mut table_phys = pml4;
    let indices = [
        virt.p4_index(),
        virt.p3_index(),
        virt.p2_index(),
        virt.p1_index(),
    ];
    for (level, index) in indices.into_iter().enumerate() {
        // SAFETY: page tables live in RAM, reachable through the direct map.
        let table = unsafe { &mut *(phys_to_virt(table_phys) as *mut PageTable) };
        let entry = &mut table[index];
        if level == 3 {
            let mut flags = entry.flags();
            flags.set(PageTableFlags::PRESENT, present);
            let frame = entry.addr();
            entry.set_addr(frame, flags);
            x86_64::instructions::tlb::flush(virt);
            return true;
        }
        let flags = entry.flags();
        if !flags.contains(PageTableFlags::PRESENT) || flags.contains(PageTableFlags::HUGE_PAGE) {
            return false;
        }
        table_phys = entry.addr().as_u64();
    }
    false
}
