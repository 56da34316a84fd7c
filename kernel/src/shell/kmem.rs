//! `kmemstat`, `slabinfo`, `kmalloc`, `kfree`, `leak`, `reap`.

use core::fmt::Write;
use core::ptr::NonNull;

use magpie_slab::reports::{self, KmemstatRow};

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
        [_, _, extra, ..] => return Err(ShellError::Unexpected(extra, command)),
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
    hold_room(shell, count)?;
    for done in 0..count {
        let ptr =
            crate::kmalloc!(size, 1).map_err(|error| kmalloc_failed(size, done, count, error))?;
        // Cannot grow: `count` slots were reserved above.
        shell.held.push(Held { ptr, size });
        let _ = writeln!(out, "{:#018x}", ptr.as_ptr() as usize);
    }
    Ok(())
}

/// Room for `count` more objects in the shell's held list (a fault point
/// of its own, apart from `cmd_kmalloc`'s `kmalloc!`).
fn hold_room(shell: &mut Shell, count: usize) -> Result<'static> {
    crate::try_alloc!(shell.held.try_reserve(count)).map_err(|_| {
        out_of_memory!(
            "{} bytes to hold {count} more objects",
            (shell.held.len() + count) * core::mem::size_of::<Held>()
        )
    })
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
        [_, extra, ..] => return Err(ShellError::Unexpected(extra, &KFREE)),
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

/// `kmemstat`: the library's report (`magpie_slab::reports`) with this
/// kernel's arenas around it: `base` > `kpages` > the caches, and the
/// bootstrap heap.
fn cmd_kmemstat<'a>(_: &mut Shell, args: &[&'a str], out: &mut dyn Write) -> Result<'a> {
    no_args(args, &KMEMSTAT)?;
    let _ = write_kmemstat(out);
    Ok(())
}

fn write_kmemstat(out: &mut dyn Write) -> core::fmt::Result {
    let page = magpie_slab::PAGE_SIZE;
    reports::write_kmemstat_header(out)?;
    KmemstatRow::arena(0, "base", page, kmem::base_stats()).write(out)?;
    KmemstatRow::arena(1, "kpages", page, magpie_slab::PageSource::stats(&KPAGES)).write(out)?;
    reports::write_kmemstat_caches(out, &SLAB, 2)?;
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
    .write(out)
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
        [_, extra, ..] => return Err(ShellError::Unexpected(extra, &REAP)),
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

/// `slabinfo`: `/proc/slabinfo` 2.1, written by `magpie_slab::reports`.
fn cmd_slabinfo<'a>(_: &mut Shell, args: &[&'a str], out: &mut dyn Write) -> Result<'a> {
    no_args(args, &SLABINFO)?;
    let _ = reports::slabinfo(out, &SLAB);
    Ok(())
}
