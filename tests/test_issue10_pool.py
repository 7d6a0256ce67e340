"""Issue 10 item 2, issue 19: --jobs threads decode and annotate, exactly; tables pickle cheaply."""

from __future__ import annotations

import multiprocessing
import pickle
import sys
import threading
from pathlib import Path

import polars as pl
import pytest

from kvtool.columns import (
    DecodedChunk,
    ReadStats,
    decode_chunk,
    iter_raw_chunks,
    iter_tables,
    make_annotator,
)
from kvtool.report import build_report
from kvtool.report.parallel import thread_decode_map
from tests.conftest import CAPTURES
from tests.test_report import record_capture


def _driver_annotated(
    rec: Path, flags: list[str] | None
) -> tuple[list[pl.DataFrame], dict[int, int]]:
    annotator = make_annotator([rec], group_flags=flags)
    st = ReadStats()
    tables = [
        annotator(t, st) for t in iter_tables([rec], stats=st, chunk_bytes=3000, labels=False)
    ]
    return tables, annotator.out_of_range


@pytest.mark.parametrize("flags", [None, ["0=full_attention"]])
@pytest.mark.parametrize("name", CAPTURES)
def test_issue10_pool_worker_annotated_chunks_equal_driver_annotated(
    name: str, flags: list[str] | None, tmp_path: Path
) -> None:
    rec = record_capture(name, tmp_path / "r.mcap")
    want, want_oor = _driver_annotated(rec, flags)
    annotation = make_annotator([rec], group_flags=flags).annotation
    decode, close = thread_decode_map(2)
    try:
        oor: dict[int, int] = {}
        got = list(
            iter_tables(
                [rec],
                chunk_bytes=3000,
                labels=False,
                decode_map=decode,
                annotation=annotation,
                out_of_range=oor,
            )
        )
    finally:
        close()
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.schema == w.schema
        assert g.equals(w)
    assert oor == want_oor


def test_issue10_pool_out_of_range_counted_from_workers(tmp_path: Path) -> None:
    rec = record_capture("gemma3", tmp_path / "r.mcap")
    flags = ["0=full_attention"]
    one = build_report([rec], chunk_bytes=3000, group_flags=flags).to_dict()
    two = build_report([rec], chunk_bytes=3000, group_flags=flags, jobs=2).to_dict()
    assert two == one
    _, oor = _driver_annotated(rec, flags)
    assert oor  # the flags leave some group out: the counts travel back from the workers


def test_issue10_pool_decoded_chunk_crosses_as_arrow_ipc(tmp_path: Path) -> None:
    rec = record_capture("gemma3", tmp_path / "r.mcap")
    raw = next(iter_raw_chunks([rec], stats=ReadStats()))
    d = decode_chunk(raw)
    assert d.table.height
    state = d.__getstate__()
    assert "table" not in state
    assert isinstance(state["_ipc"], bytes)
    back = pickle.loads(pickle.dumps(d, 5))
    assert back.table.schema == d.table.schema
    assert back.table.equals(d.table)
    assert (back.events, back.rows, back.problems) == (d.events, d.rows, d.problems)
    empty = pickle.loads(pickle.dumps(DecodedChunk(pl.DataFrame(), problems=["x"])))
    assert empty.table.width == 0
    assert empty.problems == ["x"]


def test_issue19_jobs_are_threads_that_change_no_process_wide_setting(tmp_path: Path) -> None:
    """``--jobs 2`` starts no process (no fork server, no workers) and leaves the GIL's
    switch interval and the collector as they were; its threads end with the report."""
    rec = record_capture("gemma3", tmp_path / "r.mcap")
    switch, gc_on = sys.getswitchinterval(), __import__("gc").isenabled()
    threads = set(threading.enumerate())
    seen: list[int] = []

    def progress(done: int, total: int) -> None:
        seen.append(len(multiprocessing.active_children()))

    one = build_report([rec], chunk_bytes=3000).to_dict()
    two = build_report([rec], chunk_bytes=3000, jobs=2, progress=progress).to_dict()
    assert two == one
    assert seen and max(seen) == 0  # no child process while the report ran
    assert multiprocessing.active_children() == []
    assert sys.getswitchinterval() == switch
    assert __import__("gc").isenabled() == gc_on
    assert set(threading.enumerate()) <= threads
