//! Host tests: a fake platform and page source, unit tests per feature, a
//! proptest model test, a multithreaded stress test, and (built with
//! `RUSTFLAGS="--cfg loom"`, instead of all the others) loom model tests
//! of the magazine layer's locking.

mod support;

#[cfg(not(loom))]
mod alloc_errors;
#[cfg(not(loom))]
mod alloc_free;
#[cfg(not(loom))]
mod attack_matrix;
#[cfg(not(loom))]
mod bad_free;
#[cfg(not(loom))]
mod bad_free_kinds;
#[cfg(not(loom))]
mod corruption_kinds;
#[cfg(not(loom))]
mod debug;
#[cfg(not(loom))]
mod debug_fuzz;
#[cfg(not(loom))]
mod double_free_rate;
#[cfg(not(loom))]
mod geometry;
#[cfg(not(loom))]
mod global;
#[cfg(not(loom))]
mod glue;
#[cfg(not(loom))]
mod idle_tick;
#[cfg(not(loom))]
mod kfence;
#[cfg(not(loom))]
mod kmalloc;
#[cfg(not(loom))]
mod kmemtrace;
#[cfg(not(loom))]
mod kmemtrace_sizing;
#[cfg(not(loom))]
mod leak_scan;
#[cfg(not(loom))]
mod lockdep;
#[cfg(loom)]
pub(crate) mod loom_models;
#[cfg(not(loom))]
mod magazines;
#[cfg(not(loom))]
mod model;
#[cfg(not(loom))]
mod oom;
#[cfg(all(feature = "alloc-profiling", not(loom)))]
mod profiling;
#[cfg(not(loom))]
mod reclaim;
#[cfg(not(loom))]
mod reports;
#[cfg(not(loom))]
mod small_heap;
#[cfg(not(loom))]
mod threads;
#[cfg(not(loom))]
mod trace_table;
