//! What a caller of kmemtrace names: the ring geometry's constants, the
//! configuration of a recording, its errors and status, and the kernel
//! facts a dump carries. Names nothing else of the recorder.

use magpie_kmemtrace_format::EVENT_SIZE;

use crate::platform::PAGE_SIZE;

/// Events per sub-buffer.
pub const SUBBUF_EVENTS: usize = 1024;
/// Pages per sub-buffer (64 KiB).
pub const SUBBUF_PAGES: usize = SUBBUF_EVENTS * EVENT_SIZE / PAGE_SIZE;
/// Sub-buffers per CPU unless configured (16 MiB, 262,144 events per CPU).
pub const DEFAULT_SUBBUFS: usize = 256;
/// Most frames a recorded stack keeps.
pub const MAX_STACK_DEPTH: usize = 16;
/// Distinct stacks the dedup table holds; later new stacks get id 0 and
/// are counted in [`KmemtraceStatus::nr_stacks_dropped`].
pub const MAX_STACKS: usize = 4096;

const _: () = assert!(SUBBUF_EVENTS * EVENT_SIZE == SUBBUF_PAGES * PAGE_SIZE);

/// How to record ([`Kmemtrace::start`](crate::kmemtrace::Kmemtrace::start)).
/// The default: rings sized to the page source, no stacks, every cache,
/// not from boot.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KmemtraceConfig {
    /// Sub-buffers per CPU (used by the first start only: the rings keep
    /// their size afterwards). 0 (the default) sizes them to the page
    /// source: [`DEFAULT_SUBBUFS`] or fewer
    /// ([`Kmemtrace::default_subbufs`](crate::kmemtrace::Kmemtrace::default_subbufs)).
    pub nr_subbufs: usize,
    /// Frames per event's stack, 0 for none; at most [`MAX_STACK_DEPTH`].
    pub stack_depth: usize,
    /// Record only this cache (by id, see
    /// [`KmemCache::id`](crate::KmemCache::id)); `None`: every cache,
    /// page-granular kmalloc and bad frees.
    pub cache_id: Option<u32>,
    /// Recording starts at boot: the dump header says every live object
    /// was allocated inside the record.
    pub from_boot: bool,
}

/// Why recording could not start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KmemtraceError {
    /// The allocator is not initialised.
    NotInitialized,
    /// The page source could not supply the buffers (nothing was kept).
    OutOfMemory {
        /// Bytes that were asked for in all.
        bytes: usize,
    },
    /// Stack depth above [`MAX_STACK_DEPTH`].
    StackDepth(usize),
    /// `nr_subbufs` too large to address.
    TooManySubbufs(usize),
}

impl core::fmt::Display for KmemtraceError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            KmemtraceError::NotInitialized => write!(f, "allocator not initialised"),
            KmemtraceError::OutOfMemory { bytes } => {
                write!(f, "no memory for kmemtrace buffers ({bytes} bytes)")
            }
            KmemtraceError::StackDepth(depth) => {
                write!(f, "stack depth {depth} above the maximum {MAX_STACK_DEPTH}")
            }
            KmemtraceError::TooManySubbufs(nr) => write!(f, "{nr} sub-buffers is too many"),
        }
    }
}

/// One CPU's ring as `record status` shows it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KmemtraceCpuStatus {
    /// Events in the ring.
    pub nr_events: u64,
    /// Events dropped for a full ring.
    pub nr_overruns: u64,
    /// Events the ring holds when full.
    pub capacity: u64,
}

/// The recorder's state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KmemtraceStatus {
    /// Recording now.
    pub recording: bool,
    /// Recording only this cache id (`None`: everything).
    pub cache_id: Option<u32>,
    /// Frames per stack (0: no stacks).
    pub stack_depth: usize,
    /// Rings (CPUs); 0 before the first start.
    pub nr_cpus: usize,
    /// Sub-buffers per CPU.
    pub nr_subbufs: usize,
    /// Events in all rings.
    pub nr_events: u64,
    /// Overruns on all CPUs.
    pub nr_overruns: u64,
    /// Distinct stacks recorded.
    pub nr_stacks: usize,
    /// Events whose new stack did not fit in the table (stack id 0).
    pub nr_stacks_dropped: u64,
}

/// Kernel facts a dump's header carries and how to read the clock.
pub struct DumpInfo<'a> {
    /// GNU build id of the kernel ELF (SHA-1), zeros if unknown.
    pub build_id: [u8; 20],
    /// Converts a [`Platform::now`](crate::Platform::now) reading to nanoseconds since boot.
    pub ticks_to_ns: &'a dyn Fn(u64) -> u64,
}
