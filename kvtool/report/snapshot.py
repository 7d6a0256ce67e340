"""A report builder's samples and state size as of now, for live readers (``kvtool serve``).

A live reader takes a :class:`kvtool.report.ReportBuilder`'s report rows from its
``tables()``; the samples behind its lifetime and recompute-gap percentiles are read here,
as plain arrays, so that no reader reaches into the builder's sample objects. Each read
is a snapshot: later ``add`` calls do not change it (the exact samples are immutable
arrays the builder only appends, the binned ones are copied).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import polars as pl

from kvtool.report.aggregates import hist_centre

if TYPE_CHECKING:
    from numpy.typing import NDArray

    from kvtool.report.builder import MediumRow, ReportBuilder, ReportRow
    from kvtool.report.samples import Seconds

SAMPLE_FAMILIES = ("lifetime_s", "recompute_gap_s")
"""The sample families a builder keeps in seconds: block lifetimes (store to remove) and
recompute gaps (removal to re-store)."""


@dataclass(frozen=True)
class SecondsSnapshot:
    """One family's samples in seconds, per report row (``gkey``).

    Attributes:
        exact: While the builder keeps samples exactly: (gkeys, values) array pairs, in
            the order added (a reader that took the first k may take only the rest later);
            empty once binned.
        binned: Past the exact limit: (gkey, value, n) arrays -- ``n`` samples stand for
            each bin's value (its geometric centre); None while exact.
        n: Samples in all.
    """

    exact: tuple[tuple[NDArray[Any], NDArray[Any]], ...]
    binned: tuple[NDArray[Any], NDArray[Any], NDArray[Any]] | None
    n: int


@dataclass(frozen=True)
class BuilderSamples:
    """A builder's report rows and the samples of each family (:data:`SAMPLE_FAMILIES`).

    Attributes:
        rows: Each report row's key (``group_idx``, ``kind``, ``sliding_window``, and
            ``medium`` when the builder splits by medium) -> its ``gkey``.
        families: Family name -> its samples.
        keys: Keys the live-block state holds (live, and gone but remembered).
        forgotten: Keys it forgot (a builder with ``max_keys``): their re-stores count
            as first stores, not recomputes.
        horizon_s: How far back, in seconds of the stream (publish clock), a removal is
            still remembered: from the newest forgotten removal (or the first row) to
            the last row; None before any row.
    """

    rows: Mapping[ReportRow | MediumRow, int]
    families: Mapping[str, SecondsSnapshot]
    keys: int = 0
    forgotten: int = 0
    horizon_s: float | None = None


def seconds_snapshot(samples: Seconds) -> SecondsSnapshot:
    """Return a snapshot of samples in seconds.

    Args:
        samples: A :class:`kvtool.report.samples.Seconds`.

    Returns:
        Its samples now.
    """
    binned = None
    if samples.hist is not None:
        f = samples.hist.frame().select(
            pl.col("gkey").cast(pl.Int64), v=hist_centre(pl.col("bin")), n=pl.col("n")
        )
        binned = (f["gkey"].to_numpy(), f["v"].to_numpy(), f["n"].to_numpy())
    return SecondsSnapshot(tuple(samples.exact), binned, samples.n)


def builder_samples(builder: ReportBuilder) -> BuilderSamples:
    """Return a builder's report rows and samples now.

    Args:
        builder: The builder (fed in this thread).

    Returns:
        Its rows and its samples per family.
    """
    st = builder.kstate
    horizon = None
    if builder.last_ts is not None:
        since = st.forgotten_ts if st.forgotten_ts is not None else builder.first_ts
        horizon = max(0.0, builder.last_ts - (since if since is not None else builder.last_ts))
    return BuilderSamples(
        rows=dict(builder.registry),
        families={
            "lifetime_s": seconds_snapshot(builder.life),
            "recompute_gap_s": seconds_snapshot(builder.gaps),
        },
        keys=st.keys,
        forgotten=st.forgotten,
        horizon_s=horizon,
    )


__all__ = [
    "SAMPLE_FAMILIES",
    "BuilderSamples",
    "SecondsSnapshot",
    "builder_samples",
    "seconds_snapshot",
]
