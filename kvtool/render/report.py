"""Render a :class:`kvtool.report.Report` as rich tables, JSON, CSV or Markdown."""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, TextIO

from kvtool.errors import UsageError
from kvtool.render.tables import Column, cell, print_prose, print_table
from kvtool.report import COLUMNS
from kvtool.report.registry import METRICS
from kvtool.text import csv_text, markdown, printable

if TYPE_CHECKING:
    import polars as pl
    from rich.console import Console

    from kvtool.report import Report

TABLES = ("kind", "window", "group", "rank", "channel", "medium")
"""Names accepted by ``--by``."""

_TITLES = {
    "kind": "by kind",
    "window": "by sliding window",
    "group": "by group",
    "rank": "by data-parallel rank",
    "channel": "by channel",
    "medium": "by medium",
}
_FRAME = {
    "kind": "by_kind",
    "window": "by_window",
    "group": "by_group",
    "rank": "by_rank",
    "channel": "by_channel",
    "medium": "by_medium",
}
_KEYS = {
    "kind": ["kind"],
    "window": ["sliding_window"],
    "group": ["group_idx", "kind", "sliding_window"],
    "rank": ["dp_rank"],
    "channel": ["channel"],
    "medium": ["medium"],
}


COLUMN_LABELS = {m.name: m.label for m in METRICS}
"""Short two-line table headers (name, unit) for every report column (from the registry)."""

DEFAULT_COLUMNS = (
    "blocks_stored",
    "blocks_removed",
    "blocks_cleared",
    "live_blocks_end",
    "peak_live_blocks",
    "blocks_recomputed",
    "recompute_share",
    "lifetime_p50_s",
)
"""The columns a table shows without ``--columns``/``--wide``: the ones read first (one
block at 80 columns). They add up: stored - removed - cleared = live, but for orphan
removes (which remove nothing) -- issue 24: the cleared blocks were hidden."""

_TIMELINE_LABELS = {
    "time_s": "time\ns",
    "width_s": "width\ns",
    "kind": "kind",
    "stores": "stored\nblocks",
    "removes": "removed\nblocks",
    "cleared": "cleared\nblocks",
    "live_blocks": "live\nblocks",
    "blocks_recomputed": "recomputed\nblocks",
}


def _timeline_title(report: Report) -> str:
    """``timeline (every 1 s from the first message, receive clock)``."""
    clock = report.source.clock
    return f"timeline (every {report.every_s:g} s from the first message, {clock} clock)"


_TIMELINE_LEGEND = (
    "timeline: time = bucket start, seconds since the first message; width = seconds of the "
    "bucket between the first and the last message (a rate divides by it); stored - removed "
    "- cleared = the change in live, but for orphan removes"
)


def _legends() -> dict[str, str]:
    """Each column's legend line; a percentile shares the first of its family's (pNN)."""
    out: dict[str, str] = {}
    last = ""
    for m in METRICS:
        last = m.legend or last
        out[m.name] = last
    return out


_LEGEND = _legends()


def parse_columns(text: str) -> list[str]:
    """Parse ``--columns``: report column names, comma-separated, or ``all``.

    Args:
        text: The value as typed.

    Returns:
        The columns, in the order given.

    Raises:
        UsageError: An unknown column name.
    """
    wanted = [p.strip() for p in text.split(",") if p.strip()]
    if wanted == ["all"]:
        return list(COLUMNS)
    bad = [p for p in wanted if p not in COLUMNS]
    if bad or not wanted:
        raise UsageError(
            f"--columns {printable(text)!r}: expected 'all' or a comma-separated list of "
            f"{', '.join(COLUMNS)}"
        )
    return wanted


def _rows(
    report: Report, by: str, columns: Sequence[str], *, totals: bool
) -> tuple[list[str], list[list[object]]]:
    frame: pl.DataFrame = getattr(report, _FRAME[by])
    keys = _KEYS[by]
    header = [*keys, *columns]
    rows = [list(r) for r in frame.select(header).iter_rows()]
    if totals:
        tot = report.totals.to_dicts()[0] if report.totals.height else {}
        rows.append(["total", *([""] * (len(keys) - 1)), *[tot.get(c) for c in columns]])
    return header, rows


def _media(report: Report) -> list[str]:
    """The media the stream names (its ``--by medium`` rows but the ``null`` one)."""
    frame = report.by_medium
    if frame is None or "medium" not in frame.columns:
        return []
    return [str(m) for m in frame["medium"].to_list() if m is not None]


NO_MEDIUM = (
    "by medium: no event names a medium (vLLM names one from 0.11 on), so there is no "
    "tier to split the report by"
)
"""Said once, instead of a ``--by medium`` table whose only row is the ``null`` medium."""


def _no_transitions(report: Report) -> str:
    """The line said instead of an empty tier transitions table."""
    media = _media(report)
    if len(media) == 1:
        return f"tier transitions: none (the stream names one medium, {printable(media[0])})"
    return "tier transitions: none (no block was stored into one medium while live in another)"


def _timeline_rows(report: Report) -> tuple[list[str], list[list[object]]]:
    assert report.timeline is not None
    header = list(report.timeline.columns)
    return header, [list(r) for r in report.timeline.iter_rows()]


def _legend(columns: Sequence[str]) -> str:
    parts: list[str] = []
    for c in columns:
        text = _LEGEND.get(c)
        if text is not None and text not in parts:
            parts.append(text)
    more = "" if len(columns) == len(COLUMNS) else "; all columns: --wide, or --columns a,b"
    return "columns: " + "; ".join(parts) + more


def _summary_line(report: Report) -> str:
    src = report.source
    return (
        f"report: {', '.join(map(printable, src.recordings))}"
        f" - {cell(src.batches)} batches, {cell(src.events)} events; group metadata: "
        f"{'; '.join(map(printable, src.group_metadata))}"
    )


def render_table(
    report: Report,
    console: Console,
    by: Sequence[str] = ("kind", "window"),
    columns: Sequence[str] = DEFAULT_COLUMNS,
) -> None:
    """Print the tables (each with a totals row), the timeline, a legend and the findings.

    Tables fit ``console.width`` (a pipe counts as its ``COLUMNS``, default 80): columns that
    do not fit go to a second block below, so no cell is ever cut to ``…``.

    Args:
        report: The report.
        console: Where to print (stdout's console).
        by: Which tables, in order: ``kind``, ``window``, ``group``.
        columns: Which report columns, in order (see :data:`DEFAULT_COLUMNS`).
    """
    print_prose(console, _summary_line(report))
    for name in by:
        if name == "medium" and not _media(report):
            print_prose(console, NO_MEDIUM)
            continue
        header, rows = _rows(report, name, columns, totals=True)
        nkeys = len(_KEYS[name])
        cols = [
            Column(h, key=i < nkeys) if i < nkeys else Column(COLUMN_LABELS[h])
            for i, h in enumerate(header)
        ]
        print_table(
            console, _TITLES[name], cols, [[cell(v) for v in r] for r in rows], total_last=True
        )
        tiers = report.tier_transitions if name == "medium" else None
        if tiers is not None and not tiers.height:
            print_prose(console, _no_transitions(report))
        elif tiers is not None:
            print_table(
                console,
                "tier transitions (blocks stored into one medium while live in another)",
                [Column(h, key=i < 3) for i, h in enumerate(tiers.columns)],
                [[cell(v) for v in r] for r in tiers.iter_rows()],
            )
    if report.timeline is not None:
        header, rows = _timeline_rows(report)
        cols = [Column(_TIMELINE_LABELS.get(h, h), key=h in ("time_s", "kind")) for h in header]
        print_table(
            console,
            _timeline_title(report),
            cols,
            [[cell(v) for v in r] for r in rows],
        )
    print_prose(console, _legend(columns), style="dim")
    if report.timeline is not None:
        print_prose(console, _TIMELINE_LEGEND, style="dim")
    for line in report.findings:
        print_prose(console, f"finding: {printable(line)}")


def render_json(report: Report, stream: TextIO, *, extra: dict[str, object] | None = None) -> None:
    """Write the JSON contract: ``{"source", "totals", "by_kind", "by_window", "by_group"}``.

    Args:
        report: The report.
        stream: Where to write.
        extra: More top-level keys (``what_if`` of ``--what-if``, ``pool`` of
            ``--pool-blocks``).
    """
    out = report.to_dict()
    out["source"] = {**out["source"], "findings": [str(f) for f in report.findings]}  # type: ignore[dict-item]
    if extra:
        out.update(extra)
    json.dump(out, stream, indent=2)
    stream.write("\n")


def render_csv(report: Report, stream: TextIO, by: Sequence[str] = ("kind", "window")) -> None:
    """Write one tidy CSV: one header line, a ``table`` column naming each row's table.

    The header is ``table, kind, sliding_window, group_idx``, every report column, and, with
    a timeline, ``time_s, stores, removes, live_blocks``. Each selected table contributes its
    rows and a ``total`` row (``table`` = ``by_kind``, ``by_window`` or ``by_group``); timeline
    rows have ``table`` = ``timeline``. Cells a row does not have are empty, so
    ``csv.DictReader`` and DuckDB read the whole file as one table; filter on ``table``.
    Text cells are made printable and neutralised against spreadsheet formulas
    (:func:`kvtool.text.csv_text`).

    Args:
        report: The report.
        stream: Where to write.
        by: Which tables.
    """
    w = csv.writer(stream, lineterminator="\n")
    key_cols = ["kind", "sliding_window", "group_idx"]
    key_cols += [
        k for k, t in (("dp_rank", "rank"), ("channel", "channel"), ("medium", "medium")) if t in by
    ]
    tiers = report.tier_transitions if "medium" in by else None
    tier_cols = ["from_medium", "to_medium", "direction", "blocks"] if tiers is not None else []
    tl = report.timeline
    # A timeline column that is a table column too (blocks_recomputed) fills that one.
    tl_cols = [c for c in tl.columns if c != "kind" and c not in COLUMNS] if tl is not None else []
    w.writerow(["table", *key_cols, *COLUMNS, *tl_cols, *tier_cols])
    pad = [""] * (len(tl_cols) + len(tier_cols))
    for name in by:
        frame: pl.DataFrame = getattr(report, _FRAME[name])
        for r in frame.to_dicts():
            w.writerow(
                [
                    _FRAME[name],
                    *[_csv(r.get(k)) for k in key_cols],
                    *[_csv(r.get(c)) for c in COLUMNS],
                    *pad,
                ]
            )
        tot = report.totals.to_dicts()[0] if report.totals.height else {}
        w.writerow(
            [
                _FRAME[name],
                "total",
                *[""] * (len(key_cols) - 1),
                *[_csv(tot.get(c)) for c in COLUMNS],
                *pad,
            ]
        )
    if report.timeline is not None:
        for r in report.timeline.to_dicts():
            w.writerow(
                [
                    "timeline",
                    _csv(r.get("kind")),
                    *[""] * (len(key_cols) - 1),
                    *[_csv(r[c]) if c in r else "" for c in COLUMNS],
                    *[_csv(r.get(c)) for c in tl_cols],
                    *[""] * len(tier_cols),
                ]
            )
    if tiers is not None:
        # Tier transitions: ``table`` = tier_transitions, keyed by kind.
        for r in tiers.to_dicts():
            w.writerow(
                [
                    "tier_transitions",
                    _csv(r.get("kind")),
                    *[""] * (len(key_cols) - 1),
                    *[""] * (len(COLUMNS) + len(tl_cols)),
                    *[_csv(r.get(c)) for c in tier_cols],
                ]
            )


def _csv(v: object) -> object:
    if v is None:
        return ""
    if isinstance(v, str):
        return csv_text(v)
    return v


def render_markdown(
    report: Report,
    stream: TextIO,
    by: Sequence[str] = ("kind", "window"),
    columns: Sequence[str] = COLUMNS,
) -> None:
    """Write GitHub-flavoured Markdown tables (each with a totals row) and the findings.

    Args:
        report: The report.
        stream: Where to write.
        by: Which tables.
        columns: Which report columns, in order (default: all).
    """
    for name in by:
        if name == "medium" and not _media(report):
            stream.write(f"{_md(NO_MEDIUM)}\n\n")
            continue
        header, rows = _rows(report, name, columns, totals=True)
        stream.write(f"### {_TITLES[name]}\n\n")
        _md_table(stream, header, rows, bold_last=True)
        stream.write("\n")
        tiers = report.tier_transitions if name == "medium" else None
        if tiers is not None and not tiers.height:
            stream.write(f"{_md(_no_transitions(report))}\n\n")
        elif tiers is not None:
            stream.write("### tier transitions\n\n")
            _md_table(
                stream, list(tiers.columns), [list(r) for r in tiers.iter_rows()], bold_last=False
            )
            stream.write("\n")
    if report.timeline is not None:
        header, rows = _timeline_rows(report)
        stream.write(f"### {_timeline_title(report)}\n\n")
        _md_table(stream, header, rows, bold_last=False)
        stream.write("\n")
    for line in report.findings:
        stream.write(f"> finding: {_md(line)}\n")


def _md(text: str) -> str:
    return markdown(text)


def _md_table(
    stream: TextIO, header: list[str], rows: list[list[object]], *, bold_last: bool
) -> None:
    stream.write("| " + " | ".join(header) + " |\n")
    stream.write("|" + "|".join("---" for _ in header) + "|\n")
    for i, r in enumerate(rows):
        cells = [_md(cell(v)) if v != "" else "" for v in r]
        if bold_last and i == len(rows) - 1:
            cells = [f"**{c}**" if c else c for c in cells]
        stream.write("| " + " | ".join(cells) + " |\n")


__all__ = [
    "COLUMN_LABELS",
    "DEFAULT_COLUMNS",
    "TABLES",
    "parse_columns",
    "render_csv",
    "render_json",
    "render_markdown",
    "render_table",
]
