//! Code tags on page-frame allocations (Linux `alloc_pages` under
//! memory allocation profiling, `include/linux/pgalloc_tag.h`): the
//! [`alloc_pages!`](crate::alloc_pages) and
//! [`kpages_alloc!`](crate::kpages_alloc) call-site forms. The counting
//! (`alloc_tag::charge_frames`, `uncharge_frames`) is handed to the frame
//! allocator by [`init`](super::alloc_tag::init).
//!
//! A tagged run of `N` frames shows at its call site in `allocinfo` as
//! `N x 4096` bytes and one call, until it is freed (through
//! [`frame::free`](crate::mm::frame::free) or
//! [`PageSource::free_pages`](magpie_slab::PageSource::free_pages), any
//! sub-range: each frame freed gives back its 4096 bytes, the run's first
//! frame its call). The slab allocator's own pages stay untagged: it
//! charges its objects, so a slab page is never counted twice.

/// `alloc_pages!(nr_pages)` / `alloc_pages!(nr_pages, align_pages)`:
/// [`frame::alloc_aligned`](crate::mm::frame::alloc_aligned) (physically
/// contiguous frames, the first a multiple of `align_pages`, default 1)
/// charged to this call site: `allocinfo` shows `nr_pages x 4096` bytes
/// and one call there until the frames are freed. `None` when no run that
/// long is free. Linux's `alloc_pages` under memory allocation profiling.
#[macro_export]
#[collapse_debuginfo(yes)]
macro_rules! alloc_pages {
    ($nr_pages:expr) => {
        $crate::alloc_pages!($nr_pages, 1)
    };
    ($nr_pages:expr, $align_pages:expr) => {{
        let (nr_pages, align_pages): (usize, usize) = ($nr_pages, $align_pages);
        $crate::mm::frame::alloc_tagged(nr_pages, align_pages, $crate::__site_tag!())
    }};
}

/// `kpages_alloc!(nr_pages)`: [`KPAGES`](crate::kmem::KPAGES)`.alloc_pages`
/// (direct-map address, reclaiming once when out of frames) charged to
/// this call site like [`alloc_pages!`](crate::alloc_pages); freed with
/// `KPAGES.free_pages`.
#[macro_export]
#[collapse_debuginfo(yes)]
macro_rules! kpages_alloc {
    ($nr_pages:expr) => {{
        let nr_pages: usize = $nr_pages;
        $crate::kmem::KPAGES.alloc_pages_tagged(nr_pages, $crate::__site_tag!())
    }};
}
