//! Walking the allocator to find corruption: `kmem verify` (illumos
//! `::kmem_verify`), `kmem whatis` (illumos `::whatis`), and, in debug
//! builds, the invariant walker the model tests run after every step.

use crate::debug::SlabDebug;
use core::fmt;

use crate::allocator::Kmem;
use crate::cache::KmemCache;
use crate::debug::{AuditRecord, CONTENTS_BYTES, DebugLayout, ObjectState};
use crate::layout::freelist::map_test;
use crate::layout::geometry::SlabKind;
use crate::platform::Platform;
use crate::report::ErrorReport;
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
