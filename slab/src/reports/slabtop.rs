//! `slabtop`: Linux `slabtop(1)`'s summary and columns (`procps`
//! `slabtop.c`), plus what the magazine layer adds: hits (allocations a
//! CPU's magazines served), misses (allocations that went to the depot or
//! the slab layer), depot lock contention and magazine resizes (the
//! depot moving to a larger magazine, Bonwick & Adams 2001 §3.7), as
//! deltas over the interval since the previous frame.

use core::fmt::{self, Write};

use crate::allocator::Kmem;
use crate::platform::Platform;
use crate::stats::CacheStats;

use super::Nanoseconds;
use super::time::pad;

/// How [`slabtop`] orders its rows (each largest first but for the name).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SlabtopSort {
    /// Number of objects (`slabtop -s o`, its default).
    #[default]
    Objects,
    /// Cache size in bytes (`-s c`).
    CacheSize,
    /// Name, A to Z (`-s n`).
    Name,
    /// Magazine misses in the interval (Magpie's).
    Misses,
}

impl SlabtopSort {
    /// The sort `slabtop -s KEY` means: `o`, `c`, `n`, or `m` (misses).
    pub fn from_key(key: &str) -> Option<SlabtopSort> {
        match key {
            "o" => Some(SlabtopSort::Objects),
            "c" => Some(SlabtopSort::CacheSize),
            "n" => Some(SlabtopSort::Name),
            "m" => Some(SlabtopSort::Misses),
            _ => None,
        }
    }
}

/// One cache's figures in a frame. Counters (`nr_hits`, `nr_misses`,
/// `depot_contention`, `nr_magazine_resizes`) are totals since the cache was created; the frame
/// prints their change since the previous frame's row of the same cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlabtopRow {
    /// The cache's name.
    pub name: &'static str,
    /// The cache's id (matches rows across frames).
    pub id: u32,
    /// Objects in all slabs.
    pub nr_objs: usize,
    /// Objects out of the slab layer (with callers or in magazines).
    pub nr_active: usize,
    /// Object size in bytes.
    pub obj_size: usize,
    /// Slabs.
    pub nr_slabs: usize,
    /// Objects per slab.
    pub objs_per_slab: usize,
    /// Bytes of slab pages.
    pub cache_bytes: usize,
    /// Rounds per magazine now (0: no magazine layer).
    pub magsize: usize,
    /// Allocations served by per-CPU magazines, ever.
    pub nr_hits: u64,
    /// Allocations that missed the magazines, ever.
    pub nr_misses: u64,
    /// Times the depot lock was contended, ever.
    pub depot_contention: u64,
    /// Times the magazine size grew, ever.
    pub nr_magazine_resizes: u64,
}

/// A row holding nothing (to fill the caller's buffers).
pub const EMPTY_SLABTOP_ROW: SlabtopRow = SlabtopRow {
    name: "",
    id: 0,
    nr_objs: 0,
    nr_active: 0,
    obj_size: 0,
    nr_slabs: 0,
    objs_per_slab: 0,
    cache_bytes: 0,
    magsize: 0,
    nr_hits: 0,
    nr_misses: 0,
    depot_contention: 0,
    nr_magazine_resizes: 0,
};

/// The previous frame a new one is compared with.
#[derive(Debug, Clone, Copy)]
pub struct SlabtopSample<'a> {
    /// Its rows (any order).
    pub rows: &'a [SlabtopRow],
    /// Nanoseconds since it was taken.
    pub elapsed_ns: u64,
}

impl SlabtopRow {
    fn of<P: Platform>(allocator: &Kmem<P>, cache: &'static crate::KmemCache<P>) -> Self {
        let nr_hits = (0..allocator.stats().nr_cpus())
            .map(|cpu| cache.cpu_stats(cpu).nr_allocs)
            .fold(0u64, u64::wrapping_add);
        SlabtopRow::from_stats(cache.name(), cache.id(), &cache.stats(), nr_hits)
    }

    /// The row of a cache named `name` (id `id`) with statistics `stats`,
    /// whose CPUs' magazines served `nr_hits` allocations ever (a reader
    /// of a memory image builds its rows so).
    pub fn from_stats(name: &'static str, id: u32, stats: &CacheStats, nr_hits: u64) -> Self {
        SlabtopRow {
            name,
            id,
            nr_objs: stats.nr_total_objs,
            nr_active: stats.nr_allocated + stats.nr_cpu_cached_objs + stats.nr_depot_objs,
            obj_size: stats.obj_size,
            nr_slabs: stats.nr_slabs,
            objs_per_slab: stats.objs_per_slab,
            cache_bytes: stats.total_bytes,
            magsize: stats.magsize,
            nr_hits,
            nr_misses: stats.nr_allocs_ever.wrapping_sub(nr_hits),
            depot_contention: stats.depot_contention,
            nr_magazine_resizes: stats.nr_magazine_resizes,
        }
    }

    /// `(hits, misses, contention, resizes)` since `previous`'s row of
    /// this cache (all of them when it has none).
    fn deltas(&self, previous: Option<&SlabtopSample<'_>>) -> (u64, u64, u64, u64) {
        let before = previous.and_then(|sample| {
            sample
                .rows
                .iter()
                .find(|row| row.id == self.id && row.name == self.name)
        });
        match before {
            Some(row) => (
                self.nr_hits.wrapping_sub(row.nr_hits),
                self.nr_misses.wrapping_sub(row.nr_misses),
                self.depot_contention.wrapping_sub(row.depot_contention),
                self.nr_magazine_resizes
                    .wrapping_sub(row.nr_magazine_resizes),
            ),
            None => (
                self.nr_hits,
                self.nr_misses,
                self.depot_contention,
                self.nr_magazine_resizes,
            ),
        }
    }
}

/// Writes `numerator / denominator` as a percentage with one decimal.
fn percent(numerator: usize, denominator: usize) -> impl fmt::Display {
    let permille = (numerator as u128 * 1000)
        .checked_div(denominator as u128)
        .unwrap_or(0);
    fmt::from_fn(move |f| pad(f, format_args!("{}.{}%", permille / 10, permille % 10)))
}

/// Kibibytes with two decimals, as slabtop's `%.2fK`.
fn kib(bytes: usize) -> impl fmt::Display {
    let hundredths = bytes as u128 * 100 / 1024;
    fmt::from_fn(move |f| {
        pad(
            f,
            format_args!("{}.{:02}K", hundredths / 100, hundredths % 100),
        )
    })
}

/// One frame: reads every cache into `rows` (at most `rows.len()`
/// caches: the rest are counted in the summary and a last line), sorts
/// them by `sort`, and writes slabtop's summary and table:
///
/// ```text
///  Active / Total Objects (% used)    : 812 / 1390 (58.4%)
///  Active / Total Slabs (% used)      : 40 / 41 (97.5%)
///  Active / Total Caches (% used)     : 15 / 70 (21.4%)
///  Active / Total Size (% used)       : 120.50K / 260.00K (46.3%)
///  Minimum / Average / Maximum Object : 0.01K / 0.19K / 4.00K
///  Magazines over 1.002 s             : 1200 hits, 31 misses (97.4% hits), 0 depot contention
///
///   OBJS ACTIVE  USE OBJ SIZE  SLABS OBJ/SLAB CACHE SIZE NAME                      MAG     HITS   MISSES CONTEND RESIZE
///    512    130  25%    0.06K      2      256         8K kmalloc-64                 15      120        3       0      0
/// ```
///
/// `previous` is the frame before (`None` for the first: counters since
/// boot). Returns the number of rows filled, for the caller to keep as
/// the next frame's `previous`. The columns up to NAME are Linux's
/// (`%6u %6u %3u%% %7.2fK %6u %8u %9uK %-23s`); MAG is the magazine
/// size, HITS, MISSES, CONTEND and RESIZE (magazine size growths) the
/// deltas since `previous`.
///
/// # Errors
///
/// The error of `out`, as is.
pub fn slabtop<P: Platform>(
    out: &mut dyn Write,
    allocator: &Kmem<P>,
    rows: &mut [SlabtopRow],
    previous: Option<SlabtopSample<'_>>,
    sort: SlabtopSort,
) -> Result<usize, fmt::Error> {
    let mut nr_rows = 0;
    let mut totals = SlabtopTotals::default();
    allocator.for_each_cache(|cache| {
        totals.add(&cache.stats());
        if let Some(slot) = rows.get_mut(nr_rows) {
            *slot = SlabtopRow::of(allocator, cache);
            nr_rows += 1;
        }
    });
    write_slabtop(out, &totals, &mut rows[..nr_rows], previous, sort)?;
    Ok(nr_rows)
}

/// The summary figures of a [`slabtop`] frame: every cache's statistics
/// [`add`](SlabtopTotals::add)ed (those without a row too).
#[derive(Debug, Clone, Copy)]
pub struct SlabtopTotals {
    nr_caches: usize,
    nr_active_caches: usize,
    objs: usize,
    active_objs: usize,
    slabs: usize,
    active_slabs: usize,
    bytes: usize,
    active_bytes: usize,
    min_size: usize,
    max_size: usize,
    sum_size: usize,
}

impl Default for SlabtopTotals {
    fn default() -> Self {
        SlabtopTotals {
            nr_caches: 0,
            nr_active_caches: 0,
            objs: 0,
            active_objs: 0,
            slabs: 0,
            active_slabs: 0,
            bytes: 0,
            active_bytes: 0,
            min_size: usize::MAX,
            max_size: 0,
            sum_size: 0,
        }
    }
}

impl SlabtopTotals {
    /// Count one cache.
    pub fn add(&mut self, stats: &CacheStats) {
        let active = stats.nr_allocated + stats.nr_cpu_cached_objs + stats.nr_depot_objs;
        self.nr_caches += 1;
        self.nr_active_caches += usize::from(stats.nr_active_slabs > 0);
        self.objs += stats.nr_total_objs;
        self.active_objs += active;
        self.slabs += stats.nr_slabs;
        self.active_slabs += stats.nr_active_slabs;
        self.bytes += stats.total_bytes;
        self.active_bytes += active * stats.obj_size;
        self.min_size = self.min_size.min(stats.obj_size);
        self.max_size = self.max_size.max(stats.obj_size);
        self.sum_size += stats.obj_size;
    }
}

/// A [`slabtop`] frame of rows the caller read (a reader of a memory
/// image): `rows` are sorted by `sort` in place, then written under the
/// summary of `totals`; a last line counts the caches `totals` holds
/// beyond `rows`.
///
/// # Errors
///
/// The error of `out`, as is.
pub fn write_slabtop(
    out: &mut dyn Write,
    totals: &SlabtopTotals,
    rows: &mut [SlabtopRow],
    previous: Option<SlabtopSample<'_>>,
    sort: SlabtopSort,
) -> fmt::Result {
    let SlabtopTotals {
        nr_caches,
        nr_active_caches,
        objs,
        active_objs,
        slabs,
        active_slabs,
        bytes,
        active_bytes,
        min_size,
        max_size,
        sum_size,
    } = *totals;
    let nr_rows = rows.len();
    let key_deltas = |row: &SlabtopRow| row.deltas(previous.as_ref());
    match sort {
        SlabtopSort::Objects => {
            rows.sort_unstable_by_key(|row| (core::cmp::Reverse(row.nr_objs), row.name))
        }
        SlabtopSort::CacheSize => {
            rows.sort_unstable_by_key(|row| (core::cmp::Reverse(row.cache_bytes), row.name))
        }
        SlabtopSort::Name => rows.sort_unstable_by_key(|row| (row.name, row.id)),
        SlabtopSort::Misses => {
            rows.sort_unstable_by_key(|row| (core::cmp::Reverse(key_deltas(row).1), row.name))
        }
    }
    writeln!(
        out,
        " Active / Total Objects (% used)    : {active_objs} / {objs} ({})",
        percent(active_objs, objs)
    )?;
    writeln!(
        out,
        " Active / Total Slabs (% used)      : {active_slabs} / {slabs} ({})",
        percent(active_slabs, slabs)
    )?;
    writeln!(
        out,
        " Active / Total Caches (% used)     : {nr_active_caches} / {nr_caches} ({})",
        percent(nr_active_caches, nr_caches)
    )?;
    writeln!(
        out,
        " Active / Total Size (% used)       : {} / {} ({})",
        kib(active_bytes),
        kib(bytes),
        percent(active_bytes, bytes)
    )?;
    writeln!(
        out,
        " Minimum / Average / Maximum Object : {} / {} / {}",
        kib(if nr_caches == 0 { 0 } else { min_size }),
        kib(sum_size.checked_div(nr_caches).unwrap_or(0)),
        kib(max_size)
    )?;
    let (mut hits, mut misses, mut contention) = (0u64, 0u64, 0u64);
    for row in rows.iter() {
        let (row_hits, row_misses, row_contention, _) = row.deltas(previous.as_ref());
        hits = hits.wrapping_add(row_hits);
        misses = misses.wrapping_add(row_misses);
        contention = contention.wrapping_add(row_contention);
    }
    match &previous {
        Some(sample) => write!(
            out,
            " Magazines over {:<20}: ",
            Nanoseconds(sample.elapsed_ns)
        )?,
        None => write!(out, " Magazines since boot               : ")?,
    }
    writeln!(
        out,
        "{hits} hits, {misses} misses ({} hits), {contention} depot contention",
        percent(hits as usize, hits.wrapping_add(misses) as usize)
    )?;
    writeln!(out)?;
    writeln!(
        out,
        "  OBJS ACTIVE  USE OBJ SIZE  SLABS OBJ/SLAB CACHE SIZE NAME                     {:>4} {:>8} {:>8} {:>7} {:>6}",
        "MAG", "HITS", "MISSES", "CONTEND", "RESIZE"
    )?;
    for row in rows.iter() {
        let (row_hits, row_misses, row_contention, row_resizes) = row.deltas(previous.as_ref());
        let used = (row.nr_active * 100).checked_div(row.nr_objs).unwrap_or(0);
        writeln!(
            out,
            "{:>6} {:>6} {:>3}% {:>8} {:>6} {:>8} {:>9}K {:<23} {:>5} {:>8} {:>8} {:>7} {:>6}",
            row.nr_objs,
            row.nr_active,
            used,
            kib(row.obj_size),
            row.nr_slabs,
            row.objs_per_slab,
            row.cache_bytes / 1024,
            row.name,
            row.magsize,
            row_hits,
            row_misses,
            row_contention,
            row_resizes
        )?;
    }
    if nr_caches > nr_rows {
        writeln!(
            out,
            "({} more caches not shown: a larger row buffer shows them)",
            nr_caches - nr_rows
        )?;
    }
    Ok(())
}

/// Below this share of magazine hits since boot, [`write_slabtop_hits_note`] explains.
const LOW_HIT_PERCENT: u64 = 50;

/// Under a frame counted since boot (`slabtop --once`) whose rows hit the
/// magazines for fewer than half of their allocations: one line saying
/// why (magazines start empty). Writes nothing otherwise.
///
/// # Errors
///
/// The error of `out`, as is.
pub fn write_slabtop_hits_note(out: &mut dyn Write, rows: &[SlabtopRow]) -> fmt::Result {
    let hits = rows
        .iter()
        .map(|row| row.nr_hits)
        .fold(0u64, u64::wrapping_add);
    let misses = rows
        .iter()
        .map(|row| row.nr_misses)
        .fold(0u64, u64::wrapping_add);
    let total = u128::from(hits) + u128::from(misses);
    if total > 0 && u128::from(hits) * 100 < total * u128::from(LOW_HIT_PERCENT) {
        writeln!(
            out,
            "(few hits: magazines start empty and fill only as objects are freed, so a fresh \
             boot's allocations miss to the slab layer; the live view counts each interval)"
        )?;
    }
    Ok(())
}
