#!/usr/bin/env bash
# Build examples/virt-kernel for one architecture on stable Rust and boot it
# on QEMU's virt machine with 4 CPUs (`make test-example` runs both):
#
#   examples/virt-kernel/run.sh riscv64|riscv64-smode|aarch64
#
# riscv64: machine mode, no firmware (-bios none, glue::Riscv64Machine);
# riscv64-smode: supervisor mode under QEMU's OpenSBI (glue::Riscv64);
# aarch64: EL1 (glue::Aarch64).
#
# Exit status: the kernel's (0 when every test passed; riscv64 through the
# sifive_test device, aarch64 through semihosting SYS_EXIT), or 1 with a
# message when it did not say so or QEMU timed out (MAGPIE_TIMEOUT seconds,
# default 60).
set -euo pipefail
cd "$(dirname "$0")/../.."

arch=${1:?usage: $0 riscv64|riscv64-smode|aarch64}
features=()
case $arch in
    riscv64)
        target=riscv64gc-unknown-none-elf
        qemu=(qemu-system-riscv64 -machine virt -bios none)
        ;;
    riscv64-smode)
        target=riscv64gc-unknown-none-elf
        features=(--features smode)
        qemu=(qemu-system-riscv64 -machine virt)
        ;;
    aarch64)
        target=aarch64-unknown-none
        qemu=(qemu-system-aarch64 -machine virt -cpu cortex-a57 -semihosting)
        ;;
    *)
        echo "run.sh: unknown architecture '$arch' (riscv64, riscv64-smode or aarch64)" >&2
        exit 2
        ;;
esac

# Stable Rust, frame pointers for the platform's backtraces; no workspace
# rustflags (.cargo/config.toml's -Z flags are for the x86_64 kernel).
export CARGO_TARGET_DIR=target/stable
CARGO_ENCODED_RUSTFLAGS=-Cforce-frame-pointers=yes \
    cargo +stable build -q -p magpie-virt-kernel --target "$target" "${features[@]}"
kernel=$CARGO_TARGET_DIR/$target/debug/virt-kernel

log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
timeout "${MAGPIE_TIMEOUT:-60}" "${qemu[@]}" -smp 4 -m 128M -display none -monitor none \
    -serial stdio -kernel "$kernel" | tee "$log" || status=$?
if [ "$status" = 124 ]; then
    echo "run.sh: $arch kernel timed out after ${MAGPIE_TIMEOUT:-60} s" >&2
    exit 1
fi
if [ "$status" != 0 ]; then
    echo "run.sh: $arch kernel failed (exit status $status)" >&2
    exit "$status"
fi
if ! grep -q "all tests passed" "$log"; then
    echo "run.sh: $arch kernel exited 0 without its verdict" >&2
    exit 1
fi
