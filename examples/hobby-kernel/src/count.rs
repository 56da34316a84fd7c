//! Feature `count`: the heap tests' allocator instructions, counted
//! exactly in QEMU, with Magpie (the shipped `Heap<X86_64<Hobby>>`, [`HEAP`]) and
//! with the fixed-size-block allocator of "Writing an OS in Rust"
//! (`bench/src/fixed_size_block.rs`, the file the host bench runs, here as
//! a module), each with a 100 KiB heap.
//!
//! The global allocator is [`Counted`]: every `alloc`, `dealloc` and
//! `realloc` calls the chosen allocator's (a function of `__rust_alloc`'s
//! signature, `(size, align)`, as the compiler's `__rg_alloc` is: the
//! allocator's `GlobalAlloc` method on its `static`, called through a
//! function pointer) with the trap flag set, so that each instruction
//! executed raises a debug exception (#DB), which a two-instruction
//! handler counts (as `tests/kernel_hit.rs` counts the kernel's hit; QEMU
//! 7.2 has no TCG plugins, and cycles under TCG are noise). The same
//! sequence around a call of a one-`ret` function is subtracted. So a
//! figure is every instruction from the allocator function's first to its
//! `ret`, the copies of `realloc` included; the tests' own code is not
//! counted (it is the same for both).
//!
//! Each test runs with Magpie, then with the fixed-size-block allocator
//! (frees go to the allocator whose heap holds the pointer); all of them
//! once as blog_os runs them after boot (`cold`: Magpie creates a small
//! heap's size classes on first use, the fixed-size-block allocator
//! carves its first blocks from its fallback), then all again (`warm`).
//! The kernel prints, per test and pass,
//!
//! ```text
//! HOBBY_COUNT pass=cold|warm calls=C magpie=M fsb=F test=NAME
//! ```
//!
//! (C allocator calls, the same for both; M and F instructions) and
//! fails (exit status 0x11) unless Magpie's count is lower on every row.
//! `make bench-hobby` (bench/hobby.py) boots it and writes the table in
//! docs/BENCHMARKS.md.

use core::alloc::{GlobalAlloc, Layout};
use core::fmt::Write;
use core::hint::black_box;
use core::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::{Com1, HEAP, exit_qemu};

#[path = "../../../bench/src/fixed_size_block.rs"]
mod fixed_size_block;

use fixed_size_block::{FixedSizeBlockAllocator, Locked};

/// The fixed-size-block allocator, as blog_os declares it.
static FSB: Locked<FixedSizeBlockAllocator> = Locked::new(FixedSizeBlockAllocator::new());

/// The fixed-size-block allocator's heap: as large as Magpie's.
const FSB_HEAP_SIZE: usize = crate::HEAP_SIZE;
#[repr(align(4096))]
#[expect(dead_code, reason = "only its address is used")]
struct FsbMemory([u8; FSB_HEAP_SIZE]);
static mut FSB_MEMORY: FsbMemory = FsbMemory([0; FSB_HEAP_SIZE]);

/// Whether allocations go to the fixed-size-block allocator (else Magpie).
static USE_FSB: AtomicBool = AtomicBool::new(false);
/// Debug exceptions taken (the #DB handler's count).
static NR_STEPS: AtomicU64 = AtomicU64::new(0);
/// Allocator calls and their instructions since the last [`measure`].
static NR_CALLS: AtomicU64 = AtomicU64::new(0);
static NR_INSTRUCTIONS: AtomicU64 = AtomicU64::new(0);
/// The steps of the one-`ret` baselines, less their one instruction.
static BASE_ALLOC: AtomicU64 = AtomicU64::new(0);
static BASE_FREE: AtomicU64 = AtomicU64::new(0);
static BASE_REALLOC: AtomicU64 = AtomicU64::new(0);

// The #DB handler (it counts and returns: the CPU clears TF entering it,
// `iretq` restores it, so the next instruction traps again; one CPU, so a
// plain `inc`), and the baselines (one `ret` each).
#[cfg(not(feature = "count-trace"))]
core::arch::global_asm!(
    ".global hobby_count_step",
    "hobby_count_step:",
    "    inc qword ptr [rip + {steps}]",
    "    iretq",
    steps = sym NR_STEPS,
);
// Feature `count-trace`: the handler also stores the trapping
// instruction's address (the saved RIP) while the trace has room.
#[cfg(feature = "count-trace")]
core::arch::global_asm!(
    ".global hobby_count_step",
    "hobby_count_step:",
    "    inc qword ptr [rip + {steps}]",
    "    push rax",
    "    push rcx",
    "    mov rcx, [rip + {len}]",
    "    cmp rcx, {cap}",
    "    jae 2f",
    "    lea rax, [rip + {trace}]",
    "    lea rax, [rax + rcx*8]",
    "    mov rcx, [rsp + 16]",
    "    mov [rax], rcx",
    "    inc qword ptr [rip + {len}]",
    "2:",
    "    pop rcx",
    "    pop rax",
    "    iretq",
    steps = sym NR_STEPS,
    len = sym trace::LEN,
    trace = sym trace::TRACE,
    cap = const trace::CAPACITY,
);
core::arch::global_asm!(
    ".global hobby_count_ret_alloc",
    ".global hobby_count_ret_free",
    ".global hobby_count_ret_realloc",
    "hobby_count_ret_alloc:",
    "hobby_count_ret_free:",
    "hobby_count_ret_realloc:",
    "    ret",
);

unsafe extern "Rust" {
    /// The #DB handler (an interrupt entry, never called).
    safe fn hobby_count_step();
    /// One `ret` with [`AllocFn`]'s signature (its result is garbage).
    safe fn hobby_count_ret_alloc(size: usize, align: usize) -> *mut u8;
    /// One `ret` with [`FreeFn`]'s signature.
    safe fn hobby_count_ret_free(ptr: *mut u8, size: usize, align: usize);
    /// One `ret` with [`ReallocFn`]'s signature (its result is garbage).
    safe fn hobby_count_ret_realloc(
        ptr: *mut u8,
        size: usize,
        align: usize,
        new_size: usize,
    ) -> *mut u8;
}

/// `__rust_alloc`'s signature: the size and alignment of a `Layout`.
type AllocFn = unsafe fn(usize, usize) -> *mut u8;
/// `__rust_dealloc`'s.
type FreeFn = unsafe fn(*mut u8, usize, usize);
/// `__rust_realloc`'s.
type ReallocFn = unsafe fn(*mut u8, usize, usize, usize) -> *mut u8;

// What `__rust_alloc`, `__rust_dealloc` and `__rust_realloc` are in a
// kernel with that allocator as its `#[global_allocator]` (the compiler's
// `__rg_alloc(size, align)` and the others: the layout rebuilt from its
// two words, the allocator's method called on its `static`).
unsafe fn magpie_alloc(size: usize, align: usize) -> *mut u8 {
    // SAFETY: per GlobalAlloc's contract, kept by our caller (a Layout's words).
    unsafe { HEAP.alloc(Layout::from_size_align_unchecked(size, align)) }
}
unsafe fn magpie_free(ptr: *mut u8, size: usize, align: usize) {
    // SAFETY: per GlobalAlloc's contract.
    unsafe { HEAP.dealloc(ptr, Layout::from_size_align_unchecked(size, align)) }
}
unsafe fn magpie_realloc(ptr: *mut u8, size: usize, align: usize, new_size: usize) -> *mut u8 {
    // SAFETY: per GlobalAlloc's contract.
    unsafe {
        HEAP.realloc(
            ptr,
            Layout::from_size_align_unchecked(size, align),
            new_size,
        )
    }
}
unsafe fn fsb_alloc(size: usize, align: usize) -> *mut u8 {
    // SAFETY: per GlobalAlloc's contract.
    unsafe { FSB.alloc(Layout::from_size_align_unchecked(size, align)) }
}
unsafe fn fsb_free(ptr: *mut u8, size: usize, align: usize) {
    // SAFETY: per GlobalAlloc's contract.
    unsafe { FSB.dealloc(ptr, Layout::from_size_align_unchecked(size, align)) }
}
unsafe fn fsb_realloc(ptr: *mut u8, size: usize, align: usize, new_size: usize) -> *mut u8 {
    // SAFETY: per GlobalAlloc's contract.
    unsafe {
        FSB.realloc(
            ptr,
            Layout::from_size_align_unchecked(size, align),
            new_size,
        )
    }
}

/// Sets RFLAGS.TF: each instruction after the next raises #DB.
#[inline(always)]
fn trap_on() {
    // SAFETY: sets TF only (pushfq/popfq balanced); run() loaded an IDT
    // whose #DB entry returns.
    unsafe { core::arch::asm!("pushfq", "or qword ptr [rsp], 0x100", "popfq") };
}

/// Clears RFLAGS.TF.
#[inline(always)]
fn trap_off() {
    // SAFETY: clears TF only.
    unsafe { core::arch::asm!("pushfq", "and qword ptr [rsp], -0x101", "popfq") };
}

/// Debug exceptions taken by `f(layout)` with the trap flag set, and its result.
#[inline(never)]
fn stepped_alloc(f: AllocFn, layout: Layout) -> (u64, *mut u8) {
    let f = black_box(f);
    let before = NR_STEPS.load(Ordering::Relaxed);
    trap_on();
    // SAFETY: f is an allocator's alloc or the baseline; layout as its caller's.
    let result = unsafe { f(layout.size(), layout.align()) };
    trap_off();
    (NR_STEPS.load(Ordering::Relaxed) - before, result)
}

/// Debug exceptions taken by `f(ptr, layout)`.
///
/// # Safety
/// As `GlobalAlloc::dealloc` for a real `f`.
#[inline(never)]
unsafe fn stepped_free(f: FreeFn, ptr: *mut u8, layout: Layout) -> u64 {
    let f = black_box(f);
    let before = NR_STEPS.load(Ordering::Relaxed);
    trap_on();
    // SAFETY: per our caller.
    unsafe { f(ptr, layout.size(), layout.align()) };
    trap_off();
    NR_STEPS.load(Ordering::Relaxed) - before
}

/// Debug exceptions taken by `f(ptr, layout, new_size)`, and its result.
///
/// # Safety
/// As `GlobalAlloc::realloc` for a real `f`.
#[inline(never)]
unsafe fn stepped_realloc(
    f: ReallocFn,
    ptr: *mut u8,
    layout: Layout,
    new_size: usize,
) -> (u64, *mut u8) {
    let f = black_box(f);
    let before = NR_STEPS.load(Ordering::Relaxed);
    trap_on();
    // SAFETY: per our caller.
    let result = unsafe { f(ptr, layout.size(), layout.align(), new_size) };
    trap_off();
    (NR_STEPS.load(Ordering::Relaxed) - before, result)
}

/// Add one call of `steps` debug exceptions less the baseline `base`.
fn charge(steps: u64, base: &AtomicU64) {
    NR_CALLS.fetch_add(1, Ordering::Relaxed);
    NR_INSTRUCTIONS.fetch_add(steps - base.load(Ordering::Relaxed), Ordering::Relaxed);
}

/// Whether `ptr` is in the fixed-size-block allocator's heap.
fn is_fsb(ptr: *mut u8) -> bool {
    let start = (&raw const FSB_MEMORY) as usize;
    (start..start + FSB_HEAP_SIZE).contains(&(ptr as usize))
}

/// The global allocator of feature `count`: the chosen allocator's call,
/// single-stepped and counted.
pub struct Counted;

#[global_allocator]
static COUNTED: Counted = Counted;

// SAFETY: every call forwards to one of two allocators with the caller's
// guarantees: allocations to the one chosen, frees and reallocations to
// the one whose heap holds the pointer (the one that allocated it).
unsafe impl GlobalAlloc for Counted {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let f: AllocFn = if USE_FSB.load(Ordering::Relaxed) {
            fsb_alloc
        } else {
            magpie_alloc
        };
        let (steps, ptr) = stepped_alloc(f, layout);
        charge(steps, &BASE_ALLOC);
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        let f: FreeFn = if is_fsb(ptr) { fsb_free } else { magpie_free };
        // SAFETY: per our caller; `f` is the allocator that allocated `ptr`.
        let steps = unsafe { stepped_free(f, ptr, layout) };
        charge(steps, &BASE_FREE);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let f: ReallocFn = if is_fsb(ptr) {
            fsb_realloc
        } else {
            magpie_realloc
        };
        // SAFETY: per our caller; `f` is the allocator that allocated `ptr`.
        let (steps, new) = unsafe { stepped_realloc(f, ptr, layout, new_size) };
        charge(steps, &BASE_REALLOC);
        new
    }
}

/// An IDT of two gates, the second (#DB) [`hobby_count_step`].
#[repr(C, align(16))]
struct Idt([u64; 4]);

/// Load `idt` with its #DB gate on [`hobby_count_step`].
fn load_idt(idt: &'static mut Idt) {
    let handler = hobby_count_step as fn() as usize as u64;
    let cs: u16;
    // SAFETY: reads CS; no memory.
    unsafe { core::arch::asm!("mov {0:x}, cs", out(reg) cs, options(nomem, nostack)) };
    // A 64-bit interrupt gate: offset 15:0, selector, IST 0, type 0xE with
    // P set (0x8e), offset 31:16; then offset 63:32.
    idt.0[2] = (handler & 0xffff)
        | (u64::from(cs) << 16)
        | (0x8e << 40)
        | (((handler >> 16) & 0xffff) << 48);
    idt.0[3] = handler >> 32;
    #[repr(C, packed)]
    struct Idtr {
        limit: u16,
        base: u64,
    }
    let idtr = Idtr {
        limit: 31,
        base: idt.0.as_ptr() as u64,
    };
    // SAFETY: a valid IDT, 'static; only #DB is raised while it is loaded
    // (the trap flag; this kernel takes no interrupts and no faults).
    unsafe { core::arch::asm!("lidt [{}]", in(reg) &raw const idtr, options(readonly, nostack)) };
}

/// Allocator calls and instructions of `test` run with the
/// fixed-size-block allocator (`fsb`) or Magpie.
fn measure(fsb: bool, test: fn()) -> (u64, u64) {
    USE_FSB.store(fsb, Ordering::Relaxed);
    NR_CALLS.store(0, Ordering::Relaxed);
    NR_INSTRUCTIONS.store(0, Ordering::Relaxed);
    test();
    USE_FSB.store(false, Ordering::Relaxed);
    (
        NR_CALLS.load(Ordering::Relaxed),
        NR_INSTRUCTIONS.load(Ordering::Relaxed),
    )
}

/// Count every test with both allocators and print the figures; return
/// if Magpie executed fewer instructions on every test, else exit with a
/// failure.
pub fn run(tests: &[(&str, fn())]) {
    static mut IDT: Idt = Idt([0; 4]);
    // SAFETY: the only reference to IDT, taken once (run is called once).
    load_idt(unsafe { (&raw mut IDT).as_mut() }.expect("a static's address"));
    // SAFETY: FSB_MEMORY is mapped (.bss), used by nothing else, for ever.
    unsafe {
        FSB.lock()
            .add_memory((&raw mut FSB_MEMORY).cast::<u8>(), FSB_HEAP_SIZE);
    }
    let layout = Layout::from_size_align(8, 8).unwrap();
    let (alloc, _) = stepped_alloc(hobby_count_ret_alloc, layout);
    // SAFETY: the baselines touch nothing.
    let free = unsafe { stepped_free(hobby_count_ret_free, core::ptr::null_mut(), layout) };
    // SAFETY: as above.
    let (realloc, _) =
        unsafe { stepped_realloc(hobby_count_ret_realloc, core::ptr::null_mut(), layout, 16) };
    println!(
        "hobby-kernel: counting (baselines: alloc {alloc}, free {free}, realloc {realloc} steps)"
    );
    assert!((1..20).contains(&alloc) && (1..20).contains(&free) && (1..20).contains(&realloc));
    // Each baseline's one `ret` stands for the measured function's.
    BASE_ALLOC.store(alloc - 1, Ordering::Relaxed);
    BASE_FREE.store(free - 1, Ordering::Relaxed);
    BASE_REALLOC.store(realloc - 1, Ordering::Relaxed);

    // Twice: as blog_os runs them after boot (Magpie creates a small
    // heap's size classes on first use), then again, warm.
    let mut slower = 0;
    for pass in ["cold", "warm"] {
        for &(name, test) in tests {
            #[cfg(feature = "count-trace")]
            trace::clear();
            let (calls, magpie) = measure(false, test);
            #[cfg(feature = "count-trace")]
            trace::print(pass, name);
            let (fsb_calls, fsb) = measure(true, test);
            assert_eq!(calls, fsb_calls, "{name}: both run the same test");
            println!("HOBBY_COUNT pass={pass} calls={calls} magpie={magpie} fsb={fsb} test={name}");
            if magpie >= fsb {
                println!("{name} ({pass}): Magpie is not faster ({magpie} >= {fsb} instructions)");
                slower += 1;
            }
        }
    }
    if slower != 0 {
        println!(
            "[failed] Magpie is slower on {slower} of {} rows",
            2 * tests.len()
        );
        exit_qemu(0x11)
    }
    println!("Magpie is faster on every test");
}

/// Feature `count-trace`: the address of every instruction single-stepped,
/// in order, printed after each test's Magpie run for
/// `bench/hobby_profile.py`:
///
/// ```text
/// HOBBY_TRACE pass=cold|warm steps=N test=NAME
/// 1a2b0 1a2b3 ...            (offsets from __text_start, hex, 16 a line)
/// HOBBY_TRACE_END
/// ```
///
/// A test of more than [`trace::PRINT_MAX`] steps (many_boxes: the hit,
/// 20,000 times) is printed as a histogram instead (`HOBBY_HIST`, lines of
/// `offset:count`): its order is lost, its counts are not.
#[cfg(feature = "count-trace")]
mod trace {
    use core::fmt::Write;

    use crate::Com1;

    /// Addresses the trace holds (16 MiB); later steps are counted only.
    pub const CAPACITY: usize = 1 << 21;
    /// Longer traces are printed as a histogram.
    pub const PRINT_MAX: usize = 200_000;
    /// The trace, written by the #DB handler.
    pub static mut TRACE: [u64; CAPACITY] = [0; CAPACITY];
    /// Addresses in [`TRACE`].
    pub static mut LEN: usize = 0;

    unsafe extern "C" {
        /// The start of the kernel's text (boot/linker.ld).
        static __text_start: u8;
    }

    /// Empty the trace.
    pub fn clear() {
        // SAFETY: one CPU; the handler writes LEN only while the trap flag
        // is set, which it is not here.
        unsafe { (&raw mut LEN).write(0) };
    }

    /// Print the trace of the Magpie run of `test` (see the module).
    pub fn print(pass: &str, test: &str) {
        // SAFETY: as in clear; nothing else holds a reference to TRACE.
        let trace = unsafe {
            core::slice::from_raw_parts_mut((&raw mut TRACE).cast::<u64>(), (&raw const LEN).read())
        };
        let base = (&raw const __text_start) as u64;
        let histogram = trace.len() > PRINT_MAX;
        let kind = if histogram { "HIST" } else { "TRACE" };
        println!("HOBBY_{kind} pass={pass} steps={} test={test}", trace.len());
        if histogram {
            trace.sort_unstable();
            for run in trace.chunk_by(|a, b| a == b) {
                println!("{:x}:{}", run[0].wrapping_sub(base), run.len());
            }
        } else {
            for line in trace.chunks(16) {
                for &rip in line {
                    let _ = write!(Com1, "{:x} ", rip.wrapping_sub(base));
                }
                println!();
            }
        }
        println!("HOBBY_TRACE_END");
    }
}
