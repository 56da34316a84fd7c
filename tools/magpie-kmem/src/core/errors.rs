//! The allocator's error reports from an image, as the shell's `kmem
//! errors` prints them (`magpie_slab::reports::write_errors`): the ring's
//! slots are in their wire form, decoded by the library's own
//! `ErrorReport::from_wire`.

use magpie_slab::reports::{ErrorReport, ReportFormat, write_errors};

use super::heap::{Heap, Problem};

/// Write `kmem errors` of the image to `out`; a slot that does not decode
/// is a problem and left out.
///
/// # Errors
///
/// The ring cannot be read, or its figures are corrupt.
pub fn write_error_reports(
    heap: &Heap<'_>,
    format: &dyn ReportFormat,
    out: &mut String,
    problems: &mut Vec<Problem>,
) -> Result<(), String> {
    let layout = &heap.layout;
    let ring = heap
        .header
        .allocator
        .wrapping_add(layout.allocator_errors.offset)
        .wrapping_add(heap.header.errors_lock_data);
    let nr_reported = heap
        .field(ring, layout.error_ring_nr_reported)
        .map_err(|e| format!("the error ring: {e}"))?;
    let size = layout.error_ring_size.offset;
    let wire = layout.error_wire_size.offset;
    if size == 0 || size > 1024 || wire > 4096 || size * wire != layout.error_ring_reports.size {
        return Err(format!(
            "the error ring's figures are corrupt ({size} slots of {wire} bytes in {})",
            layout.error_ring_reports.size
        ));
    }
    let mut reports = Vec::new();
    let first = nr_reported.saturating_sub(size) + 1;
    for seq in first..=nr_reported {
        let slot = (seq - 1) % size;
        let at = ring
            .wrapping_add(layout.error_ring_reports.offset)
            .wrapping_add(slot * wire);
        let mut bytes = vec![0u8; wire as usize];
        let decoded = heap
            .memory()
            .read(at, &mut bytes)
            .map_err(|e| e.to_string())
            .and_then(|()| {
                ErrorReport::from_wire(&bytes).ok_or_else(|| "no report decodes from it".into())
            });
        match decoded {
            Ok(report) => reports.push(report),
            Err(what) => problems.push(Problem {
                cache: "errors".into(),
                what: format!("report #{seq} at {at:#x}: {what}"),
            }),
        }
    }
    write_errors(out, nr_reported, &reports, format).map_err(|e| e.to_string())
}
