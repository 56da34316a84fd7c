//! Slab debugging: the per-cache debug flags, the boot-line syntax that
//! switches them on (`slab_debug=` after Linux, `kmem_flags=` after
//! illumos), the patterns freed and allocated objects are filled with, the
//! layout of a debug object's trailer, the audit record of a transaction,
//! and the hardened (obfuscated) free-list pointer.
//!
//! Feature `debug`: with it off, only the flags, the shapes reports
//! carry ([`AuditRecord`], [`Mismatch`]) and the [`SlabDebug`] handle's
//! error ring, hooks and walkers stay; the debug bits of
//! [`CacheFlags`](crate::CacheFlags) are ignored (as Linux without
//! `CONFIG_SLUB_DEBUG` ignores `slub_debug=`).
//!
//! This module holds the mechanisms only; the cold alloc and free paths of
//! a debug cache use them, and [`report`](crate::reports) turns what they
//! find into an illumos-style report.
//!
//! ## A debug object
//!
//! A cache with any [`DebugFlags`] lays each object slot out as (offsets
//! from the object start, in bytes; see `DebugLayout`):
//!
//! ```text
//! [0, size)            the object; while free: POISON_FREE (0xdeadbeef…)
//! [req, align8(size))  REDZONE: REDZONE_BYTE (0xbb) from the requested size
//!                      (`req`: a kmalloc's size, else `size`) to the word
//! +8                   REDZONE: one word of REDZONE_PATTERN (0xfeedface…)
//! state (8)            object address ^ STATE_ALLOCATED / STATE_FREE
//! free pointer (8)     the slab's free-list link while the object is free
//! requested size (8)   REDZONE: `req` (Linux `orig_size`)
//! audit (2 × 80)       AUDIT: last alloc and last free (CPU, time, stack)
//! contents (32)        CONTENTS: the first bytes of the object at its free
//! ```
//!
//! With the requested size, a kmalloc(100) served by `kmalloc-104` has
//! its redzone from byte 100: an overflow into the size class's padding is
//! a redzone violation, as with Linux `slab_debug=Z` on kmalloc caches.
//! A block kept by `krealloc` / `GlobalAlloc::realloc` in place moves its
//! redzone to the new size; `Allocator::allocate` hands out (and moves the
//! redzone to) the whole usable size. Fills and checks go a word at a time.
//!
//! The state word is illumos' `bt_bxstat`: a free of an object whose state
//! is already free is a duplicate free, exactly, wherever the first free
//! went (magazine, depot or slab). A state that is neither value means the
//! trailer was overwritten (an overflow past the redzone).
//!
//! As in Linux (`calculate_sizes`), caches with a constructor are not
//! poisoned: their free objects must stay constructed.
//!
//! ## Sources
//!
//! - illumos `usr/src/uts/common/os/kmem.c` and `sys/kmem_impl.h`
//!   (`KMF_AUDIT` 0x1, `KMF_DEADBEEF` 0x2, `KMF_REDZONE` 0x4,
//!   `KMF_CONTENTS` 0x8; `KMEM_FREE_PATTERN`, `KMEM_UNINITIALIZED_PATTERN`,
//!   `KMEM_REDZONE_PATTERN`, `KMEM_REDZONE_BYTE`; the buftag).
//! - Linux `mm/slub.c` (`slab_debug=` letters F, Z, P, U; `freelist_ptr`
//!   of `CONFIG_SLAB_FREELIST_HARDENED`: pointer XOR a per-cache random
//!   XOR the byte-swapped address the pointer is stored at).

use core::fmt;

mod layout;
// Feature `debug`: the checks of a debug object and a debug cache's
// hooks; off, no debug layout, the alloc and free hooks' calls compiled
// out and empty inline stubs for the rest (`off.rs`).
#[cfg(feature = "debug")]
mod config;
#[cfg(feature = "debug")]
mod object;
#[cfg(not(feature = "debug"))]
mod off;

mod control;

#[cfg(feature = "debug")]
pub use config::{SlabDebugConfig, SlabDebugError};
pub use control::SlabDebug;

pub use crate::flags::DebugFlags;

impl DebugFlags {
    /// What a bare `slab_debug` (no value, or no letters) turns on, as in
    /// Linux: `F`, `Z`, `P`, `U`.
    pub const DEFAULT: DebugFlags = DebugFlags::CONSISTENCY
        .union(DebugFlags::REDZONE)
        .union(DebugFlags::POISON)
        .union(DebugFlags::AUDIT);

    /// The flags as `slab_debug=` letters (`-` for none), e.g. `FZPU`.
    pub fn letters(self) -> impl fmt::Display {
        Letters(self)
    }
}

/// [`DebugFlags`] shown as `slab_debug=` letters.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Letters(DebugFlags);

/// The `slab_debug=` letters and their flags, in Linux's order.
const LETTERS: [(char, DebugFlags); 5] = [
    ('F', DebugFlags::CONSISTENCY),
    ('Z', DebugFlags::REDZONE),
    ('P', DebugFlags::POISON),
    ('U', DebugFlags::AUDIT),
    ('C', DebugFlags::CONTENTS),
];

impl fmt::Display for Letters {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("-");
        }
        for (letter, flag) in LETTERS {
            if self.0.contains(flag) {
                write!(f, "{letter}")?;
            }
        }
        Ok(())
    }
}

pub(crate) use layout::ObjectState;
pub(crate) use layout::{AUDIT_FRAMES, CONTENTS_BYTES, DebugLayout};
pub use layout::{AuditRecord, Mismatch};
#[cfg(all(test, not(loom)))]
pub(crate) use object::{LEFT_REDZONE_PATTERN, POISON_UNINITIALIZED};
#[cfg(test)]
pub(crate) use object::{POISON_FREE, REDZONE_PATTERN};
