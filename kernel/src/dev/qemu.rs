//! Leaving QEMU through the `isa-debug-exit` device (iobase 0xf4).
//!
//! QEMU exits with status `(value << 1) | 1`: Success (0x10) gives 33, which
//! boot/run-qemu.sh maps to 0; Failed (0x11) gives 35.

use x86_64::instructions::port::Port;

/// The value written to the debug-exit port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum QemuExitCode {
    /// QEMU exits with status 33 (the runner reports success).
    Success = 0x10,
    /// QEMU exits with status 35 (the runner reports failure).
    Failed = 0x11,
}

/// Exits QEMU with `code`. Halts forever if the device is absent.
pub fn exit_qemu(code: QemuExitCode) -> ! {
    // SAFETY: port 0xf4 is the isa-debug-exit device the runner configures;
    // writing it ends the VM. Without the device the write is ignored.
    unsafe { Port::<u32>::new(0xf4).write(code as u32) };
    crate::arch::halt_loop()
}
