//! The cache's locks (depot, slab layer, trace table) behind one name so
//! the `loom` model tests can swap them, taken with interrupts off
//! ([`IrqMutex`]); [`IrqGuard`], the interrupts-off guard; and
//! [`LocalLocked`], the per-CPU in-use flag (Linux's `local_trylock`, as
//! SLUB's sheaves use it) through which a CPU reaches its own per-CPU
//! caches on the magazine hits.
//!
//! Normal builds: exactly [`spin::Mutex`] and [`spin::MutexGuard`]
//! re-exported, so this module costs nothing. Host tests built with
//! `RUSTFLAGS="--cfg loom"`: a thin wrapper over `loom::sync::Mutex` with
//! spin's API (`lock` returns the guard, `try_lock` an `Option`), so that
//! loom sees, and permutes, every acquisition of these locks (a spinning
//! lock would hang a loom model: loom only switches threads at its own
//! operations).
//!
//! The allocator-wide locks (the cache list, the size-class lock, the
//! hooks, the debug configuration, KFENCE's and kmemtrace's) are built on
//! `spin::Mutex` in both builds: they must be constructible in a `const
//! fn` ([`Kmem::new`](crate::Kmem::new)), which loom's are not,
//! and the models never contend on them.
//!
//! # Safe from interrupts by construction
//!
//! An interrupt handler may allocate and free, and so reach any lock an
//! allocation or a free can take. A handler that spins on a lock which the
//! code it interrupted (on the same CPU) holds never returns. So every
//! lock of the allocator is one of three types, and none offers a way to
//! spin on it with interrupts on:
//!
//! - [`IrqMutex`] (the per-cache locks: depot, slab layer and bufctl
//!   hash, trace table) and [`SpinIrq`] (allocator-wide: the error and
//!   KFENCE hooks, the debug configuration, KFENCE's pool, kmemtrace's
//!   stack table and controls): `lock` turns interrupts off, then spins.
//! - [`IrqTryMutex`] (the cache list, the size-class lock: held across
//!   work that must run with interrupts on, such as cross-CPU calls):
//!   `lock` is for code outside interrupt context; an interrupt handler
//!   only calls `try_lock`, whose caller falls back without losing
//!   anything (a size class made on first use fails the allocation with
//!   `OutOfMemory`; a reap under pressure is skipped and the source's
//!   error returned; KFENCE's tick waits for the next one).
//!
//! Debug builds check it ([`crate::lockdep`]): every lock operation notes
//! its class's interrupt state, and a class taken both in interrupt
//! context and with interrupts on is reported. The error ring
//! ([`ErrorRing`](crate::reports::error::ErrorRing), a public type with its own
//! lock) is only reached through the allocator's interrupts-off sections.

use core::cell::UnsafeCell;
use core::marker::PhantomData;
use core::ops::{Deref, DerefMut};
use core::sync::atomic::{AtomicU8, AtomicU32, Ordering, compiler_fence};

#[cfg(not(all(test, loom)))]
pub(crate) use spin::{Mutex, MutexGuard};

#[cfg(all(test, loom))]
pub(crate) use loom_mutex::{Mutex, MutexGuard};

use crate::lockdep::{self, Acquire, LockClass};
use crate::platform::Platform;

/// Interrupts disabled on this CPU (through [`Platform::irq_save`]) until
/// dropped, which restores the previous state. While one exists, the
/// running CPU owns its per-CPU caches: nothing else on this CPU runs
/// (no interrupt handler), and other CPUs reach them only through
/// [`Platform::cross_cpu_call`], which runs on this CPU, hence not now.
///
/// Not `Send`: the guard belongs to the CPU that made it.
#[must_use = "interrupts are restored when the guard is dropped"]
pub struct IrqGuard<P: Platform> {
    state: usize,
    _not_send: PhantomData<NotSend<P>>,
}

/// Makes [`IrqGuard`] neither `Send` nor `Sync` (a raw pointer), and ties
/// it to its platform.
type NotSend<P> = (*const (), fn() -> P);

impl<P: Platform> IrqGuard<P> {
    /// Disable interrupts until the guard is dropped.
    #[inline(always)]
    pub fn new() -> Self {
        IrqGuard {
            state: P::irq_save(),
            _not_send: PhantomData,
        }
    }
}

impl<P: Platform> Default for IrqGuard<P> {
    #[inline(always)]
    fn default() -> Self {
        Self::new()
    }
}

impl<P: Platform> Drop for IrqGuard<P> {
    #[inline(always)]
    fn drop(&mut self) {
        P::irq_restore(self.state);
    }
}

/// This CPU's per-CPU state `T` held through its in-use flag (a byte, 0
/// when free): one non-atomic read-modify-write instruction and a
/// compiler fence to take it on x86-64 ([`take_flag`]: no `lock` prefix,
/// no `cli`), a compiler fence and a plain store of 0 to give it back on
/// drop. Linux's `local_trylock` as SLUB's sheaves use it.
///
/// Why no atomic instruction is needed: only this CPU takes the flag, and
/// what can run on this CPU between the flag's test and its store is an
/// interrupt handler, which runs to completion (and gives the flag back)
/// before the code it interrupted resumes ([`Platform::LOCAL_TRYLOCK`]);
/// on x86-64 test and store are one instruction, so nothing runs between. An
/// interrupt handler that finds the flag held has interrupted the owner:
/// it must not touch `T` and takes the locked slow path instead.
///
/// With [`Platform::LOCAL_TRYLOCK`] false (host platforms whose threads
/// share an id under an emulated interrupt lock, kernels that preempt),
/// [`LocalLocked::try_lock`] disables interrupts instead, for as long as
/// it is held, and leaves the flag alone (nothing that tests it can run
/// on this CPU meanwhile).
#[must_use = "the flag is given back when the guard is dropped"]
pub(crate) struct LocalLocked<'a, P: Platform, T> {
    flag: &'a AtomicU8,
    cell: &'a UnsafeCell<T>,
    /// `Some(state)` when [`LocalLocked::try_lock`] disabled interrupts
    /// instead of taking the flag (never with
    /// [`Platform::LOCAL_TRYLOCK`]).
    irq: Option<usize>,
    _not_send: PhantomData<NotSend<P>>,
}

impl<'a, P: Platform, T> LocalLocked<'a, P, T> {
    /// The magazine hits' entry (interrupts possibly on): take `flag`,
    /// guarding `cell`, unless it is held (`None`: the caller interrupted
    /// its holder).
    ///
    /// # Safety
    /// `flag` and `cell` are the running CPU's (read from its
    /// [`Platform::cpu_offset`]), `flag` is the byte at `base + index +
    /// FLAG` (three terms so the hit's `sub` addresses it as
    /// `[base + index + FLAG]`, with the registers the rest of the hit
    /// uses), and `cell` is reached only under `flag`
    /// (or in a cross-CPU call to this CPU that holds it:
    /// [`LocalLocked::try_lock_here`]).
    #[inline(always)]
    pub(crate) unsafe fn try_lock<const FLAG: usize>(
        base: *const u8,
        index: usize,
        flag: &'a AtomicU8,
        cell: &'a UnsafeCell<T>,
    ) -> Option<Self> {
        debug_assert!(core::ptr::eq(
            flag.as_ptr().cast_const(),
            base.wrapping_add(index + FLAG)
        ));
        if !P::LOCAL_TRYLOCK || crate::restart::enabled::<P>() {
            // Interrupts off exclude everything else on this CPU (the
            // flag is only ever held with them off then): the flag is
            // neither tested nor taken, the hit is as cheap as before.
            // With restartable hits too: they take no flag, so whatever
            // else reaches the per-CPU cache here (a recorded hit) keeps
            // them out by disabling interrupts (`crate::restart`).
            return Some(LocalLocked {
                flag,
                cell,
                irq: Some(P::irq_save()),
                _not_send: PhantomData,
            });
        }
        // SAFETY: the flag is at base + index + FLAG (our caller's
        // promise, asserted above).
        if !unsafe { take_flag::<P, FLAG>(base, index) } {
            return None;
        }
        // Nothing of `cell` is read before the flag is ours.
        compiler_fence(Ordering::SeqCst);
        interrupt_point::<P>();
        Some(LocalLocked {
            flag,
            cell,
            irq: None,
            _not_send: PhantomData,
        })
    }

    /// [`LocalLocked::try_lock`] for code that already excludes this
    /// CPU's other interrupts-off sections (interrupts off, or a
    /// cross-CPU call running on the CPU): the flag only. `None` if held:
    /// the code interrupted a hit on the flag's CPU.
    ///
    /// # Safety
    /// As for [`LocalLocked::try_lock`], `flag` and `cell` being those of
    /// the CPU the caller runs as.
    #[inline]
    pub(crate) unsafe fn try_lock_here(
        flag: &'a AtomicU8,
        cell: &'a UnsafeCell<T>,
    ) -> Option<Self> {
        if flag.load(Ordering::Relaxed) != 0 {
            return None;
        }
        flag.store(FLAG_HELD, Ordering::Relaxed);
        compiler_fence(Ordering::SeqCst);
        Some(LocalLocked {
            flag,
            cell,
            irq: None,
            _not_send: PhantomData,
        })
    }

    /// The guarded state, ours while the guard lives.
    #[inline(always)]
    pub(crate) fn get(&mut self) -> &mut T {
        // SAFETY: the flag is ours (try_lock): nothing else on this CPU
        // touches `cell` until it is given back, and other CPUs reach it
        // only in cross-CPU calls that run on this CPU and take the flag
        // first (try_lock_here).
        unsafe { &mut *self.cell.get() }
    }
}

impl<P: Platform, T> Drop for LocalLocked<'_, P, T> {
    #[inline(always)]
    fn drop(&mut self) {
        if let Some(state) = self.irq {
            P::irq_restore(state);
            return;
        }
        interrupt_point::<P>();
        // Every write to `cell` is done before the flag is given back.
        compiler_fence(Ordering::SeqCst);
        self.flag.store(0, Ordering::Relaxed);
        interrupt_point::<P>();
    }
}

/// The value [`LocalLocked::try_lock_here`] stores in a free flag (any
/// value but 0 means held).
const FLAG_HELD: u8 = 1;

/// Take this CPU's in-use flag, the byte at `base + index + FLAG`, if it is free (0): true if it was and is
/// now ours (non-zero), false if it is held (it is left held, unchanged).
///
/// On x86-64 (loom models and Miri aside) the test and the store are one
/// instruction, `sub byte ptr [flag], 1`, whose borrow says the flag was
/// 0: an interrupt on this CPU lands before it or after it, never between
/// a test and a store, so no interrupt handler can take the flag the
/// interrupted code is about to take. A held flag (non-zero, left at
/// non-zero by the `sub`) gets its 1 back before the held branch returns.
/// The hit pays the `sub` and the branch (two instructions, against a load,
/// a test, a branch and a store); elsewhere a load and a store, with the
/// `loom` models' interrupt points between them.
///
/// # Safety
/// The byte at `base + index + FLAG` is the flag, alive for the call.
#[inline(always)]
pub(crate) unsafe fn take_flag<P: Platform, const FLAG: usize>(
    base: *const u8,
    index: usize,
) -> bool {
    #[cfg(all(target_arch = "x86_64", not(miri), not(all(test, loom))))]
    {
        interrupt_point::<P>();
        // `sub` of the flag byte at `$flag` (an `asm!` memory operand),
        // 1 to 0 when free; a borrow (the flag was 0: held) gives the 1
        // back and returns false. One form with the CPU's `index` in a
        // register, one without (below), as `restart.rs`'s `line!`.
        macro_rules! take_flag_asm {
            ($flag:literal, $($operands:tt)*) => {
                core::arch::asm!(
                    concat!("sub byte ptr ", $flag, ", 1"),
                    "jnc {held}",
                    $($operands)*
                    held = label {
                        // SAFETY: as the caller's block: the 1 the `sub`
                        // took, given back.
                        unsafe {
                            core::arch::asm!(
                                concat!("add byte ptr ", $flag, ", 1"),
                                $($operands)*
                                options(nostack),
                            );
                        }
                        return false;
                    },
                    options(nostack),
                )
            };
        }
        // One CPU: `index` is 0 (`cpu_offset`), and no register is spent
        // on it (an `xor` a side, the shipped one-CPU platforms).
        if P::max_cpus() == 1 {
            debug_assert_eq!(index, 0);
            // SAFETY: as below, with `index` 0: the flag is at `base + FLAG`.
            unsafe {
                take_flag_asm!("[{base} + {flag}]", base = in(reg) base, flag = const FLAG,);
            }
            return true;
        }
        // SAFETY: `[base + index + FLAG]` is the flag's byte, alive for
        // the call (our caller's promise). Only code on this CPU writes the flag, and each
        // instruction of the block is one read-modify-write of it that an
        // interrupt on this CPU cannot split (other CPUs reach this
        // CPU's per-CPU cache only in cross-CPU calls, which run on this
        // CPU). The block touches no stack and no register but the flags,
        // which it declares clobbered (no `preserves_flags`).
        unsafe {
            take_flag_asm!(
                "[{base} + {index} + {flag}]",
                base = in(reg) base,
                index = in(reg) index,
                flag = const FLAG,
            );
        }
        true
    }
    #[cfg(not(all(target_arch = "x86_64", not(miri), not(all(test, loom)))))]
    {
        // SAFETY: per our caller, the flag (an `AtomicU8`) is there.
        let flag = unsafe { &*base.wrapping_add(index + FLAG).cast::<AtomicU8>() };
        interrupt_point::<P>();
        if flag.load(Ordering::Relaxed) != 0 {
            return false;
        }
        interrupt_point::<P>();
        flag.store(FLAG_HELD, Ordering::Relaxed);
        true
    }
}

/// Whether `word` has any bit of `MASK` set: a relaxed load and a test.
/// On x86-64 (loom models and Miri aside) one instruction and the branch,
/// `test dword ptr [word], MASK; jnz`: LLVM folds no atomic load into a
/// `test`, so the hot-flags test of a hit written in Rust is three (a
/// load, the test, the branch).
#[inline(always)]
pub(crate) fn flags_any<const MASK: u32>(word: &AtomicU32) -> bool {
    #[cfg(all(target_arch = "x86_64", not(miri), not(all(test, loom))))]
    {
        // SAFETY: `word` is a live, aligned `AtomicU32` (a reference):
        // the block reads its four bytes once, as a relaxed atomic load
        // would (an aligned 32-bit read is single-copy atomic on x86-64),
        // and writes nothing but the flags register, declared clobbered.
        unsafe {
            core::arch::asm!(
                "test dword ptr [{word}], {mask}",
                "jnz {set}",
                word = in(reg) word.as_ptr(),
                mask = const MASK,
                set = label { return true; },
                options(nostack, readonly),
            );
        }
        false
    }
    #[cfg(not(all(target_arch = "x86_64", not(miri), not(all(test, loom)))))]
    {
        word.load(Ordering::Relaxed) & MASK != 0
    }
}

/// Whether `word` is exactly `VALUE`: a relaxed load and a compare. On
/// x86-64 (loom models and Miri aside) one instruction and the branch,
/// `cmp dword ptr [word], VALUE; jne`, as [`flags_any`] (no register
/// loaded: the word known, the caller's tests of it fold away; its
/// path falls through, laid out first). Measured reason (the profiled
/// alloc's test of `PROFILED_USUAL`, with `free_usual`'s `flags_any`):
/// `bench/profile.sh pair64 magpie-prof-on` 103.0 -> 99.9 raw a pair,
/// `magpie-cache-prof-on` 106.0 -> 103.0; a plain load and compare let
/// LLVM merge the profiled path's end with the general path's (a `jmp`)
/// and kept the word in a register.
#[inline(always)]
pub(crate) fn flags_eq<const VALUE: u32>(word: &AtomicU32) -> bool {
    #[cfg(all(target_arch = "x86_64", not(miri), not(all(test, loom))))]
    {
        // SAFETY: as in `flags_any`: one aligned 32-bit read of a live
        // `AtomicU32`, nothing written but the flags register.
        unsafe {
            core::arch::asm!(
                "cmp dword ptr [{word}], {value}",
                "jne {ne}",
                word = in(reg) word.as_ptr(),
                value = const VALUE,
                ne = label { return false; },
                options(nostack, readonly),
            );
        }
        true
    }
    #[cfg(not(all(target_arch = "x86_64", not(miri), not(all(test, loom)))))]
    {
        word.load(Ordering::Relaxed) == VALUE
    }
}

/// A point of a magazine hit where the `loom` models let an interrupt
/// handler of this CPU run (`tests/loom_models.rs`); nothing in other
/// builds.
#[inline(always)]
pub(crate) fn interrupt_point<P: Platform>() {
    #[cfg(all(test, loom))]
    crate::tests::loom_models::interrupt_window::<P>();
}

/// A lock an interrupt handler's allocation or free can reach (the depot,
/// the slab layer and its bufctl hash, the trace table): [`Mutex`] taken
/// only with interrupts off on this CPU, so that a handler that needs it
/// on the CPU that holds it cannot spin forever on it. Held as an
/// [`IrqMutexGuard`] (interrupts come back on after the lock is released).
pub(crate) struct IrqMutex<P: Platform, T> {
    inner: Mutex<T>,
    _platform: PhantomData<fn() -> P>,
}

/// A lock guard `G` taken with interrupts off: on drop, the lock is
/// released, then interrupts restored.
pub(crate) struct IrqLockGuard<P: Platform, G> {
    // Field order is drop order: the lock is released before interrupts
    // are restored.
    guard: G,
    _irq: IrqGuard<P>,
}

/// An [`IrqMutex`] held.
pub(crate) type IrqMutexGuard<'a, P, T> = IrqLockGuard<P, MutexGuard<'a, T>>;

/// A [`SpinIrq`] held (interrupts off until it is dropped).
pub(crate) type SpinIrqGuard<'a, P, T> = IrqLockGuard<P, spin::MutexGuard<'a, T>>;

/// An allocator-wide spin lock (the error and KFENCE hooks, the debug
/// configuration, KFENCE's pool, kmemtrace's stack table and controls),
/// `const`-constructible, taken only with interrupts off, for the same
/// reason as [`IrqMutex`]: an interrupt handler's allocation, free or
/// report can take it. The platform is named at each operation
/// (`lock::<P>()`).
pub(crate) struct SpinIrq<T> {
    inner: spin::Mutex<T>,
    class: LockClass,
}

impl<T> SpinIrq<T> {
    /// A lock of the class of the caller's site ([`crate::lockdep`]).
    #[track_caller]
    pub(crate) const fn new(value: T) -> Self {
        SpinIrq {
            inner: spin::Mutex::new(value),
            class: LockClass::here(),
        }
    }

    /// Disable interrupts, then take the lock.
    #[inline]
    pub(crate) fn lock<P: Platform>(&self) -> SpinIrqGuard<'_, P, T> {
        let irq = IrqGuard::new();
        lockdep::acquired::<P, ()>(self.class, Acquire::LockIrqOff);
        IrqLockGuard {
            guard: self.inner.lock(),
            _irq: irq,
        }
    }

    /// Disable interrupts and try the lock once; `None` (interrupts as
    /// they were) if it is held.
    #[cfg(feature = "descriptor")]
    #[inline]
    pub(crate) fn try_lock<P: Platform>(&self) -> Option<SpinIrqGuard<'_, P, T>> {
        let irq = IrqGuard::new();
        lockdep::acquired::<P, ()>(self.class, Acquire::TryIrqOff);
        let guard = self.inner.try_lock()?;
        Some(IrqLockGuard { guard, _irq: irq })
    }
}

/// An allocator-wide lock held with interrupts on, across work that needs
/// them (the cache list, held across cross-CPU calls by `reap_all`; the
/// size-class lock, held while a class is created; kmemtrace's controls,
/// held while a dump is written out): spun on only outside interrupt
/// context ([`IrqTryMutex::lock`]), only tried inside it
/// ([`IrqTryMutex::try_lock`]), so a handler never waits for the code it
/// interrupted. `const`-constructible; the platform is named at each
/// operation.
pub(crate) struct IrqTryMutex<T> {
    inner: spin::Mutex<T>,
    class: LockClass,
}

impl<T> IrqTryMutex<T> {
    /// A lock of the class of the caller's site ([`crate::lockdep`]).
    #[track_caller]
    pub(crate) const fn new(value: T) -> Self {
        IrqTryMutex {
            inner: spin::Mutex::new(value),
            class: LockClass::here(),
        }
    }

    /// Take the lock, spinning: never from interrupt context (debug
    /// builds report it, [`crate::lockdep`]).
    #[inline]
    pub(crate) fn lock<P: Platform>(&self) -> spin::MutexGuard<'_, T> {
        lockdep::acquired::<P, ()>(self.class, Acquire::Lock);
        self.inner.lock()
    }

    /// Try the lock once; `None` if it is held. The only way in from an
    /// interrupt handler.
    #[inline]
    pub(crate) fn try_lock<P: Platform>(&self) -> Option<spin::MutexGuard<'_, T>> {
        lockdep::acquired::<P, ()>(self.class, Acquire::Try);
        self.inner.try_lock()
    }
}

impl<P: Platform, T: 'static> IrqMutex<P, T> {
    /// A lock whose class is the type it guards, `T` ([`crate::lockdep`]:
    /// one class for the depot lock of every cache, ...).
    pub(crate) fn new(value: T) -> Self {
        IrqMutex {
            inner: Mutex::new(value),
            _platform: PhantomData,
        }
    }

    /// Disable interrupts, then take the lock.
    #[inline]
    pub(crate) fn lock(&self) -> IrqMutexGuard<'_, P, T> {
        let irq = IrqGuard::new();
        lockdep::acquired::<P, T>(LockClass::guarding::<T>(), Acquire::LockIrqOff);
        IrqLockGuard {
            guard: self.inner.lock(),
            _irq: irq,
        }
    }

    /// Disable interrupts and try the lock once; `None` (interrupts as
    /// they were) if it is held.
    #[inline]
    pub(crate) fn try_lock(&self) -> Option<IrqMutexGuard<'_, P, T>> {
        let irq = IrqGuard::new();
        lockdep::acquired::<P, T>(LockClass::guarding::<T>(), Acquire::TryIrqOff);
        let guard = self.inner.try_lock()?;
        Some(IrqLockGuard { guard, _irq: irq })
    }

    #[allow(dead_code, reason = "used by host unit tests on a fresh Depot")]
    pub(crate) fn into_inner(self) -> T {
        self.inner.into_inner()
    }
}

impl<P: Platform, G: Deref> Deref for IrqLockGuard<P, G> {
    type Target = G::Target;
    #[inline(always)]
    fn deref(&self) -> &G::Target {
        &self.guard
    }
}

impl<P: Platform, G: DerefMut> DerefMut for IrqLockGuard<P, G> {
    #[inline(always)]
    fn deref_mut(&mut self) -> &mut G::Target {
        &mut self.guard
    }
}

#[cfg(all(test, loom))]
mod loom_mutex {
    /// `loom::sync::Mutex` with `spin::Mutex`'s API.
    pub(crate) struct Mutex<T>(loom::sync::Mutex<T>);

    pub(crate) type MutexGuard<'a, T> = loom::sync::MutexGuard<'a, T>;

    impl<T> Mutex<T> {
        pub(crate) fn new(value: T) -> Self {
            Mutex(loom::sync::Mutex::new(value))
        }

        pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
            self.0.lock().expect("loom mutex poisoned")
        }

        pub(crate) fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
            self.0.try_lock().ok()
        }

        #[allow(dead_code, reason = "used by host unit tests on a fresh Depot")]
        pub(crate) fn into_inner(self) -> T {
            self.0.into_inner().expect("loom mutex poisoned")
        }
    }
}
