//! Slab geometry: how a cache's objects are laid out in its slabs, chosen
//! per cache for the least waste (Bonwick 1994 §4).
//!
//! A small-object slab (free list through the free objects) is
//! `nr_pages_per_slab` pages: objects from offset 0, then — if the header
//! lives in the slab — the 128-byte [`Slab`](crate::slab::Slab) header at
//! the very end. Allocation-tag references (feature `alloc-profiling`)
//! take no room in the slab: they live in a per-slab side array, allocated
//! on the slab's first tagged allocation ([`crate::alloc_tag`]), so the
//! geometry is the same with the feature and without.
//! For a cache on the primary page source the header may instead come from
//! `kmem_slab` ("off slab"): the page map finds it either way. The choice,
//! for each object stride: the fewest pages and the header placement whose
//! waste — tail bytes no object fills and the header — is at most a
//! target share of the slab; if none is, the least waste. So no class
//! loses an object per slab to the header (kmalloc-512: 8 objects per
//! page, header off slab). The limits ([`slab_limits`]) depend on the
//! stride, as SLUB's `calculate_order` bounds a slab's waste by a
//! fraction of it:
//!
//! - up to 1 KiB: 1..=[`SMALL_OBJ_SLAB_PAGES`] pages, waste at most
//!   1/[`WASTE_TARGET_DIV`] (3.1 %): a page holds 4 objects or more;
//! - above 1 KiB: 1..=[`MAX_SLAB_PAGES`] pages (128 KiB), waste at most
//!   1/[`LARGE_OBJ_WASTE_TARGET_DIV`] (0.8 %). Eight pages hold only 4–32
//!   such objects, so their tails were up to 3 % of the slab, and above
//!   1 KiB is where a mixed heap's bytes are (issue 34's heap, 8 B–8 KiB
//!   spread evenly, with classes 32 bytes apart above 1 KiB: tails and
//!   in-slab headers 3.45 % of the bytes live with slabs of up to 8
//!   pages, 0.36 % with these).
//!
//! `src/tests/geometry.rs` prints and checks the table of every kmalloc
//! class.
//!
//! Bootstrap caches and caches on other page sources keep one-page slabs
//! with the header in the page (found by masking the address), and
//! objects above `PAGE_SIZE / 8` there (and `NOTOUCH` caches) use bufctl
//! slabs, as before.

use crate::error::AllocError;
use crate::flags::CacheFlags;
use crate::platform::PAGE_SIZE;

/// Which slab layout a cache uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlabKind {
    /// Slabs whose free list runs through the free objects; header at the
    /// end of the slab or (primary source) from `kmem_slab`.
    Small,
    /// Multi-page slabs with one bufctl per object and a hash from buffer
    /// address to bufctl; object memory untouched.
    Bufctl,
}

/// Most pages in a small-object slab (of objects above
/// [`LARGE_OBJ_STRIDE`]).
pub(crate) const MAX_SLAB_PAGES: usize = 32;
/// Most pages in a small-object slab of objects up to
/// [`LARGE_OBJ_STRIDE`].
pub(crate) const SMALL_OBJ_SLAB_PAGES: usize = 8;
/// Strides above this take the large objects' limits ([`slab_limits`]).
pub(crate) const LARGE_OBJ_STRIDE: usize = 1024;
/// Waste target up to [`LARGE_OBJ_STRIDE`]: at most `1 / WASTE_TARGET_DIV`
/// of a slab (3.1 %).
pub(crate) const WASTE_TARGET_DIV: usize = 32;
/// Waste target above [`LARGE_OBJ_STRIDE`]: at most
/// `1 / LARGE_OBJ_WASTE_TARGET_DIV` of a slab (0.8 %).
pub(crate) const LARGE_OBJ_WASTE_TARGET_DIV: usize = 128;

/// The packed slab limits of `stride`: (most pages, waste target
/// divisor). See the module docs.
pub(crate) const fn slab_limits(stride: usize) -> (usize, usize) {
    if stride > LARGE_OBJ_STRIDE {
        (MAX_SLAB_PAGES, LARGE_OBJ_WASTE_TARGET_DIV)
    } else {
        (SMALL_OBJ_SLAB_PAGES, WASTE_TARGET_DIV)
    }
}
/// Most objects in a small-object slab (the `AUDIT` bitmap's bits).
pub(crate) const MAX_SMALL_OBJS: usize = 512;
/// Bytes of a slab header.
const HEADER_BYTES: usize = SLAB_HEADER_BYTES;

/// Bytes of a small slab's header ([`Slab`](crate::slab::Slab), asserted
/// there).
pub(crate) const SLAB_HEADER_BYTES: usize = 128;
/// Bytes of a bufctl ([`Bufctl`](crate::slab::Bufctl), asserted there).
pub(crate) const BUFCTL_BYTES: usize = 40;
/// Where a small slab's header starts inside its page.
pub(crate) const SMALL_HEADER_OFFSET: usize = PAGE_SIZE - SLAB_HEADER_BYTES;
/// Largest buffer that gets a small-object slab.
pub(crate) const SMALL_MAX_STRIDE: usize = PAGE_SIZE / 8;

/// Object layout of a cache.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Geometry {
    pub(crate) stride: usize,
    pub(crate) align: usize,
    pub(crate) kind: SlabKind,
    pub(crate) nr_pages_per_slab: usize,
    pub(crate) nr_objs_per_slab: usize,
    /// Small slabs: the header comes from `kmem_slab` (only for caches on
    /// the primary source, where the page map finds it).
    pub(crate) header_off_slab: bool,
}

/// Largest object a cache may hold.
const MAX_OBJ_SIZE: usize = 1 << 30;

/// Largest stride a packed (primary-source) small-object cache takes.
const PACKED_MAX_STRIDE: usize = 8192;

impl Geometry {
    /// Lay out objects of `size` bytes aligned to `align` (0 means 1).
    /// Objects are at least 8 bytes apart and 8-aligned. `packed`: the
    /// cache is on the primary source (and is not one of the bootstrap
    /// caches slab headers come from), so its slabs may span pages and
    /// keep their header off slab.
    ///
    /// # Errors
    /// [`AllocError::InvalidLayout`] for a size of 0 or above 1 GiB, an
    /// alignment that is not a power of two or is above a page.
    pub(crate) fn new(
        size: usize,
        align: usize,
        flags: CacheFlags,
        packed: bool,
    ) -> Result<Self, AllocError> {
        Self::with_max_slab_pages(size, align, flags, packed, MAX_SLAB_PAGES)
    }

    /// [`Geometry::new`] with packed slabs of at most `max_slab_pages`
    /// pages (1..=[`MAX_SLAB_PAGES`], and at most the stride's own limit,
    /// [`slab_limits`]; more if one object needs more): a small page
    /// source keeps its slabs small, so that the first object of a class
    /// does not take 8 or 32 pages (`Kmem::init` chooses it).
    ///
    /// # Errors
    /// As for [`Geometry::new`].
    pub(crate) fn with_max_slab_pages(
        size: usize,
        align: usize,
        flags: CacheFlags,
        packed: bool,
        max_slab_pages: usize,
    ) -> Result<Self, AllocError> {
        let align = if align == 0 { 1 } else { align };
        if size == 0 || size > MAX_OBJ_SIZE || !align.is_power_of_two() || align > PAGE_SIZE {
            return Err(AllocError::InvalidLayout);
        }
        let align = align.max(8);
        let stride = size.next_multiple_of(align);
        let notouch = flags.contains(CacheFlags::NOTOUCH);
        if packed && !notouch && stride <= PACKED_MAX_STRIDE {
            return Ok(Self::packed(stride, align, max_slab_pages));
        }
        if stride <= SMALL_MAX_STRIDE && !notouch {
            return Ok(Geometry {
                stride,
                align,
                kind: SlabKind::Small,
                nr_pages_per_slab: 1,
                nr_objs_per_slab: SMALL_HEADER_OFFSET / stride,
                header_off_slab: false,
            });
        }
        let target_objs = if stride <= 8192 {
            8
        } else {
            (65536 / stride).max(1)
        };
        let nr_pages = (stride * target_objs).div_ceil(PAGE_SIZE);
        let geometry = Geometry {
            stride,
            align,
            kind: SlabKind::Bufctl,
            nr_pages_per_slab: nr_pages,
            nr_objs_per_slab: nr_pages * PAGE_SIZE / stride,
            header_off_slab: false,
        };
        // The slab header's counts (`u16` objects, `u32` pages): a bufctl
        // slab holds at most 8 objects of more than 512 bytes (or 512 of a
        // `NOTOUCH` cache), and 1 GiB is 2^18 pages.
        debug_assert!(geometry.nr_objs_per_slab <= MAX_SMALL_OBJS && nr_pages <= u32::MAX as usize);
        Ok(geometry)
    }

    /// The small-object layout with the least waste (see the module docs).
    fn packed(stride: usize, align: usize, max_slab_pages: usize) -> Self {
        // (waste bytes, slab bytes, pages, objects, off slab) of the best.
        let mut best: Option<(usize, usize, usize, usize, bool)> = None;
        let (stride_max_pages, waste_target_div) = slab_limits(stride);
        let max_slab_pages = max_slab_pages
            .clamp(1, stride_max_pages)
            .max(stride.div_ceil(PAGE_SIZE));
        for nr_pages in 1..=max_slab_pages {
            let slab_bytes = nr_pages * PAGE_SIZE;
            for off_slab in [false, true] {
                let room = if off_slab {
                    slab_bytes
                } else {
                    slab_bytes - HEADER_BYTES
                };
                let nr_objs = (room / stride).min(MAX_SMALL_OBJS);
                if nr_objs == 0 {
                    continue;
                }
                // Everything but object bytes, plus an off-slab header.
                let waste = slab_bytes - nr_objs * stride + if off_slab { HEADER_BYTES } else { 0 };
                let better = match best {
                    None => true,
                    // Compare waste / slab_bytes without division.
                    Some((best_waste, best_bytes, ..)) => {
                        waste * best_bytes < best_waste * slab_bytes
                    }
                };
                if better {
                    best = Some((waste, slab_bytes, nr_pages, nr_objs, off_slab));
                }
            }
            // The best of this size (header in or off) meets the target.
            if let Some((waste, slab_bytes, ..)) = best
                && waste * waste_target_div <= slab_bytes
            {
                break;
            }
        }
        let (_, _, nr_pages, nr_objs, off_slab) =
            best.expect("a stride of at most 8 KiB fits in 2 pages");
        Geometry {
            stride,
            align,
            kind: SlabKind::Small,
            nr_pages_per_slab: nr_pages,
            nr_objs_per_slab: nr_objs,
            header_off_slab: off_slab,
        }
    }

    /// Bytes of a slab that hold no object (tail, in-slab header), plus
    /// the header's bytes when it lives off slab.
    #[cfg_attr(
        any(not(test), loom),
        allow(
            dead_code,
            reason = "the geometry tests' waste bound (not built under loom)"
        )
    )]
    pub(crate) fn waste_per_slab(&self) -> usize {
        let header = match self.kind {
            SlabKind::Small => HEADER_BYTES,
            // Slab struct and bufctls are metadata.
            SlabKind::Bufctl => HEADER_BYTES + self.nr_objs_per_slab * BUFCTL_BYTES,
        };
        let off = if self.kind == SlabKind::Bufctl || self.header_off_slab {
            header
        } else {
            0
        };
        self.nr_pages_per_slab * PAGE_SIZE - self.nr_objs_per_slab * self.stride + off
    }
}
