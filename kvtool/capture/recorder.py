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

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from types import FrameType

import zmq

from kvtool.capture.endpoint_io import EndpointIO
from kvtool.capture.sequencer import (
    CaptureStats,
    Limits,
    Sequencer,
)

# The recorder's state, bounds and writes live in kvtool.capture.writes; their names
# stay importable here (tests bound some of them here: the recorder reads them here).
from kvtool.capture.writes import (
    BURST,
    BURST_NS,
    DEALER_RCVHWM,
    END_SEQ,
    LEDGER_LIST_CAP,
    LOOP_STALL_NS,
    MAX_CHANNELS_PER_SOURCE,
    MAX_HELD_BYTES,
    MAX_LATE_REPLIES,
    MAX_MESSAGE_BYTES,
    MAX_REMEMBERED,
    MEMORY_BOUND_BYTES,
    RCVHWM,
    REPLAY_DEADLINE_NS,
    SETTLE_STEP,
    STATS_QUEUE_BYTES,
    STATS_QUEUE_MAX,
    STATS_SLICE_NS,
    STATS_STOP_NS,
    STOP_GRACE_NS,
    STOP_TAIL_QUIET_NS,
    STOP_WRITE_BUDGET_NS,
    T,
    _NullWriter,
    _Src,
    build_ledger,
)
from kvtool.endpoints import (
    ConnectTimeout,
    Source,
    expand_endpoints,
    normalize_endpoint,
    offset_endpoint,
    sockets_needed,
)
from kvtool.errors import EndpointError, KvtoolError, MetadataError
from kvtool.recording import RecordingWriter


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


class Recorder(EndpointIO):
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
        metadata: More metadata records to store, (name, values) each (``top``/``serve
            --record``'s ``kvtool.ungrouped`` rule).
    """

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
            for name, values in self.metadata:
                writer.add_metadata(name, values)
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
                # Every socket of this context is this thread's; one that a signal left out
                # of the bookkeeping (between its creation and registration) is closed too:
                # term alone would wait for it forever.
                ctx.destroy(linger=0)
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
    "BURST",
    "BURST_NS",
    "DEALER_RCVHWM",
    "END_SEQ",
    "LEDGER_LIST_CAP",
    "LOOP_STALL_NS",
    "MAX_CHANNELS_PER_SOURCE",
    "MAX_HELD_BYTES",
    "MAX_LATE_REPLIES",
    "MAX_MESSAGE_BYTES",
    "MAX_REMEMBERED",
    "MEMORY_BOUND_BYTES",
    "RCVHWM",
    "REPLAY_DEADLINE_NS",
    "SETTLE_STEP",
    "STATS_QUEUE_BYTES",
    "STATS_QUEUE_MAX",
    "STATS_SLICE_NS",
    "STATS_STOP_NS",
    "STOP_GRACE_NS",
    "STOP_TAIL_QUIET_NS",
    "STOP_WRITE_BUDGET_NS",
    "CaptureResult",
    "CaptureStats",
    "ConnectTimeout",
    "MetadataError",
    "Recorder",
    "Source",
    "T",
    "build_ledger",
    "capture",
    "expand_endpoints",
    "load_groups",
    "normalize_endpoint",
    "offset_endpoint",
]
