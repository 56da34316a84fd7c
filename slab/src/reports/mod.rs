//! The allocator's reports as library functions: each writes plain text
//! to any [`core::fmt::Write`], allocates nothing, and is what the Magpie
//! shell prints (so an adopting kernel gets the same tools with one call).
//!
//! | Function | Shape (source of the format) |
//! |---|---|
//! | [`kmemstat`] | Akaros `kmemstat` (`kern/drivers/dev/mem.c`): arenas with the slab caches importing from them indented beneath; amounts in bytes |
//! | [`slabinfo`] | Linux `/proc/slabinfo` version 2.1 (`mm/slab_common.c` `cache_show`), to the column |
//! | `allocinfo` (feature `allocinfo`) | Linux `/proc/allocinfo` (`lib/alloc_tag.c`): live bytes and calls per code tag, with Linux's filters |
//! | `trace_print`, `trace_print_all` (feature `trace-table`) | Akaros `kmem_trace_print`: one block per outstanding object with its backtrace, then a by-site summary |
//! | `write_kfence_stats`, `write_kfence_object` (feature `kfence`) | Linux `/sys/kernel/debug/kfence/stats` and `objects` (`mm/kfence/report.c` `kfence_print_object`) |
//! | [`whatis`] | illumos mdb `::whatis`: cache, object and offset of an address, with the last transactions |
//! | [`slabtop`] | Linux `slabtop(1)`'s columns, plus the magazine layer's hits, misses, depot contention and magazine resizes |
//! | `write_time_stats` (features `allocinfo` or `time-stats`: with `magpie-codetag`) | the codetag slides' latency statistics of one `time_stats!` point, times in [`Nanoseconds`] |
//!
//! What the library cannot know comes in through [`ReportFormat`]: how a
//! return address is symbolized and how [`Platform::now`] ticks convert
//! to nanoseconds. Times for a person are written by [`Nanoseconds`]
//! (ns, µs, ms or s, always with the unit).
//!
//! # Errors
//!
//! Every function returns the error of its sink (`fmt::Error`) as is and
//! stops writing at the first one; `allocinfo` also refuses a row table
//! too small for the tags. None of them panics or allocates.
//!
//! # Locks
//!
//! [`kmemstat`], [`slabinfo`] and [`slabtop`] write while the cache list
//! is locked (as `/proc/slabinfo` does under `slab_mutex`): a sink that
//! allocates from the allocator itself must not create or destroy a
//! cache. `trace_print` writes with no allocator lock held (records are
//! copied out a chunk at a time first), so its sink may allocate from the
//! traced cache.
//!
//! A frame-pointer walker a [`PlatformHooks::backtrace`](crate::PlatformHooks::backtrace) may use is in
//! [`backtrace`](mod@backtrace).
//!
//! [`Platform::now`]: crate::Platform::now
//! [`PlatformHooks::backtrace`]: crate::PlatformHooks::backtrace
//! [`ReportFormat`]: crate::reports::error::ReportFormat

#[cfg(feature = "allocinfo")]
mod allocinfo;
pub mod backtrace;
pub(crate) mod error;
#[cfg(feature = "leak-scan")]
mod findleaks;
#[cfg(feature = "kfence")]
mod kfence;
mod kmemstat;
mod slabinfo;
mod slabtop;
mod time;
#[cfg(any(feature = "allocinfo", feature = "time-stats"))]
mod timestats;
#[cfg(feature = "trace-table")]
mod trace_print;
mod whatis;

#[cfg(feature = "allocinfo")]
pub use self::allocinfo::{
    ALLOCINFO_VERSION, ALLOCINFO_VERSION_ACCURACY, AllocinfoError, AllocinfoFilter,
    AllocinfoOptions, AllocinfoRow, AllocinfoSort, allocinfo, write_allocinfo_header,
    write_allocinfo_row,
};
pub use self::error::{
    ERROR_RING_SIZE, ErrorKind, ErrorReport, RawFormat, ReportFormat, ReportName, write_errors,
};
#[cfg(feature = "leak-scan")]
pub use self::findleaks::{write_findleaks_group, write_findleaks_header, write_findleaks_summary};
#[cfg(feature = "kfence")]
pub use self::kfence::{KfenceObjectView, write_kfence_object, write_kfence_stats};
pub use self::kmemstat::kmemstat;
// The writers a reader of a memory image prints the same tables with
// (magpie-kmem `core`, and the shell's own loops): feature `descriptor`.
#[cfg(feature = "descriptor")]
pub use self::kmemstat::{KmemstatRow, write_kmemstat_caches, write_kmemstat_header};
pub use self::slabinfo::slabinfo;
#[cfg(feature = "descriptor")]
pub use self::slabinfo::{write_slabinfo_header, write_slabinfo_line};
pub use self::slabtop::{
    EMPTY_SLABTOP_ROW, SlabtopRow, SlabtopSample, SlabtopSort, slabtop, write_slabtop_hits_note,
};
#[cfg(feature = "descriptor")]
pub use self::slabtop::{SlabtopTotals, write_slabtop};
pub use self::time::Nanoseconds;
#[cfg(any(feature = "allocinfo", feature = "time-stats"))]
pub use self::timestats::write_time_stats;
#[cfg(feature = "trace-table")]
pub use self::trace_print::{
    EMPTY_TRACE_RECORD, TRACE_PRINT_CHUNK, TRACE_PRINT_MAX_SITES, TracePrintBuffer, TraceSites,
    trace_print, trace_print_all, write_trace_footer, write_trace_header, write_trace_quiet,
    write_trace_record,
};
pub use self::whatis::whatis;
