# Shared by bench/profile.sh and bench/misses.sh (sourced): the bench
# binary and a scratch directory.
#
# bench_setup: builds magpie-bench with the `bench-release` profile (as
# `make bench` does; BENCH_FEATURES adds features, CARGO_TARGET_DIR is
# honoured) and sets $bin, or with BENCH_BIN=path uses that binary (one
# built before, e.g. of another commit); sets $out, a temporary directory
# removed on exit.
bench_setup() {
    local host=x86_64-unknown-linux-gnu
    if [ -n "${BENCH_BIN:-}" ]; then
        bin=$BENCH_BIN
    else
        cargo build -q -p magpie-bench --profile bench-release --target "$host" ${BENCH_FEATURES:+--features "$BENCH_FEATURES"}
        bin=${CARGO_TARGET_DIR:-target}/$host/bench-release/magpie-bench
    fi
    out=$(mktemp -d)
    trap 'rm -rf "$out"' EXIT
}
