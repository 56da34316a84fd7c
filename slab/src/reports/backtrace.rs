//! A frame-pointer backtrace walker a [`Platform::backtrace`] can use
//! (x86_64 System V frames: `[rbp]` holds the caller's frame pointer,
//! `[rbp + 8]` the return address), bounded and checked so it never
//! follows a frame pointer out of the stack or reports an address outside
//! the kernel's text.
//!
//! ```ignore
//! fn backtrace(frames: &mut [usize]) -> usize {
//!     // SAFETY: the kernel is built with frame pointers forced, and the
//!     // current stack [stack_bottom, stack_top) is mapped and readable.
//!     let bounds = FrameBounds { stack: stack_bottom()..stack_top(), text: text_start()..text_end() };
//!     unsafe { magpie_slab::reports::backtrace::backtrace(&bounds, frames) }
//! }
//! ```
//!
//! [`Platform::backtrace`]: crate::Platform::backtrace

use core::ops::Range;

/// Frames the walk follows at most, whatever the output's length.
pub const MAX_WALK_FRAMES: usize = 64;

/// Where a walk may read and what it may report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrameBounds {
    /// The stack the frames are on: every frame record (16 bytes) read
    /// lies wholly inside it.
    pub stack: Range<usize>,
    /// The text section: a return address outside it ends the walk (it
    /// is not code, so the frame chain is broken or ends there).
    pub text: Range<usize>,
}

/// Fills `out` with return addresses, innermost first, walking the frame
/// records from `frame_pointer`; returns how many were written. Stops at
/// `out.len()` or [`MAX_WALK_FRAMES`] frames, at a frame pointer that is
/// unaligned, outside `bounds.stack` (with its 16-byte record) or not
/// above the previous one (frames grow toward higher addresses as the
/// walk goes outward, so the walk always ends), and at a return address
/// outside `bounds.text`.
///
/// # Safety
///
/// Every 8-byte aligned word of `bounds.stack` is mapped and readable for
/// the whole call (the stack's words may change meanwhile: they are read
/// as plain values, never followed unless they pass the checks above).
pub unsafe fn backtrace_from(
    frame_pointer: usize,
    bounds: &FrameBounds,
    out: &mut [usize],
) -> usize {
    let mut frame_pointer = frame_pointer;
    let mut depth = 0;
    let limit = out.len().min(MAX_WALK_FRAMES);
    while depth < limit {
        let record_fits = frame_pointer
            .checked_add(16)
            .is_some_and(|end| frame_pointer >= bounds.stack.start && end <= bounds.stack.end);
        if !frame_pointer.is_multiple_of(8) || !record_fits {
            break;
        }
        // SAFETY: the 16-byte record at `frame_pointer` is 8-byte aligned
        // and inside `bounds.stack`, readable per our caller.
        let (next, return_address) = unsafe {
            (
                core::ptr::read_volatile(frame_pointer as *const usize),
                core::ptr::read_volatile((frame_pointer + 8) as *const usize),
            )
        };
        if !bounds.text.contains(&return_address) {
            break;
        }
        out[depth] = return_address;
        depth += 1;
        if next <= frame_pointer {
            break;
        }
        frame_pointer = next;
    }
    depth
}

/// [`backtrace_from`] the caller's own frame: `out[0]` is the return
/// address into the function that called `backtrace`.
///
/// # Safety
///
/// As for [`backtrace_from`], with `bounds.stack` the stack this runs on;
/// and the code is built with frame pointers (`-C force-frame-pointers`),
/// so `rbp` holds a frame record here.
#[cfg(target_arch = "x86_64")]
#[inline(never)]
pub unsafe fn backtrace(bounds: &FrameBounds, out: &mut [usize]) -> usize {
    let frame_pointer: usize;
    // SAFETY: reads this function's own frame pointer register; no memory
    // is touched.
    unsafe {
        core::arch::asm!("mov {}, rbp", out(reg) frame_pointer, options(nomem, nostack, preserves_flags));
    }
    // SAFETY: per our caller.
    unsafe { backtrace_from(frame_pointer, bounds, out) }
}
