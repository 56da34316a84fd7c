#!/usr/bin/env bash
# `make bench`: regenerate every table of docs/BENCHMARKS.md in one run.
#
#   bench/run.sh [suite options]     e.g. --reps 9 --target-reps 101 --target-ms 200 --no-callgrind
#   BENCH_DOC= bench/run.sh          # leave docs/BENCHMARKS.md alone (report only)
#
# Builds magpie-bench twice with the `bench-release` profile (release, one
# codegen unit; Cargo.toml) (plain, and with magpie-slab's alloc-profiling
# in target/bench-prof), then runs `magpie-bench suite`: callgrind
# instruction counts, CPU time (fresh processes at two N, interleaved and
# shuffled rounds), wall clock at 1 and 2 threads,
# profiling out / in-off / on, memory workloads, the replay of recorded
# workloads (bench/workloads/*.kmt and two recorded on the host; see
# docs/BENCHMARKS.md "Replay"), and the kernel hit counted in QEMU
# (tests/kernel_hit.rs). The report goes to stdout,
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
# The kernel hit counted exactly in QEMU (tests/kernel_hit.rs, trap-flag
# single-stepping): its KERNEL_HIT lines become the suite's kernel row.
# Release build (the kernel's), booted with profiling off and on, and
# `kernel_hit.pin=0`: the test then prints the counts without checking
# them against docs/BENCHMARKS.md, whose table this run regenerates.
mkdir -p target/bench
: >target/bench/kernel-hit.txt
for profiling in 0 1; do
    if command -v qemu-system-x86_64 >/dev/null \
        && MAGPIE_APPEND="mem_profiling=$profiling kernel_hit.pin=0" cargo test -q --release -p magpie --test kernel_hit \
            >target/bench/kernel-hit.log 2>&1; then
        grep -o 'KERNEL_HIT .*' target/bench/kernel-hit.log >>target/bench/kernel-hit.txt || true
    else
        echo "run.sh: the QEMU kernel-hit count failed or QEMU is missing (target/bench/kernel-hit.log)" >&2
    fi
done
if [ -s target/bench/kernel-hit.txt ]; then
    extra+=(--kernel-hit target/bench/kernel-hit.txt)
fi
doc=${BENCH_DOC-docs/BENCHMARKS.md}
if [ -n "$doc" ]; then
    extra+=(--doc "$doc")
fi
exec "$plain" suite --prof "$prof" --out "${BENCH_OUT:-target/bench/results.md}" "${extra[@]}" "$@"
