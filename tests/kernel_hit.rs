//! The kernel's allocation hit, counted exactly (issue 18): the kernel's
//! `GlobalAlloc::alloc` and `::dealloc` of `Allocator<KernelPlatform>`
//! (the functions `bench/kernel-hit.py` prints and docs/BENCHMARKS.md
//! counted by hand) on a 64-byte hit, single-stepped with the trap flag:
//! one debug exception (#DB) per instruction executed. The kernel's
//! plain hits are restartable sequences (`magpie_slab::restart`: no
//! in-use flag); #DB does not restart them (`tests/restartable_hit.rs`
//! interrupts them instead).
//!
//! Prints one line, for the profiling state it was booted with
//! (`mem_profiling=0|1`; bench/run.sh boots it both ways and puts the
//! lines in docs/BENCHMARKS.md):
//!
//! ```text
//! KERNEL_HIT profiling=on alloc=A free=F pair=P
//! ```
//!
//! How: the test loads a copy of the kernel's IDT whose #DB entry counts
//! and returns (the CPU clears TF entering the handler; `iretq` restores
//! it, so the next instruction traps again), sets TF with `popfq` around
//! one call through a function pointer, clears it after, and subtracts
//! the same sequence around a call of a function that is one `ret`: what
//! is left, plus that one, is every instruction from the callee's first
//! to its `ret`.

#![no_std]
#![no_main]
#![feature(custom_test_frameworks)]
#![feature(abi_x86_interrupt)]
#![test_runner(magpie::test_runner)]
#![reexport_test_harness_main = "test_main"]
#![allow(
    missing_docs,
    clippy::missing_panics_doc,
    reason = "#[test_case] functions are named for what they check and fail by panicking"
)]

use core::alloc::{GlobalAlloc, Layout};
use core::hint::black_box;
use core::sync::atomic::{AtomicU64, Ordering};

use alloc::boxed::Box;
use magpie::kmem::SLAB;
use magpie::kmem::platform::KernelPlatform;
use magpie::println;
use magpie::testing::{trap_off, trap_on, with_debug_handler};
use magpie_slab::Allocator;
use x86_64::structures::idt::InterruptStackFrame;

magpie::test_kernel!();

/// Debug exceptions taken while the trap flag was set.
static NR_STEPS: AtomicU64 = AtomicU64::new(0);

extern "x86-interrupt" fn count_step(_frame: InterruptStackFrame) {
    NR_STEPS.fetch_add(1, Ordering::Relaxed);
}

type Slab = Allocator<KernelPlatform>;
/// `<Slab as GlobalAlloc>::alloc`'s signature.
type AllocFn = unsafe fn(&'static Slab, Layout) -> *mut u8;
/// `<Slab as GlobalAlloc>::dealloc`'s signature.
type FreeFn = unsafe fn(&'static Slab, *mut u8, Layout);

// The baselines: one `ret` each, called as the measured functions are.
core::arch::global_asm!(
    ".global kernel_hit_return_alloc",
    ".global kernel_hit_return_free",
    "kernel_hit_return_alloc:",
    "kernel_hit_return_free:",
    "    ret",
);

unsafe extern "Rust" {
    /// One `ret` with [`AllocFn`]'s signature (its result is garbage).
    safe fn kernel_hit_return_alloc(slab: &'static Slab, layout: Layout) -> *mut u8;
    /// One `ret` with [`FreeFn`]'s signature.
    safe fn kernel_hit_return_free(slab: &'static Slab, ptr: *mut u8, layout: Layout);
}

/// Debug exceptions taken by `f(&SLAB, layout)` with the trap flag set,
/// and its result. (No timer runs in a test kernel; the other CPU idles.)
#[inline(never)]
fn stepped_alloc(f: AllocFn, layout: Layout) -> (u64, *mut u8) {
    let f = black_box(f);
    let before = NR_STEPS.load(Ordering::Relaxed);
    trap_on();
    // SAFETY: layout has a non-zero size (the callers' 64 bytes).
    let result = unsafe { f(&SLAB, layout) };
    trap_off();
    (NR_STEPS.load(Ordering::Relaxed) - before, result)
}

/// Debug exceptions taken by `f(&SLAB, ptr, layout)`.
///
/// # Safety
/// As `GlobalAlloc::dealloc` for a real `f`.
#[inline(never)]
unsafe fn stepped_free(f: FreeFn, ptr: *mut u8, layout: Layout) -> u64 {
    let f = black_box(f);
    let before = NR_STEPS.load(Ordering::Relaxed);
    trap_on();
    // SAFETY: per our caller.
    unsafe { f(&SLAB, ptr, layout) };
    trap_off();
    NR_STEPS.load(Ordering::Relaxed) - before
}

/// Instructions of one alloc hit and one free hit (the median of 9
/// pairs, after warming this CPU's magazines), net of the `ret`-only
/// baselines plus their one instruction.
fn hit_pair() -> (u64, u64) {
    let layout = black_box(Layout::from_size_align(64, 8).unwrap());
    for _ in 0..64 {
        drop(black_box(Box::new([0u64; 8])));
    }
    let (alloc_base, _) = stepped_alloc(kernel_hit_return_alloc, layout);
    // SAFETY: the baseline touches nothing.
    let free_base = unsafe { stepped_free(kernel_hit_return_free, core::ptr::null_mut(), layout) };
    let mut allocs = [0u64; 9];
    let mut frees = [0u64; 9];
    for i in 0..9 {
        let (a, ptr) = stepped_alloc(<Slab as GlobalAlloc>::alloc, layout);
        assert!(!ptr.is_null());
        // SAFETY: just allocated with `layout`.
        let f = unsafe { stepped_free(<Slab as GlobalAlloc>::dealloc, ptr, layout) };
        allocs[i] = a - alloc_base + 1;
        frees[i] = f - free_base + 1;
    }
    allocs.sort_unstable();
    frees.sort_unstable();
    (allocs[4], frees[4])
}

#[test_case]
fn kernel_hit_counted_by_single_stepping() {
    // A copy of the kernel's IDT with a counting #DB entry, loaded for the
    // measurement only. Interrupts on at entry, as in the kernel's threads
    // (the guard's `sti` path); no timer runs in a test kernel, the other
    // CPU idles.
    let (alloc, free) = with_debug_handler(count_step, || {
        let irqs_were_on = x86_64::instructions::interrupts::are_enabled();
        x86_64::instructions::interrupts::enable();
        let counts = hit_pair();
        if !irqs_were_on {
            x86_64::instructions::interrupts::disable();
        }
        counts
    });
    // Profiling as booted (`mem_profiling=1`, the default, or 0 from
    // boot: bench/run.sh boots this kernel both ways). Switching it off
    // later would leave the caches' `TAGGED` free path on, by design.
    let on = if SLAB.profiling().enabled() {
        "on"
    } else {
        "off"
    };
    println!(
        "KERNEL_HIT profiling={on} alloc={alloc} free={free} pair={}",
        alloc + free
    );
    // A figure far off means the stepping did not work, not a slow hit.
    assert!((10..400).contains(&alloc) && (10..400).contains(&free));
}
