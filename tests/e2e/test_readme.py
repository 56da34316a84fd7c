#!/usr/bin/env python3
"""The README's shell examples, replayed: nothing in it goes stale silently.

Every ```text block of README.md preceded by a marker comment

    <!-- replay: [append="BOOT ARGS"] [mem=SIZE] [numbers=any] [exit=fail] -->

is a session: its `magpie> COMMAND` lines are typed, one at a time, into a
freshly booted kernel, and the lines under each command are compared with
what the kernel prints in reply. `$ ... cargo run` / `$ make run` lines
name the boot (`MAGPIE_MEM=8M cargo run`: that memory); the lines between
the boot and the first prompt must appear at the end of the boot output.
`$ scripts/magpie-kmem ARGS` lines run the host tool on the session's
kmemtrace dump once the kernel has powered off, and their output is
compared the same way. A block marked `<!-- replay: none (REASON) -->`
is not a session (it says why). Sessions that do not exercise KFENCE boot
with `kfence.sample_interval=0` (test_shell.kernel_append: a random sample
changes `whatis` and placement); the KFENCE session keeps the default.
Unlike the other end-to-end tests, README sessions keep partitioned
kmalloc (`kmalloc!` sites in random copies, `kmalloc-rnd-NN-SIZE`), as
`make run` does.

Comparing, line by line (`compile_line`):

- a line `...` stands for any number of lines (none included);
- addresses (`0x` and 6+ hex digits, or 16 hex digits), symbol offsets (`+0x3d5`), times
  (`128058896 ns`, `18 ms`, `T+0.297228s`, `[    0.5]`), speeds
  (`756313 events/s`), amounts in KiB/MiB and the copy number NN of a
  random kmalloc cache (`kmalloc-rnd-NN-64`) match any value: they change
  with every build and every run;
- every other number must be the same, unless the block says
  `numbers=any` (for sessions whose counts depend on timing, e.g. a
  two-CPU `stress`); a `FILE:LINE`'s line is exact even then;
- runs of spaces match runs of spaces (columns widen with their values);
- a command's trailing `  (remark)` is the README's, not typed.

An address the README shows in a command (`kmem whatis 0x...`) is
replaced by the address the kernel printed in its place earlier in the
session (plus the same offset), and a `kmalloc-rnd-NN-` the README shows
in a command by the copy the kernel printed in its place, so examples may
refer to what they got.

`ReadmeSourceLines` checks every `FILE:LINE` the README names against
the code: the file has that line, and where the README names the
function too (`func:NAME` of the code tag layout, or `NAME+0x..  FILE:LINE`
of the reports), the line lies in that function (or in the macro body the
tools name for macro call sites).

Run after `cargo build --bin magpie` (``make test-e2e`` does both).
"""
import os
import re
import select
import shlex
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_shell import KERNEL, PROMPT, ROOT, RUNNER, kernel_append  # noqa: E402

README = os.path.join(ROOT, "README.md")
MAGPIE_KMEM = os.path.join(ROOT, "scripts", "magpie-kmem")
MARKER = re.compile(r"^<!-- replay:\s*(.*?)\s*-->\s*$")

# Values that differ between builds and runs: each matches any value of its kind.
VOLATILE = [
    (r"\+0x[0-9a-f]+", r"\+0x[0-9a-f]+"),  # symbol offset
    (r"0x[0-9a-f]{6,16}", r"0x[0-9a-f]+"),  # address, checksum
    (r"\b[0-9a-f]{16}\b", r"[0-9a-f]{16}"),  # address without 0x (findleaks' BUFCTL)
    (r"T\+\d+(?:\.\d+)? ?(?:ns|us|µs|ms|s)\b", r"T\+\d+(?:\.\d+)? ?(?:ns|us|µs|ms|s)\b"),
    (r"\[ *\d+\.\d+\]", r"\[ *\d+\.\d+\]"),  # log timestamp
    (r"\d+(?:\.\d+)? ?(?:ns|us|µs|ms|s)\b", r"\d+(?:\.\d+)? ?(?:ns|us|µs|ms|s)\b"),
    (r"\d+(?:\.\d+)? (?:events/s|KiB/s|MiB/s)", r"\d+(?:\.\d+)? (?:events/s|KiB/s|MiB/s)"),
    (r"\d+(?:\.\d+)? ?(?:KiB|MiB)\b", r"\d+(?:\.\d+)? ?(?:KiB|MiB)\b"),
    (r"kmalloc-rnd-\d\d-", r"kmalloc-rnd-\d\d-"),  # a kmalloc! site's copy, drawn at boot
]
# (Not a line number: `FILE:LINE` stays exact even with numbers=any.)
NUMBER = (r"(?<![\w.:-])[+-]?\d[\d,]*(?:\.\d+)?%?", r"[+-]?\d[\d,]*(?:\.\d+)?%?")
ADDRESS = re.compile(r"0x[0-9a-f]{6,16}")
COPY = re.compile(r"kmalloc-rnd-(\d\d)-")


def compile_line(line, any_number=False):
    """The regex one expected line stands for (see the module doc)."""
    kinds = VOLATILE + ([NUMBER] if any_number else [])
    token = re.compile("|".join(f"({pattern})" for pattern, _ in kinds))
    out, at = [], 0
    stripped = line.rstrip()
    for match in token.finditer(stripped):
        out.append(_literal(stripped[at:match.start()]))
        out.append(kinds[match.lastindex - 1][1])
        at = match.end()
    out.append(_literal(stripped[at:]))
    return re.compile("^" + "".join(out) + r"\s*$")


def _literal(text):
    """Literal text, each run of spaces matching any run (a leading run, none too)."""
    parts = re.split(r"( +)", text)
    out = [" +" if part.startswith(" ") else re.escape(part) for part in parts]
    if out and out[0] == "" and len(out) > 1:
        out[1] = " *"
    return "".join(out)


def match_lines(expected, actual, any_number=False):
    """Whether `actual` (lines) matches `expected` (lines, `...` = any run).
    Returns None on a match, else a message naming the first line that
    could not be matched."""
    patterns = [None if line.strip() == "..." else compile_line(line, any_number) for line in expected]
    actual = [line.rstrip() for line in actual]
    while actual and not actual[-1]:
        actual.pop()
    best = [0]

    def go(i, j):
        best[0] = max(best[0], i)
        if i == len(patterns):
            return j == len(actual)
        if patterns[i] is None:
            return any(go(i + 1, k) for k in range(j, len(actual) + 1))
        return j < len(actual) and patterns[i].match(actual[j]) is not None and go(i + 1, j + 1)

    if go(0, 0):
        return None
    if best[0] >= len(expected):
        return "the kernel printed more lines than the README shows"
    return f"README line {expected[best[0]]!r} has no match"


class Session:
    """A kernel on the serial console, typed at one line at a time."""

    def __init__(self, append=None, mem=None, kmemtrace=None, timeout=180):
        env = dict(os.environ, MAGPIE_TIMEOUT=str(timeout))
        for key, value in [("MAGPIE_APPEND", append), ("MAGPIE_MEM", mem), ("MAGPIE_KMEMTRACE", kmemtrace)]:
            if value is not None:
                env[key] = value
        self.proc = subprocess.Popen([RUNNER, KERNEL], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        self.deadline = time.monotonic() + timeout + 30
        self.buffer = b""

    def read_until_prompt(self):
        """Output up to the next prompt (None: the kernel ended first)."""
        marker = PROMPT.encode()
        while True:
            at = self.buffer.find(marker)
            if at >= 0:
                text, self.buffer = self.buffer[:at], self.buffer[at + len(marker):]
                return text.decode(errors="replace").replace("\r\n", "\n")
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise AssertionError("the kernel did not print its prompt in time")
            ready, _, _ = select.select([self.proc.stdout], [], [], left)
            chunk = os.read(self.proc.stdout.fileno(), 65536) if ready else b""
            if not chunk:
                return None
            self.buffer += chunk

    def rest(self):
        """Everything printed until the kernel exits; (exit code, text)."""
        data = self.buffer + self.proc.stdout.read()
        self.buffer = b""
        return self.proc.wait(), data.decode(errors="replace").replace("\r\n", "\n")

    def type(self, line):
        self.proc.stdin.write(line.encode() + b"\n")
        self.proc.stdin.flush()

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc.stdin.close()
        self.proc.stdout.close()


def parse_options(text):
    options = {}
    for word in shlex.split(text):
        key, _, value = word.partition("=")
        options[key] = value
    return options


def readme_blocks():
    """[(line number, options, [lines])] of the marked blocks, and the
    line numbers of unmarked ```text blocks holding a `magpie>` prompt."""
    with open(README) as f:
        lines = f.read().splitlines()
    blocks, unmarked = [], []
    i = 0
    while i < len(lines):
        if lines[i].startswith("```"):
            start = i
            i += 1
            body = []
            while i < len(lines) and not lines[i].startswith("```"):
                body.append(lines[i])
                i += 1
            marker = MARKER.match(lines[start - 1]) if start > 0 else None
            if marker:
                blocks.append((start + 1, marker.group(1), body))
            elif lines[start].startswith("```text") and any(line.startswith(PROMPT) for line in body):
                unmarked.append(start + 1)
        i += 1
    return blocks, unmarked


def parse_session(body):
    """Boot settings, [(command, expected lines)] and [(host argv, expected lines)]."""
    boot = {"env": {}, "banner": []}
    commands, host = [], []
    current = boot["banner"]
    for line in body:
        if line.startswith("$ "):
            words = shlex.split(line[2:].split("  #")[0])
            env = {}
            while words and re.match(r"^[A-Z_]+=", words[0]):
                key, _, value = words.pop(0).partition("=")
                env[key] = value
            if words[:2] in (["cargo", "run"], ["make", "run"]):
                boot["env"] = env
                current = boot["banner"]
            else:
                host.append((words, []))
                current = host[-1][1]
        elif line.startswith(PROMPT):
            command = re.sub(r" {2,}\(.*\)$", "", line[len(PROMPT):]).strip()
            commands.append((command, []))
            current = commands[-1][1]
        else:
            current.append(line)
    return boot, commands, host


def substitute_addresses(command, seen):
    """`command` with each README address replaced by the kernel's (see the module doc)."""
    def replace(match):
        want = int(match.group(0), 16)
        bases = [base for base in seen if base <= want < base + 0x1000]
        if not bases:
            return match.group(0)
        base = max(bases)
        return hex(seen[base] + want - base)
    return ADDRESS.sub(replace, command)


def substitute_copies(command, copies):
    """`command` with each README `kmalloc-rnd-NN-` replaced by the copy
    the kernel printed in its place (see the module doc)."""
    return COPY.sub(lambda match: f"kmalloc-rnd-{copies.get(match.group(1), match.group(1))}-", command)


def learn_copies(expected, actual, copies):
    """Pairs the README's random kmalloc copies with the kernel's, line by line."""
    for want, got in zip(expected, actual):
        ours, theirs = COPY.findall(want), COPY.findall(got)
        if ours and len(ours) == len(theirs):
            for a, b in zip(ours, theirs):
                copies.setdefault(a, b)


def learn_addresses(expected, actual, seen):
    """Pairs the README's addresses with the kernel's, line by line where both have them."""
    for want, got in zip(expected, actual):
        ours, theirs = ADDRESS.findall(want), ADDRESS.findall(got)
        if ours and len(ours) == len(theirs):
            for a, b in zip(ours, theirs):
                seen.setdefault(int(a, 16), int(b, 16))


class ReadmeSessions(unittest.TestCase):
    """Each marked README session, replayed on a fresh kernel (see the module doc)."""

    def test_every_shell_session_is_marked(self):
        blocks, unmarked = readme_blocks()
        self.assertTrue(blocks)
        self.assertEqual(unmarked, [], "README.md blocks with a magpie> prompt and no <!-- replay: ... --> marker")

    def test_matcher(self):
        self.assertIsNone(match_lines(["a 0xffff800000600000 at 12 ns", "...", "6 objects"],
                                      ["a 0xffff8000006f9040 at 128058896 ns", "x", "y", "6 objects"]))
        self.assertIsNotNone(match_lines(["6 objects"], ["7 objects"]))
        self.assertIsNone(match_lines(["time=T+1.255 s  x"], ["time=T+844.347 ms  x"]))
        self.assertIsNone(match_lines(["6 objects   384 bytes"], ["7 objects 1384 bytes"], any_number=True))
        self.assertIsNotNone(match_lines(["kmalloc-64"], ["kmalloc-96"], any_number=True))
        self.assertIsNotNone(match_lines(["640 kernel/src/a.rs:122"], ["640 kernel/src/a.rs:125"], any_number=True))
        self.assertEqual(substitute_addresses("kmem whatis 0x1000050", {0x1000000: 0x2000000}),
                         "kmem whatis 0x2000050")
        self.assertIsNone(match_lines(["3 kmalloc-rnd-05-64"], ["3 kmalloc-rnd-02-64"]))
        self.assertIsNotNone(match_lines(["3 kmalloc-rnd-05-64"], ["3 kmalloc-rnd-02-96"]))
        copies = {}
        learn_copies(["0x1 is allocated from kmalloc-rnd-05-64"], ["0x2 is allocated from kmalloc-rnd-02-64"], copies)
        self.assertEqual(substitute_copies("kmemtrace start kmalloc-rnd-05-64", copies),
                         "kmemtrace start kmalloc-rnd-02-64")

    def test_replay(self):
        if not os.path.exists(KERNEL):
            self.skipTest(f"{KERNEL} not built; run `cargo build --bin magpie`")
        blocks, _ = readme_blocks()
        for number, options_text, body in blocks:
            options = parse_options(options_text)
            if "none" in options:
                continue
            with self.subTest(readme_line=number):
                self.replay(number, options, body)

    def replay(self, number, options, body):
        boot, commands, host = parse_session(body)
        any_number = options.get("numbers") == "any"
        with tempfile.TemporaryDirectory() as tmp:
            dump = os.path.join(tmp, "latest.kmt")
            session = Session(append=kernel_append(options.get("append", boot["env"].get("MAGPIE_APPEND")),
                                                   [command for command, _ in commands], random_kmalloc=True),
                              mem=options.get("mem", boot["env"].get("MAGPIE_MEM")),
                              kmemtrace=dump)
            try:
                seen, copies = {}, {}
                banner = session.read_until_prompt()
                if banner is None:
                    code, banner = session.rest()
                    self.assertEqual(options.get("exit"), "fail", f"README:{number}: no prompt:\n{banner}")
                    self.assertNotEqual(code, 0, banner)
                    self.assertEqual(commands, [], f"README:{number}: commands after a failed boot")
                elif options.get("exit") == "fail":
                    self.fail(f"README:{number}: the boot was to fail:\n{banner}")
                if boot["banner"]:
                    tail = banner.splitlines()[-len(boot["banner"]):]
                    self.check(number, "boot", boot["banner"], tail, any_number)
                for command, expected in commands:
                    session.type(substitute_copies(substitute_addresses(command, seen), copies))
                    reply = session.read_until_prompt()
                    if reply is None:
                        _, reply = session.rest()
                    actual = reply.splitlines()[1:]  # the echoed command
                    if command == "poweroff":
                        actual = [line for line in actual if not line.startswith("run-qemu.sh:")]
                    self.check(number, command, expected, actual, any_number)
                    learn_addresses(expected, actual, seen)
                    learn_copies(expected, actual, copies)
                if commands and commands[-1][0] != "poweroff":
                    session.type("poweroff")
                if commands:
                    code, rest = session.rest()
                    self.assertEqual(code, 0, f"README:{number}: exit {code}:\n{rest}")
            finally:
                session.close()
            for argv, expected in host:
                self.assertEqual(argv[0], "scripts/magpie-kmem", argv)
                args = [dump if arg == "target/kmemtrace/latest.kmt" else arg for arg in argv[1:]]
                result = subprocess.run([MAGPIE_KMEM, "--kernel", KERNEL, *args], stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, cwd=ROOT)
                out = result.stdout.decode(errors="replace")
                self.assertEqual(result.returncode, 0, f"README:{number}: {' '.join(argv)}:\n{out}{result.stderr}")
                self.check(number, " ".join(argv), expected, out.splitlines(), any_number)

    def check(self, number, what, expected, actual, any_number):
        problem = match_lines(expected, actual, any_number)
        if problem:
            self.fail(f"README.md:{number}: {what!r}: {problem}; the kernel printed:\n" + "\n".join(actual))


SOURCE = re.compile(r"((?:kernel|slab|codetag|tools|kmemtrace-format)/[\w/.-]+\.rs):(\d+)")
FUNC_TAG = re.compile(r"func:(\w+)")
SYMBOL = re.compile(r"([\w:<>{}#]+?)\+0x[0-9a-f]+\s+$")


def enclosing_item(lines, number):
    """The names of the `fn` (or `macro_rules!`) whose body holds line
    `number` (1-based): the fn's own and the one its attributes export it
    as (`#[unsafe(export_name = "kmain")]`)."""
    for at in range(number - 1, -1, -1):
        found = re.search(r"\bfn (\w+)|macro_rules! (\w+)", lines[at])
        if found:
            if found.group(2):
                return [found.group(2) + "!"]
            names = [found.group(1)]
            for attribute in lines[max(0, at - 3):at]:
                names += re.findall(r'export_name = "(\w+)"', attribute)
            return names
    return []


class ReadmeSourceLines(unittest.TestCase):
    """Every FILE:LINE the README names exists and holds what it says."""

    def test_every_file_line_holds_its_function(self):
        with open(README) as f:
            text = f.read()
        checked = 0
        problems = []
        for readme_number, line in enumerate(text.splitlines(), 1):
            for match in SOURCE.finditer(line):
                path, number = match.group(1), int(match.group(2))
                full = os.path.join(ROOT, path)
                if not os.path.exists(full):
                    problems.append(f"README:{readme_number}: {path} does not exist")
                    continue
                with open(full) as f:
                    lines = f.read().splitlines()
                if number > len(lines) or not lines[number - 1].strip():
                    problems.append(f"README:{readme_number}: {path}:{number} is not a line of code")
                    continue
                tag = FUNC_TAG.match(line[match.end():].lstrip())
                symbol = SYMBOL.search(line[:match.start()])
                want = tag.group(1) if tag else symbol.group(1).split("::")[-1] if symbol else None
                if want is None:
                    continue
                items = enclosing_item(lines, number)
                if want not in items and not any(item.endswith("!") for item in items):
                    problems.append(f"README:{readme_number}: {path}:{number} is in {items}, not {want}")
                checked += 1
        self.assertEqual(problems, [])
        self.assertGreater(checked, 5)


if __name__ == "__main__":
    unittest.main(argv=sys.argv)
