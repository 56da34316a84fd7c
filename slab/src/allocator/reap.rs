//! Giving memory back: [`Kmem::reap_all`], the working-set tick
//! [`Kmem::kmem_update`] (illumos `kmem_update` /
//! `kmem_reap_interval`) and the reap before an allocation fails for
//! want of pages; all walk the cache list in the order that leaves no
//! empty slab behind.

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
    /// last of all, after `kmem_cache` and the tag side-array caches, whose
    /// slab headers free into `kmem_slab`. So one call leaves no
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
    /// caches one at a time until it can, then take them: of the caches
    /// that hold slabs, the cheapest first, the fewest objects out of
    /// their slabs a page (each a magazine round to put back, or a live
    /// object that keeps its page: a class a workload churns keeps its
    /// magazines while idle classes give their pages back), the request
    /// tried after each cache that gave pages back (up to `NR_RANKED`
    /// caches); then the bootstrap caches in [`Kmem::reap_all`]'s order
    /// (the others' reaps free metadata into them); then every cache as
    /// [`Kmem::reap_all`] does, and it is tried once more (so it fails
    /// only where a full reap and a retry would). Returns the pages, or
    /// `None`: still no room, or it could not reap (before init, in an
    /// interrupt handler, or the cache list is busy: this CPU may hold
    /// it, a `for_each_cache` callback allocating or a page source called
    /// under it).
    ///
    /// `source` is called with none of the allocator's locks held: a
    /// kernel's page source may reap on its own when it runs dry
    /// ([`Kmem::reap_all`] takes the cache-list lock; the kernel's `kpages`
    /// does), which under the lock would never return (the README's
    /// `kmalloc 1048576 1000` session hung that way).
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
        // One cache at a time, the cheapest not reaped yet, under the
        // lock; the source is tried after each unlock. The caches are
        // ranked again each time (the list may change while it is
        // unlocked; a cache reaped is remembered by address, which at
        // worst skips a new cache at the same place).
        let mut reaped = [ptr::null::<KmemCache<P>>(); NR_RANKED];
        for nr_reaped in 0..NR_RANKED {
            let nr_back = {
                let list = self.caches.try_lock::<P>()?;
                if nr_reaped == 0 {
                    self.nr_pressure_reaps.fetch_add(1, Ordering::Relaxed);
                }
                let Some(cache) = self.cheapest(&list, &reaped[..nr_reaped]) else {
                    break;
                };
                reaped[nr_reaped] = cache;
                // SAFETY: a listed cache, and the list is locked: alive.
                unsafe { &*cache }.reap()
            };
            if nr_back > 0
                && let Ok(pages) = source.alloc_pages(nr_pages)
            {
                return Some(pages);
            }
        }
        // Then the bootstrap caches (the others' reaps freed metadata
        // into them), and if it still does not fit, every cache as
        // reap_all does (the ones skipped above hold empty magazines at
        // most).
        for everything in [false, true] {
            let list = self.caches.try_lock::<P>()?;
            self.reap_walk(&list, |cache| {
                if everything || cache.is_bootstrap() {
                    cache.reap()
                } else {
                    0
                }
            });
            drop(list);
            if let Ok(pages) = source.alloc_pages(nr_pages) {
                return Some(pages);
            }
        }
        None
    }

    /// The cheapest cache to reap under pressure, of those that hold
    /// slabs and are not bootstrap caches nor in `skip`: the fewest
    /// objects out of its slabs a page (each a magazine round to put
    /// back, or a live object that keeps its page); the newest among
    /// equals.
    fn cheapest(
        &self,
        list: &CacheList<P>,
        skip: &[*const KmemCache<P>],
    ) -> Option<*const KmemCache<P>> {
        let mut best: Option<Ranked<P>> = None;
        self.for_each_listed(list, |cache| {
            let ptr: *const KmemCache<P> = cache;
            if cache.is_bootstrap() || skip.contains(&ptr) {
                return;
            }
            let Some((nr_busy, nr_pages)) = cache.slab_occupancy() else {
                return;
            };
            let this = Ranked {
                cache: ptr,
                nr_busy,
                nr_pages,
            };
            if best.is_none_or(|best| this.cheaper_than(&best)) {
                best = Some(this);
            }
        });
        best.map(|best| best.cache)
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

/// Caches a pressure reap reaps one at a time, the source tried after
/// each (their addresses on its stack); the rest wait for its last,
/// full pass.
const NR_RANKED: usize = 32;

/// A cache as the pressure reap ranks it ([`KmemCache::slab_occupancy`]).
struct Ranked<P: Platform> {
    cache: *const KmemCache<P>,
    nr_busy: u64,
    nr_pages: u64,
}

// Not derived: that would ask `P: Copy`.
impl<P: Platform> Clone for Ranked<P> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<P: Platform> Copy for Ranked<P> {}

impl<P: Platform> Ranked<P> {
    /// Fewer objects out of its slabs a page than `other` (compared as
    /// `busy / pages` without dividing).
    fn cheaper_than(&self, other: &Self) -> bool {
        u128::from(self.nr_busy) * u128::from(other.nr_pages)
            < u128::from(other.nr_busy) * u128::from(self.nr_pages)
    }
}
