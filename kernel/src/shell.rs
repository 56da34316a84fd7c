//! The Magpie shell on the serial console.
//!
//! One command per line at the `magpie> ` prompt, with echo and backspace.
//! Every command writes to a `fmt::Write` sink, so tests can run commands
//! and read their output without a console ([`Shell::execute`]). Errors are
//! one line starting with `error:`; the shell always returns to its prompt.
//!
//! Output formats follow the tools kernel developers know:
//!
//! * `kmemstat` — Akaros `kmemstat` (`kern/drivers/dev/mem.c`): arenas with
//!   the slabs that import from them indented beneath.
//! * `slabinfo` — Linux `/proc/slabinfo` version 2.1. Magazine size is shown
//!   as `limit` and `batchcount` (rounds moved per depot exchange); `slabdata
//!   <sharedavail>` is the rounds held in the depot.
//! * `kmemtrace print` — Akaros `kmem_trace_print`, one block per outstanding
//!   object with its backtrace as `#NN [<address>] function+0xoff`.

use alloc::vec::Vec;
use core::fmt::{self, Write};
use core::ptr::NonNull;

use magpie_slab::{CacheStats, KmemCache, TraceRecord};

use crate::kmem::{self, KPAGES, KernelPlatform, SLAB};
use crate::symbols::Symbolized;
use crate::{QemuExitCode, console, exit_qemu, heap};

/// Longest command line accepted, in bytes.
pub const MAX_LINE: usize = 200;
/// Most objects one `kmalloc`/`leak` command may allocate.
pub const MAX_COUNT: usize = 100_000;
/// Largest size `kmalloc`/`leak` accept, in bytes.
pub const MAX_SIZE: usize = 64 << 20;

const PROMPT: &str = "magpie> ";

const HELP: &str = "\
commands:
  help                                 this list
  kmemstat                             arenas and slabs (Akaros kmemstat)
  slabinfo                             caches in /proc/slabinfo 2.1 format
  kmemtrace start|stop|print|reset [CACHE|all]
                                       trace a cache's outstanding objects
  kmalloc SIZE [COUNT]                 allocate COUNT objects of SIZE bytes, keep them
  kfree [COUNT|all]                    free the most recently kmalloc'ed objects held
  leak SIZE [COUNT]                    allocate and forget (for leak hunting)
  allocinfo [--sort bytes|calls] [--top N] [--file PATTERN] [-h]
                                       live bytes and calls per allocation site (/proc/allocinfo 1.0)
  allocinfo on|off                     switch allocation profiling at run time
  allocinfo ctx FILE:LINE enable|disable|print
                                       capture context of each live object from one site
  timestats [reset]                    latency statistics (slab refill, depot exchange)
  cpus                                 CPUs: id, APIC id, state, magazine allocs/frees
  stress [--cpus N|all] [--ops N] [--sizes A-B] [--seed S]
                                       random alloc/free mix on several CPUs at once
  poweroff                             leave QEMU";

/// A shell error: printed as one `error: ...` line.
#[derive(Debug)]
pub enum ShellError {
    /// No command by that name.
    UnknownCommand(alloc::string::String),
    /// No cache by that name.
    UnknownCache(alloc::string::String),
    /// A number did not parse.
    NotANumber(alloc::string::String),
    /// Wrong arguments; the text is the usage line.
    Usage(&'static str),
    /// A size outside 1..=MAX_SIZE.
    BadSize(usize),
    /// A count outside 1..=MAX_COUNT.
    BadCount(usize),
    /// `kfree N` with fewer objects held.
    NotHeld {
        /// Objects the command asked to free.
        asked: usize,
        /// Objects the shell holds.
        held: usize,
    },
    /// Tracing refused (NOTRACE cache).
    Trace(&'static str, magpie_slab::TraceError),
    /// The line was longer than [`MAX_LINE`].
    LineTooLong,
}

impl fmt::Display for ShellError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ShellError::UnknownCommand(name) => {
                write!(f, "unknown command '{name}' (type 'help' for the list)")
            }
            ShellError::UnknownCache(name) => {
                write!(f, "no cache named '{name}' (see 'slabinfo' for names)")
            }
            ShellError::NotANumber(text) => write!(f, "'{text}' is not a number"),
            ShellError::Usage(usage) => write!(f, "usage: {usage}"),
            ShellError::BadSize(size) => {
                write!(f, "size {size} out of range: give 1 to {MAX_SIZE} bytes")
            }
            ShellError::BadCount(count) => {
                write!(f, "count {count} out of range: give 1 to {MAX_COUNT}")
            }
            ShellError::NotHeld { asked, held } => {
                write!(f, "cannot free {asked}: the shell holds {held} object(s)")
            }
            ShellError::Trace(name, error) => write!(f, "cannot trace {name}: {error}"),
            ShellError::LineTooLong => {
                write!(f, "line too long (at most {MAX_LINE} characters); ignored")
            }
        }
    }
}

type Result<T = ()> = core::result::Result<T, ShellError>;

/// An object allocated by `kmalloc` and held by the shell.
#[derive(Clone, Copy)]
struct Held {
    ptr: NonNull<u8>,
    size: usize,
}

/// Shell state: the objects `kmalloc` allocated and `kfree` has not freed.
#[derive(Default)]
pub struct Shell {
    held: Vec<Held>,
}

impl Shell {
    /// A shell holding nothing.
    pub const fn new() -> Self {
        Self { held: Vec::new() }
    }

    /// Number of objects `kmalloc` allocated and `kfree` has not freed.
    pub fn nr_held(&self) -> usize {
        self.held.len()
    }

    /// Runs one command line, writing its output (or one error line) to `out`.
    pub fn execute(&mut self, line: &str, out: &mut dyn Write) {
        if let Err(error) = self.dispatch(line, out) {
            let _ = writeln!(out, "error: {error}");
        }
    }

    fn dispatch(&mut self, line: &str, out: &mut dyn Write) -> Result {
        let mut words = line.split_whitespace();
        let Some(command) = words.next() else {
            return Ok(());
        };
        let _tag = crate::alloc_tag_scope!();
        let args: Vec<&str> = words.collect();
        let _context = kmem::enter_context(context_name(command));
        match command {
            "help" => no_args(&args, "help").map(|()| {
                let _ = writeln!(out, "{HELP}");
            }),
            "kmemstat" => no_args(&args, "kmemstat").map(|()| kmemstat(out)),
            "slabinfo" => no_args(&args, "slabinfo").map(|()| slabinfo(out)),
            "kmemtrace" => kmemtrace(&args, out),
            "kmalloc" => {
                let (size, count) = size_and_count(&args, "kmalloc SIZE [COUNT]")?;
                self.cmd_kmalloc(size, count, out);
                Ok(())
            }
            "kfree" => self.cmd_kfree(&args, out),
            "leak" => {
                let (size, count) = size_and_count(&args, "leak SIZE [COUNT]")?;
                cmd_leak(size, count, out);
                Ok(())
            }
            "cpus" => {
                crate::stress::cmd_cpus(&args, out);
                Ok(())
            }
            "stress" => {
                crate::stress::cmd_stress(&args, out);
                Ok(())
            }
            "allocinfo" => crate::profiling::cmd_allocinfo(&args, out).map_err(ShellError::Usage),
            "timestats" => crate::profiling::cmd_timestats(&args, out).map_err(ShellError::Usage),
            "poweroff" => {
                let _ = writeln!(out, "powering off");
                exit_qemu(QemuExitCode::Success)
            }
            other => Err(ShellError::UnknownCommand(other.into())),
        }
    }

    /// `kmalloc SIZE [COUNT]`: allocates and keeps; prints each address.
    #[inline(never)]
    fn cmd_kmalloc(&mut self, size: usize, count: usize, out: &mut dyn Write) {
        self.held.reserve(count);
        for _ in 0..count {
            match crate::kmalloc!(size, 1) {
                Ok(ptr) => {
                    self.held.push(Held { ptr, size });
                    let _ = writeln!(out, "{:#018x}", ptr.as_ptr() as usize);
                }
                Err(error) => {
                    let _ = writeln!(out, "error: kmalloc({size}) failed: {error}");
                    return;
                }
            }
        }
    }

    /// `kfree [COUNT|all]`: frees the most recently allocated objects held.
    fn cmd_kfree(&mut self, args: &[&str], out: &mut dyn Write) -> Result {
        let count = match args {
            [] => 1,
            ["all"] => self.held.len(),
            [number] => parse_number(number)?,
            _ => return Err(ShellError::Usage("kfree [COUNT|all]")),
        };
        if count > self.held.len() {
            return Err(ShellError::NotHeld {
                asked: count,
                held: self.held.len(),
            });
        }
        for _ in 0..count {
            let held = self.held.pop().expect("count checked against held");
            // SAFETY: `held.ptr` came from SLAB.kmalloc and was popped from
            // `held`, so nothing else refers to it and it is freed once.
            match unsafe { SLAB.kfree(held.ptr) } {
                Ok(()) => {
                    let _ = writeln!(out, "{:#018x}", held.ptr.as_ptr() as usize);
                }
                Err(error) => {
                    let _ = writeln!(out, "error: kfree of {}-byte object: {error}", held.size);
                }
            }
        }
        Ok(())
    }
}

/// `leak SIZE [COUNT]`: allocates and forgets, to give the trace something to find.
#[inline(never)]
fn cmd_leak(size: usize, count: usize, out: &mut dyn Write) {
    for _ in 0..count {
        match crate::kmalloc!(size, 1) {
            Ok(ptr) => {
                let _ = writeln!(out, "{:#018x}", ptr.as_ptr() as usize);
            }
            Err(error) => {
                let _ = writeln!(out, "error: kmalloc({size}) failed: {error}");
                return;
            }
        }
    }
}

/// The context string recorded in traces for a command.
fn context_name(command: &str) -> &'static str {
    match command {
        "kmalloc" => "shell kmalloc",
        "kfree" => "shell kfree",
        "leak" => "shell leak",
        "kmemtrace" => "shell kmemtrace",
        _ => "shell",
    }
}

fn no_args(args: &[&str], usage: &'static str) -> Result {
    if args.is_empty() {
        Ok(())
    } else {
        Err(ShellError::Usage(usage))
    }
}

/// Parses a decimal or `0x` hexadecimal number.
fn parse_number(text: &str) -> Result<usize> {
    let parsed = match text.strip_prefix("0x") {
        Some(hex) => usize::from_str_radix(hex, 16),
        None => text.parse(),
    };
    parsed.map_err(|_| ShellError::NotANumber(text.into()))
}

fn size_and_count(args: &[&str], usage: &'static str) -> Result<(usize, usize)> {
    let (size, count) = match args {
        [size] => (parse_number(size)?, 1),
        [size, count] => (parse_number(size)?, parse_number(count)?),
        _ => return Err(ShellError::Usage(usage)),
    };
    if !(1..=MAX_SIZE).contains(&size) {
        return Err(ShellError::BadSize(size));
    }
    if !(1..=MAX_COUNT).contains(&count) {
        return Err(ShellError::BadCount(count));
    }
    Ok((size, count))
}

// ---------------------------------------------------------------------------
// kmemstat

const KMEMSTAT_NAME: usize = 30;

/// One `kmemstat` line: an arena (`A`), a slab cache (`S`) or the
/// page-granular kmalloc pseudo-cache (`P`). Amounts are in bytes.
struct KmemstatRow<'a> {
    indent: usize,
    name: &'a str,
    kind: char,
    objsize: usize,
    total: usize,
    alloc: usize,
    nr_allocs_ever: u64,
}

impl KmemstatRow<'_> {
    /// Akaros `kmemstat`: `%-*s: %c :%*llu:%*llu:%*llu:%*llu` with widths
    /// 30 (less 4 per indent level), 8, 15, 15, 12.
    fn write(&self, out: &mut dyn Write) {
        for _ in 0..self.indent {
            let _ = out.write_str("    ");
        }
        let width = KMEMSTAT_NAME - 4 * self.indent;
        let _ = writeln!(
            out,
            "{:<width$}: {} :{:>8}:{:>15}:{:>15}:{:>12}",
            self.name, self.kind, self.objsize, self.total, self.alloc, self.nr_allocs_ever
        );
    }

    fn arena(
        indent: usize,
        name: &str,
        quantum: usize,
        stats: magpie_slab::ArenaStats,
    ) -> KmemstatRow<'_> {
        KmemstatRow {
            indent,
            name,
            kind: 'A',
            objsize: quantum,
            total: stats.total_bytes,
            alloc: stats.alloc_bytes,
            nr_allocs_ever: stats.nr_allocs_ever,
        }
    }
}

fn kmemstat(out: &mut dyn Write) {
    let _ = writeln!(
        out,
        "{:<KMEMSTAT_NAME$}:Typ:{:>8}:{:>15}:{:>15}:{:>12}",
        "Arena/Slab Name", "Objsize", "Total Amt", "Alloc Amt", "Allocs Ever"
    );
    let _ = writeln!(out, "{}", "-".repeat(8 + KMEMSTAT_NAME + 8 + 15 + 15 + 12));
    let page = magpie_slab::PAGE_SIZE;
    KmemstatRow::arena(0, "base", page, kmem::base_stats()).write(out);
    KmemstatRow::arena(1, "kpages", page, magpie_slab::PageSource::stats(&KPAGES)).write(out);
    SLAB.for_each_cache(|cache| {
        let stats = cache.stats();
        // Akaros counts objects out of the slab layer: with callers or in magazines.
        let out_of_slabs = stats.nr_allocated + stats.nr_cpu_cached_objs + stats.nr_depot_objs;
        KmemstatRow {
            indent: 2,
            name: cache.name(),
            kind: 'S',
            objsize: stats.obj_size,
            total: stats.obj_size * stats.nr_total_objs,
            alloc: stats.obj_size * out_of_slabs,
            nr_allocs_ever: stats.nr_allocs_ever,
        }
        .write(out);
    });
    let large = SLAB.large_stats();
    KmemstatRow {
        indent: 2,
        name: "kmalloc-large",
        kind: 'P',
        objsize: page,
        total: large.live_bytes,
        alloc: large.live_bytes,
        nr_allocs_ever: large.nr_allocs_ever,
    }
    .write(out);
    let (used, free) = heap::bootstrap_usage();
    KmemstatRow {
        indent: 0,
        name: "bootstrap-heap",
        kind: 'A',
        objsize: 1,
        total: used + free,
        alloc: used,
        nr_allocs_ever: 0,
    }
    .write(out);
}

// ---------------------------------------------------------------------------
// slabinfo

fn slabinfo(out: &mut dyn Write) {
    let _ = writeln!(out, "slabinfo - version: 2.1");
    let _ = writeln!(
        out,
        "# name            <active_objs> <num_objs> <objsize> <objperslab> <pagesperslab> \
         : tunables <limit> <batchcount> <sharedfactor> \
         : slabdata <active_slabs> <num_slabs> <sharedavail>"
    );
    SLAB.for_each_cache(|cache| slabinfo_line(out, cache.name(), &cache.stats()));
}

/// Linux `cache_show`: `%-17s %6lu %6lu %6u %4u %4d : tunables %4u %4u %4u :
/// slabdata %6lu %6lu %6lu`. Active objects are those out of the slab
/// layer (with callers or resting in magazines), as Linux SLAB counted them.
fn slabinfo_line(out: &mut dyn Write, name: &str, stats: &CacheStats) {
    let active = stats.nr_allocated + stats.nr_cpu_cached_objs + stats.nr_depot_objs;
    let _ = writeln!(
        out,
        "{name:<17} {active:>6} {:>6} {:>6} {:>4} {:>4} : tunables {:>4} {:>4} {:>4} : slabdata {:>6} {:>6} {:>6}",
        stats.nr_total_objs,
        stats.obj_size,
        stats.objs_per_slab,
        stats.nr_pages_per_slab,
        stats.magsize,
        stats.magsize,
        0,
        stats.nr_active_slabs,
        stats.nr_slabs,
        stats.nr_depot_objs,
    );
}

// ---------------------------------------------------------------------------
// kmemtrace

const KMEMTRACE_USAGE: &str = "kmemtrace start|stop|print|reset [CACHE|all]";

type Cache = KmemCache<KernelPlatform>;

fn kmemtrace(args: &[&str], out: &mut dyn Write) -> Result {
    let (verb, target) = match args {
        [verb] => (*verb, "all"),
        [verb, target] => (*verb, *target),
        _ => return Err(ShellError::Usage(KMEMTRACE_USAGE)),
    };
    if !matches!(verb, "start" | "stop" | "print" | "reset") {
        return Err(ShellError::Usage(KMEMTRACE_USAGE));
    }
    let caches = select_caches(target)?;
    match verb {
        "start" => {
            if target != "all" {
                let cache = caches[0];
                cache
                    .trace_start()
                    .map_err(|error| ShellError::Trace(cache_name(cache), error))?;
                let _ = writeln!(out, "tracing {}", cache.name());
            } else {
                // `all`: every cache that may be traced (NOTRACE ones are skipped).
                let started = caches
                    .iter()
                    .filter(|cache| cache.trace_start().is_ok())
                    .count();
                let _ = writeln!(out, "tracing {started} caches (NOTRACE caches skipped)");
            }
        }
        "stop" => {
            for cache in &caches {
                cache.trace_stop();
            }
            let _ = writeln!(out, "stopped tracing {}", target);
        }
        "reset" => {
            let mut nr_dropped = 0;
            for cache in &caches {
                nr_dropped += cache.trace_stats().nr_records;
                cache.trace_reset();
            }
            let _ = writeln!(out, "dropped {nr_dropped} records from {target}");
        }
        _ => {
            for cache in &caches {
                let stats = cache.trace_stats();
                // `print all` shows the caches that have something to show.
                if target == "all"
                    && stats.nr_records == 0
                    && stats.nr_dropped == 0
                    && !stats.tracing
                {
                    continue;
                }
                trace_print(cache, out);
            }
        }
    }
    Ok(())
}

/// The name of a cache as a `'static` string for error messages.
fn cache_name(cache: &'static Cache) -> &'static str {
    cache.name()
}

fn select_caches(target: &str) -> Result<Vec<&'static Cache>> {
    if target == "all" {
        let mut caches = Vec::new();
        SLAB.for_each_cache(|cache| caches.push(cache));
        return Ok(caches);
    }
    SLAB.find_cache(target)
        .map(|cache| alloc::vec![cache])
        .ok_or_else(|| ShellError::UnknownCache(target.into()))
}

/// Prints one record as an Akaros trace block: `Obj <address>, size, cpu,
/// tsc, from <context>:`, then `#NN [<address>] function+0xoff` per frame
/// and a blank line. Used by `kmemtrace print` and `allocinfo ctx print`.
pub fn write_record(out: &mut dyn Write, record: &TraceRecord) {
    let _ = writeln!(
        out,
        "Obj {:#x}, size {}, cpu {}, tsc {}, from {}:",
        record.addr,
        record.size,
        record.cpu,
        record.timestamp,
        record.ctx()
    );
    for (index, &address) in record.frames().iter().enumerate() {
        let _ = writeln!(
            out,
            "#{:02} [<{address:#018x}>] {}",
            index + 1,
            Symbolized(address)
        );
    }
    let _ = writeln!(out);
}

/// Objects and bytes per call site (the first frame outside the allocator).
#[derive(Clone, Copy)]
struct Site {
    address: usize,
    nr_objects: usize,
    bytes: usize,
}

/// Prints one block per outstanding record, a per-site summary and a count.
///
/// The records are copied out first and printed after the cache's trace
/// lock is released: printing may allocate (into a `String` sink, say), and
/// an allocation from a traced cache takes that same lock. The copy goes into
/// a buffer reserved up front, so nothing allocates while the lock is held;
/// records added between the reservation and the copy are counted as not
/// shown rather than dropped silently.
fn trace_print(cache: &'static Cache, out: &mut dyn Write) {
    let reserve = cache.trace_stats().nr_records + 16;
    let mut records: Vec<TraceRecord> = Vec::with_capacity(reserve);
    let mut nr_not_shown = 0usize;
    cache.trace_for_each(|record: &TraceRecord| {
        if records.len() < records.capacity() {
            records.push(*record);
        } else {
            nr_not_shown += 1;
        }
    });
    let stats = cache.trace_stats();

    let _ = writeln!(out, "Dumping outstanding allocs from {}", cache.name());
    let _ = writeln!(out, "-------------------------");
    let mut sites: Vec<Site> = Vec::new();
    for record in &records {
        write_record(out, record);
        let site = record.frames().first().copied().unwrap_or(0);
        match sites.iter_mut().find(|s| s.address == site) {
            Some(slot) => {
                slot.nr_objects += 1;
                slot.bytes += record.size;
            }
            None => sites.push(Site {
                address: site,
                nr_objects: 1,
                bytes: record.size,
            }),
        }
    }
    if !sites.is_empty() {
        sites.sort_by_key(|site| core::cmp::Reverse(site.bytes));
        let _ = writeln!(out, "By call site:");
        for site in &sites {
            let _ = writeln!(
                out,
                "  {:>6} objects {:>10} bytes  {}",
                site.nr_objects,
                site.bytes,
                Symbolized(site.address)
            );
        }
    }
    if nr_not_shown > 0 {
        let _ = writeln!(
            out,
            "{nr_not_shown} records added while printing were not shown"
        );
    }
    let nr_shown = records.len();
    let _ = writeln!(
        out,
        "{} outstanding object{} in {}, {} record{} dropped (tracing {})",
        nr_shown,
        if nr_shown == 1 { "" } else { "s" },
        cache.name(),
        stats.nr_dropped,
        if stats.nr_dropped == 1 { "" } else { "s" },
        if stats.tracing { "on" } else { "off" }
    );
}

// ---------------------------------------------------------------------------
// The console loop

/// Collects a command line from console bytes: echo, backspace, overlong
/// lines. Feeds on bytes, so it is testable without a console.
pub struct LineEditor {
    buffer: [u8; MAX_LINE],
    len: usize,
    too_long: bool,
    last_was_cr: bool,
}

/// What a byte fed to the [`LineEditor`] completed.
#[derive(Debug, PartialEq, Eq)]
pub enum Edit<'a> {
    /// Nothing yet.
    Pending,
    /// A whole line (without the newline).
    Line(&'a str),
    /// A line that exceeded [`MAX_LINE`]; it was discarded.
    TooLong,
}

impl LineEditor {
    /// An empty line.
    pub const fn new() -> Self {
        Self {
            buffer: [0; MAX_LINE],
            len: 0,
            too_long: false,
            last_was_cr: false,
        }
    }

    /// Takes one byte; `echo` receives what should be echoed to the terminal.
    pub fn feed(&mut self, byte: u8, echo: &mut dyn FnMut(&[u8])) -> Edit<'_> {
        let was_cr = core::mem::replace(&mut self.last_was_cr, byte == b'\r');
        match byte {
            b'\n' if was_cr => Edit::Pending,
            b'\r' | b'\n' => {
                echo(b"\n");
                let (len, too_long) = (self.len, self.too_long);
                self.len = 0;
                self.too_long = false;
                if too_long {
                    Edit::TooLong
                } else {
                    // Only printable ASCII is stored, so this is valid UTF-8.
                    Edit::Line(core::str::from_utf8(&self.buffer[..len]).unwrap_or(""))
                }
            }
            0x7f | 0x08 => {
                if self.len > 0 && !self.too_long {
                    self.len -= 1;
                    echo(b"\x08 \x08");
                }
                Edit::Pending
            }
            0x20..=0x7e => {
                if self.len == MAX_LINE {
                    self.too_long = true;
                } else if !self.too_long {
                    self.buffer[self.len] = byte;
                    self.len += 1;
                    echo(&[byte]);
                }
                Edit::Pending
            }
            _ => Edit::Pending,
        }
    }
}

impl Default for LineEditor {
    fn default() -> Self {
        Self::new()
    }
}

/// Writes straight to the serial console (no allocation).
pub struct ConsoleWriter;

impl Write for ConsoleWriter {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        console::write_bytes(s.as_bytes());
        Ok(())
    }
}

/// Runs the shell on the serial console forever.
pub fn run() -> ! {
    let mut shell = Shell::new();
    let mut editor = LineEditor::new();
    let mut out = ConsoleWriter;
    let _ = out.write_str(PROMPT);
    loop {
        let byte = console::read_byte_blocking();
        match editor.feed(byte, &mut |bytes| console::write_bytes(bytes)) {
            Edit::Pending => continue,
            Edit::Line(line) => {
                let mut copy = [0u8; MAX_LINE];
                let len = line.len();
                copy[..len].copy_from_slice(line.as_bytes());
                let line = core::str::from_utf8(&copy[..len]).unwrap_or("");
                shell.execute(line, &mut out);
            }
            Edit::TooLong => {
                let _ = writeln!(out, "error: {}", ShellError::LineTooLong);
            }
        }
        let _ = out.write_str(PROMPT);
    }
}
