"""Lifetimes, recompute gaps and recompute distances: where the report gathers them.

Every sample the percentile columns read is gathered here, chunk by chunk
(:func:`gather`), and merged across units of work here (:func:`merge_parts`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from kvtool.columns import np
from kvtool.report import kernel
from kvtool.report.aggregates import EXACT_LIFETIMES
from kvtool.report.arrays import seconds_between
from kvtool.report.samples import Counts, Seconds

if TYPE_CHECKING:
    from numpy.typing import NDArray

    from kvtool.report.partial import PartialReport


def gather(
    life: Seconds,
    gaps: Seconds,
    distances: Counts,
    gkey: NDArray[Any],
    what: NDArray[Any],
    ts: NDArray[Any],
    out: kernel.Out,
) -> int:
    """Add one chunk's block lifetimes (FIFO pairs), recompute gaps and distances.

    Args:
        life: The block lifetimes so far (added to).
        gaps: The recompute gaps so far (added to).
        distances: The recompute distances so far (added to).
        gkey: Each row's report row.
        what: The kernel's verdict per row.
        ts: Each row's plausible publish time (s).
        out: The kernel's output for the chunk (the store times and distances).

    Returns:
        The lifetimes that were negative (clamped to 0; a finding).
    """
    paired = np.flatnonzero((what == kernel.EVICTED) | (what == kernel.EVICTED_EXTRA))
    negative = add_lifetimes(life, gkey[paired], ts[paired], out.ts[paired])
    again = np.flatnonzero(what == kernel.RECOMPUTED)
    if len(again):
        gap = seconds_between(out.ts[again], ts[again])
        finite = np.isfinite(gap)
        gaps.add(gkey[again][finite], np.maximum(gap[finite], 0.0), EXACT_LIFETIMES)
        distances.add(gkey[again], out.distance[again])
    return negative


def add_lifetimes(
    life_s: Seconds, gk: NDArray[Any], remove_ts: NDArray[Any], store_ts: NDArray[Any]
) -> int:
    """Lifetimes of this chunk's FIFO pairs, counted under the remove's report row.

    ts is float seconds since the epoch: the difference is taken at microsecond
    resolution so that float rounding of large timestamps does not show up (rounded
    half to even, scaled back by a multiplication: what polars computes for
    ``(r * 1e6).round() - (s * 1e6).round()) / 1e6``). A clock that steps backwards
    between store and remove gives a negative difference: it is clamped to 0 and
    counted (a finding), never reported as a negative lifetime.

    Returns:
        The negative lifetimes clamped.
    """
    if len(gk) == 0:
        return 0
    with np.errstate(invalid="ignore"):
        life = seconds_between(store_ts, remove_ts)
        finite = np.isfinite(life)
        if not finite.all():  # a ts that is NaN or inf: none
            life, gk = life[finite], gk[finite]
        if len(life) == 0:
            return 0
        negative = int((life < 0).sum())
    if negative:
        life = np.maximum(life, 0.0)
    life_s.add(gk, life, EXACT_LIFETIMES)
    return negative


def merge_parts(
    parts: Sequence[PartialReport], row_ids: list[dict[int, int]]
) -> tuple[Seconds, Seconds, Counts]:
    """The units' lifetimes, recompute gaps and distances merged (``row_ids``: gkeys)."""
    life = Seconds.merge(
        [(p.lifetimes, i) for p, i in zip(parts, row_ids, strict=True)], EXACT_LIFETIMES
    )
    gaps = Seconds.merge(
        [(p.gaps, i) for p, i in zip(parts, row_ids, strict=True)], EXACT_LIFETIMES
    )
    distances = Counts.merge([(p.distances, i) for p, i in zip(parts, row_ids, strict=True)])
    return life, gaps, distances


__all__ = ["EXACT_LIFETIMES", "add_lifetimes", "gather", "merge_parts"]
