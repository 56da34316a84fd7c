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
//! - **small-object slabs**: an array of one `Option<AllocTagRef>` per
//!   object after the last object of the slab (`objs_per_slab` is computed
//!   with `stride + 4` per object). An object's index is the high word of
//!   `offset * ceil(2^64 / stride)`, the multiply that also checks frees;
//! - **bufctl slabs**: a `u32` in the object's bufctl (it fits in padding:
//!   no extra bytes; 0 is `None`);
//! - **page-granular kmalloc**: the upper 32 bits of the first page's
//!   page-map entry (no extra bytes; 0 is `None`).
//!
//! `None` means "no tag" (allocated while profiling was off): its free
//! uncharges nothing, so no counter underflows. A free object's reference
//! is always `None` (frees clear it), so an object allocated while
//! profiling is off needs no store at all.
//!
//! The runtime switch: [`Allocator::set_alloc_profiling`](crate::Allocator::set_alloc_profiling)
//! sets or clears `PROFILING` in every cache's `hot_flags` (new caches
//! inherit it); a kernel calls it whenever its own switch flips. Setting
//! it also sets `TAGGED` (in the same atomic update) on caches with tag
//! arrays, so the profiled alloc tests no flag; clearing it leaves
//! `TAGGED` (objects may still carry references). Set, the alloc goes to
//! the out-of-line profiled path, which asks `alloc_tag_current()` after
//! the magazine hit; clear, no tag is asked for (explicit tags are ignored
//! too) and the object gets no reference.
//!
//! Costs (callgrind, 64-byte `GlobalAlloc` pair on the host bench, see
//! docs/BENCHMARKS.md): compiled out, nothing (no code, no bytes).
//! Compiled in but off: nothing per alloc (the bit is in the word the hit
//! tests anyway); per free, `TAGGED` is one more bit of the one
//! `FREE_SLOW` mask test, and a cache that has been profiled sends its
//! frees one tail call away. On: a tail call to the profiled path,
//! `alloc_tag_current()` (a per-CPU load), a multiply, a 4-byte store and
//! `alloc_tag_add` per alloc; a tail call with the index in a register, a
//! load, a store and `alloc_tag_sub` per free. Bootstrap (metadata) caches
//! have no reference arrays.

#[cfg(feature = "alloc-profiling")]
use core::ptr::NonNull;

use crate::cache::HotFlags;
#[cfg(feature = "alloc-profiling")]
use crate::cache::KmemCache;
#[cfg(feature = "alloc-profiling")]
use crate::pagemap::TAG_MASK;
#[cfg(feature = "alloc-profiling")]
use crate::path::Located;
#[cfg(feature = "alloc-profiling")]
use crate::platform::PAGE_SIZE;
use crate::platform::Platform;

/// A reference from an object to its allocation tag (in `magpie-codetag`:
/// the tag's index in its section plus one; the same type). Never 0: "no
/// tag" is `None`, and an `Option<AllocTagRef>` is 4 bytes, 0 for `None`
/// (what a free object's slot holds).
pub type AllocTagRef = core::num::NonZeroU32;

/// Bytes of tag reference per object of a small slab.
pub(crate) const TAG_REF_BYTES: usize = if cfg!(feature = "alloc-profiling") {
    core::mem::size_of::<Option<AllocTagRef>>()
} else {
    0
};

const _: () = assert!(core::mem::size_of::<Option<AllocTagRef>>() == 4);

/// The tag to charge an allocation made now (`None` when profiling is
/// compiled out or the platform says none).
#[inline(always)]
#[cfg_attr(
    not(feature = "alloc-profiling"),
    allow(
        clippy::extra_unused_type_parameters,
        reason = "P is used with the feature"
    )
)]
pub(crate) fn current<P: Platform>() -> Option<AllocTagRef> {
    #[cfg(feature = "alloc-profiling")]
    {
        P::alloc_tag_current()
    }
    #[cfg(not(feature = "alloc-profiling"))]
    {
        None
    }
}

impl<P: Platform> crate::cache::KmemCache<P> {
    /// Switch allocation profiling on or off in this cache's hot flags.
    /// On also sets `TAGGED` (in the same atomic update) on a cache with
    /// tag arrays, so the profiled alloc needs no flag test; off leaves
    /// `TAGGED` (objects may still carry references).
    pub(crate) fn set_profiling(&self, on: bool) {
        #[cfg(feature = "alloc-profiling")]
        if on && self.tag_array_offset != 0 && !self.hot().contains(HotFlags::BUFCTL) {
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
    /// The tag-reference slot of object `index` of the small slab that
    /// starts at `base`.
    #[inline(always)]
    fn tag_slot_at(&self, base: usize, index: usize) -> *mut Option<AllocTagRef> {
        debug_assert!(self.tag_array_offset != 0);
        (base + self.tag_array_offset + index * TAG_REF_BYTES) as *mut Option<AllocTagRef>
    }

    /// The tag-reference slot of a small-slab object: one multiply for its
    /// index. A one-page slab starts at the object's page (its offset is
    /// the address's low bits); a longer one is found through the page
    /// map.
    #[inline(always)]
    fn tag_slot(&self, obj: NonNull<u8>) -> *mut Option<AllocTagRef> {
        let addr = obj.as_ptr() as usize;
        let (base, offset) = if self.nr_pages_per_slab == 1 {
            (addr & !(PAGE_SIZE - 1), addr & (PAGE_SIZE - 1))
        } else {
            // Slabs of several pages are packed ones, on the primary
            // source: the page map names the slab (no `on_primary` test).
            debug_assert!(self.on_primary);
            let slab = (self.page_map.get(addr) & !TAG_MASK) as *const crate::slab::Slab;
            // SAFETY: a busy object of ours on the primary source: its
            // pages map to its slab, which is alive.
            let base = unsafe { (*slab).base };
            (base, addr - base)
        };
        let (index, _) = self.obj_index(offset);
        self.tag_slot_at(base, index)
    }

    /// Store `tag` with a small-slab object just allocated, setting
    /// `TAGGED` first if the cache does not have it yet (the out-of-line
    /// paths: explicit tags, debug caches).
    #[inline(always)]
    pub(crate) fn tag_small_object(&self, obj: NonNull<u8>, tag: AllocTagRef, hot: HotFlags) {
        if !hot.contains(HotFlags::TAGGED) {
            // Before the store: whoever frees the object sees the flag.
            self.set_hot(HotFlags::TAGGED);
        }
        // SAFETY: obj is a busy object of one of our small slabs, so its
        // slot lies in the slab page's tag array (tag_array_offset is set
        // for every small cache callers allocate from); the object is ours
        // until freed, and so is its slot.
        unsafe { self.tag_slot(obj).write(Some(tag)) };
    }

    /// The profiled hit's store: `tag` with a small-slab object just
    /// allocated, then the charge. `TAGGED` is set with `PROFILING`
    /// ([`KmemCache::set_profiling`]), so there is no flag to test.
    #[inline(always)]
    pub(crate) fn charge_small_object(&self, obj: NonNull<u8>, tag: AllocTagRef) {
        debug_assert!(self.hot().contains(HotFlags::TAGGED));
        // SAFETY: as in tag_small_object.
        unsafe { self.tag_slot(obj).write(Some(tag)) };
        P::alloc_tag_add(tag, obj, self.obj_size);
    }

    /// A busy small-slab object's tag reference (tests).
    #[cfg(all(test, not(loom)))]
    pub(crate) fn small_tag_ref(&self, obj: NonNull<u8>) -> Option<AllocTagRef> {
        // SAFETY: as in tag_small_object: obj is a busy object of one of
        // our small slabs (the caller's promise), its slot ours to read.
        unsafe { self.tag_slot(obj).read() }
    }

    /// Clear a small-slab object's tag reference and uncharge its tag
    /// (nothing if it has none). The index is the free's owner check's.
    ///
    /// # Safety
    /// `obj` is object `at.index` of `at.slab`, a small slab of this cache,
    /// and is being freed by the caller.
    #[inline(always)]
    pub(crate) unsafe fn untag_small_object(&self, obj: NonNull<u8>, at: Located) {
        // SAFETY: per the caller, at.slab is alive.
        let slot = self.tag_slot_at(unsafe { (*at.slab).base }, at.index);
        // SAFETY: per the caller, the slot is the object's, in its slab
        // page's tag array; nobody else uses the object or its slot now.
        if let Some(tag) = unsafe { slot.read() } {
            // SAFETY: as above.
            unsafe { slot.write(None) };
            P::alloc_tag_sub(tag, obj, self.obj_size);
        }
    }
}
