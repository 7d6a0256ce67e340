"""Where ``top``'s and ``serve``'s batches come from: a recording played back, or a live stream.

Both hand over the messages in chunks of at most :data:`kvtool.report.feed.CHUNK_MAX`
batches, the chunk :class:`kvtool.report.feed.ReportFeed` decodes in one go, and say the
stream's :class:`Health`.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from kvtool.report.feed import CHUNK_BYTES, CHUNK_MAX

if TYPE_CHECKING:
    from kvtool.recording import ChannelInfo, RecordedMessage
    from kvtool.recording.ledger import GapLedger
    from kvtool.recording.reader import RecoveryReport

# -- the inbox: bounded, consumed in bounded chunks (issue 23) ----------------------------
INBOX_MAX = 1_024
INBOX_BYTES = 16 * 1024 * 1024
"""Batches (and payload bytes) waiting for the view. When full, the recorder thread waits
for room (it is busy, as when writing; its gap recovery covers what ZeroMQ drops meanwhile,
and a ``--record`` file loses nothing): the view drops refreshes, never batches."""
LIVE_RCVHWM = 1_000
"""SUB receive high-water mark of ``top``'s and ``serve``'s recorder (``record``: 5,000)."""
MAX_SPEED = 1e6
"""A ``--speed`` beyond this plays everything at once (as 0)."""
MAX_PLAYBACK_GAP_NS = 10_000_000_000
"""A recording's receive times jumping further ahead than this are played as this (a batch
30 years ahead no longer stalls the playback)."""


@dataclass(frozen=True)
class Health:
    """The stream's health, as the source (recorder or recording) sees it.

    Attributes:
        source: What is watched (endpoints or a file), printable.
        publishers: Publishers (channels) known.
        connected: Publishers connected now (a recording: channels seen).
        batches: Batches received so far.
        gaps_recovered: Missing seqs recovered over replay.
        lost: Seqs lost for good.
        restarts: Publisher restarts seen.
        last_batch_age_s: Seconds since the last batch, or None before the first.
        done: The source has ended (end of recording, or the recorder stopped).
    """

    source: str = ""
    publishers: int = 0
    connected: int = 0
    batches: int = 0
    gaps_recovered: int = 0
    lost: int = 0
    restarts: int = 0
    last_batch_age_s: float | None = None
    done: bool = False


# -- sources: a recording played back, or a live stream ------------------------------------


class RecordingSource:
    """Plays a recording by receive time (``log_time``), ``speed`` times faster.

    Args:
        path: The recording.
        speed: Time-lapse factor; 0 plays everything at once.

    Raises:
        RecordingError: The recording cannot be opened.
    """

    def __init__(self, path: str, *, speed: float = 1.0) -> None:
        from kvtool.recording import open_recording

        self._reader = open_recording(path)
        self.path = self._reader.path
        # Past MAX_SPEED (inf, 1e308) everything is due at once: as speed 0 (issue 23:
        # the pacing arithmetic raised OverflowError).
        self.speed = 0.0 if not speed <= MAX_SPEED else speed
        self.groups = {self._reader.path: self._reader.groups}
        self._it = self._reader.messages()
        self._next: RecordedMessage | None = next(self._it, None)
        self._t0 = self._next.log_time if self._next is not None else 0
        self._last = self._t0
        self._channels: set[tuple[str, int]] = set()
        self._batches = 0
        self._start: float | None = None
        self._paused_at: float | None = None
        self._stream_t = 0.0
        self._behind = False
        self.done = self._next is None
        self.error: BaseException | None = None

    def start(self, now: float) -> None:
        """Start the clock.

        Args:
            now: Monotonic seconds.
        """
        self._start = now

    def take(self, now: float) -> list[RecordedMessage]:
        """Return the next chunk of the messages due by ``now`` (any at speed 0).

        At most :data:`CHUNK_MAX` messages or :data:`CHUNK_BYTES` (see :attr:`backlog`).

        Args:
            now: Monotonic seconds.

        Returns:
            The messages, in file order.
        """
        if self._paused_at is not None:
            now = self._paused_at  # paused: the recording's clock stands still
        start = self._start if self._start is not None else now
        limit = None if self.speed <= 0 else self._t0 + int((now - start) * self.speed * 1e9)
        out: list[RecordedMessage] = []
        nbytes = 0
        self._behind = False
        while self._next is not None:
            if limit is not None and self._next.log_time > limit:
                if self._next.log_time - max(self._last, limit) <= MAX_PLAYBACK_GAP_NS:
                    break
                # Far ahead of the stream (a clock jump, a bogus time): played as a gap
                # of MAX_PLAYBACK_GAP_NS, so the playback never stalls on it.
                shift = self._next.log_time - max(self._last, limit) - MAX_PLAYBACK_GAP_NS
                self._t0 += shift
                self._last += shift
                break
            if len(out) >= CHUNK_MAX or nbytes >= CHUNK_BYTES:
                self._behind = True
                break
            m = self._next
            nbytes += len(m.data)
            out.append(m)
            self._channels.add((m.channel.path, m.channel.id))
            self._last = max(self._last, m.log_time)
            self._next = next(self._it, None)
        self._batches += len(out)
        if self._next is None:
            self.done = True
            self._stream_t = (self._last - self._t0) / 1e9
            self._reader.close()
        elif limit is not None:
            self._stream_t = (limit - self._t0) / 1e9
        return out

    def pause(self, now: float, paused: bool) -> None:
        """Hold or resume playback: time spent paused does not advance the recording.

        Args:
            now: Monotonic seconds.
            paused: True to hold, False to resume.
        """
        if paused and self._paused_at is None:
            self._paused_at = now
        elif not paused and self._paused_at is not None:
            if self._start is not None:
                self._start += now - self._paused_at
            self._paused_at = None

    @property
    def backlog(self) -> int:
        """:data:`CHUNK_MAX` while messages already due are left for the next call, else 0."""
        return CHUNK_MAX if self._behind else 0

    def clock(self) -> float:
        """Return seconds on the recording's receive clock since its first batch."""
        return self._stream_t

    def wake(self, now: float) -> float | None:
        """Return the monotonic time the last message is due (None: never, or done)."""
        if self.done or self._start is None:
            return None
        if self.speed <= 0 or self._behind:
            return now
        return None

    @property
    def recovery(self) -> RecoveryReport:
        """What reading the recording recovered and what it could not (so far)."""
        return self._reader.recovery

    @property
    def gap_ledger(self) -> GapLedger | None:
        """The recording's gap ledger (None: it has none)."""
        return self._reader.gap_ledger

    def health(self) -> Health:
        """Return the recording's health: channels seen, batches played, its gap ledger."""
        ledger = self._reader.gap_ledger
        return Health(
            source=self.path,
            publishers=len(self._reader.channels) or len(self._channels),
            connected=len(self._channels),
            batches=self._batches,
            gaps_recovered=ledger.recovered if ledger else 0,
            lost=ledger.lost if ledger else 0,
            restarts=ledger.restarts if ledger else 0,
            last_batch_age_s=None
            if not self._batches
            else max(0.0, self._stream_t - (self._last - self._t0) / 1e9),
            done=self.done,
        )

    def stop(self) -> None:
        """Close the recording."""
        self._reader.close()


class LiveSource:
    """A :class:`kvtool.capture.Recorder` in a background thread, its batches handed over.

    Gap recovery, restarts and the optional ``--record`` file are the recorder's, exactly
    as ``kvtool record`` does them.

    Args:
        sources: What to subscribe to (:func:`kvtool.endpoints.expand_endpoints`).
        record: Also write the stream to this recording (None: no file).
        recorder_options: More :class:`~kvtool.capture.Recorder` keyword arguments.
    """

    def __init__(
        self,
        sources: Sequence[object],
        *,
        record: str | None = None,
        **recorder_options: object,
    ) -> None:
        from kvtool.capture import Recorder

        self._lock = threading.Lock()
        self._room = threading.Condition(self._lock)
        self._inbox: deque[RecordedMessage] = deque()
        self._inbox_bytes = 0
        self._closing = False
        self._channels: dict[tuple[str, str], ChannelInfo] = {}
        self._last_mono: float | None = None
        self.error: BaseException | None = None
        self.result: object = None
        self.path = " ".join(getattr(s, "endpoint", str(s)) for s in sources)
        self._n_sources = len(sources)
        # The inbox is the queue: a deep SUB queue behind it would only hold more bytes
        # here (the publisher's SNDHWM holds the rest; what it drops is a gap, recovered).
        recorder_options.setdefault("rcvhwm", LIVE_RCVHWM)
        # The view decodes every batch itself: no status decode (and its queue) here.
        recorder_options.setdefault("status_decode", False)
        self.recorder = Recorder(
            record,
            sources,  # type: ignore[arg-type]
            sink=self._sink,
            **recorder_options,  # type: ignore[arg-type]
        )
        self._thread = threading.Thread(target=self._run, name="kvtool-top-recorder", daemon=True)
        self._start: float | None = None
        self._now = 0.0

    def _sink(self, channel: tuple[str, str, int | None], seq: int, payload: bytes, t: int) -> None:
        from kvtool.recording import ChannelInfo as _CI
        from kvtool.recording import RecordedMessage as _RM

        endpoint, topic, rank = channel
        info = self._channels.get((endpoint, topic))
        if info is None:
            name = endpoint if not topic else f"{endpoint}#{topic}"
            info = self._channels[(endpoint, topic)] = _CI(
                id=len(self._channels), name=name, endpoint=endpoint, topic=topic, dp_rank=rank
            )
        msg = _RM(channel=info, seq=seq, log_time=t, publish_time=t, data=payload, offset=0)
        with self._room:
            self._last_mono = time.monotonic()  # the health line: received, if not yet shown
            # Full: wait for the view to take some (bounded memory; nothing dropped).
            while (
                (len(self._inbox) >= INBOX_MAX or self._inbox_bytes + len(payload) > INBOX_BYTES)
                and self._inbox
                and not self._closing
            ):
                self._room.wait(0.1)
            self._inbox.append(msg)
            self._inbox_bytes += len(payload)

    def _run(self) -> None:
        try:
            self.result = self.recorder.run(handle_signals=False)
        except BaseException as err:  # handed to the main thread by :meth:`stop`
            self.error = err

    @property
    def done(self) -> bool:
        """The recorder has ended (an error, or stopped)."""
        return self._start is not None and not self._thread.is_alive()

    def start(self, now: float) -> None:
        """Start the recorder thread.

        Args:
            now: Monotonic seconds.
        """
        self._start = now
        self._thread.start()

    def take(self, now: float) -> list[RecordedMessage]:
        """Return the next chunk of the batches written, in the order written.

        At most :data:`CHUNK_MAX` batches or :data:`CHUNK_BYTES`; the rest stays for the
        next call (see :attr:`backlog`).

        Args:
            now: Monotonic seconds.

        Returns:
            The messages.
        """
        self._now = now
        out: list[RecordedMessage] = []
        nbytes = 0
        with self._room:
            inbox = self._inbox
            while inbox and len(out) < CHUNK_MAX and nbytes < CHUNK_BYTES:
                m = inbox.popleft()
                nbytes += len(m.data)
                out.append(m)
            self._inbox_bytes -= nbytes
            self._room.notify_all()
        return out

    def pause(self, now: float, paused: bool) -> None:
        """A live stream cannot be held: batches keep being received (and recorded).

        Args:
            now: Monotonic seconds.
            paused: Whether the view is paused (only the view freezes).
        """

    @property
    def backlog(self) -> int:
        """Batches received and not taken yet."""
        return len(self._inbox)

    def clock(self) -> float:
        """Return seconds since the start."""
        return 0.0 if self._start is None else self._now - self._start

    def wake(self, now: float) -> float | None:
        """A live stream has no end of its own."""
        return None

    def health(self) -> Health:
        """Return the recorder's counters as a :class:`Health`."""
        st = self.recorder.stats
        last = self._last_mono
        return Health(
            source=self.path,
            publishers=self._n_sources,
            connected=len(st.connected),
            batches=st.batches,
            gaps_recovered=st.recovered,
            lost=st.lost,
            restarts=st.restarts,
            last_batch_age_s=None if last is None else max(0.0, time.monotonic() - last),
            done=self.done,
        )

    def stop(self) -> None:
        """Stop the recorder (closing a ``--record`` file) and wait for its thread.

        Raises:
            BaseException: What the recorder raised (e.g. an endpoint error).
        """
        with self._room:
            self._closing = True  # a recorder waiting for room goes on
            self._room.notify_all()
        if self._thread.is_alive():
            self.recorder.stop("stopped")
            self._thread.join(60)
            if self._thread.is_alive():  # a second stop gives up waiting on replays
                self.recorder.stop("stopped")
                self._thread.join()
        if self.error is not None:
            err, self.error = self.error, None
            raise err


class Source(Protocol):
    """What :func:`run_top` reads: :class:`RecordingSource` or :class:`LiveSource`."""

    path: str
    error: BaseException | None

    @property
    def done(self) -> bool: ...  # noqa: D102

    def start(self, now: float) -> None: ...  # noqa: D102

    def take(self, now: float) -> list[RecordedMessage]: ...  # noqa: D102

    def pause(self, now: float, paused: bool) -> None: ...  # noqa: D102

    @property
    def backlog(self) -> int: ...  # noqa: D102

    def clock(self) -> float: ...  # noqa: D102

    def wake(self, now: float) -> float | None: ...  # noqa: D102

    def health(self) -> Health: ...  # noqa: D102

    def stop(self) -> None: ...  # noqa: D102


__all__ = [
    "INBOX_BYTES",
    "INBOX_MAX",
    "LIVE_RCVHWM",
    "MAX_PLAYBACK_GAP_NS",
    "MAX_SPEED",
    "Health",
    "LiveSource",
    "RecordingSource",
    "Source",
]
