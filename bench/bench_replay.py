"""Replay publish rate: ``kvtool replay --publish --max-speed`` vs a pre-encoded publisher.

One subscriber (this process: a SUB socket bound to an ephemeral 127.0.0.1 port, no
receive limit) takes every message; each publisher connects to it and sends the whole
stream as fast as it can:

- baseline: the payloads pre-encoded in memory (read from the ``.frames`` file before the
  clock starts), sent from an XPUB socket (PUB semantics; it waits for the subscription);
- kvtool: ``python -m kvtool replay REC.mcap --publish tcp://127.0.0.1:PORT --connect
  --max-speed --wait-subscribers 1`` (reads, decodes and paces from the recording).

The rate is measured at the subscriber: batches / (last receive - first receive), so
neither start-up counts; the whole command's wall time is reported too. Goal: kvtool >=
0.8x the baseline.

    python3 bench/bench_replay.py bench/data/big1.mcap --runs 3
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _common import ROOT, kvtool_cmd, median, save_result


def baseline_publisher(frames: Path, port: int) -> int:
    """Child process: pre-encoded payloads, sent at max speed."""
    import zmq
    from bench_record import read_frames

    msgs = [(t, i.to_bytes(8, "big"), p) for i, (t, p) in enumerate(read_frames(frames))]
    ctx = zmq.Context()
    pub = ctx.socket(zmq.XPUB)
    pub.set_hwm(100_000)
    pub.setsockopt(zmq.LINGER, -1)
    pub.connect(f"tcp://127.0.0.1:{port}")
    pub.recv()  # the subscription
    t0 = time.perf_counter()
    for m in msgs:
        pub.send_multipart(m, copy=False)
    print(json.dumps({"send_s": time.perf_counter() - t0}), flush=True)
    pub.close()
    ctx.term()
    return 0


def receive(sub: Any, n: int, proc: subprocess.Popen[str], idle_s: float = 10.0) -> dict[str, Any]:
    got = 0
    first = last = None
    while got < n:
        if not sub.poll(int(idle_s * 1000)):
            break
        sub.recv_multipart(copy=False)
        now = time.perf_counter()
        if first is None:
            first = now
        last = now
        got += 1
    return {"received": got, "recv_span_s": (last - first) if first and last else None}


def one_run(mode: str, rec: Path, frames: Path, n: int, cpus: str | None) -> dict[str, Any]:
    import zmq

    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.RCVHWM, 0)
    sub.setsockopt(zmq.LINGER, 0)
    sub.subscribe(b"")
    port = sub.bind_to_random_port("tcp://127.0.0.1")
    if mode == "baseline":
        cmd = [sys.executable, __file__, "--baseline", str(frames), str(port)]
    else:
        cmd = [
            *kvtool_cmd(),
            "replay",
            str(rec),
            "--publish",
            f"tcp://127.0.0.1:{port}",
            "--connect",
            "--max-speed",
            "--wait-subscribers",
            "1",
            "--wait-timeout",
            "60",
        ]
    if cpus:
        cmd = ["taskset", "-c", cpus, *cmd]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        res = receive(sub, n, proc)
        _out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        sub.close()
        ctx.term()
    wall = time.perf_counter() - t0
    res.update({"mode": mode, "batches": n, "wall_s": wall, "returncode": proc.returncode})
    if res["recv_span_s"]:
        res["batches_per_s"] = (res["received"] - 1) / res["recv_span_s"]
    if proc.returncode:
        res["stderr"] = err[-500:]
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description="replay publish rate")
    ap.add_argument("recording", nargs="?", default=str(ROOT / "bench/data/big1.mcap"))
    ap.add_argument(
        "--frames",
        default=None,
        help="the same stream as .frames (default: the recording's name with .frames)",
    )
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--cpus", default=None, help="taskset CPU list for the publishers")
    ap.add_argument("--baseline", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.baseline:
        return baseline_publisher(Path(args.baseline[0]), int(args.baseline[1]))
    rec = Path(args.recording)
    frames = Path(args.frames) if args.frames else rec.with_suffix(".frames")
    from bench_record import read_frames

    n = len(read_frames(frames))
    runs: dict[str, list[dict[str, Any]]] = {"baseline": [], "kvtool": []}
    for i in range(args.runs):
        for mode in runs:
            r = one_run(mode, rec, frames, n, args.cpus)
            runs[mode].append(r)
            print(
                f"run {i + 1} {mode:8s}: received {r['received']}/{n}, "
                f"{r.get('batches_per_s', 0):8.0f} batches/s, wall {r['wall_s']:.2f} s, "
                f"rc {r['returncode']}",
                file=sys.stderr,
            )
    med = {m: median([r.get("batches_per_s", 0.0) for r in rs]) for m, rs in runs.items()}
    med_wall = {m: median([r["wall_s"] for r in rs]) for m, rs in runs.items()}
    ratio = med["kvtool"] / med["baseline"] if med["baseline"] else None
    save_result(
        "replay",
        {
            "recording": str(rec),
            "batches": n,
            "runs": runs,
            "median_batches_per_s": med,
            "median_wall_s": med_wall,
            "ratio_kvtool_over_baseline": ratio,
        },
    )
    print(f"\n{n} batches")
    for m in runs:
        print(f"{m:8s}: median {med[m]:.0f} batches/s at the subscriber, wall {med_wall[m]:.2f} s")
    if ratio is not None:
        print(f"kvtool / pre-encoded = {ratio:.2f}  (goal >= 0.8)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
