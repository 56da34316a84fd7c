//! Where an allocation came from: the first return address outside the
//! allocator. Two walks, both over frame pointers (the kernel is built
//! with them in every non-leaf function, and rbp reserved in leaves too:
//! `.cargo/config.toml`):
//!
//! * [`backtrace`] (`PlatformHooks::backtrace`: the trace table, context
//!   capture): a checked walk of the whole stack, then the allocator's own
//!   frames are skipped by symbol name ([`is_allocator_frame`]);
//! * [`caller_frames`] (`PlatformHooks::caller_frames`: kmemtrace events, on
//!   every traced allocation): about five instructions per allocator frame,
//!   bounded by the allocator's text range from `boot/linker.ld`.

use crate::debug::symbols;

/// [`magpie_slab::PlatformHooks::backtrace`] for this kernel: the caller's
/// backtrace from the first frame outside the allocator (trace recording,
/// the cache's alloc, kmalloc, the GlobalAlloc shim, `alloc::` glue).
pub fn backtrace(frames: &mut [usize]) -> usize {
    let mut all = [0usize; 48];
    let depth = symbols::backtrace(&mut all);
    let first = all[..depth]
        .iter()
        .position(|&address| !is_allocator_frame(address))
        .unwrap_or(0);
    let take = (depth - first).min(frames.len());
    frames[..take].copy_from_slice(&all[first..first + take]);
    take
}

/// Whether a return address lies in allocator plumbing rather than in the
/// code that asked for memory.
fn is_allocator_frame(address: usize) -> bool {
    let Some((name, _)) = symbols::lookup(address) else {
        return false;
    };
    // Mangled (v0 or legacy) names contain the path segments with lengths;
    // matching on the crate/module names is enough and allocation-free.
    const PLUMBING: [&str; 6] = [
        "magpie_slab",
        "6kpagesNtB", // the kpages arena's PageSource impl
        "9call_site", // this walk itself
        "5alloc5alloc",
        "__rust",
        "4heap",
    ];
    name.contains("KernelPlatform")
        || name.contains("9profiling") // allocation-tag context capture
        || PLUMBING.iter().any(|needle| name.contains(needle))
        || name.contains("alloc..alloc")
        || name.contains("__rdl_")
        || name.contains("__rg_")
}

unsafe extern "C" {
    static __kmem_text_start: u8;
    static __kmem_text_end: u8;
}

/// Most allocator frames the call-site walk goes through.
const MAX_ALLOCATOR_FRAMES: usize = 16;

/// [`magpie_slab::PlatformHooks::caller_frames`] for this kernel: walks the
/// frame pointers from the caller's frame while the return address lies in
/// the allocator's text (`boot/linker.ld` gathers `magpie_slab`, the
/// platform glue, the global-allocator shims and `alloc`'s raw_vec/alloc
/// glue between `__kmem_text_start` and `__kmem_text_end`); the first
/// return address outside is the call site. About five instructions per
/// allocator frame. With more than one slot, the call site's own callers
/// follow (a checked walk, [`crate::debug::symbols::backtrace_from`]).
#[inline(always)]
pub fn caller_frames(frames: &mut [usize]) -> usize {
    let Some(first) = frames.first_mut() else {
        return 0;
    };
    let start = (&raw const __kmem_text_start) as usize;
    let end = (&raw const __kmem_text_end) as usize;
    let mut frame_pointer: usize;
    // SAFETY: reads RBP: the frame record of the allocator function this
    // is inlined into, or, if that is a leaf (no frame of its own), of its
    // nearest caller that has one; rbp is reserved in every function
    // (`-C force-frame-pointers=non-leaf`), so it is never anything else.
    unsafe {
        core::arch::asm!("mov {}, rbp", out(reg) frame_pointer, options(nomem, nostack, preserves_flags))
    };
    for _ in 0..MAX_ALLOCATOR_FRAMES {
        // SAFETY: `frame_pointer` is the frame of an allocator function
        // (the walk starts in one and goes on only while the return address
        // is allocator text), built with frame pointers in every function
        // that calls out (only those can be on the chain): [fp] is the saved
        // frame pointer and [fp + 8] the return address, both on the stack.
        let (next, return_address) = unsafe {
            (
                *(frame_pointer as *const usize),
                *((frame_pointer + 8) as *const usize),
            )
        };
        if !(start..end).contains(&return_address) {
            *first = return_address;
            if frames.len() == 1 {
                return 1;
            }
            // `next` is the call site's own frame: its callers follow.
            return 1 + crate::debug::symbols::backtrace_from(next, &mut frames[1..]);
        }
        frame_pointer = next;
    }
    0
}
