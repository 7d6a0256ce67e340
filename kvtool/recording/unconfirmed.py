"""The channel tails a recording's gap ledger lists as never confirmed (issue 23).

Light on purpose: every command that reads a recording says these (``report``'s start-up
imports it), so it needs only the ledger's types.
"""

from __future__ import annotations

import msgspec

from kvtool.recording.ledger import GapLedger

__all__ = ["UnconfirmedTail", "unconfirmed_lines", "unconfirmed_tails"]


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


def unconfirmed_lines(path: str, tails: list[UnconfirmedTail]) -> list[str]:
    """Say which channel tails the replay socket never confirmed: one line, or none.

    Args:
        path: The recording (or the stream) the line names first.
        tails: :func:`unconfirmed_tails` of its ledger.

    Returns:
        No line when every tail was confirmed, else one.
    """
    if not tails:
        return []
    where = ", ".join(_tail_text(t) for t in tails[:5])
    more = ", …" if len(tails) > 5 else ""
    return [
        f"{path}: the replay socket never confirmed what followed {where}{more} (its answer "
        "never ended); batches published after it may be missing"
    ]


def _tail_text(t: UnconfirmedTail) -> str:
    name = t.channel or "a channel"
    return f"{name} after seq {t.from_seq - 1}" if t.from_seq else name


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
