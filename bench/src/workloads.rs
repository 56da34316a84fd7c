//! The workloads. Each returns how many operations it did; what an
//! operation is per workload is in [`WORKLOADS`] (and docs/BENCHMARKS.md).
//! Every allocator call goes through [`crate::allocs::call`] (one
//! out-of-line function per call, as `__rust_alloc` is), with the layout
//! a run-time value for every allocator (the 64-byte workloads pass
//! [`obj_layout`]); only the labelled `pair64-const` row passes a
//! constant layout.

use std::alloc::Layout;
use std::cell::UnsafeCell;
use std::hint::black_box;
use std::sync::Barrier;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::allocs::{BenchAlloc, call, obj_layout};

/// One workload: its name, what one operation is, and whether it runs on
/// 2 threads in the scaling table.
pub struct Workload {
    /// Command-line name.
    pub name: &'static str,
    /// What one operation is (table captions).
    pub op: &'static str,
    /// Measured at 1 and 2 threads for the scaling table.
    pub two_threads: bool,
    /// Uses the 64-byte object calls (`obj_alloc`/`obj_free`), so the
    /// labelled `magpie-cache` row applies.
    pub obj: bool,
}

/// Workloads, in table order.
pub const WORKLOADS: &[Workload] = &[
    Workload {
        name: "pair64",
        op: "alloc+free pair, 64 B",
        two_threads: true,
        obj: true,
    },
    Workload {
        name: "pair64-const",
        op: "the same pair, layout a constant inside the call (folded by Rust allocators, not by C ones)",
        two_threads: false,
        obj: true,
    },
    Workload {
        name: "mixed",
        op: "alloc or free, 8–512 B",
        two_threads: true,
        obj: false,
    },
    Workload {
        name: "mixed-8k",
        op: "alloc or free, 8–8192 B",
        two_threads: true,
        obj: false,
    },
    Workload {
        name: "align",
        op: "alloc or free, 8–512 B, align 16–256",
        two_threads: false,
        obj: false,
    },
    Workload {
        name: "align-4k",
        op: "alloc or free, 8–512 B, align 512–4096",
        two_threads: false,
        obj: false,
    },
    Workload {
        name: "realloc-same",
        op: "realloc 40 B ↔ 56 B",
        two_threads: false,
        obj: false,
    },
    Workload {
        name: "realloc-grow",
        op: "realloc step, 16 B → 4 KiB by doubling",
        two_threads: false,
        obj: false,
    },
    Workload {
        name: "realloc-1m",
        op: "realloc chain: 8 B grown to 1 MiB by doubling (17 reallocs, as a `Vec<u8>` pushed to 1 MiB), then freed; one chain is one operation",
        two_threads: false,
        obj: false,
    },
    Workload {
        name: "batch",
        op: "alloc or free, 64 B, 16 Ki live",
        two_threads: false,
        obj: true,
    },
    Workload {
        name: "remote-free",
        op: "object: alloc on CPU 0, free on CPU 1",
        two_threads: false,
        obj: true,
    },
    Workload {
        name: "cross-free",
        op: "object: alloc + free, 64 B, batches of 256",
        two_threads: true,
        obj: true,
    },
];

/// Names of [`WORKLOADS`].
pub fn names() -> Vec<&'static str> {
    WORKLOADS.iter().map(|w| w.name).collect()
}

/// Live-object window of the mixed workloads.
pub const MIXED_SLOTS: usize = 256;
/// The window of `--slots 1048576` (not in the suite): 1Mi live objects,
/// for cache-miss counts of the free (`valgrind --tool=cachegrind`;
/// issue 18).
pub const BIG_SLOTS: usize = 1 << 20;
/// Objects alive at once in `batch` (far beyond a CPU's magazines).
pub const BATCH_OBJS: usize = 16 * 1024;
/// Objects per hand-over in `remote-free`.
pub const REMOTE_BATCH: usize = 1024;
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

/// Size and alignment distributions of the window workloads.
#[derive(Clone, Copy)]
pub enum Sizes {
    /// Uniform 8..=512 B, align 8.
    Small,
    /// Every power-of-two band 8–16, 16–32, …, 4096–8192 equally likely,
    /// uniform inside the band; align 8.
    Large,
    /// Uniform 8..=512 B, align 16, 32, 64, 128 or 256.
    Aligned,
    /// Uniform 8..=512 B, align 512, 1024, 2048 or 4096.
    PageAligned,
}

impl Sizes {
    /// The layout for random value `r`.
    #[inline(always)]
    pub fn layout(self, r: u64) -> Layout {
        let (size, align) = match self {
            Sizes::Small => (mixed_size(r), 8),
            Sizes::Large => {
                let band = 3 + ((r >> 8) % 10) as u32; // 2^3 ..= 2^12
                let low = 1usize << band;
                (low + ((r >> 16) as usize % (low + 1)), 8)
            }
            Sizes::Aligned => (mixed_size(r), 16 << ((r >> 40) % 5)),
            Sizes::PageAligned => (mixed_size(r), 512 << ((r >> 40) % 4)),
        };
        // SAFETY: align is a power of two; size is small.
        unsafe { Layout::from_size_align_unchecked(size, align) }
    }
}

/// Uniform 8..=512 from random value `r`.
#[inline(always)]
pub fn mixed_size(r: u64) -> usize {
    8 + ((r >> 8) % 505) as usize
}

/// An 8-aligned layout of `size` bytes.
#[inline(always)]
pub fn mixed_layout(size: usize) -> Layout {
    // SAFETY: 8 is a power of two; sizes are small.
    unsafe { Layout::from_size_align_unchecked(size, 8) }
}

/// What a caller does with a fresh object, as real code does (issue 33):
/// fill a word, then set one byte (the last write narrower than a word,
/// at offset 0, as when code fills a small struct and sets a flag or a
/// string's first byte). Every workload writes so into every object it
/// allocates, for every allocator alike (`null`'s buffer too, so the
/// writes are part of the harness subtracted): a free soon after then
/// pays whatever the allocator's loads of the object cost behind these
/// stores (a word's load right after a byte's store at the same address
/// cannot be forwarded from the store buffer). Volatile, so neither
/// store is merged or dropped. `p` is 8-aligned with at least 8 bytes
/// (every workload layout is).
#[inline(always)]
#[expect(
    clippy::cast_ptr_alignment,
    reason = "every workload layout is 8-aligned with at least 8 bytes"
)]
pub fn touch(p: *mut u8, r: u64) {
    // SAFETY: per the contract above, 8 bytes of the caller's object.
    unsafe {
        p.cast::<u64>().write_volatile(r);
        p.write_volatile((r >> 8) as u8 ^ 0x5a);
    }
}

/// `n` alloc+free pairs of one 64-byte object (the magazine hit path),
/// the layout passed at run time.
#[inline(never)]
pub fn pair64<A: BenchAlloc>(a: &A, n: u64) -> u64 {
    let layout = obj_layout();
    for _ in 0..n {
        let p = call::obj_alloc(a, layout);
        assert!(!p.is_null(), "out of memory");
        touch(p, n);
        // SAFETY: just allocated.
        unsafe { call::obj_free(a, black_box(p), layout) };
    }
    n
}

/// [`pair64`] with the layout a constant inside each call (the labelled
/// `pair64-const` row: what a Rust allocator gives when the compiler
/// folds its size-class lookup; a C allocator behind FFI cannot fold).
#[inline(never)]
pub fn pair64_const<A: BenchAlloc>(a: &A, n: u64) -> u64 {
    for _ in 0..n {
        let p = call::obj_alloc_const(a);
        assert!(!p.is_null(), "out of memory");
        touch(p, n);
        // SAFETY: just allocated.
        unsafe { call::obj_free_const(a, black_box(p)) };
    }
    n
}

/// [`pair64`] with a disabled fault point consulted before each alloc, as
/// every `kmalloc!` / `kmem_cache_alloc!` site of the kernel does
/// (`magpie-bench fault`, and the suite's fault row): the difference is a
/// disabled point's cost. Not in [`WORKLOADS`].
#[inline(never)]
pub fn pair64_fault<A: BenchAlloc>(a: &A, n: u64) -> u64 {
    let layout = obj_layout();
    for _ in 0..n {
        let p = if magpie_codetag::dynamic_fault!(Memory) {
            std::ptr::null_mut()
        } else {
            call::obj_alloc(a, layout)
        };
        assert!(!p.is_null(), "out of memory");
        touch(p, n);
        // SAFETY: just allocated.
        unsafe { call::obj_free(a, black_box(p), layout) };
    }
    n
}

/// State of one mixed run: a window of `SLOTS` live objects.
pub struct Mixed<const SLOTS: usize = MIXED_SLOTS> {
    slots: Box<[(*mut u8, Layout); SLOTS]>,
    rng: XorShift,
    sizes: Sizes,
}

impl<const SLOTS: usize> Mixed<SLOTS> {
    /// Fill every slot (not measured), so each step is one free + one alloc.
    pub fn new<A: BenchAlloc>(a: &A, seed: u64, sizes: Sizes) -> Mixed<SLOTS> {
        let slots = vec![(std::ptr::null_mut(), Layout::new::<u8>()); SLOTS];
        let mut m = Mixed {
            slots: slots.into_boxed_slice().try_into().expect("SLOTS slots"),
            rng: XorShift::new(seed),
            sizes,
        };
        for i in 0..SLOTS {
            let layout = sizes.layout(m.rng.next());
            let p = call::alloc(a, layout);
            assert!(!p.is_null(), "out of memory");
            touch(p, i as u64);
            m.slots[i] = (p, layout);
        }
        m
    }

    /// Free everything.
    pub fn finish<A: BenchAlloc>(self, a: &A) {
        for &(p, layout) in self.slots.iter() {
            // SAFETY: a live allocation of this layout.
            unsafe { call::free(a, p, layout) };
        }
    }
}

/// `steps` steps of a window workload: each step frees a random slot of
/// the (full) window and allocates a random layout into it, writing one
/// byte. Returns operations: 2 per step.
#[inline(never)]
pub fn mixed<A: BenchAlloc, const SLOTS: usize>(a: &A, m: &mut Mixed<SLOTS>, steps: u64) -> u64 {
    const { assert!(SLOTS.is_power_of_two()) };
    for _ in 0..steps {
        let r = m.rng.next();
        let slot = (r as usize) & (SLOTS - 1);
        let layout = m.sizes.layout(r);
        let (old, old_layout) = m.slots[slot];
        // SAFETY: every slot holds a live allocation of its layout.
        unsafe { call::free(a, old, old_layout) };
        let p = call::alloc(a, layout);
        assert!(!p.is_null(), "out of memory");
        touch(p, r);
        m.slots[slot] = (p, layout);
    }
    2 * steps
}

/// Largest block of a `realloc-1m` chain.
pub const CHAIN_MAX: usize = 1 << 20;

/// `chains` times: allocate 8 bytes, double it by `realloc` up to
/// [`CHAIN_MAX`] (writing the last byte each time, as a `Vec<u8>` pushed
/// to 1 MiB does), free it. Returns chains: one chain is one operation
/// (the "realloc chain to 1 MiB" figure).
#[inline(never)]
pub fn realloc_chain<A: BenchAlloc>(a: &A, chains: u64) -> u64 {
    for _ in 0..chains {
        let mut layout = mixed_layout(black_box(8));
        let mut p = call::alloc(a, layout);
        assert!(!p.is_null(), "out of memory");
        while layout.size() < CHAIN_MAX {
            let new_size = layout.size() * 2;
            // SAFETY: p is live with `layout`.
            p = unsafe { call::realloc(a, black_box(p), layout, black_box(new_size)) };
            assert!(!p.is_null(), "out of memory");
            layout = mixed_layout(new_size);
            // SAFETY: p has new_size bytes.
            unsafe { p.add(new_size - 1).write(1) };
        }
        // SAFETY: live with `layout`.
        unsafe { call::free(a, p, layout) };
    }
    chains
}

/// `n` reallocs of one object between 40 and 56 bytes (one size class
/// for a slab allocator: the block can stay in place). One byte written
/// after each.
#[inline(never)]
pub fn realloc_same<A: BenchAlloc>(a: &A, n: u64) -> u64 {
    let mut layout = mixed_layout(black_box(40));
    let mut p = call::alloc(a, layout);
    assert!(!p.is_null(), "out of memory");
    touch(p, n);
    for i in 0..n {
        let new_size = if layout.size() == 40 { 56 } else { 40 };
        // SAFETY: p is live with `layout`.
        p = unsafe { call::realloc(a, black_box(p), layout, black_box(new_size)) };
        assert!(!p.is_null(), "out of memory");
        layout = mixed_layout(new_size);
        touch(p, i);
    }
    // SAFETY: live with `layout`.
    unsafe { call::free(a, p, layout) };
    n
}

/// Reallocs per `realloc-grow` chain (16 B doubled 8 times: 4096 B).
pub const GROW_STEPS: u64 = 8;

/// `chains` times: allocate 16 bytes, double it by `realloc` up to 4096
/// bytes (writing the last byte each time), free it. Returns reallocs;
/// the chain's alloc and free are part of the cost.
#[inline(never)]
pub fn realloc_grow<A: BenchAlloc>(a: &A, chains: u64) -> u64 {
    for _ in 0..chains {
        let mut layout = mixed_layout(black_box(16));
        let mut p = call::alloc(a, layout);
        assert!(!p.is_null(), "out of memory");
        touch(p, chains);
        for _ in 0..GROW_STEPS {
            let new_size = layout.size() * 2;
            // SAFETY: p is live with `layout`.
            p = unsafe { call::realloc(a, black_box(p), layout, black_box(new_size)) };
            assert!(!p.is_null(), "out of memory");
            layout = mixed_layout(new_size);
            touch(p, new_size as u64);
            // SAFETY: p has new_size bytes.
            unsafe { p.add(new_size - 1).write(1) };
        }
        // SAFETY: live with `layout`.
        unsafe { call::free(a, p, layout) };
    }
    chains * GROW_STEPS
}

/// `rounds` times: allocate `BATCH_OBJS` 64-byte objects, then free them
/// in allocation order. Far more objects than a CPU's magazines hold, so
/// the frees overflow into the depot (and the slab layer) and the
/// allocations come back from there. Returns operations (allocs + frees).
#[inline(never)]
pub fn batch<A: BenchAlloc>(a: &A, objs: &mut [*mut u8], rounds: u64) -> u64 {
    let layout = obj_layout();
    for _ in 0..rounds {
        for slot in objs.iter_mut() {
            let p = call::obj_alloc(a, layout);
            assert!(!p.is_null(), "out of memory");
            touch(p, p.addr() as u64);
            *slot = p;
        }
        for &p in black_box(&*objs).iter() {
            // SAFETY: allocated above.
            unsafe { call::obj_free(a, p, layout) };
        }
    }
    rounds * 2 * objs.len() as u64
}

/// One thread's `cross-free` baseline: allocate a batch, free it, on the
/// same thread. Returns objects.
#[inline(never)]
pub fn cross_free_local<A: BenchAlloc>(a: &A, objects: u64) -> u64 {
    let mut batch = [std::ptr::null_mut::<u8>(); CROSS_BATCH];
    let batches = objects / CROSS_BATCH as u64;
    let layout = obj_layout();
    for _ in 0..batches {
        for slot in batch.iter_mut() {
            let p = call::obj_alloc(a, layout);
            assert!(!p.is_null(), "out of memory");
            touch(p, p.addr() as u64);
            *slot = p;
        }
        for &p in black_box(&batch).iter() {
            // SAFETY: allocated above.
            unsafe { call::obj_free(a, p, layout) };
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

/// One slot of a hand-off ring: a batch of pointers and whether it is
/// full (owned by the consumer) or empty (by the producer).
#[repr(align(128))]
struct Slot<const N: usize> {
    full: AtomicBool,
    batch: UnsafeCell<[*mut u8; N]>,
}

struct Ring<const N: usize, const D: usize>([Slot<N>; D]);
// SAFETY: a slot's batch is only touched by the side that owns it, as
// handed over by the `full` flag (Release/Acquire).
unsafe impl<const N: usize, const D: usize> Sync for Ring<N, D> {}

/// Wait for a flag: spin `spins` times, then yield (a blocking channel
/// would measure futex wake-ups instead of allocators).
#[inline]
fn wait_until(flag: &AtomicBool, value: bool, spins: u32) {
    let mut n = 0u32;
    while flag.load(Ordering::Acquire) != value {
        n += 1;
        if n < spins {
            std::hint::spin_loop();
        } else {
            // The other side may not be running (a 2-vCPU VM): let it.
            std::thread::yield_now();
        }
    }
}

/// A producer (CPU 0) allocating batches of `N` objects into a ring of
/// `D` slots and a consumer (CPU 1) freeing each full batch. Returns
/// (objects, wall time).
fn hand_off<A: BenchAlloc, const N: usize, const D: usize>(
    a: &'static A,
    objects: u64,
    spins: u32,
) -> (u64, Duration) {
    let batches = objects / N as u64;
    let ring: Ring<N, D> = Ring(std::array::from_fn(|_| Slot {
        full: AtomicBool::new(false),
        batch: UnsafeCell::new([std::ptr::null_mut(); N]),
    }));
    let ring = &ring;
    let barrier = Barrier::new(2);
    let barrier = &barrier;
    let (start, end) = std::thread::scope(|s| {
        let producer = s.spawn(move || {
            a.thread_init(0);
            let layout = obj_layout();
            barrier.wait();
            let start = Instant::now();
            for i in 0..batches as usize {
                let slot = &ring.0[i % D];
                wait_until(&slot.full, false, spins);
                // SAFETY: the slot is empty: ours until we set `full`.
                let batch = unsafe { &mut *slot.batch.get() };
                for p in batch.iter_mut() {
                    let obj = call::obj_alloc(a, layout);
                    assert!(!obj.is_null(), "out of memory");
                    touch(obj, i as u64);
                    *p = obj;
                }
                slot.full.store(true, Ordering::Release);
            }
            start
        });
        let consumer = s.spawn(move || {
            a.thread_init(1);
            let layout = obj_layout();
            barrier.wait();
            for i in 0..batches as usize {
                let slot = &ring.0[i % D];
                wait_until(&slot.full, true, spins);
                // SAFETY: the slot is full: ours until we clear `full`.
                let batch = unsafe { &*slot.batch.get() };
                for &p in batch.iter() {
                    // SAFETY: allocated by the producer, handed over whole.
                    unsafe { call::obj_free(a, p, layout) };
                }
                slot.full.store(false, Ordering::Release);
            }
            Instant::now()
        });
        (producer.join().unwrap(), consumer.join().unwrap())
    });
    (batches * N as u64, end - start)
}

/// `cross-free` on two threads: batches of 256 through a ring of 8
/// slots, both threads running at once (spin, then yield).
pub fn cross_free_pair<A: BenchAlloc>(a: &'static A, objects: u64) -> (u64, Duration) {
    hand_off::<A, CROSS_BATCH, CROSS_DEPTH>(a, objects, 256)
}

/// `remote-free`: CPU 0 allocates `REMOTE_BATCH` objects, hands them to
/// CPU 1, which frees them all and hands the slot back; the two never
/// run at once (one slot, yield at once while waiting), so under
/// callgrind the count is the allocator's remote-free path plus a
/// hand-over per 1,024 objects.
pub fn remote_free<A: BenchAlloc>(a: &'static A, objects: u64) -> (u64, Duration) {
    hand_off::<A, REMOTE_BATCH, 1>(a, objects, 0)
}
