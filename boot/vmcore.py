#!/usr/bin/env python3
"""The runner's core taker: boot/run-qemu.sh starts it beside QEMU.

It speaks QMP (plain JSON lines over QEMU's unix socket: the protocol is
three messages here, so no client library) and writes a QEMU
`dump-guest-memory` ELF core (physical memory and every CPU's registers,
what `magpie-kmem core` reads) when

- the kernel panics (the panic handler writes 1 to the pvpanic port;
  QEMU runs with `-action panic=pause`: the guest stops, GUEST_PANICKED),
  then ends QEMU;
- the shell's `vmcore` asks (it writes 2, "crash loaded", to the pvpanic
  port: GUEST_CRASHLOADED), then lets the guest run on;
- the guest shuts down or resets in a way the kernel did not choose (a
  triple fault: QEMU runs with `-action shutdown=pause`), then ends QEMU;
- the runner is told to stop (SIGINT/SIGTERM to run-qemu.sh: it sends this
  process SIGUSR1), or its timeout (MAGPIE_TIMEOUT) runs out: stop the
  guest, dump, end QEMU (a hung kernel leaves its image).

The core is written to a temporary file beside CORE and renamed, so CORE
is always whole. One line per core on stderr says where. What happened
is written to STATUS (`panic`, `shutdown`, `signal`, `timeout`) for the
runner.

    boot/vmcore.py SOCKET CORE STATUS [TIMEOUT_SECONDS]
"""

import json
import os
import signal
import socket
import sys
import time


class Qmp:
    def __init__(self, path):
        deadline = time.monotonic() + 30
        while True:
            try:
                self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                self.sock.connect(path)
                break
            except OSError:
                self.sock.close()
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        # Our own line buffer: a file from makefile() is unusable after
        # one timeout, and the event loop polls with one.
        self.buffer = b""
        self.pending = []
        self.read()  # the greeting
        self.command("qmp_capabilities")

    def read(self):
        while b"\n" not in self.buffer:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise EOFError
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return json.loads(line)

    def command(self, name, **arguments):
        message = {"execute": name}
        if arguments:
            message["arguments"] = arguments
        self.sock.settimeout(None)
        self.sock.sendall(json.dumps(message).encode() + b"\n")
        while True:
            reply = self.read()
            if "event" in reply:
                self.pending.append(reply)
                continue
            if "error" in reply:
                raise RuntimeError(f"{name}: {reply['error'].get('desc', reply['error'])}")
            return reply.get("return")

    def event(self, timeout):
        """The next event; socket.timeout after `timeout` seconds of none."""
        if self.pending:
            return self.pending.pop(0)
        self.sock.settimeout(timeout)
        while True:
            message = self.read()
            if "event" in message:
                return message


def dump(qmp, core, why):
    directory = os.path.dirname(core) or "."
    os.makedirs(directory, exist_ok=True)
    partial = core + ".partial"
    started = time.monotonic()
    qmp.command("dump-guest-memory", paging=False, protocol="file:" + os.path.abspath(partial))
    os.replace(partial, core)
    seconds = time.monotonic() - started
    size = os.path.getsize(core) >> 20
    print(
        f"run-qemu.sh: {why}: vmcore written to {core} ({size} MiB, {seconds:.1f} s); "
        f"read it with: scripts/magpie-kmem core {core} slabinfo",
        file=sys.stderr,
        flush=True,
    )


def main():
    sock_path, core, status = sys.argv[1:4]
    timeout = float(sys.argv[4]) if len(sys.argv) > 4 and float(sys.argv[4]) > 0 else None
    deadline = time.monotonic() + timeout if timeout else None
    stop_requested = []
    # The runner's SIGINT/SIGTERM arrives as SIGUSR1; the terminal's own
    # SIGINT (this process shares the runner's group) is the runner's.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGUSR1, lambda *_: stop_requested.append(True))
    try:
        qmp = Qmp(sock_path)
    except (OSError, EOFError):
        return 0  # QEMU ended before it listened: nothing to take

    def finish(what, why):
        with open(status, "w") as out:
            out.write(what)
        try:
            qmp.command("stop")
            dump(qmp, core, why)
        except (RuntimeError, OSError, EOFError) as error:
            print(f"run-qemu.sh: {why}: no vmcore: {error}", file=sys.stderr, flush=True)
        try:
            qmp.command("quit")
        except (OSError, EOFError, RuntimeError):
            pass

    while True:
        if stop_requested:
            finish("signal", "stopped by the user")
            return 0
        if deadline is not None and time.monotonic() > deadline:
            finish("timeout", f"timed out after {timeout:g} s (hung?)")
            return 0
        try:
            # Polled, so that a stop request is seen.
            event = qmp.event(0.2)
        except (socket.timeout, TimeoutError):
            continue
        except (OSError, EOFError, ValueError):
            return 0  # QEMU ended
        name = event.get("event")
        if name == "GUEST_PANICKED":
            finish("panic", "kernel panic")
            return 0
        if name == "SHUTDOWN" and event.get("data", {}).get("guest", False):
            finish("shutdown", "the guest reset or shut down (triple fault?)")
            return 0
        if name == "GUEST_CRASHLOADED":
            try:
                dump(qmp, core, "vmcore requested by the kernel")
            except (RuntimeError, OSError) as error:
                print(f"run-qemu.sh: vmcore: {error}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
