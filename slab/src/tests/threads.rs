//! Multithreaded stress: one host thread per CPU, all at once, on shared
//! caches (a small `AUDIT` cache, a bufctl cache, a constructor-bearing
//! cache and the kmalloc size classes including page-granular sizes),
//! with cross-thread frees, per-object pattern checks, and reaps and
//! statistics reads racing the allocations. At the end everything is
//! freed and reaped: every cache's allocated count is back to its
//! baseline and the page source has every page back.

use crate::CacheArgs;
use std::collections::HashSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::vec::Vec;

use super::support::*;
use crate::{CacheFlags, Constructed, InitBox, KmemCache, ObjectInit, ObjectRef, PAGE_SIZE};

/// Random-mix operations per thread (1,500 under Miri).
const NR_OPS: usize = scaled(150_000);
/// Most objects one thread holds at once; most in the shared pool.
const MAX_LIVE: usize = 192;
const MAX_SHARED: usize = 256;
const SMALL_SIZE: usize = 40;
const BIG_SIZE: usize = 1500;
const CTOR_SIZE: usize = 200;
const CTOR_WORD: u64 = 0xc0c0_c0c0_5eed_0000;

static NR_CTOR_RUNS: AtomicU64 = AtomicU64::new(0);
static NR_DTOR_RUNS: AtomicU64 = AtomicU64::new(0);
static NR_DTOR_MISMATCHES: AtomicU64 = AtomicU64::new(0);

fn ctor_word(index: usize) -> u64 {
    CTOR_WORD ^ index as u64
}

fn ctor(obj: ObjectInit<'_>) -> Result<Constructed<'_>, ()> {
    // The allocator hands the constructor an object no caller holds.
    NR_CTOR_RUNS.fetch_add(1, Ordering::Relaxed);
    Ok(obj.write_words(ctor_word))
}

fn dtor(obj: ObjectRef<'_>) {
    if obj.check_words(ctor_word) != Some(Ok(())) {
        NR_DTOR_MISMATCHES.fetch_add(1, Ordering::Relaxed);
    }
    NR_DTOR_RUNS.fetch_add(1, Ordering::Relaxed);
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Small,
    Big,
    Ctor,
    Kmalloc,
}

/// A live object: where it came from, its unique stamp, the object
/// (written with the stamp's pattern: a second live object overlapping
/// it, or the object handed out twice, breaks one of the two patterns).
struct Obj {
    kind: Kind,
    stamp: u64,
    obj: InitBox<TestPlatform>,
}

fn pattern(stamp: u64, index: usize) -> u64 {
    stamp ^ (index as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

fn check_object(obj: &Obj) {
    let checked = obj.obj.check_words(|index| pattern(obj.stamp, index));
    assert_eq!(
        checked,
        Ok(()),
        "{:?} object {:p} damaged",
        obj.kind,
        obj.obj.as_ptr()
    );
}

struct Caches {
    alloc: &'static TestAlloc,
    small: &'static KmemCache<TestPlatform>,
    big: &'static KmemCache<TestPlatform>,
    ctor: &'static KmemCache<TestPlatform>,
}

impl Caches {
    fn alloc(&self, kind: Kind, size: usize, stamp: u64) -> Obj {
        let word = |index| pattern(stamp, index);
        let obj = match kind {
            Kind::Small => self.small.alloc_box().unwrap().write_words(word),
            Kind::Big => self.big.alloc_box().unwrap().write_words(word),
            Kind::Ctor => {
                let Ok(mut obj) = self.ctor.alloc_box().unwrap().into_constructed() else {
                    panic!("a cache with a constructor");
                };
                assert_eq!(obj.len(), CTOR_SIZE);
                assert_eq!(
                    obj.check_words(ctor_word),
                    Ok(()),
                    "handed out unconstructed"
                );
                obj.write_words(word);
                obj
            }
            Kind::Kmalloc => self.alloc.kmalloc_box(size, 8).unwrap().write_words(word),
        };
        Obj { kind, stamp, obj }
    }

    /// Each object is freed exactly once, by whoever took it out of a list;
    /// the constructor cache gets it back constructed.
    fn free(&self, mut obj: Obj) {
        check_object(&obj);
        if obj.kind == Kind::Ctor {
            obj.obj.write_words(ctor_word);
        }
        obj.obj.free().unwrap();
    }
}

/// `(name, nr_allocated)` of every cache.
fn allocated_per_cache(alloc: &TestAlloc) -> Vec<(&'static str, usize)> {
    let mut all = Vec::new();
    alloc.for_each_cache(|cache| all.push((cache.name(), cache.stats().nr_allocated)));
    all
}

#[test]
fn stress_threads_as_cpus() {
    let (alloc, source) = setup_default();
    let caches = Caches {
        alloc,
        small: alloc
            .cache_create(
                "mt-small",
                SMALL_SIZE,
                &CacheArgs {
                    align: 8,
                    flags: CacheFlags::AUDIT,
                    ..CacheArgs::DEFAULT
                },
            )
            .unwrap(),
        big: alloc
            .cache_create(
                "mt-big",
                BIG_SIZE,
                &CacheArgs {
                    align: 8,
                    ..CacheArgs::DEFAULT
                },
            )
            .unwrap(),
        ctor: alloc
            .cache_create(
                "mt-ctor",
                CTOR_SIZE,
                &CacheArgs {
                    align: 8,
                    ctor: Some(ctor),
                    dtor: Some(dtor),
                    ..CacheArgs::DEFAULT
                },
            )
            .unwrap(),
    };
    alloc.reap_all();
    let baseline_pages = source.pages_outstanding();
    let baseline = allocated_per_cache(alloc);
    let shared: Mutex<Vec<Obj>> = Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for cpu in 0..NR_CPUS {
            let (caches, shared) = (&caches, &shared);
            scope.spawn(move || {
                set_cpu(cpu);
                let mut rng = 0x9e37_79b9u32.wrapping_mul(cpu as u32 + 1);
                let mut next = || {
                    rng ^= rng << 13;
                    rng ^= rng >> 17;
                    rng ^= rng << 5;
                    rng
                };
                let mut mine: Vec<Obj> = Vec::new();
                for serial in 0..NR_OPS as u64 {
                    let r = next();
                    match r % 8 {
                        // Allocate.
                        0..=3 if mine.len() < MAX_LIVE => {
                            let (kind, size) = match (r >> 4) % 8 {
                                0 => (Kind::Small, 0),
                                1 => (Kind::Big, 0),
                                2 | 3 => (Kind::Ctor, 0),
                                // One in 32 of these is page-granular.
                                _ if (r >> 8) % 32 == 0 => {
                                    (Kind::Kmalloc, 8193 + (r >> 12) as usize % (3 * PAGE_SIZE))
                                }
                                _ => (Kind::Kmalloc, 8 + (r >> 12) as usize % 3000),
                            };
                            let stamp = ((cpu as u64) << 48) | serial;
                            mine.push(caches.alloc(kind, size, stamp));
                        }
                        // Hand one to whichever CPU frees next from the pool.
                        4 => {
                            if let Some(obj) = mine.pop() {
                                let mut pool = shared.lock().unwrap();
                                if pool.len() < MAX_SHARED {
                                    pool.push(obj);
                                } else {
                                    drop(pool);
                                    caches.free(obj);
                                }
                            }
                        }
                        // Free from the pool (often allocated on another CPU).
                        5 => {
                            let taken = shared.lock().unwrap().pop();
                            if let Some(obj) = taken {
                                caches.free(obj);
                            }
                        }
                        // Free one of ours, not always the newest.
                        _ => {
                            if !mine.is_empty() {
                                let index = (r >> 8) as usize % mine.len();
                                caches.free(mine.swap_remove(index));
                            }
                        }
                    }
                    // Drains racing the allocations: every CPU's magazines,
                    // from whichever CPU reaps.
                    if serial % 2000 == 1999 {
                        match cpu {
                            0 => {
                                caches.alloc.reap_all();
                            }
                            1 => {
                                caches.ctor.reap();
                                caches.big.reap();
                            }
                            _ => {
                                let _ = caches.small.stats();
                                let _ = caches.alloc.stats().cpu((cpu + 1) % NR_CPUS);
                            }
                        }
                    }
                }
                for obj in mine {
                    caches.free(obj);
                }
            });
        }
    });
    for obj in shared.into_inner().unwrap() {
        caches.free(obj);
    }

    // Every allocation and free is counted once: on the CPU whose
    // magazines served it, or in the slab layer's direct counts. No round
    // was lost or duplicated: the slab layer's busy objects are exactly
    // the (distinct) rounds in magazines.
    for cache in [caches.small, caches.big, caches.ctor] {
        let mut rounds = HashSet::new();
        cache.for_each_round(|round| assert!(rounds.insert(round as usize)));
        let nr_busy = cache.slab.lock().counts().nr_busy_objs;
        assert_eq!(nr_busy, rounds.len(), "{}", cache.name());
        let stats = cache.stats();
        assert_eq!(stats.nr_allocated, 0, "{}", cache.name());
        assert_eq!(
            stats.nr_allocs_ever,
            stats.nr_frees_ever,
            "{}",
            cache.name()
        );
        let hits: u64 = (0..NR_CPUS).map(|cpu| cache.cpu_stats(cpu).nr_allocs).sum();
        assert!(hits > 0 && hits <= stats.nr_allocs_ever, "{}", cache.name());
    }
    assert_eq!(alloc.stats().large().nr_live, 0);
    alloc.reap_all();
    assert_eq!(allocated_per_cache(alloc), baseline);
    assert_eq!(source.pages_outstanding(), baseline_pages);
    // Reaped: every constructed object was destructed, in constructed state.
    assert_eq!(NR_DTOR_MISMATCHES.load(Ordering::Relaxed), 0);
    assert_eq!(
        NR_CTOR_RUNS.load(Ordering::Relaxed),
        NR_DTOR_RUNS.load(Ordering::Relaxed)
    );
    assert!(NR_DTOR_RUNS.load(Ordering::Relaxed) > 0);
}
