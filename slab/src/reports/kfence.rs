//! KFENCE's figures (`kmem kfence`) and its objects as Linux's
//! `/sys/kernel/debug/kfence/objects` lists them (`mm/kfence/report.c`
//! `kfence_print_object`): the shell writes them of the live pool,
//! `magpie-kmem core CORE kfence` of a memory image.

use core::fmt::{self, Write};

use crate::kfence::{KfenceStack, KfenceState, KfenceStats};
use crate::reports::error::ReportFormat;

/// The pool's figures, one line each (`enabled: 1`, `sample interval:
/// 100 ms`, `pool: ...`, `currently allocated: N`, `total allocations`,
/// `total frees`, `skipped allocations (pool full)`, `total bugs`, after
/// Linux's `/sys/kernel/debug/kfence/stats`); `kfence: off (no pool)`
/// when there is none.
///
/// # Errors
///
/// The error of `out`, as is.
pub fn write_kfence_stats(out: &mut dyn Write, stats: &KfenceStats) -> fmt::Result {
    if !stats.enabled {
        return writeln!(out, "kfence: off (no pool)");
    }
    writeln!(out, "enabled: 1")?;
    if stats.interval_ms == 0 {
        writeln!(out, "sample interval: off (forced samples only)")?;
    } else {
        writeln!(out, "sample interval: {} ms", stats.interval_ms)?;
    }
    writeln!(
        out,
        "pool: {} pages, {} objects",
        stats.pool_pages, stats.nr_objects
    )?;
    writeln!(out, "currently allocated: {}", stats.nr_in_use)?;
    writeln!(out, "total allocations: {}", stats.nr_allocs)?;
    writeln!(out, "total frees: {}", stats.nr_frees)?;
    writeln!(out, "skipped allocations (pool full): {}", stats.nr_skipped)?;
    writeln!(out, "total bugs: {}", stats.nr_bugs)
}

/// One pool object, as [`write_kfence_object`] prints it (the parts of
/// [`KfenceObject`](crate::kfence::KfenceObject) a reader of an image has).
#[derive(Debug, Clone, Copy)]
pub struct KfenceObjectView<'a> {
    /// Its index (`kfence-#N`).
    pub index: usize,
    /// Its state.
    pub state: KfenceState,
    /// The object's address.
    pub addr: usize,
    /// Its size in bytes.
    pub size: usize,
    /// Its cache's name.
    pub cache: &'a str,
    /// Where it was allocated.
    pub alloc: &'a KfenceStack,
    /// Where it was freed (state `Freed`).
    pub free: &'a KfenceStack,
}

/// One object of Linux's objects file, then its separator:
///
/// ```text
/// kfence-#3: 0xffffc00000109fc0-0xffffc00000109fff, size=64, cache=kmalloc-64
///
/// allocated by task 0 on cpu 1 at 2.104331s:
///  magpie::shell::kmem::cmd_kmalloc+0x3d5
///
/// freed by task 0 on cpu 1 at 2.900012s:
///  magpie::shell::kmem::cmd_kfree+0x7c
/// ---------------------------------
/// ```
///
/// An object never used is one line, `kfence-#N unused`. Frames and times
/// as `format` renders them.
///
/// # Errors
///
/// The error of `out`, as is.
pub fn write_kfence_object(
    out: &mut dyn Write,
    object: &KfenceObjectView<'_>,
    format: &dyn ReportFormat,
) -> fmt::Result {
    if object.state == KfenceState::Unused {
        writeln!(out, "kfence-#{} unused", object.index)?;
    } else {
        writeln!(
            out,
            "kfence-#{}: {:#x}-{:#x}, size={}, cache={}",
            object.index,
            object.addr,
            (object.addr + object.size).saturating_sub(1),
            object.size,
            object.cache
        )?;
        write_stack(out, "allocated", object.alloc, format)?;
        if object.state == KfenceState::Freed {
            write_stack(out, "freed", object.free, format)?;
        }
    }
    writeln!(out, "---------------------------------")
}

/// `\n{what} by task 0 on cpu N at S.UUUUUUs:` and the frames, one a line.
fn write_stack(
    out: &mut dyn Write,
    what: &str,
    stack: &KfenceStack,
    format: &dyn ReportFormat,
) -> fmt::Result {
    let ns = format.nanoseconds(stack.time);
    let (s, us) = (ns / 1_000_000_000, ns % 1_000_000_000 / 1000);
    writeln!(
        out,
        "\n{what} by task 0 on cpu {} at {s}.{us:06}s:",
        stack.cpu
    )?;
    for &frame in stack.frames() {
        out.write_str(" ")?;
        format.symbol(frame, out)?;
        out.write_str("\n")?;
    }
    Ok(())
}
