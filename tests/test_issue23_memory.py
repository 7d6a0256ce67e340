"""Issue 23: ``top`` and ``serve`` keep one copy of the state and no second decode queue.

- While a stream has one rank, the whole stream's report builder is that rank's too; a
  second rank clones it first, so the rank view is what a builder per rank gives.
- The recorder behind ``top``/``serve`` does not queue payloads for its status decode
  (the view decodes every batch itself): events are counted from the batch headers.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kvtool.capture import Recorder
from kvtool.endpoints import expand_endpoints
from kvtool.recording import RecordingWriter
from kvtool.report import build_report
from kvtool.top import RecordingSource, ReportFeed
from tests.conftest import capture_messages
from tests.peer import Peer


def _two_ranks(path: Path, late: int) -> Path:
    """Rank 0 alone for ``late`` batches, then ranks 0 and 1 interleaved."""
    msgs = capture_messages("gemma3")
    with RecordingWriter(path) as w:
        a = w.add_channel("tcp://127.0.0.1:5557", "", 0)
        b = w.add_channel("tcp://127.0.0.1:5558", "", 1)
        t = 10**18
        for seq, (_, _, p) in enumerate(msgs):
            w.write(a, seq, p, t + 2 * seq)
            if seq >= late:
                w.write(b, seq - late, msgs[seq - late][2], t + 2 * seq + 1)
    return path


def _feed(path: Path, chunk: int) -> ReportFeed:
    src = RecordingSource(str(path), speed=0)
    src.start(0.0)
    feed = ReportFeed(src.groups)
    while not src.done:
        got = src.take(0.0)
        for i in range(0, len(got), chunk):
            feed.add(got[i : i + chunk])
    return feed


@pytest.mark.parametrize("late", [0, 20])
def test_issue23_one_rank_keeps_one_builder_and_a_second_rank_clones_it(
    tmp_path: Path, late: int
) -> None:
    """Fed a batch at a time (one rank first, then two), every view equals a feed that saw
    both ranks in one chunk (a builder per rank from the start), and report's rows."""
    path = _two_ranks(tmp_path / "r.mcap", late)
    one = _feed(path, 1)
    whole = _feed(path, 10_000)
    assert one.snapshot() == whole.snapshot()
    rep = build_report([path])
    assert one.snapshot()["kind"] == rep.by_kind.to_dicts()
    assert set(one.builders()) == {0, 1}


def test_issue23_one_rank_stream_has_no_second_builder(tmp_path: Path) -> None:
    """A one-rank stream: the rank view is read from the whole stream's builder (before: a
    second builder with a copy of the whole state, ~45 MB more under the 46k burst)."""
    msgs = capture_messages("gemma3")
    path = tmp_path / "one.mcap"
    with RecordingWriter(path) as w:
        cid = w.add_channel("tcp://127.0.0.1:5557", "", 0)
        for seq, (_, _, p) in enumerate(msgs):
            w.write(cid, seq, p, 10**18 + seq)
    feed = _feed(path, 7)
    (builder,) = feed.builders().values()
    assert builder is feed._builder
    rows = feed.snapshot()["rank"]
    assert [r["dp_rank"] for r in rows] == [0] * len(rows)
    assert [{k: v for k, v in r.items() if k != "dp_rank"} for r in rows] == feed.snapshot()["kind"]


@pytest.mark.zmq
def test_issue23_sink_recorder_counts_events_without_the_status_decode(tmp_path: Path) -> None:
    """``status_decode=False`` (what top and serve use): no payload waits for a status
    decode; every event is still counted, from the headers, and nothing is unsampled."""
    msgs = capture_messages("gemma3")
    seen: list[int] = []
    with Peer(msgs) as peer:
        rec = Recorder(
            str(tmp_path / "r.mcap"),
            expand_endpoints([peer.endpoint]),
            max_batches=len(msgs),
            sink=lambda _c, seq, _p, _t: seen.append(seq),
            status_decode=False,
        )
        res = rec.run()
    total = sum(len(e) for e in (peer_events(p) for _, _, p in msgs))
    assert seen == list(range(len(msgs)))
    assert (res.stats.events, res.stats.unsampled) == (total, 0)
    assert not rec._stat_queue


def peer_events(payload: bytes) -> list[object]:
    from kvtool.protocol import decode_batch

    return list(decode_batch(payload).events)
