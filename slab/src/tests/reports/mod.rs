//! The reports of `crate::reports`, each written to a `String` and read
//! back: shapes, figures and errors.

mod allocinfo;
mod backtrace;
mod kmemstat;
mod slabinfo;
mod slabtop;
mod time;
mod timestats;
mod trace_print;
mod whatis;

use crate::CacheArgs;
use core::fmt;

use crate::KmemCache;
use crate::reports::error::ReportFormat;
use crate::tests::support::{TestAlloc, TestPlatform};

/// A new cache of `size`-byte objects, aligned to 8, no flags.
pub fn plain_cache(
    alloc: &'static TestAlloc,
    name: &str,
    size: usize,
) -> &'static KmemCache<TestPlatform> {
    alloc
        .cache_create(
            name,
            size,
            &CacheArgs {
                align: 8,
                ..CacheArgs::DEFAULT
            },
        )
        .unwrap()
}

/// Symbols as `fn_<address>`, ticks as microseconds.
pub struct TestFormat;

impl ReportFormat for TestFormat {
    fn symbol(&self, address: usize, out: &mut dyn fmt::Write) -> fmt::Result {
        write!(out, "fn_{address:x}")
    }
    fn nanoseconds(&self, ticks: u64) -> u64 {
        ticks * 1000
    }
}

/// A sink that fails after `budget` bytes.
pub struct FailingSink {
    pub budget: usize,
}

impl fmt::Write for FailingSink {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        if s.len() > self.budget {
            return Err(fmt::Error);
        }
        self.budget -= s.len();
        Ok(())
    }
}
