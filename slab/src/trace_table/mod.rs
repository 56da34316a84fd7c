//! Per-cache allocation tracing (Akaros, "slab: Add tracing infrastructure
//! for allocs and frees", 2018).
//!
//! While a cache is traced, every allocation *by a caller* (above the
//! magazine layer) gets a [`TraceRecord`] — address, size, CPU, timestamp,
//! context string and backtrace — in the cache's trace table, keyed by
//! address; every free removes it. What remains are the objects still
//! outstanding. Objects resting in magazines or the depot are not callers'
//! objects and are never recorded.
//!
//! - `start` ([`CacheTrace::start`](crate::CacheTrace::start)) on a `NOTRACE` cache is refused.
//! - After `stop`, frees still remove records: the cache is "ever
//!   traced" and its free path keeps looking records up. A cache that was
//!   never traced pays one flag test per alloc and per free.
//! - Records come from the `NOTRACE` `kmem_trace` bootstrap cache; a record
//!   that cannot be allocated is counted in `nr_dropped`.
//! - Records are kept on an age list too, so they are visited oldest first.

use core::ptr::{self, NonNull};
use core::sync::atomic::{AtomicU64, Ordering};

use crate::layout::hash::{AddrHash, HashNode, rescale_locked};
use crate::platform::{Platform, PlatformHooks};
use crate::slab::{Metadata, SlabLayer, SlabOwner};
use crate::sync::{IrqGuard, IrqMutex, IrqMutexGuard};

mod cache;

pub use cache::CacheTrace;

/// Return addresses kept per record.
pub const TRACE_MAX_FRAMES: usize = 16;

/// One outstanding traced allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceRecord {
    /// Address of the object.
    pub addr: usize,
    /// Object size in bytes (the cache's object size).
    pub size: usize,
    /// CPU that allocated it.
    pub cpu: u32,
    /// [`Platform::now`] at allocation.
    pub timestamp: u64,
    /// [`PlatformHooks::context`] at allocation; `context_len` bytes are valid.
    pub context: [u8; 32],
    /// Valid bytes of `context`.
    pub context_len: u8,
    /// Valid entries of `frames`.
    pub nr_frames: u8,
    /// Return addresses from [`PlatformHooks::backtrace`], innermost first.
    pub frames: [usize; TRACE_MAX_FRAMES],
}

impl TraceRecord {
    /// The context string (invalid UTF-8 is cut at the first bad byte).
    pub fn ctx(&self) -> &str {
        let bytes = &self.context[..(self.context_len as usize).min(self.context.len())];
        match core::str::from_utf8(bytes) {
            Ok(text) => text,
            Err(error) => {
                // The prefix up to valid_up_to is valid UTF-8.
                core::str::from_utf8(&bytes[..error.valid_up_to()]).unwrap_or("")
            }
        }
    }

    /// The captured return addresses, innermost first.
    pub fn frames(&self) -> &[usize] {
        &self.frames[..(self.nr_frames as usize).min(TRACE_MAX_FRAMES)]
    }
}

/// Tracing state of one cache.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TraceStats {
    /// Records outstanding.
    pub nr_records: usize,
    /// Records that could not be allocated (objects allocated while
    /// tracing but not recorded) since the cache was created.
    pub nr_dropped: u64,
    /// Whether new allocations are being recorded.
    pub tracing: bool,
}

/// A record as stored: the public record plus links.
#[repr(C)]
pub(crate) struct TraceNode {
    hash_next: *mut TraceNode,
    pub(crate) older: *mut TraceNode,
    newer: *mut TraceNode,
    pub(crate) record: TraceRecord,
}

impl HashNode for TraceNode {
    fn key(&self) -> usize {
        self.record.addr
    }
    fn hash_next(&mut self) -> &mut *mut Self {
        &mut self.hash_next
    }
}

/// The state behind a cache's trace lock: the records by address (the
/// hash) and by age (a doubly linked list through the nodes).
pub(crate) struct TraceTableInner {
    pub(crate) hash: AddrHash<TraceNode>,
    oldest: *mut TraceNode,
    pub(crate) newest: *mut TraceNode,
}

// SAFETY: the nodes are owned by the table and only touched under its lock.
unsafe impl Send for TraceTableInner {}

impl TraceTableInner {
    const fn new() -> Self {
        TraceTableInner {
            hash: AddrHash::new(),
            oldest: ptr::null_mut(),
            newest: ptr::null_mut(),
        }
    }

    /// # Safety
    /// `node` is valid and in no table.
    unsafe fn insert(&mut self, node: *mut TraceNode) {
        // SAFETY: per the caller; `newest` is a live node of ours or null.
        unsafe {
            (*node).older = self.newest;
            (*node).newer = ptr::null_mut();
            if self.newest.is_null() {
                self.oldest = node;
            } else {
                (*self.newest).newer = node;
            }
            self.newest = node;
            self.hash.insert(node);
        }
    }

    fn remove(&mut self, addr: usize) -> *mut TraceNode {
        let node = self.hash.remove(addr);
        if !node.is_null() {
            // SAFETY: node was in our table, so it and its neighbours are live.
            unsafe {
                let (older, newer) = ((*node).older, (*node).newer);
                if older.is_null() {
                    self.oldest = newer
                } else {
                    (*older).newer = newer
                }
                if newer.is_null() {
                    self.newest = older
                } else {
                    (*newer).older = older
                }
            }
        }
        node
    }

    /// Detach all records, linked through `newer`, oldest first.
    fn take_all(&mut self) -> *mut TraceNode {
        self.hash.drain(|_| {});
        let oldest = self.oldest;
        self.oldest = ptr::null_mut();
        self.newest = ptr::null_mut();
        oldest
    }
}

/// What a trace table needs from the cache it serves: what its slab
/// layer needs ([`SlabOwner`]: the platform for a record's CPU id, clock,
/// context and backtrace; its records, [`Metadata::TraceRecord`] objects;
/// the pages of its hash, from the metadata source), and the traced
/// objects' size. The cache implements it (`trace_table/cache.rs`).
/// Called with no trace-table lock held.
pub(crate) trait TraceOwner: SlabOwner {
    /// Size of the traced objects.
    fn obj_size(&self) -> usize;
}

/// A cache's trace table: its records behind a spin lock, and every
/// operation on them. Record nodes come from (and go back to) the
/// `kmem_trace` bootstrap cache of `cache`'s allocator; the hash's
/// page-backed table from its primary source.
pub(crate) struct TraceTable<P: Platform> {
    pub(crate) inner: IrqMutex<P, TraceTableInner>,
    /// Records that could not be allocated.
    pub(crate) nr_dropped: AtomicU64,
}

impl<P: Platform> TraceTable<P> {
    pub(crate) fn new() -> Self {
        TraceTable {
            inner: IrqMutex::new(TraceTableInner::new()),
            nr_dropped: AtomicU64::new(0),
        }
    }

    /// Lock the records.
    #[inline]
    pub(crate) fn lock(&self) -> IrqMutexGuard<'_, P, TraceTableInner> {
        self.inner.lock()
    }

    /// Number of records and of dropped records.
    pub(crate) fn counts(&self) -> (usize, u64) {
        (
            self.lock().hash.nr_items(),
            self.nr_dropped.load(Ordering::Relaxed),
        )
    }

    /// Drop every record; returns how many there were.
    pub(crate) fn drop_all<O: TraceOwner>(&self, owner: &O) -> usize {
        let mut node = self.lock().take_all();
        let mut nr = 0;
        while !node.is_null() {
            // SAFETY: detached nodes are ours; each came from kmem_trace's
            // slab layer and is freed exactly once here.
            unsafe {
                let next = (*node).newer;
                SlabLayer::free_objects(owner.metadata(Metadata::TraceRecord), &[node.cast()]);
                node = next;
            }
            nr += 1;
        }
        nr
    }

    /// Visit every record, oldest first, under the lock.
    pub(crate) fn for_each(&self, mut f: impl FnMut(&TraceRecord)) {
        let table = self.lock();
        let mut node = table.oldest;
        while !node.is_null() {
            // SAFETY: nodes in the table are live while we hold its lock.
            unsafe {
                f(&(*node).record);
                node = (*node).newer;
            }
        }
    }

    /// Record an allocation of `obj` by a caller of `cache` (the
    /// post-alloc hook of a `TRACED` cache, `cache/hooks.rs`).
    #[cold]
    #[expect(
        clippy::cast_ptr_alignment,
        reason = "kmem_trace objects are aligned for TraceNode (boot cache geometry)"
    )]
    pub(crate) fn record_alloc<O: TraceOwner>(&self, owner: &O, obj: NonNull<u8>) {
        let Ok(node) = SlabLayer::alloc(owner.metadata(Metadata::TraceRecord)) else {
            self.nr_dropped.fetch_add(1, Ordering::Relaxed);
            return;
        };
        let node = node.as_ptr().cast::<TraceNode>();
        let mut record = TraceRecord {
            addr: obj.as_ptr() as usize,
            size: owner.obj_size(),
            cpu: 0,
            timestamp: 0,
            context: [0; 32],
            context_len: 0,
            nr_frames: 0,
            frames: [0; TRACE_MAX_FRAMES],
        };
        {
            // The platform's context and backtrace with interrupts off:
            // a platform that keeps its context string behind a lock
            // (the Magpie kernel did, taken with interrupts on) cannot
            // then be interrupted holding it by a handler whose traced
            // allocation asks for it too; and the CPU is the one the
            // context describes.
            let _irq = IrqGuard::<O::Platform>::new();
            record.cpu = O::Platform::cpu_id() as u32;
            record.timestamp = O::Platform::now();
            record.context_len = O::Platform::context(&mut record.context).min(31) as u8;
            record.nr_frames =
                O::Platform::backtrace(&mut record.frames).min(TRACE_MAX_FRAMES) as u8;
        }
        // SAFETY: a fresh kmem_trace object, sized and aligned for a TraceNode.
        unsafe {
            node.write(TraceNode {
                hash_next: ptr::null_mut(),
                older: ptr::null_mut(),
                newer: ptr::null_mut(),
                record,
            })
        };
        let stale = {
            let mut table = self.lock();
            // A record for the same address can only be left over if a free
            // raced with trace_reset; replace it.
            let stale = table.remove(record.addr);
            // SAFETY: node is valid and in no table.
            unsafe { table.insert(node) };
            stale
        };
        if !stale.is_null() {
            // SAFETY: removed from the table; a kmem_trace object.
            unsafe {
                SlabLayer::free_objects(owner.metadata(Metadata::TraceRecord), &[stale.cast()])
            };
        }
        self.maybe_grow(owner);
    }

    /// Remove the record of a freed object of `cache`, if there is one
    /// (the free hook of an `EVER_TRACED` cache, `cache/free.rs`).
    #[cold]
    pub(crate) fn record_free<O: TraceOwner>(&self, owner: &O, addr: usize) {
        let node = self.lock().remove(addr);
        if !node.is_null() {
            // SAFETY: removed from the table; a kmem_trace object.
            unsafe {
                SlabLayer::free_objects(owner.metadata(Metadata::TraceRecord), &[node.cast()])
            };
        }
    }

    /// Grow the hash if its load is too high. Runs with no lock held.
    pub(crate) fn maybe_grow<O: TraceOwner>(&self, owner: &O) {
        rescale_locked(
            &self.inner,
            |inner| &mut inner.hash,
            AddrHash::wants_grow,
            owner.metadata_source(),
        );
    }

    /// Shrink the hash if its load fell low, as the bufctl hash does
    /// (reap, destroy): with no records, back to the inline buckets.
    pub(crate) fn shrink<O: TraceOwner>(&self, owner: &O) {
        rescale_locked(
            &self.inner,
            |inner| &mut inner.hash,
            AddrHash::wants_shrink,
            owner.metadata_source(),
        );
    }
}
