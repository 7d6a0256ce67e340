"""Re-publish recorded batches with vLLM's framing: PUB stream plus the replay ROUTER.

What a subscriber sees is what ``vllm.distributed.kv_events.ZmqEventPublisher`` sends:
``[topic, seq (8 bytes big-endian), payload]`` on the publishing socket and, on the
optional replay socket, one reply per buffered batch with ``seq >= start_seq`` followed
by the end marker (seq -1, empty payload) — ``[b"", topic, seq, payload]`` as since vLLM
0.26, or ``[b"", seq, payload]`` as before (``legacy_replay``).

The publishing socket is an XPUB, which subscribers cannot tell from a PUB, so the
publisher can count subscriptions and wait for them (ZeroMQ's slow joiner). Sockets
bind to 127.0.0.1 unless an address is given.
"""

from __future__ import annotations

import collections
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType

import zmq

from kvtool.endpoints import offset_endpoint
from kvtool.errors import EndpointError, UsageError
from kvtool.text import plural, printable

END_SEQ = (-1).to_bytes(8, "big", signed=True)
"""The replay end marker: seq -1 as 8-byte signed big-endian."""

DEFAULT_SNDHWM = 100_000
"""vLLM's default ``hwm`` for its PUB socket: the most messages queued per subscriber (the
bound :func:`sndhwm_for` lowers for large batches)."""
DEFAULT_BUFFER_STEPS = 10_000
"""vLLM's default ``buffer_steps``: batches the replay socket can serve."""
PUB_QUEUE_BYTES = 64 * 1024 * 1024
"""Bytes of batches (the size of the input's largest first batches) ZeroMQ may queue for
one subscriber that does not read: the PUB ``SNDHWM`` is this over the batch size, at
least :data:`MIN_SNDHWM` (issue 23: 100,000 queued 1 MB batches were 3.3 GB)."""
MIN_SNDHWM = 64
REPLAY_BUFFER_BYTES = 128 * 1024 * 1024
"""Payload bytes the replay buffer keeps (besides ``buffer_steps`` batches): the oldest go
first. Only with a replay endpoint is there a buffer at all."""
_SNDMORE = int(zmq.SNDMORE)
_COPY_THRESHOLD = 65_536  # larger payloads are sent zero-copy


def sndhwm_for(batch_bytes: int, budget: int = PUB_QUEUE_BYTES, most: int = DEFAULT_SNDHWM) -> int:
    """The send high-water mark that keeps one peer's queue near ``budget`` bytes.

    Args:
        batch_bytes: The (largest expected) batch size.
        budget: The bytes one peer's queue may hold.
        most: The bound for small batches.

    Returns:
        ``budget // batch_bytes`` within ``[MIN_SNDHWM, most]``.
    """
    return max(min(MIN_SNDHWM, most), min(most, budget // max(1, batch_bytes)))


# -- sockets ---------------------------------------------------------------------------


REPLAY_SNDHWM = 1_000
"""Replay reply messages ZeroMQ may queue per peer (fewer for large batches: see
:data:`REPLAY_QUEUE_BYTES`). vLLM sets no bound (SNDHWM 0), so a peer that sends requests
and never reads grows the publisher without limit; past this bound the publisher waits
for the peer to read, streaming the rest of the reply as it does."""
REPLAY_QUEUE_BYTES = 16 * 1024 * 1024
"""Bytes of replies ZeroMQ may queue for one replay peer (the ROUTER ``SNDHWM`` is this
over the batch size). Large replies are sent zero-copy from the buffer."""
MAX_REPLAY_REQUESTS_PER_PEER = 4
"""Requests one peer may have waiting or being answered; more are refused (and counted)."""
MAX_REPLAY_PEERS = 64
"""Peers with a reply in progress at once. A request from one more evicts the peer stalled
longest (its queue full, not reading); with none stalled it is answered with the end
marker alone (issue 23: 64 peers that never read used to starve every honest request)."""
REPLY_STALL_S = 10.0
"""A reply that makes no progress this long (its peer stopped reading) is abandoned."""
REQUESTS_PER_SERVICE = 1_000
"""Replay requests read in one :meth:`ChannelPublisher.service` call, so a flood of requests
cannot keep the publish loop from its own work."""


@dataclass
class ChannelStats:
    """What one publishing channel did.

    Attributes:
        endpoint: Where it published.
        replay_endpoint: Where it served replay requests, if anywhere.
        sent: Batches published.
        dropped: Batches kept out of the live stream on purpose (``drop``).
        replay_requests: Replay requests accepted.
        replayed: Batches handed to ZeroMQ in replay replies.
        replay_refused: Replay requests refused: the peer already had
            ``MAX_REPLAY_REQUESTS_PER_PEER`` waiting, or ``MAX_REPLAY_PEERS`` peers were
            being answered (none stalled: answered with the end marker alone), or the
            request was malformed.
        replay_abandoned: Replies given up part-way: the peer went away or stopped reading.
        replay_evicted: Peers evicted (their replies abandoned) to make room for another,
            stalled longest first.
        subscribers: Subscriptions currently counted.
        max_subscribers: The most subscriptions counted at any moment.
    """

    endpoint: str
    replay_endpoint: str | None
    sent: int = 0
    dropped: int = 0
    replay_requests: int = 0
    replayed: int = 0
    replay_refused: int = 0
    replay_abandoned: int = 0
    replay_evicted: int = 0
    subscribers: int = 0
    max_subscribers: int = 0


@dataclass
class _Reply:
    """One replay request being answered: a cursor over the buffer, not a copy of it.

    ``pos`` and ``end`` count batches ever appended to the buffer: what the buffer held
    when the request came is ``[pos, end)``; what it dropped meanwhile is skipped (gone, as
    for vLLM). So a reply in progress holds no payload the buffer has let go.
    """

    start: int
    pos: int
    end: int
    progress_at: float = field(default_factory=time.monotonic)
    blocked_at: float | None = None  # when its peer's queue was last found full


class ChannelPublisher:
    """One publisher: an XPUB socket with vLLM's framing and an optional replay ROUTER.

    A replay reply is streamed: the ROUTER queues at most ``replay_sndhwm`` messages per
    peer (ROUTER_MANDATORY makes a full queue visible instead of silently dropping), and
    each :meth:`service` call sends what the peer has made room for. A peer may have
    ``MAX_REPLAY_REQUESTS_PER_PEER`` requests waiting; more are refused and counted, so
    a peer that asks and never reads costs a bounded amount of memory.

    Args:
        context: The ZeroMQ context.
        endpoint: Where to bind the publishing socket (a publisher always binds here, as
            vLLM does for wildcard and local addresses).
        replay_endpoint: Where to bind the replay ROUTER, or None.
        legacy_replay: Reply ``[b"", seq, payload]`` (vLLM < 0.26) instead of
            ``[b"", topic, seq, payload]``.
        buffer_steps: Batches kept for replay.
        sndhwm: Send high-water mark of the publishing socket.
        connect: Connect the publishing socket to ``endpoint`` (a subscriber that binds)
            instead of binding it.
        replay_sndhwm: Reply messages queued per replay peer.

    Raises:
        EndpointError: A socket cannot be bound.
    """

    def __init__(
        self,
        context: zmq.Context[zmq.Socket[bytes]],
        endpoint: str,
        replay_endpoint: str | None = None,
        *,
        legacy_replay: bool = False,
        buffer_steps: int = DEFAULT_BUFFER_STEPS,
        sndhwm: int = DEFAULT_SNDHWM,
        connect: bool = False,
        replay_sndhwm: int = REPLAY_SNDHWM,
    ) -> None:
        self.stats = ChannelStats(endpoint, replay_endpoint)
        self.legacy_replay = legacy_replay
        self.buffer: collections.deque[tuple[int, bytes, bytes]] = collections.deque()
        self.buffer_steps = max(1, buffer_steps)
        self.buffer_bytes = 0
        self.max_buffer_bytes = REPLAY_BUFFER_BYTES
        self._appended = 0  # batches ever appended to the buffer (cursors count these)
        self._replies: dict[bytes, collections.deque[_Reply]] = {}
        self.pub: zmq.Socket[bytes] = context.socket(zmq.XPUB)
        self.router: zmq.Socket[bytes] | None = None
        self.poller = zmq.Poller()
        try:
            self.pub.setsockopt(zmq.LINGER, 0)
            self.pub.setsockopt(zmq.SNDHWM, sndhwm)
            self.pub.setsockopt(zmq.XPUB_VERBOSE, 1)
            self.pub.setsockopt(zmq.XPUB_VERBOSER, 1)
            if connect:
                # A subscriber that binds (e.g. a KV-cache indexer): connect to it, as
                # vLLM's publisher does for a non-wildcard address.
                try:
                    self.pub.connect(endpoint)
                except zmq.ZMQError as err:
                    raise EndpointError(
                        f"{printable(endpoint)}: cannot connect (--publish --connect): "
                        f"{err.strerror}"
                    ) from err
            else:
                _bind(self.pub, endpoint, "--publish")
                self.stats.endpoint = _last_endpoint(self.pub, endpoint)
            self.poller.register(self.pub, zmq.POLLIN)
            if replay_endpoint is not None:
                self.router = context.socket(zmq.ROUTER)
                self.router.setsockopt(zmq.LINGER, 0)
                self.router.setsockopt(zmq.SNDHWM, max(1, replay_sndhwm))
                # A full peer queue raises EAGAIN (and a gone peer EHOSTUNREACH) instead of
                # ZeroMQ dropping the reply silently: the reply waits for the peer instead.
                self.router.setsockopt(zmq.ROUTER_MANDATORY, 1)
                _bind(self.router, replay_endpoint, "--replay-endpoint")
                self.stats.replay_endpoint = _last_endpoint(self.router, replay_endpoint)
                self.poller.register(self.router, zmq.POLLIN)
        except BaseException:
            self.close(linger_ms=0)
            raise
        # The backend's send, without the sugar layer's per-call work (flag enums,
        # routing-id checks): the publish loop is bound by per-frame overhead.
        self._raw_send: Callable[..., object] = zmq.backend.Socket.send

    def send(self, topic: bytes, seq: int, payload: bytes, *, live: bool = True) -> None:
        """Publish one batch and keep it for replay.

        Args:
            topic: The ZeroMQ topic frame.
            seq: The sequence number (sent as 8 bytes big-endian).
            payload: The msgpack payload.
            live: False keeps the batch out of the live stream (it is only in the replay
                buffer), to exercise a subscriber's gap recovery.
        """
        if live:
            send = self._raw_send
            pub = self.pub
            send(pub, topic, _SNDMORE, True, False)
            send(pub, seq.to_bytes(8, "big"), _SNDMORE, True, False)
            send(pub, payload, 0, len(payload) < _COPY_THRESHOLD, False)
            self.stats.sent += 1
        else:
            self.stats.dropped += 1
        if self.router is None:
            return  # no replay endpoint: no buffer (issue 23)
        buf = self.buffer
        buf.append((seq, topic, payload))
        self._appended += 1
        self.buffer_bytes += len(payload)
        while len(buf) > self.buffer_steps or (
            self.buffer_bytes > self.max_buffer_bytes and len(buf) > 1
        ):
            self.buffer_bytes -= len(buf.popleft()[2])

    def restart(self) -> None:
        """Forget the replay buffer, as a restarted publisher does (seq goes back)."""
        self.buffer.clear()
        self.buffer_bytes = 0

    @property
    def replies_pending(self) -> int:
        """Replay requests accepted and not yet fully answered."""
        return sum(len(q) for q in self._replies.values())

    def service(self, timeout_ms: int = 0) -> None:
        """Answer waiting replay requests and count subscriptions, waiting up to a timeout.

        Args:
            timeout_ms: How long to wait for something to arrive (0: just look).
        """
        if self._replies and timeout_ms > 10:
            # A reply in progress continues as its peer reads: look again soon.
            timeout_ms = 10
        events = dict(self.poller.poll(timeout_ms))
        if self.pub in events:
            self._subscriptions()
        if self.router is not None:
            if self.router in events:
                self._requests()
            if self._replies:
                self._pump()

    def _subscriptions(self) -> None:
        while True:
            try:
                msg = self.pub.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            if msg[:1] == b"\x01":
                self.stats.subscribers += 1
                self.stats.max_subscribers = max(self.stats.max_subscribers, self.stats.subscribers)
            elif msg[:1] == b"\x00":
                self.stats.subscribers = max(0, self.stats.subscribers - 1)

    def _requests(self) -> None:
        assert self.router is not None
        for _ in range(REQUESTS_PER_SERVICE):
            try:
                frames = self.router.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            # vLLM: [client_id, b"", start_seq]; tolerate a missing delimiter.
            if len(frames) == 3 and frames[1] == b"":
                client, start_b = frames[0], frames[2]
            elif len(frames) == 2:
                client, start_b = frames
            else:
                self.stats.replay_refused += 1
                continue
            if len(start_b) < 8:
                self.stats.replay_refused += 1
                continue
            queue = self._replies.get(client)
            if queue is None:
                if len(self._replies) >= MAX_REPLAY_PEERS and not self._evict_stalled():
                    # Every slot is busy with a peer that reads: still an answer, the end
                    # marker, so the request is not left to time out.
                    self.stats.replay_refused += 1
                    self._send_end(client)
                    continue
                queue = self._replies[client] = collections.deque()
            if len(queue) >= MAX_REPLAY_REQUESTS_PER_PEER:
                self.stats.replay_refused += 1
                continue
            start = int.from_bytes(start_b[:8], "big")
            self.stats.replay_requests += 1
            # What the buffer holds now is the answer, as vLLM's reply is.
            queue.append(_Reply(start, self._appended - len(self.buffer), self._appended))

    def _evict_stalled(self) -> bool:
        """Abandon the replies of the peer whose queue has been full longest; True if any."""
        stalled = [
            (q[0].blocked_at, client)
            for client, q in self._replies.items()
            if q and q[0].blocked_at is not None
        ]
        if not stalled:
            return False
        _, client = min(stalled)
        self.stats.replay_abandoned += len(self._replies.pop(client))
        self.stats.replay_evicted += 1
        return True

    def _send_end(self, client: bytes) -> None:
        assert self.router is not None
        end: tuple[bytes, ...] = (client, b"", END_SEQ, b"")
        if not self.legacy_replay:
            end = (client, b"", b"", END_SEQ, b"")
        with contextlib.suppress(zmq.ZMQError):
            self.router.send_multipart(end, zmq.NOBLOCK)

    def _pump(self) -> None:
        """Send each peer as much of its replies as its queue has room for."""
        assert self.router is not None
        send = self.router.send_multipart
        now = time.monotonic()
        buf = self.buffer
        for client in list(self._replies):
            queue = self._replies[client]
            try:
                while queue:
                    reply = queue[0]
                    base = self._appended - len(buf)
                    reply.pos = max(reply.pos, base)  # what the buffer dropped is gone
                    while reply.pos < reply.end:
                        seq, topic, payload = buf[reply.pos - base]
                        if seq >= reply.start:
                            copy = len(payload) < _COPY_THRESHOLD
                            seq_b = seq.to_bytes(8, "big")
                            if self.legacy_replay:
                                msg: tuple[bytes, ...] = (client, b"", seq_b, payload)
                            else:
                                msg = (client, b"", topic, seq_b, payload)
                            send(msg, zmq.NOBLOCK, copy=copy)
                            self.stats.replayed += 1
                        reply.pos += 1
                        reply.progress_at = now
                        reply.blocked_at = None
                    if self.legacy_replay:
                        send((client, b"", END_SEQ, b""), zmq.NOBLOCK)
                    else:
                        send((client, b"", b"", END_SEQ, b""), zmq.NOBLOCK)
                    queue.popleft()
            except zmq.Again:
                # The peer's queue is full: go on when it has read some, unless it stalled.
                if queue and queue[0].blocked_at is None:
                    queue[0].blocked_at = now
                if queue and now - queue[0].progress_at > REPLY_STALL_S:
                    self.stats.replay_abandoned += len(queue)
                    queue.clear()
            except zmq.ZMQError:
                # EHOSTUNREACH: the peer went away; nobody is left to answer.
                self.stats.replay_abandoned += len(queue)
                queue.clear()
            if not queue:
                del self._replies[client]

    def close(self, linger_ms: int = 0) -> None:
        """Close the sockets; ``linger_ms`` lets queued batches leave first.

        Args:
            linger_ms: How long the publishing socket may flush its queue.
        """
        if not self.pub.closed:
            self.pub.close(linger=linger_ms)
        if self.router is not None and not self.router.closed:
            self.router.close(linger=0)
        self._replies.clear()


def _bind(sock: zmq.Socket[bytes], endpoint: str, option: str) -> None:
    try:
        sock.bind(endpoint)
    except zmq.ZMQError as err:
        raise EndpointError(
            f"{printable(endpoint)}: cannot bind ({option}): {err.strerror}; pick another port "
            "or stop what is using it"
        ) from err


def _last_endpoint(sock: zmq.Socket[bytes], fallback: str) -> str:
    try:
        ep = sock.getsockopt(zmq.LAST_ENDPOINT)
    except zmq.ZMQError:
        return fallback
    return ep.decode() if isinstance(ep, bytes) and ep else fallback


class Publisher:
    """All publishing channels of one replay; use as a context manager.

    The first channel publishes on ``endpoint``; further channels (several engines or
    ranks in one recording) on the next ports (``_dp{n}`` for ipc/inproc), as vLLM
    offsets data-parallel ranks. Sockets are bound when a channel first appears.

    Args:
        endpoint: The base publishing endpoint (see :func:`parse_endpoint`).
        replay_endpoint: The base replay endpoint, or None.
        legacy_replay: Use the pre-0.26 replay reply layout.
        buffer_steps: Batches kept for replay per channel.
        sndhwm: Send high-water mark.
        linger_ms: How long closing may take to flush queued batches.
        connect: Connect the publishing sockets instead of binding them.
        replay_sndhwm: Reply messages queued per replay peer (see :class:`ChannelPublisher`).
    """

    def __init__(
        self,
        endpoint: str,
        replay_endpoint: str | None = None,
        *,
        legacy_replay: bool = False,
        buffer_steps: int = DEFAULT_BUFFER_STEPS,
        sndhwm: int = DEFAULT_SNDHWM,
        linger_ms: int = 1000,
        connect: bool = False,
        replay_sndhwm: int = REPLAY_SNDHWM,
    ) -> None:
        if buffer_steps < 1:
            raise UsageError(f"--buffer-steps {buffer_steps}: must be at least 1")
        self.endpoint = endpoint
        self.replay_endpoint = replay_endpoint
        self.legacy_replay = legacy_replay
        self.buffer_steps = buffer_steps
        self.sndhwm = sndhwm
        self.linger_ms = linger_ms
        self.connect = connect
        self.replay_sndhwm = replay_sndhwm
        self.context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.channels: dict[object, ChannelPublisher] = {}
        self._order: list[ChannelPublisher] = []
        # The first channel binds now, so a bad endpoint fails before anything is read
        # and a subscriber can connect (and be waited for) before the first batch.
        try:
            self.first: ChannelPublisher = self._new(0)
        except BaseException:
            # A signal can land between a socket's creation and its owner's bookkeeping:
            # destroy closes what is still open (term alone would wait for it forever).
            self.context.destroy(linger=0)
            raise
        self._first_free = True

    def _new(self, n: int) -> ChannelPublisher:
        try:
            endpoint = offset_endpoint(self.endpoint, n)
            replay = offset_endpoint(self.replay_endpoint, n) if self.replay_endpoint else None
        except EndpointError as err:
            if self.endpoint.startswith("tcp://"):
                raise
            raise EndpointError(
                f"{printable(self.endpoint)}: the input has more than one channel and channel "
                f"{n + 1} publishes where data-parallel rank {n} would, but vLLM gives ipc "
                "endpoints no rank offset; publish on tcp:// (port + rank) or inproc://, or "
                "select one channel with --channel"
            ) from err
        pub = ChannelPublisher(
            self.context,
            endpoint,
            replay,
            legacy_replay=self.legacy_replay,
            buffer_steps=self.buffer_steps,
            sndhwm=self.sndhwm,
            connect=self.connect,
            replay_sndhwm=self.replay_sndhwm,
        )
        self._order.append(pub)
        return pub

    def __enter__(self) -> Publisher:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close(flush=exc_type is None)

    def channel(self, key: object) -> ChannelPublisher:
        """Return (binding it on first use) the publisher of one recorded channel.

        Args:
            key: Identifies the recorded channel.

        Returns:
            Its publisher.

        Raises:
            EndpointError: The sockets cannot be bound.
        """
        pub = self.channels.get(key)
        if pub is None:
            if self._first_free:
                pub = self.first
                self._first_free = False
            else:
                pub = self._new(len(self._order))
            self.channels[key] = pub
        return pub

    @property
    def stats(self) -> list[ChannelStats]:
        """Per-channel statistics, in the order the channels appeared."""
        return [p.stats for p in self._order]

    def service(self, timeout_ms: int = 0) -> None:
        """Serve replay requests and subscriptions on every channel.

        Args:
            timeout_ms: How long to wait in total (split over the channels).
        """
        if not self._order:
            if timeout_ms > 0:
                time.sleep(timeout_ms / 1000)
            return
        per = timeout_ms // len(self._order) if timeout_ms > 0 else 0
        for p in self._order:
            p.service(per)

    def idle(self, seconds: float) -> None:
        """Wait, serving replay requests and subscriptions meanwhile.

        Args:
            seconds: How long.
        """
        deadline = time.monotonic() + seconds
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self.service(max(1, min(100, int(left * 1000))))

    def wait_subscribers(
        self,
        channel: ChannelPublisher,
        count: int,
        timeout_s: float | None,
        on_wait: Callable[[int], None] | None = None,
    ) -> None:
        """Block until ``count`` subscriptions reached a channel (slow-joiner guard).

        Args:
            channel: The channel publisher.
            count: Subscriptions to wait for.
            timeout_s: Give up after this long (None: wait forever).
            on_wait: Called with the current count about once a second.

        Raises:
            EndpointError: The timeout passed first.
        """
        start = time.monotonic()
        last_report = 0.0
        while channel.stats.subscribers < count:
            now = time.monotonic()
            if timeout_s is not None and now - start >= timeout_s:
                raise EndpointError(
                    f"{printable(channel.stats.endpoint)}: {channel.stats.subscribers} of "
                    f"{plural(count, 'subscriber')} after {timeout_s:g}s; is the subscriber "
                    "connecting to this endpoint? (raise --wait-timeout or drop --wait-subscribers)"
                )
            if on_wait is not None and now - last_report >= 1.0:
                on_wait(channel.stats.subscribers)
                last_report = now
            self.service(100)

    def close(self, *, flush: bool = True) -> None:
        """Close every socket and the context.

        Args:
            flush: Let queued batches leave (up to ``linger_ms``) before closing.
        """
        for p in self._order:
            p.close(self.linger_ms if flush else 0)
        # Any socket not in _order (a signal between its creation and _order.append) is
        # closed here too; term alone would wait for it forever.
        self.context.destroy(linger=0)


__all__ = [
    "DEFAULT_BUFFER_STEPS",
    "END_SEQ",
    "ChannelPublisher",
    "ChannelStats",
    "Publisher",
]
