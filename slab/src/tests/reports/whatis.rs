use std::string::String;

use super::TestFormat;
use crate::CacheFlags;
use crate::reports::whatis;
use crate::tests::support::*;

#[test]
fn allocated_free_and_foreign_addresses() {
    let (alloc, _) = setup_default();
    let cache = alloc
        .cache_create(
            "report-whatis",
            64,
            8,
            CacheFlags::empty(),
            None,
            None,
            None,
        )
        .unwrap();
    let obj = cache.alloc_box().unwrap();
    let address = obj.as_ptr().as_ptr() as usize;
    let mut text = String::new();
    whatis(&mut text, alloc, address + 0x10, &TestFormat).unwrap();
    assert!(
        text.starts_with(&std::format!(
            "{:#x} is allocated from report-whatis: object {address:#x}+0x10 of 64 bytes, slab 0x",
            address + 0x10
        )),
        "{text}"
    );
    obj.free().unwrap();
    let mut text = String::new();
    whatis(&mut text, alloc, address, &TestFormat).unwrap();
    assert!(text.contains(" is free in report-whatis (in a "), "{text}");
    let mut text = String::new();
    whatis(&mut text, alloc, 0x1000, &TestFormat).unwrap();
    assert_eq!(text, "0x1000 is not in any slab\n");
}
