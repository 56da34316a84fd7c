//! The flags of a cache, defined once: [`DebugFlags`] (the five debug
//! bits, `magpie_slab::debug::DebugFlags`) and [`CacheFlags`] (creation
//! flags: `NOTOUCH`, `NOTRACE` and the same five debug bits, taken from
//! `DebugFlags`). Imports nothing.

bitflags::bitflags! {
    /// Debug flags of a cache: the debugging subset of
    /// [`CacheFlags`], with the same bit values (the
    /// debug bits are defined here; `CacheFlags` takes them from here).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct DebugFlags: u32 {
        /// Keep the last alloc and last free of every object (CPU,
        /// timestamp, stack) for reports and `whatis` (Linux `U`, illumos
        /// `KMF_AUDIT`).
        const AUDIT = 4;
        /// Fill free objects with `POISON_FREE` and check it when they
        /// are handed out again: a write after free is reported (Linux `P`,
        /// illumos `KMF_DEADBEEF`). Not applied to caches with a
        /// constructor.
        const POISON = 8;
        /// Guard bytes after every object, checked on free and by verify:
        /// a linear overflow is reported (Linux `Z`, illumos `KMF_REDZONE`).
        const REDZONE = 16;
        /// Keep the first `CONTENTS_BYTES` (32) bytes of a freed object for
        /// the report (illumos `KMF_CONTENTS`; Magpie letter `C`).
        const CONTENTS = 32;
        /// Consistency checks: the state word (exact duplicate-free
        /// detection) and full checks of frees (Linux `F`). Implied by
        /// every other debug flag.
        const CONSISTENCY = 64;
    }
}

bitflags::bitflags! {
    /// Flags given to [`Kmem::cache_create`](crate::Kmem::cache_create).
    ///
    /// The five debug bits take effect with feature `debug`; without it
    /// they are accepted and ignored (as Linux without
    /// `CONFIG_SLUB_DEBUG` ignores `slub_debug=`): the cache is a plain
    /// one, and [`KmemCache::debug_flags`](crate::KmemCache::debug_flags)
    /// says so (empty).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct CacheFlags: u32 {
        /// Never touch object memory (the source's pages may not be
        /// memory): always use bufctl slabs, no free list in the objects.
        const NOTOUCH = 1;
        /// Refuse tracing (all bootstrap caches are NOTRACE).
        const NOTRACE = 2;
        /// Keep every object's last alloc and last free (CPU, time,
        /// stack) in its debug trailer, for reports and `whatis` (illumos
        /// `KMF_AUDIT`, Linux `U`). Like every debug flag it makes the
        /// cache a debug cache: every alloc and free goes out of line,
        /// every double free is detected (see [`crate::debug`]).
        const AUDIT = DebugFlags::AUDIT.bits();
        /// Poison free objects with `0xdeadbeef` and check it when they
        /// are handed out: writes after free are reported (illumos
        /// `KMF_DEADBEEF`, Linux `P`). Not for caches with a constructor.
        const POISON = DebugFlags::POISON.bits();
        /// A redzone after every object, checked on free and by verify:
        /// linear overflows are reported (illumos `KMF_REDZONE`, Linux `Z`).
        const REDZONE = DebugFlags::REDZONE.bits();
        /// Keep the first bytes of a freed object for the report (illumos
        /// `KMF_CONTENTS`).
        const CONTENTS = DebugFlags::CONTENTS.bits();
        /// The consistency checks alone: the state word that catches every
        /// double free, and full checks of frees (Linux `F`).
        const CONSISTENCY = DebugFlags::CONSISTENCY.bits();
    }
}

impl CacheFlags {
    /// The debug flags among these.
    pub fn debug(self) -> DebugFlags {
        DebugFlags::from_bits_truncate(self.bits())
    }

    /// The cache flags of these debug flags (same bits).
    pub fn from_debug(flags: DebugFlags) -> CacheFlags {
        CacheFlags::from_bits_truncate(flags.bits())
    }
}
