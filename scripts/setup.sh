#!/usr/bin/env bash
# Installs what `cargo run` and `cargo test` need and is missing: the pinned
# toolchain from rust-toolchain.toml and QEMU. Safe to run again; fast when
# everything is present.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v rustup >/dev/null 2>&1; then
    echo "setup: rustup not found; install it from https://rustup.rs and run this again" >&2
    exit 1
fi
# Reads rust-toolchain.toml (channel, components, x86_64-unknown-none target).
rustup toolchain install --no-self-update >/dev/null

if ! command -v qemu-system-x86_64 >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "setup: installing QEMU (apt-get install -y qemu-system-x86)"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq qemu-system-x86 >/dev/null
    else
        echo "setup: qemu-system-x86_64 not found; install it, e.g.: sudo apt-get install qemu-system-x86" >&2
        exit 1
    fi
fi

if ! command -v python3 >/dev/null 2>&1; then
    echo "setup: python3 not found (the end-to-end shell tests need it); install python3" >&2
    exit 1
fi
