//! The corruption matrix with `slab_debug=FZPU`: nine kinds (write after
//! free at offsets 0, 8, 32 and the last byte, overflow by 1 and by 64
//! bytes, underflow by 1 and by 8 bytes, read after free) on a small-slab
//! and a bufctl cache, 18 in all. Every one is detected: reported (with
//! the object and the offset) or, for the read, seen as poison. The
//! underflows are caught by the left redzone (issue 19).

use crate::CacheArgs;
use std::ptr::NonNull;
use std::vec::Vec;

use super::debug::{errors_since, read_u64, write};
use super::support::*;
use crate::debug::{LEFT_REDZONE_PATTERN, POISON_FREE};
use crate::layout::geometry::SlabKind;
use crate::reports::error::{ErrorKind, RawFormat};
use crate::{CacheFlags, KmemCache};

type Cache = KmemCache<TestPlatform>;

/// A byte at `offset` (negative: before the object) of `obj`.
fn poke(obj: NonNull<u8>, offset: isize, byte: u8) {
    let at = (obj.as_ptr() as usize).wrapping_add_signed(offset);
    write(NonNull::new(at as *mut u8).unwrap(), 0, byte);
}

fn fzpu_cache(alloc: &'static TestAlloc, size: usize) -> &'static Cache {
    let flags =
        CacheFlags::CONSISTENCY | CacheFlags::REDZONE | CacheFlags::POISON | CacheFlags::AUDIT;
    alloc
        .cache_create(
            "fzpu",
            size,
            &CacheArgs {
                align: 8,
                flags,
                ..CacheArgs::DEFAULT
            },
        )
        .unwrap()
}

/// One kind: corrupt a fresh object as `kind` says, then let the
/// allocator look (verify, free, alloc again). Whether it was detected,
/// and the offset the first report gives.
fn detected(alloc: &'static TestAlloc, cache: &'static Cache, kind: &str) -> (bool, Option<usize>) {
    let size = cache.obj_size() as isize;
    let before = alloc.debug().nr_errors();
    let obj = cache.alloc_box().unwrap();
    let p = obj.as_ptr();
    match kind {
        "overflow by 1" => poke(p, size, 0x41),
        "overflow by 64" => (0..size + 64).for_each(|at| poke(p, at, 0x41)),
        "underflow by 1" => poke(p, -1, 0x41),
        "underflow by 8" => (-8..0).for_each(|at| poke(p, at, 0x41)),
        _ => {}
    }
    let verified = cache.verify().nr_problems > 0;
    obj.free().unwrap();
    let waf = |offset: isize| poke(p, offset, 0x41);
    let read_poison = match kind {
        "write after free at 0" => {
            waf(0);
            false
        }
        "write after free at 8" => {
            waf(8);
            false
        }
        "write after free at 32" => {
            waf(32);
            false
        }
        "write after free at the last byte" => {
            waf(size - 1);
            false
        }
        "read after free" => read_u64(p, 8) == POISON_FREE,
        _ => false,
    };
    // Hand every object out again: the freed one among them.
    let again: Vec<_> = (0..8).map(|_| cache.alloc_box().unwrap()).collect();
    for obj in again {
        obj.free().unwrap();
    }
    let later = cache.verify().nr_problems > 0;
    let errors = errors_since(alloc, before);
    let reported = errors.iter().any(|e| {
        matches!(
            e.kind,
            ErrorKind::RedzoneViolation | ErrorKind::ModifiedAfterFree | ErrorKind::BadState
        ) && e.object == p.as_ptr() as usize
    });
    let offset = errors.first().and_then(|e| e.offset());
    (reported || verified || later || read_poison, offset)
}

const KINDS: [&str; 9] = [
    "write after free at 0",
    "write after free at 8",
    "write after free at 32",
    "write after free at the last byte",
    "overflow by 1",
    "overflow by 64",
    "underflow by 1",
    "underflow by 8",
    "read after free",
];

#[test]
fn every_corruption_kind_detected_with_fzpu() {
    let mut missed = Vec::new();
    let mut nr = 0;
    for (size, slab_kind) in [(64, SlabKind::Small), (12288, SlabKind::Bufctl)] {
        let (alloc, _) = setup(4096);
        let cache = fzpu_cache(alloc, size);
        assert_eq!(cache.stats().kind, slab_kind);
        for kind in KINDS {
            nr += 1;
            let (found, offset) = detected(alloc, cache, kind);
            if !found {
                missed.push((size, kind));
            }
            // The underflows are reported before the object, byte exact.
            match kind {
                "underflow by 1" => assert_eq!(offset, Some(usize::MAX), "{size}"),
                "underflow by 8" => assert_eq!(offset, Some(8usize.wrapping_neg()), "{size}"),
                _ => {}
            }
        }
    }
    set_cpu(0);
    std::println!(
        "corruption kinds detected, FZPU: {}/{nr}",
        nr - missed.len()
    );
    assert!(missed.is_empty(), "missed: {missed:?}");
    assert_eq!(nr, 18);
}

#[test]
fn left_redzone_keeps_objects_aligned_and_is_repaired() {
    let (alloc, _) = setup(1024);
    let cache = alloc
        .cache_create(
            "left-64",
            100,
            &CacheArgs {
                align: 64,
                flags: CacheFlags::REDZONE,
                ..CacheArgs::DEFAULT
            },
        )
        .unwrap();
    let objs: Vec<_> = (0..20).map(|_| cache.alloc_box().unwrap()).collect();
    for obj in &objs {
        let p = obj.as_ptr();
        assert_eq!(p.as_ptr() as usize % 64, 0);
        let left = NonNull::new((p.as_ptr() as usize - 8) as *mut u8).unwrap();
        assert_eq!(read_u64(left, 0), LEFT_REDZONE_PATTERN);
    }
    // An underflow of the first object of the slab, then its free: one
    // report, the redzone repaired, nothing else disturbed.
    let first = objs.iter().map(|obj| obj.as_ptr()).min().unwrap();
    poke(first, -1, 0);
    let before = alloc.debug().nr_errors();
    for obj in objs {
        obj.free().unwrap();
    }
    let errors = errors_since(alloc, before);
    assert_eq!(errors.len(), 1);
    assert_eq!(errors[0].kind, ErrorKind::RedzoneViolation);
    assert_eq!(errors[0].object, first.as_ptr() as usize);
    let text = std::format!("{}", errors[0].display(&RawFormat));
    assert!(
        text.contains("modification occurred at offset -0x1 ("),
        "{text}"
    );
    assert_eq!(cache.verify().nr_problems, 0);
    cache.reap();
    assert_eq!(cache.stats().nr_slabs, 0);
}
