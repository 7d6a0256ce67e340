"""Record capacity: a max-speed pre-encoded publisher into ``kvtool record --replay``.

The publisher (this script with ``--publisher``, its own process) sends the big stream's
pre-encoded payloads with vLLM's framing (topic, 8-byte seq, payload) as fast as ZeroMQ
takes them, from an XPUB socket (PUB semantics; XPUB only so it can wait for the
recorder's subscription instead of losing the first batches to the slow joiner) with
``SNDHWM`` = vLLM's default 100,000 or a small 1,000, and serves vLLM's replay protocol
on a ROUTER socket from a buffer of the last 10,000 batches (vLLM's ``buffer_steps``),
polling it between sends as vLLM's publisher thread does. ``kvtool record`` subscribes
with ``--replay`` and stops after the stream's number of batches (``-n``).

Measured per run: the publisher's send time and rate (how fast ZeroMQ queues the
batches); the same publisher into a subscriber that only counts (what the transport
delivers to any Python subscriber); the recorder's sustained rate
(batches / time from the first send until the recorder has them all and exits) and its
ratio to the publisher's (the recorder's time runs until the last batch it received, read
from the recording's log_time); lost and recovered batches (from the recording's gap ledger,
and by checking every seq's payload is there byte for byte); the recorder's CPU per
batch (its rusage, minus its start-up CPU measured separately).

    python3 bench/bench_record.py bench/data/big1.frames --runs 3 [--loops 3 --name record-loops3]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import select
import signal
import struct
import subprocess
import sys
import tempfile
import time
from collections import deque
from pathlib import Path
from typing import Any

from _common import ROOT, Run, kvtool_cmd, median, run_child, save_result

BUFFER_STEPS = 10_000
IDLE_STOP_S = 30.0  # longer than the recorder's replay timeout + back-off (2 s + 10 s) + a transfer
END = b"\xff" * 8


def read_frames(path: Path) -> list[tuple[bytes, bytes]]:
    """(topic, payload) per message of a ``.frames`` file."""
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
        out.append((frames[0], frames[2]))
    return out


def stream(path: Path, loops: int) -> list[tuple[bytes, int, bytes]]:
    msgs = read_frames(path)
    return [(t, i, p) for i, (t, p) in enumerate(msgs * loops)]


def publisher(path: Path, loops: int, hwm: int) -> int:
    """Child process: publish the stream at max speed and serve replay until SIGTERM."""
    import zmq

    msgs = stream(path, loops)
    stop = False

    def on_term(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    ctx = zmq.Context()
    pub = ctx.socket(zmq.XPUB)
    pub.set_hwm(hwm)  # what vLLM does with its hwm setting
    pub.setsockopt(zmq.LINGER, 0)
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.SNDHWM, 2 * (BUFFER_STEPS + 1))
    router.setsockopt(zmq.LINGER, 0)
    rport = router.bind_to_random_port("tcp://127.0.0.1")
    buf: deque[tuple[bytes, bytes, bytes]] = deque(maxlen=BUFFER_STEPS)
    replays = [0, 0]

    def serve() -> None:
        ident, _empty, start = router.recv_multipart()
        start_seq = int.from_bytes(start, "big")
        replays[0] += 1
        for topic, seqb, payload in buf:
            if int.from_bytes(seqb, "big") >= start_seq:
                router.send_multipart((ident, b"", topic, seqb, payload))
                replays[1] += 1
        router.send_multipart((ident, b"", b"", END, b""))

    print(json.dumps({"port": port, "replay_port": rport, "batches": len(msgs)}), flush=True)
    if not pub.poll(60_000):
        print(json.dumps({"error": "no subscriber"}), flush=True)
        return 1
    pub.recv()  # the subscription
    time.sleep(0.3)
    wall0 = time.time()
    t0 = time.perf_counter()
    for i, (topic, seq, payload) in enumerate(msgs):
        if i & 7 == 0 and router.poll(0):
            serve()
        seqb = seq.to_bytes(8, "big")
        pub.send_multipart((topic, seqb, payload), copy=False)
        buf.append((topic, seqb, payload))
    t1 = time.perf_counter()
    print(json.dumps({"first_send": wall0, "send_s": t1 - t0, "sent": len(msgs)}), flush=True)
    while not stop:
        if router.poll(100):
            serve()
    print(json.dumps({"replay_requests": replays[0], "replayed": replays[1]}), flush=True)
    pub.close()
    router.close()
    ctx.term()
    return 0


def check_recording(out: Path, msgs: list[tuple[bytes, int, bytes]]) -> dict[str, Any]:
    from kvtool.recording import open_recording

    want = {seq: hashlib.blake2b(p, digest_size=16).digest() for _t, seq, p in msgs}
    seen: dict[int, bytes] = {}
    first_log = last_log = None
    dup = 0
    with open_recording(out) as rec:
        for m in rec.messages():
            if m.seq in seen:
                dup += 1
            seen[m.seq] = hashlib.blake2b(m.data, digest_size=16).digest()
            first_log = m.log_time if first_log is None else min(first_log, m.log_time)
            last_log = m.log_time if last_log is None else max(last_log, m.log_time)
        ledger = rec.ledger or {}
    missing = [s for s in want if s not in seen]
    wrong = [s for s in want if s in seen and seen[s] != want[s]]
    return {
        "recorded": len(seen),
        "duplicates": dup,
        "missing": len(missing),
        "payload_mismatch": len(wrong),
        "ledger_lost": ledger.get("lost"),
        "ledger_recovered": ledger.get("recovered"),
        "log_time_span_s": (last_log - first_log) / 1e9 if first_log is not None else None,
        "last_log_time_ns": last_log,
    }


def sink_run(frames: Path, loops: int, hwm: int, cpus_pub: str | None) -> dict[str, Any]:
    """The same publisher into a subscriber that only counts: the transport's delivery rate."""
    import zmq

    pub_cmd = [sys.executable, __file__, "--publisher", str(frames), str(loops), str(hwm)]
    if cpus_pub:
        pub_cmd = ["taskset", "-c", cpus_pub, *pub_cmd]
    pub = subprocess.Popen(pub_cmd, stdout=subprocess.PIPE, text=True)
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.RCVHWM, 5000)  # like the recorder's
    sub.setsockopt(zmq.LINGER, 0)
    sub.subscribe(b"")
    got = 0
    try:
        assert pub.stdout is not None
        hello = json.loads(pub.stdout.readline())
        n = hello["batches"]
        sub.connect(f"tcp://127.0.0.1:{hello['port']}")
        while got < n and sub.poll(3000):
            sub.recv_multipart(copy=False)
            got += 1
        done = time.time()
        sent = json.loads(pub.stdout.readline())
    finally:
        sub.close()
        ctx.term()
        pub.send_signal(signal.SIGTERM)
        try:
            pub.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            pub.kill()
            pub.communicate()
    if got < n:
        done -= 3.0  # the idle poll that ended the loop
    span = done - sent["first_send"]
    return {
        "hwm": hwm,
        "batches": n,
        "received": got,
        "sink_s": span,
        "sink_batches_per_s": got / span,
        "publisher_batches_per_s": n / sent["send_s"],
    }


def one_run(
    frames: Path,
    loops: int,
    hwm: int,
    cpus_pub: str | None,
    cpus_rec: str | None,
    tmp: Path,
    msgs: list[tuple[bytes, int, bytes]],
) -> dict[str, Any]:
    out = tmp / f"rec-{hwm}-{time.time_ns()}.mcap"
    pub_cmd = [sys.executable, __file__, "--publisher", str(frames), str(loops), str(hwm)]
    if cpus_pub:
        pub_cmd = ["taskset", "-c", cpus_pub, *pub_cmd]
    pub = subprocess.Popen(pub_cmd, stdout=subprocess.PIPE, text=True)
    try:
        assert pub.stdout is not None
        hello = json.loads(pub.stdout.readline())
        n = hello["batches"]
        rec_cmd = [
            *kvtool_cmd(),
            "record",
            f"tcp://127.0.0.1:{hello['port']}",
            "--replay",
            f"tcp://127.0.0.1:{hello['replay_port']}",
            "-o",
            str(out),
            "-n",
            str(n),
            "--duration",
            "600s",
            "-q",
        ]
        if cpus_rec:
            rec_cmd = ["taskset", "-c", cpus_rec, *rec_cmd]
        t0 = time.perf_counter()
        rproc = subprocess.Popen(rec_cmd, stderr=subprocess.PIPE)
        sent: dict[str, Any] | None = None
        last_size, last_change, stopped = -1, time.time(), False
        while True:
            pid, status, ru = os.wait4(rproc.pid, os.WNOHANG)
            if pid:
                break
            now = time.time()
            if sent is None and select.select([pub.stdout], [], [], 0)[0]:
                sent = json.loads(pub.stdout.readline())
            size = out.stat().st_size if out.exists() else 0
            if size != last_size:
                last_size, last_change = size, now
            elif sent is not None and not stopped and now - last_change > IDLE_STOP_S:
                # Batches were lost, so -n is never reached: stop the recorder (SIGTERM
                # closes the recording properly).
                rproc.send_signal(signal.SIGTERM)
                stopped = True
            time.sleep(0.05)
        done = time.time()
        rproc.returncode = os.waitstatus_to_exitcode(status)
        rerr = rproc.stderr.read() if rproc.stderr else b""
        if rproc.stderr:
            rproc.stderr.close()
        rec = Run(
            time.perf_counter() - t0,
            ru.ru_utime + ru.ru_stime,
            ru.ru_maxrss / 1024.0,
            rproc.returncode,
        )
        if sent is None:
            sent = json.loads(pub.stdout.readline())
    finally:
        pub.send_signal(signal.SIGTERM)
        try:
            tail = pub.communicate(timeout=10)[0]
        except subprocess.TimeoutExpired:
            pub.kill()
            tail = pub.communicate()[0]
    replay = json.loads(tail.strip().splitlines()[-1]) if tail.strip() else {}
    check = check_recording(out, msgs)
    out.unlink(missing_ok=True)
    # The recorder's time: from the first send until it received its last batch (the
    # recording's last log_time; receive time, also for batches fetched over replay).
    recv_s = check.pop("last_log_time_ns") / 1e9 - sent["first_send"]
    # End to end: until the recorder has written everything and closed the file (only
    # meaningful when it stopped by itself at -n, i.e. nothing was lost).
    rec_s = None if stopped else done - sent["first_send"]
    return {
        "recorder_receive_s": recv_s,
        "recorder_receive_batches_per_s": check["recorded"] / recv_s,
        "recorder_stopped_by_bench": stopped,
        "recorder_stderr_tail": rerr.decode(errors="replace")[-300:],
        "hwm": hwm,
        "batches": n,
        "publisher_send_s": sent["send_s"],
        "publisher_batches_per_s": n / sent["send_s"],
        "recorder_s": rec_s,
        "recorder_batches_per_s": n / rec_s if rec_s else None,
        "ratio_recorder_over_publisher": sent["send_s"] / rec_s if rec_s else None,
        "recorder": rec,
        **check,
        **replay,
    }


def writer_cost(frames: Path, runs: int, compression: str) -> dict[str, Any]:
    """The recording writer alone, in this process: CPU µs per batch written.

    Every batch of ``frames`` through ``RecordingWriter.write`` (one channel, the stream's
    seqs, rising log times) into a fresh file, then ``close``; process CPU time, no
    sockets, so the figure is the writer's own cost and holds on a loaded machine. One
    untimed run first: imports made at first use (the compressor's module) and first
    touches are start-up, not per-batch cost.
    """
    from kvtool.recording.writer import RecordingWriter

    msgs = read_frames(frames)
    tmp = Path(tempfile.mkdtemp(prefix="kvbench-wr-"))
    per_batch: list[float] = []
    size = 0
    for i in range(-1, runs):
        out = tmp / f"w{i + 1}.mcap"
        t0 = time.process_time()
        with RecordingWriter(out, compression=compression) as w:
            ch = w.add_channel("tcp://127.0.0.1:5557", "", 0)
            for seq, (_topic, payload) in enumerate(msgs):
                w.write(ch, seq, payload, 1_000_000_000 + seq)
        cost = (time.process_time() - t0) / len(msgs) * 1e6
        size = out.stat().st_size
        out.unlink()
        if i < 0:
            continue  # the warm-up
        per_batch.append(cost)
        print(f"writer run {i + 1}: {per_batch[-1]:.1f} us/batch CPU", file=sys.stderr)
    tmp.rmdir()
    import kvtool.recording.writer as module

    return {
        "batches": len(msgs),
        "compression": compression,
        "file_bytes": size,
        "writer_module": module.__file__,
        "cpu_us_per_batch": per_batch,
        "median_cpu_us_per_batch": median(per_batch),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description="record capacity")
    ap.add_argument("frames", nargs="?", default=str(ROOT / "bench/data/big1.frames"))
    ap.add_argument(
        "--loops",
        type=int,
        default=1,
        help="play the stream this many times (seq renumbered), to exceed the replay buffer",
    )
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--hwm", type=int, nargs="+", default=[100_000, 1000])
    ap.add_argument("--cpus-pub", default=None, help="taskset CPU list for the publisher")
    ap.add_argument("--cpus-rec", default=None, help="taskset CPU list for the recorder")
    ap.add_argument("--name", default="record", help="result file name (bench/data/results/)")
    ap.add_argument(
        "--writer",
        action="store_true",
        help="measure the recording writer alone, in process (CPU us per batch)",
    )
    ap.add_argument("--compression", default="zstd", help="with --writer: zstd, lz4 or none")
    ap.add_argument("--publisher", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.writer:
        res = writer_cost(Path(args.frames), args.runs, args.compression)
        save_result(args.name, res)
        print(
            f"{res['batches']} batches, {args.compression}: writer "
            f"{res['median_cpu_us_per_batch']:.1f} us/batch CPU (median of {args.runs})"
        )
        return 0
    if args.publisher:
        return publisher(Path(args.publisher[0]), int(args.publisher[1]), int(args.publisher[2]))
    frames = Path(args.frames)
    msgs = stream(frames, args.loops)
    tmp = Path(tempfile.mkdtemp(prefix="kvbench-rec-"))
    # The recorder's start-up CPU (interpreter, imports), subtracted for CPU per batch.
    startup = median(
        [run_child([*kvtool_cmd(), "record", "--help"], cpus=args.cpus_rec).cpu_s for _ in range(3)]
    )
    runs: dict[int, list[dict[str, Any]]] = {h: [] for h in args.hwm}
    sinks: dict[int, list[dict[str, Any]]] = {h: [] for h in args.hwm}
    for i in range(args.runs):
        for hwm in args.hwm:
            s = sink_run(frames, args.loops, hwm, args.cpus_pub)
            sinks[hwm].append(s)
            print(
                f"run {i + 1} hwm {hwm:6d}: counting subscriber received {s['received']}/"
                f"{s['batches']} at {s['sink_batches_per_s']:.0f}/s",
                file=sys.stderr,
            )
            r = one_run(frames, args.loops, hwm, args.cpus_pub, args.cpus_rec, tmp, msgs)
            r["recorder_cpu_per_batch_us"] = (r["recorder"].cpu_s - startup) / r["batches"] * 1e6
            runs[hwm].append(r)
            e2e = r["recorder_batches_per_s"]
            print(
                f"run {i + 1} hwm {hwm:6d}: publisher {r['publisher_batches_per_s']:8.0f}/s, "
                f"recorder end-to-end {e2e if e2e is None else round(e2e)}/s, receive "
                f"{r['recorder_receive_batches_per_s']:.0f}/s; lost {r['ledger_lost']} "
                f"missing {r['missing']} recovered {r['ledger_recovered']} replayed "
                f"{r.get('replayed')}, cpu/batch {r['recorder_cpu_per_batch_us']:.0f} us, "
                f"rc {r['recorder'].returncode}",
                file=sys.stderr,
            )

    def med(xs: list[Any]) -> float | None:
        xs = [x for x in xs if x is not None]
        return median(xs) if xs else None

    summary: dict[str, Any] = {}
    for hwm, rs in runs.items():
        pub_rate = med([r["publisher_batches_per_s"] for r in rs])
        rec_rate = med([r["recorder_batches_per_s"] for r in rs])
        recv_rate = med([r["recorder_receive_batches_per_s"] for r in rs])
        sink_rate = med([s["sink_batches_per_s"] for s in sinks[hwm]])
        summary[str(hwm)] = {
            "batches": rs[0]["batches"],
            "median_publisher_batches_per_s": pub_rate,
            "median_recorder_batches_per_s": rec_rate,
            "median_recorder_receive_batches_per_s": recv_rate,
            "median_sink_batches_per_s": sink_rate,
            "ratio_recorder_over_publisher": rec_rate / pub_rate if rec_rate else None,
            "ratio_recorder_receive_over_publisher": recv_rate / pub_rate if recv_rate else None,
            "ratio_recorder_over_sink": rec_rate / sink_rate if rec_rate else None,
            "ratio_recorder_receive_over_sink": recv_rate / sink_rate if recv_rate else None,
            "median_recorder_cpu_per_batch_us": med([r["recorder_cpu_per_batch_us"] for r in rs]),
            "sink_received_per_run": [s["received"] for s in sinks[hwm]],
            "lost_per_run": [r["ledger_lost"] for r in rs],
            "missing_per_run": [r["missing"] for r in rs],
            "payload_mismatch_per_run": [r["payload_mismatch"] for r in rs],
            "recovered_per_run": [r["ledger_recovered"] for r in rs],
            "exit_status_per_run": [r["recorder"].returncode for r in rs],
        }
    payload_mb = sum(len(p) for _t, _s, p in msgs) / 1e6
    save_result(
        args.name,
        {
            "frames": str(frames),
            "loops": args.loops,
            "payload_mb": payload_mb,
            "startup_cpu_s": startup,
            "runs": runs,
            "sinks": sinks,
            "summary": summary,
        },
    )
    print(
        f"\n{len(msgs)} batches, {payload_mb:.0f} MB payload; recorder start-up CPU {startup:.2f} s"
    )

    def f(x: float | None, fmt: str = ".0f") -> str:
        return "n/a" if x is None else format(x, fmt)

    for hwm, s in summary.items():
        print(
            f"SNDHWM {hwm:>6}: publisher {f(s['median_publisher_batches_per_s'])}/s; recorder"
            f" end-to-end {f(s['median_recorder_batches_per_s'])}/s (x"
            f"{f(s['ratio_recorder_over_publisher'], '.2f')} of publisher, goal >= 1.0), "
            f"receive {f(s['median_recorder_receive_batches_per_s'])}/s; counting subscriber "
            f"{f(s['median_sink_batches_per_s'])}/s; lost {s['lost_per_run']} missing "
            f"{s['missing_per_run']} (goal 0); recovered {s['recovered_per_run']}; CPU "
            f"{f(s['median_recorder_cpu_per_batch_us'])} us/batch"
        )
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(main())
