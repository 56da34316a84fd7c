#!/usr/bin/env bash
# Run the whole magpie-bench suite in one go: callgrind instruction counts
# and wall clock (1 and 2 threads) for every workload and allocator, as one
# markdown report on stdout and in target/bench/results.md.
#
#   bench/run.sh [suite options]     e.g. --reps 9 --target-ms 200 --no-callgrind
#   BENCH_FEATURES=alloc-profiling bench/run.sh    # magpie with profiling compiled in
#
# See docs/BENCHMARKS.md. Needs valgrind for the instruction counts (the
# suite reports a failure row per measurement if it is missing).
set -euo pipefail
cd "$(dirname "$0")/.."
host=x86_64-unknown-linux-gnu
cargo build -q -p magpie-bench --release --target "$host" ${BENCH_FEATURES:+--features "$BENCH_FEATURES"}
bin=target/$host/release/magpie-bench
extra=()
if ! command -v valgrind >/dev/null; then
    echo "run.sh: valgrind not found, skipping instruction counts" >&2
    extra+=(--no-callgrind)
fi
exec "$bin" suite --out "${BENCH_OUT:-target/bench/results.md}" "${extra[@]}" "$@"
