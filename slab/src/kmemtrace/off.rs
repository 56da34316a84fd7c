//! kmemtrace compiled out (feature `kmemtrace` off): the calls the cache
//! and kmalloc paths make, as empty inline stubs (as `kfence/off.rs`);
//! the kfree and page-granular events are not stubbed, their call sites
//! are compiled out with the feature.
//! Nothing starts a record, so the `KMEMTRACE` hot flag is never set and
//! the hits never reach them; `recording_all` is a constant `false`.

use core::sync::atomic::Ordering;

pub(crate) use magpie_kmemtrace_format::{EventKind, EventType};

use crate::allocator::Kmem;
use crate::cache::KmemCache;
use crate::platform::Platform;

/// A flag that is never set.
pub(crate) struct NeverSet;

impl NeverSet {
    #[inline(always)]
    pub(crate) fn load(&self, _order: Ordering) -> bool {
        false
    }
}

/// The recorder's state: nothing.
pub(crate) struct KmemtraceState {
    pub(crate) recording_all: NeverSet,
}

impl KmemtraceState {
    pub(crate) const fn new() -> Self {
        KmemtraceState {
            recording_all: NeverSet,
        }
    }

    /// Records nothing; returns `fields.ptr`.
    ///
    /// # Safety
    /// None here (the recorder's `record_recorded` has a contract).
    #[expect(
        clippy::extra_unused_type_parameters,
        reason = "the signature of the recorder's `record_recorded`"
    )]
    #[inline(always)]
    pub(crate) unsafe fn record_recorded<P: Platform>(&self, fields: EventFields) -> usize {
        fields.ptr
    }
}

/// What an event would record.
#[expect(
    dead_code,
    reason = "written by the callers, read by nothing while kmemtrace is off"
)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct EventFields {
    pub(crate) head: u64,
    pub(crate) ptr: usize,
    pub(crate) bytes_req: usize,
    pub(crate) bytes_alloc: usize,
}

impl EventFields {
    #[inline(always)]
    pub(crate) const fn head(_kind: EventKind, _type_id: EventType, _cache_id: u32) -> u64 {
        0
    }
}

#[inline(always)]
pub(crate) const fn head_word(_event: u8, _type_id: u8, _cpu: u16, _cache_id: u32) -> u64 {
    0
}

impl<P: Platform> Kmem<P> {
    #[inline(always)]
    pub(crate) fn kmemtrace_cache_destroyed(&self, _cache: &KmemCache<P>) {}
}
