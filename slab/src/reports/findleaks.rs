//! `findleaks`: illumos mdb `::findleaks`' report of a leak scan
//! ([`crate::leak_scan`]), one line per cache and allocation site:
//!
//! ```text
//! CACHE                 LEAKED           BUFCTL CALLER
//! kmalloc-64                10 ffff800000a31040 kernel/src/shell/kmem.rs:173 cmd_leak
//! ------------------------------------------------------------------------
//!            Total      10 buffers, 640 bytes
//! findleaks: 161 objects, 151 reachable, 90 resting in magazines; 1180 KiB scanned
//! ```
//!
//! `BUFCTL` is the lowest leaked object's address (a representative
//! buffer); `CALLER` the allocation site (`?` without one). The shell's
//! `kmem findleaks` and `magpie-kmem core CORE findleaks` write it with
//! these functions.

use core::fmt::{self, Display, Write};

use crate::leak_scan::LeakSummary;

/// The column header, written before the first group.
///
/// # Errors
///
/// The error of `out`, as is.
pub fn write_findleaks_header(out: &mut dyn Write) -> fmt::Result {
    writeln!(out, "CACHE                 LEAKED           BUFCTL CALLER")
}

/// One group's line: its cache, objects leaked, the lowest one's address
/// and the allocation site (`?` for none).
///
/// # Errors
///
/// The error of `out`, as is.
pub fn write_findleaks_group(
    out: &mut dyn Write,
    cache: &str,
    nr_leaked: usize,
    first: usize,
    site: &dyn Display,
) -> fmt::Result {
    writeln!(out, "{cache:<17} {nr_leaked:>10} {first:016x} {site}")
}

/// The totals after the groups (or that nothing leaked) and the scan's
/// figures.
///
/// # Errors
///
/// The error of `out`, as is.
pub fn write_findleaks_summary(out: &mut dyn Write, summary: &LeakSummary) -> fmt::Result {
    if summary.nr_leaked == 0 {
        writeln!(out, "findleaks: no memory leaks detected")?;
    } else {
        writeln!(
            out,
            "------------------------------------------------------------------------"
        )?;
        writeln!(
            out,
            "           Total {:>7} buffer{}, {} byte{}",
            summary.nr_leaked,
            if summary.nr_leaked == 1 { "" } else { "s" },
            summary.leaked_bytes,
            if summary.leaked_bytes == 1 { "" } else { "s" }
        )?;
    }
    writeln!(
        out,
        "findleaks: {} objects, {} reachable, {} resting in magazines; {} KiB scanned",
        summary.nr_objects,
        summary.nr_reached,
        summary.nr_resting,
        summary.scanned_bytes / 1024
    )
}
