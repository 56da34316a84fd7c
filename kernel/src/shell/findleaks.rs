//! `kmem findleaks`: objects nothing points to, grouped by allocation
//! site (illumos `::findleaks`; the scan is `crate::debug::findleaks`).

use core::fmt::Write;

use super::{Result, out_of_memory};

/// Run the scan and print what it found.
pub(super) fn findleaks<'a>(out: &mut dyn Write) -> Result<'a> {
    crate::debug::findleaks::find_leaks(out)
        .map(|_| ())
        .map_err(|error| out_of_memory!("the leak scan's table: {error}"))
}
