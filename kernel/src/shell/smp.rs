//! `cpus` and `stress` (the mechanisms are in `crate::smp` and
//! `crate::stress`).

use alloc::vec::Vec;
use core::fmt::Write;

use super::{Command, Result, Shell, ShellError, no_args, shell_error};
use crate::arch;
use crate::kmem::SLAB;
use crate::smp;
use crate::stress::{
    self, CTOR_OBJ_SIZE, MAX_STRESS_OPS, MAX_STRESS_SIZE, StressConfig, print_report,
};

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

fn parse_u64(text: &str) -> Option<u64> {
    match text.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => text.parse().ok(),
    }
}

/// Parses `stress` arguments into a configuration (CPUs default to all
/// online ones, 10,000 ops per CPU).
fn parse_args<'a>(args: &[&'a str]) -> Result<'a, StressConfig> {
    let online: Vec<usize> = smp::online_cpus().collect();
    let mut config = StressConfig::new(online.clone(), 10_000);
    let mut words = args.iter();
    while let Some(&flag) = words.next() {
        let Some(&value) = words.next() else {
            return Err(ShellError::MissingValue(flag, &STRESS));
        };
        match flag {
            "--cpus" => {
                if value != "all" {
                    let n = parse_u64(value).ok_or(ShellError::NotANumber(value))? as usize;
                    if n == 0 || n > online.len() {
                        return Err(shell_error!(
                            "--cpus {n}: give 1 to {} (CPUs online) or all",
                            online.len()
                        ));
                    }
                    config.cpus = online[..n].to_vec();
                }
            }
            "--ops" => {
                let n = parse_u64(value).ok_or(ShellError::NotANumber(value))?;
                if !(1..=MAX_STRESS_OPS).contains(&n) {
                    return Err(shell_error!("--ops {n}: give 1 to {MAX_STRESS_OPS}"));
                }
                config.nr_ops = n;
            }
            "--sizes" => {
                let not_a_range = || ShellError::NotASizeRange(value);
                let (a, b) = value.split_once('-').unwrap_or((value, value));
                let a = parse_u64(a).ok_or_else(not_a_range)? as usize;
                let b = parse_u64(b).ok_or_else(not_a_range)? as usize;
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
                config.seed = parse_u64(value).ok_or(ShellError::NotANumber(value))?;
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
fn cmd_stress<'a>(_: &mut Shell, args: &[&'a str], out: &mut dyn Write) -> Result<'a> {
    let config = parse_args(args)?;
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
    let report = stress::run(&config).map_err(|error| shell_error!("{error}"))?;
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
        let magazines = SLAB.cpu_stats(cpu);
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
