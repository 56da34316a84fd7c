//! The kernel's restartable magazine hits (issue 18, `magpie_slab::restart`),
//! interrupted at every instruction.
//!
//! The hits run with interrupts on and take no flag: an interrupt that
//! lands inside one before its commit sends it back to its start when the
//! handler returns (the kernel's timer and wake IPI call
//! `arch::idt::restart_interrupted_hit` first). Timer interrupts land
//! where they land; this test puts one at each instruction in turn.
//!
//! How: a copy of the kernel's IDT whose #DB entry plays the interrupt.
//! The test single-steps one alloc or free hit with the trap flag; at the
//! `k`-th instruction inside a restartable range (trial `k`), the #DB
//! handler does what an interrupt handler may do on this CPU — allocates
//! and frees on the same cache (its own hits; with 40 objects, misses and
//! magazine exchanges that swap the interrupted hit's magazine away) —
//! then applies the kernel's own fixup to its frame. Trials go on until
//! one finds no `k`-th instruction: every position of every range on the
//! path was interrupted once.
//!
//! Checked, for a `kmem_cache` of 64-byte objects (`KmemCache::alloc` /
//! `free`) and for kmalloc-64 (`GlobalAlloc` on the kernel's allocator):
//! every trial's interrupt fired and was restarted (the kernel's restart
//! count moved by as many), every object handed out is distinct from
//! every object live (the handler's and the test's), no free was refused
//! (the key a restarted free had already written is confirmed not a double
//! free and the free goes on), and at the end every object is back
//! (statistics), `verify` finds nothing, the cache is destroyed without
//! leaks.

#![no_std]
#![no_main]
#![feature(custom_test_frameworks)]
#![feature(abi_x86_interrupt)]
#![test_runner(magpie::test_runner)]
#![reexport_test_harness_main = "test_main"]
#![allow(
    missing_docs,
    clippy::missing_panics_doc,
    reason = "#[test_case] functions are named for what they check and fail by panicking"
)]

use alloc::vec::Vec;
use core::alloc::{GlobalAlloc, Layout};
use core::hint::black_box;
use core::ptr::NonNull;
use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use magpie_slab::CacheArgs;

use magpie::arch::idt;
use magpie::kmem::platform::KernelPlatform;
use magpie::kmem::{SLAB, cache_destroy};
use magpie::testing::{trap_off, trap_on, with_debug_handler};
use magpie_slab::{AllocError, FreeError, Kmem, KmemCache};
use x86_64::structures::idt::InterruptStackFrame;

magpie::test_kernel!();

type Cache = KmemCache<KernelPlatform>;
type Slab = Kmem<KernelPlatform>;

/// Objects the handler may hold.
const HELD_MAX: usize = 1024;
/// Objects the handler allocates or frees in a big trial: more than a
/// magazine's worth, so the interrupted hit's magazine changes under it.
const BIG: usize = 40;

/// What the interrupt works on: a `kmem_cache` or kmalloc-64.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Target {
    Cache,
    Kmalloc,
}

static CACHE: AtomicPtr<Cache> = AtomicPtr::new(core::ptr::null_mut());
static TARGET_KMALLOC: AtomicBool = AtomicBool::new(false);
/// The handler's objects.
static HELD: [AtomicPtr<u8>; HELD_MAX] =
    [const { AtomicPtr::new(core::ptr::null_mut()) }; HELD_MAX];
static NR_HELD: AtomicUsize = AtomicUsize::new(0);
/// Which in-range instruction of this trial gets the interrupt.
static TRIGGER: AtomicUsize = AtomicUsize::new(0);
/// In-range instructions seen in this trial.
static IN_RANGE: AtomicUsize = AtomicUsize::new(0);
/// The trial's interrupt fired.
static FIRED: AtomicBool = AtomicBool::new(false);
/// What the interrupt does: 0 alloc one, 1 free one, 2 alloc BIG, 3 free BIG.
static WORK: AtomicUsize = AtomicUsize::new(0);
/// Failures seen in the handler (it cannot panic): refused frees, null
/// allocations, a frame the fixup left inside the range.
static HANDLER_FAILURES: AtomicU64 = AtomicU64::new(0);

fn target() -> Target {
    if TARGET_KMALLOC.load(Ordering::Relaxed) {
        Target::Kmalloc
    } else {
        Target::Cache
    }
}

fn layout() -> Layout {
    Layout::from_size_align(64, 8).unwrap()
}

fn cache() -> &'static Cache {
    // SAFETY: set before any trial to a cache that lives until the end.
    unsafe { &*CACHE.load(Ordering::Relaxed) }
}

/// One allocation on the target, null on failure.
fn target_alloc() -> *mut u8 {
    match target() {
        Target::Cache => cache()
            .alloc()
            .map_or(core::ptr::null_mut(), NonNull::as_ptr),
        // SAFETY: a 64-byte layout.
        Target::Kmalloc => unsafe { SLAB.alloc(layout()) },
    }
}

/// Free `ptr`, an object of the target; false if refused.
///
/// # Safety
/// `ptr` is a live object of the target, given up.
unsafe fn target_free(ptr: *mut u8) -> bool {
    match target() {
        // SAFETY: per our caller.
        Target::Cache => unsafe { cache().free(NonNull::new(ptr).unwrap()).is_ok() },
        Target::Kmalloc => {
            let before = SLAB.debug().nr_bad_frees();
            // SAFETY: per our caller.
            unsafe { SLAB.dealloc(ptr, layout()) };
            SLAB.debug().nr_bad_frees() == before
        }
    }
}

/// Allocate [`FILL`] objects of the target and free them all: this CPU's
/// magazines and the depot hold rounds for the alloc trials that follow.
fn fill_magazines() {
    let objects: Vec<*mut u8> = (0..FILL).map(|_| target_alloc()).collect();
    for ptr in objects {
        assert!(!ptr.is_null(), "fill: allocation failed");
        // SAFETY: just allocated from the target, given up.
        assert!(unsafe { target_free(ptr) }, "fill: free refused");
    }
}

/// Objects [`fill_magazines`] cycles: more than an alloc round of the
/// biggest work takes (six trials, each with [`BIG`] handler allocations).
const FILL: usize = 8 * BIG;

/// What the interrupt does on this CPU, as a handler would.
fn interrupt_work() {
    let (allocs, frees) = match WORK.load(Ordering::Relaxed) {
        0 => (1, 0),
        1 => (0, 1),
        2 => (BIG, 0),
        _ => (0, BIG),
    };
    for _ in 0..allocs {
        let ptr = target_alloc();
        let n = NR_HELD.load(Ordering::Relaxed);
        if ptr.is_null() || n == HELD_MAX {
            HANDLER_FAILURES.fetch_add(1, Ordering::Relaxed);
            return;
        }
        HELD[n].store(ptr, Ordering::Relaxed);
        NR_HELD.store(n + 1, Ordering::Relaxed);
    }
    for _ in 0..frees {
        let n = NR_HELD.load(Ordering::Relaxed);
        if n == 0 {
            return;
        }
        let ptr = HELD[n - 1].swap(core::ptr::null_mut(), Ordering::Relaxed);
        NR_HELD.store(n - 1, Ordering::Relaxed);
        // SAFETY: one of the handler's live objects of the target.
        if !unsafe { target_free(ptr) } {
            HANDLER_FAILURES.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The #DB entry: at the trial's instruction inside a restartable range,
/// the interrupt's work, then the kernel's fixup.
extern "x86-interrupt" fn step(mut frame: InterruptStackFrame) {
    let ip = frame.instruction_pointer.as_u64() as usize;
    let Some(start) = magpie_slab::restart::restart_ip(ip) else {
        return;
    };
    let seen = IN_RANGE.fetch_add(1, Ordering::Relaxed);
    if seen != TRIGGER.load(Ordering::Relaxed) || FIRED.load(Ordering::Relaxed) {
        return;
    }
    FIRED.store(true, Ordering::Relaxed);
    interrupt_work();
    idt::restart_interrupted_hit(&mut frame);
    if frame.instruction_pointer.as_u64() as usize != start {
        HANDLER_FAILURES.fetch_add(1, Ordering::Relaxed);
    }
}

/// Start trial `k` with interrupt work `work`.
fn arm(k: usize, work: usize) {
    TRIGGER.store(k, Ordering::Relaxed);
    IN_RANGE.store(0, Ordering::Relaxed);
    FIRED.store(false, Ordering::Relaxed);
    WORK.store(work, Ordering::Relaxed);
}

type CacheAllocFn = fn(&Cache) -> Result<NonNull<u8>, AllocError>;
type CacheFreeFn = unsafe fn(&Cache, NonNull<u8>) -> Result<(), FreeError>;
type SlabAllocFn = unsafe fn(&'static Slab, Layout) -> *mut u8;
type SlabFreeFn = unsafe fn(&'static Slab, *mut u8, Layout);

/// One stepped allocation from the target (through the same functions the
/// kernel calls), and whether its trial's interrupt fired.
#[inline(never)]
fn stepped_alloc() -> (*mut u8, bool) {
    let ptr = match target() {
        Target::Cache => {
            let f: CacheAllocFn = black_box(Cache::alloc);
            trap_on();
            let result = f(cache());
            trap_off();
            result.map_or(core::ptr::null_mut(), NonNull::as_ptr)
        }
        Target::Kmalloc => {
            let f: SlabAllocFn = black_box(<Slab as GlobalAlloc>::alloc);
            trap_on();
            // SAFETY: a 64-byte layout.
            let ptr = unsafe { f(&SLAB, layout()) };
            trap_off();
            ptr
        }
    };
    (ptr, FIRED.load(Ordering::Relaxed))
}

/// One stepped free of `ptr` to the target: (not refused, fired).
///
/// # Safety
/// `ptr` is a live object of the target, given up.
#[inline(never)]
unsafe fn stepped_free(ptr: *mut u8) -> (bool, bool) {
    let ok = match target() {
        Target::Cache => {
            let f: CacheFreeFn = black_box(Cache::free);
            trap_on();
            // SAFETY: per our caller.
            let result = unsafe { f(cache(), NonNull::new(ptr).unwrap()) };
            trap_off();
            result.is_ok()
        }
        Target::Kmalloc => {
            let before = SLAB.debug().nr_bad_frees();
            let f: SlabFreeFn = black_box(<Slab as GlobalAlloc>::dealloc);
            trap_on();
            // SAFETY: per our caller.
            unsafe { f(&SLAB, ptr, layout()) };
            trap_off();
            SLAB.debug().nr_bad_frees() == before
        }
    };
    (ok, FIRED.load(Ordering::Relaxed))
}

/// Every live object: the test's and the handler's.
fn live(mine: &[*mut u8]) -> Vec<*mut u8> {
    let mut all: Vec<*mut u8> = mine.to_vec();
    for slot in HELD.iter().take(NR_HELD.load(Ordering::Relaxed)) {
        all.push(slot.load(Ordering::Relaxed));
    }
    all
}

/// Instructions in the alloc hit's restartable range (`restart::pop`:
/// load `top`, load the round, test, branch, move `top`, the commit) and in
/// the free's (`restart::push`: load `top`, compare with `limit`, branch,
/// load the key, compare, branch, write the key, write the slot, move
/// `top`, the commit).
const ALLOC_RANGE: usize = 6;
const FREE_RANGE: usize = 10;
/// Tries of one trial before it must have fired (a try whose hit missed
/// before its `k`-th instruction changed the magazines: the next one
/// hits).
const TRIES: usize = 16;

/// All trials on the current target: every instruction of both ranges
/// interrupted under each kind of work; returns (alloc trials, free
/// trials).
fn trials() -> (usize, usize) {
    let mut mine: Vec<*mut u8> = Vec::with_capacity(256);
    let mut alloc_trials = 0;
    let mut free_trials = 0;
    // Warm this CPU's magazines.
    for _ in 0..8 {
        let ptr = target_alloc();
        assert!(!ptr.is_null());
        mine.push(ptr);
    }
    for work in 0..4 {
        // Rounds in this CPU's magazines and the depot for every alloc
        // trial (the hit's range is whole only when `loaded` has a round:
        // the miss does not run the hit again).
        fill_magazines();
        // The handler holds something to free.
        WORK.store(2, Ordering::Relaxed);
        interrupt_work();
        for k in 0..ALLOC_RANGE {
            // An alloc hit interrupted at its k-th instruction in range.
            let mut fired = false;
            for _ in 0..TRIES {
                arm(k, work);
                let (ptr, now) = stepped_alloc();
                assert!(
                    !ptr.is_null(),
                    "trial {k} (work {work}): the interrupted alloc failed"
                );
                assert!(
                    !live(&mine).contains(&ptr),
                    "trial {k} (work {work}): {ptr:p} handed out while live"
                );
                mine.push(ptr);
                if now {
                    fired = true;
                    break;
                }
            }
            assert!(
                fired,
                "alloc trial {k} (work {work}) never reached its instruction"
            );
            alloc_trials += 1;
        }
        for k in 0..FREE_RANGE {
            // A free hit interrupted at its k-th instruction in range.
            let mut fired = false;
            for _ in 0..TRIES {
                if mine.is_empty() {
                    mine.push(target_alloc());
                }
                arm(k, work);
                let ptr = mine.pop().unwrap();
                // SAFETY: one of the test's live objects of the target.
                let (ok, now) = unsafe { stepped_free(ptr) };
                assert!(
                    ok,
                    "trial {k} (work {work}): the interrupted free of {ptr:p} was refused"
                );
                if now {
                    fired = true;
                    break;
                }
            }
            assert!(
                fired,
                "free trial {k} (work {work}) never reached its instruction"
            );
            free_trials += 1;
        }
    }
    // Everything back.
    for ptr in mine.drain(..) {
        // SAFETY: the test's live objects.
        assert!(unsafe { target_free(ptr) });
    }
    WORK.store(3, Ordering::Relaxed);
    while NR_HELD.load(Ordering::Relaxed) > 0 {
        interrupt_work();
    }
    assert_eq!(
        HANDLER_FAILURES.load(Ordering::Relaxed),
        0,
        "failures in the handler"
    );
    (alloc_trials, free_trials)
}

/// [`trials`] under the #DB entry [`step`]: four kinds of work, each
/// interrupting every instruction of both ranges, every interrupt
/// restarted (the kernel's count moves by as many).
fn interrupted_everywhere() -> (usize, usize) {
    let restarts = idt::restarts();
    let (allocs, frees) = with_debug_handler(step, trials);
    assert_eq!((allocs, frees), (4 * ALLOC_RANGE, 4 * FREE_RANGE));
    assert_eq!(
        idt::restarts() - restarts,
        (allocs + frees) as u64,
        "restart count"
    );
    (allocs, frees)
}

#[test_case]
fn every_instruction_of_the_kmem_cache_hits_interrupted() {
    let cache = SLAB
        .cache_create(
            "restart-64",
            64,
            &CacheArgs {
                align: 8,
                ..CacheArgs::DEFAULT
            },
        )
        .expect("cache_create");
    CACHE.store(core::ptr::from_ref(cache).cast_mut(), Ordering::Relaxed);
    TARGET_KMALLOC.store(false, Ordering::Relaxed);
    let (allocs, frees) = interrupted_everywhere();
    let stats = cache.stats();
    assert_eq!(stats.nr_allocated, 0, "objects still out");
    assert_eq!(cache.verify().nr_problems, 0, "verify");
    // SAFETY: no object is live, nothing else uses the cache.
    unsafe { cache_destroy(cache) }.expect("destroy: no object left out");
    magpie::println!("restartable hits (kmem_cache): {allocs} alloc and {frees} free trials");
}

#[test_case]
fn every_instruction_of_the_kmalloc_hits_interrupted() {
    TARGET_KMALLOC.store(true, Ordering::Relaxed);
    let kmalloc = SLAB.find_cache("kmalloc-64").expect("kmalloc-64");
    let before = kmalloc.stats().nr_allocated;
    let (allocs, frees) = interrupted_everywhere();
    assert_eq!(kmalloc.stats().nr_allocated, before, "objects still out");
    assert_eq!(kmalloc.verify().nr_problems, 0, "verify");
    magpie::println!("restartable hits (kmalloc-64): {allocs} alloc and {frees} free trials");
}
