//! KFENCE reports in Linux's layout (`Documentation/dev-tools/kfence.rst`):
//!
//! ```text
//! ==================================================================
//! BUG: KFENCE: out-of-bounds write in magpie::debug::lkdtm::kfence_oob_right+0x5c
//!
//! Out-of-bounds write at 0xffffc00000104000 (1B right of kfence-#0):
//!  magpie::debug::lkdtm::kfence_oob_right+0x5c
//!  magpie::shell::lkdtm::cmd_lkdtm+0x1b2
//!
//! kfence-#0: 0xffffc00000103fc0-0xffffc00000103fff, size=64, cache=lkdtm-kfence
//!
//! allocated by task 0 on cpu 0 at 1.218s:
//!  magpie::debug::lkdtm::kfence_oob_right+0x2a
//! ==================================================================
//! ```

use core::fmt;

use super::object::{KfenceObject, KfenceStack, KfenceState};
use crate::reports::error::ReportFormat;

/// What a KFENCE report is about (Linux `enum kfence_error_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KfenceBug {
    /// An access to a guard page next to an allocated object.
    OutOfBounds,
    /// An access to a freed object (or the guard page beside it).
    UseAfterFree,
    /// The canary beside an object was overwritten (found at the free).
    Corruption,
    /// An access to the pool that belongs to no object.
    InvalidAccess,
    /// A free of a pool address that is not an allocated object's start
    /// (a double free included), or to the wrong cache.
    InvalidFree,
}

impl KfenceBug {
    /// The name on the `BUG: KFENCE:` line (without the access type).
    pub fn name(self) -> &'static str {
        match self {
            KfenceBug::OutOfBounds => "out-of-bounds",
            KfenceBug::UseAfterFree => "use-after-free",
            KfenceBug::Corruption => "memory corruption",
            KfenceBug::InvalidAccess => "invalid",
            KfenceBug::InvalidFree => "invalid free",
        }
    }
}

/// One KFENCE report: see [`KfenceReport::display`] for the text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KfenceReport {
    /// What happened.
    pub kind: KfenceBug,
    /// For an access: a write (`true`) or a read.
    pub write: Option<bool>,
    /// The faulting address, the freed pointer, or the first corrupted byte.
    pub addr: usize,
    /// The object it concerns (the nearest one for a guard page).
    pub object: Option<KfenceObject>,
    /// Where it happened (the faulting code, or the free).
    pub stack: KfenceStack,
    /// Corruption: 16 bytes from `addr` (`None`: the object's own bytes or
    /// past the page), each with whether it differs from the canary.
    pub bytes: [Option<(u8, bool)>; 16],
}

impl KfenceReport {
    pub(crate) fn new(
        kind: KfenceBug,
        addr: usize,
        object: Option<KfenceObject>,
        stack: KfenceStack,
    ) -> KfenceReport {
        KfenceReport {
            kind,
            write: None,
            addr,
            object,
            stack,
            bytes: [None; 16],
        }
    }

    /// Where `addr` lies relative to the object: `(bytes, "left")`,
    /// `(bytes, "right")`, or `None` inside it.
    pub fn relation(&self) -> Option<(usize, &'static str)> {
        let object = self.object?;
        if self.addr < object.addr {
            Some((object.addr - self.addr, "left"))
        } else if self.addr >= object.addr + object.size {
            Some((self.addr - (object.addr + object.size) + 1, "right"))
        } else {
            None
        }
    }

    /// The report as text, frames symbolized and times converted by `format`.
    pub fn display<'a>(&'a self, format: &'a dyn ReportFormat) -> KfenceReportDisplay<'a> {
        KfenceReportDisplay {
            report: self,
            format,
        }
    }
}

/// A [`KfenceReport`] as text.
pub struct KfenceReportDisplay<'a> {
    report: &'a KfenceReport,
    format: &'a dyn ReportFormat,
}

const RULE: &str = "==================================================================";

impl KfenceReportDisplay<'_> {
    fn access(&self) -> &'static str {
        match self.report.write {
            Some(true) => " write",
            Some(false) => " read",
            None => "",
        }
    }

    fn stack(&self, f: &mut fmt::Formatter<'_>, stack: &KfenceStack) -> fmt::Result {
        for &frame in stack.frames() {
            f.write_str(" ")?;
            self.format.symbol(frame, f)?;
            f.write_str("\n")?;
        }
        Ok(())
    }

    /// `allocated by task 0 on cpu N at S.UUUUUUs:` and the stack.
    fn transaction(
        &self,
        f: &mut fmt::Formatter<'_>,
        what: &str,
        stack: &KfenceStack,
    ) -> fmt::Result {
        let ns = self.format.nanoseconds(stack.time);
        let (s, us) = (ns / 1_000_000_000, ns % 1_000_000_000 / 1000);
        writeln!(
            f,
            "\n{what} by task 0 on cpu {} at {s}.{us:06}s:",
            stack.cpu
        )?;
        self.stack(f, stack)
    }
}

impl fmt::Display for KfenceReportDisplay<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let report = self.report;
        let access = self.access();
        writeln!(f, "{RULE}")?;
        write!(f, "BUG: KFENCE: {}{access} in ", report.kind.name())?;
        match report.stack.frames().first() {
            Some(&frame) => self.format.symbol(frame, f)?,
            None => f.write_str("?")?,
        }
        writeln!(f, "\n")?;
        let position = |f: &mut fmt::Formatter<'_>| -> fmt::Result {
            match (report.object, report.relation()) {
                (Some(object), Some((bytes, side))) if report.kind != KfenceBug::InvalidFree => {
                    write!(f, "({bytes}B {side} of kfence-#{})", object.index)
                }
                (Some(object), _) => write!(f, "(in kfence-#{})", object.index),
                (None, _) => f.write_str("(in the pool)"),
            }
        };
        match report.kind {
            KfenceBug::OutOfBounds => write!(f, "Out-of-bounds{access} at {:#x} ", report.addr)?,
            KfenceBug::UseAfterFree => write!(f, "Use-after-free{access} at {:#x} ", report.addr)?,
            KfenceBug::InvalidAccess => write!(f, "Invalid{access} at {:#x} ", report.addr)?,
            KfenceBug::InvalidFree => write!(f, "Invalid free of {:#x} ", report.addr)?,
            KfenceBug::Corruption => {
                write!(f, "Corrupted memory at {:#x} [", report.addr)?;
                for byte in report.bytes.iter().flatten() {
                    match byte {
                        (value, true) => write!(f, " {value:#04x}")?,
                        (_, false) => f.write_str(" .")?,
                    }
                }
                f.write_str(" ] ")?;
            }
        }
        position(f)?;
        writeln!(f, ":")?;
        self.stack(f, &report.stack)?;
        if let Some(object) = report.object {
            writeln!(f)?;
            write!(f, "kfence-#{}: ", object.index)?;
            if object.state == KfenceState::Unused {
                writeln!(f, "unused")?;
            } else {
                writeln!(
                    f,
                    "{:#x}-{:#x}, size={}, cache={}",
                    object.addr,
                    object.addr + object.size - 1,
                    object.size,
                    object.cache.as_str()
                )?;
                self.transaction(f, "allocated", &object.alloc)?;
                if object.state == KfenceState::Freed {
                    self.transaction(f, "freed", &object.free)?;
                }
            }
        }
        write!(f, "{RULE}")
    }
}
