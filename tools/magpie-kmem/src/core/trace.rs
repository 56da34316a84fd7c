//! `magpie-kmem core CORE trace [CACHE]`: the Akaros trace tables'
//! outstanding objects, as the shell's `kmemtrace print [CACHE]`
//! (`magpie_slab::reports::trace_print`): each record written by the
//! library's `write_trace_record`, in address order, then the by-site
//! summary and the count. Frames are symbolized from the kernel ELF's
//! symbol table as the kernel symbolizes them (`function+0xoff`, `?`
//! outside its text); times use the clock rate in the descriptor.

use std::fmt::{self, Write};
use std::path::Path;

use magpie_slab::TraceRecord;
use magpie_slab::reports::ReportFormat;
use magpie_slab::reports::{TRACE_PRINT_MAX_SITES, write_trace_record};
use object::{Object, ObjectSection, ObjectSymbol, SymbolKind};

use super::heap::{Heap, Problem};

/// The most records a table may hold before the image is called corrupt.
const MAX_RECORDS: u64 = 1 << 22;

/// The kernel's function symbols, as the kernel's own symbolizer sees
/// them (`kernel/src/debug/symbols.rs`).
#[derive(Default)]
pub struct KernelSymbols {
    /// (address, size, mangled name), by address.
    functions: Vec<(u64, u64, String)>,
    /// `.text`'s bounds.
    text: (u64, u64),
    /// Ticks per millisecond (0: ticks are shown as nanoseconds).
    khz: u64,
}

impl KernelSymbols {
    /// The function symbols of the ELF at `path` (none without one).
    ///
    /// # Errors
    ///
    /// The file cannot be read or parsed.
    pub fn load(path: Option<&Path>, khz: u64) -> Result<KernelSymbols, String> {
        let Some(path) = path else {
            return Ok(KernelSymbols {
                khz,
                ..KernelSymbols::default()
            });
        };
        let data = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let file = object::File::parse(&*data).map_err(|e| format!("{}: {e}", path.display()))?;
        let text = file
            .section_by_name(".text")
            .map(|s| (s.address(), s.address() + s.size()))
            .unwrap_or((0, 0));
        let mut functions: Vec<(u64, u64, String)> = file
            .symbols()
            .filter(|s| s.kind() == SymbolKind::Text && s.address() != 0)
            .filter_map(|s| Some((s.address(), s.size(), s.name().ok()?.to_string())))
            .collect();
        functions.sort_by_key(|f| f.0);
        Ok(KernelSymbols {
            functions,
            text,
            khz,
        })
    }

    fn lookup(&self, address: u64) -> Option<(&str, u64)> {
        if address < self.text.0 || address >= self.text.1 {
            return None;
        }
        let index = self
            .functions
            .partition_point(|f| f.0 <= address)
            .checked_sub(1)?;
        let (start, size, name) = &self.functions[index];
        // `<=`: a return address after a call that never returns is one
        // past the end of its caller.
        if *size != 0 && address > start + size {
            return None;
        }
        Some((name, address - start))
    }
}

impl ReportFormat for KernelSymbols {
    fn symbol(&self, address: usize, out: &mut dyn fmt::Write) -> fmt::Result {
        match self.lookup(address as u64) {
            Some((name, offset)) => write!(out, "{:#}+{offset:#x}", rustc_demangle::demangle(name)),
            None => out.write_str("?"),
        }
    }

    fn nanoseconds(&self, ticks: u64) -> u64 {
        if self.khz == 0 {
            ticks
        } else {
            (u128::from(ticks) * 1_000_000 / u128::from(self.khz)) as u64
        }
    }
}

/// One cache's trace table, read: its records (any order) and the
/// records it could not keep.
struct Table {
    records: Vec<TraceRecord>,
    nr_dropped: u64,
    tracing: bool,
}

fn read_table(heap: &Heap<'_>, cache: u64) -> Result<Table, String> {
    let layout = &heap.layout;
    let mem = heap.memory();
    let field = |base: u64, entry| heap.field(base, entry).map_err(|e| e.to_string());
    let hot = field(cache, layout.cache_hot_flags)?;
    let nr_dropped = field(cache, layout.cache_trace_nr_dropped)?;
    let inner = cache
        .wrapping_add(layout.cache_trace_lock.offset)
        .wrapping_add(heap.header.trace_lock_data);
    let mut node = field(inner, layout.trace_newest)?;
    let mut records = Vec::new();
    let max_frames = layout.trace_max_frames.offset as usize;
    while node != 0 {
        if records.len() as u64 >= MAX_RECORDS {
            return Err("the trace table's age list is too long (a loop?)".into());
        }
        let record = node.wrapping_add(layout.trace_node_record.offset);
        let read = |entry| field(record, entry).map_err(|e| format!("trace record {node:#x}: {e}"));
        let mut context = [0u8; 32];
        let context_len = layout.trace_record_context.size.min(32) as usize;
        mem.read(
            record.wrapping_add(layout.trace_record_context.offset),
            &mut context[..context_len],
        )
        .map_err(|e| format!("trace record {node:#x}: {e}"))?;
        let nr_frames = read(layout.trace_record_nr_frames)?
            .min(max_frames as u64)
            .min(magpie_slab::TRACE_MAX_FRAMES as u64);
        let mut frames = [0usize; magpie_slab::TRACE_MAX_FRAMES];
        for (index, frame) in frames.iter_mut().enumerate().take(nr_frames as usize) {
            *frame = mem
                .read_uint(
                    record
                        .wrapping_add(layout.trace_record_frames.offset)
                        .wrapping_add(index as u64 * 8),
                    8,
                )
                .map_err(|e| format!("trace record {node:#x}: {e}"))? as usize;
        }
        records.push(TraceRecord {
            addr: read(layout.trace_record_addr)? as usize,
            size: read(layout.trace_record_size)? as usize,
            cpu: read(layout.trace_record_cpu)? as u32,
            timestamp: read(layout.trace_record_timestamp)?,
            context,
            context_len: read(layout.trace_record_context_len)? as u8,
            nr_frames: nr_frames as u8,
            frames,
        });
        node = field(node, layout.trace_node_older)?;
    }
    Ok(Table {
        records,
        nr_dropped,
        tracing: hot & layout.cache_hot_traced.offset != 0,
    })
}

/// A call site's share (`trace_print`'s by-site summary).
#[derive(Clone, Copy, Default)]
struct Site {
    address: usize,
    nr_objects: usize,
    bytes: usize,
}

/// One cache's block, as `magpie_slab::reports::trace_print` writes it.
fn write_block(
    out: &mut String,
    name: &str,
    table: &mut Table,
    format: &KernelSymbols,
) -> fmt::Result {
    writeln!(out, "Dumping outstanding allocs from {name}")?;
    writeln!(out, "-------------------------")?;
    table.records.sort_by_key(|r| r.addr);
    let mut sites: Vec<Site> = Vec::new();
    let mut other = Site::default();
    for record in &table.records {
        write_trace_record(out, record, format)?;
        let address = record.frames().first().copied().unwrap_or(0);
        let site = match sites.iter().position(|s| s.address == address) {
            Some(index) => &mut sites[index],
            None if sites.len() < TRACE_PRINT_MAX_SITES => {
                sites.push(Site {
                    address,
                    ..Site::default()
                });
                sites.last_mut().unwrap_or(&mut other)
            }
            None => &mut other,
        };
        site.nr_objects += 1;
        site.bytes += record.size;
    }
    if !sites.is_empty() {
        sites.sort_unstable_by_key(|site| (std::cmp::Reverse(site.bytes), site.address));
        writeln!(out, "By call site:")?;
        for site in &sites {
            write!(
                out,
                "  {:>6} objects {:>10} bytes  ",
                site.nr_objects, site.bytes
            )?;
            format.symbol(site.address, out)?;
            writeln!(out)?;
        }
        if other.nr_objects > 0 {
            writeln!(
                out,
                "  {:>6} objects {:>10} bytes  (other sites)",
                other.nr_objects, other.bytes
            )?;
        }
    }
    let nr_shown = table.records.len();
    writeln!(
        out,
        "{} outstanding object{} in {}, {} record{} dropped (tracing {})",
        nr_shown,
        if nr_shown == 1 { "" } else { "s" },
        name,
        table.nr_dropped,
        if table.nr_dropped == 1 { "" } else { "s" },
        if table.tracing { "on" } else { "off" }
    )
}

/// `trace [CACHE]`: one cache's block, or (no cache) every cache with
/// records or dropped records, then how many more are traced with none
/// (`trace_print_all`). Unreadable tables are problems, skipped.
///
/// # Errors
///
/// No cache named `cache`.
pub fn write_trace(
    heap: &Heap<'_>,
    cache: Option<&str>,
    format: &KernelSymbols,
    out: &mut String,
    problems: &mut Vec<Problem>,
) -> Result<(), String> {
    let (addrs, list_problem) = heap.cache_addrs();
    problems.extend(list_problem);
    let mut nr_quiet = 0usize;
    let mut found = false;
    for addr in addrs {
        let Ok(name) = heap.cache_name(addr) else {
            continue;
        };
        if cache.is_some_and(|wanted| wanted != name) {
            continue;
        }
        found = true;
        let mut table = match read_table(heap, addr) {
            Ok(table) => table,
            Err(what) => {
                problems.push(Problem { cache: name, what });
                continue;
            }
        };
        if cache.is_some() || !table.records.is_empty() || table.nr_dropped != 0 {
            write_block(out, &name, &mut table, format).map_err(|e| e.to_string())?;
        } else if table.tracing {
            nr_quiet += 1;
        }
    }
    if let Some(wanted) = cache
        && !found
    {
        return Err(format!("no cache named '{wanted}' in the image"));
    }
    if nr_quiet != 0 {
        writeln!(out, "{nr_quiet} more traced caches: no outstanding objects")
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}
