//! `magpie-kmem core CORE allocinfo [OPTIONS]`: live bytes and calls per
//! allocation call site, as the shell's `allocinfo` prints them (Linux
//! `/proc/allocinfo`), from the code tags' descriptor
//! (`magpie_codetag::descriptor`): every tag of the section, its per-CPU
//! counters summed, the profiling switch's accuracy and state; rows by
//! the library's writers (`write_allocinfo_header`,
//! `write_allocinfo_line`), with the shell's filters and sorts.

use magpie_codetag::alloc_tag::{AllocTagCounts, write_allocinfo_line};
use magpie_slab::reports::write_allocinfo_header;

use super::codetag::{CodetagDescriptorRead, TagRead};
use super::image::Memory;
use super::trace::KernelSymbols;

/// Row order (the shell's `--sort`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Sort {
    /// The section's order.
    #[default]
    Section,
    /// Live bytes, most first (ties in section order).
    Bytes,
    /// Live calls, most first (ties in section order).
    Calls,
}

/// The shell's `allocinfo` options (`magpie_slab::reports::AllocinfoOptions`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Options {
    /// Row order.
    pub sort: Sort,
    /// At most this many rows.
    pub top: Option<usize>,
    /// The function's name, exactly.
    pub function: Option<String>,
    /// A part of the file path.
    pub file: Option<String>,
    /// The line, exactly.
    pub line: Option<u32>,
    /// Live bytes at least.
    pub min_bytes: Option<u64>,
    /// Live bytes at most.
    pub max_bytes: Option<u64>,
    /// Only accurate rows (`Some(true)`) or only `accurate:no` ones.
    pub accurate: Option<bool>,
    /// Sizes as `1.5K` (`-h`).
    pub human: bool,
}

impl Options {
    /// Whether a site passes, as `AllocinfoFilter::matches` decides live.
    fn matches(&self, tag: &TagRead, counts: AllocTagCounts, inaccurate: bool) -> bool {
        self.function
            .as_deref()
            .is_none_or(|name| tag.function == name)
            && self
                .file
                .as_deref()
                .is_none_or(|part| tag.file.contains(part))
            && self.line.is_none_or(|line| tag.line == line)
            && self.min_bytes.is_none_or(|min| counts.bytes >= min)
            && self.max_bytes.is_none_or(|max| counts.bytes <= max)
            && self.accurate.is_none_or(|accurate| accurate != inaccurate)
    }
}

/// Write the shell's `allocinfo` of the image to `out`.
///
/// # Errors
///
/// A tag or the counters cannot be read.
pub fn write_allocinfo(
    mem: &dyn Memory,
    tags: &CodetagDescriptorRead,
    symbols: &KernelSymbols,
    options: &Options,
    out: &mut String,
) -> Result<(), String> {
    let switch = tags.switch(mem)?;
    let counts = tags.counts(mem)?;
    let inaccurate = switch.inaccurate;
    let mut rows = Vec::new();
    for (index, &count) in counts.iter().enumerate() {
        let tag = tags
            .tag(mem, symbols, index as u64 + 1)
            .map_err(|e| format!("allocation tag #{}: {e}", index + 1))?;
        if options.matches(&tag, count, inaccurate) {
            rows.push((index, tag, count));
        }
    }
    match options.sort {
        Sort::Section => {}
        Sort::Bytes => {
            rows.sort_by_key(|(index, _, count)| (std::cmp::Reverse(count.bytes), *index))
        }
        Sort::Calls => {
            rows.sort_by_key(|(index, _, count)| (std::cmp::Reverse(count.calls), *index))
        }
    }
    let error = |e: std::fmt::Error| e.to_string();
    write_allocinfo_header(out, inaccurate).map_err(error)?;
    for (_, tag, count) in rows.iter().take(options.top.unwrap_or(usize::MAX)) {
        write_allocinfo_line(
            out,
            format_args!("{}:{}", tag.file, tag.line),
            &tag.function,
            *count,
            options.human,
            inaccurate,
        )
        .map_err(error)?;
    }
    if !switch.on {
        use std::fmt::Write as _;
        writeln!(
            out,
            "# profiling is {}: counts cover objects allocated while it was on",
            if switch.never {
                "off for good (mem_profiling=never)"
            } else {
                "off"
            }
        )
        .map_err(error)?;
    }
    Ok(())
}
