//! Loom model tests of the magazine layer's protocol: per-CPU caches
//! owned by their CPU through its in-use flag (interrupts possibly on:
//! an interrupt handler that allocates may land at any point of a hit),
//! the depot exchange
//! (full and empty magazines traded by several CPUs at once), and the
//! drain (`reap` taking each CPU's magazines through a cross-CPU call
//! while CPUs allocate and free).
//!
//! Built only with `RUSTFLAGS="--cfg loom"`, which turns the depot,
//! slab-layer and trace locks into `loom::sync::Mutex` ([`crate::sync`]).
//! The model platform ([`LoomPlatform`]) acts out the hardware: each
//! thread acts as one CPU (a loom thread-local id); "interrupts off on CPU
//! n" is a loom mutex per CPU, taken by that CPU's `irq_save` (outermost)
//! and by a cross-CPU call to it, exactly the exclusion a kernel gets from
//! `cli` and an IPI handler. Loom then runs every interleaving of those
//! operations (up to a preemption bound).
//!
//! The model platform sets [`Platform::LOCAL_TRYLOCK`]: the hits take no
//! interrupts-off section, only the per-CPU in-use flag. An interrupt is a
//! loom thread acting as the same CPU: "CPU n executes" is a second loom
//! mutex per CPU ([`EXEC_LOCKS`]), which a CPU's task thread holds
//! throughout except at the hit's interrupt windows (before and after
//! each step of taking and giving back the flag: the
//! [`interrupt_window`] hook), and which the interrupt thread takes for
//! its whole handler, run with interrupts off. Loom thus runs the handler
//! at every point of the hit, and only there: as a CPU runs an interrupt
//! handler to completion before the code it interrupted resumes. The
//! per-CPU caches themselves
//! are plain memory reached through an `UnsafeCell`: a hit that ran
//! outside its CPU's exclusion would be a data race loom's cell tracking
//! does not see, but the checks below (no object handed out twice, no
//! round lost or duplicated) catch its effects. Everything else (the page
//! map's atomics, the fake page source) runs unmodelled: between two loom
//! operations a thread runs alone.
//!
//! Every model uses magazines of one round (the `kmem_magazine_1`
//! type, set as the depot's before any magazine exists), so that a handful of
//! operations already goes through every branch of the exchange (loaded
//! and prev swapped, a full magazine from the depot, an empty one to it, a
//! new magazine when the depot has none) and checks:
//!
//! - no object is handed to two callers at once (a set of live objects,
//!   and a per-allocation stamp written into the object and checked before
//!   its free);
//! - no round is lost or duplicated: after the threads join, every round
//!   in a magazine is distinct, and the slab layer's busy objects are
//!   exactly the rounds plus the objects callers hold;
//! - the per-CPU statistics derived at exchanges (allocs counted, frees
//!   derived) add up: allocations minus frees is what callers hold;
//! - after everything is freed and reaped, every page is back with the
//!   page source.
//!
//! ```text
//! make test-loom
//! # = RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom \
//! #   cargo test -p magpie-slab --target x86_64-unknown-linux-gnu --release loom
//! ```
//!
//! `LOOM_MAX_PREEMPTIONS` overrides the preemption bound of
//! [`PREEMPTION_BOUND`] (higher explores more and takes much longer).

use crate::CacheArgs;
use std::boxed::Box;
use std::cell::{Cell, RefCell};
use std::collections::HashSet;
use std::sync::Arc;
use std::sync::Mutex as StdMutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::vec::Vec;

use loom::thread;

use super::support::FakeSource;
use crate::{AllocTagHooks, CacheFlags, InitBox, Kmem, KmemCache, Platform, PlatformHooks};

/// Preemptions per execution that loom explores unless
/// `LOOM_MAX_PREEMPTIONS` says otherwise.
const PREEMPTION_BOUND: usize = 3;
/// CPUs of the model platform: up to three worker threads and the main
/// thread.
const NR_CPUS: usize = 4;
/// The CPU the main thread acts as.
const MAIN_CPU: usize = 3;
/// Pages of each execution's page source.
const NR_PAGES: usize = 96;

loom::thread_local! {
    static CPU: Cell<usize> = Cell::new(0);
    /// This thread's emulated interrupts-off section: the CPU's lock
    /// guard and the nesting depth.
    static IRQ: RefCell<(Option<loom::sync::MutexGuard<'static, ()>>, usize)> =
        RefCell::new((None, 0));
    /// A task thread's hold on its CPU ([`EXEC_LOCKS`]), given up at the
    /// interrupt windows; `None` for threads that do not model interrupts.
    static EXEC: RefCell<Option<(usize, loom::sync::MutexGuard<'static, ()>)>> =
        RefCell::new(None);
    /// Whether this thread is an interrupt handler (`in_interrupt`).
    static IN_IRQ: Cell<bool> = Cell::new(false);
}

loom::lazy_static! {
    /// "Interrupts off on CPU n" (see the module docs).
    static ref IRQ_LOCKS: Vec<loom::sync::Mutex<()>> =
        (0..NR_CPUS).map(|_| loom::sync::Mutex::new(())).collect();
    /// "CPU n executes this thread" (see the module docs).
    static ref EXEC_LOCKS: Vec<loom::sync::Mutex<()>> =
        (0..NR_CPUS).map(|_| loom::sync::Mutex::new(())).collect();
}

/// The hits' interrupt windows ([`crate::sync::LocalLocked`]): a task
/// thread with interrupts on lets its CPU go and takes it back, so that
/// an interrupt thread of the same CPU may run its handler here.
pub(crate) fn interrupt_window<P: Platform>() {
    if !P::LOCAL_TRYLOCK || IRQ.with(|irq| irq.borrow().1) != 0 {
        return;
    }
    let Some((cpu, guard)) = EXEC.with(|exec| exec.borrow_mut().take()) else {
        return;
    };
    drop(guard);
    let guard = EXEC_LOCKS[cpu].lock().unwrap();
    EXEC.with(|exec| *exec.borrow_mut() = Some((cpu, guard)));
}

/// This thread is CPU `cpu`'s task: it holds the CPU but at the hits'
/// interrupt windows, until [`task_end`].
fn task_start(cpu: usize) {
    set_cpu(cpu);
    let guard = EXEC_LOCKS[cpu].lock().unwrap();
    EXEC.with(|exec| *exec.borrow_mut() = Some((cpu, guard)));
}

/// The task gives its CPU up for good.
fn task_end() {
    let held = EXEC.with(|exec| exec.borrow_mut().take());
    drop(held);
}

/// Run `handler` as an interrupt of CPU `cpu`: once the CPU's task is at
/// an interrupt window (or has not started or has ended), with interrupts
/// off, to completion.
fn interrupt(cpu: usize, handler: impl FnOnce()) {
    set_cpu(cpu);
    let exec = EXEC_LOCKS[cpu].lock().unwrap();
    IN_IRQ.with(|irq| irq.set(true));
    let state = LoomPlatform::irq_save();
    handler();
    LoomPlatform::irq_restore(state);
    IN_IRQ.with(|irq| irq.set(false));
    drop(exec);
}

fn set_cpu(cpu: usize) {
    CPU.with(|c| c.set(cpu));
}

/// The CPU id is a loom thread-local (loom runs its threads on one host
/// thread, so a std thread-local would be shared by all of them).
struct LoomPlatform;

// SAFETY: ids are below NR_CPUS; the per-CPU loom mutexes make a CPU's
// interrupts-off sections and cross-CPU calls to it exclusive.
unsafe impl Platform for LoomPlatform {
    const LOCAL_TRYLOCK: bool = true;
    fn in_interrupt() -> bool {
        IN_IRQ.with(Cell::get)
    }
    fn max_cpus() -> usize {
        NR_CPUS
    }
    fn cpu_id() -> usize {
        CPU.with(|c| c.get())
    }
    fn irq_save() -> usize {
        IRQ.with(|irq| {
            let mut irq = irq.borrow_mut();
            if irq.1 == 0 {
                let cpu = CPU.with(|c| c.get());
                irq.0 = Some(IRQ_LOCKS[cpu].lock().unwrap());
            }
            irq.1 += 1;
        });
        0
    }
    fn irq_restore(_state: usize) {
        let guard = IRQ.with(|irq| {
            let mut irq = irq.borrow_mut();
            irq.1 -= 1;
            if irq.1 == 0 { irq.0.take() } else { None }
        });
        drop(guard);
    }
    fn cross_cpu_call(cpu: usize, work: &(dyn Fn() + Sync)) {
        assert_eq!(
            IRQ.with(|irq| irq.borrow().1),
            0,
            "cross-CPU call with interrupts off"
        );
        let guard = IRQ_LOCKS[cpu].lock().unwrap();
        work();
        drop(guard);
    }
    fn now() -> u64 {
        0
    }
}

// SAFETY: the hooks keep PlatformHooks' contract: the KFENCE pool (if any) is
// mapped and the platform's own, and charge tokens are the ones the token hooks
// return.
unsafe impl PlatformHooks for LoomPlatform {
    fn backtrace(_frames: &mut [usize]) -> usize {
        0
    }
    fn context(_buf: &mut [u8; 32]) -> usize {
        0
    }
}

// SAFETY: the defaults: no tags.
unsafe impl AllocTagHooks for LoomPlatform {}

type Cache = KmemCache<LoomPlatform>;

/// One execution's allocator, page source, cache under test and set of
/// objects callers hold. Leaked for `'static` threads; given back by
/// [`Fixture::release`] at the end of the execution.
struct Fixture {
    alloc: &'static Kmem<LoomPlatform>,
    source: &'static FakeSource,
    cache: &'static Cache,
    live: &'static StdMutex<HashSet<usize>>,
    /// Pages out after setup (page map, bootstrap and kmalloc metadata).
    baseline: usize,
}

impl Fixture {
    /// A fresh allocator and a cache of `size`-byte objects whose
    /// magazines hold one round.
    fn new(size: usize) -> Fixture {
        Self::with_flags(size, CacheFlags::empty())
    }

    /// [`Fixture::new`] with cache flags.
    fn with_flags(size: usize, flags: CacheFlags) -> Fixture {
        set_cpu(MAIN_CPU);
        let source = FakeSource::new(NR_PAGES);
        let alloc: &'static Kmem<LoomPlatform> = Box::leak(Box::new(Kmem::new()));
        alloc.init(source).expect("init");
        let cache = alloc
            .cache_create(
                "loom",
                size,
                &CacheArgs {
                    align: 8,
                    flags,
                    ..CacheArgs::DEFAULT
                },
            )
            .expect("cache");
        // No CPU holds a magazine yet: every magazine will be a
        // `kmem_magazine_1` one.
        cache.depot.set_magtype(0);
        assert_eq!(crate::MAGAZINE_ROUNDS[0], 1);
        alloc.reap_all();
        Fixture {
            alloc,
            source,
            cache,
            live: Box::leak(Box::new(StdMutex::new(HashSet::new()))),
            baseline: source.pages_outstanding(),
        }
    }

    /// Allocate on the running CPU; check nobody else holds the object;
    /// stamp it (every word of it).
    fn alloc(&self, stamp: u64) -> Held {
        let obj = self.cache.alloc_box().expect("alloc");
        let addr = obj.as_ptr().as_ptr() as usize;
        assert!(
            self.live.lock().unwrap().insert(addr),
            "object {addr:#x} handed out twice"
        );
        Held {
            obj: obj.write_words(|_| stamp),
            stamp,
        }
    }

    /// Check the stamp and free on the running CPU.
    fn free(&self, held: Held) {
        let Held { obj, stamp } = held;
        let addr = obj.as_ptr().as_ptr() as usize;
        assert_eq!(
            obj.check_words(|_| stamp),
            Ok(()),
            "object {addr:#x} overwritten"
        );
        // Out of the live set before the free: another thread may get the
        // object back as soon as it is in a magazine.
        assert!(self.live.lock().unwrap().remove(&addr));
        obj.free().expect("free");
    }

    /// After the threads joined: every round distinct, and the slab
    /// layer's busy objects are the rounds plus what callers hold.
    fn check_conserved(&self) {
        let mut rounds = HashSet::new();
        self.cache.for_each_round(|round| {
            assert!(
                rounds.insert(round as usize),
                "round {round:p} in two magazines"
            );
        });
        let nr_held = self.live.lock().unwrap().len();
        for addr in self.live.lock().unwrap().iter() {
            assert!(!rounds.contains(addr), "held object {addr:#x} is a round");
        }
        let stats = self.cache.stats();
        let nr_busy = self.cache.slab.lock().counts().nr_busy_objs;
        assert_eq!(stats.nr_allocated, nr_held, "{stats:?}");
        assert_eq!(
            stats.nr_allocs_ever.wrapping_sub(stats.nr_frees_ever),
            nr_held as u64,
            "{stats:?}"
        );
        assert_eq!(
            stats.nr_cpu_cached_objs + stats.nr_depot_objs,
            rounds.len(),
            "{stats:?}"
        );
        assert_eq!(
            nr_busy,
            rounds.len() + nr_held,
            "rounds lost or duplicated: {stats:?}"
        );
    }

    /// Everything freed: reap, check every page came back, give the
    /// execution's memory back to the host.
    fn finish(self) {
        set_cpu(MAIN_CPU);
        assert!(self.live.lock().unwrap().is_empty());
        self.check_conserved();
        self.alloc.reap_all();
        let stats = self.cache.stats();
        assert_eq!(
            (
                stats.nr_allocated,
                stats.nr_slabs,
                stats.nr_cpu_cached_objs,
                stats.nr_depot_objs
            ),
            (0, 0, 0, 0),
            "{stats:?}"
        );
        assert_eq!(self.source.pages_outstanding(), self.baseline);
        // SAFETY: the execution is over: no thread uses the allocator, its
        // caches or the source any more. The allocator has no destructor
        // (the caches and their loom locks are forgotten with the pages).
        unsafe {
            self.source.release();
            drop(Box::from_raw(
                (self.alloc as *const Kmem<LoomPlatform>).cast_mut(),
            ));
            drop(Box::from_raw((self.source as *const FakeSource).cast_mut()));
            drop(Box::from_raw(
                (self.live as *const StdMutex<HashSet<usize>>).cast_mut(),
            ));
        }
    }
}

/// `(cpu, serial)` as a stamp unique to one allocation.
fn stamp(cpu: usize, serial: u64) -> u64 {
    ((cpu as u64) << 32) | serial
}

/// Stack of the thread a model runs in (loom's default is 32 KiB).
const MODEL_STACK_BYTES: usize = 1 << 20;

/// Run `f` under loom; print how many executions it explored.
fn model(name: &str, f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(PREEMPTION_BOUND);
    }
    // `init` alone (64 kmalloc caches, each created under the cache-list
    // and slab locks) takes thousands of branches before any thread runs.
    builder.max_branches = builder.max_branches.max(100_000);
    let nr_executions = std::sync::Arc::new(AtomicUsize::new(0));
    let counter = nr_executions.clone();
    let f = std::sync::Arc::new(f);
    builder.check(move || {
        counter.fetch_add(1, Ordering::Relaxed);
        // Loom runs a model's main thread on a 32 KiB coroutine stack;
        // `init` (every bootstrap and kmalloc cache) needs more, so the
        // model runs in a thread of its own with room to spare. One more
        // thread, but it only waits in `join`: no new interleaving.
        let f = f.clone();
        thread::Builder::new()
            .stack_size(MODEL_STACK_BYTES)
            .spawn(move || f())
            .expect("model thread")
            .join()
            .unwrap();
    });
    std::println!(
        "{name}: {} executions (preemption bound {:?})",
        nr_executions.load(Ordering::Relaxed),
        builder.preemption_bound
    );
}

/// An object a model holds (any CPU may free it): its handle and the
/// stamp [`Fixture::alloc`] wrote into it.
struct Held {
    obj: InitBox<LoomPlatform>,
    stamp: u64,
}

/// The main CPU leaves one full magazine in the depot (and two in its own
/// per-CPU cache).
fn prime_depot(fixture: &Fixture) {
    set_cpu(MAIN_CPU);
    let primed: Vec<Held> = (0..3).map(|i| fixture.alloc(stamp(MAIN_CPU, i))).collect();
    for held in primed {
        fixture.free(held);
    }
    assert!(fixture.cache.stats().depot_nr_full >= 1);
}

/// Share a fixture with `'static` threads; [`reclaim`] takes it back.
fn share(fixture: Fixture) -> Arc<Fixture> {
    Arc::new(fixture)
}

/// Take back a fixture from [`share`] once every thread using it joined.
fn reclaim(fixture: Arc<Fixture>) -> Fixture {
    Arc::into_inner(fixture).expect("every thread using the fixture joined")
}

/// `nr_workers` CPUs allocate and free at once with one-round magazines,
/// each also freeing an object the main CPU allocated: loaded/prev swaps,
/// full magazines taken from the depot and pushed to it, empty ones taken
/// and given, new magazines made while the other CPUs race for the depot.
fn depot_exchange(nr_workers: usize, nr_own: u64) {
    let fixture = Fixture::new(64);
    prime_depot(&fixture);
    let handed: Vec<Held> = (0..nr_workers as u64)
        .map(|cpu| fixture.alloc(stamp(MAIN_CPU, 10 + cpu)))
        .collect();
    let fixture = share(fixture);
    let workers: Vec<_> = handed
        .into_iter()
        .enumerate()
        .map(|(cpu, handed)| {
            let fixture = Arc::clone(&fixture);
            thread::spawn(move || {
                set_cpu(cpu);
                let own: Vec<Held> = (0..nr_own).map(|i| fixture.alloc(stamp(cpu, i))).collect();
                fixture.free(handed);
                for held in own {
                    fixture.free(held);
                }
            })
        })
        .collect();
    for worker in workers {
        worker.join().unwrap();
    }
    reclaim(fixture).finish();
}

/// Two CPUs, each allocating two objects and freeing them and one from
/// the main CPU.
#[test]
fn loom_depot_exchange() {
    model("depot exchange, 2 CPUs", || depot_exchange(2, 2));
}

/// Three CPUs, each allocating one object and freeing it and one from the
/// main CPU.
#[test]
fn loom_depot_exchange_three_cpus() {
    model("depot exchange, 3 CPUs", || depot_exchange(3, 1));
}

/// One CPU allocates and frees while another reaps: the drain takes each
/// CPU's magazines in a cross-CPU call to it, then the depot's lists under
/// the depot lock, and frees their rounds to the slab layer, racing the
/// allocating CPU's exchanges (and its making a new magazine). No round
/// may be lost or freed twice, and afterwards a final reap returns every
/// page.
#[test]
fn loom_drain_while_allocating() {
    model("drain while allocating", || {
        let fixture = Fixture::new(64);
        // CPU 0 starts with a loaded magazine of one round; the depot
        // gets a full magazine from the main CPU.
        set_cpu(0);
        let warm = fixture.alloc(stamp(0, 100));
        fixture.free(warm);
        prime_depot(&fixture);
        let fixture = share(fixture);
        let worker = thread::spawn({
            let fixture = Arc::clone(&fixture);
            move || {
                set_cpu(0);
                let a = fixture.alloc(stamp(0, 0));
                let b = fixture.alloc(stamp(0, 1));
                fixture.free(a);
                fixture.free(b);
            }
        });
        let reaper = thread::spawn({
            let fixture = Arc::clone(&fixture);
            move || {
                set_cpu(1);
                fixture.cache.reap();
            }
        });
        worker.join().unwrap();
        reaper.join().unwrap();
        reclaim(fixture).finish();
    });
}

/// Two CPUs allocate and free on a bufctl cache (objects tracked in the
/// slab layer's hash, bufctl states flipped where objects leave and enter
/// the slab layer, never on a magazine hit) while the main CPU reaps: the
/// drain also frees the hash table once it is empty, and the slab layer's
/// lock is contended from every side.
#[test]
fn loom_drain_while_two_cpus_allocate_bufctl() {
    model("drain while 2 CPUs allocate, bufctl cache", || {
        // Objects up to 8 KiB get small-object slabs on the primary
        // source: NOTOUCH asks for bufctls.
        let fixture = Fixture::with_flags(1000, CacheFlags::NOTOUCH);
        assert_eq!(fixture.cache.kind(), crate::SlabKind::Bufctl);
        prime_depot(&fixture);
        let fixture = share(fixture);
        let workers: Vec<_> = (0..2)
            .map(|cpu| {
                let fixture = Arc::clone(&fixture);
                thread::spawn(move || {
                    set_cpu(cpu);
                    let a = fixture.alloc(stamp(cpu, 0));
                    fixture.free(a);
                })
            })
            .collect();
        fixture.cache.reap();
        for worker in workers {
            worker.join().unwrap();
        }
        reclaim(fixture).finish();
    });
}

/// An interrupt handler that allocates and frees lands at every point of
/// a CPU's magazine hits (each step of taking and giving back the in-use
/// flag; the hit's body lies between two of them): an alloc hit, a free
/// hit, and a free that misses (one-round magazines) into the depot. The
/// handler finds the flag free (and hits itself) or held (and goes to the
/// slab layer, leaving the magazines alone). No object is handed out
/// twice, no round lost or duplicated, every page comes back.
#[test]
fn loom_interrupt_at_every_point_of_the_hit() {
    model("interrupt at every point of the hit", || {
        let fixture = Fixture::new(64);
        // CPU 0 starts with one round loaded (its first alloc hits).
        set_cpu(0);
        let warm = fixture.alloc(stamp(0, 100));
        fixture.free(warm);
        let fixture = share(fixture);
        let irq = thread::spawn({
            let fixture = Arc::clone(&fixture);
            move || {
                interrupt(0, || {
                    let a = fixture.alloc(stamp(0, 200));
                    let b = fixture.alloc(stamp(0, 201));
                    fixture.free(a);
                    fixture.free(b);
                });
            }
        });
        task_start(0);
        let a = fixture.alloc(stamp(0, 0));
        let b = fixture.alloc(stamp(0, 1));
        fixture.free(a);
        fixture.free(b);
        task_end();
        irq.join().unwrap();
        reclaim(fixture).finish();
    });
}
