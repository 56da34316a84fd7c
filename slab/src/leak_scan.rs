//! Leaks by reachability: which allocated objects nothing points to
//! (illumos `::findleaks`, Linux kmemleak).
//!
//! A conservative mark phase: every allocated object (a busy object of a
//! cache that is not resting in a magazine or the depot, and every live
//! page-granular kmalloc) starts unreached; the platform hands in its
//! roots (kernel data and bss, every CPU's stack and saved registers, its
//! per-CPU areas) with [`LeakScan::scan_range`], every aligned word that
//! points into an unreached object (its start or inside it, as kmemleak
//! counts) reaches it, and reached objects are scanned in turn. What stays
//! unreached is a leak. The allocator's own metadata (the bootstrap
//! caches: magazines, slabs, bufctls, trace records) is neither a root nor
//! scanned, so a pointer held only by a magazine or a trace record does
//! not hide a leak; objects resting in magazines and the depot are free,
//! so they are never counted (nor scanned: their stale contents would
//! hide leaks).
//!
//! The scan allocates nothing: the caller supplies the table, one
//! [`LeakEntry`] per allocated object ([`LeakScan::capacity`]
//! says how many), e.g. from its page allocator. Cost: one pass over the
//! slabs, one over the page map, a sort, then per root or reached word a
//! range test and, for words inside the heap, a binary search.
//!
//! Sources: Bonwick & Adams 2001 and illumos `usr/src/cmd/mdb/common/modules/genunix/leaky.c`
//! (`::findleaks`: mark from the roots, report by allocation site, one
//! line per cache and caller with a representative buffer); Linux
//! `mm/kmemleak.c` (conservative scan, interior pointers count).

use core::mem::MaybeUninit;
use core::sync::atomic::{AtomicU8, Ordering};

use crate::alloc_tag::AllocTagRef;
use crate::allocator::Kmem;
use crate::cache::KmemCache;
use crate::layout::freelist::map_test;
use crate::layout::geometry::SlabKind;
use crate::layout::pagemap::PageOwner;
use crate::platform::{PAGE_SIZE, Platform};
use crate::reports::error::ReportName;

/// Allocated, not (yet) reached from a root.
const UNREACHED: u8 = 0;
/// Reached from a root.
const REACHED: u8 = 1;
/// Busy in the slab layer but resting in a magazine or the depot: free.
const RESTING: u8 = 2;

/// No entry (the end of the to-scan stack).
const NONE: u32 = u32::MAX;

/// One allocated object in a [`LeakScan`]'s table (48 bytes).
pub struct LeakEntry {
    start: usize,
    size: usize,
    /// The owning `KmemCache<P>`, type-erased; 0 for a page-granular
    /// kmalloc.
    cache: usize,
    /// Charge token of the object's allocation tag, if it has one.
    site: Option<AllocTagRef>,
    state: AtomicU8,
    /// Next entry on the to-scan stack.
    next: u32,
}

impl LeakEntry {
    /// An unused entry.
    pub const fn empty() -> LeakEntry {
        LeakEntry {
            start: 0,
            size: 0,
            cache: 0,
            site: None,
            state: AtomicU8::new(UNREACHED),
            next: NONE,
        }
    }

    /// Turn uninitialised memory (from a page allocator, say) into a
    /// table of [`LeakEntry::empty`] entries.
    pub fn init_table(memory: &mut [MaybeUninit<LeakEntry>]) -> &mut [LeakEntry] {
        for slot in memory.iter_mut() {
            slot.write(LeakEntry::empty());
        }
        // SAFETY: every element was just initialised; MaybeUninit<T> has
        // T's layout.
        unsafe { &mut *(core::ptr::from_mut(memory) as *mut [LeakEntry]) }
    }
}

/// Why a leak scan could not run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeakScanError {
    /// `init` has not run.
    NotInitialized,
    /// The table holds fewer entries than there are allocated objects
    /// (`needed`, counted now); nothing was scanned.
    TableTooSmall {
        /// Allocated objects found.
        needed: usize,
    },
}

impl core::fmt::Display for LeakScanError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            LeakScanError::NotInitialized => f.write_str("the allocator is not initialised"),
            LeakScanError::TableTooSmall { needed } => {
                write!(f, "the table is too small: {needed} allocated objects")
            }
        }
    }
}

/// Leaked objects of one cache and one allocation site (a `::findleaks`
/// line).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeakGroup {
    /// The cache's name; `kmalloc-pages` for page-granular kmallocs.
    pub cache: ReportName,
    /// Objects leaked.
    pub nr_leaked: usize,
    /// Their bytes (object sizes; whole pages for page-granular ones).
    pub bytes: usize,
    /// The lowest leaked object's address (the representative buffer).
    pub first: usize,
    /// Charge token of the allocation tag the objects were allocated under
    /// (the platform's `AllocTagHooks::token`), if they carry one.
    pub site: Option<AllocTagRef>,
}

/// What a finished scan found, in numbers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LeakSummary {
    /// Allocated objects looked at (resting rounds not counted).
    pub nr_objects: usize,
    /// Reached from the roots.
    pub nr_reached: usize,
    /// Not reached: leaked.
    pub nr_leaked: usize,
    /// Bytes of the leaked objects.
    pub leaked_bytes: usize,
    /// Busy objects resting in magazines and the depot (free; skipped).
    pub nr_resting: usize,
    /// Bytes of roots and objects scanned.
    pub scanned_bytes: usize,
}

/// A leak scan in progress: see the [module docs](self).
pub struct LeakScan<'t, P: Platform> {
    alloc: &'t Kmem<P>,
    table: &'t mut [LeakEntry],
    /// Lowest object start and highest object end: a word outside needs
    /// no search.
    lo: usize,
    hi: usize,
    stack: u32,
    scanned_bytes: usize,
}

impl<'t, P: Platform> LeakScan<'t, P> {
    /// An upper bound on the table entries a [`LeakScan::new`]
    /// needs now: busy objects of every cache but the bootstrap ones,
    /// plus live page-granular kmallocs. Allocation in between may raise
    /// it: give some slack.
    pub fn capacity(heap: &Kmem<P>) -> usize {
        let mut nr = 0;
        heap.for_each_cache(|cache| {
            if !cache.is_bootstrap() {
                let stats = cache.stats();
                nr += stats.nr_allocated + stats.nr_cpu_cached_objs + stats.nr_depot_objs;
            }
        });
        nr + heap.stats().large().nr_live
    }

    /// Start a leak scan: record every allocated object in `table`,
    /// unreached. Then hand the roots to [`LeakScan::scan_range`] and
    /// read the result with [`LeakScan::finish`].
    ///
    /// # Errors
    /// [`LeakScanError::NotInitialized`];
    /// [`LeakScanError::TableTooSmall`] (see
    /// [`LeakScan::capacity`]).
    ///
    /// # Safety
    /// Until the scan is finished no cache is destroyed and no slab or
    /// page-granular block goes back to a page source that unmaps it
    /// (no reap): reached objects are read. Allocation and free may go on
    /// (a kernel's other CPUs), but objects they touch meanwhile may be
    /// misreported: scan a quiet system, as `::findleaks` does a dump.
    pub unsafe fn new(
        heap: &'t Kmem<P>,
        table: &'t mut [LeakEntry],
    ) -> Result<LeakScan<'t, P>, LeakScanError> {
        if !heap.is_ready() {
            return Err(LeakScanError::NotInitialized);
        }
        let mut nr = 0;
        let mut push = |start: usize, size: usize, cache: usize, site: Option<AllocTagRef>| {
            if let Some(entry) = table.get_mut(nr) {
                *entry = LeakEntry {
                    start,
                    size,
                    cache,
                    site,
                    state: AtomicU8::new(UNREACHED),
                    next: NONE,
                };
            }
            nr += 1;
        };
        heap.for_each_cache(|cache| {
            if !cache.is_bootstrap() {
                let erased = core::ptr::from_ref(cache) as usize;
                let size = cache.obj_size();
                cache.for_each_busy_object(|object, site| push(object, size, erased, site));
            }
        });
        let map = heap.page_map();
        let mut index = 0;
        while index < map.nr_pages {
            let addr = map.base + index * PAGE_SIZE;
            match map.get(addr).owner() {
                PageOwner::LargeHead { nr_pages, token } => {
                    push(addr, nr_pages * PAGE_SIZE, 0, AllocTagRef::new(token));
                    index += nr_pages.max(1);
                }
                _ => index += 1,
            }
        }
        // KFENCE samples are in no slab: objects of their caches too.
        heap.kfence_for_each_sample(&mut push);
        if nr > table.len() || nr > NONE as usize {
            return Err(LeakScanError::TableTooSmall { needed: nr });
        }
        let table = &mut table[..nr];
        table.sort_unstable_by_key(|entry| entry.start);
        let lo = table.first().map_or(0, |entry| entry.start);
        let hi = table
            .iter()
            .map(|entry| entry.start + entry.size)
            .max()
            .unwrap_or(0);
        let scan = LeakScan {
            alloc: heap,
            table,
            lo,
            hi,
            stack: NONE,
            scanned_bytes: 0,
        };
        scan.mark_resting();
        Ok(scan)
    }
}

impl<'t, P: Platform> LeakScan<'t, P> {
    /// The entry holding `addr`, if any.
    fn find(&self, addr: usize) -> Option<usize> {
        if addr < self.lo || addr >= self.hi {
            return None;
        }
        let after = self.table.partition_point(|entry| entry.start <= addr);
        let index = after.checked_sub(1)?;
        let entry = &self.table[index];
        (addr < entry.start + entry.size.max(1)).then_some(index)
    }

    /// Rounds in magazines and the depot are free: mark them resting.
    /// Walks the caches outside the cache-list lock (a magazine search
    /// makes cross-CPU calls), a batch at a time.
    fn mark_resting(&self) {
        const BATCH: usize = 16;
        let mut done = 0;
        loop {
            let mut batch: [Option<&'static KmemCache<P>>; BATCH] = [None; BATCH];
            let mut seen = 0;
            let mut nr = 0;
            self.alloc.for_each_cache(|cache| {
                if seen >= done && nr < BATCH {
                    batch[nr] = Some(cache);
                    nr += 1;
                }
                seen += 1;
            });
            for cache in batch.iter().flatten() {
                if cache.is_bootstrap() {
                    continue;
                }
                cache.find_round(|round| {
                    if let Some(index) = self.find(round)
                        && self.table[index].start == round
                    {
                        self.table[index].state.store(RESTING, Ordering::Relaxed);
                    }
                    false
                });
            }
            done += nr;
            if nr < BATCH {
                break;
            }
        }
    }

    /// Scan the words of `start..end` (a root): every unreached object one
    /// points into is reached, and so is everything reachable from it.
    ///
    /// # Safety
    /// `start..end` is mapped and readable for the whole call (it may
    /// change meanwhile: it is read word by word, volatile).
    pub unsafe fn scan_range(&mut self, start: usize, end: usize) {
        // SAFETY: per our caller.
        unsafe { self.scan_words(start, end) };
        self.propagate();
    }

    /// [`scan_range`](Self::scan_range) over a root the borrow checker
    /// vouches for (saved registers copied out, a table of pointers).
    pub fn scan_slice(&mut self, roots: &[usize]) {
        let range = roots.as_ptr_range();
        // SAFETY: a live shared slice: mapped and readable for the call.
        unsafe { self.scan_words(range.start as usize, range.end as usize) };
        self.propagate();
    }

    /// Scan every reached object not scanned yet.
    fn propagate(&mut self) {
        while self.stack != NONE {
            let index = self.stack as usize;
            self.stack = self.table[index].next;
            let (start, size) = (self.table[index].start, self.table[index].size);
            if self.alloc.kfence_contains(start) {
                self.scan_sample(start, size);
                continue;
            }
            // SAFETY: an allocated object (or live page-granular block),
            // mapped for the scan per `LeakScan::new`'s contract.
            unsafe { self.scan_words(start, start + size) };
        }
    }

    /// Scan a KFENCE sample, a chunk at a time under the pool's lock
    /// while it is still allocated: one freed meanwhile has its page
    /// unmapped (a plain read would fault, and KFENCE report a use after
    /// free by the scan). A sample freed mid-scan is scanned no further.
    fn scan_sample(&mut self, start: usize, size: usize) {
        const CHUNK: usize = 64;
        let word = core::mem::size_of::<usize>();
        let mut at = start.next_multiple_of(word);
        let end = start + size;
        let mut buf = [0usize; CHUNK];
        while at + word <= end {
            let nr = ((end - at) / word).min(CHUNK);
            if !self.alloc.kfence_read_sample(start, at, &mut buf[..nr]) {
                break;
            }
            for &value in &buf[..nr] {
                self.reach(value);
            }
            at += nr * word;
        }
        self.scanned_bytes += size;
    }

    /// `word` read from a root or a reached object: the unreached object
    /// it points into, if any, is reached (and queued to be scanned).
    fn reach(&mut self, word: usize) {
        if let Some(index) = self.find(word)
            && self.table[index].state.load(Ordering::Relaxed) == UNREACHED
        {
            self.table[index].state.store(REACHED, Ordering::Relaxed);
            self.table[index].next = self.stack;
            self.stack = index as u32;
        }
    }

    /// # Safety
    /// As [`LeakScan::scan_range`].
    unsafe fn scan_words(&mut self, start: usize, end: usize) {
        let mut at = start.next_multiple_of(core::mem::size_of::<usize>());
        while at + core::mem::size_of::<usize>() <= end {
            // SAFETY: an aligned word inside the caller's readable range.
            let word = unsafe { core::ptr::read_volatile(at as *const usize) };
            self.reach(word);
            at += core::mem::size_of::<usize>();
        }
        self.scanned_bytes += end.saturating_sub(start);
    }

    /// End the scan: call `f` with each group of leaked objects, by cache
    /// then site (page-granular kmallocs last), and return the totals.
    pub fn finish(self, mut f: impl FnMut(&LeakGroup)) -> LeakSummary {
        let mut summary = LeakSummary {
            scanned_bytes: self.scanned_bytes,
            ..LeakSummary::default()
        };
        for entry in self.table.iter() {
            match entry.state.load(Ordering::Relaxed) {
                RESTING => summary.nr_resting += 1,
                REACHED => summary.nr_reached += 1,
                _ => {
                    summary.nr_leaked += 1;
                    summary.leaked_bytes += entry.size;
                }
            }
        }
        summary.nr_objects = summary.nr_reached + summary.nr_leaked;
        // Leaked first, grouped by cache (page-granular last) and site.
        self.table.sort_unstable_by_key(|entry| {
            (
                entry.state.load(Ordering::Relaxed) != UNREACHED,
                entry.cache == 0,
                entry.cache,
                entry.site.map_or(0, AllocTagRef::get),
                entry.start,
            )
        });
        let leaked = &self.table[..summary.nr_leaked];
        let mut at = 0;
        while at < leaked.len() {
            let first = &leaked[at];
            let same = leaked[at..]
                .iter()
                .take_while(|entry| entry.cache == first.cache && entry.site == first.site)
                .count();
            let group = &leaked[at..at + same];
            f(&LeakGroup {
                cache: ReportName::new(self.cache_name(first.cache)),
                nr_leaked: same,
                bytes: group.iter().map(|entry| entry.size).sum(),
                first: first.start,
                site: first.site,
            });
            at += same;
        }
        summary
    }

    /// The name of the cache `erased` stands for (`kmalloc-pages` for 0).
    fn cache_name(&self, erased: usize) -> &'static str {
        let mut name = "kmalloc-pages";
        if erased != 0 {
            self.alloc.for_each_cache(|cache| {
                if core::ptr::from_ref(cache) as usize == erased {
                    name = cache.name();
                }
            });
        }
        name
    }
}

// The cache's part: its busy objects, and which of them rest in magazines.

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
