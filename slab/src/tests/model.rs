//! Proptest model test: random operation sequences against a std model.

use crate::CacheArgs;
use std::cell::Cell;
use std::collections::HashMap;
use std::vec::Vec;

use proptest::prelude::*;

use super::support::*;
use crate::{AllocError, CacheFlags, Constructed, InitBox, KmemCache, ObjectInit, ObjectRef};

std::thread_local! {
    static NR_CTORS: Cell<u64> = const { Cell::new(0) };
    static NR_DTORS: Cell<u64> = const { Cell::new(0) };
}

fn model_ctor(obj: ObjectInit<'_>) -> Result<Constructed<'_>, ()> {
    NR_CTORS.with(|c| c.set(c.get() + 1));
    Ok(obj.fill(0))
}

fn model_dtor(_obj: ObjectRef<'_>) {
    NR_DTORS.with(|c| c.set(c.get() + 1));
}

#[derive(Debug, Clone)]
enum Op {
    Create {
        size: usize,
        align_log2: u32,
        flags: u8,
    },
    Alloc {
        cache: usize,
    },
    Kmalloc {
        size: usize,
        align_log2: u32,
    },
    Free {
        index: usize,
    },
    Reap,
    ReapAll,
    SwitchCpu {
        cpu: usize,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        1 => (1usize..=9000, 0u32..=13, 0u8..4)
            .prop_map(|(size, align_log2, flags)| Op::Create { size, align_log2, flags }),
        8 => (0usize..8).prop_map(|cache| Op::Alloc { cache }),
        3 => (1usize..=20_000, 0u32..=12).prop_map(|(size, align_log2)| Op::Kmalloc { size, align_log2 }),
        8 => any::<usize>().prop_map(|index| Op::Free { index }),
        1 => Just(Op::Reap),
        1 => Just(Op::ReapAll),
        2 => (0usize..NR_CPUS).prop_map(|cpu| Op::SwitchCpu { cpu }),
    ]
}

struct Live {
    /// The object, filled with `seed`'s pattern ([`fill_box`]).
    obj: InitBox<TestPlatform>,
    seed: u8,
    /// Index of the cache, or None for kmalloc.
    cache: Option<usize>,
}

fn run(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let (alloc, source) = setup(2048);
    alloc.reap_all();
    let baseline = source.pages_outstanding();
    NR_CTORS.with(|c| c.set(0));
    NR_DTORS.with(|c| c.set(0));
    let mut caches: Vec<&'static KmemCache<TestPlatform>> = Vec::new();
    let mut model_live: Vec<usize> = Vec::new(); // live objects per cache
    let mut live: HashMap<usize, Live> = HashMap::new();
    let mut order: Vec<usize> = Vec::new(); // keys of `live`, for picking
    let mut seed = 0u8;
    for op in ops {
        match op {
            Op::Create {
                size,
                align_log2,
                flags,
            } => {
                let align = 1usize << align_log2;
                let flags = CacheFlags::from_bits_truncate(match flags {
                    0 => 0,
                    1 => CacheFlags::AUDIT.bits(),
                    2 => CacheFlags::NOTOUCH.bits(),
                    _ => CacheFlags::NOTRACE.bits(),
                });
                let result = alloc.cache_create(
                    "model",
                    size,
                    &CacheArgs {
                        align,
                        flags,
                        ctor: Some(model_ctor),
                        dtor: Some(model_dtor),
                        ..CacheArgs::DEFAULT
                    },
                );
                if align > 4096 {
                    prop_assert_eq!(result.err(), Some(AllocError::InvalidLayout));
                } else if caches.len() < 8 {
                    let cache = result.unwrap();
                    prop_assert!(cache.align() >= align);
                    if cache.trace_table().start().is_ok() && size % 3 == 0 {
                        // Trace some caches to exercise the hooks.
                    } else {
                        cache.trace_table().stop();
                    }
                    caches.push(cache);
                    model_live.push(0);
                } else if let Ok(cache) = result {
                    // SAFETY: fresh and empty, never used again.
                    unsafe { cache.destroy() }.unwrap();
                }
            }
            Op::Alloc { cache } => {
                if caches.is_empty() {
                    continue;
                }
                let index = cache % caches.len();
                let c = caches[index];
                let obj = c.alloc_box().unwrap();
                prop_assert_eq!(obj.len(), c.obj_size());
                prop_assert_eq!(obj.as_ptr().as_ptr() as usize % c.align(), 0);
                seed = seed.wrapping_add(1);
                // NOTOUCH objects are ordinary memory here: the allocator
                // does not touch them, the caller may.
                let obj = fill_box(obj, seed);
                add(
                    &mut live,
                    &mut order,
                    Live {
                        obj,
                        seed,
                        cache: Some(index),
                    },
                )?;
                model_live[index] += 1;
            }
            Op::Kmalloc { size, align_log2 } => {
                let align = 1usize << align_log2;
                let obj = alloc.kmalloc_box(size, align).unwrap();
                prop_assert_eq!(obj.len(), size);
                prop_assert_eq!(obj.as_ptr().as_ptr() as usize % align, 0);
                prop_assert!(alloc.ksize(obj.as_ptr()).unwrap() >= size);
                seed = seed.wrapping_add(1);
                let obj = fill_box(obj, seed);
                add(
                    &mut live,
                    &mut order,
                    Live {
                        obj,
                        seed,
                        cache: None,
                    },
                )?;
            }
            Op::Free { index } => {
                if order.is_empty() {
                    continue;
                }
                let key = order.swap_remove(index % order.len());
                let Live { obj, seed, cache } = live.remove(&key).unwrap();
                prop_assert!(check_box(&obj, seed), "pattern damaged");
                obj.free().unwrap();
                if let Some(c) = cache {
                    model_live[c] -= 1;
                }
            }
            Op::Reap => {
                if let Some(c) = caches.last() {
                    c.reap();
                }
            }
            Op::ReapAll => {
                alloc.reap_all();
            }
            Op::SwitchCpu { cpu } => set_cpu(cpu),
        }
        // Invariants after every step.
        let mut constructed = 0u64;
        for (c, cache) in caches.iter().enumerate() {
            let st = cache.stats();
            prop_assert_eq!(st.nr_allocated, model_live[c]);
            constructed += (st.nr_allocated + st.nr_cpu_cached_objs + st.nr_depot_objs) as u64;
            let trace = cache.trace_table().stats();
            prop_assert!(trace.nr_records <= st.nr_allocated);
        }
        let nr_ctors = NR_CTORS.with(|c| c.get());
        let nr_dtors = NR_DTORS.with(|c| c.get());
        prop_assert_eq!(nr_ctors - nr_dtors, constructed);
        // The whole-allocator walker: slab lists, free lists against their
        // bitmaps, rounds, busy counts; and no error was ever reported.
        #[cfg(debug_assertions)]
        alloc
            .debug()
            .check_invariants()
            .map_err(|error| TestCaseError::fail(std::format!("{error}")))?;
        prop_assert_eq!(alloc.debug().nr_errors(), 0);
    }
    // Every live object still holds its pattern; free everything.
    for (_, Live { obj, seed, .. }) in live.drain() {
        prop_assert!(check_box(&obj, seed));
        obj.free().unwrap();
    }
    alloc.reap_all();
    prop_assert_eq!(NR_CTORS.with(|c| c.get()), NR_DTORS.with(|c| c.get()));
    for cache in caches {
        // SAFETY: empty; not used afterwards.
        unsafe { cache.destroy() }.unwrap();
    }
    alloc.reap_all();
    prop_assert_eq!(source.pages_outstanding(), baseline);
    set_cpu(0);
    Ok(())
}

/// Record a new live object, checking it overlaps no other.
fn add(
    live: &mut HashMap<usize, Live>,
    order: &mut Vec<usize>,
    obj: Live,
) -> Result<(), TestCaseError> {
    let start = obj.obj.as_ptr().as_ptr() as usize;
    let end = start + obj.obj.len();
    for other in live.values() {
        let o_start = other.obj.as_ptr().as_ptr() as usize;
        let o_end = o_start + other.obj.len();
        prop_assert!(
            end <= o_start || o_end <= start,
            "overlap {start:#x}..{end:#x} with {o_start:#x}..{o_end:#x}"
        );
    }
    live.insert(start, obj);
    order.push(start);
    Ok(())
}

proptest! {
    #![proptest_config(proptest_config(48))]
    #[test]
    fn model(ops in proptest::collection::vec(op(), 1..400)) {
        run(ops)?;
    }
}
