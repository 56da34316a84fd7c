//! The cold paths of a cache with debug flags (see [`crate::debug`] for
//! the flags and the object layout): what happens to an object when it is
//! created in a slab, handed to a caller, and given back.
//!
//! ```text
//!  grow ─► debug_init_object: state FREE, poison, redzone
//!  alloc (any path) ─► magazines / slab ─► debug_on_alloc:
//!        state must be FREE  (else: bad state)
//!        poison intact       (else: modified after free, at the first bad word)
//!        redzone intact      (else: redzone violation)
//!        → state ALLOCATED, requested size, audit alloc record,
//!          0xbaddcafe fill, redzone from the requested size
//!  free ─► owner check ─► debug_on_free:
//!        state FREE          → duplicate free: refused, nothing changed
//!        state not ALLOCATED → bad state: reported, the free goes on
//!        redzone broken      → redzone violation: reported, repaired, goes on
//!                              (from the requested size: a kmalloc(100)
//!                              in kmalloc-104 has 4 more redzone bytes)
//!        → contents saved, audit free record, state FREE, 0xdeadbeef fill
//!        ─► magazines (the object rests there poisoned)
//! ```
//!
//! Every function here returns the reports it produced instead of
//! reporting them, so its callers report with no lock held.

use core::ptr::NonNull;

use super::KmemCache;
use crate::debug::{
    AuditRecord, DebugFlags, DebugLayout, Mismatch, ObjectState, POISON_FREE, POISON_UNINITIALIZED,
    STATE_ALLOCATED, STATE_FREE,
};
use crate::error::FreeError;
use crate::layout::geometry::SlabKind;
use crate::platform::Platform;
use crate::reports::error::{ErrorKind, ErrorReport};
use crate::slab::Slab;

/// What a debug free decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DebugFree {
    /// Clean: go on with the free.
    Clean,
    /// Corruption found and reported (redzone, state word); the free goes
    /// on (the object is repaired).
    Repaired(ErrorReport),
    /// A duplicate free: refuse it, nothing was changed.
    Duplicate(ErrorReport),
}

impl<P: Platform> KmemCache<P> {
    /// The post-alloc hook of a debug cache: [`Self::debug_on_alloc`],
    /// its report (if any) sent.
    #[cold]
    #[inline(never)]
    pub(super) fn debug_alloc_hook(&self, obj: NonNull<u8>, bytes_req: usize) {
        let Some(layout) = self.debug.as_ref() else {
            return;
        };
        let addr = obj.as_ptr() as usize;
        let slab = match self.kind {
            SlabKind::Small => self.small_slab_of(addr) as usize,
            SlabKind::Bufctl => self.params.page_map.get(addr).slab_unchecked(),
        };
        // SAFETY: just taken from our magazines or slab layer: ours until
        // returned (its stride holds the debug slot).
        if let Some(report) = unsafe { self.debug_on_alloc(layout, addr, slab, bytes_req) } {
            self.owner().report_error(report);
        }
    }

    /// The free hook of a debug cache: [`Self::debug_on_free`], its
    /// report (if any) sent; a duplicate free refused.
    ///
    /// # Safety
    /// `addr` is an object start of this cache in `slab` (null for a
    /// bufctl cache off the primary source), given up by the caller.
    pub(super) unsafe fn debug_free_hook(
        &self,
        addr: usize,
        slab: *mut Slab,
    ) -> Result<(), FreeError> {
        let Some(layout) = self.debug.as_ref() else {
            return Ok(());
        };
        // SAFETY: per our caller.
        match unsafe { self.debug_on_free(layout, addr, slab as usize) } {
            DebugFree::Clean => Ok(()),
            DebugFree::Repaired(report) => {
                self.owner().report_error(report);
                Ok(())
            }
            DebugFree::Duplicate(report) => {
                self.owner().report_error(report);
                Err(FreeError::DoubleFree { addr })
            }
        }
    }

    /// The slot (object and trailer) of the object at `addr`.
    ///
    /// # Safety
    /// `addr` is an object start of this cache, whose stride holds
    /// `layout.slot_size` bytes (and `layout.left` before `addr`, the left
    /// redzone's, which the object's own checks use); nobody else uses the slot for the
    /// lifetime of the slice (the caller owns the object: it is being
    /// created, handed out, freed or verified under the slab lock).
    #[allow(
        clippy::mut_from_ref,
        reason = "raw object memory, owned per the caller"
    )]
    pub(super) unsafe fn debug_slot(&self, layout: &DebugLayout, addr: usize) -> &mut [u8] {
        // SAFETY: per the caller.
        unsafe { core::slice::from_raw_parts_mut(addr as *mut u8, layout.slot_size) }
    }

    /// The left redzone word of the object at `addr`: the 8 bytes right
    /// before it (`layout.left` is not 0).
    fn left_redzone_word(addr: usize) -> *mut u64 {
        (addr - 8) as *mut u64
    }

    /// The first overwritten byte of the left redzone of the object at
    /// `addr` (an underflow), if the cache has one.
    ///
    /// # Safety
    /// As for `debug_slot` (the `layout.left` bytes before `addr` are the
    /// object's too, in its stride).
    unsafe fn check_left_redzone(&self, layout: &DebugLayout, addr: usize) -> Option<Mismatch> {
        if layout.left == 0 {
            return None;
        }
        // SAFETY: per our caller.
        layout.check_left_redzone(unsafe { Self::left_redzone_word(addr).read() })
    }

    /// Write (or repair) the left redzone of the object at `addr`, if the
    /// cache has one.
    ///
    /// # Safety
    /// As for [`Self::check_left_redzone`].
    unsafe fn fill_left_redzone(&self, layout: &DebugLayout, addr: usize) {
        if layout.left != 0 {
            // SAFETY: per our caller.
            unsafe { Self::left_redzone_word(addr).write(layout.left_redzone()) };
        }
    }

    /// Make a fresh object of a new slab a free debug object.
    ///
    /// # Safety
    /// As for `debug_slot`; the slab was just carved.
    pub(crate) unsafe fn debug_init_object(&self, layout: &DebugLayout, addr: usize) {
        // SAFETY: per the caller.
        let slot = unsafe { self.debug_slot(layout, addr) };
        slot.fill(0);
        if layout.poison {
            layout.fill_poison(slot, POISON_FREE);
        }
        layout.fill_redzone(slot, layout.obj_size);
        layout.set_state(slot, addr, STATE_FREE);
        // SAFETY: per our caller.
        unsafe { self.fill_left_redzone(layout, addr) };
    }

    /// Check a free object being handed to a caller and mark it allocated.
    /// Always completes the hand-over (an object found corrupted is
    /// repaired: state, poison and redzone are rewritten); returns the
    /// report of what was found, if anything.
    ///
    /// `requested`: the bytes the caller asked for (a kmalloc's size; 0
    /// for the whole object): with `REDZONE` the redzone starts there.
    ///
    /// # Safety
    /// As for `debug_slot`: `addr` was just taken from the magazines or
    /// the slab layer of this cache.
    pub(crate) unsafe fn debug_on_alloc(
        &self,
        layout: &DebugLayout,
        addr: usize,
        slab: usize,
        requested: usize,
    ) -> Option<ErrorReport> {
        // SAFETY: per the caller.
        let slot = unsafe { self.debug_slot(layout, addr) };
        let report = self.debug_check_free_slot(layout, slot, addr, slab);
        layout.set_state(slot, addr, STATE_ALLOCATED);
        let requested = match requested {
            1.. if requested < layout.obj_size => requested,
            _ => layout.obj_size,
        };
        layout.set_requested_size(slot, requested);
        layout.record_audit::<P>(slot, false);
        if layout.poison {
            layout.fill_poison(slot, POISON_UNINITIALIZED);
        }
        layout.fill_redzone(slot, requested);
        // SAFETY: per our caller.
        unsafe { self.fill_left_redzone(layout, addr) };
        report
    }

    /// [`Self::debug_resize`] of a debug cache's object, reported.
    ///
    /// # Safety
    /// As for `debug_resize`; `slab` is the object's slab.
    #[cold]
    #[inline(never)]
    pub(crate) unsafe fn debug_resized(&self, addr: usize, slab: *mut Slab, new_size: usize) {
        if let Some(layout) = self.debug.as_ref()
            // SAFETY: per our caller.
            && let Some(report) = unsafe { self.debug_resize(layout, addr, slab as usize, new_size) }
        {
            self.owner().report_error(report);
        }
    }

    /// A kept kmalloc block's caller now uses `new_size` bytes
    /// (`krealloc` in place, `GlobalAlloc::realloc`,
    /// `Allocator::allocate`): check the redzone as it was, then move its
    /// start to `new_size` (Linux `krealloc` with `orig_size`). Returns
    /// the report of a redzone found broken.
    ///
    /// # Safety
    /// As for `debug_slot`: `addr` is an allocated object of this cache
    /// that the caller owns.
    pub(crate) unsafe fn debug_resize(
        &self,
        layout: &DebugLayout,
        addr: usize,
        slab: usize,
        new_size: usize,
    ) -> Option<ErrorReport> {
        layout.size_offset?;
        // SAFETY: per the caller.
        let slot = unsafe { self.debug_slot(layout, addr) };
        let report = layout
            .check_redzone_in_use(slot)
            .map(|mismatch| self.redzone_report(layout, slot, addr, slab, mismatch));
        let new_size = new_size.clamp(1, layout.obj_size);
        layout.set_requested_size(slot, new_size);
        layout.fill_redzone(slot, new_size);
        report
    }

    /// The checks of an object that should be free (in a magazine, the
    /// depot or its slab): state, poison, redzone. The first problem found.
    pub(super) fn debug_check_free_slot(
        &self,
        layout: &DebugLayout,
        slot: &[u8],
        addr: usize,
        slab: usize,
    ) -> Option<ErrorReport> {
        let (kind, mismatch) = match layout.object_state(slot, addr) {
            ObjectState::Free => match layout.poison.then(|| layout.check_poison(slot)).flatten() {
                Some(mismatch) => (ErrorKind::ModifiedAfterFree, mismatch),
                None => (
                    ErrorKind::RedzoneViolation,
                    layout
                        .check_redzone(slot, layout.obj_size)
                        // SAFETY: the slot is the caller's (see `debug_slot`),
                        // and so are the left redzone's bytes before it.
                        .or_else(|| unsafe { self.check_left_redzone(layout, addr) })?,
                ),
            },
            // Allocated (a free object must not say so) or overwritten.
            state => (
                ErrorKind::BadState,
                Mismatch {
                    offset: layout.state_offset,
                    expected: addr as u64 ^ STATE_FREE,
                    found: match state {
                        ObjectState::Corrupt(word) => word,
                        _ => addr as u64 ^ STATE_ALLOCATED,
                    },
                },
            ),
        };
        Some(self.debug_report(layout, slot, kind, addr, slab, Some(mismatch)))
    }

    /// Check an object a caller frees; unless it is a duplicate free, mark
    /// it free (contents saved, audit free record, poison).
    ///
    /// # Safety
    /// As for `debug_slot`: `addr` is an object start of this cache that
    /// passed the owner check, given up by the caller.
    pub(crate) unsafe fn debug_on_free(
        &self,
        layout: &DebugLayout,
        addr: usize,
        slab: usize,
    ) -> DebugFree {
        // SAFETY: per the caller.
        let slot = unsafe { self.debug_slot(layout, addr) };
        let mut found = None;
        match layout.object_state(slot, addr) {
            ObjectState::Allocated => {}
            ObjectState::Free => {
                return DebugFree::Duplicate(self.debug_report(
                    layout,
                    slot,
                    ErrorKind::DuplicateFree,
                    addr,
                    slab,
                    None,
                ));
            }
            ObjectState::Corrupt(word) => {
                found = Some(self.bad_state_report(layout, slot, addr, slab, word));
            }
        }
        if found.is_none()
            && let Some(mismatch) = layout
                .check_redzone_in_use(slot)
                // SAFETY: per our caller.
                .or_else(|| unsafe { self.check_left_redzone(layout, addr) })
        {
            found = Some(self.redzone_report(layout, slot, addr, slab, mismatch));
        }
        layout.save_contents(slot);
        layout.record_audit::<P>(slot, true);
        layout.set_state(slot, addr, STATE_FREE);
        if layout.poison {
            layout.fill_poison(slot, POISON_FREE);
        }
        layout.fill_redzone(slot, layout.obj_size);
        // SAFETY: per our caller.
        unsafe { self.fill_left_redzone(layout, addr) };
        match found {
            Some(report) => DebugFree::Repaired(report),
            None => DebugFree::Clean,
        }
    }

    /// The report of a redzone violation (right or left) of the object at
    /// `addr`.
    fn redzone_report(
        &self,
        layout: &DebugLayout,
        slot: &[u8],
        addr: usize,
        slab: usize,
        mismatch: Mismatch,
    ) -> ErrorReport {
        self.debug_report(
            layout,
            slot,
            ErrorKind::RedzoneViolation,
            addr,
            slab,
            Some(mismatch),
        )
    }

    /// The report for an object whose state word is neither "free" nor
    /// "allocated" for its address (`found`): a write over the state word.
    pub(super) fn bad_state_report(
        &self,
        layout: &DebugLayout,
        slot: &[u8],
        addr: usize,
        slab: usize,
        found: u64,
    ) -> ErrorReport {
        self.debug_report(
            layout,
            slot,
            ErrorKind::BadState,
            addr,
            slab,
            Some(Mismatch {
                offset: layout.state_offset,
                expected: addr as u64 ^ STATE_ALLOCATED,
                found,
            }),
        )
    }

    /// Verify one object without changing it: a free one (`free`: on its
    /// slab's free list, or its state says free) must hold its poison and
    /// redzone; an allocated one its redzone.
    ///
    /// # Safety
    /// As for `debug_slot`, read-only: called under the slab lock.
    pub(crate) unsafe fn debug_verify_object(
        &self,
        layout: &DebugLayout,
        addr: usize,
        slab: usize,
        free_in_slab: bool,
    ) -> Option<ErrorReport> {
        // SAFETY: per the caller.
        let slot = unsafe { self.debug_slot(layout, addr) };
        let state = layout.object_state(slot, addr);
        if free_in_slab || state == ObjectState::Free {
            return self.debug_check_free_slot(layout, slot, addr, slab);
        }
        if let ObjectState::Corrupt(word) = state {
            return Some(self.bad_state_report(layout, slot, addr, slab, word));
        }
        layout
            .check_redzone_in_use(slot)
            // SAFETY: per our caller, read-only.
            .or_else(|| unsafe { self.check_left_redzone(layout, addr) })
            .map(|mismatch| self.redzone_report(layout, slot, addr, slab, mismatch))
    }

    /// What the trailer of a debug object says: its state, last alloc,
    /// last free and saved contents (for `whatis` and reports).
    ///
    /// # Safety
    /// As for `debug_slot`, read-only.
    pub(crate) unsafe fn debug_object_info(
        &self,
        layout: &DebugLayout,
        addr: usize,
    ) -> DebugObjectInfo {
        // SAFETY: per the caller.
        let slot = unsafe { self.debug_slot(layout, addr) };
        let audit = layout.audit(slot);
        DebugObjectInfo {
            state: layout.object_state(slot, addr),
            last_alloc: audit.map(|(alloc, _)| alloc),
            last_free: audit.map(|(_, free)| free),
            contents: layout.contents(slot),
        }
    }

    /// A report about object `addr` of this cache, with its transactions.
    pub(super) fn debug_report(
        &self,
        layout: &DebugLayout,
        slot: &[u8],
        kind: ErrorKind,
        addr: usize,
        slab: usize,
        corruption: Option<Mismatch>,
    ) -> ErrorReport {
        let mut report = ErrorReport::new(kind, self.name(), addr);
        report.object = addr;
        report.slab = slab;
        report.corruption = corruption;
        if let Some((alloc, free)) = layout.audit(slot) {
            report.last_alloc = Some(alloc);
            report.last_free = Some(free);
        }
        if layout.flags.contains(DebugFlags::CONTENTS) {
            report.contents = layout.contents(slot);
        }
        report
    }
}

/// What a debug object's trailer holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DebugObjectInfo {
    pub(crate) state: ObjectState,
    pub(crate) last_alloc: Option<AuditRecord>,
    pub(crate) last_free: Option<AuditRecord>,
    pub(crate) contents: Option<[u8; crate::debug::CONTENTS_BYTES]>,
}
