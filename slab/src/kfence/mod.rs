//! KFENCE: sampled guarded allocations, on by default (after Linux
//! `mm/kfence/core.c`, `Documentation/dev-tools/kfence.rst`).
//!
//! A pool of [`KFENCE_POOL_PAGES`] pages from the platform
//! ([`PlatformHooks::kfence_pool`](crate::PlatformHooks::kfence_pool)): pages 0 and 1 are guards, then object page,
//! guard page, object page, … — [`KFENCE_NUM_OBJECTS`] object pages, each
//! between two guard pages the platform keeps unmapped
//! ([`PlatformHooks::kfence_protect`](crate::PlatformHooks::kfence_protect)). Once every sample interval
//! ([`Kfence::set_interval`](crate::kfence::Kfence::set_interval), Linux `kfence.sample_interval`, in
//! ms) the next allocation of an eligible cache is served from the pool:
//!
//! ```text
//!  page:  0      1      2            3      4            5   …  127
//!        guard  guard  [canary|obj]  guard  [obj|canary]  guard   guard
//!                       right-placed        left-placed
//! ```
//!
//! The object sits at its page's right end (aligned down to the cache's
//! alignment) or its left end, alternately, so that an overflow or an
//! underflow runs into a guard page and faults; the rest of the page holds
//! a canary (`0xaa ^ (addr & 7)`, Linux's pattern) checked at the free. A
//! freed object's page is unmapped, so a use after free faults too; freed
//! objects are reused least-recently-freed first.
//!
//! The hit pays nothing: arming sets the `SAMPLE` bit in every cache's
//! hot-flags word (the word the hit tests anyway), the next allocation of
//! a cache takes the flagged path, claims the sample (one per interval,
//! over all caches) and clears its bit. The free pays nothing either: a
//! pool address is in no slab page, so the owner lookup misses and the
//! slow path asks the pool before reporting a bad free. The interval
//! runs on the magazine-miss path's clock ([`PlatformHooks::kfence_clock_ns`](crate::PlatformHooks::kfence_clock_ns)).
//!
//! Eligible caches: keyed ones (no constructor, no debug flags, not
//! `NOTOUCH`, not bootstrap, not traced or recorded) with objects of at
//! most a page. A sample counts in its cache's statistics, is charged to
//! its allocation tag, and is an object of its cache to the leak scan.
//!
//! The platform turns a fault in the pool into a report with
//! [`Kfence::fault`](crate::kfence::Kfence::fault) (which maps the page back in, so the faulting
//! access completes and the kernel carries on); bad frees and canary
//! corruption are reported at the free to the hook of
//! [`Kfence::set_hook`](crate::kfence::Kfence::set_hook). Reports are [`KfenceReport`]s, written
//! in KFENCE's layout by [`KfenceReport::display`].
//!
//! **TLBs.** [`PlatformHooks::kfence_protect`](crate::PlatformHooks::kfence_protect) need flush only this CPU's TLB
//! (the kernel's `invlpg`), as Linux's x86 `kfence_protect_page` does on
//! purpose (`arch/x86/include/asm/kfence.h`: it flushes the local TLB
//! only, on the assumption that the code that allocated or freed goes on
//! running on this CPU): another CPU with a stale entry may miss a use
//! after free or an overflow into a guard page until its entry goes. No
//! shootdown: a missed report on another CPU is the accepted cost of
//! sampling with no cross-CPU interrupts (which a free from an interrupt
//! handler could not wait for anyway).

mod object;
pub(crate) mod pool;
mod report;

use core::ptr::NonNull;
use core::sync::atomic::Ordering;

pub(crate) use self::object::canary;
pub use self::object::{
    KFENCE_DEFAULT_INTERVAL_MS, KFENCE_NUM_OBJECTS, KFENCE_POOL_PAGES, KFENCE_STACK_DEPTH,
    KfenceError, KfenceObject, KfencePlace, KfenceStack, KfenceState, KfenceStats,
};
pub(crate) use self::pool::{PoolState, object_of_page, object_page};
pub use self::report::{KfenceBug, KfenceReport, KfenceReportDisplay};
use crate::alloc_tag::AllocTagRef;
use crate::allocator::Kmem;
use crate::cache::{HotFlags, KfenceOwner, KmemCache};
use crate::error::FreeError;
use crate::platform::{PAGE_SIZE, Platform};
use crate::reports::error::ReportName;
use crate::sync::IrqGuard;

/// KFENCE's controls and queries for one allocator, from
/// [`Kmem::kfence`].
#[derive(Clone, Copy)]
pub struct Kfence<'a, P: Platform> {
    heap: &'a Kmem<P>,
}

impl<P: Platform> Kmem<P> {
    /// KFENCE's controls and queries: [`Kfence`].
    pub fn kfence(&self) -> Kfence<'_, P> {
        Kfence { heap: self }
    }

    /// Whether `addr` is in the KFENCE pool ([`Kfence::contains`]).
    pub(crate) fn kfence_contains(&self, addr: usize) -> bool {
        self.kfence.contains(addr)
    }

    /// [`Kfence::object`].
    pub(crate) fn kfence_object(&self, addr: usize) -> Option<KfenceObject> {
        if !self.kfence.contains(addr) {
            return None;
        }
        let _irq = IrqGuard::<P>::new();
        let mut state = self.kfence.lock.lock::<P>();
        let index = self.kfence_nearest(&mut state, addr)?;
        Some(*state.meta(index))
    }

    /// Whether `cache` may be sampled: keyed (no constructor, debug flags
    /// or `NOTOUCH`), not bootstrap, objects of at most a page, and not
    /// traced or recorded now (the trace table and kmemtrace account for
    /// every object exactly; a traced cache is being debugged already).
    fn kfence_eligible(cache: &KmemCache<P>) -> bool {
        !cache.hot().intersects(
            HotFlags::KEYLESS
                | HotFlags::BOOTSTRAP
                | HotFlags::DEBUG
                | HotFlags::TRACED
                | HotFlags::KMEMTRACE,
        ) && cache.obj_size() <= PAGE_SIZE
    }

    /// Arm a sample: every cache's next allocation takes the flagged path.
    fn kfence_arm(&self) {
        if !self.kfence.armed.swap(true, Ordering::AcqRel) {
            self.for_each_cache(|cache| cache.set_hot(HotFlags::SAMPLE));
        }
    }

    /// The interval has perhaps passed: arm a sample (every cache's
    /// `SAMPLE` bit), unless the cache list is busy (then the next miss
    /// tries again: this runs inside allocations, which may happen under
    /// the list lock). A sample still armed from an earlier interval gets
    /// the bits again: each cache clears its own at its next allocation,
    /// sampled or not, so a sample armed while no cache was eligible (the
    /// trace table or kmemtrace on every cache) would otherwise stay
    /// armed with no bit set, and KFENCE would never sample again.
    #[inline(never)]
    fn kfence_tick_due(&self, interval: u64) {
        let now = P::kfence_clock_ns();
        if now < self.kfence.next_ns.load(Ordering::Relaxed) {
            return;
        }
        let was_armed = self.kfence.armed.swap(true, Ordering::AcqRel);
        if self.try_for_each_cache(|cache| cache.set_hot(HotFlags::SAMPLE)) {
            self.kfence
                .next_ns
                .store(now.saturating_add(interval), Ordering::Relaxed);
        } else if !was_armed {
            self.kfence.armed.store(false, Ordering::Release);
        }
    }

    /// Call `f(start, size, cache, site)` for every allocated sample (its
    /// cache type-erased, its tag's charge token): the leak scan's entries
    /// for samples, which are in no slab. A snapshot: the pool lock is not
    /// held during the calls.
    #[cfg(feature = "leak-scan")]
    pub(crate) fn kfence_for_each_sample(
        &self,
        mut f: impl FnMut(usize, usize, usize, Option<AllocTagRef>),
    ) {
        if self.kfence.pool.load(Ordering::Acquire) == 0 {
            return;
        }
        let mut live = [(0usize, 0usize, 0usize, None); KFENCE_NUM_OBJECTS];
        let mut nr = 0;
        {
            let _irq = IrqGuard::<P>::new();
            let mut state = self.kfence.lock.lock::<P>();
            for index in 0..KFENCE_NUM_OBJECTS {
                let meta = state.meta(index);
                if meta.state == KfenceState::Allocated {
                    live[nr] = (meta.addr, meta.size, meta.cache_ptr, meta.tag);
                    nr += 1;
                }
            }
        }
        for &(start, size, cache, site) in &live[..nr] {
            f(start, size, cache, site);
        }
    }

    /// Copy `out.len()` words from `from` (aligned, inside the sample at
    /// `addr`) if that sample is still allocated, under the pool's lock:
    /// the leak scan reads samples so, since a sample freed meanwhile (on
    /// another CPU, or in an interrupt handler) has its page unmapped and
    /// a plain read would fault and be reported as a use after free.
    /// False (nothing copied) if it is not allocated any more.
    #[cfg(feature = "leak-scan")]
    pub(crate) fn kfence_read_sample(&self, addr: usize, from: usize, out: &mut [usize]) -> bool {
        if !self.kfence_contains(addr) {
            return false;
        }
        let _irq = IrqGuard::<P>::new();
        let mut state = self.kfence.lock.lock::<P>();
        let Some(index) = self.kfence_nearest(&mut state, addr) else {
            return false;
        };
        let meta = *state.meta(index);
        let end = from.saturating_add(core::mem::size_of_val(out));
        if meta.state != KfenceState::Allocated
            || meta.addr != addr
            || from < addr
            || end > addr + meta.size
            || !from.is_multiple_of(core::mem::size_of::<usize>())
        {
            return false;
        }
        for (index, word) in out.iter_mut().enumerate() {
            // SAFETY: inside an allocated sample, whose page stays mapped
            // while we hold the pool's lock (a free protects it under the
            // lock); aligned (checked above).
            *word = unsafe {
                core::ptr::read_volatile(
                    (from + index * core::mem::size_of::<usize>()) as *const usize,
                )
            };
        }
        true
    }

    /// The object `addr` belongs to, or for a guard page the nearer
    /// allocated neighbour (Linux `kfence_handle_page_fault`).
    fn kfence_nearest(&self, state: &mut PoolState, addr: usize) -> Option<usize> {
        let pool = self.kfence.pool.load(Ordering::Acquire);
        let page = (addr - pool) / PAGE_SIZE;
        if let Some(index) = object_of_page(page) {
            return Some(index);
        }
        let left = (page >= 3).then(|| (page - 3) / 2);
        let right = (page + 1 < KFENCE_POOL_PAGES).then(|| (page.max(1) - 1) / 2);
        let distance = |state: &mut PoolState, index: usize| {
            let meta = *state.meta(index);
            if meta.state == KfenceState::Unused {
                return usize::MAX;
            }
            if addr < meta.addr {
                meta.addr - addr
            } else {
                addr - (meta.addr + meta.size) + 1
            }
        };
        match (left, right) {
            (Some(l), Some(r)) => {
                if distance(state, l) <= distance(state, r) {
                    Some(l)
                } else {
                    Some(r)
                }
            }
            (l, r) => l.or(r),
        }
    }

    /// `kmem whatis` of a pool address: the allocated sample whose page
    /// holds `addr` (the canary around it shows as its redzone; `slab` is
    /// 0). `None` for guard pages and free slots.
    pub(crate) fn kfence_whatis(&self, addr: usize) -> Option<crate::verify::WhatIs<P>> {
        let object = self.kfence_object(addr)?;
        let pool = self.kfence.pool.load(Ordering::Acquire);
        if object.state != KfenceState::Allocated
            || object_of_page((addr - pool) / PAGE_SIZE) != Some(object.index)
        {
            return None;
        }
        // SAFETY: the cache of an allocated sample: alive.
        let cache: &'static KmemCache<P> = unsafe { &*(object.cache_ptr as *const KmemCache<P>) };
        let inside = (object.addr..object.addr + object.size).contains(&addr);
        Some(crate::verify::WhatIs {
            addr,
            cache,
            object: object.addr,
            offset: addr.wrapping_sub(object.addr),
            region: if inside {
                crate::verify::ObjectRegion::Object
            } else {
                crate::verify::ObjectRegion::Redzone
            },
            slab: 0,
            allocated: true,
            resting: "kfence pool",
            last_alloc: None,
            last_free: None,
        })
    }

    /// The usable size of a sampled object at `addr` (`None`: not the start
    /// of an allocated pool object).
    pub(crate) fn kfence_ksize(&self, addr: usize) -> Option<usize> {
        let object = self.kfence_object(addr)?;
        (object.state == KfenceState::Allocated && object.addr == addr).then_some(object.size)
    }

    /// Count and hand a report to the hook.
    fn kfence_report(&self, report: KfenceReport) {
        self.kfence.nr_bugs.fetch_add(1, Ordering::Relaxed);
        // Interrupts off while the hook's lock is held: a free in an
        // interrupt handler on this CPU may report too.
        let hook = {
            let _irq = IrqGuard::<P>::new();
            *self.kfence.hook.lock::<P>()
        };
        if let Some(hook) = hook {
            hook(&report);
        }
    }

    fn kfence_report_counted(&self) {
        self.kfence.nr_bugs.fetch_add(1, Ordering::Relaxed);
    }
}

/// The hooks a cache reaches KFENCE by (its owner's pool, handed down:
/// [`KfenceOwner`], a part of `CacheOwner`); `kfree` calls them too.
impl<P: Platform> KfenceOwner<P> for Kmem<P> {
    /// The slow paths' clock check: arm a sample if the interval has
    /// passed. A load and a test while sampling is off.
    #[inline]
    fn kfence_tick(&self) {
        let interval = self.kfence.interval_ns.load(Ordering::Relaxed);
        if interval == 0 {
            return;
        }
        self.kfence_tick_due(interval);
    }

    /// Serve a sampled allocation of `cache` (`size` bytes, 0: the
    /// object size): `None` if the cache is not eligible, the sample was
    /// taken by another allocation, or the pool is full. Clears the
    /// cache's `SAMPLE` bit. Charged to `tag()` (asked with profiling on)
    /// and counted in the cache's statistics as its other objects are.
    #[cold]
    #[inline(never)]
    fn kfence_alloc(
        &self,
        cache: &KmemCache<P>,
        size: usize,
        tag: &dyn Fn() -> Option<AllocTagRef>,
    ) -> Option<NonNull<u8>> {
        // This CPU's per-CPU cache held throughout, to count the sample:
        // if a hit this interrupted holds it, no sample now (the bit
        // stays: the next allocation tries again).
        if !cache.has_magazines() {
            return None;
        }
        let irq = IrqGuard::<P>::new();
        let mut locked = cache.pcpu_lock_here(&irq)?;
        cache.clear_hot(HotFlags::SAMPLE);
        if !Kmem::<P>::kfence_eligible(cache) || !self.kfence.armed.load(Ordering::Relaxed) {
            return None;
        }
        let this = cache as *const KmemCache<P> as usize;
        let target = self.kfence.target.load(Ordering::Acquire);
        if target != 0 && target != this {
            return None;
        }
        if !self.kfence.armed.swap(false, Ordering::AcqRel) {
            return None;
        }
        self.kfence.target.store(0, Ordering::Relaxed);
        let size = if size == 0 {
            cache.obj_size()
        } else {
            size.min(cache.obj_size())
        };
        // Objects of a cache are aligned to its alignment and, in a slab,
        // to the largest power of two dividing their size.
        let align = cache
            .align()
            .max(1 << cache.obj_size().trailing_zeros())
            .min(PAGE_SIZE);
        let pool = self.kfence.pool.load(Ordering::Acquire);
        let alloc = KfenceStack::capture::<P>();
        let tag = if cache.hot().contains(HotFlags::PROFILING) {
            tag()
        } else {
            None
        };
        let _irq = IrqGuard::<P>::new();
        let mut state = self.kfence.lock.lock::<P>();
        if state.len == 0 {
            self.kfence.nr_skipped.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        let index = usize::from(state.free[state.head]);
        state.head = (state.head + 1) % KFENCE_NUM_OBJECTS;
        state.len -= 1;
        let right = match state.forced.take() {
            Some(place) => place == KfencePlace::Right,
            None => {
                state.next_right = !state.next_right;
                !state.next_right
            }
        };
        let page = pool + object_page(index) * PAGE_SIZE;
        let addr = if right {
            (page + PAGE_SIZE - size) & !(align - 1)
        } else {
            page
        };
        // The guards again (a report may have mapped one in), then the page.
        P::kfence_protect(page - PAGE_SIZE, true);
        P::kfence_protect(page + PAGE_SIZE, true);
        P::kfence_protect(page, false);
        for byte in (page..addr).chain(addr + size..page + PAGE_SIZE) {
            // SAFETY: the object's page, mapped above, ours under the lock.
            unsafe { (byte as *mut u8).write(canary(byte)) };
        }
        *state.meta(index) = KfenceObject {
            index,
            state: KfenceState::Allocated,
            addr,
            size,
            cache: ReportName::new(cache.name()),
            alloc,
            free: KfenceStack::EMPTY,
            cache_ptr: cache as *const KmemCache<P> as usize,
            tag,
        };
        drop(state);
        self.kfence.nr_allocs.fetch_add(1, Ordering::Relaxed);
        // SAFETY: in the pool, not null.
        let obj = unsafe { NonNull::new_unchecked(addr as *mut u8) };
        #[cfg(feature = "alloc-profiling")]
        if let Some(token) = tag {
            // SAFETY: `tag` is a charge token (the tag closures return the
            // platform's tokens, as for every profiled allocation).
            unsafe { crate::alloc_tag::charge_off_hit::<P>(token, obj, cache.obj_size()) };
        }
        let pcc = locked.get();
        pcc.nr_allocs += 1;
        pcc.nr_rounds_exchanged = pcc.nr_rounds_exchanged.wrapping_add(1);
        Some(obj)
    }

    /// Free `addr` if it is in the pool (`None`: it is not, nothing done):
    /// a bad free (not an allocated object's start; freed to another
    /// `cache` than its own) is reported and refused; a good one has its
    /// canary checked (corruption reported, the free goes on), its page
    /// unmapped, and joins the back of the free queue. `cache`: the cache
    /// freed to (`KmemCache::free`, whose free path records its kmemtrace
    /// event), or `None` for a `kfree` (or `GlobalAlloc::dealloc`), whose
    /// event is recorded here: the object's cache's if it is recorded, a
    /// refused free if no object starts at `addr`.
    ///
    /// The free is counted in its cache's statistics as the magazines
    /// count their objects (a round that left; the allocation counted as
    /// the allocation of a round that came in), so `nr_allocated` and the
    /// `_ever` figures include samples. If this CPU's per-CPU cache is
    /// held (an interrupt handler that interrupted a magazine hit freed
    /// the sample), it is counted as one straight to the slab layer
    /// (`nr_frees_direct`) instead: the same figures.
    #[cold]
    #[inline(never)]
    fn kfence_free(
        &self,
        addr: usize,
        cache: Option<&KmemCache<P>>,
    ) -> Option<Result<(), FreeError>> {
        if !self.kfence.contains(addr) {
            return None;
        }
        let stack = KfenceStack::capture::<P>();
        let pool = self.kfence.pool.load(Ordering::Acquire);
        let irq = IrqGuard::<P>::new();
        let mut state = self.kfence.lock.lock::<P>();
        let page = (addr - pool) / PAGE_SIZE;
        let index = object_of_page(page);
        let object = index.map(|index| *state.meta(index));
        let good = object.filter(|o| o.state == KfenceState::Allocated && o.addr == addr);
        let Some(object) = good else {
            let double = object.is_some_and(|o| o.state == KfenceState::Freed && o.addr == addr);
            let nearest = self
                .kfence_nearest(&mut state, addr)
                .map(|i| *state.meta(i));
            drop(state);
            drop(irq);
            self.kfence_report(KfenceReport::new(
                KfenceBug::InvalidFree,
                addr,
                nearest,
                stack,
            ));
            #[cfg(feature = "kmemtrace")]
            if cache.is_none() && self.kmemtrace.recording_all.load(Ordering::Relaxed) {
                // KMEMTRACE HOOK: kfree of a pool address that is no object.
                // SAFETY: a pool address, not null.
                self.kmemtrace_free(
                    None,
                    unsafe { NonNull::new_unchecked(addr as *mut u8) },
                    false,
                );
            }
            return Some(Err(if double {
                FreeError::DoubleFree { addr }
            } else {
                FreeError::NotAllocated { addr }
            }));
        };
        if let Some(cache) = cache
            && cache as *const KmemCache<P> as usize != object.cache_ptr
        {
            drop(state);
            drop(irq);
            self.kfence_report(KfenceReport::new(
                KfenceBug::InvalidFree,
                addr,
                Some(object),
                stack,
            ));
            return Some(Err(FreeError::WrongCache { addr }));
        }
        let page = pool + page * PAGE_SIZE;
        let corrupt = (page..object.addr)
            .chain(object.addr + object.size..page + PAGE_SIZE)
            // SAFETY: the object's page, mapped while it is allocated.
            .find(|&byte| unsafe { (byte as *const u8).read() } != canary(byte));
        let mut report = None;
        if let Some(first) = corrupt {
            let mut bytes = [None; 16];
            for (i, slot) in bytes.iter_mut().enumerate() {
                let byte = first + i;
                let in_canary = byte < page + PAGE_SIZE
                    && !(object.addr..object.addr + object.size).contains(&byte);
                if in_canary {
                    // SAFETY: as above, inside the page.
                    let seen = unsafe { (byte as *const u8).read() };
                    *slot = Some((seen, seen != canary(byte)));
                }
            }
            let mut r = KfenceReport::new(KfenceBug::Corruption, first, Some(object), stack);
            r.bytes = bytes;
            report = Some(r);
        }
        let meta = state.meta(object.index);
        meta.state = KfenceState::Freed;
        meta.free = stack;
        P::kfence_protect(page, true);
        let tail = (state.head + state.len) % KFENCE_NUM_OBJECTS;
        state.free[tail] = object.index as u8;
        state.len += 1;
        drop(state);
        drop(irq);
        self.kfence.nr_frees.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the cache of an object allocated until now: alive (a
        // cache is not destroyed while its objects are in use).
        let owner = unsafe { &*(object.cache_ptr as *const KmemCache<P>) };
        if owner.has_magazines() {
            let irq = IrqGuard::<P>::new();
            if let Some(mut locked) = owner.pcpu_lock_here(&irq) {
                let pcc = locked.get();
                pcc.nr_rounds_exchanged = pcc.nr_rounds_exchanged.wrapping_sub(1);
            } else {
                owner.nr_frees_direct.fetch_add(1, Ordering::Relaxed);
            }
        }
        #[cfg(feature = "trace-table")]
        if owner.hot().contains(HotFlags::EVER_TRACED) {
            // Sampled before tracing started, maybe; no record then.
            owner.trace.record_free(owner, addr);
        }
        #[cfg(feature = "alloc-profiling")]
        if let Some(token) = object.tag {
            // SAFETY: the token this object was charged with, once.
            unsafe {
                crate::alloc_tag::uncharge_off_hit::<P>(
                    token,
                    NonNull::new_unchecked(addr as *mut u8),
                    owner.obj_size(),
                )
            };
        }
        if let Some(mut report) = report {
            if let Some(o) = report.object.as_mut() {
                o.state = KfenceState::Freed;
                o.free = stack;
            }
            self.kfence_report(report);
        }
        #[cfg(feature = "kmemtrace")]
        if cache.is_none() && owner.hot().contains(HotFlags::KMEMTRACE) {
            // KMEMTRACE HOOK: kfree of a sampled object.
            // SAFETY: a pool address, not null.
            self.kmemtrace_free(
                Some(owner),
                unsafe { NonNull::new_unchecked(addr as *mut u8) },
                true,
            );
        }
        Some(Ok(()))
    }
}

impl<P: Platform> Kfence<'_, P> {
    /// Set up the KFENCE pool ([`KFENCE_POOL_PAGES`] pages from
    /// [`PlatformHooks::kfence_pool`](crate::PlatformHooks::kfence_pool), every page unmapped until used) and
    /// sample every `interval_ms` ms (0: only when forced, see
    /// [`Kfence::force_sample`](crate::kfence::Kfence::force_sample)). Call once, after `init`.
    ///
    /// # Errors
    /// [`KfenceError`]: no pool from the platform, no memory for the
    /// metadata, or a pool exists already.
    pub fn init(&self, interval_ms: u64) -> Result<(), KfenceError> {
        if !self.heap.is_ready() {
            return Err(KfenceError::NoMemory);
        }
        if self.heap.kfence.pool.load(Ordering::Acquire) != 0 {
            return Err(KfenceError::AlreadyInitialized);
        }
        let pool = P::kfence_pool(KFENCE_POOL_PAGES).ok_or(KfenceError::Unsupported)?;
        let pool = pool.as_ptr() as usize;
        let meta_bytes = KFENCE_NUM_OBJECTS * core::mem::size_of::<KfenceObject>();
        let meta_pages = meta_bytes.div_ceil(PAGE_SIZE);
        let meta = self
            .heap
            .primary_source()
            .alloc_pages(meta_pages)
            .map_err(|_| KfenceError::NoMemory)?
            .cast::<KfenceObject>()
            .as_ptr();
        for index in 0..KFENCE_NUM_OBJECTS {
            // SAFETY: meta_pages fresh pages hold KFENCE_NUM_OBJECTS
            // entries (page-aligned, so aligned for KfenceObject).
            unsafe {
                meta.add(index).write(KfenceObject {
                    index,
                    ..KfenceObject::UNUSED
                });
            }
        }
        for page in 0..KFENCE_POOL_PAGES {
            if !P::kfence_protect(pool + page * PAGE_SIZE, true) {
                return Err(KfenceError::Unsupported);
            }
        }
        {
            let _irq = IrqGuard::<P>::new();
            let mut state = self.heap.kfence.lock.lock::<P>();
            state.meta = meta;
            for (slot, index) in state.free.iter_mut().zip(0u8..) {
                *slot = index;
            }
            state.head = 0;
            state.len = KFENCE_NUM_OBJECTS;
        }
        self.heap.kfence.meta.store(meta, Ordering::Release);
        self.heap.kfence.pool.store(pool, Ordering::Release);
        self.set_interval(interval_ms);
        Ok(())
    }

    /// Sample every `interval_ms` ms (Linux `kfence.sample_interval`); 0
    /// switches sampling off (forced samples still work).
    pub fn set_interval(&self, interval_ms: u64) {
        let ns = interval_ms.saturating_mul(1_000_000);
        self.heap.kfence.interval_ns.store(ns, Ordering::Relaxed);
        self.heap
            .kfence
            .next_ns
            .store(P::kfence_clock_ns().saturating_add(ns), Ordering::Relaxed);
    }

    /// The hook called with every report made at a free (invalid or double
    /// free, canary corruption). Fault reports are returned by
    /// [`Kfence::fault`](crate::kfence::Kfence::fault) instead.
    pub fn set_hook(&self, hook: Option<fn(&KfenceReport)>) {
        let _irq = IrqGuard::<P>::new();
        *self.heap.kfence.hook.lock::<P>() = hook;
    }

    /// Sample the next eligible allocation (of any cache), placed as
    /// `place` says (`None`: the next in turn). False if there is no pool.
    pub fn force_sample(&self, place: Option<KfencePlace>) -> bool {
        if self.heap.kfence.pool.load(Ordering::Acquire) == 0 {
            return false;
        }
        {
            let _irq = IrqGuard::<P>::new();
            self.heap.kfence.lock.lock::<P>().forced = place;
        }
        self.heap.kfence.target.store(0, Ordering::Release);
        self.heap.kfence_arm();
        true
    }

    /// Sample the next allocation of `cache` (and of no other), placed as
    /// `place` says: how `lkdtm` puts its victim in the pool. False if
    /// there is no pool or the cache is not eligible (a constructor, debug
    /// flags, `NOTOUCH`, objects over a page).
    pub fn force_sample_of(&self, cache: &KmemCache<P>, place: Option<KfencePlace>) -> bool {
        if self.heap.kfence.pool.load(Ordering::Acquire) == 0 || !Kmem::<P>::kfence_eligible(cache)
        {
            return false;
        }
        {
            let _irq = IrqGuard::<P>::new();
            self.heap.kfence.lock.lock::<P>().forced = place;
        }
        self.heap
            .kfence
            .target
            .store(cache as *const KmemCache<P> as usize, Ordering::Release);
        self.heap.kfence.armed.store(true, Ordering::Release);
        cache.set_hot(HotFlags::SAMPLE);
        true
    }

    /// Pool figures.
    pub fn stats(&self) -> KfenceStats {
        let enabled = self.heap.kfence.pool.load(Ordering::Acquire) != 0;
        let free = if enabled {
            let _irq = IrqGuard::<P>::new();
            self.heap.kfence.lock.lock::<P>().len
        } else {
            0
        };
        KfenceStats {
            enabled,
            interval_ms: self.heap.kfence.interval_ns.load(Ordering::Relaxed) / 1_000_000,
            pool_pages: if enabled { KFENCE_POOL_PAGES } else { 0 },
            nr_objects: if enabled { KFENCE_NUM_OBJECTS } else { 0 },
            nr_in_use: if enabled {
                KFENCE_NUM_OBJECTS - free
            } else {
                0
            },
            nr_allocs: self.heap.kfence.nr_allocs.load(Ordering::Relaxed),
            nr_frees: self.heap.kfence.nr_frees.load(Ordering::Relaxed),
            nr_skipped: self.heap.kfence.nr_skipped.load(Ordering::Relaxed),
            nr_bugs: self.heap.kfence.nr_bugs.load(Ordering::Relaxed),
        }
    }

    /// Call `f` with each pool object's metadata, in index order (a copy
    /// taken under the pool lock, which is not held during the call);
    /// nothing without a pool. `kmem kfence objects` lists them.
    pub fn for_each_object(&self, mut f: impl FnMut(&KfenceObject)) {
        if self.heap.kfence.pool.load(Ordering::Acquire) == 0 {
            return;
        }
        for index in 0..KFENCE_NUM_OBJECTS {
            let object = {
                let _irq = IrqGuard::<P>::new();
                *self.heap.kfence.lock.lock::<P>().meta(index)
            };
            f(&object);
        }
    }

    /// Whether `addr` lies in the KFENCE pool.
    pub fn contains(&self, addr: usize) -> bool {
        self.heap.kfence.contains(addr)
    }

    /// The metadata of the pool object whose page (or neighbouring guard
    /// page) holds `addr`, if `addr` is in the pool: the object a report
    /// about `addr` names.
    pub fn object(&self, addr: usize) -> Option<KfenceObject> {
        self.heap.kfence_object(addr)
    }

    /// A page fault at `addr` (a `write` or a read), from code whose stack
    /// is `stack` (innermost first: the faulting instruction): if `addr` is
    /// in the pool, map its page in (so the access completes when the
    /// handler returns, as KFENCE does) and return the report to print:
    /// out-of-bounds for a guard page, use-after-free for a freed object's
    /// page, invalid access otherwise. `None`: not a pool address (a real
    /// fault). Callable from a fault handler: takes the pool lock only
    /// (never held across an access to a pool page).
    pub fn fault(&self, addr: usize, write: bool, stack: KfenceStack) -> Option<KfenceReport> {
        if !self.heap.kfence.contains(addr) {
            return None;
        }
        let pool = self.heap.kfence.pool.load(Ordering::Acquire);
        let page_index = (addr - pool) / PAGE_SIZE;
        let object = {
            let _irq = IrqGuard::<P>::new();
            let mut state = self.heap.kfence.lock.lock::<P>();
            self.heap
                .kfence_nearest(&mut state, addr)
                .map(|i| *state.meta(i))
        };
        let on_object_page = object_of_page(page_index).is_some();
        let bug = match object {
            Some(o) if on_object_page && o.state == KfenceState::Freed => KfenceBug::UseAfterFree,
            Some(o) if !on_object_page && o.state == KfenceState::Allocated => {
                KfenceBug::OutOfBounds
            }
            Some(o) if !on_object_page && o.state == KfenceState::Freed => KfenceBug::UseAfterFree,
            _ => KfenceBug::InvalidAccess,
        };
        P::kfence_protect(pool + page_index * PAGE_SIZE, false);
        let mut report = KfenceReport::new(bug, addr, object, stack);
        report.write = Some(write);
        self.heap.kfence_report_counted();
        Some(report)
    }
}
