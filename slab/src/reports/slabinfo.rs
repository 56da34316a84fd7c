//! `slabinfo`: Linux `/proc/slabinfo` version 2.1, to the column.

use core::fmt::{self, Write};

use crate::allocator::Kmem;
use crate::platform::Platform;
use crate::stats::CacheStats;

/// The two header lines of version 2.1.
///
/// # Errors
///
/// The error of `out`, as is.
pub fn write_slabinfo_header(out: &mut dyn Write) -> fmt::Result {
    writeln!(out, "slabinfo - version: 2.1")?;
    writeln!(
        out,
        "# name            <active_objs> <num_objs> <objsize> <objperslab> <pagesperslab> \
         : tunables <limit> <batchcount> <sharedfactor> \
         : slabdata <active_slabs> <num_slabs> <sharedavail>"
    )
}

/// One cache's line, Linux `cache_show`: `%-17s %6lu %6lu %6u %4u %4d :
/// tunables %4u %4u %4u : slabdata %6lu %6lu %6lu`. Active objects are
/// those out of the slab layer (with callers or resting in magazines), as
/// Linux SLAB counted them; the magazine size is shown as `limit` and
/// `batchcount` (rounds moved per depot exchange), `sharedfactor` is 0,
/// and `sharedavail` is the rounds held in the depot.
///
/// # Errors
///
/// The error of `out`, as is.
pub fn write_slabinfo_line(out: &mut dyn Write, name: &str, stats: &CacheStats) -> fmt::Result {
    let active = stats.nr_allocated + stats.nr_cpu_cached_objs + stats.nr_depot_objs;
    writeln!(
        out,
        "{name:<17} {active:>6} {:>6} {:>6} {:>4} {:>4} : tunables {:>4} {:>4} {:>4} : slabdata {:>6} {:>6} {:>6}",
        stats.nr_total_objs,
        stats.obj_size,
        stats.objs_per_slab,
        stats.nr_pages_per_slab,
        stats.magsize,
        stats.magsize,
        0,
        stats.nr_active_slabs,
        stats.nr_slabs,
        stats.nr_depot_objs,
    )
}

/// The whole report: the header and one line per cache, in creation
/// order.
///
/// # Errors
///
/// The error of `out`, as is.
pub fn slabinfo<P: Platform>(out: &mut dyn Write, allocator: &Kmem<P>) -> fmt::Result {
    write_slabinfo_header(out)?;
    let mut result = Ok(());
    allocator.for_each_cache(|cache| {
        if result.is_ok() {
            result = write_slabinfo_line(out, cache.name(), &cache.stats());
        }
    });
    result
}
