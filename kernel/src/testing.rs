//! The QEMU test framework (Rust custom test frameworks).
//!
//! A test kernel is a file `tests/NAME.rs` (declared in kernel/Cargo.toml
//! as `[[test]] name = "NAME" path = "../tests/NAME.rs"`). Its preamble is
//! the crate attributes and one macro line:
//!
//! ```ignore
//! //! What this test kernel checks.
//!
//! #![no_std]
//! #![no_main]
//! #![feature(custom_test_frameworks)]
//! #![test_runner(magpie::test_runner)]
//! #![reexport_test_harness_main = "test_main"]
//! #![allow(
//!     missing_docs,
//!     clippy::missing_panics_doc,
//!     reason = "#[test_case] functions are named for what they check and fail by panicking"
//! )]
//!
//! magpie::test_kernel!();
//!
//! #[test_case]
//! fn one_plus_one() { assert_eq!(1 + 1, 2); }
//! ```
//!
//! The `#![...]` lines are crate-level inner attributes, which no macro
//! can emit (an inner attribute is only allowed at the start of the
//! crate's own source), so every test kernel repeats those few lines;
//! everything else it shares comes from [`test_kernel!`](crate::test_kernel):
//! `extern crate alloc`, the entry point (run every `#[test_case]`, then
//! exit QEMU with success) and the panic handler. The `allow` is for the
//! test harness: it makes the `#[test_case]` functions and `test_main`
//! public items of the crate.
//!
//! Output per test is `path::name... [ok]`, and a libtest-style
//! `test result:` line at the end; a panic prints `[failed]`, the message
//! and a backtrace, and exits QEMU with failure. Two test kernels run
//! without the harness (`harness = false`: `should_panic`,
//! `stack_overflow`): they define `kmain` with
//! [`entry_point!`](crate::entry_point) and their own `#[panic_handler]`.

use core::fmt::Write;
use core::panic::PanicInfo;
use core::sync::atomic::{AtomicUsize, Ordering};

use crate::dev::qemu::{QemuExitCode, exit_qemu};
use crate::{print, println};

static NR_TESTS: AtomicUsize = AtomicUsize::new(0);
static NR_PASSED: AtomicUsize = AtomicUsize::new(0);

/// Something the test runner can run: any `Fn()` (a `#[test_case]` function).
pub trait Testable {
    /// Runs the test, printing its name and `[ok]`.
    fn run(&self);
}

impl<T: Fn()> Testable for T {
    fn run(&self) {
        print!("{}... ", core::any::type_name::<T>());
        self();
        println!("[ok]");
    }
}

/// Runs every `#[test_case]`, then exits QEMU with success.
pub fn test_runner(tests: &[&dyn Testable]) {
    NR_TESTS.store(tests.len(), Ordering::Relaxed);
    println!("running {} tests", tests.len());
    let start = crate::arch::rdtsc();
    for test in tests {
        test.run();
        NR_PASSED.fetch_add(1, Ordering::Relaxed);
    }
    let elapsed_us = crate::arch::tsc::cycles_to_us(crate::arch::rdtsc() - start);
    println!(
        "\ntest result: ok. {} passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in {}.{:03}s\n",
        tests.len(),
        elapsed_us / 1_000_000,
        elapsed_us % 1_000_000 / 1000
    );
    exit_qemu(QemuExitCode::Success);
}

/// The panic handler for test kernels: `[failed]`, the report, exit failure.
pub fn test_panic_handler(info: &PanicInfo<'_>) -> ! {
    crate::arch::irq_save();
    // Lock-free output: the panic may have happened while printing.
    let mut out = crate::dev::console::emergency_writer();
    let _ = out.write_str("[failed]\n");
    crate::debug::panic::report(info);
    let passed = NR_PASSED.load(Ordering::Relaxed);
    let total = NR_TESTS.load(Ordering::Relaxed);
    let _ = out.write_fmt(format_args!(
        "\ntest result: FAILED. {} passed; 1 failed; 0 ignored; 0 measured; {} not run\n",
        passed,
        total.saturating_sub(passed + 1)
    ));
    exit_qemu(QemuExitCode::Failed)
}

/// The shared part of a test kernel's preamble (see the module docs for
/// the crate attributes that must precede it): `extern crate alloc`, the
/// kernel's `kmain` (run every `#[test_case]`, then exit QEMU with
/// success) and its `#[panic_handler]` (`[failed]`, the report, exit
/// failure).
///
/// The boot information is at [`crate::mm::boot_info::get`].
#[macro_export]
macro_rules! test_kernel {
    () => {
        extern crate alloc;

        $crate::entry_point!(__magpie_test_main);

        fn __magpie_test_main(_boot: &'static $crate::BootInfo) -> ! {
            test_main();
            $crate::exit_qemu($crate::QemuExitCode::Success)
        }

        #[panic_handler]
        fn __magpie_test_panic(info: &core::panic::PanicInfo) -> ! {
            $crate::test_panic_handler(info)
        }
    };
}

/// Sets the trap flag (RFLAGS.TF): every instruction after the next
/// raises a debug exception (#DB), for tests that single-step code under
/// [`with_debug_handler`] (`tests/kernel_hit.rs` counts the hit's
/// instructions, `tests/restartable_hit.rs` interrupts each of them).
#[inline(always)]
pub fn trap_on() {
    // SAFETY: sets RFLAGS.TF only (through the stack: `pushfq`/`popfq`
    // are balanced); the caller has a #DB entry that returns.
    unsafe { core::arch::asm!("pushfq", "or qword ptr [rsp], 0x100", "popfq") };
}

/// Clears the trap flag ([`trap_on`]).
#[inline(always)]
pub fn trap_off() {
    // SAFETY: clears RFLAGS.TF only.
    unsafe { core::arch::asm!("pushfq", "and qword ptr [rsp], -0x101", "popfq") };
}

/// Runs `f` with a copy of the kernel's IDT whose #DB entry is `handler`
/// loaded on this CPU, then the kernel's IDT again. The copy is leaked
/// (a few KiB, once per call): an IDT must outlive its use.
pub fn with_debug_handler<R>(
    handler: x86_64::structures::idt::HandlerFunc,
    f: impl FnOnce() -> R,
) -> R {
    use x86_64::instructions::tables::{lidt, sidt};
    use x86_64::structures::idt::InterruptDescriptorTable;

    let kernel_idt = sidt();
    // SAFETY: the IDTR names the kernel's loaded 256-entry IDT
    // (`arch::idt`), alive forever; we copy it.
    let mut idt: InterruptDescriptorTable =
        unsafe { core::ptr::read(kernel_idt.base.as_ptr::<InterruptDescriptorTable>()) };
    idt.debug.set_handler_fn(handler);
    let idt: &'static InterruptDescriptorTable =
        alloc::boxed::Box::leak(alloc::boxed::Box::new(idt));
    idt.load();
    let result = f();
    // SAFETY: the kernel's own IDT, as it was.
    unsafe { lidt(&kernel_idt) };
    result
}
