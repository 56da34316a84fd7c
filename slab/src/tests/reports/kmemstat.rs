use std::string::String;

use super::FailingSink;
use super::plain_cache;
use crate::PageSource;
use crate::reports::{KmemstatRow, kmemstat, write_kmemstat_caches, write_kmemstat_header};
use crate::tests::support::*;

#[test]
fn header_and_rows_are_akaros_columns() {
    let mut text = String::new();
    write_kmemstat_header(&mut text).unwrap();
    let row = KmemstatRow {
        indent: 1,
        name: "kpages",
        kind: 'A',
        objsize: 4096,
        total: 409600,
        alloc: 8192,
        nr_allocs_ever: 2,
        waste: 0,
    };
    row.write(&mut text).unwrap();
    let lines: std::vec::Vec<&str> = text.lines().collect();
    assert_eq!(
        lines[0],
        "Arena/Slab Name               :Typ: Objsize:      Total Amt:      Alloc Amt: Allocs Ever:       Waste"
    );
    assert_eq!(lines[1], "-".repeat(101));
    assert_eq!(
        lines[2],
        "    kpages                    : A :    4096:         409600:           8192:           2:           0"
    );
    // Every line is as wide as the header.
    assert_eq!(lines[0].len(), lines[2].len());
}

#[test]
fn whole_report_counts_objects_out_of_the_slab_layer() {
    let (alloc, source) = setup(256);
    let cache = plain_cache(alloc, "report-64", 64);
    let objs: std::vec::Vec<_> = (0..3).map(|_| cache.alloc_box().unwrap()).collect();
    let mut text = String::new();
    kmemstat(&mut text, alloc, "pages", source.stats()).unwrap();
    let line = text
        .lines()
        .find(|line| line.trim_start().starts_with("report-64 "))
        .unwrap_or_else(|| panic!("{text}"));
    let fields: std::vec::Vec<&str> = line.split(':').map(str::trim).collect();
    assert_eq!(fields[1], "S");
    assert_eq!(fields[2], "64");
    let stats = cache.stats();
    let out_of_slabs = stats.nr_allocated + stats.nr_cpu_cached_objs + stats.nr_depot_objs;
    assert_eq!(fields[4], std::format!("{}", 64 * out_of_slabs));
    assert_eq!(fields[5], "3");
    assert!(
        line.starts_with("    report-64"),
        "indented under the arena: {line}"
    );
    assert!(text.lines().nth(2).unwrap().starts_with("pages "), "{text}");
    assert!(text.contains("    slab-metadata"), "{text}");
    assert!(
        text.contains("    kmalloc-large             : P :    4096:"),
        "{text}"
    );
    for obj in objs {
        obj.free().unwrap();
    }
}

#[test]
fn a_failing_sink_stops_the_report() {
    let (alloc, _) = setup(64);
    for budget in [0, 10, 200] {
        let mut sink = FailingSink { budget };
        assert!(write_kmemstat_caches(&mut sink, alloc, 2).is_err());
    }
    let mut sink = FailingSink { budget: 1 << 20 };
    assert!(write_kmemstat_caches(&mut sink, alloc, 2).is_ok());
    let mut sink = FailingSink { budget: 0 };
    assert!(write_kmemstat_header(&mut sink).is_err());
}
