//! Exports for other people's tools: Chrome trace-event JSON (Perfetto UI,
//! `chrome://tracing`), speedscope JSON, and folded stacks (`inferno`,
//! Brendan Gregg's `flamegraph.pl`, speedscope's import).
//!
//! - **Chrome trace events** (the "Trace Event Format" document): one
//!   process, `magpie kernel`; one thread per CPU (`cpu N`, `tid` = CPU + 1:
//!   Perfetto's JSON importer drops a thread-scoped instant on `tid` 0 as
//!   a parse failure, `json_trace_parser_impl.cc`);
//!   each alloc and free an instant event (`ph: "I"`, Chrome's own
//!   `TRACE_EVENT_PHASE_INSTANT`: Perfetto reads `i` and `I`, Chrome
//!   DevTools' trace engine only `I`; thread scope) named
//!   `alloc CACHE` / `free CACHE` with the pointer, sizes and call site as
//!   arguments; each cache's live bytes a counter track (`ph: "C"`,
//!   `live bytes CACHE`), one sample per change. Times are microseconds
//!   since `record start` (the format's unit; fractional, so ns survive).
//!   The shell's command lines (MARK records) and `record start` are
//!   global instant events (`s: "g"`, category `shell`): markers across
//!   every track.
//! - **speedscope** (its published JSON schema, `file-format-schema.json`):
//!   one `sampled` profile in `bytes`, one sample per distinct stack
//!   weighted by the bytes it allocated (or, `live`, still holds), the
//!   cache as the leaf frame (the frames of the flamegraph).
//! - **Folded stacks**: `root;...;leaf BYTES`, the lines
//!   [`crate::graphs::folded_stacks`] feeds the flamegraph.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::analysis::Replay;
use crate::dump::{DecodedEvent, Dump, EventKind};
use crate::graphs;
use crate::symbols::Symbolizer;

/// The formats `magpie-kmem export` writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Chrome trace-event JSON (Perfetto UI, `chrome://tracing`).
    Chrome,
    /// speedscope's JSON file format.
    Speedscope,
    /// Folded stacks, `frame;frame BYTES` per line.
    Folded,
}

impl Format {
    /// The format named `chrome`, `speedscope` or `folded`.
    ///
    /// # Errors
    ///
    /// A message naming the formats when `name` is none of them.
    pub fn parse(name: &str) -> Result<Format, String> {
        match name {
            "chrome" | "perfetto" => Ok(Format::Chrome),
            "speedscope" => Ok(Format::Speedscope),
            "folded" => Ok(Format::Folded),
            other => Err(format!(
                "unknown export format '{other}' (chrome, speedscope, folded)"
            )),
        }
    }
}

/// Writes the dump in `format`; `live` chooses bytes still live at the
/// end instead of all bytes allocated (speedscope and folded stacks).
///
/// # Errors
///
/// A message when there is nothing to export (no allocation), or JSON's.
pub fn export(
    dump: &Dump,
    replay: &Replay,
    sym: &Symbolizer,
    format: Format,
    live: bool,
) -> Result<Vec<u8>, String> {
    let text = match format {
        Format::Chrome => to_json(&chrome(dump, sym))?,
        Format::Speedscope => to_json(&speedscope(dump, replay, sym, live)?)?,
        Format::Folded => {
            let lines = graphs::folded_stacks(dump, replay, sym, live);
            if lines.is_empty() {
                return Err("no allocation to export".into());
            }
            lines.join("\n") + "\n"
        }
    };
    Ok(text.into_bytes())
}

fn to_json(value: &Value) -> Result<String, String> {
    serde_json::to_string(value)
        .map(|text| text + "\n")
        .map_err(|e| e.to_string())
}

/// Microseconds since `record start`, as the trace-event format wants them.
fn micros(dump: &Dump, ns: u64) -> f64 {
    ns.saturating_sub(dump.header.record_start_ns) as f64 / 1000.0
}

/// The Chrome trace-event JSON object (see the module doc).
pub fn chrome(dump: &Dump, sym: &Symbolizer) -> Value {
    const PID: u32 = 1;
    let tid = |cpu: u32| cpu + 1;
    let mut events = vec![json!({
        "ph": "M", "pid": PID, "name": "process_name", "args": { "name": "magpie kernel" }
    })];
    let mut cpus: Vec<u32> = dump.cpu_records.iter().map(|r| r.cpu).collect();
    cpus.sort_unstable();
    cpus.dedup();
    for cpu in &cpus {
        events.push(json!({
            "ph": "M", "pid": PID, "tid": tid(*cpu), "name": "thread_name",
            "args": { "name": format!("cpu {cpu}") }
        }));
    }
    events.push(json!({
        "ph": "I", "s": "g", "pid": PID, "tid": tid(cpus.first().copied().unwrap_or(0)), "ts": 0.0,
        "name": "record start"
    }));
    // What the shell ran, as global markers (Perfetto draws them across
    // every track).
    for mark in &dump.marks {
        events.push(json!({
            "ph": "I", "s": "g", "pid": PID, "tid": tid(mark.cpu), "cat": "shell",
            "ts": micros(dump, mark.timestamp_ns), "name": mark.text,
        }));
    }
    let mut names: BTreeMap<u64, String> = BTreeMap::new();
    let mut live: BTreeMap<u32, i64> = BTreeMap::new();
    let mut sizes: BTreeMap<u64, (u32, u64)> = BTreeMap::new();
    for e in dump.merged_events() {
        let cache = dump.cache_name(e.cache_id);
        let ts = micros(dump, e.timestamp_ns);
        let site = names
            .entry(e.call_site)
            .or_insert_with(|| sym.site(e.call_site).name)
            .clone();
        let (verb, delta) = match e.kind {
            EventKind::Alloc => {
                sizes.insert(e.ptr, (e.cache_id, e.bytes_alloc));
                ("alloc", e.bytes_alloc as i64)
            }
            EventKind::Free => match sizes.remove(&e.ptr) {
                Some((cache_id, bytes)) if cache_id == e.cache_id => ("free", -(bytes as i64)),
                _ => ("free", 0),
            },
            EventKind::FailedAlloc => ("alloc failed", 0),
            EventKind::BadFree => ("bad free", 0),
        };
        events.push(instant(
            e,
            PID,
            tid(u32::from(e.cpu)),
            ts,
            &format!("{verb} {cache}"),
            &site,
        ));
        if delta != 0 {
            let value = live.entry(e.cache_id).or_default();
            *value += delta;
            events.push(json!({
                "ph": "C", "pid": PID, "tid": tid(u32::from(e.cpu)), "ts": ts,
                "name": format!("live bytes {cache}"), "args": { "bytes": *value }
            }));
        }
    }
    json!({
        "traceEvents": events,
        "displayTimeUnit": "ns",
        "otherData": {
            "producer": concat!("magpie-kmem ", env!("CARGO_PKG_VERSION")),
            "build_id": crate::dump::hex(&dump.header.build_id),
            "record_start_ns": dump.header.record_start_ns,
        }
    })
}

fn instant(e: &DecodedEvent, pid: u32, tid: u32, ts: f64, name: &str, site: &str) -> Value {
    json!({
        "ph": "I", "s": "t", "pid": pid, "tid": tid, "ts": ts, "name": name,
        "cat": "kmem",
        "args": {
            "ptr": format!("{:#x}", e.ptr),
            "bytes_req": e.bytes_req,
            "bytes_alloc": e.bytes_alloc,
            "call_site": site,
        }
    })
}

/// The speedscope JSON object (see the module doc).
///
/// # Errors
///
/// A message when there is no allocation to export.
pub fn speedscope(
    dump: &Dump,
    replay: &Replay,
    sym: &Symbolizer,
    live: bool,
) -> Result<Value, String> {
    let lines = graphs::folded_stacks(dump, replay, sym, live);
    if lines.is_empty() {
        return Err("no allocation to export".into());
    }
    let mut frames: Vec<Value> = Vec::new();
    let mut index: BTreeMap<String, usize> = BTreeMap::new();
    let mut samples = Vec::with_capacity(lines.len());
    let mut weights = Vec::with_capacity(lines.len());
    let mut total = 0u64;
    for line in &lines {
        let (stack, weight) = line.rsplit_once(' ').unwrap_or((line, "0"));
        let weight: u64 = weight.parse().unwrap_or(0);
        let sample: Vec<usize> = stack
            .split(';')
            .map(|name| {
                *index.entry(name.to_string()).or_insert_with(|| {
                    frames.push(json!({ "name": name }));
                    frames.len() - 1
                })
            })
            .collect();
        samples.push(sample);
        weights.push(weight);
        total += weight;
    }
    let what = if live {
        "bytes live at the end of the record"
    } else {
        "bytes allocated"
    };
    Ok(json!({
        "$schema": "https://www.speedscope.app/file-format-schema.json",
        "shared": { "frames": frames },
        "profiles": [{
            "type": "sampled",
            "name": format!("magpie-kmem: {what}, by stack"),
            "unit": "bytes",
            "startValue": 0,
            "endValue": total,
            "samples": samples,
            "weights": weights,
        }],
        "name": format!("magpie-kmem: {what}"),
        "activeProfileIndex": 0,
        "exporter": concat!("magpie-kmem ", env!("CARGO_PKG_VERSION")),
    }))
}
