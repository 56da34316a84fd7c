#!/usr/bin/env python3
"""kmemtrace end to end: boot the real kernel, record a known workload with
`kmemtrace record start`, send it with `kmemtrace dump` over the virtio
console to a file (boot/run-qemu.sh, MAGPIE_KMEMTRACE), and read the dump
back here against docs/KMEMTRACE-ABI.md: header, CRC, trailer, the shell's
call site with exact sizes, stress's cross-CPU frees as ping-pong, the
objects still held, and overruns with `kmemtrace.subbufs=1`.

`scripts/magpie-kmem` (the host tool) then reads the same dump: `check`
passes, `stat --caller` shows the shell site's exact calls and bytes (and
21.9 % fragmentation per 100 B object with `--alloc`), its ping-pong for
stress's sites equals stress's cross-CPU frees, `live` lists the objects
the shell still holds.
"""
import json
import os
import re
import struct
import subprocess
import sys
import tempfile
import unittest
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_shell import KERNEL, ROOT, boot, kmalloc_site, reply_to  # noqa: E402

HEX = re.compile(r"0x[0-9a-f]{8,16}")
MAGPIE_KMEM = os.path.join(ROOT, "scripts", "magpie-kmem")


def read_dumps(path):
    """Every dump in the file, each as a dict; asserts the format."""
    with open(path, "rb") as f:
        data = f.read()
    dumps = []
    at = 0
    while at < len(data):
        start = at
        magic, abi, header_size, event_size, nr_cpus = struct.unpack_from("<8sIIII", data, at)
        assert magic == b"MAGPKMT\0", magic
        assert (abi, header_size, event_size) == (1, 64, 64)
        build_id = data[at + 24:at + 44]
        flags, record_start_ns, stack_depth = struct.unpack_from("<IQI", data, at + 44)
        dump = dict(nr_cpus=nr_cpus, build_id=build_id, flags=flags,
                    record_start_ns=record_start_ns, stack_depth=stack_depth,
                    caches={}, stacks={}, cpu_records=[], events=[])
        at += 64
        nr_records = 0
        while True:
            kind, _, length = struct.unpack_from("<HHI", data, at)
            assert length % 8 == 0 and at + length <= len(data), (kind, length)
            body = data[at + 8:at + length]
            if kind == 1:
                cache_id, obj_size, align, cflags, name_len = struct.unpack_from("<IIIII", body)
                dump["caches"][cache_id] = (body[24:24 + name_len].decode(), obj_size)
            elif kind == 2:
                stack_id, depth = struct.unpack_from("<II", body)
                dump["stacks"][stack_id] = struct.unpack_from(f"<{depth}Q", body, 8)
            elif kind == 3:
                cpu, count, overruns = struct.unpack_from("<IIQ", body)
                assert length == 8 + 24 + 64 * count
                dump["cpu_records"].append((cpu, count, overruns))
                for i in range(count):
                    fields = struct.unpack_from("<BBHIQQQQQQII", body, 24 + 64 * i)
                    dump["events"].append(dict(zip(
                        ["event", "type", "cpu", "cache_id", "ns", "seq", "site", "ptr",
                         "req", "alloc", "flags", "stack"], fields)))
            elif kind == 0xFFFF:
                nr_events, nr_overruns, trailer_records, crc = struct.unpack_from("<QQQI", body)
                assert crc == zlib.crc32(data[start:at]), "checksum"
                assert trailer_records == nr_records
                dump.update(nr_events=nr_events, nr_overruns=nr_overruns, nr_bytes=at + length - start)
                at += length
                break
            nr_records += 1
            at += length
        assert dump["nr_events"] == len(dump["events"])
        dumps.append(dump)
    return dumps


def boot_recording(script, path, append=None):
    """Boots with the dump channel connected to `path`; returns (code, output)."""
    os.environ["MAGPIE_KMEMTRACE"] = path
    try:
        return boot(script, append=append)
    finally:
        del os.environ["MAGPIE_KMEMTRACE"]


def elf_sections(data):
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3a)
    sections = []
    for i in range(shnum):
        name, kind, _, addr, offset, size, link = struct.unpack_from("<IIQQQQI", data, shoff + i * shentsize)
        sections.append((name, kind, addr, offset, size, link))
    strtab = sections[shstrndx]
    names = data[strtab[3]:strtab[3] + strtab[4]]
    return [(names[s[0]:names.index(b"\0", s[0])].decode(),) + s[1:] for s in sections]


def elf_build_id(path):
    with open(path, "rb") as f:
        data = f.read()
    for name, kind, addr, offset, size, link in elf_sections(data):
        if name == ".note.gnu.build-id":
            namesz, descsz, ntype = struct.unpack_from("<III", data, offset)
            assert (namesz, descsz, ntype) == (4, 20, 3)
            return data[offset + 16:offset + 36]
    return None


def elf_functions(path):
    """(start, end, mangled name) of every function, sorted."""
    with open(path, "rb") as f:
        data = f.read()
    sections = elf_sections(data)
    symtab = next(s for s in sections if s[1] == 2)
    strtab = sections[symtab[5]]
    strings = data[strtab[3]:strtab[3] + strtab[4]]
    functions = []
    for at in range(symtab[3], symtab[3] + symtab[4], 24):
        name, info, _, _, value, size = struct.unpack_from("<IBBHQQ", data, at)
        if info & 0xf == 2 and size:
            functions.append((value, value + size, strings[name:strings.index(b"\0", name)].decode()))
    return sorted(functions)


def function_of(functions, address):
    for start, end, name in functions:
        if start <= address < end:
            return name
    return "?"


class KmemtraceSession(unittest.TestCase):
    """The session of issue 7: record, a known workload, stop, dump."""

    @classmethod
    def setUpClass(cls):
        if not os.path.exists(KERNEL):
            raise unittest.SkipTest(f"{KERNEL} not built; run `cargo build --bin magpie`")
        cls.tmp = tempfile.TemporaryDirectory()
        cls.path = os.path.join(cls.tmp.name, "session.kmt")
        cls.code, cls.out = boot_recording([
            "kmemtrace record start",
            "kmalloc 100 10",
            "kfree 4",
            "kmalloc 4000 3",
            "stress --cpus all --ops 3000",
            "kmemtrace record stop",
            "kmemtrace record status",
            "kmemtrace dump",
            "poweroff",
        ], cls.path)
        cls.dumps = read_dumps(cls.path) if os.path.exists(cls.path) else []
        cls.functions = elf_functions(KERNEL)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def dump(self):
        self.assertEqual(self.code, 0, self.out)
        self.assertEqual(len(self.dumps), 1, self.out)
        return self.dumps[0]

    def test_dump_matches_what_the_shell_says_it_sent(self):
        dump = self.dump()
        text = reply_to(self.out, "kmemtrace dump")
        sent = re.search(r"sent (\d+) events \((\d+) overruns\) in (\d+) records, (\d+) bytes", text)
        self.assertIsNotNone(sent, text)
        self.assertIn("over the virtio console", text)
        self.assertEqual(int(sent.group(1)), dump["nr_events"])
        self.assertEqual(int(sent.group(2)), 0)
        self.assertEqual(int(sent.group(4)), dump["nr_bytes"])
        self.assertEqual(os.path.getsize(self.path), dump["nr_bytes"])
        self.assertEqual(dump["nr_cpus"], 2)
        self.assertEqual(dump["flags"], 0)

    def test_header_carries_the_kernel_build_id(self):
        build_id = elf_build_id(KERNEL)
        self.assertIsNotNone(build_id, "kernel linked without a build id")
        self.assertNotEqual(build_id, bytes(20))
        self.assertEqual(self.dump()["build_id"], build_id)

    def test_status_shows_each_cpu_and_the_total(self):
        text = reply_to(self.out, "kmemtrace record status")
        self.assertIn("stopped, all caches", text)
        rows = re.findall(r"^\s+(\d+)\s+(\d+)\s+(\d+)\s+\d+\.\d%$", text, re.M)
        self.assertEqual([int(r[0]) for r in rows], [0, 1], text)
        total = re.search(r"^total\s+(\d+)\s+(\d+)$", text, re.M)
        self.assertEqual(int(total.group(1)), self.dump()["nr_events"])
        self.assertEqual(int(total.group(2)), 0)

    def shell_site_events(self):
        """Events whose call site is in the shell's kmalloc/kfree commands."""
        return [e for e in self.dump()["events"]
                if "cmd_kmalloc" in function_of(self.functions, e["site"])
                or "cmd_kfree" in function_of(self.functions, e["site"])]

    def test_shell_kmalloc_site_has_exact_calls_and_bytes(self):
        printed = [int(a, 16) for a in HEX.findall(reply_to(self.out, "kmalloc 100 10"))]
        printed_big = [int(a, 16) for a in HEX.findall(reply_to(self.out, "kmalloc 4000 3"))]
        allocs = [e for e in self.shell_site_events() if e["event"] == 1 and e["type"] == 1
                  and e["req"] in (100, 4000)]
        hundred = [e for e in allocs if e["req"] == 100]
        self.assertEqual([e["ptr"] for e in hundred], printed)
        self.assertTrue(all(e["alloc"] == 104 for e in hundred))
        self.assertEqual(len({e["site"] for e in hundred}), 1, "one call site")
        big = [e for e in allocs if e["req"] == 4000]
        self.assertEqual([e["ptr"] for e in big], printed_big)
        # 4000 B in kmalloc-4032 (size classes 64 bytes apart above 1 KiB).
        self.assertTrue(all(e["alloc"] == 4032 for e in big))
        # 100 B in kmalloc-104: 100 - 100 * 100/104 = 3.8 % internal fragmentation.
        frag = 100 - 100 * sum(e["req"] for e in hundred) / sum(e["alloc"] for e in hundred)
        self.assertEqual(f"{frag:.1f}", "3.8")
        names = self.dump()["caches"]
        self.assertEqual(names[hundred[0]["cache_id"]], ("kmalloc-104", 104))
        self.assertEqual(names[big[0]["cache_id"]], ("kmalloc-4032", 4032))

    def test_kfree_events_are_the_last_four(self):
        printed = [int(a, 16) for a in HEX.findall(reply_to(self.out, "kmalloc 100 10"))]
        frees = [e["ptr"] for e in self.shell_site_events() if e["event"] == 2]
        self.assertEqual(frees, printed[::-1][:4])

    def test_live_objects_of_the_shell_site_are_exactly_those_held(self):
        live = {}
        for e in self.dump()["events"]:
            if e["event"] == 1:
                live[e["ptr"]] = e
            elif e["event"] == 2:
                live.pop(e["ptr"], None)
        held = sorted(p for p, e in live.items()
                      if "cmd_kmalloc" in function_of(self.functions, e["site"])
                      and e["req"] in (100, 4000))
        printed = [int(a, 16) for a in HEX.findall(reply_to(self.out, "kmalloc 100 10"))][:6]
        printed += [int(a, 16) for a in HEX.findall(reply_to(self.out, "kmalloc 4000 3"))]
        self.assertEqual(held, sorted(printed))

    def test_ping_pong_of_stress_sites_equals_its_cross_cpu_frees(self):
        text = reply_to(self.out, "stress --cpus all --ops 3000")
        total = re.search(r"^total\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)", text, re.M)
        cross_frees = int(total.group(4))
        self.assertGreater(cross_frees, 0, text)
        # Ping-pong (as magpie-kmem counts it): a free on another CPU than
        # the allocation. Stress frees every object it allocated through
        # Worker::free; its own bookkeeping (Vec, inboxes) is not counted.
        alloc_cpu = {}
        ping_pong = 0
        nr_frees = 0
        for e in sorted(self.dump()["events"], key=lambda e: (e["ns"], e["cpu"], e["seq"])):
            if e["event"] == 1:
                alloc_cpu[e["ptr"]] = e["cpu"]
            elif e["event"] == 2 and "6Worker4free" in function_of(self.functions, e["site"]):
                nr_frees += 1
                ping_pong += alloc_cpu.pop(e["ptr"]) != e["cpu"]
        self.assertEqual(nr_frees, int(total.group(3)), "stress's frees")
        self.assertEqual(ping_pong, cross_frees)

    def test_each_cpu_is_in_sequence_and_time_order(self):
        for cpu in range(2):
            events = [e for e in self.dump()["events"] if e["cpu"] == cpu]
            self.assertEqual([e["seq"] for e in events], list(range(len(events))))
            times = [e["ns"] for e in events]
            self.assertEqual(times, sorted(times))
            self.assertTrue(all(t >= self.dump()["record_start_ns"] for t in times))

    def magpie_kmem(self, *args):
        """Runs scripts/magpie-kmem ARGS --kernel KERNEL on the dump."""
        self.dump()
        result = subprocess.run([MAGPIE_KMEM, *args, "--kernel", KERNEL, self.path],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
        return result.returncode, result.stdout.decode(errors="replace"), result.stderr.decode(errors="replace")

    def shell_kmalloc_site(self):
        """The return address of the shell's `kmalloc!` (the 100 B allocations)."""
        sites = {e["site"] for e in self.shell_site_events() if e["event"] == 1 and e["req"] == 100}
        self.assertEqual(len(sites), 1)
        return sites.pop()

    @unittest.skipUnless(os.path.exists(MAGPIE_KMEM), "scripts/magpie-kmem not on this branch")
    def test_magpie_kmem_check_passes(self):
        code, out, err = self.magpie_kmem("check")
        self.assertEqual(code, 0, out + err)
        self.assertIn("check: OK", out)

    @unittest.skipUnless(os.path.exists(MAGPIE_KMEM), "scripts/magpie-kmem not on this branch")
    def test_magpie_kmem_stat_shows_the_shell_site_exactly(self):
        code, out, err = self.magpie_kmem("stat", "--caller", "--json")
        self.assertEqual(code, 0, err)
        sites = json.loads(out)["callsites"]
        site = next(s for s in sites if int(s["call_site"], 16) == self.shell_kmalloc_site())
        self.assertIn("cmd_kmalloc", site["function"])
        # Symbolized from DWARF, the site is the kmalloc! line in the shell
        # (the allocation macros collapse their debug info to the caller),
        # the same file:line allocinfo shows, not the macro's body in
        # kernel/src/profiling/tagged.rs.
        self.assertEqual(site["location"], kmalloc_site(), site)
        # kmalloc 100 10 and kmalloc 4000 3 from the one kmalloc! line.
        self.assertEqual((site["hit"], site["bytes_req"], site["bytes_alloc"]),
                         (13, 10 * 100 + 3 * 4000, 10 * 104 + 3 * 4032))
        self.assertEqual(site["frees"], 4)
        self.assertEqual(site["pingpong"], 0)
        # Per pointer (--alloc): each 100 B object in kmalloc-104 wastes 3.8 %.
        code, out, err = self.magpie_kmem("stat", "--alloc", "--json")
        self.assertEqual(code, 0, err)
        # (The six still held: the four freed addresses were reused by stress.)
        held = {int(a, 16) for a in HEX.findall(reply_to(self.out, "kmalloc 100 10"))[:6]}
        rows = [r for r in json.loads(out)["allocs"] if int(r["ptr"], 16) in held]
        self.assertEqual(len(rows), 6)
        self.assertTrue(all(f'{r["frag_percent"]:.1f}' == "3.8" for r in rows), rows)
        # The text report says the same.
        code, out, err = self.magpie_kmem("stat", "--caller")
        self.assertEqual(code, 0, err)
        self.assertRegex(out, r"cmd_kmalloc\+0x[0-9a-f]+\s*\|\s*13136/1010\s*\|\s*13000/1000\s*\|\s*13 ")

    @unittest.skipUnless(os.path.exists(MAGPIE_KMEM), "scripts/magpie-kmem not on this branch")
    def test_stress_sites_name_their_code_tags_not_the_inlining_closure(self):
        """stat's Source is inline-aware: stress's sites are inlined three
        calls deep into one closure; each names the line of its own
        allocation macro and the function it is in (`func:alloc`), as the
        code tags (`fault list`, `allocinfo`) do, not the closure's line."""
        code, out, err = self.magpie_kmem("stat", "--caller", "--json")
        self.assertEqual(code, 0, err)
        stress = [s for s in json.loads(out)["callsites"]
                  if s["function"].startswith("magpie::smp::stress::run") and s["hit"] > 100]
        self.assertEqual(len(stress), 2, stress)
        with open(os.path.join(ROOT, "kernel", "src", "smp", "stress.rs")) as f:
            lines = f.read().splitlines()
        tags = {f"kernel/src/smp/stress.rs:{n}" for n, line in enumerate(lines, 1)
                if re.search(r"\b(kmalloc|kmem_cache_alloc)(_box)?!", line)}
        self.assertEqual({s["location"] for s in stress}, tags)
        self.assertEqual({s["func"] for s in stress}, {"alloc"})
        code, out, err = self.magpie_kmem("stat", "--caller")
        for site in stress:
            self.assertIn(f'{site["location"]} func:alloc', out)

    @unittest.skipUnless(os.path.exists(MAGPIE_KMEM), "scripts/magpie-kmem not on this branch")
    def test_magpie_kmem_ping_pong_is_stress_cross_cpu_frees(self):
        text = reply_to(self.out, "stress --cpus all --ops 3000")
        cross_frees = int(re.search(r"^total\s+\d+\s+\d+\s+\d+\s+(\d+)", text, re.M).group(1))
        code, out, err = self.magpie_kmem("stat", "--caller", "--json")
        self.assertEqual(code, 0, err)
        stress = [s for s in json.loads(out)["callsites"] if s["function"].startswith("magpie::smp::stress::run")]
        self.assertTrue(stress)
        self.assertEqual(sum(s["pingpong"] for s in stress), cross_frees)

    @unittest.skipUnless(os.path.exists(MAGPIE_KMEM), "scripts/magpie-kmem not on this branch")
    def test_magpie_kmem_live_lists_the_objects_held(self):
        code, out, err = self.magpie_kmem("live", "--json")
        self.assertEqual(code, 0, err)
        site = self.shell_kmalloc_site()
        leaked = sorted(int(o["ptr"], 16) for g in json.loads(out)["groups"]
                        if int(g["call_site"], 16) == site for o in g["objects"])
        held = [int(a, 16) for a in HEX.findall(reply_to(self.out, "kmalloc 100 10"))][:6]
        held += [int(a, 16) for a in HEX.findall(reply_to(self.out, "kmalloc 4000 3"))]
        self.assertEqual(leaked, sorted(held))

    @unittest.skipUnless(os.path.exists(MAGPIE_KMEM), "scripts/magpie-kmem not on this branch")
    def test_exports_load_in_their_readers(self):
        """speedscope JSON validates against speedscope's published schema
        (vendored: tools/magpie-kmem/tests/data); the Chrome trace holds
        every event of the dump, per CPU, with live-byte counters; folded
        stacks weigh exactly the bytes allocated."""
        import jsonschema
        schema_path = os.path.join(ROOT, "tools", "magpie-kmem", "tests", "data",
                                   "speedscope-file-format-schema.json")
        with open(schema_path) as f:
            schema = json.load(f)
        code, out, err = self.magpie_kmem("export", "--format", "speedscope")
        self.assertEqual(code, 0, err)
        speedscope = json.loads(out)
        jsonschema.validate(speedscope, schema)
        events = self.dump()["events"]
        allocated = sum(e["alloc"] for e in events if e["event"] == 1)
        self.assertEqual(sum(speedscope["profiles"][0]["weights"]), allocated)

        code, out, err = self.magpie_kmem("export", "--format", "folded")
        self.assertEqual(code, 0, err)
        lines = out.splitlines()
        self.assertTrue(all(re.fullmatch(r"[^ ].* \d+", line) for line in lines), lines[:5])
        self.assertEqual(sum(int(line.rsplit(" ", 1)[1]) for line in lines), allocated)
        self.assertTrue(any("cmd_kmalloc" in line for line in lines))

        code, out, err = self.magpie_kmem("export", "--format", "chrome")
        self.assertEqual(code, 0, err)
        trace = json.loads(out)
        # Instants are "I" (Chrome's phase; DevTools reads no "i"); tid =
        # CPU + 1 (Perfetto drops thread-scoped instants on tid 0).
        instants = [e for e in trace["traceEvents"] if e["ph"] == "I" and e.get("cat") == "kmem"]
        self.assertEqual(len(instants), len(events))
        self.assertEqual({e["tid"] for e in instants}, {e["cpu"] + 1 for e in events})
        for e in trace["traceEvents"]:
            self.assertIn(e["ph"], "MIC")
            if e["ph"] != "M":
                self.assertGreaterEqual(e["ts"], 0)
        # The shell's command lines typed while recording are markers (MARK
        # records), in order.
        marks = [e["name"] for e in trace["traceEvents"] if e.get("cat") == "shell"]
        self.assertEqual(marks, ["kmalloc 100 10", "kfree 4", "kmalloc 4000 3", "stress --cpus all --ops 3000",
                                 "kmemtrace record stop"])
        counters = [e for e in trace["traceEvents"] if e["ph"] == "C" and e["name"] == "live bytes kmalloc-4032"]
        self.assertEqual(counters[-1]["args"]["bytes"], 3 * 4032, "kmalloc 4000 3 still held at the end")

        # A real reader: Chrome DevTools' trace engine (make chrome-reader)
        # puts every alloc and free of the recording on its CPU's track.
        reader = os.path.join(ROOT, "tools", "magpie-kmem", "tests", "chrome-reader")
        if os.path.isdir(os.path.join(reader, "node_modules", "@paulirish", "trace_engine")):
            with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
                f.write(out)
                f.flush()
                seen = subprocess.run(["node", os.path.join(reader, "read.mjs"), f.name],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            self.assertEqual(seen.returncode, 0, seen.stderr.decode(errors="replace"))
            tracks = {t["name"]: t["entries"] for t in json.loads(seen.stdout)["threads"]}
            for cpu in {e["cpu"] for e in events}:
                kmem = [name for name, _ in tracks[f"cpu {cpu}"] if name.startswith(("alloc ", "free "))]
                self.assertEqual(len(kmem), sum(1 for e in events if e["cpu"] == cpu), cpu)


class KmemtraceDiff(unittest.TestCase):
    """`magpie-kmem diff A B` on two boots: what the second holds more of."""

    @unittest.skipUnless(os.path.exists(MAGPIE_KMEM), "scripts/magpie-kmem not on this branch")
    def test_diff_of_two_boots_shows_the_extra_leak(self):
        if not os.path.exists(KERNEL):
            self.skipTest("kernel not built")
        with tempfile.TemporaryDirectory() as tmp:
            paths = []
            for extra in ([], ["leak 200 7"]):
                path = os.path.join(tmp, f"{len(paths)}.kmt")
                code, out = boot_recording(["kmemtrace record start", "kmalloc 100 10", *extra,
                                            "kmemtrace record stop", "kmemtrace dump", "poweroff"], path)
                self.assertEqual(code, 0, out)
                paths.append(path)
            result = subprocess.run([MAGPIE_KMEM, "--kernel", KERNEL, "diff", *paths],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
            out = result.stdout.decode()
            self.assertEqual(result.returncode, 0, result.stderr.decode())
            lines = out.splitlines()
            self.assertRegex(lines[0], r"^magpie-kmem diff - live at the end of .* -> .*, \d+ sites? changed$")
            self.assertEqual(lines[1], "#     <size>  <calls> <tag info>")
            # leak 200 7: seven kmalloc-208 objects at cmd_leak's kmalloc! line.
            self.assertRegex(out, r"\n\s+\+1456\s+\+7 kernel/src/shell/kmem\.rs:\d+ func:cmd_leak\n")
            self.assertRegex(out, r"\n\s+\+1456\s+\+7 kmalloc-208\n")
            self.assertNotIn("func:cmd_kmalloc", out.split("\n\n")[0], "kmalloc 100 10 in both")


class KmemtraceOverruns(unittest.TestCase):
    """One sub-buffer per CPU and a large workload: overruns, counted and shown."""

    def test_overruns_are_counted_shown_and_in_the_dump(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "overrun.kmt")
            code, out = boot_recording([
                "kmemtrace record start",
                "stress --cpus all --ops 5000",
                "kmemtrace record status",
                "kmemtrace dump",
                "poweroff",
            ], path, append="kmemtrace.subbufs=1")
            self.assertEqual(code, 0, out)
            text = reply_to(out, "kmemtrace record status")
            total = re.search(r"^total\s+(\d+)\s+(\d+)$", text, re.M)
            self.assertEqual(int(total.group(1)), 2 * 1024, text)
            overruns = int(total.group(2))
            self.assertGreater(overruns, 0, text)
            self.assertIn("kmemtrace.subbufs", text)
            dump, = read_dumps(path)
            self.assertEqual(dump["nr_overruns"], overruns)
            self.assertEqual(sum(r[2] for r in dump["cpu_records"]), overruns)


class KmemtraceFromBoot(unittest.TestCase):
    """`kmemtrace=on`: recording from boot, flag bit 1 in the header."""

    def test_boot_argument_records_from_boot(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "boot.kmt")
            code, out = boot_recording(["kmemtrace record status", "kmemtrace dump", "poweroff"],
                                       path, append="kmemtrace=on")
            self.assertEqual(code, 0, out)
            self.assertIn("recording all caches", reply_to(out, "kmemtrace record status"))
            dump, = read_dumps(path)
            self.assertEqual(dump["flags"] & 2, 2)
            self.assertGreater(dump["nr_events"], 0)
            # Every free in a from-boot record frees something allocated in it.
            live = set()
            for e in sorted(dump["events"], key=lambda e: (e["ns"], e["cpu"], e["seq"])):
                if e["event"] == 1:
                    live.add(e["ptr"])
                elif e["event"] == 2:
                    self.assertIn(e["ptr"], live)
                    live.remove(e["ptr"])


class AllocinfoMarkDiff(unittest.TestCase):
    """Online leak hunting beside the record: `allocinfo mark` / `diff`."""

    @classmethod
    def setUpClass(cls):
        if not os.path.exists(KERNEL):
            raise unittest.SkipTest(f"{KERNEL} not built")
        cls.code, cls.out = boot([
            "allocinfo diff",
            "allocinfo mark",
            "kmalloc 100 10",
            "kfree 4",
            "allocinfo diff --top 1",
            "kfree all",
            "allocinfo diff",
            "allocinfo diff --top",
            "poweroff",
        ])

    def test_diff_without_mark_is_one_clear_error(self):
        self.assertEqual(self.code, 0, self.out)
        self.assertEqual(reply_to(self.out, "allocinfo diff").strip(),
                         "error: no mark yet: 'allocinfo mark' first")

    def test_diff_shows_what_grew_at_the_shell_site(self):
        text = reply_to(self.out, "allocinfo diff --top 1")
        lines = text.splitlines()
        self.assertRegex(lines[0], r"^allocinfo diff - since mark \d+(\.\d{3})? (ns|µs|ms|s) ago, \d+ sites? changed$")
        self.assertEqual(lines[1], "#     <size>  <calls> <tag info>")
        # Six objects of 100 B still held, class-rounded to 104 B.
        self.assertRegex(lines[2], r"^\s+\+624\s+\+6 kernel/src/shell/kmem\.rs:\d+ func:cmd_kmalloc$")
        self.assertEqual(len(lines), 3, text)

    def test_after_freeing_everything_the_site_is_back_to_the_mark(self):
        text = reply_to(self.out, "allocinfo diff", nth=1)
        self.assertNotIn("func:cmd_kmalloc", text)
        self.assertIn("--top needs a value", reply_to(self.out, "allocinfo diff --top"))


if __name__ == "__main__":
    unittest.main()
