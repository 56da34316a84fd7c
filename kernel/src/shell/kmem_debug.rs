//! `kmem verify|whatis|errors|findleaks`: slab debugging at the shell
//! (after illumos mdb's `::kmem_verify`, `::whatis`, the `kmem_error` log
//! and `::findleaks`).
//! The mechanisms are in `magpie-slab` (`verify`, `whatis`, the error
//! ring); reports found by `verify` are printed as they are made (the
//! report hook, `crate::debug::slab_debug`).

use core::fmt::Write;

use magpie_slab::report::{ERROR_RING_SIZE, ErrorKind, ErrorReport};

use super::{Command, Result, Shell, ShellError, parse_number, shell_error};
use crate::debug::slab_debug::KernelFormat;
use crate::kmem::SLAB;

pub(super) const KMEM: Command = Command {
    name: "kmem",
    help: &[
        (
            "kmem verify [CACHE|all]",
            "check every slab: free lists, poison, redzones; print problems and a count",
        ),
        (
            "kmem whatis ADDR",
            "which cache, object and offset ADDR is, allocated or free, last transactions",
        ),
        (
            "kmem errors",
            "the allocator's error reports kept since boot",
        ),
        (
            "kmem findleaks",
            "objects nothing points to (illumos ::findleaks), by cache and allocation site",
        ),
    ],
    context: "shell kmem",
    run: cmd_kmem,
};

fn cmd_kmem<'a>(_: &mut Shell, args: &[&'a str], out: &mut dyn Write) -> Result<'a> {
    match args {
        ["verify"] => verify(out, "all"),
        ["verify", target] => verify(out, target),
        ["whatis", addr] => whatis(out, addr),
        ["errors"] => errors(out),
        ["findleaks"] => crate::debug::findleaks::findleaks(out)
            .map(|_| ())
            .map_err(|error| shell_error!("findleaks: {error}")),
        _ => Err(ShellError::Usage(&KMEM)),
    }
}

fn verify<'a>(out: &mut dyn Write, target: &'a str) -> Result<'a> {
    let summary = if target == "all" {
        SLAB.verify()
    } else {
        SLAB.find_cache(target)
            .ok_or(ShellError::UnknownCache(target))?
            .verify()
    };
    let _ = writeln!(
        out,
        "verified {} cache(s), {} slab(s), {} object(s): {} problem(s)",
        summary.nr_caches, summary.nr_slabs, summary.nr_objects, summary.nr_problems
    );
    Ok(())
}

fn whatis<'a>(out: &mut dyn Write, addr: &'a str) -> Result<'a> {
    let address = parse_number(addr)?;
    match SLAB.whatis(address) {
        Some(info) => {
            let _ = write!(out, "{}", info.display(&KernelFormat));
        }
        None => {
            let _ = writeln!(out, "{address:#x} is not in any slab");
        }
    }
    Ok(())
}

fn errors<'a>(out: &mut dyn Write) -> Result<'a> {
    let nr = SLAB.nr_errors();
    if nr == 0 {
        let _ = writeln!(out, "no errors reported");
        return Ok(());
    }
    let mut reports = [ErrorReport::new(ErrorKind::InvalidFree, "", 0); ERROR_RING_SIZE];
    let kept = SLAB.read_errors(0, &mut reports);
    let _ = writeln!(out, "{nr} error(s) reported since boot; the last {kept}:");
    for report in &reports[..kept] {
        let _ = writeln!(out, "--- error #{} ({})", report.seq, report.kind.name());
        let _ = write!(out, "{}", report.display(&KernelFormat));
    }
    Ok(())
}
