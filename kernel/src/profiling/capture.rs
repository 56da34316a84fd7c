//! Context capture (`allocinfo ctx FILE:LINE enable|disable|print`): for
//! each object one site allocates, its address, size, CPU, timestamp,
//! context string and backtrace, kept until the object is freed, in a
//! fixed pool (recording never allocates). The tests that decide whether
//! to record run in the slab allocator's tag hooks, off its profiled hits
//! (`kmem::ctx_capture_enable`); see [`crate::profiling`].

use alloc::vec::Vec;
use core::ptr::NonNull;
use core::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};

use magpie_codetag::alloc_tag::AllocTagRef;
use magpie_slab::TraceRecord;
use spin::Mutex;

use crate::arch::{self, IrqGuard};
use crate::tracing::{call_site, context};

/// Records the context-capture pool holds.
pub const CTX_MAX_RECORDS: usize = 256;

/// The charge token of the site being captured (0: none).
static CTX_TAG: AtomicU32 = AtomicU32::new(0);
/// Records in the pool (read without the lock to skip lookups).
static CTX_NR_RECORDS: AtomicUsize = AtomicUsize::new(0);
/// Records that did not fit in the pool.
static CTX_NR_DROPPED: AtomicU64 = AtomicU64::new(0);

struct CtxPool {
    /// `addr == 0`: a free slot.
    records: [TraceRecord; CTX_MAX_RECORDS],
}

/// A trace record with nothing in it (`addr == 0`), for fixed buffers.
pub const EMPTY_RECORD: TraceRecord = magpie_slab::reports::EMPTY_TRACE_RECORD;

static CTX_POOL: Mutex<CtxPool> = Mutex::new(CtxPool {
    records: [EMPTY_RECORD; CTX_MAX_RECORDS],
});

// The capture hooks. They run in the slab allocator's tag hooks
// (`AllocTagHooks::on_charge`, `AllocTagHooks::on_uncharge`), which it
// calls off its profiled hits; `kmem::ctx_capture_enable` turns the hits off
// (`AllocProfiling::set_tag_hooks`) while a site is captured, so every
// charge and uncharge comes here then, and the hits pay nothing for capture
// at any time (they used to pay a compare and a branch each side, and an
// `asm!` call to a register-preserving thunk, to stay free of a frame).

/// The capture test of a new object: if `token` is the captured site's,
/// record `ptr` and `bytes` ([`ctx_record`]).
#[inline]
pub fn ctx_capture_alloc(token: AllocTagRef, ptr: NonNull<u8>, bytes: usize) {
    if CTX_TAG.load(Ordering::Relaxed) == token.get() {
        ctx_record(ptr.as_ptr() as usize, bytes);
    }
}

/// The capture test of a freed object: while the pool holds records, drop
/// `ptr`'s ([`ctx_remove`]).
#[inline]
pub fn ctx_capture_free(ptr: NonNull<u8>) {
    if CTX_NR_RECORDS.load(Ordering::Relaxed) != 0 {
        ctx_remove(ptr.as_ptr() as usize);
    }
}

/// Captures the context of a new object of the captured site (`addr`, its
/// `bytes`). Never allocates.
#[cold]
#[inline(never)]
fn ctx_record(addr: usize, bytes: usize) {
    let mut record = EMPTY_RECORD;
    record.addr = addr;
    record.size = bytes;
    record.cpu = arch::cpu_id() as u32;
    record.timestamp = arch::rdtsc();
    record.context_len = context::write_this_cpu(&mut record.context) as u8;
    record.nr_frames = call_site::backtrace(&mut record.frames) as u8;
    let _irq = IrqGuard::new();
    let mut pool = CTX_POOL.lock();
    match pool.records.iter_mut().find(|slot| slot.addr == 0) {
        Some(slot) => {
            *slot = record;
            CTX_NR_RECORDS.fetch_add(1, Ordering::Relaxed);
        }
        None => {
            CTX_NR_DROPPED.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Drops the record of a freed object at `addr`, if there is one.
#[cold]
#[inline(never)]
fn ctx_remove(addr: usize) {
    let _irq = IrqGuard::new();
    let mut pool = CTX_POOL.lock();
    if let Some(slot) = pool.records.iter_mut().find(|slot| slot.addr == addr) {
        *slot = EMPTY_RECORD;
        CTX_NR_RECORDS.fetch_sub(1, Ordering::Relaxed);
    }
}

fn ctx_clear() {
    let _irq = IrqGuard::new();
    let mut pool = CTX_POOL.lock();
    for slot in pool.records.iter_mut() {
        *slot = EMPTY_RECORD;
    }
    CTX_NR_RECORDS.store(0, Ordering::Relaxed);
}

/// Starts capturing context for the new objects of the site whose charge
/// token is `token` (`alloc_tag::token`; `None`, before profiling is up:
/// none), stops any other site and drops its records. Crate-only: the
/// kernel's entry point is `kmem::ctx_capture_enable`, which also sends
/// every allocation through the hooks that capture.
pub(crate) fn ctx_enable(token: Option<AllocTagRef>) {
    CTX_TAG.store(0, Ordering::Relaxed);
    ctx_clear();
    CTX_NR_DROPPED.store(0, Ordering::Relaxed);
    CTX_TAG.store(token.map_or(0, AllocTagRef::get), Ordering::Relaxed);
}

/// Stops capturing and drops the records (crate-only: see
/// `kmem::ctx_capture_disable`).
pub(crate) fn ctx_disable() {
    CTX_TAG.store(0, Ordering::Relaxed);
    ctx_clear();
}

/// Where the capture pool lies in the kernel's data (`start..end`): its
/// records hold the addresses of the objects they describe, so
/// `kmem findleaks` leaves it out of its roots (metadata never hides a
/// leak).
pub fn ctx_pool_range() -> core::ops::Range<usize> {
    let start = (&raw const CTX_POOL).cast::<u8>() as usize;
    start..start + core::mem::size_of_val(&CTX_POOL)
}

/// The live records, copied out (the copy's memory is reserved before the
/// pool lock is taken: nothing allocates under it).
pub fn ctx_records() -> Vec<TraceRecord> {
    let mut records = Vec::with_capacity(CTX_MAX_RECORDS);
    let _irq = IrqGuard::new();
    let pool = CTX_POOL.lock();
    records.extend(
        pool.records
            .iter()
            .filter(|record| record.addr != 0)
            .copied(),
    );
    records
}

/// Copies live records from the pool, slot order, starting at slot
/// `from`, into `buf` (under the pool lock; nothing allocates). Returns how
/// many were copied and the slot to continue from (`CTX_MAX_RECORDS` when
/// the pool was walked to its end).
pub fn ctx_copy(from: usize, buf: &mut [TraceRecord]) -> (usize, usize) {
    let _irq = IrqGuard::new();
    let pool = CTX_POOL.lock();
    let mut nr_copied = 0;
    let mut slot = from.min(CTX_MAX_RECORDS);
    while slot < CTX_MAX_RECORDS && nr_copied < buf.len() {
        if pool.records[slot].addr != 0 {
            buf[nr_copied] = pool.records[slot];
            nr_copied += 1;
        }
        slot += 1;
    }
    (nr_copied, slot)
}

/// Whether context capture is on for the site whose charge token is
/// `token` (`alloc_tag::token`).
pub fn ctx_is_capturing(token: Option<AllocTagRef>) -> bool {
    token.is_some_and(|token| CTX_TAG.load(Ordering::Relaxed) == token.get())
}

/// Records dropped because the pool was full since capture was enabled.
pub fn ctx_nr_dropped() -> u64 {
    CTX_NR_DROPPED.load(Ordering::Relaxed)
}
