//! Host tests of the allocation-tag and time-stats applications: tags
//! enumerate from their section, references round-trip, per-CPU counters sum,
//! the on/off/never switch, and the allocinfo and timestats printers.

use std::ptr::NonNull;
use std::string::String;

use magpie_codetag::alloc_tag::{
    AllocTag, AllocTagCounters, AllocTagCounts, AllocTagRef, BootSetting, HumanBytes,
    ProfilingSwitch, SwitchLocked, UNTAGGED, nr_alloc_tags, write_allocinfo_header,
    write_allocinfo_row,
};
use magpie_codetag::time_stats::TimeStats;
use magpie_codetag::{alloc_tag, time_stats};

fn site_a() -> &'static AllocTag {
    alloc_tag!()
}

fn site_b() -> &'static AllocTag {
    alloc_tag!()
}

fn counters(nr_cpus: usize) -> &'static AllocTagCounters {
    let counters: &'static AllocTagCounters = Box::leak(Box::new(AllocTagCounters::new()));
    let len = AllocTagCounters::bytes_needed(nr_cpus);
    let layout = std::alloc::Layout::from_size_align(len, AllocTagCounters::ALIGN).unwrap();
    // SAFETY: non-zero size.
    let memory = NonNull::new(unsafe { std::alloc::alloc(layout) }).unwrap();
    // SAFETY: fresh memory of `len` bytes, leaked for the program's lifetime.
    assert!(unsafe { counters.init(memory, len, nr_cpus) });
    counters
}

#[test]
fn tags_enumerate_from_their_section() {
    let (a, b) = (site_a(), site_b());
    let all = AllocTag::all();
    assert_eq!(all.len(), nr_alloc_tags());
    // site_a, site_b and the untagged bucket (the only tags in this binary).
    assert_eq!(all.len(), 3);
    for tag in [a, b, &UNTAGGED] {
        assert!(all.iter().any(|t| std::ptr::eq(t, tag)));
    }
    assert_eq!(a.tag.function(), "site_a");
    assert_eq!(b.tag.function(), "site_b");
    assert!(a.tag.file.ends_with("tests/alloc_tags.rs"));
    assert!(UNTAGGED.is_untagged() && !a.is_untagged());
}

#[test]
fn tag_refs_round_trip_and_past_the_end_is_no_tag() {
    for (index, tag) in AllocTag::all().iter().enumerate() {
        let tag_ref = tag.tag_ref();
        assert_eq!(tag_ref.get() as usize, index + 1);
        assert!(std::ptr::eq(AllocTag::from_ref(tag_ref).unwrap(), tag));
    }
    let past_end = AllocTagRef::new(nr_alloc_tags() as u32 + 1).unwrap();
    assert!(AllocTag::from_ref(past_end).is_none());
    assert_eq!(
        std::mem::size_of::<Option<AllocTagRef>>(),
        4,
        "a maybe-tag is still 4 bytes per object"
    );
    assert_ne!(site_a().tag_ref(), site_b().tag_ref());
}

#[test]
fn per_cpu_counters_sum_over_cpus() {
    let counters = counters(4);
    let a = site_a().tag_ref();
    let b = site_b().tag_ref();
    for cpu in 0..4 {
        counters.add(cpu, a, 64);
    }
    counters.add(7, b, 100); // out-of-range CPU ids fold into range
    assert_eq!(
        counters.read(a),
        AllocTagCounts {
            bytes: 256,
            calls: 4
        }
    );
    assert_eq!(
        counters.read(b),
        AllocTagCounts {
            bytes: 100,
            calls: 1
        }
    );
    // Freed on other CPUs than allocated: per-CPU values go below zero,
    // the sum is exact.
    counters.sub(3, a, 64);
    counters.sub(3, a, 64);
    counters.sub(2, b, 100);
    assert_eq!(
        counters.read(a),
        AllocTagCounts {
            bytes: 128,
            calls: 2
        }
    );
    assert_eq!(counters.read(b), AllocTagCounts::default());
    // A bad reference: counted nowhere.
    let bad = AllocTagRef::new(10_000).unwrap();
    counters.add(0, bad, 8);
    counters.sub(0, bad, 8);
    assert_eq!(counters.read(UNTAGGED.tag_ref()), AllocTagCounts::default());
}

#[test]
fn local_counters_sum_like_atomic_ones_across_threads() {
    // One thread per CPU id, as a kernel without preemption runs: each
    // writes only its own block with the unlocked add_local/sub_local.
    let counters = counters(4);
    let a = site_a().tag_ref();
    std::thread::scope(|scope| {
        for cpu in 0..4 {
            scope.spawn(move || {
                for _ in 0..10_000 {
                    // SAFETY: this thread is the only writer of `cpu`'s block.
                    unsafe { counters.add_local(cpu, a, 32) };
                }
                // Frees count on the CPU that frees (the kernel's rule), so
                // a CPU's own block may go below zero; only the sum matters.
                for _ in 0..16_000 {
                    // SAFETY: as above.
                    unsafe { counters.sub_local(cpu, a, 32) };
                }
            });
        }
    });
    assert_eq!(
        counters.read(a),
        AllocTagCounts::default(),
        "4 x (10,000 - 16,000) reads 0"
    );
    // SAFETY: the spawned threads have ended; this thread is the only writer.
    unsafe {
        for _ in 0..30_000 {
            counters.add_local(0, a, 32);
        }
    }
    assert_eq!(
        counters.read(a),
        AllocTagCounts {
            bytes: 6_000 * 32,
            calls: 6_000
        },
        "-24,000 + 30,000 live objects: the per-CPU values wrap, the sum is exact"
    );
}

#[test]
fn counts_at_a_cpu_base_match_counts_by_cpu_id() {
    // add_at/sub_at at each CPU's base (what a platform keeps per CPU)
    // land in the same counters as add/sub by CPU id; one thread per CPU.
    let counters = counters(3);
    let a = site_a().tag_ref();
    let b = site_b().tag_ref();
    assert_eq!(counters.cpu_base(3), None, "no block for CPU 3");
    std::thread::scope(|scope| {
        for cpu in 0..3 {
            let base = counters.cpu_base(cpu).unwrap();
            scope.spawn(move || {
                for _ in 0..1_000 {
                    // SAFETY: this thread is CPU `cpu`, the only writer of
                    // its block; `base` is that CPU's.
                    unsafe {
                        counters.add_at(base, a, 48);
                        counters.add_at(base, b, 16);
                    }
                }
                for _ in 0..400 {
                    // SAFETY: as above.
                    unsafe { counters.sub_at(base, a, 48) };
                }
            });
        }
    });
    assert_eq!(
        counters.read(a),
        AllocTagCounts {
            bytes: 3 * 600 * 48,
            calls: 3 * 600
        }
    );
    counters.sub(1, b, 16);
    assert_eq!(
        counters.read(b),
        AllocTagCounts {
            bytes: (3_000 - 1) * 16,
            calls: 3_000 - 1
        },
        "add_at and sub by CPU id are the same counters"
    );
    let base = counters.cpu_base(0).unwrap();
    let before = counters.read(UNTAGGED.tag_ref());
    // SAFETY: this thread is the only writer now.
    unsafe { counters.add_at(base, AllocTagRef::new(10_000).unwrap(), 8) };
    assert_eq!(
        counters.read(UNTAGGED.tag_ref()),
        before,
        "a bad reference counts nothing"
    );
    assert_eq!(AllocTagCounters::new().cpu_base(0), None, "before init");
}

#[test]
fn charge_tokens_are_checked_once_and_uncharge_the_same_counter() {
    // charge_at checks the reference and returns its counter's offset;
    // uncharge_at of that token (on another CPU) undoes it, no check.
    let counters = counters(2);
    let a = site_a().tag_ref();
    let before = counters.read(a);
    let (base0, base1) = (counters.cpu_base(0).unwrap(), counters.cpu_base(1).unwrap());
    // SAFETY: this thread is the only writer of both blocks here.
    let token = unsafe { counters.charge_at(base0, a, 40) }.expect("a valid reference");
    assert_eq!(AllocTagCounters::token_tag_ref(token), Some(a));
    assert_eq!(
        counters.read(a),
        AllocTagCounts {
            bytes: before.bytes + 40,
            calls: before.calls + 1
        }
    );
    // SAFETY: as above; `token` came from charge_at of these counters.
    unsafe { counters.uncharge_at(base1, token, 40) };
    assert_eq!(counters.read(a), before);
    // A token kept (a platform's current tag) charges the same counter.
    assert_eq!(counters.token(a), Some(token));
    // SAFETY: as above.
    unsafe { counters.charge_token_at(base1, token, 8) };
    assert_eq!(counters.read(a).calls, before.calls + 1);
    // SAFETY: as above.
    unsafe { counters.uncharge_at(base0, token, 8) };
    assert_eq!(counters.read(a), before);
    assert_eq!(counters.token(AllocTagRef::new(10_000).unwrap()), None);
    let untagged = counters.read(UNTAGGED.tag_ref());
    // SAFETY: as above.
    let bad = unsafe { counters.charge_at(base0, AllocTagRef::new(10_000).unwrap(), 8) };
    assert_eq!(bad, None, "a bad reference gets no token");
    assert_eq!(
        counters.read(UNTAGGED.tag_ref()),
        untagged,
        "and counts nothing"
    );
    // Before init there is no valid reference at all.
    let empty = AllocTagCounters::new();
    // SAFETY: nothing is written for a refused reference.
    assert_eq!(unsafe { empty.charge_at(base0, a, 8) }, None);
}

#[test]
fn counters_without_memory_count_nothing_and_init_once() {
    let counters = AllocTagCounters::new();
    assert!(!counters.is_ready());
    counters.add(0, site_a().tag_ref(), 64);
    assert_eq!(counters.read(site_a().tag_ref()), AllocTagCounts::default());
    let ready = self::counters(1);
    let mut spare = vec![0u64; 1024];
    let memory = NonNull::new(spare.as_mut_ptr().cast::<u8>()).unwrap();
    // SAFETY: refused before it touches the memory (already initialised).
    assert!(!unsafe { ready.init(memory, 8192, 1) });
}

#[test]
fn a_transiently_negative_sum_reads_zero() {
    let counters = counters(2);
    let a = site_a().tag_ref();
    counters.sub(1, a, 64); // the free seen before its allocation
    assert_eq!(counters.read(a), AllocTagCounts::default());
    counters.add(0, a, 64);
    assert_eq!(counters.read(a), AllocTagCounts::default());
}

#[test]
fn switch_on_off_never() {
    let switch = ProfilingSwitch::new(true);
    assert!(switch.is_on() && !switch.is_inaccurate());
    switch.disable().unwrap();
    assert!(!switch.is_on());
    switch.enable().unwrap();
    assert!(
        switch.is_on() && switch.is_inaccurate(),
        "off -> on marks counts inaccurate"
    );

    let never = ProfilingSwitch::new(false);
    never.set_at_boot(BootSetting::parse("never").unwrap());
    assert!(never.is_never() && !never.is_on());
    assert_eq!(never.enable(), Err(SwitchLocked));
    assert_eq!(never.disable(), Err(SwitchLocked));
    assert!(!never.is_on());

    let off = ProfilingSwitch::new(true);
    off.set_at_boot(BootSetting::Off);
    assert!(!off.is_on() && !off.is_inaccurate());
    assert_eq!(BootSetting::parse("1"), Some(BootSetting::On));
    assert_eq!(BootSetting::parse("0"), Some(BootSetting::Off));
    assert_eq!(BootSetting::parse("2"), None);
}

#[test]
fn allocinfo_rows_have_the_linux_layout() {
    let mut out = String::new();
    write_allocinfo_header(&mut out).unwrap();
    write_allocinfo_row(
        &mut out,
        site_a(),
        AllocTagCounts {
            bytes: 640,
            calls: 10,
        },
        false,
        false,
    )
    .unwrap();
    write_allocinfo_row(
        &mut out,
        &UNTAGGED,
        AllocTagCounts {
            bytes: 3 << 20,
            calls: 2,
        },
        true,
        true,
    )
    .unwrap();
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "allocinfo - version: 1.0");
    assert_eq!(lines[1], "#     <size>  <calls> <tag info>");
    let expected = format!(
        "         640       10 {}:{} func:site_a",
        site_a().tag.file,
        site_a().tag.line
    );
    assert_eq!(lines[2], expected);
    assert_eq!(
        lines[3],
        "        3.0M        2 untagged:0 func:untagged accurate:no"
    );
    assert_eq!(format!("{}", HumanBytes(1536)), "1.5K");
    assert_eq!(format!("{}", HumanBytes(1000)), "1000");
}

fn timed_site() -> &'static TimeStats {
    time_stats!()
}

#[test]
fn time_stats_count_average_max_quantiles() {
    let stats = timed_site();
    assert!(TimeStats::all().iter().any(|s| std::ptr::eq(s, stats)));
    assert_eq!(stats.tag.function(), "timed_site");
    for duration in 1..=100u64 {
        stats.start(1000).end(1000 + duration);
    }
    let snapshot = stats.snapshot();
    assert_eq!(snapshot.count, 100);
    assert_eq!(snapshot.average, 50); // 5050 / 100
    assert_eq!(snapshot.max, 100);
    // Quantiles within 25% below the exact ones (log-linear buckets).
    let exact = [50u64, 75, 90, 99, 100];
    for (got, want) in snapshot.quantiles.iter().zip(exact) {
        assert!(*got <= want && *got * 4 >= want * 3, "{got} vs {want}");
    }
    // Events ended at 1001..1100: the span rate and frequency are read from.
    assert_eq!((snapshot.first_at, snapshot.last_at), (1001, 1100));
    stats.reset();
    assert_eq!(stats.snapshot().count, 0);
}
