"""The batch selection of ``report`` and ``export`` (``--channel --rank --since --until``).

The same :class:`kvtool.replay.BatchFilter` ``replay`` selects with, applied once while
reading (:func:`kvtool.columns.iter_raw_chunks`): times are receive times, relative
bounds count from the first message of the input, as ``replay`` counts them.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvtool.errors import UsageError
from kvtool.replay import BatchFilter, parse_rank, parse_time_bound
from kvtool.text import printable


def _split(values: Sequence[str] | None) -> list[str]:
    out: list[str] = []
    for v in values or []:
        out.extend(p.strip() for p in v.split(",") if p.strip())
    return out


def make_selection(
    *,
    channel: Sequence[str] | None = None,
    rank: Sequence[str] | None = None,
    since: str | None = None,
    until: str | None = None,
) -> BatchFilter | None:
    """Parse the selection options into a filter (None when none is given).

    Args:
        channel: ``--channel`` values (name, endpoint, glob or port; comma lists too).
        rank: ``--rank`` values (a data-parallel rank or ``none``).
        since: ``--since`` (seconds from the start, or an ISO time).
        until: ``--until``.

    Returns:
        The filter, or None.

    Raises:
        UsageError: A value does not parse, or ``--since`` is after ``--until``.
    """
    channels = _split(channel)
    ranks = _split(rank)
    if not (channels or ranks or since is not None or until is not None):
        return None
    lo = parse_time_bound(since, option="--since") if since is not None else None
    hi = parse_time_bound(until, option="--until") if until is not None else None
    if lo is not None and hi is not None:
        # Both relative or both absolute: comparable without reading the input.
        pair = (
            (lo.offset_ns, hi.offset_ns)
            if lo.absolute_ns is None and hi.absolute_ns is None
            else (lo.absolute_ns, hi.absolute_ns)
        )
        if pair[0] is not None and pair[1] is not None and pair[0] > pair[1]:
            raise UsageError(
                f"--since {printable(str(since))} is after --until {printable(str(until))}: "
                "the window is empty"
            )
    return BatchFilter(
        channels=tuple(channels) if channels else None,
        ranks=frozenset(parse_rank(r) for r in ranks) if ranks else None,
        since=lo,
        until=hi,
    )


def selection_note(
    given: Sequence[tuple[str, str | Sequence[str] | None]], batches: int, unselected: int
) -> str | None:
    """The stderr line when a valid selection kept nothing, else None.

    Args:
        given: (option, value) of each selection option.
        batches: Batches kept.
        unselected: Batches left out.

    Returns:
        E.g. ``0 of 64 batches matched --since 5s``.
    """
    if batches or not unselected:
        return None
    shown = " ".join(
        f"{opt} {printable(v if isinstance(v, str) else ','.join(v))}" for opt, v in given if v
    )
    return f"0 of {unselected:,} batches matched {shown}"


__all__ = ["make_selection", "selection_note"]
