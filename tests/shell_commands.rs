//! Placeholder.
#![no_std]
#![no_main]
#![feature(custom_test_frameworks)]
#![test_runner(magpie::test_runner)]
#![reexport_test_harness_main = "test_main"]
magpie::entry_point!(main);
fn main(_boot: &'static magpie::BootInfo) -> ! {
    test_main();
    magpie::exit_qemu(magpie::QemuExitCode::Success)
}
#[panic_handler]
fn panic(info: &core::panic::PanicInfo) -> ! {
    magpie::test_panic_handler(info)
}
