//! Giving memory back: [`Kmem::reap_all`], the working-set tick
//! [`Kmem::kmem_update`] (illumos `kmem_update` /
//! `kmem_reap_interval`) and the reap before an allocation fails for
//! want of pages; all walk the cache list in the order that leaves no
//! empty slab behind.

use core::cell::Cell;
use core::ptr::{self, NonNull};
use core::sync::atomic::Ordering;

use super::{BootCache, CacheList, Kmem};
use crate::cache::KmemCache;
use crate::platform::{PageSource, Platform};

impl<P: Platform> Kmem<P> {
    /// Reap every cache. Returns pages returned to page sources.
    ///
    /// Newest first, so that metadata freed by later caches (their slab
    /// structs, bufctls, magazines and cache structs) is reaped with the
    /// bootstrap caches at the end; and `kmem_slab` and `kmem_bufctl` come
    /// last of all, after `kmem_cache`, whose bufctl slabs
    /// (when their objects are large) free into them. So one call leaves no
    /// empty slab anywhere.
    pub fn reap_all(&self) -> usize {
        let list = self.caches.lock::<P>();
        self.reap_walk(&list, KmemCache::reap)
    }

    /// The periodic working-set tick (illumos `kmem_update`, every
    /// `kmem_reap_interval`): every cache's depot starts a new working-set
    /// interval ([`KmemCache::ws_update`]), then gives back what lay beyond
    /// the working set of the interval that ended ([`KmemCache::ws_reap`]:
    /// idle depot magazines, then empty slabs); a cache with no allocation
    /// or free for two whole intervals is reaped in full (its CPUs'
    /// magazines too), so its empty slabs come back. Returns pages returned to
    /// page sources. A kernel calls it from a timer tick or its idle loop,
    /// every few seconds; memory a burst left in magazines comes back
    /// after one idle interval. Call it as [`Kmem::reap_all`].
    pub fn kmem_update(&self) -> usize {
        let list = self.caches.lock::<P>();
        let mut cache = list.head;
        while !cache.is_null() {
            // SAFETY: as in for_each_cache.
            unsafe {
                (*cache).ws_update();
                cache = (*(*cache).links.get()).next;
            }
        }
        self.reap_walk(&list, |cache| {
            if cache.is_bootstrap() {
                cache.reap()
            } else {
                cache.ws_tick()
            }
        })
    }

    /// Out of memory: `source` could not give `nr_pages` pages. Reap
    /// caches until it can, then take them: of the caches that hold slabs,
    /// those with the largest objects first (their slabs empty with the
    /// fewest objects put back:
    /// the fewest instructions a page, and the small classes a workload
    /// churns keep their magazines), a power of two of object size at a
    /// time, newest first within one; the bootstrap caches last, in
    /// [`Kmem::reap_all`]'s order (the others' reaps free metadata into
    /// them). After each cache that gave pages back the request is tried
    /// again; if it still does not fit, every cache is reaped as
    /// [`Kmem::reap_all`] does and it is tried once more (so it fails only
    /// where a full reap and a retry would). Returns the pages, or
    /// `None`: still no room, or it could not reap (before init, in an
    /// interrupt handler, or the cache list is busy: this CPU may hold
    /// it, a `for_each_cache` callback allocating or a page source called
    /// under it).
    ///
    /// The pages are taken from `source` under the cache-list lock (as
    /// every reap gives pages back to sources under it).
    #[cold]
    #[inline(never)]
    pub(crate) fn reap_for_pressure(
        &self,
        source: &dyn PageSource,
        nr_pages: usize,
    ) -> Option<NonNull<u8>> {
        // No reap from an interrupt handler: it drains every CPU's
        // magazines by cross-CPU calls.
        if !self.is_ready() || P::in_interrupt() {
            return None;
        }
        let list = self.caches.try_lock::<P>()?;
        self.nr_pressure_reaps.fetch_add(1, Ordering::Relaxed);
        let taken = Cell::new(None);
        let reap = |cache: &KmemCache<P>| {
            if taken.get().is_none() && cache.reap() > 0 {
                taken.set(source.alloc_pages(nr_pages).ok());
            }
        };
        // The powers of two of object size among the caches that hold
        // slabs (a cache without one has no page to give).
        let mut orders = 0_u64;
        self.for_each_listed(&list, |cache| {
            if !cache.is_bootstrap() && cache.holds_slabs() {
                orders |= 1 << size_order(cache.params.obj_size);
            }
        });
        while orders != 0 {
            let order = orders.ilog2();
            orders &= !(1 << order);
            self.for_each_listed(&list, |cache| {
                if !cache.is_bootstrap()
                    && size_order(cache.params.obj_size) == order
                    && cache.holds_slabs()
                {
                    reap(cache);
                }
            });
            if taken.get().is_some() {
                return taken.get();
            }
        }
        self.reap_walk(&list, |cache| {
            if cache.is_bootstrap() {
                reap(cache);
            }
            0
        });
        if taken.get().is_some() {
            return taken.get();
        }
        // Still no room: every cache as reap_all does (the ones skipped
        // above hold empty magazines at most), and once more.
        self.reap_walk(&list, KmemCache::reap);
        source.alloc_pages(nr_pages).ok()
    }

    /// Call `visit` on every listed cache, newest first.
    fn for_each_listed(&self, list: &CacheList<P>, mut visit: impl FnMut(&KmemCache<P>)) {
        let mut cache = list.tail;
        while !cache.is_null() {
            // SAFETY: as in for_each_cache.
            unsafe {
                visit(&*cache);
                cache = (*(*cache).links.get()).prev;
            }
        }
    }

    /// Call `reap` on every cache, newest first, `kmem_bufctl` and
    /// `kmem_slab` last (see [`Kmem::reap_all`]); sum its results.
    fn reap_walk(
        &self,
        list: &CacheList<P>,
        mut reap: impl FnMut(&KmemCache<P>) -> usize,
    ) -> usize {
        // Before init completes, no deferring: one pass as listed. The
        // pointers are only compared, never dereferenced.
        let ready = self.is_ready();
        let boot_base = self.boot.get().cast::<KmemCache<P>>().cast_const();
        let last = [BootCache::Bufctl, BootCache::Slab].map(|which| {
            if ready {
                boot_base.wrapping_add(which as usize)
            } else {
                ptr::null()
            }
        });
        let mut cache = list.tail;
        let mut nr_pages = 0;
        while !cache.is_null() {
            // SAFETY: as in for_each_cache.
            unsafe {
                if !last.contains(&cache) {
                    nr_pages += reap(&*cache);
                }
                cache = (*(*cache).links.get()).prev;
            }
        }
        if ready {
            for which in [BootCache::Bufctl, BootCache::Slab] {
                nr_pages += reap(self.boot(which));
            }
        }
        nr_pages
    }
}

/// The power of two an object size falls in (`floor(log2(size))`, 0 for
/// 0; below 64 on a 64-bit machine): the pressure reap's order, largest
/// first.
fn size_order(obj_size: usize) -> u32 {
    obj_size.checked_ilog2().unwrap_or(0)
}
