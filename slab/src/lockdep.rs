//! A small lockdep for debug builds: the interrupt-state half of Linux's
//! lock validator (`kernel/locking/lockdep.c`, "inconsistent lock state":
//! `{HARDIRQ-ON-W} -> {IN-HARDIRQ-W}`).
//!
//! Every lock of the allocator belongs to a **lock class**: the place in
//! the source where the lock is constructed (the cache list, the error
//! hook, ...: `#[track_caller]` on the lock's `const fn new`), or for the
//! per-cache locks the type they guard (one class for the depot lock of
//! every cache, one for every slab layer's, one for every trace table's). For each class the
//! validator keeps the interrupt states it has seen the lock taken in:
//!
//! - **in interrupt context** ([`Platform::in_interrupt`]), spinning on it
//!   (a `lock`, not a `try_lock`);
//! - **with interrupts on**: taken (or tried) outside interrupt context by
//!   a lock operation that did not turn interrupts off first.
//!
//! A class seen in both states is a deadlock waiting for its timing: the
//! handler that spins on the lock may have interrupted, on the same CPU,
//! the code that holds it, which never runs again. The validator reports
//! it the first time both are seen, whatever the timing, through the hook
//! set by [`set_report_hook`] (the kernel logs an error report), or, with
//! no hook, by panicking (tests). Each class is reported once.
//!
//! The allocator's lock types make the bad state hard to reach
//! (`slab/src/sync.rs`):
//! `IrqMutex` and `SpinIrq`
//! turn interrupts off before they spin, so their classes are never taken
//! "with interrupts on"; `IrqTryMutex`, taken
//! with interrupts on, is only *tried* from interrupt context. The
//! validator catches a change that takes one of them the wrong way (a
//! `lock` where a `try_lock` was meant, a new lock of the wrong type).
//!
//! Cost: nothing in release builds (no field, no call: every function
//! here is empty without `debug_assertions`). In debug builds, one
//! `Platform::in_interrupt` call, a hash of the class's key into a
//! table of `MAX_CLASSES` (128) slots and one relaxed atomic `fetch_or` per
//! lock operation. A class that finds the table full is not checked
//! ([`LockdepStats::nr_untracked`]).

use core::fmt;
use core::panic::Location;
#[cfg(debug_assertions)]
use core::sync::atomic::{AtomicU8, AtomicUsize, Ordering};

use crate::platform::Platform;

/// Lock classes the validator can track (sites constructing a lock).
#[cfg(debug_assertions)]
pub(crate) const MAX_CLASSES: usize = 128;

/// A lock class: where the lock was constructed (the allocator-wide
/// locks), or what it guards (the per-cache locks,
/// [`IrqMutex`](crate::sync::IrqMutex): one class per guarded type, so
/// that the lock costs no byte of the cache). `Copy`; nothing in release
/// builds.
#[derive(Clone, Copy)]
pub(crate) struct LockClass {
    #[cfg(debug_assertions)]
    name: LockClassName,
}

/// A lock class's name, as reported.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockClassName {
    /// The `new` call that constructs the locks of the class.
    Site(&'static Location<'static>),
    /// The type the locks of the class guard.
    Guards(&'static str),
}

impl fmt::Display for LockClassName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LockClassName::Site(site) => write!(f, "{site}"),
            LockClassName::Guards(name) => write!(f, "guarding {name}"),
        }
    }
}

impl LockClass {
    /// The class of a lock constructed by the caller's caller (the lock
    /// type's `new` is `#[track_caller]` too).
    #[track_caller]
    #[inline(always)]
    pub(crate) const fn here() -> Self {
        LockClass {
            #[cfg(debug_assertions)]
            name: LockClassName::Site(Location::caller()),
        }
    }

    /// The class of the locks that guard a `T`.
    #[inline(always)]
    pub(crate) fn guarding<T: ?Sized + 'static>() -> Self {
        LockClass {
            #[cfg(debug_assertions)]
            name: LockClassName::Guards(core::any::type_name::<T>()),
        }
    }

    /// The class's key in the table: the site's address (even), or the
    /// hash of the type's id (odd). Never 0.
    #[cfg(debug_assertions)]
    fn key<T: ?Sized + 'static>(self) -> usize {
        match self.name {
            LockClassName::Site(site) => core::ptr::from_ref(site) as usize,
            LockClassName::Guards(_) => {
                use core::hash::Hash;
                let mut hasher = Fnv(0xcbf2_9ce4_8422_2325);
                core::any::TypeId::of::<T>().hash(&mut hasher);
                hasher.0 as usize | 1
            }
        }
    }
}

/// FNV-1a, for [`LockClass::key`].
#[cfg(debug_assertions)]
struct Fnv(u64);

#[cfg(debug_assertions)]
impl core::hash::Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.0 = (self.0 ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
}

/// How a lock was taken, for [`acquired`].
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Acquire {
    /// Spun on after the lock operation turned interrupts off.
    LockIrqOff,
    /// Tried once after the lock operation turned interrupts off.
    TryIrqOff,
    /// Spun on without turning interrupts off.
    Lock,
    /// Tried once without turning interrupts off.
    Try,
}

/// Usage bit: taken by a spin in interrupt context.
#[cfg(debug_assertions)]
const USED_IN_IRQ: u8 = 1 << 0;
/// Usage bit: taken outside interrupt context with interrupts left on.
#[cfg(debug_assertions)]
const ENABLED_IRQ: u8 = 1 << 1;
/// Usage bit: tried in interrupt context (no deadlock: shown only).
#[cfg(debug_assertions)]
const TRIED_IN_IRQ: u8 = 1 << 2;
/// The class was reported (once).
#[cfg(debug_assertions)]
const REPORTED: u8 = 1 << 3;

/// One tracked class: its key (0: free slot) and usage bits.
#[cfg(debug_assertions)]
struct ClassSlot {
    key: AtomicUsize,
    usage: AtomicU8,
}

#[cfg(debug_assertions)]
static CLASSES: [ClassSlot; MAX_CLASSES] = [const {
    ClassSlot {
        key: AtomicUsize::new(0),
        usage: AtomicU8::new(0),
    }
}; MAX_CLASSES];

/// Classes that found the table full (not checked).
#[cfg(debug_assertions)]
static NR_UNTRACKED: AtomicUsize = AtomicUsize::new(0);
/// Reports made (classes found in both states).
#[cfg(debug_assertions)]
static NR_REPORTS: AtomicUsize = AtomicUsize::new(0);
/// The report hook (a `fn(&LockdepReport)` as `usize`; 0: panic).
#[cfg(debug_assertions)]
static HOOK: AtomicUsize = AtomicUsize::new(0);

/// A lock class seen taken both in interrupt context and with interrupts
/// on: what the validator reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LockdepReport {
    /// The class: where its locks are constructed, or what they guard.
    pub class: LockClassName,
    /// The acquisition that completed the pair: true if it was the one in
    /// interrupt context, false if the one with interrupts on.
    pub now_in_irq: bool,
    /// The CPU that made it ([`Platform::cpu_id`]).
    pub cpu: usize,
}

impl fmt::Display for LockdepReport {
    /// `inconsistent lock state: lock class slab/src/x.rs:12:9 taken in
    /// interrupt context and with interrupts enabled (now: in interrupt
    /// context, cpu 0)`, in the words of Linux's report.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "inconsistent lock state: lock class {} taken in interrupt context \
             and with interrupts enabled (now: {}, cpu {}); an interrupt on a CPU \
             that holds it would spin forever",
            self.class,
            if self.now_in_irq {
                "in interrupt context"
            } else {
                "with interrupts enabled"
            },
            self.cpu
        )
    }
}

/// What the validator has seen.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LockdepStats {
    /// Whether it runs (debug builds).
    pub enabled: bool,
    /// Lock classes seen.
    pub nr_classes: usize,
    /// Classes taken (spun on) in interrupt context.
    pub nr_used_in_irq: usize,
    /// Classes only tried in interrupt context.
    pub nr_tried_in_irq: usize,
    /// Classes taken with interrupts enabled.
    pub nr_enabled_irq: usize,
    /// Classes found in both states (reported).
    pub nr_reports: usize,
    /// Classes not checked: the table of `MAX_CLASSES` (128) was full.
    pub nr_untracked: usize,
}

/// Report inconsistent lock states through `hook` (`None`: panic, the
/// default). The hook runs where the lock was taken, in interrupt
/// context too, possibly with allocator locks held: it must not allocate
/// or take a lock that code it can interrupt holds (print, count). Never
/// called in release builds.
pub fn set_report_hook(hook: Option<fn(&LockdepReport)>) {
    #[cfg(debug_assertions)]
    HOOK.store(hook.map_or(0, |hook| hook as usize), Ordering::Release);
    #[cfg(not(debug_assertions))]
    let _ = hook;
}

/// What the validator has seen so far (all zero in release builds).
pub fn stats() -> LockdepStats {
    #[cfg(debug_assertions)]
    {
        let mut stats = LockdepStats {
            enabled: true,
            nr_untracked: NR_UNTRACKED.load(Ordering::Relaxed),
            nr_reports: NR_REPORTS.load(Ordering::Relaxed),
            ..LockdepStats::default()
        };
        for slot in &CLASSES {
            if slot.key.load(Ordering::Acquire) == 0 {
                continue;
            }
            let usage = slot.usage.load(Ordering::Relaxed);
            stats.nr_classes += 1;
            stats.nr_used_in_irq += usize::from(usage & USED_IN_IRQ != 0);
            stats.nr_tried_in_irq +=
                usize::from(usage & (USED_IN_IRQ | TRIED_IN_IRQ) == TRIED_IN_IRQ);
            stats.nr_enabled_irq += usize::from(usage & ENABLED_IRQ != 0);
        }
        stats
    }
    #[cfg(not(debug_assertions))]
    LockdepStats::default()
}

/// Note that a lock of `class`, guarding a `T`, was taken (or tried:
/// `how`, whether it succeeded or not) on this CPU now; report the class
/// if it has now been seen both in interrupt context and with interrupts
/// on.
#[inline(always)]
pub(crate) fn acquired<P: Platform, T: ?Sized + 'static>(class: LockClass, how: Acquire) {
    #[cfg(debug_assertions)]
    check::<P>(class, class.key::<T>(), how);
    #[cfg(not(debug_assertions))]
    let _ = (class, how);
}

#[cfg(debug_assertions)]
#[inline(never)]
fn check<P: Platform>(class: LockClass, key: usize, how: Acquire) {
    let in_irq = P::in_interrupt();
    let bit = match (in_irq, how) {
        (true, Acquire::Lock | Acquire::LockIrqOff) => USED_IN_IRQ,
        (true, Acquire::Try | Acquire::TryIrqOff) => TRIED_IN_IRQ,
        (false, Acquire::Lock | Acquire::Try) => ENABLED_IRQ,
        (false, Acquire::LockIrqOff | Acquire::TryIrqOff) => return,
    };
    let Some(slot) = slot_of(key) else {
        return;
    };
    if slot.usage.load(Ordering::Relaxed) & bit != 0 {
        return;
    }
    let before = slot.usage.fetch_or(bit, Ordering::Relaxed);
    let after = before | bit;
    if after & (USED_IN_IRQ | ENABLED_IRQ) != USED_IN_IRQ | ENABLED_IRQ || before & REPORTED != 0 {
        return;
    }
    if slot.usage.fetch_or(REPORTED, Ordering::Relaxed) & REPORTED != 0 {
        return;
    }
    NR_REPORTS.fetch_add(1, Ordering::Relaxed);
    let report = LockdepReport {
        class: class.name,
        now_in_irq: in_irq,
        cpu: P::cpu_id(),
    };
    match HOOK.load(Ordering::Acquire) {
        0 => panic!("lockdep: {report}"),
        hook => {
            // SAFETY: HOOK only ever holds a `fn(&LockdepReport)` stored
            // by set_report_hook.
            let hook = unsafe { core::mem::transmute::<usize, fn(&LockdepReport)>(hook) };
            hook(&report);
        }
    }
}

/// The slot of the class `key`, claimed if new; `None` if the table is
/// full.
#[cfg(debug_assertions)]
fn slot_of(key: usize) -> Option<&'static ClassSlot> {
    let start = (key >> 1).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (usize::BITS - 7);
    for probe in 0..MAX_CLASSES {
        let slot = &CLASSES[(start + probe) % MAX_CLASSES];
        let current = slot.key.load(Ordering::Acquire);
        if current == key {
            return Some(slot);
        }
        if current == 0 {
            match slot
                .key
                .compare_exchange(0, key, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return Some(slot),
                Err(other) if other == key => return Some(slot),
                Err(_) => {}
            }
        }
    }
    NR_UNTRACKED.fetch_add(1, Ordering::Relaxed);
    None
}
