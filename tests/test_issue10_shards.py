"""Issue 10 item 2 / issue 19: ``--jobs`` threads decode the chunks of one read.

The caller reads; ``jobs`` threads decode and the tables come back in stream order.
Whatever the input -- damaged, with lost batches, several files, a selection -- the stats
and tables are the ones one thread makes, and every decoding thread ends with the read.
Decoding threads return only the columns asked for.
"""

from __future__ import annotations

import threading
from dataclasses import asdict
from pathlib import Path

import polars as pl
import pytest

from kvtool.columns import ReadStats, iter_tables
from kvtool.errors import RecordingError
from kvtool.report.names import BUILDER_INPUT
from kvtool.report.parallel import thread_decode_map
from kvtool.selection import make_selection
from tests.recutil import chunk_bodies, write_capture
from tests.test_report_options import two_ranks

_LEDGER = {"channels": [], "recovered": 0, "lost": 2, "lost_ranges": [[10, 11]], "restarts": 0}


def _read(paths: list[Path], jobs: int, **kw: object) -> tuple[list[pl.DataFrame], ReadStats]:
    st = ReadStats()
    seen: list[tuple[int, int]] = []
    if jobs == 1:
        tables = list(iter_tables(paths, stats=st, progress=lambda *a: seen.append(a), **kw))  # type: ignore[arg-type]
    else:
        decode, close = thread_decode_map(jobs)
        try:
            tables = list(
                iter_tables(
                    paths,
                    stats=st,
                    decode_map=decode,
                    progress=lambda *a: seen.append(a),
                    **kw,  # type: ignore[arg-type]
                )
            )
        finally:
            close()
    assert seen and seen[-1][0] == seen[-1][1]  # progress reached the end
    return tables, st


def _damaged(path: Path) -> Path:
    write_capture(path, "gemma3", chunk_size=2048)
    start, length = chunk_bodies(path)[3]
    data = bytearray(path.read_bytes())
    data[start + length // 2] ^= 0xFF  # one chunk fails its CRC; the others are read
    path.write_bytes(bytes(data))
    return path


def _inputs(tmp_path: Path, case: str) -> tuple[list[Path], dict[str, object]]:
    if case == "plain":
        write_capture(tmp_path / "a.mcap", "gemma3")
        return [tmp_path / "a.mcap"], {}
    if case == "lost":
        write_capture(tmp_path / "a.mcap", "gemma3", skip={10, 11}, ledger=_LEDGER)
        return [tmp_path / "a.mcap"], {}
    if case == "damaged":
        return [_damaged(tmp_path / "a.mcap")], {}
    if case == "two-files":
        write_capture(tmp_path / "a.mcap", "gemma3", dp_rank=0)
        write_capture(tmp_path / "b.mcap", "gemma3", dp_rank=1, endpoint="tcp://127.0.0.1:5558")
        return [tmp_path / "a.mcap", tmp_path / "b.mcap"], {}
    if case == "rank":  # batches of two ranks on one channel: selected once decoded
        return [two_ranks(tmp_path / "r.mcap")], {"select": make_selection(rank=["1"])}
    write_capture(tmp_path / "a.mcap", "gemma3", dp_rank=0)
    write_capture(tmp_path / "b.mcap", "gemma3", dp_rank=1, endpoint="tcp://127.0.0.1:5558")
    return [tmp_path / "a.mcap", tmp_path / "b.mcap"], {
        "select": make_selection(channel=["5558"], since="100ms")
    }


@pytest.mark.parametrize("jobs", [2, 3])
@pytest.mark.parametrize("case", ["plain", "lost", "damaged", "two-files", "rank", "selection"])
def test_threads_give_the_tables_and_stats_of_one_thread(
    case: str, jobs: int, tmp_path: Path
) -> None:
    paths, kw = _inputs(tmp_path, case)
    size = 100 if case == "rank" else 2500
    want, want_st = _read(paths, 1, chunk_bytes=size, labels=False, **kw)
    got, got_st = _read(paths, jobs, chunk_bytes=size, labels=False, **kw)
    assert len(want) > jobs  # every thread decodes some chunks
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.equals(w)
    assert asdict(got_st) == asdict(want_st)
    if case == "lost":
        assert got_st.lost
    if case == "damaged":
        assert got_st.damaged
    if case in ("rank", "selection"):
        assert got_st.unselected > 0


def test_decoding_threads_return_only_the_kept_columns(tmp_path: Path) -> None:
    write_capture(tmp_path / "a.mcap", "gemma3")
    decode, close = thread_decode_map(2)
    try:
        tables = list(
            iter_tables(
                [tmp_path / "a.mcap"],
                chunk_bytes=2500,
                labels=False,
                keep=BUILDER_INPUT,
                decode_map=decode,
            )
        )
    finally:
        close()
    assert len(tables) > 1
    assert all(set(t.columns) == {*BUILDER_INPUT, "type_code"} for t in tables)


def _decoders() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("kvtool-decode")]


def test_a_failing_read_names_the_problem_and_ends_the_threads(tmp_path: Path) -> None:
    decode, close = thread_decode_map(2)
    try:
        with pytest.raises(RecordingError, match=r"nothing\.mcap"):
            list(iter_tables([tmp_path / "nothing.mcap"], decode_map=decode))
    finally:
        close()
    assert _decoders() == []


def test_stopping_early_ends_every_decoding_thread(tmp_path: Path) -> None:
    write_capture(tmp_path / "a.mcap", "gemma3")
    decode, close = thread_decode_map(2)
    try:
        items = iter_tables([tmp_path / "a.mcap"], chunk_bytes=1000, decode_map=decode)
        assert next(items).height
        assert _decoders()
        items.close()  # what the report's prefetch thread does on Ctrl-C or an error
    finally:
        close()
    assert _decoders() == []
