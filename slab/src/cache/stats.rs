//! A cache's statistics, summed over CPUs (each CPU's figures read on
//! that CPU).

use core::sync::atomic::Ordering;

use super::KmemCache;
use crate::platform::{PAGE_SIZE, Platform};
use crate::stats::{CacheStats, CpuCacheStats};

impl<P: Platform> KmemCache<P> {
    /// Statistics, summed over CPUs. Reads each CPU's figures on that CPU
    /// (a cross-CPU call), then takes the depot lock and the slab lock in
    /// turn (not all at once), so the figures are a near-snapshot under
    /// concurrent use. Call it as [`KmemCache::reap`].
    pub fn stats(&self) -> CacheStats {
        let mut nr_allocs = self.nr_allocs_direct.load(Ordering::Relaxed);
        let mut nr_frees = self.nr_frees_direct.load(Ordering::Relaxed);
        let mut nr_cpu_cached_objs = 0;
        if self.has_magazines() {
            for cpu in 0..self.nr_cpus() {
                let cpu_stats = self.cpu_stats(cpu);
                nr_allocs = nr_allocs.wrapping_add(cpu_stats.nr_allocs);
                nr_frees = nr_frees.wrapping_add(cpu_stats.nr_frees);
                nr_cpu_cached_objs += cpu_stats.nr_rounds_loaded + cpu_stats.nr_rounds_prev;
            }
        }
        let (magsize, depot_nr_full, depot_nr_empty, nr_depot_objs, nr_magazine_resizes) = {
            let depot = self.depot.inner.lock();
            (
                depot.magsize(),
                depot.nr_full,
                depot.nr_empty,
                depot.nr_rounds(),
                u64::from(depot.nr_resizes),
            )
        };
        let layer = self.slab.lock();
        let counts = layer.counts();
        let (nr_allocated, nr_allocs, nr_frees) = if self.is_bootstrap() {
            // Metadata is allocated straight from the slab layer.
            (counts.nr_busy_objs, layer.nr_allocs, layer.nr_frees)
        } else {
            (
                // Never wraps: a near-snapshot may see a free before its alloc.
                nr_allocs.saturating_sub(nr_frees) as usize,
                nr_allocs,
                nr_frees,
            )
        };
        drop(layer);
        CacheStats {
            obj_size: self.params.obj_size,
            align: self.align,
            nr_allocated,
            nr_slabs: counts.nr_slabs,
            nr_pages_per_slab: self.params.nr_pages_per_slab,
            objs_per_slab: self.params.nr_objs_per_slab,
            nr_active_slabs: counts.nr_active_slabs,
            nr_total_objs: counts.nr_slabs * self.params.nr_objs_per_slab,
            nr_allocs_ever: nr_allocs,
            nr_frees_ever: nr_frees,
            magsize: if !self.has_magazines() { 0 } else { magsize },
            depot_nr_full,
            depot_nr_empty,
            depot_contention: self.depot.nr_contention.load(Ordering::Relaxed),
            nr_magazine_resizes,
            nr_cpu_cached_objs,
            nr_depot_objs,
            total_bytes: counts.nr_pages * PAGE_SIZE,
            waste_bytes: (counts.nr_pages * PAGE_SIZE).saturating_sub(
                counts.nr_slabs * self.params.nr_objs_per_slab * self.params.obj_size,
            ),
            kind: self.kind,
        }
    }

    /// CPU `cpu`'s magazines of this cache: allocations and frees they
    /// served, rounds they hold now. All zero for a CPU id out of range
    /// and for bootstrap caches (no magazine layer). Reads them on that
    /// CPU (a cross-CPU call), so the four figures are one exact snapshot.
    pub fn cpu_stats(&self, cpu: usize) -> CpuCacheStats {
        if !self.has_magazines() || cpu > self.last_cpu {
            return CpuCacheStats::default();
        }
        self.on_cpu(cpu, |pcc| pcc.stats())
    }
}
