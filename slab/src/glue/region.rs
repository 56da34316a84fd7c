//! [`RegionSource`]: a page source over one already-mapped region.

use core::marker::PhantomData;
use core::ptr::NonNull;

use spin::Mutex;

use crate::platform::{ArenaStats, PAGE_SIZE, PageSource, Platform};
use crate::{AllocError, IrqGuard};

/// Pages one bitmap page covers (a bit a page).
const PAGES_PER_BITMAP_PAGE: usize = PAGE_SIZE * 8;

/// A [`PageSource`] over one region of memory that is already mapped
/// (a hobby kernel's heap range): runs of contiguous pages, first fit,
/// freed pages reused. `const`-constructible for a `static`; given its
/// region once, by [`RegionSource::init`].
///
/// **Cost.** One bit a page, kept in the region's first pages (one page
/// of bitmap per 128 MiB: a 100 KiB region gives 24 pages to the
/// allocator), and a spin lock taken with interrupts off (through
/// [`IrqGuard`]`<P>`, so an interrupt handler that allocates cannot find
/// it held by the code it interrupted). An allocation scans the bitmap
/// from the lowest page: fine for the few page allocations a slab
/// allocator makes, not meant as a general physical memory manager.
pub struct RegionSource<P: Platform> {
    state: Mutex<Region>,
    _platform: PhantomData<fn() -> P>,
}

/// The region and its bitmap.
struct Region {
    /// First page handed out (after the bitmap).
    base: usize,
    nr_pages: usize,
    /// One bit a page, set while handed out; in the region's first pages.
    bitmap: *mut u64,
    nr_free: usize,
    nr_allocs_ever: u64,
}

// SAFETY: `bitmap` points into the region, which `init`'s caller gave to
// this source alone; it is only touched under the mutex.
unsafe impl Send for Region {}

impl<P: Platform> Default for RegionSource<P> {
    fn default() -> Self {
        Self::new()
    }
}

impl<P: Platform> RegionSource<P> {
    /// A source with no memory until [`RegionSource::init`].
    pub const fn new() -> Self {
        RegionSource {
            state: Mutex::new(Region::EMPTY),
            _platform: PhantomData,
        }
    }

    /// [`RegionSource::init`] on a region the borrow checker vouches for:
    /// a `'static` exclusive slice (a `static` buffer taken once, a leaked
    /// allocation) is mapped, writable and used by nothing else for ever.
    ///
    /// # Errors
    /// As [`RegionSource::init`].
    pub fn init_static(&self, region: &'static mut [u8]) -> Result<(), AllocError> {
        let range = region.as_mut_ptr_range();
        // SAFETY: a `'static mut` slice: mapped, readable and writable,
        // and exclusively ours for the rest of the program.
        unsafe {
            self.init(
                range.start as usize,
                range.end as usize - range.start as usize,
            )
        }
    }

    /// Give the source the `len` bytes at `start` (rounded inwards to
    /// whole pages). The first `ceil(pages / 32768)` pages hold the
    /// bitmap; the others are handed out.
    ///
    /// # Errors
    /// [`AllocError::AlreadyInitialized`] the second time;
    /// [`AllocError::InvalidLayout`] if fewer than two whole pages remain.
    /// A refused `init` changes nothing: the source stays without memory
    /// and `init` may be called again.
    ///
    /// # Safety
    /// The region is mapped, readable and writable, and used by nothing
    /// else from now on, for ever.
    pub unsafe fn init(&self, start: usize, len: usize) -> Result<(), AllocError> {
        let _irq = IrqGuard::<P>::new();
        let mut region = self.state.lock();
        if !region.bitmap.is_null() {
            return Err(AllocError::AlreadyInitialized);
        }
        let first = start
            .checked_next_multiple_of(PAGE_SIZE)
            .ok_or(AllocError::InvalidLayout)?;
        let end = start.checked_add(len).ok_or(AllocError::InvalidLayout)? & !(PAGE_SIZE - 1);
        let nr_total = end.saturating_sub(first) / PAGE_SIZE;
        let nr_bitmap_pages = nr_total.div_ceil(PAGES_PER_BITMAP_PAGE);
        if nr_total < nr_bitmap_pages + 1 || first == 0 {
            return Err(AllocError::InvalidLayout);
        }
        let bitmap = first as *mut u64;
        // SAFETY: the region's first pages are ours (the caller's
        // contract), page-aligned hence u64-aligned.
        unsafe { core::ptr::write_bytes(bitmap, 0, nr_bitmap_pages * PAGE_SIZE / 8) };
        // The bits past the last page, in its word, read as used: `find`
        // takes a word at a time and must not see them free.
        let nr_pages = nr_total - nr_bitmap_pages;
        if !nr_pages.is_multiple_of(64) {
            // SAFETY: the last word covering nr_pages, in the bitmap pages.
            unsafe { *bitmap.add(nr_pages / 64) = !0 << (nr_pages % 64) };
        }
        *region = Region {
            base: first + nr_bitmap_pages * PAGE_SIZE,
            nr_pages,
            bitmap,
            nr_free: nr_pages,
            nr_allocs_ever: 0,
        };
        Ok(())
    }
}

impl<P: Platform> RegionSource<P> {
    /// Forget the region [`RegionSource::init`] gave, if none of its pages
    /// is handed out: the source is as [`RegionSource::new`] made it, and
    /// may be given a region again (the old one is no longer touched).
    /// Returns whether it was forgotten (false: pages are out, or there
    /// was no region). A [`Heap`](crate::Heap) whose allocator refused to
    /// come up on the region (which gives back every page it took) calls
    /// it, so that its init can be retried.
    pub(crate) fn forget(&self) -> bool {
        let _irq = IrqGuard::<P>::new();
        let mut region = self.state.lock();
        if region.bitmap.is_null() || region.nr_free != region.nr_pages {
            return false;
        }
        *region = Region::EMPTY;
        true
    }
}

impl Region {
    /// No region: what [`RegionSource::new`] holds.
    const EMPTY: Region = Region {
        base: 0,
        nr_pages: 0,
        bitmap: core::ptr::null_mut(),
        nr_free: 0,
        nr_allocs_ever: 0,
    };

    fn is_used(&self, page: usize) -> bool {
        // SAFETY: page < nr_pages: its word lies in the bitmap.
        unsafe { *self.bitmap.add(page / 64) & (1 << (page % 64)) != 0 }
    }

    fn set(&mut self, pages: core::ops::Range<usize>, used: bool) {
        for page in pages {
            debug_assert!(page < self.nr_pages && self.is_used(page) != used);
            // SAFETY: page < nr_pages (callers): its word is in the bitmap.
            let word = unsafe { &mut *self.bitmap.add(page / 64) };
            if used {
                *word |= 1 << (page % 64);
            } else {
                *word &= !(1 << (page % 64));
            }
        }
    }

    /// The first run of `nr_pages` free pages (`nr_pages` ≥ 1). A word
    /// of the bitmap at a time: a run of used or free pages is skipped
    /// with one `trailing_ones`/`trailing_zeros`, so a search costs a few
    /// instructions per run, not per page (a page alloc of the 100 KiB
    /// hobby heap: ~230 instructions page by page, ~40 so). The bits past
    /// `nr_pages` in the last word are set ([`RegionSource::init`]): they
    /// end a run as a used page does.
    fn find(&self, nr_pages: usize) -> Option<usize> {
        let mut run = 0;
        let mut start = 0;
        for index in 0..self.nr_pages.div_ceil(64) {
            // SAFETY: index < the words covering nr_pages: in the bitmap.
            let word = unsafe { *self.bitmap.add(index) };
            let mut bit = 0;
            while bit < 64 {
                let rest = word >> bit;
                if rest & 1 == 1 {
                    run = 0;
                    bit += rest.trailing_ones() as usize;
                } else {
                    // The shift brought in zeros: a free run ends at bit 64.
                    let free = (rest.trailing_zeros() as usize).min(64 - bit);
                    if run == 0 {
                        start = index * 64 + bit;
                    }
                    run += free;
                    if run >= nr_pages {
                        return Some(start);
                    }
                    bit += free;
                }
            }
        }
        None
    }

    /// Where a block of `nr_pages` pages that is likely to grow goes
    /// ([`PageSource::alloc_pages_to_grow`]): in the free run that ends
    /// highest (in a heap filled from the bottom, the free space after
    /// every used page), halfway along what it leaves free, so the first
    /// fits of other allocations fill the pages before it and the pages
    /// after it stay free to grow into; the first fit if that run is too
    /// short. A word of the bitmap at a time from the top, as [`Self::find`]
    /// (the 8 KiB block of the hobby kernel's `large_vec`: 90
    /// instructions page by page, ~20 so).
    fn find_to_grow(&self, nr_pages: usize) -> Option<usize> {
        let mut index = self.nr_pages.div_ceil(64);
        // The end: past the highest free page (the bits past `nr_pages`
        // are set, so the top word reads as used there).
        let end = loop {
            if index == 0 {
                return None;
            }
            index -= 1;
            // SAFETY: index < the words covering nr_pages: in the bitmap.
            let free = !unsafe { *self.bitmap.add(index) };
            if free != 0 {
                break index * 64 + 64 - free.leading_zeros() as usize;
            }
        };
        // The start: past the highest used page below the end (in the
        // end's word, the bits below it; then whole words down).
        // SAFETY: as above.
        let mut used = unsafe { *self.bitmap.add(index) } & (u64::MAX >> (64 - (end - index * 64)));
        let start = loop {
            if used != 0 {
                break index * 64 + 64 - used.leading_zeros() as usize;
            }
            if index == 0 {
                break 0;
            }
            index -= 1;
            // SAFETY: as above.
            used = unsafe { *self.bitmap.add(index) };
        };
        if end - start >= nr_pages {
            Some(start + (end - start - nr_pages) / 2)
        } else {
            self.find(nr_pages)
        }
    }
}

impl<P: Platform> PageSource for RegionSource<P> {
    fn name(&self) -> &str {
        "region"
    }

    fn alloc_pages(&self, nr_pages: usize) -> Result<NonNull<u8>, AllocError> {
        let _irq = IrqGuard::<P>::new();
        let mut region = self.state.lock();
        if nr_pages == 0 || nr_pages > region.nr_free {
            return Err(AllocError::OutOfMemory);
        }
        let first = region.find(nr_pages).ok_or(AllocError::OutOfMemory)?;
        region.set(first..first + nr_pages, true);
        region.nr_free -= nr_pages;
        region.nr_allocs_ever += 1;
        NonNull::new((region.base + first * PAGE_SIZE) as *mut u8).ok_or(AllocError::OutOfMemory)
    }

    fn alloc_pages_to_grow(&self, nr_pages: usize) -> Result<NonNull<u8>, AllocError> {
        let _irq = IrqGuard::<P>::new();
        let mut region = self.state.lock();
        if nr_pages == 0 || nr_pages > region.nr_free {
            return Err(AllocError::OutOfMemory);
        }
        let first = region
            .find_to_grow(nr_pages)
            .ok_or(AllocError::OutOfMemory)?;
        region.set(first..first + nr_pages, true);
        region.nr_free -= nr_pages;
        region.nr_allocs_ever += 1;
        NonNull::new((region.base + first * PAGE_SIZE) as *mut u8).ok_or(AllocError::OutOfMemory)
    }

    unsafe fn free_pages(&self, addr: NonNull<u8>, nr_pages: usize) {
        let _irq = IrqGuard::<P>::new();
        let mut region = self.state.lock();
        let addr = addr.as_ptr() as usize;
        let first = (addr - region.base) / PAGE_SIZE;
        debug_assert!(addr.is_multiple_of(PAGE_SIZE) && first + nr_pages <= region.nr_pages);
        region.set(first..first + nr_pages, false);
        region.nr_free += nr_pages;
    }

    unsafe fn resize_pages(&self, addr: NonNull<u8>, nr_pages: usize, new_nr_pages: usize) -> bool {
        let _irq = IrqGuard::<P>::new();
        let mut region = self.state.lock();
        let addr = addr.as_ptr() as usize;
        let first = (addr - region.base) / PAGE_SIZE;
        debug_assert!(addr.is_multiple_of(PAGE_SIZE) && first + nr_pages <= region.nr_pages);
        if new_nr_pages == 0 {
            return false;
        }
        if new_nr_pages <= nr_pages {
            // Give back the last pages.
            region.set(first + new_nr_pages..first + nr_pages, false);
            region.nr_free += nr_pages - new_nr_pages;
            return true;
        }
        // Grow into the pages after the block, if all of them are free.
        let end = first + new_nr_pages;
        if end > region.nr_pages || (first + nr_pages..end).any(|page| region.is_used(page)) {
            return false;
        }
        region.set(first + nr_pages..end, true);
        region.nr_free -= new_nr_pages - nr_pages;
        true
    }

    fn span(&self) -> (usize, usize) {
        let _irq = IrqGuard::<P>::new();
        let region = self.state.lock();
        (region.base, region.base + region.nr_pages * PAGE_SIZE)
    }

    fn stats(&self) -> ArenaStats {
        let _irq = IrqGuard::<P>::new();
        let region = self.state.lock();
        ArenaStats {
            total_bytes: region.nr_pages * PAGE_SIZE,
            alloc_bytes: (region.nr_pages - region.nr_free) * PAGE_SIZE,
            nr_allocs_ever: region.nr_allocs_ever,
        }
    }
}
