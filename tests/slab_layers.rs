//! The magazine, depot and slab layers of `magpie-slab` as the real kernel
//! sees them, observed through `KmemCache::stats()`, `KPAGES` and kmalloc.
//!
//! Every figure that depends on a tunable (magazine size, objects per slab,
//! pages per slab, object size of a kmalloc class) is read from the API, not
//! hard-coded. The test kernel runs on one CPU, so "the per-CPU magazines"
//! are CPU 0's.

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
use alloc::string::String;
use alloc::vec::Vec;
use core::ptr::NonNull;
use core::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use magpie_slab::CacheArgs;

use magpie::kmem::{KPAGES, KernelPlatform, SLAB};
use magpie_slab::reports::{ErrorKind, ErrorReport};
use magpie_slab::{
    AllocError, CacheFlags, CacheStats, Constructed, DestroyError, FreeError, KmemCache,
    ObjectInit, ObjectRef, PAGE_SIZE, SlabKind,
};

type Cache = KmemCache<KernelPlatform>;

magpie::test_kernel!();

// ---------------------------------------------------------------------------
// Helpers

/// Written by the constructors at this offset (not offset 0, where small
/// slabs thread their free list through free objects).
const MAGIC_OFFSET: usize = 8;
const CONSTRUCTED: u64 = 0xC0FF_EE00_C0FF_EE00;
const DESTRUCTED: u64 = 0xDEAD_BEEF_DEAD_BEEF;

#[expect(
    clippy::cast_ptr_alignment,
    reason = "object starts are 8-aligned and MAGIC_OFFSET is a multiple of 8"
)]
fn read_magic(obj: NonNull<u8>) -> u64 {
    // SAFETY: every object of the caches using this is at least 16 bytes
    // and 8-aligned; the caller owns it (or the allocator does not touch
    // bytes 8..16 of a magazine round).
    unsafe { obj.as_ptr().add(MAGIC_OFFSET).cast::<u64>().read() }
}

#[expect(
    clippy::cast_ptr_alignment,
    reason = "object starts are 8-aligned and MAGIC_OFFSET is a multiple of 8"
)]
fn write_magic(obj: NonNull<u8>, value: u64) {
    // SAFETY: as for read_magic; the constructor/destructor owns the object.
    unsafe { obj.as_ptr().add(MAGIC_OFFSET).cast::<u64>().write(value) }
}

fn kmalloc_cache(name: &str) -> &'static Cache {
    SLAB.find_cache(name)
        .unwrap_or_else(|| panic!("no cache named {name}"))
}

fn free(cache: &Cache, obj: NonNull<u8>) {
    // SAFETY: the tests only pass objects they allocated from `cache` and
    // give up.
    unsafe { cache.free(obj) }.expect("free of an allocated object");
}

/// Destroys a cache the test created (through the kernel's warning wrapper).
fn destroy(cache: &'static Cache) -> magpie_slab::DestroyReport {
    // SAFETY: each test destroys only its own cache, after its last use.
    unsafe { magpie::kmem::cache_destroy(cache) }.expect("destroy of an idle cache")
}

fn stack_address() -> NonNull<u8> {
    let local = core::hint::black_box(0u64);
    NonNull::from(&local).cast()
}

fn offset(obj: NonNull<u8>, bytes: usize) -> NonNull<u8> {
    NonNull::new(obj.as_ptr().wrapping_add(bytes)).unwrap()
}

// ---------------------------------------------------------------------------
// Magazine layer: one object

static OBJ_NR_CTOR: AtomicUsize = AtomicUsize::new(0);
static OBJ_NR_DTOR: AtomicUsize = AtomicUsize::new(0);

/// The constructed state: the magic word, zeroes around it.
fn constructed(index: usize) -> u64 {
    if index == MAGIC_OFFSET / 8 {
        CONSTRUCTED
    } else {
        0
    }
}

fn obj_ctor(obj: ObjectInit<'_>) -> Result<Constructed<'_>, ()> {
    assert_eq!(obj.len(), 100, "the constructor is told the object size");
    assert_ne!(
        read_magic(obj.as_ptr()),
        CONSTRUCTED,
        "constructing a constructed object"
    );
    OBJ_NR_CTOR.fetch_add(1, Ordering::Relaxed);
    Ok(obj.write_words(constructed))
}

fn obj_dtor(obj: ObjectRef<'_>) {
    assert_eq!(obj.len(), 100);
    assert_eq!(
        read_magic(obj.as_ptr()),
        CONSTRUCTED,
        "destructing an unconstructed object"
    );
    write_magic(obj.as_ptr(), DESTRUCTED);
    OBJ_NR_DTOR.fetch_add(1, Ordering::Relaxed);
}

fn create_obj_cache(name: &str) -> &'static Cache {
    OBJ_NR_CTOR.store(0, Ordering::Relaxed);
    OBJ_NR_DTOR.store(0, Ordering::Relaxed);
    SLAB.cache_create(
        name,
        100,
        &CacheArgs {
            align: 8,
            ctor: Some(obj_ctor),
            dtor: Some(obj_dtor),
            ..CacheArgs::DEFAULT
        },
    )
    .expect("cache_create")
}

#[test_case]
fn free_object_rests_constructed_in_a_magazine() {
    let cache = create_obj_cache("test-obj");
    let empty = cache.stats();
    assert_eq!(empty.obj_size, 100);
    assert!(empty.align >= 8);
    assert_eq!(empty.kind, SlabKind::Small);
    assert_eq!(
        (empty.nr_allocated, empty.nr_slabs, empty.nr_cpu_cached_objs),
        (0, 0, 0)
    );
    assert!(empty.magsize > 0, "{empty:?}");

    let obj = cache.alloc().expect("alloc");
    assert_eq!(obj.as_ptr() as usize % 8, 0);
    assert_eq!(read_magic(obj), CONSTRUCTED);
    let one = cache.stats();
    assert_eq!(one.nr_allocated, 1, "{one:?}");
    assert_eq!(one.nr_slabs, 1, "{one:?}");
    assert_eq!(one.nr_active_slabs, 1, "{one:?}");
    assert_eq!(one.nr_total_objs, one.objs_per_slab);
    assert_eq!(one.nr_allocs_ever, 1);
    assert_eq!(
        OBJ_NR_CTOR.load(Ordering::Relaxed),
        1,
        "only the object handed out is constructed"
    );

    free(cache, obj);
    let freed = cache.stats();
    assert_eq!(freed.nr_allocated, 0, "{freed:?}");
    assert!(
        freed.nr_cpu_cached_objs >= 1,
        "the object rests in a per-CPU magazine: {freed:?}"
    );
    assert_eq!(
        freed.nr_slabs, one.nr_slabs,
        "the slab layer did not see the free"
    );
    assert_eq!(
        freed.nr_active_slabs, 1,
        "the object is still out of its slab"
    );
    assert_eq!(freed.nr_frees_ever, 1);
    assert_eq!(
        OBJ_NR_DTOR.load(Ordering::Relaxed),
        0,
        "magazine rounds stay constructed"
    );
    assert_eq!(read_magic(obj), CONSTRUCTED);

    let again = cache.alloc().expect("alloc from the magazine");
    assert_eq!(again, obj, "LIFO: the round just freed comes back first");
    assert_eq!(
        OBJ_NR_CTOR.load(Ordering::Relaxed),
        1,
        "a magazine hit runs no constructor"
    );
    let hit = cache.stats();
    assert_eq!(hit.nr_allocated, 1);
    assert_eq!(hit.nr_cpu_cached_objs, freed.nr_cpu_cached_objs - 1);
    assert_eq!(hit.nr_allocs_ever, 2);

    free(cache, again);
    assert_eq!(
        cache.reap(),
        one.nr_pages_per_slab,
        "the one slab goes back"
    );
    assert_eq!(
        OBJ_NR_DTOR.load(Ordering::Relaxed),
        1,
        "reap destructs the round"
    );
    assert_eq!(cache.stats().nr_slabs, 0);
    assert_eq!(destroy(cache).nr_trace_records_dropped, 0);
}

// ---------------------------------------------------------------------------
// Depot and reap

#[test_case]
fn full_magazines_go_to_the_depot_and_reap_returns_pages() {
    SLAB.reap_all();
    let pages_at_start = KPAGES.nr_pages_out();
    let cache = create_obj_cache("test-depot");
    let magsize = cache.stats().magsize;
    assert!(magsize >= 1);
    // Past loaded + prev: at least one magazine must go to the depot.
    let nr_objs = 3 * magsize + 1;
    let mut objs: Vec<NonNull<u8>> = Vec::with_capacity(nr_objs);
    for _ in 0..nr_objs {
        objs.push(cache.alloc().expect("alloc"));
    }
    let busy = cache.stats();
    assert_eq!(busy.nr_allocated, nr_objs);
    assert_eq!(OBJ_NR_CTOR.load(Ordering::Relaxed), nr_objs);
    assert!(
        busy.nr_slabs >= nr_objs.div_ceil(busy.objs_per_slab),
        "{busy:?}"
    );
    let mut sorted = objs.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(sorted.len(), nr_objs, "distinct objects");

    for &obj in &objs {
        free(cache, obj);
    }
    let cached = cache.stats();
    assert_eq!(cached.nr_allocated, 0, "{cached:?}");
    assert!(
        cached.depot_nr_full >= 1,
        "full magazines went to the depot: {cached:?}"
    );
    assert!(cached.nr_depot_objs > 0, "{cached:?}");
    assert!(
        cached.nr_cpu_cached_objs <= 2 * cached.magsize,
        "loaded + prev at most: {cached:?}"
    );
    assert_eq!(
        cached.nr_cpu_cached_objs + cached.nr_depot_objs,
        nr_objs,
        "every freed object is a round somewhere: {cached:?}"
    );
    assert_eq!(
        cached.nr_slabs, busy.nr_slabs,
        "nothing went back to the slabs: {cached:?}"
    );
    assert_eq!(
        OBJ_NR_DTOR.load(Ordering::Relaxed),
        0,
        "rounds stay constructed"
    );

    let slab_pages = cached.total_bytes / PAGE_SIZE;
    assert_eq!(slab_pages, cached.nr_slabs * cached.nr_pages_per_slab);
    let pages_before_reap = KPAGES.nr_pages_out();
    let nr_reaped = cache.reap();
    let reaped = cache.stats();
    assert_eq!(nr_reaped, slab_pages, "reap returned every slab page");
    // The reaped pages wait in the quarantine (docs/HARDENING.md): out
    // of it, they are kpages' again.
    magpie::kmem::KPAGES_QUARANTINED.flush();
    assert_eq!(
        OBJ_NR_DTOR.load(Ordering::Relaxed),
        nr_objs,
        "each round destructed once"
    );
    assert_eq!(
        OBJ_NR_DTOR.load(Ordering::Relaxed),
        OBJ_NR_CTOR.load(Ordering::Relaxed)
    );
    assert_eq!(reaped.nr_slabs, 0, "{reaped:?}");
    assert_eq!(reaped.total_bytes, 0, "{reaped:?}");
    assert_eq!(reaped.nr_cpu_cached_objs, 0, "{reaped:?}");
    assert_eq!(reaped.nr_depot_objs, 0, "{reaped:?}");
    assert_eq!(
        (reaped.depot_nr_full, reaped.depot_nr_empty),
        (0, 0),
        "{reaped:?}"
    );
    assert!(
        KPAGES.nr_pages_out() + slab_pages <= pages_before_reap,
        "kpages got the slab pages back: {} -> {} ({} slab pages)",
        pages_before_reap,
        KPAGES.nr_pages_out(),
        slab_pages
    );
    for &obj in &objs {
        assert!(
            !SLAB.owns(obj.as_ptr()),
            "reaped page still mapped to a slab"
        );
    }

    // The cache still works after a reap.
    let obj = cache.alloc().expect("alloc after reap");
    assert_eq!(read_magic(obj), CONSTRUCTED);
    free(cache, obj);

    destroy(cache);
    drop(sorted);
    drop(objs);
    // Metadata (magazines, the cache struct, per-CPU array) went back to the
    // bootstrap caches; reaping everything returns their pages too.
    SLAB.reap_all();
    assert!(
        KPAGES.nr_pages_out() <= pages_at_start,
        "kpages: {} pages out at the start, {} after destroy and reap_all",
        pages_at_start,
        KPAGES.nr_pages_out()
    );
}

// ---------------------------------------------------------------------------
// Constructor failure

static CTOR_FAILS: AtomicBool = AtomicBool::new(false);
static FAILING_NR_CTOR_CALLS: AtomicUsize = AtomicUsize::new(0);
static FAILING_NR_DTOR: AtomicUsize = AtomicUsize::new(0);

fn failing_ctor(obj: ObjectInit<'_>) -> Result<Constructed<'_>, ()> {
    FAILING_NR_CTOR_CALLS.fetch_add(1, Ordering::Relaxed);
    if CTOR_FAILS.load(Ordering::Relaxed) {
        return Err(());
    }
    Ok(obj.write_words(constructed))
}

fn failing_dtor(obj: ObjectRef<'_>) {
    assert_eq!(
        read_magic(obj.as_ptr()),
        CONSTRUCTED,
        "destructor of an object whose constructor failed"
    );
    write_magic(obj.as_ptr(), DESTRUCTED);
    FAILING_NR_DTOR.fetch_add(1, Ordering::Relaxed);
}

#[test_case]
fn constructor_failure_fails_the_alloc_and_leaks_nothing() {
    let cache = SLAB
        .cache_create(
            "test-ctorfail",
            64,
            &CacheArgs {
                ctor: Some(failing_ctor),
                dtor: Some(failing_dtor),
                ..CacheArgs::DEFAULT
            },
        )
        .expect("cache_create");
    CTOR_FAILS.store(true, Ordering::Relaxed);
    let before = cache.stats();
    assert_eq!(cache.alloc(), Err(AllocError::ConstructorFailed));
    assert_eq!(FAILING_NR_CTOR_CALLS.load(Ordering::Relaxed), 1);
    let after = cache.stats();
    assert_eq!(after.nr_allocated, before.nr_allocated, "{after:?}");
    assert_eq!(after.nr_allocs_ever, before.nr_allocs_ever, "{after:?}");
    assert_eq!(
        after.nr_active_slabs, 0,
        "the object went back to its slab: {after:?}"
    );
    assert_eq!(
        FAILING_NR_DTOR.load(Ordering::Relaxed),
        0,
        "no destructor without a constructor"
    );

    CTOR_FAILS.store(false, Ordering::Relaxed);
    let obj = cache.alloc().expect("alloc once the constructor works");
    assert_eq!(cache.stats().nr_allocated, 1);
    free(cache, obj);

    // A magazine hit needs no constructor: it succeeds even now...
    CTOR_FAILS.store(true, Ordering::Relaxed);
    let calls = FAILING_NR_CTOR_CALLS.load(Ordering::Relaxed);
    let hit = cache
        .alloc()
        .expect("magazine hit with a failing constructor");
    assert_eq!(hit, obj);
    assert_eq!(FAILING_NR_CTOR_CALLS.load(Ordering::Relaxed), calls);
    // ...but the next object must come from the slab layer and fails.
    assert_eq!(cache.alloc(), Err(AllocError::ConstructorFailed));
    assert_eq!(cache.stats().nr_allocated, 1);
    CTOR_FAILS.store(false, Ordering::Relaxed);

    free(cache, hit);
    cache.reap();
    assert_eq!(
        FAILING_NR_DTOR.load(Ordering::Relaxed),
        1,
        "only the constructed object is destructed"
    );
    let reaped = cache.stats();
    assert_eq!((reaped.nr_allocated, reaped.nr_slabs), (0, 0), "{reaped:?}");
    destroy(cache);
}

// ---------------------------------------------------------------------------
// Bad frees

/// Checks that `free` of `bad` into `cache` fails with `expected`, and that
/// neither the cache's nor `other`'s statistics moved.
fn assert_bad_free(cache: &Cache, bad: NonNull<u8>, expected: FreeError, other: &Cache) {
    let before: CacheStats = cache.stats();
    let other_before = other.stats();
    // SAFETY: `bad` is not an object the caller holds; the allocator must
    // detect it and change nothing.
    let result = unsafe { cache.free(bad) };
    assert_eq!(
        result,
        Err(expected),
        "free of {:#x} to {}",
        bad.as_ptr() as usize,
        cache.name()
    );
    assert_eq!(
        cache.stats(),
        before,
        "a refused free changed {}",
        cache.name()
    );
    assert_eq!(
        other.stats(),
        other_before,
        "a refused free changed {}",
        other.name()
    );
}

/// The owning cache the latest error report names (a free to the wrong
/// cache: the error carries only the address).
fn last_report_owner() -> Option<String> {
    let after = SLAB.debug().nr_errors().saturating_sub(1);
    let mut out = [ErrorReport::new(ErrorKind::InvalidFree, "", 0)];
    assert_eq!(SLAB.debug().read_errors(after, &mut out), 1, "a report");
    assert_eq!(out[0].kind, ErrorKind::WrongCache);
    out[0].owner.map(|name| String::from(name.as_str()))
}

fn check_bad_frees(cache: &'static Cache, other: &'static Cache) {
    let a = cache.alloc().expect("alloc a");
    let b = cache.alloc().expect("alloc b");
    let (a_addr, b_addr) = (a.as_ptr() as usize, b.as_ptr() as usize);
    assert_ne!(a, b);

    // Double free, with the object resting in a magazine.
    free(cache, a);
    assert_bad_free(cache, a, FreeError::DoubleFree { addr: a_addr }, other);

    // Inside a slab, not at an object start.
    let inside = offset(b, 8);
    assert_bad_free(
        cache,
        inside,
        FreeError::Misaligned { addr: b_addr + 8 },
        other,
    );

    // Never returned by the allocator at all.
    let stack = stack_address();
    let stack_addr = stack.as_ptr() as usize;
    assert_bad_free(
        cache,
        stack,
        FreeError::NotAllocated { addr: stack_addr },
        other,
    );

    // An object of another cache.
    let foreign = other.alloc().expect("alloc from the other cache");
    assert_bad_free(
        cache,
        foreign,
        FreeError::WrongCache {
            addr: foreign.as_ptr() as usize,
        },
        other,
    );
    assert_eq!(last_report_owner().as_deref(), Some(other.name()));
    // A kmalloc object, and a page-granular kmalloc.
    let small = SLAB.kmalloc(8, 1).expect("kmalloc(8)");
    let owner = SLAB
        .stats()
        .kmalloc_cache_for(8, 1)
        .expect("a class for 8 bytes")
        .name();
    assert_bad_free(
        cache,
        small,
        FreeError::WrongCache {
            addr: small.as_ptr() as usize,
        },
        other,
    );
    assert_eq!(last_report_owner().as_deref(), Some(owner));
    let large = SLAB
        .kmalloc(4 * PAGE_SIZE, 1)
        .expect("page-granular kmalloc");
    assert_bad_free(
        cache,
        large,
        FreeError::WrongCache {
            addr: large.as_ptr() as usize,
        },
        other,
    );
    assert_eq!(last_report_owner(), None);
    // SAFETY: allocated just above and given up.
    unsafe {
        SLAB.kfree(small).expect("kfree small");
        SLAB.kfree(large).expect("kfree large");
    }
    free(other, foreign);

    // Double free after the object went back to the slab layer (reap).
    cache.reap();
    // SAFETY: `a` was freed and reaped; the allocator must refuse it.
    let late = unsafe { cache.free(a) };
    if cache.kind() == SlabKind::Small {
        assert_eq!(
            late,
            Err(FreeError::DoubleFree { addr: a_addr }),
            "AUDIT bitmap"
        );
    } else {
        // FreeError::DoubleFree is documented for an object "sitting in a
        // magazine or its slab", but a bufctl cache finds no bufctl in its
        // hash for an object back in its slab and says NotAllocated.
        assert!(
            matches!(
                late,
                Err(FreeError::DoubleFree { .. } | FreeError::NotAllocated { .. })
            ),
            "free of a reaped object: {late:?}"
        );
    }

    // Still usable, and the books balance.
    let stats = cache.stats();
    assert_eq!(stats.nr_allocated, 1, "{stats:?}");
    let c = cache.alloc().expect("alloc after bad frees");
    free(cache, c);
    free(cache, b);
    let end = cache.stats();
    assert_eq!(end.nr_allocated, 0, "{end:?}");
    assert_eq!(end.nr_allocs_ever, end.nr_frees_ever, "{end:?}");
}

/// Bufctl caches detect double frees with `AUDIT` (like small ones: the
/// plain hit keeps no per-object state).
#[test_case]
fn bufctl_cache_detects_bad_frees() {
    let big = SLAB
        .cache_create(
            "test-big",
            9000,
            &CacheArgs {
                flags: CacheFlags::AUDIT,
                ..CacheArgs::DEFAULT
            },
        )
        .expect("cache_create big");
    let notouch = SLAB
        .cache_create(
            "test-notouch",
            64,
            &CacheArgs {
                flags: CacheFlags::NOTOUCH | CacheFlags::AUDIT,
                ..CacheArgs::DEFAULT
            },
        )
        .expect("cache_create notouch");
    assert_eq!(
        big.kind(),
        SlabKind::Bufctl,
        "9000-byte objects use bufctl slabs"
    );
    assert_eq!(
        notouch.kind(),
        SlabKind::Bufctl,
        "NOTOUCH caches use bufctl slabs"
    );
    check_bad_frees(big, notouch);
    check_bad_frees(notouch, big);
    destroy(notouch);
    destroy(big);
}

#[test_case]
fn audit_small_cache_detects_double_free() {
    let audit = SLAB
        .cache_create(
            "test-audit",
            48,
            &CacheArgs {
                flags: CacheFlags::AUDIT,
                ..CacheArgs::DEFAULT
            },
        )
        .expect("cache_create audit");
    let plain = SLAB
        .cache_create("test-plain", 48, &CacheArgs::DEFAULT)
        .expect("cache_create plain");
    assert_eq!(audit.kind(), SlabKind::Small);
    check_bad_frees(audit, plain);
    destroy(plain);
    destroy(audit);
}

// ---------------------------------------------------------------------------
// kmalloc

/// nr_allocated of every kmalloc cache, gathered without allocating.
fn kmalloc_counts(out: &mut Vec<(&'static str, usize, usize)>) {
    out.clear();
    SLAB.for_each_cache(|cache| {
        if cache.name().starts_with("kmalloc-") && out.len() < out.capacity() {
            out.push((cache.name(), cache.obj_size(), cache.stats().nr_allocated));
        }
    });
}

#[test_case]
fn kmalloc_picks_the_smallest_size_class() {
    let k64 = kmalloc_cache("kmalloc-64");
    let before = k64.stats();
    let p = SLAB.kmalloc(64, 1).expect("kmalloc(64)");
    let after = k64.stats();
    assert_eq!(after.nr_allocated, before.nr_allocated + 1);
    assert_eq!(after.nr_allocs_ever, before.nr_allocs_ever + 1);
    assert_eq!(SLAB.ksize(p), Ok(k64.obj_size()));
    // SAFETY: allocated above.
    unsafe { SLAB.kfree(p) }.expect("kfree");
    assert_eq!(k64.stats().nr_allocated, before.nr_allocated);

    let k72 = kmalloc_cache("kmalloc-72");
    let before = k72.stats();
    let q = SLAB.kmalloc(65, 1).expect("kmalloc(65)");
    assert_eq!(
        k72.stats().nr_allocated,
        before.nr_allocated + 1,
        "65 bytes come from kmalloc-72"
    );
    assert_eq!(SLAB.ksize(q), Ok(72));
    // SAFETY: allocated above.
    unsafe { SLAB.kfree(q) }.expect("kfree");
    assert_eq!(k72.stats().nr_allocated, before.nr_allocated);

    // Every size: exactly one kmalloc cache gains the object, and it is the
    // smallest one that fits.
    // Room for every kmalloc cache (152 classes, and the random and data
    // copies born so far): `kmalloc_counts` stops at the capacity.
    let mut before = Vec::with_capacity(1024);
    let mut after = Vec::with_capacity(1024);
    kmalloc_counts(&mut before);
    assert!(before.len() >= 13, "kmalloc caches: {before:?}");
    let max_class = before.iter().map(|&(_, size, _)| size).max().unwrap();
    assert!(max_class >= 8192, "kmalloc classes reach at least 8 KiB");
    for size in [
        1, 7, 8, 9, 16, 17, 33, 63, 64, 65, 96, 97, 128, 129, 192, 193, 256, 257, 511, 513, 1000,
        2048, 4095, 4097, 8000, 8192,
    ] {
        kmalloc_counts(&mut before);
        let p = SLAB.kmalloc(size, 1).expect("kmalloc");
        kmalloc_counts(&mut after);
        let grown: Vec<_> = before
            .iter()
            .zip(after.iter())
            .filter(|(b, a)| a.2 != b.2)
            .map(|(b, a)| (a.0, a.1, a.2 as isize - b.2 as isize))
            .collect();
        assert_eq!(grown.len(), 1, "kmalloc({size}) changed {grown:?}");
        let (name, obj_size, delta) = grown[0];
        assert_eq!(delta, 1, "kmalloc({size}) from {name}");
        assert!(obj_size >= size, "kmalloc({size}) from {name}");
        let smallest = before
            .iter()
            .map(|&(_, s, _)| s)
            .filter(|&s| s >= size)
            .min()
            .unwrap();
        assert_eq!(
            obj_size, smallest,
            "kmalloc({size}) from {name}, not the smallest class"
        );
        assert_eq!(SLAB.ksize(p), Ok(obj_size));
        // SAFETY: allocated above.
        unsafe { SLAB.kfree(p) }.expect("kfree");
    }
}

#[test_case]
fn kmalloc_honours_alignment() {
    let mut align = 1;
    while align <= PAGE_SIZE {
        for size in [1, 24, 100, 700, 3000, PAGE_SIZE, 10_000] {
            let p = SLAB
                .kmalloc(size, align)
                .unwrap_or_else(|e| panic!("kmalloc({size}, {align}): {e}"));
            assert_eq!(
                p.as_ptr() as usize % align,
                0,
                "kmalloc({size}, {align}) = {p:p}"
            );
            let usable = SLAB.ksize(p).expect("ksize");
            assert!(usable >= size, "kmalloc({size}, {align}): ksize {usable}");
            // SAFETY: `usable` bytes are ours.
            unsafe { core::ptr::write_bytes(p.as_ptr(), 0x5a, usable) };
            // SAFETY: allocated above.
            unsafe { SLAB.kfree(p) }.expect("kfree");
        }
        align *= 2;
    }
    // Above a page: page-granular, aligned (slack pages around it).
    let p = SLAB
        .kmalloc(16, 2 * PAGE_SIZE)
        .expect("kmalloc aligned 8 KiB");
    assert_eq!(p.as_ptr() as usize % (2 * PAGE_SIZE), 0);
    // SAFETY: allocated above.
    unsafe { SLAB.kfree(p) }.expect("kfree");
    assert_eq!(SLAB.kmalloc(16, 2 << 30), Err(AllocError::InvalidLayout));
    assert_eq!(SLAB.kmalloc(16, 3), Err(AllocError::InvalidLayout));
    assert_eq!(SLAB.kmalloc(0, 8), Err(AllocError::InvalidLayout));
}

/// kpages' pages out, less those waiting in the quarantine (freed, not
/// yet given back: docs/HARDENING.md).
fn kpages_in_use() -> usize {
    KPAGES.nr_pages_out() - magpie::kmem::KPAGES_QUARANTINED.nr_pages_held()
}

#[test_case]
fn kmalloc_above_the_classes_is_page_granular() {
    for size in [8193, 3 * PAGE_SIZE, 100_000, 1 << 20] {
        let nr_pages = size.div_ceil(PAGE_SIZE);
        let large = SLAB.stats().large();
        let kpages = kpages_in_use();
        let p = SLAB.kmalloc(size, 1).expect("page-granular kmalloc");
        assert_eq!(p.as_ptr() as usize % PAGE_SIZE, 0);
        let now = SLAB.stats().large();
        assert_eq!(now.nr_live, large.nr_live + 1);
        assert_eq!(now.live_bytes, large.live_bytes + nr_pages * PAGE_SIZE);
        assert_eq!(now.nr_allocs_ever, large.nr_allocs_ever + 1);
        assert_eq!(kpages_in_use(), kpages + nr_pages);
        assert_eq!(SLAB.ksize(p), Ok(nr_pages * PAGE_SIZE));
        assert!(SLAB.owns(p.as_ptr()));
        // SAFETY: the whole pages are ours.
        unsafe { core::ptr::write_bytes(p.as_ptr(), 0xa5, nr_pages * PAGE_SIZE) };
        // Inside, not at the start: refused.
        let tail = offset(p, PAGE_SIZE);
        assert_eq!(
            SLAB.ksize(tail),
            Err(FreeError::Misaligned {
                addr: tail.as_ptr() as usize
            })
        );
        assert_eq!(
            // SAFETY: the allocator must refuse pointers into the allocation.
            unsafe { SLAB.kfree(tail) },
            Err(FreeError::Misaligned {
                addr: tail.as_ptr() as usize
            })
        );
        let inside = offset(p, 8);
        assert_eq!(
            // SAFETY: as above.
            unsafe { SLAB.kfree(inside) },
            Err(FreeError::Misaligned {
                addr: inside.as_ptr() as usize
            })
        );
        assert_eq!(SLAB.stats().large(), now, "refused frees changed nothing");
        // SAFETY: allocated above.
        unsafe { SLAB.kfree(p) }.expect("kfree");
        assert_eq!(SLAB.stats().large().nr_live, large.nr_live);
        assert_eq!(SLAB.stats().large().live_bytes, large.live_bytes);
        assert_eq!(kpages_in_use(), kpages);
        assert!(
            // SAFETY: freed already: must be refused.
            unsafe { SLAB.kfree(p) }.is_err(),
            "double kfree of a page-granular allocation"
        );
        assert!(!SLAB.owns(p.as_ptr()));
    }
}

#[test_case]
fn kfree_of_bogus_pointers_changes_nothing() {
    let k64 = kmalloc_cache("kmalloc-64");
    let p = SLAB.kmalloc(64, 1).expect("kmalloc(64)");
    let before = k64.stats();
    let large = SLAB.stats().large();
    let bad_frees = SLAB.debug().nr_bad_frees();
    let stack = stack_address();
    // SAFETY: none of these is an allocated object; each must be refused.
    unsafe {
        assert_eq!(
            SLAB.kfree(stack),
            Err(FreeError::NotAllocated {
                addr: stack.as_ptr() as usize
            })
        );
        let inside = offset(p, 8);
        assert_eq!(
            SLAB.kfree(inside),
            Err(FreeError::Misaligned {
                addr: inside.as_ptr() as usize
            })
        );
        let code = NonNull::new(stack_address as *const () as *mut u8).unwrap();
        assert!(SLAB.kfree(code).is_err());
        assert_eq!(
            SLAB.ksize(stack),
            Err(FreeError::NotAllocated {
                addr: stack.as_ptr() as usize
            })
        );
    }
    assert_eq!(k64.stats(), before);
    assert_eq!(SLAB.stats().large(), large);
    assert_eq!(
        SLAB.debug().nr_bad_frees(),
        bad_frees,
        "direct kfree errors are returned, not counted"
    );
    // SAFETY: allocated above.
    unsafe { SLAB.kfree(p) }.expect("kfree");
}

#[test_case]
fn bad_free_through_the_global_allocator_is_reported_and_ignored() {
    let k64 = kmalloc_cache("kmalloc-64");
    let boxed = Box::new([3u8; 64]);
    let inside = (&raw const *boxed).cast::<u8>().cast_mut().wrapping_add(16);
    let before = k64.stats();
    let nr_bad_frees = SLAB.debug().nr_bad_frees();
    let layout = core::alloc::Layout::new::<[u8; 48]>();
    // SAFETY: deliberately bad pointers; the allocator must refuse them at
    // the GlobalAlloc edge (count, report through the hook, change nothing).
    unsafe {
        alloc::alloc::dealloc(inside, layout);
        alloc::alloc::dealloc(stack_address().as_ptr(), layout);
    }
    assert_eq!(SLAB.debug().nr_bad_frees(), nr_bad_frees + 2);
    assert_eq!(k64.stats(), before);
    assert_eq!(*boxed, [3u8; 64]);
    drop(boxed);
    assert_eq!(k64.stats().nr_allocated, before.nr_allocated - 1);
}

#[test_case]
fn kfree_finds_the_owner_of_a_cache_object() {
    let cache = SLAB
        .cache_create("test-kfree", 200, &CacheArgs::DEFAULT)
        .expect("cache_create");
    let obj = cache.alloc().expect("alloc");
    assert_eq!(SLAB.ksize(obj), Ok(200));
    assert_eq!(cache.stats().nr_allocated, 1);
    // SAFETY: allocated above, given up.
    unsafe { SLAB.kfree(obj) }.expect("kfree of a cache object");
    assert_eq!(cache.stats().nr_allocated, 0);
    destroy(cache);
}

// ---------------------------------------------------------------------------
// Destroy

#[test_case]
fn destroy_refuses_busy_and_permanent_caches() {
    let cache = SLAB
        .cache_create("test-destroy", 40, &CacheArgs::DEFAULT)
        .expect("cache_create");
    let a = cache.alloc().expect("alloc");
    let b = cache.alloc().expect("alloc");
    assert_eq!(
        // SAFETY: refused (Busy); the cache stays intact and usable.
        unsafe { cache.destroy() },
        Err(DestroyError::Busy { nr_allocated: 2 })
    );
    assert!(
        SLAB.find_cache("test-destroy").is_some(),
        "a busy cache stays listed"
    );
    free(cache, a);
    assert_eq!(
        // SAFETY: as above.
        unsafe { cache.destroy() },
        Err(DestroyError::Busy { nr_allocated: 1 })
    );
    let c = cache.alloc().expect("a busy cache is still usable");
    free(cache, c);
    free(cache, b);
    let report = destroy(cache);
    assert_eq!(report.nr_trace_records_dropped, 0);
    assert!(
        SLAB.find_cache("test-destroy").is_none(),
        "destroyed cache is unlisted"
    );

    for name in ["kmalloc-64", "kmem_cache", "kmem_magazine_60"] {
        let permanent = kmalloc_cache(name);
        assert_eq!(
            // SAFETY: refused (Permanent); nothing changes.
            unsafe { permanent.destroy() },
            Err(DestroyError::Permanent),
            "{name}"
        );
    }
}

#[test_case]
fn destroy_with_traced_objects() {
    let cache = SLAB
        .cache_create("test-destroy-tr", 40, &CacheArgs::DEFAULT)
        .expect("cache_create");
    cache.trace_table().start().expect("trace_start");
    let a = cache.alloc().expect("alloc");
    let b = cache.alloc().expect("alloc");
    assert_eq!(cache.trace_table().stats().nr_records, 2);
    assert_eq!(
        // SAFETY: refused (Busy): the traced objects and their records stay.
        unsafe { cache.destroy() },
        Err(DestroyError::Busy { nr_allocated: 2 })
    );
    assert_eq!(
        cache.trace_table().stats().nr_records,
        2,
        "a refused destroy keeps the records"
    );
    cache.trace_table().stop();
    free(cache, a);
    free(cache, b);
    assert_eq!(
        cache.trace_table().stats().nr_records,
        0,
        "frees after stop remove records"
    );
    // Every free removes its record, and destroy refuses a cache with
    // objects out, so no record can be left when destroy succeeds.
    assert_eq!(destroy(cache).nr_trace_records_dropped, 0);
}

// ---------------------------------------------------------------------------
// The global allocator

#[test_case]
fn box_vec_and_string_land_in_kmalloc_caches() {
    let k64 = kmalloc_cache("kmalloc-64");
    let before = k64.stats();
    let boxed = Box::new([7u8; 64]);
    let during = k64.stats();
    assert_eq!(
        during.nr_allocs_ever,
        before.nr_allocs_ever + 1,
        "Box<[u8; 64]> from kmalloc-64"
    );
    assert_eq!(during.nr_allocated, before.nr_allocated + 1);
    let addr = (&raw const *boxed).cast::<u8>();
    assert!(SLAB.owns(addr));
    assert_eq!(SLAB.ksize(NonNull::new(addr.cast_mut()).unwrap()), Ok(64));
    drop(boxed);
    let after = k64.stats();
    assert_eq!(after.nr_allocated, before.nr_allocated);
    assert_eq!(after.nr_frees_ever, before.nr_frees_ever + 1);

    let k96 = kmalloc_cache("kmalloc-96");
    let before = k96.stats();
    // Through `black_box`, as the String and the 64 KiB Vec below: a
    // block that does not escape may be allocated and freed by nobody
    // (LLVM removes an unused `__rust_alloc`/`__rust_dealloc` pair).
    let vec: Vec<u64> = core::hint::black_box(Vec::with_capacity(12)); // 96 bytes, 8-aligned
    assert_eq!(
        k96.stats().nr_allocated,
        before.nr_allocated + 1,
        "Vec<u64> of 12 from kmalloc-96"
    );
    assert_eq!(vec.as_ptr() as usize % 8, 0);
    drop(vec);
    assert_eq!(k96.stats().nr_allocated, before.nr_allocated);

    let k256 = kmalloc_cache("kmalloc-256");
    let before = k256.stats();
    let mut text = core::hint::black_box(String::with_capacity(250));
    text.push_str("magpie");
    assert_eq!(
        k256.stats().nr_allocated,
        before.nr_allocated + 1,
        "String of 250 from kmalloc-256"
    );
    drop(text);
    assert_eq!(k256.stats().nr_allocated, before.nr_allocated);

    let large = SLAB.stats().large();
    let big: Vec<u8> = core::hint::black_box(Vec::with_capacity(64 * 1024));
    assert_eq!(
        SLAB.stats().large().nr_live,
        large.nr_live + 1,
        "64 KiB Vec is page-granular"
    );
    drop(big);
    assert_eq!(SLAB.stats().large().nr_live, large.nr_live);
}
