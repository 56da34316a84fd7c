//! What the allocator needs from the machine ([`Platform`]) and from memory
//! ([`PageSource`]).

use core::ptr::NonNull;

use crate::{AllocError, AllocTagRef};

/// Size of a page in bytes. Every [`PageSource`] hands out whole pages of
/// this size, aligned to it.
pub const PAGE_SIZE: usize = 4096;
/// `log2(PAGE_SIZE)`.
pub(crate) const PAGE_SHIFT: u32 = 12;

const _: () = assert!(1 << PAGE_SHIFT == PAGE_SIZE);

/// Bytes of one CPU's slot in a per-CPU array (one cache line): the unit
/// of [`Platform::cpu_offset`].
pub const CPU_SLOT_BYTES: usize = 64;

/// The machine: CPU id and count, the per-CPU offset, interrupt
/// save/restore (or the in-use flag), cross-CPU calls, a clock. Five
/// functions to write (`max_cpus`, `cpu_id`, `irq_save`, `irq_restore`,
/// `now`); the rest have defaults right for one CPU. The optional hooks
/// are two supertraits whose defaults need one empty `impl` each:
/// [`PlatformHooks`] (stacks and context, KFENCE's pool) and
/// [`AllocTagHooks`] (allocation profiling).
///
/// All methods are associated functions (no `self`) so calls monomorphize
/// and inline into the allocator's fast paths. The kernel implements this
/// once; host tests implement it with thread-locals and counters.
///
/// # Safety
///
/// The magazine-hit paths take no lock and no atomic read-modify-write:
/// a CPU's per-CPU caches are owned by that CPU, each behind an in-use
/// flag taken with one non-atomic read-modify-write on x86-64, a plain
/// load and store elsewhere (Linux's `local_trylock`, as SLUB's sheaves
/// use it). An interrupt handler that finds the flag held
/// has interrupted its holder on the same CPU and takes the locked slow
/// path; every lock that path can take is taken with interrupts off. The
/// allocator is sound only if the implementation keeps these promises:
///
/// 1. [`cpu_id`](Platform::cpu_id) is below [`max_cpus`](Platform::max_cpus),
///    and between [`irq_save`](Platform::irq_save) and the matching
///    [`irq_restore`](Platform::irq_restore) nothing else runs allocator
///    code under the same id: no interrupt handler on this CPU, no other
///    thread (a kernel: ids are unique and nothing migrates or preempts
///    with interrupts off; host tests: one thread per id, or a per-id lock
///    taken by `irq_save`). `irq_save`/`irq_restore` nest.
///
///    With [`LOCAL_TRYLOCK`](Platform::LOCAL_TRYLOCK) true, also with
///    interrupts on: the only code that runs allocator code under this
///    CPU's id besides the running code is this CPU's interrupt handlers,
///    and each runs to completion before the code it interrupted resumes
///    (no preemption, no migration, no thread switch while allocator code
///    runs: a kernel whose tasks are not preempted in kernel mode). An
///    interrupt handler that allocates or frees runs with interrupts off
///    (as x86 interrupt gates leave them), or at least does not enable
///    them while the allocator runs in it.
/// 2. [`cpu_offset`](Platform::cpu_offset) is `cpu_id() * CPU_SLOT_BYTES`.
/// 3. [`cross_cpu_call`](Platform::cross_cpu_call)`(cpu, work)` runs
///    `work` to completion, exclusively with CPU `cpu`'s interrupts-off
///    sections (as a kernel's IPI handler on that CPU would), and returns
///    only after it has finished.
/// 4. With [`RESTARTABLE_HITS`](Platform::RESTARTABLE_HITS) true: promise
///    1's interrupts-on part holds (no preemption, no migration while
///    allocator code runs), and every interrupt handler that can run
///    allocator code or a cross-CPU call's `work` first asks
///    [`restart_ip`](crate::restart::restart_ip) about the interrupted
///    instruction pointer and, if it answers `Some(start)`, returns to
///    `start` instead (writes it into the saved frame). Exception handlers
///    that run no allocator code need not (and single-stepping must not).
pub unsafe trait Platform: PlatformHooks + AllocTagHooks + 'static {
    /// Whether the magazine hits may run with interrupts on, owning this
    /// CPU's per-CPU cache by its in-use flag alone (promise 1 of the
    /// trait's safety contract, interrupts-on part): no `pushf; cli …
    /// popf` on the hit. A kernel without preemption sets it. False (the
    /// default): the hits disable interrupts instead
    /// ([`irq_save`](Platform::irq_save) … `irq_restore`, the flag left
    /// alone), for platforms where other threads share a CPU id (host
    /// tests emulating interrupts with a per-id lock) or that preempt, and
    /// for those without interrupts (whose `irq_save` is free).
    const LOCAL_TRYLOCK: bool = false;

    /// Whether the plain magazine hits are restartable sequences
    /// ([`crate::restart`]: no in-use flag, no interrupt-off section; one
    /// `asm!` block ending in a single committing store), on x86-64 ELF
    /// targets, bare metal and Linux, with feature `nightly` (other
    /// targets, stable builds, Miri and the loom models ignore it). Every other access to
    /// a per-CPU cache with interrupts on then disables interrupts. False
    /// (the default): the hits as [`LOCAL_TRYLOCK`](Platform::LOCAL_TRYLOCK)
    /// says.
    ///
    /// True only if the platform keeps promise 4 of the trait's safety
    /// contract: it moves an interrupted instruction pointer as
    /// [`restart_ip`](crate::restart::restart_ip) says. The Magpie kernel
    /// sets it (its timer and IPI handlers call `restart_ip` first): the
    /// kernel's hit pair is 6 instructions shorter than with the flag.
    const RESTARTABLE_HITS: bool = false;

    /// Number of CPUs. CPU ids are `0..max_cpus()`. Read once by
    /// [`Kmem::init`](crate::Kmem::init); per-CPU arrays are
    /// sized by it. A value of 0 is treated as 1.
    fn max_cpus() -> usize;
    /// Id of the CPU running the caller, in `0..max_cpus()` (see the
    /// trait's safety contract).
    fn cpu_id() -> usize;
    /// `cpu_id() * CPU_SLOT_BYTES`: the byte offset of this CPU's slot in
    /// a per-CPU array. The magazine hits read it once per operation; a
    /// kernel keeps it precomputed in its per-CPU area and reads it in one
    /// instruction (`mov rax, gs:[offset]`). The default multiplies.
    #[inline(always)]
    fn cpu_offset() -> usize {
        Self::cpu_id() * CPU_SLOT_BYTES
    }
    /// Disable interrupts on this CPU and return the previous state, to be
    /// handed to [`Platform::irq_restore`]. The allocator calls these
    /// through [`IrqGuard`](crate::IrqGuard).
    fn irq_save() -> usize;
    /// Restore the interrupt state returned by [`Platform::irq_save`].
    fn irq_restore(state: usize);
    /// Run `work` on CPU `cpu` (in `0..max_cpus()`) with its interrupts
    /// off, and return when it has finished: how `reap`, `destroy`,
    /// statistics readers and magazine resizing reach another CPU's
    /// magazines (Linux's `flush_all` does the same with
    /// `on_each_cpu_cond`). `work` takes no lock, allocates nothing and
    /// does not call back into the platform.
    ///
    /// The allocator calls this with no lock of its own held and with
    /// interrupts enabled (or as the platform allows: a kernel whose CPUs
    /// run with interrupts off must poll for calls while it waits).
    ///
    /// A kernel sends an IPI and waits for the handler to run `work`; host
    /// tests take the target CPU's emulated interrupt lock. The default
    /// runs `work` on the calling CPU with interrupts off: correct when
    /// `max_cpus()` is 1 (then `cpu` is this CPU), or when CPU `cpu` runs
    /// no allocator code meanwhile (a host benchmark reaping after its
    /// threads joined). Anything else must override it.
    fn cross_cpu_call(cpu: usize, work: &(dyn Fn() + Sync)) {
        let _ = cpu;
        let state = Self::irq_save();
        work();
        Self::irq_restore(state);
    }
    /// Whether the caller runs in an interrupt handler (kernel: a device
    /// interrupt's handler between its entry and exit). Such a caller
    /// makes no [`cross_cpu_call`](Platform::cross_cpu_call): two CPUs'
    /// handlers each waiting for the other could deadlock. Then a free
    /// whose object holds the free key is refused as a double free
    /// without the confirming search of every CPU's magazines, and a page
    /// source running dry does not reap. The default is `false`: a
    /// platform whose interrupt handlers never allocate.
    #[inline(always)]
    fn in_interrupt() -> bool {
        false
    }
    /// Monotonic timestamp (kernel: TSC cycles; host tests: a counter).
    /// Only stored in trace records, never interpreted.
    fn now() -> u64;
}

/// The optional hooks: stacks and context strings, KFENCE's pool
/// (allocation profiling's are [`AllocTagHooks`]). Every one has a default that turns its
/// feature's use of it off, so a platform that needs none writes
///
/// ```ignore
/// // SAFETY: the defaults: no stacks, no KFENCE pool.
/// unsafe impl magpie_slab::PlatformHooks for MyPlatform {}
/// ```
///
/// A supertrait of [`Platform`] (the allocator calls the hooks as
/// `P::backtrace()` …), kept apart so that the machine contract stays
/// short.
///
/// # Safety
///
/// The allocator trusts what the hooks return: `kfence_pool`
/// is `nr_pages` mapped, writable pages used by nothing else and outside
/// every page source's span, and `kfence_protect`
/// really maps and unmaps them. The defaults keep it.
pub unsafe trait PlatformHooks {
    // ---- Stacks and context: audit records (debug flags), KFENCE
    // reports, trace-table records, kmemtrace call sites.

    /// Fill `frames` with return addresses of the caller's stack (a
    /// frame-pointer walk), skipping allocator-internal frames as best it
    /// can; return how many were written (at most `frames.len()`).
    /// The default writes none: records and reports then carry no stack.
    fn backtrace(frames: &mut [usize]) -> usize {
        let _ = frames;
        0
    }
    /// Short description of the current context, e.g. `"cpu0 shell"` or
    /// `"irq 33"`. Copy at most 31 bytes of UTF-8 into `buf` and return
    /// the number of bytes written.
    /// The default writes nothing.
    fn context(buf: &mut [u8; 32]) -> usize {
        let _ = buf;
        0
    }

    /// kmemtrace: fill `frames` with the return addresses of the code
    /// that called into the allocator, innermost first: `frames[0]` is the
    /// call site (the first frame outside the allocator), then its callers.
    /// Return how many were written. Called on every recorded event with
    /// a one-element slice (stacks off), so keep it cheap: a frame-pointer
    /// walk that skips the allocator's own text (a kernel can place that
    /// text in one linker range). The default records no call site.
    #[inline(always)]
    fn caller_frames(frames: &mut [usize]) -> usize {
        let _ = frames;
        0
    }

    // ---- KFENCE (`crate::kfence`): sampled guarded allocations. The
    // defaults disable it, so a platform that maps no pages needs nothing.

    #[cfg(feature = "kfence")]
    /// Memory for the KFENCE pool: `nr_pages` contiguous pages, mapped
    /// with 4 KiB pages that [`PlatformHooks::kfence_protect`] can unmap one by
    /// one, outside every page source's span (the page map must not know
    /// them). Asked once, by [`Kfence::init`](crate::kfence::Kfence::init).
    /// The default is `None`: no KFENCE.
    fn kfence_pool(nr_pages: usize) -> Option<NonNull<u8>> {
        let _ = nr_pages;
        None
    }

    #[cfg(feature = "kfence")]
    /// Unmap (`protect`) or map back the pool page at `page` (page-aligned,
    /// from [`PlatformHooks::kfence_pool`]); return whether it worked. Called
    /// with interrupts off, from a fault handler too: no allocation, no
    /// lock a fault could find held. The default does nothing and says no.
    fn kfence_protect(page: usize, protect: bool) -> bool {
        let _ = (page, protect);
        false
    }

    #[cfg(feature = "kfence")]
    /// Monotonic time in nanoseconds, for the sample interval (called on
    /// the magazine-miss path: keep it cheap). The default is 0: samples
    /// are taken only when forced.
    #[inline(always)]
    fn kfence_clock_ns() -> u64 {
        0
    }
}

/// Allocation profiling's hooks (feature `alloc-profiling`; the
/// allocator never calls them without it): which tag an allocation is
/// charged to, and the charge and uncharge of a tag's counters. Every one
/// has a default that turns profiling's use of it off, so a platform
/// without profiling writes
///
/// ```ignore
/// // SAFETY: the defaults: no tags.
/// unsafe impl magpie_slab::AllocTagHooks for MyPlatform {}
/// ```
///
/// A platform with a per-CPU counter table (`magpie-codetag`'s
/// `AllocTagCounters`) writes [`current`](AllocTagHooks::current),
/// [`add`](AllocTagHooks::add) and [`sub`](AllocTagHooks::sub); one that
/// checks a tag once and charges by offset writes the token hooks too
/// ([`token`](AllocTagHooks::token), [`charge`](AllocTagHooks::charge),
/// [`uncharge`](AllocTagHooks::uncharge)). A supertrait of [`Platform`]
/// (the allocator calls `P::current()` …).
///
/// # Safety
///
/// The allocator trusts the tokens: one from
/// [`token`](AllocTagHooks::token) or
/// [`current_token`](AllocTagHooks::current_token) is one that
/// [`charge`](AllocTagHooks::charge) and
/// [`uncharge`](AllocTagHooks::uncharge) accept. The defaults keep it.
pub unsafe trait AllocTagHooks {
    /// The allocation tag reference to charge an allocation
    /// made now by a caller that named none (`alloc`, `kmalloc`, the
    /// `GlobalAlloc` and `Allocator` shims). Return `None` to charge
    /// nothing (the object will never be uncharged either). A kernel
    /// returns its per-CPU "current scope" tag, or its catch-all "untagged"
    /// tag: one per-CPU load. The default is `None`: profiling off. Asked
    /// only while profiling is switched on in the allocator
    /// ([`AllocProfiling::set_enabled`](crate::AllocProfiling::set_enabled)),
    /// on every profiled allocation: keep it a load, and leave the
    /// platform's own on/off switch to that call.
    #[inline(always)]
    fn current() -> Option<AllocTagRef> {
        None
    }

    /// A caller got the object at `ptr`, charged to tag `tag`;
    /// `bytes` is the cache's object size, or whole pages for page-granular
    /// kmalloc. Add to the tag's counters on this CPU. Called with no
    /// allocator lock held; it must not allocate from the allocator with a
    /// tag (that would recurse). Called on every profiled allocation: a
    /// kernel adds to this CPU's counters with one `add` per counter at a
    /// per-CPU base (`magpie-codetag`'s `AllocTagCounters::add_at`).
    #[inline(always)]
    fn add(tag: AllocTagRef, ptr: NonNull<u8>, bytes: usize) {
        let _ = (tag, ptr, bytes);
    }

    /// The object at `ptr`, charged to `tag` when allocated, is
    /// being freed (maybe on another CPU than its allocation): subtract
    /// `bytes` (the same figure `add` got). Called with no
    /// allocator lock held, before the memory is reused.
    #[inline(always)]
    fn sub(tag: AllocTagRef, ptr: NonNull<u8>, bytes: usize) {
        let _ = (tag, ptr, bytes);
    }

    /// The **charge token** of an explicit tag (`alloc_tagged`,
    /// `KmallocArgs::tag`): the form of `tag` the allocator passes to
    /// [`AllocTagHooks::charge`], stores in the object's 4-byte
    /// slot and hands back to [`AllocTagHooks::uncharge`] at the
    /// free; `None` charges nothing (a reference the platform rejects).
    /// A platform may return a form it checks once, here — e.g. the byte
    /// offset of the tag's counter from a per-CPU base
    /// (`magpie-codetag`'s `AllocTagCounters::token`) — so that neither
    /// the charge nor the free checks it again: a reference from a safe
    /// caller is checked here, and only tokens from this hook and
    /// [`AllocTagHooks::current_token`] reach the unsafe hooks. The
    /// default is the reference itself (the plain hooks then get it).
    #[inline(always)]
    fn token(tag: AllocTagRef) -> Option<AllocTagRef> {
        Some(tag)
    }

    /// The charge token of the current tag ([`AllocTagHooks::current`]
    /// as a token): what a profiled allocation without an explicit tag
    /// charges. The default checks the current tag with
    /// [`AllocTagHooks::token`]; a platform that keeps its current
    /// tag as a token already (checked when it was set) returns it: one
    /// per-CPU load.
    #[inline(always)]
    fn current_token() -> Option<AllocTagRef> {
        Self::current().and_then(Self::token)
    }

    /// Charge the object at `ptr` (`bytes` as for
    /// [`AllocTagHooks::add`]) with `token`. The default is
    /// `add` of the token (the reference itself with the
    /// default [`AllocTagHooks::token`]).
    ///
    /// # Safety
    /// The allocator calls it only with a token that
    /// [`AllocTagHooks::token`] or [`AllocTagHooks::current_token`]
    /// returned: a platform may use it unchecked.
    #[inline(always)]
    unsafe fn charge(token: AllocTagRef, ptr: NonNull<u8>, bytes: usize) {
        Self::add(token, ptr, bytes);
    }

    /// Uncharge the object at `ptr`, being freed, charged with `token`
    /// (and `bytes`, the same figure as at the charge). The default is
    /// [`AllocTagHooks::sub`] of the token.
    ///
    /// # Safety
    /// The allocator calls it only with the token it charged this object
    /// with ([`AllocTagHooks::charge`]) and that was not
    /// uncharged since: a platform may use it unchecked (as an offset
    /// into its counters).
    #[inline(always)]
    unsafe fn uncharge(token: AllocTagRef, ptr: NonNull<u8>, bytes: usize) {
        Self::sub(token, ptr, bytes);
    }

    /// Called after every charge ([`AllocTagHooks::charge`])
    /// the allocator makes off its profiled hits — a slab object on a
    /// slow path, a page-granular kmalloc block, a KFENCE sample — with
    /// the same token, object and bytes. While
    /// [`AllocProfiling::set_tag_hooks`](crate::AllocProfiling::set_tag_hooks)
    /// is on, no allocation takes a profiled hit, so it is called after
    /// every charge. For what is too slow for the hit, which must not call
    /// out: e.g. capturing the context (backtrace, CPU, time) of one code
    /// tag's new objects, as Linux's allocation-profiling context capture
    /// proposal does. Called with no allocator lock held, in whatever
    /// context the allocation was made (an interrupt handler's too). The
    /// default does nothing.
    #[inline(always)]
    fn on_charge(token: AllocTagRef, ptr: NonNull<u8>, bytes: usize) {
        let _ = (token, ptr, bytes);
    }

    /// Called before every uncharge ([`AllocTagHooks::uncharge`])
    /// off the profiled free hit, with the same arguments: the
    /// counterpart of [`AllocTagHooks::on_charge`] (e.g. dropping
    /// the freed object's captured context). The default does nothing.
    #[inline(always)]
    fn on_uncharge(token: AllocTagRef, ptr: NonNull<u8>, bytes: usize) {
        let _ = (token, ptr, bytes);
    }
}

/// Statistics a [`PageSource`] reports for `kmemstat`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ArenaStats {
    /// Bytes managed by the source.
    pub total_bytes: usize,
    /// Bytes currently handed out.
    pub alloc_bytes: usize,
    /// Number of successful `alloc_pages` calls ever.
    pub nr_allocs_ever: u64,
}

/// A page provider (an "arena"): whole pages in, whole pages out.
///
/// The allocator calls a page source only while it holds none of its own
/// locks, so a page source may itself allocate from the slab allocator
/// (for example, boundary tags from a `kmem_cache`).
pub trait PageSource: Sync {
    /// Name shown by `kmemstat`.
    fn name(&self) -> &str;
    /// Allocate `nr_pages` contiguous pages, aligned to [`PAGE_SIZE`].
    ///
    /// # Errors
    /// [`AllocError::OutOfMemory`] if the pages are not available.
    fn alloc_pages(&self, nr_pages: usize) -> Result<NonNull<u8>, AllocError>;
    /// Return pages to the source.
    ///
    /// # Safety
    /// `addr` and `nr_pages` come from one earlier `alloc_pages(nr_pages)`
    /// of this source that has not been freed yet (or from the last
    /// successful [`PageSource::resize_pages`] of that block to
    /// `nr_pages`), and nothing uses the pages afterwards.
    unsafe fn free_pages(&self, addr: NonNull<u8>, nr_pages: usize);
    /// The virtual address range `[start, end)` every page of this source
    /// lies in (kernel: the direct map of RAM). For the allocator's primary
    /// source this sizes the page map: a 32-byte slot per page of the span.
    fn span(&self) -> (usize, usize);
    /// Statistics for `kmemstat`.
    fn stats(&self) -> ArenaStats;
    /// Whether every page `alloc_pages` returns is zero-filled (a source
    /// that clears pages on free, or hands out fresh memory). Then `init`
    /// does not clear the page map and zeroing allocations that take whole
    /// pages (`KmallocArgs::zeroed`, `GlobalAlloc::alloc_zeroed`) do not clear them
    /// again. Default: false.
    fn zeroes_pages(&self) -> bool {
        false
    }
    /// Resize the block of `nr_pages` pages at `addr` in place to
    /// `new_nr_pages` (at least one): grow it if the pages after it are
    /// free (they become part of the block), or give back its last
    /// `nr_pages - new_nr_pages` pages. True if done: from then on the
    /// block is `new_nr_pages` pages (for [`PageSource::free_pages`] and
    /// later resizes); false: nothing changed. `realloc` of a
    /// page-granular kmalloc calls it to grow and shrink without copying
    /// (as TLSF and talc extend a block into the free space after it).
    /// Default: false, never (the block is then moved, or kept).
    ///
    /// # Safety
    /// `addr` and `nr_pages` are a live block of this source, as for
    /// [`PageSource::free_pages`]; on a shrink nothing uses the pages
    /// given back afterwards.
    unsafe fn resize_pages(&self, addr: NonNull<u8>, nr_pages: usize, new_nr_pages: usize) -> bool {
        let _ = (addr, nr_pages, new_nr_pages);
        false
    }
    /// [`PageSource::alloc_pages`] for a block that is likely to grow
    /// ([`PageSource::resize_pages`]): `realloc` moving a block it could
    /// not grow in place asks for its new pages here, so a source may put
    /// them where free pages follow (a bump pointer, the top of its free
    /// space) rather than in the best-fitting hole, which a growing block
    /// would have to leave again at its next growth (and leave the same
    /// hole for the next one). Default: [`PageSource::alloc_pages`].
    ///
    /// # Errors
    /// As for [`PageSource::alloc_pages`].
    fn alloc_pages_to_grow(&self, nr_pages: usize) -> Result<NonNull<u8>, AllocError> {
        self.alloc_pages(nr_pages)
    }
}

/// The source an [`Kmem`](crate::Kmem) reports before `init`:
/// it has no memory.
pub(crate) struct NullSource;

impl PageSource for NullSource {
    fn name(&self) -> &str {
        "none"
    }
    fn alloc_pages(&self, _nr_pages: usize) -> Result<NonNull<u8>, AllocError> {
        Err(AllocError::OutOfMemory)
    }
    unsafe fn free_pages(&self, _addr: NonNull<u8>, _nr_pages: usize) {}
    fn span(&self) -> (usize, usize) {
        (0, 0)
    }
    fn stats(&self) -> ArenaStats {
        ArenaStats::default()
    }
}

/// Whether two page sources are the same object (data pointers compared,
/// vtables ignored).
pub(crate) fn same_source(a: &dyn PageSource, b: &dyn PageSource) -> bool {
    core::ptr::addr_eq(a as *const dyn PageSource, b as *const dyn PageSource)
}
