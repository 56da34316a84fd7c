//! The fixed-size-block allocator of "Writing an OS in Rust" (Philipp
//! Oppermann, blog_os, post 11 "Kmem Designs", section "Fixed-Size
//! Block Kmem"; <https://os.phil-opp.com/allocator-designs/>), written
//! here as the chapter has it because it is not a crate: nine block sizes
//! from 8 to 2048 bytes, one free list of blocks per size (a node written
//! into each free block), a block taken from the fallback allocator
//! (`linked_list_allocator::Heap`) when its list is empty, requests above
//! 2048 bytes served by the fallback, and the whole allocator behind one
//! spin lock (the chapter's `Locked<A>` wrapper).
//!
//! Two additions for the replay, neither on the chapter's paths:
//! [`FixedSizeBlockAllocator::add_memory`] gives the fallback heap more
//! memory (its `init` the first time, `extend` afterwards: the replay
//! grows every region allocator from the same page source), and the
//! chapter's `unsafe` blocks carry `// SAFETY:` comments.
//!
//! `core` only: `examples/hobby-kernel` (feature `count`) includes this
//! file as a module to count the chapter's allocator in QEMU.

use core::alloc::{GlobalAlloc, Layout};
use core::ptr::NonNull;

/// A free block: the link to the next free block of its size.
struct ListNode {
    next: Option<&'static mut ListNode>,
}

/// The block sizes to use.
///
/// The sizes must each be power of 2 because they are also used as
/// the block alignment (alignments must be always powers of 2).
const BLOCK_SIZES: &[usize] = &[8, 16, 32, 64, 128, 256, 512, 1024, 2048];

/// The chapter's allocator: a free list per block size and a fallback.
pub struct FixedSizeBlockAllocator {
    list_heads: [Option<&'static mut ListNode>; BLOCK_SIZES.len()],
    fallback_allocator: linked_list_allocator::Heap,
    /// The replay's addition: whether the fallback heap has memory yet.
    initialized: bool,
}

impl FixedSizeBlockAllocator {
    /// Creates an empty FixedSizeBlockAllocator.
    pub const fn new() -> Self {
        const EMPTY: Option<&'static mut ListNode> = None;
        FixedSizeBlockAllocator {
            list_heads: [EMPTY; BLOCK_SIZES.len()],
            fallback_allocator: linked_list_allocator::Heap::empty(),
            initialized: false,
        }
    }

    /// Give the fallback heap the `len` bytes at `base`: its memory the
    /// first time, an extension of it afterwards.
    ///
    /// # Safety
    /// The memory is unused and lives forever; after the first call,
    /// `base` is where the memory of the previous call ended.
    pub unsafe fn add_memory(&mut self, base: *mut u8, len: usize) {
        if self.initialized {
            // SAFETY: per our caller, the bytes follow the heap's end.
            unsafe { self.fallback_allocator.extend(len) };
        } else {
            // SAFETY: per our caller, unused memory that lives forever.
            unsafe { self.fallback_allocator.init(base, len) };
            self.initialized = true;
        }
    }

    /// Allocates using the fallback allocator.
    fn fallback_alloc(&mut self, layout: Layout) -> *mut u8 {
        match self.fallback_allocator.allocate_first_fit(layout) {
            Ok(ptr) => ptr.as_ptr(),
            Err(_) => core::ptr::null_mut(),
        }
    }
}

/// Choose an appropriate block size for the given layout.
///
/// Returns an index into the `BLOCK_SIZES` array.
fn list_index(layout: &Layout) -> Option<usize> {
    let required_block_size = layout.size().max(layout.align());
    BLOCK_SIZES.iter().position(|&s| s >= required_block_size)
}

/// The chapter's `Locked<A>`: a wrapper around `spin::Mutex` to permit
/// trait implementations.
pub struct Locked<A> {
    inner: spin::Mutex<A>,
}

impl<A> Locked<A> {
    /// `inner` behind a spin lock.
    pub const fn new(inner: A) -> Self {
        Locked {
            inner: spin::Mutex::new(inner),
        }
    }

    /// Take the lock.
    pub fn lock(&self) -> spin::MutexGuard<'_, A> {
        self.inner.lock()
    }
}

// SAFETY: blocks from a free list are BLOCK_SIZES[index] bytes aligned to
// their size, which is at least the layout's size and alignment
// (list_index); the fallback returns blocks of the layout or null.
unsafe impl GlobalAlloc for Locked<FixedSizeBlockAllocator> {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let mut allocator = self.lock();
        match list_index(&layout) {
            Some(index) => {
                match allocator.list_heads[index].take() {
                    Some(node) => {
                        allocator.list_heads[index] = node.next.take();
                        core::ptr::from_mut(node).cast::<u8>()
                    }
                    None => {
                        // no block exists in list => allocate new block
                        let block_size = BLOCK_SIZES[index];
                        // only works if all block sizes are a power of 2
                        let block_align = block_size;
                        let layout = Layout::from_size_align(block_size, block_align).unwrap();
                        allocator.fallback_alloc(layout)
                    }
                }
            }
            None => allocator.fallback_alloc(layout),
        }
    }

    #[expect(
        clippy::cast_ptr_alignment,
        reason = "a block of this list is aligned to its size, at least a ListNode's alignment (asserted)"
    )]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        let mut allocator = self.lock();
        match list_index(&layout) {
            Some(index) => {
                let new_node = ListNode {
                    next: allocator.list_heads[index].take(),
                };
                // verify that block has size and alignment required for storing node
                assert!(size_of::<ListNode>() <= BLOCK_SIZES[index]);
                assert!(align_of::<ListNode>() <= BLOCK_SIZES[index]);
                let new_node_ptr = ptr.cast::<ListNode>();
                // SAFETY: per GlobalAlloc's contract `ptr` is a block of this
                // list (allocated with this layout), ours again, big and
                // aligned enough for a node (asserted above).
                unsafe {
                    new_node_ptr.write(new_node);
                    allocator.list_heads[index] = Some(&mut *new_node_ptr);
                }
            }
            None => {
                let ptr = NonNull::new(ptr).unwrap();
                // SAFETY: a block of the fallback allocated with `layout`.
                unsafe { allocator.fallback_allocator.deallocate(ptr, layout) };
            }
        }
    }
}
