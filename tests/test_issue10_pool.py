"""Issue 10 item 2: --jobs processes read, decode and annotate, and ship tables cheaply, exactly."""

from __future__ import annotations

import pickle
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
from kvtool.report.parallel import shard_map
from kvtool.report.procs import keep_big_buffers
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
    shards, close = shard_map(2)
    try:
        oor: dict[int, int] = {}
        got = list(
            iter_tables(
                [rec],
                chunk_bytes=3000,
                labels=False,
                shard_map=shards,
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


def test_issue10_pool_keeps_big_buffers_on_glibc() -> None:
    import platform

    assert keep_big_buffers() == (platform.libc_ver()[0] == "glibc")
