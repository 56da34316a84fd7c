//! The trace table and statistics stay exact under SMP: a cache is traced while
//! every CPU allocates and frees from it at once (some frees crossing
//! CPUs); `kmemtrace print` then shows exactly the objects still live,
//! each with the CPU that allocated it, and the cache's counters match.
//!
//! Boots with 4 CPUs (the runner's default for `smp_*` test kernels).

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

use alloc::string::String;
use alloc::vec::Vec;
use core::ptr::NonNull;
use magpie_slab::CacheArgs;

use magpie::kmem::{self, SLAB};
use magpie::shell::Shell;
use magpie::{arch, println, smp};
use spin::Mutex;

magpie::test_kernel!();

/// Objects each CPU allocates.
const NR_PER_CPU: usize = 400;
const OBJ_SIZE: usize = 96;

/// A live object and the CPU that allocated it.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
struct Live {
    addr: usize,
    cpu: usize,
}

/// Parses `kmemtrace print` output: (address, cpu) of each `Obj` block.
fn parse_records(output: &str) -> Vec<Live> {
    let mut records = Vec::new();
    for line in output.lines().filter(|line| line.starts_with("Obj 0x")) {
        // "Obj 0x..., size 96, cpu 2, at ... ns, from ...:"
        let mut fields = line.split(", ");
        let addr = fields.next().unwrap().trim_start_matches("Obj 0x");
        let addr = usize::from_str_radix(addr, 16).expect("hex address");
        let cpu = fields
            .find_map(|field| field.strip_prefix("cpu "))
            .expect("cpu field")
            .parse()
            .expect("cpu number");
        records.push(Live { addr, cpu });
    }
    records.sort_unstable();
    records
}

#[test_case]
fn kmemtrace_print_shows_exactly_the_live_objects_under_smp() {
    let nr_cpus = smp::nr_online();
    assert!(
        nr_cpus >= 2,
        "the SMP tests need at least 2 CPUs (MAGPIE_SMP)"
    );
    let cache = SLAB
        .cache_create(
            "smp-traced",
            OBJ_SIZE,
            &CacheArgs {
                align: 8,
                ..CacheArgs::DEFAULT
            },
        )
        .expect("create smp-traced");
    let mut shell = Shell::new();
    let mut out = String::new();
    shell.execute("kmemtrace start smp-traced", &mut out);
    assert!(out.contains("tracing smp-traced"), "{out}");

    // Phase 1, all CPUs at once: allocate, free every other object locally.
    let kept: Vec<Mutex<Vec<Live>>> = (0..arch::max_cpus())
        .map(|_| Mutex::new(Vec::new()))
        .collect();
    smp::run_on_all(&|cpu| {
        let mut mine = Vec::with_capacity(NR_PER_CPU);
        for index in 0..NR_PER_CPU {
            let obj = cache.alloc().expect("alloc");
            if index % 2 == 0 {
                // SAFETY: just allocated from this cache, freed once.
                unsafe { cache.free(obj) }.expect("local free");
            } else {
                mine.push(Live {
                    addr: obj.as_ptr() as usize,
                    cpu,
                });
            }
        }
        *kept[cpu].lock() = mine;
    });
    // Phase 2, all CPUs at once: each frees half of its neighbour's objects.
    smp::run_on_all(&|cpu| {
        let neighbour = (cpu + 1) % nr_cpus;
        let theirs: Vec<Live> = {
            let mut list = kept[neighbour].lock();
            let half = list.len() / 2;
            list.drain(..half).collect()
        };
        for live in theirs {
            assert_ne!(live.cpu, cpu);
            // SAFETY: allocated from this cache by the neighbour, removed
            // from its list under the lock, so freed exactly once.
            unsafe { cache.free(NonNull::new(live.addr as *mut u8).unwrap()) }
                .expect("cross-CPU free");
        }
    });

    let mut expected: Vec<Live> = kept.iter().flat_map(|list| list.lock().clone()).collect();
    expected.sort_unstable();
    let nr_live = nr_cpus * NR_PER_CPU / 2 - nr_cpus * (NR_PER_CPU / 4);
    assert_eq!(expected.len(), nr_live);

    out.clear();
    shell.execute("kmemtrace print smp-traced", &mut out);
    let records = parse_records(&out);
    assert_eq!(
        records.len(),
        expected.len(),
        "records shown vs objects live"
    );
    assert_eq!(
        records, expected,
        "kmemtrace print lists exactly the live objects, with the allocating CPU"
    );
    let summary = alloc::format!("{nr_live} outstanding objects in smp-traced, 0 records dropped");
    assert!(out.contains(&summary), "summary line missing: {summary}");
    for cpu in 0..nr_cpus {
        assert!(
            records.iter().any(|record| record.cpu == cpu),
            "no record from cpu {cpu}"
        );
    }

    let stats = cache.stats();
    assert_eq!(stats.nr_allocated, nr_live);
    assert_eq!(stats.nr_allocs_ever, (nr_cpus * NR_PER_CPU) as u64);
    assert_eq!(stats.nr_frees_ever, (nr_cpus * NR_PER_CPU - nr_live) as u64);
    println!(
        "{} live objects traced on {nr_cpus} CPUs; stats agree",
        records.len()
    );

    // Free the rest from the boot CPU; the table empties.
    shell.execute("kmemtrace stop smp-traced", &mut out);
    for live in &expected {
        // SAFETY: each live object is freed once, here.
        unsafe { cache.free(NonNull::new(live.addr as *mut u8).unwrap()) }.expect("final free");
    }
    out.clear();
    shell.execute("kmemtrace print smp-traced", &mut out);
    assert!(parse_records(&out).is_empty(), "{out}");
    assert!(out.contains("0 outstanding objects in smp-traced"), "{out}");
    assert_eq!(cache.stats().nr_allocated, 0);
    // SAFETY: no object of the cache is live and nothing uses it after this.
    let report = unsafe { kmem::cache_destroy(cache) }.expect("destroy");
    assert_eq!(report.nr_trace_records_dropped, 0);
}
