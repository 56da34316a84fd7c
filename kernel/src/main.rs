//! The Magpie kernel binary: boots, prints a banner and a memory summary,
//! then echoes console lines (a placeholder until the shell lands).

#![no_std]
#![no_main]

use magpie::{BootInfo, console, frame, println};

magpie::entry_point!(main);

fn main(boot: &'static BootInfo) -> ! {
    println!("Magpie {}", env!("CARGO_PKG_VERSION"));
    let stats = frame::stats();
    println!(
        "memory: {} MiB usable RAM, {} MiB free in {} frames, {} CPU(s)",
        boot.usable_bytes() >> 20,
        (stats.nr_free * frame::PAGE_SIZE) >> 20,
        stats.nr_total,
        magpie::arch::max_cpus()
    );
    println!("type a line to echo it; \"poweroff\" exits");
    let mut line = [0u8; 256];
    loop {
        magpie::print!("magpie> ");
        let len = read_line(&mut line);
        let text = core::str::from_utf8(&line[..len]).unwrap_or("<not utf-8>");
        match text.trim() {
            "poweroff" => magpie::exit_qemu(magpie::QemuExitCode::Success),
            "fault" => {
                // Demonstrates the exception report: a write to an unmapped address.
                let address = core::hint::black_box(0xdead_b000usize) as *mut u64;
                // SAFETY: not safe at all: this deliberately page-faults.
                unsafe { address.write_volatile(1) };
            }
            text => println!("echo: {text}"),
        }
    }
}

/// Reads one line with local echo and backspace; returns its length.
fn read_line(buffer: &mut [u8]) -> usize {
    let mut len = 0;
    loop {
        match console::read_byte_blocking() {
            b'\r' | b'\n' => {
                println!();
                return len;
            }
            0x7f | 0x08 if len > 0 => {
                len -= 1;
                console::write_bytes(b"\x08 \x08");
            }
            byte if len < buffer.len() && (0x20..0x7f).contains(&byte) => {
                buffer[len] = byte;
                len += 1;
                console::write_bytes(&[byte]);
            }
            _ => {}
        }
    }
}

#[panic_handler]
fn panic(info: &core::panic::PanicInfo) -> ! {
    magpie::panic::panic_handler(info)
}
