//! KFENCE from an image: the pool's figures as the shell's `kmem kfence`
//! prints them and its objects as `kmem kfence objects` (Linux's
//! `/sys/kernel/debug/kfence/objects`), by the library's writers
//! (`magpie_slab::reports::write_kfence_stats`, `write_kfence_object`),
//! read through the descriptor's `kfence_*` entries.

use magpie_slab::kfence::{KFENCE_STACK_DEPTH, KfenceStack, KfenceState, KfenceStats};
use magpie_slab::reports::ReportFormat;
use magpie_slab::reports::{KfenceObjectView, write_kfence_object, write_kfence_stats};

use super::heap::{Heap, Problem};

/// One pool object, read.
struct Object {
    index: usize,
    state: KfenceState,
    addr: u64,
    size: u64,
    cache: String,
    alloc: KfenceStack,
    free: KfenceStack,
}

fn problem(what: String) -> Problem {
    Problem {
        cache: "kfence".into(),
        what,
    }
}

/// Write the pool's figures (and, with `objects`, every object) to `out`.
/// An object that cannot be read is a problem and left out.
///
/// # Errors
///
/// Writing to `out` failed.
pub fn write_kfence(
    heap: &Heap<'_>,
    objects: bool,
    format: &dyn ReportFormat,
    out: &mut String,
    problems: &mut Vec<Problem>,
) -> Result<(), String> {
    let layout = &heap.layout;
    if layout.allocator_kfence.size == 0 {
        writeln(out, "kfence: off (no pool)")?;
        problems.push(problem(
            "the kernel was built without magpie-slab's kfence feature".into(),
        ));
        return Ok(());
    }
    let base = heap
        .header
        .allocator
        .wrapping_add(layout.allocator_kfence.offset);
    let read = |entry| heap.field(base, entry).map_err(|e| format!("kfence: {e}"));
    let pool = read(layout.kfence_pool)?;
    let meta = read(layout.kfence_meta)?;
    let nr_objects = layout.kfence_num_objects.offset;
    let mut list = Vec::new();
    if pool != 0 {
        if nr_objects > 1024 || layout.kfence_object_size.offset > 1 << 16 {
            return Err(format!(
                "kfence: {nr_objects} objects of {} bytes: corrupt descriptor",
                layout.kfence_object_size.offset
            ));
        }
        for index in 0..nr_objects {
            let at = meta.wrapping_add(index * layout.kfence_object_size.offset);
            match read_object(heap, at) {
                Ok(object) => list.push(object),
                Err(what) => problems.push(problem(format!("object #{index} at {at:#x}: {what}"))),
            }
        }
    }
    let stats = KfenceStats {
        enabled: pool != 0,
        interval_ms: read(layout.kfence_interval_ns)? / 1_000_000,
        pool_pages: if pool != 0 {
            layout.kfence_pool_pages.offset as usize
        } else {
            0
        },
        nr_objects: if pool != 0 { nr_objects as usize } else { 0 },
        nr_in_use: list
            .iter()
            .filter(|o| o.state == KfenceState::Allocated)
            .count(),
        nr_allocs: read(layout.kfence_nr_allocs)?,
        nr_frees: read(layout.kfence_nr_frees)?,
        nr_skipped: read(layout.kfence_nr_skipped)?,
        nr_bugs: read(layout.kfence_nr_bugs)?,
    };
    if !objects {
        return write_kfence_stats(out, &stats).map_err(|e| e.to_string());
    }
    for object in &list {
        let view = KfenceObjectView {
            index: object.index,
            state: object.state,
            addr: object.addr as usize,
            size: object.size as usize,
            cache: &object.cache,
            alloc: &object.alloc,
            free: &object.free,
        };
        write_kfence_object(out, &view, format).map_err(|e| e.to_string())?;
    }
    Ok(())
}

fn writeln(out: &mut String, line: &str) -> Result<(), String> {
    out.push_str(line);
    out.push('\n');
    Ok(())
}

fn read_object(heap: &Heap<'_>, at: u64) -> Result<Object, String> {
    let layout = &heap.layout;
    let read = |entry| heap.field(at, entry).map_err(|e| e.to_string());
    let byte = read(layout.kfence_object_state)?;
    let state = if byte == layout.kfence_state_unused.offset {
        KfenceState::Unused
    } else if byte == layout.kfence_state_allocated.offset {
        KfenceState::Allocated
    } else if byte == layout.kfence_state_freed.offset {
        KfenceState::Freed
    } else {
        return Err(format!("state byte {byte:#x} is none of the three"));
    };
    let len = read(layout.kfence_object_cache_len)?;
    if len > layout.kfence_object_cache.size {
        return Err(format!("cache name length {len} is corrupt"));
    }
    let mut name = vec![0u8; len as usize];
    heap.memory()
        .read(
            at.wrapping_add(layout.kfence_object_cache.offset),
            &mut name,
        )
        .map_err(|e| e.to_string())?;
    Ok(Object {
        index: read(layout.kfence_object_index)? as usize,
        state,
        addr: read(layout.kfence_object_addr)?,
        size: read(layout.kfence_object_obj_size)?,
        cache: String::from_utf8_lossy(&name).into_owned(),
        alloc: read_stack(heap, at.wrapping_add(layout.kfence_object_alloc.offset))?,
        free: read_stack(heap, at.wrapping_add(layout.kfence_object_free.offset))?,
    })
}

fn read_stack(heap: &Heap<'_>, at: u64) -> Result<KfenceStack, String> {
    let layout = &heap.layout;
    let read = |entry| heap.field(at, entry).map_err(|e| e.to_string());
    let len = read(layout.kfence_stack_len)?;
    let depth = (layout.kfence_stack_frames.size / 8).min(KFENCE_STACK_DEPTH as u64);
    if len > depth {
        return Err(format!("a stack of {len} frames (at most {depth})"));
    }
    let mut frames = [0usize; KFENCE_STACK_DEPTH];
    let mut bytes = vec![0u8; len as usize * 8];
    heap.memory()
        .read(
            at.wrapping_add(layout.kfence_stack_frames.offset),
            &mut bytes,
        )
        .map_err(|e| e.to_string())?;
    for (frame, chunk) in frames.iter_mut().zip(bytes.chunks_exact(8)) {
        *frame = u64::from_le_bytes(chunk.try_into().unwrap_or_default()) as usize;
    }
    Ok(KfenceStack::from_frames(
        &frames[..len as usize],
        read(layout.kfence_stack_cpu)? as usize,
        read(layout.kfence_stack_time)?,
    ))
}
