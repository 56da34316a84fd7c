//! Allocation profiling in a cache (feature `alloc-profiling`; the
//! switch is [`KmemCache::set_profiling`]): the tag reference of a small-slab object
//! in its slab's side array (see [`crate::alloc_tag`]).

use core::ptr;
use core::ptr::NonNull;
use core::sync::atomic::Ordering;

use super::{HotFlags, KmemCache};
use crate::alloc_tag::{AllocTagRef, no_tags};
use crate::layout::geometry::SlabKind;
use crate::platform::{PAGE_SIZE, Platform};
use crate::slab::{Metadata, Slab, SlabLayer, SlabOwner, small_header};

impl<P: Platform> KmemCache<P> {
    /// The post-alloc hook of profiling (`PROFILING` on, `tag` the
    /// charge token `tag()` gave), its common case: the tag charged and
    /// its token stored in the object's slot of its small slab's side
    /// array. The slab header: for a one-page slab with its header at its
    /// end (`TAGS_IN_PAGE` in `hot`), at the end of the object's page (one
    /// mask; the offset is the address's low bits); for any other through
    /// the page map (slabs of several pages, and off-slab headers, are
    /// packed ones, on the primary source). False (nothing done)
    /// otherwise: the caller then calls [`Self::profiling_alloc_cold`] (a
    /// bufctl cache, the platform's charge hook on, a slab with no side
    /// array yet). `RARE` as for [`Self::post_alloc_hook`].
    #[inline(always)]
    pub(super) fn profiling_alloc_hook<const RARE: bool>(
        &self,
        obj: NonNull<u8>,
        hot: HotFlags,
        tag: AllocTagRef,
    ) -> bool {
        if RARE && hot.intersects(HotFlags::BUFCTL | HotFlags::TAG_HOOKS) {
            return false;
        }
        debug_assert!(self.hot().contains(HotFlags::TAGGED));
        let addr = obj.as_ptr() as usize;
        let (tags, offset) = if hot.contains(HotFlags::TAGS_IN_PAGE) {
            let page = addr & !(PAGE_SIZE - 1);
            let slab = small_header(page);
            // SAFETY: obj is a busy object of one of our small slabs (just
            // taken for the caller): its slab is alive.
            (unsafe { (*slab).tags.load(Ordering::Acquire) }, addr - page)
        } else {
            let slab = self.small_slab_of(addr);
            // SAFETY: as above.
            unsafe { ((*slab).tags.load(Ordering::Acquire), addr - (*slab).base) }
        };
        if tags == no_tags() {
            return false;
        }
        let (index, _) = self.obj_index(offset);
        // SAFETY: `tag` is a charge token (the tag closures return the
        // platform's tokens: alloc_tag::current, explicit).
        unsafe { P::charge(tag, obj, self.params.obj_size) };
        // SAFETY: index < nr_objs (a busy object of the slab), the side
        // array's length; the object is ours until freed, and so is its
        // slot.
        unsafe { tags.add(index).write(Some(tag)) };
        true
    }

    /// [`Self::profiling_alloc_hook`] off its common case, then the rest
    /// of the post-alloc hook (the kmemtrace event): the tag charged
    /// (with the platform's charge hook) and its token stored in the
    /// object's bufctl (state `Allocated`, `BUFCTL_TAGGED` set first), or
    /// in its small slab's side array (`TAGGED` set first; the array
    /// installed first if the slab has none; nothing charged if none can
    /// be allocated). Before the store, a flag whoever frees the object
    /// sees.
    #[cold]
    #[inline(never)]
    pub(super) fn profiling_alloc_cold(
        &self,
        obj: NonNull<u8>,
        hot: HotFlags,
        tag: AllocTagRef,
        bytes_req: usize,
    ) -> NonNull<u8> {
        if self.kind == SlabKind::Bufctl {
            // SAFETY: `tag` is a charge token (the tag closures return the
            // platform's tokens: alloc_tag::current, explicit).
            unsafe { crate::alloc_tag::charge_off_hit::<P>(tag, obj, self.params.obj_size) };
            if !hot.contains(HotFlags::BUFCTL_TAGGED) {
                self.set_hot(HotFlags::BUFCTL_TAGGED);
            }
            let busy = self
                .slab
                .lock()
                .mark_allocated(obj.as_ptr() as usize, Some(tag));
            debug_assert!(busy);
        } else {
            if !hot.contains(HotFlags::TAGGED) {
                self.set_hot(HotFlags::TAGGED);
            }
            let slab = self.small_slab_of(obj.as_ptr() as usize);
            // SAFETY: obj is a busy object of one of our small slabs, alive.
            unsafe { self.charge_and_store(obj, slab, tag) };
        }
        self.alloc_event(obj, hot, bytes_req)
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
        let arrays = self.metadata(Metadata::tag_array(&self.params));
        let Ok(new) = SlabLayer::alloc(arrays) else {
            self.owner().count_tag_array_miss();
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
                unsafe { SlabLayer::free_objects(arrays, &[new.cast()]) };
                winner
            }
        }
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
    /// The free hook of profiling (`TAGGED` on a small-slab cache); with
    /// `TAG_HOOKS` in `hot` the platform's uncharge hook
    /// ([`AllocTagHooks::on_uncharge`](crate::AllocTagHooks::on_uncharge)) is called too.
    ///
    /// # Safety
    /// `obj` is object `index` of `slab`, a small slab of this cache,
    /// and is being freed by the caller.
    #[inline(always)]
    pub(super) unsafe fn profiling_free_hook(
        &self,
        obj: NonNull<u8>,
        slab: *mut Slab,
        index: usize,
        hot: HotFlags,
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
                if hot.contains(HotFlags::TAG_HOOKS) {
                    crate::alloc_tag::uncharge_off_hit::<P>(token, obj, self.params.obj_size);
                } else {
                    P::uncharge(token, obj, self.params.obj_size);
                }
            }
        }
    }
}
