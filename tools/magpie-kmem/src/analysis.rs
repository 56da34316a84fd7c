//! Replaying a dump: per-CPU sequence and timestamp checks, the merged
//! alloc/free replay that pairs each free with its alloc, and the
//! statistics the reports print.
//!
//! Semantics (from the ABI contract):
//! - a **sequence gap** on a CPU is events dropped for a full buffer
//!   (overruns); gaps larger than the overruns the dump reports are an
//!   error (events lost silently);
//! - **ping-pong** is a free on another CPU than the matching alloc;
//! - **frag** is `100 − 100 × bytes_req / bytes_alloc` over allocs;
//! - a **free of a pointer with no alloc** in the record is an error only
//!   when recording began at boot and nothing overran; otherwise the
//!   object may predate the record (or its alloc was dropped): a warning.
//!   A pointer allocated twice without a free between follows the same
//!   rule (its free may have been dropped).

use std::collections::{BTreeMap, HashMap};

use magpie_slab::reports::Nanoseconds;

use crate::dump::{DecodedEvent, Dump, EventKind};

/// How serious a finding of `check` is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Severity {
    /// The dump is wrong or inconsistent: `check` exits 1.
    Error,
    /// Data is missing or uncertain (overruns, objects older than the
    /// record); the dump itself is sound.
    Warning,
}

/// One finding of `check`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Issue {
    /// Error or warning.
    pub severity: Severity,
    /// A short class name (`overrun`, `double-alloc`, ...), for grouping.
    pub class: &'static str,
    /// The message, naming CPUs, pointers and file offsets.
    pub message: String,
}

/// Totals of one row of a `stat` table (a call site, a pointer or a cache).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stat {
    /// Allocations.
    pub hit: u64,
    /// Bytes the allocator gave.
    pub bytes_alloc: u64,
    /// Bytes requested.
    pub bytes_req: u64,
    /// Frees of these objects on another CPU than their alloc.
    pub pingpong: u64,
    /// Frees of these objects (matched to an alloc in the record).
    pub frees: u64,
}

impl Stat {
    /// Internal fragmentation in percent: `100 − 100 × req / alloc`.
    pub fn frag(&self) -> f64 {
        fragmentation(self.bytes_req, self.bytes_alloc)
    }
}

/// `100 − 100 × req / alloc` (0 when nothing was allocated), as `perf kmem`.
pub fn fragmentation(bytes_req: u64, bytes_alloc: u64) -> f64 {
    if bytes_alloc == 0 {
        0.0
    } else {
        100.0 - 100.0 * bytes_req as f64 / bytes_alloc as f64
    }
}

/// Per-CPU facts `check` prints.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CpuSummary {
    /// Events recorded.
    pub nr_events: u64,
    /// First and last seq recorded.
    pub seq_range: Option<(u64, u64)>,
    /// Overruns the CPU records report.
    pub nr_overruns: u64,
    /// Events missing between recorded seqs.
    pub nr_seq_gap_events: u64,
    /// Number of gaps.
    pub nr_seq_gaps: u64,
}

/// Everything the reports need, from one replay of the dump.
#[derive(Debug, Clone, Default)]
pub struct Replay {
    /// Per call site.
    pub callsites: BTreeMap<u64, Stat>,
    /// Per pointer.
    pub ptrs: BTreeMap<u64, Stat>,
    /// Per cache id (0: pages).
    pub caches: BTreeMap<u32, Stat>,
    /// Per CPU.
    pub cpus: BTreeMap<u32, CpuSummary>,
    /// Objects live at the end: ptr → its alloc event.
    pub live: BTreeMap<u64, DecodedEvent>,
    /// Findings, in the order found.
    pub issues: Vec<Issue>,
    /// Total bytes requested by allocs.
    pub total_requested: u64,
    /// Total bytes allocated.
    pub total_allocated: u64,
    /// Total bytes freed (the alloc's size for a matched free, else the
    /// free's own `bytes_alloc`).
    pub total_freed: u64,
    /// Successful allocs.
    pub nr_allocs: u64,
    /// Frees.
    pub nr_frees: u64,
    /// Frees matched to an alloc in the record.
    pub nr_matched_frees: u64,
    /// Matched frees on another CPU than the alloc.
    pub nr_pingpong: u64,
    /// Frees of pointers with no alloc in the record.
    pub nr_unknown_frees: u64,
    /// Allocs of a pointer already live.
    pub nr_double_allocs: u64,
    /// Failed allocs.
    pub nr_failed_allocs: u64,
    /// Bad frees the allocator refused.
    pub nr_bad_frees: u64,
    /// Matched frees whose `bytes_alloc` differs from the alloc's.
    pub nr_size_mismatches: u64,
    /// Events stamped before `record_start_ns`.
    pub nr_before_start: u64,
    /// Timeline of merged events: (timestamp_ns, cache id, live-bytes
    /// delta), in merged order. Only filled by [`replay_with_timeline`].
    pub timeline: Vec<(u64, u32, i64)>,
}

impl Replay {
    /// Whether any finding is an error.
    pub fn has_errors(&self) -> bool {
        self.issues.iter().any(|i| i.severity == Severity::Error)
    }
    /// Count of findings of a severity.
    pub fn count(&self, severity: Severity) -> usize {
        self.issues
            .iter()
            .filter(|i| i.severity == severity)
            .count()
    }
    /// Total overruns reported by the dump.
    pub fn nr_overruns(&self) -> u64 {
        self.cpus.values().map(|c| c.nr_overruns).sum()
    }
}

fn issue(replay: &mut Replay, severity: Severity, class: &'static str, message: String) {
    replay.issues.push(Issue {
        severity,
        class,
        message,
    });
}

/// Replays the dump (see the module doc).
pub fn replay(dump: &Dump) -> Replay {
    replay_inner(dump, false)
}

/// Replays the dump and keeps the live-bytes timeline per cache.
pub fn replay_with_timeline(dump: &Dump) -> Replay {
    replay_inner(dump, true)
}

fn replay_inner(dump: &Dump, keep_timeline: bool) -> Replay {
    let mut r = Replay::default();
    check_cpus(dump, &mut r);
    check_references(dump, &mut r);

    let nr_overruns = r.nr_overruns();
    // A free of an unknown pointer is an error only when the record is
    // complete (from boot, nothing dropped; each such free is listed);
    // otherwise one warning sums them up. A double alloc is an error
    // unless events were dropped.
    let complete = dump.header.from_boot() && nr_overruns == 0;
    let why = match (dump.header.from_boot(), nr_overruns > 0) {
        (false, false) => "recording did not begin at boot: the objects may predate the record",
        (true, true) => "events were lost to overruns: their allocs may have been dropped",
        _ => {
            "recording did not begin at boot and events were lost to overruns: \
             the objects may predate the record, or their allocs were dropped"
        }
    };
    let mut first_unknown_free: Option<DecodedEvent> = None;

    let mut live: HashMap<u64, DecodedEvent> = HashMap::new();
    let mut first_mismatch: Option<(DecodedEvent, DecodedEvent)> = None;
    for e in dump.merged_events() {
        match e.kind {
            EventKind::Alloc => {
                r.nr_allocs += 1;
                r.total_requested += e.bytes_req;
                r.total_allocated += e.bytes_alloc;
                for stat in [
                    r.callsites.entry(e.call_site).or_default(),
                    r.ptrs.entry(e.ptr).or_default(),
                    r.caches.entry(e.cache_id).or_default(),
                ] {
                    stat.hit += 1;
                    stat.bytes_alloc += e.bytes_alloc;
                    stat.bytes_req += e.bytes_req;
                }
                if keep_timeline {
                    r.timeline
                        .push((e.timestamp_ns, e.cache_id, e.bytes_alloc as i64));
                }
                if let Some(old) = live.insert(e.ptr, e.clone()) {
                    r.nr_double_allocs += 1;
                    let message = format!(
                        "double alloc: ptr {:#x} allocated on cpu {} at {} (seq {}, offset {:#x}) \
                         while live since its alloc on cpu {} at {} (seq {}, offset {:#x}){}",
                        e.ptr,
                        e.cpu,
                        Nanoseconds(e.timestamp_ns),
                        e.seq,
                        e.offset,
                        old.cpu,
                        Nanoseconds(old.timestamp_ns),
                        old.seq,
                        old.offset,
                        if nr_overruns == 0 {
                            ""
                        } else {
                            "; its free may have been dropped (overruns)"
                        }
                    );
                    let severity = if nr_overruns == 0 {
                        Severity::Error
                    } else {
                        Severity::Warning
                    };
                    issue(&mut r, severity, "double-alloc", message);
                }
            }
            EventKind::Free => {
                r.nr_frees += 1;
                match live.remove(&e.ptr) {
                    Some(alloc) => {
                        r.nr_matched_frees += 1;
                        r.total_freed += alloc.bytes_alloc;
                        if e.bytes_alloc != 0 && e.bytes_alloc != alloc.bytes_alloc {
                            r.nr_size_mismatches += 1;
                            if r.nr_size_mismatches == 1 {
                                first_mismatch = Some((e.clone(), alloc.clone()));
                            }
                        }
                        let cross = alloc.cpu != e.cpu;
                        if cross {
                            r.nr_pingpong += 1;
                        }
                        for stat in [
                            r.callsites.entry(alloc.call_site).or_default(),
                            r.ptrs.entry(alloc.ptr).or_default(),
                            r.caches.entry(alloc.cache_id).or_default(),
                        ] {
                            stat.frees += 1;
                            stat.pingpong += u64::from(cross);
                        }
                        if keep_timeline {
                            r.timeline.push((
                                e.timestamp_ns,
                                alloc.cache_id,
                                -(alloc.bytes_alloc as i64),
                            ));
                        }
                    }
                    None => {
                        r.nr_unknown_frees += 1;
                        r.total_freed += e.bytes_alloc;
                        if complete {
                            let message = format!(
                                "free of unknown ptr {:#x} on cpu {} at {} (seq {}, offset {:#x}): \
                                 no alloc of it in the record although recording began at boot \
                                 and nothing overran",
                                e.ptr,
                                e.cpu,
                                Nanoseconds(e.timestamp_ns),
                                e.seq,
                                e.offset,
                            );
                            issue(&mut r, Severity::Error, "unknown-free", message);
                        } else if first_unknown_free.is_none() {
                            first_unknown_free = Some(e.clone());
                        }
                    }
                }
            }
            EventKind::FailedAlloc => r.nr_failed_allocs += 1,
            EventKind::BadFree => r.nr_bad_frees += 1,
        }
    }
    if let Some(e) = first_unknown_free {
        let message = format!(
            "{} frees of pointers with no alloc in the record (first: ptr {:#x} on cpu {} at {}, \
             seq {}, offset {:#x}); {why}",
            r.nr_unknown_frees,
            e.ptr,
            e.cpu,
            Nanoseconds(e.timestamp_ns),
            e.seq,
            e.offset,
        );
        issue(&mut r, Severity::Warning, "unknown-free", message);
    }
    if let Some((free, alloc)) = first_mismatch {
        let n = r.nr_size_mismatches;
        issue(
            &mut r,
            Severity::Warning,
            "size-mismatch",
            format!(
                "{} frees give another object size than their alloc (first: ptr {:#x} freed as {} bytes at offset {:#x}, allocated as {} bytes at offset {:#x})",
                n, free.ptr, free.bytes_alloc, free.offset, alloc.bytes_alloc, alloc.offset
            ),
        );
    }
    r.live = live.into_iter().collect();
    r
}

/// Per-CPU order: seq strictly increasing (gaps are overruns), timestamps
/// never going back.
fn check_cpus(dump: &Dump, r: &mut Replay) {
    let mut by_cpu: BTreeMap<u32, Vec<&DecodedEvent>> = BTreeMap::new();
    for record in &dump.cpu_records {
        let summary = r.cpus.entry(record.cpu).or_default();
        summary.nr_overruns += record.nr_overruns;
        by_cpu
            .entry(record.cpu)
            .or_default()
            .extend(record.events.iter());
    }
    let start = dump.header.record_start_ns;
    let early: Vec<&DecodedEvent> = dump.events().filter(|e| e.timestamp_ns < start).collect();
    if let Some(first) = early.first() {
        r.nr_before_start = early.len() as u64;
        issue(
            r,
            Severity::Warning,
            "before-start",
            format!(
                "{} events are stamped before `record start` ({}): first on cpu {} at {} (offset {:#x})",
                early.len(),
                Nanoseconds(start),
                first.cpu,
                Nanoseconds(first.timestamp_ns),
                first.offset
            ),
        );
    }
    for (cpu, events) in by_cpu {
        let mut gap_events = 0u64;
        let mut gaps = 0u64;
        let mut first_gap: Option<(u64, u64, u64)> = None;
        for pair in events.windows(2) {
            let (a, b) = (pair[0], pair[1]);
            if b.seq <= a.seq {
                issue(
                    r,
                    Severity::Error,
                    "seq-order",
                    format!(
                        "cpu {cpu}: seq goes from {} to {} at offset {:#x} (events out of order or repeated)",
                        a.seq, b.seq, b.offset
                    ),
                );
            } else if b.seq > a.seq + 1 {
                gaps += 1;
                gap_events += b.seq - a.seq - 1;
                first_gap.get_or_insert((a.seq, b.seq, b.offset));
            }
            if b.timestamp_ns < a.timestamp_ns {
                issue(
                    r,
                    Severity::Error,
                    "timestamp-order",
                    format!(
                        "cpu {cpu}: timestamp goes back from {} (seq {}) to {} (seq {}) at offset {:#x}",
                        Nanoseconds(a.timestamp_ns),
                        a.seq,
                        Nanoseconds(b.timestamp_ns),
                        b.seq,
                        b.offset
                    ),
                );
            }
        }
        let summary = r.cpus.entry(cpu).or_default();
        summary.nr_events = events.len() as u64;
        summary.seq_range = events
            .first()
            .zip(events.last())
            .map(|(a, b)| (a.seq, b.seq));
        summary.nr_seq_gap_events = gap_events;
        summary.nr_seq_gaps = gaps;
        let reported = summary.nr_overruns;
        if gap_events > reported {
            let (from, to, offset) = first_gap.expect("a gap");
            issue(
                r,
                Severity::Error,
                "lost-events",
                format!(
                    "cpu {cpu}: {gap_events} events missing in {gaps} seq gaps (first: seq {from} to {to} at offset {offset:#x}) \
                     but only {reported} overruns reported: events lost silently"
                ),
            );
        } else if reported > 0 {
            let gap_text = match first_gap {
                Some((from, to, offset)) => format!(
                    "{gap_events} of them seen as {gaps} seq gaps, first seq {from} to {to} at offset {offset:#x}"
                ),
                None => "none of them between recorded events".into(),
            };
            issue(
                r,
                Severity::Warning,
                "overrun",
                format!("cpu {cpu}: {reported} events lost to overruns (buffer full; {gap_text})"),
            );
        }
    }
}

/// Cache and stack ids that events use must be named by records.
fn check_references(dump: &Dump, r: &mut Replay) {
    let mut unknown_caches: BTreeMap<u32, (u64, u64)> = BTreeMap::new();
    let mut unknown_stacks: BTreeMap<u32, (u64, u64)> = BTreeMap::new();
    for e in dump.events() {
        if e.cache_id != 0 && !dump.caches.contains_key(&e.cache_id) {
            let entry = unknown_caches.entry(e.cache_id).or_insert((0, e.offset));
            entry.0 += 1;
        }
        if e.stack_id != 0 && !dump.stacks.contains_key(&e.stack_id) {
            let entry = unknown_stacks.entry(e.stack_id).or_insert((0, e.offset));
            entry.0 += 1;
        }
    }
    for (id, (n, offset)) in unknown_caches {
        issue(
            r,
            Severity::Warning,
            "unknown-cache",
            format!(
                "{n} events name cache id {id}, which no CACHE record names (first at offset {offset:#x})"
            ),
        );
    }
    for (id, (n, offset)) in unknown_stacks {
        issue(
            r,
            Severity::Error,
            "unknown-stack",
            format!(
                "{n} events name stack id {id}, which no STACK record holds (first at offset {offset:#x})"
            ),
        );
    }
}

/// Objects live (outstanding) at the end of the record, grouped as
/// `::findleaks` groups its leaks: by cache and call site (and stack when
/// recorded), largest first. Live is not leaked: a leak is an object
/// nothing points to, which only a scan of the kernel's memory can tell
/// (`kmem findleaks` in the shell).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveGroup {
    /// Cache id of the objects (0: pages).
    pub cache_id: u32,
    /// Call site of their alloc.
    pub call_site: u64,
    /// Stack id of their alloc (0: none).
    pub stack_id: u32,
    /// Pointers, ascending.
    pub ptrs: Vec<u64>,
    /// Bytes the allocator gave them.
    pub bytes_alloc: u64,
    /// Bytes requested for them.
    pub bytes_req: u64,
}

/// Groups the live objects (see [`LiveGroup`]): bytes descending, then
/// object count descending, then call site ascending.
pub fn live_groups(replay: &Replay) -> Vec<LiveGroup> {
    let mut groups: BTreeMap<(u32, u64, u32), LiveGroup> = BTreeMap::new();
    for (ptr, e) in &replay.live {
        let g = groups
            .entry((e.cache_id, e.call_site, e.stack_id))
            .or_insert_with(|| LiveGroup {
                cache_id: e.cache_id,
                call_site: e.call_site,
                stack_id: e.stack_id,
                ptrs: Vec::new(),
                bytes_alloc: 0,
                bytes_req: 0,
            });
        g.ptrs.push(*ptr);
        g.bytes_alloc += e.bytes_alloc;
        g.bytes_req += e.bytes_req;
    }
    let mut out: Vec<LiveGroup> = groups.into_values().collect();
    out.sort_by(|a, b| {
        b.bytes_alloc
            .cmp(&a.bytes_alloc)
            .then(b.ptrs.len().cmp(&a.ptrs.len()))
            .then(a.call_site.cmp(&b.call_site))
            .then(a.cache_id.cmp(&b.cache_id))
            .then(a.stack_id.cmp(&b.stack_id))
    });
    out
}
