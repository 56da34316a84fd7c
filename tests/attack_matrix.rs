//! The attack matrix in the kernel (issue 33, `docs/HARDENING.md`, the
//! README's table): every row of `slab/src/tests/attack_matrix.rs` run
//! again on the booted kernel's own allocator through its `lkdtm` type
//! (`magpie::debug::lkdtm::attack`: the same code `lkdtm TYPE` runs in
//! the shell), without debug flags, each verdict and its words asserted;
//! and the rows whose defence the kernel can switch off at run time run
//! again without it, to show that they then fail (`not mitigated`).

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

use alloc::string::String;

use magpie::debug::lkdtm::{self, LkdtmType, Verdict, attack};
use magpie::kmem::{KPAGES_QUARANTINED, SLAB};
use magpie::profiling::tagged::set_random_kmalloc_caches;
use magpie_slab::reports::{ErrorKind, ErrorReport};

magpie::test_kernel!();

/// Each row's type, the verdict its defence gives, and words of the
/// verdict line.
const MATRIX: [(LkdtmType, Verdict, &str); 9] = [
    (
        LkdtmType::UafWriteDoubleFree,
        Verdict::Detected,
        "buffer modified after being freed (64 and 8 bytes), each object handed out once",
    ),
    (
        LkdtmType::SlabFreeDoubleNarrow,
        Verdict::Refused,
        "double free of 0x",
    ),
    (
        LkdtmType::FreelistForgeSame,
        Verdict::Refused,
        "free list corrupted in lkdtm-forge-same",
    ),
    (
        LkdtmType::FreelistForgeOther,
        Verdict::Refused,
        "free list corrupted in lkdtm-forge-another",
    ),
    (
        LkdtmType::FreelistForgeOutside,
        Verdict::Refused,
        "free list corrupted in lkdtm-forge-outside",
    ),
    (
        LkdtmType::KmallocSiteReuse,
        Verdict::Mitigated,
        "sites in different random copies never got each other's objects",
    ),
    (
        LkdtmType::KmallocTypeReuse,
        Verdict::Mitigated,
        "pointer-free data and pointers never share an object",
    ),
    (
        LkdtmType::CrossCacheReuse,
        Verdict::Mitigated,
        "no object of lkdtm-cross-attacker landed in the pages lkdtm-cross-victim gave back",
    ),
    (
        LkdtmType::HeapSprayOrder,
        Verdict::Mitigated,
        "the slab hands its objects out in a random order",
    ),
];

fn run(kind: LkdtmType) -> (Verdict, String) {
    let mut out = String::new();
    let verdict =
        lkdtm::run(kind, &mut out).unwrap_or_else(|error| panic!("{kind}: {error}\n{out}"));
    (verdict, out)
}

fn last_line(out: &str) -> &str {
    out.lines().last().unwrap_or("")
}

/// Errors of `kind` reported about `cache` after report number `after`.
fn reports_of(after: u64, kind: ErrorKind, cache: &str) -> usize {
    let mut out = [ErrorReport::new(kind, "", 0); 64];
    let nr = SLAB.debug().read_errors(after, &mut out);
    out[..nr]
        .iter()
        .filter(|report| report.kind == kind && report.cache.as_str() == cache)
        .count()
}

#[test_case]
fn every_row_gives_its_verdict_and_the_kernel_survives() {
    for (kind, expected, words) in MATRIX {
        let (verdict, out) = run(kind);
        assert!(
            out.starts_with(&alloc::format!("lkdtm: Performing direct entry {kind}\n")),
            "{out}"
        );
        assert_eq!(verdict, expected, "{out}");
        let last = last_line(&out);
        let prefix = alloc::format!("lkdtm: {kind}: {}: ", expected.word());
        assert!(last.starts_with(&prefix), "{kind}: {last:?}\n{out}");
        assert!(last.contains(words), "{kind}: {last:?} lacks {words:?}");
        // Survived: the allocator still works.
        let v: alloc::vec::Vec<u64> = (0..100).collect();
        assert_eq!(v.iter().sum::<u64>(), 4950);
    }
}

/// Row 1's details: the second free is accepted (the key was overwritten),
/// the copy is reported in each size's cache, and the object comes back once.
#[test_case]
fn uaf_write_then_double_free_is_reported_and_handed_out_once() {
    let before = SLAB.debug().nr_errors();
    let (verdict, out) = run(LkdtmType::UafWriteDoubleFree);
    assert_eq!(verdict, Verdict::Detected, "{out}");
    assert_eq!(
        out.matches("lkdtm: second free: accepted").count(),
        2,
        "{out}"
    );
    let once = out
        .lines()
        .filter(|line| line.starts_with("lkdtm: the next 256 allocations returned 0x"))
        .filter(|line| line.ends_with(" once"))
        .count();
    assert_eq!(once, 2, "{out}");
    for cache in ["lkdtm-uaf-write-64", "lkdtm-uaf-write-8"] {
        // At least one: an earlier run's quarantined cache of the same
        // name may report too.
        assert!(
            reports_of(before, ErrorKind::ModifiedAfterFree, cache) >= 1,
            "{cache}\n{out}"
        );
    }
}

/// Row 4 without its defence: with `kmalloc!` sites on the normal
/// classes (`random_kmalloc_caches=0`), every site is in `kmalloc-64` and
/// what one frees, the other gets.
#[test_case]
fn site_reuse_is_not_mitigated_without_random_kmalloc_caches() {
    set_random_kmalloc_caches(false);
    let (verdict, out) = run(LkdtmType::KmallocSiteReuse);
    set_random_kmalloc_caches(true);
    assert_eq!(verdict, Verdict::NotMitigated, "{out}");
    assert!(
        out.contains("call sites allocate from kmalloc-64, kmalloc-64,"),
        "{out}"
    );
    let (verdict, out) = run(LkdtmType::KmallocSiteReuse);
    assert_eq!(verdict, Verdict::Mitigated, "{out}");
    assert!(out.contains("kmalloc-rnd-"), "{out}");
}

/// Row 7 without its defence: the reaped pages handed back at once (the
/// quarantine flushed after the reap) are where the attacker's cache grows.
#[test_case]
fn cross_cache_reuse_is_not_mitigated_without_the_quarantine() {
    let mut out = String::new();
    let verdict = attack::cross_cache_reuse(&mut out, false).expect("cross_cache_reuse");
    assert_eq!(verdict, Verdict::NotMitigated, "{out}");
    assert!(KPAGES_QUARANTINED.max_pages() > 0);
}

/// A type holding a pointer, for the typed partitions.
struct Node {
    _next: *mut Node,
    _value: u64,
}

impl magpie_slab::KmallocObj for Node {}

fn cache_name(obj: usize) -> &'static str {
    SLAB.debug()
        .whatis(obj)
        .unwrap_or_else(|| panic!("{obj:#x} is not a slab object"))
        .cache
        .name()
}

/// Row 4, the safe typed form (`KMALLOC_TYPE_REUSE` uses `KmallocArgs::of`):
/// `kbox` puts `[u8; 64]` in `kmalloc-data-64` and a pointer-holding type
/// in a random copy.
#[test_case]
fn typed_boxes_keep_pointer_free_data_apart() {
    SLAB.kfence().set_interval(0);
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
