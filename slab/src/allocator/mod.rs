//! [`Kmem`]: all global state — the bootstrap caches, the cache list
//! (create, find, walk, reap), the profiling switch (this file); `init`
//! (`init.rs`); the kmalloc size classes, page-granular kmalloc and
//! `kfree` (`kmalloc.rs`); the `GlobalAlloc` / `core::alloc::Allocator`
//! shims (`global_alloc.rs`); error reports (`reports.rs`); the kmemtrace
//! switches (`kmemtrace_control.rs`). Boxes from kmalloc are with the
//! box types (`object.rs`).

mod cache_owner;
mod classes;
mod global_alloc;
mod init;
pub(crate) mod kmalloc;
pub(crate) mod large;
mod reap;

use core::cell::UnsafeCell;
use core::fmt;
use core::mem::MaybeUninit;
use core::ptr::{self};
use core::sync::atomic::{
    AtomicBool, AtomicPtr, AtomicU8, AtomicU32, AtomicU64, AtomicUsize, Ordering,
};

pub use self::classes::InitCost;
#[cfg(all(test, not(loom)))]
pub(crate) use self::classes::MIN_FREE_PAGES;
use self::classes::NR_UNBORN;
use self::kmalloc::NR_KMALLOC;
use crate::cache::{CacheSpec, HotFlags, KmemCache};
use crate::constructor::{Ctor, Dtor};
use crate::debug::DebugLayout;
#[cfg(feature = "debug")]
use crate::debug::SlabDebugConfig;
use crate::error::{AllocError, FreeError};
use crate::flags::CacheFlags;
use crate::kmemtrace::KmemtraceState;
use crate::layout::geometry::Geometry;
use crate::layout::pagemap::PageMap;
use crate::magazine::{NR_MAG_TYPES, PcpuCache};
use crate::platform::{NullSource, PAGE_SIZE, PageSource, Platform, same_source};
use crate::reports::error::{ErrorReport, ErrorRing};
use crate::slab::{Bufctl, Slab};
use crate::stats::CpuCacheStats;
use crate::sync::{IrqTryMutex, SpinIrq};
use crate::trace_table::TraceNode;

const _: () = {
    // The metadata caches that bufctl slabs need (and the magazine caches)
    // must themselves use small-object slabs, which need no metadata:
    // otherwise growing them would recurse forever. (magazine/mod.rs checks
    // the largest magazine.)
    assert!(core::mem::size_of::<Slab>() <= crate::layout::geometry::SMALL_MAX_STRIDE);
    assert!(core::mem::size_of::<Bufctl>() <= crate::layout::geometry::SMALL_MAX_STRIDE);
    assert!(core::mem::size_of::<TraceNode>() <= crate::layout::geometry::SMALL_MAX_STRIDE);
};

/// The bootstrap caches other than the magazine caches, which come first
/// (one per magazine type, `kmem_magazine_<rounds>`: see
/// [`Kmem::magazine_cache`]); in creation order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BootCache {
    Cache = NR_MAG_TYPES as isize,
    Slab,
    Bufctl,
    #[cfg_attr(
        not(feature = "trace-table"),
        expect(dead_code, reason = "without the trace table kmem_trace stays, empty")
    )]
    Trace,
}
/// The bootstrap caches before the tag side-array caches.
const NR_FIXED_BOOT: usize = NR_MAG_TYPES + 4;
const NR_BOOT: usize = NR_FIXED_BOOT + NR_TAG_ARRAY_CACHES;
const BOOT_NAMES: [&str; NR_FIXED_BOOT - NR_MAG_TYPES] =
    ["kmem_cache", "kmem_slab", "kmem_bufctl", "kmem_trace"];

/// Object sizes, in bytes, of the bootstrap caches that hold small slabs'
/// tag side arrays (feature `alloc-profiling`; none without), one cache
/// `kmem_tags_<bytes>` each, last of the bootstrap caches, two per power
/// of two (so a side array's rounding wastes less than a third of it; one
/// per power of two cost 0.4 % of the heap efficiency of the bench's
/// `memory heap` workload): a slab of `n` objects takes the smallest that
/// holds `4 n` bytes
/// ([`crate::alloc_tag`]). They are bootstrap caches, so their own
/// objects never carry tags (no recursion).
#[cfg(feature = "alloc-profiling")]
pub(crate) const TAG_ARRAY_SIZES: [usize; 13] = [
    32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048,
];
#[cfg(not(feature = "alloc-profiling"))]
pub(crate) const TAG_ARRAY_SIZES: [usize; 0] = [];
const NR_TAG_ARRAY_CACHES: usize = TAG_ARRAY_SIZES.len();
#[cfg(feature = "alloc-profiling")]
const TAG_ARRAY_NAMES: [&str; NR_TAG_ARRAY_CACHES] = [
    "kmem_tags_32",
    "kmem_tags_48",
    "kmem_tags_64",
    "kmem_tags_96",
    "kmem_tags_128",
    "kmem_tags_192",
    "kmem_tags_256",
    "kmem_tags_384",
    "kmem_tags_512",
    "kmem_tags_768",
    "kmem_tags_1024",
    "kmem_tags_1536",
    "kmem_tags_2048",
];
#[cfg(not(feature = "alloc-profiling"))]
const TAG_ARRAY_NAMES: [&str; 0] = [];

#[cfg(feature = "alloc-profiling")]
const _: () = {
    // The largest side array: a slab of MAX_SMALL_OBJS objects.
    assert!(
        crate::layout::geometry::MAX_SMALL_OBJS * crate::alloc_tag::TAG_REF_BYTES
            <= TAG_ARRAY_SIZES[NR_TAG_ARRAY_CACHES - 1]
    );
};

/// The less common arguments of [`Kmem::cache_create`] (after Linux
/// 6.12's `struct kmem_cache_args`): start from [`CacheArgs::DEFAULT`]
/// (or `CacheArgs::default()`) and set what differs.
#[derive(Clone, Copy)]
pub struct CacheArgs {
    /// Object alignment in bytes: a power of two, at most [`PAGE_SIZE`];
    /// 0 (the default) means no requirement. Objects are always at least
    /// 8-aligned.
    pub align: usize,
    /// [`CacheFlags`]: `NOTOUCH`, `NOTRACE`, the debug flags (default
    /// none).
    pub flags: CacheFlags,
    /// Run on each object as it leaves the slab layer (see [`Ctor`]); may
    /// fail, and the allocation then fails.
    pub ctor: Option<Ctor>,
    /// Run on each object as it returns to the slab layer (see [`Dtor`]).
    pub dtor: Option<Dtor>,
    /// The page source for the cache's slabs; `None` (the default) is
    /// the primary source given to `init`. Caches on other sources get
    /// no page-map entries: their objects cannot be `kfree`d, and
    /// wrong-cache frees into them are reported as `NotAllocated`.
    pub source: Option<&'static dyn PageSource>,
}

impl CacheArgs {
    /// No alignment requirement, no flags, no constructor or destructor,
    /// the primary page source.
    pub const DEFAULT: CacheArgs = CacheArgs {
        align: 0,
        flags: CacheFlags::empty(),
        ctor: None,
        dtor: None,
        source: None,
    };
}

impl Default for CacheArgs {
    fn default() -> Self {
        Self::DEFAULT
    }
}

impl fmt::Debug for CacheArgs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CacheArgs")
            .field("align", &self.align)
            .field("flags", &self.flags)
            .field("ctor", &self.ctor.is_some())
            .field("dtor", &self.dtor.is_some())
            .field("source", &self.source.map(|source| source.name()))
            .finish()
    }
}

const STATE_UNINIT: u8 = 0;
const STATE_INITIALIZING: u8 = 1;
const STATE_READY: u8 = 2;

/// The list of all caches in creation order (intrusive, through
/// [`KmemCache::links`](crate::cache::CacheLinks)).
pub(crate) struct CacheList<P: Platform> {
    pub(crate) head: *const KmemCache<P>,
    tail: *const KmemCache<P>,
}

// SAFETY: the caches are Sync; the list is only walked under its mutex.
unsafe impl<P: Platform> Send for CacheList<P> {}

/// The slab allocator: everything global.
///
/// Create it in a `static` with [`Kmem::new`], bring it up with
/// [`Kmem::init`]. Before `init` completes, allocations fail
/// (`GlobalAlloc` returns null) and frees are refused.
pub struct Kmem<P: Platform> {
    pub(crate) state: AtomicU8,
    // The cells below are written only by `init` while `state` is
    // INITIALIZING (one thread, exclusive by the state CAS) and read after
    // it is READY (Acquire), or by that same thread during init.
    pub(crate) source: UnsafeCell<&'static dyn PageSource>,
    pub(crate) page_map: UnsafeCell<PageMap>,
    pub(crate) page_map_pages: UnsafeCell<usize>,
    pub(crate) nr_cpus: UnsafeCell<usize>,
    boot: UnsafeCell<MaybeUninit<[KmemCache<P>; NR_BOOT]>>,
    nr_boot: UnsafeCell<usize>,
    /// The kmalloc size classes: a class's cache, or until its first use
    /// on a small source (`classes.rs`) the unborn stub of its natural
    /// alignment. Written under `class_lock` (Release), read by every
    /// kmalloc (Acquire: a plain load on x86).
    pub(crate) kmalloc: [AtomicPtr<KmemCache<P>>; NR_KMALLOC],
    /// [`Kmem::kmalloc`]'s slots again, by `(size + 7) / 8` for sizes
    /// below 1 KiB (`kmalloc.rs`): the small-size alloc hit's one lookup.
    /// Until `init` publishes it (Release, right before READY) every entry
    /// is the unready entry (`cache::unready`), which the hit's one flag
    /// test sends off the hit, where it is refused: the hit needs no
    /// readiness test, no null test and no published size limit (its
    /// bound is a constant). Written with its class's slot.
    pub(crate) kmalloc_by_8: [AtomicPtr<KmemCache<P>>; kmalloc::NR_BY_8],
    /// The partitioned copies of the size classes (`kmalloc.rs`: Linux
    /// `RANDOM_KMALLOC_CACHES` rows chosen by call site, and the row of
    /// pointer-free typed objects): null until a copy's first use, then
    /// its cache (created under `class_lock`, published with Release).
    pub(crate) kmalloc_partitions:
        [[AtomicPtr<KmemCache<P>>; NR_KMALLOC]; kmalloc::NR_KMALLOC_PARTITIONS],
    /// Whether kmalloc is partitioned: set by `init` (not on a small
    /// source, whose classes come on first use: each copy would cost a
    /// `kmem_cache` of its own there).
    pub(crate) kmalloc_partitioned: AtomicBool,
    /// The unborn stubs (`classes.rs`), one per natural alignment of a
    /// class (8 … 4096 bytes); initialised by `init` on a small source.
    unborn: UnsafeCell<MaybeUninit<[KmemCache<P>; NR_UNBORN]>>,
    /// Serialises creating a size class on first use; only tried from an
    /// interrupt handler (`classes.rs`).
    class_lock: IrqTryMutex<()>,
    /// Most pages in a packed small slab, chosen by `init` from the
    /// primary source's size (`classes.rs`).
    pub(crate) max_slab_pages: UnsafeCell<usize>,
    /// Whether the primary source is small (its size classes are born on
    /// first use, `classes.rs`), set by `init`: there every magazine lives
    /// in `kmem_magazine_60`'s objects ([`Kmem::magazine_cache`]).
    pub(crate) small_source: UnsafeCell<bool>,
    /// Each magazine type's bootstrap cache, set by `init`: its own, or
    /// on a small source `kmem_magazine_60` for all (one load where an
    /// index computed the slot, so a large source's magazines cost no
    /// test for the small one's sharing).
    magazine_caches: UnsafeCell<[*const KmemCache<P>; NR_MAG_TYPES]>,
    pub(crate) caches: IrqTryMutex<CacheList<P>>,
    pub(crate) large_nr_live: AtomicUsize,
    pub(crate) large_live_pages: AtomicUsize,
    pub(crate) large_nr_allocs_ever: AtomicU64,
    /// Most pages any page-granular kmalloc has had: how far back a
    /// pointer into one walks to its head (`PageMap::large_block_of`).
    pub(crate) large_max_pages: AtomicUsize,
    pub(crate) nr_bad_frees: AtomicU64,
    /// Reaps because a page source ran dry ([`HeapStats::nr_pressure_reaps`]).
    pub(crate) nr_pressure_reaps: AtomicU64,
    /// Tagged allocations left untagged because their slab's side array
    /// could not be allocated ([`AllocProfiling::nr_tag_array_misses`](crate::AllocProfiling::nr_tag_array_misses)).
    pub(crate) nr_tag_array_misses: AtomicU64,
    /// [`SlabDebug::set_free_error_hook`](crate::debug::SlabDebug::set_free_error_hook). This lock, `error_hook`,
    /// `debug_config` and the error ring's are taken with interrupts off
    /// (`sync::SpinIrq`): a handler's bad free reports through them.
    pub(crate) free_error_hook: SpinIrq<Option<fn(&FreeError)>>,
    /// The latest error reports ([`SlabDebug::read_errors`](crate::debug::SlabDebug::read_errors)).
    pub(crate) errors: ErrorRing,
    /// [`SlabDebug::set_error_hook`](crate::debug::SlabDebug::set_error_hook).
    pub(crate) error_hook: SpinIrq<Option<fn(&ErrorReport)>>,
    /// [`SlabDebug::set_config`](crate::debug::SlabDebug::set_config): debug flags for caches by name.
    #[cfg(feature = "debug")]
    pub(crate) debug_config: SpinIrq<SlabDebugConfig>,
    /// Allocation profiling switched on ([`AllocProfiling::set_enabled`](crate::AllocProfiling::set_enabled)):
    /// written under the cache-list lock, mirrored in every cache's
    /// `HOT_PROFILING` bit; read alone by page-granular kmalloc.
    pub(crate) alloc_profiling: AtomicBool,
    /// [`AllocProfiling::set_tag_hooks`](crate::AllocProfiling::set_tag_hooks): written under the cache-list
    /// lock, mirrored in every cache's `TAG_HOOKS` bit.
    pub(crate) alloc_tag_hooks: AtomicBool,
    /// The next cache id (kmemtrace).
    next_cache_id: AtomicU32,
    /// kmemtrace: per-CPU event rings and the recording state.
    pub(crate) kmemtrace: KmemtraceState,
    /// KFENCE: the sampled guarded pool ([`crate::kfence`]).
    #[cfg(feature = "kfence")]
    pub(crate) kfence: crate::kfence::pool::KfencePool,
}

// SAFETY: see the comment on the fields: the UnsafeCells are written only
// during init by the one initialising thread and are read-only afterwards;
// everything else is atomics, spin locks, and caches that are Sync.
unsafe impl<P: Platform> Sync for Kmem<P> {}
// SAFETY: as above.
unsafe impl<P: Platform> Send for Kmem<P> {}

impl<P: Platform> Default for Kmem<P> {
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

impl<P: Platform> Kmem<P> {
    /// An allocator that is not initialised yet; usable in a `static`.
    pub const fn new() -> Self {
        Kmem {
            state: AtomicU8::new(STATE_UNINIT),
            source: UnsafeCell::new(&NullSource),
            page_map: UnsafeCell::new(PageMap::empty()),
            page_map_pages: UnsafeCell::new(0),
            nr_cpus: UnsafeCell::new(1),
            boot: UnsafeCell::new(MaybeUninit::uninit()),
            nr_boot: UnsafeCell::new(0),
            kmalloc: [const { AtomicPtr::new(ptr::null_mut()) }; NR_KMALLOC],
            kmalloc_by_8: [const { AtomicPtr::new(crate::cache::unready::<P>()) };
                kmalloc::NR_BY_8],
            kmalloc_partitions: [const { [const { AtomicPtr::new(ptr::null_mut()) }; NR_KMALLOC] };
                kmalloc::NR_KMALLOC_PARTITIONS],
            kmalloc_partitioned: AtomicBool::new(false),
            unborn: UnsafeCell::new(MaybeUninit::uninit()),
            class_lock: IrqTryMutex::new(()),
            max_slab_pages: UnsafeCell::new(crate::layout::geometry::MAX_SLAB_PAGES),
            small_source: UnsafeCell::new(false),
            magazine_caches: UnsafeCell::new([ptr::null(); NR_MAG_TYPES]),
            caches: IrqTryMutex::new(CacheList {
                head: ptr::null(),
                tail: ptr::null(),
            }),
            large_nr_live: AtomicUsize::new(0),
            large_live_pages: AtomicUsize::new(0),
            large_nr_allocs_ever: AtomicU64::new(0),
            large_max_pages: AtomicUsize::new(0),
            nr_bad_frees: AtomicU64::new(0),
            nr_pressure_reaps: AtomicU64::new(0),
            nr_tag_array_misses: AtomicU64::new(0),
            free_error_hook: SpinIrq::new(None),
            errors: ErrorRing::new(),
            error_hook: SpinIrq::new(None),
            #[cfg(feature = "debug")]
            debug_config: SpinIrq::new(SlabDebugConfig::NONE),
            alloc_profiling: AtomicBool::new(true),
            alloc_tag_hooks: AtomicBool::new(false),
            next_cache_id: AtomicU32::new(1),
            kmemtrace: KmemtraceState::new(),
            #[cfg(feature = "kfence")]
            kfence: crate::kfence::pool::KfencePool::new(),
        }
    }

    /// Store `on` in the allocator-wide `switch` and apply it to every
    /// cache with `apply`, under the cache-list lock (so a cache created
    /// meanwhile, which reads the switch under the same lock, is not
    /// missed).
    pub(crate) fn switch_every_cache(
        &self,
        switch: &AtomicBool,
        on: bool,
        apply: impl Fn(&KmemCache<P>, bool),
    ) {
        let list = self.caches.lock::<P>();
        switch.store(on, Ordering::Relaxed);
        let mut cache = list.head;
        while !cache.is_null() {
            // SAFETY: caches on the list are alive while we hold its lock;
            // links are only touched under it.
            unsafe {
                apply(&*cache, on);
                cache = (*(*cache).links.get()).next;
            }
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

    /// The primary source, without the ready check (init and caches).
    pub(crate) fn primary_source(&self) -> &'static dyn PageSource {
        // SAFETY: written only during init by the thread that also makes
        // every internal call before READY; read-only afterwards.
        unsafe { *self.source.get() }
    }

    pub(crate) fn page_map(&self) -> PageMap {
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

    /// The bootstrap cache of tag side arrays of `TAG_ARRAY_SIZES[index]`
    /// bytes (`kmem_tags_<bytes>`).
    #[cfg(feature = "alloc-profiling")]
    pub(crate) fn tag_array_cache(&self, index: usize) -> &KmemCache<P> {
        assert!(index < NR_TAG_ARRAY_CACHES);
        // SAFETY: as for `boot`; the side-array caches are the last
        // NR_TAG_ARRAY_CACHES bootstrap slots.
        unsafe {
            &*self
                .boot
                .get()
                .cast::<KmemCache<P>>()
                .add(NR_FIXED_BOOT + index)
        }
    }

    /// The bootstrap cache of magazine type `magtype` (an index into the
    /// magazine types: `kmem_magazine_<rounds>`); on a small source
    /// `kmem_magazine_60` for every type (`magazine/mod.rs`). `magtype`
    /// below `NR_MAG_TYPES` (panics otherwise).
    pub(crate) fn magazine_cache(&self, magtype: usize) -> &KmemCache<P> {
        // SAFETY: set by `init` (READY, or INITIALIZING on this thread,
        // past the bootstrap caches: cells readable) to bootstrap caches,
        // which live as long as the allocator; the index is bounds-checked.
        unsafe { &*(*self.magazine_caches.get())[magtype] }
    }

    /// # Safety
    /// `cache` is alive, in no list, and lives until unlinked.
    unsafe fn link_cache(&self, cache: *const KmemCache<P>) {
        // SAFETY: per our caller.
        unsafe { self.link_cache_locked(&mut self.caches.lock::<P>(), cache) };
    }

    /// [`Kmem::link_cache`] with the cache-list lock held (`list`).
    ///
    /// # Safety
    /// As for [`Kmem::link_cache`].
    unsafe fn link_cache_locked(&self, list: &mut CacheList<P>, cache: *const KmemCache<P>) {
        // SAFETY: links are only touched under the cache-list lock; cache
        // and the tail are alive.
        unsafe {
            // Inherit the profiling switch (read under the same lock as
            // set_alloc_profiling writes it).
            if self.profiling().enabled() {
                (*cache).set_profiling(true);
            }
            // And the tag hooks.
            if self.profiling().tag_hooks() {
                (*cache).set_tag_hooks(true);
            }
            // And kmemtrace recording of every cache.
            if self.kmemtrace.recording_all.load(Ordering::Relaxed) && !(*cache).is_bootstrap() {
                (*cache).set_hot(HotFlags::KMEMTRACE);
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
        let mut list = self.caches.lock::<P>();
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

    /// Create an object cache of `size`-byte objects named `name`, with
    /// the less common arguments in `args` (Linux 6.12's `struct
    /// kmem_cache_args`; [`CacheArgs::DEFAULT`] for none):
    ///
    /// ```ignore
    /// let dentry = heap.cache_create("dentry", 192, &CacheArgs { align: 64, ..CacheArgs::DEFAULT })?;
    /// ```
    ///
    /// - `name`: copied; cut to 31 bytes (at a character boundary).
    /// - `size`: object size in bytes, 1..=2^30.
    ///
    /// Buffers up to `PAGE_SIZE / 8` bytes (and not `NOTOUCH`) get
    /// small-object slabs; larger ones bufctl slabs.
    ///
    /// # Errors
    /// [`AllocError::NotInitialized`], [`AllocError::InvalidLayout`] (size
    /// 0 or too large, bad alignment), [`AllocError::OutOfMemory`] (no
    /// memory for the cache's struct or per-CPU array).
    pub fn cache_create(
        &'static self,
        name: &str,
        size: usize,
        args: &CacheArgs,
    ) -> Result<&'static KmemCache<P>, AllocError> {
        if !self.is_ready() {
            return Err(AllocError::NotInitialized);
        }
        let CacheArgs {
            align,
            flags,
            ctor,
            dtor,
            source,
        } = *args;
        self.create_cache(name, size, align, flags, ctor, dtor, source, false)
    }

    #[allow(
        clippy::too_many_arguments,
        reason = "cache_create's arguments and whether the cache is a boot cache"
    )]
    #[expect(
        clippy::cast_ptr_alignment,
        reason = "boot-cache objects are aligned to their cache's align, that of KmemCache / PcpuCache"
    )]
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
        // Debug flags: the caller's, and the boot line's for this name.
        // NOTOUCH caches cannot have any (their memory is not touched).
        // From an interrupt handler (a size class made on first use) the
        // cache-list lock is only tried, and held from here to the link:
        // the code the handler interrupted may hold it, or another CPU
        // may hold it across a cross-CPU call to this one (`reap_all`),
        // which this CPU cannot answer until the handler returns.
        let mut irq_list = if P::in_interrupt() {
            Some(self.caches.try_lock::<P>().ok_or(AllocError::OutOfMemory)?)
        } else {
            None
        };
        #[cfg(feature = "debug")]
        let flags = flags | CacheFlags::from_debug(self.debug_config.lock::<P>().flags_for(name));
        // Without feature `debug` the debug bits are ignored (as Linux
        // without CONFIG_SLUB_DEBUG ignores `slub_debug=`): a plain cache,
        // whose `debug_flags` are empty.
        #[cfg(not(feature = "debug"))]
        let flags = flags.difference(CacheFlags::from_debug(flags.debug()));
        let debug = if flags.contains(CacheFlags::NOTOUCH) {
            None
        } else {
            DebugLayout::new(size, flags.debug(), ctor.is_some())
                .map(|layout| layout.aligned(align))
        };
        // A left redzone's bytes come before the object, in its stride.
        let slot_size = debug.map_or(size, |layout| layout.left + layout.slot_size);
        let primary = self.primary_source();
        let source = source.unwrap_or(primary);
        // On the primary source the page map finds any slab's header, so
        // slabs may span pages and keep their header off slab.
        // SAFETY: READY or INITIALIZING on this thread: cells readable.
        let max_slab_pages = unsafe { *self.max_slab_pages.get() };
        let geometry_of = |slot_size| {
            Geometry::with_max_slab_pages(
                slot_size,
                align,
                flags,
                same_source(source, primary),
                max_slab_pages,
            )
        };
        let mut geometry = geometry_of(slot_size)?;
        // Constructed objects of small slabs keep the free key in a word
        // after the object (cache/double_free.rs; bufctl slabs mark the
        // bufctl instead).
        if (ctor.is_some() || dtor.is_some())
            && debug.is_none()
            && geometry.kind == crate::layout::geometry::SlabKind::Small
        {
            let keyed = geometry_of(crate::cache::key_after(size) + 8)?;
            if keyed.kind == crate::layout::geometry::SlabKind::Small {
                geometry = keyed;
            }
        }
        // SAFETY: READY or INITIALIZING on this thread: cells readable.
        let nr_cpus = unsafe { *self.nr_cpus.get() };
        // One kmem_cache object: the struct, then its per-CPU array at
        // PCPU_OFFSET (where the hits compute it).
        let mem = crate::slab::SlabLayer::alloc(self.boot(BootCache::Cache))?
            .as_ptr()
            .cast::<KmemCache<P>>();
        let pcpu = mem
            .cast::<u8>()
            .wrapping_add(KmemCache::<P>::PCPU_OFFSET)
            .cast::<PcpuCache>();
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
            debug,
            // SAFETY: READY or INITIALIZING on this thread: cells readable.
            small_source: unsafe { *self.small_source.get() },
        };
        // SAFETY: `mem` is a fresh kmem_cache object, ours: a KmemCache<P>
        // (64-aligned) and from PCPU_OFFSET (a multiple of 64 at or past
        // the struct's end) nr_cpus PcpuCaches, `pcpu` (`KmemCache::pcpu_array`). Once linked the
        // cache lives until destroy.
        unsafe {
            // The free key in every CPU's line, where the free's hit reads it.
            let free_key = crate::cache::init_free_key(P::now() ^ (self as *const Self as u64));
            for cpu in 0..nr_cpus {
                pcpu.add(cpu).write(PcpuCache::new(free_key));
            }
            mem.write(KmemCache::construct(spec, self, self.page_map(), nr_cpus));
            // On a small source this CPU's first magazine now, empty, of
            // the depot's type (`magazine/mod.rs`): the class's first
            // free pushes into it, where it went slow to make one
            // (the hobby kernel's cold `large_vec`: ~700 instructions
            // each of its 8 classes' first frees).
            if *self.small_source.get() && !P::in_interrupt() {
                (*mem).load_first_magazine();
            }
            match irq_list.as_deref_mut() {
                Some(list) => self.link_cache_locked(list, mem),
                None => self.link_cache(mem),
            }
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
        let list = self.caches.lock::<P>();
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

    /// [`Kmem::for_each_cache`] if the cache-list lock is free now;
    /// false (nothing done) if it is held — by this CPU too: the KFENCE
    /// tick runs on an allocation's miss, which a `for_each_cache`
    /// callback may make.
    #[cfg(feature = "kfence")]
    pub(crate) fn try_for_each_cache(&self, mut f: impl FnMut(&'static KmemCache<P>)) -> bool {
        let Some(list) = self.caches.try_lock::<P>() else {
            return false;
        };
        let mut cache = list.head;
        while !cache.is_null() {
            // SAFETY: as in for_each_cache: listed caches are alive while
            // we hold the list lock.
            unsafe {
                f(&*cache);
                cache = (*(*cache).links.get()).next;
            }
        }
        true
    }
}

/// The allocator's figures beyond one cache's, from [`Kmem::stats`]:
/// per CPU, its own metadata, page-granular kmallocs, reaps under
/// pressure.
#[derive(Clone, Copy)]
pub struct HeapStats<'a, P: Platform> {
    heap: &'a Kmem<P>,
}

impl<P: Platform> Kmem<P> {
    /// The allocator's figures: [`HeapStats`].
    pub fn stats(&self) -> HeapStats<'_, P> {
        HeapStats { heap: self }
    }
}

impl<P: Platform> HeapStats<'_, P> {
    /// Page-granular kmallocs: live blocks, their pages and bytes, and
    /// every one made.
    pub fn large(&self) -> crate::LargeStats {
        self.heap.large_stats()
    }

    /// The kmalloc cache that would serve `size` bytes aligned to `align`,
    /// or `None` if such a request is page-granular (or invalid, or the
    /// allocator is not ready).
    pub fn kmalloc_cache_for(&self, size: usize, align: usize) -> Option<&'static KmemCache<P>> {
        if !self.heap.is_ready() || size == 0 || !align.is_power_of_two() {
            return None;
        }
        Kmem::<P>::kmalloc_index(size, align).and_then(|index| self.heap.kmalloc_class(index).ok())
    }

    /// Number of per-CPU caches per cache (`Platform::max_cpus` at init).
    pub fn nr_cpus(&self) -> usize {
        if !self.heap.is_ready() {
            return 0;
        }
        // SAFETY: READY: init-only cells are immutable.
        unsafe { *self.heap.nr_cpus.get() }
    }

    /// CPU `cpu`'s magazines summed over every cache: the allocations and
    /// frees they served (magazine hits; slab-layer misses and
    /// page-granular kmallocs are not counted) and the rounds they hold.
    /// See [`KmemCache::cpu_stats`]. Walks the cache list under its lock
    /// (like [`Kmem::for_each_cache`], so not from inside one),
    /// reading each cache's per-CPU cache on `cpu` through a
    /// [cross-CPU call](crate::Platform::cross_cpu_call), one cache at a
    /// time: each cache's figures are exact, their sum a near-snapshot
    /// under concurrent use. All zero before `init` and for `cpu` out of range.
    pub fn cpu(&self, cpu: usize) -> CpuCacheStats {
        let mut total = CpuCacheStats::default();
        self.heap
            .for_each_cache(|cache| total = total + cache.cpu_stats(cpu));
        total
    }

    /// The allocator's own memory: the page map and the bootstrap caches'
    /// slabs, against the memory the primary source manages (the target:
    /// at most 2 %). All zero before init.
    pub fn metadata(&self) -> crate::MetadataStats {
        if !self.heap.is_ready() {
            return crate::MetadataStats::default();
        }
        let mut bootstrap_bytes = 0;
        let mut magazine_bytes = [0; NR_MAG_TYPES];
        let mut tag_array_bytes = 0;
        // SAFETY: READY: the init-only cells are immutable.
        let nr_boot = unsafe { *self.heap.nr_boot.get() };
        for index in 0..nr_boot {
            // SAFETY: READY: bootstrap slots below nr_boot are initialised.
            let boot = unsafe { &*self.heap.boot.get().cast::<KmemCache<P>>().add(index) };
            let bytes = boot.slab.lock().counts().nr_pages * PAGE_SIZE;
            bootstrap_bytes += bytes;
            // The magazine caches are the first NR_MAG_TYPES slots.
            if let Some(slot) = magazine_bytes.get_mut(index) {
                *slot = bytes;
            }
            // The tag side-array caches are the last ones.
            if index >= NR_FIXED_BOOT {
                tag_array_bytes += bytes;
            }
        }
        // SAFETY: READY: the init-only cells are immutable.
        let (page_map_pages, map) =
            unsafe { (*self.heap.page_map_pages.get(), *self.heap.page_map.get()) };
        crate::MetadataStats {
            page_map_bytes: page_map_pages * PAGE_SIZE,
            bootstrap_bytes,
            magazine_bytes,
            tag_array_bytes,
            managed_bytes: map.nr_pages * PAGE_SIZE,
        }
    }

    /// Times an allocation found its page source dry and reaped every
    /// cache before retrying.
    pub fn nr_pressure_reaps(&self) -> u64 {
        self.heap.nr_pressure_reaps.load(Ordering::Relaxed)
    }
}
