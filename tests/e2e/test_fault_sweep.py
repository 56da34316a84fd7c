#!/usr/bin/env python3
"""The fault sweep on the booted shell (issue 19): every fault point
`fault list` shows is failed in turn (`fault FILE:LINE oneshot`) while a
shell command that reaches it runs, and the test checks that the point
injected exactly once, the command printed one clear error (or, for the
stress worker's sites, counted one failure and carried on), `allocinfo`
came back to its baseline (no leak on the error path), nothing panicked,
and the shell carries on: the same command succeeds again.

A point with no workload here fails the test unless `UNREACHABLE` names it
with the reason; a workload or reason that matches no point fails it too.
And the converse, `EveryAllocationIsAPoint`: a kmemtrace record over every
shell command must name no allocation call site outside a fault point's
function (or its scope), so an allocation added without a point fails.
Three boots: one to list the points, one to sweep them all, one to record
(2 to 15 s in all under TCG on the 2-core build machine, by its load).

`tests/fault_injection.rs` is the same sweep as a QEMU test kernel (and
with profiling compiled out); this one runs the kernel as shipped, so it
also reaches the points only a fresh boot has (the `stress-ctor` cache).

Run after `cargo build --bin magpie`.
"""
import json
import os
import re
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_shell import KERNEL, ROOT, allocinfo_rows, boot, replies  # noqa: E402

MAGPIE_KMEM = os.path.join(ROOT, "scripts", "magpie-kmem")
POINT = re.compile(r"^(\S+:\d+) module:(\S+) func:(\S+) class:(\S+) (\S+) hits:(\d+) injected:(\d+)$")


class Workload:
    """Shell lines that reach a point, what the output says when it fails,
    and the lines that undo the lines' effect."""

    def __init__(self, lines, error, cleanup=(), warm_up=True):
        self.lines = list(lines)
        self.error = error
        self.cleanup = list(cleanup)
        # False: the point is reached only the first time (it must be swept
        # before anything else reaches it, and with no warm-up run).
        self.warm_up = warm_up


STRESS = "stress --cpus all --ops 4000 --seed 7"

# (module, function) -> how the point is reached. `failures=1` stands for
# the stress total line's failure count.
WORKLOADS = {
    ("magpie::smp::stress", "ctor_cache"): Workload(
        ["stress --cpus 1 --ops 100"], "error: out of memory (for the stress-ctor cache)", warm_up=False),
    ("magpie::shell::kmem", "cmd_kmalloc"): Workload(
        ["kmalloc 64 4"], "error: out of memory (kmalloc(64) failed after 0 of 4 objects)", ["kfree all"]),
    ("magpie::shell::kmem", "hold_room"): Workload(
        ["kmalloc 64 4"], "error: out of memory (64 bytes to hold 4 more objects)", ["kfree all"]),
    ("magpie::shell::kmem", "cmd_leak"): Workload(
        ["leak 64 1"], "error: out of memory (kmalloc(64) failed after 0 of 1 objects)"),
    ("magpie::shell::smp", "online_cpus"): Workload(
        ["stress --cpus 1 --ops 100"], "error: out of memory (a list of 2 CPUs)"),
    ("magpie::smp::stress", "run"): Workload(
        [STRESS], "error: out of memory (the stress run's bookkeeping)"),
    ("magpie::smp::stress", "alloc"): Workload([STRESS], "failures=1"),
    ("magpie::smp::stress", "hand_off"): Workload([STRESS], "failures=1"),
    ("magpie::smp", "run_on_cpus"): Workload([STRESS], "error: out of memory (the work items)"),
    ("magpie::profiling::alloc_tag", "mark"): Workload(
        ["allocinfo mark"], "error: out of memory (a copy of every site's counts for the mark)"),
    ("magpie::profiling::alloc_tag", "diff"): Workload(
        ["allocinfo mark", "allocinfo diff"], "error: out of memory (one row per site for the diff)"),
    ("magpie::tracing::event_stream", "start"): Workload(
        ["kmemtrace record start --force"], "error: cannot record: no memory for kmemtrace buffers (", ["kmemtrace record stop"]),
    ("magpie::debug::findleaks", "findleaks"): Workload(
        ["kmem findleaks"], "error: findleaks: no memory for the scan's table ("),
    ("magpie::debug::lkdtm", "alloc"): Workload(
        ["lkdtm SLAB_FREE_CROSS"],
        "error: lkdtm SLAB_FREE_CROSS: could not set up: out of memory; nothing was done"),
}

# (module, function) -> why no shell command reaches the point.
UNREACHABLE = {
    ("magpie::smp", "run_on"):
        "posts one work item: only tests call it (tests/smp_stress.rs), no shell command",
    ("magpie::dev::virtio_console", "init"):
        "sets up the dump channel at boot; `kmemtrace record start` finds it set up",
}


# Functions whose allocations a point's allocation scope covers: helper ->
# the function holding the point (same file).
SCOPE_HELPERS = {
    "bookkeeping": "run",
    "grow_inbox": "hand_off",
    "shared_jobs": "run_on_cpus",
    "new_job": "run_on_cpus",
}

# Call sites in the Rust library (the record names the first frame outside
# the allocator's text, and `VecDeque`'s out-of-line growth is not in it):
# function -> the kernel callers, each under a fault point.
LIBRARY_SITES = {
    "<VecDeque>::try_reserve":
        "smp::stress::grow_inbox (hand_off's point), smp::new_job (run_on_cpus' and run_on's)",
}

# Every other shell command, for the coverage record: what they allocate
# must be under a fault point too.
OTHER_COMMANDS = [
    "help", "kmemstat", "slabinfo", "slabtop --once", "allocinfo", "allocinfo --top 3 -h",
    "kmalloc 100 3", "kmemtrace start kmalloc-104", "kmemtrace print kmalloc-104",
    "kmemtrace stop kmalloc-104", "kmemtrace reset kmalloc-104",
    "allocinfo ctx kernel/src/shell/kmem.rs:117 enable", "kmalloc 100 2",
    "allocinfo ctx kernel/src/shell/kmem.rs:117 print", "allocinfo ctx kernel/src/shell/kmem.rs:117 disable",
    "kfree all", "reap", "kmem verify", "kmem errors", "kmem cache kmalloc-64",
    "kmem cache kmalloc-64 validate", "kmem cache kmalloc-64 shrink", "timestats", "cpus", "fault list",
    "lkdtm list", "lkdtm SLAB_FREE_DOUBLE", "lkdtm SLAB_FREE_CROSS", "lkdtm SLAB_FREE_PAGE",
    "lkdtm SLAB_LINEAR_OVERFLOW", "lkdtm WRITE_AFTER_FREE", "lkdtm READ_AFTER_FREE",
    "kmemtrace record status",
]


def points(listing):
    """[(FILE:LINE, module, function, state, hits, injected)] of a `fault list` reply."""
    rows = []
    for line in listing.splitlines():
        match = POINT.match(line)
        if match:
            location, module, function, _, state, hits, injected = match.groups()
            rows.append((location, module, function, state, int(hits), int(injected)))
    return rows


def allocinfo_totals(reply):
    """(bytes, calls) summed over every `allocinfo` row."""
    rows = allocinfo_rows(reply).values()
    if not rows:
        raise AssertionError(f"no allocinfo rows in:\n{reply}")
    return sum(int(size) for size, _ in rows), sum(calls for _, calls in rows)


def outcome(reply):
    """The workload's output, with the stress total line's failure count
    appended as `failures=N`."""
    for line in reply.splitlines():
        if line.startswith("total "):
            words = line.split()
            if words[6] != "0":
                raise AssertionError(f"stress found corruption:\n{reply}")
            reply += f"failures={words[5]}\n"
    return reply


@unittest.skipUnless(os.path.exists(KERNEL), f"{KERNEL} not built; run `cargo build --bin magpie`")
class FaultSweep(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        code, out = boot(["fault list", "poweroff"])
        assert code == 0, out
        cls.points = points(dict(replies(out))["fault list"])
        assert cls.points, out
        reachable = [p for p in cls.points if (p[1], p[2]) in WORKLOADS]
        # Points reached only once go first, before anything else reaches them.
        reachable.sort(key=lambda p: WORKLOADS[(p[1], p[2])].warm_up)
        script, cls.steps = [], []
        for location, module, function, *_ in reachable:
            workload = WORKLOADS[(module, function)]
            if workload.warm_up:
                script += workload.lines + workload.cleanup  # lazily made state stays
            step = {"location": location, "function": function, "workload": workload}
            step["baseline"] = len(script)
            script.append("allocinfo")
            script.append(f"fault {location} oneshot")
            step["run"] = (len(script), len(workload.lines))
            script += workload.lines
            step["list"] = len(script)
            script.append(f"fault list {location}")
            script += workload.cleanup
            step["after"] = len(script)
            script.append("allocinfo")
            step["again"] = (len(script), len(workload.lines))
            script += workload.lines + workload.cleanup
            cls.steps.append(step)
        script.append("poweroff")
        cls.script = script
        cls.code, cls.out = boot(script, timeout=170)
        cls.replies = replies(cls.out)

    def reply(self, index):
        command, reply = self.replies[index]
        self.assertEqual(command, self.script[index], "the replies follow the script")
        return reply

    def replies_of(self, span):
        start, count = span
        return "".join(self.reply(index) for index in range(start, start + count))

    def test_every_point_has_a_workload_or_a_reason(self):
        keys = {(module, function) for _, module, function, *_ in self.points}
        for location, module, function, *_ in self.points:
            self.assertTrue(
                (module, function) in WORKLOADS or (module, function) in UNREACHABLE,
                f"fault point {location} ({module} func:{function}) has no workload: "
                "add one to WORKLOADS, or name it in UNREACHABLE with the reason")
        for key in list(WORKLOADS) + list(UNREACHABLE):
            self.assertIn(key, keys, f"{key} matches no fault point")
        self.assertEqual(len(self.steps) + sum(1 for p in self.points if (p[1], p[2]) in UNREACHABLE),
                         len(self.points))

    def test_the_kernel_survives_the_sweep(self):
        self.assertEqual(self.code, 0, self.out[-4000:])
        self.assertNotIn("panicked", self.out)
        self.assertNotIn("PANIC", self.out)
        self.assertEqual(self.replies[-1][0], "poweroff")

    def test_each_point_injects_once_with_one_clear_error_and_no_leak(self):
        for step in self.steps:
            location, workload = step["location"], step["workload"]
            with self.subTest(point=location, func=step["function"]):
                listed = points(self.reply(step["list"]))
                self.assertEqual(len(listed), 1, self.reply(step["list"]))
                _, _, _, state, hits, injected = listed[0]
                self.assertEqual((state, hits, injected), ("disabled", 1, 1),
                                 f"{location} not reached once by {workload.lines}")
                out = outcome(self.replies_of(step["run"]))
                self.assertIn(workload.error, out)
                errors = [line for line in out.splitlines() if "error" in line]
                self.assertLessEqual(len(errors), 1, out)
                self.assertEqual(allocinfo_totals(self.reply(step["after"])),
                                 allocinfo_totals(self.reply(step["baseline"])),
                                 f"{location}: allocinfo not back to its baseline")
                again = self.replies_of(step["again"])
                self.assertNotIn("error", again, f"{location}: the command fails again")


@unittest.skipUnless(os.path.exists(KERNEL), f"{KERNEL} not built; run `cargo build --bin magpie`")
@unittest.skipUnless(os.path.exists(MAGPIE_KMEM), "scripts/magpie-kmem not on this branch")
class EveryAllocationIsAPoint(unittest.TestCase):
    """A kmemtrace record over every shell command (each workload above and
    the rest of `help`): every call site the record names lies in a
    function that holds a fault point (or in a helper of its allocation
    scope, `SCOPE_HELPERS`; or is a library function `LIBRARY_SITES`
    names the callers of). A new allocation without a point fails here."""

    def test_every_call_site_in_a_record_of_every_command_is_a_fault_point(self):
        lines = []
        for workload in WORKLOADS.values():
            lines += [line for line in workload.lines + workload.cleanup
                      if not line.startswith("kmemtrace record")]
        script = ["fault list", "kmemtrace record start"] + lines + OTHER_COMMANDS
        script += ["kmemtrace record stop", "kmemtrace dump", "poweroff"]
        with tempfile.TemporaryDirectory() as tmp:
            dump = os.path.join(tmp, "sweep.kmt")
            os.environ["MAGPIE_KMEMTRACE"] = dump
            try:
                code, out = boot(script, timeout=170)
            finally:
                del os.environ["MAGPIE_KMEMTRACE"]
            self.assertEqual(code, 0, out[-4000:])
            self.assertNotIn("panicked", out)
            result = subprocess.run([MAGPIE_KMEM, "stat", "--caller", "--json", "--top", "100000",
                                     "--kernel", KERNEL, dump],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
        self.assertEqual(result.returncode, 0, result.stderr.decode(errors="replace"))
        sites = json.loads(result.stdout)["callsites"]
        self.assertTrue(sites)
        held = {(location.split(":")[0], function)
                for location, _, function, *_ in points(dict(replies(out))["fault list"])}
        for site in sites:
            file = site["location"].split(":")[0]
            if not file.startswith("kernel/"):
                name = site["function"].rsplit("+0x", 1)[0]
                self.assertIn(name, LIBRARY_SITES, f"library call site {site} with no kernel caller named")
                continue
            func = SCOPE_HELPERS.get(site["func"], site["func"])
            self.assertIn((file, func), held,
                          f"{site['location']} func:{site['func']} ({site['function']}, {site['hit']} "
                          "allocations) has no fault point: allocate through try_alloc! or kmalloc!")


if __name__ == "__main__":
    unittest.main()
