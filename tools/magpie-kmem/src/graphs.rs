//! Pictures: a flamegraph of bytes by stack (`inferno`) and a timeline of
//! live bytes per cache (`plotters`, SVG backend).

use std::collections::BTreeMap;

use plotters::prelude::*;

use crate::analysis::Replay;
use crate::dump::{DecodedEvent, Dump};
use crate::symbols::Symbolizer;

/// One folded stack line's frames (outermost first) for an alloc event:
/// the recorded stack when there is one, else the call site; then the
/// cache as the leaf frame, in brackets.
fn frames_of(
    dump: &Dump,
    sym: &Symbolizer,
    e: &DecodedEvent,
    memo: &mut BTreeMap<u64, Vec<String>>,
) -> Vec<String> {
    let addresses: Vec<u64> = match dump.stacks.get(&e.stack_id) {
        Some(frames) if e.stack_id != 0 && !frames.is_empty() => frames.clone(),
        _ => vec![e.call_site],
    };
    let mut out = Vec::new();
    // Stacks are innermost first; a flamegraph wants the root first.
    for addr in addresses.iter().rev() {
        let names = memo.entry(*addr).or_insert_with(|| sym.frames(*addr));
        out.extend(names.iter().map(|n| n.replace(';', ":")));
    }
    out.push(format!("[{}]", dump.cache_name(e.cache_id)));
    out
}

/// Folded stacks (`root;...;leaf BYTES`), sorted: bytes allocated by each
/// stack over the whole record, or (`live`) bytes of objects still live at
/// the end.
pub fn folded_stacks(dump: &Dump, replay: &Replay, sym: &Symbolizer, live: bool) -> Vec<String> {
    let mut memo = BTreeMap::new();
    let mut weights: BTreeMap<String, u64> = BTreeMap::new();
    let mut add = |e: &DecodedEvent| {
        let key = frames_of(dump, sym, e, &mut memo).join(";");
        *weights.entry(key).or_default() += e.bytes_alloc;
    };
    if live {
        replay.live.values().for_each(&mut add);
    } else {
        dump.events()
            .filter(|e| e.kind == crate::dump::EventKind::Alloc)
            .for_each(&mut add);
    }
    weights
        .into_iter()
        .filter(|(_, w)| *w > 0)
        .map(|(k, w)| format!("{k} {w}"))
        .collect()
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
) -> Result<Vec<u8>, String> {
    let lines = folded_stacks(dump, replay, sym, live);
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

/// Caches the timeline draws at most.
pub const TIMELINE_CACHES: usize = 6;
/// Points per line at most (the series is bucketed in time beyond that).
const TIMELINE_POINTS: usize = 2000;

/// A cache's live bytes over time: (ns since record start, live bytes).
pub struct Series {
    /// Cache name.
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
    let start = dump.header.record_start_ns;
    let mut live: BTreeMap<u32, i64> = BTreeMap::new();
    let mut peaks: BTreeMap<u32, i64> = BTreeMap::new();
    let mut raw: BTreeMap<u32, Vec<(u64, i64)>> = BTreeMap::new();
    for &(ts, cache, delta) in &replay.timeline {
        let value = live.entry(cache).or_default();
        *value += delta;
        let peak = peaks.entry(cache).or_default();
        *peak = (*peak).max(*value);
        raw.entry(cache)
            .or_default()
            .push((ts.saturating_sub(start), *value));
    }
    let mut order: Vec<(u32, i64)> = peaks.into_iter().collect();
    order.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    order.truncate(TIMELINE_CACHES);
    let end = replay
        .timeline
        .last()
        .map_or(0, |t| t.0.saturating_sub(start));
    order
        .into_iter()
        .map(|(cache, peak)| {
            let points = raw.remove(&cache).unwrap_or_default();
            Series {
                name: dump.cache_name(cache),
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

/// Writes the timeline SVG. Errors: nothing to draw, or plotters'.
///
/// # Errors
///
/// A message when there is nothing to draw, or plotters' error as text.
pub fn timeline(dump: &Dump, replay: &Replay) -> Result<String, String> {
    let series = timeline_series(dump, replay);
    if series.is_empty() {
        return Err("the record holds no allocation: nothing to draw".into());
    }
    let end_ns = series
        .iter()
        .filter_map(|s| s.points.last().map(|p| p.0))
        .max()
        .unwrap_or(0)
        .max(1);
    // People read ms (or µs for short records), never ticks.
    let (unit, scale) = if end_ns >= 10_000_000 {
        ("ms", 1e6)
    } else {
        ("µs", 1e3)
    };
    let x_max = end_ns as f64 / scale;
    let y_max = series.iter().map(|s| s.peak).max().unwrap_or(1).max(1) as f64 * 1.1;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (1000, 520)).into_drawing_area();
        let err = |e: &dyn std::fmt::Display| format!("timeline: {e}");
        root.fill(&WHITE).map_err(|e| err(&e))?;
        let mut chart = ChartBuilder::on(&root)
            .caption(
                "magpie-kmem: live bytes per cache (top caches by peak)",
                ("sans-serif", 20),
            )
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(80)
            .build_cartesian_2d(0f64..x_max, 0f64..y_max)
            .map_err(|e| err(&e))?;
        chart
            .configure_mesh()
            .x_desc(format!("{unit} since record start"))
            .y_desc("live bytes")
            .y_label_formatter(&|v| format!("{v:.0}"))
            .draw()
            .map_err(|e| err(&e))?;
        for (i, s) in series.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            let mut points: Vec<(f64, f64)> = Vec::with_capacity(s.points.len() * 2 + 1);
            let mut last = 0f64;
            points.push((0.0, 0.0));
            // A step line: live bytes hold until the next event.
            for &(t, v) in &s.points {
                let x = t as f64 / scale;
                points.push((x, last));
                points.push((x, v as f64));
                last = v as f64;
            }
            points.push((x_max, last));
            chart
                .draw_series(LineSeries::new(points, color.stroke_width(2)))
                .map_err(|e| err(&e))?
                .label(format!("{} (peak {} bytes)", s.name, s.peak))
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(|e| err(&e))?;
        root.present().map_err(|e| err(&e))?;
    }
    Ok(svg)
}
