#!/usr/bin/env bash
# Cache misses per operation by function, as cachegrind simulates them.
#
#   bench/misses.sh <workload> <allocator> [N] [-- bench options...]
#
# Runs the workload under `valgrind --tool=cachegrind --cache-sim=yes`
# twice (N/10 and N iterations) and prints, for every function with at
# least 0.01 of a miss per operation, the difference per operation of
# D1 misses (reads + writes) and last-level misses (data), so start-up and
# the fill cancel out. Bench options after `--` go to both runs, e.g.
# `-- --slots 1048576` for a window of 1Mi live objects (issue 18: the
# misses of a free far from its allocation). BENCH_BIN=path runs a binary
# built before (another commit's) instead of building. Needs valgrind and
# python3.
set -euo pipefail
cd "$(dirname "$0")/.."

workload=${1:?workload}
allocator=${2:?allocator}
n=${3:-200000}
shift $(( $# < 3 ? $# : 3 ))
if [ "${1:-}" = "--" ]; then shift; fi
# shellcheck source=bench/lib.sh
. bench/lib.sh
bench_setup

for k in small big; do
    if [ "$k" = small ]; then m=$((n / 10)); else m=$n; fi
    valgrind --tool=cachegrind --cache-sim=yes --cachegrind-out-file="$out/$k.cg" \
        "$bin" "$workload" "$allocator" 1 --n "$m" "$@" >"$out/$k.stdout" 2>"$out/$k.stderr"
done

python3 - "$out" "$workload" "$allocator" <<'EOF'
import collections, re, sys

out, workload, allocator = sys.argv[1:4]

def ops(kind):
    return int(re.search(r"ops_per_rep=(\d+)", open(f"{out}/{kind}.stdout").read()).group(1))

def parse(kind):
    events, by_fn, fn = None, collections.defaultdict(collections.Counter), None
    for line in open(f"{out}/{kind}.cg"):
        if line.startswith("events:"):
            events = line.split()[1:]
        elif line.startswith("fn="):
            fn = line[3:].strip()
        elif line[:1].isdigit() and fn is not None:
            values = [int(v) for v in line.split()[1:]]
            for name, v in zip(events, values):
                by_fn[fn][name] += v
    return by_fn

d = ops("big") - ops("small")
small, big = parse("small"), parse("big")
def per(fn, names):
    return sum(big[fn][e] - small.get(fn, collections.Counter())[e] for e in names) / d
rows = [(fn, per(fn, ["Ir"]), per(fn, ["D1mr", "D1mw"]), per(fn, ["DLmr", "DLmw"])) for fn in big]
total = [sum(r[i] for r in rows) for i in (1, 2, 3)]
print(f"# {workload} / {allocator}: per operation ({d} operations measured)\n")
print(f"{'Ir':>8} {'D1 miss':>8} {'LL miss':>8}  function")
print(f"{total[0]:8.1f} {total[1]:8.2f} {total[2]:8.2f}  (all)")
for fn, ir, d1, ll in sorted(rows, key=lambda r: -r[2]):
    if d1 >= 0.01 or ll >= 0.01:
        print(f"{ir:8.1f} {d1:8.2f} {ll:8.2f}  {fn}")
EOF
