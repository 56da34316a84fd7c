//! Every [`AllocError`] a page source can return comes back unchanged
//! through every allocation path: the plain hit's miss, the hooked path
//! (a feature on), kmalloc's size classes and its page-granular half.
//! (Until the alloc paths returned `Result` throughout, a packed result
//! read `SourceTooSmall` back as `OutOfMemory`.)

use crate::CacheArgs;
use core::ptr::NonNull;
use core::sync::atomic::{AtomicU8, Ordering};

use super::support::*;
use crate::platform::{ArenaStats, PageSource};
use crate::{AllocError, Kmem};

/// Every variant, in declaration order (a new variant must be added
/// here: the match below does not compile without it).
const ALL: [AllocError; 6] = [
    AllocError::OutOfMemory,
    AllocError::InvalidLayout,
    AllocError::ConstructorFailed,
    AllocError::NotInitialized,
    AllocError::AlreadyInitialized,
    AllocError::SourceTooSmall,
];

const _: fn(AllocError) = |error| match error {
    AllocError::OutOfMemory
    | AllocError::InvalidLayout
    | AllocError::ConstructorFailed
    | AllocError::NotInitialized
    | AllocError::AlreadyInitialized
    | AllocError::SourceTooSmall => {}
};

/// A [`FakeSource`] that, once told, refuses every request with one
/// chosen error (an index into [`ALL`]; `u8::MAX`: serve).
struct RefusingSource {
    inner: &'static FakeSource,
    refuse_with: AtomicU8,
}

impl RefusingSource {
    fn new(nr_pages: usize) -> &'static RefusingSource {
        std::boxed::Box::leak(std::boxed::Box::new(RefusingSource {
            inner: FakeSource::new(nr_pages),
            refuse_with: AtomicU8::new(u8::MAX),
        }))
    }

    fn refuse(&self, error: Option<AllocError>) {
        let index = error.map_or(u8::MAX, |error| {
            ALL.iter().position(|&e| e == error).unwrap() as u8
        });
        self.refuse_with.store(index, Ordering::Relaxed);
    }
}

impl PageSource for RefusingSource {
    fn name(&self) -> &str {
        "refusing"
    }

    fn alloc_pages(&self, nr_pages: usize) -> Result<NonNull<u8>, AllocError> {
        match self.refuse_with.load(Ordering::Relaxed) {
            u8::MAX => self.inner.alloc_pages(nr_pages),
            index => Err(ALL[usize::from(index)]),
        }
    }

    unsafe fn free_pages(&self, addr: NonNull<u8>, nr_pages: usize) {
        // SAFETY: per our caller, pages this source (its inner one) gave.
        unsafe { self.inner.free_pages(addr, nr_pages) }
    }

    fn span(&self) -> (usize, usize) {
        self.inner.span()
    }

    fn stats(&self) -> ArenaStats {
        self.inner.stats()
    }
}

#[test]
fn every_alloc_error_variant_survives_every_alloc_path() {
    set_cpu(0);
    let source = RefusingSource::new(4096);
    let alloc: &'static TestAlloc = std::boxed::Box::leak(std::boxed::Box::new(Kmem::new()));
    alloc.init(source).expect("init");
    // A plain cache (the plain path) and a traced one (the hooked path),
    // both on the primary source, each with no slab yet.
    let plain = alloc
        .cache_create(
            "errors-plain",
            200,
            &CacheArgs {
                align: 8,
                ..CacheArgs::DEFAULT
            },
        )
        .unwrap();
    let traced = alloc
        .cache_create(
            "errors-traced",
            200,
            &CacheArgs {
                align: 8,
                ..CacheArgs::DEFAULT
            },
        )
        .unwrap();
    traced.trace_table().start().unwrap();
    // A kmalloc class with no slab yet: the reap below empties them all.
    alloc.reap_all();
    for error in ALL {
        source.refuse(Some(error));
        assert_eq!(plain.alloc(), Err(error), "KmemCache::alloc, plain");
        assert_eq!(traced.alloc(), Err(error), "KmemCache::alloc, hooked");
        assert_eq!(alloc.kmalloc(3000, 8), Err(error), "kmalloc, size class");
        assert_eq!(
            alloc.kmalloc(64 * 1024, 8),
            Err(error),
            "kmalloc, page-granular"
        );
        // SAFETY: a valid layout; nothing is returned to free.
        let null = unsafe {
            core::alloc::GlobalAlloc::alloc(
                alloc,
                core::alloc::Layout::from_size_align(3000, 8).unwrap(),
            )
        };
        assert!(null.is_null(), "GlobalAlloc: null, whatever the error");
    }
    source.refuse(None);
    let obj = plain.alloc().expect("served again");
    // SAFETY: just allocated from `plain`.
    unsafe { plain.free(obj) }.unwrap();
}
