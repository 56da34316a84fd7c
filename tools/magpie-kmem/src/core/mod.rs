//! `magpie-kmem core CORE REPORT`: the allocator's reports from a memory
//! image of a stopped or dead kernel (a QEMU `dump-guest-memory` core,
//! `target/vmcore/latest.core`), with nothing typed into its shell.
//! See docs/VMCORE.md.
//!
//! The image is read through the debug descriptor the library keeps
//! (`magpie_slab::descriptor`): [`image`] turns kernel virtual addresses
//! into bytes of the core, [`heap`] walks the allocator's structures with
//! every pointer checked, and the reports are written by the same
//! `magpie_slab::reports` line writers the shell uses.
//!
//! The descriptor is found by its symbol in the kernel ELF (given with
//! `--kernel`, or the build under `target/` whose GNU build id is the
//! one in the image), else by its magic in the image's memory.

pub mod allocinfo;
pub mod codetag;
pub mod errors;
pub mod events;
pub mod findleaks;
pub mod heap;
pub mod image;
pub mod kfence;
pub mod trace;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use magpie_slab::descriptor::{DESCRIPTOR_MAGIC, DESCRIPTOR_SYMBOL};
use magpie_slab::reports::{
    KmemstatRow, SlabtopRow, SlabtopSort, SlabtopTotals, write_kmemstat_header,
    write_slabinfo_header, write_slabinfo_line, write_slabtop, write_slabtop_hits_note,
};
use object::{Object, ObjectSection, ObjectSymbol};

use self::heap::{Heap, Problem};
use self::image::{ElfCore, Memory};

/// The reports `magpie-kmem core` writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Report {
    /// `/proc/slabinfo` 2.1, as the shell's `slabinfo`.
    Slabinfo,
    /// The shell's `kmemstat`: the kernel's arenas, the caches.
    Kmemstat,
    /// The shell's `slabtop --once`, sorted by the key (`o`, `c`, `n`, `m`).
    Slabtop(SlabtopSort),
    /// `kmem whatis ADDR`.
    Whatis(u64),
    /// Every cache's structures walked: what is broken, or that none is.
    Verify,
    /// The kmemtrace recording, written as a dump to the file.
    Events(PathBuf),
    /// The trace tables' outstanding objects (one cache, or all).
    Trace(Option<String>),
    /// The allocator's error reports (`kmem errors`).
    Errors,
    /// KFENCE's figures (`kmem kfence`), or its objects (`kmem kfence
    /// objects`).
    Kfence {
        /// The objects instead of the figures.
        objects: bool,
    },
    /// The leak scan of `kmem findleaks`, over the image.
    Findleaks,
    /// The shell's `allocinfo` with its options.
    Allocinfo(allocinfo::Options),
}

/// Where the descriptor is, and how it was found.
#[derive(Debug, Clone)]
pub struct Found {
    /// Its virtual address.
    pub addr: u64,
    /// How it was found (for the report's first line).
    pub how: String,
    /// The kernel's GNU build id (zeros: not known).
    pub build_id: [u8; 20],
    /// The kernel ELF, if one was found.
    pub kernel: Option<PathBuf>,
}

/// The 20-byte build id at the end of a build id note.
fn build_id_of(note: &BuildIdNote) -> [u8; 20] {
    note.as_ref()
        .and_then(|(_, bytes)| bytes.get(bytes.len().checked_sub(20)?..))
        .and_then(|id| id.try_into().ok())
        .unwrap_or([0; 20])
}

/// The descriptor's address and the build id note's address and bytes in
/// the kernel ELF at `path`.
/// A build id note: its address and bytes.
type BuildIdNote = Option<(u64, Vec<u8>)>;

fn elf_facts(path: &Path) -> Result<(u64, BuildIdNote), String> {
    let data = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let file = object::File::parse(&*data)
        .map_err(|e| format!("{}: not an ELF file: {e}", path.display()))?;
    let symbol = file
        .symbols()
        .find(|s| s.name() == Ok(DESCRIPTOR_SYMBOL))
        .ok_or_else(|| {
            format!(
                "{}: no {DESCRIPTOR_SYMBOL} symbol (not a kernel with magpie-slab, or stripped)",
                path.display()
            )
        })?;
    // A note section with no id in it (a kernel linked without
    // --build-id keeps the linker script's empty section) is none.
    let note = file
        .section_by_name(".note.gnu.build-id")
        .and_then(|s| Some((s.address(), s.data().ok()?.to_vec())))
        .filter(|(_, bytes)| bytes.len() >= 16 + 20);
    Ok((symbol.address(), note))
}

/// Whether the image holds the kernel ELF's build id note where the ELF
/// puts it (`None`: the ELF has none).
fn build_id_matches(mem: &dyn Memory, note: &BuildIdNote) -> Option<bool> {
    let (addr, bytes) = note.as_ref()?;
    let mut got = vec![0u8; bytes.len()];
    Some(mem.read(*addr, &mut got).is_ok() && &got == bytes)
}

/// Find the descriptor: `--kernel` (its build id must match the image's),
/// else the kernel under `target/` whose build id is in the image, else
/// the magic in the image.
///
/// # Errors
///
/// `--kernel` names an ELF of another build, or no descriptor is found.
pub fn find_descriptor(core: &ElfCore, kernel: Option<&Path>) -> Result<Found, String> {
    if let Some(path) = kernel {
        let (addr, note) = elf_facts(path)?;
        if build_id_matches(core, &note) == Some(false) {
            return Err(format!(
                "kernel ELF mismatch: {} is not the kernel of this core (its build id is not in the image); pass the kernel that ran",
                path.display()
            ));
        }
        return Ok(Found {
            addr,
            how: format!("kernel {}", path.display()),
            build_id: build_id_of(&note),
            kernel: Some(path.to_path_buf()),
        });
    }
    let mut candidates: Vec<PathBuf> = Vec::new();
    for dir in crate::symbols::target_dirs() {
        candidates.extend(crate::symbols::candidates(&dir));
    }
    for path in &candidates {
        if let Ok((addr, note)) = elf_facts(path)
            && build_id_matches(core, &note) == Some(true)
        {
            return Ok(Found {
                addr,
                how: format!("kernel {} (build id in the image)", path.display()),
                build_id: build_id_of(&note),
                kernel: Some(path.clone()),
            });
        }
    }
    scan_for_magic(core).ok_or_else(|| {
        format!(
            "no Magpie slab descriptor in the core: no kernel ELF among {} under target/ matches it (pass --kernel PATH), and no descriptor magic in its memory",
            candidates.len()
        )
    })
}

/// The descriptor by its magic in physical memory, translated back to
/// the kernel's virtual address through the direct map the page tables
/// give; the copy whose allocator is set (the kernel ELF loaded as a
/// module holds an unset one).
fn scan_for_magic(core: &ElfCore) -> Option<Found> {
    let ranges: Vec<(u64, u64)> = core.physical_ranges().collect();
    for (start, _end) in ranges {
        let bytes = core.physical(start)?;
        let mut from = 0;
        while let Some(at) = find(&bytes[from..], &DESCRIPTOR_MAGIC) {
            let physical = start + (from + at) as u64;
            let descriptor = &bytes[from + at..];
            if let Ok((header, _)) = heap::decode_descriptor(physical, descriptor)
                && header.allocator != 0
            {
                return Some(Found {
                    addr: physical,
                    how: format!("descriptor magic at physical {physical:#x}"),
                    build_id: [0; 20],
                    kernel: None,
                });
            }
            from += at + 1;
        }
    }
    None
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// Memory that reads the descriptor found by [`scan_for_magic`] from its
/// physical address and everything else through the core.
struct Scanned<'a> {
    core: &'a ElfCore,
    physical: u64,
    len: u64,
}

impl Memory for Scanned<'_> {
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), image::ReadError> {
        if addr >= self.physical
            && addr.saturating_add(buf.len() as u64) <= self.physical.saturating_add(self.len)
        {
            let bytes = self
                .core
                .physical(addr)
                .and_then(|b| b.get(..buf.len()))
                .ok_or_else(|| image::ReadError {
                    addr,
                    len: buf.len(),
                    why: "not in the core".into(),
                })?;
            buf.copy_from_slice(bytes);
            return Ok(());
        }
        self.core.read(addr, buf)
    }
}

/// Write `report` of the heap in `mem` (descriptor at `addr`) to `out`;
/// problems found on the way follow the report, one line each, on
/// `problems`. Returns whether the heap read clean.
///
/// # Errors
///
/// The descriptor cannot be read or names no allocator.
pub fn write_report(
    mem: &dyn Memory,
    addr: u64,
    report: &Report,
    out: &mut String,
    problems: &mut Vec<String>,
) -> Result<bool, String> {
    let heap = Heap::new(mem, addr)?;
    let (caches, broken) = heap.caches();
    problems.extend(broken.iter().map(Problem::to_string));
    match report {
        Report::Slabinfo => {
            write_slabinfo_header(out).map_err(|e| e.to_string())?;
            for cache in &caches {
                write_slabinfo_line(out, &cache.name, &cache.stats).map_err(|e| e.to_string())?;
            }
        }
        Report::Kmemstat => {
            let mut broken = Vec::new();
            let arenas = heap.arenas(&mut broken);
            problems.extend(broken.iter().map(Problem::to_string));
            write_kmemstat(&heap, &caches, &arenas, out).map_err(|e| e.to_string())?;
        }
        Report::Slabtop(sort) => {
            write_slabtop_once(&caches, *sort, out).map_err(|e| e.to_string())?
        }
        Report::Whatis(address) => match heap.whatis(&caches, *address) {
            Some(info) => write!(out, "{info}").map_err(|e| e.to_string())?,
            None => writeln!(out, "{address:#x} is not in any slab").map_err(|e| e.to_string())?,
        },
        Report::Events(_)
        | Report::Trace(_)
        | Report::Kfence { .. }
        | Report::Errors
        | Report::Findleaks
        | Report::Allocinfo(_) => {
            return Err("events, trace, kfence, errors and findleaks are written by run".into());
        }
        Report::Verify => {
            let nr_slabs: usize = caches.iter().map(|c| c.slabs.len()).sum();
            writeln!(
                out,
                "{} caches, {nr_slabs} slabs walked; {} broken",
                caches.len(),
                broken.len()
            )
            .map_err(|e| e.to_string())?;
            for cache in &caches {
                check_rounds(cache, problems);
            }
        }
    }
    Ok(problems.is_empty())
}

/// Every round of a cache's magazines is an object start of one of its
/// slabs (`Allocator::check_invariants`).
fn check_rounds(cache: &heap::Cache, problems: &mut Vec<String>) {
    for &round in &cache.rounds {
        let inside = cache.slabs.iter().any(|slab| {
            let offset = round.wrapping_sub(slab.base);
            offset % cache.stride == 0 && offset / cache.stride < slab.nr_objs
        });
        if !inside {
            problems.push(format!(
                "cache {}: magazine round {round:#x} is no object of its slabs",
                cache.name
            ));
        }
    }
}

/// `slabtop --once` as the shell writes it: every cache, sorted by
/// `sort`, counted since boot, and the note on few hits.
fn write_slabtop_once(
    caches: &[heap::Cache],
    sort: SlabtopSort,
    out: &mut String,
) -> std::fmt::Result {
    let mut totals = SlabtopTotals::default();
    let mut rows: Vec<SlabtopRow> = caches
        .iter()
        .map(|cache| {
            totals.add(&cache.stats);
            // The row borrows its name for 'static: this process ends
            // after one report.
            let name: &'static str = Box::leak(cache.name.clone().into_boxed_str());
            SlabtopRow::from_stats(name, cache.id, &cache.stats, cache.nr_hits)
        })
        .collect();
    write_slabtop(out, &totals, &mut rows, None, sort)?;
    write_slabtop_hits_note(out, &rows)
}

/// The shell's `kmemstat`: the kernel's arena rows described in the
/// descriptor, the caches' rows beneath them, the allocator's metadata
/// and page-granular kmalloc (`magpie_slab::reports::write_kmemstat_caches`),
/// then the arena rows below the caches.
fn write_kmemstat(
    heap: &Heap<'_>,
    caches: &[heap::Cache],
    arenas: &heap::ArenaRows,
    out: &mut String,
) -> std::fmt::Result {
    let arena_row = |row: &heap::ArenaRow, out: &mut String| {
        KmemstatRow {
            indent: row.indent,
            name: &row.name,
            kind: 'A',
            objsize: row.quantum as usize,
            total: row.total as usize,
            alloc: row.alloc as usize,
            nr_allocs_ever: row.nr_allocs_ever,
            waste: 0,
        }
        .write(out)
    };
    write_kmemstat_header(out)?;
    for row in &arenas.before {
        arena_row(row, out)?;
    }
    let indent = arenas.caches_indent;
    for cache in caches {
        let stats = &cache.stats;
        let out_of_slabs = stats
            .nr_allocated
            .wrapping_add(stats.nr_cpu_cached_objs)
            .wrapping_add(stats.nr_depot_objs);
        KmemstatRow {
            indent,
            name: &cache.name,
            kind: 'S',
            objsize: stats.obj_size,
            total: stats.obj_size.wrapping_mul(stats.nr_total_objs),
            alloc: stats.obj_size.wrapping_mul(out_of_slabs),
            nr_allocs_ever: stats.nr_allocs_ever,
            waste: stats.waste_bytes,
        }
        .write(out)?;
    }
    let layout = &heap.layout;
    let page = layout.page_size.offset as usize;
    let field = |entry| heap.allocator_field(entry).unwrap_or(0) as usize;
    let bootstrap: usize = caches
        .iter()
        .filter(|c| c.bootstrap)
        .map(|c| (c.nr_pages as usize).wrapping_mul(page))
        .fold(0usize, usize::wrapping_add);
    let metadata = field(layout.allocator_page_map_pages)
        .wrapping_mul(page)
        .wrapping_add(bootstrap);
    KmemstatRow {
        indent,
        name: "slab-metadata",
        kind: 'M',
        objsize: page,
        total: metadata,
        alloc: metadata,
        nr_allocs_ever: field(layout.allocator_nr_pressure_reaps) as u64,
        waste: 0,
    }
    .write(out)?;
    let large = field(layout.allocator_large_live_pages).wrapping_mul(page);
    KmemstatRow {
        indent,
        name: "kmalloc-large",
        kind: 'P',
        objsize: page,
        total: large,
        alloc: large,
        nr_allocs_ever: field(layout.allocator_large_nr_allocs_ever) as u64,
        waste: 0,
    }
    .write(out)?;
    for row in &arenas.after {
        arena_row(row, out)?;
    }
    Ok(())
}

/// The code tags' descriptor of the kernel ELF at `kernel` (its symbol),
/// if it has one the image holds and it describes counters.
fn codetag_descriptor(
    mem: &dyn Memory,
    kernel: Option<&Path>,
) -> Option<codetag::CodetagDescriptorRead> {
    let data = std::fs::read(kernel?).ok()?;
    let file = object::File::parse(&*data).ok()?;
    let addr = file
        .symbols()
        .find(|s| s.name() == Ok(magpie_codetag::descriptor::CODETAG_DESCRIPTOR_SYMBOL))?
        .address();
    codetag::read_codetag_descriptor(mem, addr)
        .ok()
        .filter(|read| read.counters != 0)
}

/// `magpie-kmem core CORE REPORT`: open the core, find the descriptor,
/// write the report to standard output and the problems to standard
/// error. Returns whether the heap read clean.
///
/// # Errors
///
/// The core cannot be read, has no descriptor, or the kernel ELF given
/// is not its kernel.
pub fn run(core_path: &Path, kernel: Option<&Path>, report: &Report) -> Result<bool, String> {
    let core = ElfCore::open(core_path)?;
    let found = find_descriptor(&core, kernel)?;
    let scanned;
    let mem: &dyn Memory = if found.how.starts_with("descriptor magic") {
        scanned = Scanned {
            core: &core,
            physical: found.addr,
            len: heap::descriptor_bytes() as u64,
        };
        &scanned
    } else {
        &core
    };
    let mut out = String::new();
    let mut problems = Vec::new();
    let clean = if let Report::Events(path) = report {
        let heap = Heap::new(mem, found.addr)?;
        let mut bytes = Vec::new();
        let mut found_problems = Vec::new();
        let summary = events::write_events(
            &heap,
            found.build_id,
            &mut |chunk| bytes.extend_from_slice(chunk),
            &mut found_problems,
        )?;
        std::fs::write(path, &bytes).map_err(|e| format!("{}: {e}", path.display()))?;
        problems.extend(found_problems.iter().map(Problem::to_string));
        println!(
            "{} events ({} overruns) in {} bytes written to {}",
            summary.dump.nr_events,
            summary.dump.nr_overruns,
            summary.dump.nr_bytes,
            path.display()
        );
        if summary.raw_ticks {
            eprintln!(
                "magpie-kmem core: the image holds no clock rate: timestamps are clock ticks"
            );
        }
        problems.is_empty()
    } else if let Report::Errors = report {
        let heap = Heap::new(mem, found.addr)?;
        let symbols = trace::KernelSymbols::load(found.kernel.as_deref(), heap.header.clock_khz)?;
        let mut found_problems = Vec::new();
        errors::write_error_reports(&heap, &symbols, &mut out, &mut found_problems)?;
        problems.extend(found_problems.iter().map(Problem::to_string));
        problems.is_empty()
    } else if let Report::Kfence { objects } = report {
        let heap = Heap::new(mem, found.addr)?;
        let symbols = trace::KernelSymbols::load(found.kernel.as_deref(), heap.header.clock_khz)?;
        let mut found_problems = Vec::new();
        kfence::write_kfence(&heap, *objects, &symbols, &mut out, &mut found_problems)?;
        problems.extend(found_problems.iter().map(Problem::to_string));
        problems.is_empty()
    } else if let Report::Allocinfo(options) = report {
        let heap = Heap::new(mem, found.addr)?;
        let symbols = trace::KernelSymbols::load(found.kernel.as_deref(), heap.header.clock_khz)?;
        let tags = codetag_descriptor(mem, found.kernel.as_deref()).ok_or(
            "no allocation tags in the image: the kernel ELF is not known (pass --kernel), \
             has no MAGPIE_CODETAG_DESCRIPTOR, or profiling never started",
        )?;
        allocinfo::write_allocinfo(mem, &tags, &symbols, options, &mut out)?;
        true
    } else if let Report::Findleaks = report {
        let heap = Heap::new(mem, found.addr)?;
        let symbols = trace::KernelSymbols::load(found.kernel.as_deref(), heap.header.clock_khz)?;
        let tags = codetag_descriptor(mem, found.kernel.as_deref());
        let mut found_problems = Vec::new();
        findleaks::write_findleaks(
            &heap,
            core.cpus(),
            tags.as_ref(),
            &symbols,
            &mut out,
            &mut found_problems,
        )?;
        problems.extend(found_problems.iter().map(Problem::to_string));
        problems.is_empty()
    } else if let Report::Trace(cache) = report {
        let heap = Heap::new(mem, found.addr)?;
        let symbols = trace::KernelSymbols::load(found.kernel.as_deref(), heap.header.clock_khz)?;
        let mut found_problems = Vec::new();
        trace::write_trace(
            &heap,
            cache.as_deref(),
            &symbols,
            &mut out,
            &mut found_problems,
        )?;
        problems.extend(found_problems.iter().map(Problem::to_string));
        problems.is_empty()
    } else {
        write_report(mem, found.addr, report, &mut out, &mut problems)?
    };
    print!("{out}");
    for problem in &problems {
        eprintln!("magpie-kmem core: {problem}");
    }
    if !problems.is_empty() {
        eprintln!(
            "magpie-kmem core: {} structure(s) skipped: the report above leaves them out",
            problems.len()
        );
    }
    Ok(clean)
}

/// `magpie-kmem core CORE REPORT`'s arguments.
#[derive(clap::Args, Debug)]
pub struct CoreArgs {
    /// The memory image (default of the runner: target/vmcore/latest.core).
    pub core: PathBuf,
    /// The report.
    #[command(subcommand)]
    pub report: CoreReport,
}

/// The reports of `magpie-kmem core`.
#[derive(clap::Subcommand, Debug)]
pub enum CoreReport {
    /// /proc/slabinfo 2.1, as the shell's `slabinfo`.
    Slabinfo,
    /// The shell's `kmemstat`: the arenas the kernel described, the
    /// caches beneath them.
    Kmemstat,
    /// The shell's `slabtop --once` (counters since boot).
    Slabtop {
        /// Print once (the only mode from a core; accepted as the shell's).
        #[arg(long)]
        once: bool,
        /// Sort key, as slabtop's: o (objects), c (cache size), n (name),
        /// m (magazine misses).
        #[arg(short = 's', long = "sort", default_value = "o")]
        sort: String,
    },
    /// Which cache, object and state an address is (`kmem whatis`).
    Whatis {
        /// The address (hex with 0x, or decimal).
        addr: String,
    },
    /// Walk every cache's lists, slabs and magazines; report what is
    /// broken (exit 1), or that nothing is.
    Verify,
    /// The Akaros trace tables' outstanding objects with their
    /// backtraces, as the shell's `kmemtrace print [CACHE]`.
    Trace {
        /// One cache (default: every cache with records).
        cache: Option<String>,
    },
    /// The allocator's error reports kept in its ring (bad frees,
    /// corruption), as the shell's `kmem errors`.
    Errors,
    /// KFENCE's figures, as the shell's `kmem kfence`; with `objects`,
    /// every pool object with its stacks, as `kmem kfence objects`
    /// (Linux's /sys/kernel/debug/kfence/objects).
    Kfence {
        /// `objects`: list the pool's objects.
        what: Option<String>,
    },
    /// Live bytes and calls per allocation site, as the shell's
    /// `allocinfo` (Linux /proc/allocinfo), with its filters.
    #[command(disable_help_flag = true)]
    Allocinfo {
        /// Row order: bytes or calls (default: the section's).
        #[arg(long)]
        sort: Option<String>,
        /// At most N rows (sorted by bytes unless --sort says otherwise).
        #[arg(long)]
        top: Option<usize>,
        /// Sites in files whose path contains this.
        #[arg(long)]
        file: Option<String>,
        /// Sites in this function.
        #[arg(long)]
        function: Option<String>,
        /// Sites at this line.
        #[arg(long)]
        line: Option<u32>,
        /// Sites with at least this many live bytes.
        #[arg(long = "min-size")]
        min_size: Option<u64>,
        /// Sites with at most this many live bytes.
        #[arg(long = "max-size")]
        max_size: Option<u64>,
        /// yes: accurate rows only; no: `accurate:no` rows only.
        #[arg(long)]
        accurate: Option<String>,
        /// Sizes for a person (1.5K, 12.0M), as the shell's -h.
        #[arg(short = 'h')]
        human: bool,
        /// Print help.
        #[arg(long, action = clap::ArgAction::Help)]
        help: Option<bool>,
    },
    /// Leaks by reachability over the image, as the shell's `kmem
    /// findleaks` (illumos ::findleaks): roots from the kernel's data, bss,
    /// every CPU's stack and registers.
    Findleaks,
    /// The kmemtrace recording the kernel held (not yet dumped), written
    /// as a .kmt dump the other subcommands read.
    Events {
        /// The dump file to write.
        #[arg(short = 'o', long = "output", value_name = "FILE.kmt")]
        output: PathBuf,
    },
}

/// Parse an address: `0x` hex, or decimal.
///
/// # Errors
///
/// Neither.
pub fn parse_addr(text: &str) -> Result<u64, String> {
    let parsed = match text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => text.parse(),
    };
    parsed.map_err(|_| format!("bad address '{text}': give 0x-hex or decimal"))
}

/// Run the subcommand; exit status 0 when the heap read clean, 1 when
/// structures were skipped (the report is still written).
///
/// # Errors
///
/// As [`run`]; a bad address.
pub fn main(args: &CoreArgs, kernel: Option<&Path>) -> Result<std::process::ExitCode, String> {
    let report = match &args.report {
        CoreReport::Slabinfo => Report::Slabinfo,
        CoreReport::Kmemstat => Report::Kmemstat,
        CoreReport::Slabtop { once: _, sort } => Report::Slabtop(
            SlabtopSort::from_key(sort)
                .ok_or_else(|| format!("unknown sort key '{sort}'; expected o, c, n or m"))?,
        ),
        CoreReport::Whatis { addr } => Report::Whatis(parse_addr(addr)?),
        CoreReport::Verify => Report::Verify,
        CoreReport::Events { output } => Report::Events(output.clone()),
        CoreReport::Trace { cache } => Report::Trace(cache.clone()),
        CoreReport::Errors => Report::Errors,
        CoreReport::Findleaks => Report::Findleaks,
        CoreReport::Allocinfo {
            sort,
            top,
            file,
            function,
            line,
            min_size,
            max_size,
            accurate,
            human,
            help: _,
        } => {
            let mut options = allocinfo::Options {
                sort: match sort.as_deref() {
                    None => allocinfo::Sort::Section,
                    Some("bytes") => allocinfo::Sort::Bytes,
                    Some("calls") => allocinfo::Sort::Calls,
                    Some(key) => {
                        return Err(format!("unknown sort key '{key}'; expected bytes or calls"));
                    }
                },
                top: *top,
                function: function.clone(),
                file: file.clone(),
                line: *line,
                min_bytes: *min_size,
                max_bytes: *max_size,
                accurate: match accurate.as_deref() {
                    None => None,
                    Some("yes") => Some(true),
                    Some("no") => Some(false),
                    Some(other) => {
                        return Err(format!("--accurate takes yes or no, not '{other}'"));
                    }
                },
                human: *human,
            };
            // As the shell: --top alone sorts by bytes.
            if top.is_some() && options.sort == allocinfo::Sort::Section {
                options.sort = allocinfo::Sort::Bytes;
            }
            Report::Allocinfo(options)
        }
        CoreReport::Kfence { what } => match what.as_deref() {
            None => Report::Kfence { objects: false },
            Some("objects") => Report::Kfence { objects: true },
            Some(other) => {
                return Err(format!(
                    "kfence: unexpected '{other}'; usage: kfence [objects]"
                ));
            }
        },
    };
    Ok(if run(&args.core, kernel, &report)? {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::FAILURE
    })
}
