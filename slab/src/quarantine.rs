//! A quarantine of freed pages: no cross-cache reuse of a slab's pages
//! soon after its cache gave them back (issue 33).
//!
//! The attack it stops: a use after free keeps a pointer into an object of
//! cache A; the attacker frees every other object of that slab, the slab
//! is reaped and its pages go back to the page source, cache B (another
//! type, another size) grows onto the same pages, and the dangling
//! pointer now points into a B object (SLUBStick, USENIX Security 2024,
//! made this >99 % reliable on stock Linux). Linux's answer is
//! `SLAB_VIRTUAL` (a slab's virtual range is never reused by another
//! cache); a kernel without a virtual-address layer of its own for slabs
//! delays reuse instead.
//!
//! [`Quarantine`] wraps a [`PageSource`]: pages freed to it (an empty
//! slab's, by a reap or a cache's destroy; a page-granular kmalloc's) wait
//! in a FIFO of up to `max_pages` pages (and `NR_ENTRIES` (256) ranges) and go
//! back to the wrapped source only when newer frees push them out, so
//! another cache (or another page-granular allocation) gets them only
//! after `max_pages` more pages were freed after them. When the wrapped
//! source is out of memory, the quarantine is emptied into it and the
//! allocation tried again: the quarantine never makes an allocation
//! fail. The allocator unregisters a slab's pages before it frees them, so
//! a `kfree` of a dangling pointer into quarantined pages is refused as
//! memory the allocator does not own.
//!
//! Cost: `max_pages` pages of memory at most (the kernel: 256 pages,
//! 1 MiB of 255 MiB), a lock and a ring slot per page free (a slow path:
//! reaps and page-granular frees), nothing on the magazine hits.
//! `Quarantine::new(&SOURCE, max_pages)` is `const`: a `static` beside the
//! source, passed to [`Kmem::init`](crate::Kmem::init) in its place.

use core::marker::PhantomData;
use core::ptr::NonNull;

use crate::error::AllocError;
use crate::platform::{ArenaStats, PageSource, Platform};
use crate::sync::SpinIrq;

/// Ranges the quarantine holds at most (each a slab's or a page-granular
/// block's pages).
pub(crate) const NR_ENTRIES: usize = 256;

/// One freed range: `nr_pages` pages at `addr`.
#[derive(Clone, Copy)]
struct Entry {
    addr: usize,
    nr_pages: usize,
}

/// The FIFO: a ring, `len` ranges from `head` (the oldest) on.
struct Fifo {
    entries: [Entry; NR_ENTRIES],
    head: usize,
    len: usize,
    nr_pages: usize,
}

impl Fifo {
    /// Put `entry` in as the newest (the caller checked there is room).
    fn push(&mut self, entry: Entry) {
        self.entries[(self.head + self.len) % NR_ENTRIES] = entry;
        self.len += 1;
        self.nr_pages += entry.nr_pages;
    }

    /// Take the oldest range out.
    fn pop_oldest(&mut self) -> Option<Entry> {
        if self.len == 0 {
            return None;
        }
        let oldest = self.entries[self.head];
        self.head = (self.head + 1) % NR_ENTRIES;
        self.len -= 1;
        self.nr_pages -= oldest.nr_pages;
        Some(oldest)
    }
}

/// A [`PageSource`] that keeps freed pages from reuse until `max_pages`
/// newer pages were freed (see the module doc). `P` is the platform whose
/// interrupt control guards the FIFO.
pub struct Quarantine<P: Platform, S: PageSource + 'static> {
    inner: &'static S,
    max_pages: usize,
    fifo: SpinIrq<Fifo>,
    _platform: PhantomData<fn() -> P>,
}

impl<P: Platform, S: PageSource + 'static> Quarantine<P, S> {
    /// Pages freed to it wait for `max_pages` newer pages before they go
    /// back to `inner` (`max_pages` 0: no quarantine, every free goes
    /// through at once).
    #[track_caller]
    pub const fn new(inner: &'static S, max_pages: usize) -> Self {
        Quarantine {
            inner,
            max_pages,
            fifo: SpinIrq::new(Fifo {
                entries: [Entry {
                    addr: 0,
                    nr_pages: 0,
                }; NR_ENTRIES],
                head: 0,
                len: 0,
                nr_pages: 0,
            }),
            _platform: PhantomData,
        }
    }

    /// The wrapped source.
    pub fn inner(&self) -> &'static S {
        self.inner
    }

    /// Pages held now.
    pub fn nr_pages_held(&self) -> usize {
        self.fifo.lock::<P>().nr_pages
    }

    /// The most pages it holds.
    pub fn max_pages(&self) -> usize {
        self.max_pages
    }

    /// Give every held page back to the wrapped source (memory pressure,
    /// or a caller that wants them now). Returns the pages given back.
    pub fn flush(&self) -> usize {
        let mut nr_pages = 0;
        // One range at a time, the source called with the FIFO unlocked.
        while let Some(entry) = self.fifo.lock::<P>().pop_oldest() {
            nr_pages += entry.nr_pages;
            self.release(entry);
        }
        nr_pages
    }

    /// Back to the wrapped source.
    fn release(&self, entry: Entry) {
        if let Some(addr) = NonNull::new(entry.addr as *mut u8) {
            // SAFETY: a range freed to us (so from `inner`, per our
            // `free_pages` contract) and taken out of the FIFO: freed once.
            unsafe { self.inner.free_pages(addr, entry.nr_pages) };
        }
    }
}

impl<P: Platform, S: PageSource + 'static> PageSource for Quarantine<P, S> {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn alloc_pages(&self, nr_pages: usize) -> Result<NonNull<u8>, AllocError> {
        match self.inner.alloc_pages(nr_pages) {
            Err(AllocError::OutOfMemory) if self.flush() > 0 => self.inner.alloc_pages(nr_pages),
            result => result,
        }
    }

    unsafe fn free_pages(&self, addr: NonNull<u8>, nr_pages: usize) {
        let entry = Entry {
            addr: addr.as_ptr() as usize,
            nr_pages,
        };
        if nr_pages > self.max_pages {
            self.release(entry);
            return;
        }
        loop {
            // Push when the range fits, else push the oldest out first
            // (given back with the FIFO unlocked).
            let oldest = {
                let mut fifo = self.fifo.lock::<P>();
                if fifo.len < NR_ENTRIES && fifo.nr_pages + nr_pages <= self.max_pages {
                    fifo.push(entry);
                    return;
                }
                fifo.pop_oldest()
            };
            match oldest {
                Some(oldest) => self.release(oldest),
                // Empty and still no room: cannot happen (nr_pages <=
                // max_pages), but never lose the range.
                None => return self.release(entry),
            }
        }
    }

    fn span(&self) -> (usize, usize) {
        self.inner.span()
    }

    /// The wrapped source's figures: held pages count as allocated.
    fn stats(&self) -> ArenaStats {
        self.inner.stats()
    }

    fn zeroes_pages(&self) -> bool {
        self.inner.zeroes_pages()
    }

    unsafe fn resize_pages(&self, addr: NonNull<u8>, nr_pages: usize, new_nr_pages: usize) -> bool {
        // SAFETY: per our caller (a live block of ours, from `inner`).
        unsafe { self.inner.resize_pages(addr, nr_pages, new_nr_pages) }
    }
}
