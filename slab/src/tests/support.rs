//! Test platform and fake page source.

#![cfg_attr(
    loom,
    allow(
        dead_code,
        reason = "the loom models use the page source only (they have their own platform)"
    )
)]

use std::boxed::Box;
use std::cell::Cell;
use std::ptr::NonNull;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::vec;
use std::vec::Vec;

use crate::{
    AllocError, AllocTagHooks, ArenaStats, InitBox, Kmem, PAGE_SIZE, PageSource, Platform,
    PlatformHooks, SlabBox,
};

pub const NR_CPUS: usize = 4;

/// How much smaller the big tests run under Miri (`make test-miri`), which
/// interprets every instruction and checks every access (a test's setup,
/// 7 ms native, takes about a second there): their operation counts and
/// bursts are divided by this. 1 natively: the native run is unchanged.
pub const MIRI_SCALE: usize = if cfg!(miri) { 100 } else { 1 };

/// `n` operations, divided by [`MIRI_SCALE`] under Miri (at least 1).
pub const fn scaled(n: usize) -> usize {
    if n / MIRI_SCALE == 0 {
        1
    } else {
        n / MIRI_SCALE
    }
}

/// The proptest configuration of `cases` cases, [`scaled`]; under Miri
/// without the regression file (Miri's isolation has no working
/// directory to find it from).
pub fn proptest_config(cases: usize) -> proptest::test_runner::Config {
    let mut config = proptest::test_runner::Config {
        cases: scaled(cases) as u32,
        ..proptest::test_runner::Config::default()
    };
    if cfg!(miri) {
        config.failure_persistence = None;
    }
    config
}

std::thread_local! {
    static CPU: Cell<usize> = const { Cell::new(0) };
    static CALLER: Cell<usize> = const { Cell::new(0xffff_8000_0000_0c00) };
    /// Nesting depth of this thread's emulated interrupts-off sections.
    static IRQ_DEPTH: Cell<usize> = const { Cell::new(0) };
    /// The CPU whose emulated interrupt lock this thread holds.
    static IRQ_CPU: Cell<usize> = const { Cell::new(0) };
    /// Whether this thread runs an emulated interrupt handler
    /// (`Platform::in_interrupt`, [`as_interrupt`]).
    static IN_IRQ: Cell<bool> = const { Cell::new(false) };
}

/// Run `f` as an interrupt handler of this thread's CPU: with its
/// emulated interrupts off for the whole call (as an x86 interrupt gate
/// leaves them) and `Platform::in_interrupt` true. Restored even if `f`
/// panics.
pub fn as_interrupt<R>(f: impl FnOnce() -> R) -> R {
    struct Exit;
    impl Drop for Exit {
        fn drop(&mut self) {
            IN_IRQ.with(|flag| flag.set(false));
            emulated_irq_restore();
        }
    }
    assert!(!IN_IRQ.with(Cell::get), "nested emulated interrupt");
    emulated_irq_save();
    IN_IRQ.with(|flag| flag.set(true));
    let _exit = Exit;
    f()
}

/// "Interrupts off on CPU n", emulated: a lock per CPU id, taken by the
/// outermost `irq_save` of a thread acting as that CPU and by a
/// cross-CPU call to it. Threads acting as the same CPU, and cross-CPU
/// calls, then exclude each other exactly as one CPU's interrupts-off
/// sections and its IPI handler do.
static IRQ_LOCKS: [AtomicBool; NR_CPUS] = [const { AtomicBool::new(false) }; NR_CPUS];

fn irq_lock(cpu: usize) {
    while IRQ_LOCKS[cpu]
        .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
        .is_err()
    {
        std::thread::yield_now();
    }
}

fn irq_unlock(cpu: usize) {
    IRQ_LOCKS[cpu].store(false, Ordering::Release);
}

/// Emulated `irq_save` (see [`IRQ_LOCKS`]).
pub fn emulated_irq_save() -> usize {
    let depth = IRQ_DEPTH.with(Cell::get);
    if depth == 0 {
        let cpu = cpu();
        irq_lock(cpu);
        IRQ_CPU.with(|c| c.set(cpu));
    }
    IRQ_DEPTH.with(|d| d.set(depth + 1));
    0
}

/// Emulated `irq_restore`.
pub fn emulated_irq_restore() {
    let depth = IRQ_DEPTH.with(Cell::get);
    assert!(depth > 0, "irq_restore without irq_save");
    IRQ_DEPTH.with(|d| d.set(depth - 1));
    if depth == 1 {
        irq_unlock(IRQ_CPU.with(Cell::get));
    }
}

/// Emulated cross-CPU call: run `work` holding CPU `cpu`'s interrupt lock
/// (at once if this thread holds it already).
pub fn emulated_cross_cpu_call(cpu: usize, work: &(dyn Fn() + Sync)) {
    if IRQ_DEPTH.with(Cell::get) > 0 {
        assert_eq!(
            IRQ_CPU.with(Cell::get),
            cpu,
            "cross-CPU call with interrupts off"
        );
        work();
        return;
    }
    irq_lock(cpu);
    IRQ_DEPTH.with(|d| d.set(1));
    IRQ_CPU.with(|c| c.set(cpu));
    work();
    IRQ_DEPTH.with(|d| d.set(0));
    irq_unlock(cpu);
}

/// The call site `PlatformHooks::caller_frames` reports on this thread
/// (kmemtrace tests); its callers are `FAKE_FRAMES`.
pub fn set_caller(site: usize) {
    CALLER.with(|c| c.set(site));
}

static CLOCK: AtomicU64 = AtomicU64::new(1);

/// Act as CPU `cpu` on this thread.
pub fn set_cpu(cpu: usize) {
    CPU.with(|c| c.set(cpu));
}

pub fn cpu() -> usize {
    CPU.with(|c| c.get())
}

pub const FAKE_FRAMES: [usize; 2] = [0xffff_8000_0000_1234, 0xffff_8000_0000_5678];
pub const FAKE_CONTEXT: &str = "test ctx";

/// Thread-local CPU id, 4 CPUs, emulated interrupts (a lock per CPU id)
/// and cross-CPU calls, counter clock.
pub struct TestPlatform;

// SAFETY: ids are below NR_CPUS (set_cpu callers use 0..NR_CPUS; the
// array index panics otherwise); the emulated interrupt lock makes every
// thread acting as one CPU, and every cross-CPU call to it, exclusive
// with that CPU's interrupts-off sections; `cpu_offset` is the default.
unsafe impl Platform for TestPlatform {
    fn max_cpus() -> usize {
        NR_CPUS
    }
    fn cpu_id() -> usize {
        cpu()
    }
    fn irq_save() -> usize {
        emulated_irq_save()
    }
    fn irq_restore(_state: usize) {
        emulated_irq_restore()
    }
    fn cross_cpu_call(cpu: usize, work: &(dyn Fn() + Sync)) {
        emulated_cross_cpu_call(cpu, work)
    }
    fn in_interrupt() -> bool {
        IN_IRQ.with(Cell::get)
    }
    fn now() -> u64 {
        CLOCK.fetch_add(1, Ordering::Relaxed)
    }
}

// SAFETY: the hooks keep PlatformHooks' contract: the KFENCE pool (if any) is
// mapped and the platform's own, and charge tokens are the ones the token hooks
// return.
unsafe impl PlatformHooks for TestPlatform {
    fn backtrace(frames: &mut [usize]) -> usize {
        let n = frames.len().min(FAKE_FRAMES.len());
        frames[..n].copy_from_slice(&FAKE_FRAMES[..n]);
        n
    }
    fn context(buf: &mut [u8; 32]) -> usize {
        let bytes = FAKE_CONTEXT.as_bytes();
        buf[..bytes.len()].copy_from_slice(bytes);
        bytes.len()
    }
    fn kfence_pool(nr_pages: usize) -> Option<NonNull<u8>> {
        let pages = vec![Page([0; PAGE_SIZE]); nr_pages].into_boxed_slice();
        NonNull::new(Box::leak(pages).as_mut_ptr().cast())
    }
    fn kfence_protect(page: usize, protect: bool) -> bool {
        let mut protected = KFENCE_PROTECTED.lock().unwrap();
        if protect {
            protected.push(page);
        } else {
            protected.retain(|&p| p != page);
        }
        true
    }
    fn kfence_clock_ns() -> u64 {
        KFENCE_CLOCK.load(Ordering::Relaxed)
    }
    fn caller_frames(frames: &mut [usize]) -> usize {
        let Some(first) = frames.first_mut() else {
            return 0;
        };
        *first = CALLER.with(|c| c.get());
        let rest = (frames.len() - 1).min(FAKE_FRAMES.len());
        frames[1..1 + rest].copy_from_slice(&FAKE_FRAMES[..rest]);
        1 + rest
    }
}

// SAFETY: the defaults: no tags.
unsafe impl AllocTagHooks for TestPlatform {}

/// The pages the fake KFENCE pools have unmapped (every pool's).
pub static KFENCE_PROTECTED: Mutex<Vec<usize>> = Mutex::new(Vec::new());
/// The fake KFENCE clock, in ns.
pub static KFENCE_CLOCK: AtomicU64 = AtomicU64::new(0);

/// Whether the fake platform has the pool page at `page` unmapped.
pub fn kfence_protected(page: usize) -> bool {
    KFENCE_PROTECTED.lock().unwrap().contains(&page)
}

/// One page of a [`FakeSource`]: its type gives the region its alignment.
#[derive(Clone, Copy)]
#[repr(C, align(4096))]
struct Page([u8; PAGE_SIZE]);

/// One big 4096-aligned region with a page bitmap.
pub struct FakeSource {
    /// The region (taken back by `release`); the allocator reaches it
    /// only through `base`, derived once the region is in place.
    #[cfg_attr(
        not(loom),
        allow(dead_code, reason = "only the loom models release a source")
    )]
    region: Mutex<Option<Box<[Page]>>>,
    base: usize,
    nr_pages: usize,
    used: Mutex<Vec<bool>>,
    outstanding: AtomicUsize,
    nr_allocs: AtomicU64,
    /// Pages still grantable before failing (usize::MAX: unlimited).
    budget: AtomicUsize,
    fail: AtomicBool,
    pub nr_failures: AtomicU64,
}

impl FakeSource {
    pub fn new(nr_pages: usize) -> &'static FakeSource {
        assert!(nr_pages > 0);
        let source = Box::leak(Box::new(FakeSource {
            region: Mutex::new(Some(
                vec![Page([0; PAGE_SIZE]); nr_pages].into_boxed_slice(),
            )),
            base: 0,
            nr_pages,
            used: Mutex::new(vec![false; nr_pages]),
            outstanding: AtomicUsize::new(0),
            nr_allocs: AtomicU64::new(0),
            budget: AtomicUsize::new(usize::MAX),
            fail: AtomicBool::new(false),
            nr_failures: AtomicU64::new(0),
        }));
        // The region's address, taken after the region reached its final
        // place (the box is not moved again until `release`).
        source.base = source
            .region
            .get_mut()
            .unwrap()
            .as_mut()
            .unwrap()
            .as_mut_ptr() as usize;
        source
    }

    pub fn pages_outstanding(&self) -> usize {
        self.outstanding.load(Ordering::SeqCst)
    }

    /// Fail every allocation while set.
    pub fn set_fail(&self, fail: bool) {
        self.fail.store(fail, Ordering::SeqCst);
    }

    /// Grant only `pages` more pages, then fail (None: unlimited).
    pub fn fail_after(&self, pages: Option<usize>) {
        self.budget
            .store(pages.unwrap_or(usize::MAX), Ordering::SeqCst);
    }

    /// Give the region back to the host (the loom models build a fresh
    /// source per execution and would otherwise leak thousands).
    ///
    /// # Safety
    /// Nothing uses the source or any of its pages afterwards.
    #[cfg(loom)]
    pub unsafe fn release(&self) {
        drop(self.region.lock().unwrap().take());
    }

    pub fn contains(&self, addr: usize) -> bool {
        addr >= self.base && addr < self.base + self.nr_pages * PAGE_SIZE
    }
}

impl PageSource for FakeSource {
    fn name(&self) -> &str {
        "fake"
    }

    fn alloc_pages(&self, nr_pages: usize) -> Result<NonNull<u8>, AllocError> {
        if nr_pages == 0 || self.fail.load(Ordering::SeqCst) {
            self.nr_failures.fetch_add(1, Ordering::Relaxed);
            return Err(AllocError::OutOfMemory);
        }
        let budget = self.budget.load(Ordering::SeqCst);
        if budget != usize::MAX {
            if budget < nr_pages {
                self.nr_failures.fetch_add(1, Ordering::Relaxed);
                return Err(AllocError::OutOfMemory);
            }
            self.budget.store(budget - nr_pages, Ordering::SeqCst);
        }
        let mut used = self.used.lock().unwrap();
        let mut run = 0;
        for page in 0..self.nr_pages {
            if used[page] {
                run = 0;
                continue;
            }
            run += 1;
            if run == nr_pages {
                let first = page + 1 - nr_pages;
                for p in first..=page {
                    used[p] = true;
                }
                self.outstanding.fetch_add(nr_pages, Ordering::SeqCst);
                self.nr_allocs.fetch_add(1, Ordering::Relaxed);
                return Ok(NonNull::new((self.base + first * PAGE_SIZE) as *mut u8).unwrap());
            }
        }
        self.nr_failures.fetch_add(1, Ordering::Relaxed);
        Err(AllocError::OutOfMemory)
    }

    unsafe fn free_pages(&self, addr: NonNull<u8>, nr_pages: usize) {
        let addr = addr.as_ptr() as usize;
        assert!(
            self.contains(addr) && addr.is_multiple_of(PAGE_SIZE),
            "free of foreign pages {addr:#x}"
        );
        let first = (addr - self.base) / PAGE_SIZE;
        let mut used = self.used.lock().unwrap();
        for p in first..first + nr_pages {
            assert!(used[p], "double free of page {p}");
            used[p] = false;
        }
        self.outstanding.fetch_sub(nr_pages, Ordering::SeqCst);
        // Scribble over freed pages to catch use after free.
        // SAFETY: the pages are inside our region and now free.
        unsafe { std::ptr::write_bytes(addr as *mut u8, 0x6b, nr_pages * PAGE_SIZE) };
    }

    fn span(&self) -> (usize, usize) {
        (self.base, self.base + self.nr_pages * PAGE_SIZE)
    }

    fn stats(&self) -> ArenaStats {
        ArenaStats {
            total_bytes: self.nr_pages * PAGE_SIZE,
            alloc_bytes: self.pages_outstanding() * PAGE_SIZE,
            nr_allocs_ever: self.nr_allocs.load(Ordering::Relaxed),
        }
    }
}

pub type TestAlloc = Kmem<TestPlatform>;

/// A fresh, initialised allocator over a fresh source of `nr_pages` pages.
pub fn setup(nr_pages: usize) -> (&'static TestAlloc, &'static FakeSource) {
    set_cpu(0);
    let source = FakeSource::new(nr_pages);
    let alloc: &'static TestAlloc = Box::leak(Box::new(Kmem::new()));
    alloc.init(source).expect("init");
    (alloc, source)
}

/// Default-sized setup (16 MiB).
pub fn setup_default() -> (&'static TestAlloc, &'static FakeSource) {
    setup(4096)
}

/// Fill an object with a pattern derived from `seed`.
pub fn fill(ptr: NonNull<u8>, len: usize, seed: u8) {
    for i in 0..len {
        // SAFETY: the test owns `len` bytes at ptr.
        unsafe { ptr.as_ptr().add(i).write(seed.wrapping_add(i as u8)) };
    }
}

/// Check the pattern written by `fill`.
pub fn check(ptr: NonNull<u8>, len: usize, seed: u8) -> bool {
    (0..len).all(|i| {
        // SAFETY: the test owns `len` bytes at ptr.
        unsafe { ptr.as_ptr().add(i).read() == seed.wrapping_add(i as u8) }
    })
}

/// Fill an owned object with the pattern of [`fill`] (every byte written,
/// so the result can be read).
pub fn fill_box<P: Platform>(obj: SlabBox<P>, seed: u8) -> InitBox<P> {
    let mut obj = obj.fill(0);
    for (i, byte) in obj.as_bytes_mut().iter_mut().enumerate() {
        *byte = seed.wrapping_add(i as u8);
    }
    obj
}

/// Check the pattern written by [`fill_box`] (or [`fill`]).
pub fn check_box<P: Platform>(obj: &InitBox<P>, seed: u8) -> bool {
    obj.as_bytes()
        .iter()
        .enumerate()
        .all(|(i, &byte)| byte == seed.wrapping_add(i as u8))
}
