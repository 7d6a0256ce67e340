"""Issue 21 Deliver 1: export's per-row ``meaning`` is the report's classification.

Counted per group, the ``meaning`` values of ``kvtool export`` equal ``kvtool report``'s
columns (one kernel pass gives both: kvtool/report/meaning.py), in every report mode, on
the three semantics recordings (partial entries, Mamba re-keys, hit announcements) and a
block-16 capture.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from typer.testing import CliRunner

from kvtool.cli import app
from kvtool.report.meaning import MEANINGS

ROOT = Path(__file__).parent.parent
SEMANTICS = Path(__file__).parent / "data" / "semantics"
RECORDINGS = [
    *(SEMANTICS / n / f"{n}.mcap" for n in ("b_gemma3_b64_h16", "c1_mamba_b576_h64_fi")),
    SEMANTICS / "d_gemma3_report_full" / "d_gemma3_report_full.mcap",
    ROOT / "recordings" / "gemma3.mcap",
]
runner = CliRunner()

# report column -> the meanings it counts
COLUMNS = {
    "blocks_stored": ("new_entry", "partial_primary", "recomputed", "stored_while_live"),
    "blocks_recomputed": ("recomputed",),
    "stored_while_live": ("stored_while_live",),
    "partial_extra_keys": ("partial_extra",),
    "rekeys": ("rekey",),
    "hit_announced_blocks": ("hit_announcement",),
    # blocks_removed still counts orphan removes (docs/SEMANTICS.md, "In the engine")
    "blocks_removed": ("eviction", "orphan"),
    "evicted_extra_keys": ("evicted_extra_key",),
    "partial_promotions": ("partial_promotion",),
    "rekey_removes": ("rekey_remove",),
    "checkpoints_discarded": ("checkpoint_discard",),
    "orphan_removes": ("orphan",),
}


def _args(path: Path) -> list[str]:
    groups = path.parent / "groups.json"
    return ["--groups", str(groups)] if groups.exists() else []


def _report(path: Path, mode: str) -> dict[str, Any]:
    args = ["report", str(path), *_args(path), "--report-mode", mode, "--format", "json"]
    result = runner.invoke(app, args)
    assert result.exit_code in (0, 3), result.stderr
    out: dict[str, Any] = json.loads(result.stdout)
    return out


def _export(path: Path, mode: str, out: Path) -> pl.DataFrame:
    args = ["export", str(path), *_args(path), "--report-mode", mode, "-o", str(out), "-q"]
    result = runner.invoke(app, args)
    assert result.exit_code in (0, 3), result.stderr
    return pl.read_parquet(out)


@pytest.mark.parametrize("mode", ["auto", "incremental"])
@pytest.mark.parametrize("path", RECORDINGS, ids=lambda p: p.stem)
def test_issue21_export_meaning_counts_are_the_report_columns(
    tmp_path: Path, path: Path, mode: str
) -> None:
    df = _export(path, mode, tmp_path / "t.parquet")
    assert df.schema["meaning"] == pl.String
    assert set(df["meaning"].drop_nulls().unique().to_list()) <= set(MEANINGS)
    counts = {
        (g, m): n
        for g, m, n in df.group_by("group_idx", "meaning").len().iter_rows()
        if m is not None
    }
    compared = 0
    for row in _report(path, mode)["by_group"]:
        g = row["group_idx"]
        for col, meanings in COLUMNS.items():
            assert sum(counts.get((g, m), 0) for m in meanings) == row[col], (path.stem, g, col)
            compared += 1
    assert compared >= 12
    # every clear is one row meaning "clear"; a store or remove the state saw has one too
    clears = df.filter(pl.col("type") == "AllBlocksCleared")
    assert clears["meaning"].to_list() == ["clear"] * clears.height
    assert df.filter(pl.col("type") != "AllBlocksCleared")["meaning"].null_count() == 0


def test_issue21_export_tells_hit_announcements_as_report_does(tmp_path: Path) -> None:
    """The report-mode-full run: export classifies announcements as ``report`` (it reads
    the events' parent and origin), and --report-mode incremental takes them as stores."""
    path = RECORDINGS[2]
    auto = _export(path, "auto", tmp_path / "a.parquet")
    inc = _export(path, "incremental", tmp_path / "i.parquet")
    per_group = auto.filter(pl.col("meaning") == "hit_announcement").group_by("group_idx").len()
    assert sorted(per_group["len"].to_list()) == [1580] * 6  # the truth's, every group
    assert inc.filter(pl.col("meaning") == "hit_announcement").height == 0
    # the rest of the table is the same
    assert auto.drop("meaning", "recomputed").equals(inc.drop("meaning", "recomputed"))


def test_issue21_meaning_does_not_depend_on_the_chunking() -> None:
    from kvtool.columns import ReadStats, iter_tables, make_annotator
    from kvtool.export import _report_rows

    path = RECORDINGS[1]
    groups = str(path.parent / "groups.json")
    got = []
    for chunk_bytes in (512, 1 << 24):
        ann, st = make_annotator([path], groups_file=groups), ReadStats()
        tables = iter_tables([path], stats=st, labels=False, chunk_bytes=chunk_bytes)
        chunks = (ann(df, st) for df in tables)
        parts = [rows["meaning"] for _c, rows in _report_rows(chunks, ann.group_kind)]
        assert len(parts) > (10 if chunk_bytes == 512 else 0)
        got.append(pl.concat(parts))
    assert got[0].equals(got[1])
    assert got[0].n_unique() >= 8
