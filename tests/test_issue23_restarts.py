"""Issue 23 item 6: a publisher restart (a channel's seq going backwards) starts its state afresh.

Before: the engine's cache after a restart is new, but the report carried the old live
blocks over: stores of the same hashes were counted as stored while live and recomputed,
and removes paired with the old copies (negative lifetimes, blamed on the clock).
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from kvtool.recording import RecordingWriter
from kvtool.report import build_report
from kvtool.top import RecordingSource, ReportFeed
from tests.test_report import record_capture, removed, stored

ENC = msgspec.msgpack.Encoder()
T0 = 1_700_000_000.0
G = {"group": 0, "kind": "full_attention", "window": None}

# (seq, publisher ts, events): the publisher restarts after seq 2 (its clock is set back).
BEFORE = [
    (0, T0 + 10, [stored([1, 2, 3], **G)]),
    (1, T0 + 11, [removed([1], group=0)]),
    (2, T0 + 12, [stored([4], **G)]),
]
AFTER = [
    (0, T0 + 1, [stored([1, 2, 3], **G)]),
    (1, T0 + 2, [removed([2], group=0)]),
    (2, T0 + 3, [stored([6], **G)]),
]


def _record(path: Path, batches: list[tuple[int, float, list[dict[str, object]]]]) -> Path:
    with RecordingWriter(path) as w:
        ch = w.add_channel("tcp://127.0.0.1:5557", "", 0)
        for i, (seq, ts, events) in enumerate(batches):
            w.write(ch, seq, ENC.encode([ts, events, 0]), log_time=int((T0 + 100 + i) * 1e9))
    return path


def _restarted(tmp_path: Path) -> Path:
    return _record(tmp_path / "restart.mcap", BEFORE + AFTER)


def _totals(path: Path, **kw: object) -> dict[str, object]:
    rep = build_report([path], **kw)  # type: ignore[arg-type]
    out: dict[str, object] = rep.totals.to_dicts()[0]
    return out


def test_issue23_restart_starts_the_channel_afresh(tmp_path: Path) -> None:
    """Numbers of the restarted stream: no false stored_while_live or recompute, no
    negative lifetime, the old live blocks dropped (as blocks_cleared), only the new ones
    live at the end. Before: 2 stored while live, 1 recomputed, a negative lifetime and
    6 live blocks at the end."""
    rep = build_report([_restarted(tmp_path)])
    t = rep.totals.to_dicts()[0]
    assert t["blocks_stored"] == 8 and t["blocks_removed"] == 2
    assert t["stored_while_live"] == 0 and t["blocks_recomputed"] == 0
    assert t["orphan_removes"] == 0
    assert t["blocks_cleared"] == 3  # 2, 3 and 4, live at the restart
    assert t["live_blocks_end"] == 3  # 1, 3 and 6 of the new engine
    assert t["blocks_stored"] - t["blocks_removed"] - t["blocks_cleared"] == t["live_blocks_end"]
    assert t["peak_live_blocks"] == 3
    assert not any("negative" in f for f in rep.findings), rep.findings
    (line,) = [f for f in rep.findings if "restart" in f]
    assert line.startswith("1 publisher restart on ") and "(3 blocks dropped" in line
    # Each stream's lifetimes are its own: 1 s each (store at +10, remove at +11; +1, +2).
    assert t["lifetime_p50_s"] == 1.0 and t["lifetime_p99_s"] == 1.0


def test_issue23_restart_across_chunks_and_jobs_is_the_same(tmp_path: Path) -> None:
    """A restart in a later chunk than the seqs before it, and with --jobs 2 (two streams:
    units of work), gives the numbers of one chunk in one process."""
    rec = _restarted(tmp_path)
    one = _totals(rec)
    assert _totals(rec, chunk_bytes=1) == one
    # One stream with --jobs 2: decoded by two processes, its state kept in this one.
    assert _totals(rec, chunk_bytes=1, jobs=2) == one
    # Two files of one stream each: a unit of work each (--jobs 2), merged exactly.
    other = record_capture("gemma3", tmp_path / "g.mcap", endpoint="tcp://127.0.0.1:5558")
    both = build_report([rec, other])
    par = build_report([rec, other], jobs=2, chunk_bytes=2000)
    assert par.totals.equals(both.totals) and par.by_group.equals(both.by_group)
    assert [f for f in par.findings if "restart" in f] == [
        f for f in both.findings if "restart" in f
    ]
    assert (
        both.totals["stored_while_live"][0] == build_report([other]).totals["stored_while_live"][0]
    )


def test_issue23_top_once_on_a_restart_equals_report(tmp_path: Path) -> None:
    """``top --once --speed 0`` (ReportFeed over the played recording) shows the report's rows."""
    rec = _restarted(tmp_path)
    src = RecordingSource(str(rec), speed=0)
    src.start(0.0)
    feed = ReportFeed(src.groups)
    while not src.done:
        feed.add(src.take(0.0))
    snap = feed.snapshot()
    rep = build_report([rec])
    assert snap["kind"] == rep.by_kind.to_dicts()
    assert snap["group"] == rep.by_group.to_dicts()
    (row,) = snap["kind"]
    assert row["stored_while_live"] == 0 and row["live_blocks_end"] == 3


def test_issue23_restart_of_one_channel_leaves_the_other_alone(tmp_path: Path) -> None:
    """Two channels interleaved batch by batch: only the restarted one starts afresh; the
    other (seqs 0..5, the same events) keeps its state (2 stored while live, 1 recomputed,
    6 live), one chunk or a chunk per batch."""
    path = tmp_path / "two.mcap"
    with RecordingWriter(path) as w:
        a = w.add_channel("tcp://127.0.0.1:5557", "", 0)
        b = w.add_channel("tcp://127.0.0.1:5558", "", 0)
        for i, (seq, ts, events) in enumerate(BEFORE + AFTER):
            w.write(a, seq, ENC.encode([ts, events, 0]), log_time=int((T0 + 100 + i) * 1e9))
            w.write(b, i, ENC.encode([ts, events, 0]), log_time=int((T0 + 100.5 + i) * 1e9))
    for kw in ({}, {"chunk_bytes": 1}):
        rep = build_report([path], **kw)  # type: ignore[arg-type]
        t = rep.totals.to_dicts()[0]
        assert (t["blocks_stored"], t["blocks_cleared"], t["live_blocks_end"]) == (16, 3, 9)
        assert (t["stored_while_live"], t["blocks_recomputed"]) == (2, 1)
        (line,) = [f for f in rep.findings if "restart" in f]
        assert line.startswith("1 publisher restart on tcp://127.0.0.1:5557:")


def test_issue23_ungrouped_remove_after_a_restart_sees_the_new_cache_only(tmp_path: Path) -> None:
    """A remove without group_idx on a grouped channel is attributed by the live state; a
    restart in the same chunk starts that state afresh, as a chunk boundary at the restart
    does (this once depended on where the chunks fell)."""
    before = [
        (0, T0 + 10, [stored([1, 2], **G)]),
        (1, T0 + 11, [stored([3], **G)]),
    ]
    # After the restart hash 1 was never stored again: its remove is an orphan.
    after = [
        (0, T0 + 1, [stored([7], **G)]),
        (1, T0 + 2, [removed([1]), removed([7])]),
    ]
    path = _record(tmp_path / "ungrouped.mcap", before + after)
    whole = build_report([path]).by_kind.to_dicts()
    # the orphan is unattributed (live in no group of the new cache), not full attention's
    kinds = {r["kind"]: r for r in whole}
    assert kinds["unattributed"]["orphan_removes"] == 1
    assert kinds["full_attention"]["orphan_removes"] == 0
    for chunk_bytes in (64, 128, 256):
        assert build_report([path], chunk_bytes=chunk_bytes).by_kind.to_dicts() == whole
