use std::string::String;
use std::vec::Vec;

use super::plain_cache;
use super::{FailingSink, TestFormat};
use crate::reports::{
    TRACE_PRINT_CHUNK, TracePrintBuffer, trace_print, trace_print_all, write_trace_record,
};
use crate::tests::support::*;

#[test]
fn record_block_is_akaros_kmem_trace() {
    let (alloc, _) = setup_default();
    let cache = plain_cache(alloc, "report-trace", 48);
    cache.trace_table().start().unwrap();
    let obj = cache.alloc_box().unwrap();
    let mut record = None;
    cache.trace_table().for_each(|r| record = Some(*r));
    let record = record.unwrap();
    let mut text = String::new();
    write_trace_record(&mut text, &record, &TestFormat).unwrap();
    assert_eq!(
        text,
        std::format!(
            "Obj {:#x}, size 48, cpu 0, at {}, from test ctx:\n\
             #01 [<0xffff800000001234>] fn_ffff800000001234\n\
             #02 [<0xffff800000005678>] fn_ffff800000005678\n\n",
            record.addr,
            crate::reports::Nanoseconds(record.timestamp * 1000)
        )
    );
    obj.free().unwrap();
    cache.trace_table().stop();
}

#[test]
fn print_streams_every_record_in_address_order_with_a_site_summary() {
    let (alloc, _) = setup_default();
    let cache = plain_cache(alloc, "report-trace-many", 32);
    cache.trace_table().start().unwrap();
    // More than one chunk.
    let n = TRACE_PRINT_CHUNK * 2 + 5;
    let objs: Vec<_> = (0..n).map(|_| cache.alloc_box().unwrap()).collect();
    let mut buffer = std::boxed::Box::new(TracePrintBuffer::new());
    let mut text = String::new();
    trace_print(&mut text, cache, &mut buffer, &TestFormat).unwrap();
    assert!(text.starts_with(
        "Dumping outstanding allocs from report-trace-many\n-------------------------\n"
    ));
    let addresses: Vec<usize> = text
        .lines()
        .filter_map(|line| line.strip_prefix("Obj 0x"))
        .map(|rest| usize::from_str_radix(rest.split(',').next().unwrap(), 16).unwrap())
        .collect();
    assert_eq!(addresses.len(), n);
    assert!(addresses.windows(2).all(|pair| pair[0] < pair[1]));
    assert!(text.contains(&std::format!(
        "By call site:\n  {n:>6} objects {:>10} bytes  fn_ffff800000001234\n",
        n * 32
    )));
    assert!(text.ends_with(&std::format!(
        "{n} outstanding objects in report-trace-many, 0 records dropped (tracing on)\n"
    )));
    // A failing sink stops the print.
    let mut sink = FailingSink { budget: 100 };
    assert!(trace_print(&mut sink, cache, &mut buffer, &TestFormat).is_err());
    for obj in objs {
        obj.free().unwrap();
    }
    cache.trace_table().stop();
}

#[test]
fn print_all_shows_caches_with_records_and_counts_the_quiet_ones() {
    let (alloc, _) = setup_default();
    let busy = plain_cache(alloc, "report-busy", 32);
    let quiet = plain_cache(alloc, "report-quiet", 32);
    busy.trace_table().start().unwrap();
    quiet.trace_table().start().unwrap();
    let obj = busy.alloc_box().unwrap();
    let mut buffer = std::boxed::Box::new(TracePrintBuffer::new());
    let mut text = String::new();
    trace_print_all(&mut text, alloc, &mut buffer, &TestFormat).unwrap();
    assert!(text.contains("Dumping outstanding allocs from report-busy\n"));
    assert!(!text.contains("report-quiet"));
    assert!(
        text.ends_with("1 more traced caches: no outstanding objects\n"),
        "{text}"
    );
    obj.free().unwrap();
}
