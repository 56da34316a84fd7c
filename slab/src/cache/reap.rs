//! Giving memory back: [`KmemCache::reap`] and the depot working set
//! (`ws_update`, `ws_reap`).

use super::KmemCache;
use crate::platform::Platform;

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
        let nr_pages = self.reap_slabs();
        // Shrink empty hash tables back to their inline buckets (these
        // pages are metadata and are not counted in the result).
        self.free_hash_table();
        self.free_trace_table();
        nr_pages
    }

    /// Start a new working-set interval for this cache's depot (Bonwick &
    /// Adams 2001 §3.7; illumos `kmem_depot_ws_update`): the fewest full
    /// and empty magazines the depot held since the last update become
    /// what the next [`KmemCache::ws_reap`] may free. A kernel calls
    /// [`Allocator::kmem_update`](crate::Allocator::kmem_update) from a
    /// periodic tick instead of this.
    pub fn ws_update(&self) {
        if !self.pcpu.is_null() {
            self.depot.ws_update();
        }
    }

    /// Give back what lies beyond the working set: the depot magazines
    /// (full and empty) that no CPU needed during the last whole interval,
    /// their rounds destructed into the slab layer; then every empty slab
    /// to the page source. Per-CPU magazines stay (no cross-CPU call).
    /// Returns pages returned. Call it as [`KmemCache::reap`].
    pub fn ws_reap(&self) -> usize {
        if !self.pcpu.is_null() {
            let (full, empty) = self.depot.ws_take();
            // SAFETY: detached from our depot; ours alone now.
            unsafe { self.free_magazine_lists(full, empty) };
        }
        let nr_pages = self.reap_slabs();
        self.free_hash_table();
        nr_pages
    }
}
