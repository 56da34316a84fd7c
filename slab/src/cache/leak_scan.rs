//! The cache's part of the reachability leak scan ([`crate::leak_scan`]):
//! its busy objects, and which of them rest in magazines.

use crate::alloc_tag::AllocTagRef;
use crate::cache::KmemCache;
use crate::layout::freelist::map_test;
use crate::layout::geometry::SlabKind;
use crate::platform::Platform;

impl<P: Platform> KmemCache<P> {
    /// Call `f(object, site)` for every busy object of this cache (busy in
    /// the slab layer: with a caller, or resting in a magazine; see
    /// [`KmemCache::find_round`] for the latter), under the slab lock.
    /// `site` is the object's allocation-tag charge token, if it has one.
    pub(crate) fn for_each_busy_object(&self, mut f: impl FnMut(usize, Option<AllocTagRef>)) {
        let stride = self.params.stride;
        let layer = self.slab.lock();
        layer.for_each_slab(|slab| {
            // SAFETY: listed slabs are alive and ours; we hold their lock.
            let (base, nr_objs) = unsafe { ((*slab).base, usize::from((*slab).nr_objs)) };
            for index in 0..nr_objs {
                let object = base + index * stride;
                match self.kind {
                    SlabKind::Small => {
                        // SAFETY: as above.
                        if map_test(unsafe { &(*slab).free_map }, index) {
                            continue;
                        }
                        // SAFETY: as above; the side array (or the shared
                        // all-`None` one) has a slot per object.
                        #[cfg(feature = "alloc-profiling")]
                        let site = unsafe {
                            let tags = (*slab).tags.load(core::sync::atomic::Ordering::Acquire);
                            if tags == crate::alloc_tag::no_tags() {
                                None
                            } else {
                                tags.add(index).read()
                            }
                        };
                        #[cfg(not(feature = "alloc-profiling"))]
                        let site = None;
                        f(object, site);
                    }
                    SlabKind::Bufctl => {
                        let bufctl = layer.hash.find(object);
                        if bufctl.is_null() {
                            continue;
                        }
                        // SAFETY: bufctls in the hash are alive; we hold
                        // the lock.
                        #[cfg(feature = "alloc-profiling")]
                        let site = unsafe { (*bufctl).tag };
                        #[cfg(not(feature = "alloc-profiling"))]
                        let site = None;
                        f(object, site);
                    }
                }
            }
        });
    }
}
