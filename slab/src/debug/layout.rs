//! Where each part of a debug object's slot sits ([`DebugLayout`], made
//! once per cache at creation), the fill patterns and the state words,
//! and the audit record's shape. How the slot is read, written and
//! checked is `object.rs`'s (the one file a debug alloc or free goes
//! through). See the module docs of [`crate::debug`] for the layout.

use crate::flags::DebugFlags;

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
    /// [`Platform::now`](crate::Platform::now) at the transaction; 0: no transaction yet.
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
}
