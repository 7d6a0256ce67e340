"""Pacing a recording onto the wire: the publish loop around :class:`kvtool.publish.Publisher`.

:func:`publish` sends batches at their recorded pace (or a rate), keeps the replay
buffer serviced between sends and says its progress; :func:`publish_recording` is
``replay --publish``: the recording's batches, optionally annotated on the wire
(:func:`kvtool.wire.annotate_payload`). The sockets themselves are in
:mod:`kvtool.publish`.
"""

from __future__ import annotations

import collections
import itertools
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kvtool.errors import UsageError
from kvtool.publish import (
    DEFAULT_BUFFER_STEPS,
    REPLAY_QUEUE_BYTES,
    REPLAY_SNDHWM,
    ChannelStats,
    Publisher,
    sndhwm_for,
)
from kvtool.wire import annotate_payload

if TYPE_CHECKING:
    from kvtool.replay import ReplayBatch

PEEK_BATCHES = 16
"""Batches read ahead to size the queues (their largest payload)."""
_REPORT_EVERY_S = 0.25
"""How often :func:`publish` calls its progress callback while sending."""

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
    "Pacing",
    "PublishItem",
    "PublishResult",
    "PublishStats",
    "publish",
    "publish_recording",
]
