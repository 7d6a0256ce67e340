"""What a recording's gap ledger says is missing, worded once (issues 19 and 23).

Two facts, each with one wording that every command uses (``info``, ``report``, ``diff``,
``top``, ``serve``, ``replay``, ``export``, ``record``), whether it reads a recording's ledger
or the one a live recorder holds:

- batches **lost while recording** (:func:`lost_line`);
- channel tails the replay socket **never confirmed** (:func:`unconfirmed_lines`,
  :func:`unconfirmed_text`), the channels the ledger lists as unconfirmed
  (:func:`unconfirmed_tails`).

:func:`ledger_lines` gives both for one ledger. Light on purpose: every command that reads
a recording says these (``report``'s start-up imports it), so it needs only the ledger's
types.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from kvtool.recording.ledger import GapLedger

__all__ = [
    "UnconfirmedTail",
    "ledger_lines",
    "lost_line",
    "unconfirmed_lines",
    "unconfirmed_tails",
    "unconfirmed_text",
]

SHOWN = 5
"""Seq ranges (or channel tails) a line names; the rest are ``…``."""


class UnconfirmedTail(msgspec.Struct, kw_only=True):
    """A channel whose tail the replay socket never confirmed (issue 23).

    The recorder asked the replay socket for what followed the last batch it saw, and
    the answer never ended (no end marker within the deadline): batches published after
    ``from_seq - 1`` may exist and are not in the recording.

    Attributes:
        channel: MCAP channel topic.
        endpoint: ZeroMQ endpoint.
        topic: ZeroMQ topic.
        dp_rank: Data-parallel rank, when known.
        from_seq: First seq whose existence is unconfirmed; None when the ledger does
            not say (totals only).
    """

    channel: str
    endpoint: str
    topic: str
    dp_rank: int | None
    from_seq: int | None

    def to_json(self) -> dict[str, object]:
        """Return ``{"endpoint", "topic", "dp_rank", "from_seq"}``.

        Returns:
            A JSON-serialisable dict.
        """
        return {
            "endpoint": self.endpoint,
            "topic": self.topic,
            "dp_rank": self.dp_rank,
            "from_seq": self.from_seq,
        }


def lost_line(
    path: str,
    lost: int,
    ranges: Sequence[Sequence[int]],
    *,
    more: bool = False,
    orphans: bool = False,
) -> str:
    """Say that batches were lost while recording: the one wording of it.

    Args:
        path: The recording (or the live stream) the line names first.
        lost: Batches lost (exact).
        ranges: The lost seq ranges ``[first, last]``; the first :data:`SHOWN` are named.
        more: Ranges were left out of ``ranges`` (the ledger's ``lost_ranges_omitted``).
        orphans: Also say what it does to a report (removes of blocks stored in the lost
            batches count as orphans), for the report's finding.

    Returns:
        ``PATH: 2 batches were lost while recording (seq 10-11); counts miss their events``.
    """
    seqs = ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in ranges[:SHOWN])
    tail = ", …" if more or len(ranges) > SHOWN else ""
    what = "batch was" if lost == 1 else "batches were"
    return (
        f"{path}: {lost} {what} lost while recording"
        + (f" (seq {seqs}{tail})" if seqs else "")
        + "; counts miss their events"
        + (", and removes of blocks stored in them count as orphans" if orphans else "")
    )


def unconfirmed_text(tails: Sequence[UnconfirmedTail]) -> str:
    """Say which channel tails the replay socket never confirmed, without a path.

    ``info``'s ``Unconfirmed:`` row is this text; :func:`unconfirmed_lines` puts the path
    before it.

    Args:
        tails: :func:`unconfirmed_tails` of a ledger (at least one).

    Returns:
        ``the replay socket never confirmed what followed CHANNEL after seq N (its answer
        never ended); batches published after it may be missing``.
    """
    where = ", ".join(_tail_text(t) for t in tails[:SHOWN])
    if len(tails) > SHOWN:
        where += f", … ({len(tails) - SHOWN} more)"
    return (
        f"the replay socket never confirmed what followed {where} (its answer never "
        "ended); batches published after it may be missing"
    )


def unconfirmed_lines(path: str, tails: Sequence[UnconfirmedTail]) -> list[str]:
    """Say which channel tails the replay socket never confirmed: one line, or none.

    Args:
        path: The recording (or the stream) the line names first.
        tails: :func:`unconfirmed_tails` of its ledger.

    Returns:
        No line when every tail was confirmed, else ``PATH:`` and :func:`unconfirmed_text`.
    """
    return [f"{path}: {unconfirmed_text(tails)}"] if tails else []


def _tail_text(t: UnconfirmedTail) -> str:
    """A tail by its channel and the last seq recorded before it (the first unconfirmed - 1)."""
    name = t.channel or "a channel"
    return f"{name} after seq {t.from_seq - 1}" if t.from_seq else name


def ledger_lines(path: str, ledger: GapLedger | None, *, orphans: bool = False) -> list[str]:
    """Say what a gap ledger lists as missing: its lost batches, then its unconfirmed tails.

    The one source of both lines, for a recording's ledger and for the one a live
    recorder holds (``record``, live ``top`` and ``serve``).

    Args:
        path: The recording (or the live stream) the lines name first.
        ledger: The gap ledger, or None (nothing is said).
        orphans: See :func:`lost_line`.

    Returns:
        No line when nothing is missing; else the lost-batches line and/or the
        unconfirmed-tails line.
    """
    if ledger is None:
        return []
    out: list[str] = []
    if ledger.lost > 0:
        out.append(
            lost_line(
                path,
                ledger.lost,
                ledger.lost_ranges,
                more=bool(ledger.lost_ranges_omitted),
                orphans=orphans,
            )
        )
    return out + unconfirmed_lines(path, unconfirmed_tails(ledger))


def unconfirmed_tails(ledger: GapLedger | None) -> list[UnconfirmedTail]:
    """The channels whose tail the ledger lists as unconfirmed, in ledger order.

    A ledger that counts unconfirmed tails but lists no channels (totals only) gives one
    entry without a channel or seq.

    Args:
        ledger: The recording's gap ledger, or None.

    Returns:
        One entry per unconfirmed channel tail.
    """
    if ledger is None:
        return []
    out = [
        UnconfirmedTail(
            channel=c.channel,
            endpoint=c.endpoint,
            topic=c.topic,
            dp_rank=c.dp_rank,
            from_seq=c.unconfirmed_from,
        )
        for c in ledger.channels
        if c.unconfirmed_from is not None
    ]
    if not out and ledger.unconfirmed:
        # A totals-only ledger: the count is all there is (never one entry per count,
        # which a hostile file could make 2**63).
        out = [UnconfirmedTail(channel="", endpoint="", topic="", dp_rank=None, from_seq=None)]
    return out
