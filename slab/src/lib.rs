//! # magpie-slab: a kernel slab allocator with magazines and tracing
//!
//! A `no_std` object-caching allocator for hobby kernels, after Bonwick's
//! slab allocator, Bonwick & Adams' magazines and depot, and Akaros'
//! `kern/src/slab.c`. The main type is [`Kmem`]: the kmalloc size
//! classes, object caches ([`KmemCache`]), `GlobalAlloc` and
//! `core::alloc::Allocator`.
//!
//! ## One way to get started
//!
//! 1. **Say what the machine is**: implement [`Platform`] (an `unsafe
//!    trait`; five functions: `max_cpus`, `cpu_id`, `irq_save`,
//!    `irq_restore`, `now`) and an empty [`PlatformHooks`] (stacks,
//!    profiling tags and KFENCE's pool are hooks with defaults), or take
//!    the shipped platform of your architecture: `glue::X86_64`,
//!    `glue::Riscv64` (or `Riscv64Machine`), `glue::Aarch64` (features
//!    `x86_64`, `riscv64`, `aarch64`; one CPU, or several with a
//!    [`glue::Kernel`]).
//! 2. **Declare the heap** in a `static` and make it the global
//!    allocator: [`glue::Heap`] (the allocator and a page source over one
//!    mapped region, [`glue::RegionSource`]), or an [`Kmem`] with
//!    any [`PageSource`] of yours.
//! 3. **Hand it its memory** once, early: `HEAP.init_region(start, len)`
//!    (or `Kmem::init(&source)`). From then on `Box`, `Vec` and
//!    `String` go through the magazines; make object caches with
//!    [`Kmem::cache_create`]`(name, size, &CacheArgs { .. })`.
//!
//! ```no_run,standalone_crate
//! use magpie_slab::glue::Heap;
//! use magpie_slab::{AllocTagHooks, CacheArgs, Platform, PlatformHooks};
//!
//! struct MyPlatform;
//! // SAFETY: one CPU and no interrupts: nothing else runs allocator code.
//! unsafe impl Platform for MyPlatform {
//!     fn max_cpus() -> usize { 1 }
//!     fn cpu_id() -> usize { 0 }
//!     fn irq_save() -> usize { 0 }
//!     fn irq_restore(_state: usize) {}
//!     fn now() -> u64 { 0 }
//! }
//! // SAFETY: the defaults: no stacks, no KFENCE pool; no profiling tags.
//! unsafe impl PlatformHooks for MyPlatform {}
//! unsafe impl AllocTagHooks for MyPlatform {}
//!
//! #[global_allocator]
//! static HEAP: Heap<MyPlatform> = Heap::new();
//!
//! fn kernel_main(start: usize, len: usize) -> Result<(), magpie_slab::AllocError> {
//!     // SAFETY: the range is mapped, writable and the heap's alone.
//!     unsafe { HEAP.init_region(start, len)? };
//!     let inodes = HEAP.cache_create("inode", 256, &CacheArgs { align: 64, ..CacheArgs::DEFAULT })?;
//!     let inode = inodes.alloc_box()?; // owned: freed without `unsafe`
//!     inode.free().expect("a valid free");
//!     Ok(())
//! }
//! # fn main() {}
//! ```
//!
//! The diagnostics hang off the heap by feature, each a handle with its
//! own methods: `HEAP.debug()` (error reports and hooks, `verify`,
//! `whatis`), `HEAP.stats()`, `HEAP.kmemtrace()` (the event stream,
//! feature `kmemtrace`), `cache.trace_table()` (the Akaros trace table,
//! feature `trace-table`), `HEAP.profiling()` (allocation tags, feature
//! `alloc-profiling`), `HEAP.kfence()` (feature `kfence`),
//! `leak_scan::LeakScan` (feature `leak-scan`); the reports (`kmemstat`, `slabinfo`, `allocinfo`, the
//! trace print, `whatis`) are functions in [`reports`] writing to any
//! `core::fmt::Write`. `docs/ADOPTING.md` is the longer path.
//!
//! **Cargo features** (none by default: the allocator alone). Each
//! diagnostic is a folder that owns its state, hooks, report and API;
//! off, the cache and kmalloc paths call empty inline stubs
//! (`<feature>/off.rs`, Linux's `!CONFIG_*` stubs) and there is no API:
//! `kfence`, `trace-table`, `kmemtrace`, `leak-scan`, `alloc-profiling`
//! (with `allocinfo` its report and `time-stats` the latency points), and
//! `descriptor` (what a reader of a memory image finds the allocator by:
//! `descriptor`, the table writers of `reports`; turns on `trace-table`
//! and `kmemtrace`, which it describes). `x86_64`, `riscv64`, `aarch64`
//! are the shipped platforms; `nightly` the `core::alloc::Allocator`
//! impl and the restartable hits.
//!
//! **Why is the main type called `Kmem`?** It is the kmem allocator of
//! Bonwick's paper and of illumos (`kmem_alloc`, `kmem_cache_create`,
//! `kmem_flags`, `::kmem*`), whose words the shell speaks (`kmemstat`,
//! `kmem verify`), and its caches are `KmemCache`s. The name it had,
//! `Allocator`, collided with `core::alloc::Allocator`, which the crate
//! implements for `&'static Kmem<P>`; `Slab` names a slab of the slab layer here,
//! and `glue::Heap` the allocator with its page source.
//!
//! ## Layers
//!
//! From the caller down (each layer is a folder or a file of `src/`, and
//! imports only the ones below it):
//!
//! 1. **Kmem** (`allocator/`): [`Kmem`], all global state —
//!    `init` and the bootstrap caches, the cache list, kmalloc (size
//!    classes and page-granular allocations: `kmalloc`, the one
//!    `kmalloc_with(KmallocArgs)` for a tag, a call site's copy or
//!    zeroing, `kcalloc`, `krealloc`), `kfree`, the `GlobalAlloc` shims,
//!    error reports, the kmemtrace switches.
//! 2. **The cache** (`cache/`): [`KmemCache`], the only home of its
//!    `impl` blocks: the alloc and free paths (the hits, one slow
//!    function each way, the hooks of flagged caches), and everything
//!    that needs the whole cache (reap, statistics, verify, debug,
//!    profiling and the trace table's switch). It ties the layers below
//!    together; the cache and the allocator point at each other (a cache
//!    reports to its allocator and takes metadata from its bootstrap
//!    caches), the one pair of files that import each other.
//! 3. **Tracing** (`trace_table/`, the Akaros trace table, feature
//!    `trace-table`; not the
//!    kmemtrace event stream of `kmemtrace/`): a per-cache hash of
//!    outstanding objects with backtraces. It sits above the magazines,
//!    so it sees what callers allocate and free, never objects resting in
//!    a magazine. A cache that was never traced pays nothing for it (a
//!    bit of the `hot_flags` word every alloc and free tests anyway).
//! 4. **Magazine layer** (`magazine/`): a per-CPU cache `{ loaded,
//!    prev }` of two magazines of constructed objects ("rounds"), owned by
//!    its CPU, behind a depot (`magazine/depot.rs`) of full and empty
//!    magazines per cache; it knows magazines, not slabs. Most
//!    allocs and frees end here, touching nothing but their CPU's cache
//!    line and the magazine. Magazines are sized to their capacity
//!    (Bonwick & Adams 2001 §3.3): one bootstrap cache per magazine type,
//!    `kmem_magazine_1`, `_3`, `_6`, `_14`, `_29`, `_60` (the rounds a
//!    magazine of that cache holds; `MAGAZINE_ROUNDS`); a cache starts
//!    with the largest type whose rounds hold at most 64 KiB of its
//!    objects, so a cached object costs at most 8.6 bytes of magazine up
//!    to 128 bytes and at most 1/15 of its size above, and moves to the
//!    next type when the depot lock is contended or the depot keeps
//!    changing hands between CPUs.
//! 5. **Slab layer** (`slab/`): small-object slabs (free list
//!    through the objects; on the primary source objects up to 8 KiB, in
//!    slabs of 1 to 8 pages (to 32 above 1 KiB) chosen for the least
//!    waste, the header at the
//!    end of the slab or from `kmem_slab` — `layout/geometry.rs`) or bufctl
//!    slabs (larger or `NOTOUCH` objects; a bufctl per object and a
//!    per-cache hash from address to bufctl), on empty/partial/full lists;
//!    allocation takes from the fullest partial slab first.
//!    Constructors run when objects leave this layer, destructors when they
//!    come back; bufctl states change here too. It is handed its parameters
//!    (`&SlabParams`: geometry, page source, constructor) and calls back
//!    through a small trait (`SlabOwner`: the error sink, the bootstrap
//!    caches its metadata comes from, the debug hooks), never the cache
//!    itself.
//! 6. **Layout** (`layout/`): slab geometry, the hardened free list, the
//!    address hash, the page map and its typed entry (`PageEntry`); it
//!    imports nothing above it.
//! 7. **Page sources**: the primary one given to [`Kmem::init`], or
//!    one per cache.
//!
//! Beside them: the **bootstrap caches** holding the allocator's own
//! metadata (`kmem_magazine_<N>` for each magazine type, `kmem_cache`,
//! `kmem_slab`, `kmem_bufctl`, `kmem_trace`, and with
//! `alloc-profiling` the tag side arrays' `kmem_tags_32` …
//! `kmem_tags_2048`; all `NOTRACE`), the **kmalloc** size classes
//! `kmalloc-8` … `kmalloc-8192` (152 classes: 8 bytes apart up to 128,
//! then eight per power of two up to 1 KiB, so above 64 bytes rounding
//! wastes less than 12.5 %, then 64 bytes apart, less than 1/16 and
//! 0.74 % on average up to 8 KiB; the Linux classes among them) plus page-granular
//! allocations above that (`allocator/kmalloc.rs`), and the **page
//! map**: a slot per page of the primary source's span naming the slab
//! (or large allocation) that owns the page, so `kfree`, `ksize` and the
//! free's owner check find the owner of any pointer.
//!
//! ## Reading the crate
//!
//! Start with `cache/mod.rs`: the call graph of every alloc and free
//! path, from the entry points (`KmemCache::alloc`/`free`,
//! `kmalloc`/`kfree`, `GlobalAlloc`) to the magazine hit and its misses.
//! Then `cache/alloc.rs` and `cache/free.rs`, each one direction read top
//! to bottom (the hit; with a feature on, the hooked path; the one slow
//! function; the free's hook and event in `cache/free.rs` itself), and
//! `cache/hooks.rs`, where every feature hooks into the alloc, each hook
//! called from one place. Then one folder per layer:
//!
//! | folder / file | holds | may import |
//! | --- | --- | --- |
//! | `glue/` | what a kernel adopts with: [`glue::RegionSource`] (a page source over one mapped region), [`glue::Heap`] (it and an `Kmem` in one `static`), the shipped platforms ([`glue::Machine`] over an architecture's [`glue::Arch`] and the kernel's [`glue::Kernel`]: `glue::X86_64`, `glue::Riscv64`, `glue::Aarch64`) and their cross-CPU calls | `allocator/`, below |
//! | `leak_scan.rs` | leaks by reachability (`leak_scan`, feature `leak-scan`: illumos `::findleaks`, kmemleak): the table, the mark, the groups, and a cache's busy objects | `allocator/`, `cache/`, below |
//! | `verify.rs` | `kmem verify` and `whatis`: their types ([`VerifySummary`], [`WhatIs`]), the allocator's walk and a cache's ([`KmemCache::verify`]), the invariant walker of debug builds | `allocator/`, `cache/`, below |
//! | `kfence/` | sampled guarded allocations (`kfence`, feature `kfence`: Linux KFENCE) | `allocator/`, `cache/`, below |
//! | `allocator/` | `Kmem`: `mod.rs` (struct, bootstrap caches, cache list, reap), `init.rs`, `classes.rs` (size classes created on first use on a small source), `kmalloc.rs` (size classes, `kfree`, `ksize`), `large.rs` (page-granular blocks: alloc, in-place resize, `krealloc`, free), `global_alloc.rs` (the shims), `cache_owner.rs` (what its caches ask of it: error reports into the ring and the hook, bad frees, reaps under pressure), `reap.rs` | everything below |
//! | `cache/` | `KmemCache` (see `cache/mod.rs` for its files); what it needs from the allocator is handed down as `CacheOwner` (`cache/owner.rs`, implemented in `allocator/cache_owner.rs`) | everything below (not `allocator/`) |
//! | `reports/` | every report: `error.rs` (one illumos-style [`reports::ErrorReport`] per detected error, the error ring, `kmem errors`; below the slab layer, which reports into it), and the reports as functions writing to any `fmt::Write` ([`reports`]): kmemstat, slabinfo, allocinfo, the trace print, whatis, slabtop, timestats, the time formatter, a frame-pointer backtrace walker | `allocator/`, `cache/`, below (read-only); `error.rs`: `debug/`, below |
//! | `object.rs` | [`SlabBox`], [`InitBox`]: objects owned and read without `unsafe` | `cache/`, `allocator/` |
//! | `trace_table/` | feature `trace-table`: `mod.rs` (`TraceTable`: records by address and age behind the trace lock, recording and removing, growing its hash; `TraceOwner`), `cache.rs` (the cache's switch, `KmemCache::trace_table`, and its calls into the table), `off.rs` (the stubs) | `mod.rs`: `layout/`, below; `cache.rs`: `cache/` |
//! | `magazine/` | `mod.rs`: `Magazine`, `PcpuInner` (one CPU's `loaded`/`prev`, counts); `depot.rs`: `Depot` (full and empty magazines, exchanges, working set) | `layout/`, below |
//! | `slab/` | `mod.rs`: `Slab`, `Bufctl`, `SlabLists` (the lists and bufctl hash behind the slab lock); `layer.rs`: `SlabParams`, `SlabOwner`, `SlabLayer` (growing and reaping slabs, objects taken and given back in batches, the hash's table) | `constructor.rs`, `debug/`, `reports/error.rs`, `layout/`, below |
//! | `constructor.rs` | [`Ctor`], [`Dtor`] and the objects they see ([`ObjectInit`], [`Constructed`], [`ObjectRef`]) | nothing |
//! | `debug/` | debug flags and boot-line config, the debug object (`debug/layout.rs`: where poison, redzone, state word and audit sit; `debug/object.rs`: their fills and checks and a debug cache's alloc and free hooks), the handle [`debug::SlabDebug`] (`debug/control.rs`: the error ring and hooks, the config, above the allocator) | `flags.rs`, below |
//! | `layout/` | `geometry.rs`, `freelist.rs` (hardened free list), `hash.rs` (`AddrHash`: the bufctl hash and the trace table), `pagemap.rs` (`PageMap`, `PageEntry`) | `flags.rs`, `platform.rs`, `sync.rs`, `error.rs` |
//! | `flags.rs`, `alloc_tag/`, `stats.rs`, `error.rs`, `platform.rs`, `sync.rs`, `restart.rs` | [`CacheFlags`] and [`debug::DebugFlags`] (defined once), allocation tags (their handle [`AllocProfiling`], `alloc_tag/control.rs`, sits above the allocator, as `debug/control.rs`'s [`debug::SlabDebug`] does), statistics types, errors, [`Platform`] and [`PageSource`], the locks (taken with interrupts off), [`IrqGuard`] the per-CPU in-use flag, and the restartable hits' sequences and ranges table | nothing above |
//! | `kmemtrace/` | feature `kmemtrace`, the event stream: `mod.rs` (recording, stacks, the dump written with `magpie-kmemtrace-format`), `rings.rs` (the per-CPU rings' memory), `config.rs` (geometry, errors, status), `control.rs` (the handle `Kmem::kmemtrace` and the allocator's calls), `off.rs` (the stubs) | `platform.rs`; `control.rs`: `allocator/`, `cache/` |
//!
//! `python3 ../shared/tools/import_circles.py slab/src` finds no circle:
//! each layer imports only the layers below it.
//!
//! ## Allocation profiling and latency statistics
//!
//! Feature `alloc-profiling` (on by default for host tests; off in the
//! workspace dependency) stores a 4-byte allocation-tag reference with
//! every object callers hold — for small slabs in a per-slab side array
//! allocated with the slab's first tagged object (`kmem_tags_<bytes>`;
//! the slab layout is the same with the feature and without) — and
//! reports each allocation and free to the
//! platform (`AllocTagHooks::current`, `AllocTagHooks::add`,
//! `AllocTagHooks::sub`), which keeps the per-tag counters: see
//! [`AllocTagRef`] (a `NonZeroU32`: "no tag" is `None`, and an
//! `Option<AllocTagRef>` is what each object's 4-byte slot holds),
//! [`KmemCache::alloc_tagged`] and [`KmallocArgs::tag`]. The
//! runtime switch is [`AllocProfiling::set_enabled`](crate::AllocProfiling::set_enabled) (a kernel calls
//! it whenever its own switch flips; on by default): off, nothing asks
//! `AllocTagHooks::current` or charges anything (a `PROFILING` bit in every
//! cache's `hot_flags`) and both hits cost what they cost compiled out
//! (the free's `TAGGED` bit is one more bit of the one `FREE_SLOW` mask
//! test). On, the profiled hit of a small-object cache is one tail call
//! away: the magazine hit, then the tag reference stored (alloc: one
//! multiply for the object index; no flag test, `TAGGED` is set with
//! `PROFILING`) or cleared (free: the index the owner check computed,
//! passed on in a register) and the tag charged — one `add` per counter
//! at a `%gs`-relative per-CPU counter base (`magpie-codetag`'s
//! `AllocTagCounters`). Objects keep a **charge token**, the form of the
//! tag the platform checked once (`AllocTagHooks::token`,
//! `AllocTagHooks::current_token`: e.g. the counter's byte offset, checked when
//! a scope sets the current tag), so neither the charge nor the free
//! checks it again (`unsafe` hooks `AllocTagHooks::charge`,
//! `AllocTagHooks::uncharge`); a forged reference from a safe caller of
//! `alloc_tagged` is checked at the token hook and never indexes anything.
//! The defaults are the reference itself and `AllocTagHooks::add`/`sub`. The
//! profiled hits call out to nothing: work too slow for them (a context
//! capture of one site, say) goes in `AllocTagHooks::on_charge` and
//! `AllocTagHooks::on_uncharge`, called on every charge off the hits, and
//! [`AllocProfiling::set_tag_hooks`](crate::AllocProfiling::set_tag_hooks) sends every allocation off the hits
//! while the platform needs them all.
//! Feature `time-stats` puts `magpie-codetag` latency
//! statistics on the slab-layer refill (`grow`) and the depot exchanges
//! (`exchange_for_full`, `exchange_for_empty`; timed with
//! `Platform::now`).
//!
//! ## The per-CPU protocol
//!
//! A CPU's per-CPU cache of a kmem_cache (`loaded`, `prev`, its
//! counters: one cache line) belongs to that CPU (Bonwick & Adams
//! 2001: the common case touches only the CPU's own cache; Linux SLUB's
//! per-CPU sheaves work the same way). It has no lock:
//!
//! - **Its own CPU** reaches it through its in-use flag, at `pcpu_array() +
//!   Platform::cpu_offset()` (a kernel reads the offset `%gs`-relative in
//!   one instruction; the array follows the cache's struct in its
//!   `kmem_cache` object at a constant offset, so a hit computes the
//!   line's address from the cache's and loads no pointer to it): one non-atomic `sub` on x86-64 (elsewhere a plain
//!   load and store) takes the flag (Linux's `local_trylock`, as SLUB's
//!   sheaves use it), with interrupts on when
//!   the platform sets `Platform::LOCAL_TRYLOCK` (else also with them off,
//!   [`IrqGuard`]). The only code that can run on that CPU meanwhile is an
//!   interrupt handler, which finds the flag held and takes the locked
//!   slow path instead, so the hit is plain loads and stores: no atomic
//!   read-modify-write, no lock, no `cli`.
//! - **Or with no flag at all**, when the platform sets
//!   `Platform::RESTARTABLE_HITS` (x86-64; the Magpie kernel does): the
//!   plain hits are restartable sequences ([`restart`]; Bershad et al.
//!   1992, Linux `rseq`), one `asm!` block each that ends in one
//!   committing store of `top`; an interrupt that lands before the commit
//!   sends the hit back to its start ([`restart::restart_ip`], called by
//!   the platform's interrupt entry), so the handler can use the per-CPU
//!   cache freely. Everything else that reaches it with interrupts on (the
//!   recorded hits) disables interrupts.
//! - **Any other CPU** that needs it — [`KmemCache::reap`] and
//!   [`Kmem::reap_all`] (drain), [`KmemCache::destroy`] (drain),
//!   statistics ([`KmemCache::stats`], [`KmemCache::cpu_stats`],
//!   [`HeapStats::cpu`]), the loom models' magazine resize — asks
//!   that CPU to do it, through [`Platform::cross_cpu_call`]: the kernel
//!   runs the closure in the target's IPI handler (interrupts off there,
//!   so never inside one of its hits), as Linux's `flush_all` does.
//!   The closure only reads or detaches: a drain takes `loaded` and
//!   `prev` (both become the shared empty sentinel) and hands them back;
//!   the caller destructs their rounds and frees the magazines on its own
//!   CPU with no lock held.
//!
//! Then the depot's lists are detached under the depot lock, and the
//! empty slabs under the slab lock. A CPU working on the cache meanwhile
//! either finished its hit before the call ran (the drain moves the
//! result) or starts after (it finds no magazines and refills from the
//! depot or the slab layer, as after boot). A round is in exactly one
//! place at every instant: a magazine held by one per-CPU cache, the
//! depot, or in transit in the one thread that detached it. So a reap
//! never loses or duplicates rounds; objects freed while it runs may be
//! left in magazines: under load it is a best effort. `destroy` requires
//! that nobody uses the cache, so there the drain is complete; it refuses
//! with `Busy` if slabs remain. The `loom` models in
//! `src/tests/loom_models.rs` act this protocol out (a loom mutex per CPU
//! for "interrupts off", taken by cross-CPU calls too) and check it and
//! the depot exchange under every interleaving up to a preemption bound.
//!
//! Magazine resizing needs no cross-CPU call: the depot moves to the next
//! magazine type under its lock; a CPU keeps using the magazines it holds
//! (each carries its own capacity, which its per-CPU cache copies for the
//! hits) and gets new-type
//! ones at its next depot exchange, where empty old-type ones are freed.
//!
//! ## Lock order
//!
//! Outermost first. A thread holding one of these may only take locks
//! further down the list:
//!
//! 1. the allocator's cache list (`for_each_cache`, `find_cache`,
//!    `reap_all`, create/destroy linking);
//! 2. interrupts off on this CPU ([`IrqGuard`]) — every lock below is
//!    taken with them off, so an interrupt handler that allocates never
//!    spins on a lock the code it interrupted holds — and this CPU's
//!    per-CPU in-use flag (owning its per-CPU cache; tried, never waited
//!    for);
//! 3. a cache's depot lock;
//! 4. that cache's slab-layer lock (slab lists and bufctl hash);
//! 5. that cache's trace-table lock.
//!
//! A cross-CPU call is made with interrupts on and no allocator lock held
//! but the cache list (`reap_all`, `for_each_cache` callers); its closure
//! takes no lock. Bootstrap caches are lower than every ordinary cache,
//! but nothing ever nests into them: **no allocator lock is held, and
//! interrupts are not held off, while calling a page source, a
//! constructor/destructor, or another cache** (growing a slab, allocating
//! a magazine, a bufctl, a slab struct or a trace record, or a bigger hash
//! table all happen after dropping the lock and re-taking it afterwards).
//! The only nestings are: interrupts off → depot lock (the magazine
//! exchange), and the cache-list lock held by `reap_all` and
//! `for_each_cache` around per-cache operations (so a page source must not
//! create or destroy caches). Constructors, destructors and page sources
//! may allocate from the allocator. The page map is lock-free (atomic
//! words).
//!
//! ## Giving memory back
//!
//! - **Working set** (Bonwick & Adams 2001 §3.7, illumos
//!   `kmem_depot_ws_update` / `kmem_depot_ws_reap`):
//!   [`Kmem::kmem_update`], run by the kernel every few seconds,
//!   starts a new interval in every depot and frees the magazines (and
//!   their rounds) no CPU needed during the whole last interval, then
//!   every empty slab. After a burst, memory comes back one idle interval
//!   later; a steady load keeps its magazines.
//! - **Under pressure**: when a page source runs dry, the allocation
//!   reaps caches (as [`KmemCache::reap`]: every CPU's magazines by
//!   cross-CPU calls, the depot, the empty slabs), those with the largest
//!   objects first, and stops as soon as its pages fit; only when they
//!   still do not after every cache (as [`Kmem::reap_all`]) does it
//!   return `OutOfMemory` ([`HeapStats::nr_pressure_reaps`] counts the
//!   reaps). So an allocation that may run out of memory must be made with
//!   interrupts on, like any reap (the cross-CPU calls); if the cache list
//!   is held (a `for_each_cache` callback allocating) it fails without
//!   the reap.
//! - **Explicitly**: [`KmemCache::reap`], [`Kmem::reap_all`] (the
//!   kernel's `reap` command).
//!
//! [`HeapStats::metadata`] and [`CacheStats::waste_bytes`] say where
//! the memory that holds no object goes.
//!
//! ## Statistics
//!
//! The magazine hits write only the running CPU's own per-CPU cache and
//! the magazine. Counting is at exchanges: the alloc hit adds one to its
//! CPU's `nr_allocs` (a plain add in the line it writes anyway), the free
//! hit counts nothing; each CPU counts the rounds its magazines received
//! from or gave to the depot and to drains, and its frees are derived
//! exactly: `frees = rounds held − rounds exchanged in + allocs`.
//! Counters shared between CPUs are written only on misses (the slab
//! layer's direct counts) and depot exchanges. Readers
//! ([`KmemCache::stats`], [`KmemCache::cpu_stats`], [`HeapStats::cpu`])
//! read each CPU's figures on that CPU (a cross-CPU call) and sum. The
//! read-mostly fields every alloc and free reads lead [`KmemCache`]
//! (`repr(C)`), and the depot, the first field any CPU writes, starts a
//! new cache line.
//!
//! ## Hit paths
//!
//! See `cache/mod.rs`. One hit per direction, the same for every entry
//! point (`KmemCache`, kmalloc and kfree, `GlobalAlloc`): one
//! `hot_flags` test (no feature on for this cache), then the magazine
//! hit. Past it, one function: with a feature on, the hooked path (the
//! feature hooks around the same magazine hit and miss,
//! `cache/hooks.rs`); else the one slow function for the miss. Results
//! are `Result`s throughout ([`AllocError`] is word-sized, so
//! `Result<NonNull<u8>, AllocError>` comes back in two registers);
//! `GlobalAlloc` turns an error into null in its own out-of-line
//! function past the hit, so the hit is a leaf with no call that returns
//! into it and needs no callee-saved register or stack frame. **alloc**:
//! one `hot_flags` test, the per-CPU base, its in-use flag taken (or,
//! with [`Platform::RESTARTABLE_HITS`], a restartable sequence:
//! `restart.rs`), pop from `loaded`, count, the flag given back. The per-CPU cache keeps `loaded`'s
//! top and end as slot pointers itself (Bonwick & Adams 2001's
//! `cc_rounds`, `cc_magsize`; equal with the absent magazine, a shared
//! sentinel: no null test; the word below slot 0 is null, so an empty
//! magazine's "top round" is the empty test), so a hit touches the
//! per-CPU line and one round slot, not the magazine's header (code off
//! the hits writes the count back first: `PcpuSynced`). **free**
//! (`KmemCache::free`, `kfree`, `GlobalAlloc::dealloc`; all three
//! through `free_hit`): one page-map load gives the slab, its
//! owner is compared (`free`) or taken as the cache (`kfree`), one
//! 64×64→128 multiply by `ceil(2^64 / stride)` both indexes the object and
//! tests that the pointer is an object start (Lemire, Kaser and Kurz
//! 2019), then the same per-CPU steps with the free key's test and a
//! push. Measurements: `docs/BENCHMARKS.md`. Nested source calls of a
//! plain `KmemCache::alloc` hit, all inlined: `alloc`, `alloc_at`,
//! `alloc_hit`, `magazine_alloc_hit` (`cache/alloc.rs`), the
//! flag test and the in-use flag (`sync.rs`, `magazine/mod.rs`,
//! `cache/magazines.rs`), the free key (`cache/double_free.rs`).
//!
//! ## Debugging
//!
//! After illumos `kmem_flags` and Linux `slab_debug` (see [`debug`] for
//! the object layout and [`reports`] for the report format):
//!
//! - **Debug flags** per cache ([`CacheFlags::POISON`], `REDZONE`,
//!   `AUDIT`, `CONTENTS`, `CONSISTENCY`; feature `debug`, without which
//!   they are ignored, as Linux without `CONFIG_SLUB_DEBUG` ignores
//!   `slub_debug=`), from `cache_create` or from the boot line
//!   (`SlabDebug::set_config` with a `debug::SlabDebugConfig` parsed
//!   from `slab_debug=` or `kmem_flags=`, before `init`). A debug cache has the `DEBUG` hot flag:
//!   every alloc and free takes the cold path, and each object carries a
//!   trailer (redzone, state word, free-list link, audit records,
//!   contents). Plain caches pay nothing new on the hit.
//! - **Reports**: every error detected (with or without flags) becomes one
//!   [`reports::ErrorReport`] — kept in a ring ([`SlabDebug::read_errors`](crate::debug::SlabDebug::read_errors))
//!   and handed to the kernel's hook ([`SlabDebug::set_error_hook`](crate::debug::SlabDebug::set_error_hook)) with no
//!   allocator lock held. Detection never panics; the kernel decides.
//! - **Hardened free lists** (`layout/freelist.rs`): small-slab links are stored as `next ^ secret ^
//!   swab(link address)` and checked against the slab's free map when
//!   followed; a bad link is reported and the list rebuilt from the map.
//!   The allocator never hands out memory it does not own.
//! - **Double frees without flags**: every one, wherever the first free
//!   went, by the free key (glibc's tcache key, `cache/double_free.rs`):
//!   the free hit tests and writes a per-boot secret in the object's
//!   first word, the alloc clears it, and the free's miss confirms a
//!   match by a search of the magazines, the depot and the slab before
//!   refusing (no false positive). Caches whose objects keep their first
//!   word (a constructor's, `NOTOUCH`) mark freed objects after the
//!   object or in the bufctl; the slab layer refuses a double free of an
//!   object back in its slab (the free map). Refused and reported; a
//!   slab's busy count never drops for an object that was not busy, so
//!   `reap` and `destroy` never free a page holding a live object they
//!   counted. With any debug flag, the state word checks it too.
//! - **Walkers**: [`KmemCache::verify`] / [`SlabDebug::verify`](crate::debug::SlabDebug::verify) (`kmem
//!   verify`), [`SlabDebug::whatis`](crate::debug::SlabDebug::whatis) (`kmem whatis`), and in debug builds
//!   [`SlabDebug::check_invariants`](crate::debug::SlabDebug::check_invariants), which the model tests run after every
//!   step.
//!
//! ## FAQ
//!
//! **Why doesn't the magazine cache deadlock on itself?** (Akaros asks the
//! same.) A free that needs a new magazine turns interrupts back on before
//! allocating one from its `kmem_magazine_<N>` cache (and a depot exchange
//! frees an old-type magazine only after interrupts are back on), and the
//! bootstrap caches have no magazine layer at all: metadata is allocated
//! straight from their slab layers. The magazine caches, `kmem_slab` and
//! `kmem_bufctl` use small-object
//! slabs, which need no metadata, so allocating metadata nests at most one
//! level (a bufctl cache growing asks `kmem_slab` and `kmem_bufctl`) and
//! never returns to a lock already held.
//!
//! **Why do the bootstrap caches have no magazines?** Besides the above:
//! metadata must not strand in depots, and `kmem_cache`, which holds every
//! cache's per-CPU array, would need its own to exist first. Callers
//! cannot allocate from or free to bootstrap caches.
//!
//! **Why no lock in a per-CPU cache?** The lock it used to have cost a
//! locked `xchg` on both sides of every hit (the uncontended case). With
//! interrupts off the CPU owns its cache; the rare visitors (reap,
//! destroy, statistics) pay a cross-CPU call instead. The price: the
//! [`Platform`] contract (an `unsafe trait`) must be kept — `cpu_id` is
//! exact and exclusive while interrupts are off.
//!
//! **How are double frees caught without debug flags?** By the free key
//! (glibc's tcache `key`, 2.29; `cache/double_free.rs`): a per-boot
//! secret, not a valid pointer, which the free hit writes into the
//! object's first word after testing that it is not there already, and
//! which the alloc hit clears (load, compare, store on the free, one
//! store on the alloc: +3 instructions a pair). An object holding the key
//! was freed already, wherever it rests; the miss confirms the match by
//! a search of every magazine, the depot and the slab before refusing,
//! so a caller's word that happens to equal the key is no false
//! positive. Keyless caches (a constructor's state or `NOTOUCH` own the
//! first word) mark freed objects in a word after the object or in the
//! bufctl; debug caches have the state word. Foreign, wrong-cache and
//! misaligned pointers are always detected (page map, or header magic
//! plus cache pointer for caches on other sources).
//!
//! **Why does magazine size grow by visits, not time?** [`Platform::now`]
//! has unknown units (TSC cycles in a kernel, a counter in tests). The
//! depot counts failed `try_lock`s and hand-offs (a visit by another
//! CPU than the visit before: the depot's lines and the magazines move
//! between caches, which costs more than the exchange even uncontended);
//! every 64 depot visits, if at least 8 were contended or 16 were
//! hand-offs, the depot moves to the next magazine type (3 → 6 → 14 → 29
//! → 60 rounds), up to the largest whose rounds hold at most 128 KiB of
//! objects. Per-CPU caches get the new type when they next visit the
//! depot. Hand-offs were added because the lock is almost never
//! contended on two CPUs trading 8 KiB objects (0 failed `try_lock`s in
//! a 2-thread run of the bench's 8–8192 B mix), while its lines still
//! moved on every hand-off.
//!
//! **Why several magazine caches?** A magazine holds pointers, 8 bytes a
//! round; one size for all (62 slots in 512 bytes, filled to 8 rounds)
//! cost 64 bytes of metadata per cached object, so freeing a burst of small
//! objects made memory grow. Sized magazines (illumos `kmem_magtype`) cost
//! what they hold: 8.5 bytes per round in a 60-round magazine.
//!
//! **Why does the slab layer not take the cache?** So that it can be read
//! (and tested) alone, and so that no lower layer reaches back up: it is
//! given its `SlabParams` and a `SlabOwner` (an error sink, the bootstrap
//! caches of its metadata, the debug hooks) that the cache implements, as Asterinas'
//! slab knows only its slot size. The cache keeps the one copy of its
//! `SlabParams` (`repr(C)`, the fields the hits read first) right after
//! its own hot fields and passes `&self.params` down on every call, so
//! the hits still find all they read in one cache line and the struct
//! is no larger than before the split (15 cache lines,
//! `tests::magazines::hot_fields_first`).
//!
//! **Why are objects at least 8-aligned?** Small slabs thread their free
//! list through free objects; a pointer must fit and be aligned.
//!
//! **How is `align > PAGE_SIZE` served?** Page sources give page-aligned
//! memory only, so caches refuse it; a kmalloc aligned above a page is
//! page-granular: `align / PAGE_SIZE - 1` more pages are taken and the
//! slack before and after the aligned block is marked in the page map
//! (`kfree` returns all of it).
//!
//! ## Sources
//!
//! - Jeff Bonwick, "The Slab Kmem: An Object-Caching Kernel Memory
//!   Kmem", USENIX Summer 1994.
//! - Jeff Bonwick and Jonathan Adams, "Magazines and Vmem: Extending the
//!   Slab Kmem to Many CPUs and Arbitrary Resources", USENIX 2001.
//! - Akaros `kern/src/slab.c` (Barret Rhoden), and the commit "slab: Add
//!   tracing infrastructure for allocs and frees" (2018).
//! - illumos `usr/src/uts/common/os/kmem.c` (bufctl audit, bad-free
//!   reports).
//! - Linux `mm/slab_common.c` (the kmalloc size classes).
//!
//! ## Adopting magpie-slab in your kernel
//!
//! The fifteen-minute path, with what each step costs in memory, is
//! `docs/ADOPTING.md`; `README.md` (its examples are doctests) and
//! `examples/hobby-kernel` (x86_64) and `examples/virt-kernel` (riscv64
//! and aarch64, 4 CPUs) show it done. In short:
//!
//! 1. A kernel whose heap is one mapped range takes the shipped glue
//!    ([`glue`]): [`glue::Heap`] (the allocator and a page source over the
//!    range, [`glue::RegionSource`], in one `static`) and the platform of
//!    its architecture (`glue::X86_64`, `glue::Riscv64`, `glue::Aarch64`:
//!    features `x86_64`, `riscv64`, `aarch64`).
//! 2. Otherwise implement [`Platform`] (an `unsafe trait`: read its
//!    safety contract) for a unit type: CPU count and id, interrupt
//!    save/restore, a cross-CPU call (an IPI running a closure; the
//!    default is right for one CPU only), a clock, a backtrace, a context
//!    string; and, if memory is not one mapped range, [`PageSource`] (a
//!    buddy allocator or a page bitmap over the direct map, with `span()`
//!    covering every page it can return).
//! 3. Declare the allocator and make it the global allocator:
//!
//! ```no_run,standalone_crate
//! use magpie_slab::glue::{Heap, RegionSource};
//! use magpie_slab::{AllocTagHooks, Kmem, CacheArgs, Platform, PlatformHooks};
//!
//! struct MyPlatform;
//! // SAFETY: one CPU (the defaults of cross_cpu_call and cpu_offset are
//! // right for it), and nothing runs allocator code while "interrupts are
//! // off" but the code that turned them off (this example has no
//! // interrupts and one thread).
//! unsafe impl Platform for MyPlatform {
//!     fn max_cpus() -> usize { 1 }
//!     fn cpu_id() -> usize { 0 }
//!     fn irq_save() -> usize { 0 }
//!     fn irq_restore(_state: usize) {}
//!     fn now() -> u64 { 0 }
//! }
//! // SAFETY: the defaults: no stacks, no KFENCE pool; no profiling tags.
//! unsafe impl PlatformHooks for MyPlatform {}
//! unsafe impl AllocTagHooks for MyPlatform {}
//!
//! // Either the allocator and a region source in one static ...
//! #[global_allocator]
//! static HEAP: Heap<MyPlatform> = Heap::new();
//! // ... or the two apart (any PageSource will do).
//! static PAGES: RegionSource<MyPlatform> = RegionSource::new();
//! static SLAB: Kmem<MyPlatform> = Kmem::new();
//!
//! fn kernel_main(heap: (usize, usize), more: (usize, usize)) -> Result<(), magpie_slab::AllocError> {
//!     // SAFETY: both ranges are mapped, writable and used by nothing else.
//!     unsafe { HEAP.init_region(heap.0, heap.1)? };
//!     // SAFETY: as above.
//!     unsafe { PAGES.init(more.0, more.1)? };
//!     SLAB.init(&PAGES)?;
//!     let dentry_cache =
//!         SLAB.cache_create("dentry", 192, &CacheArgs { align: 64, ..CacheArgs::DEFAULT })?;
//!     let obj = dentry_cache.alloc()?;
//!     // ...
//!     // SAFETY: `obj` came from `dentry_cache` and is not used after this.
//!     unsafe { dentry_cache.free(obj) }.expect("a valid free");
//!     Ok(())
//! }
//! # fn main() {}
//! ```
//!
//! Before `init` completes, `GlobalAlloc::alloc` returns null. A kernel
//! that needs a heap earlier uses a bootstrap heap and a small
//! `GlobalAlloc` shim of its own: allocate from the bootstrap heap until
//! [`Kmem::is_ready`], then from the slab allocator; on free, send a
//! pointer to [`Kmem::kfree`] if [`Kmem::owns`] it, else to the
//! bootstrap heap.
//!
//! Sizes are in bytes and page counts in pages of [`PAGE_SIZE`] bytes
//! throughout.
//!
//! ## Testing
//!
//! Host tests (a fake platform with a thread-local CPU id, emulated
//! interrupts — a lock per CPU id — and cross-CPU calls, a fake page
//! source with failure injection, unit tests, a `proptest` model test and
//! a multithreaded stress test with one thread per CPU) live in
//! `src/tests/`:
//!
//! ```text
//! cargo test -p magpie-slab --target x86_64-unknown-linux-gnu
//! ```
//!
//! `loom` model tests of the per-CPU protocol, the depot exchange and the
//! drain (`src/tests/loom_models.rs`) build instead of those with
//! `--cfg loom`, which turns the cache locks into `loom` locks (see
//! `src/sync.rs`; normal builds use `spin::Mutex` unchanged) and give the
//! model platform a loom mutex per CPU for "interrupts off":
//!
//! ```text
//! make test-loom
//! # RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom \
//! #     cargo test -p magpie-slab --target x86_64-unknown-linux-gnu --release loom
//! ```

#![no_std]
// Feature `nightly`: the `core::alloc::Allocator` impl and the restartable
// hits' `asm!` (`restart.rs`), where they are built. Without it the crate
// builds on stable Rust.
#![cfg_attr(feature = "nightly", feature(allocator_api))]
#![cfg_attr(
    all(
        feature = "nightly",
        target_arch = "x86_64",
        any(target_os = "none", target_os = "linux"),
        not(miri),
        not(all(test, loom))
    ),
    feature(asm_goto_with_outputs, core_intrinsics),
    allow(
        internal_features,
        reason = "core_intrinsics for `is_val_statically_known`: the restartable hits \
                  address a one-CPU platform's per-CPU line with no offset register"
    )
)]
#![cfg_attr(all(test, not(loom), feature = "nightly"), feature(btreemap_alloc))]
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
        {
            let now = <$platform as $crate::Platform>::now();
            magpie_codetag::time_stats!().record_at(now.wrapping_sub($start), now);
        }
        #[cfg(not(feature = "time-stats"))]
        let _: u64 = $start;
    }};
}

mod alloc_tag;
mod allocator;
mod cache;
mod constructor;
pub mod debug;
#[cfg(feature = "descriptor")]
pub mod descriptor;
mod error;
mod flags;
pub mod glue;
#[cfg(feature = "kfence")]
pub mod kfence;
#[cfg(not(feature = "kfence"))]
#[path = "kfence/off.rs"]
mod kfence;
#[cfg(feature = "kmemtrace")]
pub mod kmemtrace;
#[cfg(not(feature = "kmemtrace"))]
#[path = "kmemtrace/off.rs"]
mod kmemtrace;
mod layout;
#[cfg(feature = "leak-scan")]
pub mod leak_scan;
pub mod lockdep;
mod magazine;
mod object;
mod platform;
pub mod quarantine;
pub mod reports;
pub mod restart;
mod slab;
mod stats;
mod sync;
#[cfg(feature = "trace-table")]
mod trace_table;
#[cfg(not(feature = "trace-table"))]
#[path = "trace_table/off.rs"]
mod trace_table;
mod verify;

#[cfg(test)]
mod tests;

/// `README.md`'s examples, compiled as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

/// `docs/ADOPTING.md`'s examples, compiled as doctests (in the
/// repository: the file is not in the package, and `cfg(doctest)` is off
/// when the package builds).
#[cfg(doctest)]
#[doc = include_str!("../../docs/ADOPTING.md")]
pub struct AdoptingDoctests;

pub use alloc_tag::{AllocProfiling, AllocTagRef};
#[cfg(all(test, not(loom)))]
pub(crate) use allocator::MIN_FREE_PAGES;
#[cfg(all(test, not(loom)))]
pub(crate) use allocator::kmalloc::{KMALLOC_MAX_SIZE, KMALLOC_SIZES, natural_align};
pub use allocator::kmalloc::{KmallocArgs, KmallocObj};
pub use allocator::large::LargeStats;
pub use allocator::{CacheArgs, HeapStats, InitCost, Kmem};
pub use cache::{DestroyReport, KmemCache};
pub use constructor::{Constructed, Ctor, Dtor, ObjectInit, ObjectRef, WordMismatch};
#[cfg(feature = "trace-table")]
pub use error::TraceError;
pub use error::{AllocError, DestroyError, FreeError};
pub use flags::CacheFlags;
pub use layout::geometry::SlabKind;
#[cfg(all(test, not(loom)))]
pub(crate) use magazine::MAG_MAX_ROUNDS;
pub(crate) use magazine::MAGAZINE_ROUNDS;
pub use object::{InitBox, KBox, SlabBox};
pub use platform::{
    AllocTagHooks, ArenaStats, CPU_SLOT_BYTES, PAGE_SIZE, PageSource, Platform, PlatformHooks,
};
pub use stats::{CacheStats, CpuCacheStats, MetadataStats};
pub use sync::IrqGuard;
#[cfg(feature = "trace-table")]
pub use trace_table::{CacheTrace, TRACE_MAX_FRAMES, TraceRecord, TraceStats};
pub use verify::{InvariantError, ObjectRegion, VerifySummary, WhatIs};
