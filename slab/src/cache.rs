//! `kmem_cache`: the object cache, tying the magazine layer
//! ([`crate::magazine`]), the slab layer ([`crate::slab`]) and tracing
//! ([`crate::trace`]) together.

use core::cell::UnsafeCell;
use core::marker::PhantomData;
use core::ptr::{self, NonNull};
use core::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crate::allocator::Allocator;
use crate::error::{AllocError, DestroyError, FreeError};
use crate::magazine::{Depot, MAG_INITIAL_ROUNDS, PcpuCache};
use crate::pagemap::{PageMap, TAG_MASK, TAG_SLAB};
use crate::platform::{PAGE_SIZE, PageSource, Platform};
use crate::slab::{
    BUFCTL_ALLOCATED, BUFCTL_CACHED, SLAB_MAGIC, SMALL_HEADER_OFFSET, SMALL_MAX_STRIDE, Slab,
    SlabLayer, small_header,
};
use crate::sync::Mutex;
use crate::trace::TraceTable;

bitflags::bitflags! {
    /// Flags given to [`Allocator::cache_create`](crate::Allocator::cache_create).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub struct CacheFlags: u32 {
        /// Never touch object memory (the source's pages may not be
        /// memory): always use bufctl slabs, no free list in the objects.
        const NOTOUCH = 1;
        /// Refuse tracing (all bootstrap caches are NOTRACE).
        const NOTRACE = 2;
        /// Detect double frees in small-object caches too (a per-slab
        /// bitmap of objects held by callers). Bufctl caches always detect
        /// them.
        const AUDIT = 4;
    }
}

/// Object constructor: runs when an object leaves the slab layer towards
/// callers (it then stays constructed in the magazines). `size` is the
/// cache's object size in bytes. An `Err` fails the allocation.
pub type Ctor = fn(obj: NonNull<u8>, size: usize) -> Result<(), ()>;
/// Object destructor: runs when an object goes back from the magazine
/// layer to the slab layer. `size` is the object size in bytes.
pub type Dtor = fn(obj: NonNull<u8>, size: usize);

/// Which slab layout a cache uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlabKind {
    /// One-page slabs, header at the end of the page, free list through
    /// the free objects.
    Small,
    /// Multi-page slabs with one bufctl per object and a hash from buffer
    /// address to bufctl; object memory untouched.
    Bufctl,
}

/// A cache's statistics, summed over CPUs at the time of the call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheStats {
    /// Object size in bytes, as requested at creation.
    pub obj_size: usize,
    /// Guaranteed alignment of objects in bytes.
    pub align: usize,
    /// Objects currently with callers.
    pub nr_allocated: usize,
    /// Slabs (empty, partial and full).
    pub nr_slabs: usize,
    /// Pages per slab.
    pub nr_pages_per_slab: usize,
    /// Objects per slab.
    pub objs_per_slab: usize,
    /// Partial plus full slabs.
    pub nr_active_slabs: usize,
    /// Objects in all slabs (`nr_slabs * objs_per_slab`).
    pub nr_total_objs: usize,
    /// Allocations by callers ever.
    pub nr_allocs_ever: u64,
    /// Frees by callers ever.
    pub nr_frees_ever: u64,
    /// Current rounds per full magazine (0: no magazine layer).
    pub magsize: usize,
    /// Non-empty magazines in the depot.
    pub depot_nr_full: usize,
    /// Empty magazines in the depot.
    pub depot_nr_empty: usize,
    /// Times the depot lock was contended.
    pub depot_contention: u64,
    /// Rounds (objects) in per-CPU magazines.
    pub nr_cpu_cached_objs: usize,
    /// Rounds (objects) in depot magazines.
    pub nr_depot_objs: usize,
    /// Bytes of slab pages (`pages * PAGE_SIZE`).
    pub total_bytes: usize,
    /// Slab layout.
    pub kind: SlabKind,
}

/// One CPU's share of the magazine layer: what its magazines served and
/// what they hold now. From [`KmemCache::cpu_stats`] (one cache) or
/// [`Allocator::cpu_stats`](crate::Allocator::cpu_stats) (summed over
/// every cache).
///
/// The counters are that CPU's own, written only under its per-CPU lock
/// (no counter shared between CPUs is written on the magazine-hit paths);
/// readers sum them. An object allocated on one CPU and freed on another
/// counts in the first CPU's `nr_allocs` and the second CPU's `nr_frees`.
/// Allocations and frees that missed the magazines (served by the slab
/// layer) are not in these counts, only in [`CacheStats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuCacheStats {
    /// Allocations served by this CPU's magazines, ever.
    pub nr_allocs: u64,
    /// Frees stored in this CPU's magazines, ever.
    pub nr_frees: u64,
    /// Rounds (objects) in this CPU's loaded magazine now.
    pub nr_rounds_loaded: usize,
    /// Rounds (objects) in this CPU's previous magazine now.
    pub nr_rounds_prev: usize,
}

/// Field-wise sum (counters wrap), for summing CPUs or caches.
impl core::ops::Add for CpuCacheStats {
    type Output = CpuCacheStats;

    fn add(self, other: CpuCacheStats) -> CpuCacheStats {
        CpuCacheStats {
            nr_allocs: self.nr_allocs.wrapping_add(other.nr_allocs),
            nr_frees: self.nr_frees.wrapping_add(other.nr_frees),
            nr_rounds_loaded: self.nr_rounds_loaded + other.nr_rounds_loaded,
            nr_rounds_prev: self.nr_rounds_prev + other.nr_rounds_prev,
        }
    }
}

/// What [`KmemCache::destroy`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DestroyReport {
    /// Trace records still outstanding at destruction, now dropped. Non-zero
    /// means some traced object was never freed: the kernel should warn.
    pub nr_trace_records_dropped: usize,
}

/// `hot_flags` bits: anything non-zero sends alloc and free to their cold
/// paths, so a plain cache pays one load and one branch for all of these.
pub(crate) const HOT_TRACED: u32 = 1;
pub(crate) const HOT_EVER_TRACED: u32 = 2;
pub(crate) const HOT_AUDIT: u32 = 4;
pub(crate) const HOT_BUFCTL: u32 = 8;
pub(crate) const HOT_BOOTSTRAP: u32 = 16;
/// Some object of this small-object cache carries a tag reference in its
/// slab's tag array (feature `alloc-profiling`): frees must look at it.
/// The only flag that does not send allocations to the cold path.
pub(crate) const HOT_TAGGED: u32 = 32;
/// Allocation profiling is switched on in the allocator
/// ([`Allocator::set_alloc_profiling`](crate::Allocator::set_alloc_profiling);
/// feature `alloc-profiling`): allocations go to the out-of-line profiled
/// path, which asks [`Platform::alloc_tag_current`]. Clear, the alloc hit
/// is the compiled-out one and no tag is asked for. Frees ignore it.
pub(crate) const HOT_PROFILING: u32 = 64;
/// kmemtrace is recording this cache
/// ([`Allocator::kmemtrace_start`](crate::Allocator::kmemtrace_start)):
/// allocs and frees take the flagged paths, which record an event.
pub(crate) const HOT_KMEMTRACE: u32 = 128;
/// The bits a free looks at (all but [`HOT_PROFILING`]).
pub(crate) const HOT_FREE_MASK: u32 = !HOT_PROFILING;

/// Links of the allocator's cache list (under the cache-list lock).
pub(crate) struct CacheLinks<P: Platform> {
    pub(crate) prev: *const KmemCache<P>,
    pub(crate) next: *const KmemCache<P>,
}

/// Object layout of a cache.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Geometry {
    pub(crate) stride: usize,
    pub(crate) align: usize,
    pub(crate) kind: SlabKind,
    pub(crate) nr_pages_per_slab: usize,
    pub(crate) nr_objs_per_slab: usize,
    /// Small slabs with tag references: offset in the page of the array of
    /// one [`AllocTagRef`](crate::AllocTagRef) per object, between the last
    /// object and the header. 0 if the slabs have none.
    #[cfg_attr(not(feature = "alloc-profiling"), allow(dead_code))]
    pub(crate) tag_array_offset: usize,
}

/// What the fast path of a free did (see
/// [`KmemCache::free_fast_located`]).
pub(crate) enum FastFree<'a, P: Platform> {
    /// Freed into a magazine.
    Done,
    /// Validated, nothing done: the cache has a bookkeeping flag; the
    /// object is in this slab of this cache.
    Flagged(&'a KmemCache<P>, *mut Slab),
    /// Nothing done: take the slow path (which validates again).
    Slow,
}

/// A `Result<NonNull<u8>, AllocError>` in one register, for the return
/// of the out-of-line alloc paths (the `Result` itself would be returned
/// through memory): an object address (at least `PAGE_SIZE`: pages are
/// non-null and page-aligned) or an error's discriminant.
#[inline(always)]
pub(crate) fn pack(result: Result<NonNull<u8>, AllocError>) -> usize {
    match result {
        Ok(obj) => obj.as_ptr() as usize,
        Err(error) => error as usize,
    }
}

/// The inverse of [`pack`].
#[inline(always)]
pub(crate) fn unpack(packed: usize) -> Result<NonNull<u8>, AllocError> {
    if packed >= PAGE_SIZE {
        // SAFETY: non-zero (above).
        return Ok(unsafe { NonNull::new_unchecked(packed as *mut u8) });
    }
    Err(unpack_error(packed))
}

#[cold]
fn unpack_error(code: usize) -> AllocError {
    const ERRORS: [AllocError; 5] = [
        AllocError::OutOfMemory,
        AllocError::InvalidLayout,
        AllocError::ConstructorFailed,
        AllocError::NotInitialized,
        AllocError::AlreadyInitialized,
    ];
    ERRORS
        .into_iter()
        .find(|&error| error as usize == code)
        .unwrap_or(AllocError::OutOfMemory)
}

/// The `Misaligned` error, built out of line.
#[cold]
#[inline(never)]
fn misaligned(addr: usize) -> FreeError {
    FreeError::Misaligned { addr }
}

/// Largest object a cache may hold.
const MAX_OBJ_SIZE: usize = 1 << 30;

impl Geometry {
    /// Lay out objects of `size` bytes aligned to `align` (0 means 1).
    /// Objects are at least 8 bytes apart and 8-aligned. With `tag_refs`
    /// (and feature `alloc-profiling`), small slabs keep 4 bytes per object
    /// for its allocation tag reference.
    pub(crate) fn new(
        size: usize,
        align: usize,
        flags: CacheFlags,
        tag_refs: bool,
    ) -> Result<Self, AllocError> {
        let align = if align == 0 { 1 } else { align };
        if size == 0 || size > MAX_OBJ_SIZE || !align.is_power_of_two() || align > PAGE_SIZE {
            return Err(AllocError::InvalidLayout);
        }
        let align = align.max(8);
        let stride = size.next_multiple_of(align);
        if stride <= SMALL_MAX_STRIDE && !flags.contains(CacheFlags::NOTOUCH) {
            let ref_bytes = if tag_refs {
                crate::alloc_tag::TAG_REF_BYTES
            } else {
                0
            };
            let nr_objs = SMALL_HEADER_OFFSET / (stride + ref_bytes);
            return Ok(Geometry {
                stride,
                align,
                kind: SlabKind::Small,
                nr_pages_per_slab: 1,
                nr_objs_per_slab: nr_objs,
                tag_array_offset: if ref_bytes == 0 {
                    0
                } else {
                    SMALL_HEADER_OFFSET - nr_objs * ref_bytes
                },
            });
        }
        let target_objs = if stride <= 8192 {
            8
        } else {
            (65536 / stride).max(1)
        };
        let nr_pages = (stride * target_objs).div_ceil(PAGE_SIZE);
        Ok(Geometry {
            stride,
            align,
            kind: SlabKind::Bufctl,
            nr_pages_per_slab: nr_pages,
            nr_objs_per_slab: nr_pages * PAGE_SIZE / stride,
            tag_array_offset: 0,
        })
    }
}

/// An object cache (`kmem_cache`).
///
/// Obtained from [`Allocator::cache_create`](crate::Allocator::cache_create)
/// (or [`Allocator::find_cache`](crate::Allocator::find_cache)); lives until
/// [`KmemCache::destroy`]. All methods are safe to call from any CPU
/// concurrently.
#[repr(C)]
pub struct KmemCache<P: Platform> {
    // Read-only after creation, except `hot_flags` (written when tracing
    // or profiling switches on). In declaration order (`repr(C)`): the
    // first 64 bytes hold everything the magazine-hit paths of alloc and
    // free read, and nothing a CPU writes on any path lives before
    // `depot`, which starts a new cache line (see `hot_fields_first`).
    pub(crate) hot_flags: AtomicU32,
    pub(crate) on_primary: bool,
    pub(crate) kind: SlabKind,
    pub(crate) permanent: bool,
    pub(crate) pcpu: *mut PcpuCache,
    /// Number of CPUs minus one: the last index of `pcpu`.
    pub(crate) last_cpu: usize,
    /// `ceil(2^64 / stride)`: for an offset `n < 2^32` into a slab,
    /// `n * stride_magic` (128-bit) has `n / stride` in its high word and
    /// is an object start iff its low word is below `stride_magic`
    /// (Lemire, Kaser and Kurz, "Faster remainder by direct computation",
    /// 2019): one multiply checks and indexes a freed pointer.
    pub(crate) stride_magic: u64,
    pub(crate) nr_objs_per_slab: usize,
    /// The allocator's page map for a cache on the primary source; empty
    /// (every lookup finds 0) for one on another source, so the free fast
    /// path needs no `on_primary` test: its lookup misses and the slow
    /// path locates by header or hash.
    pub(crate) page_map: PageMap,
    pub(crate) stride: usize,
    pub(crate) obj_size: usize,
    /// Small slabs: where each slab page's tag-reference array starts
    /// (0: none).
    #[cfg(feature = "alloc-profiling")]
    pub(crate) tag_array_offset: usize,
    pub(crate) nr_pages_per_slab: usize,
    pub(crate) ctor: Option<Ctor>,
    pub(crate) dtor: Option<Dtor>,
    pub(crate) align: usize,
    pub(crate) flags: CacheFlags,
    pub(crate) source: &'static dyn PageSource,
    pub(crate) owner: *const Allocator<P>,
    // Written by any CPU on slow paths: from here on, away from the fields
    // above (`Depot` is cache-line aligned).
    pub(crate) depot: Depot,
    pub(crate) slab: Mutex<SlabLayer>,
    /// Objects allocated from / freed to the slab layer directly by
    /// callers (magazine layer missed).
    pub(crate) nr_allocs_direct: AtomicU64,
    pub(crate) nr_frees_direct: AtomicU64,
    pub(crate) trace: Mutex<TraceTable>,
    pub(crate) nr_trace_dropped: AtomicU64,
    pub(crate) name: [u8; 32],
    pub(crate) name_len: usize,
    /// kmemtrace cache id (1, 2, ... in creation order).
    pub(crate) id: u32,
    pub(crate) links: UnsafeCell<CacheLinks<P>>,
    _platform: PhantomData<fn() -> P>,
}

// SAFETY: shared state is behind spin locks or atomics; `pcpu` is an array
// of per-CPU caches each behind its own lock; `links` is only touched under
// the allocator's cache-list lock; everything else is immutable after
// creation.
unsafe impl<P: Platform> Sync for KmemCache<P> {}
// SAFETY: as above; nothing is tied to the creating CPU.
unsafe impl<P: Platform> Send for KmemCache<P> {}

/// Arguments to [`KmemCache::construct`].
pub(crate) struct CacheSpec<'a> {
    pub(crate) name: &'a str,
    pub(crate) size: usize,
    pub(crate) geometry: Geometry,
    pub(crate) flags: CacheFlags,
    pub(crate) ctor: Option<Ctor>,
    pub(crate) dtor: Option<Dtor>,
    pub(crate) source: &'static dyn PageSource,
    pub(crate) on_primary: bool,
    pub(crate) bootstrap: bool,
    pub(crate) permanent: bool,
    /// kmemtrace cache id.
    pub(crate) id: u32,
}

impl<P: Platform> KmemCache<P> {
    /// Build a cache value (not yet linked anywhere).
    pub(crate) fn construct(
        spec: CacheSpec<'_>,
        owner: *const Allocator<P>,
        page_map: PageMap,
        pcpu: *mut PcpuCache,
        nr_cpus: usize,
    ) -> Self {
        let mut name = [0u8; 32];
        let mut name_len = spec.name.len().min(31);
        while !spec.name.is_char_boundary(name_len) {
            name_len -= 1;
        }
        name[..name_len].copy_from_slice(&spec.name.as_bytes()[..name_len]);
        let geometry = spec.geometry;
        let mut hot = 0;
        if geometry.kind == SlabKind::Bufctl {
            hot |= HOT_BUFCTL;
        }
        if spec.flags.contains(CacheFlags::AUDIT) && geometry.kind == SlabKind::Small {
            hot |= HOT_AUDIT;
        }
        if spec.bootstrap {
            hot |= HOT_BOOTSTRAP;
        }
        KmemCache {
            hot_flags: AtomicU32::new(hot),
            pcpu,
            last_cpu: nr_cpus.max(1) - 1,
            stride: geometry.stride,
            // stride >= 8, so the quotient fits in 64 bits.
            stride_magic: (u64::MAX / geometry.stride as u64) + 1,
            page_map: if spec.on_primary {
                page_map
            } else {
                PageMap::empty()
            },
            on_primary: spec.on_primary,
            kind: geometry.kind,
            nr_objs_per_slab: geometry.nr_objs_per_slab,
            nr_pages_per_slab: geometry.nr_pages_per_slab,
            ctor: spec.ctor,
            dtor: spec.dtor,
            obj_size: spec.size,
            #[cfg(feature = "alloc-profiling")]
            tag_array_offset: geometry.tag_array_offset,
            align: geometry.align,
            flags: spec.flags,
            source: spec.source,
            owner,
            permanent: spec.permanent,
            depot: Depot::new(MAG_INITIAL_ROUNDS),
            slab: Mutex::new(SlabLayer::new()),
            nr_allocs_direct: AtomicU64::new(0),
            nr_frees_direct: AtomicU64::new(0),
            trace: Mutex::new(TraceTable::new()),
            nr_trace_dropped: AtomicU64::new(0),
            name,
            name_len,
            id: spec.id,
            links: UnsafeCell::new(CacheLinks {
                prev: ptr::null(),
                next: ptr::null(),
            }),
            _platform: PhantomData,
        }
    }

    /// The allocator this cache belongs to.
    #[inline]
    pub(crate) fn owner(&self) -> &Allocator<P> {
        // SAFETY: caches are created by an `Allocator` living in a
        // `'static` (init takes `&'static self`), never moved.
        unsafe { &*self.owner }
    }

    /// Cache name (at most 31 bytes), e.g. `"kmalloc-64"`.
    pub fn name(&self) -> &str {
        core::str::from_utf8(&self.name[..self.name_len]).unwrap_or("?")
    }

    /// The cache's id in kmemtrace events and dumps (1, 2, ... in creation
    /// order; 0 names no cache).
    pub fn id(&self) -> u32 {
        self.id
    }

    /// Object size in bytes, as requested at creation.
    pub fn obj_size(&self) -> usize {
        self.obj_size
    }

    /// Alignment in bytes every object is guaranteed (at least the
    /// requested one, at least 8).
    pub fn align(&self) -> usize {
        self.align
    }

    /// Creation flags.
    pub fn flags(&self) -> CacheFlags {
        self.flags
    }

    /// Slab layout of this cache.
    pub fn kind(&self) -> SlabKind {
        self.kind
    }

    /// The page source slabs come from.
    pub fn source(&self) -> &'static dyn PageSource {
        self.source
    }

    /// Whether this is one of the allocator's bootstrap (metadata) caches,
    /// whose objects callers can neither allocate nor free.
    pub fn is_bootstrap(&self) -> bool {
        self.hot_flags.load(Ordering::Relaxed) & HOT_BOOTSTRAP != 0
    }

    /// Allocate one constructed object of `obj_size()` bytes, aligned to
    /// `align()`.
    ///
    /// With feature `alloc-profiling`, the object is charged to the tag
    /// [`Platform::alloc_tag_current`] names (nothing if it says 0), which
    /// is asked only while profiling is switched on in the allocator
    /// ([`Allocator::set_alloc_profiling`](crate::Allocator::set_alloc_profiling)).
    ///
    /// # Errors
    /// [`AllocError::OutOfMemory`] if neither the magazines, the slabs nor
    /// the page source have an object; [`AllocError::ConstructorFailed`] if
    /// the constructor refused (the object went back to its slab);
    /// [`AllocError::InvalidLayout`] for a bootstrap cache.
    #[inline]
    pub fn alloc(&self) -> Result<NonNull<u8>, AllocError> {
        self.alloc_with(crate::alloc_tag::current::<P>, 0)
    }

    /// [`KmemCache::alloc`] charging the object to the allocation tag
    /// `tag` (an [`AllocTagRef`](crate::AllocTagRef); 0 charges nothing),
    /// for call sites that name their own tag (`kmem_cache_alloc!`). The
    /// object remembers the tag, so whoever frees it, on whatever CPU,
    /// uncharges the same tag. Without feature `alloc-profiling` the tag
    /// is ignored, and so it is while profiling is switched off in the
    /// allocator.
    ///
    /// # Errors
    /// As for [`KmemCache::alloc`].
    #[inline]
    pub fn alloc_tagged(&self, tag: u32) -> Result<NonNull<u8>, AllocError> {
        self.alloc_with(move || tag, 0)
    }

    /// Allocate, charging the tag `tag()` names. With profiling switched
    /// off in the allocator (`HOT_PROFILING` clear) `tag` is never called
    /// and the hit is exactly the compiled-out one: one `hot_flags` test.
    /// Switched on, the alloc goes to [`Self::alloc_flagged`] (out of
    /// line), which asks the tag after the magazine hit. `bytes_req` is
    /// what a kmalloc caller asked for (0: a `kmem_cache_alloc`), for
    /// kmemtrace only.
    #[inline(always)]
    pub(crate) fn alloc_with(
        &self,
        tag: impl Fn() -> u32,
        bytes_req: usize,
    ) -> Result<NonNull<u8>, AllocError> {
        let hot = self.hot_flags.load(Ordering::Relaxed);
        if hot & !HOT_TAGGED != 0 {
            return unpack(self.alloc_flagged(hot, tag, bytes_req));
        }
        let Some(obj) = self.magazine_alloc_fast() else {
            return unpack(self.alloc_slow(0));
        };
        Ok(obj)
    }

    /// [`Self::alloc_with`] with some flag set other than `HOT_TAGGED`:
    /// profiling on (the common profiled alloc: not `#[cold]`) and/or
    /// bookkeeping (the cold path). `tag` is called only if `HOT_PROFILING`
    /// is set.
    #[inline(never)]
    fn alloc_flagged(&self, hot: u32, tag: impl Fn() -> u32, bytes_req: usize) -> usize {
        if hot & HOT_KMEMTRACE != 0 {
            // KMEMTRACE HOOK: kmalloc, kmem_cache_alloc, GlobalAlloc (ok or failed).
            return self.alloc_recorded(hot & !HOT_KMEMTRACE, tag, bytes_req);
        }
        #[cfg(feature = "alloc-profiling")]
        if hot & !(HOT_TAGGED | HOT_PROFILING) == 0 {
            // Profiling on, no other bookkeeping: the magazine hit, then
            // the tag (nothing else is live by then).
            let Some(obj) = self.magazine_alloc_fast() else {
                return self.alloc_slow(tag());
            };
            let tag = tag();
            if tag != 0 {
                return self.alloc_tag_small(obj, tag, hot);
            }
            return pack(Ok(obj));
        }
        let tag = if hot & HOT_PROFILING != 0 { tag() } else { 0 };
        self.alloc_cold_packed(hot & !HOT_PROFILING, tag)
    }

    /// An allocation kmemtrace records: the alloc as without the bit, then
    /// the event (alloc or failed alloc).
    #[inline(never)]
    fn alloc_recorded(&self, hot: u32, tag: impl Fn() -> u32, bytes_req: usize) -> usize {
        let packed = if hot & !HOT_TAGGED == 0 {
            match self.magazine_alloc_fast() {
                Some(obj) => pack(Ok(obj)),
                None => self.alloc_slow(0),
            }
        } else {
            self.alloc_flagged(hot, tag, bytes_req)
        };
        self.owner().kmemtrace_alloc(self, packed, bytes_req);
        packed
    }

    /// The magazine miss path (no bookkeeping flags), charging `tag`
    /// (0: nothing).
    #[cold]
    #[inline(never)]
    fn alloc_slow(&self, tag: u32) -> usize {
        let obj = match self.magazine_alloc_slow() {
            Ok(obj) => obj,
            Err(error) => return pack(Err(error)),
        };
        #[cfg(feature = "alloc-profiling")]
        if tag != 0 {
            return self.alloc_tag_small(obj, tag, self.hot_flags.load(Ordering::Relaxed));
        }
        #[cfg(not(feature = "alloc-profiling"))]
        let _ = tag;
        pack(Ok(obj))
    }

    /// Charge a small-slab object just allocated to `tag` (profiling on).
    #[cfg(feature = "alloc-profiling")]
    #[inline(always)]
    fn alloc_tag_small(&self, obj: NonNull<u8>, tag: u32, hot: u32) -> usize {
        self.tag_small_object(obj, tag, hot);
        P::alloc_tag_add(tag, obj, self.obj_size);
        pack(Ok(obj))
    }

    /// [`Self::alloc_cold`], packed.
    #[cold]
    #[inline(never)]
    fn alloc_cold_packed(&self, hot: u32, tag: u32) -> usize {
        pack(self.alloc_cold(hot, tag))
    }

    /// Alloc with bookkeeping: bufctl state, audit bitmap, tracing.
    #[inline(always)]
    fn alloc_cold(&self, hot: u32, tag: u32) -> Result<NonNull<u8>, AllocError> {
        if hot & HOT_BOOTSTRAP != 0 {
            return Err(AllocError::InvalidLayout);
        }
        #[cfg(not(feature = "alloc-profiling"))]
        let _ = tag;
        let obj = self.magazine_alloc_or_miss()?;
        let addr = obj.as_ptr() as usize;
        if hot & HOT_BUFCTL != 0 {
            let layer = self.slab.lock();
            let bufctl = layer.hash.find(addr);
            debug_assert!(!bufctl.is_null());
            if !bufctl.is_null() {
                // SAFETY: bufctls in the hash are alive; we hold the lock.
                unsafe {
                    (*bufctl).state = BUFCTL_ALLOCATED;
                    // Always written: a reused bufctl must not keep the
                    // tag of its previous object.
                    #[cfg(feature = "alloc-profiling")]
                    {
                        (*bufctl).tag = tag;
                    }
                }
            }
        } else {
            #[cfg(feature = "alloc-profiling")]
            if tag != 0 {
                self.tag_small_object(obj, tag, hot);
            }
        }
        if hot & HOT_AUDIT != 0 {
            let (word, bit) = self.audit_bit(addr);
            // SAFETY: small slab object, its header is alive while the object is busy.
            unsafe { (*small_header(addr)).audit[word].fetch_or(bit, Ordering::AcqRel) };
        }
        if hot & HOT_TRACED != 0 {
            self.trace_alloc(obj);
        }
        #[cfg(feature = "alloc-profiling")]
        if tag != 0 {
            P::alloc_tag_add(tag, obj, self.obj_size);
        }
        Ok(obj)
    }

    /// Index of the object at `offset` bytes into a slab, and whether
    /// `offset` is an object start: one 64×64→128 multiply (see
    /// `stride_magic`). `offset` must be below 2^32 (every slab is).
    #[inline(always)]
    pub(crate) fn obj_index(&self, offset: usize) -> (usize, bool) {
        debug_assert!(offset < 1 << 32);
        let product = (offset as u64 as u128) * (self.stride_magic as u128);
        (
            (product >> 64) as usize,
            (product as u64) < self.stride_magic,
        )
    }

    fn audit_bit(&self, addr: usize) -> (usize, u64) {
        let (index, _) = self.obj_index(addr & (PAGE_SIZE - 1));
        (index / 64, 1u64 << (index % 64))
    }

    /// Free an object back to this cache.
    ///
    /// Checked: the pointer must be slab memory (`NotAllocated`), of this
    /// cache (`WrongCache`), at an object start (`Misaligned`); for bufctl
    /// caches and `AUDIT` caches it must be allocated (`DoubleFree`). On
    /// error nothing has changed.
    ///
    /// # Safety
    /// If `obj` is an allocated object of this cache, the caller gives it
    /// up: nothing uses it afterwards. (Bad pointers are detected as above
    /// and are safe to pass, except a double free on a small-object cache
    /// without `AUDIT`, which is undetected and corrupts the cache.)
    ///
    /// # Errors
    /// See above; [`FreeError::NotAllocated`] for bootstrap caches.
    #[inline]
    pub unsafe fn free(&self, obj: NonNull<u8>) -> Result<(), FreeError> {
        // SAFETY: per our caller.
        match unsafe { self.free_fast(obj) } {
            FastFree::Done => Ok(()),
            // SAFETY: per our caller; validated, nothing changed yet.
            FastFree::Flagged(cache, slab) => unsafe { cache.free_flagged(obj, slab) },
            // SAFETY: per our caller; the fast path changed nothing.
            FastFree::Slow => unsafe { self.free_slow(obj) },
        }
    }

    /// The whole free when everything goes the common way: the page map
    /// (so: on the primary source) names one of our slabs, `obj` is an object
    /// start, and then [`Self::free_fast_located`].
    ///
    /// # Safety
    /// As for [`KmemCache::free`] (the object is given up if `Done`).
    #[inline(always)]
    unsafe fn free_fast(&self, obj: NonNull<u8>) -> FastFree<'_, P> {
        let addr = obj.as_ptr() as usize;
        // Off the primary source the map is empty: entry 0, slow path.
        let entry = self.page_map.get(addr);
        let slab = (entry & !TAG_MASK) as *mut Slab;
        let ours = entry & TAG_MASK == TAG_SLAB
            // SAFETY: a TAG_SLAB entry names a registered slab, alive
            // (entries are cleared before a slab is destroyed); `&&` reads
            // it only then.
            && unsafe { (*slab).cache } == (self as *const Self).cast()
            // SAFETY: a live slab of ours whose page holds addr (above).
            && unsafe { self.is_object_start(slab, addr) };
        if !ours {
            return FastFree::Slow;
        }
        // SAFETY: validated; per our caller.
        unsafe { self.free_fast_located(obj, slab) }
    }

    /// The magazine hit of a validated free: `Done` if no bookkeeping flag
    /// is set and the loaded magazine had room; `Flagged` (nothing done)
    /// if some flag is set, for [`Self::free_flagged`], which needs no
    /// second validation; `Slow` (nothing done) on a magazine miss. Every
    /// outcome but `Done` is a tail call for the caller, so the hit stays
    /// a leaf.
    ///
    /// # Safety
    /// `obj` is an object start in `slab`, a live slab of this cache, and
    /// as for [`KmemCache::free`] (given up if `Done`).
    #[inline(always)]
    pub(crate) unsafe fn free_fast_located(
        &self,
        obj: NonNull<u8>,
        slab: *mut Slab,
    ) -> FastFree<'_, P> {
        if self.hot_flags.load(Ordering::Relaxed) & HOT_FREE_MASK != 0 {
            return FastFree::Flagged(self, slab);
        }
        // SAFETY: per our caller.
        if unsafe { self.magazine_free_fast(obj) } {
            FastFree::Done
        } else {
            FastFree::Slow
        }
    }

    /// [`KmemCache::free`] past the fast path: locate with error reports,
    /// bookkeeping, magazine miss.
    ///
    /// # Safety
    /// As for [`KmemCache::free`].
    #[cold]
    #[inline(never)]
    unsafe fn free_slow(&self, obj: NonNull<u8>) -> Result<(), FreeError> {
        let slab = match self.locate(obj.as_ptr() as usize) {
            Ok(slab) => slab,
            Err(error) => {
                // KMEMTRACE HOOK: kmem_cache_free of a pointer not ours.
                if self.hot_flags.load(Ordering::Relaxed) & HOT_KMEMTRACE != 0 {
                    self.owner().kmemtrace_free(Some(self), obj, false);
                }
                return Err(error);
            }
        };
        // SAFETY: per our caller; located in this cache.
        unsafe { self.free_located(obj, slab) }
    }

    /// Find and check the slab of a pointer freed to this cache. Returns
    /// null for bufctl caches off the primary source (the hash decides).
    ///
    /// On the primary source: one page-map load, a tag test, one compare
    /// of the slab's owner, then [`Self::check_object`].
    #[inline]
    pub(crate) fn locate(&self, addr: usize) -> Result<*mut Slab, FreeError> {
        if !self.on_primary {
            return self.locate_off_primary(addr);
        }
        let entry = self.page_map.get(addr);
        let slab = (entry & !TAG_MASK) as *mut Slab;
        if entry & TAG_MASK != TAG_SLAB
            // SAFETY: a TAG_SLAB entry names a registered slab, alive
            // (entries are cleared before a slab is destroyed); `||` reads
            // it only then.
            || unsafe { (*slab).cache } != (self as *const Self).cast()
        {
            return Err(self.locate_error(addr, entry));
        }
        // SAFETY: a live slab of ours (above).
        unsafe { self.check_object(slab, addr) }?;
        Ok(slab)
    }

    /// Why `addr` (page-map entry `entry`) is not one of our slabs' pages.
    #[cold]
    #[inline(never)]
    fn locate_error(&self, addr: usize, entry: usize) -> FreeError {
        if entry == 0 {
            return FreeError::NotAllocated { addr };
        }
        if entry & TAG_MASK != TAG_SLAB {
            return FreeError::WrongCache { addr, owner: None };
        }
        let slab = (entry & !TAG_MASK) as *mut Slab;
        // SAFETY: registered slabs are alive; slabs on the primary source
        // belong to caches of this allocator (same P), alive while they
        // have slabs.
        let other = unsafe { &*(*slab).cache.cast::<KmemCache<P>>() };
        FreeError::WrongCache {
            addr,
            owner: Some(other.static_name()),
        }
    }

    /// [`Self::locate`] for a cache on another page source: small slabs
    /// by header magic and owner, bufctl slabs by the hash (null here).
    #[inline(never)]
    fn locate_off_primary(&self, addr: usize) -> Result<*mut Slab, FreeError> {
        if self.kind != SlabKind::Small {
            return Ok(ptr::null_mut());
        }
        let (start, end) = self.source.span();
        if addr < start || addr >= end {
            return Err(FreeError::NotAllocated { addr });
        }
        let slab = small_header(addr);
        // SAFETY: the page lies in our source's span, which the source
        // promises is memory it manages (readable); a page that is not
        // one of our slabs fails the magic/owner test.
        let ours =
            unsafe { (*slab).magic == SLAB_MAGIC && (*slab).cache == (self as *const Self).cast() };
        if !ours {
            return Err(FreeError::NotAllocated { addr });
        }
        // SAFETY: a live slab of ours (above).
        unsafe { self.check_object(slab, addr) }?;
        Ok(slab)
    }

    /// Check that `addr`, inside one of `slab`'s pages, is an object start
    /// (`Misaligned` otherwise): one multiply (`obj_index`) and two
    /// compares. (`addr >= base` holds: the page map, or the small slab's
    /// header, put `addr` in the slab; so the offset is below the slab
    /// size, below 2^32.)
    ///
    /// # Safety
    /// `slab` is a live slab of this cache and `addr` lies in its pages.
    #[inline(always)]
    pub(crate) unsafe fn check_object(
        &self,
        slab: *mut Slab,
        addr: usize,
    ) -> Result<(), FreeError> {
        // SAFETY: per our caller.
        if unsafe { self.is_object_start(slab, addr) } {
            Ok(())
        } else {
            Err(misaligned(addr))
        }
    }

    /// Whether `addr` is an object start: see [`Self::check_object`].
    ///
    /// # Safety
    /// As for [`Self::check_object`].
    #[inline(always)]
    pub(crate) unsafe fn is_object_start(&self, slab: *mut Slab, addr: usize) -> bool {
        // SAFETY: per the caller; base never changes.
        let base = unsafe { (*slab).base };
        let (index, exact) = self.obj_index(addr.wrapping_sub(base));
        exact && index < self.nr_objs_per_slab
    }

    /// Name with the cache's lifetime, for error reports.
    fn static_name(&'static self) -> &'static str {
        self.name()
    }

    /// Free an object whose slab was located (and checked) already.
    ///
    /// # Safety
    /// As for [`KmemCache::free`]; `slab` came from `self.locate(obj)`
    /// (or `kfree`'s page-map lookup and `check_object`).
    #[inline]
    pub(crate) unsafe fn free_located(
        &self,
        obj: NonNull<u8>,
        slab: *mut Slab,
    ) -> Result<(), FreeError> {
        if self.hot_flags.load(Ordering::Relaxed) & HOT_FREE_MASK != 0 {
            // SAFETY: per our caller.
            return unsafe { self.free_flagged(obj, slab) };
        }
        // SAFETY: validated above; the caller gives the object up.
        unsafe { self.magazine_free(obj) };
        Ok(())
    }

    /// Free with bookkeeping (some `hot_flags` bit set): the checks that
    /// can refuse, tracing, uncharging the tag, then the magazines. Out of
    /// line; not `#[cold]`: with profiling on (`HOT_TAGGED`) it is the
    /// common free.
    ///
    /// # Safety
    /// As for [`Self::free_located`].
    #[inline(never)]
    pub(crate) unsafe fn free_flagged(
        &self,
        obj: NonNull<u8>,
        slab: *mut Slab,
    ) -> Result<(), FreeError> {
        let hot = self.hot_flags.load(Ordering::Relaxed) & HOT_FREE_MASK;
        #[cfg(feature = "alloc-profiling")]
        if hot == HOT_TAGGED {
            // SAFETY: per our caller.
            unsafe { self.free_tagged(obj) };
            return Ok(());
        }
        if hot & HOT_KMEMTRACE != 0 {
            // KMEMTRACE HOOK: kfree, kmem_cache_free (ok or refused).
            // SAFETY: per our caller.
            return unsafe { self.free_recorded(obj, slab, hot & !HOT_KMEMTRACE) };
        }
        // SAFETY: per our caller.
        unsafe { self.free_flagged_general(obj, slab, hot) }
    }

    /// A free kmemtrace records: the free as without the bit, then the
    /// event (free or bad free), with interrupts off throughout so that
    /// nothing on this CPU reuses the object before its free is recorded.
    ///
    /// # Safety
    /// As for [`Self::free_located`].
    #[inline(never)]
    unsafe fn free_recorded(
        &self,
        obj: NonNull<u8>,
        slab: *mut Slab,
        hot: u32,
    ) -> Result<(), FreeError> {
        let irq = P::irq_save();
        // SAFETY: per our caller.
        let result = unsafe { self.free_flagged_inline(obj, slab, hot) };
        self.owner().kmemtrace_free(Some(self), obj, result.is_ok());
        P::irq_restore(irq);
        result
    }

    /// The common profiled free (`HOT_TAGGED` the only flag), kept lean:
    /// clear the object's tag reference and uncharge its tag (nothing if
    /// it was allocated while profiling was off), then the magazine hit;
    /// the only call left is the (cold) magazine miss. Nothing here can
    /// refuse the free, so no error path.
    ///
    /// # Safety
    /// As for [`Self::free_located`].
    #[cfg(feature = "alloc-profiling")]
    #[inline(always)]
    unsafe fn free_tagged(&self, obj: NonNull<u8>) {
        self.untag_small_object(obj);
        // SAFETY: validated by our caller, who gives the object up.
        if !unsafe { self.magazine_free_fast(obj) } {
            // SAFETY: as above; the fast path changed nothing.
            unsafe { self.magazine_free_slow(obj) }
        }
    }

    /// [`Self::free_flagged_inline`], out of line (the flagged frees other
    /// than the common profiled one).
    ///
    /// # Safety
    /// As for [`Self::free_located`].
    #[inline(never)]
    unsafe fn free_flagged_general(
        &self,
        obj: NonNull<u8>,
        slab: *mut Slab,
        hot: u32,
    ) -> Result<(), FreeError> {
        // SAFETY: per our caller.
        unsafe { self.free_flagged_inline(obj, slab, hot) }
    }

    /// [`Self::free_flagged`] for `GlobalAlloc::dealloc`: a refused free
    /// goes to the allocator's free-error report.
    ///
    /// # Safety
    /// As for [`Self::free_located`].
    #[inline(never)]
    pub(crate) unsafe fn dealloc_flagged(&self, obj: NonNull<u8>, slab: *mut Slab) {
        let hot = self.hot_flags.load(Ordering::Relaxed) & HOT_FREE_MASK;
        #[cfg(feature = "alloc-profiling")]
        if hot == HOT_TAGGED {
            // SAFETY: per our caller.
            unsafe { self.free_tagged(obj) };
            return;
        }
        let result = if hot & HOT_KMEMTRACE != 0 {
            // KMEMTRACE HOOK: GlobalAlloc::dealloc (ok or refused).
            // SAFETY: per our caller.
            unsafe { self.free_recorded(obj, slab, hot & !HOT_KMEMTRACE) }
        } else {
            // SAFETY: per our caller.
            unsafe { self.free_flagged_general(obj, slab, hot) }
        };
        if let Err(error) = result {
            self.owner().report_free_error(error);
        }
    }

    /// The body of [`Self::free_flagged`]; `hot == 0` is allowed (a flag
    /// was cleared meanwhile) and frees plainly.
    ///
    /// # Safety
    /// As for [`Self::free_located`].
    #[inline(always)]
    unsafe fn free_flagged_inline(
        &self,
        obj: NonNull<u8>,
        slab: *mut Slab,
        hot: u32,
    ) -> Result<(), FreeError> {
        #[cfg(feature = "alloc-profiling")]
        if hot == HOT_TAGGED {
            // The common profiled case: no other bookkeeping.
            self.untag_small_object(obj);
        } else if hot != 0 {
            self.free_cold(obj, slab, hot)?;
        }
        #[cfg(not(feature = "alloc-profiling"))]
        if hot != 0 {
            self.free_cold(obj, slab, hot)?;
        }
        // SAFETY: validated above; the caller gives the object up.
        unsafe { self.magazine_free(obj) };
        Ok(())
    }

    /// Free-side bookkeeping: the checks that can refuse, then tracing.
    fn free_cold(&self, obj: NonNull<u8>, slab: *mut Slab, hot: u32) -> Result<(), FreeError> {
        let addr = obj.as_ptr() as usize;
        if hot & HOT_BOOTSTRAP != 0 {
            return Err(FreeError::NotAllocated { addr });
        }
        #[cfg(feature = "alloc-profiling")]
        let mut bufctl_tag = 0;
        if hot & HOT_BUFCTL != 0 {
            let layer = self.slab.lock();
            let bufctl = layer.hash.find(addr);
            if bufctl.is_null() {
                // Not busy in the slab layer. If the page map located an
                // exact object start in a live slab of ours, the object is
                // free in its slab: freed already (and gone back from the
                // magazines), or never handed out. Without a slab (a cache
                // off the primary source: the hash alone decides) we
                // cannot tell it from a stray pointer.
                return Err(if slab.is_null() {
                    FreeError::NotAllocated { addr }
                } else {
                    FreeError::DoubleFree { addr }
                });
            }
            // SAFETY: bufctls in the hash are alive; we hold the lock.
            unsafe {
                if (*bufctl).state != BUFCTL_ALLOCATED {
                    return Err(FreeError::DoubleFree { addr });
                }
                (*bufctl).state = BUFCTL_CACHED;
                #[cfg(feature = "alloc-profiling")]
                {
                    bufctl_tag = core::mem::take(&mut (*bufctl).tag);
                }
            }
        }
        if hot & HOT_AUDIT != 0 {
            let (word, bit) = self.audit_bit(addr);
            // SAFETY: `slab` is the located, alive small slab of addr.
            let old = unsafe { (*slab).audit[word].fetch_and(!bit, Ordering::AcqRel) };
            if old & bit == 0 {
                return Err(FreeError::DoubleFree { addr });
            }
        }
        if hot & HOT_EVER_TRACED != 0 {
            self.trace_free(addr);
        }
        // Uncharge only once every check above has passed: a refused free
        // changes nothing. No lock is held here.
        #[cfg(feature = "alloc-profiling")]
        if hot & HOT_BUFCTL != 0 {
            if bufctl_tag != 0 {
                P::alloc_tag_sub(bufctl_tag, obj, self.obj_size);
            }
        } else if hot & HOT_TAGGED != 0 {
            self.untag_small_object(obj);
        }
        Ok(())
    }

    /// Return free memory: empty every CPU's magazines and the depot
    /// (destructing their objects into the slab layer), then give every
    /// empty slab back to the page source. Returns the number of pages
    /// returned.
    ///
    /// All CPUs' magazines are drained, not only this CPU's: each per-CPU
    /// cache has its own lock, so this is safe; those CPUs refill from the
    /// slab layer next time.
    pub fn reap(&self) -> usize {
        self.drain_magazines();
        let nr_pages = self.reap_slabs();
        // Shrink empty hash tables back to their inline buckets (these
        // pages are metadata and are not counted in the result).
        self.free_hash_table();
        self.free_trace_table();
        nr_pages
    }

    /// Destroy the cache: drain it, return all its pages, free its
    /// metadata. Trace records still present are dropped and counted in
    /// the report (the kernel should warn: objects were leaked).
    ///
    /// # Safety
    /// Nothing uses this cache (or the reference) afterwards, and no other
    /// CPU is using it during the call.
    ///
    /// # Errors
    /// [`DestroyError::Busy`] if objects are still allocated (the cache is
    /// left intact and usable); [`DestroyError::Permanent`] for bootstrap
    /// and kmalloc caches.
    pub unsafe fn destroy(&'static self) -> Result<DestroyReport, DestroyError> {
        if self.permanent {
            return Err(DestroyError::Permanent);
        }
        let nr_allocated = self.stats().nr_allocated;
        if nr_allocated != 0 {
            return Err(DestroyError::Busy { nr_allocated });
        }
        self.reap();
        let counts = self.slab.lock().counts();
        if counts.nr_slabs != 0 {
            return Err(DestroyError::Busy {
                nr_allocated: counts.nr_busy_objs,
            });
        }
        let owner = self.owner();
        owner.unlink_cache(self);
        let nr_trace_records_dropped = self.trace_drop_all();
        self.free_trace_table();
        self.free_hash_table();
        // SAFETY: unlinked and drained; per our caller nobody uses the
        // cache any more. The per-CPU array and the cache struct came from
        // the kmem_pcpu / kmem_cache slab layers.
        unsafe {
            if !self.pcpu.is_null() {
                owner
                    .boot(crate::BootCache::Pcpu)
                    .slab_free_raw(self.pcpu.cast());
            }
            owner
                .boot(crate::BootCache::Cache)
                .slab_free_raw((self as *const Self).cast_mut().cast());
        }
        Ok(DestroyReport {
            nr_trace_records_dropped,
        })
    }

    /// Statistics, summed over CPUs. Takes each per-CPU lock, the depot
    /// lock and the slab lock in turn (not all at once), so the figures are
    /// a near-snapshot under concurrent use.
    pub fn stats(&self) -> CacheStats {
        let mut nr_allocs = self.nr_allocs_direct.load(Ordering::Relaxed);
        let mut nr_frees = self.nr_frees_direct.load(Ordering::Relaxed);
        let mut nr_cpu_cached_objs = 0;
        if !self.pcpu.is_null() {
            for cpu in 0..self.nr_cpus() {
                let cpu_stats = self.cpu_stats(cpu);
                nr_allocs = nr_allocs.wrapping_add(cpu_stats.nr_allocs);
                nr_frees = nr_frees.wrapping_add(cpu_stats.nr_frees);
                nr_cpu_cached_objs += cpu_stats.nr_rounds_loaded + cpu_stats.nr_rounds_prev;
            }
        }
        let (magsize, depot_nr_full, depot_nr_empty, nr_depot_objs) = {
            let depot = self.depot.inner.lock();
            (
                depot.magsize,
                depot.nr_full,
                depot.nr_empty,
                depot.nr_rounds(),
            )
        };
        let layer = self.slab.lock();
        let counts = layer.counts();
        let (nr_allocated, nr_allocs, nr_frees) = if self.is_bootstrap() {
            // Metadata is allocated straight from the slab layer.
            (counts.nr_busy_objs, layer.nr_allocs, layer.nr_frees)
        } else {
            (
                nr_allocs.wrapping_sub(nr_frees) as usize,
                nr_allocs,
                nr_frees,
            )
        };
        drop(layer);
        CacheStats {
            obj_size: self.obj_size,
            align: self.align,
            nr_allocated,
            nr_slabs: counts.nr_slabs,
            nr_pages_per_slab: self.nr_pages_per_slab,
            objs_per_slab: self.nr_objs_per_slab,
            nr_active_slabs: counts.nr_active_slabs,
            nr_total_objs: counts.nr_slabs * self.nr_objs_per_slab,
            nr_allocs_ever: nr_allocs,
            nr_frees_ever: nr_frees,
            magsize: if self.pcpu.is_null() { 0 } else { magsize },
            depot_nr_full,
            depot_nr_empty,
            depot_contention: self.depot.nr_contention.load(Ordering::Relaxed),
            nr_cpu_cached_objs,
            nr_depot_objs,
            total_bytes: counts.nr_pages * PAGE_SIZE,
            kind: self.kind,
        }
    }
}
