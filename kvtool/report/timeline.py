"""The report's timeline clock: its origin, its buckets and how much of each the data covers.

Time zero is the first message of the input, on the timeline's clock (issue 24):

- ``receive`` (the default): the first message's receive time (``log_time``), the zero of
  ``--since``/``--until`` and of ``replay``'s "seconds since the recording's first
  message" -- a bucket at ``time_s`` 2 holds the batches ``--since 2s --until 3s`` selects;
- ``publish``: the first batch's own ``ts`` (other batches' ``ts`` may come before it:
  their buckets have a negative ``time_s``).

The origin is read from the inputs before the report (:func:`input_origin`), so every unit
of work (``--jobs``, ``--ray``) buckets on the same grid and the (bucket, row) sums merge
exactly. A bucket is ``[time_s, time_s + every)``; ``width_s`` is the part of it the data
covers (first to last message): the last bucket (and with a selection the first) is
partial, and a rate over a bucket divides by ``width_s``, not by the full width.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import polars as pl

from kvtool.columns import np
from kvtool.errors import ProtocolError
from kvtool.inputs import merge_messages
from kvtool.protocol import decode_batch
from kvtool.recording import open_recording
from kvtool.report.aggregates import (
    MAX_TIMELINE_CELLS,
    PLAUSIBLE_TS_MAX,
    PLAUSIBLE_TS_MIN,
    plausible_ts,
)
from kvtool.report.arrays import I64, int_column

if TYPE_CHECKING:
    from numpy.typing import NDArray

TIMELINE_SCHEMA: dict[str, pl.DataType] = {
    "bucket": pl.Int64(),
    "gkey": pl.UInt32(),
    "stores": pl.Int64(),
    "removes": pl.Int64(),
    "cleared": pl.Int64(),
    "delta": pl.Int64(),
    "recomputed": pl.Int64(),
}
"""The timeline's state: per (bucket, report row ``gkey``) blocks stored, removed and
cleared, the change of live blocks and the blocks recomputed (``blocks_recomputed``);
each column adds across chunks and units."""

TIMELINE_SUMS = [pl.col(c).sum() for c in ("stores", "removes", "cleared", "delta", "recomputed")]
"""The aggregation that adds :data:`TIMELINE_SCHEMA`'s sums per key."""

_PUBLISH_LOOKAHEAD = 1000
"""Messages read past the first for a decodable batch ``ts`` (``--clock publish``)."""


def ts_ns(ts: float) -> int:
    """A batch ``ts`` (float seconds) as integer ns at microsecond resolution (as bucketed)."""
    return round(ts * 1e6) * 1000


def input_origin(paths: Sequence[str | os.PathLike[str]], clock: str) -> int | None:
    """The timeline's time zero (ns since the epoch) for these inputs, on ``clock``.

    ``receive``: the receive time of the first message of the input in THE merge order
    (what ``--since`` counts from, before any selection). ``publish``: the ``ts`` of the
    first batch that decodes (a ``ts`` that is no wall-clock time counts as its receive
    time, as in the report; none within :data:`_PUBLISH_LOOKAHEAD` messages: the first
    message's receive time).

    Args:
        paths: The recordings, in command-line order.
        clock: ``receive`` or ``publish``.

    Returns:
        The origin, or None when the input holds no message.

    Raises:
        RecordingError: A recording cannot be opened.
    """
    readers = [open_recording(p) for p in paths]
    try:
        first: int | None = None
        merged = merge_messages([r.messages() for r in readers])
        for n, (_i, m) in enumerate(merged):
            if first is None:
                first = m.log_time
                if clock == "receive":
                    return first
            if n >= _PUBLISH_LOOKAHEAD:
                break
            try:
                ts = decode_batch(m.data, seq=m.seq).ts
            except ProtocolError:
                continue
            if isinstance(ts, float | int) and PLAUSIBLE_TS_MIN <= ts < PLAUSIBLE_TS_MAX:
                return ts_ns(float(ts))
            return ts_ns(float(m.log_time) * 1e-9)  # as plausible_ts places such a batch
        return None if first is None else ts_ns(float(first) * 1e-9)
    finally:
        for r in readers:
            with contextlib.suppress(Exception):
                r.close()


def bucket_expr(clock: str, every_ns: int, origin_ns: int) -> pl.Expr:
    """The timeline bucket of each row on ``clock``, counted from ``origin_ns``.

    Integer arithmetic only: ``receive`` on ``log_time`` (exact ns), ``publish`` on the
    batch ``ts`` (:func:`~kvtool.report.aggregates.plausible_ts`) rounded to whole
    microseconds, so a row right at a bucket edge lands on the same side however polars
    evaluates it. A ``ts`` that is not a finite number gets no bucket (null).

    Args:
        clock: ``receive`` or ``publish``.
        every_ns: Bucket width.
        origin_ns: Time zero (:func:`input_origin`).

    Returns:
        An Int64 expression: bucket ``b`` is ``[b * every, (b + 1) * every)`` after zero.
    """
    if clock == "receive":
        return (pl.col("log_time") - origin_ns).floordiv(every_ns)
    us = (plausible_ts() * 1e6).round().cast(pl.Int64, strict=False)
    return (us * 1000 - origin_ns).floordiv(every_ns)


def data_span(
    clock: str,
    origin_ns: int | None,
    rx: tuple[int | None, int | None],
    ts: tuple[float | None, float | None],
) -> tuple[int, int] | None:
    """The data's (first, last) time on ``clock``, in ns after the origin.

    Args:
        clock: ``receive`` or ``publish``.
        origin_ns: The timeline's time zero.
        rx: The first message's and the last row's receive times (ns).
        ts: The first and last plausible batch ``ts`` (seconds).

    Returns:
        The span; None before any row.
    """
    if origin_ns is None:
        return None
    if clock == "receive":
        if rx[0] is None or rx[1] is None:
            return None
        return rx[0] - origin_ns, rx[1] - origin_ns
    if ts[0] is None or ts[1] is None:
        return None
    return ts_ns(ts[0]) - origin_ns, ts_ns(ts[1]) - origin_ns


def timeline_frame(
    per_bucket: pl.DataFrame, every_ns: int, span: tuple[int, int] | None
) -> tuple[pl.DataFrame, bool]:
    """Return the timeline from per (bucket, kind) sums, and whether it is sparse.

    A dense grid (every bucket from the one of the first message to the one of the last,
    times every kind) is built while it has at most
    :data:`~kvtool.report.aggregates.MAX_TIMELINE_CELLS` cells; beyond that only the cells
    holding events are listed (``live_blocks`` is then the kind's level at the end of each
    listed bucket), so memory follows the events, never the time span.

    Args:
        per_bucket: ``bucket``, ``kind``, ``stores``, ``removes``, ``cleared``, ``delta``,
            ``recomputed``.
        every_ns: Bucket width.
        span: (first, last) data time in ns after the origin; None: the events' buckets.

    Returns:
        ``time_s`` (bucket start, seconds after the origin), ``width_s`` (seconds of the
        bucket between the first and the last message), ``kind``, ``stores``, ``removes``,
        ``cleared``, ``live_blocks``, ``blocks_recomputed``; and True when sparse.
    """
    if per_bucket.height == 0:
        return pl.DataFrame(
            schema={
                "time_s": pl.Float64,
                "width_s": pl.Float64,
                "kind": pl.String,
                "stores": pl.Int64,
                "removes": pl.Int64,
                "cleared": pl.Int64,
                "live_blocks": pl.Int64,
                "blocks_recomputed": pl.Int64,
            }
        ), False
    first, last = per_bucket["bucket"].min(), per_bucket["bucket"].max()
    assert isinstance(first, int) and isinstance(last, int)
    lo, hi = span if span is not None else (first * every_ns, (last + 1) * every_ns)
    first, last = min(first, lo // every_ns), max(last, hi // every_ns)
    kinds = per_bucket["kind"].unique().sort()
    sparse = (last - first + 1) * len(kinds) > MAX_TIMELINE_CELLS
    if sparse:
        cells = per_bucket
    else:
        grid = pl.DataFrame({"bucket": pl.int_range(first, last + 1, eager=True)}).join(
            pl.DataFrame({"kind": kinds}), how="cross"
        )
        cells = grid.join(per_bucket, on=["bucket", "kind"], how="left").fill_null(0)
    full = cells.sort("kind", "bucket").with_columns(
        live_blocks=pl.col("delta").cum_sum().over("kind")
    )
    start = pl.col("bucket") * every_ns
    covered = pl.min_horizontal(start + every_ns, pl.lit(hi)) - pl.max_horizontal(start, pl.lit(lo))
    return full.select(
        time_s=(pl.col("bucket").cast(pl.Float64) * (every_ns / 1e9)).round(9),
        width_s=(covered.clip(lower_bound=0).cast(pl.Float64) * 1e-9).round(9),
        kind="kind",
        stores="stores",
        removes="removes",
        cleared="cleared",
        live_blocks="live_blocks",
        blocks_recomputed="recomputed",
    ).sort("time_s", "kind"), sparse


def timeline_part(
    clock: str,
    every_ns: int,
    origin_ns: int,
    df: pl.DataFrame,
    gkey: NDArray[Any],
    is_clear: NDArray[Any],
    is_store: NDArray[Any],
    is_remove: NDArray[Any],
    has_hash: NDArray[Any],
    deltas: tuple[NDArray[Any], NDArray[Any], NDArray[Any], NDArray[Any]],
    recomputed: NDArray[Any],
) -> pl.DataFrame:
    """Return per (bucket, gkey): stores, removes, cleared, live-block deltas, recomputes.

    ``recomputed``: the rows the kernel found recomputed (what the report's
    ``blocks_recomputed`` counts).

    ``deltas``: each live-block change's gkey, amount, row, and whether it is a
    clear's drop (:meth:`kvtool.report.builder.ReportBuilder.add`); the rows of the
    frame are not summed yet (:data:`TIMELINE_SUMS`).
    """
    delta_gkey, delta, delta_row, dropped = deltas
    bucket, bucket_null = int_column(
        df.select(bucket=bucket_expr(clock, every_ns, origin_ns)), "bucket"
    )
    valid = ~bucket_null if bucket_null is not None else np.ones(len(bucket), dtype=bool)
    blk = has_hash & ~is_clear & valid
    dl = (delta_gkey >= 0) & valid[delta_row]
    b_rows = bucket[blk]
    return pl.DataFrame(
        {
            "bucket": np.concatenate([b_rows, bucket[delta_row[dl]]]),
            "gkey": pl.Series(np.concatenate([gkey[blk], delta_gkey[dl]]), dtype=pl.UInt32),
            "stores": np.concatenate([is_store[blk].astype(I64), np.zeros(dl.sum(), I64)]),
            "removes": np.concatenate([is_remove[blk].astype(I64), np.zeros(dl.sum(), I64)]),
            "cleared": np.concatenate(
                [np.zeros(len(b_rows), I64), np.where(dropped[dl], -delta[dl], 0)]
            ),
            "delta": np.concatenate([np.zeros(len(b_rows), I64), delta[dl]]),
            "recomputed": np.concatenate([recomputed[blk].astype(I64), np.zeros(dl.sum(), I64)]),
        },
        schema=TIMELINE_SCHEMA,
    )


class TimelineSums:
    """The timeline's (bucket, gkey) sums, plus chunks' rows not yet summed in."""

    def __init__(self) -> None:
        self._frame = pl.DataFrame(schema=TIMELINE_SCHEMA)
        self._parts: list[pl.DataFrame] = []
        self._rows = 0

    @property
    def frame(self) -> pl.DataFrame:
        """Per (bucket, gkey) sums of :data:`TIMELINE_SCHEMA`'s columns."""
        if self._parts:
            self._sum()
        return self._frame

    @frame.setter
    def frame(self, frame: pl.DataFrame) -> None:
        self._frame = frame
        self._parts = []
        self._rows = 0

    def add(self, part: pl.DataFrame) -> None:
        """Add a chunk's rows (:func:`timeline_part`)."""
        # Summed in with the others now and then, not per chunk: one group_by over many
        # chunks' rows costs less than re-aggregating the whole timeline each time.
        self._parts.append(part)
        self._rows += part.height
        if self._rows > max(1 << 20, self._frame.height):
            self._sum()

    def _sum(self) -> None:
        self._frame = (
            pl.concat([self._frame, *self._parts]).group_by("bucket", "gkey").agg(*TIMELINE_SUMS)
        )
        self._parts = []
        self._rows = 0


__all__ = [
    "TIMELINE_SCHEMA",
    "TIMELINE_SUMS",
    "TimelineSums",
    "bucket_expr",
    "data_span",
    "input_origin",
    "timeline_frame",
    "timeline_part",
    "ts_ns",
]
