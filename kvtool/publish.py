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
import itertools
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING

import msgspec
import zmq

from kvtool.annotate import ChannelRule, GroupTable, KindWindow, annotation_for
from kvtool.endpoints import offset_endpoint
from kvtool.errors import EndpointError, UsageError
from kvtool.protocol import STORED_ARRAY_INDEX
from kvtool.text import printable

if TYPE_CHECKING:
    from kvtool.replay import ReplayBatch

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
PEEK_BATCHES = 16
"""Batches read ahead to size the queues (their largest payload)."""
_SNDMORE = int(zmq.SNDMORE)
_COPY_THRESHOLD = 65_536  # larger payloads are sent zero-copy
_REPORT_EVERY_S = 0.25
"""How often :func:`publish` calls its progress callback while sending."""


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


# -- annotation on the wire -----------------------------------------------------------

_ANY = msgspec.msgpack.Decoder()
_ENC = msgspec.msgpack.Encoder()
_KIND_I = STORED_ARRAY_INDEX["kv_cache_spec_kind"]
_WINDOW_I = STORED_ARRAY_INDEX["kv_cache_spec_sliding_window"]
_GROUP_I = STORED_ARRAY_INDEX["group_idx"]
_LAST_ARRAY_LEN = _WINDOW_I + 1  # 12: tag + 11 fields, the last array layout
# Field order of a map-encoded BlockStored (msgspec writes the tag first, then fields in
# declaration order, omitting defaulted ones): keeps re-encoded maps in vLLM's order.
_MAP_ORDER = {
    name: i
    for i, name in enumerate(
        [
            "type",
            "block_hashes",
            "parent_block_hash",
            "token_ids",
            "block_size",
            "lora_id",
            "medium",
            "lora_name",
            "extra_keys",
            "group_idx",
            "kv_cache_spec_kind",
            "kv_cache_spec_sliding_window",
            "locality",
            "ownership",
            "session_id",
            "lookahead_token_ids",
        ]
    )
}


def _patch_map(ev: dict[object, object], info: KindWindow) -> bool:
    kind, window = info
    if (
        ev.get("kv_cache_spec_kind") == kind
        and ev.get("kv_cache_spec_sliding_window") == window
        and ("kv_cache_spec_sliding_window" in ev) == (window is not None)
    ):
        return False
    ev["kv_cache_spec_kind"] = kind
    if window is None:
        # vLLM omits defaulted fields in map events (omit_defaults=True).
        ev.pop("kv_cache_spec_sliding_window", None)
    else:
        ev["kv_cache_spec_sliding_window"] = window
    items = sorted(
        ev.items(),
        key=lambda kv: _MAP_ORDER.get(kv[0], len(_MAP_ORDER)),  # type: ignore[call-overload]
    )
    ev.clear()
    ev.update(items)
    return True


def _patch_array(ev: list[object], info: KindWindow) -> bool:
    kind, window = info
    if len(ev) > _WINDOW_I and ev[_KIND_I] == kind and ev[_WINDOW_I] == window:
        return False
    if len(ev) < _LAST_ARRAY_LEN:
        ev.extend([None] * (_LAST_ARRAY_LEN - len(ev)))
    ev[_KIND_I] = kind
    ev[_WINDOW_I] = window
    return True


_TOP = msgspec.msgpack.Decoder(list[msgspec.Raw] | dict[str, msgspec.Raw])
_RAW_LIST = msgspec.msgpack.Decoder(list[msgspec.Raw])


def _encode_map(ev: dict[object, object], map16: bool) -> bytes:
    # msgspec writes a Struct with omit_defaults under a map16 header whatever its size;
    # keep the header style the event was recorded with so the bytes stay vLLM's.
    if not map16:
        return _ENC.encode(ev)
    n = len(ev)
    parts = [b"\xde" + n.to_bytes(2, "big")]
    for k, v in ev.items():
        parts.append(_ENC.encode(k))
        parts.append(_ENC.encode(v))
    return b"".join(parts)


def _annotate_raw_event(
    raw: msgspec.Raw, rule: GroupTable | ChannelRule, bad: list[int]
) -> msgspec.Raw | None:
    """The wire adapter: patch one raw event by the rule; its new bytes, or None."""
    view = memoryview(raw)
    if not len(view):
        return None
    first = view[0]
    ev = _ANY.decode(raw)
    if isinstance(ev, dict):
        decision = annotation_for(
            str(ev.get("type")),
            ev.get("group_idx"),
            rule,
            ev.get("kv_cache_spec_kind"),
            ev.get("kv_cache_spec_sliding_window"),
        )
        if isinstance(decision, tuple):
            if _patch_map(ev, decision):
                return msgspec.Raw(_encode_map(ev, first == 0xDE))
        elif decision is not None:
            bad.append(decision)
    elif isinstance(ev, list) and ev:
        group = ev[_GROUP_I] if len(ev) > _GROUP_I else None
        kind = ev[_KIND_I] if len(ev) > _KIND_I else None
        window = ev[_WINDOW_I] if len(ev) > _WINDOW_I else None
        decision = annotation_for(str(ev[0]), group, rule, kind, window)
        if isinstance(decision, tuple):
            if _patch_array(ev, decision):
                return msgspec.Raw(_ENC.encode(ev))
        elif decision is not None:
            bad.append(decision)
    return None


def annotate_payload(payload: bytes, table: GroupTable | ChannelRule) -> tuple[bytes, list[int]]:
    """Annotate a payload on the wire, re-encoding it in the layout it was recorded in.

    Each ``BlockStored`` is patched by the same rule as :func:`kvtool.annotate.annotate`
    (:func:`kvtool.annotate.annotation_for`, or the :class:`kvtool.annotate.ChannelRule`
    a replay hands out per channel and rank). Only the events the rule changes are
    re-encoded (decoded generically, so every field, known or not, survives); every
    other byte is kept. Map events stay maps (kind and window keys in vLLM's field order,
    a None window omitted as vLLM does, the same map header), array events stay arrays
    (extended to the 12-element last array layout when shorter). A payload the rule does
    not change is returned as the same bytes.

    Args:
        payload: The recorded msgpack payload.
        table: The group metadata, or the rule of the payload's channel and rank.

    Returns:
        The payload to send, and the out-of-range group indices met (one per store).
    """
    try:
        top = _TOP.decode(payload)
        if isinstance(top, list):
            if len(top) < 2:
                return payload, []
            raw_events = top[1]
        else:
            raw_events = top.get("events")  # type: ignore[assignment]
            if raw_events is None:
                return payload, []
        events = _RAW_LIST.decode(raw_events)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return payload, []
    changed = False
    bad: list[int] = []
    for i, raw in enumerate(events):
        try:
            patched = _annotate_raw_event(raw, table, bad)
        except (msgspec.MsgspecError, TypeError, ValueError, RecursionError):
            # An event the generic codec cannot round-trip is sent as recorded.
            continue
        if patched is not None:
            events[i] = patched
            changed = True
    if not changed:
        return payload, bad
    new_events = msgspec.Raw(_ENC.encode(events))
    if isinstance(top, list):
        top[1] = new_events
        return _ENC.encode(top), bad
    top["events"] = new_events
    return _ENC.encode(top), bad


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
            self.context.term()
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
                    f"{printable(channel.stats.endpoint)}: {channel.stats.subscribers} of {count} "
                    f"subscriber(s) after {timeout_s:g}s; is the subscriber connecting to "
                    "this endpoint? (raise --wait-timeout or drop --wait-subscribers)"
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
        self.context.term()


# -- pacing and the publish loop ---------------------------------------------------------


MIN_SPEED = 1e-6
MAX_SPEED = 1e6
MAX_RATE = 1e9
"""The ``--speed`` and ``--rate`` accepted: beyond them the pacing arithmetic would
overflow (``--speed inf``, ``1e308``, ``1e-300`` raised OverflowError) or never send."""
MAX_PACE_GAP_NS = 10_000_000_000
"""Recorded receive times jumping further ahead than this are paced as this (a batch 30
years ahead no longer stalls the publisher)."""


@dataclass
class Pacing:
    """When to send each batch.

    Attributes:
        speed: Multiply the recorded pace by this (recorded gaps by default).
        rate: Send this many batches per second instead of the recorded pace.
        max_speed: Send as fast as possible.
    """

    speed: float = 1.0
    rate: float | None = None
    max_speed: bool = False

    def __post_init__(self) -> None:
        if not MIN_SPEED <= self.speed <= MAX_SPEED:  # inf, nan and 1e-300 too (issue 23)
            raise UsageError(
                f"--speed {self.speed:g}: must be between {MIN_SPEED:g} and {MAX_SPEED:g} "
                "(--max-speed sends as fast as possible)"
            )
        if self.rate is not None and not MIN_SPEED <= self.rate <= MAX_RATE:
            raise UsageError(
                f"--rate {self.rate:g}: must be between {MIN_SPEED:g} and {MAX_RATE:g} batches/s "
                "(--max-speed sends as fast as possible)"
            )


@dataclass
class PublishItem:
    """One batch to publish.

    Attributes:
        key: Identifies its recorded channel (one publisher per channel).
        topic: ZeroMQ topic.
        seq: Recorded seq.
        payload: The payload to send.
        log_time: Recorded receive time (ns), for pacing.
    """

    key: object
    topic: bytes
    seq: int
    payload: bytes
    log_time: int


@dataclass
class PublishStats:
    """Outcome of :func:`publish`.

    Attributes:
        sent: Batches published (all loops).
        loops: Loops completed.
        seconds: Wall time from the first to the last send.
        out_of_range: Out-of-range group indices met while annotating, with counts.
    """

    sent: int = 0
    loops: int = 0
    seconds: float = 0.0
    out_of_range: collections.Counter[int] = field(default_factory=collections.Counter)

    @property
    def rate(self) -> float:
        """Batches per second."""
        return self.sent / self.seconds if self.seconds > 0 else 0.0


def publish(
    publisher: Publisher,
    batches: Callable[[], Iterable[PublishItem]],
    *,
    pacing: Pacing,
    loops: int | None = 1,
    renumber: bool = False,
    wait_subscribers: int = 0,
    wait_timeout_s: float | None = None,
    start_delay_s: float = 0.0,
    hold_s: float = 0.0,
    on_sent: Callable[[PublishStats], None] | None = None,
    on_wait: Callable[[int], None] | None = None,
    drop: Collection[int] = (),
    stats: PublishStats | None = None,
) -> PublishStats:
    """Publish batches with vLLM's framing, paced, looped, serving replay meanwhile.

    Args:
        publisher: The open publisher.
        batches: Returns a fresh iterable of the batches for each loop.
        pacing: When to send.
        loops: How many times to play the batches; None loops forever.
        renumber: Send seqs 0, 1, 2 … per channel (continuing across loops) instead of
            the recorded ones.
        wait_subscribers: Before the first batch of the first channel, wait for this many
            subscriptions.
        wait_timeout_s: Give up waiting after this long.
        start_delay_s: Wait this long before the first batch.
        hold_s: After the last batch, keep serving replay requests this long.
        on_sent: Progress callback, called with the live counters once sending starts
            (after any wait), then about every :data:`_REPORT_EVERY_S` and at the end.
        on_wait: Called while waiting for subscribers.
        drop: Seqs (as sent) kept out of the live stream but put in the replay buffer,
            so a subscriber has to recover them (vLLM's PUB drops under load likewise).
        stats: Counters to fill in (a fresh :class:`PublishStats` when None).

    Returns:
        What was published.
    """
    if stats is None:
        stats = PublishStats()
    next_seq: dict[object, int] = {}
    if wait_subscribers > 0:
        publisher.wait_subscribers(publisher.first, wait_subscribers, wait_timeout_s, on_wait)
    if start_delay_s > 0:
        publisher.idle(start_delay_s)
    first = True
    t0 = time.monotonic()
    # The callback gets this very object, which counts on: an interrupt's "after N
    # batches" reads it, and the status leaves "waiting for subscribers" now (issue 24:
    # it was called every 1000 batches only, so a slow run said 0 and kept waiting).
    next_report = t0 + _REPORT_EVERY_S
    if on_sent is not None:
        on_sent(stats)
    loop = 0
    period = 1.0 / pacing.rate if pacing.rate else None
    inv_speed = 1.0 / pacing.speed
    channel = publisher.channel
    channels = publisher.channels
    service = publisher.service
    while loops is None or loop < loops:
        if loop > 0 and not renumber:
            for p in publisher.channels.values():
                p.restart()
        base_log: int | None = None
        prev_log = 0
        t_loop = time.monotonic()
        i = 0
        for item in batches():
            if first:
                t0 = t_loop = time.monotonic()
                first = False
            pub = channels.get(item.key)
            if pub is None:
                pub = channel(item.key)
            if not pacing.max_speed:
                if period is not None:
                    target = t_loop + i * period
                else:
                    if base_log is None:
                        base_log = prev_log = item.log_time
                    if item.log_time - prev_log > MAX_PACE_GAP_NS:
                        base_log += item.log_time - prev_log - MAX_PACE_GAP_NS  # clamp
                    prev_log = max(prev_log, item.log_time)
                    target = t_loop + (item.log_time - base_log) * 1e-9 * inv_speed
                while True:
                    left = target - time.monotonic()
                    if left <= 0.0005:
                        break
                    service(max(1, int(left * 1000)))
            elif i & 63 == 0:
                service(0)
            if renumber:
                seq = next_seq.get(item.key, 0)
                next_seq[item.key] = seq + 1
            else:
                seq = item.seq
            pub.send(item.topic, seq, item.payload, live=not drop or seq not in drop)
            stats.sent += 1
            i += 1
            if on_sent is not None and (stats.sent & 63 == 0 or not pacing.max_speed):
                now = time.monotonic()
                if now >= next_report:
                    stats.seconds = now - t0
                    on_sent(stats)
                    next_report = now + _REPORT_EVERY_S
        loop += 1
        stats.loops = loop
        if i == 0:
            break
    stats.seconds = time.monotonic() - t0 if not first else 0.0
    if on_sent is not None:
        on_sent(stats)
    if hold_s > 0:
        publisher.idle(hold_s)
    return stats


# -- publishing a recording ---------------------------------------------------------------


@dataclass
class PublishResult:
    """What :func:`publish_recording` did.

    Attributes:
        stats: Batches sent, loops, time, out-of-range group indices.
        channels: Per-channel statistics, in the order the channels appeared.
        endpoint: The first channel's publishing endpoint as bound (a ``*`` port resolved).
    """

    stats: PublishStats
    channels: list[ChannelStats]
    endpoint: str

    @property
    def max_subscribers(self) -> int:
        """The most subscriptions any channel counted during the run."""
        return max((c.max_subscribers for c in self.channels), default=0)

    @property
    def unheard(self) -> bool:
        """True when batches were sent and no subscriber was connected at any time."""
        return self.stats.sent > 0 and self.max_subscribers == 0


def publish_recording(
    source: Iterable[ReplayBatch],
    endpoint: str,
    replay_endpoint: str | None = None,
    *,
    pacing: Pacing | None = None,
    legacy_replay: bool = False,
    buffer_steps: int = DEFAULT_BUFFER_STEPS,
    connect: bool = False,
    loops: int | None = 1,
    renumber: bool = False,
    wait_subscribers: int = 0,
    wait_timeout_s: float | None = None,
    start_delay_s: float = 0.0,
    hold_s: float = 0.0,
    drop: Collection[int] = (),
    annotate: bool = False,
    on_start: Callable[[Publisher], None] | None = None,
    on_batch: Callable[[ReplayBatch, int], None] | None = None,
    on_sent: Callable[[PublishStats], None] | None = None,
    on_wait: Callable[[int], None] | None = None,
) -> PublishResult:
    """Re-publish recorded batches as vLLM's publisher sent them, one publisher per channel.

    The first recorded channel publishes on ``endpoint``, the n-th on the base endpoint's
    rank-n endpoint (:func:`kvtool.endpoints.offset_endpoint`). Payloads go out byte for
    byte, or annotated on the wire (:func:`annotate_payload`) when ``annotate`` is set and
    the batch has group metadata.

    Args:
        source: The selected batches, iterable once per loop (a :class:`kvtool.replay.Replay`).
        endpoint: The publishing endpoint (see :func:`kvtool.endpoints.parse_endpoint`).
        replay_endpoint: The replay ROUTER endpoint, or None.
        pacing: When to send (default: the recorded pace).
        legacy_replay: Use the pre-0.26 replay reply layout.
        buffer_steps: Batches kept for replay per channel.
        connect: Connect the publishing sockets instead of binding them.
        loops: How many times to play the recording; None loops forever.
        renumber: Send seqs 0, 1, 2 … per channel instead of the recorded ones.
        wait_subscribers: Before the first batch, wait for this many subscriptions.
        wait_timeout_s: Give up waiting after this long.
        start_delay_s: Wait this long before the first batch.
        hold_s: After the last batch, keep serving replay requests this long.
        drop: Seqs kept out of the live stream but put in the replay buffer.
        annotate: Annotate stores on the wire with each batch's group metadata.
        on_start: Called with the open publisher before anything is sent.
        on_batch: Called with each batch and the loop it is in (0 first), before it is sent.
        on_sent: Progress callback (see :func:`publish`).
        on_wait: Called while waiting for subscribers.

    Returns:
        What was published, per channel.

    Raises:
        EndpointError: A socket cannot be bound, or the wait for subscribers timed out.
        UsageError: A bad ``buffer_steps`` or pacing.
    """
    loop_no = [0]
    stats = PublishStats()
    # The first batches tell the batch size, so ZeroMQ's queues can be bounded in bytes
    # (issue 23): a subscriber or replay peer that never reads holds ~PUB_QUEUE_BYTES.
    first_it = iter(source)
    head = list(itertools.islice(first_it, PEEK_BATCHES))
    size = max((len(b.message.data) for b in head), default=0) or 16_384

    def items() -> Iterable[PublishItem]:
        n = loop_no[0]
        loop_no[0] += 1
        batches = itertools.chain(head, first_it) if n == 0 else source
        for item in batches:
            if on_batch is not None:
                on_batch(item, n)
            m = item.message
            payload = m.data
            if annotate and item.table is not None:
                payload, bad = annotate_payload(payload, item.table)
                stats.out_of_range.update(bad)
            yield PublishItem(m.channel.name, m.channel.topic.encode(), m.seq, payload, m.log_time)

    with Publisher(
        endpoint,
        replay_endpoint,
        legacy_replay=legacy_replay,
        buffer_steps=buffer_steps,
        connect=connect,
        sndhwm=sndhwm_for(size),
        replay_sndhwm=sndhwm_for(size, REPLAY_QUEUE_BYTES, REPLAY_SNDHWM),
    ) as pub:
        if on_start is not None:
            on_start(pub)
        publish(
            pub,
            items,
            pacing=pacing or Pacing(),
            loops=loops,
            renumber=renumber,
            wait_subscribers=wait_subscribers,
            wait_timeout_s=wait_timeout_s,
            start_delay_s=start_delay_s,
            hold_s=hold_s,
            on_sent=on_sent,
            on_wait=on_wait,
            drop=drop,
            stats=stats,
        )
        # Count the subscriptions that arrived after the last look, so "nobody listened"
        # is said only when nobody did.
        pub.service(0)
        return PublishResult(stats, pub.stats, pub.first.stats.endpoint)


__all__ = [
    "DEFAULT_BUFFER_STEPS",
    "END_SEQ",
    "ChannelPublisher",
    "ChannelStats",
    "Pacing",
    "PublishItem",
    "PublishResult",
    "PublishStats",
    "Publisher",
    "annotate_payload",
    "publish",
    "publish_recording",
]
