//! Double frees refused at the free, without debug flags: the free key
//! (glibc's tcache `key`, 2.29).
//!
//! A per-boot secret, [`free_key`] (copied into every per-CPU cache's
//! line, where the hit reads it), is written into a freed object's first
//! word as the object enters a magazine (the free's hit, or its miss), and
//! the free first tests that word: an object that holds the key was freed
//! already, wherever it rests now (deeper in a magazine, another CPU's, the
//! depot, a bufctl slab). The alloc clears the word, so a live object holds
//! the key only if its owner wrote it there. That is why a match is
//! *confirmed* before anything is reported ([`KmemCache::is_double_free`]):
//! the object is looked for in every magazine and the depot, and in its
//! slab's free map or bufctl hash; if it is nowhere free, the free goes on.
//! No false positive, and a refused free changes nothing.
//!
//! Cost on the magazine hits: the free's old naive test (the object on top
//! of `loaded`, two instructions) becomes the key's load, compare and store
//! (four), and the alloc clears one word: +3 instructions per pair.
//!
//! **Nothing is handed out twice** (issue 33): the alloc hit takes the key
//! (the alloc hit, `KmemCache::alloc_hit`: one `sub` of the key to memory, 0 being the cleared
//! key, and its branch: +2 a pair) and hands out only a round that held
//! it; the miss ([`KmemCache::round_intact`]) and a drain to the slab
//! layer ([`KmemCache::intact_rounds`]) test every round the same way.
//! A round without its key was written after its free: reported
//! (`ModifiedAfterFree`) and kept, busy in its slab for good. That closes
//! the hole glibc's tcache key has: a use after free that writes the
//! first word (the key gone) lets a double free pass the free's test, and
//! the object rests twice in the magazines; its first copy leaves with
//! the key cleared, so its second never leaves. The slab layer does the
//! same for its free objects (`FreeList::lost_key`: never relinked).
//!
//! **The free's test does not stall** behind the caller's last store:
//! [`holds_key`] compares the key's low byte first (a one-byte load is
//! always forwarded from the store buffer), the word only on a match.
//! Same instruction count; the key's low byte is one no pointer, ASCII
//! text or small integer starts with (`key_low_byte`).
//!
//! The key is not a pointer (bit 63 set, bit 47 clear: non-canonical on
//! x86_64), so no pointer a caller stores can equal it.
//!
//! **Caches whose objects keep their own first word** are *keyless*
//! ([`HotFlags::KEYLESS`](super::HotFlags::KEYLESS), in both slow masks, so their allocs and frees
//! leave the keyed hits, whose instruction count is unchanged): a
//! constructor's or destructor's object state, a debug cache (poison and
//! the state word, which already refuses every double free), `NOTOUCH`
//! (object memory may not be memory) and bootstrap caches. All but the
//! last two mark a freed object elsewhere ([`KeyPlace`]), and their frees
//! skip the naive hit for the miss, which tests and sets the mark:
//!
//! - **constructed objects of small slabs**: the key in a word *after*
//!   the object (the stride grows by that word, `Kmem::cache_create`;
//!   Linux SLUB puts a constructed cache's free pointer there,
//!   `calculate_sizes`: `s->offset = size`), so the constructed state is
//!   never touched; a match is confirmed by the same search;
//! - **bufctl slabs** (`NOTOUCH`, constructed objects above 512 bytes):
//!   the bufctl's state, `Magazine` while the object rests in one (set on
//!   the free, cleared on the alloc, under the slab layer's lock: one
//!   hash lookup more per alloc, the free's miss already made one). A
//!   free of an object in state `Magazine`, or not in the hash, is a
//!   double free; no search is needed.
//!
//! Debug and bootstrap caches keep the miss's checks (the tops of
//! `loaded` and `prev`, the slab's free map or bufctl hash).
//! `double_free_rate.rs`: constructed (64 B and 1 KiB) and `NOTOUCH`
//! caches, 200 randomized trials each on 4 CPUs with reaps between, 200
//! of 200 refused at the free and none handed out twice (without the
//! marks: `NOTOUCH` 52 of 200, 80 handed out twice; constructed objects
//! handed out twice, their state overwritten).
//!
//! **In the slab layer** the key stays: a small slab's free object holds
//! it in its first word and its free-list link in its second (the slab
//! layer writes both, and a free object found without its key when it is
//! handed out was written after its free: reported as a corrupted free
//! list, the list rebuilt); a bufctl slab never touches its objects. So a
//! double free of an object back in its slab is refused on the hit too.
//! A slab of 8-byte objects (one word: the key's) keeps no link: its free
//! objects are found by its bitmap of free objects (`free_map`, the
//! lowest set bit after each pop; `layout/freelist.rs`), so its objects
//! hold the key in the slab layer too (`double_free_rate.rs`:
//! `eight_byte_double_frees_refused_at_the_free`, 200 of 200 refused at
//! the free on 4 CPUs with reaps between, was 182 and 11 handed out
//! twice).

use core::ptr::NonNull;
use core::sync::atomic::{AtomicUsize, Ordering};

use super::{CacheSpec, KmemCache};
#[cfg(feature = "trace-table")]
use crate::debug::{AUDIT_FRAMES, AuditRecord};
use crate::flags::CacheFlags;
use crate::layout::freelist::freelist_secret;
use crate::platform::Platform;
use crate::reports::error::{ErrorKind, ErrorReport};
use crate::sync::IrqGuard;

/// The key of this boot: 0 until the first cache is made.
static FREE_KEY: AtomicUsize = AtomicUsize::new(0);

/// Bits forced in the key: bit 63 set and bit 47 clear make it a
/// non-canonical address (never a pointer), bit 0 an odd one.
const KEY_SET: usize = 1 << 63 | 1;
/// Bits forced clear in the key.
const KEY_CLEAR: usize = 1 << 47;

/// The key's low byte, which the free tests first (see [`holds_key`]):
/// `0x81..=0xbf` and odd. Odd: never the low byte of an 8-aligned
/// pointer; at least `0x80`: never ASCII nor a small non-negative
/// integer; below `0xc0`: a UTF-8 continuation byte, never the first
/// byte of a string.
const fn key_low_byte(random: usize) -> usize {
    0x81 | (random & 0x3e)
}

/// This boot's key from the random value `random`: the forced bits,
/// and the low byte as [`key_low_byte`] makes it.
const fn make_key(random: usize) -> usize {
    (random & !KEY_CLEAR & !0xff) | KEY_SET | key_low_byte(random)
}

/// Choose this boot's key from `seed` (a clock mixed with an address), once:
/// later calls keep the first key (objects already freed hold it). Returns
/// the key, for the per-CPU caches of a new cache, whose line the free's
/// hit reads it from.
pub(crate) fn init_free_key(seed: u64) -> usize {
    // Chosen already (every cache after the first): nothing to mix.
    let chosen = free_key();
    if chosen != 0 {
        return chosen;
    }
    // The free-list shuffle is seeded with the key, once a boot.
    crate::layout::freelist::init_shuffle(seed);
    let key = make_key(freelist_secret(seed));
    let _ = FREE_KEY.compare_exchange(0, key, Ordering::Relaxed, Ordering::Relaxed);
    free_key()
}

/// This boot's key.
#[inline(always)]
pub(crate) fn free_key() -> usize {
    FREE_KEY.load(Ordering::Relaxed)
}

/// Whether a cache made from `spec` keys its objects (see the module docs).
pub(super) fn keyed(spec: &CacheSpec<'_>) -> bool {
    spec.ctor.is_none()
        && spec.dtor.is_none()
        && spec.debug.is_none()
        && !spec.bootstrap
        && !spec.flags.contains(CacheFlags::NOTOUCH)
}

/// The key free objects of small slabs keep in the slab layer (their
/// free-list link moves to their second word; 8-byte objects have none),
/// or 0: a keyless cache, or a bufctl cache (the slab layer never touches
/// its objects, so the key stays anyway).
pub(super) fn slab_key(spec: &CacheSpec<'_>) -> usize {
    let small = spec.geometry.kind == crate::layout::geometry::SlabKind::Small;
    if keyed(spec) && small { free_key() } else { 0 }
}

/// Where a cache marks an object freed (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KeyPlace {
    /// No mark: a debug cache (its state word refuses every double free)
    /// or a bootstrap cache (callers never free to it).
    Unmarked,
    /// The key in the word at this offset of the object's stride: 0 in a
    /// keyed cache, after the object (the stride grown by a word) in a
    /// constructed small-slab cache (a small stride: 16 bits keep the
    /// cache within its cache lines).
    Word(u16),
    /// Bufctl slabs without a key (`NOTOUCH`, or constructed objects):
    /// the bufctl's state, `Magazine` (`slab/mod.rs`).
    Bufctl,
}

impl KeyPlace {
    /// Whether a keyless cache marks its freed objects (its frees then
    /// skip the naive hit for the miss, which tests and sets the mark).
    #[inline]
    pub(crate) fn marks(self) -> bool {
        self != KeyPlace::Unmarked
    }
}

/// The word a constructed small-slab cache of `size`-byte objects keeps
/// the key in: the first after the object (Linux SLUB's free pointer of a
/// constructed cache, `s->offset = size`).
pub(crate) fn key_after(size: usize) -> usize {
    size.next_multiple_of(8)
}

/// Where a cache made from `spec` marks its freed objects.
pub(super) fn key_place(spec: &CacheSpec<'_>) -> KeyPlace {
    if spec.debug.is_some() || spec.bootstrap {
        KeyPlace::Unmarked
    } else if keyed(spec) {
        KeyPlace::Word(0)
    } else if spec.geometry.kind == crate::layout::geometry::SlabKind::Bufctl {
        KeyPlace::Bufctl
    } else if spec.geometry.stride >= key_after(spec.size) + 8
        && let Ok(offset) = u16::try_from(key_after(spec.size))
    {
        KeyPlace::Word(offset)
    } else {
        KeyPlace::Unmarked
    }
}

/// The word of object `obj` that holds the key: its first.
#[expect(
    clippy::cast_ptr_alignment,
    reason = "objects start 8-aligned: every alignment is at least 8 (geometry), and so are strides and slab bases"
)]
#[inline(always)]
fn key_word(obj: NonNull<u8>) -> *mut usize {
    obj.as_ptr().cast::<usize>()
}

/// The word at `offset` (a multiple of 8 inside the stride) of `obj`.
#[expect(
    clippy::cast_ptr_alignment,
    reason = "objects start 8-aligned and the offset is a multiple of 8"
)]
fn key_word_at(obj: NonNull<u8>, offset: usize) -> *mut usize {
    obj.as_ptr().wrapping_add(offset).cast::<usize>()
}

/// Whether freed object `obj` holds the key: freed already, or its owner
/// wrote the key (the slow path confirms).
///
/// The low byte first: a one-byte load is always forwarded from the
/// store buffer, whatever the caller's last write to the object was (a
/// store starting at the object's first byte contains it; any other
/// store does not overlap it), where a word's load waits for a narrower
/// store at offset 0 to retire (a store-forwarding stall: 4.1 against
/// 2.6 ns a pair with one byte written, `docs/HARDENING.md`). Only an
/// object whose first byte matches (`key_low_byte`: no pointer, ASCII or
/// small integer starts so) reads the word. The same instruction count.
///
/// # Safety
/// `obj` is an object start of a keyed cache (at least 8 bytes of its
/// stride, 8-aligned, ours to read).
#[inline(always)]
pub(crate) unsafe fn holds_key(obj: NonNull<u8>, key: usize) -> bool {
    // SAFETY: per our caller.
    unsafe { obj.as_ptr().read() == key as u8 && key_word(obj).read() == key }
}

/// Clear the key of an object a keyed cache hands out (glibc `e->key =
/// 0`), so that only its owner can put the key back.
///
/// # Safety
/// `obj` is an object of a keyed cache, just taken from its magazines or
/// slab layer for a caller.
#[inline(always)]
pub(crate) unsafe fn clear_key(obj: NonNull<u8>) {
    // SAFETY: per our caller.
    unsafe { key_word(obj).write(0) };
}

impl<P: Platform> KmemCache<P> {
    /// Whether `obj`, a round just taken from one of this cache's
    /// magazines, still holds the mark its free left (see the alloc hit, `KmemCache::alloc_hit`;
    /// any cache: the mark where [`KeyPlace`] says, nothing to test for
    /// an unmarked or bufctl-marked cache). Reported if not: the caller
    /// then keeps it from every caller and from its slab.
    ///
    /// # Safety
    /// `obj` was just taken from this cache's magazines, not yet handed
    /// out.
    #[inline]
    pub(crate) unsafe fn round_intact(&self, obj: NonNull<u8>) -> bool {
        let KeyPlace::Word(offset) = self.key_place else {
            return true;
        };
        // SAFETY: per our caller; a word of the object's stride.
        if unsafe { key_word_at(obj, offset.into()).read() } == free_key() {
            return true;
        }
        self.report_modified_round(obj, offset.into());
        false
    }

    /// The alloc hit's key take for the flagged alloc of a keyless cache (any cache: the mark where
    /// [`KeyPlace`] says, left in place: the post-alloc hook clears it).
    ///
    /// # Safety
    /// As for [`Self::round_intact`].
    #[inline(always)]
    pub(crate) unsafe fn take_round_hooked(&self, obj: NonNull<u8>) -> Option<NonNull<u8>> {
        // SAFETY: per our caller.
        unsafe { self.round_intact(obj) }.then_some(obj)
    }

    /// Keep the rounds of a magazine going back to the slab layer (a
    /// drain or a reap) that still hold their mark: the others are
    /// reported and left out (busy in their slabs for good). Returns the
    /// kept rounds, moved to the front of `rounds`.
    ///
    /// # Safety
    /// `rounds` are rounds of a magazine of this cache, detached, ours.
    pub(crate) unsafe fn intact_rounds<'a>(&self, rounds: &'a mut [*mut u8]) -> &'a [*mut u8] {
        if !matches!(self.key_place, KeyPlace::Word(_)) {
            return rounds;
        }
        let mut nr_kept = 0;
        for index in 0..rounds.len() {
            let round = rounds[index];
            // SAFETY: per our caller, a round of ours (never null).
            if unsafe { self.round_intact(NonNull::new_unchecked(round)) } {
                rounds[nr_kept] = round;
                nr_kept += 1;
            }
        }
        &rounds[..nr_kept]
    }

    /// Report a round found without its mark at `offset`: a
    /// `ModifiedAfterFree` report, with the object's slab and, for a
    /// traced cache, the allocation of the object's live copy.
    #[cold]
    #[inline(never)]
    fn report_modified_round(&self, obj: NonNull<u8>, offset: usize) {
        let addr = obj.as_ptr() as usize;
        let mut report = ErrorReport::new(ErrorKind::ModifiedAfterFree, self.name(), addr + offset);
        report.object = addr;
        if self.kind == crate::layout::geometry::SlabKind::Small {
            report.slab = self.small_slab_of(addr) as usize;
        }
        // The stack known: a traced object's allocation (`kmemtrace
        // start`), the holder of its other copy (marked caches keep no
        // audit records: those are a debug cache's, unmarked).
        #[cfg(feature = "trace-table")]
        self.trace_table().for_each(|record| {
            if record.addr == addr {
                let mut last = AuditRecord {
                    timestamp: record.timestamp.max(1),
                    cpu: record.cpu,
                    nr_frames: 0,
                    frames: [0; AUDIT_FRAMES],
                };
                let frames = record.frames();
                let nr_frames = frames.len().min(AUDIT_FRAMES);
                last.frames[..nr_frames].copy_from_slice(&frames[..nr_frames]);
                last.nr_frames = nr_frames as u32;
                report.last_alloc = Some(last);
            }
        });
        self.owner().report_error(report);
    }

    /// Whether freeing `obj` now would free it twice: for a keyed cache
    /// whose object holds the key, confirmed by a search of every
    /// magazine and the depot and by its slab (see the module docs);
    /// otherwise the miss's checks (the tops of this CPU's magazines, the
    /// slab). Call with no allocator lock held (the search visits each
    /// CPU).
    ///
    /// # Safety
    /// `obj` is an object start of a live slab of this cache.
    pub(crate) unsafe fn is_double_free(&self, obj: NonNull<u8>) -> bool {
        let addr = obj.as_ptr() as usize;
        match self.key_place {
            KeyPlace::Word(offset)
                // SAFETY: per our caller; the offset is a word of the
                // object's stride (`key_place`).
                if unsafe { key_word_at(obj, offset.into()).read() } == free_key() =>
            {
                // SAFETY: per our caller.
                return unsafe { self.is_free_in_slab(obj) }
                    // An interrupt handler makes no cross-CPU call: the key
                    // alone decides (a caller's own word equal to this
                    // boot's key is refused then).
                    || P::in_interrupt()
                    || self.find_round(|round| round == addr).is_some();
            }
            KeyPlace::Bufctl => {
                // The slab layer's lock with interrupts off (an interrupt
                // handler's alloc or free can take it).
                let _irq = IrqGuard::<P>::new();
                // Not busy (back in its slab), or in a magazine.
                return !matches!(self.slab.lock().mark_magazine(addr, None), Ok(false));
            }
            _ => {}
        }
        // SAFETY: per our caller.
        self.on_top_of_magazines(obj) || unsafe { self.is_free_in_slab(obj) }
    }

    /// Set (`freed`: a free that passed [`Self::is_double_free`] on the
    /// miss, before the object enters a magazine or its slab) or clear
    /// (an object leaving a flagged alloc path for a caller) the mark of
    /// `obj` where this cache keeps it.
    ///
    /// # Safety
    /// `obj` is an object of this cache, the caller's to give up or just
    /// taken for a caller.
    #[inline]
    pub(crate) unsafe fn mark_key(&self, obj: NonNull<u8>, freed: bool) {
        match self.key_place {
            KeyPlace::Unmarked => {}
            KeyPlace::Word(offset) => {
                let key = if freed { free_key() } else { 0 };
                // SAFETY: per our caller; a word of the object's stride.
                unsafe { key_word_at(obj, offset.into()).write(key) };
            }
            KeyPlace::Bufctl => {
                let _irq = IrqGuard::<P>::new();
                // Not busy: the caller's checks refused it already.
                let _ = self
                    .slab
                    .lock()
                    .mark_magazine(obj.as_ptr() as usize, Some(freed));
            }
        }
    }
}
