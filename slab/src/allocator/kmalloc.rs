//! kmalloc: the size classes (`kmalloc-8` … `kmalloc-8192`: the Linux
//! set and classes between them) and page-granular allocations above
//! them, `kfree` (its locate, `KmemCache::locate_allocated` in
//! `cache/free.rs`, then the cache's one free, `KmemCache::free_located`,
//! or the page-granular half), `ksize` and `owns`. A size class's alloc
//! is its cache's one alloc (`KmemCache::alloc_at`, `cache/alloc.rs`).

use core::ptr::NonNull;
use core::sync::atomic::Ordering;

use super::Kmem;
use crate::alloc_tag::AllocTagRef;
use crate::cache::KmemCache;
use crate::error::{AllocError, FreeError};
use crate::layout::pagemap::{PageEntry, PageOwner};
use crate::platform::{PAGE_SIZE, Platform};
use crate::slab::Slab;

/// The kmalloc size classes in bytes: cache `i` is named
/// `kmalloc-<KMALLOC_SIZES[i]>`. Every Linux class (8, 16, 32, 64, 96,
/// 128, 192, 256, 512, … 8192) is among them. The spacing bounds the
/// rounding waste: 8 bytes apart up to 128 (the 8-byte granularity every
/// object has), then eight classes per power of two up to 1 KiB (step
/// `2^k / 8` between `2^k` and `2^(k+1)`, as mimalloc spaces its bins),
/// so above 64 bytes a request never wastes 12.5 % of its class or more
/// (`(step - 1) / class < 1/8`); above 1 KiB, where a mixed heap's bytes
/// are, [`CLASS_STEP_ABOVE_TABLE`] (64) bytes apart, so a request wastes
/// less than 1/16 of its class, less than 1/64 from 4 KiB, and 0.74 % on
/// average over sizes spread evenly from 8 B to 8 KiB (issue 34: 4.15 %
/// with eight classes per power of two). 152 classes; the table is
/// checked in `src/tests/kmalloc.rs` and `src/tests/geometry.rs`.
pub const KMALLOC_SIZES: [usize; 152] = {
    // 8..=128 by 8, then eight per power of two to 1024, then by 64.
    let mut sizes = [0; 152];
    let mut index = 0;
    while index < 16 {
        sizes[index] = 8 * (index + 1);
        index += 1;
    }
    let mut base = 128;
    while base < CLASS_TABLE_MAX {
        let mut step = 1;
        while step <= 8 {
            sizes[index] = base + step * (base / 8);
            index += 1;
            step += 1;
        }
        base *= 2;
    }
    while index < 152 {
        sizes[index] = sizes[index - 1] + CLASS_STEP_ABOVE_TABLE;
        index += 1;
    }
    sizes
};
/// Bytes between two size classes above [`CLASS_TABLE_MAX`]: the
/// alignment of every class there (so the aligned lookup needs no scan).
const CLASS_STEP_ABOVE_TABLE: usize = 64;
/// Index of the class [`CLASS_TABLE_MAX`] (the last one the by-8 table
/// covers): 16 classes to 128, 8 per doubling to 1024.
const CLASS_TABLE_MAX_INDEX: usize = 39;
/// Largest kmalloc served by a size class; larger requests are
/// page-granular.
pub const KMALLOC_MAX_SIZE: usize = 8192;
pub(crate) const NR_KMALLOC: usize = KMALLOC_SIZES.len();

/// Random copies of each size class that `kmalloc!` call sites are
/// spread over (Linux `CONFIG_RANDOM_KMALLOC_CACHES`, 6.6: 15 copies
/// beside the normal one; here 8, for the memory they cost: see
/// docs/HARDENING.md). A call site's copy is a hash of its identity (its
/// code tag, or its source location without profiling) with a per-boot
/// seed, so two unrelated sites share a slab with probability 1/8, and
/// which sites do changes every boot. Untagged allocations (`GlobalAlloc`:
/// `Box`, `Vec`; `kmalloc` without a tag) keep the normal classes and
/// their one-load hit.
pub const NR_KMALLOC_RANDOM: usize = 8;
/// The row of [`KmallocArgs::of`]'s pointer-free types (after Linux's
/// `kmem_buckets` and the typed-kmalloc RFC's separation of data from
/// pointer-holding objects): `kmalloc-data-<size>`.
pub(crate) const DATA_PARTITION: usize = NR_KMALLOC_RANDOM;
/// Rows of `Kmem::kmalloc_partitions`: the random copies, then the data
/// row.
pub(crate) const NR_KMALLOC_PARTITIONS: usize = NR_KMALLOC_RANDOM + 1;

/// The per-boot seed of the call-site hash (0 until `init`).
static PARTITION_SEED: core::sync::atomic::AtomicU64 = core::sync::atomic::AtomicU64::new(0);

/// Seed the call-site hash from `seed` (a clock mixed with an address),
/// once a boot.
pub(crate) fn init_partition_seed(seed: u64) {
    let _ = PARTITION_SEED.compare_exchange(
        0,
        crate::layout::freelist::freelist_secret(seed) as u64,
        Ordering::Relaxed,
        Ordering::Relaxed,
    );
}

/// The random copy (0 .. `NR_KMALLOC_RANDOM`) of call site `site`: a
/// multiply-shift hash of the site with the boot's seed.
#[inline]
pub(crate) fn random_partition(site: usize) -> usize {
    let mixed =
        (site as u64 ^ PARTITION_SEED.load(Ordering::Relaxed)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    ((mixed >> 32) as usize * NR_KMALLOC_RANDOM) >> 32
}

/// A type [`KmallocArgs::of`] allocates, saying whether it holds
/// pointers. Pointer-free types (`POINTER_FREE = true`: integers, bytes,
/// arrays of them) go to their own `kmalloc-data-<size>` caches, so a
/// buffer whose contents an attacker controls never shares a slab with
/// an object holding pointers; every other type gets a random copy
/// chosen by the type (as a call site gets one). A wrong `true` weakens
/// only that separation, never memory safety.
pub trait KmallocObj {
    /// Whether the type holds no pointer (nor anything an attacker
    /// could turn into one).
    const POINTER_FREE: bool = false;
}

macro_rules! pointer_free {
    ($($ty:ty),*) => {
        $(impl KmallocObj for $ty {
            const POINTER_FREE: bool = true;
        })*
    };
}
pointer_free!(
    u8, u16, u32, u64, u128, usize, i8, i16, i32, i64, i128, isize, bool, char, f32, f64
);

impl<T: KmallocObj, const N: usize> KmallocObj for [T; N] {
    const POINTER_FREE: bool = T::POINTER_FREE;
}

/// What a kmalloc asks for ([`Kmem::kmalloc_with`]; Linux's kmalloc
/// arguments: size, alignment, `__GFP_ZERO`, and the call site of the
/// `_track_caller` variants), built from [`KmallocArgs::new`]:
///
/// ```
/// # use magpie_slab::KmallocArgs;
/// # fn args(tag: Option<magpie_slab::AllocTagRef>) -> KmallocArgs {
/// // 64 zeroed bytes, charged to `tag`, from this call site's random
/// // copy of kmalloc-64.
/// KmallocArgs::new(64, 8).tag(tag).site().zeroed()
/// # }
/// ```
#[derive(Debug, Clone, Copy)]
#[must_use]
pub struct KmallocArgs {
    /// Bytes asked for (1 or more).
    size: usize,
    /// Alignment in bytes (a power of two).
    align: usize,
    /// The tag charged.
    tag: Charge,
    /// Which copy of the size class serves it.
    row: Row,
    /// Whether the first `size` bytes are zeroed.
    zero: bool,
}

/// The tag a kmalloc is charged to (feature `alloc-profiling`).
#[derive(Debug, Clone, Copy)]
enum Charge {
    /// The current tag (`AllocTagHooks::current_token`).
    Current,
    /// An explicit tag; `None` charges nothing.
    Tag(Option<AllocTagRef>),
}

/// The copy of the size class that serves a kmalloc.
#[derive(Debug, Clone, Copy)]
enum Row {
    /// The normal class.
    Normal,
    /// The random copy of a call site (or a type): the site's identity,
    /// hashed with the boot's seed ([`random_partition`]); the tag's, if
    /// one is named.
    Site(usize),
    /// `kmalloc-data-<size>`: pointer-free typed objects.
    Data,
}

impl KmallocArgs {
    /// `size` bytes (1 or more) aligned to `align` (a power of two; both
    /// checked by the allocation: [`AllocError::InvalidLayout`]), from the
    /// normal size class, not zeroed, charged to the current tag.
    pub const fn new(size: usize, align: usize) -> Self {
        Self {
            size,
            align,
            tag: Charge::Current,
            row: Row::Normal,
            zero: false,
        }
    }

    /// Charge the allocation to `tag` (`None` charges nothing) rather
    /// than to the current tag: call sites that name their own tag
    /// (`kmalloc!`). Without feature `alloc-profiling` the tag is ignored.
    pub const fn tag(self, tag: Option<AllocTagRef>) -> Self {
        let row = match (self.row, tag) {
            // A site's copy is chosen by its tag once it has one.
            (Row::Site(_), Some(tag)) => Row::Site(tag.get() as usize),
            (row, _) => row,
        };
        Self {
            tag: Charge::Tag(tag),
            row,
            ..self
        }
    }

    /// Serve it from the call site's own copy of the size class,
    /// **partitioned** (Linux `RANDOM_KMALLOC_CACHES`): one of
    /// `NR_KMALLOC_RANDOM` copies (`kmalloc-rnd-<NN>-<size>`), chosen by
    /// the site (its tag, [`KmallocArgs::tag`]; without one, its source
    /// location: `#[track_caller]`) and a per-boot seed, so objects of
    /// unrelated sites rarely share a slab. Each copy is created on its
    /// first use. On a small source (whose classes come on first use: a
    /// copy each would cost a `kmem_cache`) the normal class serves it.
    #[track_caller]
    pub fn site(self) -> Self {
        let site = match self.tag {
            Charge::Tag(Some(tag)) => tag.get() as usize,
            _ => core::ptr::from_ref(core::panic::Location::caller()) as usize,
        };
        Self {
            row: Row::Site(site),
            ..self
        }
    }

    /// Zero the first `size` bytes (Linux `kzalloc`, `__GFP_ZERO`).
    pub const fn zeroed(self) -> Self {
        Self { zero: true, ..self }
    }

    /// An uninitialised `T` (Linux's typed `kmalloc_obj`): its size and
    /// alignment, from its own partition: `kmalloc-data-<size>` for a
    /// pointer-free type ([`KmallocObj::POINTER_FREE`]), else a random
    /// copy chosen by the type (a later [`KmallocArgs::site`], or
    /// [`KmallocArgs::tag`] of a tag, chooses by the site instead), not
    /// zeroed, charged to the current tag. [`Kmem::kbox`] is its safe
    /// form; a zero-sized `T` is [`AllocError::InvalidLayout`].
    ///
    /// ```
    /// # use magpie_slab::KmallocArgs;
    /// // A `[u8; 64]` from kmalloc-data-64 (`Kmem::kmalloc_with`).
    /// let args = KmallocArgs::of::<[u8; 64]>();
    /// # let _ = args;
    /// ```
    pub fn of<T: KmallocObj>() -> Self {
        let row = if T::POINTER_FREE {
            Row::Data
        } else {
            Row::Site(core::any::type_name::<T>().as_ptr() as usize)
        };
        Self {
            row,
            ..Self::new(size_of::<T>(), align_of::<T>())
        }
    }
}

/// Largest size the one-lookup class table covers.
pub(crate) const CLASS_TABLE_MAX: usize = 1024;
/// Entries of the by-8 tables ([`CLASS_BY_8`], `Kmem::kmalloc_by_8`).
pub(crate) const NR_BY_8: usize = CLASS_TABLE_MAX / 8 + 1;

/// Class index for sizes `0..=CLASS_TABLE_MAX`, by `(size + 7) / 8`: the
/// smallest class at least that big (size 0 shares `kmalloc-8`). One load
/// on the kmalloc hit.
const CLASS_BY_8: [u8; NR_BY_8] = {
    let mut table = [0u8; NR_BY_8];
    let mut slot = 0;
    while slot < table.len() {
        let size = slot * 8;
        let mut class = 0;
        while KMALLOC_SIZES[class] < size {
            class += 1;
        }
        table[slot] = class as u8;
        slot += 1;
    }
    table
};

/// The entries of [`CLASS_BY_8`] that hold each class, `start..end` (empty
/// for classes above [`CLASS_TABLE_MAX`]): the table is sorted, so a
/// class's entries are one run. What `update_by_8` stores a class to
/// without a walk of the whole table (129 entries on each class's birth).
const BY_8_RANGE: [(u8, u8); NR_KMALLOC] = {
    assert!(NR_BY_8 <= u8::MAX as usize);
    let mut ranges = [(0u8, 0u8); NR_KMALLOC];
    let mut slot = 0;
    while slot < NR_BY_8 {
        let class = CLASS_BY_8[slot] as usize;
        if ranges[class].1 == 0 {
            ranges[class].0 = slot as u8;
        } else {
            // One run: the previous entry holds the same class.
            assert!(CLASS_BY_8[slot - 1] as usize == class);
        }
        ranges[class].1 = slot as u8 + 1;
        slot += 1;
    }
    ranges
};

/// The class index of `size` (`CLASS_TABLE_MAX + 1 ..= KMALLOC_MAX_SIZE`)
/// by arithmetic: classes there are [`CLASS_STEP_ABOVE_TABLE`] apart from
/// [`CLASS_TABLE_MAX`] (index 39), so the class is
/// `39 + ceil((size - 1024) / 64)`, i.e. `24 + (size - 1) / 64`.
#[inline(always)]
const fn class_index_above_table(size: usize) -> usize {
    CLASS_TABLE_MAX_INDEX - CLASS_TABLE_MAX / CLASS_STEP_ABOVE_TABLE
        + ((size - 1) / CLASS_STEP_ABOVE_TABLE)
        + 1
}

/// Natural alignment of a size class: the largest power of two dividing
/// it, capped at [`PAGE_SIZE`].
pub const fn natural_align(size: usize) -> usize {
    let align = 1usize << size.trailing_zeros();
    if align > PAGE_SIZE { PAGE_SIZE } else { align }
}

const _: () = {
    // The by-8 table's bound (`small_class_cache`) is a power of two.
    assert!(CLASS_TABLE_MAX.is_power_of_two());
    // The table and the arithmetic agree with the class list.
    assert!(KMALLOC_SIZES[NR_KMALLOC - 1] == KMALLOC_MAX_SIZE && KMALLOC_SIZES[15] == 128);
    assert!(KMALLOC_SIZES[CLASS_TABLE_MAX_INDEX] == CLASS_TABLE_MAX);
    assert!(CLASS_STEP_ABOVE_TABLE.is_power_of_two() && CLASS_STEP_ABOVE_TABLE <= CLASS_TABLE_MAX);
    let mut size = CLASS_TABLE_MAX + 1;
    while size <= KMALLOC_MAX_SIZE {
        let class = class_index_above_table(size);
        assert!(KMALLOC_SIZES[class] >= size && KMALLOC_SIZES[class - 1] < size);
        size += 1;
    }
    let mut size = 1;
    while size <= CLASS_TABLE_MAX {
        let class = CLASS_BY_8[(size + 7) >> 3] as usize;
        assert!(KMALLOC_SIZES[class] >= size && (class == 0 || KMALLOC_SIZES[class - 1] < size));
        size += 1;
    }
    // The aligned lookup (`kmalloc_index`): for every alignment
    // up to PAGE_SIZE, the class of a multiple of the alignment is itself
    // a multiple of it, so it is the smallest class that is at least the
    // rounded size and naturally aligned to `align`.
    let mut align = 8;
    while align <= PAGE_SIZE {
        let mut rounded = align;
        while rounded <= KMALLOC_MAX_SIZE {
            let class = if rounded <= CLASS_TABLE_MAX {
                CLASS_BY_8[(rounded + 7) >> 3] as usize
            } else {
                class_index_above_table(rounded)
            };
            assert!(natural_align(KMALLOC_SIZES[class]) >= align);
            rounded += align;
        }
        align *= 2;
    }
};

impl<P: Platform> Kmem<P> {
    /// Index of the kmalloc class for `size` bytes aligned to `align` (a
    /// power of two); `None`: page-granular. O(1) for every alignment: a
    /// class serves `align` (up to [`PAGE_SIZE`]) exactly when `align`
    /// divides its size, and the smallest such class at least `size`
    /// bytes is the class of `size` rounded up to `align` (the const block
    /// above checks it for every alignment), so one rounding and one class
    /// lookup replace a scan. (Size 0 gets the smallest class serving
    /// `align`: callers refuse it or round it up first.) The hits look a
    /// small request up without it ([`Self::small_class_cache`]).
    #[inline(always)]
    pub(crate) fn kmalloc_index(size: usize, align: usize) -> Option<usize> {
        if size > KMALLOC_MAX_SIZE || align > PAGE_SIZE {
            return None;
        }
        // size.max(align): size 0 still gets an `align`-aligned class.
        let rounded = (size.max(align) + (align - 1)) & !(align - 1);
        if rounded <= CLASS_TABLE_MAX {
            Some(CLASS_BY_8[(rounded + 7) >> 3] as usize)
        } else if rounded <= KMALLOC_MAX_SIZE {
            Some(class_index_above_table(rounded))
        } else {
            None
        }
    }

    /// Copy the kmalloc slots into the by-8 table (`init`, right before
    /// READY: until then the small-size hit finds null and refuses).
    pub(super) fn publish_by_8(&self) {
        for index in 0..NR_KMALLOC {
            self.update_by_8(index);
        }
    }

    /// Copy slot `index` to its entries of the by-8 table (after the slot
    /// changed: `init`, a class born on first use).
    pub(super) fn update_by_8(&self, index: usize) {
        let cache = self.kmalloc[index].load(Ordering::Acquire);
        let (start, end) = BY_8_RANGE[index];
        for entry in &self.kmalloc_by_8[usize::from(start)..usize::from(end)] {
            entry.store(cache, Ordering::Release);
        }
    }

    #[inline(always)]
    pub(crate) fn kmalloc_cache(&self, index: usize) -> &'static KmemCache<P> {
        debug_assert!(index < NR_KMALLOC);
        // SAFETY: READY (checked by callers): every slot holds a cache or
        // an unborn stub (allocator/classes.rs), both permanent, published
        // with Release; index < NR_KMALLOC (kmalloc_index returns class
        // indices only).
        unsafe { &*self.kmalloc.get_unchecked(index).load(Ordering::Acquire) }
    }

    /// Allocate `size` bytes aligned to `align` (a power of two), charged
    /// to the current allocation tag: [`Kmem::kmalloc_with`] of
    /// [`KmallocArgs::new`]`(size, align)`, the common case.
    ///
    /// Served by the smallest `kmalloc-<n>` class with `n >= size` whose
    /// natural alignment (largest power of two dividing `n`, capped at
    /// `PAGE_SIZE`) is at least `align`; otherwise page-granular from the
    /// primary source (whole pages, page-aligned).
    ///
    /// # Errors
    /// [`AllocError::NotInitialized`]; [`AllocError::InvalidLayout`] for
    /// size 0, `align` not a power of two, or `align` above 1 GiB with no
    /// class able to give it; [`AllocError::OutOfMemory`].
    #[inline]
    pub fn kmalloc(&self, size: usize, align: usize) -> Result<NonNull<u8>, AllocError> {
        self.kmalloc_with(KmallocArgs::new(size, align))
    }

    /// The one kmalloc (Linux `__kmalloc_node_track_caller`): `args.size`
    /// bytes aligned to `args.align` (a power of two), from the size
    /// class's cache (its one allocation, `KmemCache::alloc_at`) —
    /// the call site's random copy of it if `args` names a site
    /// ([`KmallocArgs::site`]), the `kmalloc-data-<size>` row for
    /// pointer-free typed objects — or page-granular (whole pages from the
    /// primary source, page-aligned, recorded by kmemtrace); zeroed first
    /// ([`KmallocArgs::zeroed`]) if asked (Linux `kzalloc`; whole pages
    /// from a source that [zeroes its pages](crate::PageSource::zeroes_pages)
    /// are not cleared again). Free it with [`Kmem::kfree`].
    ///
    /// With feature `alloc-profiling`, the memory is charged to the tag
    /// `args` names ([`KmallocArgs::tag`]), else to the current one
    /// ([`AllocTagHooks::current`](crate::AllocTagHooks::current)):
    /// the cache's object size for a size class (class-rounded), whole
    /// pages for a page-granular block.
    ///
    /// # Errors
    /// As for [`Kmem::kmalloc`].
    // Out of line: a caller's wrapper (a kernel's `kmalloc!` site) stays
    // small enough to inline into the call site, so the first frame
    // outside the allocator's text is the call site's (kmemtrace's
    // `caller_frames`).
    #[inline(never)]
    pub fn kmalloc_with(&self, args: KmallocArgs) -> Result<NonNull<u8>, AllocError> {
        let KmallocArgs {
            size,
            align,
            tag,
            row,
            zero,
        } = args;
        if size == 0 || !align.is_power_of_two() {
            return Err(self.invalid_layout());
        }
        let tag = move || match tag {
            Charge::Current => crate::alloc_tag::current::<P>(),
            Charge::Tag(tag) => crate::alloc_tag::explicit::<P>(tag),
        };
        // The cache: a partition's (a site's random copy, the data row)
        // once kmalloc is partitioned (not on a small source, nor before
        // `init`: refused below), else the normal class (before `init`
        // the unready entry, which the cache's hit refuses).
        let cache = match row {
            Row::Site(site) if self.kmalloc_partitioned.load(Ordering::Relaxed) => {
                self.partition_cache(random_partition(site), size, align)?
            }
            Row::Data if self.kmalloc_partitioned.load(Ordering::Relaxed) => {
                self.partition_cache(DATA_PARTITION, size, align)?
            }
            _ => self.class_cache(size, align),
        };
        let result = match cache {
            // SAFETY: a class's or a partition's cache, an unborn stub or
            // the unready entry.
            Some(cache) => unsafe { KmemCache::alloc_at(cache, tag, size) },
            None => self.kmalloc_pages::<false>(size, align, tag),
        };
        if zero && let Ok(ptr) = result {
            self.zero_new(ptr, size, align);
        }
        result
    }

    /// Clear a fresh kmalloc block of `size` bytes unless it is known zero
    /// (whole pages from a zeroing source).
    pub(crate) fn zero_new(&self, ptr: NonNull<u8>, size: usize, align: usize) {
        if Self::kmalloc_index(size, align).is_none() && self.primary_source().zeroes_pages() {
            return;
        }
        // SAFETY: a fresh block of at least `size` bytes, ours.
        unsafe { core::ptr::write_bytes(ptr.as_ptr(), 0, size) };
    }

    /// `n` elements of `size` bytes each, zeroed (Linux `kcalloc`; the
    /// one array allocation: its product is checked, an overflow is
    /// [`AllocError::InvalidLayout`] with nothing allocated).
    ///
    /// # Errors
    /// As for [`Kmem::kmalloc`], and `InvalidLayout` on overflow.
    pub fn kcalloc(&self, n: usize, size: usize, align: usize) -> Result<NonNull<u8>, AllocError> {
        let bytes = n.checked_mul(size).ok_or(AllocError::InvalidLayout)?;
        self.kmalloc_with(KmallocArgs::new(bytes, align).zeroed())
    }

    /// Usable size in bytes of an allocated pointer: the object size of its
    /// cache, or the whole pages of a page-granular allocation. (With
    /// `REDZONE`, a kmalloc object's redzone starts at the size asked for:
    /// to use more of it, `krealloc` to that size first, as in Linux.)
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
        let entry = self.page_entry(addr);
        match entry.owner() {
            PageOwner::Slab(slab) => {
                let slab = slab as *mut Slab;
                // SAFETY: registered slabs are alive, caches of this allocator.
                let cache = unsafe { &*(*slab).cache.cast::<KmemCache<P>>() };
                cache.locate(addr)?;
                Ok(cache.obj_size())
            }
            PageOwner::LargeHead { nr_pages, .. } if addr & (PAGE_SIZE - 1) == 0 => {
                Ok(nr_pages * PAGE_SIZE)
            }
            PageOwner::LargeHead { .. }
            | PageOwner::LargeTail
            | PageOwner::LargeLead(_)
            | PageOwner::LargeTrail(_) => Err(FreeError::Misaligned { addr }),
            // KFENCE HOOK: a sampled object's size.
            _ => self
                .kfence_ksize(addr)
                .ok_or(FreeError::NotAllocated { addr }),
        }
    }

    /// Whether `ptr` points into memory this allocator handed out (a slab
    /// page of a primary-source cache or a page-granular kmalloc), judged
    /// by the page map. A kernel that used a bootstrap heap before `init`
    /// routes frees with this: `owns` → [`Kmem::kfree`], else the
    /// bootstrap heap. False before init.
    #[inline]
    pub fn owns(&self, ptr: *const u8) -> bool {
        self.is_ready() && self.page_entry(ptr as usize).is_live()
    }

    /// The page-map entry of `addr`, a later page of a live
    /// page-granular kmalloc reported as such (its head alone is stored:
    /// [`PageMap::get_resolved`](crate::layout::pagemap::PageMap::get_resolved)).
    /// For the error paths, `ksize` and `owns`; the hits read the slot.
    pub(crate) fn page_entry(&self, addr: usize) -> PageEntry {
        self.page_map()
            .get_resolved(addr, self.large_max_pages.load(Ordering::Relaxed))
    }
}

// -------------------------------------------------------- kmalloc / kfree

impl<P: Platform> Kmem<P> {
    /// The cache of the size class serving `size` bytes aligned to
    /// `align` (a power of two): [`Self::small_class_cache`], else
    /// (above the by-8 table or aligned above 8) the class by arithmetic
    /// ([`Self::kmalloc_index`]) once the allocator is ready.
    /// `None`: page-granular, or not ready.
    #[inline(always)]
    pub(crate) fn class_cache(&self, size: usize, align: usize) -> Option<*const KmemCache<P>> {
        if let Some(cache) = self.small_class_cache(size, align) {
            return Some(cache);
        }
        if !self.is_ready() {
            return None;
        }
        let index = Self::kmalloc_index(size, align)?;
        Some(self.kmalloc_cache(index))
    }

    /// The cache of a request below [`CLASS_TABLE_MAX`] bytes aligned to
    /// at most 8, by size in one load of the by-8 table; `None` for any
    /// other request (the arithmetic: [`Self::kmalloc_index`]). No readiness or null
    /// test: before `init` the entry is the unready one, which the cache's
    /// hit refuses (`cache/alloc.rs`). A live cache, an unborn stub, or
    /// the unready entry.
    #[inline(always)]
    pub(crate) fn small_class_cache(
        &self,
        size: usize,
        align: usize,
    ) -> Option<*const KmemCache<P>> {
        debug_assert!(align.is_power_of_two());
        // Two compares (one OR-ed test, `size | (align - 1) << 7`, costs
        // two register copies here, where both `size` and `align` stay
        // live for the paths off the hit).
        if size < CLASS_TABLE_MAX && align <= 8 {
            // Acquire (a plain load on x86): a cache published by `init`
            // or a class's birth is seen whole.
            let cache = self.kmalloc_by_8[(size + 7) >> 3].load(Ordering::Acquire);
            debug_assert!(!cache.is_null());
            return Some(cache);
        }
        // Unlikely (so LLVM keeps the two compares as two branches rather
        // than combining their flags).
        core::hint::cold_path();
        None
    }

    /// The error of a bad layout: `NotInitialized` before init (tested
    /// first, as it always was), else `InvalidLayout`.
    #[cold]
    #[inline(never)]
    fn invalid_layout(&self) -> AllocError {
        if self.is_ready() {
            AllocError::InvalidLayout
        } else {
            AllocError::NotInitialized
        }
    }

    /// Free memory from [`Kmem::kmalloc`] — or from any cache on the
    /// primary source (the owner is found through the page map).
    ///
    /// # Safety
    /// If `ptr` is allocated, the caller gives it up. Bad pointers are
    /// detected and refused as for [`KmemCache::free`] (same caveat for
    /// double frees without debug flags).
    ///
    /// # Errors
    /// [`FreeError::NotAllocated`] (outside the page map, not slab memory,
    /// or before init), [`FreeError::Misaligned`], [`FreeError::DoubleFree`].
    /// On error nothing changed.
    #[inline]
    pub unsafe fn kfree(&self, ptr: NonNull<u8>) -> Result<(), FreeError> {
        match KmemCache::<P>::locate_allocated(self.page_map(), ptr.as_ptr() as usize) {
            // SAFETY: per our caller; located in `cache`.
            Some((cache, at)) => unsafe { cache.free_located(ptr, at) },
            // SAFETY: per our caller; nothing changed.
            None => unsafe { self.kfree_slow::<false>(ptr.as_ptr()) },
        }
    }
}
