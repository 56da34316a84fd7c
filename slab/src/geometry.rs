//! Slab geometry: how a cache's objects are laid out in its slabs.

use crate::cache::CacheFlags;
use crate::error::AllocError;
use crate::platform::PAGE_SIZE;
use crate::slab::{SMALL_HEADER_OFFSET, SMALL_MAX_STRIDE};

/// Which slab layout a cache uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlabKind {
    /// One-page slabs, header at the end of the page, free list through
    /// the free objects.
    Small,
    /// Multi-page slabs with one bufctl per object and a hash from buffer
    /// address to bufctl; object memory untouched.
    Bufctl,
}

/// Object layout of a cache.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Geometry {
    pub(crate) stride: usize,
    pub(crate) align: usize,
    pub(crate) kind: SlabKind,
    pub(crate) nr_pages_per_slab: usize,
    pub(crate) nr_objs_per_slab: usize,
    /// Small slabs with tag references: offset in the page of the array of
    /// one [`AllocTagRef`](crate::AllocTagRef) per object, between the last
    /// object and the header. 0 if the slabs have none.
    #[cfg_attr(not(feature = "alloc-profiling"), allow(dead_code))]
    pub(crate) tag_array_offset: usize,
}

/// Largest object a cache may hold.
const MAX_OBJ_SIZE: usize = 1 << 30;

impl Geometry {
    /// Lay out objects of `size` bytes aligned to `align` (0 means 1).
    /// Objects are at least 8 bytes apart and 8-aligned. With `tag_refs`
    /// (and feature `alloc-profiling`), small slabs keep 4 bytes per object
    /// for its allocation tag reference.
    pub(crate) fn new(
        size: usize,
        align: usize,
        flags: CacheFlags,
        tag_refs: bool,
    ) -> Result<Self, AllocError> {
        let align = if align == 0 { 1 } else { align };
        if size == 0 || size > MAX_OBJ_SIZE || !align.is_power_of_two() || align > PAGE_SIZE {
            return Err(AllocError::InvalidLayout);
        }
        let align = align.max(8);
        let stride = size.next_multiple_of(align);
        if stride <= SMALL_MAX_STRIDE && !flags.contains(CacheFlags::NOTOUCH) {
            let ref_bytes = if tag_refs {
                crate::alloc_tag::TAG_REF_BYTES
            } else {
                0
            };
            let nr_objs = SMALL_HEADER_OFFSET / (stride + ref_bytes);
            return Ok(Geometry {
                stride,
                align,
                kind: SlabKind::Small,
                nr_pages_per_slab: 1,
                nr_objs_per_slab: nr_objs,
                tag_array_offset: if ref_bytes == 0 {
                    0
                } else {
                    SMALL_HEADER_OFFSET - nr_objs * ref_bytes
                },
            });
        }
        let target_objs = if stride <= 8192 {
            8
        } else {
            (65536 / stride).max(1)
        };
        let nr_pages = (stride * target_objs).div_ceil(PAGE_SIZE);
        Ok(Geometry {
            stride,
            align,
            kind: SlabKind::Bufctl,
            nr_pages_per_slab: nr_pages,
            nr_objs_per_slab: nr_pages * PAGE_SIZE / stride,
            tag_array_offset: 0,
        })
    }
}
