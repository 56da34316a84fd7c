//! `kmem verify|whatis|errors|findleaks|cache|kfence`: slab debugging at the shell
//! (after illumos mdb's `::kmem_verify`, `::whatis`, the `kmem_error` log
//! and `::findleaks`), and Linux `/sys/kernel/slab/<cache>/` verbs (`kmem cache`).
//! The mechanisms are in `magpie-slab` (`verify`, `whatis`, the error
//! ring); reports found by `verify` are printed as they are made (the
//! report hook, `crate::debug::slab_debug`).

use core::fmt::Write;

use magpie_slab::kfence::KfenceState;
use magpie_slab::reports::{ERROR_RING_SIZE, ErrorKind, ErrorReport};

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
            "kmem cache CACHE [validate|shrink|debug [FLAGS|off]]",
            "one cache: geometry, magazines, depot contention; check it, reap it, its debug flags",
        ),
        (
            "kmem findleaks",
            "objects nothing points to (illumos ::findleaks), by cache and allocation site",
        ),
        (
            "kmem kfence [objects]",
            "the sampled guarded pool (Linux KFENCE): interval, objects in use, bugs found; \
             objects: each object with its stacks (Linux's kfence/objects)",
        ),
    ],
    context: "shell kmem",
    run: cmd_kmem,
};

/// The words that may follow `kmem`.
const KMEM_VERBS: &[&str] = &["verify", "whatis", "errors", "cache", "findleaks", "kfence"];

fn cmd_kmem<'a>(_: &mut Shell, args: &[&'a str], out: &mut dyn Write) -> Result<'a> {
    match args {
        ["verify"] => verify(out, "all"),
        ["verify", target] => verify(out, target),
        ["whatis", addr] => whatis(out, addr),
        ["errors"] => errors(out),
        ["cache", name, verb @ ..] => cache_control(out, name, verb),
        ["findleaks"] => crate::debug::findleaks::findleaks(out)
            .map(|_| ())
            .map_err(|error| shell_error!("findleaks: {error}")),
        ["kfence"] => {
            let _ = crate::debug::kfence::write_stats(out);
            Ok(())
        }
        ["kfence", "objects"] => {
            let _ = crate::debug::kfence::write_objects(out);
            Ok(())
        }
        [verb, ..] if !KMEM_VERBS.contains(verb) => Err(ShellError::Unexpected(verb, &KMEM)),
        // A verb with the wrong words after it.
        [_, _, extra, ..] | [_, extra] => Err(ShellError::Unexpected(extra, &KMEM)),
        _ => Err(ShellError::Usage(&KMEM)),
    }
}

/// `kmem cache CACHE [validate|shrink|debug [FLAGS|off]]`: Linux's
/// `/sys/kernel/slab/<cache>/` at the shell. No verb shows the cache
/// (`slab_size`, `objs_per_slab`, `order` and the magazine layer's
/// `cpu_partial` counterpart: magazine size, depot magazines and
/// contention); `validate` checks every slab (`validate`), `shrink` gives
/// its free memory back (`shrink`); `debug` shows the debug flags as
/// `slab_debug=` letters.
fn cache_control<'a>(out: &mut dyn Write, name: &'a str, verb: &[&'a str]) -> Result<'a> {
    let cache = SLAB
        .find_cache(name)
        .ok_or(ShellError::UnknownCache(name))?;
    match verb {
        [] => {
            let stats = cache.stats();
            let _ = writeln!(
                out,
                "{}: {}-byte objects (stride {}, align {}), {:?} slabs of {} page(s), {} objects each",
                cache.name(),
                stats.obj_size,
                cache.stride(),
                stats.align,
                stats.kind,
                stats.nr_pages_per_slab,
                stats.objs_per_slab
            );
            let _ = writeln!(
                out,
                "slabs {} ({} active), objects {} allocated, {} in CPU magazines, {} in the depot",
                stats.nr_slabs,
                stats.nr_active_slabs,
                stats.nr_allocated,
                stats.nr_cpu_cached_objs,
                stats.nr_depot_objs
            );
            if stats.magsize == 0 {
                let _ = writeln!(
                    out,
                    "magazines: none (a bootstrap cache: straight from its slabs)"
                );
            } else {
                let _ = writeln!(
                    out,
                    "magazines: {} rounds each; depot {} full, {} empty; depot lock contended {} times",
                    stats.magsize,
                    stats.depot_nr_full,
                    stats.depot_nr_empty,
                    stats.depot_contention
                );
            }
            let _ = writeln!(
                out,
                "allocs {}, frees {}; debug flags {}",
                stats.nr_allocs_ever,
                stats.nr_frees_ever,
                cache.debug_flags().letters()
            );
            if stats.magsize != 0 {
                // After the line readers expect below the magazines line.
                let _ = writeln!(
                    out,
                    "magazine resizes: {} (the size grows when the depot lock is contended or hands magazines between CPUs)",
                    stats.nr_magazine_resizes
                );
            }
        }
        ["validate"] => return verify(out, name),
        ["shrink"] => {
            let nr_pages = cache.reap();
            let _ = writeln!(
                out,
                "shrink {}: {nr_pages} pages ({} KiB) returned",
                cache.name(),
                nr_pages * magpie_slab::PAGE_SIZE / 1024
            );
        }
        ["debug"] => {
            let _ = writeln!(
                out,
                "{}: debug flags {}",
                cache.name(),
                cache.debug_flags().letters()
            );
        }
        ["debug", _flags] => {
            // A cache's object layout (stride, trailer) is fixed when it is
            // created, and every object of a live slab carries it: the
            // flags cannot change under them. Linux made the same call:
            // its red_zone, poison, store_user and sanity_checks files
            // are read-only since 5.9 ("mm, slub: make remaining
            // slub_debug related attributes read-only").
            return Err(shell_error!(
                "{}: debug flags are fixed at creation; boot with slab_debug=FLAGS,{}",
                cache.name(),
                cache.name()
            ));
        }
        [action, ..] if !matches!(*action, "validate" | "shrink" | "debug") => {
            return Err(shell_error!(
                "unknown action '{action}' for kmem cache; expected validate, shrink or debug \
                 (or none: show the cache)"
            ));
        }
        [_, .., extra] => return Err(ShellError::Unexpected(extra, &KMEM)),
        [_] => return Err(ShellError::Usage(&KMEM)),
    }
    Ok(())
}

fn verify<'a>(out: &mut dyn Write, target: &'a str) -> Result<'a> {
    let summary = if target == "all" {
        SLAB.debug().verify()
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

/// `kmem whatis ADDR`: a KFENCE sample (the guarded pool is in no slab),
/// kernel text (a return address from a backtrace), or the slab layer's
/// answer (illumos `::whatis`).
fn whatis<'a>(out: &mut dyn Write, addr: &'a str) -> Result<'a> {
    let address = parse_number(addr)?;
    if let Some(object) = SLAB.kfence().object(address) {
        let state = match object.state {
            KfenceState::Allocated => "allocated",
            KfenceState::Freed => "freed",
            KfenceState::Unused => "never used",
        };
        let _ = write!(out, "{address:#x} is in the KFENCE pool: ");
        if object.state == KfenceState::Unused {
            let _ = writeln!(out, "sample slot kfence-#{} ({state})", object.index);
        } else if (object.addr..object.addr + object.size).contains(&address) {
            let _ = writeln!(
                out,
                "{state} sample kfence-#{}, object {:#x}+{:#x} of {} bytes from {}",
                object.index,
                object.addr,
                address - object.addr,
                object.size,
                object.cache.as_str()
            );
        } else {
            let _ = writeln!(
                out,
                "guard of {state} sample kfence-#{} (object {:#x}, {} bytes from {}): \
                 an access here is out of bounds",
                object.index,
                object.addr,
                object.size,
                object.cache.as_str()
            );
        }
        return Ok(());
    }
    if let Some((name, offset)) = crate::debug::symbols::lookup(address) {
        let _ = writeln!(
            out,
            "{address:#x} is kernel text: {}+{offset:#x}",
            crate::debug::symbols::demangled(name)
        );
        return Ok(());
    }
    let _ = magpie_slab::reports::whatis(out, &SLAB, address, &KernelFormat);
    Ok(())
}

fn errors<'a>(out: &mut dyn Write) -> Result<'a> {
    let nr = SLAB.debug().nr_errors();
    let mut reports = [ErrorReport::new(ErrorKind::InvalidFree, "", 0); ERROR_RING_SIZE];
    let kept = SLAB.debug().read_errors(0, &mut reports);
    let _ = magpie_slab::reports::write_errors(out, nr, &reports[..kept], &KernelFormat);
    Ok(())
}
