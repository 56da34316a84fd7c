//! Walking one cache: [`KmemCache::verify`] (`kmem verify`), and in
//! debug builds the invariant walker ([`crate::debug::SlabDebug::check_invariants`]).

use super::KmemCache;
use crate::layout::freelist::{BadLink, map_test};
use crate::layout::geometry::SlabKind;
use crate::platform::Platform;
use crate::report::{ErrorKind, ErrorReport};
use crate::slab::Slab;
#[cfg(debug_assertions)]
use crate::verify::InvariantError;
use crate::verify::{Found, VerifySummary};

impl<P: Platform> KmemCache<P> {
    /// Walk every slab of this cache and check it: the free list of a
    /// small slab (links obfuscated and inside the slab, every free object
    /// on it exactly once, as the slab's bitmap says), the busy count,
    /// and, for a cache with debug flags, every object: free ones hold
    /// their poison, redzone and state; allocated ones their redzone.
    /// Each problem is reported (to the error ring and hook); nothing is
    /// changed (a corrupted free list is rebuilt at the next allocation).
    /// Takes the cache's slab lock for the walk.
    pub fn verify(&self) -> VerifySummary {
        let mut found = Found::new();
        let mut summary = VerifySummary {
            nr_caches: 1,
            ..VerifySummary::default()
        };
        {
            let layer = self.slab.lock();
            layer.for_each_slab(|slab| {
                summary.nr_slabs += 1;
                // SAFETY: slabs on our lists are alive; we hold the lock.
                summary.nr_objects += unsafe { self.verify_slab(slab, &mut found) };
            });
        }
        summary.nr_problems = found.report(|report| self.owner().report_error(report));
        summary
    }

    /// Check one slab; returns the number of objects looked at.
    ///
    /// # Safety
    /// `slab` is a live slab of this cache, under its slab lock.
    unsafe fn verify_slab(&self, slab: *mut Slab, found: &mut Found) -> usize {
        // SAFETY: per the caller.
        let (base, nr_busy, nr_objs) = unsafe { ((*slab).base, (*slab).nr_busy, (*slab).nr_objs) };
        let mut nr_objects = 0;
        if self.kind == SlabKind::Small {
            let list = self.params.free_list(base);
            // SAFETY: per the caller: the slab's list and map, locked.
            let checked = unsafe { list.check((*slab).free as usize, &(*slab).free_map) };
            match checked {
                Ok(nr_free) => {
                    nr_objects += nr_free;
                    if nr_free + nr_busy as usize != nr_objs as usize {
                        found.push(self.slab_report(slab, ErrorKind::FreeListCorrupted, None));
                    }
                }
                Err(bad) => {
                    found.push(self.slab_report(slab, ErrorKind::FreeListCorrupted, Some(bad)))
                }
            }
        }
        if let Some(layout) = self.debug.as_ref() {
            nr_objects = nr_objs as usize;
            for index in 0..nr_objs as usize {
                let addr = base + index * self.params.stride;
                // SAFETY: per the caller (small slabs: the bitmap is ours
                // under the lock).
                let free_in_slab =
                    self.kind == SlabKind::Small && map_test(unsafe { &(*slab).free_map }, index);
                // SAFETY: an object of a live slab of ours, read under the
                // slab lock (a caller may write an allocated object
                // meanwhile: then verify reports what it saw).
                let report =
                    unsafe { self.debug_verify_object(layout, addr, slab as usize, free_in_slab) };
                if let Some(report) = report {
                    found.push(report);
                }
            }
        }
        nr_objects
    }

    /// A report about a slab whose free list is broken.
    fn slab_report(&self, slab: *mut Slab, kind: ErrorKind, bad: Option<BadLink>) -> ErrorReport {
        // SAFETY: a live slab of ours (callers hold the lock).
        let base = unsafe { (*slab).base };
        let obj = bad.map_or(base, |bad| if bad.obj == 0 { base } else { bad.obj });
        let mut report = ErrorReport::new(kind, self.name(), obj);
        report.object = obj;
        report.slab = slab as usize;
        report.corruption = bad.map(|bad| crate::debug::Mismatch {
            offset: self.params.freeptr_offset,
            expected: 0,
            found: bad.decoded as u64,
        });
        report
    }
}

impl<P: Platform> KmemCache<P> {
    /// [`SlabDebug::check_invariants`](crate::debug::SlabDebug::check_invariants) for one cache.
    #[cfg(debug_assertions)]
    pub(crate) fn check_invariants(&self) -> Result<(), InvariantError> {
        let error = |what, addr| InvariantError {
            cache: crate::report::ReportName::new(self.name()),
            what,
            addr,
        };
        let mut nr_busy_total = 0;
        {
            let layer = self.slab.lock();
            let mut result = Ok(());
            layer.for_each_listed_slab(|slab, on_list_matches| {
                if result.is_err() {
                    return;
                }
                // SAFETY: listed slabs are alive; we hold the lock.
                let (magic, owner, base, nr_busy, nr_objs) = unsafe {
                    (
                        (*slab).magic,
                        (*slab).cache,
                        (*slab).base,
                        (*slab).nr_busy,
                        (*slab).nr_objs,
                    )
                };
                nr_busy_total += nr_busy as usize;
                if magic != crate::slab::SLAB_MAGIC || owner != (self as *const Self).cast() {
                    result = Err(error("slab not alive or not ours", slab as usize));
                } else if nr_busy > nr_objs || !on_list_matches {
                    result = Err(error("busy count and list disagree", slab as usize));
                } else if self.kind == SlabKind::Small {
                    let list = self.params.free_list(base);
                    // SAFETY: the slab's list and map, under the lock.
                    let free_map = unsafe { &(*slab).free_map };
                    // SAFETY: as above.
                    match unsafe { list.check((*slab).free as usize, free_map) } {
                        Ok(nr_free) if nr_free + nr_busy as usize == nr_objs as usize => {}
                        Ok(_) => {
                            result = Err(error("free objects + busy != objects", slab as usize))
                        }
                        Err(_) => result = Err(error("free list broken", slab as usize)),
                    }
                    debug_assert_eq!(
                        crate::layout::freelist::map_count(free_map),
                        nr_objs as usize - nr_busy as usize
                    );
                }
            });
            result?;
        }
        if self.is_bootstrap() {
            return Ok(());
        }
        // Every round must be a busy object start of one of our slabs.
        let bad_round = self.find_round(|round| match self.locate(round) {
            Ok(slab) if self.kind == SlabKind::Small => {
                let _layer = self.slab.lock();
                // SAFETY: located: a live slab of ours, under its lock.
                let base = unsafe { (*slab).base };
                // SAFETY: as above.
                map_test(
                    unsafe { &(*slab).free_map },
                    (round - base) / self.params.stride,
                )
            }
            Ok(_) => self.slab.lock().hash.find(round).is_null(),
            Err(_) => true,
        });
        if let Some(round) = bad_round {
            return Err(error("a round is not a busy object of this cache", round));
        }
        let stats = self.stats();
        if stats.nr_allocated + stats.nr_cpu_cached_objs + stats.nr_depot_objs != nr_busy_total {
            return Err(error("busy objects != allocated + rounds", nr_busy_total));
        }
        Ok(())
    }
}

impl<P: Platform> KmemCache<P> {
    /// The first round in a magazine (any CPU's, read on that CPU, then
    /// the depot's) for which `pred` holds. Call with no allocator lock
    /// held; `pred` may take this cache's slab lock.
    pub(crate) fn find_round(&self, pred: impl Fn(usize) -> bool + Sync) -> Option<usize> {
        if !self.has_magazines() {
            return None;
        }
        let search = |mag: *mut crate::magazine::Magazine| {
            // SAFETY: a magazine its holder owns (the CPU's own, read on
            // that CPU; or on a depot list, under the depot lock).
            let held = unsafe { crate::magazine::held_rounds(mag) };
            held.iter()
                .map(|&round| round as usize)
                .find(|&round| pred(round))
        };
        for cpu in 0..self.nr_cpus() {
            let found = self.on_cpu(cpu, |pcc| search(pcc.loaded).or_else(|| search(pcc.prev)));
            if found.is_some() {
                return found;
            }
        }
        let depot = self.depot.lock();
        let mut found = None;
        depot.for_each_magazine(|mag| {
            if found.is_none() {
                found = search(mag);
            }
        });
        found
    }
}

#[cfg(all(test, not(loom)))]
impl<P: Platform> KmemCache<P> {
    /// Test support: the rounds of CPU `cpu`'s `loaded` and `prev`,
    /// bottom first (read on that CPU).
    pub(crate) fn cpu_rounds(&self, cpu: usize) -> (std::vec::Vec<usize>, std::vec::Vec<usize>) {
        self.on_cpu(cpu, |pcc| {
            (rounds_of_magazine(pcc.loaded), rounds_of_magazine(pcc.prev))
        })
    }

    /// Test support: the rounds resting in the depot.
    pub(crate) fn depot_rounds(&self) -> std::vec::Vec<usize> {
        let mut rounds = std::vec::Vec::new();
        self.depot
            .lock()
            .for_each_magazine(|mag| rounds.extend(rounds_of_magazine(mag)));
        rounds
    }
}

/// The rounds of `mag`, owned by the caller (its CPU's, read on it; or a
/// depot magazine, under the depot lock), bottom first.
#[cfg(all(test, not(loom)))]
fn rounds_of_magazine(mag: *mut crate::magazine::Magazine) -> std::vec::Vec<usize> {
    // SAFETY: per our callers, the magazine is theirs to read.
    let held = unsafe { crate::magazine::held_rounds(mag) };
    held.iter().map(|&round| round as usize).collect()
}
