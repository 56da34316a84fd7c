//! Slab debugging in this kernel: the boot arguments that switch it on,
//! and the kernel's policy for the allocator's error reports.
//!
//! - `slab_debug` / `slab_debug=FLAGS[,CACHE...][;...]` (Linux letters:
//!   `F` consistency checks, `Z` redzones, `P` poison, `U` audit, `C`
//!   contents; the word `panic` in the list panics on the first report) and
//!   `kmem_flags=0xN` (illumos: `0x1` audit, `0x2` deadbeef, `0x4` redzone,
//!   `0x8` contents) configure the slab allocator before it starts. A bad value is
//!   reported on the console and ignored (the kernel boots without
//!   debugging).
//! - Every error the allocator detects (with or without debug flags: bad
//!   frees, duplicate frees, corrupted free lists, and with them poison and
//!   redzone violations) arrives in [`report`]: printed in the illumos
//!   format, symbolized, with times in seconds since boot; kept by the
//!   allocator's error ring for `kmem errors`.

use core::fmt;
use core::sync::atomic::{AtomicBool, Ordering};

use magpie_slab::debug::SlabDebugConfig;
use magpie_slab::reports::{ErrorReport, ReportFormat};

use crate::arch::tsc;
use crate::debug::symbols;
use crate::dev::console;

/// Panic on the first report (`slab_debug=...,panic`).
static PANIC_ON_ERROR: AtomicBool = AtomicBool::new(false);

/// Reads `slab_debug` and `kmem_flags` from the command line: the
/// configuration `kmem::init` hands to the slab allocator before its
/// `init`, with [`report`] as its error hook.
pub fn configure(cmdline: &str) -> SlabDebugConfig {
    let mut config = SlabDebugConfig::NONE;
    for word in cmdline.split_ascii_whitespace() {
        let (key, value) = match word.split_once('=') {
            Some((key, value)) => (key, Some(value)),
            None => (word, None),
        };
        let parsed = match (key, value) {
            ("slab_debug", value) => SlabDebugConfig::parse_slab_debug(value),
            ("kmem_flags", Some(value)) => SlabDebugConfig::parse_kmem_flags(value),
            _ => continue,
        };
        match parsed {
            Ok(parsed) => config = parsed,
            Err(error) => log::error!("{word}: {error}; slab debugging stays off"),
        }
    }
    PANIC_ON_ERROR.store(config.panic, Ordering::Relaxed);
    if config.is_enabled() {
        log::info!("slab debugging: slab_debug={config}");
    }
    config
}

/// Renders report frames with kernel symbols and ticks as nanoseconds.
pub struct KernelFormat;

impl ReportFormat for KernelFormat {
    fn symbol(&self, address: usize, out: &mut dyn fmt::Write) -> fmt::Result {
        write!(out, "{}", symbols::Symbolized(address))
    }

    fn nanoseconds(&self, ticks: u64) -> u64 {
        (ticks as u128 * 1_000_000 / tsc::khz() as u128) as u64
    }
}

/// The allocator's report hook: print the report on the console; panic if
/// the boot line asked for it. Runs with no allocator lock held and
/// allocates nothing.
///
/// # Panics
///
/// On purpose, with `slab_debug=...,panic` on the boot line.
pub fn report(report: &ErrorReport) {
    console::write_fmt(format_args!("{}", report.display(&KernelFormat)));
    if PANIC_ON_ERROR.load(Ordering::Relaxed) {
        panic!("kernel heap corruption detected ({})", report.kind.name());
    }
}
