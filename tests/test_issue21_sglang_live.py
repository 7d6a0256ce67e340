"""Issue 21 review: ``top`` and ``serve`` take ``--group-meta`` into the live annotation.

Without it a live SGLang stream (no ``group_idx``, kind or window on the wire) was always
``unannotated`` in ``top`` and on ``/metrics``. The shared option (one definition, as
``report`` and ``replay`` have it) now reaches the live feed. A real publisher sends SGLang
0.5.23's captured bytes over ZeroMQ on loopback; ``serve`` is scraped over real HTTP on
127.0.0.1; ``top --once`` prints its plain blocks to a file. Both processes are stopped by
their PID.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import capture_messages
from tests.peer import Peer
from tests.recutil import write_capture
from tests.test_serve import DEADLINE_S, serve_proc, sum_by, value, wait_for
from tests.test_top import kvtool

FLAG = "none=full_attention"


def report_json(path: Path, *args: str) -> dict:
    proc = kvtool("report", "--format", "json", str(path), *args)
    assert proc.returncode == 0, proc.stderr
    out: dict = json.loads(proc.stdout)
    return out


@pytest.mark.zmq
def test_issue21_serve_live_sglang_takes_group_meta(tmp_path: Path) -> None:
    msgs = capture_messages("sglang_full")
    rec = tmp_path / "sglang_full.mcap"
    write_capture(rec, "sglang_full")
    rep = report_json(rec, "--group-meta", FLAG)
    with Peer(msgs, subscribe_timeout=DEADLINE_S, rate=200) as peer:
        assert peer.replay_endpoint is not None
        with serve_proc(
            tmp_path, peer.endpoint, "--replay-endpoint", peer.replay_endpoint,
            "--interval", "100ms", "--group-meta", FLAG,
        ) as (proc, url):  # fmt: skip
            samples = wait_for(url, "kvtool_batches_received_total", len(msgs))
        assert proc.returncode == 0, proc.stderr_text  # type: ignore[attr-defined]
    stored = sum_by(samples, "kvtool_blocks_stored_total", "kind")
    removed = sum_by(samples, "kvtool_blocks_removed_total", "kind")
    assert set(stored) == {"full_attention"}
    assert set(removed) == {"full_attention"}
    (row,) = rep["by_kind"]
    assert row["kind"] == "full_attention"
    assert stored["full_attention"] == row["blocks_stored"]
    assert removed["full_attention"] == row["blocks_removed"]
    assert value(samples, "kvtool_batches_lost_total") == 0


@pytest.mark.zmq
def test_issue21_serve_live_none_flag_keeps_learning_groups(tmp_path: Path) -> None:
    """Only ``none=KIND`` given: a grouped vLLM stream's groups are still learned live."""
    msgs = capture_messages("gemma3")
    rec = tmp_path / "gemma3.mcap"
    write_capture(rec, "gemma3")
    rep = report_json(rec, "--group-meta", "none=mamba")
    with Peer(msgs, subscribe_timeout=DEADLINE_S, rate=200) as peer:
        with serve_proc(
            tmp_path, peer.endpoint, "--interval", "100ms", "--group-meta", "none=mamba"
        ) as (proc, url):
            samples = wait_for(url, "kvtool_batches_received_total", len(msgs))
        assert proc.returncode == 0, proc.stderr_text  # type: ignore[attr-defined]
    removed = sum_by(samples, "kvtool_blocks_removed_total", "kind")
    assert "unannotated" not in removed
    assert removed == {r["kind"]: float(r["blocks_removed"]) for r in rep["by_kind"]}


def _kind_rows(text: str) -> set[str]:
    """The row names of the last complete ``kind`` table in top's plain output."""
    blocks = text.split("kvtool top")
    for block in reversed(blocks):
        lines = block.splitlines()
        heads = [i for i, line in enumerate(lines) if line.startswith("kind ")]
        if heads:
            return {line.split()[0] for line in lines[heads[0] + 1 :] if line.strip()}
    return set()


@pytest.mark.zmq
def test_issue21_top_metrics_live_sglang_takes_group_meta(tmp_path: Path) -> None:
    """``top --metrics`` serves the live stream's numbers under the given kind too."""
    msgs = capture_messages("sglang_full")
    with Peer(msgs, subscribe_timeout=DEADLINE_S, rate=200) as peer, serve_proc(
        tmp_path, peer.endpoint, "--once", "--interval", "100ms", "--duration", "120s",
        "--group-meta", FLAG, command="top", stop=signal.SIGINT,
    ) as (proc, url):  # fmt: skip
        samples = wait_for(url, "kvtool_batches_received_total", len(msgs))
    assert proc.returncode == 130  # top ends on Ctrl-C with 130
    assert set(sum_by(samples, "kvtool_blocks_stored_total", "kind")) == {"full_attention"}


@pytest.mark.zmq
def test_issue21_top_once_live_sglang_prints_the_kind(tmp_path: Path) -> None:
    """``top --once`` on the live stream: its plain block's rows are the given kind."""
    msgs = capture_messages("sglang_full")
    out = tmp_path / "top.out"
    err = tmp_path / "top.err"
    with Peer(msgs, subscribe_timeout=DEADLINE_S, rate=200) as peer:
        with out.open("w") as outf, err.open("w") as errf:
            proc = subprocess.Popen(
                [
                    sys.executable, "-m", "kvtool", "top", peer.endpoint, "--once",
                    "--interval", "100ms", "--duration", "120s", "--group-meta", FLAG,
                ],
                stdout=outf,
                stderr=errf,
                text=True,
            )  # fmt: skip
        try:
            deadline = time.monotonic() + DEADLINE_S
            rows: set[str] = set()
            # Until a block shows every batch (the header counts them), within a deadline.
            while time.monotonic() < deadline and proc.poll() is None:
                text = out.read_text()
                if f"batches {len(msgs)} " in text.split("kvtool top")[-1]:
                    rows = _kind_rows(text)
                    if rows:
                        break
                time.sleep(0.05)
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
            try:
                proc.wait(60)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(10)
    assert rows == {"full_attention"}, out.read_text() + err.read_text()


def test_issue21_top_recording_takes_group_meta(tmp_path: Path) -> None:
    rec = tmp_path / "sglang_swa.mcap"
    write_capture(rec, "sglang_swa")
    proc = kvtool("top", str(rec), "--once", "--speed", "0", "--group-meta", FLAG)
    assert proc.returncode == 0, proc.stderr
    assert _kind_rows(proc.stdout) == {"full_attention"}
    plain = kvtool("top", str(rec), "--once", "--speed", "0")
    assert _kind_rows(plain.stdout) == {"unannotated"}
