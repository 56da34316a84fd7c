//! `magpie-kmem core CORE events -o FILE`: the kmemtrace recording the
//! kernel held when the image was taken, written as the `.kmt` dump the
//! kernel's `kmemtrace dump` would have written (header, caches, marks,
//! stacks, one CPU record per sub-buffer, trailer: the same writer,
//! `magpie_kmemtrace_format::DumpWriter`), so that a recording survives
//! a panic and every other subcommand reads it. Not kept: the caches
//! destroyed during the record (their events name an unknown cache id).
//!
//! Timestamps are converted with the clock rate the kernel put in the
//! descriptor (`magpie_slab::descriptor::set_clock_khz`), as the kernel
//! converts them; without one they stay in clock ticks (said on stderr).

use magpie_kmemtrace_format::{
    CacheRecord, DumpSummary, DumpWriter, EVENT_SIZE, HEADER_FLAG_FROM_BOOT, HEADER_FLAG_STACKS,
    KmemtraceEvent, KmemtraceHeader, MarkRecord,
};

use super::heap::{Heap, Problem};

/// The most rings, stacks, marks and sub-buffers a record can have
/// before the image is called corrupt.
const MAX_RINGS: u64 = 1024;
const MAX_STACKS: u64 = 1 << 16;
const MAX_MARKS: u64 = 1024;
const MAX_SUBBUFS: u64 = 1 << 20;

/// What [`write_events`] wrote.
#[derive(Debug, Clone, Copy)]
pub struct EventsSummary {
    /// The writer's figures.
    pub dump: DumpSummary,
    /// Whether timestamps are clock ticks (no clock rate in the image).
    pub raw_ticks: bool,
}

fn problem(what: String) -> Problem {
    Problem {
        cache: "kmemtrace".into(),
        what,
    }
}

/// Write the image's recording as a dump to `sink`; `build_id` is the
/// kernel's (zeros if unknown). Problems (a ring or stack that cannot be
/// read) are pushed and the rest is written.
///
/// # Errors
///
/// Nothing was ever recorded (no rings), or kmemtrace's own state cannot
/// be read.
pub fn write_events(
    heap: &Heap<'_>,
    build_id: [u8; 20],
    sink: &mut dyn FnMut(&[u8]),
    problems: &mut Vec<Problem>,
) -> Result<EventsSummary, String> {
    let layout = &heap.layout;
    let mem = heap.memory();
    let kmemtrace = heap
        .header
        .allocator
        .wrapping_add(layout.allocator_kmemtrace.offset);
    let read = |base: u64, entry| {
        heap.field(base, entry)
            .map_err(|e| format!("kmemtrace's state: {e}"))
    };
    let rings = read(kmemtrace, layout.kmemtrace_rings)?;
    let nr_rings = read(kmemtrace, layout.kmemtrace_rings_bytes)? / layout.cpu_slot_bytes.offset;
    if rings == 0 || nr_rings == 0 {
        return Err("no kmemtrace recording in the image (never started)".into());
    }
    if nr_rings > MAX_RINGS {
        return Err(format!("kmemtrace counts {nr_rings} rings: corrupt"));
    }
    let stack_depth = read(kmemtrace, layout.kmemtrace_stack_depth)?;
    let from_boot = read(kmemtrace, layout.kmemtrace_from_boot)? != 0;
    let start_ticks = read(kmemtrace, layout.kmemtrace_start_ticks)?;
    let khz = heap.header.clock_khz;
    let to_ns = |ticks: u64| -> u64 {
        if khz == 0 {
            ticks
        } else {
            (u128::from(ticks) * 1_000_000 / u128::from(khz)) as u64
        }
    };
    let mut flags = 0;
    if stack_depth > 0 {
        flags |= HEADER_FLAG_STACKS;
    }
    if from_boot {
        flags |= HEADER_FLAG_FROM_BOOT;
    }
    let header = KmemtraceHeader {
        nr_cpus: nr_rings as u32,
        build_id,
        flags,
        record_start_ns: to_ns(start_ticks),
        stack_depth: stack_depth as u32,
    };
    let mut out = DumpWriter::new(&header, sink);
    let (addrs, list_problem) = heap.cache_addrs();
    problems.extend(list_problem);
    for addr in addrs {
        let record = (|| -> Result<CacheRecord<String>, String> {
            let field = |entry| heap.field(addr, entry).map_err(|e| e.to_string());
            Ok(CacheRecord {
                id: field(layout.cache_id)? as u32,
                obj_size: field(layout.cache_obj_size)? as u32,
                align: field(layout.cache_align)? as u32,
                flags: field(layout.cache_flags)? as u32,
                name: heap.cache_name(addr)?,
            })
        })();
        match record {
            Ok(record) => out.cache(&record),
            Err(what) => problems.push(Problem {
                cache: format!("{addr:#x}"),
                what,
            }),
        }
    }
    let marks = kmemtrace
        .wrapping_add(layout.kmemtrace_marks.offset)
        .wrapping_add(heap.header.marks_lock_data);
    match read(marks, layout.marks_nr_marks) {
        Ok(nr) if nr <= MAX_MARKS => {
            for index in 0..nr {
                let mark = marks
                    .wrapping_add(layout.marks_entries.offset)
                    .wrapping_add(index.wrapping_mul(layout.mark_size.offset));
                let text = (|| -> Result<MarkRecord<String>, String> {
                    let field = |entry| heap.field(mark, entry).map_err(|e| e.to_string());
                    let len = field(layout.mark_text_len)?.min(layout.mark_text.size);
                    let mut bytes = vec![0u8; len as usize];
                    mem.read(mark.wrapping_add(layout.mark_text.offset), &mut bytes)
                        .map_err(|e| e.to_string())?;
                    Ok(MarkRecord {
                        timestamp_ns: to_ns(field(layout.mark_ticks)?),
                        cpu: field(layout.mark_cpu)? as u32,
                        text: String::from_utf8(bytes).unwrap_or_else(|_| "?".into()),
                    })
                })();
                match text {
                    Ok(record) => out.mark(&record),
                    Err(what) => problems.push(problem(format!("mark {index}: {what}"))),
                }
            }
        }
        Ok(nr) => problems.push(problem(format!("{nr} marks: corrupt; none written"))),
        Err(what) => problems.push(problem(format!("the marks: {what}"))),
    }
    if stack_depth > 0 {
        let table = kmemtrace
            .wrapping_add(layout.kmemtrace_stacks.offset)
            .wrapping_add(heap.header.stacks_lock_data);
        let stacks = (|| -> Result<(u64, u64, u64), String> {
            let nr = read(table, layout.stack_table_nr_stacks)?;
            if nr > MAX_STACKS {
                return Err(format!("{nr} stacks: corrupt"));
            }
            Ok((
                nr,
                read(table, layout.stack_table_frames)?,
                read(table, layout.stack_table_depths)?,
            ))
        })();
        match stacks {
            Ok((nr, frames, depths)) => {
                let max_depth = layout.max_stack_depth.offset;
                let mut depth_bytes = vec![0u8; nr as usize];
                let mut frame_bytes = vec![0u8; (nr * max_depth * 8) as usize];
                match mem
                    .read(depths, &mut depth_bytes)
                    .and_then(|()| mem.read(frames, &mut frame_bytes))
                {
                    Ok(()) => {
                        for (index, &depth) in depth_bytes.iter().enumerate() {
                            let depth = u64::from(depth).min(max_depth) as usize;
                            let slot = index * max_depth as usize * 8;
                            let frames: Vec<u64> = frame_bytes[slot..slot + depth * 8]
                                .chunks_exact(8)
                                .map(|c| u64::from_le_bytes(c.try_into().unwrap_or_default()))
                                .collect();
                            out.stack(index as u32 + 1, &frames);
                        }
                    }
                    Err(e) => problems.push(problem(format!("the stack table: {e}"))),
                }
            }
            Err(what) => problems.push(problem(format!("the stack table: {what}"))),
        }
    }
    let subbuf_events = layout.subbuf_events.offset;
    let event_size = layout.event_size.offset;
    if event_size != EVENT_SIZE as u64 {
        return Err(format!(
            "events of {event_size} bytes: this magpie-kmem reads the {EVENT_SIZE}-byte ABI"
        ));
    }
    for cpu in 0..nr_rings {
        let ring = rings.wrapping_add(cpu.wrapping_mul(layout.cpu_ring_size.offset));
        let state = (|| -> Result<(u64, u64, u64, u64), String> {
            let nr_written = read(ring, layout.cpu_ring_nr_written)?;
            let capacity = read(ring, layout.cpu_ring_capacity)?;
            if capacity > MAX_SUBBUFS * subbuf_events || nr_written > capacity {
                return Err(format!(
                    "{nr_written} events written of {capacity}: corrupt"
                ));
            }
            Ok((
                nr_written,
                read(ring, layout.cpu_ring_nr_overruns)?,
                read(ring, layout.cpu_ring_subbufs)?,
                capacity,
            ))
        })();
        let (nr_written, overruns, subbufs, _) = match state {
            Ok(state) => state,
            Err(what) => {
                problems.push(problem(format!("CPU {cpu}'s ring: {what}")));
                continue;
            }
        };
        let nr_subbufs_used = nr_written.div_ceil(subbuf_events).max(1);
        for index in 0..nr_subbufs_used {
            let first = index * subbuf_events;
            let count = nr_written.saturating_sub(first).min(subbuf_events);
            let mut bytes = vec![0u8; (count * event_size) as usize];
            if count > 0 {
                let read_events = mem
                    .read_uint(subbufs.wrapping_add(index * 8), 8)
                    .map_err(|e| e.to_string())
                    .and_then(|subbuf| mem.read(subbuf, &mut bytes).map_err(|e| e.to_string()));
                if let Err(what) = read_events {
                    problems.push(problem(format!(
                        "CPU {cpu}'s sub-buffer {index}: {what}; its events are left out"
                    )));
                    continue;
                }
            }
            let events: Vec<KmemtraceEvent> = bytes
                .chunks_exact(EVENT_SIZE)
                .map(|chunk| {
                    let mut event =
                        KmemtraceEvent::from_bytes(chunk.try_into().unwrap_or(&[0; EVENT_SIZE]));
                    event.timestamp_ns = to_ns(event.timestamp_ns);
                    event
                })
                .collect();
            out.cpu(
                cpu as u32,
                if index == 0 { overruns } else { 0 },
                events.into_iter(),
            );
        }
    }
    Ok(EventsSummary {
        dump: out.finish(),
        raw_ticks: khz == 0,
    })
}
