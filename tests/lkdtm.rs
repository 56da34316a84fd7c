//! `lkdtm`: every type commits its bug on a scratch cache, the kernel
//! survives, the scratch caches are gone afterwards (or quarantined, said
//! so), nothing leaks, and the verdict is what the allocator does without
//! debug flags: every type detected, the last three slab types and the
//! `KFENCE_*` ones by KFENCE samples (the README's table; with
//! `slab_debug=FZPU` every slab type is detected:
//! `tests/e2e/test_shell.py`, `LkdtmSlabDebug`).

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
use alloc::vec::Vec;

use magpie::debug::lkdtm::{self, LkdtmType, Verdict};
use magpie::kmem::SLAB;

magpie::test_kernel!();

/// Today's behaviour without debug flags (KFENCE on, as by default), and
/// the words the verdict line must contain: every type is detected.
const EXPECTED: [(LkdtmType, Verdict, &str); 11] = [
    (
        LkdtmType::SlabFreeDouble,
        Verdict::Detected,
        "double free of 0x",
    ),
    (
        LkdtmType::SlabFreeCross,
        Verdict::Detected,
        "to the wrong cache (it belongs to lkdtm-free-cross-a)",
    ),
    (
        LkdtmType::SlabFreePage,
        Verdict::Detected,
        "which was never allocated",
    ),
    (
        LkdtmType::SlabLinearOverflow,
        Verdict::Detected,
        "KFENCE: out-of-bounds write at 0x",
    ),
    (
        LkdtmType::WriteAfterFree,
        Verdict::Detected,
        "KFENCE: use-after-free write at 0x",
    ),
    (
        LkdtmType::ReadAfterFree,
        Verdict::Detected,
        "KFENCE: use-after-free read at 0x",
    ),
    (
        LkdtmType::KfenceOobLeft,
        Verdict::Detected,
        "KFENCE: out-of-bounds read at 0x",
    ),
    (
        LkdtmType::KfenceOobRight,
        Verdict::Detected,
        "KFENCE: out-of-bounds read at 0x",
    ),
    (
        LkdtmType::KfenceCorruption,
        Verdict::Detected,
        "KFENCE: memory corruption at 0x",
    ),
    (
        LkdtmType::KfenceDoubleFree,
        Verdict::Detected,
        "double free of 0x",
    ),
    (
        LkdtmType::KfenceInvalidFree,
        Verdict::Detected,
        "which was never allocated",
    ),
];

fn nr_caches() -> usize {
    let mut nr = 0;
    SLAB.for_each_cache(|_| nr += 1);
    nr
}

fn lkdtm_caches() -> usize {
    let mut nr = 0;
    SLAB.for_each_cache(|cache| nr += usize::from(cache.name().starts_with("lkdtm-")));
    nr
}

/// Live bytes and calls over every allocation site (0 when profiling is
/// compiled out).
fn allocinfo_totals() -> (u64, u64) {
    let totals = magpie::profiling::totals();
    (totals.bytes, totals.calls)
}

fn run(kind: LkdtmType) -> (Verdict, String) {
    let mut out = String::new();
    let verdict =
        lkdtm::run(kind, &mut out).unwrap_or_else(|error| panic!("{kind}: {error}\n{out}"));
    (verdict, out)
}

#[test_case]
fn names_parse_in_any_case_and_unknown_ones_do_not() {
    for kind in LkdtmType::ALL {
        assert_eq!(LkdtmType::parse(kind.name()), Some(kind));
    }
    assert_eq!(
        LkdtmType::parse("slab_free_double"),
        Some(LkdtmType::SlabFreeDouble)
    );
    assert_eq!(LkdtmType::parse("SLAB_FREE"), None);
    assert_eq!(LkdtmType::parse(""), None);
}

#[test_case]
fn every_type_gives_todays_verdict_and_the_kernel_survives() {
    // Warm-up: the first run creates per-CPU state (magazines, depot) that
    // stays; the second must leave nothing behind.
    for (kind, ..) in EXPECTED {
        let _ = run(kind);
    }
    let caches = nr_caches();
    let (bytes, calls) = allocinfo_totals();
    let kmalloc_64_before = SLAB.find_cache("kmalloc-64").unwrap().stats().nr_allocated;
    for (kind, expected, words) in EXPECTED {
        let (verdict, out) = run(kind);
        assert!(
            out.starts_with(&alloc::format!("lkdtm: Performing direct entry {kind}\n")),
            "{out}"
        );
        let last = out.lines().last().unwrap();
        let prefix = alloc::format!("lkdtm: {kind}: {}: ", expected.word());
        assert_eq!(verdict, expected, "{out}");
        assert!(
            last.starts_with(&prefix),
            "{kind}: last line {last:?}\n{out}"
        );
        assert!(last.contains(words), "{kind}: {last:?} lacks {words:?}");
        assert!(
            !out.contains("quarantined"),
            "{kind}: repaired, not quarantined\n{out}"
        );
        // Survived: the allocator still works, and the scratch caches are gone.
        let v: Vec<u64> = (0..100).collect();
        assert_eq!(v.iter().sum::<u64>(), 4950);
        assert_eq!(lkdtm_caches(), 0, "{kind}: scratch caches left behind");
        assert_eq!(nr_caches(), caches, "{kind}");
    }
    assert_eq!(
        allocinfo_totals(),
        (bytes, calls),
        "allocinfo back to its baseline"
    );
    assert_eq!(
        SLAB.find_cache("kmalloc-64").unwrap().stats().nr_allocated,
        kmalloc_64_before
    );
}

#[test_case]
fn double_free_is_refused_without_debug_flags() {
    // Linux's naive check: the object is on top of this CPU's magazine.
    let before = SLAB.debug().nr_errors();
    let (_, out) = run(LkdtmType::SlabFreeDouble);
    assert!(out.contains("lkdtm: second free: refused"), "{out}");
    assert!(!out.contains("handed out twice"), "{out}");
    // ... and reported once, for the scratch cache.
    let mut reports = [magpie_slab::reports::ErrorReport::new(
        magpie_slab::reports::ErrorKind::InvalidFree,
        "",
        0,
    ); 4];
    let nr = SLAB.debug().read_errors(before, &mut reports);
    assert_eq!(nr, 1);
    assert_eq!(
        reports[0].kind,
        magpie_slab::reports::ErrorKind::DuplicateFree
    );
    assert_eq!(reports[0].cache.as_str(), "lkdtm-free-double");
}

/// The latest KFENCE report as the console shows it.
fn last_kfence_report() -> String {
    let report = magpie::debug::kfence::last_report().expect("a KFENCE report");
    alloc::format!(
        "{}",
        report.display(&magpie::debug::slab_debug::KernelFormat)
    )
}

#[test_case]
fn overflow_runs_into_a_kfence_guard_page_one_byte_right() {
    let (_, out) = run(LkdtmType::SlabLinearOverflow);
    assert!(out.contains("a KFENCE sample at its page's end"), "{out}");
    let report = last_kfence_report();
    assert!(
        report.contains("BUG: KFENCE: out-of-bounds write in magpie::debug::lkdtm::"),
        "{report}"
    );
    assert!(report.contains("(1B right of kfence-#"), "{report}");
    assert!(
        report.contains("size=64, cache=lkdtm-linear-overflow"),
        "{report}"
    );
    assert!(report.contains("allocated by task 0 on cpu "), "{report}");
}

#[test_case]
fn use_after_free_report_has_both_stacks() {
    let _ = run(LkdtmType::WriteAfterFree);
    let report = last_kfence_report();
    assert!(
        report.contains("BUG: KFENCE: use-after-free write in "),
        "{report}"
    );
    assert!(report.contains("Use-after-free write at 0x"), "{report}");
    let alloc_at = report
        .find("allocated by task 0")
        .unwrap_or_else(|| panic!("{report}"));
    let free_at = report
        .find("freed by task 0")
        .unwrap_or_else(|| panic!("{report}"));
    assert!(alloc_at < free_at, "{report}");
    assert!(report[free_at..].contains("Scratch>::free+0x"), "{report}");
}

#[test_case]
fn free_page_gives_the_page_back() {
    let before = magpie::kmem::KPAGES.nr_pages_out();
    let (_, out) = run(LkdtmType::SlabFreePage);
    assert!(
        out.contains("lkdtm: free to lkdtm-free-page: refused"),
        "{out}"
    );
    assert!(out.contains("lkdtm: kfree: refused"), "{out}");
    assert_eq!(magpie::kmem::KPAGES.nr_pages_out(), before);
}
