//! Allocation from interrupt handlers (issue 18): the LAPIC timer's
//! handler allocates and frees in a tight loop — magazine hits, misses and
//! slab growth, in several caches (small-object, bufctl and `NOTOUCH`
//! bufctl-size objects, and kmalloc through `Box`) — while the test's own
//! thread allocates and frees the same caches on the same CPU.
//!
//! Every lock an interrupt handler's allocation can reach (depot, slab
//! layer and bufctl hash, trace table) must be taken with interrupts off
//! or only tried there: a handler that spins on a lock the code it
//! interrupted holds never returns, and the runner's timeout fails the
//! test. Every object is stamped by its holder and checked before its
//! free (an object handed out twice loses one holder's stamp); at the end
//! every object is back (cache statistics), `verify` finds nothing, and
//! the caches are destroyed without leaks. The kernel's hits are
//! restartable sequences (`magpie_slab::restart`): the printed line says
//! how many timer interrupts landed inside one and sent it back to its
//! start (`restarts=`, a few per run; `tests/restartable_hit.rs` puts one
//! at every instruction).
//!
//! Then the handler makes bad frees (`KmemCache::free` and
//! `GlobalAlloc::dealloc` of a pointer the allocator never handed out)
//! while the thread makes them too and reads the error ring: both report
//! through the error ring and the error and free-error hooks, whose locks
//! must be taken with interrupts off (the handler spun forever on one the
//! thread held).

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
use alloc::vec::Vec;
use core::ptr::NonNull;
use core::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use magpie_slab::CacheArgs;

use magpie::arch::{self, lapic, tsc};
use magpie::kmem::{KernelPlatform, SLAB};
use magpie_slab::reports::{ErrorKind, ErrorReport};
use magpie_slab::{CacheFlags, FreeError, KmemCache, SlabKind};

type Cache = KmemCache<KernelPlatform>;

magpie::test_kernel!();

/// Caches both sides use: a small-object cache, a bufctl cache and a
/// `NOTOUCH` (bufctl) cache of small objects. Set before the timer starts.
const NR_CACHES: usize = 3;
static CACHES: [AtomicPtr<Cache>; NR_CACHES] =
    [const { AtomicPtr::new(core::ptr::null_mut()) }; NR_CACHES];

/// Objects the handler holds per cache at most (more than a magazine and a
/// slab's worth: its own frees and allocations miss and grow).
const IRQ_HELD: usize = 192;
/// Objects the handler allocates (and frees) per cache on each tick.
const IRQ_BATCH: usize = 6;
/// Timer ticks whose handler ran before the test stops.
const TICKS: u64 = 1500;
/// Timer period (µs).
const PERIOD_US: u64 = 400;

/// Timer ticks handled.
static NR_TICKS: AtomicU64 = AtomicU64::new(0);
/// Objects the handler allocated / freed (all caches, kmalloc included).
static IRQ_ALLOCS: AtomicU64 = AtomicU64::new(0);
static IRQ_FREES: AtomicU64 = AtomicU64::new(0);

/// Offset of a holder's stamp in an object (not 0: small slabs thread
/// their free list there, and the free key sits in the first word).
const STAMP_OFFSET: usize = 8;

#[expect(
    clippy::cast_ptr_alignment,
    reason = "object starts are 8-aligned and STAMP_OFFSET is a multiple of 8"
)]
fn stamp(obj: NonNull<u8>, value: u64) {
    // SAFETY: every object here is at least 16 bytes, 8-aligned, and held
    // by the stamping side.
    unsafe {
        obj.as_ptr()
            .add(STAMP_OFFSET)
            .cast::<u64>()
            .write_volatile(value)
    }
}

#[expect(
    clippy::cast_ptr_alignment,
    reason = "object starts are 8-aligned and STAMP_OFFSET is a multiple of 8"
)]
fn stamp_of(obj: NonNull<u8>) -> u64 {
    // SAFETY: as in `stamp`.
    unsafe { obj.as_ptr().add(STAMP_OFFSET).cast::<u64>().read_volatile() }
}

fn cache(index: usize) -> &'static Cache {
    let cache = CACHES[index].load(Ordering::Acquire);
    assert!(!cache.is_null(), "cache {index} not created");
    // SAFETY: set once from a `&'static Cache` before the timer starts,
    // destroyed only after it stopped.
    unsafe { &*cache }
}

/// The handler's objects, touched only by the handler (one CPU's timer)
/// until the timer has stopped.
struct IrqHeld {
    objs: [[usize; IRQ_HELD]; NR_CACHES],
    stamps: [[u64; IRQ_HELD]; NR_CACHES],
    lens: [usize; NR_CACHES],
    #[expect(clippy::vec_box, reason = "each Box is a kmalloc from the handler")]
    boxes: Vec<Box<[u64; 12]>>,
}

static IRQ_STATE: spin::Mutex<IrqHeld> = spin::Mutex::new(IrqHeld {
    objs: [[0; IRQ_HELD]; NR_CACHES],
    stamps: [[0; IRQ_HELD]; NR_CACHES],
    lens: [0; NR_CACHES],
    boxes: Vec::new(),
});

/// Stamps distinct between the sides: the handler's have bit 63 set.
static NEXT_STAMP: AtomicU64 = AtomicU64::new(1);

/// The timer's work: for each cache free a batch of the oldest objects
/// (while over a target that swings between empty and `IRQ_HELD` every 64
/// ticks: runs of misses and growth, then runs of frees), then allocate a
/// batch; a few kmalloc `Box`es alike.
fn on_tick() {
    let tick = NR_TICKS.load(Ordering::Relaxed);
    let mut state = IRQ_STATE
        .try_lock()
        .expect("the handler's state is the handler's alone");
    let target = if (tick / 64).is_multiple_of(2) {
        IRQ_HELD
    } else {
        0
    };
    for index in 0..NR_CACHES {
        let cache = cache(index);
        for _ in 0..IRQ_BATCH {
            let len = state.lens[index];
            if len == 0 || (len < target && len < IRQ_HELD) {
                break;
            }
            let obj = NonNull::new(state.objs[index][0] as *mut u8).unwrap();
            assert_eq!(
                stamp_of(obj),
                state.stamps[index][0],
                "an object the handler holds was handed out again"
            );
            state.objs[index].copy_within(1..len, 0);
            state.stamps[index].copy_within(1..len, 0);
            state.lens[index] = len - 1;
            // SAFETY: allocated from `cache` by this handler, held since.
            unsafe { cache.free(obj) }.expect("free from the timer handler");
            IRQ_FREES.fetch_add(1, Ordering::Relaxed);
        }
        for _ in 0..IRQ_BATCH {
            let len = state.lens[index];
            if len >= IRQ_HELD {
                break;
            }
            let obj = cache.alloc().expect("alloc from the timer handler");
            let value = NEXT_STAMP.fetch_add(1, Ordering::Relaxed) | 1 << 63;
            stamp(obj, value);
            state.objs[index][len] = obj.as_ptr() as usize;
            state.stamps[index][len] = value;
            state.lens[index] = len + 1;
            IRQ_ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
    }
    // kmalloc (GlobalAlloc) from the handler, through the shared classes.
    if state.boxes.len() >= 32 {
        state.boxes.clear();
    }
    let value = NEXT_STAMP.fetch_add(1, Ordering::Relaxed) | 1 << 63;
    state.boxes.push(Box::new([value; 12]));
    assert!(state.boxes.iter().all(|b| b.iter().all(|&w| w == b[0])));
    NR_TICKS.fetch_add(1, Ordering::Relaxed);
}

/// The test thread's side: batches of varying size per cache, stamped,
/// rechecked after a pause (timer ticks land in between), freed.
fn main_side(round: usize, held: &mut Vec<(usize, NonNull<u8>, u64)>) {
    let batch = 1 + (round * 37) % 300;
    for index in 0..NR_CACHES {
        for _ in 0..batch {
            let obj = cache(index).alloc().expect("alloc from the test thread");
            let value = NEXT_STAMP.fetch_add(1, Ordering::Relaxed) & !(1 << 63);
            stamp(obj, value);
            held.push((index, obj, value));
        }
    }
    // Also kmalloc: Vecs of Boxes of the handler's size.
    let boxes: Vec<Box<[u64; 12]>> = (0..batch / 4).map(|i| Box::new([i as u64; 12])).collect();
    tsc::delay_us(200);
    for (i, b) in boxes.iter().enumerate() {
        assert!(
            b.iter().all(|&w| w == i as u64),
            "a kmalloc object was handed out twice"
        );
    }
    // Free the older half first (a different order than allocated).
    let mut index = 0;
    while index < held.len() {
        let (cache_index, obj, value) = held[index];
        assert_eq!(
            stamp_of(obj),
            value,
            "an object the test thread holds was handed out again"
        );
        if index % 2 == round % 2 {
            held.swap_remove(index);
            // SAFETY: allocated from that cache by this thread, held since.
            unsafe { cache(cache_index).free(obj) }.expect("free from the test thread");
        } else {
            index += 1;
        }
    }
    if held.len() > 600 {
        for (cache_index, obj, value) in held.drain(..) {
            assert_eq!(stamp_of(obj), value, "handed out twice");
            // SAFETY: as above.
            unsafe { cache(cache_index).free(obj) }.expect("free from the test thread");
        }
    }
}

/// Run `handler` on every LAPIC timer tick and `thread` in a loop until
/// `ticks` reaches `until` (at most 15 s); return with the timer stopped,
/// every pending tick run, and interrupts off.
fn run_timer(handler: fn(), ticks: &AtomicU64, until: u64, mut thread: impl FnMut()) {
    arch::idt::set_timer_handler(handler);
    lapic::timer_start(PERIOD_US);
    x86_64::instructions::interrupts::enable();
    let start = arch::rdtsc();
    let limit = tsc::khz() * 15_000; // 15 s of TSC time
    while ticks.load(Ordering::Relaxed) < until {
        thread();
        assert!(
            arch::rdtsc() - start < limit,
            "only {} timer ticks in 15 s",
            ticks.load(Ordering::Relaxed)
        );
    }
    x86_64::instructions::interrupts::disable();
    lapic::timer_stop();
    x86_64::instructions::interrupts::enable();
    // A tick that was pending when the timer stopped has run by now.
    tsc::delay_us(1000);
    x86_64::instructions::interrupts::disable();
}

#[test_case]
fn timer_interrupt_allocates_against_the_thread() {
    let created = [
        ("irq-small", 48, CacheFlags::empty(), SlabKind::Small),
        ("irq-bufctl", 9000, CacheFlags::empty(), SlabKind::Bufctl),
        ("irq-notouch", 64, CacheFlags::NOTOUCH, SlabKind::Bufctl),
    ];
    for (index, (name, size, flags, kind)) in created.into_iter().enumerate() {
        let cache = SLAB
            .cache_create(
                name,
                size,
                &CacheArgs {
                    align: 8,
                    flags,
                    ..CacheArgs::DEFAULT
                },
            )
            .expect("cache_create");
        assert_eq!(cache.stats().kind, kind, "{name}'s slab kind");
        CACHES[index].store(core::ptr::from_ref(cache).cast_mut(), Ordering::Release);
    }
    let before: Vec<_> = (0..NR_CACHES).map(|i| cache(i).stats()).collect();

    let mut held = Vec::new();
    let mut round = 0;
    let rounds = AtomicUsize::new(0);
    run_timer(on_tick, &NR_TICKS, TICKS, || {
        main_side(round, &mut held);
        round += 1;
        rounds.store(round, Ordering::Relaxed);
    });

    // Give everything back: the thread's, then the handler's.
    for (cache_index, obj, value) in held.drain(..) {
        assert_eq!(stamp_of(obj), value, "handed out twice");
        // SAFETY: allocated from that cache by this thread, held since.
        unsafe { cache(cache_index).free(obj) }.expect("free");
    }
    let mut state = IRQ_STATE.lock();
    for index in 0..NR_CACHES {
        for slot in 0..state.lens[index] {
            let obj = NonNull::new(state.objs[index][slot] as *mut u8).unwrap();
            assert_eq!(stamp_of(obj), state.stamps[index][slot], "handed out twice");
            // SAFETY: allocated by the handler from that cache, held since.
            unsafe { cache(index).free(obj) }.expect("free");
            IRQ_FREES.fetch_add(1, Ordering::Relaxed);
        }
        state.lens[index] = 0;
    }
    state.boxes = Vec::new();
    drop(state);
    x86_64::instructions::interrupts::enable();

    let irq_allocs = IRQ_ALLOCS.load(Ordering::Relaxed);
    magpie::println!(
        "IRQ_ALLOC ticks={} irq_allocs={irq_allocs} irq_frees={} thread_rounds={} restarts={}",
        NR_TICKS.load(Ordering::Relaxed),
        IRQ_FREES.load(Ordering::Relaxed),
        rounds.load(Ordering::Relaxed),
        magpie::arch::idt::restarts()
    );
    assert_eq!(irq_allocs, IRQ_FREES.load(Ordering::Relaxed));
    for (index, before) in before.iter().enumerate() {
        let stats = cache(index).stats();
        assert_eq!(stats.nr_allocated, 0, "{index}: every object back");
        assert_eq!(
            stats.nr_allocs_ever, stats.nr_frees_ever,
            "{index}: allocs = frees"
        );
        assert!(
            stats.nr_slabs > before.nr_slabs,
            "{index}: the slab layer grew ({} slabs)",
            stats.nr_slabs
        );
        let summary = cache(index).verify();
        assert_eq!(summary.nr_problems, 0, "{index}: verify");
    }
    for slot in &CACHES {
        let cache = slot.swap(core::ptr::null_mut(), Ordering::AcqRel);
        // SAFETY: created above; the timer has stopped and nothing holds
        // an object.
        let report = unsafe { magpie::kmem::cache_destroy(&*cache) }.expect("destroy");
        let _ = report;
    }
}

/// A block the allocator never handed out: freeing it is refused and
/// reported (a foreign pointer), nothing else changes.
static FOREIGN: [u64; 16] = [0; 16];

/// Bad-free ticks whose handler ran before the second test stops.
const BAD_TICKS: u64 = 400;
static NR_BAD_TICKS: AtomicU64 = AtomicU64::new(0);
/// Error reports and free errors the hooks saw.
static NR_REPORTS: AtomicU64 = AtomicU64::new(0);
static NR_FREE_ERRORS: AtomicU64 = AtomicU64::new(0);

fn count_report(report: &ErrorReport) {
    assert_eq!(report.buffer, FOREIGN.as_ptr() as usize, "{report:?}");
    NR_REPORTS.fetch_add(1, Ordering::Relaxed);
}

fn count_free_error(error: &FreeError) {
    assert_eq!(error.addr(), FOREIGN.as_ptr() as usize, "{error:?}");
    NR_FREE_ERRORS.fetch_add(1, Ordering::Relaxed);
}

/// One bad free of each kind: `KmemCache::free` (an error report) and
/// `GlobalAlloc::dealloc` (an error report and a free error).
fn bad_frees(cache: &Cache) {
    let foreign = NonNull::from(&FOREIGN).cast::<u8>();
    // SAFETY: refused without touching it: FOREIGN is no object of ours.
    let refused = unsafe { cache.free(foreign) };
    assert!(refused.is_err(), "a foreign pointer's free is refused");
    let layout = core::alloc::Layout::new::<[u64; 16]>();
    // SAFETY: as above (dealloc refuses it and reports).
    unsafe { core::alloc::GlobalAlloc::dealloc(&SLAB, foreign.as_ptr(), layout) };
}

fn on_bad_tick() {
    bad_frees(cache(0));
    NR_BAD_TICKS.fetch_add(1, Ordering::Relaxed);
}

#[test_case]
fn timer_interrupt_reports_bad_frees_against_the_thread() {
    let cache = SLAB
        .cache_create(
            "irq-bad",
            48,
            &CacheArgs {
                align: 8,
                ..CacheArgs::DEFAULT
            },
        )
        .expect("cache_create");
    CACHES[0].store(core::ptr::from_ref(cache).cast_mut(), Ordering::Release);
    SLAB.debug().set_error_hook(Some(count_report));
    SLAB.debug().set_free_error_hook(Some(count_free_error));
    let errors_before = SLAB.debug().nr_errors();
    let bad_before = SLAB.debug().nr_bad_frees();

    let mut nr_thread = 0u64;
    let mut seen = 0;
    let mut ring = [ErrorReport::new(ErrorKind::InvalidFree, "", 0); 16];
    run_timer(on_bad_tick, &NR_BAD_TICKS, BAD_TICKS, || {
        bad_frees(cache);
        nr_thread += 1;
        let read = SLAB.debug().read_errors(seen, &mut ring);
        if read > 0 {
            seen = ring[read - 1].seq;
        }
        assert!(
            ring[..read]
                .iter()
                .all(|r| r.buffer == FOREIGN.as_ptr() as usize)
        );
    });
    let nr_irq = NR_BAD_TICKS.load(Ordering::Relaxed);
    let nr_reports = SLAB.debug().nr_errors() - errors_before;
    let nr_bad = SLAB.debug().nr_bad_frees() - bad_before;
    SLAB.debug()
        .set_error_hook(Some(magpie::debug::slab_debug::report));
    SLAB.debug().set_free_error_hook(None);
    x86_64::instructions::interrupts::enable();
    magpie::println!(
        "IRQ_BAD_FREES ticks={nr_irq} thread={nr_thread} reports={nr_reports} free_errors={nr_bad}"
    );
    // Two reports (the cache's free, kmalloc's) and one free error per
    // bad_frees, on either side.
    assert_eq!(nr_reports, 2 * (nr_irq + nr_thread));
    assert_eq!(NR_REPORTS.load(Ordering::Relaxed), nr_reports);
    assert_eq!(nr_bad, nr_irq + nr_thread);
    assert_eq!(NR_FREE_ERRORS.load(Ordering::Relaxed), nr_bad);
    assert_eq!(cache.stats().nr_allocated, 0);
    CACHES[0].store(core::ptr::null_mut(), Ordering::Release);
    // SAFETY: created above; the timer has stopped, nothing is allocated.
    let report = unsafe { magpie::kmem::cache_destroy(cache) }.expect("destroy");
    let _ = report;
}
