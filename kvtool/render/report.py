"""Render a :class:`kvtool.report.Report` as rich tables, JSON, CSV or Markdown."""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, TextIO

from rich.table import Table

from kvtool.report import COLUMNS

if TYPE_CHECKING:
    import polars as pl
    from rich.console import Console

    from kvtool.report import Report

TABLES = ("kind", "window", "group")
"""Names accepted by ``--by``."""

_WIDE = 260  # every column readable even when stdout is a pipe (rich assumes 80)
_TITLES = {"kind": "by kind", "window": "by sliding window", "group": "by group"}
_FRAME = {"kind": "by_kind", "window": "by_window", "group": "by_group"}
_KEYS = {"kind": ["kind"], "window": ["sliding_window"], "group": ["group_idx", "kind",
                                                                     "sliding_window"]}


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 1000 else f"{value:.0f}"
    return str(value)


def _rows(report: Report, by: str, *, totals: bool) -> tuple[list[str], list[list[object]]]:
    frame: pl.DataFrame = getattr(report, _FRAME[by])
    keys = _KEYS[by]
    header = [*keys, *COLUMNS]
    rows = [list(r) for r in frame.select(header).iter_rows()]
    if totals:
        tot = report.totals.to_dicts()[0] if report.totals.height else {}
        rows.append(["total", *([""] * (len(keys) - 1)), *[tot.get(c) for c in COLUMNS]])
    return header, rows


def _timeline_rows(report: Report) -> tuple[list[str], list[list[object]]]:
    assert report.timeline is not None
    header = list(report.timeline.columns)
    return header, [list(r) for r in report.timeline.iter_rows()]


def render_table(report: Report, console: Console, by: Sequence[str] = ("kind", "window")) -> None:
    """Print the tables (each with a totals row), the timeline and the findings.

    Args:
        report: The report.
        console: Where to print (stdout's console).
        by: Which tables, in order: ``kind``, ``window``, ``group``.
    """
    if not console.is_terminal and console.width < _WIDE:
        # A pipe or file: rich would squeeze the tables to 80 columns; print them whole.
        from rich.console import Console as _Console

        console = _Console(file=console.file, width=_WIDE, soft_wrap=True, color_system=None)
    src = report.source
    recs = src.get("recordings", [])
    meta = src.get("group_metadata", [])
    console.print(
        f"report: {', '.join(map(str, recs)) if isinstance(recs, list) else recs} - "
        f"{src.get('batches')} batches, {src.get('events')} events; group metadata: "
        f"{'; '.join(map(str, meta)) if isinstance(meta, list) else meta}",
        markup=False, highlight=False,
    )
    for name in by:
        header, rows = _rows(report, name, totals=True)
        t = Table(title=_TITLES[name], title_justify="left")
        for i, h in enumerate(header):
            t.add_column(h, justify="left" if i < len(_KEYS[name]) else "right")
        for i, r in enumerate(rows):
            t.add_row(*[_cell(v) for v in r], end_section=(i == len(rows) - 2))
        console.print(t)
    if report.timeline is not None:
        header, rows = _timeline_rows(report)
        t = Table(title=f"timeline (every {report.every_s:g} s)", title_justify="left")
        for h in header:
            t.add_column(h, justify="right" if h != "kind" else "left")
        for r in rows:
            t.add_row(*[_cell(v) for v in r])
        console.print(t)
    for line in report.findings:
        console.print(f"finding: {line}", markup=False, highlight=False)


def render_json(report: Report, stream: TextIO) -> None:
    """Write the JSON contract: ``{"source", "totals", "by_kind", "by_window", "by_group"}``.

    Args:
        report: The report.
        stream: Where to write.
    """
    out = report.to_dict()
    out["source"] = {**report.source, "findings": list(report.findings)}
    json.dump(out, stream, indent=2)
    stream.write("\n")


def render_csv(report: Report, stream: TextIO, by: Sequence[str] = ("kind", "window")) -> None:
    """Write one CSV: a ``table`` column, the key columns, then every report column.

    Each selected table contributes its rows and a ``total`` row; with a timeline, its
    rows follow under ``table`` = ``timeline``.

    Args:
        report: The report.
        stream: Where to write.
        by: Which tables.
    """
    w = csv.writer(stream, lineterminator="\n")
    key_cols = ["kind", "sliding_window", "group_idx"]
    w.writerow(["table", *key_cols, *COLUMNS])
    for name in by:
        frame: pl.DataFrame = getattr(report, _FRAME[name])
        for r in frame.to_dicts():
            w.writerow([_FRAME[name], *[_csv(r.get(k)) for k in key_cols],
                        *[_csv(r.get(c)) for c in COLUMNS]])
        tot = report.totals.to_dicts()[0] if report.totals.height else {}
        w.writerow([_FRAME[name], "total", "", "", *[_csv(tot.get(c)) for c in COLUMNS]])
    if report.timeline is not None:
        stream.write("\n")
        header, tl_rows = _timeline_rows(report)
        w.writerow(["table", *header])
        for row in tl_rows:
            w.writerow(["timeline", *[_csv(v) for v in row]])


def _csv(v: object) -> object:
    return "" if v is None else v


def render_markdown(
    report: Report, stream: TextIO, by: Sequence[str] = ("kind", "window")
) -> None:
    """Write GitHub-flavoured Markdown tables (each with a totals row) and the findings.

    Args:
        report: The report.
        stream: Where to write.
        by: Which tables.
    """
    for name in by:
        header, rows = _rows(report, name, totals=True)
        stream.write(f"### {_TITLES[name]}\n\n")
        _md_table(stream, header, rows, bold_last=True)
        stream.write("\n")
    if report.timeline is not None:
        header, rows = _timeline_rows(report)
        stream.write(f"### timeline (every {report.every_s:g} s)\n\n")
        _md_table(stream, header, rows, bold_last=False)
        stream.write("\n")
    for line in report.findings:
        stream.write(f"> finding: {line}\n")


def _md_table(stream: TextIO, header: list[str], rows: list[list[object]], *,
              bold_last: bool) -> None:
    stream.write("| " + " | ".join(header) + " |\n")
    stream.write("|" + "|".join("---" for _ in header) + "|\n")
    for i, r in enumerate(rows):
        cells = [_cell(v) if v != "" else "" for v in r]
        if bold_last and i == len(rows) - 1:
            cells = [f"**{c}**" if c else c for c in cells]
        stream.write("| " + " | ".join(cells) + " |\n")


__all__ = ["TABLES", "render_csv", "render_json", "render_markdown", "render_table"]
