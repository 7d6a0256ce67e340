"""What the sequencer works with: its bounds, counters, actions, channel state and judges.

:class:`LiveOrder` tells a restart from a stray, :class:`ReplyWindow` tells a reply the
request could have produced from one it could not; :class:`Limits`, :class:`CaptureStats`
and :class:`Budget` are the bounds and counters; the actions are what
:class:`kvtool.capture.sequencer.Sequencer` answers with. Pure, no sockets, no clock.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from enum import Enum
from typing import Literal

MAX_REPLY_COUNT = 100_000
"""Replies accepted for one replay request (10x vLLM's default ``buffer_steps``)."""
VLLM_BUFFER_STEPS = 10_000
"""vLLM's default replay buffer: the last ``buffer_steps`` batches."""
MAX_REPLY_BYTES = 192 * 1024 * 1024
"""Payload bytes accepted for one replay request; the rest is discarded and counted.

A legitimate answer is a whole vLLM replay buffer: 10,000 batches of ~15 kB is ~150 MB.
A cap below that (64 MiB at first) took an honest full-buffer reply for a flood and lost
its tail: 2,400-4,200 of 7,660 batches in the SNDHWM 1,000 bench, 0 with this cap."""


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
    """Outside the requested range: a protocol error, dropped."""
    JUMP = "jump"
    """Past the next seq of its topic's answer: replies were dropped on the way (or it is
    a lie): dropped, and the request is asked again from the seq after the last one."""
    REPEAT = "repeat"
    """At or below its topic's last accepted seq: a retried request's answer repeating
    what came already; ignored."""
    DISCARD = "discard"
    """Past the request's count or byte cap: dropped; the request is flooding."""


@dataclass
class ReplyWindow:
    """Which replies one replay request may accept.

    An honest answer is, per topic, one run of consecutive seqs from ``start`` (or from
    the buffer's oldest, when that is later). So the first reply of ``topic`` (the
    channel that asked) must be at most ``first_hi`` -- the live batch that showed the
    gap, or a little past a tail's start -- and each later reply of a topic the next seq.

    Args:
        start: The seq asked for (replies begin there or later).
        live_high: The highest seq the live stream showed on the endpoint (None: none).
        topic: The asking channel's topic frame (None: the old layout, or a history).
        first_hi: The highest first reply believed for ``topic`` (None: any in range).

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
    topic: bytes | None = None
    first_hi: int | None = None
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
        if last is not None:
            if seq <= last:
                return ReplyVerdict.REPEAT
            if seq != last + 1:
                return ReplyVerdict.JUMP
        elif self.first_hi is not None and seq > self.first_hi and topic in (None, self.topic):
            return ReplyVerdict.REJECT
        if self.nbytes + size > MAX_REPLY_BYTES:
            self.flooded = True
            return ReplyVerdict.DISCARD
        self._last[topic] = seq
        self.count += 1
        self.nbytes += size
        return ReplyVerdict.ACCEPT

    def last(self, topic: bytes | None) -> int | None:
        """The last seq accepted for ``topic`` (or for replies without a topic frame).

        Args:
            topic: The topic frame.

        Returns:
            The seq, or None when none was accepted.
        """
        last = self._last.get(topic)
        return self._last.get(None) if last is None else last

    def resume(self) -> int:
        """The seq a retry asks from: after the last reply of every topic that answered.

        Returns:
            The lowest ``last + 1`` over the topics answered so far, else ``start``.
        """
        return min((v + 1 for v in self._last.values()), default=self.start)


# ---------------------------------------------------------------------- limits

MAX_PLAUSIBLE_JUMP = 2**32
"""A live seq this far past the next expected one is not a gap (no replay buffer holds
anything near that many batches): it opens a new run, like a restart (issue 8)."""
DEFAULT_REPLAY_TIMEOUT_NS = 2_000_000_000
DEFAULT_QUIET_NS = 1_000_000_000
REPLAY_DEADLINE_NS = 20_000_000_000
"""Total time one replay request may take, retries included (at least 5 idle timeouts):
long enough for a publisher that serves replay in its own thread and pauses for seconds
(SGLang), bounded for a trickling socket (the idle timeout never fires while replies come)."""
DEADLINE_TIMEOUTS = 5
"""The total deadline is at least this many idle timeouts (``--replay-timeout``)."""
MAX_TAIL_LEAD = 1_000
"""A tail's (or a history's, without live evidence) first reply more than this past the
seq asked for is not believed: the buffer would have moved past that many batches the
live stream never delivered while the channel was quiet (a lie such as seq+5000)."""
STOP_TAIL_QUIET_NS = 50_000_000
"""At stop, only channels quiet this long ask for a lost tail (a busy one has batches in flight)."""
MAX_HELD_BYTES = 128 * 1024 * 1024
"""Live bytes held while one replay is outstanding; past this the replay is given up."""
MAX_CHANNELS_PER_SOURCE = 64
"""Topics (channels) accepted from one endpoint; messages on further topics are malformed."""
MAX_REMEMBERED = 20_000
"""Replayed batches remembered per channel (by payload hash), to recognise a late live copy."""
MAX_LATE_REPLIES = MAX_REPLY_COUNT
"""Late replies (to requests given up on) filed per request; past this the socket is closed."""


@dataclass(frozen=True)
class Limits:
    """The bounds one :class:`Sequencer` keeps (the recorder passes its module's values).

    Attributes:
        replay_timeout_ns: A request with no answer this long is asked again (from the
            seq after the last reply); one that cannot be sent this long is given up.
        quiet_ns: A channel quiet this long asks for a lost tail.
        replay_deadline_ns: Total time one request may take, its retries included (at
            least :data:`DEADLINE_TIMEOUTS` idle timeouts).
        max_held_bytes: Live bytes held for one request.
        max_late_replies: Late replies filed per request before the socket is reset.
        max_channels: Channels (topics) per endpoint.
        max_remembered: Replayed payload hashes remembered per channel.
        stop_tail_quiet_ns: At stop, channels quiet this long ask for their tail.
        max_tail_lead: See :data:`MAX_TAIL_LEAD`.
    """

    replay_timeout_ns: int = DEFAULT_REPLAY_TIMEOUT_NS
    quiet_ns: int = DEFAULT_QUIET_NS
    replay_deadline_ns: int = REPLAY_DEADLINE_NS
    max_held_bytes: int = MAX_HELD_BYTES
    max_late_replies: int = MAX_LATE_REPLIES
    max_channels: int = MAX_CHANNELS_PER_SOURCE
    max_remembered: int = MAX_REMEMBERED
    stop_tail_quiet_ns: int = STOP_TAIL_QUIET_NS
    max_tail_lead: int = MAX_TAIL_LEAD

    @property
    def deadline_ns(self) -> int:
        """The total deadline of one request."""
        return max(self.replay_deadline_ns, DEADLINE_TIMEOUTS * self.replay_timeout_ns)


# ---------------------------------------------------------------------- counters


@dataclass
class CaptureStats:
    """Counters of a running capture, for a live status and the summary line.

    The sequencer counts what it decides (gaps, recovered, lost, restarts, strays,
    replay verdicts); the recorder counts what it writes and receives.

    Attributes:
        batches: Batches written.
        events: Events in them (from each batch's header, or its decoding).
        bytes: Payload bytes written.
        stores: ``BlockStored`` events per kind (``unannotated`` without one).
        removes: ``BlockRemoved`` events per kind (through group_idx; else ``unattributed``).
        cleared: ``AllBlocksCleared`` events.
        gaps: Gaps detected (missing seq ranges, including lost tails that were found).
        recovered: Batches fetched from a replay socket to fill gaps.
        lost: Batches neither received nor recovered.
        history: Batches fetched with ``history`` from before the subscription.
        restarts: Publisher restarts seen (seq going backwards, or jumping implausibly
            far ahead).
        duplicates: Batches received twice (live and replay) and written once.
        malformed: Messages without vLLM's 3-frame shape, dropped.
        undecodable: Payloads written raw that did not decode as a batch.
        unsampled: Batches left out of the per-kind counts (``stores``, ``removes``,
            ``cleared``) because the recorder was past its decode budget and counted a
            sample; their events are in ``events``, and they are in the recording all
            the same.
        replay_requests: Requests sent to replay sockets (retries not counted).
        replay_retries: Requests asked again (no answer within the idle timeout, or
            replies missing inside an answer), from the seq after the last reply.
        replay_timeouts: Requests given up (past their total deadline, not sendable,
            flooding, holding too many live bytes, or cut short by the stop).
        unconfirmed: Channels whose tail was asked for and never confirmed (the answer
            never ended): whether batches followed their last seq is unknown.
        stray: Live batches behind the stream that were not a restart (dropped; their
            seq was written already or is in the ledger).
        replay_rejected: Replay replies outside the requested range or not ascending
            (a lying replay socket): protocol errors, dropped.
        replay_discarded: Replay replies past a request's count or byte cap, or late
            replies past the reserve's bound: dropped.
        held_bytes_peak: Most live bytes ever held at once for a replay.
        reply_bytes_peak: Most reply bytes one replay request ever accepted.
        start_ns: Wall time the capture started (ns).
        elapsed_ns: Time since the start, updated by the loop.
        connected: Endpoints whose SUB socket has a connection.
    """

    batches: int = 0
    events: int = 0
    bytes: int = 0
    stores: Counter[str] = field(default_factory=Counter)
    removes: Counter[str] = field(default_factory=Counter)
    cleared: int = 0
    gaps: int = 0
    recovered: int = 0
    lost: int = 0
    history: int = 0
    restarts: int = 0
    duplicates: int = 0
    malformed: int = 0
    undecodable: int = 0
    unsampled: int = 0
    replay_requests: int = 0
    replay_retries: int = 0
    replay_timeouts: int = 0
    unconfirmed: int = 0
    stray: int = 0
    replay_rejected: int = 0
    replay_discarded: int = 0
    held_bytes_peak: int = 0
    reply_bytes_peak: int = 0
    start_ns: int = 0
    elapsed_ns: int = 0
    connected: set[str] = field(default_factory=set)


@dataclass
class Budget:
    """Batches the capture may still write (shared by every endpoint's sequencer).

    Attributes:
        remaining: Writes left (None: no limit).
        full: The limit was reached: nothing more is written.
    """

    remaining: int | None = None
    full: bool = False

    def spend(self) -> None:
        """Count one write."""
        if self.remaining is not None:
            self.remaining -= 1
            if self.remaining <= 0:
                self.full = True


# ----------------------------------------------------------------------- actions

Origin = Literal[0, 1]
LIVE: Origin = 0
REPLAY: Origin = 1


@dataclass(frozen=True, slots=True)
class NewChannel:
    """A channel (topic) appeared: register it with the writer before its first write."""

    topic: bytes


@dataclass(frozen=True, slots=True)
class Write:
    """Write this batch now (channels' writes come in seq order)."""

    topic: bytes
    seq: int
    payload: bytes
    log_time: int
    origin: Origin


@dataclass(frozen=True, slots=True)
class Request:
    """Send a replay request for everything from ``start_seq`` on the replay socket.

    If it cannot be queued, tell the sequencer (:meth:`Sequencer.unsent`).
    """

    start_seq: int
    kind: Literal["gap", "tail", "history"] = "gap"
    topic: bytes | None = None


@dataclass(frozen=True, slots=True)
class Lose:
    """Seqs ``first..last`` of a channel are lost (in the gap ledger already)."""

    topic: bytes
    first: int
    last: int


@dataclass(frozen=True, slots=True)
class Restart:
    """A new run began on a channel (a publisher restart, or an implausible jump)."""

    topic: bytes
    from_seq: int
    to_seq: int


@dataclass(frozen=True, slots=True)
class Stray:
    """A live batch behind the stream, not a restart: dropped and counted."""

    topic: bytes
    seq: int


@dataclass(frozen=True, slots=True)
class Discard:
    """Replies dropped: ``rejected`` (a lie) or ``discarded`` (past a cap)."""

    count: int
    reason: Literal["rejected", "discarded"]


@dataclass(frozen=True, slots=True)
class ResetReplySocket:
    """Close the replay socket and open a new one (dead, or flooding)."""


Action = NewChannel | Write | Request | Lose | Restart | Stray | Discard | ResetReplySocket

# (topic, seq, payload, log_time, origin); origin _NO_TOPIC: a reply without topic frame
_Item = tuple[bytes, int, bytes, int, int]
_NO_TOPIC = 2


# ------------------------------------------------------------------------- state


@dataclass
class Gap:
    """A gap being tracked for the ledger (the recorder builds GapRecords from these)."""

    first: int
    last: int | None
    recovered: int = 0
    lost_ranges: list[list[int]] = field(default_factory=list)

    def covers(self, a: int, b: int) -> bool:
        """Return whether ``a..b`` lies in this gap."""
        return self.first <= a and (self.last is None or b <= self.last)


@dataclass
class ChannelState:
    """One channel's seq state (one per (endpoint, topic)); the ledger reads it."""

    topic: bytes
    topic_str: str
    name: str
    endpoint: str
    dp_rank: int | None
    expected: int | None = None  # next seq we want
    last_live: int | None = None  # last seq received live (this epoch)
    last_live_mono: int = 0
    tail_checked: bool = True
    # Batches a replay gave that are not written yet: they fill a hole when the live
    # stream skips them, or are written at a quiet moment if it never delivers them.
    reserve: dict[int, tuple[bytes, int]] = field(default_factory=dict)
    # The replay buffer no longer holds seqs below this (it only moves forward).
    floor: int = 0
    open_gap: Gap | None = None
    # The highest seq (this epoch) the recorder has evidence of: written, or held in the
    # reserve. At stop, whatever below it was not written is in the ledger as lost.
    known_max: int | None = None
    history_asked: bool = False
    # The tail after ``expected`` was asked for and never confirmed (its answer never
    # ended); cleared once confirmed, or once the live stream goes on.
    unconfirmed: bool = False
    replayed: dict[int, int] = field(default_factory=dict)  # recent replay writes: payload hash
    order: LiveOrder = field(default_factory=LiveOrder)
    suspect: _Item | None = None  # a live batch behind the stream, until order resolves it
    live_high: int | None = None  # the highest live seq this epoch
    batches: int = 0
    seq_first: int | None = None
    seq_last: int | None = None
    gaps: list[Gap] = field(default_factory=list)
    restarts: list[dict[str, int]] = field(default_factory=list)


@dataclass
class _Pending:
    kind: Literal["gap", "tail", "history"]
    topic: bytes | None
    start: int
    progress_mono: int
    replies: list[_Item] = field(default_factory=list)
    trigger: int | None = None  # the live seq that revealed the gap
    abandon: bool = False
    sent: bool = True  # False: the replay socket could not queue its last send
    sends: int = 1  # sends on the socket whose end marker has not come
    retries: int = 0
    jumped: bool = False  # replies were missing inside an answer: ask again at its end
    flooded: bool = False
    started_mono: int = 0  # for the total deadline (moved on like progress_mono when busy)
    window: ReplyWindow | None = None
