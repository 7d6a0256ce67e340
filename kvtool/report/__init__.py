"""Per-kind, per-window and per-group tables of block stores and evictions, built streaming.

Parts: :mod:`~kvtool.report.kernel` (the sequential state kernel: the live-block
multiset, FIFO lifetimes, recomputes, in numba), :mod:`~kvtool.report.attribution`
(which kind a remove belongs to), :mod:`~kvtool.report.aggregates` (columns, counts,
distinct hashes, peaks, percentiles, timeline), :mod:`~kvtool.report.findings` (what looks wrong),
:mod:`~kvtool.report.builder` (drives them chunk by chunk), :mod:`~kvtool.report.run`
(reads the input into a builder, finishes the report), :mod:`~kvtool.report.parallel`
(``--jobs`` and ``--ray``), :mod:`~kvtool.report.api` (``build_report``) and
:mod:`~kvtool.report.feed` (``ReportFeed``: the same engine fed incrementally, for ``top``
and ``serve``). They import one way, in that order.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from kvtool.report.names import COLUMNS, COUNT_COLUMNS, LIFETIME_COLUMNS, TIMELINE_COLUMNS

if TYPE_CHECKING:
    from kvtool.report.aggregates import EXACT_LIFETIMES, MAX_TIMELINE_CELLS, Report
    from kvtool.report.api import build_report
    from kvtool.report.builder import ReportBuilder
    from kvtool.report.feed import ReportFeed
    from kvtool.report.parallel import RAY_INSTALL_HINT
    from kvtool.report.procs import default_jobs
    from kvtool.report.run import finish_report, report_from_chunks, report_with

# The library (polars, numpy) loads on first use of one of its names, so that importing a
# module of this package for its column names (``kvtool diff --help``) stays cheap.
_LAZY = {
    "EXACT_LIFETIMES": "kvtool.report.aggregates",
    "MAX_TIMELINE_CELLS": "kvtool.report.aggregates",
    "Report": "kvtool.report.aggregates",
    "ReportBuilder": "kvtool.report.builder",
    "ReportFeed": "kvtool.report.feed",
    "build_report": "kvtool.report.api",
    "finish_report": "kvtool.report.run",
    "report_from_chunks": "kvtool.report.run",
    "report_with": "kvtool.report.run",
    "RAY_INSTALL_HINT": "kvtool.report.parallel",
    "default_jobs": "kvtool.report.procs",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


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
    "ReportFeed",
    "build_report",
    "default_jobs",
    "finish_report",
    "report_from_chunks",
    "report_with",
]
