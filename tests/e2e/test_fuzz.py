#!/usr/bin/env python3
"""Shell fuzz test: boot the real kernel once and type a few thousand random
and crafted lines on its serial console (control bytes, non-ASCII, huge
numbers, signs, tabs, overlong lines, extra arguments, unknown words, random
bytes). Checks, line by line:

* exactly one prompt comes back per line typed, and the kernel never panics;
* a line known to be bad gets exactly one line of reply, starting `error:`
  (and for refused bytes, the byte and column named are the first bad ones);
* a line known to be good gets no `error:` line;
* a random line gets at most one `error:` line.

Seeded (MAGPIE_FUZZ_SEED, default 1; MAGPIE_FUZZ_LINES, default 3000), so a
failure can be replayed. Run after `cargo build --bin magpie`
(``make test-e2e`` does both).
"""
import os
import random
import re
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_shell import KERNEL, PROMPT, boot  # noqa: E402

MAX_LINE = 200
COMMANDS = ["help", "kmemstat", "slabinfo", "kmemtrace", "kmalloc", "kfree", "leak", "allocinfo",
            "timestats", "cpus", "stress", "poweroff"]
# Lines that must succeed whatever state the random lines left (none of
# them needs memory).
GOOD = ["help", "  help  ", "help\t", "\tcpus", "cpus", "timestats", "allocinfo --top 3",
        "allocinfo --sort calls --top 2 -h", "allocinfo --file no-such-file", "kmemtrace record status",
        "kmemtrace print kmalloc-8192", "kmem kfence", "kfree all", "", "   ", "\t"]
# (`kmemtrace stop` is not among them: with nothing traced it says so, an
# error since issue 31.)
# Bad lines and what their one error line says.
BAD = [
    ("frobnicate", "unknown command"), ("KMALLOC 1", "unknown command"), ("kmalloc", "usage: kmalloc"),
    ("kmalloc +64", "not a number"), ("kmalloc -1", "not a number"), ("kmalloc 0X40", "not a number"),
    ("kmalloc 0x", "not a number"), ("kmalloc 1e3", "not a number"), ("kmalloc 12a", "not a number"),
    ("kmalloc 64 +2", "not a number"), ("kmalloc 0x" + "f" * 17, "too large"), ("kmalloc " + "9" * 25, "too large"),
    ("kmalloc 0", "out of range"), ("kmalloc 64 0", "out of range"), ("kmalloc 67108865", "out of range"),
    ("kmalloc 64 100001", "out of range"), ("kmalloc 1 1 1", "usage: kmalloc"), ("leak", "usage: leak"),
    ("leak 0", "out of range"), ("kfree 0", "frees nothing"), ("kfree 1 2", "usage: kfree"),
    ("kfree 100001", "cannot free"), ("kfree -1", "not a number"), ("help x", "usage: help"),
    ("kmemstat x", "usage: kmemstat"), ("slabinfo -v", "usage: slabinfo"), ("cpus all", "usage: cpus"),
    ("poweroff now", "usage: poweroff"), ("poweroff now please", "usage: poweroff"),
    ("timestats reset now", "usage: timestats"), ("kmemtrace", "usage: kmemtrace"),
    ("kmemtrace dance", "usage: kmemtrace"), ("kmemtrace print kmalloc-64 x", "usage: kmemtrace"),
    ("kmemtrace start no-such-cache", "no cache named"), ("kmemtrace start kmem_trace", "NOTRACE"),
    ("allocinfo --top", "usage: allocinfo"), ("allocinfo --top x", "not a number"),
    ("allocinfo --sort size", "unknown sort key 'size'"), ("allocinfo ctx nowhere.rs:1 print", "no allocation tag"),
    ("allocinfo ctx x", "usage: allocinfo"), ("stress --ops 0", "--ops 0"), ("stress --cpus 99", "--cpus 99"),
    ("stress --ops", "needs a value"), ("stress --frob 1", "unknown option"), ("stress --sizes 9-1", "--sizes 9-1"),
    ("stress --seed -1", "not a number"), ("x" * (MAX_LINE + 1), "line too long"),
    ("kmalloc " + "1" * 300, "line too long"),
]
# Bytes the line editor refuses (CR, LF, tab, backspace, DEL, Ctrl-C,
# Ctrl-U and ESC, the start of a cursor key, have meanings).
REFUSED = [b for b in range(256)
           if not (0x20 <= b <= 0x7e) and b not in (0x03, 0x08, 0x09, 0x0a, 0x0d, 0x15, 0x1b, 0x7f)]


def crafted_bad_byte(rng):
    """A good-looking line with refused bytes put in; (line, first byte, its column)."""
    base = bytearray(rng.choice(["kmalloc 64 2", "kfree 1", "help", "kmemstat", "leak 8", "allocinfo"]).encode())
    for _ in range(rng.randint(1, 3)):
        at = rng.randint(0, len(base))
        base[at:at] = bytes([rng.choice(REFUSED)])
    index = next(i for i, b in enumerate(base) if b in REFUSED)
    return bytes(base), base[index], index + 1


def random_words(rng):
    """Words from the shell's vocabulary and junk, joined by blanks and tabs."""
    vocabulary = COMMANDS[:-2] + ["all", "start", "stop", "print", "reset", "on", "off", "ctx", "--top",
                                  "--sort", "--file", "-h", "bytes", "calls", "kmalloc-64", "kmem_trace", "--ops"]
    words = [rng.choice(vocabulary)]
    for _ in range(rng.randint(0, 4)):
        kind = rng.random()
        if kind < 0.4:
            words.append(str(rng.choice([0, 1, 2, 8, 64, 100, 4096, rng.randint(0, 5000)])))
        elif kind < 0.5:
            words.append(hex(rng.randint(0, 1 << 70)))
        elif kind < 0.6:
            words.append(rng.choice(["+1", "-1", "0x", "1_0", "١٢", "0xG"]))
        else:
            words.append(rng.choice(vocabulary))
    line = "".join(word + rng.choice([" ", "  ", "\t"]) for word in words).strip(" ")
    return line.encode()


def random_bytes(rng):
    """Any bytes but the line ends and Ctrl-C (which cancels the line and
    prompts again); backspaces, escapes, cursor keys and all."""
    return bytes(rng.choice([b for b in range(256) if b not in (0x03, 0x0a, 0x0d)])
                 for _ in range(rng.randint(1, 60)))


def is_harmful(line):
    """Lines the fuzzer must not type: they power off, take seconds, or leak."""
    words = line.replace(b"\t", b" ").split()
    return bool(words) and words[0] in (b"poweroff", b"stress", b"leak") and not any(
        b < 0x20 and b != 0x09 or b >= 0x7f for b in line)


def make_lines(rng, count):
    """[(bytes, kind, expected)] with kind good/bad/any."""
    lines = []
    while len(lines) < count:
        pick = rng.random()
        if pick < 0.15:
            lines.append((rng.choice(GOOD).encode(), "good", None))
        elif pick < 0.45:
            line, message = rng.choice(BAD)
            lines.append((line.encode(), "bad", message))
        elif pick < 0.65:
            line, byte, column = crafted_bad_byte(rng)
            lines.append((line, "bad", f"byte {byte:#04x} at column {column} "))
        elif pick < 0.85:
            line = random_words(rng)
            if line.split()[0] in (b"kmalloc", b"kfree") and rng.random() < 0.5:
                line = line.split()[0] + b" " + str(rng.randint(1, 64)).encode()
            if not is_harmful(line):
                lines.append((line, "any", None))
        else:
            line = random_bytes(rng)
            if not is_harmful(line) and PROMPT.encode() not in line:
                lines.append((line, "any", None))
    return lines


class ShellFuzz(unittest.TestCase):
    def test_every_line_gets_its_prompt_and_at_most_one_error(self):
        if not os.path.exists(KERNEL):
            self.skipTest(f"{KERNEL} not built; run `cargo build --bin magpie`")
        seed = int(os.environ.get("MAGPIE_FUZZ_SEED", "1"))
        count = int(os.environ.get("MAGPIE_FUZZ_LINES", "3000"))
        rng = random.Random(seed)
        lines = make_lines(rng, count)
        code, out = boot([line for line, _, _ in lines] + [b"kfree all", b"poweroff"], timeout=300)
        context = f"(seed {seed}; replay with MAGPIE_FUZZ_SEED={seed})"
        self.assertNotIn("PANIC", out, context)
        self.assertEqual(code, 0, f"{context}\n{out[-3000:]}")
        chunks = out.split(PROMPT)[1:]
        self.assertEqual(len(chunks), len(lines) + 2, f"one prompt per line {context}")
        for number, ((line, kind, expected), chunk) in enumerate(zip(lines, chunks), 1):
            _echo, _, reply = chunk.partition("\n")
            errors = [text for text in reply.splitlines() if text.startswith("error:")]
            where = f"line {number} {line!r} ({kind}) {context}: reply {reply[:500]!r}"
            if kind == "good":
                self.assertEqual(errors, [], where)
            elif kind == "bad":
                self.assertEqual(len(reply.splitlines()), 1, where)
                self.assertEqual(len(errors), 1, where)
                self.assertIn(expected, errors[0], where)
            else:
                self.assertLessEqual(len(errors), 1, where)
        self.assertIn("powering off", chunks[-1])


if __name__ == "__main__":
    unittest.main(argv=sys.argv)
