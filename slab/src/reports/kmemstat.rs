//! `kmemstat` (Akaros `kern/drivers/dev/mem.c`): one line per arena and
//! per slab cache, caches indented beneath the arena they import from.

use core::fmt::{self, Write};

use crate::allocator::Kmem;
use crate::platform::{ArenaStats, PAGE_SIZE, Platform};

/// Width of the name column at indent 0 (4 less per indent level).
pub const KMEMSTAT_NAME_WIDTH: usize = 30;

/// One `kmemstat` line. Amounts are in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KmemstatRow<'a> {
    /// Indent level (4 spaces each): 0 for a base arena, one more per
    /// import.
    pub indent: usize,
    /// Arena or cache name.
    pub name: &'a str,
    /// `A` an arena, `S` a slab cache, `P` page-granular kmalloc, `M` the
    /// allocator's own metadata.
    pub kind: char,
    /// Object size (arena: its quantum; `P` and `M`: the page size, the
    /// unit they take memory in).
    pub objsize: usize,
    /// Bytes the arena or cache holds.
    pub total: usize,
    /// Bytes of `total` handed out (for a cache: objects out of the slab
    /// layer, with callers or in magazines, as Akaros counts them).
    pub alloc: usize,
    /// Allocations ever.
    pub nr_allocs_ever: u64,
    /// Bytes of `total` that hold no object (slab tails, in-slab headers,
    /// padding): Magpie's column after Akaros's.
    pub waste: usize,
}

impl<'a> KmemstatRow<'a> {
    /// The row of an arena (`A`) whose quantum is `quantum` bytes.
    pub fn arena(indent: usize, name: &'a str, quantum: usize, stats: ArenaStats) -> Self {
        KmemstatRow {
            indent,
            name,
            kind: 'A',
            objsize: quantum,
            total: stats.total_bytes,
            alloc: stats.alloc_bytes,
            nr_allocs_ever: stats.nr_allocs_ever,
            waste: 0,
        }
    }

    /// Akaros `kmemstat`: `%-*s: %c :%*llu:%*llu:%*llu:%*llu` with widths
    /// 30 (less 4 per indent level), 8, 15, 15, 12; then `:%*llu` waste,
    /// width 12.
    ///
    /// # Errors
    ///
    /// The error of `out`, as is.
    pub fn write(&self, out: &mut dyn Write) -> fmt::Result {
        for _ in 0..self.indent {
            out.write_str("    ")?;
        }
        let width = KMEMSTAT_NAME_WIDTH.saturating_sub(4 * self.indent);
        writeln!(
            out,
            "{:<width$}: {} :{:>8}:{:>15}:{:>15}:{:>12}:{:>12}",
            self.name,
            self.kind,
            self.objsize,
            self.total,
            self.alloc,
            self.nr_allocs_ever,
            self.waste
        )
    }
}

/// The header line and the dashes under it.
///
/// # Errors
///
/// The error of `out`, as is.
pub fn write_kmemstat_header(out: &mut dyn Write) -> fmt::Result {
    writeln!(
        out,
        "{:<KMEMSTAT_NAME_WIDTH$}:Typ:{:>8}:{:>15}:{:>15}:{:>12}:{:>12}",
        "Arena/Slab Name", "Objsize", "Total Amt", "Alloc Amt", "Allocs Ever", "Waste"
    )?;
    for _ in 0..8 + KMEMSTAT_NAME_WIDTH + 8 + 15 + 15 + 12 + 13 {
        out.write_char('-')?;
    }
    writeln!(out)
}

/// Every cache of `allocator` at `indent` (`S` rows, in creation order),
/// then the allocator's own memory (`slab-metadata`, `M`: page map and
/// bootstrap caches, whose `S` rows count their slabs too; Objsize the
/// page size, its unit; its Allocs Ever column is the number of reaps
/// under memory pressure; its share of the managed memory is
/// [`MetadataStats::total`](crate::MetadataStats::total) over
/// `managed_bytes`, from [`HeapStats::metadata`](crate::HeapStats::metadata))
/// and the page-granular kmalloc blocks (`kmalloc-large`, `P`).
///
/// # Errors
///
/// The error of `out`, as is.
pub fn write_kmemstat_caches<P: Platform>(
    out: &mut dyn Write,
    allocator: &Kmem<P>,
    indent: usize,
) -> fmt::Result {
    let mut result = Ok(());
    allocator.for_each_cache(|cache| {
        if result.is_err() {
            return;
        }
        let stats = cache.stats();
        let out_of_slabs = stats.nr_allocated + stats.nr_cpu_cached_objs + stats.nr_depot_objs;
        result = KmemstatRow {
            indent,
            name: cache.name(),
            kind: 'S',
            objsize: stats.obj_size,
            total: stats.obj_size * stats.nr_total_objs,
            alloc: stats.obj_size * out_of_slabs,
            nr_allocs_ever: stats.nr_allocs_ever,
            waste: stats.waste_bytes,
        }
        .write(out);
    });
    result?;
    let meta = allocator.stats().metadata();
    KmemstatRow {
        indent,
        name: "slab-metadata",
        kind: 'M',
        objsize: PAGE_SIZE,
        total: meta.total(),
        alloc: meta.total(),
        nr_allocs_ever: allocator.stats().nr_pressure_reaps(),
        waste: 0,
    }
    .write(out)?;
    let large = allocator.stats().large();
    KmemstatRow {
        indent,
        name: "kmalloc-large",
        kind: 'P',
        objsize: PAGE_SIZE,
        total: large.live_bytes,
        alloc: large.live_bytes,
        nr_allocs_ever: large.nr_allocs_ever,
        waste: 0,
    }
    .write(out)
}

/// The whole report for an allocator over one page source: the header,
/// the source as an arena named `source_name` (quantum one page), and
/// `write_kmemstat_caches` beneath it. A kernel with more arenas writes
/// the header, its own `KmemstatRow::arena` rows and the caches itself.
///
/// ```text
/// Arena/Slab Name               :Typ: Objsize:      Total Amt:      Alloc Amt: Allocs Ever:       Waste
/// -------------------------------------------------------------------------------------------------------
/// pages                         : A :    4096:         409600:          98304:          24:           0
///     kmalloc-8                 : S :       8:           4064:             16:           2:          32
/// ```
///
/// # Errors
///
/// The error of `out`, as is.
pub fn kmemstat<P: Platform>(
    out: &mut dyn Write,
    allocator: &Kmem<P>,
    source_name: &str,
    source: ArenaStats,
) -> fmt::Result {
    write_kmemstat_header(out)?;
    KmemstatRow::arena(0, source_name, PAGE_SIZE, source).write(out)?;
    write_kmemstat_caches(out, allocator, 1)
}
