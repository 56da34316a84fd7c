//! kmemtrace from the allocator's side: switching recording on and off
//! (the `KMEMTRACE` hot flag of every recorded cache), status, dumps,
//! and the calls the cache paths make to record an event (the stream
//! itself: [`crate::kmemtrace`]).

use core::ptr::NonNull;

use crate::allocator::Kmem;
use crate::cache::{HotFlags, KmemCache};
use crate::kmemtrace::{
    CacheRecord, DEFAULT_SUBBUFS, DumpInfo, DumpSummary, EventFields, EventKind, EventType,
    KmemtraceConfig, KmemtraceCpuStatus, KmemtraceError, KmemtraceStatus, SUBBUF_PAGES,
};
use crate::platform::{PAGE_SIZE, Platform};

/// The default rings take at most `1 / RING_SPAN_DIV` of the primary
/// source's span ([`Kmemtrace::default_subbufs`](crate::kmemtrace::Kmemtrace::default_subbufs)).
const RING_SPAN_DIV: usize = 4;

/// kmemtrace's controls for one allocator, from [`Kmem::kmemtrace`]:
/// start and stop recording, status, dump, marks (see
/// [`crate::kmemtrace`] for the stream).
#[derive(Clone, Copy)]
pub struct Kmemtrace<'a, P: Platform> {
    heap: &'a Kmem<P>,
}

impl<P: Platform> Kmem<P> {
    /// The kmemtrace recorder's controls: [`Kmemtrace`].
    pub fn kmemtrace(&self) -> Kmemtrace<'_, P> {
        Kmemtrace { heap: self }
    }
}

/// kmemtrace: the calls the cache paths make.
impl<P: Platform> Kmem<P> {
    /// Set `HOT_KMEMTRACE` on every non-bootstrap cache (`None`), on the
    /// cache with id `cache_id`, and clear it on the others.
    fn set_kmemtrace_bits(&self, cache_id: Option<u32>) {
        self.for_each_cache(|cache| {
            let on = !cache.is_bootstrap() && cache_id.is_none_or(|id| id == cache.id);
            if on {
                cache.set_hot(HotFlags::KMEMTRACE);
            } else {
                cache.clear_hot(HotFlags::KMEMTRACE);
            }
        });
    }

    /// Keep `cache`'s CACHE record for the dump of the current record
    /// (cold: `KmemCache::destroy` calls it once, before the name goes).
    pub(crate) fn kmemtrace_cache_destroyed(&self, cache: &KmemCache<P>) {
        self.kmemtrace.note_destroyed::<P>(&cache_record(cache));
    }

    /// Record a free to `cache` (`None`: the pointer is no cache's), good
    /// or refused. Frees to kmalloc caches are `kfree`s.
    #[inline(always)]
    pub(crate) fn kmemtrace_free(&self, cache: Option<&KmemCache<P>>, obj: NonNull<u8>, ok: bool) {
        let kind = if ok {
            EventKind::Free
        } else {
            EventKind::BadFree
        };
        let (type_id, cache_id, bytes) = match cache {
            Some(cache) if cache.permanent => (EventType::Kmalloc, cache.id, cache.params.obj_size),
            Some(cache) => (EventType::Cache, cache.id, cache.params.obj_size),
            None => (EventType::Kmalloc, 0, 0),
        };
        let _ = self.kmemtrace.record::<P>(EventFields {
            head: EventFields::head(kind, type_id, cache_id),
            ptr: obj.as_ptr() as usize,
            bytes_req: 0,
            bytes_alloc: bytes,
        });
    }

    /// Record a page-granular event: `Alloc` of `size` bytes at `addr`
    /// (whole pages given), `FailedAlloc` of `size` bytes (`addr` 0,
    /// nothing given), or `Free` of the `size` bytes (whole pages) at
    /// `addr` (a kfree, or the old size of a block resized in place,
    /// which is a free and an allocation).
    #[cold]
    pub(crate) fn kmemtrace_pages(&self, kind: EventKind, addr: usize, size: usize) {
        let bytes_req = if kind == EventKind::Free { 0 } else { size };
        let bytes_alloc = if kind == EventKind::FailedAlloc {
            0
        } else {
            size.div_ceil(PAGE_SIZE) * PAGE_SIZE
        };
        let _ = self.kmemtrace.record::<P>(EventFields {
            head: EventFields::head(kind, EventType::Pages, 0),
            ptr: addr,
            bytes_req,
            bytes_alloc,
        });
    }
}

/// A cache as its dump's CACHE record describes it.
fn cache_record<P: Platform>(cache: &KmemCache<P>) -> CacheRecord<'_> {
    CacheRecord {
        id: cache.id,
        obj_size: cache.params.obj_size as u32,
        align: cache.align as u32,
        flags: cache.flags.bits(),
        name: cache.name(),
    }
}

impl<P: Platform> Kmemtrace<'_, P> {
    /// Start recording events: allocate the per-CPU rings on the first
    /// call (`config.nr_subbufs` sub-buffers per CPU from the primary page
    /// source, or with 0 [`Kmemtrace::default_subbufs`](crate::kmemtrace::Kmemtrace::default_subbufs): sized to
    /// the source; later calls keep that size), empty them, and set the
    /// recording bit of every cache (or of the cache `config.cache_id`
    /// only). Restarting drops the events recorded so far.
    ///
    /// Each ring is written without a lock by the CPU whose id it has,
    /// with its interrupts off: sound by the [`Platform`] contract
    /// (`cpu_id` exact and exclusive while interrupts are off), which
    /// every allocator already relies on, so starting is safe.
    ///
    /// # Errors
    /// [`KmemtraceError::NotInitialized`]; [`KmemtraceError::OutOfMemory`]
    /// (nothing kept, recording off); [`KmemtraceError::StackDepth`];
    /// [`KmemtraceError::TooManySubbufs`].
    pub fn start(&self, config: KmemtraceConfig) -> Result<(), KmemtraceError> {
        if !self.heap.is_ready() {
            return Err(KmemtraceError::NotInitialized);
        }
        let config = KmemtraceConfig {
            nr_subbufs: match config.nr_subbufs {
                0 => self.default_subbufs(),
                nr_subbufs => nr_subbufs,
            },
            ..config
        };
        self.stop();
        self.heap.kmemtrace.prepare::<P>(
            self.heap.primary_source(),
            self.heap.stats().nr_cpus(),
            &config,
        )?;
        self.heap.set_kmemtrace_bits(config.cache_id);
        Ok(())
    }

    /// The rings' size when [`KmemtraceConfig::nr_subbufs`] is 0 (the
    /// default), in sub-buffers per CPU ([`SUBBUF_PAGES`] pages, 1,024
    /// events each): [`DEFAULT_SUBBUFS`] (16 MiB per CPU), fewer if the
    /// rings of all CPUs would take more than a quarter of the primary
    /// source's span, at least one. So 2 CPUs on 256 MiB get 256; 64 CPUs
    /// on 255 MiB get 15 (960 KiB each, 60 MiB in all) instead of asking
    /// for 1 GiB. 0 before `init`.
    pub fn default_subbufs(&self) -> usize {
        if !self.heap.is_ready() {
            return 0;
        }
        let (start, end) = self.heap.primary_source().span();
        let per_cpu =
            end.saturating_sub(start) / RING_SPAN_DIV / self.heap.stats().nr_cpus().max(1);
        (per_cpu / (SUBBUF_PAGES * PAGE_SIZE)).clamp(1, DEFAULT_SUBBUFS)
    }

    /// Stop recording (the events stay until the next start). Frees and
    /// allocations already past the recording test may still land.
    pub fn stop(&self) {
        self.heap.kmemtrace.stop::<P>();
        self.heap.set_kmemtrace_bits(Some(u32::MAX));
    }

    /// Recording state, events and overruns summed over CPUs.
    pub fn status(&self) -> KmemtraceStatus {
        self.heap.kmemtrace.status::<P>()
    }

    /// One CPU's ring: events, overruns, capacity (all zero before the
    /// first start and for `cpu` out of range).
    pub fn cpu_status(&self, cpu: usize) -> KmemtraceCpuStatus {
        self.heap.kmemtrace.cpu_status(cpu)
    }

    /// Write a dump of the record to `sink`, in pieces: the header, a
    /// CACHE record per cache (and per cache destroyed since the record
    /// started, the last 16, so their events keep their cache's name),
    /// the stacks, each CPU's events (one record per sub-buffer, timestamps
    /// converted with `info.ticks_to_ns`), the trailer with the CRC-32 of
    /// everything before it. May run while recording: each ring is read up
    /// to the events published when the dump reaches it. `sink` must not
    /// create or destroy caches (the cache list is locked around the
    /// CACHE records).
    pub fn dump(&self, info: &DumpInfo<'_>, sink: &mut dyn FnMut(&[u8])) -> DumpSummary {
        let mut caches = |emit: &mut dyn FnMut(CacheRecord<'_>)| {
            self.heap.for_each_cache(|cache| emit(cache_record(cache)))
        };
        self.heap.kmemtrace.dump::<P>(info, &mut caches, sink)
    }

    /// Mark what happens now (a shell command line) in the record: the
    /// dump carries it as a MARK record (time, CPU, the first 64 bytes),
    /// which `magpie-kmem` draws as a marker on its timeline and Chrome
    /// trace. Nothing while not recording; at most 32 marks per record.
    /// Takes a lock: not for hot paths.
    pub fn mark(&self, text: &str) {
        self.heap.kmemtrace.mark::<P>(text);
    }
}
