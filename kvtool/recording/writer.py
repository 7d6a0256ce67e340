"""RecordingWriter: writes the kvtool MCAP profile with bounded loss on a crash."""

from __future__ import annotations

import json
import os
import sys
import time
from types import TracebackType
from collections.abc import Callable
from typing import IO, TypeVar

from mcap.writer import CompressionType, Writer

import kvtool
from kvtool.errors import RecordingError
from kvtool.protocol import peek_ts
from kvtool.recording import format as fmt

T = TypeVar("T")


class RecordingWriter:
    """Writes one recording. Use as a context manager; the file is closed properly on exit.

    The file is created exclusively (``open("xb")``) unless ``force`` is set. The open
    chunk is closed and the file flushed whenever a write finds ``flush_interval_ns``
    passed since the last flush (and at least by :meth:`flush`, which a recorder calls
    from its poll loop), so a SIGKILL loses at most about one interval of messages.

    Args:
        path: Where to write.
        force: Overwrite an existing file.
        chunk_size: Uncompressed bytes per chunk.
        compression: ``"zstd"``, ``"lz4"`` or ``"none"``.
        flush_interval_ns: Longest time data stays only in memory.
        context: Extra keys for the ``kvtool.recording`` metadata record.

    Raises:
        RecordingError: The file exists (without ``force``) or cannot be created.
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
    ) -> None:
        self.path = os.fspath(path)
        try:
            comp = {"zstd": CompressionType.ZSTD, "lz4": CompressionType.LZ4,
                    "none": CompressionType.NONE}[compression]
        except KeyError:
            raise RecordingError(f"unknown compression {compression!r} (zstd, lz4, none)") from None
        try:
            self._file: IO[bytes] = open(self.path, "wb" if force else "xb")  # noqa: SIM115
        except FileExistsError:
            raise RecordingError(
                f"{self.path}: file exists; pass --force to overwrite it"
            ) from None
        except OSError as err:
            raise RecordingError(f"{self.path}: cannot create: {err.strerror}") from err
        self._writer = Writer(self._file, chunk_size=chunk_size, compression=comp)
        self._flush_interval_ns = flush_interval_ns
        self._last_flush = time.monotonic_ns()
        self._closed = False
        self._channels: dict[tuple[str, str], int] = {}
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
            self.add_metadata(fmt.META_RECORDING, meta)
        except OSError as err:
            self._file.close()
            raise RecordingError(f"{self.path}: cannot write: {err.strerror}") from err

    def __enter__(self) -> RecordingWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
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
            meta = {
                fmt.CHANNEL_ENDPOINT: endpoint,
                fmt.CHANNEL_TOPIC: topic,
                fmt.CHANNEL_DP_RANK: "" if dp_rank is None else str(dp_rank),
            }
            self._channels[key] = self._guard(
                lambda: self._writer.register_channel(
                    fmt.channel_topic(endpoint, topic), fmt.MESSAGE_ENCODING,
                    self._schema_id, meta,
                )
            )
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
            seq: The publisher's sequence number (its low 32 bits are stored).
            payload: The msgpack payload frame as received.
            log_time: Receive time, ns since the epoch.
            publish_time: The batch ``ts`` in ns; when None it is read from the payload,
                falling back to ``log_time``.
        """
        if publish_time is None:
            ts = peek_ts(payload)
            publish_time = (
                int(ts * 1e9) if ts is not None and 0 <= ts < 1e10 else log_time
            )
        self._guard(
            lambda: self._writer.add_message(
                channel_id, log_time, payload, publish_time, seq & 0xFFFFFFFF
            )
        )
        self.messages_written += 1
        self.bytes_written += len(payload)
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
        """Close the open chunk and push everything to the OS."""
        self._guard(self._writer.flush)
        self._last_flush = time.monotonic_ns()

    def close(self, ledger: dict[str, object] | None = None) -> None:
        """Write the gap ledger (if given), the summary and the footer, and close the file.

        Args:
            ledger: The gap ledger for the ``kvtool.gaps`` record.
        """
        if self._closed:
            return
        self._closed = True
        try:
            if ledger is not None:
                self.add_metadata(fmt.META_GAPS, {"ledger": ledger})
            self._guard(self._writer.finish)
        finally:
            self._file.close()

    def _guard(self, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except OSError as err:
            raise RecordingError(
                f"{self.path}: write failed after {self.messages_written} messages: "
                f"{err.strerror or err}; what was flushed before stays readable"
            ) from err
