//! `magpie-bench replay DUMP`: a kernel's own recorded allocations and
//! frees (a kmemtrace dump, `.kmt`) run on the host through magpie-slab
//! and the allocators a hobby kernel would use instead, one table.
//!
//! ```text
//! magpie-bench replay DUMP [--json] [--no-callgrind] [--allocators A,B,...] [--heap-mib N]
//! magpie-bench replay-one DUMP ALLOCATOR [--no-check|--check] [--heap-mib N]
//! ```
//!
//! (`magpie-kmem replay DUMP ...` runs the first.)
//!
//! - **The trace** ([`Trace::from_dump`]): the dump's events of every CPU
//!   merged in time order (the reader's order, `Dump::merged_events`); an
//!   alloc becomes an allocation of its layout, a free the free of the
//!   block that alloc got. Layouts: a `kmem_cache` allocation is its
//!   cache's object size and alignment (the CACHE record); a kmalloc or
//!   page-granular one is the bytes the caller asked for, aligned to the
//!   smallest of 8, the size's power of two and the recorded pointer's
//!   alignment (the dump does not record a kmalloc's alignment). Frees of
//!   blocks allocated before the record started, failed allocations and
//!   refused frees are not replayed (counted in the summary). Blocks live
//!   at the end stay allocated.
//! - **One thread per recorded CPU**, each acting as that CPU (magpie's
//!   per-CPU magazines), running its CPU's operations in the recorded
//!   global order: a thread waits for its turn (outside the measured
//!   calls), so no two operations overlap and every run does the same
//!   work in the same order.
//! - **Like for like**: every allocator is a `&dyn GlobalAlloc` called
//!   with run-time layouts through the same two out-of-line functions,
//!   [`replay_op_alloc`] and [`replay_op_free`]; the caller writes every
//!   byte of each block it gets (and, checked, reads them back at the
//!   free). Magpie is the bench's (`allocs::Magpie`, its `GlobalAlloc`);
//!   the region allocators grow from the same page source
//!   (`arena::Arena`), mimalloc from the OS.
//! - **Instructions per operation**: one run per allocator under
//!   callgrind collecting only inside those two functions
//!   (`--collect-atstart=no --toggle-collect=...`), so parsing the dump,
//!   the threads' turns and the writes are not counted; the `null` row
//!   (no allocator: one buffer for every block) is the calls themselves,
//!   subtracted from every row alike. Exact and repeatable.
//! - **Pages**: the most pages the allocator held from its page source
//!   (magpie: its `PageSource`'s high-water mark, page map included; the
//!   region allocators: pages taken from the arena, which they never give
//!   back; mimalloc: its own peak of committed memory). **Peak ÷ live**:
//!   those bytes over the most bytes live at once in the trace (the sizes
//!   requested).
//! - **Checked** (every run outside callgrind): each block is aligned as
//!   asked, overlaps no live block, and still holds the bytes written
//!   into it when it is freed; every failed allocation is counted and
//!   reported.

use std::alloc::{GlobalAlloc, Layout};
use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::io::IsTerminal as _;
use std::process::Command;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use magpie_kmem::dump::{Dump, EventKind, EventType};
use magpie_slab::PAGE_SIZE;

use crate::allocs::{self, opaque};
use crate::arena::{BuddyHeap, Grown, LinkedListHeap, RlsfHeap, TalcHeap};
use crate::fixed_size_block::{FixedSizeBlockAllocator, Locked};
use crate::host::{self, BenchPlatform, set_cpu};

/// The allocators of the replay, in table order (`null` last: the
/// harness row).
pub const REPLAY_ALLOCATORS: &[&str] = &[
    "magpie",
    "talc",
    "rlsf",
    "mimalloc",
    "buddy_system_allocator",
    "linked_list_allocator",
    "fixed_size_block",
    "null",
];

/// Smallest heap (page source, arena) a replay gets, in bytes.
const MIN_HEAP_BYTES: usize = 16 << 20;

/// One operation of the trace.
#[derive(Clone, Copy, Debug)]
pub struct Op {
    /// The thread (recorded CPU, renumbered from 0) that runs it.
    pub thread: u16,
    /// Allocation (true) or free.
    pub alloc: bool,
    /// The block's slot: the allocation and its free share it.
    pub slot: u32,
    /// The block's layout.
    pub layout: Layout,
}

/// The operations of a dump, ready to run.
#[derive(Debug, Default)]
pub struct Trace {
    /// Operations in the recorded global order.
    pub ops: Vec<Op>,
    /// The recorded CPU of each thread.
    pub cpus: Vec<u16>,
    /// Slots needed (most blocks live at once, at most).
    pub nr_slots: usize,
    /// Allocations replayed.
    pub nr_allocs: u64,
    /// Frees replayed.
    pub nr_frees: u64,
    /// Frees not replayed: blocks allocated before the record started.
    pub nr_unpaired_frees: u64,
    /// Events not replayed: failed allocations, refused frees, an alloc
    /// of a pointer already live.
    pub nr_skipped: u64,
    /// Most bytes live at once (sizes requested).
    pub peak_live_bytes: usize,
    /// Bytes live at the end.
    pub live_bytes_at_end: usize,
    /// Largest block.
    pub max_size: usize,
}

impl Trace {
    /// The trace of `dump` (its last dump, as every `magpie-kmem` command
    /// reads it).
    ///
    /// # Errors
    /// A dump with more recorded CPUs than the bench platform has
    /// ([`host::NR_CPUS`]), or with a size or alignment no `Layout` holds.
    pub fn from_dump(dump: &Dump) -> Result<Trace, String> {
        let mut trace = Trace::default();
        let mut live: HashMap<u64, (u32, Layout)> = HashMap::new();
        let mut free_slots: Vec<u32> = Vec::new();
        let mut thread_of: BTreeMap<u16, u16> = BTreeMap::new();
        for event in dump.events() {
            let next = thread_of.len() as u16;
            thread_of.entry(event.cpu).or_insert(next);
        }
        // Threads in CPU order.
        for (index, (&cpu, thread)) in thread_of.iter_mut().enumerate() {
            *thread = index as u16;
            trace.cpus.push(cpu);
        }
        if trace.cpus.len() > host::NR_CPUS {
            return Err(format!(
                "the dump has events of {} CPUs; the replay runs at most {} (one thread each)",
                trace.cpus.len(),
                host::NR_CPUS
            ));
        }
        let mut live_bytes = 0usize;
        for event in dump.merged_events() {
            let thread = thread_of[&event.cpu];
            match event.kind {
                EventKind::Alloc => {
                    if live.contains_key(&event.ptr) || event.ptr == 0 {
                        trace.nr_skipped += 1;
                        continue;
                    }
                    let layout = layout_of(dump, event)?;
                    let slot = free_slots.pop().unwrap_or_else(|| {
                        trace.nr_slots += 1;
                        trace.nr_slots as u32 - 1
                    });
                    live.insert(event.ptr, (slot, layout));
                    live_bytes += layout.size();
                    trace.peak_live_bytes = trace.peak_live_bytes.max(live_bytes);
                    trace.max_size = trace.max_size.max(layout.size());
                    trace.nr_allocs += 1;
                    trace.ops.push(Op {
                        thread,
                        alloc: true,
                        slot,
                        layout,
                    });
                }
                EventKind::Free => match live.remove(&event.ptr) {
                    Some((slot, layout)) => {
                        live_bytes -= layout.size();
                        free_slots.push(slot);
                        trace.nr_frees += 1;
                        trace.ops.push(Op {
                            thread,
                            alloc: false,
                            slot,
                            layout,
                        });
                    }
                    None => trace.nr_unpaired_frees += 1,
                },
                EventKind::FailedAlloc | EventKind::BadFree => trace.nr_skipped += 1,
            }
        }
        trace.live_bytes_at_end = live_bytes;
        Ok(trace)
    }

    /// The heap every allocator gets when none is asked for: four times
    /// the peak live bytes plus the largest block, a power of two, at
    /// least 16 MiB.
    pub fn default_heap_bytes(&self) -> usize {
        (4 * (self.peak_live_bytes + self.max_size))
            .next_power_of_two()
            .max(MIN_HEAP_BYTES)
    }
}

/// The layout an alloc event is replayed with (see the module docs).
fn layout_of(dump: &Dump, event: &magpie_kmem::dump::DecodedEvent) -> Result<Layout, String> {
    let (size, align) = match event.event_type {
        EventType::Cache => match dump.caches.get(&event.cache_id) {
            Some(cache) => (
                cache.obj_size as usize,
                (cache.align as usize).max(1).next_power_of_two(),
            ),
            None => (event.bytes_alloc as usize, 8),
        },
        EventType::Kmalloc | EventType::Pages => {
            let size = if event.bytes_req == 0 {
                event.bytes_alloc as usize
            } else {
                event.bytes_req as usize
            };
            let ptr_align = 1usize << event.ptr.trailing_zeros().min(12);
            (size, 8.min(size.max(1).next_power_of_two()).min(ptr_align))
        }
    };
    Layout::from_size_align(size.max(1), align).map_err(|error| {
        format!(
            "event at offset {}: size {size}, alignment {align}: {error}",
            event.offset
        )
    })
}

// ------------------------------------------------------------ the calls

/// Allocate through `a`: the measured call (callgrind collects inside it
/// only; `no_mangle` gives it the name `--toggle-collect` uses).
#[unsafe(no_mangle)]
#[inline(never)]
pub fn replay_op_alloc(a: &dyn GlobalAlloc, layout: Layout) -> *mut u8 {
    // SAFETY: every replayed layout has a non-zero size (layout_of).
    unsafe { a.alloc(layout) }
}

/// Free through `a`: the other measured call.
///
/// # Safety
/// `ptr` came from [`replay_op_alloc`] of `a` with `layout`.
#[unsafe(no_mangle)]
#[inline(never)]
pub unsafe fn replay_op_free(a: &dyn GlobalAlloc, ptr: *mut u8, layout: Layout) {
    // SAFETY: per our caller.
    unsafe { a.dealloc(ptr, layout) }
}

/// No allocator: every block is the same buffer (big enough for the
/// largest), so its instructions are those of the calls alone.
struct ReplayNull {
    buffer: *mut u8,
}

// SAFETY: the buffer is only written by the thread whose turn it is.
unsafe impl Sync for ReplayNull {}

// SAFETY: the buffer is big and aligned enough for every replayed layout
// of its trace (it is never handed out twice at once in a checked run:
// `null` is not checked).
unsafe impl GlobalAlloc for ReplayNull {
    unsafe fn alloc(&self, _layout: Layout) -> *mut u8 {
        opaque(self.buffer)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        opaque(ptr);
    }
}

unsafe extern "C" {
    fn mi_process_info(
        elapsed_msecs: *mut usize,
        user_msecs: *mut usize,
        system_msecs: *mut usize,
        current_rss: *mut usize,
        peak_rss: *mut usize,
        current_commit: *mut usize,
        peak_commit: *mut usize,
        page_faults: *mut usize,
    );
}

/// mimalloc's peak of committed memory, in pages.
fn mimalloc_peak_pages() -> usize {
    let mut values = [0usize; 8];
    let [a, b, c, d, e, f, g, h] = &mut values;
    // SAFETY: eight valid pointers to usize, as mi_process_info writes.
    unsafe { mi_process_info(a, b, c, d, e, f, g, h) };
    values[6].div_ceil(PAGE_SIZE)
}

/// An allocator of the replay and how to read its pages.
type Subject = (&'static (dyn GlobalAlloc + Sync), Box<dyn Fn() -> usize>);

fn leak<T>(value: T) -> &'static T {
    Box::leak(Box::new(value))
}

/// Make allocator `name` over a heap of `heap_bytes`.
fn subject(name: &str, heap_bytes: usize, trace: &Trace) -> Result<Subject, String> {
    fn grown<H: crate::arena::Grow + 'static>(heap: H, bytes: usize) -> Subject {
        let g = leak(Grown::new(heap, bytes));
        (g, Box::new(|| g.taken_pages()))
    }
    Ok(match name {
        "magpie" => {
            let m = leak(allocs::Magpie::<BenchPlatform, false>::with_heap(
                heap_bytes,
            ));
            (&allocs::MAGPIE, Box::new(|| m.peak_pages()))
        }
        "talc" => grown(TalcHeap::new(), heap_bytes),
        "rlsf" => grown(RlsfHeap::new(), heap_bytes),
        "buddy_system_allocator" => grown(BuddyHeap::new(), heap_bytes),
        "linked_list_allocator" => grown(LinkedListHeap::new(), heap_bytes),
        "fixed_size_block" => grown(Locked::new(FixedSizeBlockAllocator::new()), heap_bytes),
        "mimalloc" => (&mimalloc::MiMalloc, Box::new(mimalloc_peak_pages)),
        "null" => {
            let (buffer, _) = host::region(trace.max_size.next_multiple_of(PAGE_SIZE), PAGE_SIZE);
            (
                leak(ReplayNull {
                    buffer: buffer as *mut u8,
                }),
                Box::new(|| 0),
            )
        }
        other => {
            return Err(format!(
                "unknown allocator {other} (one of {})",
                REPLAY_ALLOCATORS.join(", ")
            ));
        }
    })
}

// ------------------------------------------------------------ one run

/// What a checked run found wrong.
#[derive(Default)]
struct Problems {
    nr_overlaps: u64,
    nr_misaligned: u64,
    nr_corrupted: u64,
    first: Option<String>,
}

impl Problems {
    fn note(&mut self, message: String) {
        if self.first.is_none() {
            self.first = Some(message);
        }
    }
}

/// The live blocks of a checked run (start → end) and its findings.
#[derive(Default)]
struct Checker {
    live: BTreeMap<usize, usize>,
    problems: Problems,
}

impl Checker {
    fn on_alloc(&mut self, index: usize, ptr: usize, layout: Layout) {
        if !ptr.is_multiple_of(layout.align()) {
            self.problems.nr_misaligned += 1;
            self.problems.note(format!(
                "operation {index}: block {ptr:#x} of {} bytes is not aligned to {}",
                layout.size(),
                layout.align()
            ));
        }
        let end = ptr + layout.size();
        if let Some((&start, &other_end)) = self.live.range(..end).next_back()
            && other_end > ptr
        {
            self.problems.nr_overlaps += 1;
            self.problems.note(format!(
                "operation {index}: block {ptr:#x}..{end:#x} overlaps live block \
                 {start:#x}..{other_end:#x}"
            ));
        }
        self.live.insert(ptr, end);
    }

    fn on_free(&mut self, index: usize, ptr: usize, layout: Layout, intact: bool) {
        self.live.remove(&ptr);
        if !intact {
            self.problems.nr_corrupted += 1;
            self.problems.note(format!(
                "operation {index}: block {ptr:#x} of {} bytes changed while it was live",
                layout.size()
            ));
        }
    }
}

/// The byte written into the block of `slot` (never 0, so a zeroed page
/// under a block that was never written shows).
fn fill_byte(slot: u32) -> u8 {
    (slot % 251) as u8 + 1
}

/// What one run did.
struct Outcome {
    nr_failures: u64,
    problems: Option<Problems>,
}

/// Operations from which a run prints a progress line (stderr, every
/// tenth of the trace).
const PROGRESS_FROM_OPS: usize = 200_000;

/// Run the trace through `a` (named `name` in the progress line), one
/// thread per recorded CPU.
fn execute(
    name: &str,
    a: &'static (dyn GlobalAlloc + Sync),
    trace: &Trace,
    check: bool,
) -> Outcome {
    let nr_ops = trace.ops.len();
    let progress_step = if nr_ops >= PROGRESS_FROM_OPS {
        nr_ops.div_ceil(10)
    } else {
        usize::MAX
    };
    let slots: Vec<AtomicUsize> = (0..trace.nr_slots).map(|_| AtomicUsize::new(0)).collect();
    let turn = AtomicUsize::new(0);
    let nr_failures = AtomicU64::new(0);
    let checker = check.then(|| Mutex::new(Checker::default()));
    let nr_threads = trace.cpus.len();
    let mut ops_of: Vec<Vec<usize>> = vec![Vec::new(); nr_threads];
    for (index, op) in trace.ops.iter().enumerate() {
        ops_of[op.thread as usize].push(index);
    }
    let run = |index: usize| {
        let op = trace.ops[index];
        let slot = &slots[op.slot as usize];
        let size = op.layout.size();
        if op.alloc {
            let ptr = replay_op_alloc(a, op.layout);
            if ptr.is_null() {
                nr_failures.fetch_add(1, Ordering::Relaxed);
                return;
            }
            if let Some(checker) = &checker {
                checker
                    .lock()
                    .unwrap()
                    .on_alloc(index, ptr as usize, op.layout);
            }
            // SAFETY: a fresh block of `size` bytes, ours until freed.
            unsafe { ptr.write_bytes(fill_byte(op.slot), size) };
            slot.store(ptr as usize, Ordering::Relaxed);
        } else {
            let ptr = slot.swap(0, Ordering::Relaxed) as *mut u8;
            if ptr.is_null() {
                return; // its allocation failed (counted there)
            }
            if let Some(checker) = &checker {
                // SAFETY: the live block of this slot, `size` bytes.
                let bytes = unsafe { std::slice::from_raw_parts(ptr, size) };
                let intact = bytes.iter().all(|&b| b == fill_byte(op.slot));
                checker
                    .lock()
                    .unwrap()
                    .on_free(index, ptr as usize, op.layout, intact);
            }
            // SAFETY: allocated by `a` with this layout, not freed since.
            unsafe { replay_op_free(a, ptr, op.layout) };
        }
    };
    std::thread::scope(|scope| {
        for (thread, ops) in ops_of.iter().enumerate() {
            let run = &run;
            let turn = &turn;
            scope.spawn(move || {
                set_cpu(thread);
                for &index in ops {
                    if nr_threads > 1 {
                        while turn.load(Ordering::Acquire) != index {
                            std::thread::yield_now();
                        }
                    }
                    run(index);
                    let milestone =
                        index % progress_step == progress_step - 1 || index + 1 == nr_ops;
                    if milestone && nr_ops >= PROGRESS_FROM_OPS {
                        // One line rewritten on a terminal, a line each in
                        // a log.
                        let (start, end) = if std::io::stderr().is_terminal() {
                            ("\r", if index + 1 == nr_ops { "\n" } else { "" })
                        } else {
                            ("", "\n")
                        };
                        eprint!(
                            "{start}replay {name}: {}/{nr_ops} operations{end}",
                            index + 1
                        );
                    }
                    if nr_threads > 1 {
                        turn.store(index + 1, Ordering::Release);
                    }
                }
            });
        }
    });
    Outcome {
        nr_failures: nr_failures.load(Ordering::Relaxed),
        problems: checker.map(|c| c.into_inner().unwrap().problems),
    }
}

fn load(path: &str) -> Result<(Dump, Trace), String> {
    let bytes = std::fs::read(path).map_err(|e| format!("{path}: {e}"))?;
    let dump = Dump::parse(&bytes).map_err(|e| format!("{path}: {e}"))?;
    let trace = Trace::from_dump(&dump).map_err(|e| format!("{path}: {e}"))?;
    Ok((dump, trace))
}

/// `replay-one DUMP ALLOCATOR [--no-check|--check] [--heap-mib N]`: one run in
/// this process; prints a `REPLAY` line (and `REPLAY_PROBLEM` with the
/// first problem a checked run found).
pub fn main_one(args: &[String]) -> Result<(), String> {
    let mut positional = Vec::new();
    let mut check = true;
    let mut force_check = false;
    let mut heap_mib = None;
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--no-check" => check = false,
            // Check `null` too (its blocks all overlap: the checker's test).
            "--check" => force_check = true,
            "--heap-mib" => heap_mib = Some(parse_mib(it.next())?),
            _ => positional.push(arg.as_str()),
        }
    }
    let [path, name] = positional[..] else {
        return Err(
            "usage: magpie-bench replay-one DUMP ALLOCATOR [--no-check] [--heap-mib N]".into(),
        );
    };
    let (_, trace) = load(path)?;
    let heap_bytes = heap_mib.map_or_else(|| trace.default_heap_bytes(), |m| m << 20);
    let (a, pages) = subject(name, heap_bytes, &trace)?;
    let check = force_check || (check && name != "null");
    let outcome = execute(name, a, &trace, check);
    let problems = outcome.problems.as_ref();
    println!(
        "REPLAY allocator={name} ops={} threads={} failures={} peak_pages={} peak_live={} \
         heap_bytes={heap_bytes} check={} overlaps={} misaligned={} corrupted={}",
        trace.ops.len(),
        trace.cpus.len(),
        outcome.nr_failures,
        pages(),
        trace.peak_live_bytes,
        match problems {
            None => "off",
            Some(p) if p.first.is_none() => "ok",
            Some(_) => "failed",
        },
        problems.map_or(0, |p| p.nr_overlaps),
        problems.map_or(0, |p| p.nr_misaligned),
        problems.map_or(0, |p| p.nr_corrupted),
    );
    if let Some(first) = problems.and_then(|p| p.first.as_ref()) {
        println!("REPLAY_PROBLEM {first}");
    }
    Ok(())
}

fn parse_mib(value: Option<&String>) -> Result<usize, String> {
    value
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|&v| v > 0 && v <= 1 << 16)
        .ok_or_else(|| "--heap-mib: a number of MiB, 1 to 65536".to_string())
}

// ------------------------------------------------------------ the table

/// One allocator's results.
#[derive(Clone, Debug, Default)]
pub struct Row {
    /// The allocator.
    pub allocator: String,
    /// Instructions per operation under callgrind, raw (None: not run).
    pub ir_per_op: Option<f64>,
    /// Pages held at the peak.
    pub peak_pages: Option<u64>,
    /// Failed allocations.
    pub failures: Option<u64>,
    /// `ok`, `failed` (with the first problem), `off` (null), or the
    /// error of the run.
    pub check: String,
}

/// The results of one dump.
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// The dump.
    pub dump: String,
    /// Operations replayed.
    pub nr_ops: u64,
    /// Threads (recorded CPUs).
    pub nr_threads: usize,
    /// Most bytes live at once.
    pub peak_live_bytes: usize,
    /// The heap every allocator had.
    pub heap_bytes: usize,
    /// Events not replayed (unpaired frees, failed allocs, bad frees).
    pub nr_not_replayed: u64,
    /// One per allocator, `null` last.
    pub rows: Vec<Row>,
}

impl Report {
    fn null_ir(&self) -> Option<f64> {
        self.rows
            .iter()
            .find(|r| r.allocator == "null")
            .and_then(|r| r.ir_per_op)
    }

    /// Net instructions per operation of `row` (its raw figure minus
    /// `null`'s).
    pub fn net_ir(&self, row: &Row) -> Option<f64> {
        Some(row.ir_per_op? - self.null_ir()?)
    }

    /// Peak pages in bytes over the peak live bytes.
    pub fn peak_over_live(&self, row: &Row) -> Option<f64> {
        let pages = row.peak_pages?;
        (self.peak_live_bytes > 0 && row.allocator != "null")
            .then(|| (pages as usize * PAGE_SIZE) as f64 / self.peak_live_bytes as f64)
    }
}

fn field<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
}

/// Run this binary with `args`, under callgrind if asked: returns its
/// standard output and the instructions collected. Its standard error
/// (the progress line of a long replay, errors) goes to ours; callgrind
/// is quiet and writes its counts to a file read back here.
fn child(me: &str, args: &[&str], callgrind: bool) -> Result<(String, Option<u64>), String> {
    static NR_RUNS: AtomicUsize = AtomicUsize::new(0);
    let out_file = std::env::temp_dir().join(format!(
        "magpie-replay-{}-{}.callgrind",
        std::process::id(),
        NR_RUNS.fetch_add(1, Ordering::Relaxed)
    ));
    let mut cmd = if callgrind {
        let mut c = Command::new("valgrind");
        c.args([
            "-q",
            "--tool=callgrind",
            "--collect-atstart=no",
            "--toggle-collect=replay_op_alloc",
            "--toggle-collect=replay_op_free",
        ]);
        c.arg(format!("--callgrind-out-file={}", out_file.display()));
        c.arg(me);
        c
    } else {
        Command::new(me)
    };
    cmd.args(args).stderr(std::process::Stdio::inherit());
    let out = cmd.output().map_err(|e| format!("spawn: {e}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let counts = callgrind.then(|| std::fs::read_to_string(&out_file));
    let _ = std::fs::remove_file(&out_file);
    if !out.status.success() {
        return Err(format!("{} (its error above)", out.status));
    }
    let ir = match counts {
        None => None,
        Some(text) => Some(
            text.map_err(|e| format!("{}: {e}", out_file.display()))?
                .lines()
                .find_map(|l| {
                    l.strip_prefix("totals:")
                        .or_else(|| l.strip_prefix("summary:"))
                })
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
                .ok_or("no callgrind total")?,
        ),
    };
    Ok((stdout, ir))
}

/// Whether valgrind can be run.
pub fn have_valgrind() -> bool {
    Command::new("valgrind")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Replay `path` through `allocators` (checked run each, and a callgrind
/// run each with `callgrind`), re-running this binary (`me`) per run.
///
/// # Errors
/// The dump cannot be read or replayed (each allocator's own failures
/// are in its row).
pub fn report(
    me: &str,
    path: &str,
    allocators: &[&str],
    callgrind: bool,
    heap_mib: Option<usize>,
) -> Result<Report, String> {
    let (_, trace) = load(path)?;
    let heap_bytes = heap_mib.map_or_else(|| trace.default_heap_bytes(), |m| m << 20);
    let heap_arg = (heap_bytes >> 20).to_string();
    let mut report = Report {
        dump: path.to_string(),
        nr_ops: trace.ops.len() as u64,
        nr_threads: trace.cpus.len(),
        peak_live_bytes: trace.peak_live_bytes,
        heap_bytes,
        nr_not_replayed: trace.nr_unpaired_frees + trace.nr_skipped,
        rows: Vec::new(),
    };
    for (index, &name) in allocators.iter().enumerate() {
        let mut row = Row {
            allocator: name.to_string(),
            ..Row::default()
        };
        eprintln!(
            "replay [{}/{}] {name}: {} operations on {} threads, checked{}",
            index + 1,
            allocators.len(),
            trace.ops.len(),
            trace.cpus.len(),
            if callgrind {
                ", then under callgrind"
            } else {
                ""
            }
        );
        match child(
            me,
            &["replay-one", path, name, "--heap-mib", &heap_arg],
            false,
        ) {
            Ok((stdout, _)) => {
                let line = stdout
                    .lines()
                    .find(|l| l.starts_with("REPLAY "))
                    .unwrap_or("");
                row.peak_pages = field(line, "peak_pages").and_then(|v| v.parse().ok());
                row.failures = field(line, "failures").and_then(|v| v.parse().ok());
                row.check = field(line, "check").unwrap_or("no result").to_string();
                if let Some(problem) = stdout
                    .lines()
                    .find_map(|l| l.strip_prefix("REPLAY_PROBLEM "))
                {
                    row.check = format!("failed: {problem}");
                }
            }
            Err(error) => row.check = format!("run failed: {error}"),
        }
        if callgrind {
            match child(
                me,
                &[
                    "replay-one",
                    path,
                    name,
                    "--no-check",
                    "--heap-mib",
                    &heap_arg,
                ],
                true,
            ) {
                Ok((_, ir)) => {
                    row.ir_per_op = ir.map(|ir| ir as f64 / trace.ops.len().max(1) as f64)
                }
                Err(error) => row.check = format!("{}; callgrind run failed: {error}", row.check),
            }
        }
        report.rows.push(row);
    }
    Ok(report)
}

fn cell(value: Option<f64>, digits: usize) -> String {
    value.map_or("—".into(), |v| format!("{v:.digits$}"))
}

/// The report as a markdown table (and its caption line).
pub fn table(report: &Report) -> String {
    let mut out = String::new();
    writeln!(
        out,
        "`{}`: {} operations on {} thread(s), peak live {:.1} KiB, heap {} MiB each{}\n",
        report.dump,
        report.nr_ops,
        report.nr_threads,
        report.peak_live_bytes as f64 / 1024.0,
        report.heap_bytes >> 20,
        if report.nr_not_replayed > 0 {
            format!(
                "; {} events not replayed (frees of blocks from before the record, failed allocations, refused frees)",
                report.nr_not_replayed
            )
        } else {
            String::new()
        }
    )
    .unwrap();
    writeln!(
        out,
        "| allocator | Ir/op (net) | peak pages | peak KiB | peak ÷ live | failures | check |"
    )
    .unwrap();
    writeln!(out, "|---|---:|---:|---:|---:|---:|---|").unwrap();
    for row in &report.rows {
        let (name, ir) = if row.allocator == "null" {
            ("*null (harness, raw)*".to_string(), row.ir_per_op)
        } else if row.allocator == "magpie" {
            ("**magpie**".to_string(), report.net_ir(row))
        } else {
            (row.allocator.clone(), report.net_ir(row))
        };
        writeln!(
            out,
            "| {name} | {} | {} | {} | {} | {} | {} |",
            cell(ir, 1),
            row.peak_pages.map_or("—".into(), |p| p.to_string()),
            row.peak_pages
                .map_or("—".into(), |p| (p as usize * PAGE_SIZE / 1024)
                    .to_string()),
            cell(report.peak_over_live(row), 2),
            row.failures.map_or("—".into(), |f| f.to_string()),
            row.check.replace('|', "\\|"),
        )
        .unwrap();
    }
    out
}

/// The report as JSON.
pub fn json(report: &Report) -> serde_json::Value {
    serde_json::json!({
        "dump": report.dump,
        "operations": report.nr_ops,
        "threads": report.nr_threads,
        "peak_live_bytes": report.peak_live_bytes,
        "heap_bytes": report.heap_bytes,
        "events_not_replayed": report.nr_not_replayed,
        "allocators": report.rows.iter().map(|row| serde_json::json!({
            "allocator": row.allocator,
            "ir_per_op_raw": row.ir_per_op,
            "ir_per_op_net": report.net_ir(row),
            "peak_pages": row.peak_pages,
            "peak_bytes": row.peak_pages.map(|p| p as usize * PAGE_SIZE),
            "peak_over_live": report.peak_over_live(row),
            "failures": row.failures,
            "check": row.check,
        })).collect::<Vec<_>>(),
    })
}

/// `replay DUMP [--json] [--no-callgrind] [--allocators A,B] [--heap-mib N]`.
///
/// # Errors
/// Bad arguments, an unreadable dump; a row whose check failed or whose
/// allocations failed makes the exit status 1 (after the table).
pub fn main(args: &[String]) -> Result<bool, String> {
    let mut positional = Vec::new();
    let mut as_json = false;
    let mut callgrind = true;
    let mut heap_mib = None;
    let mut names: Vec<String> = REPLAY_ALLOCATORS.iter().map(|s| s.to_string()).collect();
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--json" => as_json = true,
            "--no-callgrind" => callgrind = false,
            "--heap-mib" => heap_mib = Some(parse_mib(it.next())?),
            "--allocators" => {
                let list = it.next().ok_or("--allocators: a comma-separated list")?;
                names = list.split(',').map(str::to_string).collect();
                if let Some(bad) = names
                    .iter()
                    .find(|n| !REPLAY_ALLOCATORS.contains(&n.as_str()))
                {
                    return Err(format!(
                        "--allocators: unknown allocator {bad} (one of {})",
                        REPLAY_ALLOCATORS.join(", ")
                    ));
                }
                // The harness row is what every net figure subtracts.
                if callgrind && !names.iter().any(|n| n == "null") {
                    names.push("null".into());
                }
            }
            other if other.starts_with("--") => return Err(format!("unknown option {other}")),
            _ => positional.push(arg.as_str()),
        }
    }
    let [path] = positional[..] else {
        return Err(
            "usage: magpie-bench replay DUMP [--json] [--no-callgrind] [--allocators A,B,...] [--heap-mib N]"
                .into(),
        );
    };
    if callgrind && !have_valgrind() {
        eprintln!("replay: valgrind not found: no instruction counts (--no-callgrind)");
        callgrind = false;
    }
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let report = report(&crate::suite::exe(), path, &names, callgrind, heap_mib)?;
    if as_json {
        println!("{}", serde_json::to_string_pretty(&json(&report)).unwrap());
    } else {
        print!("{}", table(&report));
    }
    Ok(report
        .rows
        .iter()
        .all(|r| r.failures == Some(0) && matches!(r.check.as_str(), "ok" | "off")))
}

// ------------------------------------------------------------ the suite

/// The recorded workloads of `make bench`, in table order: the kernel's
/// own (committed dumps in bench/workloads/, recorded in QEMU by
/// bench/record-workloads.py) and the Rust-heap ones recorded on the host
/// by `magpie-bench record` into target/bench/workloads/.
pub const SUITE_WORKLOADS: &[(&str, &str)] = &[
    (
        "boot",
        "the kernel from boot to its first prompt (`kmemtrace=on`), 2 CPUs",
    ),
    (
        "shell",
        "the shell's heaviest commands (kmemstat, slabinfo, slabtop, allocinfo, cpus, kmem verify, kmem findleaks, kmalloc/kfree), 2 CPUs",
    ),
    (
        "stress",
        "`stress --cpus all --ops 4000` on 4 CPUs (a quarter of the frees on another CPU)",
    ),
    (
        "heap-tests",
        "examples/hobby-kernel's heap tests (blog_os `heap_allocation` and a BTreeMap churn), recorded on the host",
    ),
    (
        "btree-vec",
        "BTreeMap<u64, Vec<u64>> and strings on 2 CPUs, recorded on the host",
    ),
];

/// The dump of suite workload `name`, recording it first if it is a host
/// one.
fn suite_dump(me: &str, name: &str) -> Result<String, String> {
    let bench_dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let committed = bench_dir.join("workloads").join(format!("{name}.kmt"));
    if committed.is_file() {
        return Ok(committed.to_string_lossy().into_owned());
    }
    let dir = bench_dir.join("../target/bench/workloads");
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let path = dir
        .join(format!("{name}.kmt"))
        .to_string_lossy()
        .into_owned();
    eprintln!("replay: recording {name} on the host");
    child(me, &["record", name, &path], false)?;
    Ok(path)
}

/// The replay section of `make bench` (and of `magpie-bench replay-suite`):
/// every suite workload through every allocator, two tables (instructions
/// per operation; peak pages and peak ÷ live) and the target line.
pub fn suite_section(r: &mut String, failures: &mut Vec<String>, me: &str, callgrind: bool) {
    let mut reports: Vec<(&str, Report)> = Vec::new();
    for &(name, _) in SUITE_WORKLOADS {
        let result = suite_dump(me, name)
            .and_then(|path| report(me, &path, REPLAY_ALLOCATORS, callgrind, None));
        match result {
            Ok(report) => {
                for row in &report.rows {
                    if row.failures.unwrap_or(1) > 0 || !matches!(row.check.as_str(), "ok" | "off")
                    {
                        failures.push(format!(
                            "replay {name} {}: {} failed allocations, check {}",
                            row.allocator,
                            row.failures.map_or("?".into(), |f| f.to_string()),
                            row.check
                        ));
                    }
                }
                reports.push((name, report));
            }
            Err(error) => failures.push(format!("replay {name}: {error}")),
        }
    }
    writeln!(
        r,
        "### Replay of recorded workloads (`magpie-kmem replay`)\n"
    )
    .unwrap();
    writeln!(
        r,
        "A kmemtrace dump's allocations and frees run through each allocator on the host \
         (bench/src/replay.rs; docs/BENCHMARKS.md \"Replay\"): one thread per recorded CPU \
         in the recorded order, every allocator a `&dyn GlobalAlloc` with run-time layouts, \
         every block written in full; checked (alignment, no overlap, contents at the free) \
         with no failure unless listed under Failures. Workloads: {}.\n",
        SUITE_WORKLOADS
            .iter()
            .map(|(name, what)| {
                let ops =
                    reports
                        .iter()
                        .find(|(n, _)| n == name)
                        .map_or("not run".into(), |(_, rep)| {
                            format!(
                                "{} operations, peak live {:.1} KiB",
                                rep.nr_ops,
                                rep.peak_live_bytes as f64 / 1024.0
                            )
                        });
                format!("`{name}` = {what} ({ops})")
            })
            .collect::<Vec<_>>()
            .join("; ")
    )
    .unwrap();
    let header: Vec<&str> = reports.iter().map(|(n, _)| *n).collect();
    let row_of = |rep: &Report, a: &str| rep.rows.iter().find(|row| row.allocator == a).cloned();
    if callgrind {
        writeln!(
            r,
            "Instructions per operation (callgrind, collecting only inside the two calls, \
             net of `null`, the calls alone):\n"
        )
        .unwrap();
        writeln!(
            r,
            "| allocator | {} |\n|---|{}",
            header.join(" | "),
            "---:|".repeat(header.len())
        )
        .unwrap();
        for &a in REPLAY_ALLOCATORS {
            let cells: Vec<String> = reports
                .iter()
                .map(|(_, rep)| {
                    let row = row_of(rep, a);
                    let v = if a == "null" {
                        row.and_then(|row| row.ir_per_op)
                    } else {
                        row.and_then(|row| rep.net_ir(&row))
                    };
                    cell(v, 1)
                })
                .collect();
            let name = match a {
                "magpie" => "**magpie**",
                "null" => "*null (the calls, raw)*",
                other => other,
            };
            writeln!(r, "| {name} | {} |", cells.join(" | ")).unwrap();
        }
        writeln!(r).unwrap();
        let losses: Vec<String> = reports
            .iter()
            .filter_map(|(name, rep)| {
                let magpie = rep.net_ir(&row_of(rep, "magpie")?)?;
                let best = rep
                    .rows
                    .iter()
                    .filter(|row| row.allocator != "magpie" && row.allocator != "null")
                    .filter_map(|row| Some((rep.net_ir(row)?, row.allocator.clone())))
                    .min_by(|a, b| a.0.total_cmp(&b.0))?;
                (best.0 < magpie)
                    .then(|| format!("{name} ({} {:.1} < {magpie:.1})", best.1, best.0))
            })
            .collect();
        writeln!(
            r,
            "- Magpie fewest instructions per operation on every recorded workload: **{}**\n",
            if reports.is_empty() {
                "unmeasured".to_string()
            } else if losses.is_empty() {
                "met".to_string()
            } else {
                format!("not met: {}", losses.join(", "))
            }
        )
        .unwrap();
    }
    writeln!(
        r,
        "Peak memory: KiB of pages held at the peak from the page source (magpie: its page \
         source's high-water mark, page map and metadata included; the region allocators: \
         pages taken from the arena they grow from; mimalloc: its peak commit) and, in \
         brackets, that over the most bytes live at once. Each allocator's heap is the same \
         size per workload (the larger of 16 MiB and four times peak live plus the largest \
         block: magpie's page map is 32 bytes a page of it).\n"
    )
    .unwrap();
    writeln!(
        r,
        "| allocator | {} |\n|---|{}",
        header.join(" | "),
        "---:|".repeat(header.len())
    )
    .unwrap();
    for &a in REPLAY_ALLOCATORS.iter().filter(|&&a| a != "null") {
        let cells: Vec<String> = reports
            .iter()
            .map(|(_, rep)| match row_of(rep, a) {
                Some(row) => format!(
                    "{} ({})",
                    row.peak_pages
                        .map_or("—".into(), |p| (p as usize * PAGE_SIZE / 1024)
                            .to_string()),
                    cell(rep.peak_over_live(&row), 2)
                ),
                None => "—".into(),
            })
            .collect();
        let name = if a == "magpie" { "**magpie**" } else { a };
        writeln!(r, "| {name} | {} |", cells.join(" | ")).unwrap();
    }
    writeln!(r).unwrap();
}

/// `replay-suite [--no-callgrind]`: the replay section of `make bench`
/// alone, printed.
pub fn main_suite(args: &[String]) -> Result<bool, String> {
    let mut callgrind = true;
    for arg in args {
        match arg.as_str() {
            "--no-callgrind" => callgrind = false,
            other => return Err(format!("unknown option {other}")),
        }
    }
    if callgrind && !have_valgrind() {
        eprintln!("replay: valgrind not found: no instruction counts");
        callgrind = false;
    }
    let mut r = String::new();
    let mut failures = Vec::new();
    suite_section(&mut r, &mut failures, &crate::suite::exe(), callgrind);
    print!("{r}");
    for failure in &failures {
        println!("- failure: {failure}");
    }
    Ok(failures.is_empty())
}
