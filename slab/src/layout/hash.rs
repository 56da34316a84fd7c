//! An intrusive, chained, growable hash from an address to a node.
//!
//! Used twice per cache: buffer address → bufctl (bufctl caches) and object
//! address → trace record. The first [`INLINE_BUCKETS`] buckets live inside
//! the table itself (like Akaros' `static_hash`), so a cache needs no memory
//! for its hash until it grows. Bigger bucket arrays are whole pages from
//! the allocator's primary page source, allocated and freed outside the
//! lock that guards the hash: [`rescale_locked`] does it for both hashes
//! (with [`AddrHash::wants_grow`] or [`AddrHash::wants_shrink`]). The table grows ×4 when the load passes
//! [`MAX_LOAD`] nodes per bucket and shrinks back (on reap: illumos
//! `kmem_hash_rescale`) when it falls below one node per
//! [`SHRINK_LOAD_DIVISOR`] buckets — to the inline buckets if they hold the
//! nodes at one per bucket, else to the smallest page-backed table with at
//! least one bucket per node. A grown table is at load ½ or more, so a
//! shrink never follows a grow without the nodes going away first.

use core::ptr::{self, NonNull};

use crate::platform::{PAGE_SIZE, PageSource, Platform};
use crate::sync::IrqMutex;

/// Buckets stored inline.
pub(crate) const INLINE_BUCKETS: usize = 16;
/// Smallest page-backed table: one page of bucket heads.
const MIN_TABLE_BUCKETS: usize = PAGE_SIZE / core::mem::size_of::<usize>();
/// Grow when there are more than this many nodes per bucket on average.
const MAX_LOAD: usize = 2;
/// Shrink when there are fewer than one node per this many buckets.
const SHRINK_LOAD_DIVISOR: usize = 8;

/// A node that can sit in an [`AddrHash`].
pub(crate) trait HashNode: Sized {
    /// The address this node is keyed by.
    fn key(&self) -> usize;
    /// The chain link.
    fn hash_next(&mut self) -> &mut *mut Self;
}

/// The hash table. Invariant: every node reachable from a bucket is valid
/// and owned by the table until removed (established by the unsafe
/// [`AddrHash::insert`]).
pub(crate) struct AddrHash<N> {
    pub(crate) inline: [*mut N; INLINE_BUCKETS],
    /// Page-backed buckets, or null while the inline ones are in use.
    pub(crate) table: *mut *mut N,
    pub(crate) nr_buckets: usize,
    nr_items: usize,
}

impl<N: HashNode> AddrHash<N> {
    pub(crate) const fn new() -> Self {
        AddrHash {
            inline: [ptr::null_mut(); INLINE_BUCKETS],
            table: ptr::null_mut(),
            nr_buckets: INLINE_BUCKETS,
            nr_items: 0,
        }
    }

    #[cfg(feature = "trace-table")]
    pub(crate) fn nr_items(&self) -> usize {
        self.nr_items
    }

    #[cfg(all(test, not(loom)))]
    pub(crate) fn nr_buckets(&self) -> usize {
        self.nr_buckets
    }

    fn bucket_index(nr_buckets: usize, key: usize) -> usize {
        let bits = nr_buckets.trailing_zeros();
        let h = ((key >> 3) as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        (h >> (64 - bits)) as usize
    }

    fn buckets(&self) -> *const *mut N {
        if self.table.is_null() {
            self.inline.as_ptr()
        } else {
            self.table
        }
    }

    fn buckets_mut(&mut self) -> *mut *mut N {
        if self.table.is_null() {
            self.inline.as_mut_ptr()
        } else {
            self.table
        }
    }

    /// Insert `node` (keyed by `node.key()`).
    ///
    /// # Safety
    /// `node` is valid, in no table, and stays valid until it is removed.
    pub(crate) unsafe fn insert(&mut self, node: *mut N) {
        // SAFETY: the caller hands us a valid node.
        let key = unsafe { (*node).key() };
        let index = Self::bucket_index(self.nr_buckets, key);
        let buckets = self.buckets_mut();
        // SAFETY: index < nr_buckets, the length of `buckets`; the node is
        // valid per the caller.
        unsafe {
            *(*node).hash_next() = *buckets.add(index);
            *buckets.add(index) = node;
        }
        self.nr_items += 1;
    }

    /// The node with `key`, or null.
    pub(crate) fn find(&self, key: usize) -> *mut N {
        let index = Self::bucket_index(self.nr_buckets, key);
        // SAFETY: index < nr_buckets; chained nodes are valid (type invariant).
        let mut node = unsafe { *self.buckets().add(index) };
        while !node.is_null() {
            // SAFETY: chained nodes are valid (type invariant).
            unsafe {
                if (*node).key() == key {
                    return node;
                }
                node = *(*node).hash_next();
            }
        }
        ptr::null_mut()
    }

    /// Remove and return the node with `key`, or null.
    pub(crate) fn remove(&mut self, key: usize) -> *mut N {
        let index = Self::bucket_index(self.nr_buckets, key);
        let buckets = self.buckets_mut();
        // SAFETY: index < nr_buckets; chained nodes are valid (type invariant).
        unsafe {
            let mut link: *mut *mut N = buckets.add(index);
            while !(*link).is_null() {
                let node = *link;
                if (*node).key() == key {
                    *link = *(*node).hash_next();
                    *(*node).hash_next() = ptr::null_mut();
                    self.nr_items -= 1;
                    return node;
                }
                link = (*node).hash_next();
            }
        }
        ptr::null_mut()
    }

    /// Remove every node, handing each to `f`.
    pub(crate) fn drain(&mut self, mut f: impl FnMut(*mut N)) {
        let buckets = self.buckets_mut();
        for index in 0..self.nr_buckets {
            // SAFETY: index < nr_buckets; chained nodes are valid (type invariant).
            unsafe {
                let mut node = *buckets.add(index);
                *buckets.add(index) = ptr::null_mut();
                while !node.is_null() {
                    let next = *(*node).hash_next();
                    *(*node).hash_next() = ptr::null_mut();
                    f(node);
                    node = next;
                }
            }
        }
        self.nr_items = 0;
    }

    /// If the load is too high, the bucket count to grow to.
    pub(crate) fn wants_grow(&self) -> Option<usize> {
        if self.nr_items <= self.nr_buckets * MAX_LOAD {
            return None;
        }
        let target = (self.nr_buckets * 4).max(MIN_TABLE_BUCKETS);
        Some(target)
    }

    /// If the load is low (fewer than one node per
    /// [`SHRINK_LOAD_DIVISOR`] buckets of a page-backed table), the bucket
    /// count to shrink to: [`INLINE_BUCKETS`] (the inline buckets, no
    /// pages) if they hold the nodes at one per bucket, else the smallest
    /// page-backed table with a bucket per node.
    pub(crate) fn wants_shrink(&self) -> Option<usize> {
        if self.table.is_null() || self.nr_items * SHRINK_LOAD_DIVISOR >= self.nr_buckets {
            return None;
        }
        let target = if self.nr_items <= INLINE_BUCKETS {
            INLINE_BUCKETS
        } else {
            self.nr_items.next_power_of_two().max(MIN_TABLE_BUCKETS)
        };
        (target < self.nr_buckets).then_some(target)
    }

    /// Pages needed for a table of `nr_buckets` buckets (0 for the inline one).
    pub(crate) fn table_pages(nr_buckets: usize) -> usize {
        if nr_buckets <= INLINE_BUCKETS {
            0
        } else {
            (nr_buckets * core::mem::size_of::<usize>()).div_ceil(PAGE_SIZE)
        }
    }

    /// Move every node into `new_table` of `new_nr_buckets` buckets (null
    /// with [`INLINE_BUCKETS`]: back into the inline buckets) and return
    /// the old page-backed table and its bucket count, to be freed by the
    /// caller (null if the inline buckets were in use).
    ///
    /// # Safety
    /// `new_table` is null and `new_nr_buckets` is [`INLINE_BUCKETS`], or
    /// `new_table` points to `new_nr_buckets` writable bucket slots
    /// (`table_pages(new_nr_buckets)` pages), owned by this table from now
    /// on, and `new_nr_buckets` is a power of two above `INLINE_BUCKETS`.
    pub(crate) unsafe fn rehash(
        &mut self,
        new_table: *mut *mut N,
        new_nr_buckets: usize,
    ) -> (*mut *mut N, usize) {
        debug_assert!(new_nr_buckets.is_power_of_two());
        debug_assert_eq!(new_table.is_null(), new_nr_buckets == INLINE_BUCKETS);
        // Detach the old buckets (the inline ones by copy).
        let old_table = self.table;
        let old_nr = self.nr_buckets;
        let old_inline = core::mem::replace(&mut self.inline, [ptr::null_mut(); INLINE_BUCKETS]);
        let old_buckets: *const *mut N = if old_table.is_null() {
            old_inline.as_ptr()
        } else {
            old_table
        };
        let nr_new_slots = if new_table.is_null() {
            0
        } else {
            new_nr_buckets
        };
        for index in 0..nr_new_slots {
            // SAFETY: the caller gives us new_nr_buckets slots.
            unsafe { new_table.add(index).write(ptr::null_mut()) };
        }
        self.table = new_table;
        self.nr_buckets = new_nr_buckets;
        let buckets = self.buckets_mut();
        let mut moved = 0;
        for index in 0..old_nr {
            // SAFETY: index < old_nr, the length of the old buckets (the
            // copy of the inline ones, or the detached page-backed table,
            // still allocated); chained nodes are valid (type invariant);
            // `at` < new_nr_buckets, the length of `buckets`.
            unsafe {
                let mut node = *old_buckets.add(index);
                while !node.is_null() {
                    let next = *(*node).hash_next();
                    let at = Self::bucket_index(new_nr_buckets, (*node).key());
                    *(*node).hash_next() = *buckets.add(at);
                    *buckets.add(at) = node;
                    node = next;
                    moved += 1;
                }
            }
        }
        debug_assert_eq!(moved, self.nr_items);
        if old_table.is_null() {
            (ptr::null_mut(), 0)
        } else {
            (old_table, old_nr)
        }
    }
}

/// Grow or shrink the hash that `hash` finds inside `lock` to the bucket
/// count `want` asks for ([`AddrHash::wants_grow`] after inserts,
/// [`AddrHash::wants_shrink`] on reap and destroy; illumos
/// `kmem_hash_rescale`): the new table's pages come from `source` with no
/// lock held (none for the inline buckets), the rehash runs under the lock
/// if `want` still asks for the same count, and whichever table ends up
/// unused — the new one after a lost race, or the old page-backed one —
/// goes back to `source`. Call with `lock` not held. Out of memory: the
/// hash stays as it is.
pub(crate) fn rescale_locked<P: Platform, L: 'static, N: HashNode>(
    lock: &IrqMutex<P, L>,
    hash: fn(&mut L) -> &mut AddrHash<N>,
    want: fn(&AddrHash<N>) -> Option<usize>,
    source: &dyn PageSource,
) {
    let Some(nr_buckets) = want(hash(&mut lock.lock())) else {
        return;
    };
    let nr_pages = AddrHash::<N>::table_pages(nr_buckets);
    let table = if nr_pages == 0 {
        ptr::null_mut()
    } else {
        match source.alloc_pages(nr_pages) {
            Ok(table) => table.as_ptr(),
            Err(_) => return,
        }
    };
    let old = {
        let mut guard = lock.lock();
        let hash = hash(&mut guard);
        if want(hash) == Some(nr_buckets) {
            // SAFETY: `table` is null for the inline buckets, or nr_pages
            // fresh pages, enough for nr_buckets bucket heads (table_pages),
            // 8-aligned; both wants give a power of two.
            Some(unsafe { hash.rehash(table.cast(), nr_buckets) })
        } else {
            None
        }
    };
    let (unused, unused_nr) = match old {
        // Someone else rescaled first: give our table back.
        None => (table.cast(), nr_buckets),
        Some(old) => old,
    };
    if let Some(unused) = NonNull::new(unused.cast::<u8>()) {
        // SAFETY: a page-backed table from `source` with
        // table_pages(unused_nr) pages, referenced by nothing.
        unsafe { source.free_pages(unused, AddrHash::<N>::table_pages(unused_nr)) };
    }
}
