//! Just enough ACPI to count processors: RSDP → RSDT/XSDT → MADT.
//!
//! Runs before the frame allocator, through the boot direct map (all
//! physical memory below 4 GiB). It also records where the tables are: the
//! PVH memory map comes from QEMU's raw e820 and may list the ACPI tables
//! the firmware placed at the top of RAM as usable, so [`crate::frame`]
//! reserves [`table_ranges`].

use core::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use spin::Once;

use crate::memory::phys_to_virt;

/// What the MADT says about the machine.
#[derive(Debug, Clone, Copy)]
pub struct AcpiInfo {
    /// Enabled or online-capable processors.
    pub nr_cpus: usize,
    /// Their local APIC ids (the first `min(nr_cpus, MAX_CPUS)`).
    pub apic_ids: [u32; super::MAX_CPUS],
    /// Physical address of the local APIC registers.
    pub lapic_phys: u64,
}

const MAX_TABLES: usize = 64;
static INFO: Once<AcpiInfo> = Once::new();
static RANGES: [(AtomicU64, AtomicU64); MAX_TABLES] =
    [const { (AtomicU64::new(0), AtomicU64::new(0)) }; MAX_TABLES];
static NR_RANGES: AtomicUsize = AtomicUsize::new(0);
/// Physical memory the boot page tables map (the parser refuses anything above).
const BOOT_MAPPED_LIMIT: u64 = 4 << 30;

fn record(start: u64, len: u64) {
    let index = NR_RANGES.fetch_add(1, Ordering::Relaxed);
    if index < MAX_TABLES {
        RANGES[index].0.store(start, Ordering::Relaxed);
        RANGES[index].1.store(start + len, Ordering::Relaxed);
    }
}

/// Physical `[start, end)` ranges of the ACPI tables read at boot.
pub fn table_ranges() -> impl Iterator<Item = (u64, u64)> {
    let nr = NR_RANGES.load(Ordering::Relaxed).min(MAX_TABLES);
    RANGES[..nr]
        .iter()
        .map(|(start, end)| (start.load(Ordering::Relaxed), end.load(Ordering::Relaxed)))
}

/// The MADT summary, if one was found.
pub fn info() -> Option<&'static AcpiInfo> {
    INFO.get()
}

/// Processors reported by the MADT (1 if there was none).
pub fn nr_cpus() -> usize {
    INFO.get().map_or(1, |info| info.nr_cpus.max(1))
}

fn read_bytes(phys: u64, len: usize) -> Option<&'static [u8]> {
    if phys == 0 || phys.checked_add(len as u64)? > BOOT_MAPPED_LIMIT {
        return None;
    }
    // SAFETY: [phys, phys+len) lies below 4 GiB, which the boot page tables
    // map in the direct map (acpi::init runs before memory::init replaces
    // them); ACPI tables are never freed.
    Some(unsafe { core::slice::from_raw_parts(phys_to_virt(phys) as *const u8, len) })
}

fn u32_at(bytes: &[u8], offset: usize) -> u32 {
    u32::from_le_bytes(bytes[offset..offset + 4].try_into().unwrap())
}

fn u64_at(bytes: &[u8], offset: usize) -> u64 {
    u64::from_le_bytes(bytes[offset..offset + 8].try_into().unwrap())
}

fn checksum_ok(bytes: &[u8]) -> bool {
    bytes.iter().fold(0u8, |sum, &byte| sum.wrapping_add(byte)) == 0
}

/// Reads a whole SDT (header + body) at `phys`, if its checksum is right.
fn sdt(phys: u64) -> Option<&'static [u8]> {
    let header = read_bytes(phys, 36)?;
    let length = u32_at(header, 4) as usize;
    if !(36..=1 << 20).contains(&length) {
        return None;
    }
    let table = read_bytes(phys, length)?;
    checksum_ok(table).then_some(table)
}

fn find_rsdp_in_bios_area() -> Option<u64> {
    let area = read_bytes(0xe0000, 0x20000)?;
    (0..area.len() - 20)
        .step_by(16)
        .find(|&offset| &area[offset..offset + 8] == b"RSD PTR ")
        .map(|offset| 0xe0000 + offset as u64)
}

/// Parses the ACPI tables from the RSDP (from the PVH start info, or found
/// in the BIOS area). Leaves a warning and defaults if anything is missing.
pub(crate) fn init(rsdp: Option<u64>) {
    let Some(rsdp) = rsdp.or_else(find_rsdp_in_bios_area) else {
        log::warn!("no RSDP; assuming 1 CPU");
        return;
    };
    match parse(rsdp) {
        Some(info) => {
            log::debug!("{} CPUs, LAPIC at {:#x}", info.nr_cpus, info.lapic_phys);
            INFO.call_once(|| info);
        }
        None => log::warn!("no usable MADT (RSDP at {rsdp:#x}); assuming 1 CPU"),
    }
}

fn parse(rsdp_phys: u64) -> Option<AcpiInfo> {
    let rsdp = read_bytes(rsdp_phys, 20)?;
    if &rsdp[..8] != b"RSD PTR " || !checksum_ok(rsdp) {
        return None;
    }
    let revision = rsdp[15];
    record(rsdp_phys, 36);
    let (root, entry_size) = if revision >= 2 {
        let rsdp_v2 = read_bytes(rsdp_phys, 36)?;
        (u64_at(rsdp_v2, 24), 8)
    } else {
        (u64::from(u32_at(rsdp, 16)), 4)
    };
    let root_table = sdt(root)?;
    record(root, root_table.len() as u64);
    let mut madt = None;
    for offset in (36..root_table.len()).step_by(entry_size) {
        if offset + entry_size > root_table.len() {
            break;
        }
        let table_phys = if entry_size == 8 {
            u64_at(root_table, offset)
        } else {
            u64::from(u32_at(root_table, offset))
        };
        if let Some(table) = sdt(table_phys) {
            record(table_phys, table.len() as u64);
            if &table[..4] == b"APIC" {
                madt = Some(table);
            }
        }
    }
    let madt = madt?;
    let mut info = AcpiInfo {
        nr_cpus: 0,
        apic_ids: [0; super::MAX_CPUS],
        lapic_phys: u64::from(u32_at(madt, 36)),
    };
    let mut offset = 44;
    while offset + 2 <= madt.len() {
        let (kind, length) = (madt[offset], madt[offset + 1] as usize);
        if length < 2 || offset + length > madt.len() {
            break;
        }
        let entry = &madt[offset..offset + length];
        // Flags bit 0: enabled; bit 1: online capable.
        let apic = match kind {
            0 if length >= 8 => (u32_at(entry, 4) & 3 != 0).then(|| u32::from(entry[3])),
            9 if length >= 16 => (u32_at(entry, 8) & 3 != 0).then(|| u32_at(entry, 4)),
            5 if length >= 12 => {
                info.lapic_phys = u64_at(entry, 4);
                None
            }
            _ => None,
        };
        if let Some(apic_id) = apic {
            if info.nr_cpus < super::MAX_CPUS {
                info.apic_ids[info.nr_cpus] = apic_id;
            }
            info.nr_cpus += 1;
        }
        offset += length;
    }
    (info.nr_cpus > 0).then_some(info)
}
