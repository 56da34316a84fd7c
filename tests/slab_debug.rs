//! Slab debugging in the real kernel: debug caches (poison, redzone, audit,
//! contents) catch a write after free, a linear overflow, a double free and
//! bad frees; each is one illumos-style report in the allocator's error
//! ring, symbolized by the kernel, shown again by `kmem errors`; `kmem
//! verify` and `kmem whatis` at the shell.

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

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;
use core::ptr::NonNull;
use magpie_slab::CacheArgs;

use magpie::debug::slab_debug::KernelFormat;
use magpie::kmem::{KernelPlatform, SLAB};
use magpie::shell::Shell;
use magpie_slab::reports::{ErrorKind, ErrorReport};
use magpie_slab::{CacheFlags, FreeError, KmemCache};

type Cache = KmemCache<KernelPlatform>;

magpie::test_kernel!();

fn debug_cache(name: &str) -> &'static Cache {
    let flags = CacheFlags::POISON | CacheFlags::REDZONE | CacheFlags::AUDIT | CacheFlags::CONTENTS;
    SLAB.cache_create(
        name,
        64,
        &CacheArgs {
            align: 8,
            flags,
            ..CacheArgs::DEFAULT
        },
    )
    .expect("debug cache")
}

/// Reports made after `after`.
fn errors_since(after: u64) -> Vec<ErrorReport> {
    let mut out = [ErrorReport::new(ErrorKind::InvalidFree, "", 0); 16];
    let nr = SLAB.debug().read_errors(after, &mut out);
    out[..nr].to_vec()
}

fn destroy(cache: &'static Cache) {
    // SAFETY: the test's own cache, empty, not used afterwards.
    unsafe { magpie::kmem::cache_destroy(cache) }.expect("destroy");
}

#[test_case]
#[expect(clippy::cast_ptr_alignment, reason = "object starts are 8-aligned")]
fn write_after_free_report_is_symbolized_with_offset() {
    let cache = debug_cache("dbg-waf");
    let before = SLAB.debug().nr_errors();
    let obj = cache.alloc().unwrap();
    // SAFETY: allocated above; then a deliberate write after free.
    unsafe {
        cache.free(obj).unwrap();
        obj.as_ptr()
            .add(0x20)
            .cast::<u32>()
            .write_volatile(0x0abc_def0);
    }
    let again = cache.alloc().unwrap();
    assert_eq!(again, obj);
    let errors = errors_since(before);
    assert_eq!(errors.len(), 1);
    let report = errors[0];
    assert_eq!(report.kind, ErrorKind::ModifiedAfterFree);
    assert_eq!(report.cache.as_str(), "dbg-waf");
    assert_eq!(report.object, obj.as_ptr() as usize);
    assert_eq!(report.offset(), Some(0x20));
    let text = format!("{}", report.display(&KernelFormat));
    assert!(text.starts_with("kernel memory allocator: buffer modified after being freed\n"));
    assert!(text.contains("modification occurred at offset 0x20 (0xdeadbeefdeadbeef replaced by 0xdeadbeef0abcdef0)"), "{text}");
    // The free's stack, symbolized inside the kernel: this test function.
    assert!(
        text.contains("write_after_free_report_is_symbolized"),
        "{text}"
    );
    assert!(text.contains("time=T+"), "{text}");
    // SAFETY: allocated above.
    unsafe { cache.free(again) }.unwrap();
    destroy(cache);
}

#[test_case]
fn overflow_double_free_and_bad_frees_are_reported_once_each() {
    let cache = debug_cache("dbg-bugs");
    let other = debug_cache("dbg-other");
    let before = SLAB.debug().nr_errors();
    let obj = cache.alloc().unwrap();
    let addr = obj.as_ptr() as usize;
    // SAFETY: deliberate bugs on the test's own objects; each bad free is
    // refused and changes nothing.
    unsafe {
        obj.as_ptr().add(64).write_volatile(0x41);
        cache.free(obj).unwrap();
        assert_eq!(cache.free(obj), Err(FreeError::DoubleFree { addr }));
        let live = cache.alloc().unwrap();
        assert!(matches!(
            other.free(live),
            Err(FreeError::WrongCache { .. })
        ));
        let interior = NonNull::new_unchecked(live.as_ptr().add(8));
        assert!(cache.free(interior).is_err());
        cache.free(live).unwrap();
    }
    let kinds: Vec<ErrorKind> = errors_since(before).iter().map(|e| e.kind).collect();
    assert_eq!(
        kinds,
        [
            ErrorKind::RedzoneViolation,
            ErrorKind::DuplicateFree,
            ErrorKind::WrongCache,
            ErrorKind::InvalidFree
        ]
    );
    assert_eq!(errors_since(before)[0].offset(), Some(64));
    // `kmem errors` shows them again; `kmem verify` finds the caches clean.
    let mut shell = Shell::new();
    let mut out = String::new();
    shell.execute("kmem errors", &mut out);
    assert!(
        out.contains("redzone violation: write past end of buffer"),
        "{out}"
    );
    assert!(out.contains("duplicate free: buffer freed twice"), "{out}");
    out.clear();
    shell.execute("kmem verify dbg-bugs", &mut out);
    assert!(out.contains(": 0 problem(s)"), "{out}");
    destroy(cache);
    destroy(other);
}

#[test_case]
fn page_granular_double_free_is_a_duplicate_free_with_its_size() {
    let before = SLAB.debug().nr_errors();
    // Above the largest size class: whole pages (3 of them).
    let block = SLAB
        .kmalloc(3 * 4096 - 100, 8)
        .expect("page-granular kmalloc");
    let addr = block.as_ptr() as usize;
    // SAFETY: allocated above; the second free is refused, changing nothing.
    unsafe {
        SLAB.kfree(block).unwrap();
        assert_eq!(SLAB.kfree(block), Err(FreeError::DoubleFree { addr }));
    }
    let errors = errors_since(before);
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(errors[0].kind, ErrorKind::DuplicateFree);
    assert_eq!((errors[0].object, errors[0].size), (addr, 3 * 4096));
    let text = format!("{}", errors[0].display(&KernelFormat));
    assert!(
        text.contains("duplicate free: buffer freed twice")
            && text.contains("whole pages (kmalloc): 3 pages, 12288 bytes"),
        "{text}"
    );
}

#[test_case]
fn verify_and_whatis_at_the_shell() {
    let cache = debug_cache("dbg-verify");
    let obj = cache.alloc().unwrap();
    let mut shell = Shell::new();
    let mut out = String::new();
    shell.execute(
        &format!("kmem whatis {:#x}", obj.as_ptr() as usize + 8),
        &mut out,
    );
    assert!(
        out.contains(&format!(
            "is allocated from dbg-verify: object {:#x}+0x8 of 64 bytes",
            obj.as_ptr() as usize
        )),
        "{out}"
    );
    assert!(out.contains("last alloc transaction"), "{out}");
    // A write after free into a free object is found by verify.
    // SAFETY: allocated above; then a deliberate write after free.
    unsafe {
        cache.free(obj).unwrap();
        obj.as_ptr().write_volatile(0);
    }
    let before = SLAB.debug().nr_errors();
    out.clear();
    shell.execute("kmem verify dbg-verify", &mut out);
    assert!(out.contains(": 1 problem(s)"), "{out}");
    assert_eq!(errors_since(before)[0].kind, ErrorKind::ModifiedAfterFree);
    // Reported once more at the next allocation, which repairs it.
    let again = cache.alloc().unwrap();
    // SAFETY: allocated above.
    unsafe { cache.free(again) }.unwrap();
    out.clear();
    shell.execute("kmem verify dbg-verify", &mut out);
    assert!(out.contains(": 0 problem(s)"), "{out}");
    destroy(cache);
}
