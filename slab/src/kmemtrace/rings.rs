//! The per-CPU rings' memory: descriptors, sub-buffer pointer arrays and
//! sub-buffers from the page source, taken all or nothing and given back
//! (see the parent module's "Buffers").

use core::ptr::NonNull;
use core::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize};

use super::{KmemtraceError, KmemtraceEvent, SUBBUF_EVENTS, SUBBUF_PAGES, head_word};
use crate::platform::{PAGE_SIZE, PageSource};

/// One CPU's ring descriptor: written only by its CPU with interrupts off
/// (plain loads and stores; the atomics are for readers on other CPUs).
///
/// The event path writes at `next` while it is below `limit` (the end of
/// the current sub-buffer) and bumps it: no index arithmetic. `next ==
/// limit` (both null after a start, or the sub-buffer full, or stacks on,
/// which keep them null) sends an event to the cold path, which finds the
/// slot of event `nr_written` from the sub-buffer array, counts an overrun
/// when the ring is full, and (stacks off) moves `next`/`limit` to the
/// slot's sub-buffer. An event's sequence number is `nr_written`: the ring
/// never overwrites, so every event dropped for a full ring comes after
/// every event written (a gap at the end, counted in `nr_overruns`).
#[repr(C, align(64))]
pub(crate) struct CpuRing {
    /// The slot of event `nr_written` while below `limit`.
    pub(super) next: AtomicPtr<KmemtraceEvent>,
    /// End of `next`'s sub-buffer (`next == limit`: the cold path).
    pub(super) limit: AtomicPtr<KmemtraceEvent>,
    /// Events written and published (release store after each).
    pub(crate) nr_written: AtomicUsize,
    /// The CPU's bits of an event's first word ([`head_word`]).
    pub(super) cpu_word: u64,
    /// `nr_subbufs` pointers to sub-buffers of [`SUBBUF_EVENTS`] events.
    pub(crate) subbufs: *mut *mut KmemtraceEvent,
    pub(crate) capacity: usize,
    pub(crate) nr_overruns: AtomicU64,
}

/// Allocate the ring descriptors, the sub-buffer pointer arrays and the
/// sub-buffers; all or nothing.
#[expect(
    clippy::cast_ptr_alignment,
    reason = "alloc_pages returns page-aligned memory"
)]
pub(super) fn allocate_rings(
    source: &dyn PageSource,
    nr_cpus: usize,
    nr_subbufs: usize,
) -> Result<NonNull<CpuRing>, KmemtraceError> {
    let capacity = nr_subbufs
        .checked_mul(SUBBUF_EVENTS)
        .filter(|_| nr_subbufs <= 1 << 20)
        .ok_or(KmemtraceError::TooManySubbufs(nr_subbufs))?;
    let total_bytes = nr_cpus * nr_subbufs * SUBBUF_PAGES * PAGE_SIZE;
    let oom = KmemtraceError::OutOfMemory { bytes: total_bytes };
    let ring_pages = (nr_cpus * core::mem::size_of::<CpuRing>()).div_ceil(PAGE_SIZE);
    let array_pages = (nr_subbufs * core::mem::size_of::<usize>()).div_ceil(PAGE_SIZE);
    let rings = source.alloc_pages(ring_pages).map_err(|_| oom)?;
    let rings = rings.cast::<CpuRing>();
    // Where a refusal stopped: the CPU, its array if it has one, and how
    // many sub-buffers it holds.
    let mut refused = None;
    'cpus: for cpu in 0..nr_cpus {
        let Ok(array) = source.alloc_pages(array_pages) else {
            refused = Some((cpu, None, 0));
            break;
        };
        let array = array.as_ptr().cast::<*mut KmemtraceEvent>();
        for index in 0..nr_subbufs {
            match source.alloc_pages(SUBBUF_PAGES) {
                // SAFETY: index < nr_subbufs, inside the array's pages.
                Ok(subbuf) => unsafe { *array.add(index) = subbuf.as_ptr().cast() },
                Err(_) => {
                    refused = Some((cpu, Some(array), index));
                    break 'cpus;
                }
            }
        }
        // SAFETY: cpu < nr_cpus, inside the descriptor pages (aligned to
        // the page, CpuRing is 64-aligned).
        unsafe {
            rings.as_ptr().add(cpu).write(CpuRing {
                next: AtomicPtr::new(core::ptr::null_mut()),
                limit: AtomicPtr::new(core::ptr::null_mut()),
                nr_written: AtomicUsize::new(0),
                cpu_word: head_word(0, 0, cpu as u16, 0),
                subbufs: array,
                capacity,
                nr_overruns: AtomicU64::new(0),
            })
        };
    }
    let Some((refused_cpu, partial, nr_partial)) = refused else {
        return Ok(rings);
    };
    // All or nothing: the complete rings' arrays and sub-buffers, then
    // the refused CPU's, then the descriptors go back.
    let complete = (0..refused_cpu).map(|cpu| {
        // SAFETY: CPU `cpu`'s ring is complete (written above) and unused.
        (unsafe { (*rings.as_ptr().add(cpu)).subbufs }, nr_subbufs)
    });
    for (array, nr) in complete.chain(partial.map(|array| (array, nr_partial))) {
        // SAFETY: `array` came from `alloc_pages(array_pages)` and holds
        // `nr` sub-buffers from `alloc_pages(SUBBUF_PAGES)`, all unused.
        unsafe {
            for index in 0..nr {
                let subbuf = NonNull::new_unchecked((*array.add(index)).cast::<u8>());
                source.free_pages(subbuf, SUBBUF_PAGES);
            }
            source.free_pages(NonNull::new_unchecked(array.cast()), array_pages);
        }
    }
    // SAFETY: from alloc_pages(ring_pages) above, unused.
    unsafe { source.free_pages(rings.cast(), ring_pages) };
    Err(oom)
}
