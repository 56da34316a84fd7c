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

/// QEMU's `pvpanic` ISA device (port 0x505): the runner (boot/run-qemu.sh)
/// adds it when it takes cores (docs/VMCORE.md), and hears each write as
/// a QMP event.
const PVPANIC_PORT: u16 = 0x505;

/// The pvpanic events: the guest panicked (QEMU pauses it and the runner
/// takes a core), or asks for a core and runs on ("crash loaded").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum PvpanicEvent {
    /// GUEST_PANICKED.
    Panicked = 1,
    /// GUEST_CRASHLOADED.
    CrashLoaded = 2,
}

/// Whether the pvpanic device is there and supports `event` (its port
/// reads the supported events; an absent device reads 0xff).
pub fn pvpanic_supports(event: PvpanicEvent) -> bool {
    // SAFETY: reading port 0x505 has no side effect: the pvpanic device
    // answers its capabilities, an unassigned port answers 0xff.
    let bits = unsafe { Port::<u8>::new(PVPANIC_PORT).read() };
    bits != 0xff && bits & event as u8 != 0
}

/// Tell the runner `event` (nothing happens without the device).
pub fn pvpanic(event: PvpanicEvent) {
    if pvpanic_supports(event) {
        // SAFETY: the pvpanic device's port; the write raises the event.
        unsafe { Port::<u8>::new(PVPANIC_PORT).write(event as u8) };
    }
}
