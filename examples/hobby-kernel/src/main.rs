//! A one-CPU hobby kernel adopting magpie-slab, as an adopter writes it:
//! the shipped glue (`Heap`, `X86_64`: one CPU, with restartable hits
//! since no interrupt handler allocates), a 100 KiB heap, the heap tests
//! of "Writing an OS in Rust". Booted by Magpie's PVH path (QEMU
//! `-kernel`: `cargo run -p magpie-hobby-kernel`, `make test-example`);
//! output on COM1, result through QEMU's isa-debug-exit.

#![no_std]
#![no_main]

extern crate alloc;

use alloc::boxed::Box;
use alloc::collections::BTreeMap;
use alloc::vec::Vec;
use core::fmt::Write;
use core::hint::black_box;

use magpie_slab::PageSource;
use magpie_slab::glue::{Heap, X86_64};

/// `println!` to COM1.
macro_rules! println {
    ($($arg:tt)*) => {{ let _ = writeln!(Com1, $($arg)*); }};
}

// Magpie's PVH entry: long mode, the image mapped, a stack; calls kernel_entry.
core::arch::global_asm!(include_str!("../../../boot/entry.S"), options(att_syntax));

#[cfg(feature = "count")]
mod count;

// ---- The adopter's glue: these lines and the init_region call. ----
// (Feature `count` wraps it: src/count.rs's global allocator.)
#[cfg_attr(not(feature = "count"), global_allocator)]
static HEAP: Heap<X86_64<Hobby>> = Heap::new();

/// This kernel for the shipped platform: one CPU, and restartable hits
/// (magpie-slab feature `nightly`), which it may have because no
/// interrupt handler of it runs allocator code (it takes none).
struct Hobby;
// SAFETY: no hooks (the defaults).
unsafe impl magpie_slab::PlatformHooks for Hobby {}
// SAFETY: no allocation tags (the defaults).
unsafe impl magpie_slab::AllocTagHooks for Hobby {}
// SAFETY: one CPU; no interrupt handler allocates or frees (promise 6).
unsafe impl magpie_slab::glue::Kernel for Hobby {
    const RESTARTABLE_HITS: bool = true;
}

const HEAP_SIZE: usize = 100 * 1024;
/// The heap's memory: mapped already (in the image's .bss).
#[repr(align(4096))]
#[expect(dead_code, reason = "only its address is used")]
struct HeapMemory([u8; HEAP_SIZE]);
static mut HEAP_MEMORY: HeapMemory = HeapMemory([0; HEAP_SIZE]);
// ---------------------------------------------------------------------

/// The heap tests of "Writing an OS in Rust" (its `tests/heap_allocation.rs`,
/// smaller) and a `BTreeMap` churn: each allocates, checks and frees all
/// it allocated.
const TESTS: [(&str, fn()); 5] = [
    ("simple_box", simple_box),
    ("large_vec (8 KiB)", large_vec),
    ("many_boxes (10,000)", many_boxes),
    ("many_boxes_long_lived", many_boxes_long_lived),
    ("btreemap_churn", btreemap_churn),
];

fn simple_box() {
    let (a, b) = (black_box(Box::new(41)), black_box(Box::new(13)));
    assert_eq!(*a + *b, 54);
}

fn large_vec() {
    let mut vec = Vec::new();
    for i in 0..1000_u64 {
        vec.push(i);
    }
    assert_eq!(vec.iter().sum::<u64>(), 999 * 1000 / 2);
}

fn many_boxes() {
    for i in 0..10_000_usize {
        assert_eq!(*black_box(Box::new(i)), i);
    }
}

fn many_boxes_long_lived() {
    let long_lived = Box::new(1);
    for i in 0..10_000_usize {
        assert_eq!(*black_box(Box::new(i)), i);
    }
    assert_eq!(*long_lived, 1);
}

fn btreemap_churn() {
    let mut map = BTreeMap::new();
    for round in 0..20_u64 {
        for key in 0..500_u64 {
            map.insert(key * 7919 % 1000, round + key);
        }
        for key in 0..250_u64 {
            map.remove(&(key * 3));
        }
    }
    for key in 0..500_u64 {
        let k = key * 7919 % 1000;
        let removed = k % 3 == 0 && k < 750;
        assert_eq!(map.get(&k).copied(), (!removed).then_some(19 + key));
    }
}

/// Called by `boot/entry.S` with interrupts off.
#[unsafe(no_mangle)]
extern "C" fn kernel_entry(start_info: u64) -> ! {
    // SAFETY: HEAP_MEMORY is mapped and nothing but the heap touches it.
    unsafe { HEAP.init_region((&raw mut HEAP_MEMORY) as usize, HEAP_SIZE) }.expect("heap");
    let before = HEAP.source().stats().alloc_bytes;
    println!("hobby-kernel: 100 KiB heap, init took {before} bytes");

    // Feature `count`: every test with Magpie and with the fixed-size-block
    // allocator, their instructions counted (returns if Magpie's are fewer).
    #[cfg(feature = "count")]
    count::run(&TESTS);
    #[cfg(not(feature = "count"))]
    for (name, test) in TESTS {
        test();
        println!("{name}... [ok]");
    }

    if cmdline_has(start_info, "hobby.panic") {
        // The post-mortem case (docs/VMCORE.md): the heap's reports, then
        // a panic with objects still held; the runner takes a core that
        // `magpie-kmem core CORE slabinfo` reads as this printed it.
        let held: Vec<Box<u64>> = (0..40).map(Box::new).collect();
        println!("slabinfo");
        let _ = magpie_slab::reports::slabinfo(&mut Com1, &HEAP);
        panic!("hobby.panic: {} boxes held", held.len());
    }

    let used = HEAP.source().stats().alloc_bytes;
    println!(
        "heap pages in use after the tests: {} of {}",
        used / 4096,
        HEAP_SIZE / 4096
    );
    exit_qemu(0x10)
}

#[panic_handler]
fn panic(info: &core::panic::PanicInfo<'_>) -> ! {
    println!("[failed] {info}");
    // QEMU's pvpanic device (the runner adds it to take a core): "panicked".
    // SAFETY: port 0x505 is pvpanic's (no device there: the write is lost).
    unsafe { core::arch::asm!("out dx, al", in("dx") 0x505_u16, in("al") 1_u8) };
    // QEMU pauses the guest at its next block: give it some.
    for _ in 0..1_000_000 {
        core::hint::spin_loop();
    }
    exit_qemu(0x11)
}

/// Whether the boot command line (PVH `hvm_start_info.cmdline_paddr`,
/// a C string; low memory is identity-mapped by `boot/entry.S`) has `word`.
fn cmdline_has(start_info: u64, word: &str) -> bool {
    // SAFETY: the loader's start info, identity-mapped; its cmdline field
    // at byte 24 is the physical address of a NUL-terminated string or 0.
    let cmdline = unsafe { ((start_info + 24) as *const u64).read() };
    if start_info == 0 || cmdline == 0 {
        return false;
    }
    // SAFETY: a NUL-terminated string in identity-mapped memory.
    let text = unsafe { core::ffi::CStr::from_ptr(cmdline as *const core::ffi::c_char) };
    text.to_str()
        .is_ok_and(|text| text.split_ascii_whitespace().any(|w| w == word))
}

// ---- Console (COM1) and exit (isa-debug-exit: status (code << 1) | 1). ----
pub(crate) struct Com1;

impl Write for Com1 {
    fn write_str(&mut self, s: &str) -> core::fmt::Result {
        for byte in s.bytes() {
            // SAFETY: port 0x3f8 is COM1's data register; writing a byte sends it.
            unsafe { core::arch::asm!("out dx, al", in("dx") 0x3f8_u16, in("al") byte) };
        }
        Ok(())
    }
}

pub(crate) fn exit_qemu(code: u32) -> ! {
    // SAFETY: QEMU's isa-debug-exit device at 0xf4 (the runner adds it) exits.
    unsafe { core::arch::asm!("out dx, eax", in("dx") 0xf4_u16, in("eax") code) };
    loop {
        // SAFETY: halts with interrupts off: the end.
        unsafe { core::arch::asm!("cli", "hlt") };
    }
}
