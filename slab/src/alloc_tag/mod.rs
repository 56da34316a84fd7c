//! Allocation profiling support (feature `alloc-profiling`): every object a
//! caller holds remembers, in 4 bytes, the allocation tag it was charged to
//! (Linux's `slabobj_ext` code-tag reference), so that its free uncharges
//! the same tag wherever and on whichever CPU it happens.
//!
//! The allocator knows nothing of tags beyond these 4 bytes; the platform
//! names the tag of an allocation ([`AllocTagHooks::current`](crate::AllocTagHooks::current), or the
//! caller does through `alloc_tagged` / `KmallocArgs::tag`) and keeps the
//! counters ([`AllocTagHooks::add`](crate::AllocTagHooks::add), [`AllocTagHooks::sub`](crate::AllocTagHooks::sub)).
//!
//! Where the reference lives:
//!
//! - **small-object slabs**: a per-slab **tag side array** of one
//!   `Option<AllocTagRef>` per object (`nr_objs * 4` bytes), after Linux's
//!   `alloc_slab_obj_exts` (mm/slub.c). The slab header's `tags` pointer
//!   names a shared all-`None` array (`NO_TAGS`, never written, so a free
//!   reads its object's slot without testing) until the first tagged
//!   allocation from the slab, which allocates the slab's own array
//!   (zeroed: every object `None`) from the bootstrap cache
//!   `kmem_tags_<bytes>` of the next size up (32, 48, 64, 96, … 1536,
//!   2048 bytes) and installs it with a compare-exchange; a CPU that
//!   loses the race frees its copy and uses the winner's. The array goes
//!   back with the slab (`destroy_slab`). So the slab layout is the same
//!   with the feature and without (kmalloc-8 holds 496 objects per page
//!   either way), and a slab that never held a tagged object costs
//!   nothing. An object's slot is at the object's index, the high word of
//!   `offset * ceil(2^64 / stride)` — the multiply that also checks frees;
//! - **bufctl slabs**: an `Option<AllocTagRef>` in the object's bufctl (it
//!   fits in padding: no extra bytes);
//! - **page-granular kmalloc**: the upper 32 bits of the first page's
//!   page-map entry (no extra bytes; 0 is `None`).
//!
//! `None` means "no tag" (allocated while profiling was off): its free
//! uncharges nothing, so no counter underflows. A free object's reference
//! is always `None` (frees clear it), so an object allocated while
//! profiling is off needs no store at all, and profiling switched on late
//! finds the untagged objects of older slabs `None` in the array their
//! first tagged neighbour installs.
//!
//! **No recursion**: the side-array caches are bootstrap caches, whose
//! objects are never tagged, so allocating a side array never needs
//! another one; it is allocated after the magazine hit, with no lock held
//! and interrupts on (lock order: like any metadata allocation).
//! **Never a failure caused by profiling**: if the side array cannot be
//! allocated, the object is still handed out, untagged and uncharged
//! (its free uncharges nothing), and the miss is counted
//! ([`AllocProfiling::nr_tag_array_misses`](crate::AllocProfiling::nr_tag_array_misses)).
//!
//! The runtime switch: [`AllocProfiling::set_enabled`](crate::AllocProfiling::set_enabled)
//! sets or clears `PROFILING` in every cache's `hot_flags` (new caches
//! inherit it); a kernel calls it whenever its own switch flips. Setting
//! it also sets `TAGGED` (in the same atomic update) on small-slab caches
//! (not bootstrap ones), so the profiled alloc tests no flag; clearing it
//! leaves `TAGGED` (objects may still carry references). Set, the alloc
//! goes to the out-of-line profiled path, which asks `AllocTagHooks::current()`
//! after the magazine hit; clear, no tag is asked for (explicit tags are
//! ignored too) and the object gets no reference.
//!
//! Costs (callgrind, 64-byte `GlobalAlloc` pair on the host bench, see
//! docs/BENCHMARKS.md): compiled out, nothing (no code, no bytes).
//! Compiled in but off: nothing per alloc (the bit is in the word the hit
//! tests anyway), and no memory (no side array is allocated); per free,
//! `TAGGED` is one more bit of the one `FREE_SLOW` mask test, and a cache
//! that has been profiled sends its frees one tail call away. On: a tail
//! call to the profiled path, `AllocTagHooks::current_token()` (a per-CPU
//! load and its `None` test), the slab header (masking the address for a
//! one-page slab with its header at its end, else the page map), its
//! side-array pointer compared with `NO_TAGS`, a multiply, the charge
//! (`AllocTagHooks::charge`) and a 4-byte store per alloc; a tail call
//! with the index in a register, the side-array pointer, the slot's
//! load, test and clear and `AllocTagHooks::uncharge` per free (23 + 15
//! instructions on the host bench's 64-byte `GlobalAlloc` pair: see
//! docs/BENCHMARKS.md). Memory: 4 bytes per object of every small slab
//! that ever held a tagged object, rounded up to the side-array cache's
//! size (`MetadataStats::tag_array_bytes`).
//!
//! **Charge tokens.** What a slot (or a bufctl, or a page-granular
//! block's page-map entry) holds is the platform's token for the tag
//! ([`AllocTagHooks::token`](crate::AllocTagHooks::token), [`AllocTagHooks::current_token`](crate::AllocTagHooks::current_token)),
//! checked once when made; the tag closures of the alloc paths return
//! tokens ([`current`], [`explicit`]), and only those reach the `unsafe`
//! [`AllocTagHooks::charge`](crate::AllocTagHooks::charge) and
//! [`AllocTagHooks::uncharge`](crate::AllocTagHooks::uncharge). A free object's slot is `None`.

#[cfg(feature = "alloc-profiling")]
use core::ptr::NonNull;

use crate::platform::Platform;

mod control;

pub use control::AllocProfiling;

/// A reference from an object to its allocation tag (in `magpie-codetag`:
/// the tag's index in its section plus one; the same type). Never 0: "no
/// tag" is `None`, and an `Option<AllocTagRef>` is 4 bytes, 0 for `None`
/// (what a free object's slot holds).
pub type AllocTagRef = core::num::NonZeroU32;

/// Bytes of tag reference per object of a small slab, in its side array.
#[cfg(feature = "alloc-profiling")]
pub(crate) const TAG_REF_BYTES: usize = core::mem::size_of::<Option<AllocTagRef>>();

const _: () = assert!(core::mem::size_of::<Option<AllocTagRef>>() == 4);

/// The side array of every slab that has none of its own yet: a slot of
/// `None` for each object of any slab, never written (a free writes a
/// slot only to clear a `Some`). So the profiled free reads an object's
/// slot without testing for a side array (`None`: nothing to uncharge);
/// the profiled alloc compares with [`no_tags`] to know it must install
/// one. In a read-only section: a stray write faults.
#[cfg(feature = "alloc-profiling")]
static NO_TAGS: [Option<AllocTagRef>; crate::layout::geometry::MAX_SMALL_OBJS] =
    [None; crate::layout::geometry::MAX_SMALL_OBJS];

/// [`NO_TAGS`] as a slab header's `tags` pointer ("no side array yet").
#[cfg(feature = "alloc-profiling")]
#[inline(always)]
pub(crate) fn no_tags() -> *mut Option<AllocTagRef> {
    // Never written through (see NO_TAGS).
    NO_TAGS.as_ptr().cast_mut()
}

/// A charge off the profiled hits: the platform's charge
/// ([`AllocTagHooks::charge`](crate::AllocTagHooks::charge)), then its hook
/// ([`AllocTagHooks::on_charge`](crate::AllocTagHooks::on_charge)).
///
/// # Safety
/// As for [`AllocTagHooks::charge`](crate::AllocTagHooks::charge): `token` is a charge token.
#[cfg(feature = "alloc-profiling")]
#[inline]
pub(crate) unsafe fn charge_off_hit<P: Platform>(
    token: AllocTagRef,
    ptr: NonNull<u8>,
    bytes: usize,
) {
    // SAFETY: per our caller.
    unsafe { P::charge(token, ptr, bytes) };
    P::on_charge(token, ptr, bytes);
}

/// An uncharge off the profiled free hit: the platform's hook
/// ([`AllocTagHooks::on_uncharge`](crate::AllocTagHooks::on_uncharge)), then its uncharge
/// ([`AllocTagHooks::uncharge`](crate::AllocTagHooks::uncharge)).
///
/// # Safety
/// As for [`AllocTagHooks::uncharge`](crate::AllocTagHooks::uncharge): the object's charge token,
/// not uncharged since.
#[cfg(feature = "alloc-profiling")]
#[inline]
pub(crate) unsafe fn uncharge_off_hit<P: Platform>(
    token: AllocTagRef,
    ptr: NonNull<u8>,
    bytes: usize,
) {
    P::on_uncharge(token, ptr, bytes);
    // SAFETY: per our caller.
    unsafe { P::uncharge(token, ptr, bytes) };
}

/// The charge token of the tag to charge an allocation made now
/// ([`AllocTagHooks::current_token`](crate::AllocTagHooks::current_token); `None` when profiling is
/// compiled out or the platform says none). Every tag closure of the
/// alloc paths returns a token: this one, or [`explicit`]'s.
#[inline(always)]
pub(crate) fn current<P: Platform>() -> Option<AllocTagRef> {
    if cfg!(feature = "alloc-profiling") {
        P::current_token()
    } else {
        None
    }
}

/// The charge token of an explicit tag (`alloc_tagged`,
/// `KmallocArgs::tag`): checked once by [`AllocTagHooks::token`](crate::AllocTagHooks::token)
/// (`None`: charge nothing; always without the feature).
#[inline(always)]
pub(crate) fn explicit<P: Platform>(tag: Option<AllocTagRef>) -> Option<AllocTagRef> {
    if cfg!(feature = "alloc-profiling") {
        tag.and_then(P::token)
    } else {
        None
    }
}
