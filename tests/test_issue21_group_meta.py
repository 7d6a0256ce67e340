"""Issue 21: ``--group-meta none=KIND`` gives an ungrouped stream (SGLang, vLLM < 0.21) a kind.

Without it every block of such a stream is ``unannotated``; with it the stores and removes
without ``group_idx`` take the kind (and window) given, in every command (report, replay
--annotate), merged with a recording's own metadata like the other ``--group-meta`` flags.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvtool.annotate import (
    ChannelRule,
    GroupTable,
    groups_from_list,
    merge_over,
    parse_group_flags,
)
from kvtool.cli import app
from kvtool.errors import MetadataError
from tests.conftest import capture_truth
from tests.recutil import write_capture

runner = CliRunner()


def test_issue21_group_meta_none_parses() -> None:
    table = parse_group_flags(["none=full_attention"])
    assert table.groups == {}
    assert table.ungrouped == ("full_attention", None)
    assert table.partial
    mixed = parse_group_flags(["0=full_attention", "NONE=sliding_window:64"])
    assert set(mixed.groups) == {0}
    assert mixed.ungrouped == ("sliding_window", 64)
    assert mixed.describe() == "0=full_attention none=sliding_window:64"


@pytest.mark.parametrize(
    ("flags", "match"),
    [
        (["none=ful_attention"], "not a KV cache kind"),
        (["none=full_attention", "none=mamba"], "group none is given twice"),
        (["none="], "expected IDX=KIND"),
        (["none=sliding_window:x"], "is not a non-negative integer"),
    ],
)
def test_issue21_group_meta_none_is_validated(flags: list[str], match: str) -> None:
    with pytest.raises(MetadataError, match=match):
        parse_group_flags(flags)


def test_issue21_group_meta_none_rule_and_merge() -> None:
    flags = parse_group_flags(["none=full_attention"])
    rule = ChannelRule(flags)
    assert rule.store(None) == ("full_attention", None)
    assert rule.group(None) == ("full_attention", None)
    # Without the flag an ungrouped store stays untouched, as before.
    assert ChannelRule(GroupTable({})).store(None) is None
    base = groups_from_list(capture_truth("gemma3")["group_metadata"], source="rec")
    merged = merge_over(flags, base)
    assert merged.groups == base.groups
    assert merged.ungrouped == ("full_attention", None)
    assert "(group none) over rec" in merged.source
    # A learned rule (no metadata) takes it too.
    assert ChannelRule(None, {}, ("mamba", None)).store(None, "x") == ("mamba", None)


def _json(*args: str) -> dict:
    result = runner.invoke(app, [*args, "--format", "json"])
    assert result.exit_code == 0, result.stderr
    out: dict = json.loads(result.stdout)
    return out


@pytest.mark.parametrize("name", ["sglang_full", "sglang_swa"])
def test_issue21_sglang_report_with_group_meta_none(tmp_path: Path, name: str) -> None:
    rec = tmp_path / f"{name}.mcap"
    write_capture(rec, name)
    plain = _json("report", str(rec))
    given = _json("report", str(rec), "--group-meta", "none=full_attention")
    # One row, now full attention, with every count of the unannotated row.
    (row,) = given["by_kind"]
    (was,) = plain["by_kind"]
    assert was["kind"] == "unannotated"
    assert row["kind"] == "full_attention"
    assert {k: v for k, v in row.items() if k != "kind"} == {
        k: v for k, v in was.items() if k != "kind"
    }
    assert given["totals"] == plain["totals"]
    assert row["blocks_removed"] == capture_truth(name)["block_removed"]["blocks"]
    assert given["source"]["group_metadata"] == ["--group-meta flags (none=full_attention)"]
    # The "kinds cannot be known" finding is gone: the kind was given.
    assert not [f for f in given["source"]["findings"] if "kinds cannot be known" in f]
    assert [f for f in plain["source"]["findings"] if "kinds cannot be known" in f]


def test_issue21_group_meta_none_bad_kind_is_one_line(tmp_path: Path) -> None:
    rec = tmp_path / "sglang_full.mcap"
    write_capture(rec, "sglang_full")
    result = runner.invoke(app, ["report", str(rec), "--group-meta", "none=ful_attention"])
    assert result.exit_code != 0
    (line,) = result.stderr.strip().splitlines()
    assert "--group-meta 'none=ful_attention': not a KV cache kind" in line
    assert "did you mean full_attention" in line


def test_issue21_grouped_stream_keeps_learning_with_only_none(tmp_path: Path) -> None:
    """Flags naming only ``none`` leave a grouped stream's groups to its own metadata."""
    rec = tmp_path / "gemma3.mcap"
    write_capture(rec, "gemma3")
    plain = _json("report", str(rec))
    given = _json("report", str(rec), "--group-meta", "none=mamba")
    assert given["by_kind"] == plain["by_kind"]


def test_issue21_replay_annotates_ungrouped_stores(tmp_path: Path) -> None:
    rec = tmp_path / "sglang_swa.mcap"
    write_capture(rec, "sglang_swa")
    result = runner.invoke(
        app,
        [
            "replay",
            str(rec),
            "--annotate",
            "--group-meta",
            "none=sliding_window:64",
            "--format",
            "jsonl",
        ],
    )
    assert result.exit_code == 0, result.stderr
    stores = [e for e in map(json.loads, result.stdout.splitlines()) if e["type"] == "BlockStored"]
    assert stores
    assert {(e["kv_cache_spec_kind"], e["kv_cache_spec_sliding_window"]) for e in stores} == {
        ("sliding_window", 64)
    }
    assert "none=sliding_window:64" in result.stderr


def test_issue19_no_group_precedence_is_one_rule() -> None:
    """A remove (or store) without ``group_idx``: the none=KIND flag, else the table's, else none.

    ``ChannelRule.no_group`` states it; ``Annotation.ungrouped_for`` (the columnar path)
    and ``Annotation.rule`` (the struct path) both ask it, so they cannot disagree.
    """
    from kvtool.annotate import Annotation

    flag = parse_group_flags(["none=mamba"])
    own = GroupTable({}, "rec", ungrouped=("full_attention", None))
    bare = GroupTable({}, "rec")
    cases = [
        # (given, the channel's table, what an event without group_idx gets)
        (flag, own, ("mamba", None)),  # the flag wins over the table's own
        (None, own, ("full_attention", None)),  # else the table's
        (flag, None, ("mamba", None)),  # a learned channel takes the flag
        (None, bare, None),  # else untouched (unannotated)
        (None, None, None),
    ]
    for given, table, want in cases:
        ann = Annotation(given, {"ch": table} if table is not None else {})
        assert ann.ungrouped_for("ch") == want, (given, table)
        rule = ann.rule("ch", 0)
        assert rule.group(None) == want, (given, table)  # a remove
        assert rule.store(None) == want, (given, table)  # a store
        assert rule.no_group() == want
    # A bare rule over a table: the table's own; an explicit flag beside it wins.
    assert ChannelRule(own).group(None) == ("full_attention", None)
    assert ChannelRule(own, ungrouped=("mamba", None)).group(None) == ("mamba", None)
