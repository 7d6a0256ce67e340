"""Issue 23: a replay request is never given up silently (retries, deadlines, the ledger).

Real ZeroMQ sockets on 127.0.0.1 against the test peer's replay modes: a peer pausing
seconds before its replies (SGLang serves replay in its publisher thread), one that stops
before the end marker, one answering only seqs it was not asked for.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvtool.capture import CaptureResult, CaptureStats
from kvtool.cli import app
from kvtool.render.status import summary_line
from tests.conftest import capture_messages
from tests.peer import Peer
from tests.test_capture import SECOND, read_back, record, wait_published

runner = CliRunner()


def _lost(ledger: dict[str, object]) -> set[int]:
    return {s for a, b in ledger["lost_ranges"] for s in range(a, b + 1)}  # type: ignore[attr-defined]


@pytest.mark.zmq
def test_issue23_replay_pausing_5s_between_replies_loses_nothing(tmp_path: Path) -> None:
    """5 s before each reply and before the end marker, with the default 2 s timeout: the
    request is asked again (same socket) and the answer kept. Before: given up at 2 s,
    seq 5 lost though the buffer held it, and every gap of the next 10 s lost unasked."""
    msgs = capture_messages("gemma3")
    n = len(msgs)
    with Peer(msgs, drop={5}, replay_mode="pause", replay_pause=5.0) as peer:
        res = record(tmp_path / "r.mcap", peer, max_batches=n, quiet_ns=60 * SECOND)
    got = read_back(tmp_path / "r.mcap")
    assert [s for s, _ in got] == list(range(n))
    assert [d for _, d in got] == [p for _, _, p in msgs]
    assert res.stats.replay_retries >= 1 and res.stats.replay_timeouts == 0
    assert (res.stats.lost, res.ledger["lost"], res.stats.recovered) == (0, 0, 1)


@pytest.mark.zmq
def test_issue23_replay_that_stops_before_the_end_marker_is_asked_for_the_rest(
    tmp_path: Path,
) -> None:
    """Each answer stops after 5 replies, without an end marker: asked again from the seq
    after the last reply until the gap is filled, nothing lost. Before: given up after the
    first 5, 15 batches lost that the buffer held."""
    msgs = capture_messages("gemma3")
    n = len(msgs)
    drop = set(range(10, 30))
    with Peer(msgs, drop=drop, replay_mode="cut", replay_cut=5) as peer:
        res = record(
            tmp_path / "r.mcap",
            peer,
            max_batches=n,
            replay_timeout_ns=SECOND // 4,
            quiet_ns=60 * SECOND,
        )
        asked = list(peer.replay_requests)
    got = read_back(tmp_path / "r.mcap")
    assert [s for s, _ in got] == list(range(n))
    assert [d for _, d in got] == [p for _, _, p in msgs]
    assert asked[:4] == [10, 15, 20, 25]
    assert (res.stats.lost, res.ledger["lost"], res.stats.recovered) == (0, 0, 20)


@pytest.mark.zmq
def test_issue23_replay_that_goes_silent_lists_every_missing_seq(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One answer of 5 replies, then silence: retried until the deadline, then exactly the
    seqs it never brought (15-29) are lost, in the ledger; nothing else missing."""
    import kvtool.capture.recorder as recorder_mod

    monkeypatch.setattr(recorder_mod, "REPLAY_DEADLINE_NS", 3 * SECOND // 2)
    msgs = capture_messages("gemma3")
    n = len(msgs)
    drop = set(range(10, 30))
    with Peer(msgs, drop=drop, replay_mode="cut", replay_cut=5, answer_limit=1) as peer:
        res = record(
            tmp_path / "r.mcap",
            peer,
            max_batches=n - 15,
            replay_timeout_ns=SECOND // 4,
            quiet_ns=60 * SECOND,
        )
        retried = len(peer.replay_requests) - 1
    got = read_back(tmp_path / "r.mcap")
    missing = set(range(n)) - {s for s, _ in got}
    assert missing == _lost(res.ledger) == set(range(15, 30))
    assert res.ledger["lost_ranges"] == [[15, 29]]
    assert retried >= 2 and res.stats.replay_retries == retried
    assert res.stats.replay_timeouts == 1 and res.stats.recovered == 5


@pytest.mark.zmq
def test_issue23_unconfirmed_tail_is_in_the_ledger_and_exits_3(tmp_path: Path) -> None:
    """The tail (last 10 seqs) is dropped live and the replay socket never ends its answer
    (3 replies, then silence): the 3 are written, the rest of the tail is unconfirmed in the
    ledger, `record` says so and exits 3, with no 'nothing lost'. Before: exit 0."""
    msgs = capture_messages("gemma3")
    n = len(msgs)
    out = tmp_path / "r.mcap"
    drop = set(range(n - 10, n))
    with Peer(msgs, drop=drop, replay_mode="cut", replay_cut=3, answer_limit=1) as peer:
        res = runner.invoke(
            app,
            [
                "record",
                peer.endpoint,
                "--replay-endpoint",
                peer.replay_endpoint or "",
                "-o",
                str(out),
                "--duration",
                "3s",
                "--replay-timeout",
                "0.3s",
                "--quiet",
            ],
        )
    assert res.exit_code == 3, res.output
    assert "unconfirmed" in res.stderr and "nothing lost" not in res.stderr
    got = read_back(out)
    assert [s for s, _ in got] == list(range(n - 7))
    from kvtool.recording import open_recording

    with open_recording(out) as r:
        ledger = r.ledger
    assert ledger is not None
    assert ledger["unconfirmed"] == 1 and ledger["lost"] == 0
    assert ledger["channels"][0]["unconfirmed_from"] == n - 7  # type: ignore[index]


@pytest.mark.zmq
def test_issue23_replies_it_was_not_asked_for_are_never_written(tmp_path: Path) -> None:
    """The replay socket answers a request for seq s with s+5000 and 2**60+13 only: both
    counted as rejected, never written; the ledger says 1 lost (seq 5), not ~4,950."""
    msgs = capture_messages("gemma3")
    n = len(msgs)
    with Peer(msgs, drop={5}, replay_mode="far_lie") as peer:
        res = record(tmp_path / "r.mcap", peer, duration_ns=2 * SECOND, quiet_ns=60 * SECOND)
    got = read_back(tmp_path / "r.mcap")
    assert [s for s, _ in got] == [s for s in range(n) if s != 5]
    assert [d for s, d in got] == [p for _, s, p in msgs if s != 5]
    assert (res.stats.lost, res.ledger["lost"], res.ledger["lost_ranges"]) == (1, 1, [[5, 5]])
    assert res.stats.replay_rejected >= 2


@pytest.mark.zmq
def test_issue23_late_history_from_a_publisher_that_pauses_is_complete(tmp_path: Path) -> None:
    """A late `record --history` (1,642 batches published before it subscribed) from a
    peer that sends 1,500 replies, pauses 3 s, then the rest: every seq recorded. Before:
    seqs 0-1499 only, '1 replay request timed out, nothing lost', exit 0."""
    msgs = capture_messages("gemma3")
    before, count = 1642, 1700
    with Peer(
        msgs,
        count=count,
        publish_before_wait=before,
        replay_mode="pause",
        replay_pause=3.0,
        pause_every=1500,
        pause_first=False,
    ) as peer:
        wait_published(peer, before)  # published to nobody: only history has them
        res = record(
            tmp_path / "r.mcap",
            peer,
            history=True,
            max_batches=count,
            replay_timeout_ns=SECOND,
            quiet_ns=60 * SECOND,
        )
    got = read_back(tmp_path / "r.mcap")
    assert [s for s, _ in got] == list(range(count))
    assert [d for _, d in got] == [msgs[i % len(msgs)][2] for i in range(count)]
    assert res.stats.lost == 0 and res.stats.history == before
    assert res.stats.replay_retries >= 1


def test_issue23_nothing_lost_only_when_every_gap_was_filled_or_confirmed() -> None:
    """'nothing lost' is said only when nothing is lost and no tail is unconfirmed."""
    st = CaptureStats(batches=64, events=1925, gaps=1, recovered=1, replay_retries=2)
    line = summary_line(CaptureResult("run.mcap", st, {}, "duration", 2048))
    assert "2 replay requests asked again, nothing lost" in line
    st = CaptureStats(batches=64, events=1925, replay_timeouts=1, unconfirmed=1)
    line = summary_line(CaptureResult("run.mcap", st, {}, "duration", 2048))
    assert "nothing lost" not in line and "1 channel tail unconfirmed" in line


def test_issue23_a_stalled_loop_does_not_make_a_busy_channel_quiet() -> None:
    """A recorder stopped for seconds (SIGSTOP, a loaded machine) saw no live batch because
    it could not read: its channels are not quiet for that, so no tail is asked of a stream
    whose batches wait in the queue (found with SIGSTOP 7 s at 3,000 batches/s: a tail
    asked from a stale seq, its whole honest answer counted as 10,000 rejected replies)."""
    from kvtool.capture.sequencer import Request, Sequencer

    s = Sequencer("tcp://127.0.0.1:5557", 0)
    for seq in range(10):
        s.live(b"", seq, b"p", 0, 1_000)
    stalled = 7 * SECOND
    s.credit_busy(1_000 + stalled, stalled)
    assert not [a for a in s.check_quiet(1_000 + stalled) if isinstance(a, Request)]
    # Quiet for real afterwards: the tail is asked.
    later = 1_000 + stalled + 2 * SECOND
    assert [a for a in s.check_quiet(later) if isinstance(a, Request)] == [Request(10, "tail", b"")]
