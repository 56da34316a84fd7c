#!/usr/bin/env bash
# `make bench`: regenerate every table of docs/BENCHMARKS.md in one run.
#
#   bench/run.sh [suite options]     e.g. --reps 9 --target-ms 200 --no-callgrind
#   BENCH_DOC= bench/run.sh          # leave docs/BENCHMARKS.md alone (report only)
#
# Builds magpie-bench twice with the `bench-release` profile (release, one
# codegen unit; Cargo.toml) (plain, and with magpie-slab's alloc-profiling
# in target/bench-prof), then runs `magpie-bench suite`: callgrind
# instruction counts, wall clock (interleaved rounds, 1 and 2 threads),
# profiling out / in-off / on, memory workloads. The report goes to stdout,
# target/bench/results.md, and between the markers of docs/BENCHMARKS.md.
#
# valgrind (for the instruction counts) is a benchmark-only tool: this
# script installs it if it is missing and it can (root + apt-get);
# scripts/setup.sh does not. See docs/BENCHMARKS.md.
set -euo pipefail
cd "$(dirname "$0")/.."
host=x86_64-unknown-linux-gnu
if ! command -v valgrind >/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "run.sh: installing valgrind (benchmarks only)" >&2
        apt-get install -y valgrind >&2 || { apt-get update >&2 && apt-get install -y valgrind >&2; }
    fi
fi
cargo build -q -p magpie-bench --profile bench-release --target "$host"
CARGO_TARGET_DIR=target/bench-prof cargo build -q -p magpie-bench --profile bench-release --target "$host" --features alloc-profiling
plain=$PWD/target/$host/bench-release/magpie-bench
prof=$PWD/target/bench-prof/$host/bench-release/magpie-bench
extra=()
if ! command -v valgrind >/dev/null; then
    echo "run.sh: valgrind not found and not installable here: no instruction counts" >&2
    extra+=(--no-callgrind)
fi
doc=${BENCH_DOC-docs/BENCHMARKS.md}
if [ -n "$doc" ]; then
    extra+=(--doc "$doc")
fi
exec "$plain" suite --prof "$prof" --out "${BENCH_OUT:-target/bench/results.md}" "${extra[@]}" "$@"
