"""Render :class:`kvtool.top.TopModel` as a full-screen rich view or as a plain text block."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Group
from rich.table import Table
from rich.text import Text

from kvtool.text import printable
from kvtool.top import sparkline

if TYPE_CHECKING:
    from rich.console import RenderableType

    from kvtool.top import Health, TopModel, TopRow

# Short headers with units, so the table fits 80 columns: label 18, numbers 7-9, spark 12.
HEADERS = ("live", "peak", "store/s", "evict/s", "rest/s", "orphan", "p50 s")
LEGEND = (
    "blocks; /s over the last interval; rest: re-stored while live; orphan: removes of "
    "blocks not live; p50 s: median lifetime; 60s: live blocks"
)
KEYS_HELP = "q quit · k kind · w window · g group · r rank · p pause"


def _n(v: int) -> str:
    return f"{v:,}"


def _rate(v: float) -> str:
    return f"{v:,.0f}" if v >= 10 else f"{v:.1f}"


def _p50(v: float | None) -> str:
    if v is None:
        return "-"
    # Lifetimes span milliseconds to hours: three significant digits below 10 s.
    return f"{v:.3g}" if abs(v) < 10 else f"{v:,.0f}"


def health_line(h: Health, batches_per_s: float, t: float | None, *, paused: bool = False) -> str:
    """Return the one-line stream health summary.

    Args:
        h: The health.
        batches_per_s: Batches per second over the last interval.
        t: Seconds since the start, or None.
        paused: The view is paused.

    Returns:
        One line, printable.
    """
    age = "-" if h.last_batch_age_s is None else f"{h.last_batch_age_s:.1f}s ago"
    parts = [
        f"t={t:.1f}s" if t is not None else "t=-",
        f"publishers {h.connected}/{h.publishers}",
        f"batches {h.batches:,} ({batches_per_s:,.1f}/s)",
        f"last batch {age}",
        f"gaps: recovered {h.gaps_recovered:,}",
        f"lost {h.lost:,}",
        f"restarts {h.restarts}",
    ]
    if h.done:
        parts.append("ended")
    if paused:
        parts.append("PAUSED")
    return "  ".join(parts)


def _cells(row: TopRow) -> list[str]:
    return [
        _n(row.live),
        _n(row.peak),
        _rate(row.stores_per_s),
        _rate(row.evictions_per_s),
        _rate(row.restored_per_s),
        _n(row.orphans),
        _p50(row.lifetime_p50_s),
    ]


def plain_block(model: TopModel, view: str) -> str:
    """Return one summary block of plain text (``--once`` and non-terminal output).

    Args:
        model: The model.
        view: The view to show.

    Returns:
        Lines ending with a newline: the source, two health lines, a header, one line per
        row; 80 columns for labels up to 24 characters (numbers are never cut).
    """
    rows = model.rows(view)
    width = max([len(view), *(len(printable(r.label)) for r in rows)])
    first, _, second = health_line(model.health, model.batches_per_s, model.t).partition("  gaps:")
    lines = [
        f"kvtool top  {printable(model.health.source)}",
        first,
        *(["gaps:" + second] if second else []),
        " ".join([view.ljust(width), *(h.rjust(7) for h in HEADERS)]).rstrip(),
    ]
    for r in rows:
        lines.append(
            " ".join([printable(r.label).ljust(width), *(c.rjust(7) for c in _cells(r))]).rstrip()
        )
    if not rows:
        lines.append("(no block events yet)")
    return "\n".join(lines) + "\n"


def screen(model: TopModel, view: str, *, paused: bool = False) -> RenderableType:
    """Return the full-screen view: health, the table with sparklines, legend and keys.

    Args:
        model: The model.
        view: The view to show.
        paused: The view is paused.

    Returns:
        A rich renderable that fits 80 columns.
    """
    title = Text(f"kvtool top  {printable(model.health.source)}", style="bold")
    line = health_line(model.health, model.batches_per_s, model.t, paused=paused)
    first, _, second = line.partition("  gaps:")
    health = Text(first + ("\ngaps:" + second if second else ""))
    table = Table(box=None, pad_edge=False, padding=(0, 1, 0, 0), header_style="bold")
    table.add_column(view, overflow="fold", min_width=8, max_width=16)
    for h in HEADERS:
        table.add_column(h, justify="right", no_wrap=True)
    table.add_column("60s", no_wrap=True)
    for r in model.rows(view):
        table.add_row(Text(printable(r.label)), *_cells(r), sparkline(r.spark, 8))
    legend = Text(LEGEND, style="dim")
    keys = Text(KEYS_HELP, style="dim")
    return Group(title, health, Text(""), table, Text(""), legend, keys)


__all__ = ["HEADERS", "KEYS_HELP", "health_line", "plain_block", "screen"]
