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
use core::sync::atomic::{AtomicUsize, Ordering};

use magpie_slab::leak_scan::{LeakEntry, LeakScanError, LeakSummary};
use magpie_slab::reports;

use crate::kmem::SLAB;
use crate::mm::{frame, layout};

unsafe extern "C" {
    static __data_start: u8;
    static __boot_stack_guard: u8;
    static __boot_stack_bottom: u8;
    static __boot_stack_top: u8;
}

/// The boot stack's top, as a one-stack table for the descriptor.
static BOOT_STACK_TOP: [AtomicUsize; 1] = [AtomicUsize::new(0)];

/// The stack pointer of the shell's dispatcher while a command runs (0
/// otherwise): the boot stack below it holds the command's frames, which
/// a core taken by `vmcore` leaves out of the roots as the live `kmem
/// findleaks` leaves out its own command's (they sit where earlier
/// commands' frames were, stale slots and all).
static COMMAND_FLOOR: [AtomicUsize; 1] = [AtomicUsize::new(0)];

/// A shell command running: [`COMMAND_FLOOR`] set for its time
/// ([`CommandFrames::enter`]), the previous floor restored at the drop.
pub struct CommandFrames {
    previous: usize,
}

impl CommandFrames {
    /// Mark the frames below the caller's as a command's (call right
    /// before running it).
    #[inline(always)]
    pub fn enter() -> CommandFrames {
        let sp: usize;
        // SAFETY: reads rsp; no memory access.
        unsafe { core::arch::asm!("mov {}, rsp", out(reg) sp, options(nomem, nostack)) };
        CommandFrames {
            previous: COMMAND_FLOOR[0].swap(sp, Ordering::Relaxed),
        }
    }
}

impl Drop for CommandFrames {
    fn drop(&mut self) {
        COMMAND_FLOOR[0].store(self.previous, Ordering::Relaxed);
    }
}

/// A panic or a fatal exception: every frame on the stack is live (the
/// core's scan starts at the stack pointer).
pub fn forget_command_frames() {
    COMMAND_FLOOR[0].store(0, Ordering::Relaxed);
}

/// Describe the roots for `magpie-kmem core CORE findleaks` (the scan
/// below, run over a memory image): the kernel's writable data less
/// [`not_roots`], the boot stack (its live part from the shell's
/// dispatcher up while a command runs) and the APs' stacks
/// ([`crate::smp::ap_stack_table`]). The image adds every CPU's
/// registers and stack pointer.
pub fn describe_roots() {
    let data_start = &raw const __data_start as usize;
    let guard = &raw const __boot_stack_guard as usize;
    let bottom = &raw const __boot_stack_bottom as usize;
    let top = &raw const __boot_stack_top as usize;
    BOOT_STACK_TOP[0].store(top, Ordering::Relaxed);
    let mut holes = not_roots();
    holes.sort_unstable_by_key(|hole| hole.start);
    magpie_slab::descriptor::describe_leak_roots(
        core::slice::from_ref(&(data_start..guard)),
        &holes,
        &[
            magpie_slab::descriptor::KernelStacks {
                tops: &BOOT_STACK_TOP,
                size: top - bottom,
                floors: Some(&COMMAND_FLOOR),
            },
            crate::smp::ap_stack_table(),
        ],
    );
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
            let _ = reports::write_findleaks_header(out);
            header = true;
        }
        let _ = reports::write_findleaks_group(
            out,
            group.cache.as_str(),
            group.nr_leaked,
            group.first,
            &Site(group.site),
        );
    });
    let _ = reports::write_findleaks_summary(out, &summary);
    Ok(summary)
}

/// The allocation site of a charge token: `file:line function`, `?`
/// for none.
struct Site(Option<magpie_slab::AllocTagRef>);

impl core::fmt::Display for Site {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        #[cfg(feature = "alloc-profiling")]
        {
            use magpie_codetag::alloc_tag::{AllocTag, AllocTagCounters};
            if let Some(tag) = self
                .0
                .and_then(AllocTagCounters::token_tag_ref)
                .and_then(AllocTag::from_ref)
                && !tag.is_untagged()
            {
                return write!(
                    f,
                    "{}:{} {}",
                    tag.tag.file,
                    tag.tag.line,
                    tag.tag.function()
                );
            }
        }
        #[cfg(not(feature = "alloc-profiling"))]
        let _ = self.0;
        f.write_str("?")
    }
}
