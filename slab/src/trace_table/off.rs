//! The trace table compiled out (feature `trace-table` off): the calls
//! the cache paths make, as empty inline stubs (as `kfence/off.rs`).
//! Nothing starts tracing, so the `TRACED` and `EVER_TRACED` hot flags are
//! never set and the hooks never reach them. The `kmem_trace` bootstrap
//! cache stays (it never grows a slab).

use core::marker::PhantomData;

use crate::cache::KmemCache;
use crate::platform::Platform;

/// A cache's trace table: nothing.
pub(crate) struct TraceTable<P: Platform>(PhantomData<P>);

impl<P: Platform> TraceTable<P> {
    pub(crate) const fn new() -> Self {
        TraceTable(PhantomData)
    }

    #[inline(always)]
    pub(crate) fn shrink<O>(&self, _owner: &O) {}
}

/// The size and alignment of a record (the `kmem_trace` bootstrap cache's
/// objects).
#[repr(C)]
pub(crate) struct TraceNode {
    _links: [usize; 3],
}

impl<P: Platform> KmemCache<P> {
    #[inline(always)]
    pub(crate) fn trace_drop_all(&self) -> usize {
        0
    }
}
