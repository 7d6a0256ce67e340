"""Issue 20 (item 4): the what-if says where its assumptions fail, from typed data.

- groups no source gave a kind get the full-attention rule: a condition says so, and
  names ``--group-meta`` / ``--groups`` as the fix (and with them it is gone);
- lost batches are worded once (:func:`kvtool.recording.unconfirmed.lost_line`), from the
  gap ledger's numbers, not by editing another sentence;
- ``--pool-blocks`` (one engine's pool) for an input of several channels is refused in
  one line with exit status 2.
"""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from kvtool.cli import app
from kvtool.recording.unconfirmed import lost_line
from kvtool.report.whatif import LostBatches, lost_batches, parse_what_if, what_if
from tests.test_report import record_batches, removed, stored

runner = CliRunner()
REC = Path(__file__).resolve().parents[1] / "recordings"


def _conditions(entry: dict[str, object]) -> dict[str, str]:
    return {c["condition"]: c["detail"] for c in entry["conditions"]}  # type: ignore[attr-defined]


def test_unannotated_groups_are_a_condition_naming_the_fix() -> None:
    """gemma3's legacy layout (group_idx, no kind): 6 groups replayed as full attention."""
    f = REC / "gemma3-legacy-group-idx.mcap"
    res = what_if([f], parse_what_if("+10"))
    detail = _conditions(res.entries[0])["unannotated_groups"]
    assert detail.startswith("groups 0, 1, 2, 3, 4, … of 6 carry no kind")
    assert "full-attention hit rule" in detail and "--group-meta IDX=KIND[:WINDOW]" in detail
    assert f"what-if {res.entries[0]['channel']}: {detail}" in res.findings
    # The CLI says it as a finding, and lists it under the what-if table.
    r = runner.invoke(app, ["report", str(f), "--what-if", "+10"])
    assert r.exit_code == 0, r.stderr
    assert "condition: unannotated_groups: groups 0, 1, 2, 3, 4, … of 6 carry" in r.stdout
    # With the groups annotated, the condition is gone.
    groups = REC / "gemma3.groups.json"
    res = what_if([f], parse_what_if("+10"), groups_file=groups)
    assert "unannotated_groups" not in _conditions(res.entries[0])


def test_one_unannotated_group_among_annotated_ones(tmp_path: Path) -> None:
    path = record_batches(
        tmp_path / "mixed.mcap",
        [
            [stored([1, 2], group=0, kind="full_attention"), stored([1, 2], group=1)],
            [removed([1], 0), removed([1], 1)],
        ],
    )
    entry = what_if([path], parse_what_if("+5")).entries[0]
    detail = _conditions(entry)["unannotated_groups"]
    assert detail.startswith("group 1 of 2 carries no kind") and "gives it the" in detail
    flagged = what_if([path], parse_what_if("+5"), group_flags=["1=sliding_window:64"])
    assert "unannotated_groups" not in _conditions(flagged.entries[0])
    plain = record_batches(
        tmp_path / "plain.mcap", [[stored([1, 2], group=0, kind="full_attention")]]
    )
    assert "unannotated_groups" not in _conditions(what_if([plain], parse_what_if("+5")).entries[0])


def test_lost_batches_are_worded_once_from_the_ledger() -> None:
    f = REC / "gemma3-gaps.mcap"
    (lost,) = lost_batches([f])
    assert lost == LostBatches(str(f), 3, ((20, 22),), False)
    assert lost.line() == lost_line(str(f), 3, [(20, 22)])
    entry = what_if([f], parse_what_if("+10")).entries[0]
    assert _conditions(entry)["lost_batches"] == (
        f"the eviction order is incomplete: {f}: 3 batches were lost while recording "
        "(seq 20-22); counts miss their events"
    )
    # The typed entries a caller passes are what the condition says.
    two = [LostBatches("a.mcap", 1, ((5, 5),)), LostBatches("b.mcap", 40, ((1, 40),), True)]
    entry = what_if([f], parse_what_if("+10"), lost=two).entries[0]
    assert _conditions(entry)["lost_batches"] == (
        "the eviction order is incomplete: a.mcap: 1 batch was lost while recording (seq 5); "
        "counts miss their events; b.mcap: 40 batches were lost while recording (seq 1-40, …); "
        "counts miss their events"
    )
    assert "lost_batches" not in _conditions(what_if([f], parse_what_if("+10"), lost=[]).entries[0])
    assert lost_batches([REC / "gemma3.mcap", REC / "missing.mcap"]) == []


def test_pool_blocks_for_several_channels_is_refused_in_one_line() -> None:
    a, b = str(REC / "whatif-gemma3.mcap"), str(REC / "gemma3.mcap")
    for extra in ([], ["--what-if", "+10%"], ["-f", "json"]):
        r = runner.invoke(app, ["report", a, b, "--pool-blocks", "600", *extra])
        assert r.exit_code == 2, (extra, r.stderr)
        assert r.stdout == ""
        (line,) = r.stderr.strip().splitlines()
        assert "--pool-blocks 600: one engine's pool, but the input has 2 channels" in line
        assert "--channel" in line
    # One of them picked: the shares of that pool.
    r = runner.invoke(
        app, ["report", a, b, "--pool-blocks", "600", "--channel", "tcp://127.0.0.1:7150", "-f",
              "json"],
    )  # fmt: skip
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["pool"]["peak_live_blocks"] == 593
    # Without --pool-blocks, K in blocks predicts every pool of the fleet.
    r = runner.invoke(app, ["report", a, b, "--what-if", "+60", "-f", "json"])
    assert r.exit_code == 0, r.stderr
    assert len(json.loads(r.stdout)["what_if"]) == 2
