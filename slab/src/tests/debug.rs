//! Slab debugging: every kind of error is detected, reported once with the
//! right kind, cache, object and offset, and nothing is lost; hardened
//! free lists; double frees without debug flags.

use crate::CacheArgs;
use std::boxed::Box;
use std::format;
use std::ptr::NonNull;
use std::vec::Vec;

use super::support::*;
use crate::debug::{DebugFlags, POISON_FREE, POISON_UNINITIALIZED, SlabDebugConfig};
use crate::reports::error::{ErrorKind, ErrorReport, RawFormat};
use crate::{CacheFlags, FreeError, Kmem, KmemCache};

/// An allocator initialised with `config` (kmalloc caches get its flags).
pub fn setup_debug(config: SlabDebugConfig) -> (&'static TestAlloc, &'static FakeSource) {
    set_cpu(0);
    let source = FakeSource::new(2048);
    let alloc: &'static TestAlloc = Box::leak(Box::new(Kmem::new()));
    alloc.debug().set_config(config);
    alloc.init(source).expect("init");
    (alloc, source)
}

/// Reports made since `after`, oldest first.
pub fn errors_since(alloc: &TestAlloc, after: u64) -> Vec<ErrorReport> {
    let mut out = [ErrorReport::new(ErrorKind::InvalidFree, "", 0); 16];
    let nr = alloc.debug().read_errors(after, &mut out);
    out[..nr].to_vec()
}

pub(super) fn write(ptr: NonNull<u8>, offset: usize, byte: u8) {
    // SAFETY: tests write into (or just past) memory of a live slab.
    unsafe { ptr.as_ptr().add(offset).write(byte) };
}

pub(super) fn read_u64(ptr: NonNull<u8>, offset: usize) -> u64 {
    // SAFETY: tests read memory of a live slab.
    unsafe { ptr.as_ptr().add(offset).cast::<u64>().read_unaligned() }
}

fn debug_cache(
    alloc: &'static TestAlloc,
    name: &str,
    size: usize,
) -> &'static KmemCache<TestPlatform> {
    let flags = CacheFlags::POISON | CacheFlags::REDZONE | CacheFlags::AUDIT | CacheFlags::CONTENTS;
    alloc
        .cache_create(
            name,
            size,
            &CacheArgs {
                align: 8,
                flags,
                ..CacheArgs::DEFAULT
            },
        )
        .unwrap()
}

#[test]
fn write_after_free_is_reported_at_the_next_alloc_with_offset_and_stacks() {
    let (alloc, _) = setup_default();
    let cache = debug_cache(alloc, "waf", 64);
    let obj = cache.alloc_box().unwrap();
    let p = obj.as_ptr();
    // A POISON cache hands out 0xbaddcafe, not zeroes.
    assert_eq!(read_u64(p, 8), POISON_UNINITIALIZED);
    write(p, 0, 0x41);
    obj.free().unwrap();
    assert_eq!(read_u64(p, 8), POISON_FREE);
    let before = alloc.debug().nr_errors();
    write(p, 0x1a, 0x41);
    // LIFO magazines: the same object comes back, and its poison is checked.
    let q = cache.alloc_box().unwrap();
    assert_eq!(q.as_ptr(), p);
    let errors = errors_since(alloc, before);
    assert_eq!(errors.len(), 1, "{errors:?}");
    let report = errors[0];
    assert_eq!(report.kind, ErrorKind::ModifiedAfterFree);
    assert_eq!(report.cache.as_str(), "waf");
    assert_eq!(report.object, p.as_ptr() as usize);
    assert_eq!(report.offset(), Some(0x18));
    let mismatch = report.corruption.unwrap();
    assert_eq!(mismatch.expected, POISON_FREE);
    assert_eq!(mismatch.found, 0xdead_beef_de41_beef);
    // AUDIT: the last free (and alloc) are in the report.
    let free = report.last_free.unwrap();
    assert_eq!(free.frames(), &FAKE_FRAMES);
    assert!(report.last_alloc.unwrap().timestamp < free.timestamp);
    // CONTENTS: the first bytes at the free.
    assert_eq!(report.contents.unwrap()[0], 0x41);
    let text = format!("{}", report.display(&RawFormat));
    assert!(
        text.starts_with(
            "kernel memory allocator: buffer modified after being freed\n\
         modification occurred at offset 0x18 (0xdeadbeefdeadbeef replaced by 0xdeadbeefde41beef)\n"
        ),
        "{text}"
    );
    assert!(
        text.contains("cache: waf\nprevious transaction on buffer"),
        "{text}"
    );
    // Repaired and handed out: nothing lost, no second report.
    q.free().unwrap();
    cache.alloc_box().unwrap().free().unwrap();
    assert_eq!(alloc.debug().nr_errors(), before + 1);
    assert_eq!(cache.verify().nr_problems, 0);
}

#[test]
fn linear_overflow_is_a_redzone_violation_at_free() {
    let (alloc, _) = setup_default();
    let cache = debug_cache(alloc, "overflow", 50);
    let p = cache.alloc_box().unwrap();
    let addr = p.as_ptr().as_ptr() as usize;
    let before = alloc.debug().nr_errors();
    write(p.as_ptr(), 50, 0x41);
    // Verify sees it on the live object, without changing it.
    let summary = cache.verify();
    assert_eq!(summary.nr_problems, 1);
    let errors = errors_since(alloc, before);
    assert_eq!(errors[0].kind, ErrorKind::RedzoneViolation);
    assert_eq!(errors[0].offset(), Some(50));
    // The free reports it again (the bug is still there), repairs, goes on.
    p.free().unwrap();
    let errors = errors_since(alloc, before + 1);
    assert_eq!(errors.len(), 1);
    assert_eq!(errors[0].kind, ErrorKind::RedzoneViolation);
    assert_eq!(errors[0].object, addr);
    assert_eq!(cache.stats().nr_allocated, 0);
    assert_eq!(cache.verify().nr_problems, 0);
}

#[test]
fn duplicate_free_anywhere_is_refused_with_flags() {
    let (alloc, _) = setup_default();
    let cache = debug_cache(alloc, "dup", 64);
    let boxes: Vec<_> = (0..40).map(|_| cache.alloc_box().unwrap()).collect();
    let objs: Vec<_> = boxes.iter().map(|obj| obj.as_ptr()).collect();
    for obj in boxes {
        obj.free().unwrap();
    }
    let before = alloc.debug().nr_errors();
    let stats = cache.stats();
    // Deep in a magazine, in the depot, or (after a reap) in its slab.
    for &obj in [objs[0], objs[20], objs[39]].iter() {
        // SAFETY: refused.
        let refused = unsafe { cache.free(obj) };
        assert_eq!(
            refused,
            Err(FreeError::DoubleFree {
                addr: obj.as_ptr() as usize
            })
        );
    }
    assert_eq!(cache.stats().nr_allocated, stats.nr_allocated);
    let errors = errors_since(alloc, before);
    assert_eq!(errors.len(), 3);
    assert!(
        errors
            .iter()
            .all(|e| e.kind == ErrorKind::DuplicateFree && e.cache.as_str() == "dup")
    );
    assert!(errors[0].last_free.is_some());
    assert_eq!(cache.verify().nr_problems, 0);
}

#[test]
fn bad_frees_get_one_report_each() {
    let (alloc, _) = setup_default();
    let a = debug_cache(alloc, "a", 64);
    let b = debug_cache(alloc, "b", 64);
    let obj = a.alloc_box().unwrap();
    let p = obj.as_ptr();
    let before = alloc.debug().nr_errors();
    // SAFETY: all refused.
    unsafe {
        assert!(b.free(p).is_err());
        assert!(a.free(NonNull::new(p.as_ptr().add(8)).unwrap()).is_err());
        let mut on_stack = 0u64;
        assert!(a.free(NonNull::from(&mut on_stack).cast()).is_err());
    }
    let errors = errors_since(alloc, before);
    let kinds: Vec<_> = errors.iter().map(|e| e.kind).collect();
    assert_eq!(
        kinds,
        [
            ErrorKind::WrongCache,
            ErrorKind::InvalidFree,
            ErrorKind::ForeignPointer
        ]
    );
    assert_eq!(errors[0].owner.unwrap().as_str(), "a");
    assert_eq!(errors[0].cache.as_str(), "b");
    assert_eq!(errors[1].object, p.as_ptr() as usize);
    assert_eq!(errors[1].offset(), Some(8));
    obj.free().unwrap();
}

#[test]
fn slab_debug_boot_config_reaches_kmalloc_caches() {
    let config = SlabDebugConfig::parse_slab_debug(Some("FZPU,kmalloc-64")).unwrap();
    let (alloc, _) = setup_debug(config);
    assert_eq!(
        alloc.find_cache("kmalloc-64").unwrap().debug_flags(),
        DebugFlags::DEFAULT
    );
    assert_eq!(
        alloc.find_cache("kmalloc-128").unwrap().debug_flags(),
        DebugFlags::empty()
    );
    let obj = alloc.kmalloc_box(64, 8).unwrap();
    let p = obj.as_ptr();
    obj.free().unwrap();
    let before = alloc.debug().nr_errors();
    write(p, 0, 0);
    let q = alloc.kmalloc(60, 8).unwrap();
    assert_eq!(q, p);
    let errors = errors_since(alloc, before);
    assert_eq!(errors.len(), 1);
    assert_eq!(errors[0].kind, ErrorKind::ModifiedAfterFree);
    assert_eq!(errors[0].cache.as_str(), "kmalloc-64");
    assert_eq!(errors[0].offset(), Some(0));
    // SAFETY: allocated above; then a double free through kfree.
    unsafe {
        alloc.kfree(q).unwrap();
        assert!(alloc.kfree(q).is_err());
    }
    assert_eq!(
        errors_since(alloc, before + 1)[0].kind,
        ErrorKind::DuplicateFree
    );
    // Caches created later get the flags by name too.
    let config = SlabDebugConfig::parse_slab_debug(Some("P,inode*")).unwrap();
    let (alloc, _) = setup_debug(config);
    let inode = alloc
        .cache_create(
            "inode_cache",
            100,
            &CacheArgs {
                align: 8,
                ..CacheArgs::DEFAULT
            },
        )
        .unwrap();
    assert!(inode.debug_flags().contains(DebugFlags::POISON));
}

#[test]
#[expect(clippy::cast_ptr_alignment, reason = "object starts are 8-aligned")]
fn freelist_overwrite_without_flags_never_hands_out_foreign_memory() {
    let (alloc, source) = setup_default();
    let cache = alloc
        .cache_create(
            "plain",
            64,
            &CacheArgs {
                align: 8,
                ..CacheArgs::DEFAULT
            },
        )
        .unwrap();
    // Fill a slab, free everything, reap the magazines into the slab layer.
    let boxes: Vec<_> = (0..60).map(|_| cache.alloc_box().unwrap()).collect();
    let objs: Vec<_> = boxes.iter().map(|obj| obj.as_ptr()).collect();
    let keep = cache.alloc_box().unwrap();
    for obj in boxes {
        obj.free().unwrap();
    }
    cache.reap();
    let before = alloc.debug().nr_errors();
    // Use after free: overwrite every free object's first word with an
    // address of the attacker's choosing.
    let target = Box::leak(Box::new([0u8; 64])).as_mut_ptr() as usize;
    for &obj in &objs {
        // SAFETY: test: scribble over freed slab memory.
        unsafe { obj.as_ptr().cast::<usize>().write(target) };
    }
    let mut got = Vec::new();
    for _ in 0..200 {
        let obj = cache.alloc_box().unwrap();
        assert!(
            source.contains(obj.as_ptr().as_ptr() as usize),
            "foreign pointer handed out"
        );
        assert!(alloc.owns(obj.as_ptr().as_ptr()));
        got.push(obj);
    }
    let mut addrs: Vec<_> = got.iter().map(|obj| obj.as_ptr()).collect();
    addrs.sort();
    addrs.dedup();
    assert_eq!(addrs.len(), 200, "an object was handed out twice");
    let errors = errors_since(alloc, before);
    assert!(!errors.is_empty());
    assert!(
        errors
            .iter()
            .all(|e| e.kind == ErrorKind::FreeListCorrupted)
    );
    for obj in got {
        obj.free().unwrap();
    }
    keep.free().unwrap();
}

#[test]
fn double_free_without_flags_naive_and_slab_layer() {
    let (alloc, _) = setup_default();
    let cache = alloc
        .cache_create(
            "plain-df",
            64,
            &CacheArgs {
                align: 8,
                ..CacheArgs::DEFAULT
            },
        )
        .unwrap();
    let p = cache.alloc().unwrap();
    let keep = cache.alloc_box().unwrap();
    let before = alloc.debug().nr_errors();
    // Linux's naive check: the object on top of the loaded magazine.
    // SAFETY: freed once, then refused.
    unsafe {
        cache.free(p).unwrap();
        assert_eq!(
            cache.free(p),
            Err(FreeError::DoubleFree {
                addr: p.as_ptr() as usize
            })
        );
    }
    // Back in its slab: the slab layer's bitmap sees it.
    cache.reap();
    // SAFETY: refused.
    unsafe {
        assert!(cache.free(p).is_err());
    }
    let errors = errors_since(alloc, before);
    assert_eq!(errors.len(), 2);
    assert!(errors.iter().all(|e| e.kind == ErrorKind::DuplicateFree));
    // The slab still counts `keep`: reap must not free its page.
    cache.reap();
    assert_eq!(cache.stats().nr_slabs, 1);
    keep.free().unwrap();
    cache.reap();
    assert_eq!(cache.stats().nr_slabs, 0);
}

#[test]
fn whatis_names_cache_object_offset_and_state() {
    let (alloc, _) = setup_default();
    let cache = debug_cache(alloc, "whatis", 96);
    let p = cache.alloc_box().unwrap();
    let inside = p.as_ptr().as_ptr() as usize + 0x10;
    let info = alloc.debug().whatis(inside).unwrap();
    assert_eq!(info.cache.name(), "whatis");
    assert_eq!(info.object, p.as_ptr().as_ptr() as usize);
    assert_eq!(info.offset, 0x10);
    assert!(info.allocated);
    assert!(info.last_alloc.is_some());
    let text = format!("{info}");
    assert!(text.contains("is allocated from whatis"), "{text}");
    p.free().unwrap();
    let info = alloc.debug().whatis(inside).unwrap();
    assert!(!info.allocated);
    assert!(format!("{info}").contains("is free in whatis"));
    let mut on_stack = 0u8;
    assert!(alloc.debug().whatis((&raw mut on_stack) as usize).is_none());
}

#[test]
fn verify_walks_every_cache_and_counts() {
    let config = SlabDebugConfig::parse_slab_debug(None).unwrap();
    let (alloc, _) = setup_debug(config);
    let objs: Vec<_> = (1..=8)
        .map(|i| alloc.kmalloc_box(i * 60, 8).unwrap())
        .collect();
    let summary = alloc.debug().verify();
    assert!(summary.nr_slabs > 0 && summary.nr_objects > 0);
    assert_eq!(summary.nr_problems, 0);
    for obj in objs {
        obj.free().unwrap();
    }
    #[cfg(debug_assertions)]
    alloc.debug().check_invariants().unwrap();
}

#[test]
fn page_granular_double_free_is_a_duplicate_free_with_its_size() {
    let (alloc, source) = setup_default();
    let baseline = source.pages_outstanding();
    // Three pages, and three pages aligned to four (lead and trail slack).
    for (size, align, nr_pages) in [(3 * 4096 - 100, 8, 3), (3 * 4096, 4 * 4096, 3)] {
        let block = alloc.kmalloc(size, align).unwrap();
        let addr = block.as_ptr() as usize;
        assert!(alloc.owns(block.as_ptr()));
        let before = alloc.debug().nr_errors();
        // SAFETY: allocated above; the second free is refused.
        unsafe {
            alloc.kfree(block).unwrap();
            assert!(!alloc.owns(block.as_ptr()), "a freed block is not ours");
            assert_eq!(alloc.kfree(block), Err(FreeError::DoubleFree { addr }));
            // Stays a duplicate free, however often.
            assert_eq!(alloc.kfree(block), Err(FreeError::DoubleFree { addr }));
            // A pointer inside the freed block, or freed to a cache: not ours.
            let inner = NonNull::new_unchecked(block.as_ptr().add(4096));
            assert_eq!(
                alloc.kfree(inner),
                Err(FreeError::NotAllocated { addr: addr + 4096 })
            );
            let cache = alloc.stats().kmalloc_cache_for(64, 8).unwrap();
            assert_eq!(cache.free(block), Err(FreeError::NotAllocated { addr }));
        }
        assert_eq!(alloc.ksize(block), Err(FreeError::NotAllocated { addr }));
        let errors = errors_since(alloc, before);
        assert_eq!(errors.len(), 4, "{errors:?}");
        for report in &errors[..2] {
            assert_eq!(report.kind, ErrorKind::DuplicateFree);
            assert_eq!(report.cache.as_str(), "kmalloc");
            assert_eq!((report.buffer, report.object), (addr, addr));
            assert_eq!(report.size, nr_pages * 4096);
        }
        assert_eq!(errors[2].kind, ErrorKind::ForeignPointer);
        assert_eq!(errors[2].size, 0);
        let text = format!("{}", errors[0].display(&RawFormat));
        assert!(
            text.starts_with("kernel memory allocator: duplicate free: buffer freed twice\n"),
            "{text}"
        );
        assert!(
            text.contains(&format!(
                "whole pages (kmalloc): {nr_pages} pages, {} bytes",
                nr_pages * 4096
            )),
            "{text}"
        );
        assert!(text.contains(&format!("buffer={addr:#x}")), "{text}");
        // Nothing was lost: every page went back once.
        assert_eq!(alloc.stats().large().nr_live, 0);
        assert_eq!(source.pages_outstanding(), baseline);
    }
    // Once the pages serve again, the entry is the new owner's: the new
    // block frees normally (the stale pointer is the new block's now).
    let first = alloc.kmalloc_box(2 * 4096 + 1, 8).unwrap();
    let first_ptr = first.as_ptr();
    first.free().unwrap();
    let again = alloc.kmalloc_box(2 * 4096 + 1, 8).unwrap();
    assert_eq!(again.as_ptr(), first_ptr, "the same pages (first fit)");
    assert!(alloc.owns(again.as_ptr().as_ptr()));
    again.free().unwrap();
    assert_eq!(source.pages_outstanding(), baseline);
}

/// With `REDZONE`, a kmalloc object's redzone starts at the size asked
/// for (Linux `orig_size`): an overflow into the class's padding is caught.
#[test]
fn kmalloc_overflow_into_the_class_padding_is_a_redzone_violation() {
    let config = SlabDebugConfig::parse_slab_debug(Some("FZPU,kmalloc-104")).unwrap();
    let (alloc, _) = setup_debug(config);
    let cache = alloc.find_cache("kmalloc-104").unwrap();
    let before = alloc.debug().nr_errors();
    // All 100 bytes asked for are usable; nothing is reported.
    let obj = alloc.kmalloc_box(100, 8).unwrap();
    assert_eq!(alloc.ksize(obj.as_ptr()), Ok(104));
    let obj = obj.fill(0x55);
    assert_eq!(cache.verify().nr_problems, 0);
    obj.free().unwrap();
    assert_eq!(alloc.debug().nr_errors(), before);
    // One byte past the 100: in the class's padding, caught by verify on
    // the live object and at the free, at offset 100 (0x64).
    let obj = alloc.kmalloc_box(100, 8).unwrap();
    let p = obj.as_ptr();
    write(p, 100, 0x41);
    assert_eq!(cache.verify().nr_problems, 1);
    // The free reports, repairs and goes on.
    obj.free().unwrap();
    let errors = errors_since(alloc, before);
    assert_eq!(errors.len(), 2, "{errors:?}");
    for report in &errors {
        assert_eq!(report.kind, ErrorKind::RedzoneViolation);
        assert_eq!(report.cache.as_str(), "kmalloc-104");
        assert_eq!(report.object, p.as_ptr() as usize);
        assert_eq!(report.offset(), Some(100));
        let mismatch = report.corruption.unwrap();
        assert_eq!(mismatch.expected, 0xbbbb_bbbb_0000_0000);
        assert_eq!(mismatch.found, 0xbbbb_bb41_0000_0000);
    }
    let text = format!("{}", errors[1].display(&RawFormat));
    assert!(
        text.contains("redzone violation") && text.contains("offset 0x64"),
        "{text}"
    );
    assert_eq!(cache.verify().nr_problems, 0, "repaired");
    // The whole object through kmem_cache_alloc, and after the object's end
    // as before (offset 104).
    let obj = cache.alloc_box().unwrap().fill(0x55);
    let mark = alloc.debug().nr_errors();
    assert_eq!(cache.verify().nr_problems, 0);
    write(obj.as_ptr(), 104, 0x41);
    obj.free().unwrap();
    let errors = errors_since(alloc, mark);
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(errors[0].offset(), Some(104));
}

/// Resizing in place moves the redzone with the size in use: `krealloc`
/// and `GlobalAlloc::realloc` up to the class size are not overflows,
/// a shrink puts the redzone back at the new size.
#[test]
fn krealloc_in_place_moves_the_redzone() {
    use core::alloc::{GlobalAlloc, Layout};
    let config = SlabDebugConfig::parse_slab_debug(Some("Z,kmalloc-104")).unwrap();
    let (alloc, _) = setup_debug(config);
    let before = alloc.debug().nr_errors();
    let obj = alloc.kmalloc_box(100, 8).unwrap();
    let p = obj.as_ptr();
    // Kept in place (104 fits the class).
    let q = obj.krealloc(104, 8).map_err(|(_, error)| error).unwrap();
    assert_eq!(q.as_ptr(), p);
    for offset in 0..104 {
        write(q.as_ptr(), offset, 0x55);
    }
    // Shrunk in place to 98 bytes.
    let r = q.krealloc(98, 8).map_err(|(_, error)| error).unwrap();
    assert_eq!(r.as_ptr(), p);
    assert_eq!(alloc.debug().nr_errors(), before);
    write(r.as_ptr(), 99, 0x41);
    let layout = Layout::from_size_align(98, 8).unwrap();
    let r = r.into_raw();
    // SAFETY: ours; a realloc in place checks the redzone where it was.
    let s = unsafe { alloc.realloc(r.as_ptr(), layout, 103) };
    assert_eq!(s, p.as_ptr());
    let errors = errors_since(alloc, before);
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(errors[0].kind, ErrorKind::RedzoneViolation);
    assert_eq!(errors[0].offset(), Some(99));
    // 103 bytes in use now: byte 102 is fine, byte 103 is not.
    write(p, 102, 0x55);
    write(p, 103, 0x41);
    // SAFETY: allocated above.
    unsafe { alloc.kfree(p) }.unwrap();
    let errors = errors_since(alloc, before + 1);
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(errors[0].offset(), Some(103));
    // `Allocator::allocate` (feature `nightly`) hands out the whole usable
    // size: all of it may be written.
    #[cfg(feature = "nightly")]
    {
        let mark = alloc.debug().nr_errors();
        let block =
            core::alloc::Allocator::allocate(&alloc, Layout::from_size_align(100, 8).unwrap())
                .unwrap();
        assert_eq!(block.len(), 104);
        let start = block.cast::<u8>();
        for offset in 0..104 {
            write(start, offset, 0x55);
        }
        // SAFETY: allocated above with this layout.
        unsafe {
            core::alloc::Allocator::deallocate(
                &alloc,
                start,
                Layout::from_size_align(100, 8).unwrap(),
            )
        };
        assert_eq!(alloc.debug().nr_errors(), mark);
    }
}
