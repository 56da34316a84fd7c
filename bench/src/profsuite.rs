//! `magpie-bench profiling --plain BIN`: the cost of allocation profiling
//! (issue 3), in one run: magpie with `alloc-profiling` compiled out (the
//! plain build `BIN`), compiled in but switched off, and on from boot
//! (this build, which must have the feature), on the `kmem_cache` alloc+free
//! pair and on mixed 8–512 B kmalloc: callgrind instructions, wall-clock
//! ratios, and memory overhead. `bench/profiling.sh` builds both binaries
//! and runs this. See docs/BENCHMARKS.md.
//!
//! `magpie-bench memory`: this build's slab geometry (objects per slab of
//! every kmalloc class) and the slab memory of 100 000 live mixed-size
//! kmallocs, as `MEM` lines.

use std::fmt::Write as _;

use magpie_slab::{KMALLOC_SIZES, Platform};

use crate::allocs::{BenchAlloc, MAGPIE, Magpie};
use crate::host::BenchPlatform;
use crate::suite::{args, child_of, exe, fmt_f, instructions_of, machine, sh};
use crate::workloads::{XorShift, mixed_layout, mixed_size};

const WORKLOADS: [&str; 2] = ["cache-pair", "kmalloc-mixed"];
const NR_MIXED_OBJS: usize = 100_000;

/// Entry point of `magpie-bench memory`.
pub fn memory() {
    let magpie = Magpie::<BenchPlatform, true>::new();
    for size in KMALLOC_SIZES {
        let stats = MAGPIE.kmalloc_cache_for(size, 8).expect("class").stats();
        println!(
            "MEM size={size} kind={:?} objs_per_slab={} pages_per_slab={}",
            stats.kind, stats.objs_per_slab, stats.nr_pages_per_slab
        );
    }
    // Bytes of slab pages held by all kmalloc caches.
    let kmalloc_slab_bytes = || -> usize {
        KMALLOC_SIZES
            .iter()
            .map(|&size| {
                MAGPIE
                    .kmalloc_cache_for(size, 8)
                    .unwrap()
                    .stats()
                    .total_bytes
            })
            .sum()
    };
    let before = kmalloc_slab_bytes();
    let mut rng = XorShift::new(0x5eed);
    let mut requested = 0usize;
    let objs: Vec<(*mut u8, usize)> = (0..NR_MIXED_OBJS)
        .map(|_| {
            let size = mixed_size(rng.next());
            requested += size;
            // SAFETY: non-zero size.
            (unsafe { magpie.alloc(mixed_layout(size)) }, size)
        })
        .collect();
    let after = kmalloc_slab_bytes();
    println!(
        "MEM mixed objects={NR_MIXED_OBJS} requested={requested} slab_bytes={}",
        after - before
    );
    for (ptr, size) in objs {
        // SAFETY: allocated above with this layout.
        unsafe { magpie.free(ptr, mixed_layout(size)) };
    }
    let _ = BenchPlatform::max_cpus();
}

/// `MEM` lines of a build's `memory` run.
/// `MEM` lines: the first word and the `key=value` pairs.
type MemLines = Vec<(String, Vec<(String, String)>)>;

fn memory_of(bin: &str) -> Result<MemLines, String> {
    let out = std::process::Command::new(bin)
        .arg("memory")
        .output()
        .map_err(|e| format!("spawn {bin}: {e}"))?;
    if !out.status.success() {
        return Err(format!("{bin} memory: {}", out.status));
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.strip_prefix("MEM "))
        .map(|l| {
            let mut words = l.split_whitespace();
            let first = words.next().unwrap_or("").to_string();
            let kv = words
                .filter_map(|w| w.split_once('='))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            (first, kv)
        })
        .collect())
}

fn field<'a>(
    lines: &'a [(String, Vec<(String, String)>)],
    first: &str,
    key: &str,
) -> Option<&'a str> {
    lines
        .iter()
        .find(|(f, _)| f == first)
        .and_then(|(_, kv)| kv.iter().find(|(k, _)| k == key))
        .map(|(_, v)| v.as_str())
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    Some(v[v.len() / 2])
}

/// Entry point of `magpie-bench profiling`.
pub fn main(argv: &[String]) {
    let mut plain = None;
    let mut reps = 9u64;
    let mut target_ms = 100u64;
    let mut out = None;
    let mut it = argv.iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--plain" => plain = it.next().cloned(),
            "--reps" => reps = it.next().and_then(|v| v.parse().ok()).unwrap_or(9),
            "--target-ms" => target_ms = it.next().and_then(|v| v.parse().ok()).unwrap_or(100),
            "--out" => out = it.next().cloned(),
            other => {
                eprintln!("profiling: unknown option {other}");
                std::process::exit(2);
            }
        }
    }
    let Some(plain) = plain else {
        eprintln!(
            "usage: magpie-bench profiling --plain BIN [--reps R] [--target-ms MS] [--out FILE]"
        );
        std::process::exit(2);
    };
    if !cfg!(feature = "alloc-profiling") {
        eprintln!("profiling: this build must have feature alloc-profiling");
        std::process::exit(2);
    }
    let prof = exe();
    let variants: [(&str, &str, &str); 3] = [
        ("compiled out", plain.as_str(), "magpie"),
        ("compiled in, off", prof.as_str(), "magpie-prof-off"),
        ("on (from boot)", prof.as_str(), "magpie-prof-on"),
    ];
    let mut failures = Vec::new();
    let mut report = String::new();
    writeln!(
        report,
        "{}; {}; {}; wall clock: median of {reps} interleaved rounds, each run ~{target_ms} ms \
         after a warm-up.\n",
        sh("date", &["-u", "+%Y-%m-%d %H:%M UTC"]),
        machine(),
        sh("rustc", &["-V"]),
    )
    .unwrap();

    // Instructions.
    let mut ins = vec![[None; 2]; variants.len()];
    for (v, &(_, bin, allocator)) in variants.iter().enumerate() {
        for (w, workload) in WORKLOADS.iter().enumerate() {
            eprintln!("callgrind {workload} {allocator}");
            match instructions_of(bin, workload, allocator) {
                Ok(x) => ins[v][w] = Some(x),
                Err(e) => failures.push(format!("callgrind {workload} {allocator}: {e}")),
            }
        }
    }

    // Wall clock: calibrate on the compiled-out build, then interleave.
    let mut ratios = vec![[Vec::new(), Vec::new()]; variants.len()];
    let mut ns = vec![[Vec::new(), Vec::new()]; variants.len()];
    for (w, workload) in WORKLOADS.iter().enumerate() {
        let a = args(&[
            workload,
            "magpie",
            "1",
            "--reps",
            "1",
            "--target-ms",
            &target_ms.to_string(),
        ]);
        let n = match child_of(&plain, &a, false) {
            Ok((r, _)) => r.n,
            Err(e) => {
                failures.push(format!("calibrate {workload}: {e}"));
                continue;
            }
        };
        for round in 0..reps {
            eprintln!("wall clock {workload} round {}/{reps}", round + 1);
            let mut base = None;
            for (v, &(_, bin, allocator)) in variants.iter().enumerate() {
                let a = args(&[
                    workload,
                    allocator,
                    "1",
                    "--n",
                    &n.to_string(),
                    "--warmup",
                    "--reps",
                    "1",
                ]);
                match child_of(bin, &a, false) {
                    Ok((r, _)) => {
                        if v == 0 {
                            base = Some(r.ns_per_op);
                        }
                        ns[v][w].push(r.ns_per_op);
                        if let Some(b) = base {
                            ratios[v][w].push(r.ns_per_op / b);
                        }
                    }
                    Err(e) => failures.push(format!("wall {workload} {allocator}: {e}")),
                }
            }
        }
    }

    writeln!(
        report,
        "| profiling | cache-pair instr/pair | Δ | kmalloc-mixed instr/op | Δ | cache-pair ns | × | kmalloc-mixed ns | × |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|"
    )
    .unwrap();
    for (v, &(name, _, _)) in variants.iter().enumerate() {
        let mut row = format!("| {name} |");
        for (w, &x) in ins[v].iter().enumerate() {
            let delta = match (x, ins[0][w]) {
                (Some(x), Some(b)) if v > 0 => {
                    format!("{:+.1} ({:+.1} %)", x - b, (x - b) / b * 100.0)
                }
                _ => String::new(),
            };
            write!(row, " {} | {delta} |", fmt_f(x, 1)).unwrap();
        }
        for w in 0..2 {
            let t = median(ns[v][w].clone());
            let r = median(ratios[v][w].clone());
            write!(row, " {} | {} |", fmt_f(t, 2), fmt_f(r, 3)).unwrap();
        }
        writeln!(report, "{row}").unwrap();
    }
    writeln!(report).unwrap();

    // Memory.
    match (memory_of(&plain), memory_of(&prof)) {
        (Ok(p), Ok(q)) => {
            writeln!(
                report,
                "| kmalloc class | slab | objects per slab, compiled out | compiled in | extra bytes per object |\n\
                 |---:|---|---:|---:|---:|"
            )
            .unwrap();
            for size in KMALLOC_SIZES {
                let key = format!("size={size}");
                let lookup = |lines: &[(String, Vec<(String, String)>)], k: &str| {
                    field(lines, &key, k).unwrap_or("?").to_string()
                };
                let kind = lookup(&p, "kind");
                let extra = if kind == "Small" { "4" } else { "0" };
                writeln!(
                    report,
                    "| {size} | {kind} | {} | {} | {extra} |",
                    lookup(&p, "objs_per_slab"),
                    lookup(&q, "objs_per_slab")
                )
                .unwrap();
            }
            let bytes = |lines: &[(String, Vec<(String, String)>)], k: &str| -> Option<f64> {
                field(lines, "mixed", k)?.parse().ok()
            };
            if let (Some(a), Some(b), Some(req)) = (
                bytes(&p, "slab_bytes"),
                bytes(&q, "slab_bytes"),
                bytes(&p, "requested"),
            ) {
                writeln!(
                    report,
                    "\n{NR_MIXED_OBJS} live kmallocs of 8–512 B ({:.1} MiB requested): slab pages \
                     {:.2} MiB compiled out, {:.2} MiB compiled in ({:+.2} %, {:+.1} bytes per object).\n",
                    req / 1048576.0,
                    a / 1048576.0,
                    b / 1048576.0,
                    (b - a) / a * 100.0,
                    (b - a) / NR_MIXED_OBJS as f64
                )
                .unwrap();
            }
        }
        (Err(e), _) | (_, Err(e)) => failures.push(format!("memory: {e}")),
    }

    if !failures.is_empty() {
        writeln!(report, "Failures:\n").unwrap();
        for f in &failures {
            writeln!(report, "- {f}").unwrap();
        }
    }
    print!("{report}");
    if let Some(path) = out {
        if let Some(dir) = std::path::Path::new(&path).parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        std::fs::write(&path, &report).expect("write report");
        eprintln!("report written to {path}");
    }
}
