"""A builder's state as a partial report, and partial reports merged into a builder.

The units of work (``--jobs``, ``--ray``; :mod:`kvtool.report.parallel`) each hand their
builder's state over as a :class:`~kvtool.report.partial.PartialReport`
(:func:`to_partial`); the driver merges them into one builder (:func:`fill_from_partials`)
exactly: the units share no stream.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import polars as pl

from kvtool.columns import ChannelRef, ReadStats, TableAnnotator, np
from kvtool.report import klive, lifetimes
from kvtool.report.aggregates import ADDITIVE, EXACT_LIFETIMES, sorted_union
from kvtool.report.arrays import I64, ReportRow
from kvtool.report.lifebound import CopyBound
from kvtool.report.partial import PartialReport, PeakLog, merge_peaks
from kvtool.report.rows import gkey_of
from kvtool.report.samples import remap
from kvtool.report.timeline import TIMELINE_SUMS

if TYPE_CHECKING:
    from numpy.typing import NDArray

    from kvtool.report.builder import ReportBuilder


def to_partial(
    b: ReportBuilder, stats: ReadStats, annotator: TableAnnotator, inputs: list[int]
) -> PartialReport:
    """A builder's state as a partial report (keyed by report row, not gkey).

    Args:
        b: The builder.
        stats: The read's stats.
        annotator: The annotator used.
        inputs: The recordings' indices in the command line.

    Returns:
        The partial report (:mod:`kvtool.report.partial`).
    """
    if b.by_medium:
        raise ValueError("a builder made with by_medium has no partial report")
    b.hashes.merge()
    log = b.peak_log if b.peak_log is not None else PeakLog()
    counts = {
        g: tuple(int(v) for v in row)
        for g, row in enumerate(klive.counts_now(b.counts, b.kstate).tolist())
    }
    ends = b.live_now(len(b.registry))
    live_end = {g: int(n) for g, n in enumerate(ends.tolist()) if n}
    return PartialReport(
        inputs=inputs,
        only=None,
        stats=stats,
        streams={
            cid: (ref.info.endpoint, ref.info.topic, ref.info.dp_rank)
            for cid, ref in stats.channels.items()
        },
        # Channels are numbered at their first message, rows or not (as one read
        # numbers them); a batch log's first keys only for a read that kept none.
        first_keys={**log.firsts, **stats.first_keys},
        rows=[(k[0], k[1], k[2]) for k in b.registry],
        counts=counts,
        live_end=live_end,
        distinct=dict(b.hashes.sets),
        lifetimes=b.life.part(),
        copy_bound=b.copy_bound.part(),
        gaps=b.gaps.part(),
        distances=b.distances.frame(),
        negative_lifetimes=b.negative_lifetimes,
        ambiguous_removes=b.ambiguous_removes,
        first_ts=b.first_ts,
        last_ts=b.last_ts,
        first_rx=b.first_rx,
        last_rx=b.last_rx,
        origin_ns=b.origin_ns,
        grouped=set(b.grouped_channels),
        timeline=b.timeline if b.every_ns is not None else None,
        peaks=log,
        out_of_range=dict(annotator.out_of_range),
        restarts={c: (n, d) for c, (n, d) in b.restarts.items()},
    )


def fill_from_partials(
    b: ReportBuilder, parts: Sequence[PartialReport], channels: list[dict[int, int]]
) -> None:
    """Merge the units' partial reports into an empty builder ``b`` (exactly).

    Args:
        b: A new builder (its timeline's origin the units').
        parts: The units' partial reports, in unit order.
        channels: Per unit, its channel ids -> the merged read's
            (:func:`kvtool.report.partial.merge_stats`).
    """
    row_ids = [{i: gkey_of(b.registry, *key) for i, key in enumerate(p.rows)} for p in parts]
    b.peaks.levels = merge_peaks(parts, row_ids)
    counts: dict[int, list[int]] = {}
    live_end: dict[int, int] = {}
    distinct: dict[int, list[NDArray[Any]]] = {}
    timelines: list[pl.DataFrame] = []

    for i, (p, ids) in enumerate(zip(parts, row_ids, strict=True)):
        for g, values in p.counts.items():
            acc = counts.setdefault(ids[g], [0] * len(ADDITIVE))
            for k, v in enumerate(values):
                acc[k] += v
        for g, n in p.live_end.items():
            live_end[ids[g]] = live_end.get(ids[g], 0) + n
        for g, h in p.distinct.items():
            distinct.setdefault(ids[g], []).append(h)
        if p.timeline is not None and p.timeline.height:
            timelines.append(remap(p.timeline, ids))
        b.negative_lifetimes += p.negative_lifetimes
        for c, (n, d) in p.restarts.items():
            acc = b.restarts.setdefault(channels[i].get(c, c), [0, 0])
            acc[0] += n
            acc[1] += d
        b.ambiguous_removes += p.ambiguous_removes
        for ts in (p.first_ts, p.last_ts):
            if ts is not None:
                b.first_ts = ts if b.first_ts is None else min(b.first_ts, ts)
                b.last_ts = ts if b.last_ts is None else max(b.last_ts, ts)
        # The first message (rows or not: each channel's first) and the last row.
        rx = [k[0] for k in p.first_keys.values()]
        rx += [t for t in (p.first_rx, p.last_rx) if t is not None]
        if rx:
            b.first_rx = min(rx) if b.first_rx is None else min(b.first_rx, *rx)
            b.last_rx = max(rx) if b.last_rx is None else max(b.last_rx, *rx)
        b.grouped_channels.update(channels[i][c] for c in p.grouped if c in channels[i])
    b.counts = np.zeros((len(b.registry), len(ADDITIVE)), dtype=I64)
    for g, sums in counts.items():
        b.counts[g] = sums
    b.live_end = live_end
    b.hashes.sets = {g: sorted_union(hs) for g, hs in distinct.items()}
    b.life, b.gaps, b.distances = lifetimes.merge_parts(parts, row_ids)
    b.copy_bound = CopyBound.merge(
        [(p.copy_bound, i) for p, i in zip(parts, row_ids, strict=True)], EXACT_LIFETIMES
    )
    if timelines:
        b.timeline = pl.concat(timelines).group_by("bucket", "gkey").agg(*TIMELINE_SUMS)


def log_peaks(
    log: PeakLog,
    refs: dict[int, ChannelRef],
    df: pl.DataFrame,
    delta_row: NDArray[Any],
    delta_gkey: NDArray[Any],
    delta: NDArray[Any],
    rows: dict[int, ReportRow],
) -> None:
    """Hand a chunk's deltas, with their batches, to the peak log (``refs``: its channels)."""
    streams = {
        cid: (ref.info.endpoint, ref.info.topic, ref.info.dp_rank)
        # A copy: the reading thread may number a new channel meanwhile.
        for cid, ref in refs.copy().items()
    }
    log.add(
        df["log_time"].to_numpy()[delta_row],
        df["seq"].to_numpy()[delta_row],
        df["channel_id"].cast(pl.Int64).to_numpy()[delta_row],
        delta_gkey.astype(I64, copy=False),
        delta,
        streams,
        rows,
    )


__all__ = ["fill_from_partials", "log_peaks", "to_partial"]
