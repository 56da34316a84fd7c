//! The processors and the local APIC address, from the ACPI MADT read with
//! the `acpi` crate (RSDP → RSDT/XSDT → MADT).
//!
//! Runs before the frame allocator, through the boot direct map (all
//! physical memory below 4 GiB). It also records where the tables are: the
//! PVH memory map comes from QEMU's raw e820 and may list the ACPI tables
//! the firmware placed at the top of RAM as usable, so every table read is
//! recorded in [`crate::mm::reserved`]: the frame allocator reserves those
//! ranges and the page tables keep them mapped.
//!
//! `acpi` 5.2 is used rather than 6.x: its handler trait is two functions
//! (map and unmap a physical region), where 6.x asks for some twenty AML,
//! I/O and PCI hooks this kernel has no use for. Only the table parsing is
//! used (`default-features = false`: no allocator, no AML).

use core::ptr::NonNull;

use acpi::address::AddressSpace;
use acpi::fadt::Fadt;
use acpi::madt::{Madt, MadtEntry};
use acpi::sdt::SdtHeader;
use acpi::{AcpiHandler, AcpiTables, PhysicalMapping};
use spin::Once;

use crate::mm::layout::phys_to_virt;
use crate::mm::reserved;

/// What the MADT says about the machine.
#[derive(Debug, Clone, Copy)]
pub struct AcpiInfo {
    /// Enabled or online-capable processors.
    pub nr_cpus: usize,
    /// Their local APIC ids (the first `min(nr_cpus, MAX_CPUS)`), in MADT
    /// order; the boot CPU is not necessarily first.
    pub apic_ids: [u32; super::MAX_CPUS],
    /// Physical address of the local APIC registers.
    pub lapic_phys: u64,
}

impl AcpiInfo {
    /// The local APIC ids of the processors the kernel can use.
    pub fn apic_ids(&self) -> &[u32] {
        &self.apic_ids[..self.nr_cpus.min(super::MAX_CPUS)]
    }
}

/// The ACPI power-management timer (FADT `PM_TMR_BLK`): a free-running
/// counter at [`PM_TIMER_HZ`] in an I/O port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PmTimer {
    /// The I/O port of the counter (a 32-bit read).
    pub port: u16,
    /// Whether the counter has 32 bits (FADT flag `TMR_VAL_EXT`); else 24.
    pub is_32_bit: bool,
}

/// The PM timer's rate in Hz (ACPI 6.5 §4.8.3.3: 3.579545 MHz).
pub const PM_TIMER_HZ: u64 = 3_579_545;

static INFO: Once<AcpiInfo> = Once::new();
static PM_TIMER: Once<PmTimer> = Once::new();
/// Physical memory the boot page tables map (the handler refuses anything above).
const BOOT_MAPPED_LIMIT: u64 = 4 << 30;
/// `size_of::<SdtHeader>()`: the `acpi` crate maps a table's header first.
const SDT_HEADER_SIZE: usize = 36;
const _: () = assert!(core::mem::size_of::<SdtHeader>() == SDT_HEADER_SIZE);

/// The MADT summary, if one was found.
pub fn info() -> Option<&'static AcpiInfo> {
    INFO.get()
}

/// The PM timer the FADT describes, if it has one in I/O space.
pub fn pm_timer() -> Option<PmTimer> {
    PM_TIMER.get().copied()
}

/// Processors reported by the MADT (1 if there was none).
pub fn nr_cpus() -> usize {
    INFO.get().map_or(1, |info| info.nr_cpus.max(1))
}

/// The `acpi` crate's window on physical memory: the boot direct map.
///
/// Every region it maps is recorded in [`crate::mm::reserved`]; a table header
/// is recorded with the whole table's length, so every table the crate
/// looks at (not only those it reads in full) stays reserved and mapped.
#[derive(Clone, Copy)]
struct DirectMapHandler;

impl AcpiHandler for DirectMapHandler {
    unsafe fn map_physical_region<T>(
        &self,
        physical_address: usize,
        size: usize,
    ) -> PhysicalMapping<Self, T> {
        let phys = physical_address as u64;
        assert!(
            phys != 0 && phys.saturating_add(size as u64) <= BOOT_MAPPED_LIMIT,
            "acpi: table at {phys:#x} (+{size:#x}) is outside the boot direct map"
        );
        let mut len = size as u64;
        if size == SDT_HEADER_SIZE && core::any::type_name::<T>().ends_with("SdtHeader") {
            // SAFETY: per the trait contract a valid SdtHeader lies at
            // `phys`, inside the boot direct map (checked above); its length
            // field is at offset 4.
            let table_len =
                unsafe { core::ptr::read_unaligned((phys_to_virt(phys) + 4) as *const u32) };
            if (SDT_HEADER_SIZE as u32..=1 << 20).contains(&table_len) {
                len = u64::from(table_len);
            }
        }
        reserved::add(phys, len);
        let virt =
            NonNull::new(phys_to_virt(phys) as *mut T).expect("direct map address is not null");
        // SAFETY: `virt` is the direct-map alias of `phys`, which the boot
        // page tables map (below 4 GiB, checked above); ACPI tables are never
        // freed, and nothing unmaps the direct map.
        unsafe { PhysicalMapping::new(physical_address, virt, size, size, *self) }
    }

    fn unmap_physical_region<T>(_region: &PhysicalMapping<Self, T>) {
        // The direct map stays.
    }
}

/// Parses the ACPI tables from the RSDP (from the PVH start info, or found
/// in the BIOS area). Leaves a warning and defaults if anything is missing.
pub(crate) fn init(rsdp: Option<u64>) {
    let tables = match rsdp {
        // SAFETY: the RSDP address comes from the boot protocol; the
        // handler maps any physical address below 4 GiB (and refuses others).
        Some(rsdp) => unsafe { AcpiTables::from_rsdp(DirectMapHandler, rsdp as usize) },
        // SAFETY: QEMU boots through SeaBIOS, so the BIOS areas the search
        // reads (EBDA, 0xe0000..0x100000) exist and lie in the boot direct map.
        None => unsafe { AcpiTables::search_for_rsdp_bios(DirectMapHandler) },
    };
    let tables = match tables {
        Ok(tables) => tables,
        Err(error) => {
            log::warn!("no usable ACPI tables (RSDP {rsdp:x?}: {error:?}); assuming 1 CPU");
            return;
        }
    };
    // Look at every table once, so each one's range is recorded.
    let nr_tables = tables.headers().count();
    match parse_pm_timer(&tables) {
        Some(timer) => {
            log::debug!(
                "ACPI PM timer at port {:#x}, {} bits",
                timer.port,
                if timer.is_32_bit { 32 } else { 24 }
            );
            PM_TIMER.call_once(|| timer);
        }
        None => log::debug!("no ACPI PM timer in I/O space"),
    }
    match parse_madt(&tables) {
        Some(info) => {
            log::debug!(
                "{} CPUs (APIC ids {:?}), LAPIC at {:#x}, {} ACPI tables",
                info.nr_cpus,
                info.apic_ids(),
                info.lapic_phys,
                nr_tables
            );
            INFO.call_once(|| info);
        }
        None => log::warn!("no usable MADT; assuming 1 CPU"),
    }
}

fn parse_pm_timer(tables: &AcpiTables<DirectMapHandler>) -> Option<PmTimer> {
    let fadt = tables.find_table::<Fadt>().ok()?;
    let block = fadt.pm_timer_block().ok()??;
    let port = u16::try_from(block.address).ok()?;
    (block.address_space == AddressSpace::SystemIo && port != 0).then_some(PmTimer {
        port,
        is_32_bit: { fadt.flags }.pm_timer_is_32_bit(),
    })
}

fn parse_madt(tables: &AcpiTables<DirectMapHandler>) -> Option<AcpiInfo> {
    let madt = tables.find_table::<Madt>().ok()?;
    let madt = madt.get();
    let mut info = AcpiInfo {
        nr_cpus: 0,
        apic_ids: [0; super::MAX_CPUS],
        lapic_phys: u64::from(madt.local_apic_address),
    };
    // Flags bit 0: enabled; bit 1: online capable.
    const USABLE: u32 = 0b11;
    for entry in madt.entries() {
        let apic_id = match entry {
            MadtEntry::LocalApic(entry) => {
                ({ entry.flags } & USABLE != 0).then_some(u32::from(entry.apic_id))
            }
            MadtEntry::LocalX2Apic(entry) => {
                ({ entry.flags } & USABLE != 0).then_some(entry.x2apic_id)
            }
            MadtEntry::LocalApicAddressOverride(entry) => {
                info.lapic_phys = entry.local_apic_address;
                None
            }
            _ => None,
        };
        if let Some(apic_id) = apic_id {
            if info.nr_cpus < super::MAX_CPUS {
                info.apic_ids[info.nr_cpus] = apic_id;
            }
            info.nr_cpus += 1;
        }
    }
    (info.nr_cpus > 0).then_some(info)
}
