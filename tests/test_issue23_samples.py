"""Issue 23: percentiles over the exact samples do not copy them (top/serve refreshes).

Each refresh of ``top`` and ``serve`` takes the report's percentiles over up to 1,000,000
exact lifetimes and gaps. They were concatenated and sorted per row first, which doubled
the traced memory for a moment (48 -> 92 MB under a 46k-batch burst) and put ``top`` over
its 300 MB target. Now each key's samples are gathered into one scratch buffer and
partitioned there; recompute distances are merged as counts, never expanded per sample.
The numbers are the same exact linear quantiles.
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import polars as pl

from kvtool.report.samples import LEVELS, Counts, Seconds

_LEVELS = pl.DataFrame(
    {
        "gkey": [0, 1, 2],
        "L_total": [0, 0, 0],
        "L_kind": ["full_attention", "full_attention", "sliding_window"],
        "L_window": [None, None, 64],
        "L_group": [0, 1, 2],
    },
    schema={
        "gkey": pl.UInt32,
        "L_total": pl.Int64,
        "L_kind": pl.String,
        "L_window": pl.Int64,
        "L_group": pl.Int64,
    },
)
_MEMBERS: dict[str, dict[object, list[int]]] = {
    "L_total": {0: [0, 1, 2]},
    "L_kind": {"full_attention": [0, 1], "sliding_window": [2]},
    "L_window": {None: [0, 1], 64: [2]},
    "L_group": {0: [0], 1: [1], 2: [2]},
}
_NAMES = ("p50", "p90", "p99")


def _want(gkeys: np.ndarray, values: np.ndarray, rows: list[int]) -> list[float]:
    v = values[np.isin(gkeys, rows)]
    got = pl.DataFrame({"v": v}).select(
        pl.col("v").quantile(q, "linear").round(6).alias(str(q)) for q in (0.5, 0.9, 0.99)
    )
    return list(got.row(0))


def _peak_during(fn: object) -> int:
    assert callable(fn)
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        fn()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak - before


def test_issue23_seconds_percentiles_are_exact_and_take_one_scratch_buffer() -> None:
    """1,000,000 samples in 200 chunks over 3 rows: every level's p50/p90/p99 equal polars'
    linear quantile of that key's samples, and taking them allocates one more copy of
    the values (8 MB) and a bounded block (under 1.5x in all). Before: ~5 copies (the
    concatenated rows, their sort order, the sorted rows, each key's concatenation and
    partition)."""
    rng = np.random.default_rng(23)
    s = Seconds()
    all_g, all_v = [], []
    for _ in range(200):
        g = rng.integers(0, 3, 5000).astype(np.int64)
        v = np.rint(rng.exponential(1.0, 5000) * 1e6) * 1e-6
        s.add(g, v, 1_000_000)
        all_g.append(g)
        all_v.append(v)
    gk, values = np.concatenate(all_g), np.concatenate(all_v)
    got: dict[str, pl.DataFrame] = {}
    peak = _peak_during(lambda: got.update(s.quantiles(_LEVELS, _MEMBERS, _NAMES, 3)))
    assert peak <= values.nbytes * 1.5, peak
    for col in LEVELS:
        for key, rows in _MEMBERS[col].items():
            row = (
                got[col]
                .filter(pl.col(col).is_null() if key is None else pl.col(col) == key)
                .select(_NAMES)
            )
            assert list(row.row(0)) == _want(gk, values, rows), (col, key)


def test_issue23_counts_merge_without_expanding_every_sample() -> None:
    """1,000,000 recompute distances of 300 values: the percentiles are those of every
    sample, and merging the pending ones allocates far less than one int per sample.
    Before: the kept counts were expanded back into 1,000,000 samples at each merge."""
    rng = np.random.default_rng(5)
    c = Counts()
    all_g, all_v = [], []
    for _ in range(199):
        g = rng.integers(0, 3, 5000).astype(np.int64)
        v = rng.integers(0, 300, 5000).astype(np.int64)
        c.add(g, v)
        all_g.append(g)
        all_v.append(v)
    c.frame()  # merged once: 995,000 samples as counts
    g = rng.integers(0, 3, 5000).astype(np.int64)
    v = rng.integers(0, 300, 5000).astype(np.int64)
    c.add(g, v)
    all_g.append(g)
    all_v.append(v)
    gk, values = np.concatenate(all_g), np.concatenate(all_v)
    got: dict[str, pl.DataFrame] = {}
    peak = _peak_during(lambda: got.update(c.quantiles(_LEVELS, _MEMBERS, _NAMES)))
    assert peak <= 1_000_000, peak
    assert int(c.counts.sum()) == len(values)
    for col in LEVELS:
        for key, rows in _MEMBERS[col].items():
            row = (
                got[col]
                .filter(pl.col(col).is_null() if key is None else pl.col(col) == key)
                .select(_NAMES)
            )
            want = _want(gk, values.astype(np.float64), rows)
            assert list(row.row(0)) == want, (col, key)
