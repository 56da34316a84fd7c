//! `kmem findleaks`: the kernel's roots for the slab library's leak scan
//! ([`magpie_slab::leaks`], illumos `::findleaks`), and its report.
//!
//! Roots: the kernel image's writable data and `.bss` (every static, the
//! bootstrap heap, the per-CPU areas reached from them), and the live part
//! of this CPU's stack (the boot stack, from the stack pointer up: the
//! dead frames below it are not roots; the shell zeroes them after each
//! command, [`scrub_dead_stack`], so no stale slot of a live frame hides a
//! leak). The other CPUs sit in their idle
//! loops while the shell runs and hold no allocations; their stacks and
//! saved registers are not scanned (left out).

use core::fmt::{self, Write};

use magpie_codetag::alloc_tag::{AllocTag, AllocTagCounters};
use magpie_slab::AllocError;
use magpie_slab::leaks::{
    LeakGroup, LeakSummary, write_findleaks_header, write_findleaks_row, write_findleaks_total,
};

use crate::kmem::{KernelPlatform, SLAB};
use crate::mm::layout::kernel_layout;

/// The allocation site of a group, as `::findleaks` prints its caller:
/// the code tag's function and place (profiling), else the symbol of the
/// first frame of the last allocation (`AUDIT`), else `?`.
struct Caller<'a>(&'a LeakGroup<KernelPlatform>);

impl fmt::Display for Caller<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let tag = self
            .0
            .tag
            .and_then(AllocTagCounters::token_tag_ref)
            .and_then(AllocTag::from_ref);
        if let Some(tag) = tag {
            return write!(
                f,
                "{} {}:{}",
                tag.tag.function(),
                tag.tag.file,
                tag.tag.line
            );
        }
        match crate::debug::symbols::lookup(self.0.alloc_frame) {
            Some((name, offset)) if self.0.alloc_frame != 0 => {
                write!(f, "{}+{offset:#x}", crate::debug::symbols::demangled(name))
            }
            _ => f.write_str("?"),
        }
    }
}

/// Bytes below the caller's frame that [`scrub_dead_stack`] zeroes.
const SCRUB_BYTES: usize = 16 * 1024;

/// Zero the dead stack below the caller's frame (the shell calls it after
/// each command). A conservative scan takes every word of a live frame as
/// a possible pointer, and a frame's unused slots keep whatever an earlier
/// call at the same depth left there: after `leak`, its pointers. Zeroed,
/// the next command's frames start clean, so `kmem findleaks` reports
/// exactly what nothing points to.
#[inline(never)]
pub fn scrub_dead_stack() {
    let mut dead = [0u8; SCRUB_BYTES];
    // Written for real (not optimised away), then dropped.
    core::hint::black_box(&mut dead);
}

/// The stack pointer of the caller.
#[inline(always)]
fn stack_pointer() -> usize {
    let rsp: usize;
    // SAFETY: reads a register; no memory, no flags.
    unsafe {
        core::arch::asm!("mov {}, rsp", out(reg) rsp, options(nomem, nostack, preserves_flags))
    };
    rsp
}

/// Scan for leaks and print them in the `::findleaks` layout (nothing but
/// one line when there are none).
///
/// # Errors
/// The scan's: out of memory for its table.
pub fn find_leaks(out: &mut dyn Write) -> Result<LeakSummary, AllocError> {
    let layout = kernel_layout();
    let (data, guard) = (layout.rodata_end as usize, layout.boot_stack_guard as usize);
    let (bottom, top) = (
        layout.boot_stack_bottom as usize,
        layout.boot_stack_top as usize,
    );
    let rsp = stack_pointer();
    let live_stack = if (bottom..top).contains(&rsp) {
        rsp
    } else {
        bottom
    };
    let roots = [
        // .data, orphan sections and .bss up to the boot stack's guard page.
        (data, guard),
        // The boot stack's live frames.
        (live_stack, top),
        // .bss after the boot stack.
        (top, layout.end as usize),
    ];
    let mut printed = false;
    // SAFETY: the image's data and bss and the live stack are mapped and
    // readable for the scan (the guard page is left out).
    let summary = unsafe {
        SLAB.find_leaks(&roots, &mut |group| {
            if !printed {
                let _ = write_findleaks_header(out);
                printed = true;
            }
            let _ = write_findleaks_row(out, group, &Caller(group));
        })
    }?;
    if printed {
        let _ = write_findleaks_total(out, &summary);
    } else {
        let _ = writeln!(
            out,
            "no leaks: {} held object(s), all reachable",
            summary.nr_objects
        );
    }
    Ok(summary)
}
