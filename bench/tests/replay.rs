//! `magpie-bench replay`: a synthetic two-CPU dump (every event type, a
//! cross-CPU free, an unpaired free, a failed allocation, a churn of 600
//! blocks) and a recorded one (`record heap-tests`) through every
//! allocator, checked; the checker's own failure; bad input.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use magpie_kmemtrace_format::{
    CacheRecord, DumpWriter, EventKind, EventType, KmemtraceEvent, KmemtraceHeader,
};

const ALLOCATORS: [&str; 8] = [
    "magpie",
    "talc",
    "rlsf",
    "mimalloc",
    "buddy_system_allocator",
    "linked_list_allocator",
    "fixed_size_block",
    "null",
];

fn scratch(name: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("magpie-bench-replay-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn bench(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_magpie-bench"))
        .args(args)
        .output()
        .unwrap()
}

/// Events of one CPU, numbered in order.
struct Cpu {
    cpu: u16,
    events: Vec<KmemtraceEvent>,
}

impl Cpu {
    fn push(&mut self, kind: EventKind, ty: EventType, ts: u64, ptr: u64, req: u64, cache: u32) {
        let seq = self.events.len() as u64;
        self.events.push(KmemtraceEvent {
            event: kind as u8,
            type_id: ty as u8,
            cpu: self.cpu,
            cache_id: cache,
            timestamp_ns: ts,
            seq,
            call_site: 0xffff_ffff_8000_1000,
            ptr,
            bytes_req: req,
            bytes_alloc: req.next_power_of_two(),
            flags: 0,
            stack_id: 0,
        });
    }
}

/// What the synthetic dump should replay as.
struct Expected {
    nr_ops: u64,
    nr_not_replayed: u64,
    peak_live: u64,
}

fn write_dump(path: &Path, cpus: &mut [Cpu]) {
    let header = KmemtraceHeader {
        nr_cpus: cpus.len() as u32,
        ..Default::default()
    };
    let mut bytes = Vec::new();
    let mut sink = |chunk: &[u8]| bytes.extend_from_slice(chunk);
    let mut writer = DumpWriter::new(&header, &mut sink);
    writer.cache(&CacheRecord {
        id: 1,
        obj_size: 192,
        align: 64,
        flags: 0,
        name: "dentry",
    });
    for cpu in cpus.iter() {
        writer.cpu(u32::from(cpu.cpu), 0, cpu.events.iter().copied());
    }
    writer.finish();
    std::fs::write(path, bytes).unwrap();
}

/// Two CPUs: a kmalloc, a cache object and a page-granular block on CPU 0,
/// the cache object and the pages freed on CPU 1; a free of a block from
/// before the record and a failed allocation (not replayed); then 600
/// blocks of 8 B to 3 KiB allocated on CPU 0 and freed on CPU 1 six
/// allocations later.
fn synthetic(path: &Path) -> Expected {
    use EventKind::{Alloc, FailedAlloc, Free};
    use EventType::{Cache, Kmalloc, Pages};
    let mut c0 = Cpu {
        cpu: 0,
        events: Vec::new(),
    };
    let mut c1 = Cpu {
        cpu: 1,
        events: Vec::new(),
    };
    let (a, b, c, d) = (0x1000_0040, 0x1000_0100, 0x1001_0000, 0x1000_0200);
    c0.push(Alloc, Kmalloc, 10, a, 40, 0);
    c0.push(Alloc, Cache, 20, b, 192, 1);
    c0.push(Alloc, Pages, 30, c, 20_000, 0);
    c1.push(Free, Cache, 40, b, 0, 1);
    c1.push(Alloc, Kmalloc, 50, d, 8, 0);
    c0.push(Free, Kmalloc, 60, a, 0, 0);
    c0.push(Free, Kmalloc, 70, 0x2000_0000, 0, 0); // allocated before the record
    c0.push(FailedAlloc, Kmalloc, 80, 0, 100_000, 0);
    c1.push(Free, Pages, 90, c, 0, 0);
    let mut live = 8u64; // d
    let mut peak = 40 + 192 + 20_000;
    let mut sizes = Vec::new();
    for i in 0..600u64 {
        let size = 8 + (i * 37) % 3000;
        let ptr = 0x4000_0000 + i * 0x1000;
        c0.push(Alloc, Kmalloc, 1000 + 10 * i, ptr, size, 0);
        live += size;
        peak = peak.max(live);
        sizes.push(size);
        if i >= 6 {
            let j = i - 6;
            c1.push(
                Free,
                Kmalloc,
                1000 + 10 * i + 5,
                0x4000_0000 + j * 0x1000,
                0,
                0,
            );
            live -= sizes[j as usize];
        }
    }
    write_dump(path, &mut [c0, c1]);
    Expected {
        nr_ops: 4 + 3 + 600 + 594,
        nr_not_replayed: 2,
        peak_live: peak,
    }
}

fn json(out: &Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "status {:?}\nstdout {}\nstderr {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn every_allocator_replays_the_synthetic_dump_checked_without_failures() {
    let dir = scratch("synthetic");
    let path = dir.join("s.kmt");
    let expected = synthetic(&path);
    let report = json(&bench(&[
        "replay",
        path.to_str().unwrap(),
        "--no-callgrind",
        "--json",
    ]));
    assert_eq!(report["operations"], expected.nr_ops);
    assert_eq!(report["threads"], 2);
    assert_eq!(report["peak_live_bytes"], expected.peak_live);
    assert_eq!(report["events_not_replayed"], expected.nr_not_replayed);
    let rows = report["allocators"].as_array().unwrap();
    let names: Vec<&str> = rows
        .iter()
        .map(|r| r["allocator"].as_str().unwrap())
        .collect();
    assert_eq!(names, ALLOCATORS);
    for row in rows {
        let name = row["allocator"].as_str().unwrap();
        assert_eq!(row["failures"], 0, "{name}");
        if name == "null" {
            assert_eq!(row["check"], "off");
            continue;
        }
        assert_eq!(row["check"], "ok", "{name}");
        // Every allocator held at least the peak's bytes in pages.
        let peak = row["peak_bytes"].as_u64().unwrap();
        assert!(
            peak >= expected.peak_live,
            "{name}: {peak} bytes at the peak"
        );
        assert!(row["peak_over_live"].as_f64().unwrap() >= 1.0, "{name}");
    }
}

#[test]
fn the_checker_reports_overlapping_blocks() {
    // `null` hands every allocation the same buffer: checked, it must fail.
    let dir = scratch("overlap");
    let path = dir.join("s.kmt");
    synthetic(&path);
    let out = bench(&["replay-one", path.to_str().unwrap(), "null", "--check"]);
    assert!(out.status.success(), "{out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("check=failed"), "{stdout}");
    assert!(!stdout.contains("overlaps=0 "), "{stdout}");
    assert!(
        stdout.contains("REPLAY_PROBLEM operation 1: block"),
        "{stdout}"
    );
}

#[test]
fn callgrind_counts_each_allocator_net_of_the_harness() {
    if Command::new("valgrind").arg("--version").output().is_err() {
        eprintln!("valgrind not installed: instruction counts not tested");
        return;
    }
    let dir = scratch("callgrind");
    let path = dir.join("s.kmt");
    synthetic(&path);
    let report = json(&bench(&[
        "replay",
        path.to_str().unwrap(),
        "--allocators",
        "magpie,linked_list_allocator",
        "--json",
    ]));
    let rows = report["allocators"].as_array().unwrap();
    // `null` is added: every net figure subtracts it.
    assert_eq!(rows.len(), 3);
    let null = rows[2]["ir_per_op_raw"].as_f64().unwrap();
    assert!(null > 0.0);
    for row in &rows[..2] {
        let net = row["ir_per_op_net"].as_f64().unwrap();
        let raw = row["ir_per_op_raw"].as_f64().unwrap();
        assert!(net > 0.0, "{row}");
        assert!((raw - null - net).abs() < 1e-9, "{row}");
    }
}

#[test]
fn a_recorded_heap_workload_replays_through_every_allocator() {
    let dir = scratch("recorded");
    let path = dir.join("heap-tests.kmt");
    let out = bench(&["record", "heap-tests", path.to_str().unwrap()]);
    assert!(out.status.success(), "{out:?}");
    let report = json(&bench(&[
        "replay",
        path.to_str().unwrap(),
        "--no-callgrind",
        "--json",
    ]));
    // 20,000 boxes allocated and freed, at least.
    assert!(report["operations"].as_u64().unwrap() >= 40_000, "{report}");
    assert_eq!(report["threads"], 1);
    for row in report["allocators"].as_array().unwrap() {
        assert_eq!(row["failures"], 0, "{row}");
        assert!(row["check"] == "ok" || row["allocator"] == "null", "{row}");
    }
}

#[test]
fn bad_input_is_refused_with_a_clear_message() {
    let dir = scratch("bad");
    let path = dir.join("s.kmt");
    synthetic(&path);
    let bytes = std::fs::read(&path).unwrap();
    let cut = dir.join("cut.kmt");
    std::fs::write(&cut, &bytes[..bytes.len() - 20]).unwrap();
    let out = bench(&["replay", cut.to_str().unwrap(), "--no-callgrind"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("truncated dump"),
        "{out:?}"
    );

    let out = bench(&[
        "replay",
        path.to_str().unwrap(),
        "--allocators",
        "magpie,jemalloc",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("unknown allocator jemalloc"),
        "{out:?}"
    );

    // Five CPUs: more threads than the bench platform's CPUs.
    let mut cpus: Vec<Cpu> = (0..5)
        .map(|cpu| Cpu {
            cpu,
            events: Vec::new(),
        })
        .collect();
    for (i, cpu) in cpus.iter_mut().enumerate() {
        cpu.push(
            EventKind::Alloc,
            EventType::Kmalloc,
            10,
            0x1000 * (i as u64 + 1),
            8,
            0,
        );
    }
    let five = dir.join("five.kmt");
    write_dump(&five, &mut cpus);
    let out = bench(&["replay", five.to_str().unwrap(), "--no-callgrind"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("events of 5 CPUs; the replay runs at most 4"),
        "{out:?}"
    );
}
