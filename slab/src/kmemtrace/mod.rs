//! kmemtrace: an event stream of every caller-visible allocation and free,
//! recorded into per-CPU rings of sub-buffers and dumped in a versioned
//! binary format for offline analysis (after the 2008 kmemtrace RFC by
//! Eduard-Gabriel Munteanu and Pekka Enberg, and today's `kmem:kmalloc` /
//! `kmem:kfree` tracepoints read by `perf kmem`).
//!
//! ## Where events come from
//!
//! The hooks sit at the level of the trace table, above the magazine layer
//! (every site is marked `KMEMTRACE HOOK` in `cache.rs` and
//! `allocator.rs`): `kmalloc`, `kfree`, `kmem_cache_alloc`/`free`,
//! page-granular kmalloc, `GlobalAlloc` and `core::alloc::Allocator`,
//! failed allocations and refused ("bad") frees. Recording is a bit of
//! every cache's `hot_flags` word (`HOT_KMEMTRACE`), which the alloc and
//! free hits test anyway: off, it costs the magazine hit nothing.
//!
//! ## Buffers
//!
//! One ring per CPU of `nr_subbufs` sub-buffers of [`SUBBUF_EVENTS`] events
//! ([`SUBBUF_PAGES`] pages each, from the allocator's primary page source),
//! written only by its own CPU with interrupts off: no lock, no atomic
//! read-modify-write and no cache line shared with another CPU on the event
//! path (each ring's descriptor is cache-line aligned). As in relay's
//! no-overwrite mode, a full ring drops the event and counts an overrun;
//! the per-CPU sequence number still advances, so a reader sees the gap.
//! A dump reads each ring up to its published count (a release store after
//! each event), so it may run while recording goes on.
//!
//! ## Dump format (ABI version [`KMEMTRACE_ABI_VERSION`](crate::kmemtrace::format::KMEMTRACE_ABI_VERSION))
//!
//! The layout is written once, in the `magpie-kmemtrace-format` crate,
//! which the host reader `magpie-kmem` decodes with too; this module
//! re-exports it as [`format`] ([`format::KmemtraceEvent`],
//! [`format::KmemtraceHeader`], the `RECORD_*` kinds,
//! the sizes). All
//! little-endian: a 64-byte header, records of an 8-byte header and a body
//! padded to 8 bytes — [`RECORD_CACHE`](crate::kmemtrace::format::RECORD_CACHE) per cache, [`RECORD_STACK`](crate::kmemtrace::format::RECORD_STACK) per
//! distinct backtrace, [`RECORD_CPU`](crate::kmemtrace::format::RECORD_CPU) per CPU sub-buffer holding 64-byte
//! events — and a [`RECORD_TRAILER`](crate::kmemtrace::format::RECORD_TRAILER) with counts and a CRC-32 of every
//! byte before it. The ring slots hold [`KmemtraceEvent`]s as the dump
//! does (`#[repr(C)]`, 64 bytes), so recording is eight stores and the
//! dump only converts the timestamps. The public description is
//! `docs/KMEMTRACE-ABI.md`.
//!
//! ## Call sites and stacks
//!
//! The call site is the caller's return address, the first frame outside
//! the allocator, from [`PlatformHooks::caller_frames`](crate::PlatformHooks::caller_frames) (a kernel walks its frame
//! pointers, skipping a linker-placed range of allocator text). With
//! stacks on, each event also names a backtrace in a deduplicated table
//! (one lock, taken only when stacks are recorded).

use core::ptr;
use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering};

use magpie_kmemtrace_format::{DumpWriter, MarkRecord};

use crate::platform::{CPU_SLOT_BYTES, PAGE_SIZE, PageSource, Platform};
use crate::sync::{IrqTryMutex, SpinIrq};

mod config;
mod control;
pub(crate) mod rings;

pub use config::{
    DEFAULT_SUBBUFS, DumpInfo, KmemtraceConfig, KmemtraceCpuStatus, KmemtraceError,
    KmemtraceStatus, MAX_STACK_DEPTH, MAX_STACKS, SUBBUF_EVENTS, SUBBUF_PAGES,
};
pub use control::Kmemtrace;
use rings::{CpuRing, allocate_rings};

// A CPU's ring is at its `Platform::cpu_offset` in the rings' array.
const _: () = assert!(core::mem::size_of::<CpuRing>() == CPU_SLOT_BYTES);

/// The dump's format (its ABI: header, events, records, trailer), the
/// crate `magpie-kmemtrace-format` that readers such as `magpie-kmem`
/// share.
pub use magpie_kmemtrace_format as format;
pub use magpie_kmemtrace_format::DumpSummary;
pub(crate) use magpie_kmemtrace_format::{
    EventKind, EventType, HEADER_FLAG_FROM_BOOT, HEADER_FLAG_STACKS, KmemtraceEvent,
    KmemtraceHeader,
};

/// The deduplicated stacks (only with `--stacks`).
pub(crate) struct StackTable {
    /// Bucket `i` holds a stack index plus one (0: empty); open addressing.
    buckets: *mut u32,
    /// `MAX_STACKS * MAX_STACK_DEPTH` frames.
    pub(crate) frames: *mut u64,
    /// Depth of each stack.
    pub(crate) depths: *mut u8,
    pub(crate) nr_stacks: usize,
}

const STACK_BUCKETS: usize = MAX_STACKS * 2;
const STACK_TABLE_BYTES: usize = STACK_BUCKETS * 4 + MAX_STACKS * MAX_STACK_DEPTH * 8 + MAX_STACKS;

/// Caches destroyed since the record started whose CACHE records a dump
/// still writes (the oldest are forgotten beyond this many).
const MAX_DESTROYED_CACHES: usize = 16;

/// A destroyed cache's CACHE record, its name copied (the cache's own
/// storage is freed with it).
#[derive(Clone, Copy)]
struct DestroyedCache {
    id: u32,
    obj_size: u32,
    align: u32,
    flags: u32,
    name: [u8; 32],
    name_len: usize,
}

impl DestroyedCache {
    const EMPTY: Self = DestroyedCache {
        id: 0,
        obj_size: 0,
        align: 0,
        flags: 0,
        name: [0; 32],
        name_len: 0,
    };
}

/// The destroyed caches of the current record, oldest overwritten first.
struct DestroyedCaches {
    entries: [DestroyedCache; MAX_DESTROYED_CACHES],
    /// Caches noted since the record started (entries hold the last
    /// `MAX_DESTROYED_CACHES`).
    nr_noted: usize,
}

/// Marks (shell command lines) a record keeps; later ones are counted
/// and dropped.
const MAX_MARKS: usize = 32;
/// Bytes of a mark's text kept.
const MARK_TEXT: usize = 64;

/// One mark: when (ticks), on which CPU, what.
#[derive(Clone, Copy)]
pub(crate) struct Mark {
    pub(crate) ticks: u64,
    pub(crate) cpu: u32,
    pub(crate) text: [u8; MARK_TEXT],
    pub(crate) text_len: usize,
}

/// The marks of the current record.
pub(crate) struct Marks {
    pub(crate) entries: [Mark; MAX_MARKS],
    pub(crate) nr_marks: usize,
}

/// Everything kmemtrace keeps in an [`Kmem`](crate::Kmem).
pub(crate) struct KmemtraceState {
    /// One cache-line aligned [`CpuRing`] per CPU; null before the first
    /// start. Never freed (writers may still hold it after a stop).
    pub(crate) rings: AtomicPtr<CpuRing>,
    /// The rings' size in bytes (`nr_rings * CPU_SLOT_BYTES`: a CPU's
    /// ring is at its [`Platform::cpu_offset`]); 0 before the first start,
    /// set before `rings` is published.
    pub(crate) rings_bytes: AtomicUsize,
    nr_subbufs: AtomicUsize,
    /// Recording everything: page-granular kmalloc and bad frees outside
    /// caches are recorded too (caches have their `HOT_KMEMTRACE` bit).
    pub(crate) recording_all: AtomicBool,
    recording: AtomicBool,
    /// `u32::MAX`: no filter.
    filter: AtomicU32,
    pub(crate) stack_depth: AtomicUsize,
    pub(crate) from_boot: AtomicBool,
    pub(crate) start_ticks: AtomicU64,
    pub(crate) stacks: SpinIrq<StackTable>,
    nr_stacks_dropped: AtomicU64,
    /// Serialises start, stop and dump.
    control: IrqTryMutex<()>,
    /// Caches destroyed during the record, so that the dump still names
    /// their events' cache (cold path: cache destroy and dump only).
    destroyed: SpinIrq<DestroyedCaches>,
    /// What the platform marked during the record (cold path).
    pub(crate) marks: SpinIrq<Marks>,
}

// SAFETY: the raw pointers are to memory owned by the recorder for its
// lifetime (never freed once set); rings are written only by their own CPU
// with interrupts off, readers use the atomics; the stack table is behind
// its mutex.
unsafe impl Sync for KmemtraceState {}
// SAFETY: as above.
unsafe impl Send for KmemtraceState {}
// SAFETY: the table's pointers are only used under the mutex.
unsafe impl Send for StackTable {}

const NO_FILTER: u32 = u32::MAX;

impl KmemtraceState {
    pub(crate) const fn new() -> Self {
        KmemtraceState {
            rings: AtomicPtr::new(ptr::null_mut()),
            rings_bytes: AtomicUsize::new(0),
            nr_subbufs: AtomicUsize::new(0),
            recording_all: AtomicBool::new(false),
            recording: AtomicBool::new(false),
            filter: AtomicU32::new(NO_FILTER),
            stack_depth: AtomicUsize::new(0),
            from_boot: AtomicBool::new(false),
            start_ticks: AtomicU64::new(0),
            stacks: SpinIrq::new(StackTable {
                buckets: ptr::null_mut(),
                frames: ptr::null_mut(),
                depths: ptr::null_mut(),
                nr_stacks: 0,
            }),
            nr_stacks_dropped: AtomicU64::new(0),
            control: IrqTryMutex::new(()),
            destroyed: SpinIrq::new(DestroyedCaches {
                entries: [DestroyedCache::EMPTY; MAX_DESTROYED_CACHES],
                nr_noted: 0,
            }),
            marks: SpinIrq::new(Marks {
                entries: [Mark {
                    ticks: 0,
                    cpu: 0,
                    text: [0; MARK_TEXT],
                    text_len: 0,
                }; MAX_MARKS],
                nr_marks: 0,
            }),
        }
    }

    /// Note `text` (a shell command line) at this time on this CPU, for
    /// the dump's MARK records; nothing unless recording; the first
    /// `MAX_MARKS` of a record, `MARK_TEXT` bytes of each, are kept.
    pub(crate) fn mark<P: Platform>(&self, text: &str) {
        if !self.is_recording() {
            return;
        }
        let mut marks = self.marks.lock::<P>();
        let index = marks.nr_marks;
        let Some(entry) = marks.entries.get_mut(index) else {
            return;
        };
        let mut text_len = text.len().min(MARK_TEXT);
        while !text.is_char_boundary(text_len) {
            text_len -= 1;
        }
        entry.ticks = P::now();
        entry.cpu = P::cpu_id() as u32;
        entry.text[..text_len].copy_from_slice(&text.as_bytes()[..text_len]);
        entry.text_len = text_len;
        marks.nr_marks += 1;
    }

    /// Keep a cache's CACHE record past its destruction, for the dump of
    /// the current record (its events name it by id). Nothing to keep
    /// before the first start. Called from `KmemCache::destroy` only.
    pub(crate) fn note_destroyed<P: Platform>(&self, cache: &CacheRecord<'_>) {
        if self.rings.load(Ordering::Acquire).is_null() {
            return;
        }
        let mut destroyed = self.destroyed.lock::<P>();
        let index = destroyed.nr_noted % MAX_DESTROYED_CACHES;
        let name_len = cache.name.len().min(32);
        let mut name = [0; 32];
        name[..name_len].copy_from_slice(&cache.name.as_bytes()[..name_len]);
        destroyed.entries[index] = DestroyedCache {
            id: cache.id,
            obj_size: cache.obj_size,
            align: cache.align,
            flags: cache.flags,
            name,
            name_len,
        };
        destroyed.nr_noted += 1;
    }

    /// Whether recording is on (for some cache or all).
    pub(crate) fn is_recording(&self) -> bool {
        self.recording.load(Ordering::Relaxed)
    }

    /// The cache filter (`None`: all).
    pub(crate) fn filter(&self) -> Option<u32> {
        match self.filter.load(Ordering::Relaxed) {
            NO_FILTER => None,
            id => Some(id),
        }
    }

    /// Allocate the rings (first start) and the stack table (first start
    /// with stacks), reset every ring, and note the configuration. The
    /// caller then sets the `HOT_KMEMTRACE` bits.
    pub(crate) fn prepare<P: Platform>(
        &self,
        source: &dyn PageSource,
        nr_cpus: usize,
        config: &KmemtraceConfig,
    ) -> Result<(), KmemtraceError> {
        if config.stack_depth > MAX_STACK_DEPTH {
            return Err(KmemtraceError::StackDepth(config.stack_depth));
        }
        let _control = self.control.lock::<P>();
        self.recording.store(false, Ordering::Relaxed);
        self.recording_all.store(false, Ordering::Relaxed);
        if self.rings.load(Ordering::Acquire).is_null() {
            let nr_subbufs = if config.nr_subbufs == 0 {
                DEFAULT_SUBBUFS
            } else {
                config.nr_subbufs
            };
            let rings = allocate_rings(source, nr_cpus, nr_subbufs)?;
            self.nr_subbufs.store(nr_subbufs, Ordering::Relaxed);
            self.rings_bytes
                .store(nr_cpus * CPU_SLOT_BYTES, Ordering::Relaxed);
            // Publishes the rings (and their size, which readers load
            // with Acquire after this): the event path tests only the
            // pointer.
            self.rings.store(rings.as_ptr(), Ordering::Release);
        }
        if config.stack_depth > 0 {
            let mut table = self.stacks.lock::<P>();
            if table.buckets.is_null() {
                let nr_pages = STACK_TABLE_BYTES.div_ceil(PAGE_SIZE);
                let base = source
                    .alloc_pages(nr_pages)
                    .map_err(|_| KmemtraceError::OutOfMemory {
                        bytes: nr_pages * PAGE_SIZE,
                    })?
                    .as_ptr();
                // SAFETY: fresh pages, ours; the three arrays lie inside
                // (STACK_TABLE_BYTES) and are suitably aligned (4, 8, 1).
                unsafe {
                    ptr::write_bytes(base, 0, STACK_TABLE_BYTES);
                    table.buckets = base.cast();
                    table.frames = base.add(STACK_BUCKETS * 4).cast();
                    table.depths = base
                        .add(STACK_BUCKETS * 4 + MAX_STACKS * MAX_STACK_DEPTH * 8)
                        .cast();
                }
            }
            // A new record starts with an empty table.
            // SAFETY: buckets has STACK_BUCKETS entries (above).
            unsafe { ptr::write_bytes(table.buckets, 0, STACK_BUCKETS) };
            table.nr_stacks = 0;
        }
        self.nr_stacks_dropped.store(0, Ordering::Relaxed);
        self.destroyed.lock::<P>().nr_noted = 0;
        self.marks.lock::<P>().nr_marks = 0;
        for ring in self.rings() {
            ring.nr_written.store(0, Ordering::Release);
            ring.next.store(ptr::null_mut(), Ordering::Relaxed);
            ring.limit.store(ptr::null_mut(), Ordering::Relaxed);
            ring.nr_overruns.store(0, Ordering::Relaxed);
        }
        self.stack_depth
            .store(config.stack_depth, Ordering::Relaxed);
        self.filter
            .store(config.cache_id.unwrap_or(NO_FILTER), Ordering::Relaxed);
        self.from_boot.store(config.from_boot, Ordering::Relaxed);
        self.start_ticks.store(P::now(), Ordering::Relaxed);
        self.recording_all
            .store(config.cache_id.is_none(), Ordering::Relaxed);
        self.recording.store(true, Ordering::Release);
        Ok(())
    }

    /// Note that recording stopped (the caller clears the cache bits).
    pub(crate) fn stop<P: Platform>(&self) {
        let _control = self.control.lock::<P>();
        self.recording_all.store(false, Ordering::Relaxed);
        self.recording.store(false, Ordering::Relaxed);
    }

    /// The number of rings (CPUs), 0 before the first start.
    fn nr_rings(&self, order: Ordering) -> usize {
        self.rings_bytes.load(order) / CPU_SLOT_BYTES
    }

    fn rings(&self) -> &[CpuRing] {
        let rings = self.rings.load(Ordering::Acquire);
        if rings.is_null() {
            return &[];
        }
        // SAFETY: set once, after its nr_rings initialised rings and
        // rings_bytes (the Release store that the Acquire load above
        // saw), never freed.
        unsafe { core::slice::from_raw_parts(rings, self.nr_rings(Ordering::Relaxed)) }
    }

    /// Record one event from the running CPU. Interrupts are disabled
    /// here (nesting is fine). The event path: no lock (unless stacks are
    /// recorded), no atomic read-modify-write, only this CPU's ring.
    /// Nothing before the first start (no rings yet). Returns `fields.ptr`
    /// (as [`Self::record_in`]).
    #[inline(always)]
    pub(crate) fn record<P: Platform>(&self, fields: EventFields) -> usize {
        // The rings are published once (Release), for every CPU of the
        // allocator: non-null, this CPU's is there.
        let rings = self.rings.load(Ordering::Acquire);
        if rings.is_null() {
            return fields.ptr;
        }
        // SAFETY: published, never freed.
        unsafe { self.record_in::<P>(rings, fields) }
    }

    /// [`Self::record`] for a cache whose `KMEMTRACE` bit the caller saw:
    /// no test of the rings. A start publishes the rings (Release) before
    /// it sets any cache's bit, and a cache created while recording gets
    /// its bit under the cache-list lock, which the start takes after
    /// publishing them (`allocator/mod.rs`); the bits are set by
    /// read-modify-writes (`KmemCache::set_hot`, AcqRel) and the rings
    /// never go: so a hot-flags word with the bit, loaded with Acquire
    /// (`KmemCache::hot`), comes after the rings.
    ///
    /// # Safety
    /// The caller loaded a cache's hot flags with Acquire and saw
    /// `KMEMTRACE` set, in a cache of this recorder.
    #[inline(always)]
    pub(crate) unsafe fn record_recorded<P: Platform>(&self, fields: EventFields) -> usize {
        let rings = self.rings.load(Ordering::Relaxed);
        debug_assert!(!rings.is_null(), "a recorded cache before the rings");
        // SAFETY: per our caller, the rings (above), never freed.
        unsafe { self.record_in::<P>(rings, fields) }
    }

    /// The event into `rings`, this CPU's ring, with interrupts off. The
    /// common event is the ring's `next < limit` test, eight word stores
    /// and the bump of `next` and `nr_written`; a new sub-buffer, a full
    /// ring and stacks take [`Self::record_cold`] (see [`CpuRing`]).
    /// Returns `fields.ptr`, whatever happened.
    ///
    /// # Safety
    /// `rings` is [`Self::rings`]' published value (non-null).
    #[inline(always)]
    unsafe fn record_in<P: Platform>(&self, rings: *mut CpuRing, fields: EventFields) -> usize {
        let irq = P::irq_save();
        // SAFETY: cpu_offset is cpu_id * CPU_SLOT_BYTES (the Platform
        // contract, cpu_id below the allocator's nr_cpus, for which the
        // rings were allocated) = cpu_id * size_of::<CpuRing>()
        // (asserted at compile time): this CPU's ring; the rings live
        // forever; only this CPU writes its ring, and nothing else on
        // this CPU runs (interrupts off).
        let ring = unsafe { &*rings.byte_add(P::cpu_offset()) };
        let slot = ring.next.load(Ordering::Relaxed);
        let ptr = if slot == ring.limit.load(Ordering::Relaxed) {
            // SAFETY: as above.
            unsafe {
                self.record_cold::<P>(
                    ring,
                    fields.head,
                    fields.ptr,
                    fields.bytes_req,
                    fields.bytes_alloc,
                )
            }
        } else {
            let index = ring.nr_written.load(Ordering::Relaxed);
            let mut site = [0usize; 1];
            P::caller_frames(&mut site);
            // SAFETY: `next` below `limit` is the slot of event `index`,
            // inside its sub-buffer, unpublished (read by nobody).
            unsafe {
                write_event::<P>(slot, ring, index, &fields, site[0], 0);
                ring.next.store(slot.add(1), Ordering::Relaxed);
            }
            ring.nr_written
                .store(index.wrapping_add(1), Ordering::Release);
            fields.ptr
        };
        P::irq_restore(irq);
        ptr
    }

    /// [`Self::record_in`] when `next` reached `limit`: the event's slot
    /// from the sub-buffer array, an overrun when the ring is full, the
    /// backtrace when stacks are on; else `next`/`limit` move to the slot's
    /// sub-buffer, so that the next events take the common path. Returns
    /// `ptr`, as [`Self::record_in`].
    ///
    /// # Safety
    /// `ring` is the running CPU's, with interrupts off.
    #[cold]
    #[inline(never)]
    /// (The fields one by one: in registers, not through the caller's
    /// stack.)
    unsafe fn record_cold<P: Platform>(
        &self,
        ring: &CpuRing,
        head: u64,
        ptr: usize,
        bytes_req: usize,
        bytes_alloc: usize,
    ) -> usize {
        let fields = EventFields {
            head,
            ptr,
            bytes_req,
            bytes_alloc,
        };
        let index = ring.nr_written.load(Ordering::Relaxed);
        if index >= ring.capacity {
            let overruns = ring.nr_overruns.load(Ordering::Relaxed);
            ring.nr_overruns
                .store(overruns.wrapping_add(1), Ordering::Relaxed);
            return opaque(ptr);
        }
        // SAFETY: index < capacity = nr_subbufs * SUBBUF_EVENTS: the
        // sub-buffer exists and the slot is inside it.
        let (subbuf, slot) = unsafe {
            let subbuf = *ring.subbufs.add(index / SUBBUF_EVENTS);
            (subbuf, subbuf.add(index % SUBBUF_EVENTS))
        };
        let depth = self.stack_depth.load(Ordering::Relaxed);
        let (call_site, stack_id) = if depth != 0 {
            self.caller_stack::<P>(depth)
        } else {
            let mut site = [0usize; 1];
            P::caller_frames(&mut site);
            // SAFETY: the slots after `slot` up to the sub-buffer's end
            // are those of the events after this one.
            unsafe {
                ring.next.store(slot.add(1), Ordering::Relaxed);
                ring.limit
                    .store(subbuf.add(SUBBUF_EVENTS), Ordering::Relaxed);
            }
            (site[0], 0)
        };
        // SAFETY: the slot of event `index`, unpublished.
        unsafe { write_event::<P>(slot, ring, index, &fields, call_site, stack_id) };
        ring.nr_written
            .store(index.wrapping_add(1), Ordering::Release);
        opaque(ptr)
    }

    /// The call site and stack id of an event with stacks on (`depth`
    /// frames): out of line, so the common event path does not set up
    /// the frame array.
    #[cold]
    #[inline(never)]
    fn caller_stack<P: Platform>(&self, depth: usize) -> (usize, u32) {
        let mut frames = [0usize; MAX_STACK_DEPTH];
        let nr = P::caller_frames(&mut frames[..depth.min(MAX_STACK_DEPTH)]);
        (frames[0], self.stack_id::<P>(&frames[..nr]))
    }

    /// The id of a backtrace (1-based), adding it if new; 0 if the table
    /// is full or there are no frames.
    #[cold]
    fn stack_id<P: Platform>(&self, frames: &[usize]) -> u32 {
        if frames.is_empty() {
            return 0;
        }
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for &frame in frames {
            hash = (hash ^ frame as u64).wrapping_mul(0x0000_0100_0000_01b3);
        }
        let mut table = self.stacks.lock::<P>();
        if table.buckets.is_null() {
            return 0;
        }
        let mut bucket = (hash as usize ^ (hash >> 32) as usize) % STACK_BUCKETS;
        loop {
            // SAFETY: bucket < STACK_BUCKETS; the arrays are sized for
            // MAX_STACKS stacks of MAX_STACK_DEPTH frames; we hold the lock.
            unsafe {
                let slot = *table.buckets.add(bucket);
                if slot == 0 {
                    if table.nr_stacks == MAX_STACKS {
                        drop(table);
                        let dropped = self.nr_stacks_dropped.load(Ordering::Relaxed);
                        self.nr_stacks_dropped.store(dropped + 1, Ordering::Relaxed);
                        return 0;
                    }
                    let index = table.nr_stacks;
                    for (depth, &frame) in frames.iter().enumerate() {
                        *table.frames.add(index * MAX_STACK_DEPTH + depth) = frame as u64;
                    }
                    *table.depths.add(index) = frames.len() as u8;
                    *table.buckets.add(bucket) = index as u32 + 1;
                    table.nr_stacks = index + 1;
                    return index as u32 + 1;
                }
                let index = slot as usize - 1;
                let depth = *table.depths.add(index) as usize;
                let stored =
                    core::slice::from_raw_parts(table.frames.add(index * MAX_STACK_DEPTH), depth);
                if depth == frames.len() && stored.iter().zip(frames).all(|(&a, &b)| a == b as u64)
                {
                    return slot;
                }
            }
            bucket = (bucket + 1) % STACK_BUCKETS;
        }
    }

    /// The recorder's state.
    pub(crate) fn status<P: Platform>(&self) -> KmemtraceStatus {
        let mut status = KmemtraceStatus {
            recording: self.is_recording(),
            cache_id: self.filter(),
            stack_depth: self.stack_depth.load(Ordering::Relaxed),
            nr_cpus: self.nr_rings(Ordering::Relaxed),
            nr_subbufs: self.nr_subbufs.load(Ordering::Relaxed),
            nr_stacks: self.stacks.lock::<P>().nr_stacks,
            nr_stacks_dropped: self.nr_stacks_dropped.load(Ordering::Relaxed),
            ..KmemtraceStatus::default()
        };
        for cpu in 0..status.nr_cpus {
            let ring = self.cpu_status(cpu);
            status.nr_events += ring.nr_events;
            status.nr_overruns += ring.nr_overruns;
        }
        status
    }

    /// One CPU's ring (all zero if out of range or never started).
    pub(crate) fn cpu_status(&self, cpu: usize) -> KmemtraceCpuStatus {
        self.rings()
            .get(cpu)
            .map(|ring| KmemtraceCpuStatus {
                nr_events: ring.nr_written.load(Ordering::Acquire) as u64,
                nr_overruns: ring.nr_overruns.load(Ordering::Relaxed),
                capacity: ring.capacity as u64,
            })
            .unwrap_or_default()
    }

    /// Write a dump: header, `caches` (id, object size, align, flags,
    /// name), the stacks, each CPU's events, the trailer.
    pub(crate) fn dump<P: Platform>(
        &self,
        info: &DumpInfo<'_>,
        caches: &mut CacheLister<'_>,
        sink: &mut dyn FnMut(&[u8]),
    ) -> DumpSummary {
        let _control = self.control.lock::<P>();
        let stack_depth = self.stack_depth.load(Ordering::Relaxed);
        let rings = self.rings();
        let mut flags = 0;
        if stack_depth > 0 {
            flags |= HEADER_FLAG_STACKS;
        }
        if self.from_boot.load(Ordering::Relaxed) {
            flags |= HEADER_FLAG_FROM_BOOT;
        }
        let header = KmemtraceHeader {
            nr_cpus: rings.len() as u32,
            build_id: info.build_id,
            flags,
            record_start_ns: (info.ticks_to_ns)(self.start_ticks.load(Ordering::Relaxed)),
            stack_depth: stack_depth as u32,
        };
        let mut out = DumpWriter::new(&header, sink);
        caches(&mut |cache| out.cache(&cache));
        {
            let destroyed = self.destroyed.lock::<P>();
            let nr_kept = destroyed.nr_noted.min(MAX_DESTROYED_CACHES);
            for entry in &destroyed.entries[..nr_kept] {
                out.cache(&CacheRecord {
                    id: entry.id,
                    obj_size: entry.obj_size,
                    align: entry.align,
                    flags: entry.flags,
                    name: core::str::from_utf8(&entry.name[..entry.name_len]).unwrap_or("?"),
                });
            }
        }
        {
            let marks = self.marks.lock::<P>();
            for mark in &marks.entries[..marks.nr_marks] {
                out.mark(&MarkRecord {
                    timestamp_ns: (info.ticks_to_ns)(mark.ticks),
                    cpu: mark.cpu,
                    text: core::str::from_utf8(&mark.text[..mark.text_len]).unwrap_or("?"),
                });
            }
        }
        if stack_depth > 0 {
            let table = self.stacks.lock::<P>();
            for index in 0..table.nr_stacks {
                // SAFETY: index < nr_stacks <= MAX_STACKS; under the lock.
                let frames = unsafe {
                    let depth = *table.depths.add(index) as usize;
                    core::slice::from_raw_parts(table.frames.add(index * MAX_STACK_DEPTH), depth)
                };
                out.stack(index as u32 + 1, frames);
            }
        }
        for (cpu, ring) in rings.iter().enumerate() {
            let nr_written = ring.nr_written.load(Ordering::Acquire);
            let overruns = ring.nr_overruns.load(Ordering::Relaxed);
            let nr_subbufs_used = nr_written.div_ceil(SUBBUF_EVENTS).max(1);
            for subbuf_index in 0..nr_subbufs_used {
                let first = subbuf_index * SUBBUF_EVENTS;
                let count = nr_written.saturating_sub(first).min(SUBBUF_EVENTS);
                let events: &[KmemtraceEvent] = if count == 0 {
                    &[]
                } else {
                    // SAFETY: sub-buffer subbuf_index exists (count > 0
                    // means first < nr_written <= capacity) and its first
                    // `count` events are published (Acquire above), never
                    // written again until the next start (which holds
                    // `control`).
                    unsafe { core::slice::from_raw_parts(*ring.subbufs.add(subbuf_index), count) }
                };
                // The CPU's overruns ride in its first record only, so the
                // CPU records sum to the total.
                let record_overruns = if subbuf_index == 0 { overruns } else { 0 };
                let converted = events.iter().map(|event| KmemtraceEvent {
                    timestamp_ns: (info.ticks_to_ns)(event.timestamp_ns),
                    ..*event
                });
                out.cpu(cpu as u32, record_overruns, converted);
            }
        }
        out.finish()
    }
}

/// An event's first word as the ring holds it: kind, type, CPU and cache
/// id (offsets 0, 1, 2, 4 of [`KmemtraceEvent`]), so that the event path
/// writes them with one store. Each part lands in its own bytes: the
/// CPU's part ([`CpuRing`]'s `cpu_word`) is or-ed in.
#[inline(always)]
pub(crate) const fn head_word(event: u8, type_id: u8, cpu: u16, cache_id: u32) -> u64 {
    let cpu = cpu.to_ne_bytes();
    let id = cache_id.to_ne_bytes();
    u64::from_ne_bytes([event, type_id, cpu[0], cpu[1], id[0], id[1], id[2], id[3]])
}

/// An event's last word (flags at offset 56, stack id at 60).
#[inline(always)]
const fn tail_word(flags: u32, stack_id: u32) -> u64 {
    let flags = flags.to_ne_bytes();
    let id = stack_id.to_ne_bytes();
    u64::from_ne_bytes([
        flags[0], flags[1], flags[2], flags[3], id[0], id[1], id[2], id[3],
    ])
}

const _: () = {
    assert!(core::mem::size_of::<KmemtraceEvent>() == 8 * 8);
    assert!(core::mem::offset_of!(KmemtraceEvent, cache_id) == 4);
    assert!(core::mem::offset_of!(KmemtraceEvent, timestamp_ns) == 8);
    assert!(core::mem::offset_of!(KmemtraceEvent, seq) == 16);
    assert!(core::mem::offset_of!(KmemtraceEvent, call_site) == 24);
    assert!(core::mem::offset_of!(KmemtraceEvent, ptr) == 32);
    assert!(core::mem::offset_of!(KmemtraceEvent, bytes_req) == 40);
    assert!(core::mem::offset_of!(KmemtraceEvent, bytes_alloc) == 48);
    assert!(core::mem::offset_of!(KmemtraceEvent, flags) == 56);
    assert!(core::mem::offset_of!(KmemtraceEvent, stack_id) == 60);
};

/// `value`, hidden from the optimiser ([`KmemtraceState::record_cold`]'s
/// result: were LLVM to see that it returns its `ptr`, a caller would keep
/// its own copy of the pointer across the call, in a saved register,
/// instead of taking the result and reaching the cold path by a tail call).
#[inline(always)]
fn opaque(value: usize) -> usize {
    core::hint::black_box(value)
}

/// Write event number `seq` of `ring` into `slot` as eight words (the
/// [`KmemtraceEvent`] layout, checked above), stamped now.
///
/// # Safety
/// `slot` is a 64-byte aligned slot of `ring` that nobody reads.
#[inline(always)]
unsafe fn write_event<P: Platform>(
    slot: *mut KmemtraceEvent,
    ring: &CpuRing,
    seq: usize,
    fields: &EventFields,
    call_site: usize,
    stack_id: u32,
) {
    let words = slot.cast::<u64>();
    let head = fields.head | ring.cpu_word;
    // SAFETY: per our caller: eight aligned words, ours.
    unsafe {
        words.write(head);
        words.add(1).write(P::now());
        words.add(2).write(seq as u64);
        words.add(3).write(call_site as u64);
        words.add(4).write(fields.ptr as u64);
        words.add(5).write(fields.bytes_req as u64);
        words.add(6).write(fields.bytes_alloc as u64);
        words.add(7).write(tail_word(0, stack_id));
    }
}

/// What an event records.
#[derive(Debug, Clone, Copy)]
pub(crate) struct EventFields {
    /// Kind, type and cache id as the event's first word
    /// ([`EventFields::head`]; the CPU is or-ed in when written).
    pub(crate) head: u64,
    pub(crate) ptr: usize,
    pub(crate) bytes_req: usize,
    pub(crate) bytes_alloc: usize,
}

impl EventFields {
    /// The first word of an event of `kind` and `type_id` for cache
    /// `cache_id` (0: none), without the CPU.
    #[inline(always)]
    pub(crate) const fn head(kind: EventKind, type_id: EventType, cache_id: u32) -> u64 {
        head_word(kind as u8, type_id as u8, 0, cache_id)
    }
}

/// Calls its argument once per cache (the allocator's cache walk).
pub(crate) type CacheLister<'a> = dyn FnMut(&mut dyn FnMut(CacheRecord<'_>)) + 'a;

/// A cache as a dump's CACHE record describes it.
pub(crate) type CacheRecord<'a> = magpie_kmemtrace_format::CacheRecord<&'a str>;
