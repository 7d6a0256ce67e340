"""Issue 24: live ``top`` attributes a remove that came before its group's first annotated
store as ``report`` does on the file ``top --record`` wrote.

Real ZeroMQ sockets on 127.0.0.1: the test peer publishes vLLM 0.33's own gemma3 capture
from batch 16 on (what a late subscriber sees: 83 removes of blocks stored before it
joined, each before its group's next store); ``LiveSource`` records it and ``ReportFeed``
(``top``'s engine) takes it in the chunks the live path gives.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from kvtool.endpoints import expand_endpoints
from kvtool.report import build_report
from kvtool.top import LiveSource, ReportFeed
from tests.conftest import capture_messages
from tests.peer import Peer


def _live(
    tmp_path: Path, msgs: list[tuple[bytes, int, bytes]], chunk: int
) -> tuple[ReportFeed, Path]:
    out = tmp_path / f"top-{chunk}.mcap"
    with Peer(msgs) as peer:
        src = LiveSource(expand_endpoints([peer.endpoint]), record=str(out))
        feed = ReportFeed()
        src.start(time.monotonic())
        taken = 0
        try:
            deadline = time.monotonic() + 60
            while taken < len(msgs):
                assert time.monotonic() < deadline
                got = src.take(time.monotonic())
                for i in range(0, len(got), chunk):
                    feed.add(got[i : i + chunk])
                taken += len(got)
                if not got:
                    time.sleep(0.02)
        finally:
            src.stop()
    return feed, out


@pytest.mark.zmq
@pytest.mark.parametrize("chunk", [1, 8])
def test_issue24_live_top_reattributes_early_removes_as_report_does(
    tmp_path: Path, chunk: int
) -> None:
    """Per kind, window and group, the live numbers equal report's on the --record file.
    Before: the 83 early removes stayed in `unannotated` rows live (report: none)."""
    msgs = capture_messages("gemma3")[16:]
    feed, out = _live(tmp_path, msgs, chunk)
    rep = build_report([out])
    snap = feed.snapshot()
    assert not [r for r in rep.by_kind.to_dicts() if r["kind"] == "unannotated"]
    assert snap["kind"] == rep.by_kind.to_dicts()
    assert snap["window"] == rep.by_window.to_dicts()
    assert snap["group"] == rep.by_group.to_dicts()


def test_issue24_live_feed_lets_the_kept_messages_go(tmp_path: Path) -> None:
    """The messages kept for re-attribution are let go once nothing is pending and
    KEEP_MIN batches were seen: a long live stream is not held in memory."""
    from kvtool.recording import RecordingWriter
    from kvtool.top import KEEP_MIN, RecordingSource

    msgs = capture_messages("gemma3")[16:]
    path = tmp_path / "r.mcap"
    n = KEEP_MIN + 2 * len(msgs)
    with RecordingWriter(path) as w:
        cid = w.add_channel("tcp://127.0.0.1:5557", "", 0)
        for seq in range(n):
            w.write(cid, seq, msgs[seq % len(msgs)][2], 10**18 + seq)
    src = RecordingSource(str(path), speed=0)
    src.start(0.0)
    feed = ReportFeed()  # no metadata: learned live, as for a stream
    while not src.done:
        feed.add(src.take(0.0))
    assert feed._kept is None and not feed._pending
    assert feed.snapshot()["kind"] == build_report([path]).by_kind.to_dicts()
