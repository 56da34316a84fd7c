//! `kmem_cache`: the object cache, tying the magazine layer
//! ([`crate::magazine`]), the slab layer ([`crate::slab`]) and tracing
//! ([`crate::trace`]) together.

use core::cell::UnsafeCell;
use core::marker::PhantomData;
use core::ptr::{self, NonNull};
use core::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crate::allocator::Allocator;
use crate::debug::{DebugLayout, freelist_secret};
use crate::error::{AllocError, DestroyError, FreeError};
use crate::geometry::{Geometry, SlabKind};
use crate::magazine::{
    Depot, MAGAZINE_ROUNDS, Magazine, PcpuCache, PcpuInner, PcpuSynced, Stale, max_magtype,
    start_magtype,
};
use crate::object::{Constructed, ObjectInit, ObjectRef};
use crate::pagemap::{PageMap, TAG_MASK, TAG_SLAB, entry_is_live};
use crate::platform::{PAGE_SIZE, PageSource, Platform};
use crate::slab::{SLAB_MAGIC, Slab, SlabLayer, small_header};
use crate::stats::{CacheStats, CpuCacheStats};
use crate::sync::IrqGuard;
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
        /// Keep every object's last alloc and last free (CPU, time,
        /// stack) in its debug trailer, for reports and `whatis` (illumos
        /// `KMF_AUDIT`, Linux `U`). Like every debug flag it makes the
        /// cache a debug cache: every alloc and free goes out of line,
        /// every double free is detected (see [`crate::debug`]).
        const AUDIT = 4;
        /// Poison free objects with `0xdeadbeef` and check it when they
        /// are handed out: writes after free are reported (illumos
        /// `KMF_DEADBEEF`, Linux `P`). Not for caches with a constructor.
        const POISON = 8;
        /// A redzone after every object, checked on free and by verify:
        /// linear overflows are reported (illumos `KMF_REDZONE`, Linux `Z`).
        const REDZONE = 16;
        /// Keep the first bytes of a freed object for the report (illumos
        /// `KMF_CONTENTS`).
        const CONTENTS = 32;
        /// The consistency checks alone: the state word that catches every
        /// double free, and full checks of frees (Linux `F`).
        const CONSISTENCY = 64;
    }
}

impl CacheFlags {
    /// The debug flags among these.
    pub fn debug(self) -> crate::debug::DebugFlags {
        crate::debug::DebugFlags::from_bits_truncate(self.bits())
    }

    /// The cache flags of these debug flags (same bits).
    pub fn from_debug(flags: crate::debug::DebugFlags) -> CacheFlags {
        CacheFlags::from_bits_truncate(flags.bits())
    }
}

bitflags::bitflags! {
    /// `hot_flags` bits: anything in [`HotFlags::ALLOC_SLOW`] /
    /// [`HotFlags::FREE_SLOW`] sends alloc / free off the plain hit, so a
    /// plain cache pays one load and one branch for all of these.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub(crate) struct HotFlags: u32 {
        /// Tracing is on: allocations are recorded.
        const TRACED = 1;
        /// Tracing was on once: frees look for a record.
        const EVER_TRACED = 2;
        /// A debug cache (any debug flag: see [`crate::debug`]): every
        /// alloc and free takes the debug cold path.
        const DEBUG = 4;
        /// A bufctl cache (profiled allocations store the tag in the bufctl).
        const BUFCTL = 8;
        /// A bootstrap cache: callers may neither allocate nor free.
        const BOOTSTRAP = 16;
        /// Some object of this small-object cache may carry a tag reference
        /// in its slab's tag side array (feature `alloc-profiling`): frees
        /// must look at it.
        const TAGGED = 32;
        /// Allocation profiling is switched on in the allocator
        /// ([`Allocator::set_alloc_profiling`](crate::Allocator::set_alloc_profiling)):
        /// allocations ask [`Platform::alloc_tag_current`].
        const PROFILING = 64;
        /// Some object of this bufctl cache carries a tag in its bufctl:
        /// frees look it up (out of line).
        const BUFCTL_TAGGED = 128;
        /// kmemtrace is recording this cache
        /// ([`Allocator::kmemtrace_start`](crate::Allocator::kmemtrace_start)):
        /// allocs and frees take the flagged paths, which record an event.
        const KMEMTRACE = 256;
    }
}

impl HotFlags {
    /// The bits that send an allocation off the plain hit.
    pub(crate) const ALLOC_SLOW: HotFlags = HotFlags::TRACED
        .union(HotFlags::KMEMTRACE)
        .union(HotFlags::DEBUG)
        .union(HotFlags::BOOTSTRAP)
        .union(HotFlags::PROFILING);
    /// The bits that send a free off the plain hit.
    pub(crate) const FREE_SLOW: HotFlags = HotFlags::EVER_TRACED
        .union(HotFlags::KMEMTRACE)
        .union(HotFlags::DEBUG)
        .union(HotFlags::BOOTSTRAP)
        .union(HotFlags::TAGGED)
        .union(HotFlags::BUFCTL_TAGGED);
}

/// Object constructor: runs when an object leaves the slab layer towards
/// callers (it then stays constructed in the magazines). It is handed the
/// object (the cache's object size in bytes, possibly uninitialised) and
/// returns the [`Constructed`] that writing all of it yields; an `Err`
/// fails the allocation. Callers get the objects of a cache with a
/// constructor constructed, and give them back constructed (Bonwick 1994):
/// every byte initialised, so they can be read
/// ([`SlabBox::into_constructed`](crate::SlabBox::into_constructed)).
pub type Ctor = for<'a> fn(obj: ObjectInit<'a>) -> Result<Constructed<'a>, ()>;
/// Object destructor: runs when an object goes back from the magazine
/// layer to the slab layer; readable if the cache has a constructor
/// ([`ObjectRef::as_bytes`](crate::ObjectRef::as_bytes)).
pub type Dtor = for<'a> fn(obj: ObjectRef<'a>);

/// What [`KmemCache::destroy`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DestroyReport {
    /// Trace records still outstanding at destruction, now dropped. Non-zero
    /// means some traced object was never freed: the kernel should warn.
    pub nr_trace_records_dropped: usize,
}

/// Links of the allocator's cache list (under the cache-list lock).
pub(crate) struct CacheLinks<P: Platform> {
    pub(crate) prev: *const KmemCache<P>,
    pub(crate) next: *const KmemCache<P>,
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
    /// Small slabs of one page with the header at its end: the profiled
    /// alloc finds a slab's header (its tag side array) by masking the
    /// object's address; otherwise through the page map.
    #[cfg(feature = "alloc-profiling")]
    pub(crate) tag_header_in_page: bool,
    /// The per-CPU caches, one per CPU (null for bootstrap caches); this
    /// CPU's is at `pcpu + Platform::cpu_offset()`.
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
    pub(crate) nr_pages_per_slab: usize,
    /// Small slabs: the header is a `kmem_slab` object, not the slab's
    /// last bytes.
    pub(crate) header_off_slab: bool,
    pub(crate) ctor: Option<Ctor>,
    pub(crate) dtor: Option<Dtor>,
    pub(crate) align: usize,
    pub(crate) flags: CacheFlags,
    pub(crate) source: &'static dyn PageSource,
    pub(crate) owner: *const Allocator<P>,
    // Written by any CPU on slow paths: from here on, away from the fields
    // above (`Depot` is cache-line aligned).
    pub(crate) depot: Depot,
    pub(crate) slab: SlabLayer,
    /// Objects allocated from / freed to the slab layer directly by
    /// callers (magazine layer missed).
    pub(crate) nr_allocs_direct: AtomicU64,
    pub(crate) nr_frees_direct: AtomicU64,
    pub(crate) trace: TraceTable,
    pub(crate) name: [u8; 32],
    pub(crate) name_len: usize,
    /// kmemtrace cache id (1, 2, ... in creation order).
    pub(crate) id: u32,
    pub(crate) links: UnsafeCell<CacheLinks<P>>,
    /// Debug caches: where the debug trailer's parts are.
    pub(crate) debug: Option<DebugLayout>,
    /// The free-list obfuscation secret ([`crate::freelist`]).
    pub(crate) freelist_secret: usize,
    /// Where a free object holds its free-list link: 0, or in the debug
    /// trailer (so the poison stays whole).
    pub(crate) freeptr_offset: usize,
    _platform: PhantomData<fn() -> P>,
}

// SAFETY: shared state is behind spin locks or atomics; `pcpu` is an array
// of per-CPU caches each owned by its CPU (see `pcpu_mut`); `links` is only touched under
// the allocator's cache-list lock; everything else is immutable after
// creation.
unsafe impl<P: Platform> Sync for KmemCache<P> {}
// SAFETY: as above; nothing is tied to the creating CPU.
unsafe impl<P: Platform> Send for KmemCache<P> {}

/// A magazine pointer handed over by its CPU in a cross-CPU call.
struct SendMagazine(*mut Magazine);

// SAFETY: the magazine is owned by whoever holds the value (its CPU gave
// it up).
unsafe impl Send for SendMagazine {}

impl Default for SendMagazine {
    fn default() -> Self {
        SendMagazine(ptr::null_mut())
    }
}

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
    /// The debug object layout (a cache with debug flags).
    pub(crate) debug: Option<DebugLayout>,
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
        let mut hot = HotFlags::empty();
        if geometry.kind == SlabKind::Bufctl {
            hot |= HotFlags::BUFCTL;
        }
        if spec.debug.is_some() {
            hot |= HotFlags::DEBUG;
        }
        if spec.bootstrap {
            hot |= HotFlags::BOOTSTRAP;
        }
        KmemCache {
            hot_flags: AtomicU32::new(hot.bits()),
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
            header_off_slab: geometry.header_off_slab,
            ctor: spec.ctor,
            dtor: spec.dtor,
            obj_size: spec.size,
            #[cfg(feature = "alloc-profiling")]
            tag_header_in_page: geometry.kind == SlabKind::Small
                && geometry.nr_pages_per_slab == 1
                && !geometry.header_off_slab,
            align: geometry.align,
            flags: spec.flags,
            source: spec.source,
            owner,
            permanent: spec.permanent,
            depot: Depot::new(start_magtype(geometry.stride), max_magtype(geometry.stride)),
            slab: SlabLayer::new(),
            nr_allocs_direct: AtomicU64::new(0),
            nr_frees_direct: AtomicU64::new(0),
            trace: TraceTable::new(),
            name,
            name_len,
            id: spec.id,
            links: UnsafeCell::new(CacheLinks {
                prev: ptr::null(),
                next: ptr::null(),
            }),
            debug: spec.debug,
            freelist_secret: freelist_secret(
                P::now()
                    ^ (spec.name.as_ptr() as u64).rotate_left(29)
                    ^ ((geometry.stride as u64) << 40)
                    ^ (owner as u64).rotate_left(7),
            ),
            freeptr_offset: spec.debug.map_or(0, |layout| layout.freeptr_offset),
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

    /// Bytes from one object's start to the next in a slab: the object
    /// size rounded up to the alignment, plus, in a debug cache, the debug
    /// trailer (redzone, state word, audit records, ...).
    pub fn stride(&self) -> usize {
        self.stride
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
        self.hot().contains(HotFlags::BOOTSTRAP)
    }

    /// The hot flags now.
    #[inline(always)]
    pub(crate) fn hot(&self) -> HotFlags {
        HotFlags::from_bits_retain(self.hot_flags.load(Ordering::Relaxed))
    }

    /// Set hot flags (tracing, profiling, tagging switch on).
    pub(crate) fn set_hot(&self, flags: HotFlags) {
        self.hot_flags.fetch_or(flags.bits(), Ordering::AcqRel);
    }

    /// Clear hot flags.
    pub(crate) fn clear_hot(&self, flags: HotFlags) {
        self.hot_flags.fetch_and(!flags.bits(), Ordering::AcqRel);
    }

    /// This CPU's per-CPU cache, owned while `irq` lives. Only for caches
    /// with a magazine layer (every cache but the bootstrap ones, whose
    /// allocs and frees are refused on the `BOOTSTRAP` paths first).
    #[inline(always)]
    pub(crate) fn pcpu_mut<'g>(&self, irq: &'g mut IrqGuard<P>) -> &'g mut PcpuInner {
        let _ = irq;
        debug_assert!(!self.pcpu.is_null() && P::cpu_id() <= self.last_cpu);
        // SAFETY: pcpu has nr_cpus slots of CPU_SLOT_BYTES, alive as long
        // as the cache; cpu_offset() is cpu_id() * CPU_SLOT_BYTES with
        // cpu_id() < nr_cpus (the Platform contract). Interrupts are off
        // (`irq`), so this CPU owns its slot; the allocator never holds
        // two guards at once, so this is the only reference.
        unsafe {
            let pcpu = self.pcpu.byte_add(P::cpu_offset());
            (*pcpu).get()
        }
    }

    /// [`Self::pcpu_mut`] for code off the hits: the magazines' headers
    /// exact while the result lives ([`PcpuSynced`]).
    #[inline]
    pub(crate) fn pcpu_synced<'g>(&self, irq: &'g mut IrqGuard<P>) -> PcpuSynced<'g> {
        PcpuSynced::new(self.pcpu_mut(irq))
    }

    /// Run `f` on CPU `cpu`'s per-CPU cache of this cache, on that CPU
    /// (a [cross-CPU call](Platform::cross_cpu_call)). Not for bootstrap
    /// caches; `cpu < nr_cpus`. Called with no allocator lock held.
    pub(crate) fn on_cpu<R: Send + Default>(
        &self,
        cpu: usize,
        f: impl Fn(&mut PcpuInner) -> R + Sync,
    ) -> R {
        debug_assert!(!self.pcpu.is_null() && cpu <= self.last_cpu);
        let result = spin::Mutex::new(R::default());
        // SAFETY: cpu < nr_cpus, the array's length; alive with the cache.
        let pcpu: &PcpuCache = unsafe { &*self.pcpu.add(cpu) };
        P::cross_cpu_call(cpu, &|| {
            // SAFETY: runs as CPU `cpu`, exclusive with its interrupts-off
            // sections (the Platform contract), so the slot is ours.
            let mut pcc = PcpuSynced::new(unsafe { pcpu.get() });
            *result.lock() = f(&mut pcc);
        });
        result.into_inner()
    }

    /// Length of the per-CPU array (for caches that have one).
    #[inline]
    pub(crate) fn nr_cpus(&self) -> usize {
        self.last_cpu + 1
    }

    /// CPU `cpu`'s magazines of this cache: allocations and frees they
    /// served, rounds they hold now. All zero for a CPU id out of range
    /// and for bootstrap caches (no magazine layer). Reads them on that
    /// CPU (a cross-CPU call), so the four figures are one exact snapshot.
    pub fn cpu_stats(&self, cpu: usize) -> CpuCacheStats {
        if self.pcpu.is_null() || cpu > self.last_cpu {
            return CpuCacheStats::default();
        }
        self.on_cpu(cpu, |pcc| pcc.stats())
    }

    /// A new empty magazine of the depot's type, from its
    /// `kmem_magazine_<rounds>` bootstrap cache.
    pub(crate) fn new_magazine(&self) -> Result<*mut Magazine, AllocError> {
        let magtype = self.depot.magtype();
        let mem = self.owner().magazine_cache(magtype).slab_alloc_raw()?;
        // SAFETY: a fresh object of the magazine type's cache:
        // magazine_bytes(capacity) bytes, 8-aligned, ours.
        Ok(unsafe { Magazine::init(mem, MAGAZINE_ROUNDS[magtype]) })
    }

    /// Free the magazines an exchange detached (see [`Stale`]).
    pub(crate) fn free_stale(&self, stale: Stale) {
        let mut mag = stale.0;
        while !mag.is_null() {
            // SAFETY: detached from the depot (or handed over by a
            // per-CPU cache); ours alone now.
            unsafe {
                let next = Magazine::next_of(mag);
                self.free_magazine(mag);
                mag = next;
            }
        }
    }

    /// Empty every per-CPU cache and the depot: rounds are destructed and
    /// go back to the slab layer, magazines to their `kmem_magazine_<N>`.
    ///
    /// CPU by CPU, a cross-CPU call hands that CPU's two magazines over;
    /// then the depot lock is held only to detach its lists. Nothing is
    /// freed on the other CPU or under a lock (destructors and the
    /// magazine caches run here with no lock held). CPUs may allocate and
    /// free throughout: whatever they put in magazines after their turn
    /// stays there.
    pub(crate) fn drain_magazines(&self) {
        if self.pcpu.is_null() {
            return;
        }
        for cpu in 0..self.nr_cpus() {
            let (loaded, prev) = self.on_cpu(cpu, |pcc| {
                let (loaded, prev) = pcc.take_magazines();
                (SendMagazine(loaded), SendMagazine(prev))
            });
            for mag in [loaded.0, prev.0] {
                if mag != crate::magazine::no_magazine() && !mag.is_null() {
                    // SAFETY: handed over by its CPU; ours alone now.
                    unsafe { self.free_magazine(mag) };
                }
            }
        }
        let (full, empty) = self.depot.take_all();
        // SAFETY: detached from the depot; ours alone now.
        unsafe { self.free_magazine_lists(full, empty) };
    }

    /// Free two detached lists of magazines (rounds and all).
    ///
    /// # Safety
    /// Both lists were detached from this cache's depot and are ours.
    unsafe fn free_magazine_lists(&self, full: *mut Magazine, empty: *mut Magazine) {
        for mut mag in [full, empty] {
            while !mag.is_null() {
                // SAFETY: detached from the depot; ours alone now.
                unsafe {
                    let next = Magazine::next_of(mag);
                    self.free_magazine(mag);
                    mag = next;
                }
            }
        }
    }

    /// Free a detached magazine's rounds (destructed) to the slab layer
    /// and the magazine itself to its `kmem_magazine_<capacity>` cache.
    ///
    /// # Safety
    /// `mag` is a live magazine of this cache referenced by no per-CPU
    /// cache or depot list.
    unsafe fn free_magazine(&self, mag: *mut Magazine) {
        // SAFETY: per the caller, the magazine and its rounds are ours.
        unsafe {
            self.slab_free_objects(crate::magazine::held_rounds(mag));
            let capacity = (*mag).capacity as usize;
            let magtype = MAGAZINE_ROUNDS
                .iter()
                .position(|&rounds| rounds == capacity)
                .expect("a magazine's capacity is a magazine type's");
            self.owner()
                .magazine_cache(magtype)
                .slab_free_raw(mag.cast());
        }
    }

    /// Test support: call `f` with every round in every per-CPU cache
    /// (read on each CPU in turn) and in the depot, so a test can check
    /// that no object rests in two places.
    #[cfg(test)]
    pub(crate) fn for_each_round(&self, mut f: impl FnMut(*mut u8)) {
        extern crate alloc;
        if !self.pcpu.is_null() {
            for cpu in 0..self.nr_cpus() {
                let rounds = self.on_cpu(cpu, |pcc| {
                    let mut rounds = alloc::vec::Vec::new();
                    for mag in [pcc.loaded, pcc.prev] {
                        // SAFETY: this CPU's own magazines, read on it.
                        let held = unsafe { crate::magazine::held_rounds(mag) };
                        rounds.extend(held.iter().map(|&round| round as usize));
                    }
                    rounds
                });
                for round in rounds {
                    f(round as *mut u8);
                }
            }
        }
        let depot = self.depot.lock();
        depot.for_each_magazine(|mag| {
            // SAFETY: a magazine on a depot list, under the depot lock.
            for &round in unsafe { crate::magazine::held_rounds(mag) } {
                f(round);
            }
        });
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
        if !entry_is_live(entry) {
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
        if unsafe { self.object_index(slab, addr) }.is_some() {
            Ok(())
        } else {
            Err(misaligned(addr))
        }
    }

    /// The index of the object starting at `addr` in `slab`, or `None`
    /// if `addr` is not an object start: one multiply (`obj_index`) and
    /// two compares.
    ///
    /// # Safety
    /// As for [`Self::check_object`].
    #[inline(always)]
    pub(crate) unsafe fn object_index(&self, slab: *mut Slab, addr: usize) -> Option<usize> {
        // SAFETY: per the caller; base never changes.
        let base = unsafe { (*slab).base };
        let (index, exact) = self.obj_index(addr.wrapping_sub(base));
        if exact && index < self.nr_objs_per_slab {
            Some(index)
        } else {
            None
        }
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

    /// The debug flags this cache runs with (empty: a plain cache).
    pub fn debug_flags(&self) -> crate::debug::DebugFlags {
        self.debug
            .map_or(crate::debug::DebugFlags::empty(), |layout| layout.flags)
    }

    /// The hardened free list of the small slab whose object 0 is at
    /// `base`.
    pub(crate) fn free_list(&self, base: usize) -> crate::freelist::FreeList {
        crate::freelist::FreeList {
            base,
            stride: self.stride,
            nr_objs: self.nr_objs_per_slab,
            link_offset: self.freeptr_offset,
            secret: self.freelist_secret,
        }
    }

    /// The header of the small slab holding `addr` (an object of this
    /// cache in a live slab): through the page map on the primary source
    /// (the header may be off slab or at the end of a later page), at the
    /// end of the page otherwise (one-page slabs there).
    #[inline]
    pub(crate) fn small_slab_of(&self, addr: usize) -> *mut Slab {
        if self.on_primary {
            (self.page_map.get(addr) & !TAG_MASK) as *mut Slab
        } else {
            small_header(addr)
        }
    }

    /// Name with the cache's lifetime, for error reports.
    fn static_name(&'static self) -> &'static str {
        self.name()
    }

    /// Return free memory: empty every CPU's magazines and the depot
    /// (destructing their objects into the slab layer), then give every
    /// empty slab back to the page source. Returns the number of pages
    /// returned.
    ///
    /// All CPUs' magazines are drained, not only this CPU's, each by its
    /// own CPU in a [cross-CPU call](Platform::cross_cpu_call); those CPUs
    /// refill from the depot or the slab layer next time. Call it with
    /// interrupts enabled and no allocator lock held (not from a
    /// constructor, destructor or page source).
    pub fn reap(&self) -> usize {
        self.drain_magazines();
        let nr_pages = self.reap_slabs();
        // Shrink empty hash tables back to their inline buckets (these
        // pages are metadata and are not counted in the result).
        self.free_hash_table();
        self.free_trace_table();
        nr_pages
    }

    /// Start a new working-set interval for this cache's depot (Bonwick &
    /// Adams 2001 §3.7; illumos `kmem_depot_ws_update`): the fewest full
    /// and empty magazines the depot held since the last update become
    /// what the next [`KmemCache::ws_reap`] may free. A kernel calls
    /// [`Allocator::kmem_update`](crate::Allocator::kmem_update) from a
    /// periodic tick instead of this.
    pub fn ws_update(&self) {
        if !self.pcpu.is_null() {
            self.depot.ws_update();
        }
    }

    /// Give back what lies beyond the working set: the depot magazines
    /// (full and empty) that no CPU needed during the last whole interval,
    /// their rounds destructed into the slab layer; then every empty slab
    /// to the page source. Per-CPU magazines stay (no cross-CPU call).
    /// Returns pages returned. Call it as [`KmemCache::reap`].
    pub fn ws_reap(&self) -> usize {
        if !self.pcpu.is_null() {
            let (full, empty) = self.depot.ws_take();
            // SAFETY: detached from our depot; ours alone now.
            unsafe { self.free_magazine_lists(full, empty) };
        }
        let nr_pages = self.reap_slabs();
        self.free_hash_table();
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

    /// Statistics, summed over CPUs. Reads each CPU's figures on that CPU
    /// (a cross-CPU call), then takes the depot lock and the slab lock in
    /// turn (not all at once), so the figures are a near-snapshot under
    /// concurrent use. Call it as [`KmemCache::reap`].
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
                depot.magsize(),
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
            waste_bytes: (counts.nr_pages * PAGE_SIZE)
                .saturating_sub(counts.nr_slabs * self.nr_objs_per_slab * self.obj_size),
            kind: self.kind,
        }
    }
}
