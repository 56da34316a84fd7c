//! `magpie-kmem replay`: a thin subcommand over `magpie-bench replay`
//! (the engine's own tests are bench/tests/replay.rs). These tests put a
//! stand-in for magpie-bench in `MAGPIE_BENCH` and check what reaches it
//! and what comes back.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn scratch(name: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("magpie-kmem-replay-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A stand-in for magpie-bench: writes its arguments, one a line, to
/// `args.txt` beside it, prints a line and exits with `code`.
fn stand_in(dir: &Path, code: i32) -> PathBuf {
    let path = dir.join("magpie-bench");
    let script = format!(
        "#!/bin/sh\nfor a in \"$@\"; do echo \"$a\"; done > '{}'\necho 'REPLAY TABLE'\nexit {code}\n",
        dir.join("args.txt").display()
    );
    std::fs::write(&path, script).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

fn kmem(bench: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_magpie-kmem"))
        .args(args)
        .env("MAGPIE_BENCH", bench)
        .output()
        .unwrap()
}

#[test]
fn replay_forwards_every_option_to_magpie_bench_replay() {
    let dir = scratch("forward");
    let bench = stand_in(&dir, 0);
    let out = kmem(
        &bench,
        &[
            "replay",
            "--json",
            "--no-callgrind",
            "--allocators",
            "magpie,talc",
            "--heap-mib",
            "32",
            "some.kmt",
        ],
    );
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "REPLAY TABLE\n");
    let args = std::fs::read_to_string(dir.join("args.txt")).unwrap();
    assert_eq!(
        args.lines().collect::<Vec<_>>(),
        [
            "replay",
            "some.kmt",
            "--json",
            "--no-callgrind",
            "--allocators",
            "magpie,talc",
            "--heap-mib",
            "32"
        ]
    );
}

#[test]
fn replay_passes_magpie_bench_exit_status_through() {
    let dir = scratch("status");
    for code in [1, 2] {
        let out = kmem(
            &stand_in(&dir, code),
            &["replay", "--no-callgrind", "x.kmt"],
        );
        assert_eq!(out.status.code(), Some(code), "{out:?}");
    }
}

#[test]
fn replay_without_magpie_bench_says_how_to_build_it() {
    let dir = scratch("missing");
    let out = kmem(&dir.join("no-such-bench"), &["replay", "x.kmt"]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("no such file"), "{stderr}");
    assert!(
        stderr.contains("cargo build -p magpie-bench --profile bench-release"),
        "{stderr}"
    );
}
