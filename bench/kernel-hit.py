#!/usr/bin/env python3
"""The kernel's hit functions, disassembled with addresses normalized.

    python3 bench/kernel-hit.py > hit.txt            # builds and reads the test kernel
    python3 bench/kernel-hit.py KERNEL_ELF > hit.txt # any image that has the functions

Without an argument it builds `tests/kernel_hit.rs` (release, `cargo test
--no-run`) and reads that test kernel: the very functions the test
single-steps (it calls them through function pointers, so they exist as
functions there; in the kernel image `__rust_alloc` inlines them).

Prints the three functions docs/BENCHMARKS.md ("The hit in the kernel, by
disassembly") counts: `GlobalAlloc::alloc` and `::dealloc` of the kernel's
`Allocator<KernelPlatform>` (with the usual profiled alloc inlined into
the first, `AllocOut::INLINE_PROFILED`, and the profiled free inline in
the second, behind its hot-flags test: kmalloc-64's one-page slabs keep
their header in the page) and `KmemCache::free_off_hit::<()>` (the other
flagged frees).
Offsets are from each function's start; branch targets, RIP-relative and
absolute addresses are replaced by placeholders, module paths are dropped.
Two builds whose outputs `diff` equal run the same instructions on every
path, so a hand count made on one holds for the other (struct field
offsets are kept: a moved hot field shows up).
"""
import json
import re
import subprocess
import sys

FUNCTIONS = [
    r"as core::alloc::global::GlobalAlloc>::alloc>:$",
    r"as core::alloc::global::GlobalAlloc>::dealloc>:$",
    r">::free_off_hit::<\(\)>>:$",
]


def normalize(ins):
    ins = re.sub(r"\s+", " ", ins.strip())
    ins = re.sub(r"\b(0x)?ffffffff[0-9a-f]{8}\b", "ADDR", ins)  # absolute (kernel text/data)
    ins = re.sub(r"-0x7f[0-9a-f]{6}\b", "-ADDR", ins)  # sign-extended absolute displacement
    target = re.search(r" <(.*)>$", ins)
    if target:  # a branch target: keep only its offset into the function
        offset = re.search(r"\+(0x[0-9a-f]+)$", target.group(1))
        ins = ins[: target.start()] + (f" <+{offset.group(1)}>" if offset else " <function>")
    ins = re.sub(r"rip\+0x[0-9a-f]+", "rip+X", ins)
    return re.sub(r"\s*# .*$", "", ins)


def test_kernel():
    """Build tests/kernel_hit.rs (release) and return its executable."""
    out = subprocess.run(
        ["cargo", "test", "--release", "-p", "magpie", "--test", "kernel_hit",
         "--no-run", "--message-format=json"],
        capture_output=True, text=True, check=True,
    ).stdout
    for line in out.splitlines():
        msg = json.loads(line)
        if msg.get("reason") == "compiler-artifact" and msg.get("executable") \
                and msg["target"]["name"] == "kernel_hit":
            return msg["executable"]
    sys.exit("kernel-hit: cargo built no kernel_hit test kernel")


def main():
    if len(sys.argv) > 2:
        sys.exit("usage: bench/kernel-hit.py [KERNEL_ELF]")
    elf = sys.argv[1] if len(sys.argv) == 2 else test_kernel()
    dis = subprocess.run(
        ["objdump", "-d", "-M", "intel", "-C", "--no-show-raw-insn", elf],
        capture_output=True, text=True, check=True,
    ).stdout.splitlines()
    for pattern in FUNCTIONS:
        start = next((i for i, line in enumerate(dis) if re.search(pattern, line)), None)
        if start is None:
            sys.exit(f"kernel-hit: no function matches {pattern!r} (inlined or renamed?)")
        base = int(dis[start].split()[0], 16)
        name = dis[start].split(" ", 1)[1]
        print("==", re.sub(r"\b(?:[a-z_0-9]+::)+(?=[A-Z])", "", name))
        count = 0
        for line in dis[start + 1:]:
            if not line.strip():
                break
            addr, _, ins = line.partition(":\t")
            print(f"{int(addr, 16) - base:5x} {normalize(ins)}")
            count += 1
        print(f"   ({count} instructions in the function, every path)")


if __name__ == "__main__":
    main()
