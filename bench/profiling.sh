#!/usr/bin/env bash
# Issue 3's benchmark, in one run: magpie with allocation profiling
# (1) compiled out, (2) compiled in but switched off, (3) on from boot, on
# the kmem_cache alloc+free pair and mixed 8-512 B kmalloc: callgrind
# instructions, wall-clock ratios, objects per slab and slab memory.
#
#   bench/profiling.sh [--reps R] [--target-ms MS]
#
# Builds magpie-bench twice (plain, and with --features alloc-profiling in
# target/bench-prof) and runs `magpie-bench profiling`. Markdown on stdout
# and in target/bench/profiling.md. See docs/BENCHMARKS.md.
set -euo pipefail
cd "$(dirname "$0")/.."
host=x86_64-unknown-linux-gnu
cargo build -q -p magpie-bench --release --target "$host"
CARGO_TARGET_DIR=target/bench-prof cargo build -q -p magpie-bench --release --target "$host" --features alloc-profiling
plain=$PWD/target/$host/release/magpie-bench
prof=$PWD/target/bench-prof/$host/release/magpie-bench
exec "$prof" profiling --plain "$plain" --out "${BENCH_OUT:-target/bench/profiling.md}" "$@"
