//! Host tests of the fault-injection application: points enumerate from
//! their section, every mode injects what it says (oneshot exactly once,
//! also under concurrency), a disabled point counts nothing, patterns
//! select points, bad mode words are refused, and `fault list` rows.

use std::sync::atomic::{AtomicUsize, Ordering};

use magpie_codetag::fault::{
    FaultClass, FaultCounts, FaultMode, FaultParseError, FaultTag, PPM, seed_rng, set_cpu_id_fn,
    write_fault_row,
};
use magpie_codetag::{dynamic_fault, fault_tag};

fn memory_site() -> &'static FaultTag {
    fault_tag!(Memory)
}

fn io_site() -> &'static FaultTag {
    fault_tag!(Io)
}

/// A function that fails when its point says so (the usage pattern).
fn fallible_open() -> Result<u32, &'static str> {
    if dynamic_fault!() {
        return Err("injected");
    }
    Ok(7)
}

fn fallible_open_point() -> &'static FaultTag {
    FaultTag::all()
        .iter()
        .find(|point| point.tag.function() == "fallible_open")
        .expect("fallible_open's point is in the section")
}

/// Points used by the concurrent test only (tests run in parallel threads).
fn raced_site() -> &'static FaultTag {
    fault_tag!(Memory)
}

fn hit(point: &FaultTag, times: usize) -> usize {
    (0..times).filter(|_| point.should_fail()).count()
}

#[test]
fn points_enumerate_from_their_section() {
    let all = FaultTag::all();
    // memory_site, io_site, fallible_open, raced_site and the three of
    // modes_inject_as_they_say: every point in this binary.
    assert_eq!(
        all.len(),
        7,
        "{:?}",
        all.iter().map(|p| p.tag.line).collect::<Vec<_>>()
    );
    for point in [memory_site(), io_site(), fallible_open_point()] {
        assert!(all.iter().any(|p| std::ptr::eq(p, point)));
    }
    assert_eq!(memory_site().class, FaultClass::Memory);
    assert_eq!(io_site().class, FaultClass::Io);
    assert_eq!(fallible_open_point().class, FaultClass::Other);
    assert_eq!(memory_site().tag.function(), "memory_site");
    assert_eq!(memory_site().tag.file, "codetag/tests/fault.rs");
}

#[test]
fn disabled_points_never_fail_and_count_nothing() {
    let point = fallible_open_point();
    assert_eq!(point.mode(), FaultMode::Disabled);
    for _ in 0..1000 {
        assert_eq!(fallible_open(), Ok(7));
    }
    assert_eq!(point.counts(), FaultCounts::default());
}

#[test]
fn modes_inject_as_they_say() {
    let enabled = fault_tag!(Memory);
    enabled.set_mode(FaultMode::Enabled);
    assert_eq!(hit(enabled, 10), 10);
    assert_eq!(
        enabled.counts(),
        FaultCounts {
            nr_hits: 10,
            nr_injected: 10
        }
    );
    enabled.set_mode(FaultMode::Disabled);
    assert_eq!(hit(enabled, 10), 0);
    assert_eq!(
        enabled.counts().nr_hits,
        10,
        "disabled hits are not counted"
    );

    let oneshot = fault_tag!(Memory);
    oneshot.set_mode(FaultMode::Oneshot);
    assert_eq!(oneshot.mode(), FaultMode::Oneshot);
    assert!(oneshot.should_fail());
    assert_eq!(
        oneshot.mode(),
        FaultMode::Disabled,
        "oneshot disables itself"
    );
    assert_eq!(hit(oneshot, 10), 0);
    assert_eq!(
        oneshot.counts(),
        FaultCounts {
            nr_hits: 1,
            nr_injected: 1
        }
    );

    let every = fault_tag!(Memory);
    every.set_mode(FaultMode::Every(3));
    let pattern: Vec<bool> = (0..9).map(|_| every.should_fail()).collect();
    assert_eq!(
        pattern,
        [false, false, true, false, false, true, false, false, true]
    );
    // Setting the mode again restarts the count; reset zeroes the counts.
    every.set_mode(FaultMode::Every(2));
    every.reset_counts();
    assert!(!every.should_fail());
    assert!(every.should_fail());
    assert_eq!(
        every.counts(),
        FaultCounts {
            nr_hits: 2,
            nr_injected: 1
        }
    );
    every.set_mode(FaultMode::Disabled);
}

#[test]
fn probability_injects_about_that_often() {
    static CPU: AtomicUsize = AtomicUsize::new(0);
    set_cpu_id_fn(|| CPU.load(Ordering::Relaxed));
    seed_rng(0x5eed);
    let point = io_site();
    point.set_mode(FaultMode::Probability(PPM / 4));
    let injected = hit(point, 40_000);
    point.set_mode(FaultMode::Disabled);
    // 25% of 40 000 = 10 000, standard deviation ~87: 10 000 ± 600 is ~7 sigma.
    assert!((9_400..=10_600).contains(&injected), "{injected}");
    assert_eq!(point.counts().nr_injected, injected as u64);
    assert_eq!(point.counts().nr_hits, 40_000);
    // Certain and (almost) impossible.
    point.reset_counts();
    point.set_mode(FaultMode::Probability(PPM));
    assert_eq!(hit(point, 1000), 1000);
    point.set_mode(FaultMode::Probability(1));
    assert!(hit(point, 1000) <= 2);
    point.set_mode(FaultMode::Disabled);
}

#[test]
fn oneshot_injects_exactly_once_under_concurrency() {
    let point = raced_site();
    for _ in 0..50 {
        point.reset_counts();
        point.set_mode(FaultMode::Oneshot);
        let injected = AtomicUsize::new(0);
        let start = std::sync::Barrier::new(4);
        std::thread::scope(|scope| {
            for _ in 0..4 {
                scope.spawn(|| {
                    start.wait();
                    injected.fetch_add(hit(point, 200), Ordering::Relaxed);
                });
            }
        });
        assert_eq!(injected.load(Ordering::Relaxed), 1);
        // Racers that lost the point count no hit either.
        assert_eq!(
            point.counts(),
            FaultCounts {
                nr_hits: 1,
                nr_injected: 1
            }
        );
    }
}

#[test]
fn mode_words_parse_and_bad_ones_are_refused() {
    assert_eq!(FaultMode::parse(&["enable"]), Ok(FaultMode::Enabled));
    assert_eq!(FaultMode::parse(&["disable"]), Ok(FaultMode::Disabled));
    assert_eq!(FaultMode::parse(&["oneshot"]), Ok(FaultMode::Oneshot));
    assert_eq!(FaultMode::parse(&["every", "10"]), Ok(FaultMode::Every(10)));
    assert_eq!(
        FaultMode::parse(&["probability", "2.5"]),
        Ok(FaultMode::Probability(25_000))
    );
    assert_eq!(
        FaultMode::parse(&["every", "0"]),
        Err(FaultParseError::BadEvery)
    );
    assert_eq!(
        FaultMode::parse(&["every", "x"]),
        Err(FaultParseError::BadEvery)
    );
    assert_eq!(
        FaultMode::parse(&["every"]),
        Err(FaultParseError::UnknownMode)
    );
    for p in ["0", "101", "-3", "1e2", "0.00001", ""] {
        assert_eq!(
            FaultMode::parse(&["probability", p]),
            Err(FaultParseError::BadProbability),
            "{p}"
        );
    }
    assert_eq!(
        FaultMode::parse(&["sometimes"]),
        Err(FaultParseError::UnknownMode)
    );
    assert_eq!(FaultMode::parse(&[]), Err(FaultParseError::UnknownMode));
    assert!(FaultParseError::BadEvery.to_string().contains("every N"));
}

#[test]
fn patterns_select_points() {
    let point = memory_site();
    let location = format!("{}:{}", point.tag.file, point.tag.line);
    assert!(point.matches(&location));
    assert!(!point.matches(&format!("{}:{}", point.tag.file, point.tag.line + 1)));
    assert!(
        !point.matches("fault.rs:1"),
        "FILE:LINE is exact, not a substring"
    );
    assert!(point.matches("tests/fault.rs"));
    assert!(point.matches("memory_site"));
    assert!(!point.matches("memory"), "function names match whole");
    assert!(point.matches("all"));
    assert!(!point.matches(""));
    assert!(!point.matches("kernel/src"));
}

#[test]
fn rows_use_the_slides_layout() {
    let point = io_site();
    let mut row = String::new();
    write_fault_row(&mut row, point).unwrap();
    let expected_start = format!(
        "codetag/tests/fault.rs:{} module:fault func:io_site class:io ",
        point.tag.line
    );
    assert!(row.starts_with(&expected_start), "{row:?}");
    assert!(row.ends_with('\n'));
    let words: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(words.len(), 7, "{row:?}");
    assert!(words[5].starts_with("hits:") && words[6].starts_with("injected:"));
    for (mode, word) in [
        (FaultMode::Oneshot, "enabled:oneshot"),
        (FaultMode::Every(10), "enabled:every=10"),
        (FaultMode::Probability(25_000), "enabled:probability=2.5%"),
        (FaultMode::Enabled, "enabled"),
    ] {
        assert_eq!(mode.to_string(), word);
    }
    assert_eq!(FaultMode::Disabled.to_string(), "disabled");
}
