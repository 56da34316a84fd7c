//! `magpie-bench suite`: every measurement in one run, as one markdown
//! report. Each measurement is a fresh process of this binary (so
//! allocators never share a process), under callgrind for instruction
//! counts.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::process::Command;

use crate::allocs::ALLOCATORS;

struct SuiteOpts {
    out: Option<String>,
    reps: u64,
    target_ms: u64,
    callgrind: bool,
}

fn parse(args: &[String]) -> SuiteOpts {
    let mut opts = SuiteOpts {
        out: None,
        reps: 7,
        target_ms: 100,
        callgrind: true,
    };
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--out" => opts.out = it.next().cloned(),
            "--reps" => opts.reps = it.next().and_then(|v| v.parse().ok()).unwrap_or(7),
            "--target-ms" => opts.target_ms = it.next().and_then(|v| v.parse().ok()).unwrap_or(100),
            "--no-callgrind" => opts.callgrind = false,
            other => {
                eprintln!("suite: unknown option {other}");
                std::process::exit(2);
            }
        }
    }
    opts
}

/// Allocators measured on a workload.
fn allocators_for(workload: &str, with_null: bool) -> Vec<&'static str> {
    ALLOCATORS
        .iter()
        .copied()
        .filter(|a| match *a {
            "null" => with_null,
            // Measured by `bench/profiling.sh` (profiling variants).
            "magpie-prof-off" | "magpie-prof-on" => false,
            // Identical to `magpie` (which uses kmalloc there).
            "magpie-kmalloc" => workload != "kmalloc-mixed",
            _ => true,
        })
        .collect()
}

/// Parsed `RESULT` line.
#[derive(Clone, Copy)]
pub(crate) struct Res {
    pub(crate) n: u64,
    pub(crate) ops_per_rep: u64,
    pub(crate) ns_per_op: f64,
    pub(crate) mops: f64,
}

pub(crate) fn parse_result(stdout: &str) -> Option<Res> {
    let line = stdout.lines().find(|l| l.starts_with("RESULT "))?;
    let field = |name: &str| -> Option<&str> {
        line.split_whitespace()
            .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
    };
    Some(Res {
        n: field("n")?.parse().ok()?,
        ops_per_rep: field("ops_per_rep")?.parse().ok()?,
        ns_per_op: field("ns_per_op")?.parse().ok()?,
        mops: field("mops")?.parse().ok()?,
    })
}

pub(crate) fn exe() -> String {
    std::env::current_exe()
        .expect("current exe")
        .to_string_lossy()
        .into_owned()
}

fn tail(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(3)..].join(" / ")
}

/// Run one configuration in a child process, optionally under callgrind;
/// returns the result and, under callgrind, the instructions collected.
fn child(args: &[String], callgrind: bool) -> Result<(Res, Option<u64>), String> {
    child_of(&exe(), args, callgrind)
}

/// [`child`] of another build of this binary (`bin`).
pub(crate) fn child_of(
    bin: &str,
    args: &[String],
    callgrind: bool,
) -> Result<(Res, Option<u64>), String> {
    let mut cmd = if callgrind {
        let mut c = Command::new("valgrind");
        c.args([
            "--tool=callgrind",
            "--callgrind-out-file=/dev/null",
            "--dump-instr=no",
            "--compress-pos=no",
        ]);
        c.arg(bin);
        c
    } else {
        Command::new(bin)
    };
    cmd.args(args);
    let out = cmd.output().map_err(|e| format!("spawn: {e}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        return Err(format!("{}: {}", out.status, tail(&stderr)));
    }
    let res = parse_result(&stdout).ok_or_else(|| format!("no RESULT line: {}", tail(&stdout)))?;
    let collected = if callgrind {
        let n = stderr
            .lines()
            .find_map(|l| l.split("Collected :").nth(1))
            .and_then(|v| v.trim().parse().ok())
            .ok_or_else(|| format!("no callgrind total: {}", tail(&stderr)))?;
        Some(n)
    } else {
        None
    };
    Ok((res, collected))
}

pub(crate) fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

/// Instructions per operation from two exact-count runs (the difference
/// cancels process start-up, allocator init and warm-up).
fn instructions(workload: &str, allocator: &str) -> Result<f64, String> {
    instructions_of(&exe(), workload, allocator)
}

/// [`instructions`] of another build of this binary (`bin`).
pub(crate) fn instructions_of(bin: &str, workload: &str, allocator: &str) -> Result<f64, String> {
    let (n1, n2) = match workload {
        "cache-pair" | "cache-pair-fault" => (20_000, 220_000),
        "kmalloc-mixed" => (20_000, 120_000),
        _ => (25_600, 153_600), // cross-free: multiples of the batch
    };
    let run = |n: u64| {
        child_of(
            bin,
            &args(&[workload, allocator, "1", "--n", &n.to_string()]),
            true,
        )
    };
    let (r1, i1) = run(n1)?;
    let (r2, i2) = run(n2)?;
    let (i1, i2) = (i1.unwrap(), i2.unwrap());
    Ok((i2 as f64 - i1 as f64) / (r2.ops_per_rep - r1.ops_per_rep) as f64)
}

pub(crate) fn sh(cmd: &str, args: &[&str]) -> String {
    Command::new(cmd)
        .args(args)
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

pub(crate) fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    format!("{cores} cores, {cpu}")
}

pub(crate) fn fmt_f(value: Option<f64>, digits: usize) -> String {
    match value {
        Some(v) => format!("{v:.digits$}"),
        None => "fail".into(),
    }
}

/// Entry point of `magpie-bench suite`.
pub fn main(argv: &[String]) {
    let opts = parse(argv);
    let mut report = String::new();
    let mut failures = Vec::new();
    let date = sh("date", &["-u", "+%Y-%m-%d %H:%M UTC"]);
    let rustc = sh("rustc", &["-V"]);
    writeln!(report, "# magpie-bench results\n").unwrap();
    writeln!(
        report,
        "{date}; {}; {rustc}; magpie-slab variant: `{}`; wall clock: median of {} \
         interleaved rounds, each run ~{} ms after a warm-up.\n",
        machine(),
        crate::variant(),
        opts.reps,
        opts.target_ms
    )
    .unwrap();

    // ------------------------------------------------------------ callgrind
    if opts.callgrind {
        let mut ins: BTreeMap<(&str, &str), Option<f64>> = BTreeMap::new();
        for workload in crate::workloads::WORKLOADS {
            for allocator in allocators_for(workload, true) {
                eprintln!("callgrind {workload} {allocator}");
                let v = match instructions(workload, allocator) {
                    Ok(v) => Some(v),
                    Err(e) => {
                        failures.push(format!("callgrind {workload} {allocator}: {e}"));
                        None
                    }
                };
                ins.insert((workload, allocator), v);
            }
        }
        let null = |w: &str| ins.get(&(w, "null")).copied().flatten();
        let net = |w: &str, a: &str| -> String {
            match (ins.get(&(w, a)).copied().flatten(), null(w)) {
                (Some(v), Some(h)) if a != "null" => format!("{:.1}", v - h),
                (None, _) => "—".into(),
                _ => "".into(),
            }
        };
        let cell = |w: &str, a: &str| match ins.get(&(w, a)) {
            Some(v) => fmt_f(*v, 1),
            None => "—".into(),
        };
        writeln!(report, "## Instructions per operation (callgrind)\n").unwrap();
        writeln!(
            report,
            "Instructions retired per operation in steady state: (Ir(N2) − Ir(N1)) / \
             (ops(N2) − ops(N1)), single thread. `net` subtracts the `null` row (the \
             harness alone: loop, random stream, byte writes). cache-pair: per alloc+free \
             pair of a 64-byte object (magpie: `kmem_cache` \"bench-64\"; `magpie-kmalloc`: \
             `kmalloc(64)`/`kfree`; peers: `Layout(64, 8)`). kmalloc-mixed: per operation \
             (one alloc or one free). cross-free (1 thread): per object (alloc+free, \
             batches of 256).\n"
        )
        .unwrap();
        writeln!(
            report,
            "| allocator | cache-pair | net | kmalloc-mixed | net | cross-free (1T) |\n\
             |---|---:|---:|---:|---:|---:|"
        )
        .unwrap();
        for allocator in allocators_for("cache-pair", true) {
            writeln!(
                report,
                "| {allocator} | {} | {} | {} | {} | {} |",
                cell("cache-pair", allocator),
                net("cache-pair", allocator),
                cell("kmalloc-mixed", allocator),
                net("kmalloc-mixed", allocator),
                cell("cross-free", allocator),
            )
            .unwrap();
        }
        let magpie = |w: &str, a: &str| ins.get(&(w, a)).copied().flatten();
        writeln!(report).unwrap();
        if let Some(v) = magpie("cache-pair", "magpie") {
            writeln!(
                report,
                "- Target magazine hit (alloc+free) ≤ 30 instructions: magpie {v:.1} \
                 (net {}) → **{}**",
                net("cache-pair", "magpie"),
                if v <= 30.0 { "met" } else { "not met" }
            )
            .unwrap();
        }
        if let Some(v) = magpie("kmalloc-mixed", "magpie") {
            writeln!(
                report,
                "- Target mixed 8–512 B ≤ 60 instructions per operation: magpie {v:.1} \
                 (net {}) → **{}**",
                net("kmalloc-mixed", "magpie"),
                if v <= 60.0 { "met" } else { "not met" }
            )
            .unwrap();
        }
        writeln!(report).unwrap();
    }

    // ------------------------------------------------------------ wall clock
    // Calibrate each configuration once (n for ~target ms), then run
    // `reps` rounds; every round visits every configuration once (1T and
    // 2T back to back), so a noisy neighbour on the VM hits all rows
    // alike. Medians over rounds; scaling is the median of the per-round
    // 2T/1T ratios.
    let mut configs: Vec<(&str, &str, usize)> = Vec::new();
    for workload in crate::workloads::WORKLOADS {
        for allocator in allocators_for(workload, true) {
            for threads in [1usize, 2] {
                configs.push((workload, allocator, threads));
            }
        }
    }
    let mut sizes: BTreeMap<(&str, &str, usize), u64> = BTreeMap::new();
    for &(workload, allocator, threads) in &configs {
        eprintln!("calibrate {workload} {allocator} {threads}T");
        let a = args(&[
            workload,
            allocator,
            &threads.to_string(),
            "--reps",
            "1",
            "--target-ms",
            &opts.target_ms.to_string(),
        ]);
        match child(&a, false) {
            Ok((r, _)) => {
                sizes.insert((workload, allocator, threads), r.n);
            }
            Err(e) => failures.push(format!("wall {workload} {allocator} {threads}T: {e}")),
        }
    }
    let mut samples: BTreeMap<(&str, &str, usize), Vec<Res>> = BTreeMap::new();
    for round in 0..opts.reps {
        eprintln!("wall-clock round {}/{}", round + 1, opts.reps);
        for &config in &configs {
            let Some(&n) = sizes.get(&config) else {
                continue;
            };
            let (workload, allocator, threads) = config;
            let a = args(&[
                workload,
                allocator,
                &threads.to_string(),
                "--n",
                &n.to_string(),
                "--warmup",
                "--reps",
                "1",
            ]);
            match child(&a, false) {
                Ok((r, _)) => samples.entry(config).or_default().push(r),
                Err(e) => failures.push(format!("wall {workload} {allocator} {threads}T: {e}")),
            }
        }
    }
    let median = |mut v: Vec<f64>| -> Option<f64> {
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        Some(v[v.len() / 2])
    };
    let wall: BTreeMap<(&str, &str, usize), Option<Res>> = configs
        .iter()
        .map(|&c| {
            let v = samples.get(&c).cloned().unwrap_or_default();
            let ns = median(v.iter().map(|r| r.ns_per_op).collect());
            let mops = median(v.iter().map(|r| r.mops).collect());
            let res = ns.zip(mops).map(|(ns_per_op, mops)| Res {
                n: 0,
                ops_per_rep: 0,
                ns_per_op,
                mops,
            });
            (c, res)
        })
        .collect();
    let paired_scaling = |w: &str, a: &str| -> Option<f64> {
        let one = samples.get(&(w, a, 1))?;
        let two = samples.get(&(w, a, 2))?;
        median(one.iter().zip(two).map(|(o, t)| t.mops / o.mops).collect())
    };
    let get = |w: &str, a: &str, t: usize| wall.get(&(w, a, t)).copied().flatten();
    let dash = |w: &str, a: &str| !allocators_for(w, true).contains(&a);

    writeln!(report, "## Wall clock, single thread\n").unwrap();
    writeln!(
        report,
        "ns per operation (same operations as above) and the time relative to magpie \
         (`× magpie` = allocator's time / magpie's time; above 1 is slower than magpie).\n"
    )
    .unwrap();
    writeln!(
        report,
        "| allocator | cache-pair ns | × magpie | kmalloc-mixed ns | × magpie | cross-free ns | × magpie |\n\
         |---|---:|---:|---:|---:|---:|---:|"
    )
    .unwrap();
    for allocator in allocators_for("cache-pair", true) {
        let mut row = format!("| {allocator} |");
        for w in crate::workloads::WORKLOADS {
            if dash(w, allocator) {
                row.push_str(" — | — |");
                continue;
            }
            let r = get(w, allocator, 1).map(|r| r.ns_per_op);
            let base = get(w, "magpie", 1).map(|r| r.ns_per_op);
            let ratio = r.zip(base).map(|(r, b)| r / b);
            write!(row, " {} | {} |", fmt_f(r, 2), fmt_f(ratio, 2)).unwrap();
        }
        writeln!(report, "{row}").unwrap();
    }
    writeln!(report).unwrap();

    writeln!(report, "## Throughput, 1 vs 2 threads\n").unwrap();
    writeln!(
        report,
        "Million operations per second over all threads; each thread acts as one CPU \
         (magpie: CPU id 0 and 1). cache-pair and kmalloc-mixed: every thread runs the \
         workload on its own objects. cross-free: 1T allocates a batch of 256 and frees it \
         on the same thread; 2T allocates on thread A and frees on thread B (batches of 256 handed \
         over through a ring of 8 slots). Scaling = median over rounds of 2T / 1T; target for magpie ≥ 1.8×. \
         `null` (no allocator) is the machine's and the harness's ceiling.\n"
    )
    .unwrap();
    writeln!(
        report,
        "| allocator | cache-pair 1T | 2T | scaling | kmalloc-mixed 1T | 2T | scaling | cross-free 1T | 2T | scaling |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    )
    .unwrap();
    for allocator in allocators_for("cache-pair", true) {
        let mut row = format!("| {allocator} |");
        for w in crate::workloads::WORKLOADS {
            if dash(w, allocator) {
                row.push_str(" — | — | — |");
                continue;
            }
            let one = get(w, allocator, 1).map(|r| r.mops);
            let two = get(w, allocator, 2).map(|r| r.mops);
            let scaling = paired_scaling(w, allocator);
            let mut s = fmt_f(scaling, 2);
            if allocator == "magpie" && scaling.is_some() {
                s = format!("**{s}**");
            }
            write!(row, " {} | {} | {} |", fmt_f(one, 1), fmt_f(two, 1), s).unwrap();
        }
        writeln!(report, "{row}").unwrap();
    }
    writeln!(report).unwrap();

    if !failures.is_empty() {
        writeln!(report, "## Failures\n").unwrap();
        for f in &failures {
            writeln!(report, "- {f}").unwrap();
        }
        writeln!(report).unwrap();
    }

    print!("{report}");
    if let Some(path) = opts.out {
        if let Some(dir) = std::path::Path::new(&path).parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        std::fs::write(&path, &report).expect("write report");
        eprintln!("report written to {path}");
    }
}
