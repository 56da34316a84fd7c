//! Issue 29: allocation from interrupt handlers on every CPU, with every
//! feature on, while the shell's heaviest commands run. Boots with 4 CPUs
//! (the runner's default for `smp_*` test kernels).
//!
//! Every CPU's LAPIC timer (every [`PERIOD_US`]) allocates and frees in
//! its handler: a 64-byte cache, a bufctl cache (1500 bytes), `kmalloc!`
//! (a code-tagged site whose context is captured) and `Box` (the
//! `GlobalAlloc` shim), a batch of each per tick, holding up to
//! [`IRQ_HELD`] of each and giving them back in runs. Meanwhile the boot
//! CPU, interrupts on, runs with every feature on: the trace table on
//! every cache (`kmemtrace start all`), kmemtrace recording with stacks
//! (`kmemtrace record start --stacks 8 all`), allocation profiling with
//! context capture of the handler's `kmalloc!` site, KFENCE sampling
//! every 1 ms; and runs `stress --cpus all` (three rounds), `reap all`,
//! `kmem kfence`, `kmem verify all`, `kmem findleaks`, `kmemtrace record
//! status`. KFENCE samples no traced or recorded cache, so the last round
//! leaves the 64-byte cache to it (untraced, recording on the bufctl
//! cache only): the handlers' allocations are sampled there.
//!
//! Every object is stamped when allocated (every word of it) and checked
//! word by word before its free: an object handed out twice, or written
//! by the allocator while held, fails the check. A lock an interrupt
//! handler spins on while the code it interrupted holds it hangs the
//! kernel, and the runner's timeout fails the test (the deadlock issue 29
//! found: the kernel's context-string lock). The handlers also check that
//! interrupts stay off in them across every allocation and free. At the
//! end: every object is back, every CPU's handler ran, every feature did
//! its work (events, captured contexts, KFENCE samples, which a sample
//! armed while every cache was traced used to stop for good), `verify`
//! finds nothing, no error was reported, and (debug builds) the lock
//! validator (`magpie_slab::lockdep`) reported nothing.

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

use alloc::boxed::Box;
use alloc::format;
use alloc::string::String;
use core::ptr::NonNull;
use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};
use magpie_slab::CacheArgs;

use magpie::arch::{self, MAX_CPUS, lapic};
use magpie::kmem::{KernelPlatform, SLAB};
use magpie::shell::Shell;
use magpie::{println, profiling, smp};
use magpie_slab::KmemCache;

type Cache = KmemCache<KernelPlatform>;

magpie::test_kernel!();

/// Timer period on every CPU (µs).
const PERIOD_US: u64 = 1000;
/// Objects of each kind a CPU's handler holds at most.
const IRQ_HELD: usize = 48;
/// Objects of each kind a handler allocates (and frees) per tick.
const IRQ_BATCH: usize = 3;
/// Kinds of object the handlers allocate: the 64-byte cache, the bufctl
/// cache, `kmalloc!`, `Box`.
const NR_KINDS: usize = 4;
const KIND_SMALL: usize = 0;
const KIND_BUFCTL: usize = 1;
const KIND_KMALLOC: usize = 2;
const KIND_BOX: usize = 3;
/// Bytes of each kind (the `Box` is a `[u64; 12]`).
const SIZES: [usize; NR_KINDS] = [64, 1500, 100, 96];
/// `stress --cpus all --ops N` rounds, and N.
const STRESS_ROUNDS: usize = 3;
const STRESS_OPS: u64 = 10_000;

static CACHES: [AtomicPtr<Cache>; 2] = [const { AtomicPtr::new(core::ptr::null_mut()) }; 2];

/// One CPU's handler's objects: per kind, the addresses and stamps,
/// oldest first.
struct Held {
    objs: [[usize; IRQ_HELD]; NR_KINDS],
    stamps: [[u64; IRQ_HELD]; NR_KINDS],
    lens: [usize; NR_KINDS],
}

/// Each CPU's handler's objects: taken (tried) only by that CPU's handler
/// until every timer has stopped.
static HELD: [spin::Mutex<Held>; MAX_CPUS] = [const {
    spin::Mutex::new(Held {
        objs: [[0; IRQ_HELD]; NR_KINDS],
        stamps: [[0; IRQ_HELD]; NR_KINDS],
        lens: [0; NR_KINDS],
    })
}; MAX_CPUS];

/// Objects each CPU's handler holds (all kinds), for the wind-down.
static NR_HELD: [AtomicU64; MAX_CPUS] = [const { AtomicU64::new(0) }; MAX_CPUS];
/// Timer ticks each CPU's handler ran.
static TICKS: [AtomicU64; MAX_CPUS] = [const { AtomicU64::new(0) }; MAX_CPUS];
static IRQ_ALLOCS: AtomicU64 = AtomicU64::new(0);
static IRQ_FREES: AtomicU64 = AtomicU64::new(0);
/// Set once the handlers are to allocate no more (they still free).
static WINDING_DOWN: AtomicBool = AtomicBool::new(false);
/// Stamps: unique per object, with the CPU in bits 56..
static NEXT_STAMP: AtomicU64 = AtomicU64::new(1);

fn cache(index: usize) -> &'static Cache {
    let cache = CACHES[index].load(Ordering::Acquire);
    assert!(!cache.is_null(), "cache {index} not created");
    // SAFETY: set from a `&'static Cache` before the timers start, never
    // destroyed while they run.
    unsafe { &*cache }
}

/// Write `stamp` into every word of the object (`SIZES[kind]` bytes).
#[expect(
    clippy::cast_ptr_alignment,
    reason = "every object here is 8-aligned (align 8 caches, kmalloc, a [u64; 12])"
)]
fn stamp(kind: usize, obj: NonNull<u8>, stamp: u64) {
    let words = obj.as_ptr().cast::<u64>();
    for index in 0..SIZES[kind] / 8 {
        // SAFETY: the object is ours, `SIZES[kind]` bytes, 8-aligned.
        unsafe { words.add(index).write_volatile(stamp) };
    }
}

/// Check every word of the object holds `stamp`.
#[expect(clippy::cast_ptr_alignment, reason = "as in `stamp`")]
fn check(kind: usize, obj: NonNull<u8>, stamp: u64) {
    let words = obj.as_ptr().cast::<u64>();
    for index in 0..SIZES[kind] / 8 {
        // SAFETY: as in `stamp`.
        let word = unsafe { words.add(index).read_volatile() };
        assert_eq!(
            word, stamp,
            "kind {kind} object {obj:p} word {index} changed while held (handed out twice?)"
        );
    }
}

/// The handler's `kmalloc!` site: its context is captured.
#[inline(never)]
fn irq_kmalloc() -> NonNull<u8> {
    magpie::kmalloc!(SIZES[KIND_KMALLOC]).expect("kmalloc! from the timer handler")
}

fn alloc_kind(kind: usize) -> NonNull<u8> {
    match kind {
        KIND_SMALL | KIND_BUFCTL => cache(kind).alloc().expect("alloc from the timer handler"),
        KIND_KMALLOC => irq_kmalloc(),
        KIND_BOX => NonNull::from(Box::leak(Box::new([0u64; 12]))).cast(),
        _ => unreachable!("kind {kind}"),
    }
}

/// # Safety
/// `obj` came from `alloc_kind(kind)` and is not used again.
#[expect(
    clippy::cast_ptr_alignment,
    reason = "a KIND_BOX object is a leaked Box<[u64; 12]>"
)]
unsafe fn free_kind(kind: usize, obj: NonNull<u8>) {
    match kind {
        // SAFETY: per our caller.
        KIND_SMALL | KIND_BUFCTL => unsafe { cache(kind).free(obj) }.expect("free"),
        // SAFETY: per our caller.
        KIND_KMALLOC => unsafe { SLAB.kfree(obj) }.expect("kfree"),
        // SAFETY: per our caller: a leaked Box<[u64; 12]>.
        KIND_BOX => drop(unsafe { Box::from_raw(obj.as_ptr().cast::<[u64; 12]>()) }),
        _ => unreachable!("kind {kind}"),
    }
}

/// Free this CPU's oldest `nr` objects of `kind`, each checked first.
fn free_oldest(held: &mut Held, kind: usize, nr: usize) {
    for _ in 0..nr.min(held.lens[kind]) {
        let len = held.lens[kind];
        let obj = NonNull::new(held.objs[kind][0] as *mut u8).unwrap();
        check(kind, obj, held.stamps[kind][0]);
        held.objs[kind].copy_within(1..len, 0);
        held.stamps[kind].copy_within(1..len, 0);
        held.lens[kind] = len - 1;
        NR_HELD[arch::cpu_id()].fetch_sub(1, Ordering::Relaxed);
        // SAFETY: allocated by this CPU's handler, held since.
        unsafe { free_kind(kind, obj) };
        assert!(
            !x86_64::instructions::interrupts::are_enabled(),
            "interrupts on in the handler after a free of kind {kind}"
        );
        IRQ_FREES.fetch_add(1, Ordering::Relaxed);
    }
}

/// Every CPU's timer: per kind, free a batch of the oldest while over a
/// target that swings between `IRQ_HELD` and 0 every 32 ticks (runs of
/// misses and slab growth, then of frees), then allocate a batch.
fn on_tick() {
    let cpu = arch::cpu_id();
    let tick = TICKS[cpu].fetch_add(1, Ordering::Relaxed);
    let mut held = HELD[cpu]
        .try_lock()
        .expect("a CPU's held objects are its handler's alone");
    let winding_down = WINDING_DOWN.load(Ordering::Acquire);
    let target = if winding_down || (tick / 32) % 2 == 1 {
        0
    } else {
        IRQ_HELD
    };
    for kind in 0..NR_KINDS {
        if held.lens[kind] > target || held.lens[kind] == IRQ_HELD {
            free_oldest(&mut held, kind, IRQ_BATCH);
        }
        if winding_down {
            continue;
        }
        for _ in 0..IRQ_BATCH.min(IRQ_HELD - held.lens[kind]) {
            let obj = alloc_kind(kind);
            assert!(
                !x86_64::instructions::interrupts::are_enabled(),
                "interrupts on in the handler after an alloc of kind {kind}"
            );
            let value = NEXT_STAMP.fetch_add(1, Ordering::Relaxed) | (cpu as u64) << 56;
            stamp(kind, obj, value);
            let len = held.lens[kind];
            held.objs[kind][len] = obj.as_ptr() as usize;
            held.stamps[kind][len] = value;
            held.lens[kind] = len + 1;
            NR_HELD[cpu].fetch_add(1, Ordering::Relaxed);
            IRQ_ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Run `line` in the shell; its output (printed, and checked for errors).
fn run(shell: &mut Shell, line: &str) -> String {
    let mut out = String::new();
    shell.execute(line, &mut out);
    let last = out.lines().last().unwrap_or("");
    println!("> {line}: {last}");
    assert!(
        !out.starts_with("error") && !out.contains("\nerror"),
        "{line}:\n{out}"
    );
    out
}

fn start_timers() {
    arch::idt::set_timer_handler(on_tick);
    for cpu in smp::online_cpus().filter(|&cpu| cpu != arch::cpu_id()) {
        smp::run_on(cpu, || lapic::timer_start(PERIOD_US))
            .expect("online")
            .wait();
    }
    lapic::timer_start(PERIOD_US);
    x86_64::instructions::interrupts::enable();
}

fn stop_timers() {
    // Let the handlers give everything back first (they still free).
    WINDING_DOWN.store(true, Ordering::Release);
    let start = arch::rdtsc();
    let limit = arch::tsc::khz() * 10_000;
    while NR_HELD.iter().any(|nr| nr.load(Ordering::Relaxed) != 0) {
        assert!(
            arch::rdtsc() - start < limit,
            "the handlers did not wind down in 10 s"
        );
        core::hint::spin_loop();
    }
    for cpu in smp::online_cpus().filter(|&cpu| cpu != arch::cpu_id()) {
        smp::run_on(cpu, lapic::timer_stop).expect("online").wait();
    }
    x86_64::instructions::interrupts::disable();
    lapic::timer_stop();
    x86_64::instructions::interrupts::enable();
    // A tick pending when a timer stopped has run by now.
    arch::tsc::delay_us(2 * PERIOD_US);
}

/// The allocation tag of the handler's `kmalloc!` site.
fn irq_kmalloc_tag() -> &'static magpie_codetag::alloc_tag::AllocTag {
    magpie_codetag::alloc_tag::AllocTag::all()
        .iter()
        .find(|tag| tag.tag.function().ends_with("irq_kmalloc"))
        .expect("the kmalloc! site in irq_kmalloc has a tag")
}

#[test_case]
fn every_cpu_allocates_in_its_timer_while_the_heaviest_commands_run_with_every_feature_on() {
    assert_eq!(smp::nr_online(), 4, "the test boots 4 CPUs");
    for (index, (name, size)) in [("irqf-64", 64), ("irqf-bufctl", 1500)]
        .into_iter()
        .enumerate()
    {
        let cache = SLAB
            .cache_create(
                name,
                size,
                &CacheArgs {
                    align: 8,
                    ..CacheArgs::DEFAULT
                },
            )
            .expect("cache_create");
        CACHES[index].store(core::ptr::from_ref(cache).cast_mut(), Ordering::Release);
    }
    let errors_before = SLAB.debug().nr_errors();
    let mut shell = Shell::new();

    // Every feature on.
    assert!(run(&mut shell, "kmemtrace start all").starts_with("tracing "));
    run(&mut shell, "kmemtrace record start --force --stacks 8 all");
    // Profiling with context capture of the handler's kmalloc! site
    // (a build without `alloc-profiling` has neither: `cargo test
    // --no-default-features`).
    let site = profiling::COMPILED_IN.then(|| {
        assert!(
            SLAB.profiling().enabled(),
            "profiling on (mem_profiling=1, the default)"
        );
        let tag = irq_kmalloc_tag();
        let site = format!("{}:{}", tag.tag.file, tag.tag.line);
        let enabled = run(&mut shell, &format!("allocinfo ctx {site} enable"));
        assert!(enabled.starts_with("capturing context of "), "{enabled}");
        site
    });
    SLAB.kfence().set_interval(1);
    let kfence_before = SLAB.kfence().stats();
    assert!(kfence_before.enabled, "the KFENCE pool exists");

    start_timers();
    for round in 0..STRESS_ROUNDS {
        if round == STRESS_ROUNDS - 1 {
            // KFENCE samples no traced or recorded cache: the last round
            // leaves the 64-byte cache to it (the handlers' samples),
            // everything else traced, recording on the bufctl cache.
            run(&mut shell, "kmemtrace stop irqf-64");
            run(&mut shell, "kmemtrace record stop");
            run(
                &mut shell,
                "kmemtrace record start --force --stacks 8 irqf-bufctl",
            );
        }
        let report = run(&mut shell, &format!("stress --cpus all --ops {STRESS_OPS}"));
        assert!(report.contains("total"), "{report}");
        run(&mut shell, "reap all");
    }
    run(&mut shell, "kmem kfence");
    let verify = run(&mut shell, "kmem verify all");
    assert!(verify.contains(": 0 problem(s)"), "{verify}");
    let leaks = run(&mut shell, "kmem findleaks");
    assert!(
        leaks.contains("Total") || leaks.contains("no memory leaks detected"),
        "{leaks}"
    );
    let status = run(&mut shell, "kmemtrace record status");
    let captured = profiling::ctx_records().len();
    let ticks_running: [u64; MAX_CPUS] =
        core::array::from_fn(|cpu| TICKS[cpu].load(Ordering::Relaxed));
    stop_timers();

    // The features did their work while the handlers ran.
    let kmemtrace = SLAB.kmemtrace().status();
    let kfence = SLAB.kfence().stats();
    let traced = cache(KIND_SMALL).trace_table().stats();
    run(&mut shell, "kmemtrace record stop");
    if let Some(site) = &site {
        run(&mut shell, &format!("allocinfo ctx {site} disable"));
    }
    run(&mut shell, "kmemtrace stop all");
    run(&mut shell, "kmemtrace reset all");
    SLAB.kfence().set_interval(0);
    let lockdep = magpie_slab::lockdep::stats();
    println!(
        "IRQ_SMP_FEATURES ticks={:?} irq_allocs={} irq_frees={} events={} overruns={} \
         captured={captured} kfence_allocs={} trace_dropped={} lockdep={lockdep:?}",
        &ticks_running[..smp::nr_online()],
        IRQ_ALLOCS.load(Ordering::Relaxed),
        IRQ_FREES.load(Ordering::Relaxed),
        kmemtrace.nr_events,
        kmemtrace.nr_overruns,
        kfence.nr_allocs - kfence_before.nr_allocs,
        traced.nr_dropped,
    );
    println!("{status}");

    for cpu in smp::online_cpus() {
        assert!(
            ticks_running[cpu] >= 50,
            "cpu {cpu}'s timer allocated in only {} ticks",
            ticks_running[cpu]
        );
    }
    assert_eq!(
        IRQ_ALLOCS.load(Ordering::Relaxed),
        IRQ_FREES.load(Ordering::Relaxed),
        "every handler object back"
    );
    assert!(kmemtrace.nr_events > 0, "kmemtrace recorded");
    assert!(
        captured > 0 || site.is_none(),
        "the handler's kmalloc! site had its context captured"
    );
    assert!(kfence.nr_allocs > kfence_before.nr_allocs, "KFENCE sampled");
    assert_eq!(
        kfence.nr_bugs, kfence_before.nr_bugs,
        "KFENCE found nothing"
    );
    assert_eq!(SLAB.debug().nr_errors(), errors_before, "no error reported");
    for index in 0..CACHES.len() {
        let stats = cache(index).stats();
        assert_eq!(
            stats.nr_allocated,
            0,
            "{}: every object back",
            cache(index).name()
        );
        assert_eq!(cache(index).verify().nr_problems, 0);
    }
    if lockdep.enabled {
        assert_eq!(lockdep.nr_reports, 0, "lockdep: {lockdep:?}");
        assert!(
            lockdep.nr_used_in_irq >= 3,
            "the handlers took the allocator's locks: {lockdep:?}"
        );
    }
    for slot in &CACHES {
        let cache = slot.swap(core::ptr::null_mut(), Ordering::AcqRel);
        // SAFETY: created above; the timers have stopped and nothing holds
        // an object.
        let report = unsafe { magpie::kmem::cache_destroy(&*cache) }.expect("destroy");
        let _ = report;
    }
}
