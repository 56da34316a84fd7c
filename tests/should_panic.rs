//! A panic must reach the panic handler, which exits QEMU with success here.

#![no_std]
#![no_main]

use magpie::{BootInfo, QemuExitCode, exit_qemu, print, println};

magpie::entry_point!(main);

fn main(_boot: &'static BootInfo) -> ! {
    print!("should_panic::assert_fails... ");
    assert_eq!(0, 1);
    println!("[test did not panic]");
    exit_qemu(QemuExitCode::Failed)
}

#[panic_handler]
fn panic(_info: &core::panic::PanicInfo<'_>) -> ! {
    println!("[ok]");
    println!("\ntest result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out\n");
    exit_qemu(QemuExitCode::Success)
}
