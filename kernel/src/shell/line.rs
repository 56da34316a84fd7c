//! The line editor: console bytes in, command lines out.
//!
//! It refuses rather than drops: every byte typed is kept (up to
//! [`MAX_LINE`]) and either ends up in the line or makes the line an error.
//!
//! | byte | what happens |
//! | --- | --- |
//! | CR, LF, CR LF | ends the line |
//! | backspace (0x08), DEL (0x7f) | removes the last byte |
//! | tab | kept; a word separator like a space (echoed as a space) |
//! | printable ASCII | kept and echoed |
//! | any other (control bytes, escape sequences, non-ASCII / UTF-8) | kept and echoed as `?`; the line is then refused with [`Edit::Invalid`] naming the first such byte and its column |

use core::fmt::{self, Write};

use super::{MAX_LINE, is_line_byte};
use crate::dev::console;

/// Collects a command line from console bytes: echo, backspace, overlong
/// lines, bytes the shell does not take. Feeds on bytes, so it is testable
/// without a console.
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
    /// A line holding a byte that is not printable ASCII or a tab: the
    /// first such byte and its column (from 1). The line was discarded.
    Invalid {
        /// The byte.
        byte: u8,
        /// Its column, from 1.
        column: usize,
    },
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
                let line = &self.buffer[..len];
                if too_long {
                    Edit::TooLong
                } else if let Some(index) = line.iter().position(|&byte| !is_line_byte(byte)) {
                    Edit::Invalid {
                        byte: line[index],
                        column: index + 1,
                    }
                } else {
                    // Only printable ASCII and tabs are left: valid UTF-8.
                    Edit::Line(core::str::from_utf8(line).unwrap_or(""))
                }
            }
            0x7f | 0x08 => {
                if self.len > 0 && !self.too_long {
                    self.len -= 1;
                    echo(b"\x08 \x08");
                }
                Edit::Pending
            }
            _ => {
                if self.len == MAX_LINE {
                    self.too_long = true;
                } else if !self.too_long {
                    self.buffer[self.len] = byte;
                    self.len += 1;
                    echo(match byte {
                        b'\t' => b" ",
                        b' '..=b'~' => core::slice::from_ref(&byte),
                        _ => b"?",
                    });
                }
                Edit::Pending
            }
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
