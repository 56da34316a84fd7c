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

use core::ptr::{self, NonNull};
#[cfg(feature = "alloc-profiling")]
use core::sync::atomic::AtomicPtr;
use core::sync::atomic::AtomicU64;
#[cfg(feature = "alloc-profiling")]
use core::sync::atomic::Ordering;

use crate::alloc_tag::AllocTagRef;
use crate::constructor::Ctor;
use crate::constructor::Dtor;
use crate::constructor::{ObjectInit, ObjectRef};
use crate::error::AllocError;
use crate::layout::freelist::{BadLink, FreeList, FreeMap, map_test};
use crate::layout::geometry::{
    BUFCTL_BYTES, MAX_SMALL_OBJS, SLAB_HEADER_BYTES, SMALL_HEADER_OFFSET, SlabKind,
};
use crate::layout::hash::{AddrHash, HashNode, rescale_locked};
use crate::layout::pagemap::PageEntry;
use crate::layout::pagemap::PageMap;
use crate::platform::PageSource;
use crate::platform::{PAGE_SIZE, Platform};
use crate::report::{ErrorKind, ErrorReport};
use crate::sync::{Mutex, MutexGuard};

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
    list: SlabList,
    /// The owning `KmemCache<P>`, type-erased.
    pub(crate) cache: *const (),
    prev: *mut Slab,
    next: *mut Slab,
    /// Address of object 0 (the first page of the slab).
    pub(crate) base: usize,
    /// Small: first free object (each free object holds the next
    /// pointer, hardened: [`crate::freelist`]). Bufctl: first free `Bufctl`.
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
#[repr(u32)]
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
}

/// One per object of a bufctl slab.
#[repr(C)]
pub(crate) struct Bufctl {
    hash_next: *mut Bufctl,
    free_next: *mut Bufctl,
    pub(crate) addr: usize,
    slab: *mut Slab,
    pub(crate) state: BufctlState,
    /// Charge token of the allocation tag of the object while a caller
    /// holds it (`Platform::alloc_tag_token`; feature `alloc-profiling`;
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
struct SlabListHead {
    head: *mut Slab,
    tail: *mut Slab,
    nr: usize,
}

/// The state behind a cache's slab lock: the three slab lists and the
/// bufctl hash. Changed only through its own methods, under the lock.
pub(crate) struct SlabLists {
    lists: [SlabListHead; 3],
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

    /// Take one object from a partial or empty slab, if there is one. A
    /// small slab's free-list link that fails its check (an overwrite of a
    /// free object) is returned in `bad` (with its slab) and the free list
    /// is rebuilt from the slab's bitmap: the object handed out is always
    /// a free object of the slab.
    #[expect(
        clippy::cast_ptr_alignment,
        reason = "a Bufctl slab's free list links kmem_bufctl objects, aligned for Bufctl"
    )]
    fn take_object(
        &mut self,
        kind: SlabKind,
        list_of: impl Fn(usize) -> FreeList,
        bad: &mut Option<(*mut Slab, BadLink)>,
    ) -> Option<NonNull<u8>> {
        loop {
            let mut slab = self.lists[SlabList::Partial as usize].head;
            if slab.is_null() {
                slab = self.lists[SlabList::Empty as usize].head;
            }
            if slab.is_null() {
                return None;
            }
            // SAFETY: listed slabs are alive; a partial or empty slab has
            // at least one free object, so `free` is a free object/bufctl.
            unsafe {
                debug_assert!((*slab).nr_busy < (*slab).nr_objs && !(*slab).free.is_null());
                let obj = match kind {
                    SlabKind::Small => {
                        let list = list_of((*slab).base);
                        let map = &(*slab).free_map;
                        let mut head = (*slab).free as usize;
                        let obj = match list.pop(&mut head, map) {
                            Ok(obj) => obj,
                            Err(link) => {
                                bad.get_or_insert((slab, link));
                                head = list.rebuild(map);
                                if head == 0 {
                                    // The bitmap has no free object left
                                    // (the header itself was overwritten):
                                    // the slab is full from now on.
                                    (*slab).free = ptr::null_mut();
                                    (*slab).nr_busy = (*slab).nr_objs;
                                    self.relist(slab, false);
                                    continue;
                                }
                                // Fresh links: this pop cannot fail.
                                let Ok(obj) = list.pop(&mut head, map) else {
                                    continue;
                                };
                                obj
                            }
                        };
                        (*slab).free = head as *mut u8;
                        obj as *mut u8
                    }
                    SlabKind::Bufctl => {
                        let bufctl = (*slab).free.cast::<Bufctl>();
                        (*slab).free = (*bufctl).free_next.cast();
                        (*bufctl).free_next = ptr::null_mut();
                        (*bufctl).state = BufctlState::Cached;
                        self.hash.insert(bufctl);
                        (*bufctl).addr as *mut u8
                    }
                };
                (*slab).nr_busy += 1;
                self.nr_allocs += 1;
                self.relist(slab, false);
                return NonNull::new(obj);
            }
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
                    let mut head = (*slab).free as usize;
                    list.push(&mut head, map, obj as usize, index);
                    (*slab).free = head as *mut u8;
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
    /// (`Platform::alloc_tag_token`'s) stored. Returns false, changing
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
        if bufctl.is_null() {
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
fn slab_base(slab: *mut Slab) -> usize {
    if slab.is_null() {
        0
    } else {
        // SAFETY: a live slab of ours (callers' contract).
        unsafe { (*slab).base }
    }
}

/// The slab layer's parameters: the cache's geometry, its page source,
/// constructor and destructor, fixed at creation. The slab layer owns
/// them; the fields the magazine hits read are also kept at the head of
/// the cache (`KmemCache`), where the hits find them in one cache line.
pub(crate) struct SlabParams {
    pub(crate) kind: SlabKind,
    pub(crate) stride: usize,
    pub(crate) obj_size: usize,
    pub(crate) nr_objs_per_slab: usize,
    pub(crate) nr_pages_per_slab: usize,
    /// Small slabs: the header is a `kmem_slab` object, not the slab's
    /// last bytes.
    pub(crate) header_off_slab: bool,
    /// On the primary source: slabs are registered in `page_map`.
    pub(crate) on_primary: bool,
    pub(crate) page_map: PageMap,
    pub(crate) source: &'static dyn PageSource,
    pub(crate) ctor: Option<Ctor>,
    pub(crate) dtor: Option<Dtor>,
    /// Where a free object holds its free-list link: 0, or in the debug
    /// trailer (so the poison stays whole).
    pub(crate) freeptr_offset: usize,
    /// The free-list obfuscation secret ([`crate::layout::freelist`]).
    pub(crate) freelist_secret: usize,
    /// A debug cache: objects are initialised and checked through
    /// [`SlabOwner::debug_init_object`] and
    /// [`SlabOwner::debug_verify_free_object`].
    pub(crate) debug: bool,
}

impl SlabParams {
    /// The hardened free list of the small slab whose object 0 is at
    /// `base`.
    pub(crate) fn free_list(&self, base: usize) -> FreeList {
        FreeList {
            base,
            stride: self.stride,
            nr_objs: self.nr_objs_per_slab,
            link_offset: self.freeptr_offset,
            secret: self.freelist_secret,
        }
    }

    /// The header of the small slab holding `addr` (an object of a live
    /// slab): through the page map on the primary source (the header may
    /// be off slab or at the end of a later page), at the end of the page
    /// otherwise (one-page slabs there).
    #[inline]
    pub(crate) fn small_slab_of(&self, addr: usize) -> *mut Slab {
        if self.on_primary {
            self.page_map.get(addr).slab_unchecked() as *mut Slab
        } else {
            small_header(addr)
        }
    }
}

/// Metadata the slab layer takes from the bootstrap caches.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Metadata {
    /// A `kmem_slab` object (a [`Slab`] struct off its slab).
    Slab,
    /// A `kmem_bufctl` object (a [`Bufctl`]).
    Bufctl,
}

/// What the slab layer needs from the cache it serves, beside its
/// [`SlabParams`]: its identity, the error sink, the bootstrap caches and
/// the debug hooks. The cache implements it (`cache/slab_layer.rs`), so
/// this layer never names the cache. Every call is made with no slab lock
/// held.
pub(crate) trait SlabOwner {
    /// The platform (the clock of the `time-stats` points).
    type Platform: Platform;
    /// The cache's identity, stored in every slab ([`Slab::cache`]).
    fn id(&self) -> *const ();
    /// The cache's name, for reports.
    fn name(&self) -> &str;
    /// The error sink: a report of something this layer refused or
    /// repaired.
    fn report(&self, report: ErrorReport);
    /// A page source ran dry: reap every cache. True if the reap ran (then
    /// the allocation is retried once).
    fn reap_for_pressure(&self) -> bool;
    /// A metadata object.
    ///
    /// # Errors
    /// [`AllocError::OutOfMemory`].
    fn alloc_metadata(&self, which: Metadata) -> Result<NonNull<u8>, AllocError>;
    /// Give a metadata object back.
    ///
    /// # Safety
    /// `obj` came from [`SlabOwner::alloc_metadata`] with `which` and is
    /// no longer used.
    unsafe fn free_metadata(&self, which: Metadata, obj: *mut u8);
    /// Where the bufctl hash's tables come from.
    fn metadata_source(&self) -> &'static dyn PageSource;
    /// A debug cache: initialise the trailer of the fresh object at
    /// `addr` (state free, poison, redzone).
    ///
    /// # Safety
    /// `addr` is an object of a fresh slab of this cache, ours alone.
    unsafe fn debug_init_object(&self, addr: usize);
    /// A debug cache: check the free object at `addr` of `slab` before
    /// the slab's pages go back (a write after free is reported then).
    ///
    /// # Safety
    /// `addr` is an object of `slab`, a detached empty slab of this cache.
    unsafe fn debug_verify_free_object(&self, addr: usize, slab: *mut Slab) -> Option<ErrorReport>;
    /// Free a slab's tag side array (`alloc-profiling`).
    ///
    /// # Safety
    /// `tags` is the side array of a slab being destroyed, with no busy
    /// object (or the shared empty one).
    #[cfg(feature = "alloc-profiling")]
    unsafe fn free_tag_array(&self, tags: *mut Option<AllocTagRef>);
}

/// A cache's slab layer: its parameters, its slab lists behind a spin
/// lock, and every operation on its slabs: growing (pages from the
/// source, carved into objects), taking and returning objects (bufctl
/// state changes with them), reaping empty slabs, and the bufctl hash's
/// table. What it needs of the cache comes through `owner` ([`SlabOwner`]).
pub(crate) struct SlabLayer {
    lists: Mutex<SlabLists>,
    pub(crate) params: SlabParams,
}

impl SlabLayer {
    pub(crate) fn new(params: SlabParams) -> Self {
        SlabLayer {
            lists: Mutex::new(SlabLists::new()),
            params,
        }
    }

    /// Lock the slab lists.
    #[inline]
    pub(crate) fn lock(&self) -> MutexGuard<'_, SlabLists> {
        self.lists.lock()
    }

    /// Allocate one object from the slab layer, growing it if needed. The
    /// object is not constructed and not counted; bufctl objects come back
    /// `BufctlState::Cached`. A corrupted free list met on the way is
    /// reported (after the lock is dropped) and repaired.
    pub(crate) fn alloc_raw<O: SlabOwner>(&self, owner: &O) -> Result<NonNull<u8>, AllocError> {
        let mut bad = None;
        let taken = self.lock().take_object(
            self.params.kind,
            |base| self.params.free_list(base),
            &mut bad,
        );
        self.report_bad_link(owner, bad);
        if let Some(obj) = taken {
            return Ok(obj);
        }
        // Grow with no lock held: the page source and the bootstrap caches
        // may be called from here.
        let slab = match self.grow(owner) {
            Ok(slab) => slab,
            // Out of memory even after the reap (see `grow_timed`); but the
            // reap may have drained our own magazines into our slabs.
            Err(error) => {
                let taken = self.lock().take_object(
                    self.params.kind,
                    |base| self.params.free_list(base),
                    &mut bad,
                );
                self.report_bad_link(owner, bad);
                return taken.ok_or(error);
            }
        };
        let mut layer = self.lock();
        // SAFETY: `grow` returned a fresh, unlisted, alive slab.
        unsafe { layer.push(slab, SlabList::Empty) };
        let obj = layer.take_object(
            self.params.kind,
            |base| self.params.free_list(base),
            &mut bad,
        );
        drop(layer);
        self.report_bad_link(owner, bad);
        self.maybe_grow_hash(owner);
        obj.ok_or(AllocError::OutOfMemory)
    }

    /// Report a free-list link that failed its check (`take_object`).
    fn report_bad_link<O: SlabOwner>(&self, owner: &O, bad: Option<(*mut Slab, BadLink)>) {
        let Some((slab, link)) = bad else {
            return;
        };
        let mut report = ErrorReport::new(ErrorKind::FreeListCorrupted, owner.name(), link.obj);
        report.object = link.obj;
        report.slab = slab as usize;
        report.corruption = Some(crate::debug::Mismatch {
            offset: self.params.freeptr_offset,
            expected: 0,
            found: link.decoded as u64,
        });
        owner.report(report);
    }

    /// Allocate one constructed object from the slab layer for a caller
    /// (the magazine layer missed; the cache counts it).
    pub(crate) fn alloc_constructed<O: SlabOwner>(
        &self,
        owner: &O,
    ) -> Result<NonNull<u8>, AllocError> {
        let obj = self.alloc_raw(owner)?;
        if let Some(ctor) = self.params.ctor
            // SAFETY: a fresh object of our slab layer: obj_size bytes,
            // 8-aligned (every stride is a multiple of 8 and slabs start on
            // a page), nobody else's until we return it.
            && ctor(unsafe { ObjectInit::new(obj, self.params.obj_size) }).is_err()
        {
            // SAFETY: obj came from our slab layer just now, unconstructed.
            unsafe { self.free_raw(owner, obj.as_ptr()) };
            return Err(AllocError::ConstructorFailed);
        }
        Ok(obj)
    }

    /// The slab a busy object of this cache's slab layer was checked
    /// against: the header for a small slab (null for bufctl slabs: the
    /// hash decides).
    fn slab_of(&self, obj: *mut u8) -> *mut Slab {
        match self.params.kind {
            SlabKind::Small => self.params.small_slab_of(obj as usize),
            SlabKind::Bufctl => ptr::null_mut(),
        }
    }

    /// Return one object to the slab layer without running the destructor.
    /// An object that is not busy there is refused and reported.
    ///
    /// # Safety
    /// `obj` is an object of this cache's slab layer (small: in one of its
    /// live slabs), not in any magazine, not with a caller.
    pub(crate) unsafe fn free_raw<O: SlabOwner>(&self, owner: &O, obj: *mut u8) {
        let slab = self.slab_of(obj);
        let list = self.params.free_list(slab_base(slab));
        // SAFETY: per the caller.
        let refused = unsafe { self.lock().put_object(self.params.kind, obj, slab, list) };
        if let Err(kind) = refused {
            self.report_refusal(owner, kind, obj, slab);
        }
    }

    /// Destruct `objs` and return them to the slab layer under one lock
    /// acquisition (dropped only to report a refused object: a double
    /// free that reached the slab layer).
    ///
    /// # Safety
    /// Every pointer is an object start of a live slab of this cache (small
    /// slabs) or was handed out by it (bufctl slabs), constructed, in no
    /// magazine and with no caller.
    pub(crate) unsafe fn free_objects<O: SlabOwner>(&self, owner: &O, objs: &[*mut u8]) {
        if let Some(dtor) = self.params.dtor {
            let constructed = self.params.ctor.is_some();
            for &obj in objs {
                if let Some(obj) = NonNull::new(obj) {
                    // SAFETY: per the caller, an object of ours (8-aligned)
                    // with nobody else; constructed, so initialised, if the
                    // cache has a constructor (callers give objects back
                    // constructed: `Ctor`).
                    dtor(unsafe { ObjectRef::new(obj, self.params.obj_size, constructed) });
                }
            }
        }
        let mut layer = self.lock();
        for &obj in objs {
            let slab = self.slab_of(obj);
            let list = self.params.free_list(slab_base(slab));
            // SAFETY: per the caller.
            if let Err(kind) = unsafe { layer.put_object(self.params.kind, obj, slab, list) } {
                drop(layer);
                self.report_refusal(owner, kind, obj, slab);
                layer = self.lock();
            }
        }
    }

    /// Report an object the slab layer refused (`put_object`).
    fn report_refusal<O: SlabOwner>(
        &self,
        owner: &O,
        kind: ErrorKind,
        obj: *mut u8,
        slab: *mut Slab,
    ) {
        let addr = obj as usize;
        let mut report = ErrorReport::new(kind, owner.name(), addr);
        report.slab = slab as usize;
        if kind == ErrorKind::DuplicateFree {
            report.object = addr;
        }
        owner.report(report);
    }

    /// Make a new slab: pages from the source, carved into objects, and
    /// registered in the page map. Runs with no lock held.
    fn grow<O: SlabOwner>(&self, owner: &O) -> Result<*mut Slab, AllocError> {
        let start = time_stats_start!(O::Platform);
        let grown = self.grow_timed(owner);
        time_stats_end!(O::Platform, start);
        grown
    }

    #[expect(
        clippy::cast_ptr_alignment,
        reason = "kmem_slab objects are aligned for Slab (boot cache geometry)"
    )]
    fn grow_timed<O: SlabOwner>(&self, owner: &O) -> Result<*mut Slab, AllocError> {
        let nr_pages = self.params.nr_pages_per_slab;
        let pages = match self.params.source.alloc_pages(nr_pages) {
            Ok(pages) => pages,
            // Out of memory: reap every cache (every CPU's magazines, the
            // depots, empty slabs) and try once more.
            Err(_) if owner.reap_for_pressure() => self.params.source.alloc_pages(nr_pages)?,
            Err(error) => return Err(error),
        };
        let base = pages.as_ptr() as usize;
        let slab = match self.params.kind {
            SlabKind::Small if !self.params.header_off_slab => {
                (base + nr_pages * PAGE_SIZE - core::mem::size_of::<Slab>()) as *mut Slab
            }
            SlabKind::Small | SlabKind::Bufctl => {
                match owner.alloc_metadata(Metadata::Slab) {
                    Ok(slab) => slab.as_ptr().cast::<Slab>(),
                    Err(error) => {
                        // SAFETY: the pages came from this source just now.
                        unsafe { self.params.source.free_pages(pages, nr_pages) };
                        return Err(error);
                    }
                }
            }
        };
        // The geometry keeps both counts in range (`Geometry::new`).
        debug_assert!(
            self.params.nr_objs_per_slab <= u16::MAX as usize && nr_pages <= u32::MAX as usize
        );
        // SAFETY: `slab` is either the header area at the end of our fresh
        // slab or a fresh kmem_slab object, both writable and ours.
        unsafe {
            slab.write(Slab {
                magic: SLAB_MAGIC,
                nr_pages: nr_pages as u32,
                nr_busy: 0,
                nr_objs: self.params.nr_objs_per_slab as u16,
                list: SlabList::Empty,
                cache: owner.id(),
                prev: ptr::null_mut(),
                next: ptr::null_mut(),
                base,
                free: ptr::null_mut(),
                // No tagged object yet: no side array.
                #[cfg(feature = "alloc-profiling")]
                tags: AtomicPtr::new(crate::alloc_tag::no_tags()),
                #[cfg(not(feature = "alloc-profiling"))]
                _no_tags: 0,
                free_map: [const { AtomicU64::new(0) }; 8],
            });
        }
        if self.params.debug {
            for index in 0..self.params.nr_objs_per_slab {
                // SAFETY: object `index` of our fresh slab (its stride
                // holds the debug slot), ours alone.
                unsafe { owner.debug_init_object(base + index * self.params.stride) };
            }
        }
        let carved = match self.params.kind {
            SlabKind::Small => {
                let list = self.params.free_list(base);
                let mut free = 0;
                // SAFETY: slab initialised above, ours alone.
                let map = unsafe { &(*slab).free_map };
                for index in (0..self.params.nr_objs_per_slab).rev() {
                    // SAFETY: object `index` lies inside our page below the
                    // header; its link word is 8-aligned inside its stride.
                    unsafe { list.push(&mut free, map, base + index * self.params.stride, index) };
                }
                // SAFETY: slab initialised above.
                unsafe { (*slab).free = free as *mut u8 };
                Ok(())
            }
            SlabKind::Bufctl => self.carve_bufctls(owner, slab),
        };
        if let Err(error) = carved {
            // SAFETY: the slab was never listed or registered.
            unsafe { self.destroy_slab(owner, slab, false) };
            return Err(error);
        }
        if self.params.on_primary {
            let registered = self
                .params
                .page_map
                .set_range(base, nr_pages, |_| PageEntry::slab_page(slab as usize));
            if !registered {
                // A page source outside its own span is broken; refuse its
                // memory rather than hand out pages kfree cannot find.
                // SAFETY: never listed or registered.
                unsafe { self.destroy_slab(owner, slab, false) };
                return Err(AllocError::OutOfMemory);
            }
        }
        Ok(slab)
    }

    /// One bufctl per object, from `kmem_bufctl`.
    #[expect(
        clippy::cast_ptr_alignment,
        reason = "kmem_bufctl objects are aligned for Bufctl (boot cache geometry)"
    )]
    fn carve_bufctls<O: SlabOwner>(&self, owner: &O, slab: *mut Slab) -> Result<(), AllocError> {
        // SAFETY: slab initialised by grow.
        let base = unsafe { (*slab).base };
        for index in (0..self.params.nr_objs_per_slab).rev() {
            let bufctl = owner
                .alloc_metadata(Metadata::Bufctl)?
                .as_ptr()
                .cast::<Bufctl>();
            // SAFETY: fresh kmem_bufctl object, ours to write; slab alive.
            unsafe {
                bufctl.write(Bufctl {
                    hash_next: ptr::null_mut(),
                    free_next: (*slab).free.cast(),
                    addr: base + index * self.params.stride,
                    slab,
                    state: BufctlState::Free,
                    #[cfg(feature = "alloc-profiling")]
                    tag: None,
                });
                (*slab).free = bufctl.cast();
            }
        }
        Ok(())
    }

    /// Free a slab that is on no list and has no busy objects: clear its
    /// page-map entries, free its bufctls and struct, return its pages.
    ///
    /// # Safety
    /// `slab` is an alive slab of this cache, unlisted, with no busy
    /// objects; `registered` says whether its pages are in the page map.
    #[expect(
        clippy::cast_ptr_alignment,
        reason = "a Bufctl slab's free list links kmem_bufctl objects, aligned for Bufctl"
    )]
    unsafe fn destroy_slab<O: SlabOwner>(&self, owner: &O, slab: *mut Slab, registered: bool) {
        // SAFETY: per the caller, the slab is alive and ours alone.
        unsafe {
            debug_assert_eq!((*slab).nr_busy, 0);
            let base = (*slab).base;
            let nr_pages = (*slab).nr_pages as usize;
            if registered {
                self.params.page_map.clear_range(base, nr_pages);
            }
            (*slab).magic = 0;
            // No busy object, so nobody installs a side array meanwhile.
            #[cfg(feature = "alloc-profiling")]
            owner.free_tag_array((*slab).tags.load(Ordering::Acquire));
            if self.params.kind == SlabKind::Small && self.params.header_off_slab {
                owner.free_metadata(Metadata::Slab, slab.cast());
            }
            if self.params.kind == SlabKind::Bufctl {
                let mut bufctl = (*slab).free.cast::<Bufctl>();
                while !bufctl.is_null() {
                    let next = (*bufctl).free_next;
                    owner.free_metadata(Metadata::Bufctl, bufctl.cast());
                    bufctl = next;
                }
                owner.free_metadata(Metadata::Slab, slab.cast());
            }
            if let Some(pages) = NonNull::new(base as *mut u8) {
                self.params.source.free_pages(pages, nr_pages);
            }
        }
    }

    /// Return every empty slab to the page source. Returns pages freed.
    pub(crate) fn reap<O: SlabOwner>(&self, owner: &O) -> usize {
        let mut slab = self.lock().take_empty();
        let mut nr_pages = 0;
        while !slab.is_null() {
            // SAFETY: detached empty slabs are alive, unlisted and have no
            // busy objects; they are registered if we are on the primary.
            unsafe {
                let next = (*slab).next;
                nr_pages += (*slab).nr_pages as usize;
                self.verify_before_destroy(owner, slab);
                self.destroy_slab(owner, slab, self.params.on_primary);
                slab = next;
            }
        }
        nr_pages
    }

    /// A debug cache checks every object of a slab it gives back (all of
    /// them free), so a write after free into one is reported before the
    /// evidence goes with the page.
    ///
    /// # Safety
    /// `slab` is a detached empty slab of this cache, alive.
    unsafe fn verify_before_destroy<O: SlabOwner>(&self, owner: &O, slab: *mut Slab) {
        if !self.params.debug {
            return;
        }
        // SAFETY: per the caller.
        let base = unsafe { (*slab).base };
        for index in 0..self.params.nr_objs_per_slab {
            // SAFETY: an object of a detached slab of ours: nobody else
            // touches it.
            let found =
                unsafe { owner.debug_verify_free_object(base + index * self.params.stride, slab) };
            if let Some(report) = found {
                owner.report(report);
            }
        }
    }

    /// Drop every slab's pages without looking at their objects or
    /// freeing metadata (teardown after a failed `init`, when the metadata
    /// caches' pages are dropped wholesale afterwards).
    ///
    /// # Safety
    /// Nothing uses this cache or its objects afterwards; metadata caches
    /// are discarded after the caches whose metadata they hold.
    pub(crate) unsafe fn discard_all(&self) {
        let mut slab = self.lock().take_all();
        while !slab.is_null() {
            // SAFETY: detached slabs are alive until their pages go back;
            // `next` is read before the page (maybe holding the header) goes.
            unsafe {
                let next = (*slab).next;
                let base = (*slab).base;
                let nr_pages = (*slab).nr_pages as usize;
                if self.params.on_primary {
                    self.params.page_map.clear_range(base, nr_pages);
                }
                (*slab).magic = 0;
                if let Some(pages) = NonNull::new(base as *mut u8) {
                    self.params.source.free_pages(pages, nr_pages);
                }
                slab = next;
            }
        }
    }

    /// Grow the bufctl hash if its load is too high. Runs with no lock held.
    pub(crate) fn maybe_grow_hash<O: SlabOwner>(&self, owner: &O) {
        if self.params.kind == SlabKind::Bufctl {
            rescale_locked(
                &self.lists,
                |lists| &mut lists.hash,
                AddrHash::wants_grow,
                owner.metadata_source(),
            );
        }
    }

    /// Shrink the bufctl hash if its load fell low (reap, destroy; illumos
    /// `kmem_hash_rescale`): back to the inline buckets (no pages), or to a
    /// smaller page-backed table (allocated here, with no lock held; if
    /// that fails the table stays as it is). The old table's pages go back.
    pub(crate) fn free_hash_table<O: SlabOwner>(&self, owner: &O) {
        rescale_locked(
            &self.lists,
            |lists| &mut lists.hash,
            AddrHash::wants_shrink,
            owner.metadata_source(),
        );
    }
}
