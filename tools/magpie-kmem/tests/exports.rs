//! `magpie-kmem export` and `diff` on synthetic dumps: speedscope JSON
//! validated against speedscope's published schema (vendored in
//! tests/data), folded stacks read back by `inferno` (a real reader),
//! Chrome trace events checked against the trace-event format's rules and
//! loaded by Chrome DevTools' trace engine (a real reader, run in node:
//! tests/chrome-reader), and `diff`'s exact table.

mod common;
use common::*;

use serde_json::Value;

const SITE_A: u64 = 0xffff_ffff_8010_0010;
const SITE_B: u64 = 0xffff_ffff_8020_0020;
const ROOT: u64 = 0xffff_ffff_8090_0000;
const P1: u64 = 0xffff_8000_0010_0000;
const P2: u64 = 0xffff_8000_0010_0080;
const Q1: u64 = 0xffff_8000_0020_0000;

/// Two CPUs: site A allocates two kmalloc-128 objects (stack ROOT → A,
/// whole: shorter than the recorded depth), site B one kmalloc-64 object
/// freed on the other CPU; P1 is freed.
fn scenario() -> DumpBuilder {
    let mut d = DumpBuilder::new(2);
    d.record_start_ns = 1_000;
    d.flags = FLAG_STACKS;
    d.stack_depth = 4;
    d.cache(1, 128, "kmalloc-128").cache(2, 64, "kmalloc-64");
    d.stack(1, &[SITE_A, ROOT]);
    d.cpu(
        0,
        0,
        &[
            alloc(0, 2_000, 0, SITE_A, P1, 100, 128, 1).stack(1),
            alloc(0, 3_500, 1, SITE_A, P2, 100, 128, 1).stack(1),
            alloc(0, 4_000, 2, SITE_B, Q1, 64, 64, 2),
            free(0, 5_000, 3, SITE_A, P1, 128, 1),
        ],
    );
    d.cpu(1, 0, &[free(1, 6_000, 0, SITE_B, Q1, 64, 2)]);
    d
}

fn export(dir: &std::path::Path, args: &[&str]) -> String {
    let mut all = vec!["export", "--no-symbols"];
    all.extend_from_slice(args);
    let o = run(dir, &all);
    assert!(o.status.success(), "{}", stderr(&o));
    stdout(&o)
}

// ---- a JSON-schema check (draft 07, the keywords speedscope's schema uses) ----

fn resolve<'a>(schema: &'a Value, root: &'a Value) -> &'a Value {
    match schema.get("$ref").and_then(Value::as_str) {
        Some(reference) => {
            let name = reference.trim_start_matches("#/definitions/");
            resolve(&root["definitions"][name], root)
        }
        None => schema,
    }
}

/// Problems of `value` against `schema` (`type`, `const`, `enum`,
/// `required`, `properties`, `additionalProperties: false`, `items`,
/// `anyOf`, `$ref`), each with its JSON path.
fn validate(value: &Value, schema: &Value, root: &Value, path: &str, problems: &mut Vec<String>) {
    let schema = resolve(schema, root);
    if let Some(kind) = schema.get("type").and_then(Value::as_str) {
        let ok = match kind {
            "object" => value.is_object(),
            "array" => value.is_array(),
            "string" => value.is_string(),
            "number" => value.is_number(),
            "integer" => value.is_i64() || value.is_u64(),
            "boolean" => value.is_boolean(),
            "null" => value.is_null(),
            _ => true,
        };
        if !ok {
            problems.push(format!("{path}: not a {kind}"));
            return;
        }
    }
    if let Some(expected) = schema.get("const")
        && value != expected
    {
        problems.push(format!("{path}: {value} is not {expected}"));
    }
    if let Some(choices) = schema.get("enum").and_then(Value::as_array)
        && !choices.contains(value)
    {
        problems.push(format!("{path}: {value} is not one of {choices:?}"));
    }
    if let Some(options) = schema.get("anyOf").and_then(Value::as_array) {
        let fits = options.iter().any(|option| {
            let mut inner = Vec::new();
            validate(value, option, root, path, &mut inner);
            inner.is_empty()
        });
        if !fits {
            problems.push(format!("{path}: matches none of anyOf"));
        }
    }
    if let Some(object) = value.as_object() {
        for key in schema
            .get("required")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if !object.contains_key(key.as_str().unwrap_or_default()) {
                problems.push(format!("{path}: missing {key}"));
            }
        }
        let properties = schema.get("properties").and_then(Value::as_object);
        for (key, item) in object {
            match properties.and_then(|p| p.get(key)) {
                Some(sub) => validate(item, sub, root, &format!("{path}.{key}"), problems),
                None if schema.get("additionalProperties") == Some(&Value::Bool(false)) => {
                    problems.push(format!("{path}: unexpected {key}"));
                }
                None => {}
            }
        }
    }
    if let (Some(items), Some(array)) = (schema.get("items"), value.as_array()) {
        for (i, item) in array.iter().enumerate() {
            validate(item, items, root, &format!("{path}[{i}]"), problems);
        }
    }
}

fn speedscope_schema() -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/speedscope-file-format-schema.json"
    );
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn the_schema_check_rejects_what_speedscope_would() {
    let schema = speedscope_schema();
    let mut problems = Vec::new();
    let bad = serde_json::json!({"$schema": "x", "shared": {"frames": [{"file": "a.rs"}]},
        "profiles": [{"type": "sampled", "unit": "parsecs"}]});
    validate(&bad, &schema, &schema, "$", &mut problems);
    let text = problems.join("\n");
    assert!(
        text.contains("$.shared.frames[0]: missing \"name\""),
        "{text}"
    );
    assert!(
        text.contains("$.profiles[0]: matches none of anyOf"),
        "{text}"
    );
}

#[test]
fn speedscope_export_validates_against_speedscopes_schema() {
    let dir = scratch("export_speedscope");
    write(&dir, "s.kmt", &scenario().build());
    for live in [false, true] {
        let mut args = vec!["--format", "speedscope", "s.kmt"];
        if live {
            args.insert(0, "--live");
        }
        let value: Value = serde_json::from_str(&export(&dir, &args)).unwrap();
        let schema = speedscope_schema();
        let mut problems = Vec::new();
        validate(&value, &schema, &schema, "$", &mut problems);
        assert_eq!(problems, Vec::<String>::new(), "{value:#}");
        let profile = &value["profiles"][0];
        assert_eq!(profile["unit"], "bytes");
        let weights: Vec<u64> = profile["weights"]
            .as_array()
            .unwrap()
            .iter()
            .map(|w| w.as_u64().unwrap())
            .collect();
        let total: u64 = weights.iter().sum();
        assert_eq!(profile["endValue"].as_u64(), Some(total));
        // All: 2 x 128 at site A (under ROOT) + 64 at B; live: P2 only.
        assert_eq!(total, if live { 128 } else { 320 });
        let frames: Vec<&str> = value["shared"]["frames"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["name"].as_str().unwrap())
            .collect();
        let heaviest = (0..weights.len()).max_by_key(|&i| weights[i]).unwrap();
        let sample: Vec<&str> = profile["samples"][heaviest]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| frames[i.as_u64().unwrap() as usize])
            .collect();
        assert_eq!(
            sample,
            ["0xffffffff80900000", "0xffffffff80100010", "[kmalloc-128]"]
        );
    }
}

#[test]
fn folded_stacks_are_read_back_by_inferno() {
    let dir = scratch("export_folded");
    write(&dir, "s.kmt", &scenario().build());
    let text = export(&dir, &["--format", "folded", "s.kmt"]);
    assert_eq!(
        text,
        "0xffffffff80200020;[kmalloc-64] 64\n\
         0xffffffff80900000;0xffffffff80100010;[kmalloc-128] 256\n"
    );
    // A real reader: inferno's flamegraph parses folded lines (and
    // rejects malformed ones by skipping them: every byte must arrive).
    let mut options = inferno::flamegraph::Options::default();
    let mut svg = Vec::new();
    inferno::flamegraph::from_lines(&mut options, text.lines(), &mut svg).unwrap();
    let svg = String::from_utf8(svg).unwrap();
    assert!(svg.contains("all (320 samples, 100%)"), "{svg}");
    assert!(svg.contains("[kmalloc-128] (256 samples, 80.00%)"), "{svg}");
    // -o writes the same to a file.
    let o = run(
        &dir,
        &[
            "export",
            "--no-symbols",
            "--format",
            "folded",
            "s.kmt",
            "-o",
            "out.folded",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        std::fs::read_to_string(dir.join("out.folded")).unwrap(),
        text
    );
}

#[test]
fn chrome_trace_has_events_per_cpu_and_live_byte_counters() {
    let dir = scratch("export_chrome");
    write(&dir, "s.kmt", &scenario().build());
    let value: Value =
        serde_json::from_str(&export(&dir, &["--format", "chrome", "s.kmt"])).unwrap();
    let events = value["traceEvents"].as_array().unwrap();
    // The trace-event format's rules for the phases used: every event has
    // ph, pid, name; instant and counter events a numeric ts; an instant's
    // scope is g, p or t; a counter's args are numbers.
    for e in events {
        let ph = e["ph"].as_str().unwrap();
        assert!(e["pid"].is_u64() && e["name"].is_string(), "{e}");
        match ph {
            "M" => assert!(e["args"]["name"].is_string(), "{e}"),
            "I" => {
                assert!(e["ts"].is_number(), "{e}");
                assert!(matches!(e["s"].as_str(), Some("g" | "p" | "t")), "{e}");
            }
            "C" => {
                assert!(e["ts"].is_number(), "{e}");
                assert!(
                    e["args"]
                        .as_object()
                        .unwrap()
                        .values()
                        .all(Value::is_number),
                    "{e}"
                );
            }
            other => panic!("unexpected phase {other}: {e}"),
        }
    }
    let named =
        |name: &str| -> Vec<&Value> { events.iter().filter(|e| e["name"] == name).collect() };
    let threads: Vec<&str> = named("thread_name")
        .iter()
        .map(|e| e["args"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(threads, ["cpu 0", "cpu 1"]);
    // tid = CPU + 1: Perfetto drops thread-scoped instants on tid 0.
    let tids: Vec<u64> = named("thread_name")
        .iter()
        .map(|e| e["tid"].as_u64().unwrap())
        .collect();
    assert_eq!(tids, [1, 2]);
    let allocs = named("alloc kmalloc-128");
    assert_eq!(allocs.len(), 2);
    // Microseconds since record start (1,000 ns): 2,000 ns is 1 µs.
    assert_eq!(allocs[0]["ts"].as_f64(), Some(1.0));
    assert_eq!(allocs[0]["tid"], 1, "CPU 0");
    assert_eq!(allocs[0]["args"]["ptr"], "0xffff800000100000");
    let frees = named("free kmalloc-64");
    assert_eq!(frees.len(), 1);
    assert_eq!(frees[0]["tid"], 2, "freed on CPU 1");
    let counter: Vec<i64> = named("live bytes kmalloc-128")
        .iter()
        .map(|e| e["args"]["bytes"].as_i64().unwrap())
        .collect();
    assert_eq!(counter, [128, 256, 128]);
    let counter: Vec<i64> = named("live bytes kmalloc-64")
        .iter()
        .map(|e| e["args"]["bytes"].as_i64().unwrap())
        .collect();
    assert_eq!(counter, [64, 0]);
}

#[test]
fn unknown_export_format_is_refused() {
    let dir = scratch("export_unknown");
    write(&dir, "s.kmt", &scenario().build());
    let o = run(
        &dir,
        &["export", "--no-symbols", "--format", "pprof", "s.kmt"],
    );
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("unknown export format 'pprof' (chrome, speedscope, folded)"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn diff_shows_what_grew_per_site_and_cache() {
    let dir = scratch("diff");
    write(&dir, "a.kmt", &scenario().build());
    // B: site A holds three objects, site B one more kmalloc-64.
    let mut b = DumpBuilder::new(1);
    b.cache(1, 128, "kmalloc-128").cache(2, 64, "kmalloc-64");
    b.cpu(
        0,
        0,
        &[
            alloc(0, 2_000, 0, SITE_A, P1, 100, 128, 1),
            alloc(0, 2_100, 1, SITE_A, P2, 100, 128, 1),
            alloc(0, 2_200, 2, SITE_A, 0xffff_8000_0010_0100, 100, 128, 1),
            alloc(0, 2_300, 3, SITE_B, Q1, 64, 64, 2),
        ],
    );
    write(&dir, "b.kmt", &b.build());
    let o = run(&dir, &["diff", "--no-symbols", "a.kmt", "b.kmt"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        stdout(&o),
        "\
magpie-kmem diff - live at the end of a.kmt -> b.kmt, 2 sites changed
#     <size>  <calls> <tag info>
        +256       +2 0xffffffff80100010
         +64       +1 0xffffffff80200020

#     <size>  <calls> <cache>
        +256       +2 kmalloc-128
         +64       +1 kmalloc-64
"
    );
    // And back: what shrank, signed.
    let o = run(
        &dir,
        &["diff", "--no-symbols", "--top", "1", "b.kmt", "a.kmt"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("        -64       -1 0xffffffff80200020"),
        "{}",
        stdout(&o)
    );
}

// ---- pictures people read ----

fn svg(dir: &std::path::Path, args: &[&str], out: &str) -> String {
    let mut all = vec!["--no-symbols"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["-o", out]);
    let o = run(dir, &all);
    assert!(o.status.success(), "{}", stderr(&o));
    std::fs::read_to_string(dir.join(out)).unwrap()
}

#[test]
fn timeline_axes_read_kib_and_lines_may_be_call_sites() {
    let dir = scratch("timeline_kib");
    let mut d = DumpBuilder::new(1);
    d.cache(1, 8192, "kmalloc-8192").cache(2, 64, "kmalloc-64");
    d.cpu(
        0,
        0,
        &[
            alloc(0, 1_000, 0, SITE_A, P1, 8192, 8192, 1),
            alloc(0, 2_000, 1, SITE_A, P2, 8192, 8192, 1),
            alloc(0, 3_000, 2, SITE_B, Q1, 64, 64, 2),
            free(0, 4_000, 3, SITE_A, P1, 8192, 1),
        ],
    );
    write(&dir, "k.kmt", &d.build());
    let text = svg(&dir, &["timeline", "k.kmt"], "cache.svg");
    assert!(text.contains("live KiB"), "the y axis in KiB");
    assert!(text.contains("kmalloc-8192 (peak 16.0 KiB)"));
    assert!(text.contains("kmalloc-64 (peak 64 bytes)"));
    // The legend is beside the plot: its text starts right of the plot
    // area (760 px wide), not over it.
    let at = text.find("kmalloc-8192 (peak").unwrap();
    let tag = &text[text[..at].rfind("<text").unwrap()..at];
    let x: f64 = tag
        .split("x=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap()
        .parse()
        .unwrap();
    assert!(x > 760.0, "legend at x={x}: {tag}");

    let text = svg(&dir, &["timeline", "--by", "site", "k.kmt"], "site.svg");
    assert!(text.contains("live bytes per call site"));
    assert!(text.contains("0xffffffff80100010 (peak 16.0 KiB)"));
    assert!(text.contains("0xffffffff80200020 (peak 64 bytes)"));
    let o = run(&dir, &["timeline", "--by", "cpu", "k.kmt", "-o", "x.svg"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("--by cpu: cache or site"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn flamegraph_can_label_sites_with_their_caches() {
    let dir = scratch("flamegraph_label");
    let mut d = DumpBuilder::new(1);
    d.cache(1, 64, "kmalloc-64")
        .cache(2, 8, "kmalloc-8")
        .cache(3, 512, "kmalloc-512");
    d.cpu(
        0,
        0,
        &[
            alloc(0, 1_000, 0, SITE_A, P1, 64, 64, 1),
            alloc(0, 2_000, 1, SITE_A, P2, 8, 8, 2),
            alloc(0, 3_000, 2, SITE_A, Q1, 500, 512, 3),
            alloc(0, 4_000, 3, SITE_B, 0xffff_8000_0030_0000, 64, 64, 1),
        ],
    );
    write(&dir, "l.kmt", &d.build());
    let text = svg(&dir, &["flamegraph", "--caches", "label", "l.kmt"], "l.svg");
    // One box per site, the caches in its label, sorted by object size.
    assert!(
        text.contains("0xffffffff80100010 [3 caches: kmalloc-8 … kmalloc-512] (584 bytes"),
        "{text}"
    );
    assert!(text.contains("0xffffffff80200020 [kmalloc-64] (64 bytes"));
    assert!(!text.contains(">[kmalloc-8]"), "no leaf frame per cache");
    // The default labels too (issue 31: leaf frames were unreadable).
    let default = svg(&dir, &["flamegraph", "l.kmt"], "default.svg");
    assert!(
        default.contains("0xffffffff80100010 [3 caches: kmalloc-8 … kmalloc-512] (584 bytes"),
        "{default}"
    );
    // --caches leaf keeps the cache as a leaf frame.
    let text = svg(
        &dir,
        &["flamegraph", "--caches", "leaf", "l.kmt"],
        "leaf.svg",
    );
    assert!(text.contains("[kmalloc-8] (8 bytes"));
}

#[test]
fn stacks_cut_at_the_recorded_depth_are_marked() {
    let dir = scratch("truncated_stacks");
    let mut d = DumpBuilder::new(1);
    d.flags = FLAG_STACKS;
    d.stack_depth = 2;
    d.cache(1, 64, "kmalloc-64");
    // Stack 1 fills the depth (its root was not recorded); stack 2 ended.
    d.stack(1, &[SITE_A, ROOT]);
    d.stack(2, &[SITE_B]);
    d.cpu(
        0,
        0,
        &[
            alloc(0, 1_000, 0, SITE_A, P1, 64, 64, 1).stack(1),
            alloc(0, 2_000, 1, SITE_B, P2, 64, 64, 1).stack(2),
        ],
    );
    write(&dir, "t.kmt", &d.build());
    let folded = export(&dir, &["--format", "folded", "t.kmt"]);
    assert_eq!(
        folded,
        "0xffffffff80200020;[kmalloc-64] 64\n\
         [truncated];0xffffffff80900000;0xffffffff80100010;[kmalloc-64] 64\n"
    );
    let text = svg(&dir, &["flamegraph", "t.kmt"], "t.svg");
    assert!(text.contains("[truncated] (64 bytes"), "{text}");
    // The Chrome export's stack tree has the same root.
    let value: Value =
        serde_json::from_str(&export(&dir, &["--format", "chrome", "t.kmt"])).unwrap();
    let frames = &value["stackFrames"];
    let event = value["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["args"]["ptr"] == "0xffff800000100000")
        .unwrap();
    let mut names = Vec::new();
    let mut node = event["sf"].as_str().map(str::to_string);
    while let Some(id) = node {
        names.push(frames[&id]["name"].as_str().unwrap().to_string());
        node = frames[&id]["parent"].as_str().map(str::to_string);
    }
    assert_eq!(
        names,
        ["0xffffffff80100010", "0xffffffff80900000", "[truncated]"]
    );
}

#[test]
fn chrome_export_streams_with_progress_and_carries_stacks() {
    let dir = scratch("export_chrome_large");
    let mut d = DumpBuilder::new(1);
    d.flags = FLAG_STACKS;
    d.stack_depth = 4;
    d.cache(1, 64, "kmalloc-64");
    d.stack(1, &[SITE_A, ROOT]);
    let n = 120_000u64;
    let events: Vec<_> = (0..n)
        .map(|i| {
            let ptr = P1 + (i % 1000) * 64;
            if i % 2 == 0 {
                alloc(0, 1_000 + i * 10, i, SITE_A, ptr, 64, 64, 1).stack(1)
            } else {
                free(
                    0,
                    1_000 + i * 10,
                    i,
                    SITE_A,
                    ptr - 64 * ((i % 1000) % 2),
                    64,
                    1,
                )
            }
        })
        .collect();
    d.cpu(0, 0, &events);
    write(&dir, "big.kmt", &d.build());
    let o = run(
        &dir,
        &[
            "export",
            "--no-symbols",
            "--format",
            "chrome",
            "big.kmt",
            "-o",
            "big.json",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let err = stderr(&o);
    for percent in [10, 50, 100] {
        assert!(
            err.contains(&format!("events ({percent}%)")),
            "progress at {percent}%: {err}"
        );
    }
    assert!(
        err.contains("magpie-kmem: chrome export: 120000/120000 events (100%)"),
        "{err}"
    );
    let value: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("big.json")).unwrap()).unwrap();
    let events = value["traceEvents"].as_array().unwrap();
    let instants = events.iter().filter(|e| e["cat"] == "kmem").count();
    assert_eq!(instants, n as usize, "every event");
    let with_stack = events.iter().filter(|e| e["sf"].is_string()).count();
    assert_eq!(with_stack, (n / 2) as usize, "every alloc with its stack");
    assert_eq!(value["stackFrames"].as_object().unwrap().len(), 2);
    // Times keep their nanoseconds: 1,010 ns after the start is 1.010 µs.
    let first_free = events
        .iter()
        .find(|e| e["name"] == "free kmalloc-64")
        .unwrap();
    assert_eq!(first_free["ts"].as_f64(), Some(1.01));
}

/// A MARK record body: `timestamp_ns u64, cpu u32, text_len u32, text`.
fn mark_body(ns: u64, cpu: u32, text: &str) -> Vec<u8> {
    let mut body = ns.to_le_bytes().to_vec();
    body.extend_from_slice(&cpu.to_le_bytes());
    body.extend_from_slice(&(text.len() as u32).to_le_bytes());
    body.extend_from_slice(text.as_bytes());
    body
}

/// The Chrome export loaded by a real reader: Chrome DevTools' trace
/// engine (the Performance panel's, npm `@paulirish/trace_engine`, pinned
/// in tests/chrome-reader/package-lock.json and installed there by `make
/// chrome-reader`), run by `node tests/chrome-reader/read.mjs`. It must
/// draw one track per CPU, named, with every alloc and free on the CPU
/// that did it, in time order, within the trace's bounds. (Perfetto's
/// reader, `trace_processor`, is not installable here: its PyPI package
/// downloads the binary at run time.) Skipped, saying so, when node or
/// the reader is not installed, unless `MAGPIE_REQUIRE_CHROME_READER=1`
/// (the Makefile's `test-host` sets it after installing the reader).
#[test]
fn chrome_export_loads_in_chrome_devtools_trace_engine() {
    let reader = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/chrome-reader");
    let required = std::env::var("MAGPIE_REQUIRE_CHROME_READER").as_deref() == Ok("1");
    if !reader.join("node_modules/@paulirish/trace_engine").is_dir() {
        assert!(
            !required,
            "the Chrome DevTools trace engine is not installed: make chrome-reader"
        );
        eprintln!("skipped: no tests/chrome-reader/node_modules (make chrome-reader)");
        return;
    }
    let dir = scratch("export_chrome_reader");
    let mut d = scenario();
    d.raw_record(4, &mark_body(3_000, 0, "kmalloc 100 2"));
    write(&dir, "s.kmt", &d.build());
    write(
        &dir,
        "s.json",
        export(&dir, &["--format", "chrome", "s.kmt"]).as_bytes(),
    );
    let output = match std::process::Command::new("node")
        .arg(reader.join("read.mjs"))
        .arg(dir.join("s.json"))
        .output()
    {
        Ok(output) => output,
        Err(error) => {
            assert!(!required, "node: {error}");
            eprintln!("skipped: node: {error}");
            return;
        }
    };
    assert!(
        output.status.success(),
        "the trace engine refused the export: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let seen: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(seen["generic"], true, "{seen}");
    assert_eq!(seen["processes"]["1"], "magpie kernel", "{seen}");
    let tracks: Vec<(&str, Vec<(&str, f64)>)> = seen["threads"]
        .as_array()
        .unwrap()
        .iter()
        .map(|thread| {
            let entries = thread["entries"]
                .as_array()
                .unwrap()
                .iter()
                .map(|e| (e[0].as_str().unwrap(), e[1].as_f64().unwrap()))
                .collect();
            (thread["name"].as_str().unwrap(), entries)
        })
        .collect();
    // µs since record start (1,000 ns); the markers on the CPU that ran
    // the command.
    assert_eq!(
        tracks,
        [
            (
                "cpu 0",
                vec![
                    ("record start", 0.0),
                    ("alloc kmalloc-128", 1.0),
                    ("kmalloc 100 2", 2.0),
                    ("alloc kmalloc-128", 2.5),
                    ("alloc kmalloc-64", 3.0),
                    ("free kmalloc-128", 4.0),
                ]
            ),
            ("cpu 1", vec![("free kmalloc-64", 5.0)]),
        ],
        "{seen}"
    );
    assert_eq!(seen["bounds"]["min"].as_f64(), Some(1.0), "{seen}");
    assert_eq!(seen["bounds"]["max"].as_f64(), Some(5.0), "{seen}");
}

#[test]
fn shell_commands_are_markers_in_the_trace_and_on_the_timeline() {
    let dir = scratch("markers");
    let mut d = scenario();
    d.raw_record(4, &mark_body(3_000, 0, "kmalloc 100 2"))
        .raw_record(4, &mark_body(1_500, 1, "kmemtrace record start"));
    write(&dir, "m.kmt", &d.build());
    let value: Value =
        serde_json::from_str(&export(&dir, &["--format", "chrome", "m.kmt"])).unwrap();
    let marks: Vec<(&str, f64, &str)> = value["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["cat"] == "shell")
        .map(|e| {
            (
                e["name"].as_str().unwrap(),
                e["ts"].as_f64().unwrap(),
                e["s"].as_str().unwrap(),
            )
        })
        .collect();
    // By time, µs since record start (1,000 ns), global markers.
    assert_eq!(
        marks,
        [
            ("kmemtrace record start", 0.5, "g"),
            ("kmalloc 100 2", 2.0, "g")
        ]
    );
    let text = svg(&dir, &["timeline", "m.kmt"], "t.svg");
    assert!(text.contains("kmalloc 100 2"), "the marker's label");
    // check reads a dump with marks as sound (not an unknown record).
    let o = run(&dir, &["check", "--no-symbols", "m.kmt"]);
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
    assert!(
        stdout(&o).contains("0 of unknown kind skipped"),
        "{}",
        stdout(&o)
    );
}

/// The text of every `<text>` element of an SVG, in order.
fn svg_labels(svg: &str) -> Vec<String> {
    svg.split("<text")
        .skip(1)
        .filter_map(|part| {
            let body = part.split_once('>')?.1;
            Some(body.split("</text>").next()?.trim().to_string())
        })
        .collect()
}

#[test]
fn timeline_draws_the_events_not_the_typing_and_takes_a_window() {
    let dir = scratch("timeline_window");
    let mut d = DumpBuilder::new(1);
    d.cache(1, 64, "kmalloc-64");
    // Typed for 3.5 s, then 0.5 s of events.
    let ms = 1_000_000u64;
    d.cpu(
        0,
        0,
        &[
            alloc(0, 3_500 * ms, 0, SITE_A, P1, 64, 64, 1),
            alloc(0, 3_700 * ms, 1, SITE_A, P2, 64, 64, 1),
            free(0, 4_000 * ms, 2, SITE_A, P1, 64, 1),
        ],
    );
    d.raw_record(4, &mark_body(0, 0, "kmemtrace record start"))
        .raw_record(
            4,
            &mark_body(3_499 * ms, 0, "stress --cpus all --ops 200000 --seed 7"),
        )
        .raw_record(4, &mark_body(3_800 * ms, 0, "kfree all"));
    write(&dir, "w.kmt", &d.build());
    let labels = svg_labels(&svg(&dir, &["timeline", "w.kmt"], "default.svg"));
    // The axis spans the events (3,490 .. 4,010 ms), not the typing (the
    // y axis' ticks are below 200 bytes).
    let x_ticks = |labels: &[String]| -> Vec<f64> {
        labels
            .iter()
            .filter_map(|l| l.parse().ok())
            .filter(|&t: &f64| t > 200.0)
            .collect()
    };
    let ticks = x_ticks(&labels);
    assert!(!ticks.is_empty(), "{labels:?}");
    assert!(ticks.iter().all(|&t| t >= 3_480.0), "x ticks {ticks:?}");
    assert!(
        !labels.iter().any(|l| l == "kmemtrace record start"),
        "{labels:?}"
    );
    // A long command's label is cut with an ellipsis (was: cut silently).
    assert!(
        labels.iter().any(|l| l == "stress --cpus all --ops 200…"),
        "{labels:?}"
    );
    // --from a time: the typing is drawn again.
    let labels = svg_labels(&svg(
        &dir,
        &["timeline", "--from", "0ms", "w.kmt"],
        "all.svg",
    ));
    assert!(
        labels.iter().any(|l| l == "kmemtrace record start"),
        "{labels:?}"
    );
    // --from / --to a command of the record.
    let labels = svg_labels(&svg(
        &dir,
        &["timeline", "--from", "stress", "--to", "kfree all", "w.kmt"],
        "window.svg",
    ));
    let ticks = x_ticks(&labels);
    assert!(!ticks.is_empty(), "{labels:?}");
    assert!(
        ticks.iter().all(|&t| (3_499.0..=3_800.0).contains(&t)),
        "{ticks:?}"
    );
    for (args, message) in [
        (
            &["--from", "frob"][..],
            "--from: 'frob' is neither a time (1.5s, 250ms, 40us, 1000ns) nor a shell command \
             of the record (kmemtrace record start, stress --cpus all --ops 200000 --seed 7, kfree all)",
        ),
        (
            &["--from", "4s", "--to", "3s"][..],
            "--from 4.000 s is not before --to 3.000 s",
        ),
    ] {
        let mut all = vec!["timeline", "--no-symbols"];
        all.extend_from_slice(args);
        all.extend_from_slice(&["w.kmt", "-o", "bad.svg"]);
        let o = run(&dir, &all);
        assert_eq!(o.status.code(), Some(1), "{args:?}");
        assert!(stderr(&o).contains(message), "{args:?}: {}", stderr(&o));
    }
}
