//! [`Allocator`]: all global state — the bootstrap caches, the cache list,
//! the kmalloc size classes, the page map and page-granular kmalloc — and
//! the `GlobalAlloc` / `core::alloc::Allocator` shims.

use core::alloc::{GlobalAlloc, Layout};
use core::cell::UnsafeCell;
use core::fmt::{self, Write as _};
use core::mem::MaybeUninit;
use core::ptr::{self, NonNull};
use core::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, AtomicUsize, Ordering};

use spin::Mutex;

use crate::cache::{
    CacheFlags, CacheSpec, CpuCacheStats, Ctor, Dtor, FastFree, Geometry, HOT_BOOTSTRAP,
    HOT_KMEMTRACE, HOT_PROFILING, KmemCache,
};
use crate::error::{AllocError, FreeError};
use crate::kmemtrace::{
    CacheRecord, DumpInfo, DumpSummary, EventFields, EventKind, EventType, Kmemtrace,
    KmemtraceConfig, KmemtraceCpuStatus, KmemtraceError, KmemtraceStatus,
};
use crate::magazine::{MAG_INITIAL_ROUNDS, Magazine, PcpuCache};
use crate::pagemap::{PageMap, TAG_LARGE_HEAD, TAG_LARGE_TAIL, TAG_MASK, TAG_SLAB};
use crate::platform::{NullSource, PAGE_SHIFT, PAGE_SIZE, PageSource, Platform, same_source};
use crate::slab::{Bufctl, Slab};
use crate::trace::TraceNode;

/// The kmalloc size classes (the Linux set), in bytes. Cache `i` is named
/// `kmalloc-<KMALLOC_SIZES[i]>`.
pub const KMALLOC_SIZES: [usize; 13] = [
    8, 16, 32, 64, 96, 128, 192, 256, 512, 1024, 2048, 4096, 8192,
];
/// Largest kmalloc served by a size class; larger requests are
/// page-granular.
pub const KMALLOC_MAX_SIZE: usize = 8192;
const NR_KMALLOC: usize = KMALLOC_SIZES.len();

/// Class index for sizes 1..=192, by `(size - 1) / 8`.
const SMALL_CLASS_INDEX: [u8; 24] = [
    0, 1, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6, 6, 6, 6, 6,
];

const _: () = {
    // The class index shortcut above and the log2 rule below agree with
    // the table.
    assert!(
        KMALLOC_SIZES[6] == 192 && KMALLOC_SIZES[7] == 256 && KMALLOC_SIZES[12] == KMALLOC_MAX_SIZE
    );
    // The metadata caches that bufctl slabs need (and kmem_magazine) must
    // themselves use small-object slabs, which need no metadata: otherwise
    // growing them would recurse forever.
    assert!(core::mem::size_of::<Magazine>() <= crate::slab::SMALL_MAX_STRIDE);
    assert!(core::mem::size_of::<Slab>() <= crate::slab::SMALL_MAX_STRIDE);
    assert!(core::mem::size_of::<Bufctl>() <= crate::slab::SMALL_MAX_STRIDE);
    assert!(core::mem::size_of::<TraceNode>() <= crate::slab::SMALL_MAX_STRIDE);
};

/// Page-granular allocations: the head page's page-map entry is
/// `tag << 32 | nr_pages << 3 | TAG_LARGE_HEAD`, the allocation tag
/// reference riding in the upper half (0 without profiling).
const LARGE_TAG_SHIFT: u32 = 32;
/// Most pages one page-granular kmalloc may span (its count must fit below
/// the tag bits).
const LARGE_MAX_PAGES: usize = (1 << (LARGE_TAG_SHIFT - 3)) - 1;

/// Page count of a page-granular head entry.
#[inline]
fn large_nr_pages(entry: usize) -> usize {
    (entry >> 3) & LARGE_MAX_PAGES
}

/// Natural alignment of a size class: the largest power of two dividing
/// it, capped at [`PAGE_SIZE`].
pub const fn natural_align(size: usize) -> usize {
    let align = 1usize << size.trailing_zeros();
    if align > PAGE_SIZE { PAGE_SIZE } else { align }
}

/// The bootstrap caches, in creation order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BootCache {
    Magazine = 0,
    Cache = 1,
    Slab = 2,
    Bufctl = 3,
    Trace = 4,
    Pcpu = 5,
}
const NR_BOOT: usize = 6;
const BOOT_NAMES: [&str; NR_BOOT] = [
    "kmem_magazine",
    "kmem_cache",
    "kmem_slab",
    "kmem_bufctl",
    "kmem_trace",
    "kmem_pcpu",
];

const STATE_UNINIT: u8 = 0;
const STATE_INITIALIZING: u8 = 1;
const STATE_READY: u8 = 2;

/// Page-granular kmalloc statistics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LargeStats {
    /// Live page-granular allocations.
    pub nr_live: usize,
    /// Bytes they occupy (whole pages).
    pub live_bytes: usize,
    /// Page-granular allocations ever.
    pub nr_allocs_ever: u64,
}

/// The list of all caches in creation order (intrusive, through
/// [`KmemCache::links`](crate::cache::CacheLinks)).
struct CacheList<P: Platform> {
    head: *const KmemCache<P>,
    tail: *const KmemCache<P>,
}

// SAFETY: the caches are Sync; the list is only walked under its mutex.
unsafe impl<P: Platform> Send for CacheList<P> {}

/// The slab allocator: everything global.
///
/// Create it in a `static` with [`Allocator::new`], bring it up with
/// [`Allocator::init`]. Before `init` completes, allocations fail
/// (`GlobalAlloc` returns null) and frees are refused.
pub struct Allocator<P: Platform> {
    state: AtomicU8,
    // The cells below are written only by `init` while `state` is
    // INITIALIZING (one thread, exclusive by the state CAS) and read after
    // it is READY (Acquire), or by that same thread during init.
    source: UnsafeCell<&'static dyn PageSource>,
    page_map: UnsafeCell<PageMap>,
    page_map_pages: UnsafeCell<usize>,
    nr_cpus: UnsafeCell<usize>,
    boot: UnsafeCell<MaybeUninit<[KmemCache<P>; NR_BOOT]>>,
    nr_boot: UnsafeCell<usize>,
    kmalloc: UnsafeCell<[*const KmemCache<P>; NR_KMALLOC]>,
    caches: Mutex<CacheList<P>>,
    large_nr_live: AtomicUsize,
    large_live_pages: AtomicUsize,
    large_nr_allocs_ever: AtomicU64,
    nr_bad_frees: AtomicU64,
    free_error_hook: Mutex<Option<fn(&FreeError)>>,
    /// Allocation profiling switched on ([`Allocator::set_alloc_profiling`]):
    /// written under the cache-list lock, mirrored in every cache's
    /// `HOT_PROFILING` bit; read alone by page-granular kmalloc.
    alloc_profiling: AtomicBool,
    /// The next cache id (kmemtrace).
    next_cache_id: AtomicU32,
    /// kmemtrace: per-CPU event rings and the recording state.
    kmemtrace: Kmemtrace,
}

// SAFETY: see the comment on the fields: the UnsafeCells are written only
// during init by the one initialising thread and are read-only afterwards;
// everything else is atomics, spin locks, and caches that are Sync.
unsafe impl<P: Platform> Sync for Allocator<P> {}
// SAFETY: as above.
unsafe impl<P: Platform> Send for Allocator<P> {}

impl<P: Platform> Default for Allocator<P> {
    fn default() -> Self {
        Self::new()
    }
}

/// A fixed buffer for a cache name.
struct NameBuf {
    bytes: [u8; 32],
    len: usize,
}

impl fmt::Write for NameBuf {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let end = self.len + s.len();
        if end > 31 {
            return Err(fmt::Error);
        }
        self.bytes[self.len..end].copy_from_slice(s.as_bytes());
        self.len = end;
        Ok(())
    }
}

impl NameBuf {
    fn as_str(&self) -> &str {
        core::str::from_utf8(&self.bytes[..self.len]).unwrap_or("?")
    }
}

impl<P: Platform> Allocator<P> {
    /// An allocator that is not initialised yet; usable in a `static`.
    pub const fn new() -> Self {
        Allocator {
            state: AtomicU8::new(STATE_UNINIT),
            source: UnsafeCell::new(&NullSource),
            page_map: UnsafeCell::new(PageMap::empty()),
            page_map_pages: UnsafeCell::new(0),
            nr_cpus: UnsafeCell::new(1),
            boot: UnsafeCell::new(MaybeUninit::uninit()),
            nr_boot: UnsafeCell::new(0),
            kmalloc: UnsafeCell::new([ptr::null(); NR_KMALLOC]),
            caches: Mutex::new(CacheList {
                head: ptr::null(),
                tail: ptr::null(),
            }),
            large_nr_live: AtomicUsize::new(0),
            large_live_pages: AtomicUsize::new(0),
            large_nr_allocs_ever: AtomicU64::new(0),
            nr_bad_frees: AtomicU64::new(0),
            free_error_hook: Mutex::new(None),
            alloc_profiling: AtomicBool::new(true),
            next_cache_id: AtomicU32::new(1),
            kmemtrace: Kmemtrace::new(),
        }
    }

    /// Switch allocation profiling (feature `alloc-profiling`) on or off
    /// for every cache, present and future: a kernel calls this whenever
    /// its own switch flips. On (the default), every allocation asks
    /// [`Platform::alloc_tag_current`] for its tag and explicit tags are
    /// charged; off, nothing is asked or charged (objects get tag
    /// reference 0, their frees uncharge nothing) and the alloc fast path
    /// is the compiled-out one. Without the feature, a no-op.
    pub fn set_alloc_profiling(&self, on: bool) {
        if !cfg!(feature = "alloc-profiling") {
            return;
        }
        let list = self.caches.lock();
        self.alloc_profiling.store(on, Ordering::Relaxed);
        let mut cache = list.head;
        while !cache.is_null() {
            // SAFETY: caches on the list are alive while we hold its lock;
            // links are only touched under it.
            unsafe {
                if on {
                    (*cache)
                        .hot_flags
                        .fetch_or(HOT_PROFILING, Ordering::Relaxed);
                } else {
                    (*cache)
                        .hot_flags
                        .fetch_and(!HOT_PROFILING, Ordering::Relaxed);
                }
                cache = (*(*cache).links.get()).next;
            }
        }
    }

    /// Whether allocation profiling is switched on
    /// ([`Allocator::set_alloc_profiling`]; false without feature
    /// `alloc-profiling`).
    pub fn alloc_profiling(&self) -> bool {
        cfg!(feature = "alloc-profiling") && self.alloc_profiling.load(Ordering::Relaxed)
    }

    /// Bring the allocator up on `source`, its primary page source: build
    /// the page map (one word per page of `source.span()`, from the source
    /// itself), the bootstrap caches (`kmem_magazine`, `kmem_cache`,
    /// `kmem_slab`, `kmem_bufctl`, `kmem_trace`, `kmem_pcpu`) and the
    /// kmalloc caches. Reads [`Platform::max_cpus`].
    ///
    /// # Errors
    /// [`AllocError::AlreadyInitialized`] if called before (or during
    /// another call); [`AllocError::OutOfMemory`] if the source cannot
    /// supply the initial pages — everything taken is given back and
    /// `init` may be retried; [`AllocError::InvalidLayout`] if the
    /// source's span is empty.
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
        match self.init_inner(source) {
            Ok(()) => {
                self.state.store(STATE_READY, Ordering::Release);
                Ok(())
            }
            Err(error) => {
                // SAFETY: state is INITIALIZING and owned by this call; no
                // cache or object has been handed out.
                unsafe { self.teardown() };
                self.state.store(STATE_UNINIT, Ordering::Release);
                Err(error)
            }
        }
    }

    fn init_inner(&'static self, source: &'static dyn PageSource) -> Result<(), AllocError> {
        let nr_cpus = P::max_cpus().max(1);
        // SAFETY: INITIALIZING: this thread owns the init-only cells.
        unsafe {
            *self.source.get() = source;
            *self.nr_cpus.get() = nr_cpus;
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
        // SAFETY: map_pages fresh pages from the source: writable, ours;
        // all-zero is a valid array of AtomicUsize (all "not slab memory").
        unsafe { ptr::write_bytes(map.as_ptr(), 0, map_pages * PAGE_SIZE) };
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

        let boot_layouts: [(usize, usize); NR_BOOT] = [
            (
                core::mem::size_of::<Magazine>(),
                core::mem::align_of::<Magazine>(),
            ),
            (
                core::mem::size_of::<KmemCache<P>>(),
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
            (
                nr_cpus * core::mem::size_of::<PcpuCache>(),
                core::mem::align_of::<PcpuCache>(),
            ),
        ];
        for (index, (size, align)) in boot_layouts.into_iter().enumerate() {
            let spec = CacheSpec {
                name: BOOT_NAMES[index],
                size,
                geometry: Geometry::new(size, align, CacheFlags::NOTRACE, false)?,
                flags: CacheFlags::NOTRACE,
                ctor: None,
                dtor: None,
                source,
                on_primary: true,
                bootstrap: true,
                permanent: true,
                id: self.next_cache_id.fetch_add(1, Ordering::Relaxed),
            };
            // Bootstrap caches have no magazine layer (pcpu null): metadata
            // goes straight to and from their slab layers.
            let cache = KmemCache::construct(spec, self, page_map, ptr::null_mut(), nr_cpus);
            // SAFETY: INITIALIZING; slot `index` < NR_BOOT is not yet
            // initialised and nothing references it.
            unsafe {
                let slot = self.boot.get().cast::<KmemCache<P>>().add(index);
                slot.write(cache);
                *self.nr_boot.get() = index + 1;
                self.link_cache(slot);
            }
        }

        for (index, &size) in KMALLOC_SIZES.iter().enumerate() {
            let mut name = NameBuf {
                bytes: [0; 32],
                len: 0,
            };
            // "kmalloc-8192" fits in 31 bytes.
            let _ = write!(name, "kmalloc-{size}");
            let cache = self.create_cache(
                name.as_str(),
                size,
                natural_align(size),
                CacheFlags::empty(),
                None,
                None,
                None,
                true,
            )?;
            // SAFETY: INITIALIZING: this thread owns the init-only cells.
            unsafe { (*self.kmalloc.get())[index] = cache };
        }
        Ok(())
    }

    /// Give back everything a failed `init` took.
    ///
    /// # Safety
    /// Only from `init`, while INITIALIZING, before anything was handed out.
    unsafe fn teardown(&self) {
        // SAFETY: INITIALIZING: we own every cell; every cache on the list
        // is alive. Caches are discarded in an order that keeps the
        // metadata they read alive: ordinary caches (their structs and
        // per-CPU arrays live in bootstrap slabs), then bootstrap bufctl
        // caches (their slab structs live in kmem_slab / kmem_bufctl),
        // then bootstrap small-slab caches (headers inside their own pages).
        unsafe {
            let head = self.caches.lock().head;
            let mut cache = head;
            while !cache.is_null() {
                let next = (*(*cache).links.get()).next;
                if !(*cache).is_bootstrap() {
                    (*cache).slab.lock().hash.drain(|_| {});
                    (*cache).free_hash_table();
                    (*cache).discard_all_slabs();
                }
                cache = next;
            }
            let nr_boot = *self.nr_boot.get();
            for pass_small in [false, true] {
                for index in 0..nr_boot {
                    let boot = &*self.boot.get().cast::<KmemCache<P>>().add(index);
                    if (boot.kind == crate::cache::SlabKind::Small) == pass_small {
                        boot.slab.lock().hash.drain(|_| {});
                        boot.free_hash_table();
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
            *self.kmalloc.get() = [ptr::null(); NR_KMALLOC];
            *self.source.get() = &NullSource;
            let mut list = self.caches.lock();
            list.head = ptr::null();
            list.tail = ptr::null();
        }
    }

    /// Whether `init` has completed.
    #[inline]
    pub fn is_ready(&self) -> bool {
        self.state.load(Ordering::Acquire) == STATE_READY
    }

    /// The primary page source (a source named `"none"` with no memory
    /// before `init`).
    pub fn page_source(&self) -> &'static dyn PageSource {
        if self.is_ready() {
            self.primary_source()
        } else {
            &NullSource
        }
    }

    /// Number of per-CPU caches per cache (`Platform::max_cpus` at init).
    pub fn nr_cpus(&self) -> usize {
        if !self.is_ready() {
            return 0;
        }
        // SAFETY: READY: init-only cells are immutable.
        unsafe { *self.nr_cpus.get() }
    }

    /// The primary source, without the ready check (init and caches).
    pub(crate) fn primary_source(&self) -> &'static dyn PageSource {
        // SAFETY: written only during init by the thread that also makes
        // every internal call before READY; read-only afterwards.
        unsafe { *self.source.get() }
    }

    fn page_map(&self) -> PageMap {
        // SAFETY: as for primary_source.
        unsafe { *self.page_map.get() }
    }

    /// A bootstrap cache.
    pub(crate) fn boot(&self, which: BootCache) -> &KmemCache<P> {
        // SAFETY: bootstrap caches are written during init before any
        // internal use of them (creation order matches dependencies:
        // metadata caches are small-slab caches or need only kmem_slab and
        // kmem_bufctl, created before anything allocates) and never moved.
        unsafe { &*self.boot.get().cast::<KmemCache<P>>().add(which as usize) }
    }

    /// # Safety
    /// `cache` is alive, in no list, and lives until unlinked.
    unsafe fn link_cache(&self, cache: *const KmemCache<P>) {
        let mut list = self.caches.lock();
        // SAFETY: links are only touched under the cache-list lock; cache
        // and the tail are alive.
        unsafe {
            // Inherit the profiling switch (read under the same lock as
            // set_alloc_profiling writes it).
            if self.alloc_profiling() {
                (*cache)
                    .hot_flags
                    .fetch_or(HOT_PROFILING, Ordering::Relaxed);
            }
            // And kmemtrace recording of every cache.
            if self.kmemtrace.recording_all.load(Ordering::Relaxed) && !(*cache).is_bootstrap() {
                (*cache)
                    .hot_flags
                    .fetch_or(HOT_KMEMTRACE, Ordering::Relaxed);
            }
            *(*cache).links.get() = crate::cache::CacheLinks {
                prev: list.tail,
                next: ptr::null(),
            };
            if list.tail.is_null() {
                list.head = cache;
            } else {
                (*(*list.tail).links.get()).next = cache;
            }
        }
        list.tail = cache;
    }

    /// Remove a cache from the list (destroy).
    pub(crate) fn unlink_cache(&self, cache: &KmemCache<P>) {
        let mut list = self.caches.lock();
        // SAFETY: links only under the cache-list lock; neighbours alive.
        unsafe {
            let links = &mut *cache.links.get();
            if links.prev.is_null() {
                list.head = links.next;
            } else {
                (*(*links.prev).links.get()).next = links.next;
            }
            if links.next.is_null() {
                list.tail = links.prev;
            } else {
                (*(*links.next).links.get()).prev = links.prev;
            }
            links.prev = ptr::null();
            links.next = ptr::null();
        }
    }

    /// Create an object cache.
    ///
    /// - `name`: copied; cut to 31 bytes (at a character boundary).
    /// - `size`: object size in bytes, 1..=2^30.
    /// - `align`: power of two, at most [`PAGE_SIZE`]; 0 means no
    ///   requirement. Objects are always at least 8-aligned.
    /// - `ctor` / `dtor`: see [`Ctor`] and [`Dtor`].
    /// - `source`: page source for the slabs; `None` means the primary
    ///   source. Caches on other sources get no page-map entries: their
    ///   objects cannot be `kfree`d, and wrong-cache frees into them are
    ///   reported as `NotAllocated`.
    ///
    /// Buffers up to `PAGE_SIZE / 8` bytes (and not `NOTOUCH`) get
    /// small-object slabs (one page); larger ones bufctl slabs.
    ///
    /// # Errors
    /// [`AllocError::NotInitialized`], [`AllocError::InvalidLayout`] (size
    /// 0 or too large, bad alignment), [`AllocError::OutOfMemory`] (no
    /// memory for the cache's struct or per-CPU array).
    #[allow(clippy::too_many_arguments)] // the kmem_cache_create signature
    pub fn cache_create(
        &'static self,
        name: &str,
        size: usize,
        align: usize,
        flags: CacheFlags,
        ctor: Option<Ctor>,
        dtor: Option<Dtor>,
        source: Option<&'static dyn PageSource>,
    ) -> Result<&'static KmemCache<P>, AllocError> {
        if !self.is_ready() {
            return Err(AllocError::NotInitialized);
        }
        self.create_cache(name, size, align, flags, ctor, dtor, source, false)
    }

    #[allow(clippy::too_many_arguments)]
    fn create_cache(
        &'static self,
        name: &str,
        size: usize,
        align: usize,
        flags: CacheFlags,
        ctor: Option<Ctor>,
        dtor: Option<Dtor>,
        source: Option<&'static dyn PageSource>,
        permanent: bool,
    ) -> Result<&'static KmemCache<P>, AllocError> {
        let geometry = Geometry::new(size, align, flags, true)?;
        let primary = self.primary_source();
        let source = source.unwrap_or(primary);
        // SAFETY: READY or INITIALIZING on this thread: cells readable.
        let nr_cpus = unsafe { *self.nr_cpus.get() };
        let mem = self
            .boot(BootCache::Cache)
            .slab_alloc_raw()?
            .as_ptr()
            .cast::<KmemCache<P>>();
        let pcpu = match self.boot(BootCache::Pcpu).slab_alloc_raw() {
            Ok(pcpu) => pcpu.as_ptr().cast::<PcpuCache>(),
            Err(error) => {
                // SAFETY: fresh kmem_cache object, unused.
                unsafe { self.boot(BootCache::Cache).slab_free_raw(mem.cast()) };
                return Err(error);
            }
        };
        let spec = CacheSpec {
            name,
            size,
            geometry,
            flags,
            ctor,
            dtor,
            source,
            on_primary: same_source(source, primary),
            bootstrap: false,
            permanent,
            id: self.next_cache_id.fetch_add(1, Ordering::Relaxed),
        };
        // SAFETY: `pcpu` is a fresh kmem_pcpu object of nr_cpus
        // PcpuCaches (64-aligned); `mem` a fresh kmem_cache object sized
        // and aligned for a KmemCache<P>. Both are ours; once linked the
        // cache lives until destroy.
        unsafe {
            for cpu in 0..nr_cpus {
                pcpu.add(cpu).write(PcpuCache::new(MAG_INITIAL_ROUNDS));
            }
            mem.write(KmemCache::construct(
                spec,
                self,
                self.page_map(),
                pcpu,
                nr_cpus,
            ));
            self.link_cache(mem);
            Ok(&*mem)
        }
    }

    /// The first cache (in creation order) named `name`.
    pub fn find_cache(&self, name: &str) -> Option<&'static KmemCache<P>> {
        let mut found = None;
        self.for_each_cache(|cache| {
            if found.is_none() && cache.name() == name {
                found = Some(cache);
            }
        });
        found
    }

    /// Call `f` on every cache in creation order (bootstrap caches first,
    /// then the kmalloc caches, then caches in the order created). Runs
    /// under the cache-list lock: `f` may use the caches (stats, trace,
    /// alloc, free, reap) but must not call `find_cache`,
    /// `for_each_cache`, `reap_all`, `cache_create` or `destroy` (it would
    /// deadlock).
    pub fn for_each_cache(&self, mut f: impl FnMut(&'static KmemCache<P>)) {
        let list = self.caches.lock();
        let mut cache = list.head;
        while !cache.is_null() {
            // SAFETY: listed caches are alive while we hold the list lock;
            // they live in the static allocator or in kmem_cache objects
            // that stay until destroy (which unlinks under this lock).
            unsafe {
                f(&*cache);
                cache = (*(*cache).links.get()).next;
            }
        }
    }

    /// CPU `cpu`'s magazines summed over every cache: the allocations and
    /// frees they served (magazine hits; slab-layer misses and
    /// page-granular kmallocs are not counted) and the rounds they hold.
    /// See [`KmemCache::cpu_stats`]. Walks the cache list under its lock
    /// (like [`Allocator::for_each_cache`], so not from inside one), taking
    /// each cache's per-CPU lock of `cpu` in turn: a near-snapshot under
    /// concurrent use. All zero before `init` and for `cpu` out of range.
    pub fn cpu_stats(&self, cpu: usize) -> CpuCacheStats {
        let mut total = CpuCacheStats::default();
        self.for_each_cache(|cache| total = total + cache.cpu_stats(cpu));
        total
    }

    /// Reap every cache. Returns pages returned to page sources.
    ///
    /// Newest first, so that metadata freed by later caches (their slab
    /// structs, bufctls, magazines and cache structs) is reaped with the
    /// bootstrap caches at the end; and `kmem_slab` and `kmem_bufctl` come
    /// last of all, after `kmem_cache` and `kmem_pcpu`, whose bufctl slabs
    /// (when their objects are large) free into them. So one call leaves no
    /// empty slab anywhere.
    pub fn reap_all(&self) -> usize {
        let list = self.caches.lock();
        // Before init completes, no deferring: one pass as listed. The
        // pointers are only compared, never dereferenced.
        let ready = self.is_ready();
        let boot_base = self.boot.get().cast::<KmemCache<P>>().cast_const();
        let last = [BootCache::Bufctl, BootCache::Slab].map(|which| {
            if ready {
                boot_base.wrapping_add(which as usize)
            } else {
                ptr::null()
            }
        });
        let mut cache = list.tail;
        let mut nr_pages = 0;
        while !cache.is_null() {
            // SAFETY: as in for_each_cache.
            unsafe {
                if !last.contains(&cache) {
                    nr_pages += (*cache).reap();
                }
                cache = (*(*cache).links.get()).prev;
            }
        }
        if ready {
            for which in [BootCache::Bufctl, BootCache::Slab] {
                nr_pages += self.boot(which).reap();
            }
        }
        drop(list);
        nr_pages
    }

    /// Index of the kmalloc class for `size` bytes aligned to `align`.
    #[inline(always)]
    fn kmalloc_index(size: usize, align: usize) -> Option<usize> {
        if size == 0 || size > KMALLOC_MAX_SIZE {
            return None;
        }
        let first = if size <= 192 {
            SMALL_CLASS_INDEX[(size - 1) / 8] as usize
        } else {
            (usize::BITS - (size - 1).leading_zeros()) as usize - 1
        };
        if align <= 8 {
            // Every class is at least 8-aligned.
            return Some(first);
        }
        (first..NR_KMALLOC).find(|&index| natural_align(KMALLOC_SIZES[index]) >= align)
    }

    #[inline(always)]
    fn kmalloc_cache(&self, index: usize) -> &'static KmemCache<P> {
        debug_assert!(index < NR_KMALLOC);
        // SAFETY: READY (checked by callers): the kmalloc caches exist,
        // are permanent, and the array is immutable; index < NR_KMALLOC
        // (kmalloc_index returns class indices only).
        unsafe { &**(*self.kmalloc.get()).get_unchecked(index) }
    }

    /// The kmalloc cache that would serve `size` bytes aligned to `align`,
    /// or `None` if such a request is page-granular (or invalid, or the
    /// allocator is not ready).
    pub fn kmalloc_cache_for(&self, size: usize, align: usize) -> Option<&'static KmemCache<P>> {
        if !self.is_ready() || !align.is_power_of_two() {
            return None;
        }
        Self::kmalloc_index(size, align).map(|index| self.kmalloc_cache(index))
    }

    /// Allocate `size` bytes aligned to `align` (a power of two).
    ///
    /// Served by the smallest `kmalloc-<n>` class with `n >= size` whose
    /// natural alignment (largest power of two dividing `n`, capped at
    /// `PAGE_SIZE`) is at least `align`; otherwise page-granular from the
    /// primary source (whole pages, page-aligned).
    ///
    /// # Errors
    /// [`AllocError::NotInitialized`]; [`AllocError::InvalidLayout`] for
    /// size 0, `align` not a power of two, or `align > PAGE_SIZE` with no
    /// class able to give it; [`AllocError::OutOfMemory`].
    ///
    /// With feature `alloc-profiling`, the memory is charged to the tag
    /// [`Platform::alloc_tag_current`] names: the cache's object size for
    /// a size class (class-rounded), whole pages for a page-granular one.
    #[inline]
    pub fn kmalloc(&self, size: usize, align: usize) -> Result<NonNull<u8>, AllocError> {
        if !self.is_ready() {
            return Err(AllocError::NotInitialized);
        }
        if size == 0 || !align.is_power_of_two() {
            return Err(AllocError::InvalidLayout);
        }
        self.kmalloc_checked(size, align, crate::alloc_tag::current::<P>)
    }

    /// [`Allocator::kmalloc`] charging the memory to the allocation tag
    /// `tag` (0 charges nothing): the entry point of call sites that name
    /// their own tag (`kmalloc!`). Without feature `alloc-profiling` the
    /// tag is ignored.
    ///
    /// # Errors
    /// As for [`Allocator::kmalloc`].
    #[inline]
    pub fn kmalloc_tagged(
        &self,
        size: usize,
        align: usize,
        tag: u32,
    ) -> Result<NonNull<u8>, AllocError> {
        if !self.is_ready() {
            return Err(AllocError::NotInitialized);
        }
        if size == 0 || !align.is_power_of_two() {
            return Err(AllocError::InvalidLayout);
        }
        self.kmalloc_checked(size, align, move || tag)
    }

    /// [`Allocator::kmalloc_tagged`] once the allocator is known ready, the
    /// size non-zero and the alignment a power of two (a `Layout`'s).
    #[inline(always)]
    fn kmalloc_checked(
        &self,
        size: usize,
        align: usize,
        tag: impl Fn() -> u32,
    ) -> Result<NonNull<u8>, AllocError> {
        debug_assert!(self.is_ready() && size != 0 && align.is_power_of_two());
        match Self::kmalloc_index(size, align) {
            Some(index) => self.kmalloc_cache(index).alloc_with(tag, size),
            None => {
                let tag = if self.alloc_profiling() { tag() } else { 0 };
                crate::cache::unpack(self.large_alloc_packed(size, align, tag))
            }
        }
    }

    /// [`Self::large_alloc`] out of line, its result in one register.
    #[inline(never)]
    fn large_alloc_packed(&self, size: usize, align: usize, tag: u32) -> usize {
        let packed = crate::cache::pack(self.large_alloc(size, align, tag));
        if self.kmemtrace.recording_all.load(Ordering::Relaxed) {
            // KMEMTRACE HOOK: page-granular kmalloc (ok or failed).
            self.kmemtrace_large_alloc(packed, size);
        }
        packed
    }

    #[inline(always)]
    fn large_alloc(&self, size: usize, align: usize, tag: u32) -> Result<NonNull<u8>, AllocError> {
        if align > PAGE_SIZE || size > isize::MAX as usize {
            return Err(AllocError::InvalidLayout);
        }
        let nr_pages = size.div_ceil(PAGE_SIZE);
        if nr_pages > LARGE_MAX_PAGES {
            return Err(AllocError::OutOfMemory);
        }
        #[cfg(not(feature = "alloc-profiling"))]
        let tag = {
            let _ = tag;
            0u32
        };
        let source = self.primary_source();
        let pages = source.alloc_pages(nr_pages)?;
        let addr = pages.as_ptr() as usize;
        let registered = self.page_map().set_range(addr, nr_pages, |page| {
            if page == 0 {
                ((tag as usize) << LARGE_TAG_SHIFT) | (nr_pages << 3) | TAG_LARGE_HEAD
            } else {
                (page << 3) | TAG_LARGE_TAIL
            }
        });
        if !registered {
            // SAFETY: pages just allocated from this source, unused.
            unsafe { source.free_pages(pages, nr_pages) };
            return Err(AllocError::OutOfMemory);
        }
        self.large_nr_live.fetch_add(1, Ordering::Relaxed);
        self.large_live_pages.fetch_add(nr_pages, Ordering::Relaxed);
        self.large_nr_allocs_ever.fetch_add(1, Ordering::Relaxed);
        #[cfg(feature = "alloc-profiling")]
        if tag != 0 {
            P::alloc_tag_add(tag, pages, nr_pages * PAGE_SIZE);
        }
        Ok(pages)
    }

    /// Free memory from [`Allocator::kmalloc`] — or from any cache on the
    /// primary source (the owner is found through the page map).
    ///
    /// # Safety
    /// If `ptr` is allocated, the caller gives it up. Bad pointers are
    /// detected and refused as for [`KmemCache::free`] (same caveat for
    /// small-object double frees without `AUDIT`).
    ///
    /// # Errors
    /// [`FreeError::NotAllocated`] (outside the page map, not slab memory,
    /// or before init), [`FreeError::Misaligned`], [`FreeError::DoubleFree`].
    /// On error nothing changed.
    #[inline]
    pub unsafe fn kfree(&self, ptr: NonNull<u8>) -> Result<(), FreeError> {
        // SAFETY: per our caller.
        match unsafe { self.kfree_fast(ptr) } {
            FastFree::Done => Ok(()),
            // SAFETY: per our caller; validated, nothing changed yet.
            FastFree::Flagged(cache, slab) => unsafe { cache.free_flagged(ptr, slab) },
            // SAFETY: per our caller; the fast path changed nothing.
            FastFree::Slow => unsafe { self.kfree_slow(ptr) },
        }
    }

    /// The whole `kfree` of a slab object on the magazine-hit path: one
    /// page-map read names the slab, hence the cache (no second lookup:
    /// the owner is the slab's cache by construction), one multiply checks
    /// the object start. `Slow`, with nothing changed, for anything else.
    ///
    /// # Safety
    /// As for [`Allocator::kfree`] (the object is given up if `Done`).
    #[inline(always)]
    unsafe fn kfree_fast(&self, ptr: NonNull<u8>) -> FastFree<'static, P> {
        let addr = ptr.as_ptr() as usize;
        if !self.is_ready() {
            return FastFree::Slow;
        }
        let entry = self.page_map().get(addr);
        if entry & TAG_MASK != TAG_SLAB {
            return FastFree::Slow;
        }
        let slab = (entry & !TAG_MASK) as *mut Slab;
        // SAFETY: registered slabs are alive and belong to caches of this
        // allocator (same P), alive while they have slabs (a cache in use
        // is never destroyed: `destroy` requires no objects allocated).
        let cache: &'static KmemCache<P> = unsafe { &*(*slab).cache.cast::<KmemCache<P>>() };
        // SAFETY: the page map puts addr in this live slab of `cache`.
        if !unsafe { cache.is_object_start(slab, addr) } {
            return FastFree::Slow;
        }
        // SAFETY: validated; per our caller.
        unsafe { cache.free_fast_located(ptr, slab) }
    }

    /// [`Allocator::kfree`] past the fast path, with the error reports.
    ///
    /// # Safety
    /// As for [`Allocator::kfree`].
    #[cold]
    #[inline(never)]
    unsafe fn kfree_slow(&self, ptr: NonNull<u8>) -> Result<(), FreeError> {
        let addr = ptr.as_ptr() as usize;
        if !self.is_ready() {
            return Err(FreeError::NotAllocated { addr });
        }
        let entry = self.page_map().get(addr);
        if entry & TAG_MASK == TAG_SLAB {
            let slab = (entry & !TAG_MASK) as *mut Slab;
            // SAFETY: registered slabs are alive and belong to caches of
            // this allocator (same P), alive while they have slabs.
            let cache = unsafe { &*(*slab).cache.cast::<KmemCache<P>>() };
            // SAFETY: the page map puts addr in this live slab of `cache`.
            if let Err(error) = unsafe { cache.check_object(slab, addr) } {
                // KMEMTRACE HOOK: kfree of a pointer inside an object.
                if cache.hot_flags.load(Ordering::Relaxed) & HOT_KMEMTRACE != 0 {
                    self.kmemtrace_free(Some(cache), ptr, false);
                }
                return Err(error);
            }
            // SAFETY: located in `cache`; our caller gives it up.
            return unsafe { cache.free_located(ptr, slab) };
        }
        // SAFETY: per our caller.
        let result = unsafe { self.kfree_pages(ptr, entry) };
        if result.is_err() && self.kmemtrace.recording_all.load(Ordering::Relaxed) {
            // KMEMTRACE HOOK: kfree of a pointer that is not ours.
            self.kmemtrace_free(None, ptr, false);
        }
        result
    }

    /// `kfree` of anything but a slab object: page-granular, or refused.
    ///
    /// # Safety
    /// As for [`Allocator::kfree`]; `entry` is `ptr`'s page-map entry.
    unsafe fn kfree_pages(&self, ptr: NonNull<u8>, entry: usize) -> Result<(), FreeError> {
        let addr = ptr.as_ptr() as usize;
        let map = self.page_map();
        match entry & TAG_MASK {
            TAG_LARGE_HEAD => {
                if addr & (PAGE_SIZE - 1) != 0 {
                    return Err(FreeError::Misaligned { addr });
                }
                if !map.claim(addr, entry) {
                    return Err(FreeError::NotAllocated { addr });
                }
                let nr_pages = large_nr_pages(entry);
                if self.kmemtrace.recording_all.load(Ordering::Relaxed) {
                    // KMEMTRACE HOOK: page-granular kfree (before the pages go back).
                    self.kmemtrace_record(
                        EventKind::Free,
                        EventType::Pages,
                        0,
                        addr,
                        0,
                        nr_pages * PAGE_SIZE,
                    );
                }
                map.clear_range(addr, nr_pages);
                self.large_nr_live.fetch_sub(1, Ordering::Relaxed);
                self.large_live_pages.fetch_sub(nr_pages, Ordering::Relaxed);
                #[cfg(feature = "alloc-profiling")]
                {
                    let tag = (entry >> LARGE_TAG_SHIFT) as u32;
                    if tag != 0 {
                        P::alloc_tag_sub(tag, ptr, nr_pages * PAGE_SIZE);
                    }
                }
                // SAFETY: a live page-granular allocation of nr_pages pages
                // from the primary source, claimed by us alone (the CAS).
                unsafe { self.primary_source().free_pages(ptr, nr_pages) };
                Ok(())
            }
            TAG_LARGE_TAIL => Err(FreeError::Misaligned { addr }),
            _ => Err(FreeError::NotAllocated { addr }),
        }
    }

    /// Usable size in bytes of an allocated pointer: the object size of its
    /// cache, or the whole pages of a page-granular allocation.
    ///
    /// # Errors
    /// [`FreeError::NotAllocated`] for memory the allocator does not own;
    /// [`FreeError::Misaligned`] for a pointer not at an object start.
    /// (A free object at an object start is not detected.)
    pub fn ksize(&self, ptr: NonNull<u8>) -> Result<usize, FreeError> {
        let addr = ptr.as_ptr() as usize;
        if !self.is_ready() {
            return Err(FreeError::NotAllocated { addr });
        }
        let entry = self.page_map().get(addr);
        match entry & TAG_MASK {
            TAG_SLAB => {
                let slab = (entry & !TAG_MASK) as *mut Slab;
                // SAFETY: registered slabs are alive, caches of this allocator.
                let cache = unsafe { &*(*slab).cache.cast::<KmemCache<P>>() };
                cache.locate(addr)?;
                Ok(cache.obj_size())
            }
            TAG_LARGE_HEAD if addr & (PAGE_SIZE - 1) == 0 => Ok(large_nr_pages(entry) * PAGE_SIZE),
            TAG_LARGE_HEAD | TAG_LARGE_TAIL => Err(FreeError::Misaligned { addr }),
            _ => Err(FreeError::NotAllocated { addr }),
        }
    }

    /// Whether `ptr` points into memory this allocator handed out (a slab
    /// page of a primary-source cache or a page-granular kmalloc), judged
    /// by the page map. A kernel that used a bootstrap heap before `init`
    /// routes frees with this: `owns` → [`Allocator::kfree`], else the
    /// bootstrap heap. False before init.
    #[inline]
    pub fn owns(&self, ptr: *const u8) -> bool {
        self.is_ready() && self.page_map().get(ptr as usize) != 0
    }

    /// Page-granular kmalloc statistics.
    pub fn large_stats(&self) -> LargeStats {
        LargeStats {
            nr_live: self.large_nr_live.load(Ordering::Relaxed),
            live_bytes: self.large_live_pages.load(Ordering::Relaxed) * PAGE_SIZE,
            nr_allocs_ever: self.large_nr_allocs_ever.load(Ordering::Relaxed),
        }
    }

    /// Called with every error a `GlobalAlloc::dealloc` (or
    /// `core::alloc::Allocator::deallocate`) hits; the kernel can log or
    /// panic. The error has already been counted in
    /// [`Allocator::nr_bad_frees`] and nothing was changed.
    pub fn set_free_error_hook(&self, hook: Option<fn(&FreeError)>) {
        *self.free_error_hook.lock() = hook;
    }

    /// Refused frees seen at the `GlobalAlloc` / `Allocator` edge.
    pub fn nr_bad_frees(&self) -> u64 {
        self.nr_bad_frees.load(Ordering::Relaxed)
    }

    /// `GlobalAlloc::dealloc` past the fast path: `kfree`, reporting a
    /// refused free.
    ///
    /// # Safety
    /// As for [`Allocator::kfree`].
    #[cold]
    #[inline(never)]
    unsafe fn dealloc_slow(&self, ptr: NonNull<u8>) {
        // SAFETY: per our caller.
        if let Err(error) = unsafe { self.kfree_slow(ptr) } {
            self.report_free_error(error);
        }
    }

    #[cold]
    pub(crate) fn report_free_error(&self, error: FreeError) {
        self.nr_bad_frees.fetch_add(1, Ordering::Relaxed);
        let hook = *self.free_error_hook.lock();
        if let Some(hook) = hook {
            hook(&error);
        }
    }
}

/// kmemtrace: recording, status, dump (see [`crate::kmemtrace`]).
impl<P: Platform> Allocator<P> {
    /// Start recording events: allocate the per-CPU rings on the first
    /// call (`config.nr_subbufs` sub-buffers per CPU from the primary page
    /// source; later calls keep that size), empty them, and set the
    /// recording bit of every cache (or of the cache `config.cache_id`
    /// only). Restarting drops the events recorded so far.
    ///
    /// # Safety
    /// [`Platform::cpu_id`] returns the running CPU's own id (distinct per
    /// CPU) and [`Platform::irq_save`] keeps the caller on its CPU until
    /// `irq_restore`: each ring is written without a lock by the CPU whose
    /// id it has.
    ///
    /// # Errors
    /// [`KmemtraceError::NotInitialized`]; [`KmemtraceError::OutOfMemory`]
    /// (nothing kept, recording off); [`KmemtraceError::StackDepth`];
    /// [`KmemtraceError::TooManySubbufs`].
    pub unsafe fn kmemtrace_start(&self, config: KmemtraceConfig) -> Result<(), KmemtraceError> {
        if !self.is_ready() {
            return Err(KmemtraceError::NotInitialized);
        }
        self.kmemtrace_stop();
        self.kmemtrace
            .prepare::<P>(self.primary_source(), self.nr_cpus(), &config)?;
        self.set_kmemtrace_bits(config.cache_id);
        Ok(())
    }

    /// Stop recording (the events stay until the next start). Frees and
    /// allocations already past the recording test may still land.
    pub fn kmemtrace_stop(&self) {
        self.kmemtrace.stop();
        self.set_kmemtrace_bits(Some(u32::MAX));
    }

    /// Set `HOT_KMEMTRACE` on every non-bootstrap cache (`None`), on the
    /// cache with id `cache_id`, and clear it on the others.
    fn set_kmemtrace_bits(&self, cache_id: Option<u32>) {
        self.for_each_cache(|cache| {
            let hot = cache.hot_flags.load(Ordering::Relaxed);
            let on = hot & HOT_BOOTSTRAP == 0 && cache_id.is_none_or(|id| id == cache.id);
            if on {
                cache.hot_flags.fetch_or(HOT_KMEMTRACE, Ordering::Relaxed);
            } else {
                cache.hot_flags.fetch_and(!HOT_KMEMTRACE, Ordering::Relaxed);
            }
        });
    }

    /// Recording state, events and overruns summed over CPUs.
    pub fn kmemtrace_status(&self) -> KmemtraceStatus {
        self.kmemtrace.status()
    }

    /// One CPU's ring: events, overruns, capacity (all zero before the
    /// first start and for `cpu` out of range).
    pub fn kmemtrace_cpu_status(&self, cpu: usize) -> KmemtraceCpuStatus {
        self.kmemtrace.cpu_status(cpu)
    }

    /// Write a dump of the record to `sink`, in pieces: the header, a
    /// CACHE record per cache (caches destroyed meanwhile are not named),
    /// the stacks, each CPU's events (one record per sub-buffer, timestamps
    /// converted with `info.ticks_to_ns`), the trailer with the CRC-32 of
    /// everything before it. May run while recording: each ring is read up
    /// to the events published when the dump reaches it. `sink` must not
    /// create or destroy caches (the cache list is locked around the
    /// CACHE records).
    pub fn kmemtrace_dump(&self, info: &DumpInfo<'_>, sink: &mut dyn FnMut(&[u8])) -> DumpSummary {
        let mut caches = |emit: &mut dyn FnMut(CacheRecord<'_>)| {
            self.for_each_cache(|cache| {
                emit(CacheRecord {
                    id: cache.id,
                    obj_size: cache.obj_size as u32,
                    align: cache.align as u32,
                    flags: cache.flags.bits(),
                    name: cache.name(),
                })
            })
        };
        self.kmemtrace.dump(info, &mut caches, sink)
    }

    /// Record an allocation from `cache` (its packed result).
    #[inline(always)]
    pub(crate) fn kmemtrace_alloc(&self, cache: &KmemCache<P>, packed: usize, bytes_req: usize) {
        let (kind, ptr) = match crate::cache::unpack(packed) {
            Ok(obj) => (EventKind::Alloc, obj.as_ptr() as usize),
            Err(_) => (EventKind::FailedAlloc, 0),
        };
        let (type_id, bytes_req) = if bytes_req == 0 {
            (EventType::Cache, cache.obj_size)
        } else {
            (EventType::Kmalloc, bytes_req)
        };
        self.kmemtrace_record(kind, type_id, cache.id, ptr, bytes_req, cache.obj_size);
    }

    /// Record a free to `cache` (`None`: the pointer is no cache's), good
    /// or refused. Frees to kmalloc caches are `kfree`s.
    #[inline(always)]
    pub(crate) fn kmemtrace_free(&self, cache: Option<&KmemCache<P>>, obj: NonNull<u8>, ok: bool) {
        let kind = if ok {
            EventKind::Free
        } else {
            EventKind::BadFree
        };
        let (type_id, cache_id, bytes) = match cache {
            Some(cache) if cache.permanent => (EventType::Kmalloc, cache.id, cache.obj_size),
            Some(cache) => (EventType::Cache, cache.id, cache.obj_size),
            None => (EventType::Kmalloc, 0, 0),
        };
        self.kmemtrace_record(kind, type_id, cache_id, obj.as_ptr() as usize, 0, bytes);
    }

    /// Record a page-granular kmalloc (its packed result).
    #[cold]
    fn kmemtrace_large_alloc(&self, packed: usize, size: usize) {
        let (kind, ptr, bytes) = match crate::cache::unpack(packed) {
            Ok(pages) => (
                EventKind::Alloc,
                pages.as_ptr() as usize,
                size.div_ceil(PAGE_SIZE) * PAGE_SIZE,
            ),
            Err(_) => (EventKind::FailedAlloc, 0, 0),
        };
        self.kmemtrace_record(kind, EventType::Pages, 0, ptr, size, bytes);
    }

    #[inline(always)]
    fn kmemtrace_record(
        &self,
        kind: EventKind,
        type_id: EventType,
        cache_id: u32,
        ptr: usize,
        bytes_req: usize,
        bytes_alloc: usize,
    ) {
        self.kmemtrace.record::<P>(
            kind,
            EventFields {
                type_id,
                cache_id,
                ptr,
                bytes_req,
                bytes_alloc,
            },
        );
    }
}

// SAFETY: `alloc` returns either null or memory of at least `layout.size()`
// bytes aligned to `layout.align()` (kmalloc's contract) that no one else
// owns until `dealloc`; `dealloc` frees exactly what `alloc`/`realloc`
// returned (and refuses anything else without touching it).
unsafe impl<P: Platform> GlobalAlloc for Allocator<P> {
    /// `kmalloc(max(size, 1), align)`; null on any error (including before
    /// init).
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if !self.is_ready() {
            return ptr::null_mut();
        }
        // A Layout's alignment is a power of two; the size is made non-zero.
        let tag = crate::alloc_tag::current::<P>;
        match self.kmalloc_checked(layout.size().max(1), layout.align(), tag) {
            Ok(ptr) => ptr.as_ptr(),
            Err(_) => ptr::null_mut(),
        }
    }

    /// `kfree`; a refused free is reported to the free-error hook.
    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        let Some(ptr) = NonNull::new(ptr) else { return };
        // SAFETY: the GlobalAlloc contract: ptr came from this allocator
        // with this layout and is given up.
        match unsafe { self.kfree_fast(ptr) } {
            FastFree::Done => {}
            // SAFETY: as above; validated, nothing changed yet.
            FastFree::Flagged(cache, slab) => unsafe { cache.dealloc_flagged(ptr, slab) },
            // SAFETY: as above; the fast path changed nothing.
            FastFree::Slow => unsafe { self.dealloc_slow(ptr) },
        }
    }

    /// Keeps the block if the new size still fits and uses at least half
    /// of it; otherwise allocate, copy, free.
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if let Some(old) = NonNull::new(ptr)
            && let Ok(usable) = self.ksize(old)
            && new_size <= usable
            && new_size.max(1) * 2 > usable
        {
            return ptr;
        }
        let Ok(new_layout) = Layout::from_size_align(new_size, layout.align()) else {
            return ptr::null_mut();
        };
        // SAFETY: a valid layout (GlobalAlloc allows size 0 here; kmalloc
        // gets max(size, 1)).
        let new = unsafe { self.alloc(new_layout) };
        if !new.is_null() && !ptr.is_null() {
            // SAFETY: both blocks are at least min(old, new) bytes and
            // distinct (new is freshly allocated); ptr is given up per the
            // GlobalAlloc contract.
            unsafe {
                ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size));
                self.dealloc(ptr, layout);
            }
        }
        new
    }
}

// SAFETY: blocks returned by `allocate` stay valid until `deallocate` (the
// allocator is 'static, copies of the handle are the same allocator), and
// are at least `layout.size()` bytes aligned to `layout.align()`.
unsafe impl<P: Platform> core::alloc::Allocator for &'static Allocator<P> {
    fn allocate(&self, layout: Layout) -> Result<NonNull<[u8]>, core::alloc::AllocError> {
        if layout.size() == 0 {
            let dangling = NonNull::new(ptr::without_provenance_mut::<u8>(layout.align()))
                .ok_or(core::alloc::AllocError)?;
            return Ok(NonNull::slice_from_raw_parts(dangling, 0));
        }
        let ptr = self
            .kmalloc(layout.size(), layout.align())
            .map_err(|_| core::alloc::AllocError)?;
        let usable = self.ksize(ptr).unwrap_or(layout.size());
        Ok(NonNull::slice_from_raw_parts(ptr, usable))
    }

    unsafe fn deallocate(&self, ptr: NonNull<u8>, layout: Layout) {
        if layout.size() == 0 {
            return;
        }
        // SAFETY: per the Allocator contract, ptr is a live block from us.
        if let Err(error) = unsafe { self.kfree(ptr) } {
            self.report_free_error(error);
        }
    }
}
