//! The Magpie kernel binary: boots, prints a banner and a memory summary,
//! then runs the shell on the serial console.

#![no_std]
#![no_main]

use magpie::mm::frame;
use magpie::{BootInfo, println};

magpie::entry_point!(main);

fn main(boot: &'static BootInfo) -> ! {
    println!(
        "Magpie {} - slab allocator demo kernel",
        env!("CARGO_PKG_VERSION")
    );
    let stats = frame::stats();
    println!(
        "memory: {} MiB usable RAM, {} MiB free, {} CPU(s); type 'help' for commands",
        boot.usable_bytes() >> 20,
        (stats.nr_free * frame::PAGE_SIZE) >> 20,
        magpie::arch::max_cpus()
    );
    magpie::shell::run()
}

#[panic_handler]
fn panic(info: &core::panic::PanicInfo<'_>) -> ! {
    magpie::debug::panic::panic_handler(info)
}
