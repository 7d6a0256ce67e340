"""RecordingReader: reads a kvtool MCAP recording chunk by chunk, damaged or not.

The reader always makes one linear pass over the data section, one record at a time,
so memory is bounded by a chunk and a file whose writer died (no summary, cut
mid-chunk) reads the same way as a finished one: every complete, intact chunk is
returned and a :class:`RecoveryReport` says what was not. A chunk that fails to
decompress or whose CRC does not match is skipped and counted; the scan goes on.
"""

from __future__ import annotations

import json
import os
import struct
import zlib
from collections.abc import Iterator
from typing import IO

import msgspec

from kvtool.errors import RecordingError, UnsupportedVersion
from kvtool.recording import format as fmt

MAGIC = b"\x89MCAP0\r\n"

OP_HEADER = 0x01
OP_FOOTER = 0x02
OP_SCHEMA = 0x03
OP_CHANNEL = 0x04
OP_MESSAGE = 0x05
OP_CHUNK = 0x06
OP_METADATA = 0x0C
OP_DATA_END = 0x0F

_REC = struct.Struct("<BQ")
_MSG = struct.Struct("<HIQQ")
_CHUNK = struct.Struct("<QQQI")


class ChannelInfo(msgspec.Struct, frozen=True):
    """One channel of a recording: one (endpoint, topic) of one publisher.

    Attributes:
        id: MCAP channel id (unique within one file).
        name: MCAP channel topic (``endpoint`` or ``endpoint#topic``).
        endpoint: ZeroMQ endpoint the messages came from.
        topic: ZeroMQ topic.
        dp_rank: Data-parallel rank, when known.
        path: The recording the channel belongs to.
    """

    id: int
    name: str
    endpoint: str
    topic: str
    dp_rank: int | None
    path: str = ""


class RecordedMessage(msgspec.Struct, frozen=True):
    """One recorded ZeroMQ message.

    Attributes:
        channel: Where it came from.
        seq: The publisher's sequence number (unwrapped past 32 bits).
        log_time: Receive time, ns since the epoch.
        publish_time: The batch's ``ts`` in ns, or the receive time.
        data: The msgpack payload, byte for byte as received.
        offset: File offset of the chunk (or record) that holds it.
    """

    channel: ChannelInfo
    seq: int
    log_time: int
    publish_time: int
    data: bytes
    offset: int


class RecoveryReport(msgspec.Struct):
    """What a read of a recording got back, and what it could not.

    Attributes:
        path: The recording.
        complete: True when the file ended with a footer and trailing magic and no
            chunk was damaged.
        truncated: True when the file ends before its footer (writer died).
        messages: Messages read back.
        last_good_offset: End of the last record read intact.
        file_size: Size of the file.
        damaged_chunks: Chunks skipped because they failed to decompress or check.
        reason: Why the scan stopped early, or None.
        skipped_channels: Channels of another profile (not msgpack) that were skipped.
    """

    path: str
    complete: bool = True
    truncated: bool = False
    messages: int = 0
    last_good_offset: int = 0
    file_size: int = 0
    damaged_chunks: int = 0
    reason: str | None = None
    skipped_channels: int = 0

    @property
    def damaged(self) -> bool:
        """True when anything in the file could not be read."""
        return not self.complete

    def summary(self) -> str:
        """One line a person can act on.

        Returns:
            ``path: …; recovered N messages; …`` or ``path: complete``.
        """
        if self.complete:
            return f"{self.path}: complete, {self.messages} messages"
        if not self.truncated and not self.damaged_chunks:
            return (
                f"{self.path}: {self.reason or 'index damaged'}; the data section is intact "
                f"and all {self.messages} messages were read"
            )
        parts = [f"{self.path}:"]
        if self.truncated:
            parts.append(
                f"recording is truncated at byte {self.last_good_offset} of {self.file_size}"
                f" ({self.reason or 'no footer'});"
            )
        elif self.reason:
            parts.append(f"{self.reason};")
        if self.damaged_chunks:
            parts.append(f"{self.damaged_chunks} damaged chunk(s) skipped;")
        parts.append(f"recovered {self.messages} messages; the rest is lost")
        return " ".join(parts)


class _Buf:
    """Little-endian field reader over one record body."""

    __slots__ = ("data", "pos")

    def __init__(self, data: bytes | memoryview, pos: int = 0) -> None:
        self.data = data
        self.pos = pos

    def u16(self) -> int:
        (v,) = struct.unpack_from("<H", self.data, self.pos)
        self.pos += 2
        return int(v)

    def u32(self) -> int:
        (v,) = struct.unpack_from("<I", self.data, self.pos)
        self.pos += 4
        return int(v)

    def u64(self) -> int:
        (v,) = struct.unpack_from("<Q", self.data, self.pos)
        self.pos += 8
        return int(v)

    def raw(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise struct.error("field runs past the end of its record")
        v = bytes(self.data[self.pos : self.pos + n])
        self.pos += n
        return v

    def string(self) -> str:
        return self.raw(self.u32()).decode("utf-8", "replace")

    def str_map(self) -> dict[str, str]:
        end = self.u32() + self.pos
        out: dict[str, str] = {}
        while self.pos < end:
            k = self.string()
            out[k] = self.string()
        return out


def _decompress(compression: str, data: bytes, size: int) -> bytes:
    if compression == "":
        return data
    if compression == "zstd":
        import zstandard

        return bytes(zstandard.ZstdDecompressor().decompress(data, max_output_size=size))
    if compression == "lz4":
        import lz4.frame

        return bytes(lz4.frame.decompress(data))
    raise ValueError(f"unsupported chunk compression {compression!r}")


class RecordingReader:
    """Reads one recording. Iterate :meth:`messages`; then :attr:`recovery` is final.

    Args:
        path: The recording.

    Raises:
        RecordingError: The file cannot be opened or is not MCAP at all.
        UnsupportedVersion: The recording was written by a newer kvtool format.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        try:
            self._file: IO[bytes] = open(self.path, "rb")  # noqa: SIM115
        except OSError as err:
            raise RecordingError(f"{self.path}: cannot open: {err.strerror}") from err
        self._size = os.fstat(self._file.fileno()).st_size
        head = self._file.read(len(MAGIC))
        if head != MAGIC:
            self._file.close()
            raise RecordingError(
                f"{self.path}: not an MCAP file (no MCAP magic at byte 0); "
                "is it a kvtool recording?"
            )
        self._file.seek(max(0, self._size - len(MAGIC)))
        self._tail_magic = self._file.read(len(MAGIC)) == MAGIC
        self.profile: str | None = None
        self.channels: dict[int, ChannelInfo] = {}
        self._foreign: set[int] = set()
        self._schemas: dict[int, str] = {}
        self._seq_state: dict[int, tuple[int, int]] = {}
        self.metadata: dict[str, list[dict[str, object]]] = {}
        self.recovery = RecoveryReport(path=self.path, file_size=self._size)
        self._metadata_scanned = False

    def __enter__(self) -> RecordingReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the file."""
        self._file.close()

    # -- metadata ---------------------------------------------------------------------

    def read_metadata(self) -> dict[str, list[dict[str, object]]]:
        """Return every metadata record, name → list of decoded dicts (JSON values).

        Only record headers are read; chunks are skipped over, so this is cheap even
        for a large file.

        Returns:
            The metadata records by name, in file order.
        """
        if not self._metadata_scanned:
            for _ in self._scan(want_messages=False):
                pass
        return self.metadata

    @property
    def context(self) -> dict[str, object]:
        """The ``kvtool.recording`` record (empty when absent)."""
        recs = self.read_metadata().get(fmt.META_RECORDING, [])
        return recs[0] if recs else {}

    @property
    def groups(self) -> list[dict[str, object]] | None:
        """The stored KV cache group metadata for all channels, or None."""
        for rec in self.read_metadata().get(fmt.META_GROUPS, []):
            groups = rec.get("groups")
            if rec.get("channel") is None and isinstance(groups, list):
                return groups
        return None

    @property
    def ledger(self) -> dict[str, object] | None:
        """The gap ledger written at close, or None (the writer died or did not write one)."""
        recs = self.read_metadata().get(fmt.META_GAPS, [])
        ledger = recs[-1].get("ledger") if recs else None
        return ledger if isinstance(ledger, dict) else None

    # -- messages ---------------------------------------------------------------------

    def messages(self) -> Iterator[RecordedMessage]:
        """Yield every intact message in file order, then finalise :attr:`recovery`.

        Yields:
            One :class:`RecordedMessage` per recorded ZeroMQ message.
        """
        self.recovery = RecoveryReport(path=self.path, file_size=self._size)
        self._seq_state.clear()
        yield from self._scan(want_messages=True)

    def __iter__(self) -> Iterator[RecordedMessage]:
        return self.messages()

    def _scan(self, *, want_messages: bool) -> Iterator[RecordedMessage]:
        f = self._file
        size = self._size
        rep = RecoveryReport(path=self.path, file_size=size)
        meta: dict[str, list[dict[str, object]]] = {}
        pos = len(MAGIC)
        f.seek(pos)
        footer = False
        while True:
            if pos + _REC.size > size:
                rep.reason = "file ends mid-record" if pos < size else "file ends before its footer"
                rep.truncated = True
                break
            f.seek(pos)
            opcode, length = _REC.unpack(f.read(_REC.size))
            body_at = pos + _REC.size
            if length > fmt.MAX_RECORD_BYTES or body_at + length > size:
                rep.reason = f"record at byte {pos} runs past the end of the file"
                rep.truncated = True
                break
            if opcode == OP_CHUNK and not want_messages:
                pos = body_at + length
                rep.last_good_offset = pos
                continue
            body = f.read(length)
            try:
                if opcode == OP_CHUNK:
                    msgs = self._chunk(body, pos, rep)
                    rep.messages += len(msgs)
                    yield from msgs
                elif opcode == OP_MESSAGE:
                    m = self._message(memoryview(body), 0, len(body), pos)
                    if m is not None:
                        rep.messages += 1
                        if want_messages:
                            yield m
                elif opcode == OP_CHANNEL:
                    self._channel(body)
                elif opcode == OP_SCHEMA:
                    self._schema(body)
                elif opcode == OP_HEADER:
                    self._header(body)
                elif opcode == OP_METADATA:
                    b = _Buf(body)
                    name = b.string()
                    values: dict[str, object] = {}
                    for k, v in b.str_map().items():
                        try:
                            values[k] = json.loads(v)
                        except ValueError:
                            values[k] = v
                    meta.setdefault(name, []).append(values)
                elif opcode in (OP_DATA_END, OP_FOOTER):
                    footer = True
                    rep.last_good_offset = body_at + length
                    break
            except (struct.error, UnicodeDecodeError, ValueError) as err:
                rep.reason = f"record at byte {pos} is damaged ({err})"
                rep.complete = False
                pos = body_at + length
                continue
            pos = body_at + length
            rep.last_good_offset = pos
        rep.truncated = rep.truncated or not footer
        if rep.truncated and footer is False and rep.reason is None:
            rep.reason = "no footer"
        rep.complete = footer and self._tail_magic and rep.damaged_chunks == 0 and rep.reason is None
        if footer and not self._tail_magic and rep.reason is None:
            rep.reason = "summary section or footer is damaged"
        rep.skipped_channels = len(self._foreign)
        self.metadata = meta
        self._metadata_scanned = True
        if want_messages:
            self.recovery = rep
        if not self.channels and self.profile is not None and self._foreign:
            raise RecordingError(
                f"{self.path}: MCAP file of profile {self.profile!r} has no msgpack "
                "KV-event channels; not a kvtool recording"
            )

    def _header(self, body: bytes) -> None:
        b = _Buf(body)
        self.profile = b.string()

    def _schema(self, body: bytes | memoryview) -> None:
        b = _Buf(body)
        sid = b.u16()
        self._schemas[sid] = b.string()

    def _channel(self, body: bytes | memoryview) -> None:
        b = _Buf(body)
        cid = b.u16()
        b.u16()  # schema id
        name = b.string()
        encoding = b.string()
        md = b.str_map()
        if cid in self.channels or cid in self._foreign:
            return
        if encoding != fmt.MESSAGE_ENCODING:
            self._foreign.add(cid)
            return
        rank = md.get(fmt.CHANNEL_DP_RANK, "")
        self.channels[cid] = ChannelInfo(
            id=cid,
            name=name,
            endpoint=md.get(fmt.CHANNEL_ENDPOINT, name),
            topic=md.get(fmt.CHANNEL_TOPIC, ""),
            dp_rank=int(rank) if rank.lstrip("-").isdigit() else None,
            path=self.path,
        )

    def _message(
        self, view: memoryview, start: int, end: int, offset: int
    ) -> RecordedMessage | None:
        cid, seq32, log_time, publish_time = _MSG.unpack_from(view, start)
        ch = self.channels.get(cid)
        if ch is None:
            return None
        # Unwrap the 32-bit MCAP sequence: a drop from the top quarter to the bottom
        # quarter is a wrap; any other drop is a publisher restart and resets.
        high, last = self._seq_state.get(cid, (0, -1))
        if last >= 3 << 30 and seq32 < 1 << 30:
            high += 1 << 32
        elif seq32 < last:
            high = 0
        self._seq_state[cid] = (high, seq32)
        return RecordedMessage(
            channel=ch,
            seq=high + seq32,
            log_time=log_time,
            publish_time=publish_time,
            data=bytes(view[start + _MSG.size : end]),
            offset=offset,
        )

    def _chunk(self, body: bytes, offset: int, rep: RecoveryReport) -> list[RecordedMessage]:
        b = _Buf(body)
        _start, _end, usize, crc = _CHUNK.unpack_from(body, 0)
        b.pos = _CHUNK.size
        compression = b.string()
        n = b.u64()
        data = b.raw(n)
        try:
            records = _decompress(compression, data, usize)
            if len(records) != usize or (crc and zlib.crc32(records) != crc):
                raise ValueError("CRC or size mismatch")
        except Exception as err:  # noqa: BLE001 - any decompressor failure is damage
            rep.damaged_chunks += 1
            rep.reason = rep.reason or f"chunk at byte {offset} is damaged ({err})"
            return []
        view = memoryview(records)
        out: list[RecordedMessage] = []
        pos = 0
        total = len(records)
        unpack = _REC.unpack_from
        while pos + _REC.size <= total:
            op, ln = unpack(view, pos)
            start = pos + _REC.size
            end = start + ln
            if end > total:
                break
            if op == OP_MESSAGE:
                m = self._message(view, start, end, offset)
                if m is not None:
                    out.append(m)
            elif op == OP_CHANNEL:
                self._channel(view[start:end])
            elif op == OP_SCHEMA:
                self._schema(view[start:end])
            pos = end
        return out


def open_recording(path: str | os.PathLike[str]) -> RecordingReader:
    """Open a recording for reading, checking identity and format version.

    Args:
        path: The recording.

    Returns:
        A reader; use it as a context manager.

    Raises:
        RecordingError: Not an MCAP file, or cannot be opened.
        UnsupportedVersion: Written by a newer major format version.
    """
    reader = RecordingReader(path)
    version = reader.context.get("format_version", fmt.FORMAT_VERSION)
    if isinstance(version, int) and version > fmt.FORMAT_VERSION:
        reader.close()
        raise UnsupportedVersion(
            f"{reader.path}: recording format version {version} is newer than this "
            f"kvtool reads ({fmt.FORMAT_VERSION}); upgrade kvtool (pip install -U kvtool)"
        )
    return reader
