//! [`Machine`]: the shipped [`Platform`] of every architecture, generic
//! over the architecture's few instructions ([`Arch`]) and over what the
//! kernel adds ([`Kernel`]: its CPU count, how it interrupts another CPU,
//! its hooks). The cross-CPU calls of a several-CPU kernel run through one
//! mailbox per CPU here.

use core::cell::UnsafeCell;
use core::marker::PhantomData;
use core::ptr::NonNull;
use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicU8, AtomicU32, Ordering};

use crate::{AllocTagHooks, AllocTagRef, Platform, PlatformHooks};

/// The CPUs a shipped platform serves at most ([`Kernel::MAX_CPUS`]).
pub const MAX_CPUS: usize = 64;

/// An architecture's part of a shipped platform: the few instructions
/// [`Machine`] needs. Implemented by the types of [`crate::glue::arch`];
/// a kernel on another architecture may implement it too.
///
/// # Safety
///
/// `irq_save` disables this CPU's interrupts and returns the previous
/// state; `irq_restore` restores exactly that state (so the two nest);
/// `cpu_register` returns what the kernel wrote into the architecture's
/// per-CPU register (read only when [`Kernel::MAX_CPUS`] > 1);
/// `frame_pointer` returns the frame pointer register, whose frame record
/// holds the caller's frame pointer at `frame_pointer + NEXT_FRAME_AT` and
/// the return address at `frame_pointer + RETURN_ADDRESS_AT`.
pub unsafe trait Arch: 'static {
    /// Byte offset of the caller's frame pointer from a frame pointer.
    const NEXT_FRAME_AT: isize;
    /// Byte offset of the return address from a frame pointer.
    const RETURN_ADDRESS_AT: isize;
    /// The CPU index the kernel keeps in the per-CPU register.
    fn cpu_register() -> usize;
    /// Disable interrupts; the previous state.
    fn irq_save() -> usize;
    /// Restore a state [`Arch::irq_save`] returned.
    fn irq_restore(state: usize);
    /// A monotonic counter (cycles or timer ticks).
    fn now() -> u64;
    /// The frame pointer register.
    fn frame_pointer() -> usize;
}

/// What a kernel adds to a shipped platform ([`Machine`]): its number of
/// CPUs and, with more than one, how it interrupts another CPU; whether
/// its stacks can be walked by frame pointers; and the optional hooks of
/// [`PlatformHooks`] (stacks, KFENCE) and [`AllocTagHooks`] (allocation
/// profiling), which the platform
/// passes on. [`OneCpu`] is the kernel with one CPU and no hooks.
///
/// A several-CPU kernel with no hooks takes [`Cpus`] instead of writing
/// one. A several-CPU kernel of its own:
///
/// ```ignore
/// struct Smp;
/// // SAFETY: the defaults: no KFENCE pool; no profiling tags.
/// unsafe impl magpie_slab::PlatformHooks for Smp {}
/// unsafe impl magpie_slab::AllocTagHooks for Smp {}
/// // SAFETY: 4 CPUs, each with its index in the per-CPU register before it
/// // allocates; send_ipi interrupts `cpu`, whose handler calls
/// // handle_cross_cpu_calls.
/// unsafe impl magpie_slab::glue::Kernel for Smp {
///     const MAX_CPUS: usize = 4;
///     fn send_ipi(cpu: usize) { clint_msip(cpu).write(1) }
/// }
/// ```
///
/// # Safety
///
/// 1. `MAX_CPUS` is at least 1 and at most [`MAX_CPUS`](self::MAX_CPUS).
///    With more than one, every CPU has its index (`0..MAX_CPUS`) in the
///    architecture's per-CPU register (x86_64: `IA32_TSC_AUX`, low 12
///    bits, as Linux keeps it, read with `rdtscp`, which the CPU must
///    have; riscv64: `tp`; aarch64: `TPIDR_EL1`), or returns it from
///    [`Kernel::cpu_id`], before it runs allocator code, and nothing
///    changes it afterwards. Each CPU calls [`Machine::cpu_online`]
///    before it runs allocator code (and not before it answers cross-CPU
///    calls, promise 2: a call to it waits until it does); a CPU that has
///    not is sent no call (its per-CPU caches are untouched).
/// 2. With more than one CPU, `send_ipi(cpu)` makes CPU `cpu` call
///    [`Machine::handle_cross_cpu_calls`] soon, from an interrupt handler
///    (with its interrupts off), or whenever it next enables them; an
///    interrupt that arrives while `cpu` is already in such a handler is
///    not lost.
/// 3. The kernel does not preempt, migrate or switch threads while
///    allocator code runs, and interrupt handlers that allocate run with
///    interrupts off: the shipped platforms take the in-use-flag hit
///    ([`Platform::LOCAL_TRYLOCK`], the trait's safety contract, promise
///    1). Those handlers run their bodies in
///    [`Machine::handle_interrupt`] (so the allocator knows where it runs:
///    [`Platform::in_interrupt`]).
/// 4. With `FRAME_POINTERS`, the code is built with frame pointers
///    (`-C force-frame-pointers=yes`) and the outermost frame of every
///    stack has a null frame pointer (the entry code zeroes it), so a
///    frame-pointer walk ends inside the stack.
/// 5. The hooks keep [`PlatformHooks`]' contract.
/// 6. With `RESTARTABLE_HITS`, every interrupt handler that can run
///    allocator code (or, with several CPUs, answers cross-CPU calls)
///    first asks [`restart_ip`](crate::restart::restart_ip) about the
///    instruction pointer it interrupted and, if it answers
///    `Some(start)`, writes `start` into the saved frame (the Magpie
///    kernel's `arch::idt::restart_interrupted_hit`), as
///    [`Platform::RESTARTABLE_HITS`] asks. A kernel whose interrupt
///    handlers never allocate or free (blog_os's timer and keyboard
///    handlers), or that takes no interrupts, keeps it with nothing to do.
pub unsafe trait Kernel: PlatformHooks + AllocTagHooks + 'static {
    /// Number of CPUs (`1..=64`). Default 1.
    const MAX_CPUS: usize = 1;
    /// Whether backtraces walk the frame pointers (promise 4). Default
    /// false: records and reports carry no stack.
    const FRAME_POINTERS: bool = false;
    /// Interrupt CPU `cpu` so that it runs its cross-CPU calls (promise
    /// 2), after the caller's earlier stores (the posted call) are
    /// visible to it: a barrier before the device write where the
    /// architecture needs one (aarch64 `dsb ishst`, riscv64 `fence w, o`).
    /// Called only with more than one CPU, for another CPU. Default:
    /// nothing (one CPU).
    fn send_ipi(cpu: usize) {
        let _ = cpu;
    }

    /// Whether the magazine hits are restartable sequences
    /// ([`crate::restart`]: Bershad et al. 1992, Linux's `rseq`) rather
    /// than taking the in-use flag: 3 instructions fewer on each side of
    /// the hit pair (the flag's `sub`, its branch and its release), for
    /// promise 6. Only on x86_64 with magpie-slab's feature `nightly`;
    /// elsewhere, and by default (false), the in-use-flag hit.
    const RESTARTABLE_HITS: bool = false;

    /// This CPU's index (`0..MAX_CPUS`) where the kernel keeps it
    /// elsewhere than the architecture's per-CPU register (promise 1):
    /// e.g. an x86_64 kernel's `gs:`-relative per-CPU block (Linux's
    /// `cpu_number`, one `mov`), on CPUs without `rdtscp` (QEMU's default
    /// `qemu64` CPU under TCG: `rdtscp` raises #UD there; `-cpu max` has
    /// it). Read only with more than one CPU, on every hit: keep it to a
    /// few instructions. Default `None`: the per-CPU register.
    #[inline(always)]
    fn cpu_id() -> Option<usize> {
        None
    }
}

/// The kernel of one CPU with no hooks: the default of every shipped
/// platform (`Heap<glue::Riscv64>` is `Heap<glue::Riscv64<OneCpu>>`).
pub struct OneCpu;

// SAFETY: the defaults: no stacks, no profiling tags, no KFENCE pool.
unsafe impl PlatformHooks for OneCpu {}
// SAFETY: the defaults: no tags.
unsafe impl AllocTagHooks for OneCpu {}
// SAFETY: one CPU (no per-CPU register read, no IPI), no frame-pointer walk.
unsafe impl Kernel for OneCpu {}

/// The kernel of `N` CPUs with no hooks, for a several-CPU kernel that
/// needs nothing else (`Heap<glue::Riscv64Machine<Cpus<4>>>`):
/// `FRAME_POINTERS` as [`Kernel::FRAME_POINTERS`] (default false), the
/// IPI the function each CPU gives [`Machine::cpu_online_with`], which
/// makes [`Kernel`]'s promises for it. A kernel with hooks (allocation
/// profiling, KFENCE) or its CPU index elsewhere writes its own
/// [`Kernel`].
pub struct Cpus<const N: usize, const FRAME_POINTERS: bool = false>;

/// The IPI of [`Cpus`] (a `fn(usize)`), given by [`Machine::cpu_online_with`].
static SEND_IPI: AtomicPtr<()> = AtomicPtr::new(core::ptr::null_mut());

// SAFETY: the defaults: no profiling tags, no KFENCE pool (the stacks are
// Machine's, with FRAME_POINTERS).
unsafe impl<const N: usize, const FRAME_POINTERS: bool> PlatformHooks for Cpus<N, FRAME_POINTERS> {}
// SAFETY: the defaults: no tags.
unsafe impl<const N: usize, const FRAME_POINTERS: bool> AllocTagHooks for Cpus<N, FRAME_POINTERS> {}

// SAFETY: the promises are made by each CPU's unsafe call of
// Machine::cpu_online_with (whose contract they are), before it runs
// allocator code; send_ipi is the function given there.
unsafe impl<const N: usize, const FRAME_POINTERS: bool> Kernel for Cpus<N, FRAME_POINTERS> {
    const MAX_CPUS: usize = N;
    const FRAME_POINTERS: bool = FRAME_POINTERS;

    fn send_ipi(cpu: usize) {
        let send = SEND_IPI.load(Ordering::Acquire);
        assert!(
            !send.is_null(),
            "glue::Cpus: a cross-CPU call before Machine::cpu_online_with"
        );
        // SAFETY: a `fn(usize)` stored by cpu_online_with (never null then).
        let send: fn(usize) = unsafe { core::mem::transmute::<*mut (), fn(usize)>(send) };
        send(cpu);
    }
}

impl<A: Arch, const N: usize, const FRAME_POINTERS: bool> Machine<A, Cpus<N, FRAME_POINTERS>> {
    /// [`Machine::cpu_online`] for a kernel of [`Cpus`], whose IPI is
    /// `send_ipi` (every CPU gives the same): what each CPU calls once,
    /// the boot CPU first, before it runs allocator code and when it
    /// answers cross-CPU calls.
    ///
    /// # Safety
    ///
    /// The kernel keeps [`Kernel`]'s promises 1 to 4 for
    /// `Cpus<N, FRAME_POINTERS>`, with `send_ipi` as its
    /// [`Kernel::send_ipi`]: this CPU's index (`0..N`) is in the
    /// architecture's per-CPU register; `send_ipi(cpu)` makes `cpu` call
    /// [`Machine::handle_cross_cpu_calls`] (after a barrier that makes
    /// the caller's stores visible to it); no preemption inside the
    /// allocator, and handlers that allocate run in
    /// [`Machine::handle_interrupt`]; with `FRAME_POINTERS`, built with
    /// frame pointers and a null one at each stack's entry.
    pub unsafe fn cpu_online_with(send_ipi: fn(usize)) {
        SEND_IPI.store(send_ipi as *mut (), Ordering::Release);
        Self::cpu_online();
    }
}

/// A shipped [`Platform`]: the architecture `A`'s instructions and the
/// kernel `K`'s CPU count, IPI and hooks. Named per architecture
/// (`glue::X86_64`, `Riscv64`, `Riscv64Machine`, `Aarch64`).
///
/// - **The hit** takes the in-use flag ([`Platform::LOCAL_TRYLOCK`]): no
///   interrupt masking on the magazine hits; the slow paths save and
///   restore interrupts.
/// - **CPU id**: 0 with one CPU; else the per-CPU register (promise 1 of
///   [`Kernel`]).
/// - **Cross-CPU calls**: a mailbox per CPU and [`Kernel::send_ipi`]; the
///   target runs the call from [`Machine::handle_cross_cpu_calls`], a
///   waiting caller runs the calls posted to its own CPU meanwhile (so two
///   CPUs calling each other with interrupts off both finish).
/// - **Clock**: the architecture's counter (`rdtsc`, `rdtime`,
///   `CNTVCT_EL0`).
/// - **Interrupt context**: [`Platform::in_interrupt`] inside
///   [`Machine::handle_interrupt`], which a kernel's handlers that
///   allocate run their bodies in.
/// - **Backtraces**: a frame-pointer walk with [`Kernel::FRAME_POINTERS`].
/// - **Context**: the kernel's ([`PlatformHooks::context`]), else `cpuN`.
pub struct Machine<A, K = OneCpu>(PhantomData<fn() -> (A, K)>);

impl<A: Arch, K: Kernel> Machine<A, K> {
    /// Mark this CPU online: from now on the cross-CPU calls of the
    /// allocator (a reap draining every CPU's magazines, statistics,
    /// `destroy`) reach it by [`Kernel::send_ipi`] and wait for it to run
    /// them. Each CPU calls it once, the boot CPU too, after its index is
    /// in the per-CPU register and before it runs allocator code, when it
    /// answers calls (interrupts on, or polling
    /// [`Machine::handle_cross_cpu_calls`]): a CPU that waits with
    /// interrupts off for something else must not be online yet. Until
    /// then a call for it runs on the calling CPU (the CPU has touched no
    /// per-CPU cache), and this waits for such a call to finish. No-op
    /// with one CPU.
    pub fn cpu_online() {
        if K::MAX_CPUS > 1 {
            let mailbox = &MAILBOXES[Self::cpu_id()];
            mailbox.online.store(true, Ordering::SeqCst);
            // A call that saw this CPU offline holds its mailbox CLAIMED
            // while it runs here-less; one that claims after the store
            // sees it online (both sequentially consistent) and posts.
            while mailbox.state.load(Ordering::SeqCst) == CLAIMED {
                core::hint::spin_loop();
            }
        }
    }

    /// Whether CPU `cpu` called [`Machine::cpu_online`] (always true with
    /// one CPU).
    pub fn is_online(cpu: usize) -> bool {
        K::MAX_CPUS == 1
            || MAILBOXES
                .get(cpu)
                .is_some_and(|mailbox| mailbox.online.load(Ordering::SeqCst))
    }

    /// Run the cross-CPU call posted to this CPU, if any, with interrupts
    /// off (saved and restored here: an IPI taken meanwhile must not run
    /// the same call again): what the kernel's IPI handler calls, and
    /// what a several-CPU kernel's idle or waiting loops may call. Cheap
    /// when nothing is posted (one load).
    pub fn handle_cross_cpu_calls() {
        if K::MAX_CPUS > 1 {
            let state = A::irq_save();
            MAILBOXES[Self::cpu_id()].run_posted();
            A::irq_restore(state);
        }
    }
}

impl<A: Arch, K: Kernel> Machine<A, K> {
    /// Run `handler`, an interrupt handler's body that may allocate or
    /// free, as interrupt context ([`Platform::in_interrupt`] true on this
    /// CPU meanwhile: the allocator then only tries the locks whose
    /// holders run with interrupts on, and makes no cross-CPU call). A
    /// kernel whose handlers allocate wraps them in it; nesting is
    /// counted. Call it with interrupts off, on the handler's CPU.
    pub fn handle_interrupt<R>(handler: impl FnOnce() -> R) -> R {
        let depth = &IRQ_DEPTH[Self::cpu_id()];
        depth.fetch_add(1, Ordering::Relaxed);
        let result = handler();
        depth.fetch_sub(1, Ordering::Relaxed);
        result
    }
}

/// Interrupt handlers running on each CPU ([`Machine::handle_interrupt`]);
/// each CPU changes only its own.
static IRQ_DEPTH: [AtomicU32; MAX_CPUS] = [const { AtomicU32::new(0) }; MAX_CPUS];

/// A CPU's mailbox: one cross-CPU call at a time, and whether the CPU is
/// online. Every access to `state` and `online` is sequentially
/// consistent (the online handshake of [`Machine::cpu_online`] needs it;
/// cross-CPU calls are slow paths).
struct Mailbox {
    /// [`IDLE`], [`CLAIMED`], [`POSTED`] or [`DONE`].
    state: AtomicU8,
    /// Set once by the CPU itself ([`Machine::cpu_online`]).
    online: AtomicBool,
    /// The call, written by the claiming sender, read by the owner CPU
    /// while [`POSTED`].
    work: UnsafeCell<Option<&'static (dyn Fn() + Sync)>>,
}

/// No call.
const IDLE: u8 = 0;
/// A sender writes its call.
const CLAIMED: u8 = 1;
/// The call waits for the owner CPU.
const POSTED: u8 = 2;
/// The owner ran it; the sender empties the mailbox.
const DONE: u8 = 3;

// SAFETY: `work` is written only by the sender that moved `state` from
// IDLE to CLAIMED and read only by the owner CPU after it saw POSTED
// (release/acquire), until it stores DONE.
unsafe impl Sync for Mailbox {}

impl Mailbox {
    const fn new() -> Self {
        Mailbox {
            state: AtomicU8::new(IDLE),
            online: AtomicBool::new(false),
            work: UnsafeCell::new(None),
        }
    }

    /// On the owner CPU, interrupts off: run the posted call.
    fn run_posted(&self) {
        if self.state.load(Ordering::SeqCst) == POSTED {
            // SAFETY: POSTED: the sender wrote `work` before its release
            // store and waits for DONE; only this CPU reads it.
            if let Some(work) = unsafe { *self.work.get() } {
                work();
            }
            self.state.store(DONE, Ordering::SeqCst);
        }
    }
}

static MAILBOXES: [Mailbox; MAX_CPUS] = [const { Mailbox::new() }; MAX_CPUS];

impl<A: Arch, K: Kernel> Machine<A, K> {
    /// Post `work` to CPU `cpu` (another CPU), interrupt it and wait until
    /// it ran, running the calls posted to this CPU meanwhile; or, `cpu`
    /// not online, run `work` here, its mailbox held so that it comes
    /// online only after.
    fn call_on(cpu: usize, work: &(dyn Fn() + Sync)) {
        let here = &MAILBOXES[Self::cpu_id()];
        let there = &MAILBOXES[cpu];
        // Calls to a CPU not online run on their callers, so it must not
        // run allocator code (Kernel promise 1): stop one that does here.
        assert!(
            here.online.load(Ordering::SeqCst),
            "magpie_slab::glue: CPU {} makes a cross-CPU call before Machine::cpu_online",
            Self::cpu_id()
        );
        let poll = || {
            let state = A::irq_save();
            here.run_posted();
            A::irq_restore(state);
            core::hint::spin_loop();
        };
        while there
            .state
            .compare_exchange(IDLE, CLAIMED, Ordering::SeqCst, Ordering::Relaxed)
            .is_err()
        {
            poll();
        }
        if !there.online.load(Ordering::SeqCst) {
            // Not online: it runs no allocator code, and comes online only
            // once the mailbox is released (Machine::cpu_online). Its
            // per-CPU caches are ours meanwhile.
            let state = A::irq_save();
            work();
            A::irq_restore(state);
            there.state.store(IDLE, Ordering::SeqCst);
            return;
        }
        // SAFETY: only the lifetime is extended: the mailbox holds `work`
        // until the owner stores DONE, and this function returns only after
        // that (below), so `work` outlives every use.
        let work: &'static (dyn Fn() + Sync) = unsafe { core::mem::transmute(work) };
        // SAFETY: CLAIMED by us: nobody else reads or writes `work` now.
        unsafe { *there.work.get() = Some(work) };
        there.state.store(POSTED, Ordering::SeqCst);
        K::send_ipi(cpu);
        while there.state.load(Ordering::SeqCst) != DONE {
            poll();
        }
        // SAFETY: DONE: the owner is finished with `work`; still ours.
        unsafe { *there.work.get() = None };
        there.state.store(IDLE, Ordering::SeqCst);
    }

    /// Fill `frames` from the caller's frame pointer (never inlined: its
    /// own frame record is the first).
    #[inline(never)]
    fn walk(frames: &mut [usize]) -> usize {
        /// A frame further than this above the previous one ends the walk.
        const MAX_FRAME_BYTES: usize = 1 << 20;
        let mut frame_pointer = A::frame_pointer();
        let mut depth = 0;
        while depth < frames.len() && frame_pointer != 0 && frame_pointer.is_multiple_of(8) {
            let at = |offset: isize| frame_pointer.wrapping_add_signed(offset) as *const usize;
            // SAFETY: a frame record of the current stack: every frame
            // pointer followed is non-null, aligned and above the previous
            // one by less than MAX_FRAME_BYTES, and the outermost is null
            // (Kernel promise 4, FRAME_POINTERS checked by our caller).
            let (next, return_address) = unsafe {
                (
                    at(A::NEXT_FRAME_AT).read_volatile(),
                    at(A::RETURN_ADDRESS_AT).read_volatile(),
                )
            };
            if return_address == 0 {
                break;
            }
            frames[depth] = return_address;
            depth += 1;
            if next <= frame_pointer || next - frame_pointer > MAX_FRAME_BYTES {
                break;
            }
            frame_pointer = next;
        }
        depth
    }
}

// SAFETY: `cpu_id` is 0 with one CPU and the per-CPU register's index
// or Kernel::cpu_id's (below MAX_CPUS, Kernel promise 1) with several; `A::irq_save` disables
// interrupts and nests (Arch's contract), and nothing but this CPU's
// interrupt handlers runs allocator code under its id (Kernel promise 3:
// no preemption or migration, the LOCAL_TRYLOCK part too); `cpu_offset` is
// the default; `cross_cpu_call` runs `work` on CPU `cpu` with its interrupts off
// (from its IPI handler, or its own waiting loop with interrupts saved and
// off), exclusively with its interrupts-off sections, and returns after it;
// or, `cpu` not online (it runs no allocator code, Kernel promise 1, and
// Machine::cpu_online waits while the call holds its mailbox), here with
// interrupts off; with RESTARTABLE_HITS, the kernel's handlers restart an
// interrupted hit first (Kernel promise 6, the trait's promise 4).
unsafe impl<A: Arch, K: Kernel> Platform for Machine<A, K> {
    const LOCAL_TRYLOCK: bool = true;
    // Kernel promise 6 is the trait's promise 4.
    const RESTARTABLE_HITS: bool = K::RESTARTABLE_HITS;

    #[inline(always)]
    fn max_cpus() -> usize {
        const { assert!(K::MAX_CPUS >= 1 && K::MAX_CPUS <= MAX_CPUS) };
        K::MAX_CPUS
    }

    #[inline(always)]
    fn cpu_id() -> usize {
        if K::MAX_CPUS == 1 {
            0
        } else {
            K::cpu_id().unwrap_or_else(A::cpu_register)
        }
    }

    #[inline(always)]
    fn irq_save() -> usize {
        A::irq_save()
    }

    #[inline(always)]
    fn irq_restore(state: usize) {
        A::irq_restore(state);
    }

    fn cross_cpu_call(cpu: usize, work: &(dyn Fn() + Sync)) {
        if K::MAX_CPUS == 1 || cpu == Self::cpu_id() {
            let state = A::irq_save();
            work();
            A::irq_restore(state);
        } else {
            Self::call_on(cpu, work);
        }
    }

    /// Inside [`Machine::handle_interrupt`] on this CPU.
    #[inline]
    fn in_interrupt() -> bool {
        IRQ_DEPTH[Self::cpu_id()].load(Ordering::Relaxed) != 0
    }

    #[inline(always)]
    fn now() -> u64 {
        A::now()
    }
}

// SAFETY: every hook but the stacks and the context is the kernel's
// (which keeps PlatformHooks' contract, Kernel promise 5); the walk reads
// only frame records (Kernel promise 4).
unsafe impl<A: Arch, K: Kernel> PlatformHooks for Machine<A, K> {
    fn backtrace(frames: &mut [usize]) -> usize {
        if K::FRAME_POINTERS {
            Self::walk(frames)
        } else {
            K::backtrace(frames)
        }
    }

    fn context(buf: &mut [u8; 32]) -> usize {
        let written = K::context(buf);
        if written != 0 {
            return written;
        }
        let cpu = Self::cpu_id();
        buf[..3].copy_from_slice(b"cpu");
        let mut len = 3;
        if cpu >= 10 {
            buf[len] = b'0' + (cpu / 10 % 10) as u8;
            len += 1;
        }
        buf[len] = b'0' + (cpu % 10) as u8;
        len + 1
    }

    #[inline(always)]
    fn caller_frames(frames: &mut [usize]) -> usize {
        K::caller_frames(frames)
    }

    #[cfg(feature = "kfence")]
    fn kfence_pool(nr_pages: usize) -> Option<NonNull<u8>> {
        K::kfence_pool(nr_pages)
    }

    #[cfg(feature = "kfence")]
    fn kfence_protect(page: usize, protect: bool) -> bool {
        K::kfence_protect(page, protect)
    }

    #[cfg(feature = "kfence")]
    #[inline(always)]
    fn kfence_clock_ns() -> u64 {
        K::kfence_clock_ns()
    }
}

// SAFETY: `charge` and `uncharge` accept every token that `token` and
// `current_token` return (the defaults, or as the hooks below say).
unsafe impl<A: Arch, K: Kernel> AllocTagHooks for Machine<A, K> {
    #[inline(always)]
    fn current() -> Option<AllocTagRef> {
        K::current()
    }

    #[inline(always)]
    fn add(tag: AllocTagRef, ptr: NonNull<u8>, bytes: usize) {
        K::add(tag, ptr, bytes);
    }

    #[inline(always)]
    fn sub(tag: AllocTagRef, ptr: NonNull<u8>, bytes: usize) {
        K::sub(tag, ptr, bytes);
    }

    #[inline(always)]
    fn token(tag: AllocTagRef) -> Option<AllocTagRef> {
        K::token(tag)
    }

    #[inline(always)]
    fn current_token() -> Option<AllocTagRef> {
        K::current_token()
    }

    #[inline(always)]
    unsafe fn charge(token: AllocTagRef, ptr: NonNull<u8>, bytes: usize) {
        // SAFETY: per our caller (a token of the kernel's token hooks).
        unsafe { K::charge(token, ptr, bytes) }
    }

    #[inline(always)]
    unsafe fn uncharge(token: AllocTagRef, ptr: NonNull<u8>, bytes: usize) {
        // SAFETY: per our caller (the token this object was charged with).
        unsafe { K::uncharge(token, ptr, bytes) }
    }

    #[inline(always)]
    fn on_charge(token: AllocTagRef, ptr: NonNull<u8>, bytes: usize) {
        K::on_charge(token, ptr, bytes);
    }

    #[inline(always)]
    fn on_uncharge(token: AllocTagRef, ptr: NonNull<u8>, bytes: usize) {
        K::on_uncharge(token, ptr, bytes);
    }
}

/// The cross-CPU calls of a several-CPU [`Machine`], with threads as CPUs
/// (a thread-local CPU index, "interrupts" that need nothing).
#[cfg(test)]
mod tests {
    extern crate std;

    use core::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::cell::Cell;
    use std::sync::Barrier;
    use std::vec::Vec;

    use super::{Arch, Kernel, Machine};
    use crate::{AllocTagHooks, Platform, PlatformHooks};

    std::thread_local! {
        static CPU: Cell<usize> = const { Cell::new(0) };
    }

    struct Threads;
    // SAFETY: a test stand-in: the CPU index is the thread's, "interrupts"
    // are nothing (each thread runs only its own code), no frame walk.
    unsafe impl Arch for Threads {
        const NEXT_FRAME_AT: isize = 0;
        const RETURN_ADDRESS_AT: isize = 8;
        fn cpu_register() -> usize {
            CPU.with(Cell::get)
        }
        fn irq_save() -> usize {
            0
        }
        fn irq_restore(_state: usize) {}
        fn now() -> u64 {
            0
        }
        fn frame_pointer() -> usize {
            0
        }
    }

    /// IPIs sent, per CPU.
    static IPIS: [AtomicUsize; 3] = [const { AtomicUsize::new(0) }; 3];

    struct ThreeCpus;
    // SAFETY: the defaults.
    unsafe impl PlatformHooks for ThreeCpus {}
    // SAFETY: the defaults: no tags.
    unsafe impl AllocTagHooks for ThreeCpus {}
    // SAFETY: 3 CPUs (threads with their index set first); the "IPI" is
    // counted and the target threads poll handle_cross_cpu_calls.
    unsafe impl Kernel for ThreeCpus {
        const MAX_CPUS: usize = 3;
        fn send_ipi(cpu: usize) {
            IPIS[cpu].fetch_add(1, Ordering::Relaxed);
        }
    }

    type P = Machine<Threads, ThreeCpus>;

    /// Every call runs on its target CPU, once, and returns after it ran;
    /// a call to the caller's own CPU runs at once; CPUs calling each
    /// other at the same time all finish (each runs the calls posted to
    /// it while it waits); the context names the CPU.
    #[test]
    fn cross_cpu_calls_run_on_their_cpu() {
        const CALLS: usize = 90;
        let stop = AtomicBool::new(false);
        let ran: [AtomicUsize; 3] = [const { AtomicUsize::new(0) }; 3];
        let start = Barrier::new(3);
        std::thread::scope(|scope| {
            let workers: Vec<_> = (0..3)
                .map(|cpu| {
                    let (stop, ran, start) = (&stop, &ran, &start);
                    scope.spawn(move || {
                        CPU.with(|index| index.set(cpu));
                        P::cpu_online();
                        assert_eq!(P::cpu_id(), cpu);
                        let mut buf = [0; 32];
                        let len = P::context(&mut buf);
                        assert_eq!(&buf[..len], std::format!("cpu{cpu}").as_bytes());
                        assert!(!P::in_interrupt());
                        assert!(P::handle_interrupt(|| P::handle_interrupt(P::in_interrupt)));
                        assert!(!P::in_interrupt(), "nesting counted back to thread context");
                        start.wait();
                        // CPUs 0 and 1 call each other and CPU 2; CPU 2
                        // only answers.
                        if cpu < 2 {
                            for call in 0..CALLS {
                                let target = [1 - cpu, 2, cpu][call % 3];
                                let done = AtomicBool::new(false);
                                P::cross_cpu_call(target, &|| {
                                    assert_eq!(P::cpu_id(), target, "runs on its CPU");
                                    ran[target].fetch_add(1, Ordering::Relaxed);
                                    done.store(true, Ordering::Relaxed);
                                });
                                assert!(done.load(Ordering::Relaxed), "returns after it ran");
                            }
                        }
                        while !stop.load(Ordering::Acquire) {
                            P::handle_cross_cpu_calls();
                            std::thread::yield_now();
                        }
                    })
                })
                .collect();
            // Stop the answering loops once both callers are through.
            while ran
                .iter()
                .map(|count| count.load(Ordering::Relaxed))
                .sum::<usize>()
                < 2 * CALLS
            {
                std::thread::yield_now();
            }
            stop.store(true, Ordering::Release);
            for worker in workers {
                worker.join().unwrap();
            }
        });
        let ran = ran.each_ref().map(|count| count.load(Ordering::Relaxed));
        let nr_of = |kind: usize| (0..CALLS).filter(|call| call % 3 == kind).count();
        assert_eq!(ran.iter().sum::<usize>(), 2 * CALLS);
        assert_eq!(ran[2], 2 * nr_of(1), "{ran:?}");
        // An IPI for every call to another CPU, none for a CPU's own.
        let ipis = IPIS.each_ref().map(|count| count.load(Ordering::Relaxed));
        assert_eq!(ipis, [nr_of(0), nr_of(0), 2 * nr_of(1)]);
    }

    /// IPIs sent by [`SixCpus`], per CPU.
    static SIX_IPIS: [AtomicUsize; 6] = [const { AtomicUsize::new(0) }; 6];

    /// CPUs 3 to 5 of six (the mailboxes are shared by every `Machine`:
    /// the test above has 0 to 2).
    struct SixCpus;
    // SAFETY: the defaults.
    unsafe impl PlatformHooks for SixCpus {}
    // SAFETY: the defaults: no tags.
    unsafe impl AllocTagHooks for SixCpus {}
    // SAFETY: as ThreeCpus.
    unsafe impl Kernel for SixCpus {
        const MAX_CPUS: usize = 6;
        fn send_ipi(cpu: usize) {
            SIX_IPIS[cpu].fetch_add(1, Ordering::Relaxed);
        }
    }

    type Six = Machine<Threads, SixCpus>;

    /// A call to a CPU that is not online runs on the caller, with no IPI
    /// (the riscv64 machine-mode hang: a reap waited for CPUs spinning,
    /// interrupts off, before their start); the CPU coming online waits
    /// for such a call to finish; once online, its calls are sent to it;
    /// a CPU not online that makes a call is stopped.
    #[test]
    fn calls_to_a_cpu_not_online_run_on_the_caller() {
        let running = AtomicBool::new(false);
        let finished = AtomicBool::new(false);
        let stop = AtomicBool::new(false);
        let ran_on = AtomicUsize::new(usize::MAX);
        std::thread::scope(|scope| {
            let late = scope.spawn(|| {
                CPU.with(|index| index.set(4));
                while !running.load(Ordering::Acquire) {
                    std::thread::yield_now();
                }
                Six::cpu_online();
                assert!(
                    finished.load(Ordering::Acquire),
                    "online only after the call run for it"
                );
                while !stop.load(Ordering::Acquire) {
                    Six::handle_cross_cpu_calls();
                    std::thread::yield_now();
                }
            });
            CPU.with(|index| index.set(3));
            Six::cpu_online();
            assert!(Six::is_online(3) && !Six::is_online(4) && !Six::is_online(64));
            Six::cross_cpu_call(4, &|| {
                ran_on.store(Six::cpu_id(), Ordering::Relaxed);
                running.store(true, Ordering::Release);
                std::thread::sleep(std::time::Duration::from_millis(50));
                finished.store(true, Ordering::Release);
            });
            assert_eq!(ran_on.load(Ordering::Relaxed), 3, "ran on the caller");
            assert_eq!(SIX_IPIS[4].load(Ordering::Relaxed), 0, "no IPI");
            while !Six::is_online(4) {
                std::thread::yield_now();
            }
            Six::cross_cpu_call(4, &|| ran_on.store(Six::cpu_id(), Ordering::Relaxed));
            assert_eq!(
                ran_on.load(Ordering::Relaxed),
                4,
                "ran on CPU 4 once online"
            );
            assert_eq!(SIX_IPIS[4].load(Ordering::Relaxed), 1);
            stop.store(true, Ordering::Release);
            late.join().unwrap();
        });
        let offline_caller = std::thread::spawn(|| {
            CPU.with(|index| index.set(5));
            Six::cross_cpu_call(3, &|| {});
        })
        .join();
        assert!(
            offline_caller.is_err(),
            "a call from a CPU not online panics"
        );
    }
}
