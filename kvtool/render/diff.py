"""Render a :class:`kvtool.diff.Diff` as rich tables (80 columns), JSON or Markdown."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, TextIO

from kvtool.diff import format_number, format_rel
from kvtool.render.tables import Column, print_prose, print_table
from kvtool.report.registry import short_label
from kvtool.text import markdown, printable

if TYPE_CHECKING:
    from rich.console import Console

    from kvtool.diff import Diff, FailOnResult, MetricDelta, RowDiff

HEADER = ("metric", "A", "B", "delta", "change")
"""Column headers of every diff table: the metric, its value in A and B, B - A, and the
relative change (``new`` when A is 0)."""

LEGEND = "delta = B - A; change = delta / A (new: A was 0); absent: no such row there"
"""The line under the summary that explains the columns."""

_TITLES = {"kind": "kind", "window": "sliding window", "group": "group"}

SHORT_NOTE = "short labels: "
"""Starts the line that names the metrics a table too wide for the console shows by their
registry short label (:data:`kvtool.report.registry.SHORT_LABELS`; ``--fail-on`` takes
either)."""


def _line(console: Console, text: str) -> None:
    print_prose(console, text)


def _side_lines(name: str, side: dict[str, object]) -> tuple[str, str]:
    recs = side.get("recordings")
    paths = ", ".join(str(r) for r in recs) if isinstance(recs, list) else str(recs)
    batches = side.get("batches")
    events = side.get("events")
    meta = side.get("group_metadata")
    meta_text = "; ".join(str(m) for m in meta) if isinstance(meta, list) and meta else "none"
    return (
        printable(
            f"{name}: {paths} - {_count(batches, 'batch', 'batches')}, "
            f"{_count(events, 'event', 'events')}"
        ),
        printable(f"group metadata: {meta_text}"),
    )


def _count(n: object, one: str, many: str) -> str:
    if not isinstance(n, int):
        return f"? {many}"
    return f"{format_number(n)} {one if n == 1 else many}"


def _summary(diff: Diff) -> str:
    rows = diff.rows
    changed = [r for r in rows if r.changed]
    what = _TITLES[diff.by]
    if not diff.changed:
        return "no change: every metric is equal on both sides"
    return (
        f"{len(changed)} of {len(rows)} {what} row{'s' if len(rows) != 1 else ''} changed, "
        f"{len(diff.totals.changes)} of {len(diff.totals.metrics)} total metrics"
    )


def _cells(m: MetricDelta, row: RowDiff) -> list[str]:
    a = "absent" if row.presence == "b_only" else format_number(m.a)
    b = "absent" if row.presence == "a_only" else format_number(m.b)
    return [m.metric, a, b, format_number(m.delta, signed=True), format_rel(m)]


def _shown(row: RowDiff, *, all_metrics: bool) -> tuple[MetricDelta, ...]:
    return row.metrics if all_metrics else row.changes


def check_lines(diff: Diff) -> list[str]:
    """Return one line per ``--fail-on`` expression: crossed or not, and where.

    Args:
        diff: The comparison.

    Returns:
        Lines, already passed through :func:`kvtool.text.printable`.
    """
    return [_check_line(c) for c in diff.checks]


def _check_line(c: FailOnResult) -> str:
    if not c.crossed:
        if c.matched_rows == 0:
            return printable(f"fail-on {c.rule.text}: no row matched; nothing to check")
        rows = f"{c.matched_rows} row{'s' if c.matched_rows != 1 else ''}"
        return printable(f"fail-on {c.rule.text}: ok ({rows} within)")
    hits = "; ".join(
        f"{row.label} {m.metric} {format_number(m.a)} -> {format_number(m.b)} ({format_rel(m)})"
        for row, m in c.hits
    )
    return printable(f"fail-on {c.rule.text}: CROSSED by {hits}")


def render_table(diff: Diff, console: Console, *, all_metrics: bool = False) -> None:
    """Print the sides, a verdict per row, and a table of the changed metrics of each row.

    Each table has five narrow columns (metric, A, B, delta, change); on a narrow console
    the values that do not fit go to a block below, and every text line wraps at the
    console's width, so the output fits 80 columns with nothing replaced by ``…``.

    Args:
        diff: The comparison.
        console: Where to print (stdout's console).
        all_metrics: Show unchanged metrics too.
    """
    for name, side in (("A", diff.a), ("B", diff.b)):
        first, meta = _side_lines(name, side)
        _line(console, first)
        _line(console, f"   {meta}")
    _line(console, f"diff by {_TITLES[diff.by]}: {_summary(diff)}")
    if diff.changed:
        _line(console, LEGEND)
    rows = [*diff.rows, diff.totals]
    cells = [[_cells(m, row) for m in _shown(row, all_metrics=all_metrics)] for row in rows]
    short = _shorten(cells, console.width)
    if short:
        _line(console, SHORT_NOTE + ", ".join(f"{b} = {a}" for a, b in short.items()))
    for row, table in zip(rows, cells, strict=True):
        console.print()
        _line(console, printable(row.verdict))
        if not table:
            continue
        # The tables every command prints: on a narrow console the value columns that do
        # not fit go to a block below (the metric repeated), so no number is ever folded.
        cols = [Column(h, key=i == 0) for i, h in enumerate(HEADER)]
        print_table(console, None, cols, [[short.get(c[0], c[0]), *c[1:]] for c in table])
    if diff.checks:
        console.print()
    for line in check_lines(diff):
        _line(console, line)
    for name, side in (("A", diff.a), ("B", diff.b)):
        findings = side.get("findings")
        for f in findings if isinstance(findings, list) else []:
            _line(console, printable(f"finding ({name}): {f}"))


def _too_wide(tables: list[list[list[str]]], width: int) -> bool:
    """True when some table's five columns (two spaces apart) are wider than ``width``."""
    from rich.cells import cell_len

    for table in tables:
        if not table:
            continue
        widths = [max(cell_len(h), *(cell_len(r[i]) for r in table)) for i, h in enumerate(HEADER)]
        if sum(widths) + 2 * (len(widths) - 1) > width:
            return True
    return False


def _shorten(tables: list[list[list[str]]], width: int) -> dict[str, str]:
    """The metrics to show by their short label: the fewest, longest names that make it fit.

    Names are kept when every table fits the console with them, and when the tables do not
    fit even with the short labels (the value columns then go to a block below, as in
    every table); otherwise the names longer than some length give way to their short
    labels, that length as long as fits.

    Returns:
        Metric name -> the short label shown, in the order of the tables.
    """
    if not _too_wide(tables, width):
        return {}
    names = list(dict.fromkeys(c[0] for table in tables for c in table))
    for longest in sorted({len(n) for n in names}, reverse=True):
        short = {n: short_label(n) for n in names if len(n) >= longest}
        short = {n: x for n, x in short.items() if len(x) < len(n)}
        shortened = [[[short.get(c[0], c[0]), *c[1:]] for c in table] for table in tables]
        if short and not _too_wide(shortened, width):
            return short
    return {}


def render_json(diff: Diff, stream: TextIO) -> None:
    """Write the JSON document described in :mod:`kvtool.diff` (schema ``kvtool.diff/1``).

    Args:
        diff: The comparison.
        stream: Where to write.
    """
    json.dump(diff.to_dict(), stream, indent=2)
    stream.write("\n")


def _md(text: str) -> str:
    return markdown(text)


def render_markdown(diff: Diff, stream: TextIO, *, all_metrics: bool = False) -> None:
    """Write GitHub-flavoured Markdown: the sides, then per row its verdict and a table.

    Args:
        diff: The comparison.
        stream: Where to write.
        all_metrics: Show unchanged metrics too.
    """
    for name, side in (("A", diff.a), ("B", diff.b)):
        first, meta = _side_lines(name, side)
        stream.write(f"- {_md(first)}; {_md(meta)}\n")
    stream.write("\n")
    stream.write(f"**diff by {_TITLES[diff.by]}: {_md(_summary(diff))}**\n")
    if diff.changed:
        stream.write(f"\n{LEGEND}\n")
    for row in [*diff.rows, diff.totals]:
        stream.write(f"\n### {_md(row.verdict)}\n")
        shown = _shown(row, all_metrics=all_metrics)
        if not shown:
            continue
        stream.write("\n| " + " | ".join(HEADER) + " |\n")
        stream.write("|---|" + "|".join("---:" for _ in HEADER[1:]) + "|\n")
        for m in shown:
            stream.write("| " + " | ".join(_md(c) for c in _cells(m, row)) + " |\n")
    if diff.checks:
        stream.write("\n")
    for line in check_lines(diff):
        stream.write(f"> {_md(line)}\n")


__all__ = ["HEADER", "LEGEND", "check_lines", "render_json", "render_markdown", "render_table"]
