"""Per-channel seq decisions, pure: no sockets, no clock (time comes in as arguments).

Two questions a recorder must answer for every batch, kept here so they can be tested
exhaustively without ZeroMQ:

- :class:`LiveOrder` -- a live seq *behind* the next expected one: a publisher restart,
  or one stray old batch (reordered, or repeated by a broken peer)? A restart is a seq
  behind **followed by a consistent new run** (the next live seq is the one after it);
  a stray is followed by the old run going on, and is dropped and counted. So no seq is
  ever written twice within one epoch of a channel, and one reordered batch never
  re-fetches and re-writes the whole stream (issue 8.6).
- :class:`ReplyWindow` -- is a replay reply one the request could have produced? A
  reply is accepted only inside ``[start, hi]`` (``hi`` is the highest seq the live
  stream showed plus :data:`MAX_REPLY_COUNT`) and only ascending (vLLM's ROUTER answers
  in seq order); anything else -- a foreign seq, a seq near ``2**63`` -- is a counted
  protocol error, never a gap and never written (issue 8.7). Past
  :data:`MAX_REPLY_COUNT` replies or :data:`MAX_REPLY_BYTES` bytes the request is
  flooding: the rest is discarded and counted (issue 8.3).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

MAX_REPLY_COUNT = 100_000
"""Replies accepted for one replay request (10x vLLM's default ``buffer_steps``)."""
MAX_REPLY_BYTES = 64 * 1024 * 1024
"""Payload bytes accepted for one replay request; the rest is discarded and counted."""


class Verdict(Enum):
    """What to do with one live batch."""

    WRITE = "write"
    """The next seq (or the channel's first): write it."""
    GAP = "gap"
    """Ahead of the next expected seq: the seqs between are missing."""
    HOLD = "hold"
    """Behind the next expected seq: hold it until the next live batch tells restart
    from stray (see :meth:`LiveOrder.resolve`)."""


class Resolution(Enum):
    """What a held behind-seq turned out to be."""

    RESTART = "restart"
    """The publisher restarted: the held batch opens a new epoch."""
    STRAY = "stray"
    """An old batch out of order: drop it and count it."""


@dataclass
class LiveOrder:
    """Tells a publisher restart from one out-of-order live batch, for one channel.

    Attributes:
        suspect: The seq held as behind (None when nothing is held).
    """

    suspect: int | None = None

    def judge(self, seq: int, expected: int | None) -> Verdict:
        """Classify a live seq against the next expected one (holds a behind seq).

        Call :meth:`resolve` first while :attr:`suspect` is set.

        Args:
            seq: The live batch's seq.
            expected: The next seq the channel wants (None: nothing seen yet).

        Returns:
            The verdict; with :attr:`Verdict.HOLD` the seq becomes :attr:`suspect`.
        """
        if expected is None or seq == expected:
            return Verdict.WRITE
        if seq > expected:
            return Verdict.GAP
        self.suspect = seq
        return Verdict.HOLD

    def resolve(self, next_seq: int | None, expected: int | None) -> Resolution | None:
        """Decide what the held :attr:`suspect` was, now that more is known.

        A restart needs a consistent new run: the next live seq is ``suspect + 1``
        (and is not simply the old run's next seq). Without a next seq (the channel
        went quiet, or the capture stops) only a suspect of 0 -- the first batch a
        restarted publisher sends -- counts as a restart.

        Args:
            next_seq: The live seq that followed (None: quiet or stop).
            expected: The next seq of the old run.

        Returns:
            The resolution, or None when nothing was held.
        """
        s = self.suspect
        if s is None:
            return None
        self.suspect = None
        if next_seq is None:
            return Resolution.RESTART if s == 0 else Resolution.STRAY
        if next_seq == s + 1 and next_seq != expected:
            return Resolution.RESTART
        return Resolution.STRAY


class ReplyVerdict(Enum):
    """What to do with one replay reply."""

    ACCEPT = "accept"
    REJECT = "reject"
    """Outside the requested range or not ascending: a protocol error, dropped."""
    DISCARD = "discard"
    """Past the request's count or byte cap: dropped; the request is flooding."""


@dataclass
class ReplyWindow:
    """Which replies one replay request may accept.

    Args:
        start: The seq asked for (replies begin there or later).
        live_high: The highest seq the live stream showed on the endpoint (None: none).

    Attributes:
        hi: The highest acceptable seq.
        seen: Replies judged (accepted or not): a socket sending more than
            :data:`MAX_REPLY_COUNT` of anything is flooding.
        count: Replies accepted.
        nbytes: Payload bytes accepted.
        flooded: The count or byte cap was reached.
    """

    start: int
    live_high: int | None = None
    hi: int = field(init=False)
    seen: int = 0
    count: int = 0
    nbytes: int = 0
    flooded: bool = False
    _last: dict[bytes | None, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.hi = max(self.start, self.live_high or 0) + MAX_REPLY_COUNT

    def check(self, topic: bytes | None, seq: int, size: int) -> ReplyVerdict:
        """Judge one reply and count it when accepted.

        Args:
            topic: The reply's topic frame (None in the old layout).
            seq: Its seq.
            size: Its payload size in bytes.

        Returns:
            The verdict.
        """
        self.seen += 1
        if self.flooded or self.seen > MAX_REPLY_COUNT:
            self.flooded = True
            return ReplyVerdict.DISCARD
        if not self.start <= seq <= self.hi:
            return ReplyVerdict.REJECT
        last = self._last.get(topic)
        if last is not None and seq <= last:
            return ReplyVerdict.REJECT
        if self.nbytes + size > MAX_REPLY_BYTES:
            self.flooded = True
            return ReplyVerdict.DISCARD
        self._last[topic] = seq
        self.count += 1
        self.nbytes += size
        return ReplyVerdict.ACCEPT
