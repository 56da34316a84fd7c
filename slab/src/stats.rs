//! Statistics types: per cache ([`CacheStats`]) and per CPU
//! ([`CpuCacheStats`]), and how they are read.

use crate::layout::geometry::SlabKind;

/// A cache's statistics, summed over CPUs at the time of the call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheStats {
    /// Object size in bytes, as requested at creation.
    pub obj_size: usize,
    /// Guaranteed alignment of objects in bytes.
    pub align: usize,
    /// Objects currently with callers.
    pub nr_allocated: usize,
    /// Slabs (empty, partial and full).
    pub nr_slabs: usize,
    /// Pages per slab.
    pub nr_pages_per_slab: usize,
    /// Objects per slab.
    pub objs_per_slab: usize,
    /// Partial plus full slabs.
    pub nr_active_slabs: usize,
    /// Objects in all slabs (`nr_slabs * objs_per_slab`).
    pub nr_total_objs: usize,
    /// Allocations by callers ever.
    pub nr_allocs_ever: u64,
    /// Frees by callers ever.
    pub nr_frees_ever: u64,
    /// Current rounds per full magazine (0: no magazine layer).
    pub magsize: usize,
    /// Non-empty magazines in the depot.
    pub depot_nr_full: usize,
    /// Empty magazines in the depot.
    pub depot_nr_empty: usize,
    /// Times the depot lock was contended.
    pub depot_contention: u64,
    /// Times the depot moved to a larger magazine type (Bonwick & Adams
    /// 2001 §3.7: the magazine size grows while the depot lock is
    /// contended, or the depot hands magazines from CPU to CPU), ever.
    pub nr_magazine_resizes: u64,
    /// Rounds (objects) in per-CPU magazines.
    pub nr_cpu_cached_objs: usize,
    /// Rounds (objects) in depot magazines.
    pub nr_depot_objs: usize,
    /// Bytes of slab pages (`pages * PAGE_SIZE`).
    pub total_bytes: usize,
    /// Bytes of those pages that can hold no object of `obj_size` bytes:
    /// slab tails, in-slab headers, padding up to the stride
    /// (`total_bytes - nr_total_objs * obj_size`).
    pub waste_bytes: usize,
    /// Slab layout.
    pub kind: SlabKind,
}

/// The allocator's own memory ([`HeapStats::metadata`](crate::HeapStats::metadata)),
/// in bytes: what `kmemstat` reports as metadata.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MetadataStats {
    /// The page map (a 32-byte slot per page of the primary source's span).
    pub page_map_bytes: usize,
    /// Slab pages of the bootstrap caches: magazines (the
    /// `kmem_magazine_<rounds>` caches), cache structs, off-slab slab
    /// headers (`kmem_slab`), bufctls, trace records, per-CPU arrays, tag
    /// side arrays (`kmem_tags_<bytes>`).
    pub bootstrap_bytes: usize,
    /// Of those, the slab pages of each magazine cache, smallest magazine
    /// first (`MAGAZINE_ROUNDS``[i]` rounds per magazine:
    /// `kmem_magazine_1`, `_3`, `_6`, `_14`, `_29`, `_60`).
    pub magazine_bytes: [usize; crate::MAGAZINE_ROUNDS.len()],
    /// Of those, the slab pages of the tag side-array caches
    /// (`kmem_tags_<bytes>`, feature `alloc-profiling`: one array of 4
    /// bytes per object in each small slab that ever held a tagged
    /// object; 0 without the feature).
    pub tag_array_bytes: usize,
    /// Bytes the primary source manages (its span's pages), the base of
    /// the metadata share.
    pub managed_bytes: usize,
}

impl MetadataStats {
    /// All metadata bytes.
    pub fn total(&self) -> usize {
        self.page_map_bytes + self.bootstrap_bytes
    }

    /// Slab pages of all magazine caches, in bytes.
    pub fn magazine_total(&self) -> usize {
        self.magazine_bytes.iter().sum()
    }
}

/// One CPU's share of the magazine layer: what its magazines served and
/// what they hold now. From [`KmemCache::cpu_stats`](crate::KmemCache::cpu_stats) (one cache) or
/// [`HeapStats::cpu`](crate::HeapStats::cpu) (summed over
/// every cache).
///
/// The counters are that CPU's own, written only by that CPU with its
/// interrupts off (no lock, and no counter shared between CPUs is written
/// on the magazine-hit paths); readers read them on that CPU through a
/// [cross-CPU call](crate::Platform::cross_cpu_call) and sum them. An object allocated on one CPU and freed on another
/// counts in the first CPU's `nr_allocs` and the second CPU's `nr_frees`.
/// Allocations and frees that missed the magazines (served by the slab
/// layer) are not in these counts, only in [`CacheStats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuCacheStats {
    /// Allocations served by this CPU's magazines, ever.
    pub nr_allocs: u64,
    /// Frees stored in this CPU's magazines, ever.
    pub nr_frees: u64,
    /// Rounds (objects) in this CPU's loaded magazine now.
    pub nr_rounds_loaded: usize,
    /// Rounds (objects) in this CPU's previous magazine now.
    pub nr_rounds_prev: usize,
}

/// Field-wise sum (counters wrap), for summing CPUs or caches.
impl core::ops::Add for CpuCacheStats {
    type Output = CpuCacheStats;

    fn add(self, other: CpuCacheStats) -> CpuCacheStats {
        CpuCacheStats {
            nr_allocs: self.nr_allocs.wrapping_add(other.nr_allocs),
            nr_frees: self.nr_frees.wrapping_add(other.nr_frees),
            nr_rounds_loaded: self.nr_rounds_loaded + other.nr_rounds_loaded,
            nr_rounds_prev: self.nr_rounds_prev + other.nr_rounds_prev,
        }
    }
}
