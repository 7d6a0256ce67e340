"""Issue 22: ``kvtool serve`` -- /metrics over real HTTP equals ``kvtool report`` on the same
stream (a recording played back, a live publisher with gap recovery, a real Prometheus)."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvtool.report.registry import METRICS
from kvtool.serve import EXPORTER_METRICS, RESIDENCY_BUCKETS, Exporter, LabelFolder
from kvtool.top import RecordingSource, ReportFeed
from tests.conftest import capture_messages
from tests.peer import Peer
from tests.replayutil import capture_recording

DEADLINE_S = 90.0
FULL_ONLY = Path(__file__).parent / "data" / "recordings" / "full_only-v1.mcap"
Samples = dict[str, list[tuple[dict[str, str], float]]]


def kvtool(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kvtool", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def report_json(path: Path) -> dict:
    proc = kvtool("report", "--format", "json", str(path))
    assert proc.returncode in (0, 3), proc.stderr
    return json.loads(proc.stdout)


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
        assert name in samples, name
        if m.name == "peak_live_blocks":
            # A peak is per series (rank x group): the by_group table's.
            got = {
                (lab["group"], lab["kind"], lab["sliding_window"]): v for lab, v in samples[name]
            }
            want = {
                (
                    str(r["group_idx"]) if r["group_idx"] is not None else "none",
                    r["kind"],
                    str(r["sliding_window"]) if r["sliding_window"] is not None else "none",
                ): float(r[col])
                for r in rep["by_group"]
            }
            assert got == want
            continue
        assert sum_by(samples, name, "kind") == {r["kind"]: float(r[col]) for r in rep["by_kind"]}
        assert sum(v for _, v in samples[name]) == float(rep["totals"][col]), name
        compared += m.prom == "counter"
    return compared


@contextmanager
def serve_proc(tmp_path: Path, *args: str) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """``kvtool serve ARGS --metrics 127.0.0.1:0`` in a real process; yields it and its URL.

    Stopped by its PID (SIGTERM) at the end.
    """
    err = tmp_path / f"serve-{time.monotonic_ns()}.err"
    with err.open("w") as errf:
        proc = subprocess.Popen(
            [sys.executable, "-m", "kvtool", "serve", *args, "--metrics", "127.0.0.1:0"],
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
            proc.send_signal(signal.SIGTERM)
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
    assert occ[1] == rep["totals"]["live_blocks_end"] / 1000


def exporter_of(path: Path, **options: object) -> Exporter:
    src = RecordingSource(str(path), speed=0)
    feed = ReportFeed(src.groups)
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


# -- a real Prometheus server scraping serve --------------------------------------------------
