use crate::CacheArgs;
use std::string::String;

use super::TestFormat;
use super::plain_cache;
use crate::CacheFlags;
use crate::reports::whatis;
use crate::tests::support::*;

#[test]
fn allocated_free_and_foreign_addresses() {
    let (alloc, _) = setup_default();
    let cache = plain_cache(alloc, "report-whatis", 64);
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

/// Under `slab_debug` an address past the object is named for what it is
/// (redzone, trailer fields, padding), never "+0x88 of 104 bytes".
#[test]
fn offsets_past_a_debug_object_are_redzone_or_trailer() {
    use crate::ObjectRegion;
    let (alloc, _) = setup_default();
    let flags = CacheFlags::POISON | CacheFlags::REDZONE | CacheFlags::AUDIT | CacheFlags::CONTENTS;
    let cache = alloc
        .cache_create(
            "report-whatis-debug",
            104,
            &CacheArgs {
                align: 8,
                flags,
                ..CacheArgs::DEFAULT
            },
        )
        .unwrap();
    let obj = cache.alloc_box().unwrap();
    let start = obj.as_ptr().as_ptr() as usize;
    let region = |offset: usize| alloc.debug().whatis(start + offset).unwrap().region;
    assert_eq!(region(0), ObjectRegion::Object);
    assert_eq!(region(103), ObjectRegion::Object);
    assert_eq!(region(104), ObjectRegion::Redzone);
    // The redzone is the object rounded up to 8, plus 8: [104, 112).
    assert_eq!(region(111), ObjectRegion::Redzone);
    assert_eq!(region(112), ObjectRegion::StateWord);
    assert_eq!(region(120), ObjectRegion::FreeListLink);
    assert_eq!(region(128), ObjectRegion::RequestedSize);
    assert_eq!(region(0x88), ObjectRegion::AuditRecords);
    let mut text = String::new();
    whatis(&mut text, alloc, start + 0x88, &TestFormat).unwrap();
    assert!(
        text.starts_with(&std::format!(
            "{:#x} is allocated from report-whatis-debug: debug trailer (audit records) of object {start:#x} (+0x88, past its 104 bytes), slab 0x",
            start + 0x88
        )),
        "{text}"
    );
    let mut text = String::new();
    whatis(&mut text, alloc, start + 104, &TestFormat).unwrap();
    assert!(text.contains(": redzone of object "), "{text}");
    obj.free().unwrap();
    // A plain cache's stride past the object is padding.
    let plain = plain_cache(alloc, "report-whatis-pad", 20);
    let obj = plain.alloc_box().unwrap();
    let start = obj.as_ptr().as_ptr() as usize;
    assert_eq!(
        alloc.debug().whatis(start + 21).unwrap().region,
        ObjectRegion::Padding
    );
    obj.free().unwrap();
}
