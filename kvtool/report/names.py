"""The report's column names, in DESIGN.md's names and order (no polars: cheap to import)."""

from __future__ import annotations

COUNT_COLUMNS = (
    "store_events",
    "blocks_stored",
    "tokens_stored",
    "remove_events",
    "blocks_removed",
    "blocks_cleared",
    "live_blocks_end",
    "peak_live_blocks",
    "distinct_hashes",
    "restored_blocks",
    "orphan_removes",
)
LIFETIME_COLUMNS = ("lifetime_p50_s", "lifetime_p90_s", "lifetime_p99_s")
COLUMNS = COUNT_COLUMNS + LIFETIME_COLUMNS
"""Report columns, in DESIGN.md's names and order."""

TIMELINE_COLUMNS = ("time_s", "kind", "stores", "removes", "live_blocks")

ADDITIVE = (
    "store_events",
    "blocks_stored",
    "tokens_stored",
    "remove_events",
    "blocks_removed",
    "blocks_cleared",
    "restored_blocks",
    "orphan_removes",
)
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
    "BUILDER_INPUT",
    "COLUMNS",
    "COUNT_COLUMNS",
    "LIFETIME_COLUMNS",
    "TIMELINE_COLUMNS",
]
