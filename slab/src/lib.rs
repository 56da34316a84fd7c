//! # magpie-slab: a kernel slab allocator with magazines and tracing
//!
//! A `no_std` object-caching allocator for hobby kernels, after Bonwick's
//! slab allocator, Bonwick & Adams' magazines and depot, and Akaros'
//! `kern/src/slab.c` (including its per-cache trace table). Everything
//! machine-specific comes in through two traits: [`Platform`] (CPU id and
//! count, interrupt save/restore, clock, backtrace, context string) and
//! [`PageSource`] (whole pages in, whole pages out).
//!
//! ## Layers
//!
//! From the caller down:
//!
//! 1. **Tracing** ([`trace`](KmemCache::trace_start)): a per-cache hash of
//!    outstanding objects with backtraces. It sits above the magazines, so
//!    it sees what callers allocate and free, never objects resting in a
//!    magazine. A cache that was never traced pays one flag test per alloc
//!    and per free.
//! 2. **Magazine layer**: a per-CPU cache `{ loaded, prev, magsize }` of
//!    two magazines of constructed objects ("rounds"), behind a depot of
//!    full and empty magazines per cache. Most allocs and frees end here.
//!    The magazine size grows when the depot lock is contended. Each
//!    per-CPU cache counts the allocations and frees its magazines served
//!    ([`KmemCache::cpu_stats`], [`Allocator::cpu_stats`]).
//! 3. **Slab layer**: slabs of one page (small objects; header at the end
//!    of the page, free list through the objects) or several pages (large
//!    or `NOTOUCH` objects; a bufctl per object and a per-cache hash from
//!    address to bufctl), on empty/partial/full lists. Constructors run
//!    when objects leave this layer, destructors when they come back.
//! 4. **Page sources**: the primary one given to [`Allocator::init`], or
//!    one per cache.
//!
//! Beside them: the **bootstrap caches** holding the allocator's own
//! metadata (`kmem_magazine`, `kmem_cache`, `kmem_slab`, `kmem_bufctl`,
//! `kmem_trace`, `kmem_pcpu`; all `NOTRACE`), the **kmalloc** size classes
//! `kmalloc-8` … `kmalloc-8192` plus page-granular allocations above that,
//! and the **page map**: one word per page of the primary source's span
//! naming the slab (or large allocation) that owns the page, so `kfree`,
//! `ksize` and wrong-cache checks find the owner of any pointer.
//!
//! ## Allocation profiling and latency statistics
//!
//! Feature `alloc-profiling` (on by default for host tests; off in the
//! workspace dependency) stores a 4-byte allocation-tag reference with
//! every object callers hold and reports each allocation and free to the
//! platform (`Platform::alloc_tag_current`, `alloc_tag_add`,
//! `alloc_tag_sub`), which keeps the per-tag counters: see
//! [`AllocTagRef`], [`KmemCache::alloc_tagged`] and
//! [`Allocator::kmalloc_tagged`]. The runtime switch is
//! [`Allocator::set_alloc_profiling`] (a kernel calls it whenever its own
//! switch flips; on by default): off, nothing asks `alloc_tag_current` or
//! charges anything (a `HOT_PROFILING` bit in every cache's `hot_flags`).
//! Feature `time-stats` puts
//! `magpie-codetag` latency statistics on the slab-layer refill (`grow`)
//! and the depot exchanges (timed with `Platform::now`).
//!
//! ## Lock order
//!
//! Outermost first. A thread holding one of these may only take locks
//! further down the list:
//!
//! 1. the allocator's cache list (`for_each_cache`, `find_cache`,
//!    `reap_all`, create/destroy linking);
//! 2. a cache's per-CPU cache lock (always with interrupts disabled via
//!    [`Platform::irq_save`]);
//! 3. that cache's depot lock;
//! 4. that cache's slab-layer lock (slab lists and bufctl hash);
//! 5. that cache's trace-table lock.
//!
//! Bootstrap caches are lower than every ordinary cache, but nothing ever
//! nests into them: **no allocator lock is held while calling a page
//! source, a constructor/destructor, or another cache** (growing a slab,
//! allocating a magazine, a bufctl, a slab struct or a trace record, or a
//! bigger hash table all happen after dropping the lock and re-taking it
//! afterwards). The only nestings are: per-CPU lock → depot lock (the
//! magazine exchange), and the cache-list lock held by `reap_all` and
//! `for_each_cache` around per-cache operations (so a page source must not
//! create or destroy caches). Constructors, destructors and page sources
//! may allocate from the allocator. The page map is lock-free (atomic
//! words).
//!
//! ## Draining: how `reap` and `destroy` reach every CPU's magazines
//!
//! [`KmemCache::reap`] (and [`Allocator::reap_all`], and
//! [`KmemCache::destroy`] before it frees anything) empties the magazine
//! layer from whichever CPU calls it, without cross-CPU interrupts:
//!
//! 1. For each CPU id `0..max_cpus` in turn: disable interrupts, take that
//!    CPU's per-CPU lock, detach its `loaded` and `prev` magazines (both
//!    set to null), drop the lock, restore interrupts. Then, holding no
//!    lock, destruct their rounds and return them to the slab layer (one
//!    slab-lock acquisition per magazine) and free the magazines to
//!    `kmem_magazine`. One per-CPU lock at a time, never with the depot
//!    lock: the drain adds no nesting to the lock order.
//! 2. Take the depot lock, detach its full and empty lists, drop it, and
//!    free them the same way.
//! 3. Under the slab lock detach the empty slabs; with no lock held, clear
//!    their page-map entries and give their pages back.
//!
//! A CPU working on the cache meanwhile either finished its operation
//! under its per-CPU lock before the drain took that lock (the drain
//! moves the result) or starts after (it finds no magazines and refills
//! from the depot or the slab layer, as after boot). A round is in exactly
//! one place at every instant: a magazine held by one per-CPU cache, the
//! depot, or in transit in the one thread that detached it. So a reap
//! never loses or duplicates rounds, but objects freed while it runs may
//! be left in magazines: under load it is a best effort. `destroy`
//! requires that nobody uses the cache, so there the drain is complete;
//! it refuses with `Busy` if slabs remain. The `loom` models in
//! `src/tests/loom_models.rs` check this protocol and the depot exchange
//! under every interleaving up to a preemption bound.
//!
//! ## Statistics
//!
//! The magazine-hit paths write only the running CPU's own per-CPU cache
//! (its lock word, magazine pointers and `nr_allocs` / `nr_frees`, one
//! cache line per CPU) and the magazine itself. Counters shared between
//! CPUs are written only on misses (the slab layer's direct counts) and
//! depot exchanges; readers ([`KmemCache::stats`], [`KmemCache::cpu_stats`],
//! [`Allocator::cpu_stats`]) take each per-CPU lock in turn and sum. The
//! read-mostly fields every alloc and free reads lead [`KmemCache`]
//! (`repr(C)`), and the depot, the first field any CPU writes, starts a
//! new cache line.
//!
//! ## Hit paths
//!
//! A magazine hit is a leaf with no call that returns into it (every miss,
//! error and bookkeeping case is a tail call to an out-of-line function), so
//! it needs no callee-saved registers. **alloc**: one `hot_flags` test,
//! the per-CPU index (`min(cpu_id, last_cpu)`, no division), interrupts
//! off, the per-CPU lock (one `xchg`), pop from `loaded`, count, release
//! (one store). **free** (`KmemCache::free`, `kfree`): one page-map load
//! gives the slab, its owner is compared (`free`) or taken as the cache
//! (`kfree`: no second lookup), one 64×64→128 multiply by `ceil(2^64 /
//! stride)` both indexes the object and tests that the pointer is an object
//! start (Lemire, Kaser and Kurz 2019), then the same per-CPU steps with a
//! push. With `alloc-profiling` compiled in but switched off
//! (`set_alloc_profiling(false)`), alloc adds nothing (the switch is a bit
//! of the `hot_flags` word it tests anyway); free adds nothing until some
//! object of the cache was tagged (`HOT_TAGGED`). Measurements:
//! `docs/BENCHMARKS.md`.
//!
//! ## Debugging
//!
//! [`debug`] has the debug flags (`POISON`, `REDZONE`, `AUDIT`, `CONTENTS`,
//! consistency checks), the boot-line syntax `slab_debug=` (Linux letters,
//! optional cache list) and `kmem_flags=` (illumos hex), the poison and
//! redzone patterns, the layout of a debug object's trailer and the hardened
//! free-list pointer; [`report`] has the illumos-style error report and the
//! ring of recent reports. (They are wired into the cold paths next; see
//! issue 10.)
//!
//! ## FAQ
//!
//! **Why doesn't the magazine cache deadlock on itself?** (Akaros asks the
//! same.) A free that needs a new magazine drops its per-CPU lock before
//! allocating one from `kmem_magazine`, and the bootstrap caches have no
//! magazine layer at all: metadata is allocated straight from their slab
//! layers. `kmem_magazine`, `kmem_slab` and `kmem_bufctl` use small-object
//! slabs, which need no metadata, so allocating metadata nests at most one
//! level (a bufctl cache growing asks `kmem_slab` and `kmem_bufctl`) and
//! never returns to a lock already held.
//!
//! **Why do the bootstrap caches have no magazines?** Besides the above:
//! metadata must not strand in depots, and `kmem_pcpu` would need its own
//! per-CPU array to exist first. Callers cannot allocate from or free to
//! bootstrap caches.
//!
//! **Why a lock in each per-CPU cache?** It is uncontended on the fast
//! path (one atomic swap), and lets `reap`, `destroy` and `stats` reach
//! every CPU's magazines without cross-CPU interrupts. It also keeps the
//! allocator sound if `Platform::cpu_id` misreports.
//!
//! **Why do bufctl caches take the slab lock on every alloc and free?**
//! Bad frees are always detected for them: the bufctl records whether the
//! object is with a caller, and finding it is a hash lookup. Small-object
//! caches keep a lean fast path and detect double frees only with
//! [`CacheFlags::AUDIT`] (a per-slab bitmap, set and cleared atomically).
//! Foreign, wrong-cache and misaligned pointers are always detected (page
//! map, or header magic plus cache pointer for caches on other sources).
//!
//! **Why does magazine size grow by visits, not time?** [`Platform::now`]
//! has unknown units (TSC cycles in a kernel, a counter in tests). The
//! depot counts failed `try_lock`s; every 64 depot visits, if at least 8
//! were contended, the magazine size grows by 4 rounds (up to 62). Per-CPU
//! caches adopt the new size when they next visit the depot.
//!
//! **Why are objects at least 8-aligned?** Small slabs thread their free
//! list through free objects; a pointer must fit and be aligned.
//!
//! **Why is `align > PAGE_SIZE` refused?** Page sources give page-aligned
//! memory only; slabs and page-granular kmallocs inherit that.
//!
//! ## Sources
//!
//! - Jeff Bonwick, "The Slab Allocator: An Object-Caching Kernel Memory
//!   Allocator", USENIX Summer 1994.
//! - Jeff Bonwick and Jonathan Adams, "Magazines and Vmem: Extending the
//!   Slab Allocator to Many CPUs and Arbitrary Resources", USENIX 2001.
//! - Akaros `kern/src/slab.c` (Barret Rhoden), and the commit "slab: Add
//!   tracing infrastructure for allocs and frees" (2018).
//! - illumos `usr/src/uts/common/os/kmem.c` (bufctl audit, bad-free
//!   reports).
//! - Linux `mm/slab_common.c` (the kmalloc size classes).
//!
//! ## Adopting magpie-slab in your kernel
//!
//! 1. Implement [`Platform`] for a unit type: CPU count and id, interrupt
//!    save/restore, a clock, a frame-pointer backtrace, a context string.
//! 2. Implement [`PageSource`] over your physical memory's direct map (a
//!    buddy allocator or a simple page bitmap), with `span()` covering
//!    every page it can return.
//! 3. Declare the allocator and make it the global allocator:
//!
//! ```ignore
//! use magpie_slab::{Allocator, CacheFlags, PageSource, Platform};
//!
//! struct MyPlatform;
//! impl Platform for MyPlatform { /* ... */ }
//!
//! static MY_ARENA: MyPageAllocator = MyPageAllocator::new();
//!
//! #[global_allocator]
//! static ALLOC: Allocator<MyPlatform> = Allocator::new();
//!
//! fn kernel_main() {
//!     MY_ARENA.add_memory(/* from the memory map */);
//!     ALLOC.init(&MY_ARENA).expect("slab init");
//!     let dentry_cache = ALLOC
//!         .cache_create("dentry", 192, 64, CacheFlags::empty(), None, None, None)
//!         .expect("dentry cache");
//!     let obj = dentry_cache.alloc()?;
//!     // ...
//!     // SAFETY: `obj` came from `dentry_cache` and is not used after this.
//!     unsafe { dentry_cache.free(obj) }?;
//! }
//! ```
//!
//! Before `init` completes, `GlobalAlloc::alloc` returns null. A kernel
//! that needs a heap earlier uses a bootstrap heap and a small
//! `GlobalAlloc` shim of its own: allocate from the bootstrap heap until
//! [`Allocator::is_ready`], then from the slab allocator; on free, send a
//! pointer to [`Allocator::kfree`] if [`Allocator::owns`] it, else to the
//! bootstrap heap.
//!
//! Sizes are in bytes and page counts in pages of [`PAGE_SIZE`] bytes
//! throughout.
//!
//! ## Testing
//!
//! Host tests (a fake platform with a thread-local CPU id, a fake page
//! source with failure injection, unit tests, a `proptest` model test and
//! a multithreaded stress test with one thread per CPU) live in
//! `src/tests/`:
//!
//! ```text
//! cargo test -p magpie-slab --target x86_64-unknown-linux-gnu
//! ```
//!
//! `loom` model tests of the depot exchange and the drain protocol
//! (`src/tests/loom_models.rs`) build instead of those with
//! `--cfg loom`, which turns the cache locks into `loom` locks (see
//! `src/sync.rs`; normal builds use `spin::Mutex` unchanged):
//!
//! ```text
//! make test-loom
//! # RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom \
//! #     cargo test -p magpie-slab --target x86_64-unknown-linux-gnu --release loom
//! ```

#![no_std]
#![feature(allocator_api)]
#![deny(unsafe_op_in_unsafe_fn)]

#[cfg(test)]
extern crate std;

/// Time a section with a `magpie_codetag::time_stats!` point at the place
/// of `time_stats_end!` (feature `time-stats`; nothing without it).
/// `time_stats_start!()` reads `Platform::now` into a local.
macro_rules! time_stats_start {
    ($platform:ty) => {{
        #[cfg(feature = "time-stats")]
        let start = <$platform as $crate::Platform>::now();
        #[cfg(not(feature = "time-stats"))]
        let start = 0u64;
        start
    }};
}

macro_rules! time_stats_end {
    ($platform:ty, $start:expr) => {{
        #[cfg(feature = "time-stats")]
        magpie_codetag::time_stats!()
            .record(<$platform as $crate::Platform>::now().wrapping_sub($start));
        #[cfg(not(feature = "time-stats"))]
        let _: u64 = $start;
    }};
}

mod alloc_tag;
mod allocator;
mod cache;
pub mod debug;
mod error;
mod hash;
pub mod kmemtrace;
mod magazine;
mod pagemap;
mod platform;
pub mod report;
mod slab;
mod sync;
mod trace;

#[cfg(test)]
mod tests;

pub use alloc_tag::AllocTagRef;
pub(crate) use allocator::BootCache;
pub use allocator::{Allocator, KMALLOC_MAX_SIZE, KMALLOC_SIZES, LargeStats, natural_align};
pub use cache::{
    CacheFlags, CacheStats, CpuCacheStats, Ctor, DestroyReport, Dtor, KmemCache, SlabKind,
};
pub use error::{AllocError, DestroyError, FreeError, TraceError};
pub use kmemtrace::{
    DumpInfo, DumpSummary, KMEMTRACE_ABI_VERSION, KmemtraceConfig, KmemtraceCpuStatus,
    KmemtraceError, KmemtraceEvent, KmemtraceStatus,
};
pub use magazine::MAG_MAX_ROUNDS;
pub use platform::{ArenaStats, PAGE_SIZE, PageSource, Platform};
pub use trace::{TRACE_MAX_FRAMES, TraceRecord, TraceStats};
