"""The report's tables (totals, by_kind, by_window, by_group) from the builder's state.

Pure polars: the per-gkey sums, samples, distinct hashes and peaks in, four DataFrames
out (:meth:`kvtool.report.builder.ReportBuilder.tables` hands its state here).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import polars as pl

from kvtool.columns import np
from kvtool.report.aggregates import ADDITIVE, COLUMNS, COUNT_COLUMNS, LIFETIME_COLUMNS
from kvtool.report.lifebound import CopyBound
from kvtool.report.names import (
    ALIASES,
    DISTANCE_COLUMNS,
    GAP_COLUMNS,
    QUANTILE_COLUMNS,
    RATIO_COLUMNS,
)
from kvtool.report.registry import BY_NAME
from kvtool.report.samples import LEVELS, Counts, Seconds

if TYPE_CHECKING:
    from numpy.typing import NDArray

    from kvtool.report.distinct import DistinctHashes


def report_tables(
    reg: pl.DataFrame,
    counts_array: NDArray[Any],
    live_end: NDArray[Any],
    samples: tuple[Seconds, Seconds, Counts],
    hashes: DistinctHashes,
    peak_levels: dict[str, dict[object, tuple[int, int]]],
    *,
    by_medium: bool,
    quantiles: bool = True,
    copy_bound: CopyBound | None = None,
    every_request_announces: bool = False,
) -> dict[str, pl.DataFrame]:
    """Return totals, by_kind, by_window, by_group as DataFrames.

    Args:
        reg: The report rows with their level keys (:func:`kvtool.report.rows.level_map`).
        counts_array: The :data:`ADDITIVE` sums, one row per gkey.
        live_end: Live blocks now per gkey (one per report row).
        samples: The lifetimes, recompute gaps and recompute distances.
        hashes: The distinct stored hashes.
        peak_levels: (live now, peak) per level key (:attr:`kvtool.report.aggregates.Peaks.levels`).
        by_medium: The rows are keyed by medium too.
        quantiles: Compute the percentile columns (False: they are null; a reader
            of the samples themselves, ``kvtool serve``, skips their cost).
        copy_bound: R8's lifetime bound (:mod:`kvtool.report.lifebound`; None: none).
        every_request_announces: ``--report-mode full``: hits are complete, ``hit_rate``
            is given (else null: default-mode requests hit without a word on the wire).

    Returns:
        The four tables (totals: one row).
    """
    size = reg.height
    life, gaps, distances = samples
    counts = pl.DataFrame(
        {
            "gkey": pl.Series(np.arange(len(counts_array)), dtype=pl.UInt32),
            **{c: counts_array[:, i] for i, c in enumerate(ADDITIVE)},
            "live_blocks_end": live_end[: len(counts_array)],
        }
    )
    base = (
        reg.join(counts, on="gkey", how="left")
        .with_columns(*[pl.col(c).fill_null(0) for c in (*ADDITIVE, "live_blocks_end")])
        .filter(
            # A key every row of which moved elsewhere (e.g. orphans without group_idx).
            pl.any_horizontal(
                pl.col(c) != 0
                for c in (
                    "store_events",
                    "blocks_stored",
                    "remove_events",
                    "blocks_removed",
                    "blocks_cleared",
                    "live_blocks_end",
                )
            )
        )
        if reg.height
        else reg.with_columns(
            *[pl.lit(0, pl.Int64).alias(c) for c in (*ADDITIVE, "live_blocks_end")]
        )
    )
    levels = reg.select("gkey", *LEVELS)
    members: dict[str, dict[object, list[int]]] = {}
    for _g, k, w, i in reg.select("group_idx", "kind_final", "sliding_window", "gkey").iter_rows():
        for level, key in (("L_kind", k), ("L_window", w), ("L_group", i), ("L_total", 0)):
            members.setdefault(level, {}).setdefault(key, []).append(i)
    # The distinct hashes (sorts of the stored hashes) are counted in a thread while
    # this one takes the percentiles (partitions): numpy runs both without the GIL,
    # so they share the cores instead of taking turns.
    with ThreadPoolExecutor(1, thread_name_prefix="kvtool-distinct") as pool:
        counted = pool.submit(hashes.per_level, members)
        quants = (
            [
                life.quantiles(levels, members, LIFETIME_COLUMNS, size),
                *([] if copy_bound is None else [copy_bound.quantiles(levels, members, size)]),
                gaps.quantiles(levels, members, GAP_COLUMNS, size),
                distances.quantiles(levels, members, DISTANCE_COLUMNS),
            ]
            if quantiles
            else []
        )
        distinct = counted.result()
    out: dict[str, pl.DataFrame] = {}
    for level, name in (
        ("total", "totals"),
        ("kind", "by_kind"),
        ("window", "by_window"),
        ("group", "by_group"),
    ):
        col = f"L_{level}"
        agg = base.group_by(col, maintain_order=True).agg(
            *[pl.col(c).sum().cast(pl.Int64) for c in (*ADDITIVE, "live_blocks_end")]
        )
        d = pl.DataFrame(
            {col: list(members.get(col, {})), "distinct_hashes": distinct[col]},
            schema={col: agg.schema[col], "distinct_hashes": pl.Int64},
        )
        level_peaks = peak_levels[level]
        peaks = pl.DataFrame(
            {col: list(level_peaks), "peak_live_blocks": [v[1] for v in level_peaks.values()]},
            schema={col: agg.schema[col], "peak_live_blocks": pl.Int64},
        )
        t = agg.join(d, on=col, how="left", nulls_equal=True).join(
            peaks, on=col, how="left", nulls_equal=True
        )
        for q in quants:
            t = t.join(q[col], on=col, how="left", nulls_equal=True)
        if not quantiles:
            t = t.with_columns(pl.lit(None, pl.Float64).alias(c) for c in QUANTILE_COLUMNS)
        t = t.with_columns(
            pl.col("distinct_hashes").fill_null(0),
            pl.col("peak_live_blocks").fill_null(0),
            *ratios(every_request_announces),
        )
        if level == "total":
            if t.height == 0:
                t = empty_row()
            out[name] = t.select(*COLUMNS)
        elif level == "kind":
            out[name] = t.rename({col: "kind"}).select("kind", *COLUMNS).sort("kind")
        elif level == "window":
            out[name] = (
                t.rename({col: "sliding_window"})
                .select("sliding_window", *COLUMNS)
                .sort("sliding_window", nulls_last=False)
            )
        else:
            more = ["medium"] if by_medium else []
            keys = reg.select(col, "group_idx", *more, kind="kind_final", sw="sliding_window")
            out[name] = (
                t.join(keys, on=col, how="left")
                .select("group_idx", "kind", pl.col("sw").alias("sliding_window"), *more, *COLUMNS)
                # One group may hold rows of several windows (several channels):
                # the window breaks the tie, so the order never depends on hashing.
                .sort(["group_idx", "kind", "sliding_window", *more], nulls_last=True)
            )
    return {name: with_aliases(frame) for name, frame in out.items()}


HIT_RATE_NEEDS = "hit_rate"
"""The ratio only a stream where every request announces its hits gives."""


def ratios(every_request_announces: bool) -> list[pl.Expr]:
    """The ``ratio`` columns, each derived from its summed parts (the registry's ``ratio_of``).

    Args:
        every_request_announces: Give ``hit_rate`` (else null).

    Returns:
        One expression per ratio column.
    """
    out = []
    for name in RATIO_COLUMNS:
        part, whole = BY_NAME[name].ratio_of
        expr = share(part, *whole).alias(name)
        if name == HIT_RATE_NEEDS and not every_request_announces:
            expr = pl.lit(None, pl.Float64).alias(name)
        out.append(expr)
    return out


def share(part: str, *whole: str) -> pl.Expr:
    """``part / sum(whole)`` rounded to 6 decimals; null where the sum is 0."""
    total = pl.sum_horizontal(*whole)
    return (
        pl.when(total > 0).then((pl.col(part) / total).round(6)).otherwise(pl.lit(None, pl.Float64))
    )


def empty_row() -> pl.DataFrame:
    """The totals of a report of nothing: 0 for every count, no ratio, no percentile."""
    return pl.DataFrame({c: [0] for c in COUNT_COLUMNS}).with_columns(
        *[pl.lit(None, pl.Float64).alias(c) for c in (*RATIO_COLUMNS, *QUANTILE_COLUMNS)]
    )


def with_aliases(frame: pl.DataFrame) -> pl.DataFrame:
    """``frame`` with each deprecated alias (``restored_blocks``) repeating its column last."""
    return frame.with_columns(
        pl.col(target).alias(alias) for alias, target in ALIASES.items() if target in frame.columns
    )


__all__ = ["HIT_RATE_NEEDS", "empty_row", "ratios", "report_tables", "share", "with_aliases"]
