//! A frame-pointer backtrace walker a [`PlatformHooks::backtrace`](crate::PlatformHooks::backtrace) can use
//! (x86_64 System V frames: `[rbp]` holds the caller's frame pointer,
//! `[rbp + 8]` the return address), bounded and checked so it never
//! follows a frame pointer out of the stack or reports an address outside
//! the kernel's text. [`backtrace`] and [`backtrace_from`] read a stack
//! whose bounds the platform knows; [`walk_frames`] is the walk alone, for
//! a platform that checks readability its own way (Magpie's kernel: its
//! page tables).
//!
//! ```ignore
//! fn backtrace(frames: &mut [usize]) -> usize {
//!     // SAFETY: the kernel is built with frame pointers (at least in every
//!     // non-leaf function, rbp reserved in all), and the
//!     // current stack [stack_bottom, stack_top) is mapped and readable.
//!     let bounds = FrameBounds { stack: stack_bottom()..stack_top(), text: text_start()..text_end() };
//!     unsafe { magpie_slab::reports::backtrace::backtrace(&bounds, frames) }
//! }
//! ```
//!
//! [`PlatformHooks::backtrace`]: crate::PlatformHooks::backtrace

use core::ops::Range;

/// Frames the walk follows at most, whatever the output's length.
pub(crate) const MAX_WALK_FRAMES: usize = 64;

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

/// The walk itself, memory access left to the caller: fills `out` with
/// return addresses, innermost first, from the frame record at
/// `frame_pointer` (`[fp]` the caller's frame pointer, `[fp + 8]` the
/// return address); returns how many were written. `read_word` reads the
/// aligned word at an address, or says it may not be read (`None`: the
/// walk ends); `is_text` says whether a return address is code (if not,
/// the walk ends before it). Stops at `out.len()` or `MAX_WALK_FRAMES` (64)
/// frames, and at a frame pointer not above the previous one (frames lie
/// at higher addresses as the walk goes outward, so it always ends).
pub fn walk_frames(
    frame_pointer: usize,
    out: &mut [usize],
    read_word: &dyn Fn(usize) -> Option<usize>,
    is_text: &dyn Fn(usize) -> bool,
) -> usize {
    let mut frame_pointer = frame_pointer;
    let mut depth = 0;
    let limit = out.len().min(MAX_WALK_FRAMES);
    while depth < limit {
        let Some(next) = read_word(frame_pointer) else {
            break;
        };
        let Some(return_address) = frame_pointer.checked_add(8).and_then(read_word) else {
            break;
        };
        if !is_text(return_address) {
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

/// [`walk_frames`] over a known stack: reads only 8-byte aligned words
/// wholly inside `bounds.stack`, and reports only return addresses inside
/// `bounds.text`.
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
    let read_word = |address: usize| {
        let inside = address >= bounds.stack.start
            && address
                .checked_add(8)
                .is_some_and(|end| end <= bounds.stack.end);
        if !address.is_multiple_of(8) || !inside {
            return None;
        }
        // SAFETY: an aligned word inside `bounds.stack`, readable per our
        // caller.
        Some(unsafe { core::ptr::read_volatile(address as *const usize) })
    };
    walk_frames(frame_pointer, out, &read_word, &|address| {
        bounds.text.contains(&address)
    })
}

/// [`backtrace_from`] the caller's own frame: `out[0]` is the return
/// address into the function that called `backtrace`.
///
/// # Safety
///
/// As for [`backtrace_from`], with `bounds.stack` the stack this runs on;
/// and the code is built with frame pointers (`-C force-frame-pointers`,
/// `=yes` or `=non-leaf`: this function calls out, so it has one), so
/// `rbp` holds a frame record here.
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
