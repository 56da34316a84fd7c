//! Allocation tags: the first application of code tags (Linux
//! `include/linux/alloc_tag.h`, `lib/alloc_tag.c`).
//!
//! An [`AllocTag`] is a [`CodeTag`] for one allocation call site, placed in
//! the [`ALLOC_TAGS`] section. Its live `bytes` and `calls` are kept apart
//! from the tag, in per-CPU [`AllocTagCounters`]: one block per CPU with
//! the counters of every tag, each block cache-line aligned, so an
//! allocation writes only its own CPU's lines. Readers sum over CPUs.
//!
//! Objects name their tag with a 4-byte [`AllocTagRef`] (a `NonZeroU32`):
//! the tag's index in the section plus one. "No tag" (allocated while
//! profiling was off) is `None`, and an `Option<AllocTagRef>` is still 4
//! bytes (0 for `None`): freeing such an object subtracts nothing, so
//! counters never underflow. The catch-all [`UNTAGGED`] tag lives in the
//! section too and is printed like any other site.
//!
//! The update paths: a platform keeps each CPU's counter base
//! ([`AllocTagCounters::cpu_base`]) in its per-CPU area (a kernel: a
//! `%gs`-relative word; a host: a thread-local) and counts with
//! [`AllocTagCounters::add_at`] / [`AllocTagCounters::sub_at`]: one compare
//! of the reference against the number of tags, then one `add` to the
//! bytes and one `inc` of the calls at `base + ref * 16` — Linux's
//! `this_cpu_add` on `tag->counters`.
//!
//! [`ProfilingSwitch`] is the runtime on/off/never switch
//! (`mem_profiling=0|1|never`); the allocator asks its platform for the
//! current tag and gets 0 while the switch is off.
//!
//! ```
//! # use magpie_codetag::alloc_tag::AllocTag;
//! # fn kmalloc_tagged(_size: usize, _align: usize, _tag: impl Copy) {}
//! let here: &'static AllocTag = magpie_codetag::alloc_tag!();
//! kmalloc_tagged(64, 8, here.tag_ref()); // magpie-slab's Kmem::kmalloc_with(KmallocArgs::new(64, 8).tag(..))
//! ```

use core::fmt;
use core::ptr::NonNull;
use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicU8, AtomicU64, AtomicUsize, Ordering};

use crate::{CodeTag, CodeTagFlags, TaggedWith, codetag_section};

/// Reference from an object to its tag: index in [`ALLOC_TAGS`] plus one,
/// never 0 (`Option<AllocTagRef>` is "maybe no tag", still four bytes per
/// object). The same type as `magpie_slab::AllocTagRef`.
pub type AllocTagRef = core::num::NonZeroU32;

/// One allocation call site.
#[derive(Debug)]
pub struct AllocTag {
    /// Where the allocation happens.
    pub tag: CodeTag,
}

impl TaggedWith for AllocTag {
    fn codetag(&self) -> &CodeTag {
        &self.tag
    }
}

codetag_section!(
    /// Every allocation tag, walkable as a slice.
    pub static ALLOC_TAGS: [AllocTag]
);

/// Flag of the [`UNTAGGED`] bucket's code tag.
pub const UNTAGGED_FLAG: CodeTagFlags = CodeTagFlags(1 << 8);

/// The bucket for allocations made with profiling on but outside any tagged
/// site or scope. Printed as `untagged:0 func:untagged`.
#[linkme::distributed_slice(ALLOC_TAGS)]
#[linkme(crate = linkme)]
pub static UNTAGGED: AllocTag = AllocTag {
    tag: CodeTag {
        module: "",
        file: "untagged",
        line: 0,
        flags: UNTAGGED_FLAG,
        function_path: untagged_name,
    },
};

fn untagged_name() -> &'static str {
    "untagged"
}

impl AllocTag {
    /// Every allocation tag of the program, in section order.
    pub fn all() -> &'static [AllocTag] {
        ALLOC_TAGS.static_slice()
    }

    /// This tag's reference (index in the section plus one).
    #[inline]
    pub fn tag_ref(&'static self) -> AllocTagRef {
        let base = ALLOC_TAGS.static_slice().as_ptr() as usize;
        let offset = (self as *const AllocTag as usize).wrapping_sub(base);
        // Division by a constant: a multiply and a shift.
        AllocTagRef::MIN.saturating_add((offset / core::mem::size_of::<AllocTag>()) as u32)
    }

    /// The tag a reference names; `None` for a reference past the end.
    pub fn from_ref(tag_ref: AllocTagRef) -> Option<&'static AllocTag> {
        ALLOC_TAGS.static_slice().get(tag_ref.get() as usize - 1)
    }

    /// Whether this is the [`UNTAGGED`] bucket.
    pub fn is_untagged(&self) -> bool {
        self.tag.flags.contains(UNTAGGED_FLAG)
    }
}

/// Number of tags in the section (the length of each CPU's counter block).
pub fn nr_alloc_tags() -> usize {
    ALLOC_TAGS.static_slice().len()
}

/// Defines an [`AllocTag`] for the place where it is written and evaluates
/// to `&'static AllocTag`. `alloc_tag!()` is flagged
/// [`CodeTagFlags::EXPLICIT`]; `alloc_tag!(flags)` chooses.
#[macro_export]
macro_rules! alloc_tag {
    () => {
        $crate::alloc_tag!($crate::CodeTagFlags::EXPLICIT)
    };
    ($flags:expr) => {{
        #[$crate::linkme::distributed_slice($crate::alloc_tag::ALLOC_TAGS)]
        #[linkme(crate = $crate::linkme)]
        static __ALLOC_TAG: $crate::alloc_tag::AllocTag = $crate::alloc_tag::AllocTag {
            tag: $crate::codetag!($flags),
        };
        &__ALLOC_TAG
    }};
}

/// One tag's counters on one CPU. `bytes` may wrap below zero on a CPU that
/// frees more than it allocated; only the sum over CPUs is meaningful.
#[repr(C)]
pub(crate) struct TagCounter {
    pub(crate) bytes: AtomicU64,
    pub(crate) calls: AtomicU64,
}

const CACHE_LINE: usize = 64;

/// A tag's live bytes and calls summed over CPUs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AllocTagCounts {
    /// Bytes of live objects allocated at the site.
    pub bytes: u64,
    /// Live objects allocated at the site (allocations minus frees).
    pub calls: u64,
}

/// Per-CPU counters of every allocation tag.
///
/// Layout: `nr_cpus` blocks, each `nr_tags` counters of 16 bytes rounded up
/// to a cache line; CPU `c`'s counter of tag `r` is at
/// `c * block_len + (r - 1)`. Updates are relaxed atomic adds on the
/// running CPU's block only (uncontended; atomic so that an interrupt
/// allocating on the same CPU cannot lose an update), so no cache line is
/// shared between CPUs on the allocation path. Until
/// [`AllocTagCounters::init`] gives it memory, updates go nowhere; the
/// platform should report profiling off until then, so that no object
/// carries a tag whose addition was lost.
pub struct AllocTagCounters {
    pub(crate) blocks: AtomicPtr<TagCounter>,
    pub(crate) nr_cpus: AtomicUsize,
    /// `nr_cpus - 1`: the block an out-of-range CPU id shares.
    last_cpu: AtomicUsize,
    /// Counters per CPU block (nr_tags rounded up to a cache line).
    block_len: AtomicUsize,
    /// `block_len` in bytes (the update paths' CPU stride).
    pub(crate) block_bytes: AtomicUsize,
    /// Number of tags; 0 until [`AllocTagCounters::init`] published the
    /// memory (stored last, with release), so that one compare of a tag
    /// index against it both rejects a bad reference and tells whether
    /// the counters have memory.
    pub(crate) nr_tags: AtomicUsize,
}

impl Default for AllocTagCounters {
    fn default() -> Self {
        Self::new()
    }
}

impl AllocTagCounters {
    /// Counters with no memory yet; usable in a `static`.
    pub const fn new() -> Self {
        Self {
            blocks: AtomicPtr::new(core::ptr::null_mut()),
            nr_cpus: AtomicUsize::new(0),
            last_cpu: AtomicUsize::new(0),
            block_len: AtomicUsize::new(0),
            block_bytes: AtomicUsize::new(0),
            nr_tags: AtomicUsize::new(0),
        }
    }

    fn block_len_for(nr_tags: usize) -> usize {
        let per_line = CACHE_LINE / core::mem::size_of::<TagCounter>();
        nr_tags.max(1).next_multiple_of(per_line)
    }

    /// Bytes of memory [`AllocTagCounters::init`] needs for `nr_cpus` CPUs
    /// and every tag in the section.
    pub fn bytes_needed(nr_cpus: usize) -> usize {
        nr_cpus.max(1) * Self::block_len_for(nr_alloc_tags()) * core::mem::size_of::<TagCounter>()
    }

    /// Alignment [`AllocTagCounters::init`] needs.
    pub const ALIGN: usize = CACHE_LINE;

    /// Most tags the counters take (so that a charge token, a counter's
    /// byte offset, fits in 32 bits): [`AllocTagCounters::init`] refuses
    /// more.
    pub const MAX_TAGS: usize = (u32::MAX as usize) / core::mem::size_of::<TagCounter>();

    /// [`AllocTagCounters::init`] on memory the borrow checker vouches
    /// for: a `'static` exclusive slice is valid for the rest of the
    /// program and used by nothing else. Returns false, using nothing, as
    /// `init` does (already initialised, fewer than
    /// [`bytes_needed`](Self::bytes_needed) bytes, or the slice's start not
    /// aligned to [`ALIGN`](Self::ALIGN)).
    pub fn init_static(&self, memory: &'static mut [u8], nr_cpus: usize) -> bool {
        let len = memory.len();
        // SAFETY: a `'static mut` slice: valid for reads and writes of
        // `len` bytes for the rest of the program, and exclusively ours.
        unsafe { self.init(NonNull::from(memory).cast(), len, nr_cpus) }
    }

    /// Hands the counters their memory (zeroed here). Returns false, using
    /// nothing, if they already have memory or `len` is too small or the
    /// memory misaligned.
    ///
    /// # Safety
    /// `memory` is valid for reads and writes of `len` bytes for the rest
    /// of the program and used by nothing else.
    pub unsafe fn init(&self, memory: NonNull<u8>, len: usize, nr_cpus: usize) -> bool {
        let nr_cpus = nr_cpus.max(1);
        let nr_tags = nr_alloc_tags();
        if nr_tags > Self::MAX_TAGS
            || len < Self::bytes_needed(nr_cpus)
            || !(memory.as_ptr() as usize).is_multiple_of(Self::ALIGN)
            || !self.blocks.load(Ordering::Acquire).is_null()
        {
            return false;
        }
        // SAFETY: per the caller, `len` bytes at `memory` are ours; all-zero
        // bytes are valid atomics.
        unsafe { core::ptr::write_bytes(memory.as_ptr(), 0, len) };
        self.nr_cpus.store(nr_cpus, Ordering::Relaxed);
        self.last_cpu.store(nr_cpus - 1, Ordering::Relaxed);
        let block_len = Self::block_len_for(nr_tags);
        self.block_len.store(block_len, Ordering::Relaxed);
        self.block_bytes.store(
            block_len * core::mem::size_of::<TagCounter>(),
            Ordering::Relaxed,
        );
        self.blocks.store(memory.as_ptr().cast(), Ordering::Release);
        // Last: a non-zero nr_tags publishes everything above.
        self.nr_tags.store(nr_tags, Ordering::Release);
        crate::descriptor::register(self);
        true
    }

    /// Whether the counters have memory.
    pub fn is_ready(&self) -> bool {
        self.nr_tags.load(Ordering::Acquire) != 0
    }

    /// CPU `cpu`'s counter of `tag_ref`; `None` for a reference out of
    /// range or before [`AllocTagCounters::init`]. The update paths' only
    /// checks: one compare (`nr_tags` is 0 until the memory is published)
    /// and a conditional move clamping the CPU id.
    #[inline(always)]
    fn counter(&self, cpu: usize, tag_ref: AllocTagRef) -> Option<&TagCounter> {
        // SAFETY: a pointer from counter_ptr is valid for the program's
        // lifetime (see there).
        self.counter_ptr(cpu, tag_ref).map(|ptr| unsafe { &*ptr })
    }

    /// [`Self::counter`] as a raw pointer: `Option<*const _>` keeps its
    /// own discriminant, so the update paths test no pointer for null.
    /// The pointer, if any, is valid (and aligned) for the program's
    /// lifetime.
    #[inline(always)]
    fn counter_ptr(&self, cpu: usize, tag_ref: AllocTagRef) -> Option<*const TagCounter> {
        let index = tag_ref.get() as usize - 1;
        if index >= self.nr_tags.load(Ordering::Acquire) {
            return None;
        }
        let blocks = self.blocks.load(Ordering::Relaxed);
        // An out-of-range CPU id shares the last CPU's block (no division).
        let cpu = cpu.min(self.last_cpu.load(Ordering::Relaxed));
        let offset = cpu * self.block_bytes.load(Ordering::Relaxed);
        // SAFETY: nr_tags is non-zero, so (acquire, pairing with init's
        // release) init gave us nr_cpus blocks of block_len counters
        // (block_bytes bytes each) for the program's lifetime and blocks,
        // last_cpu and block_bytes are visible; cpu <= last_cpu < nr_cpus:
        // `offset` is the start of CPU `cpu`'s block.
        let block = unsafe { blocks.byte_add(offset) };
        // SAFETY: index < nr_tags <= block_len: inside that block.
        Some(unsafe { block.add(index) }.cast_const())
    }

    /// Counts a new object of `bytes` at `tag_ref`, on CPU `cpu`.
    #[inline]
    pub fn add(&self, cpu: usize, tag_ref: AllocTagRef, bytes: usize) {
        if let Some(counter) = self.counter(cpu, tag_ref) {
            counter.bytes.fetch_add(bytes as u64, Ordering::Relaxed);
            counter.calls.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// [`add`](Self::add) for the CPU the caller runs on, without a locked
    /// read-modify-write: Linux's `this_cpu_add`. On x86_64 each counter is
    /// bumped by one `add` instruction, which an interrupt on this CPU cannot
    /// split; other CPUs only read this CPU's block. Elsewhere it falls back
    /// to the atomic [`add`](Self::add).
    ///
    /// # Safety
    ///
    /// The caller runs on CPU `cpu` and nothing else writes that CPU's block
    /// concurrently: no other thread may call `add_local`/`sub_local` with
    /// the same `cpu` at the same time (a kernel without preemption, or with
    /// preemption disabled, satisfies this).
    #[inline]
    pub unsafe fn add_local(&self, cpu: usize, tag_ref: AllocTagRef, bytes: usize) {
        if let Some(counter) = self.counter_ptr(cpu, tag_ref) {
            // SAFETY: counter_ptr's pointers are valid; forwarded: only
            // this CPU writes its block.
            unsafe { local_update(counter, bytes as u64, true) };
        }
    }

    /// [`sub`](Self::sub) for the CPU the caller runs on; see
    /// [`add_local`](Self::add_local).
    ///
    /// # Safety
    ///
    /// As for [`add_local`](Self::add_local).
    #[inline]
    pub unsafe fn sub_local(&self, cpu: usize, tag_ref: AllocTagRef, bytes: usize) {
        if let Some(counter) = self.counter_ptr(cpu, tag_ref) {
            // SAFETY: counter_ptr's pointers are valid; forwarded: only
            // this CPU writes its block.
            unsafe { local_update(counter, bytes as u64, false) };
        }
    }

    /// CPU `cpu`'s counter base, for a platform to keep in its per-CPU
    /// area and hand to [`add_at`](Self::add_at) / [`sub_at`](Self::sub_at):
    /// the address such that tag reference `r`'s counter of that CPU is at
    /// `base + r * 16` (its block minus one counter). `None` before
    /// [`AllocTagCounters::init`] or for a CPU it has no block for.
    pub fn cpu_base(&self, cpu: usize) -> Option<usize> {
        if !self.is_ready() || cpu >= self.nr_cpus.load(Ordering::Relaxed) {
            return None;
        }
        let blocks = self.blocks.load(Ordering::Relaxed) as usize;
        let block = blocks + cpu * self.block_bytes.load(Ordering::Relaxed);
        Some(block - core::mem::size_of::<TagCounter>())
    }

    /// [`add_local`](Self::add_local) at a counter base the caller keeps
    /// per CPU: one compare of `tag_ref` against the number of tags (a bad
    /// reference counts nothing), then one `add` and one `inc` at
    /// `cpu_base + tag_ref * 16`. No CPU id, no multiply.
    ///
    /// # Safety
    ///
    /// `cpu_base` is [`cpu_base`](Self::cpu_base)`(cpu)` of these counters
    /// for the CPU `cpu` the caller runs on, and nothing else writes that
    /// CPU's block concurrently (as for [`add_local`](Self::add_local)).
    #[inline(always)]
    pub unsafe fn add_at(&self, cpu_base: usize, tag_ref: AllocTagRef, bytes: usize) {
        if let Some(offset) = self.counter_offset(tag_ref) {
            // SAFETY: per our caller (see counter_offset).
            unsafe { local_update_at(cpu_base, offset, bytes as u64, true) };
        }
    }

    /// [`sub_local`](Self::sub_local) at a counter base the caller keeps
    /// per CPU; see [`add_at`](Self::add_at).
    ///
    /// # Safety
    ///
    /// As for [`add_at`](Self::add_at).
    #[inline(always)]
    pub unsafe fn sub_at(&self, cpu_base: usize, tag_ref: AllocTagRef, bytes: usize) {
        if let Some(offset) = self.counter_offset(tag_ref) {
            // SAFETY: per our caller (see counter_offset).
            unsafe { local_update_at(cpu_base, offset, bytes as u64, false) };
        }
    }

    /// [`add_at`](Self::add_at), returning a **charge token**: the byte
    /// offset of `tag_ref`'s counter from a CPU's counter base (the same
    /// for every CPU), checked here once, so that the free's
    /// [`uncharge_at`](Self::uncharge_at) needs no check (an allocator
    /// stores the token with the object: `magpie-slab`'s
    /// `AllocTagHooks::charge`). `None`, counting nothing, for a bad
    /// reference (past the last tag, or before init).
    ///
    /// # Safety
    ///
    /// As for [`add_at`](Self::add_at).
    #[inline(always)]
    pub unsafe fn charge_at(
        &self,
        cpu_base: usize,
        tag_ref: AllocTagRef,
        bytes: usize,
    ) -> Option<AllocTagRef> {
        let token = self.token(tag_ref)?;
        // SAFETY: per our caller; a token of these counters.
        unsafe { self.charge_token_at(cpu_base, token, bytes) };
        Some(token)
    }

    /// The charge token of `tag_ref` (see [`charge_at`](Self::charge_at)):
    /// its counter's byte offset from any CPU's counter base, checked
    /// here; `None` for a bad reference (past the last tag, or before
    /// init). A platform can keep its current tag as a token, checked
    /// once when it is set.
    #[inline(always)]
    pub fn token(&self, tag_ref: AllocTagRef) -> Option<AllocTagRef> {
        let offset = self.counter_offset(tag_ref)?;
        // SAFETY: 16 <= offset = 16 * tag_ref <= 16 * nr_tags <= u32::MAX
        // (init refuses more than MAX_TAGS tags): non-zero as a u32.
        Some(unsafe { AllocTagRef::new_unchecked(offset as u32) })
    }

    /// Counts an object of `bytes` at a token from
    /// [`token`](Self::token) or [`charge_at`](Self::charge_at): one `add`
    /// and one `inc` at `cpu_base + token`, no check.
    ///
    /// # Safety
    ///
    /// `cpu_base` as for [`add_at`](Self::add_at); `token` came from these
    /// counters (so `cpu_base + token` is a counter of that CPU's block).
    #[inline(always)]
    pub unsafe fn charge_token_at(&self, cpu_base: usize, token: AllocTagRef, bytes: usize) {
        // SAFETY: per our caller, a checked counter offset.
        unsafe { local_update_at(cpu_base, token.get() as usize, bytes as u64, true) };
    }

    /// Uncounts an object charged with `token` (from
    /// [`charge_at`](Self::charge_at)) at this CPU's counter base: one
    /// `sub` and one `dec` at `cpu_base + token`, no check.
    ///
    /// # Safety
    ///
    /// `cpu_base` as for [`add_at`](Self::add_at); `token` was returned
    /// by `charge_at` of these counters (so `cpu_base + token` is a
    /// counter of that CPU's block).
    #[inline(always)]
    pub unsafe fn uncharge_at(&self, cpu_base: usize, token: AllocTagRef, bytes: usize) {
        // SAFETY: per our caller, a checked counter offset.
        unsafe { local_update_at(cpu_base, token.get() as usize, bytes as u64, false) };
    }

    /// The tag reference a [`charge_at`](Self::charge_at) token stands
    /// for.
    pub fn token_tag_ref(token: AllocTagRef) -> Option<AllocTagRef> {
        AllocTagRef::new(token.get() / core::mem::size_of::<TagCounter>() as u32)
    }

    /// The byte offset of `tag_ref`'s counter from a CPU's counter base:
    /// `None` for a reference past the last tag (and before init:
    /// `nr_tags` is 0). If `cpu_base` came from [`cpu_base`](Self::cpu_base),
    /// `1 <= tag_ref <= nr_tags` puts `cpu_base + offset` at a counter of
    /// that CPU's block, valid for the program's lifetime.
    #[inline(always)]
    fn counter_offset(&self, tag_ref: AllocTagRef) -> Option<usize> {
        let tag_ref = tag_ref.get() as usize;
        if tag_ref > self.nr_tags.load(Ordering::Acquire) {
            return None;
        }
        Some(tag_ref * core::mem::size_of::<TagCounter>())
    }

    /// Uncounts a freed object of `bytes` at `tag_ref`, on CPU `cpu` (any
    /// CPU: the sum is what counts).
    #[inline]
    pub fn sub(&self, cpu: usize, tag_ref: AllocTagRef, bytes: usize) {
        if let Some(counter) = self.counter(cpu, tag_ref) {
            counter.bytes.fetch_sub(bytes as u64, Ordering::Relaxed);
            counter.calls.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Uncounts `bytes` and `nr_calls` objects at `tag_ref`, on CPU `cpu`
    /// (any CPU): [`sub`](Self::sub) for a free that ends no allocation or
    /// several (a page allocator freeing part of a run, or runs of two
    /// allocations at once).
    #[inline]
    pub fn sub_counts(&self, cpu: usize, tag_ref: AllocTagRef, bytes: usize, nr_calls: u64) {
        if let Some(counter) = self.counter(cpu, tag_ref) {
            counter.bytes.fetch_sub(bytes as u64, Ordering::Relaxed);
            counter.calls.fetch_sub(nr_calls, Ordering::Relaxed);
        }
    }

    /// A tag's counters summed over CPUs. A sum that is transiently
    /// negative (a free seen before its allocation while reading) reads 0.
    pub fn read(&self, tag_ref: AllocTagRef) -> AllocTagCounts {
        let mut bytes = 0u64;
        let mut calls = 0u64;
        for cpu in 0..self.nr_cpus.load(Ordering::Relaxed) {
            if let Some(counter) = self.counter(cpu, tag_ref) {
                bytes = bytes.wrapping_add(counter.bytes.load(Ordering::Relaxed));
                calls = calls.wrapping_add(counter.calls.load(Ordering::Relaxed));
            }
        }
        AllocTagCounts {
            bytes: (bytes as i64).max(0) as u64,
            calls: (calls as i64).max(0) as u64,
        }
    }
}

const SWITCH_OFF: u8 = 0;
pub(crate) const SWITCH_ON: u8 = 1;
pub(crate) const SWITCH_NEVER: u8 = 2;

/// Refused change of a [`ProfilingSwitch`] set to `never`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SwitchLocked;

impl fmt::Display for SwitchLocked {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("allocation profiling was disabled for good at boot (mem_profiling=never)")
    }
}

/// The runtime switch: on, off, or never (off and unchangeable), the Linux
/// `mem_profiling=0|1|never` boot argument and `/proc/sys/vm/mem_profiling`.
///
/// Turning profiling on after it was off marks the counts *possibly
/// inaccurate*: objects allocated meanwhile carry no tag and are not
/// counted (their frees subtract nothing, so nothing underflows).
pub struct ProfilingSwitch {
    pub(crate) state: AtomicU8,
    pub(crate) inaccurate: AtomicBool,
}

impl ProfilingSwitch {
    /// A switch that starts on or off.
    pub const fn new(on: bool) -> Self {
        Self {
            state: AtomicU8::new(if on { SWITCH_ON } else { SWITCH_OFF }),
            inaccurate: AtomicBool::new(false),
        }
    }

    /// Whether allocations are being tagged now.
    #[inline]
    pub fn is_on(&self) -> bool {
        self.state.load(Ordering::Relaxed) == SWITCH_ON
    }

    /// Whether the switch is locked off (`never`).
    pub fn is_never(&self) -> bool {
        self.state.load(Ordering::Relaxed) == SWITCH_NEVER
    }

    /// Whether profiling was turned on after having been off.
    pub fn is_inaccurate(&self) -> bool {
        self.inaccurate.load(Ordering::Relaxed)
    }

    /// Boot-time setting, before anything was allocated with a tag: sets
    /// the state without marking counts inaccurate.
    pub fn set_at_boot(&self, setting: BootSetting) {
        let state = match setting {
            BootSetting::Off => SWITCH_OFF,
            BootSetting::On => SWITCH_ON,
            BootSetting::Never => SWITCH_NEVER,
        };
        self.state.store(state, Ordering::Relaxed);
    }

    /// Turn profiling on (off → on marks the counts possibly inaccurate).
    ///
    /// # Errors
    ///
    /// [`SwitchLocked`] if the switch is `never`.
    pub fn enable(&self) -> Result<(), SwitchLocked> {
        match self.state.compare_exchange(
            SWITCH_OFF,
            SWITCH_ON,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => {
                self.inaccurate.store(true, Ordering::Relaxed);
                Ok(())
            }
            Err(SWITCH_NEVER) => Err(SwitchLocked),
            Err(_) => Ok(()),
        }
    }

    /// Turn profiling off: new allocations carry no tag; frees of tagged
    /// objects still subtract.
    ///
    /// # Errors
    ///
    /// [`SwitchLocked`] if the switch is `never` (it is off anyway).
    pub fn disable(&self) -> Result<(), SwitchLocked> {
        match self.state.compare_exchange(
            SWITCH_ON,
            SWITCH_OFF,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Err(SWITCH_NEVER) => Err(SwitchLocked),
            _ => Ok(()),
        }
    }
}

/// A parsed `mem_profiling=` boot argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BootSetting {
    /// `0`: compiled in, off until `allocinfo on`.
    Off,
    /// `1`: on from boot.
    On,
    /// `never`: off, and it cannot be turned on.
    Never,
}

impl BootSetting {
    /// Parses `0`, `1` or `never` (also `off`/`on`).
    pub fn parse(value: &str) -> Option<Self> {
        match value {
            "0" | "off" => Some(Self::Off),
            "1" | "on" => Some(Self::On),
            "never" => Some(Self::Never),
            _ => None,
        }
    }
}

/// Formats a byte count for humans (`-h`): `512`, `1.5K`, `12.0M`.
pub struct HumanBytes(pub u64);

impl fmt::Display for HumanBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [&str; 5] = ["K", "M", "G", "T", "P"];
        let mut buf = [0u8; 24];
        let mut writer = FixedBuf {
            buf: &mut buf,
            len: 0,
        };
        if self.0 < 1024 {
            let _ = fmt::write(&mut writer, format_args!("{}", self.0));
        } else {
            let mut unit = 0;
            let mut scaled = self.0;
            while scaled >= 1024 * 1024 && unit + 1 < UNITS.len() {
                scaled /= 1024;
                unit += 1;
            }
            // One decimal: tenths of the unit.
            let tenths = scaled * 10 / 1024;
            let _ = fmt::write(
                &mut writer,
                format_args!("{}.{}{}", tenths / 10, tenths % 10, UNITS[unit]),
            );
        }
        let len = writer.len;
        f.pad(core::str::from_utf8(&buf[..len]).unwrap_or("?"))
    }
}

struct FixedBuf<'a> {
    buf: &'a mut [u8; 24],
    len: usize,
}

impl fmt::Write for FixedBuf<'_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let end = (self.len + s.len()).min(self.buf.len());
        let take = end - self.len;
        self.buf[self.len..end].copy_from_slice(&s.as_bytes()[..take]);
        self.len = end;
        Ok(())
    }
}

/// Writes the `allocinfo` header (`/proc/allocinfo` version 1.0).
///
/// # Errors
///
/// The error of `out` (`fmt::Error`), as is.
pub fn write_allocinfo_header(out: &mut dyn fmt::Write) -> fmt::Result {
    writeln!(out, "allocinfo - version: 1.0")?;
    writeln!(out, "#     <size>  <calls> <tag info>")
}

/// Writes one `allocinfo` row: `%12 bytes %8 calls file:line func:name`,
/// with ` accurate:no` appended when `inaccurate` (Linux 6.14's marker).
///
/// # Errors
///
/// The error of `out` (`fmt::Error`), as is.
pub fn write_allocinfo_row(
    out: &mut dyn fmt::Write,
    tag: &AllocTag,
    counts: AllocTagCounts,
    human: bool,
    inaccurate: bool,
) -> fmt::Result {
    write_allocinfo_line(
        out,
        tag.tag.location(),
        tag.tag.function(),
        counts,
        human,
        inaccurate,
    )
}

/// [`write_allocinfo_row`] of a site given by its parts (a reader of a
/// memory image has no `&'static AllocTag`: `magpie-kmem core CORE
/// allocinfo`).
///
/// # Errors
///
/// The error of `out` (`fmt::Error`), as is.
pub fn write_allocinfo_line(
    out: &mut dyn fmt::Write,
    location: impl fmt::Display,
    function: &str,
    counts: AllocTagCounts,
    human: bool,
    inaccurate: bool,
) -> fmt::Result {
    if human {
        write!(out, "{:>12} {:>8} ", HumanBytes(counts.bytes), counts.calls)?;
    } else {
        write!(out, "{:>12} {:>8} ", counts.bytes, counts.calls)?;
    }
    write!(out, "{location} func:{function}")?;
    if inaccurate {
        write!(out, " accurate:no")?;
    }
    writeln!(out)
}

/// `calls` is 8 bytes into a [`TagCounter`] (the `asm!` below says so),
/// and a counter is 16 bytes (`cpu_base`'s bias, `counter_offset`).
const _: () = assert!(core::mem::offset_of!(TagCounter, calls) == 8);
const _: () = assert!(core::mem::size_of::<TagCounter>() == 16);

/// [`local_update`] of the counter at `base + offset`, the sum left to the
/// addressing mode (`add [base + offset], bytes; inc [base + offset + 8]`).
///
/// # Safety
///
/// As for [`local_update`], for the counter at `base + offset`.
#[inline(always)]
unsafe fn local_update_at(base: usize, offset: usize, bytes: u64, add: bool) {
    // Miri cannot run `asm!`: it checks the fallback below instead.
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    if add {
        // SAFETY: per our caller, `base + offset` is a valid, aligned
        // TagCounter (calls at offset 8: asserted above) that no other CPU
        // writes (others only load it; aligned 8-byte stores are never
        // torn).
        unsafe {
            core::arch::asm!(
                "add qword ptr [{base} + {offset}], {bytes}",
                "inc qword ptr [{base} + {offset} + 8]",
                base = in(reg) base,
                offset = in(reg) offset,
                bytes = in(reg) bytes,
                options(nostack),
            );
        }
    } else {
        // SAFETY: as for the add above.
        unsafe {
            core::arch::asm!(
                "sub qword ptr [{base} + {offset}], {bytes}",
                "dec qword ptr [{base} + {offset} + 8]",
                base = in(reg) base,
                offset = in(reg) offset,
                bytes = in(reg) bytes,
                options(nostack),
            );
        }
    }
    #[cfg(any(not(target_arch = "x86_64"), miri))]
    // SAFETY: per our caller.
    unsafe {
        local_update((base + offset) as *const TagCounter, bytes, add)
    };
}

/// Counts one object of `bytes` in (`add`) or out of a counter only this
/// CPU writes, without a locked instruction: on x86_64 one `asm!` block,
/// `add`/`sub` to the bytes and `inc`/`dec` of the calls (each single
/// instruction atomic with respect to interrupts on this CPU; readers may
/// see one updated without the other, as with two separate adds).
///
/// # Safety
///
/// `counter` is valid and aligned, and no other thread writes it
/// concurrently.
#[inline(always)]
unsafe fn local_update(counter: *const TagCounter, bytes: u64, add: bool) {
    // Miri cannot run `asm!`: it checks the atomic fallback below instead.
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    if add {
        // SAFETY: `counter` points to a valid, aligned TagCounter (two u64s,
        // calls at offset 8: asserted above); by the caller's contract no
        // other CPU writes it (others only load it, and an aligned 8-byte
        // store is never torn).
        unsafe {
            core::arch::asm!(
                "add qword ptr [{counter}], {bytes}",
                "inc qword ptr [{counter} + 8]",
                counter = in(reg) counter,
                bytes = in(reg) bytes,
                options(nostack),
            );
        }
    } else {
        // SAFETY: as for the add above.
        unsafe {
            core::arch::asm!(
                "sub qword ptr [{counter}], {bytes}",
                "dec qword ptr [{counter} + 8]",
                counter = in(reg) counter,
                bytes = in(reg) bytes,
                options(nostack),
            );
        }
    }
    #[cfg(any(not(target_arch = "x86_64"), miri))]
    {
        // SAFETY: per our caller, `counter` is valid.
        let counter = unsafe { &*counter };
        if add {
            counter.bytes.fetch_add(bytes, Ordering::Relaxed);
            counter.calls.fetch_add(1, Ordering::Relaxed);
        } else {
            counter.bytes.fetch_sub(bytes, Ordering::Relaxed);
            counter.calls.fetch_sub(1, Ordering::Relaxed);
        }
    }
}
