//! The shipped x86_64 platform with several CPUs, booted (issue 32):
//! a `Heap<glue::X86_64<FourCpus>>` of its own (an 8 MiB region from the
//! kernel's heap; not the kernel's allocator) used by the 4 CPUs at once.
//! Each CPU allocates stamped objects of several sizes, frees most of
//! them itself and hands the rest to the next CPU, which checks and frees
//! them (cross-CPU frees); CPU 0 reaps every 20 rounds, which drains
//! every CPU's magazines through the platform's cross-CPU calls (its
//! mailboxes; `send_ipi` is the kernel's cross-CPU call, whose wake IPI
//! handler runs `Machine::handle_cross_cpu_calls`). After: every object checked, the heap empty,
//! `verify` and the invariant check clean.
//!
//! The CPU index: `FourCpus` returns the kernel's (`gs:`, one `mov`)
//! through `Kernel::cpu_id`, since QEMU's default CPU (`qemu64`, TCG) has
//! no `rdtscp`; where the CPU has it, the index is also written to
//! `IA32_TSC_AUX` and the platform's register read checked against it.
//!
//! Boots with 4 CPUs (the runner's default for `smp_*` test kernels).

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
use core::alloc::{GlobalAlloc, Layout};
use core::sync::atomic::{AtomicUsize, Ordering};

use magpie::{arch, println, smp};
use magpie_slab::glue::{Arch, Heap, Kernel, X86_64};
use magpie_slab::{AllocTagHooks, PageSource, PlatformHooks};
use spin::Mutex;

magpie::test_kernel!();

/// The kernel side of the platform: 4 CPUs, the kernel's CPU index, and
/// the kernel's cross-CPU call as the IPI.
struct FourCpus;

// SAFETY: the defaults: no stacks, no profiling tags, no KFENCE pool.
unsafe impl PlatformHooks for FourCpus {}
// SAFETY: the defaults: no tags.
unsafe impl AllocTagHooks for FourCpus {}

// SAFETY: 4 CPUs (checked against the kernel's before the heap is used),
// each with its dense kernel index (`arch::cpu_id`, fixed at bring-up),
// each online (Machine::cpu_online) before the heap is used;
// send_ipi makes `cpu` run handle_cross_cpu_calls in its wake IPI handler
// (interrupts off; or in its polling while it waits, as the kernel's
// cross-CPU calls do); no preemption (the kernel has none), no interrupt
// handler touches HEAP.
unsafe impl Kernel for FourCpus {
    const MAX_CPUS: usize = 4;

    fn send_ipi(cpu: usize) {
        // The kernel's wake IPI: `cpu` runs the platform's handler inside
        // its IPI handler, interrupts off (returns once it ran there).
        smp::cross_cpu_call(cpu, &P::handle_cross_cpu_calls);
    }

    #[inline(always)]
    fn cpu_id() -> Option<usize> {
        Some(arch::cpu_id())
    }
}

type P = X86_64<FourCpus>;

static HEAP: Heap<P> = Heap::new();

const REGION_BYTES: usize = 8 << 20;
const NR_ROUNDS: usize = 40;
/// CPU 0 reaps every this many rounds.
const REAP_EVERY: usize = 20;
const SIZES: [usize; 5] = [16, 64, 200, 1000, 3000];

/// Objects handed to each CPU: (address, size, stamp).
static INBOX: [Mutex<Vec<(usize, usize, u64)>>; 4] = [const { Mutex::new(Vec::new()) }; 4];
static FINISHED: AtomicUsize = AtomicUsize::new(0);
static CROSS_FREES: AtomicUsize = AtomicUsize::new(0);

fn stamp_of(cpu: usize, round: usize, i: usize) -> u64 {
    0x5eed_0000_0000_0000 ^ ((cpu as u64) << 40) ^ ((round as u64) << 16) ^ i as u64
}

fn layout(size: usize) -> Layout {
    Layout::from_size_align(size, 8).unwrap()
}

/// An object of `size` bytes, every word `stamp`.
fn alloc_stamped(size: usize, stamp: u64) -> usize {
    // SAFETY: a non-zero size.
    let ptr = unsafe { HEAP.alloc(layout(size)) };
    assert!(!ptr.is_null(), "the heap ran out");
    #[expect(
        clippy::cast_ptr_alignment,
        reason = "allocated with alignment 8 (layout)"
    )]
    let ptr = ptr.cast::<u64>();
    for word in 0..size / 8 {
        // SAFETY: within the object just allocated.
        unsafe { ptr.add(word).write(stamp) };
    }
    ptr as usize
}

/// Check every word of the object is `stamp`, then free it.
fn check_and_free(addr: usize, size: usize, stamp: u64) {
    let ptr = addr as *mut u64;
    for word in 0..size / 8 {
        // SAFETY: an object of `size` bytes allocated by alloc_stamped.
        let found = unsafe { ptr.add(word).read() };
        assert_eq!(found, stamp, "object {addr:#x} word {word} overwritten");
    }
    // SAFETY: allocated from HEAP with this layout, freed once.
    unsafe { HEAP.dealloc(addr as *mut u8, layout(size)) };
}

/// Check and free what other CPUs handed to `cpu`.
fn drain(cpu: usize) {
    let handed = core::mem::take(&mut *INBOX[cpu].lock());
    for (addr, size, stamp) in handed {
        check_and_free(addr, size, stamp);
        CROSS_FREES.fetch_add(1, Ordering::Relaxed);
    }
}

/// One CPU's share of the stress.
fn stress(cpu: usize) {
    let next = (cpu + 1) % 4;
    let mut own = Vec::with_capacity(32);
    for round in 0..NR_ROUNDS {
        P::handle_cross_cpu_calls();
        for i in 0..32 {
            let size = SIZES[(round + i + cpu) % SIZES.len()];
            let stamp = stamp_of(cpu, round, i);
            own.push((alloc_stamped(size, stamp), size, stamp));
        }
        // A quarter to the next CPU, the rest freed here.
        let handed: Vec<_> = own.drain(..8).collect();
        INBOX[next].lock().extend(handed);
        for (addr, size, stamp) in own.drain(..) {
            check_and_free(addr, size, stamp);
        }
        drain(cpu);
        if cpu == 0 && round % REAP_EVERY == REAP_EVERY - 1 {
            HEAP.reap_all();
        }
    }
    FINISHED.fetch_add(1, Ordering::AcqRel);
    // Serve cross-CPU calls and take the last hand-overs until every CPU
    // is done sending.
    while FINISHED.load(Ordering::Acquire) < 4 {
        P::handle_cross_cpu_calls();
        drain(cpu);
        core::hint::spin_loop();
    }
    drain(cpu);
}

#[test_case]
fn four_cpus_share_the_shipped_platform() {
    assert_eq!(
        smp::nr_online(),
        FourCpus::MAX_CPUS,
        "this test boots with 4 CPUs"
    );
    // Where the CPU has rdtscp: the platform's own register read too.
    let rdtscp = core::arch::x86_64::__cpuid(0x8000_0001).edx & (1 << 27) != 0;
    if rdtscp {
        smp::run_on_all(&|cpu| {
            // SAFETY: IA32_TSC_AUX (0xc000_0103) holds the CPU index from now on.
            unsafe { x86_64::registers::model_specific::Msr::new(0xc000_0103).write(cpu as u64) };
            assert_eq!(magpie_slab::glue::arch::X86::cpu_register(), cpu);
        });
        println!("rdtscp: IA32_TSC_AUX read back on every CPU");
    } else {
        println!("no rdtscp on this CPU: the kernel's index only (Kernel::cpu_id)");
    }
    // Every CPU online for the platform's cross-CPU calls.
    smp::run_on_all(&|_| P::cpu_online());
    let region = alloc::vec![0_u8; REGION_BYTES].leak();
    HEAP.init_static(region).expect("the heap's region");
    let before = HEAP.source().stats().alloc_bytes;

    smp::run_on_all(&stress);

    HEAP.reap_all();
    let summary = HEAP.debug().verify();
    HEAP.debug().check_invariants().expect("invariants");
    assert_eq!(summary.nr_problems, 0, "verify: {summary:?}");
    let cross = CROSS_FREES.load(Ordering::Relaxed);
    assert_eq!(cross, 4 * NR_ROUNDS * 8, "every handed object freed");
    println!(
        "4 CPUs: {} objects, {cross} freed on another CPU, {} reaps; pages in use {} -> {}",
        4 * NR_ROUNDS * 32,
        NR_ROUNDS / REAP_EVERY,
        before / 4096,
        HEAP.source().stats().alloc_bytes / 4096
    );
}
