//! The replay's page source for the region allocators (talc,
//! linked_list_allocator, buddy_system_allocator, rlsf, the blog_os
//! fixed-size-block allocator): each starts with no memory and, when an
//! allocation fails, takes whole pages from an [`Arena`] (a bump pointer
//! over one fresh region, so each taking follows the last one) and
//! retries, as a kernel heap grows from its frame allocator. None of them
//! gives pages back, so the pages taken at the end are their peak; magpie
//! takes its pages from `host::HostPages` (its `PageSource`) and reports
//! that source's high-water mark. Every wrapper is a `GlobalAlloc`: the
//! allocator's own `GlobalAlloc` path first, the growth only when it
//! fails ([`Grown`]).

use std::alloc::{GlobalAlloc, Layout};
use std::num::NonZeroUsize;
use std::ptr::NonNull;

use magpie_slab::PAGE_SIZE;

use crate::fixed_size_block::{FixedSizeBlockAllocator, Locked};
use crate::host::region;

/// Bytes added to a failed request before rounding it up to pages: room
/// for the allocator's headers and for alignment.
const GROW_SLACK: usize = 256;
/// Growth steps before an allocation is given up (each takes twice the
/// pages of the one before).
const MAX_GROW_STEPS: usize = 16;

/// Contiguous pages over one fresh region, handed out in order.
pub struct Arena {
    base: usize,
    end: usize,
    bump: spin::Mutex<usize>,
}

impl Arena {
    /// An arena of `bytes` (a multiple of the page size) of fresh memory,
    /// aligned to `bytes` rounded up to a power of two: a buddy
    /// allocator's blocks depend on the address's alignment, so the same
    /// trace takes the same pages on every run.
    pub fn new(bytes: usize) -> Arena {
        let (base, len) = region(bytes, bytes.next_power_of_two());
        Arena {
            base,
            end: base + len,
            bump: spin::Mutex::new(base),
        }
    }

    /// The next `nr_pages` pages, or `None` when the arena is used up.
    fn take(&self, nr_pages: usize) -> Option<*mut u8> {
        let mut bump = self.bump.lock();
        let start = *bump;
        let end = start.checked_add(nr_pages.checked_mul(PAGE_SIZE)?)?;
        if end > self.end {
            return None;
        }
        *bump = end;
        Some(start as *mut u8)
    }

    /// Pages handed out so far.
    pub fn taken_pages(&self) -> usize {
        (*self.bump.lock() - self.base) / PAGE_SIZE
    }
}

/// An allocator that can be given more memory.
pub trait Grow: GlobalAlloc + Sync {
    /// Give the allocator `len` bytes at `base`.
    ///
    /// # Safety
    /// The memory is unused and lives forever; every call's `base` is
    /// where the previous call's memory ended (the [`Arena`] is
    /// contiguous), except the first.
    unsafe fn add_memory(&self, base: *mut u8, len: usize);
}

/// `heap` grown from `arena` on demand.
pub struct Grown<H> {
    heap: H,
    arena: Arena,
}

impl<H: Grow> Grown<H> {
    /// `heap` (with no memory yet) over an arena of `arena_bytes`.
    pub fn new(heap: H, arena_bytes: usize) -> Self {
        Grown {
            heap,
            arena: Arena::new(arena_bytes),
        }
    }

    /// Pages taken from the arena.
    pub fn taken_pages(&self) -> usize {
        self.arena.taken_pages()
    }

    /// The allocator failed: give it pages and retry, until it succeeds or
    /// the arena is used up.
    #[cold]
    #[inline(never)]
    fn alloc_slow(&self, layout: Layout) -> *mut u8 {
        let mut nr_pages = (layout.size() + layout.align() + GROW_SLACK).div_ceil(PAGE_SIZE);
        for step in 0..MAX_GROW_STEPS {
            if step > 0 {
                // The pages given did not make a block that fits (a buddy
                // allocator needs an aligned power of two, TLSF a block a
                // size class above the request): double the next step.
                nr_pages *= 2;
            }
            let Some(base) = self.arena.take(nr_pages) else {
                return std::ptr::null_mut();
            };
            // SAFETY: fresh pages of the arena, never handed out before,
            // following the previous ones (the arena is a bump pointer).
            unsafe { self.heap.add_memory(base, nr_pages * PAGE_SIZE) };
            // SAFETY: the layout has a non-zero size (GlobalAlloc contract).
            let ptr = unsafe { self.heap.alloc(layout) };
            if !ptr.is_null() {
                return ptr;
            }
        }
        std::ptr::null_mut()
    }
}

// SAFETY: every block comes from `heap`'s GlobalAlloc.
unsafe impl<H: Grow> GlobalAlloc for Grown<H> {
    #[inline(always)]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: per our caller.
        let ptr = unsafe { self.heap.alloc(layout) };
        if !ptr.is_null() {
            return ptr;
        }
        self.alloc_slow(layout)
    }
    #[inline(always)]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: per our caller, a block of `heap`.
        unsafe { self.heap.dealloc(ptr, layout) }
    }
}

/// `GlobalAlloc` for a wrapper: the wrapped allocator's own.
macro_rules! delegate_global_alloc {
    ($wrapper:ty, $field:ident) => {
        // SAFETY: the wrapped allocator's own GlobalAlloc.
        unsafe impl GlobalAlloc for $wrapper {
            #[inline(always)]
            unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
                // SAFETY: per our caller.
                unsafe { self.$field.alloc(layout) }
            }
            #[inline(always)]
            unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
                // SAFETY: per our caller.
                unsafe { self.$field.dealloc(ptr, layout) }
            }
        }
    };
}

// ---------------------------------------------------------------- talc

/// talc spin-locked as the bench has it (`allocs::Talc`), with the
/// `Manual` source: the growth is ours.
type TalcManual =
    talc::sync::TalcLock<spinning_top::RawSpinlock, talc::source::Manual, talc::DefaultBinning>;

/// talc and its heap end.
pub struct TalcHeap {
    talc: TalcManual,
    heap_end: spin::Mutex<Option<NonNull<u8>>>,
}

impl TalcHeap {
    /// talc with no memory.
    pub fn new() -> Self {
        TalcHeap {
            talc: TalcManual::new(talc::source::Manual),
            heap_end: spin::Mutex::new(None),
        }
    }
}

// SAFETY: the heap end is only read and written under its lock.
unsafe impl Sync for TalcHeap {}

delegate_global_alloc!(TalcHeap, talc);

impl Grow for TalcHeap {
    unsafe fn add_memory(&self, base: *mut u8, len: usize) {
        let mut heap_end = self.heap_end.lock();
        let mut talc = self.talc.lock();
        *heap_end = match *heap_end {
            // SAFETY: per our caller, unused memory that lives forever.
            None => unsafe { talc.claim(base, len) },
            // SAFETY: per our caller, the memory follows the heap's end.
            Some(end) => Some(unsafe { talc.extend(end, base.wrapping_add(len)) }),
        };
    }
}

// ---------------------------------------------------- linked_list_allocator

/// `linked_list_allocator::LockedHeap`, grown with `init` then `extend`.
pub struct LinkedListHeap {
    heap: linked_list_allocator::LockedHeap,
}

impl LinkedListHeap {
    /// An empty heap.
    pub fn new() -> Self {
        LinkedListHeap {
            heap: linked_list_allocator::LockedHeap::empty(),
        }
    }
}

delegate_global_alloc!(LinkedListHeap, heap);

impl Grow for LinkedListHeap {
    unsafe fn add_memory(&self, base: *mut u8, len: usize) {
        let mut heap = self.heap.lock();
        if heap.size() == 0 {
            // SAFETY: per our caller, unused memory that lives forever.
            unsafe { heap.init(base, len) };
        } else {
            // SAFETY: per our caller, the memory follows the heap's top.
            unsafe { heap.extend(len) };
        }
    }
}

// --------------------------------------------------- buddy_system_allocator

/// `buddy_system_allocator::LockedHeap<32>`, grown with `add_to_heap`.
pub struct BuddyHeap {
    heap: buddy_system_allocator::LockedHeap<32>,
}

impl BuddyHeap {
    /// An empty heap.
    pub fn new() -> Self {
        BuddyHeap {
            heap: buddy_system_allocator::LockedHeap::<32>::new(),
        }
    }
}

delegate_global_alloc!(BuddyHeap, heap);

impl Grow for BuddyHeap {
    unsafe fn add_memory(&self, base: *mut u8, len: usize) {
        // SAFETY: per our caller, unused memory that lives forever.
        unsafe {
            self.heap
                .lock()
                .add_to_heap(base as usize, base as usize + len)
        };
    }
}

// ---------------------------------------------------------------- rlsf

/// rlsf's TLSF (first level up to 2^28 granules, 32 second-level lists)
/// behind a spin lock, as a kernel would share it; the end of its pool.
pub struct RlsfHeap {
    inner: spin::Mutex<(rlsf::Tlsf<'static, u32, u32, 28, 32>, usize)>,
}

impl RlsfHeap {
    /// An empty TLSF.
    pub fn new() -> Self {
        RlsfHeap {
            inner: spin::Mutex::new((rlsf::Tlsf::new(), 0)),
        }
    }
}

// SAFETY: blocks of rlsf's `allocate` (the layout's size and alignment),
// freed with `deallocate` and the same alignment.
unsafe impl GlobalAlloc for RlsfHeap {
    #[inline(always)]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        match self.inner.lock().0.allocate(layout) {
            Some(ptr) => ptr.as_ptr(),
            None => std::ptr::null_mut(),
        }
    }
    #[inline(always)]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: per our caller, a live block of this TLSF (non-null)
        // allocated with this alignment.
        unsafe {
            self.inner
                .lock()
                .0
                .deallocate(NonNull::new_unchecked(ptr), layout.align())
        };
    }
}

impl Grow for RlsfHeap {
    unsafe fn add_memory(&self, base: *mut u8, len: usize) {
        let mut inner = self.inner.lock();
        let (tlsf, pool_end) = &mut *inner;
        let block = NonNull::slice_from_raw_parts(NonNull::new(base).expect("arena page"), len);
        let added = if *pool_end == base as usize {
            // SAFETY: per our caller; the block starts at the pool's end.
            unsafe { tlsf.append_free_block_ptr(block) }
        } else {
            // SAFETY: per our caller, unused memory that lives forever.
            unsafe { tlsf.insert_free_block_ptr(block) }.map_or(0, NonZeroUsize::get)
        };
        *pool_end = base as usize + added;
    }
}

// ------------------------------------------------ fixed-size-block (blog_os)

impl Grow for Locked<FixedSizeBlockAllocator> {
    unsafe fn add_memory(&self, base: *mut u8, len: usize) {
        // SAFETY: per our caller.
        unsafe { self.lock().add_memory(base, len) };
    }
}
