//! The workloads. Each returns how many operations it did, where an
//! operation is what the tables count: an alloc+free pair for `cache-pair`
//! and `cross-free` (per object), one alloc or one free for
//! `kmalloc-mixed`.

use std::alloc::Layout;
use std::cell::UnsafeCell;
use std::hint::black_box;
use std::sync::Barrier;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::allocs::BenchAlloc;

/// Workload names, in table order.
pub const WORKLOADS: &[&str] = &["cache-pair", "kmalloc-mixed", "cross-free"];

/// Live-object window of `kmalloc-mixed`.
pub const MIXED_SLOTS: usize = 256;
/// Objects per batch handed from producer to consumer in `cross-free`.
pub const CROSS_BATCH: usize = 256;
/// Batches in flight in `cross-free`.
const CROSS_DEPTH: usize = 8;

/// A deterministic xorshift64 stream.
#[derive(Clone, Copy)]
pub struct XorShift(u64);

impl XorShift {
    /// A stream from a seed (non-zero after mixing).
    pub fn new(seed: u64) -> XorShift {
        XorShift(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    /// Next value.
    #[inline(always)]
    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
}

/// `n` alloc+free pairs of one 64-byte object (the magazine hit path).
#[inline(never)]
pub fn cache_pair<A: BenchAlloc>(a: &A, n: u64) -> u64 {
    for _ in 0..n {
        let p = a.obj_alloc();
        assert!(!p.is_null(), "out of memory");
        // SAFETY: just allocated.
        unsafe { a.obj_free(black_box(p)) };
    }
    n
}

/// [`cache_pair`] with a disabled fault point consulted before each
/// alloc, as every `kmalloc!` / `kmem_cache_alloc!` site of the kernel
/// does (`magpie-bench fault`): the difference is a disabled point's cost.
#[inline(never)]
pub fn cache_pair_fault<A: BenchAlloc>(a: &A, n: u64) -> u64 {
    for _ in 0..n {
        let p = if magpie_codetag::dynamic_fault!(Memory) {
            std::ptr::null_mut()
        } else {
            a.obj_alloc()
        };
        assert!(!p.is_null(), "out of memory");
        // SAFETY: just allocated.
        unsafe { a.obj_free(black_box(p)) };
    }
    n
}

/// State of one `kmalloc-mixed` run: a window of live objects.
pub struct Mixed {
    slots: Box<[(*mut u8, usize); MIXED_SLOTS]>,
    rng: XorShift,
}

impl Mixed {
    /// Fill every slot (not measured), so each step is one free + one alloc.
    pub fn new<A: BenchAlloc>(a: &A, seed: u64) -> Mixed {
        let mut m = Mixed {
            slots: Box::new([(std::ptr::null_mut(), 0); MIXED_SLOTS]),
            rng: XorShift::new(seed),
        };
        for i in 0..MIXED_SLOTS {
            let size = mixed_size(m.rng.next());
            // SAFETY: size >= 8.
            let p = unsafe { a.alloc(mixed_layout(size)) };
            assert!(!p.is_null(), "out of memory");
            // SAFETY: p has size >= 1 bytes.
            unsafe { p.write(i as u8) };
            m.slots[i] = (p, size);
        }
        m
    }

    /// Free everything.
    pub fn finish<A: BenchAlloc>(self, a: &A) {
        for &(p, size) in self.slots.iter() {
            // SAFETY: a live allocation of this size.
            unsafe { a.free(p, mixed_layout(size)) };
        }
    }
}

#[inline(always)]
pub fn mixed_size(r: u64) -> usize {
    8 + ((r >> 8) % 505) as usize
}

#[inline(always)]
pub fn mixed_layout(size: usize) -> Layout {
    // SAFETY: 8 is a power of two; sizes are small.
    unsafe { Layout::from_size_align_unchecked(size, 8) }
}

/// `steps` steps of the mixed 8..=512 B workload: each step frees a random
/// slot of the (full) window and allocates a random size into it, writing
/// one byte. Returns operations: 2 per step.
#[inline(never)]
pub fn kmalloc_mixed<A: BenchAlloc>(a: &A, m: &mut Mixed, steps: u64) -> u64 {
    for _ in 0..steps {
        let r = m.rng.next();
        let slot = (r as usize) & (MIXED_SLOTS - 1);
        let size = mixed_size(r);
        let (old, old_size) = m.slots[slot];
        // SAFETY: every slot holds a live allocation of its size.
        unsafe { a.free(old, mixed_layout(old_size)) };
        // SAFETY: size >= 8.
        let p = unsafe { a.alloc(mixed_layout(size)) };
        assert!(!p.is_null(), "out of memory");
        // SAFETY: p has size >= 1 bytes.
        unsafe { p.write(r as u8) };
        m.slots[slot] = (p, size);
    }
    2 * steps
}

/// One thread's `cross-free` baseline: allocate a batch, free it, on the
/// same thread. Returns objects.
#[inline(never)]
pub fn cross_free_local<A: BenchAlloc>(a: &A, objects: u64) -> u64 {
    let mut batch = [std::ptr::null_mut::<u8>(); CROSS_BATCH];
    let batches = objects / CROSS_BATCH as u64;
    for _ in 0..batches {
        for slot in batch.iter_mut() {
            let p = a.obj_alloc();
            assert!(!p.is_null(), "out of memory");
            *slot = p;
        }
        for &p in black_box(&batch).iter() {
            // SAFETY: allocated above.
            unsafe { a.obj_free(p) };
        }
    }
    batches * CROSS_BATCH as u64
}

/// Run `work` on `threads` threads (thread i acts as CPU i), all starting
/// together; returns (total ops, wall time from the first start to the
/// last finish).
pub fn run_threads<A: BenchAlloc>(
    a: &'static A,
    threads: usize,
    work: impl Fn(&'static A, usize) -> u64 + Sync,
) -> (u64, Duration) {
    let barrier = Barrier::new(threads);
    let results: Vec<(u64, Instant, Instant)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|cpu| {
                let barrier = &barrier;
                let work = &work;
                s.spawn(move || {
                    a.thread_init(cpu);
                    barrier.wait();
                    let start = Instant::now();
                    let ops = work(a, cpu);
                    (ops, start, Instant::now())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let ops = results.iter().map(|r| r.0).sum();
    let start = results.iter().map(|r| r.1).min().unwrap();
    let end = results.iter().map(|r| r.2).max().unwrap();
    (ops, end - start)
}

/// One slot of the `cross-free` hand-off ring: a batch of pointers and
/// whether it is full (owned by the consumer) or empty (by the producer).
#[repr(align(128))]
struct Slot {
    full: AtomicBool,
    batch: UnsafeCell<[*mut u8; CROSS_BATCH]>,
}

struct Ring([Slot; CROSS_DEPTH]);
// SAFETY: a slot's batch is only touched by the side that owns it, as
// handed over by the `full` flag (Release/Acquire).
unsafe impl Sync for Ring {}

/// Wait for a flag: spin briefly, then yield (a blocking channel would
/// measure futex wake-ups instead of allocators).
#[inline]
fn spin_until(flag: &AtomicBool, value: bool) {
    let mut spins = 0u32;
    while flag.load(Ordering::Acquire) != value {
        spins += 1;
        if spins < 256 {
            std::hint::spin_loop();
        } else {
            // The other side may not be running (a 2-vCPU VM): let it.
            std::thread::yield_now();
        }
    }
}

/// `cross-free` on two threads: CPU 0 allocates batches of objects into a
/// ring of slots; CPU 1 frees each full batch and hands the slot back.
/// Returns (objects, wall time).
pub fn cross_free_pair<A: BenchAlloc>(a: &'static A, objects: u64) -> (u64, Duration) {
    let batches = objects / CROSS_BATCH as u64;
    let ring = Ring(std::array::from_fn(|_| Slot {
        full: AtomicBool::new(false),
        batch: UnsafeCell::new([std::ptr::null_mut(); CROSS_BATCH]),
    }));
    let ring = &ring;
    let barrier = Barrier::new(2);
    let barrier = &barrier;
    let (start, end) = std::thread::scope(|s| {
        let producer = s.spawn(move || {
            a.thread_init(0);
            barrier.wait();
            let start = Instant::now();
            for i in 0..batches as usize {
                let slot = &ring.0[i % CROSS_DEPTH];
                spin_until(&slot.full, false);
                // SAFETY: the slot is empty: ours until we set `full`.
                let batch = unsafe { &mut *slot.batch.get() };
                for p in batch.iter_mut() {
                    let obj = a.obj_alloc();
                    assert!(!obj.is_null(), "out of memory");
                    *p = obj;
                }
                slot.full.store(true, Ordering::Release);
            }
            start
        });
        let consumer = s.spawn(move || {
            a.thread_init(1);
            barrier.wait();
            for i in 0..batches as usize {
                let slot = &ring.0[i % CROSS_DEPTH];
                spin_until(&slot.full, true);
                // SAFETY: the slot is full: ours until we clear `full`.
                let batch = unsafe { &*slot.batch.get() };
                for &p in batch.iter() {
                    // SAFETY: allocated by the producer, handed over whole.
                    unsafe { a.obj_free(p) };
                }
                slot.full.store(false, Ordering::Release);
            }
            Instant::now()
        });
        (producer.join().unwrap(), consumer.join().unwrap())
    });
    (batches * CROSS_BATCH as u64, end - start)
}
