//! `magpie-kmem core CORE findleaks`: the conservative scan of the
//! shell's `kmem findleaks` (`magpie_slab::leak_scan`, illumos
//! `::findleaks`) run over a memory image, written by the library's
//! writers (`magpie_slab::reports::write_findleaks_*`) in the shell's
//! layout.
//!
//! The objects are the live scan's: every busy object of the caches that
//! are not the allocator's own (small slabs: clear in the slab's free
//! map; bufctl slabs: in the cache's bufctl hash), each page-granular
//! kmalloc (a head entry of the page map) and each allocated KFENCE
//! sample; rounds in magazines and the depot are free ("resting"). The
//! roots are what the kernel described
//! (`magpie_slab::descriptor::describe_leak_roots`: its data and bss less
//! the holes, its stacks from where each one's live part starts) and
//! every CPU's registers from the core's notes. Sites come from the
//! objects' charge tokens through the code tags' descriptor
//! (`magpie_codetag::descriptor`) and the kernel ELF's symbols.

use std::collections::HashSet;
use std::fmt;

use magpie_slab::SlabKind;
use magpie_slab::descriptor::{
    LeakRoots, MAX_ROOT_RANGES, MAX_STACK_TABLES, SlabDescriptor, StackSlot,
};
use magpie_slab::leak_scan::LeakSummary;
use magpie_slab::reports::{
    write_findleaks_group, write_findleaks_header, write_findleaks_summary,
};

use super::codetag::{CodetagDescriptorRead, TagRead};
use super::heap::{Cache, Heap, Problem};
use super::image::{CpuState, Memory};
use super::trace::KernelSymbols;

/// Allocated, not (yet) reached from a root.
const UNREACHED: u8 = 0;
/// Reached from a root.
const REACHED: u8 = 1;
/// Busy in the slab layer but resting in a magazine or the depot: free.
const RESTING: u8 = 2;

/// The largest root range, stack or object the scan reads (a bigger one
/// is corrupt).
const MAX_SCAN: u64 = 1 << 30;
/// Bytes read at a time from a root range.
const CHUNK: usize = 1 << 16;

/// One allocated object.
#[derive(Debug, Clone, Copy)]
struct Entry {
    start: u64,
    size: u64,
    /// Its cache's address; 0 for a page-granular kmalloc.
    cache: u64,
    /// Its charge token (0: none).
    token: u32,
    state: u8,
}

fn problem(what: String) -> Problem {
    Problem {
        cache: "findleaks".into(),
        what,
    }
}

/// The scan over an image.
struct Scan<'m> {
    mem: &'m dyn Memory,
    table: Vec<Entry>,
    lo: u64,
    hi: u64,
    stack: Vec<usize>,
    scanned_bytes: u64,
    /// Reached objects that could not be read.
    nr_unreadable: usize,
}

impl Scan<'_> {
    fn find(&self, addr: u64) -> Option<usize> {
        if addr < self.lo || addr >= self.hi {
            return None;
        }
        let index = self
            .table
            .partition_point(|entry| entry.start <= addr)
            .checked_sub(1)?;
        let entry = &self.table[index];
        (addr < entry.start + entry.size.max(1)).then_some(index)
    }

    fn reach(&mut self, word: u64) {
        if let Some(index) = self.find(word)
            && self.table[index].state == UNREACHED
        {
            self.table[index].state = REACHED;
            self.stack.push(index);
        }
    }

    fn scan_bytes(&mut self, bytes: &[u8]) {
        for word in bytes.chunks_exact(8) {
            self.reach(u64::from_le_bytes(word.try_into().unwrap_or_default()));
        }
    }

    /// Scan the words of `start..end` (aligned up), as far as the image
    /// holds them: a page it lacks is skipped. Returns the bytes read.
    fn scan_range(&mut self, start: u64, end: u64) -> u64 {
        let mut at = start.next_multiple_of(8);
        let mut read = 0;
        let mut buf = vec![0u8; CHUNK];
        while at + 8 <= end {
            // To the next chunk boundary, so a missing page loses a chunk
            // at most.
            let len = ((end - at) & !7).min(CHUNK as u64 - at % CHUNK as u64) as usize;
            if self.mem.read(at, &mut buf[..len]).is_ok() {
                self.scan_bytes(&buf[..len]);
                read += len as u64;
            } else {
                // Page by page: keep what the image has.
                let mut page = at;
                while page < at + len as u64 {
                    let next = ((page >> 12) + 1) << 12;
                    let part = (next.min(at + len as u64) - page) as usize;
                    let mut bytes = vec![0u8; part];
                    if self.mem.read(page, &mut bytes).is_ok() {
                        self.scan_bytes(&bytes);
                        read += part as u64;
                    }
                    page = next;
                }
            }
            at += len as u64;
        }
        self.scanned_bytes += end.saturating_sub(start);
        self.propagate();
        read
    }

    fn propagate(&mut self) {
        let mut buf = Vec::new();
        while let Some(index) = self.stack.pop() {
            let Entry { start, size, .. } = self.table[index];
            let from = start.next_multiple_of(8);
            let len = (start + size).saturating_sub(from) & !7;
            buf.resize(len as usize, 0);
            if self.mem.read(from, &mut buf).is_ok() {
                let bytes = std::mem::take(&mut buf);
                self.scan_bytes(&bytes);
                buf = bytes;
            } else {
                self.nr_unreadable += 1;
            }
            self.scanned_bytes += size;
        }
    }
}

/// A site as the shell writes it.
struct Site(Option<TagRead>);

impl fmt::Display for Site {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Some(tag) if !tag.untagged => write!(f, "{}:{} {}", tag.file, tag.line, tag.function),
            _ => f.write_str("?"),
        }
    }
}

/// The roots the kernel described, read (bounded).
#[derive(Debug, Default)]
struct Roots {
    ranges: Vec<(u64, u64)>,
    holes: Vec<(u64, u64)>,
    /// Each stack: bottom, top, floor (0: none).
    stacks: Vec<(u64, u64, u64)>,
}

fn read_roots(heap: &Heap<'_>) -> Result<Roots, String> {
    let mem = heap.memory();
    let base = heap
        .header
        .addr
        .wrapping_add(std::mem::offset_of!(SlabDescriptor, roots) as u64);
    let word = |offset: usize| {
        mem.read_uint(base.wrapping_add(offset as u64), 8)
            .map_err(|e| format!("the descriptor's roots: {e}"))
    };
    let pairs = |nr_at: usize, at: usize| -> Result<Vec<(u64, u64)>, String> {
        let nr = word(nr_at)?;
        if nr > MAX_ROOT_RANGES as u64 {
            return Err(format!("the descriptor's roots count {nr} ranges: corrupt"));
        }
        (0..nr as usize)
            .map(|index| Ok((word(at + index * 16)?, word(at + index * 16 + 8)?)))
            .collect()
    };
    let mut roots = Roots {
        ranges: pairs(
            std::mem::offset_of!(LeakRoots, nr_ranges),
            std::mem::offset_of!(LeakRoots, ranges),
        )?,
        holes: pairs(
            std::mem::offset_of!(LeakRoots, nr_holes),
            std::mem::offset_of!(LeakRoots, holes),
        )?,
        stacks: Vec::new(),
    };
    let nr_stacks = word(std::mem::offset_of!(LeakRoots, nr_stacks))?;
    if nr_stacks > MAX_STACK_TABLES as u64 {
        return Err(format!(
            "the descriptor's roots count {nr_stacks} stack tables: corrupt"
        ));
    }
    for table in 0..nr_stacks as usize {
        let slot = std::mem::offset_of!(LeakRoots, stacks) + table * size_of::<StackSlot>();
        let tops = word(slot + std::mem::offset_of!(StackSlot, tops))?;
        let nr = word(slot + std::mem::offset_of!(StackSlot, nr))?;
        let size = word(slot + std::mem::offset_of!(StackSlot, size))?;
        let floors = word(slot + std::mem::offset_of!(StackSlot, floors))?;
        if nr > 4096 || size > MAX_SCAN {
            return Err(format!(
                "stack table {table}: {nr} stacks of {size} bytes: corrupt"
            ));
        }
        for index in 0..nr {
            let top = mem
                .read_uint(tops.wrapping_add(index * 8), 8)
                .map_err(|e| format!("stack table {table}: {e}"))?;
            if top == 0 {
                continue;
            }
            let floor = if floors == 0 {
                0
            } else {
                mem.read_uint(floors.wrapping_add(index * 8), 8)
                    .map_err(|e| format!("stack table {table}: {e}"))?
            };
            roots.stacks.push((top.wrapping_sub(size), top, floor));
        }
    }
    Ok(roots)
}

/// The allocated objects of the image, with the rounds resting in
/// magazines marked.
fn objects(heap: &Heap<'_>, caches: &[Cache], problems: &mut Vec<Problem>) -> Vec<Entry> {
    let layout = &heap.layout;
    let mem = heap.memory();
    let mut table = Vec::new();
    for cache in caches.iter().filter(|cache| !cache.bootstrap) {
        let size = cache.stats.obj_size as u64;
        let mut push = |start: u64, token: u32| {
            table.push(Entry {
                start,
                size,
                cache: cache.addr,
                token,
                state: UNREACHED,
            });
        };
        match cache.stats.kind {
            SlabKind::Small => {
                for slab in &cache.slabs {
                    let mut map = vec![0u8; layout.slab_free_map.size as usize];
                    if let Err(e) = mem.read(
                        slab.addr.wrapping_add(layout.slab_free_map.offset),
                        &mut map,
                    ) {
                        problems.push(Problem {
                            cache: cache.name.clone(),
                            what: format!("slab {:#x}: its free map: {e}", slab.addr),
                        });
                        continue;
                    }
                    let nr_objs = slab.nr_objs.min(map.len() as u64 * 8);
                    let mut tags = vec![0u8; nr_objs as usize * 4];
                    if layout.slab_tags.size != 0 {
                        let read = heap
                            .field(slab.addr, layout.slab_tags)
                            .and_then(|array| mem.read(array, &mut tags));
                        if read.is_err() {
                            tags.fill(0);
                        }
                    }
                    for index in 0..nr_objs as usize {
                        if map[index / 8] & (1 << (index % 8)) != 0 {
                            continue;
                        }
                        let token = u32::from_le_bytes(
                            tags[index * 4..index * 4 + 4]
                                .try_into()
                                .unwrap_or_default(),
                        );
                        push(slab.base.wrapping_add(index as u64 * cache.stride), token);
                    }
                }
            }
            SlabKind::Bufctl => {
                if let Err(what) = bufctl_objects(heap, cache, &mut push) {
                    problems.push(Problem {
                        cache: cache.name.clone(),
                        what: format!("its bufctl hash: {what}"),
                    });
                }
            }
        }
    }
    if let Err(what) = large_objects(heap, &mut table) {
        problems.push(problem(format!("the page map: {what}")));
    }
    if let Err(what) = kfence_objects(heap, &mut table) {
        problems.push(problem(format!("the KFENCE pool: {what}")));
    }
    table.sort_unstable_by_key(|entry| entry.start);
    table.dedup_by_key(|entry| entry.start);
    // Rounds in magazines and the depot are free.
    let rounds: HashSet<u64> = caches
        .iter()
        .filter(|cache| !cache.bootstrap)
        .flat_map(|cache| cache.rounds.iter().copied())
        .collect();
    for entry in &mut table {
        if rounds.contains(&entry.start) {
            entry.state = RESTING;
        }
    }
    table
}

/// The busy buffers of a bufctl cache: every bufctl in its hash.
fn bufctl_objects(
    heap: &Heap<'_>,
    cache: &Cache,
    push: &mut dyn FnMut(u64, u32),
) -> Result<(), String> {
    let layout = &heap.layout;
    let mem = heap.memory();
    let lists = cache
        .addr
        .wrapping_add(layout.cache_slab_lock.offset)
        .wrapping_add(heap.header.slab_lock_data);
    let hash = lists.wrapping_add(layout.slab_lists_hash.offset);
    let field = |base: u64, entry| heap.field(base, entry).map_err(|e| e.to_string());
    let table = field(hash, layout.hash_table)?;
    let nr_buckets = field(hash, layout.hash_nr_buckets)?;
    let buckets = if table == 0 {
        if nr_buckets * 8 > layout.hash_inline.size {
            return Err(format!("{nr_buckets} inline buckets: corrupt"));
        }
        hash.wrapping_add(layout.hash_inline.offset)
    } else {
        table
    };
    if nr_buckets > 1 << 24 {
        return Err(format!("{nr_buckets} buckets: corrupt"));
    }
    let mut heads = vec![0u8; nr_buckets as usize * 8];
    mem.read(buckets, &mut heads).map_err(|e| e.to_string())?;
    let mut seen = HashSet::new();
    for head in heads.chunks_exact(8) {
        let mut bufctl = u64::from_le_bytes(head.try_into().unwrap_or_default());
        while bufctl != 0 {
            if !seen.insert(bufctl) || seen.len() as u64 > 1 << 24 {
                return Err(format!("bufctl {bufctl:#x} is on a chain twice (a loop?)"));
            }
            let addr = field(bufctl, layout.bufctl_addr)?;
            let token = if layout.bufctl_tag.size == 0 {
                0
            } else {
                field(bufctl, layout.bufctl_tag)? as u32
            };
            push(addr, token);
            bufctl = field(bufctl, layout.bufctl_hash_next)?;
        }
    }
    Ok(())
}

/// Page-granular kmallocs: the page map's head entries.
fn large_objects(heap: &Heap<'_>, table: &mut Vec<Entry>) -> Result<(), String> {
    let layout = &heap.layout;
    let field = |entry| heap.allocator_field(entry).map_err(|e| e.to_string());
    let base = field(layout.allocator_page_map_base)?;
    let nr_pages = field(layout.allocator_page_map_nr_pages)?;
    let entries = field(layout.allocator_page_map_entries)?;
    let slot = layout.page_slot_size.offset;
    let page = layout.page_size.offset;
    if nr_pages > 1 << 28 || slot == 0 || slot > 1 << 10 {
        return Err(format!("{nr_pages} pages of {slot}-byte slots: corrupt"));
    }
    let mut bytes = vec![0u8; (nr_pages * slot) as usize];
    heap.memory()
        .read(entries, &mut bytes)
        .map_err(|e| e.to_string())?;
    let entry_at = |index: u64| {
        let at = (index * slot + layout.page_slot_entry.offset) as usize;
        bytes.get(at..at + 8).map_or(0, |word| {
            u64::from_le_bytes(word.try_into().unwrap_or_default())
        })
    };
    let mut index = 0;
    while index < nr_pages {
        let entry = entry_at(index);
        if entry & layout.page_entry_tag_mask.offset == layout.page_entry_large_head.offset {
            let pages = (entry >> 3) & layout.page_entry_pages_mask.offset;
            table.push(Entry {
                start: base.wrapping_add(index * page),
                size: pages * page,
                cache: 0,
                token: (entry >> layout.page_entry_token_shift.offset) as u32,
                state: UNREACHED,
            });
            index += pages.max(1);
        } else {
            index += 1;
        }
    }
    Ok(())
}

/// KFENCE's allocated samples (objects of their caches).
fn kfence_objects(heap: &Heap<'_>, table: &mut Vec<Entry>) -> Result<(), String> {
    let layout = &heap.layout;
    if layout.allocator_kfence.size == 0 {
        return Ok(());
    }
    let base = heap
        .header
        .allocator
        .wrapping_add(layout.allocator_kfence.offset);
    let field = |base: u64, entry| heap.field(base, entry).map_err(|e| e.to_string());
    if field(base, layout.kfence_pool)? == 0 {
        return Ok(());
    }
    let meta = field(base, layout.kfence_meta)?;
    let nr = layout.kfence_num_objects.offset;
    if nr > 1024 {
        return Err(format!("{nr} objects: corrupt"));
    }
    for index in 0..nr {
        let object = meta.wrapping_add(index * layout.kfence_object_size.offset);
        if field(object, layout.kfence_object_state)? != layout.kfence_state_allocated.offset {
            continue;
        }
        table.push(Entry {
            start: field(object, layout.kfence_object_addr)?,
            size: field(object, layout.kfence_object_obj_size)?,
            cache: field(object, layout.kfence_object_cache_ptr)?,
            token: field(object, layout.kfence_object_tag)? as u32,
            state: UNREACHED,
        });
    }
    Ok(())
}

/// Scan the image for leaks and write the shell's `kmem findleaks`
/// report to `out`: `cpus` are the image's CPUs (their registers are
/// roots, their stack pointers start the stacks' live parts), `tags` the
/// code tags' descriptor if one was found.
///
/// # Errors
///
/// The kernel described no roots, or they cannot be read.
pub fn write_findleaks(
    heap: &Heap<'_>,
    cpus: &[CpuState],
    tags: Option<&CodetagDescriptorRead>,
    symbols: &KernelSymbols,
    out: &mut String,
    problems: &mut Vec<Problem>,
) -> Result<LeakSummary, String> {
    let roots = read_roots(heap)?;
    if roots.ranges.is_empty() && roots.stacks.is_empty() {
        return Err(
            "the kernel described no leak-scan roots (magpie_slab::descriptor::describe_leak_roots)"
                .into(),
        );
    }
    let (caches, broken) = heap.caches();
    problems.extend(broken);
    let table = objects(heap, &caches, problems);
    let lo = table.first().map_or(0, |entry| entry.start);
    let hi = table
        .iter()
        .map(|entry| entry.start.saturating_add(entry.size))
        .max()
        .unwrap_or(0);
    let mut scan = Scan {
        mem: heap.memory(),
        table,
        lo,
        hi,
        stack: Vec::new(),
        scanned_bytes: 0,
        nr_unreadable: 0,
    };
    // The static ranges, less the holes.
    let mut holes = roots.holes.clone();
    holes.sort_unstable();
    for &(start, end) in &roots.ranges {
        if end.saturating_sub(start) > MAX_SCAN {
            problems.push(problem(format!(
                "root range {start:#x}..{end:#x} is too large: left out"
            )));
            continue;
        }
        let mut from = start;
        for &(hole_start, hole_end) in &holes {
            let (hole_start, hole_end) = (hole_start.clamp(from, end), hole_end.clamp(from, end));
            if hole_start > from {
                scan.scan_range(from, hole_start);
            }
            from = from.max(hole_end);
        }
        if from < end {
            scan.scan_range(from, end);
        }
    }
    // The stacks: from the kernel's floor, else the stack pointer of the
    // CPU stopped on it, else all of it.
    for &(bottom, top, floor) in &roots.stacks {
        let inside = |sp: u64| (bottom..top).contains(&sp);
        let from = if inside(floor) {
            floor
        } else {
            cpus.iter()
                .map(CpuState::rsp)
                .filter(|&sp| inside(sp))
                .min()
                .unwrap_or(bottom)
        };
        scan.scan_range(from, top);
    }
    // Every CPU's registers.
    for cpu in cpus {
        let bytes: Vec<u8> = cpu
            .gprs
            .iter()
            .chain([cpu.rip].iter())
            .flat_map(|word| word.to_le_bytes())
            .collect();
        scan.scan_bytes(&bytes);
        scan.scanned_bytes += bytes.len() as u64;
        scan.propagate();
    }
    if scan.nr_unreadable != 0 {
        problems.push(problem(format!(
            "{} reached objects could not be read from the image (not scanned)",
            scan.nr_unreadable
        )));
    }
    // The summary, then the groups as `LeakScan::finish` makes them.
    let mut summary = LeakSummary {
        scanned_bytes: scan.scanned_bytes as usize,
        ..LeakSummary::default()
    };
    for entry in &scan.table {
        match entry.state {
            RESTING => summary.nr_resting += 1,
            REACHED => summary.nr_reached += 1,
            _ => {
                summary.nr_leaked += 1;
                summary.leaked_bytes += entry.size as usize;
            }
        }
    }
    summary.nr_objects = summary.nr_reached + summary.nr_leaked;
    let mut leaked: Vec<Entry> = scan
        .table
        .iter()
        .filter(|entry| entry.state == UNREACHED)
        .copied()
        .collect();
    leaked.sort_unstable_by_key(|entry| (entry.cache == 0, entry.cache, entry.token, entry.start));
    let names: std::collections::HashMap<u64, &str> = caches
        .iter()
        .map(|cache| (cache.addr, cache.name.as_str()))
        .collect();
    let site = |token: u32| -> Site {
        let Some(tags) = tags.filter(|_| token != 0) else {
            return Site(None);
        };
        let tag_ref = u64::from(token) / tags.counter_size();
        match tags.tag(heap.memory(), symbols, tag_ref) {
            Ok(tag) => Site(Some(tag)),
            Err(_) => Site(None),
        }
    };
    let mut at = 0;
    while at < leaked.len() {
        let first = leaked[at];
        let same = leaked[at..]
            .iter()
            .take_while(|entry| entry.cache == first.cache && entry.token == first.token)
            .count();
        if at == 0 {
            write_findleaks_header(out).map_err(|e| e.to_string())?;
        }
        let name = if first.cache == 0 {
            "kmalloc-pages".to_string()
        } else {
            names
                .get(&first.cache)
                .map_or_else(|| format!("{:#x}", first.cache), |name| (*name).to_string())
        };
        write_findleaks_group(out, &name, same, first.start as usize, &site(first.token))
            .map_err(|e| e.to_string())?;
        at += same;
    }
    write_findleaks_summary(out, &summary).map_err(|e| e.to_string())?;
    Ok(summary)
}
