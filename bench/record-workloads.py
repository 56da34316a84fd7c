#!/usr/bin/env python3
"""Record the kernel workloads of the replay (docs/BENCHMARKS.md "Replay
of recorded workloads") as kmemtrace dumps in bench/workloads/ (committed:
each well under 1 MB; run this again when the kernel's allocations change).

    bench/record-workloads.py [--out DIR] [NAME ...]

The kernel's own work, booted in QEMU (the debug kernel of
`cargo build --bin magpie`, as the shell tests boot it; KFENCE off so no
sample lands at random), each dump sent with `kmemtrace dump` over the
dump channel (MAGPIE_KMEMTRACE, as tests/e2e/test_kmemtrace.py does):

- boot:   recording from boot (`kmemtrace=on`) to the first prompt, 2 CPUs;
- stress: `stress --cpus all --ops 4000` on 4 CPUs (a random alloc/free
          mix, a quarter of the frees crossing CPUs);
- shell:  the shell's heaviest reports and commands (kmemstat, slabinfo,
          slabtop --once, allocinfo, cpus, kmem verify all, kmem findleaks,
          kmalloc/kfree of 200 objects), 2 CPUs.

The two Rust-heap workloads (heap-tests, btree-vec) are recorded on the
host by `magpie-bench record` when the suite runs (bench/src/record.rs);
they are too big to commit and take a second to make.

The script fails if QEMU or the kernel fails or no dump arrives.
"""

import argparse
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "e2e"))

from test_shell import boot  # noqa: E402

OUT = os.path.join(ROOT, "bench", "workloads")

SHELL_COMMANDS = [
    "kmemstat",
    "slabinfo",
    "slabtop --once",
    "allocinfo",
    "cpus",
    "kmem verify all",
    "kmem findleaks",
    "kmalloc 96 200",
    "kfree all",
    "kmalloc 3000 20",
    "kfree all",
]

# name -> (CPUs, kernel arguments, lines typed)
KERNEL_WORKLOADS = {
    "boot": (2, "kmemtrace=on", ["kmemtrace record stop", "kmemtrace dump", "poweroff"]),
    "stress": (4, None, ["kmemtrace record start", "stress --cpus all --ops 4000",
                         "kmemtrace record stop", "kmemtrace dump", "poweroff"]),
    "shell": (2, None, ["kmemtrace record start", *SHELL_COMMANDS,
                        "kmemtrace record stop", "kmemtrace dump", "poweroff"]),
}
ALL = list(KERNEL_WORKLOADS)


def record_kernel(name, path):
    cpus, append, script = KERNEL_WORKLOADS[name]
    os.environ["MAGPIE_KMEMTRACE"] = path
    os.environ["MAGPIE_SMP"] = str(cpus)
    try:
        code, out = boot(script, timeout=300, append=append)
    finally:
        del os.environ["MAGPIE_KMEMTRACE"]
        del os.environ["MAGPIE_SMP"]
    if "error:" in out or not os.path.exists(path) or os.path.getsize(path) == 0:
        tail = "\n".join(out.splitlines()[-20:])
        raise SystemExit(f"record {name}: the session failed (exit {code}):\n{tail}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=OUT, help="directory of the dumps (default bench/workloads)")
    parser.add_argument("names", nargs="*", default=ALL, help=" ".join(ALL))
    args = parser.parse_args()
    unknown = [n for n in args.names if n not in ALL]
    if unknown:
        raise SystemExit(f"unknown workload(s) {' '.join(unknown)}; known: {' '.join(ALL)}")
    os.makedirs(args.out, exist_ok=True)
    subprocess.run(["cargo", "build", "-q", "--bin", "magpie"], cwd=ROOT, check=True)
    for name in args.names:
        path = os.path.abspath(os.path.join(args.out, f"{name}.kmt"))
        record_kernel(name, path)
        print(f"{name}: {os.path.getsize(path)} bytes -> {os.path.relpath(path, ROOT)}")


if __name__ == "__main__":
    main()
