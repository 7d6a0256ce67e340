"""The numpy lifetime histogram bins exactly as the polars expression does."""

from __future__ import annotations

import numpy as np
import polars as pl

from kvtool.report.aggregates import Histogram, hist_bin, hist_bins


def _reference(values: np.ndarray) -> np.ndarray:
    out = pl.select(b=hist_bin(pl.lit(pl.Series(values, dtype=pl.Float64)))).to_series()
    return np.asarray(out.cast(pl.Float64).fill_null(float("nan")).to_numpy())


def test_issue10_hist_bins_match_polars_on_edges_and_random() -> None:
    edges = [0.0, 1e-9, 0.5e-9, 1.5e-9, 2.5e-9, 4.9e-10, 5e-10, 5e-324, 2.2e-308, 1e-300]
    edges += [1e300, 1.7e299, 1e-12, 1.0, 3.0]
    powers = [2.0**k * 1e-9 for k in range(0, 1000)]
    near = [np.nextafter(p, 0.0) for p in powers[:100]] + [
        np.nextafter(p, 1.0) for p in powers[:100]
    ]
    bounds = [np.floor(2 ** (j / 64)) * 1e-9 for j in range(64 * 50)]
    bounds += [np.ceil(2 ** (j / 64)) * 1e-9 for j in range(64 * 50)]
    rng = np.random.default_rng(10)
    values = np.concatenate(
        [
            np.array(edges + powers + near + bounds),
            rng.exponential(1.0, 200_000),
            10 ** rng.uniform(-12, 12, 200_000),
            rng.integers(0, 1 << 40, 100_000) * 1e-9,
        ]
    )
    np.testing.assert_array_equal(hist_bins(values), _reference(values))


def test_issue10_histogram_frame_round_trip() -> None:
    h = Histogram()
    h.add(np.array([0, 2, 2, 0]), np.array([-1.0, 5.0, 5.0, float("nan")]))
    h.add(np.array([1]), np.array([7.0]), np.array([3]))
    rows = sorted(h.frame().rows(), key=str)
    assert rows == sorted([(0, -1, 1), (2, 5, 2), (1, 7, 3), (0, None, 1)], key=str)
    again = Histogram.from_frame(h.frame())
    assert sorted(again.frame().rows(), key=str) == rows
    assert h.frame().schema == {"gkey": pl.UInt32, "bin": pl.Int64, "n": pl.Int64}
