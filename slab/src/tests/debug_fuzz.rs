//! Fuzzing slab debugging (proptest): random alloc / free / reap
//! sequences on caches with every debug flag, with bugs injected at
//! random — double frees, interior, wrong-cache and foreign frees, writes
//! after free, linear overflows. Every injected bug must be reported
//! exactly once, with the right kind and object, and nothing else may be
//! reported; the allocator's invariants hold after every step.

use crate::CacheArgs;
use std::boxed::Box;
use std::collections::HashMap;
use std::ptr::NonNull;
use std::vec::Vec;

use proptest::prelude::*;

use super::debug::errors_since;
use super::support::*;
use crate::debug::POISON_FREE;
use crate::reports::error::ErrorKind;
use crate::{CacheFlags, FreeError, KmemCache, SlabBox};

#[derive(Debug, Clone)]
enum Op {
    Alloc { cache: usize },
    Free { pick: usize },
    DoubleFree { pick: usize },
    InteriorFree { pick: usize },
    WrongCacheFree { pick: usize, to: usize },
    ForeignFree,
    WriteAfterFree { pick: usize, offset: usize },
    Overflow { pick: usize },
    Reap { cache: usize },
    SwitchCpu { cpu: usize },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        10 => (0usize..4).prop_map(|cache| Op::Alloc { cache }),
        8 => any::<usize>().prop_map(|pick| Op::Free { pick }),
        1 => any::<usize>().prop_map(|pick| Op::DoubleFree { pick }),
        1 => any::<usize>().prop_map(|pick| Op::InteriorFree { pick }),
        1 => (any::<usize>(), 0usize..4).prop_map(|(pick, to)| Op::WrongCacheFree { pick, to }),
        1 => Just(Op::ForeignFree),
        1 => (any::<usize>(), any::<usize>()).prop_map(|(pick, offset)| Op::WriteAfterFree { pick, offset }),
        1 => any::<usize>().prop_map(|pick| Op::Overflow { pick }),
        1 => (0usize..4).prop_map(|cache| Op::Reap { cache }),
        1 => (0usize..NR_CPUS).prop_map(|cpu| Op::SwitchCpu { cpu }),
    ]
}

/// Object sizes of the fuzzed caches: small slabs and bufctl slabs.
const SIZES: [usize; 4] = [24, 64, 200, 1000];

/// A freed object: a raw pointer, kept for the injected bugs.
struct Obj {
    ptr: NonNull<u8>,
    cache: usize,
}

/// A live object, owned.
struct Live {
    obj: SlabBox<TestPlatform>,
    cache: usize,
}

impl Live {
    fn addr(&self) -> usize {
        self.obj.as_ptr().as_ptr() as usize
    }
}

fn run(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let (alloc, _) = setup(2048);
    let flags = CacheFlags::POISON | CacheFlags::REDZONE | CacheFlags::AUDIT | CacheFlags::CONTENTS;
    let caches: Vec<&'static KmemCache<TestPlatform>> = SIZES
        .iter()
        .map(|&size| {
            alloc
                .cache_create(
                    "fuzz",
                    size,
                    &CacheArgs {
                        align: 8,
                        flags,
                        ..CacheArgs::DEFAULT
                    },
                )
                .unwrap()
        })
        .collect();
    let mut live: Vec<Live> = Vec::new();
    // Freed and not handed out again: safe to double free or scribble on.
    let mut freed: Vec<Obj> = Vec::new();
    // Reports owed: (kind, object) -> count.
    let mut owed: HashMap<(ErrorKind, usize), usize> = HashMap::new();
    // Objects with a pending corruption (one bug at a time per object).
    let mut dirty: Vec<usize> = Vec::new();
    let mut seen = alloc.debug().nr_errors();
    let foreign = Box::leak(Box::new([0u64; 8]));
    for op in ops {
        match op {
            Op::Alloc { cache } => {
                let obj = caches[cache].alloc_box().unwrap();
                let ptr = obj.as_ptr();
                let addr = ptr.as_ptr() as usize;
                freed.retain(|obj| obj.ptr != ptr);
                // The alloc check reported a write after free (if any).
                dirty.retain(|&d| d != addr);
                live.push(Live { obj, cache });
            }
            Op::Free { pick } if !live.is_empty() => {
                let Live { obj, cache } = live.swap_remove(pick % live.len());
                let ptr = obj.as_ptr();
                obj.free().unwrap();
                // The free check reported an overflow (if any).
                dirty.retain(|&d| d != ptr.as_ptr() as usize);
                freed.push(Obj { ptr, cache });
            }
            Op::DoubleFree { pick } if !freed.is_empty() => {
                let obj = &freed[pick % freed.len()];
                let addr = obj.ptr.as_ptr() as usize;
                // SAFETY: refused: the object is free.
                let result = unsafe { caches[obj.cache].free(obj.ptr) };
                prop_assert_eq!(result, Err(FreeError::DoubleFree { addr }));
                *owed.entry((ErrorKind::DuplicateFree, addr)).or_default() += 1;
            }
            Op::InteriorFree { pick } if !live.is_empty() => {
                let addr = live[pick % live.len()].addr();
                let cache = live[pick % live.len()].cache;
                // SAFETY: refused: not an object start.
                let result =
                    unsafe { caches[cache].free(NonNull::new_unchecked((addr + 8) as *mut u8)) };
                prop_assert_eq!(result, Err(FreeError::Misaligned { addr: addr + 8 }));
                *owed.entry((ErrorKind::InvalidFree, addr + 8)).or_default() += 1;
            }
            Op::WrongCacheFree { pick, to } if !live.is_empty() => {
                let obj = &live[pick % live.len()];
                if obj.cache == to {
                    continue;
                }
                let addr = obj.addr();
                // SAFETY: refused: another cache's object.
                let result = unsafe { caches[to].free(obj.obj.as_ptr()) };
                let refused = matches!(result, Err(FreeError::WrongCache { .. }));
                prop_assert!(refused, "wrong-cache free not refused: {:?}", result);
                *owed.entry((ErrorKind::WrongCache, addr)).or_default() += 1;
            }
            Op::ForeignFree => {
                let addr = foreign.as_ptr() as usize + 8;
                // SAFETY: refused: not the allocator's memory.
                let result = unsafe { caches[0].free(NonNull::new_unchecked(addr as *mut u8)) };
                prop_assert_eq!(result, Err(FreeError::NotAllocated { addr }));
                *owed.entry((ErrorKind::ForeignPointer, addr)).or_default() += 1;
            }
            Op::WriteAfterFree { pick, offset } if !freed.is_empty() => {
                let obj = &freed[pick % freed.len()];
                let addr = obj.ptr.as_ptr() as usize;
                if dirty.contains(&addr) {
                    continue;
                }
                let offset = offset % SIZES[obj.cache];
                let poison = POISON_FREE.to_le_bytes()[offset % 8];
                // SAFETY: test: a use after free into a free slab object
                // (its slab is alive: `freed` is emptied by reaps).
                unsafe { obj.ptr.as_ptr().add(offset).write(!poison) };
                dirty.push(addr);
                *owed
                    .entry((ErrorKind::ModifiedAfterFree, addr))
                    .or_default() += 1;
            }
            Op::Overflow { pick } if !live.is_empty() => {
                let obj = &live[pick % live.len()];
                let addr = obj.addr();
                if dirty.contains(&addr) {
                    continue;
                }
                // SAFETY: test: one byte past the object, into its redzone.
                unsafe { obj.obj.as_ptr().as_ptr().add(SIZES[obj.cache]).write(0x41) };
                dirty.push(addr);
                *owed.entry((ErrorKind::RedzoneViolation, addr)).or_default() += 1;
            }
            Op::Reap { cache } => {
                caches[cache].reap();
                // Freed objects may have left with their slab (a write
                // after free in them was reported by the reap).
                freed.clear();
                dirty.retain(|&d| live.iter().any(|obj| obj.addr() == d));
            }
            Op::SwitchCpu { cpu } => set_cpu(cpu),
            _ => {}
        }
        settle(alloc, &mut seen, &mut owed)?;
        #[cfg(debug_assertions)]
        alloc
            .debug()
            .check_invariants()
            .map_err(|error| TestCaseError::fail(std::format!("{error}")))?;
    }
    // Free everything (overflows are reported here), verify the rest
    // (writes after free into objects still free).
    for Live { obj, .. } in live.drain(..) {
        obj.free().unwrap();
    }
    alloc.debug().verify();
    settle(alloc, &mut seen, &mut owed)?;
    prop_assert!(
        owed.values().all(|&n| n == 0),
        "bugs never reported: {:?}",
        owed.iter().filter(|(_, n)| **n != 0).collect::<Vec<_>>()
    );
    set_cpu(0);
    Ok(())
}

/// Match the reports made since `seen` against what is owed.
fn settle(
    alloc: &TestAlloc,
    seen: &mut u64,
    owed: &mut HashMap<(ErrorKind, usize), usize>,
) -> Result<(), TestCaseError> {
    let reports = errors_since(alloc, *seen);
    prop_assert_eq!(
        reports.len() as u64,
        alloc.debug().nr_errors() - *seen,
        "more reports than the ring keeps in one step"
    );
    for report in reports {
        *seen = report.seq;
        let key = (report.kind, report.buffer);
        match owed.get_mut(&key) {
            Some(n) if *n > 0 => *n -= 1,
            _ => {
                return Err(TestCaseError::fail(std::format!(
                    "unexpected report {:?} of {:#x} in {}",
                    report.kind,
                    report.buffer,
                    report.cache
                )));
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(proptest_config(32))]
    #[test]
    fn debug_fuzz(ops in proptest::collection::vec(op(), 1..300)) {
        run(ops)?;
    }
}
