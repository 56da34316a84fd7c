//! Profiling.
mod alloc_tag;
pub use alloc_tag::*;
