//! `magpie-bench memory <allocator> <heap|burst>`: the memory workloads,
//! the same objects and the same writes for every allocator, measured as
//! the process's resident anonymous memory (`RssAnon`) so that every
//! allocator is judged by the same figure whatever its memory comes from
//! (a region, brk, mmap, a page source). Transparent huge pages are off
//! for the process, so a touched page is 4 KiB for everyone.
//!
//! - `heap`: 100,000 live objects of 8..=512 B (uniform, xorshift64 seed
//!   0x5eed), each written in full. Heap efficiency = bytes requested /
//!   growth of `RssAnon` from just before the first allocation (after the
//!   allocator's own init) to just after the last.
//! - `burst`: 1,000,000 such objects, each written in full; then 90 % are
//!   freed (every object whose index hashes to a non-zero residue mod 10,
//!   in reverse allocation order), so the 10 % survivors are scattered
//!   through the heap; then the allocator's own give-back call, if it has
//!   one ([`BenchAlloc::give_back`]), after what it does on its own
//!   while idle ([`BenchAlloc::idle`]: magpie's working-set interval). Resident is reported at the peak,
//!   after the frees and after the give-back, against the survivors' bytes.
//! - `burst-old`: the same, but the older 90 % are freed (the survivors
//!   are the newest 100,000, clustered at the end of the heap).
//!
//! - `half`: the issue-34 heap: 100,000 objects of 8..=8192 B (uniform,
//!   seed 0x5eed), each written in full; a random half freed (by a hash
//!   of the index); 100,000 more allocated (seed 0x5eed2). Reports peak
//!   resident (the larger of `RssAnon` growth after the first fill and at
//!   the end) over the bytes live at the end (requested sizes).
//!
//! Prints `MEM key=value ...` lines.

use crate::allocs::{self, BenchAlloc, MemoryParts, call};
use crate::host::{self, BenchPlatform, ProfPlatform, no_huge_pages, rss_anon};
use crate::workloads::{XorShift, mixed_layout, mixed_size};

/// Live objects of the `heap` workload.
pub const NR_HEAP_OBJS: usize = 100_000;
/// Objects of the `burst` workload.
pub const NR_BURST_OBJS: usize = 1_000_000;

/// Entry point: `memory <allocator> <heap|burst>`.
pub fn main(allocator: &str, what: &str) {
    no_huge_pages();
    if !matches!(what, "heap" | "burst" | "burst-old" | "half") {
        eprintln!("memory: heap, burst, burst-old or half, not {what}");
        std::process::exit(2);
    }
    fn leak<T>(v: T) -> &'static T {
        Box::leak(Box::new(v))
    }
    match allocator {
        "magpie" => measure(leak(allocs::Magpie::<BenchPlatform, false>::new()), what),
        "magpie-prof-off" | "magpie-prof-on" => {
            host::prof_init(allocator.ends_with("on"));
            measure(leak(allocs::Magpie::<ProfPlatform, false>::new()), what)
        }
        "system" => measure(leak(allocs::system()), what),
        "mimalloc" => measure(leak(allocs::mimalloc()), what),
        "linked_list_allocator" => measure(leak(allocs::linked_list()), what),
        "talc" => measure(leak(allocs::talc()), what),
        "buddy_system_allocator" => measure(leak(allocs::buddy()), what),
        "slabmalloc" => measure(leak(allocs::SlabMallocBench::new()), what),
        other => {
            eprintln!("memory: no memory workload for {other}");
            std::process::exit(2);
        }
    }
}

/// An empty vector with room for `capacity` objects whose pages are
/// already resident (written once, then cleared), so that the harness's
/// own bookkeeping is in the baseline and not charged to the allocator.
/// (`vec![(null, 0); n]` would not do: an all-zero element makes it a
/// zeroed allocation, fresh pages left untouched until the run.)
fn resident_vec(capacity: usize) -> Vec<(*mut u8, usize)> {
    let mut objs = Vec::with_capacity(capacity);
    objs.resize(capacity, (std::ptr::null_mut(), 1));
    objs.clear();
    objs
}

/// Allocate `n` objects of the mixed distribution, each written in full.
/// Returns bytes requested.
fn fill<A: BenchAlloc>(a: &A, objs: &mut Vec<(*mut u8, usize)>, n: usize) -> usize {
    let mut rng = XorShift::new(0x5eed);
    let mut requested = 0;
    for i in 0..n {
        let size = mixed_size(rng.next());
        let p = call::alloc(a, mixed_layout(size));
        assert!(!p.is_null(), "out of memory after {i} objects");
        // SAFETY: p has `size` bytes.
        unsafe { p.write_bytes(0xa5, size) };
        requested += size;
        objs.push((p, size));
    }
    requested
}

/// Does object `i` survive the burst's free? (1 in 10, scattered.)
fn survives(i: usize) -> bool {
    mix(i as u64).is_multiple_of(10)
}

/// splitmix64's finaliser: a hash of the index.
fn mix(i: u64) -> u64 {
    let mut x = i.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// Objects per phase of the `half` workload.
pub const NR_HALF_OBJS: usize = 100_000;

/// A size of 8..=8192 B, uniform.
fn size_8k(r: u64) -> usize {
    8 + ((r >> 8) % 8185) as usize
}

/// The `half` workload (module docs).
fn measure_half<A: BenchAlloc>(a: &A) {
    let n = NR_HALF_OBJS;
    let mut objs = resident_vec(n);
    let mut kept = resident_vec(2 * n);
    let base = rss_anon();
    let alloc_phase = |objs: &mut Vec<(*mut u8, usize)>, seed: u64| {
        let mut rng = XorShift::new(seed);
        for i in 0..n {
            let size = size_8k(rng.next());
            let p = call::alloc(a, mixed_layout(size));
            assert!(!p.is_null(), "out of memory after {i} objects");
            // SAFETY: p has `size` bytes.
            unsafe { p.write_bytes(0xa5, size) };
            objs.push((p, size));
        }
    };
    alloc_phase(&mut objs, 0x5eed);
    let after_fill = rss_anon() - base;
    for (i, &(p, size)) in objs.iter().enumerate() {
        if mix(i as u64) & 1 == 0 {
            // SAFETY: allocated above with this layout.
            unsafe { call::free(a, p, mixed_layout(size)) };
        } else {
            kept.push((p, size));
        }
    }
    let nr_freed = n - kept.len();
    alloc_phase(&mut kept, 0x5eed2);
    let peak = after_fill.max(rss_anon() - base);
    let live: usize = kept.iter().map(|&(_, size)| size).sum();
    println!(
        "MEM half objects={} freed={nr_freed} live_objects={} live={live} peak={peak} \
         peak_over_live={:.4} metadata={}",
        2 * n,
        kept.len(),
        peak as f64 / live as f64,
        a.metadata_bytes()
            .map_or("-".to_string(), |m| m.to_string()),
    );
    if let Some(parts) = a.memory_parts() {
        print_parts(&parts, live);
    }
}

/// The `half` workload's breakdown (`MEM half-parts`): each part of the
/// allocator's memory beyond the bytes live, in bytes and in % of live.
/// Rounding is the live objects' class bytes less the bytes requested.
/// The page map is resident before the baseline (init clears it), so it
/// is not in `peak`; nor are the harness's own vectors ([`resident_vec`]).
fn print_parts(parts: &MemoryParts, live: usize) {
    let pct = |bytes: usize| bytes as f64 * 100.0 / live as f64;
    let fields = [
        ("rounding", parts.class_bytes.saturating_sub(live)),
        ("tails", parts.tails),
        ("free_in_slabs", parts.free_in_slabs),
        ("free_in_magazines", parts.free_in_magazines),
        ("page_granular", parts.page_granular),
        ("slab_headers", parts.slab_headers),
        ("bufctls", parts.bufctls),
        ("magazines", parts.magazines),
        ("tag_arrays", parts.tag_arrays),
        ("other_metadata", parts.other_metadata),
        ("page_map", parts.page_map),
    ];
    let mut line = String::from("MEM half-parts");
    for (name, bytes) in fields {
        line += &format!(" {name}={bytes}({:.2}%)", pct(bytes));
    }
    println!("{line}");
}

fn measure<A: BenchAlloc>(a: &A, what: &str) {
    if what == "half" {
        measure_half(a);
        return;
    }
    let n = if what == "heap" {
        NR_HEAP_OBJS
    } else {
        NR_BURST_OBJS
    };
    // The harness's own memory, touched before the baseline.
    let mut objs = resident_vec(n);
    let base = rss_anon();
    let meta_base = a.metadata_bytes();
    let requested = fill(a, &mut objs, n);
    let peak = rss_anon() - base;
    let meta = a.metadata_bytes();
    let meta_field = |m: Option<usize>| m.map_or("-".to_string(), |m| m.to_string());
    if what == "heap" {
        println!(
            "MEM heap objects={n} requested={requested} resident={peak} metadata={} metadata_at_init={}",
            meta_field(meta),
            meta_field(meta_base),
        );
        for &(p, size) in objs.iter().rev() {
            // SAFETY: allocated above with this layout.
            unsafe { call::free(a, p, mixed_layout(size)) };
        }
        return;
    }
    let mut live = 0;
    let mut nr_live = 0;
    for (i, &(p, size)) in objs.iter().enumerate().rev() {
        let survivor = if what == "burst-old" {
            // The older 90 % die, the newest 10 % stay (clustered).
            i >= n / 10 * 9
        } else {
            survives(i)
        };
        if survivor {
            live += size;
            nr_live += 1;
        } else {
            // SAFETY: allocated above with this layout.
            unsafe { call::free(a, p, mixed_layout(size)) };
        }
    }
    let after_free = rss_anon() - base;
    let meta_after_free = a.metadata_bytes();
    let idle = a.idle();
    let after_idle = rss_anon() - base;
    let give_back = a.give_back();
    let after_give_back = rss_anon() - base;
    println!(
        "MEM {what} objects={n} requested={requested} peak={peak} live_objects={nr_live} live={live} \
         after_free={after_free} idle={} after_idle={after_idle} after_give_back={after_give_back} give_back={} \
         metadata_after_free={} metadata={}",
        idle.map_or("-".to_string(), |i| i.replace(' ', "_")),
        give_back.unwrap_or("-"),
        meta_field(meta_after_free),
        meta_field(a.metadata_bytes()),
    );
}
