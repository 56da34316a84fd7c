"""Magpie's allocator reports in a gdb session attached to QEMU's gdbstub
(`make debug`; docs/VMCORE.md), after Linux's scripts/gdb (lx-slabinfo):

    (gdb) source scripts/magpie-gdb.py
    (gdb) magpie slabinfo
    (gdb) magpie kmemstat
    (gdb) magpie slabtop --once
    (gdb) magpie whatis 0xffff80000092b040
    (gdb) magpie verify
    (gdb) magpie findleaks
    (gdb) magpie events -o stopped.kmt

Each command takes a memory image of the stopped VM through the
gdbstub's monitor (`monitor dump-guest-memory`, QEMU's HMP command: the
same ELF core the runner takes) and runs `magpie-kmem core` on it with
the kernel gdb has loaded: the same descriptor, the same reader, the
same output as from a core. The image is written to $MAGPIE_GDB_CORE
(default target/vmcore/gdb.core) and kept.
"""
import os
import shlex
import subprocess

import gdb

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOL = os.path.join(ROOT, "scripts", "magpie-kmem")
REPORTS = ("slabinfo", "kmemstat", "slabtop", "whatis", "verify", "trace", "kfence", "errors", "findleaks",
           "allocinfo", "events")


def take_core():
    core = os.environ.get("MAGPIE_GDB_CORE", os.path.join(ROOT, "target", "vmcore", "gdb.core"))
    os.makedirs(os.path.dirname(core), exist_ok=True)
    if os.path.exists(core):
        os.remove(core)
    reply = gdb.execute(f"monitor dump-guest-memory {core}", to_string=True)
    if not os.path.exists(core):
        raise gdb.GdbError(f"magpie: QEMU wrote no image ({reply.strip() or 'no reply'}); "
                           "is gdb attached to QEMU's gdbstub (make debug)?")
    return core


def kernel_file():
    objfile = gdb.current_progspace().filename
    if not objfile:
        raise gdb.GdbError("magpie: load the kernel first: file target/x86_64-unknown-none/debug/magpie")
    return objfile


class Magpie(gdb.Command):
    """Magpie allocator reports from the stopped kernel: magpie REPORT [ARGS].
REPORT: slabinfo, kmemstat, slabtop [--sort KEY], whatis ADDR, verify, trace [CACHE],
kfence [objects], errors, findleaks, allocinfo [OPTIONS], events -o FILE
(as `magpie-kmem core CORE REPORT`; see docs/VMCORE.md)."""

    def __init__(self):
        super().__init__("magpie", gdb.COMMAND_DATA, gdb.COMPLETE_NONE, True)

    def invoke(self, argument, from_tty):
        words = shlex.split(argument)
        if not words or words[0] not in REPORTS:
            raise gdb.GdbError("usage: magpie slabinfo | kmemstat | slabtop [--sort KEY] | whatis ADDR | verify"
                               " | trace [CACHE] | kfence [objects] | errors | findleaks | allocinfo [OPTIONS]"
                               " | events -o FILE")
        if words[0] == "whatis" and len(words) == 2:
            # An expression (a variable, a register) as well as a number.
            words[1] = hex(int(gdb.parse_and_eval(words[1])) & (2**64 - 1))
        core = take_core()
        proc = subprocess.run([TOOL, "--kernel", kernel_file(), "core", core, *words],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
        gdb.write(proc.stdout.decode(errors="replace"))
        if proc.stderr:
            gdb.write(proc.stderr.decode(errors="replace"), gdb.STDERR)
        if proc.returncode not in (0, 1):
            raise gdb.GdbError(f"magpie: magpie-kmem exited with status {proc.returncode}")


Magpie()
