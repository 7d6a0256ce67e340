"""Per-kind, per-window and per-group tables of block stores and evictions, built streaming.

Parts: :mod:`~kvtool.report.state` (the live-block multiset and FIFO lifetimes,
vectorised per chunk), :mod:`~kvtool.report.attribution` (which kind a remove belongs
to), :mod:`~kvtool.report.aggregates` (columns, counts, distinct hashes, peaks,
percentiles, timeline), :mod:`~kvtool.report.findings` (what looks wrong),
:mod:`~kvtool.report.builder` (drives them chunk by chunk) and
:mod:`~kvtool.report.parallel` (``--jobs`` and ``--ray``).
"""

from __future__ import annotations

from kvtool.report.aggregates import (
    COLUMNS,
    COUNT_COLUMNS,
    EXACT_LIFETIMES,
    LIFETIME_COLUMNS,
    MAX_TIMELINE_CELLS,
    TIMELINE_COLUMNS,
    Report,
)
from kvtool.report.builder import (
    ReportBuilder,
    build_report,
    finish_report,
    report_from_chunks,
    report_with,
)
from kvtool.report.parallel import RAY_INSTALL_HINT, default_jobs

__all__ = [
    "COLUMNS",
    "COUNT_COLUMNS",
    "EXACT_LIFETIMES",
    "LIFETIME_COLUMNS",
    "MAX_TIMELINE_CELLS",
    "RAY_INSTALL_HINT",
    "TIMELINE_COLUMNS",
    "Report",
    "ReportBuilder",
    "build_report",
    "default_jobs",
    "finish_report",
    "report_from_chunks",
    "report_with",
]
