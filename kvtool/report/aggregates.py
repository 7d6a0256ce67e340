"""Report columns and their aggregates: counts, distinct hashes, peaks, lifetimes, timeline.

Everything here is mergeable: counts add; distinct hashes are sorted, duplicate-free
``Int64`` sets per report row, merged by sort (:func:`sorted_union`); lifetimes are kept
exactly up to :data:`EXACT_LIFETIMES`, then as a log histogram with
:data:`HIST_BINS_PER_OCTAVE` bins per doubling (relative error below 0.6 %), which adds bin
by bin; peaks come from the running sum of live-block deltas in stream order
(:class:`Peaks`); the timeline holds per (bucket, report row) sums and is only ever as
large as the buckets that saw events (:mod:`kvtool.report.timeline`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import polars as pl

from kvtool.columns import np
from kvtool.report.names import ADDITIVE as ADDITIVE
from kvtool.report.names import COLUMNS as COLUMNS
from kvtool.report.names import COUNT_COLUMNS as COUNT_COLUMNS
from kvtool.report.names import LIFETIME_COLUMNS as LIFETIME_COLUMNS
from kvtool.report.names import TIMELINE_COLUMNS as TIMELINE_COLUMNS
from kvtool.report.source import Finding, ReportSource

if TYPE_CHECKING:
    from numpy.typing import NDArray

MAX_TIMELINE_CELLS = 1_000_000
"""A timeline whose dense grid (buckets x kinds) would be larger lists only the
(bucket, kind) cells that hold events."""

EXACT_LIFETIMES = 1_000_000
"""Lifetimes kept exactly; past this many, a log histogram replaces them."""

HIST_BINS_PER_OCTAVE = 64

PLAUSIBLE_TS_MIN = 946_684_800.0
"""2000-01-01T00:00:00Z: a batch ``ts`` before it (or negative) is not a wall-clock time."""
PLAUSIBLE_TS_MAX = 1e11
"""About the year 5138: a ``ts`` beyond it is not a wall-clock time either."""


def plausible_ts() -> pl.Expr:
    """The batch ``ts`` when it is a plausible wall-clock time, else the receive time.

    NaN, infinities, negative values, values before 2000 and values past
    :data:`PLAUSIBLE_TS_MAX` would put a batch decades away from its neighbours (and
    stretch every timeline): such a batch is placed at its ``log_time``.

    Returns:
        A float-seconds expression over ``ts`` and ``log_time``.
    """
    ts = pl.col("ts")
    ok = ts.is_finite() & (ts >= PLAUSIBLE_TS_MIN) & (ts < PLAUSIBLE_TS_MAX)
    # A multiplication, not a division: polars turns division by a constant into a
    # multiplication by its reciprocal on some code paths and not others, which would
    # make the same log_time give a different float depending on the chunk's length.
    return pl.when(ok).then(ts).otherwise(pl.col("log_time").cast(pl.Float64) * 1e-9)


def finite(value: object) -> object:
    """JSON has no NaN or infinity: such floats (from a garbage ts) become None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [finite(v) for v in value]
    return value


@dataclass
class Report:
    """A finished report.

    Attributes:
        source: What was read: recordings, channels, metadata source, counts
            (:class:`~kvtool.report.source.ReportSource`; JSON: its ``to_dict()``).
        totals: One row with every column.
        by_kind: One row per kind (``unannotated``/``unattributed`` included).
        by_window: One row per sliding window (null: none or unknown).
        by_group: One row per (group_idx, kind, sliding_window).
        timeline: Per time bucket and kind (with ``every``), else None.
        findings: One line each for things that look wrong (:class:`Finding`: a ``str``
            that carries its ``kind``).
        damaged: True when input was skipped or a recording was damaged.
        every_s: The timeline bucket in seconds, or None.
        by_rank: One row per data-parallel rank (``dp_rank``), when asked for.
        by_channel: One row per channel (``channel``), when asked for.
        by_medium: One row per medium (``medium``; null: events without one), when asked
            for (:mod:`kvtool.report.tiers`).
        tier_transitions: Blocks stored into one medium while live in another, per
            (kind, from_medium, to_medium, direction), with ``by_medium``.
    """

    source: ReportSource
    totals: pl.DataFrame
    by_kind: pl.DataFrame
    by_window: pl.DataFrame
    by_group: pl.DataFrame
    timeline: pl.DataFrame | None = None
    findings: list[Finding] = field(default_factory=list)
    damaged: bool = False
    every_s: float | None = None
    by_rank: pl.DataFrame | None = None
    by_channel: pl.DataFrame | None = None
    by_medium: pl.DataFrame | None = None
    tier_transitions: pl.DataFrame | None = None

    def to_dict(self) -> dict[str, object]:
        """Return the JSON contract: source, totals, by_kind, by_window, by_group (+ timeline).

        Returns:
            Plain Python objects (numbers, strings, None).
        """
        out: dict[str, object] = {
            "source": self.source.to_dict(),
            "totals": self.totals.to_dicts()[0] if self.totals.height else {},
            "by_kind": self.by_kind.to_dicts(),
            "by_window": self.by_window.to_dicts(),
            "by_group": self.by_group.to_dicts(),
        }
        if self.by_rank is not None:
            out["by_rank"] = self.by_rank.to_dicts()
        if self.by_channel is not None:
            out["by_channel"] = self.by_channel.to_dicts()
        if self.by_medium is not None:
            out["by_medium"] = self.by_medium.to_dicts()
        if self.tier_transitions is not None:
            out["tier_transitions"] = self.tier_transitions.to_dicts()
        if self.timeline is not None:
            out["timeline"] = self.timeline.to_dicts()
        return finite(out)  # type: ignore[return-value]


# -- distinct hashes -------------------------------------------------------------------------


def sorted_union(parts: list[NDArray[Any]]) -> NDArray[Any]:
    """Return the sorted set union of int64 arrays: one sort, then drop repeats.

    (``numpy.unique`` hashes first in numpy 2, several times slower on these sizes.)

    Args:
        parts: The arrays.

    Returns:
        One sorted, duplicate-free int64 array.
    """
    # Stable (timsort) merges the already sorted parts instead of sorting from scratch.
    values = np.sort(np.concatenate(parts) if len(parts) > 1 else parts[0], kind="stable")
    if len(values) > 1:
        keep = np.empty(len(values), dtype=bool)
        keep[0] = True
        np.not_equal(values[1:], values[:-1], out=keep[1:])
        values = values[keep]
    return values


# -- lifetimes ---------------------------------------------------------------------------


def hist_bin(lifetime_s: pl.Expr) -> pl.Expr:
    """The log-histogram bin of a lifetime: -1 below 1 ns, else floor(64·log2(ns))."""
    ns = (lifetime_s * 1e9).round().clip(lower_bound=0)
    return (
        pl.when(ns < 1)
        .then(pl.lit(-1, pl.Int64))
        .otherwise((ns.log(2) * HIST_BINS_PER_OCTAVE).floor().cast(pl.Int64, strict=False))
    )


def hist_bins(lifetime_s: NDArray[Any]) -> NDArray[Any]:
    """:func:`hist_bin` on a float64 array, the same bins (float64; NaN where it gives null).

    numpy's ``log2`` and polars' ``log(2)`` may differ in the last bit, which moves a bin
    only where ``64·log2(ns)`` is within rounding of an integer (``ns`` a power of two, or
    nearly): those few values, and any that are not finite, are binned by :func:`hist_bin`
    itself.

    Args:
        lifetime_s: Lifetimes in seconds.

    Returns:
        The bin of each lifetime.
    """
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        ns = np.maximum(np.rint(lifetime_s * 1e9), 0.0)
        x = np.log2(ns) * HIST_BINS_PER_OCTAVE
        out: NDArray[Any] = np.floor(x)
        near = ~(np.abs(x - np.rint(x)) > 1e-6)  # also NaN and infinities
    out[ns < 1] = -1.0
    near &= ns >= 1
    if near.any():
        exact = pl.select(bin=hist_bin(pl.lit(pl.Series(lifetime_s[near], dtype=pl.Float64))))
        out[near] = exact["bin"].cast(pl.Float64).fill_null(float("nan")).to_numpy()
    return out


HIST_SCHEMA: dict[str, pl.DataType] = {"gkey": pl.UInt32(), "bin": pl.Int64(), "n": pl.Int64()}
"""The lifetime histogram as a frame: count ``n`` per (report row ``gkey``, ``bin``)."""


class Histogram:
    """The lifetime log histogram, dense: an int64 count per (gkey, bin).

    Bins are bounded (:data:`HIST_BINS_PER_OCTAVE` per doubling of nanoseconds, about
    4,300 up to a century), so a (gkey, bin + 1) array that grows as they come is small
    and adds a chunk with one ``bincount``. A bin :func:`hist_bin` makes null (a lifetime
    too large for a float in nanoseconds) is counted aside.
    """

    def __init__(self) -> None:
        self.counts: NDArray[Any] = np.zeros((0, 0), dtype=np.int64)
        self.nulls: dict[int, int] = {}

    def add(self, gkeys: NDArray[Any], bins: NDArray[Any], n: NDArray[Any] | None = None) -> None:
        """Count lifetimes (or ``n`` each) by gkey and bin (float, from :func:`hist_bins`).

        Args:
            gkeys: The report row of each.
            bins: The bin of each (NaN: null).
            n: How many each stands for (None: one).
        """
        gkeys = np.asarray(gkeys, dtype=np.int64)
        bad = np.isnan(bins)
        if bad.any():
            weights = np.ones(int(bad.sum()), dtype=np.int64) if n is None else n[bad]
            for g, k in zip(gkeys[bad].tolist(), weights.tolist(), strict=True):
                self.nulls[g] = self.nulls.get(g, 0) + int(k)
            ok = ~bad
            gkeys, bins = gkeys[ok], bins[ok]
            n = None if n is None else n[ok]
        if len(gkeys) == 0:
            return
        col = bins.astype(np.int64) + 1
        rows, cols = self.counts.shape
        need_r, need_c = max(rows, int(gkeys.max()) + 1), max(cols, int(col.max()) + 1)
        if (need_r, need_c) != (rows, cols):
            grown = np.zeros((need_r, need_c), dtype=np.int64)
            grown[:rows, :cols] = self.counts
            self.counts = grown
        flat = self.counts.reshape(-1)
        index = gkeys * need_c + col
        if len(flat) <= 4 * len(index) + (1 << 16):
            got = np.bincount(index, weights=n, minlength=len(flat))
            flat += got if n is None else np.rint(got).astype(np.int64)
        else:
            if n is None:
                keys, got = np.unique(index, return_counts=True)
            else:
                keys, inverse = np.unique(index, return_inverse=True)
                got = np.bincount(inverse.reshape(-1), weights=n).astype(np.int64)
            flat[keys] += got

    def frame(self) -> pl.DataFrame:
        """The (gkey, bin, n) rows that hold lifetimes (see :data:`HIST_SCHEMA`)."""
        g, c = np.nonzero(self.counts)
        out = pl.DataFrame(
            {"gkey": g, "bin": c.astype(np.int64) - 1, "n": self.counts[g, c]}, schema=HIST_SCHEMA
        )
        if self.nulls:
            out = pl.concat(
                [
                    out,
                    pl.DataFrame(
                        {"gkey": list(self.nulls), "bin": None, "n": list(self.nulls.values())},
                        schema=HIST_SCHEMA,
                    ),
                ]
            )
        return out

    @classmethod
    def from_frame(cls, frame: pl.DataFrame) -> Histogram:
        """The histogram of (gkey, bin, n) rows (a (gkey, bin) may repeat: counts add)."""
        h = cls()
        bins = frame["bin"].cast(pl.Float64).fill_null(float("nan")).to_numpy()
        h.add(
            frame["gkey"].cast(pl.Int64).to_numpy(),
            np.asarray(bins, dtype=np.float64),
            np.asarray(frame["n"].cast(pl.Int64).to_numpy(), dtype=np.int64),
        )
        return h


def hist_centre(b: pl.Expr) -> pl.Expr:
    """The lifetime (s) a histogram bin stands for: its geometric centre."""
    return (
        pl.when(b < 0)
        .then(0.0)
        .otherwise((2.0 ** ((b.cast(pl.Float64) + 0.5) / HIST_BINS_PER_OCTAVE)) / 1e9)
    )


def quantiles(
    samples: pl.DataFrame,
    col: str,
    names: tuple[str, ...] = LIFETIME_COLUMNS,
    value: str = "lifetime_s",
) -> pl.DataFrame:
    """Return p50/p90/p99 per level key from (``col``, ``value``, ``n``) rows.

    Exact values (every ``n`` is 1) use linear interpolation; histogram rows (bin
    centres with counts) give the first bin whose cumulative count reaches the quantile.

    Args:
        samples: The samples with their level key.
        col: The level key column.
        names: The three percentile columns.
        value: The samples' column.

    Returns:
        One row per key with the ``names`` columns.
    """
    if samples.height == 0:
        return pl.DataFrame(schema={col: samples.schema[col], **{c: pl.Float64 for c in names}})
    if samples["n"].max() == 1 and samples["n"].min() == 1:
        return samples.group_by(col).agg(
            pl.col(value).quantile(q, "linear").round(6).alias(name)
            for q, name in zip((0.5, 0.9, 0.99), names, strict=True)
        )
    s = samples.sort(col, value).with_columns(
        cumulative=pl.col("n").cum_sum().over(col), total=pl.col("n").sum().over(col)
    )
    return s.group_by(col).agg(
        pl.col(value).filter(pl.col("cumulative") >= pl.col("total") * q).first().alias(name)
        for q, name in zip((0.5, 0.9, 0.99), names, strict=True)
    )


# -- peaks ----------------------------------------------------------------------------------


@dataclass
class Peaks:
    """Live blocks now and at their highest, per level key (kind, window, group, total).

    Each chunk hands over its live-block deltas in stream order, each under a report row
    (gkey). A level (kind, window, group, total) partitions the report rows into its
    keys; per key, the running sum of its rows' deltas gives the chunk's highest level
    and its end. One stable sort by key per level and a segmented prefix sum serve every
    key of the level at once; levels that partition the chunk's rows alike share it.
    """

    levels: dict[str, dict[object, tuple[int, int]]] = field(
        default_factory=lambda: {"kind": {}, "window": {}, "group": {}, "total": {}}
    )

    def add(
        self,
        gkeys: NDArray[Any],
        deltas: NDArray[Any],
        rows: dict[int, tuple[int | None, str, int | None]],
    ) -> None:
        """Advance by one chunk's deltas.

        Args:
            gkeys: The report row of each delta (-1: none), in stream order.
            deltas: The live-block deltas.
            rows: gkey → (group_idx, kind, window) of every report row.
        """
        on = gkeys >= 0
        if not on.any():
            return
        gk = gkeys[on]
        d = deltas[on]
        present = np.flatnonzero(np.bincount(gk)).tolist()  # gkeys are small: no sort
        table = np.zeros(present[-1] + 1, dtype=np.int64)
        done: dict[tuple[int, ...], tuple[list[int], list[int]]] = {}
        for level in ("kind", "window", "group", "total"):
            if level == "kind":
                names: list[object] = [rows[g][1] for g in present]
            elif level == "window":
                names = [rows[g][2] for g in present]
            elif level == "group":
                names = list(present)
            else:
                names = [0] * len(present)
            index: dict[object, int] = {}
            codes = tuple(index.setdefault(k, len(index)) for k in names)
            got = done.get(codes)
            if got is None:
                got = done[codes] = _segment_peaks(table, present, codes, len(index), gk, d)
            highs, ends = got
            for key, j in index.items():
                now, peak = self.levels[level].get(key, (0, 0))
                self.levels[level][key] = (ends[j] + now, max(peak, highs[j] + now, now))


_MASKED_KEYS = 3
"""Up to this many keys, :func:`_segment_peaks` runs one masked prefix sum per key."""


def _segment_peaks(
    table: NDArray[Any],
    present: list[int],
    codes: tuple[int, ...],
    k: int,
    gk: NDArray[Any],
    d: NDArray[Any],
) -> tuple[list[int], list[int]]:
    """Highest running sum and sum of ``d`` per key (``codes``: key of each present gkey)."""
    if k == 1:
        run = np.cumsum(d)
        return [int(run.max())], [int(run[-1])]
    table[present] = codes
    key = table[gk].astype(np.uint16) if k <= 0xFFFF else table[gk]
    if k <= _MASKED_KEYS:
        # Few keys: one running sum per key with the other keys' deltas zeroed beats a
        # sort. Its maximum also sees the key's level before its first row (0) and
        # between its rows (its own last value): neither can raise the peak above the
        # key's level now (the caller's floor) or its own highest.
        highs_l: list[int] = []
        ends_l: list[int] = []
        zero = np.zeros((), dtype=d.dtype)
        for j in range(k):
            run = np.cumsum(np.where(key == j, d, zero))
            highs_l.append(int(run.max()))
            ends_l.append(int(run[-1]))
        return highs_l, ends_l
    order = np.argsort(key, kind="stable")
    sk = key[order]
    sd = d[order]
    starts = np.flatnonzero(np.concatenate(([True], sk[1:] != sk[:-1])))
    run = np.cumsum(sd)
    # Each key's own running sum is the overall one minus its value before the key's
    # first row: a constant per key, so it comes off the maximum and the end.
    before = run[starts] - sd[starts]
    highs = np.maximum.reduceat(run, starts) - before
    ends = run[np.append(starts[1:], len(sd)) - 1] - before
    out_h = [0] * k
    out_e = [0] * k
    for s, h, e in zip(sk[starts].tolist(), highs.tolist(), ends.tolist(), strict=True):
        out_h[s], out_e[s] = h, e
    return out_h, out_e


# -- timeline ---------------------------------------------------------------------------


CLOCKS = ("receive", "publish")
"""Clocks a timeline can read: the recorder's receive time or the batch ``ts``."""

DEFAULT_CLOCK = "receive"
"""The default clock: receive time, the clock of ``info`` and ``replay --since/--until``
(a recording replayed at full speed keeps its batches' publish ``ts``, squeezed into a
fraction of the time they were received over, or the other way round)."""


def check_clock(clock: str) -> str:
    """Return ``clock`` when it is one of :data:`CLOCKS`.

    Args:
        clock: ``receive`` or ``publish``.

    Returns:
        The clock.

    Raises:
        UsageError: Any other value.
    """
    if clock not in CLOCKS:
        from kvtool.errors import UsageError

        raise UsageError(f"--clock {clock!r}: expected receive or publish")
    return clock
