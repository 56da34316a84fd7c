//! Magpie: the kernel that hosts and demonstrates the `magpie-slab` allocator.
//!
//! # Layout
//!
//! `kernel/src` is in folders by concern. Each layer imports only the ones
//! below it (`tools/import_circles.py kernel/src`: no circle); where a low
//! layer needs code from above (an exception report, the wake IPI's work,
//! the slab reap when the page arena runs dry) it is registered at boot
//! (`kernel_entry`, `kmem::init`, `smp::init`), not imported.
//!
//! | folder | what it holds | may import |
//! |---|---|---|
//! | [`mm`] | the virtual layout, the PVH boot info (memory map, modules, command line), the frame allocator, page tables and MMIO, firmware-reserved ranges | nothing outside `mm/` |
//! | [`arch`] | x86_64: GDT/TSS, IDT and exception entry, per-CPU data (GS), the interrupt flag, TSC, ACPI, LAPIC, AP trampoline | `mm` |
//! | [`dev`] | the 16550 console and `print!`, the `log` backend, QEMU's exit device, the virtio console | `arch`, `mm` |
//! | [`debug`] | symbols and backtraces, panic and exception reports, slab-debug boot arguments and report hook, fault-injection glue, lkdtm | `arch`, `mm`, `dev`; lkdtm also `kmem` |
//! | [`tracing`] | per-CPU context strings, the allocation call-site walks, the kmemtrace event stream (boot arguments, clock, dump) | `arch`, `debug::symbols`; `event_stream` also `kmem`, `dev`, `mm` |
//! | [`profiling`] | allocation tags (counters, switch, charge hooks, scopes), context capture, the allocation macros and `TaggedAlloc`, code tags on page frames (`alloc_pages!`, `kpages_alloc!`) | `alloc_tag`, `capture`: `arch`, `mm`, `tracing`; `tagged`: `kmem`, `debug::fault` |
//! | [`smp`] | AP bring-up, mailboxes, cross-CPU calls; the stress engine | `arch`, `mm`, `tracing`; `stress` also `kmem` |
//! | [`kmem`] | the slab allocator `SLAB` and its start, `KernelPlatform`, the `kpages` arena, the `#[global_allocator]` shim | the hooks below: `arch`, `mm`, `smp`, `tracing`, `profiling::alloc_tag`, `debug::slab_debug` |
//! | [`shell`] | the command table, line editor and one file per command area | anything |
//! | root | `kernel_entry` (boot order, registrations), [`testing`] (the QEMU test framework) | anything |
//!
//! From the bottom up, file by file: `mm` → `arch` → `dev` →
//! `debug::symbols` → `tracing::{context, call_site}`, `smp`,
//! `profiling::{capture, alloc_tag}` → `kmem::{platform, kpages}` →
//! `kmem` (`SLAB`) → what allocates through `SLAB` by name (`kmem::heap`,
//! `profiling::tagged`, `tracing::event_stream`, `debug::lkdtm`,
//! `smp::stress`) → `shell` → `kmain`.
//!
//! `KernelPlatform` is the whole `magpie_slab::Platform` implementation and
//! every hook in it is a call down: nothing it calls touches `SLAB`.
//!
//! # Boot order
//!
//! In [`kernel_entry`]: serial console → bootstrap heap → exception
//! reporter → per-CPU data (GS base) → GDT/TSS/IDT → PVH start info → ACPI
//! (CPU count, table ranges) → frame allocator → memory check
//! ([`min_free_bytes`]) → final page tables (direct map) → symbols → slab
//! allocator ([`kmem::init`]) → KFENCE ([`debug::kfence::init`]) → kmemtrace ([`tracing::event_stream`],
//! `kmemtrace=on`) → fault injection → application processors
//! ([`smp::init`]) → `kmain`.
//!
//! # Two things named kmemtrace
//!
//! The shell's `kmemtrace` command reaches two mechanisms, named apart in
//! the code: the per-cache **trace table** of outstanding objects (Akaros
//! `kmem_trace`: `kmemtrace start|stop|print|reset`,
//! `shell/kmemtrace/trace_table.rs`) and the **event stream** of every
//! alloc and free (Linux kmemtrace: `kmemtrace record ...` and
//! `kmemtrace dump`, `shell/kmemtrace/event_stream.rs` over
//! [`tracing::event_stream`]).
//!
//! # FAQ
//!
//! * *Why does the kernel read its own ELF?* The runner passes the kernel
//!   ELF (a copy without DWARF, so it stays small) as the PVH module
//!   (`-initrd`), and [`debug::symbols`] reads `.symtab` from it, so
//!   backtraces are symbolized inside the kernel with no post-link step.
//! * *Why not `uart_16550`?* Its `init` writes the FIFO control register,
//!   which makes QEMU drop input that is already queued (piped stdin). The
//!   16550 driver in [`dev::console`] is twenty lines and never touches FCR.
//! * *Why `acpi` 5.2 and not 6.x?* 6.x's handler trait asks for some
//!   twenty AML, I/O and PCI hooks; 5.2's is map/unmap, and its MADT parser
//!   is all the kernel needs (see [`arch::acpi`]).
//! * *Why registration instead of a call?* A call from `arch/` into the
//!   console or `smp` would make the bottom layer depend on the top one
//!   (and on everything those import); a function pointer set once at
//!   boot keeps the arrows pointing down at the cost of one indirect call
//!   on paths that are already slow (an exception, an IPI, an empty page
//!   arena).
//!
//! # Adding a kernel (binary or test)
//!
//! A test kernel: the crate attributes and `magpie::test_kernel!();` (see
//! [`testing`]). Any other kernel: define `kmain` with [`entry_point!`]
//! and a `#[panic_handler]` (see `tests/should_panic.rs`).

#![no_std]
#![feature(abi_x86_interrupt)]
#![feature(allocator_api, try_with_capacity)]

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
    // KFENCE (`kfence.sample_interval=MS`, on by default): the guarded
    // pool, its report hook and the page-fault handler, once the slab
    // allocator is up (called here, not from kmem: debug/ builds on kmem).
    debug::kfence::init(boot.cmdline);
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
    // The RAM the machine was given (QEMU `-m`) is where its highest RAM
    // region ends: the low MiB's holes and the firmware's tables count
    // towards it but not towards `usable`, so an estimate from `usable`
    // (8.5 MiB of 9) named a size that did not boot.
    let ram_end = boot
        .memmap
        .iter()
        .filter(|region| region.kind.is_ram())
        .map(|region| region.end())
        .max()
        .unwrap_or(usable as u64) as usize;
    println!(
        "error: too little memory: found {} KiB of usable RAM, {} KiB of it free after the \
         kernel image and boot modules; the kernel needs {} KiB free with {nr_cpus} CPU(s), \
         so about {} MiB of RAM at least",
        usable >> 10,
        free >> 10,
        need >> 10,
        (ram_end.max(usable) - free + need).div_ceil(1 << 20),
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
