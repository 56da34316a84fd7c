//! The free list of a small slab, hardened.
//!
//! A small slab threads its free list through its free objects: each free
//! object holds the address of the next one. That link is the classic
//! heap-exploitation target (a write after free, or a linear overflow into
//! the next free object, makes the allocator hand out an address of the
//! attacker's choosing). Here the link is
//!
//! - **obfuscated** as Linux's `CONFIG_SLAB_FREELIST_HARDENED` does:
//!   stored as `next XOR secret XOR swab(address of the link)`, with a
//!   per-cache random `secret` ([`freelist_ptr`]); and
//! - **checked** when it is followed: the decoded pointer must be null or
//!   an object start inside the same slab whose bit is set in the slab's
//!   bitmap of free objects (`free_map`, kept under the slab lock).
//!
//! A new slab hands its objects out in a **random order** (Linux
//! `CONFIG_SLAB_FREELIST_RANDOM`, 4.7: `shuffle_freelist`), so where the
//! next objects of a fresh slab lie is not predictable, and a spray of
//! allocations does not line up an attacker's object right after its
//! target. Nothing is built up front: a new slab only marks its objects
//! free in the bitmap (and, in a keyed cache, writes their free key,
//! [`FreeList::fresh`]) and stays in **bitmap mode** (`Slab::nr_fresh`,
//! its free objects unthreaded) until it is first full: each object taken
//! is the first free one at or after a random index
//! ([`FreeList::take_random`]: a fresh draw of a per-boot seeded
//! generator per object), and an object given back only sets its bit.
//! Once full, the slab threads the objects that come back on the hardened
//! linked list (**list mode**), as before. A slab of which one object is
//! used costs one draw, not a shuffle of all of them (Fisher–Yates over
//! the whole slab was ~28 instructions an object, up front); the order is
//! not uniform (an object after a run of taken ones is likelier), but
//! each pick is a new random draw, so seeing some objects says nothing
//! of the next (docs/HARDENING.md has the trade).
//!
//! A link that fails the check is reported (`FreeListCorrupted`) and the
//! free list is rebuilt from the bitmap, so the allocator never hands out
//! memory it does not own, and loses nothing. The bitmap also makes
//! every double free that reaches the slab layer visible: a free of an
//! object whose bit is already set is refused, so a slab's busy count can
//! never reach 0 while one of its objects is still with a caller.

use core::sync::atomic::{AtomicU64, Ordering};

/// The free-list shuffle's generator state: a splitmix64 counter, seeded
/// once a boot ([`init_shuffle`]), advanced by one step per new slab.
static SHUFFLE_STATE: AtomicU64 = AtomicU64::new(0);

/// Seed the free-list shuffle from `seed` (a clock mixed with an
/// address), once: later calls keep the first seed.
pub(crate) fn init_shuffle(seed: u64) {
    let _ = SHUFFLE_STATE.compare_exchange(
        0,
        freelist_secret(seed ^ 0x5eed_f1ee) as u64,
        Ordering::Relaxed,
        Ordering::Relaxed,
    );
}

/// A random value for one new slab's shuffle (splitmix64 of the next
/// counter value: distinct slabs, distinct values).
pub(crate) fn shuffle_seed() -> u64 {
    let state = SHUFFLE_STATE
        .fetch_add(0x9e37_79b9_7f4a_7c15, Ordering::Relaxed)
        .wrapping_add(0x9e37_79b9_7f4a_7c15);
    freelist_secret(state) as u64
}

/// Bitmap of a small slab's free objects (bit `i`: object `i` is on the
/// free list). Written only under the slab lock; atomic so verifiers may
/// read it without the lock.
pub(crate) type FreeMap = [AtomicU64; 8];

/// Whether object `index` is free in its slab.
#[inline]
pub(crate) fn map_test(map: &FreeMap, index: usize) -> bool {
    map[index / 64].load(Ordering::Relaxed) & (1 << (index % 64)) != 0
}

#[inline]
pub(crate) fn map_set(map: &FreeMap, index: usize) {
    let word = &map[index / 64];
    word.store(
        word.load(Ordering::Relaxed) | 1 << (index % 64),
        Ordering::Relaxed,
    );
}

#[inline]
pub(crate) fn map_clear(map: &FreeMap, index: usize) {
    let word = &map[index / 64];
    word.store(
        word.load(Ordering::Relaxed) & !(1 << (index % 64)),
        Ordering::Relaxed,
    );
}

/// Set bits (free objects) of the map.
pub(crate) fn map_count(map: &FreeMap) -> usize {
    map.iter()
        .map(|word| word.load(Ordering::Relaxed).count_ones() as usize)
        .sum()
}

/// A free-list link that failed its check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BadLink {
    /// The free object holding the bad link.
    pub(crate) obj: usize,
    /// What the link decoded to.
    pub(crate) decoded: usize,
}

/// What the free-list code needs to know of a slab and its cache.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FreeList {
    /// Address of object 0.
    pub(crate) base: usize,
    pub(crate) stride: usize,
    pub(crate) nr_objs: usize,
    /// Where in a free object its link lives (0; after the object in a
    /// debug cache, so poison stays intact).
    pub(crate) link_offset: usize,
    /// The cache's obfuscation secret.
    pub(crate) secret: usize,
    /// The free key every free object holds in its first word (its link
    /// then lives at 8; objects of one word have no link, the bitmap
    /// finds them), or 0: none (`cache/double_free.rs`). A free object
    /// without it was written after its free: its link is bad.
    pub(crate) key: usize,
}

impl FreeList {
    /// Index of the object starting at `addr`, if `addr` is exactly an
    /// object start of this slab.
    #[inline]
    pub(crate) fn index_of(&self, addr: usize) -> Option<usize> {
        let offset = addr.wrapping_sub(self.base);
        let index = offset / self.stride;
        (offset.is_multiple_of(self.stride) && index < self.nr_objs).then_some(index)
    }

    /// Whether this slab's free objects are found by the bitmap alone: its
    /// objects are one word (8 bytes), the key's, so no link fits beside
    /// it. The head is then any free object, and a pop takes it and makes
    /// the lowest free object of the bitmap the head.
    #[inline]
    fn by_map(&self) -> bool {
        self.key != 0 && self.link_offset >= self.stride
    }

    /// The lowest free object of the bitmap, or 0.
    fn first_free(&self, map: &FreeMap) -> usize {
        map.iter()
            .enumerate()
            .find_map(|(word, bits)| {
                let bits = bits.load(Ordering::Relaxed);
                (bits != 0).then(|| word * 64 + bits.trailing_zeros() as usize)
            })
            .filter(|&index| index < self.nr_objs)
            .map_or(0, |index| self.base + index * self.stride)
    }

    fn link(&self, obj: usize) -> *mut usize {
        (obj + self.link_offset) as *mut usize
    }

    /// Store `next` (0: end) as the link of free object `obj`.
    ///
    /// # Safety
    /// `obj` is an object of this slab owned by the slab layer (free).
    #[inline]
    pub(crate) unsafe fn write_link(&self, obj: usize, next: usize) {
        if !self.by_map() {
            let link = self.link(obj);
            // SAFETY: per the caller, the object (and its link word, inside
            // its stride, 8-aligned) is the slab layer's.
            unsafe { link.write(freelist_ptr(next, self.secret, link as usize)) };
        }
        if self.key != 0 {
            // SAFETY: as above; the key's word 0 is not the link's.
            unsafe { (obj as *mut usize).write(self.key) };
        }
    }

    /// The decoded link of free object `obj`.
    ///
    /// # Safety
    /// As for [`Self::write_link`].
    #[inline]
    pub(crate) unsafe fn read_link(&self, obj: usize) -> usize {
        // SAFETY: per the caller.
        if self.key != 0 && unsafe { (obj as *const usize).read() } != self.key {
            // Never an object start: the link check fails.
            return usize::MAX;
        }
        if self.by_map() {
            // No link: the key alone is checked (above).
            return 0;
        }
        let link = self.link(obj);
        // SAFETY: per the caller.
        freelist_ptr(unsafe { link.read() }, self.secret, link as usize)
    }

    /// Whether free object `obj` of a keyed slab lost its key (written
    /// after its free: its link is not to be trusted, nor the object to
    /// be handed out).
    ///
    /// # Safety
    /// As for [`Self::write_link`].
    pub(crate) unsafe fn lost_key(&self, obj: usize) -> bool {
        // SAFETY: per the caller.
        self.key != 0 && unsafe { (obj as *const usize).read() } != self.key
    }

    /// Whether `next` may follow `obj` on the free list: the end, or
    /// another free object of this slab.
    fn link_ok(&self, map: &FreeMap, obj: usize, next: usize) -> bool {
        next == 0
            || (next != obj
                && self
                    .index_of(next)
                    .is_some_and(|index| map_test(map, index)))
    }

    /// Put `obj` (object `index`, busy) at the head of the free list.
    ///
    /// # Safety
    /// `obj` is busy object `index` of this slab, given to the slab layer;
    /// `head` and `map` are the slab's.
    pub(crate) unsafe fn push(&self, head: &mut usize, map: &FreeMap, obj: usize, index: usize) {
        // SAFETY: per the caller.
        unsafe { self.write_link(obj, *head) };
        map_set(map, index);
        *head = obj;
    }

    /// Thread the free list of a fresh slab through all its objects,
    /// lowest address first, and mark every one free in `map` (whole
    /// words at a time): what a [`Self::push`] of each object, highest
    /// first, would leave, without a bitmap update per object. Returns
    /// the head.
    ///
    /// # Safety
    /// The slab is fresh and ours alone: every object (and its link
    /// word) is the slab layer's; `map` is the slab's, all clear.
    pub(crate) unsafe fn carve(&self, map: &FreeMap) -> usize {
        self.mark_all_free(map);
        let mut head = 0;
        for index in (0..self.nr_objs).rev() {
            let obj = self.base + index * self.stride;
            // SAFETY: per the caller, object `index` is ours.
            unsafe { self.write_link(obj, head) };
            head = obj;
        }
        head
    }

    /// Mark every object of the slab free in `map` (whole words at a
    /// time).
    fn mark_all_free(&self, map: &FreeMap) {
        debug_assert!(self.nr_objs <= map.len() * 64);
        for (word, bits) in map.iter().enumerate() {
            let first = word * 64;
            if first >= self.nr_objs {
                break;
            }
            let nr = self.nr_objs - first;
            bits.store(
                if nr >= 64 { u64::MAX } else { (1 << nr) - 1 },
                Ordering::Relaxed,
            );
        }
    }

    /// Make every object of a fresh slab free without threading it (bitmap
    /// mode): all marked in `map` (whole words at a time) and, in a keyed
    /// cache, each given its free key (so a free of an object never
    /// handed out is refused at the free, as for any free object). The
    /// objects then leave by [`Self::take_random`].
    ///
    /// # Safety
    /// Every object of the slab is the slab layer's (a fresh slab); `map`
    /// is the slab's, all clear.
    pub(crate) unsafe fn fresh(&self, map: &FreeMap) {
        self.mark_all_free(map);
        if self.key != 0 {
            for index in 0..self.nr_objs {
                // SAFETY: per our caller, object `index` of the fresh
                // slab; its first word is in its stride, 8-aligned.
                unsafe { ((self.base + index * self.stride) as *mut usize).write(self.key) };
            }
        }
    }

    /// Bitmap mode: take a free object of `map` (at least one, `nr_free`
    /// of them), the first free one at or after a random index (wrapping
    /// round), drawn from `random` (a 64-bit linear congruential state,
    /// advanced; Knuth's MMIX multiplier, increment 1, the index its
    /// high bits scaled to `nr_objs`, Lemire's multiply-shift: two
    /// instructions a draw where a xorshift64 step took nine). The
    /// object's bit is cleared; returns its index.
    #[inline]
    pub(crate) fn take_random(&self, map: &FreeMap, random: &mut u64) -> usize {
        *random = random
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1);
        let start = ((u128::from(*random) * self.nr_objs as u128) >> 64) as usize;
        let nr_words = self.nr_objs.div_ceil(64);
        let mut word = start / 64;
        let mut full = map[word].load(Ordering::Relaxed);
        let mut bits = full & (u64::MAX << (start % 64));
        let mut nr_looked = 0;
        while bits == 0 {
            word = if word + 1 == nr_words { 0 } else { word + 1 };
            full = map[word].load(Ordering::Relaxed);
            bits = full;
            nr_looked += 1;
            // Round to the start's own word: its bits below the start.
            debug_assert!(nr_looked <= nr_words, "take_random of a full slab");
        }
        // The lowest set bit of `bits`, cleared in the word it came from.
        map[word].store(full ^ (bits & bits.wrapping_neg()), Ordering::Relaxed);
        word * 64 + bits.trailing_zeros() as usize
    }

    /// Bitmap mode: give object `index` back (busy): its bit set and, in a
    /// keyed cache, its key written; not threaded.
    ///
    /// # Safety
    /// `obj` is busy object `index` of this slab, given to the slab layer.
    pub(crate) unsafe fn put_unthreaded(&self, map: &FreeMap, obj: usize, index: usize) {
        if self.key != 0 {
            // SAFETY: per our caller, the slab layer's object now.
            unsafe { (obj as *mut usize).write(self.key) };
        }
        map_set(map, index);
    }

    /// Take the head of the free list (`head` non-zero), checking its link
    /// first. On a bad link nothing changes and the caller rebuilds.
    ///
    /// # Safety
    /// `head` and `map` are the slab's, under its lock; `head` is 0 or a
    /// free object of the slab.
    pub(crate) unsafe fn pop(&self, head: &mut usize, map: &FreeMap) -> Result<usize, BadLink> {
        let obj = *head;
        debug_assert!(obj != 0);
        // SAFETY: the head is a free object of ours (checked when it became
        // the head).
        let next = unsafe { self.read_link(obj) };
        if !self.link_ok(map, obj, next) {
            return Err(BadLink { obj, decoded: next });
        }
        if let Some(index) = self.index_of(obj) {
            map_clear(map, index);
        }
        *head = if self.by_map() {
            self.first_free(map)
        } else {
            next
        };
        Ok(obj)
    }

    /// Relink every free object of the bitmap, lowest address first;
    /// returns the new head (0: none free).
    ///
    /// # Safety
    /// `map` is the slab's, under its lock; the objects it marks free are
    /// the slab layer's.
    pub(crate) unsafe fn rebuild(&self, map: &FreeMap) -> usize {
        let mut head = 0;
        for index in (0..self.nr_objs).rev() {
            if map_test(map, index) {
                let obj = self.base + index * self.stride;
                // SAFETY: a free object of ours, per the bitmap.
                unsafe { self.write_link(obj, head) };
                head = obj;
            }
        }
        head
    }

    /// [`Self::check`] of a slab whose free objects are found by the
    /// bitmap: the head is a free object (or 0 with none), and every free
    /// object holds the key.
    ///
    /// # Safety
    /// As for [`Self::rebuild`].
    unsafe fn check_by_map(&self, head: usize, map: &FreeMap) -> Result<usize, BadLink> {
        let nr_free = map_count(map);
        if (head == 0) != (nr_free == 0) || (head != 0 && !self.link_ok(map, 0, head)) {
            return Err(BadLink {
                obj: 0,
                decoded: head,
            });
        }
        for index in (0..self.nr_objs).filter(|&index| map_test(map, index)) {
            let obj = self.base + index * self.stride;
            // SAFETY: a free object of ours, per the bitmap.
            let next = unsafe { self.read_link(obj) };
            if next != 0 {
                return Err(BadLink { obj, decoded: next });
            }
        }
        Ok(nr_free)
    }

    /// Walk the free list and check every link against the bitmap: each
    /// object appears once, the list holds exactly the bitmap's objects.
    /// In bitmap mode (`nr_fresh` non-zero: the slab's free objects, none
    /// threaded, [`Self::fresh`]) the list is empty, the bitmap holds
    /// `nr_fresh` objects and each holds the key (a keyed cache).
    /// Returns the number of free objects (the bitmap's).
    ///
    /// # Safety
    /// As for [`Self::rebuild`].
    pub(crate) unsafe fn check(
        &self,
        head: usize,
        map: &FreeMap,
        nr_fresh: usize,
    ) -> Result<usize, BadLink> {
        if nr_fresh > 0 {
            let nr_free = map_count(map);
            if head != 0 || nr_free != nr_fresh {
                return Err(BadLink {
                    obj: 0,
                    decoded: head,
                });
            }
            for index in (0..self.nr_objs).filter(|&index| map_test(map, index)) {
                let obj = self.base + index * self.stride;
                // SAFETY: a free object of ours, per the bitmap.
                if unsafe { self.lost_key(obj) } {
                    return Err(BadLink {
                        obj,
                        // SAFETY: as above.
                        decoded: unsafe { (obj as *const usize).read() },
                    });
                }
            }
            return Ok(nr_free);
        }
        if self.by_map() {
            // SAFETY: per our caller.
            return unsafe { self.check_by_map(head, map) };
        }
        let nr_free = map_count(map);
        let nr_listed = nr_free;
        if head != 0 && !self.link_ok(map, 0, head) {
            return Err(BadLink {
                obj: 0,
                decoded: head,
            });
        }
        let mut obj = head;
        let mut nr = 0;
        while obj != 0 {
            nr += 1;
            // SAFETY: a free object of ours (the previous link checked it).
            let next = unsafe { self.read_link(obj) };
            // More links than listed objects: a cycle.
            if !self.link_ok(map, obj, next) || (next != 0 && nr >= nr_listed) {
                return Err(BadLink { obj, decoded: next });
            }
            obj = next;
        }
        if nr != nr_listed {
            return Err(BadLink { obj: 0, decoded: 0 });
        }
        Ok(nr_free)
    }
}

/// A per-cache secret for the free-list obfuscation: splitmix64 of `seed`
/// (a timestamp mixed with the cache's address), never 0.
pub(crate) fn freelist_secret(seed: u64) -> usize {
    let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    (z as usize) | 1
}

/// The free-list link as stored at address `slot_addr`: `next XOR secret
/// XOR swab(slot_addr)` (Linux `freelist_ptr`). Its own inverse: decoding
/// is the same operation. An overwrite (a use after free or an overflow)
/// decodes to a pseudo-random pointer, which the slab layer then refuses
/// (not inside the slab, or not at an object start).
#[inline(always)]
pub(crate) fn freelist_ptr(value: usize, secret: usize, slot_addr: usize) -> usize {
    value ^ secret ^ slot_addr.swap_bytes()
}

#[cfg(test)]
mod tests {
    use std::vec;

    use super::*;

    fn slab(memory: &mut [u64], link_offset: usize) -> FreeList {
        FreeList {
            base: memory.as_mut_ptr() as usize,
            stride: 32,
            nr_objs: memory.len() * 8 / 32,
            link_offset,
            secret: freelist_secret(7),
            key: 0,
        }
    }

    fn full_list(list: &FreeList, map: &FreeMap) -> usize {
        let mut head = 0;
        for index in (0..list.nr_objs).rev() {
            // SAFETY: the test's memory; every object free.
            unsafe { list.push(&mut head, map, list.base + index * 32, index) };
        }
        head
    }

    #[test]
    fn push_pop_in_order_with_obfuscated_links() {
        let mut memory = vec![0u64; 64];
        let list = slab(&mut memory, 0);
        let map: FreeMap = Default::default();
        let mut head = full_list(&list, &map);
        assert_eq!(map_count(&map), 16);
        // The stored link is not the plain next pointer.
        assert_ne!(memory[0] as usize, list.base + 32);
        // SAFETY: the test's slab.
        unsafe {
            assert_eq!(list.check(head, &map, 0), Ok(16));
            assert_eq!(list.pop(&mut head, &map), Ok(list.base));
            assert_eq!(list.pop(&mut head, &map), Ok(list.base + 32));
            assert!(!map_test(&map, 0) && map_test(&map, 2));
            list.push(&mut head, &map, list.base, 0);
            assert_eq!(list.check(head, &map, 0), Ok(15));
        }
    }

    #[test]
    fn carve_leaves_what_a_push_of_every_object_leaves() {
        // 70 objects: the bitmap's second word partly set. With and
        // without the free key; one-word objects (the bitmap alone).
        for (stride, link_offset, key) in [
            (32, 0, 0),
            (32, 8, 0x8000_0000_0000_0001),
            (8, 8, 0x8000_0000_0000_0001),
        ] {
            let mut pushed = vec![0u64; 70 * stride / 8];
            let mut carved = vec![0u64; 70 * stride / 8];
            let list_of = |memory: &mut [u64]| FreeList {
                base: memory.as_mut_ptr() as usize,
                stride,
                nr_objs: 70,
                link_offset,
                secret: freelist_secret(7),
                key,
            };
            let (a, b) = (list_of(&mut pushed), list_of(&mut carved));
            let (map_a, map_b): (FreeMap, FreeMap) = Default::default();
            let mut head_a = 0;
            // SAFETY: the test's memory, every object free.
            let head_b = unsafe {
                for index in (0..70).rev() {
                    a.push(&mut head_a, &map_a, a.base + index * stride, index);
                }
                b.carve(&map_b)
            };
            assert_eq!(head_a - a.base, head_b - b.base);
            let words = |map: &FreeMap| {
                map.iter()
                    .map(|w| w.load(Ordering::Relaxed))
                    .collect::<std::vec::Vec<_>>()
            };
            assert_eq!(words(&map_a), words(&map_b));
            assert_eq!(map_count(&map_b), 70);
            // SAFETY: the test's slab.
            assert_eq!(unsafe { b.check(head_b, &map_b, 0) }, Ok(70));
            // The links name the same objects (0: the end).
            let relative = |link: usize, base: usize| (link != 0).then(|| link - base);
            for index in 0..70 {
                // SAFETY: as above.
                let (link_a, link_b) = unsafe {
                    (
                        a.read_link(a.base + index * stride),
                        b.read_link(b.base + index * stride),
                    )
                };
                assert_eq!(
                    relative(link_a, a.base),
                    relative(link_b, b.base),
                    "{stride} {index}"
                );
            }
        }
    }

    #[test]
    fn an_overwritten_link_is_caught_and_the_list_rebuilt() {
        let mut memory = vec![0u64; 64];
        let list = slab(&mut memory, 8);
        let map: FreeMap = Default::default();
        let mut head = full_list(&list, &map);
        // A use after free writes a fake pointer into free object 0's link.
        let target = list.base + 3 * 32 + 8; // not an object start
        // SAFETY: the test's memory.
        unsafe { ((list.base + 8) as *mut usize).write(target) };
        // SAFETY: the test's slab.
        unsafe {
            let bad = list.pop(&mut head, &map).unwrap_err();
            assert_eq!(bad.obj, list.base);
            assert_ne!(bad.decoded, list.base + 32);
            assert_eq!(list.check(head, &map, 0).unwrap_err().obj, list.base);
            head = list.rebuild(&map);
            assert_eq!(list.check(head, &map, 0), Ok(16));
            assert_eq!(list.pop(&mut head, &map), Ok(list.base));
        }
    }

    #[test]
    fn a_link_to_a_busy_object_or_a_cycle_is_refused() {
        let mut memory = vec![0u64; 64];
        let list = slab(&mut memory, 0);
        let map: FreeMap = Default::default();
        let mut head = full_list(&list, &map);
        // SAFETY: the test's slab.
        unsafe {
            let first = list.pop(&mut head, &map).unwrap();
            // Free object `head` now links to the busy `first`.
            list.write_link(head, first);
            assert!(list.pop(&mut head, &map).is_err());
            // A cycle: object 2 links back to object 1.
            let head2 = list.rebuild(&map);
            list.write_link(list.base + 64, list.base + 32);
            assert!(list.check(head2, &map, 0).is_err());
        }
        assert_eq!(list.index_of(list.base + 33), None);
        assert_eq!(list.index_of(list.base + 16 * 32), None);
        assert_eq!(list.index_of(list.base + 15 * 32), Some(15));
    }

    #[test]
    fn one_word_objects_keep_the_key_and_are_found_by_the_bitmap() {
        let mut memory = vec![0u64; 16];
        let key = 0x8000_0000_0000_0001;
        let list = FreeList {
            base: memory.as_mut_ptr() as usize,
            stride: 8,
            nr_objs: 16,
            link_offset: 8,
            secret: freelist_secret(7),
            key,
        };
        let map: FreeMap = Default::default();
        let mut head = 0;
        // SAFETY: the test's slab.
        unsafe {
            for index in (0..16).rev() {
                list.push(&mut head, &map, list.base + index * 8, index);
            }
            // Every free object holds the key, and nothing else.
            assert!(memory.iter().all(|&word| word as usize == key));
            assert_eq!(list.check(head, &map, 0), Ok(16));
            assert_eq!(list.pop(&mut head, &map), Ok(list.base));
            assert_eq!(list.pop(&mut head, &map), Ok(list.base + 8));
            list.push(&mut head, &map, list.base, 0);
            assert_eq!(list.check(head, &map, 0), Ok(15));
            assert_eq!(list.pop(&mut head, &map), Ok(list.base));
            // A write after free of object 2: its key is gone.
            memory[2] = 0x4141;
            assert!(list.check(head, &map, 0).is_err());
            assert_eq!(list.pop(&mut head, &map).unwrap_err().obj, list.base + 16);
            head = list.rebuild(&map);
            assert_eq!(list.check(head, &map, 0), Ok(14));
        }
    }

    #[test]
    fn random_takes_are_each_object_once_and_not_a_stride() {
        for nr_objs in [1, 2, 3, 7, 16, 31, 63, 64, 65, 100, 255, 256, 257, 511, 512] {
            let mut firsts = std::collections::BTreeSet::new();
            let mut orders = std::collections::BTreeSet::new();
            for trial in 0..64u64 {
                let list = FreeList {
                    base: 0x10_0000,
                    stride: 16,
                    nr_objs,
                    link_offset: 0,
                    secret: 1,
                    key: 0,
                };
                let map: FreeMap = Default::default();
                list.mark_all_free(&map);
                let mut random = freelist_secret(trial) as u64;
                let order: std::vec::Vec<usize> = (0..nr_objs)
                    .map(|_| list.take_random(&map, &mut random))
                    .collect();
                let mut sorted = order.clone();
                sorted.sort_unstable();
                assert_eq!(
                    sorted,
                    (0..nr_objs).collect::<std::vec::Vec<_>>(),
                    "{nr_objs}"
                );
                assert_eq!(map_count(&map), 0);
                firsts.insert(order[0]);
                if nr_objs >= 16 {
                    // Not a constant step (a random start and stride):
                    // the distances between successive objects vary.
                    let steps: std::collections::BTreeSet<usize> = order
                        .windows(2)
                        .map(|pair| (pair[1] + nr_objs - pair[0]) % nr_objs)
                        .collect();
                    assert!(
                        steps.len() > nr_objs / 8,
                        "{nr_objs}: {} steps",
                        steps.len()
                    );
                }
                orders.insert(order);
            }
            if nr_objs >= 16 {
                // Where a slab starts, and its order, differ from draw to draw.
                assert!(
                    firsts.len() >= nr_objs.min(64) / 2,
                    "{nr_objs}: {} first objects",
                    firsts.len()
                );
                assert_eq!(orders.len(), 64, "{nr_objs}");
            }
        }
    }

    #[test]
    fn a_fresh_slab_is_free_in_the_map_keyed_and_not_threaded() {
        let key = 0x8000_0000_0000_0001;
        let mut memory = vec![0u64; 64];
        let list = FreeList {
            key,
            ..slab(&mut memory, 8)
        };
        let map: FreeMap = Default::default();
        // SAFETY: the test's memory, every object free.
        unsafe { list.fresh(&map) };
        assert_eq!(map_count(&map), 16);
        assert!((0..16).all(|index| memory[index * 4] as usize == key));
        // SAFETY: the test's slab.
        unsafe {
            // All 16 free in bitmap mode, none listed.
            assert_eq!(list.check(0, &map, 16), Ok(16));
            assert!(list.check(0, &map, 15).is_err());
            assert!(list.check(list.base, &map, 16).is_err());
            // One taken and given back: still unthreaded.
            let mut random = 7;
            let index = list.take_random(&map, &mut random);
            let obj = list.base + index * 32;
            (obj as *mut usize).write(0);
            assert_eq!(list.check(0, &map, 15), Ok(15));
            list.put_unthreaded(&map, obj, index);
            assert_eq!(list.check(0, &map, 16), Ok(16));
            // A free object written over: its key is gone.
            memory[0] = 0x4141;
            assert!(list.check(0, &map, 16).is_err());
        }
    }

    #[test]
    fn freelist_pointer_is_obfuscated_and_reversible() {
        let secret = freelist_secret(12345);
        assert_ne!(secret, 0);
        assert_ne!(secret, freelist_secret(12346));
        let slot = 0xffff_8000_0020_0040usize;
        let next = 0xffff_8000_0020_0080usize;
        let stored = freelist_ptr(next, secret, slot);
        assert_ne!(stored, next);
        assert_eq!(freelist_ptr(stored, secret, slot), next);
        // The same pointer stored elsewhere looks different.
        assert_ne!(freelist_ptr(next, secret, slot + 64), stored);
        // A small overwrite decodes far outside any slab.
        let decoded = freelist_ptr(0x4141_4141, secret, slot);
        assert!(decoded.abs_diff(next) > 1 << 32);
    }
}
