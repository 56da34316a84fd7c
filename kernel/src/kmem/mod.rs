//! Kernel memory above the frame allocator: the `kpages` arena and the slab
//! allocator that the rest of the kernel (and `#[global_allocator]`) uses.
//!
//! ```text
//!  Box / Vec / String ─┐
//!  shell kmalloc/kfree ├─► SLAB: magpie_slab::Allocator<KernelPlatform>
//!  kmem_cache users  ──┘        kmalloc-8 … kmalloc-8192, kmem_* caches
//!                                       │ whole pages
//!                               KPAGES: Arena (PageSource)
//!                                       │ contiguous frames
//!                               frame:: bitmap over all usable RAM ("base")
//! ```
//!
//! This module is the whole adoption surface of `magpie-slab` in this
//! kernel: [`KernelPlatform`] (CPU id and count, interrupt save/restore, TSC
//! clock, frame-pointer backtraces, a per-CPU context string) and [`Arena`]
//! (pages from the frame allocator, addressed through the direct map).

pub mod heap;

use core::ptr::NonNull;
use core::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use magpie_slab::{AllocError, Allocator, ArenaStats, PAGE_SIZE, PageSource, Platform};
use spin::Mutex;

use crate::arch::{self, MAX_CPUS};
use crate::debug::symbols;
use crate::mm::{frame, layout, paging};

/// The machine as `magpie-slab` sees it.
pub struct KernelPlatform;

const _: () = assert!(arch::CPU_SLOT_BYTES == magpie_slab::CPU_SLOT_BYTES);

// SAFETY: CPU ids are dense and unique, below `arch::max_cpus()` (at most
// MAX_CPUS; the GS base of each CPU points at its own PerCpu); nothing
// preempts or migrates kernel code, and with interrupts off nothing else
// runs on a CPU; `cpu_offset` is `cpu_id * CPU_SLOT_BYTES` (set with the
// id by `percpu::init_this_cpu`); `smp::cross_cpu_call` runs the work in
// the target's IPI handler (interrupts off there) or its polling loops,
// or here with interrupts off for this CPU or a CPU not running the
// kernel, and returns after it ran.
unsafe impl Platform for KernelPlatform {
    fn max_cpus() -> usize {
        arch::max_cpus().clamp(1, MAX_CPUS)
    }

    #[inline]
    fn cpu_id() -> usize {
        arch::cpu_id()
    }

    #[inline(always)]
    fn cpu_offset() -> usize {
        arch::cpu_offset()
    }

    fn cross_cpu_call(cpu: usize, work: &(dyn Fn() + Sync)) {
        crate::smp::cross_cpu_call(cpu, work)
    }

    #[inline]
    fn irq_save() -> usize {
        arch::irq_save()
    }

    #[inline]
    fn irq_restore(state: usize) {
        arch::irq_restore(state)
    }

    fn now() -> u64 {
        arch::rdtsc()
    }

    fn backtrace(frames: &mut [usize]) -> usize {
        // Skip the frames of the allocator itself (trace recording, the
        // cache's alloc, kmalloc, the GlobalAlloc shim, `alloc::` glue): the
        // interesting frame is the first one outside them.
        let mut all = [0usize; 48];
        let depth = symbols::backtrace(&mut all);
        let first = all[..depth]
            .iter()
            .position(|&address| !is_allocator_frame(address))
            .unwrap_or(0);
        let take = (depth - first).min(frames.len());
        frames[..take].copy_from_slice(&all[first..first + take]);
        take
    }

    fn context(buf: &mut [u8; 32]) -> usize {
        let cpu = arch::cpu_id();
        let what = *CONTEXT[cpu.min(MAX_CPUS - 1)].lock();
        let mut writer = ByteWriter { buf, len: 0 };
        let _ = core::fmt::write(&mut writer, format_args!("cpu{cpu} {what}"));
        writer.len
    }

    // kmemtrace call sites: a frame-pointer walk over the allocator's text
    // range (see `crate::tracing::event_stream`).
    #[inline(always)]
    fn caller_frames(frames: &mut [usize]) -> usize {
        crate::tracing::event_stream::caller_frames(frames)
    }

    // Allocation profiling (kernel feature `alloc-profiling`): see
    // `crate::profiling`.
    #[inline(always)]
    fn alloc_tag_current() -> Option<magpie_slab::AllocTagRef> {
        crate::profiling::this_cpu_token()
            .and_then(magpie_codetag::alloc_tag::AllocTagCounters::token_tag_ref)
    }

    #[inline(always)]
    fn alloc_tag_current_token() -> Option<magpie_slab::AllocTagRef> {
        crate::profiling::this_cpu_token()
    }

    #[inline(always)]
    fn alloc_tag_token(tag: magpie_slab::AllocTagRef) -> Option<magpie_slab::AllocTagRef> {
        crate::profiling::token(tag)
    }

    #[inline(always)]
    unsafe fn alloc_tag_charge_token(
        token: magpie_slab::AllocTagRef,
        ptr: NonNull<u8>,
        bytes: usize,
    ) {
        // SAFETY: the allocator's contract: `token` came from
        // `alloc_tag_token` (directly or through `alloc_tag_current_token`).
        unsafe { crate::profiling::charge(token, ptr, bytes) }
    }

    #[inline(always)]
    unsafe fn alloc_tag_uncharge(token: magpie_slab::AllocTagRef, ptr: NonNull<u8>, bytes: usize) {
        // SAFETY: the allocator's contract: `token` is the one this object
        // was charged with, not uncharged since.
        unsafe { crate::profiling::uncharge(token, ptr, bytes) }
    }
}

/// Whether a return address lies in allocator plumbing rather than in the
/// code that asked for memory.
fn is_allocator_frame(address: usize) -> bool {
    let Some((name, _)) = symbols::lookup(address) else {
        return false;
    };
    // Mangled (v0 or legacy) names contain the path segments with lengths;
    // matching on the crate/module names is enough and allocation-free.
    const PLUMBING: [&str; 6] = [
        "magpie_slab",
        "kmem14KernelPlatform",
        "kmemNtB",
        "5alloc5alloc",
        "__rust",
        "4heap",
    ];
    name.contains("KernelPlatform")
        || name.contains("9profiling") // allocation-tag context capture
        || PLUMBING.iter().any(|needle| name.contains(needle))
        || name.contains("alloc..alloc")
        || name.contains("__rdl_")
        || name.contains("__rg_")
}

struct ByteWriter<'a> {
    buf: &'a mut [u8; 32],
    len: usize,
}

impl core::fmt::Write for ByteWriter<'_> {
    fn write_str(&mut self, s: &str) -> core::fmt::Result {
        let room = self.buf.len() - self.len;
        let take = s.len().min(room);
        self.buf[self.len..self.len + take].copy_from_slice(&s.as_bytes()[..take]);
        self.len += take;
        Ok(())
    }
}

/// What each CPU is doing, for trace records ("shell kmalloc", "boot").
static CONTEXT: [Mutex<&'static str>; MAX_CPUS] = [const { Mutex::new("boot") }; MAX_CPUS];

/// Sets this CPU's context string until the returned guard is dropped.
pub fn enter_context(what: &'static str) -> ContextGuard {
    let cpu = arch::cpu_id().min(MAX_CPUS - 1);
    let _irq = arch::IrqGuard::new();
    let previous = core::mem::replace(&mut *CONTEXT[cpu].lock(), what);
    ContextGuard { cpu, previous }
}

/// Restores the previous context string when dropped.
pub struct ContextGuard {
    cpu: usize,
    previous: &'static str,
}

impl Drop for ContextGuard {
    fn drop(&mut self) {
        let _irq = arch::IrqGuard::new();
        *CONTEXT[self.cpu].lock() = self.previous;
    }
}

/// A page source over the frame allocator: whole pages, addressed through
/// the direct map. Akaros calls the kernel's page arena `kpages`.
pub struct Arena {
    name: &'static str,
    nr_pages_out: AtomicUsize,
    nr_allocs_ever: AtomicU64,
}

impl Arena {
    const fn new(name: &'static str) -> Self {
        Self {
            name,
            nr_pages_out: AtomicUsize::new(0),
            nr_allocs_ever: AtomicU64::new(0),
        }
    }

    /// Pages this arena has handed out and not had back.
    pub fn nr_pages_out(&self) -> usize {
        self.nr_pages_out.load(Ordering::Relaxed)
    }
}

impl PageSource for Arena {
    fn name(&self) -> &str {
        self.name
    }

    /// Pages from the frame allocator; when it has none, reap every cache
    /// once (empty slabs, magazines and depots go back to the frame
    /// allocator) and try again before failing. `magpie-slab` calls a page
    /// source with none of its locks held, so the reap cannot deadlock;
    /// kernel code must not allocate inside `SLAB.for_each_cache` for the
    /// same reason (the reap takes the cache-list lock).
    fn alloc_pages(&self, nr_pages: usize) -> Result<NonNull<u8>, AllocError> {
        let phys = frame::alloc_contiguous(nr_pages)
            .or_else(|| {
                reap_for_retry();
                frame::alloc_contiguous(nr_pages)
            })
            .ok_or(AllocError::OutOfMemory)?;
        self.nr_pages_out.fetch_add(nr_pages, Ordering::Relaxed);
        self.nr_allocs_ever.fetch_add(1, Ordering::Relaxed);
        NonNull::new(layout::phys_to_virt(phys.as_u64()) as *mut u8).ok_or(AllocError::OutOfMemory)
    }

    unsafe fn free_pages(&self, addr: NonNull<u8>, nr_pages: usize) {
        let phys = paging::virt_to_phys(addr.as_ptr() as usize)
            .expect("kpages: freed pages are not in the direct map");
        frame::free(frame::PhysAddr::new(phys), nr_pages);
        self.nr_pages_out.fetch_sub(nr_pages, Ordering::Relaxed);
    }

    fn span(&self) -> (usize, usize) {
        paging::direct_map_span()
    }

    fn stats(&self) -> ArenaStats {
        // kpages holds exactly what it imported from the frame allocator.
        let bytes = self.nr_pages_out() * PAGE_SIZE;
        ArenaStats {
            total_bytes: bytes,
            alloc_bytes: bytes,
            nr_allocs_ever: self.nr_allocs_ever.load(Ordering::Relaxed),
        }
    }
}

/// Reaps every cache so that a failed page allocation can be retried; one
/// reap at a time (an allocation failing during the reap, or on another CPU
/// meanwhile, retries without reaping again).
fn reap_for_retry() {
    static REAPING: AtomicBool = AtomicBool::new(false);
    if SLAB.is_ready() && !REAPING.swap(true, Ordering::Acquire) {
        let nr_pages = SLAB.reap_all();
        REAPING.store(false, Ordering::Release);
        log::debug!("kpages: out of frames; reaped {nr_pages} pages");
    }
}

/// Statistics of the frame allocator, shown as the `base` arena.
pub fn base_stats() -> ArenaStats {
    let stats = frame::stats();
    ArenaStats {
        total_bytes: stats.nr_total * PAGE_SIZE,
        alloc_bytes: (stats.nr_total - stats.nr_free) * PAGE_SIZE,
        nr_allocs_ever: stats.nr_allocs_ever,
    }
}

/// The kernel's page arena: slabs and page-granular kmalloc come from here.
pub static KPAGES: Arena = Arena::new("kpages");

/// The kernel's slab allocator.
pub static SLAB: Allocator<KernelPlatform> = Allocator::new();

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
    crate::debug::slab_debug::configure(cmdline);
    SLAB.init(&KPAGES)
        .unwrap_or_else(|error| panic!("slab allocator failed to start: {error}"));
    crate::profiling::init();
    log::info!(
        "slab allocator up: {} caches, {} CPU(s), {} pages from kpages",
        {
            let mut nr = 0;
            SLAB.for_each_cache(|_| nr += 1);
            nr
        },
        SLAB.nr_cpus(),
        KPAGES.nr_pages_out()
    );
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
            let nr_records = cache.trace_stats().nr_records;
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
