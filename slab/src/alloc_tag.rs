//! Allocation profiling support (feature `alloc-profiling`): every object a
//! caller holds remembers, in 4 bytes, the allocation tag it was charged to
//! (Linux's `slabobj_ext` code-tag reference), so that its free uncharges
//! the same tag wherever and on whichever CPU it happens.
//!
//! The allocator knows nothing of tags beyond these 4 bytes; the platform
//! names the tag of an allocation ([`Platform::alloc_tag_current`], or the
//! caller does through `alloc_tagged` / `kmalloc_tagged`) and keeps the
//! counters ([`Platform::alloc_tag_add`], [`Platform::alloc_tag_sub`]).
//!
//! Where the reference lives:
//!
//! - **small-object slabs**: a per-slab **tag side array** of one
//!   `Option<AllocTagRef>` per object (`nr_objs * 4` bytes), after Linux's
//!   `alloc_slab_obj_exts` (mm/slub.c). The slab header's `tags` pointer
//!   names a shared all-`None` array (`NO_TAGS`, never written, so a free
//!   reads its object's slot without testing) until the first tagged
//!   allocation from the slab, which allocates the slab's own array
//!   (zeroed: every object `None`) from the bootstrap cache
//!   `kmem_tags_<bytes>` of the next size up (32, 48, 64, 96, … 1536,
//!   2048 bytes) and installs it with a compare-exchange; a CPU that
//!   loses the race frees its copy and uses the winner's. The array goes
//!   back with the slab (`destroy_slab`). So the slab layout is the same
//!   with the feature and without (kmalloc-8 holds 496 objects per page
//!   either way), and a slab that never held a tagged object costs
//!   nothing. An object's slot is at the object's index, the high word of
//!   `offset * ceil(2^64 / stride)` — the multiply that also checks frees;
//! - **bufctl slabs**: an `Option<AllocTagRef>` in the object's bufctl (it
//!   fits in padding: no extra bytes);
//! - **page-granular kmalloc**: the upper 32 bits of the first page's
//!   page-map entry (no extra bytes; 0 is `None`).
//!
//! `None` means "no tag" (allocated while profiling was off): its free
//! uncharges nothing, so no counter underflows. A free object's reference
//! is always `None` (frees clear it), so an object allocated while
//! profiling is off needs no store at all, and profiling switched on late
//! finds the untagged objects of older slabs `None` in the array their
//! first tagged neighbour installs.
//!
//! **No recursion**: the side-array caches are bootstrap caches, whose
//! objects are never tagged, so allocating a side array never needs
//! another one; it is allocated after the magazine hit, with no lock held
//! and interrupts on (lock order: like any metadata allocation).
//! **Never a failure caused by profiling**: if the side array cannot be
//! allocated, the object is still handed out, untagged and uncharged
//! (its free uncharges nothing), and the miss is counted
//! ([`Allocator::nr_tag_array_misses`](crate::Allocator::nr_tag_array_misses)).
//!
//! The runtime switch: [`Allocator::set_alloc_profiling`](crate::Allocator::set_alloc_profiling)
//! sets or clears `PROFILING` in every cache's `hot_flags` (new caches
//! inherit it); a kernel calls it whenever its own switch flips. Setting
//! it also sets `TAGGED` (in the same atomic update) on small-slab caches
//! (not bootstrap ones), so the profiled alloc tests no flag; clearing it
//! leaves `TAGGED` (objects may still carry references). Set, the alloc
//! goes to the out-of-line profiled path, which asks `alloc_tag_current()`
//! after the magazine hit; clear, no tag is asked for (explicit tags are
//! ignored too) and the object gets no reference.
//!
//! Costs (callgrind, 64-byte `GlobalAlloc` pair on the host bench, see
//! docs/BENCHMARKS.md): compiled out, nothing (no code, no bytes).
//! Compiled in but off: nothing per alloc (the bit is in the word the hit
//! tests anyway), and no memory (no side array is allocated); per free,
//! `TAGGED` is one more bit of the one `FREE_SLOW` mask test, and a cache
//! that has been profiled sends its frees one tail call away. On: a tail
//! call to the profiled path, `alloc_tag_current_token()` (a per-CPU
//! load and its `None` test), the slab header (masking the address for a
//! one-page slab with its header at its end, else the page map), its
//! side-array pointer compared with `NO_TAGS`, a multiply, the charge
//! (`alloc_tag_charge_token`) and a 4-byte store per alloc; a tail call
//! with the index in a register, the side-array pointer, the slot's
//! load, test and clear and `alloc_tag_uncharge` per free (23 + 15
//! instructions on the host bench's 64-byte `GlobalAlloc` pair: see
//! docs/BENCHMARKS.md). Memory: 4 bytes per object of every small slab
//! that ever held a tagged object, rounded up to the side-array cache's
//! size (`MetadataStats::tag_array_bytes`).
//!
//! **Charge tokens.** What a slot (or a bufctl, or a page-granular
//! block's page-map entry) holds is the platform's token for the tag
//! ([`Platform::alloc_tag_token`], [`Platform::alloc_tag_current_token`]),
//! checked once when made; the tag closures of the alloc paths return
//! tokens ([`current`], [`explicit`]), and only those reach the `unsafe`
//! [`Platform::alloc_tag_charge_token`] and
//! [`Platform::alloc_tag_uncharge`]. A free object's slot is `None`.

#[cfg(feature = "alloc-profiling")]
use core::ptr::{self, NonNull};
#[cfg(feature = "alloc-profiling")]
use core::sync::atomic::Ordering;

#[cfg(feature = "alloc-profiling")]
use crate::allocator::TAG_ARRAY_SIZES;
use crate::cache::HotFlags;
#[cfg(feature = "alloc-profiling")]
use crate::cache::KmemCache;
#[cfg(feature = "alloc-profiling")]
use crate::geometry::SlabKind;
#[cfg(feature = "alloc-profiling")]
use crate::pagemap::TAG_MASK;
#[cfg(feature = "alloc-profiling")]
use crate::path::Located;
#[cfg(feature = "alloc-profiling")]
use crate::platform::PAGE_SIZE;
use crate::platform::Platform;
#[cfg(feature = "alloc-profiling")]
use crate::slab::{Slab, small_header};

/// A reference from an object to its allocation tag (in `magpie-codetag`:
/// the tag's index in its section plus one; the same type). Never 0: "no
/// tag" is `None`, and an `Option<AllocTagRef>` is 4 bytes, 0 for `None`
/// (what a free object's slot holds).
pub type AllocTagRef = core::num::NonZeroU32;

/// Bytes of tag reference per object of a small slab, in its side array.
#[cfg(feature = "alloc-profiling")]
pub(crate) const TAG_REF_BYTES: usize = core::mem::size_of::<Option<AllocTagRef>>();

const _: () = assert!(core::mem::size_of::<Option<AllocTagRef>>() == 4);

/// The side array of every slab that has none of its own yet: a slot of
/// `None` for each object of any slab, never written (a free writes a
/// slot only to clear a `Some`). So the profiled free reads an object's
/// slot without testing for a side array (`None`: nothing to uncharge);
/// the profiled alloc compares with [`no_tags`] to know it must install
/// one. In a read-only section: a stray write faults.
#[cfg(feature = "alloc-profiling")]
static NO_TAGS: [Option<AllocTagRef>; crate::geometry::MAX_SMALL_OBJS] =
    [None; crate::geometry::MAX_SMALL_OBJS];

/// [`NO_TAGS`] as a slab header's `tags` pointer ("no side array yet").
#[cfg(feature = "alloc-profiling")]
#[inline(always)]
pub(crate) fn no_tags() -> *mut Option<AllocTagRef> {
    // Never written through (see NO_TAGS).
    NO_TAGS.as_ptr().cast_mut()
}

/// The charge token of the tag to charge an allocation made now
/// ([`Platform::alloc_tag_current_token`]; `None` when profiling is
/// compiled out or the platform says none). Every tag closure of the
/// alloc paths returns a token: this one, or [`explicit`]'s.
#[inline(always)]
pub(crate) fn current<P: Platform>() -> Option<AllocTagRef> {
    if cfg!(feature = "alloc-profiling") {
        P::alloc_tag_current_token()
    } else {
        None
    }
}

/// The charge token of an explicit tag (`alloc_tagged`,
/// `kmalloc_tagged`): checked once by [`Platform::alloc_tag_token`]
/// (`None`: charge nothing; always without the feature).
#[inline(always)]
pub(crate) fn explicit<P: Platform>(tag: Option<AllocTagRef>) -> Option<AllocTagRef> {
    if cfg!(feature = "alloc-profiling") {
        tag.and_then(P::alloc_tag_token)
    } else {
        None
    }
}

impl<P: Platform> crate::cache::KmemCache<P> {
    /// Switch allocation profiling on or off in this cache's hot flags.
    /// On also sets `TAGGED` (in the same atomic update) on a small-slab
    /// cache that may tag its objects (not a bootstrap cache), so the
    /// profiled alloc needs no flag test; off leaves `TAGGED` (objects may
    /// still carry references).
    pub(crate) fn set_profiling(&self, on: bool) {
        #[cfg(feature = "alloc-profiling")]
        if on && self.kind == SlabKind::Small && !self.hot().contains(HotFlags::BOOTSTRAP) {
            self.set_hot(HotFlags::PROFILING | HotFlags::TAGGED);
            return;
        }
        if on {
            self.set_hot(HotFlags::PROFILING);
        } else {
            self.clear_hot(HotFlags::PROFILING);
        }
    }
}

#[cfg(feature = "alloc-profiling")]
impl<P: Platform> KmemCache<P> {
    /// The profiled alloc's side-array slot of `obj`, or `None` if its
    /// slab has no side array yet. The slab header: for a one-page slab
    /// with its header at its end, at the end of the object's page (one
    /// mask; the offset is the address's low bits); for any other through
    /// the page map (slabs of several pages, and off-slab headers, are
    /// packed ones, on the primary source: no `on_primary` test). `TAGGED`
    /// is set with `PROFILING` ([`KmemCache::set_profiling`]), so there
    /// is no flag to test.
    ///
    /// # Safety
    /// `obj` is a busy object of one of this cache's small slabs.
    #[inline(always)]
    pub(crate) unsafe fn alloc_tag_slot(
        &self,
        obj: NonNull<u8>,
    ) -> Option<*mut Option<AllocTagRef>> {
        debug_assert!(self.hot().contains(HotFlags::TAGGED));
        let addr = obj.as_ptr() as usize;
        let (tags, offset) = if self.tag_header_in_page {
            let page = addr & !(PAGE_SIZE - 1);
            let slab = small_header(page);
            // SAFETY: per the caller, the slab is alive.
            (unsafe { (*slab).tags.load(Ordering::Acquire) }, addr - page)
        } else {
            debug_assert!(self.on_primary);
            let slab = (self.page_map.get(addr) & !TAG_MASK) as *mut Slab;
            // SAFETY: as above.
            unsafe { ((*slab).tags.load(Ordering::Acquire), addr - (*slab).base) }
        };
        if tags == no_tags() {
            return None;
        }
        let (index, _) = self.obj_index(offset);
        // SAFETY: index < nr_objs (a busy object of the slab), the side
        // array's length.
        Some(unsafe { tags.add(index) })
    }

    /// The profiled alloc for a slab without a side array yet: install
    /// one, charge and store the charge token (nothing if it cannot be
    /// allocated), in the caller's result type.
    #[cold]
    #[inline(never)]
    pub(crate) fn charge_first_in_slab<O: crate::path::AllocOut>(
        &self,
        obj: NonNull<u8>,
        tag: AllocTagRef,
    ) -> O::Raw {
        let slab = self.small_slab_of(obj.as_ptr() as usize);
        // SAFETY: obj is a busy object of ours in `slab`, alive.
        unsafe { self.charge_and_store(obj, slab, tag) };
        // Opaque to the caller: were LLVM to infer that this returns its
        // argument, the caller would keep `obj` in a callee-saved
        // register across a plain call instead of tail-calling (a frame
        // on the profiled hit).
        O::raw_from_obj(core::hint::black_box(obj))
    }

    /// Charge `tag` for a small-slab object just allocated and store the
    /// charge token in its slot, setting `TAGGED` first if the cache does
    /// not have it yet (the out-of-line paths: explicit tags, debug
    /// caches). Nothing is charged if no side array could be allocated
    /// (the miss counted).
    pub(crate) fn tag_small_object(&self, obj: NonNull<u8>, tag: AllocTagRef, hot: HotFlags) {
        if !hot.contains(HotFlags::TAGGED) {
            // Before the store: whoever frees the object sees the flag.
            self.set_hot(HotFlags::TAGGED);
        }
        let slab = self.small_slab_of(obj.as_ptr() as usize);
        // SAFETY: obj is a busy object of one of our small slabs, alive.
        unsafe { self.charge_and_store(obj, slab, tag) }
    }

    /// Charge `tag` for `obj` and store the charge token in its
    /// side-array slot, installing the slab's side array first if it has
    /// none. Nothing is charged if it had none and none could be
    /// allocated (counted in `nr_tag_array_misses`).
    ///
    /// # Safety
    /// `obj` is a busy object of `slab`, a live small slab of this cache.
    unsafe fn charge_and_store(&self, obj: NonNull<u8>, slab: *mut Slab, tag: AllocTagRef) {
        // SAFETY: per the caller, the slab is alive.
        let mut tags = unsafe { (*slab).tags.load(Ordering::Acquire) };
        if tags == no_tags() {
            // SAFETY: as above.
            tags = unsafe { self.install_tag_array(slab) };
            if tags.is_null() {
                return;
            }
        }
        // SAFETY: as above.
        let base = unsafe { (*slab).base };
        let (index, _) = self.obj_index(obj.as_ptr() as usize - base);
        // SAFETY: `tag` is a charge token (the tag closures return the
        // platform's tokens).
        unsafe { P::alloc_tag_charge_token(tag, obj, self.obj_size) };
        // SAFETY: index < nr_objs (a busy object of the slab), the side
        // array's length; the object and its slot are ours until freed.
        unsafe { tags.add(index).write(Some(tag)) };
    }

    /// The `kmem_tags_<bytes>` cache (an index into `TAG_ARRAY_SIZES`)
    /// holding this cache's side arrays.
    fn tag_array_cache_index(&self) -> usize {
        let bytes = self.nr_objs_per_slab * TAG_REF_BYTES;
        // The largest holds MAX_SMALL_OBJS slots (asserted in allocator.rs).
        TAG_ARRAY_SIZES
            .iter()
            .position(|&size| size >= bytes)
            .unwrap_or(TAG_ARRAY_SIZES.len() - 1)
    }

    /// Give `slab` its side array (Linux `alloc_slab_obj_exts`): allocate
    /// one, zeroed (every object `None`), from the side-array cache and
    /// install it with a compare-exchange; if another CPU installed one
    /// first, free ours and return theirs. Null if none could be
    /// allocated (counted). Runs with no lock held.
    ///
    /// # Safety
    /// `slab` is a live small slab of this cache holding a busy object of
    /// the caller's (so it is not destroyed meanwhile).
    #[cold]
    #[inline(never)]
    #[expect(
        clippy::cast_ptr_alignment,
        reason = "kmem_tags_<bytes> objects are 8-aligned (bootstrap geometry)"
    )]
    pub(crate) unsafe fn install_tag_array(&self, slab: *mut Slab) -> *mut Option<AllocTagRef> {
        let cache = self.owner().tag_array_cache(self.tag_array_cache_index());
        let Ok(new) = cache.slab_alloc_raw() else {
            self.owner()
                .nr_tag_array_misses
                .fetch_add(1, Ordering::Relaxed);
            return ptr::null_mut();
        };
        let new = new.as_ptr().cast::<Option<AllocTagRef>>();
        // SAFETY: a fresh object of at least nr_objs * 4 bytes, 8-aligned,
        // ours; all-zero bytes are `None` in every slot.
        unsafe { ptr::write_bytes(new, 0, self.nr_objs_per_slab) };
        // SAFETY: per the caller, the slab is alive. Release: whoever
        // loads the pointer (Acquire) sees the zeroed slots.
        let installed = unsafe {
            (*slab)
                .tags
                .compare_exchange(no_tags(), new, Ordering::AcqRel, Ordering::Acquire)
        };
        match installed {
            Ok(_) => new,
            Err(winner) => {
                // SAFETY: our fresh object, never published.
                unsafe { cache.slab_free_raw(new.cast()) };
                winner
            }
        }
    }

    /// Free a destroyed slab's side array (nothing for [`no_tags`]).
    ///
    /// # Safety
    /// `tags` is [`no_tags`] or the side array of a slab of this cache
    /// that is being destroyed (no busy object, nobody else uses it).
    pub(crate) unsafe fn free_tag_array(&self, tags: *mut Option<AllocTagRef>) {
        if tags == no_tags() {
            return;
        }
        let cache = self.owner().tag_array_cache(self.tag_array_cache_index());
        // SAFETY: per the caller, an object of that side-array cache
        // (installed by install_tag_array), no longer used.
        unsafe { cache.slab_free_raw(tags.cast()) };
    }

    /// A busy small-slab object's tag reference (tests).
    #[cfg(all(test, not(loom)))]
    pub(crate) fn small_tag_ref(&self, obj: NonNull<u8>) -> Option<AllocTagRef> {
        let addr = obj.as_ptr() as usize;
        let slab = self.small_slab_of(addr);
        // SAFETY: obj is a busy object of one of our small slabs (the
        // caller's promise), its slab alive and its slot ours to read.
        unsafe {
            let tags = (*slab).tags.load(Ordering::Acquire);
            let (index, _) = self.obj_index(addr - (*slab).base);
            tags.add(index).read()
        }
    }

    /// Whether a small slab has a side array (tests).
    #[cfg(all(test, not(loom)))]
    pub(crate) fn has_tag_array(&self, obj: NonNull<u8>) -> bool {
        let slab = self.small_slab_of(obj.as_ptr() as usize);
        // SAFETY: obj is a busy object of one of our small slabs (the
        // caller's promise), its slab alive.
        let tags = unsafe { (*slab).tags.load(Ordering::Acquire) };
        tags != no_tags()
    }

    /// Clear a small-slab object's tag reference and uncharge its tag
    /// (nothing if it has none; a slab without a side array has
    /// [`no_tags`], all `None`). The index is the free's owner check's.
    ///
    /// # Safety
    /// `obj` is object `at.index` of `at.slab`, a small slab of this cache,
    /// and is being freed by the caller.
    #[inline(always)]
    pub(crate) unsafe fn untag_small_object(&self, obj: NonNull<u8>, at: Located) {
        // SAFETY: per the caller, at.slab is alive.
        let tags = unsafe { (*at.slab).tags.load(Ordering::Acquire) };
        // SAFETY: at.index < nr_objs (the owner check), at most the side
        // array's length (NO_TAGS has MAX_SMALL_OBJS slots); nobody else
        // uses the object or its slot now.
        let slot = unsafe { tags.add(at.index) };
        // SAFETY: as above.
        if let Some(token) = unsafe { slot.read() } {
            // SAFETY: as above.
            unsafe { slot.write(None) };
            // SAFETY: every `Some` in a slot is the token this object was
            // charged with (slots are written only by charge_and_store
            // and the profiled alloc, right after the charge), cleared
            // here once.
            unsafe { P::alloc_tag_uncharge(token, obj, self.obj_size) };
        }
    }
}
