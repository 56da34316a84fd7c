//! The attack matrix in the kernel (issue 33, `docs/HARDENING.md`, the
//! README's table): each row of `slab/src/tests/attack_matrix.rs` run
//! again on the booted kernel's own allocator (`SLAB` on
//! `KPAGES_QUARANTINED`, the kernel's `kmalloc!` sites), as Linux's lkdtm
//! `SLAB_*` tests run against the real kernel, without debug flags, each
//! with its verdict asserted. Bugs are committed on scratch caches
//! (`attack-*`) that nothing else uses; KFENCE sampling is off during
//! each row (a sample would take the victim out of its slab).

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

use alloc::collections::BTreeSet;
use alloc::vec::Vec;
use core::ptr::NonNull;

use magpie::kmem::{KPAGES_QUARANTINED, KernelPlatform, SLAB};
use magpie_slab::reports::{ErrorKind, ErrorReport};
use magpie_slab::{CacheArgs, FreeError, KmemCache, PAGE_SIZE};

magpie::test_kernel!();

type Cache = KmemCache<KernelPlatform>;

/// KFENCE sampling off for a row (the kernel's default interval back
/// afterwards is not needed: every row of this file turns it off).
fn no_kfence() {
    SLAB.kfence().set_interval(0);
}

/// A scratch cache of `size`-byte objects.
fn scratch(name: &'static str, size: usize) -> &'static Cache {
    SLAB.cache_create(name, size, &CacheArgs::DEFAULT)
        .unwrap_or_else(|error| panic!("{name}: {error}"))
}

/// Destroy a scratch cache (all its objects freed).
fn destroy(cache: &'static Cache) {
    // SAFETY: a scratch cache of this file, unused from now on, on one CPU.
    unsafe { magpie::kmem::cache_destroy(cache) }
        .unwrap_or_else(|error| panic!("{}: {error}", cache.name()));
}

/// Errors of `kind` reported after report number `after`.
fn reports_of(after: u64, kind: ErrorKind) -> usize {
    let mut out = [ErrorReport::new(kind, "", 0); 64];
    let nr = SLAB.debug().read_errors(after, &mut out);
    out[..nr]
        .iter()
        .filter(|report| report.kind == kind)
        .count()
}

fn ptr(addr: usize) -> NonNull<u8> {
    NonNull::new(addr as *mut u8).expect("an object address")
}

/// Free every object of `objs` to `cache`.
fn free_all(cache: &Cache, objs: impl IntoIterator<Item = usize>) {
    for obj in objs {
        // SAFETY: live objects of ours, freed once.
        unsafe { cache.free(ptr(obj)) }.expect("free");
    }
}

/// Row 1: use-after-free write of the first word + double free. Verdict
/// **detected**: the second copy is reported when it leaves the
/// magazine and never handed out.
#[test_case]
fn uaf_write_then_double_free_is_detected_never_handed_out_twice() {
    no_kfence();
    for (name, size) in [("attack-uaf-64", 64), ("attack-uaf-8", 8)] {
        let cache = scratch(name, size);
        let victim = cache.alloc().expect("alloc").as_ptr() as usize;
        let before = SLAB.debug().nr_errors();
        // SAFETY: live and ours; then the deliberate write after free and
        // the double free it lets through.
        unsafe {
            cache.free(ptr(victim)).expect("free");
            (victim as *mut usize).write(0);
            assert_eq!(
                cache.free(ptr(victim)),
                Ok(()),
                "{name}: the key was overwritten"
            );
        }
        let mut seen = BTreeSet::new();
        let mut objs = Vec::with_capacity(400);
        for _ in 0..400 {
            let obj = cache.alloc().expect("alloc").as_ptr() as usize;
            assert!(seen.insert(obj), "{name}: {obj:#x} handed out twice");
            objs.push(obj);
        }
        assert!(
            reports_of(before, ErrorKind::ModifiedAfterFree) >= 1,
            "{name}: the second copy was reported"
        );
        free_all(cache, objs);
        // The reported copy stays busy for good: the cache is not destroyed.
    }
}

/// Row 2: a double free after a one-byte write. Verdict **refused** at
/// the free.
#[test_case]
fn double_free_after_a_narrow_write_is_refused() {
    no_kfence();
    let cache = scratch("attack-narrow", 64);
    let obj = cache.alloc().expect("alloc");
    // SAFETY: ours: a byte written, freed, then freed again (refused).
    unsafe {
        obj.as_ptr().add(40).write(1);
        cache.free(obj).expect("free");
        assert!(matches!(cache.free(obj), Err(FreeError::DoubleFree { .. })));
    }
    destroy(cache);
}

/// Row 3: forged free-list links (into the same slab, another slab,
/// outside the heap). Verdict **refused**: never followed, reported.
#[test_case]
fn forged_free_list_links_are_refused() {
    no_kfence();
    let other = scratch("attack-forged-other", 64);
    let elsewhere = other.alloc().expect("alloc").as_ptr() as usize;
    let outside = &raw const SLAB as usize;
    for (name, pick) in [
        ("attack-forged-same", 0),
        ("attack-forged-another", 1),
        ("attack-forged-outside", 2),
    ] {
        let cache = scratch(name, 64);
        // A whole slab's objects, so that it is full once: only then are
        // its free objects threaded on the linked list (before, in
        // bitmap mode, a free object holds no link to forge:
        // slab/src/layout/freelist.rs).
        let first = cache.alloc().expect("alloc").as_ptr() as usize;
        let nr_objs = cache.stats().nr_total_objs;
        let objs: Vec<usize> = core::iter::once(first)
            .chain((1..nr_objs).map(|_| cache.alloc().expect("alloc").as_ptr() as usize))
            .collect();
        free_all(cache, objs[1..].iter().copied());
        cache.reap();
        let target = [objs[0], elsewhere, outside][pick];
        let before = SLAB.debug().nr_errors();
        for &obj in &objs[1..] {
            // SAFETY: the deliberate write after free: the link word of a
            // free object of our scratch cache's slab.
            unsafe { ((obj + 8) as *mut usize).write(target) };
        }
        let got: Vec<usize> = (0..200)
            .map(|_| cache.alloc().expect("alloc").as_ptr() as usize)
            .collect();
        assert!(
            !got.contains(&target),
            "{name}: the forged link was followed"
        );
        assert!(
            reports_of(before, ErrorKind::FreeListCorrupted) >= 1,
            "{name}: reported"
        );
        free_all(cache, got.into_iter().chain([objs[0]]));
    }
    free_all(other, [elsewhere]);
}

/// One `kmalloc!` site per arm (the kernel's macro: partitioned by
/// default), 64 bytes.
fn kmalloc_at(site: usize) -> usize {
    let obj = match site {
        0 => magpie::kmalloc!(64),
        1 => magpie::kmalloc!(64),
        2 => magpie::kmalloc!(64),
        3 => magpie::kmalloc!(64),
        4 => magpie::kmalloc!(64),
        _ => magpie::kmalloc!(64),
    };
    obj.expect("kmalloc!").as_ptr() as usize
}

fn cache_name(obj: usize) -> &'static str {
    SLAB.debug()
        .whatis(obj)
        .unwrap_or_else(|| panic!("{obj:#x} is not a slab object"))
        .cache
        .name()
}

/// Row 4: same-size reuse across `kmalloc!` call sites. Verdict
/// **mitigated**: two sites in different random copies never get each
/// other's freed objects.
#[test_case]
fn kmalloc_sites_in_different_copies_do_not_share_objects() {
    no_kfence();
    let names: Vec<&str> = (0..6)
        .map(|site| {
            let obj = kmalloc_at(site);
            let name = cache_name(obj);
            // SAFETY: just allocated, ours.
            unsafe { SLAB.kfree(ptr(obj)) }.expect("kfree");
            name
        })
        .collect();
    for name in &names {
        assert!(
            name.starts_with("kmalloc-rnd-") && name.ends_with("-64"),
            "{name}"
        );
    }
    // Six sites in one copy of eight: 1 boot in 32,768.
    let (a, b) = (0..6)
        .flat_map(|a| (0..6).map(move |b| (a, b)))
        .find(|&(a, b)| names[a] != names[b])
        .expect("two sites in different copies");
    let freed: Vec<usize> = (0..100).map(|_| kmalloc_at(a)).collect();
    for &obj in &freed {
        // SAFETY: ours, freed once.
        unsafe { SLAB.kfree(ptr(obj)) }.expect("kfree");
    }
    let got: Vec<usize> = (0..100).map(|_| kmalloc_at(b)).collect();
    let shared = got.iter().filter(|obj| freed.contains(obj)).count();
    assert_eq!(shared, 0, "{} and {}", names[a], names[b]);
    for obj in got {
        // SAFETY: ours, freed once.
        unsafe { SLAB.kfree(ptr(obj)) }.expect("kfree");
    }
}

/// A type holding a pointer, for the typed partitions.
struct Node {
    _next: *mut Node,
    _value: u64,
}

impl magpie_slab::KmallocObj for Node {}

/// Row 5: pointer-free data beside pointers. Verdict **mitigated**:
/// `kmalloc_obj` / `kbox` put `[u8; 64]` in `kmalloc-data-64` and a
/// pointer-holding type in a random copy.
#[test_case]
fn typed_allocations_keep_pointer_free_data_apart() {
    no_kfence();
    let data = SLAB.kbox([0u8; 64]).expect("kbox");
    let node = SLAB
        .kbox(Node {
            _next: core::ptr::null_mut(),
            _value: 0,
        })
        .expect("kbox");
    assert_eq!(
        cache_name(data.as_ptr().as_ptr() as usize),
        "kmalloc-data-64"
    );
    let node_cache = cache_name(node.as_ptr().as_ptr() as usize);
    assert!(node_cache.starts_with("kmalloc-rnd-"), "{node_cache}");
}

/// Row 6: heap spray adjacency. Verdict **mitigated**: a fresh slab's
/// objects come out in a random order.
#[test_case]
fn a_fresh_slab_is_not_laid_out_in_address_order() {
    no_kfence();
    let cache = scratch("attack-spray", 64);
    let objs: Vec<usize> = (0..32)
        .map(|_| cache.alloc().expect("alloc").as_ptr() as usize)
        .collect();
    let adjacent = objs.windows(2).filter(|w| w[1] == w[0] + 64).count();
    assert!(adjacent < 8, "{adjacent} of 31 follow their predecessor");
    free_all(cache, objs);
    destroy(cache);
}

/// Row 7: cross-cache reuse after a reap. Verdict **mitigated**: cache
/// A's reaped slab pages wait in the kernel's quarantine, so cache B's
/// new slabs do not land on them.
#[test_case]
fn cross_cache_reuse_after_a_reap_waits_in_the_quarantine() {
    no_kfence();
    let victim = scratch("attack-victim", 64);
    let objs: Vec<usize> = (0..3 * 62)
        .map(|_| victim.alloc().expect("alloc").as_ptr() as usize)
        .collect();
    let pages: BTreeSet<usize> = objs.iter().map(|obj| obj & !(PAGE_SIZE - 1)).collect();
    free_all(victim, objs);
    assert!(victim.reap() > 0, "the victim's slabs went back");
    let attacker = scratch("attack-attacker", 192);
    let got: Vec<usize> = (0..300)
        .map(|_| attacker.alloc().expect("alloc").as_ptr() as usize)
        .collect();
    let reused = got
        .iter()
        .filter(|obj| pages.contains(&(*obj & !(PAGE_SIZE - 1))))
        .count();
    assert_eq!(
        reused, 0,
        "the attacker's objects landed in the victim's pages"
    );
    assert!(KPAGES_QUARANTINED.nr_pages_held() > 0);
    free_all(attacker, got);
    destroy(attacker);
    destroy(victim);
}
