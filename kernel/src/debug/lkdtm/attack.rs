//! The attack matrix of issue 33 as `lkdtm` types (`docs/HARDENING.md`,
//! the README's table): what an attacker with one heap bug tries, run on
//! the booted kernel's own allocator (`SLAB` on `KPAGES_QUARANTINED`, the
//! kernel's partitioned `kmalloc` sites), without debug flags, each ending
//! in the verdict its defence must give: `refused` (the allocator would
//! not do it), `detected` (it did it, noticed and reported, and kept the
//! damage from spreading) or `mitigated` (the attack ran and did not get
//! what it was after); `not detected` / `not mitigated` when the defence
//! is off. The host tests of the same rows are
//! `slab/src/tests/attack_matrix.rs`; `tests/attack_matrix.rs` (QEMU) and
//! `tests/e2e/test_attack_matrix.py` (the shell) run these functions and
//! check that each verdict turns when its defence is switched off.
//!
//! As for every `lkdtm` type, bugs are committed on scratch caches
//! (`lkdtm-*`) that nothing else uses, and KFENCE sampling is off during a
//! run ([`NoSampling`]: a sample would take the victim out of its slab).
//! The two partition rows allocate from the kernel's `kmalloc` classes, as
//! the attack would, and free everything they took.

use core::fmt::{self, Write};
use core::ptr::NonNull;

use magpie_slab::reports::{ErrorKind, ErrorReport};
use magpie_slab::{KmallocArgs, KmallocObj, PAGE_SIZE};

use super::{LkdtmError, LkdtmType, RUN_START, Scratch, Verdict, addr, alloc, said};
use crate::kmem::{KPAGES_QUARANTINED, SLAB};
use crate::profiling::tagged::kmalloc_site;

/// KFENCE sampling off while it lives, the interval it had back after (a
/// sample would take a row's victim out of its slab).
pub(crate) struct NoSampling(u64);

impl NoSampling {
    pub(crate) fn new() -> Self {
        let interval_ms = SLAB.kfence().stats().interval_ms;
        SLAB.kfence().set_interval(0);
        Self(interval_ms)
    }
}

impl Drop for NoSampling {
    fn drop(&mut self) {
        if self.0 != 0 {
            SLAB.kfence().set_interval(self.0);
        }
    }
}

/// The first report of `kind` about `cache` (and about the object at
/// `object`, if given) the allocator made during this run.
fn report_in(cache: &str, kind: ErrorKind, object: Option<usize>) -> Option<ErrorReport> {
    let mut reports = [ErrorReport::new(kind, "", 0); 16];
    let nr = SLAB.debug().read_errors(
        RUN_START.load(core::sync::atomic::Ordering::Relaxed),
        &mut reports,
    );
    reports[..nr].iter().copied().find(|report| {
        report.kind == kind
            && report.cache.as_str() == cache
            && object.is_none_or(|object| report.buffer == object || report.object == object)
    })
}

fn verdict(
    kind: LkdtmType,
    verdict: Verdict,
    what: fmt::Arguments<'_>,
    out: &mut dyn Write,
) -> Verdict {
    let _ = writeln!(out, "lkdtm: {kind}: {}: {what}", verdict.word());
    verdict
}

/// Allocations `UAF_WRITE_DOUBLE_FREE` takes after the double free, looking
/// for the object a second time (more than a magazine and a slab).
const NR_TAKES: usize = 256;

/// `UAF_WRITE_DOUBLE_FREE` (row 1): an object freed, 0 written over its
/// first word (where the free key is), freed again, then [`NR_TAKES`]
/// allocations; 64-byte and 8-byte caches. The second free is accepted
/// (the key is gone); the copy it put in the magazine is reported
/// `buffer modified after being freed` when it leaves the magazine and is
/// never handed out. **Detected** if, for both sizes, the object came
/// back at most once and the report was made. The reported copy stays
/// busy in its slab for good, so each scratch cache is left in place
/// (quarantined) after its objects are freed.
pub(crate) fn uaf_write_double_free(out: &mut dyn Write) -> Result<Verdict, LkdtmError> {
    let kind = LkdtmType::UafWriteDoubleFree;
    let _sampling = NoSampling::new();
    let mut twice = None;
    let mut unreported = None;
    for (name, size) in [("lkdtm-uaf-write-64", 64), ("lkdtm-uaf-write-8", 8)] {
        let mut scratch = Scratch::create_sized(name, size, out)?;
        let victim = scratch.alloc()?;
        let _ = writeln!(
            out,
            "lkdtm: allocated {:#x}, freeing it, writing 0 over its first word, freeing it again",
            addr(victim)
        );
        if let Err(error) = scratch.free(victim) {
            scratch.quarantine(out);
            return Err(LkdtmError::Refused(error));
        }
        // SAFETY: the bug this type commits: `victim` is free, in this
        // CPU's magazine of our scratch cache (whose pages stay ours until
        // the cache is destroyed); its first word is 8-aligned and inside
        // the object (objects are at least 8 bytes).
        unsafe { (addr(victim) as *mut usize).write_volatile(0) };
        // SAFETY: the double free the write lets through: the allocator
        // takes it into the magazine without touching other memory.
        let second = unsafe { scratch.cache.free(victim) };
        let _ = writeln!(out, "lkdtm: second free: {}", said(second));
        let mut copies = 0;
        for _ in 0..NR_TAKES {
            if scratch.alloc()? == victim {
                copies += 1;
            }
        }
        let _ = writeln!(
            out,
            "lkdtm: the next {NR_TAKES} allocations returned {:#x} {}",
            addr(victim),
            match copies {
                0 => "never",
                1 => "once",
                2 => "twice",
                _ => "more than twice",
            }
        );
        if copies > 1 {
            // Held twice: free it once.
            scratch.release(victim);
            twice.get_or_insert(name);
        } else if second.is_ok()
            && report_in(name, ErrorKind::ModifiedAfterFree, Some(addr(victim))).is_none()
        {
            unreported.get_or_insert(name);
        }
        if let Err(error) = scratch.free_held() {
            let _ = writeln!(out, "lkdtm: freeing the taken objects: {error}");
        }
        scratch.quarantine(out);
    }
    Ok(match (twice, unreported) {
        (Some(name), _) => verdict(
            kind,
            Verdict::NotDetected,
            format_args!("an object of {name} was handed out twice"),
            out,
        ),
        (None, Some(name)) => verdict(
            kind,
            Verdict::NotDetected,
            format_args!("the second copy in {name} was not reported"),
            out,
        ),
        (None, None) => verdict(
            kind,
            Verdict::Detected,
            format_args!(
                "{} (64 and 8 bytes), each object handed out once",
                ErrorKind::ModifiedAfterFree.headline()
            ),
            out,
        ),
    })
}

/// Most objects a slab of the `FREELIST_FORGE_*` scratch cache may have.
const MAX_SLAB_OBJS: usize = 128;
/// Allocations `FREELIST_FORGE_*` takes after forging the links.
const NR_FORGED_TAKES: usize = 200;

/// `FREELIST_FORGE_SAME` / `_OTHER` / `_OUTSIDE` (row 3): a slab filled
/// once (so that its free objects are threaded on its free list; before,
/// a new slab hands out from its bitmap and a free object holds no link),
/// all but one object freed and reaped back into it, then every free
/// object's link word (offset 8; the first word holds the free key)
/// overwritten with a pointer to the busy object, to an object of another
/// scratch cache, or to the allocator's own static `SLAB`. **Refused** if
/// the next [`NR_FORGED_TAKES`] allocations never return the target and
/// the allocator reported `free list corrupted` (it rebuilds the list
/// from the slab's bitmap).
pub(crate) fn freelist_forge(kind: LkdtmType, out: &mut dyn Write) -> Result<Verdict, LkdtmError> {
    let _sampling = NoSampling::new();
    let mut other = match kind {
        LkdtmType::FreelistForgeOther => Some(Scratch::create("lkdtm-forge-other", out)?),
        _ => None,
    };
    let name = match kind {
        LkdtmType::FreelistForgeSame => "lkdtm-forge-same",
        LkdtmType::FreelistForgeOther => "lkdtm-forge-another",
        _ => "lkdtm-forge-outside",
    };
    let mut scratch = Scratch::create(name, out)?;
    let first = scratch.alloc()?;
    let nr_objs = scratch.cache.stats().nr_total_objs;
    if nr_objs > MAX_SLAB_OBJS {
        return Err(LkdtmError::Layout);
    }
    let mut freed = [0usize; MAX_SLAB_OBJS];
    for slot in &mut freed[1..nr_objs] {
        *slot = addr(scratch.alloc()?);
    }
    for &obj in &freed[1..nr_objs] {
        let obj = NonNull::new(obj as *mut u8).ok_or(LkdtmError::Layout)?;
        if let Err(error) = scratch.free(obj) {
            scratch.quarantine(out);
            return Err(LkdtmError::Refused(error));
        }
    }
    scratch.cache.reap();
    let target = match other.as_mut() {
        Some(other) => addr(other.alloc()?),
        None if kind == LkdtmType::FreelistForgeSame => addr(first),
        None => &raw const SLAB as usize,
    };
    let _ = writeln!(
        out,
        "lkdtm: filled a slab of {name} ({nr_objs} objects), freed all but {:#x}; writing {target:#x} ({}) into the link of its {} free objects",
        addr(first),
        match kind {
            LkdtmType::FreelistForgeSame => "the busy object",
            LkdtmType::FreelistForgeOther => "an object of lkdtm-forge-other",
            _ => "the allocator's static SLAB",
        },
        nr_objs - 1
    );
    for &obj in &freed[1..nr_objs] {
        // SAFETY: the bug this type commits: `obj` is a free object of our
        // scratch cache's slab (its pages are ours until the cache is
        // destroyed); offset 8 is inside it (64 bytes) and 8-aligned.
        unsafe { ((obj + 8) as *mut usize).write_volatile(target) };
    }
    let mut followed = false;
    for _ in 0..NR_FORGED_TAKES {
        let obj = scratch.alloc()?;
        if addr(obj) == target {
            // Never free what the forged link handed out.
            scratch.release(obj);
            followed = true;
            break;
        }
    }
    let _ = writeln!(
        out,
        "lkdtm: the next {NR_FORGED_TAKES} allocations {} {target:#x}",
        if followed {
            "returned"
        } else {
            "never returned"
        }
    );
    let report = report_in(name, ErrorKind::FreeListCorrupted, None);
    if followed {
        // The list is the attacker's: nothing of either cache is freed.
        scratch.quarantine(out);
        if let Some(other) = other.as_mut() {
            other.quarantine(out);
        }
        return Ok(verdict(
            kind,
            Verdict::NotDetected,
            format_args!("the forged link was followed: {target:#x} handed out"),
            out,
        ));
    }
    Ok(match report {
        Some(report) => verdict(
            kind,
            Verdict::Refused,
            format_args!(
                "{} in {}, slab {:#x}: never followed, the list rebuilt",
                report.kind.headline(),
                report.cache,
                report.slab
            ),
            out,
        ),
        None => verdict(
            kind,
            Verdict::NotDetected,
            format_args!("the forged links were not followed but nothing was reported"),
            out,
        ),
    })
}

/// Objects of the kernel's `kmalloc` classes a partition row holds, freed
/// with `kfree` when it ends.
struct Kmallocs {
    objs: [Option<NonNull<u8>>; NR_REUSE],
}

impl Kmallocs {
    const fn new() -> Self {
        Self {
            objs: [None; NR_REUSE],
        }
    }

    /// Holds `obj` (already allocated).
    fn hold(&mut self, obj: NonNull<u8>) -> NonNull<u8> {
        if let Some(slot) = self.objs.iter_mut().find(|slot| slot.is_none()) {
            *slot = Some(obj);
        }
        obj
    }

    /// Frees every held object.
    fn free_all(&mut self) {
        for obj in self.objs.iter_mut().filter_map(Option::take) {
            // SAFETY: held objects came from `SLAB`'s kmalloc classes and
            // are ours alone; each is freed once.
            if let Err(error) = unsafe { SLAB.kfree(obj) } {
                log::error!("lkdtm: kfree of {:#x}: {error}", addr(obj));
            }
        }
    }
}

impl Drop for Kmallocs {
    fn drop(&mut self) {
        self.free_all();
    }
}

/// Objects a partition row frees from one site (or type) and then
/// allocates from the other.
const NR_REUSE: usize = 100;
/// `kmalloc(64)` call sites of `KMALLOC_SITE_REUSE`.
const NR_SITES: usize = 6;

/// One `kmalloc(64)` from call site `site` (six sites, each its own
/// source line: the partition is chosen by the site's location hashed
/// with the boot's seed). The same call `kmalloc!` makes, without a code
/// tag (nothing is charged to these sites) and behind `lkdtm`'s one fault
/// point; under `random_kmalloc_caches=0` every site gets `kmalloc-64`.
fn kmalloc_at(site: usize) -> Result<NonNull<u8>, LkdtmError> {
    match site {
        0 => alloc(|| kmalloc_site(64, 8, None)),
        1 => alloc(|| kmalloc_site(64, 8, None)),
        2 => alloc(|| kmalloc_site(64, 8, None)),
        3 => alloc(|| kmalloc_site(64, 8, None)),
        4 => alloc(|| kmalloc_site(64, 8, None)),
        _ => alloc(|| kmalloc_site(64, 8, None)),
    }
}

/// The cache `obj` belongs to (`kfence` for a KFENCE sample, which is in
/// no slab).
fn cache_of(obj: NonNull<u8>) -> &'static str {
    SLAB.debug()
        .whatis(addr(obj))
        .map_or("kfence", |info| info.cache.name())
}

/// `KMALLOC_SITE_REUSE` (row 4): six `kmalloc(64)` call sites draw their
/// caches; two in different caches are picked (any two when all share
/// one), the first allocates and frees [`NR_REUSE`] objects, the second
/// allocates [`NR_REUSE`]. **Mitigated** if the two sites are in
/// different random copies (`kmalloc-rnd-NN-64`) and the second got none
/// of the first's objects; with `random_kmalloc_caches=0` every site is
/// in `kmalloc-64` and the second gets the first's objects back.
pub(crate) fn kmalloc_site_reuse(out: &mut dyn Write) -> Result<Verdict, LkdtmError> {
    let kind = LkdtmType::KmallocSiteReuse;
    let _sampling = NoSampling::new();
    let mut names = [""; NR_SITES];
    for (site, name) in names.iter_mut().enumerate() {
        let obj = kmalloc_at(site)?;
        *name = cache_of(obj);
        // SAFETY: just allocated from a kmalloc class, ours.
        let _ = unsafe { SLAB.kfree(obj) };
    }
    let _ = writeln!(
        out,
        "lkdtm: {NR_SITES} kmalloc(64) call sites allocate from {}",
        List(&names)
    );
    let (a, b) = (0..NR_SITES)
        .flat_map(|a| (0..NR_SITES).map(move |b| (a, b)))
        .find(|&(a, b)| names[a] != names[b])
        .unwrap_or((0, 1));
    let mut freed = Kmallocs::new();
    for _ in 0..NR_REUSE {
        freed.hold(kmalloc_at(a)?);
    }
    let freed_addrs = freed.objs;
    freed.free_all();
    let mut got = Kmallocs::new();
    let mut shared = 0;
    for _ in 0..NR_REUSE {
        let obj = got.hold(kmalloc_at(b)?);
        shared += usize::from(freed_addrs.contains(&Some(obj)));
    }
    let _ = writeln!(
        out,
        "lkdtm: site {a} ({}) allocated and freed {NR_REUSE} objects; site {b} ({}) then allocated {NR_REUSE}: {shared} of them were site {a}'s",
        names[a], names[b]
    );
    drop(got);
    Ok(if names[a] != names[b] && shared == 0 {
        verdict(
            kind,
            Verdict::Mitigated,
            format_args!("sites in different random copies never got each other's objects"),
            out,
        )
    } else {
        verdict(
            kind,
            Verdict::NotMitigated,
            format_args!(
                "site {b} got {shared} of the {NR_REUSE} objects site {a} freed ({} and {})",
                names[a], names[b]
            ),
            out,
        )
    })
}

/// Names, comma-separated.
struct List<'a>(&'a [&'a str]);

impl fmt::Display for List<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (index, name) in self.0.iter().enumerate() {
            if index > 0 {
                f.write_str(", ")?;
            }
            f.write_str(name)?;
        }
        Ok(())
    }
}

/// A 64-byte type that holds a pointer (a list node): what an attacker
/// wants to overlay with bytes it controls.
struct Node {
    _next: *mut Node,
    _payload: [u64; 7],
}

impl KmallocObj for Node {}

/// `KMALLOC_TYPE_REUSE` (row 4, typed): [`NR_REUSE`] `[u8; 64]` (data the
/// attacker could fill) allocated with `KmallocArgs::of` and freed, then
/// [`NR_REUSE`] 64-byte `Node`s, which hold a pointer. **Mitigated** if
/// the data came from `kmalloc-data-64`, the nodes from a random copy,
/// and no node got a freed data object.
pub(crate) fn kmalloc_type_reuse(out: &mut dyn Write) -> Result<Verdict, LkdtmError> {
    let kind = LkdtmType::KmallocTypeReuse;
    let _sampling = NoSampling::new();
    let mut data = Kmallocs::new();
    for _ in 0..NR_REUSE {
        data.hold(alloc(|| SLAB.kmalloc_with(KmallocArgs::of::<[u8; 64]>()))?);
    }
    let data_cache = data.objs[0].map_or("", cache_of);
    let freed_addrs = data.objs;
    data.free_all();
    let mut nodes = Kmallocs::new();
    let mut shared = 0;
    for _ in 0..NR_REUSE {
        let obj = nodes.hold(alloc(|| SLAB.kmalloc_with(KmallocArgs::of::<Node>()))?);
        shared += usize::from(freed_addrs.contains(&Some(obj)));
    }
    let node_cache = nodes.objs[0].map_or("", cache_of);
    let _ = writeln!(
        out,
        "lkdtm: {NR_REUSE} [u8; 64] from {data_cache} freed, then {NR_REUSE} 64-byte nodes holding a pointer from {node_cache}: {shared} of them were freed data"
    );
    drop(nodes);
    Ok(if data_cache != node_cache && shared == 0 {
        verdict(
            kind,
            Verdict::Mitigated,
            format_args!("pointer-free data and pointers never share an object"),
            out,
        )
    } else {
        verdict(
            kind,
            Verdict::NotMitigated,
            format_args!("{shared} of {NR_REUSE} nodes got a freed data object"),
            out,
        )
    })
}

/// Slabs `CROSS_CACHE_REUSE`'s victim fills and has reaped.
const NR_VICTIM_SLABS: usize = 3;
/// Objects `CROSS_CACHE_REUSE`'s attacker allocates.
const NR_ATTACKER_OBJS: usize = 300;
/// Most pages the victim's slabs may span.
const MAX_VICTIM_PAGES: usize = 16;

/// `CROSS_CACHE_REUSE` (row 7; SLUBStick's first step): a victim cache
/// (64-byte objects) fills [`NR_VICTIM_SLABS`] slabs, frees every object
/// and is reaped; an attacker cache (128-byte objects: one-page slabs, as the victim's) then allocates
/// [`NR_ATTACKER_OBJS`]. **Mitigated** if none of the attacker's objects
/// is in a page the victim's slabs had: the reaped pages wait in the
/// kernel's quarantine (`KPAGES_QUARANTINED`, 256 pages). With
/// `through_quarantine` false the quarantine is flushed after the reap,
/// as if it were off (how `tests/attack_matrix.rs` shows that the row
/// fails without it); the shell's type passes true.
///
/// # Errors
/// [`LkdtmError`] if a scratch cache or an object could not be had, or a
/// correct free was refused; what was done is undone.
pub fn cross_cache_reuse(
    out: &mut dyn Write,
    through_quarantine: bool,
) -> Result<Verdict, LkdtmError> {
    let kind = LkdtmType::CrossCacheReuse;
    let _sampling = NoSampling::new();
    let mut victim = Scratch::create("lkdtm-cross-victim", out)?;
    let first = victim.alloc()?;
    let nr_objs = NR_VICTIM_SLABS * victim.cache.stats().nr_total_objs;
    let mut pages = [0usize; MAX_VICTIM_PAGES];
    let mut nr_pages = 0;
    let mut note = |obj: NonNull<u8>| {
        let page = addr(obj) & !(PAGE_SIZE - 1);
        if !pages[..nr_pages].contains(&page) && nr_pages < MAX_VICTIM_PAGES {
            pages[nr_pages] = page;
            nr_pages += 1;
        }
    };
    note(first);
    for _ in 1..nr_objs {
        note(victim.alloc()?);
    }
    if let Err(error) = victim.free_held() {
        victim.quarantine(out);
        return Err(LkdtmError::Refused(error));
    }
    let nr_reaped = victim.cache.reap();
    let _ = writeln!(
        out,
        "lkdtm: {} filled {NR_VICTIM_SLABS} slabs ({nr_objs} objects, {nr_pages} pages), freed them all; the reap gave back {nr_reaped} slabs",
        victim.name()
    );
    if !through_quarantine {
        let nr_flushed = KPAGES_QUARANTINED.flush();
        let _ = writeln!(
            out,
            "lkdtm: quarantine flushed ({nr_flushed} pages back to kpages): the defence off"
        );
    }
    let mut attacker = Scratch::create_sized("lkdtm-cross-attacker", 128, out)?;
    let mut reused = 0;
    for _ in 0..NR_ATTACKER_OBJS {
        let obj = attacker.alloc()?;
        reused += usize::from(pages[..nr_pages].contains(&(addr(obj) & !(PAGE_SIZE - 1))));
    }
    let held = KPAGES_QUARANTINED.nr_pages_held();
    let _ = writeln!(
        out,
        "lkdtm: {} allocated {NR_ATTACKER_OBJS} objects: {reused} in the victim's old pages ({held} pages in the quarantine)",
        attacker.name()
    );
    Ok(if nr_reaped > 0 && reused == 0 {
        verdict(
            kind,
            Verdict::Mitigated,
            format_args!(
                "no object of {} landed in the pages {} gave back",
                attacker.name(),
                victim.name()
            ),
            out,
        )
    } else {
        verdict(
            kind,
            Verdict::NotMitigated,
            format_args!(
                "{reused} of {NR_ATTACKER_OBJS} objects of {} landed in the pages {} gave back ({nr_reaped} slabs reaped)",
                attacker.name(),
                victim.name()
            ),
            out,
        )
    })
}

/// Objects `HEAP_SPRAY_ORDER` takes from a fresh slab.
const NR_SPRAY: usize = 32;
/// Most of them that may follow their predecessor in memory for the
/// layout to count as unpredictable (31 in address order; a random order
/// of a 62-object slab gives about one).
const MAX_ADJACENT: usize = 7;

/// `HEAP_SPRAY_ORDER` (row 6): [`NR_SPRAY`] objects from a fresh slab of
/// a scratch cache; how many sit right after the one allocated before.
/// **Mitigated** if at most [`MAX_ADJACENT`] do (the slab hands out at
/// random indices, `SLAB_FREELIST_RANDOM`); a cache with slab debug flags
/// keeps address order (`slab_debug=Z,lkdtm-heap-spray`: not mitigated).
pub(crate) fn heap_spray_order(out: &mut dyn Write) -> Result<Verdict, LkdtmError> {
    let kind = LkdtmType::HeapSprayOrder;
    let _sampling = NoSampling::new();
    let mut scratch = Scratch::create("lkdtm-heap-spray", out)?;
    let stride = scratch.cache.stride();
    let mut adjacent = 0;
    let mut previous = addr(scratch.alloc()?);
    for _ in 1..NR_SPRAY {
        let obj = addr(scratch.alloc()?);
        adjacent += usize::from(obj == previous + stride);
        previous = obj;
    }
    let _ = writeln!(
        out,
        "lkdtm: {NR_SPRAY} objects from a fresh slab ({stride}-byte stride): {adjacent} of {} follow their predecessor in memory",
        NR_SPRAY - 1
    );
    Ok(if adjacent <= MAX_ADJACENT {
        verdict(
            kind,
            Verdict::Mitigated,
            format_args!("the slab hands its objects out in a random order"),
            out,
        )
    } else {
        verdict(
            kind,
            Verdict::NotMitigated,
            format_args!("{adjacent} of {} objects in address order", NR_SPRAY - 1),
            out,
        )
    })
}
