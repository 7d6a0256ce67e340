"""Per-channel seq decisions, pure: no sockets, no clock (time comes in as arguments).

Everything a recorder decides about seqs lives here, so it can be tested exhaustively
without ZeroMQ; :mod:`kvtool.capture.recorder` only moves bytes between sockets, this
module and the writer.

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
- :class:`Sequencer` -- one per endpoint (one replay socket, so one outstanding request
  and one hold for all of its channels), with a :class:`ChannelState` per topic. It is
  fed live batches, replay replies and end markers, clock ticks and the stop, and
  answers with *actions* (:class:`Write`, :class:`Request`, :class:`Lose`,
  :class:`Restart`, :class:`Stray`, :class:`Discard`, :class:`NewChannel`,
  :class:`ResetReplySocket`) that the recorder carries out in order. A live seq jumping
  further ahead than any replay buffer could hold (:data:`MAX_PLAUSIBLE_JUMP`) opens a
  new run like a restart: it is never a gap of that size.

What a :class:`Sequencer` decides, per channel (one per (endpoint, topic)):

- a **gap** (the live seq jumps ahead) is asked of the replay socket; while the request
  is outstanding every live batch of the endpoint is *held*. Replayed batches go to the
  channel's *reserve*; the held batches are then placed again in seq order and each
  hole the live stream shows is filled from the reserve. Replayed batches beyond the
  live stream stay in the reserve (their live copies are most likely in flight) until a
  hole or a quiet moment needs them; what neither has is *lost*;
- a lost **tail** is invisible to gap detection, so a channel quiet for ``quiet_ns``
  (and every quiet channel at stop) asks for anything after its last seq;
- ``history`` first asks for everything the replay buffer still holds;
- a request with no answer within its idle timeout is **asked again** from the seq after
  the last reply received (on the same socket: a slow answer still counts), until its
  end marker comes or its total deadline passes (issue 23). Only past the deadline,
  flooding, holding too many live bytes, or at stop is it given up: the seqs of a gap it
  did not bring are lost, a tail it did not confirm is *unconfirmed* (both in the
  ledger); late answers are still filed by seq. There is no back-off: every gap is asked;
- a reply the request could not have produced -- below its start, a first reply past
  the live batch that showed the gap (or far past a tail's start), a jump over seqs
  inside an answer -- is counted as rejected and never written; a jump inside an answer
  (replies dropped on the way) asks again from the seq after the last one received;
- at stop, what the reserve holds is written, and every seq the sequencer has evidence
  of (written, or in a reply) but did not write goes to the ledger as lost.
"""

from __future__ import annotations

from collections.abc import Iterator

from kvtool.capture.replies import ReplayAnswers

# The sequencer's vocabulary lives in kvtool.capture.seqstate; its names stay importable here.
from kvtool.capture.seqstate import (
    DEADLINE_TIMEOUTS,
    DEFAULT_QUIET_NS,
    DEFAULT_REPLAY_TIMEOUT_NS,
    LIVE,
    MAX_CHANNELS_PER_SOURCE,
    MAX_HELD_BYTES,
    MAX_LATE_REPLIES,
    MAX_PLAUSIBLE_JUMP,
    MAX_REMEMBERED,
    MAX_REPLY_BYTES,
    MAX_REPLY_COUNT,
    MAX_TAIL_LEAD,
    REPLAY,
    REPLAY_DEADLINE_NS,
    STOP_TAIL_QUIET_NS,
    VLLM_BUFFER_STEPS,
    Action,
    Budget,
    CaptureStats,
    ChannelState,
    Discard,
    Gap,
    Limits,
    LiveOrder,
    Lose,
    NewChannel,
    Origin,
    ReplyVerdict,
    ReplyWindow,
    Request,
    ResetReplySocket,
    Resolution,
    Restart,
    Stray,
    Verdict,
    Write,
)


class Sequencer(ReplayAnswers):
    """The seq decisions of one endpoint: its channels, its replay request, its hold.

    Every method takes the time it is called at (``now``, monotonic ns; ``t``, the wall
    receive time of a batch) and returns the actions to carry out, in order. While a
    replay request is outstanding every live batch of the endpoint is *held*; when it
    ends the replies go to each channel's *reserve* and the held batches are placed in
    seq order, each hole the live stream shows filled from the reserve, so a replayed
    ``BlockStored(A)`` never lands after a live ``BlockRemoved(A)`` that followed it.

    Args:
        endpoint: The endpoint (for channel names and the ledger).
        dp_rank: Its data-parallel rank.
        topic_prefix: The SUB topic filter (replies on other topics are ignored).
        has_replay: The endpoint has a replay socket.
        history: Ask the replay socket for what it holds from before the subscription.
        limits: The bounds to keep.
        stats: The counters to update (shared with the recorder).
        budget: The write budget (shared by every endpoint).
    """

    def live(self, topic: bytes, seq: int, payload: bytes, t: int, now: int) -> list[Action]:
        """Feed one live batch.

        Args:
            topic: Its topic frame.
            seq: Its seq.
            payload: Its payload.
            t: Its receive time (wall ns; the log time it is written with).
            now: Monotonic ns.

        Returns:
            The actions.
        """
        self._now = now
        if self.pending is None:
            ch = self.channels.get(topic)
            if (
                ch is not None
                and seq == ch.expected
                and not ch.reserve
                and ch.suspect is None
                and not ch.unconfirmed
            ):
                # The common case: the next batch of a known channel.
                ch.tail_checked = False
                ch.last_live_mono = now
                ch.last_live = seq
                self._write(ch, seq, payload, t, LIVE)
            else:
                self._advance((topic, seq, payload, t, LIVE))
        else:
            self._hold((topic, seq, payload, t, LIVE))
            if self.held_bytes > self.limits.max_held_bytes:
                # Past the bound: give the request up now (outside any merge), so the
                # held bytes never exceed it by more than this one batch.
                self._give_up(now)
        return self._take()

    def live_drained(self, started: int, now: int) -> None:
        """A burst of live batches read from ``started`` to ``now`` made no channel quiet.

        Args:
            started: The ``now`` the burst's batches were fed with.
            now: Monotonic ns at the burst's end.
        """
        for ch in self.channels.values():
            if ch.last_live_mono == started:
                ch.last_live_mono = now

    def check_quiet(self, now: int) -> list[Action]:
        """Resolve held behind-seqs and ask quiet channels for a lost tail.

        Args:
            now: Monotonic ns.

        Returns:
            The actions.
        """
        self._now = now
        quiet = self.limits.quiet_ns
        for ch in self.channels.values():
            if ch.suspect is not None and now - ch.last_live_mono >= quiet:
                self._resolve_suspect(ch, None)
        if self.pending is not None:
            return self._take()
        for ch in self.channels.values():
            if ch.reserve and ch.tail_checked and now - ch.last_live_mono >= quiet:
                # Late replies of a request given up on: write what the live stream did
                # not deliver once the channel is quiet.
                self._fill(ch, None, tail=True)
        if not self._replay_usable():
            return self._take()
        for ch in self.channels.values():
            if not ch.tail_checked and ch.expected is not None and now - ch.last_live_mono >= quiet:
                # Replayed batches the live stream never delivered, then the tail.
                self._fill(ch, None, tail=True)
                ch.tail_checked = True
                self._request("tail", ch.topic, ch.expected)
                break
        return self._take()

    def tick(self, now: int) -> list[Action]:
        """:meth:`check_replay` then :meth:`check_quiet`.

        Args:
            now: Monotonic ns.

        Returns:
            The actions.
        """
        return self.check_replay(now) + self.check_quiet(now)

    def begin_stop(self, now: int) -> None:
        """The capture stops: note the quiet channels that will ask for their tail.

        Args:
            now: Monotonic ns.
        """
        if not self.has_replay or self.budget.full:
            self._tails = []
            return
        # A busy channel has batches in flight rather than lost: it is not asked.
        # A tail left unconfirmed earlier is asked once more.
        self._tails = [
            ch
            for ch in self.channels.values()
            if (not ch.tail_checked or ch.unconfirmed)
            and ch.expected is not None
            and now - ch.last_live_mono >= self.limits.stop_tail_quiet_ns
        ]

    def stop_tail(self, now: int) -> list[Action]:
        """At stop, with no request outstanding, ask the next quiet channel for its tail.

        Args:
            now: Monotonic ns.

        Returns:
            The actions.
        """
        self._now = now
        if self.budget.full or self.pending is not None or not self._tails:
            return []
        if not self._replay_usable():
            return []
        ch = self._tails.pop(0)
        self._fill(ch, None, tail=True)
        ch.tail_checked = True
        self._request("tail", ch.topic, ch.expected or 0)
        return self._take()

    def abort_replay(self, now: int) -> list[Action]:
        """The stop's grace ran out: give up the pending request; ask nothing more.

        Tails that were to be asked, and the one being asked, are unconfirmed.

        Args:
            now: Monotonic ns.

        Returns:
            The actions.
        """
        self._now = now
        self._closed = True
        if self.pending is not None:
            self._give_up(now)
        for ch in self._tails:
            if ch.expected is not None:
                self._confirm(ch, confirmed=False)
        self._tails = []
        return self._take()

    def release(self, now: int) -> list[Action]:
        """At stop: place what is still held, and resolve held behind-seqs.

        Args:
            now: Monotonic ns.

        Returns:
            The actions.
        """
        self._now = now
        self._closed = True
        held, self.held, self.held_bytes = self.held, [], 0
        for item in held:
            self._feed(item)
        for ch in list(self.channels.values()):
            self._resolve_suspect(ch, None)
        return self._take()

    def settle(self, max_writes: int = 256) -> tuple[list[Action], bool]:
        """At stop: write what the reserve holds; every known seq not written is lost.

        Call repeatedly (the caller bounds the time spent); each call writes at most
        about ``max_writes`` batches. A hole between reserve entries, or between the
        last written seq and the highest seq seen, goes to the ledger as lost.

        Args:
            max_writes: Writes per call (more may come from one contiguous run).

        Returns:
            The actions, and whether settling is done.
        """
        if self._settler is None:
            self._settler = self._settle_all()
        while len(self._out) < max_writes and not self.budget.full:
            try:
                next(self._settler)
            except StopIteration:
                return self._take(), True
        return self._take(), self.budget.full

    def settle_give_up(self) -> list[Action]:
        """At stop, out of time: what the reserve still holds is lost (never silent).

        Returns:
            The actions.
        """
        self._settler = None
        if not self.budget.full:
            for ch in self.channels.values():
                if ch.topic not in self._settled and ch.expected is not None:
                    self._close_out(ch)
        return self._take()

    def _settle_all(self) -> Iterator[None]:
        for ch in list(self.channels.values()):
            if ch.expected is None:
                continue
            # One pass in seq order: every key below the current one is gone, so the
            # holes are lost without rescanning the reserve.
            for k in sorted(ch.reserve):
                if k not in ch.reserve:
                    continue
                if k < ch.expected:
                    del ch.reserve[k]
                    continue
                if k > ch.expected:
                    self._lose(ch, ch.expected, k - 1, scan=False)
                self._fill(ch, None, tail=True)
                if self.budget.full:
                    return
                yield
            self._close_out(ch)

    def _close_out(self, ch: ChannelState) -> None:
        self._settled.add(ch.topic)
        ch.reserve.clear()
        if ch.expected is not None and ch.known_max is not None and ch.known_max >= ch.expected:
            self._lose(ch, ch.expected, ch.known_max)


__all__ = [
    "DEADLINE_TIMEOUTS",
    "DEFAULT_QUIET_NS",
    "DEFAULT_REPLAY_TIMEOUT_NS",
    "LIVE",
    "MAX_CHANNELS_PER_SOURCE",
    "MAX_HELD_BYTES",
    "MAX_LATE_REPLIES",
    "MAX_PLAUSIBLE_JUMP",
    "MAX_REMEMBERED",
    "MAX_REPLY_BYTES",
    "MAX_REPLY_COUNT",
    "MAX_TAIL_LEAD",
    "REPLAY",
    "REPLAY_DEADLINE_NS",
    "STOP_TAIL_QUIET_NS",
    "VLLM_BUFFER_STEPS",
    "Action",
    "Budget",
    "CaptureStats",
    "ChannelState",
    "Discard",
    "Gap",
    "Limits",
    "LiveOrder",
    "Lose",
    "NewChannel",
    "Origin",
    "ReplyVerdict",
    "ReplyWindow",
    "Request",
    "ResetReplySocket",
    "Resolution",
    "Restart",
    "Sequencer",
    "Stray",
    "Verdict",
    "Write",
]
