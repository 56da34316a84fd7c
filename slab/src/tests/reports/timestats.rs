//! `write_time_stats`: the codetag slides' layout, every time in the one
//! format (`Nanoseconds`): each figure with its unit, down to ns.

use std::string::String;

use magpie_codetag::time_stats;
use magpie_codetag::time_stats::TimeStats;

use crate::reports::write_time_stats;

fn timed_site() -> &'static TimeStats {
    time_stats!()
}

fn tailed_site() -> &'static TimeStats {
    time_stats!()
}

fn written(stats: &TimeStats, to_ns: &dyn Fn(u64) -> u64) -> String {
    let mut out = String::new();
    write_time_stats(&mut out, stats, to_ns).unwrap();
    out
}

#[test]
fn count_rate_frequency_average_max_in_the_one_time_format() {
    let stats = timed_site();
    for duration in 1..=100u64 {
        stats.start(1000).end(1000 + duration);
    }
    // Clock units of 10 ns: durations 10..1000 ns; events ended at
    // 1001..1100, 99 intervals of 10 ns over 990 ns.
    let out = written(stats, &|units| units * 10);
    let lines: std::vec::Vec<&str> = out.lines().collect();
    assert!(lines[0].ends_with(" func:timed_site"), "{out}");
    assert_eq!(lines[1], "count:          100", "{out}");
    assert_eq!(lines[2], "rate:           100000000/sec", "{out}");
    assert_eq!(lines[3], "frequency:      10 ns", "{out}");
    assert_eq!(lines[4], "avg duration:   500 ns", "{out}");
    assert_eq!(lines[5], "max duration:   1.000 µs", "{out}");
    // The log-linear buckets' floors, each with its unit.
    assert_eq!(
        lines[6], "quantiles:      p50 480 ns, p75 640 ns, p90 800 ns, p99 960 ns, p100 1.000 µs",
        "{out}"
    );
    // Large figures move to bigger units, three decimals.
    let big = written(stats, &|units| units * 1_000_000);
    assert!(big.contains("avg duration:   50.000 ms"), "{big}");
    assert!(big.contains("max duration:   100.000 ms"), "{big}");
    assert!(big.contains("frequency:      1.000 ms"), "{big}");
    assert!(big.contains("quantiles:      p50 48.000 ms, "), "{big}");
    assert!(!big.contains(" us") && !big.contains(" sec"), "{big}");
    stats.reset();
}

#[test]
fn each_quantile_carries_its_unit_down_to_ns() {
    // 99 events of 500 ns and one of 50 µs: the typical figures stay in
    // ns beside a tail in µs (before, one unit for the line: `p50 0` when
    // it was the maximum's).
    let stats = tailed_site();
    for index in 0..100u64 {
        let duration = if index == 99 { 50_000 } else { 500 };
        stats.start(1000).end(1000 + duration);
    }
    let out = written(stats, &|ns| ns);
    assert!(out.contains("max duration:   50.000 µs"), "{out}");
    let line = out
        .lines()
        .find(|line| line.starts_with("quantiles:"))
        .unwrap();
    let fields: std::vec::Vec<&str> = line.split(", ").collect();
    assert_eq!(fields.len(), 5, "{line}");
    let p50 = fields[0].strip_prefix("quantiles:      p50 ").expect(line);
    let p50: u64 = p50.strip_suffix(" ns").expect(line).parse().unwrap();
    assert!((375..=500).contains(&p50), "{out}");
    assert_eq!(fields[4], "p100 50.000 µs", "{out}");
}
