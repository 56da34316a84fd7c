//! [`X86Uniprocessor`]: the [`Platform`] of a one-CPU x86_64 kernel.

use core::arch::asm;

use crate::{Platform, PlatformHooks};

/// The [`Platform`] of an x86_64 kernel running on one CPU (feature
/// `x86_64-uniprocessor`): CPU 0 of 1; interrupts saved with `pushfq`
/// and turned off with `cli`, turned back on with `sti` only if they
/// were on; the clock is `rdtsc`; no backtraces (trace records and
/// kmemtrace events carry no call stack: implement [`Platform`] yourself,
/// starting from this file, for a frame-pointer walk).
///
/// Runs in ring 0 only (`cli`/`sti` fault elsewhere).
pub struct X86Uniprocessor;

/// The interrupt flag in RFLAGS.
const RFLAGS_IF: usize = 1 << 9;

// SAFETY: one CPU, id 0 (max_cpus 1); `irq_save` clears IF, so between it
// and `irq_restore` no interrupt handler runs on the only CPU, and nothing
// else runs at all; the default `cpu_offset` (0) and `cross_cpu_call`
// (run here with interrupts off: the target is this CPU) are right for
// one CPU.
unsafe impl Platform for X86Uniprocessor {
    #[inline(always)]
    fn max_cpus() -> usize {
        1
    }

    #[inline(always)]
    fn cpu_id() -> usize {
        0
    }

    #[inline(always)]
    fn irq_save() -> usize {
        let rflags: usize;
        // SAFETY: reads RFLAGS through the stack and clears IF: ring 0
        // (the type's documented requirement). Not `nomem`: the asm is a
        // compiler barrier, so no access of the critical section moves
        // above it.
        unsafe { asm!("pushfq", "pop {}", "cli", out(reg) rflags, options(preserves_flags)) };
        rflags
    }

    #[inline(always)]
    fn irq_restore(state: usize) {
        if state & RFLAGS_IF != 0 {
            // SAFETY: interrupts were on at the matching irq_save. Not
            // `nomem`: a compiler barrier, so no access of the critical
            // section moves below it.
            unsafe { asm!("sti", options(nostack, preserves_flags)) };
        }
    }

    #[inline(always)]
    fn now() -> u64 {
        let (low, high): (u32, u32);
        // SAFETY: rdtsc reads the time-stamp counter; no memory.
        unsafe {
            asm!("rdtsc", out("eax") low, out("edx") high, options(nomem, nostack, preserves_flags))
        };
        (u64::from(high) << 32) | u64::from(low)
    }
}

// SAFETY: the hooks keep PlatformHooks' contract: the KFENCE pool (if any) is
// mapped and the platform's own, and charge tokens are the ones the token hooks
// return.
unsafe impl PlatformHooks for X86Uniprocessor {
    fn backtrace(_frames: &mut [usize]) -> usize {
        0
    }

    fn context(buf: &mut [u8; 32]) -> usize {
        let name = b"cpu0";
        buf[..name.len()].copy_from_slice(name);
        name.len()
    }
}
