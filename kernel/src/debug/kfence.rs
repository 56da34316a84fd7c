//! KFENCE in the kernel (Linux `mm/kfence/`, `Documentation/dev-tools/kfence.rst`):
//! the boot argument, the report hook, and the page-fault handler that
//! turns a fault in the pool into a report and carries on.
//!
//! - `kfence.sample_interval=MS` (default
//!   [`KFENCE_DEFAULT_INTERVAL_MS`], 100 ms as in Linux; 0: no sampling,
//!   only `lkdtm`'s forced samples): one allocation per interval is served
//!   from the guarded pool (`magpie_slab::kfence`), mapped with 4 KiB pages
//!   in the MMIO window (`crate::mm::paging::map_kfence_pool`).
//! - A page fault inside the pool prints
//!   `BUG: KFENCE: out-of-bounds write in FUNC+0xOFF` (or use-after-free,
//!   invalid), the offset from the object, its cache and its allocation and
//!   free stacks; the page is mapped back in and the faulting instruction
//!   runs again, so the kernel carries on (the page stays mapped until the
//!   object's slot is reused: one report per bug).
//! - Bad frees of pool objects (`invalid free`) and canary overwrites
//!   (`memory corruption`) are reported at the free by the allocator's hook.
//!
//! `kmem kfence` shows the pool's figures.

use core::fmt::{self, Write};

use magpie_slab::kfence::{
    KFENCE_DEFAULT_INTERVAL_MS, KFENCE_NUM_OBJECTS, KFENCE_POOL_PAGES, KFENCE_STACK_DEPTH,
    KfenceReport, KfenceStack,
};

use spin::Mutex;

use crate::arch::idt::ExceptionInfo;
use crate::arch::{self, percpu};
use crate::debug::slab_debug::KernelFormat;
use crate::debug::symbols;
use crate::dev::console;
use crate::kmem::SLAB;

/// The boot argument.
const ARG: &str = "kfence.sample_interval";

/// The sample interval the command line asks for, in ms: `kfence.sample_interval=MS`,
/// default [`KFENCE_DEFAULT_INTERVAL_MS`]; a bad value is reported and
/// the default kept.
pub fn sample_interval(cmdline: &str) -> u64 {
    let mut interval = KFENCE_DEFAULT_INTERVAL_MS;
    for word in cmdline.split_ascii_whitespace() {
        let Some(value) = word
            .strip_prefix(ARG)
            .and_then(|rest| rest.strip_prefix('='))
        else {
            continue;
        };
        match value.parse::<u64>() {
            Ok(ms) => interval = ms,
            Err(_) => log::error!(
                "{word}: not a number of milliseconds; kfence keeps {KFENCE_DEFAULT_INTERVAL_MS} ms"
            ),
        }
    }
    interval
}

/// Sets KFENCE up (after the slab allocator): the pool, the report hook,
/// the page-fault handler. A platform failure leaves KFENCE off, logged.
pub fn init(cmdline: &str) {
    let interval = sample_interval(cmdline);
    SLAB.kfence().set_hook(Some(report));
    arch::idt::set_page_fault_handler(handle_page_fault);
    match SLAB.kfence().init(interval) {
        Ok(()) => log::info!(
            "kfence: initialized - using {} bytes for {KFENCE_NUM_OBJECTS} objects, sample interval {interval} ms",
            KFENCE_POOL_PAGES * magpie_slab::PAGE_SIZE
        ),
        Err(error) => log::warn!("kfence: {error}; off"),
    }
}

/// The latest report (for `lkdtm`'s verdict line).
static LAST: Mutex<Option<KfenceReport>> = Mutex::new(None);

/// Prints a report on the console (the allocator's hook, and the fault
/// handler's) and keeps it as the latest. Allocates nothing.
pub fn report(report: &KfenceReport) {
    console::write_fmt(format_args!("{}\n", report.display(&KernelFormat)));
    if let Some(mut last) = LAST.try_lock() {
        *last = Some(*report);
    }
}

/// The latest report, if any.
pub fn last_report() -> Option<KfenceReport> {
    *LAST.lock()
}

/// One line for a report: `out-of-bounds write at 0x… (1B right of
/// kfence-#3) in lkdtm-kfence`.
pub struct Summary<'a>(pub &'a KfenceReport);

impl fmt::Display for Summary<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let report = self.0;
        let access = match report.write {
            Some(true) => " write",
            Some(false) => " read",
            None => "",
        };
        write!(
            f,
            "KFENCE: {}{access} at {:#x}",
            report.kind.name(),
            report.addr
        )?;
        if let Some(object) = report.object {
            match report.relation() {
                Some((bytes, side)) => write!(f, " ({bytes}B {side} of kfence-#{})", object.index)?,
                None => write!(f, " (in kfence-#{})", object.index)?,
            }
            write!(f, " in {}", object.cache.as_str())?;
        }
        Ok(())
    }
}

/// The page-fault handler's first resort: a fault in the pool is reported
/// and the access resumed.
fn handle_page_fault(info: &ExceptionInfo<'_>, address: usize) -> bool {
    if !SLAB.kfence().contains(address) {
        return false;
    }
    // Error code bit 1: the access was a write.
    let write = info.error_code.is_some_and(|code| code & 2 != 0);
    let mut frames = [0usize; KFENCE_STACK_DEPTH];
    frames[0] = info.frame.instruction_pointer.as_u64() as usize;
    let nr = 1 + symbols::backtrace_from(info.frame_pointer, &mut frames[1..]);
    let stack = KfenceStack::from_frames(&frames[..nr], percpu::cpu_id(), arch::rdtsc());
    match SLAB.kfence().fault(address, write, stack) {
        Some(fault) => {
            report(&fault);
            true
        }
        None => false,
    }
}

/// `kmem kfence`: the pool's figures, one line each
/// (`magpie_slab::reports::write_kfence_stats`).
///
/// # Errors
///
/// The error of `out`, as is.
pub fn write_stats(out: &mut dyn Write) -> fmt::Result {
    magpie_slab::reports::write_kfence_stats(out, &SLAB.kfence().stats())
}

/// `kmem kfence objects`: every pool object as Linux's
/// `/sys/kernel/debug/kfence/objects` lists it.
///
/// # Errors
///
/// The error of `out`, as is.
pub fn write_objects(out: &mut dyn Write) -> fmt::Result {
    let mut result = Ok(());
    SLAB.kfence().for_each_object(|object| {
        if result.is_ok() {
            let view = magpie_slab::reports::KfenceObjectView {
                index: object.index,
                state: object.state,
                addr: object.addr,
                size: object.size,
                cache: object.cache.as_str(),
                alloc: &object.alloc,
                free: &object.free,
            };
            result = magpie_slab::reports::write_kfence_object(out, &view, &KernelFormat);
        }
    });
    result
}
