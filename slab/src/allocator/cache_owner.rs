//! The allocator as its caches' owner ([`CacheOwner`]): what the cache
//! layer asks of the allocator, handed down, so that `cache/` names no
//! type above it (as the slab layer is handed `SlabOwner`).

use core::ptr::NonNull;

use super::{BootCache, Kmem};
use crate::alloc_tag::AllocTagRef;
use crate::cache::{CacheOwner, KmemCache, OwnerCache};
use crate::error::{AllocError, FreeError};
use crate::kmemtrace::KmemtraceState;
use crate::platform::{PageSource, Platform};
use crate::report::ErrorReport;

// SAFETY: the allocator's bootstrap caches live in the allocator, which
// lives in a `'static` once it has made a cache (`init` takes `&'static
// self`), and are never moved.
unsafe impl<P: Platform> CacheOwner<P> for Kmem<P> {
    fn report_error(&self, report: ErrorReport) {
        Kmem::report_error(self, report);
    }

    fn report_bad_free(&self, cache: &str, error: FreeError) {
        Kmem::report_bad_free(self, cache, error);
    }

    fn reap_for_pressure(&self) -> bool {
        Kmem::reap_for_pressure(self).is_some()
    }

    fn cache(&self, which: OwnerCache) -> &KmemCache<P> {
        match which {
            OwnerCache::Cache => self.boot(BootCache::Cache),
            OwnerCache::Slab => self.boot(BootCache::Slab),
            OwnerCache::Bufctl => self.boot(BootCache::Bufctl),
            OwnerCache::Trace => self.boot(BootCache::Trace),
            OwnerCache::Magazine(magtype) => self.magazine_cache(magtype),
            #[cfg(feature = "alloc-profiling")]
            OwnerCache::TagArray(bytes) => {
                // The largest holds MAX_SMALL_OBJS slots (asserted in
                // allocator/mod.rs).
                let index = super::TAG_ARRAY_SIZES
                    .iter()
                    .position(|&size| size >= bytes)
                    .unwrap_or(super::TAG_ARRAY_SIZES.len() - 1);
                self.tag_array_cache(index)
            }
        }
    }

    fn primary_source(&self) -> &'static dyn PageSource {
        Kmem::primary_source(self)
    }

    #[cfg(feature = "alloc-profiling")]
    fn count_tag_array_miss(&self) {
        self.nr_tag_array_misses
            .fetch_add(1, core::sync::atomic::Ordering::Relaxed);
    }

    fn unlink_cache(&self, cache: &KmemCache<P>) {
        Kmem::unlink_cache(self, cache);
    }

    fn kmalloc_unborn(
        &self,
        stub: &KmemCache<P>,
        tag: &dyn Fn() -> Option<AllocTagRef>,
        bytes_req: usize,
    ) -> Result<NonNull<u8>, AllocError> {
        Kmem::kmalloc_unborn(self, stub, tag, bytes_req)
    }

    fn kfence_tick(&self) {
        Kmem::kfence_tick(self);
    }

    fn kfence_alloc(
        &self,
        cache: &KmemCache<P>,
        bytes_req: usize,
        tag: &dyn Fn() -> Option<AllocTagRef>,
    ) -> Option<NonNull<u8>> {
        Kmem::kfence_alloc(self, cache, bytes_req, tag)
    }

    fn kfence_free(&self, addr: usize, cache: &KmemCache<P>) -> Option<Result<(), FreeError>> {
        Kmem::kfence_free(self, addr, Some(cache))
    }

    fn kmemtrace_recorder(&self) -> &KmemtraceState {
        &self.kmemtrace
    }

    fn kmemtrace_cache_destroyed(&self, cache: &KmemCache<P>) {
        Kmem::kmemtrace_cache_destroyed(self, cache);
    }
}
