#!/usr/bin/env python3
"""End-to-end tests of the shell's slabtop and per-cache commands (issue 20):
`slabtop --once` and the live view, `kmem cache CACHE ...`, and `kmemtrace
record start` over a recording not dumped yet. Run after
`cargo build --bin magpie`; boots the kernel as tests/e2e/test_shell.py does
(and uses its helpers)."""
import os
import re
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_shell import boot, reply_to  # noqa: E402

COLUMNS = "  OBJS ACTIVE  USE OBJ SIZE  SLABS OBJ/SLAB CACHE SIZE NAME"
# Linux's `%6u %6u %3u%% %7.2fK %6u %8u %9uK %-23s`, then MAG HITS MISSES CONTEND RESIZE.
ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+(\d+)%\s+(\d+\.\d\d)K\s+(\d+)\s+(\d+)\s+(\d+)K (\S+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)$")


def rows(text):
    return {m.group(8): m.groups() for m in map(ROW.match, text.splitlines()) if m}


class Slabtop(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.code, cls.out = boot([
            "slabtop --once",
            "kmalloc 1000 50",
            "slabtop --once --sort c",
            "slabtop --once --sort x",
            "slabtop --once --bogus",
            "slabtop --delay 100",
            "q",
            "kmem cache kmalloc-1024",
            "kmem cache kmalloc-1024 validate",
            "kfree all",
            "kmem cache kmalloc-1024 shrink",
            "kmem cache kmalloc-1024 debug FZ",
            "poweroff",
        ])

    def test_once_has_linux_columns_and_magazine_counts(self):
        self.assertEqual(self.code, 0, self.out)
        text = reply_to(self.out, "slabtop --once")
        lines = text.splitlines()
        self.assertRegex(lines[0], r"^ Active / Total Objects \(% used\)    : \d+ / \d+ \(\d+\.\d%\)$")
        self.assertRegex(lines[1], r"^ Active / Total Slabs \(% used\)      : \d+ / \d+ ")
        self.assertRegex(lines[2], r"^ Active / Total Caches \(% used\)     : \d+ / \d+ ")
        self.assertRegex(lines[3], r"^ Active / Total Size \(% used\)       : \d+\.\d\dK / \d+\.\d\dK ")
        self.assertRegex(lines[4], r"^ Minimum / Average / Maximum Object : \d+\.\d\dK / ")
        self.assertRegex(lines[5], r"^ Magazines since boot\s+: \d+ hits, \d+ misses \(\d+\.\d% hits\), \d+ depot contention$")
        self.assertTrue(lines[7].startswith(COLUMNS), lines[7])
        self.assertTrue(lines[7].endswith("MAG     HITS   MISSES CONTEND RESIZE"), lines[7])
        table = rows(text)
        self.assertIn("kmalloc-64", table, text)
        # Sorted by objects, most first.
        objs = [int(m.group(1)) for m in map(ROW.match, lines[8:]) if m]
        self.assertEqual(objs, sorted(objs, reverse=True))

    def test_kmalloc_shows_in_its_cache_and_sort_by_cache_size(self):
        text = reply_to(self.out, "slabtop --once --sort c")
        table = rows(text)
        row = table["kmalloc-1024"]
        self.assertGreaterEqual(int(row[1]), 50, text)  # ACTIVE
        self.assertEqual(row[3], "1.00")  # OBJ SIZE, in K
        # 50 allocations since boot at least: hits plus misses.
        self.assertGreaterEqual(int(row[9]) + int(row[10]), 50, text)
        sizes = [int(m.group(7)) for m in map(ROW.match, text.splitlines()) if m]
        self.assertEqual(sizes, sorted(sizes, reverse=True))

    def test_bad_options_are_one_error_line(self):
        self.assertIn("error: unknown sort key 'x'; expected o, c, n or m", reply_to(self.out, "slabtop --once --sort x"))
        self.assertIn("error: unknown option '--bogus'", reply_to(self.out, "slabtop --once --bogus"))

    def test_live_view_refreshes_until_q(self):
        text = reply_to(self.out, "slabtop --delay 100")
        self.assertIn("\x1b[H\x1b[2J", text)
        self.assertIn("(every 100 ms, sorted by objects; q quits, o c n m sort)", text)
        self.assertIn(COLUMNS, text)
        # q ended it: the shell went on to the next commands.
        self.assertIn("kfree all", [line.strip() for line in self.out.split("magpie> ")[1:] for line in [line.split("\n")[0]]])

    def test_kmem_cache_shows_validates_and_shrinks(self):
        text = reply_to(self.out, "kmem cache kmalloc-1024")
        self.assertRegex(text, r"^kmalloc-1024: 1024-byte objects \(stride \d+, align \d+\), \w+ slabs of \d+ page\(s\), \d+ objects each\n")
        self.assertRegex(text, r"\nmagazines: \d+ rounds each; depot \d+ full, \d+ empty; depot lock contended \d+ times\n")
        self.assertRegex(text, r"\nmagazine resizes: \d+ \(the size grows when the depot lock is contended or hands magazines between CPUs\)\n")
        self.assertRegex(reply_to(self.out, "kmem cache kmalloc-1024 validate"), r"^verified 1 cache\(s\), \d+ slab\(s\), \d+ object\(s\): 0 problem\(s\)\n")
        self.assertRegex(reply_to(self.out, "kmem cache kmalloc-1024 shrink"), r"^shrink kmalloc-1024: \d+ pages \(\d+ KiB\) returned\n")
        self.assertIn("error: kmalloc-1024: debug flags are fixed at creation", reply_to(self.out, "kmem cache kmalloc-1024 debug FZ"))


class SlabtopFitsTheScreen(unittest.TestCase):
    """Issue 31: a live frame fits a terminal (24 lines unless --lines),
    the summary on top and the busiest caches under it; o c n m re-sort at
    once, keys it does not use are ignored, q and Ctrl-C quit (not any
    key); a fresh boot's low hit ratio is explained."""

    @classmethod
    def setUpClass(cls):
        cls.code, cls.out = boot([
            "slabtop --once",
            b"slabtop --delay 60000\nxcn\x03",
            "slabtop --delay 60000 --lines 12",
            "q",
            "slabtop --once --lines 10",
            "slabtop --once --lines 9",
            "poweroff",
        ])

    def frames(self, text):
        return [frame for frame in text.split("\x1b[H\x1b[2J")[1:]]

    def test_a_frame_fits_24_lines_summary_first_busiest_rows(self):
        self.assertEqual(self.code, 0, self.out)
        every = rows(reply_to(self.out, "slabtop --once"))
        self.assertGreater(len(every), 40, "the kernel has many caches")
        frames = self.frames(reply_to(self.out, "slabtop --delay 60000"))
        # The first frame, then one per sort key pressed (x is ignored),
        # then Ctrl-C quits without waiting a minute.
        self.assertEqual(len(frames), 3, frames)
        for frame, by in zip(frames, ["objects", "cache size", "name"]):
            lines = frame.splitlines()
            self.assertLessEqual(len(lines), 24, frame)
            self.assertTrue(lines[0].startswith(" Active / Total Objects"), frame)
            self.assertRegex(frame, rf"\(14 of {len(every)} caches shown, by {by}; --lines N for more\)")
            self.assertTrue(lines[-1].startswith(f"(every 60000 ms, sorted by {by}"), frame)
        objs = [int(row[0]) for row in rows(frames[0]).values()]
        self.assertEqual(len(objs), 14)
        self.assertEqual(min(objs), sorted((int(r[0]) for r in every.values()), reverse=True)[13])
        names = [m.group(8) for m in map(ROW.match, frames[2].splitlines()) if m]
        self.assertEqual(names, sorted(every)[:14])

    def test_lines_sets_the_height(self):
        frames = self.frames(reply_to(self.out, "slabtop --delay 60000 --lines 12"))
        self.assertEqual(len(frames), 1)
        self.assertEqual(len(frames[0].splitlines()), 12, frames[0])
        self.assertEqual(len(rows(frames[0])), 2)
        once = reply_to(self.out, "slabtop --once --lines 10")
        self.assertEqual(len(rows(once)), 1, once)
        self.assertRegex(once, r"\n\(1 of \d+ caches shown, by objects; --lines N for more\)\n")
        self.assertIn("error: --lines 9 out of range: give 10 to 1000", reply_to(self.out, "slabtop --once --lines 9"))

    def test_fresh_boot_hit_ratio_is_explained(self):
        text = reply_to(self.out, "slabtop --once")
        hits = re.search(r"Magazines since boot\s+: (\d+) hits, (\d+) misses", text)
        self.assertIsNotNone(hits, text)
        if int(hits.group(1)) * 2 < int(hits.group(1)) + int(hits.group(2)):
            self.assertIn("(few hits: magazines start empty", text)
        else:
            self.assertNotIn("(few hits", text)


class RecordStartOverAnUnreadRecording(unittest.TestCase):
    def test_asks_for_force_then_says_what_it_drops(self):
        with tempfile.TemporaryDirectory() as tmp:
            os.environ["MAGPIE_KMEMTRACE"] = os.path.join(tmp, "unread.kmt")
            try:
                code, out = boot([
                    "kmemtrace record start kmalloc-64",
                    "kmalloc 64 3",
                    "kmemtrace record start kmalloc-64",
                    "kmemtrace record stop",
                    "kmemtrace record start kmalloc-64",
                    "kmemtrace record start --force kmalloc-64",
                    "kmemtrace record stop",
                    "kmemtrace dump",
                    "kmemtrace record start kmalloc-64",
                    "kmemtrace record stop",
                    "kmemtrace record stop",
                    "kfree all",
                    "poweroff",
                ])
            finally:
                del os.environ["MAGPIE_KMEMTRACE"]
        self.assertEqual(code, 0, out)
        # During a recording: says so (issue 31: it said "not dumped").
        self.assertRegex(reply_to(out, "kmemtrace record start kmalloc-64", nth=1),
                         r"^error: already recording \(\d+ events so far\): 'kmemtrace record stop' first\n$")
        refused = reply_to(out, "kmemtrace record start kmalloc-64", nth=2)
        self.assertRegex(refused, r"^error: \d+ events recorded and not dumped: 'kmemtrace dump' first, or 'record start --force'\n$")
        # A second stop did nothing and says so.
        self.assertRegex(reply_to(out, "kmemtrace record stop", nth=3),
                         r"^error: not recording: stopped already \(\d+ events kept; 'kmemtrace dump' sends them\)\n$")
        forced = reply_to(out, "kmemtrace record start --force kmalloc-64")
        self.assertRegex(forced, r"^dropped the last recording: \d+ events \(\d+ overruns\) never dumped\nrecording kmalloc-64 ")
        # Once dumped, a new recording starts without a word about the old one.
        after_dump = reply_to(out, "kmemtrace record start kmalloc-64", nth=3)
        self.assertTrue(after_dump.startswith("recording kmalloc-64 "), after_dump)


if __name__ == "__main__":
    unittest.main()
