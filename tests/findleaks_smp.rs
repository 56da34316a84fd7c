//! `kmem findleaks` on two CPUs: an idle AP's stack below its work loop is
//! not a root.
//!
//! A job on the AP allocates a 64-byte object and leaves its address only
//! in a dead frame of its own stack (deep: 8 KiB below the job's entry,
//! where the wake IPI's handler frames do not reach), then ends. Nothing
//! live points to the object: `findleaks` must report it, with it as the
//! group's representative buffer, at its `kmalloc!` site (with
//! allocation profiling compiled in). When
//! every AP's whole stack was a root, the stale copy hid the leak — the
//! `tests/e2e/test_findleaks.py` failure seen under load, where frames of
//! a `stress` job held pointers to objects that `leak` later got.

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

use alloc::string::String;
use core::hint::black_box;
use core::sync::atomic::{AtomicUsize, Ordering};

use magpie::debug::findleaks::findleaks;
use magpie::smp;

magpie::test_kernel!();

/// The leaked object's address, masked so that this word is no pointer
/// to it (a `static` is a root).
static MASKED: AtomicUsize = AtomicUsize::new(0);
const MASK: usize = 0x5a5a_5a5a_5a5a_5a5a;

/// Leaves `addr` at the bottom of an 8 KiB frame.
#[inline(never)]
fn bury(addr: usize) {
    let mut frame = [0usize; 1024];
    // SAFETY: our own array's first (lowest) word.
    unsafe { core::ptr::write_volatile(&raw mut frame[0], addr) };
    black_box(&frame);
}

/// The AP's job: allocate, remember the address only masked and buried.
fn leak_on_ap() {
    let obj = magpie::kmalloc!(64, 8).expect("kmalloc");
    let addr = obj.as_ptr() as usize;
    MASKED.store(addr ^ MASK, Ordering::Relaxed);
    bury(addr);
}

/// `findleaks`' summary and report.
fn scan() -> (usize, String) {
    let mut out = String::new();
    let summary = findleaks(&mut out).expect("findleaks");
    (summary.nr_leaked, out)
}

#[test_case]
fn a_leak_only_an_idle_aps_dead_frames_point_to_is_found() {
    assert!(smp::nr_online() >= 2, "needs an AP");
    let (before, _) = scan();
    smp::run_on(1, leak_on_ap).expect("run_on").wait();
    // Until the AP sleeps again, all of its stack is live.
    let (bottom, _) = smp::ap_stack(1).expect("AP 1's stack");
    let mut spins = 0u64;
    while smp::ap_stack_live(1).expect("AP 1's stack").0 == bottom {
        spins += 1;
        assert!(spins < 1_000_000_000, "AP 1 never went back to sleep");
        core::hint::spin_loop();
    }
    let (after, out) = scan();
    // Only now is the address in a register of this CPU.
    let addr = MASKED.load(Ordering::Relaxed) ^ MASK;
    assert_eq!(after, before + 1, "one more leak:\n{out}");
    assert!(
        out.contains(&alloc::format!("{addr:016x} ")),
        "{addr:#x} is the group's buffer:\n{out}"
    );
    // Its site is its code tag: with allocation profiling compiled in.
    if cfg!(feature = "alloc-profiling") {
        assert!(out.contains("findleaks_smp.rs:"), "at its site:\n{out}");
    }
}
