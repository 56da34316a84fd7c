//! The slab layer (Bonwick 1994): pages carved into objects.
//!
//! - **Small-object slabs** (cache not `NOTOUCH`; on the primary source
//!   objects up to 8 KiB, elsewhere up to `PAGE_SIZE / 8`): one or more
//!   pages (see [`crate::geometry`]); the [`Slab`] header sits at the
//!   *end* of the slab or, on the primary source, in a `kmem_slab` object
//!   when that wastes less; objects start at offset 0 (so power-of-two
//!   sizes are naturally aligned), and the free list is threaded through
//!   the free objects.
//! - **Bufctl slabs** (larger objects, or `NOTOUCH`): several pages; the
//!   [`Slab`] struct comes from the `kmem_slab` bootstrap cache and one
//!   [`Bufctl`] per object from `kmem_bufctl`. The object memory is never
//!   touched. A per-cache [`AddrHash`](crate::layout::hash::AddrHash) maps a busy
//!   buffer's address to its bufctl.
//!
//! Slabs sit on one of three lists by how many objects are busy: empty,
//! partial, full. Allocation takes from the head of the partial list,
//! kept roughly fullest first: a slab that was full and loses an object
//! goes to the head, a partial slab that loses one to the tail (illumos
//! keeps an AVL tree by busy count; this is its O(1) approximation), so
//! the least used slabs drain and become empty; `reap` returns empty
//! slabs to the page source.
//!
//! [`SlabLists`] is the state behind the cache's slab lock (the lists, the
//! bufctl hash, the counters) and its methods run under it; [`SlabLayer`]
//! holds that lock and does everything else: growing and releasing a slab
//! call the page source and the bootstrap caches and therefore run with no
//! lock held. `KmemCache`'s `slab_*` methods (end of this file) call it.

use core::ptr;
#[cfg(feature = "alloc-profiling")]
use core::sync::atomic::AtomicPtr;

use crate::alloc_tag::AllocTagRef;
use crate::layout::freelist::{BadLink, FreeList, FreeMap, map_clear, map_test};
use crate::layout::geometry::{
    BUFCTL_BYTES, MAX_SMALL_OBJS, SLAB_HEADER_BYTES, SMALL_HEADER_OFFSET, SlabKind,
};
use crate::layout::hash::{AddrHash, HashNode};
use crate::platform::PAGE_SIZE;
use crate::reports::error::ErrorKind;

mod layer;

pub(crate) use layer::{Metadata, SlabLayer, SlabOwner, SlabParams};

/// Header of a small-object slab (at the end of its page) and struct of a
/// bufctl slab (from `kmem_slab`).
///
/// Counts are narrow so that the header keeps 128 bytes with the tag side
/// array's pointer: a slab holds at most [`u16::MAX`] objects and spans
/// at most [`u32::MAX`] pages (every geometry holds at most 512 objects,
/// `MAX_SMALL_OBJS`, and 1 GiB objects span 2^18 pages; `grow` asserts).
#[repr(C)]
pub(crate) struct Slab {
    /// [`SLAB_MAGIC`] while the slab is alive.
    pub(crate) magic: u32,
    pub(crate) nr_pages: u32,
    pub(crate) nr_busy: u16,
    pub(crate) nr_objs: u16,
    /// Which list it is on.
    pub(crate) list: SlabList,
    /// Small slabs in bitmap mode (from when the slab is made until it is
    /// first full, [`crate::layout::freelist`]): its free objects, all
    /// free in `free_map` only, none threaded (`free` null), taken at
    /// random. 0: list mode (the free objects are on the linked list).
    pub(crate) nr_fresh: u16,
    /// The owning `KmemCache<P>`, type-erased.
    pub(crate) cache: *const (),
    prev: *mut Slab,
    pub(crate) next: *mut Slab,
    /// Address of object 0 (the first page of the slab).
    pub(crate) base: usize,
    /// Small: first free object (each free object holds the next
    /// pointer, hardened: [`crate::freelist`]; null in bitmap mode, see
    /// `nr_fresh`). Bufctl: first free `Bufctl`.
    pub(crate) free: *mut u8,
    /// Small slabs of a cache with tag references (feature
    /// `alloc-profiling`): the tag side array, one `Option<AllocTagRef>`
    /// per object (`nr_objs * 4` bytes, from a `kmem_tags_<bytes>`
    /// bootstrap cache), installed on the slab's first tagged allocation
    /// (Linux `alloc_slab_obj_exts`) and freed with the slab; until then
    /// the shared all-`None` `NO_TAGS` (every object untagged). See
    /// [`crate::alloc_tag`].
    #[cfg(feature = "alloc-profiling")]
    pub(crate) tags: AtomicPtr<Option<AllocTagRef>>,
    #[cfg(not(feature = "alloc-profiling"))]
    _no_tags: usize,
    /// Small slabs: bit i set while object i is on the free list (the
    /// free list's cross-check, and what catches a double free reaching
    /// the slab layer).
    pub(crate) free_map: FreeMap,
}

pub(crate) const SLAB_MAGIC: u32 = 0x51ab_ca5e;

const _: () = {
    // The geometry's figures (layout/geometry.rs).
    assert!(core::mem::size_of::<Slab>() == SLAB_HEADER_BYTES);
    // The tag reference rides in the bufctl's padding.
    assert!(core::mem::size_of::<Bufctl>() == BUFCTL_BYTES);
    assert!(core::mem::align_of::<Slab>() <= 8);
    assert!(SMALL_HEADER_OFFSET.is_multiple_of(core::mem::align_of::<Slab>()));
    // The free map covers every object of a small slab (stride >= 8).
    assert!(SMALL_HEADER_OFFSET / 8 <= 8 * 64);
    // Every slab's object count fits the header's u16.
    assert!(MAX_SMALL_OBJS <= u16::MAX as usize);
};

/// The slab lists, by how many of a slab's objects are busy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum SlabList {
    /// No object busy: `reap` gives these back.
    Empty = 0,
    /// Some objects busy, some free: allocations come from these first.
    Partial = 1,
    /// Every object busy.
    Full = 2,
}

/// Where a bufctl's object is. The slab layer changes it at the boundary
/// with the magazine layer (`Free` ↔ `Cached`); an object charged to an
/// allocation tag is also marked on its way to a caller (`Cached` ↔
/// `Allocated`, out of line). Double frees of bufctl objects are caught
/// at the slab layer (not in the hash) and, anywhere, by the debug state
/// word of a debug cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum BufctlState {
    /// In its slab's free list.
    Free = 0,
    /// Out of the slab layer (in the hash): in a magazine, or with a caller.
    Cached = 1,
    /// With a caller, charged to an allocation tag.
    #[cfg_attr(
        not(feature = "alloc-profiling"),
        allow(dead_code, reason = "objects are charged to tags with the feature")
    )]
    Allocated = 2,
    /// In a magazine, in a cache whose objects hold no free key (`NOTOUCH`,
    /// or constructed objects of bufctl slabs): a free of it is a double
    /// free (`cache/double_free.rs`).
    Magazine = 3,
}

/// One per object of a bufctl slab.
#[repr(C)]
pub(crate) struct Bufctl {
    pub(crate) hash_next: *mut Bufctl,
    pub(crate) free_next: *mut Bufctl,
    pub(crate) addr: usize,
    slab: *mut Slab,
    pub(crate) state: BufctlState,
    /// Charge token of the allocation tag of the object while a caller
    /// holds it (`AllocTagHooks::token`; feature `alloc-profiling`;
    /// in padding, so no extra bytes).
    #[cfg(feature = "alloc-profiling")]
    pub(crate) tag: Option<AllocTagRef>,
}

impl HashNode for Bufctl {
    fn key(&self) -> usize {
        self.addr
    }
    fn hash_next(&mut self) -> &mut *mut Self {
        &mut self.hash_next
    }
}

/// `SlabLists::mark_cached` found no busy bufctl at the address.
#[derive(Debug)]
pub(crate) struct NotBusy;

/// One of the three slab lists (doubly linked through the slabs).
pub(crate) struct SlabListHead {
    pub(crate) head: *mut Slab,
    tail: *mut Slab,
    pub(crate) nr: usize,
}

/// The state behind a cache's slab lock: the three slab lists and the
/// bufctl hash. Changed only through its own methods, under the lock.
pub(crate) struct SlabLists {
    pub(crate) lists: [SlabListHead; 3],
    /// Bufctl caches: buffer address → bufctl of every busy buffer.
    pub(crate) hash: AddrHash<Bufctl>,
    /// Objects taken from / put back to slabs ever (all reasons).
    pub(crate) nr_allocs: u64,
    pub(crate) nr_frees: u64,
}

// SAFETY: the raw pointers are owned by the cache and only touched under
// the mutex around the SlabLists.
unsafe impl Send for SlabLists {}

/// Counts of the slab layer, read under the lock.
pub(crate) struct SlabCounts {
    pub(crate) nr_slabs: usize,
    pub(crate) nr_active_slabs: usize,
    pub(crate) nr_busy_objs: usize,
    pub(crate) nr_pages: usize,
}

impl SlabLists {
    pub(crate) const fn new() -> Self {
        SlabLists {
            lists: [
                SlabListHead {
                    head: ptr::null_mut(),
                    tail: ptr::null_mut(),
                    nr: 0,
                },
                SlabListHead {
                    head: ptr::null_mut(),
                    tail: ptr::null_mut(),
                    nr: 0,
                },
                SlabListHead {
                    head: ptr::null_mut(),
                    tail: ptr::null_mut(),
                    nr: 0,
                },
            ],
            hash: AddrHash::new(),
            nr_allocs: 0,
            nr_frees: 0,
        }
    }

    pub(crate) fn counts(&self) -> SlabCounts {
        let mut counts = SlabCounts {
            nr_slabs: 0,
            nr_active_slabs: 0,
            nr_busy_objs: 0,
            nr_pages: 0,
        };
        for (list_index, list) in self.lists.iter().enumerate() {
            counts.nr_slabs += list.nr;
            if list_index != SlabList::Empty as usize {
                counts.nr_active_slabs += list.nr;
            }
            let mut slab = list.head;
            while !slab.is_null() {
                // SAFETY: slabs on our lists are alive (owned by this layer).
                unsafe {
                    counts.nr_busy_objs += (*slab).nr_busy as usize;
                    counts.nr_pages += (*slab).nr_pages as usize;
                    slab = (*slab).next;
                }
            }
        }
        counts
    }

    /// # Safety
    /// `slab` is alive and on list `(*slab).list`.
    unsafe fn unlink(&mut self, slab: *mut Slab) {
        // SAFETY: the caller guarantees the slab is alive and listed.
        unsafe {
            let list = &mut self.lists[(*slab).list as usize];
            if (*slab).prev.is_null() {
                list.head = (*slab).next;
            } else {
                (*(*slab).prev).next = (*slab).next;
            }
            if (*slab).next.is_null() {
                list.tail = (*slab).prev;
            } else {
                (*(*slab).next).prev = (*slab).prev;
            }
            (*slab).prev = ptr::null_mut();
            (*slab).next = ptr::null_mut();
            list.nr -= 1;
        }
    }

    /// # Safety
    /// `slab` is alive and on no list.
    unsafe fn push(&mut self, slab: *mut Slab, list_index: SlabList) {
        let list = &mut self.lists[list_index as usize];
        // SAFETY: the caller guarantees the slab is alive and unlisted.
        unsafe {
            (*slab).list = list_index;
            (*slab).prev = ptr::null_mut();
            (*slab).next = list.head;
            if list.head.is_null() {
                list.tail = slab;
            } else {
                (*list.head).prev = slab;
            }
        }
        list.head = slab;
        list.nr += 1;
    }

    /// # Safety
    /// `slab` is alive and on no list.
    unsafe fn push_tail(&mut self, slab: *mut Slab, list_index: SlabList) {
        let list = &mut self.lists[list_index as usize];
        // SAFETY: the caller guarantees the slab is alive and unlisted.
        unsafe {
            (*slab).list = list_index;
            (*slab).next = ptr::null_mut();
            (*slab).prev = list.tail;
            if list.tail.is_null() {
                list.head = slab;
            } else {
                (*list.tail).next = slab;
            }
        }
        list.tail = slab;
        list.nr += 1;
    }

    /// Put a slab whose busy count changed on the right list: a partial
    /// slab that lost an object (`freed`) to the tail of the partial list,
    /// any other newly partial slab to the head.
    ///
    /// # Safety
    /// `slab` is alive and listed.
    unsafe fn relist(&mut self, slab: *mut Slab, freed: bool) {
        // SAFETY: the caller guarantees the slab is alive.
        let (nr_busy, nr_objs, list) = unsafe { ((*slab).nr_busy, (*slab).nr_objs, (*slab).list) };
        let want = if nr_busy == 0 {
            SlabList::Empty
        } else if nr_busy == nr_objs {
            SlabList::Full
        } else {
            SlabList::Partial
        };
        if want == SlabList::Partial && list == SlabList::Partial && freed {
            if self.lists[SlabList::Partial as usize].tail != slab {
                // SAFETY: alive and listed, per the caller.
                unsafe {
                    self.unlink(slab);
                    self.push_tail(slab, want);
                }
            }
        } else if want != list {
            // SAFETY: alive and listed, per the caller.
            unsafe {
                self.unlink(slab);
                self.push(slab, want);
            }
        }
    }

    /// Take up to `out.len()` objects (at least one) from one partial or
    /// empty slab, if there is one, into `out`; returns how many: at
    /// random in bitmap mode, else from the head of its free list. A small slab's free-list link that fails its check (an
    /// overwrite of a free object) is returned in `bad` (with its slab)
    /// and the free list is rebuilt from the slab's bitmap: every object
    /// handed out is a free object of the slab. A fresh object found
    /// without its free key (written while free) is reported the same way
    /// and kept busy for good.
    #[expect(
        clippy::cast_ptr_alignment,
        reason = "a Bufctl slab's free list links kmem_bufctl objects, aligned for Bufctl"
    )]
    pub(crate) fn take_objects(
        &mut self,
        kind: SlabKind,
        list_of: impl Fn(usize) -> FreeList,
        bad: &mut Option<(*mut Slab, BadLink)>,
        out: &mut [*mut u8],
    ) -> usize {
        debug_assert!(!out.is_empty());
        loop {
            let mut slab = self.lists[SlabList::Partial as usize].head;
            if slab.is_null() {
                slab = self.lists[SlabList::Empty as usize].head;
            }
            if slab.is_null() {
                return 0;
            }
            // SAFETY: listed slabs are alive; a partial or empty slab has
            // at least one free object: a fresh one, or `free` is a free
            // object/bufctl.
            unsafe {
                debug_assert!(
                    (*slab).nr_busy < (*slab).nr_objs
                        && (!(*slab).free.is_null() || (*slab).nr_fresh > 0)
                );
                let nr = match kind {
                    SlabKind::Small => Self::take_small(slab, list_of((*slab).base), bad, out),
                    SlabKind::Bufctl => {
                        let mut nr = 0;
                        while nr < out.len() && !(*slab).free.is_null() {
                            let bufctl = (*slab).free.cast::<Bufctl>();
                            (*slab).free = (*bufctl).free_next.cast();
                            (*bufctl).free_next = ptr::null_mut();
                            (*bufctl).state = BufctlState::Cached;
                            self.hash.insert(bufctl);
                            out[nr] = (*bufctl).addr as *mut u8;
                            nr += 1;
                        }
                        (*slab).nr_busy += nr as u16;
                        nr
                    }
                };
                self.nr_allocs += nr as u64;
                self.relist(slab, false);
                if nr > 0 {
                    return nr;
                }
            }
        }
    }

    /// [`Self::take_objects`] from one small slab (its busy count raised
    /// by every object taken or kept busy); 0 if a corruption left it
    /// with none (then full).
    ///
    /// # Safety
    /// `slab` is a live listed small slab with a free object, `list` its
    /// free list; under the lock.
    unsafe fn take_small(
        slab: *mut Slab,
        list: FreeList,
        bad: &mut Option<(*mut Slab, BadLink)>,
        out: &mut [*mut u8],
    ) -> usize {
        // SAFETY: per our caller.
        unsafe {
            let map = &(*slab).free_map;
            let mut nr = 0;
            // Bitmap mode: each object the first free one at or after a
            // random index; counted in locals (the objects' words read
            // below may alias nothing of the header, but the compiler
            // cannot know).
            let nr_fresh = usize::from((*slab).nr_fresh);
            if nr_fresh > 0 {
                let nr_taken = nr_fresh.min(out.len());
                let mut random = crate::layout::freelist::shuffle_seed() | 1;
                // Every slot of `out[..nr_taken]` gets its object (one
                // store, no bounds test an object); an object that lost
                // its key leaves a null there, squeezed out below (rare).
                let mut nr_lost = 0;
                for slot in &mut out[..nr_taken] {
                    let index = list.take_random(map, &mut random);
                    let obj = list.base + index * list.stride;
                    *slot = obj as *mut u8;
                    if list.lost_key(obj) {
                        // Written while free: busy for good.
                        bad.get_or_insert((
                            slab,
                            BadLink {
                                obj,
                                decoded: (obj as *const usize).read(),
                            },
                        ));
                        *slot = core::ptr::null_mut();
                        nr_lost += 1;
                    }
                }
                nr = nr_taken;
                if nr_lost > 0 {
                    nr = 0;
                    for i in 0..nr_taken {
                        if !out[i].is_null() {
                            out[nr] = out[i];
                            nr += 1;
                        }
                    }
                }
                // At 0 the slab is full: list mode from here on.
                (*slab).nr_fresh = (nr_fresh - nr_taken) as u16;
                (*slab).nr_busy += (nr + nr_lost) as u16;
                return nr;
            }
            while nr < out.len() && (*slab).nr_busy < (*slab).nr_objs {
                let mut head = (*slab).free as usize;
                if head == 0 {
                    break;
                }
                let obj = match list.pop(&mut head, map) {
                    Ok(obj) => obj,
                    Err(link) => {
                        bad.get_or_insert((slab, link));
                        // Without its key it was written after its
                        // free, maybe through a copy handed out
                        // (`cache/double_free.rs`): kept busy for
                        // good, never relinked or handed out.
                        if list.lost_key(link.obj)
                            && let Some(index) = list.index_of(link.obj)
                        {
                            map_clear(map, index);
                            (*slab).nr_busy += 1;
                        }
                        (*slab).free = list.rebuild(map) as *mut u8;
                        continue;
                    }
                };
                (*slab).free = head as *mut u8;
                (*slab).nr_busy += 1;
                out[nr] = obj as *mut u8;
                nr += 1;
            }
            if (*slab).free.is_null() && (*slab).nr_fresh == 0 {
                // No free object left (a corruption may have taken the
                // last ones: the bitmap then has none either): full.
                (*slab).nr_busy = (*slab).nr_objs;
            }
            nr
        }
    }

    /// Return one object to its slab. Refused, with nothing changed, if
    /// the object is not busy in the slab layer (a double free that
    /// reached it: on the free list already, or not in the bufctl hash)
    /// or not an object start: the busy count can never drop for an object
    /// that was not busy, so `reap` never frees a page holding one.
    ///
    /// # Safety
    /// Small: `slab` is the live slab whose page holds `obj`, of this
    /// layer's cache, whose free list `list` describes. Bufctl: `slab` is
    /// ignored.
    unsafe fn put_object(
        &mut self,
        kind: SlabKind,
        obj: *mut u8,
        slab: *mut Slab,
        list: FreeList,
    ) -> Result<(), ErrorKind> {
        // SAFETY: per the caller, the slab (or the bufctl found in the
        // hash) is alive and listed.
        unsafe {
            let slab = match kind {
                SlabKind::Small => {
                    let Some(index) = list.index_of(obj as usize) else {
                        return Err(ErrorKind::InvalidFree);
                    };
                    let map = &(*slab).free_map;
                    if map_test(map, index) {
                        return Err(ErrorKind::DuplicateFree);
                    }
                    if (*slab).nr_fresh > 0 {
                        // Bitmap mode: not threaded.
                        list.put_unthreaded(map, obj as usize, index);
                        (*slab).nr_fresh += 1;
                    } else {
                        let mut head = (*slab).free as usize;
                        list.push(&mut head, map, obj as usize, index);
                        (*slab).free = head as *mut u8;
                    }
                    slab
                }
                SlabKind::Bufctl => {
                    let bufctl = self.hash.remove(obj as usize);
                    if bufctl.is_null() {
                        return Err(ErrorKind::DuplicateFree);
                    }
                    let slab = (*bufctl).slab;
                    (*bufctl).state = BufctlState::Free;
                    (*bufctl).free_next = (*slab).free.cast();
                    (*slab).free = bufctl.cast();
                    slab
                }
            };
            debug_assert!((*slab).nr_busy > 0);
            (*slab).nr_busy -= 1;
            self.nr_frees += 1;
            self.relist(slab, true);
        }
        Ok(())
    }

    /// A busy bufctl object leaves for a caller charged to a tag: state
    /// `Allocated` (what an `AUDIT` free checks) and its charge token
    /// (`AllocTagHooks::token`'s) stored. Returns false, changing
    /// nothing, if `addr` is not busy in this layer.
    #[cfg(feature = "alloc-profiling")]
    pub(crate) fn mark_allocated(&mut self, addr: usize, token: Option<AllocTagRef>) -> bool {
        let bufctl = self.hash.find(addr);
        if bufctl.is_null() {
            return false;
        }
        // SAFETY: bufctls in the hash are alive; the caller holds the lock.
        unsafe {
            (*bufctl).state = BufctlState::Allocated;
            (*bufctl).tag = token;
        }
        true
    }

    /// A busy bufctl object comes back from a caller: state `Cached`, its
    /// charge token taken (`None`: none, or profiling compiled out).
    /// `Err`, changing nothing, if `addr` is not busy in this layer.
    pub(crate) fn mark_cached(&mut self, addr: usize) -> Result<Option<AllocTagRef>, NotBusy> {
        let bufctl = self.hash.find(addr);
        // SAFETY: bufctls in the hash are alive; the caller holds the lock.
        if bufctl.is_null() || unsafe { (*bufctl).state } == BufctlState::Magazine {
            return Err(NotBusy);
        }
        // SAFETY: bufctls in the hash are alive; the caller holds the lock.
        unsafe { (*bufctl).state = BufctlState::Cached };
        #[cfg(feature = "alloc-profiling")]
        // SAFETY: as above.
        let tag = unsafe { (*bufctl).tag.take() };
        #[cfg(not(feature = "alloc-profiling"))]
        let tag = None;
        Ok(tag)
    }

    /// Whether busy bufctl object `addr` rests in a magazine (state
    /// `Magazine`, in a cache whose objects hold no free key), after
    /// setting that to `into_magazine` if given (it enters a magazine, or
    /// leaves one for a caller). `Err`, changing nothing, if `addr` is not
    /// busy in this layer.
    pub(crate) fn mark_magazine(
        &mut self,
        addr: usize,
        into_magazine: Option<bool>,
    ) -> Result<bool, NotBusy> {
        let bufctl = self.hash.find(addr);
        if bufctl.is_null() {
            return Err(NotBusy);
        }
        // SAFETY: bufctls in the hash are alive; the caller holds the lock.
        unsafe {
            let was = (*bufctl).state == BufctlState::Magazine;
            match into_magazine {
                Some(true) => (*bufctl).state = BufctlState::Magazine,
                Some(false) if was => (*bufctl).state = BufctlState::Cached,
                _ => {}
            }
            Ok(was)
        }
    }

    /// Call `f` with every slab on the lists and whether it is on the list
    /// its busy count says.
    pub(crate) fn for_each_listed_slab(&self, mut f: impl FnMut(*mut Slab, bool)) {
        for (list_index, list) in self.lists.iter().enumerate() {
            let mut slab = list.head;
            while !slab.is_null() {
                // SAFETY: slabs on our lists are alive (owned by this layer).
                unsafe {
                    let (nr_busy, nr_objs) = ((*slab).nr_busy, (*slab).nr_objs);
                    let want = if nr_busy == 0 {
                        SlabList::Empty
                    } else if nr_busy >= nr_objs {
                        SlabList::Full
                    } else {
                        SlabList::Partial
                    };
                    let next = (*slab).next;
                    f(slab, want as usize == list_index && (*slab).list == want);
                    slab = next;
                }
            }
        }
    }

    /// Call `f` with every slab on the lists.
    pub(crate) fn for_each_slab(&self, mut f: impl FnMut(*mut Slab)) {
        self.for_each_listed_slab(|slab, _| f(slab));
    }

    /// Detach every empty slab (for reap), linked through `next`.
    fn take_empty(&mut self) -> *mut Slab {
        let list = &mut self.lists[SlabList::Empty as usize];
        let head = list.head;
        list.head = ptr::null_mut();
        list.tail = ptr::null_mut();
        list.nr = 0;
        head
    }

    /// Detach every slab of every list (for teardown after a failed init).
    fn take_all(&mut self) -> *mut Slab {
        let mut all: *mut Slab = ptr::null_mut();
        for list in &mut self.lists {
            let mut slab = list.head;
            while !slab.is_null() {
                // SAFETY: listed slabs are alive.
                unsafe {
                    let next = (*slab).next;
                    (*slab).next = all;
                    all = slab;
                    slab = next;
                }
            }
            list.head = ptr::null_mut();
            list.tail = ptr::null_mut();
            list.nr = 0;
        }
        all
    }
}

/// Small-slab header of the page holding `addr`.
#[inline]
pub(crate) fn small_header(addr: usize) -> *mut Slab {
    ((addr & !(PAGE_SIZE - 1)) + SMALL_HEADER_OFFSET) as *mut Slab
}

/// Object 0 of a small slab (0 for null: bufctl caches, unused there).
pub(super) fn slab_base(slab: *mut Slab) -> usize {
    if slab.is_null() {
        0
    } else {
        // SAFETY: a live slab of ours (callers' contract).
        unsafe { (*slab).base }
    }
}
