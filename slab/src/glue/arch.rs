//! The architectures' instructions ([`glue::Arch`](super::Arch) implementations) behind the
//! shipped platforms: one type per architecture and privilege level, each
//! behind the feature of its architecture (`x86_64`, `riscv64`,
//! `aarch64`; built only for that `target_arch`).

#[cfg(any(feature = "x86_64", feature = "riscv64", feature = "aarch64"))]
use core::arch::asm;

#[cfg(any(feature = "x86_64", feature = "riscv64", feature = "aarch64"))]
use super::machine::Arch;

/// x86_64 in ring 0: CPU index in `IA32_TSC_AUX` (`rdtscp`; low 12 bits,
/// Linux's layout; a CPU without `rdtscp`, as QEMU's default `qemu64`,
/// needs [`Kernel::cpu_id`](super::Kernel::cpu_id) instead); interrupts with `pushfq; cli` and `sti` if they were
/// on; the clock `rdtsc`; System V frame records (`[rbp]`, `[rbp + 8]`).
#[cfg(all(feature = "x86_64", target_arch = "x86_64"))]
pub struct X86;

/// The interrupt flag in RFLAGS.
#[cfg(all(feature = "x86_64", target_arch = "x86_64"))]
const RFLAGS_IF: usize = 1 << 9;

// SAFETY: pushfq/cli saves and clears IF, `sti` only if it was set (so the
// pair nests); rdtscp's ecx is IA32_TSC_AUX; rbp is the frame pointer.
#[cfg(all(feature = "x86_64", target_arch = "x86_64"))]
unsafe impl Arch for X86 {
    const NEXT_FRAME_AT: isize = 0;
    const RETURN_ADDRESS_AT: isize = 8;

    #[inline(always)]
    fn cpu_register() -> usize {
        let aux: u32;
        // SAFETY: rdtscp reads the TSC and IA32_TSC_AUX; no memory.
        unsafe {
            asm!("rdtscp", out("eax") _, out("edx") _, out("ecx") aux,
                options(nomem, nostack, preserves_flags));
        }
        (aux & 0xfff) as usize
    }

    #[inline(always)]
    fn irq_save() -> usize {
        let rflags: usize;
        // SAFETY: reads RFLAGS through the stack and clears IF (ring 0).
        // Not `nomem`: a compiler barrier, so no access of the critical
        // section moves above it.
        unsafe { asm!("pushfq", "pop {}", "cli", out(reg) rflags, options(preserves_flags)) };
        rflags
    }

    #[inline(always)]
    fn irq_restore(state: usize) {
        if state & RFLAGS_IF != 0 {
            // SAFETY: interrupts were on at the matching irq_save. Not
            // `nomem`: a compiler barrier.
            unsafe { asm!("sti", options(nostack, preserves_flags)) };
        }
    }

    #[inline(always)]
    fn now() -> u64 {
        let (low, high): (u32, u32);
        // SAFETY: rdtsc reads the time-stamp counter; no memory.
        unsafe {
            asm!("rdtsc", out("eax") low, out("edx") high, options(nomem, nostack, preserves_flags));
        }
        (u64::from(high) << 32) | u64::from(low)
    }

    #[inline(always)]
    fn frame_pointer() -> usize {
        let frame_pointer: usize;
        // SAFETY: reads rbp; no memory.
        unsafe {
            asm!("mov {}, rbp", out(reg) frame_pointer, options(nomem, nostack, preserves_flags))
        };
        frame_pointer
    }
}

/// riscv64 in supervisor mode (under OpenSBI or another SBI): CPU index in
/// `tp` (xv6's convention); interrupts with `sstatus.SIE`; the clock
/// `rdtime`; frame records below `s0` (`[fp - 16]` the caller's frame
/// pointer, `[fp - 8]` the return address).
#[cfg(all(feature = "riscv64", target_arch = "riscv64"))]
pub struct Riscv64Supervisor;

/// riscv64 in machine mode (`-bios none`, no SBI): as
/// [`Riscv64Supervisor`] with `mstatus.MIE`.
#[cfg(all(feature = "riscv64", target_arch = "riscv64"))]
pub struct Riscv64Machine;

/// The riscv64 instructions, with the interrupt-enable bit and CSR of one
/// privilege level.
#[cfg(all(feature = "riscv64", target_arch = "riscv64"))]
macro_rules! riscv64_arch {
    ($type:ty, $csr:literal, $bit:literal) => {
        // SAFETY: csrrci saves and clears the interrupt-enable bit, csrs
        // sets it again only if it was set (so the pair nests); tp holds
        // the CPU index (Kernel promise 1); s0 is the frame pointer, the
        // record below it.
        unsafe impl Arch for $type {
            const NEXT_FRAME_AT: isize = -16;
            const RETURN_ADDRESS_AT: isize = -8;

            #[inline(always)]
            fn cpu_register() -> usize {
                let cpu: usize;
                // SAFETY: reads tp; no memory.
                unsafe { asm!("mv {}, tp", out(reg) cpu, options(nomem, nostack, preserves_flags)) };
                cpu
            }

            #[inline(always)]
            fn irq_save() -> usize {
                let status: usize;
                // SAFETY: clears the interrupt-enable bit, returning the
                // CSR's old value. Not `nomem`: a compiler barrier.
                unsafe {
                    asm!(concat!("csrrci {}, ", $csr, ", ", $bit), out(reg) status, options(nostack, preserves_flags));
                }
                status & $bit
            }

            #[inline(always)]
            fn irq_restore(state: usize) {
                if state != 0 {
                    // SAFETY: interrupts were on at the matching irq_save.
                    // Not `nomem`: a compiler barrier.
                    unsafe { asm!(concat!("csrsi ", $csr, ", ", $bit), options(nostack, preserves_flags)) };
                }
            }

            #[inline(always)]
            fn now() -> u64 {
                let time: u64;
                // SAFETY: reads the time CSR; no memory.
                unsafe { asm!("rdtime {}", out(reg) time, options(nomem, nostack, preserves_flags)) };
                time
            }

            #[inline(always)]
            fn frame_pointer() -> usize {
                let frame_pointer: usize;
                // SAFETY: reads s0; no memory.
                unsafe { asm!("mv {}, s0", out(reg) frame_pointer, options(nomem, nostack, preserves_flags)) };
                frame_pointer
            }
        }
    };
}

#[cfg(all(feature = "riscv64", target_arch = "riscv64"))]
riscv64_arch!(Riscv64Supervisor, "sstatus", 2);
#[cfg(all(feature = "riscv64", target_arch = "riscv64"))]
riscv64_arch!(Riscv64Machine, "mstatus", 8);

/// aarch64 at EL1: CPU index in `TPIDR_EL1`; interrupts with `DAIF.I`
/// (`msr daifset, #2`, the old `DAIF` restored); the clock `CNTVCT_EL0`;
/// AAPCS64 frame records (`[x29]`, `[x29 + 8]`).
#[cfg(all(feature = "aarch64", target_arch = "aarch64"))]
pub struct Aarch64El1;

// SAFETY: daifset masks IRQs after saving DAIF, which the restore writes
// back (so the pair nests); TPIDR_EL1 holds the CPU index (Kernel promise
// 1); x29 is the frame pointer.
#[cfg(all(feature = "aarch64", target_arch = "aarch64"))]
unsafe impl Arch for Aarch64El1 {
    const NEXT_FRAME_AT: isize = 0;
    const RETURN_ADDRESS_AT: isize = 8;

    #[inline(always)]
    fn cpu_register() -> usize {
        let cpu: usize;
        // SAFETY: reads TPIDR_EL1 (EL1); no memory.
        unsafe {
            asm!("mrs {}, tpidr_el1", out(reg) cpu, options(nomem, nostack, preserves_flags))
        };
        cpu
    }

    #[inline(always)]
    fn irq_save() -> usize {
        let daif: usize;
        // SAFETY: reads DAIF and masks IRQs (EL1). Not `nomem`: a compiler
        // barrier.
        unsafe {
            asm!("mrs {}, daif", "msr daifset, #2", out(reg) daif, options(nostack, preserves_flags))
        };
        daif
    }

    #[inline(always)]
    fn irq_restore(state: usize) {
        // SAFETY: writes back the DAIF the matching irq_save read. Not
        // `nomem`: a compiler barrier.
        unsafe { asm!("msr daif, {}", in(reg) state, options(nostack, preserves_flags)) };
    }

    #[inline(always)]
    fn now() -> u64 {
        let count: u64;
        // SAFETY: reads the virtual counter; no memory.
        unsafe {
            asm!("mrs {}, cntvct_el0", out(reg) count, options(nomem, nostack, preserves_flags))
        };
        count
    }

    #[inline(always)]
    fn frame_pointer() -> usize {
        let frame_pointer: usize;
        // SAFETY: reads x29; no memory.
        unsafe {
            asm!("mov {}, x29", out(reg) frame_pointer, options(nomem, nostack, preserves_flags))
        };
        frame_pointer
    }
}
