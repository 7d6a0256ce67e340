"""A test-side vLLM-like KV-event publisher: PUB framing plus the ROUTER replay protocol.

It speaks what ``vllm.distributed.kv_events.ZmqEventPublisher`` speaks (PROTOCOL.md):

- live stream: ``[topic, seq (8 bytes BE), payload]`` on a publishing socket. It is an
  XPUB socket, which a subscriber cannot tell from PUB, so the peer can *see* the
  subscription arrive and start publishing only then (no slow-joiner sleeps in tests);
- replay: a ROUTER socket answering ``[b"", start_seq]`` with one reply per buffered
  batch (``[b"", topic, seq, payload]``, or the older ``[b"", seq, payload]``) and the
  end marker (seq ``-1``, empty payload);
- faults: chosen seqs (or a random fraction) are kept out of the live stream but stay in
  the replay buffer, the buffer holds only ``buffer_steps`` batches, the publisher can
  pause until a replay request is served (so what the buffer holds is deterministic),
  and it can restart (sockets closed and re-bound, seq back to 0, buffer emptied).

Always loopback, ephemeral ports unless told otherwise. Runs in a thread
(``with Peer(msgs) as peer: ...``) or as a subprocess
(``python tests/peer.py tests/data/captures/gemma3.frames``), which prints
``READY <pub endpoint> <replay endpoint>`` on stdout once bound.
"""

from __future__ import annotations

import argparse
import collections
import random
import struct
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

import zmq

END_SEQ = (-1).to_bytes(8, "big", signed=True)
HOST = "tcp://127.0.0.1"

Message = tuple[bytes, int, bytes]


def read_frames(path: str | Path) -> list[Message]:
    """Read a ``.frames`` capture as ``(topic, seq, payload)`` tuples."""
    data = Path(path).read_bytes()
    off = 0
    out: list[Message] = []
    while off < len(data):
        (count,) = struct.unpack_from(">I", data, off)
        off += 4
        frames = []
        for _ in range(count):
            (ln,) = struct.unpack_from(">I", data, off)
            off += 4
            frames.append(data[off : off + ln])
            off += ln
        topic, seq, payload = frames
        out.append((topic, int.from_bytes(seq[:8], "big"), payload))
    return out


def _bind(sock: zmq.Socket[bytes], endpoint: str | None) -> str:
    """Bind to ``endpoint`` (loopback only) or to a random loopback port; return it."""
    if endpoint is None:
        return f"{HOST}:{sock.bind_to_random_port(HOST)}"
    _loopback(endpoint)
    sock.bind(endpoint)
    return endpoint


def _loopback(endpoint: str) -> None:
    if endpoint.startswith("tcp://") and not endpoint.startswith(
        ("tcp://127.", "tcp://localhost", "tcp://[::1]")
    ):
        raise ValueError(f"peer: refusing non-loopback endpoint {endpoint}")


class Peer:
    """A publisher of pre-encoded batches with vLLM's framing and replay protocol.

    Args:
        messages: ``(topic, seq, payload)`` tuples (the seqs are ignored: the peer
            numbers what it sends from 0, as a fresh vLLM publisher does) or raw payloads.
        count: How many batches to publish (default: ``len(messages)``); more than
            that cycles through the payloads again with growing seqs.
        endpoint: Where to bind the publishing socket (default: a random loopback port).
        replay: Serve the replay protocol (``True`` = random loopback port, or an endpoint,
            or ``False`` for none).
        buffer_steps: Batches the replay buffer keeps.
        reply_layout: ``"topic"`` (vLLM >= 0.26: ``[b"", topic, seq, payload]``) or
            ``"legacy"`` (``[b"", seq, payload]``, older vLLM and SGLang).
        drop: Seqs kept out of the live stream (still in the replay buffer): ``seq`` in
            any epoch, or ``(epoch, seq)`` (the epoch counts restarts).
        drop_rate: Fraction of seqs dropped at random (seeded by ``seed``).
        pause_for_replay_after: After publishing one of these seqs, wait until a replay
            request has been served (at most ``pause_timeout`` s).
        restart_after: Publish this many batches, then restart: close and re-bind both
            sockets, seq back to 0, buffer emptied; the rest follows in the new epoch.
        wait_subscribers: Subscriptions to wait for before publishing (0: don't wait).
        publish_before_wait: Publish this many batches (to nobody) before waiting for
            subscribers: what a late subscriber can only get with ``history``.
        start_delay: Extra seconds to wait before the first batch.
        rate: Batches per second (0: as fast as possible).
        linger: Seconds to keep serving replay after the last batch (``stop()`` ends it).
        topic: Override the topic frame of every message.
        seq_width: Bytes in the seq frame (8, or 24 as in an unreleased vLLM snapshot).
        hwm: Send high-water mark.
        replay_delay: Seconds to wait before answering a replay request (a slow replay
            socket); publishing goes on meanwhile.
        replay_mode: How the replay socket behaves: ``"honest"`` (vLLM's protocol),
            ``"lie"`` (first a reply at seq ``2**63 - 3`` and one below the start asked,
            then the honest answer), or -- never sending the end marker -- ``"flood"``
            (in-range replies as fast as ZeroMQ takes them, forever), ``"huge"`` (replies
            of ``huge_bytes`` bytes, forever) or ``"trickle"`` (one reply every 200 ms,
            forever); ``"pause"`` (honest, but ``replay_pause`` seconds before each
            ``pause_every`` replies and before the end marker: a publisher serving replay
            in its own thread, as SGLang does); ``"cut"`` (the first ``replay_cut`` replies
            of each answer, then nothing: no end marker); ``"far_lie"`` (only seqs it was
            not asked for, ``start + 5000`` and ``2**60 + 13``, then the end marker).
        replay_pause: See ``"pause"``.
        pause_every: See ``"pause"``.
        pause_first: With ``"pause"``, pause before the first replies too.
        replay_cut: See ``"cut"``.
        answer_limit: Answer only this many requests (the rest are ignored).
        huge_bytes: Payload size of a ``"huge"`` reply.
        stray: ``(after_seq, old_seq)`` pairs: after publishing ``after_seq``, send
            ``old_seq`` again live, with its own payload (one out-of-order batch).
        jump: ``(after_seq, next_seq)`` pairs: after ``after_seq`` the live seqs go on
            from ``next_seq`` (a hostile publisher jumping, e.g. to near ``2**63``).
    """

    def __init__(
        self,
        messages: Sequence[Message] | Sequence[bytes],
        *,
        count: int | None = None,
        endpoint: str | None = None,
        replay: bool | str = True,
        buffer_steps: int = 10_000,
        reply_layout: str = "topic",
        drop: Iterable[int | tuple[int, int]] = (),
        drop_rate: float = 0.0,
        seed: int = 0,
        pause_for_replay_after: Iterable[int] = (),
        pause_timeout: float = 5.0,
        restart_after: int | None = None,
        wait_subscribers: int = 1,
        publish_before_wait: int = 0,
        subscribe_timeout: float = 10.0,
        start_delay: float = 0.0,
        rate: float = 0.0,
        linger: float = 30.0,
        topic: bytes | None = None,
        seq_width: int = 8,
        hwm: int = 100_000,
        replay_delay: float = 0.0,
        replay_mode: str = "honest",
        replay_pause: float = 5.0,
        pause_every: int = 1,
        pause_first: bool = True,
        replay_cut: int = 5,
        answer_limit: int | None = None,
        huge_bytes: int = 4 * 1024 * 1024,
        stray: Iterable[tuple[int, int]] = (),
        jump: Iterable[tuple[int, int]] = (),
    ) -> None:
        modes = ("honest", "lie", "flood", "huge", "trickle", "pause", "cut", "far_lie")
        if replay_mode not in modes:
            raise ValueError(f"unknown replay_mode {replay_mode!r}")
        self.replay_mode = replay_mode
        self.replay_pause = replay_pause
        self.pause_every = max(1, pause_every)
        self.pause_first = pause_first
        self.replay_cut = replay_cut
        self.answer_limit = answer_limit
        # Replies due later ("pause"): (due, frames), in send order; one answer after
        # another, as a single-threaded publisher serves them.
        self._scheduled: collections.deque[tuple[float, tuple[bytes, ...]]] = collections.deque()
        self._busy_until = 0.0
        self.huge_bytes = huge_bytes
        self.stray = dict(stray)
        self.jump = dict(jump)
        # Endless answers being sent: [ident, next seq, next send time]
        self._streams: list[list[object]] = []
        self.hostile_sent = 0
        if reply_layout not in ("topic", "legacy"):
            raise ValueError(f"reply_layout must be 'topic' or 'legacy', not {reply_layout!r}")
        self.payloads: list[tuple[bytes, bytes]] = []
        for m in messages:
            if isinstance(m, bytes):
                self.payloads.append((b"" if topic is None else topic, m))
            else:
                self.payloads.append((m[0] if topic is None else topic, m[2]))
        self.count = len(self.payloads) if count is None else count
        self.buffer_steps = buffer_steps
        self.reply_layout = reply_layout
        self.drop = set(drop)
        self.drop_rate = drop_rate
        self._rng = random.Random(seed)
        self.pause_for_replay_after = set(pause_for_replay_after)
        self.pause_timeout = pause_timeout
        self.restart_after = restart_after
        self.wait_subscribers = wait_subscribers
        self.publish_before_wait = publish_before_wait
        self.subscribe_timeout = subscribe_timeout
        self.start_delay = start_delay
        self.rate = rate
        self.linger = linger
        self.seq_width = seq_width
        self.hwm = hwm
        self.replay_delay = replay_delay
        self._delayed: list[tuple[float, list[bytes]]] = []

        self.ctx = zmq.Context()
        self._pub: zmq.Socket[bytes] | None = None
        self._router: zmq.Socket[bytes] | None = None
        self.replay_endpoint: str | None = None
        try:
            self.endpoint = self._bind_pub(endpoint)
            if replay:
                self.replay_endpoint = self._bind_router(None if replay is True else str(replay))
        except BaseException:
            self._close_sockets()
            self.ctx.term()
            raise

        # What happened, for assertions: every batch as published (epoch, seq, topic,
        # payload), the seqs kept out of the live stream, replay requests served.
        self.published: list[tuple[int, int, bytes, bytes]] = []
        self.dropped: list[tuple[int, int]] = []
        self.replay_requests: list[int] = []
        self.replayed = 0
        self.subscriptions = 0
        self.error: BaseException | None = None
        self.publish_seconds = 0.0
        self.done = threading.Event()
        self._stop = threading.Event()
        self._served = threading.Event()
        self._buffer: collections.deque[tuple[int, bytes, bytes]] = collections.deque(
            maxlen=max(buffer_steps, 1)
        )
        self._thread: threading.Thread | None = None
        self._poller = zmq.Poller()
        self._register()

    # ----------------------------------------------------------------- sockets
    def _bind_pub(self, endpoint: str | None) -> str:
        pub = self.ctx.socket(zmq.XPUB)
        self._pub = pub
        pub.setsockopt(zmq.LINGER, 0)
        pub.setsockopt(zmq.SNDHWM, self.hwm)
        pub.setsockopt(zmq.XPUB_VERBOSE, 1)
        return _bind(pub, endpoint)

    def _bind_router(self, endpoint: str | None) -> str:
        router = self.ctx.socket(zmq.ROUTER)
        self._router = router
        router.setsockopt(zmq.LINGER, 0)
        hwm = 2 * (self.buffer_steps + 1) + 10
        if self.replay_mode in ("flood", "huge"):
            hwm = 20  # the flood is the recorder's problem, not this process's memory
        router.setsockopt(zmq.SNDHWM, hwm)
        return _bind(router, endpoint)

    def _register(self) -> None:
        self._poller = zmq.Poller()
        assert self._pub is not None
        self._poller.register(self._pub, zmq.POLLIN)
        if self._router is not None:
            self._poller.register(self._router, zmq.POLLIN)

    def _close_sockets(self, linger: int = 0) -> None:
        for sock in (self._pub, self._router):
            if sock is not None:
                sock.close(linger=linger)
        self._pub = None
        self._router = None

    # -------------------------------------------------------------- lifecycle
    def start(self) -> Peer:
        """Start publishing in a background thread."""
        self._thread = threading.Thread(target=self._run_guarded, name="peer", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Ask the thread to finish (it stops lingering) and wait for it."""
        self._stop.set()
        self.join()

    def join(self, timeout: float | None = 30.0) -> None:
        """Wait for the thread to end."""
        if self._thread is not None:
            self._thread.join(timeout)

    def close(self) -> None:
        """Stop and release every socket and the context."""
        self.stop()
        self._close_sockets()
        self.ctx.term()

    def __enter__(self) -> Peer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def wait_done(self, timeout: float = 30.0) -> None:
        """Wait until every batch was published; re-raise an error of the thread."""
        if not self.done.wait(timeout):
            raise TimeoutError("peer: publishing did not finish in time")
        if self.error is not None:
            raise self.error

    # ---------------------------------------------------------------- the run
    def _run_guarded(self) -> None:
        try:
            self.run()
        except BaseException as err:  # surfaced by wait_done()
            self.error = err
            self.done.set()

    def run(self) -> None:
        """Publish every batch (blocking), then serve replay for ``linger`` seconds."""
        epoch = 0
        seq = 0
        if not self.publish_before_wait:
            self._wait_for_subscribers()
        if self.start_delay:
            self._serve(self.start_delay)
        t0 = time.monotonic()
        for i in range(self.count):
            if self._stop.is_set():
                break
            if self.publish_before_wait and i == self.publish_before_wait:
                self._wait_for_subscribers()
                t0 = time.monotonic() - i / self.rate if self.rate > 0 else t0
            if self.restart_after is not None and i == self.restart_after:
                self._restart()
                epoch += 1
                seq = 0
            topic, payload = self.payloads[i % len(self.payloads)]
            self._publish(epoch, seq, topic, payload)
            if seq in self.pause_for_replay_after:
                self._served.clear()
                deadline = time.monotonic() + self.pause_timeout
                while not self._served.is_set() and time.monotonic() < deadline:
                    self._serve(0.01)
            seq = self.jump.get(seq, seq + 1)
            if self.rate > 0:
                due = t0 + (i + 1) / self.rate
                self._serve(max(0.0, due - time.monotonic()))
            elif self._router is not None and (i & 15) == 15:
                self._serve(0)
        self.publish_seconds = time.monotonic() - t0
        self.done.set()
        deadline = time.monotonic() + self.linger
        while not self._stop.is_set() and time.monotonic() < deadline:
            self._serve(0.05)

    def _publish(self, epoch: int, seq: int, topic: bytes, payload: bytes) -> None:
        self._buffer.append((seq, topic, payload))
        self.published.append((epoch, seq, topic, payload))
        drop = self.drop and (seq in self.drop or (epoch, seq) in self.drop)
        if drop or (self.drop_rate and self._rng.random() < self.drop_rate):
            self.dropped.append((epoch, seq))
            return
        seq_frame = seq.to_bytes(8, "big") + b"\0" * (self.seq_width - 8)
        assert self._pub is not None
        self._pub.send_multipart((topic, seq_frame, payload), copy=False)
        old = self.stray.get(seq)
        if old is not None:
            _, old_topic, old_payload = next(b for b in self._buffer if b[0] == old)
            self._pub.send_multipart((old_topic, old.to_bytes(8, "big"), old_payload))

    def _wait_for_subscribers(self, since: int = 0) -> None:
        """Wait until ``wait_subscribers`` subscriptions arrived (counted from ``since``)."""
        if self.wait_subscribers <= 0:
            return
        deadline = time.monotonic() + self.subscribe_timeout
        while self.subscriptions - since < self.wait_subscribers:
            if self._stop.is_set() or time.monotonic() > deadline:
                raise TimeoutError(f"peer: no subscriber on {self.endpoint}")
            self._serve(0.02)

    def _restart(self) -> None:
        """Close and re-bind both sockets on the same endpoints; empty the buffer."""
        replay = self.replay_endpoint
        since = self.subscriptions
        # A graceful shutdown: what is queued for the subscriber still goes out.
        self._close_sockets(linger=2000)
        self._buffer.clear()
        for attempt in range(100):
            try:
                self._bind_pub(self.endpoint)
                if replay is not None:
                    self._bind_router(replay)
                break
            except zmq.ZMQError:  # the old listener is not gone yet
                self._close_sockets()
                if attempt == 99:
                    raise
                time.sleep(0.02)
        self._register()
        self._wait_for_subscribers(since)

    def _serve(self, timeout_s: float) -> int:
        """Serve replay requests and note subscriptions for up to ``timeout_s``.

        Returns:
            New subscriptions seen.
        """
        subs = 0
        deadline = time.monotonic() + timeout_s
        while True:
            left = max(0.0, deadline - time.monotonic())
            if self._streams:
                self._misbehave()
                left = min(left, 0.005)
            if self._scheduled:
                left = min(left, max(0.0, self._scheduled[0][0] - time.monotonic()))
            ready = dict(self._poller.poll(int(left * 1000)))
            if self._pub is not None and self._pub in ready:
                while True:
                    try:
                        msg = self._pub.recv(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    if msg[:1] == b"\x01":
                        subs += 1
                        self.subscriptions += 1
            if self._router is not None and self._router in ready:
                while True:
                    try:
                        req = self._router.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    if self.replay_delay:
                        self._delayed.append((time.monotonic() + self.replay_delay, req))
                    else:
                        self._answer(req)
            while self._delayed and self._delayed[0][0] <= time.monotonic():
                self._answer(self._delayed.pop(0)[1])
            while self._scheduled and self._scheduled[0][0] <= time.monotonic():
                assert self._router is not None
                self._router.send_multipart(self._scheduled.popleft()[1])
            if time.monotonic() >= deadline:
                return subs

    def _answer(self, req: list[bytes]) -> None:
        assert self._router is not None
        if len(req) != 3:
            return
        ident, _, start_b = req
        start = int.from_bytes(start_b[:8], "big")
        self.replay_requests.append(start)
        if self.answer_limit is not None and len(self.replay_requests) > self.answer_limit:
            return
        if self.replay_mode in ("pause", "cut", "far_lie"):
            self._answer_shaped(ident, start)
            self._served.set()
            return
        if self.replay_mode in ("flood", "huge", "trickle"):
            self._streams.append([ident, start, time.monotonic()])
            self._served.set()
            return
        if self.replay_mode == "lie":
            payload = self.payloads[0][1]
            for lie in (2**63 - 3, max(0, start - 1)):
                if lie != start:
                    self._router.send_multipart(
                        (ident, b"", self.payloads[0][0], lie.to_bytes(8, "big"), payload)
                    )
                    self.hostile_sent += 1
        for seq, topic, payload in self._buffer:
            if seq >= start:
                seq_b = seq.to_bytes(8, "big")
                if self.reply_layout == "topic":
                    self._router.send_multipart((ident, b"", topic, seq_b, payload))
                else:
                    self._router.send_multipart((ident, b"", seq_b, payload))
                self.replayed += 1
        if self.reply_layout == "topic":
            self._router.send_multipart((ident, b"", b"", END_SEQ, b""))
        else:
            self._router.send_multipart((ident, b"", END_SEQ, b""))
        self._served.set()

    def _reply_frames(
        self, ident: bytes, seq: int, topic: bytes, payload: bytes
    ) -> tuple[bytes, ...]:
        seq_b = seq.to_bytes(8, "big")
        if self.reply_layout == "topic":
            return (ident, b"", topic, seq_b, payload)
        return (ident, b"", seq_b, payload)

    def _end_frames(self, ident: bytes) -> tuple[bytes, ...]:
        if self.reply_layout == "topic":
            return (ident, b"", b"", END_SEQ, b"")
        return (ident, b"", END_SEQ, b"")

    def _answer_shaped(self, ident: bytes, start: int) -> None:
        """Answer in the ``"pause"``, ``"cut"`` or ``"far_lie"`` way."""
        assert self._router is not None
        replies = [
            self._reply_frames(ident, seq, topic, payload)
            for seq, topic, payload in self._buffer
            if seq >= start
        ]
        if self.replay_mode == "far_lie":
            topic, payload = self.payloads[0]
            for lie in (start + 5000, 2**60 + 13):
                self._router.send_multipart(self._reply_frames(ident, lie, topic, payload))
                self.hostile_sent += 1
            self._router.send_multipart(self._end_frames(ident))
            return
        if self.replay_mode == "cut":
            for frames in replies[: self.replay_cut]:
                self._router.send_multipart(frames)
                self.replayed += 1
            return
        t = max(time.monotonic(), self._busy_until)
        chunks = [
            replies[i : i + self.pause_every] for i in range(0, len(replies), self.pause_every)
        ]
        for i, chunk in enumerate([*chunks, [self._end_frames(ident)]]):
            if i or self.pause_first:
                t += self.replay_pause
            for frames in chunk:
                self._scheduled.append((t, frames))
        self.replayed += len(replies)
        self._busy_until = t

    def _misbehave(self) -> None:
        """Send the next replies of every endless answer (flood, huge, trickle)."""
        assert self._router is not None
        now = time.monotonic()
        for stream in self._streams:
            ident, seq, due = stream
            assert isinstance(ident, bytes) and isinstance(seq, int) and isinstance(due, float)
            if now < due:
                continue
            topic, payload = self.payloads[seq % len(self.payloads)]
            if self.replay_mode == "huge":
                payload = b"\x00" * self.huge_bytes
            n = 200 if self.replay_mode == "flood" else 1
            for _ in range(n):
                self._router.send_multipart((ident, b"", topic, seq.to_bytes(8, "big"), payload))
                self.hostile_sent += 1
                seq += 1
            stream[1] = seq
            stream[2] = now + (0.2 if self.replay_mode == "trickle" else 0.0)

    # ------------------------------------------------------------- for tests
    def live_payloads(self) -> list[tuple[int, bytes]]:
        """Every published ``(seq, payload)`` of the last epoch, in seq order."""
        last = self.published[-1][0] if self.published else 0
        return [(s, p) for e, s, _, p in self.published if e == last]


def _parse_seqs(text: str) -> set[int]:
    out: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            a, b = part.split("-", 1)
            out.update(range(int(a), int(b) + 1))
        else:
            out.add(int(part))
    return out


def main(argv: list[str] | None = None) -> int:
    """Run a peer as a process (for tests that need one, and for making recordings)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("frames", help=".frames capture")
    p.add_argument("--endpoint", default=None, help="bind here (default: random loopback port)")
    p.add_argument("--replay-endpoint", default=None)
    p.add_argument("--no-replay", action="store_true")
    p.add_argument("--legacy-replies", action="store_true")
    p.add_argument("--buffer-steps", type=int, default=10_000)
    p.add_argument("--drop", default="", help="seqs to drop, e.g. 5,9,20-25")
    p.add_argument("--drop-rate", type=float, default=0.0)
    p.add_argument("--pause-after", default="", help="seqs after which to wait for a replay")
    p.add_argument("--restart-after", type=int, default=None)
    p.add_argument("--count", type=int, default=None, help="batches to send (cycles payloads)")
    p.add_argument("--rate", type=float, default=0.0)
    p.add_argument("--wait-subscribers", type=int, default=1)
    p.add_argument("--start-delay", type=float, default=0.0)
    p.add_argument("--linger", type=float, default=3.0)
    p.add_argument("--hwm", type=int, default=100_000)
    a = p.parse_args(argv)
    peer = Peer(
        read_frames(a.frames),
        count=a.count,
        endpoint=a.endpoint,
        replay=False if a.no_replay else (a.replay_endpoint or True),
        buffer_steps=a.buffer_steps,
        reply_layout="legacy" if a.legacy_replies else "topic",
        drop=_parse_seqs(a.drop),
        drop_rate=a.drop_rate,
        pause_for_replay_after=_parse_seqs(a.pause_after),
        restart_after=a.restart_after,
        wait_subscribers=a.wait_subscribers,
        start_delay=a.start_delay,
        rate=a.rate,
        linger=a.linger,
        hwm=a.hwm,
    )
    print(f"READY {peer.endpoint} {peer.replay_endpoint or '-'}", flush=True)
    try:
        peer.run()
    finally:
        print(
            f"DONE published={len(peer.published)} dropped={len(peer.dropped)} "
            f"replay_requests={len(peer.replay_requests)} replayed={peer.replayed} "
            f"seconds={peer.publish_seconds:.3f} "
            f"rate={len(peer.published) / max(peer.publish_seconds, 1e-9):.0f}/s",
            file=sys.stderr,
            flush=True,
        )
        peer._close_sockets()
        peer.ctx.term()
    return 0


if __name__ == "__main__":
    sys.exit(main())
