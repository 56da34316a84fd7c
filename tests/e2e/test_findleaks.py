#!/usr/bin/env python3
"""`kmem findleaks` (issue 19): leaks by reachability, in illumos
`::findleaks`' layout. On a quiet kernel (and after `stress`, whose freed
objects rest in magazines) it reports nothing; after `leak 64 10` exactly
those 10 at `cmd_leak`'s code tag; objects the shell still holds (`kmalloc`)
are not reported; a trace table holding pointers to leaked objects does not
hide them.
"""
import os
import re
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_shell import ROOT, boot, reply_to  # noqa: E402

LINE = re.compile(r"^(\S+)\s+(\d+) ([0-9a-f]{16}) (\S+):(\d+) (\S+)$")
TOTAL = re.compile(r"^\s+Total\s+(\d+) buffers?, (\d+) bytes?$", re.M)


def groups(reply):
    return [LINE.match(line).groups() for line in reply.splitlines() if LINE.match(line)]


class Findleaks(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.code, cls.out = boot([
            "kmem findleaks", "stress", "kmem findleaks", "kmalloc 100",
            "leak 64 10", "kmem findleaks", "kmemtrace start kmalloc-48", "leak 48 3",
            "kmem findleaks", "poweroff"])

    def test_quiet_kernel_reports_nothing(self):
        self.assertEqual(self.code, 0, self.out)
        for nth in (0, 1):
            reply = reply_to(self.out, "kmem findleaks", nth)
            self.assertIn("findleaks: no memory leaks detected", reply)
            self.assertEqual(groups(reply), [], reply)
        self.assertRegex(reply_to(self.out, "kmem findleaks", 1), r"[1-9]\d* resting in magazines")

    def test_exactly_the_leaked_objects_at_their_site(self):
        reply = reply_to(self.out, "kmem findleaks", 2)
        self.assertTrue(reply.startswith("CACHE                 LEAKED           BUFCTL CALLER\n"), reply)
        found = groups(reply)
        self.assertEqual(len(found), 1, reply)
        cache, leaked, bufctl, file, line, function = found[0]
        self.assertEqual((cache, leaked, function), ("kmalloc-64", "10", "cmd_leak"))
        printed = [int(a, 16) for a in re.findall(r"0x[0-9a-f]{16}", reply_to(self.out, "leak 64 10"))]
        self.assertEqual(int(bufctl, 16), min(printed), "the representative buffer is the lowest")
        # The code tag's line is the leak's kmalloc! call in cmd_leak.
        with open(os.path.join(ROOT, file)) as f:
            source = f.read().splitlines()
        self.assertIn("kmalloc!", source[int(line) - 1])
        self.assertEqual(TOTAL.search(reply).groups(), ("10", "640"))

    def test_traced_leaks_are_still_leaks(self):
        reply = reply_to(self.out, "kmem findleaks", 3)
        found = {g[0]: g[1] for g in groups(reply)}
        self.assertEqual(found, {"kmalloc-64": "10", "kmalloc-48": "3"}, reply)
        self.assertEqual(TOTAL.search(reply).groups(), ("13", str(640 + 3 * 48)))


if __name__ == "__main__":
    unittest.main()
