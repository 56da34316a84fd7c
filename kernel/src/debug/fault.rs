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
//! # Every allocation site
//!
//! The kernel's own `Vec`/`VecDeque`/`Box`/`Arc` users allocate through
//! the fallible APIs (`try_reserve`, `Box::try_new`, `Arc::try_new`)
//! behind [`try_alloc!`](crate::try_alloc), which gives each site (or each
//! allocation scope: several allocations that fail as one) a fault point
//! keyed by its `FILE:LINE`; page allocations made for a shell command go
//! through it too. Each failure is handled: one error line, nothing
//! half-done (the command fails, the kernel carries on). The points:
//!
//! | site | what it allocates | when it fails |
//! | --- | --- | --- |
//! | `shell::kmem` `cmd_kmalloc`, `cmd_leak` (`kmalloc!`) | the objects | `out of memory (kmalloc(N) failed after i of n objects)` |
//! | `shell::kmem` `hold_room` | the shell's held-object list | `out of memory (N bytes to hold n more objects)` |
//! | `shell::smp` `online_cpus` | `stress --cpus`'s CPU list | `out of memory (a list of n CPUs)` |
//! | `smp::stress` `run` | the run's bookkeeping (inboxes, live lists, reports), one scope | `out of memory (the stress run's bookkeeping)`, nothing ran |
//! | `smp::stress` `alloc` (`kmalloc_box!`, `kmem_cache_alloc_box!`) | the stress objects | counted in `failures`, the run goes on |
//! | `smp::stress` `hand_off` | an inbox's growth past 256 objects | counted in `failures`, the object freed where it is |
//! | `smp::stress` `ctor_cache` | the `stress-ctor` cache (first `stress` of a boot) | `out of memory (for the stress-ctor cache)` |
//! | `smp` `run_on_cpus` | the work items, completion flags and mailbox room, one scope | [`SmpError::OutOfMemory`](crate::smp::SmpError), nothing posted |
//! | `smp` `run_on` | one work item, its flag and mailbox room | [`SmpError::OutOfMemory`](crate::smp::SmpError), nothing posted |
//! | `profiling::alloc_tag` `mark`, `diff` | `allocinfo mark`'s copy, `allocinfo diff`'s rows | `out of memory (...)`, the old mark kept |
//! | `tracing::event_stream` `start` | the recorder's per-CPU rings (kpages, inside the allocator) | `cannot record: ...`, nothing kept |
//! | `dev::virtio_console` `init` | the dump channel's queue and buffer, one scope | a warning; no dump channel |
//! | `debug::findleaks` `findleaks` | the scan's table | `findleaks: no memory for the scan's table (N bytes)` |
//! | `debug::lkdtm` `alloc` (`kmem_cache_alloc!`) | the scratch objects | `could not set up: out of memory; nothing was done` |
//!
//! Allocations left infallible, with the reason:
//!
//! * boot (`arch::gdt`: the double-fault stack, TSS and GDT; `smp`'s AP
//!   stacks and the 16 mailbox slots each AP starts with; the allocation
//!   profiling counters, `mem_profiling=`; the page tables of
//!   `mm::paging`): made before the
//!   shell runs, once; without them the kernel cannot run, or boot already
//!   carries on without the feature and says so;
//! * `profiling::ctx_records`: a test helper (the shell's `allocinfo ctx`
//!   copies records into a fixed buffer, [`ctx_copy`](crate::profiling::ctx_copy));
//! * `debug::lkdtm`'s `SLAB_FREE_PAGE` page (`KPAGES.alloc_pages`): its
//!   failure is already an lkdtm setup error;
//! * the `Shell`'s line buffer and the kernel's output paths: fixed-size,
//!   they allocate nothing;
//! * the kmemtrace trace table (`kmemtrace start CACHE`): a switch on the
//!   cache, it allocates nothing.
//!
//! `tests/fault_injection.rs` (a QEMU test kernel) and
//! `tests/e2e/test_fault_sweep.py` (the booted shell) fail each point in
//! turn and check that it injected once, the command printed one clear
//! error, `allocinfo` came back to its baseline and the shell carries on;
//! points no shell command reaches are named there with the reason. The
//! latter also records every shell command with kmemtrace and fails on
//! any allocation call site outside a point's function or scope.
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

/// `try_alloc!(expr)`: a fault point (class `memory`, keyed by this call
/// site's `FILE:LINE`) in front of a fallible allocation of the kernel's
/// own: `Vec::try_with_capacity`, `try_reserve`, `Box::try_new`,
/// `Arc::try_new`, or a closure doing several as one allocation scope.
/// `expr` is any `Result`; armed, the point returns
/// `Err(AllocError::OutOfMemory)` without evaluating `expr`, so the site's
/// error path runs as it would when memory runs out; otherwise `expr`'s
/// error becomes `AllocError::OutOfMemory` too.
///
/// ```ignore
/// let mut list = magpie::try_alloc!(Vec::try_with_capacity(n))?;
/// ```
#[macro_export]
macro_rules! try_alloc {
    ($alloc:expr) => {
        if $crate::alloc_fault!() {
            ::core::result::Result::Err($crate::debug::fault::AllocError::OutOfMemory)
        } else {
            ($alloc).map_err(|_| $crate::debug::fault::AllocError::OutOfMemory)
        }
    };
}
