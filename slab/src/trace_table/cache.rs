//! The trace table's handle ([`CacheTrace`], `cache.trace_table()`) and
//! the cache's calls into it ([`crate::trace_table`]): tracing on and
//! off, reading the records, recording.

use super::{TraceOwner, TraceRecord, TraceStats};
use crate::cache::{HotFlags, KmemCache};
use crate::error::TraceError;
use crate::flags::CacheFlags;
use crate::platform::Platform;

/// One cache's Akaros trace table (Akaros `kmem_trace`: start, stop,
/// print, reset), from [`KmemCache::trace_table`]: start recording the
/// allocations its callers make, stop, read the records still
/// outstanding (every allocated object of the cache, with its backtrace
/// and context), drop them.
#[derive(Clone, Copy)]
pub struct CacheTrace<'a, P: Platform> {
    cache: &'a KmemCache<P>,
}

impl<P: Platform> KmemCache<P> {
    /// This cache's trace table: [`CacheTrace`].
    pub fn trace_table(&self) -> CacheTrace<'_, P> {
        CacheTrace { cache: self }
    }
}

impl<P: Platform> CacheTrace<'_, P> {
    /// Start recording allocations.
    ///
    /// # Errors
    /// [`TraceError::NoTrace`] if the cache was created `NOTRACE` (all
    /// bootstrap caches are).
    pub fn start(&self) -> Result<(), TraceError> {
        if self.cache.flags.contains(CacheFlags::NOTRACE) {
            return Err(TraceError::NoTrace);
        }
        self.cache.set_hot(HotFlags::TRACED | HotFlags::EVER_TRACED);
        Ok(())
    }

    /// Stop recording new allocations. Frees keep removing records made
    /// earlier. An allocation racing with `stop` may still complete its
    /// record afterwards (as in Akaros).
    pub fn stop(&self) {
        self.cache.clear_hot(HotFlags::TRACED);
    }

    /// Whether new allocations are being recorded.
    pub fn is_on(&self) -> bool {
        self.cache.hot().contains(HotFlags::TRACED)
    }

    /// Drop (free) every record. Tracing stays on or off as it was.
    pub fn reset(&self) {
        self.cache.trace_drop_all();
    }

    /// Visit every outstanding record, oldest first, under the trace lock.
    /// `f` must not allocate from or free to this cache.
    pub fn for_each(&self, f: impl FnMut(&TraceRecord)) {
        self.cache.trace.for_each(f);
    }

    /// Number of records, dropped records, and whether tracing is on.
    pub fn stats(&self) -> TraceStats {
        let (nr_records, nr_dropped) = self.cache.trace.counts();
        TraceStats {
            nr_records,
            nr_dropped,
            tracing: self.is_on(),
        }
    }
}

impl<P: Platform> KmemCache<P> {
    /// Drop every record; returns how many there were.
    pub(crate) fn trace_drop_all(&self) -> usize {
        self.trace.drop_all(self)
    }
}

impl<P: Platform> TraceOwner for KmemCache<P> {
    fn obj_size(&self) -> usize {
        self.params.obj_size
    }
}
