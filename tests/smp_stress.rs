//! SMP stress: every CPU runs at least 1,000,000 random alloc/free
//! operations at once over several kmalloc size classes and the
//! constructor-bearing `stress-ctor` cache, checking a per-object pattern
//! before each free; a quarter of frees cross CPUs through locked inboxes.
//! Afterwards every cache's allocated count is back where it was and the
//! page source has its pages back.
//!
//! Boots with 4 CPUs (the runner's default for `smp_*` test kernels).
//! `stress_ops=N` on the kernel command line (`MAGPIE_APPEND`) changes the
//! operations per CPU, e.g. for a quick run.

#![no_std]
#![no_main]
#![feature(custom_test_frameworks)]
#![test_runner(magpie::test_runner)]
#![reexport_test_harness_main = "test_main"]
#![allow(
    missing_docs,
    clippy::missing_panics_doc,
    reason = "#[test_case] functions are named for what they check and fail by panicking"
)]

use alloc::vec::Vec;
use core::sync::atomic::{AtomicUsize, Ordering};

use magpie::kmem::{KPAGES, KernelPlatform, SLAB};
use magpie::smp::stress::{self, StressConfig};
use magpie::{arch, println, smp};
use magpie_slab::KmemCache;

/// Operations per CPU the issue asks for.
const NR_OPS: u64 = 1_000_000;

magpie::test_kernel!();

fn nr_ops() -> u64 {
    magpie::mm::boot_info::get()
        .and_then(|boot| boot.arg("stress_ops"))
        .and_then(|value| value.parse().ok())
        .unwrap_or(NR_OPS)
}

#[test_case]
fn every_cpu_is_online() {
    assert!(
        smp::nr_online() >= 2,
        "the SMP tests need at least 2 CPUs (MAGPIE_SMP)"
    );
    assert_eq!(
        smp::nr_online(),
        arch::max_cpus(),
        "every CPU in the MADT started"
    );
    for cpu in 0..arch::max_cpus() {
        assert!(smp::is_online(cpu), "cpu {cpu} is {:?}", smp::state(cpu));
    }
    println!("{} CPUs online", smp::nr_online());
}

#[test_case]
fn work_runs_on_the_cpu_it_was_posted_to() {
    static SEEN: [AtomicUsize; arch::MAX_CPUS] =
        [const { AtomicUsize::new(usize::MAX) }; arch::MAX_CPUS];
    for cpu in smp::online_cpus() {
        let completion = smp::run_on(cpu, move || {
            SEEN[cpu].store(arch::cpu_id(), Ordering::Release);
        })
        .expect("online");
        completion.wait();
        assert_eq!(SEEN[cpu].load(Ordering::Acquire), cpu);
    }
    // All at once, borrowing from this stack frame.
    let ran = AtomicUsize::new(0);
    smp::run_on_all(&|cpu| {
        assert_eq!(arch::cpu_id(), cpu);
        assert_eq!(arch::this_cpu().cpu_id(), cpu);
        ran.fetch_add(1, Ordering::AcqRel);
    });
    assert_eq!(ran.load(Ordering::Acquire), smp::nr_online());
}

#[test_case]
fn aps_have_their_own_stacks_and_tables() {
    let stacks: Vec<AtomicUsize> = (0..arch::max_cpus()).map(|_| AtomicUsize::new(0)).collect();
    smp::run_on_all(&|cpu| {
        let marker = 0u8;
        stacks[cpu].store(core::ptr::addr_of!(marker) as usize, Ordering::Release);
        // Same page tables on every CPU.
        let (frame, _) = x86_64::registers::control::Cr3::read();
        assert_eq!(
            frame.start_address().as_u64(),
            magpie::mm::paging::kernel_pml4()
        );
    });
    let mut seen: Vec<usize> = stacks
        .iter()
        .map(|s| s.load(Ordering::Acquire) >> 16)
        .collect();
    seen.sort_unstable();
    seen.dedup();
    assert_eq!(
        seen.len(),
        arch::max_cpus(),
        "each CPU runs on its own stack"
    );
}

/// `nr_allocated` of every cache, written into a buffer reserved up front
/// (so taking the snapshot allocates nothing).
fn snapshot(into: &mut Vec<(&'static KmemCache<KernelPlatform>, usize)>) {
    into.clear();
    SLAB.for_each_cache(|cache| {
        assert!(into.len() < into.capacity(), "snapshot buffer too small");
        into.push((cache, cache.stats().nr_allocated));
    });
}

#[test_case]
fn million_random_ops_per_cpu_leave_nothing_behind() {
    let ctor_cache = stress::ctor_cache().expect("stress-ctor cache");
    let cpus: Vec<usize> = smp::online_cpus().collect();
    let mut config = StressConfig::new(cpus, nr_ops());
    config.min_size = 8;
    config.max_size = 1024; // kmalloc-8 … kmalloc-1024: eight size classes
    config.seed = 0x5eed;
    let mut before = Vec::with_capacity(256);
    let mut after = Vec::with_capacity(256);
    SLAB.reap_all();
    snapshot(&mut before);
    let pages_before = KPAGES.nr_pages_out();
    let ctor_runs_before = stress::nr_ctor_runs();

    let start = arch::rdtsc();
    let report = stress::run(&config).expect("every CPU online");
    let cycles = arch::rdtsc() - start;

    // Printed to the console through a writer that allocates nothing (the
    // allocator's counts are compared after the run) and keeps the header.
    let mut out = HeaderTee {
        header: [0; 128],
        len: 0,
        done: false,
    };
    stress::print_report(&report, &mut out);
    // Times in units people read: ns per op, never TSC cycles.
    let header = core::str::from_utf8(&out.header[..out.len]).unwrap();
    assert!(header.trim_end().ends_with("ns/op"), "{header}");
    assert!(!header.contains("cycles"), "{header}");
    println!(
        "{} ms (TSC), stress-ctor constructor ran {} times",
        arch::tsc::cycles_to_us(cycles) / 1000,
        stress::nr_ctor_runs() - ctor_runs_before
    );
    for cpu in &report.per_cpu {
        assert!(
            cpu.nr_ops >= config.nr_ops,
            "cpu {} ran {} ops",
            cpu.cpu,
            cpu.nr_ops
        );
        assert_eq!(
            cpu.nr_corruptions, 0,
            "cpu {}: corruption {:x?}",
            cpu.cpu, cpu.first_corruption
        );
        assert_eq!(
            cpu.nr_failures, 0,
            "cpu {}: failed allocs or frees",
            cpu.cpu
        );
        assert!(
            cpu.nr_cross_frees > 0,
            "cpu {}: no cross-CPU frees",
            cpu.cpu
        );
    }
    assert_eq!(
        report.nr_dtor_mismatches, 0,
        "stress-ctor objects not constructed at destruction"
    );
    assert_eq!(
        report.total(|cpu| cpu.nr_allocs),
        report.total(|cpu| cpu.nr_frees)
    );
    assert!(
        stress::nr_ctor_runs() > ctor_runs_before,
        "the constructor-bearing cache was used"
    );
    drop(report);

    SLAB.reap_all();
    snapshot(&mut after);
    assert_eq!(before.len(), after.len(), "no cache came or went");
    for ((cache, nr_before), (_, nr_after)) in before.iter().zip(&after) {
        assert_eq!(
            nr_after,
            nr_before,
            "{}: allocated count after the run",
            cache.name()
        );
    }
    assert_eq!(ctor_cache.stats().nr_allocated, 0);
    // Reaped pages wait in the quarantine (docs/HARDENING.md) first.
    magpie::kmem::KPAGES_QUARANTINED.flush();
    let pages_after = KPAGES.nr_pages_out();
    println!("kpages: {pages_before} pages out before, {pages_after} after reaping");
    assert!(
        pages_after <= pages_before,
        "page source did not get its pages back: {pages_before} before, {pages_after} after"
    );
}

/// Writes to the console and keeps the first line (up to 128 bytes).
struct HeaderTee {
    header: [u8; 128],
    len: usize,
    done: bool,
}

impl core::fmt::Write for HeaderTee {
    fn write_str(&mut self, text: &str) -> core::fmt::Result {
        for &byte in text.as_bytes() {
            if self.done || byte == b'\n' {
                self.done = true;
            } else if self.len < self.header.len() {
                self.header[self.len] = byte;
                self.len += 1;
            }
        }
        magpie::shell::ConsoleWriter.write_str(text)
    }
}
