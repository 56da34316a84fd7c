//! A debug object, read, written and checked: the fill patterns and the
//! trailer's words (where they sit: [`DebugLayout`], `layout.rs`), and
//! the debug module's part of a cache, the one file a debug cache's alloc
//! and free go through (`cache/hooks.rs`'s `post_alloc_hook` and
//! `cache/free.rs`'s `free_hook` call [`KmemCache::debug_alloc_hook`] and
//! [`KmemCache::debug_free_hook`]): what happens to an object when it is
//! created in a slab, handed to a caller, and given back.
//!
//! ```text
//!  grow ─► debug_init_object: state FREE, poison, redzone
//!  alloc (any path) ─► magazines / slab ─► debug_alloc_hook:
//!        state must be FREE  (else: bad state)
//!        poison intact       (else: modified after free, at the first bad word)
//!        redzone intact      (else: redzone violation)
//!        → state ALLOCATED, requested size, audit alloc record,
//!          0xbaddcafe fill, redzone from the requested size
//!  free ─► owner check ─► debug_free_hook:
//!        state FREE          → duplicate free: refused, nothing changed
//!        state not ALLOCATED → bad state: reported, the free goes on
//!        redzone broken      → redzone violation: reported, repaired, goes on
//!                              (from the requested size: a kmalloc(100)
//!                              in kmalloc-104 has 4 more redzone bytes)
//!        → contents saved, audit free record, state FREE, 0xdeadbeef fill
//!        ─► magazines (the object rests there poisoned)
//! ```
//!
//! Every function here returns the reports it produced instead of
//! reporting them, so its callers report with no lock held.

use core::ptr::NonNull;
use core::sync::atomic::{Ordering, fence};

use super::layout::{
    AUDIT_FRAMES, AuditRecord, CONTENTS_BYTES, DebugLayout, DebugObjectInfo, Mismatch, ObjectState,
};
use crate::cache::KmemCache;
use crate::error::FreeError;
use crate::flags::DebugFlags;
use crate::layout::geometry::SlabKind;
use crate::platform::Platform;
use crate::reports::error::{ErrorKind, ErrorReport};
use crate::slab::Slab;

// ---------------------------------------------------------------------------
// Patterns
// ---------------------------------------------------------------------------

/// What a free object of a `POISON` cache holds (illumos `KMEM_FREE_PATTERN`).
pub const POISON_FREE: u64 = 0xdead_beef_dead_beef;
/// What a `POISON` cache hands out (illumos `KMEM_UNINITIALIZED_PATTERN`):
/// reads of uninitialised memory show up as `0xbaddcafe`.
pub const POISON_UNINITIALIZED: u64 = 0xbadd_cafe_badd_cafe;
/// The redzone word after every object (illumos `KMEM_REDZONE_PATTERN`).
pub const REDZONE_PATTERN: u64 = 0xfeed_face_feed_face;
/// The left redzone word right before every object of a `REDZONE` cache
/// (Linux `SLUB_RED_INACTIVE` bytes; a word of its own pattern here).
pub const LEFT_REDZONE_PATTERN: u64 = 0xbbbb_bbbb_cafe_f00d;
/// The redzone bytes between the end of what the caller asked for (the
/// object's end, or a kmalloc's requested size) and the redzone word
/// (illumos `KMEM_REDZONE_BYTE`).
pub const REDZONE_BYTE: u8 = 0xbb;
/// State word of an object with a caller: its address XOR this (illumos
/// `KMEM_BUFTAG_ALLOC`).
pub const STATE_ALLOCATED: u64 = 0xa110_c8ed;
/// State word of a free object: its address XOR this (illumos
/// `KMEM_BUFTAG_FREE`).
pub const STATE_FREE: u64 = 0xf4ee_f4ee;

/// Eight `REDZONE_BYTE`s, for word-wise fills and checks.
const REDZONE_BYTES_WORD: u64 = u64::from_ne_bytes([REDZONE_BYTE; 8]);

/// Fill `buf` with `pattern` (repeated little-endian words, cut at the
/// end), a word at a time.
pub fn fill_pattern(buf: &mut [u8], pattern: u64) {
    let bytes = pattern.to_le_bytes();
    let (words, tail) = buf.as_chunks_mut::<8>();
    for word in words {
        *word = bytes;
    }
    for (byte, &value) in tail.iter_mut().zip(&bytes) {
        *byte = value;
    }
}

/// The first word of `buf` (an object starting at offset `base` of the
/// object) that is not `pattern`; `None` if all of it is. Compared a
/// word at a time (the cut tail word by its bytes).
pub fn find_mismatch(buf: &[u8], pattern: u64, base: usize) -> Option<Mismatch> {
    let (words, tail) = buf.as_chunks::<8>();
    // Whether any word differs, in one pass with no early exit (it
    // vectorizes); then where, only if one does.
    let differs = words
        .iter()
        .fold(0, |acc, word| acc | (u64::from_le_bytes(*word) ^ pattern));
    if differs != 0 {
        let (index, found) = words
            .iter()
            .map(|word| u64::from_le_bytes(*word))
            .enumerate()
            .find(|&(_, found)| found != pattern)?;
        return Some(Mismatch {
            offset: base + index * 8,
            expected: pattern,
            found,
        });
    }
    let bytes = pattern.to_le_bytes();
    if tail.iter().zip(&bytes).any(|(byte, value)| byte != value) {
        return Some(Mismatch {
            offset: base + (buf.len() - tail.len()),
            expected: word_of(&bytes[..tail.len()]),
            found: word_of(tail),
        });
    }
    None
}

/// Index of the first byte (in memory order) where the little-endian
/// words `a` and `b` differ; they differ.
fn first_different_byte(a: u64, b: u64) -> usize {
    ((a ^ b).trailing_zeros() / 8) as usize
}

/// Up to 8 bytes as a little-endian word.
fn word_of(bytes: &[u8]) -> u64 {
    let mut word = [0u8; 8];
    word[..bytes.len()].copy_from_slice(bytes);
    u64::from_le_bytes(word)
}

impl AuditRecord {
    /// The current transaction: now, this CPU, this stack.
    pub fn capture<P: Platform>() -> AuditRecord {
        let mut record = AuditRecord {
            // Never 0 (0 means "none").
            timestamp: P::now().max(1),
            cpu: P::cpu_id() as u32,
            nr_frames: 0,
            frames: [0; AUDIT_FRAMES],
        };
        record.nr_frames = P::backtrace(&mut record.frames).min(AUDIT_FRAMES) as u32;
        record
    }
}

impl DebugLayout {
    /// The left redzone word as it should be.
    pub(crate) fn left_redzone(&self) -> u64 {
        LEFT_REDZONE_PATTERN
    }

    /// The first overwritten byte of a left redzone word `found` (the 8
    /// bytes right before the object): its offset from the object start,
    /// negative (as `usize`, wrapping: -8 to -1).
    pub(crate) fn check_left_redzone(&self, found: u64) -> Option<Mismatch> {
        if self.left == 0 || found == LEFT_REDZONE_PATTERN {
            return None;
        }
        let first = first_different_byte(found, LEFT_REDZONE_PATTERN);
        Some(Mismatch {
            offset: (first as isize - 8) as usize,
            expected: LEFT_REDZONE_PATTERN,
            found,
        })
    }

    /// The expected byte at `offset` of the redzone (`requested size <=
    /// offset < redzone_end`).
    fn redzone_byte(&self, offset: usize) -> u8 {
        let word_start = self.redzone_end - 8;
        if offset < word_start {
            REDZONE_BYTE
        } else {
            REDZONE_PATTERN.to_le_bytes()[offset - word_start]
        }
    }

    /// Write the redzone of the object whose slot is `slot` (the whole
    /// slot: object and trailer), from `start` (the requested size, at
    /// most the object size): `0xbb` bytes, then the pattern word. Word
    /// stores, the unaligned rest byte by byte.
    #[inline]
    pub(crate) fn fill_redzone(&self, slot: &mut [u8], start: usize) {
        if self.redzone_end != self.obj_size {
            self.fill_redzone_from(slot, start);
        }
    }

    /// [`Self::fill_redzone`] of a cache with a redzone.
    fn fill_redzone_from(&self, slot: &mut [u8], start: usize) {
        let word_start = self.redzone_end - 8;
        let mut at = start;
        while at + 8 <= word_start {
            write_word(slot, at, REDZONE_BYTES_WORD);
            at += 8;
        }
        while at < word_start {
            slot[at] = REDZONE_BYTE;
            at += 1;
        }
        write_word(slot, word_start, REDZONE_PATTERN);
    }

    /// The first overwritten byte of the redzone of `slot` starting at
    /// `start` (the requested size): its offset, and the redzone word
    /// containing it (expected and found; bytes of the word before the
    /// redzone read as 0). Compared a word at a time.
    #[inline]
    pub(crate) fn check_redzone(&self, slot: &[u8], start: usize) -> Option<Mismatch> {
        if self.redzone_end == self.obj_size {
            return None;
        }
        self.check_redzone_from(slot, start)
    }

    /// [`Self::check_redzone`] of the object's redzone as its caller uses
    /// it: from the [requested size](Self::requested_size).
    #[inline]
    pub(crate) fn check_redzone_in_use(&self, slot: &[u8]) -> Option<Mismatch> {
        if self.redzone_end == self.obj_size {
            return None;
        }
        self.check_redzone_from(slot, self.requested_size(slot))
    }

    /// [`Self::check_redzone`] of a cache with a redzone.
    fn check_redzone_from(&self, slot: &[u8], start: usize) -> Option<Mismatch> {
        let word_start = self.redzone_end - 8;
        let mut at = start;
        let offset = loop {
            if at + 8 <= word_start {
                let word = read_word(slot, at);
                if word != REDZONE_BYTES_WORD {
                    break at + first_different_byte(word, REDZONE_BYTES_WORD);
                }
                at += 8;
            } else if at < word_start {
                if slot[at] != REDZONE_BYTE {
                    break at;
                }
                at += 1;
            } else {
                let word = read_word(slot, word_start);
                if word == REDZONE_PATTERN {
                    return None;
                }
                break word_start + first_different_byte(word, REDZONE_PATTERN);
            }
        };
        let word = offset & !7;
        let mut expected = [0u8; 8];
        let mut found = [0u8; 8];
        for (index, at) in (word..word + 8).enumerate() {
            if at >= start && at < self.redzone_end {
                expected[index] = self.redzone_byte(at);
                found[index] = slot[at];
            }
        }
        Some(Mismatch {
            offset,
            expected: u64::from_le_bytes(expected),
            found: u64::from_le_bytes(found),
        })
    }

    /// Poison the object part of a slot.
    #[inline]
    pub(crate) fn fill_poison(&self, slot: &mut [u8], pattern: u64) {
        fill_pattern(&mut slot[..self.obj_size], pattern);
    }

    /// The first word of the object part of `slot` that is not
    /// `POISON_FREE`.
    #[inline]
    pub(crate) fn check_poison(&self, slot: &[u8]) -> Option<Mismatch> {
        find_mismatch(&slot[..self.obj_size], POISON_FREE, 0)
    }

    /// The bytes the caller of an allocated object asked for (the object
    /// size unless recorded smaller: a kmalloc's requested size).
    pub(crate) fn requested_size(&self, slot: &[u8]) -> usize {
        match self.size_offset {
            Some(at) => match read_word(slot, at) as usize {
                size @ 1.. if size < self.obj_size => size,
                _ => self.obj_size,
            },
            None => self.obj_size,
        }
    }

    /// Record the bytes the caller asked for (`REDZONE` only; see
    /// [`Self::requested_size`]).
    pub(crate) fn set_requested_size(&self, slot: &mut [u8], size: usize) {
        if let Some(at) = self.size_offset {
            write_word(slot, at, size as u64);
        }
    }

    /// The state word of the slot of the object at `addr`.
    pub(crate) fn state(&self, slot: &[u8]) -> u64 {
        read_word(slot, self.state_offset)
    }

    pub(crate) fn set_state(&self, slot: &mut [u8], addr: usize, state: u64) {
        write_word(slot, self.state_offset, addr as u64 ^ state);
    }

    /// What the state word says of the object at `addr`.
    pub(crate) fn object_state(&self, slot: &[u8], addr: usize) -> ObjectState {
        let word = self.state(slot) ^ addr as u64;
        match word {
            STATE_ALLOCATED => ObjectState::Allocated,
            STATE_FREE => ObjectState::Free,
            _ => ObjectState::Corrupt(self.state(slot)),
        }
    }

    /// The audit records (last alloc, last free), if `AUDIT`.
    pub(crate) fn audit(&self, slot: &[u8]) -> Option<(AuditRecord, AuditRecord)> {
        let at = self.audit_offset?;
        Some((read_audit(slot, at), read_audit(slot, at + 80)))
    }

    /// Record the current transaction, if `AUDIT` (`free`: the free
    /// record, else the alloc one).
    pub(crate) fn record_audit<P: Platform>(&self, slot: &mut [u8], free: bool) {
        if let Some(at) = self.audit_offset {
            let record = AuditRecord::capture::<P>();
            write_audit(slot, if free { at + 80 } else { at }, &record);
        }
    }

    /// Record a transaction (`free`: the free record, else the alloc one).
    #[cfg(test)]
    pub(crate) fn set_audit(&self, slot: &mut [u8], free: bool, record: &AuditRecord) {
        if let Some(at) = self.audit_offset {
            write_audit(slot, if free { at + 80 } else { at }, record);
        }
    }

    /// The saved first bytes of the object at its last free, if `CONTENTS`.
    pub(crate) fn contents(&self, slot: &[u8]) -> Option<[u8; CONTENTS_BYTES]> {
        let at = self.contents_offset?;
        let mut bytes = [0u8; CONTENTS_BYTES];
        bytes.copy_from_slice(&slot[at..at + CONTENTS_BYTES]);
        Some(bytes)
    }

    /// Save the first bytes of the object (`CONTENTS`), at a free.
    pub(crate) fn save_contents(&self, slot: &mut [u8]) {
        if let Some(at) = self.contents_offset {
            let len = CONTENTS_BYTES.min(self.obj_size);
            slot.copy_within(..len, at);
            slot[at + len..at + CONTENTS_BYTES].fill(0);
        }
    }
}

fn read_word(slot: &[u8], at: usize) -> u64 {
    word_of(&slot[at..at + 8])
}

fn write_word(slot: &mut [u8], at: usize, word: u64) {
    slot[at..at + 8].copy_from_slice(&word.to_le_bytes());
}

fn read_audit(slot: &[u8], at: usize) -> AuditRecord {
    let mut record = AuditRecord {
        timestamp: read_word(slot, at),
        cpu: 0,
        nr_frames: 0,
        frames: [0; AUDIT_FRAMES],
    };
    let pair = read_word(slot, at + 8);
    record.cpu = pair as u32;
    record.nr_frames = ((pair >> 32) as u32).min(AUDIT_FRAMES as u32);
    for (index, frame) in record.frames.iter_mut().enumerate() {
        *frame = read_word(slot, at + 16 + index * 8) as usize;
    }
    record
}

fn write_audit(slot: &mut [u8], at: usize, record: &AuditRecord) {
    write_word(slot, at, record.timestamp);
    write_word(
        slot,
        at + 8,
        record.cpu as u64 | (record.nr_frames as u64) << 32,
    );
    for (index, &frame) in record.frames.iter().enumerate() {
        write_word(slot, at + 16 + index * 8, frame as u64);
    }
}

impl<P: Platform> KmemCache<P> {
    /// The post-alloc hook of a debug cache (`cache/hooks.rs`,
    /// `post_alloc_hook`): check the free object being handed to a
    /// caller (state, poison, redzones: [`Self::debug_check_slot`] as for
    /// a free object)
    /// and mark it allocated: state, requested size, audit alloc record,
    /// `0xbaddcafe` fill, the redzone from the requested size. Always
    /// completes the hand-over (an object found corrupted is repaired:
    /// state, poison and redzone are rewritten); what was found is
    /// reported.
    ///
    /// `bytes_req`: the bytes the caller asked for (a kmalloc's size; 0
    /// for the whole object): with `REDZONE` the redzone starts there.
    #[cold]
    #[inline(never)]
    pub(crate) fn debug_alloc_hook(&self, obj: NonNull<u8>, bytes_req: usize) {
        let Some(layout) = self.debug.as_ref() else {
            return;
        };
        let addr = obj.as_ptr() as usize;
        // SAFETY: just taken from our magazines or slab layer: ours until
        // returned (its stride holds the debug slot).
        let slot = unsafe { self.debug_slot(layout, addr) };
        let (_, report) = self.debug_check_slot(layout, slot, addr, 0, true);
        layout.set_state(slot, addr, STATE_ALLOCATED);
        // "Allocated" before the 0xbaddcafe fill (see the free hook).
        fence(Ordering::Release);
        let requested = match bytes_req {
            1.. if bytes_req < layout.obj_size => bytes_req,
            _ => layout.obj_size,
        };
        layout.set_requested_size(slot, requested);
        layout.record_audit::<P>(slot, false);
        if layout.poison {
            layout.fill_poison(slot, POISON_UNINITIALIZED);
        }
        layout.fill_redzone(slot, requested);
        // SAFETY: as above.
        unsafe { self.fill_left_redzone(layout, addr) };
        if let Some(mut report) = report {
            // The object's slab, for the report only (a clean alloc never
            // looks it up).
            report.slab = match self.kind {
                SlabKind::Small => self.small_slab_of(addr) as usize,
                SlabKind::Bufctl => self.params.page_map.get(addr).slab_unchecked(),
            };
            self.owner().report_error(report);
        }
    }

    /// The free hook of a debug cache (`cache/free.rs`, `free_hook`):
    /// check the object a caller frees and, unless it is a duplicate
    /// free (reported and refused, nothing changed), mark it free:
    /// contents saved, audit free record, state, poison, redzones. A
    /// broken state word or redzone is reported and repaired, and the
    /// free goes on.
    ///
    /// # Safety
    /// `addr` is an object start of this cache in `slab` (null for a
    /// bufctl cache off the primary source) that passed the owner check,
    /// given up by the caller.
    pub(crate) unsafe fn debug_free_hook(
        &self,
        addr: usize,
        slab: *mut Slab,
    ) -> Result<(), FreeError> {
        let Some(layout) = self.debug.as_ref() else {
            return Ok(());
        };
        let slab = slab as usize;
        // SAFETY: per our caller (see `debug_slot`).
        let slot = unsafe { self.debug_slot(layout, addr) };
        let mut found = None;
        match layout.object_state(slot, addr) {
            ObjectState::Allocated => {}
            ObjectState::Free => {
                let report =
                    self.debug_report(layout, slot, ErrorKind::DuplicateFree, addr, slab, None);
                self.owner().report_error(report);
                return Err(FreeError::DoubleFree { addr });
            }
            ObjectState::Corrupt(word) => {
                found = Some(self.bad_state_report(layout, slot, addr, slab, word));
            }
        }
        if found.is_none()
            && let Some(mismatch) = layout
                .check_redzone_in_use(slot)
                // SAFETY: per our caller.
                .or_else(|| unsafe { self.check_left_redzone(layout, addr) })
        {
            found = Some(self.redzone_report(layout, slot, addr, slab, mismatch));
        }
        layout.save_contents(slot);
        layout.record_audit::<P>(slot, true);
        if layout.poison {
            layout.fill_poison(slot, POISON_FREE);
        }
        layout.fill_redzone(slot, layout.obj_size);
        // SAFETY: per our caller.
        unsafe { self.fill_left_redzone(layout, addr) };
        // The state says free only once the poison and redzones are in
        // place: a concurrent `verify` that reads "free" then checks the
        // poison must not see it half written (it looks a second time at
        // what changes after that: see `debug_verify_object`).
        fence(Ordering::Release);
        layout.set_state(slot, addr, STATE_FREE);
        if let Some(report) = found {
            self.owner().report_error(report);
        }
        Ok(())
    }

    /// The slot (object and trailer) of the object at `addr`.
    ///
    /// # Safety
    /// `addr` is an object start of this cache, whose stride holds
    /// `layout.slot_size` bytes (and `layout.left` before `addr`, the left
    /// redzone's, which the object's own checks use); nobody else uses the slot for the
    /// lifetime of the slice (the caller owns the object: it is being
    /// created, handed out, freed or verified under the slab lock).
    #[allow(
        clippy::mut_from_ref,
        reason = "raw object memory, owned per the caller"
    )]
    pub(crate) unsafe fn debug_slot(&self, layout: &DebugLayout, addr: usize) -> &mut [u8] {
        // SAFETY: per the caller.
        unsafe { core::slice::from_raw_parts_mut(addr as *mut u8, layout.slot_size) }
    }

    /// The left redzone word of the object at `addr`: the 8 bytes right
    /// before it (`layout.left` is not 0).
    fn left_redzone_word(addr: usize) -> *mut u64 {
        (addr - 8) as *mut u64
    }

    /// The first overwritten byte of the left redzone of the object at
    /// `addr` (an underflow), if the cache has one.
    ///
    /// # Safety
    /// As for `debug_slot` (the `layout.left` bytes before `addr` are the
    /// object's too, in its stride).
    unsafe fn check_left_redzone(&self, layout: &DebugLayout, addr: usize) -> Option<Mismatch> {
        if layout.left == 0 {
            return None;
        }
        // SAFETY: per our caller.
        layout.check_left_redzone(unsafe { Self::left_redzone_word(addr).read() })
    }

    /// Write (or repair) the left redzone of the object at `addr`, if the
    /// cache has one.
    ///
    /// # Safety
    /// As for [`Self::check_left_redzone`].
    unsafe fn fill_left_redzone(&self, layout: &DebugLayout, addr: usize) {
        if layout.left != 0 {
            // SAFETY: per our caller.
            unsafe { Self::left_redzone_word(addr).write(layout.left_redzone()) };
        }
    }

    /// Make a fresh object of a new slab a free debug object.
    ///
    /// # Safety
    /// As for `debug_slot`; the slab was just carved.
    pub(crate) unsafe fn debug_init_object(&self, layout: &DebugLayout, addr: usize) {
        // SAFETY: per the caller.
        let slot = unsafe { self.debug_slot(layout, addr) };
        slot.fill(0);
        if layout.poison {
            layout.fill_poison(slot, POISON_FREE);
        }
        layout.fill_redzone(slot, layout.obj_size);
        layout.set_state(slot, addr, STATE_FREE);
        // SAFETY: per our caller.
        unsafe { self.fill_left_redzone(layout, addr) };
    }

    /// [`Self::debug_resize`] of a debug cache's object, reported.
    ///
    /// # Safety
    /// As for `debug_resize`; `slab` is the object's slab.
    #[cold]
    #[inline(never)]
    pub(crate) unsafe fn debug_resized(&self, addr: usize, slab: *mut Slab, new_size: usize) {
        if let Some(layout) = self.debug.as_ref()
            // SAFETY: per our caller.
            && let Some(report) = unsafe { self.debug_resize(layout, addr, slab as usize, new_size) }
        {
            self.owner().report_error(report);
        }
    }

    /// A kept kmalloc block's caller now uses `new_size` bytes
    /// (`krealloc` in place, `GlobalAlloc::realloc`,
    /// `Allocator::allocate`): check the redzone as it was, then move its
    /// start to `new_size` (Linux `krealloc` with `orig_size`). Returns
    /// the report of a redzone found broken.
    ///
    /// # Safety
    /// As for `debug_slot`: `addr` is an allocated object of this cache
    /// that the caller owns.
    pub(crate) unsafe fn debug_resize(
        &self,
        layout: &DebugLayout,
        addr: usize,
        slab: usize,
        new_size: usize,
    ) -> Option<ErrorReport> {
        layout.size_offset?;
        // SAFETY: per the caller.
        let slot = unsafe { self.debug_slot(layout, addr) };
        let report = layout
            .check_redzone_in_use(slot)
            .map(|mismatch| self.redzone_report(layout, slot, addr, slab, mismatch));
        let new_size = new_size.clamp(1, layout.obj_size);
        layout.set_requested_size(slot, new_size);
        layout.fill_redzone(slot, new_size);
        report
    }

    /// The report of a redzone violation (right or left) of the object at
    /// `addr`.
    fn redzone_report(
        &self,
        layout: &DebugLayout,
        slot: &[u8],
        addr: usize,
        slab: usize,
        mismatch: Mismatch,
    ) -> ErrorReport {
        self.debug_report(
            layout,
            slot,
            ErrorKind::RedzoneViolation,
            addr,
            slab,
            Some(mismatch),
        )
    }

    /// The report for an object whose state word is neither "free" nor
    /// "allocated" for its address (`found`): a write over the state word.
    pub(crate) fn bad_state_report(
        &self,
        layout: &DebugLayout,
        slot: &[u8],
        addr: usize,
        slab: usize,
        found: u64,
    ) -> ErrorReport {
        self.debug_report(
            layout,
            slot,
            ErrorKind::BadState,
            addr,
            slab,
            Some(Mismatch {
                offset: layout.state_offset,
                expected: addr as u64 ^ STATE_ALLOCATED,
                found,
            }),
        )
    }

    /// Verify one object without changing it: a free one (`free`: on its
    /// slab's free list, or its state says free) must hold its poison and
    /// redzone; an allocated one its redzone.
    ///
    /// # Safety
    /// As for `debug_slot`, read-only: called under the slab lock.
    pub(crate) unsafe fn debug_verify_object(
        &self,
        layout: &DebugLayout,
        addr: usize,
        slab: usize,
        free_in_slab: bool,
    ) -> Option<ErrorReport> {
        // SAFETY: per the caller.
        let slot = unsafe { self.debug_slot(layout, addr) };
        let (state, report) = self.debug_check_slot(layout, slot, addr, slab, free_in_slab);
        if report.is_none() || free_in_slab {
            return report;
        }
        // An object outside its slab's free list (a magazine's round, or a
        // caller's) changes hands without the slab lock: a round another
        // CPU allocates or frees while we look is half written (its state
        // word or poison changing under us). As kmemleak reports only
        // what two scans agree on, a problem counts only if a second look
        // a moment later sees the same state and a problem again (the
        // host lockdep test's concurrent `verify` reported an object in
        // flight about 1 run in 30).
        for _ in 0..64 {
            core::hint::spin_loop();
        }
        match self.debug_check_slot(layout, slot, addr, slab, free_in_slab) {
            (again, Some(report)) if again == state => Some(report),
            _ => None,
        }
    }

    /// One look at a debug object: its state, and the problem seen (as
    /// [`Self::debug_verify_object`]; `free_in_slab`: it should be free,
    /// as an object on its slab's free list, or one being handed out by
    /// [`Self::debug_alloc_hook`]).
    fn debug_check_slot(
        &self,
        layout: &DebugLayout,
        slot: &[u8],
        addr: usize,
        slab: usize,
        free_in_slab: bool,
    ) -> (ObjectState, Option<ErrorReport>) {
        let state = layout.object_state(slot, addr);
        // The state before the contents it vouches for (the hooks' fences).
        fence(Ordering::Acquire);
        let report = if free_in_slab || state == ObjectState::Free {
            // An object that should be free (on its slab's free list, or
            // being handed out from a magazine or the slab layer): state,
            // poison, redzones; the first problem found.
            let found = match state {
                ObjectState::Free => {
                    match layout.poison.then(|| layout.check_poison(slot)).flatten() {
                        Some(mismatch) => Some((ErrorKind::ModifiedAfterFree, mismatch)),
                        None => layout
                            .check_redzone(slot, layout.obj_size)
                            // SAFETY: the slot is the caller's (see
                            // `debug_slot`), and so are the left redzone's
                            // bytes before it.
                            .or_else(|| unsafe { self.check_left_redzone(layout, addr) })
                            .map(|mismatch| (ErrorKind::RedzoneViolation, mismatch)),
                    }
                }
                // Allocated (a free object must not say so) or overwritten.
                state => Some((
                    ErrorKind::BadState,
                    Mismatch {
                        offset: layout.state_offset,
                        expected: addr as u64 ^ STATE_FREE,
                        found: match state {
                            ObjectState::Corrupt(word) => word,
                            _ => addr as u64 ^ STATE_ALLOCATED,
                        },
                    },
                )),
            };
            found.map(|(kind, mismatch)| {
                self.debug_report(layout, slot, kind, addr, slab, Some(mismatch))
            })
        } else if let ObjectState::Corrupt(word) = state {
            Some(self.bad_state_report(layout, slot, addr, slab, word))
        } else {
            layout
                .check_redzone_in_use(slot)
                // SAFETY: the slot is the caller's (see `debug_slot`), read
                // only, and so are the left redzone's bytes before it.
                .or_else(|| unsafe { self.check_left_redzone(layout, addr) })
                .map(|mismatch| self.redzone_report(layout, slot, addr, slab, mismatch))
        };
        (state, report)
    }

    /// What the trailer of a debug object says: its state, last alloc,
    /// last free and saved contents (for `whatis` and reports).
    ///
    /// # Safety
    /// As for `debug_slot`, read-only.
    pub(crate) unsafe fn debug_object_info(
        &self,
        layout: &DebugLayout,
        addr: usize,
    ) -> DebugObjectInfo {
        // SAFETY: per the caller.
        let slot = unsafe { self.debug_slot(layout, addr) };
        let audit = layout.audit(slot);
        DebugObjectInfo {
            state: layout.object_state(slot, addr),
            last_alloc: audit.map(|(alloc, _)| alloc),
            last_free: audit.map(|(_, free)| free),
            contents: layout.contents(slot),
        }
    }

    /// A report about object `addr` of this cache, with its transactions.
    pub(crate) fn debug_report(
        &self,
        layout: &DebugLayout,
        slot: &[u8],
        kind: ErrorKind,
        addr: usize,
        slab: usize,
        corruption: Option<Mismatch>,
    ) -> ErrorReport {
        let mut report = ErrorReport::new(kind, self.name(), addr);
        report.object = addr;
        report.slab = slab;
        report.corruption = corruption;
        if let Some((alloc, free)) = layout.audit(slot) {
            report.last_alloc = Some(alloc);
            report.last_free = Some(free);
        }
        if layout.flags.contains(DebugFlags::CONTENTS) {
            report.contents = layout.contents(slot);
        }
        report
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_fill_and_find_the_first_bad_word() {
        let mut buf = [0u8; 45];
        fill_pattern(&mut buf, POISON_FREE);
        assert_eq!(find_mismatch(&buf, POISON_FREE, 0), None);
        assert_eq!(&buf[..4], &[0xef, 0xbe, 0xad, 0xde]);
        buf[0x1a] = 0x41;
        let mismatch = find_mismatch(&buf, POISON_FREE, 0).unwrap();
        assert_eq!(mismatch.offset, 0x18);
        assert_eq!(mismatch.expected, POISON_FREE);
        assert_eq!(mismatch.found, 0xdead_beef_de41_beef);
        // The cut tail word: only its bytes count.
        fill_pattern(&mut buf, POISON_FREE);
        buf[44] = 0;
        let mismatch = find_mismatch(&buf, POISON_FREE, 0).unwrap();
        assert_eq!(mismatch.offset, 40);
        assert_eq!(mismatch.expected, 0xef_dead_beef);
        assert_eq!(mismatch.found, 0x00_dead_beef);
    }

    #[test]
    fn layout_offsets() {
        assert_eq!(DebugLayout::new(64, DebugFlags::empty(), false), None);
        let all = DebugFlags::DEFAULT | DebugFlags::CONTENTS;
        let layout = DebugLayout::new(50, all, false).unwrap();
        assert_eq!(layout.redzone_end, 64);
        assert_eq!(layout.state_offset, 64);
        assert_eq!(layout.freeptr_offset, 72);
        assert_eq!(layout.size_offset, Some(80));
        assert_eq!(layout.audit_offset, Some(88));
        assert_eq!(layout.contents_offset, Some(248));
        assert_eq!(layout.slot_size, 280);
        assert!(layout.poison);
        // F alone: state and free pointer only, no redzone.
        let layout = DebugLayout::new(64, DebugFlags::CONSISTENCY, false).unwrap();
        assert_eq!((layout.redzone_end, layout.state_offset), (64, 64));
        assert_eq!((layout.size_offset, layout.slot_size), (None, 80));
        // A constructor keeps objects unpoisoned.
        let layout = DebugLayout::new(64, DebugFlags::POISON, true).unwrap();
        assert!(!layout.poison);
        assert!(layout.flags.contains(DebugFlags::CONSISTENCY));
    }

    #[test]
    fn poison_covers_the_object_only() {
        let layout = DebugLayout::new(20, DebugFlags::POISON, false).unwrap();
        let mut slot = std::vec![0u8; layout.slot_size];
        layout.fill_poison(&mut slot, POISON_FREE);
        assert_eq!(layout.check_poison(&slot), None);
        assert!(slot[20..].iter().all(|&byte| byte == 0));
        slot[19] = 0;
        let mismatch = layout.check_poison(&slot).unwrap();
        assert_eq!(mismatch.offset, 16);
        assert_eq!(mismatch.found, 0x00ad_beef);
        layout.fill_poison(&mut slot, POISON_UNINITIALIZED);
        assert_eq!(layout.check_poison(&slot).unwrap().offset, 0);
    }

    #[test]
    fn redzone_catches_the_first_byte_past_the_end() {
        let layout = DebugLayout::new(50, DebugFlags::REDZONE, false).unwrap();
        let mut slot = std::vec![0u8; layout.slot_size];
        layout.fill_redzone(&mut slot, 50);
        assert_eq!(layout.check_redzone(&slot, 50), None);
        assert_eq!(slot[49], 0);
        assert_eq!(slot[50], REDZONE_BYTE);
        assert_eq!(&slot[56..60], &[0xce, 0xfa, 0xed, 0xfe]);
        slot[50] = 0x41;
        let mismatch = layout.check_redzone(&slot, 50).unwrap();
        assert_eq!(mismatch.offset, 50);
        assert_eq!(mismatch.expected, 0xbbbb_bbbb_bbbb_0000);
        assert_eq!(mismatch.found, 0xbbbb_bbbb_bb41_0000);
        layout.fill_redzone(&mut slot, 50);
        slot[60] = 0;
        assert_eq!(layout.check_redzone(&slot, 50).unwrap().offset, 60);
    }

    #[test]
    fn redzone_from_the_requested_size_word_by_word() {
        let layout = DebugLayout::new(104, DebugFlags::REDZONE, false).unwrap();
        assert_eq!(layout.redzone_end, 112);
        let mut slot = std::vec![0u8; layout.slot_size];
        assert_eq!(layout.requested_size(&slot), 104, "0: the object size");
        layout.set_requested_size(&mut slot, 100);
        assert_eq!(layout.requested_size(&slot), 100);
        // Every start, every overwritten byte: the first one is found.
        for start in [3, 11, 16, 100, 104] {
            layout.fill_redzone(&mut slot, start);
            assert_eq!(layout.check_redzone(&slot, start), None, "start {start}");
            assert!(slot[start..104].iter().all(|&byte| byte == REDZONE_BYTE));
            for bad in start..112 {
                let saved = slot[bad];
                slot[bad] ^= 0x10;
                let mismatch = layout.check_redzone(&slot, start).unwrap();
                assert_eq!(mismatch.offset, bad, "start {start}");
                assert_eq!(mismatch.expected ^ mismatch.found, 0x10 << (8 * (bad % 8)));
                slot[bad] = saved;
            }
        }
        // A bad recorded size reads as the object size.
        layout.set_requested_size(&mut slot, 4096);
        assert_eq!(layout.requested_size(&slot), 104);
    }

    #[test]
    fn state_audit_and_contents_round_trip() {
        let layout = DebugLayout::new(24, DebugFlags::AUDIT | DebugFlags::CONTENTS, false).unwrap();
        let mut slot = std::vec![0u8; layout.slot_size];
        let addr = 0xffff_8000_0010_0040;
        layout.set_state(&mut slot, addr, STATE_ALLOCATED);
        assert_eq!(layout.object_state(&slot, addr), ObjectState::Allocated);
        layout.set_state(&mut slot, addr, STATE_FREE);
        assert_eq!(layout.object_state(&slot, addr), ObjectState::Free);
        // The same word seen from another address is not a valid state.
        assert!(matches!(
            layout.object_state(&slot, addr + 64),
            ObjectState::Corrupt(_)
        ));
        let record = AuditRecord {
            timestamp: 77,
            cpu: 3,
            nr_frames: 2,
            frames: [1, 2, 0, 0, 0, 0, 0, 0],
        };
        layout.set_audit(&mut slot, true, &record);
        let (alloc, free) = layout.audit(&slot).unwrap();
        assert!(!alloc.is_recorded());
        assert_eq!(free, record);
        assert_eq!(free.frames(), &[1, 2]);
        slot[..24].copy_from_slice(&[7u8; 24]);
        layout.save_contents(&mut slot);
        let contents = layout.contents(&slot).unwrap();
        assert_eq!(&contents[..24], &[7u8; 24]);
        assert_eq!(&contents[24..], &[0u8; 8]);
    }
}
