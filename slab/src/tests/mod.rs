//! Host tests: a fake platform and page source, unit tests per feature, a
//! proptest model test and a multithreaded smoke test.

mod support;

mod alloc_free;
mod bad_free;
mod global;
mod kmalloc;
mod magazines;
mod model;
mod oom;
#[cfg(feature = "alloc-profiling")]
mod profiling;
mod threads;
mod tracing;
