//! Allocation profiling (feature `alloc-profiling`) and latency statistics
//! (feature `time-stats`), with a platform that keeps `magpie-codetag`
//! per-CPU counters: the way a kernel (or a benchmark) wires them up.
//!
//! The switch and counters are process-wide, so these tests take `SERIAL`.

use crate::CacheArgs;
use std::boxed::Box;
use std::cell::Cell;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, Once};
use std::vec::Vec;

use magpie_codetag::alloc_tag;
use magpie_codetag::alloc_tag::{
    AllocTag, AllocTagCounters, AllocTagCounts, BootSetting, ProfilingSwitch, UNTAGGED,
};

use super::support::{FakeSource, NR_CPUS, TestPlatform, cpu, fill_box, set_cpu};
use crate::{
    AllocTagHooks, AllocTagRef, CacheFlags, FreeError, Kmem, PAGE_SIZE, Platform, PlatformHooks,
};

static SERIAL: Mutex<()> = Mutex::new(());
static SWITCH: ProfilingSwitch = ProfilingSwitch::new(false);
static COUNTERS: AllocTagCounters = AllocTagCounters::new();
static COUNTERS_ONCE: Once = Once::new();

std::thread_local! {
    /// The scoped "current tag" of this thread (a kernel keeps it per CPU).
    static CURRENT: Cell<Option<AllocTagRef>> = const { Cell::new(None) };
}

/// The machine half of a test [`Platform`], from [`TestPlatform`].
macro_rules! test_platform_basics {
    () => {
        fn max_cpus() -> usize {
            TestPlatform::max_cpus()
        }
        fn cpu_id() -> usize {
            TestPlatform::cpu_id()
        }
        fn irq_save() -> usize {
            TestPlatform::irq_save()
        }
        fn irq_restore(state: usize) {
            TestPlatform::irq_restore(state)
        }
        fn cross_cpu_call(cpu: usize, work: &(dyn Fn() + Sync)) {
            TestPlatform::cross_cpu_call(cpu, work)
        }
        fn now() -> u64 {
            TestPlatform::now()
        }
    };
}

/// The stack hooks of a test [`PlatformHooks`], from [`TestPlatform`].
macro_rules! test_platform_stacks {
    () => {
        fn backtrace(frames: &mut [usize]) -> usize {
            TestPlatform::backtrace(frames)
        }
        fn context(buf: &mut [u8; 32]) -> usize {
            TestPlatform::context(buf)
        }
    };
}

/// [`TestPlatform`] plus allocation profiling through `magpie-codetag`.
struct ProfiledPlatform;

// SAFETY: the machine half is TestPlatform's (see its SAFETY comment).
unsafe impl Platform for ProfiledPlatform {
    test_platform_basics!();
}

// SAFETY: the hooks keep PlatformHooks' contract: the KFENCE pool (if any) is
// mapped and the platform's own, and charge tokens are the ones the token hooks
// return.
unsafe impl PlatformHooks for ProfiledPlatform {
    test_platform_stacks!();
}

// SAFETY: `charge` and `uncharge` accept every token that `token` and
// `current_token` return (the defaults, or as the hooks below say).
unsafe impl AllocTagHooks for ProfiledPlatform {
    fn current() -> Option<AllocTagRef> {
        if !SWITCH.is_on() {
            return None;
        }
        Some(CURRENT.with(Cell::get).unwrap_or(UNTAGGED.tag_ref()))
    }

    fn add(tag: AllocTagRef, _ptr: NonNull<u8>, bytes: usize) {
        COUNTERS.add(cpu(), tag, bytes);
    }

    fn sub(tag: AllocTagRef, _ptr: NonNull<u8>, bytes: usize) {
        COUNTERS.sub(cpu(), tag, bytes);
    }
}

type ProfiledAlloc = Kmem<ProfiledPlatform>;

/// Serialise, make sure the counters exist, profiling on, CPU 0.
fn setup() -> (MutexGuard<'static, ()>, &'static ProfiledAlloc) {
    let (guard, alloc, _) = setup_with_source();
    (guard, alloc)
}

/// [`setup`], with the allocator's page source.
fn setup_with_source() -> (
    MutexGuard<'static, ()>,
    &'static ProfiledAlloc,
    &'static FakeSource,
) {
    let guard = SERIAL
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    COUNTERS_ONCE.call_once(|| {
        let len = AllocTagCounters::bytes_needed(NR_CPUS);
        let memory: &'static mut [u8] = Vec::leak(std::vec![0u8; len + AllocTagCounters::ALIGN]);
        let start = memory.as_ptr().align_offset(AllocTagCounters::ALIGN);
        assert!(COUNTERS.init_static(&mut memory[start..start + len], NR_CPUS));
    });
    SWITCH.set_at_boot(BootSetting::On);
    set_cpu(0);
    CURRENT.with(|current| current.set(None));
    let source = FakeSource::new(4096);
    let alloc: &'static ProfiledAlloc = Box::leak(Box::new(Kmem::new()));
    alloc.init(source).expect("init");
    (guard, alloc, source)
}

fn counts(tag: &'static AllocTag) -> AllocTagCounts {
    COUNTERS.read(tag.tag_ref())
}

fn site_small() -> &'static AllocTag {
    alloc_tag!()
}
fn site_bufctl() -> &'static AllocTag {
    alloc_tag!()
}
fn site_large() -> &'static AllocTag {
    alloc_tag!()
}
fn site_scope() -> &'static AllocTag {
    alloc_tag!()
}
fn site_cross_cpu() -> &'static AllocTag {
    alloc_tag!()
}
fn site_switch() -> &'static AllocTag {
    alloc_tag!()
}
fn site_audit() -> &'static AllocTag {
    alloc_tag!()
}
fn site_side_array() -> &'static AllocTag {
    alloc_tag!()
}

/// Objects of the side-array cache `kmem_tags_<bytes>` allocated now.
fn side_arrays(alloc: &ProfiledAlloc, bytes: usize) -> usize {
    alloc
        .find_cache(&std::format!("kmem_tags_{bytes}"))
        .unwrap()
        .stats()
        .nr_allocated
}

#[test]
fn tagged_kmalloc_counts_class_rounded_bytes_and_frees_back_to_zero() {
    let (_serial, alloc) = setup();
    let tag = site_small();
    // 100 bytes come from kmalloc-104: charged 104 bytes each.
    let objs: Vec<_> = (0..10)
        .map(|_| {
            alloc
                .profiling()
                .kmalloc_box(100, 8, Some(tag.tag_ref()))
                .unwrap()
        })
        .collect();
    assert_eq!(
        counts(tag),
        AllocTagCounts {
            bytes: 1040,
            calls: 10
        }
    );
    for obj in objs {
        obj.free().unwrap();
    }
    assert_eq!(counts(tag), AllocTagCounts::default());
}

#[test]
fn bufctl_and_page_granular_objects_remember_their_tag() {
    let (_serial, alloc) = setup();
    let cache = alloc
        .cache_create(
            "tagged-big",
            1500,
            &CacheArgs {
                align: 8,
                ..CacheArgs::DEFAULT
            },
        )
        .unwrap();
    let (bufctl_tag, large_tag) = (site_bufctl(), site_large());
    let mut objs: Vec<_> = (0..5)
        .map(|_| cache.alloc_box_tagged(Some(bufctl_tag.tag_ref())).unwrap())
        .collect();
    let big = alloc
        .profiling()
        .kmalloc_box(20_000, 8, Some(large_tag.tag_ref()))
        .unwrap();
    assert_eq!(
        counts(bufctl_tag),
        AllocTagCounts {
            bytes: 7500,
            calls: 5
        }
    );
    assert_eq!(
        counts(large_tag),
        AllocTagCounts {
            bytes: 5 * PAGE_SIZE as u64,
            calls: 1
        }
    );
    assert_eq!(
        alloc.ksize(big.as_ptr()).unwrap(),
        5 * PAGE_SIZE,
        "the tag bits do not leak into ksize"
    );
    // A refused free (an interior pointer) changes nothing.
    let inner = NonNull::new(objs[0].as_ptr().as_ptr().wrapping_add(8)).unwrap();
    // SAFETY: refused.
    let refused = unsafe { cache.free(inner) };
    assert!(matches!(refused, Err(FreeError::Misaligned { .. })));
    objs.remove(0).free().unwrap();
    assert_eq!(
        counts(bufctl_tag),
        AllocTagCounts {
            bytes: 6000,
            calls: 4
        }
    );
    for obj in objs {
        obj.free().unwrap();
    }
    big.free().unwrap();
    assert_eq!(counts(bufctl_tag), AllocTagCounts::default());
    assert_eq!(counts(large_tag), AllocTagCounts::default());
}

#[test]
fn untagged_and_scoped_allocations_through_every_entry_point() {
    let (_serial, alloc) = setup();
    let untagged_before = counts(&UNTAGGED);
    let scope = site_scope();
    // No scope: the untagged bucket.
    let loose = alloc.kmalloc_box(64, 8).unwrap();
    let after = counts(&UNTAGGED);
    assert_eq!(after.calls, untagged_before.calls + 1);
    assert_eq!(after.bytes, untagged_before.bytes + 64);
    // A scope: kmalloc, the GlobalAlloc shim and the Allocator shim
    // (feature `nightly`) all charge the scope's tag.
    CURRENT.with(|current| current.set(Some(scope.tag_ref())));
    let layout = core::alloc::Layout::from_size_align(24, 8).unwrap();
    let by_kmalloc = alloc.kmalloc_box(64, 8).unwrap();
    // SAFETY: a valid non-zero layout.
    let by_global = unsafe { core::alloc::GlobalAlloc::alloc(alloc, layout) };
    #[cfg(feature = "nightly")]
    let by_allocator = core::alloc::Allocator::allocate(&alloc, layout).unwrap();
    CURRENT.with(|current| current.set(None));
    let nightly = cfg!(feature = "nightly");
    assert_eq!(
        counts(scope),
        AllocTagCounts {
            bytes: 64 + 24 + if nightly { 24 } else { 0 },
            calls: 2 + if nightly { 1 } else { 0 }
        }
    );
    // Frees outside the scope still uncharge the scope's tag.
    by_kmalloc.free().unwrap();
    // SAFETY: each block allocated above with this layout, freed once.
    unsafe {
        core::alloc::GlobalAlloc::dealloc(alloc, by_global, layout);
        #[cfg(feature = "nightly")]
        core::alloc::Allocator::deallocate(&alloc, by_allocator.cast(), layout);
    }
    loose.free().unwrap();
    assert_eq!(counts(scope), AllocTagCounts::default());
    assert_eq!(counts(&UNTAGGED), untagged_before);
}

#[test]
fn tag_refs_survive_alloc_on_one_cpu_and_free_on_another() {
    let (_serial, alloc) = setup();
    let cache = alloc
        .cache_create(
            "cross",
            96,
            &CacheArgs {
                align: 8,
                ..CacheArgs::DEFAULT
            },
        )
        .unwrap();
    let tag = site_cross_cpu();
    let objs: Vec<_> = std::thread::scope(|scope| {
        scope
            .spawn(|| {
                set_cpu(1);
                (0..200)
                    .map(|_| cache.alloc_box_tagged(Some(tag.tag_ref())).unwrap())
                    .collect::<Vec<_>>()
            })
            .join()
            .unwrap()
    });
    assert_eq!(
        counts(tag),
        AllocTagCounts {
            bytes: 200 * 96,
            calls: 200
        }
    );
    std::thread::scope(|scope| {
        scope.spawn(move || {
            set_cpu(3);
            for obj in objs {
                obj.free().unwrap();
            }
        });
    });
    // CPU 1 is at +200, CPU 3 at -200: the sum is zero.
    assert_eq!(counts(tag), AllocTagCounts::default());
}

#[test]
fn switch_on_off_never_and_no_underflow() {
    let (_serial, alloc) = setup();
    let tag = site_switch();
    CURRENT.with(|current| current.set(Some(tag.tag_ref())));

    // Off: objects carry no tag; freeing them after turning on subtracts
    // nothing (no underflow), and the counts are marked inaccurate.
    SWITCH.set_at_boot(BootSetting::Off);
    let while_off: Vec<_> = (0..8).map(|_| alloc.kmalloc_box(32, 8).unwrap()).collect();
    let big_while_off = alloc.kmalloc_box(3 * PAGE_SIZE, 8).unwrap();
    assert_eq!(counts(tag), AllocTagCounts::default());
    SWITCH.enable().unwrap();
    assert!(SWITCH.is_inaccurate());
    let while_on: Vec<_> = (0..4).map(|_| alloc.kmalloc_box(32, 8).unwrap()).collect();
    assert_eq!(
        counts(tag),
        AllocTagCounts {
            bytes: 128,
            calls: 4
        }
    );
    for obj in while_off.into_iter().chain([big_while_off]) {
        obj.free().unwrap();
    }
    assert_eq!(
        counts(tag),
        AllocTagCounts {
            bytes: 128,
            calls: 4
        }
    );

    // Turned off again: frees of objects tagged while on still subtract.
    SWITCH.disable().unwrap();
    for obj in while_on {
        obj.free().unwrap();
    }
    assert_eq!(counts(tag), AllocTagCounts::default());

    // A freed object forgets its tag: reallocated (same memory, LIFO
    // magazines) while off, then freed while on, it subtracts nothing.
    SWITCH.enable().unwrap();
    let first = alloc.kmalloc_box(32, 8).unwrap();
    let first_ptr = first.as_ptr();
    first.free().unwrap();
    SWITCH.disable().unwrap();
    let again = alloc.kmalloc_box(32, 8).unwrap();
    assert_eq!(
        again.as_ptr(),
        first_ptr,
        "LIFO magazines hand back the same object"
    );
    SWITCH.enable().unwrap();
    again.free().unwrap();
    assert_eq!(counts(tag), AllocTagCounts::default());

    // never: nothing is charged and the switch cannot be turned on.
    SWITCH.set_at_boot(BootSetting::Never);
    assert!(SWITCH.enable().is_err());
    let ignored = alloc.kmalloc_box(32, 8).unwrap();
    assert_eq!(counts(tag), AllocTagCounts::default());
    ignored.free().unwrap();
    CURRENT.with(|current| current.set(None));
    SWITCH.set_at_boot(BootSetting::On);
}

#[test]
fn audit_and_traced_caches_charge_and_uncharge_too() {
    let (_serial, alloc) = setup();
    let tag = site_audit();
    let audit = alloc
        .cache_create(
            "tag-audit",
            40,
            &CacheArgs {
                align: 8,
                flags: CacheFlags::AUDIT,
                ..CacheArgs::DEFAULT
            },
        )
        .unwrap();
    let traced = alloc
        .cache_create(
            "tag-traced",
            200,
            &CacheArgs {
                align: 8,
                ..CacheArgs::DEFAULT
            },
        )
        .unwrap();
    traced.trace_table().start().unwrap();
    let a = audit.alloc_tagged(Some(tag.tag_ref())).unwrap();
    let t = traced.alloc_tagged(Some(tag.tag_ref())).unwrap();
    assert_eq!(
        counts(tag),
        AllocTagCounts {
            bytes: 240,
            calls: 2
        }
    );
    assert_eq!(traced.trace_table().stats().nr_records, 1);
    // SAFETY: allocated above, freed once; the second free is refused.
    unsafe {
        audit.free(a).unwrap();
        assert!(audit.free(a).is_err(), "AUDIT catches the double free");
        traced.free(t).unwrap();
    }
    assert_eq!(counts(tag), AllocTagCounts::default());
    assert_eq!(traced.trace_table().stats().nr_records, 0);
}

mod side_arrays;

#[cfg(feature = "time-stats")]
#[test]
fn refill_and_depot_exchanges_are_timed() {
    use magpie_codetag::time_stats::TimeStats;
    let (_serial, alloc) = setup();
    let cache = alloc
        .cache_create(
            "timed",
            64,
            &CacheArgs {
                align: 8,
                ..CacheArgs::DEFAULT
            },
        )
        .unwrap();
    let objs: Vec<_> = (0..500).map(|_| cache.alloc_box().unwrap()).collect();
    for obj in objs {
        obj.free().unwrap();
    }
    let objs: Vec<_> = (0..500).map(|_| cache.alloc_box().unwrap()).collect();
    for obj in objs {
        obj.free().unwrap();
    }
    let functions: Vec<(&str, u64)> = TimeStats::all()
        .iter()
        .map(|stats| (stats.tag.function(), stats.snapshot().count))
        .collect();
    for name in ["grow", "exchange_for_full", "exchange_for_empty"] {
        let found = functions.iter().find(|(function, _)| *function == name);
        assert!(
            matches!(found, Some((_, count)) if *count > 0),
            "{name}: {functions:?}"
        );
    }
}

// ------------------------------------------- the allocator's own switch

static COUNTING_CURRENT_CALLS: AtomicUsize = AtomicUsize::new(0);
static COUNTING_ADD_CALLS: AtomicUsize = AtomicUsize::new(0);
static COUNTING_SUB_CALLS: AtomicUsize = AtomicUsize::new(0);
/// The tag [`CountingPlatform`] always names (its own switch always on).
const COUNTING_TAG: AllocTagRef = AllocTagRef::new(7).unwrap();
/// The charge token [`CountingPlatform`] gives for it: what objects store
/// and what their frees must hand back.
const COUNTING_TOKEN: AllocTagRef = AllocTagRef::new(0x7000).unwrap();

/// [`TestPlatform`] whose `alloc_tag_*` hooks only count their calls
/// (used by one test only: no `SERIAL` needed), charging with a token
/// unlike the reference.
struct CountingPlatform;

// SAFETY: the machine half is TestPlatform's (see its SAFETY comment).
unsafe impl Platform for CountingPlatform {
    test_platform_basics!();
}

// SAFETY: the hooks keep PlatformHooks' contract: the KFENCE pool (if any) is
// mapped and the platform's own, and charge tokens are the ones the token hooks
// return.
unsafe impl PlatformHooks for CountingPlatform {
    test_platform_stacks!();
}

// SAFETY: `charge` and `uncharge` accept every token that `token` and
// `current_token` return (the defaults, or as the hooks below say).
unsafe impl AllocTagHooks for CountingPlatform {
    fn current() -> Option<AllocTagRef> {
        COUNTING_CURRENT_CALLS.fetch_add(1, Ordering::Relaxed);
        Some(COUNTING_TAG)
    }

    fn add(_tag: AllocTagRef, _ptr: NonNull<u8>, _bytes: usize) {
        panic!("the allocator charges through AllocTagHooks::charge");
    }

    fn sub(_tag: AllocTagRef, _ptr: NonNull<u8>, _bytes: usize) {
        panic!("the allocator uncharges through AllocTagHooks::uncharge");
    }

    fn token(tag: AllocTagRef) -> Option<AllocTagRef> {
        assert_eq!(tag, COUNTING_TAG);
        Some(COUNTING_TOKEN)
    }

    unsafe fn charge(token: AllocTagRef, _ptr: NonNull<u8>, _bytes: usize) {
        assert_eq!(token, COUNTING_TOKEN, "a token of AllocTagHooks::token");
        COUNTING_ADD_CALLS.fetch_add(1, Ordering::Relaxed);
    }

    unsafe fn uncharge(token: AllocTagRef, _ptr: NonNull<u8>, _bytes: usize) {
        assert_eq!(token, COUNTING_TOKEN, "the token the charge returned");
        COUNTING_SUB_CALLS.fetch_add(1, Ordering::Relaxed);
    }
}

#[test]
fn switched_off_allocator_never_asks_the_platform_for_a_tag() {
    set_cpu(0);
    let calls = || {
        (
            COUNTING_CURRENT_CALLS.load(Ordering::Relaxed),
            COUNTING_ADD_CALLS.load(Ordering::Relaxed),
            COUNTING_SUB_CALLS.load(Ordering::Relaxed),
        )
    };
    let alloc: &'static Kmem<CountingPlatform> = Box::leak(Box::new(Kmem::new()));
    assert!(alloc.profiling().enabled(), "on by default");
    alloc.init(FakeSource::new(4096)).expect("init");
    alloc.profiling().set_enabled(false);
    assert!(!alloc.profiling().enabled());
    // Created while off: inherits off. kmalloc-64 existed before: switched.
    let cache = alloc
        .cache_create(
            "counting-48",
            48,
            &CacheArgs {
                align: 8,
                ..CacheArgs::DEFAULT
            },
        )
        .unwrap();
    let big_cache = alloc
        .cache_create(
            "counting-big",
            1500,
            &CacheArgs {
                align: 8,
                ..CacheArgs::DEFAULT
            },
        )
        .unwrap();
    let before = calls();
    let mut off_small = Vec::new();
    for _ in 0..100 {
        off_small.push((cache, cache.alloc_box().unwrap()));
        off_small.push((cache, cache.alloc_box_tagged(Some(COUNTING_TAG)).unwrap()));
    }
    let off_kmalloc: Vec<_> = (0..100)
        .map(|_| alloc.kmalloc_box(64, 8).unwrap())
        .collect();
    let off_big = big_cache.alloc_box().unwrap();
    let off_large = alloc.kmalloc_box(3 * PAGE_SIZE, 8).unwrap();
    let kmalloc_64 = alloc.stats().kmalloc_cache_for(64, 8).unwrap();
    assert_eq!(calls(), before, "off: no alloc_tag_* call at all");
    for (cache, obj) in &off_small {
        assert_eq!(cache.small_tag_ref(obj.as_ptr()), None);
    }
    for obj in &off_kmalloc {
        assert_eq!(kmalloc_64.small_tag_ref(obj.as_ptr()), None);
    }

    // Switched on: asked on every path, tagged, charged.
    alloc.profiling().set_enabled(true);
    let on_small: Vec<_> = (0..100).map(|_| cache.alloc_box().unwrap()).collect();
    let on_kmalloc = alloc.kmalloc_box(64, 8).unwrap();
    let on_big = big_cache.alloc_box().unwrap();
    let on_large = alloc.kmalloc_box(3 * PAGE_SIZE, 8).unwrap();
    let after_on = calls();
    assert_eq!(after_on.0 - before.0, 103, "asked once per alloc");
    assert_eq!(after_on.1 - before.1, 103, "charged once per alloc");
    // Every object keeps the charge token (small slabs, bufctls and
    // page-granular blocks alike: their frees assert it).
    for obj in &on_small {
        assert_eq!(cache.small_tag_ref(obj.as_ptr()), Some(COUNTING_TOKEN));
    }
    assert_eq!(
        kmalloc_64.small_tag_ref(on_kmalloc.as_ptr()),
        Some(COUNTING_TOKEN)
    );

    // Frees of objects allocated while off uncharge nothing, even with
    // profiling on now; those allocated while on uncharge once each.
    for (_, obj) in off_small {
        obj.free().unwrap();
    }
    for obj in off_kmalloc {
        obj.free().unwrap();
    }
    off_big.free().unwrap();
    off_large.free().unwrap();
    assert_eq!(calls().2, after_on.2, "objects of the off period");
    for obj in on_small {
        obj.free().unwrap();
    }
    on_kmalloc.free().unwrap();
    on_big.free().unwrap();
    on_large.free().unwrap();
    assert_eq!(calls().2 - after_on.2, 103);
}

// ----------------------------------------------- the platform's tag hooks

/// Charges, uncharges and calls of each hook of [`HookPlatform`]; the
/// last object each hook saw.
static HOOK_CHARGES: AtomicUsize = AtomicUsize::new(0);
static HOOK_UNCHARGES: AtomicUsize = AtomicUsize::new(0);
static HOOK_CHARGE_HOOKS: AtomicUsize = AtomicUsize::new(0);
static HOOK_UNCHARGE_HOOKS: AtomicUsize = AtomicUsize::new(0);
static HOOK_LAST_CHARGED: AtomicUsize = AtomicUsize::new(0);
static HOOK_LAST_UNCHARGED: AtomicUsize = AtomicUsize::new(0);
const HOOK_TAG: AllocTagRef = AllocTagRef::new(9).unwrap();

/// [`TestPlatform`] whose charges and hooks only count (one test only:
/// no `SERIAL` needed).
struct HookPlatform;

// SAFETY: the machine half is TestPlatform's (see its SAFETY comment).
unsafe impl Platform for HookPlatform {
    test_platform_basics!();
}

// SAFETY: the hooks keep PlatformHooks' contract: the KFENCE pool (if any) is
// mapped and the platform's own, and charge tokens are the ones the token hooks
// return.
unsafe impl PlatformHooks for HookPlatform {
    test_platform_stacks!();
}

// SAFETY: `charge` and `uncharge` accept every token that `token` and
// `current_token` return (the defaults, or as the hooks below say).
unsafe impl AllocTagHooks for HookPlatform {
    fn current() -> Option<AllocTagRef> {
        Some(HOOK_TAG)
    }

    fn add(tag: AllocTagRef, _ptr: NonNull<u8>, _bytes: usize) {
        assert_eq!(tag, HOOK_TAG);
        HOOK_CHARGES.fetch_add(1, Ordering::Relaxed);
    }

    fn sub(tag: AllocTagRef, _ptr: NonNull<u8>, _bytes: usize) {
        assert_eq!(tag, HOOK_TAG);
        HOOK_UNCHARGES.fetch_add(1, Ordering::Relaxed);
    }

    fn on_charge(token: AllocTagRef, ptr: NonNull<u8>, bytes: usize) {
        assert_eq!(token, HOOK_TAG, "the token just charged");
        assert!(bytes >= 64, "the charge's bytes");
        HOOK_CHARGE_HOOKS.fetch_add(1, Ordering::Relaxed);
        HOOK_LAST_CHARGED.store(ptr.as_ptr() as usize, Ordering::Relaxed);
    }

    fn on_uncharge(token: AllocTagRef, ptr: NonNull<u8>, bytes: usize) {
        assert_eq!(token, HOOK_TAG, "the token the object was charged with");
        assert!(bytes >= 64, "the charge's bytes");
        HOOK_UNCHARGE_HOOKS.fetch_add(1, Ordering::Relaxed);
        HOOK_LAST_UNCHARGED.store(ptr.as_ptr() as usize, Ordering::Relaxed);
    }
}

/// `AllocProfiling::set_tag_hooks`: off (the default), the profiled hits
/// charge and uncharge without calling a hook (the slow paths do call
/// them: a page-granular block); on, every charge and uncharge calls its
/// hook with the object, caches created meanwhile included; off again,
/// the hits call none. Counts stay balanced throughout.
#[test]
fn tag_hooks_run_off_the_hits_and_on_every_charge_while_on() {
    set_cpu(0);
    let count = |counter: &AtomicUsize| counter.load(Ordering::Relaxed);
    let hooks = || (count(&HOOK_CHARGE_HOOKS), count(&HOOK_UNCHARGE_HOOKS));
    let alloc: &'static Kmem<HookPlatform> = Box::leak(Box::new(Kmem::new()));
    alloc.init(FakeSource::new(4096)).expect("init");
    assert!(!alloc.profiling().tag_hooks(), "off by default");
    let cache = alloc
        .cache_create(
            "hooks-64",
            64,
            &CacheArgs {
                align: 8,
                ..CacheArgs::DEFAULT
            },
        )
        .unwrap();
    // Warm this CPU's magazines and the slab's side array (the first
    // alloc misses: a slow path, which may call the hook).
    let warm: Vec<_> = (0..8).map(|_| cache.alloc_box().unwrap()).collect();
    drop(warm);

    let before = hooks();
    let charges = count(&HOOK_CHARGES);
    for _ in 0..100 {
        let obj = cache.alloc_box().unwrap();
        obj.free().unwrap();
    }
    assert_eq!(count(&HOOK_CHARGES) - charges, 100, "every alloc charged");
    assert_eq!(hooks(), before, "hooks off: the hits call no hook");

    // A page-granular block is charged off the hits: its hooks run.
    let large = alloc.kmalloc_box(3 * PAGE_SIZE, 8).unwrap();
    let large_addr = large.as_ptr().as_ptr() as usize;
    assert_eq!(hooks().0, before.0 + 1);
    assert_eq!(count(&HOOK_LAST_CHARGED), large_addr);
    large.free().unwrap();
    assert_eq!(hooks().1, before.1 + 1);
    assert_eq!(count(&HOOK_LAST_UNCHARGED), large_addr);

    alloc.profiling().set_tag_hooks(true);
    assert!(alloc.profiling().tag_hooks());
    let late = alloc
        .cache_create(
            "hooks-late-96",
            96,
            &CacheArgs {
                align: 8,
                ..CacheArgs::DEFAULT
            },
        )
        .unwrap();
    let before = hooks();
    for cache in [cache, late] {
        for _ in 0..100 {
            let obj = cache.alloc_box().unwrap();
            let addr = obj.as_ptr().as_ptr() as usize;
            assert_eq!(
                count(&HOOK_LAST_CHARGED),
                addr,
                "{}: the charge hook saw it",
                cache.name()
            );
            obj.free().unwrap();
            assert_eq!(
                count(&HOOK_LAST_UNCHARGED),
                addr,
                "{}: the uncharge hook saw it",
                cache.name()
            );
        }
    }
    let kmalloc = alloc.kmalloc_box(64, 8).unwrap();
    kmalloc.free().unwrap();
    assert_eq!(
        hooks(),
        (before.0 + 201, before.1 + 201),
        "hooks on: one call per charge and uncharge"
    );

    alloc.profiling().set_tag_hooks(false);
    assert!(!alloc.profiling().tag_hooks());
    let before = hooks();
    for cache in [cache, late] {
        for _ in 0..100 {
            cache.alloc_box().unwrap().free().unwrap();
        }
    }
    assert_eq!(hooks(), before, "off again: the hits call no hook");
    assert_eq!(
        count(&HOOK_CHARGES),
        count(&HOOK_UNCHARGES),
        "every charge uncharged"
    );
}
