//! Magpie: the kernel that hosts and demonstrates the `magpie-slab` allocator.
//!
//! # Layers
//!
//! ```text
//!  kmain (src/main.rs or a test)       shell, tests
//!  ───────────────────────────────────────────────────────────────
//!  heap (GlobalAlloc shim)  symbols  console/klog  testing  qemu
//!  frame (bitmap frame allocator)  memory (page tables, direct map)
//!  boot_info (PVH start info)      arch (GDT/TSS/IDT, per-CPU, ACPI)
//!  ───────────────────────────────────────────────────────────────
//!  boot/entry.S: PVH note, 32-bit entry, long mode  →  kernel_entry
//! ```
//!
//! Boot order in [`kernel_entry`]: serial console → bootstrap heap → per-CPU
//! data (GS base) → GDT/TSS/IDT → PVH start info → ACPI (CPU count, table
//! ranges) → frame allocator → memory check ([`min_free_bytes`]) → final
//! page tables (direct map) → symbols → slab allocator ([`kmem`]) →
//! [`tracing::event_stream`] (`kmemtrace=on`) → application processors ([`smp`]) →
//! `kmain`.
//!
//! # FAQ
//!
//! * *Why does the kernel read its own ELF?* The runner passes the kernel
//!   ELF (a copy without DWARF, so it stays small) as the PVH module
//!   (`-initrd`), and [`debug::symbols`] reads `.symtab` from it, so backtraces are
//!   symbolized inside the kernel with no post-link step.
//! * *Why not `uart_16550`?* Its `init` writes the FIFO control register,
//!   which makes QEMU drop input that is already queued (piped stdin). The
//!   16550 driver in [`dev::console`] is twenty lines and never touches FCR.
//! * *Why `acpi` 5.2 and not 6.x?* 6.x's handler trait asks for some
//!   twenty AML, I/O and PCI hooks; 5.2's is map/unmap, and its MADT parser
//!   is all the kernel needs (see [`arch::acpi`]).
//!
//! # Adding a kernel (binary or test)
//!
//! Define `kmain` with [`entry_point!`] and a `#[panic_handler]` (see
//! `tests/basic_boot.rs`).

#![no_std]
#![feature(abi_x86_interrupt)]
#![feature(allocator_api)]

extern crate alloc;

pub mod arch;
pub mod debug;
pub mod dev;
pub mod kmem;
pub mod mm;
pub mod profiling;
pub mod shell;
pub mod smp;
pub mod testing;
pub mod tracing;

pub use arch::halt_loop;
pub use dev::qemu::{QemuExitCode, exit_qemu};
/// The code-tag crate, for the exported macros (`kmalloc!`, `alloc_fault!`,
/// `alloc_tag_scope!` ...) to name as `$crate::magpie_codetag`.
#[doc(hidden)]
pub use magpie_codetag;
pub use mm::boot_info::BootInfo;
pub use testing::{test_panic_handler, test_runner};

core::arch::global_asm!(include_str!("../../boot/entry.S"), options(att_syntax));

unsafe extern "Rust" {
    /// The kernel's main function, defined by the binary or test with
    /// [`entry_point!`].
    safe fn kmain(boot: &'static BootInfo) -> !;
}

/// Rust entry point, called by `boot/entry.S` in long mode on the boot stack
/// with the physical address of the PVH `hvm_start_info`.
#[unsafe(no_mangle)]
pub extern "C" fn kernel_entry(start_info_phys: u64) -> ! {
    dev::console::init();
    kmem::heap::init();
    arch::idt::set_reporter(debug::panic::EXCEPTION_REPORTER);
    arch::init_bsp();
    let boot = mm::boot_info::init(start_info_phys);
    dev::klog::init(boot.cmdline);
    arch::acpi::init(boot.rsdp);
    arch::tsc::calibrate();
    mm::frame::init(boot);
    check_memory(boot);
    mm::paging::init(boot);
    debug::symbols::init(boot);
    kmem::init(boot.cmdline);
    tracing::event_stream::init(boot);
    debug::fault::init();
    smp::init();
    log::debug!(
        "{} MiB usable, {} CPUs, cmdline {:?}",
        mm::frame::stats().nr_total * mm::frame::PAGE_SIZE / (1024 * 1024),
        arch::max_cpus(),
        boot.cmdline
    );
    kmain(boot)
}

/// Free memory the kernel needs once its image and boot modules are in
/// place, in bytes: 2 MiB for the slab allocator's start (page map,
/// metadata caches, allocation-profiling counters) and the shell's work,
/// and per CPU 256 KiB (its 128 KiB kernel stack, GDT, TSS, double-fault
/// stack and magazines).
pub fn min_free_bytes(nr_cpus: usize) -> usize {
    (2 << 20) + nr_cpus * (256 << 10)
}

/// Stops the boot with a clear message, through `isa-debug-exit` with
/// failure, when there is less free memory than [`min_free_bytes`]:
/// rather than a panic (or a triple fault) somewhere later in the boot.
fn check_memory(boot: &BootInfo) {
    let nr_cpus = arch::max_cpus();
    let need = min_free_bytes(nr_cpus);
    let free = mm::frame::stats().nr_free * mm::frame::PAGE_SIZE;
    if free >= need {
        return;
    }
    let usable = boot.usable_bytes() as usize;
    println!(
        "error: too little memory: found {} KiB of usable RAM, {} KiB of it free after the \
         kernel image and boot modules; the kernel needs {} KiB free with {nr_cpus} CPU(s), \
         so about {} MiB of RAM at least",
        usable >> 10,
        free >> 10,
        need >> 10,
        (usable - free + need).div_ceil(1 << 20),
    );
    exit_qemu(QemuExitCode::Failed)
}

/// Defines the kernel's `kmain` from a function `fn(&'static BootInfo) -> !`.
///
/// ```ignore
/// magpie::entry_point!(main);
/// fn main(boot: &'static magpie::BootInfo) -> ! { ... }
/// ```
#[macro_export]
macro_rules! entry_point {
    ($path:path) => {
        #[unsafe(export_name = "kmain")]
        fn __magpie_kmain(boot: &'static $crate::BootInfo) -> ! {
            let f: fn(&'static $crate::BootInfo) -> ! = $path;
            f(boot)
        }
    };
}
