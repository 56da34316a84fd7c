//! Basic cache life cycle: init, create, alloc/free round trips, destroy.

use crate::CacheArgs;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::vec::Vec;

use super::support::*;
use crate::{
    AllocError, CacheFlags, Constructed, DestroyError, KMALLOC_SIZES, ObjectInit, ObjectRef,
    PAGE_SIZE, SlabKind, TraceError, WordMismatch,
};

#[test]
fn init_twice_is_refused() {
    let (alloc, source) = setup_default();
    assert!(alloc.is_ready());
    assert_eq!(alloc.init(source), Err(AllocError::AlreadyInitialized));
    assert_eq!(alloc.page_source().name(), "fake");
    assert_eq!(alloc.stats().nr_cpus(), NR_CPUS);
}

#[test]
fn before_init_everything_fails_cleanly() {
    let alloc: &'static TestAlloc = std::boxed::Box::leak(std::boxed::Box::new(crate::Kmem::new()));
    assert!(!alloc.is_ready());
    assert_eq!(alloc.kmalloc(8, 8), Err(AllocError::NotInitialized));
    assert_eq!(alloc.page_source().name(), "none");
    assert!(alloc.stats().kmalloc_cache_for(8, 8).is_none());
    let mut x = 0u64;
    let p = NonNull::from(&mut x).cast::<u8>();
    // SAFETY: refused without touching anything.
    assert!(unsafe { alloc.kfree(p) }.is_err());
    assert!(!alloc.owns(p.as_ptr()));
    assert!(
        alloc
            .cache_create(
                "x",
                8,
                &CacheArgs {
                    align: 8,
                    ..CacheArgs::DEFAULT
                }
            )
            .is_err()
    );
}

/// The alloc and free hits have no readiness test of their own (issue
/// 18): before init the small-size table holds the unready entry (whose
/// flags send the alloc off the hit, where it is refused) and the page
/// map is empty, and they refuse through those, for every size and alignment, the
/// bad-layout errors still saying `NotInitialized` first.
#[test]
fn before_init_the_hits_refuse_without_a_readiness_test() {
    use core::alloc::{GlobalAlloc, Layout};
    let alloc: &'static TestAlloc = std::boxed::Box::leak(std::boxed::Box::new(crate::Kmem::new()));
    for (size, align) in [
        (1, 1),
        (8, 8),
        (64, 8),
        (1024, 8),
        (100, 64),
        (5000, 8),
        (8, 4096),
    ] {
        assert_eq!(alloc.kmalloc(size, align), Err(AllocError::NotInitialized));
        assert_eq!(
            alloc.kmalloc_with(crate::KmallocArgs::new(size, align).tag(None)),
            Err(AllocError::NotInitialized)
        );
        let layout = Layout::from_size_align(size, align).unwrap();
        // SAFETY: a valid layout; null expected.
        assert!(unsafe { alloc.alloc(layout) }.is_null());
    }
    assert_eq!(alloc.kmalloc(0, 8), Err(AllocError::NotInitialized));
    assert_eq!(alloc.kmalloc(8, 3), Err(AllocError::NotInitialized));
    let mut x = [0u64; 8];
    let p = x.as_mut_ptr().cast::<u8>();
    // SAFETY: refused without touching anything (reported, counted).
    unsafe { alloc.dealloc(p, Layout::new::<u64>()) };
    assert_eq!(alloc.debug().nr_bad_frees(), 1);
    assert_eq!(x, [0; 8]);
    // After init the same calls succeed: the table was published.
    let (ready, _) = setup_default();
    // SAFETY: a valid layout.
    let q = unsafe { ready.alloc(Layout::from_size_align(64, 8).unwrap()) };
    assert!(!q.is_null());
    // SAFETY: just allocated with this layout.
    unsafe { ready.dealloc(q, Layout::from_size_align(64, 8).unwrap()) };
    assert_eq!(ready.debug().nr_bad_frees(), 0);
}

#[test]
fn bootstrap_and_kmalloc_caches_are_listed_in_order() {
    let (alloc, _) = setup_default();
    let mut names = Vec::new();
    alloc.for_each_cache(|c| names.push(std::string::String::from(c.name())));
    let boot = [
        "kmem_magazine_1",
        "kmem_magazine_3",
        "kmem_magazine_6",
        "kmem_magazine_14",
        "kmem_magazine_29",
        "kmem_magazine_60",
        "kmem_cache",
        "kmem_slab",
        "kmem_bufctl",
        "kmem_trace",
        #[cfg(feature = "alloc-profiling")]
        "kmem_tags_32",
        #[cfg(feature = "alloc-profiling")]
        "kmem_tags_48",
        #[cfg(feature = "alloc-profiling")]
        "kmem_tags_64",
        #[cfg(feature = "alloc-profiling")]
        "kmem_tags_96",
        #[cfg(feature = "alloc-profiling")]
        "kmem_tags_128",
        #[cfg(feature = "alloc-profiling")]
        "kmem_tags_192",
        #[cfg(feature = "alloc-profiling")]
        "kmem_tags_256",
        #[cfg(feature = "alloc-profiling")]
        "kmem_tags_384",
        #[cfg(feature = "alloc-profiling")]
        "kmem_tags_512",
        #[cfg(feature = "alloc-profiling")]
        "kmem_tags_768",
        #[cfg(feature = "alloc-profiling")]
        "kmem_tags_1024",
        #[cfg(feature = "alloc-profiling")]
        "kmem_tags_1536",
        #[cfg(feature = "alloc-profiling")]
        "kmem_tags_2048",
    ];
    assert_eq!(&names[..boot.len()], &boot);
    for (i, size) in KMALLOC_SIZES.iter().enumerate() {
        assert_eq!(names[boot.len() + i], std::format!("kmalloc-{size}"));
    }
    for name in boot {
        let cache = alloc.find_cache(name).unwrap();
        assert!(cache.flags().contains(CacheFlags::NOTRACE));
        assert!(cache.is_bootstrap());
        assert_eq!(cache.trace_table().start(), Err(TraceError::NoTrace));
        // SAFETY: never destroyed: refused.
        assert_eq!(unsafe { cache.destroy() }, Err(DestroyError::Permanent));
        assert!(cache.alloc().is_err());
    }
    for name in ["kmem_magazine_60", "kmem_slab", "kmem_bufctl", "kmem_trace"] {
        assert_eq!(
            alloc.find_cache(name).unwrap().kind(),
            SlabKind::Small,
            "{name}"
        );
    }
    let k64 = alloc.find_cache("kmalloc-64").unwrap();
    assert_eq!(k64.obj_size(), 64);
    assert_eq!(k64.kind(), SlabKind::Small);
    // Every kmalloc class has small-object slabs (multi-page ones above
    // a few hundred bytes; see geometry.rs).
    assert_eq!(
        alloc.find_cache("kmalloc-8192").unwrap().kind(),
        SlabKind::Small
    );
    // SAFETY: refused.
    assert_eq!(unsafe { k64.destroy() }, Err(DestroyError::Permanent));
    assert!(alloc.find_cache("nope").is_none());
}

#[test]
fn create_validates_layout() {
    let (alloc, _) = setup_default();
    let bad = [(0, 8), (8, 3), (8, 8192), (8, 12), (1 << 31, 8)];
    for (size, align) in bad {
        assert_eq!(
            alloc
                .cache_create(
                    "bad",
                    size,
                    &CacheArgs {
                        align,
                        ..CacheArgs::DEFAULT
                    }
                )
                .err(),
            Some(AllocError::InvalidLayout),
            "size {size} align {align}"
        );
    }
    let long = "a-very-long-cache-name-that-exceeds-thirty-one-bytes";
    let cache = alloc.cache_create(long, 8, &CacheArgs::DEFAULT).unwrap();
    assert_eq!(cache.name(), &long[..31]);
    assert_eq!(cache.align(), 8);
}

#[test]
fn round_trips_per_size() {
    let (alloc, source) = setup_default();
    let sizes = [
        1, 7, 8, 12, 24, 40, 64, 100, 250, 256, 500, 512, 513, 1000, 2048, 3000, 4096, 5000, 8192,
        9000,
    ];
    let aligns = [1, 8, 16, 64, 256, 4096];
    for &size in &sizes {
        for &align in &aligns {
            alloc.reap_all();
            let baseline = source.pages_outstanding();
            let cache = alloc
                .cache_create(
                    "rt",
                    size,
                    &CacheArgs {
                        align,
                        ..CacheArgs::DEFAULT
                    },
                )
                .unwrap();
            let n = 40;
            let mut objs = Vec::new();
            let word = |i: usize| move |index: usize| ((i as u64) << 32) | index as u64;
            for i in 0..n {
                let obj = cache.alloc_box().unwrap();
                assert_eq!(
                    obj.as_ptr().as_ptr() as usize % align.max(8),
                    0,
                    "size {size} align {align}"
                );
                objs.push(obj.write_words(word(i)));
            }
            assert_eq!(cache.stats().nr_allocated, n);
            for (i, obj) in objs.into_iter().enumerate() {
                assert_eq!(obj.check_words(word(i)), Ok(()));
                obj.free().unwrap();
            }
            let stats = cache.stats();
            assert_eq!(stats.nr_allocated, 0);
            assert_eq!(stats.nr_allocs_ever, n as u64);
            assert_eq!(stats.nr_frees_ever, n as u64);
            // SAFETY: nothing allocated, not used afterwards.
            let report = unsafe { cache.destroy() }.unwrap();
            assert_eq!(report.nr_trace_records_dropped, 0);
            alloc.reap_all();
            assert_eq!(
                source.pages_outstanding(),
                baseline,
                "size {size} align {align}"
            );
        }
    }
}

static CTORS: AtomicUsize = AtomicUsize::new(0);
static DTORS: AtomicUsize = AtomicUsize::new(0);
static FAIL_CTOR: AtomicUsize = AtomicUsize::new(usize::MAX);

fn counting_ctor(obj: ObjectInit<'_>) -> Result<Constructed<'_>, ()> {
    let n = CTORS.fetch_add(1, Ordering::SeqCst);
    if n == FAIL_CTOR.load(Ordering::SeqCst) {
        CTORS.fetch_sub(1, Ordering::SeqCst);
        return Err(());
    }
    // Mark the object as constructed.
    Ok(obj.fill(0xc0))
}

fn counting_dtor(obj: ObjectRef<'_>) {
    let bytes = obj.as_bytes().expect("a cache with a constructor");
    assert!(
        bytes.iter().all(|&byte| byte == 0xc0),
        "destructing an unconstructed object"
    );
    DTORS.fetch_add(1, Ordering::SeqCst);
}

/// The only test using the ctor/dtor statics above.
#[test]
fn ctor_dtor_counts_and_ctor_failure() {
    let (alloc, source) = setup_default();
    alloc.reap_all();
    let cache = alloc
        .cache_create(
            "ctor",
            48,
            &CacheArgs {
                align: 8,
                ctor: Some(counting_ctor),
                dtor: Some(counting_dtor),
                ..CacheArgs::DEFAULT
            },
        )
        .unwrap();
    let baseline = source.pages_outstanding();
    let mut objs = Vec::new();
    for _ in 0..10 {
        let Ok(obj) = cache.alloc_box().unwrap().into_constructed() else {
            panic!("a cache with a constructor gives constructed objects");
        };
        assert!(obj.as_bytes().iter().all(|&byte| byte == 0xc0));
        objs.push(obj);
    }
    assert_eq!(CTORS.load(Ordering::SeqCst), 10);
    for obj in objs.drain(..) {
        obj.free().unwrap();
    }
    // Freed objects rest constructed in the magazine: no dtor yet.
    assert_eq!(DTORS.load(Ordering::SeqCst), 0);
    // Reallocating from the magazine does not construct again.
    let obj = cache.alloc_box().unwrap();
    assert_eq!(CTORS.load(Ordering::SeqCst), 10);
    obj.free().unwrap();
    cache.reap();
    assert_eq!(DTORS.load(Ordering::SeqCst), 10);

    // Constructor failure fails the allocation and leaks nothing.
    FAIL_CTOR.store(CTORS.load(Ordering::SeqCst), Ordering::SeqCst);
    assert_eq!(cache.alloc(), Err(AllocError::ConstructorFailed));
    FAIL_CTOR.store(usize::MAX, Ordering::SeqCst);
    let stats = cache.stats();
    assert_eq!(stats.nr_allocated, 0);
    assert_eq!(stats.nr_active_slabs, 0);
    drop(cache.alloc_box().unwrap());
    assert_eq!(
        CTORS.load(Ordering::SeqCst) - DTORS.load(Ordering::SeqCst),
        1
    );
    alloc.reap_all();
    assert_eq!(CTORS.load(Ordering::SeqCst), DTORS.load(Ordering::SeqCst));
    assert_eq!(source.pages_outstanding(), baseline);
}

#[test]
fn destroy_busy_then_ok() {
    let (alloc, source) = setup_default();
    alloc.reap_all();
    let baseline = source.pages_outstanding();
    let cache = alloc
        .cache_create(
            "d",
            600,
            &CacheArgs {
                align: 8,
                ..CacheArgs::DEFAULT
            },
        )
        .unwrap();
    let p = cache.alloc_box().unwrap();
    let q = cache.alloc_box().unwrap();
    // SAFETY: refused, cache intact.
    let refused = unsafe { cache.destroy() };
    assert_eq!(refused, Err(DestroyError::Busy { nr_allocated: 2 }));
    // The cache still works after a refused destroy.
    p.free().unwrap();
    let r = cache.alloc_box().unwrap();
    q.free().unwrap();
    r.free().unwrap();
    assert!(alloc.find_cache("d").is_some());
    // SAFETY: all freed; not used afterwards.
    unsafe { cache.destroy() }.unwrap();
    assert!(alloc.find_cache("d").is_none());
    alloc.reap_all();
    assert_eq!(source.pages_outstanding(), baseline);
}

#[test]
fn layouts_match_the_design() {
    let (alloc, _) = setup_default();
    let small = alloc
        .cache_create(
            "s",
            64,
            &CacheArgs {
                align: 64,
                ..CacheArgs::DEFAULT
            },
        )
        .unwrap();
    let st = small.stats();
    // The least-waste geometry (geometry.rs), the same for any cache of
    // that layout, with alloc-profiling or without (tag references live in
    // side arrays, not in the slab): one page of 62 objects.
    let geometry =
        crate::layout::geometry::Geometry::new(64, 64, CacheFlags::empty(), true).unwrap();
    assert_eq!(
        (st.kind, st.nr_pages_per_slab, st.objs_per_slab),
        (
            SlabKind::Small,
            geometry.nr_pages_per_slab,
            geometry.nr_objs_per_slab
        )
    );
    assert_eq!((st.nr_pages_per_slab, st.objs_per_slab), (1, 62));
    assert!(st.objs_per_slab * 64 <= st.nr_pages_per_slab * PAGE_SIZE - 128);
    // Objects start at offset 0 of their page.
    let p = small.alloc().unwrap();
    assert_eq!(p.as_ptr() as usize % PAGE_SIZE % 64, 0);
    let first_in_page = (0..st.objs_per_slab)
        .map(|_| small.alloc().unwrap().as_ptr() as usize)
        .chain(std::iter::once(p.as_ptr() as usize))
        .any(|a| a % PAGE_SIZE == 0);
    assert!(first_in_page);
    let notouch = alloc
        .cache_create(
            "nt",
            16,
            &CacheArgs {
                align: 8,
                flags: CacheFlags::NOTOUCH,
                ..CacheArgs::DEFAULT
            },
        )
        .unwrap();
    assert_eq!(notouch.kind(), SlabKind::Bufctl);
    let big = alloc
        .cache_create(
            "big",
            5000,
            &CacheArgs {
                align: 8,
                ..CacheArgs::DEFAULT
            },
        )
        .unwrap();
    let bs = big.stats();
    // Up to 8 KiB on the primary source: small-object slabs of several
    // pages; above, bufctl slabs.
    assert_eq!(bs.kind, SlabKind::Small);
    assert!(bs.nr_pages_per_slab > 1 && bs.objs_per_slab >= 4);
    let huge = alloc
        .cache_create(
            "huge",
            20_000,
            &CacheArgs {
                align: 8,
                ..CacheArgs::DEFAULT
            },
        )
        .unwrap();
    let hs = huge.stats();
    assert_eq!(hs.kind, SlabKind::Bufctl);
    assert!(hs.nr_pages_per_slab > 4 && hs.objs_per_slab >= 3);
    assert_eq!(core::mem::size_of::<crate::magazine::PcpuCache>(), 64);
}

/// A bufctl cache's slabs keep their bufctls in `kmem_bufctl` (and
/// `kmem_cache`'s packed slabs their headers in `kmem_slab`): one
/// `reap_all` must reap them before `kmem_bufctl` and `kmem_slab`, or a
/// metadata page emptied by their reap stays out until the next call.
/// Whether a page empties that way depends on where the metadata landed,
/// so try a range of `kmem_bufctl` fill levels.
#[test]
fn reap_all_returns_metadata_in_one_pass() {
    for nr_big in (0..=96).step_by(6) {
        let (alloc, source) = setup(512);
        alloc.reap_all();
        let baseline = source.pages_outstanding();
        // Fill kmem_bufctl to some level with a bufctl cache's bufctls.
        let big = alloc
            .cache_create(
                "filler",
                2000,
                &CacheArgs {
                    align: 8,
                    ..CacheArgs::DEFAULT
                },
            )
            .unwrap();
        let objs: Vec<_> = (0..nr_big).map(|_| big.alloc_box().unwrap()).collect();
        // Enough caches that kmem_cache grows slabs, whose headers come
        // from kmem_slab.
        let caches: Vec<_> = (0..12)
            .map(|_| {
                alloc
                    .cache_create(
                        "extra",
                        64,
                        &CacheArgs {
                            align: 8,
                            ..CacheArgs::DEFAULT
                        },
                    )
                    .unwrap()
            })
            .collect();
        for obj in objs {
            obj.free().unwrap();
        }
        for cache in caches.into_iter().chain([big]) {
            // SAFETY: empty, not used afterwards.
            unsafe { cache.destroy() }.unwrap();
        }
        alloc.reap_all();
        assert_eq!(source.pages_outstanding(), baseline, "nr_big {nr_big}");
    }
}

/// Owned handles: allocate, use and free without `unsafe`; dropping frees
/// too; the counts come back. A word pattern written is read back; a
/// changed byte is found; only a constructor's objects are readable
/// without writing them first.
#[test]
fn slab_box_frees_once_without_unsafe() {
    let (alloc, _) = setup_default();
    let cache = alloc
        .cache_create(
            "boxed",
            48,
            &CacheArgs {
                align: 8,
                flags: CacheFlags::AUDIT,
                ..CacheArgs::DEFAULT
            },
        )
        .unwrap();
    let obj = cache.alloc_box().unwrap();
    assert_eq!(obj.len(), 48);
    assert_eq!(cache.stats().nr_allocated, 1);
    let Err(obj) = obj.into_constructed() else {
        panic!("no constructor: the object is not known to be written");
    };
    let mut obj = obj.write_words(|index| index as u64 * 3);
    assert_eq!(obj.check_words(|index| index as u64 * 3), Ok(()));
    assert_eq!(obj.as_bytes()[8], 3);
    obj.as_bytes_mut()[17] ^= 1;
    assert_eq!(
        obj.check_words(|index| index as u64 * 3),
        Err(WordMismatch {
            offset: 16,
            expected: 6,
            found: 6 ^ (1 << 8),
        })
    );
    obj.free().unwrap();
    assert_eq!(cache.stats().nr_allocated, 0);
    {
        let _dropped = cache.alloc_box().unwrap();
        assert_eq!(cache.stats().nr_allocated, 1);
    }
    assert_eq!(cache.stats().nr_allocated, 0);
    let k64 = alloc.stats().kmalloc_cache_for(43, 8).unwrap();
    let before = k64.stats().nr_allocated;
    // 43 bytes: five words and a 3-byte tail (the low bytes of word 5).
    let bytes = alloc.kmalloc_box(43, 8).unwrap();
    assert!(bytes.into_constructed().is_err());
    let bytes = alloc
        .kmalloc_box(43, 8)
        .unwrap()
        .write_words(|index| 0x0102_0304_0506_0700 | index as u64);
    assert_eq!(bytes.len(), 43);
    assert_eq!(&bytes.as_bytes()[40..], &[0x05, 0x07, 0x06]);
    assert_eq!(
        bytes.check_words(|index| 0x0102_0304_0506_0700 | index as u64),
        Ok(())
    );
    assert_eq!(
        bytes.check_words(|_| 0),
        Err(WordMismatch {
            offset: 0,
            expected: 0,
            found: 0x0102_0304_0506_0700,
        })
    );
    assert_eq!(k64.stats().nr_allocated, before + 1);
    drop(bytes);
    assert_eq!(k64.stats().nr_allocated, before);
    let filled = alloc.kmalloc_box(5, 1).unwrap().fill(0xa5);
    assert_eq!(filled.as_bytes(), &[0xa5; 5]);
    filled.free().unwrap();
    // Only kmalloc objects resize; a refused resize gives the box back.
    let Err((obj, error)) = cache.alloc_box().unwrap().krealloc(96, 8) else {
        panic!("a cache object resized");
    };
    assert_eq!(error, AllocError::InvalidLayout);
    assert_eq!(cache.stats().nr_allocated, 1);
    obj.free().unwrap();
    let Ok(grown) = alloc.kmalloc_box(40, 8).unwrap().krealloc(500, 8) else {
        panic!("a kmalloc object not resized");
    };
    assert_eq!((grown.len(), k64.stats().nr_allocated), (500, before));
    grown.free().unwrap();
    let zeroed = crate::InitBox::kzalloc(alloc, 43, 8).unwrap();
    assert_eq!(zeroed.as_bytes(), &[0; 43]);
    assert_eq!(k64.stats().nr_allocated, before + 1);
    zeroed.free().unwrap();
    assert_eq!(k64.stats().nr_allocated, before);
}
