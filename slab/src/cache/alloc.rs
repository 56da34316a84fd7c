//! The one allocation, top to bottom (Akaros `kmem_cache_alloc`, SLUB
//! `slab_alloc_node`): [`KmemCache::alloc`], `zalloc`, `alloc_tagged`,
//! kmalloc's size classes and `GlobalAlloc::alloc` all come through
//! [`KmemCache::alloc_at`]:
//!
//! 1. the hit ([`KmemCache::alloc_hit`]): one test of the hot flags
//!    (`HotFlags::ALLOC_SLOW`: no feature on for this cache), then the
//!    magazine hit ([`KmemCache::magazine_alloc_hit`]: pop from this
//!    CPU's `loaded`);
//! 2. else [`KmemCache::alloc_off_hit`], out of line, one load of the
//!    hot flags for its three ways: no feature on, the one slow
//!    function for the miss ([`KmemCache::alloc_slow`]: `prev`, the
//!    depot, the slab layer); the usual words (profiling, kmemtrace
//!    recording) on a magazine hit, the post-alloc hook right there;
//!    anything else [`KmemCache::alloc_hooked_cold`], which calls the
//!    feature hooks (`cache/hooks.rs`) in order around the same magazine
//!    hit and miss: an unborn class, the pre-alloc hook (bootstrap
//!    refusal, KFENCE sample), the post-alloc hook (free key, debug,
//!    profiling, trace table), the kmemtrace event.
//!
//! `GlobalAlloc::alloc` calls the hit and, past it, one out-of-line
//! function of its own that hands the cache it found to `alloc_off_hit`
//! and turns an error into null: every way out of its hit is then a
//! tail call.
//!
//! Every path returns `Result<NonNull<u8>, AllocError>`; only the
//! `GlobalAlloc` edge (`allocator/global_alloc.rs`) turns an error into
//! a null pointer.

use core::ptr::NonNull;
use core::sync::atomic::Ordering;

use super::{HotFlags, KmemCache, double_free};
use crate::alloc_tag::AllocTagRef;
use crate::error::AllocError;
use crate::platform::Platform;

impl<P: Platform> KmemCache<P> {
    /// Allocate one constructed object of `obj_size()` bytes, aligned to
    /// `align()`.
    ///
    /// With feature `alloc-profiling`, the object is charged to the tag
    /// [`PlatformHooks::alloc_tag_current`](crate::PlatformHooks::alloc_tag_current) names (nothing if it says `None`), which
    /// is asked only while profiling is switched on in the allocator
    /// ([`crate::AllocProfiling::set_enabled`]).
    ///
    /// # Errors
    /// [`AllocError::OutOfMemory`] if neither the magazines, the slabs nor
    /// the page source have an object; [`AllocError::ConstructorFailed`] if
    /// the constructor refused (the object went back to its slab);
    /// [`AllocError::InvalidLayout`] for a bootstrap cache.
    #[inline]
    pub fn alloc(&self) -> Result<NonNull<u8>, AllocError> {
        // SAFETY: a reference: a live cache.
        unsafe { Self::alloc_at(self, crate::alloc_tag::current::<P>, 0) }
    }

    /// [`KmemCache::alloc`] with the object's `obj_size()` bytes zeroed
    /// (Linux `kmem_cache_zalloc`; the constructor's work, if any, is
    /// overwritten).
    ///
    /// # Errors
    /// As for [`KmemCache::alloc`].
    pub fn zalloc(&self) -> Result<NonNull<u8>, AllocError> {
        let obj = self.alloc()?;
        // SAFETY: a fresh object of obj_size bytes, ours.
        unsafe { core::ptr::write_bytes(obj.as_ptr(), 0, self.params.obj_size) };
        Ok(obj)
    }

    /// [`KmemCache::alloc`] charging the object to the allocation tag
    /// `tag` (an [`AllocTagRef`](crate::AllocTagRef); `None` charges nothing),
    /// for call sites that name their own tag (`kmem_cache_alloc!`). The
    /// object remembers the tag, so whoever frees it, on whatever CPU,
    /// uncharges the same tag. Without feature `alloc-profiling` the tag
    /// is ignored, and so it is while profiling is switched off in the
    /// allocator.
    ///
    /// # Errors
    /// As for [`KmemCache::alloc`].
    #[inline]
    pub fn alloc_tagged(&self, tag: Option<crate::AllocTagRef>) -> Result<NonNull<u8>, AllocError> {
        // SAFETY: a reference: a live cache.
        unsafe { Self::alloc_at(self, move || crate::alloc_tag::explicit::<P>(tag), 0) }
    }

    /// The allocation: [`Self::alloc_hit`], else [`Self::alloc_off_hit`],
    /// charging the tag `tag()` names (asked only with profiling on).
    /// `bytes_req` is what a kmalloc caller asked for (0: a
    /// `kmem_cache_alloc`), for the debug redzone and kmemtrace.
    ///
    /// # Safety
    /// `this` is a live cache, or the [`unready`] entry.
    #[inline(always)]
    pub(crate) unsafe fn alloc_at(
        this: *const Self,
        tag: impl Fn() -> Option<AllocTagRef>,
        bytes_req: usize,
    ) -> Result<NonNull<u8>, AllocError> {
        // SAFETY: per our caller.
        if let Some(obj) = unsafe { Self::alloc_hit(this) } {
            return Ok(obj);
        }
        // SAFETY: per our caller.
        unsafe { Self::alloc_off_hit(this, tag, bytes_req) }
    }

    /// The hit: one test of the hot flags (no feature on for this cache),
    /// then the magazine hit, the free key cleared. `None` (nothing
    /// changed) otherwise. `this` may be the [`unready`] entry (the
    /// kmalloc by-8 table's before `init`): its hot-flags word has every
    /// bit set, so the flag test fails and nothing else is read. So the
    /// table needs no readiness or null test.
    ///
    /// # Safety
    /// As for [`Self::alloc_at`].
    #[inline(always)]
    pub(crate) unsafe fn alloc_hit(this: *const Self) -> Option<NonNull<u8>> {
        // SAFETY: per our caller, `this` points at a hot-flags word (a
        // cache's first field, or the unready entry's only one).
        let hot_flags = unsafe { &(*this).hot_flags };
        if crate::sync::flags_any::<{ HotFlags::ALLOC_SLOW.bits() }>(hot_flags) {
            return None;
        }
        // SAFETY: no slow flag, so not the unready entry: a live cache.
        unsafe { &*this }.magazine_alloc_hit::<true>()
    }

    /// The allocation past a failed [`Self::alloc_hit`], out of line and
    /// reached by a tail call (the plain hit stays a leaf): with no
    /// feature on for this cache, the miss ([`Self::alloc_slow`]);
    /// else the feature hooks around the same magazine hit and miss.
    ///
    /// The usual words (profiling, kmemtrace recording, or both, on a
    /// keyed small-object cache: no bit of [`HotFlags::ALLOC_HOOKED_RARE`])
    /// on a magazine hit run the hooks right here: a flag test each and
    /// no stack frame. Anything else (a miss, a rare feature, an unborn
    /// class, the unready entry) is one tail call to
    /// [`Self::alloc_hooked_cold`], which runs every hook in order. One
    /// load of the hot flags serves all three ways.
    ///
    /// # Safety
    /// As for [`Self::alloc_at`].
    #[inline(never)]
    pub(crate) unsafe fn alloc_off_hit(
        this: *const Self,
        tag: impl Fn() -> Option<AllocTagRef>,
        bytes_req: usize,
    ) -> Result<NonNull<u8>, AllocError> {
        // SAFETY: per our caller, a hot-flags word first.
        let hot = HotFlags::from_bits_retain(unsafe { &(*this).hot_flags }.load(Ordering::Relaxed));
        if !hot.intersects(HotFlags::ALLOC_SLOW) {
            // SAFETY: no slow flag, so not the unready entry: a live cache.
            return unsafe { &*this }.alloc_slow::<true>();
        }
        if !hot.intersects(HotFlags::ALLOC_HOOKED_RARE)
            // SAFETY: not the unready entry (its word has `UNBORN`): a cache.
            // (keyed: no `KEYLESS`, a rare bit)
            && let Some(obj) = unsafe { &*this }.magazine_alloc_hit::<true>()
        {
            // SAFETY: as above.
            return unsafe { &*this }.post_alloc_hook::<false>(obj, hot, &tag, bytes_req);
        }
        // SAFETY: per our caller; the hit changed nothing.
        unsafe { Self::alloc_hooked_cold(this, tag_ref(&tag), bytes_req) }
    }

    /// [`Self::alloc_off_hit`] with a feature on, for every word and on a
    /// miss: the
    /// pre-alloc hook, the hit or the miss, the post-alloc hooks (or,
    /// for an allocation the pre-alloc hook served or that failed, only
    /// the kmemtrace event).
    ///
    /// # Safety
    /// As for [`Self::alloc_at`].
    #[cold]
    #[inline(never)]
    unsafe fn alloc_hooked_cold(
        this: *const Self,
        tag: &dyn Fn() -> Option<AllocTagRef>,
        bytes_req: usize,
    ) -> Result<NonNull<u8>, AllocError> {
        // SAFETY: per our caller, a hot-flags word first.
        let hot = HotFlags::from_bits_retain(unsafe { &(*this).hot_flags }.load(Ordering::Relaxed));
        if hot.contains(HotFlags::UNBORN) {
            // No cache behind it yet: the unready entry (before `init`)
            // or an unborn size class's stub (its first allocation
            // creates the class and allocates from it:
            // `allocator/classes.rs`).
            if is_unready(this) {
                return Err(AllocError::NotInitialized);
            }
            // SAFETY: per our caller, not the unready entry: a live stub.
            let stub = unsafe { &*this };
            return stub.owner().kmalloc_unborn(stub, tag, bytes_req);
        }
        // SAFETY: not the unready entry (its word has `UNBORN`): a cache.
        let this = unsafe { &*this };
        if hot.intersects(HotFlags::PRE_ALLOC)
            && let Some(served) = this.pre_alloc_hook(hot, tag, bytes_req)
        {
            return this.alloc_event(served, hot, bytes_req);
        }
        let hit = if hot.contains(HotFlags::KEYLESS) {
            // SAFETY: just popped, not handed out.
            this.magazine_alloc_hit::<false>()
                .and_then(|obj| unsafe { this.take_round_hooked(obj) })
        } else {
            this.magazine_alloc_hit::<true>()
        };
        let obj = match hit {
            Some(obj) => obj,
            None => match this.alloc_slow::<false>() {
                Ok(obj) => obj,
                Err(error) => return this.alloc_event(Err(error), hot, bytes_req),
            },
        };
        this.post_alloc_hook::<true>(obj, hot, &tag, bytes_req)
    }

    /// The magazine hit of an allocation: pop a round from this CPU's
    /// `loaded` and count it. `None` (nothing changed) if `loaded` is
    /// empty or absent, or (an interrupt handler) if this CPU's per-CPU
    /// cache is held by the code it interrupted. Not for bootstrap
    /// caches. `KEYED` (a keyed cache): the round's free key is taken
    /// (`double_free::take_key`); a round without it stays (`None`: the
    /// miss reports it).
    #[inline(always)]
    pub(crate) fn magazine_alloc_hit<const KEYED: bool>(&self) -> Option<NonNull<u8>> {
        if crate::restart::enabled::<P>() {
            // SAFETY: this CPU's per-CPU cache, PCPU_OFFSET bytes after
            // the cache; the platform's hits are restartable; KEYED as
            // our caller says.
            return unsafe {
                crate::restart::pop::<Self, KEYED>((self as *const Self).cast(), P::cpu_offset())
            };
        }
        // This CPU's per-CPU cache, held through its in-use flag while
        // `pcpu` lives; `None` if the flag is held (an interrupt handler
        // that interrupted its holder: the slow path leaves the magazines
        // alone). Only caches with a magazine layer get here (the
        // bootstrap ones are refused on their `BOOTSTRAP` paths first).
        debug_assert!(self.has_magazines() && P::cpu_id() <= self.last_cpu);
        // SAFETY: pcpu has nr_cpus slots of CPU_SLOT_BYTES, alive as long
        // as the cache; cpu_offset() is cpu_id() * CPU_SLOT_BYTES with
        // cpu_id() < nr_cpus (the Platform contract): this CPU's slot.
        let mut pcpu = unsafe {
            crate::magazine::PcpuCache::try_lock::<P>(self.pcpu_array(), P::cpu_offset())
        }?;
        let pcc = pcpu.get();
        // The word below `loaded`'s top (kept in the per-CPU cache): the
        // top round, or null for an empty or absent magazine (the
        // header's `next`: see `PcpuInner::top`).
        let top = pcc.top;
        // SAFETY: `top` is at or above slot 0 of `loaded` (or of the
        // absent magazine), owned by this CPU under its flag: the word
        // below it is in the magazine's object.
        let obj = NonNull::new(unsafe { *top.sub(1) })?;
        // SAFETY: a round of ours, keyed as our caller says.
        if KEYED && !unsafe { double_free::take_key(obj, pcc.free_key) } {
            return None;
        }
        crate::sync::interrupt_point::<P>();
        pcc.nr_allocs += 1;
        // SAFETY: a round was below `top`, so slot 0 is at or below it.
        pcc.top = unsafe { top.sub(1) };
        Some(obj)
    }

    /// The one slow function of the allocation: the magazine miss
    /// (`prev`, the depot), then the slab layer (constructed). Not
    /// marked, not traced. `KEYED` (the plain allocation of a keyed
    /// cache): the free key cleared; else the caller's post-alloc hook
    /// clears it or the mark.
    #[cold]
    #[inline(never)]
    pub(crate) fn alloc_slow<const KEYED: bool>(&self) -> Result<NonNull<u8>, AllocError> {
        // KFENCE: the sample interval is checked on the miss.
        self.owner().kfence_tick();
        let obj = match self.magazine_alloc_miss() {
            Some(obj) => obj,
            None => self.slab_alloc_constructed()?,
        };
        if KEYED {
            // SAFETY: just taken; a keyed cache.
            unsafe { double_free::clear_key(obj) };
        }
        Ok(obj)
    }
}

/// The kmalloc by-8 table's entry before `init` (`Kmem::new` fills
/// the table with it, [`unready`]): a hot-flags word with every bit set,
/// so an allocation through it leaves the hit at its one flag test and
/// [`KmemCache::alloc_hooked_cold`] refuses it by its address. Not a cache:
/// read only as that word.
#[repr(C, align(64))]
pub(crate) struct Unready {
    hot_flags: core::sync::atomic::AtomicU32,
}

/// The one [`Unready`] entry.
static UNREADY_ENTRY: Unready = Unready {
    hot_flags: core::sync::atomic::AtomicU32::new(u32::MAX),
};

/// [`UNREADY_ENTRY`] as a table entry (never dereferenced as a cache:
/// [`KmemCache::alloc_at`]).
pub(crate) const fn unready<P: Platform>() -> *mut KmemCache<P> {
    (&raw const UNREADY_ENTRY).cast_mut().cast()
}

/// Whether a table entry is [`unready`]'s (by address: nothing is read).
#[inline(always)]
pub(super) fn is_unready<P: Platform>(entry: *const KmemCache<P>) -> bool {
    core::ptr::eq(entry, unready::<P>())
}

/// `tag` as the `&dyn Fn` the cold paths take, without a stack slot when
/// its type has no bytes (`alloc_tag::current`, every untagged call): a
/// reference to a zero-sized value at its type's dangling address, so
/// `alloc_off_hit` needs no stack frame for it (measured in the kernel,
/// frame pointers on: push, mov, sub, add, pop on every profiled alloc).
#[inline(always)]
fn tag_ref<F: Fn() -> Option<AllocTagRef>>(tag: &F) -> &(dyn Fn() -> Option<AllocTagRef> + '_) {
    if core::mem::size_of::<F>() == 0 {
        // SAFETY: a zero-sized `F`: every aligned non-null address holds
        // its one value, and `tag` (borrowed for the same lifetime) is a
        // value of it.
        unsafe { &*NonNull::<F>::dangling().as_ptr() }
    } else {
        tag
    }
}
