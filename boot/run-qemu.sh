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
#                     channel (`kmemtrace dump` then refuses). With the
#                     default, each boot writes its own file,
#                     target/kmemtrace/boot-<date>-<time>.kmt, and
#                     latest.kmt is a symbolic link to the newest (the last
#                     20 boots' dumps are kept: `magpie-kmem diff` of two
#                     boots needs no copy by hand)
#   MAGPIE_VMCORE     where the runner writes a QEMU dump-guest-memory ELF
#                     core of the VM (docs/VMCORE.md): on a kernel panic, on
#                     a reset or shutdown the kernel did not choose (triple
#                     fault), when the shell's `vmcore` asks, and when the
#                     runner gets SIGINT/SIGTERM (then QEMU ends). Default
#                     target/vmcore/latest.core for `cargo run` kernels;
#                     test kernels (.../deps/...) take none unless it is
#                     set; `none`: no core (and no QMP socket). Needs
#                     python3 (boot/vmcore.py speaks QMP to QEMU)
#
# On a terminal the serial console is QEMU's `mon:stdio`: Ctrl-C goes to
# the kernel's shell, Ctrl-A X ends QEMU (at once, no core: type `vmcore`
# first), Ctrl-A C switches to the QEMU monitor and back (its
# `dump-guest-memory FILE` takes a core of a hung kernel by hand).
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
# The default dump file: one per boot, latest.kmt links to the newest,
# the 20 newest boots' files kept.
if [ -z "${MAGPIE_KMEMTRACE:-}" ] && [[ "$ELF" != */deps/* ]]; then
    KMEMTRACE_DIR=$(dirname "$KMEMTRACE")
    BOOT_KMT=boot-$(date +%Y%m%d-%H%M%S)-$$.kmt
    # A latest.kmt from before the per-boot files is kept as a boot file.
    if [ -f "$KMEMTRACE" ] && [ ! -L "$KMEMTRACE" ]; then
        mv -f "$KMEMTRACE" "$KMEMTRACE_DIR/boot-$(date -r "$KMEMTRACE" +%Y%m%d-%H%M%S)-old.kmt"
    fi
    : > "$KMEMTRACE_DIR/$BOOT_KMT"
    ln -sfn "$BOOT_KMT" "$KMEMTRACE"
    # shellcheck disable=SC2012 # names we made: no odd characters
    ls -1t "$KMEMTRACE_DIR"/boot-*.kmt 2>/dev/null | tail -n +21 | while read -r old; do
        rm -f "$old"
    done
    KMEMTRACE=$KMEMTRACE_DIR/$BOOT_KMT
fi

# The core taker (boot/vmcore.py, over a QMP socket).
if [ "${MAGPIE_VMCORE:-}" = none ]; then
    VMCORE=
elif [ -n "${MAGPIE_VMCORE:-}" ]; then
    VMCORE=$MAGPIE_VMCORE
    case "$VMCORE" in /*) ;; *) VMCORE=$ROOT/$VMCORE ;; esac
elif [[ "$ELF" == */deps/* ]]; then
    VMCORE=
else
    VMCORE=$ROOT/target/vmcore/latest.core
fi
if [ -n "$VMCORE" ] && ! command -v python3 >/dev/null 2>&1; then
    echo "run-qemu.sh: no python3: no vmcore will be taken (MAGPIE_VMCORE)" >&2
    VMCORE=
fi
if [ -n "$VMCORE" ] && ! mkdir -p "$(dirname "$VMCORE")"; then
    echo "run-qemu.sh: cannot create the directory of $VMCORE (MAGPIE_VMCORE)" >&2
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
SYMBOLS=
MODULE=$ELF
OBJCOPY=$(command -v objcopy || true)
if [ -z "$OBJCOPY" ]; then
    OBJCOPY=$(ls "$(rustc --print sysroot 2>/dev/null)"/lib/rustlib/*/bin/llvm-objcopy 2>/dev/null | head -n 1)
fi
if [ -n "$OBJCOPY" ]; then
    SYMBOLS=$(mktemp "${TMPDIR:-/tmp}/magpie-symbols.XXXXXX")
    if "$OBJCOPY" --strip-debug "$ELF" "$SYMBOLS" 2>/dev/null; then
        MODULE=$SYMBOLS
    fi
fi

# On a terminal: Ctrl-C to the guest, Ctrl-A X / Ctrl-A C as documented.
SERIAL=stdio
[ -t 0 ] && SERIAL=mon:stdio
CMD=("$QEMU" -machine q35 -accel tcg -m "${MAGPIE_MEM:-256M}" -smp "$SMP"
     -serial "$SERIAL" -display none -monitor none -no-reboot
     -device isa-debug-exit,iobase=0xf4,iosize=0x04
     -kernel "$ELF" -initrd "$MODULE" -append "$APPEND")
if [ -n "$KMEMTRACE" ]; then
    CMD+=(-chardev file,id=kmemtrace,path="$KMEMTRACE"
          -device virtio-serial-pci,id=kmemtrace-serial
          -device virtconsole,bus=kmemtrace-serial.0,chardev=kmemtrace)
fi
CLEANUP=()
if [ -n "$VMCORE" ]; then
    QMP_DIR=$(mktemp -d "${TMPDIR:-/tmp}/magpie-qmp.XXXXXX")
    CLEANUP+=("$QMP_DIR")
    CMD+=(-qmp "unix:$QMP_DIR/qmp.sock,server=on,wait=off"
          -device pvpanic -action panic=pause -action shutdown=pause)
fi
CMD+=("${EXTRA[@]}")
trap 'rm -f "$SYMBOLS"; rm -rf "${CLEANUP[@]}"' EXIT

if [ -z "$VMCORE" ]; then
    if [ "$TIMEOUT" != 0 ]; then
        timeout -k 5 "$TIMEOUT" "${CMD[@]}"
    else
        "${CMD[@]}"
    fi
    STATUS=$?
else
    # QEMU in the background with this terminal (`<&0`: a background job
    # would get /dev/null), the core taker beside it; SIGINT/SIGTERM to
    # the runner become a core and the end of QEMU.
    # The taker ends a timed-out VM after its core; `timeout` is the
    # backstop should the taker fail.
    if [ "$TIMEOUT" != 0 ]; then
        timeout -k 5 "$((TIMEOUT + 60))" "${CMD[@]}" <&0 &
    else
        "${CMD[@]}" <&0 &
    fi
    QEMU_PID=$!
    python3 "$ROOT/boot/vmcore.py" "$QMP_DIR/qmp.sock" "$VMCORE" "$QMP_DIR/status" "$TIMEOUT" &
    TAKER_PID=$!
    trap 'kill -USR1 "$TAKER_PID" 2>/dev/null' INT TERM
    # `wait` returns early when a trapped signal arrives: wait again.
    while :; do
        wait "$QEMU_PID"
        STATUS=$?
        kill -0 "$QEMU_PID" 2>/dev/null || break
    done
    trap - INT TERM
    # The taker ends with QEMU (its socket closes); give a dump in flight
    # its time.
    wait "$TAKER_PID" 2>/dev/null
    case "$(cat "$QMP_DIR/status" 2>/dev/null)" in
        panic) echo "run-qemu.sh: kernel $(basename "$ELF") panicked (vmcore: $VMCORE)" >&2; exit 1 ;;
        shutdown) echo "run-qemu.sh: the guest reset or shut down without isa-debug-exit (triple fault?; vmcore: $VMCORE)" >&2; exit 1 ;;
        signal) echo "run-qemu.sh: stopped by a signal (vmcore: $VMCORE)" >&2; exit 130 ;;
        timeout) echo "run-qemu.sh: timed out after ${TIMEOUT} s (set MAGPIE_TIMEOUT; vmcore: $VMCORE)" >&2; exit 1 ;;
    esac
fi

case $STATUS in
    33) exit 0 ;;
    35) echo "run-qemu.sh: kernel $(basename "$ELF") reported failure" >&2 ;;
    0)  echo "run-qemu.sh: QEMU ended without isa-debug-exit (Ctrl-A X, or a triple fault or reset)" >&2 ;;
    124|137) echo "run-qemu.sh: timed out after ${TIMEOUT} s (set MAGPIE_TIMEOUT)" >&2 ;;
    *)  echo "run-qemu.sh: QEMU exited with status $STATUS" >&2 ;;
esac
exit 1
