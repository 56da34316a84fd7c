//! Walking the allocator to find corruption: `kmem verify` (illumos
//! `::kmem_verify`), `kmem whatis` (illumos `::whatis`), and, in debug
//! builds, the invariant walker the model tests run after every step.

use crate::debug::SlabDebug;
use core::fmt;

use crate::allocator::Kmem;
use crate::cache::KmemCache;
use crate::debug::{AuditRecord, CONTENTS_BYTES, DebugLayout, ObjectState};
use crate::layout::freelist::{BadLink, map_test};
use crate::layout::geometry::SlabKind;
use crate::platform::Platform;
use crate::reports::error::{ErrorKind, ErrorReport};
use crate::slab::Slab;

/// What a verify pass looked at and found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VerifySummary {
    /// Caches walked.
    pub nr_caches: usize,
    /// Slabs walked.
    pub nr_slabs: usize,
    /// Objects checked (every object of a debug cache; the free ones of
    /// other small-object caches, through their free lists).
    pub nr_objects: usize,
    /// Problems found (each one reported, at most
    /// `VERIFY_MAX_REPORTS` (8) per cache; the rest only counted).
    pub nr_problems: usize,
}

impl core::ops::Add for VerifySummary {
    type Output = VerifySummary;

    fn add(self, other: VerifySummary) -> VerifySummary {
        VerifySummary {
            nr_caches: self.nr_caches + other.nr_caches,
            nr_slabs: self.nr_slabs + other.nr_slabs,
            nr_objects: self.nr_objects + other.nr_objects,
            nr_problems: self.nr_problems + other.nr_problems,
        }
    }
}

/// Reports one verify of one cache keeps (they are made after its slab
/// lock is dropped).
pub const VERIFY_MAX_REPORTS: usize = 8;

/// Reports found under a lock, made after it is dropped.
pub(crate) struct Found {
    reports: [Option<ErrorReport>; VERIFY_MAX_REPORTS],
    nr: usize,
}

impl Found {
    pub(crate) const fn new() -> Found {
        Found {
            reports: [None; VERIFY_MAX_REPORTS],
            nr: 0,
        }
    }

    pub(crate) fn push(&mut self, report: ErrorReport) {
        if let Some(slot) = self.reports.get_mut(self.nr) {
            *slot = Some(report);
        }
        self.nr += 1;
    }

    /// Report everything kept; returns the number of problems found.
    pub(crate) fn report(self, mut send: impl FnMut(ErrorReport)) -> usize {
        for report in self.reports.into_iter().flatten() {
            send(report);
        }
        self.nr
    }
}

/// Where in an object's slot an address falls: the object, or what the
/// slot holds past it (a debug cache's redzone and trailer, alignment
/// padding).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ObjectRegion {
    /// Inside the object's bytes.
    Object,
    /// The redzone after the object (`REDZONE`).
    Redzone,
    /// The debug trailer's state word (allocated or free).
    StateWord,
    /// The debug trailer's free-list link.
    FreeListLink,
    /// The debug trailer's record of the size asked for (`REDZONE`).
    RequestedSize,
    /// The debug trailer's last-alloc and last-free records (`AUDIT`).
    AuditRecords,
    /// The debug trailer's copy of the contents at the last free
    /// (`CONTENTS`).
    SavedContents,
    /// Padding up to the next object (alignment).
    Padding,
}

impl ObjectRegion {
    /// Where `offset` (from the object start) falls in a slot of a cache
    /// of `obj_size`-byte objects with debug layout `layout`.
    pub(crate) fn of(offset: usize, obj_size: usize, layout: Option<&DebugLayout>) -> Self {
        if offset < obj_size {
            return ObjectRegion::Object;
        }
        let Some(layout) = layout else {
            return ObjectRegion::Padding;
        };
        let within = |start: Option<usize>, len: usize| {
            start.is_some_and(|start| (start..start + len).contains(&offset))
        };
        if offset < layout.redzone_end {
            ObjectRegion::Redzone
        } else if within(Some(layout.state_offset), 8) {
            ObjectRegion::StateWord
        } else if within(Some(layout.freeptr_offset), 8) {
            ObjectRegion::FreeListLink
        } else if within(layout.size_offset, 8) {
            ObjectRegion::RequestedSize
        } else if within(layout.audit_offset, 2 * core::mem::size_of::<AuditRecord>()) {
            ObjectRegion::AuditRecords
        } else if within(layout.contents_offset, CONTENTS_BYTES) {
            ObjectRegion::SavedContents
        } else {
            ObjectRegion::Padding
        }
    }

    /// How `whatis` names it.
    pub fn name(self) -> &'static str {
        match self {
            ObjectRegion::Object => "object",
            ObjectRegion::Redzone => "redzone",
            ObjectRegion::StateWord => "debug trailer (state word)",
            ObjectRegion::FreeListLink => "debug trailer (free-list link)",
            ObjectRegion::RequestedSize => "debug trailer (requested size)",
            ObjectRegion::AuditRecords => "debug trailer (audit records)",
            ObjectRegion::SavedContents => "debug trailer (saved contents)",
            ObjectRegion::Padding => "padding",
        }
    }
}

/// What `whatis` found out about an address (illumos `::whatis`).
pub struct WhatIs<P: Platform> {
    /// The address asked about.
    pub addr: usize,
    /// The cache whose slab holds it.
    pub cache: &'static KmemCache<P>,
    /// Start of the object holding it.
    pub object: usize,
    /// `addr - object`; beyond the object size: in its redzone, debug
    /// trailer or padding (`region` says which).
    pub offset: usize,
    /// Where in the object's slot `addr` falls.
    pub region: ObjectRegion,
    /// The slab.
    pub slab: usize,
    /// With a caller (debug caches: by its state word; others: neither in
    /// its slab's free list nor in a magazine).
    pub allocated: bool,
    /// Where a free object rests: `"slab"` or `"magazine"`.
    pub resting: &'static str,
    /// Last allocation (`AUDIT`).
    pub last_alloc: Option<AuditRecord>,
    /// Last free (`AUDIT`).
    pub last_free: Option<AuditRecord>,
}

impl<P: Platform> Kmem<P> {}

/// An allocator invariant that does not hold ([`SlabDebug::check_invariants`](crate::debug::SlabDebug::check_invariants)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InvariantError {
    /// The cache.
    pub cache: crate::reports::error::ReportName,
    /// What is wrong.
    pub what: &'static str,
    /// The slab or object concerned (0 if none).
    pub addr: usize,
}

impl fmt::Display for InvariantError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {} ({:#x})", self.cache, self.what, self.addr)
    }
}

impl<P: Platform> Kmem<P> {}

impl<P: Platform> SlabDebug<'_, P> {
    /// [`KmemCache::verify`] for every cache, summed.
    pub fn verify(&self) -> VerifySummary {
        let mut summary = VerifySummary::default();
        self.heap
            .for_each_cache(|cache| summary = summary + cache.verify());
        summary
    }

    /// Which cache, object and offset an address belongs to, and whether
    /// the object is allocated; `None` for an address outside every slab
    /// of the primary source (page-granular kmalloc, or not ours).
    pub fn whatis(&self, addr: usize) -> Option<WhatIs<P>> {
        if !self.heap.is_ready() {
            return None;
        }
        let entry = self.heap.page_map().get(addr);
        let Some(slab) = entry.slab() else {
            // KFENCE HOOK: a sample is in no slab.
            return self.heap.kfence_whatis(addr);
        };
        let slab = slab as *mut Slab;
        // SAFETY: registered slabs are alive and belong to caches of this
        // allocator.
        let cache: &'static KmemCache<P> = unsafe { &*(*slab).cache.cast::<KmemCache<P>>() };
        // SAFETY: as above.
        let base = unsafe { (*slab).base };
        let index = addr.wrapping_sub(base) / cache.params.stride;
        if index >= cache.params.nr_objs_per_slab {
            return None;
        }
        let object = base + index * cache.params.stride;
        let mut info = WhatIs {
            addr,
            cache,
            object,
            offset: addr - object,
            region: ObjectRegion::of(addr - object, cache.obj_size(), cache.debug.as_ref()),
            slab: slab as usize,
            allocated: true,
            resting: "slab",
            last_alloc: None,
            last_free: None,
        };
        let in_slab = {
            let _layer = cache.slab.lock();
            match cache.kind {
                // SAFETY: a live slab of `cache`, under its lock.
                SlabKind::Small => map_test(unsafe { &(*slab).free_map }, index),
                SlabKind::Bufctl => _layer.hash.find(object).is_null(),
            }
        };
        if let Some(layout) = cache.debug.as_ref() {
            // SAFETY: an object start of a live slab of `cache`; read only.
            let debug = unsafe { cache.debug_object_info(layout, object) };
            info.allocated = !in_slab && debug.state == ObjectState::Allocated;
            info.last_alloc = debug.last_alloc;
            info.last_free = debug.last_free;
        } else if in_slab {
            info.allocated = false;
        } else {
            info.allocated = cache.find_round(|round| round == object).is_none();
        }
        if !in_slab {
            info.resting = "magazine";
        }
        Some(info)
    }

    /// Walk every cache and check the allocator's invariants (debug
    /// builds; the model tests run it after every step):
    ///
    /// - every slab is alive, belongs to its cache, sits on the list its
    ///   busy count says, and has `nr_busy <= nr_objs`;
    /// - a small slab's free list holds exactly the objects its bitmap
    ///   marks free, each once, links inside the slab at object starts,
    ///   and `free + busy = objects`;
    /// - every round in a magazine or the depot is a busy object start of
    ///   a slab of its cache;
    /// - busy objects (sum of `nr_busy`) = objects with callers + rounds
    ///   in magazines and the depot (the cache's statistics);
    /// - with no error reported by `verify` for debug caches.
    ///
    /// # Errors
    /// The first invariant found broken.
    #[cfg(debug_assertions)]
    pub fn check_invariants(&self) -> Result<(), InvariantError> {
        let mut result = Ok(());
        self.heap.for_each_cache(|cache| {
            if result.is_ok() {
                result = cache.check_invariants();
            }
        });
        result
    }
}

// The cache's walk: `KmemCache::verify`, the invariant walker.

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
            let checked = unsafe {
                list.check(
                    (*slab).free as usize,
                    &(*slab).free_map,
                    (*slab).nr_fresh.into(),
                )
            };
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
            cache: crate::reports::error::ReportName::new(self.name()),
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
                    match unsafe {
                        list.check((*slab).free as usize, free_map, (*slab).nr_fresh.into())
                    } {
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
