"""Peak RSS of ``kvtool top|serve|record`` under a burst (issue 23 target: <= 300 MB at 46k).

The test peer (``tests/peer.py``, its own process) publishes the gemma3 capture looped to
``--batches`` batches as fast as it can, with a replay socket; the command records it
(``top --once --record``, ``serve --record``, ``record``) until the file holds every batch.
Peak RSS is the command's ``VmHWM``; at the highest RSS seen, ``/proc/PID/smaps`` is summed
per mapping (anonymous memory, heap, and each shared library's resident pages).

    python3 bench/burst_rss.py top [--batches 46000] [--runs 3]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import ROOT, machine


def status(pid: int) -> dict[str, int]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(("VmHWM", "VmRSS")):
            out[line.split(":")[0]] = int(line.split()[1])
    return out


def smaps(pid: int) -> dict[str, float]:
    """Resident MB per mapping name ([anon], [heap], each file)."""
    agg: collections.Counter[str] = collections.Counter()
    cur = "[anon]"
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        parts = line.split()
        if parts and ":" not in parts[0]:
            cur = parts[5] if len(parts) > 5 else "[anon]"
        elif parts and parts[0] == "Rss:":
            agg[cur] += int(parts[1])
    return {k: round(v / 1024, 1) for k, v in agg.most_common(8)}


def recorded(path: Path) -> int:
    from kvtool.recording import open_recording

    try:
        with open_recording(path) as r:
            return sum(1 for _ in r.messages())
    except Exception:  # still being written
        return 0


def one(cmd: str, n: int, tmp: Path) -> dict[str, object]:
    peer = subprocess.Popen(
        [
            sys.executable,
            "tests/peer.py",
            "tests/data/captures/gemma3.frames",
            "--count",
            str(n),
            "--linger",
            "120",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert peer.stdout is not None
    _, ep, rep = peer.stdout.readline().split()
    out = tmp / f"{cmd}.mcap"
    out.unlink(missing_ok=True)
    args = {
        "top": [
            "top",
            ep,
            "--replay-endpoint",
            rep,
            "--record",
            str(out),
            "--once",
            "--interval",
            "1s",
            "--duration",
            "300s",
        ],
        "serve": [
            "serve",
            ep,
            "--replay-endpoint",
            rep,
            "--record",
            str(out),
            "--metrics",
            "127.0.0.1:0",
            "--duration",
            "300s",
        ],
        "record": ["record", ep, "--replay-endpoint", rep, "-o", str(out), "-n", str(n), "-q"],
    }[cmd]
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvtool", *args],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    peak = top_rss = 0
    at_peak: dict[str, float] = {}
    checked = 0.0
    try:
        while proc.poll() is None and time.monotonic() - t0 < 300:
            st = status(proc.pid)
            peak = max(peak, st["VmHWM"])
            if st["VmRSS"] > top_rss:
                top_rss = st["VmRSS"]
                at_peak = smaps(proc.pid)
            time.sleep(0.2)
            if time.monotonic() - checked > 2:
                checked = time.monotonic()
                if recorded(out) >= n:
                    break
        if proc.poll() is None:
            peak = max(peak, status(proc.pid)["VmHWM"])
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(30)
        peer.terminate()
        peer.wait(30)
    return {
        "cmd": cmd,
        "peak_mb": round(peak / 1024),
        "recorded": recorded(out),
        "seconds": round(time.monotonic() - t0, 1),
        "at_highest_rss_mb": at_peak,
    }


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("cmd", choices=["top", "serve", "record"])
    p.add_argument("--batches", type=int, default=46_000)
    p.add_argument("--runs", type=int, default=3)
    a = p.parse_args()
    print(json.dumps({"machine": machine()}))
    with tempfile.TemporaryDirectory(prefix="burst-rss-") as tmp:
        for _ in range(a.runs):
            print(json.dumps(one(a.cmd, a.batches, Path(tmp))), flush=True)
    return 0


if __name__ == "__main__":
    os.chdir(ROOT)
    sys.exit(main())
