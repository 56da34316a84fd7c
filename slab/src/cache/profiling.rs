//! Allocation profiling in a cache (feature `alloc-profiling`; the
//! switch is [`KmemCache::set_profiling`]): the tag reference of a small-slab object
//! in its slab's side array (see [`crate::alloc_tag`]).

use core::ptr;
use core::ptr::NonNull;
use core::sync::atomic::Ordering;

use super::{HotFlags, KmemCache};
use crate::alloc_tag::{AllocTagRef, TAG_REF_BYTES, no_tags};
use crate::allocator::TAG_ARRAY_SIZES;
use crate::platform::{PAGE_SIZE, Platform};
use crate::slab::{Slab, small_header};

impl<P: Platform> KmemCache<P> {
    /// The profiled alloc's side-array slot of `obj`, or `None` if its
    /// slab has no side array yet. The slab header: for a one-page slab
    /// with its header at its end, at the end of the object's page (one
    /// mask; the offset is the address's low bits); for any other through
    /// the page map (slabs of several pages, and off-slab headers, are
    /// packed ones, on the primary source: no `on_primary` test). `TAGGED`
    /// is set with `PROFILING` ([`KmemCache::set_profiling`]), so there
    /// is no flag to test. `IN_PAGE`: the caller knows the header is at
    /// the end of the object's page (its hot word has `TAGS_IN_PAGE`), so
    /// the header's place is not tested.
    ///
    /// # Safety
    /// `obj` is a busy object of one of this cache's small slabs.
    #[inline(always)]
    pub(crate) unsafe fn alloc_tag_slot<const IN_PAGE: bool>(
        &self,
        obj: NonNull<u8>,
    ) -> Option<*mut Option<AllocTagRef>> {
        debug_assert!(self.hot().contains(HotFlags::TAGGED));
        debug_assert!(!IN_PAGE || self.tag_header_in_page);
        let addr = obj.as_ptr() as usize;
        let (tags, offset) = if IN_PAGE || self.tag_header_in_page {
            let page = addr & !(PAGE_SIZE - 1);
            let slab = small_header(page);
            // SAFETY: per the caller, the slab is alive.
            (unsafe { (*slab).tags.load(Ordering::Acquire) }, addr - page)
        } else {
            debug_assert!(self.on_primary);
            let slab = self.params.page_map.get(addr).slab_unchecked() as *mut Slab;
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
    pub(crate) fn charge_first_in_slab<O: crate::cache::AllocOut>(
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
        unsafe { crate::alloc_tag::charge_off_hit::<P>(tag, obj, self.params.obj_size) };
        // SAFETY: index < nr_objs (a busy object of the slab), the side
        // array's length; the object and its slot are ours until freed.
        unsafe { tags.add(index).write(Some(tag)) };
    }

    /// The `kmem_tags_<bytes>` cache (an index into `TAG_ARRAY_SIZES`)
    /// holding this cache's side arrays.
    fn tag_array_cache_index(&self) -> usize {
        let bytes = self.params.nr_objs_per_slab * TAG_REF_BYTES;
        // The largest holds MAX_SMALL_OBJS slots (asserted in allocator/mod.rs).
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
        unsafe { ptr::write_bytes(new, 0, self.params.nr_objs_per_slab) };
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
    /// `HIT`: the profiled free hit, which calls no
    /// [`PlatformHooks::alloc_tag_uncharge_hook`](crate::PlatformHooks::alloc_tag_uncharge_hook) (it is off while the hooks
    /// are on).
    ///
    /// # Safety
    /// `obj` is object `index` of `slab`, a small slab of this cache,
    /// and is being freed by the caller.
    #[inline(always)]
    pub(crate) unsafe fn untag_small_object<const HIT: bool>(
        &self,
        obj: NonNull<u8>,
        slab: *mut Slab,
        index: usize,
    ) {
        // SAFETY: per the caller, slab is alive.
        let tags = unsafe { (*slab).tags.load(Ordering::Acquire) };
        // SAFETY: index < nr_objs (the owner check), at most the side
        // array's length (NO_TAGS has MAX_SMALL_OBJS slots); nobody else
        // uses the object or its slot now.
        let slot = unsafe { tags.add(index) };
        // SAFETY: as above.
        if let Some(token) = unsafe { slot.read() } {
            // SAFETY: as above.
            unsafe { slot.write(None) };
            // SAFETY: every `Some` in a slot is the token this object was
            // charged with (slots are written only by charge_and_store
            // and the profiled alloc, right after the charge), cleared
            // here once.
            unsafe {
                if HIT {
                    P::alloc_tag_uncharge(token, obj, self.params.obj_size);
                } else {
                    crate::alloc_tag::uncharge_off_hit::<P>(token, obj, self.params.obj_size);
                }
            }
        }
    }
}
