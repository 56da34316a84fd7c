use std::string::String;

use super::FailingSink;
use crate::CacheFlags;
use crate::reports::{slabinfo, write_slabinfo_line};
use crate::tests::support::*;

#[test]
fn version_2_1_to_the_column() {
    let (alloc, _) = setup(256);
    let cache = alloc
        .cache_create(
            "report-slabinfo",
            100,
            8,
            CacheFlags::empty(),
            None,
            None,
            None,
        )
        .unwrap();
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
    let active = stats.nr_allocated + stats.nr_cpu_cached_objs + stats.nr_depot_objs;
    assert_eq!(
        line,
        std::format!(
            "report-slabinfo   {active:>6} {:>6}    100 {:>4} {:>4} : tunables {:>4} {:>4}    0 : slabdata {:>6} {:>6} {:>6}\n",
            stats.nr_total_objs,
            stats.objs_per_slab,
            stats.nr_pages_per_slab,
            stats.magsize,
            stats.magsize,
            stats.nr_active_slabs,
            stats.nr_slabs,
            stats.nr_depot_objs
        )
    );
    // The name field is 17 wide, then the fixed columns.
    assert_eq!(&line[17..18], " ");
    obj.free().unwrap();
    let mut sink = FailingSink { budget: 30 };
    assert!(slabinfo(&mut sink, alloc).is_err());
}
