//! `allocinfo`: live bytes and calls per allocation call site, in Linux
//! `/proc/allocinfo`'s layout (`lib/alloc_tag.c`), over the code tags of
//! `magpie-codetag` (feature `allocinfo`), with the filters of Linux's
//! allocinfo ioctl (function, file, line, size range, accuracy).

use core::fmt::{self, Write};

use magpie_codetag::CodeTag;
use magpie_codetag::alloc_tag::{AllocTag, AllocTagCounts};

/// The header version of the 1.0 columns: `<size> <calls> <tag info>`.
pub const ALLOCINFO_VERSION: &str = "1.0";
/// The header version when rows carry the optional `accurate:no` field
/// (Linux 6.15's 2.0: counters that missed allocations made while
/// profiling was off).
pub const ALLOCINFO_VERSION_ACCURACY: &str = "2.0";

/// Writes the header: the version that goes with the columns printed
/// (`accuracy`: rows may end in `accurate:no`), then the column line.
///
/// # Errors
///
/// The error of `out`, as is.
pub fn write_allocinfo_header(out: &mut dyn Write, accuracy: bool) -> fmt::Result {
    let version = if accuracy {
        ALLOCINFO_VERSION_ACCURACY
    } else {
        ALLOCINFO_VERSION
    };
    writeln!(out, "allocinfo - version: {version}")?;
    writeln!(out, "#     <size>  <calls> <tag info>")
}

pub use magpie_codetag::alloc_tag::write_allocinfo_row;

/// One site's counts, read once (a snapshot row).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AllocinfoRow {
    /// Index of the tag in the slice given to [`allocinfo`].
    pub index: usize,
    /// Its live bytes and calls.
    pub counts: AllocTagCounts,
}

/// Row order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AllocinfoSort {
    /// The tags' order (Linux's: the section's).
    #[default]
    Section,
    /// Live bytes, most first (ties in section order).
    Bytes,
    /// Live calls, most first (ties in section order).
    Calls,
}

/// Which sites to show (Linux's allocinfo filter: every field given must
/// match).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AllocinfoFilter<'a> {
    /// The function's name, exactly (`func:NAME`).
    pub function: Option<&'a str>,
    /// A part of the file path (`kmem.rs`, `kernel/src/shell/`).
    pub file: Option<&'a str>,
    /// The line, exactly.
    pub line: Option<u32>,
    /// Live bytes at least this many.
    pub min_bytes: Option<u64>,
    /// Live bytes at most this many.
    pub max_bytes: Option<u64>,
    /// Only accurate rows (`Some(true)`) or only `accurate:no` rows
    /// (`Some(false)`).
    pub accurate: Option<bool>,
}

impl AllocinfoFilter<'_> {
    /// Whether a site passes (`inaccurate`: its counts are not accurate).
    pub fn matches(&self, tag: &CodeTag, counts: AllocTagCounts, inaccurate: bool) -> bool {
        self.function.is_none_or(|name| tag.function() == name)
            && self.file.is_none_or(|part| tag.file.contains(part))
            && self.line.is_none_or(|line| tag.line == line)
            && self.min_bytes.is_none_or(|min| counts.bytes >= min)
            && self.max_bytes.is_none_or(|max| counts.bytes <= max)
            && self.accurate.is_none_or(|accurate| accurate != inaccurate)
    }

    /// Whether the filter is only by code location (the file, the line,
    /// the function): what can be decided before counters are read.
    fn by_location_only(&self) -> bool {
        self.min_bytes.is_none() && self.max_bytes.is_none() && self.accurate.is_none()
    }
}

/// How [`allocinfo`] reads and prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AllocinfoOptions<'a> {
    /// Row order.
    pub sort: AllocinfoSort,
    /// At most this many rows (after sorting and filtering).
    pub top: usize,
    /// Which sites.
    pub filter: AllocinfoFilter<'a>,
    /// Sizes as `1.5K`, `12.0M` (`-h`).
    pub human: bool,
    /// The counts missed allocations (profiling was off for a while):
    /// rows end in `accurate:no` and the header is version 2.0.
    pub inaccurate: bool,
}

impl Default for AllocinfoOptions<'_> {
    fn default() -> Self {
        AllocinfoOptions {
            sort: AllocinfoSort::Section,
            top: usize::MAX,
            filter: AllocinfoFilter::default(),
            human: false,
            inaccurate: false,
        }
    }
}

/// Why [`allocinfo`] printed nothing or stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AllocinfoError {
    /// More tags than rows to read them into.
    TooManyTags {
        /// Tags.
        nr_tags: usize,
        /// Rows given.
        capacity: usize,
    },
    /// The sink failed.
    Format,
}

impl From<fmt::Error> for AllocinfoError {
    fn from(_: fmt::Error) -> Self {
        AllocinfoError::Format
    }
}

impl fmt::Display for AllocinfoError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AllocinfoError::TooManyTags { nr_tags, capacity } => {
                write!(
                    f,
                    "{nr_tags} allocation tags, allocinfo shows at most {capacity}"
                )
            }
            AllocinfoError::Format => f.write_str("the output failed"),
        }
    }
}

/// Reads the counts of every tag of `tags` that passes the filter once
/// (`read`: the kernel's per-CPU counters summed), into `rows` (a
/// consistent snapshot, no allocation: reserve the rows at boot), sorts
/// and writes them:
///
/// ```text
/// allocinfo - version: 1.0
/// #     <size>  <calls> <tag info>
///         6144       48 kernel/src/shell/kmem.rs:122 func:cmd_kmalloc
/// ```
///
/// Returns the number of rows written.
///
/// # Errors
///
/// [`AllocinfoError::TooManyTags`] (nothing written) when `tags` has more
/// entries than `rows`; [`AllocinfoError::Format`] when `out` fails.
pub fn allocinfo(
    out: &mut dyn Write,
    tags: &'static [AllocTag],
    read: &dyn Fn(&'static AllocTag) -> AllocTagCounts,
    rows: &mut [AllocinfoRow],
    options: &AllocinfoOptions<'_>,
) -> Result<usize, AllocinfoError> {
    if tags.len() > rows.len() {
        return Err(AllocinfoError::TooManyTags {
            nr_tags: tags.len(),
            capacity: rows.len(),
        });
    }
    let filter = &options.filter;
    let location_only = filter.by_location_only();
    let mut nr_rows = 0;
    for (index, tag) in tags.iter().enumerate() {
        let zero = AllocTagCounts::default();
        if location_only && !filter.matches(&tag.tag, zero, options.inaccurate) {
            continue;
        }
        let counts = read(tag);
        if filter.matches(&tag.tag, counts, options.inaccurate) {
            rows[nr_rows] = AllocinfoRow { index, counts };
            nr_rows += 1;
        }
    }
    let rows = &mut rows[..nr_rows];
    match options.sort {
        AllocinfoSort::Section => {}
        AllocinfoSort::Bytes => {
            rows.sort_unstable_by_key(|row| (core::cmp::Reverse(row.counts.bytes), row.index))
        }
        AllocinfoSort::Calls => {
            rows.sort_unstable_by_key(|row| (core::cmp::Reverse(row.counts.calls), row.index))
        }
    }
    write_allocinfo_header(out, options.inaccurate)?;
    let mut nr_written = 0;
    for row in rows.iter().take(options.top) {
        write_allocinfo_row(
            out,
            &tags[row.index],
            row.counts,
            options.human,
            options.inaccurate,
        )?;
        nr_written += 1;
    }
    Ok(nr_written)
}
