//! What the boot loader (QEMU's PVH option ROM) tells the kernel: the
//! `hvm_start_info` structure (Xen PVH ABI, version ≥ 1), copied into
//! kernel memory at boot so none of the loader's memory must be kept.

use core::sync::atomic::{AtomicBool, Ordering};

use spin::Once;

use crate::mm::layout::{kernel_image_phys, phys_to_virt};

const START_INFO_MAGIC: u32 = 0x336e_c578;
const MAX_REGIONS: usize = 128;
const MAX_MODULES: usize = 8;
const MAX_CMDLINE: usize = 4096;

/// Kind of a physical memory region (e820 types).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryKind {
    /// RAM the kernel may use (type 1).
    Usable,
    /// Reserved by the platform (type 2).
    Reserved,
    /// ACPI tables, reclaimable after they are read (type 3).
    AcpiReclaimable,
    /// ACPI non-volatile storage (type 4).
    AcpiNvs,
    /// Bad memory (type 5).
    Unusable,
    /// Any other type.
    Other(u32),
}

impl MemoryKind {
    fn from_e820(kind: u32) -> Self {
        match kind {
            1 => Self::Usable,
            2 => Self::Reserved,
            3 => Self::AcpiReclaimable,
            4 => Self::AcpiNvs,
            5 => Self::Unusable,
            other => Self::Other(other),
        }
    }

    /// RAM of any kind (usable or holding ACPI data): mapped in the direct map.
    pub fn is_ram(self) -> bool {
        matches!(self, Self::Usable | Self::AcpiReclaimable | Self::AcpiNvs)
    }
}

/// One entry of the physical memory map.
#[derive(Debug, Clone, Copy)]
pub struct MemoryRegion {
    /// First physical address.
    pub start: u64,
    /// Size in bytes.
    pub size: u64,
    /// What the region is.
    pub kind: MemoryKind,
}

impl MemoryRegion {
    /// One past the last physical address.
    pub fn end(&self) -> u64 {
        self.start.saturating_add(self.size)
    }
}

/// A boot module (`-initrd`): physical location and size.
#[derive(Debug, Clone, Copy)]
pub struct Module {
    /// Physical address of the first byte.
    pub start: u64,
    /// Size in bytes.
    pub size: u64,
}

/// Everything the kernel learned from the boot loader.
#[derive(Debug)]
pub struct BootInfo {
    /// The physical memory map, sorted by address.
    pub memmap: &'static [MemoryRegion],
    /// The kernel command line (`-append`).
    pub cmdline: &'static str,
    /// Physical address of the ACPI RSDP, if the loader passed one.
    pub rsdp: Option<u64>,
    /// Boot modules (the runner passes the kernel ELF itself, for symbols).
    pub modules: &'static [Module],
    /// Physical `[start, end)` of the kernel image (including .bss and the boot stack).
    pub kernel_phys: (u64, u64),
    /// Physical address of the loader's `hvm_start_info`.
    pub start_info_phys: u64,
}

impl BootInfo {
    /// The value of `key=value` on the command line.
    pub fn arg(&self, key: &str) -> Option<&'static str> {
        cmdline_arg(self.cmdline, key)
    }

    /// Whether the bare word `flag` (or `flag=...`) is on the command line.
    pub fn has_flag(&self, flag: &str) -> bool {
        self.cmdline
            .split_ascii_whitespace()
            .any(|word| word == flag || word.split_once('=').is_some_and(|(k, _)| k == flag))
    }

    /// Total bytes of usable RAM in the memory map.
    pub fn usable_bytes(&self) -> u64 {
        self.memmap
            .iter()
            .filter(|region| region.kind == MemoryKind::Usable)
            .map(|region| region.size)
            .sum()
    }
}

/// The value of `key=value` in a command line.
pub fn cmdline_arg<'a>(cmdline: &'a str, key: &str) -> Option<&'a str> {
    cmdline.split_ascii_whitespace().find_map(|word| {
        word.split_once('=')
            .filter(|(k, _)| *k == key)
            .map(|(_, value)| value)
    })
}

struct Storage {
    memmap: [MemoryRegion; MAX_REGIONS],
    modules: [Module; MAX_MODULES],
    cmdline: [u8; MAX_CMDLINE],
}

static mut STORAGE: Storage = Storage {
    memmap: [MemoryRegion {
        start: 0,
        size: 0,
        kind: MemoryKind::Reserved,
    }; MAX_REGIONS],
    modules: [Module { start: 0, size: 0 }; MAX_MODULES],
    cmdline: [0; MAX_CMDLINE],
};
static STORAGE_TAKEN: AtomicBool = AtomicBool::new(false);
static BOOT_INFO: Once<BootInfo> = Once::new();

/// The boot information (after `kernel_entry` has parsed it).
pub fn get() -> Option<&'static BootInfo> {
    BOOT_INFO.get()
}

/// Reads `T` from physical memory below 4 GiB (mapped by the boot page tables).
fn read_phys<T: Copy>(phys: u64) -> T {
    assert!(
        phys != 0 && phys + (size_of::<T>() as u64) <= 4 << 30,
        "boot info at {phys:#x} out of reach"
    );
    // SAFETY: the boot page tables map all of [0, 4 GiB) in the direct map;
    // the loader's structures stay intact until the frame allocator exists.
    unsafe { core::ptr::read_unaligned(phys_to_virt(phys) as *const T) }
}

#[repr(C)]
#[derive(Clone, Copy)]
struct StartInfo {
    magic: u32,
    version: u32,
    flags: u32,
    nr_modules: u32,
    modlist_paddr: u64,
    cmdline_paddr: u64,
    rsdp_paddr: u64,
    memmap_paddr: u64,
    memmap_entries: u32,
    reserved: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct ModlistEntry {
    paddr: u64,
    size: u64,
    cmdline_paddr: u64,
    reserved: u64,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct MemmapEntry {
    addr: u64,
    size: u64,
    kind: u32,
    reserved: u32,
}

/// Parses the PVH start info at `start_info_phys` (once, on the boot CPU).
pub(crate) fn init(start_info_phys: u64) -> &'static BootInfo {
    assert!(
        !STORAGE_TAKEN.swap(true, Ordering::AcqRel),
        "boot_info::init called twice"
    );
    // SAFETY: guarded by STORAGE_TAKEN: this is the only reference ever made to STORAGE.
    let storage: &'static mut Storage = unsafe { &mut *core::ptr::addr_of_mut!(STORAGE) };

    let info: StartInfo = read_phys(start_info_phys);
    if info.magic != START_INFO_MAGIC {
        panic!(
            "bad hvm_start_info magic {:#x} at {start_info_phys:#x}",
            info.magic
        );
    }
    if info.version < 1 {
        panic!("hvm_start_info version {} has no memory map", info.version);
    }

    let nr_regions = (info.memmap_entries as usize).min(MAX_REGIONS);
    for (index, region) in storage.memmap[..nr_regions].iter_mut().enumerate() {
        let entry: MemmapEntry =
            read_phys(info.memmap_paddr + (index * size_of::<MemmapEntry>()) as u64);
        *region = MemoryRegion {
            start: entry.addr,
            size: entry.size,
            kind: MemoryKind::from_e820(entry.kind),
        };
    }
    let memmap = &mut storage.memmap[..nr_regions];
    memmap.sort_unstable_by_key(|region| region.start);

    let nr_modules = (info.nr_modules as usize).min(MAX_MODULES);
    for (index, module) in storage.modules[..nr_modules].iter_mut().enumerate() {
        let entry: ModlistEntry =
            read_phys(info.modlist_paddr + (index * size_of::<ModlistEntry>()) as u64);
        *module = Module {
            start: entry.paddr,
            size: entry.size,
        };
    }

    let mut cmdline_len = 0;
    if info.cmdline_paddr != 0 {
        while cmdline_len < MAX_CMDLINE - 1 {
            let byte: u8 = read_phys(info.cmdline_paddr + cmdline_len as u64);
            if byte == 0 {
                break;
            }
            storage.cmdline[cmdline_len] = byte;
            cmdline_len += 1;
        }
    }
    let cmdline = core::str::from_utf8(&storage.cmdline[..cmdline_len])
        .unwrap_or("")
        .trim();

    let kernel_phys = kernel_image_phys();

    BOOT_INFO.call_once(|| BootInfo {
        memmap,
        cmdline,
        rsdp: (info.rsdp_paddr != 0).then_some(info.rsdp_paddr),
        modules: &storage.modules[..nr_modules],
        kernel_phys,
        start_info_phys,
    })
}
