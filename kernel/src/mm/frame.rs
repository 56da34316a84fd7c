//! The physical frame allocator: one bit per 4 KiB frame of usable RAM
//! (1 = in use or not RAM), lowest address first.
//!
//! Supports contiguous multi-frame allocations (optionally aligned) and
//! frees of any sub-range. The bitmap itself lives in RAM found at boot.
//! Reserved at init: everything below 1 MiB, the kernel image, boot modules
//! (the kernel ELF used for symbols) and the ACPI tables.
//!
//! # Code tags on frames
//!
//! With allocation profiling compiled in, a second array beside the
//! bitmap keeps each frame's allocation tag (Linux keeps it in `page_ext`,
//! `include/linux/pgalloc_tag.h`): [`alloc_tagged`] (the `alloc_pages!`
//! macro's call, one tag per call site) stores the tag in every frame of
//! the run, marks the first frame as the allocation's head, and counts
//! `bytes = frames x 4096`, `calls = 1` at the tag; [`free`] of any
//! sub-range uncounts what it frees (4096 bytes a tagged frame, one call
//! a head). The counting is registered by the profiling layer above
//! ([`set_tag_counting`]); frames allocated untagged (the plain calls: the
//! slab allocator's pages, whose objects are counted by the slab
//! allocator, and everything before profiling is up) count nothing.

use magpie_codetag::alloc_tag::AllocTagRef;
use spin::{Mutex, Once};
pub use x86_64::PhysAddr;
use x86_64::instructions::interrupts::without_interrupts;

use crate::mm::boot_info::{BootInfo, MemoryKind};
use crate::mm::layout::phys_to_virt;
use crate::mm::reserved;

/// Size of a frame.
pub const PAGE_SIZE: usize = 4096;
const FRAME_SHIFT: u32 = 12;
const LOW_MEMORY_END: u64 = 1 << 20;

/// Frame allocator statistics.
#[derive(Debug, Clone, Copy, Default)]
pub struct FrameStats {
    /// Frames managed (usable RAM minus boot reservations).
    pub nr_total: usize,
    /// Frames free now.
    pub nr_free: usize,
    /// Allocation calls that succeeded since boot.
    pub nr_allocs_ever: u64,
    /// Frees since boot.
    pub nr_frees_ever: u64,
}

/// How tagged frames are counted: registered by the profiling layer
/// ([`set_tag_counting`]), called with the frame lock held (each is a few
/// atomic adds on its tag's counters and must not allocate).
#[derive(Clone, Copy)]
pub struct TagCounting {
    /// `bytes` more, one call more, at a tag.
    pub charge: fn(tag: AllocTagRef, bytes: usize),
    /// `bytes` fewer and `nr_calls` fewer at a tag.
    pub uncharge: fn(tag: AllocTagRef, bytes: usize, nr_calls: u64),
}

static TAG_COUNTING: Once<TagCounting> = Once::new();

/// Registers how tagged frames are counted (once; later calls are
/// ignored). Until then [`alloc_tagged`] stores no tag.
pub fn set_tag_counting(counting: TagCounting) {
    TAG_COUNTING.call_once(|| counting);
}

/// Bit of a frame's tag word marking the first frame of an allocation.
const TAG_HEAD: u32 = 1 << 31;

struct Bitmap {
    words: &'static mut [u64],
    /// Each frame's allocation tag reference (0: none), `TAG_HEAD` on an
    /// allocation's first frame; empty with profiling compiled out.
    tags: &'static mut [u32],
    nr_frames: usize,
    /// Lowest frame that may be free (search start).
    hint: usize,
    stats: FrameStats,
}

impl Bitmap {
    fn is_used(&self, frame: usize) -> bool {
        self.words[frame / 64] & (1 << (frame % 64)) != 0
    }

    fn set_used(&mut self, frame: usize, used: bool) {
        if used {
            self.words[frame / 64] |= 1 << (frame % 64);
        } else {
            self.words[frame / 64] &= !(1 << (frame % 64));
        }
    }

    fn find_run(&self, nr_frames: usize, align: usize) -> Option<usize> {
        let mut start = self.hint.next_multiple_of(align);
        while start + nr_frames <= self.nr_frames {
            // Skip fully used words quickly.
            if self.words[start / 64] == u64::MAX {
                start = (start / 64 + 1) * 64;
                start = start.next_multiple_of(align);
                continue;
            }
            match (start..start + nr_frames).find(|&frame| self.is_used(frame)) {
                None => return Some(start),
                Some(used) => start = (used + 1).next_multiple_of(align),
            }
        }
        None
    }

    fn allocate(
        &mut self,
        nr_frames: usize,
        align: usize,
        tag: Option<AllocTagRef>,
    ) -> Option<usize> {
        let start = self.find_run(nr_frames, align)?;
        for frame in start..start + nr_frames {
            self.set_used(frame, true);
        }
        let counting = TAG_COUNTING.get();
        if let (Some(tag), Some(counting), Some(tags)) =
            (tag, counting, self.tags.get_mut(start..start + nr_frames))
        {
            tags.fill(tag.get());
            tags[0] |= TAG_HEAD;
            (counting.charge)(tag, nr_frames * PAGE_SIZE);
        }
        if start == self.hint {
            self.hint = start + nr_frames;
        }
        self.stats.nr_free -= nr_frames;
        self.stats.nr_allocs_ever += 1;
        Some(start)
    }

    fn release(&mut self, first: usize, nr_frames: usize) {
        assert!(
            first + nr_frames <= self.nr_frames,
            "frame::free of {nr_frames} frames at frame {first:#x}: beyond RAM"
        );
        for frame in first..first + nr_frames {
            assert!(
                self.is_used(frame),
                "frame::free: frame {:#x} is not allocated",
                frame << FRAME_SHIFT
            );
            self.set_used(frame, false);
        }
        self.uncharge(first, nr_frames);
        self.hint = self.hint.min(first);
        self.stats.nr_free += nr_frames;
        self.stats.nr_frees_ever += 1;
    }
}

impl Bitmap {
    /// Uncounts the tagged frames of `first..first + nr_frames` (being
    /// freed) and clears their tags: per run of frames with one tag, its
    /// bytes and the heads among them.
    fn uncharge(&mut self, first: usize, nr_frames: usize) {
        let Some(tags) = self.tags.get_mut(first..first + nr_frames) else {
            return;
        };
        let Some(counting) = TAG_COUNTING.get() else {
            return;
        };
        for run in tags.chunk_by_mut(|a, b| *a & !TAG_HEAD == *b & !TAG_HEAD) {
            if let Some(tag) = AllocTagRef::new(run[0] & !TAG_HEAD) {
                let nr_heads = run.iter().filter(|&&word| word & TAG_HEAD != 0).count();
                (counting.uncharge)(tag, run.len() * PAGE_SIZE, nr_heads as u64);
            }
            run.fill(0);
        }
    }
}

static FRAMES: Mutex<Option<Bitmap>> = Mutex::new(None);

/// Physical ranges the allocator must never hand out.
fn reserved_ranges(boot: &BootInfo) -> impl Iterator<Item = (u64, u64)> + '_ {
    core::iter::once((0, LOW_MEMORY_END))
        .chain(core::iter::once(boot.kernel_phys))
        .chain(
            boot.modules
                .iter()
                .map(|module| (module.start, module.start + module.size)),
        )
        .chain(reserved::ranges())
        .chain(core::iter::once((
            boot.start_info_phys,
            boot.start_info_phys + 64,
        )))
}

fn overlaps_reserved(boot: &BootInfo, start: u64, end: u64) -> bool {
    reserved_ranges(boot)
        .any(|(reserved_start, reserved_end)| start < reserved_end && reserved_start < end)
}

/// Finds `bytes` of usable RAM below 4 GiB (reachable through the boot
/// direct map) that overlaps no reserved range.
fn find_bitmap_home(boot: &BootInfo, bytes: u64) -> Option<u64> {
    let candidates = boot
        .memmap
        .iter()
        .map(|region| region.start)
        .chain(reserved_ranges(boot).map(|(_, end)| end))
        .map(|address| address.next_multiple_of(PAGE_SIZE as u64));
    candidates
        .filter(|&start| start + bytes <= 4 << 30)
        .filter(|&start| {
            boot.memmap.iter().any(|region| {
                region.kind == MemoryKind::Usable
                    && region.start <= start
                    && start + bytes <= region.end()
            })
        })
        .filter(|&start| !overlaps_reserved(boot, start, start + bytes))
        .min()
}

/// Builds the bitmap from the memory map (boot CPU, before any allocation).
pub(crate) fn init(boot: &BootInfo) {
    for region in boot.memmap {
        log::debug!(
            "memmap: {:#012x}..{:#012x} {:?}",
            region.start,
            region.end(),
            region.kind
        );
    }
    let max_end = boot
        .memmap
        .iter()
        .filter(|region| region.kind == MemoryKind::Usable)
        .map(|region| region.end())
        .max()
        .unwrap_or(0);
    let nr_frames = (max_end >> FRAME_SHIFT) as usize;
    let nr_words = nr_frames.div_ceil(64);
    let nr_tags = if cfg!(feature = "alloc-profiling") {
        nr_frames
    } else {
        0
    };
    let bitmap_bytes = ((nr_words * 8 + nr_tags * 4) as u64).next_multiple_of(PAGE_SIZE as u64);
    let home = find_bitmap_home(boot, bitmap_bytes).expect("no RAM for the frame bitmap");
    // SAFETY: [home, home + bitmap_bytes) is usable RAM below 4 GiB (mapped
    // by the boot direct map) that no reserved range overlaps; from here on
    // the bitmap marks it used, so nothing else will ever own it. The words
    // come first, the tags (4-byte aligned: after 8-byte words) after them,
    // nr_words * 8 + nr_tags * 4 <= bitmap_bytes.
    let (words, tags): (&'static mut [u64], &'static mut [u32]) = unsafe {
        let base = phys_to_virt(home) as *mut u64;
        (
            core::slice::from_raw_parts_mut(base, nr_words),
            core::slice::from_raw_parts_mut(base.add(nr_words).cast::<u32>(), nr_tags),
        )
    };
    words.fill(u64::MAX);
    tags.fill(0);

    let mut bitmap = Bitmap {
        words,
        tags,
        nr_frames,
        hint: 0,
        stats: FrameStats::default(),
    };
    for region in boot
        .memmap
        .iter()
        .filter(|region| region.kind == MemoryKind::Usable)
    {
        let first = region.start.next_multiple_of(PAGE_SIZE as u64) >> FRAME_SHIFT;
        let end = region.end() >> FRAME_SHIFT;
        for frame in first..end {
            bitmap.set_used(frame as usize, false);
        }
    }
    let reserve = |bitmap: &mut Bitmap, start: u64, end: u64| {
        let first = (start >> FRAME_SHIFT) as usize;
        let end = (end.next_multiple_of(PAGE_SIZE as u64) >> FRAME_SHIFT) as usize;
        for frame in first..end.min(nr_frames) {
            bitmap.set_used(frame, true);
        }
    };
    for (start, end) in reserved_ranges(boot) {
        reserve(&mut bitmap, start, end);
    }
    reserve(&mut bitmap, home, home + bitmap_bytes);

    let nr_free = (0..nr_frames)
        .filter(|&frame| !bitmap.is_used(frame))
        .count();
    bitmap.stats.nr_total = nr_free;
    bitmap.stats.nr_free = nr_free;
    log::debug!(
        "{} frames ({} MiB) free, bitmap at {:#x}",
        nr_free,
        (nr_free * PAGE_SIZE) >> 20,
        home
    );
    *FRAMES.lock() = Some(bitmap);
}

/// Runs `f` on the bitmap with interrupts off on this CPU (the lock is
/// taken in interrupt handlers too) and the lock held.
fn with_frames<R>(f: impl FnOnce(&mut Bitmap) -> R) -> R {
    without_interrupts(|| {
        let mut frames = FRAMES.lock();
        f(frames
            .as_mut()
            .expect("frame allocator used before frame::init"))
    })
}

/// Allocates `nr_pages` physically contiguous frames. Returns the first
/// frame's address, or `None` if no run that long is free.
pub fn alloc_contiguous(nr_pages: usize) -> Option<PhysAddr> {
    alloc_aligned(nr_pages, 1)
}

/// Allocates `nr_pages` contiguous frames whose first frame number is a
/// multiple of `align_pages` (a power of two), e.g. for naturally aligned slabs.
pub fn alloc_aligned(nr_pages: usize, align_pages: usize) -> Option<PhysAddr> {
    alloc_tagged(nr_pages, align_pages, None)
}

/// [`alloc_aligned`] charged to allocation tag `tag` (`None`: uncounted):
/// `nr_pages x 4096` bytes and one call at the tag until the frames are
/// freed (see the module docs). Called by the `alloc_pages!` macro with
/// its call site's tag.
pub fn alloc_tagged(
    nr_pages: usize,
    align_pages: usize,
    tag: Option<AllocTagRef>,
) -> Option<PhysAddr> {
    if nr_pages == 0 || !align_pages.is_power_of_two() {
        return None;
    }
    let first = with_frames(|frames| frames.allocate(nr_pages, align_pages, tag))?;
    Some(PhysAddr::new((first as u64) << FRAME_SHIFT))
}

/// Frees `nr_pages` frames starting at `phys` (page-aligned; any sub-range of
/// earlier allocations).
///
/// # Panics
///
/// If a frame in the range is not allocated (a double or a bad free).
pub fn free(phys: PhysAddr, nr_pages: usize) {
    assert!(
        phys.is_aligned(PAGE_SIZE as u64),
        "frame::free of unaligned {:#x}",
        phys.as_u64()
    );
    with_frames(|frames| frames.release((phys.as_u64() >> FRAME_SHIFT) as usize, nr_pages));
}

/// Allocates contiguous frames and returns their direct-map address, zeroed.
pub fn alloc_zeroed(nr_pages: usize) -> Option<*mut u8> {
    let phys = alloc_contiguous(nr_pages)?;
    let virt = phys_to_virt(phys.as_u64()) as *mut u8;
    // SAFETY: the frames were just allocated to us and are mapped by the direct map.
    unsafe { core::ptr::write_bytes(virt, 0, nr_pages * PAGE_SIZE) };
    Some(virt)
}

/// Where the statistics live (they stay there once `frame::init` has
/// run): for readers of a memory image (`kmemstat`'s `base` row from a
/// core). `None` before `frame::init`.
pub fn stats_location() -> Option<*const FrameStats> {
    without_interrupts(|| {
        FRAMES
            .lock()
            .as_ref()
            .map(|frames| core::ptr::from_ref(&frames.stats))
    })
}

/// Current statistics (zero before `frame::init`).
pub fn stats() -> FrameStats {
    without_interrupts(|| {
        FRAMES
            .lock()
            .as_ref()
            .map(|frames| frames.stats)
            .unwrap_or_default()
    })
}
