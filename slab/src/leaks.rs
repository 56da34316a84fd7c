//! Leaks by reachability (illumos `::findleaks`, Linux kmemleak): which
//! allocated objects has nothing pointing to them?
//!
//! [`Allocator::find_leaks`] takes the roots from the kernel (its data and
//! bss, every CPU's stack and saved registers, per-CPU areas: memory only
//! the kernel can name) and
//!
//! 1. lists every object a caller holds, in every cache but the bootstrap
//!    ones (the allocator's own metadata): busy in its slab (not on the
//!    free list, or in the bufctl hash) and not resting in a magazine or
//!    the depot (a keyed cache: the free key in its first word; a debug
//!    cache: its state word; else a search of the magazines). The list
//!    lives in pages taken from the page source for the scan, sorted by
//!    address;
//! 2. marks, conservatively, every object a word of the roots points into
//!    (anywhere inside it), then every object a word of a marked object
//!    points into, to a fixed point (a worklist in the same pages);
//! 3. hands the rest, grouped by cache and allocation site (the object's
//!    allocation tag with profiling, or the first frame of its last
//!    allocation with `AUDIT`), to the caller, which prints them in the
//!    `::findleaks` layout ([`write_findleaks_header`],
//!    [`write_findleaks_row`], [`write_findleaks_total`]).
//!
//! Conservative: a stale word that happens to point into a leaked object
//! hides it (a false negative, never a false positive). The scan runs with
//! no lock held across caches and reads memory other CPUs may be writing:
//! run it on a quiet system. Page-granular kmalloc blocks are not scanned
//! (left out).

use core::fmt;
use core::ptr::NonNull;

use crate::alloc_tag::AllocTagRef;
use crate::allocator::Allocator;
use crate::cache::KmemCache;
use crate::error::AllocError;
use crate::layout::freelist::map_test;
use crate::layout::geometry::SlabKind;
use crate::platform::{PAGE_SIZE, Platform};

/// Leaked objects of one cache from one allocation site.
pub struct LeakGroup<P: Platform> {
    /// The cache.
    pub cache: &'static KmemCache<P>,
    /// Objects leaked.
    pub nr_leaked: usize,
    /// Their bytes (object size each).
    pub bytes: usize,
    /// The lowest leaked object (illumos prints a bufctl; `whatis` it).
    pub first: usize,
    /// The allocation tag the objects were charged to (profiling), if any.
    pub tag: Option<AllocTagRef>,
    /// The first frame of the last allocation (`AUDIT` caches), or 0.
    pub alloc_frame: usize,
}

impl<P: Platform> Clone for LeakGroup<P> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<P: Platform> Copy for LeakGroup<P> {}

impl<P: Platform> fmt::Debug for LeakGroup<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeakGroup")
            .field("cache", &self.cache.name())
            .field("nr_leaked", &self.nr_leaked)
            .field("bytes", &self.bytes)
            .field("first", &self.first)
            .field("alloc_frame", &self.alloc_frame)
            .finish_non_exhaustive()
    }
}

/// What a scan found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LeakSummary {
    /// Objects callers hold (candidates).
    pub nr_objects: usize,
    /// Of them, unreachable from the roots.
    pub nr_leaked: usize,
    /// Their bytes.
    pub bytes_leaked: usize,
    /// Groups handed to the caller.
    pub nr_groups: usize,
}

/// One held object in the scan's table.
#[derive(Clone, Copy)]
struct Candidate {
    addr: usize,
    size: usize,
    /// The cache, as an address (`&'static KmemCache<P>`).
    cache: usize,
    marked: bool,
}

/// The `::findleaks` rule before the total.
const RULE: &str = "------------------------------------------------------------------------";

/// Groups kept apart at most; the rest are merged into the last.
const MAX_GROUPS: usize = 64;

impl<P: Platform> Allocator<P> {
    /// Find the objects nothing points to (see the [module docs](self)):
    /// mark from `roots` (address ranges, each `(start, end)`), then call
    /// `report` once per group of unreachable objects, largest first.
    ///
    /// # Errors
    /// [`AllocError::OutOfMemory`] if the page source cannot give the
    /// scan's table; [`AllocError::InvalidLayout`] before init.
    ///
    /// # Safety
    /// Every root range is readable memory for the whole scan.
    pub unsafe fn find_leaks(
        &self,
        roots: &[(usize, usize)],
        report: &mut dyn FnMut(&LeakGroup<P>),
    ) -> Result<LeakSummary, AllocError> {
        // SAFETY: per our caller.
        unsafe { self.find_leaks_from(roots.iter().copied(), report) }
    }

    /// [`Self::find_leaks`] with roots that are word slices (always
    /// readable): safe.
    ///
    /// # Errors
    /// As for [`Self::find_leaks`].
    pub fn find_leaks_in(
        &self,
        roots: &[&[usize]],
        report: &mut dyn FnMut(&LeakGroup<P>),
    ) -> Result<LeakSummary, AllocError> {
        let ranges = roots.iter().map(|words| {
            let start = words.as_ptr() as usize;
            (start, start + core::mem::size_of_val(*words))
        });
        // SAFETY: each range is a live slice, readable during the scan.
        unsafe { self.find_leaks_from(ranges, report) }
    }

    /// The scan, roots from an iterator.
    ///
    /// # Safety
    /// As for [`Self::find_leaks`].
    #[expect(
        clippy::cast_ptr_alignment,
        reason = "the table starts a page; the worklist follows whole candidates (8-aligned)"
    )]
    unsafe fn find_leaks_from(
        &self,
        roots: impl Iterator<Item = (usize, usize)>,
        report: &mut dyn FnMut(&LeakGroup<P>),
    ) -> Result<LeakSummary, AllocError> {
        if !self.is_ready() {
            return Err(AllocError::InvalidLayout);
        }
        let mut nr_held = 0;
        self.for_each_cache(|cache| {
            if !cache.is_bootstrap() {
                nr_held += cache.stats().nr_allocated;
            }
        });
        // Room for what is held now, and some that may come meanwhile.
        let capacity = nr_held + nr_held / 4 + 64;
        let bytes = capacity * (core::mem::size_of::<Candidate>() + 4);
        let nr_pages = bytes.div_ceil(PAGE_SIZE);
        let source = self.primary_source();
        let pages = source.alloc_pages(nr_pages)?;
        // SAFETY: fresh pages of ours, aligned for Candidate (a page), with
        // room for `capacity` candidates then `capacity` u32 indices.
        let (table, worklist) = unsafe {
            let table =
                core::slice::from_raw_parts_mut(pages.as_ptr().cast::<Candidate>(), capacity);
            let worklist = core::slice::from_raw_parts_mut(
                pages
                    .as_ptr()
                    .add(capacity * core::mem::size_of::<Candidate>())
                    .cast::<u32>(),
                capacity,
            );
            (table, worklist)
        };
        let nr = self.collect_held(table);
        let table = &mut table[..nr];
        table.sort_unstable_by_key(|candidate| candidate.addr);
        let mut scan = Marker {
            table,
            worklist,
            nr_pending: 0,
        };
        for (start, end) in roots {
            // SAFETY: per our caller.
            unsafe { scan.scan_range(start, end) };
        }
        scan.drain();
        let summary = self.report_unmarked(scan.table, report);
        // SAFETY: the pages taken above, no longer used.
        unsafe { source.free_pages(pages, nr_pages) };
        Ok(summary)
    }

    /// Fill `table` with the objects callers hold; returns how many (at
    /// most the table's length).
    fn collect_held(&self, table: &mut [Candidate]) -> usize {
        let mut nr = 0;
        self.for_each_cache(|cache| {
            if cache.is_bootstrap() {
                return;
            }
            let first = nr;
            let layer = cache.slab.lock();
            layer.for_each_slab(|slab| {
                // SAFETY: a listed slab of ours, under its lock.
                let (base, nr_objs) = unsafe { ((*slab).base, (*slab).nr_objs as usize) };
                for index in 0..nr_objs {
                    let addr = base + index * cache.params.stride;
                    let free = match cache.kind {
                        // SAFETY: as above.
                        SlabKind::Small => map_test(unsafe { &(*slab).free_map }, index),
                        SlabKind::Bufctl => layer.hash.find(addr).is_null(),
                    };
                    if !free && nr < table.len() {
                        table[nr] = Candidate {
                            addr,
                            size: cache.obj_size(),
                            cache: cache as *const KmemCache<P> as usize,
                            marked: false,
                        };
                        nr += 1;
                    }
                }
            });
            drop(layer);
            // Objects resting in a magazine or the depot are not held.
            let mut kept = first;
            for at in first..nr {
                let addr = table[at].addr;
                // SAFETY: an object start of a live slab of `cache` (a
                // slab may go only when all its objects are free).
                if !unsafe { cache.is_resting(addr) } {
                    table[kept] = table[at];
                    kept += 1;
                }
            }
            nr = kept;
        });
        nr
    }

    /// Group the unmarked candidates and hand the groups to `report`.
    fn report_unmarked(
        &self,
        table: &[Candidate],
        report: &mut dyn FnMut(&LeakGroup<P>),
    ) -> LeakSummary {
        let mut summary = LeakSummary {
            nr_objects: table.len(),
            ..LeakSummary::default()
        };
        let mut groups: [Option<LeakGroup<P>>; MAX_GROUPS] = [None; MAX_GROUPS];
        for candidate in table.iter().filter(|candidate| !candidate.marked) {
            // SAFETY: a cache of this allocator with a busy object: alive.
            let cache: &'static KmemCache<P> =
                unsafe { &*(candidate.cache as *const KmemCache<P>) };
            // SAFETY: a busy object of `cache`.
            let (tag, alloc_frame) = unsafe { cache.allocation_site(candidate.addr) };
            summary.nr_leaked += 1;
            summary.bytes_leaked += candidate.size;
            let same = |group: &LeakGroup<P>| {
                core::ptr::eq(group.cache, cache)
                    && group.tag == tag
                    && group.alloc_frame == alloc_frame
            };
            let slot = groups
                .iter()
                .position(|group| group.as_ref().is_none_or(same))
                .unwrap_or(MAX_GROUPS - 1);
            let group = groups[slot].get_or_insert(LeakGroup {
                cache,
                nr_leaked: 0,
                bytes: 0,
                first: candidate.addr,
                tag,
                alloc_frame,
            });
            group.nr_leaked += 1;
            group.bytes += candidate.size;
        }
        let nr_groups = groups.iter().take_while(|group| group.is_some()).count();
        let groups = &mut groups[..nr_groups];
        groups.sort_unstable_by_key(|group| group.map_or(0, |group| usize::MAX - group.bytes));
        for group in groups.iter().flatten() {
            report(group);
        }
        summary.nr_groups = nr_groups;
        summary
    }
}

impl<P: Platform> KmemCache<P> {
    /// Whether the busy-in-its-slab object at `addr` rests in a magazine
    /// or the depot (no caller holds it).
    ///
    /// # Safety
    /// `addr` is an object start of a live slab of this cache, busy in it.
    unsafe fn is_resting(&self, addr: usize) -> bool {
        if let Some(layout) = self.debug.as_ref() {
            // SAFETY: per our caller; read only.
            let info = unsafe { self.debug_object_info(layout, addr) };
            return info.state != crate::debug::ObjectState::Allocated;
        }
        let Some(obj) = NonNull::new(addr as *mut u8) else {
            return false;
        };
        // SAFETY: per our caller: keyed objects hold a word.
        if self.is_keyed() && unsafe { crate::cache::holds_free_key(obj) } {
            return true;
        }
        // A keyless cache: look.
        !self.is_keyed() && self.find_round(|round| round == addr).is_some()
    }

    /// The allocation site of the busy object at `addr`: its tag
    /// reference (profiling) and the first frame of its last allocation
    /// (`AUDIT`; 0 otherwise).
    ///
    /// # Safety
    /// As for [`Self::is_resting`].
    unsafe fn allocation_site(&self, addr: usize) -> (Option<AllocTagRef>, usize) {
        let frame = match self.debug.as_ref() {
            // SAFETY: per our caller; read only.
            Some(layout) => unsafe { self.debug_object_info(layout, addr) }
                .last_alloc
                .and_then(|record| record.frames().first().copied())
                .unwrap_or(0),
            None => 0,
        };
        #[cfg(feature = "alloc-profiling")]
        let tag = match (self.kind, NonNull::new(addr as *mut u8)) {
            (SlabKind::Small, Some(obj)) => self.small_tag_ref(obj),
            (SlabKind::Bufctl, _) => {
                let layer = self.slab.lock();
                let bufctl = layer.hash.find(addr);
                // SAFETY: a bufctl in the hash, under the slab lock.
                (!bufctl.is_null())
                    .then(|| unsafe { (*bufctl).tag })
                    .flatten()
            }
            _ => None,
        };
        #[cfg(not(feature = "alloc-profiling"))]
        let tag = None;
        (tag, frame)
    }
}

/// The mark phase: the sorted table and its worklist.
struct Marker<'a> {
    table: &'a mut [Candidate],
    worklist: &'a mut [u32],
    nr_pending: usize,
}

impl Marker<'_> {
    /// Mark the object holding `value`, if any, and queue it.
    fn mark(&mut self, value: usize) {
        // The last candidate starting at or below `value`.
        let at = self
            .table
            .partition_point(|candidate| candidate.addr <= value);
        let Some(index) = at.checked_sub(1) else {
            return;
        };
        let candidate = &mut self.table[index];
        if candidate.marked || value >= candidate.addr + candidate.size {
            return;
        }
        candidate.marked = true;
        if self.nr_pending < self.worklist.len() {
            self.worklist[self.nr_pending] = index as u32;
            self.nr_pending += 1;
        }
    }

    /// Mark from every aligned word of `[start, end)`.
    ///
    /// # Safety
    /// The range is readable memory.
    unsafe fn scan_range(&mut self, start: usize, end: usize) {
        let mut at = start.next_multiple_of(8);
        while at + 8 <= end {
            // SAFETY: per our caller, an aligned word of the range
            // (volatile: others may write it; any value is fine).
            let value = unsafe { core::ptr::read_volatile(at as *const usize) };
            self.mark(value);
            at += 8;
        }
    }

    /// Scan every queued object until none is left.
    fn drain(&mut self) {
        while self.nr_pending > 0 {
            self.nr_pending -= 1;
            let candidate = self.table[self.worklist[self.nr_pending] as usize];
            // SAFETY: a held object of a live slab: its bytes are slab
            // memory of ours, readable.
            unsafe { self.scan_range(candidate.addr, candidate.addr + candidate.size) };
        }
    }
}

/// The `::findleaks` header line.
///
/// # Errors
/// Those of `out`.
pub fn write_findleaks_header(out: &mut dyn fmt::Write) -> fmt::Result {
    writeln!(
        out,
        "{:<18} {:>6} {:>18} CALLER",
        "CACHE", "LEAKED", "BUFCTL"
    )
}

/// One `::findleaks` row: the cache (address and name), the count, the
/// first object, then `caller` (the allocation site, as the kernel names
/// it).
///
/// # Errors
/// Those of `out`.
pub fn write_findleaks_row<P: Platform>(
    out: &mut dyn fmt::Write,
    group: &LeakGroup<P>,
    caller: &dyn fmt::Display,
) -> fmt::Result {
    writeln!(
        out,
        "{:<18x} {:>6} {:>18x} {} ({})",
        group.cache as *const KmemCache<P> as usize,
        group.nr_leaked,
        group.first,
        caller,
        group.cache.name()
    )
}

/// The `::findleaks` rule and total.
///
/// # Errors
/// Those of `out`.
pub fn write_findleaks_total(out: &mut dyn fmt::Write, summary: &LeakSummary) -> fmt::Result {
    writeln!(out, "{RULE}")?;
    let buffers = if summary.nr_leaked == 1 {
        "buffer"
    } else {
        "buffers"
    };
    writeln!(
        out,
        "{:>10} {:>6} {buffers}, {} bytes",
        "Total", summary.nr_leaked, summary.bytes_leaked
    )
}
