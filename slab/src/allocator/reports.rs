//! Error reports from the allocator's side: the debug configuration, the
//! error ring and the kernel's hook ([`crate::report`]), bad frees.

use super::Kmem;
use crate::cache::KmemCache;
use crate::debug::SlabDebug;
use crate::debug::SlabDebugConfig;
use crate::error::FreeError;
use crate::layout::pagemap::{PageEntry, PageOwner};
use crate::platform::{PAGE_SIZE, Platform};
use crate::report::{ErrorKind, ErrorReport, ReportName};
use crate::slab::Slab;
use crate::sync::IrqGuard;

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

    /// Report a refused free (`cache`: the cache the caller freed to, or
    /// `kmalloc`): the kind from the error, the object and slab from the
    /// page map, and for a duplicate free in a debug cache its last
    /// transactions.
    #[cold]
    #[inline(never)]
    pub(crate) fn report_bad_free(&self, cache: &str, error: FreeError) {
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
        if let FreeError::WrongCache {
            owner: Some(owner), ..
        } = error
        {
            report.owner = Some(ReportName::new(owner));
        }
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
}

impl<P: Platform> SlabDebug<'_, P> {
    /// The boot-line debug configuration (`slab_debug=`, `kmem_flags=`;
    /// see [`SlabDebugConfig`]): call before [`Kmem::init`] so the
    /// kmalloc caches get it; caches created later get it too (by name).
    /// Caches that exist already keep their flags.
    pub fn set_config(&self, config: SlabDebugConfig) {
        *self.heap.debug_config.lock::<P>() = config;
    }

    /// The debug configuration in force.
    pub fn config(&self) -> SlabDebugConfig {
        *self.heap.debug_config.lock::<P>()
    }

    /// Called with every error report, after it is kept in the error ring,
    /// with no allocator lock held; the kernel prints it (and may panic).
    /// The hook must not allocate from this allocator.
    pub fn set_error_hook(&self, hook: Option<fn(&ErrorReport)>) {
        *self.heap.error_hook.lock::<P>() = hook;
    }

    /// Errors reported since the allocator was created (the ring keeps the
    /// latest [`ERROR_RING_SIZE`](crate::report::ERROR_RING_SIZE)).
    pub fn nr_errors(&self) -> u64 {
        let _irq = IrqGuard::<P>::new();
        self.heap.errors.nr_reported()
    }

    /// Copy the kept reports numbered after `after` into `out`, oldest
    /// first; returns how many.
    pub fn read_errors(&self, after: u64, out: &mut [ErrorReport]) -> usize {
        let _irq = IrqGuard::<P>::new();
        self.heap.errors.read(after, out)
    }
}
