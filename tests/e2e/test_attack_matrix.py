#!/usr/bin/env python3
"""The attack matrix in the shell (issue 33, docs/HARDENING.md, the README's
table): every row's `lkdtm` type typed in a booted kernel, each verdict line
checked (`refused`, `detected` or `mitigated`), and the kernel survives all
of them. A second boot switches two defences off from the command line
(`random_kmalloc_caches=0`: `kmalloc` sites share the normal classes;
`slab_debug=Z,lkdtm-heap-spray`: a debug cache keeps its slab's address
order) and checks that their rows then say `not mitigated`, so the test
fails when a defence is off. Run after `cargo build --bin magpie`; boots the
kernel as tests/e2e/test_shell.py does (and uses its helpers).
"""
import os
import re
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_shell import KERNEL, boot, reply_to  # noqa: E402

# Each row's type -> the start of its verdict (after `lkdtm: TYPE: `) and
# a line its run prints before it.
MATRIX = {
    "UAF_WRITE_DOUBLE_FREE": (
        "detected: buffer modified after being freed (64 and 8 bytes), each object handed out once",
        r"lkdtm: the next 256 allocations returned 0x[0-9a-f]+ once"),
    "SLAB_FREE_DOUBLE_NARROW": (
        "refused: double free of 0x",
        r"lkdtm: allocated 0x[0-9a-f]+, wrote 0x41 to its first byte, freeing it twice"),
    "FREELIST_FORGE_SAME": (
        "refused: free list corrupted in lkdtm-forge-same, slab 0x",
        r"lkdtm: the next 200 allocations never returned 0x[0-9a-f]+"),
    "FREELIST_FORGE_OTHER": (
        "refused: free list corrupted in lkdtm-forge-another, slab 0x",
        r"an object of lkdtm-forge-other"),
    "FREELIST_FORGE_OUTSIDE": (
        "refused: free list corrupted in lkdtm-forge-outside, slab 0x",
        r"the allocator's static SLAB"),
    "KMALLOC_SITE_REUSE": (
        "mitigated: sites in different random copies never got each other's objects",
        r"lkdtm: 6 kmalloc\(64\) call sites allocate from kmalloc-rnd-\d\d-64(, kmalloc-rnd-\d\d-64){5}"),
    "KMALLOC_TYPE_REUSE": (
        "mitigated: pointer-free data and pointers never share an object",
        r"lkdtm: 100 \[u8; 64\] from kmalloc-data-64 freed, then 100 64-byte nodes holding a pointer "
        r"from kmalloc-rnd-\d\d-64: 0 of them were freed data"),
    "CROSS_CACHE_REUSE": (
        "mitigated: no object of lkdtm-cross-attacker landed in the pages lkdtm-cross-victim gave back",
        r"lkdtm: lkdtm-cross-attacker allocated 300 objects: 0 in the victim's old pages"),
    "HEAP_SPRAY_ORDER": (
        "mitigated: the slab hands its objects out in a random order",
        r"lkdtm: 32 objects from a fresh slab \(64-byte stride\): [0-7] of 31 follow their predecessor"),
}

# The two rows whose defence the command line switches off, and what they
# say then.
DEFENCES_OFF = "random_kmalloc_caches=0 slab_debug=Z,lkdtm-heap-spray"
WITHOUT = {
    "KMALLOC_SITE_REUSE": (
        "not mitigated: site 1 got ",
        r"lkdtm: 6 kmalloc\(64\) call sites allocate from kmalloc-64(, kmalloc-64){5}"),
    "HEAP_SPRAY_ORDER": (
        "not mitigated: 31 of 31 objects in address order",
        r"lkdtm: 32 objects from a fresh slab \(\d+-byte stride\): 31 of 31 follow their predecessor"),
}


def verdict_line(test, reply, name):
    lines = reply.splitlines()
    test.assertEqual(lines[0], f"lkdtm: Performing direct entry {name}", reply)
    last = lines[-1]
    test.assertTrue(last.startswith(f"lkdtm: {name}: "), reply)
    return last[len(f"lkdtm: {name}: "):]


class AttackMatrix(unittest.TestCase):
    """Every row's type in one boot, with every defence on (the default)."""

    @classmethod
    def setUpClass(cls):
        if not os.path.exists(KERNEL):
            raise unittest.SkipTest(f"{KERNEL} not built; run `cargo build --bin magpie`")
        cls.code, cls.out = boot(["lkdtm list"] + [f"lkdtm {name}" for name in MATRIX]
                                 + ["kmalloc 64 1", "kfree all", "poweroff"],
                                 append="random_kmalloc_caches=1")

    def test_survives_every_row_and_powers_off(self):
        self.assertEqual(self.code, 0, self.out)
        self.assertNotIn("PANIC", self.out)
        self.assertRegex(reply_to(self.out, "kmalloc 64 1"), r"0x[0-9a-f]+")

    def test_lkdtm_list_names_every_row(self):
        listed = reply_to(self.out, "lkdtm list").split()
        for name in MATRIX:
            self.assertIn(name, listed)

    def test_each_row_gives_its_verdict(self):
        for name, (verdict, line) in MATRIX.items():
            with self.subTest(name):
                reply = reply_to(self.out, f"lkdtm {name}")
                self.assertTrue(verdict_line(self, reply, name).startswith(verdict), reply)
                self.assertRegex(reply, line)
                self.assertNotIn("error", reply)

    def test_the_detected_copy_is_reported_in_the_illumos_format(self):
        reply = reply_to(self.out, "lkdtm UAF_WRITE_DOUBLE_FREE")
        for cache in ("lkdtm-uaf-write-64", "lkdtm-uaf-write-8"):
            self.assertRegex(reply, r"kernel memory allocator: buffer modified after being freed\n"
                             r"(.*\n)*?buffer=0x[0-9a-f]+ +bufctl=0x[0-9a-f]+ +cache: " + re.escape(cache))
        self.assertEqual(reply.count("lkdtm: second free: accepted"), 2, reply)


class DefencesOff(unittest.TestCase):
    """The rows whose defence the boot line can switch off say `not
    mitigated` without it: the matrix fails when a defence is off."""

    @classmethod
    def setUpClass(cls):
        if not os.path.exists(KERNEL):
            raise unittest.SkipTest(f"{KERNEL} not built; run `cargo build --bin magpie`")
        cls.code, cls.out = boot([f"lkdtm {name}" for name in WITHOUT] + ["poweroff"], append=DEFENCES_OFF)

    def test_each_row_is_not_mitigated(self):
        self.assertEqual(self.code, 0, self.out)
        for name, (verdict, line) in WITHOUT.items():
            with self.subTest(name):
                reply = reply_to(self.out, f"lkdtm {name}")
                self.assertTrue(verdict_line(self, reply, name).startswith(verdict), reply)
                self.assertRegex(reply, line)


if __name__ == "__main__":
    unittest.main()
