//! # magpie-bench: magpie-slab against peer allocators, on the host
//!
//! ```text
//! magpie-bench <workload> <allocator> [threads] [--n N [--warmup]] [--reps R] [--target-ms MS]
//! magpie-bench memory <allocator> <heap|burst>
//! magpie-bench suite [--out FILE] [--doc FILE] [--prof BIN] [--reps R] [--target-ms MS] [--no-callgrind]
//! magpie-bench replay DUMP [--json] [--no-callgrind] [--allocators A,B,...] [--heap-mib N]
//! magpie-bench replay-suite [--no-callgrind]
//! magpie-bench record heap-tests|btree-vec OUT.kmt
//! magpie-bench list
//! magpie-bench fault
//! magpie-bench slab-debug
//! ```
//!
//! A single run prints a `RESULT` line (median over the repetitions). With
//! `--n` the workload runs exactly N iterations per thread, once, with no
//! warm-up: that is what the callgrind measurements use; `--n N --warmup`
//! times R repetitions of N after one warm-up (the suite's wall-clock
//! rounds). `memory` runs the memory workloads for one allocator and
//! prints `MEM` lines. `suite` runs everything by re-running this binary
//! (and the `--prof` build for the profiling rows) and writes one markdown
//! report, optionally into `docs/BENCHMARKS.md` between its markers. See
//! docs/BENCHMARKS.md.
#![feature(thread_local, allocator_api, btreemap_alloc)]

mod allocs;
mod arena;
mod fixed_size_block;
mod host;
mod memory;
mod record;
mod replay;
mod suite;
mod workloads;

use std::time::Duration;

use allocs::{ALLOCATORS, BenchAlloc};
use host::{BenchPlatform, ProfPlatform};
use workloads::{Mixed, Sizes};

/// Options of a single run.
struct RunOpts {
    workload: String,
    allocator: String,
    threads: usize,
    n: Option<u64>,
    reps: usize,
    target: Duration,
    /// With `n`: warm up once and time `reps` repetitions (wall clock at
    /// a fixed size, as the suite's interleaved rounds do).
    warmup: bool,
    /// `--slots 1048576`: the window workloads keep 1Mi objects live
    /// instead of 256 (cache misses of a free far from its allocation).
    big_window: bool,
}

/// Median of the repetitions of a single run.
struct RunResult {
    n: u64,
    ops_per_rep: u64,
    ns_per_op: f64,
    mops: f64,
}

fn usage() -> ! {
    eprintln!(
        "usage: magpie-bench <workload> <allocator> [threads] [--n N [--warmup]] [--reps R] [--target-ms MS] [--slots 256|1048576]\n\
         \x20      magpie-bench memory <allocator> <heap|burst>\n\
         \x20      magpie-bench suite [--out FILE] [--doc FILE] [--prof BIN] [--reps R] [--target-ms MS] [--no-callgrind]\n\
         \x20      magpie-bench replay DUMP [--json] [--no-callgrind] [--allocators A,B,...] [--heap-mib N]\n\
         \x20      magpie-bench replay-suite [--no-callgrind]\n\
         \x20      magpie-bench record heap-tests|btree-vec OUT.kmt\n\
         \x20      magpie-bench list\n\
         \x20      magpie-bench fault | slab-debug\n\
         workloads: {}\nallocators: {}",
        workloads::names().join(" "),
        ALLOCATORS.join(" ")
    );
    std::process::exit(2);
}

/// Which magpie-slab features this build has compiled in.
pub fn variant() -> &'static str {
    match (
        cfg!(feature = "alloc-profiling"),
        cfg!(feature = "time-stats"),
    ) {
        (false, false) => "plain",
        (true, false) => "alloc-profiling",
        (false, true) => "time-stats",
        (true, true) => "alloc-profiling+time-stats",
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        None | Some("-h" | "--help") => usage(),
        Some("list") => {
            println!("workloads: {}", workloads::names().join(" "));
            println!("allocators: {}", ALLOCATORS.join(" "));
            println!("variant: {}", variant());
        }
        Some("suite") => suite::main(&args[1..]),
        Some("replay") => match replay::main(&args[1..]) {
            Ok(true) => {}
            Ok(false) => std::process::exit(1),
            Err(error) => {
                eprintln!("magpie-bench replay: {error}");
                std::process::exit(2)
            }
        },
        Some("record") => {
            if let Err(error) = record::main(&args[1..]) {
                eprintln!("magpie-bench record: {error}");
                std::process::exit(2)
            }
        }
        Some("replay-suite") => match replay::main_suite(&args[1..]) {
            Ok(true) => {}
            Ok(false) => std::process::exit(1),
            Err(error) => {
                eprintln!("magpie-bench replay-suite: {error}");
                std::process::exit(2)
            }
        },
        Some("replay-one") => {
            if let Err(error) = replay::main_one(&args[1..]) {
                eprintln!("magpie-bench replay-one: {error}");
                std::process::exit(2)
            }
        }
        Some("fault") => {
            let (plain, with_point) = suite::fault_cost(&suite::exe()).unwrap_or_else(|error| {
                eprintln!("magpie-bench fault: {error}");
                std::process::exit(1)
            });
            println!(
                "FAULT cache-pair={plain:.2} cache-pair-fault={with_point:.2} \
                 disabled-point={:.2} (callgrind instructions per kmem_cache alloc+free pair, \
                 variant {})",
                with_point - plain,
                variant()
            );
        }
        Some("slab-debug") => {
            let me = suite::exe();
            for (&(label, letters), result) in suite::SLAB_DEBUG_ROWS
                .iter()
                .zip(suite::slab_debug_cost(&me))
            {
                match result {
                    Ok(v) => println!(
                        "SLAB_DEBUG flags={} pair={v:.2} ({label}; callgrind instructions per \
                         kmem_cache alloc+free pair, variant {})",
                        if letters.is_empty() { "-" } else { letters },
                        variant()
                    ),
                    Err(error) => {
                        eprintln!("magpie-bench slab-debug {letters}: {error}");
                        std::process::exit(1)
                    }
                }
            }
        }
        Some("memory") => match (args.get(1), args.get(2)) {
            (Some(a), Some(what)) if ALLOCATORS.contains(&a.as_str()) => memory::main(a, what),
            _ => usage(),
        },
        Some(_) => {
            let opts = parse_run(&args);
            let r = run(&opts);
            println!(
                "RESULT workload={} allocator={} threads={} variant={} n={} ops_per_rep={} \
                 ns_per_op={:.3} mops={:.3}",
                opts.workload,
                opts.allocator,
                opts.threads,
                variant(),
                r.n,
                r.ops_per_rep,
                r.ns_per_op,
                r.mops
            );
        }
    }
}

fn parse_run(args: &[String]) -> RunOpts {
    let mut positional = Vec::new();
    let mut opts = RunOpts {
        workload: String::new(),
        allocator: String::new(),
        threads: 1,
        n: None,
        reps: 7,
        target: Duration::from_millis(100),
        warmup: false,
        big_window: false,
    };
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = || -> u64 {
            it.next()
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| usage())
        };
        match arg.as_str() {
            "--n" => opts.n = Some(value()),
            "--reps" => opts.reps = value().max(1) as usize,
            "--target-ms" => opts.target = Duration::from_millis(value()),
            "--warmup" => opts.warmup = true,
            "--slots" => match value() {
                256 => opts.big_window = false,
                1_048_576 => opts.big_window = true,
                _ => usage(),
            },
            _ => positional.push(arg.clone()),
        }
    }
    if positional.len() < 2 || positional.len() > 3 {
        usage();
    }
    opts.workload = positional[0].clone();
    opts.allocator = positional[1].clone();
    if let Some(t) = positional.get(2) {
        opts.threads = t.parse().unwrap_or_else(|_| usage());
    }
    if !workloads::names().contains(&opts.workload.as_str()) && opts.workload != "pair64-fault"
        || !ALLOCATORS.contains(&opts.allocator.as_str())
        || !(1..=host::NR_CPUS).contains(&opts.threads)
    {
        usage();
    }
    if opts.allocator.contains("prof") && !cfg!(feature = "alloc-profiling") {
        eprintln!(
            "{}: needs a build with feature alloc-profiling",
            opts.allocator
        );
        std::process::exit(2);
    }
    if matches!(opts.workload.as_str(), "cross-free" | "remote-free") && opts.threads > 2 {
        eprintln!("{} runs on 1 or 2 threads", opts.workload);
        std::process::exit(2);
    }
    opts
}

fn leak<T>(value: T) -> &'static T {
    Box::leak(Box::new(value))
}

fn run(opts: &RunOpts) -> RunResult {
    // Profiling on "from boot": the switch is set before the allocator's
    // init, as a kernel's `mem_profiling=1` is.
    let prof = |on: bool| host::prof_init(on);
    let r = match opts.allocator.as_str() {
        "magpie" => run_with(leak(allocs::Magpie::<BenchPlatform, false>::new()), opts),
        "magpie-cache" => run_with(leak(allocs::Magpie::<BenchPlatform, true>::new()), opts),
        "magpie-prof-off" | "magpie-prof-on" => {
            prof(opts.allocator.ends_with("on"));
            run_with(leak(allocs::Magpie::<ProfPlatform, false>::new()), opts)
        }
        "magpie-cache-prof-off" | "magpie-cache-prof-on" => {
            prof(opts.allocator.ends_with("on"));
            run_with(leak(allocs::Magpie::<ProfPlatform, true>::new()), opts)
        }
        "magpie-kmt-on" => {
            let a = leak(allocs::Magpie::<BenchPlatform, false>::new());
            allocs::kmemtrace_on();
            run_with(a, opts)
        }
        "magpie-cache-kmt-on" => {
            let a = leak(allocs::Magpie::<BenchPlatform, true>::new());
            allocs::kmemtrace_on();
            run_with(a, opts)
        }
        "system" => run_with(leak(allocs::system()), opts),
        "mimalloc" => run_with(leak(allocs::mimalloc()), opts),
        "linked_list_allocator" => run_with(leak(allocs::linked_list()), opts),
        "talc" => run_with(leak(allocs::talc()), opts),
        "buddy_system_allocator" => run_with(leak(allocs::buddy()), opts),
        "slabmalloc" => run_with(leak(allocs::SlabMallocBench::new()), opts),
        "null" => run_with(leak(allocs::Null), opts),
        _ => usage(),
    };
    if opts.allocator.contains("kmt") {
        let status = allocs::MAGPIE.kmemtrace().status();
        eprintln!(
            "KMT events={} overruns={}",
            status.nr_events, status.nr_overruns
        );
        println!(
            "KMT events={} overruns={}",
            status.nr_events, status.nr_overruns
        );
    }
    if opts.allocator.contains("prof") {
        // Everything freed: the tag's live bytes and calls are back to 0.
        let (bytes, calls) = host::prof_counts();
        eprintln!("PROF live_bytes={bytes} live_calls={calls}");
    }
    r
}

/// One repetition: `n` iterations per thread. Returns (ops, wall time).
fn once<A: BenchAlloc>(a: &'static A, opts: &RunOpts, n: u64) -> (u64, std::time::Duration) {
    let threads = opts.threads;
    let big = opts.big_window;
    let window = |sizes: Sizes| {
        workloads::run_threads(a, threads, move |a, cpu| {
            let seed = 0x5eed + cpu as u64;
            if big {
                let mut m = Mixed::<{ workloads::BIG_SLOTS }>::new(a, seed, sizes);
                let ops = workloads::mixed(a, &mut m, n);
                m.finish(a);
                return ops;
            }
            let mut m = Mixed::<{ workloads::MIXED_SLOTS }>::new(a, seed, sizes);
            let ops = workloads::mixed(a, &mut m, n);
            m.finish(a);
            ops
        })
    };
    match opts.workload.as_str() {
        "pair64" => workloads::run_threads(a, threads, |a, _| workloads::pair64(a, n)),
        "pair64-const" => workloads::run_threads(a, threads, |a, _| workloads::pair64_const(a, n)),
        "pair64-fault" => workloads::run_threads(a, threads, |a, _| workloads::pair64_fault(a, n)),
        "mixed" => window(Sizes::Small),
        "mixed-8k" => window(Sizes::Large),
        "align" => window(Sizes::Aligned),
        "align-4k" => window(Sizes::PageAligned),
        "realloc-same" => workloads::run_threads(a, threads, |a, _| workloads::realloc_same(a, n)),
        "realloc-grow" => workloads::run_threads(a, threads, |a, _| workloads::realloc_grow(a, n)),
        "realloc-1m" => workloads::run_threads(a, threads, |a, _| workloads::realloc_chain(a, n)),
        "batch" => workloads::run_threads(a, threads, |a, _| {
            let mut objs = vec![std::ptr::null_mut(); workloads::BATCH_OBJS];
            workloads::batch(a, &mut objs, n)
        }),
        "remote-free" if threads == 2 => workloads::remote_free(a, n),
        "remote-free" => workloads::run_threads(a, 1, |a, _| {
            let mut objs = vec![std::ptr::null_mut(); workloads::REMOTE_BATCH];
            workloads::batch(a, &mut objs, n / workloads::REMOTE_BATCH as u64) / 2
        }),
        "cross-free" if threads == 1 => {
            workloads::run_threads(a, 1, |a, _| workloads::cross_free_local(a, n))
        }
        "cross-free" => workloads::cross_free_pair(a, n),
        _ => usage(),
    }
}

fn run_with<A: BenchAlloc>(a: &'static A, opts: &RunOpts) -> RunResult {
    if let Some(n) = opts.n
        && !opts.warmup
    {
        // Exact count (callgrind): one run, no warm-up.
        let (ops, time) = once(a, opts, n);
        return RunResult {
            n,
            ops_per_rep: ops,
            ns_per_op: time.as_nanos() as f64 / ops.max(1) as f64,
            mops: ops as f64 / time.as_secs_f64().max(1e-12) / 1e6,
        };
    }
    // Calibrate n so one repetition takes about the target time.
    let start = match opts.workload.as_str() {
        "batch" => 1,
        "remote-free" => 4 * workloads::REMOTE_BATCH as u64,
        _ => 4096,
    };
    let mut n: u64 = opts.n.unwrap_or(start);
    while opts.n.is_none() {
        let (_, time) = once(a, opts, n);
        if time >= opts.target / 8 || n >= 1 << 34 {
            let scale = opts.target.as_secs_f64() / time.as_secs_f64().max(1e-9);
            n = ((n as f64 * scale) as u64).max(start);
            break;
        }
        n *= 4;
    }
    let _ = once(a, opts, n); // warm-up
    let mut samples: Vec<(u64, Duration)> = (0..opts.reps).map(|_| once(a, opts, n)).collect();
    samples.sort_by(|x, y| {
        let rx = x.1.as_secs_f64() / x.0.max(1) as f64;
        let ry = y.1.as_secs_f64() / y.0.max(1) as f64;
        rx.total_cmp(&ry)
    });
    let (ops, time) = samples[samples.len() / 2];
    RunResult {
        n,
        ops_per_rep: ops,
        ns_per_op: time.as_nanos() as f64 / ops.max(1) as f64,
        mops: ops as f64 / time.as_secs_f64().max(1e-12) / 1e6,
    }
}
