"""Issue 22: ``kvtool serve`` -- scrape time with 1,000 label sets, and keeping up with a
max-speed publisher of the stress recording (0 lost), with and without a scrape flood.

Usage::

    python3 bench/bench_serve.py                       # both parts (needs bench/data/big1.mcap)
    python3 bench/bench_serve.py --part scrape
    python3 bench/bench_serve.py --part keepup --flood 4
    python3 bench/bench_serve.py --part memory --seconds 180   # RSS over an endless stream

The figures go to ``bench/data/results/serve.json``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import msgspec
from _common import DATA, kvtool_cmd, save_result

BLOCK = 16
T0 = 1_764_000_000_000_000_000


def label_sets_recording(path: Path, ranks: int = 10, groups: int = 100, batches: int = 40) -> int:
    """A recording with ``ranks`` x ``groups`` report rows (label sets): each rank its own
    channel; each batch stores one block in every group and removes the one stored 10
    batches earlier. Returns the label sets."""
    from kvtool.recording import RecordingWriter

    enc = msgspec.msgpack.Encoder()
    if path.exists():
        path.unlink()
    with RecordingWriter(path) as w:
        chans = [w.add_channel(f"tcp://127.0.0.1:{5557 + r}", "", r) for r in range(ranks)]
        t = T0
        for b in range(batches):
            for r, cid in enumerate(chans):
                events: list[list[Any]] = []
                for g in range(groups):
                    kind, window = (
                        ("full_attention", None) if g % 4 == 0 else ("sliding_window", 1024)
                    )
                    h = (r * 1_000_003 + g * 10_007 + b) & 0x7FFF_FFFF_FFFF_FFFF
                    events.append(
                        [
                            "BlockStored",
                            [h],
                            None,
                            list(range(BLOCK)),
                            BLOCK,
                            None,
                            "GPU",
                            None,
                            None,
                            g,
                            kind,
                            window,
                        ]
                    )
                    if b >= 10:
                        old = (r * 1_000_003 + g * 10_007 + b - 10) & 0x7FFF_FFFF_FFFF_FFFF
                        events.append(["BlockRemoved", [old], "GPU", g])
                payload = enc.encode([t / 1e9, events, r])
                w.write(cid, b, payload, t)
                t += 1_000_000
    return ranks * groups


def part_scrape(scrapes: int) -> dict[str, Any]:
    from kvtool.serve import Exporter
    from kvtool.serve_http import MetricsServer
    from kvtool.top import RecordingSource, ReportFeed

    DATA.mkdir(parents=True, exist_ok=True)
    path = DATA / "serve_labels.mcap"
    sets = label_sets_recording(path)
    src = RecordingSource(str(path), speed=0)
    feed = ReportFeed(src.groups, whole_stream=False)
    feed.add(src.take(0.0))
    exp = Exporter()
    renders = []
    for _ in range(5):
        exp.update(feed, src.health(), src.gap_ledger)
        renders.append(exp.render_s)
    body = exp.body()
    served_sets = len(
        {
            line.split("}")[0]
            for line in body.decode().splitlines()
            if line.startswith("kvtool_live_blocks{")
        }
    )
    samples = sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))
    server = MetricsServer(exp, "127.0.0.1", 0).start()
    lats: dict[str, list[float]] = {"plain": [], "gzip": []}
    gz_bytes = 0
    try:
        for _ in range(scrapes):
            for enc in ("plain", "gzip"):
                req = urllib.request.Request(server.url)
                if enc == "gzip":  # as Prometheus asks
                    req.add_header("Accept-Encoding", "gzip")
                t = time.perf_counter()
                with urllib.request.urlopen(req, timeout=30) as r:
                    got = r.read()
                lats[enc].append(time.perf_counter() - t)
                if enc == "gzip":
                    gz_bytes = len(got)
                    got = gzip.decompress(got)
                assert got == body
    finally:
        server.stop()
    out = {
        "label_sets": sets,
        "label_sets_served": served_sets,
        "samples": samples,
        "body_bytes": len(body),
        "gzip_bytes": gz_bytes,
        "scrapes": scrapes,
        "snapshot_render_ms_median": round(statistics.median(renders) * 1e3, 1),
    }
    for enc, lat in lats.items():
        lat.sort()
        out[f"scrape_ms_{enc}_p50"] = round(statistics.median(lat) * 1e3, 2)
        out[f"scrape_ms_{enc}_p99"] = round(lat[int(len(lat) * 0.99) - 1] * 1e3, 2)
        out[f"scrape_ms_{enc}_max"] = round(lat[-1] * 1e3, 2)
    print(json.dumps(out, indent=1))
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _metrics(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url, timeout=30) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("#") or not line:
            continue
        name = line.split("{")[0].split(" ")[0]
        out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def part_keepup(rec: Path, flood: int, deadline_s: float) -> dict[str, Any]:
    from kvtool.recording import open_recording

    with open_recording(rec) as r:
        n = sum(1 for _ in r.messages())
    tmp = DATA / "serve_keepup"
    tmp.mkdir(parents=True, exist_ok=True)
    out_rec = tmp / f"kept-{flood}.mcap"
    if out_rec.exists():
        out_rec.unlink()
    ep, rep = f"tcp://127.0.0.1:{_free_port()}", f"tcp://127.0.0.1:{_free_port()}"
    pub_err = (tmp / "pub.err").open("w")
    pub = subprocess.Popen(
        [
            *kvtool_cmd(),
            "replay",
            str(rec),
            "--publish",
            ep,
            "--replay-endpoint",
            rep,
            "--max-speed",
            "--wait-subscribers",
            "1",
            "--wait-timeout",
            "120",
            "--hold",
            "600",
        ],
        stdout=subprocess.DEVNULL,
        stderr=pub_err,
    )
    serve_err = tmp / "serve.err"
    with serve_err.open("w") as f:
        serve = subprocess.Popen(
            [
                *kvtool_cmd(),
                "serve",
                ep,
                "--replay-endpoint",
                rep,
                "--record",
                str(out_rec),
                "--metrics",
                "127.0.0.1:0",
                "--interval",
                "1s",
            ],
            stdout=subprocess.DEVNULL,
            stderr=f,
        )
    url = None
    stop = threading.Event()
    floods = [0]
    rss: list[float] = []
    try:
        t_dead = time.monotonic() + 120
        while url is None and time.monotonic() < t_dead:
            m = re.search(r"serving (\S+/metrics)", serve_err.read_text())
            url = m.group(1) if m else None
            time.sleep(0.05)
        assert url is not None, serve_err.read_text()

        def flooder() -> None:
            while not stop.is_set():
                try:
                    with urllib.request.urlopen(url, timeout=30) as r:
                        r.read()
                    floods[0] += 1
                except OSError:
                    time.sleep(0.01)

        threads = [threading.Thread(target=flooder, daemon=True) for _ in range(flood)]
        for th in threads:
            th.start()
        t_start = time.monotonic()
        t_first: float | None = None
        got: dict[str, float] = {}
        while time.monotonic() < t_start + deadline_s:
            got = _metrics(url)
            rss.append(_rss_mb(serve.pid))
            if t_first is None and got.get("kvtool_batches_received_total", 0) > 0:
                t_first = time.monotonic() - t_start
            if got.get("kvtool_batches_received_total", 0) >= n:
                break
            time.sleep(0.1)
        t_caught = time.monotonic() - t_start
        stop.set()
        for th in threads:
            th.join(60)
        final = _metrics(url)
    finally:
        stop.set()
        if serve.poll() is None:
            serve.send_signal(signal.SIGTERM)
        serve.wait(120)
        if pub.poll() is None:
            pub.send_signal(signal.SIGTERM)
        pub.wait(60)
        pub_err.close()
    rep_json = json.loads(
        subprocess.run(
            [*kvtool_cmd(), "report", "--format", "json", str(out_rec)],
            capture_output=True,
            text=True,
            check=False,
        ).stdout
    )
    totals = rep_json["totals"]
    equal = {
        c: final.get(f"kvtool_{c}_total") == totals[c]
        for c in ("blocks_stored", "blocks_removed", "blocks_cleared", "orphan_removes")
    }
    out = {
        "recording": str(rec),
        "batches": n,
        "flood_clients": flood,
        "flood_scrapes": floods[0],
        "received": final.get("kvtool_batches_received_total"),
        "recovered": final.get("kvtool_batches_recovered_total"),
        "lost": final.get("kvtool_batches_lost_total"),
        "seconds_to_all_batches": round(t_caught, 1),
        # From the first snapshot with a batch in it to the one with all: the lag itself
        # (the time before is subscribing and the publisher's wait for a subscriber).
        "seconds_first_to_all_batches": (
            round(t_caught - t_first, 1) if t_first is not None else None
        ),
        "batches_per_s_end_to_end": round(n / t_caught, 0) if t_caught else None,
        "serve_rss_mb_max": round(max(rss, default=0.0), 0),
        "serve_rss_mb_samples": [round(x) for x in rss[:: max(1, len(rss) // 8)]],
        "counters_equal_report_of_record": equal,
        "serve_exit": serve.returncode,
    }
    print(json.dumps(out, indent=1))
    return out


def endless_publisher(
    endpoint: str, stop: threading.Event, rate: float, blocks: int, sent: list[int]
) -> None:
    """A vLLM-framed publisher of fresh blocks without end, until ``stop``.

    Each batch stores ``blocks`` new hashes in each of two groups (full attention, and a
    sliding window of 1,024), removes those stored 200 batches earlier (a pool of ~200
    batches' blocks), and re-stores every 7th batch's removes 50 batches later (recomputes),
    removed again 100 batches after that: the live blocks stay level while the distinct
    keys grow without bound, as an engine's do.
    """
    import zmq

    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub.setsockopt(zmq.SNDHWM, 100_000)
    pub.bind(endpoint)
    enc = msgspec.msgpack.Encoder()
    groups = ((0, "full_attention", None), (1, "sliding_window", 1024))

    def hashes(b: int) -> list[int]:
        return [(b * blocks + i) * 2654435761 % (1 << 63) for i in range(blocks)]

    try:
        time.sleep(2.0)  # the subscriber joins (ZeroMQ's slow joiner)
        seq = 0
        t_next = time.monotonic()
        while not stop.is_set():
            events: list[dict[str, Any]] = []
            for g, kind, window in groups:
                events.append({
                    "type": "BlockStored", "block_hashes": hashes(seq), "parent_block_hash": None,
                    "token_ids": list(range(blocks * BLOCK)), "block_size": BLOCK,
                    "lora_id": None, "medium": "GPU", "lora_name": None, "group_idx": g,
                    "kv_cache_spec_kind": kind, "kv_cache_spec_sliding_window": window,
                })  # fmt: skip
                if seq >= 200:
                    events.append({"type": "BlockRemoved", "block_hashes": hashes(seq - 200),
                                   "medium": "GPU", "group_idx": g})  # fmt: skip
                if seq >= 350 and (seq - 350) % 7 == 0:  # the recomputed ones go again
                    events.append({"type": "BlockRemoved", "block_hashes": hashes(seq - 350),
                                   "medium": "GPU", "group_idx": g})  # fmt: skip
                if seq >= 250 and (seq - 250) % 7 == 0:
                    events.append({
                        "type": "BlockStored", "block_hashes": hashes(seq - 250),
                        "parent_block_hash": None, "token_ids": [], "block_size": BLOCK,
                        "lora_id": None, "medium": "GPU", "lora_name": None,
                        "group_idx": g, "kv_cache_spec_kind": kind,
                        "kv_cache_spec_sliding_window": window,
                    })  # fmt: skip
            payload = enc.encode([time.time(), events, 0])
            pub.send_multipart([b"", seq.to_bytes(8, "big"), payload])
            seq += 1
            sent[0] = seq
            t_next += 1.0 / rate
            delay = t_next - time.monotonic()
            if delay > 0:
                time.sleep(delay)
    finally:
        pub.close(0)
        ctx.term()


def part_memory(seconds: float, rate: float, blocks: int, remember: int) -> dict[str, Any]:
    """RSS of ``kvtool serve --remember-keys N`` over an endless stream of fresh blocks."""
    tmp = DATA / "serve_memory"
    tmp.mkdir(parents=True, exist_ok=True)
    ep = f"tcp://127.0.0.1:{_free_port()}"
    stop = threading.Event()
    sent = [0]
    pub = threading.Thread(
        target=endless_publisher, args=(ep, stop, rate, blocks, sent), daemon=True
    )
    err = tmp / f"serve-{remember}.err"
    with err.open("w") as f:
        serve = subprocess.Popen(
            [*kvtool_cmd(), "serve", ep, "--metrics", "127.0.0.1:0", "--interval", "1s",
             "--remember-keys", str(remember)],
            stdout=subprocess.DEVNULL, stderr=f,
        )  # fmt: skip
    samples: list[dict[str, float]] = []
    final: dict[str, float] = {}
    try:
        url = None
        t_dead = time.monotonic() + 120
        while url is None and time.monotonic() < t_dead:
            m = re.search(r"serving (\S+/metrics)", err.read_text())
            url = m.group(1) if m else None
            time.sleep(0.05)
        assert url is not None, err.read_text()
        pub.start()
        t0 = time.monotonic()
        while time.monotonic() < t0 + seconds:
            time.sleep(5.0)
            got = _metrics(url)
            samples.append({
                "t_s": round(time.monotonic() - t0),
                "rss_mb": round(_rss_mb(serve.pid)),
                "blocks_stored": got.get("kvtool_blocks_stored_total", 0.0),
                "state_keys": got.get("kvtool_state_keys", 0.0),
                "forgotten": got.get("kvtool_keys_forgotten_total", 0.0),
                "horizon_s": round(got.get("kvtool_recompute_horizon_seconds", 0.0), 1),
            })  # fmt: skip
            print(json.dumps(samples[-1]), file=sys.stderr)
        stop.set()
        pub.join(30)
        time.sleep(3.0)
        final = _metrics(url)
    finally:
        stop.set()
        if serve.poll() is None:
            serve.send_signal(signal.SIGTERM)
        serve.wait(120)
    half = [x["rss_mb"] for x in samples[len(samples) // 2 :]]
    out = {
        "remember_keys": remember,
        "seconds": seconds,
        "batches_sent": sent[0],
        "batches_received": final.get("kvtool_batches_received_total"),
        "lost": final.get("kvtool_batches_lost_total"),
        "blocks_stored": final.get("kvtool_blocks_stored_total"),
        "blocks_recomputed": final.get("kvtool_blocks_recomputed_total"),
        "keys_forgotten": final.get("kvtool_keys_forgotten_total"),
        "rss_mb_second_half_min_max": [min(half, default=0), max(half, default=0)],
        "samples": samples,
        "serve_exit": serve.returncode,
        "finding": [ln for ln in err.read_text().splitlines() if "finding" in ln],
    }
    print(json.dumps({k: v for k, v in out.items() if k != "samples"}, indent=1))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=["scrape", "keepup", "memory", "both"], default="both")
    ap.add_argument("--seconds", type=float, default=180.0, help="memory: how long")
    ap.add_argument("--rate", type=float, default=200.0, help="memory: batches/s")
    ap.add_argument("--blocks", type=int, default=64, help="memory: new blocks/group/batch")
    ap.add_argument("--remember", type=int, nargs="*", default=[1_000_000, 0],
                    help="memory: --remember-keys values to run")  # fmt: skip
    ap.add_argument("--scrapes", type=int, default=200)
    ap.add_argument("--recording", type=Path, default=DATA / "big1.mcap")
    ap.add_argument("--flood", type=int, nargs="*", default=[0, 4])
    ap.add_argument("--deadline", type=float, default=600.0)
    args = ap.parse_args()
    result: dict[str, Any] = {}
    if args.part in ("scrape", "both"):
        result["scrape"] = part_scrape(args.scrapes)
    if args.part == "memory":
        result["memory"] = [
            part_memory(args.seconds, args.rate, args.blocks, n) for n in args.remember
        ]
    if args.part in ("keepup", "both"):
        if not args.recording.is_file():
            print(
                f"bench_serve: {args.recording} missing (python3 bench/gen.py --scale 1 "
                "--name big1)",
                file=sys.stderr,
            )
            return 1
        result["keepup"] = [part_keepup(args.recording, f, args.deadline) for f in args.flood]
    print(save_result("serve", result), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
