"""The recorder's first layer: its state and bounds, each batch written, the status counts.

:class:`RecorderWrites` holds what a :class:`kvtool.capture.recorder.Recorder` is
configured with and writes each batch the sequencer says (to the recording, the sink and
the status counts); :func:`build_ledger` builds the gap ledger written at close. The
recorder's bounds (:data:`STOP_GRACE_NS`, :data:`MEMORY_BOUND_BYTES` ...) are here.
"""

from __future__ import annotations

import collections
import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import zmq

from kvtool.annotate import StatusKinds, groups_from_list
from kvtool.capture import sequencer as _seqmod
from kvtool.capture.sequencer import (
    DEFAULT_QUIET_NS,
    DEFAULT_REPLAY_TIMEOUT_NS,
    MAX_REPLY_COUNT,
    Budget,
    CaptureStats,
    ChannelState,
    Sequencer,
    Write,
)
from kvtool.capture.stats import EvStat as _EvStat
from kvtool.capture.stats import event_count as _event_count
from kvtool.capture.stats import stat_events as _stat_events
from kvtool.endpoints import (
    Source,
)
from kvtool.errors import EndpointError
from kvtool.protocol import peek_ts
from kvtool.recording import RecordingWriter
from kvtool.recording.ledger import ChannelLedger, GapLedger, GapRecord, RestartRecord

END_SEQ = b"\xff" * 8
"""The replay end marker: seq -1 as 8-byte signed big-endian."""

# kvtool.capture.recorder reads these from its own namespace when it starts (tests change
# them there); the sequencer keeps them as its Limits.
REPLAY_DEADLINE_NS = _seqmod.REPLAY_DEADLINE_NS
"""Total time one replay request may take, its retries included (see the sequencer)."""
STOP_TAIL_QUIET_NS = 50_000_000
"""At stop, only channels quiet this long ask for a lost tail (a busy one has batches in flight)."""
STOP_GRACE_NS = 1_000_000_000
"""After a stop, outstanding replays get at most this long before what is held is written."""
STOP_WRITE_BUDGET_NS = 700_000_000
"""After a stop, writing the reserve gets this long; what is left then is in the ledger as lost."""
LOOP_STALL_NS = 200_000_000
"""A loop pass longer than this was busy elsewhere (writing, merging, catching up the status):
pending replay requests are not charged for it (their replies could not be read)."""
MAX_HELD_BYTES = 128 * 1024 * 1024
"""Live bytes held while one replay is outstanding; past this the replay is given up."""
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
"""ZeroMQ ``MAXMSGSIZE`` of every socket: a larger message drops the peer's connection."""
DEALER_RCVHWM = 20_000
"""Replies queued on a DEALER: twice vLLM's ``buffer_steps``, so a real replay never drops."""
MAX_CHANNELS_PER_SOURCE = 64
"""Topics (channels) accepted from one endpoint; messages on further topics are malformed."""
LEDGER_LIST_CAP = 2_000
"""Entries per ledger list (gaps, restarts, lost ranges); keeps the record far below 1 MiB."""
STATS_QUEUE_MAX = 2_000
STATS_QUEUE_BYTES = 32 * 1024 * 1024
"""Written batches waiting to be decoded for the per-kind status counts. They are decoded
only when no socket has anything to read (issue 23: the status never delays receiving);
past this queue a batch only has its events counted from its header (about 1 us instead
of 100-200 us for a 15 kB batch) and is ``unsampled``."""
STATS_SLICE_NS = 5_000_000
"""Decoding for the status runs in slices this long between two polls."""
STATS_STOP_NS = 200_000_000
"""At stop, decoding what is queued gets this long; the rest is counted from headers."""
MAX_REMEMBERED = 20_000
"""Replayed batches remembered per channel (by payload hash), to recognise a late live copy."""
MEMORY_BOUND_BYTES = 768 * 1024 * 1024
"""The stated bound on the recorder's own buffers: held (MAX_HELD_BYTES) + one request's
replies (MAX_REPLY_BYTES) + the reserve (about two requests' replies) + the status
decode queue (STATS_QUEUE_BYTES) + remembered hashes."""
RCVHWM = 5_000
"""Receive high-water mark. Deliberately well under vLLM's replay buffer (10,000 batches):
a recorder that falls behind must see a gap while the replay buffer still holds it; a
deep receive queue would only delay the gap past recovery."""
BURST = 500
"""Messages drained from one socket before the loop looks at its timers again."""
BURST_NS = 100_000_000
"""...or this long (ns), whichever comes first: 500 messages of 16 MiB take seconds to
write, and a stop or a deadline must not wait for them."""
MAX_LATE_REPLIES = MAX_REPLY_COUNT
"""Late replies (to requests given up on) filed per request; past this the socket is closed."""
SETTLE_STEP = 256
"""Reserve batches written at stop between two looks at the clock."""


# ------------------------------------------------------------------ internal state


@dataclass
class _Src:
    """One endpoint's sockets and its sequencer."""

    spec: Source
    index: int
    sub: zmq.Socket[bytes]
    sub_mon: zmq.Socket[bytes] | None
    seq: Sequencer
    dealer: zmq.Socket[bytes] | None = None
    channel_ids: dict[bytes, int] = field(default_factory=dict)
    connected: bool = False
    received: int = 0


# ------------------------------------------------------------------------ recorder

Sink = Callable[[tuple[str, str, "int | None"], int, bytes, int], None]
"""A batch as written: ((endpoint, topic, dp_rank), seq, payload, log_time_ns)."""


class _NullWriter:
    """Stands in for the :class:`RecordingWriter` when ``path`` is None (write no file)."""

    def __init__(self) -> None:
        self.messages_written = 0
        self._channels = 0

    def add_channel(self, endpoint: str, topic: str, dp_rank: int | None) -> int:
        self._channels += 1
        return self._channels

    def write(self, channel_id: int, seq: int, payload: bytes, t: int, pub: int) -> None:
        self.messages_written += 1

    def add_groups(self, groups: object, source: str) -> None:
        pass

    def add_metadata(self, name: str, values: dict[str, object]) -> None:
        pass

    def maybe_flush(self) -> None:
        pass

    def close(self, *, ledger: dict[str, object] | None = None) -> None:
        pass

    def discard_if_empty(self) -> bool:
        return False


_Role = tuple[str, _Src]


class RecorderWrites:
    """The state, bounds and writes of a :class:`~kvtool.capture.recorder.Recorder` (its base).

    The first of its three layers (each calls only the ones below it); the arguments are
    the recorder's, documented once, on :class:`~kvtool.capture.recorder.Recorder`.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None,
        sources: Sequence[Source],
        *,
        topic: str = "",
        bind: bool = False,
        history: bool = False,
        duration_ns: int | None = None,
        max_batches: int | None = None,
        connect_timeout_ns: int | None = None,
        replay_timeout_ns: int = DEFAULT_REPLAY_TIMEOUT_NS,
        quiet_ns: int = DEFAULT_QUIET_NS,
        groups: list[dict[str, object]] | None = None,
        groups_source: str = "",
        force: bool = False,
        status: Callable[[CaptureStats], None] | None = None,
        status_interval_ns: int = 250_000_000,
        context: zmq.Context[zmq.Socket[bytes]] | None = None,
        rcvhwm: int = RCVHWM,
        writer_options: dict[str, object] | None = None,
        extra_context: dict[str, object] | None = None,
        sink: Sink | None = None,
        status_decode: bool = True,
        metadata: Sequence[tuple[str, dict[str, object]]] = (),
    ) -> None:
        if not sources:
            raise EndpointError("no endpoint given (e.g. tcp://127.0.0.1:5557)")
        self.path = os.fspath(path) if path is not None else ""
        self._sink = sink
        self.sources = list(sources)
        self.topic = topic
        self._topic_b = topic.encode()
        self.bind = bind
        self.history = history
        self.duration_ns = duration_ns
        self.max_batches = max_batches
        self.connect_timeout_ns = connect_timeout_ns
        self.replay_timeout_ns = replay_timeout_ns
        self.quiet_ns = quiet_ns
        self.groups = groups
        self.groups_source = groups_source
        self.force = force
        self._status = status
        self._status_interval_ns = status_interval_ns
        self._ctx_given = context
        self._rcvhwm = rcvhwm
        self._writer_options = writer_options or {}
        self._extra_context = extra_context or {}
        self.metadata = tuple(metadata)
        self.stats = CaptureStats()
        self._stat_queue: collections.deque[tuple[ChannelState, int, bytes]] = collections.deque()
        self._stat_bytes = 0
        self._status_decode = status_decode
        self._stop_flag = threading.Event()
        self._abort_flag = threading.Event()
        self._stop_reason = "stopped"
        self._srcs: list[_Src] = []
        self._writer: RecordingWriter | _NullWriter | None = None
        self._full = False
        self._budget = Budget(max_batches)
        # Status labels come from the one annotation rule (kvtool.annotate): the metadata
        # given, else what annotated stores of each channel said so far.
        table = groups_from_list(groups, source=groups_source or "groups") if groups else None
        self._kinds = StatusKinds(table=table)

    def stop(self, reason: str = "stopped") -> None:
        """Ask the capture to stop (thread- and signal-safe); a second call aborts waiting.

        Args:
            reason: Recorded as the stop reason.
        """
        if self._stop_flag.is_set():
            self._abort_flag.set()
            return
        self._stop_reason = reason
        self._stop_flag.set()

    def _write(self, src: _Src, w: Write) -> None:
        st = self.stats
        seq, payload, t = w.seq, w.payload, w.log_time
        ch = src.seq.channels[w.topic]
        ts = peek_ts(payload)
        pub = int(ts * 1e9) if ts is not None and 0 <= ts < 1e10 else t
        # Decoding for the status costs more than writing: queued for an idle moment, or
        # past the queue's bound counted from the header only.
        queue = self._stat_queue
        if not self._status_decode:
            n = _event_count(payload)
            if n is None:
                self._decode_stats(ch, seq, payload)  # no header to count: a broken payload
            else:
                st.events += n
        elif len(queue) < STATS_QUEUE_MAX and self._stat_bytes + len(payload) <= STATS_QUEUE_BYTES:
            queue.append((ch, seq, payload))
            self._stat_bytes += len(payload)
        else:
            n = _event_count(payload)
            if n is None:
                self._decode_stats(ch, seq, payload)  # no header to count: a broken payload
            else:
                st.events += n
                st.unsampled += 1
        writer = self._writer
        assert writer is not None
        writer.write(src.channel_ids[w.topic], seq, payload, t, pub)
        if self._sink is not None:
            self._sink((src.spec.endpoint, ch.topic_str, src.spec.dp_rank), seq, payload, t)
        st.batches += 1
        st.bytes += len(payload)
        if self.max_batches is not None and st.batches >= self.max_batches:
            self._full = True
            self.stop("max_batches")

    def _decode_queued(self, budget_ns: int) -> None:
        """Decode queued batches for the status for up to ``budget_ns``."""
        queue = self._stat_queue
        until = time.monotonic_ns() + budget_ns
        while queue:
            ch, seq, payload = queue.popleft()
            self._stat_bytes -= len(payload)
            self._decode_stats(ch, seq, payload)
            if time.monotonic_ns() >= until:
                return

    def _count_queued(self) -> None:
        """At the very end: what is still queued is counted from its headers."""
        queue = self._stat_queue
        while queue:
            ch, seq, payload = queue.popleft()
            n = _event_count(payload)
            if n is None:
                self._decode_stats(ch, seq, payload)
            else:
                self.stats.events += n
                self.stats.unsampled += 1
        self._stat_bytes = 0

    def _decode_stats(self, ch: ChannelState, seq: int, payload: bytes) -> None:
        try:
            n, agg = _stat_events(payload, seq)
        except Exception:  # any payload, however broken (even RecursionError), is recorded
            self.stats.undecodable += 1
        else:
            self._count(ch, n, agg)

    def _count(self, ch: ChannelState, n_events: int, agg: dict[_EvStat, int]) -> None:
        st = self.stats
        st.events += n_events
        name = ch.name
        for (typ, gi, kind), n in agg.items():
            if typ == 0:
                st.stores[self._kinds.store(name, gi, kind, n)] += n
            elif typ == 1:
                st.removes[self._kinds.remove(name, gi)] += n
            else:
                st.cleared += n

    def ledger(self) -> GapLedger:
        """Return the gap ledger as it stands (see :func:`build_ledger`).

        Returns:
            The typed ledger.
        """
        return build_ledger(ch for src in self._srcs for ch in src.seq.channels.values())


def build_ledger(channels: Iterable[ChannelState]) -> GapLedger:
    """Build the gap ledger (:class:`kvtool.recording.ledger.GapLedger`) -- the only builder.

    The totals are always exact. Lists are capped (``LEDGER_LIST_CAP`` entries: the
    first and last halves) so the record stays small; what a list leaves out is counted
    under ``gaps_omitted`` / ``restarts_omitted`` / ``lost_ranges_omitted``.

    Args:
        channels: The recorder's channels, in order.

    Returns:
        The ledger; ``to_json()`` gives the record's shape on disk.
    """
    half = LEDGER_LIST_CAP // 2

    def cap(items: list[T]) -> list[T]:
        return list(items) if len(items) <= LEDGER_LIST_CAP else items[:half] + items[-half:]

    chans: list[ChannelLedger] = []
    lost_ranges: list[tuple[int, int]] = []
    recovered = lost = restarts = unconfirmed = 0
    for ch in channels:
        for g in ch.gaps:
            recovered += g.recovered
            for a, b in g.lost_ranges:
                lost += b - a + 1
                lost_ranges.append((a, b))
        restarts += len(ch.restarts)
        chans.append(
            ChannelLedger(
                channel=ch.name,
                endpoint=ch.endpoint,
                topic=ch.topic_str,
                dp_rank=ch.dp_rank,
                batches=ch.batches,
                seq_first=ch.seq_first,
                seq_last=ch.seq_last,
                gaps=[
                    GapRecord(
                        first=g.first,
                        last=g.last,
                        recovered=g.recovered,
                        lost_ranges=[(a, b) for a, b in g.lost_ranges],
                    )
                    for g in cap(ch.gaps)
                ],
                restarts=[RestartRecord(**r) for r in cap(ch.restarts)],
                gaps_omitted=max(0, len(ch.gaps) - LEDGER_LIST_CAP),
                restarts_omitted=max(0, len(ch.restarts) - LEDGER_LIST_CAP),
                unconfirmed_from=ch.expected if ch.unconfirmed else None,
            )
        )
        unconfirmed += ch.unconfirmed
    return GapLedger(
        channels=chans,
        recovered=recovered,
        lost=lost,
        lost_ranges=cap(lost_ranges),
        restarts=restarts,
        lost_ranges_omitted=max(0, len(lost_ranges) - LEDGER_LIST_CAP),
        unconfirmed=unconfirmed,
    )


T = TypeVar("T")
