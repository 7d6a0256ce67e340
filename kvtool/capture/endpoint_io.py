"""The recorder's second layer: each endpoint's sockets read and the sequencer's actions done.

:class:`EndpointIO` drains the SUB sockets, their monitors and the replay DEALERs, feeds
what they bring (and the clock) to each endpoint's
:class:`~kvtool.capture.sequencer.Sequencer`, and carries out the actions it returns:
write, send a request, replace the replay socket.
"""

from __future__ import annotations

import contextlib
import time

import zmq
from zmq.utils.monitor import recv_monitor_message

from kvtool.capture.sequencer import (
    Action,
    NewChannel,
    Request,
    ResetReplySocket,
    Write,
)
from kvtool.capture.writes import (
    BURST,
    BURST_NS,
    DEALER_RCVHWM,
    END_SEQ,
    LOOP_STALL_NS,
    MAX_MESSAGE_BYTES,
    RecorderWrites,
    _Role,
    _Src,
)
from kvtool.endpoints import (
    ConnectTimeout,
)
from kvtool.errors import EndpointError


class EndpointIO(RecorderWrites):
    """A :class:`~kvtool.capture.writes.RecorderWrites` that also reads its endpoints' sockets."""

    _ctx: zmq.Context[zmq.Socket[bytes]]
    """The ZeroMQ context (set when the recorder runs)."""

    def _new_dealer(self, src: _Src, ctx: zmq.Context[zmq.Socket[bytes]] | None = None) -> None:
        if src.dealer is not None:
            src.dealer.close(linger=0)
        d = (ctx or self._ctx).socket(zmq.DEALER)
        d.setsockopt(zmq.LINGER, 0)
        # A request is queued only on a connection: with none, its send fails and it is
        # sent again at the next tick (given up after --replay-timeout without one).
        d.setsockopt(zmq.IMMEDIATE, 1)
        d.setsockopt(zmq.RCVHWM, DEALER_RCVHWM)
        d.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        assert src.spec.replay is not None
        if "[" in src.spec.replay:
            d.setsockopt(zmq.IPV6, 1)
        try:
            d.connect(src.spec.replay)
        except zmq.ZMQError as err:
            d.close(linger=0)
            raise EndpointError(
                f"replay endpoint {src.spec.replay}: cannot connect: {err}"
            ) from err
        src.dealer = d

    def _close_sockets(self) -> None:
        for src in self._srcs:
            if src.sub_mon is not None:
                with contextlib.suppress(zmq.ZMQError):
                    src.sub.disable_monitor()
                src.sub_mon.close(linger=0)
            src.sub.close(linger=0)
            if src.dealer is not None:
                src.dealer.close(linger=0)
                src.dealer = None

    def _build_poller(self, live: bool) -> tuple[zmq.Poller, dict[zmq.Socket[bytes], _Role]]:
        poller = zmq.Poller()
        roles: dict[zmq.Socket[bytes], _Role] = {}
        for src in self._srcs:
            if live:
                poller.register(src.sub, zmq.POLLIN)
                roles[src.sub] = ("sub", src)
                if src.sub_mon is not None:
                    poller.register(src.sub_mon, zmq.POLLIN)
                    roles[src.sub_mon] = ("mon", src)
            if src.dealer is not None:
                poller.register(src.dealer, zmq.POLLIN)
                roles[src.dealer] = ("dealer", src)
        return poller, roles

    def _dealer_ids(self) -> tuple[int, ...]:
        return tuple(id(s.dealer) for s in self._srcs)

    def _drain_sub(self, src: _Src) -> bool:
        """Read up to BURST messages; return True when more may be waiting."""
        recv = src.sub.recv_multipart
        time_ns = time.time_ns
        live = src.seq.live
        act = self._act
        start = time.monotonic_ns()
        n = 0
        more = False
        stopping = self._stop_flag.is_set
        monotonic_ns = time.monotonic_ns
        until = start + BURST_NS
        while n < BURST:
            try:
                frames = recv(zmq.NOBLOCK)
            except zmq.Again:
                break
            n += 1
            if len(frames) != 3 or len(frames[1]) < 8:
                self.stats.malformed += 1
                continue
            topic, seq_b, payload = frames
            seq = int.from_bytes(seq_b if len(seq_b) == 8 else seq_b[:8], "big")
            act(src, live(topic, seq, payload, time_ns(), start))
            if self._budget.full or stopping():
                break
            if monotonic_ns() >= until:
                more = True
                break
        if n:
            # A long drain must not make its channels look quiet.
            src.seq.live_drained(start, time.monotonic_ns())
            src.received += n
            src.connected = True
            self.stats.connected.add(src.spec.endpoint)
        return more or n >= BURST

    def _drain_monitor(self, src: _Src) -> None:
        assert src.sub_mon is not None
        while True:
            try:
                msg = recv_monitor_message(src.sub_mon, zmq.NOBLOCK)
            except zmq.Again:
                return
            ev = msg["event"]
            if ev == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                src.connected = True
                self.stats.connected.add(src.spec.endpoint)
            elif ev == zmq.EVENT_DISCONNECTED:
                self.stats.connected.discard(src.spec.endpoint)

    def _check_connected(self) -> None:
        missing = [s for s in self._srcs if not s.connected and s.received == 0]
        if not missing:
            return
        secs = (self.connect_timeout_ns or 0) / 1e9
        names = ", ".join(s.spec.endpoint for s in missing)
        how = "accepted a publisher on" if self.bind else "reached a publisher at"
        replay = [s.spec.replay for s in missing if s.spec.replay]
        rep = ""
        if replay:
            rep = f" (replay {', '.join(r for r in replay if r)} did not answer either)"
        raise ConnectTimeout(
            f"no connection and no batch within {secs:g}s: never {how} {names}{rep}; "
            "is vLLM running with --kv-events-config publishing there? "
            "(raise --connect-timeout, or 0 to wait forever)"
        )

    def _act(self, src: _Src, actions: list[Action]) -> bool:
        """Carry out a sequencer's actions; return True when the replay socket was replaced."""
        reset = False
        for a in actions:
            if type(a) is Write:
                if not self._full:
                    self._write(src, a)
            elif type(a) is Request:
                self._request(src, a.kind, a.topic, a.start_seq)
            elif type(a) is NewChannel:
                writer = self._writer
                assert writer is not None
                ch = src.seq.channels[a.topic]
                src.channel_ids[a.topic] = writer.add_channel(
                    src.spec.endpoint, ch.topic_str, src.spec.dp_rank
                )
            elif type(a) is ResetReplySocket:
                self._new_dealer(src)
                reset = True
            # Lose, Restart, Stray and Discard are in the ledger and counters already.
        return reset

    def _request(
        self,
        src: _Src,
        kind: str,
        topic: bytes | None,
        start: int,
        trigger: int | None = None,
    ) -> None:
        """Send a replay request the sequencer decided on (``[b"", start_seq]``)."""
        dealer = src.dealer
        try:
            if dealer is None:
                raise zmq.Again
            dealer.send_multipart((b"", start.to_bytes(8, "big")), zmq.NOBLOCK)
        except zmq.Again:  # unsent: times out like an unanswered one
            src.seq.unsent()

    def _drain_dealer(self, src: _Src) -> None:
        """Read up to BURST replies (a flooding socket cannot keep the loop here)."""
        dealer = src.dealer
        assert dealer is not None
        seq_ = src.seq
        until = time.monotonic_ns() + BURST_NS
        for _ in range(BURST):
            if time.monotonic_ns() >= until:
                return  # the rest at the next poll: the loop's timers first
            try:
                frames = dealer.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            now = time.monotonic_ns()
            if len(frames) == 4 and not frames[0]:
                _, topic_f, seq_b, payload = frames
                topic: bytes | None = topic_f
            elif len(frames) == 3 and not frames[0]:
                _, seq_b, payload = frames
                topic = None
            else:
                seq_.reply_seen(now)  # the replay socket is alive
                self.stats.malformed += 1
                continue
            if seq_b[:8] == END_SEQ:
                if self._act(src, seq_.reply_end(now)):
                    return
                continue
            if len(seq_b) < 8:
                seq_.reply_seen(now)
                self.stats.malformed += 1
                continue
            seq = int.from_bytes(seq_b[:8], "big")
            if self._act(src, seq_.reply(topic, seq, payload, time.time_ns(), now)):
                return

    def _credit_busy(self, now: int, busy_ns: int) -> None:
        """Do not charge pending replays for a loop pass spent busy elsewhere."""
        if busy_ns <= LOOP_STALL_NS:
            return
        for src in self._srcs:
            src.seq.credit_busy(now, busy_ns)

    def _check_replays(self, now: int) -> None:
        for src in self._srcs:
            seq_ = src.seq
            if seq_.pending is None:
                continue
            if seq_.awaiting_replies and src.dealer is not None:
                # Never time out a request whose replies are waiting to be read.
                req = seq_.pending
                self._drain_dealer(src)
                if seq_.pending is not req:
                    continue
                now = max(now, time.monotonic_ns())
            self._act(src, seq_.check_replay(now))

    def _check_quiet(self, now: int) -> None:
        for src in self._srcs:
            self._act(src, src.seq.check_quiet(now))
