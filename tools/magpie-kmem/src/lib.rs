//! # magpie-kmem: offline analysis of kmemtrace dumps
//!
//! The Magpie kernel records every caller-visible allocation and free
//! (`kmalloc`, `kfree`, `kmem_cache_alloc`/`free`, page-granular kmalloc,
//! `GlobalAlloc`) as fixed-size binary events in per-CPU buffers, and
//! `kmemtrace dump` sends them to the host as one file
//! (`target/kmemtrace/latest.kmt`). This crate reads that file — the ABI is
//! `docs/KMEMTRACE-ABI.md`, version [`dump::KMEMTRACE_ABI_VERSION`] — and answers
//! "what happened": which call sites allocate most, how much each size
//! class wastes, how many objects are freed on another CPU than the one
//! that allocated them, what is still live at the end, and how live bytes
//! moved over time. It is the offline half of the 2008 kmemtrace RFC
//! (per-CPU relay buffers, an overrun counter, analysis by a separate
//! tool), with the report layout of Linux `perf kmem stat`, and the live
//! objects grouped as illumos `::findleaks` groups leaks (live is not
//! leaked: leaks are the unreachable objects `kmem findleaks` finds in
//! the shell).
//!
//! ## Layers
//!
//! - [`dump`]: the reader, on the layout of the `magpie-kmemtrace-format`
//!   crate (which the writer in `magpie-slab` encodes with). Validates magic, ABI version, sizes, record
//!   lengths and the trailer's CRC-32; every error names the byte offset
//!   ([`dump::DumpError`]: truncated, corrupt, ABI mismatch). A file
//!   holding several dumps back to back (one per `kmemtrace dump` of a
//!   boot) is read in order and its last dump analysed.
//! - [`analysis`]: per-CPU checks (sequence gaps are overruns, timestamps
//!   never go back) and one replay of all CPUs' events merged by
//!   timestamp, pairing each free with its alloc: statistics per call
//!   site, pointer and cache; ping-pong (cross-CPU) frees; live objects;
//!   findings with a severity.
//! - [`symbols`]: finds the kernel ELF whose GNU build id matches the
//!   dump's and names addresses `function+0xoff` (symbol table, generic
//!   arguments dropped) and `file:line` (DWARF, via `addr2line`).
//! - [`report`]: the `check`, `stat` and `live` reports, text and JSON.
//! - [`graphs`]: flamegraph (`inferno`) and timeline (`plotters`) SVGs.
//! - [`export`]: Chrome trace-event JSON (Perfetto), speedscope JSON and
//!   folded stacks, for other people's viewers.
//! - [`diff`]: two dumps compared per call site and per cache, in the
//!   shell's `allocinfo diff` layout.
//!
//! ## Units
//!
//! Sizes are bytes; times are nanoseconds since boot in the dump, and
//! milliseconds or microseconds since `record start` on the timeline axis.
//!
//! ## Non-obvious choices
//!
//! - *Why is a free of an unknown pointer only sometimes an error?* An
//!   object allocated before `record start`, or whose alloc event was
//!   dropped for a full buffer, is freed legitimately. Only a record that
//!   began at boot (header flag bit 1) and lost nothing can call it wrong.
//! - *Why verify the checksum before decoding events?* A flipped bit in an
//!   event would otherwise surface as a strange event kind or a phantom
//!   double alloc; the checksum names the real problem.
//! - *Why does ping-pong count frees, not allocations?* It is the free on
//!   the other CPU that pulls the object's cache lines across; `perf kmem`
//!   counts it at the same point. The summary gives it as n/m over the
//!   frees that matched an alloc in the record.
#![forbid(unsafe_code)]

pub mod analysis;
pub mod core;
pub mod diff;
pub mod dump;
pub mod export;
pub mod graphs;
pub mod report;
pub mod symbols;
