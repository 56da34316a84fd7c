//! Several threads, each acting as one CPU, allocating and freeing with
//! cross-thread frees.

use std::ptr::NonNull;
use std::sync::Mutex;
use std::vec::Vec;

use super::support::*;
use crate::CacheFlags;

#[derive(Clone, Copy)]
struct Obj(NonNull<u8>, usize, u8);
// SAFETY: the test hands objects between threads whole.
unsafe impl Send for Obj {}

#[test]
fn threads_share_caches() {
    let (alloc, source) = setup_default();
    let small = alloc
        .cache_create("mt-small", 40, 8, CacheFlags::AUDIT, None, None, None)
        .unwrap();
    let big = alloc
        .cache_create("mt-big", 1500, 8, CacheFlags::empty(), None, None, None)
        .unwrap();
    alloc.reap_all();
    let baseline = source.pages_outstanding();
    let shared: Mutex<Vec<(usize, Obj)>> = Mutex::new(Vec::new());
    let nr_threads = NR_CPUS;
    std::thread::scope(|scope| {
        for t in 0..nr_threads {
            let shared = &shared;
            scope.spawn(move || {
                set_cpu(t);
                let mut rng = 0x9e37_79b9u32.wrapping_mul(t as u32 + 1);
                let mut next = || {
                    rng ^= rng << 13;
                    rng ^= rng >> 17;
                    rng ^= rng << 5;
                    rng
                };
                let mut mine: Vec<(usize, Obj)> = Vec::new();
                for i in 0..4000 {
                    let r = next();
                    match r % 4 {
                        0 | 1 => {
                            let which = (r >> 8) as usize % 3;
                            let seed = (i as u8) ^ (t as u8);
                            let obj = match which {
                                0 => Obj(small.alloc().unwrap(), 40, seed),
                                1 => Obj(big.alloc().unwrap(), 1500, seed),
                                _ => {
                                    let size = 1 + (r >> 12) as usize % 3000;
                                    Obj(alloc.kmalloc(size, 8).unwrap(), size, seed)
                                }
                            };
                            fill(obj.0, obj.1, obj.2);
                            if r & 0x100 != 0 {
                                shared.lock().unwrap().push((which, obj));
                            } else {
                                mine.push((which, obj));
                            }
                        }
                        2 => {
                            let taken = shared.lock().unwrap().pop();
                            if let Some((which, obj)) = taken.or_else(|| mine.pop()) {
                                free(alloc, small, big, which, obj);
                            }
                        }
                        _ => {
                            if let Some((which, obj)) = mine.pop() {
                                free(alloc, small, big, which, obj);
                            }
                        }
                    }
                }
                for (which, obj) in mine {
                    free(alloc, small, big, which, obj);
                }
            });
        }
    });
    for (which, obj) in shared.into_inner().unwrap() {
        free(alloc, small, big, which, obj);
    }
    assert_eq!(small.stats().nr_allocated, 0);
    assert_eq!(big.stats().nr_allocated, 0);
    alloc.reap_all();
    assert_eq!(source.pages_outstanding(), baseline);
}

fn free(
    alloc: &TestAlloc,
    small: &crate::KmemCache<TestPlatform>,
    big: &crate::KmemCache<TestPlatform>,
    which: usize,
    obj: Obj,
) {
    assert!(check(obj.0, obj.1, obj.2), "pattern damaged");
    // SAFETY: each object is freed exactly once, by whoever popped it.
    unsafe {
        match which {
            0 => small.free(obj.0).unwrap(),
            1 => big.free(obj.0).unwrap(),
            _ => alloc.kfree(obj.0).unwrap(),
        }
    }
}
