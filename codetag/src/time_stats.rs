//! Latency statistics: the second code-tag application (the slides'
//! `code_tag_time_stats_start()` / `code_tag_time_stats_end()`).
//!
//! A [`TimeStats`] at a code location records how long something took
//! there: count, total (for the average), maximum, a histogram from which
//! quantiles are read, and (with [`TimeStats::record_at`]) when the first
//! and last events ended, for the `rate` and `frequency` lines. Durations
//! and times are in the caller's clock units (TSC cycles in the kernel);
//! this crate never reads a clock, nor prints: a reader takes a
//! [`TimeStats::snapshot`] (`magpie_slab::reports::write_time_stats`
//! prints one in the slides' layout, every time in ns/µs/ms/s with its
//! unit: the one time format of the Magpie reports).
//!
//! ```
//! # fn now() -> u64 { 7 }
//! # fn refill() {}
//! let start = now();
//! refill();
//! magpie_codetag::time_stats!().record(now().wrapping_sub(start));
//! ```
//!
//! The histogram is log-linear: 4 buckets per power of two, so a quantile
//! is within 25% of the truth. Updates are relaxed atomics on the stats
//! (shared by all CPUs: meant for slow paths).

use core::sync::atomic::{AtomicU64, Ordering};

use crate::{CodeTag, TaggedWith, codetag_section};

/// Sub-buckets per power of two (log2).
const SUB_BITS: u32 = 2;
const SUB: usize = 1 << SUB_BITS;
/// Powers of two covered (durations up to 2^48 units; larger ones land in
/// the last bucket).
const NR_POWERS: usize = 48;
const NR_BUCKETS: usize = NR_POWERS * SUB;

/// The quantiles `timestats` prints, in percent.
pub const QUANTILES: [u32; 5] = [50, 75, 90, 99, 100];

/// Latency statistics of one code location.
pub struct TimeStats {
    /// Where the measured section is.
    pub tag: CodeTag,
    count: AtomicU64,
    total: AtomicU64,
    max: AtomicU64,
    /// Clock reading at the end of the first and the last event recorded
    /// with `record_at` (0: none yet).
    first_at: AtomicU64,
    last_at: AtomicU64,
    buckets: [AtomicU64; NR_BUCKETS],
}

impl TaggedWith for TimeStats {
    fn codetag(&self) -> &CodeTag {
        &self.tag
    }
}

codetag_section!(
    /// Every time-stats point, walkable as a slice.
    pub static TIME_STATS: [TimeStats]
);

/// Bucket of a duration: exact below 2^SUB_BITS, then 4 per power of two.
fn bucket_of(duration: u64) -> usize {
    if duration < SUB as u64 {
        return duration as usize;
    }
    let power = 63 - duration.leading_zeros(); // >= SUB_BITS
    let sub = ((duration >> (power - SUB_BITS)) as usize) & (SUB - 1);
    let bucket = (power - SUB_BITS + 1) as usize * SUB + sub;
    bucket.min(NR_BUCKETS - 1)
}

/// Smallest duration falling in `bucket`.
fn bucket_floor(bucket: usize) -> u64 {
    if bucket < SUB {
        return bucket as u64;
    }
    let power = (bucket / SUB) as u32 - 1 + SUB_BITS;
    let sub = (bucket % SUB) as u64;
    (1u64 << power) + (sub << (power - SUB_BITS))
}

impl TimeStats {
    /// Empty statistics for `tag` (used by [`time_stats!`](macro@crate::time_stats)).
    pub const fn new(tag: CodeTag) -> Self {
        Self {
            tag,
            count: AtomicU64::new(0),
            total: AtomicU64::new(0),
            max: AtomicU64::new(0),
            first_at: AtomicU64::new(0),
            last_at: AtomicU64::new(0),
            buckets: [const { AtomicU64::new(0) }; NR_BUCKETS],
        }
    }

    /// Every time-stats point of the program, in section order.
    pub fn all() -> &'static [TimeStats] {
        TIME_STATS.static_slice()
    }

    /// Records one measured duration.
    #[inline]
    pub fn record(&self, duration: u64) {
        self.count.fetch_add(1, Ordering::Relaxed);
        self.total.fetch_add(duration, Ordering::Relaxed);
        self.max.fetch_max(duration, Ordering::Relaxed);
        self.buckets[bucket_of(duration)].fetch_add(1, Ordering::Relaxed);
    }

    /// Records one duration that ended at clock reading `now` (same units),
    /// which also feeds the event rate and frequency.
    #[inline]
    pub fn record_at(&self, duration: u64, now: u64) {
        self.record(duration);
        let now = now.max(1);
        let _ = self
            .first_at
            .compare_exchange(0, now, Ordering::Relaxed, Ordering::Relaxed);
        self.last_at.fetch_max(now, Ordering::Relaxed);
    }

    /// Starts a measurement at time `now`; [`TimeStatsStart::end`] records it.
    #[inline]
    pub fn start(&'static self, now: u64) -> TimeStatsStart {
        TimeStatsStart {
            stats: self,
            start: now,
        }
    }

    /// Forgets everything recorded.
    pub fn reset(&self) {
        self.count.store(0, Ordering::Relaxed);
        self.total.store(0, Ordering::Relaxed);
        self.max.store(0, Ordering::Relaxed);
        self.first_at.store(0, Ordering::Relaxed);
        self.last_at.store(0, Ordering::Relaxed);
        for bucket in &self.buckets {
            bucket.store(0, Ordering::Relaxed);
        }
    }

    /// A consistent-enough copy of the statistics (each field is read
    /// atomically, not all at once).
    pub fn snapshot(&self) -> TimeStatsSnapshot {
        let mut counts = [0u64; NR_BUCKETS];
        for (copy, bucket) in counts.iter_mut().zip(&self.buckets) {
            *copy = bucket.load(Ordering::Relaxed);
        }
        let in_buckets: u64 = counts.iter().sum();
        let max = self.max.load(Ordering::Relaxed);
        let mut quantiles = [0u64; QUANTILES.len()];
        for (value, &percent) in quantiles.iter_mut().zip(&QUANTILES) {
            if in_buckets == 0 {
                break;
            }
            if percent >= 100 {
                *value = max;
                continue;
            }
            // Rank of the quantile, 1-based, rounded up.
            let rank = (in_buckets * u64::from(percent)).div_ceil(100).max(1);
            let mut seen = 0;
            for (bucket, &count) in counts.iter().enumerate() {
                seen += count;
                if seen >= rank {
                    *value = bucket_floor(bucket).min(max);
                    break;
                }
            }
        }
        let count = self.count.load(Ordering::Relaxed);
        TimeStatsSnapshot {
            count,
            average: self
                .total
                .load(Ordering::Relaxed)
                .checked_div(count)
                .unwrap_or(0),
            max,
            quantiles,
            first_at: self.first_at.load(Ordering::Relaxed),
            last_at: self.last_at.load(Ordering::Relaxed),
        }
    }
}

/// A measurement in progress.
#[must_use = "call end() to record the duration"]
pub struct TimeStatsStart {
    stats: &'static TimeStats,
    start: u64,
}

impl TimeStatsStart {
    /// Records `now - start`.
    #[inline]
    pub fn end(self, now: u64) {
        self.stats.record_at(now.wrapping_sub(self.start), now);
    }
}

/// Statistics copied out of a [`TimeStats`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimeStatsSnapshot {
    /// Measurements recorded.
    pub count: u64,
    /// Mean duration.
    pub average: u64,
    /// Longest duration.
    pub max: u64,
    /// Durations at the [`QUANTILES`] (lower bound of the histogram bucket;
    /// the 100% quantile is the exact maximum).
    pub quantiles: [u64; QUANTILES.len()],
    /// Clock reading when the first timed event ended (0: unknown).
    pub first_at: u64,
    /// Clock reading when the last timed event ended (0: unknown).
    pub last_at: u64,
}

/// Defines a [`TimeStats`] for the place where it is written and evaluates
/// to `&'static TimeStats`.
#[macro_export]
macro_rules! time_stats {
    () => {{
        #[$crate::linkme::distributed_slice($crate::time_stats::TIME_STATS)]
        #[linkme(crate = $crate::linkme)]
        static __TIME_STATS: $crate::time_stats::TimeStats =
            $crate::time_stats::TimeStats::new($crate::codetag!());
        &__TIME_STATS
    }};
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_monotonic_and_cover_their_floor() {
        let mut previous = 0;
        for duration in [
            0u64,
            1,
            2,
            3,
            4,
            5,
            6,
            7,
            8,
            9,
            15,
            16,
            100,
            1000,
            1 << 20,
            u64::MAX,
        ] {
            let bucket = bucket_of(duration);
            assert!(bucket >= previous, "{duration}");
            previous = bucket;
            assert!(bucket_floor(bucket) <= duration, "{duration}");
        }
        for bucket in 0..NR_BUCKETS - 1 {
            assert_eq!(bucket_of(bucket_floor(bucket)), bucket, "bucket {bucket}");
        }
    }
}
