"""Plot a report's timeline: live blocks and eviction rate per kind (matplotlib, optional)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from kvtool.errors import KvtoolError, UsageError

if TYPE_CHECKING:
    from kvtool.report import Report

INSTALL_HINT = "plotting needs matplotlib: pip install 'kvtool[plot]'"


def require_matplotlib() -> None:
    """Fail early, before a long report is computed, when plotting is impossible.

    Raises:
        UsageError: matplotlib is not installed (the message says how to install it).
    """
    try:
        import matplotlib  # noqa: F401
    except ImportError as err:
        raise UsageError(INSTALL_HINT) from err


def plot_report(report: Report, path: str | os.PathLike[str]) -> None:
    """Draw live blocks and eviction rate over time, one line per kind, into an image.

    Args:
        report: A report built with a timeline (``every``).
        path: The image file (``.png``, ``.svg``, ``.pdf`` …).

    Raises:
        UsageError: matplotlib is not installed (the message says how to install it), or
            the report has no timeline.
        KvtoolError: The image cannot be written.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as err:
        raise UsageError(INSTALL_HINT) from err
    tl = report.timeline
    if tl is None or report.every_s is None:
        raise UsageError("--plot needs a timeline; pass --every DURATION")
    every = report.every_s
    fig, (ax_live, ax_rate) = plt.subplots(2, 1, sharex=True, figsize=(10, 6.5))
    for kind in sorted(set(tl["kind"].to_list())):
        part = tl.filter(tl["kind"] == kind)
        t = [x + every for x in part["time_s"].to_list()]
        ax_live.step(t, part["live_blocks"].to_list(), where="post", label=kind)
        ax_rate.step(t, [r / every for r in part["removes"].to_list()], where="post",
                     label=kind)
    ax_live.set_ylabel("live blocks (blocks)")
    ax_live.set_title("KV cache blocks live per kind")
    if tl.height:
        ax_live.legend(loc="best", fontsize="small")
    else:
        ax_live.text(0.5, 0.5, "no blocks stored or removed", ha="center", va="center",
                     transform=ax_live.transAxes)
    ax_live.grid(True, alpha=0.3)
    ax_rate.set_ylabel("evictions (blocks/s)")
    ax_rate.set_xlabel(f"time since first bucket (s; buckets of {every:g} s)")
    ax_rate.set_title("eviction rate per kind")
    ax_rate.grid(True, alpha=0.3)
    fig.tight_layout()
    try:
        fig.savefig(os.fspath(path))
    except (OSError, ValueError) as err:
        raise KvtoolError(f"{os.fspath(path)}: cannot write the plot: {err}") from err
    finally:
        plt.close(fig)


__all__ = ["INSTALL_HINT", "plot_report", "require_matplotlib"]
