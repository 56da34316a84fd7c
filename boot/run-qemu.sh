#!/usr/bin/env bash
# Boot a Magpie kernel ELF in QEMU (TCG). Used as the cargo runner for
# `cargo run` and `cargo test` (see .cargo/config.toml).
#
#   boot/run-qemu.sh KERNEL.elf [--smp N] [KERNEL ARGS...]
#   cargo run -- --smp 8            (the same through cargo)
#
# The ELF is passed twice: as the PVH kernel and (without its debug info) as
# the initrd module, from which the kernel reads its own symbol table to
# symbolize backtraces.
#
# Exit status: 0 when the kernel exits through isa-debug-exit with Success
# (QEMU status 33); non-zero with a one-line message on stderr otherwise
# (kernel failure, triple fault/reset = QEMU status 0, timeout, no QEMU).
#
# Environment:
#   MAGPIE_APPEND     kernel command line (e.g. "loglevel=debug"); extra
#                     runner arguments are appended to it. Test kernels
#                     (.../deps/...) other than tests/kfence.rs's boot with
#                     `kfence.sample_interval=0` first on the line (a later
#                     word wins): a KFENCE sample taken at random changes
#                     what ksize, whatis and slab placement tests assert;
#                     tests/kfence.rs tests the default (100 ms) and the
#                     samples, `cargo run` and the shell tests keep it on
#   MAGPIE_SMP        number of CPUs, 1..64. Precedence: `--smp N` argument,
#                     then MAGPIE_SMP, then the kernel's own default: test
#                     kernels named smp_* (tests/smp_*.rs) boot with 4 CPUs,
#                     every other kernel (`cargo run`, the other tests) with 2
#   MAGPIE_MEM        memory size (default 256M)
#   MAGPIE_TIMEOUT    seconds before QEMU is killed; 0 = none. Default: none
#                     on a terminal, 60 for test kernels (.../deps/...),
#                     120 otherwise
#   MAGPIE_QEMU_ARGS  extra QEMU arguments (word-split)
#   MAGPIE_QEMU       QEMU binary (default qemu-system-x86_64)
#   MAGPIE_KMEMTRACE  file that receives `kmemtrace dump` (a virtio console,
#                     virtio-serial-pci + virtconsole; truncated at boot).
#                     Default target/kmemtrace/latest.kmt, for test kernels
#                     target/kmemtrace/test.kmt; relative paths are taken
#                     from the workspace root; the directory is created.
#                     `none`: no virtio console, so the kernel has no dump
#                     channel (`kmemtrace dump` then refuses)
set -u

ROOT=$(cd "$(dirname "$0")/.." && pwd)

if [ $# -lt 1 ]; then
    echo "usage: $0 KERNEL.elf [KERNEL ARGS...]" >&2
    exit 2
fi
ELF=$1
shift

# `--smp N` / `--smp=N` before the kernel arguments sets the CPU count.
SMP_ARG=
case "${1:-}" in
    --smp) SMP_ARG=${2:-}; shift; [ $# -gt 0 ] && shift ;;
    --smp=*) SMP_ARG=${1#--smp=}; shift ;;
esac
if [ -n "$SMP_ARG" ]; then
    SMP=$SMP_ARG
elif [ -n "${MAGPIE_SMP:-}" ]; then
    SMP=$MAGPIE_SMP
else
    case "$(basename "$ELF")" in
        smp_*) SMP=4 ;;
        *) SMP=2 ;;
    esac
fi
if ! [[ "$SMP" =~ ^[0-9]+$ ]] || [ "$SMP" -lt 1 ] || [ "$SMP" -gt 64 ]; then
    echo "run-qemu.sh: CPU count '$SMP' out of range: give 1 to 64 (--smp N or MAGPIE_SMP)" >&2
    exit 2
fi

QEMU=${MAGPIE_QEMU:-qemu-system-x86_64}
if ! command -v "$QEMU" >/dev/null 2>&1; then
    echo "run-qemu.sh: $QEMU not found; install it with: apt-get install qemu-system-x86" >&2
    exit 127
fi
if [ ! -f "$ELF" ]; then
    echo "run-qemu.sh: kernel $ELF not found" >&2
    exit 2
fi

# `-serial stdio` needs a standard input: give it /dev/null when it is closed.
[ -e /proc/$$/fd/0 ] || exec </dev/null

if [ -n "${MAGPIE_TIMEOUT:-}" ]; then
    TIMEOUT=$MAGPIE_TIMEOUT
elif [[ "$ELF" == */deps/* ]]; then
    TIMEOUT=60
elif [ -t 0 ]; then
    TIMEOUT=0
else
    TIMEOUT=120
fi

APPEND=${MAGPIE_APPEND:-}
if [[ "$ELF" == */deps/* && "$(basename "$ELF")" != kfence-* ]]; then
    APPEND="kfence.sample_interval=0${APPEND:+ $APPEND}"
fi
if [ $# -gt 0 ]; then
    APPEND="${APPEND:+$APPEND }$*"
fi

if [ "${MAGPIE_KMEMTRACE:-}" = none ]; then
    KMEMTRACE=
elif [ -n "${MAGPIE_KMEMTRACE:-}" ]; then
    KMEMTRACE=$MAGPIE_KMEMTRACE
    case "$KMEMTRACE" in /*) ;; *) KMEMTRACE=$ROOT/$KMEMTRACE ;; esac
elif [[ "$ELF" == */deps/* ]]; then
    KMEMTRACE=$ROOT/target/kmemtrace/test.kmt
else
    KMEMTRACE=$ROOT/target/kmemtrace/latest.kmt
fi
if [ -n "$KMEMTRACE" ] && ! mkdir -p "$(dirname "$KMEMTRACE")"; then
    echo "run-qemu.sh: cannot create the directory of $KMEMTRACE (MAGPIE_KMEMTRACE)" >&2
    exit 2
fi

# shellcheck disable=SC2206 # word splitting of MAGPIE_QEMU_ARGS is intended
EXTRA=(${MAGPIE_QEMU_ARGS:-})

# The kernel reads its symbol table (.symtab) from the module. Pass a copy
# without DWARF: a debug kernel is mostly DWARF (7 MB against 0.4 MB), and
# QEMU puts the module at the top of RAM, where with a small MAGPIE_MEM a
# large one would overlap the kernel image before it runs. objcopy from
# binutils, else llvm-objcopy from the toolchain's llvm-tools; without
# either, the ELF itself.
MODULE=$ELF
OBJCOPY=$(command -v objcopy || true)
if [ -z "$OBJCOPY" ]; then
    OBJCOPY=$(ls "$(rustc --print sysroot 2>/dev/null)"/lib/rustlib/*/bin/llvm-objcopy 2>/dev/null | head -n 1)
fi
if [ -n "$OBJCOPY" ]; then
    SYMBOLS=$(mktemp "${TMPDIR:-/tmp}/magpie-symbols.XXXXXX")
    trap 'rm -f "$SYMBOLS"' EXIT
    if "$OBJCOPY" --strip-debug "$ELF" "$SYMBOLS" 2>/dev/null; then
        MODULE=$SYMBOLS
    fi
fi

CMD=("$QEMU" -machine q35 -accel tcg -m "${MAGPIE_MEM:-256M}" -smp "$SMP"
     -serial stdio -display none -monitor none -no-reboot
     -device isa-debug-exit,iobase=0xf4,iosize=0x04
     -kernel "$ELF" -initrd "$MODULE" -append "$APPEND")
if [ -n "$KMEMTRACE" ]; then
    CMD+=(-chardev file,id=kmemtrace,path="$KMEMTRACE"
          -device virtio-serial-pci,id=kmemtrace-serial
          -device virtconsole,bus=kmemtrace-serial.0,chardev=kmemtrace)
fi
CMD+=("${EXTRA[@]}")

if [ "$TIMEOUT" != 0 ]; then
    timeout -k 5 "$TIMEOUT" "${CMD[@]}"
else
    "${CMD[@]}"
fi
STATUS=$?

case $STATUS in
    33) exit 0 ;;
    35) echo "run-qemu.sh: kernel $(basename "$ELF") reported failure" >&2 ;;
    0)  echo "run-qemu.sh: QEMU exited without isa-debug-exit (triple fault or reset?)" >&2 ;;
    124|137) echo "run-qemu.sh: timed out after ${TIMEOUT} s (set MAGPIE_TIMEOUT)" >&2 ;;
    *)  echo "run-qemu.sh: QEMU exited with status $STATUS" >&2 ;;
esac
exit 1
