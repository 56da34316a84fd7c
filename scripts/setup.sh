#!/usr/bin/env bash
# Installs what `cargo run` and `cargo test` need and is missing: the pinned
# toolchain from rust-toolchain.toml and QEMU (`setup.sh node`: node and
# npm, for one test step). Safe to run again; fast when
# everything is present.
#
# Safe to run twice at once (two `make` runs): the rustup steps hold a lock
# (flock on $RUSTUP_HOME/magpie-setup.lock), because concurrent installs were
# seen to leave the toolchain's x86_64-unknown-none library directory empty,
# and every kernel build then failed with "can't find crate for `core`". A
# toolchain left like that (by a concurrent or interrupted install) is
# detected here and repaired: the target is removed and added again.
#
# For tests: MAGPIE_RUSTUP (the rustup to run), MAGPIE_SYSROOT (the
# toolchain directory to check, default `rustc --print sysroot`),
# MAGPIE_SETUP_LOCK (the lock file).
set -euo pipefail
cd "$(dirname "$0")/.."

# `scripts/setup.sh node`: node and npm only, for the test step that loads
# magpie-kmem's Chrome trace-event export with Chrome DevTools' trace engine
# (npm, `make chrome-reader`); `make run` does not need them.
if [ "${1:-}" = node ]; then
    if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
        if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
            echo "setup: installing node and npm (apt-get install -y nodejs npm)"
            apt-get update -qq
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null
        else
            echo "setup: node/npm not found (the Chrome-export reader test needs them);" \
                 "install them, e.g.: sudo apt-get install nodejs npm" >&2
            exit 1
        fi
    fi
    exit 0
fi

# `scripts/setup.sh virt`: QEMU for the riscv64 and aarch64 `virt` machines
# (examples/virt-kernel, `make test-example`): Debian's qemu-system-misc
# and qemu-system-arm.
if [ "${1:-}" = virt ]; then
    for pair in qemu-system-riscv64:qemu-system-misc qemu-system-aarch64:qemu-system-arm; do
        binary=${pair%%:*} package=${pair##*:}
        if ! command -v "$binary" >/dev/null 2>&1; then
            if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
                echo "setup: installing $binary (apt-get install -y $package)"
                apt-get update -qq
                DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$package" >/dev/null
            else
                echo "setup: $binary not found; install it, e.g.: sudo apt-get install $package" >&2
                exit 1
            fi
        fi
    done
    exit 0
fi

RUSTUP=${MAGPIE_RUSTUP:-rustup}

# `scripts/setup.sh stable`: the latest stable Rust with the three
# bare-metal targets, on which `make check` builds the library crates and
# `make test-example` the riscv64 and aarch64 example kernels (the library
# builds on stable; only feature `nightly` needs the pinned nightly).
# Installed once; not updated when present (`rustup update stable` does).
STABLE_TARGETS="x86_64-unknown-none riscv64gc-unknown-none-elf aarch64-unknown-none x86_64-unknown-linux-gnu"
if [ "${1:-}" = stable ]; then
    lock=${MAGPIE_SETUP_LOCK:-${RUSTUP_HOME:-$HOME/.rustup}/magpie-setup.lock}
    mkdir -p "$(dirname "$lock")"
    exec 9>"$lock"
    command -v flock >/dev/null 2>&1 && flock 9
    installed=$("$RUSTUP" target list --installed --toolchain stable 2>/dev/null || true)
    missing=""
    for target in $STABLE_TARGETS; do
        grep -qx "$target" <<<"$installed" || missing="$missing $target"
    done
    if [ -n "$missing" ]; then
        echo "setup: installing stable Rust with$missing"
        "$RUSTUP" toolchain install stable --profile minimal --component clippy --no-self-update >/dev/null
        # shellcheck disable=SC2086 # one word per target
        "$RUSTUP" target add --toolchain stable $missing >/dev/null
    fi
    # make check lints on stable too.
    if ! "$RUSTUP" component list --installed --toolchain stable 2>/dev/null | grep -q '^clippy'; then
        echo "setup: installing clippy for stable Rust"
        "$RUSTUP" component add --toolchain stable clippy >/dev/null
    fi
    exit 0
fi

BARE_TARGET=x86_64-unknown-none
CHANNEL=$(sed -n 's/^channel *= *"\(.*\)"/\1/p' rust-toolchain.toml)

if ! command -v "$RUSTUP" >/dev/null 2>&1; then
    echo "setup: rustup not found; install it from https://rustup.rs and run this again" >&2
    exit 1
fi

# Whether the toolchain at sysroot $1 has the bare target's library (the
# precompiled `core` the kernel builds against).
bare_target_ok() {
    compgen -G "$1/lib/rustlib/$BARE_TARGET/lib/libcore-*.rlib" >/dev/null
}

lock=${MAGPIE_SETUP_LOCK:-${RUSTUP_HOME:-$HOME/.rustup}/magpie-setup.lock}
mkdir -p "$(dirname "$lock")"
exec 9>"$lock"
if command -v flock >/dev/null 2>&1; then
    if ! flock -n 9; then
        echo "setup: another setup is installing the toolchain; waiting for it ($lock)" >&2
        flock 9
    fi
fi

# Reads rust-toolchain.toml (channel, components, x86_64-unknown-none target).
"$RUSTUP" toolchain install --no-self-update >/dev/null

sysroot=${MAGPIE_SYSROOT:-$(rustc --print sysroot)}
if ! bare_target_ok "$sysroot"; then
    echo "setup: toolchain $CHANNEL has no $BARE_TARGET library" \
         "($sysroot/lib/rustlib/$BARE_TARGET/lib is missing or empty: an interrupted" \
         "or concurrent install); repairing it" >&2
    "$RUSTUP" target remove --toolchain "$CHANNEL" "$BARE_TARGET" >/dev/null 2>&1 || true
    "$RUSTUP" target add --toolchain "$CHANNEL" "$BARE_TARGET" >/dev/null
    if ! bare_target_ok "$sysroot"; then
        echo "setup: $BARE_TARGET is still missing from $sysroot after 'rustup target add';" \
             "try: rustup toolchain uninstall $CHANNEL && make setup" >&2
        exit 1
    fi
    echo "setup: repaired: $BARE_TARGET library installed in $sysroot" >&2
fi
flock -u 9 2>/dev/null || true

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

# gdb with Python: `make debug` and scripts/magpie-gdb.py (docs/VMCORE.md);
# the post-mortem tests run it in batch mode. Not fatal: they skip without.
if ! command -v gdb >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "setup: installing gdb (apt-get install -y gdb)"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gdb >/dev/null
    else
        echo "setup: gdb not found (make debug, scripts/magpie-gdb.py); install it, e.g.: sudo apt-get install gdb" >&2
    fi
fi
