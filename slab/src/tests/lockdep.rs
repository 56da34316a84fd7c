//! The lock validator ([`crate::lockdep`], debug builds): it reports a
//! lock class taken both in interrupt context and with interrupts on, and
//! the allocator's own locks pass it under a stress in which every CPU's
//! "interrupt handler" (a stretch of the thread's work run with
//! [`as_interrupt`]) allocates, frees and reports bad frees with every
//! feature on: trace tables, kmemtrace with stacks, KFENCE, debug caches,
//! while verify, reap and statistics run outside.

use crate::CacheArgs;
use std::format;
use std::string::String;
use std::sync::Mutex;
use std::vec::Vec;

use super::support::*;
use crate::kmemtrace::KmemtraceConfig;
use crate::lockdep::{self, LockClassName, LockdepReport};
use crate::sync::{IrqMutex, IrqTryMutex, SpinIrq};
use crate::{CacheFlags, KmemCache};

/// Serialises the tests that set the report hook (it is global).
static HOOK_USERS: Mutex<()> = Mutex::new(());

/// Reports the hook saw (the tests that count them).
static SEEN: Mutex<Vec<LockdepReport>> = Mutex::new(Vec::new());

fn record(report: &LockdepReport) {
    SEEN.lock().unwrap().push(*report);
}

/// The panic message of `f`, if it panicked.
fn panic_message(f: impl FnOnce() + std::panic::UnwindSafe) -> Option<String> {
    let payload = std::panic::catch_unwind(f).err()?;
    Some(
        payload
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| {
                payload
                    .downcast_ref::<&str>()
                    .map(|text| String::from(*text))
            })
            .unwrap_or_default(),
    )
}

#[test]
#[cfg(debug_assertions)]
fn a_lock_taken_with_interrupts_on_and_in_an_interrupt_handler_is_reported() {
    let _serial = HOOK_USERS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    lockdep::set_report_hook(None);
    set_cpu(1);
    // The wrong way: a lock that code with interrupts on spins on, spun
    // on by an interrupt handler too. No timing is needed to see it.
    static WRONG: IrqTryMutex<u32> = IrqTryMutex::new(0);
    let site = line!() - 1;
    *WRONG.lock::<TestPlatform>() += 1;
    let message = panic_message(|| {
        as_interrupt(|| *WRONG.lock::<TestPlatform>() += 1);
    })
    .expect("lockdep panics without a hook");
    assert!(message.contains("inconsistent lock state"), "{message}");
    assert!(
        message.contains(&format!("slab/src/tests/lockdep.rs:{site}:")),
        "the class is the lock's site: {message}"
    );
    assert!(message.contains("now: in interrupt context"), "{message}");
    // Reported before the handler spun (its increment never ran), and
    // once per class: the next time passes.
    as_interrupt(|| *WRONG.lock::<TestPlatform>() += 1);
    assert_eq!(*WRONG.lock::<TestPlatform>(), 2);
}

#[test]
#[cfg(debug_assertions)]
fn the_other_order_is_reported_through_the_hook() {
    let _serial = HOOK_USERS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    lockdep::set_report_hook(Some(record));
    SEEN.lock().unwrap().clear();
    set_cpu(2);
    static WRONG: IrqTryMutex<()> = IrqTryMutex::new(());
    as_interrupt(|| drop(WRONG.lock::<TestPlatform>()));
    assert!(SEEN.lock().unwrap().is_empty(), "one state is no report");
    drop(WRONG.lock::<TestPlatform>());
    let seen = SEEN.lock().unwrap().clone();
    lockdep::set_report_hook(None);
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert!(!seen[0].now_in_irq);
    assert_eq!(seen[0].cpu, 2);
    assert!(
        matches!(seen[0].class, LockClassName::Site(site) if site.file() == "slab/src/tests/lockdep.rs"),
        "{:?}",
        seen[0].class
    );
    assert!(
        format!("{}", seen[0]).contains("now: with interrupts enabled"),
        "{}",
        seen[0]
    );
}

#[test]
#[cfg(debug_assertions)]
fn the_right_ways_are_not_reported() {
    let _serial = HOOK_USERS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    lockdep::set_report_hook(Some(record));
    SEEN.lock().unwrap().clear();
    set_cpu(3);
    // Only tried from interrupt context.
    static TRIED: IrqTryMutex<()> = IrqTryMutex::new(());
    drop(TRIED.lock::<TestPlatform>());
    as_interrupt(|| drop(TRIED.try_lock::<TestPlatform>()));
    // Taken with interrupts off everywhere.
    static IRQ_OFF: SpinIrq<()> = SpinIrq::new(());
    drop(IRQ_OFF.lock::<TestPlatform>());
    as_interrupt(|| drop(IRQ_OFF.lock::<TestPlatform>()));
    let per_cache: IrqMutex<TestPlatform, ()> = IrqMutex::new(());
    drop(per_cache.lock());
    as_interrupt(|| drop(per_cache.lock()));
    let seen = SEEN.lock().unwrap().clone();
    lockdep::set_report_hook(None);
    assert!(seen.is_empty(), "{seen:?}");
    let stats = lockdep::stats();
    assert!(stats.enabled);
    assert!(stats.nr_classes >= 3);
    assert!(stats.nr_used_in_irq >= 2 && stats.nr_tried_in_irq >= 1);
}

#[test]
#[cfg(not(debug_assertions))]
fn release_builds_check_nothing() {
    static WRONG: IrqTryMutex<()> = IrqTryMutex::new(());
    drop(WRONG.lock::<TestPlatform>());
    as_interrupt(|| drop(WRONG.lock::<TestPlatform>()));
    assert_eq!(lockdep::stats(), lockdep::LockdepStats::default());
}

/// Operations per thread in the stress (its interrupt handler runs every
/// [`IRQ_EVERY`] of them).
const NR_OPS: usize = scaled(20_000);
const IRQ_EVERY: usize = 7;
/// Objects the thread and its handler each hold at most per cache.
const MAX_HELD: usize = 48;

/// A live object with its stamp (at offset 8: the free key and the free
/// list use the first word).
struct Held {
    cache: usize,
    obj: core::ptr::NonNull<u8>,
    stamp: u64,
}

fn stamp(obj: core::ptr::NonNull<u8>, value: u64) {
    // SAFETY: every object here is at least 16 bytes, 8-aligned, ours.
    unsafe { obj.as_ptr().add(8).cast::<u64>().write_unaligned(value) }
}

fn stamp_of(obj: core::ptr::NonNull<u8>) -> u64 {
    // SAFETY: as in `stamp`.
    unsafe { obj.as_ptr().add(8).cast::<u64>().read_unaligned() }
}

/// One side's work on the caches: free the oldest half when full, then
/// allocate; every object stamped and checked at its free; a bad free.
fn churn(
    alloc: &'static TestAlloc,
    caches: &[&'static KmemCache<TestPlatform>],
    held: &mut Vec<Held>,
    next: &mut u64,
) {
    if held.len() >= MAX_HELD * caches.len() {
        for item in held.drain(..MAX_HELD) {
            assert_eq!(stamp_of(item.obj), item.stamp, "handed out twice");
            let result = if item.cache == caches.len() {
                // SAFETY: from kmalloc, held since.
                unsafe { alloc.kfree(item.obj) }
            } else {
                // SAFETY: from that cache, held since.
                unsafe { caches[item.cache].free(item.obj) }
            };
            result.expect("free");
        }
    }
    for cache in 0..=caches.len() {
        let obj = if cache == caches.len() {
            alloc.kmalloc(24 + *next as usize % 200, 8)
        } else {
            caches[cache].alloc()
        }
        .expect("alloc");
        *next += 1;
        stamp(obj, *next);
        held.push(Held {
            cache,
            obj,
            stamp: *next,
        });
    }
    if (*next).is_multiple_of(97) {
        // A bad free: reported through the error ring and hook.
        static FOREIGN: [u64; 8] = [0; 8];
        let foreign = core::ptr::NonNull::from(&FOREIGN).cast::<u8>();
        // SAFETY: refused without touching it: no object of ours.
        assert!(unsafe { caches[0].free(foreign) }.is_err());
    }
}

#[test]
#[cfg_attr(miri, ignore = "threads and 20,000 operations each")]
fn the_allocators_locks_pass_lockdep_under_interrupts_with_every_feature() {
    let _serial = HOOK_USERS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    lockdep::set_report_hook(None); // a report panics the test
    let reports_before = lockdep::stats().nr_reports;
    let (alloc, source) = setup(8192);
    alloc.debug().set_error_hook(Some(|_| {}));
    alloc.kfence().init(0).expect("kfence");
    let caches: Vec<&'static KmemCache<TestPlatform>> = [
        ("ld-small", 48, CacheFlags::empty()),
        ("ld-bufctl", 1500, CacheFlags::empty()),
        (
            "ld-debug",
            64,
            CacheFlags::AUDIT | CacheFlags::REDZONE | CacheFlags::POISON,
        ),
    ]
    .into_iter()
    .map(|(name, size, flags)| {
        alloc
            .cache_create(
                name,
                size,
                &CacheArgs {
                    align: 8,
                    flags,
                    ..CacheArgs::DEFAULT
                },
            )
            .expect("create")
    })
    .collect();
    for cache in &caches {
        cache.trace_table().start().expect("trace");
    }
    alloc
        .kmemtrace()
        .start(KmemtraceConfig {
            stack_depth: 4,
            ..KmemtraceConfig::default()
        })
        .expect("kmemtrace");
    let caches = &caches;
    std::thread::scope(|scope| {
        for cpu in 0..NR_CPUS {
            scope.spawn(move || {
                set_cpu(cpu);
                let mut held = Vec::new();
                let mut irq_held = Vec::new();
                let mut next = (cpu as u64) << 40;
                let mut irq_next = (cpu as u64) << 40 | 1 << 39;
                for op in 0..NR_OPS {
                    churn(alloc, caches, &mut held, &mut next);
                    if op % IRQ_EVERY == 0 {
                        as_interrupt(|| churn(alloc, caches, &mut irq_held, &mut irq_next));
                    }
                    match op % 1000 {
                        0 if cpu == 0 => {
                            let _ = alloc.kfence().force_sample(None);
                        }
                        250 if cpu == 1 => assert_eq!(alloc.debug().verify().nr_problems, 0),
                        500 if cpu == 2 => {
                            let _ = alloc.reap_all();
                        }
                        750 if cpu == 3 => {
                            let _ = alloc.kmemtrace().status();
                            let _ = caches[0].stats();
                        }
                        _ => {}
                    }
                }
                for side in [held, irq_held] {
                    for item in side {
                        assert_eq!(stamp_of(item.obj), item.stamp, "handed out twice");
                        // SAFETY: as in `churn`.
                        unsafe {
                            if item.cache == caches.len() {
                                alloc.kfree(item.obj)
                            } else {
                                caches[item.cache].free(item.obj)
                            }
                        }
                        .expect("free");
                    }
                }
            });
        }
    });
    alloc.kmemtrace().stop();
    let stats = lockdep::stats();
    assert_eq!(stats.nr_reports, reports_before, "{stats:?}");
    assert_eq!(stats.nr_untracked, 0, "{stats:?}");
    assert!(
        stats.nr_used_in_irq >= 3,
        "the handlers took the allocator's locks: {stats:?}"
    );
    for cache in caches {
        assert_eq!(cache.stats().nr_allocated, 0);
        assert_eq!(cache.verify().nr_problems, 0);
        cache.trace_table().stop();
        assert_eq!(
            cache.trace_table().stats().nr_records,
            0,
            "every record removed"
        );
    }
    assert!(alloc.debug().nr_errors() > 0, "bad frees were reported");
    let _ = source;
}
