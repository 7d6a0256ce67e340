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
import re
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from types import TracebackType

import msgspec
import zmq

from kvtool.annotate import ChannelRule, GroupTable, KindWindow, annotation_for
from kvtool.errors import EndpointError, UsageError
from kvtool.protocol import STORED_ARRAY_INDEX

END_SEQ = (-1).to_bytes(8, "big", signed=True)
"""The replay end marker: seq -1 as 8-byte signed big-endian."""

DEFAULT_HOST = "127.0.0.1"
DEFAULT_SNDHWM = 100_000
"""vLLM's default ``hwm`` for its PUB socket."""
DEFAULT_BUFFER_STEPS = 10_000
_SNDMORE = int(zmq.SNDMORE)
_COPY_THRESHOLD = 65_536  # larger payloads are sent zero-copy
"""vLLM's default ``buffer_steps``: batches the replay socket can serve."""

_PORT = re.compile(r"^\s*:?(\d{1,5}|\*)\s*$")
_HOSTPORT = re.compile(r"^\s*([A-Za-z0-9.\-_*]+|\[[0-9A-Fa-f:.]+\]):(\d{1,5}|\*)\s*$")


def parse_endpoint(text: str, *, option: str = "--publish") -> str:
    """Turn a ``--publish`` value into a ZeroMQ endpoint; a bare port binds 127.0.0.1.

    Args:
        text: ``5557``, ``:5557``, ``host:5557`` or a full ``tcp://``/``ipc://``/
            ``inproc://`` endpoint; the port ``*`` asks the OS for a free one.
        option: The option name, for the error message.

    Returns:
        The endpoint, e.g. ``tcp://127.0.0.1:5557``.

    Raises:
        EndpointError: Not an endpoint, or a port outside 1..65535.
    """
    t = text.strip()
    m = _PORT.match(t)
    host: str | None = None
    port: str | None = None
    if m:
        host, port = DEFAULT_HOST, m.group(1)
    elif t.startswith(("ipc://", "inproc://")):
        if len(t.split("://", 1)[1]) == 0:
            raise EndpointError(f"{option} {text!r}: the endpoint has no path")
        return t
    elif t.startswith("tcp://"):
        hm = _HOSTPORT.match(t[len("tcp://") :])
        if not hm:
            raise EndpointError(
                f"{option} {text!r}: expected tcp://HOST:PORT (e.g. tcp://127.0.0.1:5557)"
            )
        host, port = hm.group(1), hm.group(2)
    else:
        hm = _HOSTPORT.match(t)
        if not hm:
            raise EndpointError(
                f"{option} {text!r}: expected a port (5557), HOST:PORT or a ZeroMQ endpoint "
                "(tcp://127.0.0.1:5557, ipc:///tmp/kv)"
            )
        host, port = hm.group(1), hm.group(2)
    if port == "*":
        return f"tcp://{host}:*"
    if not 1 <= int(port) <= 65535:
        raise EndpointError(f"{option} {text!r}: port {port} is outside 1..65535")
    return f"tcp://{host}:{int(port)}"


def offset_endpoint(endpoint: str, offset: int) -> str:
    """Return the endpoint for the ``offset``-th channel, as vLLM offsets data-parallel ranks.

    Args:
        endpoint: The base endpoint.
        offset: 0 for the first channel.

    Returns:
        ``tcp`` endpoints get port + offset; ``ipc``/``inproc`` get a ``_dp{offset}`` suffix.

    Raises:
        EndpointError: The offset port would exceed 65535.
    """
    if offset == 0:
        return endpoint
    if endpoint.startswith("tcp://"):
        head, _, port = endpoint.rpartition(":")
        if port == "*":
            return endpoint
        p = int(port) + offset
        if p > 65535:
            raise EndpointError(f"{endpoint}: port + {offset} exceeds 65535")
        return f"{head}:{p}"
    return f"{endpoint}_dp{offset}"


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
            str(ev.get("type")), ev.get("group_idx"), rule,
            ev.get("kv_cache_spec_kind"), ev.get("kv_cache_spec_sliding_window"),
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


def annotate_payload(
    payload: bytes, table: GroupTable | ChannelRule
) -> tuple[bytes, list[int]]:
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


@dataclass
class ChannelStats:
    """What one publishing channel did.

    Attributes:
        endpoint: Where it published.
        replay_endpoint: Where it served replay requests, if anywhere.
        sent: Batches published.
        dropped: Batches kept out of the live stream on purpose (``drop``).
        replay_requests: Replay requests answered.
        replayed: Batches sent in replay replies.
        subscribers: Subscriptions currently counted.
    """

    endpoint: str
    replay_endpoint: str | None
    sent: int = 0
    dropped: int = 0
    replay_requests: int = 0
    replayed: int = 0
    subscribers: int = 0


class ChannelPublisher:
    """One publisher: an XPUB socket with vLLM's framing and an optional replay ROUTER.

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
    ) -> None:
        self.stats = ChannelStats(endpoint, replay_endpoint)
        self.legacy_replay = legacy_replay
        self.buffer: collections.deque[tuple[int, bytes, bytes]] = collections.deque(
            maxlen=max(1, buffer_steps)
        )
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
                        f"{endpoint}: cannot connect (--publish --connect): {err.strerror}"
                    ) from err
            else:
                _bind(self.pub, endpoint, "--publish")
                self.stats.endpoint = _last_endpoint(self.pub, endpoint)
            self.poller.register(self.pub, zmq.POLLIN)
            if replay_endpoint is not None:
                self.router = context.socket(zmq.ROUTER)
                self.router.setsockopt(zmq.LINGER, 0)
                self.router.setsockopt(zmq.SNDHWM, 0)  # a reply may be the whole buffer
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
        self.buffer.append((seq, topic, payload))

    def restart(self) -> None:
        """Forget the replay buffer, as a restarted publisher does (seq goes back)."""
        self.buffer.clear()

    def service(self, timeout_ms: int = 0) -> None:
        """Answer waiting replay requests and count subscriptions, waiting up to a timeout.

        Args:
            timeout_ms: How long to wait for something to arrive (0: just look).
        """
        events = dict(self.poller.poll(timeout_ms))
        if self.pub in events:
            self._subscriptions()
        if self.router is not None and self.router in events:
            self._replay()

    def _subscriptions(self) -> None:
        while True:
            try:
                msg = self.pub.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            if msg[:1] == b"\x01":
                self.stats.subscribers += 1
            elif msg[:1] == b"\x00":
                self.stats.subscribers = max(0, self.stats.subscribers - 1)

    def _replay(self) -> None:
        assert self.router is not None
        while True:
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
                continue
            if len(start_b) < 8:
                continue
            start = int.from_bytes(start_b[:8], "big")
            self.stats.replay_requests += 1
            send = self.router.send_multipart
            for seq, topic, payload in list(self.buffer):
                if seq >= start:
                    if self.legacy_replay:
                        send((client, b"", seq.to_bytes(8, "big"), payload))
                    else:
                        send((client, b"", topic, seq.to_bytes(8, "big"), payload))
                    self.stats.replayed += 1
            if self.legacy_replay:
                send((client, b"", END_SEQ, b""))
            else:
                send((client, b"", b"", END_SEQ, b""))

    def close(self, linger_ms: int = 0) -> None:
        """Close the sockets; ``linger_ms`` lets queued batches leave first.

        Args:
            linger_ms: How long the publishing socket may flush its queue.
        """
        if not self.pub.closed:
            self.pub.close(linger=linger_ms)
        if self.router is not None and not self.router.closed:
            self.router.close(linger=0)


def _bind(sock: zmq.Socket[bytes], endpoint: str, option: str) -> None:
    try:
        sock.bind(endpoint)
    except zmq.ZMQError as err:
        raise EndpointError(
            f"{endpoint}: cannot bind ({option}): {err.strerror}; pick another port or stop "
            "what is using it"
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
        pub = ChannelPublisher(
            self.context,
            offset_endpoint(self.endpoint, n),
            offset_endpoint(self.replay_endpoint, n) if self.replay_endpoint else None,
            legacy_replay=self.legacy_replay,
            buffer_steps=self.buffer_steps,
            sndhwm=self.sndhwm,
            connect=self.connect,
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
                    f"{channel.stats.endpoint}: {channel.stats.subscribers} of {count} "
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
        if self.speed <= 0:
            raise UsageError(f"--speed {self.speed:g}: must be greater than 0")
        if self.rate is not None and self.rate <= 0:
            raise UsageError(f"--rate {self.rate:g}: must be greater than 0")


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
        on_sent: Progress callback, called about every 1000 batches and at the end.
        on_wait: Called while waiting for subscribers.
        drop: Seqs (as sent) kept out of the live stream but put in the replay buffer,
            so a subscriber has to recover them (vLLM's PUB drops under load likewise).

    Returns:
        What was published.
    """
    stats = PublishStats()
    next_seq: dict[object, int] = {}
    if wait_subscribers > 0:
        publisher.wait_subscribers(publisher.first, wait_subscribers, wait_timeout_s, on_wait)
    if start_delay_s > 0:
        publisher.idle(start_delay_s)
    first = True
    t0 = time.monotonic()
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
                        base_log = item.log_time
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
            if on_sent is not None and stats.sent % 1000 == 0:
                stats.seconds = time.monotonic() - t0
                on_sent(stats)
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


__all__ = [
    "DEFAULT_BUFFER_STEPS",
    "END_SEQ",
    "ChannelPublisher",
    "ChannelStats",
    "Pacing",
    "PublishItem",
    "PublishStats",
    "Publisher",
    "annotate_payload",
    "offset_endpoint",
    "parse_endpoint",
    "publish",
]
