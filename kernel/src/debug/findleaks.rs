//! `kmem findleaks`: leaks by reachability (illumos `::findleaks`, Linux
//! kmemleak) over [`magpie_slab::leak_scan`].
//!
//! Roots: the kernel's writable data (`.data`, the link-time registries
//! after it, and `.bss`, which holds the per-CPU blocks and every
//! `static`), the running CPU's stack from its caller's caller's frame up
//! (the shell's dispatcher and above, for `kmem findleaks`), the
//! callee-saved registers, and every AP's live kernel stack (from where
//! it sleeps in its work loop up: `smp::ap_stack_live`; all of it while
//! it runs work). The boot stack below the caller's frame and an idle
//! AP's stack below its work loop are not roots: they hold stale copies
//! of pointers (the leaking command's own frame, the frames of a job the
//! AP ran, such as `stress`'s) that would hide the very leaks asked
//! about. The scan's table comes from the frame
//! allocator, so the scan allocates nothing from the slab allocator.
//!
//! Not roots: the kernel's own records of objects ([`not_roots`]). The
//! context-capture pool (`allocinfo ctx`) lies in `.bss` and holds the
//! address of every object it describes: as a root it would make a
//! captured leak reachable. The slab allocator's own metadata (trace
//! table records, magazines, bufctls) lives in its bootstrap caches,
//! which the scan neither counts nor scans, and the kmemtrace recorder's
//! rings come from kpages: neither is a root either.
//!
//! Output: illumos' layout, one line per cache and allocation site:
//!
//! ```text
//! CACHE                 LEAKED           BUFCTL CALLER
//! kmalloc-64                10 ffff800000a31040 kernel/src/shell/kmem.rs:173 magpie::shell::kmem::cmd_leak
//! ------------------------------------------------------------------------
//!            Total      10 buffers, 640 bytes
//! ```
//!
//! `BUFCTL` is the lowest leaked object's address (a representative
//! buffer to give `kmem whatis`; small-object slabs have no bufctls);
//! `CALLER` the code tag the objects were charged to (`?` without one).

use core::fmt::Write;
use core::mem::MaybeUninit;

use magpie_slab::leak_scan::{LeakEntry, LeakScanError, LeakSummary};

use crate::kmem::SLAB;
use crate::mm::{frame, layout};

unsafe extern "C" {
    static __data_start: u8;
    static __boot_stack_guard: u8;
    static __boot_stack_top: u8;
}

/// The parts of the kernel's data that record objects without owning
/// them (`start..end` each): left out of the roots.
fn not_roots() -> [core::ops::Range<usize>; 1] {
    [crate::profiling::capture::ctx_pool_range()]
}

/// Hands `start..end` to `scan` as a root, less the ranges of `holes`
/// (sorted by start, disjoint).
///
/// # Safety
/// As [`magpie_slab::leak_scan::LeakScan::scan_range`] for `start..end`.
unsafe fn scan_range_except(
    scan: &mut magpie_slab::leak_scan::LeakScan<'_, crate::kmem::KernelPlatform>,
    start: usize,
    end: usize,
    holes: &[core::ops::Range<usize>],
) {
    let mut from = start;
    for hole in holes {
        let (hole_start, hole_end) = (hole.start.clamp(from, end), hole.end.clamp(from, end));
        if hole_start > from {
            // SAFETY: a part of `start..end` (the caller's promise).
            unsafe { scan.scan_range(from, hole_start) };
        }
        from = from.max(hole_end);
    }
    if from < end {
        // SAFETY: a part of `start..end` (the caller's promise).
        unsafe { scan.scan_range(from, end) };
    }
}

/// Why `findleaks` did not run.
#[derive(Debug)]
pub enum FindleaksError {
    /// The slab allocator refused (not initialised, or the table filled
    /// up because objects were allocated during the scan).
    Scan(LeakScanError),
    /// No frames for the scan's table.
    NoMemory {
        /// Bytes asked for.
        bytes: usize,
    },
}

impl core::fmt::Display for FindleaksError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            FindleaksError::Scan(error) => write!(f, "{error}"),
            FindleaksError::NoMemory { bytes } => {
                write!(f, "no memory for the scan's table ({bytes} bytes)")
            }
        }
    }
}

/// Scan for leaks and write the `::findleaks` report to `out`. Call from
/// the command that asks, directly: the frames above that command's are
/// the stack roots.
///
/// # Errors
/// [`FindleaksError`]; nothing is written then.
#[inline(never)]
pub fn findleaks(out: &mut dyn Write) -> Result<LeakSummary, FindleaksError> {
    let frame_base: usize;
    // SAFETY: reads rbp (this function calls out, so it has a frame:
    // `-C force-frame-pointers=non-leaf`; its frame base); no memory access.
    unsafe { core::arch::asm!("mov {}, rbp", out(reg) frame_base, options(nomem, nostack)) };
    // SAFETY: with frame pointers, [rbp] is our caller's saved rbp, on
    // the live stack.
    let caller_base = unsafe { (frame_base as *const usize).read() };
    // Our caller's caller's frames start above the caller's saved rbp and
    // return address: the command's own frame is skipped too (it sits
    // where the previous command's frame was, stale slots and all).
    let stack_from = caller_base + 16;
    let capacity = magpie_slab::leak_scan::LeakScan::capacity(&SLAB) + 256;
    let bytes = capacity * core::mem::size_of::<LeakEntry>();
    let nr_pages = bytes.div_ceil(frame::PAGE_SIZE);
    let phys = crate::try_alloc!(frame::alloc_contiguous(nr_pages).ok_or(()))
        .map_err(|_| FindleaksError::NoMemory { bytes })?;
    let virt = layout::phys_to_virt(phys.as_u64());
    // SAFETY: fresh frames, ours until freed below, mapped in the direct
    // map, aligned for LeakEntry (page-aligned).
    let memory =
        unsafe { core::slice::from_raw_parts_mut(virt as *mut MaybeUninit<LeakEntry>, capacity) };
    let table = LeakEntry::init_table(memory);
    let result = scan(table, stack_from, out);
    frame::free(phys, nr_pages);
    result
}

fn scan(
    table: &mut [LeakEntry],
    stack_from: usize,
    out: &mut dyn Write,
) -> Result<LeakSummary, FindleaksError> {
    // SAFETY: the kernel's slab pages stay mapped (the direct map) even
    // when reaped, and caches destroyed meanwhile only misreport; the
    // shell scans a quiet kernel.
    let mut scan = unsafe { magpie_slab::leak_scan::LeakScan::new(&SLAB, table) }
        .map_err(FindleaksError::Scan)?;
    let data_start = &raw const __data_start as usize;
    let guard = &raw const __boot_stack_guard as usize;
    let boot_top = &raw const __boot_stack_top as usize;
    let mut registers = [0usize; 6];
    // SAFETY: stores the callee-saved registers into our array.
    unsafe {
        core::arch::asm!(
            "mov [{0}], rbx", "mov [{0} + 8], rbp", "mov [{0} + 16], r12",
            "mov [{0} + 24], r13", "mov [{0} + 32], r14", "mov [{0} + 40], r15",
            in(reg) registers.as_mut_ptr(), options(nostack, preserves_flags)
        );
    }
    let mut holes = not_roots();
    holes.sort_unstable_by_key(|hole| hole.start);
    // SAFETY: the kernel image's writable sections up to the boot stack's
    // guard page are mapped; the stack from our caller's frame to its
    // top is the live part of the stack we run on; AP stacks are frames
    // in the direct map.
    unsafe {
        scan_range_except(&mut scan, data_start, guard, &holes);
        if (guard..boot_top).contains(&stack_from) {
            scan.scan_range(stack_from, boot_top);
        }
        for cpu in 0..crate::arch::MAX_CPUS {
            if let Some((bottom, top)) = crate::smp::ap_stack_live(cpu) {
                scan.scan_range(bottom, top);
            }
        }
    }
    scan.scan_slice(&registers);
    let mut header = false;
    let summary = scan.finish(|group| {
        if !header {
            let _ = writeln!(out, "CACHE                 LEAKED           BUFCTL CALLER");
            header = true;
        }
        let _ = write!(
            out,
            "{:<17} {:>10} {:016x} ",
            group.cache.as_str(),
            group.nr_leaked,
            group.first
        );
        write_site(out, group.site);
        let _ = writeln!(out);
    });
    if summary.nr_leaked == 0 {
        let _ = writeln!(out, "findleaks: no memory leaks detected");
    } else {
        let _ = writeln!(
            out,
            "------------------------------------------------------------------------"
        );
        let _ = writeln!(
            out,
            "           Total {:>7} buffer{}, {} byte{}",
            summary.nr_leaked,
            if summary.nr_leaked == 1 { "" } else { "s" },
            summary.leaked_bytes,
            if summary.leaked_bytes == 1 { "" } else { "s" }
        );
    }
    let _ = writeln!(
        out,
        "findleaks: {} objects, {} reachable, {} resting in magazines; {} KiB scanned",
        summary.nr_objects,
        summary.nr_reached,
        summary.nr_resting,
        summary.scanned_bytes / 1024
    );
    Ok(summary)
}

/// The allocation site of a charge token: `file:line function`.
fn write_site(out: &mut dyn Write, site: Option<magpie_slab::AllocTagRef>) {
    #[cfg(feature = "alloc-profiling")]
    {
        use magpie_codetag::alloc_tag::{AllocTag, AllocTagCounters};
        if let Some(tag) = site
            .and_then(AllocTagCounters::token_tag_ref)
            .and_then(AllocTag::from_ref)
            && !tag.is_untagged()
        {
            let _ = write!(
                out,
                "{}:{} {}",
                tag.tag.file,
                tag.tag.line,
                tag.tag.function()
            );
            return;
        }
    }
    #[cfg(not(feature = "alloc-profiling"))]
    let _ = site;
    let _ = out.write_str("?");
}
