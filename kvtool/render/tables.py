"""Rich tables that fit the console: numbers never cut, columns wrapped into stacked blocks."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvtool.text import printable

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table


@dataclass(frozen=True)
class Column:
    """One table column.

    Attributes:
        header: The header text (may hold a newline: name, then unit).
        key: True for a key column (left-aligned, repeated in every block).
    """

    header: str
    key: bool = False


def cell(value: object) -> str:
    """Format one table cell: thousands separators, no truncation, ``-`` for none.

    Args:
        value: A number, a string from a file (made printable) or None.

    Returns:
        The cell's text.
    """
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if value != value:
            return "-"
        return f"{value:,.3f}" if abs(value) < 1000 else f"{value:,.0f}"
    return printable(value)


def _width(texts: Sequence[str]) -> int:
    from rich.cells import cell_len

    return max((cell_len(line) for t in texts for line in t.split("\n")), default=0)


def _table(
    title: str | None, cols: Sequence[Column], rows: Sequence[Sequence[str]], total_last: bool
) -> Table:
    # rich is imported here, not at start-up: JSON, CSV and Markdown output never need it.
    from rich import box
    from rich.table import Table
    from rich.text import Text

    t = Table(
        title=Text(title) if title else None,
        title_justify="left",
        box=box.SIMPLE,
        show_edge=False,
        pad_edge=False,
        padding=(0, 1, 0, 0),
        show_footer=total_last and bool(rows),
    )
    body = rows[:-1] if total_last and rows else rows
    for i, c in enumerate(cols):
        # fold, never "…": a column that still does not fit wraps its digits instead.
        t.add_column(
            Text(c.header),
            footer=Text(rows[-1][i]) if total_last and rows else "",
            justify="left" if c.key else "right",
            overflow="fold",
        )
    for r in body:
        t.add_row(*(Text(v) for v in r))
    return t


def print_table(
    console: Console,
    title: str | None,
    columns: Sequence[Column],
    rows: Sequence[Sequence[str]],
    *,
    total_last: bool = False,
) -> None:
    """Print a table that fits ``console.width``; value columns that do not fit go below.

    Every block repeats the key columns, so each line still says which row it is. Cells
    must already be text (see :func:`cell`); they are printed literally, never as markup.

    Args:
        console: Where to print.
        title: The table's title.
        columns: Key columns first, then value columns.
        rows: One list of cell texts per row.
        total_last: The last row is a totals row, shown as the footer below a rule.
    """
    keys = [i for i, c in enumerate(columns) if c.key]
    values = [i for i, c in enumerate(columns) if not c.key]
    widths = [_width([columns[i].header, *(r[i] for r in rows)]) for i in range(len(columns))]
    # SIMPLE without edges, right padding only: two spaces between columns.
    limit = console.width

    def need(idx: list[int]) -> int:
        return sum(widths[i] for i in idx) + 2 * (len(idx) - 1)

    blocks: list[list[int]] = []
    current: list[int] = []
    for i in values:
        if current and need(keys + current + [i]) > limit:
            blocks.append(current)
            current = []
        current.append(i)
    if current or not blocks:
        blocks.append(current)
    for n, block in enumerate(blocks):
        idx = keys + block
        t = _table(
            title if n == 0 else None,
            [columns[i] for i in idx],
            [[r[i] for i in idx] for r in rows],
            total_last,
        )
        console.print(t)


__all__ = ["Column", "cell", "print_table"]


def print_prose(console: Console, text: str, style: str = "") -> None:
    """Print a line of prose wrapped at ``console.width``, never cut with ``…``.

    Wrapped at spaces; a word wider than a line (a long path) is folded; no trailing blanks.

    Args:
        console: Where to print.
        text: Printable text (see :func:`kvtool.text.printable`), printed literally.
        style: A rich style for all of it.
    """
    from rich.text import Text

    for line in Text(text, style=style).wrap(console, console.width, overflow="fold"):
        line.rstrip()
        console.print(line, highlight=False, soft_wrap=True)
