"""The recorder: SUB + replay DEALER sockets and the poll loop around the seq decisions.

A :class:`Recorder` SUBscribes to one or many endpoints (one socket each, so every
message is known to come from its endpoint), writes every batch through
:class:`~kvtool.recording.RecordingWriter` byte for byte, and tracks the publisher's
``seq`` per channel (one channel per (endpoint, topic)):

- every seq decision -- a **gap** fetched over the replay DEALER (``[b"", start_seq]``;
  replies ``[b"", topic, seq, payload]`` or the older ``[b"", seq, payload]``, then the
  end marker seq ``-1``) while the endpoint's live batches are held, replayed batches
  placed in seq order among them (PROTOCOL.md, "Ordering trap"), a lost **tail** asked
  for when a channel is quiet and at stop, ``history``, publisher **restarts** and
  implausible jumps, **strays**, lying or flooding replay sockets, replay retries and
  deadlines, and what goes to the ledger as **lost** or **unconfirmed** -- is made by the pure
  :class:`~kvtool.capture.sequencer.Sequencer` (one per endpoint). This module feeds it
  what the sockets receive and the clock, and carries out the actions it returns
  (write, send a request, replace the replay socket); nothing goes missing silently.

Guarantees, whatever the peers do:

- **stop**: after SIGTERM/SIGINT/SIGHUP (or :meth:`Recorder.stop`) the recorder spends at most
  :data:`STOP_GRACE_NS` (1 s) finishing replays, then writes what it holds and closes a
  valid file with its gap ledger -- ``kvtool record`` exits well within 3 s;
- **SIGKILL** loses at most about 1 s of received batches (the writer flushes every
  second) plus the live batches held for an outstanding replay (at most
  :data:`MAX_HELD_BYTES`, for at most the request's deadline, 20 s);
- **replay**: a request without an answer for ``--replay-timeout`` is asked again from
  the seq after the last reply, until its end marker comes or
  :data:`REPLAY_DEADLINE_NS` passes (issue 23); what it did not bring is in the ledger
  (a gap's seqs lost, a tail unconfirmed), never silently missing;
- **memory**: the recorder's own buffers (held live batches, one request's replies, the
  reserve, remembered payload hashes, batches waiting for the status decode) stay under
  :data:`MEMORY_BOUND_BYTES` (768 MiB), for up to :data:`MAX_CHANNELS_PER_SOURCE`
  channels per endpoint. ZeroMQ's queues (SUB
  ``RCVHWM`` 5,000 messages, DEALER :data:`DEALER_RCVHWM`) come on top; each message
  is at most :data:`MAX_MESSAGE_BYTES` (a larger one drops the peer's connection).

The gap ledger (``kvtool.gaps`` metadata record, written at close by :func:`build_ledger`)::

    {"channels": [{"channel", "endpoint", "topic", "dp_rank", "batches", "seq_first",
                   "seq_last", "gaps": [{"first", "last", "recovered",
                   "lost_ranges": [[a, b], ...]}],
                   "restarts": [{"log_time", "from_seq", "to_seq"}]}],
     "recovered": n, "lost": n, "lost_ranges": [[a, b], ...], "restarts": n}
"""

from __future__ import annotations

import collections
import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from types import FrameType
from typing import TypeVar

import zmq
from zmq.utils.monitor import recv_monitor_message

from kvtool.annotate import StatusKinds, groups_from_list
from kvtool.capture import sequencer as _seqmod
from kvtool.capture.sequencer import (
    DEFAULT_QUIET_NS,
    DEFAULT_REPLAY_TIMEOUT_NS,
    MAX_REPLY_COUNT,
    Action,
    Budget,
    CaptureStats,
    ChannelState,
    Limits,
    NewChannel,
    Request,
    ResetReplySocket,
    Sequencer,
    Write,
)
from kvtool.capture.stats import EvStat as _EvStat
from kvtool.capture.stats import event_count as _event_count
from kvtool.capture.stats import stat_events as _stat_events
from kvtool.endpoints import (
    ConnectTimeout,
    Source,
    expand_endpoints,
    normalize_endpoint,
    offset_endpoint,
    sockets_needed,
)
from kvtool.errors import EndpointError, KvtoolError, MetadataError
from kvtool.protocol import peek_ts
from kvtool.recording import RecordingWriter
from kvtool.recording.ledger import ChannelLedger, GapLedger, GapRecord, RestartRecord

END_SEQ = b"\xff" * 8
"""The replay end marker: seq -1 as 8-byte signed big-endian."""

# The recorder reads these when it starts (tests may change them); the sequencer keeps
# them as its Limits.
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


def load_groups(path: str | os.PathLike[str]) -> list[dict[str, object]]:
    """Read and validate a groups file (``get_kv_cache_group_metadata()``'s JSON list).

    Args:
        path: The JSON file (a metadata list or spec descriptions, see annotate).

    Returns:
        The list to store, one ``{"group_idx", "kind", "block_size", "sliding_window"}``
        per group.

    Raises:
        MetadataError: The file is missing, not JSON or not a valid group list.
    """
    from kvtool.annotate import load_groups_file

    return load_groups_file(path).to_metadata()


# ---------------------------------------------------------------------- results


@dataclass
class CaptureResult:
    """What a finished capture did.

    Attributes:
        path: The recording written.
        stats: The final counters.
        ledger: The gap ledger written into the recording.
        stop_reason: ``duration``, ``max_batches``, ``signal`` or ``stopped``.
        file_bytes: Size of the recording on disk.
        kept_old: ``force`` met a recording at the path and no batch came to replace
            it: it was left as it was (and ``file_bytes`` is its size).
    """

    path: str
    stats: CaptureStats
    ledger: dict[str, object]
    stop_reason: str
    file_bytes: int
    kept_old: bool = False


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

    def maybe_flush(self) -> None:
        pass

    def close(self, *, ledger: dict[str, object] | None = None) -> None:
        pass

    def discard_if_empty(self) -> bool:
        return False


_Role = tuple[str, _Src]


class Recorder:
    """Records vLLM KV-event streams into one recording, recovering gaps over replay.

    Args:
        path: The recording to write, or None to write no file (``sink`` sees the batches).
        sources: What to subscribe to (see :func:`expand_endpoints`).
        topic: SUB topic filter (vLLM's default topic is ``""``).
        bind: Bind the SUB sockets instead of connecting them.
        history: First fetch what each replay buffer still holds.
        duration_ns: Stop after this long.
        max_batches: Stop after writing this many batches.
        connect_timeout_ns: Fail when an endpoint has neither connected nor sent anything
            within this time (None: wait forever).
        replay_timeout_ns: Give up a replay request that gets no answer this long (time
            the loop spent busy elsewhere is not counted).
        quiet_ns: A channel quiet this long asks its replay socket for a lost tail.
        groups: KV cache group metadata to store (``get_kv_cache_group_metadata()``).
        groups_source: Where ``groups`` came from (a file name).
        force: Overwrite an existing file.
        status: Called with the live :class:`CaptureStats` every ``status_interval_ns``.
        status_interval_ns: How often to call ``status``.
        context: A ZeroMQ context to use (e.g. for ``inproc``); default: a new one.
        rcvhwm: Receive high-water mark of each SUB socket (messages queued before ZeroMQ
            drops; gaps are then recovered over replay).
        writer_options: Extra keyword arguments for :class:`RecordingWriter`.
        extra_context: Extra keys for the recording's context metadata.
        sink: Called with each batch in the order it is written:
            ``((endpoint, topic, dp_rank), seq, payload, log_time_ns)`` (recorder thread).
        status_decode: Decode each batch (when idle) for the per-kind status counts; False
            counts events from the batch header only (``top`` and ``serve`` decode every
            batch themselves: no second decode, no queue of payloads for it).
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

    # ------------------------------------------------------------ control
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

    @contextlib.contextmanager
    def _signals(self, install: bool) -> Iterator[None]:
        if not install or threading.current_thread() is not threading.main_thread():
            yield
            return

        def handler(signum: int, frame: FrameType | None) -> None:
            self.stop("signal")

        from kvtool._signals import STOP_SIGNALS

        # SIGHUP too: a closed SSH session ends the capture like SIGTERM (issue 23).
        old = {s: signal.signal(s, handler) for s in STOP_SIGNALS}
        try:
            yield
        finally:
            for s, h in old.items():
                signal.signal(s, h)

    # ---------------------------------------------------------------- run
    def run(self, *, handle_signals: bool = True) -> CaptureResult:
        """Record until a stop condition, then close the file with the gap ledger.

        Args:
            handle_signals: Let SIGINT, SIGTERM and SIGHUP stop the capture cleanly (main
                thread only).

        Returns:
            The result, with counters and the ledger.

        Raises:
            RecordingError: The file cannot be created or written (what was flushed stays
                readable).
            ConnectTimeout: Nothing connected within ``connect_timeout_ns``.
            EndpointError: A socket cannot bind or connect.
        """
        ctx_context = {
            "endpoints": [s.endpoint for s in self.sources],
            "replay_endpoints": [s.replay for s in self.sources],
            "topic": self.topic,
            "bind": self.bind,
            "history": self.history,
        }
        ctx_context.update(self._extra_context)
        writer = (
            RecordingWriter(
                self.path,
                force=self.force,
                context=ctx_context,
                **self._writer_options,  # type: ignore[arg-type]
            )
            if self.path
            else _NullWriter()
        )
        self._writer = writer
        ctx = self._ctx_given or zmq.Context()
        need = sockets_needed(len(self.sources), any(s.replay for s in self.sources)) + 16
        if self._ctx_given is None and need > ctx.get(zmq.MAX_SOCKETS):
            # ZeroMQ's default is 1,023 sockets per context: --dp-size 256 with replay
            # needs more (expand_endpoints refused what the process cannot hold).
            ctx.set(zmq.MAX_SOCKETS, need)
        error: BaseException | None = None
        try:
            if self.groups is not None:
                writer.add_groups(self.groups, self.groups_source or "groups")
            with self._signals(handle_signals):
                self._open_sockets(ctx)
                self._loop()
                self._finish()
        except BaseException as err:
            error = err
            raise
        finally:
            self._close_sockets()
            if self._ctx_given is None:
                ctx.term()
            kept_old = isinstance(writer, RecordingWriter) and writer.replaced_nothing
            # No batch, whatever ended the run (no publisher reached, a --duration shorter
            # than the connect timeout, a signal): leave no empty file to block the rerun
            # (issue 24). The writer removes only its own file, while it still holds it
            # and its lock, and only when it holds no message.
            writer.discard_if_empty()
            ledger = self.ledger().to_json()
            try:
                writer.close(ledger=ledger)
            except (KvtoolError, OSError):
                if error is None:
                    raise
        try:
            size = os.path.getsize(self.path)
        except OSError:
            size = 0
        return CaptureResult(self.path, self.stats, ledger, self._stop_reason, size, kept_old)

    # ------------------------------------------------------------ sockets
    def _open_sockets(self, ctx: zmq.Context[zmq.Socket[bytes]]) -> None:
        for i, spec in enumerate(self.sources):
            sub = ctx.socket(zmq.SUB)
            sub.setsockopt(zmq.LINGER, 0)
            sub.setsockopt(zmq.RCVHWM, self._rcvhwm)
            sub.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
            mon = None
            if not spec.endpoint.startswith("inproc://"):
                # Connected means a ZMTP handshake done, not a TCP connection: a port
                # that accepts TCP but speaks no ZeroMQ (vLLM's HTTP port, say) must
                # still run into --connect-timeout.
                mon = sub.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED)
            if "[" in spec.endpoint:
                sub.setsockopt(zmq.IPV6, 1)
            src = _Src(spec=spec, index=i, sub=sub, sub_mon=mon, seq=self._sequencer(spec))
            if mon is None:
                src.connected = True
            self._srcs.append(src)
            sub.setsockopt(zmq.SUBSCRIBE, self._topic_b)
            try:
                if self.bind:
                    sub.bind(spec.endpoint)
                else:
                    sub.connect(spec.endpoint)
            except zmq.ZMQError as err:
                how = "bind" if self.bind else "connect"
                raise EndpointError(f"endpoint {spec.endpoint}: cannot {how}: {err}") from err
            if spec.replay:
                self._new_dealer(src, ctx)
        self._ctx = ctx

    def _sequencer(self, spec: Source) -> Sequencer:
        # The module's values as they are now (tests lower some of them).
        limits = Limits(
            replay_timeout_ns=self.replay_timeout_ns,
            quiet_ns=self.quiet_ns,
            replay_deadline_ns=REPLAY_DEADLINE_NS,
            max_held_bytes=MAX_HELD_BYTES,
            max_late_replies=MAX_LATE_REPLIES,
            max_channels=MAX_CHANNELS_PER_SOURCE,
            max_remembered=MAX_REMEMBERED,
            stop_tail_quiet_ns=STOP_TAIL_QUIET_NS,
        )
        return Sequencer(
            spec.endpoint,
            spec.dp_rank,
            topic_prefix=self._topic_b,
            has_replay=bool(spec.replay),
            history=self.history,
            limits=limits,
            stats=self.stats,
            budget=self._budget,
        )

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

    # --------------------------------------------------------------- loop
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

    def _loop(self) -> None:
        start = time.monotonic_ns()
        self.stats.start_ns = time.time_ns()
        deadline = start + self.duration_ns if self.duration_ns else None
        connect_deadline = start + self.connect_timeout_ns if self.connect_timeout_ns else None
        next_status = start
        writer = self._writer
        assert writer is not None
        if self.history:
            for src in self._srcs:
                if src.dealer is not None:
                    self._act(src, src.seq.start_history(start))
        poller, roles = self._build_poller(live=True)
        dealers_version = self._dealer_ids()
        busy = False
        prev = start
        while not self._stop_flag.is_set():
            if self._dealer_ids() != dealers_version:
                poller, roles = self._build_poller(live=True)
                dealers_version = self._dealer_ids()
            t_poll = time.monotonic_ns()
            timeout_ms = 0 if busy or self._stat_queue else 50
            ready = poller.poll(timeout_ms)
            # Only the wait asked for is not a stall (a SIGSTOP inside poll is one).
            poll_ns = min(time.monotonic_ns() - t_poll, timeout_ms * 1_000_000 + LOOP_STALL_NS)
            if not ready and self._stat_queue:
                self._decode_queued(STATS_SLICE_NS)  # nothing to read: the status's turn
            busy = False
            for sock, _ in ready:
                role, src = roles[sock]
                if role == "sub":
                    busy |= self._drain_sub(src)
                elif role == "dealer":
                    self._drain_dealer(src)
                else:
                    self._drain_monitor(src)
                if self._stop_flag.is_set():
                    break
            now = time.monotonic_ns()
            self._credit_busy(now, now - prev - poll_ns)
            prev = now
            writer.maybe_flush()
            self._check_replays(now)
            self._check_quiet(now)
            self.stats.elapsed_ns = now - start
            if deadline is not None and now >= deadline:
                self.stop("duration")
            if connect_deadline is not None and now >= connect_deadline:
                self._check_connected()
                connect_deadline = None
            if self._status is not None and now >= next_status:
                self._status(self.stats)
                next_status = now + self._status_interval_ns

    def _dealer_ids(self) -> tuple[int, ...]:
        return tuple(id(s.dealer) for s in self._srcs)

    def _finish(self) -> None:
        """After a stop: complete outstanding replays and ask quiet channels for a tail."""
        writer = self._writer
        assert writer is not None
        # Each request is bounded by its own timeouts; this caps the whole, so a stop
        # ends promptly whatever the replay sockets do.
        end = time.monotonic_ns() + STOP_GRACE_NS
        now = time.monotonic_ns()
        for src in self._srcs:
            src.seq.begin_stop(now)
        poller, roles = self._build_poller(live=False)
        version = self._dealer_ids()
        prev = time.monotonic_ns()
        while True:
            now = time.monotonic_ns()
            for src in self._srcs:
                if src.dealer is not None:
                    self._act(src, src.seq.stop_tail(now))
            if not any(s.seq.pending is not None for s in self._srcs):
                break
            if self._abort_flag.is_set() or now >= end:
                for src in self._srcs:
                    self._act(src, src.seq.abort_replay(now))
                break
            if self._dealer_ids() != version:
                poller, roles = self._build_poller(live=False)
                version = self._dealer_ids()
            t_poll = time.monotonic_ns()
            for sock, _ in poller.poll(50):
                role, src = roles[sock]
                if role == "dealer":
                    self._drain_dealer(src)
            now = time.monotonic_ns()
            self._credit_busy(now, now - prev - (now - t_poll))
            prev = now
            self._check_replays(now)
            writer.maybe_flush()
        # Anything still held (no replay could be finished) is written as it stands.
        for src in self._srcs:
            self._act(src, src.seq.release(time.monotonic_ns()))
        if not self._budget.full:
            self._settle()
        self._decode_queued(STATS_STOP_NS)
        self._count_queued()
        if self._status is not None:
            self._status(self.stats)

    def _settle(self) -> None:
        """At stop: write what the reserves still hold; every known seq not written is lost.

        Writing gets :data:`STOP_WRITE_BUDGET_NS`; what is left then is lost too.
        """
        deadline = time.monotonic_ns() + STOP_WRITE_BUDGET_NS
        for src in self._srcs:
            done = False
            while not done and time.monotonic_ns() <= deadline:
                actions, done = src.seq.settle(SETTLE_STEP)
                self._act(src, actions)
            if self._budget.full:
                return
            if not done:
                self._act(src, src.seq.settle_give_up())

    # ------------------------------------------------------------ receive
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

    # ------------------------------------------------------------ actions
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

    # -------------------------------------------------------------- replay
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

    # -------------------------------------------------------------- ledger
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


def capture(
    path: str | os.PathLike[str],
    endpoints: Sequence[str],
    *,
    replay: Sequence[str] = (),
    dp_size: int | None = None,
    bind: bool = False,
    **options: object,
) -> CaptureResult:
    """Record ``endpoints`` into ``path`` (see :class:`Recorder` for every option).

    Args:
        path: The recording to write.
        endpoints: Publisher endpoints or bare ports.
        replay: Replay endpoints (none, or one per endpoint).
        dp_size: Subscribe to data-parallel ranks ``0..dp_size-1`` of each endpoint.
        bind: Bind the SUB sockets instead of connecting.
        **options: Keyword arguments for :class:`Recorder`.

    Returns:
        The finished capture's result.

    Raises:
        EndpointError: A malformed endpoint or a socket that cannot connect.
        RecordingError: The file cannot be created or written.
        MetadataError: Invalid ``groups``.
    """
    sources = expand_endpoints(endpoints, replay=replay, dp_size=dp_size, bind=bind)
    rec = Recorder(path, sources, bind=bind, **options)  # type: ignore[arg-type]
    return rec.run()


__all__ = [
    "CaptureResult",
    "CaptureStats",
    "ConnectTimeout",
    "MetadataError",
    "Recorder",
    "Source",
    "build_ledger",
    "capture",
    "expand_endpoints",
    "load_groups",
    "normalize_endpoint",
    "offset_endpoint",
]
