//! [`Kmem::init`]: the page map, the bootstrap caches (each a cache
//! struct built in place), the kmalloc caches; and the teardown of a
//! failed init.

use core::ptr;
use core::ptr::NonNull;
use core::sync::atomic::Ordering;

use super::{
    BOOT_NAMES, BootCache, Kmem, NR_FIXED_BOOT, STATE_INITIALIZING, STATE_READY, STATE_UNINIT,
    TAG_ARRAY_NAMES, TAG_ARRAY_SIZES,
};
use crate::cache::{CacheSpec, KmemCache};
use crate::error::AllocError;
use crate::flags::CacheFlags;
use crate::layout::geometry::Geometry;
use crate::layout::pagemap::PageMap;
use crate::magazine::{MAG_CACHE_NAMES, MAGAZINE_ROUNDS, NR_MAG_TYPES, PcpuCache, magazine_bytes};
use crate::platform::{NullSource, PAGE_SHIFT, PAGE_SIZE, PageSource, Platform};
use crate::slab::{Bufctl, Slab};
use crate::trace_table::TraceNode;

impl<P: Platform> Kmem<P> {
    /// Bring the allocator up on `source`, its primary page source: build
    /// the page map (a 32-byte slot per page of `source.span()`, from the source
    /// itself), the bootstrap caches (`kmem_magazine_1` …
    /// `kmem_magazine_60`, one per magazine type, then `kmem_cache`,
    /// `kmem_slab`, `kmem_bufctl`, `kmem_trace`, then with
    /// `alloc-profiling` the tag side-array caches `kmem_tags_<bytes>`)
    /// and the kmalloc caches. Reads [`Platform::max_cpus`].
    ///
    /// What it takes from `source` ([`Kmem::init_cost`], formula in
    /// [`InitCost`](crate::InitCost)): the page map (32 bytes a page of
    /// the span: one page up to 512 KiB), and on a source large enough for
    /// them to cost at most a sixteenth of it, the 152 size classes
    /// (`152 × (960 + 64 × nr_cpus)` bytes); on a smaller one each class is
    /// created by its first allocation. Packed slabs are capped at
    /// `span / 32` pages (1 … 32), so the first objects of a class on a
    /// small heap take one page, not eight.
    ///
    /// # Errors
    /// [`AllocError::AlreadyInitialized`] if called before (or during
    /// another call); [`AllocError::SourceTooSmall`] if the source
    /// manages less than [`InitCost::min_source_bytes`](crate::InitCost)
    /// (what `init` takes plus `MIN_FREE_PAGES`
    /// pages: `Kmem::init_cost(source)` has the figures, and prints
    /// them); [`AllocError::OutOfMemory`] if the source cannot
    /// supply the initial pages; [`AllocError::InvalidLayout`] if the
    /// source's span is empty.
    ///
    /// A refused `init` (any error but `AlreadyInitialized`, which changes
    /// nothing either) leaves the allocator as it was before the call:
    /// every page taken from `source` is given back, no cache is listed,
    /// cache ids start again where they were, [`Kmem::is_ready`]
    /// stays false and allocations keep failing. It may be retried, with
    /// the same source once it has more memory or with another one.
    pub fn init(&'static self, source: &'static dyn PageSource) -> Result<(), AllocError> {
        if self
            .state
            .compare_exchange(
                STATE_UNINIT,
                STATE_INITIALIZING,
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_err()
        {
            return Err(AllocError::AlreadyInitialized);
        }
        let first_cache_id = self.next_cache_id.load(Ordering::Relaxed);
        match self.init_inner(source) {
            Ok(()) => {
                // The small-size alloc hit's table last (Release): an alloc
                // that finds a cache there finds everything else done.
                self.publish_by_8();
                self.state.store(STATE_READY, Ordering::Release);
                #[cfg(feature = "descriptor")]
                crate::descriptor::register(self);
                Ok(())
            }
            Err(error) => {
                // SAFETY: state is INITIALIZING and owned by this call; no
                // cache or object has been handed out.
                unsafe { self.teardown() };
                self.next_cache_id.store(first_cache_id, Ordering::Relaxed);
                self.state.store(STATE_UNINIT, Ordering::Release);
                Err(error)
            }
        }
    }

    pub(super) fn init_inner(
        &'static self,
        source: &'static dyn PageSource,
    ) -> Result<(), AllocError> {
        let nr_cpus = P::max_cpus().max(1);
        let cost = Self::init_cost(source).ok_or(AllocError::InvalidLayout)?;
        if cost.span_bytes < cost.min_source_bytes {
            return Err(AllocError::SourceTooSmall);
        }
        // SAFETY: INITIALIZING: this thread owns the init-only cells.
        unsafe {
            *self.source.get() = source;
            *self.nr_cpus.get() = nr_cpus;
            *self.max_slab_pages.get() = cost.max_slab_pages;
            *self.small_source.get() = cost.classes_on_first_use;
        }
        let (start, end) = source.span();
        let base = start & !(PAGE_SIZE - 1);
        let end = end
            .checked_next_multiple_of(PAGE_SIZE)
            .ok_or(AllocError::InvalidLayout)?;
        if end <= base {
            return Err(AllocError::InvalidLayout);
        }
        let nr_pages = (end - base) >> PAGE_SHIFT;
        let map_pages = PageMap::pages_for(nr_pages);
        let map = source.alloc_pages(map_pages)?;
        if !source.zeroes_pages() {
            // SAFETY: map_pages fresh pages from the source: writable,
            // ours; all-zero is a valid array of PageSlot (all "not
            // slab memory"). A zeroing source gave them zeroed already.
            unsafe { ptr::write_bytes(map.as_ptr(), 0, map_pages * PAGE_SIZE) };
        }
        let page_map = PageMap {
            base,
            nr_pages,
            entries: map.as_ptr().cast(),
        };
        // SAFETY: INITIALIZING: this thread owns the init-only cells.
        unsafe {
            *self.page_map.get() = page_map;
            *self.page_map_pages.get() = map_pages;
        }

        let fixed_layouts: [(usize, usize); NR_FIXED_BOOT - NR_MAG_TYPES] = [
            // The struct and its per-CPU array (KmemCache::pcpu).
            (
                KmemCache::<P>::PCPU_OFFSET + nr_cpus * core::mem::size_of::<PcpuCache>(),
                core::mem::align_of::<KmemCache<P>>(),
            ),
            (core::mem::size_of::<Slab>(), core::mem::align_of::<Slab>()),
            (
                core::mem::size_of::<Bufctl>(),
                core::mem::align_of::<Bufctl>(),
            ),
            (
                core::mem::size_of::<TraceNode>(),
                core::mem::align_of::<TraceNode>(),
            ),
        ];
        let magazine_layouts = MAGAZINE_ROUNDS.map(|rounds| (magazine_bytes(rounds), 8));
        let tag_array_layouts = TAG_ARRAY_SIZES.map(|bytes| (bytes, 8));
        let names = MAG_CACHE_NAMES
            .iter()
            .chain(BOOT_NAMES.iter())
            .chain(TAG_ARRAY_NAMES.iter());
        let layouts = magazine_layouts
            .into_iter()
            .chain(fixed_layouts)
            .chain(tag_array_layouts);
        for (index, (name, (size, align))) in names.zip(layouts).enumerate() {
            // The tag side-array caches may have multi-page slabs with
            // their headers in kmem_slab (created before them), like any
            // cache on the primary source: their 2 KiB objects would
            // otherwise need bufctl slabs. So may kmem_cache (its objects
            // are 1 KiB and more): a bufctl slab would take a kmem_bufctl
            // object per object and a hash entry per allocation, and the
            // first class made on a small heap paid for kmem_bufctl's first
            // slab too (about 2,000 instructions). kmem_slab, kmem_bufctl
            // and the magazine caches stay unpacked: headers and bufctls
            // come from them (a packed one would recurse).
            let packed = index >= NR_FIXED_BOOT || index == BootCache::Cache as usize;
            let spec = CacheSpec {
                name,
                size,
                geometry: Geometry::with_max_slab_pages(
                    size,
                    align,
                    CacheFlags::NOTRACE,
                    packed,
                    cost.max_slab_pages,
                )?,
                flags: CacheFlags::NOTRACE,
                ctor: None,
                dtor: None,
                source,
                on_primary: true,
                bootstrap: true,
                permanent: true,
                id: self.next_cache_id.fetch_add(1, Ordering::Relaxed),
                debug: None,
                small_source: false,
            };
            // Bootstrap caches have no magazine layer (pcpu null): metadata
            // goes straight to and from their slab layers.
            let cache = KmemCache::construct(spec, self, page_map, nr_cpus);
            // SAFETY: INITIALIZING; slot `index` < NR_BOOT is not yet
            // initialised and nothing references it.
            unsafe {
                let slot = self.boot.get().cast::<KmemCache<P>>().add(index);
                slot.write(cache);
                *self.nr_boot.get() = index + 1;
                self.link_cache(slot);
            }
        }

        // The magazine types' caches: the first NR_MAG_TYPES bootstrap
        // slots, or on a small source the last of them for every type.
        // SAFETY: INITIALIZING: this thread owns the init-only cells; the
        // bootstrap slots are initialised and never move.
        unsafe {
            let boot = self.boot.get().cast::<KmemCache<P>>();
            for (magtype, slot) in (*self.magazine_caches.get()).iter_mut().enumerate() {
                let index = if cost.classes_on_first_use {
                    NR_MAG_TYPES - 1
                } else {
                    magtype
                };
                *slot = boot.add(index);
            }
        }
        self.init_classes(&cost)?;
        Ok(())
    }

    /// Give back everything a failed `init` took.
    ///
    /// # Safety
    /// Only from `init`, while INITIALIZING, before anything was handed out.
    pub(super) unsafe fn teardown(&self) {
        // SAFETY: INITIALIZING: we own every cell; every cache on the list
        // is alive. Caches are discarded in an order that keeps the
        // metadata they read alive: ordinary caches (their structs and
        // per-CPU arrays live in bootstrap slabs), then bootstrap bufctl
        // caches (their slab structs live in kmem_slab / kmem_bufctl),
        // then bootstrap small-slab caches (headers inside their own
        // pages; kmem_cache's in kmem_slab, discarded after it).
        unsafe {
            let head = self.caches.lock::<P>().head;
            let mut cache = head;
            while !cache.is_null() {
                let next = (*(*cache).links.get()).next;
                if !(*cache).is_bootstrap() {
                    (*cache).discard_all_slabs();
                }
                cache = next;
            }
            let nr_boot = *self.nr_boot.get();
            for pass_small in [false, true] {
                for index in 0..nr_boot {
                    let boot = &*self.boot.get().cast::<KmemCache<P>>().add(index);
                    if (boot.kind == crate::layout::geometry::SlabKind::Small) == pass_small {
                        boot.discard_all_slabs();
                    }
                }
            }
            let map = *self.page_map.get();
            if let Some(entries) = NonNull::new(map.entries.cast_mut().cast::<u8>()) {
                (*self.source.get()).free_pages(entries, *self.page_map_pages.get());
            }
            *self.page_map.get() = PageMap::empty();
            *self.page_map_pages.get() = 0;
            *self.nr_boot.get() = 0;
            *self.magazine_caches.get() = [ptr::null(); NR_MAG_TYPES];
            for slot in &self.kmalloc {
                slot.store(ptr::null_mut(), Ordering::Relaxed);
            }
            for entry in &self.kmalloc_by_8 {
                entry.store(crate::cache::unready::<P>(), Ordering::Relaxed);
            }
            *self.source.get() = &NullSource;
            let mut list = self.caches.lock::<P>();
            list.head = ptr::null();
            list.tail = ptr::null();
        }
    }
}
