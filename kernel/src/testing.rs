//! The QEMU test framework (Rust custom test frameworks).
//!
//! A test kernel in `tests/NAME.rs` (declared in kernel/Cargo.toml as
//! `[[test]] name = "NAME" path = "../tests/NAME.rs"`):
//!
//! ```ignore
//! #![no_std]
//! #![no_main]
//! #![feature(custom_test_frameworks)]
//! #![test_runner(magpie::test_runner)]
//! #![reexport_test_harness_main = "test_main"]
//!
//! magpie::entry_point!(main);
//! fn main(_boot: &'static magpie::BootInfo) -> ! {
//!     test_main();
//!     magpie::exit_qemu(magpie::QemuExitCode::Success)
//! }
//! #[panic_handler]
//! fn panic(info: &core::panic::PanicInfo) -> ! { magpie::test_panic_handler(info) }
//!
//! #[test_case]
//! fn one_plus_one() { assert_eq!(1 + 1, 2); }
//! ```
//!
//! Output per test is `path::name... [ok]`, and a libtest-style
//! `test result:` line at the end; a panic prints `[failed]`, the message
//! and a backtrace, and exits QEMU with failure.

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

/// Defines a test kernel's `kmain` (run every `#[test_case]`, then exit
/// QEMU with success) and its `#[panic_handler]` (`[failed]`, the report,
/// exit failure). A test file needs the crate attributes and this line:
///
/// ```ignore
/// #![no_std]
/// #![no_main]
/// #![feature(custom_test_frameworks)]
/// #![test_runner(magpie::test_runner)]
/// #![reexport_test_harness_main = "test_main"]
///
/// magpie::test_kernel!();
/// ```
///
/// The boot information is at [`crate::mm::boot_info::get`].
#[macro_export]
macro_rules! test_kernel {
    () => {
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
