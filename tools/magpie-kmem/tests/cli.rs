//! magpie-kmem on synthetic dumps: exact stat and live tables, check's
//! findings, bad input (truncation, corruption, ABI), pictures.

mod common;
use common::*;

const SITE_A: u64 = 0xffff_ffff_8010_0010;
const SITE_B: u64 = 0xffff_ffff_8020_0020;
const SITE_C: u64 = 0xffff_ffff_8030_0030;
const P1: u64 = 0xffff_8000_0010_0000;
const P2: u64 = 0xffff_8000_0010_0080;
const P3: u64 = 0xffff_8000_0010_0100;
const Q1: u64 = 0xffff_8000_0020_0000;
const Q2: u64 = 0xffff_8000_0020_0040;
const R1: u64 = 0xffff_8000_0030_0000;

/// Two CPUs. Site A: kmalloc 100 ×3 (kmalloc-128); site B: kmalloc 64 ×2
/// (kmalloc-64); site C: one inode object (256). P1 freed on its own CPU,
/// P2 and Q1 freed on the other CPU (ping-pong); P3, Q2, R1 stay live.
fn scenario() -> DumpBuilder {
    let mut d = DumpBuilder::new(2);
    d.record_start_ns = 900;
    d.cache(1, 128, "kmalloc-128")
        .cache(2, 64, "kmalloc-64")
        .cache(3, 256, "inode");
    d.cpu(
        0,
        0,
        &[
            alloc(0, 1000, 0, SITE_A, P1, 100, 128, 1),
            alloc(0, 1100, 1, SITE_A, P2, 100, 128, 1),
            alloc(0, 1200, 2, SITE_A, P3, 100, 128, 1),
            alloc(0, 1300, 3, SITE_B, Q1, 64, 64, 2),
            alloc(0, 1400, 4, SITE_B, Q2, 64, 64, 2),
            free(0, 1500, 5, SITE_A, P1, 128, 1),
        ],
    );
    d.cpu(
        1,
        0,
        &[
            free(1, 1600, 0, SITE_A, P2, 128, 1),
            alloc(1, 1700, 1, SITE_C, R1, 256, 256, 3).ty(CACHE),
            free(1, 1800, 2, SITE_B, Q1, 64, 2),
        ],
    );
    d
}

const STAT_DEFAULT: &str = "\
---------------------------------------------------------------------------------------------------------
 Callsite                           | Total_alloc/Per | Total_req/Per   | Hit      | Ping-pong | Frag
---------------------------------------------------------------------------------------------------------
 0xffffffff80100010                 |       384/128   |       300/100   |        3 |         1 | 21.875%
 0xffffffff80300030                 |       256/256   |       256/256   |        1 |         0 |  0.000%
 0xffffffff80200020                 |       128/64    |       128/64    |        2 |         1 |  0.000%
---------------------------------------------------------------------------------------------------------

---------------------------------------------------------------------------------------------------------
 Cache                              | Total_alloc/Per | Total_req/Per   | Hit      | Ping-pong | Frag
---------------------------------------------------------------------------------------------------------
 kmalloc-128                        |       384/128   |       300/100   |        3 |         1 | 21.875%
 inode                              |       256/256   |       256/256   |        1 |         0 |  0.000%
 kmalloc-64                         |       128/64    |       128/64    |        2 |         1 |  0.000%
---------------------------------------------------------------------------------------------------------
";

const SUMMARY: &str = "
SUMMARY (magpie-slab)
=====================
Total bytes requested: 684
Total bytes allocated: 768
Total bytes freed:     320
Net total bytes allocated: 448
Total bytes wasted on internal fragmentation: 84
Internal fragmentation: 10.937500%
Cross CPU frees (ping-pong): 2/3
Allocations: 6 (0 failed); frees: 3 (0 of pointers not allocated in the record); bad frees: 0
Live at the end: 3 objects; events lost to overruns: 0
";

fn scenario_file(name: &str) -> (std::path::PathBuf, std::path::PathBuf) {
    let dir = scratch(name);
    let file = write(&dir, "s.kmt", &scenario().build());
    (dir, file)
}

#[test]
fn stat_default_tables_and_summary_are_exact() {
    let (dir, _) = scenario_file("stat_default");
    let o = run(&dir, &["stat", "--no-symbols", "s.kmt"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o), format!("{STAT_DEFAULT}{SUMMARY}"));
}

#[test]
fn stat_alloc_sorted_by_bytes_top_2() {
    let (dir, _) = scenario_file("stat_alloc");
    let o = run(
        &dir,
        &[
            "stat",
            "--no-symbols",
            "--alloc",
            "--sort",
            "bytes",
            "--top",
            "2",
            "s.kmt",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let expected = "\
---------------------------------------------------------------------------------------------------------
 Alloc Ptr                          | Total_alloc/Per | Total_req/Per   | Hit      | Ping-pong | Frag
---------------------------------------------------------------------------------------------------------
 0xffff800000300000                 |       256/256   |       256/256   |        1 |         0 |  0.000%
 0xffff800000100000                 |       128/128   |       100/100   |        1 |         0 | 21.875%
 ...                                | ...             | ...             | ...      | ...       | ...
---------------------------------------------------------------------------------------------------------
";
    assert_eq!(stdout(&o), format!("{expected}{SUMMARY}"));
}

#[test]
fn stat_caller_sorted_by_pingpong_then_callsite() {
    let (dir, _) = scenario_file("stat_pingpong");
    let o = run(
        &dir,
        &[
            "stat",
            "--no-symbols",
            "--caller",
            "-s",
            "pingpong,callsite",
            "s.kmt",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    let order: Vec<&str> = out
        .lines()
        .filter(|l| l.starts_with(" 0x"))
        .map(|l| l.split_whitespace().next().unwrap())
        .collect();
    assert_eq!(
        order,
        [
            "0xffffffff80100010",
            "0xffffffff80200020",
            "0xffffffff80300030"
        ]
    );
    assert!(
        !out.contains("Cache "),
        "--caller alone prints no cache table"
    );
}

#[test]
fn stat_rejects_unknown_sort_key() {
    let (dir, _) = scenario_file("stat_sort_key");
    let o = run(&dir, &["stat", "--no-symbols", "--sort", "size", "s.kmt"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("unknown sort key \"size\""),
        "{}",
        stderr(&o)
    );
}

#[test]
fn stat_json_has_the_same_figures() {
    let (dir, _) = scenario_file("stat_json");
    let o = run(
        &dir,
        &[
            "stat",
            "--no-symbols",
            "--caller",
            "--alloc",
            "--cache",
            "--json",
            "s.kmt",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let a = &v["callsites"][0];
    assert_eq!(a["call_site"], "0xffffffff80100010");
    assert_eq!(a["hit"], 3);
    assert_eq!(a["bytes_alloc"], 384);
    assert_eq!(a["bytes_req"], 300);
    assert_eq!(a["pingpong"], 1);
    assert_eq!(a["frag_percent"], 21.875);
    assert_eq!(v["allocs"].as_array().unwrap().len(), 6);
    assert_eq!(v["caches"][1]["name"], "inode");
    let s = &v["summary"];
    assert_eq!(s["bytes_requested"], 684);
    assert_eq!(s["bytes_allocated"], 768);
    assert_eq!(s["bytes_freed"], 320);
    assert_eq!(s["net_bytes_allocated"], 448);
    assert_eq!(s["pingpong_frees"], 2);
    assert_eq!(s["matched_frees"], 3);
    assert_eq!(s["live_objects"], 3);
}

#[test]
fn stat_pages_failed_and_bad_frees() {
    let dir = scratch("stat_pages");
    let mut d = DumpBuilder::new(1);
    d.cpu(
        0,
        0,
        &[
            alloc(0, 10, 0, SITE_A, 0xffff_8000_0100_0000, 10000, 12288, 0).ty(PAGES),
            Ev {
                event: FAILED,
                ptr: 0,
                ..alloc(0, 20, 1, SITE_B, 0, 1 << 40, 0, 0)
            },
            Ev {
                event: BAD_FREE,
                ..free(0, 30, 2, SITE_C, 0x1234, 0, 0)
            },
        ],
    );
    write(&dir, "p.kmt", &d.build());
    let o = run(&dir, &["stat", "--no-symbols", "--cache", "p.kmt"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(
        out.contains(
            " (pages)                            |     12288/12288 |     10000/10000 |        1 |         0 | 18.620%"
        ),
        "{out}"
    );
    assert!(out.contains("Allocations: 1 (1 failed); frees: 0 (0 of pointers not allocated in the record); bad frees: 1"), "{out}");
    assert!(out.contains("Total bytes allocated: 12,288"), "{out}");
}

#[test]
fn live_lists_outstanding_objects_largest_first() {
    let (dir, _) = scenario_file("live");
    let o = run(&dir, &["live", "--no-symbols", "-v", "s.kmt"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let expected = "\
note: recording did not begin at boot: objects allocated before `record start` are not seen
CACHE                LIVE        BYTES  BUFFER              CALLER
inode                   1          256  0xffff800000300000  0xffffffff80300030
    0xffff800000300000  256 bytes (requested 256), cpu 1, at 1.700 µs
kmalloc-128             1          128  0xffff800000100100  0xffffffff80100010
    0xffff800000100100  128 bytes (requested 100), cpu 0, at 1.200 µs
kmalloc-64              1           64  0xffff800000200040  0xffffffff80200020
    0xffff800000200040  64 bytes (requested 64), cpu 0, at 1.400 µs
----------------------------------------------------------------------------------------------------
   Total        3 objects, 448 bytes in 3 groups
";
    assert_eq!(stdout(&o), expected);
}

#[test]
fn live_groups_by_stack_and_prints_frames() {
    let dir = scratch("live_stacks");
    let mut d = DumpBuilder::new(1);
    d.flags = FLAG_STACKS | FLAG_FROM_BOOT;
    d.stack_depth = 4;
    d.cache(1, 64, "kmalloc-64");
    d.stack(1, &[SITE_A, 0xffff_ffff_8090_0000]);
    d.stack(2, &[SITE_A, 0xffff_ffff_80a0_0000]);
    d.cpu(
        0,
        0,
        &[
            alloc(0, 10, 0, SITE_A, P1, 50, 64, 1).stack(1),
            alloc(0, 11, 1, SITE_A, P2, 50, 64, 1).stack(2),
            alloc(0, 12, 2, SITE_A, P3, 50, 64, 1).stack(2),
        ],
    );
    write(&dir, "k.kmt", &d.build());
    let o = run(&dir, &["live", "--no-symbols", "k.kmt"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let expected = "\
CACHE                LIVE        BYTES  BUFFER              CALLER
kmalloc-64              2          128  0xffff800000100080  0xffffffff80100010
    allocated at:
      #0  [0xffffffff80100010] 0xffffffff80100010
      #1  [0xffffffff80a00000] 0xffffffff80a00000
kmalloc-64              1           64  0xffff800000100000  0xffffffff80100010
    allocated at:
      #0  [0xffffffff80100010] 0xffffffff80100010
      #1  [0xffffffff80900000] 0xffffffff80900000
----------------------------------------------------------------------------------------------------
   Total        3 objects, 192 bytes in 2 groups
";
    assert_eq!(stdout(&o), expected);

    let o = run(&dir, &["live", "--no-symbols", "--json", "k.kmt"]);
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["nr_objects"], 3);
    assert_eq!(v["groups"][0]["stack_id"], 2);
    assert_eq!(v["groups"][0]["objects"][1]["ptr"], "0xffff800000100100");
    assert_eq!(v["groups"][0]["stack"][1]["address"], "0xffffffff80a00000");
    assert_eq!(v["caveats"].as_array().unwrap().len(), 0);
}

#[test]
fn leaks_is_refused_with_its_new_name_and_what_a_leak_is() {
    let (dir, _) = scenario_file("leaks_renamed");
    let o = run(&dir, &["leaks", "--no-symbols", "-v", "s.kmt"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stdout(&o).is_empty(), "{}", stdout(&o));
    let err = stderr(&o);
    assert!(err.contains("`leaks` is now `live`"), "{err}");
    assert!(err.contains("run `kmem findleaks` in the shell"), "{err}");
}

// ---- check ----

fn check(dir: &std::path::Path, d: &DumpBuilder) -> (Option<i32>, String) {
    write(dir, "c.kmt", &d.build());
    let o = run(dir, &["check", "--no-symbols", "c.kmt"]);
    (o.status.code(), stdout(&o) + &stderr(&o))
}

#[test]
fn check_passes_a_clean_dump() {
    let dir = scratch("check_clean");
    let (code, out) = check(&dir, &scenario());
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.contains("  cpu 0     6 events, seq 0..=5, 0 overruns, 0 seq gaps\n"),
        "{out}"
    );
    assert!(out.contains("  replay    3 live at the end, 3 frees matched, 2 ping-pong, 0 unknown frees, 0 double allocs\n"), "{out}");
    assert!(out.ends_with("check: OK (0 errors, 0 warnings)\n"), "{out}");
}

#[test]
fn check_reports_seq_gaps_as_overruns_not_corruption() {
    let dir = scratch("check_overruns");
    let mut d = DumpBuilder::new(1);
    d.cpu(
        0,
        3,
        &[
            alloc(0, 10, 0, SITE_A, P1, 8, 8, 0),
            alloc(0, 11, 1, SITE_A, P2, 8, 8, 0),
            alloc(0, 15, 5, SITE_A, P3, 8, 8, 0),
        ],
    );
    let (code, out) = check(&dir, &d);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("warning: cpu 0: 3 events lost to overruns (buffer full; 3 of them seen as 1 seq gaps, first seq 1 to 5 at offset 0x"), "{out}");
    assert!(!out.contains("error:"), "{out}");
    assert!(out.ends_with("check: OK (0 errors, 1 warning)\n"), "{out}");
}

#[test]
fn check_fails_when_gaps_exceed_the_overruns_reported() {
    let dir = scratch("check_lost");
    let mut d = DumpBuilder::new(1);
    d.cpu(
        0,
        1,
        &[
            alloc(0, 10, 0, SITE_A, P1, 8, 8, 0),
            alloc(0, 11, 4, SITE_A, P2, 8, 8, 0),
        ],
    );
    let (code, out) = check(&dir, &d);
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains(
            "error: cpu 0: 3 events missing in 1 seq gaps (first: seq 0 to 4 at offset 0x"
        ),
        "{out}"
    );
    assert!(
        out.contains("but only 1 overruns reported: events lost silently"),
        "{out}"
    );
}

#[test]
fn check_detects_timestamp_and_seq_disorder() {
    let dir = scratch("check_order");
    let mut d = DumpBuilder::new(2);
    d.cpu(
        0,
        0,
        &[
            alloc(0, 1000, 0, SITE_A, P1, 8, 8, 0),
            alloc(0, 900, 1, SITE_A, P2, 8, 8, 0),
        ],
    );
    d.cpu(
        1,
        0,
        &[
            alloc(1, 50, 7, SITE_A, P3, 8, 8, 0),
            alloc(1, 60, 6, SITE_A, Q1, 8, 8, 0),
        ],
    );
    let (code, out) = check(&dir, &d);
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains(
            "error: cpu 0: timestamp goes back from 1.000 µs (seq 0) to 900 ns (seq 1) at offset 0x"
        ),
        "{out}"
    );
    assert!(
        out.contains("error: cpu 1: seq goes from 7 to 6 at offset 0x"),
        "{out}"
    );
    assert!(
        out.ends_with("check: FAILED (2 errors, 0 warnings)\n"),
        "{out}"
    );
}

#[test]
fn check_detects_double_alloc() {
    let dir = scratch("check_double");
    let mut d = DumpBuilder::new(2);
    d.cpu(0, 0, &[alloc(0, 10, 0, SITE_A, P1, 8, 8, 0)]);
    d.cpu(1, 0, &[alloc(1, 20, 0, SITE_B, P1, 8, 8, 0)]);
    let (code, out) = check(&dir, &d);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("error: double alloc: ptr 0xffff800000100000 allocated on cpu 1 at 20 ns (seq 0, offset 0x"), "{out}");
    assert!(
        out.contains("while live since its alloc on cpu 0 at 10 ns (seq 0, offset 0x"),
        "{out}"
    );
}

fn unknown_free_dump(flags: u32, overruns: u64) -> DumpBuilder {
    let mut d = DumpBuilder::new(1);
    d.flags = flags;
    d.cpu(
        0,
        overruns,
        &[
            alloc(0, 10, 0, SITE_A, P1, 8, 8, 0),
            free(0, 20, 1, SITE_A, Q1, 8, 0),
        ],
    );
    d
}

#[test]
fn unknown_free_is_an_error_only_from_boot_without_overruns() {
    let dir = scratch("check_unknown_free");
    // From boot, nothing lost: an error.
    let (code, out) = check(&dir, &unknown_free_dump(FLAG_FROM_BOOT, 0));
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains(
            "error: free of unknown ptr 0xffff800000200000 on cpu 0 at 20 ns (seq 1, offset 0x"
        ),
        "{out}"
    );
    assert!(
        out.contains(
            "no alloc of it in the record although recording began at boot and nothing overran"
        ),
        "{out}"
    );
    // Not from boot: the object may predate the record (one summary line).
    let (code, out) = check(&dir, &unknown_free_dump(0, 0));
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("warning: 1 frees of pointers with no alloc in the record (first: ptr 0xffff800000200000 on cpu 0 at 20 ns, seq 1, offset 0x"), "{out}");
    assert!(
        out.contains("; recording did not begin at boot: the objects may predate the record\n"),
        "{out}"
    );
    // From boot, but events were lost: the alloc may have been dropped.
    let (code, out) = check(&dir, &unknown_free_dump(FLAG_FROM_BOOT, 2));
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.contains("; events were lost to overruns: their allocs may have been dropped\n"),
        "{out}"
    );
    assert!(out.ends_with("check: OK (0 errors, 2 warnings)\n"), "{out}");
}

#[test]
fn check_warns_of_size_mismatches_and_events_before_record_start() {
    let dir = scratch("check_sizes");
    let mut d = DumpBuilder::new(1);
    d.record_start_ns = 15;
    d.cpu(
        0,
        0,
        &[
            alloc(0, 10, 0, SITE_A, P1, 100, 128, 0),
            free(0, 20, 1, SITE_A, P1, 64, 0),
            alloc(0, 30, 2, SITE_A, P2, 100, 128, 0),
            free(0, 40, 3, SITE_A, P2, 0, 0),
        ],
    );
    let (code, out) = check(&dir, &d);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("warning: 1 events are stamped before `record start` (15 ns): first on cpu 0 at 10 ns (offset 0x"), "{out}");
    assert!(out.contains("warning: 1 frees give another object size than their alloc (first: ptr 0xffff800000100000 freed as 64 bytes at offset 0x"), "{out}");
    assert!(out.contains("allocated as 128 bytes at offset 0x"), "{out}");
    assert!(out.ends_with("check: OK (0 errors, 2 warnings)\n"), "{out}");
}

#[test]
fn check_skips_unknown_record_kinds_and_flags_missing_stacks() {
    let dir = scratch("check_kinds");
    let mut d = scenario();
    d.raw_record(0x42, &[1, 2, 3]);
    let (code, out) = check(&dir, &d);
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.contains("3 CACHE, 0 STACK, 2 CPU, 1 of unknown kind skipped"),
        "{out}"
    );

    let mut d = DumpBuilder::new(1);
    d.cpu(0, 0, &[alloc(0, 10, 0, SITE_A, P1, 8, 8, 9).stack(5)]);
    let (code, out) = check(&dir, &d);
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("error: 1 events name stack id 5, which no STACK record holds"),
        "{out}"
    );
    assert!(
        out.contains("warning: 1 events name cache id 9, which no CACHE record names"),
        "{out}"
    );
}

// ---- bad input: every command refuses it with the offset, exit 1 ----

fn refuse(dir: &std::path::Path, bytes: &[u8], needle: &str) {
    write(dir, "bad.kmt", bytes);
    for cmd in ["check", "stat", "live"] {
        let o = run(dir, &[cmd, "--no-symbols", "bad.kmt"]);
        assert_eq!(o.status.code(), Some(1), "{cmd}: {}", stderr(&o));
        assert!(
            stderr(&o).contains(needle),
            "{cmd}: expected {needle:?} in {}",
            stderr(&o)
        );
        assert!(
            stdout(&o).is_empty(),
            "{cmd} printed a report of a bad dump"
        );
    }
}

#[test]
fn truncated_dumps_are_refused_with_the_offset() {
    let dir = scratch("truncated");
    let bytes = scenario().build();
    let len = bytes.len();
    refuse(
        &dir,
        &bytes[..0],
        "truncated dump at offset 0 (0x0): the 64-byte header is cut short: 0 bytes remain",
    );
    refuse(
        &dir,
        &bytes[..30],
        "truncated dump at offset 0 (0x0): the 64-byte header is cut short: 30 bytes remain",
    );
    refuse(
        &dir,
        &bytes[..64],
        "truncated dump at offset 64 (0x40): no trailer record: the file ends after 0 records",
    );
    refuse(
        &dir,
        &bytes[..68],
        "truncated dump at offset 64 (0x40): record header needs 8 bytes, the file ends 4 bytes later",
    );
    refuse(
        &dir,
        &bytes[..80],
        "truncated dump at offset 64 (0x40): record (kind 0x1) of 48 bytes runs past the end of the file (16 bytes left)",
    );
    refuse(
        &dir,
        &bytes[..len - 40],
        &format!(
            "truncated dump at offset {} ({:#x}): no trailer record: the file ends after 5 records",
            len - 40,
            len - 40
        ),
    );
    refuse(
        &dir,
        &bytes[..len - 8],
        &format!(
            "truncated dump at offset {} ({:#x}): record (kind 0xffff) of 40 bytes runs past the end of the file (32 bytes left)",
            len - 40,
            len - 40
        ),
    );
}

#[test]
fn corrupted_dumps_are_refused_with_the_offset() {
    let dir = scratch("corrupt");
    let good = scenario().build();
    let len = good.len();

    // A flipped bit in the last event's bytes_req: only the checksum sees it.
    let mut bytes = good.clone();
    bytes[len - 40 - 64 + 40] ^= 0x10;
    refuse(
        &dir,
        &bytes,
        &format!(
            "corrupt dump at offset {} ({:#x}): checksum mismatch: the trailer says 0x",
            len - 8,
            len - 8
        ),
    );

    let mut bytes = good.clone();
    bytes[0] = b'X';
    refuse(
        &dir,
        &bytes,
        "corrupt dump at offset 0 (0x0): not a kmemtrace dump: bad magic",
    );

    let mut bytes = good.clone();
    bytes[68..72].copy_from_slice(&12u32.to_le_bytes());
    refuse(
        &dir,
        &bytes,
        "corrupt dump at offset 64 (0x40): record (kind 0x1) has length 12, not a multiple of 8",
    );

    let mut bytes = good.clone();
    bytes.extend_from_slice(&[0; 8]);
    refuse(
        &dir,
        &bytes,
        &format!("corrupt dump at offset {len} ({len:#x}): 8 bytes after the trailer record"),
    );
}

/// Each `kmemtrace dump` of a boot appends a dump to the file: the last
/// one is analysed, every one is validated.
#[test]
fn several_dumps_in_one_file_analyse_the_last() {
    let dir = scratch("several_dumps");
    let first = scenario().build();
    let mut d = DumpBuilder::new(1);
    d.cache(1, 64, "kmalloc-64");
    d.cpu(0, 0, &[alloc(0, 5000, 0, SITE_C, P1, 40, 64, 1)]);
    let second = d.build();
    let both = [first.clone(), second.clone()].concat();
    write(&dir, "two.kmt", &both);

    let o = run(&dir, &["stat", "--no-symbols", "--caller", "two.kmt"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains(" 0xffffffff80300030                 |        64/64    |        40/40    |        1 |         0 | 37.500%\n"), "{out}");
    assert!(
        !out.contains("0xffffffff80100010"),
        "the first dump is not analysed: {out}"
    );
    let note = format!(
        "2 dumps in the file; analysing the last, at offset {} (1 earlier dump read and skipped)",
        first.len()
    );
    assert!(stderr(&o).contains(&note), "{}", stderr(&o));

    let o = run(&dir, &["check", "--no-symbols", "two.kmt"]);
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
    assert!(
        stdout(&o).contains(&format!("  dumps     {note}\n")),
        "{}",
        stdout(&o)
    );
    assert!(
        stdout(&o)
            .contains("  events    1 (1 alloc, 0 free, 0 failed alloc, 0 bad free), 0 overruns\n")
    );

    // A flipped bit in the first dump: refused, offset in the file.
    let mut bad = both.clone();
    bad[first.len() - 40 - 64 + 40] ^= 1;
    let at = first.len() - 8;
    refuse(
        &dir,
        &bad,
        &format!("corrupt dump at offset {at} ({at:#x}): checksum mismatch"),
    );
    // The second dump cut short: truncated, offset in the file.
    let cut = &both[..both.len() - 40];
    let at = both.len() - 40;
    refuse(
        &dir,
        cut,
        &format!(
            "truncated dump at offset {at} ({at:#x}): no trailer record: the file ends after 2 records"
        ),
    );
    let cut = &both[..first.len() + 3];
    refuse(
        &dir,
        cut,
        &format!(
            "truncated dump at offset {} ({:#x}): the 64-byte header is cut short: 3 bytes remain",
            first.len(),
            first.len()
        ),
    );
}

#[test]
fn other_abi_versions_are_refused() {
    let dir = scratch("abi");
    let mut d = scenario();
    d.abi_version = 2;
    refuse(
        &dir,
        &d.build(),
        "ABI mismatch at offset 8 (0x8): dump has ABI version 2, this magpie-kmem reads version 1",
    );
    let mut bytes = scenario().build();
    bytes[16..20].copy_from_slice(&32u32.to_le_bytes());
    refuse(
        &dir,
        &bytes,
        "ABI mismatch at offset 16 (0x10): event_size is 32, ABI version 1 has 64",
    );
}

#[test]
fn a_missing_file_is_a_clear_error() {
    let dir = scratch("missing");
    let o = run(&dir, &["check", "--no-symbols", "nothing.kmt"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).starts_with("magpie-kmem: error: nothing.kmt: "),
        "{}",
        stderr(&o)
    );
}

// ---- pictures ----

fn svg_texts(path: &std::path::Path) -> Vec<String> {
    let text = std::fs::read_to_string(path).unwrap();
    let options = roxmltree::ParsingOptions {
        allow_dtd: true,
        ..Default::default()
    };
    let doc = roxmltree::Document::parse_with_options(&text, options).expect("well-formed SVG");
    assert_eq!(doc.root_element().tag_name().name(), "svg");
    doc.descendants()
        .filter(|n| n.is_text())
        .map(|n| n.text().unwrap().to_string())
        .collect()
}

#[test]
fn flamegraph_draws_bytes_by_stack() {
    let dir = scratch("flamegraph");
    let mut d = scenario();
    d.flags = FLAG_STACKS;
    d.stack_depth = 2;
    d.stack(1, &[SITE_A, 0xffff_ffff_8090_0000]);
    write(&dir, "s.kmt", &d.build());
    let o = run(
        &dir,
        &[
            "flamegraph",
            "--caches",
            "leaf",
            "--no-symbols",
            "s.kmt",
            "-o",
            "all.svg",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let texts = svg_texts(&dir.join("all.svg"));
    let has = |needle: &str| texts.iter().any(|t| t.contains(needle));
    assert!(has("bytes allocated, by stack"), "{texts:?}");
    assert!(has("[kmalloc-128] (384 bytes"), "{texts:?}");
    assert!(has("[inode] (256 bytes"), "{texts:?}");
    assert!(has("0xffffffff80200020 (128 bytes"), "{texts:?}");

    let o = run(
        &dir,
        &[
            "flamegraph",
            "--live",
            "--caches",
            "leaf",
            "--no-symbols",
            "s.kmt",
            "-o",
            "live.svg",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let texts = svg_texts(&dir.join("live.svg"));
    let has = |needle: &str| texts.iter().any(|t| t.contains(needle));
    assert!(has("bytes live at the end of the record"), "{texts:?}");
    assert!(has("[kmalloc-128] (128 bytes"), "{texts:?}");
    assert!(has("all (448 bytes"), "{texts:?}");
}

#[test]
fn flamegraph_with_stacks_uses_the_stack_frames() {
    let dir = scratch("flamegraph_stacks");
    let mut d = DumpBuilder::new(1);
    d.flags = FLAG_STACKS;
    d.stack_depth = 3;
    d.cache(1, 64, "kmalloc-64");
    d.stack(1, &[SITE_A, SITE_B, SITE_C]);
    d.cpu(0, 0, &[alloc(0, 10, 0, SITE_A, P1, 64, 64, 1).stack(1)]);
    write(&dir, "s.kmt", &d.build());
    let o = run(
        &dir,
        &["flamegraph", "--no-symbols", "s.kmt", "-o", "f.svg"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let texts = svg_texts(&dir.join("f.svg"));
    // Three frames at a depth of three: cut, marked so.
    for frame in [
        "[truncated] (64 bytes",
        "0xffffffff80300030 (64 bytes",
        "0xffffffff80200020 (64 bytes",
        "0xffffffff80100010 [kmalloc-64] (64 bytes",
    ] {
        assert!(
            texts.iter().any(|t| t.contains(frame)),
            "{frame}: {texts:?}"
        );
    }
}

#[test]
fn timeline_draws_live_bytes_of_the_top_caches() {
    let (dir, _) = scenario_file("timeline");
    let o = run(&dir, &["timeline", "s.kmt", "-o", "t.svg"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let texts = svg_texts(&dir.join("t.svg"));
    let has = |needle: &str| texts.iter().any(|t| t.contains(needle));
    assert!(has("live bytes per cache"), "{texts:?}");
    assert!(has("kmalloc-128 (peak 384 bytes)"), "{texts:?}");
    assert!(has("inode (peak 256 bytes)"), "{texts:?}");
    assert!(has("kmalloc-64 (peak 128 bytes)"), "{texts:?}");
    assert!(has("µs since record start"), "{texts:?}");
}

#[test]
fn pictures_of_an_empty_record_are_refused() {
    let dir = scratch("empty_pictures");
    let mut d = DumpBuilder::new(1);
    d.cpu(0, 0, &[]);
    write(&dir, "e.kmt", &d.build());
    let o = run(
        &dir,
        &["flamegraph", "--no-symbols", "e.kmt", "-o", "f.svg"],
    );
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("the record holds no allocation: nothing to draw"));
    assert!(!dir.join("f.svg").exists());
    let o = run(&dir, &["timeline", "e.kmt", "-o", "t.svg"]);
    assert_eq!(o.status.code(), Some(1));
}

// ---- symbolization with a real ELF: this test executable stands in for
// the kernel (it has a GNU build id and DWARF) ----

/// A call site with a known name and file.
#[inline(never)]
pub fn kmem_test_call_site(x: u64) -> u64 {
    std::hint::black_box(x).wrapping_mul(3) ^ 0x55
}

/// The address of `kmem_test_call_site` in this executable's ELF.
fn call_site_address(exe: &std::path::Path) -> u64 {
    use object::{Object, ObjectSymbol};
    assert_ne!(kmem_test_call_site(std::hint::black_box(1)), 0);
    let data = std::fs::read(exe).unwrap();
    let file = object::File::parse(&*data).unwrap();
    file.symbols()
        .find(|s| {
            format!("{:#}", rustc_demangle::demangle(s.name().unwrap_or("")))
                .ends_with("::kmem_test_call_site")
        })
        .expect("kmem_test_call_site in the symbol table")
        .address()
}

fn symbol_dump(build_id: [u8; 20], site: u64) -> Vec<u8> {
    let mut d = DumpBuilder::new(1);
    d.build_id = build_id;
    d.cache(1, 128, "kmalloc-128");
    d.cpu(
        0,
        0,
        &[
            alloc(0, 10, 0, site, P1, 100, 128, 1),
            alloc(0, 20, 1, site, P2, 100, 128, 1),
        ],
    );
    d.build()
}

fn exe_and_build_id() -> (std::path::PathBuf, [u8; 20]) {
    let exe = std::env::current_exe().unwrap();
    let id = magpie_kmem::symbols::read_build_id(&exe)
        .unwrap()
        .expect("the test executable has a GNU build id");
    (exe, id.try_into().expect("a 20-byte SHA-1 build id"))
}

fn assert_symbolized(out: &str) {
    let row = out
        .lines()
        .find(|l| l.contains("kmem_test_call_site"))
        .unwrap_or_else(|| panic!("no symbolized row in\n{out}"));
    assert!(row.starts_with(" cli::kmem_test_call_site+0x4 "), "{row}");
    assert!(
        row.contains("|       256/128   |       200/100   |        2 |         0 | 21.875% | "),
        "{row}"
    );
    assert!(row.contains("tests/cli.rs:"), "file:line from DWARF: {row}");
    assert!(out.contains("| Source\n"), "{out}");
}

#[test]
fn stat_symbolizes_with_the_kernel_given() {
    let dir = scratch("symbols_explicit");
    let (exe, id) = exe_and_build_id();
    let site = call_site_address(&exe) + 4;
    write(&dir, "s.kmt", &symbol_dump(id, site));
    let exe_arg = exe.display().to_string();
    let o = run(&dir, &["stat", "--caller", "--kernel", &exe_arg, "s.kmt"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_symbolized(&stdout(&o));
    let o = run(&dir, &["check", "--kernel", &exe_arg, "s.kmt"]);
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
    assert!(stdout(&o).contains(&format!("  kernel    {exe_arg} (build id matches)\n")));
}

#[test]
fn the_kernel_is_found_by_build_id() {
    let dir = scratch("symbols_search");
    let (exe, id) = exe_and_build_id();
    let site = call_site_address(&exe) + 4;
    // A target directory as cargo lays it out, with our ELF as the kernel.
    let kernels = dir.join("target/x86_64-unknown-none/debug");
    std::fs::create_dir_all(kernels.join("deps")).unwrap();
    std::fs::write(kernels.join("deps/other_kernel-0123"), b"not an ELF").unwrap();
    std::fs::copy(&exe, kernels.join("magpie")).unwrap();
    write(&dir, "s.kmt", &symbol_dump(id, site));
    let o = run(&dir, &["stat", "--caller", "s.kmt"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_symbolized(&stdout(&o));

    // A dump of another build: the kernels there do not match.
    write(&dir, "other.kmt", &symbol_dump([0xab; 20], site));
    let o = run(&dir, &["stat", "other.kmt"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("kernel ELF mismatch: no kernel among")
            && stderr(&o).contains(&format!("has build id {}", "ab".repeat(20))),
        "{}",
        stderr(&o)
    );
    let o = run(&dir, &["check", "other.kmt"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stdout(&o).contains("error: kernel ELF mismatch"),
        "{}",
        stdout(&o)
    );
    // --no-symbols reads it anyway.
    let o = run(&dir, &["check", "--no-symbols", "other.kmt"]);
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
}

#[test]
fn a_kernel_of_another_build_is_refused() {
    let dir = scratch("symbols_mismatch");
    let (exe, _) = exe_and_build_id();
    write(&dir, "s.kmt", &symbol_dump([0xcd; 20], 0x1000));
    let exe_arg = exe.display().to_string();
    for cmd in ["stat", "live"] {
        let o = run(&dir, &[cmd, "--kernel", &exe_arg, "s.kmt"]);
        assert_eq!(o.status.code(), Some(1));
        assert!(
            stderr(&o).contains(&format!("kernel ELF mismatch: {exe_arg} has build id "))
                && stderr(&o).contains(&format!(
                    "the dump was written by build id {}",
                    "cd".repeat(20)
                )),
            "{}",
            stderr(&o)
        );
    }
    let o = run(&dir, &["check", "--kernel", &exe_arg, "s.kmt"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stdout(&o).contains("  kernel    MISMATCH\n"),
        "{}",
        stdout(&o)
    );
}

#[test]
fn a_reader_that_stops_early_ends_the_output_quietly() {
    // `magpie-kmem live --json FILE | head`: the reader closes the pipe
    // before the report is written. The tool stops writing and exits 0,
    // with nothing on stderr (no panic, no backtrace).
    let (dir, _) = scenario_file("broken_pipe");
    for args in [
        &["live", "--no-symbols", "--json", "s.kmt"][..],
        &["live", "--no-symbols", "s.kmt"][..],
        &["stat", "--no-symbols", "s.kmt"][..],
        &["stat", "--no-symbols", "--json", "s.kmt"][..],
    ] {
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_magpie-kmem"))
            .args(args)
            .current_dir(&dir)
            .env_remove("CARGO_TARGET_DIR")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("run magpie-kmem");
        drop(child.stdout.take());
        let o = child.wait_with_output().expect("wait for magpie-kmem");
        assert!(
            o.status.success(),
            "{args:?}: {:?} {}",
            o.status,
            stderr(&o)
        );
        assert_eq!(stderr(&o), "", "{args:?}");
    }
}
