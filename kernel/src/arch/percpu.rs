//! Per-CPU data, reached through the GS base register.
//!
//! Each CPU's GS base points at its own cache-line aligned [`PerCpu`] in a
//! static array; [`cpu_id`] is one `mov` from `gs:`. Other CPUs' entries
//! are readable through [`get`] (state and ids are atomics).

use core::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};

use x86_64::VirtAddr;
use x86_64::registers::model_specific::GsBase;

/// The most CPUs the kernel supports.
pub const MAX_CPUS: usize = 64;

/// Bytes per CPU in per-CPU arrays indexed by [`cpu_offset`] (one cache
/// line; `magpie_slab::CPU_SLOT_BYTES`).
pub const CPU_SLOT_BYTES: usize = 64;

/// One CPU's private data. Field offsets are fixed (`repr(C)`): `self_ptr`
/// at 0, `cpu_id` at 8 and `cpu_offset` at 16 are read with `gs:`
/// addressing.
#[repr(C, align(64))]
pub struct PerCpu {
    self_ptr: AtomicUsize,
    cpu_id: AtomicU32,
    apic_id: AtomicU32,
    /// `cpu_id * CPU_SLOT_BYTES`, precomputed for [`cpu_offset`].
    cpu_offset: AtomicUsize,
    /// A [`CpuState`] as `u32`.
    state: AtomicU32,
    /// Work items this CPU has run from its `smp` mailbox.
    nr_jobs: AtomicU64,
    /// Allocation profiling: this CPU's counter base in
    /// `profiling::COUNTERS` (`AllocTagCounters::cpu_base`), read with
    /// `gs:` addressing by every charge; 0 until profiling is set up.
    alloc_tag_base: AtomicUsize,
    /// Allocation profiling: the charge token (`AllocTagCounters::token`,
    /// checked when set) of the tag this CPU charges allocations that name
    /// none (its innermost scope's, else `untagged`); 0 (none) until
    /// profiling is set up. Read with `gs:` addressing.
    alloc_tag_current: AtomicU32,
    /// Device interrupt handlers (the LAPIC timer's) running on this CPU,
    /// nested: non-zero in interrupt context ([`in_interrupt`]).
    irq_depth: AtomicU32,
}

/// Where a CPU is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum CpuState {
    /// Not started (or absent, or failed to start).
    Offline = 0,
    /// INIT–SIPI–SIPI sent; not yet in the kernel.
    Starting = 1,
    /// Running the kernel, waiting for work.
    Idle = 2,
    /// Running the kernel: the boot CPU, or an AP running a work item.
    Busy = 3,
}

impl CpuState {
    fn from_u32(value: u32) -> Self {
        match value {
            1 => Self::Starting,
            2 => Self::Idle,
            3 => Self::Busy,
            _ => Self::Offline,
        }
    }

    /// Lower-case name, as `cpus` prints it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Offline => "offline",
            Self::Starting => "starting",
            Self::Idle => "idle",
            Self::Busy => "busy",
        }
    }

    /// Running kernel code (idle or busy).
    pub fn is_online(self) -> bool {
        matches!(self, Self::Idle | Self::Busy)
    }
}

const _: () = assert!(core::mem::offset_of!(PerCpu, self_ptr) == 0);
const _: () = assert!(core::mem::offset_of!(PerCpu, cpu_id) == 8);
const _: () = assert!(core::mem::offset_of!(PerCpu, cpu_offset) == 16);
const _: () = assert!(core::mem::offset_of!(PerCpu, alloc_tag_base) == 40);
const _: () = assert!(core::mem::offset_of!(PerCpu, alloc_tag_current) == 48);
const _: () = assert!(core::mem::size_of::<PerCpu>() == 64);

impl PerCpu {
    const fn new() -> Self {
        Self {
            self_ptr: AtomicUsize::new(0),
            cpu_id: AtomicU32::new(0),
            apic_id: AtomicU32::new(0),
            cpu_offset: AtomicUsize::new(0),
            state: AtomicU32::new(CpuState::Offline as u32),
            nr_jobs: AtomicU64::new(0),
            alloc_tag_base: AtomicUsize::new(0),
            alloc_tag_current: AtomicU32::new(0),
            irq_depth: AtomicU32::new(0),
        }
    }

    /// This CPU's logical id (0 = boot CPU).
    pub fn cpu_id(&self) -> usize {
        self.cpu_id.load(Ordering::Relaxed) as usize
    }

    /// This CPU's local APIC id.
    pub fn apic_id(&self) -> u32 {
        self.apic_id.load(Ordering::Relaxed)
    }

    /// Where this CPU is in its life.
    pub fn state(&self) -> CpuState {
        CpuState::from_u32(self.state.load(Ordering::Acquire))
    }

    /// Work items run from this CPU's mailbox.
    pub fn nr_jobs(&self) -> u64 {
        self.nr_jobs.load(Ordering::Relaxed)
    }

    pub(crate) fn set_state(&self, state: CpuState) {
        self.state.store(state as u32, Ordering::Release);
    }

    pub(crate) fn set_apic_id(&self, apic_id: u32) {
        self.apic_id.store(apic_id, Ordering::Relaxed);
    }

    pub(crate) fn count_job(&self) {
        self.nr_jobs.fetch_add(1, Ordering::Relaxed);
    }

    /// Sets this CPU's allocation-tag counter base (profiling setup, for
    /// every CPU before profiling is switched on).
    pub(crate) fn set_alloc_tag_base(&self, base: usize) {
        self.alloc_tag_base.store(base, Ordering::Relaxed);
    }

    /// The tag this CPU charges allocations that name none (0: none).
    pub(crate) fn alloc_tag_current(&self) -> &AtomicU32 {
        &self.alloc_tag_current
    }
}

/// CPU `cpu`'s [`PerCpu`] (any CPU's, not only the current one).
pub fn get(cpu: usize) -> Option<&'static PerCpu> {
    PERCPU.get(cpu)
}

static PERCPU: [PerCpu; MAX_CPUS] = [const { PerCpu::new() }; MAX_CPUS];

/// Points this CPU's GS base at `PERCPU[cpu_id]`.
pub(crate) fn init_this_cpu(cpu_id: usize, apic_id: u32) {
    assert!(cpu_id < MAX_CPUS, "cpu id {cpu_id} >= MAX_CPUS");
    let percpu = &PERCPU[cpu_id];
    let address = percpu as *const PerCpu as usize;
    percpu.self_ptr.store(address, Ordering::Relaxed);
    percpu.cpu_id.store(cpu_id as u32, Ordering::Relaxed);
    percpu
        .cpu_offset
        .store(cpu_id * CPU_SLOT_BYTES, Ordering::Relaxed);
    percpu.apic_id.store(apic_id, Ordering::Relaxed);
    GsBase::write(VirtAddr::new(address as u64));
    percpu.set_state(CpuState::Busy);
}

/// The current CPU's logical id (0 = boot CPU).
#[inline]
pub fn cpu_id() -> usize {
    let id: u32;
    // SAFETY: GS base points at this CPU's PerCpu from the first lines of
    // kernel_entry on; offset 8 is `cpu_id` (checked by the const assert).
    unsafe {
        core::arch::asm!("mov {:e}, gs:[8]", out(reg) id, options(nostack, preserves_flags, readonly));
    }
    id as usize
}

/// `cpu_id() * CPU_SLOT_BYTES`: this CPU's slot in a per-CPU array of
/// cache lines, in one instruction (the slab allocator's per-CPU base).
#[inline(always)]
pub fn cpu_offset() -> usize {
    let offset: usize;
    // SAFETY: as in `cpu_id`; offset 16 is `cpu_offset` (const assert).
    unsafe {
        core::arch::asm!("mov {}, gs:[16]", out(reg) offset, options(nostack, preserves_flags, readonly));
    }
    offset
}

/// This CPU's allocation-tag counter base ([`PerCpu`]'s
/// `alloc_tag_base`), in one instruction.
#[inline(always)]
pub fn alloc_tag_base() -> usize {
    let base: usize;
    // SAFETY: as in `cpu_id`; offset 40 is `alloc_tag_base` (const assert).
    unsafe {
        core::arch::asm!("mov {}, gs:[40]", out(reg) base, options(nostack, preserves_flags, readonly));
    }
    base
}

/// The charge token of the tag this CPU charges allocations that name
/// none ([`PerCpu`]'s `alloc_tag_current`, 0: none), in one instruction.
#[inline(always)]
pub fn alloc_tag_current() -> u32 {
    let tag: u64;
    // SAFETY: as in `cpu_id`; offset 48 is `alloc_tag_current` (const
    // assert). A 32-bit `mov` clears the register's upper half.
    unsafe {
        core::arch::asm!("mov {:e}, gs:[48]", out(reg) tag, options(nostack, preserves_flags, readonly));
    }
    // SAFETY: the upper half is 0 (above): told to the compiler, so a
    // token used as a 64-bit offset (the profiled hit's counters) needs
    // no zero-extending copy.
    unsafe { core::hint::assert_unchecked(tag <= u64::from(u32::MAX)) };
    tag as u32
}

/// The current CPU's [`PerCpu`].
#[inline]
pub fn this_cpu() -> &'static PerCpu {
    let address: usize;
    // SAFETY: as in `cpu_id`; offset 0 holds the PerCpu's own address.
    unsafe {
        core::arch::asm!("mov {}, gs:[0]", out(reg) address, options(nostack, preserves_flags, readonly));
    }
    // SAFETY: the address is that of an element of the static PERCPU array.
    unsafe { &*(address as *const PerCpu) }
}

/// Whether this CPU is running a device interrupt handler (between
/// [`irq_enter`] and [`irq_exit`]): `magpie_slab`'s
/// `Platform::in_interrupt`.
#[inline]
pub fn in_interrupt() -> bool {
    this_cpu().irq_depth.load(Ordering::Relaxed) != 0
}

/// A device interrupt handler starts on this CPU (interrupts off).
#[inline]
pub fn irq_enter() {
    let depth = &this_cpu().irq_depth;
    depth.store(depth.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
}

/// The handler [`irq_enter`] announced ends.
#[inline]
pub fn irq_exit() {
    let depth = &this_cpu().irq_depth;
    depth.store(depth.load(Ordering::Relaxed) - 1, Ordering::Relaxed);
}
