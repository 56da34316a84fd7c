//! Times for a person: one formatter, [`Nanoseconds`], for every report
//! and shell line that shows a duration or a time since boot.

use core::fmt::{self, Write};

/// A duration (or a time since the clock's zero) in nanoseconds, written
/// with its unit: `850 ns`, `12.345 µs`, `508.583 ms`, `3.250 s`. Below a
/// microsecond exact; above, three decimals of the largest unit that
/// keeps the integer part non-zero (so six significant figures for times
/// since boot: `T+` forms and bare nanosecond counts are gone). Width and
/// alignment flags apply to the whole text (`{:>12}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Nanoseconds(pub u64);

impl fmt::Display for Nanoseconds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ns = self.0;
        let (scale, unit) = match ns {
            0..1_000 => return pad(f, format_args!("{ns} ns")),
            1_000..1_000_000 => (1_000, "µs"),
            1_000_000..1_000_000_000 => (1_000_000, "ms"),
            _ => (1_000_000_000, "s"),
        };
        let thousandths = u128::from(ns) * 1000 / scale;
        pad(
            f,
            format_args!("{}.{:03} {unit}", thousandths / 1000, thousandths % 1000),
        )
    }
}

/// Writes `args` through `f.pad`, so width and alignment apply to the
/// whole text (formatted on the stack, at most 64 bytes).
pub(crate) fn pad(f: &mut fmt::Formatter<'_>, args: fmt::Arguments<'_>) -> fmt::Result {
    let mut buffer = StackText {
        bytes: [0; 64],
        len: 0,
    };
    buffer.write_fmt(args)?;
    f.pad(core::str::from_utf8(&buffer.bytes[..buffer.len]).map_err(|_| fmt::Error)?)
}

struct StackText {
    bytes: [u8; 64],
    len: usize,
}

impl Write for StackText {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let end = self.len + s.len();
        let slot = self.bytes.get_mut(self.len..end).ok_or(fmt::Error)?;
        slot.copy_from_slice(s.as_bytes());
        self.len = end;
        Ok(())
    }
}
