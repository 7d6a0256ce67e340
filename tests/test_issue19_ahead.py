"""Issue 19: the builder fed through front.Ahead (fronts ahead in the prefetch thread, each
chunk's ``after`` on one more thread) gives the report a plain ``add`` loop gives.

Small chunks, so a recording is many chunks; the captures without ``group_idx`` (old vLLM)
make chunks that are not plain (added whole between the others), the rest plain ones.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kvtool.columns import ReadStats, TableAnnotator, iter_tables, prefetch
from kvtool.report.builder import ReportBuilder
from kvtool.report.front import Ahead, plain
from kvtool.report.run import finish_report
from tests.conftest import CAPTURES
from tests.test_report import record_capture


@pytest.mark.parametrize("name", CAPTURES)
def test_ahead_equals_the_add_loop(name: str, tmp_path: Path) -> None:
    rec = record_capture(name, tmp_path / f"{name}.mcap")
    stats = ReadStats()
    annotator = TableAnnotator()
    chunks = [
        annotator(c, stats) for c in iter_tables([rec], stats=stats, chunk_bytes=1500, labels=False)
    ]
    loop = ReportBuilder(10_000_000, annotator.group_kind)
    for df in chunks:
        loop.add(df)
    fed = ReportBuilder(10_000_000, annotator.group_kind)
    ahead = Ahead(fed)
    items = prefetch(ahead.produce(iter(chunks)))
    try:
        for item in items:
            ahead.add(item)
    finally:
        ahead.close()
        items.close()
    want = finish_report(loop, annotator, stats).to_dict()
    assert finish_report(fed, annotator, stats).to_dict() == want
    assert fed.registry == loop.registry


def test_some_captures_have_chunks_that_are_not_plain(tmp_path: Path) -> None:
    """The test above covers both kinds of chunk."""
    kinds = set()
    for name in CAPTURES:
        rec = record_capture(name, tmp_path / f"{name}.mcap")
        stats = ReadStats()
        annotator = TableAnnotator()
        for c in iter_tables([rec], stats=stats, chunk_bytes=1500, labels=False):
            kinds.add(plain(annotator(c, stats)))
    assert kinds == {True, False}
