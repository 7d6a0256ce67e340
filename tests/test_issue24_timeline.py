"""Issue 24: one duration on one clock, and the timeline on the ``--since`` clock.

- ``source.duration_s`` was the span of the batches' publish ``ts`` (0.063 s) where
  ``info`` says 3.150 s for the same file: it is now the receive-time span, as ``info``;
- the timeline was aligned to the wall clock (``--every 4s`` on 3.15 s gave two buckets,
  the first holding 0.289 s of data), had no cleared column, and its partial buckets
  counted as full ones: it now counts from the first message, says how many seconds of
  each bucket the data covers (``width_s``), and adds up (stored - removed - cleared).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import msgspec
import pytest
from typer.testing import CliRunner

from kvtool.cli import app
from kvtool.info import summarize
from kvtool.plot import _series
from kvtool.recording import RecordingWriter
from kvtool.report import build_report
from tests.conftest import capture_messages
from tests.test_annotation_core import removed, stored

REC = Path(__file__).resolve().parent.parent / "recordings"
GEMMA = REC / "gemma3.mcap"
runner = CliRunner()


def _report(*args: str) -> dict:
    result = runner.invoke(app, ["report", "--format", "json", "-q", *args])
    # 3: a recording that lost batches while recording (gemma3-gaps) is reported anyway.
    assert result.exit_code in (0, 3), result.output
    out: dict = json.loads(result.stdout)
    return out


def test_issue24_duration_is_the_receive_time_span_info_gives() -> None:
    """``source.duration_s`` is info's duration (3.150 s), not the publish-ts span (0.063 s)."""
    for path in sorted(REC.glob("*.mcap")):
        src = _report(str(path))["source"]
        assert src["duration_clock"] == "receive"
        assert src["duration_s"] == pytest.approx(summarize(path).duration_s, abs=1e-9), path
    assert _report(str(GEMMA))["source"]["duration_s"] == pytest.approx(3.150135539, abs=1e-9)


def test_issue24_duration_does_not_follow_the_timeline_clock() -> None:
    a = _report(str(GEMMA), "--every", "1s", "--clock", "publish")["source"]
    b = _report(str(GEMMA))["source"]
    assert a["duration_s"] == b["duration_s"]
    assert a["clock"] == "publish" and a["duration_clock"] == "receive"


def test_issue24_every_4s_on_a_3s_recording_is_one_bucket_from_the_first_message() -> None:
    """Aligned to the wall clock it was two buckets, the first holding 0.289 s of data."""
    rep = _report(str(GEMMA), "--every", "4s")
    tl = rep["timeline"]
    assert {r["time_s"] for r in tl} == {0.0}
    assert all(r["width_s"] == pytest.approx(3.150135539, abs=1e-9) for r in tl)
    by_kind = {r["kind"]: r for r in rep["by_kind"]}
    for r in tl:
        assert r["stores"] == by_kind[r["kind"]]["blocks_stored"]
    src = rep["source"]
    assert src["timeline_start_s"] == 0.0
    assert src["timeline_end_s"] == pytest.approx(src["duration_s"], abs=1e-9)


def test_issue24_partial_last_bucket_has_its_real_width() -> None:
    rep = _report(str(GEMMA), "--every", "1s")
    tl = rep["timeline"]
    assert sorted({r["time_s"] for r in tl}) == [0.0, 1.0, 2.0, 3.0]
    widths = {r["time_s"]: r["width_s"] for r in tl}
    assert [widths[t] for t in (0.0, 1.0, 2.0)] == [1.0, 1.0, 1.0]
    assert widths[3.0] == pytest.approx(0.150135539, abs=1e-9)
    assert sum(widths.values()) == pytest.approx(rep["source"]["duration_s"], abs=1e-9)


def test_issue24_timeline_buckets_are_the_since_clock() -> None:
    """Bucket [k, k+1) s holds exactly the blocks ``--since ks --until (k+1)s`` selects."""
    tl = _report(str(GEMMA), "--every", "1s")["timeline"]
    for k in range(4):
        sel = _report(str(GEMMA), "--since", f"{k}s", "--until", f"{k + 1}s")
        in_bucket = [r for r in tl if r["time_s"] == float(k)]
        assert sum(r["stores"] for r in in_bucket) == sel["totals"]["blocks_stored"]
        assert sum(r["removes"] for r in in_bucket) == sel["totals"]["blocks_removed"]


def test_issue24_selection_keeps_the_since_clock() -> None:
    """``--since 1.5s``: the timeline starts at 1 s, its first bucket covers 0.5 s of it."""
    rep = _report(str(GEMMA), "--since", "1.5s", "--every", "1s")
    tl = rep["timeline"]
    assert min(r["time_s"] for r in tl) == 1.0
    first = [r for r in tl if r["time_s"] == 1.0]
    assert all(r["width_s"] == pytest.approx(0.5, abs=0.01) for r in first)
    assert rep["source"]["timeline_start_s"] == pytest.approx(1.5, abs=0.01)


def test_issue24_timeline_cleared_column_adds_up() -> None:
    """stored - removed - cleared = the change of live blocks in every bucket (no orphans)."""
    rep = _report(str(GEMMA), "--every", "1s")
    assert rep["totals"]["orphan_removes"] == 0
    by_kind = {r["kind"]: r for r in rep["by_kind"]}
    for kind, row in by_kind.items():
        rows = sorted((r for r in rep["timeline"] if r["kind"] == kind), key=lambda r: r["time_s"])
        assert sum(r["cleared"] for r in rows) == row["blocks_cleared"] > 0
        level = 0
        for r in rows:
            level += r["stores"] - r["removes"] - r["cleared"]
            assert r["live_blocks"] == level
        assert level == row["live_blocks_end"]


def test_issue24_publish_clock_counts_from_the_first_batch_ts() -> None:
    rep = _report(str(GEMMA), "--every", "10ms", "--clock", "publish")
    src = rep["source"]
    assert src["clock"] == "publish"
    first_ts = msgspec.msgpack.decode(_first_payload(GEMMA))[0]
    assert src["timeline_origin_s"] == pytest.approx(first_ts, abs=1e-6)
    assert min(r["time_s"] for r in rep["timeline"]) == 0.0
    assert sum(r["stores"] for r in rep["timeline"]) == rep["totals"]["blocks_stored"]


def _first_payload(path: Path) -> bytes:
    from kvtool.recording import open_recording

    with open_recording(path) as r:
        return bytes(next(iter(r.messages())).data)


def _offset_fleet(tmp_path: Path) -> list[Path]:
    """Two ranks; rank 1 starts 0.37 s before rank 0 (no bucket edge in common)."""
    paths = []
    t0 = 1_764_000_000_123_456_789
    for rank, (name, start) in enumerate([("gemma3", 370_000_000), ("full_only", 0)]):
        p = tmp_path / f"rank{rank}.mcap"
        with RecordingWriter(p) as w:
            ch = w.add_channel(f"tcp://127.0.0.1:{5557 + rank}", "", rank)
            for i, (_topic, seq, payload) in enumerate(capture_messages(name)):
                w.write(ch, seq, payload, log_time=t0 + start + i * 7_000_000)
        paths.append(p)
    return paths


@pytest.mark.parametrize("clock", ["receive", "publish"])
def test_issue24_timeline_merges_exactly_across_jobs(tmp_path: Path, clock: str) -> None:
    """Units of work bucket from the input's origin: ``--jobs 2`` gives the same timeline."""
    paths = _offset_fleet(tmp_path)
    one = build_report(paths, every_ns=100_000_000, clock=clock).to_dict()
    two = build_report(paths, every_ns=100_000_000, clock=clock, jobs=2).to_dict()
    one.pop("findings", None)
    two.pop("findings", None)
    assert two == one
    if clock == "receive":
        assert one["source"]["timeline_start_s"] == 0.0
        assert min(r["time_s"] for r in one["timeline"]) == 0.0  # type: ignore[union-attr]


def test_issue24_plot_series_start_at_zero_and_end_with_the_partial_bucket() -> None:
    """The plot's x axis: from 0 at the first message; the last bucket to its real end."""
    live_x, live_y, rate_x, rate_y = _series(
        [0.0, 1.0, 2.0, 3.0], [1.0, 1.0, 1.0, 0.15], [40, 44, 42, 48], [30, 95, 76, 15], 0.0
    )
    assert live_x == pytest.approx([0.0, 1.0, 2.0, 3.0, 3.15])
    assert live_y == [0.0, 40.0, 44.0, 42.0, 48.0]
    assert rate_x[0] == 0.0 and rate_x[-1] == pytest.approx(3.15)
    # The partial bucket's rate divides by the 0.15 s it covers, not by 1 s.
    assert rate_y[-1] == pytest.approx(100.0)
    assert rate_y[:2] == [30.0, 30.0]
    # A bucket of no width has no rate; buckets that do not touch are not joined.
    _lx, _ly, rx, ry = _series([0.0, 5.0], [1.0, 0.0], [1, 1], [3, 2], 0.0)
    assert math.isnan(rx[2]) and math.isnan(ry[-1])


def test_issue24_plot_draws(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "t.png"
    result = runner.invoke(app, ["report", str(GEMMA), "--every", "1s", "--plot", str(out)])
    assert result.exit_code == 0, result.output
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


ENC = msgspec.msgpack.Encoder()


def _write(path: Path, batches: list[tuple[int, float, list[dict]]]) -> Path:
    with RecordingWriter(path) as w:
        ch = w.add_channel("tcp://127.0.0.1:5557", "", None)
        for seq, (log_time, ts, events) in enumerate(batches):
            w.write(ch, seq, ENC.encode([ts, events, None]), log_time=log_time)
    return path


def test_issue24_publish_origin_without_a_wall_clock_ts_is_the_receive_time(
    tmp_path: Path,
) -> None:
    """Batches whose ``ts`` is no wall-clock time sit at their receive time: bucket 0 on."""
    for k, offset in enumerate(range(0, 1000, 111)):
        t0 = 1_764_000_000_000_000_000 + offset
        path = _write(
            tmp_path / f"r{k}.mcap",
            [(t0 + i * 1_000_000, 0.0, [stored([10 + i], None)]) for i in range(3)],
        )
        rep = build_report([path], every_ns=1_000_000, clock="publish").to_dict()
        tl = rep["timeline"]
        # The first batch is at 0, never in a bucket before it (float seconds place the
        # others within a microsecond of their receive time: a bucket edge may move them).
        assert tl[0]["time_s"] == 0.0 and tl[0]["stores"] == 1, offset  # type: ignore[index]
        assert sum(r["stores"] for r in tl) == 3  # type: ignore[union-attr]


def test_issue24_first_message_without_rows_starts_the_clock(tmp_path: Path) -> None:
    """An empty first batch is the first message: time zero and the duration start there."""
    t0 = 1_764_000_000_000_000_000
    path = _write(
        tmp_path / "r.mcap",
        [
            (t0, t0 / 1e9, []),
            (t0 + 1_500_000_000, t0 / 1e9 + 1.5, [stored([1, 2], None)]),
            (t0 + 2_250_000_000, t0 / 1e9 + 2.25, [removed([1], None)]),
        ],
    )
    assert summarize(path).duration_s == 2.25
    rep = build_report([path], every_ns=1_000_000_000).to_dict()
    src = rep["source"]
    assert src["duration_s"] == 2.25  # type: ignore[index]
    tl = rep["timeline"]
    assert [(r["time_s"], r["width_s"]) for r in tl] == [(0.0, 1.0), (1.0, 1.0), (2.0, 0.25)]  # type: ignore[index]
    assert [(r["stores"], r["removes"], r["live_blocks"]) for r in tl] == [  # type: ignore[index]
        (0, 0, 0),
        (2, 0, 2),
        (0, 1, 1),
    ]
