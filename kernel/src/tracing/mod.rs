//! Tracing: where an allocation came from and what the CPU was doing.
//!
//! * [`context`]: each CPU's context string ("shell kmalloc");
//! * [`call_site`]: the frame-pointer walks that find an allocation's call
//!   site (`PlatformHooks::backtrace`, `PlatformHooks::caller_frames`);
//! * [`event_stream`]: kmemtrace's event stream in this kernel (boot
//!   arguments, clock, build id, the dump to the host); the rings are
//!   `magpie_slab::kmemtrace`.
//!
//! `context` and `call_site` are hooks of `kmem::KernelPlatform` and sit
//! below the slab allocator; `event_stream` drives it. The per-cache
//! trace table (`kmemtrace start|print`) is `magpie-slab`'s and the shell's
//! (`shell/kmemtrace/trace_table.rs`).

pub mod call_site;
pub mod context;
pub mod event_stream;
