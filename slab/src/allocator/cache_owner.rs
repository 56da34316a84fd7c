//! The allocator as its caches' owner ([`CacheOwner`]): what the cache
//! layer asks of the allocator, handed down, so that `cache/` names no
//! type above it (as the slab layer is handed `SlabOwner`).

use core::ptr::NonNull;

use super::{BootCache, Kmem};
use crate::cache::{CacheOwner, KmemCache, OwnerCache};
use crate::error::{AllocError, FreeError};
use crate::kmemtrace::KmemtraceState;
use crate::layout::pagemap::{PageEntry, PageOwner};
use crate::platform::{PAGE_SIZE, PageSource, Platform};
use crate::reports::error::{ErrorKind, ErrorReport, ReportName};
use crate::slab::Slab;
use crate::sync::IrqGuard;

// SAFETY: the allocator's bootstrap caches live in the allocator, which
// lives in a `'static` once it has made a cache (`init` takes `&'static
// self`), and are never moved.
unsafe impl<P: Platform> CacheOwner<P> for Kmem<P> {
    fn report_error(&self, report: ErrorReport) {
        Kmem::report_error(self, report);
    }

    /// Report a refused free (`cache`: the cache the caller freed to, or
    /// `kmalloc`): the kind from the error, the object, slab and (a wrong
    /// cache's) owning cache from the page map, and for a duplicate free in a debug cache its last
    /// transactions.
    #[cold]
    #[inline(never)]
    fn report_bad_free(&self, cache: &str, error: FreeError) {
        let addr = error.addr();
        let entry = if self.is_ready() {
            self.page_entry(addr)
        } else {
            PageEntry::NONE
        };
        let kind = match error {
            FreeError::DoubleFree { .. } => ErrorKind::DuplicateFree,
            FreeError::WrongCache { .. } => ErrorKind::WrongCache,
            FreeError::Misaligned { .. } => ErrorKind::InvalidFree,
            FreeError::NotAllocated { .. } if !entry.is_live() => ErrorKind::ForeignPointer,
            FreeError::NotAllocated { .. } => ErrorKind::InvalidFree,
        };
        let mut report = ErrorReport::new(kind, cache, addr);
        if kind == ErrorKind::DuplicateFree
            && let PageOwner::LargeFreed { nr_pages } = entry.owner()
        {
            // A page-granular block kfree gave back (its head's freed
            // mark): its address and size.
            report.object = addr;
            report.size = nr_pages * PAGE_SIZE;
        }
        if let Some(slab) = entry.slab() {
            let slab = slab as *mut Slab;
            // SAFETY: registered slabs are alive and belong to caches of
            // this allocator.
            let owner = unsafe { &*(*slab).cache.cast::<KmemCache<P>>() };
            if kind == ErrorKind::WrongCache {
                // The cache the buffer belongs to (the error carries only
                // the address: `FreeError`).
                report.owner = Some(ReportName::new(owner.name()));
            }
            // SAFETY: as above.
            let base = unsafe { (*slab).base };
            let index = addr.wrapping_sub(base) / owner.params.stride;
            if index < owner.params.nr_objs_per_slab {
                report.object = base + index * owner.params.stride;
                report.slab = slab as usize;
            }
            if kind == ErrorKind::DuplicateFree
                && report.object == addr
                && let Some(layout) = owner.debug.as_ref()
            {
                // SAFETY: an object start of a live slab; read only.
                let info = unsafe { owner.debug_object_info(layout, addr) };
                report.last_alloc = info.last_alloc;
                report.last_free = info.last_free;
                report.contents = info.contents;
            }
        }
        self.report_error(report);
    }

    fn reap_for_pressure(
        &self,
        source: &'static dyn PageSource,
        nr_pages: usize,
    ) -> Option<NonNull<u8>> {
        Kmem::reap_for_pressure(self, source, nr_pages)
    }

    fn cache(&self, which: OwnerCache) -> &KmemCache<P> {
        match which {
            OwnerCache::Cache => self.boot(BootCache::Cache),
            OwnerCache::Slab => self.boot(BootCache::Slab),
            OwnerCache::Bufctl => self.boot(BootCache::Bufctl),
            #[cfg(feature = "trace-table")]
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

    /// The class an unborn class's `stub` stands for (`cache/alloc.rs`,
    /// its first allocation), created now.
    #[cold]
    #[inline(never)]
    fn unborn_class(
        &self,
        stub: &KmemCache<P>,
        bytes_req: usize,
    ) -> Result<&KmemCache<P>, AllocError> {
        // The stub's object size is the natural alignment it stands for.
        let index = Self::kmalloc_index(bytes_req, stub.params.obj_size)
            .ok_or(AllocError::InvalidLayout)?;
        self.kmalloc_class(index)
    }

    fn kmemtrace_recorder(&self) -> &KmemtraceState {
        &self.kmemtrace
    }

    fn kmemtrace_cache_destroyed(&self, cache: &KmemCache<P>) {
        Kmem::kmemtrace_cache_destroyed(self, cache);
    }
}

// Error reports from the allocator's side: the error ring and the kernel's
// hook ([`crate::reports::ErrorReport`]), bad frees.
impl<P: Platform> Kmem<P> {
    /// Keep a report (stamped with now and this CPU) and hand it to the
    /// hook. Callers hold no allocator lock.
    #[cold]
    #[inline(never)]
    pub(crate) fn report_error(&self, mut report: ErrorReport) {
        report.timestamp = P::now();
        report.cpu = P::cpu_id() as u32;
        // The ring's lock and the hook's with interrupts off: an interrupt
        // handler's bad free reports here too, and must not find them held
        // by the code it interrupted.
        let report = {
            let _irq = IrqGuard::<P>::new();
            self.errors.push(report)
        };
        let hook = *self.error_hook.lock::<P>();
        if let Some(hook) = hook {
            hook(&report);
        }
    }
}
