//! The shell driven through `Shell::execute` (and `LineEditor`) in the real
//! kernel: `help`, `kmemstat` (Akaros layout), `slabinfo` (Linux 2.1),
//! `kmalloc`/`kfree`/`leak`, one-line `error:` messages (strict numbers,
//! extra arguments, bytes the shell does not take), and no leaks.

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

use magpie::kmem::{KPAGES, KernelPlatform, SLAB};
use magpie::shell::{Edit, LineEditor, MAX_LINE, Message, Shell};
use magpie_slab::{CacheStats, KmemCache, PAGE_SIZE};

type Cache = KmemCache<KernelPlatform>;

magpie::test_kernel!();

// ---------------------------------------------------------------------------
// Helpers

fn run(shell: &mut Shell, line: &str) -> String {
    let mut out = String::new();
    shell.execute(line, &mut out);
    out
}

/// Runs `line` into a buffer allocated beforehand, so that the command's
/// output does not allocate (or free) while it runs.
fn run_quiet(shell: &mut Shell, line: &str, out: &mut String) {
    out.clear();
    assert!(out.capacity() >= 32 * 1024);
    shell.execute(line, out);
    assert!(out.capacity() >= out.len());
}

fn buffer() -> String {
    String::with_capacity(32 * 1024)
}

fn cache(name: &str) -> &'static Cache {
    SLAB.find_cache(name)
        .unwrap_or_else(|| panic!("no cache named {name}"))
}

/// The shell's `kmalloc` and `leak` allocate from the normal
/// `kmalloc-<size>` classes from now on (`random_kmalloc_caches=0`), for
/// the tests that name those caches; `kmalloc_and_kfree_balance` finds
/// the random copies by their objects.
fn normal_kmalloc_classes() {
    magpie::profiling::tagged::set_random_kmalloc_caches(false);
}

/// The cache `obj` (a live object) belongs to.
fn cache_of(obj: usize) -> &'static Cache {
    SLAB.debug()
        .whatis(obj)
        .unwrap_or_else(|| panic!("{obj:#x} is not a slab object"))
        .cache
}

/// Addresses printed one per line by `kmalloc`/`kfree`/`leak`.
fn addresses(out: &str) -> Vec<usize> {
    out.lines()
        .map(|line| {
            assert_eq!(line.len(), 18, "address line {line:?}");
            usize::from_str_radix(line.strip_prefix("0x").expect(line), 16).expect(line)
        })
        .collect()
}

/// nr_allocated of every kmalloc cache holding objects (the normal
/// classes and the random copies `kmalloc!` sites use, which are created
/// on first use), gathered without allocating.
fn kmalloc_counts(out: &mut Vec<(&'static str, usize)>) {
    out.clear();
    SLAB.for_each_cache(|cache| {
        if cache.name().starts_with("kmalloc-")
            && cache.stats().nr_allocated > 0
            && out.len() < out.capacity()
        {
            out.push((cache.name(), cache.stats().nr_allocated));
        }
    });
}

fn assert_one_error_line(out: &str, contains: &str) {
    assert!(out.starts_with("error: "), "{out:?}");
    assert!(out.ends_with('\n'), "{out:?}");
    assert_eq!(out.lines().count(), 1, "{out:?}");
    assert!(
        out.contains(contains),
        "{out:?} should mention {contains:?}"
    );
}

// ---------------------------------------------------------------------------
// help

#[test_case]
fn help_lists_every_command() {
    let mut shell = Shell::new();
    let out = run(&mut shell, "help");
    assert!(out.starts_with("commands:\n"), "{out}");
    for command in [
        "help",
        "kmemstat",
        "slabinfo",
        "kmemtrace",
        "kmalloc",
        "kfree",
        "leak",
        "poweroff",
    ] {
        assert!(
            out.lines()
                .any(|line| line.split_whitespace().next() == Some(command)),
            "help does not list {command}:\n{out}"
        );
    }
    assert_eq!(
        run(&mut shell, "  help  "),
        out,
        "surrounding blanks are ignored"
    );
    assert_eq!(run(&mut shell, ""), "", "an empty line prints nothing");
    assert_eq!(run(&mut shell, "   "), "");
}

// ---------------------------------------------------------------------------
// kmemstat

const KMEMSTAT_HEADER: &str = "Arena/Slab Name               :Typ: Objsize:      Total Amt:      Alloc Amt: Allocs Ever:       Waste";

struct KmemstatRow<'a> {
    indent: usize,
    name: &'a str,
    kind: &'a str,
    objsize: usize,
    total: usize,
    alloc: usize,
    nr_allocs_ever: u64,
    waste: usize,
}

fn parse_kmemstat_row(line: &str) -> KmemstatRow<'_> {
    assert_eq!(line.len(), KMEMSTAT_HEADER.len(), "row width: {line:?}");
    let fields: Vec<&str> = line.split(':').collect();
    assert_eq!(fields.len(), 7, "{line:?}");
    let widths: Vec<usize> = fields.iter().map(|f| f.len()).collect();
    assert_eq!(widths, [30, 3, 8, 15, 15, 12, 12], "{line:?}");
    let indent = fields[0].len() - fields[0].trim_start().len();
    assert_eq!(indent % 4, 0, "{line:?}");
    let number = |text: &str| {
        text.trim()
            .parse::<usize>()
            .unwrap_or_else(|_| panic!("{line:?}"))
    };
    KmemstatRow {
        indent: indent / 4,
        name: fields[0].trim(),
        kind: fields[1].trim(),
        objsize: number(fields[2]),
        total: number(fields[3]),
        alloc: number(fields[4]),
        nr_allocs_ever: number(fields[5]) as u64,
        waste: number(fields[6]),
    }
}

#[test_case]
fn reap_returns_pages_and_refuses_bad_input() {
    normal_kmalloc_classes();
    let mut shell = Shell::new();
    let mut out = buffer();
    // Objects freed by the shell rest in kmalloc-4096's magazines.
    run_quiet(&mut shell, "kmalloc 4096 64", &mut out);
    run_quiet(&mut shell, "kfree all", &mut out);
    let k4096 = cache("kmalloc-4096");
    assert!(k4096.stats().nr_cpu_cached_objs + k4096.stats().nr_depot_objs > 0);
    out.clear();
    run_quiet(&mut shell, "reap kmalloc-4096", &mut out);
    let words: Vec<&str> = out.split_whitespace().collect();
    assert_eq!(&words[..2], &["reap", "kmalloc-4096:"], "{out}");
    let nr_pages: usize = words[2].parse().expect("pages");
    assert!(nr_pages > 0, "{out}");
    let stats = k4096.stats();
    assert_eq!(stats.nr_depot_objs, 0);
    out.clear();
    run_quiet(&mut shell, "reap", &mut out);
    assert!(out.starts_with("reap all caches: "), "{out}");
    for (line, error) in [
        ("reap nosuch", "error: no cache named 'nosuch'"),
        ("reap a b", "error: unexpected 'b'; usage: reap [CACHE|all]"),
    ] {
        out.clear();
        run_quiet(&mut shell, line, &mut out);
        assert!(out.starts_with(error), "{line}: {out}");
    }
}

#[test_case]
fn kmemstat_has_the_akaros_layout() {
    normal_kmalloc_classes();
    let mut shell = Shell::new();
    let mut out = buffer();
    run_quiet(&mut shell, "kmemstat", &mut out);
    // Read right after, before anything allocates from kmalloc-64.
    let k64 = cache("kmalloc-64").stats();
    let kpages_out = KPAGES.nr_pages_out();

    let mut lines = out.lines();
    assert_eq!(lines.next(), Some(KMEMSTAT_HEADER), "{out}");
    let rule = lines.next().unwrap();
    assert_eq!(rule.len(), KMEMSTAT_HEADER.len());
    assert!(rule.bytes().all(|b| b == b'-'), "{rule:?}");
    let rows: Vec<KmemstatRow<'_>> = lines.map(parse_kmemstat_row).collect();

    let base = &rows[0];
    assert_eq!(
        (base.indent, base.name, base.kind, base.objsize),
        (0, "base", "A", PAGE_SIZE)
    );
    assert!(base.alloc <= base.total && base.total > 0);
    let kpages = &rows[1];
    assert_eq!(
        (kpages.indent, kpages.name, kpages.kind),
        (1, "kpages", "A")
    );
    assert_eq!(kpages.total, kpages_out * PAGE_SIZE);
    assert!(kpages.total <= base.alloc, "kpages imports from base");

    // Every cache, indented under kpages, in list order.
    let mut names = Vec::with_capacity(256);
    SLAB.for_each_cache(|cache| names.push(cache.name()));
    let slab_rows: Vec<&KmemstatRow<'_>> = rows.iter().filter(|row| row.kind == "S").collect();
    assert_eq!(
        slab_rows.iter().map(|row| row.name).collect::<Vec<_>>(),
        names
    );
    for row in &slab_rows {
        assert_eq!(row.indent, 2, "{}", row.name);
        assert!(
            row.alloc <= row.total,
            "{}: alloc {} > total {}",
            row.name,
            row.alloc,
            row.total
        );
        assert_eq!(row.total % row.objsize, 0, "{}", row.name);
    }
    let row = slab_rows
        .iter()
        .find(|row| row.name == "kmalloc-64")
        .unwrap();
    assert_eq!(row.objsize, 64);
    assert_eq!(row.total, k64.obj_size * k64.nr_total_objs);
    assert_eq!(
        row.alloc,
        k64.obj_size * (k64.nr_allocated + k64.nr_cpu_cached_objs + k64.nr_depot_objs),
        "Alloc Amt: objects out of the slabs"
    );
    assert_eq!(row.nr_allocs_ever, k64.nr_allocs_ever);
    assert_eq!(
        row.waste, k64.waste_bytes,
        "Waste: slab bytes holding no object"
    );
    assert!(row.waste <= row.total / 8 + PAGE_SIZE, "{}", row.waste);

    // The allocator's own memory, in pages (Objsize the page size), at
    // most 2 % of the memory it manages.
    let meta = rows
        .iter()
        .find(|row| row.name == "slab-metadata")
        .expect("slab-metadata row");
    assert_eq!((meta.indent, meta.kind), (2, "M"));
    assert_eq!(meta.objsize, PAGE_SIZE);
    let managed = SLAB.stats().metadata().managed_bytes;
    assert!(
        meta.total > 0 && meta.total * 10_000 / managed <= 200,
        "metadata {} of {managed} bytes",
        meta.total
    );

    let large = rows
        .iter()
        .find(|row| row.name == "kmalloc-large")
        .expect("kmalloc-large row");
    assert_eq!((large.indent, large.kind), (2, "P"));
    let heap = rows.last().unwrap();
    assert_eq!(
        (heap.indent, heap.name, heap.kind),
        (0, "bootstrap-heap", "A")
    );
    assert_eq!(heap.total, magpie::kmem::heap::BOOTSTRAP_HEAP_SIZE);
}

// ---------------------------------------------------------------------------
// slabinfo

const SLABINFO_HEADER: &str = "# name            <active_objs> <num_objs> <objsize> <objperslab> <pagesperslab> : tunables <limit> <batchcount> <sharedfactor> : slabdata <active_slabs> <num_slabs> <sharedavail>";

/// A slabinfo row as numbers: active, num, objsize, objperslab,
/// pagesperslab, limit, batchcount, sharedfactor, active_slabs,
/// num_slabs, sharedavail.
fn slabinfo_row(out: &str, name: &str) -> [usize; 11] {
    let line = out
        .lines()
        .find(|line| line.split_whitespace().next() == Some(name))
        .unwrap_or_else(|| panic!("no {name} row in\n{out}"));
    assert!(line.starts_with(&format!("{name:<17} ")), "{line:?}");
    let words: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(words.len(), 16, "{line:?}");
    assert_eq!(
        (words[6], words[7], words[11], words[12]),
        (":", "tunables", ":", "slabdata"),
        "{line:?}"
    );
    let mut numbers = [0; 11];
    for (slot, word) in numbers.iter_mut().zip(
        words[1..6]
            .iter()
            .chain(&words[8..11])
            .chain(&words[13..16]),
    ) {
        *slot = word.parse().unwrap_or_else(|_| panic!("{line:?}"));
    }
    numbers
}

fn assert_row_matches(row: [usize; 11], stats: &CacheStats) {
    let active = stats.nr_allocated + stats.nr_cpu_cached_objs + stats.nr_depot_objs;
    assert_eq!(row[0], active, "active_objs {row:?} {stats:?}");
    assert_eq!(row[1], stats.nr_total_objs, "num_objs {row:?} {stats:?}");
    assert_eq!(row[2], stats.obj_size);
    assert_eq!(row[3], stats.objs_per_slab);
    assert_eq!(row[4], stats.nr_pages_per_slab);
    assert_eq!(row[5], stats.magsize, "limit is the magazine size");
    assert_eq!(row[8], stats.nr_active_slabs);
    assert_eq!(row[9], stats.nr_slabs);
    assert_eq!(
        row[10], stats.nr_depot_objs,
        "sharedavail: rounds in the depot"
    );
    assert!(row[0] <= row[1], "more active objects than objects {row:?}");
    assert!(row[8] <= row[9]);
}

#[test_case]
fn slabinfo_rows_follow_kmalloc() {
    normal_kmalloc_classes();
    let mut shell = Shell::new();
    let (mut before, mut middle, mut after) = (buffer(), buffer(), buffer());
    let k64 = cache("kmalloc-64");
    // Empty the magazines so that the shell's objects must come from slabs.
    k64.reap();
    let start = k64.stats();
    run_quiet(&mut shell, "slabinfo", &mut before);
    let stats_before = k64.stats();
    run_quiet(&mut shell, "kmalloc 64 5", &mut middle);
    run_quiet(&mut shell, "slabinfo", &mut after);
    let stats_after = k64.stats();

    let mut lines = before.lines();
    assert_eq!(lines.next(), Some("slabinfo - version: 2.1"));
    assert_eq!(lines.next(), Some(SLABINFO_HEADER));
    let mut nr_caches = 0;
    SLAB.for_each_cache(|_| nr_caches += 1);
    assert_eq!(
        before.lines().count(),
        2 + nr_caches,
        "one row per cache:\n{before}"
    );

    let row_before = slabinfo_row(&before, "kmalloc-64");
    let row_after = slabinfo_row(&after, "kmalloc-64");
    assert_row_matches(row_before, &stats_before);
    assert_row_matches(row_after, &stats_after);
    assert_eq!(row_before[2], 64);
    let objs = addresses(&middle);
    assert_eq!(objs.len(), 5, "{middle}");
    assert!(
        row_after[0] >= row_before[0] + 5,
        "active_objs after kmalloc 64 5: {} -> {}",
        row_before[0],
        row_after[0]
    );
    assert_eq!(stats_after.nr_allocated, stats_before.nr_allocated + 5);
    for &obj in &objs {
        assert_eq!(obj % 64, 0, "kmalloc-64 objects are 64-aligned: {obj:#x}");
    }
    assert_eq!(shell.nr_held(), 5);

    run_quiet(&mut shell, "kfree all", &mut middle);
    let mut freed = addresses(&middle);
    freed.reverse();
    assert_eq!(freed, objs, "kfree frees the most recent first");
    assert_eq!(shell.nr_held(), 0);
    // The address lists above are kmalloc objects too.
    drop((freed, objs));
    assert_eq!(
        k64.stats().nr_allocated,
        start.nr_allocated,
        "kfree all leaks nothing"
    );
}

// ---------------------------------------------------------------------------
// kmalloc / kfree / leak

#[test_case]
fn kmalloc_and_kfree_balance() {
    let mut shell = Shell::new();
    let mut out = buffer();
    let mut before = Vec::with_capacity(1024);
    let mut after = Vec::with_capacity(1024);
    let large = SLAB.stats().large();
    kmalloc_counts(&mut before);

    run_quiet(&mut shell, "kmalloc 32 4", &mut out);
    let small = addresses(&out);
    run_quiet(&mut shell, "kmalloc 0x100", &mut out);
    let hex = addresses(&out);
    run_quiet(&mut shell, "kmalloc 20000 2", &mut out);
    let big = addresses(&out);
    assert_eq!((small.len(), hex.len(), big.len()), (4, 1, 2));
    assert_eq!(shell.nr_held(), 7);
    assert_eq!(
        SLAB.stats().large().nr_live,
        large.nr_live + 2,
        "20000 bytes are page-granular"
    );
    for &obj in &big {
        assert_eq!(obj % PAGE_SIZE, 0);
    }
    // `kmalloc!` sites allocate from their random copy of the class
    // (`kmalloc-rnd-NN-32`): found by the objects.
    let (c32, c256) = (cache_of(small[0]), cache_of(hex[0]));
    assert!(c32.name().ends_with("-32") && c256.name().ends_with("-256"));
    let k32 = c32.stats().nr_allocated;
    let k256 = c256.stats().nr_allocated;

    run_quiet(&mut shell, "kfree 2", &mut out);
    assert_eq!(addresses(&out), [big[1], big[0]]);
    assert_eq!(SLAB.stats().large().nr_live, large.nr_live);
    run_quiet(&mut shell, "kfree", &mut out);
    assert_eq!(addresses(&out), hex);
    assert_eq!(c256.stats().nr_allocated, k256 - 1);
    assert_eq!(shell.nr_held(), 4);
    run_quiet(&mut shell, "kfree all", &mut out);
    assert_eq!(out.lines().count(), 4);
    assert_eq!(c32.stats().nr_allocated, k32 - 4);
    assert_eq!(shell.nr_held(), 0);
    run_quiet(&mut shell, "kfree all", &mut out);
    assert_eq!(out, "", "kfree all with nothing held");

    // The shell's own list of held objects and the address lists are
    // kmalloc objects too.
    drop((shell, small, hex, big));
    kmalloc_counts(&mut after);
    assert_eq!(after, before, "kmalloc caches back where they started");
    assert_eq!(SLAB.stats().large().nr_live, large.nr_live);
}

#[test_case]
fn leak_allocates_without_holding() {
    normal_kmalloc_classes();
    let mut shell = Shell::new();
    let mut out = buffer();
    let k16 = cache("kmalloc-16");
    let before = k16.stats().nr_allocated;
    run_quiet(&mut shell, "leak 12 3", &mut out);
    let leaked = addresses(&out);
    assert_eq!(leaked.len(), 3);
    assert_eq!(shell.nr_held(), 0, "leaked objects are not held");
    assert_eq!(k16.stats().nr_allocated, before + 3);
    // Give them back so the rest of the kernel sees no leak.
    for addr in leaked {
        // SAFETY: the leaked objects are ours and unused.
        unsafe { SLAB.kfree(core::ptr::NonNull::new(addr as *mut u8).unwrap()) }.expect("kfree");
    }
    assert_eq!(k16.stats().nr_allocated, before);
}

// ---------------------------------------------------------------------------
// Errors

/// What `allocinfo` says to bad arguments (that it is compiled out, with
/// `--no-default-features`).
const ALLOCINFO_USAGE: &str = if magpie::profiling::COMPILED_IN {
    "usage: allocinfo"
} else {
    "compiled out"
};
const ALLOCINFO_NOT_A_NUMBER: &str = if magpie::profiling::COMPILED_IN {
    "'-1' is not a number"
} else {
    "compiled out"
};

#[test_case]
fn errors_are_one_line_and_change_nothing() {
    let mut shell = Shell::new();
    let mut held = buffer();
    run_quiet(&mut shell, "kmalloc 64 2", &mut held);
    assert_eq!(shell.nr_held(), 2);

    let cases: [(&str, &str); 42] = [
        ("frobnicate", "unknown command 'frobnicate'"),
        ("KMEMSTAT", "unknown command"),
        (
            "kmemtrace print no-such-cache",
            "no cache named 'no-such-cache'",
        ),
        ("kmemtrace start kmalloc-65", "no cache named 'kmalloc-65'"),
        ("kmemtrace", "usage: kmemtrace"),
        ("kmemtrace frob kmalloc-64", "usage: kmemtrace"),
        ("kmemtrace print kmalloc-64 extra", "usage: kmemtrace"),
        ("kmalloc abc", "'abc' is not a number"),
        ("kmalloc 64 -1", "'-1' is not a number"),
        ("kmalloc 0x", "not a number"),
        ("kmalloc 0", "size 0 out of range"),
        ("kmalloc 67108865", "out of range"),
        ("kmalloc 64 0", "count 0 out of range"),
        ("kmalloc 64 100001", "count 100001 out of range"),
        ("kmalloc", "usage: kmalloc"),
        ("kfree 3", "cannot free 3: the shell holds 2 object(s)"),
        ("kfree two", "'two' is not a number"),
        ("help me", "usage: help"),
        // Numbers are [0-9]+ or 0x[0-9a-f]+, nothing else.
        ("kmalloc +64", "'+64' is not a number"),
        ("kmalloc 0X40", "'0X40' is not a number"),
        ("kmalloc 0x4G", "'0x4G' is not a number"),
        ("kmalloc 6_4", "'6_4' is not a number"),
        ("kmalloc 99999999999999999999999", "is too large"),
        ("kmalloc 0x10000000000000000", "is too large"),
        // Extra arguments are refused with the usage line.
        ("poweroff now please", "usage: poweroff"),
        ("kmemstat x", "usage: kmemstat"),
        ("slabinfo x", "usage: slabinfo"),
        ("cpus 1", "usage: cpus"),
        ("timestats reset now", "usage: timestats"),
        ("kmalloc 64 2 3", "usage: kmalloc"),
        ("leak 64 2 3", "usage: leak"),
        ("kfree 1 2", "usage: kfree"),
        ("allocinfo --top", ALLOCINFO_USAGE),
        ("allocinfo --top -1", ALLOCINFO_NOT_A_NUMBER),
        ("stress --ops", "--ops needs a value; usage: stress"),
        ("stress --frob 1", "unknown option '--frob'"),
        ("stress --cpus 0", "--cpus 0: give 1 to"),
        ("stress --sizes 5-x", "'5-x' is not a size range A-B"),
        ("kfree 0", "kfree 0 frees nothing"),
        // Bytes the shell does not take name the byte and its column.
        ("kfree 1\u{0}0", "byte 0x00 at column 8"),
        ("kmalloc 6\u{e9}4 3", "byte 0xc3 at column 10"),
        ("\u{e9}\u{e9}", "byte 0xc3 at column 1"),
    ];
    let mut out = buffer();
    let mut before = Vec::with_capacity(64);
    let mut after = Vec::with_capacity(64);
    let large = SLAB.stats().large();
    for (line, message) in cases {
        kmalloc_counts(&mut before);
        run_quiet(&mut shell, line, &mut out);
        kmalloc_counts(&mut after);
        assert_one_error_line(&out, message);
        assert_eq!(shell.nr_held(), 2, "{line:?} changed what the shell holds");
        assert_eq!(after, before, "{line:?} changed the kmalloc caches");
        assert_eq!(SLAB.stats().large(), large, "{line:?}");
    }
    SLAB.for_each_cache(|cache| {
        assert!(
            !cache.trace_table().is_on(),
            "{} left tracing",
            cache.name()
        )
    });

    // A tab separates words like a space.
    run_quiet(&mut shell, "kmalloc 64\t2", &mut out);
    assert_eq!(addresses(&out).len(), 2, "{out}");
    assert_eq!(shell.nr_held(), 4);

    run_quiet(&mut shell, "kfree all", &mut out);
    assert_eq!(shell.nr_held(), 0);
    run_quiet(&mut shell, "kfree", &mut out);
    assert_one_error_line(&out, "cannot free 1: the shell holds 0 object(s)");
}

// ---------------------------------------------------------------------------
// The line editor

fn feed(editor: &mut LineEditor, bytes: &[u8], echo: &mut Vec<u8>) -> Vec<Option<String>> {
    let mut lines = Vec::new();
    for &byte in bytes {
        match editor.feed(byte, &mut |bytes| echo.extend_from_slice(bytes)) {
            Edit::Pending => {}
            Edit::Line(line) => lines.push(Some(String::from(line))),
            Edit::TooLong => lines.push(None),
            Edit::Cancelled => lines.push(Some(String::from("^C"))),
            Edit::Invalid { byte, column } => {
                lines.push(Some(format!("\u{0}invalid {byte:#04x} {column}")))
            }
        }
    }
    lines
}

#[test_case]
fn line_editor_handles_crlf_backspace_and_overlong_lines() {
    let mut editor = LineEditor::new();
    let mut echo = Vec::new();
    let lines = feed(&mut editor, b"helq\x7fp\r\nslabinfo\n\r", &mut echo);
    assert_eq!(
        lines,
        [
            Some(String::from("help")),
            Some(String::from("slabinfo")),
            Some(String::new())
        ],
        "CR LF is one line end; a lone CR or LF each end a line"
    );
    assert_eq!(echo, b"helq\x08 \x08p\nslabinfo\n\n");

    echo.clear();
    let lines = feed(&mut editor, b"\x7fkmalloc\t64\r", &mut echo);
    assert_eq!(
        lines,
        [Some(String::from("kmalloc\t64"))],
        "a tab is kept (a separator)"
    );
    assert_eq!(
        echo, b"kmalloc 64\n",
        "backspace at the start echoes nothing; a tab echoes a space"
    );

    echo.clear();
    let lines = feed(&mut editor, b"k\x1b[Zm\x00\r", &mut echo);
    assert_eq!(
        lines,
        [Some(String::from("\u{0}invalid 0x1b 2"))],
        "a control byte (or an escape sequence the editor does not use) makes the line an error naming the first one and its column"
    );
    assert_eq!(echo, b"k?[Zm?\n", "bytes refused are echoed as '?'");
    let lines = feed(&mut editor, "6\u{e9}4\r".as_bytes(), &mut echo);
    assert_eq!(lines, [Some(String::from("\u{0}invalid 0xc3 2"))]);
    let lines = feed(&mut editor, b"x\xff\x7f\x7fhelp\r", &mut echo);
    assert_eq!(
        lines,
        [Some(String::from("help"))],
        "a refused byte removed with backspace leaves the line good"
    );

    let mut long = Vec::new();
    long.resize(MAX_LINE, b'x');
    let lines = feed(&mut editor, &long, &mut echo);
    assert!(lines.is_empty());
    let lines = feed(&mut editor, b"\r", &mut echo);
    assert_eq!(
        lines,
        [Some(String::from_utf8(long.clone()).unwrap())],
        "exactly MAX_LINE fits"
    );
    long.push(b'y');
    let lines = feed(&mut editor, &long, &mut echo);
    assert!(lines.is_empty());
    let lines = feed(&mut editor, b"\x7f\x7fhelp\r", &mut echo);
    assert_eq!(
        lines,
        [None],
        "an overlong line is dropped whole, backspaces included"
    );
    let lines = feed(&mut editor, b"help\r", &mut echo);
    assert_eq!(lines, [Some(String::from("help"))], "the next line is fine");
}

#[test_case]
fn line_editor_history_cursor_keys_and_ctrl_c() {
    let mut editor = LineEditor::new();
    let mut echo = Vec::new();
    let lines = feed(&mut editor, b"kmalloc 64 2\rhelp\r\r", &mut echo);
    assert_eq!(lines.len(), 3);
    echo.clear();
    // Up twice: the line before last; Down once: the last; Enter runs it.
    let lines = feed(&mut editor, b"\x1b[A\x1b[A\x1b[B\r", &mut echo);
    assert_eq!(
        lines,
        [Some(String::from("help"))],
        "blank lines are not kept"
    );
    assert_eq!(
        echo, b"help\x1b[K\x1b[4Dkmalloc 64 2\x1b[K\x1b[12Dhelp\x1b[K\n",
        "each recall redraws the line in place, without a new prompt"
    );
    // Up past the oldest stays there; Down past the newest gives back the
    // line being typed.
    let lines = feed(
        &mut editor,
        b"slab\x1b[A\x1b[A\x1b[A\x1b[A\x1b[B\x1b[Binfo\r",
        &mut echo,
    );
    assert_eq!(lines, [Some(String::from("slabinfo"))]);
    // The same line twice is kept once: Up, Up gives the line before it.
    let lines = feed(&mut editor, b"slabinfo\r\x1b[A\x1b[A\r", &mut echo);
    assert_eq!(
        lines,
        [Some(String::from("slabinfo")), Some(String::from("help"))]
    );
    // Left, insert; Home, Delete; End; ESC O D (application mode) too.
    let lines = feed(
        &mut editor,
        b"kfre 1\x1b[D\x1b[D\x1b[De\x1b[Hx\x1b[D\x1b[3~\x1b[F\x1bOD\x7f\r",
        &mut echo,
    );
    assert_eq!(lines, [Some(String::from("kfree1"))]);
    // Ctrl-U drops what is before the cursor; Ctrl-C the whole line.
    echo.clear();
    let lines = feed(&mut editor, b"junk\x15help\r", &mut echo);
    assert_eq!(lines, [Some(String::from("help"))]);
    echo.clear();
    let mut cancelled = 0;
    for &byte in b"kmalloc 64 9\x03" {
        if editor.feed(byte, &mut |bytes| echo.extend_from_slice(bytes)) == Edit::Cancelled {
            cancelled += 1;
        }
    }
    assert_eq!(cancelled, 1);
    assert_eq!(echo, b"kmalloc 64 9^C\n");
    let lines = feed(&mut editor, b"\x1b[A\r", &mut echo);
    assert_eq!(
        lines,
        [Some(String::from("help"))],
        "a cancelled line is not kept"
    );
}

#[test_case]
fn messages_keep_their_text_and_mark_a_cut() {
    let text = "x".repeat(250);
    let message = Message::new(format_args!("{text}; and the remedy"));
    assert_eq!(message.as_str(), format!("{text}; and the remedy"));
    assert!(!message.is_cut());
    // Longer than the buffer: cut at a character boundary, with "...".
    let long = "\u{e9}".repeat(Message::CAPACITY);
    let message = Message::new(format_args!("a{long}"));
    assert!(message.is_cut());
    assert!(
        message.as_str().ends_with("\u{e9}..."),
        "{}",
        message.as_str()
    );
    assert!(message.as_str().len() <= Message::CAPACITY);
    assert!(message.as_str().len() >= Message::CAPACITY - 4);
}

#[test_case]
fn line_editor_completes_commands_and_cache_names_on_tab() {
    fn names(index: usize, word: &str, each: &mut dyn FnMut(&str)) {
        let _ = word;
        let words: &[&str] = if index == 0 {
            &["kmalloc", "kmemstat", "kmemtrace", "help"]
        } else {
            &["kmalloc-64", "kmalloc-640", "kmalloc-4096"]
        };
        for name in words {
            each(name);
        }
    }
    let mut editor = LineEditor::with_completer(names);
    let mut echo = Vec::new();
    // One candidate: the whole name and a space.
    let lines = feed(&mut editor, b"he\tkmalloc-40\t\r", &mut echo);
    assert_eq!(lines, [Some(String::from("help kmalloc-4096 "))]);
    assert_eq!(echo, b"help kmalloc-4096 \n");
    // Several: their common prefix; nothing to add: a separator, as before.
    echo.clear();
    let lines = feed(&mut editor, b"kme\t\tx\r", &mut echo);
    assert_eq!(lines, [Some(String::from("kmem\tx"))]);
    let lines = feed(&mut editor, b"kmalloc\t64\r", &mut echo);
    assert_eq!(
        lines,
        [Some(String::from("kmalloc 64"))],
        "a whole name completes to itself and a space: the same line"
    );
    let lines = feed(&mut editor, b"kmalloc 64\t2\r", &mut echo);
    assert_eq!(
        lines,
        [Some(String::from("kmalloc 64\t2"))],
        "no candidate: a separator"
    );
    let lines = feed(&mut editor, b"\tkmalloc-64\t\r", &mut echo);
    assert_eq!(
        lines,
        [Some(String::from("\tkmalloc-64\t"))],
        "kmalloc-64 and kmalloc-640: nothing to add"
    );
}

// ---------------------------------------------------------------------------
// slabtop

#[test_case]
fn slabtop_once_shows_every_cache_with_its_magazine_counts() {
    normal_kmalloc_classes();
    let mut shell = Shell::new();
    let before = cache("kmalloc-64").stats().nr_allocs_ever;
    let held = run(&mut shell, "kmalloc 64 20");
    assert_eq!(addresses(&held).len(), 20);
    let out = run(&mut shell, "slabtop --once --sort n");
    assert!(
        out.starts_with(" Active / Total Objects (% used)    : "),
        "{out}"
    );
    assert!(
        out.contains("\n Magazines since boot               : "),
        "{out}"
    );
    let row = out
        .lines()
        .find(|line| line.split_whitespace().nth(7) == Some("kmalloc-64"))
        .unwrap_or_else(|| panic!("no kmalloc-64 row in {out}"));
    let fields: Vec<&str> = row.split_whitespace().collect();
    let stats = cache("kmalloc-64").stats();
    assert_eq!(fields[0], format!("{}", stats.nr_total_objs));
    assert_eq!(fields[8], format!("{}", stats.magsize));
    let hits: u64 = fields[9].parse().unwrap();
    let misses: u64 = fields[10].parse().unwrap();
    assert!(hits + misses >= before + 20, "{row}");
    // Every cache has its row, in name order.
    let mut nr_caches = 0;
    SLAB.for_each_cache(|_| nr_caches += 1);
    let names: Vec<&str> = out
        .lines()
        .skip(8)
        .take_while(|line| !line.starts_with('('))
        .filter_map(|line| line.split_whitespace().nth(7))
        .collect();
    assert_eq!(names.len(), nr_caches, "--once shows every cache");
    assert!(names.windows(2).all(|pair| pair[0] <= pair[1]), "{names:?}");
    assert_one_error_line(
        &run(&mut shell, "slabtop --delay 0"),
        "delay 0 ms out of range",
    );
    assert_one_error_line(&run(&mut shell, "slabtop --sort"), "--sort needs a value");
    run(&mut shell, "kfree all");
}

// ---------------------------------------------------------------------------
// kmem cache CACHE ...

#[test_case]
fn kmem_cache_shows_validates_and_shrinks_one_cache() {
    normal_kmalloc_classes();
    let mut shell = Shell::new();
    run(&mut shell, "kmalloc 200 30");
    let out = run(&mut shell, "kmem cache kmalloc-208");
    let stats = cache("kmalloc-208").stats();
    let mut lines = out.lines();
    let first = lines.next().unwrap();
    assert!(
        first.starts_with(&format!(
            "kmalloc-208: 208-byte objects (stride {}, align {}), ",
            cache("kmalloc-208").stride(),
            stats.align
        )),
        "{out}"
    );
    assert!(
        lines
            .next()
            .unwrap()
            .starts_with(&format!("slabs {} (", stats.nr_slabs))
    );
    let magazines = lines.next().unwrap();
    assert!(
        magazines.starts_with(&format!("magazines: {} rounds each; depot ", stats.magsize)),
        "{out}"
    );
    assert!(magazines.contains("; depot lock contended "), "{out}");
    assert!(lines.next().unwrap().ends_with("; debug flags -"), "{out}");
    let validated = run(&mut shell, "kmem cache kmalloc-208 validate");
    assert!(
        validated.starts_with("verified 1 cache(s), ") && validated.ends_with(": 0 problem(s)\n"),
        "{validated}"
    );
    run(&mut shell, "kfree all");
    let shrunk = run(&mut shell, "kmem cache kmalloc-208 shrink");
    assert!(shrunk.starts_with("shrink kmalloc-208: "), "{shrunk}");
    assert_eq!(cache("kmalloc-208").stats().nr_slabs, 0, "{shrunk}");
    assert_eq!(
        run(&mut shell, "kmem cache kmalloc-208 debug"),
        "kmalloc-208: debug flags -\n"
    );
    assert_one_error_line(
        &run(&mut shell, "kmem cache kmalloc-208 debug FZ"),
        "debug flags are fixed at creation",
    );
    assert_one_error_line(
        &run(&mut shell, "kmem cache nosuch"),
        "no cache named 'nosuch'",
    );
    assert_one_error_line(
        &run(&mut shell, "kmem cache kmalloc-208 frob"),
        "unknown action 'frob' for kmem cache",
    );
    // Bootstrap caches have no magazine layer, and say so.
    assert!(run(&mut shell, "kmem cache kmem_cache").contains("magazines: none"));
}

// ---------------------------------------------------------------------------
// allocinfo filters

#[test_case]
fn allocinfo_filters_like_linux() {
    if !magpie::profiling::COMPILED_IN {
        return;
    }
    let mut shell = Shell::new();
    run(&mut shell, "kmalloc 300 3");
    let rows = |out: &str| -> Vec<String> {
        let mut lines = out.lines();
        assert_eq!(lines.next(), Some("allocinfo - version: 1.0"), "{out}");
        assert_eq!(
            lines.next(),
            Some("#     <size>  <calls> <tag info>"),
            "{out}"
        );
        lines.map(String::from).collect()
    };
    let by_function = rows(&run(&mut shell, "allocinfo --function cmd_kmalloc"));
    assert!(!by_function.is_empty());
    assert!(
        by_function
            .iter()
            .all(|row| row.ends_with(" func:cmd_kmalloc")),
        "{by_function:?}"
    );
    // The kmalloc site, by file and line.
    let site = by_function
        .iter()
        .find(|row| row.contains("kernel/src/shell/kmem.rs:"))
        .unwrap();
    let location = site.split_whitespace().nth(2).unwrap();
    let (file, line) = location.rsplit_once(':').unwrap();
    let one = rows(&run(
        &mut shell,
        &format!("allocinfo --file {file} --line {line}"),
    ));
    assert_eq!(one.len(), 1, "{one:?}");
    assert!(one[0].contains(location));
    let bytes: u64 = one[0].split_whitespace().next().unwrap().parse().unwrap();
    assert!(bytes >= 900);
    // Size range, inclusive.
    let ranged = rows(&run(
        &mut shell,
        &format!("allocinfo --file {file} --line {line} --min-size {bytes} --max-size {bytes}"),
    ));
    assert_eq!(ranged.len(), 1);
    assert!(
        rows(&run(
            &mut shell,
            &format!("allocinfo --line {line} --min-size {}", bytes + 1)
        ))
        .iter()
        .all(|row| !row.contains(location))
    );
    let small = rows(&run(&mut shell, "allocinfo --max-size 0"));
    assert!(
        small.iter().all(|row| row.trim_start().starts_with("0 ")),
        "{small:?}"
    );
    // Counts are accurate (profiling on since boot): no inaccurate rows.
    assert!(rows(&run(&mut shell, "allocinfo --accurate no")).is_empty());
    assert!(!rows(&run(&mut shell, "allocinfo --accurate yes")).is_empty());
    assert_one_error_line(
        &run(&mut shell, "allocinfo --accurate maybe"),
        "--accurate takes yes or no, not 'maybe'",
    );
    for bad in ["allocinfo --function", "allocinfo --line"] {
        assert_one_error_line(&run(&mut shell, bad), "needs a value; usage: allocinfo");
    }
    assert_one_error_line(&run(&mut shell, "allocinfo --min-size x"), "not a number");
    run(&mut shell, "kfree all");
}
