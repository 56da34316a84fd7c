//! `magpie-kmem replay DUMP`: runs the replay engine of magpie-bench
//! (`magpie-bench replay`, bench/src/replay.rs) on the dump and passes its
//! table (or JSON) and exit status through.
//!
//! The engine lives in magpie-bench because it is a benchmark: it links
//! every peer allocator (mimalloc's C library among them), needs one fresh
//! process per allocator (one magpie allocator per process) and runs
//! under callgrind; this tool stays a reader. The binary is, in order:
//! `$MAGPIE_BENCH`, then `magpie-bench` of the `bench-release`, `release`
//! or this tool's own profile beside this tool's build directory.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

/// The arguments `magpie-kmem replay` forwards.
pub struct ReplayArgs<'a> {
    /// The dump.
    pub file: &'a Path,
    /// JSON instead of the table.
    pub json: bool,
    /// No instruction counts.
    pub no_callgrind: bool,
    /// Allocators to run (comma-separated), default all.
    pub allocators: Option<&'a str>,
    /// Heap (page source, arena) of each allocator in MiB.
    pub heap_mib: Option<usize>,
}

const BUILD_HINT: &str = "build it with `cargo build -p magpie-bench --profile bench-release \
     --target x86_64-unknown-linux-gnu` (or set MAGPIE_BENCH to its path)";

/// The magpie-bench binary to run.
fn bench_binary() -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os("MAGPIE_BENCH") {
        let path = PathBuf::from(path);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(format!(
                "MAGPIE_BENCH={}: no such file; {BUILD_HINT}",
                path.display()
            ))
        };
    }
    let me = std::env::current_exe().map_err(|e| format!("this program's path: {e}"))?;
    let dir = me.parent().ok_or("this program has no directory")?;
    // target/<triple>/<profile>/magpie-kmem → its siblings' profiles.
    let profiles = dir.parent();
    let candidates = [
        profiles.map(|p| p.join("bench-release").join("magpie-bench")),
        profiles.map(|p| p.join("release").join("magpie-bench")),
        Some(dir.join("magpie-bench")),
    ];
    candidates
        .into_iter()
        .flatten()
        .find(|p| p.is_file())
        .ok_or_else(|| {
            format!(
                "magpie-kmem replay runs magpie-bench's replay engine, which is not built \
                 beside {}: {BUILD_HINT}",
                dir.display()
            )
        })
}

/// Run the replay; the exit status is magpie-bench's (0: every allocator
/// checked and without failures, 1: a row failed, 2: bad input).
///
/// # Errors
/// magpie-bench cannot be found or started.
pub fn run(args: &ReplayArgs<'_>) -> Result<ExitCode, String> {
    let bench = bench_binary()?;
    let optimized = bench
        .parent()
        .and_then(Path::file_name)
        .is_some_and(|p| p == "bench-release" || p == "release");
    if !optimized && !args.no_callgrind {
        eprintln!(
            "magpie-kmem: note: {} is not an optimized build: its instruction counts are not \
             those of `make bench`",
            bench.display()
        );
    }
    let mut cmd = Command::new(&bench);
    cmd.arg("replay").arg(args.file);
    if args.json {
        cmd.arg("--json");
    }
    if args.no_callgrind {
        cmd.arg("--no-callgrind");
    }
    if let Some(list) = args.allocators {
        cmd.args(["--allocators", list]);
    }
    if let Some(mib) = args.heap_mib {
        cmd.args(["--heap-mib", &mib.to_string()]);
    }
    let status = cmd
        .status()
        .map_err(|e| format!("{}: {e}", bench.display()))?;
    Ok(match status.code() {
        Some(0) => ExitCode::SUCCESS,
        Some(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        None => ExitCode::FAILURE,
    })
}
