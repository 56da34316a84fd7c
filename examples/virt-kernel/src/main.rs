//! A kernel on QEMU's `virt` machine (riscv64 in machine mode, or in
//! supervisor mode under OpenSBI with feature `smode`, or aarch64 at EL1)
//! adopting magpie-slab with the shipped platform of its architecture, on
//! 4 CPUs, built with stable Rust (`make test-example`, `run.sh`):
//!
//! 1. the heap tests of "Writing an OS in Rust" (as examples/hobby-kernel);
//! 2. a timer interrupt on every CPU that allocates and frees (an object
//!    kept from one tick to the next, stamped and checked);
//! 3. an SMP stress: each CPU allocates stamped blocks of 8 B to 2 KiB and
//!    hands them to the next CPU, which checks every word and frees them
//!    (cross-CPU frees), with the timers running;
//! 4. `verify` and the invariant check clean, no error reported.
//!
//! Before the other CPUs start (they wait with interrupts off), a reap:
//! the platform sends no cross-CPU call to a CPU not online.
//!
//! Output on the UART; the verdict through the exit code (riscv64: the
//! `sifive_test` device; aarch64: semihosting `SYS_EXIT`).

#![no_std]
#![no_main]

#[cfg(not(any(target_arch = "riscv64", target_arch = "aarch64")))]
compile_error!(
    "examples/virt-kernel is for riscv64gc-unknown-none-elf or aarch64-unknown-none: \
     examples/virt-kernel/run.sh riscv64|aarch64"
);

extern crate alloc;

use alloc::boxed::Box;
use alloc::collections::BTreeMap;
use alloc::vec::Vec;
use core::fmt::Write;
use core::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use magpie_slab::PageSource;
use magpie_slab::glue::{Cpus, Heap};

#[cfg(target_arch = "aarch64")]
#[path = "aarch64.rs"]
mod arch;
#[cfg(target_arch = "riscv64")]
#[path = "riscv64.rs"]
mod arch;

/// CPUs the kernel runs on (QEMU `-smp 4`).
pub const NR_CPUS: usize = 4;
/// The heap: 16 MiB from the end of the image (`__heap_start`).
const HEAP_SIZE: usize = 16 << 20;

// ---- The adopter's lines: the platform of the architecture with 4 CPUs
// and frame-pointer backtraces, the global allocator; then in the code,
// each CPU's `Platform::cpu_online_with(send_ipi)` (`online` below), the
// boot CPU's init_region (kernel_main), and the IPI handler's
// `Platform::handle_cross_cpu_calls()` (arch). ----
/// The shipped platform of the architecture, 4 CPUs, frame pointers.
pub type Platform = arch::Platform<Cpus<NR_CPUS, true>>;
#[global_allocator]
static HEAP: Heap<Platform> = Heap::new();
// ---------------------------------------------------------------------

/// This CPU online for the allocator's cross-CPU calls, which reach it by
/// `send_ipi`.
fn online() {
    // SAFETY: this CPU's index is in the per-CPU register (arch entry
    // code); send_ipi interrupts the CPU after a barrier, and its handler
    // calls handle_cross_cpu_calls; no preemption, and the handlers run in
    // handle_interrupt; built with frame pointers (run.sh), the entry code
    // zeroes the frame pointer.
    unsafe { Platform::cpu_online_with(send_ipi) };
}

/// The allocator's IPI to `cpu`, counted.
fn send_ipi(cpu: usize) {
    IPIS.fetch_add(1, Ordering::Relaxed);
    arch::send_ipi(cpu);
}

/// `println!` to the UART.
#[macro_export]
macro_rules! println {
    ($($arg:tt)*) => {{ let _ = writeln!($crate::Console::lock(), $($arg)*); }};
}

/// The UART, one writer at a time (the guard held while it lives).
pub struct Console {
    _guard: spin::MutexGuard<'static, ()>,
}

static CONSOLE: spin::Mutex<()> = spin::Mutex::new(());

impl Console {
    /// The console, for one message.
    pub fn lock() -> Console {
        Console {
            _guard: CONSOLE.lock(),
        }
    }
}

impl Write for Console {
    fn write_str(&mut self, s: &str) -> core::fmt::Result {
        s.bytes().for_each(arch::putc);
        Ok(())
    }
}

/// Timer ticks taken, per CPU.
static TICKS: [AtomicU64; NR_CPUS] = [const { AtomicU64::new(0) }; NR_CPUS];
/// The object each CPU's timer keeps from one tick to the next.
static KEPT: [AtomicUsize; NR_CPUS] = [const { AtomicUsize::new(0) }; NR_CPUS];
/// Set when the ticks stop allocating (before `verify`).
static QUIET: AtomicBool = AtomicBool::new(false);
/// CPUs that finished the stress.
static DONE: AtomicUsize = AtomicUsize::new(0);
/// CPUs that arrived at the stress.
static ARRIVED: AtomicUsize = AtomicUsize::new(0);
/// Blocks checked and freed by another CPU than their allocator's.
static CROSS_FREES: AtomicU64 = AtomicU64::new(0);
/// Blocks the stress freed on their own CPU (the next CPU's inbox full).
static LOCAL_FREES: AtomicU64 = AtomicU64::new(0);
/// IPIs sent (the allocator's cross-CPU calls).
static IPIS: AtomicU64 = AtomicU64::new(0);

/// The word `index` of a block stamped with `seed`.
fn stamp(seed: u64, index: usize) -> u64 {
    (seed ^ (index as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)).rotate_left(17)
}

/// A block of `len` words, each stamped; word 0 is the seed.
fn stamped(seed: u64, len: usize) -> Box<[u64]> {
    let mut block = Vec::with_capacity(len);
    block.push(seed);
    block.extend((1..len).map(|index| stamp(seed, index)));
    block.into_boxed_slice()
}

/// Check every word of a stamped block; fail loudly otherwise.
fn check(block: &[u64]) {
    let seed = block[0];
    for (index, &word) in block.iter().enumerate().skip(1) {
        assert_eq!(
            word,
            stamp(seed, index),
            "block {:p} word {index}",
            block.as_ptr()
        );
    }
}

/// The timer interrupt of CPU `cpu` (interrupts off): check and free the
/// object the previous tick kept, keep a new one.
pub fn on_tick(cpu: usize) {
    let tick = TICKS[cpu].fetch_add(1, Ordering::SeqCst);
    if QUIET.load(Ordering::SeqCst) {
        return;
    }
    let seed = (cpu as u64) << 48 | tick;
    let new = Box::into_raw(Box::new(stamped(seed, 1 + (tick % 16) as usize)));
    let old = KEPT[cpu].swap(new as usize, Ordering::Relaxed) as *mut Box<[u64]>;
    if !old.is_null() {
        // SAFETY: the pointer the previous tick of this CPU kept, taken once.
        let old = unsafe { Box::from_raw(old) };
        check(&old);
    }
}

/// The boot CPU (0, but for OpenSBI's choice of boot hart), from the
/// entry code.
fn kernel_main() -> ! {
    online();
    let heap_start = arch::heap_start();
    // SAFETY: the 16 MiB after the image are RAM, used by nothing else.
    unsafe { HEAP.init_region(heap_start, HEAP_SIZE) }.expect("heap");
    println!(
        "virt-kernel ({}): {} MiB heap at {heap_start:#x}, init took {} bytes",
        arch::NAME,
        HEAP_SIZE >> 20,
        HEAP.source().stats().alloc_bytes
    );
    heap_tests();

    // A reap while the other CPUs wait, interrupts off, for their start:
    // their magazines drained here, no IPI sent (they are not online).
    HEAP.reap_all();
    assert_eq!(
        IPIS.load(Ordering::Relaxed),
        0,
        "an IPI to a CPU not online"
    );
    println!("reap_before_start... [ok] (CPUs 1-3 not online: no IPI)");

    // The timer interrupt allocating and freeing, against this CPU's own
    // allocations.
    arch::timer_start();
    let me = arch::cpu_index();
    let mut churned = 0_u64;
    while TICKS[me].load(Ordering::Relaxed) < 100 {
        let block = stamped(churned, 1 + (churned % 64) as usize);
        check(&block);
        churned += 1;
    }
    println!(
        "timer_allocates... [ok] ({} ticks, {churned} blocks meanwhile)",
        TICKS[me].load(Ordering::Relaxed)
    );

    arch::start_secondaries();
    stress(me);
    while DONE.load(Ordering::Acquire) < NR_CPUS {
        core::hint::spin_loop();
    }
    for cpu in 0..NR_CPUS {
        drain(cpu);
    }
    println!(
        "smp_stress... [ok] ({NR_CPUS} CPUs, {} cross-CPU frees, {} local, {} IPIs, ticks {:?})",
        CROSS_FREES.load(Ordering::Relaxed),
        LOCAL_FREES.load(Ordering::Relaxed),
        IPIS.load(Ordering::Relaxed),
        TICKS.each_ref().map(|ticks| ticks.load(Ordering::Relaxed))
    );

    // Quiet: the ticks stop allocating; free what they kept.
    QUIET.store(true, Ordering::SeqCst);
    // A tick that began before the store may still be allocating on its
    // CPU: wait until every other CPU has begun a later tick (a CPU's
    // ticks do not nest, so the earlier one has returned; the later one
    // saw QUIET), so that the invariant check below sees no allocation
    // in flight. (Machine mode's "busy objects != allocated + rounds" of
    // kmalloc-8 was not this but a late hart clearing .bss: riscv64.rs.)
    for (_, ticks) in TICKS.iter().enumerate().filter(|&(cpu, _)| cpu != me) {
        let seen = ticks.load(Ordering::SeqCst);
        while ticks.load(Ordering::SeqCst) <= seen {
            core::hint::spin_loop();
        }
    }
    for kept in &KEPT {
        let old = kept.swap(0, Ordering::Relaxed) as *mut Box<[u64]>;
        if !old.is_null() {
            // SAFETY: a kept object, taken once (the ticks keep no more).
            check(&unsafe { Box::from_raw(old) });
        }
    }
    HEAP.reap_all();
    let summary = HEAP.debug().verify();
    HEAP.debug().check_invariants().expect("invariants");
    assert_eq!(summary.nr_problems, 0, "verify: {summary:?}");
    assert_eq!(HEAP.debug().nr_errors(), 0, "errors reported");
    println!(
        "verify... [ok] ({} caches, {} slabs, {} objects, 0 problems; {} IPIs in all)",
        summary.nr_caches,
        summary.nr_slabs,
        summary.nr_objects,
        IPIS.load(Ordering::Relaxed)
    );
    println!("virt-kernel: all tests passed");
    arch::exit(0)
}

/// The other CPUs, from the entry code once released.
fn secondary_main(cpu: usize) -> ! {
    online();
    stress(cpu);
    // Idle with interrupts on: serve cross-CPU calls (verify, reap).
    loop {
        arch::wait_for_interrupt();
    }
}

/// Blocks handed from CPU to CPU: CPU `n`'s inbox, filled by CPU `n - 1`.
static INBOX: [spin::Mutex<Inbox>; NR_CPUS] = [const { spin::Mutex::new(Inbox::new()) }; NR_CPUS];

/// Up to 64 blocks (raw `Box<[u64]>`s) waiting for their CPU.
struct Inbox {
    blocks: [(usize, usize); 64],
    nr: usize,
}

// SAFETY: the pointers are owned boxes handed over to the inbox's CPU.
unsafe impl Send for Inbox {}

impl Inbox {
    const fn new() -> Self {
        Inbox {
            blocks: [(0, 0); 64],
            nr: 0,
        }
    }
}

/// Check and free every block in CPU `cpu`'s inbox; how many.
fn drain(cpu: usize) -> u64 {
    let mut taken = [(0, 0); 64];
    let nr = {
        let mut inbox = INBOX[cpu].lock();
        let nr = inbox.nr;
        taken[..nr].copy_from_slice(&inbox.blocks[..nr]);
        inbox.nr = 0;
        nr
    };
    for &(ptr, len) in &taken[..nr] {
        let raw = core::ptr::slice_from_raw_parts_mut(ptr as *mut u64, len);
        // SAFETY: a box put into the inbox by `stress`, taken out once.
        let block = unsafe { Box::from_raw(raw) };
        check(&block);
    }
    CROSS_FREES.fetch_add(nr as u64, Ordering::Relaxed);
    nr as u64
}

/// The SMP stress on CPU `cpu`: stamped blocks of 1 to 256 words, each
/// handed to the next CPU (or, its inbox staying full, checked and freed
/// here), and this CPU's inbox drained, for 3,000 rounds; CPU 0 reaps
/// every 250 rounds.
fn stress(cpu: usize) {
    arch::timer_start();
    ARRIVED.fetch_add(1, Ordering::AcqRel);
    while ARRIVED.load(Ordering::Acquire) < NR_CPUS {
        core::hint::spin_loop();
    }
    let next = (cpu + 1) % NR_CPUS;
    let mut local = Vec::new();
    for round in 0..3000_u64 {
        let seed = (cpu as u64) << 56 | round << 8 | 0xa5;
        let len = 1 + (round.wrapping_mul(2_654_435_761) % 256) as usize;
        let block = stamped(seed, len);
        // Hand it over; the next CPU's inbox full, drain ours and retry
        // (for a while: the next CPU may have finished).
        let mut block = Some(block);
        for _ in 0..1000 {
            let mut inbox = INBOX[next].lock();
            let nr = inbox.nr;
            if nr < inbox.blocks.len() {
                let raw = Box::into_raw(block.take().expect("a block"));
                inbox.blocks[nr] = (raw.cast::<u64>() as usize, len);
                inbox.nr = nr + 1;
                break;
            }
            drop(inbox);
            drain(cpu);
        }
        if let Some(block) = block {
            LOCAL_FREES.fetch_add(1, Ordering::Relaxed);
            local.push(block);
        }
        // CPU 0 drains every CPU's magazines now and then (cross-CPU
        // calls into CPUs busy allocating).
        if cpu == 0 && round % 250 == 0 {
            HEAP.reap_all();
        }
        if round % 8 == 0 {
            drain(cpu);
            local.iter().for_each(|block| check(block));
            local.clear();
        }
    }
    drain(cpu);
    DONE.fetch_add(1, Ordering::AcqRel);
}

/// The heap tests of "Writing an OS in Rust" (`tests/heap_allocation.rs`),
/// and a BTreeMap churn.
fn heap_tests() {
    let (a, b) = (Box::new(41), Box::new(13));
    assert_eq!(*a + *b, 54);
    println!("simple_box... [ok]");

    let mut vec = Vec::new();
    for i in 0..1000_u64 {
        vec.push(i);
    }
    assert_eq!(vec.iter().sum::<u64>(), 999 * 1000 / 2);
    drop(vec);
    println!("large_vec... [ok]");

    for i in 0..10_000_usize {
        assert_eq!(*Box::new(i), i);
    }
    println!("many_boxes... [ok]");

    let long_lived = Box::new(1);
    for i in 0..10_000_usize {
        assert_eq!(*Box::new(i), i);
    }
    assert_eq!(*long_lived, 1);
    println!("many_boxes_long_lived... [ok]");

    let mut map = BTreeMap::new();
    for round in 0..20_u64 {
        for key in 0..500_u64 {
            map.insert(key * 7919 % 1000, round + key);
        }
        for key in 0..250_u64 {
            map.remove(&(key * 3));
        }
    }
    for key in 0..500_u64 {
        let k = key * 7919 % 1000;
        let removed = k % 3 == 0 && k < 750;
        assert_eq!(map.get(&k).copied(), (!removed).then_some(19 + key));
    }
    println!("btreemap_churn... [ok]");
}

#[panic_handler]
fn panic(info: &core::panic::PanicInfo<'_>) -> ! {
    // Not through the console lock: the panicking CPU may hold it.
    let mut out = arch::RawConsole;
    let _ = writeln!(out, "[failed] cpu{}: {info}", arch::cpu_index());
    arch::exit(1)
}
