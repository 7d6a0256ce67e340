"""Issue 19 (deliverable 5): what a gap ledger lists as missing is worded once, and findings
are told apart by their kind, never by their text.

Every command that can see batches lost while recording, or a channel tail the replay
socket never confirmed, says it in the words of :mod:`kvtool.recording.unconfirmed` (taken
from there, not copied here): ``info``, ``report``, ``diff``, ``top``, ``serve``,
``replay``, ``export`` on a recording, and ``record`` and live ``top`` of a live stream.
``report`` and ``diff`` leave out the finding they say as an error by its kind: a finding
of another kind whose text happens to hold those words is still printed.

Real recordings: the sample ``full_only-v1.mcap`` (its ledger lists seq 8 lost), the
``unconfirmed_recording`` fixture (``kvtool record`` against a replay socket that never
ends its answer), files written by the recording writer, and real ZeroMQ peers.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvtool.cli import app
from kvtool.recording import RecordingWriter, open_recording
from kvtool.recording.ledger import GapLedger
from kvtool.recording.unconfirmed import (
    ledger_lines,
    lost_line,
    unconfirmed_lines,
    unconfirmed_tails,
    unconfirmed_text,
)
from kvtool.report.source import Finding, finding_kind
from tests.conftest import capture_messages
from tests.peer import Peer
from tests.recutil import BASE_NS, ENDPOINT, STEP_NS

runner = CliRunner()

DATA = Path(__file__).parent / "data" / "recordings"
FULL_ONLY = DATA / "full_only-v1.mcap"


def _ledger_says(path: Path) -> list[str]:
    """What the library says of ``path``'s gap ledger: the one wording."""
    with open_recording(path) as reader:
        ledger = reader.gap_ledger
    return ledger_lines(str(path), ledger)


def _readers(path: Path, tmp: Path) -> dict[str, list[str]]:
    """Every command that reads a recording, each on ``path``."""
    other = FULL_ONLY  # given twice, a recording is said once
    return {
        "info": ["info", str(path)],
        "info json": ["info", str(path), "--format", "json"],
        "report": ["report", str(path)],
        "report json": ["report", str(path), "--format", "json"],
        "diff": ["diff", str(other), str(path)],
        "diff json": ["diff", str(other), str(path), "--format", "json"],
        "replay": ["replay", str(path), "--format", "jsonl"],
        "export": ["export", str(path), "-o", str(tmp / "events.csv"), "--force"],
        "top": ["top", str(path), "--once", "--speed", "0"],
        "serve": [
            "serve",
            str(path),
            "--speed",
            "0",
            "--exit-at-end",
            "--metrics",
            "127.0.0.1:0",
        ],
    }


def _check_every_reader(path: Path, tmp: Path, expected: list[str]) -> None:
    for name, args in _readers(path, tmp).items():
        res = runner.invoke(app, args)
        assert res.exit_code == 3, (name, res.output)
        for line in expected:
            # Said once, as an error line, in the library's words.
            assert res.stderr.count(line) == 1, (name, line, res.stderr)
            assert f"kvtool: {line}\n" in res.stderr, (name, res.stderr)
            assert f"finding: {line}" not in res.stderr, (name, res.stderr)


def test_issue19_every_reader_says_the_unconfirmed_tail_in_one_wording(
    unconfirmed_recording: tuple[Path, int, str], tmp_path: Path
) -> None:
    """info, report, diff, replay, export, top and serve print the library's line, once."""
    path, n, endpoint = unconfirmed_recording
    expected = _ledger_says(path)
    assert expected == [
        f"{path}: the replay socket never confirmed what followed {endpoint} after seq {n - 8} "
        "(its answer never ended); batches published after it may be missing"
    ]
    _check_every_reader(path, tmp_path, expected)
    # The report's finding (JSON) is the same line, of kind "lost".
    res = runner.invoke(app, ["report", str(path), "--format", "json"])
    assert expected[0] in json.loads(res.stdout)["source"]["findings"]
    # info's Unconfirmed row is the same words without the path.
    res = runner.invoke(app, ["info", str(path)])
    with open_recording(path) as reader:
        text = unconfirmed_text(unconfirmed_tails(reader.gap_ledger))
    shown = " ".join(res.stdout.split())  # the row wraps at 100 columns
    assert f"Unconfirmed: {text} Restarts:" in shown


def test_issue19_every_reader_says_the_lost_batches_in_one_wording(tmp_path: Path) -> None:
    """The sample recording whose ledger lists seq 8 lost: the same line from every reader."""
    expected = _ledger_says(FULL_ONLY)
    assert expected == [
        f"{FULL_ONLY}: 1 batch was lost while recording (seq 8); counts miss their events"
    ]
    _check_every_reader(FULL_ONLY, tmp_path, expected)


def test_issue19_the_reports_lost_finding_is_the_library_line() -> None:
    with open_recording(FULL_ONLY) as reader:
        ledger = reader.gap_ledger
    expected = ledger_lines(str(FULL_ONLY), ledger, orphans=True)
    res = runner.invoke(app, ["report", str(FULL_ONLY), "--format", "json"])
    findings = json.loads(res.stdout)["source"]["findings"]
    assert expected[0] in findings


def test_issue19_the_wording_functions() -> None:
    """Plurals, the first 5 ranges or tails, and ``…`` for the rest (named ``N more``)."""
    assert lost_line("r.mcap", 1, [(8, 8)]) == (
        "r.mcap: 1 batch was lost while recording (seq 8); counts miss their events"
    )
    ranges = [(i * 10, i * 10 + 1) for i in range(7)]
    assert lost_line("r.mcap", 14, ranges) == (
        "r.mcap: 14 batches were lost while recording (seq 0-1, 10-11, 20-21, 30-31, 40-41, "
        "…); counts miss their events"
    )
    assert lost_line("r.mcap", 2, [(3, 4)], more=True, orphans=True) == (
        "r.mcap: 2 batches were lost while recording (seq 3-4, …); counts miss their events, "
        "and removes of blocks stored in them count as orphans"
    )
    assert lost_line("r.mcap", 3, []) == (
        "r.mcap: 3 batches were lost while recording; counts miss their events"
    )
    # A totals-only ledger: its count is all there is, said as "a channel".
    ledger = GapLedger(lost=2, lost_ranges=[(5, 6)], unconfirmed=1)
    assert ledger_lines("r.mcap", ledger) == [
        "r.mcap: 2 batches were lost while recording (seq 5-6); counts miss their events",
        "r.mcap: the replay socket never confirmed what followed a channel (its answer never "
        "ended); batches published after it may be missing",
    ]
    assert ledger_lines("r.mcap", GapLedger()) == [] == ledger_lines("r.mcap", None)
    tails = unconfirmed_tails(GapLedger(unconfirmed=1)) * 7
    assert unconfirmed_lines("r.mcap", tails) == [
        "r.mcap: the replay socket never confirmed what followed a channel, a channel, "
        "a channel, a channel, a channel, … (2 more) (its answer never ended); batches "
        "published after it may be missing"
    ]


def test_issue19_finding_kind_is_what_commands_decide_on() -> None:
    """The kind of a Finding; a plain line has none, whatever it says."""
    text = "r.mcap: 2 batches were lost while recording (seq 1-2); counts miss their events"
    assert finding_kind(Finding("lost", text, "r.mcap")) == "lost"
    assert finding_kind(Finding("input", text)) == "input"
    assert finding_kind(text) is None
    # A finding pickles (Ray, threads) with its kind and path.
    import pickle

    back = pickle.loads(pickle.dumps(Finding("malformed", text, "r.mcap")))
    assert (finding_kind(back), back.path, back.text) == ("malformed", "r.mcap", text)


def _write_misleading(tmp_path: Path) -> Path:
    """A recording whose path holds both phrases: a malformed payload (its finding, of kind
    ``malformed``, quotes the path) and a ledger listing seq 5 lost."""
    folder = tmp_path / "the replay socket never confirmed what followed; lost while recording"
    folder.mkdir()
    path = folder / "r.mcap"
    ledger: dict[str, object] = {
        "channels": [],
        "recovered": 0,
        "lost": 1,
        "lost_ranges": [[5, 5]],
        "restarts": 0,
    }
    msgs = capture_messages("full_only")
    with RecordingWriter(path, chunk_size=4096, compression="zstd") as w:
        ch = w.add_channel(ENDPOINT, "", 0)
        for i, (_topic, seq, payload) in enumerate(msgs):
            if seq != 5:
                w.write(
                    ch, seq, b"\xc1 not a batch" if seq == 3 else payload, BASE_NS + i * STEP_NS
                )
        w.close(ledger=ledger)
    return path


def test_issue19_report_and_diff_filter_findings_by_kind_not_text(tmp_path: Path) -> None:
    """The malformed-payload finding names a path that says "lost while recording" and
    "the replay socket never confirmed what followed": ``report`` and ``diff`` still print
    it (they dropped it by its text before), and leave out only the lost finding, which
    they say once as an error."""
    path = _write_misleading(tmp_path)
    (lost,) = _ledger_says(path)
    res = runner.invoke(app, ["report", str(path), "--format", "json"])
    assert res.exit_code == 3, res.output
    findings = json.loads(res.stdout)["source"]["findings"]
    malformed = next(f for f in findings if f.startswith("skipped 1 malformed payload"))
    assert "lost while recording" in malformed and "never confirmed what followed" in malformed
    assert f"kvtool: finding: {malformed}\n" in res.stderr
    assert res.stderr.count("lost while recording (seq 5)") == 1
    assert f"kvtool: {lost}\n" in res.stderr

    res = runner.invoke(app, ["diff", str(FULL_ONLY), str(path), "--format", "json"])
    assert res.exit_code == 3, res.output
    side_b = json.loads(res.stdout)["b"]["findings"]
    assert malformed in side_b
    assert f"kvtool: finding (B): {malformed}\n" in res.stderr
    # The lost findings of both sides are left out: each recording's line is said once.
    assert res.stderr.count("lost while recording (seq 5)") == 1
    assert res.stderr.count("lost while recording (seq 8)") == 1
    assert f"kvtool: {lost}\n" in res.stderr


@pytest.mark.zmq
def test_issue19_record_and_live_top_say_lost_batches_as_info_does(tmp_path: Path) -> None:
    """``record`` and live ``top --record`` of a stream that loses seqs 10-11 (no replay
    socket) say it in the words ``info`` then says of the file they wrote."""
    msgs = capture_messages("full_only")
    out = tmp_path / "r.mcap"
    with Peer(msgs, drop={10, 11}, replay=False) as peer:
        res = runner.invoke(
            app, ["record", peer.endpoint, "-o", str(out), "-q", "-n", str(len(msgs) - 2)]
        )
    assert res.exit_code == 3, res.output
    expected = _ledger_says(out)
    assert expected == [
        f"{out}: 2 batches were lost while recording (seq 10-11); counts miss their events"
    ]
    assert res.stderr == f"kvtool: {expected[0]}\n"
    res = runner.invoke(app, ["info", str(out)])
    assert f"kvtool: {expected[0]}\n" in res.stderr

    seen = tmp_path / "top.mcap"
    with Peer(msgs, drop={10, 11}, replay=False, wait_subscribers=1) as peer:
        res = runner.invoke(
            app,
            ["top", peer.endpoint, "--once", "--duration", "3s", "--record", str(seen)],
        )
        endpoint = peer.endpoint
    assert res.exit_code == 3, res.output
    # The live recorder's ledger is the file's: the same line, naming the stream.
    with open_recording(seen) as reader:
        ledger = reader.gap_ledger
    (line,) = ledger_lines(endpoint, ledger)
    assert "2 batches were lost while recording (seq 10-11)" in line
    assert f"kvtool: {line}\n" in res.stderr
