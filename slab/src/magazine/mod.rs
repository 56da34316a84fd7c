//! The magazine layer (Bonwick & Adams 2001, as in Akaros): per-CPU caches
//! of two magazines and the depot behind them.
//!
//! Each CPU has a [`PcpuCache`] holding two magazines, `loaded` and `prev`,
//! of object pointers ("rounds"). Behind them is the cache's [`Depot`]: a
//! list of non-empty ("full") magazines and a list of empty ones.
//!
//! **Magazines are sized to their capacity** (Bonwick & Adams 2001 §3.3,
//! illumos `kmem_magtype`): a magazine carries its `capacity` and lives in
//! the bootstrap cache of its type, `kmem_magazine_<capacity>`, of
//! `16 + 8 × capacity` bytes ([`MAGAZINE_ROUNDS`]: 1, 3, 6, 14, 29 and 60
//! rounds; the four larger fill a one-page slab exactly). The per-CPU
//! cache keeps the loaded magazine's top and end as slot pointers itself
//! (Bonwick & Adams 2001's `cc_rounds` and `cc_magsize`), so the hits
//! read one line and a round slot, never the magazine's header (its
//! `next`, the word below slot 0, is null while a CPU holds it: an empty
//! magazine's "top round" is null, the alloc hit's empty test); all other
//! code reaches a per-CPU cache through [`PcpuSynced`], which writes the
//! count back into the header first and takes both again after. A
//! cache starts with the largest type whose rounds hold at most
//! [`MAG_START_BYTES`] of objects (64 KiB: 60 rounds for objects up to
//! 1092 bytes, 29 up to 2259, 14 up to 4681, 6 for 8 KiB ones), so a
//! large-object cache meets its depot about as rarely per object as a
//! small one (a few times per thousand operations on the bench's
//! 8–8192 B mix), and a cached object costs at most 8.6
//! bytes of magazine pages up to 128 bytes and at most 1/15 of its own
//! size above (checked per kmalloc class by the magazine tests); before,
//! every magazine was 512 bytes for 8 rounds, 64 bytes per cached object.
//!
//! **On a small source** (one whose size classes are born on first use,
//! under ~2.4 MiB: `allocator/classes.rs`) every type's magazines live
//! in `kmem_magazine_60`'s 496-byte objects (`Kmem::magazine_cache`):
//! the types keep their capacities (and the caches their hit rates), but
//! share one cache's slabs. A page per type in use took 7 of a 100 KiB
//! heap's 25 pages after the hobby kernel's first pass (its 11 classes
//! had magazines of all six types); sharing, 2 pages hold those 14
//! magazines, and the second pass's 8 KiB `Vec` no longer reaps. And
//! since a magazine of any type costs the same there, a class refills
//! into one of its depot's type from its first trip down (not 1, 3, 6,
//! 14 rounds as its misses repeat: each a new magazine, the old freed,
//! and frees overflowing the small ones): `depot.rs`, `FREED`; and a
//! cache is born with an empty one loaded on the CPU that made it
//! (`KmemCache::load_first_magazine`), so its first free is a hit.
//!
//! - **alloc**: pop from `loaded`; else swap with `prev` if it has rounds;
//!   else trade the empty `prev` for a full magazine from the depot; else
//!   go to the slab layer.
//! - **free**: push to `loaded` if it is below its capacity; else swap
//!   with `prev` if it is empty; else trade `prev` (full) for an empty
//!   magazine of the depot's type; else allocate a new magazine of that
//!   type from its `kmem_magazine_<N>` cache and retry; if that fails,
//!   destruct the object and free it to the slab layer. A free never waits
//!   for memory.
//! - **drain** (`reap`, `destroy`): each CPU hands its `loaded` and `prev`
//!   over in a [cross-CPU call](crate::Platform::cross_cpu_call); then the
//!   depot's lists are detached under the depot lock; rounds and
//!   magazines are freed with no lock held.
//! - **working set** (Bonwick & Adams 2001 §3.7; illumos
//!   `kmem_depot_ws_update` / `kmem_depot_ws_reap`): each depot list
//!   remembers the fewest magazines it held since the last update
//!   (`min`). An update makes that the list's `reaplimit` and starts a
//!   new interval; a working-set reap frees `min(reaplimit, min)`
//!   magazines of each list — those nobody needed for a whole interval —
//!   and their rounds. So memory a burst left in the depot goes back after
//!   one idle interval, and a steady load keeps its magazines.
//!
//! A per-CPU cache belongs to its CPU: only that CPU touches it, holding
//! its in-use flag ([`LocalLocked`](crate::sync::LocalLocked): a plain
//! load and store, interrupts possibly on; an interrupt handler that finds
//! it held leaves the magazines alone), or code that CPU runs on another's
//! behalf in a cross-CPU call (which takes the flag too, and retries if
//! it interrupted a hit). So it has no lock and the hits no atomic
//! instruction. An absent magazine is the shared, never-written
//! [`NO_MAGAZINE`], with no rounds and no room (`top == limit` at its
//! slot 0, a null `next` below it), which fails both hit tests, so the
//! hits need no null test.
//!
//! Statistics are kept at exchanges: a CPU counts its magazine allocations
//! (one plain add on the alloc hit, in the line it writes anyway) and the
//! rounds that entered or left its magazines through the depot and drains;
//! its frees are derived exactly from those and the rounds it holds (see
//! [`PcpuInner::stats`]).
//!
//! Objects in magazines stay constructed. The depot counts how often its
//! lock was contended (a failed `try_lock`, Bonwick & Adams 2001 §3.6)
//! and how often it was handed off, visited by another CPU than the
//! visit before (each hand-off moves the lock's, the lists' and the
//! magazines' cache lines between CPUs, which costs more than the
//! exchange itself even when nobody waits); past a threshold of either
//! within an interval the depot moves to the next magazine type (up to the largest
//! whose rounds hold at most [`MAG_GROW_MAX_BYTES`]): new magazines are of
//! that type, full magazines of the old one are still used until they run
//! empty, and empty ones of the old type are freed as they come back to
//! the depot (after the lock is dropped, interrupts on). No per-CPU cache
//! needs to be told.

use core::cell::UnsafeCell;
use core::ptr::{self, NonNull};
use core::sync::atomic::AtomicU8;

use crate::platform::CPU_SLOT_BYTES;
use crate::stats::CpuCacheStats;

mod depot;

/// The depot's state, for the tests of its exchanges and the debug
/// descriptor (`crate::descriptor`).
#[cfg(feature = "descriptor")]
pub(crate) use depot::DepotInner;
pub(crate) use depot::{Depot, Stale};

/// The magazine types (Bonwick & Adams 2001 §3.3; illumos `kmem_magtype`):
/// rounds per magazine. Each has its own bootstrap cache,
/// `kmem_magazine_<rounds>`, of `16 + 8 × rounds`-byte objects. The four larger ones fill a
/// one-page bootstrap slab exactly (4096 bytes minus the 128-byte header:
/// 62 × 64 B, 31 × 128 B, 16 × 248 B, 8 × 496 B), so a round costs 11.0,
/// 9.2, 8.8 and 8.5 bytes of magazine pages; 1 and 3 rounds are for the
/// largest objects (as illumos' 1 and 3).
pub const MAGAZINE_ROUNDS: [usize; NR_MAG_TYPES] = [1, 3, 6, 14, 29, 60];
/// Number of magazine types.
pub(crate) const NR_MAG_TYPES: usize = 6;
/// The bootstrap cache of each magazine type.
pub(crate) const MAG_CACHE_NAMES: [&str; NR_MAG_TYPES] = [
    "kmem_magazine_1",
    "kmem_magazine_3",
    "kmem_magazine_6",
    "kmem_magazine_14",
    "kmem_magazine_29",
    "kmem_magazine_60",
];
/// Rounds the largest magazine holds.
pub const MAG_MAX_ROUNDS: usize = MAGAZINE_ROUNDS[NR_MAG_TYPES - 1];
/// A cache starts with the largest magazine whose rounds hold at most
/// this many bytes of objects (`rounds × stride ≤ 64 KiB`; at least 1
/// round): see [`start_magtype`].
pub(crate) const MAG_START_BYTES: usize = 64 * 1024;
/// Contention grows a cache's magazines to the next type only while the
/// next type's rounds hold at most this many bytes of objects (illumos
/// stops at a type's `mt_maxbuf`).
pub(crate) const MAG_GROW_MAX_BYTES: usize = 128 * 1024;
/// Depot visits per contention-measuring interval.
pub(crate) const MAG_RESIZE_INTERVAL: u32 = 64;
/// Contended depot acquisitions per interval that trigger growth.
pub(crate) const MAG_RESIZE_THRESHOLD: u64 = 8;
/// Hand-offs per interval that trigger growth: depot visits by another
/// CPU than the visit before. Each one moves the depot's cache lines (the
/// lock, the lists, the magazines' headers and rounds) between CPUs, the
/// cost of an exchange on a modern machine even when nobody waits for the
/// lock; a quarter of the visits is a cache the CPUs trade through.
pub(crate) const MAG_HANDOFF_THRESHOLD: u32 = 16;
/// How often a free retries after allocating a fresh magazine that another
/// CPU took first, before freeing straight to the slab layer.
pub(crate) const MAG_FREE_RETRIES: usize = 3;

/// Bytes of the magazine header (`next`, `capacity`, `nr_rounds`).
const MAG_HEADER_BYTES: usize = 16;

/// Bytes of a magazine of `capacity` rounds.
pub(crate) const fn magazine_bytes(capacity: usize) -> usize {
    MAG_HEADER_BYTES + capacity * core::mem::size_of::<*mut u8>()
}

const _: () = {
    assert!(core::mem::size_of::<Magazine>() == MAG_HEADER_BYTES);
    // `top_round` (cache/free.rs) reads the word before `rounds[0]` of an empty
    // magazine: `capacity` in its low half (little-endian), `nr_rounds`
    // in its high half.
    assert!(cfg!(target_endian = "little"));
    // The word right below slot 0 is `next`, null while a per-CPU cache
    // holds the magazine: the alloc hit reads it as "no round" (a round
    // is never null), and the top-of-`loaded` double-free check as no
    // object.
    assert!(
        core::mem::offset_of!(Magazine, rounds)
            == core::mem::offset_of!(Magazine, next) + core::mem::size_of::<*mut Magazine>()
    );
    let mut index = 1;
    while index < NR_MAG_TYPES {
        assert!(MAGAZINE_ROUNDS[index - 1] < MAGAZINE_ROUNDS[index]);
        index += 1;
    }
    assert!(magazine_bytes(MAG_MAX_ROUNDS) <= crate::layout::geometry::SMALL_MAX_STRIDE);
};

/// The magazine type a cache of `stride`-byte objects starts with: the
/// largest whose rounds hold at most [`MAG_START_BYTES`] (the smallest
/// type if none does).
pub(crate) fn start_magtype(stride: usize) -> usize {
    (0..NR_MAG_TYPES)
        .rev()
        .find(|&magtype| MAGAZINE_ROUNDS[magtype] * stride <= MAG_START_BYTES)
        .unwrap_or(0)
}

/// The largest magazine type contention may grow a cache of
/// `stride`-byte objects to: the largest whose rounds hold at most
/// [`MAG_GROW_MAX_BYTES`], and at least the starting type.
pub(crate) fn max_magtype(stride: usize) -> usize {
    (0..NR_MAG_TYPES)
        .rev()
        .find(|&magtype| MAGAZINE_ROUNDS[magtype] * stride <= MAG_GROW_MAX_BYTES)
        .unwrap_or(0)
        .max(start_magtype(stride))
}

/// The magazine type a refill makes for a cache no free has made a
/// magazine for (`kmem_magazine_14`, 128 B, or the cache's own type if
/// smaller: [`refill_magtype`]): such a cache, a cold partitioned copy
/// of a kmalloc class above all, holds it for good, and 8 copies of
/// every class with 248-byte magazines took `partitioning_memory_cost`
/// to 5.01 % of live (4.30-4.69 % without).
pub(crate) const REFILL_MAX_MAGTYPE: usize = 3;

/// The magazine type a refill makes when this CPU has no magazine that
/// size and no free has made one for the cache: [`REFILL_MAX_MAGTYPE`],
/// at most `depot_magtype` (the cache's own), made on the cache's first
/// batch (its second trip down; the first takes one object and makes
/// none). Growing it with the batches instead (1, 3, 6, 14 rounds as
/// they doubled) made and freed a magazine at each step, and a slab of
/// each `kmem_magazine_<N>`: 3.5k instructions of the shell replay's
/// 49k; a cache that takes a fourth batch holds the 14-round magazine
/// either way.
pub(crate) fn refill_magtype(depot_magtype: usize) -> usize {
    depot_magtype.min(REFILL_MAX_MAGTYPE)
}

/// Whether a magazine of `capacity` rounds is a refill's own, smaller
/// than a depot's `magsize`-round type: at most [`REFILL_MAX_MAGTYPE`]
/// (made before the cache's first free, [`refill_magtype`]). Once the
/// cache frees, such a magazine gives way to the depot's type: a free
/// miss moves its rounds into an empty magazine of that type
/// (`Depot::exchange_for_empty`), a refill replaces it when empty
/// (`KmemCache::refill_room`). Kept, it sent a miss every 14 rounds in
/// steady churn (`bench/profile.sh mixed magpie`: 53.2 -> 55.2
/// instructions an operation). Never the absent magazine (capacity 0),
/// and one compare for the others on the depot's exchanges, which test
/// every `loaded` (`bench/profile.sh batch magpie`).
#[inline(always)]
pub(crate) fn is_refill_magazine(capacity: usize, magsize: usize) -> bool {
    capacity.wrapping_sub(1) < MAGAZINE_ROUNDS[REFILL_MAX_MAGTYPE] && capacity < magsize
}

/// A magazine: a stack of up to `capacity` constructed objects, in a
/// `kmem_magazine_<capacity>` object of [`magazine_bytes`]`(capacity)`
/// bytes: this header, then the `capacity` round slots (reached through
/// raw pointers: the struct declares none).
#[repr(C)]
pub(crate) struct Magazine {
    /// Rounds this magazine holds when full (one of [`MAGAZINE_ROUNDS`];
    /// 0 for the absent magazine).
    pub(crate) capacity: u32,
    /// Rounds it holds now.
    pub(crate) nr_rounds: u32,
    /// The depot list's (or a detached list's) link. Null while a
    /// per-CPU cache holds the magazine (new magazines start null, the
    /// depot's pops clear it): it is the word right below slot 0, which
    /// the alloc hit reads as its empty test.
    pub(crate) next: *mut Magazine,
    pub(crate) rounds: [*mut u8; 0],
}

/// The absent magazine: a per-CPU cache without a `loaded` or `prev`
/// points here. Never written: with it loaded the per-CPU cache's round
/// top and end are both its slot 0 (its `capacity` 0, and [`rounds_of`]
/// tests the address) with its null `next` below, which fail both hits'
/// tests; the miss paths test for it by address. (Its header count,
/// `u32::MAX`, is never read as a count.)
struct NoMagazine(Magazine);

// SAFETY: never written (see above); the null pointer in it is never
// dereferenced.
unsafe impl Sync for NoMagazine {}

static NO_MAGAZINE: NoMagazine = NoMagazine(Magazine {
    next: ptr::null_mut(),
    capacity: 0,
    nr_rounds: u32::MAX,
    rounds: [],
});

/// The absent magazine's address (see [`NO_MAGAZINE`]).
#[inline(always)]
pub(crate) fn no_magazine() -> *mut Magazine {
    ptr::addr_of!(NO_MAGAZINE.0).cast_mut()
}

/// Rounds in a magazine held by a per-CPU cache (0 for [`no_magazine`]).
///
/// # Safety
/// `mag` is `no_magazine()` or a live magazine its caller owns.
#[inline]
pub(crate) unsafe fn rounds_of(mag: *mut Magazine) -> usize {
    if mag == no_magazine() {
        0
    } else {
        // SAFETY: per the caller, a live magazine.
        unsafe { (*mag).nr_rounds as usize }
    }
}

/// The rounds a magazine holds (none for [`no_magazine`]).
///
/// # Safety
/// `mag` is `no_magazine()` or a live magazine the caller owns, and is not
/// changed while the slice lives.
pub(crate) unsafe fn held_rounds<'a>(mag: *mut Magazine) -> &'a [*mut u8] {
    // SAFETY: per the caller.
    let nr_rounds = unsafe { rounds_of(mag) };
    if nr_rounds == 0 {
        return &[];
    }
    // SAFETY: a live magazine's first nr_rounds slots are initialised
    // rounds, inside its kmem_magazine object.
    unsafe { core::slice::from_raw_parts(Magazine::slots(mag), nr_rounds) }
}

/// [`held_rounds`], to rearrange.
///
/// # Safety
/// As for [`held_rounds`], and the magazine is the caller's alone.
pub(crate) unsafe fn held_rounds_mut<'a>(mag: *mut Magazine) -> &'a mut [*mut u8] {
    // SAFETY: per the caller.
    let nr_rounds = unsafe { rounds_of(mag) };
    if nr_rounds == 0 {
        return &mut [];
    }
    // SAFETY: as in `held_rounds`; ours alone.
    unsafe { core::slice::from_raw_parts_mut(Magazine::slots(mag), nr_rounds) }
}

/// A CPU's magazines of one cache, owned by that CPU (see the module
/// docs): reached through [`KmemCache`](crate::KmemCache)'s magazine hits
/// (its in-use flag), or in a cross-CPU call.
pub(crate) struct PcpuInner {
    pub(crate) loaded: *mut Magazine,
    pub(crate) prev: *mut Magazine,
    /// Allocations served by this CPU's magazines, ever.
    pub(crate) nr_allocs: u64,
    /// Rounds that came into this CPU's magazines from the depot minus
    /// those that left to the depot or to a drain (wrapping).
    pub(crate) nr_rounds_exchanged: u64,
    /// `loaded`'s slot above its top round, `slots + rounds` (Bonwick &
    /// Adams' `cc_rounds`, as a pointer: the hits pop and push without
    /// loading `loaded`): the hits move it, in the line they read anyway,
    /// and leave `loaded`'s header count stale (see [`PcpuSynced`]). The
    /// word below it is the top round, or with no rounds the header's
    /// null `next`: the alloc hit's empty test. The absent magazine's
    /// slot 0 when there is none.
    pub(crate) top: *mut *mut u8,
    /// `loaded`'s end, `slots + capacity` (`cc_magsize`): `top` below it
    /// is room for a round. Equal to `top` with the absent magazine, so
    /// neither hit passes its test.
    pub(crate) limit: *mut *mut u8,
    /// This boot's free key (`cache/double_free.rs`), in the line the
    /// free's hit reads anyway: one load, no GOT indirection.
    pub(crate) free_key: usize,
}

impl PcpuInner {
    /// This CPU's figures. Frees are derived: every round in its
    /// magazines came from a free here, an exchange, or a drain took it,
    /// and every allocation took one, so `frees = held - exchanged +
    /// allocs` exactly.
    pub(crate) fn stats(&self) -> CpuCacheStats {
        // SAFETY: the per-CPU cache's magazines are owned by whoever
        // holds `&self` (its CPU, interrupts off, or a cross-CPU call).
        let (loaded, prev) = unsafe { (rounds_of(self.loaded), rounds_of(self.prev)) };
        CpuCacheStats {
            nr_allocs: self.nr_allocs,
            nr_frees: ((loaded + prev) as u64)
                .wrapping_sub(self.nr_rounds_exchanged)
                .wrapping_add(self.nr_allocs),
            nr_rounds_loaded: loaded,
            nr_rounds_prev: prev,
        }
    }

    /// Write the hits' round count into `loaded`'s header.
    #[inline(always)]
    pub(crate) fn flush(&mut self) {
        if self.loaded != no_magazine() {
            // SAFETY: a live magazine owned by this per-CPU cache, whose
            // owner holds `&mut self`.
            // `top` is in `loaded`'s slots, at or above slot 0.
            unsafe {
                (*self.loaded).nr_rounds =
                    self.top.offset_from(Magazine::slots(self.loaded)) as u32;
            };
        }
    }

    /// Take the round count and capacity from `loaded`'s header (after
    /// code that may have changed either magazine or its rounds).
    #[inline(always)]
    pub(crate) fn reload(&mut self) {
        // SAFETY: `loaded` is the absent magazine (capacity 0, no rounds)
        // or a live one owned by this per-CPU cache: its slots, up to its
        // capacity, are in its object.
        unsafe {
            let slots = Magazine::slots(self.loaded);
            self.top = slots.add(rounds_of(self.loaded));
            self.limit = slots.add((*self.loaded).capacity as usize);
        }
    }

    /// Swap `loaded` and `prev` (with exact headers: a [`PcpuSynced`]).
    pub(crate) fn swap_magazines(&mut self) {
        core::mem::swap(&mut self.loaded, &mut self.prev);
    }

    /// Hand both magazines over (drain): they leave this CPU, their rounds
    /// counted as exchanged away. Returns `(loaded, prev)`, each a live
    /// magazine or `no_magazine()`.
    pub(crate) fn take_magazines(&mut self) -> (*mut Magazine, *mut Magazine) {
        let mags = (self.loaded, self.prev);
        // SAFETY: our own magazines (see `stats`).
        let nr_rounds = unsafe { rounds_of(mags.0) + rounds_of(mags.1) };
        self.nr_rounds_exchanged = self.nr_rounds_exchanged.wrapping_sub(nr_rounds as u64);
        self.loaded = no_magazine();
        self.prev = no_magazine();
        mags
    }
}

/// A per-CPU cache as all code but the hits sees it: flushed
/// ([`PcpuInner::flush`]) when made and reloaded ([`PcpuInner::reload`])
/// when dropped, so in between both magazines' headers hold their exact
/// round counts — what the misses, drains, statistics and the depot read
/// and change. The hits keep `loaded`'s count in the per-CPU cache
/// instead (one line, no dependent load of the magazine's header).
pub(crate) struct PcpuSynced<'g>(&'g mut PcpuInner);

impl<'g> PcpuSynced<'g> {
    /// Flush `pcc`, and reload it when the result is dropped.
    #[inline]
    pub(crate) fn new(pcc: &'g mut PcpuInner) -> Self {
        pcc.flush();
        PcpuSynced(pcc)
    }
}

impl core::ops::Deref for PcpuSynced<'_> {
    type Target = PcpuInner;
    fn deref(&self) -> &PcpuInner {
        self.0
    }
}

impl core::ops::DerefMut for PcpuSynced<'_> {
    fn deref_mut(&mut self) -> &mut PcpuInner {
        self.0
    }
}

impl Drop for PcpuSynced<'_> {
    #[inline]
    fn drop(&mut self) {
        self.0.reload();
    }
}

/// A per-CPU cache: one cache line ([`CPU_SLOT_BYTES`]), so CPUs do not
/// share lines and [`Platform::cpu_offset`](crate::Platform::cpu_offset)
/// indexes an array of them.
#[repr(C, align(64))]
pub(crate) struct PcpuCache {
    pub(crate) inner: UnsafeCell<PcpuInner>,
    /// The in-use flag ([`LocalLocked`](crate::sync::LocalLocked)):
    /// `inner` belongs to whoever set it. In the line the hits read
    /// anyway, after `inner`.
    pub(crate) in_use: AtomicU8,
}

const _: () = {
    assert!(core::mem::size_of::<PcpuCache>() == CPU_SLOT_BYTES);
    assert!(core::mem::align_of::<PcpuCache>() == CPU_SLOT_BYTES);
};

impl PcpuCache {
    /// Empty, with this boot's `free_key`.
    pub(crate) fn new(free_key: usize) -> Self {
        PcpuCache {
            inner: UnsafeCell::new(PcpuInner {
                loaded: no_magazine(),
                prev: no_magazine(),
                nr_allocs: 0,
                nr_rounds_exchanged: 0,
                // SAFETY: the absent magazine; its slot 0 is never read or
                // written (it has no rounds and no room).
                top: unsafe { Magazine::slots(no_magazine()) },
                // SAFETY: as above.
                limit: unsafe { Magazine::slots(no_magazine()) },
                free_key,
            }),
            in_use: AtomicU8::new(0),
        }
    }

    /// Byte offset, in a `PcpuCache`, of its in-use flag: the hits
    /// (`cache/alloc.rs`, `cache/free.rs`) take it as the byte at
    /// `array + offset + IN_USE_AT`
    /// ([`LocalLocked::try_lock`](crate::sync::LocalLocked::try_lock)).
    pub(crate) const IN_USE_AT: usize = core::mem::offset_of!(PcpuCache, in_use);

    /// Byte offsets, in a `PcpuCache`, of the fields the restartable hits
    /// ([`crate::restart`]) read and write (`UnsafeCell` is
    /// `repr(transparent)`).
    pub(crate) const TOP_AT: usize =
        core::mem::offset_of!(PcpuCache, inner) + core::mem::offset_of!(PcpuInner, top);
    /// See [`PcpuCache::TOP_AT`].
    pub(crate) const LIMIT_AT: usize =
        core::mem::offset_of!(PcpuCache, inner) + core::mem::offset_of!(PcpuInner, limit);
    /// See [`PcpuCache::TOP_AT`].
    pub(crate) const NR_ALLOCS_AT: usize =
        core::mem::offset_of!(PcpuCache, inner) + core::mem::offset_of!(PcpuInner, nr_allocs);
    /// See [`PcpuCache::TOP_AT`].
    pub(crate) const FREE_KEY_AT: usize =
        core::mem::offset_of!(PcpuCache, inner) + core::mem::offset_of!(PcpuInner, free_key);

    /// The hits' take of the in-use flag ([`PcpuCache::IN_USE_AT`]) for code that excludes this CPU's other
    /// interrupts-off sections already: interrupts off on this CPU, or a
    /// cross-CPU call running on it.
    ///
    /// # Safety
    /// `self` is the per-CPU cache of the CPU the caller runs as.
    #[inline]
    pub(crate) unsafe fn try_lock_here<P: crate::Platform>(
        &self,
    ) -> Option<crate::sync::LocalLocked<'_, P, PcpuInner>> {
        // SAFETY: per our caller.
        unsafe { crate::sync::LocalLocked::try_lock_here(&self.in_use, &self.inner) }
    }
}

// SAFETY: the cell is reached only by its CPU, under its flag (see
// `try_lock`); the raw
// magazine pointers are owned by the per-CPU cache.
unsafe impl Sync for PcpuCache {}
// SAFETY: as above.
unsafe impl Send for PcpuCache {}

impl Magazine {
    /// The next magazine of a detached depot list.
    ///
    /// # Safety
    /// `mag` is a live magazine from [`Depot::take_all`], owned by the caller.
    pub(crate) unsafe fn next_of(mag: *mut Magazine) -> *mut Magazine {
        // SAFETY: per the caller.
        unsafe { (*mag).next }
    }

    /// A new, empty magazine of `capacity` rounds written at `mem`. The
    /// round slots are left uninitialised: only those below `nr_rounds`
    /// are ever read.
    ///
    /// # Safety
    /// `mem` is a fresh object of `kmem_magazine_<capacity>`:
    /// [`magazine_bytes`]`(capacity)` writable bytes, 8-aligned, owned by
    /// the caller.
    #[expect(
        clippy::cast_ptr_alignment,
        reason = "magazine objects are 8-aligned (see Safety)"
    )]
    pub(crate) unsafe fn init(mem: NonNull<u8>, capacity: usize) -> *mut Magazine {
        let mag = mem.as_ptr().cast::<Magazine>();
        // SAFETY: per the caller.
        unsafe {
            mag.write(Magazine {
                next: ptr::null_mut(),
                capacity: capacity as u32,
                nr_rounds: 0,
                rounds: [],
            })
        };
        mag
    }

    /// The first round slot of `mag`: slot `i < capacity` is at `+ i`.
    /// Derived from the raw pointer, so it may reach every slot of the
    /// magazine's object.
    ///
    /// # Safety
    /// `mag` is a live magazine or the absent one (whose slots must not be
    /// read or written).
    #[inline(always)]
    pub(crate) unsafe fn slots(mag: *mut Magazine) -> *mut *mut u8 {
        // SAFETY: per the caller, `mag` points to a magazine header.
        unsafe { ptr::addr_of_mut!((*mag).rounds).cast::<*mut u8>() }
    }
}
