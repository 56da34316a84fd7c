//! `cpus` and `stress` (the mechanisms are in `crate::smp` and
//! `crate::smp::stress`).

use alloc::vec::Vec;
use core::fmt::Write;

use super::{Command, Result, Shell, ShellError, no_args, out_of_memory, parse_u64, shell_error};
use crate::arch;
use crate::kmem::SLAB;
use crate::mm::frame;
use crate::smp::stress::{
    self, CTOR_OBJ_SIZE, MAX_STRESS_OPS, MAX_STRESS_SIZE, StressConfig, print_report,
};
use crate::smp::{self, SmpError};

pub(super) const CPUS: Command = Command {
    name: "cpus",
    help: &[("cpus", "CPUs: id, APIC id, state, magazine allocs/frees")],
    context: "shell",
    run: cmd_cpus,
};

pub(super) const STRESS: Command = Command {
    name: "stress",
    help: &[(
        "stress [--cpus N|all] [--ops N] [--sizes A-B] [--seed S]",
        "random alloc/free mix on several CPUs at once",
    )],
    context: "shell",
    run: cmd_stress,
};

/// Bytes of bookkeeping a stress run needs per CPU besides its objects
/// (inbox, live list, report, work item), with room to spare.
const BOOKKEEPING_PER_CPU: usize = 64 << 10;

/// The online CPUs, the first `n` of them (all for `None`), in a fallibly
/// allocated list.
fn online_cpus<'a>(n: Option<usize>) -> Result<'a, Vec<usize>> {
    let nr_online = smp::nr_online();
    let n = n.unwrap_or(nr_online);
    if n == 0 || n > nr_online {
        return Err(shell_error!(
            "--cpus {n}: give 1 to {nr_online} (CPUs online) or all"
        ));
    }
    let mut cpus = Vec::new();
    crate::try_alloc!(cpus.try_reserve_exact(n))
        .map_err(|_| out_of_memory!("a list of {n} CPUs"))?;
    cpus.extend(smp::online_cpus().take(n));
    Ok(cpus)
}

/// Parses `stress` arguments into a configuration (CPUs default to all
/// online ones, 10,000 ops per CPU).
fn parse_args<'a>(args: &[&'a str]) -> Result<'a, StressConfig> {
    let mut config = StressConfig::new(online_cpus(None)?, 10_000);
    let mut words = args.iter();
    while let Some(&flag) = words.next() {
        let Some(&value) = words.next() else {
            return Err(ShellError::MissingValue(flag, &STRESS));
        };
        match flag {
            "--cpus" => {
                if value != "all" {
                    let n = usize::try_from(parse_u64(value)?).unwrap_or(usize::MAX);
                    config.cpus = online_cpus(Some(n))?;
                }
            }
            "--ops" => {
                let n = parse_u64(value)?;
                if !(1..=MAX_STRESS_OPS).contains(&n) {
                    return Err(shell_error!("--ops {n}: give 1 to {MAX_STRESS_OPS}"));
                }
                config.nr_ops = n;
            }
            "--sizes" => {
                let not_a_range = |_| ShellError::NotASizeRange(value);
                let (a, b) = value.split_once('-').unwrap_or((value, value));
                let a = parse_u64(a).map_err(not_a_range)? as usize;
                let b = parse_u64(b).map_err(not_a_range)? as usize;
                if a == 0 || a > b || b > MAX_STRESS_SIZE {
                    return Err(shell_error!(
                        "--sizes {value}: give 1 <= A <= B <= {MAX_STRESS_SIZE}"
                    ));
                }
                config.min_size = a;
                config.max_size = b;
                // Keep each CPU's live set to about 4 MiB.
                config.max_live = ((4 << 20) / b.div_ceil(2).max(a)).clamp(16, 512);
            }
            "--seed" => {
                config.seed = parse_u64(value)?;
            }
            _ => {
                return Err(ShellError::UnknownOption(flag, &STRESS));
            }
        }
    }
    Ok(config)
}

/// `stress [--cpus N|all] [--ops N] [--sizes A-B] [--seed S]`: runs the mix
/// and prints one line per CPU, then the totals.
///
/// The command first makes sure the memory is there: each CPU's live set
/// at its largest, plus bookkeeping, must be free (after a reap if need
/// be), else it stops with `out of memory`. The run's bookkeeping
/// (inboxes, live lists, work items) is then allocated fallibly, all of it
/// before any CPU starts (fault points in `stress::run` and
/// `smp::run_on_cpus`): a failure is one `out of memory` line and nothing
/// ran.
fn cmd_stress<'a>(_: &mut Shell, args: &[&'a str], out: &mut dyn Write) -> Result<'a> {
    let config = parse_args(args)?;
    let nr_cpus = config.cpus.len();
    let need = nr_cpus * (config.max_live * config.max_size + BOOKKEEPING_PER_CPU);
    let free_bytes = || frame::stats().nr_free * frame::PAGE_SIZE;
    if free_bytes() < need {
        SLAB.reap_all();
    }
    if free_bytes() < need {
        return Err(out_of_memory!(
            "stress needs {} KiB free for {nr_cpus} CPU(s), {} KiB are",
            need >> 10,
            free_bytes() >> 10
        ));
    }
    stress::ctor_cache().map_err(|error| match error {
        magpie_slab::AllocError::OutOfMemory => out_of_memory!("for the stress-ctor cache"),
        other => shell_error!("cannot create the stress-ctor cache: {other}"),
    })?;
    let _ = writeln!(
        out,
        "stress: {} CPU(s), {} ops each, sizes {}-{} (+{} B ctor objects), seed {}, {}% of frees cross CPUs",
        config.cpus.len(),
        config.nr_ops,
        config.min_size,
        config.max_size,
        CTOR_OBJ_SIZE,
        config.seed,
        if config.cpus.len() > 1 {
            config.cross_free_percent
        } else {
            0
        }
    );
    let report = stress::run(&config).map_err(|error| match error {
        SmpError::OutOfMemory(what) => out_of_memory!("{what}"),
        other => shell_error!("{other}"),
    })?;
    print_report(&report, out);
    Ok(())
}

/// `cpus`: one line per CPU the platform reports: id, APIC id, state, work
/// items run, and the allocations and frees that CPU's magazines served,
/// summed over every cache (`SLAB.cpu_stats`: the per-CPU counters of the
/// magazine layer; misses served by the slab layer and page-granular
/// kmallocs are not counted).
fn cmd_cpus<'a>(_: &mut Shell, args: &[&'a str], out: &mut dyn Write) -> Result<'a> {
    no_args(args, &CPUS)?;
    let _ = writeln!(
        out,
        "{:>4} {:>5}  {:<8} {:>8} {:>12} {:>12}",
        "cpu", "apic", "state", "jobs", "allocs", "frees"
    );
    for cpu in 0..arch::max_cpus() {
        let Some(percpu) = arch::percpu::get(cpu) else {
            break;
        };
        let magazines = SLAB.stats().cpu(cpu);
        let _ = writeln!(
            out,
            "{:>4} {:>5}  {:<8} {:>8} {:>12} {:>12}",
            cpu,
            percpu.apic_id(),
            percpu.state().name(),
            percpu.nr_jobs(),
            magazines.nr_allocs,
            magazines.nr_frees
        );
    }
    let _ = writeln!(
        out,
        "{} of {} CPUs online; allocs/frees: served by that CPU's magazines, all caches",
        smp::nr_online(),
        arch::max_cpus()
    );
    Ok(())
}
