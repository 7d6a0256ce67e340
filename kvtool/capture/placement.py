"""The sequencer's first layer: each batch placed in its channel's seq order.

:class:`Placement` holds an endpoint's channels and its hold, and places a live batch:
written, held behind a replay request, a gap asked for, a restart or a stray told, a
hole filled from the channel's reserve or lost. :mod:`kvtool.capture.replies` adds the
replay answers on top, :mod:`kvtool.capture.sequencer` the clock and the stop.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Literal

from kvtool.capture.seqstate import (
    LIVE,
    MAX_PLAUSIBLE_JUMP,
    REPLAY,
    Action,
    Budget,
    CaptureStats,
    ChannelState,
    Gap,
    Limits,
    Lose,
    NewChannel,
    Origin,
    ReplyWindow,
    Request,
    ResetReplySocket,
    Resolution,
    Restart,
    Stray,
    Verdict,
    Write,
    _Item,
    _Pending,
)
from kvtool.recording import format as fmt


class Placement:
    """The seq placement of one endpoint's batches: its channels, its hold, its requests.

    The first layer of :class:`kvtool.capture.sequencer.Sequencer` (which documents the
    whole); it calls nothing of the layers above it.

    Its methods, their time arguments and the hold are described on the sequencer; the
    arguments are the sequencer's, documented once there.
    """

    def __init__(
        self,
        endpoint: str,
        dp_rank: int | None = None,
        *,
        topic_prefix: bytes = b"",
        has_replay: bool = True,
        history: bool = False,
        limits: Limits | None = None,
        stats: CaptureStats | None = None,
        budget: Budget | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.dp_rank = dp_rank
        self.topic_prefix = topic_prefix
        self.has_replay = has_replay
        self.history = history
        self.limits = limits or Limits()
        self.stats = stats if stats is not None else CaptureStats()
        self.budget = budget if budget is not None else Budget()
        self.channels: dict[bytes, ChannelState] = {}
        self.pending: _Pending | None = None
        self.held: list[_Item] = []
        self.held_bytes = 0
        self.held_since_mono = 0
        self.late_accepted = 0
        self.late_bytes = 0
        # Requests given up on whose end marker has not come yet: the ROUTER answers in
        # order on the same socket, so the next replies (up to that many end markers)
        # belong to them; their batches are still filed by seq (late replies).
        self.stale_ends = 0
        self._tails: list[ChannelState] = []
        self._settler: Iterator[None] | None = None
        self._settled: set[bytes] = set()
        self._in_history = False
        self._closed = False  # the stop's grace ran out: no more requests
        self._now = 0
        self._out: list[Action] = []

    def _take(self) -> list[Action]:
        out, self._out = self._out, []
        return out

    def _replay_usable(self) -> bool:
        return self.has_replay and not self._closed

    def _channel(self, topic: bytes) -> ChannelState | None:
        ch = self.channels.get(topic)
        if ch is None:
            if len(self.channels) >= self.limits.max_channels:
                return None  # a peer inventing topics: bounded, like every buffer
            topic_str = topic.decode("utf-8", "backslashreplace")
            ch = ChannelState(
                topic=topic,
                topic_str=topic_str,
                name=fmt.channel_topic(self.endpoint, topic_str),
                endpoint=self.endpoint,
                dp_rank=self.dp_rank,
            )
            self.channels[topic] = ch
            self._out.append(NewChannel(topic))
        return ch

    def _hold(self, item: _Item) -> None:
        if not self.held:
            self.held_since_mono = self._now
        self.held.append(item)
        self.held_bytes += len(item[2])
        if self.held_bytes > self.stats.held_bytes_peak:
            self.stats.held_bytes_peak = self.held_bytes
        if self.held_bytes > self.limits.max_held_bytes and self.pending is not None:
            # The replay is taking too long for this stream's rate: give it up at the
            # next tick (never from inside a merge that is still feeding).
            self.pending.abandon = True

    def _feed(self, item: _Item) -> None:
        if self.pending is not None:
            self._hold(item)
        else:
            self._advance(item)

    def _advance(self, item: _Item) -> None:
        """Place one live batch in its channel's seq order (filling holes first)."""
        if self.budget.full:
            return
        topic, seq, payload, t, _ = item
        ch = self.channels.get(topic) or self._channel(topic)
        if ch is None:
            self.stats.malformed += 1
            return
        ch.tail_checked = False
        ch.last_live_mono = self._now
        if ch.unconfirmed:
            self._confirm(ch, confirmed=True)  # the stream went on: nothing was unconfirmed
        if ch.suspect is not None:
            self._resolve_suspect(ch, seq)
            if self.budget.full:
                return
            if self.pending is not None:  # the restart's own gap is being fetched
                self._hold(item)
                return
        e = ch.expected
        if (
            e is None
            and self.history
            and not ch.history_asked
            and seq > 0
            and self._replay_usable()
        ):
            # The first batch of a channel: with history, what came before it too.
            self._request("history", topic, 0, trigger=seq)
            self._hold(item)
            return
        if e is not None and seq < e and ch.replayed.get(seq) == hash(payload):
            # A late live copy of a batch the replay already gave us.
            self.stats.duplicates += 1
            ch.last_live = seq
            return
        verdict = ch.order.judge(seq, e)
        if verdict is Verdict.WRITE:
            ch.last_live = seq
            if ch.live_high is None or seq > ch.live_high:
                ch.live_high = seq
            self._write(ch, seq, payload, t, LIVE)
            return
        if verdict is Verdict.HOLD:
            # Behind the stream: a restart only if a consistent new run follows.
            ch.suspect = item
            return
        assert e is not None
        if seq - e > MAX_PLAUSIBLE_JUMP:
            # No replay buffer holds that much: a new run (a restarted or hostile
            # publisher), never a gap of ~2**63 batches.
            self._restart(ch, seq, t)
            ch.last_live = ch.live_high = seq
            self._write(ch, seq, payload, t, LIVE)
            return
        if ch.live_high is None or seq > ch.live_high:
            ch.live_high = seq
        # A hole [e, seq - 1]: the live stream skipped it (ZeroMQ keeps order, so it
        # will not come live any more).
        gap = ch.open_gap
        if gap is None or gap.last != seq - 1 or gap.first > e:
            gap = Gap(e, seq - 1)
            ch.gaps.append(gap)
            ch.open_gap = gap
            self.stats.gaps += 1
        while True:
            self._fill(ch, seq - 1)
            if self.budget.full:
                return
            e = ch.expected
            assert e is not None
            if e >= seq:
                break
            nxt = min((k for k in ch.reserve if e < k < seq), default=seq)
            if e < ch.floor or not self._replay_usable():
                end = min(nxt, seq, ch.floor if e < ch.floor else seq) - 1
                self._lose(ch, e, end)
                continue
            self._request("gap", topic, e, trigger=seq)
            self._hold(item)
            return
        ch.last_live = seq
        if ch.expected == seq:
            self._write(ch, seq, payload, t, LIVE)

    def _fill(self, ch: ChannelState, upto: int | None, *, tail: bool = False) -> None:
        """Write reserve batches contiguous from ``expected`` (up to ``upto``, inclusive).

        With ``tail``, what is written is a lost tail (or batches the live stream
        never delivered) and gets its own gap record.
        """
        reserve = ch.reserve
        if not reserve or ch.expected is None:
            return
        first = ch.expected
        while (upto is None or ch.expected <= upto) and ch.expected in reserve:
            if self.budget.full:
                return
            if tail and ch.expected == first:
                gap = Gap(first, None)
                ch.gaps.append(gap)
                ch.open_gap = gap
                self.stats.gaps += 1
            seq = ch.expected
            payload, t = reserve.pop(seq)
            self._write(ch, seq, payload, t, REPLAY)
        if tail and ch.expected != first and ch.open_gap is not None:
            ch.open_gap.last = ch.expected - 1
        if reserve and len(reserve) > self.limits.max_remembered:
            for k in [k for k in reserve if k < ch.expected]:
                del reserve[k]

    def _resolve_suspect(self, ch: ChannelState, next_seq: int | None) -> None:
        """Drop the held behind-seq as a stray, or start a new epoch with it (a restart)."""
        item = ch.suspect
        if item is None:
            return
        ch.suspect = None
        if ch.order.resolve(next_seq, ch.expected) is Resolution.STRAY:
            self.stats.stray += 1
            self._out.append(Stray(ch.topic, item[1]))
            return
        _, seq, payload, t, _ = item
        self._restart(ch, seq, t)
        if ch.expected == seq:
            ch.last_live = ch.live_high = seq
            self._write(ch, seq, payload, t, LIVE)
        else:
            self._advance(item)  # a hole [0, seq - 1] in the new epoch

    def _restart(self, ch: ChannelState, seq: int, t: int) -> None:
        from_seq = ch.seq_last or 0
        ch.restarts.append({"log_time": t, "from_seq": from_seq, "to_seq": seq})
        self.stats.restarts += 1
        self._out.append(Restart(ch.topic, from_seq, seq))
        # A restarted publisher numbers from 0: what we did not see of it is a gap --
        # unless it starts implausibly far on (then the new run starts at its seq).
        ch.expected = 0 if seq <= MAX_PLAUSIBLE_JUMP else seq
        ch.last_live = None
        ch.live_high = None
        ch.floor = 0
        ch.open_gap = None
        ch.known_max = None
        ch.replayed.clear()
        ch.reserve.clear()

    def _lose(self, ch: ChannelState, a: int, b: int, *, scan: bool = True) -> None:
        if b < a:
            return
        gap = ch.open_gap
        if gap is None or not gap.covers(a, b):
            gap = Gap(a, b)
            ch.gaps.append(gap)
            ch.open_gap = gap
            self.stats.gaps += 1
        gap.lost_ranges.append([a, b])
        self.stats.lost += b - a + 1
        self._out.append(Lose(ch.topic, a, b))
        ch.expected = b + 1
        reserve = ch.reserve
        if reserve and scan:
            for k in [k for k in reserve if k <= b]:
                del reserve[k]

    def _write(self, ch: ChannelState, seq: int, payload: bytes, t: int, origin: Origin) -> None:
        if self.budget.full:
            return
        self._out.append(Write(ch.topic, seq, payload, t, origin))
        ch.expected = seq + 1
        ch.batches += 1
        if ch.seq_first is None:
            ch.seq_first = seq
        ch.seq_last = seq
        if ch.known_max is None or seq > ch.known_max:
            ch.known_max = seq
        if ch.reserve and origin == LIVE:
            ch.reserve.pop(seq, None)
        if origin == REPLAY:
            replayed = ch.replayed
            replayed[seq] = hash(payload)
            if len(replayed) > self.limits.max_remembered:
                del replayed[next(iter(replayed))]
            if self._in_history:
                self.stats.history += 1
            else:
                self.stats.recovered += 1
                gap = ch.open_gap
                if gap is not None and gap.covers(seq, seq):
                    gap.recovered += 1
        self.budget.spend()

    def _request(
        self,
        kind: Literal["gap", "tail", "history"],
        topic: bytes | None,
        start: int,
        trigger: int | None = None,
    ) -> None:
        assert self.has_replay and self.pending is None
        now = self._now
        if self.stale_ends:
            # Answers to earlier requests are still due on this socket (one may never
            # come): a fresh socket, so this request's end marker is its own.
            self._out.append(ResetReplySocket())
            self.stale_ends = 0
        req = _Pending(kind, topic, start, now, trigger=trigger, started_mono=now)
        highs = [
            v
            for ch in self.channels.values()
            for v in (ch.live_high, ch.last_live)
            if v is not None
        ]
        if trigger is not None:
            highs.append(trigger)
        first_hi = trigger
        if kind == "tail":
            first_hi = start + self.limits.max_tail_lead
        req.window = ReplyWindow(start, max(highs, default=None), topic, first_hi)
        self.pending = req
        self.late_accepted = self.late_bytes = 0
        self.stats.replay_requests += 1
        self._out.append(Request(start, kind, topic))

    def _confirm(self, ch: ChannelState, *, confirmed: bool) -> None:
        """Note whether a channel's tail request ended (confirmed) or was given up."""
        if ch.unconfirmed != (not confirmed):
            self.stats.unconfirmed += -1 if confirmed else 1
            ch.unconfirmed = not confirmed
