//! Debugging tools.
pub mod fault;
pub mod lkdtm;
pub mod panic;
pub mod slab_debug;
pub mod symbols;
