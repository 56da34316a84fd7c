//! Allocation tags: the per-CPU counters, the runtime switch, the charge
//! and uncharge hooks `KernelPlatform` calls on the profiled paths, the
//! scope guard, and reading the counters (`allocinfo`). See
//! [`crate::profiling`] for the design.

use alloc::vec::Vec;
use core::sync::atomic::{AtomicU32, Ordering};

use magpie_codetag::alloc_tag::{
    AllocTag, AllocTagCounters, AllocTagCounts, AllocTagRef, BootSetting, ProfilingSwitch,
};
use magpie_slab::{PAGE_SIZE, PageSource};
use spin::Mutex;

use crate::arch;
use crate::mm::frame::TagCounting;

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

/// Sets profiling up once the slab allocator is up (`kmem::init`, which
/// then tells the slab allocator whether [`SWITCH`] is on): counters for
/// every CPU from `pages` (`kpages`), then the boot argument
/// `mem_profiling=0|1|never`.
pub fn init(pages: &dyn PageSource) {
    let setting = crate::mm::boot_info::get()
        .and_then(|boot| boot.arg("mem_profiling"))
        .map(|value| {
            BootSetting::parse(value).unwrap_or_else(|| {
                log::warn!("mem_profiling={value}: expected 0, 1 or never; using 1");
                BootSetting::On
            })
        })
        .unwrap_or(BootSetting::On);
    // For `magpie-kmem core CORE allocinfo`: the switch's state in an image.
    magpie_codetag::descriptor::describe_switch(&SWITCH);
    if setting == BootSetting::Never {
        SWITCH.set_at_boot(BootSetting::Never);
        return;
    }
    let nr_cpus = arch::max_cpus();
    let bytes = AllocTagCounters::bytes_needed(nr_cpus);
    let nr_pages = bytes.div_ceil(PAGE_SIZE);
    let Ok(pages) = pages.alloc_pages(nr_pages) else {
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
    crate::mm::frame::set_tag_counting(TagCounting {
        charge: charge_frames,
        uncharge: uncharge_frames,
    });
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

/// [`AllocTagHooks::current_token`](magpie_slab::AllocTagHooks::current_token): this CPU's current tag as a
/// charge token, one `%gs`-relative load and no check (it was checked
/// when it was set: by [`init`] or a scope); `None` until [`init`]. No
/// switch test: the slab allocator asks only while its own switch is on,
/// which `sync_slab_switch` keeps equal to [`SWITCH`].
#[inline(always)]
pub fn this_cpu_token() -> Option<AllocTagRef> {
    AllocTagRef::new(arch::alloc_tag_current())
}

/// [`AllocTagHooks::current_token`](magpie_slab::AllocTagHooks::current_token):
/// this CPU's current tag as a charge token, one `%gs`-relative load and
/// no test at all, for while profiling is on: the slab allocator asks only
/// then (its switch is turned on by `kmem::init` after [`init`], and
/// mirrors [`SWITCH`] from then on), and from [`init`] on no CPU's word
/// is 0 (see the SAFETY comment).
#[inline(always)]
pub fn this_cpu_token_profiling() -> AllocTagRef {
    let token = arch::alloc_tag_current();
    debug_assert_ne!(token, 0, "a CPU's current tag read before alloc_tag::init");
    // SAFETY: `init` gives every CPU's word the untagged bucket's token
    // (non-zero) before the switch can go on, on the boot CPU alone
    // (`kmem::init` runs before `smp::init`). After that every store to a
    // CPU's word is a token: `AllocTagScope::enter` stores one only when
    // it has one (else it leaves the word alone), and its drop gives back
    // what enter found, or the untagged token for a 0 found before
    // `init`. The slab allocator calls this only with its profiling on,
    // which is after `init` (see above).
    unsafe { AllocTagRef::new_unchecked(token) }
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

/// [`AllocTagHooks::token`](magpie_slab::AllocTagHooks::token): `tag`'s **charge token**, the byte
/// offset of its counter from any CPU's counter base, checked here once
/// (`None`, charging nothing, for a reference past the last tag, or before
/// [`init`]); the object keeps it, so neither its charge nor its free
/// checks it again.
#[inline(always)]
pub fn token(tag: AllocTagRef) -> Option<AllocTagRef> {
    COUNTERS.token(tag)
}

/// [`AllocTagHooks::charge`](magpie_slab::AllocTagHooks::charge): count on this CPU, one `add` and
/// one `inc` at this CPU's `%gs`-relative counter base plus `token`, and
/// nothing else (context capture runs in the platform's charge hook, off
/// the profiled hits: `capture::ctx_capture_alloc`).
///
/// # Safety
///
/// `token` came from [`token`] (the slab allocator's contract for
/// `AllocTagHooks::charge`).
#[inline(always)]
pub unsafe fn charge(token: AllocTagRef, bytes: usize) {
    // SAFETY: `alloc_tag_base()` is this CPU's base in COUNTERS: `init` set
    // it on every CPU before the switch could go on, and nothing is
    // charged before (no tag is handed out while the switch is off, nor
    // by `this_cpu_tag` before `init`). This kernel has no preemption: code
    // runs on the CPU whose GS it read until it returns, so only this CPU
    // writes its counter block. `token` is a checked counter offset (our
    // caller's contract).
    unsafe { COUNTERS.charge_token_at(arch::alloc_tag_base(), token, bytes) };
}

/// [`AllocTagHooks::uncharge`](magpie_slab::AllocTagHooks::uncharge): uncount (on whichever CPU frees: one
/// `sub` and one `dec` at its counter base plus the token, no check; a
/// context record is dropped in the platform's uncharge hook,
/// `capture::ctx_capture_free`).
///
/// # Safety
///
/// `token` is the one the object was charged with ([`charge`]),
/// not uncharged since (the slab allocator's contract for
/// `AllocTagHooks::uncharge`).
#[inline(always)]
pub unsafe fn uncharge(token: AllocTagRef, bytes: usize) {
    // SAFETY: the base as in `charge` (a charged object exists only once
    // `init` set every CPU's base); `token` came from `token` (our
    // caller's contract), a counter of every CPU's block.
    unsafe { COUNTERS.uncharge_at(arch::alloc_tag_base(), token, bytes) };
}

/// The frame allocator's charge ([`TagCounting`], see
/// [`crate::profiling::pages`]): `bytes` and one call at `tag` on this CPU
/// (the frame lock is held, interrupts are off).
fn charge_frames(tag: AllocTagRef, bytes: usize) {
    COUNTERS.add(arch::cpu_id(), tag, bytes);
}

/// The frame allocator's uncharge: `bytes` and `nr_calls` fewer at `tag`
/// (a free of tagged frames, on any CPU).
fn uncharge_frames(tag: AllocTagRef, bytes: usize, nr_calls: u64) {
    COUNTERS.sub_counts(arch::cpu_id(), tag, bytes, nr_calls);
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
        // changes nothing and charges nothing, like the untagged
        // allocations around it. A CPU's word is only ever given a token
        // (`this_cpu_token_profiling` relies on it).
        let Some(token) = COUNTERS.token(tag.tag_ref()) else {
            return Self::none();
        };
        let previous = arch::this_cpu()
            .alloc_tag_current()
            .swap(token.get(), Ordering::Relaxed);
        Self { cpu, previous }
    }

    /// A guard that changes nothing (profiling compiled out, or a scope
    /// opened before [`init`]).
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
            // A 0 found (a CPU's word before `init`) gives back the
            // untagged bucket: from `init` on, no word is 0.
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

/// `let _scope = alloc_tag_scope!();` charges every allocation this CPU
/// makes without a tag of its own (`Box`, `Vec`, `String`, plain
/// `SLAB.kmalloc`) to this call site until `_scope` is dropped.
#[cfg(feature = "alloc-profiling")]
#[macro_export]
macro_rules! alloc_tag_scope {
    () => {
        $crate::profiling::alloc_tag::AllocTagScope::enter($crate::magpie_codetag::alloc_tag!(
            $crate::magpie_codetag::CodeTagFlags::SCOPE
        ))
    };
}

/// `alloc_tag_scope!()` with profiling compiled out: a guard doing nothing.
#[cfg(not(feature = "alloc-profiling"))]
#[macro_export]
macro_rules! alloc_tag_scope {
    () => {
        $crate::profiling::alloc_tag::AllocTagScope::none()
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
pub fn mark() -> Result<usize, magpie_slab::AllocError> {
    let tags = AllocTag::all();
    let mut counts = Vec::new();
    crate::try_alloc!(counts.try_reserve_exact(tags.len()))?;
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
pub fn diff() -> Result<Option<(u64, Vec<DiffRow>)>, magpie_slab::AllocError> {
    let tags = AllocTag::all();
    let mut rows = Vec::new();
    crate::try_alloc!(rows.try_reserve_exact(tags.len()))?;
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
