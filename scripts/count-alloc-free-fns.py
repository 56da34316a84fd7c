#!/usr/bin/env python3
"""Count the functions named `*alloc*`/`*free*` in slab/src, without tests.

Issue 29's figure: `fn` names matching `(alloc|free)` in the tracked
files of `slab/src`, leaving out the test files (`.../tests/...`,
`*tests.rs`) and every item attributed `#[cfg(test)]` in the others
(the `mod tests { ... }` blocks, test-only helper functions), found by a
brace-depth scan. Prints the total, then one `count path` line a file
(largest first); `-v` adds the names.

    scripts/count-alloc-free-fns.py [-v] [ROOT]

ROOT is the repository (default: the one holding this script).
"""

import re
import signal
import subprocess
import sys
from pathlib import Path

FN = re.compile(r"\bfn ([a-z0-9_]*(?:alloc|free)[a-z0-9_]*)")
# What a brace count must not see: line comments, string and char literals.
NOISE = re.compile(r'//.*$|"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])\'')


def code(line):
    """The line without comments and literals (for counting braces)."""
    return NOISE.sub("", line)


def names(text):
    """The matching `fn` names of one file, outside `#[cfg(test)]` items."""
    lines = text.splitlines()
    found = []
    i = 0
    while i < len(lines):
        if lines[i].strip() == "#[cfg(test)]":
            # Skip the attributed item: up to its `;` if it has no body,
            # else to the `}` that closes its first `{`.
            depth = 0
            opened = False
            i += 1
            while i < len(lines):
                stripped = code(lines[i])
                depth += stripped.count("{") - stripped.count("}")
                opened = opened or "{" in stripped
                i += 1
                if opened and depth <= 0:
                    break
                if not opened and stripped.rstrip().endswith(";"):
                    break
            continue
        found += FN.findall(code(lines[i]))
        i += 1
    return found


def main(argv):
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `| head` ends quietly
    verbose = "-v" in argv
    args = [a for a in argv if a != "-v"]
    root = Path(args[0]) if args else Path(__file__).resolve().parent.parent
    files = subprocess.run(
        ["git", "ls-files", "slab/src"], cwd=root, check=True,
        capture_output=True, text=True,
    ).stdout.split()
    counts = []
    for path in files:
        if "/tests/" in path or path.endswith("tests.rs") or not path.endswith(".rs"):
            continue
        found = names((root / path).read_text())
        if found:
            counts.append((len(found), path, found))
    counts.sort(key=lambda c: (-c[0], c[1]))
    print(sum(c[0] for c in counts))
    for count, path, found in counts:
        print(f"{count:4} {path}" + (f"  {' '.join(found)}" if verbose else ""))


if __name__ == "__main__":
    main(sys.argv[1:])
