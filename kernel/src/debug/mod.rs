//! Debugging tools: kernel symbols and backtraces ([`symbols`]), panic and
//! exception reports ([`panic`](mod@panic)), the slab-debug boot arguments and report
//! hook ([`slab_debug`]), sampled guarded allocations ([`kfence`]), fault injection's kernel glue ([`fault`]), and
//! heap bugs on purpose ([`lkdtm`]), and the reachability leak scan
//! ([`findleaks`]). All but `lkdtm` sit below the slab
//! allocator (`kmem`); `lkdtm` uses it.

pub mod fault;
pub mod findleaks;
pub mod kfence;
pub mod lkdtm;
pub mod panic;
pub mod slab_debug;
pub mod symbols;
