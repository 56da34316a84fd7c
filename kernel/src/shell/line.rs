//! The line editor: console bytes in, command lines out.

use core::fmt::{self, Write};

use super::MAX_LINE;
use crate::console;

/// Collects a command line from console bytes: echo, backspace, overlong
/// lines. Feeds on bytes, so it is testable without a console.
pub struct LineEditor {
    buffer: [u8; MAX_LINE],
    len: usize,
    too_long: bool,
    last_was_cr: bool,
}

/// What a byte fed to the [`LineEditor`] completed.
#[derive(Debug, PartialEq, Eq)]
pub enum Edit<'a> {
    /// Nothing yet.
    Pending,
    /// A whole line (without the newline).
    Line(&'a str),
    /// A line that exceeded [`MAX_LINE`]; it was discarded.
    TooLong,
}

impl LineEditor {
    /// An empty line.
    pub const fn new() -> Self {
        Self {
            buffer: [0; MAX_LINE],
            len: 0,
            too_long: false,
            last_was_cr: false,
        }
    }

    /// Takes one byte; `echo` receives what should be echoed to the terminal.
    pub fn feed(&mut self, byte: u8, echo: &mut dyn FnMut(&[u8])) -> Edit<'_> {
        let was_cr = core::mem::replace(&mut self.last_was_cr, byte == b'\r');
        match byte {
            b'\n' if was_cr => Edit::Pending,
            b'\r' | b'\n' => {
                echo(b"\n");
                let (len, too_long) = (self.len, self.too_long);
                self.len = 0;
                self.too_long = false;
                if too_long {
                    Edit::TooLong
                } else {
                    // Only printable ASCII is stored, so this is valid UTF-8.
                    Edit::Line(core::str::from_utf8(&self.buffer[..len]).unwrap_or(""))
                }
            }
            0x7f | 0x08 => {
                if self.len > 0 && !self.too_long {
                    self.len -= 1;
                    echo(b"\x08 \x08");
                }
                Edit::Pending
            }
            0x20..=0x7e => {
                if self.len == MAX_LINE {
                    self.too_long = true;
                } else if !self.too_long {
                    self.buffer[self.len] = byte;
                    self.len += 1;
                    echo(&[byte]);
                }
                Edit::Pending
            }
            _ => Edit::Pending,
        }
    }
}

impl Default for LineEditor {
    fn default() -> Self {
        Self::new()
    }
}

/// Writes straight to the serial console (no allocation).
pub struct ConsoleWriter;

impl Write for ConsoleWriter {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        console::write_bytes(s.as_bytes());
        Ok(())
    }
}
