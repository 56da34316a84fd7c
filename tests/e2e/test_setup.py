#!/usr/bin/env python3
"""scripts/setup.sh survives a broken toolchain and concurrent runs.

A fake `rustup` (MAGPIE_RUSTUP) and a fake toolchain directory
(MAGPIE_SYSROOT) stand in for the real ones, so nothing is installed:

- a toolchain whose x86_64-unknown-none library directory is empty or
  missing (what concurrent installs left behind) is detected and repaired
  with `rustup target remove` + `target add`, and says so;
- a sound toolchain is left alone (no target command runs);
- a repair that does not take is an error naming the way out;
- two setups at once do not run their rustup steps at the same time (the
  flock).
"""
import os
import stat
import subprocess
import sys
import tempfile
import threading
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SETUP = os.path.join(ROOT, "scripts", "setup.sh")
CORE = "lib/rustlib/x86_64-unknown-none/lib/libcore-0123456789abcdef.rlib"

# Logs each call ("start ARGS" / "end ARGS"); `target add` puts a libcore
# rlib into the fake sysroot unless FAKE_RUSTUP_BROKEN is set.
FAKE_RUSTUP = """#!/usr/bin/env bash
echo "start $*" >> "$FAKE_RUSTUP_LOG"
sleep "${FAKE_RUSTUP_SLEEP:-0}"
if [ "$1 $2" = "target add" ] && [ -z "${FAKE_RUSTUP_BROKEN:-}" ]; then
    mkdir -p "$MAGPIE_SYSROOT/lib/rustlib/x86_64-unknown-none/lib"
    touch "$MAGPIE_SYSROOT/%s"
fi
echo "end $*" >> "$FAKE_RUSTUP_LOG"
""" % CORE


class SetupToolchain(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name
        self.rustup = os.path.join(self.dir, "rustup")
        with open(self.rustup, "w") as f:
            f.write(FAKE_RUSTUP)
        os.chmod(self.rustup, os.stat(self.rustup).st_mode | stat.S_IEXEC)
        self.log = os.path.join(self.dir, "rustup.log")

    def tearDown(self):
        self.tmp.cleanup()

    def sysroot(self, name, library):
        """A fake toolchain: `library` is 'ok', 'empty' (the directory
        without files) or 'missing'."""
        path = os.path.join(self.dir, name)
        lib = os.path.join(path, "lib", "rustlib", "x86_64-unknown-none", "lib")
        os.makedirs(os.path.join(path, "lib", "rustlib", "x86_64-unknown-linux-gnu", "lib"))
        if library in ("ok", "empty"):
            os.makedirs(lib)
        if library == "ok":
            open(os.path.join(path, CORE), "w").close()
        return path

    def env(self, sysroot, **extra):
        env = dict(os.environ, MAGPIE_RUSTUP=self.rustup, MAGPIE_SYSROOT=sysroot,
                   MAGPIE_SETUP_LOCK=os.path.join(self.dir, "setup.lock"), FAKE_RUSTUP_LOG=self.log)
        env.update(extra)
        return env

    def run_setup(self, env):
        return subprocess.run([SETUP], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              timeout=60)

    def calls(self):
        with open(self.log) as f:
            return [line.split(" ", 1)[1].strip() for line in f if line.startswith("start ")]

    def test_an_empty_or_missing_bare_target_library_is_repaired(self):
        for state in ("empty", "missing"):
            with self.subTest(state=state):
                if os.path.exists(self.log):
                    os.remove(self.log)
                sysroot = self.sysroot(f"toolchain-{state}", state)
                result = self.run_setup(self.env(sysroot))
                self.assertEqual(result.returncode, 0, result.stderr)
                self.assertIn("has no x86_64-unknown-none library", result.stderr)
                self.assertIn("repaired", result.stderr)
                self.assertEqual(self.calls(), [
                    "toolchain install --no-self-update",
                    "target remove --toolchain nightly-2026-05-20 x86_64-unknown-none",
                    "target add --toolchain nightly-2026-05-20 x86_64-unknown-none",
                ])
                self.assertTrue(os.path.exists(os.path.join(sysroot, CORE)))

    def test_a_sound_toolchain_is_left_alone(self):
        result = self.run_setup(self.env(self.sysroot("toolchain", "ok")))
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(self.calls(), ["toolchain install --no-self-update"])
        self.assertNotIn("repair", result.stderr)

    def test_a_repair_that_does_not_take_is_an_error(self):
        result = self.run_setup(self.env(self.sysroot("toolchain", "empty"), FAKE_RUSTUP_BROKEN="1"))
        self.assertEqual(result.returncode, 1)
        self.assertIn("still missing", result.stderr)
        self.assertIn("rustup toolchain uninstall nightly-2026-05-20", result.stderr)

    def test_two_setups_at_once_take_turns(self):
        sysroot = self.sysroot("toolchain", "missing")
        env = self.env(sysroot, FAKE_RUSTUP_SLEEP="0.3")
        results = []
        threads = [threading.Thread(target=lambda: results.append(self.run_setup(env))) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        self.assertEqual([r.returncode for r in results], [0, 0], [r.stderr for r in results])
        with open(self.log) as f:
            events = [line.split(" ", 1)[0] for line in f]
        # Never two rustup calls at once: starts and ends alternate.
        self.assertEqual(events, ["start", "end"] * (len(events) // 2), events)
        # One setup repaired the toolchain; the other found it sound.
        self.assertEqual(sum("repaired" in r.stderr for r in results), 1, [r.stderr for r in results])
        self.assertEqual(self.calls().count("target add --toolchain nightly-2026-05-20 x86_64-unknown-none"), 1)


if __name__ == "__main__":
    unittest.main(argv=sys.argv)
