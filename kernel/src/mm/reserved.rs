//! Physical ranges the firmware placed in memory that must stay reserved
//! and mapped: the ACPI tables. The PVH memory map comes from QEMU's raw
//! e820 and may list the tables the firmware put at the top of RAM as
//! usable, so `arch::acpi` records every table it reads here ([`add`]),
//! and [`crate::mm::frame`] reserves [`ranges`] and [`crate::mm::paging`]
//! keeps them in the direct map.
//!
//! A registry rather than a call into `arch::acpi`: memory management sits
//! below the architecture layer and imports nothing of it.

use core::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Most ranges kept; more are reported and not reserved.
pub const MAX_RANGES: usize = 64;
static RANGES: [(AtomicU64, AtomicU64); MAX_RANGES] =
    [const { (AtomicU64::new(0), AtomicU64::new(0)) }; MAX_RANGES];
static NR_RANGES: AtomicUsize = AtomicUsize::new(0);

/// Records `[start, start + len)`, unless a range already recorded holds it.
/// Boot CPU only, before the frame allocator starts.
pub fn add(start: u64, len: u64) {
    let (start, end) = (start, start + len);
    let nr = NR_RANGES.load(Ordering::Relaxed).min(MAX_RANGES);
    let known = RANGES[..nr]
        .iter()
        .any(|(s, e)| s.load(Ordering::Relaxed) <= start && end <= e.load(Ordering::Relaxed));
    if known {
        return;
    }
    let index = NR_RANGES.fetch_add(1, Ordering::Relaxed);
    if index < MAX_RANGES {
        RANGES[index].0.store(start, Ordering::Relaxed);
        RANGES[index].1.store(end, Ordering::Relaxed);
    } else {
        log::warn!("acpi: more than {MAX_RANGES} table ranges; {start:#x}..{end:#x} not reserved");
    }
}

/// Physical `[start, end)` of every range recorded.
pub fn ranges() -> impl Iterator<Item = (u64, u64)> {
    let nr = NR_RANGES.load(Ordering::Relaxed).min(MAX_RANGES);
    RANGES[..nr]
        .iter()
        .map(|(start, end)| (start.load(Ordering::Relaxed), end.load(Ordering::Relaxed)))
}
