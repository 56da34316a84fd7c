use std::string::String;
use std::vec::Vec;

use super::plain_cache;
use crate::reports::{EMPTY_SLABTOP_ROW, SlabtopSample, SlabtopSort, slabtop};
use crate::tests::support::*;

const COLUMNS: &str = "  OBJS ACTIVE  USE OBJ SIZE  SLABS OBJ/SLAB CACHE SIZE NAME";

#[test]
fn linux_columns_plus_magazine_hits_misses_and_deltas() {
    let (alloc, _) = setup_default();
    let cache = plain_cache(alloc, "report-top", 256);
    let objs: Vec<_> = (0..40).map(|_| cache.alloc_box().unwrap()).collect();
    let mut rows = [EMPTY_SLABTOP_ROW; 256];
    let mut text = String::new();
    let nr_rows = slabtop(&mut text, alloc, &mut rows, None, SlabtopSort::Objects).unwrap();
    assert!(nr_rows >= 1);
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines[0].starts_with(" Active / Total Objects (% used)    : "),
        "{text}"
    );
    assert!(
        lines[4].starts_with(" Minimum / Average / Maximum Object : "),
        "{text}"
    );
    assert!(
        lines[5].starts_with(" Magazines since boot               : "),
        "{text}"
    );
    assert_eq!(lines[6], "");
    assert!(lines[7].starts_with(COLUMNS), "{text}");
    assert!(
        lines[7].ends_with(" MAG     HITS   MISSES CONTEND RESIZE"),
        "{text}"
    );
    let row = lines
        .iter()
        .find(|line| line.contains(" report-top "))
        .unwrap_or_else(|| panic!("{text}"));
    let fields: Vec<&str> = row.split_whitespace().collect();
    let stats = cache.stats();
    assert_eq!(fields[0], std::format!("{}", stats.nr_total_objs));
    assert_eq!(fields[3], "0.25K");
    assert_eq!(fields[7], "report-top");
    // Hits and misses add up to the allocations.
    let hits: u64 = fields[9].parse().unwrap();
    let misses: u64 = fields[10].parse().unwrap();
    assert_eq!(hits + misses, 40);
    // The next frame shows what changed: one more hit or miss, no more.
    let previous: Vec<_> = rows[..nr_rows].to_vec();
    let one = cache.alloc_box().unwrap();
    let mut text = String::new();
    let sample = SlabtopSample {
        rows: &previous,
        elapsed_ns: 1_500_000_000,
    };
    slabtop(&mut text, alloc, &mut rows, Some(sample), SlabtopSort::Name).unwrap();
    assert!(text.contains(" Magazines over 1.500 s"), "{text}");
    let row = text
        .lines()
        .find(|line| line.contains(" report-top "))
        .unwrap();
    let fields: Vec<&str> = row.split_whitespace().collect();
    let delta: u64 = fields[9].parse::<u64>().unwrap() + fields[10].parse::<u64>().unwrap();
    assert_eq!(delta, 1, "{row}");
    one.free().unwrap();
    for obj in objs {
        obj.free().unwrap();
    }
}

#[test]
fn a_small_row_buffer_says_what_it_left_out() {
    let (alloc, _) = setup_default();
    let mut rows = [EMPTY_SLABTOP_ROW; 2];
    let mut text = String::new();
    assert_eq!(
        slabtop(&mut text, alloc, &mut rows, None, SlabtopSort::CacheSize),
        Ok(2)
    );
    assert!(text.contains(" more caches not shown"), "{text}");
}
