"""Issue 20 item 1: export's per-event ``recomputed`` flag is the report's recompute count."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
from typer.testing import CliRunner

from kvtool.cli import app
from kvtool.columns import iter_annotated, make_annotator
from kvtool.export import _report_rows

runner = CliRunner()
ROOT = Path(__file__).resolve().parent.parent
SAMPLES = [
    *sorted((ROOT / "recordings").glob("*.mcap")),
    *sorted((ROOT / "tests" / "data" / "whatif").glob("*/*.mcap")),
]


def _report_by_group(path: Path) -> dict[object, int]:
    r = runner.invoke(app, ["report", str(path), "--by", "group", "-f", "json"])
    assert r.exit_code in (0, 3), r.stderr
    out: dict[object, int] = {}
    for row in json.loads(r.stdout)["by_group"]:
        out[row["group_idx"]] = out.get(row["group_idx"], 0) + row["blocks_recomputed"]
    return {g: n for g, n in out.items() if n}


def _flags_by_group(df: pl.DataFrame) -> dict[object, int]:
    sums = df.group_by("group_idx").agg(pl.col("recomputed").sum())
    return {g: int(n) for g, n in sums.iter_rows() if n}


@pytest.mark.parametrize("path", SAMPLES, ids=lambda p: p.name)
def test_export_recomputed_sums_to_the_reports_count(tmp_path: Path, path: Path) -> None:
    want = _report_by_group(path)
    for out in (tmp_path / "e.parquet", tmp_path / "e.csv"):
        r = runner.invoke(app, ["export", str(path), "-o", str(out)])
        assert r.exit_code in (0, 3), r.stderr
        df = pl.read_parquet(out) if out.suffix == ".parquet" else pl.read_csv(out)
        assert df.schema["recomputed"] == pl.Boolean
        assert _flags_by_group(df) == want
        # Only stores are recomputes.
        assert df.filter(pl.col("recomputed"))["type"].unique().to_list() in ([], ["BlockStored"])


def test_recomputed_flags_do_not_depend_on_the_chunking() -> None:
    path = ROOT / "recordings" / "gemma3.mcap"
    ann = make_annotator([path])
    parts = []
    chunks = iter_annotated([path], annotator=ann, chunk_bytes=512)
    for c, rows in _report_rows(chunks, ann.group_kind):
        parts.append(c.select("group_idx").with_columns(recomputed=rows["recomputed"]))
    small = pl.concat(parts)
    assert len(parts) > 10
    assert _flags_by_group(small) == _report_by_group(path)
    assert _flags_by_group(small)  # the sample has recomputes


def test_recomputed_flag_across_a_restart_and_a_clear(tmp_path: Path) -> None:
    """A restart starts a new cache (a store after it is no recompute); a clear does not."""
    import msgspec

    from kvtool.recording import RecordingWriter
    from tests.test_report import CLEAR, removed, stored

    enc = msgspec.msgpack.Encoder()
    fa = {"group": 0, "kind": "full_attention"}
    batches = [
        (0, [stored([1, 2, 3], **fa)]),
        (1, [removed([3], 0), stored([3], **fa)]),  # 3 recomputed
        (2, [CLEAR, stored([1], **fa)]),  # 1 recomputed (cleared before)
        (0, [stored([2, 3], **fa)]),  # restart: a new engine, first stores
    ]
    path = tmp_path / "restart.mcap"
    with RecordingWriter(path) as w:
        ch = w.add_channel("tcp://127.0.0.1:5557", "", 0)
        for i, (seq, events) in enumerate(batches):
            w.write(ch, seq, enc.encode([1.0 + i, events, 0]), log_time=1_000_000_000 * (i + 1))
    out = tmp_path / "e.parquet"
    assert runner.invoke(app, ["export", str(path), "-o", str(out)]).exit_code == 0
    df = pl.read_parquet(out).filter(pl.col("type") == "BlockStored")
    assert df["recomputed"].to_list() == [False, False, False, True, True, False, False]
    assert _flags_by_group(df) == _report_by_group(path) == {0: 2}
