"""The sequencer's second layer: replay replies, end markers, retries and giving up.

:class:`ReplayAnswers` files what the replay socket answers (checked by the request's
:class:`~kvtool.capture.seqstate.ReplyWindow`), asks again when an answer stalls or
jumps, gives a request up, and ends it: the replies go to the channels' reserves and the
held live batches are placed again (:meth:`ReplayAnswers._finish_replay`).
"""

from __future__ import annotations

from kvtool.capture import seqstate
from kvtool.capture.placement import Placement
from kvtool.capture.seqstate import (
    _NO_TOPIC,
    MAX_PLAUSIBLE_JUMP,
    MAX_REPLY_BYTES,
    REPLAY,
    Action,
    ChannelState,
    Discard,
    ReplyVerdict,
    Request,
    ResetReplySocket,
    _Pending,
)


class ReplayAnswers(Placement):
    """A :class:`~kvtool.capture.placement.Placement` that also files replay answers."""

    def reply_seen(self, now: int) -> None:
        """Any frame from the replay socket: the outstanding request is alive.

        Args:
            now: Monotonic ns.
        """
        if self.pending is not None:
            self.pending.progress_mono = now

    def reply(
        self, topic: bytes | None, seq: int, payload: bytes, t: int, now: int
    ) -> list[Action]:
        """Feed one replay reply (not the end marker).

        Args:
            topic: Its topic frame (None in the old reply layout).
            seq: Its seq.
            payload: Its payload.
            t: Receive time (wall ns).
            now: Monotonic ns.

        Returns:
            The actions.
        """
        self._now = now
        self.reply_seen(now)
        req = self.pending
        if self.stale_ends or req is None:
            # A late answer to a request given up on: its batches are still good.
            self._late_reply(topic, seq, payload, t)
            return self._take()
        assert req.window is not None
        verdict = req.window.check(topic, seq, len(payload))
        if verdict is ReplyVerdict.REPEAT:
            pass  # a retried request's answer repeating what came already
        elif verdict is ReplyVerdict.REJECT or verdict is ReplyVerdict.JUMP:
            self.stats.replay_rejected += 1  # a lie: never a gap, never written
            self._out.append(Discard(1, "rejected"))
            if verdict is ReplyVerdict.JUMP:
                req.jumped = True  # ask again from the seq after the last one, at its end
        elif verdict is ReplyVerdict.DISCARD:
            self.stats.replay_discarded += 1
            self._out.append(Discard(1, "discarded"))
            req.abandon = True  # flooding: given up (and the socket reset) at the next tick
            req.flooded = True
        else:
            if req.window.nbytes > self.stats.reply_bytes_peak:
                self.stats.reply_bytes_peak = req.window.nbytes
            req.replies.append(
                (
                    topic if topic is not None else b"",
                    seq,
                    payload,
                    t,
                    REPLAY if topic is not None else _NO_TOPIC,
                )
            )
            if req.kind == "gap" and self._covered(req):
                # The hole is filled: the live batches need not wait for the end marker
                # (the rest of the answer, if it comes, is filed by seq as late replies).
                self.stale_ends += req.sends
                self._finish_replay(timed_out=False)
        return self._take()

    def reply_end(self, now: int) -> list[Action]:
        """Feed a replay end marker.

        Args:
            now: Monotonic ns.

        Returns:
            The actions.
        """
        self._now = now
        self.reply_seen(now)
        if self.stale_ends:
            self.stale_ends -= 1  # the end of a request given up on
            return []
        req = self.pending
        if req is not None:
            req.sends = max(0, req.sends - 1)
            broken = req.jumped and not self._covered(req)
            if broken and now - req.started_mono <= self.limits.deadline_ns:
                # Replies went missing inside this answer: ask for the rest again.
                req.jumped = False
                self._retry(req, now)
            else:
                # Answers come in order on one socket: those of earlier sends of this
                # request, if still to come, end before the next request's.
                self.stale_ends += req.sends
                self._finish_replay(timed_out=broken)
        return self._take()

    def unsent(self) -> None:
        """The last :class:`Request` could not be queued: it is sent again at the next tick.

        Past the idle timeout without a send the request is given up (no connection).
        """
        req = self.pending
        if req is not None and req.sent:
            req.sent = False
            req.sends = max(0, req.sends - 1)

    @staticmethod
    def _covered(req: _Pending) -> bool:
        """The replies so far fill the hole the request was made for (up to its trigger)."""
        if req.trigger is None or req.window is None:
            return False
        last = req.window.last(req.topic)
        return last is not None and last >= req.trigger - 1

    def _retry(self, req: _Pending, now: int) -> None:
        """Ask again, on the same socket, from the seq after the last reply received."""
        assert req.window is not None
        req.retries += 1
        req.sends += 1
        req.sent = True
        req.progress_mono = now
        self.stats.replay_retries += 1
        self._out.append(Request(req.window.resume(), req.kind, req.topic))

    def start_history(self, now: int) -> list[Action]:
        """Ask for everything the replay buffer holds (``history``, at start).

        Args:
            now: Monotonic ns.

        Returns:
            The actions.
        """
        self._now = now
        if self.has_replay and self.pending is None:
            self._request("history", None, 0)
        return self._take()

    @property
    def awaiting_replies(self) -> bool:
        """A request is outstanding and not given up: read its socket before a tick."""
        return self.pending is not None and not self.pending.abandon

    def credit_busy(self, now: int, busy_ns: int) -> None:
        """Do not charge the pending request, nor channels' quiet time, for a stalled loop.

        A loop that could not read (busy elsewhere, or the process stopped: SIGSTOP, a
        loaded machine) saw no live batch either: its channels are not quiet for that
        (a tail asked then is asked of a stream whose batches wait in the queue).

        Args:
            now: Monotonic ns.
            busy_ns: How long the loop could not read.
        """
        for ch in self.channels.values():
            ch.last_live_mono = min(now, ch.last_live_mono + busy_ns)
        req = self.pending
        if req is not None:
            req.progress_mono = min(now, req.progress_mono + busy_ns)
            req.started_mono = min(now, req.started_mono + busy_ns)
        if self.held:
            self.held_since_mono = min(now, self.held_since_mono + busy_ns)

    def check_replay(self, now: int) -> list[Action]:
        """Give up the pending request if it is dead, too slow, flooding or holding too much.

        Args:
            now: Monotonic ns.

        Returns:
            The actions.
        """
        self._now = now
        req = self.pending
        if req is None:
            return []
        lim = self.limits
        idle = now - req.progress_mono > lim.replay_timeout_ns
        if req.abandon or now - req.started_mono > lim.deadline_ns or (idle and not req.sent):
            # Flooding, holding too much, past its deadline, or never sent (no connection).
            self._give_up(now)
        elif not req.sent:
            req.sent = True  # sent again (the recorder calls unsent() if it still cannot)
            req.sends += 1
            self._out.append(
                Request(req.window.resume() if req.window else req.start, req.kind, req.topic)
            )
        elif idle:
            self._retry(req, now)
        return self._take()

    def _give_up(self, now: int) -> None:
        """Give the pending request up: what it did not bring is lost or unconfirmed.

        A gap's missing seqs are lost (never asked again: the live batch that showed it
        is placed now); a tail it did not confirm is unconfirmed; the held are placed.
        """
        req = self.pending
        assert req is not None
        self.stats.replay_timeouts += 1
        self.stale_ends += req.sends
        if req.flooded:
            # Flooding: start afresh, dropping whatever it still queues.
            self._out.append(ResetReplySocket())
            self.stale_ends = 0
        topic = req.topic
        if topic is None and len(self.channels) == 1:
            topic = next(iter(self.channels))
        ch = self.channels.get(topic) if topic is not None else None
        if ch is not None and req.trigger is not None:
            # Not asked again: below the live batch that showed it, what is missing is lost.
            ch.floor = max(ch.floor, req.trigger)
        self._finish_replay(timed_out=True)

    def _plausible_high(self, ch: ChannelState) -> int:
        """The highest seq a reply may have for ``ch``, by its own live evidence."""
        highs = (ch.expected, ch.live_high, ch.last_live)
        return max(v for v in highs if v is not None) + seqstate.MAX_REPLY_COUNT

    def _late_reply(self, topic: bytes | None, seq: int, payload: bytes, t: int) -> None:
        """File a reply to a request given up on in its channel's reserve (by seq).

        Only as many as one request may bring, and only seqs inside the window the live
        stream makes plausible; past that the socket floods and is reset.
        """
        lim = self.limits
        if self.late_accepted >= lim.max_late_replies or self.late_bytes > MAX_REPLY_BYTES:
            # It keeps answering what nobody asked: start afresh, and keep of its late
            # replies only what fills holes the live stream shows.
            self.stats.replay_discarded += 1
            self._out.append(ResetReplySocket())
            self.stale_ends = 0
            dropped = 1
            for c in self.channels.values():
                beyond = [k for k in c.reserve if c.live_high is None or k > c.live_high]
                for k in beyond:
                    del c.reserve[k]
                self.stats.replay_discarded += len(beyond)
                dropped += len(beyond)
                if beyond:
                    c.known_max = max(
                        (v for v in (c.seq_last, c.live_high, *c.reserve) if v is not None),
                        default=None,
                    )
            self._out.append(Discard(dropped, "discarded"))
            return
        if topic is None:
            if len(self.channels) != 1:
                return
            ch: ChannelState | None = next(iter(self.channels.values()))
        else:
            ch = self.channels.get(topic)
        self.late_accepted += 1  # counts every late reply: a flood of lies is a flood too
        if ch is None or ch.expected is None or seq < ch.expected or seq in ch.reserve:
            return  # written already, or known lost, or a duplicate
        if seq > max(ch.expected, ch.live_high or 0) + lim.max_late_replies:
            self.stats.replay_rejected += 1  # a lie: never a gap, never written
            self._out.append(Discard(1, "rejected"))
            return
        self.late_bytes += len(payload)
        ch.reserve[seq] = (payload, t)
        if ch.known_max is None or seq > ch.known_max:
            ch.known_max = seq

    def _finish_replay(self, *, timed_out: bool) -> None:
        """File a finished replay's batches in the reserve, then release the held ones.

        The held live batches are placed in seq order as they would have been: each hole
        the live stream has is filled from the reserve; what neither has is lost.
        """
        req = self.pending
        assert req is not None
        self.pending = None
        held, self.held, self.held_bytes = self.held, [], 0
        # Old-layout replies carry no topic: they belong to the channel that asked, or to
        # the endpoint's only channel, or to the topic we subscribed to.
        default_topic = req.topic
        if default_topic is None:
            default_topic = (
                next(iter(self.channels)) if len(self.channels) == 1 else self.topic_prefix
            )
        first_reply: dict[bytes, int] = {}
        touched: list[ChannelState] = []
        replies = req.replies
        if req.flooded and req.window is not None:
            # A flooding socket is trusted only where the live stream shows the seqs
            # exist (to fill its holes); what it sent beyond is dropped, not written.
            hi = -1 if req.window.live_high is None else req.window.live_high
            kept = [r for r in replies if r[1] <= hi]
            if len(replies) > len(kept):
                self.stats.replay_discarded += len(replies) - len(kept)
                self._out.append(Discard(len(replies) - len(kept), "discarded"))
            replies = kept
        rejected = 0
        for tp, seq, payload, t, origin in replies:
            if origin == _NO_TOPIC:
                tp = default_topic
            if not tp.startswith(self.topic_prefix):
                continue
            ch = self.channels.get(tp)
            if ch is None:
                if req.kind != "history" and tp != default_topic:
                    continue
                ch = self._channel(tp)
                if ch is None:
                    continue
            if ch.expected is not None and seq > self._plausible_high(ch):
                # In the request's window only through another channel's seqs: a lie
                # for this channel, never a gap of that size (issue 8.7).
                rejected += 1
                continue
            if tp not in first_reply:
                first_reply[tp] = seq
                touched.append(ch)
            if ch.expected is None or seq >= ch.expected:
                ch.reserve[seq] = (payload, t)
                if ch.known_max is None or seq > ch.known_max:
                    ch.known_max = seq
        # What the buffer no longer holds: below its first reply (when that is past the
        # start asked for) or, for a gap, everything before the live batch that showed it.
        if not timed_out:
            for ch in touched:
                r0 = first_reply[ch.topic]
                if r0 > req.start:
                    ch.floor = max(ch.floor, r0)
            if req.kind == "gap" and req.trigger is not None:
                # Whatever the replay had before the batch that revealed the gap is in
                # the reserve now; the rest of the hole is gone.
                gch = self.channels.get(default_topic)
                if gch is not None:
                    gch.floor = max(gch.floor, req.trigger)
        if req.kind == "history":
            asked = self.channels.get(default_topic)
            if asked is not None:
                asked.history_asked = True
            self._in_history = True
            try:
                for ch in touched:
                    ch.history_asked = True
                    if ch.expected is None and ch.reserve:
                        ch.expected = min(ch.reserve)
                        far = [k for k in ch.reserve if k - ch.expected > MAX_PLAUSIBLE_JUMP]
                        for k in far:
                            del ch.reserve[k]
                        rejected += len(far)
                        ch.known_max = max(ch.reserve)
                    first_live = next((it[1] for it in held if it[0] == ch.topic), None)
                    self._fill(ch, None if first_live is None else first_live - 1)
            finally:
                self._in_history = False
        if rejected:
            self.stats.replay_rejected += rejected
            self._out.append(Discard(rejected, "rejected"))
        if req.kind == "tail":
            tch = self.channels.get(default_topic)
            if tch is not None:
                # Held live batches of the channel, if any, clear this again.
                self._confirm(tch, confirmed=not timed_out)
        for item in held:
            self._feed(item)
        if req.kind == "tail" and self.pending is None:
            tch = self.channels.get(default_topic)
            if tch is not None:
                e = tch.expected
                if (
                    e is not None
                    and e < tch.floor
                    and tch.reserve
                    and min(tch.reserve) >= tch.floor
                ):
                    # The buffer had moved past what we asked for: the tail's start is gone.
                    self._lose(tch, e, tch.floor - 1)
                self._fill(tch, None, tail=True)
