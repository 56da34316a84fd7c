//! Pictures: a flamegraph of bytes by stack (`inferno`) and a timeline of
//! live bytes per cache (`plotters`, SVG backend).

use std::collections::BTreeMap;

use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::analysis::Replay;
use crate::dump::{DecodedEvent, Dump};
use crate::symbols::Symbolizer;
use magpie_slab::reports::Nanoseconds;

/// Where a flamegraph shows the cache an allocation came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CacheFrames {
    /// As a leaf frame `[cache]` under the call site: a site that
    /// allocates from many caches splits into one sliver per cache.
    #[default]
    Leaf,
    /// As a label of the call site's frame (`alloc [kmalloc-64]`, or
    /// `alloc [30 caches: kmalloc-8 … kmalloc-512]`): one box per site.
    Label,
}

/// The root frame put above a stack cut at the recorded depth (its
/// outermost frames were not recorded: what looks like its root is not).
pub const TRUNCATED_FRAME: &str = "[truncated]";

/// Whether a recorded stack was cut at the recording's depth `depth`
/// (`record start --stacks DEPTH`): it holds `depth` frames, so the walk
/// stopped before the stack's root.
pub fn is_truncated(frames: &[u64], depth: usize) -> bool {
    depth > 0 && frames.len() >= depth
}

/// Frames of the allocation machinery: Rust's collections and `alloc`
/// (a `Vec` growing goes through about ten of them), the global
/// allocator's glue and the slab library. Folded away by default.
const PLUMBING: &[&str] = &[
    "<Vec",
    "<RawVec",
    "<VecDeque",
    "<Box",
    "<String",
    "<BTreeMap",
    "<BTreeSet",
    "<hashbrown",
    "<Global",
    "<alloc::",
    "alloc::",
    "core::alloc::",
    "__rust_",
    "__rdl_",
    "<magpie_slab::",
    "magpie_slab::",
    "<KernelAllocator",
];

/// Whether a frame's name is allocation plumbing: Rust's collections and
/// `alloc`, the global allocator's glue, the slab library.
pub fn is_plumbing(name: &str) -> bool {
    PLUMBING.iter().any(|prefix| name.starts_with(prefix))
}

/// Folds the run of plumbing frames at the leaf end of `frames` (root
/// first) into its first frame, the call the caller made; a stack of
/// nothing but plumbing stays as it is.
pub fn fold_plumbing(frames: &mut Vec<String>) {
    let mut start = frames.len();
    while start > 0 && is_plumbing(&frames[start - 1]) {
        start -= 1;
    }
    if start > 0 && start + 1 < frames.len() {
        frames.truncate(start + 1);
    }
}

/// What the flamegraph (and the stack exports) draw.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StackOptions {
    /// Where the cache goes.
    pub caches: CacheFrames,
    /// Keep the allocation plumbing frames (by default the run of them at
    /// the leaf end of a stack is folded into its outermost frame, the
    /// call the caller made: `hold_room;<Vec>::try_reserve`).
    pub keep_plumbing: bool,
}

/// One folded stack's frames (outermost first) for an alloc event: the
/// recorded stack when there is one, else the call site. A stack cut at
/// the recorded depth gets [`TRUNCATED_FRAME`] as its root.
fn frames_of(
    dump: &Dump,
    sym: &Symbolizer,
    e: &DecodedEvent,
    memo: &mut BTreeMap<u64, Vec<String>>,
    keep_plumbing: bool,
) -> Vec<String> {
    let mut out = Vec::new();
    let addresses: Vec<u64> = match dump.stacks.get(&e.stack_id) {
        Some(frames) if e.stack_id != 0 && !frames.is_empty() => {
            if is_truncated(frames, dump.header.stack_depth as usize) {
                out.push(TRUNCATED_FRAME.to_string());
            }
            frames.clone()
        }
        _ => vec![e.call_site],
    };
    // Stacks are innermost first; a flamegraph wants the root first.
    for addr in addresses.iter().rev() {
        let names = memo.entry(*addr).or_insert_with(|| sym.frames(*addr));
        out.extend(names.iter().map(|n| n.replace(';', ":")));
    }
    if !keep_plumbing {
        fold_plumbing(&mut out);
    }
    out
}

/// The label of a site that allocated from `caches` (sorted by object
/// size, as the kmalloc names sort people expect).
fn cache_label(dump: &Dump, caches: &std::collections::BTreeSet<u32>) -> String {
    let mut named: Vec<(u64, String)> = caches
        .iter()
        .map(|&id| {
            let size = dump.caches.get(&id).map_or(0, |c| u64::from(c.obj_size));
            (size, dump.cache_name(id))
        })
        .collect();
    named.sort();
    match named.as_slice() {
        [(_, only)] => format!("[{only}]"),
        [(_, first), .., (_, last)] => format!("[{} caches: {first} … {last}]", named.len()),
        [] => String::new(),
    }
}

/// Folded stacks (`root;...;leaf BYTES`), sorted: bytes allocated by each
/// stack over the whole record, or (`live`) bytes of objects still live at
/// the end; the cache a leaf frame (the default) or the site's label.
pub fn folded_stacks(dump: &Dump, replay: &Replay, sym: &Symbolizer, live: bool) -> Vec<String> {
    folded_stacks_with(dump, replay, sym, live, StackOptions::default())
}

/// [`folded_stacks`] drawn as `options` say.
pub fn folded_stacks_with(
    dump: &Dump,
    replay: &Replay,
    sym: &Symbolizer,
    live: bool,
    options: StackOptions,
) -> Vec<String> {
    let caches = options.caches;
    let mut memo = BTreeMap::new();
    let mut weights: BTreeMap<Vec<String>, (u64, std::collections::BTreeSet<u32>)> =
        BTreeMap::new();
    let mut add = |e: &DecodedEvent| {
        let mut frames = frames_of(dump, sym, e, &mut memo, options.keep_plumbing);
        if caches == CacheFrames::Leaf {
            frames.push(format!("[{}]", dump.cache_name(e.cache_id)));
        }
        let entry = weights.entry(frames).or_default();
        entry.0 += e.bytes_alloc;
        entry.1.insert(e.cache_id);
    };
    if live {
        replay.live.values().for_each(&mut add);
    } else {
        dump.events()
            .filter(|e| e.kind == crate::dump::EventKind::Alloc)
            .for_each(&mut add);
    }
    let mut lines: Vec<String> = weights
        .into_iter()
        .filter(|(_, (w, _))| *w > 0)
        .map(|(mut frames, (w, ids))| {
            if caches == CacheFrames::Label
                && let Some(leaf) = frames.last_mut()
            {
                leaf.push(' ');
                leaf.push_str(&cache_label(dump, &ids));
            }
            format!("{} {w}", frames.join(";"))
        })
        .collect();
    lines.sort();
    lines
}

/// Writes the flamegraph SVG. Errors: nothing to draw, or inferno's.
///
/// # Errors
///
/// A message when there is nothing to draw, or inferno's error as text.
pub fn flamegraph(
    dump: &Dump,
    replay: &Replay,
    sym: &Symbolizer,
    live: bool,
    stack_options: StackOptions,
) -> Result<Vec<u8>, String> {
    let lines = folded_stacks_with(dump, replay, sym, live, stack_options);
    if lines.is_empty() {
        return Err(if live {
            "no object is live at the end of the record: nothing to draw".into()
        } else {
            "the record holds no allocation: nothing to draw".into()
        });
    }
    let mut options = inferno::flamegraph::Options::default();
    options.title = if live {
        "magpie-kmem: bytes live at the end of the record, by stack".into()
    } else {
        "magpie-kmem: bytes allocated, by stack".into()
    };
    options.count_name = "bytes".into();
    options.name_type = "Function:".into();
    options.deterministic = true;
    let mut svg = Vec::new();
    inferno::flamegraph::from_lines(&mut options, lines.iter().map(String::as_str), &mut svg)
        .map_err(|e| format!("flamegraph: {e}"))?;
    Ok(svg)
}

/// Lines the timeline draws at most.
pub const TIMELINE_CACHES: usize = 6;
/// Points per line at most (the series is bucketed in time beyond that).
const TIMELINE_POINTS: usize = 2000;

/// What the timeline draws one line for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimelineBy {
    /// One line per cache (the default).
    Cache,
    /// One line per call site, named `FILE:LINE func:NAME`.
    Site,
}

/// A cache's (or call site's) live bytes over time: (ns since record
/// start, live bytes).
pub struct Series {
    /// Cache name, or the call site's `FILE:LINE func:NAME`.
    pub name: String,
    /// Peak live bytes.
    pub peak: i64,
    /// Points, time ascending.
    pub points: Vec<(u64, i64)>,
}

/// Live bytes over time for the caches with the highest peaks (at most
/// [`TIMELINE_CACHES`]). Events of all CPUs are merged by timestamp; the
/// replay must come from [`crate::analysis::replay_with_timeline`].
pub fn timeline_series(dump: &Dump, replay: &Replay) -> Vec<Series> {
    let deltas = replay
        .timeline
        .iter()
        .map(|&(ts, cache, delta)| (ts, dump.cache_name(cache), delta));
    series_of(dump, deltas.collect())
}

/// Live bytes over time per call site (named as the code tags name
/// theirs), the sites with the highest peaks: allocs and frees of all
/// CPUs merged by timestamp, each free matched to its alloc's site.
pub fn timeline_series_by_site(dump: &Dump, sym: &Symbolizer) -> Vec<Series> {
    let mut names: BTreeMap<u64, String> = BTreeMap::new();
    let mut live: std::collections::HashMap<u64, (String, u64)> = std::collections::HashMap::new();
    let mut deltas = Vec::new();
    for e in dump.merged_events() {
        match e.kind {
            crate::dump::EventKind::Alloc => {
                let name = names
                    .entry(e.call_site)
                    .or_insert_with(|| sym.site(e.call_site).tag_info())
                    .clone();
                deltas.push((e.timestamp_ns, name.clone(), e.bytes_alloc as i64));
                live.insert(e.ptr, (name, e.bytes_alloc));
            }
            crate::dump::EventKind::Free => {
                if let Some((name, bytes)) = live.remove(&e.ptr) {
                    deltas.push((e.timestamp_ns, name, -(bytes as i64)));
                }
            }
            _ => {}
        }
    }
    series_of(dump, deltas)
}

fn series_of(dump: &Dump, deltas: Vec<(u64, String, i64)>) -> Vec<Series> {
    let start = dump.header.record_start_ns;
    let mut live: BTreeMap<&str, i64> = BTreeMap::new();
    let mut peaks: BTreeMap<&str, i64> = BTreeMap::new();
    let mut raw: BTreeMap<&str, Vec<(u64, i64)>> = BTreeMap::new();
    for (ts, name, delta) in &deltas {
        let value = live.entry(name).or_default();
        *value += delta;
        let peak = peaks.entry(name).or_default();
        *peak = (*peak).max(*value);
        raw.entry(name)
            .or_default()
            .push((ts.saturating_sub(start), *value));
    }
    let mut order: Vec<(&str, i64)> = peaks.into_iter().collect();
    order.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    order.truncate(TIMELINE_CACHES);
    let end = deltas.last().map_or(0, |t| t.0.saturating_sub(start));
    order
        .into_iter()
        .map(|(name, peak)| {
            let points = raw.remove(name).unwrap_or_default();
            Series {
                name: name.to_string(),
                peak,
                points: downsample(points, end),
            }
        })
        .collect()
}

/// Keeps at most [`TIMELINE_POINTS`] points: per time bucket, the point
/// before the bucket's highest value, the highest, and the last.
fn downsample(points: Vec<(u64, i64)>, end: u64) -> Vec<(u64, i64)> {
    if points.len() <= TIMELINE_POINTS {
        return points;
    }
    let buckets = (TIMELINE_POINTS / 2) as u64;
    let width = (end / buckets).max(1);
    let mut out: Vec<(u64, i64)> = Vec::with_capacity(TIMELINE_POINTS + 2);
    let mut i = 0;
    while i < points.len() {
        let bucket = points[i].0 / width;
        let mut j = i;
        let mut max = i;
        while j < points.len() && points[j].0 / width == bucket {
            if points[j].1 > points[max].1 {
                max = j;
            }
            j += 1;
        }
        out.push(points[max]);
        if max != j - 1 {
            out.push(points[j - 1]);
        }
        i = j;
    }
    out
}

/// Bytes as people read them: `384 bytes`, `12.0 KiB`, `1.5 MiB`.
pub fn human_bytes(bytes: i64) -> String {
    let magnitude = bytes.unsigned_abs();
    if magnitude < 1024 {
        format!("{bytes} bytes")
    } else if magnitude < 1024 * 1024 {
        format!("{:.1} KiB", bytes as f64 / 1024.0)
    } else {
        format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
    }
}

/// The y axis' unit for values up to `max` bytes: (name, bytes per unit).
fn axis_unit(max: f64) -> (&'static str, f64) {
    if max >= 4.0 * 1024.0 * 1024.0 {
        ("MiB", 1024.0 * 1024.0)
    } else if max >= 4.0 * 1024.0 {
        ("KiB", 1024.0)
    } else {
        ("bytes", 1.0)
    }
}

/// A marker on the timeline: what the shell ran, and when (ns since
/// record start).
pub struct Marker {
    /// Nanoseconds since `record start`.
    pub at_ns: u64,
    /// The command line.
    pub text: String,
}

/// The dump's MARK records as timeline markers.
pub fn markers(dump: &Dump) -> Vec<Marker> {
    let start = dump.header.record_start_ns;
    dump.marks
        .iter()
        .map(|mark| Marker {
            at_ns: mark.timestamp_ns.saturating_sub(start),
            text: mark.text.clone(),
        })
        .collect()
}

/// The span of time a timeline draws, in ns since `record start`: by
/// default from the first event to the last (typing before a command is
/// not drawn), or what `--from` / `--to` chose ([`parse_when`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Window {
    /// Start (`None`: the first event).
    pub from_ns: Option<u64>,
    /// End (`None`: the last event).
    pub to_ns: Option<u64>,
}

/// Reads a `--from` / `--to` value: a time since `record start` with its
/// unit (`1.5s`, `250ms`, `40us` or `40µs`, `1000ns`), or the command line
/// of a MARK (a shell command recorded: `stress`, `kmemtrace record stop`),
/// matched whole or as the first words of the line; its first run.
///
/// # Errors
///
/// A message naming the value and what is accepted.
pub fn parse_when(text: &str, marks: &[Marker]) -> Result<u64, String> {
    let units = [
        ("ns", 1.0),
        ("us", 1e3),
        ("µs", 1e3),
        ("ms", 1e6),
        ("s", 1e9),
    ];
    for (suffix, scale) in units {
        if let Some(number) = text.strip_suffix(suffix)
            && let Ok(value) = number.trim().parse::<f64>()
            && value.is_finite()
            && value >= 0.0
        {
            return Ok((value * scale).round() as u64);
        }
    }
    let words = |line: &str| {
        line.split_whitespace()
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    let wanted = words(text);
    if let Some(mark) = marks.iter().find(|mark| {
        let line = words(&mark.text);
        !wanted.is_empty() && line.len() >= wanted.len() && line[..wanted.len()] == wanted[..]
    }) {
        return Ok(mark.at_ns);
    }
    let mut known: Vec<&str> = marks.iter().map(|mark| mark.text.as_str()).collect();
    known.dedup();
    Err(format!(
        "'{text}' is neither a time (1.5s, 250ms, 40us, 1000ns) nor a shell command of the record{}",
        if known.is_empty() {
            String::new()
        } else {
            format!(" ({})", known.join(", "))
        }
    ))
}

/// Longest marker label, in characters (a longer one ends in `…`).
pub const MARKER_LABEL_CHARS: usize = 28;

/// A marker's label: the command line, cut with `…` past
/// [`MARKER_LABEL_CHARS`].
pub fn marker_label(text: &str) -> String {
    if text.chars().count() <= MARKER_LABEL_CHARS {
        return text.to_string();
    }
    let mut label: String = text.chars().take(MARKER_LABEL_CHARS - 1).collect();
    label.push('…');
    label
}

/// Writes the timeline SVG: live bytes per cache (or per call site) over
/// time, the y axis in bytes, KiB or MiB, the legend beside the plot, a
/// dashed line and a label for each command the shell ran (`marks`).
/// Errors: nothing to draw, or plotters'.
///
/// # Errors
///
/// A message when there is nothing to draw, or plotters' error as text.
pub fn timeline(
    series: &[Series],
    by: TimelineBy,
    marks: &[Marker],
    window: Window,
) -> Result<String, String> {
    if series.is_empty() {
        return Err("the record holds no allocation: nothing to draw".into());
    }
    let first = series
        .iter()
        .filter_map(|s| s.points.first().map(|p| p.0))
        .min()
        .unwrap_or(0);
    let last = series
        .iter()
        .filter_map(|s| s.points.last().map(|p| p.0))
        .max()
        .unwrap_or(0);
    // The events' span, a fiftieth wider each side so the command that
    // started them (a MARK just before the first event) shows.
    let pad = (last - first) / 50;
    let from_ns = window.from_ns.unwrap_or(first.saturating_sub(pad));
    let to_ns = window.to_ns.unwrap_or(last + pad).max(from_ns + 1);
    if window.from_ns.is_some() && window.to_ns.is_some() && window.from_ns >= window.to_ns {
        return Err(format!(
            "--from {} is not before --to {}",
            Nanoseconds(from_ns),
            Nanoseconds(window.to_ns.unwrap_or(0))
        ));
    }
    let span_ns = to_ns - from_ns;
    // People read ms (or µs for short records), never ticks.
    let (unit, scale) = if span_ns >= 10_000_000 {
        ("ms", 1e6)
    } else {
        ("µs", 1e3)
    };
    let x_min = from_ns as f64 / scale;
    let x_max = to_ns as f64 / scale;
    let marks: Vec<&Marker> = marks
        .iter()
        .filter(|mark| (from_ns..=to_ns).contains(&mark.at_ns))
        .collect();
    let peak = series.iter().map(|s| s.peak).max().unwrap_or(1).max(1) as f64;
    let (y_unit, y_scale) = axis_unit(peak);
    let y_max = peak * 1.1 / y_scale;
    let (what, legend_width) = match by {
        TimelineBy::Cache => ("cache (top caches by peak)", 240),
        TimelineBy::Site => ("call site (top sites by peak)", 480),
    };
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (760 + legend_width, 480)).into_drawing_area();
        let err = |e: &dyn std::fmt::Display| format!("timeline: {e}");
        root.fill(&WHITE).map_err(|e| err(&e))?;
        let root = root
            .titled(
                &format!("magpie-kmem: live bytes per {what}"),
                ("sans-serif", 20),
            )
            .map_err(|e| err(&e))?;
        let (plot, legend) = root.split_horizontally(760);
        let mut chart = ChartBuilder::on(&plot)
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(70)
            .build_cartesian_2d(x_min..x_max, 0f64..y_max)
            .map_err(|e| err(&e))?;
        let decimals = usize::from(y_max < 10.0);
        chart
            .configure_mesh()
            .x_desc(format!("{unit} since record start"))
            .x_label_formatter(&|v| {
                if x_max - x_min >= 10.0 {
                    format!("{v:.0}")
                } else {
                    format!("{v:.1}")
                }
            })
            .y_desc(format!("live {y_unit}"))
            .y_label_formatter(&|v| format!("{v:.decimals$}"))
            .draw()
            .map_err(|e| err(&e))?;
        let grey = RGBColor(120, 120, 120);
        for (i, mark) in marks.iter().enumerate() {
            let x = mark.at_ns as f64 / scale;
            chart
                .draw_series(DashedLineSeries::new(
                    [(x, 0.0), (x, y_max)],
                    4,
                    3,
                    grey.stroke_width(1),
                ))
                .map_err(|e| err(&e))?;
            // Labels take turns at four heights so neighbours do not overlap.
            // (Right of its line, or left of it in the last fifth.)
            let label = marker_label(&mark.text);
            let y = y_max * (0.98 - 0.045 * (i % 4) as f64);
            let side = if x > x_min + 0.8 * (x_max - x_min) {
                HPos::Right
            } else {
                HPos::Left
            };
            let style = ("sans-serif", 11)
                .into_font()
                .color(&grey)
                .pos(Pos::new(side, VPos::Top));
            chart
                .draw_series(std::iter::once(Text::new(label, (x, y), style)))
                .map_err(|e| err(&e))?;
        }
        for (i, s) in series.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            let mut points: Vec<(f64, f64)> = Vec::with_capacity(s.points.len() * 2 + 2);
            // A step line: live bytes hold until the next event; it starts
            // at the value live when the window opens.
            let mut last = s
                .points
                .iter()
                .take_while(|p| p.0 < from_ns)
                .last()
                .map_or(0.0, |p| p.1 as f64 / y_scale);
            points.push((x_min, last));
            for &(t, v) in s.points.iter().filter(|p| (from_ns..=to_ns).contains(&p.0)) {
                let x = t as f64 / scale;
                points.push((x, last));
                points.push((x, v as f64 / y_scale));
                last = v as f64 / y_scale;
            }
            points.push((x_max, last));
            chart
                .draw_series(LineSeries::new(points, color.stroke_width(2)))
                .map_err(|e| err(&e))?;
            // The legend beside the plot: a swatch, the name, its peak.
            let y = 30 + 30 * i as i32;
            legend
                .draw(&Rectangle::new([(4, y + 5), (24, y + 9)], color.filled()))
                .map_err(|e| err(&e))?;
            legend
                .draw(&Text::new(
                    format!("{} (peak {})", s.name, human_bytes(s.peak)),
                    (32, y),
                    ("sans-serif", 14),
                ))
                .map_err(|e| err(&e))?;
        }
        root.present().map_err(|e| err(&e))?;
    }
    Ok(svg)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn folded(names: &[&str]) -> Vec<String> {
        let mut frames: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        fold_plumbing(&mut frames);
        frames
    }

    #[test]
    fn plumbing_at_the_leaf_folds_into_the_call_made() {
        // A `Vec` growing: the README flamegraph's ten frames under hold_room.
        assert_eq!(
            folded(&[
                "kmain",
                "magpie::shell::kmem::hold_room",
                "<Vec>::try_reserve",
                "<RawVec>::try_reserve",
                "<RawVecInner>::try_reserve",
                "<RawVecInner>::grow_amortized",
                "<Global as Allocator>::allocate",
                "alloc::alloc::alloc",
            ]),
            [
                "kmain",
                "magpie::shell::kmem::hold_room",
                "<Vec>::try_reserve"
            ]
        );
        // Plumbing above a real frame stays: only the leaf run folds.
        assert_eq!(
            folded(&["<Box as FnOnce>::call_once", "worker", "<Worker>::alloc"]),
            ["<Box as FnOnce>::call_once", "worker", "<Worker>::alloc"]
        );
        // Nothing but plumbing: kept whole.
        assert_eq!(
            folded(&["alloc::alloc::alloc", "__rust_alloc"]),
            ["alloc::alloc::alloc", "__rust_alloc"]
        );
        assert!(!is_plumbing("magpie::shell::kmem::cmd_kmalloc"));
        assert!(is_plumbing("magpie_slab::allocator::kmalloc"));
    }
}
