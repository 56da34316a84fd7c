//! The debug trailer of an object of a debug cache: the fill patterns
//! (poison, redzone), the state word, the audit records and the saved
//! contents, where each sits ([`DebugLayout`]) and how it is read and
//! written. See the module docs of [`crate::debug`] for the layout.

use crate::flags::DebugFlags;
use crate::platform::Platform;

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
/// Eight `REDZONE_BYTE`s, for word-wise fills and checks.
const REDZONE_BYTES_WORD: u64 = u64::from_ne_bytes([REDZONE_BYTE; 8]);
/// State word of an object with a caller: its address XOR this (illumos
/// `KMEM_BUFTAG_ALLOC`).
pub const STATE_ALLOCATED: u64 = 0xa110_c8ed;
/// State word of a free object: its address XOR this (illumos
/// `KMEM_BUFTAG_FREE`).
pub const STATE_FREE: u64 = 0xf4ee_f4ee;

/// Where a checked region differs from its pattern: the offset of the
/// first differing 8-byte word from the object start (illumos reports
/// words), the pattern's word and what was found there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mismatch {
    /// Byte offset from the object start of the first bad word (or, for a
    /// redzone, of the first bad byte).
    pub offset: usize,
    /// The pattern at that offset (little-endian word).
    pub expected: u64,
    /// What was there instead.
    pub found: u64,
}

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

// ---------------------------------------------------------------------------
// Layout of a debug object
// ---------------------------------------------------------------------------

/// Return addresses kept per audit record.
pub const AUDIT_FRAMES: usize = 8;
/// Bytes of a freed object kept with `CONTENTS`.
pub const CONTENTS_BYTES: usize = 32;

/// One transaction on an object (illumos `kmem_bufctl_audit_t`, trimmed):
/// who allocated or freed it, where and when.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(C)]
pub struct AuditRecord {
    /// [`Platform::now`] at the transaction; 0: no transaction yet.
    pub timestamp: u64,
    /// The CPU that did it.
    pub cpu: u32,
    /// Valid entries of `frames`.
    pub nr_frames: u32,
    /// Return addresses, innermost first ([`PlatformHooks::backtrace`](crate::PlatformHooks::backtrace)).
    pub frames: [usize; AUDIT_FRAMES],
}

const _: () = assert!(core::mem::size_of::<AuditRecord>() == 80);

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

    /// Whether a transaction was recorded.
    pub fn is_recorded(&self) -> bool {
        self.timestamp != 0
    }

    /// The captured return addresses, innermost first.
    pub fn frames(&self) -> &[usize] {
        &self.frames[..(self.nr_frames as usize).min(AUDIT_FRAMES)]
    }
}

/// Where the parts of a debug object slot are (bytes from the object
/// start). Plain caches have no debug layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DebugLayout {
    pub(crate) flags: DebugFlags,
    /// The object's size (the cache's object size).
    pub(crate) obj_size: usize,
    /// Whether free objects are poisoned (`POISON` and no constructor).
    pub(crate) poison: bool,
    /// Redzone: `[requested size, redzone_end)` (the requested size is
    /// the object size but for kmalloc); empty without `REDZONE`.
    pub(crate) redzone_end: usize,
    pub(crate) state_offset: usize,
    /// Where the slab free list's link of a free object lives.
    pub(crate) freeptr_offset: usize,
    /// `REDZONE`: the bytes the caller asked for (Linux `orig_size`): a
    /// kmalloc's requested size, so the redzone starts right after it and
    /// catches an overflow into the size class's padding.
    pub(crate) size_offset: Option<usize>,
    /// `AUDIT`: last alloc at this offset, last free right after it.
    pub(crate) audit_offset: Option<usize>,
    pub(crate) contents_offset: Option<usize>,
    /// Bytes the slot needs from the object start (before rounding up to
    /// the alignment).
    pub(crate) slot_size: usize,
    /// `REDZONE`: bytes before the object (the alignment, at least 8),
    /// whose last word is the left redzone (`LEFT_REDZONE_PATTERN`):
    /// an underflow is caught as an overflow is. Objects start this far
    /// into their slab; 0 without `REDZONE`.
    pub(crate) left: usize,
}

impl DebugLayout {
    /// The layout of a cache of `obj_size`-byte objects with `flags`
    /// (`None` if it has no debug flag). `has_ctor`: constructed caches
    /// are not poisoned.
    pub(crate) fn new(obj_size: usize, flags: DebugFlags, has_ctor: bool) -> Option<DebugLayout> {
        if flags.is_empty() {
            return None;
        }
        let flags = flags | DebugFlags::CONSISTENCY;
        let aligned = obj_size.next_multiple_of(8);
        let redzone_end = if flags.contains(DebugFlags::REDZONE) {
            aligned + 8
        } else {
            obj_size
        };
        let state_offset = redzone_end.next_multiple_of(8);
        let freeptr_offset = state_offset + 8;
        let mut end = freeptr_offset + 8;
        let size_offset = flags.contains(DebugFlags::REDZONE).then(|| {
            let at = end;
            end += 8;
            at
        });
        let audit_offset = flags.contains(DebugFlags::AUDIT).then(|| {
            let at = end;
            end += 2 * core::mem::size_of::<AuditRecord>();
            at
        });
        let contents_offset = flags.contains(DebugFlags::CONTENTS).then(|| {
            let at = end;
            end += CONTENTS_BYTES;
            at
        });
        Some(DebugLayout {
            flags,
            obj_size,
            poison: flags.contains(DebugFlags::POISON) && !has_ctor,
            redzone_end,
            state_offset,
            freeptr_offset,
            size_offset,
            audit_offset,
            contents_offset,
            slot_size: end,
            left: if flags.contains(DebugFlags::REDZONE) {
                8
            } else {
                0
            },
        })
    }

    /// This layout for objects aligned to `align`: the left redzone's
    /// bytes keep objects aligned.
    pub(crate) fn aligned(mut self, align: usize) -> DebugLayout {
        if self.left != 0 {
            self.left = align.max(8);
        }
        self
    }

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

/// What a debug object's state word says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ObjectState {
    /// With a caller.
    Allocated,
    /// In a magazine, the depot or its slab.
    Free,
    /// Neither: the word was overwritten (it holds this value).
    Corrupt(u64),
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
