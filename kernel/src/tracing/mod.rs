//! Tracing.
pub mod event_stream;
