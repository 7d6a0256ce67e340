"""Render :class:`kvtool.top.TopModel` as a full-screen rich view or as a plain text block."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.cells import cell_len
from rich.console import Group
from rich.table import Table
from rich.text import Text

from kvtool.report.registry import short_label
from kvtool.text import printable
from kvtool.top import HISTORY_S, sparkline

if TYPE_CHECKING:
    from rich.console import RenderableType

    from kvtool.streams import Health
    from kvtool.top import TopModel, TopRow

COLUMNS: tuple[tuple[str, bool], ...] = (
    ("live_blocks_end", False),
    ("peak_live_blocks", False),
    ("blocks_stored", True),
    ("blocks_removed", True),
    ("blocks_recomputed", True),
    ("orphan_removes", False),
    ("lifetime_p50_s", False),
)
"""The number columns, in order: the report metric each shows, and whether as a rate."""
PER_S = "/s"
# Short headers (the registry's short labels, a rate's with /s), so the table fits 80
# columns: label 18, numbers 7-9, spark 12.
HEADERS = tuple(short_label(m) + (PER_S if rate else "") for m, rate in COLUMNS)
SPARK_HEADER = f"{HISTORY_S:g}s"
"""The sparkline's header: the live blocks of the last :data:`kvtool.top.HISTORY_S`."""
LEGEND = (
    f"blocks; {PER_S} over the last interval; "
    f"{short_label('blocks_recomputed')}: stored again after eviction (thrash); "
    f"{short_label('orphan_removes')}: removes of blocks not live; "
    f"{short_label('lifetime_p50_s')}: median lifetime; {SPARK_HEADER}: live blocks"
)
HIT_COLUMN = "hit_rate"
"""The column shown only where it has a value (``--report-mode full``: every request
announces), after the others: default views keep their 80 columns."""
HIT_HEADER = short_label(HIT_COLUMN)
HIT_LEGEND = f"; {HIT_HEADER}: hit tokens / (hit + stored tokens)"
_WIDTHS = tuple(max(7, len(h)) for h in HEADERS)
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


def _cells(row: TopRow, hits: bool = False) -> list[str]:
    out = [
        _n(row.live),
        _n(row.peak),
        _rate(row.stores_per_s),
        _rate(row.evictions_per_s),
        _rate(row.recomputed_per_s),
        _n(row.orphans),
        _p50(row.lifetime_p50_s),
    ]
    if hits:
        out.append("-" if row.hit_rate is None else f"{row.hit_rate:.1%}")
    return out


def _with_hits(rows: list[TopRow]) -> bool:
    """Whether the hit rate column is shown: some row has one."""
    return any(r.hit_rate is not None for r in rows)


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
    hits = _with_hits(rows)
    heads = (*HEADERS, HIT_HEADER) if hits else HEADERS
    col_w = (*_WIDTHS, len(HIT_HEADER)) if hits else _WIDTHS
    width = max([len(view), *(len(printable(r.label)) for r in rows)])
    first, _, second = health_line(model.health, model.batches_per_s, model.t).partition("  gaps:")
    lines = [
        f"kvtool top  {printable(model.health.source)}",
        first,
        *(["gaps:" + second] if second else []),
        " ".join([view.ljust(width), *map(str.rjust, heads, col_w)]).rstrip(),
    ]
    for r in rows:
        cells = (c.rjust(w) for c, w in zip(_cells(r, hits), col_w, strict=True))
        lines.append(" ".join([printable(r.label).ljust(width), *cells]).rstrip())
    if not rows:
        lines.append("(no block events yet)")
    return "\n".join(lines) + "\n"


_NUMBER_W = 7
"""Every number column is at least this wide (its header's width), so no column changes
width from one refresh to the next while its numbers stay this short."""
_SPARK_W = 8
_GIVE_WAY = (7, 6, 5, 4, 3, 2, 1, 0)
"""The order number columns give way on a narrow terminal (indices into the columns, the
sparkline being 7; with the hit rate column, it is 7 and the sparkline 8, which goes
first): the key column is never the one to go (issue 24)."""


def screen(
    model: TopModel, view: str, *, paused: bool = False, width: int = 80, height: int = 24
) -> RenderableType:
    """Return the full-screen view: health, the table with sparklines, legend and keys.

    The key column never wraps and never disappears: on a narrow terminal the number
    columns give way first, from the right (the sparkline, then p50, orphans, …), and a
    key longer than the whole width is cut with an ellipsis rather than folded. On a short
    terminal the legend and the keys' help go before any row.

    Args:
        model: The model.
        view: The view to show.
        paused: The view is paused.
        width: The terminal's width.
        height: The terminal's height.

    Returns:
        A rich renderable that fits ``width`` columns.
    """
    title = Text(f"kvtool top  {printable(model.health.source)}", style="bold", no_wrap=True)
    title.truncate(width, overflow="ellipsis")
    line = health_line(model.health, model.batches_per_s, model.t, paused=paused)
    first, _, second = line.partition("  gaps:")
    health = Text(first + ("\ngaps:" + second if second else ""))
    rows = model.rows(view)
    labels = [printable(r.label) for r in rows]
    hits = _with_hits(rows)
    cells = [_cells(r, hits) for r in rows]
    sparks = [sparkline(r.spark, _SPARK_W) for r in rows]
    key_w = min(width, max([cell_len(view), *(cell_len(x) for x in labels)]))
    numbers = [*HEADERS, HIT_HEADER] if hits else list(HEADERS)
    heads = [*numbers, SPARK_HEADER]
    widths = [
        max(_NUMBER_W, len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(numbers)
    ] + [_SPARK_W]
    shown = list(range(len(heads)))
    for i in (len(numbers), *_GIVE_WAY) if hits else _GIVE_WAY:
        if key_w + sum(widths[j] + 1 for j in shown) <= width:
            break
        shown.remove(i)
    table = Table(box=None, pad_edge=False, padding=(0, 1, 0, 0), header_style="bold")
    table.add_column(view, no_wrap=True, overflow="ellipsis", width=key_w)
    for j in shown:
        table.add_column(
            heads[j], justify="right" if j < len(numbers) else "left", no_wrap=True,
            min_width=widths[j],
        )  # fmt: skip
    for label, c, spark in zip(labels, cells, sparks, strict=True):
        values = [*c, spark]
        table.add_row(Text(label, no_wrap=True, overflow="ellipsis"), *(values[j] for j in shown))
    legend_text = LEGEND + (HIT_LEGEND if hits else "")
    legend = Text(legend_text, style="dim")
    keys = Text(KEYS_HELP, style="dim")
    health_lines = sum(max(1, -(-cell_len(x) // max(1, width))) for x in health.plain.split("\n"))
    legend_lines = -(-cell_len(legend_text) // max(1, width))
    keys_lines = -(-cell_len(KEYS_HELP) // max(1, width))
    used = 1 + health_lines + 1 + 1 + max(1, len(rows))
    parts: list[RenderableType] = [title, health, Text(""), table]
    if used + 1 + legend_lines + keys_lines <= height:
        parts += [Text(""), legend, keys]
    elif used + 1 + keys_lines <= height:
        parts += [Text(""), keys]
    return Group(*parts)


__all__ = [
    "COLUMNS",
    "HEADERS",
    "HIT_COLUMN",
    "HIT_HEADER",
    "KEYS_HELP",
    "SPARK_HEADER",
    "health_line",
    "plain_block",
    "screen",
]
