//! Serial console on COM1 (16550 UART): output, polled input and the
//! `print!` family of macros.
//!
//! Waiting for input ([`read_byte_timeout`]) polls for [`BUSY_WAIT_NS`]
//! (a piped script's next byte comes within microseconds) and then idles
//! in `hlt`, woken by a LAPIC timer tick every [`IDLE_TICK_US`]: an idle
//! prompt costs the host a tick's worth of work a period instead of a
//! core, and a key pressed after a pause is read within one tick. (The
//! UART's receive interrupt would wake it at once, but needs an I/O APIC
//! route the kernel does not program.)
//!
//! Output and input share one lock taken with interrupts off. Crash paths
//! (panic, exception reports) use [`emergency_writer`], which bypasses the
//! lock so a fault while printing cannot deadlock the report.
//!
//! The FIFO control register is never written: in QEMU that flushes the
//! receive buffer and loses bytes already queued from a piped stdin.

use core::fmt::{self, Write};

use spin::Mutex;
use x86_64::instructions::port::Port;

use crate::arch::IrqGuard;

const COM1: u16 = 0x3f8;
const LSR_DATA_READY: u8 = 1 << 0;
const LSR_THR_EMPTY: u8 = 1 << 5;

/// The COM1 UART (a zero-sized handle: all state lives in the device).
struct Serial;

impl Serial {
    fn outb(offset: u16, value: u8) {
        // SAFETY: COM1's ports belong to this driver; writes only configure the UART.
        unsafe { Port::new(COM1 + offset).write(value) }
    }

    fn inb(offset: u16) -> u8 {
        // SAFETY: reading COM1's registers has no side effect beyond consuming a received byte.
        unsafe { Port::new(COM1 + offset).read() }
    }

    fn init() {
        Self::outb(1, 0x00); // IER: no interrupts (the console is polled)
        Self::outb(3, 0x80); // LCR: DLAB on
        Self::outb(0, 0x01); // divisor 1: 115200 baud
        Self::outb(1, 0x00);
        Self::outb(3, 0x03); // LCR: 8N1, DLAB off
        Self::outb(4, 0x0b); // MCR: DTR | RTS | OUT2
    }

    fn put(byte: u8) {
        while Self::inb(5) & LSR_THR_EMPTY == 0 {
            core::hint::spin_loop();
        }
        Self::outb(0, byte);
    }

    fn get() -> Option<u8> {
        if Self::inb(5) & LSR_DATA_READY != 0 {
            Some(Self::inb(0))
        } else {
            None
        }
    }

    fn write_bytes(bytes: &[u8]) {
        for &byte in bytes {
            if byte == b'\n' {
                Self::put(b'\r');
            }
            Self::put(byte);
        }
    }
}

static LOCK: Mutex<()> = Mutex::new(());

/// Initializes COM1. Called first thing by `kernel_entry`.
pub fn init() {
    Serial::init();
}

/// A [`fmt::Write`] sink to the serial console (takes the console lock per write).
pub struct Console;

impl Write for Console {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let _irq = IrqGuard::new();
        let _lock = LOCK.lock();
        Serial::write_bytes(s.as_bytes());
        Ok(())
    }
}

/// A lock-free writer for crash reports: never blocks, may interleave with
/// other CPUs' output.
pub struct EmergencyConsole;

impl Write for EmergencyConsole {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        Serial::write_bytes(s.as_bytes());
        Ok(())
    }
}

/// Returns the lock-free crash-report writer.
pub fn emergency_writer() -> EmergencyConsole {
    EmergencyConsole
}

/// Writes preformatted text atomically with respect to other console output.
pub fn write_fmt(args: fmt::Arguments<'_>) {
    let _irq = IrqGuard::new();
    let _lock = LOCK.lock();
    struct Raw;
    impl Write for Raw {
        fn write_str(&mut self, s: &str) -> fmt::Result {
            Serial::write_bytes(s.as_bytes());
            Ok(())
        }
    }
    let _ = Raw.write_fmt(args);
}

/// Writes raw bytes (no formatting; `\n` becomes `\r\n`).
pub fn write_bytes(bytes: &[u8]) {
    let _irq = IrqGuard::new();
    let _lock = LOCK.lock();
    Serial::write_bytes(bytes);
}

/// Ctrl-C seen by [`interrupt_requested`] since [`clear_interrupt`].
static INTERRUPT: core::sync::atomic::AtomicBool = core::sync::atomic::AtomicBool::new(false);

/// Whether the user pressed Ctrl-C since [`clear_interrupt`] (the shell
/// clears it before each command): a long command (`stress`) calls this
/// every few thousand operations, from any CPU, and stops when it says
/// so. Reads what is waiting on the console: a Ctrl-C is taken; every
/// other byte is kept, in order, for the next [`read_byte`] (the type-ahead
/// of the next command, up to [`TYPE_AHEAD`] bytes; a byte beyond that is
/// dropped, as a full UART FIFO drops it).
pub fn interrupt_requested() -> bool {
    use core::sync::atomic::Ordering;
    if INTERRUPT.load(Ordering::Relaxed) {
        return true;
    }
    let _irq = IrqGuard::new();
    let _lock = LOCK.lock();
    let mut pending = PENDING.lock();
    while let Some(byte) = Serial::get() {
        if byte == 0x03 {
            INTERRUPT.store(true, Ordering::Relaxed);
            return true;
        }
        pending.push(byte);
    }
    false
}

/// How many bytes typed while a command runs are kept for the next
/// command (a pasted line or two).
pub const TYPE_AHEAD: usize = 1024;

/// Bytes [`interrupt_requested`] read that were not a Ctrl-C, oldest first.
struct Pending {
    bytes: [u8; TYPE_AHEAD],
    head: usize,
    len: usize,
}

impl Pending {
    fn push(&mut self, byte: u8) {
        if self.len < TYPE_AHEAD {
            self.bytes[(self.head + self.len) % TYPE_AHEAD] = byte;
            self.len += 1;
        }
    }

    fn pop(&mut self) -> Option<u8> {
        if self.len == 0 {
            return None;
        }
        let byte = self.bytes[self.head];
        self.head = (self.head + 1) % TYPE_AHEAD;
        self.len -= 1;
        Some(byte)
    }
}

/// The type-ahead; taken under [`LOCK`] with interrupts off.
static PENDING: Mutex<Pending> = Mutex::new(Pending {
    bytes: [0; TYPE_AHEAD],
    head: 0,
    len: 0,
});

/// Forgets a Ctrl-C [`interrupt_requested`] saw (the shell, before each
/// command).
pub fn clear_interrupt() {
    INTERRUPT.store(false, core::sync::atomic::Ordering::Relaxed);
}

/// Returns the next received byte, or `None` if none is waiting (non-blocking).
pub fn read_byte() -> Option<u8> {
    let _irq = IrqGuard::new();
    let _lock = LOCK.lock();
    PENDING.lock().pop().or_else(Serial::get)
}

/// Waits for the next received byte (idles as [`read_byte_timeout`]).
pub fn read_byte_blocking() -> u8 {
    loop {
        if let Some(byte) = read_byte_timeout(None, &mut || {}) {
            return byte;
        }
    }
}

/// How long a wait for input polls before it idles in `hlt`, in
/// nanoseconds.
pub const BUSY_WAIT_NS: u64 = 20_000_000;
/// The idle tick's period while a wait for input is in `hlt`, in
/// microseconds (a key pressed at an idle prompt is read this late at most).
pub const IDLE_TICK_US: u64 = 10_000;

/// The idle tick's work: none (the interrupt ends the `hlt`).
fn idle_tick() {}

/// Waits for the next received byte, at most `timeout_ns` (`None`:
/// forever), calling `on_idle` between checks. Polls for
/// [`BUSY_WAIT_NS`], then halts the CPU between LAPIC timer ticks
/// ([`IDLE_TICK_US`]) until a byte comes or the time is up; the timer is
/// stopped again before it returns. Call with interrupts enabled or
/// disabled (the state is kept); not from an interrupt handler.
pub fn read_byte_timeout(timeout_ns: Option<u64>, on_idle: &mut dyn FnMut()) -> Option<u8> {
    let start = crate::arch::rdtsc();
    let mut ticking = false;
    let byte = loop {
        if let Some(byte) = read_byte() {
            break Some(byte);
        }
        on_idle();
        let waited = crate::arch::tsc::cycles_to_ns(crate::arch::rdtsc().wrapping_sub(start));
        if timeout_ns.is_some_and(|timeout| waited >= timeout) {
            break None;
        }
        if waited < BUSY_WAIT_NS || !crate::arch::lapic::is_ready() {
            core::hint::spin_loop();
            continue;
        }
        let flags = crate::arch::irq_save();
        if !ticking {
            crate::arch::idt::set_timer_handler(idle_tick);
            crate::arch::lapic::timer_start(IDLE_TICK_US);
            ticking = true;
        }
        // `sti; hlt` as one: a tick due between the check above and the
        // `hlt` is taken right after `sti` and ends the `hlt` at once.
        x86_64::instructions::interrupts::enable_and_hlt();
        x86_64::instructions::interrupts::disable();
        crate::arch::irq_restore(flags);
    };
    if ticking {
        let flags = crate::arch::irq_save();
        crate::arch::lapic::timer_stop();
        crate::arch::irq_restore(flags);
    }
    byte
}

#[doc(hidden)]
pub fn _print(args: fmt::Arguments<'_>) {
    write_fmt(args);
}

/// Prints to the serial console.
#[macro_export]
macro_rules! print {
    ($($arg:tt)*) => ($crate::dev::console::_print(format_args!($($arg)*)));
}

/// Prints to the serial console, with a newline.
#[macro_export]
macro_rules! println {
    () => ($crate::print!("\n"));
    ($($arg:tt)*) => ($crate::dev::console::_print(format_args!("{}\n", format_args!($($arg)*))));
}

/// Same as [`print!`] (the console is the serial port).
#[macro_export]
macro_rules! serial_print {
    ($($arg:tt)*) => ($crate::print!($($arg)*));
}

/// Same as [`println!`] (the console is the serial port).
#[macro_export]
macro_rules! serial_println {
    ($($arg:tt)*) => ($crate::println!($($arg)*));
}
