"""``kvtool top``: the report adapter, ``--once`` on recordings, and the full screen under tmux."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvtool.endpoints import expand_endpoints
from kvtool.recording import RecordingWriter, open_recording
from kvtool.top import LiveSource, RecordingSource, ReportFeed
from tests.conftest import capture_messages
from tests.replayutil import capture_recording
from tests.test_live_faults import free_port
from tests.tmuxutil import Tmux, needs_tmux

DATA = Path(__file__).parent / "data"
FULL_ONLY = DATA / "recordings" / "full_only-v1.mcap"
DEADLINE_S = 90.0


def kvtool(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run kvtool in a real process."""
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


def feed_all(path: Path, parts: int = 1) -> tuple[ReportFeed, list[dict]]:
    """Feed a recording through the adapter in ``parts`` slices, snapshotting after each."""
    src = RecordingSource(str(path), speed=0)
    feed = ReportFeed(src.groups)
    msgs = src.take(0.0)
    snaps = []
    step = max(1, -(-len(msgs) // parts))
    for i in range(0, len(msgs), step):
        feed.add(msgs[i : i + step])
        snaps.append(feed.snapshot())
    return feed, snaps


# -- the adapter: the report's own numbers ------------------------------------------------


@pytest.mark.parametrize("name", ["gemma3", "full_only"])
def test_feed_snapshot_equals_report(tmp_path: Path, name: str) -> None:
    path = capture_recording(tmp_path, name)
    rep = report_json(path)
    _, snaps = feed_all(path)
    final = json.loads(json.dumps(snaps[-1]))
    assert final["kind"] == rep["by_kind"]
    assert final["window"] == rep["by_window"]
    assert final["group"] == rep["by_group"]


def test_feed_snapshots_mid_stream_change_nothing(tmp_path: Path) -> None:
    # ReportBuilder.tables() is called every interval while the stream goes on: it must
    # not disturb the state (the last snapshot equals one report of all the events).
    path = capture_recording(tmp_path, "gemma3")
    _, once = feed_all(path)
    _, often = feed_all(path, parts=9)
    assert len(often) >= 8
    assert often[-1] == once[-1]
    assert often[0]["kind"] != once[-1]["kind"]  # the early snapshots are partial


def test_feed_per_rank_rows_are_each_ranks_report(tmp_path: Path) -> None:
    # Rank 0: gemma3 (its payloads say rank 0); rank 1: a capture whose payloads carry no
    # rank, so its channel's dp_rank counts.
    a = capture_messages("gemma3")
    b = capture_messages("full_only.legacy-array-initial.signed")
    both = tmp_path / "two_ranks.mcap"
    with RecordingWriter(both) as w:
        c0 = w.add_channel("tcp://127.0.0.1:5557", "", 0)
        c1 = w.add_channel("tcp://127.0.0.1:5558", "", 1)
        t = 1_764_000_000_000_000_000
        for i, (_tp, seq, payload) in enumerate(a):
            w.write(c0, seq, payload, t + i * 1_000_000)
        for i, (_tp, seq, payload) in enumerate(b):
            w.write(c1, seq, payload, t + (len(a) + i) * 1_000_000)
    alone = {
        0: report_json(capture_recording(tmp_path, "gemma3"))["by_kind"],
        1: report_json(capture_recording(tmp_path, "full_only.legacy-array-initial.signed"))[
            "by_kind"
        ],
    }
    _, snaps = feed_all(both, parts=3)
    rows = json.loads(json.dumps(snaps[-1]["rank"]))
    for rank, expected in alone.items():
        got = [{k: v for k, v in r.items() if k != "dp_rank"} for r in rows if r["dp_rank"] == rank]
        assert got == expected
    assert snaps[-1]["kind"] == json.loads(json.dumps(report_json(both)["by_kind"]))


# -- --once on a recording ----------------------------------------------------------------

FULL_ONLY_ONCE = """\
kvtool top  {path}
t=0.2s  publishers 1/1  batches 19 (100.0/s)  last batch 0.0s ago
gaps: recovered 1  lost 1  restarts 0  ended
kind              live    peak store/s evict/s recomp/s  orphan   p50 s
full_attention      41      44     568     121      153       0   0.006
"""


def test_once_on_recording_prints_the_final_block_exactly() -> None:
    proc = kvtool("top", str(FULL_ONLY), "--once", "--speed", "0")
    # The recording's ledger lists a batch lost while recording: one line and exit 3, as
    # `report` says of the same file (issue 24; was exit 0 and nothing said).
    assert proc.returncode == 3, proc.stderr
    assert proc.stdout == FULL_ONLY_ONCE.format(path=FULL_ONLY)
    assert proc.stderr == (
        f"kvtool: {FULL_ONLY}: 1 batch was lost while recording (seq 8); counts miss their events\n"
    )


def _block_rows(block: str, header: str) -> dict[str, list[str]]:
    lines = block.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header + " "))
    return {line.split()[0]: line.split()[1:] for line in lines[start + 1 :]}


def test_once_numbers_equal_report(tmp_path: Path) -> None:
    path = capture_recording(tmp_path, "gemma3")
    rep = report_json(path)
    proc = kvtool("top", str(path), "--once", "--speed", "0")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("kvtool top") == 1  # one block: the final one
    rows = _block_rows(proc.stdout, "kind")
    assert set(rows) == {r["kind"] for r in rep["by_kind"]}
    for r in rep["by_kind"]:
        live, peak, _s, _e, _r, orphans, _p50 = rows[r["kind"]]
        assert int(live.replace(",", "")) == r["live_blocks_end"]
        assert int(peak.replace(",", "")) == r["peak_live_blocks"]
        assert int(orphans.replace(",", "")) == r["orphan_removes"]


def test_once_plays_a_recording_in_time_lapse(tmp_path: Path) -> None:
    # 64 batches 50 ms apart (3.15 s) at speed 1 with 500 ms blocks: several blocks, the
    # last one marked ended and equal to the report. (At speed 2 the 1.6 s of play left one
    # block only when the first tick's kernel loading took that long: seen once in CI at load 9.)
    path = capture_recording(tmp_path, "gemma3", step_ns=50_000_000)
    rep = report_json(path)
    proc = kvtool(
        "top", str(path), "--once", "--speed", "1", "--interval", "500ms", "--view", "window"
    )
    assert proc.returncode == 0, proc.stderr
    blocks = proc.stdout.split("\n\n")
    assert len(blocks) >= 2
    assert "ended" in blocks[-1] and all("ended" not in b for b in blocks[:-1])
    rows = _block_rows(blocks[-1], "window")
    live = {w["sliding_window"]: w["live_blocks_end"] for w in rep["by_window"]}
    assert int(rows["no"][1]) == live[None]  # "no window"
    assert int(rows["window"][1]) == live[64]  # "window 64"


def test_once_fits_80_columns(tmp_path: Path) -> None:
    path = capture_recording(tmp_path, "gemma3")
    for view in ("kind", "window", "group", "rank"):
        proc = kvtool("top", str(path), "--once", "--speed", "0", "--view", view)
        assert proc.returncode == 0, proc.stderr
        assert max(len(line) for line in proc.stdout.splitlines()[1:]) <= 80, proc.stdout
        assert "…" not in proc.stdout


def test_top_recording_options_for_live_only_are_usage_errors() -> None:
    proc = kvtool("top", str(FULL_ONLY), "--record", "x.mcap")
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "kvtool: top FILE.mcap: --record is for live endpoints, not a recording"
    )


def test_top_missing_recording_is_one_line() -> None:
    proc = kvtool("top", "no/such/file.mcap", "--once")
    assert proc.returncode != 0
    assert len(proc.stderr.strip().splitlines()) == 1
    assert "Traceback" not in proc.stderr


# -- live: the recorder's own gap recovery and --record ------------------------------------


@pytest.fixture
def publisher(tmp_path: Path) -> Iterator[tuple[str, Path, subprocess.Popen[bytes]]]:
    """``kvtool replay --publish`` of the gemma3 recording at 20 batches/s, one subscriber."""
    rec = capture_recording(tmp_path, "gemma3")
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kvtool",
            "replay",
            str(rec),
            "--publish",
            endpoint,
            "--wait-subscribers",
            "1",
            "--wait-timeout",
            "120",
            "--rate",
            "20",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield endpoint, rec, proc
    finally:
        if proc.poll() is None:
            proc.terminate()
        proc.wait(30)


@pytest.mark.zmq
def test_live_source_feeds_report_and_records(
    tmp_path: Path, publisher: tuple[str, Path, subprocess.Popen[bytes]]
) -> None:
    endpoint, rec, pub = publisher
    out = tmp_path / "watched.mcap"
    src = LiveSource(expand_endpoints([endpoint]), record=str(out))
    feed = ReportFeed()
    src.start(time.monotonic())
    deadline = time.monotonic() + DEADLINE_S
    try:
        while src.health().batches < 64 and time.monotonic() < deadline:
            feed.add(src.take(time.monotonic()))
            time.sleep(0.05)
    finally:
        src.stop()
    feed.add(src.take(time.monotonic()))
    health = src.health()
    assert health.batches == 64 and health.lost == 0 and health.done
    snap = json.loads(json.dumps(feed.snapshot()))
    assert snap["kind"] == report_json(rec)["by_kind"]
    # --record writes the same stream as `record` would.
    with open_recording(out) as r:
        assert [m.seq for m in r.messages()] == list(range(64))
    assert report_json(out)["by_kind"] == snap["kind"]
    assert pub.wait(60) == 0


# -- the full screen in a real pseudo-terminal ----------------------------------------------


def _screen_rows(screen: str, header: str) -> dict[str, list[str]]:
    lines = screen.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header + " "))
    rows = {}
    for line in lines[start + 1 :]:
        if not line.strip():
            break
        parts = line.split()
        rows[parts[0] if header != "group" else f"{parts[0]} {parts[1]}"] = (
            parts[1:] if header != "group" else parts[2:]
        )
    return rows


def _top_command(endpoint: str) -> str:
    # After kvtool exits: its status, and whether the terminal is back in canonical mode.
    return (
        f"{shlex.quote(sys.executable)} -m kvtool top {endpoint}; echo EXIT=$?; "
        "stty -a | grep -o -- '-\\?icanon' | sed 's/^/STTY=/'; sleep 120"
    )


@needs_tmux
@pytest.mark.zmq
def test_issue12_top_screen_under_tmux_equals_report_and_quits_on_q(
    publisher: tuple[str, Path, subprocess.Popen[bytes]],
) -> None:
    endpoint, rec, pub = publisher
    by_kind = {r["kind"]: r for r in report_json(rec)["by_kind"]}
    by_group = {
        f"{r['group_idx']} {r['kind']}"
        + ("" if r["sliding_window"] is None else f":{r['sliding_window']}"): r
        for r in report_json(rec)["by_group"]
    }
    tmux = Tmux(_top_command(endpoint))
    try:
        # Once the publisher is done all 64 seqs are in; the next refresh shows them.
        screen = tmux.wait_for(r"batches 64 .*\n(.*\n)*full_attention .*\n")
        assert pub.wait(DEADLINE_S) == 0
        screen = tmux.wait_for(r"batches 64 .*\n(.*\n)*full_attention .*\n")
        assert max(len(line) for line in screen.splitlines()) <= 80
        assert "…" not in screen
        assert "lost 0" in screen
        rows = _screen_rows(screen, "kind")
        assert set(rows) == set(by_kind)
        for kind, r in by_kind.items():
            assert int(rows[kind][0].replace(",", "")) == r["live_blocks_end"]
            assert int(rows[kind][1].replace(",", "")) == r["peak_live_blocks"]
            assert int(rows[kind][5].replace(",", "")) == r["orphan_removes"]
        tmux.keys("g")
        screen = tmux.wait_for(r"^group ")
        rows = _screen_rows(screen, "group")
        assert set(rows) == set(by_group)
        for key, r in by_group.items():
            assert int(rows[key][0].replace(",", "")) == r["live_blocks_end"]
        tmux.keys("q")
        screen = tmux.wait_for(r"^STTY=")
        assert "EXIT=0" in screen
        assert "STTY=icanon" in screen  # the terminal is restored
        # The final numbers stay on the normal screen after the alternate one is gone.
        assert re.search(
            r"^0 full_attention +" + str(by_group["0 full_attention"]["live_blocks_end"]) + " ",
            screen,
            re.MULTILINE,
        )
    finally:
        tmux.kill()


@needs_tmux
@pytest.mark.zmq
def test_issue12_top_ctrl_c_exits_130_and_restores_the_terminal() -> None:
    endpoint = f"tcp://127.0.0.1:{free_port()}"  # nobody publishes: waiting
    tmux = Tmux(_top_command(endpoint))
    try:
        tmux.wait_for(r"publishers 0/1  batches 0 ")
        tmux.keys("p")
        tmux.wait_for(r"PAUSED")
        tmux.keys("C-c")
        screen = tmux.wait_for(r"^STTY=")
        assert "EXIT=130" in screen
        assert "STTY=icanon" in screen
        assert "kvtool: interrupted" in screen
        assert "Traceback" not in screen
    finally:
        tmux.kill()


def test_once_with_groups_file_equals_report_with_it(tmp_path: Path) -> None:
    # Stripped payloads carry no kind: the --groups file names them, as for report.
    path = capture_recording(tmp_path, "gemma3", strip=True)
    groups = str(DATA / "groups" / "gemma3.json")
    proc = kvtool("report", "--format", "json", "--groups", groups, str(path))
    rep = json.loads(proc.stdout)
    assert {r["kind"] for r in rep["by_kind"]} == {"full_attention", "sliding_window"}
    proc = kvtool("top", str(path), "--once", "--speed", "0", "--groups", groups)
    assert proc.returncode == 0, proc.stderr
    rows = _block_rows(proc.stdout, "kind")
    assert {k: int(v[0]) for k, v in rows.items()} == {
        r["kind"]: r["live_blocks_end"] for r in rep["by_kind"]
    }
