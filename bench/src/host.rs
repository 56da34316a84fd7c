//! What magpie-slab needs on the host: a [`Platform`] whose CPU id is a
//! thread-local (each benchmark thread acts as one CPU), and page sources
//! over one big 4096-aligned region.

use std::alloc::Layout;
use std::cell::Cell;
use std::collections::BTreeMap;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use magpie_codetag::alloc_tag;
use magpie_codetag::alloc_tag::{AllocTag, AllocTagCounters, BootSetting, ProfilingSwitch};
use magpie_slab::{
    AllocError, AllocTagHooks, AllocTagRef, ArenaStats, PAGE_SIZE, PageSource, Platform,
    PlatformHooks,
};

/// CPUs the benchmark platform reports.
pub const NR_CPUS: usize = 4;

// The per-CPU words are `#[thread_local]` statics (nightly feature
// `thread_local`, enabled in main.rs), not `std::thread_local!`: a read is
// one `%fs`-relative load that the compiler cannot outline. Through
// `LocalKey::with`, whether the read was inlined into the benchmark loop
// depended on how rustc split the crate into codegen units, so unrelated
// slab changes moved the GlobalAlloc rows by ~13 instructions.

/// This thread's CPU id ([`set_cpu`]).
#[thread_local]
static CPU: Cell<usize> = Cell::new(0);
/// `CPU * CPU_SLOT_BYTES`, kept beside it as the kernel keeps its
/// per-CPU offset in `PerCpu` (`Platform::cpu_offset`: one load).
#[thread_local]
static CPU_OFFSET: Cell<usize> = Cell::new(0);
/// [`ProfPlatform`]'s per-CPU words, as a kernel keeps them in its
/// per-CPU area (`%gs`): this CPU's counter base in [`PROF_COUNTERS`]
/// (until [`set_cpu`] after [`prof_init`], the sink, which nothing
/// reads) and the tag this CPU charges.
#[thread_local]
static PROF_BASE: Cell<*const u8> =
    Cell::new(std::ptr::addr_of!(PROF_SINK).cast::<u8>().wrapping_sub(16));
/// The tag this CPU charges (see [`PROF_BASE`]), as its charge token
/// (`AllocTagCounters::token`, checked when set).
#[thread_local]
static PROF_CURRENT: Cell<Option<AllocTagRef>> = Cell::new(None);

/// Act as CPU `cpu` on this thread.
pub fn set_cpu(cpu: usize) {
    CPU.set(cpu);
    CPU_OFFSET.set(cpu * magpie_slab::CPU_SLOT_BYTES);
    if let Some(base) = PROF_COUNTERS.cpu_base(cpu) {
        PROF_BASE.set(base as *const u8);
        PROF_CURRENT.set(
            AllocTagRef::new(PROF_TAG.load(Ordering::Relaxed))
                .and_then(|tag| PROF_COUNTERS.token(tag)),
        );
    }
}

/// Thread-local CPU id, 4 CPUs, no-op interrupts, TSC clock.
pub struct BenchPlatform;

// SAFETY: each benchmark thread acts as its own CPU (`thread_init` gives
// ids 0..NR_CPUS, one per thread; the harness never runs two threads with
// one id at once); interrupts do not exist on the host; the default
// `cross_cpu_call` (run here) is only reached by `reap_all` and statistics
// while the measuring threads are not running.
unsafe impl Platform for BenchPlatform {
    #[inline]
    fn max_cpus() -> usize {
        NR_CPUS
    }
    #[inline]
    fn cpu_id() -> usize {
        CPU.get()
    }
    #[inline(always)]
    fn cpu_offset() -> usize {
        CPU_OFFSET.get()
    }
    #[inline]
    fn irq_save() -> usize {
        0
    }
    #[inline]
    fn irq_restore(_state: usize) {}
    #[inline]
    fn now() -> u64 {
        // SAFETY: rdtsc has no preconditions on x86_64.
        unsafe { core::arch::x86_64::_rdtsc() }
    }
}

// SAFETY: the hooks keep PlatformHooks' contract: the KFENCE pool (if any) is
// mapped and the platform's own, and charge tokens are the ones the token hooks
// return.
unsafe impl PlatformHooks for BenchPlatform {
    fn backtrace(_frames: &mut [usize]) -> usize {
        0
    }
    fn context(buf: &mut [u8; 32]) -> usize {
        let name = b"bench";
        buf[..name.len()].copy_from_slice(name);
        name.len()
    }
}

// SAFETY: the defaults: no tags.
unsafe impl AllocTagHooks for BenchPlatform {}

// ------------------------------------------------------ profiling platform

/// The profiling switch of [`ProfPlatform`] (a kernel's
/// `mem_profiling=0|1` and `/proc/sys/vm/mem_profiling`).
pub static PROF_SWITCH: ProfilingSwitch = ProfilingSwitch::new(false);
/// Per-CPU tag counters of [`ProfPlatform`] (`magpie-codetag`).
pub static PROF_COUNTERS: AllocTagCounters = AllocTagCounters::new();
/// The tag every allocation is charged to while profiling is on (a kernel
/// charges its per-CPU "current" tag, or `UNTAGGED`; one tag here, copied
/// into each CPU's `PROF_CURRENT` by [`set_cpu`]).
static PROF_TAG: AtomicU32 = AtomicU32::new(0);
/// Tags the sink has room for.
const SINK_TAGS: usize = 64;
/// Counters of the threads that have no CPU block yet (never read): a
/// valid place for [`AllocTagCounters::add_at`] to write, so that the
/// thread-local base needs no test. [`prof_init`] checks that every tag
/// fits.
static PROF_SINK: [AtomicU64; 2 * SINK_TAGS] = [const { AtomicU64::new(0) }; 2 * SINK_TAGS];

/// [`BenchPlatform`] plus allocation profiling wired as the kernel does
/// (kernel/src/kmem/platform.rs, kernel/src/profiling/alloc_tag.rs): `AllocTagHooks::current` is one per-CPU load (the
/// allocator asks only while its profiling switch is on, which
/// [`prof_init`] sets from [`PROF_SWITCH`]), `AllocTagHooks::add` /
/// `AllocTagHooks::sub` one `add` and one `inc` at this CPU's counter base in
/// `magpie-codetag`'s `AllocTagCounters` (`add_at`/`sub_at`): the kernel's
/// `%gs`-relative base is a thread-local (`%fs`) here. With feature
/// `alloc-profiling` off, the allocator never calls these.
pub struct ProfPlatform;

// SAFETY: as for BenchPlatform (the same CPU ids).
unsafe impl Platform for ProfPlatform {
    #[inline]
    fn max_cpus() -> usize {
        BenchPlatform::max_cpus()
    }
    #[inline]
    fn cpu_id() -> usize {
        BenchPlatform::cpu_id()
    }
    #[inline(always)]
    fn cpu_offset() -> usize {
        BenchPlatform::cpu_offset()
    }
    #[inline]
    fn irq_save() -> usize {
        0
    }
    #[inline]
    fn irq_restore(_state: usize) {}
    #[inline]
    fn now() -> u64 {
        BenchPlatform::now()
    }
}

// SAFETY: the hooks keep PlatformHooks' contract: the KFENCE pool (if any) is
// mapped and the platform's own, and charge tokens are the ones the token hooks
// return.
unsafe impl PlatformHooks for ProfPlatform {
    fn backtrace(frames: &mut [usize]) -> usize {
        BenchPlatform::backtrace(frames)
    }
    fn context(buf: &mut [u8; 32]) -> usize {
        BenchPlatform::context(buf)
    }
}

// SAFETY: `charge` and `uncharge` accept every token that `token` and
// `current_token` return (the defaults, or as the hooks below say).
unsafe impl AllocTagHooks for ProfPlatform {
    #[inline]
    fn current() -> Option<AllocTagRef> {
        PROF_CURRENT.get().and_then(AllocTagCounters::token_tag_ref)
    }

    #[inline]
    fn add(tag: AllocTagRef, _ptr: NonNull<u8>, bytes: usize) {
        let base = PROF_BASE.get() as usize;
        // SAFETY: `base` is this thread's CPU's counter base (set by
        // set_cpu; every benchmark thread has its own CPU id, so only this
        // thread writes that block), or the sink, which has room for
        // every tag (prof_init checks) and which nobody reads.
        unsafe { PROF_COUNTERS.add_at(base, tag, bytes) };
    }

    #[inline]
    fn sub(tag: AllocTagRef, _ptr: NonNull<u8>, bytes: usize) {
        let base = PROF_BASE.get() as usize;
        // SAFETY: as in AllocTagHooks::add.
        unsafe { PROF_COUNTERS.sub_at(base, tag, bytes) };
    }

    /// Tokens are counter offsets (`AllocTagCounters::token`): a
    /// reference is checked once, here or when the current tag is set, so
    /// neither the charge nor the free checks it.
    #[inline]
    fn token(tag: AllocTagRef) -> Option<AllocTagRef> {
        PROF_COUNTERS.token(tag)
    }

    #[inline]
    fn current_token() -> Option<AllocTagRef> {
        PROF_CURRENT.get()
    }

    #[inline]
    unsafe fn charge(token: AllocTagRef, _ptr: NonNull<u8>, bytes: usize) {
        let base = PROF_BASE.get() as usize;
        // SAFETY: base as in AllocTagHooks::add; the allocator passes only
        // tokens of the two hooks above (offsets `token` checked, valid in
        // every CPU's block and in the sink, which has room for every
        // tag).
        unsafe { PROF_COUNTERS.charge_token_at(base, token, bytes) };
    }

    #[inline]
    unsafe fn uncharge(token: AllocTagRef, _ptr: NonNull<u8>, bytes: usize) {
        let base = PROF_BASE.get() as usize;
        // SAFETY: as in AllocTagHooks::charge.
        unsafe { PROF_COUNTERS.uncharge_at(base, token, bytes) };
    }
}

/// Set up [`ProfPlatform`]'s counters (once) and its switch: `on` is
/// "profiling on from boot" (set before the allocator's `init`).
pub fn prof_init(on: bool) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let len = AllocTagCounters::bytes_needed(NR_CPUS);
        let memory: &'static mut [u64] = Vec::leak(vec![0u64; len / 8 + 8]);
        let addr = (memory.as_mut_ptr() as usize).next_multiple_of(AllocTagCounters::ALIGN);
        // SAFETY: `len` bytes from `addr` lie inside the leaked buffer.
        let ready =
            unsafe { PROF_COUNTERS.init(NonNull::new(addr as *mut u8).unwrap(), len, NR_CPUS) };
        assert!(ready, "alloc tag counters");
        assert!(
            alloc_tag::nr_alloc_tags() <= SINK_TAGS,
            "the counter sink has room for every tag"
        );
        PROF_TAG.store(bench_tag().tag_ref().get(), Ordering::Relaxed);
    });
    PROF_SWITCH.set_at_boot(if on {
        BootSetting::On
    } else {
        BootSetting::Off
    });
    // This thread's per-CPU words (worker threads: thread_init).
    set_cpu(BenchPlatform::cpu_id());
    // As a kernel does whenever its switch flips: off, the allocator's
    // alloc fast path does not ask `AllocTagHooks::current` at all.
    crate::allocs::MAGPIE_PROF
        .profiling()
        .set_enabled(PROF_SWITCH.is_on());
}

fn bench_tag() -> &'static AllocTag {
    alloc_tag!()
}

/// Bytes and calls outstanding on the benchmark tag (a sanity check).
pub fn prof_counts() -> (u64, u64) {
    let Some(tag) = AllocTagRef::new(PROF_TAG.load(Ordering::Relaxed)) else {
        return (0, 0);
    };
    let counts = PROF_COUNTERS.read(tag);
    (counts.bytes, counts.calls)
}

/// A leaked, zeroed region of `bytes` bytes aligned to `align`.
pub fn region(bytes: usize, align: usize) -> (usize, usize) {
    // Over-allocate with a small alignment and align by hand: glibc then
    // serves the zeroed request with fresh mmap'd pages (no memset, no
    // pages touched until used), which an over-aligned request would not.
    let layout = Layout::from_size_align(bytes + align, 16).expect("region layout");
    // SAFETY: non-zero size. The region is never freed.
    let raw = unsafe { std::alloc::alloc_zeroed(layout) } as usize;
    assert!(raw != 0, "cannot reserve a {bytes}-byte region");
    (raw.next_multiple_of(align), bytes)
}

const MADV_DONTNEED: i32 = 4;
const PR_SET_THP_DISABLE: i32 = 41;

unsafe extern "C" {
    fn madvise(addr: *mut core::ffi::c_void, len: usize, advice: i32) -> i32;
    fn prctl(option: i32, arg2: u64, arg3: u64, arg4: u64, arg5: u64) -> i32;
}

/// Turn transparent huge pages off for this process, so that a touched
/// page is 4 KiB of resident memory for every allocator alike.
pub fn no_huge_pages() {
    // SAFETY: PR_SET_THP_DISABLE takes plain integers and touches no memory.
    let _ = unsafe { prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0) };
}

/// Resident anonymous memory of this process in bytes (`RssAnon` of
/// `/proc/self/status`): every heap page any allocator has touched and
/// not given back, whatever its source (brk, mmap, a region).
pub fn rss_anon() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("RssAnon:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<usize>().ok())
        .expect("RssAnon in /proc/self/status")
        * 1024
}

struct PagesInner {
    /// Next never-used page address.
    bump: usize,
    /// Freed runs by page count (never split or merged; a run freed just
    /// below `bump` moves `bump` back instead, and so do the freed runs
    /// then found just below it).
    free: BTreeMap<usize, Vec<usize>>,
    /// The runs of `free` by end address: their page counts.
    ends: BTreeMap<usize, usize>,
    outstanding: usize,
    /// Most pages ever outstanding at once.
    peak: usize,
}

/// A simple page allocator over one region: a bump pointer plus exact-size
/// free lists. Page-source calls are rare (slab growth), so a lock is fine.
pub struct HostPages {
    name: &'static str,
    base: usize,
    end: usize,
    inner: spin::Mutex<PagesInner>,
    nr_allocs: AtomicU64,
}

impl HostPages {
    /// A page source over a fresh region of `bytes` bytes aligned to `align`.
    pub fn new(name: &'static str, bytes: usize, align: usize) -> &'static HostPages {
        assert!(align >= PAGE_SIZE && bytes.is_multiple_of(PAGE_SIZE));
        let (base, len) = region(bytes, align);
        Box::leak(Box::new(HostPages {
            name,
            base,
            end: base + len,
            inner: spin::Mutex::new(PagesInner {
                bump: base,
                free: BTreeMap::new(),
                ends: BTreeMap::new(),
                outstanding: 0,
                peak: 0,
            }),
            nr_allocs: AtomicU64::new(0),
        }))
    }

    /// Bytes handed out and not returned.
    pub fn outstanding_bytes(&self) -> usize {
        self.inner.lock().outstanding * PAGE_SIZE
    }

    /// Most pages outstanding at once since the source was made.
    pub fn peak_pages(&self) -> usize {
        self.inner.lock().peak
    }

    /// `nr_pages` contiguous pages aligned to `align` bytes (a power of two
    /// at least `PAGE_SIZE`); aligned requests never reuse freed runs.
    pub fn alloc_aligned(&self, nr_pages: usize, align: usize) -> Option<NonNull<u8>> {
        let mut inner = self.inner.lock();
        let addr = match inner.free.get_mut(&nr_pages).and_then(Vec::pop) {
            Some(addr) if align == PAGE_SIZE => {
                inner.ends.remove(&(addr + nr_pages * PAGE_SIZE));
                addr
            }
            other => {
                if let Some(addr) = other {
                    inner.free.entry(nr_pages).or_default().push(addr);
                }
                let start = inner.bump.next_multiple_of(align);
                let end = start.checked_add(nr_pages * PAGE_SIZE)?;
                if end > self.end {
                    return None;
                }
                inner.bump = end;
                start
            }
        };
        inner.outstanding += nr_pages;
        inner.peak = inner.peak.max(inner.outstanding);
        self.nr_allocs.fetch_add(1, Ordering::Relaxed);
        NonNull::new(addr as *mut u8)
    }
}

impl PageSource for HostPages {
    fn name(&self) -> &str {
        self.name
    }

    fn alloc_pages(&self, nr_pages: usize) -> Result<NonNull<u8>, AllocError> {
        if nr_pages == 0 {
            return Err(AllocError::OutOfMemory);
        }
        self.alloc_aligned(nr_pages, PAGE_SIZE)
            .ok_or(AllocError::OutOfMemory)
    }

    unsafe fn free_pages(&self, addr: NonNull<u8>, nr_pages: usize) {
        // Give the frames back, as a kernel's page source returns them to
        // its frame allocator: the pages leave the resident set (and read
        // as zero when reused), so the memory workloads see what was
        // returned.
        // SAFETY: the run is ours (it came from alloc_pages) and no one
        // uses it any more (the PageSource contract).
        unsafe { madvise(addr.as_ptr().cast(), nr_pages * PAGE_SIZE, MADV_DONTNEED) };
        let mut inner = self.inner.lock();
        let addr = addr.as_ptr() as usize;
        if addr + nr_pages * PAGE_SIZE == inner.bump {
            // The run below the bump pointer: the never-used space grows
            // back (as a heap's top chunk does, merged with the free runs
            // below it), so the next run of any size may reuse it, and
            // grow in place. (Without the merge a run freed while a later
            // one was live stayed in its free list, and the next request
            // of its size took it and could not grow: `realloc-1m` copied
            // its 16 KiB block every chain.)
            let inner = &mut *inner;
            let mut bump = addr;
            while let Some(pages) = inner.ends.remove(&bump) {
                let start = bump - pages * PAGE_SIZE;
                let runs = inner
                    .free
                    .get_mut(&pages)
                    .expect("a run of `ends` is in `free`");
                let at = runs.iter().position(|&run| run == start).expect("listed");
                runs.swap_remove(at);
                bump = start;
            }
            inner.bump = bump;
        } else {
            inner.free.entry(nr_pages).or_default().push(addr);
            inner.ends.insert(addr + nr_pages * PAGE_SIZE, nr_pages);
        }
        inner.outstanding -= nr_pages;
    }

    /// Grows a run that ends at the bump pointer (the never-used space
    /// after it is free); shrinks any run, its last pages becoming a free
    /// run (or never-used space again, at the bump pointer).
    unsafe fn resize_pages(&self, addr: NonNull<u8>, nr_pages: usize, new_nr_pages: usize) -> bool {
        let addr = addr.as_ptr() as usize;
        let end = addr + nr_pages * PAGE_SIZE;
        if new_nr_pages == 0 {
            return false;
        }
        if new_nr_pages < nr_pages {
            let tail = addr + new_nr_pages * PAGE_SIZE;
            // SAFETY: the last pages of our run, no longer used (the
            // PageSource contract).
            unsafe {
                self.free_pages(
                    NonNull::new(tail as *mut u8).unwrap(),
                    nr_pages - new_nr_pages,
                )
            };
            return true;
        }
        let mut inner = self.inner.lock();
        let new_end = addr + new_nr_pages * PAGE_SIZE;
        if end != inner.bump || new_end > self.end {
            return false;
        }
        inner.bump = new_end;
        inner.outstanding += new_nr_pages - nr_pages;
        inner.peak = inner.peak.max(inner.outstanding);
        true
    }

    /// At the bump pointer (the never-used space after it lets the run
    /// grow in place), not in a freed run of the same size.
    fn alloc_pages_to_grow(&self, nr_pages: usize) -> Result<NonNull<u8>, AllocError> {
        if nr_pages == 0 {
            return Err(AllocError::OutOfMemory);
        }
        let mut inner = self.inner.lock();
        let start = inner.bump;
        match start.checked_add(nr_pages * PAGE_SIZE) {
            Some(end) if end <= self.end => {
                inner.bump = end;
                inner.outstanding += nr_pages;
                inner.peak = inner.peak.max(inner.outstanding);
                self.nr_allocs.fetch_add(1, Ordering::Relaxed);
                NonNull::new(start as *mut u8).ok_or(AllocError::OutOfMemory)
            }
            // No never-used space left: any free run.
            _ => {
                drop(inner);
                self.alloc_pages(nr_pages)
            }
        }
    }

    fn span(&self) -> (usize, usize) {
        (self.base, self.end)
    }

    fn stats(&self) -> ArenaStats {
        ArenaStats {
            total_bytes: self.end - self.base,
            alloc_bytes: self.inner.lock().outstanding * PAGE_SIZE,
            nr_allocs_ever: self.nr_allocs.load(Ordering::Relaxed),
        }
    }
}
