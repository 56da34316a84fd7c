# The two commands of the README:
#   make run    boot Magpie in QEMU with the shell on this terminal
#   make test   host tests, QEMU integration tests, end-to-end shell tests
# Both install what is missing first (scripts/setup.sh). After that, plain
# `cargo run` and `cargo test` work too.

HOST := x86_64-unknown-linux-gnu

.PHONY: run test setup test-host test-qemu test-e2e check

run: setup
	cargo run

test: setup test-host test-miri test-qemu test-e2e

setup:
	@scripts/setup.sh

# Tier 1: the libraries and the host tool magpie-kmem on the host (unit,
# property and model tests; magpie-kmem on synthetic dumps), then the loom
# models (test-loom, below).
test-host:
	cargo test -p magpie-slab -p magpie-codetag -p magpie-kmem --target $(HOST)
	$(MAKE) --no-print-directory test-loom

# Tier 2: each file in tests/ is a small kernel booted in QEMU; then again
# with allocation profiling compiled out (it must cost nothing and break nothing),
# and the fault sweep with fault injection but no profiling (the other
# kmalloc! variant).
test-qemu:
	cargo test
	cargo test --no-default-features
	cargo test --no-default-features --features fault-injection --test fault_injection

# Tier 3: boot the real kernel, type sessions on its serial console; then
# the shell fuzz test (3,000 random and crafted lines, seeded: MAGPIE_FUZZ_SEED).
test-e2e:
	cargo build --bin magpie
	python3 tests/e2e/test_shell.py -v
	python3 tests/e2e/test_kmemtrace.py -v
	python3 tests/e2e/test_fuzz.py -v

# Formatting and lints, warnings as errors (also run by .ci/run). The lint
# levels are the workspace's (Cargo.toml [workspace.lints], docs/LINTS.md).
# HOST_CRATES are the workspace members built for the host; the kernel is
# linted with its QEMU test kernels (tests/*.rs) too.
HOST_CRATES := -p magpie-slab -p magpie-codetag -p magpie-bench -p magpie-kmem
check:
	cargo fmt --all --check
	cargo clippy $(HOST_CRATES) --target $(HOST) --all-targets -- -D warnings
	cargo clippy --all-targets -- -D warnings

# Host benchmarks: magpie-slab against peer allocators (callgrind instruction
# counts, wall clock, 1 vs 2 threads). Report: target/bench/results.md.
# See docs/BENCHMARKS.md.
.PHONY: bench
bench:
	bench/run.sh

# Loom model tests of magpie-slab's magazine layer (slab/src/tests/loom_models.rs):
# every interleaving, up to a preemption bound (LOOM_MAX_PREEMPTIONS, default 3),
# of the per-CPU, depot and slab locks under depot exchanges and reap's drain.
# `--cfg loom` rebuilds every crate, hence a target dir of its own.
.PHONY: test-loom
test-loom:
	RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test -p magpie-slab --target $(HOST) --release loom

# Miri (undefined behaviour, Stacked Borrows) on the slab allocator's host
# tests of the create/alloc/free/destroy paths and of every kind of bad free,
# and on magpie-codetag's unit tests. Scaled to what Miri runs in ~3 minutes:
# the size sweep, the proptest model, the multi-thread stress and the
# linker-section (linkme) tests are left to the native run above, Miri cannot
# read `__start_*` section symbols. Integer-to-pointer casts are the page
# map's (addresses as words): permissive provenance. The test page source
# leaks its arenas on purpose: leaks are not errors here.
MIRI_FLAGS := -Zmiri-permissive-provenance -Zmiri-ignore-leaks
.PHONY: test-miri
test-miri:
	cargo miri setup
	MIRIFLAGS="$(MIRI_FLAGS)" cargo miri test -p magpie-slab --target $(HOST) --lib -- --skip round_trips_per_size tests::alloc_free tests::bad_free
	MIRIFLAGS="$(MIRI_FLAGS)" cargo miri test -p magpie-codetag --target $(HOST) --lib
