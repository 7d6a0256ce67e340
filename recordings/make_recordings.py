#!/usr/bin/env python3
"""Re-make the sample recordings: publish real vLLM captures over loopback, run `kvtool record`.

Run from the repository root: ``python3 recordings/make_recordings.py [NAME ...]``.
Each capture in tests/data/captures/ is published by tests/peer.py (vLLM's PUB framing
and replay ROUTER protocol on 127.0.0.1, random ports) and recorded by the real
``kvtool record`` command in a subprocess. Existing recordings are overwritten.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CAPTURES = ROOT / "tests" / "data" / "captures"
OUT = ROOT / "recordings"

# name -> (capture, peer options, record options, store groups?)
RECORDINGS: dict[str, tuple[str, list[str], list[str], bool]] = {
    "gemma3": ("gemma3", [], [], True),
    "gemma3-legacy-group-idx": ("gemma3.legacy-array-group-idx", [], [], False),
    "full_only": ("full_only", [], [], True),
    "gemma3-byteshash": ("gemma3.byteshash", [], [], True),
    "full_only-legacy-initial": ("full_only.legacy-array-initial.signed", [], [], False),
    # Live drops recovered over replay, and a range older than the replay buffer lost.
    "gemma3-gaps": (
        "gemma3",
        ["--drop", "3,7,20-29", "--buffer-steps", "8", "--pause-after", "30"],
        [],
        True,
    ),
}


def make(name: str) -> None:
    """Publish one capture and record it into ``recordings/NAME.mcap``."""
    capture, peer_opts, rec_opts, with_groups = RECORDINGS[name]
    frames = CAPTURES / f"{capture}.frames"
    truth = json.loads((CAPTURES / f"{capture}.truth.json").read_text())
    out = OUT / f"{name}.mcap"
    peer = subprocess.Popen(
        [sys.executable, str(ROOT / "tests" / "peer.py"), str(frames), "--linger", "10",
         "--rate", "20", *peer_opts],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert peer.stdout is not None
        ready = peer.stdout.readline().split()
        pub, replay = ready[1], ready[2]
        cmd = [sys.executable, "-m", "kvtool", "record", pub, "--replay", replay,
               "-o", str(out.relative_to(ROOT)), "--force", "--duration", "8s",
               *rec_opts]
        if with_groups:
            gfile = OUT / f"{capture.split('.')[0]}.groups.json"
            gfile.write_text(json.dumps(truth["group_metadata"], indent=1) + "\n")
            cmd += ["--groups", str(gfile.relative_to(ROOT))]
        res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        print(f"{name}: exit {res.returncode}: {res.stderr.strip()}")
    finally:
        peer.terminate()
        peer.wait(10)


def main(argv: list[str]) -> int:
    """Make the named recordings (all when none is named)."""
    for name in argv or list(RECORDINGS):
        make(name)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
