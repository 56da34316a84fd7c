//! `whatis` (illumos mdb `::whatis`): which cache, object and offset an
//! address is, allocated or free, with the object's last transactions.

use core::fmt::{self, Write};

use crate::allocator::Kmem;
use crate::debug::AuditRecord;
use crate::platform::Platform;
use crate::reports::error::{RawFormat, ReportFormat, write_transaction};
use crate::verify::{ObjectRegion, WhatIs};

/// Writes what `address` is ([`WhatIs::display`]), or
/// `0x... is not in any slab` for an address outside every slab
/// (page-granular kmalloc blocks, memory not the allocator's).
///
/// # Errors
///
/// The error of `out`, as is.
pub fn whatis<P: Platform>(
    out: &mut dyn Write,
    allocator: &Kmem<P>,
    address: usize,
    format: &dyn ReportFormat,
) -> fmt::Result {
    match allocator.debug().whatis(address) {
        Some(info) => write!(out, "{}", info.display(format)),
        None => writeln!(out, "{address:#x} is not in any slab"),
    }
}

impl<P: Platform> WhatIs<P> {
    /// The answer as text, frames and times rendered by `format`:
    ///
    /// ```text
    /// 0xffff800000123050 is allocated from kmalloc-64: object 0xffff800000123040+0x10 of 64 bytes, slab 0x...
    /// 0xffff8000001230c8 is allocated from kmalloc-104: redzone of object 0xffff800000123040 (+0x88, past its 104 bytes), slab 0x...
    /// last alloc transaction on buffer 0xffff800000123040:
    /// thread=cpu0  time=T+1.234 s  slab=0x...  cache: kmalloc-64
    ///   #01 [<0x...>] function+0xoff
    /// ```
    pub fn display<'a>(&'a self, format: &'a dyn ReportFormat) -> impl fmt::Display + 'a {
        WhatIsDisplay { info: self, format }
    }
}

/// [`WhatIs`] as text: see [`WhatIs::display`].
pub(crate) struct WhatIsDisplay<'a, P: Platform> {
    info: &'a WhatIs<P>,
    format: &'a dyn ReportFormat,
}

impl<P: Platform> fmt::Display for WhatIsDisplay<'_, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let info = self.info;
        if info.allocated {
            write!(
                f,
                "{:#x} is allocated from {}",
                info.addr,
                info.cache.name()
            )?;
        } else {
            write!(
                f,
                "{:#x} is free in {} (in a {})",
                info.addr,
                info.cache.name(),
                info.resting
            )?;
        }
        match info.region {
            ObjectRegion::Object => writeln!(
                f,
                ": object {:#x}+{:#x} of {} bytes, slab {:#x}",
                info.object,
                info.offset,
                info.cache.obj_size(),
                info.slab
            )?,
            // Past the object: say where, not "+0x88 of 64 bytes".
            region => writeln!(
                f,
                ": {} of object {:#x} (+{:#x}, past its {} bytes), slab {:#x}",
                region.name(),
                info.object,
                info.offset,
                info.cache.obj_size(),
                info.slab
            )?,
        }
        for (which, record) in [
            ("last alloc", info.last_alloc),
            ("last free", info.last_free),
        ] {
            if let Some(record) = record.filter(AuditRecord::is_recorded) {
                write_transaction(
                    f,
                    which,
                    info.object,
                    &record,
                    info.slab,
                    info.cache.name(),
                    self.format,
                )?;
            }
        }
        Ok(())
    }
}

impl<P: Platform> fmt::Display for WhatIs<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.display(&RawFormat), f)
    }
}
