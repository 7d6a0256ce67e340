"""RecordingWriter: writes the kvtool MCAP profile with bounded loss on a crash."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Iterable
from types import TracebackType
from typing import IO, TypeVar

import kvtool
from kvtool.errors import RecordingError, RecordingPathError
from kvtool.protocol import peek_ts
from kvtool.recording import format as fmt
from kvtool.recording.mcap_writer import McapWriter, check_compression
from kvtool.recording.target import RecordingTarget

T = TypeVar("T")

_U64 = 1 << 64


class RecordingWriter:
    """Writes one recording. Use as a context manager; the file is closed properly on exit.

    The output follows kvtool's output rule (:mod:`kvtool.outputs`): created exclusively
    unless ``force`` is set, and ``force`` replaces a regular file that is not one of
    ``inputs`` (atomically: the new recording takes its place in one rename, over the file
    still locked). A recording is written in place under an exclusive ``flock`` (a
    second writer of the same path refuses); with ``atomic`` (a copy, ``replay -o``) it is
    written under a temporary name and renamed into place by :meth:`close`. The open
    chunk is closed and the file flushed whenever a write finds ``flush_interval_ns``
    passed since the last flush (and at least by :meth:`flush`, which a recorder calls
    from its poll loop), so a SIGKILL loses at most about one interval of messages.
    Where the bytes go (in place, staged, atomic, a stream) is its
    :class:`kvtool.recording.target.RecordingTarget`.

    Args:
        path: Where to write.
        force: Overwrite an existing file.
        chunk_size: Uncompressed bytes per chunk.
        compression: ``"zstd"``, ``"lz4"`` or ``"none"``.
        flush_interval_ns: Longest time data stays only in memory.
        context: Extra keys for the ``kvtool.recording`` metadata record.
        inputs: Files the caller reads; the output may not be one of them.
        atomic: Write under a temporary name, rename into place at :meth:`close`.
        stream: Write to this binary stream (stdout) instead of opening ``path``.

    Raises:
        RecordingPathError: The output rule refuses the path, another writer holds it,
            or it cannot be created.
        RecordingError: An unknown compression or a bad chunk size.

    Once a write fails (disk full, file size limit, I/O error), every later call raises
    the same :class:`RecordingError`; :meth:`close` then only closes the file. What was
    flushed before the failure stays readable (the reader recovers it).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        force: bool = False,
        chunk_size: int = fmt.DEFAULT_CHUNK_SIZE,
        compression: str = "zstd",
        flush_interval_ns: int = fmt.DEFAULT_FLUSH_INTERVAL_NS,
        context: dict[str, object] | None = None,
        inputs: Iterable[str | os.PathLike[str]] = (),
        atomic: bool = False,
        stream: IO[bytes] | None = None,
    ) -> None:
        self.path = os.fspath(path)
        try:
            comp = {"zstd": "zstd", "lz4": "lz4", "none": ""}[compression]
        except KeyError:
            raise RecordingError(f"unknown compression {compression!r} (zstd, lz4, none)") from None
        check_compression(comp)  # before the output is opened
        if chunk_size <= 0 or flush_interval_ns <= 0:
            raise RecordingError(
                f"chunk_size ({chunk_size}) and flush_interval_ns ({flush_interval_ns}) "
                "must be positive"
            )
        self._out = RecordingTarget(self.path, stream, force=force, inputs=inputs, atomic=atomic)
        self._file = self._out.file
        self._writer = McapWriter(self._file, chunk_size=chunk_size, compression=comp)
        self._flush_interval_ns = flush_interval_ns
        self._last_flush = time.monotonic_ns()
        self._closed = False
        self._failed: RecordingError | None = None
        self._channels: dict[tuple[str, str], int] = {}
        self._channel_names: dict[int, str] = {}
        self._last_seq: dict[int, int] = {}
        self.messages_written = 0
        self.bytes_written = 0
        try:
            self._writer.start(profile=fmt.PROFILE, library=f"kvtool {kvtool.__version__}")
            self._schema_id = self._writer.register_schema(
                fmt.SCHEMA_NAME, fmt.SCHEMA_ENCODING, fmt.SCHEMA_DATA
            )
            meta: dict[str, object] = {
                "format_version": fmt.FORMAT_VERSION,
                "kvtool_version": kvtool.__version__,
                "start_time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "command_line": sys.argv,
            }
            meta.update(context or {})
            self._writer.add_metadata(
                fmt.META_RECORDING, {k: json.dumps(v) for k, v in meta.items()}
            )
            # Identity on disk at once: even a recorder killed in its first second
            # leaves a file kvtool recognises as a recording.
            self._file.flush()
        except OSError as err:
            self._out.close_quietly()
            self._out.abort()
            raise RecordingPathError(
                f"{self.path}: cannot write: {err.strerror}; choose a writable path with free space"
            ) from err

    @property
    def replaced_nothing(self) -> bool:
        """True when ``force`` met a recording at the path and no message replaced it."""
        return self._out.staged

    def __enter__(self) -> RecordingWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is not None and self._out.atomic:
            self.abort()
        else:
            self.close()

    def add_channel(self, endpoint: str, topic: str = "", dp_rank: int | None = None) -> int:
        """Register (or find) the channel for one (endpoint, topic).

        Args:
            endpoint: The ZeroMQ endpoint the messages came from.
            topic: The ZeroMQ topic.
            dp_rank: The data-parallel rank the endpoint serves, if known.

        Returns:
            The channel id to pass to :meth:`write`.
        """
        key = (endpoint, topic)
        if key not in self._channels:
            name = fmt.channel_topic(endpoint, topic)
            meta = {
                fmt.CHANNEL_ENDPOINT: endpoint,
                fmt.CHANNEL_TOPIC: topic,
                fmt.CHANNEL_DP_RANK: "" if dp_rank is None else str(dp_rank),
            }
            cid = self._guard(
                lambda: self._writer.register_channel(
                    name, fmt.MESSAGE_ENCODING, self._schema_id, meta
                )
            )
            # The MCAP Channel record travels in the first chunk that uses it; this
            # copy outside any chunk keeps the channel's messages attributable if that
            # chunk is damaged.
            self.add_metadata(
                fmt.META_CHANNEL,
                {"id": cid, "name": name, "endpoint": endpoint, "topic": topic, "dp_rank": dp_rank},
            )
            self._channels[key] = cid
            self._channel_names[cid] = name
        return self._channels[key]

    def write(
        self,
        channel_id: int,
        seq: int,
        payload: bytes,
        log_time: int,
        publish_time: int | None = None,
    ) -> None:
        """Append one ZMQ message, payload bytes unchanged.

        Args:
            channel_id: From :meth:`add_channel`.
            seq: The publisher's full sequence number. MCAP's ``sequence`` holds its
                low 32 bits; a ``kvtool.seq`` note before the message keeps the high bits
                whenever they change or the seq goes backwards (publisher restart).
            payload: The msgpack payload frame as received.
            log_time: Receive time, ns since the epoch.
            publish_time: The batch ``ts`` in ns; when None it is read from the payload,
                falling back to ``log_time``.

        Raises:
            RecordingError: The write failed (see the class docstring), the channel is
                unknown, or seq or a time does not fit in 64 unsigned bits.
        """
        if channel_id not in self._channel_names:
            raise RecordingError(
                f"{self.path}: channel {channel_id} was not added with add_channel()"
            )
        if not 0 <= seq < _U64 or not 0 <= log_time < _U64:
            raise RecordingError(
                f"{self.path}: seq {seq} / log_time {log_time} out of range (0 to 2**64-1)"
            )
        if publish_time is None:
            ts = peek_ts(payload)
            publish_time = int(ts * 1e9) if ts is not None and 0 <= ts < 1e10 else log_time
        if not 0 <= publish_time < _U64:
            publish_time = log_time
        prev = self._last_seq.get(channel_id)
        if (seq >> 32) != ((prev if prev is not None else 0) >> 32) or (
            prev is not None and seq < prev
        ):
            # MCAP's sequence is 32-bit: note the full seq (after closing the open
            # chunk, so the note precedes the message in the file) whenever the high
            # bits change or the publisher restarts.
            self._guard(self._writer.flush)
            self.add_metadata(
                fmt.META_SEQ, {"channel": channel_id, "seq": seq, "log_time": log_time}
            )
        self._last_seq[channel_id] = seq
        self._guard(
            lambda: self._writer.add_message(
                channel_id, log_time, payload, publish_time, seq & fmt.SEQ_MASK
            )
        )
        self.messages_written += 1
        self.bytes_written += len(payload)
        if self._out.staged:
            try:
                self._out.take_place(self.flush)
            except RecordingError as err:
                self._failed = err
                raise
        self.maybe_flush()

    def add_metadata(self, name: str, values: dict[str, object]) -> None:
        """Write a metadata record; every value is stored as JSON.

        Args:
            name: Record name, e.g. ``kvtool.groups``.
            values: Keys and JSON-serialisable values.
        """
        data = {k: json.dumps(v) for k, v in values.items()}
        self._guard(lambda: self._writer.add_metadata(name, data))

    def add_groups(
        self, groups: list[dict[str, object]], source: str, channel: str | None = None
    ) -> None:
        """Store KV cache group metadata (``get_kv_cache_group_metadata()``'s list).

        Args:
            groups: The group metadata list.
            source: Where it came from (a file name, ``--group`` flags …).
            channel: The MCAP channel topic it applies to; None for all channels.
        """
        values: dict[str, object] = {"groups": groups, "source": source}
        if channel is not None:
            values["channel"] = channel
        self.add_metadata(fmt.META_GROUPS, values)

    def maybe_flush(self) -> None:
        """Flush if the flush interval has passed since the last flush."""
        if time.monotonic_ns() - self._last_flush >= self._flush_interval_ns:
            self.flush()

    def flush(self) -> None:
        """Close the open chunk and push everything to the OS (no fsync)."""
        self._guard(self._writer.flush)
        self._last_flush = time.monotonic_ns()

    def close(self, ledger: dict[str, object] | None = None) -> None:
        """Write the gap ledger (if given), the summary and the footer, and close the file.

        Args:
            ledger: The gap ledger for the ``kvtool.gaps`` record.

        Raises:
            RecordingError: Writing the end of the file failed (the file is closed
                anyway; what was flushed before stays readable).
        """
        if self._closed:
            return
        if self._failed is not None or self._out.staged:
            # Failed, or nothing to replace the old recording with (it stays as it was).
            self._closed = True
            self._out.close_quietly()
            self._out.abort()
            return
        try:
            if ledger is not None:
                self.add_metadata(fmt.META_GAPS, {"ledger": ledger})
            self._guard(self._writer.finish)
            self._guard(self._file.flush)
        except BaseException:
            self._closed = True
            self._out.close_quietly()
            self._out.abort()
            raise
        self._closed = True
        self._out.close_quietly()
        self._out.commit()

    def abort(self) -> None:
        """Close without finishing; a copy (``atomic``) is dropped, its target untouched.

        A recording written in place keeps what was flushed (the reader recovers it).
        """
        if self._closed:
            return
        self._closed = True
        self._out.close_quietly()
        self._out.abort()

    def discard_if_empty(self) -> bool:
        """Remove the recording this writer made in place, when it holds no message.

        For a start that failed before the first batch (no publisher reached): no empty
        file is left behind. Only this writer's own file goes, and only while the writer
        still holds it (and its lock): the path must name the very file it has open (same
        device and inode), so a file someone put at the path since is never touched. A
        copy (``atomic``) is dropped by :meth:`abort` instead; a stream is never removed.

        Returns:
            True when the file was removed.
        """
        if self.messages_written or not self._out.own_file or self._out.atomic:
            return False
        if self._out.staged:
            self._out.close_quietly()
            self._closed = True
            self._out.drop_staged()  # the old recording stays where it was
            return True
        return self._out.remove_own()

    @property
    def closed(self) -> bool:
        """True once :meth:`close` ran."""
        return self._closed

    def _guard(self, fn: Callable[[], T]) -> T:
        if self._failed is not None:
            raise self._failed
        if self._closed:
            raise RecordingError(f"{self.path}: the recording is already closed")
        try:
            return fn()
        except OSError as err:
            self._failed = RecordingError(
                f"{self.path}: write failed after {self.messages_written} messages: "
                f"{err.strerror or err}; what was flushed before stays readable"
            )
            raise self._failed from err
