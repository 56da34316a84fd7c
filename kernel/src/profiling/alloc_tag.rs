//! Allocation profiling and latency statistics: the kernel's side of
//! `magpie-codetag`'s allocation tags and time stats (Linux memory
//! allocation profiling, `/proc/allocinfo`).
//!
//! # What is counted
//!
//! Every allocation from the slab allocator by a caller is charged to one
//! [`AllocTag`] (a call site in the `ALLOC_TAGS` linker section):
//!
//! * **explicit** call sites name their own tag: [`kmalloc!`](crate::kmalloc),
//!   [`kmem_cache_alloc!`](crate::kmem_cache_alloc), and the per-call-site
//!   `Allocator` handle [`tagged_alloc!`](crate::tagged_alloc) for
//!   `Box::new_in` / `Vec::new_in`;
//! * a **scope** ([`alloc_tag_scope!`](crate::alloc_tag_scope)) charges every
//!   other allocation made on this CPU while it lives — `Box`, `Vec` and
//!   `String` through the global allocator included — to its tag; nested
//!   scopes: the innermost wins, the outer one is restored when it ends;
//! * everything else goes to the `untagged` bucket, shown like any site.
//!
//! Bytes are class-rounded: a kmalloc of 100 bytes is charged 104
//! (`kmalloc-104`'s object size), a cache object its cache's object size, a
//! page-granular kmalloc its whole pages. `calls` is the number of live
//! objects (allocations minus frees), as in Linux.
//!
//! # Where the state lives
//!
//! * Each object's 4-byte tag reference (an `Option<AllocTagRef>`): in
//!   `magpie-slab` (see its `alloc_tag` module): a side array per small
//!   slab (allocated with the slab's first tagged object), a slot in each
//!   bufctl, the upper half of a page-granular allocation's page-map entry.
//! * Counters: [`AllocTagCounters`], one block per CPU of `{bytes, calls}`
//!   for every tag, cache-line aligned, allocated from `kpages` in
//!   [`init`] once the CPU count is known. Each CPU's counter base
//!   (`AllocTagCounters::cpu_base`) is a word of its `PerCpu`, so a charge
//!   is one `%gs`-relative load, one compare of the reference against the
//!   number of tags, and one `add` / one `inc` (Linux's `this_cpu_add`).
//!   Allocations update only their CPU's block; `allocinfo` sums over CPUs.
//!   The object keeps its tag's charge token (`AllocTagCounters::token`:
//!   the counter's byte offset, validated once), so its free is one `sub`
//!   and one `dec` with no check.
//!   Until `init`, profiling is off.
//! * The current tag: a word of each CPU's `PerCpu`, kept as a charge
//!   token (read `%gs`-relative
//!   by the slab allocator's `alloc_tag_current` hook, no switch test: the
//!   slab allocator asks only while its own switch, kept equal to
//!   [`SWITCH`], is on), `untagged` from [`init`] on; a scope guard swaps
//!   its tag in and restores the previous value (there is no scheduler).
//!
//! # Switches
//!
//! * Cargo feature `alloc-profiling` (default): without it, none of this is
//!   on any path and objects carry no reference; the macros fall back to the
//!   plain calls and `allocinfo` says it is compiled out.
//! * Boot argument `mem_profiling=0|1|never` (default 1) and
//!   `allocinfo on|off`. Turning it on after it was off marks the counts
//!   `accurate:no`: objects allocated meanwhile carry no tag and their frees
//!   subtract nothing, so no counter underflows. `never` cannot be undone.
//!
//! # Context capture
//!
//! `allocinfo ctx FILE:LINE enable` records, for each object that one site
//! allocates from then on, its address, size, CPU, timestamp, context and
//! backtrace, until the object is freed (the Linux RFC's per-callsite
//! context capture). Records live in a fixed pool of [`CTX_MAX_RECORDS`]
//! (recording never allocates, so it cannot recurse into the allocator);
//! when the pool is full the record is dropped and counted. With no capture
//! armed, the profiled hit pays one compare and branch on each side, and no
//! stack frame: the capture is called through a register-preserving thunk
//! (see `ctx_capture_alloc`).
//!
//! # Latency statistics
//!
//! `timestats` prints every `magpie_codetag::time_stats!` point: the slab
//! layer's refill (`grow`) and depot exchanges (feature `time-stats`), in
//! TSC cycles.

use alloc::collections::TryReserveError;
use alloc::vec::Vec;
use core::ptr::NonNull;
use core::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};

pub use magpie_codetag;
use magpie_codetag::alloc_tag::{
    AllocTag, AllocTagCounters, AllocTagCounts, AllocTagRef, BootSetting, ProfilingSwitch,
    SwitchLocked,
};
use magpie_slab::{PAGE_SIZE, PageSource, Platform, TraceRecord};
use spin::Mutex;

use crate::arch::{self, IrqGuard};
use crate::kmem::{KPAGES, KernelPlatform};

/// Whether allocation profiling is compiled in (cargo feature
/// `alloc-profiling`).
pub const COMPILED_IN: bool = cfg!(feature = "alloc-profiling");

/// The runtime switch. Off until [`init`] has counters and reads the boot
/// argument.
pub static SWITCH: ProfilingSwitch = ProfilingSwitch::new(false);

/// Per-CPU `{bytes, calls}` of every tag.
pub static COUNTERS: AllocTagCounters = AllocTagCounters::new();

/// The untagged bucket's charge token (set by [`init`]); each CPU's
/// current tag (`PerCpu::alloc_tag_current`, read `%gs`-relative, kept as
/// a token) is this when no scope is open.
static UNTAGGED_TOKEN: AtomicU32 = AtomicU32::new(0);

/// Sets profiling up once the slab allocator is up: counters for every CPU
/// from `kpages`, then the boot argument `mem_profiling=0|1|never`.
pub fn init() {
    if !COMPILED_IN {
        return;
    }
    init_switch();
    sync_slab_switch();
}

/// Tell the slab allocator whether profiling is on, so that with it off
/// the alloc fast path does not even ask [`current_tag`]. Called whenever
/// [`SWITCH`] changes (after [`init`]: the slab allocator is up by then).
fn sync_slab_switch() {
    crate::kmem::SLAB.set_alloc_profiling(SWITCH.is_on());
}

/// `allocinfo on|off`: switches profiling at run time (and tells the slab
/// allocator).
///
/// # Errors
///
/// [`SwitchLocked`] when the boot argument was `mem_profiling=never`.
pub fn set_enabled(on: bool) -> Result<(), SwitchLocked> {
    let result = if on {
        SWITCH.enable()
    } else {
        SWITCH.disable()
    };
    sync_slab_switch();
    result
}

/// [`init`]'s counters and boot argument.
fn init_switch() {
    let setting = crate::mm::boot_info::get()
        .and_then(|boot| boot.arg("mem_profiling"))
        .map(|value| {
            BootSetting::parse(value).unwrap_or_else(|| {
                log::warn!("mem_profiling={value}: expected 0, 1 or never; using 1");
                BootSetting::On
            })
        })
        .unwrap_or(BootSetting::On);
    if setting == BootSetting::Never {
        SWITCH.set_at_boot(BootSetting::Never);
        return;
    }
    let nr_cpus = KernelPlatform::max_cpus();
    let bytes = AllocTagCounters::bytes_needed(nr_cpus);
    let nr_pages = bytes.div_ceil(PAGE_SIZE);
    let Ok(pages) = KPAGES.alloc_pages(nr_pages) else {
        log::warn!("allocation profiling: no memory for counters; off for good");
        SWITCH.set_at_boot(BootSetting::Never);
        return;
    };
    // SAFETY: nr_pages fresh, page-aligned pages from kpages, never freed,
    // used by nothing else.
    let ready = unsafe { COUNTERS.init(pages, nr_pages * PAGE_SIZE, nr_cpus) };
    if !ready {
        SWITCH.set_at_boot(BootSetting::Never);
        return;
    }
    let Some(untagged) = COUNTERS.token(magpie_codetag::alloc_tag::UNTAGGED.tag_ref()) else {
        SWITCH.set_at_boot(BootSetting::Never);
        return;
    };
    let untagged = untagged.get();
    UNTAGGED_TOKEN.store(untagged, Ordering::Relaxed);
    // Every CPU's per-CPU words, before anything can be charged (the
    // switch is still off): its counter base and its current tag (a
    // token; a scope opened before now set a token too, or 0).
    for cpu in 0..nr_cpus {
        if let (Some(percpu), Some(base)) = (arch::percpu::get(cpu), COUNTERS.cpu_base(cpu)) {
            percpu.set_alloc_tag_base(base);
            let _ = percpu.alloc_tag_current().compare_exchange(
                0,
                untagged,
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
        }
    }
    SWITCH.set_at_boot(setting);
    log::debug!(
        "allocation profiling: {} tags, {} CPU(s), {:?}",
        AllocTag::all().len(),
        nr_cpus,
        setting
    );
}

/// The tag to charge an allocation that names none: this CPU's scope, else
/// the untagged bucket; `None` while profiling is off.
#[inline]
pub fn current_tag() -> Option<AllocTagRef> {
    if !COMPILED_IN || !SWITCH.is_on() {
        return None;
    }
    this_cpu_token().and_then(AllocTagCounters::token_tag_ref)
}

/// [`Platform::alloc_tag_current_token`]: this CPU's current tag as a
/// charge token, one `%gs`-relative load and no check (it was checked
/// when it was set: by [`init`] or a scope); `None` until [`init`]. No
/// switch test: the slab allocator asks only while its own switch is on,
/// which `sync_slab_switch` keeps equal to [`SWITCH`].
#[inline(always)]
pub fn this_cpu_token() -> Option<AllocTagRef> {
    AllocTagRef::new(arch::alloc_tag_current())
}

/// The reference to charge an explicitly tagged allocation: `tag`'s, or
/// `None` while profiling is off.
#[inline]
pub fn explicit_tag(tag: &'static AllocTag) -> Option<AllocTagRef> {
    if COMPILED_IN && SWITCH.is_on() {
        Some(tag.tag_ref())
    } else {
        None
    }
}

/// [`Platform::alloc_tag_token`]: `tag`'s **charge token**, the byte
/// offset of its counter from any CPU's counter base, checked here once
/// (`None`, charging nothing, for a reference past the last tag, or before
/// [`init`]); the object keeps it, so neither its charge nor its free
/// checks it again.
#[inline(always)]
pub fn token(tag: AllocTagRef) -> Option<AllocTagRef> {
    COUNTERS.token(tag)
}

/// [`Platform::alloc_tag_charge_token`]: count on this CPU, one `add` and
/// one `inc` at this CPU's `%gs`-relative counter base plus `token`, then
/// capture context if the site is being captured (one compare and branch;
/// see `ctx_capture_alloc`; the captured site is kept as its token too).
///
/// # Safety
///
/// `token` came from [`token`] (the slab allocator's contract for
/// `alloc_tag_charge_token`).
#[inline(always)]
pub unsafe fn charge(token: AllocTagRef, ptr: NonNull<u8>, bytes: usize) {
    // SAFETY: `alloc_tag_base()` is this CPU's base in COUNTERS: `init` set
    // it on every CPU before the switch could go on, and nothing is
    // charged before (no tag is handed out while the switch is off, nor
    // by `this_cpu_tag` before `init`). This kernel has no preemption: code
    // runs on the CPU whose GS it read until it returns, so only this CPU
    // writes its counter block. `token` is a checked counter offset (our
    // caller's contract).
    unsafe { COUNTERS.charge_token_at(arch::alloc_tag_base(), token, bytes) };
    ctx_capture_alloc(token, ptr, bytes);
}

/// [`Platform::alloc_tag_uncharge`]: uncount (on whichever CPU frees: one
/// `sub` and one `dec` at its counter base plus the token, no check) and
/// drop a context record (one compare and branch while the pool is empty;
/// see `ctx_capture_free`).
///
/// # Safety
///
/// `token` is the one the object at `ptr` was charged with ([`charge`]),
/// not uncharged since (the slab allocator's contract for
/// `alloc_tag_uncharge`).
#[inline(always)]
pub unsafe fn uncharge(token: AllocTagRef, ptr: NonNull<u8>, bytes: usize) {
    // SAFETY: the base as in `charge` (a charged object exists only once
    // `init` set every CPU's base); `token` came from `token` (our
    // caller's contract), a counter of every CPU's block.
    unsafe { COUNTERS.uncharge_at(arch::alloc_tag_base(), token, bytes) };
    ctx_capture_free(ptr);
}

// ---------------------------------------------------------------------------
// Call-site forms

/// While alive, charges this CPU's untagged allocations to one tag; see
/// [`alloc_tag_scope!`](crate::alloc_tag_scope).
#[must_use = "the scope ends when the guard is dropped"]
pub struct AllocTagScope {
    cpu: usize,
    previous: u32,
}

impl AllocTagScope {
    /// Makes `tag` this CPU's current tag until the guard is dropped.
    #[inline]
    pub fn enter(tag: &'static AllocTag) -> Self {
        let cpu = arch::cpu_id();
        // Before `init` (no counters) there is no token: the scope then
        // charges nothing, like the untagged allocations around it.
        let token = COUNTERS.token(tag.tag_ref()).map_or(0, AllocTagRef::get);
        let previous = arch::this_cpu()
            .alloc_tag_current()
            .swap(token, Ordering::Relaxed);
        Self { cpu, previous }
    }

    /// A guard that changes nothing (profiling compiled out).
    pub fn none() -> Self {
        Self {
            cpu: usize::MAX,
            previous: 0,
        }
    }
}

impl Drop for AllocTagScope {
    #[inline]
    fn drop(&mut self) {
        if let Some(percpu) = arch::percpu::get(self.cpu) {
            // A scope opened before `init` gives back the untagged bucket.
            let previous = if self.previous == 0 {
                UNTAGGED_TOKEN.load(Ordering::Relaxed)
            } else {
                self.previous
            };
            percpu
                .alloc_tag_current()
                .store(previous, Ordering::Relaxed);
        }
    }
}

/// An `Allocator` handle that charges its allocations to one call site:
/// `Box::new_in(value, tagged_alloc!())`. See
/// [`tagged_alloc!`](crate::tagged_alloc).
#[derive(Clone, Copy)]
pub struct TaggedAlloc {
    tag: Option<&'static AllocTag>,
}

impl TaggedAlloc {
    /// A handle for `tag` (`None`: charge like an untagged allocation).
    pub const fn new(tag: Option<&'static AllocTag>) -> Self {
        Self { tag }
    }
}

// SAFETY: blocks come from the 'static slab allocator (kmalloc's contract:
// at least `layout.size()` bytes aligned to `layout.align()`), stay valid
// until `deallocate`, and every copy of a handle frees into the same
// allocator.
unsafe impl core::alloc::Allocator for TaggedAlloc {
    fn allocate(
        &self,
        layout: core::alloc::Layout,
    ) -> Result<NonNull<[u8]>, core::alloc::AllocError> {
        if layout.size() == 0 {
            let dangling = NonNull::new(core::ptr::without_provenance_mut::<u8>(layout.align()))
                .ok_or(core::alloc::AllocError)?;
            return Ok(NonNull::slice_from_raw_parts(dangling, 0));
        }
        let tag = match self.tag {
            Some(tag) => explicit_tag(tag),
            None => current_tag(),
        };
        let ptr = crate::kmem::SLAB
            .kmalloc_tagged(layout.size(), layout.align(), tag)
            .map_err(|_| core::alloc::AllocError)?;
        Ok(NonNull::slice_from_raw_parts(ptr, layout.size()))
    }

    unsafe fn deallocate(&self, ptr: NonNull<u8>, layout: core::alloc::Layout) {
        if layout.size() == 0 {
            return;
        }
        // SAFETY: per the Allocator contract, ptr is a live block from us.
        if let Err(error) = unsafe { crate::kmem::SLAB.kfree(ptr) } {
            log::error!("TaggedAlloc: {error}; nothing was freed");
        }
    }
}

/// This call site's tag argument for the `*_tagged` calls of the
/// allocation macros: `explicit_tag(alloc_tag!())` (the site's own tag
/// while profiling is on, `None` while it is off). Not for direct use.
#[cfg(feature = "alloc-profiling")]
#[doc(hidden)]
#[macro_export]
#[collapse_debuginfo(yes)]
macro_rules! __site_tag {
    () => {
        $crate::profiling::explicit_tag($crate::profiling::magpie_codetag::alloc_tag!())
    };
}

/// This call site's tag argument with profiling compiled out: `None` (the
/// `*_tagged` calls then ignore it, as the plain calls would).
#[cfg(not(feature = "alloc-profiling"))]
#[doc(hidden)]
#[macro_export]
#[collapse_debuginfo(yes)]
macro_rules! __site_tag {
    () => {
        ::core::option::Option::None
    };
}

/// The body of every allocation macro: a fault point ([`crate::debug::fault`];
/// armed, `Err(AllocError::OutOfMemory)` without allocating), else
/// `$alloc`, a `*_tagged` call given [`__site_tag!`](crate::__site_tag).
/// Not for direct use.
#[doc(hidden)]
#[macro_export]
#[collapse_debuginfo(yes)]
macro_rules! __alloc_site {
    ($alloc:expr) => {
        if $crate::alloc_fault!() {
            ::core::result::Result::Err($crate::debug::fault::AllocError::OutOfMemory)
        } else {
            $alloc
        }
    };
}

/// `kmalloc!(size)` / `kmalloc!(size, align)`: [`SLAB`](crate::kmem::SLAB)
/// `.kmalloc` charged to this call site. `align` defaults to 8. (Linux
/// takes GFP flags here; this kernel has none, so the second argument is
/// the alignment.) The site is also a fault point ([`crate::debug::fault`]): armed,
/// it returns `Err(AllocError::OutOfMemory)` without allocating. Its code
/// carries the caller's file and line in the debug info
/// (`collapse_debuginfo`), so symbolizers name the call site, not this
/// file.
#[macro_export]
#[collapse_debuginfo(yes)]
macro_rules! kmalloc {
    ($size:expr) => {
        $crate::kmalloc!($size, 8)
    };
    ($size:expr, $align:expr) => {{
        let (size, align): (usize, usize) = ($size, $align);
        $crate::__alloc_site!($crate::kmem::SLAB.kmalloc_tagged(size, align, $crate::__site_tag!()))
    }};
}

/// `kmem_cache_alloc!(cache)`: `cache.alloc()` charged to this call site,
/// and a fault point ([`crate::debug::fault`]) like [`kmalloc!`](crate::kmalloc).
#[macro_export]
#[collapse_debuginfo(yes)]
macro_rules! kmem_cache_alloc {
    ($cache:expr) => {{
        let cache = &$cache;
        $crate::__alloc_site!(cache.alloc_tagged($crate::__site_tag!()))
    }};
}

/// `kmalloc_box!(size, align)`: [`kmalloc!`](crate::kmalloc) as an owned
/// [`SlabBox`](magpie_slab::SlabBox) (written, read and freed without
/// `unsafe`, on any CPU), charged to this call site; a fault point too.
#[macro_export]
#[collapse_debuginfo(yes)]
macro_rules! kmalloc_box {
    ($size:expr, $align:expr) => {{
        let (size, align): (usize, usize) = ($size, $align);
        $crate::__alloc_site!($crate::kmem::SLAB.kmalloc_box_tagged(
            size,
            align,
            $crate::__site_tag!()
        ))
    }};
}

/// `kmem_cache_alloc_box!(cache)` (`cache`: a `&'static KmemCache`):
/// [`kmem_cache_alloc!`](crate::kmem_cache_alloc) as an owned
/// [`SlabBox`](magpie_slab::SlabBox), charged to this call site; a fault
/// point too.
#[macro_export]
#[collapse_debuginfo(yes)]
macro_rules! kmem_cache_alloc_box {
    ($cache:expr) => {{
        let cache = $cache;
        $crate::__alloc_site!(cache.alloc_box_tagged($crate::__site_tag!()))
    }};
}

/// `let _scope = alloc_tag_scope!();` charges every allocation this CPU
/// makes without a tag of its own (`Box`, `Vec`, `String`, plain
/// `SLAB.kmalloc`) to this call site until `_scope` is dropped.
#[cfg(feature = "alloc-profiling")]
#[macro_export]
macro_rules! alloc_tag_scope {
    () => {
        $crate::profiling::AllocTagScope::enter($crate::profiling::magpie_codetag::alloc_tag!(
            $crate::profiling::magpie_codetag::CodeTagFlags::SCOPE
        ))
    };
}

/// `alloc_tag_scope!()` with profiling compiled out: a guard doing nothing.
#[cfg(not(feature = "alloc-profiling"))]
#[macro_export]
macro_rules! alloc_tag_scope {
    () => {
        $crate::profiling::AllocTagScope::none()
    };
}

/// `tagged_alloc!()`: a [`TaggedAlloc`] handle for this call site, for
/// `Box::new_in(x, tagged_alloc!())`, `Vec::new_in(tagged_alloc!())`.
#[cfg(feature = "alloc-profiling")]
#[macro_export]
macro_rules! tagged_alloc {
    () => {
        $crate::profiling::TaggedAlloc::new(Some($crate::profiling::magpie_codetag::alloc_tag!()))
    };
}

/// `tagged_alloc!()` with profiling compiled out.
#[cfg(not(feature = "alloc-profiling"))]
#[macro_export]
macro_rules! tagged_alloc {
    () => {
        $crate::profiling::TaggedAlloc::new(None)
    };
}

// ---------------------------------------------------------------------------
// Reading the counters

/// Live bytes and calls summed over every tag (the `allocinfo` totals),
/// read without allocating; zero when profiling is compiled out.
pub fn totals() -> AllocTagCounts {
    let mut totals = AllocTagCounts::default();
    if COMPILED_IN {
        for tag in AllocTag::all() {
            let counts = COUNTERS.read(tag.tag_ref());
            totals.bytes += counts.bytes;
            totals.calls += counts.calls;
        }
    }
    totals
}

/// Counts of every tag at `allocinfo mark`, in section order, and when.
struct Mark {
    at_tsc: u64,
    counts: Vec<AllocTagCounts>,
}

static MARK: Mutex<Option<Mark>> = Mutex::new(None);

/// Remembers every site's live bytes and calls now (`allocinfo mark`);
/// returns the number of sites. A later mark replaces it.
///
/// # Errors
/// No memory for the copy (one `{bytes, calls}` per site); the previous
/// mark is kept.
pub fn mark() -> Result<usize, TryReserveError> {
    let tags = AllocTag::all();
    let mut counts = Vec::new();
    counts.try_reserve_exact(tags.len())?;
    counts.extend(tags.iter().map(|tag| COUNTERS.read(tag.tag_ref())));
    let new = Mark {
        at_tsc: arch::rdtsc(),
        counts,
    };
    // The old mark is dropped after the lock is released.
    let old = MARK.lock().replace(new);
    drop(old);
    Ok(tags.len())
}

/// What grew (or shrank) at one site since the mark.
pub struct DiffRow {
    /// The call site.
    pub tag: &'static AllocTag,
    /// Change of its live bytes.
    pub bytes: i64,
    /// Change of its live objects (calls).
    pub calls: i64,
}

/// Every site whose live bytes or calls changed since `allocinfo mark`,
/// most bytes grown first, and the nanoseconds since the mark; `None`
/// without a mark.
///
/// # Errors
/// No memory for the rows (one per site).
pub fn diff() -> Result<Option<(u64, Vec<DiffRow>)>, TryReserveError> {
    let tags = AllocTag::all();
    let mut rows = Vec::new();
    rows.try_reserve_exact(tags.len())?;
    let guard = MARK.lock();
    let Some(mark) = guard.as_ref() else {
        return Ok(None);
    };
    let elapsed_ns = arch::tsc::cycles_to_ns(arch::rdtsc().wrapping_sub(mark.at_tsc));
    for (index, tag) in tags.iter().enumerate() {
        let now = COUNTERS.read(tag.tag_ref());
        let then = mark.counts.get(index).copied().unwrap_or_default();
        let row = DiffRow {
            tag,
            bytes: now.bytes.wrapping_sub(then.bytes) as i64,
            calls: now.calls.wrapping_sub(then.calls) as i64,
        };
        if row.bytes != 0 || row.calls != 0 {
            rows.push(row);
        }
    }
    drop(guard);
    rows.sort_unstable_by_key(|row| (core::cmp::Reverse(row.bytes), core::cmp::Reverse(row.calls)));
    Ok(Some((elapsed_ns, rows)))
}

/// The row of the first tag in `function` (for tests).
pub fn counts_of_function(function: &str) -> Option<AllocTagCounts> {
    AllocTag::all()
        .iter()
        .find(|tag| tag.tag.function() == function)
        .map(|tag| COUNTERS.read(tag.tag_ref()))
}

/// The untagged bucket's counts.
pub fn untagged_counts() -> AllocTagCounts {
    COUNTERS.read(magpie_codetag::alloc_tag::UNTAGGED.tag_ref())
}

// ---------------------------------------------------------------------------
// Context capture

/// Records the context-capture pool holds.
pub const CTX_MAX_RECORDS: usize = 256;

/// The charge token of the site being captured (0: none).
static CTX_TAG: AtomicU32 = AtomicU32::new(0);
/// Records in the pool (read without the lock to skip lookups).
static CTX_NR_RECORDS: AtomicUsize = AtomicUsize::new(0);
/// Records that did not fit in the pool.
static CTX_NR_DROPPED: AtomicU64 = AtomicU64::new(0);

struct CtxPool {
    /// `addr == 0`: a free slot.
    records: [TraceRecord; CTX_MAX_RECORDS],
}

/// A trace record with nothing in it (`addr == 0`), for fixed buffers.
pub const EMPTY_RECORD: TraceRecord = TraceRecord {
    addr: 0,
    size: 0,
    cpu: 0,
    timestamp: 0,
    context: [0; 32],
    context_len: 0,
    nr_frames: 0,
    frames: [0; magpie_slab::TRACE_MAX_FRAMES],
};

static CTX_POOL: Mutex<CtxPool> = Mutex::new(CtxPool {
    records: [EMPTY_RECORD; CTX_MAX_RECORDS],
});

// The capture hooks on the profiled hit paths.
//
// `charge` and `uncharge` are inlined into the slab allocator's profiled
// alloc and free. A Rust call to the capture functions there, even behind a
// `#[cold]` branch, makes those functions non-leaf: LLVM gives them a stack
// frame and keeps the object in a callee-saved register across the call,
// on every hit, captured or not (15 instructions per pair, measured by
// disassembly; docs/BENCHMARKS.md "The hit in the kernel"). So the test and
// the call are one `asm!` block the register allocator sees as clobbering
// only the flags: a compare of the word in memory with a register and a
// branch over the call. The call goes to a thunk that saves every register
// the C ABI lets a callee clobber, aligns the stack, calls the capture
// function and returns popping its stack arguments (the shape of Linux's
// callee-save thunks, `PV_CALLEE_SAVE_REGS_THUNK`). With capture off, the
// hit pays the compare and the branch, and nothing else.

/// The capture test of a new object: if `token` is the captured site's,
/// record `ptr` and `bytes` ([`ctx_record`], through [`ctx_record_thunk`]).
#[inline(always)]
fn ctx_capture_alloc(token: AllocTagRef, ptr: NonNull<u8>, bytes: usize) {
    // SAFETY: the block compares CTX_TAG (a 4-byte static) with `token` and,
    // if equal, pushes the two arguments and calls the thunk, which keeps
    // every general-purpose register but the flags (declared clobbered:
    // no `preserves_flags`) and pops its arguments on return (`ret 16`), so
    // the stack pointer is back where it was; the block uses stack below
    // it (no `nostack`), which this target allows (no red zone).
    unsafe {
        core::arch::asm!(
            "cmp dword ptr [rip + {ctx_tag}], {tag:e}",
            "jne 2f",
            "push {ptr}",
            "push {bytes}",
            "call {thunk}",
            "2:",
            ctx_tag = sym CTX_TAG,
            thunk = sym ctx_record_thunk,
            tag = in(reg) token.get(),
            ptr = in(reg) ptr.as_ptr(),
            bytes = in(reg) bytes,
        );
    }
}

/// The capture test of a freed object: while the pool holds records, drop
/// `ptr`'s ([`ctx_remove`], through [`ctx_remove_thunk`]).
#[inline(always)]
fn ctx_capture_free(ptr: NonNull<u8>) {
    // SAFETY: as in `ctx_capture_alloc`: one argument, popped by the
    // thunk's `ret 8`.
    unsafe {
        core::arch::asm!(
            "cmp qword ptr [rip + {nr_records}], 0",
            "je 2f",
            "push {ptr}",
            "call {thunk}",
            "2:",
            nr_records = sym CTX_NR_RECORDS,
            thunk = sym ctx_remove_thunk,
            ptr = in(reg) ptr.as_ptr(),
        );
    }
}

/// A naked thunk that calls `$callee` (an `extern "C"` function) keeping
/// every general-purpose register: it links a frame (so backtraces walk
/// through it), saves the registers the C ABI lets a callee clobber, loads
/// the callee's arguments from its caller's stack pushes (`$load`: `[rbp +
/// 16]` is the last word pushed), aligns the stack for the call, restores,
/// and returns with `$ret` (`ret N` pops the N bytes of arguments).
macro_rules! callee_save_thunk {
    ($(#[$meta:meta])* fn $name:ident => $callee:path, load: [$($load:literal),+], $ret:literal) => {
        $(#[$meta])*
        #[unsafe(naked)]
        unsafe extern "C" fn $name() {
            core::arch::naked_asm!(
                "push rbp",
                "mov rbp, rsp",
                "push rax",
                "push rcx",
                "push rdx",
                "push rsi",
                "push rdi",
                "push r8",
                "push r9",
                "push r10",
                "push r11",
                $($load,)+
                "and rsp, -16",
                "call {callee}",
                // Back to the nine saved registers below the frame link.
                "lea rsp, [rbp - 72]",
                "pop r11",
                "pop r10",
                "pop r9",
                "pop r8",
                "pop rdi",
                "pop rsi",
                "pop rdx",
                "pop rcx",
                "pop rax",
                "pop rbp",
                $ret,
                callee = sym $callee,
            );
        }
    };
}

callee_save_thunk! {
    /// Calls [`ctx_record`]`(ptr, bytes)` keeping every register; the
    /// arguments are on the stack (`ptr` pushed first), popped on return.
    ///
    /// # Safety
    ///
    /// Only for [`ctx_capture_alloc`]'s `call`: two words pushed just
    /// before it (not a Rust-callable function).
    fn ctx_record_thunk => ctx_record, load: ["mov rdi, [rbp + 24]", "mov rsi, [rbp + 16]"], "ret 16"
}

callee_save_thunk! {
    /// Calls [`ctx_remove`]`(ptr)` keeping every register; `ptr` is on the
    /// stack, popped on return.
    ///
    /// # Safety
    ///
    /// Only for [`ctx_capture_free`]'s `call`: one word pushed just before
    /// it (not a Rust-callable function).
    fn ctx_remove_thunk => ctx_remove, load: ["mov rdi, [rbp + 16]"], "ret 8"
}

/// Captures the context of a new object of the captured site (`addr`, its
/// `bytes`). Never allocates. Called through [`ctx_record_thunk`].
#[cold]
#[inline(never)]
extern "C" fn ctx_record(addr: usize, bytes: usize) {
    let mut record = EMPTY_RECORD;
    record.addr = addr;
    record.size = bytes;
    record.cpu = arch::cpu_id() as u32;
    record.timestamp = KernelPlatform::now();
    record.context_len = KernelPlatform::context(&mut record.context) as u8;
    record.nr_frames = KernelPlatform::backtrace(&mut record.frames) as u8;
    let _irq = IrqGuard::new();
    let mut pool = CTX_POOL.lock();
    match pool.records.iter_mut().find(|slot| slot.addr == 0) {
        Some(slot) => {
            *slot = record;
            CTX_NR_RECORDS.fetch_add(1, Ordering::Relaxed);
        }
        None => {
            CTX_NR_DROPPED.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Drops the record of a freed object at `addr`, if there is one. Called
/// through [`ctx_remove_thunk`].
#[cold]
#[inline(never)]
extern "C" fn ctx_remove(addr: usize) {
    let _irq = IrqGuard::new();
    let mut pool = CTX_POOL.lock();
    if let Some(slot) = pool.records.iter_mut().find(|slot| slot.addr == addr) {
        *slot = EMPTY_RECORD;
        CTX_NR_RECORDS.fetch_sub(1, Ordering::Relaxed);
    }
}

fn ctx_clear() {
    let _irq = IrqGuard::new();
    let mut pool = CTX_POOL.lock();
    for slot in pool.records.iter_mut() {
        *slot = EMPTY_RECORD;
    }
    CTX_NR_RECORDS.store(0, Ordering::Relaxed);
}

/// Starts capturing context for `tag`'s new objects (stops any other site
/// and drops its records).
pub fn ctx_enable(tag: &'static AllocTag) {
    CTX_TAG.store(0, Ordering::Relaxed);
    ctx_clear();
    CTX_NR_DROPPED.store(0, Ordering::Relaxed);
    let token = COUNTERS.token(tag.tag_ref()).map_or(0, AllocTagRef::get);
    CTX_TAG.store(token, Ordering::Relaxed);
}

/// Stops capturing and drops the records.
pub fn ctx_disable() {
    CTX_TAG.store(0, Ordering::Relaxed);
    ctx_clear();
}

/// The live records, copied out (the copy's memory is reserved before the
/// pool lock is taken: nothing allocates under it).
pub fn ctx_records() -> Vec<TraceRecord> {
    let mut records = Vec::with_capacity(CTX_MAX_RECORDS);
    let _irq = IrqGuard::new();
    let pool = CTX_POOL.lock();
    records.extend(
        pool.records
            .iter()
            .filter(|record| record.addr != 0)
            .copied(),
    );
    records
}

/// Copies live records from the pool, slot order, starting at slot
/// `from`, into `buf` (under the pool lock; nothing allocates). Returns how
/// many were copied and the slot to continue from (`CTX_MAX_RECORDS` when
/// the pool was walked to its end).
pub fn ctx_copy(from: usize, buf: &mut [TraceRecord]) -> (usize, usize) {
    let _irq = IrqGuard::new();
    let pool = CTX_POOL.lock();
    let mut nr_copied = 0;
    let mut slot = from.min(CTX_MAX_RECORDS);
    while slot < CTX_MAX_RECORDS && nr_copied < buf.len() {
        if pool.records[slot].addr != 0 {
            buf[nr_copied] = pool.records[slot];
            nr_copied += 1;
        }
        slot += 1;
    }
    (nr_copied, slot)
}

/// Whether context capture is on for `tag`.
pub fn ctx_is_capturing(tag: &'static AllocTag) -> bool {
    COUNTERS
        .token(tag.tag_ref())
        .is_some_and(|token| CTX_TAG.load(Ordering::Relaxed) == token.get())
}

/// Records dropped because the pool was full since capture was enabled.
pub fn ctx_nr_dropped() -> u64 {
    CTX_NR_DROPPED.load(Ordering::Relaxed)
}
