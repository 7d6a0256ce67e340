"""Issue 10: the dense (numpy) path of annotate_table equals its join path on every table."""

from __future__ import annotations

import random
from pathlib import Path

import polars as pl
import pytest

from kvtool import columns
from kvtool.annotate import Annotation, GroupInfo, GroupTable
from kvtool.columns import (
    CLEARED,
    STORED,
    ChannelRef,
    annotate_table,
    iter_tables,
    make_annotator,
    recording_groups,
)
from kvtool.recording.reader import ChannelInfo
from tests.conftest import CAPTURES
from tests.replayutil import capture_recording

ODD = [0, 1, 2, 3, -1, -(2**31), 2**31 - 1, 2**24, -(2**63), 2**63 - 1, None]


def _both(
    df: pl.DataFrame, ann: Annotation, channels: dict[int, ChannelRef]
) -> tuple[pl.DataFrame, dict[int, int], pl.DataFrame | None, dict[int, int]]:
    """Annotate by the join path and by the dense path (None: it declined)."""
    meta, learned, covered = columns._annotation_rows(ann, channels)
    slow_oor: dict[int, int] = {}
    fast_oor: dict[int, int] = {}
    slow = columns._annotate_join(df, meta, learned, covered, channels, slow_oor)
    fast = columns._annotate_dense(df, meta, learned, covered, channels, fast_oor)
    return slow, slow_oor, fast, fast_oor


def _same(a: pl.DataFrame, b: pl.DataFrame) -> None:
    assert a.schema == b.schema
    assert a.equals(b)


@pytest.mark.parametrize("name", CAPTURES)
@pytest.mark.parametrize("flags", [None, ["0=full_attention", "1=sliding_window:64"]])
def test_issue10_annotate_dense_equals_join_on_captures(
    tmp_path: Path, name: str, flags: list[str] | None
) -> None:
    rec = capture_recording(tmp_path, name)
    st = columns.ReadStats()
    chunks = list(iter_tables([str(rec)], stats=st, chunk_bytes=4096))
    ann = make_annotator(recording_groups([str(rec)]), group_flags=flags).annotation
    for df in chunks:
        slow, slow_oor, fast, fast_oor = _both(df, ann, st.channels)
        assert fast is not None
        _same(slow, fast)
        assert fast_oor == slow_oor
        _same(annotate_table(df, ann, st.channels), slow)


def _channel(cid: int, name: str, rank: int | None) -> ChannelRef:
    info = ChannelInfo(id=cid, name=name, endpoint=name, topic="", dp_rank=rank)
    return ChannelRef(id=cid, recording="r.mcap", info=info)


def _random_table(
    rng: random.Random, n: int, n_channels: int, groups: list[int | None]
) -> pl.DataFrame:
    kinds = [None, None, "full_attention", "sliding_window", "mamba"]
    rows = {
        "channel_id": [rng.randrange(n_channels) for _ in range(n)],
        "dp_rank": [rng.choice([None, 0, 1, 7, -5, 2**40]) for _ in range(n)],
        "group_idx": [rng.choice(groups) for _ in range(n)],
        "type_code": [rng.choice([STORED, STORED, 1, CLEARED]) for _ in range(n)],
        "kind": [rng.choice(kinds) for _ in range(n)],
        "sliding_window": [rng.choice([None, 8, 4096]) for _ in range(n)],
        "block_index": [rng.choice([0, 0, 1, 2]) for _ in range(n)],
    }
    schema = {
        "channel_id": pl.UInt32,
        "dp_rank": pl.Int64,
        "group_idx": pl.Int64,
        "type_code": pl.UInt8,
        "kind": pl.String,
        "sliding_window": pl.Int64,
        "block_index": pl.Int32,
    }
    return pl.DataFrame(rows, schema=schema)


@pytest.mark.parametrize("seed", range(40))
def test_issue10_annotate_dense_equals_join_on_random_tables_with_odd_groups(seed: int) -> None:
    rng = random.Random(seed)
    n_channels = rng.randint(1, 4)
    names = [f"tcp://127.0.0.1:{5000 + c}" for c in range(n_channels)]
    channels = {c: _channel(c, names[c], rng.choice([None, 0, 3])) for c in range(n_channels)}
    small = seed % 2 == 0  # half the seeds keep every key small: the dense path must run
    key_groups = [0, 1, 2, 5] if small else [g for g in ODD if g is not None]
    row_groups: list[int | None] = list(ODD) if seed % 4 else [0, 1, 2, 5]
    tables: dict[str, GroupTable] = {}
    learned: dict[tuple[str, int | None, int], tuple[str, int | None]] = {}
    for name in names:
        picked = rng.sample(key_groups, rng.randint(0, len(key_groups)))
        if rng.random() < 0.5:
            infos = {
                g: GroupInfo(
                    g,
                    rng.choice(["full_attention", "sliding_window"]),
                    None,
                    rng.choice([None, 64]),
                )
                for g in picked
            }
            tables[name] = GroupTable(infos, "test")
        else:
            for g in picked:
                rank = rng.choice([None, 0, 1, 3, 7])
                learned[(name, rank, g)] = (
                    rng.choice(["mamba", "full_attention"]),
                    rng.choice([None, 16]),
                )
    ann = Annotation(tables=tables, learned=learned)
    df = _random_table(rng, 300, n_channels, row_groups)
    slow, slow_oor, fast, fast_oor = _both(df, ann, channels)
    if small:
        assert fast is not None
    if fast is not None:
        _same(slow, fast)
        assert fast_oor == slow_oor
    oor: dict[int, int] = {}
    _same(annotate_table(df, ann, channels, oor), slow)
    assert oor == slow_oor
    # Cleared rows are never touched.
    cleared = pl.col("type_code") == CLEARED
    _same(slow.filter(cleared), df.filter(cleared))


@pytest.mark.parametrize(
    "keys", [[2**63 - 1], [-(2**63)], [2**31 - 1, 2**31 - 3], [-1, 0], [-(2**63), -(2**63) + 2]]
)
@pytest.mark.parametrize("learned", [False, True])
def test_issue10_annotate_dense_handles_extreme_keys(keys: list[int], learned: bool) -> None:
    name = "tcp://127.0.0.1:5557"
    channels = {0: _channel(0, name, None), 1: _channel(1, name + "#t", 2)}
    if learned:
        ann = Annotation(learned={(name, r, g): ("mamba", 16) for g in keys for r in (None, 1)})
    else:
        infos = {g: GroupInfo(g, "sliding_window", None, 64) for g in keys}
        ann = Annotation(tables={name: GroupTable(infos, "test")})
    df = _random_table(random.Random(len(keys)), 200, 2, [*ODD, *keys, *keys])
    slow, slow_oor, fast, fast_oor = _both(df, ann, channels)
    assert fast is not None
    _same(slow, fast)
    assert fast_oor == slow_oor
    assert learned or not slow.equals(df)  # metadata rows were annotated
