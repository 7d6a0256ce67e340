"""Issue 23: limits said up front -- --dp-size past what one process holds, extreme --speed,
far-future receive times."""

from __future__ import annotations

import resource
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from kvtool.endpoints import expand_endpoints, socket_budget, sockets_needed
from kvtool.errors import EndpointError, UsageError
from kvtool.pacing import Pacing, PublishItem, publish
from kvtool.publish import Publisher
from tests.replayutil import capture_recording
from tests.test_live_faults import ROOT, free_port

YEAR_NS = 365 * 24 * 3600 * 10**9


def _kvtool(*args: str, nofile: int | None = None) -> subprocess.CompletedProcess[str]:
    def limit() -> None:
        if nofile is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

    return subprocess.run(
        [sys.executable, "-m", "kvtool", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        preexec_fn=limit,
    )


def test_issue23_dp_size_past_the_process_limit_is_refused_with_the_limit() -> None:
    """More ranks than one process can hold: refused before any socket, naming the limit."""
    n = socket_budget() // 4 + 1
    with pytest.raises(EndpointError) as info:
        expand_endpoints(["tcp://127.0.0.1:20000"], replay=["tcp://127.0.0.1:1000"], dp_size=n)
    msg = str(info.value)
    assert f"--dp-size {n:,}" in msg or f"--dp-size {n}" in msg
    assert "ZeroMQ sockets" in msg and "at most" in msg
    assert sockets_needed(256, True) == 1024


def test_issue23_dp_size_256_under_ulimit_1024_is_one_line_exit_2(tmp_path: Path) -> None:
    """`record --dp-size 256 --replay-endpoint` with 1,024 open files: one line, exit 2,
    no file. Before: 'internal error: ZMQError', and an empty 'complete' recording."""
    out = tmp_path / "dp.mcap"
    proc = _kvtool(
        *("record", "tcp://127.0.0.1:21000", "--replay-endpoint", "tcp://127.0.0.1:41000"),
        *("--dp-size", "256", "-o", str(out), "--duration", "1s"),
        nofile=1024,
    )
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert "needs 1,024 ZeroMQ sockets" in line and "at most 120 ranks" in line
    assert not out.exists()


@pytest.mark.zmq
def test_issue23_dp_size_256_with_replay_is_served_past_zeromqs_1023(tmp_path: Path) -> None:
    """Within the open-files limit, 256 ranks with replay (1,024 sockets, past ZeroMQ's
    default 1,023 per context) run: nobody publishes, so exit 1 with the no-batch line.
    Before: 'internal error: ZMQError'."""
    if socket_budget() < 1100:
        pytest.skip("the open-files limit is too low here")
    base = free_port()
    proc = _kvtool(
        *(
            "record",
            f"tcp://127.0.0.1:{base}",
            "--replay-endpoint",
            f"tcp://127.0.0.1:{base + 300}",
        ),
        *("--dp-size", "256", "-o", str(tmp_path / "dp.mcap"), "--duration", "1s", "-q"),
        *("--connect-timeout", "0"),
    )
    assert proc.returncode == 1, proc.stderr
    assert "ZMQError" not in proc.stderr and "internal error" not in proc.stderr
    assert "no batch received" in proc.stderr


@pytest.mark.parametrize("speed", [float("inf"), 1e308, 1e-300, float("nan")])
def test_issue23_extreme_publish_speed_is_refused(speed: float) -> None:
    """--publish --speed inf/1e308/1e-300 used to raise OverflowError mid-run."""
    with pytest.raises(UsageError, match="--speed"):
        Pacing(speed=speed)
    with pytest.raises(UsageError, match="--rate"):
        Pacing(rate=speed)


def test_issue23_replay_publish_speed_inf_is_one_line(tmp_path: Path) -> None:
    rec = capture_recording(tmp_path, "gemma3")
    ep = f"tcp://127.0.0.1:{free_port()}"
    proc = _kvtool("replay", str(rec), "--publish", ep, "--speed", "inf")
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert "--speed inf" in line and "Traceback" not in proc.stderr


@pytest.mark.parametrize("speed", ["inf", "1e308"])
def test_issue23_top_speed_inf_plays_everything_at_once(tmp_path: Path, speed: str) -> None:
    """`top FILE --speed inf` is `--speed 0`. Before: OverflowError."""
    rec = capture_recording(tmp_path, "gemma3")
    proc = _kvtool("top", str(rec), "--once", "--speed", speed)
    ref = _kvtool("top", str(rec), "--once", "--speed", "0")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ref.stdout and "batches 64" in proc.stdout


def test_issue23_publish_pacing_clamps_a_30_year_gap() -> None:
    """A batch 30 years ahead is paced as a 10 s gap (here at --speed 1000: 10 ms).
    Before: the publisher waited for it (11 days at that speed)."""
    t = 10**18
    items = [
        PublishItem("c", b"", 0, b"a", t),
        PublishItem("c", b"", 1, b"b", t + 30 * YEAR_NS),
        PublishItem("c", b"", 2, b"c", t + 30 * YEAR_NS + 1),
    ]
    done: list[int] = []
    with Publisher(f"tcp://127.0.0.1:{free_port()}") as pub:

        def run() -> None:
            done.append(publish(pub, lambda: items, pacing=Pacing(speed=1000)).sent)

        th = threading.Thread(target=run, daemon=True)
        th.start()
        th.join(60)
    assert done == [3]
