//! `magpie-bench record WORKLOAD OUT.kmt`: the two replay workloads that
//! are Rust heap code rather than kernel commands, run on the host through
//! magpie-slab (`&'static Kmem` as `core::alloc::Allocator`, so
//! `Box`, `Vec` and `BTreeMap` allocate from it) with kmemtrace recording
//! on, and dumped by the library's own writer (`kmemtrace_dump`): the same
//! events and format the kernel's `kmemtrace dump` sends.
//!
//! - `heap-tests`: the heap tests of examples/hobby-kernel (those of
//!   "Writing an OS in Rust", `tests/heap_allocation.rs`, plus its
//!   BTreeMap churn), one CPU, in the same order with the same counts.
//!   The example kernel has no dump channel; its code is recorded here.
//! - `btree-vec`: a BTreeMap/Vec-heavy workload on two CPUs: each keeps a
//!   `BTreeMap<u64, Vec<u64>>` of up to 2,000 keys, inserting vectors of
//!   1 to 64 elements grown by `push` (so by `realloc`), replacing and
//!   removing keys from a seeded random stream, and strings formatted
//!   from the map's values; the CPUs take turns of 100 steps, so every
//!   recording is the same.
//!
//! The kernel's own workloads (boot, `stress`, shell commands) are
//! recorded in QEMU by `bench/record-workloads.sh`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

use magpie_slab::Platform;
use magpie_slab::kmemtrace::{DumpInfo, KmemtraceConfig};

use crate::allocs::{MAGPIE, Magpie};
use crate::host::{BenchPlatform, set_cpu};
use crate::workloads::XorShift;

/// The workloads `record` knows.
pub const RECORDED: &[&str] = &["heap-tests", "btree-vec"];

/// The examples/hobby-kernel heap tests, in its order and counts.
fn heap_tests() {
    let heap = &MAGPIE;
    let (a, b) = (Box::new_in(41, heap), Box::new_in(13, heap));
    assert_eq!(*a + *b, 54);
    drop((a, b));

    let mut vec = Vec::new_in(heap);
    for i in 0..1000_u64 {
        vec.push(i);
    }
    assert_eq!(vec.iter().sum::<u64>(), 999 * 1000 / 2);
    drop(vec);

    for i in 0..10_000_usize {
        assert_eq!(*Box::new_in(i, heap), i);
    }

    let long_lived = Box::new_in(1, heap);
    for i in 0..10_000_usize {
        assert_eq!(*Box::new_in(i, heap), i);
    }
    assert_eq!(*long_lived, 1);
    drop(long_lived);

    let mut map = BTreeMap::new_in(heap);
    for round in 0..20_u64 {
        for key in 0..500_u64 {
            map.insert(key * 7919 % 1000, round + key);
        }
        for key in 0..250_u64 {
            map.remove(&(key * 3));
        }
    }
    for key in 0..500_u64 {
        let k = key * 7919 % 1000;
        let removed = k % 3 == 0 && k < 750;
        assert_eq!(map.get(&k).copied(), (!removed).then_some(19 + key));
    }
}

/// Steps a CPU of `btree-vec` runs before handing the turn to the other.
const BTREE_VEC_TURN: u64 = 100;

/// One CPU's share of `btree-vec`; the two CPUs take turns of
/// [`BTREE_VEC_TURN`] steps (`turn` counts them), so the recording is
/// the same on every run.
fn btree_vec(cpu: usize, turn: &AtomicU64) {
    let heap = &MAGPIE;
    let mut rng = XorShift::new(0xb7ee + cpu as u64);
    let mut map = BTreeMap::new_in(heap);
    let mut text = String::new();
    for step in 0..40_000_u64 {
        if step % BTREE_VEC_TURN == 0 {
            while turn.load(Ordering::Acquire) % 2 != cpu as u64 {
                std::thread::yield_now();
            }
        }
        let r = rng.next();
        let key = r % 2_000;
        match (r >> 16) % 4 {
            0 | 1 => {
                let len = 1 + (r >> 24) % 64;
                let mut v = Vec::new_in(heap);
                for i in 0..len {
                    v.push(step ^ i);
                }
                map.insert(key, v);
            }
            2 => {
                map.remove(&key);
            }
            _ => {
                if let Some(v) = map.get_mut(&key) {
                    v.push(step);
                    text.clear();
                    write!(text, "{key}:{}", v.len()).unwrap();
                    let mut copy = Vec::new_in(heap);
                    copy.extend_from_slice(text.as_bytes());
                    let len = Box::new_in(text.len(), heap);
                    assert_eq!(*len, copy.len());
                }
            }
        }
        if step % BTREE_VEC_TURN == BTREE_VEC_TURN - 1 {
            turn.fetch_add(1, Ordering::Release);
        }
    }
}

/// `record WORKLOAD OUT.kmt`.
///
/// # Errors
/// An unknown workload, an output that cannot be written, a recording
/// that lost events.
pub fn main(args: &[String]) -> Result<(), String> {
    let [workload, out] = args else {
        return Err(format!(
            "usage: magpie-bench record {} OUT.kmt",
            RECORDED.join("|")
        ));
    };
    if !RECORDED.contains(&workload.as_str()) {
        return Err(format!(
            "unknown workload {workload} (one of {})",
            RECORDED.join(", ")
        ));
    }
    let _magpie = Box::leak(Box::new(Magpie::<BenchPlatform, false>::with_heap(
        512 << 20,
    )));
    let config = KmemtraceConfig {
        nr_subbufs: 512,
        ..Default::default()
    };
    MAGPIE
        .kmemtrace()
        .start(config)
        .map_err(|e| format!("kmemtrace start: {e:?}"))?;
    let start = BenchPlatform::now();
    match workload.as_str() {
        "heap-tests" => heap_tests(),
        _ => {
            let turn = AtomicU64::new(0);
            std::thread::scope(|scope| {
                for cpu in 0..2 {
                    let turn = &turn;
                    scope.spawn(move || {
                        set_cpu(cpu);
                        btree_vec(cpu, turn);
                    });
                }
            })
        }
    }
    MAGPIE.kmemtrace().stop();
    let status = MAGPIE.kmemtrace().status();
    if status.nr_overruns > 0 {
        return Err(format!("{} events lost to overruns", status.nr_overruns));
    }
    let ticks_to_ns = |ticks: u64| ticks.saturating_sub(start);
    let info = DumpInfo {
        build_id: [0; 20],
        ticks_to_ns: &ticks_to_ns,
    };
    let mut bytes = Vec::new();
    let summary = MAGPIE
        .kmemtrace()
        .dump(&info, &mut |chunk| bytes.extend_from_slice(chunk));
    std::fs::write(out, &bytes).map_err(|e| format!("{out}: {e}"))?;
    eprintln!(
        "record {workload}: {} events, {} bytes -> {out}",
        summary.nr_events, summary.nr_bytes
    );
    Ok(())
}
