//! Fault injection by code tags: the kernel's side of `magpie-codetag`'s
//! [`fault`](magpie_codetag::fault) application (the code tagging slides'
//! `dynamic_fault(class)`).
//!
//! Every [`kmalloc!`](crate::kmalloc) and
//! [`kmem_cache_alloc!`](crate::kmem_cache_alloc) call site owns a fault
//! point (class `memory`) next to its allocation tag: when the point says
//! so, the macro returns `Err(AllocError::OutOfMemory)` without calling the
//! allocator, so the site's error path runs exactly as it would when memory
//! runs out. Any other place can be marked with
//! `magpie_codetag::dynamic_fault!(Class)`.
//!
//! The shell's `fault list [PATTERN]` prints every point in the slides'
//! layout with its hit and injected counts; `fault FILE:LINE|PATTERN
//! enable|disable|oneshot|every N|probability P` arms or disarms points.
//! `probability P` draws from a per-CPU splitmix64 generator, seeded from
//! the boot argument `fault_seed=N` (default: a fixed seed, so a boot is
//! reproducible).
//!
//! # Cost
//!
//! Cargo feature `fault-injection` (default). With it, a disabled point is
//! one byte compare against memory and a not-taken branch on every
//! `kmalloc!` / `kmem_cache_alloc!` (see `docs/BENCHMARKS.md`); without it
//! the macros contain no fault code and `fault` says it is compiled out.

pub use magpie_codetag::fault::{FaultMode, FaultTag};
/// The error an injected allocation fault returns.
pub use magpie_slab::AllocError;

/// Whether fault injection is compiled in (cargo feature `fault-injection`).
pub const COMPILED_IN: bool = cfg!(feature = "fault-injection");

/// Fault injection's per-CPU generators: told how to find the CPU, seeded
/// from `fault_seed=` (decimal or 0x hexadecimal).
pub fn init() {
    if !COMPILED_IN {
        return;
    }
    magpie_codetag::fault::set_cpu_id_fn(crate::arch::cpu_id);
    let seed = crate::mm::boot_info::get()
        .and_then(|boot| boot.arg("fault_seed"))
        .and_then(|value| {
            let parsed = match value.strip_prefix("0x") {
                Some(hex) => u64::from_str_radix(hex, 16),
                None => value.parse(),
            };
            if parsed.is_err() {
                log::warn!("fault_seed={value}: not a number; using the default seed");
            }
            parsed.ok()
        })
        .unwrap_or(0x6d61_6770_6965);
    magpie_codetag::fault::seed_rng(seed);
}

/// Every fault point of this kernel (and of the test kernel it is linked
/// into), in section order.
pub fn points() -> &'static [FaultTag] {
    FaultTag::all()
}

/// `alloc_fault!()`: whether the allocation at this call site should fail
/// now (a fault point of class `memory`). Used by `kmalloc!` and
/// `kmem_cache_alloc!`; `false` when fault injection is compiled out.
#[cfg(feature = "fault-injection")]
#[macro_export]
macro_rules! alloc_fault {
    () => {
        $crate::magpie_codetag::dynamic_fault!(Memory)
    };
}

/// `alloc_fault!()` with fault injection compiled out: never.
#[cfg(not(feature = "fault-injection"))]
#[macro_export]
macro_rules! alloc_fault {
    () => {
        false
    };
}
