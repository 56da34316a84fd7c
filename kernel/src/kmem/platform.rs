//! [`KernelPlatform`]: the machine as `magpie-slab` sees it. Every hook is
//! a call down: CPU id, count and offset, interrupt save/restore and the
//! TSC from `arch/`, cross-CPU calls from `smp`, backtraces, call sites and
//! context strings from `tracing/`, allocation-tag charges from
//! `profiling::alloc_tag`. Nothing here (nor below it) touches the
//! [`SLAB`](crate::kmem::SLAB) static this type parameterizes.

use core::ptr::NonNull;

use magpie_slab::{AllocTagHooks, Platform, PlatformHooks};

use crate::arch::{self, MAX_CPUS};
use crate::profiling::{alloc_tag, capture};
use crate::smp;
use crate::tracing::{call_site, context};

/// The machine as `magpie-slab` sees it.
pub struct KernelPlatform;

const _: () = assert!(arch::CPU_SLOT_BYTES == magpie_slab::CPU_SLOT_BYTES);

// SAFETY: CPU ids are dense and unique, below `arch::max_cpus()` (at most
// MAX_CPUS; the GS base of each CPU points at its own PerCpu); nothing
// preempts or migrates kernel code, and with interrupts off nothing else
// runs on a CPU; with them on, only this CPU's interrupt handlers, which
// run to completion with interrupts off (interrupt gates; the timer's
// handler never enables them) before the interrupted code resumes
// (LOCAL_TRYLOCK); `cpu_offset` is `cpu_id * CPU_SLOT_BYTES` (set with the
// id by `percpu::init_this_cpu`); `smp::cross_cpu_call` runs the work in
// the target's IPI handler (interrupts off there) or its polling loops,
// or here with interrupts off for this CPU or a CPU not running the
// kernel, and returns after it ran. The timer and wake-IPI handlers (the
// only handlers that run allocator code or cross-CPU work) send an
// interrupted restartable hit back to its start before anything else
// (`arch::idt`, RESTARTABLE_HITS).
unsafe impl Platform for KernelPlatform {
    const LOCAL_TRYLOCK: bool = true;
    const RESTARTABLE_HITS: bool = true;

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
        smp::cross_cpu_call(cpu, work)
    }

    #[inline]
    fn irq_save() -> usize {
        arch::irq_save()
    }

    #[inline]
    fn irq_restore(state: usize) {
        arch::irq_restore(state)
    }

    #[inline]
    fn in_interrupt() -> bool {
        arch::in_interrupt()
    }

    fn now() -> u64 {
        arch::rdtsc()
    }
}

// SAFETY: the hooks keep PlatformHooks' contract: the KFENCE pool (if any) is
// mapped and the platform's own, and charge tokens are the ones the token hooks
// return.
unsafe impl PlatformHooks for KernelPlatform {
    // The first frame outside the allocator (see `crate::tracing::call_site`).
    fn backtrace(frames: &mut [usize]) -> usize {
        call_site::backtrace(frames)
    }

    fn context(buf: &mut [u8; 32]) -> usize {
        context::write_this_cpu(buf)
    }

    // KFENCE: the pool is mapped with 4 KiB pages in the MMIO window
    // (`crate::mm::paging::map_kfence_pool`); see `crate::debug::kfence`.
    fn kfence_pool(nr_pages: usize) -> Option<NonNull<u8>> {
        crate::mm::paging::map_kfence_pool(nr_pages).and_then(|base| NonNull::new(base as *mut u8))
    }

    fn kfence_protect(page: usize, protect: bool) -> bool {
        crate::mm::paging::set_present(page, !protect)
    }

    fn kfence_clock_ns() -> u64 {
        arch::tsc::cycles_to_ns(arch::rdtsc())
    }

    // kmemtrace call sites: a frame-pointer walk over the allocator's text
    // range (see `crate::tracing::call_site`).
    #[inline(always)]
    fn caller_frames(frames: &mut [usize]) -> usize {
        call_site::caller_frames(frames)
    }
}

// SAFETY: `charge` and `uncharge` accept every token that `token` and
// `current_token` return (the defaults, or as the hooks below say).
unsafe impl AllocTagHooks for KernelPlatform {
    // Allocation profiling (kernel feature `alloc-profiling`): see
    // `crate::profiling::alloc_tag`.
    #[inline(always)]
    fn current() -> Option<magpie_slab::AllocTagRef> {
        alloc_tag::this_cpu_token()
            .and_then(magpie_codetag::alloc_tag::AllocTagCounters::token_tag_ref)
    }

    #[inline(always)]
    fn current_token() -> Option<magpie_slab::AllocTagRef> {
        Some(alloc_tag::this_cpu_token_profiling())
    }

    #[inline(always)]
    fn token(tag: magpie_slab::AllocTagRef) -> Option<magpie_slab::AllocTagRef> {
        alloc_tag::token(tag)
    }

    #[inline(always)]
    unsafe fn charge(token: magpie_slab::AllocTagRef, _ptr: NonNull<u8>, bytes: usize) {
        // SAFETY: the allocator's contract: `token` came from
        // `AllocTagHooks::token` (directly or through `AllocTagHooks::current_token`).
        unsafe { alloc_tag::charge(token, bytes) }
    }

    #[inline(always)]
    unsafe fn uncharge(token: magpie_slab::AllocTagRef, _ptr: NonNull<u8>, bytes: usize) {
        // SAFETY: the allocator's contract: `token` is the one this object
        // was charged with, not uncharged since.
        unsafe { alloc_tag::uncharge(token, bytes) }
    }

    // Context capture (`allocinfo ctx`): off the profiled hits, which
    // `kmem::ctx_capture_enable` turns off while a site is captured.
    #[inline]
    fn on_charge(token: magpie_slab::AllocTagRef, ptr: NonNull<u8>, bytes: usize) {
        capture::ctx_capture_alloc(token, ptr, bytes);
    }

    #[inline]
    fn on_uncharge(_token: magpie_slab::AllocTagRef, ptr: NonNull<u8>, _bytes: usize) {
        capture::ctx_capture_free(ptr);
    }
}
