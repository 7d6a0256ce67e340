"""Issue 19: ``Report.source`` is a typed struct and findings carry their kind; JSON unchanged."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

from kvtool.recording import RecordingWriter
from kvtool.report import build_report
from kvtool.report.source import FINDING_KINDS, Finding, ReportSource, TimelineSource
from tests.test_report import ENC, removed, stored


def _lossy(path: Path) -> Path:
    w = RecordingWriter(path)
    ch = w.add_channel("tcp://127.0.0.1:5557", "", 0)
    w.write(ch, 0, ENC.encode([1.0, [stored([1], 0, "full_attention")], 0]), log_time=1)
    w.write(ch, 3, ENC.encode([4.0, [removed([1], 0), removed([2], 0)], 0]), log_time=4)
    w.close(
        ledger={"channels": [], "recovered": 0, "lost": 2, "lost_ranges": [[1, 2]], "restarts": 0}
    )
    return path


def test_source_is_typed_and_its_dict_is_the_json_source(tmp_path: Path) -> None:
    path = _lossy(tmp_path / "r.mcap")
    rep = build_report([path], every_ns=10**9)
    src = rep.source
    assert isinstance(src, ReportSource)
    assert src.recordings == [str(path)]
    assert src.batches == 2 and src.events == 3
    assert [c.channel for c in src.channels] == ["tcp://127.0.0.1:5557"]
    assert isinstance(src.timeline, TimelineSource) and src.clock == "receive"
    d = src.to_dict()
    assert list(d) == [
        "recordings",
        "channels",
        "group_metadata",
        "batches",
        "events",
        "block_rows",
        "duration_s",
        "duration_clock",
        "clock",
        "timeline_origin_s",
        "timeline_start_s",
        "timeline_end_s",
        "lifetimes",
        "recompute_gaps",
        "skipped_batches",
        "skipped_events",
        "unknown_events",
        "damaged",
    ]
    assert rep.to_dict()["source"] == d
    json.dumps(rep.to_dict())  # plain JSON types only
    no_timeline = build_report([path]).source
    assert no_timeline.timeline is None and "clock" not in no_timeline.to_dict()


def test_findings_carry_their_kind_and_stay_their_text(tmp_path: Path) -> None:
    path = _lossy(tmp_path / "r.mcap")
    rep = build_report([path])
    kinds = {f.kind for f in rep.findings}
    assert {"lost", "orphan_removes"} <= kinds <= set(FINDING_KINDS)
    (lost,) = [f for f in rep.findings if f.kind == "lost"]
    assert isinstance(lost, Finding) and isinstance(lost, str)
    assert lost.path == str(path)
    assert "2 batches were lost while recording (seq 1-2)" in lost
    assert type(lost.text) is str and lost.text == lost
    back = pickle.loads(pickle.dumps(lost))
    assert (back.kind, back.text, back.path) == (lost.kind, lost.text, lost.path)
    assert json.loads(json.dumps([lost])) == [lost.text]
