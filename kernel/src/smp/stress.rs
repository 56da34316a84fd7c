//! The SMP stress engine behind the shell's `stress` command and the
//! `smp_stress` test, and the `cpus` command.
//!
//! Every chosen CPU runs the same loop at once ([`smp::run_on_cpus`]): a
//! random mix (xorshift64*, seeded per CPU from `--seed`) of
//!
//! * allocations: `SLAB.kmalloc` of a size in `--sizes A-B`, or (one in
//!   [`CTOR_SHARE`]) an object of the constructor-bearing `stress-ctor`
//!   cache, checked to be in its constructed state;
//! * frees of a random live object after checking its pattern;
//! * hand-offs: a live object goes into another CPU's inbox (a locked
//!   queue); that CPU checks and frees it, so a share of frees cross CPUs
//!   (objects go back into the freeing CPU's magazines).
//!
//! Each object is filled with a pattern derived from a stamp unique to the
//! allocation (CPU, serial number), so two live objects that overlap, an
//! object handed out twice, or a stray write all show up as a mismatch
//! when the object is checked before its free. At the end every CPU frees
//! what it holds and drains its inbox: the run leaves nothing allocated.
//!
//! `ns/op` is the time of the random-mix phase (TSC cycles over the rate
//! calibrated at boot) divided by its operations, per CPU (under QEMU TCG,
//! host time of an emulated CPU: compare runs as ratios, not as absolute
//! costs).
//!
//! # Figures
//!
//! `stress --cpus all --ops 200000` (sizes 8–512, seed 1), debug build,
//! QEMU 7.2 TCG on a 2-core host (so `-smp 4` time-shares two host cores),
//! time per op per CPU as a ratio to the `-smp 1` figure (≈1,550 TSC
//! cycles/op when measured; the column has since become `ns/op`):
//!
//! | QEMU      | CPU 0 | other CPUs  | note                               |
//! |-----------|-------|-------------|------------------------------------|
//! | `-smp 1`  | 1.0   | —           | no cross-CPU frees                 |
//! | `-smp 2`  | 0.7   | 1.2–1.3     | 25% of frees cross CPUs            |
//! | `-smp 4`  | 1.6–2.2 | 2.6–3.1   | 4 vCPUs on 2 host cores            |
//!
//! `-smp 4 --cpus 1` gives 1.0 again: the extra CPUs cost nothing while
//! idle (they sleep in `hlt`). Under TCG every atomic and lock is emulated
//! and vCPUs share host cores, so these ratios say little about real
//! hardware; they are a regression baseline.

use alloc::collections::{TryReserveError, VecDeque};
use alloc::vec::Vec;
use core::fmt::Write;
use core::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use magpie_slab::CacheArgs;

use magpie_slab::{Constructed, InitBox, KmemCache, ObjectInit, ObjectRef, WordMismatch};
use spin::{Mutex, Once};

use crate::arch::{self, IrqGuard};
use crate::kmem::{KernelPlatform, SLAB};
use crate::smp::{self, SmpError};

/// One allocation in [`CTOR_SHARE`] comes from the `stress-ctor` cache.
pub const CTOR_SHARE: u64 = 8;
/// Object size of the `stress-ctor` cache (not a power of two on purpose).
pub const CTOR_OBJ_SIZE: usize = 200;
/// Name of the constructor-bearing cache.
pub const CTOR_CACHE_NAME: &str = "stress-ctor";
/// Largest `--sizes` bound accepted.
pub const MAX_STRESS_SIZE: usize = 64 * 1024;
/// Most `--ops` accepted.
pub const MAX_STRESS_OPS: u64 = 100_000_000;

/// Operations between two looks for Ctrl-C (a console read: about a
/// microsecond under QEMU, so well under 1 % of the run).
const INTERRUPT_CHECK_OPS: u64 = 4096;

const CTOR_WORD: u64 = 0xc0c0_c0c0_5eed_0000;

/// What one stress run does.
#[derive(Debug, Clone)]
pub struct StressConfig {
    /// CPUs taking part (each at most once).
    pub cpus: Vec<usize>,
    /// Random-mix operations per CPU (allocs, frees and hand-offs).
    pub nr_ops: u64,
    /// Smallest kmalloc size.
    pub min_size: usize,
    /// Largest kmalloc size.
    pub max_size: usize,
    /// Seed of the per-CPU random generators.
    pub seed: u64,
    /// Percent of frees handed to another CPU (when more than one takes part).
    pub cross_free_percent: u64,
    /// Most objects one CPU holds at once.
    pub max_live: usize,
}

impl StressConfig {
    /// `nr_ops` per CPU on `cpus`, kmalloc sizes 8–512, seed 1, 25% of
    /// frees crossing CPUs.
    pub fn new(cpus: Vec<usize>, nr_ops: u64) -> Self {
        Self {
            cpus,
            nr_ops,
            min_size: 8,
            max_size: 512,
            seed: 1,
            cross_free_percent: 25,
            max_live: 512,
        }
    }
}

/// What one CPU did in a stress run.
#[derive(Debug, Clone, Copy, Default)]
pub struct CpuReport {
    /// The CPU.
    pub cpu: usize,
    /// Random-mix operations run.
    pub nr_ops: u64,
    /// Successful allocations (random mix and none else).
    pub nr_allocs: u64,
    /// Frees, of this CPU's objects and of objects from other CPUs.
    pub nr_frees: u64,
    /// Frees of objects another CPU allocated.
    pub nr_cross_frees: u64,
    /// Objects handed to another CPU to free.
    pub nr_handoffs: u64,
    /// Allocations that failed (out of memory, inbox growth too) and frees refused.
    pub nr_failures: u64,
    /// Pattern mismatches (overlap, double hand-out, stray write).
    pub nr_corruptions: u64,
    /// The first mismatch: object address, byte offset, expected, found.
    pub first_corruption: Option<(usize, usize, u64, u64)>,
    /// TSC cycles of the random-mix phase.
    pub cycles: u64,
}

impl CpuReport {
    /// Nanoseconds per random-mix operation (TSC cycles over the rate
    /// calibrated at boot).
    pub fn ns_per_op(&self) -> u64 {
        crate::arch::tsc::cycles_to_ns(self.cycles) / self.nr_ops.max(1)
    }
}

/// Per-CPU results of a run, in the order of [`StressConfig::cpus`].
#[derive(Debug, Clone)]
pub struct StressReport {
    /// One report per CPU.
    pub per_cpu: Vec<CpuReport>,
    /// Objects the `stress-ctor` destructor found not in constructed state.
    pub nr_dtor_mismatches: u64,
    /// Ctrl-C stopped the run early (each CPU's `nr_ops` says how far it got).
    pub interrupted: bool,
}

impl StressReport {
    /// Sum of a field over CPUs.
    pub fn total(&self, field: impl Fn(&CpuReport) -> u64) -> u64 {
        self.per_cpu.iter().map(field).sum()
    }
}

// ---------------------------------------------------------------------------
// The constructor-bearing cache

static CTOR_CACHE: Once<&'static KmemCache<KernelPlatform>> = Once::new();
static NR_DTOR_MISMATCHES: AtomicU64 = AtomicU64::new(0);
static NR_CTOR_RUNS: AtomicU64 = AtomicU64::new(0);

fn ctor_word(index: usize) -> u64 {
    CTOR_WORD ^ index as u64
}

fn ctor(obj: ObjectInit<'_>) -> Result<Constructed<'_>, ()> {
    NR_CTOR_RUNS.fetch_add(1, Ordering::Relaxed);
    Ok(obj.write_words(ctor_word))
}

fn dtor(obj: ObjectRef<'_>) {
    // Objects go back to the cache constructed: readable, and in the
    // constructor's state.
    if obj.check_words(ctor_word) != Some(Ok(())) {
        NR_DTOR_MISMATCHES.fetch_add(1, Ordering::Relaxed);
    }
}

/// The `stress-ctor` cache (created on first use; it stays).
///
/// # Errors
///
/// The allocator's error if the cache cannot be created (out of memory);
/// a later call tries again.
pub fn ctor_cache() -> Result<&'static KmemCache<KernelPlatform>, magpie_slab::AllocError> {
    CTOR_CACHE
        .try_call_once(|| {
            crate::try_alloc!(SLAB.cache_create(
                CTOR_CACHE_NAME,
                CTOR_OBJ_SIZE,
                &CacheArgs {
                    align: 8,
                    ctor: Some(ctor),
                    dtor: Some(dtor),
                    ..CacheArgs::DEFAULT
                }
            ))
        })
        .copied()
}

/// Times the `stress-ctor` constructor has run.
pub fn nr_ctor_runs() -> u64 {
    NR_CTOR_RUNS.load(Ordering::Relaxed)
}

// ---------------------------------------------------------------------------
// Patterns (written and checked by `SlabBox::write_words` and
// `InitBox::check_words`: whole words, then the low bytes of the next word
// for the tail; volatile)

fn pattern(stamp: u64, index: usize) -> u64 {
    stamp.wrapping_mul(0x9e37_79b9_7f4a_7c15)
        ^ (index as u64 + 1).wrapping_mul(0xd1b5_4a32_d192_ed03)
}

/// xorshift64* (Vigna): small, fast, good enough for an operation mix.
struct Rng(u64);

impl Rng {
    fn new(seed: u64, cpu: usize) -> Self {
        let state = seed ^ (cpu as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        Self(if state == 0 {
            0x2545_f491_4f6c_dd1d
        } else {
            state
        })
    }

    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform-ish in `0..bound` (bound > 0).
    fn below(&mut self, bound: u64) -> u64 {
        ((u128::from(self.next() >> 32) * u128::from(bound)) >> 32) as u64
    }
}

// ---------------------------------------------------------------------------
// The engine

/// A live object: the object (written with its stamp's pattern), the
/// stamp, where it came from. Handing it to another CPU hands over the
/// object.
struct Obj {
    obj: InitBox<KernelPlatform>,
    stamp: u64,
    from_ctor_cache: bool,
}

/// A CPU's inbox of objects other CPUs handed it to free.
struct Inbox {
    objs: Mutex<VecDeque<Obj>>,
    len: AtomicUsize,
}

struct Run<'a> {
    config: &'a StressConfig,
    ctor_cache: &'static KmemCache<KernelPlatform>,
    inboxes: Vec<Inbox>,
    nr_finished: AtomicUsize,
    reports: Vec<Mutex<CpuReport>>,
    /// Each CPU's list of live objects, at its largest (`max_live`), made
    /// before the run; the CPU's worker takes it.
    lives: Vec<Mutex<Vec<Obj>>>,
}

/// A run's bookkeeping, all or nothing: every CPU's inbox (room for 256
/// objects; it grows fallibly past that), live list and report, and the
/// list the reports are copied into at the end. Out of line, as is
/// [`grow_inbox`]: a kmemtrace record names them as the call sites, apart
/// from the stress objects of `run`'s workers.
#[inline(never)]
fn bookkeeping<'a>(
    config: &'a StressConfig,
    ctor_cache: &'static KmemCache<KernelPlatform>,
) -> Result<(Run<'a>, Vec<CpuReport>), TryReserveError> {
    let n = config.cpus.len();
    let mut inboxes = Vec::new();
    inboxes.try_reserve_exact(n)?;
    let mut reports = Vec::new();
    reports.try_reserve_exact(n)?;
    let mut lives = Vec::new();
    lives.try_reserve_exact(n)?;
    let mut per_cpu = Vec::new();
    per_cpu.try_reserve_exact(n)?;
    for _ in 0..n {
        inboxes.push(Inbox {
            objs: Mutex::new(VecDeque::try_with_capacity(256)?),
            len: AtomicUsize::new(0),
        });
        reports.push(Mutex::new(CpuReport::default()));
        lives.push(Mutex::new(Vec::try_with_capacity(config.max_live)?));
    }
    let run = Run {
        config,
        ctor_cache,
        inboxes,
        nr_finished: AtomicUsize::new(0),
        reports,
        lives,
    };
    Ok((run, per_cpu))
}

/// Runs the stress mix on `config.cpus` at once and returns what each did.
///
/// # Errors
///
/// [`SmpError::Offline`] if a listed CPU is not online;
/// [`SmpError::OutOfMemory`] if the run's bookkeeping cannot be allocated
/// (nothing ran).
///
/// # Panics
///
/// If the `stress-ctor` cache was not created first (the caller's job).
pub fn run(config: &StressConfig) -> Result<StressReport, SmpError> {
    // Callers create the cache first (the shell's `stress` reports when it
    // cannot); once created it stays, so this does not fail here.
    let ctor_cache = ctor_cache().expect("stress-ctor cache created by the caller");
    let nr_dtor_before = NR_DTOR_MISMATCHES.load(Ordering::Relaxed);
    // One allocation scope: every CPU's bookkeeping before any CPU starts.
    let (run, mut per_cpu) = crate::try_alloc!(bookkeeping(config, ctor_cache))
        .map_err(|_| SmpError::OutOfMemory("the stress run's bookkeeping"))?;
    smp::run_on_cpus(&config.cpus, &|cpu| {
        let slot = config
            .cpus
            .iter()
            .position(|&c| c == cpu)
            .expect("cpu in the list");
        let report = worker(&run, slot, cpu);
        let _irq = IrqGuard::new();
        *run.reports[slot].lock() = report;
    })?;
    // Does not grow: `bookkeeping` reserved a report per CPU.
    per_cpu.extend(run.reports.iter().map(|report| *report.lock()));
    Ok(StressReport {
        per_cpu,
        nr_dtor_mismatches: NR_DTOR_MISMATCHES.load(Ordering::Relaxed) - nr_dtor_before,
        interrupted: crate::dev::console::interrupt_requested(),
    })
}

struct Worker<'r, 'a> {
    run: &'r Run<'a>,
    slot: usize,
    cpu: usize,
    rng: Rng,
    serial: u64,
    live: Vec<Obj>,
    report: CpuReport,
}

impl Worker<'_, '_> {
    fn alloc(&mut self) {
        let from_ctor_cache = self.rng.below(CTOR_SHARE) == 0;
        let result = if from_ctor_cache {
            crate::kmem_cache_alloc_box!(self.run.ctor_cache)
        } else {
            let span = (self.run.config.max_size - self.run.config.min_size) as u64 + 1;
            let size = self.run.config.min_size + self.rng.below(span) as usize;
            crate::kmalloc_box!(size, 1)
        };
        let Ok(obj) = result else {
            self.report.nr_failures += 1;
            return;
        };
        self.report.nr_allocs += 1;
        self.serial += 1;
        let stamp = ((self.cpu as u64) << 48) | self.serial;
        let obj = match obj.into_constructed() {
            // A stress-ctor object comes constructed: check that first.
            Ok(mut obj) => {
                if let Err(mismatch) = obj.check_words(ctor_word) {
                    self.corrupt(&obj, mismatch);
                }
                obj.write_words(|index| pattern(stamp, index));
                obj
            }
            Err(obj) => obj.write_words(|index| pattern(stamp, index)),
        };
        self.live.push(Obj {
            obj,
            stamp,
            from_ctor_cache,
        });
    }

    fn corrupt(&mut self, obj: &InitBox<KernelPlatform>, mismatch: WordMismatch) {
        self.report.nr_corruptions += 1;
        if self.report.first_corruption.is_none() {
            self.report.first_corruption = Some((
                obj.as_ptr().as_ptr() as usize,
                mismatch.offset,
                mismatch.expected,
                mismatch.found,
            ));
        }
    }

    /// Checks `obj`'s pattern and frees it.
    fn free(&mut self, mut obj: Obj) {
        if let Err(mismatch) = obj.obj.check_words(|index| pattern(obj.stamp, index)) {
            self.corrupt(&obj.obj, mismatch);
        }
        if obj.from_ctor_cache {
            // Objects go back to a cache constructed (Bonwick): restore it.
            obj.obj.write_words(ctor_word);
        }
        match obj.obj.free() {
            Ok(()) => {
                self.report.nr_frees += 1;
                if (obj.stamp >> 48) as usize != self.cpu {
                    self.report.nr_cross_frees += 1;
                }
            }
            Err(_) => self.report.nr_failures += 1,
        }
    }

    fn hand_off(&mut self, obj: Obj) {
        let n = self.run.inboxes.len() as u64;
        let target = (self.slot as u64 + 1 + self.rng.below(n - 1)) % n;
        let inbox = &self.run.inboxes[target as usize];
        let refused = {
            let _irq = IrqGuard::new();
            let mut objs = inbox.objs.lock();
            // Past its first 256 objects the inbox grows, fallibly.
            match crate::try_alloc!(grow_inbox(&mut objs)) {
                Ok(()) => {
                    objs.push_back(obj);
                    inbox.len.store(objs.len(), Ordering::Release);
                    None
                }
                Err(_) => Some(obj),
            }
        };
        match refused {
            None => self.report.nr_handoffs += 1,
            // No room: counted as a failure, and freed here instead.
            Some(obj) => {
                self.report.nr_failures += 1;
                self.free(obj);
            }
        }
    }

    fn take_inbound(&mut self) -> Option<Obj> {
        let inbox = &self.run.inboxes[self.slot];
        if inbox.len.load(Ordering::Acquire) == 0 {
            return None;
        }
        let _irq = IrqGuard::new();
        let mut objs = inbox.objs.lock();
        let obj = objs.pop_front();
        inbox.len.store(objs.len(), Ordering::Release);
        obj
    }

    fn step(&mut self) {
        let config = self.run.config;
        let choice = self.rng.below(100);
        if let Some(obj) = (choice < 25).then(|| self.take_inbound()).flatten() {
            self.free(obj);
            return;
        }
        let want_alloc =
            self.live.is_empty() || (self.live.len() < config.max_live && choice.is_multiple_of(2));
        if want_alloc {
            self.alloc();
            return;
        }
        let index = self.rng.below(self.live.len() as u64) as usize;
        let obj = self.live.swap_remove(index);
        if self.run.inboxes.len() > 1 && self.rng.below(100) < config.cross_free_percent {
            self.hand_off(obj);
        } else {
            self.free(obj);
        }
    }
}

/// Room for one more object in an inbox (see [`bookkeeping`]).
#[inline(never)]
fn grow_inbox(objs: &mut VecDeque<Obj>) -> Result<(), TryReserveError> {
    objs.try_reserve(1)
}

fn worker(run: &Run<'_>, slot: usize, cpu: usize) -> CpuReport {
    let _scope = crate::alloc_tag_scope!();
    let _context = crate::tracing::context::enter_context("stress");
    let mut worker = Worker {
        run,
        slot,
        cpu,
        rng: Rng::new(run.config.seed, cpu),
        serial: 0,
        live: {
            let _irq = IrqGuard::new();
            core::mem::take(&mut *run.lives[slot].lock())
        },
        report: CpuReport {
            cpu,
            ..CpuReport::default()
        },
    };
    let start = arch::rdtsc();
    let mut nr_done = 0;
    while nr_done < run.config.nr_ops {
        worker.step();
        nr_done += 1;
        // Ctrl-C at the console ends the run early (every CPU sees it).
        if nr_done % INTERRUPT_CHECK_OPS == 0 && crate::dev::console::interrupt_requested() {
            break;
        }
    }
    worker.report.cycles = arch::rdtsc() - start;
    worker.report.nr_ops = nr_done;
    // Wind down: free what this CPU holds, then drain the inbox until every
    // CPU has finished handing objects off.
    while let Some(obj) = worker.live.pop() {
        worker.free(obj);
    }
    {
        // The empty list goes back, to be freed where it was allocated (a
        // free on another CPU would count as the run's own ping-pong).
        let _irq = IrqGuard::new();
        *run.lives[slot].lock() = core::mem::take(&mut worker.live);
    }
    run.nr_finished.fetch_add(1, Ordering::AcqRel);
    loop {
        let all_finished = run.nr_finished.load(Ordering::Acquire) == run.inboxes.len();
        while let Some(obj) = worker.take_inbound() {
            worker.free(obj);
        }
        if all_finished {
            break;
        }
        core::hint::spin_loop();
    }
    worker.report
}

// ---------------------------------------------------------------------------
// The report

/// Prints a [`StressReport`] as the `stress` command does.
pub fn print_report(report: &StressReport, out: &mut dyn Write) {
    let _ = writeln!(
        out,
        "{:>4} {:>10} {:>10} {:>10} {:>11} {:>9} {:>8} {:>10}",
        "cpu", "ops", "allocs", "frees", "cross-frees", "failures", "corrupt", "ns/op"
    );
    for cpu in &report.per_cpu {
        let _ = writeln!(
            out,
            "{:>4} {:>10} {:>10} {:>10} {:>11} {:>9} {:>8} {:>10}",
            cpu.cpu,
            cpu.nr_ops,
            cpu.nr_allocs,
            cpu.nr_frees,
            cpu.nr_cross_frees,
            cpu.nr_failures,
            cpu.nr_corruptions,
            cpu.ns_per_op()
        );
        if let Some((addr, offset, expected, found)) = cpu.first_corruption {
            let _ = writeln!(
                out,
                "     corruption: object {addr:#x} offset {offset}: expected {expected:#x}, found {found:#x}"
            );
        }
    }
    let _ = writeln!(
        out,
        "total {:>9} {:>10} {:>10} {:>11} {:>9} {:>8}",
        report.total(|cpu| cpu.nr_ops),
        report.total(|cpu| cpu.nr_allocs),
        report.total(|cpu| cpu.nr_frees),
        report.total(|cpu| cpu.nr_cross_frees),
        report.total(|cpu| cpu.nr_failures),
        report.total(|cpu| cpu.nr_corruptions),
    );
    if report.interrupted {
        let _ = writeln!(
            out,
            "stress: interrupted (Ctrl-C): the ops column says how far each CPU got"
        );
    }
    if report.nr_dtor_mismatches > 0 {
        let _ = writeln!(
            out,
            "error: {} {CTOR_CACHE_NAME} objects were not in constructed state at destruction",
            report.nr_dtor_mismatches
        );
    }
}
