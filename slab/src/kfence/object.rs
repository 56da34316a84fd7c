//! The pool's geometry and what it knows of each object: placement,
//! state, stacks, metadata, figures and errors. Names no other KFENCE
//! file, so the reports and the pool state can both build on it.

use crate::alloc_tag::AllocTagRef;
use crate::platform::Platform;
use crate::reports::error::ReportName;

/// Objects in the pool (Linux `CONFIG_KFENCE_NUM_OBJECTS`, 255 by default;
/// smaller here).
pub const KFENCE_NUM_OBJECTS: usize = 63;
/// Pages of the pool: two per object and two leading guards.
pub const KFENCE_POOL_PAGES: usize = (KFENCE_NUM_OBJECTS + 1) * 2;
/// Frames kept of an allocation's and a free's stack.
pub const KFENCE_STACK_DEPTH: usize = 16;
/// The default sample interval in ms (Linux's `CONFIG_KFENCE_SAMPLE_INTERVAL`).
pub const KFENCE_DEFAULT_INTERVAL_MS: u64 = 100;

/// The canary byte at `addr` (Linux `KFENCE_CANARY_PATTERN_U8`).
#[inline]
pub(crate) const fn canary(addr: usize) -> u8 {
    0xaa ^ (addr & 7) as u8
}

/// Where a sampled object sits in its page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KfencePlace {
    /// At the page's start: an underflow runs into the guard page on the left.
    Left,
    /// At the page's end: an overflow runs into the guard page on the right.
    Right,
}

/// The state of a pool object (Linux `enum kfence_object_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KfenceState {
    /// Never allocated.
    Unused,
    /// Handed out.
    Allocated,
    /// Freed (its page is unmapped).
    Freed,
}

/// A stack kept by the pool: the allocation's or the free's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KfenceStack {
    /// Return addresses, innermost first.
    pub frames: [usize; KFENCE_STACK_DEPTH],
    /// How many of `frames` are valid.
    pub len: usize,
    /// The CPU it ran on.
    pub cpu: usize,
    /// When ([`Platform::now`] ticks).
    pub time: u64,
}

impl KfenceStack {
    pub(crate) const EMPTY: KfenceStack = KfenceStack {
        frames: [0; KFENCE_STACK_DEPTH],
        len: 0,
        cpu: 0,
        time: 0,
    };

    /// The caller's stack now.
    pub(crate) fn capture<P: Platform>() -> KfenceStack {
        let mut stack = KfenceStack::EMPTY;
        stack.len = P::backtrace(&mut stack.frames).min(KFENCE_STACK_DEPTH);
        stack.cpu = P::cpu_id();
        stack.time = P::now();
        stack
    }

    /// A stack from frames the caller has (a fault's interrupted stack).
    pub fn from_frames(frames: &[usize], cpu: usize, time: u64) -> KfenceStack {
        let mut stack = KfenceStack::EMPTY;
        let len = frames.len().min(KFENCE_STACK_DEPTH);
        stack.frames[..len].copy_from_slice(&frames[..len]);
        stack.len = len;
        stack.cpu = cpu;
        stack.time = time;
        stack
    }

    /// The valid frames.
    pub fn frames(&self) -> &[usize] {
        &self.frames[..self.len]
    }
}

/// A pool object's metadata (Linux `struct kfence_metadata`), as reports
/// show it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KfenceObject {
    /// Its index in the pool (`kfence-#N`).
    pub index: usize,
    /// Allocated or freed (or never used).
    pub state: KfenceState,
    /// The object's address.
    pub addr: usize,
    /// Its size in bytes (what the caller asked for: kmalloc's size, or
    /// the cache's object size).
    pub size: usize,
    /// The cache it was allocated from.
    pub cache: ReportName,
    /// Where it was allocated.
    pub alloc: KfenceStack,
    /// Where it was freed (`state` is `Freed`).
    pub free: KfenceStack,
    /// The owning cache (for `KmemCache::free`'s check).
    pub(crate) cache_ptr: usize,
    /// The allocation tag's charge token (profiling), uncharged at the free.
    pub(crate) tag: Option<AllocTagRef>,
}

impl KfenceObject {
    pub(crate) const UNUSED: KfenceObject = KfenceObject {
        index: 0,
        state: KfenceState::Unused,
        addr: 0,
        size: 0,
        cache: ReportName::EMPTY,
        alloc: KfenceStack::EMPTY,
        free: KfenceStack::EMPTY,
        cache_ptr: 0,
        tag: None,
    };
}

/// Pool figures for `kmem kfence`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct KfenceStats {
    /// A pool exists ([`Kfence::init`](crate::kfence::Kfence::init) succeeded).
    pub enabled: bool,
    /// The sample interval in ms (0: sampling off).
    pub interval_ms: u64,
    /// Pages in the pool.
    pub pool_pages: usize,
    /// Objects in the pool.
    pub nr_objects: usize,
    /// Objects handed out now.
    pub nr_in_use: usize,
    /// Sampled allocations ever.
    pub nr_allocs: u64,
    /// Frees of sampled objects ever.
    pub nr_frees: u64,
    /// Samples not served (the pool was full or the cache not eligible).
    pub nr_skipped: u64,
    /// Bugs reported.
    pub nr_bugs: u64,
}

/// Why [`Kfence::init`](crate::kfence::Kfence::init) failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KfenceError {
    /// The platform has no pool ([`PlatformHooks::kfence_pool`](crate::PlatformHooks::kfence_pool) said `None`) or
    /// cannot unmap pages.
    Unsupported,
    /// The allocator is not initialised, or the metadata pages could not
    /// be had.
    NoMemory,
    /// A pool exists already.
    AlreadyInitialized,
}

impl core::fmt::Display for KfenceError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            KfenceError::Unsupported => "the platform provides no KFENCE pool",
            KfenceError::NoMemory => "no memory for the KFENCE metadata",
            KfenceError::AlreadyInitialized => "KFENCE is already initialised",
        })
    }
}
