//! `magpie-kmem core`'s reader on a real heap: magpie-slab running on the
//! host builds a known state, then the reader reads that allocator
//! through its debug descriptor from this process's memory
//! (`/proc/self/mem`, the same code that reads a QEMU core) and must
//! print what the library's own reports print; then the same heap read
//! through overlays that corrupt it must give one clear problem per
//! broken structure, never a panic.

use std::alloc::Layout;
use std::cell::Cell;
use std::collections::HashMap;
use std::ptr::NonNull;
use std::sync::{Mutex, MutexGuard};

use magpie_kmem::core::events::write_events;
use magpie_kmem::core::heap::{Heap, decode_descriptor, descriptor_bytes};
use magpie_kmem::core::image::{ElfCore, Memory, ProcessMemory, ReadError};
use magpie_kmem::core::{Report, write_report};
use magpie_slab::descriptor::{
    ArenaDescription, ArenaFigure, DESCRIPTOR_VERSION, DescriptorLayout, MAGPIE_SLAB_DESCRIPTOR,
};
use magpie_slab::kmemtrace::{DumpInfo, KmemtraceConfig};
use magpie_slab::reports::SlabtopSort;
use magpie_slab::{
    AllocError, AllocTagHooks, ArenaStats, Kmem, PAGE_SIZE, PageSource, Platform, PlatformHooks,
    reports,
};

const NR_CPUS: usize = 2;

std::thread_local! {
    static CPU: Cell<usize> = const { Cell::new(0) };
}

fn set_cpu(cpu: usize) {
    CPU.with(|c| c.set(cpu));
}

/// Two CPUs acted by one thread (`set_cpu`), no interrupts.
struct HostPlatform;

// SAFETY: the allocator is driven from one thread at a time (the tests
// take `LOCK`), so the CPU id it sets is the running "CPU"; no interrupts;
// the default `cross_cpu_call` runs the work on this thread, exclusive
// with every CPU's sections.
unsafe impl Platform for HostPlatform {
    fn max_cpus() -> usize {
        NR_CPUS
    }
    fn cpu_id() -> usize {
        CPU.with(|c| c.get())
    }
    fn irq_save() -> usize {
        0
    }
    fn irq_restore(_state: usize) {}
    fn now() -> u64 {
        0
    }
}

// SAFETY: the hooks keep PlatformHooks' contract: the KFENCE pool (if any) is
// mapped and the platform's own, and charge tokens are the ones the token hooks
// return.
unsafe impl PlatformHooks for HostPlatform {
    fn backtrace(_frames: &mut [usize]) -> usize {
        0
    }
    fn context(_buf: &mut [u8; 32]) -> usize {
        0
    }
}

// SAFETY: the defaults: no tags.
unsafe impl AllocTagHooks for HostPlatform {}

/// Pages from one leaked region (bump allocation, frees ignored).
struct HostPages {
    base: usize,
    end: usize,
    next: Mutex<usize>,
}

impl PageSource for HostPages {
    fn name(&self) -> &str {
        "host"
    }
    fn alloc_pages(&self, nr_pages: usize) -> Result<NonNull<u8>, AllocError> {
        let mut next = self.next.lock().unwrap();
        let end = *next + nr_pages * PAGE_SIZE;
        if nr_pages == 0 || end > self.end {
            return Err(AllocError::OutOfMemory);
        }
        let addr = *next;
        *next = end;
        NonNull::new(addr as *mut u8).ok_or(AllocError::OutOfMemory)
    }
    unsafe fn free_pages(&self, _addr: NonNull<u8>, _nr_pages: usize) {}
    fn span(&self) -> (usize, usize) {
        (self.base, self.end)
    }
    fn stats(&self) -> ArenaStats {
        ArenaStats {
            total_bytes: self.end - self.base,
            alloc_bytes: *self.next.lock().unwrap() - self.base,
            nr_allocs_ever: 0,
        }
    }
}

static HEAP: Kmem<HostPlatform> = Kmem::new();
static PAGES: Mutex<Option<&'static HostPages>> = Mutex::new(None);
static LOCK: Mutex<Option<Vec<usize>>> = Mutex::new(None);

/// The heap, brought up once with a known state: objects held on both
/// CPUs in two size classes, some freed (resting in magazines), one
/// page-granular allocation. Returns the held objects.
fn heap() -> MutexGuard<'static, Option<Vec<usize>>> {
    let mut guard = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    if guard.is_none() {
        let bytes = 64 << 20;
        let layout = Layout::from_size_align(bytes, PAGE_SIZE).unwrap();
        // SAFETY: the layout has a non-zero size.
        let base = unsafe { std::alloc::alloc_zeroed(layout) } as usize;
        assert_ne!(base, 0);
        let pages = Box::leak(Box::new(HostPages {
            base,
            end: base + bytes,
            next: Mutex::new(base),
        }));
        set_cpu(0);
        HEAP.init(pages).unwrap();
        // kmemstat's arenas, as a kernel describes them: the page source
        // above the caches, a fixed-size one below.
        let next: *const usize = {
            let guard = pages.next.lock().unwrap();
            &raw const *guard
        };
        let described = magpie_slab::descriptor::describe_kmemstat(
            &[ArenaDescription {
                indent: 0,
                name: "host",
                quantum: PAGE_SIZE,
                total: ArenaFigure::constant((pages.end - pages.base) as u64),
                alloc: ArenaFigure::word(next, 1).minus(&raw const pages.base),
                nr_allocs_ever: ArenaFigure::constant(0),
            }],
            1,
            &[ArenaDescription {
                indent: 0,
                name: "fixed",
                quantum: 1,
                total: ArenaFigure::constant(4096),
                alloc: ArenaFigure::constant(100),
                nr_allocs_ever: ArenaFigure::constant(7),
            }],
        );
        assert!(described);
        *PAGES.lock().unwrap() = Some(pages);
        let mut held = Vec::new();
        for (cpu, size, count) in [(0, 64, 100), (1, 64, 30), (0, 192, 17), (1, 4000, 3)] {
            set_cpu(cpu);
            for _ in 0..count {
                held.push(HEAP.kmalloc(size, 8).unwrap().as_ptr() as usize);
            }
        }
        // Free every third object, on the other CPU (rounds in magazines).
        set_cpu(1);
        let mut kept = Vec::new();
        for (index, addr) in held.into_iter().enumerate() {
            if index % 3 == 0 {
                // SAFETY: allocated above, freed once.
                unsafe { HEAP.kfree(NonNull::new(addr as *mut u8).unwrap()).unwrap() };
            } else {
                kept.push(addr);
            }
        }
        set_cpu(0);
        kept.push(HEAP.kmalloc(5 * PAGE_SIZE, 8).unwrap().as_ptr() as usize);
        *guard = Some(kept);
    }
    guard
}

fn descriptor_addr() -> u64 {
    std::ptr::from_ref(&MAGPIE_SLAB_DESCRIPTOR) as u64
}

fn report(mem: &dyn Memory, report: &Report) -> (String, Vec<String>) {
    let mut out = String::new();
    let mut problems = Vec::new();
    write_report(mem, descriptor_addr(), report, &mut out, &mut problems).unwrap();
    (out, problems)
}

#[test]
fn descriptor_round_trips() {
    let _heap = heap();
    let mem = ProcessMemory::open().unwrap();
    let mut bytes = vec![0u8; descriptor_bytes()];
    mem.read(descriptor_addr(), &mut bytes).unwrap();
    let (header, layout) = decode_descriptor(descriptor_addr(), &bytes).unwrap();
    assert_eq!(header.allocator, std::ptr::from_ref(&HEAP) as u64);
    assert_eq!(&layout, magpie_slab::descriptor::layout());
    // Every entry is a constant or a field inside its structure.
    assert!(DescriptorLayout::NAMES.len() > 50);
    // (The error ring's 16 reports are the widest: 5.4 KiB; a reader
    // refuses past 64 KiB.)
    for (name, entry) in layout.entries() {
        assert!(entry.size <= 8192, "{name}: {entry:?}");
    }
    assert_eq!(layout.page_size.offset, PAGE_SIZE as u64);
    assert_eq!(
        layout.cache_size.offset,
        size_of::<magpie_slab::KmemCache<HostPlatform>>() as u64
    );
    assert_eq!(
        layout.allocator_size.offset,
        size_of::<Kmem<HostPlatform>>() as u64
    );
    // A reader of another version refuses, by name.
    let mut other = bytes.clone();
    other[16..20].copy_from_slice(&(DESCRIPTOR_VERSION + 1).to_le_bytes());
    let error = decode_descriptor(descriptor_addr(), &other).unwrap_err();
    assert!(error.contains("version"), "{error}");
    let mut wrong = bytes.clone();
    wrong[0] ^= 1;
    assert!(decode_descriptor(0, &wrong).unwrap_err().contains("magic"));
    assert!(
        decode_descriptor(0, &bytes[..40])
            .unwrap_err()
            .contains("cut short")
    );
}

#[test]
fn every_layout_entry_is_documented() {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/VMCORE.md"))
        .unwrap();
    for name in DescriptorLayout::NAMES {
        assert!(
            doc.contains(&format!("| `{name}` |")),
            "docs/VMCORE.md does not list descriptor entry {name}"
        );
    }
    assert!(doc.contains(&format!(
        "| 20 | 4 | header size: bytes to the layout ({}) |",
        magpie_slab::descriptor::DESCRIPTOR_HEADER_SIZE
    )));
}

#[test]
fn slabinfo_and_kmemstat_equal_the_live_reports() {
    let _heap = heap();
    let mem = ProcessMemory::open().unwrap();
    let (offline, problems) = report(&mem, &Report::Slabinfo);
    assert_eq!(problems, Vec::<String>::new());
    let mut live = String::new();
    reports::slabinfo(&mut live, &HEAP).unwrap();
    assert_eq!(offline, live);
    assert!(offline.lines().count() > 60, "{offline}");
    let kmalloc_64 = offline
        .lines()
        .find(|l| l.starts_with("kmalloc-64 "))
        .unwrap();
    // The setup allocated 130 and freed 44 into magazines: all 130 are out
    // of the slabs. Other tests of this file (run before this one or not,
    // in any order) may take one more from a slab and free it into a
    // magazine, which counts as active too: so at least 130, never fewer.
    let active: usize = kmalloc_64
        .split_whitespace()
        .nth(1)
        .and_then(|word| word.parse().ok())
        .unwrap_or_else(|| panic!("no active_objs in {kmalloc_64}"));
    assert!(active >= 130, "{kmalloc_64}");

    let (offline, problems) = report(&mem, &Report::Kmemstat);
    assert_eq!(problems, Vec::<String>::new());
    let pages = PAGES.lock().unwrap().unwrap();
    let mut live = String::new();
    reports::write_kmemstat_header(&mut live).unwrap();
    reports::KmemstatRow::arena(0, "host", PAGE_SIZE, pages.stats())
        .write(&mut live)
        .unwrap();
    reports::write_kmemstat_caches(&mut live, &HEAP, 1).unwrap();
    reports::KmemstatRow {
        indent: 0,
        name: "fixed",
        kind: 'A',
        objsize: 1,
        total: 4096,
        alloc: 100,
        nr_allocs_ever: 7,
        waste: 0,
    }
    .write(&mut live)
    .unwrap();
    assert_eq!(offline, live);
    assert!(offline.contains("\n    kmalloc-64 "), "{offline}");
}

#[test]
fn slabtop_once_equals_the_live_frame() {
    let _heap = heap();
    let mem = ProcessMemory::open().unwrap();
    for (key, sort) in [
        ("o", SlabtopSort::Objects),
        ("n", SlabtopSort::Name),
        ("m", SlabtopSort::Misses),
    ] {
        let (offline, problems) = report(&mem, &Report::Slabtop(sort));
        assert_eq!(problems, Vec::<String>::new());
        let mut live = String::new();
        let mut rows = vec![reports::EMPTY_SLABTOP_ROW; 256];
        let nr = reports::slabtop(&mut live, &HEAP, &mut rows, None, sort).unwrap();
        reports::write_slabtop_hits_note(&mut live, &rows[..nr]).unwrap();
        assert_eq!(offline, live, "sort {key}");
        assert!(offline.contains(" Magazines since boot "), "{offline}");
    }
}

/// The roots of the leak-scan round trip: a few held objects.
static ROOT_WORDS: [std::sync::atomic::AtomicUsize; 16] =
    [const { std::sync::atomic::AtomicUsize::new(0) }; 16];

#[test]
fn findleaks_equals_the_live_scan() {
    use magpie_kmem::core::findleaks::write_findleaks;
    use magpie_kmem::core::trace::KernelSymbols;
    use magpie_slab::leak_scan::{LeakEntry, LeakScan};
    use std::sync::atomic::Ordering;

    let held = heap();
    let held = held.as_ref().unwrap();
    // Every third held object is a root (the page-granular one too): the
    // rest leak.
    let roots: Vec<usize> = held.iter().step_by(3).copied().take(16).collect();
    for (word, &addr) in ROOT_WORDS.iter().zip(&roots) {
        word.store(addr, Ordering::Relaxed);
    }
    let range = ROOT_WORDS.as_ptr_range();
    let (start, end) = (range.start as usize, range.end as usize);
    assert!(magpie_slab::descriptor::describe_leak_roots(
        std::slice::from_ref(&(start..end)),
        &[],
        &[]
    ));
    // Live: the library's scan over the same root.
    let capacity = LeakScan::capacity(&HEAP) + 16;
    let mut memory: Vec<std::mem::MaybeUninit<LeakEntry>> = Vec::with_capacity(capacity);
    // SAFETY: MaybeUninit needs no initialisation; init_table writes all.
    unsafe { memory.set_len(capacity) };
    let table = LeakEntry::init_table(&mut memory);
    // SAFETY: nothing destroys a cache or returns pages meanwhile (the
    // heap's lock is held).
    let mut scan = unsafe { LeakScan::new(&HEAP, table) }.unwrap();
    // SAFETY: a static array: mapped and readable.
    unsafe { scan.scan_range(start, end) };
    let mut live = String::new();
    let mut header = false;
    let summary = scan.finish(|group| {
        if !header {
            reports::write_findleaks_header(&mut live).unwrap();
            header = true;
        }
        reports::write_findleaks_group(
            &mut live,
            group.cache.as_str(),
            group.nr_leaked,
            group.first,
            &"?",
        )
        .unwrap();
    });
    reports::write_findleaks_summary(&mut live, &summary).unwrap();
    // Offline: the reader's scan over this process's memory.
    let mem = ProcessMemory::open().unwrap();
    let heap_read = Heap::new(&mem, descriptor_addr()).unwrap();
    let mut offline = String::new();
    let mut problems = Vec::new();
    let offline_summary = write_findleaks(
        &heap_read,
        &[],
        None,
        &KernelSymbols::default(),
        &mut offline,
        &mut problems,
    )
    .unwrap();
    assert!(problems.is_empty(), "{problems:?}");
    assert_eq!(offline, live);
    assert_eq!(offline_summary, summary);
    // The held objects that are no roots leaked (those the roots point to
    // aside), in kmalloc-64, kmalloc-192 and kmalloc-4032 at least.
    assert!(summary.nr_leaked >= held.len() - roots.len() - 8, "{live}");
    for cache in ["kmalloc-64 ", "kmalloc-192 ", "kmalloc-4032 "] {
        assert!(live.contains(&format!("\n{cache}")), "{cache}: {live}");
    }
    assert!(summary.nr_resting > 0, "{live}");
    // No roots described: a clear error.
    assert!(magpie_slab::descriptor::describe_leak_roots(&[], &[], &[]));
    let error = write_findleaks(
        &heap_read,
        &[],
        None,
        &KernelSymbols::default(),
        &mut String::new(),
        &mut Vec::new(),
    )
    .unwrap_err();
    assert!(error.contains("no leak-scan roots"), "{error}");
}

#[test]
fn codetag_descriptor_round_trips() {
    use magpie_codetag::alloc_tag::{AllocTag, AllocTagCounters, ProfilingSwitch, UNTAGGED};
    use magpie_codetag::descriptor::{MAGPIE_CODETAG_DESCRIPTOR, describe_switch};
    use magpie_kmem::core::codetag::read_codetag_descriptor;
    use magpie_kmem::core::trace::KernelSymbols;

    static COUNTERS: AllocTagCounters = AllocTagCounters::new();
    static SWITCH: ProfilingSwitch = ProfilingSwitch::new(true);
    let bytes = AllocTagCounters::bytes_needed(NR_CPUS);
    let layout = Layout::from_size_align(bytes, AllocTagCounters::ALIGN).unwrap();
    // SAFETY: a non-zero size; leaked: the counters keep it for good.
    let memory = unsafe { std::slice::from_raw_parts_mut(std::alloc::alloc_zeroed(layout), bytes) };
    assert!(COUNTERS.init_static(memory, NR_CPUS));
    describe_switch(&SWITCH);
    let here: &'static AllocTag = magpie_codetag::alloc_tag!();
    let line = line!() - 1;
    COUNTERS.add(0, here.tag_ref(), 100);
    COUNTERS.add(1, here.tag_ref(), 28);
    COUNTERS.add(1, UNTAGGED.tag_ref(), 8);
    COUNTERS.sub(0, UNTAGGED.tag_ref(), 8);

    let mem = ProcessMemory::open().unwrap();
    let read = read_codetag_descriptor(&mem, std::ptr::from_ref(&MAGPIE_CODETAG_DESCRIPTOR) as u64)
        .unwrap();
    assert_eq!(read.counters, std::ptr::from_ref(&COUNTERS) as u64);
    assert_eq!(read.tags().1 as usize, AllocTag::all().len());
    let counts = read.counts(&mem).unwrap();
    for tag in AllocTag::all() {
        assert_eq!(
            counts[tag.tag_ref().get() as usize - 1],
            COUNTERS.read(tag.tag_ref())
        );
    }
    assert_eq!(
        (
            counts[here.tag_ref().get() as usize - 1].bytes,
            counts[here.tag_ref().get() as usize - 1].calls
        ),
        (128, 2)
    );
    let symbols = KernelSymbols::default();
    let tag = read
        .tag(&mem, &symbols, u64::from(here.tag_ref().get()))
        .unwrap();
    assert_eq!(
        (tag.file.as_str(), tag.line, tag.untagged),
        (file!(), line, false)
    );
    // No symbols (a PIE test binary's are not at their link addresses):
    // the function is unknown.
    assert_eq!(tag.function, "?");
    let untagged = read
        .tag(&mem, &symbols, u64::from(UNTAGGED.tag_ref().get()))
        .unwrap();
    assert_eq!(
        (
            untagged.file.as_str(),
            untagged.function.as_str(),
            untagged.untagged
        ),
        ("untagged", "untagged", true)
    );
    assert!(read.tag(&mem, &symbols, read.tags().1 + 1).is_err());
    // The switch, as the kernel's `allocinfo` reads it.
    let switch = read.switch(&mem).unwrap();
    assert!(
        switch.on && !switch.never && !switch.inaccurate,
        "{switch:?}"
    );
    SWITCH.disable().unwrap();
    SWITCH.enable().unwrap();
    assert!(read.switch(&mem).unwrap().inaccurate);
    SWITCH.disable().unwrap();
    assert!(!read.switch(&mem).unwrap().on);
    // Not a descriptor: refused.
    assert!(
        read_codetag_descriptor(&mem, descriptor_addr())
            .unwrap_err()
            .contains("magic")
    );
}

#[test]
fn whatis_finds_cache_object_and_state() {
    let held = heap();
    let held = held.as_ref().unwrap();
    let mem = ProcessMemory::open().unwrap();
    let format = magpie_slab::reports::RawFormat;
    for &addr in &held[..held.len() - 1] {
        for probe in [addr, addr + 5] {
            let (offline, problems) = report(&mem, &Report::Whatis(probe as u64));
            assert!(problems.is_empty(), "{problems:?}");
            let mut live = String::new();
            reports::whatis(&mut live, &HEAP, probe, &format).unwrap();
            assert_eq!(offline, live);
            assert!(offline.contains("is allocated from kmalloc-"), "{offline}");
        }
    }
    // An address in no slab.
    let (offline, _) = report(&mem, &Report::Whatis(0x1000));
    assert_eq!(offline, "0x1000 is not in any slab\n");
    // A freed object rests in a magazine; the report says so, as live.
    set_cpu(0);
    let object = HEAP.kmalloc(64, 8).unwrap();
    // SAFETY: allocated just above, freed once.
    unsafe { HEAP.kfree(object).unwrap() };
    let probe = object.as_ptr() as usize;
    let (offline, _) = report(&mem, &Report::Whatis(probe as u64));
    let mut live = String::new();
    reports::whatis(&mut live, &HEAP, probe, &format).unwrap();
    assert_eq!(offline, live);
    assert!(
        offline.contains("is free in kmalloc-64 (in a magazine)"),
        "{offline}"
    );
}

#[test]
fn events_equal_the_kernels_own_dump() {
    let _heap = heap();
    let mem = ProcessMemory::open().unwrap();
    set_cpu(0);
    HEAP.kmemtrace()
        .start(KmemtraceConfig {
            nr_subbufs: 2,
            stack_depth: 4,
            ..Default::default()
        })
        .unwrap();
    HEAP.kmemtrace().mark("kmalloc 96 40");
    let mut held = Vec::new();
    for index in 0..1500 {
        set_cpu(index % 2);
        held.push(HEAP.kmalloc(96, 8).unwrap());
    }
    for object in held {
        // SAFETY: allocated above, freed once.
        unsafe { HEAP.kfree(object).unwrap() };
    }
    HEAP.kmemtrace().stop();
    let mut live = Vec::new();
    let identity = |ticks: u64| ticks;
    let info = DumpInfo {
        build_id: [0; 20],
        ticks_to_ns: &identity,
    };
    let live_summary = HEAP
        .kmemtrace()
        .dump(&info, &mut |chunk| live.extend_from_slice(chunk));
    let heap = Heap::new(&mem, descriptor_addr()).unwrap();
    let mut offline = Vec::new();
    let mut problems = Vec::new();
    let summary = write_events(
        &heap,
        [0; 20],
        &mut |chunk| offline.extend_from_slice(chunk),
        &mut problems,
    )
    .unwrap();
    assert!(problems.is_empty(), "{problems:?}");
    assert!(summary.raw_ticks);
    assert_eq!(summary.dump, live_summary);
    // 1,500 allocations and 1,500 frees, those past a full ring counted.
    assert_eq!(
        summary.dump.nr_events + summary.dump.nr_overruns,
        3000,
        "{summary:?}"
    );
    assert!(offline == live, "the dumps differ");
}

/// This process's memory with some words replaced.
struct Corrupted<'a> {
    mem: &'a dyn Memory,
    words: HashMap<u64, u64>,
}

impl Memory for Corrupted<'_> {
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), ReadError> {
        self.mem.read(addr, buf)?;
        for (&at, &value) in &self.words {
            for (index, byte) in value.to_le_bytes().iter().enumerate() {
                let byte_at = at + index as u64;
                if byte_at >= addr && byte_at < addr + buf.len() as u64 {
                    buf[(byte_at - addr) as usize] = *byte;
                }
            }
        }
        Ok(())
    }
}

#[test]
fn corrupted_heap_gives_one_problem_per_structure() {
    let _heap = heap();
    let mem = ProcessMemory::open().unwrap();
    let heap = Heap::new(&mem, descriptor_addr()).unwrap();
    let (caches, problems) = heap.caches();
    assert!(problems.is_empty());
    let layout = heap.layout;
    let victim = caches.iter().find(|c| c.name == "kmalloc-192").unwrap();
    let slab = victim.slabs[0].addr;

    // A slab's next pointer into nowhere, a magic cleared, a list count
    // wrong: each one problem naming the cache; the others are reported.
    let cases: [(u64, u64, &str); 3] = [
        (slab + layout.slab_next.offset, 0xdead_0000_0000, "slab"),
        (slab + layout.slab_magic.offset, 0, "bad magic"),
        (
            victim.addr + layout.cache_name_len.offset,
            999,
            "name length",
        ),
    ];
    for (at, value, expect) in cases {
        let corrupted = Corrupted {
            mem: &mem,
            words: HashMap::from([(at, value)]),
        };
        let (out, problems) = report(&corrupted, &Report::Slabinfo);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].contains(expect), "{problems:?}");
        assert!(out.contains("kmalloc-64 "), "the other caches are reported");
        assert!(
            !out.contains("kmalloc-192 "),
            "the broken cache is left out"
        );
    }

    // The cache list looping back onto itself stops the walk, once.
    let links = victim.addr + layout.cache_links.offset + layout.cache_links_next.offset;
    let corrupted = Corrupted {
        mem: &mem,
        words: HashMap::from([(links, caches[0].addr)]),
    };
    let (_, problems) = report(&corrupted, &Report::Slabinfo);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(problems[0].contains("loops back"), "{problems:?}");

    // Every word of a cache's struct and its first slab header flipped in
    // turn (all bits): no panic, and any problem names a cache.
    for base in [victim.addr, slab] {
        for word in 0..(layout.cache_size.offset / 8) {
            let at = base + word * 8;
            let mut original = [0u8; 8];
            if mem.read(at, &mut original).is_err() {
                continue;
            }
            let corrupted = Corrupted {
                mem: &mem,
                words: HashMap::from([(at, !u64::from_le_bytes(original))]),
            };
            let mut out = String::new();
            let mut problems = Vec::new();
            write_report(
                &corrupted,
                descriptor_addr(),
                &Report::Verify,
                &mut out,
                &mut problems,
            )
            .unwrap();
            for problem in &problems {
                assert!(problem.starts_with("cache "), "{problem}");
            }
        }
    }
}

#[test]
fn hostile_cores_are_refused_with_one_error() {
    assert!(
        ElfCore::parse(b"not an elf".to_vec())
            .err()
            .unwrap()
            .contains("not a 64-bit ELF")
    );
    let mut elf = vec![0u8; 64];
    elf[..4].copy_from_slice(b"\x7fELF");
    elf[4] = 2; // 64-bit
    elf[5] = 1; // little-endian
    elf[6] = 1;
    elf[16] = 4; // ET_CORE
    elf[18] = 62; // x86-64
    let error = ElfCore::parse(elf).err().unwrap();
    assert!(
        error.contains("no memory") || error.contains("not a readable"),
        "{error}"
    );
}

#[test]
fn kfence_without_a_pool_reads_as_the_live_figures() {
    let _heap = heap();
    let mem = ProcessMemory::open().unwrap();
    let heap = Heap::new(&mem, descriptor_addr()).unwrap();
    let mut out = String::new();
    let mut problems = Vec::new();
    magpie_kmem::core::kfence::write_kfence(
        &heap,
        false,
        &magpie_slab::reports::RawFormat,
        &mut out,
        &mut problems,
    )
    .unwrap();
    assert!(problems.is_empty(), "{problems:?}");
    let mut live = String::new();
    reports::write_kfence_stats(&mut live, &HEAP.kfence().stats()).unwrap();
    assert_eq!(out, live);
    assert_eq!(out, "kfence: off (no pool)\n");
}

#[test]
fn errors_equal_the_live_report() {
    let _heap = heap();
    // A free of memory the allocator never handed out: one report.
    let foreign = Box::leak(Box::new([0u64; 8]));
    // SAFETY: a bad free on purpose: the allocator refuses it and reports.
    let refused = unsafe { HEAP.kfree(NonNull::from(&mut foreign[0]).cast()) };
    assert!(refused.is_err());
    let mem = ProcessMemory::open().unwrap();
    let heap = Heap::new(&mem, descriptor_addr()).unwrap();
    let mut out = String::new();
    let mut problems = Vec::new();
    magpie_kmem::core::errors::write_error_reports(
        &heap,
        &magpie_slab::reports::RawFormat,
        &mut out,
        &mut problems,
    )
    .unwrap();
    assert!(problems.is_empty(), "{problems:?}");
    let nr = HEAP.debug().nr_errors();
    let mut reports = vec![
        magpie_slab::reports::ErrorReport::new(
            magpie_slab::reports::ErrorKind::InvalidFree,
            "",
            0
        );
        16
    ];
    let kept = HEAP.debug().read_errors(0, &mut reports);
    let mut live = String::new();
    magpie_slab::reports::write_errors(
        &mut live,
        nr,
        &reports[..kept],
        &magpie_slab::reports::RawFormat,
    )
    .unwrap();
    assert_eq!(out, live);
    assert!(out.contains("error(s) reported since boot"), "{out}");
    assert!(out.contains("kernel memory allocator: "), "{out}");
}
