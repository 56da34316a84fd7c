//! Allocation profiling's handle ([`Kmem::profiling`]): the switches
//! and counters of one allocator, above it (the tags' own machinery, in
//! `alloc_tag/mod.rs`, sits below the caches).

use core::sync::atomic::Ordering;

use crate::allocator::Kmem;
use crate::cache::KmemCache;
use crate::platform::Platform;

/// Allocation profiling's switches and tagged allocations for one
/// allocator, from [`Kmem::profiling`] (feature `alloc-profiling`
/// for the switches to do anything; see the crate docs).
#[derive(Clone, Copy)]
pub struct AllocProfiling<'a, P: Platform> {
    pub(crate) heap: &'a Kmem<P>,
}

impl<P: Platform> Kmem<P> {
    /// Allocation profiling's switches: [`AllocProfiling`].
    pub fn profiling(&self) -> AllocProfiling<'_, P> {
        AllocProfiling { heap: self }
    }
}

impl<P: Platform> AllocProfiling<'_, P> {
    /// Switch allocation profiling (feature `alloc-profiling`) on or off
    /// for every cache, present and future: a kernel calls this whenever
    /// its own switch flips. On (the default), every allocation asks
    /// [`AllocTagHooks::current`](crate::AllocTagHooks::current) for its tag and explicit tags are
    /// charged; off, nothing is asked or charged (objects get tag
    /// reference 0, their frees uncharge nothing) and the alloc fast path
    /// is the compiled-out one. Without the feature, a no-op.
    pub fn set_enabled(&self, on: bool) {
        if !cfg!(feature = "alloc-profiling") {
            return;
        }
        self.heap
            .switch_every_cache(&self.heap.alloc_profiling, on, KmemCache::set_profiling);
    }

    /// Send every allocation and free off the profiled hits (`on`), so
    /// that every charge calls [`AllocTagHooks::on_charge`](crate::AllocTagHooks::on_charge) and
    /// every uncharge [`AllocTagHooks::on_uncharge`](crate::AllocTagHooks::on_uncharge); or back
    /// (`!on`, the default), the hooks then called only off the hits. For
    /// a platform whose hooks have work to do for a while (a context
    /// capture, say): the hits stay free of calls, and pay nothing for the
    /// hooks while they are off. Every cache, present and future (the
    /// bootstrap caches aside). An allocation or free running on another
    /// CPU while this runs may still take its hit. Without feature
    /// `alloc-profiling`, a no-op.
    pub fn set_tag_hooks(&self, on: bool) {
        if !cfg!(feature = "alloc-profiling") {
            return;
        }
        self.heap
            .switch_every_cache(&self.heap.alloc_tag_hooks, on, KmemCache::set_tag_hooks);
    }

    /// Whether the tag hooks are on ([`AllocProfiling::set_tag_hooks`](crate::AllocProfiling::set_tag_hooks);
    /// false without feature `alloc-profiling`).
    pub fn tag_hooks(&self) -> bool {
        cfg!(feature = "alloc-profiling") && self.heap.alloc_tag_hooks.load(Ordering::Relaxed)
    }

    /// Whether allocation profiling is switched on
    /// ([`AllocProfiling::set_enabled`](crate::AllocProfiling::set_enabled); false without feature
    /// `alloc-profiling`).
    #[inline]
    pub fn enabled(&self) -> bool {
        cfg!(feature = "alloc-profiling") && self.heap.alloc_profiling.load(Ordering::Relaxed)
    }

    /// Allocations that profiling should have charged but could not
    /// (feature `alloc-profiling`): the object's small slab had no tag
    /// side array yet and allocating one failed, so the object was handed
    /// out untagged — allocated, charged to no tag, its free uncharging
    /// nothing (Linux counts these failures too,
    /// `mark_failed_objexts_alloc`). Non-zero means the per-tag counts
    /// miss that many objects. Always 0 without the feature.
    pub fn nr_tag_array_misses(&self) -> u64 {
        self.heap.nr_tag_array_misses.load(Ordering::Relaxed)
    }
}
