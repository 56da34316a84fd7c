//! Kernel memory above the frame allocator: the `kpages` arena and the slab
//! allocator that the rest of the kernel (and `#[global_allocator]`) uses.
//!
//! ```text
//!  Box / Vec / String ─┐
//!  shell kmalloc/kfree ├─► SLAB: magpie_slab::Kmem<KernelPlatform>
//!  kmem_cache users  ──┘        kmalloc-8 … kmalloc-8192, kmem_* caches
//!                                       │ whole pages
//!                               KPAGES: Arena (PageSource)
//!                                       │ contiguous frames
//!                               frame:: bitmap over all usable RAM ("base")
//! ```
//!
//! This folder is the whole adoption surface of `magpie-slab` in this
//! kernel:
//!
//! * this file: the [`SLAB`] static, its start ([`init`]: debug
//!   configuration, page source, reclaim, profiling), the profiling switch
//!   and `kmem_cache_destroy`;
//! * [`platform`]: [`KernelPlatform`] (CPU id and count, interrupt
//!   save/restore, TSC clock, cross-CPU calls, backtraces, call sites, a
//!   per-CPU context string, allocation-tag charges), every hook a call
//!   down into `arch`, `smp`, `tracing` or `profiling::alloc_tag`, none of
//!   which touches `SLAB`;
//! * [`kpages`]: [`Arena`] (pages from the frame allocator, addressed
//!   through the direct map), which reaps through a function `init`
//!   registers rather than by naming `SLAB`;
//! * [`heap`]: the `#[global_allocator]` shim.

pub mod heap;
pub mod kpages;
pub mod platform;

use magpie_codetag::alloc_tag::SwitchLocked;
use magpie_slab::Kmem;

pub use self::kpages::{Arena, KPAGES, base_stats};
pub use self::platform::KernelPlatform;
use crate::debug::slab_debug;
use crate::profiling::alloc_tag;

/// The kernel's slab allocator.
pub static SLAB: Kmem<KernelPlatform> = Kmem::new();

/// [`KPAGES`] as the slab allocator sees it: freed slab pages (and
/// page-granular kmalloc blocks) wait in a quarantine of 256 pages (1 MiB)
/// before another cache can reuse them (issue 33, `docs/HARDENING.md`).
pub static KPAGES_QUARANTINED: magpie_slab::quarantine::Quarantine<KernelPlatform, Arena> =
    magpie_slab::quarantine::Quarantine::new(&KPAGES, 256);

/// Brings the slab allocator up on [`KPAGES`]; from then on the global
/// allocator serves new allocations from it. Panics if that fails: without
/// it the kernel has no heap worth the name.
///
/// # Panics
///
/// If the slab allocator cannot start (see above).
pub fn init(cmdline: &str) {
    // `slab_debug=` / `kmem_flags=` must reach the allocator before it
    // creates the kmalloc caches; its report hook prints every bad free
    // and every corruption it finds (`crate::debug::slab_debug`).
    SLAB.debug().set_config(slab_debug::configure(cmdline));
    SLAB.debug().set_error_hook(Some(slab_debug::report));
    // Debug builds: a lock class taken both in interrupt context and with
    // interrupts on is printed (`magpie_slab::lockdep`), not a panic.
    magpie_slab::lockdep::set_report_hook(Some(|report| {
        crate::dev::console::write_fmt(format_args!("BUG: lockdep: {report}\n"));
    }));
    // Profiling off until `sync_alloc_profiling` below says otherwise: the
    // caches are created untagged, so with `mem_profiling=0|never` their
    // free hit is the plain one (switching off after the caches were
    // tagged keeps the `TAGGED` free path: objects may carry references).
    // Nothing is charged before `alloc_tag::init` either way.
    SLAB.profiling().set_enabled(false);
    SLAB.init(&KPAGES_QUARANTINED)
        .unwrap_or_else(|error| panic!("slab allocator failed to start: {error}"));
    // Out of frames, kpages reaps every cache and tries again.
    KPAGES.set_reclaim(|| SLAB.reap_all());
    // kmemstat's arena rows, for `magpie-kmem core CORE kmemstat`: as the
    // shell's `kmemstat` writes them (base > kpages > the caches, then
    // the bootstrap heap).
    if let Some(base) = kpages::base_description() {
        magpie_slab::descriptor::describe_kmemstat(
            &[base, KPAGES.description(1)],
            2,
            &[heap::bootstrap_description()],
        );
    }
    // The roots of `magpie-kmem core CORE findleaks`.
    crate::debug::findleaks::describe_roots();
    if alloc_tag::COMPILED_IN {
        alloc_tag::init(&KPAGES);
        sync_alloc_profiling();
    }
    log::info!(
        "slab allocator up: {} caches, {} CPU(s), {} pages from kpages",
        {
            let mut nr = 0;
            SLAB.for_each_cache(|_| nr += 1);
            nr
        },
        SLAB.stats().nr_cpus(),
        KPAGES.nr_pages_out()
    );
}

/// Tells the slab allocator whether profiling is on, so that with it off
/// the alloc fast path does not even ask for the current tag. Called
/// whenever [`alloc_tag::SWITCH`] changes (after [`init`]: the slab
/// allocator is up by then).
fn sync_alloc_profiling() {
    SLAB.profiling().set_enabled(alloc_tag::SWITCH.is_on());
}

/// `allocinfo on|off`: switches allocation profiling at run time, and the
/// slab allocator's profiled paths with it.
///
/// # Errors
///
/// [`SwitchLocked`] when the boot argument was `mem_profiling=never`.
pub fn set_alloc_profiling(on: bool) -> Result<(), SwitchLocked> {
    let result = if on {
        alloc_tag::SWITCH.enable()
    } else {
        alloc_tag::SWITCH.disable()
    };
    sync_alloc_profiling();
    result
}

/// `allocinfo ctx FILE:LINE enable`: captures the context of the new
/// objects of the site whose charge token is `token`
/// ([`crate::profiling::ctx_enable`]), and turns the slab allocator's tag
/// hooks on, so that every allocation and free goes through the hooks
/// that capture (the profiled hits call out to nothing:
/// [`AllocProfiling::set_tag_hooks`](magpie_slab::AllocProfiling::set_tag_hooks)).
pub fn ctx_capture_enable(token: Option<magpie_slab::AllocTagRef>) {
    crate::profiling::ctx_enable(token);
    SLAB.profiling().set_tag_hooks(token.is_some());
}

/// `allocinfo ctx FILE:LINE disable`: the hits back, then the capture
/// stopped and its records dropped ([`crate::profiling::ctx_disable`]).
pub fn ctx_capture_disable() {
    SLAB.profiling().set_tag_hooks(false);
    crate::profiling::ctx_disable();
}

/// Destroys `cache` (Akaros `kmem_cache_destroy`), warning on the console
/// when it still has trace records: objects that were traced and never
/// freed, i.e. a probable leak in the cache's users. The allocator refuses
/// to destroy a cache with objects out, so the usual case is a refusal with
/// a warning that points at `kmemtrace print`.
///
/// # Errors
///
/// [`magpie_slab::DestroyError`] when objects are still allocated or the
/// cache is permanent; the cache is then left intact.
///
/// # Safety
///
/// No object of `cache` may be used after this returns `Ok`, and nobody may
/// call into `cache` afterwards (its memory goes back to the `kmem_cache` cache).
pub unsafe fn cache_destroy(
    cache: &'static magpie_slab::KmemCache<KernelPlatform>,
) -> Result<magpie_slab::DestroyReport, magpie_slab::DestroyError> {
    let mut name = [0u8; 32];
    let len = cache.name().len().min(name.len());
    name[..len].copy_from_slice(&cache.name().as_bytes()[..len]);
    let name_str = || core::str::from_utf8(&name[..len]).unwrap_or("?");
    // SAFETY: forwarded from this function's contract.
    let report = match unsafe { cache.destroy() } {
        Ok(report) => report,
        Err(error) => {
            let nr_records = cache.trace_table().stats().nr_records;
            if nr_records > 0 {
                log::warn!(
                    "kmem_cache_destroy: {} refused ({error}); {nr_records} traced object(s) never freed: \
                     see 'kmemtrace print {}'",
                    name_str(),
                    name_str()
                );
            }
            return Err(error);
        }
    };
    if report.nr_trace_records_dropped > 0 {
        log::warn!(
            "kmem_cache_destroy: {} still had {} trace record(s) (traced objects never freed); dropped them",
            name_str(),
            report.nr_trace_records_dropped
        );
    }
    Ok(report)
}
