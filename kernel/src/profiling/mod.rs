//! Allocation profiling and latency statistics: the kernel's side of
//! `magpie-codetag`'s allocation tags and time stats (Linux memory
//! allocation profiling, `/proc/allocinfo`).
//!
//! # What is counted
//!
//! Every allocation from the slab allocator by a caller is charged to one
//! [`AllocTag`](magpie_codetag::alloc_tag::AllocTag) (a call site in the `ALLOC_TAGS` linker section):
//!
//! * **explicit** call sites name their own tag: [`kmalloc!`](crate::kmalloc),
//!   [`kmem_cache_alloc!`](crate::kmem_cache_alloc), and the per-call-site
//!   `Kmem` handle [`tagged_alloc!`](crate::tagged_alloc) for
//!   `Box::new_in` / `Vec::new_in`;
//! * a **scope** ([`alloc_tag_scope!`](crate::alloc_tag_scope)) charges every
//!   other allocation made on this CPU while it lives — `Box`, `Vec` and
//!   `String` through the global allocator included — to its tag; nested
//!   scopes: the innermost wins, the outer one is restored when it ends;
//! * everything else goes to the `untagged` bucket, shown like any site.
//!
//! Page frames taken outside the slab allocator are charged too, by
//! [`alloc_pages!`](crate::alloc_pages) and
//! [`kpages_alloc!`](crate::kpages_alloc) to their call sites ([`pages`]):
//! `N` frames are `N x 4096` bytes and one call until they are freed.
//!
//! Bytes are class-rounded: a kmalloc of 100 bytes is charged 104
//! (`kmalloc-104`'s object size), a cache object its cache's object size, a
//! page-granular kmalloc its whole pages. `calls` is the number of live
//! objects (allocations minus frees), as in Linux.
//!
//! # Where the state lives
//!
//! * Each object's 4-byte tag reference (an `Option<AllocTagRef>`): in
//!   `magpie-slab` (see its `alloc_tag` module): a side array per small
//!   slab (allocated with the slab's first tagged object), a slot in each
//!   bufctl, the upper half of a page-granular allocation's page-map entry.
//! * Counters: [`AllocTagCounters`](magpie_codetag::alloc_tag::AllocTagCounters), one block per CPU of `{bytes, calls}`
//!   for every tag, cache-line aligned, allocated from `kpages` in
//!   [`init`](alloc_tag::init) once the CPU count is known. Each CPU's counter base
//!   (`AllocTagCounters::cpu_base`) is a word of its `PerCpu`, so a charge
//!   is one `%gs`-relative load, one compare of the reference against the
//!   number of tags, and one `add` / one `inc` (Linux's `this_cpu_add`).
//!   Allocations update only their CPU's block; `allocinfo` sums over CPUs.
//!   The object keeps its tag's charge token (`AllocTagCounters::token`:
//!   the counter's byte offset, validated once), so its free is one `sub`
//!   and one `dec` with no check.
//!   Until `init`, profiling is off.
//! * The current tag: a word of each CPU's `PerCpu`, kept as a charge
//!   token (read `%gs`-relative
//!   by the slab allocator's `AllocTagHooks::current` hook, no switch test: the
//!   slab allocator asks only while its own switch, kept equal to
//!   [`SWITCH`], is on), `untagged` from [`init`](alloc_tag::init) on; a scope guard swaps
//!   its tag in and restores the previous value (there is no scheduler).
//!
//! # Switches
//!
//! * Cargo feature `alloc-profiling` (default): without it, none of this is
//!   on any path and objects carry no reference; the macros fall back to the
//!   plain calls and `allocinfo` says it is compiled out.
//! * Boot argument `mem_profiling=0|1|never` (default 1) and
//!   `allocinfo on|off`. Turning it on after it was off marks the counts
//!   `accurate:no`: objects allocated meanwhile carry no tag and their frees
//!   subtract nothing, so no counter underflows. `never` cannot be undone.
//!
//! # Context capture
//!
//! `allocinfo ctx FILE:LINE enable` records, for each object that one site
//! allocates from then on, its address, size, CPU, timestamp, context and
//! backtrace, until the object is freed (the Linux RFC's per-callsite
//! context capture). Records live in a fixed pool of [`CTX_MAX_RECORDS`]
//! (recording never allocates, so it cannot recurse into the allocator);
//! when the pool is full the record is dropped and counted. The capture runs
//! in the slab allocator's tag hooks (`AllocTagHooks::on_charge`,
//! `AllocTagHooks::on_uncharge`), off its profiled hits; while a site is
//! captured, `kmem::ctx_capture_enable` sends every allocation and free
//! there (`AllocProfiling::set_tag_hooks`), so the hits pay nothing for
//! capture, armed or not.
//!
//! # Latency statistics
//!
//! `timestats` prints every `magpie_codetag::time_stats!` point: the slab
//! layer's refill (`grow`) and depot exchanges (feature `time-stats`),
//! recorded in TSC cycles and printed in ns/µs/ms/s with the unit
//! (`magpie_slab::reports::write_time_stats`).
//!
//! # Files
//!
//! * [`alloc_tag`]: counters, switch, charge and uncharge (the platform
//!   hooks), the scope guard, reading the counters; below the slab
//!   allocator (imports `arch` and [`capture`] only);
//! * [`capture`]: context capture in the slab allocator's tag hooks
//!   (imports `arch` and `tracing`);
//! * [`pages`]: code tags on page frames (`alloc_pages!`, `kpages_alloc!`,
//!   the frame allocator's counting);
//! * [`tagged`]: the call-site forms that allocate (`kmalloc!`,
//!   `kmem_cache_alloc!`, `kmalloc_box!`, `kmem_cache_alloc_box!`,
//!   `TaggedAlloc`), above [`SLAB`](crate::kmem::SLAB).

pub mod alloc_tag;
pub mod capture;
pub mod pages;
pub mod tagged;

pub use self::alloc_tag::{
    AllocTagScope, COMPILED_IN, COUNTERS, DiffRow, SWITCH, counts_of_function, current_tag, diff,
    explicit_tag, mark, totals, untagged_counts,
};
pub use self::capture::{
    CTX_MAX_RECORDS, EMPTY_RECORD, ctx_copy, ctx_is_capturing, ctx_nr_dropped, ctx_records,
};
pub(crate) use self::capture::{ctx_disable, ctx_enable};
pub use self::tagged::TaggedAlloc;
