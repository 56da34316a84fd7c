//! The debug descriptor: where a post-mortem reader finds the allocator's
//! state in a memory image (a QEMU `dump-guest-memory` core, a gdbstub),
//! after Linux's `vmcoreinfo` (what `crash` and `makedumpfile` read).
//!
//! One `#[used]`, `repr(C)` static, [`MAGPIE_SLAB_DESCRIPTOR`] (an
//! unmangled symbol of that name, so a reader finds it in the kernel
//! ELF's symbol table; or by its 16-byte magic anywhere in the image),
//! holding:
//!
//! - a **header**: the magic [`DESCRIPTOR_MAGIC`], the format version
//!   [`DESCRIPTOR_VERSION`], the sizes of the header and of the layout;
//! - what only the running kernel knows, written once by
//!   [`Kmem::init`](crate::Kmem::init): the address of the
//!   first allocator brought up (an image holds one heap; a later
//!   allocator in the same program is not described), and where the
//!   payload of a `spin::Mutex` sits inside it (the lock crate's layout
//!   is private to it, so it is measured on the live locks);
//! - the **layout** ([`DescriptorLayout`]): for every field a reader
//!   needs, its byte offset and its size (`core::mem::offset_of!` and
//!   `size_of`, computed when the library is compiled, so the descriptor
//!   follows every change of the structures with no hand-kept table),
//!   and the constants (page size, magazine sizes, the slab magic, the
//!   hot-flag bits).
//!
//! Any kernel that adopts `magpie-slab` has it with no code of its own.
//! The format, field by field, is `docs/VMCORE.md`; `magpie-kmem core`
//! and `scripts/magpie-gdb.py` read it. Everything the reader needs of
//! the library's internal structures is named in this one file.
//!
//! # Compatibility
//!
//! A reader checks the magic and the version, then takes the entries it
//! knows by name from [`DescriptorLayout::decode`]; new entries are
//! added at the end (the layout size grows, the version stays), a
//! change of meaning bumps the version.

use core::mem::{offset_of, size_of};
use core::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use crate::allocator::{CacheList, Kmem};
use crate::cache::{CacheLinks, KmemCache};
use crate::kmemtrace::rings::CpuRing;
use crate::kmemtrace::{KmemtraceState, Mark, Marks, StackTable};
use crate::layout::hash::AddrHash;
use crate::layout::pagemap::{self, PageMap, PageSlot};
use crate::magazine::{Depot, DepotInner, MAGAZINE_ROUNDS, Magazine, PcpuCache, PcpuInner};
use crate::platform::{AllocTagHooks, CPU_SLOT_BYTES, PAGE_SIZE, Platform, PlatformHooks};
#[cfg(feature = "kfence")]
use crate::reports::error::ReportName;
use crate::slab::{Bufctl, SLAB_MAGIC, Slab, SlabLayer, SlabListHead, SlabLists};
use crate::trace_table::{TRACE_MAX_FRAMES, TraceNode, TraceRecord, TraceTable, TraceTableInner};

/// The descriptor's first 16 bytes.
pub const DESCRIPTOR_MAGIC: [u8; 16] = *b"MAGPIE-SLAB-DESC";

/// The format version (docs/VMCORE.md). 2: the error ring's lock in the
/// header (104 bytes), the kernel's arenas ([`KmemstatArenas`]) after
/// the layout. 3: the kernel's leak-scan roots ([`LeakRoots`]) after the
/// arenas.
pub const DESCRIPTOR_VERSION: u32 = 3;

/// Bytes of the header (a version-1 descriptor's layout starts here).
pub const DESCRIPTOR_HEADER_SIZE: usize = 104;

const _: () = assert!(offset_of!(SlabDescriptor, layout) == DESCRIPTOR_HEADER_SIZE);

/// The descriptor's symbol in a kernel ELF.
pub const DESCRIPTOR_SYMBOL: &str = "MAGPIE_SLAB_DESCRIPTOR";

/// One layout entry: a field's byte `offset` in its structure and its
/// `size` in bytes (1, 2, 4 or 8: a little-endian unsigned integer or
/// pointer; larger for arrays), or a constant (`size` 0, the value in
/// `offset`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Entry {
    /// Byte offset of the field in its structure, or the constant.
    pub offset: u64,
    /// Size of the field in bytes; 0 for a constant.
    pub size: u64,
}

impl Entry {
    /// A constant.
    const fn value(value: usize) -> Entry {
        Entry {
            offset: value as u64,
            size: 0,
        }
    }

    /// A field at `offset` of `size` bytes.
    const fn field(offset: usize, size: usize) -> Entry {
        Entry {
            offset: offset as u64,
            size: size as u64,
        }
    }

    /// The entry at byte `at` of `bytes` (two little-endian u64s).
    fn decode(bytes: &[u8], at: usize) -> Option<Entry> {
        let word = |at: usize| -> Option<u64> {
            let slice = bytes.get(at..at.checked_add(8)?)?;
            Some(u64::from_le_bytes(slice.try_into().ok()?))
        };
        Some(Entry {
            offset: word(at)?,
            size: word(at + 8)?,
        })
    }
}

/// The size of the value a field projection returns (used by `field!`).
const fn size_of_field<S, F>(_project: fn(&S) -> &F) -> usize {
    size_of::<F>()
}

/// A structure-field entry: `field!(Type, path.to.field)`.
macro_rules! field {
    ($ty:ty, $($field:tt)+) => {
        Entry::field(
            offset_of!($ty, $($field)+),
            size_of_field::<$ty, _>(|value| &value.$($field)+),
        )
    };
}

/// An entry of a feature's structure: `$value` with the feature, an
/// absent entry (offset and size 0) without it.
macro_rules! feature_entry {
    ($feature:literal, $value:expr) => {{
        #[cfg(feature = $feature)]
        let entry = $value;
        #[cfg(not(feature = $feature))]
        let entry = Entry::value(0);
        entry
    }};
}

/// The memory representation of a KFENCE object state (a `u8`: the
/// transmute does not compile otherwise).
#[cfg(feature = "kfence")]
const fn kfence_state(state: crate::kfence::KfenceState) -> Entry {
    // SAFETY: a fieldless enum of one byte (checked by transmute's size
    // rule); its bytes are its discriminant as it sits in memory.
    Entry::value(unsafe { core::mem::transmute::<crate::kfence::KfenceState, u8>(state) } as usize)
}

/// The platform the layouts are computed with. The structures hold `P`
/// only in `PhantomData` and in thin pointers, so their layout is the
/// same for every platform; [`register`] checks the sizes against the
/// registering platform's and refuses a mismatch.
struct LayoutPlatform;

// SAFETY: never runs: no value of it exists and no allocator is built on
// it; it only names a type for `offset_of!` and `size_of`.
unsafe impl Platform for LayoutPlatform {
    fn max_cpus() -> usize {
        1
    }
    fn cpu_id() -> usize {
        0
    }
    fn irq_save() -> usize {
        0
    }
    fn irq_restore(_state: usize) {}
    fn now() -> u64 {
        0
    }
}

// SAFETY: the hooks keep PlatformHooks' contract: the KFENCE pool (if any) is
// mapped and the platform's own, and charge tokens are the ones the token hooks
// return.
unsafe impl PlatformHooks for LayoutPlatform {
    fn backtrace(_frames: &mut [usize]) -> usize {
        0
    }
    fn context(_buf: &mut [u8; 32]) -> usize {
        0
    }
}

// SAFETY: the defaults: no tags.
unsafe impl AllocTagHooks for LayoutPlatform {}

type LayoutAllocator = Kmem<LayoutPlatform>;
type LayoutCache = KmemCache<LayoutPlatform>;

/// Declares [`DescriptorLayout`] (each entry once: its name, its doc and
/// its value) and its decoder.
macro_rules! layout {
    ($( $(#[$doc:meta])* $name:ident = $value:expr; )*) => {
        /// The layout facts a reader needs, one [`Entry`] each, in this
        /// order (docs/VMCORE.md lists them with their meaning).
        #[repr(C)]
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
        pub struct DescriptorLayout {
            $( $(#[$doc])* pub $name: Entry, )*
        }

        /// This build's layout.
        const LAYOUT: DescriptorLayout = DescriptorLayout {
            $( $name: $value, )*
        };

        impl DescriptorLayout {
            /// The names of the entries, in order (for readers that print
            /// or export the layout: `scripts/magpie-gdb.py` reads it as
            /// name/offset/size triples).
            pub const NAMES: &'static [&'static str] = &[$( stringify!($name), )*];

            /// Decode a layout from the bytes that follow a descriptor's
            /// header (as read from an image). `None` if `bytes` is too
            /// short for this version's entries.
            pub fn decode(bytes: &[u8]) -> Option<DescriptorLayout> {
                Some(DescriptorLayout {
                    $( $name: Entry::decode(bytes, offset_of!(DescriptorLayout, $name))?, )*
                })
            }

            /// The entries as (name, entry) pairs, in order.
            pub fn entries(&self) -> impl Iterator<Item = (&'static str, Entry)> + '_ {
                [$( (stringify!($name), self.$name), )*].into_iter()
            }
        }
    };
}

layout! {
    /// Constant: bytes per page.
    page_size = Entry::value(PAGE_SIZE);
    /// Constant: bytes per per-CPU cache slot (the per-CPU array's stride).
    cpu_slot_bytes = Entry::value(CPU_SLOT_BYTES);

    /// Constant: `size_of::<Kmem>()`.
    allocator_size = Entry::value(size_of::<LayoutAllocator>());
    /// The cache-list lock (a `spin::Mutex`; its payload at the
    /// header's `cache_list_lock_data` bytes in).
    allocator_caches = field!(LayoutAllocator, caches);
    /// In the cache list: the first cache (creation order).
    cache_list_head = field!(CacheList<LayoutPlatform>, head);
    /// Number of CPUs (`usize`, in an `UnsafeCell`).
    allocator_nr_cpus = field!(LayoutAllocator, nr_cpus);
    /// The page map's first page address (`PageMap::base`).
    allocator_page_map_base = Entry::field(
        offset_of!(LayoutAllocator, page_map) + offset_of!(crate::layout::pagemap::PageMap, base),
        size_of::<usize>(),
    );
    /// The page map's pages of span (`PageMap::nr_pages`).
    allocator_page_map_nr_pages = Entry::field(
        offset_of!(LayoutAllocator, page_map)
            + offset_of!(crate::layout::pagemap::PageMap, nr_pages),
        size_of::<usize>(),
    );
    /// Pages the page map itself takes.
    allocator_page_map_pages = field!(LayoutAllocator, page_map_pages);
    /// Page-granular kmalloc: live allocations.
    allocator_large_nr_live = field!(LayoutAllocator, large_nr_live);
    /// Page-granular kmalloc: live pages.
    allocator_large_live_pages = field!(LayoutAllocator, large_live_pages);
    /// Page-granular kmalloc: allocations ever.
    allocator_large_nr_allocs_ever = field!(LayoutAllocator, large_nr_allocs_ever);
    /// Times a dry source made the allocator reap every cache.
    allocator_nr_pressure_reaps = field!(LayoutAllocator, nr_pressure_reaps);
    /// Bad frees reported ever.
    allocator_nr_bad_frees = field!(LayoutAllocator, nr_bad_frees);

    /// Constant: `size_of::<KmemCache>()`.
    cache_size = Entry::value(size_of::<LayoutCache>());
    /// Constant: where the per-CPU array starts in a cache's object
    /// (`KmemCache::PCPU_OFFSET`); CPU `n`'s slot is `cpu_slot_bytes * n`
    /// further.
    cache_pcpu_offset = Entry::value(LayoutCache::PCPU_OFFSET);
    /// The hot-flags word (`u32`).
    cache_hot_flags = field!(LayoutCache, hot_flags);
    /// Constant: the hot-flags bit of a bootstrap cache (no magazines;
    /// counts from the slab layer).
    cache_hot_bootstrap = Entry::value(crate::cache::HotFlags::BOOTSTRAP.bits() as usize);
    /// Constant: the hot-flags bit of a bufctl cache.
    cache_hot_bufctl = Entry::value(crate::cache::HotFlags::BUFCTL.bits() as usize);
    /// Constant: the hot-flags bit of a traced cache (trace table on).
    cache_hot_traced = Entry::value(crate::cache::HotFlags::TRACED.bits() as usize);
    /// Number of CPUs minus one (`usize`).
    cache_last_cpu = field!(LayoutCache, last_cpu);
    /// Object size in bytes, as requested.
    cache_obj_size = field!(LayoutCache, params.obj_size);
    /// Distance between objects in a slab.
    cache_stride = field!(LayoutCache, params.stride);
    /// Where the caller's object starts in its slot (debug caches put a
    /// redzone first).
    cache_obj_offset = field!(LayoutCache, params.obj_offset);
    /// Objects per slab.
    cache_objs_per_slab = field!(LayoutCache, params.nr_objs_per_slab);
    /// Pages per slab.
    cache_pages_per_slab = field!(LayoutCache, params.nr_pages_per_slab);
    /// Guaranteed alignment.
    cache_align = field!(LayoutCache, align);
    /// The creation flags (`CacheFlags` bits).
    cache_flags = field!(LayoutCache, flags);
    /// The name's bytes (UTF-8, `cache_name_len` of them used).
    cache_name = field!(LayoutCache, name);
    /// The name's length.
    cache_name_len = field!(LayoutCache, name_len);
    /// kmemtrace cache id.
    cache_id = field!(LayoutCache, id);
    /// The cache-list links (`UnsafeCell<CacheLinks>`).
    cache_links = field!(LayoutCache, links);
    /// In the links: the next cache (null at the end).
    cache_links_next = field!(CacheLinks<LayoutPlatform>, next);
    /// Allocations by callers from the slab layer directly.
    cache_nr_allocs_direct = field!(LayoutCache, nr_allocs_direct);
    /// Frees by callers to the slab layer directly.
    cache_nr_frees_direct = field!(LayoutCache, nr_frees_direct);
    /// The depot lock (`spin::Mutex<DepotInner>`, payload at the header's
    /// `depot_lock_data`).
    cache_depot_lock = Entry::field(
        offset_of!(LayoutCache, depot) + offset_of!(Depot<LayoutPlatform>, inner),
        size_of::<crate::sync::IrqMutex<LayoutPlatform, DepotInner>>(),
    );
    /// Times the depot lock was contended.
    cache_depot_contention = Entry::field(
        offset_of!(LayoutCache, depot) + offset_of!(Depot<LayoutPlatform>, nr_contention),
        size_of::<u64>(),
    );
    /// The slab lock (`spin::Mutex<SlabLists>`, payload at the header's
    /// `slab_lock_data`).
    cache_slab_lock = Entry::field(
        offset_of!(LayoutCache, slab) + offset_of!(SlabLayer<LayoutPlatform>, lists),
        size_of::<SlabLayer<LayoutPlatform>>(),
    );

    /// Depot: the first full magazine (linked through `magazine_next`).
    depot_full = field!(DepotInner, full);
    /// Depot: full magazines.
    depot_nr_full = field!(DepotInner, nr_full);
    /// Depot: the first empty magazine.
    depot_empty = field!(DepotInner, empty);
    /// Depot: empty magazines.
    depot_nr_empty = field!(DepotInner, nr_empty);
    /// Depot: the magazine type (index into the `magazine_rounds_*`
    /// constants).
    depot_magtype = field!(DepotInner, magtype);
    /// Depot: times the magazine type grew.
    depot_nr_resizes = field!(DepotInner, nr_resizes);

    /// Slab lists: the three list heads (empty, partial, full), each
    /// `slab_list_head_size` bytes.
    slab_lists_lists = field!(SlabLists, lists);
    /// Constant: bytes per list head.
    slab_list_head_size = Entry::value(size_of::<SlabListHead>());
    /// In a list head: the first slab.
    slab_list_head_head = field!(SlabListHead, head);
    /// In a list head: slabs on the list.
    slab_list_head_nr = field!(SlabListHead, nr);
    /// Slab lists: objects taken from slabs ever.
    slab_lists_nr_allocs = field!(SlabLists, nr_allocs);
    /// Slab lists: objects returned to slabs ever.
    slab_lists_nr_frees = field!(SlabLists, nr_frees);

    /// Constant: a live slab header's magic.
    slab_magic_value = Entry::value(SLAB_MAGIC as usize);
    /// Slab header: magic (`u32`).
    slab_magic = field!(Slab, magic);
    /// Slab header: pages.
    slab_nr_pages = field!(Slab, nr_pages);
    /// Slab header: objects with callers or in magazines.
    slab_nr_busy = field!(Slab, nr_busy);
    /// Slab header: objects.
    slab_nr_objs = field!(Slab, nr_objs);
    /// Slab header: the owning cache.
    slab_cache = field!(Slab, cache);
    /// Slab header: the next slab on its list.
    slab_next = field!(Slab, next);
    /// Slab header: address of object 0.
    slab_base = field!(Slab, base);
    /// Slab header: bufctl slabs' first free bufctl.
    slab_free = field!(Slab, free);
    /// Slab header: small slabs' free map (bit `i` of the little-endian
    /// words set while object `i` is on the free list).
    slab_free_map = field!(Slab, free_map);
    /// Bufctl: the next free bufctl of its slab.
    bufctl_free_next = field!(Bufctl, free_next);
    /// Bufctl: its buffer's address.
    bufctl_addr = field!(Bufctl, addr);

    /// Per-CPU cache: the loaded magazine.
    pcpu_loaded = Entry::field(
        offset_of!(PcpuCache, inner) + offset_of!(PcpuInner, loaded),
        size_of::<usize>(),
    );
    /// Per-CPU cache: the previous magazine.
    pcpu_prev = Entry::field(
        offset_of!(PcpuCache, inner) + offset_of!(PcpuInner, prev),
        size_of::<usize>(),
    );
    /// Per-CPU cache: allocations its magazines served.
    pcpu_nr_allocs = Entry::field(
        offset_of!(PcpuCache, inner) + offset_of!(PcpuInner, nr_allocs),
        size_of::<u64>(),
    );
    /// Per-CPU cache: rounds in from the depot minus rounds out
    /// (wrapping); frees = held - exchanged + allocs.
    pcpu_nr_rounds_exchanged = Entry::field(
        offset_of!(PcpuCache, inner) + offset_of!(PcpuInner, nr_rounds_exchanged),
        size_of::<u64>(),
    );
    /// Per-CPU cache: the loaded magazine's slot above its top round (its
    /// header's count is stale while loaded).
    pcpu_top = Entry::field(
        offset_of!(PcpuCache, inner) + offset_of!(PcpuInner, top),
        size_of::<usize>(),
    );

    /// Magazine: rounds when full (`u32`; 0 for the absent magazine).
    magazine_capacity = field!(Magazine, capacity);
    /// Magazine: rounds now (stale while loaded: see `pcpu_top`).
    magazine_nr_rounds = field!(Magazine, nr_rounds);
    /// Magazine: the depot list's link.
    magazine_next = field!(Magazine, next);
    /// Magazine: where the round slots start (pointers).
    magazine_rounds = Entry::field(offset_of!(Magazine, rounds), size_of::<usize>());
    /// Constant: rounds per magazine of each type, smallest first.
    magazine_rounds_0 = Entry::value(MAGAZINE_ROUNDS[0]);
    /// Constant: as `magazine_rounds_0`, type 1.
    magazine_rounds_1 = Entry::value(MAGAZINE_ROUNDS[1]);
    /// Constant: as `magazine_rounds_0`, type 2.
    magazine_rounds_2 = Entry::value(MAGAZINE_ROUNDS[2]);
    /// Constant: as `magazine_rounds_0`, type 3.
    magazine_rounds_3 = Entry::value(MAGAZINE_ROUNDS[3]);
    /// Constant: as `magazine_rounds_0`, type 4.
    magazine_rounds_4 = Entry::value(MAGAZINE_ROUNDS[4]);
    /// Constant: as `magazine_rounds_0`, type 5.
    magazine_rounds_5 = Entry::value(MAGAZINE_ROUNDS[5]);

    /// kmemtrace's state in the allocator.
    allocator_kmemtrace = field!(LayoutAllocator, kmemtrace);
    /// kmemtrace: the per-CPU rings (null before the first start).
    kmemtrace_rings = field!(KmemtraceState, rings);
    /// kmemtrace: bytes of the rings (`cpu_ring_size` per CPU).
    kmemtrace_rings_bytes = field!(KmemtraceState, rings_bytes);
    /// kmemtrace: frames recorded per event (0: no stacks).
    kmemtrace_stack_depth = field!(KmemtraceState, stack_depth);
    /// kmemtrace: recording since boot (`bool`).
    kmemtrace_from_boot = field!(KmemtraceState, from_boot);
    /// kmemtrace: the record's start (clock ticks).
    kmemtrace_start_ticks = field!(KmemtraceState, start_ticks);
    /// kmemtrace: the stack table's lock (payload at the header's
    /// `stacks_lock_data`).
    kmemtrace_stacks = field!(KmemtraceState, stacks);
    /// Stack table: frames, `max_stack_depth` per stack (`u64`s).
    stack_table_frames = field!(StackTable, frames);
    /// Stack table: each stack's depth (`u8`s).
    stack_table_depths = field!(StackTable, depths);
    /// Stack table: stacks kept (ids 1..=nr).
    stack_table_nr_stacks = field!(StackTable, nr_stacks);
    /// Constant: frames per stack slot.
    max_stack_depth = Entry::value(crate::kmemtrace::MAX_STACK_DEPTH);
    /// kmemtrace: the marks' lock (payload at the header's
    /// `marks_lock_data`).
    kmemtrace_marks = field!(KmemtraceState, marks);
    /// Marks: the entries (`mark_size` bytes each).
    marks_entries = field!(Marks, entries);
    /// Marks: entries used.
    marks_nr_marks = field!(Marks, nr_marks);
    /// Constant: bytes per mark.
    mark_size = Entry::value(size_of::<Mark>());
    /// Mark: when (clock ticks).
    mark_ticks = field!(Mark, ticks);
    /// Mark: the CPU.
    mark_cpu = field!(Mark, cpu);
    /// Mark: its text's bytes.
    mark_text = field!(Mark, text);
    /// Mark: its text's length.
    mark_text_len = field!(Mark, text_len);
    /// Constant: bytes per CPU ring.
    cpu_ring_size = Entry::value(size_of::<CpuRing>());
    /// CPU ring: events written since the start.
    cpu_ring_nr_written = field!(CpuRing, nr_written);
    /// CPU ring: the sub-buffer array (pointers to `subbuf_events` events
    /// each).
    cpu_ring_subbufs = field!(CpuRing, subbufs);
    /// CPU ring: events it holds.
    cpu_ring_capacity = field!(CpuRing, capacity);
    /// CPU ring: events lost to a full ring.
    cpu_ring_nr_overruns = field!(CpuRing, nr_overruns);
    /// Constant: events per sub-buffer.
    subbuf_events = Entry::value(crate::kmemtrace::SUBBUF_EVENTS);
    /// Constant: bytes per event (the kmemtrace ABI's record,
    /// docs/KMEMTRACE-ABI.md; timestamps in clock ticks).
    event_size = Entry::value(size_of::<crate::kmemtrace::KmemtraceEvent>());

    /// A cache's trace table's lock (`spin::Mutex<TraceTableInner>`,
    /// payload at the header's `trace_lock_data`).
    cache_trace_lock = Entry::field(
        offset_of!(LayoutCache, trace) + offset_of!(TraceTable<LayoutPlatform>, inner),
        size_of::<TraceTable<LayoutPlatform>>(),
    );
    /// A cache's trace table: records it could not allocate.
    cache_trace_nr_dropped = Entry::field(
        offset_of!(LayoutCache, trace) + offset_of!(TraceTable<LayoutPlatform>, nr_dropped),
        size_of::<u64>(),
    );
    /// Trace table: the newest record (linked to older ones).
    trace_newest = field!(TraceTableInner, newest);
    /// Trace record node: the next older one.
    trace_node_older = field!(TraceNode, older);
    /// Trace record node: the record ([`TraceRecord`], fields below).
    trace_node_record = field!(TraceNode, record);
    /// Trace record: the object.
    trace_record_addr = field!(TraceRecord, addr);
    /// Trace record: its size.
    trace_record_size = field!(TraceRecord, size);
    /// Trace record: the CPU.
    trace_record_cpu = field!(TraceRecord, cpu);
    /// Trace record: when (clock ticks).
    trace_record_timestamp = field!(TraceRecord, timestamp);
    /// Trace record: the context string's bytes.
    trace_record_context = field!(TraceRecord, context);
    /// Trace record: the context string's length.
    trace_record_context_len = field!(TraceRecord, context_len);
    /// Trace record: frames captured.
    trace_record_nr_frames = field!(TraceRecord, nr_frames);
    /// Trace record: the return addresses, innermost first.
    trace_record_frames = field!(TraceRecord, frames);
    /// Constant: frames per record.
    trace_max_frames = Entry::value(TRACE_MAX_FRAMES);

    /// The error ring's lock (`spin::Mutex<RingInner>`, payload at the
    /// header's `errors_lock_data`).
    allocator_errors = field!(LayoutAllocator, errors);
    /// Error ring: the slots, `error_wire_size` bytes each (report `seq` in
    /// slot `(seq - 1) % error_ring_size`; byte 0 is 1 when one is there).
    error_ring_reports = field!(crate::reports::error::RingInner, reports);
    /// Error ring: reports ever (the newest one's `seq`).
    error_ring_nr_reported = field!(crate::reports::error::RingInner, nr_reported);
    /// Constant: slots in the ring.
    error_ring_size = Entry::value(crate::reports::error::ERROR_RING_SIZE);
    /// Constant: bytes of a report's wire form (`ErrorReport::from_wire`).
    error_wire_size = Entry::value(crate::reports::error::ERROR_WIRE_SIZE);

    /// KFENCE's state in the allocator (feature `kfence`; absent, size 0,
    /// without it, as every `kfence_*` entry).
    allocator_kfence = feature_entry!("kfence", field!(LayoutAllocator, kfence));
    /// KFENCE: the pool's first page (0: no pool).
    kfence_pool = feature_entry!("kfence", field!(crate::kfence::pool::KfencePool, pool));
    /// KFENCE: the sample interval in ns (0: off).
    kfence_interval_ns =
        feature_entry!("kfence", field!(crate::kfence::pool::KfencePool, interval_ns));
    /// KFENCE: samples ever.
    kfence_nr_allocs = feature_entry!("kfence", field!(crate::kfence::pool::KfencePool, nr_allocs));
    /// KFENCE: frees of samples ever.
    kfence_nr_frees = feature_entry!("kfence", field!(crate::kfence::pool::KfencePool, nr_frees));
    /// KFENCE: samples not served.
    kfence_nr_skipped =
        feature_entry!("kfence", field!(crate::kfence::pool::KfencePool, nr_skipped));
    /// KFENCE: bugs reported.
    kfence_nr_bugs = feature_entry!("kfence", field!(crate::kfence::pool::KfencePool, nr_bugs));
    /// KFENCE: the objects' metadata array (`kfence_num_objects` of
    /// `kfence_object_size` bytes).
    kfence_meta = feature_entry!("kfence", field!(crate::kfence::pool::KfencePool, meta));
    /// Constant: objects in the pool.
    kfence_num_objects = feature_entry!("kfence", Entry::value(crate::kfence::KFENCE_NUM_OBJECTS));
    /// Constant: pages of the pool.
    kfence_pool_pages = feature_entry!("kfence", Entry::value(crate::kfence::KFENCE_POOL_PAGES));
    /// Constant: bytes per object's metadata.
    kfence_object_size =
        feature_entry!("kfence", Entry::value(size_of::<crate::kfence::KfenceObject>()));
    /// Object metadata: its index (`kfence-#N`).
    kfence_object_index = feature_entry!("kfence", field!(crate::kfence::KfenceObject, index));
    /// Object metadata: its state (one byte: the `kfence_state_*` constants).
    kfence_object_state = feature_entry!("kfence", field!(crate::kfence::KfenceObject, state));
    /// Constant: the state byte of an object never used.
    kfence_state_unused =
        feature_entry!("kfence", kfence_state(crate::kfence::KfenceState::Unused));
    /// Constant: the state byte of an allocated object.
    kfence_state_allocated =
        feature_entry!("kfence", kfence_state(crate::kfence::KfenceState::Allocated));
    /// Constant: the state byte of a freed object.
    kfence_state_freed = feature_entry!("kfence", kfence_state(crate::kfence::KfenceState::Freed));
    /// Object metadata: the object's address.
    kfence_object_addr = feature_entry!("kfence", field!(crate::kfence::KfenceObject, addr));
    /// Object metadata: its size.
    kfence_object_obj_size = feature_entry!("kfence", field!(crate::kfence::KfenceObject, size));
    /// Object metadata: its cache's name's bytes.
    kfence_object_cache = feature_entry!(
        "kfence",
        Entry::field(
            offset_of!(crate::kfence::KfenceObject, cache) + offset_of!(ReportName, bytes),
            size_of::<[u8; 31]>(),
        )
    );
    /// Object metadata: its cache's name's length (`u8`).
    kfence_object_cache_len = feature_entry!(
        "kfence",
        Entry::field(
            offset_of!(crate::kfence::KfenceObject, cache) + offset_of!(ReportName, len),
            1,
        )
    );
    /// Object metadata: the allocation's stack (`kfence_stack_*` fields).
    kfence_object_alloc = feature_entry!("kfence", field!(crate::kfence::KfenceObject, alloc));
    /// Object metadata: the free's stack.
    kfence_object_free = feature_entry!("kfence", field!(crate::kfence::KfenceObject, free));
    /// KFENCE stack: return addresses, innermost first.
    kfence_stack_frames = feature_entry!("kfence", field!(crate::kfence::KfenceStack, frames));
    /// KFENCE stack: frames valid.
    kfence_stack_len = feature_entry!("kfence", field!(crate::kfence::KfenceStack, len));
    /// KFENCE stack: the CPU.
    kfence_stack_cpu = feature_entry!("kfence", field!(crate::kfence::KfenceStack, cpu));
    /// KFENCE stack: when (clock ticks).
    kfence_stack_time = feature_entry!("kfence", field!(crate::kfence::KfenceStack, time));

    /// The page map's slots (`page_slot_size` bytes each, one per page
    /// from `allocator_page_map_base`).
    allocator_page_map_entries = Entry::field(
        offset_of!(LayoutAllocator, page_map) + offset_of!(PageMap, entries),
        size_of::<usize>(),
    );
    /// Constant: bytes per page-map slot.
    page_slot_size = Entry::value(size_of::<PageSlot>());
    /// Page-map slot: the entry word (its low `page_entry_tag_mask` bits
    /// say what the page is).
    page_slot_entry = field!(PageSlot, entry);
    /// Constant: the mask of a page-map entry's kind bits.
    page_entry_tag_mask = Entry::value(pagemap::TAG_MASK);
    /// Constant: the kind of the first page of a page-granular kmalloc.
    page_entry_large_head = Entry::value(pagemap::TAG_LARGE_HEAD);
    /// Constant: a head entry's pages are `(entry >> 3) &
    /// page_entry_pages_mask`.
    page_entry_pages_mask = Entry::value(pagemap::LARGE_MAX_PAGES);
    /// Constant: a head entry's charge token is `entry >>
    /// page_entry_token_shift` (a `u32`; 0: none).
    page_entry_token_shift = Entry::value(pagemap::LARGE_HIGH_SHIFT as usize);
    /// Slab header: the tag side array (feature `alloc-profiling`; absent
    /// without it): one 4-byte charge token per object, 0 for none.
    slab_tags = feature_entry!("alloc-profiling", field!(Slab, tags));
    /// Bufctl: the charge token of its buffer's tag while a caller holds
    /// it (feature `alloc-profiling`; a `u32`, 0 for none).
    bufctl_tag = feature_entry!("alloc-profiling", field!(Bufctl, tag));
    /// Bufctl: the next bufctl in its hash bucket.
    bufctl_hash_next = field!(Bufctl, hash_next);
    /// Slab lists: the bufctl hash (buffer address to the bufctl of every
    /// busy buffer of a bufctl cache).
    slab_lists_hash = field!(SlabLists, hash);
    /// Bufctl hash: its inline buckets (used while `hash_table` is null).
    hash_inline = field!(AddrHash<Bufctl>, inline);
    /// Bufctl hash: its page-backed buckets, or null.
    hash_table = field!(AddrHash<Bufctl>, table);
    /// Bufctl hash: buckets (of the inline ones or the table).
    hash_nr_buckets = field!(AddrHash<Bufctl>, nr_buckets);
    /// KFENCE object metadata: its cache's address (the cache the sample
    /// stands in for).
    kfence_object_cache_ptr =
        feature_entry!("kfence", field!(crate::kfence::KfenceObject, cache_ptr));
    /// KFENCE object metadata: the charge token of its allocation tag
    /// (`u32`, 0: none).
    kfence_object_tag = feature_entry!(
        "kfence",
        Entry::field(
            offset_of!(crate::kfence::KfenceObject, tag),
            size_of::<Option<crate::alloc_tag::AllocTagRef>>(),
        )
    );
}

const _: () = assert!(MAGAZINE_ROUNDS.len() == 6);

/// The descriptor: a header, what only the running kernel knows, and the
/// layout. See the module docs and docs/VMCORE.md.
#[repr(C)]
pub struct SlabDescriptor {
    /// [`DESCRIPTOR_MAGIC`].
    pub magic: [u8; 16],
    /// [`DESCRIPTOR_VERSION`].
    pub version: u32,
    /// Bytes from the start of the descriptor to its layout.
    pub header_size: u32,
    /// Bytes of the layout (16 per entry).
    pub layout_size: u32,
    /// Bytes of a pointer in the described kernel.
    pub pointer_size: u32,
    /// Address of the registered allocator; 0 before its `init`.
    pub allocator: AtomicU64,
    /// Byte offset of the payload in the allocator's cache-list lock.
    pub cache_list_lock_data: AtomicU64,
    /// Byte offset of the payload in a cache's depot lock.
    pub depot_lock_data: AtomicU64,
    /// Byte offset of the payload in a cache's slab lock.
    pub slab_lock_data: AtomicU64,
    /// Byte offset of the payload in kmemtrace's stack-table lock.
    pub stacks_lock_data: AtomicU64,
    /// Byte offset of the payload in kmemtrace's marks lock.
    pub marks_lock_data: AtomicU64,
    /// Byte offset of the payload in a cache's trace-table lock.
    pub trace_lock_data: AtomicU64,
    /// The clock's rate ([`Platform::now`] ticks per millisecond), as the
    /// kernel set it with [`set_clock_khz`]; 0: unknown (readers keep
    /// ticks).
    pub clock_khz: AtomicU64,
    /// Byte offset of the payload in the error ring's lock.
    pub errors_lock_data: AtomicU64,
    /// The layout.
    pub layout: DescriptorLayout,
    /// The kernel's arenas, for `kmemstat`'s arena rows ([`describe_kmemstat`]).
    pub arenas: KmemstatArenas,
    /// The kernel's roots, for a leak scan of an image ([`describe_leak_roots`]).
    pub roots: LeakRoots,
}

/// The descriptor of this program's allocator (see the module docs).
#[used]
#[unsafe(no_mangle)]
pub static MAGPIE_SLAB_DESCRIPTOR: SlabDescriptor = SlabDescriptor {
    magic: DESCRIPTOR_MAGIC,
    version: DESCRIPTOR_VERSION,
    header_size: offset_of!(SlabDescriptor, layout) as u32,
    layout_size: size_of::<DescriptorLayout>() as u32,
    pointer_size: size_of::<usize>() as u32,
    allocator: AtomicU64::new(0),
    cache_list_lock_data: AtomicU64::new(0),
    depot_lock_data: AtomicU64::new(0),
    slab_lock_data: AtomicU64::new(0),
    stacks_lock_data: AtomicU64::new(0),
    marks_lock_data: AtomicU64::new(0),
    trace_lock_data: AtomicU64::new(0),
    clock_khz: AtomicU64::new(0),
    errors_lock_data: AtomicU64::new(0),
    layout: LAYOUT,
    arenas: KmemstatArenas::EMPTY,
    roots: LeakRoots::EMPTY,
};

/// The byte offset of a guard's payload from its lock.
fn payload_offset<T>(lock: *const u8, payload: &T) -> u64 {
    (core::ptr::from_ref(payload).cast::<u8>() as u64).wrapping_sub(lock as u64)
}

/// Describe `allocator` (called by [`Kmem::init`] once it is ready):
/// the first allocator of the program is the one described. Refused (the
/// descriptor stays empty) if the platform changed a structure's size,
/// which `LayoutPlatform` would not see.
pub(crate) fn register<P: Platform>(allocator: &'static Kmem<P>) {
    // The loom models explore every interleaving of the locks: the
    // measuring locks below are none of theirs.
    if cfg!(loom) {
        return;
    }
    if size_of::<Kmem<P>>() != size_of::<LayoutAllocator>()
        || size_of::<KmemCache<P>>() != size_of::<LayoutCache>()
    {
        return;
    }
    let descriptor = &MAGPIE_SLAB_DESCRIPTOR;
    if descriptor.allocator.load(Ordering::Acquire) != 0 {
        return;
    }
    // The lock crate's layout is its own: measure where each payload is,
    // on locks nobody else holds (the init thread owns the new
    // allocator; the other two are this function's).
    let Some(list) = allocator.caches.try_lock::<P>() else {
        return;
    };
    let list_data = payload_offset(core::ptr::from_ref(&allocator.caches).cast(), &*list);
    drop(list);
    let depot = Depot::<P>::new(0, 0, false);
    let depot_data = payload_offset(
        core::ptr::from_ref(&depot.inner).cast(),
        &*depot.inner.lock(),
    );
    let layer = SlabLayer::<P>::new();
    let slab_data = payload_offset(core::ptr::from_ref(&layer.lists).cast(), &*layer.lock());
    descriptor
        .cache_list_lock_data
        .store(list_data, Ordering::Relaxed);
    descriptor
        .depot_lock_data
        .store(depot_data, Ordering::Relaxed);
    descriptor
        .slab_lock_data
        .store(slab_data, Ordering::Relaxed);
    let trace = TraceTable::<P>::new();
    let trace_data = payload_offset(core::ptr::from_ref(&trace.inner).cast(), &*trace.lock());
    descriptor
        .trace_lock_data
        .store(trace_data, Ordering::Relaxed);
    if let Some(errors) = allocator.errors.inner.try_lock() {
        let at = payload_offset(
            core::ptr::from_ref(&allocator.errors.inner).cast(),
            &*errors,
        );
        descriptor.errors_lock_data.store(at, Ordering::Relaxed);
    }
    let kmemtrace = &allocator.kmemtrace;
    if let Some(stacks) = kmemtrace.stacks.try_lock::<P>() {
        let at = payload_offset(core::ptr::from_ref(&kmemtrace.stacks).cast(), &*stacks);
        descriptor.stacks_lock_data.store(at, Ordering::Relaxed);
    }
    if let Some(marks) = kmemtrace.marks.try_lock::<P>() {
        let at = payload_offset(core::ptr::from_ref(&kmemtrace.marks).cast(), &*marks);
        descriptor.marks_lock_data.store(at, Ordering::Relaxed);
    }
    // Published last: a reader that sees the allocator sees the rest.
    // A racing second allocator's init loses the exchange and changes
    // nothing above (the values are the same for every allocator).
    let _ = descriptor.allocator.compare_exchange(
        0,
        core::ptr::from_ref(allocator) as u64,
        Ordering::Release,
        Ordering::Relaxed,
    );
}

/// The layout of this build (what [`MAGPIE_SLAB_DESCRIPTOR`] holds).
pub fn layout() -> &'static DescriptorLayout {
    &MAGPIE_SLAB_DESCRIPTOR.layout
}

/// Tell readers the clock's rate: [`Platform::now`] ticks per millisecond
/// (a kernel whose clock is the TSC calls it once calibrated), so that
/// `magpie-kmem core CORE events` writes nanoseconds as the kernel's own
/// dump does.
pub fn set_clock_khz(khz: u64) {
    MAGPIE_SLAB_DESCRIPTOR
        .clock_khz
        .store(khz, Ordering::Relaxed);
}

/// Arena rows the descriptor can hold.
pub const MAX_ARENAS: usize = 8;

/// One of a `kmemstat` arena row's figures as a reader computes it from
/// the image: a constant, or `(word at addr - word at minus) * scale`
/// (`minus` 0: nothing subtracted). Words are little-endian unsigned
/// integers of `size` bytes (1, 2, 4 or 8).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArenaFigure {
    addr: usize,
    minus: usize,
    size: usize,
    scale: u64,
}

impl ArenaFigure {
    /// A figure that does not change (an arena of fixed size).
    pub const fn constant(value: u64) -> ArenaFigure {
        ArenaFigure {
            addr: value as usize,
            minus: 0,
            size: 0,
            scale: 1,
        }
    }

    /// The integer at `word` (a `usize`, `u64`, `u32`, or an atomic of
    /// one, that lives as long as the kernel) times `scale` (say, pages to
    /// bytes). Only its address is kept: nothing is read here.
    pub fn word<T>(word: *const T, scale: u64) -> ArenaFigure {
        ArenaFigure {
            addr: word as usize,
            minus: 0,
            size: size_of::<T>(),
            scale,
        }
    }

    /// This figure less the integer at `minus` (of the same type), before
    /// the scale: `total - free` pages, say.
    pub fn minus<T>(self, minus: *const T) -> ArenaFigure {
        ArenaFigure {
            minus: minus as usize,
            ..self
        }
    }
}

/// An arena as `kmemstat` shows it (Akaros' `A` row), described for
/// readers of a memory image: [`describe_kmemstat`].
#[derive(Debug, Clone, Copy)]
pub struct ArenaDescription {
    /// Indent level (as [`KmemstatRow::indent`](crate::reports::KmemstatRow)).
    pub indent: usize,
    /// The arena's name (at most 31 bytes are kept).
    pub name: &'static str,
    /// Its quantum (the Objsize column).
    pub quantum: usize,
    /// Total Amt.
    pub total: ArenaFigure,
    /// Alloc Amt.
    pub alloc: ArenaFigure,
    /// Allocs Ever.
    pub nr_allocs_ever: ArenaFigure,
}

/// A figure as the descriptor stores it (see [`ArenaFigure`]; `size` 0:
/// the constant in `addr`).
#[repr(C)]
#[derive(Debug)]
pub struct FigureSlot {
    /// The word's address, or the constant.
    pub addr: AtomicU64,
    /// The subtracted word's address (0: none).
    pub minus: AtomicU64,
    /// Bytes of the words; 0 for a constant.
    pub size: AtomicU64,
    /// The multiplier.
    pub scale: AtomicU64,
}

/// One arena row as the descriptor stores it.
#[repr(C)]
#[derive(Debug)]
pub struct ArenaSlot {
    /// The name's bytes (UTF-8).
    pub name: [AtomicU64; 4],
    /// The name's length.
    pub name_len: AtomicU64,
    /// Indent level.
    pub indent: AtomicU64,
    /// Quantum (the Objsize column).
    pub quantum: AtomicU64,
    /// Total Amt, Alloc Amt, Allocs Ever.
    pub figures: [FigureSlot; 3],
}

/// The kernel's `kmemstat` arenas: `nr_arenas` rows, the caches' rows
/// (at `caches_indent`) after the first `caches_after` of them.
#[repr(C)]
#[derive(Debug)]
pub struct KmemstatArenas {
    /// Arena rows described (0: none; the caches at indent 0).
    pub nr_arenas: AtomicU64,
    /// Arena rows before the caches' rows.
    pub caches_after: AtomicU64,
    /// The caches' indent level.
    pub caches_indent: AtomicU64,
    /// The rows.
    pub arenas: [ArenaSlot; MAX_ARENAS],
}

#[allow(
    clippy::declare_interior_mutable_const,
    reason = "only copied into the static's initialiser"
)]
const FIGURE_EMPTY: FigureSlot = FigureSlot {
    addr: AtomicU64::new(0),
    minus: AtomicU64::new(0),
    size: AtomicU64::new(0),
    scale: AtomicU64::new(0),
};

#[allow(
    clippy::declare_interior_mutable_const,
    reason = "only copied into the static's initialiser"
)]
const ARENA_EMPTY: ArenaSlot = ArenaSlot {
    name: [const { AtomicU64::new(0) }; 4],
    name_len: AtomicU64::new(0),
    indent: AtomicU64::new(0),
    quantum: AtomicU64::new(0),
    figures: [FIGURE_EMPTY; 3],
};

impl KmemstatArenas {
    #[allow(
        clippy::declare_interior_mutable_const,
        reason = "only copied into the static's initialiser"
    )]
    const EMPTY: KmemstatArenas = KmemstatArenas {
        nr_arenas: AtomicU64::new(0),
        caches_after: AtomicU64::new(0),
        caches_indent: AtomicU64::new(0),
        arenas: [ARENA_EMPTY; MAX_ARENAS],
    };
}

/// Describe the kernel's `kmemstat` arenas for readers of a memory image
/// (`magpie-kmem core CORE kmemstat` prints the rows the kernel's own
/// `kmemstat` prints): `before` are the rows above the caches (the page
/// sources they import from), the caches' rows follow at
/// `caches_indent`, then `after`. Each figure is read from the image
/// where the kernel keeps it ([`ArenaFigure::word`]), so a core taken at
/// any moment shows that moment's figures. A later call replaces the
/// description; rows past [`MAX_ARENAS`] are dropped (returns `false`).
pub fn describe_kmemstat(
    before: &[ArenaDescription],
    caches_indent: usize,
    after: &[ArenaDescription],
) -> bool {
    let table = &MAGPIE_SLAB_DESCRIPTOR.arenas;
    table.nr_arenas.store(0, Ordering::Release);
    let mut nr = 0;
    for arena in before.iter().chain(after) {
        let Some(slot) = table.arenas.get(nr) else {
            break;
        };
        let mut name = [0u8; 32];
        let len = arena.name.len().min(31);
        name[..len].copy_from_slice(&arena.name.as_bytes()[..len]);
        for (word, bytes) in slot.name.iter().zip(name.chunks_exact(8)) {
            let mut chunk = [0u8; 8];
            chunk.copy_from_slice(bytes);
            word.store(u64::from_le_bytes(chunk), Ordering::Relaxed);
        }
        slot.name_len.store(len as u64, Ordering::Relaxed);
        slot.indent.store(arena.indent as u64, Ordering::Relaxed);
        slot.quantum.store(arena.quantum as u64, Ordering::Relaxed);
        for (figure, value) in
            slot.figures
                .iter()
                .zip([arena.total, arena.alloc, arena.nr_allocs_ever])
        {
            figure.addr.store(value.addr as u64, Ordering::Relaxed);
            figure.minus.store(value.minus as u64, Ordering::Relaxed);
            figure.size.store(value.size as u64, Ordering::Relaxed);
            figure.scale.store(value.scale, Ordering::Relaxed);
        }
        nr += 1;
    }
    table
        .caches_after
        .store(before.len().min(nr) as u64, Ordering::Relaxed);
    table
        .caches_indent
        .store(caches_indent as u64, Ordering::Relaxed);
    table.nr_arenas.store(nr as u64, Ordering::Release);
    nr == before.len() + after.len()
}

// docs/VMCORE.md gives these sizes.
const _: () = assert!(size_of::<ArenaSlot>() == 152);
const _: () = assert!(offset_of!(KmemstatArenas, arenas) == 24);

/// Root ranges (and holes) the descriptor can hold.
pub const MAX_ROOT_RANGES: usize = 8;

/// Stack tables the descriptor can hold.
pub const MAX_STACK_TABLES: usize = 4;

/// A table of kernel stacks, described for a leak scan of an image
/// ([`describe_leak_roots`]): stack `n` is `tops[n] - size .. tops[n]`
/// (`tops[n]` 0: no stack). Its live part, the root, starts at
/// `floors[n]` when that word is inside the stack (the kernel's own word
/// of where the frames that matter start: an idle CPU's loop, the shell
/// below a running command), else at the stack pointer of the image's CPU
/// that stopped on it, else it is the whole stack.
#[derive(Debug, Clone, Copy)]
pub struct KernelStacks {
    /// Each stack's top (one past its highest byte), 0 for none.
    pub tops: &'static [AtomicUsize],
    /// Bytes of each stack.
    pub size: usize,
    /// Each stack's live part's bottom (0: not known), as many as `tops`.
    pub floors: Option<&'static [AtomicUsize]>,
}

/// A stack table as the descriptor stores it.
#[repr(C)]
#[derive(Debug)]
pub struct StackSlot {
    /// The address of the table's tops (`nr` words).
    pub tops: AtomicU64,
    /// Stacks in the table.
    pub nr: AtomicU64,
    /// Bytes per stack.
    pub size: AtomicU64,
    /// The address of its floors (`nr` words), 0 for none.
    pub floors: AtomicU64,
}

/// The kernel's roots for a leak scan of an image (`magpie-kmem core CORE
/// findleaks`, the conservative scan of `leak_scan` run offline): static
/// ranges less holes, and stack tables; the image adds every CPU's
/// registers.
#[repr(C)]
#[derive(Debug)]
pub struct LeakRoots {
    /// Root ranges described.
    pub nr_ranges: AtomicU64,
    /// `start, end` of each.
    pub ranges: [[AtomicU64; 2]; MAX_ROOT_RANGES],
    /// Holes described: parts of the ranges that are not roots.
    pub nr_holes: AtomicU64,
    /// `start, end` of each.
    pub holes: [[AtomicU64; 2]; MAX_ROOT_RANGES],
    /// Stack tables described.
    pub nr_stacks: AtomicU64,
    /// The tables.
    pub stacks: [StackSlot; MAX_STACK_TABLES],
}

impl LeakRoots {
    #[allow(
        clippy::declare_interior_mutable_const,
        reason = "only copied into the static's initialiser"
    )]
    const EMPTY: LeakRoots = LeakRoots {
        nr_ranges: AtomicU64::new(0),
        ranges: [const { [AtomicU64::new(0), AtomicU64::new(0)] }; MAX_ROOT_RANGES],
        nr_holes: AtomicU64::new(0),
        holes: [const { [AtomicU64::new(0), AtomicU64::new(0)] }; MAX_ROOT_RANGES],
        nr_stacks: AtomicU64::new(0),
        stacks: [const {
            StackSlot {
                tops: AtomicU64::new(0),
                nr: AtomicU64::new(0),
                size: AtomicU64::new(0),
                floors: AtomicU64::new(0),
            }
        }; MAX_STACK_TABLES],
    };
}

/// Describe the kernel's roots for a leak scan of a memory image (what a
/// live kernel hands `leak_scan::LeakScan::scan_range` itself):
/// `ranges` (kernel data and bss) less `holes` (records of objects that
/// do not own them), and its stacks. A reader adds every CPU's saved
/// registers from the image. A later call replaces the description;
/// entries past [`MAX_ROOT_RANGES`] or [`MAX_STACK_TABLES`] are dropped
/// (returns `false`).
pub fn describe_leak_roots(
    ranges: &[core::ops::Range<usize>],
    holes: &[core::ops::Range<usize>],
    stacks: &[KernelStacks],
) -> bool {
    let roots = &MAGPIE_SLAB_DESCRIPTOR.roots;
    roots.nr_ranges.store(0, Ordering::Release);
    roots.nr_holes.store(0, Ordering::Release);
    roots.nr_stacks.store(0, Ordering::Release);
    let store = |slots: &[[AtomicU64; 2]], from: &[core::ops::Range<usize>]| {
        for (slot, range) in slots.iter().zip(from) {
            slot[0].store(range.start as u64, Ordering::Relaxed);
            slot[1].store(range.end as u64, Ordering::Relaxed);
        }
        from.len().min(slots.len()) as u64
    };
    let nr_ranges = store(&roots.ranges, ranges);
    let nr_holes = store(&roots.holes, holes);
    for (slot, table) in roots.stacks.iter().zip(stacks) {
        slot.tops
            .store(table.tops.as_ptr() as u64, Ordering::Relaxed);
        slot.nr.store(table.tops.len() as u64, Ordering::Relaxed);
        slot.size.store(table.size as u64, Ordering::Relaxed);
        let floors = table
            .floors
            .filter(|floors| floors.len() >= table.tops.len())
            .map_or(0, |floors| floors.as_ptr() as u64);
        slot.floors.store(floors, Ordering::Relaxed);
    }
    let nr_stacks = stacks.len().min(MAX_STACK_TABLES);
    roots.nr_ranges.store(nr_ranges, Ordering::Release);
    roots.nr_holes.store(nr_holes, Ordering::Release);
    roots.nr_stacks.store(nr_stacks as u64, Ordering::Release);
    ranges.len() <= MAX_ROOT_RANGES
        && holes.len() <= MAX_ROOT_RANGES
        && stacks.len() <= MAX_STACK_TABLES
}

// docs/VMCORE.md gives these sizes.
const _: () = assert!(size_of::<StackSlot>() == 32);
const _: () = assert!(offset_of!(LeakRoots, holes) == 144);
const _: () = assert!(offset_of!(LeakRoots, stacks) == 280);
const _: () = assert!(
    offset_of!(SlabDescriptor, roots)
        == offset_of!(SlabDescriptor, arenas) + size_of::<KmemstatArenas>()
);
