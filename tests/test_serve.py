"""Issue 22: ``kvtool serve`` -- /metrics over real HTTP equals ``kvtool report`` on the same
stream (a recording played back, a live publisher with gap recovery, a real Prometheus)."""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import msgspec
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from kvtool.recording import RecordingWriter
from kvtool.report.registry import METRICS
from kvtool.serve import EXPORTER_METRICS, RESIDENCY_BUCKETS, Exporter, LabelFolder
from kvtool.top import RecordingSource, ReportFeed
from tests.conftest import capture_messages
from tests.peer import Peer
from tests.replayutil import capture_recording
from tests.test_live_faults import free_port
from tests.test_top import kvtool, report_json

DEADLINE_S = 90.0
FULL_ONLY = Path(__file__).parent / "data" / "recordings" / "full_only-v1.mcap"
Samples = dict[str, list[tuple[dict[str, str], float]]]


def parse(text: str) -> Samples:
    out: Samples = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((dict(s.labels), float(s.value)))
    return out


def scrape(url: str) -> Samples:
    """One real HTTP GET of /metrics."""
    with urllib.request.urlopen(url, timeout=30) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/plain")
        return parse(resp.read().decode())


def value(samples: Samples, name: str, **labels: str) -> float | None:
    for lab, v in samples.get(name, []):
        if all(lab.get(k) == x for k, x in labels.items()):
            return v
    return None


def sum_by(samples: Samples, name: str, label: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for lab, v in samples.get(name, []):
        out[lab[label]] = out.get(lab[label], 0.0) + v
    return out


def report_column(row: dict, metric: object) -> str | None:
    for name in (metric.name, *metric.aliases):  # type: ignore[attr-defined]
        if name in row:
            return name
    return None


def assert_equals_report(samples: Samples, rep: dict) -> int:
    """Every served registry counter and gauge, summed by kind, is the report's; returns how
    many counters were compared."""
    compared = 0
    for m in METRICS:
        if m.prom not in ("counter", "gauge"):
            continue
        col = report_column(rep["totals"], m)
        if col is None:
            continue  # the engine does not compute it yet: not served either
        name = m.prom_name + ("_total" if m.prom == "counter" else "")
        if m.merge == "ratio":
            # A ratio (hit_rate) is per series, from its summed parts; null: not served.
            want_r = {
                (
                    str(r["group_idx"]) if r["group_idx"] is not None else "none",
                    r["kind"],
                    str(r["sliding_window"]) if r["sliding_window"] is not None else "none",
                ): r[col]
                for r in rep["by_group"]
                if r[col] is not None
            }
            got_r = {
                (lab["group"], lab["kind"], lab["sliding_window"]): v
                for lab, v in samples.get(name, [])
            }
            assert got_r == want_r, name
            continue
        assert name in samples, name
        if m.name == "peak_live_blocks":
            # A peak is per series (rank x group x medium): with one medium, the by_group
            # table's; with several, each medium's is at most the group's, and together
            # they are at least it.
            got_by: dict[tuple[str, str, str], list[float]] = {}
            for lab, v in samples[name]:
                got_by.setdefault((lab["group"], lab["kind"], lab["sliding_window"]), []).append(v)
            want = {
                (
                    str(r["group_idx"]) if r["group_idx"] is not None else "none",
                    r["kind"],
                    str(r["sliding_window"]) if r["sliding_window"] is not None else "none",
                ): float(r[col])
                for r in rep["by_group"]
            }
            assert set(got_by) == set(want)
            for key, peaks in got_by.items():
                if len(peaks) == 1:
                    assert peaks[0] == want[key], key
                else:
                    assert max(peaks) <= want[key] <= sum(peaks), key
            continue
        assert sum_by(samples, name, "kind") == {r["kind"]: float(r[col]) for r in rep["by_kind"]}
        assert sum(v for _, v in samples[name]) == float(rep["totals"][col]), name
        compared += m.prom == "counter"
    return compared


@contextmanager
def serve_proc(
    tmp_path: Path, *args: str, command: str = "serve", stop: int = signal.SIGTERM
) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """``kvtool serve ARGS --metrics 127.0.0.1:0`` in a real process; yields it and its URL.

    Stopped by its PID (``stop``, SIGTERM) at the end.
    """
    err = tmp_path / f"serve-{time.monotonic_ns()}.err"
    with err.open("w") as errf:
        proc = subprocess.Popen(
            [sys.executable, "-m", "kvtool", command, *args, "--metrics", "127.0.0.1:0"],
            stdout=subprocess.DEVNULL,
            stderr=errf,
            text=True,
        )
    try:
        deadline = time.monotonic() + DEADLINE_S
        url = None
        while url is None and time.monotonic() < deadline and proc.poll() is None:
            m = re.search(r"serving (http://127\.0\.0\.1:\d+/metrics)", err.read_text())
            url = m.group(1) if m else None
            time.sleep(0.05)
        assert url is not None, f"serve never said where: {err.read_text()}"
        yield proc, url
    finally:
        if proc.poll() is None:
            proc.send_signal(stop)
        try:
            proc.wait(60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    proc.stderr_text = err.read_text()  # type: ignore[attr-defined]


def wait_for(url: str, name: str, want: float) -> Samples:
    """Scrape until ``name`` (unlabelled) reaches ``want``; fail after the deadline."""
    deadline = time.monotonic() + DEADLINE_S
    samples: Samples = {}
    while time.monotonic() < deadline:
        samples = scrape(url)
        if (value(samples, name) or 0) >= want:
            return samples
        time.sleep(0.1)
    raise AssertionError(f"{name} never reached {want}: {value(samples, name)}")


# -- a recording played into /metrics --------------------------------------------------------


@pytest.mark.parametrize(("name", "status"), [("gemma3", 0), ("full_only-v1", 3)])
def test_issue22_serve_recording_counters_equal_report(
    tmp_path: Path, name: str, status: int
) -> None:
    path = FULL_ONLY if name == "full_only-v1" else capture_recording(tmp_path, name)
    rep = report_json(path)
    with serve_proc(tmp_path, str(path), "--speed", "0", "--interval", "100ms") as (proc, url):
        samples = wait_for(url, "kvtool_source_done", 1)
        assert proc.poll() is None  # a recording that ended is still served
    assert proc.returncode == status  # SIGTERM ends it normally; 3: the stream lost batches
    assert assert_equals_report(samples, rep) >= 6
    assert value(samples, "kvtool_batches_received_total") == rep["source"]["batches"]
    # The lifetime histogram: vLLM's buckets, cumulative, one sample per removed block
    # with a known store (at most blocks_removed).
    counts = sum_by(samples, "kvtool_block_lifetime_seconds_count", "kind")
    for row in rep["by_kind"]:
        assert 0 < counts[row["kind"]] <= row["blocks_removed"]
    les = {lab["le"] for lab, _ in samples["kvtool_block_lifetime_seconds_bucket"]}
    assert les == {repr(b) for b in RESIDENCY_BUCKETS} | {"+Inf"}
    # Every family the exporter declares for a recording is served, with its help.
    for em in EXPORTER_METRICS:
        if em.name in ("pool_occupancy", "label_limit_reached"):
            continue
        served = em.prom_name + ("_total" if em.prom == "counter" else "")
        assert served in samples, served


def test_issue22_serve_full_only_health_is_the_recordings_ledger(tmp_path: Path) -> None:
    path = FULL_ONLY
    with serve_proc(tmp_path, str(path), "--speed", "0", "--interval", "100ms") as (_p, url):
        samples = wait_for(url, "kvtool_source_done", 1)
    # full_only's capture lost one batch and recovered one (its ledger).
    assert value(samples, "kvtool_batches_lost_total") == 1
    assert value(samples, "kvtool_batches_recovered_total") == 1
    assert value(samples, "kvtool_decode_errors_total", reason="batch") == 0


def test_issue22_exit_at_end_and_pool_occupancy(tmp_path: Path) -> None:
    path = capture_recording(tmp_path, "gemma3")
    rep = report_json(path)
    proc = kvtool(
        "serve", str(path), "--speed", "0", "--exit-at-end", "--metrics", "127.0.0.1:0",
        "--pool-blocks", "1000",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "serving http://127.0.0.1:" in proc.stderr
    assert proc.stdout == ""
    # The library, on the same recording: occupancy is the rank's live blocks / pool.
    exp = exporter_of(path, pool_blocks=1000)
    samples = parse(exp.body().decode())
    (occ,) = samples["kvtool_pool_occupancy_ratio"]
    # vLLM's block 0 is the null block: occupancy is of the N - 1 usable blocks, as report says.
    assert occ[1] == rep["totals"]["live_blocks_end"] / 999


def exporter_of(path: Path, **options: object) -> Exporter:
    src = RecordingSource(str(path), speed=0)
    feed = ReportFeed(src.groups, whole_stream=False)
    feed.add(src.take(0.0))
    exp = Exporter(**options)  # type: ignore[arg-type]
    exp.update(feed, src.health(), src.gap_ledger)
    return exp


def test_issue22_label_limit_folds_into_other_and_says_so(tmp_path: Path) -> None:
    path = capture_recording(tmp_path, "gemma3")
    rep = report_json(path)
    findings: list[str] = []
    exp = exporter_of(path, label_limit=2, on_finding=findings.append)
    samples = parse(exp.body().decode())
    groups = sum_by(samples, "kvtool_blocks_stored_total", "group")
    assert set(groups) == {"0", "1", "other"}  # 6 groups, 2 kept
    assert groups["other"] == 4 * 315
    # Sums are unchanged by folding: still the report's.
    assert assert_equals_report_counters_only(samples, rep)
    assert findings == ["label group: more than 2 values; the rest are served as 'other' "
                        "(--label-limit)"]  # fmt: skip
    assert value(samples, "kvtool_label_limit_reached", label="group") == 1


def assert_equals_report_counters_only(samples: Samples, rep: dict) -> bool:
    for m in METRICS:
        col = report_column(rep["totals"], m)
        if m.prom != "counter" or col is None:
            continue
        assert sum(v for _, v in samples[m.prom_name + "_total"]) == rep["totals"][col]
    return True


def odd_labels_recording(path: Path) -> Path:
    """Two ranks; a kind with a quote, a backslash and a newline; one without a window."""
    enc = msgspec.msgpack.Encoder()
    with RecordingWriter(path) as w:
        for rank in (0, 1):
            cid = w.add_channel(f"tcp://127.0.0.1:{5557 + rank}", "", rank)
            for b in range(12):
                events = [
                    ["BlockStored", [1000 * rank + b], None, list(range(16)), 16, None, "GPU",
                     None, None, 0, 'we"ird\\kind\nx', None],
                    ["BlockStored", [5000 + b], None, list(range(16)), 16, None, "GPU",
                     None, None, 1, "sliding_window", 128],
                ]  # fmt: skip
                if b >= 3:
                    events.append(["BlockRemoved", [1000 * rank + b - 3], "GPU", 0])
                t = 1_764_000_000_000_000_000 + (rank * 100 + b) * 1_000_000
                w.write(cid, b, enc.encode([t / 1e9, events, rank]), t)
    return path


@pytest.mark.parametrize("name", ["gemma3", "odd"])
def test_issue22_exposition_is_prometheus_clients_byte_for_byte(tmp_path: Path, name: str) -> None:
    path = (
        odd_labels_recording(tmp_path / "odd.mcap")
        if name == "odd"
        else capture_recording(tmp_path, name)
    )
    exp = exporter_of(path, pool_blocks=64, label_limit=3)
    assert exp.body() == generate_latest(exp.registry)
    samples = parse(exp.body().decode())
    if name == "odd":
        kinds = set(sum_by(samples, "kvtool_blocks_stored_total", "kind"))
        assert kinds == {'we"ird\\kind\\nx', "sliding_window"}  # printable() escapes \n
        assert set(sum_by(samples, "kvtool_live_blocks", "rank")) == {"0", "1"}


def test_issue22_folder_is_sticky_and_bounded() -> None:
    f = LabelFolder(label_limit=2, max_series=3)
    labels = ("a", "b")
    assert f.key(labels, ("x", "1")) == ("x", "1")
    assert f.key(labels, ("y", "1")) == ("y", "1")
    assert f.key(labels, ("z", "1")) == ("other", "1")
    assert f.key(labels, ("x", "2")) == ("other", "other")  # a 4th label set
    assert f.key(labels, ("x", "1")) == ("x", "1")  # kept for good
    assert len(f.findings) == 2


def test_issue22_serve_bad_metrics_address_is_one_line(tmp_path: Path) -> None:
    path = capture_recording(tmp_path, "gemma3")
    for addr in ("127.0.0.1:99999", "nohost:80", "[::1"):
        proc = kvtool("serve", str(path), "--metrics", addr, "--exit-at-end")
        assert proc.returncode == 2, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1 and "--metrics" in proc.stderr
        assert "Traceback" not in proc.stderr


def test_issue22_serve_port_in_use_is_one_line(tmp_path: Path) -> None:
    path = capture_recording(tmp_path, "gemma3")
    with serve_proc(tmp_path, str(path), "--speed", "0") as (_p, url):
        port = url.rsplit(":", 1)[1].split("/")[0]
        proc = kvtool("serve", str(path), "--metrics", f"127.0.0.1:{port}", "--exit-at-end")
    assert proc.returncode == 2
    assert proc.stderr.startswith("kvtool: --metrics 127.0.0.1:") and "cannot bind" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_issue22_serve_missing_recording_is_one_line() -> None:
    proc = kvtool("serve", "nope.mcap", "--exit-at-end")
    assert proc.returncode != 0 and "nope.mcap" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_issue22_gzip_for_a_scraper_that_asks(tmp_path: Path) -> None:
    path = capture_recording(tmp_path, "gemma3")
    with serve_proc(tmp_path, str(path), "--speed", "0") as (_p, url):
        wait_for(url, "kvtool_source_done", 1)
        with urllib.request.urlopen(url, timeout=30) as r:
            plain = r.read()
            assert r.headers.get("Content-Encoding") is None
        req = urllib.request.Request(url, headers={"Accept-Encoding": "gzip"})
        with urllib.request.urlopen(req, timeout=30) as r:
            assert r.headers["Content-Encoding"] == "gzip"
            packed = r.read()
    assert gzip.decompress(packed) == plain and len(packed) < len(plain)


def test_issue22_unknown_path_is_404(tmp_path: Path) -> None:
    path = capture_recording(tmp_path, "gemma3")
    with serve_proc(tmp_path, str(path), "--speed", "0") as (_p, url):
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(url.replace("/metrics", "/nothing"), timeout=30)
        assert err.value.code == 404
        err.value.close()


# -- live: a real publisher, the recorder's gap recovery, --record ------------------------------


@pytest.mark.zmq
def test_issue22_serve_live_with_gap_recovery_equals_report_of_its_record(
    tmp_path: Path,
) -> None:
    msgs = capture_messages("gemma3")
    out = tmp_path / "kept.mcap"
    with Peer(msgs, drop={5, 17}, subscribe_timeout=DEADLINE_S, rate=200) as peer:
        assert peer.replay_endpoint is not None
        with serve_proc(
            tmp_path, peer.endpoint, "--replay-endpoint", peer.replay_endpoint,
            "--record", str(out), "--interval", "100ms",
        ) as (proc, url):  # fmt: skip
            samples = wait_for(url, "kvtool_batches_received_total", len(msgs))
        assert proc.returncode == 0, proc.stderr_text  # type: ignore[attr-defined]
    assert value(samples, "kvtool_batches_recovered_total") == 2
    assert value(samples, "kvtool_batches_lost_total") == 0
    assert value(samples, "kvtool_open_gaps") == 0
    rep = report_json(out)
    assert rep["source"]["batches"] == len(msgs)
    assert assert_equals_report(samples, rep) >= 6
    (ep,) = {lab["endpoint"] for lab, _ in samples["kvtool_live_blocks"]}
    assert ep == peer.endpoint


@pytest.mark.slow
@pytest.mark.zmq
def test_issue22_scrape_flood_costs_the_recorder_no_batch(tmp_path: Path) -> None:
    """Four clients scraping /metrics without pause while a publisher sends 2,560 batches
    at 2,000/s: none lost, every counter still the report's of the kept stream."""
    msgs = capture_messages("gemma3")
    n = 40 * len(msgs)
    out = tmp_path / "kept.mcap"
    stop = threading.Event()
    scrapes = [0]
    with (
        Peer(msgs, count=n, rate=2000, subscribe_timeout=DEADLINE_S) as peer,
        serve_proc(
            tmp_path, peer.endpoint, "--replay-endpoint", str(peer.replay_endpoint),
            "--record", str(out), "--interval", "100ms",
        ) as (proc, url),
    ):  # fmt: skip

        def flood() -> None:
            while not stop.is_set():
                with urllib.request.urlopen(url, timeout=30) as r:
                    r.read()
                scrapes[0] += 1

        threads = [threading.Thread(target=flood, daemon=True) for _ in range(4)]
        for th in threads:
            th.start()
        try:
            samples = wait_for(url, "kvtool_batches_received_total", n)
        finally:
            stop.set()
            for th in threads:
                th.join(60)
    assert proc.returncode == 0
    assert scrapes[0] >= 4
    assert value(samples, "kvtool_batches_lost_total") == 0
    rep = report_json(out)
    assert rep["source"]["batches"] == n
    assert assert_equals_report(samples, rep) >= 6


@pytest.mark.zmq
def test_issue22_top_metrics_serves_the_same_numbers_while_watching(tmp_path: Path) -> None:
    msgs = capture_messages("gemma3")
    rep = report_json(capture_recording(tmp_path, "gemma3"))
    with Peer(msgs, subscribe_timeout=DEADLINE_S, rate=200) as peer, serve_proc(
        tmp_path, peer.endpoint, "--once", "--interval", "100ms", "--duration", "120s",
        command="top", stop=signal.SIGINT,
    ) as (proc, url):  # fmt: skip
        samples = wait_for(url, "kvtool_batches_received_total", len(msgs))
    assert proc.returncode == 130  # top ends on Ctrl-C with 130
    assert assert_equals_report(samples, rep) >= 6
    assert value(samples, "kvtool_batches_lost_total") == 0


# -- a real Prometheus server scraping serve --------------------------------------------------


def prometheus_binary() -> str:
    """Debian's prometheus (``.ci/run`` installs it); skipped without it outside CI only."""
    path = shutil.which("prometheus")
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("prometheus is not installed (apt-get install -y prometheus)")
        pytest.skip("prometheus is not on PATH (apt-get install -y prometheus)")
    return path


def free_tcp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Prometheus:
    """A real Prometheus server on 127.0.0.1 scraping one target; stopped by its PID."""

    def __init__(self, tmp_path: Path, target: str, interval: str = "500ms") -> None:
        self.port = free_tcp_port()
        cfg = tmp_path / "prometheus.yml"
        cfg.write_text(
            "global:\n"
            f"  scrape_interval: {interval}\n"
            f"  scrape_timeout: {interval}\n"
            "scrape_configs:\n"
            "  - job_name: kvtool\n"
            "    static_configs:\n"
            f"      - targets: ['{target}']\n"
        )
        self.log = tmp_path / "prometheus.log"
        with self.log.open("w") as log:
            self.proc = subprocess.Popen(
                [
                    prometheus_binary(),
                    f"--config.file={cfg}",
                    f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--log.level=warn",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.url = f"http://127.0.0.1:{self.port}"

    def ready(self) -> None:
        deadline = time.monotonic() + DEADLINE_S
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log.read_text()
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=5) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"prometheus never ready: {self.log.read_text()}")

    def query(self, expr: str) -> list[tuple[dict[str, str], float]]:
        q = urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(f"{self.url}/api/v1/query?{q}", timeout=30) as r:
            data = json.loads(r.read())
        assert data["status"] == "success", data
        return [(res["metric"], float(res["value"][1])) for res in data["data"]["result"]]

    def scalar(self, expr: str) -> float | None:
        res = self.query(expr)
        return res[0][1] if res else None

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(60)
        finally:
            if self.proc.poll() is None:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)


@pytest.mark.slow
@pytest.mark.zmq
def test_issue22_real_prometheus_scrapes_serve_and_equals_report(tmp_path: Path) -> None:
    """A real publisher (``kvtool replay --publish`` with two seqs dropped, recovered over
    its replay socket) feeds ``kvtool serve --record``; a real Prometheus scrapes it; every
    counter Prometheus holds, per kind, is ``kvtool report``'s on the recording."""
    prometheus_binary()
    rec = capture_recording(tmp_path, "gemma3")
    n = len(capture_messages("gemma3"))
    pub_ep = f"tcp://127.0.0.1:{free_port()}"
    rep_ep = f"tcp://127.0.0.1:{free_port()}"
    out = tmp_path / "kept.mcap"
    pub = subprocess.Popen(
        [
            sys.executable, "-m", "kvtool", "replay", str(rec), "--publish", pub_ep,
            "--replay-endpoint", rep_ep, "--drop", "5,17", "--wait-subscribers", "1",
            "--wait-timeout", "120", "--rate", "50", "--hold", "120",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    prom = None
    try:
        with serve_proc(
            tmp_path, pub_ep, "--replay-endpoint", rep_ep, "--record", str(out),
            "--interval", "200ms",
        ) as (proc, url):  # fmt: skip
            target = url.removeprefix("http://").removesuffix("/metrics")
            prom = Prometheus(tmp_path, target)
            prom.ready()
            deadline = time.monotonic() + DEADLINE_S
            while time.monotonic() < deadline:
                if prom.scalar("kvtool_batches_received_total") == n:
                    break
                time.sleep(0.2)
            assert prom.scalar("kvtool_batches_received_total") == n
            assert prom.scalar('up{job="kvtool"}') == 1
            got = {}
            for m in METRICS:
                if m.prom == "counter":
                    got[m] = dict(
                        (lab.get("kind", ""), v)
                        for lab, v in prom.query(f"sum by (kind) ({m.prom_name}_total)")
                    )
            health = {
                name: prom.scalar(name)
                for name in (
                    "kvtool_batches_recovered_total",
                    "kvtool_batches_lost_total",
                    "kvtool_publisher_restarts_total",
                    "kvtool_open_gaps",
                )
            }
        assert proc.returncode == 0, proc.stderr_text  # type: ignore[attr-defined]
    finally:
        if prom is not None:
            prom.stop()
        if pub.poll() is None:
            pub.send_signal(signal.SIGTERM)
        pub.wait(60)
    assert health == {
        "kvtool_batches_recovered_total": 2,
        "kvtool_batches_lost_total": 0,
        "kvtool_publisher_restarts_total": 0,
        "kvtool_open_gaps": 0,
    }
    rep = report_json(out)
    assert rep["source"]["batches"] == n
    compared = 0
    for m, by_kind in got.items():
        col = report_column(rep["totals"], m)
        if col is None:
            assert by_kind == {}  # not computed by the engine yet: not served
            continue
        assert by_kind == {r["kind"]: float(r[col]) for r in rep["by_kind"]}, m.name
        compared += 1
    assert compared >= 6


# -- the medium label (issue 22) ----------------------------------------------------------------


def two_media(msgs: list[tuple[bytes, int, bytes]]) -> tuple[list[tuple[bytes, int, bytes]], int]:
    """gemma3's real batches as a GPU tier with a CPU tier under it (vLLM's offloading).

    Every event says ``GPU``; every second batch's stores are offloaded -- the same
    hashes stored again as ``CPU`` -- and every third batch's removes drop the CPU copies
    of what they remove too. Returns the messages and the CPU blocks stored.
    """
    out = []
    offloaded: set[tuple[object, int]] = set()
    cpu_blocks = 0
    for b, (topic, seq, payload) in enumerate(msgs):
        ts, events, *rest = msgspec.msgpack.decode(payload)
        new = []
        for e in events:
            if e.get("type") == "AllBlocksCleared":
                offloaded.clear()
                new.append(e)
                continue
            e = {**e, "medium": "GPU"}
            new.append(e)
            key = e.get("group_idx")
            if e["type"] == "BlockStored" and b % 2 == 0 and e["block_hashes"]:
                new.append({**e, "medium": "CPU"})
                offloaded.update((key, h) for h in e["block_hashes"])
                cpu_blocks += len(e["block_hashes"])
            elif e["type"] == "BlockRemoved" and b % 3 == 0:
                gone = [h for h in e["block_hashes"] if (key, h) in offloaded]
                if gone:
                    new.append({**e, "block_hashes": gone, "medium": "CPU"})
                    offloaded.difference_update((key, h) for h in gone)
        out.append((topic, seq, msgspec.msgpack.encode([ts, new, *rest])))
    return out, cpu_blocks


def test_issue22_medium_rows_add_up_to_the_report_rows(tmp_path: Path) -> None:
    """The builder's rows by medium, summed over media, are ``kvtool report``'s rows."""
    from kvtool.report import ReportBuilder

    msgs, _cpu = two_media(capture_messages("gemma3"))
    path = tmp_path / "media.mcap"
    with RecordingWriter(path) as w:
        cid = w.add_channel("tcp://127.0.0.1:5557", "", None)
        for i, (_t, seq, payload) in enumerate(msgs):
            w.write(cid, seq, payload, 1_767_225_600_000_000_000 + i * 1_000_000)
    src = RecordingSource(str(path), speed=0)
    feed = ReportFeed(src.groups, whole_stream=False)  # as serve feeds it
    feed.add(src.take(0.0))
    (rb,) = feed.builders().values()
    assert isinstance(rb, ReportBuilder) and rb.by_medium
    by_medium = rb.tables()["by_group"]
    assert set(by_medium["medium"]) == {"GPU", "CPU"}
    import polars as pl

    from kvtool.report.registry import METRICS as _M

    sums = [m.name for m in _M if m.merge == "sum"] + ["live_blocks_end"]
    keys = ["group_idx", "kind", "sliding_window"]
    got = by_medium.group_by(keys).agg(pl.col(c).sum() for c in sums).sort(keys)
    rep = report_json(path)  # kvtool report's own rows
    want = pl.DataFrame(rep["by_group"]).select(*keys, *sums).sort(keys)
    assert got.to_dicts() == want.to_dicts()
    # The CPU copies are stored while their GPU block is live: the kernel's one state.
    cpu = by_medium.filter(pl.col("medium") == "CPU")
    assert cpu["stored_while_live"].sum() > 0


@pytest.mark.zmq
def test_issue22_serve_medium_label_on_a_live_two_tier_stream(tmp_path: Path) -> None:
    """A real publisher sends a GPU + CPU stream; /metrics has a ``medium`` label whose
    values sum to ``kvtool report`` of the recording of the same stream."""
    msgs, cpu_blocks = two_media(capture_messages("gemma3"))
    out = tmp_path / "kept.mcap"
    with Peer(msgs, subscribe_timeout=DEADLINE_S, rate=200) as peer:
        with serve_proc(
            tmp_path, peer.endpoint, "--replay-endpoint", str(peer.replay_endpoint),
            "--record", str(out), "--interval", "100ms",
        ) as (proc, url):  # fmt: skip
            samples = wait_for(url, "kvtool_batches_received_total", len(msgs))
        assert proc.returncode == 0, proc.stderr_text  # type: ignore[attr-defined]
    media = sum_by(samples, "kvtool_blocks_stored_total", "medium")
    assert set(media) == {"GPU", "CPU"}
    assert media["CPU"] == cpu_blocks
    rep = report_json(out)
    assert media["GPU"] + media["CPU"] == rep["totals"]["blocks_stored"]
    assert assert_equals_report(samples, rep) >= 6
    for lab, _v in samples["kvtool_live_blocks"]:
        assert set(lab) == {"endpoint", "rank", "group", "kind", "sliding_window", "medium"}


def test_issue22_warm_up_loads_the_kernels_before_the_stream() -> None:
    """serve loads the decoder's and the state kernel's compiled code before it subscribes,
    so the first batches of a burst do not wait for it (the lag of a max-speed publisher)."""
    code = (
        "from kvtool import scan\n"
        "from kvtool.report import kernel\n"
        "from kvtool.serve import warm_up\n"
        "assert not scan._scan.signatures and not kernel._advance_plain.signatures\n"
        "warm_up()\n"
        # The loop every block-16 stream runs (a partial or Mamba stream's loads on its
        # first such chunk).
        "print(len(scan._scan.signatures), len(kernel._advance_plain.signatures))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["1", "1"]


def test_issue22_tables_without_quantiles_are_the_same_but_those(tmp_path: Path) -> None:
    """serve's snapshot skips the percentile columns (it serves histograms of the samples):
    every other column is the full table's."""
    from kvtool.report.names import QUANTILE_COLUMNS

    path = capture_recording(tmp_path, "gemma3")
    src = RecordingSource(str(path), speed=0)
    feed = ReportFeed(src.groups, whole_stream=False)
    feed.add(src.take(0.0))
    (b,) = feed.builders().values()
    full, lean = b.tables(), b.tables(quantiles=False)
    for name, frame in full.items():
        assert lean[name].columns == frame.columns
        rest = [c for c in frame.columns if c not in QUANTILE_COLUMNS]
        assert lean[name].select(rest).equals(frame.select(rest)), name
        assert all(lean[name][c].null_count() == lean[name].height for c in QUANTILE_COLUMNS)
        assert any(frame[c].null_count() < frame.height for c in QUANTILE_COLUMNS)
