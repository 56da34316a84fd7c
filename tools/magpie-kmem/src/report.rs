//! Text and JSON reports: `check`, `stat` (the `perf kmem stat` layout)
//! and `live` (objects outstanding at the end, grouped as illumos
//! `::findleaks` groups leaks; not a leak report: see [`live_text`]).

use std::cmp::Ordering;
use std::fmt::Write as _;

use magpie_slab::reports::Nanoseconds;

use serde_json::{Value, json};

use crate::analysis::{LiveGroup, Replay, Severity, Stat, fragmentation, live_groups};
use crate::dump::{Dump, EventKind};
use crate::symbols::Symbolizer;

/// `1234567` → `1,234,567`.
pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// What to say when the file holds several dumps (each `kmemtrace dump`
/// of a boot appends one): the last is analysed.
pub fn earlier_dumps_note(dump: &Dump) -> String {
    let n = dump.nr_earlier_dumps;
    format!(
        "{} dumps in the file; analysing the last, at offset {} ({} earlier dump{} read and skipped)",
        n + 1,
        dump.offset,
        n,
        if n == 1 { "" } else { "s" }
    )
}

/// Findings printed per class before `... and N more`.
const MAX_ISSUES_PER_CLASS: usize = 10;

/// The `check` report. `kernel` describes the ELF check (one line).
pub fn check_text(file: &str, dump: &Dump, replay: &Replay, kernel: &str) -> String {
    let h = &dump.header;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{file}: kmemtrace dump, ABI {}, {} CPUs, {} bytes",
        crate::dump::KMEMTRACE_ABI_VERSION,
        h.nr_cpus,
        dump.file_size
    );
    if dump.nr_earlier_dumps > 0 {
        let _ = writeln!(out, "  dumps     {}", earlier_dumps_note(dump));
    }
    let _ = writeln!(
        out,
        "  build id  {}",
        if h.has_build_id() {
            crate::dump::hex(&h.build_id)
        } else {
            "(none)".into()
        }
    );
    let _ = writeln!(out, "  kernel    {kernel}");
    let mut flags = Vec::new();
    if h.has_stacks() {
        flags.push(format!("stacks (depth {})", h.stack_depth));
    }
    if h.from_boot() {
        flags.push("from boot".to_string());
    }
    let _ = writeln!(
        out,
        "  flags     {}",
        if flags.is_empty() {
            "none".into()
        } else {
            flags.join(", ")
        }
    );
    let _ = writeln!(
        out,
        "  records   {} CACHE, {} STACK, {} CPU, {} of unknown kind skipped",
        dump.caches.len(),
        dump.stacks.len(),
        dump.cpu_records.len(),
        dump.skipped.len()
    );
    let count = |kind: EventKind| dump.events().filter(|e| e.kind == kind).count();
    let _ = writeln!(
        out,
        "  events    {} ({} alloc, {} free, {} failed alloc, {} bad free), {} overruns",
        dump.nr_events(),
        count(EventKind::Alloc),
        count(EventKind::Free),
        count(EventKind::FailedAlloc),
        count(EventKind::BadFree),
        dump.trailer.nr_overruns
    );
    for (cpu, c) in &replay.cpus {
        let seq = match c.seq_range {
            Some((a, b)) => format!("seq {a}..={b}"),
            None => "no events".into(),
        };
        let _ = writeln!(
            out,
            "  cpu {cpu:<5} {} events, {seq}, {} overruns, {} seq gaps",
            c.nr_events, c.nr_overruns, c.nr_seq_gaps
        );
    }
    let _ = writeln!(
        out,
        "  replay    {} live at the end, {} frees matched, {} ping-pong, {} unknown frees, {} double allocs",
        replay.live.len(),
        replay.nr_matched_frees,
        replay.nr_pingpong,
        replay.nr_unknown_frees,
        replay.nr_double_allocs
    );
    let mut shown: std::collections::BTreeMap<&str, usize> = Default::default();
    for issue in &replay.issues {
        let n = shown.entry(issue.class).or_default();
        *n += 1;
        if *n <= MAX_ISSUES_PER_CLASS {
            let tag = match issue.severity {
                Severity::Error => "error",
                Severity::Warning => "warning",
            };
            let _ = writeln!(out, "{tag}: {}", issue.message);
        }
    }
    for (class, n) in shown {
        if n > MAX_ISSUES_PER_CLASS {
            let _ = writeln!(
                out,
                "... and {} more {class} findings",
                n - MAX_ISSUES_PER_CLASS
            );
        }
    }
    let errors = replay.count(Severity::Error);
    let warnings = replay.count(Severity::Warning);
    let _ = writeln!(
        out,
        "check: {} ({errors} error{}, {warnings} warning{})",
        if errors > 0 { "FAILED" } else { "OK" },
        if errors == 1 { "" } else { "s" },
        if warnings == 1 { "" } else { "s" }
    );
    out
}

/// A `--sort` key (`perf kmem`'s, plus `req`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SortKey {
    /// Row key ascending (pointer).
    Ptr,
    /// Row key ascending (call site).
    Callsite,
    /// Bytes allocated, descending.
    Bytes,
    /// Bytes requested, descending.
    Req,
    /// Allocations, descending.
    Hit,
    /// Ping-pong frees, descending.
    Pingpong,
    /// Fragmentation, descending.
    Frag,
}

/// Parses `bytes,hit,frag`.
///
/// # Errors
///
/// A message naming the first word that is not a sort key.
pub fn parse_sort_keys(text: &str) -> Result<Vec<SortKey>, String> {
    text.split(',')
        .map(|k| match k.trim() {
            "ptr" => Ok(SortKey::Ptr),
            "callsite" => Ok(SortKey::Callsite),
            "bytes" => Ok(SortKey::Bytes),
            "req" => Ok(SortKey::Req),
            "hit" => Ok(SortKey::Hit),
            "pingpong" => Ok(SortKey::Pingpong),
            "frag" => Ok(SortKey::Frag),
            other => Err(format!(
                "unknown sort key {other:?} (keys: ptr, callsite, bytes, req, hit, pingpong, frag)"
            )),
        })
        .collect()
}

/// What `stat` prints.
#[derive(Debug, Clone)]
pub struct StatOptions {
    /// The per-call-site table.
    pub caller: bool,
    /// The per-pointer table.
    pub alloc: bool,
    /// The per-cache table.
    pub cache: bool,
    /// Row order.
    pub sort: Vec<SortKey>,
    /// Rows per table.
    pub top: Option<usize>,
}

fn sort_rows<K: Ord + Copy>(rows: &mut [(K, Stat)], keys: &[SortKey]) {
    rows.sort_by(|(ka, a), (kb, b)| {
        for key in keys {
            let o = match key {
                SortKey::Ptr | SortKey::Callsite => ka.cmp(kb),
                SortKey::Bytes => b.bytes_alloc.cmp(&a.bytes_alloc),
                SortKey::Req => b.bytes_req.cmp(&a.bytes_req),
                SortKey::Hit => b.hit.cmp(&a.hit),
                SortKey::Pingpong => b.pingpong.cmp(&a.pingpong),
                SortKey::Frag => b.frag().partial_cmp(&a.frag()).unwrap_or(Ordering::Equal),
            };
            if o != Ordering::Equal {
                return o;
            }
        }
        ka.cmp(kb)
    });
}

/// One printed row: its name, its source (or empty) and its totals.
struct Row {
    name: String,
    source: String,
    stat: Stat,
}

fn table(out: &mut String, title: &str, rows: &[Row], truncated: bool) {
    if !out.is_empty() {
        out.push('\n');
    }
    let width = rows
        .iter()
        .map(|r| r.name.len())
        .chain([34, title.len()])
        .max()
        .unwrap_or(34);
    let with_source = rows.iter().any(|r| !r.source.is_empty());
    let mut header = format!(
        " {title:<width$} | Total_alloc/Per | Total_req/Per   | Hit      | Ping-pong | Frag"
    );
    if with_source {
        header.push_str("    | Source");
    }
    let dashes = "-".repeat(header.len().max(105));
    let _ = writeln!(out, "{dashes}");
    let _ = writeln!(out, "{header}");
    let _ = writeln!(out, "{dashes}");
    for row in rows {
        let s = &row.stat;
        let per = |total: u64| total.checked_div(s.hit).unwrap_or(0);
        let mut line = format!(
            " {:<width$} | {:>9}/{:<5} | {:>9}/{:<5} | {:>8} | {:>9} | {:>6.3}%",
            row.name,
            s.bytes_alloc,
            per(s.bytes_alloc),
            s.bytes_req,
            per(s.bytes_req),
            s.hit,
            s.pingpong,
            s.frag()
        );
        if with_source {
            let _ = write!(line, " | {}", row.source);
        }
        let _ = writeln!(out, "{line}");
    }
    if truncated {
        let _ = writeln!(
            out,
            " {:<width$} | ...             | ...             | ...      | ...       | ...",
            "..."
        );
    }
    let _ = writeln!(out, "{dashes}");
}

fn take<K: Ord + Copy>(
    map: &std::collections::BTreeMap<K, Stat>,
    opts: &StatOptions,
) -> (Vec<(K, Stat)>, bool) {
    // Rows with no allocation in the record (frees only) carry nothing.
    let mut rows: Vec<(K, Stat)> = map
        .iter()
        .filter(|(_, s)| s.hit > 0)
        .map(|(k, s)| (*k, *s))
        .collect();
    sort_rows(&mut rows, &opts.sort);
    let truncated = opts.top.is_some_and(|n| rows.len() > n);
    if let Some(n) = opts.top {
        rows.truncate(n);
    }
    (rows, truncated)
}

/// The `stat` report.
pub fn stat_text(dump: &Dump, replay: &Replay, sym: &Symbolizer, opts: &StatOptions) -> String {
    let mut out = String::new();
    if opts.caller {
        let (rows, truncated) = take(&replay.callsites, opts);
        let rows: Vec<Row> = rows
            .into_iter()
            .map(|(addr, stat)| {
                let site = sym.site(addr);
                Row {
                    source: site.source(),
                    name: site.name,
                    stat,
                }
            })
            .collect();
        table(&mut out, "Callsite", &rows, truncated);
    }
    if opts.alloc {
        let (rows, truncated) = take(&replay.ptrs, opts);
        let rows: Vec<Row> = rows
            .into_iter()
            .map(|(ptr, stat)| Row {
                name: format!("{ptr:#x}"),
                source: String::new(),
                stat,
            })
            .collect();
        table(&mut out, "Alloc Ptr", &rows, truncated);
    }
    if opts.cache {
        let (rows, truncated) = take(&replay.caches, opts);
        let rows: Vec<Row> = rows
            .into_iter()
            .map(|(id, stat)| Row {
                name: dump.cache_name(id),
                source: String::new(),
                stat,
            })
            .collect();
        table(&mut out, "Cache", &rows, truncated);
    }
    summary_text(&mut out, replay);
    out
}

fn summary_text(out: &mut String, r: &Replay) {
    let _ = writeln!(out, "\nSUMMARY (magpie-slab)");
    let _ = writeln!(out, "=====================");
    let _ = writeln!(
        out,
        "Total bytes requested: {}",
        thousands(r.total_requested)
    );
    let _ = writeln!(
        out,
        "Total bytes allocated: {}",
        thousands(r.total_allocated)
    );
    let _ = writeln!(out, "Total bytes freed:     {}", thousands(r.total_freed));
    let net = i128::from(r.total_allocated) - i128::from(r.total_freed);
    let _ = writeln!(
        out,
        "Net total bytes allocated: {}{}",
        if net < 0 { "-" } else { "" },
        thousands(net.unsigned_abs() as u64)
    );
    let _ = writeln!(
        out,
        "Total bytes wasted on internal fragmentation: {}",
        thousands(r.total_allocated.saturating_sub(r.total_requested))
    );
    let _ = writeln!(
        out,
        "Internal fragmentation: {:.6}%",
        fragmentation(r.total_requested, r.total_allocated)
    );
    let _ = writeln!(
        out,
        "Cross CPU frees (ping-pong): {}/{}",
        thousands(r.nr_pingpong),
        thousands(r.nr_matched_frees)
    );
    let _ = writeln!(
        out,
        "Allocations: {} ({} failed); frees: {} ({} of pointers not allocated in the record); bad frees: {}",
        thousands(r.nr_allocs),
        thousands(r.nr_failed_allocs),
        thousands(r.nr_frees),
        thousands(r.nr_unknown_frees),
        thousands(r.nr_bad_frees)
    );
    let _ = writeln!(
        out,
        "Live at the end: {} objects; events lost to overruns: {}",
        thousands(r.live.len() as u64),
        thousands(r.nr_overruns())
    );
}

fn stat_json_row(stat: &Stat) -> serde_json::Map<String, Value> {
    let mut m = serde_json::Map::new();
    m.insert("hit".into(), json!(stat.hit));
    m.insert("bytes_alloc".into(), json!(stat.bytes_alloc));
    m.insert("bytes_req".into(), json!(stat.bytes_req));
    m.insert("pingpong".into(), json!(stat.pingpong));
    m.insert("frees".into(), json!(stat.frees));
    m.insert("frag_percent".into(), json!(stat.frag()));
    m
}

/// The `stat --json` report: the same tables and summary as the text.
pub fn stat_json(dump: &Dump, replay: &Replay, sym: &Symbolizer, opts: &StatOptions) -> Value {
    let mut top = serde_json::Map::new();
    if opts.caller {
        let (rows, _) = take(&replay.callsites, opts);
        let rows: Vec<Value> = rows
            .into_iter()
            .map(|(addr, stat)| {
                let site = sym.site(addr);
                let mut m = stat_json_row(&stat);
                m.insert("call_site".into(), json!(format!("{addr:#x}")));
                m.insert("function".into(), json!(site.name));
                m.insert("location".into(), json!(site.location));
                m.insert("func".into(), json!(site.function));
                Value::Object(m)
            })
            .collect();
        top.insert("callsites".into(), Value::Array(rows));
    }
    if opts.alloc {
        let (rows, _) = take(&replay.ptrs, opts);
        let rows: Vec<Value> = rows
            .into_iter()
            .map(|(ptr, stat)| {
                let mut m = stat_json_row(&stat);
                m.insert("ptr".into(), json!(format!("{ptr:#x}")));
                Value::Object(m)
            })
            .collect();
        top.insert("allocs".into(), Value::Array(rows));
    }
    if opts.cache {
        let (rows, _) = take(&replay.caches, opts);
        let rows: Vec<Value> = rows
            .into_iter()
            .map(|(id, stat)| {
                let mut m = stat_json_row(&stat);
                m.insert("cache_id".into(), json!(id));
                m.insert("name".into(), json!(dump.cache_name(id)));
                Value::Object(m)
            })
            .collect();
        top.insert("caches".into(), Value::Array(rows));
    }
    let r = replay;
    top.insert(
        "summary".into(),
        json!({
            "bytes_requested": r.total_requested,
            "bytes_allocated": r.total_allocated,
            "bytes_freed": r.total_freed,
            "net_bytes_allocated": i128::from(r.total_allocated) - i128::from(r.total_freed),
            "bytes_wasted": r.total_allocated.saturating_sub(r.total_requested),
            "frag_percent": fragmentation(r.total_requested, r.total_allocated),
            "pingpong_frees": r.nr_pingpong,
            "matched_frees": r.nr_matched_frees,
            "allocs": r.nr_allocs,
            "failed_allocs": r.nr_failed_allocs,
            "frees": r.nr_frees,
            "unknown_frees": r.nr_unknown_frees,
            "bad_frees": r.nr_bad_frees,
            "live_objects": r.live.len(),
            "overruns": r.nr_overruns(),
        }),
    );
    Value::Object(top)
}

/// Notes that qualify the `live` report (printed before it).
pub fn live_caveats(dump: &Dump, replay: &Replay) -> Vec<String> {
    let mut notes = Vec::new();
    if !dump.header.from_boot() {
        notes.push(
            "recording did not begin at boot: objects allocated before `record start` are not seen"
                .to_string(),
        );
    }
    if replay.nr_overruns() > 0 {
        notes.push(format!(
            "{} events were lost to overruns: an object listed may have been freed by a lost event",
            replay.nr_overruns()
        ));
    }
    notes
}

/// The `live` report: objects outstanding at the end of the record.
/// `verbose` lists every buffer.
pub fn live_text(dump: &Dump, replay: &Replay, sym: &Symbolizer, verbose: bool) -> String {
    let groups = live_groups(replay);
    let mut out = String::new();
    let cache_width = groups
        .iter()
        .map(|g| dump.cache_name(g.cache_id).len())
        .chain([16])
        .max()
        .unwrap_or(16);
    let header = format!(
        "{:<cache_width$} {:>8} {:>12}  {:<18}  CALLER",
        "CACHE", "LIVE", "BYTES", "BUFFER"
    );
    let dashes = "-".repeat(header.len() + 34);
    let _ = writeln!(out, "{header}");
    for g in &groups {
        let site = sym.site(g.call_site);
        let mut caller = site.name.clone();
        if site.location.is_some() {
            let _ = write!(caller, "  {}", site.source());
        }
        let _ = writeln!(
            out,
            "{:<cache_width$} {:>8} {:>12}  {:<18}  {caller}",
            dump.cache_name(g.cache_id),
            g.ptrs.len(),
            g.bytes_alloc,
            format!("{:#x}", g.ptrs[0]),
        );
        if g.stack_id != 0 {
            let frames = dump
                .stacks
                .get(&g.stack_id)
                .map(Vec::as_slice)
                .unwrap_or(&[]);
            let _ = writeln!(out, "    allocated at:");
            for (i, &frame) in frames.iter().enumerate() {
                let site = sym.site(frame);
                let _ = writeln!(
                    out,
                    "      #{i:<2} [{frame:#018x}] {}{}",
                    site.name,
                    site.location
                        .as_ref()
                        .map(|_| format!("  {}", site.source()))
                        .unwrap_or_default()
                );
            }
        }
        if verbose {
            for ptr in &g.ptrs {
                let e = &replay.live[ptr];
                let _ = writeln!(
                    out,
                    "    {ptr:#x}  {} bytes (requested {}), cpu {}, at {}",
                    e.bytes_alloc,
                    e.bytes_req,
                    e.cpu,
                    Nanoseconds(e.timestamp_ns)
                );
            }
        }
    }
    let _ = writeln!(out, "{dashes}");
    let total_objects: usize = groups.iter().map(|g| g.ptrs.len()).sum();
    let total_bytes: u64 = groups.iter().map(|g| g.bytes_alloc).sum();
    let _ = writeln!(
        out,
        "   Total {:>8} object{}, {} bytes in {} group{}",
        total_objects,
        if total_objects == 1 { "" } else { "s" },
        thousands(total_bytes),
        groups.len(),
        if groups.len() == 1 { "" } else { "s" }
    );
    out
}

fn live_group_json(dump: &Dump, replay: &Replay, sym: &Symbolizer, g: &LiveGroup) -> Value {
    let site = sym.site(g.call_site);
    let stack: Vec<Value> = dump
        .stacks
        .get(&g.stack_id)
        .map(Vec::as_slice)
        .unwrap_or(&[])
        .iter()
        .map(|&frame| {
            let s = sym.site(frame);
            json!({"address": format!("{frame:#x}"), "function": s.name, "location": s.location})
        })
        .collect();
    let objects: Vec<Value> = g
        .ptrs
        .iter()
        .map(|ptr| {
            let e = &replay.live[ptr];
            json!({
                "ptr": format!("{ptr:#x}"),
                "bytes_alloc": e.bytes_alloc,
                "bytes_req": e.bytes_req,
                "cpu": e.cpu,
                "timestamp_ns": e.timestamp_ns,
            })
        })
        .collect();
    json!({
        "cache_id": g.cache_id,
        "cache": dump.cache_name(g.cache_id),
        "call_site": format!("{:#x}", g.call_site),
        "function": site.name,
        "location": site.location,
        "func": site.function,
        "stack_id": g.stack_id,
        "stack": stack,
        "nr_objects": g.ptrs.len(),
        "bytes_alloc": g.bytes_alloc,
        "bytes_req": g.bytes_req,
        "objects": objects,
    })
}

/// The `live --json` report.
pub fn live_json(dump: &Dump, replay: &Replay, sym: &Symbolizer) -> Value {
    let groups = live_groups(replay);
    let total_bytes: u64 = groups.iter().map(|g| g.bytes_alloc).sum();
    json!({
        "groups": groups.iter().map(|g| live_group_json(dump, replay, sym, g)).collect::<Vec<_>>(),
        "nr_objects": replay.live.len(),
        "bytes_alloc": total_bytes,
        "caveats": live_caveats(dump, replay),
    })
}
