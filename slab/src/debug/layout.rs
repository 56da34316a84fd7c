//! Where each part of a debug object's slot sits ([`DebugLayout`], made
//! once per cache at creation), and the shapes of what a check finds
//! ([`Mismatch`], [`AuditRecord`], `ObjectState`), which error reports
//! carry with or without feature `debug`. How the slot is filled and
//! checked is `object.rs`'s (feature `debug`: the one file a debug alloc
//! or free goes through). See the module docs of [`crate::debug`] for
//! the layout.

use crate::flags::DebugFlags;

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
    /// Without feature `debug` no cache has a debug layout: this field
    /// makes the type uninhabited, so every debug branch is dead code.
    #[cfg(not(feature = "debug"))]
    pub(crate) off: core::convert::Infallible,
}

impl DebugLayout {
    /// Without feature `debug`: no layout (the debug bits are ignored).
    #[cfg(not(feature = "debug"))]
    pub(crate) fn new(obj_size: usize, flags: DebugFlags, has_ctor: bool) -> Option<DebugLayout> {
        let _ = (obj_size, flags, has_ctor);
        None
    }

    /// The layout of a cache of `obj_size`-byte objects with `flags`
    /// (`None` if it has no debug flag). `has_ctor`: constructed caches
    /// are not poisoned.
    #[cfg(feature = "debug")]
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

/// What a debug object's state word says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(
    not(feature = "debug"),
    expect(
        dead_code,
        reason = "read by the walkers; made by `object.rs` (feature `debug`)"
    )
)]
pub(crate) enum ObjectState {
    /// With a caller.
    Allocated,
    /// In a magazine, the depot or its slab.
    Free,
    /// Neither: the word was overwritten (it holds this value).
    Corrupt(u64),
}

/// What a debug object's trailer holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DebugObjectInfo {
    pub(crate) state: ObjectState,
    pub(crate) last_alloc: Option<AuditRecord>,
    pub(crate) last_free: Option<AuditRecord>,
    pub(crate) contents: Option<[u8; crate::debug::CONTENTS_BYTES]>,
}
