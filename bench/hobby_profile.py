#!/usr/bin/env python3
"""`make bench-hobby-profile`: where each row of `make bench-hobby` spends
Magpie's instructions, by phase and by function.

    python3 bench/hobby_profile.py              # every row
    python3 bench/hobby_profile.py warm:large   # the rows whose "pass:test" has this
    TOP=40 python3 bench/hobby_profile.py       # more functions a row (default 15)

Boots examples/hobby-kernel with feature `count-trace` (release): the
counting kernel of bench/hobby.py whose #DB handler also records the
address of every instruction it counts (src/count.rs). From that trace
and the kernel's disassembly (objdump) and symbols (nm) it rebuilds the
call stack at each instruction (a `call` pushes the function it enters, a
`ret` pops, a jump into another function replaces the top: tail calls)
and prints, per row:

- the phases: each instruction charged to the first phase below whose
  function is on its stack (the phase's own and all it calls): `pressure
  reap` (Kmem::reap_for_pressure), `class creation` (create_class),
  `free-list build` (FreeList::fill_shuffled), `region pages`
  (RegionSource), `realloc copy` (memcpy), `slab memset`, `magazine
  refill` (take_object, the free list's pop, relist), `slab grow, other`
  (SlabLayer::alloc_raw), `slab free` (free_raw, free_objects,
  put_object), `depot exchange`, `miss, other` (the rest of the slow
  paths), `realloc, other`; what is on no such stack is `hit` (and
  `harness`: the counting's own instructions, which the table's figure
  does not include);
- the functions with the most instructions, their own and all they call
  (inclusive), their own (exclusive), and the calls made to them.

A row of more than 200,000 instructions (many_boxes) comes as a histogram
of addresses, not a trace: its functions' own counts only.
"""
import bisect
import collections
import os
import re
import subprocess
import sys

KERNEL = "target/x86_64-unknown-none/release/hobby-kernel"
NR_ROWS = 10
HEAD = re.compile(r"HOBBY_(TRACE|HIST) pass=(\w+) steps=(\d+) test=(.*)$")
PHASES = [
    ("reap_for_pressure", "pressure reap"),
    ("create_class", "class creation"),
    ("fill_shuffled", "free-list build"),
    ("RegionSource", "region pages"),
    ("memcpy", "realloc copy"),
    ("memset", "slab memset"),
    ("take_object", "magazine refill"),
    ("FreeList>::pop", "magazine refill"),
    ("relist", "magazine refill"),
    ("alloc_raw", "slab grow, other"),
    ("free_raw", "slab free"),
    ("free_objects", "slab free"),
    ("put_object", "slab free"),
    ("exchange_for", "depot exchange"),
    ("alloc_slow", "miss, other"),
    ("free_slow", "miss, other"),
    ("off_hit", "miss, other"),
    ("realloc", "realloc, other"),
]


def run(cmd):
    return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout


def boot():
    """The kernel's output (it exits with a failure while Magpie is slower: ignored)."""
    # Printing the traces takes a while under TCG: more than the runner's
    # default timeout (120 s) on a loaded machine.
    env = dict(os.environ, MAGPIE_TIMEOUT=os.environ.get("MAGPIE_TIMEOUT", "900"))
    out = subprocess.run(
        ["cargo", "run", "-q", "-p", "magpie-hobby-kernel", "--release", "--features", "count-trace"],
        capture_output=True, text=True, env=env,
    )
    if out.stdout.count("HOBBY_TRACE_END") != NR_ROWS:
        sys.stderr.write(out.stdout[-2000:] + out.stderr)
        sys.exit(f"bench-hobby-profile: {out.stdout.count('HOBBY_TRACE_END')} rows printed, not {NR_ROWS}")
    return out.stdout


def rows(output, text_start):
    """(kind, 'pass:test', steps, [address] or {address: count}) per row."""
    row = None
    for line in output.splitlines():
        head = HEAD.search(line)
        if head:
            kind, pass_, steps, test = head.groups()
            row = (kind, f"{pass_}:{test.strip()}", int(steps), [] if kind == "TRACE" else {})
        elif line.startswith("HOBBY_TRACE_END") and row:
            yield row
            row = None
        elif row and row[0] == "TRACE":
            row[3].extend(int(word, 16) + text_start for word in line.split())
        elif row:
            for word in line.split():
                offset, count = word.split(":")
                row[3][int(offset, 16) + text_start] = int(count)


class Kernel:
    """The kernel's functions (nm) and instructions' mnemonics (objdump)."""

    def __init__(self, path):
        self.starts, self.ends, self.names = [], [], []
        for line in sorted(run(["nm", "-C", "-S", "--defined-only", path]).splitlines()):
            parts = line.split(" ", 3)
            if len(parts) == 4 and parts[2] in "tTwW":
                start, size = int(parts[0], 16), int(parts[1], 16)
                self.starts.append(start)
                self.ends.append(start + max(size, 1))
                self.names.append(parts[3])
        order = sorted(range(len(self.starts)), key=self.starts.__getitem__)
        self.starts = [self.starts[i] for i in order]
        self.ends = [self.ends[i] for i in order]
        self.names = [self.names[i] for i in order]
        self.text_start = int(run(["sh", "-c", f"nm {path} | grep ' __text_start$'"]).split()[0], 16)
        self.mnemonic = {}
        for line in run(["objdump", "-d", "--no-show-raw-insn", "-M", "intel", path]).splitlines():
            match = re.match(r"^\s*([0-9a-f]+):\s+(\S+)", line)
            if match:
                self.mnemonic[int(match.group(1), 16)] = match.group(2)

    def function(self, address):
        i = bisect.bisect_right(self.starts, address) - 1
        if i >= 0 and address < self.ends[i]:
            return self.names[i]
        return f"?{address:x}"


def short(name):
    """A function's name without generic arguments or LLVM's suffix."""
    while True:
        shorter = re.sub(r"<[^<>]*>", "", name)
        if shorter == name:
            break
        name = shorter
    return re.sub(r"\.llvm\.\d+", "", name).strip(":") or name


def phase(stack, own):
    if "stepped_" in own:
        return "harness"
    for key, name in PHASES:
        if any(key in frame for frame in stack):
            return name
    return "hit"


def profile(kernel, trace):
    """Phases, inclusive, exclusive and call counts of an ordered trace."""
    phases, inclusive, exclusive, calls = (collections.Counter() for _ in range(4))
    stack = [kernel.function(trace[0])]
    for i, address in enumerate(trace):
        own = kernel.function(address)
        if own != stack[-1]:
            stack[-1] = own  # a jump into another function: a tail call
        phases[phase(stack, own)] += 1
        for name in {short(frame) for frame in stack}:
            inclusive[name] += 1
        exclusive[short(own)] += 1
        mnemonic = kernel.mnemonic.get(address, "")
        if i + 1 < len(trace):
            if mnemonic.startswith("call"):
                stack.append(kernel.function(trace[i + 1]))
                calls[short(stack[-1])] += 1
            elif mnemonic.startswith("ret") and len(stack) > 1:
                stack.pop()
    return phases, inclusive, exclusive, calls


def main():
    os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    want = sys.argv[1] if len(sys.argv) > 1 else ""
    top = int(os.environ.get("TOP", "15"))
    output = boot()
    kernel = Kernel(KERNEL)
    for kind, name, steps, data in rows(output, kernel.text_start):
        if want not in name:
            continue
        if kind == "TRACE":
            phases, inclusive, exclusive, calls = profile(kernel, data)
        else:
            exclusive = collections.Counter()
            for address, count in data.items():
                exclusive[short(kernel.function(address))] += count
            phases = collections.Counter(
                {"harness": sum(c for f, c in exclusive.items() if "stepped_" in f)}
            )
            phases["hit and the rest (a histogram: no stacks)"] = steps - phases["harness"]
            inclusive, calls = exclusive, collections.Counter()
        counted = steps - phases["harness"]
        print(f"== {name}: {counted:,} instructions counted ({steps:,} steps, harness {phases['harness']:,})")
        print("   phases: " + ", ".join(f"{p} {c:,}" for p, c in phases.most_common() if p != "harness"))
        print(f"   {'inclusive':>9} {'own':>8} {'calls':>6}  function")
        for function, count in inclusive.most_common(top):
            print(f"   {count:9,} {exclusive[function]:8,} {calls[function]:6,}  {function[-100:]}")


if __name__ == "__main__":
    main()
