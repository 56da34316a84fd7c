//! Giving memory back: [`KmemCache::reap`], the depot working set
//! (`ws_update`, `ws_reap`), and the tick's idle drain (`ws_tick`): a
//! cache with no allocation or free for [`IDLE_INTERVALS`] whole
//! intervals gives back its CPUs' magazines too, and so its empty slabs.

use core::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use super::KmemCache;
use crate::platform::Platform;

/// Whole idle working-set intervals after which the tick drains a cache's
/// per-CPU magazines as well as its depot (its slabs then empty out and go
/// back to the page source).
pub const IDLE_INTERVALS: u32 = 2;

/// What the working-set tick remembers of a cache between ticks: its
/// allocations plus frees at the last tick, and how many ticks in a row
/// saw none. Written only by the tick (under the allocator's cache-list
/// lock), so relaxed atomics suffice.
pub(crate) struct IdleTicks {
    last_nr_ops: AtomicU64,
    nr_idle: AtomicU32,
}

impl IdleTicks {
    pub(crate) const fn new() -> IdleTicks {
        IdleTicks {
            last_nr_ops: AtomicU64::new(0),
            nr_idle: AtomicU32::new(0),
        }
    }
}

impl<P: Platform> KmemCache<P> {
    /// Return free memory: empty every CPU's magazines and the depot
    /// (destructing their objects into the slab layer), then give every
    /// empty slab back to the page source. Returns the number of pages
    /// returned.
    ///
    /// All CPUs' magazines are drained, not only this CPU's, each by its
    /// own CPU in a [cross-CPU call](Platform::cross_cpu_call); those CPUs
    /// refill from the depot or the slab layer next time. Call it with
    /// interrupts enabled and no allocator lock held (not from a
    /// constructor, destructor or page source).
    pub fn reap(&self) -> usize {
        self.drain_magazines();
        // Empty slabs back, and the bufctl hash shrunk back to its inline
        // buckets if it emptied (those pages are metadata and are not
        // counted in the result).
        let nr_pages = self.reap_slabs();
        self.trace.shrink(self);
        nr_pages
    }

    /// What a reap of this cache could give back, and its price: the
    /// objects out of its slabs (in magazines, or live) and the pages its
    /// slabs hold; `None` if it holds no slab (no page to give). One
    /// lock acquisition, no walk. The object count is the slab layer's
    /// takes less its returns.
    pub(crate) fn slab_occupancy(&self) -> Option<(u64, u64)> {
        let lists = self.slab.lock();
        let nr_slabs: usize = lists.lists.iter().map(|list| list.nr).sum();
        if nr_slabs == 0 {
            return None;
        }
        let nr_pages = (nr_slabs * self.params.nr_pages_per_slab) as u64;
        Some((lists.nr_allocs.saturating_sub(lists.nr_frees), nr_pages))
    }

    /// Start a new working-set interval for this cache's depot (Bonwick &
    /// Adams 2001 §3.7; illumos `kmem_depot_ws_update`): the fewest full
    /// and empty magazines the depot held since the last update become
    /// what the next [`KmemCache::ws_reap`] may free. A kernel calls
    /// [`Kmem::kmem_update`](crate::Kmem::kmem_update) from a
    /// periodic tick instead of this.
    pub fn ws_update(&self) {
        if self.has_magazines() {
            self.depot.ws_update();
        }
    }

    /// Give back what lies beyond the working set: the depot magazines
    /// (full and empty) that no CPU needed during the last whole interval,
    /// their rounds destructed into the slab layer; then every empty slab
    /// to the page source. Per-CPU magazines stay (no cross-CPU call).
    /// Returns pages returned. Call it as [`KmemCache::reap`].
    pub fn ws_reap(&self) -> usize {
        if self.has_magazines() {
            let (full, empty) = self.depot.ws_take();
            // SAFETY: detached from our depot; ours alone now.
            unsafe { self.free_magazines(&[full, empty]) };
        }
        self.reap_slabs()
    }

    /// One working-set tick of this cache ([`Kmem::kmem_update`]):
    /// [`KmemCache::ws_reap`], and when the cache has been idle (no
    /// allocation or free on any CPU) for [`IDLE_INTERVALS`] whole
    /// intervals, a full [`KmemCache::reap`]: the CPUs' magazines are
    /// drained too, so its empty slabs go back rather than stay pinned by
    /// rounds nobody will use. Reads every CPU's counters (cross-CPU
    /// calls) only for a cache that has slabs. Returns pages returned.
    ///
    /// [`Kmem::kmem_update`]: crate::Kmem::kmem_update
    pub(crate) fn ws_tick(&self) -> usize {
        if !self.has_magazines() || self.slab.lock().counts().nr_slabs == 0 {
            self.idle.nr_idle.store(0, Ordering::Relaxed);
            return self.ws_reap();
        }
        let nr_ops = (0..self.nr_cpus())
            .map(|cpu| {
                let stats = self.cpu_stats(cpu);
                stats.nr_allocs.wrapping_add(stats.nr_frees)
            })
            .fold(
                self.nr_allocs_direct
                    .load(Ordering::Relaxed)
                    .wrapping_add(self.nr_frees_direct.load(Ordering::Relaxed)),
                u64::wrapping_add,
            );
        let idle = self.idle.last_nr_ops.swap(nr_ops, Ordering::Relaxed) == nr_ops;
        let nr_idle = if idle {
            self.idle.nr_idle.load(Ordering::Relaxed).saturating_add(1)
        } else {
            0
        };
        self.idle.nr_idle.store(nr_idle, Ordering::Relaxed);
        if nr_idle >= IDLE_INTERVALS {
            self.reap()
        } else {
            self.ws_reap()
        }
    }
}
