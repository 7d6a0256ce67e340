"""Issue 19: a damaged or lost-batches finding names its recording, typed where it is read.

A path that begins another path (``a.mcap`` and ``a.mcap.1``; ``x`` and ``x: y``) must not
take the other's findings: nothing recovers the path from the line's text.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from kvtool.columns import ReadStats
from kvtool.columns.read import iter_raw_chunks
from kvtool.report import build_report
from kvtool.report.source import Finding

SAMPLE = Path(__file__).resolve().parents[1] / "recordings" / "full_only.mcap"


def _pair(tmp_path: Path, first: str, second: str) -> tuple[Path, Path]:
    """``first`` a whole copy of the sample, ``second`` one truncated at two thirds."""
    a, b = tmp_path / first, tmp_path / second
    shutil.copyfile(SAMPLE, a)
    data = SAMPLE.read_bytes()
    b.write_bytes(data[: len(data) * 2 // 3])
    return a, b


@pytest.mark.parametrize(("first", "second"), [("a.mcap", "a.mcap.1"), ("x", "x: y")])
@pytest.mark.parametrize("jobs", [1, 2])
def test_polish_damage_names_its_own_recording(
    tmp_path: Path, first: str, second: str, jobs: int
) -> None:
    whole, cut = _pair(tmp_path, first, second)
    rep = build_report([whole, cut], jobs=jobs)
    damaged = [f for f in rep.findings if isinstance(f, Finding) and f.kind == "damaged"]
    assert [f.path for f in damaged] == [str(cut)]
    assert damaged[0].text.startswith(f"{cut}: recording is truncated")
    assert rep.source.damaged == [damaged[0].text]
    assert all(type(t) is str for t in rep.source.damaged)  # plain lines in JSON


@pytest.mark.parametrize("order", [(0, 1), (1, 0)])
def test_polish_read_stats_are_typed(tmp_path: Path, order: tuple[int, int]) -> None:
    pair = _pair(tmp_path, "x", "x: y")
    paths = [pair[i] for i in order]
    st = ReadStats()
    for _ in iter_raw_chunks(paths, stats=st):
        pass
    assert [(f.kind, f.path) for f in st.damaged] == [("damaged", str(pair[1]))]
    assert st.lost == []
