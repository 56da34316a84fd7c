#!/usr/bin/env python3
"""Post-mortem reports (issue 30; docs/VMCORE.md): boot the kernel, build a
known heap, take a core with the shell's `vmcore` (and with SIGTERM to the
runner), and check that `magpie-kmem core CORE REPORT` prints what the live
shell printed on the same state: slabinfo line for line, kmemstat's cache
rows field for field, whatis of the objects the shell allocated. Hostile
cores (cut short, bytes flipped, the wrong kernel) give one clear error or
a partial report, never a crash. Also (issue 31): every boot keeps its own
kmemtrace dump file, latest.kmt links to the newest.

Run after `cargo build --bin magpie` and `make magpie-kmem`.
"""
import glob
import os
import pty
import random
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_shell import KERNEL, PROMPT, ROOT, RUNNER, boot, reply_to  # noqa: E402

TOOL = os.path.join(ROOT, "scripts", "magpie-kmem")
HEX = re.compile(r"0x[0-9a-f]{16}")


def tool(*args):
    proc = subprocess.run([TOOL, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT, timeout=120)
    return proc.returncode, proc.stdout.decode(), proc.stderr.decode()


def kmemstat_rows(text):
    """The cache, metadata and page rows of a kmemstat report: name and
    fields, indentation dropped."""
    rows = {}
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(":")]
        if len(parts) == 7 and parts[1] in ("S", "M", "P"):
            rows[parts[0]] = parts[1:]
    return rows


class VmcoreOnDemand(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.core = os.path.join(cls.tmp.name, "on-demand.core")
        cls.kmt = os.path.join(cls.tmp.name, "live.kmt")
        os.environ["MAGPIE_VMCORE"] = cls.core
        os.environ["MAGPIE_KMEMTRACE"] = cls.kmt
        try:
            cls.code, cls.out = boot([
                "kmemtrace record start --stacks 8", "kmemtrace start kmalloc-64",
                "kmalloc 64 10", "kmalloc 200 3", "leak 32 2", "kfree 1",
                "kmemtrace record stop",
                "slabinfo", "kmemstat", "slabtop --once", "slabtop --once --sort n",
                "kmemtrace print kmalloc-64", "kmemtrace print",
                "vmcore", "kmemtrace dump", "poweroff"])
        finally:
            del os.environ["MAGPIE_VMCORE"]
            del os.environ["MAGPIE_KMEMTRACE"]

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_runner_says_where_it_wrote_the_core(self):
        self.assertEqual(self.code, 0, self.out)
        self.assertIn(f"vmcore written to {self.core}", self.out)
        self.assertIn("vmcore: requested", reply_to(self.out, "vmcore"))
        self.assertGreater(os.path.getsize(self.core), 128 << 20)

    def test_slabinfo_equals_the_live_one_line_for_line(self):
        code, offline, err = tool("core", self.core, "slabinfo")
        self.assertEqual((code, err), (0, ""), err)
        live = reply_to(self.out, "slabinfo")
        self.assertEqual(offline.splitlines(), live.splitlines())
        self.assertGreater(len(offline.splitlines()), 60)

    def test_kmemstat_equals_the_live_one_line_for_line(self):
        # The arenas (base > kpages > the caches, the bootstrap heap) are
        # read where the kernel keeps their figures (the descriptor's
        # arena table).
        code, offline, err = tool("core", self.core, "kmemstat")
        self.assertEqual((code, err), (0, ""), err)
        live = reply_to(self.out, "kmemstat")
        self.assertEqual(offline.splitlines(), live.splitlines())
        rows = kmemstat_rows(offline)
        self.assertIn("kmalloc-64", rows)
        self.assertRegex(offline, r"\nbase +: A :    4096:")
        self.assertRegex(offline, r"\n    kpages +: A :    4096:")
        self.assertRegex(offline, r"\nbootstrap-heap +: A :       1:")

    def test_slabtop_once_equals_the_live_one(self):
        for args, command in ((["slabtop", "--once"], "slabtop --once"),
                              (["slabtop", "--once", "--sort", "n"], "slabtop --once --sort n")):
            code, offline, err = tool("core", self.core, *args)
            self.assertEqual((code, err), (0, ""), err)
            self.assertEqual(offline.splitlines(), reply_to(self.out, command).splitlines())
            self.assertIn(" Magazines since boot ", offline)
        code, _, err = tool("core", self.core, "slabtop", "--sort", "x")
        self.assertNotEqual(code, 0)
        self.assertIn("unknown sort key 'x'; expected o, c, n or m", err)

    def test_whatis_names_the_objects_the_shell_holds(self):
        held = HEX.findall(reply_to(self.out, "kmalloc 64 10"))
        self.assertEqual(len(held), 10, self.out)
        freed = HEX.findall(reply_to(self.out, "kfree 1"))
        self.assertEqual(len(freed), 1, self.out)
        for addr in held:
            code, offline, err = tool("core", self.core, "whatis", hex(int(addr, 16) + 3))
            self.assertEqual(code, 0, err)
            if addr == freed[0]:
                # `kfree 1` freed it: it rests in a magazine.
                self.assertIn("is free in kmalloc-64 (in a magazine)", offline)
            else:
                self.assertIn(f"is allocated from kmalloc-64: object {int(addr, 16):#x}+0x3 of 64 bytes", offline)
        code, offline, _ = tool("core", self.core, "whatis", "0x10")
        self.assertEqual(offline, "0x10 is not in any slab\n")

    def test_events_are_the_dump_the_kernel_writes(self):
        # The recording was stopped before `vmcore` and dumped after it:
        # the core's events are that dump, byte for byte.
        offline = os.path.join(self.tmp.name, "from-core.kmt")
        code, out, err = tool("core", self.core, "events", "-o", offline)
        self.assertEqual((code, err), (0, ""), err)
        self.assertRegex(out, r"^[1-9]\d* events \(0 overruns\) in \d+ bytes written to ")
        with open(offline, "rb") as f, open(self.kmt, "rb") as g:
            self.assertTrue(f.read() == g.read(), "the dumps differ")
        code, out, err = tool("check", offline)
        self.assertEqual(code, 0, out + err)

    def test_trace_equals_kmemtrace_print(self):
        for args, command in ((["trace", "kmalloc-64"], "kmemtrace print kmalloc-64"),
                              (["trace"], "kmemtrace print")):
            code, offline, err = tool("core", self.core, *args)
            self.assertEqual((code, err), (0, ""), err)
            self.assertEqual(offline.splitlines(), reply_to(self.out, command).splitlines())
        self.assertIn("10 outstanding objects in kmalloc-64, 0 records dropped (tracing on)", offline)
        code, _, err = tool("core", self.core, "trace", "kmalloc-nope")
        self.assertNotEqual(code, 0)
        self.assertIn("no cache named 'kmalloc-nope' in the image", err)

    def test_verify_finds_nothing_broken(self):
        code, offline, err = tool("core", self.core, "verify")
        self.assertEqual((code, err), (0, ""), err)
        self.assertRegex(offline, r"^\d+ caches, \d+ slabs walked; 0 broken$")

    def test_truncated_core_is_one_clear_error(self):
        cut = os.path.join(self.tmp.name, "cut.core")
        with open(self.core, "rb") as f, open(cut, "wb") as out:
            out.write(f.read(1 << 20))
        code, offline, err = tool("core", cut, "slabinfo")
        self.assertNotEqual(code, 0)
        self.assertNotIn("panicked", err)
        self.assertEqual(len(err.strip().splitlines()), 1, err)
        self.assertTrue(err.startswith("magpie-kmem: "), err)

    def test_flipped_bytes_never_crash_the_tool(self):
        flipped = os.path.join(self.tmp.name, "flipped.core")
        with open(self.core, "rb") as f:
            data = bytearray(f.read())
        rng = random.Random(30)
        # Past the ELF headers and notes: the memory.
        for _ in range(20000):
            at = rng.randrange(1 << 16, len(data))
            data[at] ^= 1 << rng.randrange(8)
        with open(flipped, "wb") as out:
            out.write(data)
        for report in (["slabinfo"], ["kmemstat"], ["verify"], ["whatis", "0xffff800000100000"], ["findleaks"],
                       ["allocinfo"]):
            code, offline, err = tool("core", flipped, *report)
            self.assertIn(code, (0, 1), err)
            self.assertNotIn("panicked", err)

    def test_wrong_kernel_is_refused(self):
        others = [p for p in glob.glob(os.path.join(ROOT, "target", "x86_64-unknown-none", "debug", "deps", "*"))
                  if os.path.isfile(p) and "." not in os.path.basename(p)
                  and not os.path.basename(p).startswith("magpie-")
                  # (the hobby kernel has no build id: nothing to tell it apart by)
                  and not os.path.basename(p).startswith("hobby_kernel-")]
        if not others:
            self.skipTest("no test kernel built")
        code, _, err = tool("--kernel", others[0], "core", self.core, "slabinfo")
        self.assertNotEqual(code, 0)
        self.assertIn("kernel ELF mismatch", err)


def read_until_prompts(proc, count, deadline=90):
    out = b""
    end = time.monotonic() + deadline
    while out.count(PROMPT.encode()) < count and time.monotonic() < end:
        chunk = os.read(proc.stdout.fileno(), 65536)
        if not chunk:
            break
        out += chunk
    return out


class VmcoreOnPanic(unittest.TestCase):
    def test_a_panic_leaves_a_core_with_the_heap(self):
        with tempfile.TemporaryDirectory() as tmp:
            core = os.path.join(tmp, "panic.core")
            os.environ["MAGPIE_VMCORE"] = core
            try:
                code, out = boot(["kmalloc 512 4", "slabinfo", "vmcore crash", "poweroff"])
            finally:
                del os.environ["MAGPIE_VMCORE"]
            self.assertNotEqual(code, 0, out)
            self.assertIn("vmcore crash: a panic on purpose", out)
            self.assertIn(f"kernel panic: vmcore written to {core}", out)
            self.assertIn(f"panicked (vmcore: {core})", out)
            code, offline, err = tool("core", core, "slabinfo")
            self.assertEqual((code, err), (0, ""), err)
            live = {line.split()[0]: line for line in reply_to(out, "slabinfo").splitlines()}
            row = offline.splitlines()[[l.split()[0] for l in offline.splitlines()].index("kmalloc-512")]
            self.assertEqual(row, live["kmalloc-512"])

    def test_a_hang_past_the_timeout_leaves_a_core(self):
        with tempfile.TemporaryDirectory() as tmp:
            core = os.path.join(tmp, "hang.core")
            env = dict(os.environ, MAGPIE_VMCORE=core, MAGPIE_TIMEOUT="20",
                       MAGPIE_APPEND="kfence.sample_interval=0")
            # The shell waits for input that never comes: a "hang".
            proc = subprocess.Popen([RUNNER, KERNEL], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, env=env, cwd=ROOT)
            out, _ = proc.communicate(timeout=120)
            out = out.decode(errors="replace")
            self.assertEqual(proc.returncode, 1, out)
            self.assertIn(f"timed out after 20 s (hung?): vmcore written to {core}", out)
            code, offline, err = tool("core", core, "kmemstat")
            self.assertEqual((code, err), (0, ""), err)
            self.assertIn("kmalloc-64", offline)


class VmcoreOnSignal(unittest.TestCase):
    def test_sigterm_to_the_runner_takes_a_core_then_ends_qemu(self):
        with tempfile.TemporaryDirectory() as tmp:
            core = os.path.join(tmp, "signal.core")
            env = dict(os.environ, MAGPIE_VMCORE=core, MAGPIE_TIMEOUT="120",
                       MAGPIE_APPEND="kfence.sample_interval=0")
            proc = subprocess.Popen([RUNNER, KERNEL], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, env=env, cwd=ROOT)
            proc.stdin.write(b"kmalloc 96 7\nslabinfo\n")
            proc.stdin.flush()
            out = read_until_prompts(proc, 3)
            time.sleep(0.5)
            proc.send_signal(signal.SIGTERM)
            rest, _ = proc.communicate(timeout=60)
            out = (out + rest).decode(errors="replace").replace("\r\n", "\n")
            self.assertEqual(proc.returncode, 130, out)
            self.assertIn("stopped by the user: vmcore written to", out)
            self.assertIn("stopped by a signal", out)
            code, offline, err = tool("core", core, "slabinfo")
            self.assertEqual((code, err), (0, ""), err)
            self.assertEqual(offline.splitlines(), reply_to(out, "slabinfo").splitlines())


@unittest.skipUnless(shutil.which("gdb"), "no gdb (scripts/setup.sh installs it)")
class GdbSession(unittest.TestCase):
    def test_magpie_commands_in_gdb_equal_the_shell(self):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        with tempfile.TemporaryDirectory() as tmp:
            env = dict(os.environ, MAGPIE_VMCORE="none", MAGPIE_TIMEOUT="120",
                       MAGPIE_APPEND="kfence.sample_interval=0",
                       MAGPIE_QEMU_ARGS=f"-gdb tcp:127.0.0.1:{port}",
                       MAGPIE_GDB_CORE=os.path.join(tmp, "gdb.core"))
            proc = subprocess.Popen([RUNNER, KERNEL], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, env=env, cwd=ROOT)
            try:
                proc.stdin.write(b"kmalloc 128 9\nslabinfo\n")
                proc.stdin.flush()
                out = read_until_prompts(proc, 3)
                time.sleep(0.5)
                held = HEX.findall(reply_to(out.decode(errors="replace").replace("\r\n", "\n"), "kmalloc 128 9"))
                gdb = subprocess.run(
                    ["gdb", "-batch", "-nx", "-x", os.path.join(ROOT, "scripts", "magpie-gdb.py"),
                     "-ex", f"target remote 127.0.0.1:{port}", "-ex", "magpie slabinfo",
                     "-ex", f"magpie whatis {held[0]}", "-ex", "magpie verify", "-ex", "magpie kfence",
                     "-ex", "magpie errors", "-ex", "magpie slabtop --sort n", "-ex", "magpie findleaks",
                     "-ex", "magpie allocinfo --top 3", "-ex", "detach", KERNEL],
                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=ROOT, timeout=120)
                proc.stdin.write(b"poweroff\n")
                proc.stdin.flush()
                rest, _ = proc.communicate(timeout=60)
            finally:
                if proc.poll() is None:
                    proc.kill()
            out = (out + rest).decode(errors="replace").replace("\r\n", "\n")
            report = gdb.stdout.decode(errors="replace")
            self.assertEqual(gdb.returncode, 0, report)
            live = reply_to(out, "slabinfo").splitlines()
            start = report.index("slabinfo - version: 2.1")
            self.assertEqual(report[start:].splitlines()[:len(live)], live)
            # (kmalloc-128 or one of its random copies, kmalloc-rnd-NN-128)
            self.assertRegex(report, f"{held[0]} is allocated from kmalloc-(rnd-\\d+-)?128:")
            self.assertRegex(report, r"\d+ caches, \d+ slabs walked; 0 broken")
            self.assertIn("sample interval: off (forced samples only)", report)
            self.assertIn("no errors reported", report)
            self.assertIn(" Magazines since boot ", report)
            self.assertRegex(report, r"findleaks: \d+ objects, \d+ reachable, \d+ resting in magazines")
            self.assertRegex(report, r"allocinfo - version: 1\.0\n#     <size>  <calls> <tag info>\n +\d+ +\d+ \S+:\d+ func:")


class VmcoreDebugReports(unittest.TestCase):
    def test_kfence_and_errors_equal_the_shell(self):
        with tempfile.TemporaryDirectory() as tmp:
            core = os.path.join(tmp, "kfence.core")
            os.environ["MAGPIE_VMCORE"] = core
            try:
                # Forced samples only (interval 0): lkdtm's two bugs leave
                # freed objects with both stacks, nothing samples after.
                code, out = boot(["lkdtm KFENCE_OOB_RIGHT", "lkdtm KFENCE_DOUBLE_FREE", "kmalloc 64 2",
                                  "lkdtm SLAB_FREE_DOUBLE", "lkdtm SLAB_FREE_CROSS", "lkdtm WRITE_AFTER_FREE",
                                  "kmem kfence", "kmem kfence objects", "kmem errors", "vmcore", "poweroff"],
                                 append="kfence.sample_interval=0")
            finally:
                del os.environ["MAGPIE_VMCORE"]
            self.assertEqual(code, 0, out)
            for args, command in ((["kfence"], "kmem kfence"), (["kfence", "objects"], "kmem kfence objects"),
                                  (["errors"], "kmem errors")):
                code, offline, err = tool("core", core, *args)
                self.assertEqual((code, err), (0, ""), err)
                self.assertEqual(offline.splitlines(), reply_to(out, command).splitlines())
            self.assertRegex(tool("core", core, "kfence")[1], r"\ntotal bugs: [2-9]\n")
            code, objects, _ = tool("core", core, "kfence", "objects")
            self.assertRegex(objects, r"kfence-#\d+: 0x[0-9a-f]+-0x[0-9a-f]+, size=\d+, cache=lkdtm-kfence\n\n"
                                      r"allocated by task 0 on cpu \d+ at \d+\.\d{6}s:\n <?magpie::")
            self.assertIn("\nfreed by task 0 on cpu ", objects)
            self.assertIn("kfence-#62 unused", objects)
            code, errors, _ = tool("core", core, "errors")
            self.assertRegex(errors, r"^\d+ error\(s\) reported since boot; the last \d+:\n--- error #1 ")
            self.assertIn("kernel memory allocator: duplicate free: buffer freed twice", errors)
            self.assertIn("kernel memory allocator: buffer freed to wrong cache", errors)
            code, _, err = tool("core", core, "kfence", "bogus")
            self.assertNotEqual(code, 0)
            self.assertIn("kfence: unexpected 'bogus'; usage: kfence [objects]", err)


ALLOCINFO = ["allocinfo", "allocinfo --top 5", "allocinfo --file kmem.rs -h",
             "allocinfo --function cmd_leak --accurate yes", "allocinfo --sort calls --min-size 1"]


class VmcoreFindleaks(unittest.TestCase):
    """`findleaks` from a core equals the shell's `kmem findleaks` on the
    same leaks (test_findleaks.py's, in three kinds of memory: small
    slabs, a bufctl cache, a traced cache), and the hang's core (the
    shell idle, no command running) finds them too; `allocinfo` with
    its filters equals the shell's."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.core = os.path.join(cls.tmp.name, "leaks.core")
        os.environ["MAGPIE_VMCORE"] = cls.core
        try:
            cls.code, cls.out = boot(["stress", "kmalloc 100", "leak 64 10", "kmemtrace start kmalloc-48",
                                      "leak 48 3", "leak 5000 2", "kmem findleaks", *ALLOCINFO, "vmcore",
                                      "poweroff"])
        finally:
            del os.environ["MAGPIE_VMCORE"]

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_findleaks_equals_the_shell_line_for_line(self):
        self.assertEqual(self.code, 0, self.out)
        live = reply_to(self.out, "kmem findleaks")
        start = time.monotonic()
        code, offline, err = tool("core", self.core, "findleaks")
        seconds = time.monotonic() - start
        self.assertEqual((code, err), (0, ""), err)
        self.assertEqual(offline.splitlines(), live.splitlines())
        groups = {line.split()[0]: line.split()[1] for line in offline.splitlines()[1:]
                  if line.startswith("kmalloc-")}
        self.assertEqual(groups, {"kmalloc-64": "10", "kmalloc-48": "3", "kmalloc-5056": "2"}, offline)
        self.assertIn(" cmd_leak\n", offline)
        self.assertRegex(offline, r"\n {11}Total {6}15 buffers, 10896 bytes\n")
        # The target is 2 s on a 256 MiB image (0.8 s measured);
        # a loaded machine gets slack.
        self.assertLess(seconds, 20, f"findleaks took {seconds:.1f} s")

    def test_allocinfo_equals_the_shell_line_for_line(self):
        self.assertEqual(self.code, 0, self.out)
        for command in ALLOCINFO:
            code, offline, err = tool("core", self.core, *command.split())
            self.assertEqual((code, err), (0, ""), f"{command}: {err}")
            self.assertEqual(offline.splitlines(), reply_to(self.out, command).splitlines(), command)
        # The leaks' site, and every site of the section (untagged last).
        full = tool("core", self.core, "allocinfo")[1]
        # The 15 leaked objects (and nothing else) at cmd_leak's site.
        self.assertRegex(full, r"\n +\d+ +15 kernel/src/shell/kmem.rs:\d+ func:cmd_leak\n")
        self.assertTrue(full.endswith("untagged:0 func:untagged\n"), full)
        code, _, err = tool("core", self.core, "allocinfo", "--sort", "size")
        self.assertNotEqual(code, 0)
        self.assertIn("unknown sort key 'size'; expected bytes or calls", err)

    def test_a_quiet_kernels_core_has_no_leaks(self):
        with tempfile.TemporaryDirectory() as tmp:
            core = os.path.join(tmp, "quiet.core")
            env = dict(os.environ, MAGPIE_VMCORE=core, MAGPIE_TIMEOUT="20",
                       MAGPIE_APPEND="kfence.sample_interval=0")
            # A hang at the prompt (the shell idle, no command's frames):
            # the boot CPU's stack from its stack pointer up.
            proc = subprocess.Popen([RUNNER, KERNEL], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, env=env, cwd=ROOT)
            out, _ = proc.communicate(b"stress\nkmem findleaks\n", timeout=120)
            out = out.decode(errors="replace").replace("\r\n", "\n")
            self.assertEqual(proc.returncode, 1, out)
            self.assertIn("findleaks: no memory leaks detected", out)
            code, offline, err = tool("core", core, "findleaks")
            self.assertEqual((code, err), (0, ""), err)
            self.assertTrue(offline.startswith("findleaks: no memory leaks detected\n"), offline)
            # (The idle kernel's reap has emptied the magazines by then.)
            self.assertRegex(offline, r"findleaks: ([1-9]\d*) objects, \1 reachable, ")


class HobbyKernelCore(unittest.TestCase):
    """The adopter's case: examples/hobby-kernel (no shell, the shipped
    glue, a 100 KiB heap) panics with `hobby.panic` after printing its
    slabinfo through the library; its panic handler tells pvpanic, the
    runner takes the core, and magpie-kmem reads it with no kernel ELF
    of ours (the descriptor found by its magic)."""

    def test_a_core_of_the_hobby_kernel_reads_as_it_printed(self):
        build = subprocess.run(["cargo", "build", "-q", "-p", "magpie-hobby-kernel"], cwd=ROOT,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=600)
        self.assertEqual(build.returncode, 0, build.stdout.decode(errors="replace"))
        elf = os.path.join(ROOT, "target", "x86_64-unknown-none", "debug", "hobby-kernel")
        with tempfile.TemporaryDirectory() as tmp:
            core = os.path.join(tmp, "hobby.core")
            env = dict(os.environ, MAGPIE_VMCORE=core, MAGPIE_APPEND="hobby.panic", MAGPIE_TIMEOUT="120")
            proc = subprocess.run([RUNNER, elf], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, env=env, cwd=ROOT, timeout=300)
            out = proc.stdout.decode(errors="replace").replace("\r\n", "\n")
            self.assertEqual(proc.returncode, 1, out)
            self.assertIn("hobby.panic: 40 boxes held", out)
            self.assertIn(f"kernel panic: vmcore written to {core}", out)
            live = out.split("\nslabinfo\n", 1)[1].split("\n[failed]", 1)[0]
            code, offline, err = tool("core", core, "slabinfo")
            self.assertEqual((code, err), (0, ""), err)
            self.assertEqual(offline.splitlines(), live.splitlines())
            # The 40 boxes of a u64: kmalloc-8 holds at least 40.
            row = [line for line in offline.splitlines() if line.startswith("kmalloc-8 ")][0]
            self.assertGreaterEqual(int(row.split()[1]), 40, row)
            code, offline, err = tool("core", core, "kmemstat")
            self.assertEqual((code, err), (0, ""), err)
            self.assertRegex(offline, r"\nkmalloc-8 +: S :       8:")
            self.assertIn("\nslab-metadata ", offline)


class TerminalKeys(unittest.TestCase):
    """On a terminal (issue 31): Ctrl-C goes to the kernel and QEMU lives
    on; Ctrl-A X ends QEMU, as the README says."""

    def test_ctrl_c_reaches_the_guest_and_ctrl_a_x_ends_qemu(self):
        master, slave = pty.openpty()
        env = dict(os.environ, MAGPIE_VMCORE="none", MAGPIE_APPEND="kfence.sample_interval=0",
                   MAGPIE_TIMEOUT="120")
        proc = subprocess.Popen([RUNNER, KERNEL], stdin=slave, stdout=slave, stderr=slave, env=env, cwd=ROOT)
        os.close(slave)
        out = b""

        def pump(until, seconds=60):
            nonlocal out
            end = time.monotonic() + seconds
            while until not in out and time.monotonic() < end:
                ready, _, _ = select.select([master], [], [], 0.2)
                if ready:
                    try:
                        out += os.read(master, 65536)
                    except OSError:
                        return

        try:
            pump(PROMPT.encode())
            # Ctrl-C, then a line end (whatever the shell makes of the
            # byte, the next line is a fresh one), then a command.
            os.write(master, b"\x03")
            time.sleep(0.5)
            os.write(master, b"\r")
            time.sleep(0.5)
            os.write(master, b"help\r")
            pump(b"commands:")
            self.assertIsNone(proc.poll(), "Ctrl-C ended QEMU")
            self.assertIn(b"commands:", out)
            os.write(master, b"\x01x")
            pump(b"QEMU: Terminated", 20)
            self.assertEqual(proc.wait(timeout=30), 1)
            pump(b"Ctrl-A X", 5)
            self.assertIn(b"QEMU ended without isa-debug-exit (Ctrl-A X", out)
        finally:
            if proc.poll() is None:
                proc.kill()
            os.close(master)


class DocSession(unittest.TestCase):
    """docs/VMCORE.md's session, replayed as the README's are
    (test_readme's matcher): the kernel's replies, then the tool on the
    session's core."""

    def test_the_documented_session(self):
        from test_readme import MARKER, learn_addresses, match_lines, parse_options, parse_session, \
            substitute_addresses
        with open(os.path.join(ROOT, "docs", "VMCORE.md")) as f:
            lines = f.read().splitlines()
        sessions = []
        for index, line in enumerate(lines):
            marker = MARKER.match(line)
            if marker and lines[index + 1].startswith("```"):
                end = lines.index("```", index + 2)
                sessions.append((parse_options(marker.group(1)), lines[index + 2:end]))
        self.assertEqual(len(sessions), 1)
        options, body = sessions[0]
        self.assertIn("vmcore", options)
        any_number = options.get("numbers") == "any"
        _, commands, host = parse_session(body)
        with tempfile.TemporaryDirectory() as tmp:
            core = os.path.join(tmp, "doc.core")
            os.environ["MAGPIE_VMCORE"] = core
            try:
                code, out = boot([command for command, _ in commands])
            finally:
                del os.environ["MAGPIE_VMCORE"]
            seen = {}
            for command, expected in commands:
                # The runner's own lines (stderr) are the doc's prose.
                actual = [line for line in reply_to(out, command).splitlines()
                          if not line.startswith("run-qemu.sh:")]
                problem = match_lines(expected, actual, any_number)
                self.assertIsNone(problem, f"{command}: {problem}:\n{out}")
                learn_addresses(expected, actual, seen)
            for argv, expected in host:
                self.assertEqual(argv[:2], ["scripts/magpie-kmem", "core"], argv)
                args = [core if arg == "target/vmcore/latest.core" else substitute_addresses(arg, seen)
                        for arg in argv[1:]]
                code, offline, err = tool(*args)
                self.assertEqual(code, 0, err)
                problem = match_lines(expected, offline.splitlines(), any_number)
                self.assertIsNone(problem, f"{' '.join(argv)}: {problem}:\n{offline}")


class KmemtraceKeepsEachBoot(unittest.TestCase):
    def test_each_boot_has_its_file_and_latest_links_the_newest(self):
        directory = os.path.join(ROOT, "target", "kmemtrace")
        before = set(glob.glob(os.path.join(directory, "boot-*.kmt")))
        env_saved = os.environ.pop("MAGPIE_KMEMTRACE", None)
        try:
            for _ in range(2):
                code, out = boot(["kmemtrace record start", "kmalloc 64 2", "kmemtrace record stop",
                                  "kmemtrace dump", "poweroff"])
                self.assertEqual(code, 0, out)
        finally:
            if env_saved is not None:
                os.environ["MAGPIE_KMEMTRACE"] = env_saved
        new = sorted(set(glob.glob(os.path.join(directory, "boot-*.kmt"))) - before, key=os.path.getmtime)
        self.assertEqual(len(new), 2, new)
        latest = os.path.join(directory, "latest.kmt")
        self.assertTrue(os.path.islink(latest))
        self.assertEqual(os.path.realpath(latest), os.path.realpath(new[-1]))
        for path in new:
            self.assertGreater(os.path.getsize(path), 0, path)
        # Two boots' dumps: the diff flow needs no copy by hand.
        code, out, err = tool("diff", new[0], new[1])
        self.assertEqual(code, 0, err)


if __name__ == "__main__":
    unittest.main()
