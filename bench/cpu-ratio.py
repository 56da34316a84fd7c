#!/usr/bin/env python3
"""Net CPU-time ratios of one workload between allocators or builds, by the
suite's own method (bench/src/suite.rs `cpu_per_op`), with more rounds.

    bench/cpu-ratio.py WORKLOAD N ROUNDS LABEL=BIN:ALLOCATOR ...

Each LABEL=BIN:ALLOCATOR runs `BIN WORKLOAD ALLOCATOR 1 --n M` as fresh
processes at M = N/5 and M = N; CPU time (user + system of the finished
child, getrusage) is differenced between the two and divided by the
difference in operations, so start-up, init and the window fill cancel.
Every round runs every configuration once, in an order shuffled per
round. A configuration labelled `null` (the harness alone) is subtracted
per round; the first configuration is the reference: each line prints
its median raw and net nanoseconds per operation and the median (min-max
over rounds) of its net time over the reference's, and a 95 % bootstrap
interval of that median (2,000 resamples of the rounds, seeded): an
interval that holds a threshold cannot say on which side the ratio is.

Example (issue 18: magpie against mimalloc on `mixed`, and a build of an
older commit, through the same binary's harness):

    cargo build -p magpie-bench --profile bench-release --target x86_64-unknown-linux-gnu
    B=target/x86_64-unknown-linux-gnu/bench-release/magpie-bench
    bench/cpu-ratio.py mixed 30000000 21 mimalloc=$B:mimalloc magpie=$B:magpie null=$B:null

Time on this 2-vCPU VM is noisy: a ratio whose range spans 1 is noise.
"""
import random
import re
import resource
import statistics
import subprocess
import sys


def usage():
    print(__doc__, file=sys.stderr)
    sys.exit(2)


def children_cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run(binary, workload, allocator, n):
    """(operations, CPU seconds) of one fresh process."""
    before = children_cpu()
    out = subprocess.run(
        [binary, workload, allocator, "1", "--n", str(n)],
        capture_output=True, text=True, check=True,
    ).stdout
    ops = re.search(r"ops_per_rep=(\d+)", out)
    if not ops:
        sys.exit(f"cpu-ratio: no RESULT line from {binary} {workload} {allocator}")
    return int(ops.group(1)), children_cpu() - before


def bootstrap_median(xs, resamples=2000):
    """95 % percentile-bootstrap interval of the median of `xs`."""
    rng = random.Random(0xB007)
    medians = sorted(
        statistics.median(rng.choices(xs, k=len(xs))) for _ in range(resamples)
    )
    return medians[int(0.025 * resamples)], medians[int(0.975 * resamples) - 1]


def main():
    if len(sys.argv) < 5:
        usage()
    workload, n, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    configs = []
    for spec in sys.argv[4:]:
        label, sep, rest = spec.partition("=")
        binary, sep2, allocator = rest.rpartition(":")
        if not sep or not sep2 or not label:
            sys.exit(f"cpu-ratio: {spec!r} is not LABEL=BIN:ALLOCATOR")
        configs.append((label, binary, allocator))
    ns = {label: [] for label, _, _ in configs}
    for r in range(rounds):
        order = list(configs)
        random.Random(0x5EED ^ r).shuffle(order)
        for label, binary, allocator in order:
            ops1, cpu1 = run(binary, workload, allocator, max(n // 5, 1))
            ops2, cpu2 = run(binary, workload, allocator, n)
            ns[label].append((cpu2 - cpu1) / (ops2 - ops1) * 1e9)
    ref = configs[0][0]
    null = ns.get("null")
    print(f"# {workload}, N={n}, {rounds} rounds; net = raw - null per round; ratio = net / {ref}'s net")
    for label, _, _ in configs:
        line = f"{label:12s} raw {statistics.median(ns[label]):6.3f} ns/op"
        if null and label != "null":
            nets = [x - h for x, h in zip(ns[label], null)]
            refs = [x - h for x, h in zip(ns[ref], null)]
            ratios = sorted(a / b for a, b in zip(nets, refs))
            lo, hi = bootstrap_median(ratios)
            line += (f"  net {statistics.median(nets):6.3f}"
                     f"  ratio {statistics.median(ratios):.3f} ({ratios[0]:.2f}-{ratios[-1]:.2f})"
                     f"  95% CI of the median {lo:.3f}-{hi:.3f}")
        print(line)


if __name__ == "__main__":
    main()
