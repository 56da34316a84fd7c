//! Symmetric multiprocessing: starting the application processors (APs)
//! and handing them work.
//!
//! # Bring-up
//!
//! [`init`] runs on the boot CPU after the slab allocator is up (the APs
//! allocate their GDT, TSS and double-fault stack through it). For each
//! usable processor in the ACPI MADT other than the boot CPU, in MADT
//! order, it allocates a kernel stack, sends INIT–SIPI–SIPI
//! ([`crate::arch::ap`]) and waits up to [`AP_START_TIMEOUT_MS`] for the
//! AP to report in. CPU ids are dense: the boot CPU is 0, the APs 1, 2, …
//! in MADT order. An AP that does not answer stays `offline`.
//!
//! AP kernel stacks ([`AP_STACK_SIZE`]) are frames addressed through the
//! direct map, which uses 2 MiB pages: unlike the boot stack they have no
//! guard page (each AP's double-fault IST stack is its own, though).
//!
//! # Work
//!
//! No scheduler: each AP runs [`work_loop`], taking closures from its own
//! mailbox (a locked queue) and running them to completion, and sleeps in
//! `hlt` when the mailbox is empty. Posting work sends the wake-up IPI.
//! [`run_on`] posts one closure to one CPU and returns a [`Completion`];
//! [`run_on_cpus`] / [`run_on_all`] run one borrowed closure on several
//! CPUs at once (the calling CPU takes its own share) and return when all
//! are done.
//!
//! # Cross-CPU calls
//!
//! [`cross_cpu_call`] runs a borrowed closure on one CPU *inside its wake
//! IPI handler* (interrupts off there) and waits for it: Linux's
//! `smp_call_function_single`. The slab allocator uses it to reach a
//! CPU's per-CPU magazines, which only that CPU touches, with interrupts
//! off (reap, destroy, statistics). Each CPU has one call slot; a caller
//! puts its request there (waiting while another caller's request is
//! pending), sends the wake IPI and spins until the request is done. A
//! CPU also runs its pending call when it polls: in its work loop before
//! sleeping, and while it waits for a call or a [`Completion`] itself, so
//! two CPUs calling each other, or a CPU running with interrupts off
//! (the boot CPU never enables them), cannot deadlock the caller that
//! waits on it while it waits too.
//!
//! # FAQ
//!
//! * *Why can the idle loop not miss a wake-up?* It checks the mailbox
//!   with interrupts off and then runs `sti; hlt`: an IPI sent after the
//!   check is held pending by the LAPIC and taken right after `sti`, which
//!   ends the `hlt`.
//! * *Why `hlt` and not a spin?* Under QEMU TCG each vCPU is a host
//!   thread; spinning APs would take host time from the CPU doing work.
//! * *Can posting work deadlock?* Work that waits for work posted to a CPU
//!   that is itself waiting (two CPUs each waiting on the other's mailbox)
//!   spins forever: work items run to completion, one at a time. Post from
//!   the boot CPU (the shell, tests), or only to CPUs that are not waiting.
//! * *What if work on an AP panics?* The panic handler reports on that CPU
//!   and exits QEMU: there is no unwinding, so borrowed closures in
//!   [`run_on_cpus`] cannot outlive their borrow.

pub mod stress;

use alloc::boxed::Box;
use alloc::collections::VecDeque;
use alloc::sync::Arc;
use alloc::vec::Vec;
use core::fmt;
use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering};

use spin::Mutex;

use crate::arch::{self, CpuState, IrqGuard, MAX_CPUS, ap, idt, lapic, percpu, tsc};
use crate::mm::{frame, layout};

/// Kernel stack of each AP.
pub const AP_STACK_SIZE: usize = 128 * 1024;
/// How long the boot CPU waits for one AP to report in.
pub const AP_START_TIMEOUT_MS: u64 = 2000;

/// Why work could not be posted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SmpError {
    /// No such CPU, or it is not running.
    Offline(usize),
    /// No memory for the named bookkeeping (work items, completion flags,
    /// mailbox room); nothing was posted.
    OutOfMemory(&'static str),
}

impl fmt::Display for SmpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SmpError::Offline(cpu) => write!(f, "cpu {cpu} is not online"),
            SmpError::OutOfMemory(what) => write!(f, "out of memory for {what}"),
        }
    }
}

type Work = Box<dyn FnOnce() + Send>;

struct Job {
    work: Work,
    done: Arc<AtomicBool>,
}

/// One CPU's queue of work.
struct Mailbox {
    jobs: Mutex<VecDeque<Job>>,
}

static MAILBOXES: [Mailbox; MAX_CPUS] = [const {
    Mailbox {
        jobs: Mutex::new(VecDeque::new()),
    }
}; MAX_CPUS];
/// CPUs that have come up (the boot CPU included), once [`init`] has run.
static NR_ONLINE: AtomicUsize = AtomicUsize::new(1);
static BOOT_CYCLES: AtomicUsize = AtomicUsize::new(0);

/// Starts every AP the MADT lists. Call once, on the boot CPU, after
/// `kmem::init`.
pub(crate) fn init() {
    idt::set_wake_handler(run_pending_call);
    let _scope = crate::alloc_tag_scope!();
    let Some(info) = arch::acpi::info() else {
        return;
    };
    lapic::init(info.lapic_phys);
    let bsp_apic_id = lapic::id();
    arch::this_cpu().set_apic_id(bsp_apic_id);
    let nr_cpus = arch::max_cpus();
    if nr_cpus <= 1 {
        return;
    }
    ap::prepare();
    let start = arch::rdtsc();
    let ap_apic_ids = info.apic_ids().iter().filter(|&&id| id != bsp_apic_id);
    for (cpu, &apic_id) in (1..nr_cpus).zip(ap_apic_ids) {
        if start_ap(cpu, apic_id) {
            NR_ONLINE.fetch_add(1, Ordering::AcqRel);
        } else {
            log::warn!("cpu {cpu} (APIC id {apic_id}) did not start; it stays offline");
        }
    }
    let cycles = arch::rdtsc() - start;
    BOOT_CYCLES.store(cycles as usize, Ordering::Relaxed);
    log::info!(
        "{} of {} CPUs online ({} ms to start the APs)",
        nr_online(),
        nr_cpus,
        tsc::cycles_to_us(cycles) / 1000
    );
}

/// Top of each AP's kernel stack (0: none), for the leak scan's roots.
static AP_STACK_TOPS: [AtomicUsize; MAX_CPUS] = [const { AtomicUsize::new(0) }; MAX_CPUS];

/// Each AP's stack pointer while it sleeps in its work loop (0 while it
/// runs work, or before it first sleeps): its stack below it holds only
/// dead frames (the last job's), not roots.
static AP_IDLE_SP: [AtomicUsize; MAX_CPUS] = [const { AtomicUsize::new(0) }; MAX_CPUS];

/// CPU `cpu`'s kernel stack as `bottom..top` (APs only; the boot CPU's is
/// in the kernel image), once it was given one.
pub fn ap_stack(cpu: usize) -> Option<(usize, usize)> {
    let top = AP_STACK_TOPS.get(cpu)?.load(Ordering::Acquire);
    (top != 0).then(|| (top - AP_STACK_SIZE, top))
}

/// The AP stacks for a leak scan of a memory image
/// (`magpie_slab::descriptor::describe_leak_roots`): each CPU's stack top
/// (0: none; the boot CPU's is in the kernel image), and its live part's
/// bottom while it sleeps in its work loop ([`ap_stack_live`]'s rule).
pub fn ap_stack_table() -> magpie_slab::descriptor::KernelStacks {
    magpie_slab::descriptor::KernelStacks {
        tops: &AP_STACK_TOPS,
        size: AP_STACK_SIZE,
        floors: Some(&AP_IDLE_SP),
    }
}

/// The live part of CPU `cpu`'s kernel stack, for the leak scan's roots:
/// from where it sleeps in its work loop up to the top, or all of
/// [`ap_stack`] while it runs work (or before it first slept). The dead
/// part below holds stale copies of pointers (a finished job's frames:
/// `stress` frees objects that a later command allocates and leaks),
/// which would hide the very leaks asked about.
pub fn ap_stack_live(cpu: usize) -> Option<(usize, usize)> {
    let (bottom, top) = ap_stack(cpu)?;
    let sp = AP_IDLE_SP[cpu].load(Ordering::Acquire);
    Some(if (bottom..top).contains(&sp) {
        (sp, top)
    } else {
        (bottom, top)
    })
}

/// Starts CPU `cpu` at `apic_id` and waits for it. Returns whether it came up.
fn start_ap(cpu: usize, apic_id: u32) -> bool {
    let percpu = percpu::get(cpu).expect("cpu id below MAX_CPUS");
    let nr_frames = AP_STACK_SIZE / frame::PAGE_SIZE;
    let Some(stack) = crate::alloc_pages!(nr_frames) else {
        log::warn!("no memory for cpu {cpu}'s stack");
        return false;
    };
    let stack_top = layout::phys_to_virt(stack.as_u64()) as u64 + AP_STACK_SIZE as u64;
    AP_STACK_TOPS[cpu].store(stack_top as usize, Ordering::Release);
    {
        // Room for the mailbox up front: posting work later allocates
        // nothing that outlives the work (tests compare allocation counts).
        let _irq = IrqGuard::new();
        MAILBOXES[cpu].jobs.lock().reserve(16);
    }
    percpu.set_apic_id(apic_id);
    percpu.set_state(CpuState::Starting);
    let is_up = || percpu.state() != CpuState::Starting;
    // SAFETY: ap::prepare ran; APs start one at a time (this waits until
    // the previous one left the trampoline, or gave up on it, below); the
    // stack is fresh frames, 16-byte aligned at the top, used by this AP
    // alone; ap_entry calls ap::enter_kernel first and never returns.
    unsafe { ap::start(apic_id, stack_top, ap_entry, cpu as u64, &is_up) };
    let deadline = arch::rdtsc() + AP_START_TIMEOUT_MS * tsc::khz();
    while !is_up() {
        if arch::rdtsc() > deadline {
            percpu.set_state(CpuState::Offline);
            // The stack is not freed: the AP might still wake up and use it.
            return false;
        }
        core::hint::spin_loop();
    }
    // The AP is out of the trampoline; wait until it has finished its own
    // set-up (GDT, TSS and double-fault stack come from the slab allocator)
    // and sits in its work loop, so nothing it allocates while starting
    // overlaps with what the boot CPU does next.
    while percpu.state() == CpuState::Busy {
        if arch::rdtsc() > deadline {
            log::warn!("cpu {cpu} is slow to finish its set-up");
            break;
        }
        core::hint::spin_loop();
    }
    percpu.state().is_online()
}

/// An AP's first Rust code, called by the trampoline with its CPU id.
extern "C" fn ap_entry(cpu: u64) -> ! {
    // SAFETY: this is the ApEntry the trampoline called, running first.
    unsafe { ap::enter_kernel() };
    arch::init_ap_percpu(cpu as usize);
    {
        // The AP's GDT, TSS and double-fault stack, charged to this site.
        let _scope = crate::alloc_tag_scope!();
        arch::init_ap();
    }
    let _context = crate::tracing::context::enter_context("smp work");
    log::debug!("cpu {cpu} up (APIC id {})", arch::this_cpu().apic_id());
    // Work runs with interrupts on, so cross-CPU calls reach this CPU
    // while it works (the idle `sti; hlt` turns them on anyway).
    x86_64::instructions::interrupts::enable();
    work_loop()
}

/// The AP's life after bring-up: run work from the mailbox, sleep when
/// there is none.
fn work_loop() -> ! {
    let this = arch::this_cpu();
    let mailbox = &MAILBOXES[this.cpu_id()];
    this.set_state(CpuState::Idle);
    loop {
        let job = {
            let _irq = IrqGuard::new();
            mailbox.jobs.lock().pop_front()
        };
        match job {
            Some(job) => {
                this.set_state(CpuState::Busy);
                (job.work)();
                this.count_job();
                this.set_state(CpuState::Idle);
                job.done.store(true, Ordering::Release);
            }
            None => {
                x86_64::instructions::interrupts::disable();
                run_pending_call();
                if mailbox.jobs.lock().is_empty() {
                    let sp: usize;
                    // SAFETY: reads the stack pointer; no memory access.
                    unsafe {
                        core::arch::asm!("mov {}, rsp", out(reg) sp, options(nomem, nostack, preserves_flags));
                    }
                    AP_IDLE_SP[this.cpu_id()].store(sp, Ordering::Release);
                    // Atomically enable interrupts and halt: a wake-up IPI
                    // pending since the check above ends the hlt at once.
                    x86_64::instructions::interrupts::enable_and_hlt();
                    AP_IDLE_SP[this.cpu_id()].store(0, Ordering::Release);
                }
            }
        }
    }
}

/// CPUs running the kernel (the boot CPU included).
pub fn nr_online() -> usize {
    NR_ONLINE.load(Ordering::Acquire)
}

/// Cycles the boot CPU spent starting the APs.
pub fn boot_cycles() -> u64 {
    BOOT_CYCLES.load(Ordering::Relaxed) as u64
}

/// Ids of the CPUs that run the kernel, in order.
pub fn online_cpus() -> impl Iterator<Item = usize> {
    (0..arch::max_cpus()).filter(|&cpu| is_online(cpu))
}

/// Whether CPU `cpu` runs the kernel.
pub fn is_online(cpu: usize) -> bool {
    percpu::get(cpu).is_some_and(|percpu| percpu.state().is_online())
}

/// Where CPU `cpu` is (offline if there is no such CPU).
pub fn state(cpu: usize) -> CpuState {
    percpu::get(cpu).map_or(CpuState::Offline, |percpu| percpu.state())
}

/// Tells when work posted with [`run_on`] has finished.
#[derive(Clone)]
pub struct Completion {
    done: Arc<AtomicBool>,
}

impl Completion {
    /// Whether the work has run to completion.
    pub fn is_done(&self) -> bool {
        self.done.load(Ordering::Acquire)
    }

    /// Spins until the work has run to completion (running cross-CPU
    /// calls to this CPU meanwhile).
    pub fn wait(&self) {
        while !self.is_done() {
            run_pending_call();
            core::hint::spin_loop();
        }
    }
}

/// Posts `work` to CPU `cpu`'s mailbox and wakes it. On the calling CPU
/// itself, runs `work` at once. The returned [`Completion`] tells when it
/// has run.
///
/// # Errors
///
/// [`SmpError::Offline`] if `cpu` does not run the kernel;
/// [`SmpError::OutOfMemory`] (nothing posted) if the work item, its flag or
/// room in the mailbox cannot be allocated.
pub fn run_on(cpu: usize, work: impl FnOnce() + Send + 'static) -> Result<Completion, SmpError> {
    if !is_online(cpu) {
        return Err(SmpError::Offline(cpu));
    }
    let _scope = crate::alloc_tag_scope!();
    // One allocation scope: the boxed work, its flag, room in the mailbox.
    let job = crate::try_alloc!(new_job(cpu, |_| Ok(Box::try_new(work)?)))
        .map_err(|_| SmpError::OutOfMemory("a work item"))?;
    Ok(post(cpu, job))
}

/// A job for `cpu` (its work made by `make_work`, given `cpu`), with its
/// completion flag and, for another CPU, room for one more job in that
/// CPU's mailbox; all or nothing.
fn new_job(
    cpu: usize,
    make_work: impl FnOnce(usize) -> Result<Work, core::alloc::AllocError>,
) -> Result<Job, core::alloc::AllocError> {
    let done = Arc::try_new(AtomicBool::new(false))?;
    let work = make_work(cpu)?;
    if cpu != arch::cpu_id() {
        let _irq = IrqGuard::new();
        MAILBOXES[cpu]
            .jobs
            .lock()
            .try_reserve(1)
            .map_err(|_| core::alloc::AllocError)?;
    }
    Ok(Job { work, done })
}

/// Posts `job` to online CPU `cpu` (room in its mailbox reserved by
/// [`new_job`]) and wakes it; on the calling CPU, runs it at once.
fn post(cpu: usize, job: Job) -> Completion {
    let completion = Completion {
        done: job.done.clone(),
    };
    if cpu == arch::cpu_id() {
        (job.work)();
        job.done.store(true, Ordering::Release);
        return completion;
    }
    {
        let _irq = IrqGuard::new();
        // Does not grow: `new_job` reserved the room.
        MAILBOXES[cpu].jobs.lock().push_back(job);
    }
    let apic_id = percpu::get(cpu).map_or(0, |percpu| percpu.apic_id());
    lapic::send_wake(apic_id);
    completion
}

/// A borrowed closure sent to other CPUs by [`run_on_cpus`].
struct SharedWork(*const (dyn Fn(usize) + Sync));

// SAFETY: the pointee is `Sync`, so calling it from several CPUs at once
// is allowed; `run_on_cpus` keeps it alive until every CPU is done.
unsafe impl Send for SharedWork {}

/// Runs `work(cpu)` on each CPU in `cpus` at the same time, the calling
/// CPU included if listed, and returns when all have finished.
///
/// # Errors
///
/// [`SmpError::Offline`] (before anything runs) if a listed CPU is not
/// online; [`SmpError::OutOfMemory`] (before anything runs) if the work
/// items cannot be allocated.
pub fn run_on_cpus(cpus: &[usize], work: &(dyn Fn(usize) + Sync)) -> Result<(), SmpError> {
    if let Some(&cpu) = cpus.iter().find(|&&cpu| !is_online(cpu)) {
        return Err(SmpError::Offline(cpu));
    }
    let this_cpu = arch::cpu_id();
    // SAFETY: lifetime erasure only; every posted job is waited for below,
    // so `work` outlives all uses. The one early return (no memory for jobs)
    // comes before any is posted; a panic ends the kernel (panic = abort).
    let shared: *const (dyn Fn(usize) + Sync) = unsafe {
        core::mem::transmute::<&(dyn Fn(usize) + Sync), &'static (dyn Fn(usize) + Sync)>(work)
    };
    let _scope = crate::alloc_tag_scope!();
    // One allocation scope: every other CPU's job, before any is posted.
    let mut slots = crate::try_alloc!(shared_jobs(cpus, this_cpu, shared))
        .map_err(|_| SmpError::OutOfMemory("the work items"))?;
    for (cpu, slot) in &mut slots {
        if let Slot::Job(job) = core::mem::replace(slot, Slot::Empty) {
            *slot = Slot::Posted(post(*cpu, job));
        }
    }
    if cpus.contains(&this_cpu) {
        work(this_cpu);
    }
    for (_, slot) in &slots {
        if let Slot::Posted(completion) = slot {
            completion.wait();
        }
    }
    Ok(())
}

/// One CPU's part of [`run_on_cpus`]: its job until posted, then the job's
/// completion.
enum Slot {
    Job(Job),
    Posted(Completion),
    Empty,
}

/// A job calling `shared(cpu)` for each CPU in `cpus` but `this_cpu`; all
/// or nothing.
fn shared_jobs(
    cpus: &[usize],
    this_cpu: usize,
    shared: *const (dyn Fn(usize) + Sync),
) -> Result<Vec<(usize, Slot)>, core::alloc::AllocError> {
    let mut jobs = Vec::new();
    jobs.try_reserve_exact(cpus.len())
        .map_err(|_| core::alloc::AllocError)?;
    for &cpu in cpus.iter().filter(|&&cpu| cpu != this_cpu) {
        let job = new_job(cpu, |cpu| {
            let job = SharedWork(shared);
            Ok(Box::try_new(move || {
                let job = job;
                // SAFETY: see SharedWork; the closure is alive until waited for.
                unsafe { (*job.0)(cpu) }
            })?)
        })?;
        jobs.push((cpu, Slot::Job(job)));
    }
    Ok(jobs)
}

/// Runs `work(cpu)` on every online CPU at once (this one included) and
/// returns when all have finished.
///
/// # Panics
///
/// If the work items cannot be allocated (a test helper: no shell command
/// calls it).
pub fn run_on_all(work: &(dyn Fn(usize) + Sync)) {
    let mut cpus = [0; MAX_CPUS];
    let mut nr_cpus = 0;
    for (slot, cpu) in cpus.iter_mut().zip(online_cpus()) {
        *slot = cpu;
        nr_cpus += 1;
    }
    if let Err(error) = run_on_cpus(&cpus[..nr_cpus], work) {
        panic!("run_on_all: {error}");
    }
}

/// A cross-CPU call waiting in its target's slot: the work, and the flag
/// the target sets when it has run.
struct CallRequest<'a> {
    work: &'a (dyn Fn() + Sync),
    done: AtomicBool,
}

/// Each CPU's call slot: a pointer to the caller's [`CallRequest`] (on the
/// caller's stack), null when empty.
static CALL_SLOTS: [AtomicPtr<()>; MAX_CPUS] =
    [const { AtomicPtr::new(core::ptr::null_mut()) }; MAX_CPUS];

/// Runs `work` on CPU `cpu` with interrupts off there and returns when it
/// has run: inside `cpu`'s wake IPI handler (or its polling, see the module
/// docs). On the calling CPU itself, or on a CPU that is not running the
/// kernel, runs `work` here with interrupts off. `work` must not take locks
/// the target might hold or allocate: it runs in an interrupt handler.
pub fn cross_cpu_call(cpu: usize, work: &(dyn Fn() + Sync)) {
    if cpu == arch::cpu_id() || !is_online(cpu) {
        let _irq = IrqGuard::new();
        work();
        return;
    }
    let request = CallRequest {
        work,
        done: AtomicBool::new(false),
    };
    let request_ptr = (&raw const request).cast_mut().cast::<()>();
    let slot = &CALL_SLOTS[cpu];
    while slot
        .compare_exchange(
            core::ptr::null_mut(),
            request_ptr,
            Ordering::AcqRel,
            Ordering::Acquire,
        )
        .is_err()
    {
        run_pending_call();
        core::hint::spin_loop();
    }
    let apic_id = percpu::get(cpu).map_or(0, |percpu| percpu.apic_id());
    lapic::send_wake(apic_id);
    while !request.done.load(Ordering::Acquire) {
        run_pending_call();
        core::hint::spin_loop();
    }
}

/// Runs the cross-CPU call waiting for this CPU, if any (the wake IPI
/// handler, and every waiting loop of this module).
fn run_pending_call() {
    let _irq = IrqGuard::new();
    let request = CALL_SLOTS[arch::cpu_id()].swap(core::ptr::null_mut(), Ordering::AcqRel);
    if request.is_null() {
        return;
    }
    // SAFETY: a request in our slot lives on its caller's stack until its
    // `done` is set (the caller spins on it), and we took it out of the
    // slot alone (the swap).
    let request = unsafe { &*request.cast::<CallRequest<'_>>().cast_const() };
    (request.work)();
    request.done.store(true, Ordering::Release);
}
