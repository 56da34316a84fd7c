#!/usr/bin/env python3
"""The kernel's hit functions, disassembled with addresses normalized.

    cargo build --release --bin magpie
    python3 bench/kernel-hit.py target/x86_64-unknown-none/release/magpie > hit.txt

Prints the four functions docs/BENCHMARKS.md ("The hit in the kernel, by
disassembly") counts by hand: `GlobalAlloc::alloc` and `::dealloc` of the
kernel's `Allocator<KernelPlatform>`, and the profiled hits
`KmemCache::alloc_profiled::<*mut u8, true, ..>` (a cache whose slab header
is in the page, as kmalloc-64's; the profiled free is inline in `dealloc`,
behind its `TAGGED` test) and `KmemCache::free_off_hit::<()>`.
Offsets are from each function's start; branch targets, RIP-relative and
absolute addresses are replaced by placeholders, module paths are dropped.
Two builds whose outputs `diff` equal run the same instructions on every
path, so a hand count made on one holds for the other (struct field
offsets are kept: a moved hot field shows up).
"""
import re
import subprocess
import sys

FUNCTIONS = [
    r"as core::alloc::global::GlobalAlloc>::alloc>:$",
    r"as core::alloc::global::GlobalAlloc>::dealloc>:$",
    r">::alloc_profiled::<\*mut u8, true, .*>>:$",
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


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: bench/kernel-hit.py KERNEL_ELF")
    dis = subprocess.run(
        ["objdump", "-d", "-M", "intel", "-C", "--no-show-raw-insn", sys.argv[1]],
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
