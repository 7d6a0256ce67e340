"""Samples per report row and their percentiles: seconds (lifetimes, recompute gaps) and counts.

:class:`Seconds` keeps its samples exactly while there are at most ``limit`` of them
(:data:`~kvtool.report.aggregates.EXACT_LIFETIMES`; percentiles are then polars' linear
quantiles), then as the log histogram of :mod:`~kvtool.report.aggregates` (the first bin
whose cumulative count reaches the quantile). One process and the merge of units'
partial reports apply the same rule to the same total, so they give the same numbers.

:class:`Counts` keeps integer samples (recompute distances) exactly, always, as counts
per (report row, value): percentiles are the linear quantiles of the samples they stand
for, however many there are.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import polars as pl

from kvtool.columns import np
from kvtool.report.aggregates import Histogram, hist_bin, hist_bins, hist_centre, quantiles

if TYPE_CHECKING:
    from numpy.typing import NDArray

_QS = (0.5, 0.9, 0.99)
_BLOCK = 1 << 16
"""Exact samples joined per block when percentiles are taken (:meth:`Seconds._blocks`)."""

LEVELS = ("L_total", "L_kind", "L_window", "L_group")
"""The level columns a report row maps to (its key in totals, by_kind, by_window, by_group)."""

SecondsPart = tuple["pl.DataFrame | None", "pl.DataFrame | None", int]
"""A :class:`Seconds` in a partial report: exact (``gkey``, ``value``) rows or None, the
histogram (``gkey``, ``bin``, ``n``) or None, and how many samples."""

COUNTS_SCHEMA: dict[str, pl.DataType] = {"gkey": pl.UInt32(), "value": pl.Int64(), "n": pl.Int64()}
"""A :class:`Counts` as a frame: ``n`` samples of ``value`` per report row ``gkey``."""


def remap(frame: pl.DataFrame, ids: dict[int, int]) -> pl.DataFrame:
    """``frame`` with its ``gkey`` column renumbered through ``ids``."""
    return frame.with_columns(
        gkey=pl.col("gkey").replace_strict(list(ids), list(ids.values()), return_dtype=pl.UInt32)
    )


def linear_quantiles(values: NDArray[Any]) -> list[float]:
    """p50/p90/p99 of ``values`` with linear interpolation, as polars computes them.

    The two order statistics around each quantile come from one ``np.partition`` (linear
    time) instead of a sort; the interpolation is polars' ``quantile(q, "linear")``:
    ``(f - floor(f)) * (upper - lower) + lower`` with ``f = (n - 1) * q``.
    """
    return _partitioned_quantiles(np.array(values, copy=True))


def _partitioned_quantiles(buf: NDArray[Any]) -> list[float]:
    """:func:`linear_quantiles` of ``buf``, which it partitions in place (no copy)."""
    n = len(buf)
    where = [((n - 1) * q, math.floor((n - 1) * q), math.ceil((n - 1) * q)) for q in _QS]
    buf.partition(sorted({i for _f, lo, hi in where for i in (lo, hi)}))
    out = []
    for f, lo, hi in where:
        low, high = float(buf[lo]), float(buf[hi])
        out.append(low if low == high else (f - lo) * (high - low) + low)
    return out


def _frame(
    col: str,
    dtype: pl.DataType,
    names: tuple[str, ...],
    keys: list[object],
    rows: list[list[float]],
) -> pl.DataFrame:
    return pl.DataFrame(
        {
            col: pl.Series(keys, dtype=dtype),
            **{c: [r[j] for r in rows] for j, c in enumerate(names)},
        },
        schema={col: dtype, **{c: pl.Float64 for c in names}},
    ).with_columns(pl.col(c).round(6) for c in names)


class Seconds:
    """Samples in seconds per report row: exact up to ``limit``, then a log histogram."""

    def __init__(self) -> None:
        self.exact: list[tuple[NDArray[Any], NDArray[Any]]] = []
        self.n = 0
        self.hist: Histogram | None = None

    def add(self, gkeys: NDArray[Any], values: NDArray[Any], limit: int) -> None:
        """Add samples (finite, at least 0).

        Args:
            gkeys: The report row of each.
            values: The samples (seconds).
            limit: Past this many samples in all, the histogram replaces exact values.
        """
        if len(values) == 0:
            return
        if self.hist is None and self.n + len(values) <= limit:
            # Report rows fit in 32 bits: 12 bytes a kept sample instead of 16.
            self.exact.append((gkeys.astype(np.uint32, copy=False), values))
            self.n += len(values)
            return
        self.n += len(values)
        if self.hist is None:
            # Past the limit: the exact ones so far go into the histogram too.
            self.hist = Histogram()
            for g, v in self.exact:
                self.hist.add(g, hist_bins(v))
            self.exact = []
        self.hist.add(gkeys, hist_bins(values))

    def part(self) -> SecondsPart:
        """Return this as a partial report holds it (:data:`SecondsPart`)."""
        exact = None
        if self.exact:
            exact = pl.DataFrame(
                {
                    "gkey": pl.Series(np.concatenate([g for g, _v in self.exact]), dtype=pl.UInt32),
                    "value": np.concatenate([v for _g, v in self.exact]),
                },
                schema={"gkey": pl.UInt32, "value": pl.Float64},
            )
        return exact, self.hist.frame() if self.hist is not None else None, self.n

    @classmethod
    def merge(cls, parts: Sequence[tuple[SecondsPart, dict[int, int]]], limit: int) -> Seconds:
        """Merge units' samples (each with its row ids → the merged report rows).

        One process keeps samples exactly until it has seen more than ``limit``, then bins
        them all: the same rule on the merged count gives the same numbers.

        Args:
            parts: Each unit's :data:`SecondsPart` and row renumbering.
            limit: As for :meth:`add`.

        Returns:
            The merged samples.
        """
        out = cls()
        exact: list[pl.DataFrame] = []
        hists: list[pl.DataFrame] = []
        for (ex, hist, n), ids in parts:
            out.n += n
            if ex is not None and ex.height:
                exact.append(remap(ex, ids))
            if hist is not None:
                hists.append(remap(hist, ids))
        if hists or out.n > limit:
            binned = [
                f.select("gkey", bin=hist_bin(pl.col("value"))).group_by("gkey", "bin").len("n")
                for f in exact
            ]
            out.hist = Histogram.from_frame(
                pl.concat(
                    [h.select("gkey", "bin", pl.col("n").cast(pl.Int64)) for h in (*hists, *binned)]
                )
                .group_by("gkey", "bin")
                .agg(pl.col("n").sum())
            )
        elif exact:
            merged = pl.concat(exact)
            out.exact = [(merged["gkey"].to_numpy(), merged["value"].to_numpy())]
        return out

    @property
    def binned(self) -> bool:
        """The samples are a histogram (no longer exact)."""
        return self.hist is not None

    def _blocks(self) -> Iterator[tuple[NDArray[Any], NDArray[Any]]]:
        """The exact samples as (gkeys, values), consecutive small chunks joined.

        A live feed adds a chunk per refresh, a few batches each on a slow stream: joined
        into blocks of about :data:`_BLOCK` samples, the work per block, not per chunk, is
        what a percentile pass repeats (the copies are a block at a time, bounded).
        """
        gs: list[NDArray[Any]] = []
        vs: list[NDArray[Any]] = []
        n = 0
        for g, v in self.exact:
            gs.append(g)
            vs.append(v)
            n += len(v)
            if n >= _BLOCK:
                yield (np.concatenate(gs), np.concatenate(vs)) if len(gs) > 1 else (g, v)
                gs, vs, n = [], [], 0
        if gs:
            yield (np.concatenate(gs), np.concatenate(vs)) if len(gs) > 1 else (gs[0], vs[0])

    def _row_counts(self) -> NDArray[Any]:
        """The exact samples of each report row (``gkey``): how many."""
        counts = np.zeros(0, dtype=np.int64)
        for g, _v in self._blocks():
            c = np.bincount(g)
            if len(c) > len(counts):
                counts = np.pad(counts, (0, len(c) - len(counts)))
            counts[: len(c)] += c
        return counts

    def _gather(
        self, sets: list[tuple[int, ...]], counts: NDArray[Any], out: NDArray[Any]
    ) -> list[NDArray[Any]]:
        """Copy the exact samples of each set of report rows into its own slice of ``out``.

        The sets are disjoint (the keys of one level column), so together they hold at
        most every sample once: ``out`` has room for all of them.

        Returns:
            Per set, its slice of ``out`` (a view), filled.
        """
        lut = np.full(len(counts), -1, dtype=np.int64)
        ends = [0]
        for j, rows in enumerate(sets):
            lut[list(rows)] = j
            ends.append(ends[-1] + int(counts[list(rows)].sum()))
        pos = ends[:-1]
        for g, v in self._blocks():
            which = lut[g]
            for j in range(len(sets)):
                sel = which == j
                k = int(np.count_nonzero(sel))
                if k:
                    np.compress(sel, v, out=out[pos[j] : pos[j] + k])
                    pos[j] += k
        return [out[a:b] for a, b in itertools.pairwise(ends)]

    def quantiles(
        self,
        levels: pl.DataFrame,
        members: dict[str, dict[object, list[int]]],
        names: tuple[str, ...],
        rows: int,
    ) -> dict[str, pl.DataFrame]:
        """p50/p90/p99 (columns ``names``) per key of each level column.

        Args:
            levels: Per report row (``gkey``) its key in each level column (:data:`LEVELS`).
            members: Per level column, each key's report rows.
            names: The three percentile columns.
            rows: Report rows there are (unused: each row's samples are counted).

        Returns:
            Per level column, one row per key that has samples.
        """
        if self.hist is not None:
            frame = (
                self.hist.frame()
                .select("gkey", value=hist_centre(pl.col("bin")), n="n")
                .join(levels, on="gkey", how="left")
            )
            return {col: quantiles(frame, col, names, "value") for col in LEVELS}
        # One scratch buffer for every key: each key's samples are copied into it and
        # partitioned there in place, so a refresh (top, serve) holds the samples once
        # more at most, never the sorted and concatenated copies per row (issue 23).
        counts = self._row_counts()
        scratch = np.empty(int(counts.sum()), dtype=np.float64)
        out = {}
        for col in LEVELS:
            got_keys: list[object] = []
            got: list[list[float]] = []
            keyed: list[tuple[object, tuple[int, ...]]] = []
            for key, ids in members.get(col, {}).items():
                have = tuple(sorted(i for i in set(ids) if 0 <= i < len(counts) and counts[i]))
                if have:
                    keyed.append((key, have))
            done: dict[tuple[int, ...], list[float]] = {}
            todo = list(dict.fromkeys(have for _k, have in keyed))
            while todo:
                # Disjoint sets share one pass (a level's keys are); any other waits.
                taken: set[int] = set()
                sets = []
                for have in todo:
                    if taken.isdisjoint(have):
                        sets.append(have)
                        taken.update(have)
                todo = [h for h in todo if h not in sets]
                for have, buf in zip(sets, self._gather(sets, counts, scratch), strict=True):
                    done[have] = _partitioned_quantiles(buf)
            for key, have in keyed:
                got_keys.append(key)
                got.append(done[have])
            out[col] = _frame(col, levels.schema[col], names, got_keys, got)
        return out


_SPAN = 1 << 40
"""Packs (report row, value) into one int64: value < 2**40 (evictions of one pool)."""


class Counts:
    """Integer samples per report row, exactly: counts per (report row, value)."""

    def __init__(self) -> None:
        self.keys: NDArray[Any] = np.zeros(0, dtype=np.int64)
        self.counts: NDArray[Any] = np.zeros(0, dtype=np.int64)
        self._pending: list[NDArray[Any]] = []
        self._rows = 0

    def add(self, gkeys: NDArray[Any], values: NDArray[Any]) -> None:
        """Add samples (integers from 0 up to 2**40)."""
        if len(values) == 0:
            return
        self._pending.append(gkeys.astype(np.int64) * _SPAN + values.astype(np.int64))
        self._rows += len(values)
        if self._rows > max(1 << 18, len(self.keys)):
            self._compact()

    def _compact(self) -> None:
        if not self._pending:
            return
        # The pending samples are counted on their own and merged into the counts kept,
        # never expanded back into one sample each (issue 23: that was a copy of every
        # sample at each top/serve refresh).
        keys, counts = np.unique(np.concatenate(self._pending), return_counts=True)
        if len(self.keys):
            keys, where = np.unique(np.concatenate([self.keys, keys]), return_inverse=True)
            merged = np.zeros(len(keys), dtype=np.int64)
            np.add.at(merged, where, np.concatenate([self.counts, counts]))
            counts = merged
        self.keys, self.counts = keys, counts.astype(np.int64, copy=False)
        self._pending = []
        self._rows = 0

    def frame(self) -> pl.DataFrame:
        """The (gkey, value, n) rows (:data:`COUNTS_SCHEMA`)."""
        self._compact()
        g, v = np.divmod(self.keys, _SPAN)
        return pl.DataFrame({"gkey": g, "value": v, "n": self.counts}, schema=COUNTS_SCHEMA)

    @classmethod
    def merge(cls, parts: Sequence[tuple[pl.DataFrame, dict[int, int]]]) -> Counts:
        """Merge units' counts (each with its row ids → the merged report rows)."""
        out = cls()
        frames = [remap(f, ids) for f, ids in parts if f.height]
        if frames:
            f = pl.concat(frames).group_by("gkey", "value").agg(pl.col("n").sum())
            packed = f["gkey"].cast(pl.Int64).to_numpy() * _SPAN + f["value"].to_numpy()
            order = np.argsort(packed)
            out.keys = packed[order]
            out.counts = f["n"].to_numpy()[order]
        return out

    def quantiles(
        self,
        levels: pl.DataFrame,
        members: dict[str, dict[object, list[int]]],
        names: tuple[str, ...],
    ) -> dict[str, pl.DataFrame]:
        """p50/p90/p99 (columns ``names``, linear) per key of each level column.

        Args:
            levels: Per report row (``gkey``) its key in each level column.
            members: Per level column, each key's report rows.
            names: The three percentile columns.

        Returns:
            Per level column, one row per key that has samples.
        """
        self._compact()
        g, v = np.divmod(self.keys, _SPAN)
        out = {}
        for col in LEVELS:
            got_keys: list[object] = []
            got: list[list[float]] = []
            for key, ids in members.get(col, {}).items():
                on = np.isin(g, ids)
                if not on.any():
                    continue
                got_keys.append(key)
                got.append(_count_quantiles(v[on], self.counts[on]))
            out[col] = _frame(col, levels.schema[col], names, got_keys, got)
        return out


def _count_quantiles(values: NDArray[Any], counts: NDArray[Any]) -> list[float]:
    """:func:`linear_quantiles` of the samples ``counts[i]`` times ``values[i]``."""
    order = np.argsort(values, kind="stable")
    values, counts = values[order], counts[order]
    ends = np.cumsum(counts)  # sample index k is values[i] for ends[i-1] <= k < ends[i]
    n = int(ends[-1])
    out = []
    for q in _QS:
        f = (n - 1) * q
        lo, hi = math.floor(f), math.ceil(f)
        low = float(values[np.searchsorted(ends, lo, side="right")])
        high = float(values[np.searchsorted(ends, hi, side="right")])
        out.append(low if low == high else (f - lo) * (high - low) + low)
    return out


__all__ = [
    "COUNTS_SCHEMA",
    "LEVELS",
    "Counts",
    "Seconds",
    "SecondsPart",
    "linear_quantiles",
    "remap",
]
