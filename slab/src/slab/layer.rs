//! [`SlabLayer`]: a cache's slab layer, with its [`SlabParams`] and what it
//! needs from the cache ([`SlabOwner`]): growing a slab, taking and
//! returning objects, reaping, the bufctl hash's table. Growing and
//! releasing run with no lock held (they call the page source and the
//! bootstrap caches).

use core::ptr::{self, NonNull};
#[cfg(feature = "alloc-profiling")]
use core::sync::atomic::AtomicPtr;
use core::sync::atomic::AtomicU64;
#[cfg(feature = "alloc-profiling")]
use core::sync::atomic::Ordering;

use super::{Bufctl, BufctlState, SLAB_MAGIC, Slab, SlabList, SlabLists, slab_base, small_header};
use crate::constructor::{Ctor, Dtor};
use crate::error::AllocError;
use crate::layout::freelist::{BadLink, FreeList};
use crate::layout::geometry::SlabKind;
use crate::layout::hash::{AddrHash, rescale_locked};
use crate::layout::pagemap::PageMap;
use crate::platform::{PAGE_SIZE, PageSource, Platform};
use crate::reports::error::{ErrorKind, ErrorReport};
use crate::sync::{IrqMutex, IrqMutexGuard};

/// The slab layer's parameters: the cache's geometry, its page source,
/// constructor and destructor, fixed at creation. The cache owns them
/// (`KmemCache::params`, one copy) and hands them down with its slab
/// layer ([`SlabOwner::slab`]). `repr(C)`, the fields the magazine hits
/// read first: the cache places them right after its own hot fields, so
/// that `nr_objs_per_slab` and `page_map` end its first cache line and
/// `stride` opens the second (`tests::magazines::hot_fields_first`).
#[repr(C)]
pub(crate) struct SlabParams {
    pub(crate) nr_objs_per_slab: usize,
    /// Slabs on the primary source are registered here (empty otherwise).
    pub(crate) page_map: PageMap,
    pub(crate) stride: usize,
    pub(crate) obj_size: usize,
    pub(crate) ctor: Option<Ctor>,
    pub(crate) dtor: Option<Dtor>,
    pub(crate) source: &'static dyn PageSource,
    pub(crate) nr_pages_per_slab: usize,
    /// Where a free object holds its free-list link: 0, 8 (after the
    /// free key; none in 8-byte objects, found by the bitmap), or in the
    /// debug trailer (so the poison stays whole).
    pub(crate) freeptr_offset: usize,
    /// The free-list obfuscation secret ([`crate::layout::freelist`]).
    pub(crate) freelist_secret: usize,
    /// The free key free objects of small slabs hold in their first word
    /// (their link then at 8), or 0 (`cache/double_free.rs`).
    pub(crate) free_key: usize,
    /// Bytes from a slab's first page to its object 0 (a debug cache's
    /// left redzone, [`DebugLayout::left`](crate::debug::DebugLayout)):
    /// `Slab::base` is object 0, its pages start this much lower.
    pub(crate) obj_offset: usize,
    pub(crate) kind: SlabKind,
    /// On the primary source: slabs are registered in `page_map`.
    pub(crate) on_primary: bool,
    /// Small slabs: the header is a `kmem_slab` object, not the slab's
    /// last bytes.
    pub(crate) header_off_slab: bool,
    /// A debug cache: its objects are initialised when their slab is made
    /// and checked before it goes ([`SlabOwner::debug_slab`]).
    pub(crate) debug: bool,
}

impl SlabParams {
    /// The hardened free list of the small slab whose object 0 is at
    /// `base`.
    pub(crate) fn free_list(&self, base: usize) -> FreeList {
        FreeList {
            base,
            stride: self.stride,
            nr_objs: self.nr_objs_per_slab,
            link_offset: self.freeptr_offset,
            secret: self.freelist_secret,
            key: self.free_key,
        }
    }

    /// The header of the small slab holding `addr` (an object of a live
    /// slab): through the page map on the primary source (the header may
    /// be off slab or at the end of a later page), at the end of the page
    /// otherwise (one-page slabs there).
    #[inline]
    pub(crate) fn small_slab_of(&self, addr: usize) -> *mut Slab {
        if self.on_primary {
            self.page_map.get(addr).slab_unchecked() as *mut Slab
        } else {
            small_header(addr)
        }
    }
}

/// Metadata the slab layer (and a cache's trace table) takes from the
/// bootstrap caches.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Metadata {
    /// A `kmem_slab` object (a [`Slab`] struct off its slab).
    Slab,
    /// A `kmem_bufctl` object (a [`Bufctl`]).
    Bufctl,
    /// A `kmem_trace` object (a trace table's record, sized and aligned
    /// for its `TraceNode`).
    #[cfg(feature = "trace-table")]
    TraceRecord,
    /// A small slab's tag side array (`alloc-profiling`): one
    /// `Option<AllocTagRef>` per object, this many bytes (a
    /// `kmem_tags_<bytes>` object, the smallest that holds them).
    #[cfg(feature = "alloc-profiling")]
    TagArray(usize),
}

impl Metadata {
    /// The side array of a slab of `params` ([`Metadata::TagArray`]).
    #[cfg(feature = "alloc-profiling")]
    pub(crate) fn tag_array(params: &SlabParams) -> Metadata {
        Metadata::TagArray(params.nr_objs_per_slab * crate::alloc_tag::TAG_REF_BYTES)
    }
}

/// What the slab layer needs from the cache it serves: its slab layer
/// and [`SlabParams`], its identity, the error sink, the bootstrap caches
/// (every kind of [`Metadata`], the tag side arrays among them, each a
/// `SlabOwner` itself) and the debug hooks (the trace table asks the same of its cache, and the
/// object size: `TraceOwner`). The cache implements it (`cache/slab_layer.rs`), so
/// this layer never names the cache. Every call is made with no slab lock
/// held.
pub(crate) trait SlabOwner {
    /// The platform (the clock of the `time-stats` points).
    type Platform: Platform;
    /// The cache's identity, stored in every slab ([`Slab::cache`]).
    fn id(&self) -> *const ();
    /// The cache's name, for reports.
    fn name(&self) -> &str;
    /// The error sink: a report of something this layer refused or
    /// repaired.
    fn report(&self, report: ErrorReport);
    /// `source` ran dry: reap caches until it can give `nr_pages` pages,
    /// and take them (`None`: still no room, or no reap now).
    fn reap_for_pressure(
        &self,
        source: &'static dyn PageSource,
        nr_pages: usize,
    ) -> Option<NonNull<u8>>;
    /// This owner's slab layer and its parameters (every entry point of
    /// [`SlabLayer`] reaches them through its owner).
    fn slab(&self) -> (&SlabLayer<Self::Platform>, &SlabParams);
    /// The bootstrap cache whose objects are metadata `which`: a layer
    /// takes them from its slab layer ([`SlabLayer::alloc`]) and gives
    /// them back there ([`SlabLayer::free_objects`]), as Akaros takes a
    /// slab's bufctls from `kmem_bufctl_cache`.
    fn metadata(&self, which: Metadata) -> &Self;
    /// Where the bufctl hash's tables come from.
    fn metadata_source(&self) -> &'static dyn PageSource;
    /// A debug cache's one hook on its slabs: `fresh`, a slab just made
    /// (every object's trailer initialised: state free, poison,
    /// redzone), or else one about to go back to its page source (every
    /// object, all free, checked: a write after free is reported before
    /// the evidence goes with the page).
    ///
    /// # Safety
    /// `slab` is an alive slab of this cache, ours alone: fresh (not yet
    /// carved, listed or registered) or detached and empty.
    unsafe fn debug_slab(&self, slab: *mut Slab, fresh: bool);
}

/// A cache's slab layer: its slab lists behind a spin
/// lock, and every operation on its slabs: growing (pages from the
/// source, carved into objects), taking and returning objects (bufctl
/// state changes with them), reaping empty slabs, and the bufctl hash's
/// table. What it needs of the cache comes through `owner` ([`SlabOwner`]).
pub(crate) struct SlabLayer<P: Platform> {
    pub(crate) lists: IrqMutex<P, SlabLists>,
}

impl<P: Platform> SlabLayer<P> {
    pub(crate) fn new() -> Self {
        SlabLayer {
            lists: IrqMutex::new(SlabLists::new()),
        }
    }

    /// Lock the slab lists.
    #[inline]
    pub(crate) fn lock(&self) -> IrqMutexGuard<'_, P, SlabLists> {
        self.lists.lock()
    }

    /// Allocate up to `out.len()` objects (at least one, under one
    /// acquisition of the slab lock) from one slab, growing the layer by a
    /// slab if none has a free object; returns how many are in `out`
    /// (SLUB's `kmem_cache_alloc_bulk`: one lock, one relist; a single
    /// object is a batch of one). The objects are not constructed and not
    /// counted (the cache does both); bufctl objects come back
    /// `BufctlState::Cached`. A corrupted free list met on the way is
    /// reported (after the lock is dropped) and repaired.
    ///
    /// # Errors
    /// [`AllocError::OutOfMemory`]: no free object and no slab could be
    /// made (the page source is dry even after the reap).
    pub(crate) fn alloc_batch<O: SlabOwner<Platform = P>>(
        owner: &O,
        out: &mut [*mut u8],
    ) -> Result<usize, AllocError> {
        let (layer, params) = owner.slab();
        let mut bad = None;
        let take = |layer: &mut SlabLists, bad: &mut _, out: &mut [*mut u8]| {
            layer.take_objects(params.kind, |base| params.free_list(base), bad, out)
        };
        let taken = take(&mut layer.lock(), &mut bad, out);
        layer.report_bad_link(params, owner, bad.take());
        if taken > 0 {
            return Ok(taken);
        }
        // Grow with no lock held: the page source and the bootstrap caches
        // may be called from here.
        let slab = match layer.grow(params, owner) {
            Ok(slab) => slab,
            // Out of memory even after the reap (see `grow_timed`); but the
            // reap may have drained our own magazines into our slabs.
            Err(error) => {
                let taken = take(&mut layer.lock(), &mut bad, out);
                layer.report_bad_link(params, owner, bad);
                return if taken > 0 { Ok(taken) } else { Err(error) };
            }
        };
        let mut lists = layer.lock();
        // SAFETY: `grow` returned a fresh, unlisted, alive slab.
        unsafe { lists.push(slab, SlabList::Empty) };
        let taken = take(&mut lists, &mut bad, out);
        drop(lists);
        layer.report_bad_link(params, owner, bad);
        layer.maybe_grow_hash(params, owner);
        if taken > 0 {
            Ok(taken)
        } else {
            Err(AllocError::OutOfMemory)
        }
    }

    /// One object of `owner`'s slab layer ([`Self::alloc_batch`] of one),
    /// not constructed and not counted: slab metadata (from the bootstrap
    /// cache [`SlabOwner::metadata`] names), magazines, tag side arrays,
    /// cache structs, a refill's single object.
    ///
    /// # Errors
    /// As for [`Self::alloc_batch`].
    pub(crate) fn alloc<O: SlabOwner<Platform = P>>(owner: &O) -> Result<NonNull<u8>, AllocError> {
        let mut obj = [ptr::null_mut(); 1];
        Self::alloc_batch(owner, &mut obj)?;
        NonNull::new(obj[0]).ok_or(AllocError::OutOfMemory)
    }

    /// Report a free-list link that failed its check (`take_objects`).
    fn report_bad_link<O: SlabOwner<Platform = P>>(
        &self,
        params: &SlabParams,
        owner: &O,
        bad: Option<(*mut Slab, BadLink)>,
    ) {
        let Some((slab, link)) = bad else {
            return;
        };
        let mut report = ErrorReport::new(ErrorKind::FreeListCorrupted, owner.name(), link.obj);
        report.object = link.obj;
        report.slab = slab as usize;
        report.corruption = Some(crate::debug::Mismatch {
            offset: params.freeptr_offset,
            expected: 0,
            found: link.decoded as u64,
        });
        owner.report(report);
    }

    /// The slab a busy object of this cache's slab layer was checked
    /// against: the header for a small slab (null for bufctl slabs: the
    /// hash decides).
    fn slab_of(&self, params: &SlabParams, obj: *mut u8) -> *mut Slab {
        match params.kind {
            SlabKind::Small => params.small_slab_of(obj as usize),
            SlabKind::Bufctl => ptr::null_mut(),
        }
    }

    /// Return `objs` to `owner`'s slab layer under one lock acquisition
    /// (dropped only to report a refused object: a double free that
    /// reached the slab layer, or an object not busy there). No
    /// destructor runs here: the cache runs its own first
    /// (`KmemCache::slab_free_objects`).
    ///
    /// # Safety
    /// Every pointer is an object start of a live slab of this cache (small
    /// slabs) or was handed out by it (bufctl slabs), in no magazine and
    /// with no caller.
    pub(crate) unsafe fn free_objects<O: SlabOwner<Platform = P>>(owner: &O, objs: &[*mut u8]) {
        let (layer, params) = owner.slab();
        let mut lists = layer.lock();
        for &obj in objs {
            let slab = layer.slab_of(params, obj);
            let list = params.free_list(slab_base(slab));
            // SAFETY: per the caller.
            if let Err(kind) = unsafe { lists.put_object(params.kind, obj, slab, list) } {
                drop(lists);
                layer.report_refusal(owner, kind, obj, slab);
                lists = layer.lock();
            }
        }
    }

    /// Report an object the slab layer refused (`put_object`).
    fn report_refusal<O: SlabOwner<Platform = P>>(
        &self,
        owner: &O,
        kind: ErrorKind,
        obj: *mut u8,
        slab: *mut Slab,
    ) {
        let addr = obj as usize;
        let mut report = ErrorReport::new(kind, owner.name(), addr);
        report.slab = slab as usize;
        if kind == ErrorKind::DuplicateFree {
            report.object = addr;
        }
        owner.report(report);
    }

    /// Make a new slab: pages from the source, carved into objects, and
    /// registered in the page map. Runs with no lock held.
    fn grow<O: SlabOwner<Platform = P>>(
        &self,
        params: &SlabParams,
        owner: &O,
    ) -> Result<*mut Slab, AllocError> {
        let start = time_stats_start!(O::Platform);
        let grown = self.grow_timed(params, owner);
        time_stats_end!(O::Platform, start);
        grown
    }

    #[expect(
        clippy::cast_ptr_alignment,
        reason = "kmem_slab objects are aligned for Slab (boot cache geometry)"
    )]
    fn grow_timed<O: SlabOwner<Platform = P>>(
        &self,
        params: &SlabParams,
        owner: &O,
    ) -> Result<*mut Slab, AllocError> {
        let nr_pages = params.nr_pages_per_slab;
        let pages = match params.source.alloc_pages(nr_pages) {
            Ok(pages) => pages,
            // Out of memory: reap caches (their CPUs' magazines, depots,
            // empty slabs), largest objects first, until the pages fit.
            Err(error) => owner
                .reap_for_pressure(params.source, nr_pages)
                .ok_or(error)?,
        };
        let base = pages.as_ptr() as usize;
        let slab = match params.kind {
            SlabKind::Small if !params.header_off_slab => {
                (base + nr_pages * PAGE_SIZE - core::mem::size_of::<Slab>()) as *mut Slab
            }
            SlabKind::Small | SlabKind::Bufctl => {
                match Self::alloc(owner.metadata(Metadata::Slab)) {
                    Ok(slab) => slab.as_ptr().cast::<Slab>(),
                    Err(error) => {
                        // SAFETY: the pages came from this source just now.
                        unsafe { params.source.free_pages(pages, nr_pages) };
                        return Err(error);
                    }
                }
            }
        };
        // Object 0 (after a left redzone's bytes).
        let objs = base + params.obj_offset;
        // The geometry keeps both counts in range (`Geometry::new`).
        debug_assert!(
            params.nr_objs_per_slab <= u16::MAX as usize && nr_pages <= u32::MAX as usize
        );
        // SAFETY: `slab` is either the header area at the end of our fresh
        // slab or a fresh kmem_slab object, both writable and ours.
        unsafe {
            slab.write(Slab {
                magic: SLAB_MAGIC,
                nr_pages: nr_pages as u32,
                nr_busy: 0,
                nr_objs: params.nr_objs_per_slab as u16,
                list: SlabList::Empty,
                nr_fresh: 0,
                cache: owner.id(),
                prev: ptr::null_mut(),
                next: ptr::null_mut(),
                base: objs,
                free: ptr::null_mut(),
                // No tagged object yet: no side array.
                #[cfg(feature = "alloc-profiling")]
                tags: AtomicPtr::new(crate::alloc_tag::no_tags()),
                #[cfg(not(feature = "alloc-profiling"))]
                _no_tags: 0,
                free_map: [const { AtomicU64::new(0) }; 8],
            });
        }
        if params.debug {
            // SAFETY: our fresh slab, initialised above, ours alone.
            unsafe { owner.debug_slab(slab, true) };
        }
        let carved = match params.kind {
            SlabKind::Small => {
                let list = params.free_list(objs);
                // In a random order (Linux SLAB_FREELIST_RANDOM), drawn
                // as the objects are taken (bitmap mode); a debug
                // cache's threaded in address order, so that the same
                // boot line lays objects out the same way for whoever
                // debugs.
                // SAFETY: slab initialised above (its bitmap clear), ours
                // alone; every object lies inside our pages below the
                // header, its link word 8-aligned inside its stride.
                unsafe {
                    let map = &(*slab).free_map;
                    if params.debug {
                        (*slab).free = list.carve(map) as *mut u8;
                    } else {
                        list.fresh(map);
                        (*slab).nr_fresh = params.nr_objs_per_slab as u16;
                    }
                }
                Ok(())
            }
            SlabKind::Bufctl => self.carve_bufctls(params, owner, slab),
        };
        if let Err(error) = carved {
            // SAFETY: the slab was never listed or registered.
            unsafe { self.destroy_slab(params, owner, slab, false) };
            return Err(error);
        }
        if params.on_primary {
            // SAFETY: slab initialised above (owner and first object).
            let (cache, obj_base) = unsafe { ((*slab).cache as usize, (*slab).base) };
            let registered = params.page_map.set_slab(
                base,
                nr_pages,
                slab as usize,
                cache,
                params.stride,
                obj_base,
            );
            if !registered {
                // A page source outside its own span is broken; refuse its
                // memory rather than hand out pages kfree cannot find.
                // SAFETY: never listed or registered.
                unsafe { self.destroy_slab(params, owner, slab, false) };
                return Err(AllocError::OutOfMemory);
            }
        }
        Ok(slab)
    }

    /// One bufctl per object, from `kmem_bufctl`.
    #[expect(
        clippy::cast_ptr_alignment,
        reason = "kmem_bufctl objects are aligned for Bufctl (boot cache geometry)"
    )]
    fn carve_bufctls<O: SlabOwner<Platform = P>>(
        &self,
        params: &SlabParams,
        owner: &O,
        slab: *mut Slab,
    ) -> Result<(), AllocError> {
        // SAFETY: slab initialised by grow.
        let base = unsafe { (*slab).base };
        for index in (0..params.nr_objs_per_slab).rev() {
            let bufctl = Self::alloc(owner.metadata(Metadata::Bufctl))?
                .as_ptr()
                .cast::<Bufctl>();
            // SAFETY: fresh kmem_bufctl object, ours to write; slab alive.
            unsafe {
                bufctl.write(Bufctl {
                    hash_next: ptr::null_mut(),
                    free_next: (*slab).free.cast(),
                    addr: base + index * params.stride,
                    slab,
                    state: BufctlState::Free,
                    #[cfg(feature = "alloc-profiling")]
                    tag: None,
                });
                (*slab).free = bufctl.cast();
            }
        }
        Ok(())
    }

    /// Free a slab that is on no list and has no busy objects: clear its
    /// page-map entries, free its bufctls and struct, return its pages.
    ///
    /// # Safety
    /// `slab` is an alive slab of this cache, unlisted, with no busy
    /// objects; `registered` says whether its pages are in the page map.
    #[expect(
        clippy::cast_ptr_alignment,
        reason = "a Bufctl slab's free list links kmem_bufctl objects, aligned for Bufctl"
    )]
    unsafe fn destroy_slab<O: SlabOwner<Platform = P>>(
        &self,
        params: &SlabParams,
        owner: &O,
        slab: *mut Slab,
        registered: bool,
    ) {
        // SAFETY: per the caller, the slab is alive and ours alone.
        unsafe {
            debug_assert_eq!((*slab).nr_busy, 0);
            let base = (*slab).base - params.obj_offset;
            let nr_pages = (*slab).nr_pages as usize;
            if registered {
                params.page_map.clear_range(base, nr_pages);
            }
            (*slab).magic = 0;
            // No busy object, so nobody installs a side array meanwhile
            // (the cache's `install_tag_array`, a `Metadata::TagArray`).
            #[cfg(feature = "alloc-profiling")]
            {
                let tags = (*slab).tags.load(Ordering::Acquire);
                if tags != crate::alloc_tag::no_tags() {
                    Self::free_objects(owner.metadata(Metadata::tag_array(params)), &[tags.cast()]);
                }
            }
            if params.kind == SlabKind::Bufctl {
                let mut bufctl = (*slab).free.cast::<Bufctl>();
                while !bufctl.is_null() {
                    let next = (*bufctl).free_next;
                    Self::free_objects(owner.metadata(Metadata::Bufctl), &[bufctl.cast()]);
                    bufctl = next;
                }
            }
            if params.kind == SlabKind::Bufctl || params.header_off_slab {
                Self::free_objects(owner.metadata(Metadata::Slab), &[slab.cast()]);
            }
            if let Some(pages) = NonNull::new(base as *mut u8) {
                params.source.free_pages(pages, nr_pages);
            }
        }
    }

    /// Return every empty slab to the page source, then shrink the bufctl
    /// hash if its load fell low (illumos `kmem_hash_rescale`): back to
    /// the inline buckets (no pages), or to a smaller page-backed table
    /// (allocated here, with no lock held; if that fails the table stays
    /// as it is), the old table's pages back to the metadata source
    /// (not counted). Returns the slabs' pages freed.
    pub(crate) fn reap<O: SlabOwner<Platform = P>>(owner: &O) -> usize {
        let (layer, params) = owner.slab();
        let mut slab = layer.lock().take_empty();
        let mut nr_pages = 0;
        while !slab.is_null() {
            // SAFETY: detached empty slabs are alive, unlisted and have no
            // busy objects; they are registered if we are on the primary.
            unsafe {
                let next = (*slab).next;
                nr_pages += (*slab).nr_pages as usize;
                if params.debug {
                    owner.debug_slab(slab, false);
                }
                layer.destroy_slab(params, owner, slab, params.on_primary);
                slab = next;
            }
        }
        layer.shrink_hash(owner);
        nr_pages
    }

    /// Drop every slab's pages without looking at their objects or
    /// freeing metadata (teardown after a failed `init`, when the metadata
    /// caches' pages are dropped wholesale afterwards); the bufctl hash
    /// emptied first (its entries are such metadata) and its table's
    /// pages given back.
    ///
    /// # Safety
    /// Nothing uses this cache or its objects afterwards; metadata caches
    /// are discarded after the caches whose metadata they hold.
    pub(crate) unsafe fn discard_all<O: SlabOwner<Platform = P>>(owner: &O) {
        let (layer, params) = owner.slab();
        layer.lock().hash.drain(|_| {});
        layer.shrink_hash(owner);
        let mut slab = layer.lock().take_all();
        while !slab.is_null() {
            // SAFETY: detached slabs are alive until their pages go back;
            // `next` is read before the page (maybe holding the header) goes.
            unsafe {
                let next = (*slab).next;
                let base = (*slab).base - params.obj_offset;
                let nr_pages = (*slab).nr_pages as usize;
                if params.on_primary {
                    params.page_map.clear_range(base, nr_pages);
                }
                (*slab).magic = 0;
                if let Some(pages) = NonNull::new(base as *mut u8) {
                    params.source.free_pages(pages, nr_pages);
                }
                slab = next;
            }
        }
    }

    /// Grow the bufctl hash if its load is too high. Runs with no lock held.
    fn maybe_grow_hash<O: SlabOwner<Platform = P>>(&self, params: &SlabParams, owner: &O) {
        if params.kind == SlabKind::Bufctl {
            rescale_locked(
                &self.lists,
                |lists| &mut lists.hash,
                AddrHash::wants_grow,
                owner.metadata_source(),
            );
        }
    }

    /// Shrink the bufctl hash if its load fell low ([`Self::reap`]).
    fn shrink_hash<O: SlabOwner<Platform = P>>(&self, owner: &O) {
        rescale_locked(
            &self.lists,
            |lists| &mut lists.hash,
            AddrHash::wants_shrink,
            owner.metadata_source(),
        );
    }
}
