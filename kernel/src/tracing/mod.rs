//! Tracing.
pub mod call_site;
pub mod context;
pub mod event_stream;
