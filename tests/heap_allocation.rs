//! Heavy use of Box, Vec and String through the global allocator.

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

use alloc::boxed::Box;
use alloc::collections::BTreeMap;
use alloc::string::{String, ToString};
use alloc::vec;
use alloc::vec::Vec;

use magpie::kmem::SLAB;

magpie::test_kernel!();

#[test_case]
fn simple_box() {
    let a = Box::new(41);
    let b = Box::new(13);
    assert_eq!(*a + *b, 54);
}

#[test_case]
fn large_vec() {
    let n = 100_000u64;
    let mut vec = Vec::new();
    for i in 0..n {
        vec.push(i);
    }
    assert_eq!(vec.iter().sum::<u64>(), (n - 1) * n / 2);
}

#[test_case]
fn one_big_allocation() {
    let big = vec![0x5au8; 1 << 20];
    assert!(big.iter().all(|&byte| byte == 0x5a));
}

#[test_case]
fn many_boxes_reuse_memory() {
    // Far more than the heap could hold if frees were not reused.
    for i in 0..200_000usize {
        let x = Box::new([i; 8]);
        assert_eq!(x[7], i);
    }
}

#[test_case]
fn many_boxes_long_lived() {
    let long_lived = Box::new(1);
    for i in 0..50_000usize {
        let x = Box::new(i);
        assert_eq!(*x, i);
    }
    assert_eq!(*long_lived, 1);
}

#[test_case]
fn strings_and_formatting() {
    let mut text = String::new();
    for i in 0..2_000 {
        text.push_str(&i.to_string());
        text.push(',');
    }
    assert!(text.starts_with("0,1,2,3"));
    assert!(text.ends_with("1999,"));
    let words: Vec<String> = text
        .split(',')
        .filter(|word| !word.is_empty())
        .map(String::from)
        .collect();
    assert_eq!(words.len(), 2_000);
    assert_eq!(words[1234], "1234");
}

#[test_case]
fn mixed_sizes_interleaved() {
    let mut live: Vec<Vec<u8>> = Vec::new();
    for round in 0..2_000usize {
        let size = (round * 37) % 3000 + 1;
        live.push(vec![(round % 251) as u8; size]);
        if round % 3 == 0 {
            let victim = (round * 7) % live.len();
            live.swap_remove(victim);
        }
    }
    for buffer in &live {
        let first = buffer[0];
        assert!(buffer.iter().all(|&byte| byte == first));
    }
}

#[test_case]
fn btree_map() {
    let mut map = BTreeMap::new();
    for i in 0..10_000u32 {
        map.insert(i.wrapping_mul(2_654_435_761), i);
    }
    assert_eq!(map.len(), 10_000);
    assert_eq!(
        map.values().map(|&v| u64::from(v)).sum::<u64>(),
        9_999 * 10_000 / 2
    );
}

#[test_case]
fn usage_returns_to_baseline() {
    // Once the slab allocator is up, Box/Vec go through its kmalloc caches
    // and the bootstrap heap no longer grows.
    let kmalloc_104 = SLAB.find_cache("kmalloc-104").expect("kmalloc-104 exists");
    let (bootstrap_before, _) = magpie::kmem::heap::bootstrap_usage();
    let before = kmalloc_104.stats().nr_allocated;
    {
        let data: Vec<Box<[u8; 100]>> = (0..1000).map(|_| Box::new([7u8; 100])).collect();
        assert_eq!(kmalloc_104.stats().nr_allocated, before + 1000);
        assert!(data.iter().all(|b| b.iter().all(|&x| x == 7)));
    }
    assert_eq!(kmalloc_104.stats().nr_allocated, before);
    assert_eq!(magpie::kmem::heap::bootstrap_usage().0, bootstrap_before);
}
