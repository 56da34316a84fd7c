//! The fault sweep: every fault point of the kernel (every `kmalloc!` /
//! `kmem_cache_alloc!` site and every `dynamic_fault!`) is armed oneshot in
//! turn, a workload that reaches it runs, and the test checks that the
//! point injected exactly one fault, the workload failed with a clear
//! error, the kernel carries on, and nothing leaked (`allocinfo` totals
//! back to their baseline). A point with no workload fails the test unless
//! it is listed in `UNREACHABLE` with the reason.
//!
//! Compiled with fault injection but without profiling
//! (`--no-default-features --features fault-injection`), the same sweep
//! checks the compiled-out `kmalloc!` variant; without the feature, that
//! the kernel has no fault points.

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

use magpie::debug::fault::{FaultMode, FaultTag};
use magpie::shell::Shell;

magpie::test_kernel!();

/// How a point is reached.
struct Workload {
    /// The point's module (prefix) and function.
    module: &'static str,
    function: &'static str,
    /// Shell command lines that reach it.
    lines: &'static [&'static str],
    /// What the output must contain when the fault is injected.
    error: &'static str,
    /// Shell lines that undo the workload's effect (run after each try).
    cleanup: &'static [&'static str],
    /// Reached only with allocation profiling compiled in (`allocinfo`).
    needs_profiling: bool,
}

const WORKLOADS: &[Workload] = &[
    Workload {
        module: "magpie::shell",
        function: "cmd_kmalloc",
        lines: &["kmalloc 64 4"],
        error: "error: out of memory (kmalloc(64) failed after 0 of 4 objects)",
        cleanup: &["kfree all"],
        needs_profiling: false,
    },
    Workload {
        module: "magpie::shell",
        function: "cmd_leak",
        lines: &["leak 64 1"],
        error: "error: out of memory (kmalloc(64) failed after 0 of 1 objects)",
        cleanup: &[],
        needs_profiling: false,
    },
    // Both of the stress worker's sites (kmalloc and the stress-ctor cache,
    // one allocation in 8): a failure is counted, the run carries on.
    Workload {
        module: "magpie::smp::stress",
        function: "alloc",
        lines: &["stress --cpus all --ops 4000 --seed 7"],
        error: "failures=1",
        cleanup: &[],
        needs_profiling: false,
    },
    Workload {
        module: "magpie::debug::lkdtm",
        function: "alloc",
        lines: &["lkdtm SLAB_FREE_CROSS"],
        error: "error: lkdtm SLAB_FREE_CROSS: could not set up: out of memory; nothing was done",
        cleanup: &[],
        needs_profiling: false,
    },
    // The kernel's own Vec/Box/Arc users and page allocations for a
    // command (`try_alloc!` sites, issue 19).
    Workload {
        module: "magpie::shell",
        function: "hold_room",
        lines: &["kmalloc 64 4"],
        error: "error: out of memory (64 bytes to hold 4 more objects)",
        cleanup: &["kfree all"],
        needs_profiling: false,
    },
    Workload {
        module: "magpie::shell::smp",
        function: "online_cpus",
        lines: &["stress --cpus 1 --ops 100"],
        error: "error: out of memory (a list of ",
        cleanup: &[],
        needs_profiling: false,
    },
    Workload {
        module: "magpie::smp::stress",
        function: "run",
        lines: &["stress --cpus all --ops 1000 --seed 7"],
        error: "error: out of memory (the stress run's bookkeeping)",
        cleanup: &[],
        needs_profiling: false,
    },
    // A cross-CPU free that finds no room in the target's inbox: counted
    // as a failure, the object freed where it is.
    Workload {
        module: "magpie::smp::stress",
        function: "hand_off",
        lines: &["stress --cpus all --ops 4000 --seed 7"],
        error: "failures=1",
        cleanup: &[],
        needs_profiling: false,
    },
    Workload {
        module: "magpie::smp",
        function: "run_on_cpus",
        lines: &["stress --cpus all --ops 1000 --seed 7"],
        error: "error: out of memory (the work items)",
        cleanup: &[],
        needs_profiling: false,
    },
    Workload {
        module: "magpie::profiling::alloc_tag",
        function: "mark",
        lines: &["allocinfo mark"],
        error: "error: out of memory (a copy of every site's counts for the mark)",
        cleanup: &[],
        needs_profiling: true,
    },
    Workload {
        module: "magpie::profiling::alloc_tag",
        function: "diff",
        lines: &["allocinfo mark", "allocinfo diff"],
        error: "error: out of memory (one row per site for the diff)",
        cleanup: &[],
        needs_profiling: true,
    },
    Workload {
        module: "magpie::tracing::event_stream",
        function: "start",
        lines: &["kmemtrace record start --force"],
        error: "error: cannot record: ",
        cleanup: &["kmemtrace record stop"],
        needs_profiling: false,
    },
    Workload {
        module: "magpie::debug::findleaks",
        function: "findleaks",
        lines: &["kmem findleaks"],
        error: "error: findleaks: no memory for the scan's table (",
        cleanup: &[],
        needs_profiling: false,
    },
];

/// Points no workload reaches: (module, function, reason).
const UNREACHABLE: &[(&str, &str, &str)] = &[
    (
        "magpie::smp",
        "run_on",
        "posts one work item: only tests call it (tests/smp_stress.rs), no shell command",
    ),
    (
        "magpie::smp::stress",
        "ctor_cache",
        "creates the stress-ctor cache on a boot's first stress and keeps it: \
         the sweep's warm-up has made it before the point is armed",
    ),
    (
        "magpie::dev::virtio_console",
        "init",
        "sets up the dump channel at boot; later calls find it set up (or no device)",
    ),
];

fn workload_of(point: &FaultTag) -> Option<&'static Workload> {
    WORKLOADS.iter().find(|workload| {
        point.tag.module.starts_with(workload.module)
            && point.tag.function() == workload.function
            && (cfg!(feature = "alloc-profiling") || !workload.needs_profiling)
    })
}

fn is_unreachable(point: &FaultTag) -> bool {
    let profiling_compiled_out = !cfg!(feature = "alloc-profiling")
        && WORKLOADS.iter().any(|workload| {
            workload.needs_profiling
                && point.tag.module.starts_with(workload.module)
                && point.tag.function() == workload.function
        });
    profiling_compiled_out
        || UNREACHABLE.iter().any(|(module, function, _reason)| {
            point.tag.module.starts_with(module) && point.tag.function() == *function
        })
}

/// Live bytes and calls over every allocation site (profiling compiled
/// out: objects with callers over every cache stand in for the bytes).
fn totals() -> (u64, u64) {
    #[cfg(feature = "alloc-profiling")]
    {
        let totals = magpie::profiling::totals();
        (totals.bytes, totals.calls)
    }
    #[cfg(not(feature = "alloc-profiling"))]
    {
        // Objects with callers, over every cache but the allocator's own
        // metadata (magazines are made on demand and kept in the depot).
        let mut live = 0u64;
        magpie::kmem::SLAB.for_each_cache(|cache| {
            if !cache.is_bootstrap() {
                live += cache.stats().nr_allocated as u64;
            }
        });
        (live, 0)
    }
}

/// Runs the workload's lines; the output of all of them, with the stress
/// total line's failures as `failures=N` appended.
fn run_workload(shell: &mut Shell, workload: &Workload) -> String {
    let mut out = String::new();
    for line in workload.lines {
        shell.execute(line, &mut out);
    }
    if let Some(total) = out.lines().find(|line| line.starts_with("total ")) {
        let words: alloc::vec::Vec<&str> = total.split_whitespace().collect();
        let failures = words[5];
        let corrupt = words[6];
        assert_eq!(corrupt, "0", "{out}");
        out = alloc::format!("{out}failures={failures}\n");
    }
    for line in workload.cleanup {
        let mut ignored = String::new();
        shell.execute(line, &mut ignored);
    }
    out
}

#[test_case]
fn every_point_has_a_workload_or_a_reason() {
    let points = FaultTag::all();
    if !magpie::debug::fault::COMPILED_IN {
        assert!(points.is_empty(), "fault injection compiled out: no points");
        return;
    }
    assert!(points.len() > WORKLOADS.len(), "{} points", points.len());
    for point in points {
        assert!(
            workload_of(point).is_some() || is_unreachable(point),
            "fault point {} ({} func:{}) has no workload: add one to WORKLOADS, \
             or list it in UNREACHABLE with the reason",
            point.tag.location(),
            point.tag.module,
            point.tag.function()
        );
    }
    for workload in WORKLOADS {
        if workload.needs_profiling && !cfg!(feature = "alloc-profiling") {
            continue;
        }
        assert!(
            points
                .iter()
                .any(|p| workload_of(p).is_some_and(|w| core::ptr::eq(w, workload))),
            "workload for {} matches no point",
            workload.function
        );
    }
}

#[test_case]
fn sweep_every_point_oneshot() {
    let mut shell = Shell::new();
    for point in FaultTag::all() {
        let Some(workload) = workload_of(point) else {
            continue; // in UNREACHABLE (checked above)
        };
        assert_eq!(point.mode(), FaultMode::Disabled);
        // Warm-up: lazily created state (caches, magazines) stays.
        let clean = run_workload(&mut shell, workload);
        assert!(
            !clean.contains("error"),
            "{}: {clean}",
            point.tag.location()
        );
        let baseline = totals();
        point.reset_counts();
        point.set_mode(FaultMode::Oneshot);
        let out = run_workload(&mut shell, workload);
        let counts = point.counts();
        assert_eq!(
            (counts.nr_hits, counts.nr_injected),
            (1, 1),
            "{} was not reached by {:?}:\n{out}",
            point.tag.location(),
            workload.lines
        );
        assert_eq!(point.mode(), FaultMode::Disabled, "oneshot disarmed itself");
        assert!(
            out.contains(workload.error),
            "{}: expected {:?} in:\n{out}",
            point.tag.location(),
            workload.error
        );
        assert!(
            out.lines().filter(|line| line.contains("error")).count() <= 1,
            "{}: one error line, not:\n{out}",
            point.tag.location()
        );
        drop(out);
        assert_eq!(
            totals(),
            baseline,
            "{}: allocinfo totals not back to baseline",
            point.tag.location()
        );
        magpie::println!(
            "  swept {} func:{}: injected once, clear error, nothing leaked",
            point.tag.location(),
            point.tag.function()
        );
        // The kernel carries on: the same workload succeeds again.
        let again = run_workload(&mut shell, workload);
        assert!(
            !again.contains("error"),
            "{}: {again}",
            point.tag.location()
        );
    }
    assert_eq!(shell.nr_held(), 0);
}

fn run(shell: &mut Shell, line: &str) -> String {
    let mut out = String::new();
    shell.execute(line, &mut out);
    out
}

fn assert_one_error_line(out: &str, contains: &str) {
    assert!(out.starts_with("error: "), "{out:?}");
    assert_eq!(out.lines().count(), 1, "{out:?}");
    assert!(out.contains(contains), "{out:?} lacks {contains:?}");
}

#[cfg(feature = "fault-injection")]
#[test_case]
fn fault_list_uses_the_slides_layout() {
    let mut shell = Shell::new();
    let out = run(&mut shell, "fault list");
    let rows: alloc::vec::Vec<&str> = out.lines().filter(|l| !l.starts_with('#')).collect();
    assert_eq!(rows.len(), FaultTag::all().len(), "{out}");
    assert!(
        out.ends_with(&alloc::format!(
            "# {} fault points, 0 enabled\n",
            rows.len()
        )),
        "{out}"
    );
    let row = rows
        .iter()
        .find(|row| row.contains("func:cmd_kmalloc"))
        .unwrap_or_else(|| panic!("{out}"));
    let words: alloc::vec::Vec<&str> = row.split_whitespace().collect();
    assert_eq!(words.len(), 7, "{row}");
    assert!(words[0].starts_with("kernel/src/shell/kmem.rs:"), "{row}");
    assert_eq!(words[1], "module:magpie::shell::kmem");
    assert_eq!(
        &words[2..5],
        &["func:cmd_kmalloc", "class:memory", "disabled"]
    );
    // Counts since boot (other tests in this kernel arm the point too).
    assert!(
        words[5]
            .strip_prefix("hits:")
            .unwrap()
            .parse::<u64>()
            .is_ok()
    );
    assert!(
        words[6]
            .strip_prefix("injected:")
            .unwrap()
            .parse::<u64>()
            .is_ok()
    );
    // A pattern selects; FILE:LINE selects exactly one.
    let selected = run(&mut shell, "fault list magpie::smp::stress");
    let nr_stress = FaultTag::all()
        .iter()
        .filter(|point| point.tag.module == "magpie::smp::stress")
        .count();
    assert_eq!(selected.lines().count(), nr_stress + 1, "{selected}");
    let one = run(&mut shell, &alloc::format!("fault list {}", words[0]));
    assert_eq!(one.lines().next(), Some(*row), "{one}");
}

#[cfg(feature = "fault-injection")]
#[test_case]
fn every_n_fails_every_nth_kmalloc_and_disable_stops_it() {
    let mut shell = Shell::new();
    let set = run(&mut shell, "fault cmd_kmalloc every 3");
    assert!(
        set.contains("func:cmd_kmalloc class:memory enabled:every=3 "),
        "{set}"
    );
    let out = run(&mut shell, "kmalloc 32 5");
    let lines: alloc::vec::Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 3, "two objects, then the error: {out}");
    assert_eq!(
        lines[2],
        "error: out of memory (kmalloc(32) failed after 2 of 5 objects)"
    );
    assert_eq!(shell.nr_held(), 2);
    let listed = run(&mut shell, "fault list cmd_kmalloc");
    assert!(
        listed.contains("enabled:every=3 hits:3 injected:1"),
        "{listed}"
    );
    assert!(
        listed.ends_with("# 1 fault points, 1 enabled\n"),
        "{listed}"
    );
    run(&mut shell, "fault cmd_kmalloc disable");
    let out = run(&mut shell, "kmalloc 32 5");
    assert!(!out.contains("error"), "{out}");
    run(&mut shell, "kfree all");
    assert_eq!(shell.nr_held(), 0);
    // probability 100 fails every time; the state is shown in percent.
    let set = run(&mut shell, "fault cmd_leak probability 100");
    assert!(set.contains("enabled:probability=100%"), "{set}");
    assert_one_error_line(
        &run(&mut shell, "leak 16 3"),
        "out of memory (kmalloc(16) failed after 0 of 3 objects)",
    );
    run(&mut shell, "fault all disable");
    assert!(run(&mut shell, "fault list").ends_with(" 0 enabled\n"));
}

#[cfg(feature = "fault-injection")]
#[test_case]
fn probability_fails_about_that_share_on_every_cpu() {
    let mut shell = Shell::new();
    // The stress worker's two object sites (its bookkeeping has points of
    // its own, left alone here).
    let mut set = String::new();
    for point in FaultTag::all().iter().filter(|point| {
        point.tag.module == "magpie::smp::stress" && point.tag.function() == "alloc"
    }) {
        set += &run(
            &mut shell,
            &alloc::format!("fault {} probability 10", point.tag.location()),
        );
    }
    assert_eq!(set.matches("enabled:probability=10%").count(), 2, "{set}");
    let out = run(&mut shell, "stress --cpus all --ops 20000 --seed 3");
    run(&mut shell, "fault magpie::smp::stress disable");
    let total = out
        .lines()
        .find(|line| line.starts_with("total "))
        .unwrap_or_else(|| panic!("{out}"));
    let words: alloc::vec::Vec<u64> = total
        .split_whitespace()
        .skip(1)
        .map(|word| word.parse().expect(total))
        .collect();
    let (allocs, failures, corrupt) = (words[1], words[4], words[5]);
    assert_eq!(corrupt, 0, "{out}");
    // 10% of the allocation attempts, within a wide margin.
    let attempts = allocs + failures;
    assert!(
        failures * 100 >= attempts * 7 && failures * 100 <= attempts * 13,
        "{failures} failures of {attempts} attempts:\n{out}"
    );
    let counted: u64 = FaultTag::all()
        .iter()
        .filter(|point| point.tag.module == "magpie::smp::stress")
        .map(|point| point.counts().nr_injected)
        .sum();
    assert!(
        counted >= failures,
        "{counted} injected, {failures} failures"
    );
}

#[cfg(feature = "fault-injection")]
#[test_case]
fn bad_fault_commands_are_one_error_line_and_change_nothing() {
    let mut shell = Shell::new();
    for (line, words) in [
        (
            "fault",
            "usage: fault list [PATTERN] | fault FILE:LINE|PATTERN",
        ),
        ("fault cmd_kmalloc", "usage: fault list"),
        (
            "fault cmd_kmalloc sometimes",
            "expected enable, disable, oneshot",
        ),
        ("fault cmd_kmalloc every 0", "every N: N is a whole number"),
        ("fault cmd_kmalloc every", "expected enable, disable"),
        (
            "fault cmd_kmalloc probability 150",
            "probability P: P is a percentage",
        ),
        ("fault cmd_kmalloc probability x", "probability P"),
        (
            "fault nowhere.rs:1 enable",
            "no fault point matches 'nowhere.rs:1'",
        ),
        ("fault no_such_function oneshot", "no fault point matches"),
        // Patterns are whole path components (`:` is in every path but is
        // none); numbers are written as the shell's others (issue 19).
        ("fault : enable", "no fault point matches ':'"),
        ("fault she enable", "no fault point matches 'she'"),
        ("fault cmd_kmalloc probability .5", "probability P"),
        ("fault cmd_kmalloc probability 50.", "probability P"),
        ("fault cmd_kmalloc every +5", "every N: N is a whole number"),
        (
            "fault cmd_kmalloc every 0xA",
            "every N: N is a whole number",
        ),
        (
            "fault list nothing-matches",
            "no fault point matches 'nothing-matches'",
        ),
        ("lkdtm", "usage: lkdtm TYPE | lkdtm list"),
        (
            "lkdtm SLAB_FREE",
            "unknown lkdtm type 'SLAB_FREE' (see 'lkdtm list')",
        ),
        ("lkdtm SLAB_FREE_DOUBLE twice", "usage: lkdtm TYPE"),
    ] {
        assert_one_error_line(&run(&mut shell, line), words);
    }
    for point in FaultTag::all() {
        assert_eq!(
            point.mode(),
            FaultMode::Disabled,
            "{}",
            point.tag.location()
        );
    }
}

#[test_case]
fn lkdtm_list_names_the_linux_types() {
    let mut shell = Shell::new();
    assert_eq!(
        run(&mut shell, "lkdtm list"),
        "SLAB_FREE_DOUBLE\nSLAB_FREE_CROSS\nSLAB_FREE_PAGE\nSLAB_LINEAR_OVERFLOW\n\
         WRITE_AFTER_FREE\nREAD_AFTER_FREE\nKFENCE_OOB_LEFT\nKFENCE_OOB_RIGHT\n\
         KFENCE_CORRUPTION\nKFENCE_DOUBLE_FREE\nKFENCE_INVALID_FREE\n\
         UAF_WRITE_DOUBLE_FREE\nSLAB_FREE_DOUBLE_NARROW\nFREELIST_FORGE_SAME\n\
         FREELIST_FORGE_OTHER\nFREELIST_FORGE_OUTSIDE\nKMALLOC_SITE_REUSE\n\
         KMALLOC_TYPE_REUSE\nCROSS_CACHE_REUSE\nHEAP_SPRAY_ORDER\n"
    );
    let out = run(&mut shell, "lkdtm slab_free_cross");
    assert!(
        out.starts_with("lkdtm: Performing direct entry SLAB_FREE_CROSS\n"),
        "{out}"
    );
    assert!(
        out.contains("lkdtm: SLAB_FREE_CROSS: detected: free of 0x"),
        "{out}"
    );
}

#[cfg(not(feature = "fault-injection"))]
#[test_case]
fn fault_says_it_is_compiled_out() {
    let mut shell = Shell::new();
    assert_one_error_line(
        &run(&mut shell, "fault list"),
        "fault injection is compiled out (kernel feature fault-injection)",
    );
}
