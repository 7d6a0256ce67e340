"""The report's column names, read from the metric registry (no polars: cheap to import)."""

from __future__ import annotations

from kvtool.report.registry import METRICS

COLUMNS = tuple(m.name for m in METRICS)
"""Report columns, in DESIGN.md's names and order (:data:`kvtool.report.registry.METRICS`)."""

COUNT_COLUMNS = tuple(m.name for m in METRICS if m.merge in ("sum", "max", "last", "distinct"))
"""The integer columns (a row absent from a report counts 0 in each)."""

RATIO_COLUMNS = tuple(m.name for m in METRICS if m.merge == "ratio")
"""Columns derived from two others after every merge (``recompute_share``)."""

LIFETIME_COLUMNS = tuple(
    m.name for m in METRICS if m.name.startswith("lifetime_") and "_bound_" not in m.name
)
"""Block lifetime percentiles (store to remove, seconds)."""

LIFETIME_BOUND_COLUMNS = tuple(
    m.name for m in METRICS if m.name.startswith("lifetime_") and "_bound_" in m.name
)
"""Their bound under the two extreme copy rules (R8), low and high per percentile."""

GAP_COLUMNS = tuple(m.name for m in METRICS if m.name.startswith("recompute_gap_s_"))
"""Recompute gap percentiles (removal to re-store, seconds)."""

DISTANCE_COLUMNS = tuple(m.name for m in METRICS if m.name.startswith("recompute_distance_"))
"""Recompute distance percentiles (evictions in the pool between removal and re-store)."""

QUANTILE_COLUMNS = LIFETIME_COLUMNS + LIFETIME_BOUND_COLUMNS + GAP_COLUMNS + DISTANCE_COLUMNS
"""Every percentile column (no value where a row has no sample)."""

ALIASES = {a: m.name for m in METRICS for a in m.aliases}
"""Deprecated JSON names → the column they repeat (kept for one release)."""

TIMELINE_COLUMNS = (
    "time_s",
    "width_s",
    "kind",
    "stores",
    "removes",
    "cleared",
    "live_blocks",
    "blocks_recomputed",
)
"""Timeline columns: bucket start (seconds since the first message, on the timeline's
clock), the seconds of it the data covers, the kind, blocks stored, removed and cleared in
it, live blocks at its end, blocks recomputed in it (they add up to the report's
``blocks_recomputed``; :mod:`kvtool.report.timeline`)."""

ADDITIVE = tuple(m.name for m in METRICS if m.merge == "sum")
"""Columns that add across chunks and partial reports."""

BUILDER_INPUT = (
    "log_time",
    "ts",
    "seq",
    "channel_id",
    "dp_rank",
    "group_idx",
    "kind",
    "sliding_window",
    "hash",
    "tokens",
    "block_index",
    "type_code",
    "event_index",
)
"""The table columns :class:`kvtool.report.builder.ReportBuilder` reads (the others --
``medium``, ``block_count`` and the labels -- are neither built nor shipped back from a
decoding worker: an IPC table of these is about a third cheaper to write and read).
``event_index`` is read only to attribute removes without ``group_idx``
(:mod:`kvtool.report.attribution`), but a chunk may hold such removes anywhere."""

__all__ = [
    "ADDITIVE",
    "ALIASES",
    "BUILDER_INPUT",
    "COLUMNS",
    "COUNT_COLUMNS",
    "DISTANCE_COLUMNS",
    "GAP_COLUMNS",
    "LIFETIME_BOUND_COLUMNS",
    "LIFETIME_COLUMNS",
    "QUANTILE_COLUMNS",
    "RATIO_COLUMNS",
    "TIMELINE_COLUMNS",
]
