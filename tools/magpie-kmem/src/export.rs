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
//!   every track. A recording with stacks carries them as the format's
//!   `stackFrames` and each event's `sf`. [`write_chrome`] streams it.
//! - **speedscope** (its published JSON schema, `file-format-schema.json`):
//!   one `sampled` profile in `bytes`, one sample per distinct stack
//!   weighted by the bytes it allocated (or, `live`, still holds), the
//!   cache as the leaf frame (the frames of the flamegraph).
//! - **Folded stacks**: `root;...;leaf BYTES`, the lines
//!   [`crate::graphs::folded_stacks`] feeds the flamegraph.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;

use serde_json::{Value, json};

use crate::analysis::Replay;
use crate::dump::{Dump, EventKind};
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
        Format::Chrome => to_json(&chrome(dump, sym)?)?,
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

/// Microseconds since `record start` as JSON text with the nanoseconds
/// kept (`1.234`): exact, where an `f64` would round.
fn micros_text(dump: &Dump, ns: u64) -> String {
    let ns = ns.saturating_sub(dump.header.record_start_ns);
    format!("{}.{:03}", ns / 1000, ns % 1000)
}

/// `text` as a JSON string literal.
fn json_string(text: &str) -> String {
    Value::String(text.to_string()).to_string()
}

/// Dumps with at least this many events report their progress on stderr.
pub const PROGRESS_MIN_EVENTS: usize = 100_000;

/// The Chrome trace-event JSON (see the module doc), streamed to `out`:
/// one event at a time, so memory stays that of the dump (a 360k-event
/// dump writes ~110 MB in ~100 MB of memory). `progress` is called with
/// (events written, events) every tenth of a dump of at least
/// [`PROGRESS_MIN_EVENTS`] events. A recording with stacks
/// (`record start --stacks`) carries them: the format's `stackFrames`
/// tree (one node per distinct frame under its caller) and each event's
/// `sf`, its innermost frame.
///
/// # Errors
///
/// Those of `out`.
pub fn write_chrome(
    dump: &Dump,
    sym: &Symbolizer,
    out: &mut dyn Write,
    progress: &mut dyn FnMut(usize, usize),
) -> std::io::Result<()> {
    const PID: u32 = 1;
    let tid = |cpu: u32| cpu + 1;
    out.write_all(b"{\"traceEvents\":[\n")?;
    write!(
        out,
        "{}",
        json!({"ph": "M", "pid": PID, "name": "process_name", "args": { "name": "magpie kernel" }})
    )?;
    let mut cpus: Vec<u32> = dump.cpu_records.iter().map(|r| r.cpu).collect();
    cpus.sort_unstable();
    cpus.dedup();
    for cpu in &cpus {
        write!(
            out,
            ",\n{}",
            json!({
                "ph": "M", "pid": PID, "tid": tid(*cpu), "name": "thread_name",
                "args": { "name": format!("cpu {cpu}") }
            })
        )?;
    }
    write!(
        out,
        ",\n{}",
        json!({
            "ph": "I", "s": "g", "pid": PID, "tid": tid(cpus.first().copied().unwrap_or(0)),
            "ts": 0.0, "name": "record start"
        })
    )?;
    // What the shell ran, as global markers (Perfetto draws them across
    // every track).
    for mark in &dump.marks {
        write!(
            out,
            ",\n{{\"ph\":\"I\",\"s\":\"g\",\"pid\":{PID},\"tid\":{},\"cat\":\"shell\",\"ts\":{},\"name\":{}}}",
            tid(mark.cpu),
            micros_text(dump, mark.timestamp_ns),
            json_string(&mark.text)
        )?;
    }
    let stack_frames = StackFrames::of(dump, sym);
    let mut names: HashMap<u64, String> = HashMap::new();
    let mut cache_names: HashMap<u32, (String, String)> = HashMap::new();
    let mut live: HashMap<u32, i64> = HashMap::new();
    let mut sizes: HashMap<u64, (u32, u64)> = HashMap::new();
    let events = dump.merged_events();
    let total = events.len();
    let step = if total >= PROGRESS_MIN_EVENTS {
        total.div_ceil(10)
    } else {
        usize::MAX
    };
    for (index, e) in events.iter().enumerate() {
        let (alloc_name, live_name) = cache_names.entry(e.cache_id).or_insert_with(|| {
            let cache = dump.cache_name(e.cache_id);
            (
                json_string(&format!("alloc {cache}")),
                json_string(&format!("live bytes {cache}")),
            )
        });
        let site = names
            .entry(e.call_site)
            .or_insert_with(|| json_string(&sym.site(e.call_site).name));
        let ts = micros_text(dump, e.timestamp_ns);
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
        // The name: the cached `"alloc CACHE"` with its verb swapped in.
        let name = if verb == "alloc" {
            alloc_name.clone()
        } else {
            format!("\"{verb}{}", &alloc_name[1 + "alloc".len()..])
        };
        write!(
            out,
            ",\n{{\"ph\":\"I\",\"s\":\"t\",\"pid\":{PID},\"tid\":{},\"ts\":{ts},\"name\":{name},\"cat\":\"kmem\",",
            tid(u32::from(e.cpu)),
        )?;
        if let Some(node) = stack_frames.leaf(e.stack_id) {
            write!(out, "\"sf\":\"{node}\",")?;
        }
        write!(
            out,
            "\"args\":{{\"ptr\":\"{:#x}\",\"bytes_req\":{},\"bytes_alloc\":{},\"call_site\":{site}}}}}",
            e.ptr, e.bytes_req, e.bytes_alloc
        )?;
        if delta != 0 {
            let value = live.entry(e.cache_id).or_default();
            *value += delta;
            write!(
                out,
                ",\n{{\"ph\":\"C\",\"pid\":{PID},\"tid\":{},\"ts\":{ts},\"name\":{live_name},\"args\":{{\"bytes\":{value}}}}}",
                tid(u32::from(e.cpu)),
            )?;
        }
        if (index + 1) % step == 0 || (step != usize::MAX && index + 1 == total) {
            progress(index + 1, total);
        }
    }
    out.write_all(b"\n],\n\"stackFrames\":")?;
    stack_frames.write(out)?;
    write!(
        out,
        ",\n\"displayTimeUnit\":\"ns\",\n\"otherData\":{}}}\n",
        json!({
            "producer": concat!("magpie-kmem ", env!("CARGO_PKG_VERSION")),
            "build_id": crate::dump::hex(&dump.header.build_id),
            "record_start_ns": dump.header.record_start_ns,
        })
    )?;
    out.flush()
}

/// The trace-event format's `stackFrames`: every recorded stack as a path
/// from its outermost frame, one node per distinct (caller node, frame).
struct StackFrames {
    /// Nodes: (parent node, frame's JSON name); node N is `nodes[N - 1]`.
    nodes: Vec<(usize, String)>,
    /// Stack id to its innermost frame's node.
    leaves: HashMap<u32, usize>,
}

impl StackFrames {
    fn of(dump: &Dump, sym: &Symbolizer) -> StackFrames {
        let mut nodes = Vec::new();
        let mut index: HashMap<(usize, u64), usize> = HashMap::new();
        let mut leaves = HashMap::new();
        let depth = dump.header.stack_depth as usize;
        for (&id, frames) in &dump.stacks {
            let mut parent = 0;
            if graphs::is_truncated(frames, depth) {
                parent = *index.entry((0, 0)).or_insert_with(|| {
                    nodes.push((0, json_string(graphs::TRUNCATED_FRAME)));
                    nodes.len()
                });
            }
            for &frame in frames.iter().rev() {
                parent = *index.entry((parent, frame)).or_insert_with(|| {
                    nodes.push((parent, json_string(&sym.site(frame).name)));
                    nodes.len()
                });
            }
            if parent != 0 {
                leaves.insert(id, parent);
            }
        }
        StackFrames { nodes, leaves }
    }

    fn leaf(&self, stack_id: u32) -> Option<usize> {
        if stack_id == 0 {
            return None;
        }
        self.leaves.get(&stack_id).copied()
    }

    fn write(&self, out: &mut dyn Write) -> std::io::Result<()> {
        out.write_all(b"{")?;
        for (index, (parent, name)) in self.nodes.iter().enumerate() {
            if index > 0 {
                out.write_all(b",")?;
            }
            write!(
                out,
                "\n\"{}\":{{\"category\":\"kernel\",\"name\":{name}",
                index + 1
            )?;
            if *parent != 0 {
                write!(out, ",\"parent\":\"{parent}\"")?;
            }
            out.write_all(b"}")?;
        }
        out.write_all(b"}")
    }
}

/// The Chrome trace-event JSON object (see the module doc), in memory:
/// [`write_chrome`] parsed back.
///
/// # Errors
///
/// Never in practice (the writer is a `Vec`); JSON's if the text were bad.
pub fn chrome(dump: &Dump, sym: &Symbolizer) -> Result<Value, String> {
    let mut bytes = Vec::new();
    write_chrome(dump, sym, &mut bytes, &mut |_, _| {}).map_err(|e| e.to_string())?;
    serde_json::from_slice(&bytes).map_err(|e| e.to_string())
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
