"""Issue 23: ``kvtool info`` shows the tails the replay socket never confirmed.

A real recording from ``kvtool record`` against the test peer's replay socket, which
stops before its end marker; then ``kvtool info`` on that file, as text and as JSON.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvtool.cli import app
from tests.conftest import capture_messages
from tests.peer import Peer

runner = CliRunner()


def test_issue23_info_json_lists_the_unconfirmed_tail(
    unconfirmed_recording: tuple[Path, int, str],
) -> None:
    """JSON names the channel and the first seq that may be missing; exit 3. Before:
    no key for it, `complete` with 0 lost and exit 0, as if nothing could be missing."""
    path, n, endpoint = unconfirmed_recording
    res = runner.invoke(app, ["info", str(path), "--format", "json"])
    assert res.exit_code == 3, res.output
    out = json.loads(res.stdout)
    assert out["unconfirmed"] == [
        {"endpoint": endpoint, "topic": "", "dp_rank": 0, "from_seq": n - 7}
    ]
    assert out["gaps"]["lost"] == 0 and out["batches"] == n - 7
    assert res.stderr.count("\n") == 1
    assert f"never confirmed what followed {endpoint} after seq {n - 8}" in res.stderr


def test_issue23_info_table_says_the_tail_is_unconfirmed(
    unconfirmed_recording: tuple[Path, int, str],
) -> None:
    """The table has an Unconfirmed row and its Status is not a bare 'complete'."""
    path, n, endpoint = unconfirmed_recording
    res = runner.invoke(app, ["info", str(path)], env={"COLUMNS": "100"})
    assert res.exit_code == 3, res.output
    lines = res.stdout.splitlines()
    status = next(line for line in lines if line.startswith("Status:"))
    assert "1 channel tail UNCONFIRMED" in status
    # The row is the stderr line's words without the path (issue 19: one wording; it
    # said "from seq N", the first seq missing, where every line says "after seq N - 1").
    text = " ".join(" ".join(lines).split())
    assert f"Unconfirmed: the replay socket never confirmed what followed {endpoint} " in text
    assert f"{endpoint} after seq {n - 8} (its answer never ended)" in text
    assert "may be missing" in text


def test_issue23_totals_only_ledger_with_unconfirmed_tails_is_not_complete() -> None:
    """A ledger from another writer that counts unconfirmed tails but lists no channel:
    one entry (never one per count) and a problem line, so info exits 3."""
    from kvtool.info import RecordingInfo, unconfirmed_tails
    from kvtool.recording.ledger import GapLedger

    tails = unconfirmed_tails(GapLedger(unconfirmed=2**62))
    assert [(t.channel, t.from_seq) for t in tails] == [("", None)]
    info = RecordingInfo(path="run.mcap", size_bytes=0, unconfirmed=tails)
    (line,) = info.problems()
    assert line.startswith("run.mcap: the replay socket never confirmed what followed a channel")
    assert info.to_json()["unconfirmed"] == [
        {"endpoint": "", "topic": "", "dp_rank": None, "from_seq": None}
    ]


def test_issue23_top_file_says_the_tail_is_unconfirmed(
    unconfirmed_recording: tuple[Path, int, str],
) -> None:
    """`top FILE --once --speed 0` on that recording names the tail and exits 3, as info."""
    path, n, endpoint = unconfirmed_recording
    res = runner.invoke(app, ["top", str(path), "--once", "--speed", "0"])
    assert res.exit_code == 3, res.output
    assert f"never confirmed what followed {endpoint} after seq {n - 8}" in res.stderr


@pytest.mark.zmq
def test_issue23_live_top_says_the_tail_is_unconfirmed(tmp_path: Path) -> None:
    """Live `top --once` against the replay socket that never ends its answer: the tail is
    said on stderr and top exits 3. Before: exit 0, nothing said."""
    msgs = capture_messages("gemma3")
    n = len(msgs)
    with Peer(
        msgs, drop=set(range(n - 10, n)), replay_mode="cut", replay_cut=3, answer_limit=1
    ) as peer:
        res = runner.invoke(
            app,
            [
                "top",
                peer.endpoint,
                "--replay-endpoint",
                peer.replay_endpoint or "",
                "--once",
                "--duration",
                "3s",
                "--replay-timeout",
                "0.3s",
            ],
        )
    assert res.exit_code == 3, res.output
    # The words a recording's ledger is said in (issue 19), from the live recorder's ledger.
    assert f"never confirmed what followed {peer.endpoint} after seq {n - 8}" in res.stderr
