//! The kernel's page arena `kpages` (Akaros' name): whole pages from the
//! frame allocator, addressed through the direct map; the slab allocator's
//! page source. And the frame allocator's statistics as the `base` arena.
//!
//! The slab allocator's pages ([`PageSource::alloc_pages`]) carry no code
//! tag: the slab allocator charges its objects (a page-granular kmalloc
//! its whole pages) to their call sites itself. Kernel code that takes
//! pages from the arena directly calls `kpages_alloc!(nr_pages)`, which
//! charges `nr_pages x 4096` bytes to its own call site until the pages
//! are freed ([`Arena::alloc_pages_tagged`], `frame`'s tags).

use core::ptr::NonNull;
use core::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use magpie_codetag::alloc_tag::AllocTagRef;
use magpie_slab::descriptor::{ArenaDescription, ArenaFigure};
use magpie_slab::{AllocError, ArenaStats, PAGE_SIZE, PageSource};
use spin::Once;

use crate::mm::{frame, layout, paging};

/// A page source over the frame allocator: whole pages, addressed through
/// the direct map. Akaros calls the kernel's page arena `kpages`.
pub struct Arena {
    name: &'static str,
    nr_pages_out: AtomicUsize,
    nr_allocs_ever: AtomicU64,
    /// Gives pages back to the frame allocator when it runs out (the slab
    /// allocator's reap, set by `kmem::init` once it is up).
    reclaim: Once<fn() -> usize>,
}

impl Arena {
    const fn new(name: &'static str) -> Self {
        Self {
            name,
            nr_pages_out: AtomicUsize::new(0),
            nr_allocs_ever: AtomicU64::new(0),
            reclaim: Once::new(),
        }
    }

    /// Sets what a failed page allocation calls before it tries again
    /// (once; later calls are ignored). Registered rather than called by
    /// name: the arena sits below the slab allocator it feeds.
    pub fn set_reclaim(&self, reclaim: fn() -> usize) {
        self.reclaim.call_once(|| reclaim);
    }

    /// [`PageSource::alloc_pages`] charged to allocation tag `tag` (`None`:
    /// uncounted, as the slab allocator's pages), counted by the frame
    /// allocator until the pages are freed; what `kpages_alloc!` calls
    /// with its call site's tag.
    ///
    /// # Errors
    ///
    /// [`AllocError::OutOfMemory`]: no run of `nr_pages` free frames, even
    /// after a reclaim.
    pub fn alloc_pages_tagged(
        &self,
        nr_pages: usize,
        tag: Option<AllocTagRef>,
    ) -> Result<NonNull<u8>, AllocError> {
        let phys = frame::alloc_tagged(nr_pages, 1, tag)
            .or_else(|| {
                self.reclaim_for_retry();
                frame::alloc_tagged(nr_pages, 1, tag)
            })
            .ok_or(AllocError::OutOfMemory)?;
        self.nr_pages_out.fetch_add(nr_pages, Ordering::Relaxed);
        self.nr_allocs_ever.fetch_add(1, Ordering::Relaxed);
        NonNull::new(layout::phys_to_virt(phys.as_u64()) as *mut u8).ok_or(AllocError::OutOfMemory)
    }

    /// Its `kmemstat` row at `indent` (Total and Alloc Amt its pages
    /// out, quantum a page), for readers of a memory image
    /// (`magpie_slab::descriptor::describe_kmemstat`).
    pub fn description(&'static self, indent: usize) -> ArenaDescription {
        let pages = ArenaFigure::word(self.nr_pages_out.as_ptr(), PAGE_SIZE as u64);
        ArenaDescription {
            indent,
            name: self.name,
            quantum: PAGE_SIZE,
            total: pages,
            alloc: pages,
            nr_allocs_ever: ArenaFigure::word(self.nr_allocs_ever.as_ptr(), 1),
        }
    }

    /// Pages this arena has handed out and not had back.
    pub fn nr_pages_out(&self) -> usize {
        self.nr_pages_out.load(Ordering::Relaxed)
    }
}

impl PageSource for Arena {
    fn name(&self) -> &str {
        self.name
    }

    /// Pages from the frame allocator; when it has none, reap every cache
    /// once (empty slabs, magazines and depots go back to the frame
    /// allocator) and try again before failing. `magpie-slab` calls a page
    /// source with none of its locks held, so the reap cannot deadlock;
    /// kernel code must not allocate inside `SLAB.for_each_cache` for the
    /// same reason (the reap takes the cache-list lock).
    fn alloc_pages(&self, nr_pages: usize) -> Result<NonNull<u8>, AllocError> {
        self.alloc_pages_tagged(nr_pages, None)
    }

    unsafe fn free_pages(&self, addr: NonNull<u8>, nr_pages: usize) {
        let phys = paging::virt_to_phys(addr.as_ptr() as usize)
            .expect("kpages: freed pages are not in the direct map");
        frame::free(frame::PhysAddr::new(phys), nr_pages);
        self.nr_pages_out.fetch_sub(nr_pages, Ordering::Relaxed);
    }

    fn span(&self) -> (usize, usize) {
        paging::direct_map_span()
    }

    fn stats(&self) -> ArenaStats {
        // kpages holds exactly what it imported from the frame allocator.
        let bytes = self.nr_pages_out() * PAGE_SIZE;
        ArenaStats {
            total_bytes: bytes,
            alloc_bytes: bytes,
            nr_allocs_ever: self.nr_allocs_ever.load(Ordering::Relaxed),
        }
    }
}

impl Arena {
    /// Reclaims pages (every cache reaped, see [`Arena::set_reclaim`]) so
    /// that a failed page allocation can be retried; one reclaim at a time
    /// (an allocation failing during it, or on another CPU meanwhile,
    /// retries without reclaiming again).
    fn reclaim_for_retry(&self) {
        static REAPING: AtomicBool = AtomicBool::new(false);
        if let Some(reclaim) = self.reclaim.get()
            && !REAPING.swap(true, Ordering::Acquire)
        {
            let nr_pages = reclaim();
            REAPING.store(false, Ordering::Release);
            log::debug!("kpages: out of frames; reaped {nr_pages} pages");
        }
    }
}

/// Statistics of the frame allocator, shown as the `base` arena.
pub fn base_stats() -> ArenaStats {
    let stats = frame::stats();
    ArenaStats {
        total_bytes: stats.nr_total * PAGE_SIZE,
        alloc_bytes: (stats.nr_total - stats.nr_free) * PAGE_SIZE,
        nr_allocs_ever: stats.nr_allocs_ever,
    }
}

/// The `base` row of `kmemstat` (the frame allocator, indent 0), for
/// readers of a memory image; `None` before `frame::init`.
pub fn base_description() -> Option<ArenaDescription> {
    let stats = frame::stats_location()?;
    let field = |offset: usize| stats.wrapping_byte_add(offset);
    let nr_total = field(core::mem::offset_of!(frame::FrameStats, nr_total)).cast::<usize>();
    let nr_free = field(core::mem::offset_of!(frame::FrameStats, nr_free)).cast::<usize>();
    let nr_allocs_ever =
        field(core::mem::offset_of!(frame::FrameStats, nr_allocs_ever)).cast::<u64>();
    Some(ArenaDescription {
        indent: 0,
        name: "base",
        quantum: PAGE_SIZE,
        total: ArenaFigure::word(nr_total, PAGE_SIZE as u64),
        alloc: ArenaFigure::word(nr_total, PAGE_SIZE as u64).minus(nr_free),
        nr_allocs_ever: ArenaFigure::word(nr_allocs_ever, 1),
    })
}

/// The kernel's page arena: slabs and page-granular kmalloc come from here.
pub static KPAGES: Arena = Arena::new("kpages");
