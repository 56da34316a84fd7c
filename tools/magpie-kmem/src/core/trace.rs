//! `magpie-kmem core CORE trace [CACHE]`: the Akaros trace tables'
//! outstanding objects, as the shell's `kmemtrace print [CACHE]`
//! (`magpie_slab::reports::trace_print`): each record written by the
//! library's writers (`write_trace_header`, `write_trace_record`,
//! `TraceSites`, `write_trace_footer`), in address order, then the
//! by-site summary and the count. Frames are symbolized from the kernel ELF's
//! symbol table as the kernel symbolizes them (`function+0xoff`, `?`
//! outside its text); times use the clock rate in the descriptor.

use std::fmt;
use std::path::Path;

use magpie_slab::TraceRecord;
use magpie_slab::reports::ReportFormat;
use magpie_slab::reports::{
    TraceSites, write_trace_footer, write_trace_header, write_trace_quiet, write_trace_record,
};
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

impl KernelSymbols {
    /// The demangled path of the function at `address` (its first byte),
    /// without the hash: `magpie::shell::kmem::cmd_leak::__ALLOC_TAG::__codetag_fn`.
    pub fn function_at(&self, address: u64) -> Option<String> {
        match self.lookup(address)? {
            (name, 0) => Some(format!("{:#}", rustc_demangle::demangle(name))),
            _ => None,
        }
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

/// One cache's block, as `magpie_slab::reports::trace_print` writes it,
/// by its writers: the records in address order, the by-site summary,
/// the count.
fn write_block(
    out: &mut String,
    name: &str,
    table: &mut Table,
    format: &KernelSymbols,
) -> fmt::Result {
    write_trace_header(out, name)?;
    table.records.sort_by_key(|r| r.addr);
    let mut sites = TraceSites::new();
    for record in &table.records {
        write_trace_record(out, record, format)?;
        sites.add(record);
    }
    sites.write(out, format)?;
    let nr_shown = table.records.len();
    write_trace_footer(
        out,
        name,
        nr_shown,
        nr_shown,
        table.nr_dropped,
        table.tracing,
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
    write_trace_quiet(out, nr_quiet).map_err(|e| e.to_string())
}
