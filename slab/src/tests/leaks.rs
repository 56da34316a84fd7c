//! Leaks by reachability (`leaks.rs`): objects nothing points to are
//! reported, exactly; objects reachable from the roots (directly or
//! through other objects) and objects resting in magazines are not.

use std::boxed::Box;
use std::string::String;
use std::vec::Vec;

use super::debug::write;
use super::support::*;
use crate::leaks::{LeakGroup, write_findleaks_header, write_findleaks_row, write_findleaks_total};
use crate::{CacheFlags, SlabBox};

/// Scan with `roots` (each a slice of words), collecting the groups.
fn scan(
    alloc: &TestAlloc,
    roots: &[&[usize]],
) -> (crate::leaks::LeakSummary, Vec<LeakGroup<TestPlatform>>) {
    let mut groups = Vec::new();
    let summary = alloc
        .find_leaks_in(roots, &mut |group| groups.push(*group))
        .unwrap();
    (summary, groups)
}

#[test]
fn unreachable_objects_are_reported_exactly() {
    let (alloc, _) = setup(1024);
    let cache = alloc
        .cache_create("leaky", 64, 8, CacheFlags::empty(), None, None, None)
        .unwrap();
    let other = alloc
        .cache_create("held", 200, 8, CacheFlags::empty(), None, None, None)
        .unwrap();
    let held: Vec<SlabBox<TestPlatform>> = (0..10).map(|_| cache.alloc_box().unwrap()).collect();
    let leaked: Vec<SlabBox<TestPlatform>> = (0..10).map(|_| cache.alloc_box().unwrap()).collect();
    // Reachable only through another object: a chain root -> head -> tail.
    let head = other.alloc_box().unwrap();
    let tail = other.alloc_box().unwrap();
    let inside_tail = tail.as_ptr().as_ptr() as usize + 40;
    for (at, byte) in inside_tail.to_le_bytes().into_iter().enumerate() {
        write(head.as_ptr(), 24 + at, byte);
    }
    // Freed objects rest in the magazines: never counted.
    for _ in 0..5 {
        cache.alloc_box().unwrap().free().unwrap();
    }
    let mut roots: Vec<usize> = held
        .iter()
        .map(|obj| obj.as_ptr().as_ptr() as usize)
        .collect();
    // An interior pointer keeps its object too.
    roots.push(head.as_ptr().as_ptr() as usize + 17);
    let roots = Box::leak(roots.into_boxed_slice());

    let (summary, groups) = scan(alloc, &[roots]);
    assert_eq!(summary.nr_objects, 22);
    assert_eq!((summary.nr_leaked, summary.bytes_leaked), (10, 640));
    assert_eq!(groups.len(), 1);
    assert_eq!(groups[0].cache.name(), "leaky");
    assert_eq!(groups[0].nr_leaked, 10);
    let lowest = leaked
        .iter()
        .map(|obj| obj.as_ptr().as_ptr() as usize)
        .min();
    assert_eq!(Some(groups[0].first), lowest);

    // The ::findleaks layout.
    let mut text = String::new();
    write_findleaks_header(&mut text).unwrap();
    for group in &groups {
        write_findleaks_row(&mut text, group, &"cmd_leak").unwrap();
    }
    write_findleaks_total(&mut text, &summary).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines[0].starts_with("CACHE") && lines[0].ends_with("LEAKED             BUFCTL CALLER"),
        "{text}"
    );
    assert!(
        lines[1].contains("    10 ") && lines[1].ends_with(" cmd_leak (leaky)"),
        "{text}"
    );
    assert!(lines[2].starts_with("-----"));
    assert_eq!(lines[3].trim(), "Total     10 buffers, 640 bytes");

    // Once the roots forget them, the held ones leak too; the chain's tail
    // goes with its head.
    roots.fill(0);
    let (summary, _) = scan(alloc, &[roots]);
    assert_eq!(summary.nr_leaked, 22);
    for obj in held.into_iter().chain(leaked).chain([head, tail]) {
        obj.free().unwrap();
    }
    let (summary, groups) = scan(alloc, &[roots]);
    assert_eq!(
        (summary.nr_objects, summary.nr_leaked, groups.len()),
        (0, 0, 0)
    );
}
