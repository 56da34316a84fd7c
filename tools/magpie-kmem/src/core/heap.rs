//! The allocator in an image, read through its debug descriptor
//! (`magpie_slab::descriptor`, docs/VMCORE.md): the cache list, each
//! cache's statistics as `KmemCache::stats` computes them live, its
//! slabs and magazines, and the address lookup of `kmem whatis`.
//!
//! Every pointer comes from the image and is checked before it is
//! followed: reads outside the image fail ([`super::image::ReadError`]),
//! lists are bounded by their counts and checked for cycles, slab headers
//! by their magic and their cache. A broken structure becomes a
//! [`Problem`] naming the cache and the address, and the walk goes on
//! with the next one.

use std::collections::HashSet;
use std::fmt;

use magpie_slab::descriptor::{
    ArenaSlot, DESCRIPTOR_HEADER_SIZE as HEADER_SIZE, DESCRIPTOR_MAGIC, DESCRIPTOR_VERSION,
    DescriptorLayout, Entry, FigureSlot, KmemstatArenas, MAX_ARENAS, SlabDescriptor,
};
use magpie_slab::{CacheStats, SlabKind};

use super::image::{Memory, ReadError};

/// The most caches, CPUs and list steps a walk accepts before it calls
/// the structure corrupt.
const MAX_CACHES: usize = 4096;
const MAX_CPUS: u64 = 1024;
const MAX_LIST: u64 = 1 << 22;

/// A structure the walk could not read or found broken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// The cache concerned (its name, or its address if unreadable), or
    /// `allocator`.
    pub cache: String,
    /// What is wrong.
    pub what: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cache {}: {}", self.cache, self.what)
    }
}

/// The descriptor's header, as read from the image.
#[derive(Debug, Clone, Copy)]
pub struct Header {
    /// Where the descriptor is.
    pub addr: u64,
    /// The allocator it describes.
    pub allocator: u64,
    /// Payload offsets of the three kinds of lock.
    pub cache_list_lock_data: u64,
    /// See above.
    pub depot_lock_data: u64,
    /// See above.
    pub slab_lock_data: u64,
    /// See above.
    pub stacks_lock_data: u64,
    /// See above.
    pub marks_lock_data: u64,
    /// See above.
    pub trace_lock_data: u64,
    /// Clock ticks per millisecond (0: unknown).
    pub clock_khz: u64,
    /// Payload offset of the error ring's lock.
    pub errors_lock_data: u64,
}

/// Decode a descriptor from its bytes (the header and the layout).
///
/// # Errors
///
/// Wrong magic, an unknown version, or too few bytes.
pub fn decode_descriptor(addr: u64, bytes: &[u8]) -> Result<(Header, DescriptorLayout), String> {
    if bytes.get(..16) != Some(&DESCRIPTOR_MAGIC[..]) {
        return Err(format!(
            "no Magpie slab descriptor at {addr:#x} (wrong magic)"
        ));
    }
    let u32_at = |at: usize| -> Option<u32> {
        Some(u32::from_le_bytes(bytes.get(at..at + 4)?.try_into().ok()?))
    };
    let u64_at = |at: usize| -> Option<u64> {
        Some(u64::from_le_bytes(bytes.get(at..at + 8)?.try_into().ok()?))
    };
    let short = || format!("the descriptor at {addr:#x} is cut short");
    let version = u32_at(16).ok_or_else(short)?;
    if version != DESCRIPTOR_VERSION {
        return Err(format!(
            "the descriptor at {addr:#x} has version {version}; this magpie-kmem reads version {DESCRIPTOR_VERSION}"
        ));
    }
    let header_size = u32_at(20).ok_or_else(short)? as usize;
    if header_size != HEADER_SIZE {
        return Err(format!(
            "the descriptor at {addr:#x} has a header of {header_size} bytes, not version {DESCRIPTOR_VERSION}'s {HEADER_SIZE}"
        ));
    }
    let header = Header {
        addr,
        allocator: u64_at(32).ok_or_else(short)?,
        cache_list_lock_data: u64_at(40).ok_or_else(short)?,
        depot_lock_data: u64_at(48).ok_or_else(short)?,
        slab_lock_data: u64_at(56).ok_or_else(short)?,
        stacks_lock_data: u64_at(64).ok_or_else(short)?,
        marks_lock_data: u64_at(72).ok_or_else(short)?,
        trace_lock_data: u64_at(80).ok_or_else(short)?,
        clock_khz: u64_at(88).ok_or_else(short)?,
        errors_lock_data: u64_at(96).ok_or_else(short)?,
    };
    let layout = bytes
        .get(header_size..)
        .and_then(DescriptorLayout::decode)
        .ok_or_else(short)?;
    check_layout(&layout).map_err(|what| format!("the descriptor at {addr:#x}: {what}"))?;
    Ok((header, layout))
}

/// The layout's figures are ones a reader can walk with: fields inside a
/// structure of at most 16 MiB and at most 64 KiB wide, counts and sizes
/// that bound what the walk reads.
fn check_layout(layout: &DescriptorLayout) -> Result<(), String> {
    for (name, entry) in layout.entries() {
        if entry.size != 0 && (entry.offset >= 1 << 24 || entry.size > 1 << 16) {
            return Err(format!("entry {name} ({entry:?}) is corrupt"));
        }
    }
    let bounded = [
        (layout.page_size, 1 << 30),
        (layout.cpu_slot_bytes, 1 << 12),
        (layout.cache_size, 1 << 20),
        (layout.cache_pcpu_offset, 1 << 20),
        (layout.slab_list_head_size, 1 << 12),
        (layout.magazine_rounds_5, 1 << 16),
        (layout.max_stack_depth, 64),
        (layout.mark_size, 1 << 12),
        (layout.cpu_ring_size, 1 << 12),
        (layout.subbuf_events, 1 << 20),
        (layout.event_size, 1 << 12),
        (layout.trace_max_frames, 256),
    ];
    for (entry, limit) in bounded {
        if entry.size != 0 || entry.offset == 0 || entry.offset > limit {
            return Err(format!("constant {entry:?} is out of range"));
        }
    }
    Ok(())
}

/// Bytes of this build's descriptor (what a reader reads at its address).
pub fn descriptor_bytes() -> usize {
    size_of::<SlabDescriptor>()
}

/// The allocator of an image.
pub struct Heap<'m> {
    mem: &'m dyn Memory,
    /// The descriptor's header.
    pub header: Header,
    /// Its layout.
    pub layout: DescriptorLayout,
    /// CPUs of the allocator.
    pub nr_cpus: u64,
}

/// One cache, read.
#[derive(Debug, Clone)]
pub struct Cache {
    /// Its address.
    pub addr: u64,
    /// Its name.
    pub name: String,
    /// Its statistics, as `KmemCache::stats` computes them.
    pub stats: CacheStats,
    /// A bootstrap cache (the allocator's metadata).
    pub bootstrap: bool,
    /// Slab pages.
    pub nr_pages: u64,
    /// Its slabs: (header address, object 0, objects, busy, pages).
    pub slabs: Vec<SlabInfo>,
    /// Rounds in its magazines (per-CPU and depot).
    pub rounds: Vec<u64>,
    /// Distance between objects.
    pub stride: u64,
    /// Its kmemtrace id.
    pub id: u32,
    /// Allocations its CPUs' magazines served, ever (slabtop's hits).
    pub nr_hits: u64,
}

/// One `kmemstat` arena row, read ([`Heap::arenas`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArenaRow {
    /// Indent level.
    pub indent: usize,
    /// Its name.
    pub name: String,
    /// Its quantum (Objsize).
    pub quantum: u64,
    /// Total Amt.
    pub total: u64,
    /// Alloc Amt.
    pub alloc: u64,
    /// Allocs Ever.
    pub nr_allocs_ever: u64,
}

/// The kernel's arena rows around the caches' ([`Heap::arenas`]).
#[derive(Debug, Clone, Default)]
pub struct ArenaRows {
    /// Rows above the caches.
    pub before: Vec<ArenaRow>,
    /// The caches' indent level.
    pub caches_indent: usize,
    /// Rows below.
    pub after: Vec<ArenaRow>,
}

/// One slab, read.
#[derive(Debug, Clone, Copy)]
pub struct SlabInfo {
    /// The slab header's address.
    pub addr: u64,
    /// Object 0.
    pub base: u64,
    /// Objects.
    pub nr_objs: u64,
    /// Objects out of the slab.
    pub nr_busy: u64,
    /// Pages.
    pub nr_pages: u64,
}

/// What [`Heap::whatis`] found.
#[derive(Debug, Clone)]
pub struct WhatIs {
    /// The address.
    pub addr: u64,
    /// Its cache's name.
    pub cache: String,
    /// Its cache's object size.
    pub obj_size: u64,
    /// The object slot holding it.
    pub object: u64,
    /// The slab.
    pub slab: u64,
    /// Allocated (neither free in its slab nor a magazine round).
    pub allocated: bool,
    /// Where a free object rests: `slab` or `magazine`.
    pub resting: &'static str,
}

impl fmt::Display for WhatIs {
    /// The live `kmem whatis` lines (`magpie_slab::reports::whatis`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.allocated {
            write!(f, "{:#x} is allocated from {}", self.addr, self.cache)?;
        } else {
            write!(
                f,
                "{:#x} is free in {} (in a {})",
                self.addr, self.cache, self.resting
            )?;
        }
        let offset = self.addr - self.object;
        if offset < self.obj_size {
            writeln!(
                f,
                ": object {:#x}+{:#x} of {} bytes, slab {:#x}",
                self.object, offset, self.obj_size, self.slab
            )
        } else {
            writeln!(
                f,
                ": padding of object {:#x} (+{:#x}, past its {} bytes), slab {:#x}",
                self.object, offset, self.obj_size, self.slab
            )
        }
    }
}

impl<'m> Heap<'m> {
    /// The heap the descriptor at `addr` describes.
    ///
    /// # Errors
    ///
    /// The descriptor cannot be read, is not one, or names no allocator
    /// yet (the kernel stopped before its heap came up).
    pub fn new(mem: &'m dyn Memory, addr: u64) -> Result<Heap<'m>, String> {
        let mut bytes = vec![0u8; descriptor_bytes()];
        mem.read(addr, &mut bytes)
            .map_err(|e| format!("the slab descriptor: {e}"))?;
        let (header, layout) = decode_descriptor(addr, &bytes)?;
        if header.allocator == 0 {
            return Err(
                "the slab descriptor names no allocator: the kernel stopped before its heap was initialised"
                    .into(),
            );
        }
        let mut heap = Heap {
            mem,
            header,
            layout,
            nr_cpus: 0,
        };
        let nr_cpus = heap
            .field(header.allocator, layout.allocator_nr_cpus)
            .map_err(|e| format!("the allocator's CPU count: {e}"))?;
        if nr_cpus == 0 || nr_cpus > MAX_CPUS {
            return Err(format!(
                "the allocator at {:#x} has {nr_cpus} CPUs: not an allocator, or corrupt",
                header.allocator
            ));
        }
        heap.nr_cpus = nr_cpus;
        Ok(heap)
    }

    /// The memory read.
    pub fn memory(&self) -> &'m dyn Memory {
        self.mem
    }

    /// The field `entry` of the structure at `base`.
    ///
    /// # Errors
    ///
    /// The read fails.
    pub fn field(&self, base: u64, entry: Entry) -> Result<u64, ReadError> {
        self.mem
            .read_uint(base.wrapping_add(entry.offset), entry.size as usize)
    }

    /// The addresses of the caches on the list, in creation order; a
    /// problem if the list is cut (unreadable or cyclic).
    pub fn cache_addrs(&self) -> (Vec<u64>, Option<Problem>) {
        let layout = &self.layout;
        let list = self
            .header
            .allocator
            .wrapping_add(layout.allocator_caches.offset)
            .wrapping_add(self.header.cache_list_lock_data);
        let mut addrs = Vec::new();
        let mut seen = HashSet::new();
        let mut next = match self.field(list, layout.cache_list_head) {
            Ok(head) => head,
            Err(e) => {
                return (
                    addrs,
                    Some(Problem {
                        cache: "list".into(),
                        what: format!("the cache list's head: {e}"),
                    }),
                );
            }
        };
        while next != 0 {
            if !seen.insert(next) || addrs.len() >= MAX_CACHES {
                return (
                    addrs,
                    Some(Problem {
                        cache: format!("{next:#x}"),
                        what: "the cache list loops back: walk stopped".into(),
                    }),
                );
            }
            addrs.push(next);
            let links = next.wrapping_add(layout.cache_links.offset);
            next = match self.field(links, layout.cache_links_next) {
                Ok(next) => next,
                Err(e) => {
                    return (
                        addrs,
                        Some(Problem {
                            cache: format!("{next:#x}"),
                            what: format!("its link to the next cache: {e}; walk stopped"),
                        }),
                    );
                }
            };
        }
        (addrs, None)
    }

    /// Every cache, read; problems of the ones that could not be (each
    /// named), in list order.
    pub fn caches(&self) -> (Vec<Cache>, Vec<Problem>) {
        let (addrs, list_problem) = self.cache_addrs();
        let mut caches = Vec::new();
        let mut problems = Vec::new();
        for addr in addrs {
            match self.cache(addr) {
                Ok(cache) => caches.push(cache),
                Err(problem) => problems.push(problem),
            }
        }
        problems.extend(list_problem);
        (caches, problems)
    }

    /// A cache's name.
    ///
    /// # Errors
    ///
    /// Unreadable, or not UTF-8 of at most its field's size.
    pub fn cache_name(&self, addr: u64) -> Result<String, String> {
        let layout = &self.layout;
        let len = self
            .field(addr, layout.cache_name_len)
            .map_err(|e| e.to_string())?;
        if len > layout.cache_name.size {
            return Err(format!("name length {len} is corrupt"));
        }
        let mut bytes = vec![0u8; len as usize];
        self.mem
            .read(addr.wrapping_add(layout.cache_name.offset), &mut bytes)
            .map_err(|e| e.to_string())?;
        String::from_utf8(bytes).map_err(|_| "its name is not UTF-8".to_string())
    }

    /// One cache, read (see [`Cache`]).
    ///
    /// # Errors
    ///
    /// A problem naming the cache and what could not be read.
    pub fn cache(&self, addr: u64) -> Result<Cache, Problem> {
        let name = self.cache_name(addr).map_err(|what| Problem {
            cache: format!("{addr:#x}"),
            what,
        })?;
        let problem = |what: String| Problem {
            cache: name.clone(),
            what,
        };
        let read = |entry: Entry| self.field(addr, entry).map_err(|e| problem(e.to_string()));
        let layout = &self.layout;
        let hot = read(layout.cache_hot_flags)?;
        let bootstrap = hot & layout.cache_hot_bootstrap.offset != 0;
        let kind = if hot & layout.cache_hot_bufctl.offset != 0 {
            SlabKind::Bufctl
        } else {
            SlabKind::Small
        };
        let obj_size = read(layout.cache_obj_size)?;
        let stride = read(layout.cache_stride)?;
        let objs_per_slab = read(layout.cache_objs_per_slab)?;
        let pages_per_slab = read(layout.cache_pages_per_slab)?;
        let align = read(layout.cache_align)?;
        let last_cpu = read(layout.cache_last_cpu)?;
        if stride == 0 || obj_size > stride || last_cpu >= MAX_CPUS || objs_per_slab > 1 << 16 {
            return Err(problem(format!(
                "corrupt geometry (object {obj_size} bytes, stride {stride}, {objs_per_slab} per slab, {} CPUs)",
                last_cpu.wrapping_add(1)
            )));
        }
        let mut nr_allocs = read(layout.cache_nr_allocs_direct)?;
        let mut nr_frees = read(layout.cache_nr_frees_direct)?;
        let mut rounds = Vec::new();
        let mut nr_cpu_cached_objs = 0u64;
        let mut nr_hits = 0u64;
        if !bootstrap {
            for cpu in 0..=last_cpu {
                let pcpu = addr
                    .wrapping_add(layout.cache_pcpu_offset.offset)
                    .wrapping_add(cpu.wrapping_mul(layout.cpu_slot_bytes.offset));
                let pcpu_read = |entry: Entry| {
                    self.field(pcpu, entry)
                        .map_err(|e| problem(format!("CPU {cpu}'s magazines: {e}")))
                };
                let loaded = pcpu_read(layout.pcpu_loaded)?;
                let prev = pcpu_read(layout.pcpu_prev)?;
                let cpu_allocs = pcpu_read(layout.pcpu_nr_allocs)?;
                let exchanged = pcpu_read(layout.pcpu_nr_rounds_exchanged)?;
                let top = pcpu_read(layout.pcpu_top)?;
                let in_loaded = self
                    .magazine_rounds(loaded, Some(top), &mut rounds)
                    .map_err(|e| {
                        problem(format!("CPU {cpu}'s loaded magazine {loaded:#x}: {e}"))
                    })?;
                let in_prev = self.magazine_rounds(prev, None, &mut rounds).map_err(|e| {
                    problem(format!("CPU {cpu}'s previous magazine {prev:#x}: {e}"))
                })?;
                let held = in_loaded.wrapping_add(in_prev);
                nr_cpu_cached_objs += held;
                nr_hits = nr_hits.wrapping_add(cpu_allocs);
                nr_allocs = nr_allocs.wrapping_add(cpu_allocs);
                nr_frees =
                    nr_frees.wrapping_add(held.wrapping_sub(exchanged).wrapping_add(cpu_allocs));
            }
        }
        let depot = addr
            .wrapping_add(layout.cache_depot_lock.offset)
            .wrapping_add(self.header.depot_lock_data);
        let depot_read = |entry: Entry| {
            self.field(depot, entry)
                .map_err(|e| problem(format!("its depot: {e}")))
        };
        let magtype = depot_read(layout.depot_magtype)?;
        let magsizes = [
            layout.magazine_rounds_0,
            layout.magazine_rounds_1,
            layout.magazine_rounds_2,
            layout.magazine_rounds_3,
            layout.magazine_rounds_4,
            layout.magazine_rounds_5,
        ];
        let magsize = magsizes
            .get(magtype as usize)
            .ok_or_else(|| problem(format!("depot magazine type {magtype} is corrupt")))?
            .offset;
        let depot_nr_full = depot_read(layout.depot_nr_full)?;
        let depot_nr_empty = depot_read(layout.depot_nr_empty)?;
        let nr_resizes = depot_read(layout.depot_nr_resizes)?;
        let mut nr_depot_objs = 0;
        let mut mag = depot_read(layout.depot_full)?;
        let mut steps = 0;
        while mag != 0 {
            steps += 1;
            if steps > depot_nr_full {
                return Err(problem(format!(
                    "depot full list is longer than its count {depot_nr_full}"
                )));
            }
            nr_depot_objs += self
                .magazine_rounds(mag, None, &mut rounds)
                .map_err(|e| problem(format!("depot magazine {mag:#x}: {e}")))?;
            mag = self
                .field(mag, layout.magazine_next)
                .map_err(|e| problem(format!("depot magazine {mag:#x}: {e}")))?;
        }
        let contention = read(layout.cache_depot_contention)?;
        let id = read(layout.cache_id)? as u32;
        let lists = addr
            .wrapping_add(layout.cache_slab_lock.offset)
            .wrapping_add(self.header.slab_lock_data);
        let (slabs, nr_slabs, nr_active_slabs) = self.slabs(addr, lists).map_err(problem)?;
        let nr_busy_objs: u64 = slabs.iter().map(|s| s.nr_busy).sum();
        let nr_pages: u64 = slabs.iter().map(|s| s.nr_pages).sum();
        let (nr_allocated, nr_allocs, nr_frees) = if bootstrap {
            let layer_read = |entry: Entry| {
                self.field(lists, entry)
                    .map_err(|e| problem(format!("its slab lists: {e}")))
            };
            (
                nr_busy_objs,
                layer_read(layout.slab_lists_nr_allocs)?,
                layer_read(layout.slab_lists_nr_frees)?,
            )
        } else {
            (nr_allocs.saturating_sub(nr_frees), nr_allocs, nr_frees)
        };
        let page = layout.page_size.offset;
        let stats = CacheStats {
            obj_size: obj_size as usize,
            align: align as usize,
            nr_allocated: nr_allocated as usize,
            nr_slabs: nr_slabs as usize,
            nr_pages_per_slab: pages_per_slab as usize,
            objs_per_slab: objs_per_slab as usize,
            nr_active_slabs: nr_active_slabs as usize,
            nr_total_objs: nr_slabs.wrapping_mul(objs_per_slab) as usize,
            nr_allocs_ever: nr_allocs,
            nr_frees_ever: nr_frees,
            magsize: if bootstrap { 0 } else { magsize as usize },
            depot_nr_full: depot_nr_full as usize,
            depot_nr_empty: depot_nr_empty as usize,
            depot_contention: contention,
            nr_magazine_resizes: nr_resizes,
            nr_cpu_cached_objs: nr_cpu_cached_objs as usize,
            nr_depot_objs: nr_depot_objs as usize,
            total_bytes: nr_pages.wrapping_mul(page) as usize,
            waste_bytes: nr_pages
                .wrapping_mul(page)
                .saturating_sub(nr_slabs.wrapping_mul(objs_per_slab).wrapping_mul(obj_size))
                as usize,
            kind,
        };
        Ok(Cache {
            addr,
            name,
            stats,
            bootstrap,
            nr_pages,
            slabs,
            rounds,
            stride,
            id,
            nr_hits,
        })
    }

    /// Rounds in the magazine at `mag` (0 for the absent magazine, whose
    /// capacity is 0); with `top` (a loaded magazine), counted from the
    /// per-CPU cache's top pointer, else from the header. Pushes the
    /// rounds onto `rounds`.
    fn magazine_rounds(
        &self,
        mag: u64,
        top: Option<u64>,
        rounds: &mut Vec<u64>,
    ) -> Result<u64, String> {
        let layout = &self.layout;
        let capacity = self
            .field(mag, layout.magazine_capacity)
            .map_err(|e| e.to_string())?;
        if capacity == 0 {
            return Ok(0);
        }
        if capacity > layout.magazine_rounds_5.offset {
            return Err(format!("capacity {capacity} is corrupt"));
        }
        let slots = mag.wrapping_add(layout.magazine_rounds.offset);
        let nr_rounds = match top {
            Some(top) => {
                let bytes = top.wrapping_sub(slots);
                if bytes % 8 != 0 || bytes / 8 > capacity {
                    return Err(format!("top {top:#x} is outside its slots"));
                }
                bytes / 8
            }
            None => self
                .field(mag, layout.magazine_nr_rounds)
                .map_err(|e| e.to_string())?,
        };
        if nr_rounds > capacity {
            return Err(format!("{nr_rounds} rounds in a magazine of {capacity}"));
        }
        let mut bytes = vec![0u8; nr_rounds as usize * 8];
        self.mem
            .read(slots, &mut bytes)
            .map_err(|e| e.to_string())?;
        rounds.extend(
            bytes
                .chunks_exact(8)
                .map(|c| u64::from_le_bytes(c.try_into().unwrap_or_default())),
        );
        Ok(nr_rounds)
    }

    /// The slabs on the three lists at `lists`: every slab, and the
    /// counts of slabs and active (partial and full) slabs.
    fn slabs(&self, cache: u64, lists: u64) -> Result<(Vec<SlabInfo>, u64, u64), String> {
        let layout = &self.layout;
        let mut slabs = Vec::new();
        let mut nr_slabs = 0;
        let mut nr_active = 0;
        let mut seen = HashSet::new();
        for list in 0..3u64 {
            let head = lists
                .wrapping_add(layout.slab_lists_lists.offset)
                .wrapping_add(list.wrapping_mul(layout.slab_list_head_size.offset));
            let nr = self
                .field(head, layout.slab_list_head_nr)
                .map_err(|e| format!("slab list {list}: {e}"))?;
            if nr > MAX_LIST {
                return Err(format!("slab list {list} counts {nr} slabs: corrupt"));
            }
            nr_slabs += nr;
            if list != 0 {
                nr_active += nr;
            }
            let mut slab = self
                .field(head, layout.slab_list_head_head)
                .map_err(|e| format!("slab list {list}: {e}"))?;
            let mut steps = 0;
            while slab != 0 {
                steps += 1;
                if steps > nr || !seen.insert(slab) {
                    return Err(format!(
                        "slab list {list} is longer than its count {nr} (or loops) at slab {slab:#x}"
                    ));
                }
                slabs.push(self.slab(cache, slab)?);
                slab = self
                    .field(slab, layout.slab_next)
                    .map_err(|e| format!("slab {slab:#x}: {e}"))?;
            }
            if steps != nr {
                return Err(format!(
                    "slab list {list} holds {steps} slabs but counts {nr}"
                ));
            }
        }
        Ok((slabs, nr_slabs, nr_active))
    }

    fn slab(&self, cache: u64, slab: u64) -> Result<SlabInfo, String> {
        let layout = &self.layout;
        let read = |entry: Entry| {
            self.field(slab, entry)
                .map_err(|e| format!("slab {slab:#x}: {e}"))
        };
        if read(layout.slab_magic)? != layout.slab_magic_value.offset {
            return Err(format!(
                "slab {slab:#x}: bad magic (not a live slab header)"
            ));
        }
        if read(layout.slab_cache)? != cache {
            return Err(format!("slab {slab:#x} belongs to another cache"));
        }
        let info = SlabInfo {
            addr: slab,
            base: read(layout.slab_base)?,
            nr_objs: read(layout.slab_nr_objs)?,
            nr_busy: read(layout.slab_nr_busy)?,
            nr_pages: read(layout.slab_nr_pages)?,
        };
        if info.nr_busy > info.nr_objs {
            return Err(format!(
                "slab {slab:#x}: {} busy of {} objects",
                info.nr_busy, info.nr_objs
            ));
        }
        Ok(info)
    }

    /// The cache, object and state of `addr` (`kmem whatis`); `None`
    /// outside every slab.
    pub fn whatis(&self, caches: &[Cache], addr: u64) -> Option<WhatIs> {
        let layout = &self.layout;
        for cache in caches {
            for slab in &cache.slabs {
                let offset = addr.wrapping_sub(slab.base);
                let index = offset / cache.stride;
                if index >= slab.nr_objs {
                    continue;
                }
                let object = slab.base.wrapping_add(index.wrapping_mul(cache.stride));
                let in_slab = match cache.stats.kind {
                    SlabKind::Small => {
                        let word = slab
                            .addr
                            .wrapping_add(layout.slab_free_map.offset)
                            .wrapping_add((index / 64) * 8);
                        self.mem
                            .read_uint(word, 8)
                            .map(|bits| bits & (1 << (index % 64)) != 0)
                            .unwrap_or(false)
                    }
                    SlabKind::Bufctl => self.bufctl_free(slab.addr, object),
                };
                let in_magazine = !in_slab && cache.rounds.contains(&object);
                return Some(WhatIs {
                    addr,
                    cache: cache.name.clone(),
                    obj_size: cache.stats.obj_size as u64,
                    object,
                    slab: slab.addr,
                    allocated: !in_slab && !in_magazine,
                    resting: if in_slab { "slab" } else { "magazine" },
                });
            }
        }
        None
    }

    /// Whether `object` is on the free bufctl list of `slab`.
    fn bufctl_free(&self, slab: u64, object: u64) -> bool {
        let layout = &self.layout;
        let Ok(mut bufctl) = self.field(slab, layout.slab_free) else {
            return false;
        };
        let mut steps = 0;
        while bufctl != 0 && steps < 1 << 16 {
            steps += 1;
            match self.field(bufctl, layout.bufctl_addr) {
                Ok(buffer) if buffer == object => return true,
                Ok(_) => {}
                Err(_) => return false,
            }
            bufctl = match self.field(bufctl, layout.bufctl_free_next) {
                Ok(next) => next,
                Err(_) => return false,
            };
        }
        false
    }

    /// The kernel's `kmemstat` arena rows ([`describe_kmemstat`]): the
    /// rows above the caches, the caches' indent, the rows below. Empty
    /// (caches at indent 0) when the kernel described none; a row whose
    /// figure cannot be read is a problem and left out.
    ///
    /// [`describe_kmemstat`]: magpie_slab::descriptor::describe_kmemstat
    pub fn arenas(&self, problems: &mut Vec<Problem>) -> ArenaRows {
        let base = self
            .header
            .addr
            .wrapping_add(std::mem::offset_of!(SlabDescriptor, arenas) as u64);
        let word = |offset: usize| self.mem.read_uint(base.wrapping_add(offset as u64), 8);
        let mut rows = ArenaRows::default();
        let (Ok(nr), Ok(after), Ok(indent)) = (
            word(std::mem::offset_of!(KmemstatArenas, nr_arenas)),
            word(std::mem::offset_of!(KmemstatArenas, caches_after)),
            word(std::mem::offset_of!(KmemstatArenas, caches_indent)),
        ) else {
            problems.push(Problem {
                cache: "allocator".into(),
                what: "the descriptor's arena table cannot be read".into(),
            });
            return rows;
        };
        if nr > MAX_ARENAS as u64 || after > nr || indent > 8 {
            problems.push(Problem {
                cache: "allocator".into(),
                what: format!("the arena table is corrupt ({nr} arenas, caches after {after}, indent {indent})"),
            });
            return rows;
        }
        rows.caches_indent = indent as usize;
        for index in 0..nr as usize {
            let slot =
                std::mem::offset_of!(KmemstatArenas, arenas) + index * size_of::<ArenaSlot>();
            match self.arena(base.wrapping_add(slot as u64)) {
                Ok(row) if index < after as usize => rows.before.push(row),
                Ok(row) => rows.after.push(row),
                Err(what) => problems.push(Problem {
                    cache: format!("arena #{index}"),
                    what,
                }),
            }
        }
        rows
    }

    fn arena(&self, slot: u64) -> Result<ArenaRow, String> {
        let word = |offset: usize| {
            self.mem
                .read_uint(slot.wrapping_add(offset as u64), 8)
                .map_err(|e| e.to_string())
        };
        let len = word(std::mem::offset_of!(ArenaSlot, name_len))?;
        if len > 31 {
            return Err(format!("name length {len} is corrupt"));
        }
        let mut name = vec![0u8; len as usize];
        self.mem
            .read(
                slot.wrapping_add(std::mem::offset_of!(ArenaSlot, name) as u64),
                &mut name,
            )
            .map_err(|e| e.to_string())?;
        let name = String::from_utf8(name).map_err(|_| "its name is not UTF-8".to_string())?;
        let mut figures = [0u64; 3];
        for (index, figure) in figures.iter_mut().enumerate() {
            let at = std::mem::offset_of!(ArenaSlot, figures) + index * size_of::<FigureSlot>();
            let field = |offset: usize| word(at + offset);
            let addr = field(std::mem::offset_of!(FigureSlot, addr))?;
            let minus = field(std::mem::offset_of!(FigureSlot, minus))?;
            let size = field(std::mem::offset_of!(FigureSlot, size))?;
            let scale = field(std::mem::offset_of!(FigureSlot, scale))?;
            *figure = if size == 0 {
                addr
            } else {
                let value = self
                    .mem
                    .read_uint(addr, size as usize)
                    .map_err(|e| format!("{name}: {e}"))?;
                let less = if minus == 0 {
                    0
                } else {
                    self.mem
                        .read_uint(minus, size as usize)
                        .map_err(|e| format!("{name}: {e}"))?
                };
                value.wrapping_sub(less).wrapping_mul(scale)
            };
        }
        Ok(ArenaRow {
            indent: word(std::mem::offset_of!(ArenaSlot, indent))?.min(8) as usize,
            name,
            quantum: word(std::mem::offset_of!(ArenaSlot, quantum))?,
            total: figures[0],
            alloc: figures[1],
            nr_allocs_ever: figures[2],
        })
    }

    /// An allocator field (see [`DescriptorLayout`]).
    ///
    /// # Errors
    ///
    /// The read fails.
    pub fn allocator_field(&self, entry: Entry) -> Result<u64, ReadError> {
        self.field(self.header.allocator, entry)
    }
}
