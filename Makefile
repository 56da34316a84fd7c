# The two commands of the README:
#   make run    boot Magpie in QEMU with the shell on this terminal
#   make test   host tests, QEMU integration tests, end-to-end shell tests
# Both install what is missing first (scripts/setup.sh). After that, plain
# `cargo run` and `cargo test` work too.

HOST := x86_64-unknown-linux-gnu

.PHONY: run test setup test-host test-qemu test-example test-e2e check debug

run: setup
	cargo run

# Boot Magpie stopped, waiting for gdb on localhost:1234 (QEMU -s -S);
# scripts/magpie-gdb.py gives `magpie slabinfo`, `magpie whatis ADDR`, ...
# (docs/VMCORE.md).
debug: setup
	cargo build --bin magpie
	@echo "make debug: QEMU waits for gdb on localhost:1234; in another terminal:"
	@echo "  gdb -x scripts/magpie-gdb.py -ex 'target remote :1234' target/x86_64-unknown-none/debug/magpie"
	MAGPIE_QEMU_ARGS="-s -S $(MAGPIE_QEMU_ARGS)" MAGPIE_TIMEOUT=0 boot/run-qemu.sh target/x86_64-unknown-none/debug/magpie

test: setup test-host test-miri test-qemu test-example test-e2e

setup:
	@scripts/setup.sh

# Tier 1: the libraries and the host tool magpie-kmem on the host (unit,
# property and model tests; the kmemtrace format's round trips; magpie-kmem
# on synthetic dumps and on dumps of the real writer), then the loom
# models (test-loom, below).
test-host: chrome-reader
	MAGPIE_REQUIRE_CHROME_READER=1 cargo test -p magpie-slab -p magpie-codetag -p magpie-kmem -p magpie-kmemtrace-format -p magpie-bench --target $(HOST) --features magpie-slab/nightly
	$(MAKE) --no-print-directory test-loom
	$(MAKE) --no-print-directory test-stable

# The library crates' host tests on stable Rust (scripts/setup.sh stable):
# without feature `nightly` (the `core::alloc::Allocator` shim's and the
# restartable hits' tests are left out), in a target dir of its own.
.PHONY: test-stable
test-stable:
	@scripts/setup.sh stable
	CARGO_TARGET_DIR=target/stable cargo +stable test -p magpie-slab -p magpie-codetag -p magpie-kmemtrace-format --target $(HOST)

# Tier 2: each file in tests/ is a small kernel booted in QEMU; then again
# with allocation profiling compiled out (it must cost nothing and break nothing),
# and the fault sweep with fault injection but no profiling (the other
# kmalloc! variant). Last, the kernel hit in release, whose counts are
# pinned to docs/BENCHMARKS.md.
test-qemu:
	cargo test
	cargo test --no-default-features
	cargo test --no-default-features --features fault-injection --test fault_injection
	cargo test --release --test kernel_hit
	MAGPIE_APPEND=mem_profiling=0 cargo test --release --test kernel_hit

# The adopter's view (docs/ADOPTING.md): examples/hobby-kernel, a one-CPU
# kernel on the shipped glue with a 100 KiB heap, booted in QEMU running
# the heap tests of "Writing an OS in Rust"; then the host example (the
# glue in a program, through allocation profiling to an allocinfo table);
# then examples/virt-kernel for riscv64 (supervisor mode under OpenSBI)
# and aarch64, built on stable Rust and booted on QEMU's
# virt machine with 4 CPUs (heap tests, a timer
# interrupt that allocates, an SMP stress with cross-CPU frees, verify;
# a few seconds each; scripts/setup.sh stable and virt install what
# they need).
test-example:
	cargo run -p magpie-hobby-kernel
	# Its heap tests counted against the fixed-size-block allocator: the
	# rows where Magpie is faster stay so (bench/hobby.py CHECKED, ~1 min).
	python3 bench/hobby.py --check
	cargo run -q -p magpie-slab --example host_heap --target $(HOST) --features nightly
	@scripts/setup.sh stable
	@scripts/setup.sh virt
	examples/virt-kernel/run.sh riscv64
	examples/virt-kernel/run.sh riscv64-smode
	examples/virt-kernel/run.sh aarch64

# Tier 3: setup.sh's toolchain repair and lock (fake rustup); boot the real
# kernel, type sessions on its serial console (the README's too); then
# the shell fuzz test (3,000 random and crafted lines, seeded: MAGPIE_FUZZ_SEED).
test-e2e: magpie-kmem
	cargo build --bin magpie
	python3 tests/e2e/test_setup.py -v
	python3 tests/e2e/test_shell.py -v
	python3 tests/e2e/test_kmemtrace.py -v
	python3 tests/e2e/test_slabtop.py -v
	python3 tests/e2e/test_dump_channel.py -v
	python3 tests/e2e/test_findleaks.py -v
	python3 tests/e2e/test_attack_matrix.py -v
	python3 tests/e2e/test_vmcore.py -v
	python3 tests/e2e/test_fault_sweep.py -v
	python3 tests/e2e/test_fuzz.py -v

# The real reader magpie-kmem's tests load its Chrome trace-event export
# with: Chrome DevTools' trace engine (npm, pinned by the lock file), run
# in node; installed once.
.PHONY: chrome-reader
chrome-reader:
	@scripts/setup.sh node
	@test -d tools/magpie-kmem/tests/chrome-reader/node_modules/@paulirish/trace_engine \
		|| npm ci --no-audit --no-fund --prefix tools/magpie-kmem/tests/chrome-reader

# The host tool (tools/magpie-kmem), built once with cargo's progress shown
# (the first build compiles ~90 crates); scripts/magpie-kmem runs it.
.PHONY: magpie-kmem
magpie-kmem:
	cargo build -p magpie-kmem --target $(HOST)

# The README's kmemtrace pictures (docs/images/*.svg), regenerated from the
# README session they show (scripts/readme-images.py says which).
.PHONY: readme-images
readme-images: magpie-kmem
	cargo build --bin magpie
	python3 scripts/readme-images.py

# Formatting and lints, warnings as errors (also run by .ci/run). The lint
# levels are the workspace's (Cargo.toml [workspace.lints], docs/LINTS.md).
# HOST_CRATES are the workspace members built for the host; the kernel is
# linted with its QEMU test kernels (tests/*.rs) too.
# magpie-slab's every feature but the other architectures' platforms (plain
# names, for commands that select magpie-slab alone: with `-p magpie-slab`,
# `magpie-slab/F` names the feature of its dev-dependency on itself, which
# a --lib build does not use).
SLAB_ALL_FEATURES := --features nightly,alloc-profiling,time-stats,allocinfo,x86_64,kfence,leak-scan,trace-table,kmemtrace,descriptor,debug
# What `check` builds on stable Rust: the bare-metal targets and every
# feature of magpie-slab but `nightly` (plus the target's own platform).
STABLE_TARGETS := x86_64-unknown-none riscv64gc-unknown-none-elf aarch64-unknown-none
STABLE_FEATURES := alloc-profiling,time-stats,allocinfo,kfence,leak-scan,trace-table,kmemtrace,descriptor
HOST_CRATES := -p magpie-slab -p magpie-codetag -p magpie-bench -p magpie-kmem -p magpie-kmemtrace-format
check:
	cargo fmt --all --check
	cargo clippy $(HOST_CRATES) --target $(HOST) --all-targets -- -D warnings
	# magpie-slab with no features (its default; as the kernel and the bench
	# build it without theirs): the library alone, since its tests and
	# examples turn profiling and time stats on (slab/Cargo.toml dev-dependency).
	cargo clippy -p magpie-slab --target $(HOST) --lib -- -D warnings
	# ... with every feature (each feature module compiled in), and with
	# each alone (a feature stands on the core without the others).
	# (every feature but the other architectures' platforms: SLAB_ALL_FEATURES)
	cargo clippy -p magpie-slab --target $(HOST) --lib $(SLAB_ALL_FEATURES) -- -D warnings
	for feature in kfence leak-scan alloc-profiling time-stats allocinfo trace-table kmemtrace descriptor debug; do \
		cargo clippy -q -p magpie-slab --target $(HOST) --lib --features $$feature -- -D warnings || exit 1; \
	done
	# ... and on the bare target with the uniprocessor glue (examples/hobby-kernel).
	cargo clippy -p magpie-slab --target x86_64-unknown-none --features x86_64 -- -D warnings
	# The dump format crate as the kernel builds it (no_std, bare metal).
	cargo clippy -p magpie-kmemtrace-format --target x86_64-unknown-none -- -D warnings
	cargo clippy --all-targets -- -D warnings
	cargo clippy -p magpie-hobby-kernel -- -D warnings
	# ... and its counting builds (make bench-hobby, make bench-hobby-profile).
	cargo clippy -p magpie-hobby-kernel --features count-trace -- -D warnings
	# The docs build without warnings (broken intra-doc links): the host
	# crates as a user's `cargo doc` shows them; the kernel with its private
	# items, which is what its docs are for (so links to them are fine).
	# magpie-slab with every feature (as docs.rs builds it: Cargo.toml
	# [package.metadata.docs.rs]).
	RUSTDOCFLAGS="-D warnings" cargo doc -q --no-deps $(HOST_CRATES) --target $(HOST)
	RUSTDOCFLAGS="-D warnings" cargo doc -q --no-deps -p magpie-slab --target $(HOST) $(SLAB_ALL_FEATURES)
	RUSTDOCFLAGS="-D warnings -A rustdoc::private_intra_doc_links" cargo doc -q --no-deps -p magpie --document-private-items
	# Stable Rust (scripts/setup.sh stable): the three library crates for the
	# three bare-metal targets, every feature but `nightly` and the other
	# architectures' platforms (their host
	# tests: `make test-stable`). CARGO_ENCODED_RUSTFLAGS= drops the workspace's
	# -Z flags (.cargo/config.toml), which stable rustc refuses.
	@scripts/setup.sh stable
	for target in $(STABLE_TARGETS); do \
		arch=$$(echo $$target | sed -E 's/(gc)?-unknown.*//'); \
		CARGO_ENCODED_RUSTFLAGS= CARGO_TARGET_DIR=target/stable cargo +stable clippy -q -p magpie-slab \
			--target $$target --features $(STABLE_FEATURES),$$arch -- -D warnings || exit 1; \
		CARGO_ENCODED_RUSTFLAGS= CARGO_TARGET_DIR=target/stable cargo +stable build -q \
			-p magpie-codetag -p magpie-kmemtrace-format --target $$target || exit 1; \
	done
	# The riscv64 and aarch64 example kernels (examples/virt-kernel), on stable.
	for build in "riscv64gc-unknown-none-elf" "riscv64gc-unknown-none-elf --features smode" aarch64-unknown-none; do \
		CARGO_ENCODED_RUSTFLAGS=-Cforce-frame-pointers=yes CARGO_TARGET_DIR=target/stable \
			cargo +stable clippy -q -p magpie-virt-kernel --target $$build -- -D warnings || exit 1; \
	done
	# The library crates package and build alone, as crates.io would have them,
	# on stable (published together: magpie-slab's path dependencies resolve
	# to the others).
	CARGO_TARGET_DIR=target/stable cargo +stable publish -q --dry-run --allow-dirty \
		-p magpie-kmemtrace-format -p magpie-codetag -p magpie-slab --target $(HOST)

# Host benchmarks: magpie-slab against peer allocators (callgrind instruction
# counts, wall clock, 1 vs 2 threads). Report: target/bench/results.md.
# See docs/BENCHMARKS.md.
.PHONY: bench
bench:
	bench/run.sh

# The adopter's speed (docs/BENCHMARKS.md "The adopter's speed"): the
# hobby kernel's heap tests with Magpie and with the fixed-size-block
# allocator of "Writing an OS in Rust", instructions counted in QEMU
# (examples/hobby-kernel feature `count`); rewrites that table (~1 min).
.PHONY: bench-hobby
bench-hobby:
	python3 bench/hobby.py

# Where those rows' instructions go: the counting kernel with feature
# `count-trace` records every instruction's address; bench/hobby_profile.py
# rebuilds the call stacks and prints each row by phase and by function
# (~1 min; `python3 bench/hobby_profile.py warm:large` for some rows).
.PHONY: bench-hobby-profile
bench-hobby-profile:
	python3 bench/hobby_profile.py

# Loom model tests of magpie-slab's magazine layer (slab/src/tests/loom_models.rs):
# every interleaving, up to a preemption bound (LOOM_MAX_PREEMPTIONS, default 3),
# of the per-CPU, depot and slab locks under depot exchanges and reap's drain.
# `--cfg loom` rebuilds every crate, hence a target dir of its own.
.PHONY: test-loom
test-loom:
	RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test -p magpie-slab --target $(HOST) --release loom

# Miri (undefined behaviour: Stacked Borrows, data races, alignment,
# uninitialised reads) on magpie-slab's host tests and magpie-codetag's unit
# tests, two Miri processes at once. Interpreted, a slab test costs 2-40 s
# of CPU (an allocator init alone, 64 kmalloc caches, ~2 s), so `make test`
# runs the tier that fits the CI budget: the create/alloc/free/destroy
# tests, every bad free, kmemtrace (every hook, the dump format) and
# codetag's unit tests. Left to the native run, with why:
# - alloc_free::round_trips_per_size, reap_all_returns_metadata_in_one_pass,
#   kmemtrace::events_span_sub_buffers_in_order and
#   full_ring_counts_overruns_and_sequence_gaps: minutes each (the size
#   sweep, 17 allocator inits with reaps, a full 1,024-event sub-buffer);
# - the other modules: `make test-miri-wide` runs them scaled down under
#   cfg(miri) (slab/src/tests/support.rs MIRI_SCALE: thread stress, proptest
#   models, bursts, cost loops at 1/100; tests marked
#   `#[cfg_attr(miri, ignore = "...")]` say why they are left out); it
#   measured 2026-11-23 on the 2-core CI-class VM: each half still running
#   after 26 min wall / 20.5 min CPU (stopped there), against 7.5 min for
#   the whole of .ci/run with this tier: not in `make test` until the
#   allocator's setup under Miri is cheaper;
# - codetag's integration tests: the linker-section (linkme) registries,
#   Miri cannot read `__start_*` section symbols.
# -Zmiri-permissive-provenance: the allocator keeps addresses as words and
# casts them back (the page map's slab entries, slab/src/slab/layer.rs
# `small_slab_of`; the hardened free list's obfuscated links,
# slab/src/layout/freelist.rs; the test page source's arena base): Miri checks
# these int-to-pointer casts with exposed provenance (without the flag it
# only warns on each). -Zmiri-ignore-leaks: the test page source leaks its
# arena on purpose.
MIRI_FLAGS := -Zmiri-permissive-provenance -Zmiri-ignore-leaks
MIRI_TEST := MAKEFLAGS= MIRIFLAGS="$(MIRI_FLAGS)" cargo miri test --target $(HOST)
MIRI_SKIP := --skip alloc_free::round_trips_per_size \
	--skip alloc_free::reap_all_returns_metadata_in_one_pass \
	--skip kmemtrace::events_span_sub_buffers_in_order \
	--skip kmemtrace::full_ring_counts_overruns_and_sequence_gaps
MIRI_SLAB_1 := tests::alloc_free tests::bad_free
MIRI_SLAB_2 := tests::kmemtrace
.PHONY: test-miri miri-slab-1 miri-slab-2
test-miri:
	cargo miri setup
	$(MIRI_TEST) -p magpie-slab --lib --no-run
	$(MAKE) --no-print-directory -j2 --output-sync=line miri-slab-1 miri-slab-2
	$(MIRI_TEST) -p magpie-codetag --lib
miri-slab-1:
	$(MIRI_TEST) -p magpie-slab --lib -- $(MIRI_SKIP) $(MIRI_SLAB_1)
miri-slab-2:
	$(MIRI_TEST) -p magpie-slab --lib -- $(MIRI_SKIP) $(MIRI_SLAB_2)

# Every slab host test under Miri, scaled (see above; not in `make test`).
MIRI_WIDE_SKIP := $(MIRI_SKIP) \
	--skip oom::init_fails_cleanly_at_every_point \
	--skip tracing::records_exactly_the_outstanding_objects \
	--skip tracing::dropped_records_are_counted \
	--skip tracing::notrace_is_refused \
	--skip tracing::kmalloc_caches_trace_through_kfree \
	--skip tracing::trace_table_grows_with_many_records
.PHONY: test-miri-wide
test-miri-wide:
	cargo miri setup
	$(MIRI_TEST) -p magpie-slab --lib --no-run
	$(MAKE) --no-print-directory -j2 --output-sync=line \
		MIRI_SKIP='$(MIRI_WIDE_SKIP)' \
		MIRI_SLAB_1='tests::alloc_free tests::bad_free tests::debug:: tests::geometry tests::global tests::kmalloc tests::magazines tests::double_free_rate' \
		MIRI_SLAB_2='tests::kmemtrace tests::oom tests::profiling tests::trace_table tests::reclaim tests::threads tests::model tests::debug_fuzz' \
		miri-slab-1 miri-slab-2
