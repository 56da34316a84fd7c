//! magpie-kmem on dumps written by the real kmemtrace writer: magpie-slab
//! running on the host (one thread switching CPU ids), recording a known
//! workload, dumped to a file — reader and writer agree on the ABI.

mod common;

use magpie_slab::CacheArgs;
use std::alloc::Layout;
use std::cell::Cell;
use std::ptr::NonNull;
use std::sync::Mutex;

use common::{run, scratch, stderr, stdout, write};
use magpie_slab::kmemtrace::{DumpInfo, KmemtraceConfig};
use magpie_slab::{
    AllocError, AllocTagHooks, ArenaStats, Kmem, PAGE_SIZE, PageSource, Platform, PlatformHooks,
};

const NR_CPUS: usize = 2;
const SITE_A: usize = 0xffff_ffff_8010_0010;
const SITE_B: usize = 0xffff_ffff_8020_0020;

std::thread_local! {
    static CPU: Cell<usize> = const { Cell::new(0) };
    static CALLER: Cell<usize> = const { Cell::new(0) };
}

fn set_cpu(cpu: usize) {
    CPU.with(|c| c.set(cpu));
}

fn set_caller(site: usize) {
    CALLER.with(|c| c.set(site));
}

/// Two CPUs acted by one thread (`set_cpu`), no interrupts, a counter clock.
struct HostPlatform;

static CLOCK: Mutex<u64> = Mutex::new(0);

// SAFETY: each test drives its allocator from one thread only, so the CPU
// id it sets is the running "CPU" and nothing else runs on it; there are
// no interrupts to disable; the default `cross_cpu_call` runs the work on
// this thread, which is exclusive with every CPU's sections because only
// this thread runs allocator code.
unsafe impl Platform for HostPlatform {
    fn max_cpus() -> usize {
        NR_CPUS
    }
    fn cpu_id() -> usize {
        CPU.with(|c| c.get())
    }
    fn irq_save() -> usize {
        0
    }
    fn irq_restore(_state: usize) {}
    fn now() -> u64 {
        let mut clock = CLOCK.lock().unwrap();
        *clock += 1;
        *clock
    }
}

// SAFETY: the hooks keep PlatformHooks' contract: the KFENCE pool (if any) is
// mapped and the platform's own, and charge tokens are the ones the token hooks
// return.
unsafe impl PlatformHooks for HostPlatform {
    fn backtrace(_frames: &mut [usize]) -> usize {
        0
    }
    fn context(_buf: &mut [u8; 32]) -> usize {
        0
    }
    fn caller_frames(frames: &mut [usize]) -> usize {
        match frames.first_mut() {
            Some(first) => {
                *first = CALLER.with(|c| c.get());
                1
            }
            None => 0,
        }
    }
}

// SAFETY: the defaults: no tags.
unsafe impl AllocTagHooks for HostPlatform {}

/// Pages from one leaked, page-aligned region (bump allocation, frees
/// ignored: the tests are short).
struct HostPages {
    base: usize,
    end: usize,
    next: Mutex<usize>,
}

impl HostPages {
    fn leak(bytes: usize) -> &'static HostPages {
        let layout = Layout::from_size_align(bytes, PAGE_SIZE).unwrap();
        // SAFETY: the layout has a non-zero size.
        let base = unsafe { std::alloc::alloc_zeroed(layout) } as usize;
        assert_ne!(base, 0);
        Box::leak(Box::new(HostPages {
            base,
            end: base + bytes,
            next: Mutex::new(base),
        }))
    }
}

impl PageSource for HostPages {
    fn name(&self) -> &str {
        "host"
    }
    fn alloc_pages(&self, nr_pages: usize) -> Result<NonNull<u8>, AllocError> {
        let mut next = self.next.lock().unwrap();
        let end = *next + nr_pages * PAGE_SIZE;
        if nr_pages == 0 || end > self.end {
            return Err(AllocError::OutOfMemory);
        }
        let addr = *next;
        *next = end;
        NonNull::new(addr as *mut u8).ok_or(AllocError::OutOfMemory)
    }
    unsafe fn free_pages(&self, _addr: NonNull<u8>, _nr_pages: usize) {}
    fn span(&self) -> (usize, usize) {
        (self.base, self.end)
    }
    fn stats(&self) -> ArenaStats {
        ArenaStats {
            total_bytes: self.end - self.base,
            alloc_bytes: *self.next.lock().unwrap() - self.base,
            nr_allocs_ever: 0,
        }
    }
}

fn start(alloc: &'static Kmem<HostPlatform>, nr_subbufs: usize) {
    set_cpu(0);
    alloc.init(HostPages::leak(64 << 20)).unwrap();
    let config = KmemtraceConfig {
        nr_subbufs,
        ..Default::default()
    };
    alloc.kmemtrace().start(config).unwrap();
}

fn dump(alloc: &'static Kmem<HostPlatform>) -> Vec<u8> {
    let mut bytes = Vec::new();
    let ticks_to_ns = |ticks: u64| ticks * 10;
    let info = DumpInfo {
        build_id: [0; 20],
        ticks_to_ns: &ticks_to_ns,
    };
    let summary = alloc
        .kmemtrace()
        .dump(&info, &mut |chunk| bytes.extend_from_slice(chunk));
    assert_eq!(summary.nr_bytes as usize, bytes.len());
    bytes
}

static SESSION: Kmem<HostPlatform> = Kmem::new();

#[test]
fn a_session_recorded_by_magpie_slab_reads_back_exactly() {
    start(&SESSION, 4);
    set_caller(SITE_A);
    let a: Vec<NonNull<u8>> = (0..3).map(|_| SESSION.kmalloc(100, 8).unwrap()).collect();
    set_caller(SITE_B);
    let big = SESSION.kmalloc(4000, 8).unwrap();
    set_cpu(1);
    // SAFETY: from kmalloc, freed once, not used after.
    unsafe { SESSION.kfree(a[0]) }.unwrap();
    set_cpu(0);
    // SAFETY: as above.
    unsafe { SESSION.kfree(a[1]) }.unwrap();
    SESSION.kmemtrace().stop();

    let dir = scratch("slab_writer_session");
    write(&dir, "s.kmt", &dump(&SESSION));
    let o = run(&dir, &["check", "--no-symbols", "s.kmt"]);
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    assert!(
        stdout(&o)
            .contains("  events    6 (4 alloc, 2 free, 0 failed alloc, 0 bad free), 0 overruns\n"),
        "{}",
        stdout(&o)
    );
    assert!(stdout(&o).ends_with("check: OK (0 errors, 0 warnings)\n"));

    let o = run(&dir, &["stat", "--no-symbols", "--json", "s.kmt"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let site = |addr: usize| {
        v["callsites"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["call_site"] == format!("{addr:#x}"))
            .unwrap_or_else(|| panic!("no row for {addr:#x} in {v}"))
            .clone()
    };
    let a_row = site(SITE_A);
    assert_eq!(
        (
            a_row["hit"].as_u64(),
            a_row["bytes_alloc"].as_u64(),
            a_row["bytes_req"].as_u64()
        ),
        (Some(3), Some(312), Some(300))
    );
    assert_eq!(a_row["pingpong"], 1, "a[0] freed on cpu 1");
    assert_eq!(a_row["frees"], 2);
    let b_row = site(SITE_B);
    assert_eq!(
        (
            b_row["hit"].as_u64(),
            b_row["bytes_alloc"].as_u64(),
            b_row["bytes_req"].as_u64()
        ),
        (Some(1), Some(4032), Some(4000))
    );
    let caches = v["caches"].as_array().unwrap();
    assert!(
        caches
            .iter()
            .any(|c| c["name"] == "kmalloc-104" && c["hit"] == 3)
    );
    assert!(
        caches
            .iter()
            .any(|c| c["name"] == "kmalloc-4032" && c["hit"] == 1)
    );
    assert_eq!(v["summary"]["pingpong_frees"], 1);
    assert_eq!(v["summary"]["matched_frees"], 2);

    let o = run(&dir, &["live", "--no-symbols", "--json", "s.kmt"]);
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let mut live: Vec<String> = v["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["objects"].as_array().unwrap().clone())
        .map(|o| o["ptr"].as_str().unwrap().to_string())
        .collect();
    live.sort();
    let mut held = vec![
        format!("{:#x}", a[2].as_ptr() as usize),
        format!("{:#x}", big.as_ptr() as usize),
    ];
    held.sort();
    assert_eq!(live, held);
}

static OVERRUN: Kmem<HostPlatform> = Kmem::new();

#[test]
fn a_full_buffer_reads_back_as_overruns_not_corruption() {
    // One sub-buffer per CPU (1,024 events), 1,100 allocations on CPU 0.
    start(&OVERRUN, 1);
    set_caller(SITE_A);
    for _ in 0..1100 {
        OVERRUN.kmalloc(8, 8).unwrap();
    }
    OVERRUN.kmemtrace().stop();
    let dir = scratch("slab_writer_overrun");
    write(&dir, "o.kmt", &dump(&OVERRUN));
    let o = run(&dir, &["check", "--no-symbols", "o.kmt"]);
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(0), "{out}{}", stderr(&o));
    assert!(
        out.contains("  cpu 0     1024 events, seq 0..=1023, 76 overruns, 0 seq gaps\n"),
        "{out}"
    );
    assert!(
        out.contains("warning: cpu 0: 76 events lost to overruns (buffer full; none of them between recorded events)"),
        "{out}"
    );
    assert!(out.ends_with("check: OK (0 errors, 1 warning)\n"), "{out}");
}

static DESTROYED: Kmem<HostPlatform> = Kmem::new();

/// A cache destroyed before the dump: its events still name it (the
/// writer keeps the CACHE record of a cache destroyed during the record).
#[test]
fn a_cache_destroyed_before_the_dump_keeps_its_name() {
    start(&DESTROYED, 4);
    set_caller(SITE_A);
    let cache = DESTROYED
        .cache_create(
            "dentry-scratch",
            96,
            &CacheArgs {
                align: 8,
                ..CacheArgs::DEFAULT
            },
        )
        .unwrap();
    let objects: Vec<_> = (0..5).map(|_| cache.alloc_box().unwrap()).collect();
    for object in objects {
        object.free().unwrap();
    }
    // SAFETY: nothing uses the cache afterwards; one thread.
    unsafe { cache.destroy() }.unwrap();
    DESTROYED.kmemtrace().stop();

    let dir = scratch("slab_writer_destroyed");
    write(&dir, "d.kmt", &dump(&DESTROYED));
    let o = run(
        &dir,
        &["stat", "--no-symbols", "--cache", "--json", "d.kmt"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let row = v["caches"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "dentry-scratch")
        .unwrap_or_else(|| panic!("no dentry-scratch row in {v}"))
        .clone();
    assert_eq!(row["hit"], 5, "{row}");
    assert!(!stdout(&o).contains("cache#"), "{}", stdout(&o));
    let o = run(&dir, &["check", "--no-symbols", "d.kmt"]);
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
}

static MARKED: Kmem<HostPlatform> = Kmem::new();

/// `kmemtrace::Kmemtrace::mark` while recording becomes a MARK record the
/// tool shows as a marker; marks before the start are not kept.
#[test]
fn marks_made_while_recording_reach_the_dump() {
    set_cpu(0);
    MARKED.init(HostPages::leak(64 << 20)).unwrap();
    MARKED.kmemtrace().mark("before the record");
    let config = KmemtraceConfig {
        nr_subbufs: 4,
        ..Default::default()
    };
    MARKED.kmemtrace().start(config).unwrap();
    MARKED.kmemtrace().mark("kmalloc 100 1");
    set_caller(SITE_A);
    let p = MARKED.kmalloc(100, 8).unwrap();
    set_cpu(1);
    MARKED.kmemtrace().mark("kfree all");
    // SAFETY: from kmalloc, freed once.
    unsafe { MARKED.kfree(p) }.unwrap();
    set_cpu(0);
    MARKED.kmemtrace().stop();
    let dir = scratch("slab_writer_marks");
    write(&dir, "m.kmt", &dump(&MARKED));
    let o = run(
        &dir,
        &["export", "--no-symbols", "--format", "chrome", "m.kmt"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let marks: Vec<(String, u64)> = v["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["cat"] == "shell")
        .map(|e| {
            (
                e["name"].as_str().unwrap().to_string(),
                e["tid"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        marks,
        [
            // tid = CPU + 1 (CPU 0 and CPU 1).
            ("kmalloc 100 1".to_string(), 1),
            ("kfree all".to_string(), 2)
        ]
    );
}
