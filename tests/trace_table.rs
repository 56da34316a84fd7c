//! The per-cache trace table (Akaros semantics: `kmemtrace
//! start|stop|print|reset`), in the real kernel: records for exactly the
//! objects callers hold, symbolized backtraces naming the allocating
//! function, "ever traced" frees after `stop`, `reset`, `NOTRACE` refusal,
//! and independence between caches. Printing goes through the shell
//! (`kmemtrace print CACHE`).

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

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;
use core::ptr::NonNull;
use magpie_slab::CacheArgs;

use magpie::kmem::{KernelPlatform, SLAB};
use magpie::shell::Shell;
use magpie_slab::{CacheFlags, KmemCache, TraceError};

type Cache = KmemCache<KernelPlatform>;

magpie::test_kernel!();

// ---------------------------------------------------------------------------
// Helpers

const OBJ_SIZE: usize = 48;

fn create(name: &str) -> &'static Cache {
    SLAB.cache_create(name, OBJ_SIZE, &CacheArgs::DEFAULT)
        .expect("cache_create")
}

fn destroy(cache: &'static Cache) {
    cache.trace_table().stop();
    cache.trace_table().reset();
    // SAFETY: each test destroys only its own cache, after its last use.
    unsafe { magpie::kmem::cache_destroy(cache) }.expect("destroy");
}

/// The allocating call site every trace record must name.
#[inline(never)]
fn allocate_for_trace_test(cache: &Cache, nr: usize, out: &mut Vec<NonNull<u8>>) {
    for _ in 0..nr {
        let obj = cache.alloc().expect("alloc");
        out.push(obj);
    }
    core::hint::black_box(out);
}

/// An allocation from a different function, for the per-site summary.
#[inline(never)]
fn allocate_elsewhere_for_trace_test(cache: &Cache) -> NonNull<u8> {
    core::hint::black_box(cache.alloc().expect("alloc"))
}

fn free(cache: &Cache, obj: NonNull<u8>) {
    // SAFETY: the tests only free objects they allocated and give up.
    unsafe { cache.free(obj) }.expect("free");
}

fn run(shell: &mut Shell, line: &str) -> String {
    let mut out = String::new();
    shell.execute(line, &mut out);
    out
}

/// One `Obj ...` block of `kmemtrace print`.
#[derive(Debug)]
struct Block<'a> {
    addr: usize,
    header: &'a str,
    frames: Vec<&'a str>,
}

fn parse_blocks(text: &str) -> Vec<Block<'_>> {
    let mut blocks = Vec::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        let Some(rest) = line.strip_prefix("Obj 0x") else {
            continue;
        };
        let hex = rest.split(',').next().unwrap();
        let addr =
            usize::from_str_radix(hex, 16).unwrap_or_else(|_| panic!("bad Obj line {line:?}"));
        let mut frames = Vec::new();
        while let Some(frame) = lines.next_if(|next| next.starts_with('#')) {
            frames.push(frame);
        }
        blocks.push(Block {
            addr,
            header: line,
            frames,
        });
    }
    blocks
}

fn print_cache(name: &str) -> String {
    run(&mut Shell::new(), &format!("kmemtrace print {name}"))
}

fn sorted(mut addrs: Vec<usize>) -> Vec<usize> {
    addrs.sort_unstable();
    addrs
}

fn addrs(objs: &[NonNull<u8>]) -> Vec<usize> {
    sorted(objs.iter().map(|obj| obj.as_ptr() as usize).collect())
}

fn recorded(cache: &Cache) -> Vec<usize> {
    let mut out = Vec::with_capacity(cache.trace_table().stats().nr_records + 8);
    // No allocation inside: the trace lock is held during the callback.
    cache.trace_table().for_each(|record| {
        if out.len() < out.capacity() {
            out.push(record.addr);
        }
    });
    sorted(out)
}

// ---------------------------------------------------------------------------
// Tests

#[test_case]
fn print_shows_exactly_the_live_traced_objects() {
    const NR_ALLOCS: usize = 10;
    let cache = create("trace-a");
    let mut untraced = Vec::with_capacity(2);
    allocate_for_trace_test(cache, 2, &mut untraced);
    assert_eq!(
        cache.trace_table().stats().nr_records,
        0,
        "tracing is off by default"
    );

    cache.trace_table().start().expect("trace_start");
    assert!(cache.trace_table().is_on());
    let mut objs = Vec::with_capacity(NR_ALLOCS);
    {
        let _context = magpie::tracing::context::enter_context("trace test");
        allocate_for_trace_test(cache, NR_ALLOCS, &mut objs);
    }
    assert_eq!(cache.trace_table().stats().nr_records, NR_ALLOCS);
    // Free M of them, not in allocation order.
    let mut live = Vec::new();
    let mut nr_freed = 0;
    for (index, &obj) in objs.iter().enumerate() {
        if index % 3 == 0 {
            free(cache, obj);
            nr_freed += 1;
        } else {
            live.push(obj);
        }
    }
    assert_eq!(nr_freed, 4);
    // Freeing an untraced object touches no record.
    free(cache, untraced.pop().unwrap());
    assert_eq!(cache.trace_table().stats().nr_records, NR_ALLOCS - nr_freed);
    assert_eq!(
        recorded(cache),
        addrs(&live),
        "records are exactly the live traced objects"
    );

    let text = print_cache("trace-a");
    let blocks = parse_blocks(&text);
    assert_eq!(blocks.len(), NR_ALLOCS - nr_freed, "{text}");
    assert_eq!(
        sorted(blocks.iter().map(|b| b.addr).collect()),
        addrs(&live),
        "{text}"
    );
    for block in &blocks {
        assert!(
            block.header.contains(&format!("size {OBJ_SIZE},")),
            "{}",
            block.header
        );
        assert!(block.header.contains("cpu 0,"), "{}", block.header);
        assert!(
            block.header.ends_with("from cpu0 trace test:"),
            "{}",
            block.header
        );
        assert!(
            !block.frames.is_empty(),
            "a block without a backtrace: {text}"
        );
        assert!(
            block.frames[0].starts_with("#01 [<0x"),
            "{}",
            block.frames[0]
        );
        assert!(
            block.frames[0].contains("allocate_for_trace_test+0x"),
            "the innermost frame is the allocating function, not allocator plumbing:\n{text}"
        );
        assert!(
            block
                .frames
                .iter()
                .any(|f| f.contains("print_shows_exactly_the_live_traced_objects+0x")),
            "the backtrace reaches the test function:\n{text}"
        );
        assert!(
            !block.frames.iter().any(|f| f.contains("magpie_slab")),
            "{text}"
        );
    }
    assert!(
        text.starts_with("Dumping outstanding allocs from trace-a\n"),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "{} outstanding objects in trace-a, 0 records dropped (tracing on)",
            NR_ALLOCS - nr_freed
        )),
        "{text}"
    );
    // The per-site summary counts the one site.
    let site_line = text
        .lines()
        .find(|line| line.contains(" objects ") && line.contains("allocate_for_trace_test+0x"))
        .unwrap_or_else(|| panic!("no call-site line:\n{text}"));
    let words: Vec<&str> = site_line.split_whitespace().collect();
    assert_eq!(
        words[0].parse::<usize>(),
        Ok(NR_ALLOCS - nr_freed),
        "{site_line}"
    );
    assert_eq!(
        words[2].parse::<usize>(),
        Ok((NR_ALLOCS - nr_freed) * OBJ_SIZE),
        "{site_line}"
    );

    // The record's first frame symbolizes to the same function.
    let mut first_frame = 0;
    cache
        .trace_table()
        .for_each(|record| first_frame = record.frames()[0]);
    let (name, offset) = magpie::debug::symbols::lookup(first_frame).expect("symbol");
    assert!(
        format!("{}", magpie::debug::symbols::demangled(name)).ends_with("allocate_for_trace_test")
    );
    assert!(offset > 0);

    for obj in live.into_iter().chain(untraced) {
        free(cache, obj);
    }
    assert_eq!(cache.trace_table().stats().nr_records, 0);
    let text = print_cache("trace-a");
    assert!(parse_blocks(&text).is_empty(), "{text}");
    assert!(text.contains("0 outstanding objects in trace-a"), "{text}");
    destroy(cache);
}

#[test_case]
fn objects_resting_in_magazines_are_not_records() {
    let cache = create("trace-mag");
    let mut objs = Vec::with_capacity(4);
    cache.trace_table().start().expect("trace_start");
    allocate_for_trace_test(cache, 4, &mut objs);
    for obj in objs.drain(..) {
        free(cache, obj);
    }
    let stats = cache.stats();
    assert!(
        stats.nr_cpu_cached_objs + stats.nr_depot_objs >= 4,
        "{stats:?}"
    );
    assert_eq!(
        cache.trace_table().stats().nr_records,
        0,
        "rounds in magazines are not outstanding"
    );
    // A magazine hit is a caller's allocation: it is recorded.
    let again = allocate_elsewhere_for_trace_test(cache);
    assert_eq!(recorded(cache), [again.as_ptr() as usize]);
    let text = print_cache("trace-mag");
    let blocks = parse_blocks(&text);
    assert_eq!(blocks.len(), 1, "{text}");
    assert!(
        blocks[0].frames[0].contains("allocate_elsewhere_for_trace_test+0x"),
        "{text}"
    );
    free(cache, again);
    destroy(cache);
}

#[test_case]
fn stop_keeps_records_until_their_objects_are_freed() {
    let cache = create("trace-stop");
    cache.trace_table().start().expect("trace_start");
    let mut traced = Vec::with_capacity(5);
    allocate_for_trace_test(cache, 5, &mut traced);
    cache.trace_table().stop();
    assert!(!cache.trace_table().is_on());
    let mut untraced = Vec::with_capacity(3);
    allocate_for_trace_test(cache, 3, &mut untraced);
    assert_eq!(
        cache.trace_table().stats().nr_records,
        5,
        "no records after stop"
    );
    assert!(!cache.trace_table().stats().tracing);

    // "Ever traced": frees after stop still remove records.
    free(cache, traced.remove(1));
    free(cache, traced.remove(2));
    assert_eq!(cache.trace_table().stats().nr_records, 3);
    assert_eq!(recorded(cache), addrs(&traced));
    for obj in untraced.drain(..) {
        free(cache, obj);
    }
    assert_eq!(
        recorded(cache),
        addrs(&traced),
        "untraced frees touch no record"
    );

    let text = print_cache("trace-stop");
    assert_eq!(
        sorted(parse_blocks(&text).iter().map(|b| b.addr).collect()),
        addrs(&traced)
    );
    assert!(
        text.contains("3 outstanding objects in trace-stop, 0 records dropped (tracing off)"),
        "{text}"
    );

    // Start again: recording resumes, the old records are kept.
    cache.trace_table().start().expect("trace_start again");
    allocate_for_trace_test(cache, 1, &mut traced);
    assert_eq!(recorded(cache), addrs(&traced));
    for obj in traced.drain(..) {
        free(cache, obj);
    }
    assert_eq!(cache.trace_table().stats().nr_records, 0);
    destroy(cache);
}

#[test_case]
fn reset_drops_all_records() {
    let cache = create("trace-reset");
    let mut shell = Shell::new();
    assert_eq!(
        run(&mut shell, "kmemtrace start trace-reset"),
        "tracing trace-reset\n"
    );
    assert!(cache.trace_table().is_on());
    let mut objs = Vec::with_capacity(7);
    allocate_for_trace_test(cache, 7, &mut objs);
    assert_eq!(cache.trace_table().stats().nr_records, 7);
    assert_eq!(
        run(&mut shell, "kmemtrace reset trace-reset"),
        "dropped 7 records from trace-reset\n"
    );
    assert_eq!(cache.trace_table().stats().nr_records, 0);
    assert!(cache.trace_table().is_on(), "reset leaves tracing on");
    let text = print_cache("trace-reset");
    assert!(parse_blocks(&text).is_empty(), "{text}");
    // The objects are still allocated and free normally.
    assert_eq!(cache.stats().nr_allocated, 7);
    let kept = objs.pop().unwrap();
    for obj in objs.drain(..) {
        free(cache, obj);
    }
    assert_eq!(cache.stats().nr_allocated, 1);
    // New allocations are recorded again.
    allocate_for_trace_test(cache, 2, &mut objs);
    assert_eq!(recorded(cache), addrs(&objs));
    assert_eq!(
        run(&mut shell, "kmemtrace stop trace-reset"),
        "stopped tracing trace-reset\n"
    );
    assert!(!cache.trace_table().is_on());
    for obj in objs.drain(..).chain([kept]) {
        free(cache, obj);
    }
    assert_eq!(cache.trace_table().stats().nr_records, 0);
    destroy(cache);
}

#[test_case]
fn notrace_caches_are_refused() {
    let mut shell = Shell::new();
    for name in [
        "kmem_trace",
        "kmem_magazine_1",
        "kmem_magazine_60",
        "kmem_cache",
        "kmem_slab",
        "kmem_bufctl",
    ] {
        let cache = SLAB.find_cache(name).unwrap_or_else(|| panic!("no {name}"));
        assert!(cache.flags().contains(CacheFlags::NOTRACE), "{name}");
        assert_eq!(
            cache.trace_table().start(),
            Err(TraceError::NoTrace),
            "{name}"
        );
        assert!(!cache.trace_table().is_on(), "{name}");
        let out = run(&mut shell, &format!("kmemtrace start {name}"));
        assert_eq!(out.lines().count(), 1, "{out}");
        assert!(
            out.starts_with(&format!("error: cannot trace {name}")),
            "{out}"
        );
        assert!(!cache.trace_table().is_on(), "{name}");
    }
    let own = SLAB
        .cache_create(
            "trace-notrace",
            32,
            &CacheArgs {
                flags: CacheFlags::NOTRACE,
                ..CacheArgs::DEFAULT
            },
        )
        .expect("cache_create");
    assert_eq!(own.trace_table().start(), Err(TraceError::NoTrace));
    let obj = own.alloc().expect("a NOTRACE cache still allocates");
    assert_eq!(own.trace_table().stats().nr_records, 0);
    free(own, obj);
    // SAFETY: our cache, unused from here on.
    unsafe { magpie::kmem::cache_destroy(own) }.expect("destroy");
}

#[test_case]
fn start_all_skips_notrace_caches() {
    let mut shell = Shell::new();
    let out = run(&mut shell, "kmemtrace start all");
    let mut nr_traceable = 0;
    SLAB.for_each_cache(|cache| {
        if cache.flags().contains(CacheFlags::NOTRACE) {
            assert!(!cache.trace_table().is_on(), "{} is NOTRACE", cache.name());
        } else {
            assert!(
                cache.trace_table().is_on(),
                "{} not started by 'all'",
                cache.name()
            );
            nr_traceable += 1;
        }
    });
    assert!(nr_traceable >= 13, "kmalloc caches at least");
    assert_eq!(
        out,
        format!("tracing {nr_traceable} caches (NOTRACE caches skipped)\n")
    );
    let out = run(&mut shell, "kmemtrace stop all");
    assert_eq!(out, "stopped tracing all\n");
    SLAB.for_each_cache(|cache| assert!(!cache.trace_table().is_on(), "{}", cache.name()));
    run(&mut shell, "kmemtrace reset all");
    SLAB.for_each_cache(|cache| {
        assert_eq!(
            cache.trace_table().stats().nr_records,
            0,
            "{}",
            cache.name()
        )
    });
}

#[test_case]
fn print_all_shows_only_caches_with_records() {
    let cache = create("trace-print-all");
    let mut shell = Shell::new();
    run(&mut shell, "kmemtrace start all");
    let mut objs = Vec::with_capacity(3);
    allocate_for_trace_test(cache, 3, &mut objs);
    // While every cache is traced, most hold nothing: they get one line
    // together, not an empty block each.
    let text = run(&mut shell, "kmemtrace print");
    run(&mut shell, "kmemtrace stop all");
    let ours = format!("Dumping outstanding allocs from {}\n", cache.name());
    assert!(text.contains(&ours), "{text}");
    for block in text.split("Dumping outstanding allocs from ").skip(1) {
        assert!(block.contains("\nObj 0x"), "an empty block: {block}");
    }
    let quiet = text
        .lines()
        .find_map(|line| line.strip_suffix(" more traced caches: no outstanding objects"))
        .unwrap_or_else(|| panic!("no line for the quiet caches: {text}"));
    assert!(quiet.parse::<usize>().unwrap() > 0, "{text}");
    let mine: Vec<usize> = parse_blocks(&text)
        .iter()
        .map(|block| block.addr)
        .filter(|addr| objs.iter().any(|obj| obj.as_ptr() as usize == *addr))
        .collect();
    assert_eq!(sorted(mine), addrs(&objs), "{text}");
    run(&mut shell, "kmemtrace reset all");
    for obj in objs {
        free(cache, obj);
    }
    destroy(cache);
}

#[test_case]
fn caches_trace_independently() {
    let a = create("trace-ind-a");
    let b = create("trace-ind-b");
    a.trace_table().start().expect("trace a");
    b.trace_table().start().expect("trace b");
    let (mut in_a, mut in_b) = (Vec::with_capacity(4), Vec::with_capacity(3));
    allocate_for_trace_test(a, 4, &mut in_a);
    allocate_for_trace_test(b, 3, &mut in_b);
    assert_eq!(recorded(a), addrs(&in_a));
    assert_eq!(recorded(b), addrs(&in_b));

    free(a, in_a.pop().unwrap());
    assert_eq!(recorded(b), addrs(&in_b), "a free to a touches b's records");
    a.trace_table().stop();
    assert!(b.trace_table().is_on(), "stopping a stops b");
    a.trace_table().reset();
    assert_eq!(a.trace_table().stats().nr_records, 0);
    assert_eq!(recorded(b), addrs(&in_b), "resetting a drops b's records");

    let text_b = print_cache("trace-ind-b");
    assert_eq!(
        sorted(parse_blocks(&text_b).iter().map(|b| b.addr).collect()),
        addrs(&in_b)
    );
    let text_a = print_cache("trace-ind-a");
    assert!(parse_blocks(&text_a).is_empty(), "{text_a}");

    for obj in in_a.drain(..) {
        free(a, obj);
    }
    for obj in in_b.drain(..) {
        free(b, obj);
    }
    assert_eq!(b.trace_table().stats().nr_records, 0);
    destroy(b);
    destroy(a);
}

#[test_case]
fn shell_kmalloc_traced_in_kmalloc_64() {
    // The shell's `kmalloc!` on the normal classes (random_kmalloc_caches=0).
    magpie::profiling::tagged::set_random_kmalloc_caches(false);
    // The output Strings themselves come from traced kmalloc caches while
    // printing: this would deadlock if print held the trace lock while
    // writing.
    let mut shell = Shell::new();
    let cache = SLAB.find_cache("kmalloc-64").expect("kmalloc-64");
    assert_eq!(
        run(&mut shell, "kmemtrace start kmalloc-64"),
        "tracing kmalloc-64\n"
    );
    let out = run(&mut shell, "kmalloc 64 5");
    let objs: Vec<usize> = out
        .lines()
        .map(|line| usize::from_str_radix(line.trim_start_matches("0x"), 16).expect(line))
        .collect();
    assert_eq!(objs.len(), 5, "{out}");
    let text = print_cache("kmalloc-64");
    let blocks = parse_blocks(&text);
    for &obj in &objs {
        let block = blocks
            .iter()
            .find(|block| block.addr == obj)
            .unwrap_or_else(|| panic!("{obj:#x} missing from\n{text}"));
        assert!(
            block.header.contains("from cpu0 shell kmalloc:"),
            "{}",
            block.header
        );
        assert!(block.frames[0].contains("cmd_kmalloc+0x"), "{text}");
    }
    let summary = format!("{} outstanding objects in kmalloc-64", blocks.len());
    assert!(text.contains(&summary), "{text}");

    run(&mut shell, "kfree all");
    let mut still = Vec::with_capacity(cache.trace_table().stats().nr_records + 8);
    cache.trace_table().for_each(|record| {
        if still.len() < still.capacity() {
            still.push(record.addr)
        }
    });
    for obj in &objs {
        assert!(!still.contains(obj), "{obj:#x} still recorded after kfree");
    }
    assert_eq!(
        run(&mut shell, "kmemtrace stop kmalloc-64"),
        "stopped tracing kmalloc-64\n"
    );
    run(&mut shell, "kmemtrace reset kmalloc-64");
    assert_eq!(cache.trace_table().stats().nr_records, 0);
}
