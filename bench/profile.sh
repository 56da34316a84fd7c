#!/usr/bin/env bash
# Where an allocator's instructions go, per operation, by source line.
#
#   bench/profile.sh <workload> <allocator> [N] [min-per-op]
#
# Runs the workload under callgrind twice (N/10 and N iterations) and prints
# (Ir(N) - Ir(N/10)) / (ops(N) - ops(N/10)) for every source line (inlined
# code is charged to its own line, e.g. slab/src/magazine/mod.rs) and every
# function, so start-up and warm-up cancel out. Lines under min-per-op
# (default 0.5) are left out. Needs valgrind and python3. Builds with the
# `bench-release` profile (Cargo.toml: release, one codegen unit), as
# `make bench` does; honours CARGO_TARGET_DIR (e.g. a separate directory
# for BENCH_FEATURES=alloc-profiling so two builds do not overwrite each other).
set -euo pipefail
cd "$(dirname "$0")/.."

workload=${1:?workload}
allocator=${2:?allocator}
n=${3:-200000}
min=${4:-0.5}
# shellcheck source=bench/lib.sh
. bench/lib.sh
bench_setup

for k in small big; do
    if [ "$k" = small ]; then m=$((n / 10)); else m=$n; fi
    valgrind --tool=callgrind --dump-instr=no --compress-pos=no --compress-strings=no \
        --callgrind-out-file="$out/$k.cg" "$bin" "$workload" "$allocator" 1 --n "$m" \
        >"$out/$k.stdout" 2>"$out/$k.stderr"
done

python3 - "$out" "$workload" "$allocator" "$min" <<'EOF'
import collections, os, re, sys

out, workload, allocator, minimum = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])

def ops(kind):
    line = open(f"{out}/{kind}.stdout").read()
    return int(re.search(r"ops_per_rep=(\d+)", line).group(1))

def parse(kind):
    """Exclusive Ir per (file, line) and per function."""
    by_line = collections.Counter()
    by_fn = collections.Counter()
    fl = fi = fn = None
    skip = False
    for raw in open(f"{out}/{kind}.cg"):
        line = raw.rstrip("\n")
        if skip:  # the inclusive cost line after calls=
            skip = False
            continue
        if line.startswith("fl="):
            fl = line[3:]; fi = None
        elif line.startswith(("fi=", "fe=")):
            fi = line[3:]
        elif line.startswith("fn="):
            fn = line[3:]; fi = None
        elif line.startswith("calls="):
            skip = True
        elif line and (line[0].isdigit()):
            parts = line.split()
            if len(parts) >= 2:
                ir = int(parts[1])
                by_line[(fi or fl, int(parts[0]))] += ir
                by_fn[fn] += ir
    return by_line, by_fn

small_ops, big_ops = ops("small"), ops("big")
d = big_ops - small_ops
(sl, sf), (bl, bf) = parse("small"), parse("big")

def src(path, lineno):
    try:
        with open(path) as f:
            return f.read().splitlines()[lineno - 1].strip()[:90]
    except Exception:
        return ""

def short(path):
    cwd = os.getcwd() + "/"
    path = path.replace(cwd, "")
    return re.sub(r".*/library/", "std:", re.sub(r".*/registry/src/[^/]+/", "", path))

total = sum(bf.values()) - sum(sf.values())
print(f"# {workload} / {allocator}: {total / d:.1f} instructions per operation "
      f"({d} operations measured)\n")
print("## by function (exclusive; inlined code counts in its caller)\n")
for fn in sorted(bf, key=lambda f: -(bf[f] - sf.get(f, 0))):
    v = (bf[fn] - sf.get(fn, 0)) / d
    if v >= minimum:
        print(f"{v:7.1f}  {fn}")
print("\n## by source line (inlined code counts at its own line)\n")
for key in sorted(bl, key=lambda k: -(bl[k] - sl.get(k, 0))):
    v = (bl[key] - sl.get(key, 0)) / d
    if v >= minimum:
        path, lineno = key
        print(f"{v:7.1f}  {short(path)}:{lineno}  {src(path, lineno)}")
EOF
