"""Plot a report's timeline: live blocks and eviction rate per kind (matplotlib, optional)."""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import TYPE_CHECKING

import kvtool
from kvtool.errors import UsageError
from kvtool.text import printable

if TYPE_CHECKING:
    from kvtool.report import Report

_GRID = "#d9d9d9"
"""The grid's colour: what light grey at 30 % over white looks like, opaque."""

INSTALL_HINT = "plotting needs matplotlib: pip install 'kvtool[plot]'"


def require_matplotlib(path: str | os.PathLike[str] | None = None) -> None:
    """Fail early, before a long report is computed, when plotting is impossible.

    Args:
        path: The image to draw, when known: its suffix must name a format matplotlib
            writes.

    Raises:
        UsageError: matplotlib is not installed (the message says how to install it), or
            the suffix names no image format.
    """
    try:
        import matplotlib  # noqa: F401  (first: a blocked or missing package stops here)
        from matplotlib.backend_bases import FigureCanvasBase
    except ImportError as err:
        raise UsageError(INSTALL_HINT) from err
    if path is not None:
        fmt = _format(path)
        formats = _formats(FigureCanvasBase.get_supported_filetypes())
        if fmt not in formats:
            raise UsageError(
                f"--plot {printable(os.fspath(path))!r}: cannot draw {printable(fmt)!r} images; "
                f"use one of .{', .'.join(formats)}"
            )


# Formats matplotlib lists that need more than matplotlib and Pillow: pgf runs LaTeX.
_NEEDS_MORE = frozenset({"pgf"})


def _formats(supported: dict[str, str]) -> list[str]:
    return sorted(f for f in supported if f not in _NEEDS_MORE)


def _format(path: str | os.PathLike[str]) -> str:
    return Path(path).suffix[1:].lower() or "png"


def _metadata(fmt: str) -> dict[str, str] | None:
    """Name kvtool as the image's maker (for whoever reads the file; ``--force`` never looks).

    None for the formats whose writer takes no metadata (Pillow's: jpeg, tiff, webp, gif,
    avif; raw bitmaps): matplotlib raises on any there (issue 24: ``--plot out.jpg`` was an
    internal error).
    """
    maker = f"kvtool {kvtool.__version__} (matplotlib)"
    if fmt == "png":
        return {"Software": maker}
    if fmt in ("pdf", "svg", "svgz", "ps", "eps"):
        return {"Creator": maker}
    return None


def plot_report(report: Report, path: str | os.PathLike[str], *, force: bool = False) -> None:
    """Draw live blocks and eviction rate over time, one line per kind, into an image.

    The image is rendered in memory and written through :class:`kvtool.outputs.AtomicFile`:
    matplotlib's own ``savefig(path)`` loses write errors (``--plot /dev/full`` would
    claim success) and writes the target in place.

    Args:
        report: A report built with a timeline (``every``).
        path: The image file; its suffix picks the format (``.png``, ``.svg``, ``.pdf`` …;
            none means PNG). Already checked with :func:`kvtool.outputs.check_output`.
        force: Replace an existing image.

    Raises:
        UsageError: matplotlib is not installed (the message says how to install it),
            the report has no timeline, or the suffix names no format matplotlib writes.
        OutputError: The image cannot be written.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as err:
        raise UsageError(INSTALL_HINT) from err
    require_matplotlib(path)
    tl = report.timeline
    if tl is None or report.every_s is None:
        raise UsageError("--plot needs a timeline; pass --every DURATION")
    every = report.every_s
    start, end = _span(report)
    fig, (ax_live, ax_rate) = plt.subplots(2, 1, sharex=True, figsize=(10, 6.5))
    for kind in sorted(set(tl["kind"].to_list())):
        part = tl.filter(tl["kind"] == kind)
        live_x, live_y, rate_x, rate_y = _series(
            part["time_s"].to_list(),
            part["width_s"].to_list(),
            part["live_blocks"].to_list(),
            part["removes"].to_list(),
            start,
        )
        (line,) = ax_live.plot(live_x, live_y, marker=".", label=kind)
        ax_rate.plot(rate_x, rate_y, color=line.get_color(), label=kind)
    ax_live.set_ylabel("live blocks (blocks)")
    ax_live.set_title("KV cache blocks live per kind")
    if tl.height:
        ax_live.legend(loc="best", fontsize="small", framealpha=1.0)
    else:
        ax_live.text(
            0.5,
            0.5,
            "no blocks stored or removed",
            ha="center",
            va="center",
            transform=ax_live.transAxes,
        )
    # Opaque colours only: PostScript has no transparency, and matplotlib says so on
    # stderr for every .eps/.ps (issue 24: it leaked through -q).
    ax_live.grid(True, color=_GRID)
    ax_rate.set_ylabel("evictions (blocks/s)")
    clock = report.source.clock
    ax_rate.set_xlabel(
        f"seconds since the first message ({clock} clock; buckets of {every:g} s, "
        "the last one partial: rates over the seconds it covers)"
    )
    if end > start:
        ax_rate.set_xlim(start, end)
    ax_rate.set_title("eviction rate per kind")
    ax_rate.grid(True, color=_GRID)
    fig.tight_layout()
    target = Path(path)
    fmt = _format(target)
    try:
        buf = io.BytesIO()
        meta = _metadata(fmt)
        if meta is None:
            fig.savefig(buf, format=fmt)
        else:
            fig.savefig(buf, format=fmt, metadata=meta)
    finally:
        plt.close(fig)
    from kvtool.outputs import AtomicFile

    with AtomicFile(target, force=force) as af, af.open_bytes() as f:
        f.write(buf.getvalue())


def _span(report: Report) -> tuple[float, float]:
    """The data's (first, last) time on the timeline's axis (seconds since the origin)."""
    tl = report.timeline
    assert tl is not None and report.every_s is not None
    span = report.source.timeline
    lo, hi = (span.start_s, span.end_s) if span is not None else (None, None)
    times = tl["time_s"].to_list()
    if not isinstance(lo, float | int):
        lo = min(times, default=0.0)
    if not isinstance(hi, float | int):
        hi = max(times, default=0.0) + report.every_s
    return float(lo), float(hi)


def _series(
    times: list[float], widths: list[float], live: list[int], removes: list[int], start: float
) -> tuple[list[float], list[float], list[float], list[float]]:
    """One kind's lines: live blocks at each bucket's end, evictions/s over its covered part.

    A bucket covers ``[max(time_s, start), + width_s)``: the level is known at its end
    (starting from 0 at the first message: the report's state starts empty there), the
    rate is its removes over ``width_s`` (none for a bucket of no width), drawn as one
    flat segment over exactly that span; buckets that do not touch (a sparse timeline)
    are not joined.
    """
    nan = float("nan")
    live_x, live_y = [start], [0.0]
    rate_x: list[float] = []
    rate_y: list[float] = []
    for t, w, level, n in zip(times, widths, live, removes, strict=True):
        lo = max(t, start)
        hi = lo + w
        live_x.append(hi)
        live_y.append(float(level))
        if rate_x and rate_x[-1] != lo:
            rate_x.append(nan)
            rate_y.append(nan)
        rate = n / w if w > 0 else nan
        rate_x += [lo, hi]
        rate_y += [rate, rate]
    return live_x, live_y, rate_x, rate_y


def plot_what_if(
    entries: list[dict[str, object]], path: str | os.PathLike[str], *, force: bool = False
) -> None:
    """Draw predicted recomputed blocks against pool size, one line per pool and kind.

    The x axis is the pool size (``pool_blocks + extra_blocks``) when the size is known,
    else the extra blocks; the recorded pool is the first point of every line.

    Args:
        entries: The ``what_if`` entries of :func:`kvtool.report.whatif.what_if`.
        path: The image file (already checked with :func:`kvtool.outputs.check_output`).
        force: Replace an existing image.

    Raises:
        UsageError: matplotlib is not installed, or the suffix names no image format.
        OutputError: The image cannot be written.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as err:
        raise UsageError(INSTALL_HINT) from err
    require_matplotlib(path)
    lines: dict[str, list[tuple[int, int, int | None, int | None]]] = {}
    known = all(isinstance(e.get("pool_blocks"), int) for e in entries)
    pools = {(e["channel"], e["rank"]) for e in entries}
    for e in entries:
        base = e["pool_blocks"] if known else 0
        assert isinstance(base, int)
        k = e["extra_blocks"]
        assert isinstance(k, int)
        rows = e["by_kind"]
        assert isinstance(rows, list)
        for row in rows:
            name = str(row["kind"])
            if len(pools) > 1:
                rank = e["rank"]
                name = f"{e['channel']} r{rank if rank is not None else '-'} {name}"
            pts = lines.setdefault(
                name, [(base, int(row["blocks_recomputed_recorded"]), None, None)]
            )
            band = row.get("blocks_recomputed_band")
            lo, hi = (int(band[0]), int(band[1])) if isinstance(band, list) else (None, None)
            pts.append((base + k, int(row["blocks_recomputed"]), lo, hi))
    fig, ax = plt.subplots(figsize=(9, 5.5))
    for name, pts in sorted(lines.items()):
        pts.sort()
        xs = [p[0] for p in pts]
        (ln,) = ax.plot(xs, [p[1] for p in pts], marker="o", label=name)
        banded = [(p[0], p[2], p[3]) for p in pts if p[2] is not None and p[3] is not None]
        if banded:
            ax.fill_between(
                [p[0] for p in banded],
                [p[1] or 0 for p in banded],
                [p[2] or 0 for p in banded],
                color=ln.get_color(),
                alpha=0.2,
            )
    ax.set_xlabel("pool size (blocks)" if known else "extra blocks (K; pool size unknown)")
    ax.set_ylabel("blocks recomputed (predicted)")
    ax.set_title("What if the KV cache had more blocks: recomputed blocks per kind")
    ax.set_ylim(bottom=0)
    if lines:
        ax.legend(loc="best", fontsize="small")
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    target = Path(path)
    fmt = _format(target)
    try:
        buf = io.BytesIO()
        fig.savefig(buf, format=fmt, metadata=_metadata(fmt))
    finally:
        plt.close(fig)
    from kvtool.outputs import AtomicFile

    with AtomicFile(target, force=force) as af, af.open_bytes() as f:
        f.write(buf.getvalue())


__all__ = ["INSTALL_HINT", "plot_report", "plot_what_if", "require_matplotlib"]
