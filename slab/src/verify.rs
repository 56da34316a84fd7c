//! Walking the allocator to find corruption: `kmem verify` (illumos
//! `::kmem_verify`), `kmem whatis` (illumos `::whatis`), and, in debug
//! builds, the invariant walker the model tests run after every step.

use core::fmt;

use crate::allocator::Allocator;
use crate::cache::KmemCache;
use crate::debug::{AuditRecord, ObjectState};
use crate::freelist::{BadLink, map_test};
use crate::geometry::SlabKind;
use crate::pagemap::{TAG_MASK, TAG_SLAB};
use crate::platform::Platform;
use crate::report::{ErrorKind, ErrorReport, RawFormat, ReportFormat, write_transaction};
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
    /// [`VERIFY_MAX_REPORTS`] per cache; the rest only counted).
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
    pub(crate) fn report<P: Platform>(self, owner: &Allocator<P>) -> usize {
        for report in self.reports.into_iter().flatten() {
            owner.report_error(report);
        }
        self.nr
    }
}

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
        summary.nr_problems = found.report(self.owner());
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
            let list = self.free_list(base);
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
                let addr = base + index * self.stride;
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
            offset: self.freeptr_offset,
            expected: 0,
            found: bad.decoded as u64,
        });
        report
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
    /// `addr - object`; beyond the object size: in its redzone or trailer.
    pub offset: usize,
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

impl<P: Platform> WhatIs<P> {
    /// The answer as text, frames and times rendered by `format`:
    ///
    /// ```text
    /// 0xffff800000123050 is allocated from kmalloc-64: object 0xffff800000123040+0x10 of 64 bytes, slab 0x...
    /// last alloc transaction on buffer 0xffff800000123040:
    /// thread=cpu0  time=T+1.234567s  slab=0x...  cache: kmalloc-64
    ///   #01 [<0x...>] function+0xoff
    /// ```
    pub fn display<'a>(&'a self, format: &'a dyn ReportFormat) -> WhatIsDisplay<'a, P> {
        WhatIsDisplay { info: self, format }
    }
}

/// [`WhatIs`] as text: see [`WhatIs::display`].
pub struct WhatIsDisplay<'a, P: Platform> {
    info: &'a WhatIs<P>,
    format: &'a dyn ReportFormat,
}

impl<P: Platform> fmt::Display for WhatIsDisplay<'_, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let info = self.info;
        if info.allocated {
            write!(
                f,
                "{:#x} is allocated from {}",
                info.addr,
                info.cache.name()
            )?;
        } else {
            write!(
                f,
                "{:#x} is free in {} (in a {})",
                info.addr,
                info.cache.name(),
                info.resting
            )?;
        }
        writeln!(
            f,
            ": object {:#x}+{:#x} of {} bytes, slab {:#x}",
            info.object,
            info.offset,
            info.cache.obj_size(),
            info.slab
        )?;
        for (which, record) in [
            ("last alloc", info.last_alloc),
            ("last free", info.last_free),
        ] {
            if let Some(record) = record.filter(AuditRecord::is_recorded) {
                write_transaction(
                    f,
                    which,
                    info.object,
                    &record,
                    info.slab,
                    info.cache.name(),
                    self.format,
                )?;
            }
        }
        Ok(())
    }
}

impl<P: Platform> fmt::Display for WhatIs<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.display(&RawFormat), f)
    }
}

impl<P: Platform> Allocator<P> {
    /// [`KmemCache::verify`] for every cache, summed.
    pub fn verify(&self) -> VerifySummary {
        let mut summary = VerifySummary::default();
        self.for_each_cache(|cache| summary = summary + cache.verify());
        summary
    }

    /// Which cache, object and offset an address belongs to, and whether
    /// the object is allocated; `None` for an address outside every slab
    /// of the primary source (page-granular kmalloc, or not ours).
    pub fn whatis(&self, addr: usize) -> Option<WhatIs<P>> {
        if !self.is_ready() {
            return None;
        }
        let entry = self.page_map().get(addr);
        if entry & TAG_MASK != TAG_SLAB {
            return None;
        }
        let slab = (entry & !TAG_MASK) as *mut Slab;
        // SAFETY: registered slabs are alive and belong to caches of this
        // allocator.
        let cache: &'static KmemCache<P> = unsafe { &*(*slab).cache.cast::<KmemCache<P>>() };
        // SAFETY: as above.
        let base = unsafe { (*slab).base };
        let index = (addr - base) / cache.stride;
        if index >= cache.nr_objs_per_slab {
            return None;
        }
        let object = base + index * cache.stride;
        let mut info = WhatIs {
            addr,
            cache,
            object,
            offset: addr - object,
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
}

/// An allocator invariant that does not hold ([`Allocator::check_invariants`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InvariantError {
    /// The cache.
    pub cache: crate::report::ReportName,
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

impl<P: Platform> Allocator<P> {
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
        self.for_each_cache(|cache| {
            if result.is_ok() {
                result = cache.check_invariants();
            }
        });
        result
    }
}

impl<P: Platform> KmemCache<P> {
    /// [`Allocator::check_invariants`] for one cache.
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
                    let list = self.free_list(base);
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
                        crate::freelist::map_count(free_map),
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
                map_test(unsafe { &(*slab).free_map }, (round - base) / self.stride)
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
        if self.pcpu.is_null() {
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
