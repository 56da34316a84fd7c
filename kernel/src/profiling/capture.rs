//! Context capture (`allocinfo ctx FILE:LINE enable|disable|print`): for
//! each object one site allocates, its address, size, CPU, timestamp,
//! context string and backtrace, kept until the object is freed, in a
//! fixed pool (recording never allocates). The tests that decide whether
//! to record are inlined into `alloc_tag::charge` / `uncharge` on the
//! profiled hit; see [`crate::profiling`].

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

// The capture hooks on the profiled hit paths.
//
// `charge` and `uncharge` are inlined into the slab allocator's profiled
// alloc and free. A Rust call to the capture functions there, even behind a
// `#[cold]` branch, makes those functions non-leaf: LLVM gives them a stack
// frame and keeps the object in a callee-saved register across the call,
// on every hit, captured or not (15 instructions per pair, measured by
// disassembly; docs/BENCHMARKS.md "The hit in the kernel"). So the test and
// the call are one `asm!` block the register allocator sees as clobbering
// only the flags: a compare of the word in memory with a register and a
// branch over the call. The call goes to a thunk that saves every register
// the C ABI lets a callee clobber, aligns the stack, calls the capture
// function and returns popping its stack arguments (the shape of Linux's
// callee-save thunks, `PV_CALLEE_SAVE_REGS_THUNK`). With capture off, the
// hit pays the compare and the branch, and nothing else.

/// The capture test of a new object: if `token` is the captured site's,
/// record `ptr` and `bytes` ([`ctx_record`], through [`ctx_record_thunk`]).
#[inline(always)]
pub(super) fn ctx_capture_alloc(token: AllocTagRef, ptr: NonNull<u8>, bytes: usize) {
    // SAFETY: the block compares CTX_TAG (a 4-byte static) with `token` and,
    // if equal, pushes the two arguments and calls the thunk, which keeps
    // every general-purpose register but the flags (declared clobbered:
    // no `preserves_flags`) and pops its arguments on return (`ret 16`), so
    // the stack pointer is back where it was; the block uses stack below
    // it (no `nostack`), which this target allows (no red zone).
    unsafe {
        core::arch::asm!(
            "cmp dword ptr [rip + {ctx_tag}], {tag:e}",
            "jne 2f",
            "push {ptr}",
            "push {bytes}",
            "call {thunk}",
            "2:",
            ctx_tag = sym CTX_TAG,
            thunk = sym ctx_record_thunk,
            tag = in(reg) token.get(),
            ptr = in(reg) ptr.as_ptr(),
            bytes = in(reg) bytes,
        );
    }
}

/// The capture test of a freed object: while the pool holds records, drop
/// `ptr`'s ([`ctx_remove`], through [`ctx_remove_thunk`]).
#[inline(always)]
pub(super) fn ctx_capture_free(ptr: NonNull<u8>) {
    // SAFETY: as in `ctx_capture_alloc`: one argument, popped by the
    // thunk's `ret 8`.
    unsafe {
        core::arch::asm!(
            "cmp qword ptr [rip + {nr_records}], 0",
            "je 2f",
            "push {ptr}",
            "call {thunk}",
            "2:",
            nr_records = sym CTX_NR_RECORDS,
            thunk = sym ctx_remove_thunk,
            ptr = in(reg) ptr.as_ptr(),
        );
    }
}

/// A naked thunk that calls `$callee` (an `extern "C"` function) keeping
/// every general-purpose register: it links a frame (so backtraces walk
/// through it), saves the registers the C ABI lets a callee clobber, loads
/// the callee's arguments from its caller's stack pushes (`$load`: `[rbp +
/// 16]` is the last word pushed), aligns the stack for the call, restores,
/// and returns with `$ret` (`ret N` pops the N bytes of arguments).
macro_rules! callee_save_thunk {
    ($(#[$meta:meta])* fn $name:ident => $callee:path, load: [$($load:literal),+], $ret:literal) => {
        $(#[$meta])*
        #[unsafe(naked)]
        unsafe extern "C" fn $name() {
            core::arch::naked_asm!(
                "push rbp",
                "mov rbp, rsp",
                "push rax",
                "push rcx",
                "push rdx",
                "push rsi",
                "push rdi",
                "push r8",
                "push r9",
                "push r10",
                "push r11",
                $($load,)+
                "and rsp, -16",
                "call {callee}",
                // Back to the nine saved registers below the frame link.
                "lea rsp, [rbp - 72]",
                "pop r11",
                "pop r10",
                "pop r9",
                "pop r8",
                "pop rdi",
                "pop rsi",
                "pop rdx",
                "pop rcx",
                "pop rax",
                "pop rbp",
                $ret,
                callee = sym $callee,
            );
        }
    };
}

callee_save_thunk! {
    /// Calls [`ctx_record`]`(ptr, bytes)` keeping every register; the
    /// arguments are on the stack (`ptr` pushed first), popped on return.
    ///
    /// # Safety
    ///
    /// Only for [`ctx_capture_alloc`]'s `call`: two words pushed just
    /// before it (not a Rust-callable function).
    fn ctx_record_thunk => ctx_record, load: ["mov rdi, [rbp + 24]", "mov rsi, [rbp + 16]"], "ret 16"
}

callee_save_thunk! {
    /// Calls [`ctx_remove`]`(ptr)` keeping every register; `ptr` is on the
    /// stack, popped on return.
    ///
    /// # Safety
    ///
    /// Only for [`ctx_capture_free`]'s `call`: one word pushed just before
    /// it (not a Rust-callable function).
    fn ctx_remove_thunk => ctx_remove, load: ["mov rdi, [rbp + 16]"], "ret 8"
}

/// Captures the context of a new object of the captured site (`addr`, its
/// `bytes`). Never allocates. Called through [`ctx_record_thunk`].
#[cold]
#[inline(never)]
extern "C" fn ctx_record(addr: usize, bytes: usize) {
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

/// Drops the record of a freed object at `addr`, if there is one. Called
/// through [`ctx_remove_thunk`].
#[cold]
#[inline(never)]
extern "C" fn ctx_remove(addr: usize) {
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
/// none), stops any other site and drops its records.
pub fn ctx_enable(token: Option<AllocTagRef>) {
    CTX_TAG.store(0, Ordering::Relaxed);
    ctx_clear();
    CTX_NR_DROPPED.store(0, Ordering::Relaxed);
    CTX_TAG.store(token.map_or(0, AllocTagRef::get), Ordering::Relaxed);
}

/// Stops capturing and drops the records.
pub fn ctx_disable() {
    CTX_TAG.store(0, Ordering::Relaxed);
    ctx_clear();
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
