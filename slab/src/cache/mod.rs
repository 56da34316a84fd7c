//! `kmem_cache`: the object cache, tying the magazine layer
//! ([`crate::magazine`]), the slab layer ([`crate::slab`]) and the trace
//! table ([`crate::trace_table`]) together. This folder is the only home
//! of `impl KmemCache`; this file holds the struct, its flags, and
//! creation and destruction. The paths:
//!
//!
//! ```text
//!  KmemCache::alloc      alloc_tagged, Kmem::kmalloc   GlobalAlloc::alloc
//!        │                  │ alloc_at (kmalloc_with:      │ the size class's
//!        │                  │ the size class's cache)      │ cache
//!        └──────────────────┴──────────────┬───────────────┘
//!                                          ▼
//!  alloc_hit: flags? ─no─► in-use flag, pop `loaded`, take the free key
//!     │ yes, or a miss (returns None: nothing changed)
//!     ▼
//!  alloc_off_hit: alloc_usual: usual words (profiling, recording) on a
//!     hit (alloc_hit::<0, _>): post_alloc_hook inline; else
//!     alloc_hooked_cold: no flag: alloc_slow (prev, depot, slab);
//!     pre_alloc_hook, hit or miss, post_alloc_hook (hooks.rs)
//!
//!  KmemCache::free   Kmem::kfree   GlobalAlloc::dealloc
//!     (page map)       locate_allocated    locate_allocated   (one page-map
//!        │                  │ free_located      │             slot, one multiply)
//!        └ free_located ────┴─────────┬─────────┘
//!                                     ▼
//!  free_hit: flags? ─no─► in-use flag, test and write the free key, push
//!     │ yes, or full (returns false: nothing changed)
//!     ▼
//!  free_off_hit: free_usual: profiling's word: free_hook inline, the
//!     hit (free_hit::<0>); else free_off_usual: no flag: free_slow
//!     (double-free confirmation, prev, depot, new magazine, slab);
//!     recording: free_hook, hit, event inline; else free_hooked: free_hook, hit or
//!     miss, the event
//!  (anything the page map does not vouch for: free_unlocated /
//!   kfree_slow, with the error reports and the page-granular kfree:
//!   allocator/large.rs)
//! ```
//!
//! **Source calls on a plain hit** (all inlined; the platform's
//! `cpu_offset`, field accessors and the guard's `get` aside), one hit
//! per direction, written top to bottom in one function of one file
//! (SLUB `slab_alloc_node` / `slab_free`, Akaros `kmem_cache_alloc` /
//! `kmem_cache_free`), taking the in-use flag itself:
//!
//! - alloc, the in-use flag (the default): `KmemCache::alloc` ►
//!   `alloc_hit` (`cache/alloc.rs`: the flag test, the per-CPU line, the
//!   pop, the free key's take, the count) ► `flags_any` and
//!   `LocalLocked::try_lock` (`sync.rs`) ► `take_flag` (`sync.rs`; the
//!   guard's drop gives the flag back): **3 calls in 2 files** (before:
//!   `alloc` ► `alloc_at` ► `alloc_hit` ► `magazine_alloc_hit` ►
//!   `PcpuCache::try_lock` (`magazine/mod.rs`) ► `LocalLocked::try_lock`
//!   ► `take_flag`, `take_key` in `cache/double_free.rs`, `pcpu_array`
//!   in `cache/magazines.rs`: 6 calls in 4 files, 5 with `pcpu_array`). With the restartable
//!   sequence: `alloc` ► `alloc_hit` ► `restart::pop` (`restart.rs`),
//!   `flags_any`: 2 calls in 3 files. `alloc_tagged` and kmalloc come
//!   through `alloc_at`, one call more; `GlobalAlloc::alloc` calls
//!   `alloc_hit` itself.
//! - free, `KmemCache::free` (the page-map slot read inline: `slot`,
//!   `magic`, `cache`, `base` of `layout/pagemap.rs`, then `index_with`
//!   ► `obj_index_with`) ► `free_located` ► `free_hit` (`cache/free.rs`:
//!   the flag test, the per-CPU line, room, the free key's test and
//!   write, the push) ► `flags_any` and `LocalLocked::try_lock` ►
//!   `take_flag` (`sync.rs`): **4 calls in 3 files** (`cache/free.rs`,
//!   `sync.rs`, `layout/pagemap.rs`; before: 6 calls in 6 files, with
//!   `free_hit` ► `magazine_free_hit` ► `PcpuCache::try_lock`, the key's
//!   `holds_key` / `write_key` in `cache/double_free.rs` and
//!   `pcpu_array`). `GlobalAlloc::dealloc` (`allocator/global_alloc.rs`)
//!   ► `KmemCache::locate_allocated` (`cache/free.rs`, with the same
//!   page-map accessors and the allocator's `page_map`) and `free_hit` ►
//!   `LocalLocked::try_lock` ► `take_flag`: 3 calls, in
//!   `global_alloc.rs`, `cache/free.rs` and `sync.rs` (before: 5 calls,
//!   `locate_allocated` in `allocator/kmalloc.rs`).
//! - a debug cache's free (docs/MODULES.md, "A debug cache's alloc and
//!   free"): `cache/free.rs` (the locate as above, `free_located`,
//!   `free_hit`'s flag test, `free_off_hit`, `free_hooked`, `free_hook`)
//!   ► `debug/object.rs` (the free check: `debug_free_hook`, the state
//!   word, redzones, audit, poison) ► `free_hit` (`sync.rs`'s in-use
//!   flag) ► `free_event`: 4 files with the locate's `layout/pagemap.rs`
//!   (before: 7, with `cache/debug.rs`, `debug/trailer.rs`,
//!   `cache/double_free.rs`; then 5, with `cache/hooks.rs`). The alloc:
//!   `cache/alloc.rs` ► `sync.rs` ► `cache/hooks.rs` ► `debug/object.rs`,
//!   4 files (before: 8).
//!
//! **What the one path costs** (callgrind, instructions per operation
//! with the bench's harness, `bench/profile.sh`; before: fa3c33a, with a
//! copy of the hit per feature and the code-generation shaping; after:
//! this shape): plain rows equal or lower (`GlobalAlloc` pair 64 → 62,
//! `kmem_cache` pair 63 → 60, mixed 50.1 → 49.1, align-4k 66.1 → 63.3,
//! batch 37.5 → 36.6; `realloc-same` 61 → 62, +2.4 % net); the kernel's
//! pair with profiling off 51 → 52 (`tests/kernel_hit.rs`). The feature
//! rows pay for going through the hooks instead of a copy of the hit
//! made for them: kmemtrace on, `GlobalAlloc` pair 140 → 248; profiling
//! on, 96 → 205; a `slab_debug=F` pair 378 → 421. The hooked path was an
//! ordinary out-of-line function (its registers saved, every feature's
//! flag tested), where each old copy was a leaf specialised for one
//! feature. So the hooked path now splits on the word: the usual words
//! (profiling, kmemtrace recording) on a hit run their hooks inline,
//! each event or rare case a tail call, no stack frame; everything else
//! takes one cold function (`alloc_hooked_cold`, `free_hooked`)
//! with every hook in order. Profiling on, `GlobalAlloc` pair 205 → 150
//! (`kmem_cache` 190 → 143, mixed 123.9 → 100.4); kmemtrace on 248 →
//! 216 (231 → 191, 142 → 126); the kernel's pair with profiling on
//! 210 → 152 (`tests/kernel_hit.rs`). Then the way into the hooked path
//! lost a layer: the `GlobalAlloc` edge hands the cache its hit found
//! to `alloc_off_hit` (no second class lookup), and `alloc_off_hit` /
//! `free_off_hit` load the hot flags once for the slow, usual and cold
//! ways (no `alloc_hooked` / `free_hooked` call between): profiling on,
//! `GlobalAlloc` pair 153 → 142 (`kmem_cache` 140 → 135, mixed 98.4 →
//! 92.9); kmemtrace on 213 → 200 (193 → 186); the kernel's pair with
//! profiling on 156 → 143. What is left over the plain pair is the
//! hooks' own work, the edge's out-of-line functions (`Kmem::alloc_off_hit`
//! turning the `Result` into a pointer, `dealloc_off_hit` with the
//! free's `Result` in memory) and the hooked alloc's stack frame (its
//! ways out are calls that return a two-register `Result`, which LLVM
//! does not turn into tail calls). Then the edges lost their hops: the
//! usual words' hit (`alloc_usual`, `free_usual`) is inlined into each
//! edge's out-of-line function (`KmemCache::alloc_off_hit` /
//! `free_off_hit`, and `GlobalAlloc`'s `Kmem::alloc_off_hit` /
//! `dealloc_off_hit`, which no longer call the cache's and convert its
//! `Result`); the post-alloc hook cannot fail and hands the object back
//! (its event a tail call); profiling's usual word is told by one
//! compare (the alloc's hit and hook then run for the word known, the
//! free's by one masked compare); the kmemtrace event's head is made
//! once per cache: profiling on, `GlobalAlloc` pair 142 → 103
//! (`kmem_cache` 135 → 116, mixed 93.1 → 81.0); kmemtrace on 199 →
//! 176; the kernel's pair with profiling on 142 → 92; plain `GlobalAlloc`
//! pair 68 → 66 (`bench/profile.sh`).
//!
//! **The hits** take no lock and no atomic read-modify-write: this CPU's
//! per-CPU cache at `pcpu_array() + Platform::cpu_offset()`, its in-use flag
//! taken (a plain load and store; held already: an interrupt handler that
//! interrupted the holder, which takes the slow path to the slab layer),
//! pop from (push to) `loaded`, count (alloc only), the flag given back. `loaded`'s top and end are
//! kept in the per-CPU cache as slot pointers (Bonwick & Adams'
//! `cc_rounds`, `cc_magsize`): a hit reads the per-CPU line and one round
//! slot, and no load waits for the magazine's header or its address (an
//! empty magazine's "top round" is its header's null `next`). An absent
//! magazine has top equal to end there, so there is no null test. Everything else — misses, errors,
//! bookkeeping flags — is a tail call to an out-of-line function, so a hit
//! needs no callee-saved register.
//!
//! **The free's owner check** is constant time: one page-map load (the
//! slab), its owner compared with the cache (`free`) or taken as the cache
//! (`kfree`), and one 64×64→128 multiply by `ceil(2^64 / stride)` that
//! both tests that the pointer is an object start and gives its index
//! (Lemire, Kaser and Kurz 2019) — the index the profiled free uses for
//! the tag reference. A free to the wrong cache, of a non-slab pointer or
//! of an interior pointer is an error, never corruption. Double frees: the
//! hit tests the free key in the object's first word (glibc's tcache key,
//! `cache/double_free.rs`), which a free writes and an alloc clears, and
//! the miss confirms a match by a search of the magazines, the depot and
//! the slab before refusing: every double free, wherever the first free
//! went. Keyless caches (a constructor's, `NOTOUCH`) keep Linux's naive
//! check (the object on top of `loaded`) and the miss's (the top of `prev`,
//! the slab's free map); every debug cache (any debug flag) checks the
//! object's state word on its cold path, which catches them all. Every
//! refusal is reported ([`crate::reports`]).
//!
//! | file | what it holds |
//! | --- | --- |
//! | `cache/alloc.rs` | the one alloc, top to bottom: the flag test, the hooked path, the hit, its one slow function |
//! | `cache/free.rs` | the one free, top to bottom: locating a pointer (owner check, object index), the flag test, the hooked path, the hit, its one slow function |
//! | `cache/hooks.rs` | the allocation's feature hooks (pre-alloc, post-alloc) and its kmemtrace event, each called from one place and dispatching to the feature's file (the free's hook and event: `cache/free.rs`) |
//! | `cache/owner.rs` | [`CacheOwner`]: what the cache needs from the allocator, handed down |
//! | `cache/magazines.rs` | this CPU's per-CPU cache, cross-CPU calls, the one miss loop of both directions (`magazine_miss`), new magazines, draining |
//! | `cache/slab_layer.rs` | the calls into the slab layer |
//! | `cache/reap.rs`, `cache/stats.rs` | giving memory back; statistics |
//! | `cache/profiling.rs` | allocation tags of small-slab objects (side arrays) |
//! | `cache/trace_table.rs` | the trace table switch and its calls |
//! | `cache/double_free.rs` | the free key: double frees refused at the free without flags |
//! | `cache/verify.rs` | `verify`, invariants |

mod alloc;
mod double_free;
mod free;
mod hooks;
mod magazines;
mod owner;
#[cfg(feature = "alloc-profiling")]
mod profiling;
mod reap;
mod slab_layer;
mod stats;

use core::cell::UnsafeCell;
use core::marker::PhantomData;
use core::ptr;
use core::sync::atomic::{AtomicU32, AtomicU64, Ordering};

pub(crate) use alloc::unready;
pub(crate) use double_free::{init_free_key, key_after};
pub(crate) use free::Located;
pub(crate) use owner::{CacheOwner, KfenceOwner, OwnerCache};

use crate::constructor::{Ctor, Dtor};
use crate::debug::DebugLayout;
use crate::error::DestroyError;
use crate::flags::CacheFlags;
use crate::kmemtrace::{EventFields, EventKind, EventType, KmemtraceState};
use crate::layout::freelist::freelist_secret;
use crate::layout::geometry::{Geometry, SlabKind};
use crate::layout::pagemap::PageMap;
use crate::magazine::{Depot, PcpuCache, max_magtype, start_magtype};
use crate::platform::{PageSource, Platform};
use crate::slab::{SlabLayer, SlabParams};
use crate::trace_table::TraceTable;

bitflags::bitflags! {
    /// `hot_flags` bits: anything in [`HotFlags::ALLOC_SLOW`] /
    /// [`HotFlags::FREE_SLOW`] sends alloc / free off the plain hit, so a
    /// plain cache pays one load and one branch for all of these.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub(crate) struct HotFlags: u32 {
        /// Tracing is on: allocations are recorded.
        const TRACED = 1;
        /// Tracing was on once: frees look for a record.
        const EVER_TRACED = 2;
        /// A debug cache (any debug flag: see [`crate::debug`]): every
        /// alloc and free takes the debug cold path.
        const DEBUG = 4;
        /// A bufctl cache (profiled allocations store the tag in the bufctl).
        const BUFCTL = 8;
        /// A bootstrap cache: callers may neither allocate nor free.
        const BOOTSTRAP = 16;
        /// Some object of this small-object cache may carry a tag reference
        /// in its slab's tag side array (feature `alloc-profiling`): frees
        /// must look at it.
        const TAGGED = 32;
        /// Allocation profiling is switched on in the allocator
        /// ([`AllocProfiling::set_enabled`](crate::AllocProfiling::set_enabled)):
        /// allocations ask [`AllocTagHooks::current`](crate::AllocTagHooks::current).
        const PROFILING = 64;
        /// Some object of this bufctl cache carries a tag in its bufctl:
        /// frees look it up (out of line).
        const BUFCTL_TAGGED = 128;
        /// kmemtrace is recording this cache
        /// ([`Kmemtrace::start`](crate::kmemtrace::Kmemtrace::start)):
        /// allocs and frees take the flagged paths, which record an event.
        const KMEMTRACE = 256;
        /// An unborn size-class stub (`allocator/classes.rs`): its first
        /// allocation creates the kmalloc class and allocates from it.
        const UNBORN = 512;
        /// Objects carry no free key ([`double_free`]): a constructor's
        /// state, a debug layout or `NOTOUCH` own their first word, so
        /// allocs and frees leave the keyed hits.
        const KEYLESS = 1024;
        /// A KFENCE sample is armed ([`crate::kfence`]): the next
        /// allocation takes the flagged path and may be served from the
        /// guarded pool; the bit is cleared there.
        const SAMPLE = 2048;
        /// The platform's tag hooks are on
        /// ([`AllocProfiling::set_tag_hooks`](crate::AllocProfiling::set_tag_hooks)):
        /// allocs and frees take the flagged paths, whose charges and
        /// uncharges call [`AllocTagHooks::on_charge`](crate::AllocTagHooks::on_charge) and
        /// [`AllocTagHooks::on_uncharge`](crate::AllocTagHooks::on_uncharge) (the profiled hits call
        /// out to nothing).
        const TAG_HOOKS = 4096;
        /// Not a slow bit, a fact: a small cache whose slabs are one page
        /// with the header at its end (`tag_header_in_page`), so the
        /// profiled alloc finds an object's side array by masking its
        /// address. Part of [`HotFlags::PROFILED_USUAL`]: the profiled
        /// alloc of such a cache tests nothing more to know it.
        const TAGS_IN_PAGE = 8192;
    }
}

impl HotFlags {
    /// The bits that send a hooked alloc to its cold function
    /// (`cache/alloc.rs`, `alloc_off_hit`): every feature but profiling and
    /// kmemtrace recording on a keyed small-object cache, and the bits of
    /// a class or entry with no cache behind it.
    pub(crate) const ALLOC_HOOKED_RARE: HotFlags = HotFlags::TRACED
        .union(HotFlags::DEBUG)
        .union(HotFlags::BUFCTL)
        .union(HotFlags::BOOTSTRAP)
        .union(HotFlags::UNBORN)
        .union(HotFlags::KEYLESS)
        .union(HotFlags::SAMPLE)
        .union(HotFlags::TAG_HOOKS);
    /// The bits that send a hooked free to its cold function
    /// (`cache/free.rs`, `free_hooked`): as [`HotFlags::ALLOC_HOOKED_RARE`].
    pub(crate) const FREE_HOOKED_RARE: HotFlags = HotFlags::EVER_TRACED
        .union(HotFlags::DEBUG)
        .union(HotFlags::BOOTSTRAP)
        .union(HotFlags::BUFCTL_TAGGED)
        .union(HotFlags::KEYLESS)
        .union(HotFlags::TAG_HOOKS);
    /// The usual word of a profiled cache: profiling on, a small cache
    /// of one-page slabs, its objects tagged, nothing else. The hooked
    /// alloc and free (`cache/alloc.rs`, `cache/free.rs`) tell it by one
    /// compare, and its hooks test nothing more.
    pub(crate) const PROFILED_USUAL: HotFlags = HotFlags::PROFILING
        .union(HotFlags::TAGGED)
        .union(HotFlags::TAGS_IN_PAGE);
    /// The bits the pre-alloc hook looks at (`cache/hooks.rs`).
    pub(crate) const PRE_ALLOC: HotFlags = HotFlags::BOOTSTRAP.union(HotFlags::SAMPLE);
    /// The bits that send an allocation off the plain hit.
    pub(crate) const ALLOC_SLOW: HotFlags = HotFlags::TRACED
        .union(HotFlags::KMEMTRACE)
        .union(HotFlags::DEBUG)
        .union(HotFlags::BOOTSTRAP)
        .union(HotFlags::PROFILING)
        .union(HotFlags::UNBORN)
        .union(HotFlags::KEYLESS)
        .union(HotFlags::SAMPLE)
        .union(HotFlags::TAG_HOOKS);
    /// The bits that send a free off the plain hit.
    pub(crate) const FREE_SLOW: HotFlags = HotFlags::EVER_TRACED
        .union(HotFlags::KMEMTRACE)
        .union(HotFlags::DEBUG)
        .union(HotFlags::BOOTSTRAP)
        .union(HotFlags::TAGGED)
        .union(HotFlags::BUFCTL_TAGGED)
        .union(HotFlags::KEYLESS)
        .union(HotFlags::TAG_HOOKS);
}

/// What [`KmemCache::destroy`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DestroyReport {
    /// Trace records still outstanding at destruction, now dropped. Non-zero
    /// means some traced object was never freed: the kernel should warn.
    pub nr_trace_records_dropped: usize,
}

/// Links of the allocator's cache list (under the cache-list lock).
pub(crate) struct CacheLinks<P: Platform> {
    pub(crate) prev: *const KmemCache<P>,
    pub(crate) next: *const KmemCache<P>,
}

/// An object cache (`kmem_cache`).
///
/// Obtained from [`Kmem::cache_create`](crate::Kmem::cache_create)
/// (or [`Kmem::find_cache`](crate::Kmem::find_cache)); lives until
/// [`KmemCache::destroy`]. All methods are safe to call from any CPU
/// concurrently.
#[repr(C)]
pub struct KmemCache<P: Platform> {
    // Read-only after creation, except `hot_flags` (written when tracing
    // or profiling switches on). In declaration order (`repr(C)`): the
    // first 64 bytes hold everything the magazine-hit paths of alloc and
    // free read, and nothing a CPU writes on any path lives before
    // `depot`, which starts a new cache line (see `hot_fields_first`).
    pub(crate) hot_flags: AtomicU32,
    /// `params.on_primary` and `params.kind` again, in the padding after
    /// `hot_flags`: the `kmem_cache` free's hit tests them in this line.
    pub(crate) on_primary: bool,
    pub(crate) kind: SlabKind,
    pub(crate) permanent: bool,
    /// Small slabs of one page with the header at its end: the profiled
    /// alloc finds a slab's header (its tag side array) by masking the
    /// object's address; otherwise through the page map.
    #[cfg(feature = "alloc-profiling")]
    pub(crate) tag_header_in_page: bool,
    // The per-CPU array follows the struct in its `kmem_cache` object
    // (`KmemCache::pcpu_array`): no field points at it.
    /// Number of CPUs minus one: the last index of the per-CPU array.
    pub(crate) last_cpu: usize,
    /// `ceil(2^64 / stride)`: for an offset `n < 2^32` into a slab,
    /// `n * stride_magic` (128-bit) has `n / stride` in its high word and
    /// is an object start iff its low word is below `stride_magic`
    /// (Lemire, Kaser and Kurz, "Faster remainder by direct computation",
    /// 2019): one multiply checks and indexes a freed pointer.
    pub(crate) stride_magic: u64,
    /// The slab layer's parameters (geometry, page map, page source,
    /// constructor, destructor), `repr(C)` with the hit's fields first:
    /// `nr_objs_per_slab` and `page_map` end this cache line, `stride`
    /// opens the next. The page map is the allocator's for a cache on
    /// the primary source, empty (every lookup finds 0) for one on
    /// another source, so the free fast path needs no `on_primary` test:
    /// its lookup misses and the slow path locates by header or hash.
    pub(crate) params: SlabParams,
    pub(crate) align: usize,
    pub(crate) flags: CacheFlags,
    /// The allocator that made the cache ([`CacheOwner`]).
    pub(crate) owner: *const dyn CacheOwner<P>,
    /// kmemtrace: the first word (CPU aside) of this cache's free event,
    /// made once here: a `kfree` for a kmalloc cache (`permanent`), else
    /// a `kmem_cache_free` (`cache/free.rs`, `free_event`). In the room
    /// before `depot`'s line.
    pub(crate) free_event_head: u64,
    // Written by any CPU on slow paths: from here on, away from the fields
    // above (`Depot` is cache-line aligned).
    pub(crate) depot: Depot<P>,
    pub(crate) slab: SlabLayer<P>,
    /// Objects allocated from / freed to the slab layer directly by
    /// callers (magazine layer missed).
    pub(crate) nr_allocs_direct: AtomicU64,
    pub(crate) nr_frees_direct: AtomicU64,
    pub(crate) trace: TraceTable<P>,
    /// The name's bytes (at most 31) and their count, in one 32-byte
    /// field's room.
    pub(crate) name: [u8; 31],
    pub(crate) name_len: u8,
    /// kmemtrace cache id (1, 2, ... in creation order).
    pub(crate) id: u32,
    /// Where a freed object's mark is kept (`double_free.rs`; beside
    /// `id`, in what was its padding).
    pub(crate) key_place: double_free::KeyPlace,
    /// The owner's kmemtrace recorder ([`CacheOwner::kmemtrace_recorder`],
    /// alive as long as the owner): the kmemtrace hooks write into it.
    recorder: *const KmemtraceState,
    /// kmemtrace: the first word (CPU aside: [`EventFields::head`]) of
    /// this cache's `kmem_cache_alloc` event, made once here; the hooks
    /// change its kind and type by constants (`cache/hooks.rs`).
    pub(crate) event_head: u64,
    pub(crate) links: UnsafeCell<CacheLinks<P>>,
    /// Debug caches: where the debug trailer's parts are.
    pub(crate) debug: Option<DebugLayout>,
    /// The working-set tick's idle count (`reap.rs`).
    pub(crate) idle: reap::IdleTicks,
    _platform: PhantomData<fn() -> P>,
}

/// The restartable sequences find a cache's per-CPU array
/// [`KmemCache::PCPU_OFFSET`] bytes after the cache.
impl<P: Platform> crate::restart::ArrayAt for KmemCache<P> {
    const AT: usize = Self::PCPU_OFFSET;
    const TOP: usize = PcpuCache::TOP_AT;
    const LIMIT: usize = PcpuCache::LIMIT_AT;
    const NR_ALLOCS: usize = PcpuCache::NR_ALLOCS_AT;
    const FREE_KEY: usize = PcpuCache::FREE_KEY_AT;
}

// SAFETY: shared state is behind spin locks or atomics; the per-CPU array is
// per-CPU caches each owned by its CPU (see the magazine hits, `cache/alloc.rs`, `cache/free.rs`); `links` is only touched under
// the allocator's cache-list lock; everything else is immutable after
// creation.
unsafe impl<P: Platform> Sync for KmemCache<P> {}
// SAFETY: as above; nothing is tied to the creating CPU.
unsafe impl<P: Platform> Send for KmemCache<P> {}

/// Arguments to [`KmemCache::construct`].
pub(crate) struct CacheSpec<'a> {
    pub(crate) name: &'a str,
    pub(crate) size: usize,
    pub(crate) geometry: Geometry,
    pub(crate) flags: CacheFlags,
    pub(crate) ctor: Option<Ctor>,
    pub(crate) dtor: Option<Dtor>,
    pub(crate) source: &'static dyn PageSource,
    pub(crate) on_primary: bool,
    pub(crate) bootstrap: bool,
    pub(crate) permanent: bool,
    /// kmemtrace cache id.
    pub(crate) id: u32,
    /// The debug object layout (a cache with debug flags).
    pub(crate) debug: Option<DebugLayout>,
    /// On a small source (`allocator/classes.rs`): every magazine is of
    /// the same size there (`magazine/mod.rs`), so the refills make the
    /// depot's type from the start ([`Depot::new`]'s `one_size`).
    pub(crate) small_source: bool,
}

impl<P: Platform> KmemCache<P> {
    /// Where a cache's per-CPU array starts in its `kmem_cache` object, in
    /// bytes: right after the struct (960 bytes on x86-64, a multiple of
    /// 64 already: the struct is cache-line aligned). A constant, so that
    /// a hit finds this CPU's line at `cache + PCPU_OFFSET +
    /// Platform::cpu_offset()`, a displacement, with no load: the free's
    /// chain of dependent loads is page-map slot → line, the alloc's size
    /// table → line → round, one load each shorter than through a pointer
    /// field
    /// (`docs/BENCHMARKS.md`, issue 18: what that is worth in `mixed`'s
    /// CPU time).
    pub(crate) const PCPU_OFFSET: usize =
        core::mem::size_of::<Self>().next_multiple_of(core::mem::align_of::<PcpuCache>());

    /// Build a cache value (not yet linked anywhere). Inlined, so that
    /// `create_cache` builds the ~1 KiB value where it goes rather than
    /// on the stack and then copies it.
    #[inline(always)]
    pub(crate) fn construct(
        spec: CacheSpec<'_>,
        owner: *const dyn CacheOwner<P>,
        page_map: PageMap,
        nr_cpus: usize,
    ) -> Self {
        // The unready entry (`alloc.rs`) is read as this word only.
        const { assert!(core::mem::offset_of!(Self, hot_flags) == 0) };
        let mut name = [0u8; 31];
        let mut name_len = spec.name.len().min(31);
        while !spec.name.is_char_boundary(name_len) {
            name_len -= 1;
        }
        name[..name_len].copy_from_slice(&spec.name.as_bytes()[..name_len]);
        let geometry = spec.geometry;
        let mut hot = HotFlags::empty();
        if geometry.kind == SlabKind::Bufctl {
            hot |= HotFlags::BUFCTL;
        }
        if spec.debug.is_some() {
            hot |= HotFlags::DEBUG;
        }
        if spec.bootstrap {
            hot |= HotFlags::BOOTSTRAP;
        }
        if !double_free::keyed(&spec) {
            hot |= HotFlags::KEYLESS;
        }
        let _ = double_free::init_free_key(P::now() ^ (owner.cast::<()>() as u64).rotate_left(17));
        let slab_key = double_free::slab_key(&spec);
        #[cfg(feature = "alloc-profiling")]
        let tag_header_in_page = geometry.kind == SlabKind::Small
            && geometry.nr_pages_per_slab == 1
            && !geometry.header_off_slab;
        #[cfg(feature = "alloc-profiling")]
        if tag_header_in_page {
            hot |= HotFlags::TAGS_IN_PAGE;
        }
        KmemCache {
            hot_flags: AtomicU32::new(hot.bits()),
            last_cpu: nr_cpus.max(1) - 1,
            // The page-map slots of its slabs hold the same.
            stride_magic: crate::layout::pagemap::stride_magic(geometry.stride),
            on_primary: spec.on_primary,
            kind: geometry.kind,
            #[cfg(feature = "alloc-profiling")]
            tag_header_in_page,
            params: SlabParams {
                nr_objs_per_slab: geometry.nr_objs_per_slab,
                page_map: if spec.on_primary {
                    page_map
                } else {
                    PageMap::empty()
                },
                stride: geometry.stride,
                obj_size: spec.size,
                ctor: spec.ctor,
                dtor: spec.dtor,
                source: spec.source,
                nr_pages_per_slab: geometry.nr_pages_per_slab,
                freeptr_offset: spec
                    .debug
                    .map_or(if slab_key != 0 { 8 } else { 0 }, |layout| {
                        layout.freeptr_offset
                    }),
                free_key: slab_key,
                obj_offset: spec.debug.map_or(0, |layout| layout.left),
                freelist_secret: freelist_secret(
                    P::now()
                        ^ (spec.name.as_ptr() as u64).rotate_left(29)
                        ^ ((geometry.stride as u64) << 40)
                        ^ (owner.cast::<()>() as u64).rotate_left(7),
                ),
                kind: geometry.kind,
                on_primary: spec.on_primary,
                header_off_slab: geometry.header_off_slab,
                debug: spec.debug.is_some(),
            },
            align: geometry.align,
            flags: spec.flags,
            owner,
            permanent: spec.permanent,
            depot: Depot::new(
                start_magtype(geometry.stride),
                max_magtype(geometry.stride),
                spec.small_source,
            ),
            slab: SlabLayer::new(),
            nr_allocs_direct: AtomicU64::new(0),
            nr_frees_direct: AtomicU64::new(0),
            trace: TraceTable::new(),
            name,
            name_len: name_len as u8,
            id: spec.id,
            // SAFETY: the owner is alive (it is creating this cache) and
            // outlives it.
            recorder: unsafe { (*owner).kmemtrace_recorder() },
            event_head: EventFields::head(EventKind::Alloc, EventType::Cache, spec.id),
            free_event_head: EventFields::head(
                EventKind::Free,
                if spec.permanent {
                    EventType::Kmalloc
                } else {
                    EventType::Cache
                },
                spec.id,
            ),
            links: UnsafeCell::new(CacheLinks {
                prev: ptr::null(),
                next: ptr::null(),
            }),
            key_place: double_free::key_place(&spec),
            debug: spec.debug,
            idle: reap::IdleTicks::new(),
            _platform: PhantomData,
        }
    }

    /// The allocator this cache belongs to.
    #[inline]
    pub(crate) fn owner(&self) -> &dyn CacheOwner<P> {
        // SAFETY: caches are created by an owner living in a `'static`
        // (init takes `&'static self`), never moved.
        unsafe { &*self.owner }
    }

    /// The owner's kmemtrace recorder.
    #[inline(always)]
    pub(crate) fn recorder(&self) -> &KmemtraceState {
        // SAFETY: handed down by the owner at creation; the owner lives
        // in a `'static` and outlives its caches.
        unsafe { &*self.recorder }
    }

    /// Cache name (at most 31 bytes), e.g. `"kmalloc-64"`.
    pub fn name(&self) -> &str {
        core::str::from_utf8(&self.name[..usize::from(self.name_len)]).unwrap_or("?")
    }

    /// The cache's id in kmemtrace events and dumps (1, 2, ... in creation
    /// order; 0 names no cache).
    pub fn id(&self) -> u32 {
        self.id
    }

    /// Object size in bytes, as requested at creation.
    pub fn obj_size(&self) -> usize {
        self.params.obj_size
    }

    /// Alignment in bytes every object is guaranteed (at least the
    /// requested one, at least 8).
    pub fn align(&self) -> usize {
        self.align
    }

    /// Bytes from one object's start to the next in a slab: the object
    /// size rounded up to the alignment, plus, in a debug cache, the debug
    /// trailer (redzone, state word, audit records, ...).
    pub fn stride(&self) -> usize {
        self.params.stride
    }

    /// Creation flags.
    pub fn flags(&self) -> CacheFlags {
        self.flags
    }

    /// Slab layout of this cache.
    pub fn kind(&self) -> SlabKind {
        self.kind
    }

    /// The page source slabs come from.
    pub fn source(&self) -> &'static dyn PageSource {
        self.params.source
    }

    /// Whether this is one of the allocator's bootstrap (metadata) caches,
    /// whose objects callers can neither allocate nor free.
    pub fn is_bootstrap(&self) -> bool {
        self.hot().contains(HotFlags::BOOTSTRAP)
    }

    /// The hot flags now. Acquire (a plain load on x86): a `KMEMTRACE`
    /// bit seen here comes after the recorder's rings
    /// (`KmemtraceState::record_recorded`).
    #[inline(always)]
    pub(crate) fn hot(&self) -> HotFlags {
        HotFlags::from_bits_retain(self.hot_flags.load(Ordering::Acquire))
    }

    /// Set hot flags (tracing, profiling, tagging switch on).
    pub(crate) fn set_hot(&self, flags: HotFlags) {
        self.hot_flags.fetch_or(flags.bits(), Ordering::AcqRel);
    }

    /// Clear hot flags.
    pub(crate) fn clear_hot(&self, flags: HotFlags) {
        self.hot_flags.fetch_and(!flags.bits(), Ordering::AcqRel);
    }

    /// Switch allocation profiling on or off in this cache's hot flags.
    /// On also sets `TAGGED` (in the same atomic update) on a small-slab
    /// cache that may tag its objects (not a bootstrap cache), so the
    /// profiled alloc needs no flag test; off leaves `TAGGED` (objects may
    /// still carry references).
    pub(crate) fn set_profiling(&self, on: bool) {
        #[cfg(feature = "alloc-profiling")]
        if on && self.kind == SlabKind::Small && !self.hot().contains(HotFlags::BOOTSTRAP) {
            self.set_hot(HotFlags::PROFILING | HotFlags::TAGGED);
            return;
        }
        if on {
            self.set_hot(HotFlags::PROFILING);
        } else {
            self.clear_hot(HotFlags::PROFILING);
        }
    }

    /// Set or clear `TAG_HOOKS` ([`crate::AllocProfiling::set_tag_hooks`];
    /// never on a bootstrap cache, whose allocs and frees are refused to
    /// callers anyway).
    pub(crate) fn set_tag_hooks(&self, on: bool) {
        if on && !self.hot().contains(HotFlags::BOOTSTRAP) {
            self.set_hot(HotFlags::TAG_HOOKS);
        } else {
            self.clear_hot(HotFlags::TAG_HOOKS);
        }
    }

    /// The debug flags this cache runs with (empty: a plain cache).
    pub fn debug_flags(&self) -> crate::flags::DebugFlags {
        self.debug
            .map_or(crate::flags::DebugFlags::empty(), |layout| layout.flags)
    }

    /// Destroy the cache: drain it, return all its pages, free its
    /// metadata. Trace records still present are dropped and counted in
    /// the report (the kernel should warn: objects were leaked).
    ///
    /// # Safety
    /// Nothing uses this cache (or the reference) afterwards, and no other
    /// CPU is using it during the call.
    ///
    /// # Errors
    /// [`DestroyError::Busy`] if objects are still allocated (the cache is
    /// left intact and usable); [`DestroyError::Permanent`] for bootstrap
    /// and kmalloc caches.
    pub unsafe fn destroy(&'static self) -> Result<DestroyReport, DestroyError> {
        if self.permanent {
            return Err(DestroyError::Permanent);
        }
        let nr_allocated = self.stats().nr_allocated;
        if nr_allocated != 0 {
            return Err(DestroyError::Busy { nr_allocated });
        }
        self.reap();
        let counts = self.slab.lock().counts();
        if counts.nr_slabs != 0 {
            return Err(DestroyError::Busy {
                nr_allocated: counts.nr_busy_objs,
            });
        }
        let owner = self.owner();
        owner.kmemtrace_cache_destroyed(self);
        owner.unlink_cache(self);
        let nr_trace_records_dropped = self.trace_drop_all();
        self.trace.shrink(self);
        // SAFETY: unlinked and drained; per our caller nobody uses the
        // cache any more. The cache struct and its per-CPU array came from
        // the kmem_cache slab layer, as one object.
        unsafe {
            owner
                .cache(OwnerCache::Cache)
                .slab_free_objects(&[(self as *const Self).cast_mut().cast()]);
        }
        Ok(DestroyReport {
            nr_trace_records_dropped,
        })
    }
}
