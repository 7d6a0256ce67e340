"""Soak (issue 23): forced gaps against a vLLM-like publisher, the recorder stopped 3 s.

Target: "0 lost over 20 runs of forced gaps against a real publisher with the recorder
stopped 3 s". Each run:

1. starts the publisher (this script with ``--publisher``, its own process): a real
   capture (``tests/data/captures/gemma3.frames`` by default: vLLM 0.33's own bytes),
   played in a loop with the seq renumbered, at ``--rate`` batches/s, through a copy of
   the structure of vLLM 0.33's ``ZmqEventPublisher`` (vllm/distributed/kv_events.py):
   the engine thread puts batches on a bounded queue (``max_queue_size`` 100,000); the
   publisher thread, in one loop, first serves one replay request if ``poll(0)`` says
   one waits (``_service_replay``: every buffered batch with ``seq >= start`` as
   ``[id, b"", topic, seq, payload]``, then the end marker), then takes the next batch
   off the queue (``get(timeout=0.1)``), sends ``[topic, seq (8 bytes BE), payload]``
   on PUB and appends it to the replay buffer (``deque(maxlen=buffer_steps)``, 10,000).
   The ROUTER keeps ZeroMQ's default SNDHWM (1,000), as vLLM's does. Two differences,
   both outside the wire: the publishing socket is an XPUB (a subscriber cannot tell it
   from PUB) so the stream starts once the recorder's subscription arrives, instead of
   losing seq 0.. to the slow joiner; and PUB's SNDHWM is ``--hwm`` (vLLM's ``hwm``
   argument, default here 1,000 instead of vLLM's 100,000) so that a 3 s stop overflows
   it and forces gaps;
2. runs ``kvtool record PUB --replay-endpoint REPLAY -o run.mcap -n N``;
3. ``--stop-after`` seconds into the stream, stops the recorder with SIGSTOP (by its
   PID) for ``--stop`` seconds, then SIGCONT;
4. waits for the recorder to exit (it stops at ``-n N``: all batches in), or stops it
   with SIGTERM ``--grace`` seconds after the publisher has sent everything;
5. checks the recording against the source stream: every seq 0..N-1 present once, each
   payload byte for byte, the gap ledger's lost and unconfirmed 0, exit 0; and counts
   the gaps the stop forced (ledger) and what the replay socket served.

    python3 bench/soak_gaps.py --runs 20            # figures to bench/data/results/soak-gaps.json
    python3 bench/soak_gaps.py --runs 1 --stop 1 --batches 3000
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import itertools
import json
import os
import queue
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from _common import ROOT, kvtool_cmd, machine, save_result

CAPTURE = ROOT / "tests" / "data" / "captures" / "gemma3.frames"
END_SEQ = (-1).to_bytes(8, "big", signed=True)
BUFFER_STEPS = 10_000  # vLLM's buffer_steps default
MAX_QUEUE = 100_000  # vLLM's max_queue_size default
HOST = "tcp://127.0.0.1"


def read_frames(path: Path) -> list[tuple[bytes, bytes]]:
    """``(topic, payload)`` of every message of a ``.frames`` capture, in order."""
    data = path.read_bytes()
    off = 0
    out: list[tuple[bytes, bytes]] = []
    while off < len(data):
        (count,) = struct.unpack_from(">I", data, off)
        off += 4
        frames = []
        for _ in range(count):
            (ln,) = struct.unpack_from(">I", data, off)
            off += 4
            frames.append(data[off : off + ln])
            off += ln
        out.append((frames[0], frames[-1]))
    return out


def stream(path: Path, batches: int) -> list[tuple[bytes, bytes]]:
    """The capture looped to ``batches`` messages; message i is published as seq i."""
    msgs = read_frames(path)
    return [msgs[i % len(msgs)] for i in range(batches)]


# -- the publisher child --------------------------------------------------------------


def publisher(path: Path, batches: int, rate: float, hwm: int) -> int:
    """Child process: vLLM 0.33 ZmqEventPublisher's loop over the looped capture."""
    import zmq

    msgs = stream(path, batches)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    ctx = zmq.Context()
    pub = ctx.socket(zmq.XPUB)
    pub.set_hwm(hwm)
    pub.setsockopt(zmq.LINGER, 0)
    port = pub.bind_to_random_port(HOST)
    replay = ctx.socket(zmq.ROUTER)  # vLLM sets no SNDHWM here: ZeroMQ's 1,000
    replay.setsockopt(zmq.LINGER, 0)
    rport = replay.bind_to_random_port(HOST)
    print(json.dumps({"endpoint": f"{HOST}:{port}", "replay": f"{HOST}:{rport}"}), flush=True)
    if not pub.poll(60_000):
        print(json.dumps({"error": "no subscriber in 60 s"}), flush=True)
        return 1
    pub.recv()  # the recorder's subscription
    time.sleep(0.2)

    events: queue.Queue[tuple[bytes, bytes] | None] = queue.Queue(maxsize=MAX_QUEUE)
    buffer: collections.deque[tuple[int, bytes, bytes]] = collections.deque(maxlen=BUFFER_STEPS)
    stats = collections.Counter[str]()

    def engine() -> None:
        # The engine core publishes one batch per step; here at a steady `rate`.
        t0 = time.perf_counter()
        for i, msg in enumerate(msgs):
            if rate > 0:
                due = t0 + i / rate
                wait = due - time.perf_counter()
                if wait > 0.001:
                    time.sleep(wait)
            events.put(msg)
        events.put(None)

    def service_replay() -> None:
        # ZmqEventPublisher._service_replay, vLLM 0.33.
        frame = replay.recv_multipart()
        if len(frame) != 3:
            stats["bad_requests"] += 1
            return
        ident, _, start_b = frame
        start = int.from_bytes(start_b, "big")
        stats["replay_requests"] += 1
        for seq, topic, payload in buffer:
            if seq >= start:
                replay.send_multipart((ident, b"", topic, seq.to_bytes(8, "big"), payload))
                stats["replayed"] += 1
        replay.send_multipart((ident, b"", b"", END_SEQ, b""))

    t_start = time.time()
    print(json.dumps({"started": t_start}), flush=True)
    feeder = threading.Thread(target=engine, daemon=True)
    feeder.start()
    seqs = itertools.count()
    # ZmqEventPublisher._publisher_thread: replay first (non-critical), then the queue.
    while not stop.is_set():
        if replay.poll(0):
            service_replay()
        try:
            item = events.get(timeout=0.1)
        except queue.Empty:
            continue
        if item is None:
            break
        topic, payload = item
        seq = next(seqs)
        pub.send_multipart((topic, seq.to_bytes(8, "big"), payload))
        buffer.append((seq, topic, payload))
        stats["sent"] += 1
    print(json.dumps({"sent_all": time.time(), "send_s": time.time() - t_start}), flush=True)
    # The engine goes on running (idle): its publisher keeps serving replay.
    while not stop.is_set():
        if replay.poll(100):
            service_replay()
    print(json.dumps(dict(stats)), flush=True)
    pub.close()
    replay.close()
    ctx.term()
    return 0


# -- the parent -----------------------------------------------------------------------


def _read_json_line(proc: subprocess.Popen[str], timeout: float) -> dict[str, Any]:
    import select

    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    if not ready:
        raise RuntimeError(f"publisher said nothing in {timeout} s")
    line = proc.stdout.readline()
    if not line:
        raise RuntimeError("publisher exited")
    out: dict[str, Any] = json.loads(line)
    return out


def check(out: Path, msgs: list[tuple[bytes, bytes]]) -> dict[str, Any]:
    """Compare the recording with the source stream, seq by seq, byte for byte."""
    from kvtool.recording import open_recording

    want = [hashlib.blake2b(p, digest_size=16).digest() for _t, p in msgs]
    seen: dict[int, bytes] = {}
    dup = extra = 0
    with open_recording(out) as rec:
        for m in rec.messages():
            if m.seq in seen:
                dup += 1
            if m.seq >= len(want):
                extra += 1
            seen[m.seq] = hashlib.blake2b(m.data, digest_size=16).digest()
        ledger = rec.ledger or {}
        complete = rec.recovery.complete
    missing = [s for s in range(len(want)) if s not in seen]
    wrong = [s for s in range(len(want)) if s in seen and seen[s] != want[s]]
    chans = ledger.get("channels") or []
    gaps = sum(len(c.get("gaps", [])) + c.get("gaps_omitted", 0) for c in chans)
    return {
        "recorded": len(seen),
        "missing": len(missing),
        "missing_seqs": _ranges(missing),
        "payload_mismatch": len(wrong),
        "duplicates": dup,
        "extra": extra,
        "file_complete": complete,
        "ledger_gaps": gaps,
        "ledger_recovered": ledger.get("recovered"),
        "ledger_lost": ledger.get("lost"),
        "ledger_lost_ranges": ledger.get("lost_ranges"),
        "ledger_unconfirmed": ledger.get("unconfirmed", 0),
    }


def _ranges(seqs: list[int]) -> list[list[int]]:
    out: list[list[int]] = []
    for s in seqs:
        if out and s == out[-1][1] + 1:
            out[-1][1] = s
        else:
            out.append([s, s])
    return out[:20]


def one_run(
    args: argparse.Namespace, n: int, tmp: Path, msgs: list[tuple[bytes, bytes]]
) -> dict[str, Any]:
    out = tmp / f"run{n}.mcap"
    err_path = tmp / f"run{n}.stderr"
    pub = subprocess.Popen(
        [
            sys.executable,
            __file__,
            "--publisher",
            str(args.capture),
            "--batches",
            str(args.batches),
            "--rate",
            str(args.rate),
            "--hwm",
            str(args.hwm),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    rec: subprocess.Popen[bytes] | None = None
    try:
        eps = _read_json_line(pub, 30)
        cmd = [
            *kvtool_cmd(),
            "record",
            eps["endpoint"],
            "--replay-endpoint",
            eps["replay"],
            "-o",
            str(out),
            "-n",
            str(args.batches),
            "--status-every",
            "0",
        ]
        with open(err_path, "wb") as err:
            rec = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)
        started = _read_json_line(pub, 90)["started"]
        time.sleep(max(0.0, started + args.stop_after - time.time()))
        os.kill(rec.pid, signal.SIGSTOP)
        stopped_at = time.time() - started
        time.sleep(args.stop)
        os.kill(rec.pid, signal.SIGCONT)
        sent = _read_json_line(pub, args.batches / max(args.rate, 1.0) + 120)
        try:
            code = rec.wait(timeout=args.grace)
            timed_out = False
        except subprocess.TimeoutExpired:
            os.kill(rec.pid, signal.SIGTERM)
            code = rec.wait(timeout=30)
            timed_out = True
        done = time.time() - started
    finally:
        if rec is not None and rec.poll() is None:
            os.kill(rec.pid, signal.SIGKILL)
            rec.wait()
        if pub.poll() is None:
            os.kill(pub.pid, signal.SIGTERM)
        try:
            pub_stats = _read_json_line(pub, 10)
        except (RuntimeError, json.JSONDecodeError):
            pub_stats = {}
        pub.wait(timeout=10)
    res = check(out, msgs)
    res.update(
        run=n,
        exit=code,
        stopped_by_soak=timed_out,
        stop_at_s=round(stopped_at, 2),
        publisher_send_s=round(sent["send_s"], 2),
        recorder_done_s=round(done, 2),
        replay_requests=pub_stats.get("replay_requests"),
        replayed=pub_stats.get("replayed"),
        summary=err_path.read_text(errors="replace").strip().splitlines()[-3:],
    )
    res["ok"] = (
        res["missing"] == 0
        and res["payload_mismatch"] == 0
        and res["duplicates"] == 0
        and res["extra"] == 0
        and not res["ledger_lost"]
        and not res["ledger_unconfirmed"]
        and code == 0
        and res["file_complete"]
    )
    if not args.keep:
        out.unlink(missing_ok=True)
    return res


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--capture", type=Path, default=CAPTURE, help="a .frames capture (looped)")
    p.add_argument("--batches", type=int, default=8000, help="batches per run")
    p.add_argument("--rate", type=float, default=1000.0, help="batches/s the engine publishes")
    p.add_argument("--hwm", type=int, default=1000, help="PUB SNDHWM (vLLM's hwm)")
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--stop", type=float, default=3.0, help="seconds the recorder is stopped")
    p.add_argument("--stop-after", type=float, default=2.0, help="seconds into the stream")
    p.add_argument(
        "--grace",
        type=float,
        default=60.0,
        help="seconds after the last send before the recorder is stopped (SIGTERM)",
    )
    p.add_argument("--keep", action="store_true", help="keep the recordings")
    p.add_argument("--name", default="soak-gaps")
    p.add_argument("--out", type=Path, help="write the figures here instead (JSON)")
    p.add_argument("--publisher", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.publisher is not None:
        return publisher(args.publisher, args.batches, args.rate, args.hwm)

    msgs = stream(args.capture, args.batches)
    load0 = os.getloadavg()
    runs = []
    with tempfile.TemporaryDirectory(prefix="soak-gaps-") as tmp:
        for n in range(1, args.runs + 1):
            r = one_run(args, n, Path(tmp), msgs)
            runs.append(r)
            print(json.dumps({k: v for k, v in r.items() if k != "summary"}), flush=True)
            if not r["ok"]:
                print("  " + "\n  ".join(r["summary"]), flush=True)
    lost = sum(r["missing"] for r in runs)
    result = {
        "capture": str(
            args.capture.relative_to(ROOT) if args.capture.is_relative_to(ROOT) else args.capture
        ),
        "batches": args.batches,
        "rate": args.rate,
        "hwm": args.hwm,
        "stop_s": args.stop,
        "stop_after_s": args.stop_after,
        "load_at_start": load0,
        "load_at_end": os.getloadavg(),
        "runs": runs,
        "ok_runs": sum(r["ok"] for r in runs),
        "missing_total": lost,
    }
    if args.out is not None:
        args.out.write_text(json.dumps({"machine": machine(), **result}, indent=1) + "\n")
        path = args.out
    else:
        path = save_result(args.name, result)
    print(
        json.dumps(
            {
                "ok_runs": result["ok_runs"],
                "of": len(runs),
                "missing_total": lost,
                "gaps_forced": [r["ledger_gaps"] for r in runs],
                "results": str(path),
                "machine": machine()["cpu"],
            }
        )
    )
    return 0 if result["ok_runs"] == len(runs) else 1


if __name__ == "__main__":
    sys.exit(main())
