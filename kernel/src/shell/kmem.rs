//! `kmemstat`, `slabinfo`, `kmalloc`, `kfree`, `leak`, `reap`.

use core::fmt::Write;
use core::ptr::NonNull;

use magpie_slab::CacheStats;

use super::{
    Command, MAX_COUNT, MAX_SIZE, Result, Shell, ShellError, no_args, out_of_memory, parse_number,
    shell_error,
};
use crate::kmem::heap;
use crate::kmem::{self, KPAGES, SLAB};

pub(super) const KMEMSTAT: Command = Command {
    name: "kmemstat",
    help: &[("kmemstat", "arenas and slabs (Akaros kmemstat)")],
    context: "shell",
    run: cmd_kmemstat,
};

pub(super) const REAP: Command = Command {
    name: "reap",
    help: &[(
        "reap [CACHE|all]",
        "give free memory of CACHE (default: all caches) back to its page source",
    )],
    context: "shell reap",
    run: cmd_reap,
};

pub(super) const SLABINFO: Command = Command {
    name: "slabinfo",
    help: &[("slabinfo", "caches in /proc/slabinfo 2.1 format")],
    context: "shell",
    run: cmd_slabinfo,
};

pub(super) const KMALLOC: Command = Command {
    name: "kmalloc",
    help: &[(
        "kmalloc SIZE [COUNT]",
        "allocate COUNT objects of SIZE bytes, keep them",
    )],
    context: "shell kmalloc",
    run: cmd_kmalloc,
};

pub(super) const KFREE: Command = Command {
    name: "kfree",
    help: &[(
        "kfree [COUNT|all]",
        "free the most recently kmalloc'ed objects held",
    )],
    context: "shell kfree",
    run: cmd_kfree,
};

pub(super) const LEAK: Command = Command {
    name: "leak",
    help: &[(
        "leak SIZE [COUNT]",
        "allocate and forget (for leak hunting)",
    )],
    context: "shell leak",
    run: cmd_leak,
};

/// An object allocated by `kmalloc` and held by the shell.
#[derive(Clone, Copy)]
pub struct Held {
    ptr: NonNull<u8>,
    size: usize,
}

fn size_and_count<'a>(args: &[&'a str], command: &'static Command) -> Result<'a, (usize, usize)> {
    let (size, count) = match args {
        [size] => (parse_number(size)?, 1),
        [size, count] => (parse_number(size)?, parse_number(count)?),
        _ => return Err(ShellError::Usage(command)),
    };
    if !(1..=MAX_SIZE).contains(&size) {
        return Err(ShellError::BadSize(size));
    }
    if !(1..=MAX_COUNT).contains(&count) {
        return Err(ShellError::BadCount(count));
    }
    Ok((size, count))
}

/// The error for the `done`-th of `count` allocations of `size` bytes
/// failing with `error`.
fn kmalloc_failed(
    size: usize,
    done: usize,
    count: usize,
    error: magpie_slab::AllocError,
) -> ShellError<'static> {
    match error {
        magpie_slab::AllocError::OutOfMemory => {
            out_of_memory!("kmalloc({size}) failed after {done} of {count} objects")
        }
        other => shell_error!("kmalloc({size}) failed after {done} of {count} objects: {other}"),
    }
}

/// `kmalloc SIZE [COUNT]`: allocates and keeps; prints each address. The
/// list of held objects grows first (fallibly), so every object allocated
/// is held; when memory runs out part-way, the objects allocated so far
/// stay held and one `error: out of memory` line says how many there are.
#[inline(never)]
fn cmd_kmalloc<'a>(shell: &mut Shell, args: &[&'a str], out: &mut dyn Write) -> Result<'a> {
    let (size, count) = size_and_count(args, &KMALLOC)?;
    if shell.held.try_reserve(count).is_err() {
        return Err(out_of_memory!(
            "{} bytes to hold {count} more objects",
            (shell.held.len() + count) * core::mem::size_of::<Held>()
        ));
    }
    for done in 0..count {
        let ptr =
            crate::kmalloc!(size, 1).map_err(|error| kmalloc_failed(size, done, count, error))?;
        // Cannot grow: `count` slots were reserved above.
        shell.held.push(Held { ptr, size });
        let _ = writeln!(out, "{:#018x}", ptr.as_ptr() as usize);
    }
    Ok(())
}

/// `kfree [COUNT|all]`: frees the most recently allocated objects held.
fn cmd_kfree<'a>(shell: &mut Shell, args: &[&'a str], out: &mut dyn Write) -> Result<'a> {
    let count = match args {
        [] => 1,
        ["all"] => shell.held.len(),
        [number] => match parse_number(number)? {
            0 => {
                return Err(shell_error!(
                    "kfree 0 frees nothing: give 1 or more, or all"
                ));
            }
            count => count,
        },
        _ => return Err(ShellError::Usage(&KFREE)),
    };
    if count > shell.held.len() {
        return Err(ShellError::NotHeld {
            asked: count,
            held: shell.held.len(),
        });
    }
    for _ in 0..count {
        let Some(held) = shell.held.pop() else { break };
        // SAFETY: `held.ptr` came from SLAB.kmalloc and was popped from
        // `held`, so nothing else refers to it and it is freed once.
        match unsafe { SLAB.kfree(held.ptr) } {
            Ok(()) => {
                let _ = writeln!(out, "{:#018x}", held.ptr.as_ptr() as usize);
            }
            Err(error) => {
                let _ = writeln!(out, "error: kfree of {}-byte object: {error}", held.size);
            }
        }
    }
    Ok(())
}

/// `leak SIZE [COUNT]`: allocates and forgets, to give the trace something to find.
#[inline(never)]
fn cmd_leak<'a>(_: &mut Shell, args: &[&'a str], out: &mut dyn Write) -> Result<'a> {
    let (size, count) = size_and_count(args, &LEAK)?;
    for done in 0..count {
        let ptr =
            crate::kmalloc!(size, 1).map_err(|error| kmalloc_failed(size, done, count, error))?;
        let _ = writeln!(out, "{:#018x}", ptr.as_ptr() as usize);
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// kmemstat

const KMEMSTAT_NAME: usize = 30;

/// One `kmemstat` line: an arena (`A`), a slab cache (`S`) or the
/// page-granular kmalloc pseudo-cache (`P`). Amounts are in bytes.
struct KmemstatRow<'a> {
    indent: usize,
    name: &'a str,
    kind: char,
    objsize: usize,
    total: usize,
    alloc: usize,
    nr_allocs_ever: u64,
    /// Bytes of `total` that hold no object (slab tails, in-slab headers,
    /// padding).
    waste: usize,
}

impl KmemstatRow<'_> {
    /// Akaros `kmemstat`: `%-*s: %c :%*llu:%*llu:%*llu:%*llu` with widths
    /// 30 (less 4 per indent level), 8, 15, 15, 12; then Magpie's
    /// `:%*llu` waste, width 12.
    fn write(&self, out: &mut dyn Write) {
        for _ in 0..self.indent {
            let _ = out.write_str("    ");
        }
        let width = KMEMSTAT_NAME - 4 * self.indent;
        let _ = writeln!(
            out,
            "{:<width$}: {} :{:>8}:{:>15}:{:>15}:{:>12}:{:>12}",
            self.name,
            self.kind,
            self.objsize,
            self.total,
            self.alloc,
            self.nr_allocs_ever,
            self.waste
        );
    }

    fn arena(
        indent: usize,
        name: &str,
        quantum: usize,
        stats: magpie_slab::ArenaStats,
    ) -> KmemstatRow<'_> {
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
}

fn cmd_kmemstat<'a>(_: &mut Shell, args: &[&'a str], out: &mut dyn Write) -> Result<'a> {
    no_args(args, &KMEMSTAT)?;
    let _ = writeln!(
        out,
        "{:<KMEMSTAT_NAME$}:Typ:{:>8}:{:>15}:{:>15}:{:>12}:{:>12}",
        "Arena/Slab Name", "Objsize", "Total Amt", "Alloc Amt", "Allocs Ever", "Waste"
    );
    for _ in 0..8 + KMEMSTAT_NAME + 8 + 15 + 15 + 12 + 13 {
        let _ = out.write_char('-');
    }
    let _ = writeln!(out);
    let page = magpie_slab::PAGE_SIZE;
    KmemstatRow::arena(0, "base", page, kmem::base_stats()).write(out);
    KmemstatRow::arena(1, "kpages", page, magpie_slab::PageSource::stats(&KPAGES)).write(out);
    SLAB.for_each_cache(|cache| {
        let stats = cache.stats();
        // Akaros counts objects out of the slab layer: with callers or in magazines.
        let out_of_slabs = stats.nr_allocated + stats.nr_cpu_cached_objs + stats.nr_depot_objs;
        KmemstatRow {
            indent: 2,
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
    // The allocator's own memory: page map and bootstrap caches (whose
    // rows above count their slabs too), Objsize the share of managed
    // memory in hundredths of a percent.
    let meta = SLAB.metadata_stats();
    KmemstatRow {
        indent: 2,
        name: "slab-metadata",
        kind: 'M',
        objsize: (meta.total() * 10_000)
            .checked_div(meta.managed_bytes)
            .unwrap_or(0),
        total: meta.total(),
        alloc: meta.total(),
        nr_allocs_ever: SLAB.nr_pressure_reaps(),
        waste: 0,
    }
    .write(out);
    let large = SLAB.large_stats();
    KmemstatRow {
        indent: 2,
        name: "kmalloc-large",
        kind: 'P',
        objsize: page,
        total: large.live_bytes,
        alloc: large.live_bytes,
        nr_allocs_ever: large.nr_allocs_ever,
        waste: 0,
    }
    .write(out);
    let (used, free) = heap::bootstrap_usage();
    KmemstatRow {
        indent: 0,
        name: "bootstrap-heap",
        kind: 'A',
        objsize: 1,
        total: used + free,
        alloc: used,
        nr_allocs_ever: 0,
        waste: 0,
    }
    .write(out);
    Ok(())
}

// ---------------------------------------------------------------------------
// reap

/// `reap [CACHE|all]`: drain the magazines and depot of one cache (or of
/// every cache) and give its empty slabs back; prints the pages returned.
fn cmd_reap<'a>(_: &mut Shell, args: &[&'a str], out: &mut dyn Write) -> Result<'a> {
    let (name, nr_pages) = match args {
        [] | ["all"] => ("all caches", SLAB.reap_all()),
        [name] => {
            let cache = SLAB
                .find_cache(name)
                .ok_or(ShellError::UnknownCache(name))?;
            (*name, cache.reap())
        }
        _ => return Err(ShellError::Usage(&REAP)),
    };
    let _ = writeln!(
        out,
        "reap {name}: {nr_pages} pages ({} KiB) returned",
        nr_pages * magpie_slab::PAGE_SIZE / 1024
    );
    Ok(())
}

// ---------------------------------------------------------------------------
// slabinfo

fn cmd_slabinfo<'a>(_: &mut Shell, args: &[&'a str], out: &mut dyn Write) -> Result<'a> {
    no_args(args, &SLABINFO)?;
    let _ = writeln!(out, "slabinfo - version: 2.1");
    let _ = writeln!(
        out,
        "# name            <active_objs> <num_objs> <objsize> <objperslab> <pagesperslab> \
         : tunables <limit> <batchcount> <sharedfactor> \
         : slabdata <active_slabs> <num_slabs> <sharedavail>"
    );
    SLAB.for_each_cache(|cache| slabinfo_line(out, cache.name(), &cache.stats()));
    Ok(())
}

/// Linux `cache_show`: `%-17s %6lu %6lu %6u %4u %4d : tunables %4u %4u %4u :
/// slabdata %6lu %6lu %6lu`. Active objects are those out of the slab
/// layer (with callers or resting in magazines), as Linux SLAB counted them.
fn slabinfo_line(out: &mut dyn Write, name: &str, stats: &CacheStats) {
    let active = stats.nr_allocated + stats.nr_cpu_cached_objs + stats.nr_depot_objs;
    let _ = writeln!(
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
    );
}
