#!/usr/bin/env python3
"""Regenerates the README's kmemtrace pictures (docs/images/*.svg).

The pictures are of the README session just above "Pictures of that
session" (the one with `kmemtrace record start --stacks 8`): this types
that session's commands into a freshly booted kernel exactly as
tests/e2e/test_readme.py replays it, keeps its dump, and runs the
`scripts/magpie-kmem` commands the README names on it:

    flamegraph --caches label  -> docs/images/kmemtrace-flamegraph.svg
    timeline                   -> docs/images/kmemtrace-timeline.svg
    timeline --by site         -> docs/images/kmemtrace-timeline-sites.svg

Run by `make readme-images` (which builds the kernel and the tool first);
look at the pictures before committing them.
"""
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "e2e"))
import test_readme as replay  # noqa: E402

IMAGES = [
    (["flamegraph", "--caches", "label"], "kmemtrace-flamegraph.svg"),
    (["timeline"], "kmemtrace-timeline.svg"),
    (["timeline", "--by", "site"], "kmemtrace-timeline-sites.svg"),
]


def pictured_session():
    """The options and body of the marked block the pictures are of."""
    with open(replay.README) as f:
        text = f.read()
    pictures_at = text.index("Pictures of that session")
    line_of_pictures = text[:pictures_at].count("\n") + 1
    blocks, _ = replay.readme_blocks()
    before = [block for block in blocks if block[0] < line_of_pictures]
    if not before:
        sys.exit("readme-images: no replayed session above 'Pictures of that session' in README.md")
    number, options, body = before[-1]
    if not any("kmemtrace record start" in line for line in body):
        sys.exit(f"readme-images: README.md:{number}: the session above the pictures records nothing")
    return number, replay.parse_options(options), body


def main():
    if not os.path.exists(replay.KERNEL):
        sys.exit(f"readme-images: {replay.KERNEL} not built; run `cargo build --bin magpie`")
    number, options, body = pictured_session()
    boot, commands, _ = replay.parse_session(body)
    out_dir = os.path.join(replay.ROOT, "docs", "images")
    with tempfile.TemporaryDirectory() as tmp:
        dump = os.path.join(tmp, "latest.kmt")
        session = replay.Session(append=options.get("append", boot["env"].get("MAGPIE_APPEND")),
                                 mem=options.get("mem", boot["env"].get("MAGPIE_MEM")), kmemtrace=dump)
        try:
            if session.read_until_prompt() is None:
                sys.exit(f"readme-images: README.md:{number}: the kernel did not boot to its prompt")
            for command, _ in commands:
                print(f"magpie> {command}", flush=True)
                session.type(command)
                if session.read_until_prompt() is None:
                    break
            if not commands or commands[-1][0] != "poweroff":
                session.type("poweroff")
            code, rest = session.rest()
        finally:
            session.close()
        if code != 0 or not os.path.exists(dump) or os.path.getsize(dump) == 0:
            sys.exit(f"readme-images: no dump from README.md:{number}'s session (exit {code}):\n{rest}")
        for args, name in IMAGES:
            out = os.path.join(out_dir, name)
            subprocess.run([replay.MAGPIE_KMEM, "--kernel", replay.KERNEL, *args, dump, "-o", out],
                           check=True, cwd=replay.ROOT)
            print(f"wrote {os.path.relpath(out, replay.ROOT)}")


if __name__ == "__main__":
    main()
