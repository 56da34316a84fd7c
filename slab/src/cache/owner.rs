//! What a cache needs from the allocator that owns it, handed down as a
//! trait ([`CacheOwner`]), as the slab layer is handed
//! [`SlabOwner`](crate::slab::SlabOwner): the cache layer names no type
//! above it. `Kmem` implements it (`allocator/cache_owner.rs`); the
//! cache holds it as a trait object and calls it only off the hits (the
//! misses, the feature hooks, creation and destruction).

use core::ptr::NonNull;

use super::KmemCache;
#[cfg(feature = "kfence")]
use crate::alloc_tag::AllocTagRef;
use crate::error::{AllocError, FreeError};
use crate::kmemtrace::KmemtraceState;
use crate::platform::{PageSource, Platform};
use crate::reports::error::ErrorReport;

/// One of the owner's own caches a cache takes memory from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OwnerCache {
    /// `kmem_cache`: cache structs and their per-CPU arrays.
    Cache,
    /// `kmem_slab`: off-slab slab headers.
    Slab,
    /// `kmem_bufctl`: bufctls.
    Bufctl,
    /// `kmem_trace`: trace-table records.
    #[cfg(feature = "trace-table")]
    Trace,
    /// `kmem_magazine_<rounds>` of a magazine type (an index into
    /// [`MAGAZINE_ROUNDS`](crate::MAGAZINE_ROUNDS)).
    Magazine(usize),
    /// `kmem_tags_<bytes>`: allocation-tag side arrays, the smallest
    /// that holds this many bytes.
    #[cfg(feature = "alloc-profiling")]
    TagArray(usize),
}

/// The allocator a cache belongs to, as the cache sees it.
///
/// # Safety
/// The caches [`CacheOwner::cache`] returns live as long as the owner,
/// which lives as long as every cache it made (a `'static`).
pub(crate) unsafe trait CacheOwner<P: Platform>: Sync + KfenceOwner<P> {
    /// Send an error report (the allocator's ring and hook).
    fn report_error(&self, report: ErrorReport);
    /// Report a free `cache` (its name) refuses.
    fn report_bad_free(&self, cache: &str, error: FreeError);
    /// `source` could not give `nr_pages` pages: reap caches until it
    /// can, and take them (`None`: still no room, or no reap now:
    /// another is running).
    fn reap_for_pressure(
        &self,
        source: &'static dyn PageSource,
        nr_pages: usize,
    ) -> Option<NonNull<u8>>;
    /// One of the owner's bootstrap caches.
    fn cache(&self, which: OwnerCache) -> &KmemCache<P>;
    /// The owner's primary page source (slab metadata comes from it).
    fn primary_source(&self) -> &'static dyn PageSource;
    /// A side array could not be allocated: count it.
    #[cfg(feature = "alloc-profiling")]
    fn count_tag_array_miss(&self);
    /// Take `cache` off the owner's cache list (`destroy`).
    fn unlink_cache(&self, cache: &KmemCache<P>);
    /// The size class an unborn class's `stub` stands for, for a first
    /// allocation of `bytes_req` bytes: created now (the cache then
    /// allocates from it, `cache/alloc.rs`).
    ///
    /// # Errors
    /// [`AllocError::InvalidLayout`] if no class serves `bytes_req` bytes
    /// at the stub's alignment; as for creating the class.
    fn unborn_class(
        &self,
        stub: &KmemCache<P>,
        bytes_req: usize,
    ) -> Result<&KmemCache<P>, AllocError>;
    /// kmemtrace: the recorder (its per-CPU rings), which a cache keeps
    /// from its creation and writes its events into.
    fn kmemtrace_recorder(&self) -> &KmemtraceState;
    /// kmemtrace: `cache` is being destroyed (its record kept for dumps).
    fn kmemtrace_cache_destroyed(&self, cache: &KmemCache<P>);
}

/// What a cache asks of KFENCE, implemented by the feature's module
/// (`kfence/mod.rs`; `kfence/off.rs` without the feature: the clock
/// check an empty stub, no sampled alloc or free), so that the hooks
/// live with their feature: a part of [`CacheOwner`].
pub(crate) trait KfenceOwner<P: Platform> {
    /// The misses' clock check (arm a sample when it is due).
    fn kfence_tick(&self);
    /// Serve an armed sample of `cache` (`bytes_req` bytes, 0: the
    /// object size) from the guarded pool (`None`: not now); clears the
    /// cache's `SAMPLE` bit.
    #[cfg(feature = "kfence")]
    fn kfence_alloc(
        &self,
        cache: &KmemCache<P>,
        bytes_req: usize,
        tag: &dyn Fn() -> Option<AllocTagRef>,
    ) -> Option<NonNull<u8>>;
    /// Free `addr` if it is a sampled object (`None`: it is not); `cache`
    /// the cache the caller freed to (`None`: kfree).
    #[cfg(feature = "kfence")]
    fn kfence_free(
        &self,
        addr: usize,
        cache: Option<&KmemCache<P>>,
    ) -> Option<Result<(), FreeError>>;
}
