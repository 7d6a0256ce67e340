"""Issue 21: SGLang as a first-class source — its real captures are tests.

``sglang_full`` and ``sglang_swa`` (tests/data/captures) were produced by SGLang 0.5.23's own
``UnifiedRadixCache`` and ``ZmqEventPublisher``: signed hashes, no group or kind fields,
coalesced stores and removes, a ``cache_salt`` field, an ``AllBlocksCleared`` at seq 0, and
(full + sliding window) no event when the sliding-window part alone is evicted. Every count
of their ``.truth.json`` that kvtool reports must equal ``kvtool report`` / ``kvtool info``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvtool.capture import Recorder, Source
from kvtool.cli import app
from kvtool.recording import open_recording
from tests.conftest import SGLANG_CAPTURES, capture_messages, capture_truth
from tests.peer import Peer
from tests.recutil import write_capture
from tests.semantics_rows import run_recording, summary

runner = CliRunner()
SECOND = 1_000_000_000


def cli_json(*args: str) -> dict:
    result = runner.invoke(app, [*args, "--format", "json"])
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def expected(name: str) -> dict[str, int]:
    """The truth file's counts in kvtool's report column names."""
    t = capture_truth(name)
    return {
        "store_events": t["events_by_type"]["BlockStored"],
        "remove_events": t["events_by_type"]["BlockRemoved"],
        "blocks_stored": t["block_stored"]["blocks"],
        "tokens_stored": t["block_stored"]["tokens"],
        "blocks_removed": t["block_removed"]["blocks"],
        "blocks_cleared": t["blocks_cleared"],
        "live_blocks_end": t["end_state"]["live_blocks_multiset"],
        "peak_live_blocks": t["peak_live_blocks"],
        "distinct_hashes": t["distinct_block_hashes_stored"],
        "restored_blocks": t["restored_blocks"],
        "orphan_removes": t["orphan_removes"],
    }


def test_issue21_sglang_captures_are_present() -> None:
    assert SGLANG_CAPTURES == ["sglang_full", "sglang_swa"]
    for name in SGLANG_CAPTURES:
        assert capture_truth(name)["sglang_version"] == "0.5.23"


@pytest.mark.parametrize("name", SGLANG_CAPTURES)
def test_issue21_sglang_report_equals_truth(tmp_path: Path, name: str) -> None:
    rec = tmp_path / f"{name}.mcap"
    write_capture(rec, name)
    report = cli_json("report", str(rec))
    want = expected(name)
    got = {k: report["totals"][k] for k in want}
    assert got == want
    # No group or kind on SGLang's wire: one unannotated row holds everything.
    (row,) = report["by_kind"]
    assert row["kind"] == "unannotated"
    assert {k: row[k] for k in want} == want


@pytest.mark.parametrize("name", SGLANG_CAPTURES)
def test_issue21_sglang_info_equals_truth(tmp_path: Path, name: str) -> None:
    rec = tmp_path / f"{name}.mcap"
    write_capture(rec, name)
    info = cli_json("info", str(rec))
    t = capture_truth(name)
    assert info["batches"] == t["num_batches"]
    assert info["events"] == {k: v for k, v in t["events_by_type"].items() if v}
    assert sum(info["events"].values()) == t["num_events"]
    assert info["blocks_stored"] == t["block_stored"]["blocks"]
    assert info["tokens_stored"] == t["block_stored"]["tokens"]
    assert info["blocks_removed"] == t["block_removed"]["blocks"]
    assert info["skipped_events"] == 0 and info["undecodable"] == 0
    (ch,) = info["channels"]
    assert (ch["seq_first"], ch["seq_last"]) == (t["wire"]["seq_first"], t["wire"]["seq_last"])


@pytest.mark.parametrize("name", SGLANG_CAPTURES)
def test_issue21_sglang_model_equals_truth(tmp_path: Path, name: str) -> None:
    """The reference model reads SGLang's stream as one ungrouped pool: same counts."""
    rec = tmp_path / f"{name}.mcap"
    write_capture(rec, name)
    (row,) = summary(run_recording(rec, copy_rule="oldest"))["by_group"]
    assert row["group_idx"] is None
    want = expected(name)
    mine = {k: row[k] for k in want if k != "restored_blocks"}
    mine["restored_blocks"] = row["stored_while_live"]
    assert mine == want
    assert row["hit_announced_blocks"] == 0 and row["partial_extra_keys"] == 0


@pytest.mark.zmq
@pytest.mark.parametrize("name", SGLANG_CAPTURES)
def test_issue21_sglang_recorded_live_byte_identical(tmp_path: Path, name: str) -> None:
    """SGLang's bytes through real ZeroMQ sockets on loopback, then the report."""
    msgs = capture_messages(name)
    out = tmp_path / f"{name}.mcap"
    with Peer(msgs) as peer:
        rec = Recorder(
            out,
            [Source(peer.endpoint, peer.replay_endpoint)],
            duration_ns=20 * SECOND,
            max_batches=len(msgs),
        )
        res = rec.run(handle_signals=False)
    assert res.stop_reason == "max_batches"
    assert res.stats.lost == res.stats.gaps == res.stats.undecodable == 0
    with open_recording(out) as r:
        got = [(m.seq, m.data) for m in r.messages()]
    assert got == [(s, p) for _, s, p in msgs]
    report = cli_json("report", str(out))
    want = expected(name)
    assert {k: report["totals"][k] for k in want} == want


@pytest.mark.parametrize("name", SGLANG_CAPTURES)
def test_issue21_sglang_stream_given_a_kind_with_group_meta_none(tmp_path: Path, name: str) -> None:
    # An ungrouped stream can be given a kind (--group-meta none=KIND): one row of that
    # kind, the same counts as the unannotated row it replaces; with --jobs 2 as well.
    rec = tmp_path / f"{name}.mcap"
    write_capture(rec, name)
    want = expected(name)
    for extra in ((), ("--jobs", "2")):
        report = cli_json("report", str(rec), "--group-meta", "none=full_attention", *extra)
        (row,) = report["by_kind"]
        assert row["kind"] == "full_attention"
        assert {k: row[k] for k in want} == want
    windowed = cli_json("report", str(rec), "--group-meta", "none=sliding_window:4096")
    (row,) = windowed["by_window"]
    assert row["sliding_window"] == 4096


def test_issue21_group_meta_none_is_checked(tmp_path: Path) -> None:
    rec = tmp_path / "s.mcap"
    write_capture(rec, SGLANG_CAPTURES[0])
    flags = ["--group-meta", "none=full_attention", "--group-meta", "none=mamba"]
    result = runner.invoke(app, ["report", str(rec), *flags])
    assert result.exit_code == 2, result.output
    assert "group none is given twice" in result.stderr
    bad = runner.invoke(app, ["report", str(rec), "--group-meta", "none=ful_attention"])
    assert bad.exit_code == 2
    assert "not a KV cache kind" in bad.stderr
