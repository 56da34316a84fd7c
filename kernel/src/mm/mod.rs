//! Physical memory and the address space, the bottom layer: it imports
//! nothing of the crate outside this folder.
//!
//! * [`layout`]: where the direct map, the MMIO window and the kernel image
//!   are (constants and linker-script symbols);
//! * [`boot_info`]: what the PVH loader reported (memory map, modules,
//!   command line), copied into kernel memory;
//! * [`reserved`]: physical ranges the firmware uses (the ACPI tables,
//!   recorded by `arch::acpi`) that must stay reserved and mapped;
//! * [`frame`]: the bitmap frame allocator;
//! * [`paging`]: the kernel's page tables, the direct map, MMIO mappings.

pub mod boot_info;
pub mod frame;
pub mod layout;
pub mod paging;
pub mod reserved;
