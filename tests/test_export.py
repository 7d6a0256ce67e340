"""kvtool export: the flat table as Parquet (file or hive directory) and CSV, read back."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
from typer.testing import CliRunner

from kvtool.cli import app
from kvtool.columns import TABLE_SCHEMA
from tests.conftest import capture_truth
from tests.test_report import record_capture

runner = CliRunner()


@pytest.fixture
def rec(tmp_path: Path) -> Path:
    return record_capture("gemma3", tmp_path / "g.mcap")


def test_parquet_roundtrip(rec: Path, tmp_path: Path) -> None:
    out = tmp_path / "t.parquet"
    result = runner.invoke(app, ["export", str(rec), "-o", str(out)])
    assert result.exit_code == 0, result.stderr
    assert result.stdout == ""
    assert "exported 3419 rows" in result.stderr
    df = pl.read_parquet(out)
    truth = capture_truth("gemma3")
    assert list(df.columns) == list(TABLE_SCHEMA)
    assert df.height == truth["block_stored"]["total"]["blocks"] + truth["block_removed"][
        "total"]["blocks"] + truth["all_blocks_cleared"]
    stores = df.filter(pl.col("type") == "BlockStored")
    assert stores["tokens"].sum() == truth["block_stored"]["total"]["tokens"]
    by_kind = dict(stores.group_by("kind").agg(pl.len()).iter_rows())
    assert by_kind == {"full_attention": 315, "sliding_window": 1575}
    # Removes carry the kind of their group (learned from the annotated stores).
    removes = df.filter(pl.col("type") == "BlockRemoved")
    assert dict(removes.group_by("kind").agg(pl.len()).iter_rows()) == {
        "full_attention": 214, "sliding_window": 1314
    }


def test_export_with_groups_annotates_old_layout(tmp_path: Path) -> None:
    name = "gemma3.legacy-array-group-idx"
    r = record_capture(name, tmp_path / "r.mcap")
    groups = tmp_path / "g.json"
    groups.write_text(json.dumps(capture_truth(name)["group_metadata"]))
    out = tmp_path / "t.parquet"
    result = runner.invoke(app, ["export", str(r), "-o", str(out), "--groups", str(groups)])
    assert result.exit_code == 0, result.stderr
    df = pl.read_parquet(out)
    assert set(df.filter(pl.col("type") != "AllBlocksCleared")["kind"]) == {
        "full_attention", "sliding_window"
    }


def test_csv_roundtrip(rec: Path, tmp_path: Path) -> None:
    out = tmp_path / "t.csv"
    result = runner.invoke(app, ["export", str(rec), "-o", str(out), "-q"])
    assert result.exit_code == 0
    assert result.stderr == ""
    df = pl.read_csv(out)
    assert df.height == 3419
    assert df.columns == list(TABLE_SCHEMA)


def test_directory_is_hive_partitioned(tmp_path: Path) -> None:
    a = record_capture("gemma3", tmp_path / "a.mcap", endpoint="tcp://h:5557", dp_rank=0)
    # The first layout names no rank in its batches: the channel's rank applies.
    b = record_capture("full_only.legacy-array-initial.signed", tmp_path / "b.mcap",
                       endpoint="tcp://h:5558", dp_rank=1)
    out = tmp_path / "fleet"
    result = runner.invoke(app, ["export", str(a), str(b), "-o", str(out)])
    assert result.exit_code == 0, result.stderr
    parts = sorted(p.relative_to(out).parts[:2] for p in out.rglob("*.parquet"))
    assert ("channel=tcp%3A%2F%2Fh%3A5557", "dp_rank=0") in parts
    assert ("channel=tcp%3A%2F%2Fh%3A5558", "dp_rank=1") in parts
    df = pl.scan_parquet(out, hive_partitioning=True).collect()
    assert df.height == 3419 + 782
    counts = dict(df.group_by("channel").agg(pl.len()).iter_rows())
    assert counts == {"tcp://h:5557": 3419, "tcp://h:5558": 782}
    # The README's query: blocks stored and evicted per kind.
    q = (
        pl.scan_parquet(out, hive_partitioning=True)
        .group_by("kind", "type")
        .agg(blocks=pl.col("hash").count())
        .sort("kind", "type")
        .collect()
    )
    assert q.filter(pl.col("type") == "BlockStored")["blocks"].sum() == 1890 + 436


def test_refuses_to_overwrite(rec: Path, tmp_path: Path) -> None:
    out = tmp_path / "t.parquet"
    out.write_bytes(b"x")
    result = runner.invoke(app, ["export", str(rec), "-o", str(out)])
    assert result.exit_code == 2
    assert "--force" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    result = runner.invoke(app, ["export", str(rec), "-o", str(out), "--force"])
    assert result.exit_code == 0
    assert pl.read_parquet(out).height == 3419


def test_unknown_suffix(rec: Path, tmp_path: Path) -> None:
    result = runner.invoke(app, ["export", str(rec), "-o", str(tmp_path / "t.xlsx")])
    assert result.exit_code == 2
    assert "use .parquet, .csv or a directory" in result.stderr
