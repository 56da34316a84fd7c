//! The kmalloc size classes: created by `init` on a large page source,
//! on first use on a small one; what `init` costs ([`InitCost`]).
//!
//! **Why on first use.** A class costs its `kmem_cache` struct and its
//! per-CPU array before it holds an object: `size_of::<KmemCache>()`
//! (960 bytes) plus `64 × nr_cpus`, so about 152 KiB for the 152 classes
//! on one CPU — more than a whole 100 KiB hobby-kernel heap. When all
//! of them would take more than a sixteenth of the source ([`InitCost`]),
//! `init` creates none: every kmalloc slot points at an **unborn stub**, a
//! cache with no memory whose hot flags send the allocation off the hit
//! (`HotFlags::UNBORN`, tested by the flag test every alloc makes
//! anyway: the hit costs nothing more). The stub's cold path creates the
//! class (under `class_lock`), publishes it in the slot (Release; every
//! kmalloc loads the slot with Acquire, a plain load on x86) and
//! allocates from it. The class is created exactly as `init` would have
//! (name, alignment, boot-line debug flags), so everything after its
//! first allocation is unchanged.
//!
//! **Why one stub per natural alignment.** The stub's cold path knows
//! the requested size, not the alignment. A request `(size, align)` is
//! served by the first class at least `size` bytes big whose natural
//! alignment is at least `align`; that class `i` has natural alignment
//! `A ≥ align`, and every class between the smallest one that fits and
//! `i` has a smaller one, so `i` is also the first class that fits with
//! alignment at least `A`. The slot of class `i` holds the stub of `A`
//! (10 stubs: 8 … 4096 bytes), and the stub asks for `(size, A)`.
//!
//! **Why slabs no larger than the source allows.** A packed class picks
//! the fewest pages (up to 8; up to 32 above 1 KiB) that waste at most
//! 1/32 of a slab (1/128 above 1 KiB: `layout/geometry.rs`); on a
//! 100 KiB heap the first `Vec` of 832 bytes would take 20 KiB that way.
//! `init` caps packed slabs at `span / 32` pages (8 from a 1 MiB source
//! up, 32 from 4 MiB), one object's pages at least.

use core::fmt::Write as _;
use core::sync::atomic::Ordering;

use super::kmalloc::{KMALLOC_SIZES, natural_align};
use super::{Kmem, NR_KMALLOC, NameBuf};
use crate::cache::{CacheSpec, HotFlags, KmemCache};
use crate::error::AllocError;
use crate::flags::CacheFlags;
use crate::layout::geometry::{Geometry, MAX_SLAB_PAGES};
use crate::magazine::PcpuCache;
use crate::platform::{PAGE_SIZE, PageSource, Platform};

/// Unborn stubs: one per natural alignment of a class, 8 … 4096 bytes.
pub(crate) const NR_UNBORN: usize = 10;

const _: () = {
    // The largest natural alignment of a class is the last stub's.
    assert!(8 << (NR_UNBORN - 1) == PAGE_SIZE);
    let mut index = 0;
    while index < NR_KMALLOC {
        assert!(natural_align(KMALLOC_SIZES[index]) >= 8);
        index += 1;
    }
};

/// The size classes' names, `kmalloc-<size>` (Linux's), by class index:
/// written out, not formatted at each class's birth (a `write!` and a
/// UTF-8 check cost a class made on first use about 350 instructions).
/// The test `class_names_are_kmalloc_and_the_size` checks them against
/// [`KMALLOC_SIZES`].
pub(crate) const CLASS_NAMES: [&str; NR_KMALLOC] = [
    "kmalloc-8",
    "kmalloc-16",
    "kmalloc-24",
    "kmalloc-32",
    "kmalloc-40",
    "kmalloc-48",
    "kmalloc-56",
    "kmalloc-64",
    "kmalloc-72",
    "kmalloc-80",
    "kmalloc-88",
    "kmalloc-96",
    "kmalloc-104",
    "kmalloc-112",
    "kmalloc-120",
    "kmalloc-128",
    "kmalloc-144",
    "kmalloc-160",
    "kmalloc-176",
    "kmalloc-192",
    "kmalloc-208",
    "kmalloc-224",
    "kmalloc-240",
    "kmalloc-256",
    "kmalloc-288",
    "kmalloc-320",
    "kmalloc-352",
    "kmalloc-384",
    "kmalloc-416",
    "kmalloc-448",
    "kmalloc-480",
    "kmalloc-512",
    "kmalloc-576",
    "kmalloc-640",
    "kmalloc-704",
    "kmalloc-768",
    "kmalloc-832",
    "kmalloc-896",
    "kmalloc-960",
    "kmalloc-1024",
    "kmalloc-1088",
    "kmalloc-1152",
    "kmalloc-1216",
    "kmalloc-1280",
    "kmalloc-1344",
    "kmalloc-1408",
    "kmalloc-1472",
    "kmalloc-1536",
    "kmalloc-1600",
    "kmalloc-1664",
    "kmalloc-1728",
    "kmalloc-1792",
    "kmalloc-1856",
    "kmalloc-1920",
    "kmalloc-1984",
    "kmalloc-2048",
    "kmalloc-2112",
    "kmalloc-2176",
    "kmalloc-2240",
    "kmalloc-2304",
    "kmalloc-2368",
    "kmalloc-2432",
    "kmalloc-2496",
    "kmalloc-2560",
    "kmalloc-2624",
    "kmalloc-2688",
    "kmalloc-2752",
    "kmalloc-2816",
    "kmalloc-2880",
    "kmalloc-2944",
    "kmalloc-3008",
    "kmalloc-3072",
    "kmalloc-3136",
    "kmalloc-3200",
    "kmalloc-3264",
    "kmalloc-3328",
    "kmalloc-3392",
    "kmalloc-3456",
    "kmalloc-3520",
    "kmalloc-3584",
    "kmalloc-3648",
    "kmalloc-3712",
    "kmalloc-3776",
    "kmalloc-3840",
    "kmalloc-3904",
    "kmalloc-3968",
    "kmalloc-4032",
    "kmalloc-4096",
    "kmalloc-4160",
    "kmalloc-4224",
    "kmalloc-4288",
    "kmalloc-4352",
    "kmalloc-4416",
    "kmalloc-4480",
    "kmalloc-4544",
    "kmalloc-4608",
    "kmalloc-4672",
    "kmalloc-4736",
    "kmalloc-4800",
    "kmalloc-4864",
    "kmalloc-4928",
    "kmalloc-4992",
    "kmalloc-5056",
    "kmalloc-5120",
    "kmalloc-5184",
    "kmalloc-5248",
    "kmalloc-5312",
    "kmalloc-5376",
    "kmalloc-5440",
    "kmalloc-5504",
    "kmalloc-5568",
    "kmalloc-5632",
    "kmalloc-5696",
    "kmalloc-5760",
    "kmalloc-5824",
    "kmalloc-5888",
    "kmalloc-5952",
    "kmalloc-6016",
    "kmalloc-6080",
    "kmalloc-6144",
    "kmalloc-6208",
    "kmalloc-6272",
    "kmalloc-6336",
    "kmalloc-6400",
    "kmalloc-6464",
    "kmalloc-6528",
    "kmalloc-6592",
    "kmalloc-6656",
    "kmalloc-6720",
    "kmalloc-6784",
    "kmalloc-6848",
    "kmalloc-6912",
    "kmalloc-6976",
    "kmalloc-7040",
    "kmalloc-7104",
    "kmalloc-7168",
    "kmalloc-7232",
    "kmalloc-7296",
    "kmalloc-7360",
    "kmalloc-7424",
    "kmalloc-7488",
    "kmalloc-7552",
    "kmalloc-7616",
    "kmalloc-7680",
    "kmalloc-7744",
    "kmalloc-7808",
    "kmalloc-7872",
    "kmalloc-7936",
    "kmalloc-8000",
    "kmalloc-8064",
    "kmalloc-8128",
    "kmalloc-8192",
];

/// Pages a source must have beyond what `init` takes: the metadata slabs
/// the first allocations need (`kmem_cache`, `kmem_slab`, `kmem_bufctl`,
/// a magazine slab, a tag side-array slab: at most 6 pages) and a slab
/// for each of a few classes.
pub const MIN_FREE_PAGES: usize = 16;

/// Packed slabs of at most `span_pages / SLAB_PAGES_DIV` pages.
const SLAB_PAGES_DIV: usize = 32;

/// Size classes are created by `init` when they take at most
/// `1 / EAGER_DIV` of the source's span.
const EAGER_DIV: usize = 16;

/// What [`Kmem::init`] takes from a page source, and the smallest
/// source it accepts ([`Kmem::init_cost`]). Bytes throughout.
///
/// The formula, for a source spanning `S` bytes (`S / 4096` pages) on
/// `n` CPUs:
///
/// - the page map: `32 × S / 4096` bytes (a 32-byte slot a page: its
///   entry, owner, first object and stride magic), in whole pages (one
///   page up to a 512 KiB span);
/// - the size classes, only if they take at most `S / 16`:
///   `152 × (960 + 64 n)` bytes of `kmem_cache` objects (each class's
///   struct and, after it, its per-CPU array; their slabs round up to
///   whole pages). Otherwise 0: each class is created
///   by its first allocation and costs that then;
/// - nothing else: the bootstrap caches live in the `Kmem` static
///   and take slabs on first use.
///
/// So a source under 512 KiB on one CPU costs `init` one page, one under
/// 1 MiB two (its classes come on first use); `init`
/// refuses a source with fewer than `MIN_FREE_PAGES` pages left after
/// it ([`AllocError::SourceTooSmall`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InitCost {
    /// Bytes the source spans ([`PageSource::span`], page-rounded).
    pub span_bytes: usize,
    /// The page map: 32 bytes a page of the span, whole pages.
    pub page_map_bytes: usize,
    /// The size classes' structs and per-CPU arrays if `init` creates
    /// them; 0 if they are created on first use.
    pub classes_bytes: usize,
    /// Whether the size classes are created on first use.
    pub classes_on_first_use: bool,
    /// Most pages in a packed small slab (1 … 32; objects up to 1 KiB
    /// take at most 8).
    pub max_slab_pages: usize,
    /// The smallest span `init` accepts: `page_map_bytes +
    /// classes_bytes + MIN_FREE_PAGES × 4096`. (The span, not what the
    /// source holds now: a source may import memory as it is asked.)
    pub min_source_bytes: usize,
}

impl InitCost {
    /// What `init` takes: the page map and the classes it creates.
    pub fn init_bytes(&self) -> usize {
        self.page_map_bytes + self.classes_bytes
    }
}

impl core::fmt::Display for InitCost {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "source spans {} KiB: init takes {} KiB (page map {} KiB, size classes {} KiB{}), \
             needs at least {} KiB",
            self.span_bytes / 1024,
            self.init_bytes() / 1024,
            self.page_map_bytes / 1024,
            self.classes_bytes / 1024,
            if self.classes_on_first_use {
                ": created on first use"
            } else {
                ""
            },
            self.min_source_bytes / 1024,
        )
    }
}

impl<P: Platform> Kmem<P> {
    /// What [`Kmem::init`] would take from `source` with
    /// [`Platform::max_cpus`] CPUs, and whether it is big enough (see
    /// [`InitCost`] for the formula). `None` for an empty span.
    pub fn init_cost(source: &dyn PageSource) -> Option<InitCost> {
        let nr_cpus = P::max_cpus().max(1);
        let (start, end) = source.span();
        let base = start & !(PAGE_SIZE - 1);
        let end = end.checked_next_multiple_of(PAGE_SIZE)?;
        if end <= base {
            return None;
        }
        let span_bytes = end - base;
        let span_pages = span_bytes / PAGE_SIZE;
        let page_map_bytes = crate::layout::pagemap::PageMap::pages_for(span_pages) * PAGE_SIZE;
        let eager_bytes = NR_KMALLOC
            * (KmemCache::<P>::PCPU_OFFSET + nr_cpus * core::mem::size_of::<PcpuCache>());
        let classes_on_first_use = eager_bytes.saturating_mul(EAGER_DIV) > span_bytes;
        let classes_bytes = if classes_on_first_use { 0 } else { eager_bytes };
        Some(InitCost {
            span_bytes,
            page_map_bytes,
            classes_bytes,
            classes_on_first_use,
            max_slab_pages: (span_pages / SLAB_PAGES_DIV).clamp(1, MAX_SLAB_PAGES),
            min_source_bytes: page_map_bytes + classes_bytes + MIN_FREE_PAGES * PAGE_SIZE,
        })
    }

    /// Fill the kmalloc slots (`init`): create every class, or on a small
    /// source build the unborn stubs and point every slot at its own.
    ///
    /// # Errors
    /// As for `cache_create` (out of memory).
    pub(super) fn init_classes(&'static self, cost: &InitCost) -> Result<(), AllocError> {
        // Partitioned kmalloc (`kmalloc.rs`), but not on a small source.
        super::kmalloc::init_partition_seed(P::now() ^ (core::ptr::from_ref(self) as u64));
        self.kmalloc_partitioned
            .store(!cost.classes_on_first_use, Ordering::Relaxed);
        if !cost.classes_on_first_use {
            for index in 0..NR_KMALLOC {
                let cache = self.create_class(index)?;
                self.kmalloc[index].store(cache.cast_mut(), Ordering::Release);
            }
            return Ok(());
        }
        let primary = self.primary_source();
        // SAFETY: INITIALIZING: this thread owns the init-only cells.
        let nr_cpus = unsafe { *self.nr_cpus.get() };
        let stubs = self.unborn.get().cast::<KmemCache<P>>();
        for rank in 0..NR_UNBORN {
            let align = 8 << rank;
            let spec = CacheSpec {
                name: "kmalloc-unborn",
                // The stub's object size is the alignment it stands for.
                size: align,
                geometry: Geometry::new(align, align, CacheFlags::NOTRACE, false)?,
                flags: CacheFlags::NOTRACE,
                ctor: None,
                dtor: None,
                source: primary,
                on_primary: false,
                bootstrap: true,
                permanent: true,
                id: 0,
                debug: None,
                small_source: false,
            };
            let stub = KmemCache::construct(spec, self, self.page_map(), nr_cpus);
            stub.set_hot(HotFlags::UNBORN);
            // SAFETY: INITIALIZING; stub slot `rank` < NR_UNBORN is ours and
            // nothing references it yet. Stubs are never linked or freed.
            unsafe { stubs.add(rank).write(stub) };
        }
        for (index, &size) in KMALLOC_SIZES.iter().enumerate() {
            let rank = natural_align(size).trailing_zeros() as usize - 3;
            // SAFETY: just initialised, permanent (in the static).
            let stub = unsafe { stubs.add(rank) };
            self.kmalloc[index].store(stub, Ordering::Release);
        }
        Ok(())
    }

    /// Create size class `index` (`kmalloc-<size>`, naturally aligned).
    fn create_class(&'static self, index: usize) -> Result<*const KmemCache<P>, AllocError> {
        let cache = self.create_kmalloc_cache(CLASS_NAMES[index], KMALLOC_SIZES[index])?;
        Ok(cache)
    }

    /// A permanent kmalloc cache `name` of `size`-byte objects, naturally
    /// aligned, no flags, constructor or destructor: a size class or a
    /// partition's copy of one.
    fn create_kmalloc_cache(
        &'static self,
        name: &str,
        size: usize,
    ) -> Result<&'static KmemCache<P>, AllocError> {
        self.create_cache(
            name,
            size,
            natural_align(size),
            CacheFlags::empty(),
            None,
            None,
            None,
            true,
        )
    }

    /// The cache of partition `row` (a random copy, or the data row) of
    /// the size class serving `size` bytes aligned to `align`; `Ok(None)`:
    /// page-granular. A copy still unborn that cannot be made now (its
    /// locks busy: an interrupt handler tries them once, and another CPU
    /// may be making a class; or no memory for the cache) leaves this one
    /// allocation to the shared class: kfree finds any cache by the page
    /// map, only the isolation is lost for it. Failing instead made an
    /// allocating timer handler panic while `stress` on the other CPUs
    /// made their first copies (tests/smp_irq_features.rs).
    pub(super) fn partition_cache(
        &self,
        row: usize,
        size: usize,
        align: usize,
    ) -> Result<Option<*const KmemCache<P>>, AllocError> {
        let Some(index) = Self::kmalloc_index(size, align) else {
            return Ok(None);
        };
        // Copy `row` of class `index` (`kmalloc-rnd-<row>-<size>`, or
        // `kmalloc-data-<size>` for the pointer-free row: `kmalloc.rs`),
        // created now on its first use, as an unborn class is.
        let copy: Result<&'static KmemCache<P>, AllocError> = 'copy: {
            let slot = &self.kmalloc_partitions[row][index];
            let cache = slot.load(Ordering::Acquire);
            if !cache.is_null() {
                // SAFETY: published copies are permanent caches.
                break 'copy Ok(unsafe { &*cache });
            }
            // SAFETY: as in `kmalloc_class`: an allocator with caches lives
            // forever.
            let this: &'static Self = unsafe { &*core::ptr::from_ref(self) };
            let Some(_guard) = spin_try::<P, _>(|| self.class_lock.try_lock::<P>()) else {
                break 'copy Err(AllocError::OutOfMemory);
            };
            let cache = slot.load(Ordering::Acquire);
            if !cache.is_null() {
                // SAFETY: as above.
                break 'copy Ok(unsafe { &*cache });
            }
            if spin_try::<P, _>(|| self.caches.try_lock::<P>()).is_none() {
                break 'copy Err(AllocError::OutOfMemory);
            }
            let size = KMALLOC_SIZES[index];
            let mut name = NameBuf {
                bytes: [0; 32],
                len: 0,
            };
            // Linux's names: "kmalloc-rnd-01-64"; the typed row's after
            // `kmem_buckets`' "kmalloc-data-64" (both fit in 31 bytes).
            if row == super::kmalloc::DATA_PARTITION {
                let _ = write!(name, "kmalloc-data-{size}");
            } else {
                let _ = write!(name, "kmalloc-rnd-{:02}-{size}", row + 1);
            }
            let created = this.create_kmalloc_cache(name.as_str(), size);
            if let Ok(created) = created {
                slot.store(core::ptr::from_ref(created).cast_mut(), Ordering::Release);
            }
            created
        };
        let cache = match copy {
            Ok(cache) => cache,
            Err(_) => self.kmalloc_class(index)?,
        };
        Ok(Some(cache))
    }

    /// Size class `index`, created now if it is still unborn.
    ///
    /// # Errors
    /// [`AllocError::OutOfMemory`] if creating it failed, or if the
    /// allocator's locks stayed busy (this CPU holds them: a
    /// `for_each_cache` callback, or an interrupt handler that interrupted
    /// a class's creation), or were busy once from an interrupt handler.
    pub(crate) fn kmalloc_class(&self, index: usize) -> Result<&'static KmemCache<P>, AllocError> {
        let cache = self.kmalloc_cache(index);
        if !cache.hot().contains(HotFlags::UNBORN) {
            return Ok(cache);
        }
        // SAFETY: `init` takes `&'static self`: an allocator with a cache
        // (the stub is one) lives forever.
        let this: &'static Self = unsafe { &*core::ptr::from_ref(self) };
        let Some(_guard) = spin_try::<P, _>(|| self.class_lock.try_lock::<P>()) else {
            return Err(AllocError::OutOfMemory);
        };
        let cache = self.kmalloc_cache(index);
        if !cache.hot().contains(HotFlags::UNBORN) {
            return Ok(cache);
        }
        // Creating links the class under the cache-list lock: not if this
        // CPU holds it (that would never return).
        if spin_try::<P, _>(|| self.caches.try_lock::<P>()).is_none() {
            return Err(AllocError::OutOfMemory);
        }
        let created = this.create_class(index)?;
        self.kmalloc[index].store(created.cast_mut(), Ordering::Release);
        self.update_by_8(index);
        // SAFETY: just created, permanent.
        Ok(unsafe { &*created })
    }
}

/// How many times [`spin_try`] tries a busy lock outside interrupts.
const SPIN_TRIES: u32 = 1 << 22;

/// `try_lock` until it succeeds, a bounded number of times (the lock may
/// be held by this CPU, which spinning would never release); once only in
/// an interrupt handler, which must not spin on a lock the code it
/// interrupted holds.
///
/// The bound, [`SPIN_TRIES`], is 2^22 `pause`s: about 0.1–0.6 s at
/// `pause`'s 40–140 cycles. Creating a class on another CPU takes
/// microseconds, so only this CPU holding the lock (a `for_each_cache`
/// callback that allocates) runs it out. It was 2^16 (a few hundred
/// microseconds): a host thread the scheduler paused while holding the
/// lock made another fail with a spurious `OutOfMemory`
/// (`classes_created_on_first_use_race_safely`, once under load).
fn spin_try<P: Platform, T>(mut try_lock: impl FnMut() -> Option<T>) -> Option<T> {
    if P::in_interrupt() {
        return try_lock();
    }
    for _ in 0..SPIN_TRIES {
        if let Some(guard) = try_lock() {
            return Some(guard);
        }
        core::hint::spin_loop();
    }
    None
}
