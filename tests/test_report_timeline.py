"""The ``--every`` timeline's ``blocks_recomputed``: its bins add up to the report's total.

Real recordings (recordings/ and tests/data), through the CLI: JSON, CSV and the table,
one process and ``--jobs 2``.
"""

from __future__ import annotations

import csv
import io
import json
from collections import Counter
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvtool.cli import app

ROOT = Path(__file__).resolve().parents[1]
RECORDINGS = sorted(
    [*(ROOT / "recordings").glob("*.mcap"), *(ROOT / "tests" / "data").rglob("*.mcap")]
)
runner = CliRunner()


def _report(path: Path, *args: str) -> str:
    result = runner.invoke(app, ["report", str(path), "--every", "1s", *args])
    # 3: a damaged recording is still reported (its readable part).
    assert result.exit_code in (0, 3), result.stderr
    return result.stdout


def test_issue19_recordings_are_found() -> None:
    assert len(RECORDINGS) >= 5


@pytest.mark.parametrize("jobs", ["1", "2"])
@pytest.mark.parametrize("path", RECORDINGS, ids=lambda p: p.name)
def test_issue19_timeline_recomputes_sum_to_the_total(path: Path, jobs: str) -> None:
    rep = json.loads(_report(path, "--format", "json", "--jobs", jobs))
    tl = rep["timeline"]
    assert all(isinstance(r["blocks_recomputed"], int) for r in tl)
    per_kind: Counter[str] = Counter()
    for r in tl:
        per_kind[r["kind"]] += r["blocks_recomputed"]
    for row in rep["by_kind"]:
        assert per_kind[row["kind"]] == row["blocks_recomputed"]
    assert sum(per_kind.values()) == rep["totals"]["blocks_recomputed"]


@pytest.mark.parametrize("path", RECORDINGS, ids=lambda p: p.name)
def test_issue19_timeline_recomputes_in_csv_and_table(path: Path) -> None:
    rep = json.loads(_report(path, "--format", "json"))
    rows = list(csv.DictReader(io.StringIO(_report(path, "--format", "csv"))))
    # One blocks_recomputed column: the timeline's rows fill the table column.
    header = next(csv.reader(io.StringIO(_report(path, "--format", "csv"))))
    assert header.count("blocks_recomputed") == 1
    timeline = [r for r in rows if r["table"] == "timeline"]
    assert [int(r["blocks_recomputed"]) for r in timeline] == [
        r["blocks_recomputed"] for r in rep["timeline"]
    ]
    total = next(r for r in rows if r["table"] == "by_kind" and r["kind"] == "total")
    assert sum(int(r["blocks_recomputed"]) for r in timeline) == int(total["blocks_recomputed"])
    table = _report(path)
    assert "recomputed" in table.split("timeline", 1)[1]
