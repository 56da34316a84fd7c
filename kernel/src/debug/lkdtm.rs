//! `lkdtm`: commit a known heap bug on purpose (after Linux's Kernel Dump
//! Test Module, `drivers/misc/lkdtm/heap.c`), so that a user can see what
//! the allocator reports and a test can check it.
//!
//! Every bug is committed on a **scratch cache** created for the run
//! (`lkdtm-*`, 64-byte objects) and destroyed afterwards, never on a
//! kmalloc cache the rest of the kernel uses: the blast radius is objects
//! nobody else can reach. Where today's allocator accepts the bug, the run
//! undoes its effect when it can (a double free is repaired by taking the
//! doubled object out twice and freeing it once) and otherwise leaves the
//! scratch cache in place, *quarantined*: its state is suspect and nothing
//! allocates from it again (as `UAF_WRITE_DOUBLE_FREE` always does: the
//! copy it reports stays busy for good). The two `KMALLOC_*` rows commit
//! no bug: they allocate and free correctly from the kernel's `kmalloc`
//! classes, to see who gets whose memory.
//!
//! | type | the bug (as Linux lkdtm) | what it touches |
//! | --- | --- | --- |
//! | `SLAB_FREE_DOUBLE` | free one object twice | the scratch cache's magazine |
//! | `SLAB_FREE_CROSS` | free an object of cache A to cache B | two scratch caches |
//! | `SLAB_FREE_PAGE` | free a page that is not slab memory to a cache (and `kfree` it) | a page from `kpages` |
//! | `SLAB_LINEAR_OVERFLOW` | write 4 bytes just past an object | the neighbouring object, also ours |
//! | `WRITE_AFTER_FREE` | write into the middle of a freed object | the freed object (in a magazine) |
//! | `READ_AFTER_FREE` | read a freed object back | nothing (a read) |
//!
//! and the attack matrix of issue 33 (`docs/HARDENING.md`, the README's
//! table; [`attack`]), one type a row, each with the verdict the row's
//! defence must give, `refused`, `detected` or `mitigated` (and `not
//! detected` / `not mitigated` when it does not):
//!
//! | type | the attack | verdict |
//! | --- | --- | --- |
//! | `UAF_WRITE_DOUBLE_FREE` | write 0 over a freed object's first word, free it again, allocate 256 (64 B and 8 B) | detected, never handed out twice |
//! | `SLAB_FREE_DOUBLE_NARROW` | write one byte at offset 0, free the object twice | refused |
//! | `FREELIST_FORGE_SAME` / `_OTHER` / `_OUTSIDE` | aim every free-list link of a slab at a busy object of it, an object of another cache, the allocator's static | refused |
//! | `KMALLOC_SITE_REUSE` | one `kmalloc(64)` site frees 100 objects, another allocates 100 | mitigated |
//! | `KMALLOC_TYPE_REUSE` | 100 `[u8; 64]` freed, 100 pointer-holding 64-byte objects allocated | mitigated |
//! | `CROSS_CACHE_REUSE` | a cache's slabs emptied and reaped, another cache grows | mitigated |
//! | `HEAP_SPRAY_ORDER` | 32 objects from a fresh slab: how many follow their predecessor | mitigated |
//!
//! Each run ends with one verdict line, `lkdtm: TYPE: detected: REPORT` or
//! `lkdtm: TYPE: not detected: WHAT HAPPENED`. A bug counts as detected if
//! a call refused it, if poison showed in what was read, or if the
//! allocator made an error report about the scratch cache during the run
//! (slab debugging: the report itself is printed by the kernel's report
//! hook just before). Which types are detected without debug flags and
//! with `slab_debug=FZPU` is in the README, checked by `tests/lkdtm.rs`
//! (no flags) and `tests/e2e/test_shell.py` (both).

use core::fmt::{self, Write};
use core::ptr::NonNull;
use core::sync::atomic::{AtomicU64, Ordering};
use magpie_slab::CacheArgs;

use magpie_slab::reports::{ErrorKind, ErrorReport};
use magpie_slab::{AllocError, FreeError, KmemCache, PageSource};

use magpie_slab::kfence::{KfencePlace, KfenceReport};

use crate::debug::kfence::{self, Summary};
use crate::kmem::{KPAGES, KernelPlatform, SLAB};

type Cache = KmemCache<KernelPlatform>;

pub mod attack;

/// Object size of the scratch caches, in bytes.
pub const SCRATCH_OBJ_SIZE: usize = 64;
/// Most objects `SLAB_LINEAR_OVERFLOW` takes looking for two neighbours (a
/// slab's worth: its order is random).
const MAX_HELD: usize = 64;
/// Most objects a scratch cache holds at once (the attack matrix's rows
/// take up to 300).
const HELD_CAPACITY: usize = 512;

/// A bug `lkdtm` can commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LkdtmType {
    /// `SLAB_FREE_DOUBLE`: the same object freed twice.
    SlabFreeDouble,
    /// `SLAB_FREE_CROSS`: an object freed to a cache it does not belong to.
    SlabFreeCross,
    /// `SLAB_FREE_PAGE`: a page that is not slab memory freed to a cache.
    SlabFreePage,
    /// `SLAB_LINEAR_OVERFLOW`: a write just past the end of an object.
    SlabLinearOverflow,
    /// `WRITE_AFTER_FREE`: a write into a freed object.
    WriteAfterFree,
    /// `READ_AFTER_FREE`: a read of a freed object.
    ReadAfterFree,
    /// `KFENCE_OOB_LEFT`: a read 1 byte before a sampled object.
    KfenceOobLeft,
    /// `KFENCE_OOB_RIGHT`: a read 1 byte past a sampled object.
    KfenceOobRight,
    /// `KFENCE_CORRUPTION`: a write 1 byte before a sampled object placed
    /// at its page's end (into the canary, found at the free).
    KfenceCorruption,
    /// `KFENCE_DOUBLE_FREE`: a sampled object freed twice.
    KfenceDoubleFree,
    /// `KFENCE_INVALID_FREE`: a pointer inside a sampled object freed.
    KfenceInvalidFree,
    /// `UAF_WRITE_DOUBLE_FREE`: a freed object's first word overwritten,
    /// then the object freed again (the attack matrix's first row).
    UafWriteDoubleFree,
    /// `SLAB_FREE_DOUBLE_NARROW`: one byte written at offset 0, then the
    /// object freed twice.
    SlabFreeDoubleNarrow,
    /// `FREELIST_FORGE_SAME`: free-list links aimed at a busy object of
    /// the same slab.
    FreelistForgeSame,
    /// `FREELIST_FORGE_OTHER`: free-list links aimed at an object of
    /// another cache.
    FreelistForgeOther,
    /// `FREELIST_FORGE_OUTSIDE`: free-list links aimed outside the heap.
    FreelistForgeOutside,
    /// `KMALLOC_SITE_REUSE`: what one `kmalloc` call site frees, another
    /// of the same size allocates.
    KmallocSiteReuse,
    /// `KMALLOC_TYPE_REUSE`: what pointer-free 64-byte data frees, a
    /// 64-byte type holding a pointer allocates.
    KmallocTypeReuse,
    /// `CROSS_CACHE_REUSE`: a cache's slabs reaped, another cache grows.
    CrossCacheReuse,
    /// `HEAP_SPRAY_ORDER`: objects of a fresh slab, in address order or not.
    HeapSprayOrder,
}

impl LkdtmType {
    /// Every type, in the order `lkdtm` lists them.
    pub const ALL: [LkdtmType; 20] = [
        LkdtmType::SlabFreeDouble,
        LkdtmType::SlabFreeCross,
        LkdtmType::SlabFreePage,
        LkdtmType::SlabLinearOverflow,
        LkdtmType::WriteAfterFree,
        LkdtmType::ReadAfterFree,
        LkdtmType::KfenceOobLeft,
        LkdtmType::KfenceOobRight,
        LkdtmType::KfenceCorruption,
        LkdtmType::KfenceDoubleFree,
        LkdtmType::KfenceInvalidFree,
        LkdtmType::UafWriteDoubleFree,
        LkdtmType::SlabFreeDoubleNarrow,
        LkdtmType::FreelistForgeSame,
        LkdtmType::FreelistForgeOther,
        LkdtmType::FreelistForgeOutside,
        LkdtmType::KmallocSiteReuse,
        LkdtmType::KmallocTypeReuse,
        LkdtmType::CrossCacheReuse,
        LkdtmType::HeapSprayOrder,
    ];

    /// The Linux LKDTM name.
    pub const fn name(self) -> &'static str {
        match self {
            LkdtmType::SlabFreeDouble => "SLAB_FREE_DOUBLE",
            LkdtmType::SlabFreeCross => "SLAB_FREE_CROSS",
            LkdtmType::SlabFreePage => "SLAB_FREE_PAGE",
            LkdtmType::SlabLinearOverflow => "SLAB_LINEAR_OVERFLOW",
            LkdtmType::WriteAfterFree => "WRITE_AFTER_FREE",
            LkdtmType::ReadAfterFree => "READ_AFTER_FREE",
            LkdtmType::KfenceOobLeft => "KFENCE_OOB_LEFT",
            LkdtmType::KfenceOobRight => "KFENCE_OOB_RIGHT",
            LkdtmType::KfenceCorruption => "KFENCE_CORRUPTION",
            LkdtmType::KfenceDoubleFree => "KFENCE_DOUBLE_FREE",
            LkdtmType::KfenceInvalidFree => "KFENCE_INVALID_FREE",
            LkdtmType::UafWriteDoubleFree => "UAF_WRITE_DOUBLE_FREE",
            LkdtmType::SlabFreeDoubleNarrow => "SLAB_FREE_DOUBLE_NARROW",
            LkdtmType::FreelistForgeSame => "FREELIST_FORGE_SAME",
            LkdtmType::FreelistForgeOther => "FREELIST_FORGE_OTHER",
            LkdtmType::FreelistForgeOutside => "FREELIST_FORGE_OUTSIDE",
            LkdtmType::KmallocSiteReuse => "KMALLOC_SITE_REUSE",
            LkdtmType::KmallocTypeReuse => "KMALLOC_TYPE_REUSE",
            LkdtmType::CrossCacheReuse => "CROSS_CACHE_REUSE",
            LkdtmType::HeapSprayOrder => "HEAP_SPRAY_ORDER",
        }
    }

    /// The type named `name` (Linux spelling; case does not matter).
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|kind| kind.name().eq_ignore_ascii_case(name))
    }
}

impl fmt::Display for LkdtmType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The allocator noticed: refused the bad operation (the report is on
    /// the verdict line), or its poison showed in what was read.
    Detected,
    /// The bug went through unnoticed.
    NotDetected,
    /// An attack-matrix row: the allocator refused the bad operation
    /// itself (the free, the forged link), with a report.
    Refused,
    /// An attack-matrix row: the attack ran and did not get what it was
    /// after (another site's, type's or cache's memory; a predictable
    /// layout).
    Mitigated,
    /// An attack-matrix row: the attack got what it was after.
    NotMitigated,
}

impl Verdict {
    /// The word on the verdict line: `lkdtm: TYPE: WORD: ...`.
    pub const fn word(self) -> &'static str {
        match self {
            Verdict::Detected => "detected",
            Verdict::NotDetected => "not detected",
            Verdict::Refused => "refused",
            Verdict::Mitigated => "mitigated",
            Verdict::NotMitigated => "not mitigated",
        }
    }

    /// Whether the allocator defended itself (refused, detected or
    /// mitigated).
    pub const fn defended(self) -> bool {
        matches!(
            self,
            Verdict::Detected | Verdict::Refused | Verdict::Mitigated
        )
    }
}

/// Why a run could not commit its bug. Nothing was done (or what was done
/// has been undone).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LkdtmError {
    /// The scratch cache or an object could not be allocated.
    Setup(AllocError),
    /// The scratch objects were not laid out as the bug needs (no two
    /// neighbouring objects for the overflow).
    Layout,
    /// A correct free, before the bug, was refused (the scratch cache is
    /// quarantined).
    Refused(FreeError),
    /// A `KFENCE_*` type could not get a sampled object (no pool, or the
    /// scratch cache has slab debug flags).
    NoSample,
}

impl fmt::Display for LkdtmError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LkdtmError::Setup(error) => write!(f, "could not set up: {error}; nothing was done"),
            LkdtmError::Layout => f.write_str(
                "no two neighbouring scratch objects for the overflow; nothing was done",
            ),
            LkdtmError::Refused(error) => write!(
                f,
                "a correct free before the bug was refused ({error}); scratch cache quarantined"
            ),
            LkdtmError::NoSample => f.write_str(
                "no KFENCE sample for the scratch cache (no pool, or slab debug flags); nothing was done",
            ),
        }
    }
}

impl From<AllocError> for LkdtmError {
    fn from(error: AllocError) -> Self {
        LkdtmError::Setup(error)
    }
}

/// A scratch cache and the objects this run holds from it. Dropping it
/// frees them and destroys the cache, unless it was quarantined.
struct Scratch {
    cache: &'static Cache,
    held: [Option<NonNull<u8>>; HELD_CAPACITY],
    quarantined: bool,
}

/// Every allocation a run makes goes through here: one fault point
/// (`fault list lkdtm`); armed, the run stops with "could not set up".
/// Inlined, so that stacks name the caller (`Scratch::alloc` in the
/// "earlier transaction" of a report).
#[inline(always)]
fn alloc(
    take: impl FnOnce() -> Result<NonNull<u8>, AllocError>,
) -> Result<NonNull<u8>, LkdtmError> {
    Ok(crate::__alloc_site!(take())?)
}

impl Scratch {
    fn create(name: &str, out: &mut dyn Write) -> Result<Self, LkdtmError> {
        Self::create_sized(name, SCRATCH_OBJ_SIZE, out)
    }

    fn create_sized(name: &str, size: usize, out: &mut dyn Write) -> Result<Self, LkdtmError> {
        let cache = SLAB.cache_create(
            name,
            size,
            &CacheArgs {
                align: 8,
                ..CacheArgs::DEFAULT
            },
        )?;
        let _ = writeln!(out, "lkdtm: scratch cache {name} ({size}-byte objects)");
        Ok(Self {
            cache,
            held: [None; HELD_CAPACITY],
            quarantined: false,
        })
    }

    fn name(&self) -> &'static str {
        self.cache.name()
    }

    /// Allocates an object and holds it (a fault point: `fault list lkdtm`).
    fn alloc(&mut self) -> Result<NonNull<u8>, LkdtmError> {
        let slot = self
            .held
            .iter()
            .position(Option::is_none)
            .ok_or(LkdtmError::Setup(AllocError::OutOfMemory))?;
        let cache = self.cache;
        let obj = alloc(|| cache.alloc_tagged(crate::__site_tag!()))?;
        self.held[slot] = Some(obj);
        Ok(obj)
    }

    /// A KFENCE sample from the scratch cache, placed as `place` says:
    /// `None` if the cache cannot be sampled (no pool, slab debug flags).
    fn alloc_sampled(&mut self, place: KfencePlace) -> Result<Option<NonNull<u8>>, LkdtmError> {
        if !SLAB.kfence().force_sample_of(self.cache, Some(place)) {
            return Ok(None);
        }
        let obj = self.alloc()?;
        Ok(SLAB.kfence().contains(addr(obj)).then_some(obj))
    }

    /// Stops holding `obj` (the caller frees it, or commits its bug).
    fn release(&mut self, obj: NonNull<u8>) {
        if let Some(slot) = self.held.iter_mut().find(|slot| **slot == Some(obj)) {
            *slot = None;
        }
    }

    /// Frees a held object the right way. Never inlined, and the free not
    /// a tail call (a free's result comes back in registers, so it could
    /// be): its frame names the free in KFENCE's "freed by" stack
    /// (`tests/lkdtm.rs`).
    #[inline(never)]
    fn free(&mut self, obj: NonNull<u8>) -> Result<(), FreeError> {
        self.release(obj);
        // SAFETY: `obj` came from this cache's alloc and was held by us
        // alone; it is given up here.
        let result = unsafe { self.cache.free(obj) };
        core::hint::black_box(());
        result
    }

    /// Frees every held object the right way (the first refusal is
    /// returned; the rest are still freed).
    fn free_held(&mut self) -> Result<(), FreeError> {
        let mut first = Ok(());
        for obj in self.held.iter_mut().filter_map(Option::take) {
            // SAFETY: held objects are allocated and ours alone.
            let freed = unsafe { self.cache.free(obj) };
            if first.is_ok() {
                first = freed;
            }
        }
        first
    }

    fn quarantine(&mut self, out: &mut dyn Write) {
        self.quarantined = true;
        let _ = writeln!(
            out,
            "lkdtm: scratch cache {} left in place, quarantined (its state is suspect; nothing allocates from it again)",
            self.name()
        );
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if self.quarantined {
            return;
        }
        for obj in self.held.iter_mut().filter_map(Option::take) {
            // SAFETY: held objects are allocated and ours alone.
            if let Err(error) = unsafe { self.cache.free(obj) } {
                log::error!("lkdtm: freeing a scratch object: {error}");
                self.quarantined = true;
            }
        }
        if self.quarantined {
            return;
        }
        // SAFETY: every object of the cache has been freed above; the cache
        // was created by this run and nothing else knows it.
        if let Err(error) = unsafe { crate::kmem::cache_destroy(self.cache) } {
            log::error!("lkdtm: destroying {}: {error}", self.cache.name());
        }
    }
}

/// Commits `kind`'s bug, printing what it does and what the allocator
/// said, then one verdict line.
///
/// # Errors
/// [`LkdtmError`] if the bug could not be set up; nothing was done then.
pub fn run(kind: LkdtmType, out: &mut dyn Write) -> Result<Verdict, LkdtmError> {
    let _ = writeln!(out, "lkdtm: Performing direct entry {kind}");
    RUN_START.store(SLAB.debug().nr_errors(), Ordering::Relaxed);
    KFENCE_START.store(SLAB.kfence().stats().nr_bugs, Ordering::Relaxed);
    let verdict = match kind {
        LkdtmType::SlabFreeDouble => slab_free_double(out),
        LkdtmType::SlabFreeCross => slab_free_cross(out),
        LkdtmType::SlabFreePage => slab_free_page(out),
        LkdtmType::SlabLinearOverflow => slab_linear_overflow(out),
        LkdtmType::WriteAfterFree => write_after_free(out),
        LkdtmType::ReadAfterFree => read_after_free(out),
        LkdtmType::UafWriteDoubleFree => attack::uaf_write_double_free(out),
        LkdtmType::SlabFreeDoubleNarrow => slab_free_double_narrow(out),
        LkdtmType::FreelistForgeSame
        | LkdtmType::FreelistForgeOther
        | LkdtmType::FreelistForgeOutside => attack::freelist_forge(kind, out),
        LkdtmType::KmallocSiteReuse => attack::kmalloc_site_reuse(out),
        LkdtmType::KmallocTypeReuse => attack::kmalloc_type_reuse(out),
        LkdtmType::CrossCacheReuse => attack::cross_cache_reuse(out, true),
        LkdtmType::HeapSprayOrder => attack::heap_spray_order(out),
        kfence_kind => kfence_bug(kfence_kind, out),
    }?;
    Ok(verdict)
}

fn addr(ptr: NonNull<u8>) -> usize {
    ptr.as_ptr() as usize
}

fn detected(kind: LkdtmType, error: FreeError, out: &mut dyn Write) -> Verdict {
    // A wrong cache's owner is in the allocator's report of the free (the
    // error carries only the address).
    let owner = match error {
        FreeError::WrongCache { .. } => report_of_run().and_then(|report| report.owner),
        _ => None,
    };
    let _ = match owner {
        Some(owner) => writeln!(
            out,
            "lkdtm: {kind}: detected: {error} (it belongs to {owner})"
        ),
        None => writeln!(out, "lkdtm: {kind}: detected: {error}"),
    };
    Verdict::Detected
}

/// The allocator's error count when the current run started: a report it
/// made during the run about a scratch cache (slab debugging: a redzone,
/// poison or duplicate-free report) is a detection even when no call
/// returned an error.
static RUN_START: AtomicU64 = AtomicU64::new(0);

/// The first report the allocator made about a scratch cache during this
/// run.
fn report_of_run() -> Option<ErrorReport> {
    let mut reports = [ErrorReport::new(ErrorKind::InvalidFree, "", 0); 4];
    let nr = SLAB
        .debug()
        .read_errors(RUN_START.load(Ordering::Relaxed), &mut reports);
    reports[..nr]
        .iter()
        .copied()
        .find(|report| report.cache.as_str().starts_with("lkdtm-"))
}

/// KFENCE's report count when the current run started.
static KFENCE_START: AtomicU64 = AtomicU64::new(0);

/// The latest KFENCE report, if KFENCE reported during this run.
fn kfence_report_of_run() -> Option<KfenceReport> {
    (SLAB.kfence().stats().nr_bugs > KFENCE_START.load(Ordering::Relaxed))
        .then(kfence::last_report)
        .flatten()
}

fn not_detected(kind: LkdtmType, what: fmt::Arguments<'_>, out: &mut dyn Write) -> Verdict {
    if let Some(report) = kfence_report_of_run() {
        let _ = writeln!(out, "lkdtm: {kind}: detected: {}", Summary(&report));
        return Verdict::Detected;
    }
    if let Some(report) = report_of_run() {
        let _ = writeln!(
            out,
            "lkdtm: {kind}: detected: {} in {}, object {:#x}, offset {:#x}",
            report.kind.headline(),
            report.cache,
            report.object,
            report.offset().unwrap_or(0)
        );
        return Verdict::Detected;
    }
    let _ = writeln!(out, "lkdtm: {kind}: not detected: {what}");
    Verdict::NotDetected
}

fn said(result: Result<(), FreeError>) -> &'static str {
    match result {
        Ok(()) => "accepted",
        Err(_) => "refused",
    }
}

/// `SLAB_FREE_DOUBLE`. A warm-up allocation first gives this CPU a loaded
/// magazine, so that both frees land in it (not in the slab layer's free
/// list, where a double free would corrupt the slab itself); an accepted
/// double free then puts the object in the magazine twice, and the repair
/// takes it out twice and frees it once.
fn slab_free_double(out: &mut dyn Write) -> Result<Verdict, LkdtmError> {
    free_twice(LkdtmType::SlabFreeDouble, "lkdtm-free-double", out)
}

/// `SLAB_FREE_DOUBLE_NARROW` (the attack matrix): `SLAB_FREE_DOUBLE`
/// after one byte written at offset 0, the store a test of the object's
/// first word would stall behind (`docs/HARDENING.md` section 1). Verdict
/// `refused` at the second free.
fn slab_free_double_narrow(out: &mut dyn Write) -> Result<Verdict, LkdtmError> {
    free_twice(
        LkdtmType::SlabFreeDoubleNarrow,
        "lkdtm-free-double-narrow",
        out,
    )
}

/// The two double-free types: the narrow one writes a byte at offset 0
/// first, and its refusal is the verdict `refused`.
fn free_twice(kind: LkdtmType, name: &str, out: &mut dyn Write) -> Result<Verdict, LkdtmError> {
    let narrow = kind == LkdtmType::SlabFreeDoubleNarrow;
    let _sampling = narrow.then(attack::NoSampling::new);
    let mut scratch = Scratch::create(name, out)?;
    let warm = scratch.alloc()?;
    let _ = scratch.free(warm);
    let obj = scratch.alloc()?;
    if narrow {
        // SAFETY: an allocated object of ours, at least a byte long.
        unsafe { obj.as_ptr().write_volatile(0x41) };
        let _ = writeln!(
            out,
            "lkdtm: allocated {:#x}, wrote 0x41 to its first byte, freeing it twice",
            addr(obj)
        );
    } else {
        let _ = writeln!(out, "lkdtm: allocated {:#x}, freeing it twice", addr(obj));
    }
    let first = scratch.free(obj);
    let _ = writeln!(out, "lkdtm: first free: {}", said(first));
    if let Err(error) = first {
        scratch.quarantine(out);
        return Err(LkdtmError::Refused(error));
    }
    // SAFETY: the bug this command exists to commit: `obj` is already free.
    // It is a 64-byte object of our scratch cache, sitting in this CPU's
    // loaded magazine; the allocator is built to refuse or absorb the
    // second free without touching memory outside the cache.
    let second = unsafe { scratch.cache.free(obj) };
    let _ = writeln!(out, "lkdtm: second free: {}", said(second));
    if let Err(error) = second {
        if narrow {
            let _ = writeln!(out, "lkdtm: {kind}: refused: {error}");
            return Ok(Verdict::Refused);
        }
        return Ok(detected(kind, error, out));
    }
    // Accepted: the object is in the magazine twice. Take both rounds out,
    // uncharged (the object's allocation tag was already uncharged by the
    // first free; charging the takes would count it twice in allocinfo),
    // and not through a fault point (the repair must not fail on purpose).
    let again = [
        scratch.cache.alloc_tagged(None),
        scratch.cache.alloc_tagged(None),
    ];
    match again {
        [Ok(a), Ok(b)] if a == obj && b == obj => {
            let _ = writeln!(
                out,
                "lkdtm: the next two allocations both returned {:#x} (handed out twice)",
                addr(obj)
            );
            // Repaired: the object is in the magazine once more.
            let _ = writeln!(
                out,
                "lkdtm: repaired: freed it once more ({})",
                // SAFETY: `obj` is allocated (taken out twice, so once
                // beyond its double free) and ours alone.
                said(unsafe { scratch.cache.free(obj) })
            );
        }
        _ => {
            let _ = writeln!(
                out,
                "lkdtm: the next two allocations were {:?} and {:?}; cannot repair",
                again[0].map(addr),
                again[1].map(addr)
            );
            scratch.quarantine(out);
        }
    }
    Ok(not_detected(
        kind,
        format_args!("the second free of {:#x} was accepted", addr(obj)),
        out,
    ))
}

/// `SLAB_FREE_CROSS`: an object of one scratch cache freed to another.
fn slab_free_cross(out: &mut dyn Write) -> Result<Verdict, LkdtmError> {
    let kind = LkdtmType::SlabFreeCross;
    let mut owner = Scratch::create("lkdtm-free-cross-a", out)?;
    let mut other = Scratch::create("lkdtm-free-cross-b", out)?;
    let obj = owner.alloc()?;
    let _ = writeln!(
        out,
        "lkdtm: allocated {:#x} from {}, freeing it to {}",
        addr(obj),
        owner.name(),
        other.name()
    );
    // SAFETY: the bug this command commits: `obj` belongs to `owner`. The
    // allocator validates the owner before touching anything; if it did
    // not, the object lands in `other`'s magazine and is taken back below.
    let result = unsafe { other.cache.free(obj) };
    let _ = writeln!(out, "lkdtm: free to {}: {}", other.name(), said(result));
    if let Err(error) = result {
        return Ok(detected(kind, error, out));
    }
    // Accepted: `owner` still counts it as allocated, `other` holds it free.
    owner.release(obj);
    // Uncharged and not a fault point, as the double-free repair.
    match other.cache.alloc_tagged(None) {
        Ok(back) if back == obj => {
            let _ = writeln!(
                out,
                "lkdtm: repaired: took it back from {} and freed it to {} ({})",
                other.name(),
                owner.name(),
                // SAFETY: `obj` is `owner`'s, allocated, ours alone again.
                said(unsafe { owner.cache.free(obj) })
            );
        }
        _ => {
            owner.quarantine(out);
            other.quarantine(out);
        }
    }
    Ok(not_detected(
        kind,
        format_args!("{} accepted an object of {}", other.name(), owner.name()),
        out,
    ))
}

/// `SLAB_FREE_PAGE`: a page from `kpages` (not slab memory) freed to a
/// scratch cache and to `kfree`.
fn slab_free_page(out: &mut dyn Write) -> Result<Verdict, LkdtmError> {
    let kind = LkdtmType::SlabFreePage;
    let scratch = Scratch::create("lkdtm-free-page", out)?;
    let page = KPAGES.alloc_pages(1)?;
    let _ = writeln!(
        out,
        "lkdtm: took page {:#x} from kpages (not slab memory), freeing it to {} and to kfree",
        addr(page),
        scratch.name()
    );
    // SAFETY: the bug this command commits: `page` is not slab memory. The
    // allocator looks it up in its page map before touching anything.
    let to_cache = unsafe { scratch.cache.free(page) };
    let _ = writeln!(out, "lkdtm: free to {}: {}", scratch.name(), said(to_cache));
    // SAFETY: as above, through kfree's page-map lookup.
    let to_kfree = unsafe { SLAB.kfree(page) };
    let _ = writeln!(out, "lkdtm: kfree: {}", said(to_kfree));
    let verdict = match (to_cache, to_kfree) {
        (Err(error), Err(_)) => detected(kind, error, out),
        (Err(_), Ok(())) => not_detected(
            kind,
            format_args!("the cache refused it but kfree accepted {:#x}", addr(page)),
            out,
        ),
        (Ok(()), _) => not_detected(
            kind,
            format_args!("{} accepted page {:#x}", scratch.name(), addr(page)),
            out,
        ),
    };
    if verdict == Verdict::NotDetected {
        // The page may now sit in an allocator list: never give it back.
        let _ = writeln!(
            out,
            "lkdtm: page {:#x} not returned to kpages (the allocator may hold it)",
            addr(page)
        );
        let mut scratch = scratch;
        scratch.quarantine(out);
        drop(scratch);
    } else {
        // SAFETY: the page came from KPAGES.alloc_pages(1) above and both
        // frees refused it, so it is still ours alone.
        unsafe { KPAGES.free_pages(page, 1) };
    }
    Ok(verdict)
}

/// `SLAB_LINEAR_OVERFLOW`: four bytes written at offset 64 of a 64-byte
/// object (Linux writes `data[1024 / 4]` of a 1024-byte kmalloc). The
/// object is chosen so that the write lands in memory this run owns: the
/// object's own slack or redzone, or a neighbouring object it holds — never
/// a free object, whose first word may be a free-list link.
#[expect(
    clippy::cast_ptr_alignment,
    reason = "object starts are 8-aligned; the u32 accesses are at offsets that are multiples of 4"
)]
fn slab_linear_overflow(out: &mut dyn Write) -> Result<Verdict, LkdtmError> {
    const VALUE: u32 = 0x1234_5678;
    let kind = LkdtmType::SlabLinearOverflow;
    let mut scratch = Scratch::create("lkdtm-linear-overflow", out)?;
    if let Some(victim) = scratch.alloc_sampled(KfencePlace::Right)? {
        let target = addr(victim) + SCRATCH_OBJ_SIZE;
        let _ = writeln!(
            out,
            "lkdtm: allocated {:#x} ({SCRATCH_OBJ_SIZE} bytes, a KFENCE sample at its page's end); writing {VALUE:#x} at offset {SCRATCH_OBJ_SIZE} ({target:#x}), just past its end",
            addr(victim)
        );
        // SAFETY: the bug this command commits: `target` is the guard
        // page after the sampled object; the fault is reported and the
        // page mapped back in, so the write lands in pool memory nobody
        // uses. 4-byte aligned.
        unsafe { core::ptr::write_volatile(target as *mut u32, VALUE) };
        let freed = scratch.free(victim);
        let _ = writeln!(out, "lkdtm: free of {:#x}: {}", addr(victim), said(freed));
        return Ok(not_detected(
            kind,
            format_args!(
                "the write past the end of {:#x} went unnoticed",
                addr(victim)
            ),
            out,
        ));
    }
    // With slab debugging the stride holds a redzone after the object.
    let stride = scratch.cache.stride();
    // Objects until one has a held neighbour right after it (a new
    // slab's free list is in a random order: SLAB_FREELIST_RANDOM).
    let mut objs = [None; MAX_HELD - 1];
    let mut found = None;
    for index in 0..objs.len() {
        let obj = scratch.alloc()?;
        // SAFETY: a fresh object of `stride` >= 64 bytes, ours.
        unsafe { core::ptr::write_bytes(obj.as_ptr(), 0, SCRATCH_OBJ_SIZE) };
        objs[index] = Some(obj);
        let held = || objs[..=index].iter().flatten().copied();
        let neighbour_of = |target: usize| {
            held().find(|&b| (addr(b)..addr(b) + SCRATCH_OBJ_SIZE).contains(&target))
        };
        found = held().find_map(|a| {
            let target = addr(a) + SCRATCH_OBJ_SIZE;
            if target < addr(a) + stride {
                Some((a, None))
            } else {
                neighbour_of(target).map(|b| (a, Some(b)))
            }
        });
        if found.is_some() {
            break;
        }
    }
    let Some((victim, neighbour)) = found else {
        return Err(LkdtmError::Layout);
    };
    let target = addr(victim) + SCRATCH_OBJ_SIZE;
    let _ = writeln!(
        out,
        "lkdtm: allocated {:#x} ({SCRATCH_OBJ_SIZE} bytes); writing {VALUE:#x} at offset {SCRATCH_OBJ_SIZE} ({target:#x}), just past its end",
        addr(victim)
    );
    // SAFETY: the bug this command commits, aimed so that it only hits
    // memory this run owns: `target` is inside `victim`'s own slot (slack
    // or redzone) or inside `neighbour`, an allocated object held here;
    // 4-byte aligned (object starts are 8-aligned, 64 is a multiple of 4).
    unsafe { core::ptr::write_volatile(target as *mut u32, VALUE) };
    if let Some(b) = neighbour {
        // SAFETY: `b` is an allocated 64-byte object held by this run.
        let first = unsafe { core::ptr::read_volatile(b.as_ptr().cast::<u32>()) };
        let _ = writeln!(
            out,
            "lkdtm: the write landed in the neighbouring object {:#x} at offset {} (it now reads {first:#x})",
            addr(b),
            target - addr(b)
        );
    }
    for (what, obj) in [("", Some(victim)), ("the neighbour ", neighbour)] {
        let Some(obj) = obj else { continue };
        let freed = scratch.free(obj);
        let _ = writeln!(
            out,
            "lkdtm: free of {what}{:#x}: {}",
            addr(obj),
            said(freed)
        );
        if let Err(error) = freed {
            return Ok(detected(kind, error, out));
        }
    }
    Ok(not_detected(
        kind,
        format_args!(
            "the write past the end of {:#x} went unnoticed",
            addr(victim)
        ),
        out,
    ))
}

/// Offset of the word `WRITE_AFTER_FREE` and `READ_AFTER_FREE` touch: the
/// middle of the object, as Linux (never the first word, which holds the
/// free-list link once the object is back in its slab).
const MIDDLE: usize = SCRATCH_OBJ_SIZE / 2;

/// `WRITE_AFTER_FREE`: a word written into the middle of a freed object,
/// then the same object allocated again.
#[expect(
    clippy::cast_ptr_alignment,
    reason = "object starts are 8-aligned; MIDDLE is a multiple of 4"
)]
fn write_after_free(out: &mut dyn Write) -> Result<Verdict, LkdtmError> {
    const VALUE: u32 = 0x0abc_def0;
    let kind = LkdtmType::WriteAfterFree;
    let mut scratch = Scratch::create("lkdtm-write-after-free", out)?;
    let sampled = scratch.alloc_sampled(KfencePlace::Right)?;
    let obj = match sampled {
        Some(obj) => obj,
        None => scratch.alloc()?,
    };
    let _ = writeln!(
        out,
        "lkdtm: allocated {:#x}, freeing it, then writing {VALUE:#x} at offset {MIDDLE}",
        addr(obj)
    );
    if let Err(error) = scratch.free(obj) {
        scratch.quarantine(out);
        return Err(LkdtmError::Refused(error));
    }
    // SAFETY: the bug this command commits: `obj` is free. Its page belongs
    // to the scratch cache until the cache is destroyed at the end of the
    // run, so the write stays inside memory nobody else uses; the middle
    // word is not the free-list link (offset 0).
    unsafe { core::ptr::write_volatile(obj.as_ptr().add(MIDDLE).cast::<u32>(), VALUE) };
    if sampled.is_some() {
        // A KFENCE sample: its page was unmapped at the free, the write
        // faulted and was reported.
        return Ok(not_detected(
            kind,
            format_args!("the write into {:#x} went unnoticed", addr(obj)),
            out,
        ));
    }
    let again = scratch.alloc();
    let verdict = match again {
        Ok(back) if back == obj => {
            // SAFETY: `back` is an allocated object of ours.
            let seen = unsafe { core::ptr::read_volatile(back.as_ptr().add(MIDDLE).cast::<u32>()) };
            let _ = writeln!(
                out,
                "lkdtm: allocated again: got {:#x} back, offset {MIDDLE} reads {seen:#x}",
                addr(back)
            );
            not_detected(
                kind,
                format_args!("the freed object was handed out again with the write in it"),
                out,
            )
        }
        Ok(other) => {
            let _ = writeln!(
                out,
                "lkdtm: allocated again: got {:#x}, a different object",
                addr(other)
            );
            not_detected(
                kind,
                format_args!("the write into {:#x} went unnoticed", addr(obj)),
                out,
            )
        }
        Err(error) => {
            let _ = writeln!(out, "lkdtm: allocating again failed: {error}");
            not_detected(
                kind,
                format_args!("the write into {:#x} went unnoticed", addr(obj)),
                out,
            )
        }
    };
    Ok(verdict)
}

/// `READ_AFTER_FREE`: a word written into an object, the object freed, the
/// word read back. Poisoning would change it; without it the old value is
/// still there.
#[expect(
    clippy::cast_ptr_alignment,
    reason = "object starts are 8-aligned; MIDDLE is a multiple of 4"
)]
fn read_after_free(out: &mut dyn Write) -> Result<Verdict, LkdtmError> {
    const VALUE: u32 = 0x1234_5678;
    let kind = LkdtmType::ReadAfterFree;
    let mut scratch = Scratch::create("lkdtm-read-after-free", out)?;
    let obj = match scratch.alloc_sampled(KfencePlace::Right)? {
        Some(obj) => obj,
        None => scratch.alloc()?,
    };
    // SAFETY: an allocated 64-byte object of ours.
    unsafe { core::ptr::write_volatile(obj.as_ptr().add(MIDDLE).cast::<u32>(), VALUE) };
    let _ = writeln!(
        out,
        "lkdtm: allocated {:#x}, wrote {VALUE:#x} at offset {MIDDLE}, freeing it and reading it back",
        addr(obj)
    );
    if let Err(error) = scratch.free(obj) {
        scratch.quarantine(out);
        return Err(LkdtmError::Refused(error));
    }
    // SAFETY: the bug this command commits: `obj` is free, but its page
    // belongs to the scratch cache until the end of the run; a read
    // changes nothing.
    let seen = unsafe { core::ptr::read_volatile(obj.as_ptr().add(MIDDLE).cast::<u32>()) };
    let _ = writeln!(out, "lkdtm: read {seen:#x} from the freed object");
    if seen == VALUE || kfence_report_of_run().is_some() {
        Ok(not_detected(
            kind,
            format_args!("the freed object still held {VALUE:#x} (memory was not poisoned)"),
            out,
        ))
    } else {
        let _ = writeln!(
            out,
            "lkdtm: {kind}: detected: memory correctly poisoned ({seen:#x})"
        );
        Ok(Verdict::Detected)
    }
}

/// The `KFENCE_*` types: each takes a KFENCE sample from a scratch cache
/// (placed where its bug needs it) and commits the bug on it; the guard
/// pages, the unmapped freed page, the canary and the free's checks do the
/// rest (Linux `mm/kfence/kfence_test.c`).
fn kfence_bug(kind: LkdtmType, out: &mut dyn Write) -> Result<Verdict, LkdtmError> {
    let place = match kind {
        LkdtmType::KfenceOobLeft => KfencePlace::Left,
        _ => KfencePlace::Right,
    };
    let mut scratch = Scratch::create("lkdtm-kfence", out)?;
    let Some(obj) = scratch.alloc_sampled(place)? else {
        return Err(LkdtmError::NoSample);
    };
    let base = addr(obj);
    let _ = writeln!(
        out,
        "lkdtm: allocated {base:#x} ({SCRATCH_OBJ_SIZE} bytes), a KFENCE sample at its page's {}",
        if place == KfencePlace::Left {
            "start"
        } else {
            "end"
        }
    );
    let what = match kind {
        LkdtmType::KfenceOobLeft | LkdtmType::KfenceOobRight => {
            let at = if kind == LkdtmType::KfenceOobLeft {
                base - 1
            } else {
                base + SCRATCH_OBJ_SIZE
            };
            let _ = writeln!(out, "lkdtm: reading the byte at {at:#x}");
            // SAFETY: the bug this command commits: `at` is in the guard
            // page beside the sample; the fault is reported and the page
            // mapped back in (pool memory nobody uses); a read changes
            // nothing.
            let seen = unsafe { core::ptr::read_volatile(at as *const u8) };
            let _ = writeln!(out, "lkdtm: read {seen:#x}");
            let freed = scratch.free(obj);
            let _ = writeln!(out, "lkdtm: free of {base:#x}: {}", said(freed));
            "the read outside the object went unnoticed"
        }
        LkdtmType::KfenceCorruption => {
            let _ = writeln!(
                out,
                "lkdtm: writing 0x41 at {:#x}, 1 byte before it",
                base - 1
            );
            // SAFETY: the bug this command commits: the byte before a
            // sample at its page's end is the sample's own canary (pool
            // memory, mapped while the object is allocated).
            unsafe { core::ptr::write_volatile((base - 1) as *mut u8, 0x41) };
            let freed = scratch.free(obj);
            let _ = writeln!(out, "lkdtm: free of {base:#x}: {}", said(freed));
            "the write into the canary went unnoticed"
        }
        LkdtmType::KfenceDoubleFree => {
            if let Err(error) = scratch.free(obj) {
                return Err(LkdtmError::Refused(error));
            }
            // SAFETY: the bug this command commits: a second free of a
            // freed sample, refused by the pool without touching it.
            let again = unsafe { scratch.cache.free(obj) };
            let _ = writeln!(out, "lkdtm: second free of {base:#x}: {}", said(again));
            if let Err(error) = again {
                return Ok(detected(kind, error, out));
            }
            "the second free was accepted"
        }
        _ => {
            let inner = base + 8;
            // SAFETY: the bug this command commits: a pointer inside a
            // sample, refused by the pool without touching it.
            let bad = unsafe { SLAB.kfree(NonNull::new_unchecked(inner as *mut u8)) };
            let _ = writeln!(out, "lkdtm: kfree of {inner:#x} (inside it): {}", said(bad));
            let freed = scratch.free(obj);
            let _ = writeln!(out, "lkdtm: free of {base:#x}: {}", said(freed));
            if let Err(error) = bad {
                return Ok(detected(kind, error, out));
            }
            "the free of an inner pointer was accepted"
        }
    };
    Ok(not_detected(kind, format_args!("{what}"), out))
}
