use std::string::String;

use super::FailingSink;
use super::plain_cache;
use crate::reports::{slabinfo, write_slabinfo_line};
use crate::tests::support::*;

#[test]
fn version_2_1_to_the_column() {
    let (alloc, _) = setup(256);
    let cache = plain_cache(alloc, "report-slabinfo", 100);
    let obj = cache.alloc_box().unwrap();
    let mut text = String::new();
    slabinfo(&mut text, alloc).unwrap();
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("slabinfo - version: 2.1"));
    assert_eq!(
        lines.next(),
        Some(
            "# name            <active_objs> <num_objs> <objsize> <objperslab> <pagesperslab> \
             : tunables <limit> <batchcount> <sharedfactor> \
             : slabdata <active_slabs> <num_slabs> <sharedavail>"
        )
    );
    let stats = cache.stats();
    let mut line = String::new();
    write_slabinfo_line(&mut line, "report-slabinfo", &stats).unwrap();
    assert!(text.contains(&line), "{text}");
    // Linux's columns, each where `cache_show` puts it.
    let active = stats.nr_allocated + stats.nr_cpu_cached_objs + stats.nr_depot_objs;
    let fields: std::vec::Vec<&str> = line.split_whitespace().collect();
    let numbers = |range: core::ops::Range<usize>| -> std::vec::Vec<usize> {
        fields[range]
            .iter()
            .map(|field| field.parse().unwrap())
            .collect()
    };
    assert_eq!(fields[0], "report-slabinfo");
    assert_eq!(
        numbers(1..6),
        [
            active,
            stats.nr_total_objs,
            100,
            stats.objs_per_slab,
            stats.nr_pages_per_slab
        ]
    );
    assert_eq!(fields[6..8], [":", "tunables"]);
    assert_eq!(numbers(8..11), [stats.magsize, stats.magsize, 0]);
    assert_eq!(fields[11..13], [":", "slabdata"]);
    assert_eq!(
        numbers(13..16),
        [stats.nr_active_slabs, stats.nr_slabs, stats.nr_depot_objs]
    );
    assert_eq!(
        line.len(),
        17 + 7 * 3 + 5 * 2 + " : tunables".len() + 5 * 3 + " : slabdata".len() + 7 * 3 + 1
    );
    // The name field is 17 wide, then the fixed columns.
    assert_eq!(&line[17..18], " ");
    obj.free().unwrap();
    let mut sink = FailingSink { budget: 30 };
    assert!(slabinfo(&mut sink, alloc).is_err());
}
