//! `timestats`: one `magpie_codetag::time_stats!` point's latency
//! statistics in the codetag slides' layout (count, rate, frequency,
//! average, maximum, quantiles), every time in the one format for a
//! person, [`Nanoseconds`]: each figure with its own unit, down to ns.

use core::fmt;

use magpie_codetag::time_stats::{QUANTILES, TimeStats};

use super::Nanoseconds;

/// Writes `stats` (`to_ns` converts its clock's units to nanoseconds).
/// `rate` is events per second and `frequency` the mean time between
/// events, both over the span from the first to the last event (written
/// only when known: two events recorded with `record_at`). Each quantile
/// carries its own unit, so the typical figures read as figures beside a
/// long tail (never `p50 0`):
///
/// ```text
/// slab/src/slab/layer.rs:355 func:grow
/// count:          61
/// rate:           3/sec
/// frequency:      312.406 ms
/// avg duration:   632 ns
/// max duration:   20.480 µs
/// quantiles:      p50 288 ns, p75 296 ns, p90 336 ns, p99 336 ns, p100 20.480 µs
/// ```
///
/// # Errors
///
/// The error of `out`, as is.
pub fn write_time_stats(
    out: &mut dyn fmt::Write,
    stats: &TimeStats,
    to_ns: &dyn Fn(u64) -> u64,
) -> fmt::Result {
    let snapshot = stats.snapshot();
    writeln!(
        out,
        "{} func:{}",
        stats.tag.location(),
        stats.tag.function()
    )?;
    writeln!(out, "count:          {}", snapshot.count)?;
    let span_ns = to_ns(snapshot.last_at.saturating_sub(snapshot.first_at));
    if snapshot.count >= 2 && snapshot.first_at != 0 && span_ns > 0 {
        let rate = u128::from(snapshot.count - 1) * 1_000_000_000 / u128::from(span_ns);
        writeln!(out, "rate:           {rate}/sec")?;
        writeln!(
            out,
            "frequency:      {}",
            Nanoseconds(span_ns / (snapshot.count - 1))
        )?;
    }
    writeln!(
        out,
        "avg duration:   {}",
        Nanoseconds(to_ns(snapshot.average))
    )?;
    writeln!(out, "max duration:   {}", Nanoseconds(to_ns(snapshot.max)))?;
    write!(out, "quantiles:     ")?;
    for (index, (percent, value)) in QUANTILES.iter().zip(snapshot.quantiles).enumerate() {
        let separator = if index == 0 { "" } else { "," };
        write!(out, "{separator} p{percent} {}", Nanoseconds(to_ns(value)))?;
    }
    writeln!(out)
}
