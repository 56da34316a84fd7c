//! Unbounded recursion runs into the boot stack's guard page; the page
//! fault cannot be delivered on that stack, so the CPU raises a double
//! fault, whose handler runs on its IST stack, prints the report and calls
//! our hook, which exits with success.

#![no_std]
#![no_main]

use magpie::arch::idt::{ExceptionInfo, set_exception_hook};
use magpie::{BootInfo, QemuExitCode, exit_qemu, print, println};

magpie::entry_point!(main);

fn main(_boot: &'static BootInfo) -> ! {
    print!("stack_overflow::double_fault_on_ist_stack... ");
    set_exception_hook(on_exception);
    recurse(0);
    println!("[recursion returned]");
    exit_qemu(QemuExitCode::Failed)
}

#[inline(never)]
#[allow(
    unconditional_recursion,
    reason = "the point of the test: overflow the stack"
)]
fn recurse(depth: u64) -> u64 {
    let local = core::hint::black_box([depth; 4]);
    recurse(depth + 1) + local[3]
}

fn on_exception(info: &ExceptionInfo<'_>) {
    if info.vector == 8 {
        println!("[ok]");
        println!("\ntest result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out\n");
        exit_qemu(QemuExitCode::Success);
    }
}

#[panic_handler]
fn panic(info: &core::panic::PanicInfo<'_>) -> ! {
    magpie::test_panic_handler(info)
}
