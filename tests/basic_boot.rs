//! Boots the kernel and checks what it learned at boot: memory map, frames,
//! direct map, per-CPU data, symbols and backtraces.

#![no_std]
#![no_main]
#![feature(custom_test_frameworks)]
#![test_runner(magpie::test_runner)]
#![reexport_test_harness_main = "test_main"]
#![allow(
    missing_docs,
    clippy::missing_panics_doc,
    reason = "#[test_case] functions are named for what they check and fail by panicking"
)]

use magpie::boot_info::MemoryKind;
use magpie::{BootInfo, arch, frame, memory, println, symbols};

extern crate alloc;
use alloc::format;

magpie::test_kernel!();

fn boot() -> &'static BootInfo {
    magpie::boot_info::get().expect("booted")
}

#[test_case]
fn println_works() {
    println!("println from a test kernel");
}

#[test_case]
fn memory_map_is_sane() {
    let boot = boot();
    assert!(!boot.memmap.is_empty());
    assert!(
        boot.memmap
            .iter()
            .any(|region| region.kind == MemoryKind::Usable)
    );
    assert!(
        boot.usable_bytes() > 64 << 20,
        "usable RAM: {} bytes",
        boot.usable_bytes()
    );
    assert!(boot.rsdp.is_some(), "QEMU's PVH loader passes the RSDP");
    assert_eq!(
        boot.modules.len(),
        1,
        "the runner passes the kernel ELF as a module"
    );
}

#[test_case]
fn frame_allocator_has_most_of_ram() {
    let stats = frame::stats();
    assert!(stats.nr_total * frame::PAGE_SIZE > 128 << 20, "{stats:?}");
    assert!(stats.nr_free <= stats.nr_total);
}

#[test_case]
fn frames_allocate_free_and_reuse() {
    let before = frame::stats();
    let one = frame::alloc_contiguous(1).expect("one frame");
    let run = frame::alloc_contiguous(33).expect("33 contiguous frames");
    let aligned = frame::alloc_aligned(16, 16).expect("16 aligned frames");
    assert!(aligned.is_aligned(16 * frame::PAGE_SIZE as u64));
    assert!(
        run.as_u64() >= one.as_u64() + frame::PAGE_SIZE as u64
            || run.as_u64() + 33 * 4096 <= one.as_u64()
    );
    // Write through the direct map: the frames are RAM and mapped.
    let virt = memory::phys_to_virt(run.as_u64()) as *mut u8;
    // SAFETY: the 33 frames were just allocated to this test.
    unsafe { core::ptr::write_bytes(virt, 0xa5, 33 * frame::PAGE_SIZE) };
    assert_eq!(memory::virt_to_phys(virt as usize), Some(run.as_u64()));
    assert_eq!(frame::stats().nr_free, before.nr_free - 1 - 33 - 16);
    frame::free(run, 33);
    frame::free(one, 1);
    frame::free(aligned, 16);
    assert_eq!(frame::stats().nr_free, before.nr_free);
    assert_eq!(
        frame::alloc_contiguous(1),
        Some(one),
        "lowest free frame is reused first"
    );
    frame::free(one, 1);
    assert!(frame::stats().nr_allocs_ever >= before.nr_allocs_ever + 4);
}

#[test_case]
fn direct_map_covers_all_ram() {
    let (start, end) = memory::direct_map_span();
    assert_eq!(start as u64, memory::DIRECT_MAP_BASE);
    for region in boot()
        .memmap
        .iter()
        .filter(|region| region.kind == MemoryKind::Usable)
    {
        assert!(memory::phys_to_virt(region.end() - 1) < end);
        assert!(memory::is_readable(
            memory::phys_to_virt(region.end() - 8),
            8
        ));
    }
}

#[test_case]
fn per_cpu_and_clock() {
    assert_eq!(arch::cpu_id(), 0);
    assert_eq!(arch::this_cpu().cpu_id(), 0);
    assert!(arch::max_cpus() >= 1);
    let first = arch::rdtsc();
    assert!(arch::rdtsc() > first);
    let flags = arch::irq_save();
    assert!(!arch::irqs_enabled());
    arch::irq_restore(flags);
}

#[inline(never)]
fn capture(out: &mut [usize]) -> usize {
    // Not a tail call: keeps this frame on the stack.
    core::hint::black_box(symbols::backtrace(out))
}

#[test_case]
#[inline(never)]
fn backtrace_is_symbolized() {
    assert!(symbols::available());
    let mut trace = [0usize; 16];
    let depth = capture(&mut trace);
    assert!(depth >= 3, "depth {depth}");
    let (name, offset) = symbols::lookup(trace[0]).expect("innermost frame has a symbol");
    let demangled = format!("{}", symbols::demangled(name));
    assert_eq!(demangled, "basic_boot::capture");
    assert!(offset > 0);
    let caller = format!("{}", symbols::Symbolized(trace[1]));
    assert!(
        caller.starts_with("basic_boot::backtrace_is_symbolized+0x"),
        "{caller}"
    );
    let entry =
        symbols::address_of("magpie::kernel_entry").or_else(|| symbols::address_of("kernel_entry"));
    assert_eq!(entry, Some(magpie::kernel_entry as *const () as usize));
    println!("{}", symbols::Symbolized(trace[0]));
}

#[test_case]
fn mmio_mapping_reads_the_local_apic() {
    let lapic = arch::acpi::info().map_or(0xfee0_0000, |info| info.lapic_phys);
    let registers = memory::map_mmio(lapic, 4096).expect("map LAPIC");
    // SAFETY: the LAPIC register page was just mapped uncached; offset 0x30 is its version register.
    let version = unsafe { core::ptr::read_volatile((registers.as_u64() + 0x30) as *const u32) };
    assert_ne!(
        version & 0xff,
        0,
        "LAPIC version register reads {version:#x}"
    );
}
