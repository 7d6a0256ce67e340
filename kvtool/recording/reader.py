"""RecordingReader: reads a kvtool MCAP recording chunk by chunk, damaged or not.

Opening checks identity first (MCAP magic, a Header record of profile ``kvtool``),
then the format version, then the tail (footer, trailing magic, summary CRC and
records). Reading always makes one linear pass over the data section, one record at
a time, so memory is bounded by a chunk and a file whose writer died (no summary, cut
mid-chunk) reads the same way as a finished one. Every length is checked against the
file and :data:`~kvtool.recording.format.MAX_RECORD_BYTES` before anything is read.
Hostile bytes cost no more than their size: a chunk may not state more uncompressed
bytes than :func:`~kvtool.recording.format.chunk_size_limit` allows (a decompression
bomb is refused from its header), its records are read one at a time and its messages
handed out in lists of at most a few hundred, never built for the whole chunk, and
opcode 0 (zero fill) or more records than
:func:`~kvtool.recording.format.chunk_record_limit` allows end the chunk as damage.
The CRC of a chunk is checked once, before any of its records is read.
Only regular files are opened (:func:`check_input`; a FIFO or device is refused before
any ``open``), and a file that shrinks while it is read ends the read as truncated.
The ``kvtool.*`` metadata records are validated into structs
(:mod:`kvtool.recording.ledger`) as they are read; a malformed one is a damaged record.
A chunk that fails to decompress or whose CRC does not match is skipped and counted;
a record whose framing is damaged is skipped by searching forward for the next record
that checks out (a chunk, metadata or message-index record whose inner lengths agree),
and the scan goes on. A :class:`RecoveryReport` says what was read and what was not.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import stat
import struct
from collections.abc import Iterator
from typing import IO

import msgspec
import zstandard

from kvtool.errors import RecordingError, TruncatedRecording
from kvtool.recording import format as fmt
from kvtool.recording.ledger import (
    TYPED_RECORDS,
    GapLedger,
    GroupsRecord,
    RecordingContext,
    parse_record,
)

try:
    # ISA-L's CRC-32 (the same polynomial and result as zlib's) runs at memory speed
    # with carry-less multiplication; zlib 1.2's table walk made the check of every
    # decompressed chunk as costly as decompressing it (issue 10).
    from isal.isal_zlib import crc32 as _crc32
except ImportError:  # pragma: no cover - isal is a dependency; zlib is the fallback
    from zlib import crc32 as _crc32

MAGIC = fmt.MCAP_MAGIC

# MCAP record opcodes (mcap spec, "Records").
OP_HEADER = 0x01
OP_FOOTER = 0x02
OP_SCHEMA = 0x03
OP_CHANNEL = 0x04
OP_MESSAGE = 0x05
OP_CHUNK = 0x06
OP_MESSAGE_INDEX = 0x07
OP_CHUNK_INDEX = 0x08
OP_ATTACHMENT = 0x09
OP_ATTACHMENT_INDEX = 0x0A
OP_STATISTICS = 0x0B
OP_METADATA = 0x0C
OP_METADATA_INDEX = 0x0D
OP_SUMMARY_OFFSET = 0x0E
OP_DATA_END = 0x0F

# Records that may appear in the data section (mcap spec, "Data section").
_DATA_OPS = frozenset(
    {OP_SCHEMA, OP_CHANNEL, OP_MESSAGE, OP_CHUNK, OP_MESSAGE_INDEX, OP_ATTACHMENT, OP_METADATA}
)
# Records that may appear in the summary section.
_SUMMARY_OPS = frozenset(
    {
        OP_SCHEMA,
        OP_CHANNEL,
        OP_CHUNK_INDEX,
        OP_ATTACHMENT_INDEX,
        OP_STATISTICS,
        OP_METADATA_INDEX,
        OP_SUMMARY_OFFSET,
    }
)

_REC = struct.Struct("<BQ")
_MSG = struct.Struct("<HIQQ")
# A message record's header and its fixed fields, read with one unpack.
_MSG_REC = struct.Struct("<BQHIQQ")
_CHUNK = struct.Struct("<QQQI")
_FOOTER = struct.Struct("<BQQQI")
_FOOTER_AT = len(MAGIC) + _FOOTER.size  # footer record + trailing magic
_CHUNK_FIXED = _CHUNK.size + 4 + 8  # + compression length + records length
_DATA_END_LEN = _REC.size + 4
# Candidates for resynchronising after damage: a chunk, metadata or message-index
# opcode followed by a length below 2**32 (its four high bytes zero).
_SYNC = re.compile(rb"[\x06\x07\x0c](?=....\x00\x00\x00\x00)", re.DOTALL)
_SYNC_WINDOW = 1 << 20
# Messages of one chunk handed out together: few enough that memory stays at the chunk's
# bytes plus its messages' bytes, many enough that a report pays per list, not message.
_BATCH = 256
# A drop of the 32-bit MCAP sequence from at least _WRAP_FROM to below _WRAP_TO is a wrap.
_WRAP_FROM = 3 << 30
_WRAP_TO = 1 << 30


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


# Stands for "no channel yet" in the fast path of the chunk reader; never yielded.
_NO_CHANNEL = ChannelInfo(id=-1, name="", endpoint="", topic="", dp_rank=None)


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
        complete: True when the file is intact: data section, summary, footer and
            trailing magic, and no chunk or record was damaged.
        truncated: True when the file ends before its footer (the writer died).
        messages: Messages read back.
        last_good_offset: End of the last record read intact.
        file_size: Size of the file.
        damaged_chunks: Chunks skipped because they failed to decompress or check.
        reason: What went wrong first (truncation or damage), or None.
        skipped_channels: Channels that are not KV-event channels (other encoding or
            schema) and were skipped.
        damaged_records: Other records (or stretches of bytes) skipped as damaged.
        skipped_bytes: Bytes skipped while searching for the next intact record.
        first_damage_offset: File offset of the first damage, or None.
        data_complete: The data section was read to its end with nothing skipped, so
            every message in the file was read (only the index or footer is damaged).
        expected_messages: The message count the file's summary states, when readable.
        skipped_messages: Messages on skipped (foreign) channels.
        unknown_channel_messages: Messages whose channel record was lost; they are
            returned on a placeholder channel.
        seq_first: Seq of the first message read, when all messages are on one channel.
        seq_last: Seq of the last message read, when all are on one channel.
        stop_reason: Why the scan stopped before the data section's end, or None.
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
    damaged_records: int = 0
    skipped_bytes: int = 0
    first_damage_offset: int | None = None
    data_complete: bool = False
    expected_messages: int | None = None
    skipped_messages: int = 0
    unknown_channel_messages: int = 0
    seq_first: int | None = None
    seq_last: int | None = None
    stop_reason: str | None = None

    @property
    def damaged(self) -> bool:
        """True when anything in the file could not be read."""
        return not self.complete

    @property
    def lost_messages(self) -> int | None:
        """Messages the summary counts but the scan did not return, when known."""
        if self.expected_messages is None:
            return None
        return max(0, self.expected_messages - self.messages - self.skipped_messages)

    def summary(self) -> str:
        """One line a person can act on: the file, where it broke, what was recovered.

        Returns:
            ``path: complete, N messages`` or ``path: …; recovered N messages …``.
        """
        if self.complete:
            return f"{self.path}: complete, {_plural(self.messages, 'message')}"
        seqs = ""
        # A seq range reads as "everything in between": only when nothing is missing
        # inside it (a clean prefix, or the whole data section).
        if self.seq_first is not None and self.messages and self.damaged_chunks == 0:
            seqs = f" (seq {self.seq_first}-{self.seq_last})"
        if self.data_complete:
            return (
                f"{self.path}: {self.reason or 'index damaged'}; the data section is intact "
                f"and {'the' if self.messages == 1 else 'all'} "
                f"{_plural(self.messages, 'message')} {'was' if self.messages == 1 else 'were'} "
                f"read{seqs}"
            )
        parts = [f"{self.path}:"]
        if self.truncated:
            parts.append(
                f"recording is truncated at byte {self.last_good_offset} of {self.file_size}"
                f" ({self.stop_reason or self.reason or 'no footer'});"
            )
            if self.damaged_chunks or self.damaged_records:
                parts.append(f"{self._damage_text()} before that;")
        else:
            parts.append(f"{self._damage_text()} (first: {self.reason});")
        lost = self.lost_messages
        if lost is not None:
            parts.append(
                f"recovered {self.messages} of {_plural(self.expected_messages or 0, 'message')}"
                f"{seqs};"
            )
            parts.append(f"{lost} lost" if lost else "none lost")
        elif self.truncated:
            parts.append(f"recovered {_plural(self.messages, 'message')}{seqs}; the rest is lost")
        else:
            parts.append(
                f"recovered {_plural(self.messages, 'message')}{seqs}; the messages in the "
                "damaged part are lost"
            )
        return " ".join(parts)

    def _damage_text(self) -> str:
        bits = []
        if self.damaged_chunks:
            bits.append(_plural(self.damaged_chunks, "damaged chunk"))
        if self.damaged_records:
            bits.append(_plural(self.damaged_records, "damaged record"))
        text = " and ".join(bits) or "damaged data"
        if self.skipped_bytes:
            text += f" ({self.skipped_bytes} bytes) skipped"
        else:
            text += " skipped"
        return text


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


class _Damage(Exception):
    """A record that cannot be read; ``end`` is where it ends when its framing is sound."""

    def __init__(self, reason: str, end: int | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.end = end


class _Shrunk(Exception):
    """The file is shorter than when it was opened: another program truncated it."""

    def __init__(self, pos: int) -> None:
        super().__init__(f"file shrank while being read (a read at byte {pos} came back short)")
        self.pos = pos


_RANK = re.compile(r"-?[0-9]{1,18}")
_KINDS = (
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def _not_regular(path: str, mode: int) -> RecordingError:
    if stat.S_ISDIR(mode):
        return RecordingError(f"{path}: is a directory, not a recording")
    kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
    return RecordingError(
        f"{path}: is {kind}, not a regular file; kvtool reads recordings only from regular "
        "files (copy the data to a file first)"
    )


def check_input(path: str | os.PathLike[str]) -> str:
    """Refuse an input that is not a regular file, before anything opens it.

    Every command that reads a file calls this first: opening a FIFO blocks until a
    writer appears, and a device such as ``/dev/zero`` never ends. Only ``os.stat``
    runs here, which neither blocks nor reads.

    Args:
        path: The input as the user gave it.

    Returns:
        The path as a string.

    Raises:
        RecordingError: The path does not exist, cannot be examined, or is a
            directory, FIFO, device or socket.
    """
    p = os.fspath(path)
    try:
        st = os.stat(p)
    except OSError as err:
        raise RecordingError(f"{p}: cannot open: {err.strerror or err}") from err
    if not stat.S_ISREG(st.st_mode):
        raise _not_regular(p, st.st_mode)
    return p


def _open_regular(path: str) -> IO[bytes]:
    """Open ``path`` for reading only if it is a regular file, without ever blocking.

    ``O_NONBLOCK`` keeps a FIFO swapped in after :func:`check_input` from hanging the
    open; ``fstat`` on the opened descriptor then decides.
    """
    check_input(path)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as err:
        raise RecordingError(f"{path}: cannot open: {err.strerror or err}") from err
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _not_regular(path, st.st_mode)
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _parse_rank(value: str) -> int | None:
    """A data-parallel rank from channel metadata: ASCII digits only, else None."""
    # str.isdigit() accepts "²" and other digits int() refuses (issue 8.14).
    return int(value) if _RANK.fullmatch(value) else None


class _Buf:
    """Little-endian field reader over one record body; every length is bounds-checked."""

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
        n = self.u32()
        if n > fmt.MAX_STRING_BYTES:
            raise struct.error(f"string of {n} bytes is too long")
        return self.raw(n).decode("utf-8")

    def str_map(self) -> dict[str, str]:
        n = self.u32()
        end = self.pos + n
        if end > len(self.data):
            raise struct.error("map runs past the end of its record")
        out: dict[str, str] = {}
        while self.pos < end:
            k = self.string()
            out[k] = self.string()
        if self.pos != end:
            raise struct.error("map entries overrun the map's length")
        return out


def _decompress(
    compression: str, data: bytes, size: int, zstd: zstandard.ZstdDecompressor | None = None
) -> bytes:
    """Decompress one chunk, never producing more than ``size + 1`` bytes.

    Args:
        compression: The chunk's compression.
        data: The stored records.
        size: The uncompressed size the chunk states.
        zstd: A decompressor to reuse (one per reader; a new one otherwise).
    """
    if compression == "":
        return data
    if compression == "zstd":
        if zstd is None:
            zstd = zstandard.ZstdDecompressor()
        try:
            # A frame that states the chunk's (bounded) size is decompressed in one
            # call into a buffer of that size; anything else, and any failure, takes
            # the streaming read below, which says what is wrong.
            if zstandard.frame_content_size(data) == size:
                out = zstd.decompress(data)
                if len(out) == size:
                    return out
        except zstandard.ZstdError:
            pass
        # A streaming read bounded by the chunk's stated size: a damaged frame header
        # cannot make us allocate what it claims.
        with zstd.stream_reader(data) as reader:
            out = reader.read(size + 1)
        return bytes(out)
    if compression == "lz4":
        import lz4.frame  # type: ignore[import-untyped]

        dec = lz4.frame.LZ4FrameDecompressor()
        return bytes(dec.decompress(data, max_length=size + 1))
    raise ValueError(f"unsupported chunk compression {compression!r}")


def _decode_meta_value(v: str) -> object:
    try:
        return json.loads(v)
    except RecursionError:
        # JSON nested deeper than Python's stack: the record is damage, not a crash.
        raise ValueError("metadata value is nested too deeply") from None
    except ValueError:
        return v


class RecordingReader:
    """Reads one recording. Iterate :meth:`messages`; then :attr:`recovery` is final.

    Args:
        path: The recording.

    Raises:
        RecordingError: The file cannot be opened, is empty, is not MCAP, or is an
            MCAP file of another profile.
        TruncatedRecording: The file ends before its MCAP header (nothing to read).
        UnsupportedVersion: The recording was written by a newer kvtool format.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._file: IO[bytes] = _open_regular(self.path)
        self._size = os.fstat(self._file.fileno()).st_size
        self.profile: str | None = None
        self.library: str | None = None
        self.channels: dict[int, ChannelInfo] = {}
        self._foreign: set[int] = set()
        self._placeholders: set[int] = set()
        self._schemas: dict[int, str] = {}
        self._seq_state: dict[int, tuple[int, int]] = {}
        self.metadata: dict[str, list[dict[str, object]]] = {}
        self._typed: dict[str, list[msgspec.Struct]] = {}
        self.recovery = RecoveryReport(path=self.path, file_size=self._size)
        self._metadata_scanned = False
        self._data_start = len(MAGIC)
        self._tail_ok = False
        self._tail_reason: str | None = None
        self._data_limit = self._size
        self._expected: int | None = None
        self._unknown_messages = 0
        self._foreign_messages = 0
        self._chunked = False
        self._zstd: zstandard.ZstdDecompressor | None = None
        try:
            self._check_identity()
            self._read_tail()
            self._check_version()
        except _Shrunk as err:
            self._file.close()
            raise RecordingError(
                f"{self.path}: {err} (it had {self._size} bytes); another program is "
                "truncating it; read it again when that is done"
            ) from None
        except BaseException:
            self._file.close()
            raise

    def __enter__(self) -> RecordingReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the file."""
        self._file.close()

    # -- opening ----------------------------------------------------------------------

    def _pread(self, pos: int, n: int) -> bytes:
        try:
            self._file.seek(pos)
            out = self._file.read(n)
        except OSError as err:
            raise RecordingError(
                f"{self.path}: read failed at byte {pos}: {err.strerror or err}"
            ) from err
        if len(out) < n and pos + len(out) < self._size:
            # Shorter than the size stat gave at open: the file shrank under us.
            raise _Shrunk(pos)
        return out

    def _check_identity(self) -> None:
        """Magic at byte 0, then a Header record of profile ``kvtool``."""
        size = self._size
        if size == 0:
            raise TruncatedRecording(
                f"{self.path}: recording is truncated at byte 0 (the file is empty); "
                "nothing to recover"
            )
        head = self._pread(0, len(MAGIC))
        if head != MAGIC:
            if size < len(MAGIC) and MAGIC.startswith(head):
                raise TruncatedRecording(
                    f"{self.path}: recording is truncated at byte {size}, inside its MCAP "
                    "magic; nothing to recover"
                )
            raise RecordingError(
                f"{self.path}: not an MCAP file (starts with {head[:8]!r}, not the MCAP "
                "magic); kvtool reads recordings written by `kvtool record`"
            )
        raw = self._pread(len(MAGIC), _REC.size)
        if len(raw) < _REC.size:
            raise TruncatedRecording(
                f"{self.path}: recording is truncated at byte {size}, before its MCAP "
                "header; nothing to recover"
            )
        op, ln = _REC.unpack(raw)
        if op != OP_HEADER:
            raise RecordingError(
                f"{self.path}: not a valid MCAP file (the record at byte 8 has opcode "
                f"0x{op:02x}, not a Header); the file is damaged at its start"
            )
        if ln > fmt.MAX_RECORD_BYTES or len(MAGIC) + _REC.size + ln > size:
            if len(MAGIC) + _REC.size + ln > size and ln <= fmt.MAX_RECORD_BYTES:
                raise TruncatedRecording(
                    f"{self.path}: recording is truncated at byte {size}, inside its MCAP "
                    "header; nothing to recover"
                )
            raise RecordingError(
                f"{self.path}: MCAP header at byte 8 has an impossible length {ln}; "
                "the file is damaged at its start"
            )
        try:
            b = _Buf(self._pread(len(MAGIC) + _REC.size, ln))
            self.profile = b.string()
            self.library = b.string()
        except (struct.error, UnicodeDecodeError) as err:
            raise RecordingError(f"{self.path}: MCAP header at byte 8 is damaged ({err})") from err
        self._data_start = len(MAGIC) + _REC.size + ln
        if self.profile != fmt.PROFILE:
            what = f"of profile {self.profile!r}" if self.profile else "without a profile"
            raise RecordingError(
                f"{self.path}: MCAP file {what} (written by {self.library!r}), not a kvtool "
                f"recording (profile {fmt.PROFILE!r}); read it with a tool for its profile, "
                "e.g. `mcap info`"
            )

    def _read_tail(self) -> None:
        """Check footer, trailing magic and summary; learn channels and counts from it."""
        size = self._size
        footer_pos = size - _FOOTER_AT
        if footer_pos < self._data_start or self._pread(size - len(MAGIC), 8) != MAGIC:
            self._tail_reason = "no footer"
            return
        op, ln, summary_start, summary_offset_start, crc = _FOOTER.unpack(
            self._pread(footer_pos, _FOOTER.size)
        )
        if op != OP_FOOTER or ln != _FOOTER.size - _REC.size:
            self._tail_reason = f"footer at byte {footer_pos} is damaged"
            return
        if summary_start != 0 and (
            not self._data_start <= summary_start <= footer_pos
            or not (
                summary_offset_start == 0 or summary_start <= summary_offset_start <= footer_pos
            )
        ):
            self._tail_reason = f"footer at byte {footer_pos} points outside the file"
            return
        section = summary_start or footer_pos
        if section < self._data_start + _DATA_END_LEN or self._pread(
            section - _DATA_END_LEN, _REC.size
        ) != _REC.pack(OP_DATA_END, 4):
            self._tail_reason = (
                f"footer at byte {footer_pos} does not point at the end of the data section"
            )
            return
        if summary_start == 0:
            self._tail_ok = True
            self._data_limit = footer_pos
            return
        self._data_limit = summary_start
        self._tail_ok = True
        body = self._pread(summary_start, footer_pos + _FOOTER.size - 4 - summary_start)
        if crc and _crc32(body) != crc:
            self._tail_reason = f"summary section at byte {summary_start} is damaged (CRC mismatch)"
        summary = memoryview(body)[: footer_pos - summary_start]
        pos = 0
        try:
            while pos < len(summary):
                sop, sln = _REC.unpack_from(summary, pos)
                start = pos + _REC.size
                end = start + sln
                if sop not in _SUMMARY_OPS or end > len(summary):
                    raise struct.error(
                        f"bad record (opcode 0x{sop:02x}) at byte {summary_start + pos}"
                    )
                if self._tail_reason is None:
                    # Trust the summary's records only when its CRC checked out.
                    if sop == OP_SCHEMA:
                        self._schema(summary[start:end])
                    elif sop == OP_CHANNEL:
                        self._channel(summary[start:end])
                    elif sop == OP_CHUNK_INDEX:
                        self._chunked = True
                    elif sop == OP_STATISTICS:
                        (self._expected,) = struct.unpack_from("<Q", summary, start)
                pos = end
        except (struct.error, UnicodeDecodeError) as err:
            self._tail_reason = self._tail_reason or (
                f"summary section at byte {summary_start} is damaged ({err})"
            )
        if self._tail_reason is not None:
            # An index that fails its check bounds nothing: scan to the data end record.
            self._expected = None
            self._tail_ok = False
            self._data_limit = self._size

    def _check_version(self) -> None:
        """Find the ``kvtool.recording`` record near the start and check its version."""
        pos = self._data_start
        for _ in range(16):
            raw = self._pread(pos, _REC.size)
            if len(raw) < _REC.size:
                break
            op, ln = _REC.unpack(raw)
            if op not in _DATA_OPS or pos + _REC.size + ln > self._size:
                break
            if op == OP_METADATA:
                try:
                    name, values = self._metadata(self._pread(pos + _REC.size, ln))
                except (struct.error, UnicodeDecodeError, ValueError):
                    break
                if name == fmt.META_RECORDING:
                    if "format_version" in values:
                        self._check_version_value(values["format_version"])
                    return
            pos += _REC.size + ln
        # Not where the writer puts it: look through all metadata records.
        ctx = self.context
        if "format_version" in ctx:
            self._check_version_value(ctx["format_version"])

    def _check_version_value(self, value: object) -> None:
        try:
            fmt.parse_format_version(self.path, value)
        except RecordingError:
            # A damaged value in an otherwise readable record: read the file as the
            # current version rather than refuse every intact message in it.
            return
        fmt.check_format_version(self.path, value)

    # -- metadata ---------------------------------------------------------------------

    def read_metadata(self) -> dict[str, list[dict[str, object]]]:
        """Return every metadata record, name → list of decoded dicts (JSON values).

        Only record headers are read; chunk bodies are skipped over, so this is cheap
        even for a large file.

        Returns:
            The metadata records by name, in file order.
        """
        if not self._metadata_scanned:
            for _ in self._scan(want_messages=False):
                pass
        return self.metadata

    @property
    def context(self) -> dict[str, object]:
        """The ``kvtool.recording`` record's values (empty when absent or malformed)."""
        recs = self.read_metadata().get(fmt.META_RECORDING, [])
        return recs[0] if recs else {}

    @property
    def recording_context(self) -> RecordingContext | None:
        """The ``kvtool.recording`` record, typed; None when absent or malformed."""
        recs = self._typed_records(fmt.META_RECORDING)
        return recs[0] if recs and isinstance(recs[0], RecordingContext) else None

    @property
    def group_records(self) -> list[GroupsRecord]:
        """Every well-formed ``kvtool.groups`` record, in file order."""
        return [r for r in self._typed_records(fmt.META_GROUPS) if isinstance(r, GroupsRecord)]

    @property
    def groups(self) -> list[dict[str, object]] | None:
        """The stored KV cache group metadata for all channels, or None."""
        for rec in self.group_records:
            if rec.channel is None:
                return rec.metadata_list()
        return None

    @property
    def gap_ledger(self) -> GapLedger | None:
        """The gap ledger written at close, typed; None when the writer died or wrote none."""
        recs = self._typed_records(fmt.META_GAPS)
        return recs[-1] if recs and isinstance(recs[-1], GapLedger) else None

    @property
    def ledger(self) -> dict[str, object] | None:
        """The gap ledger as JSON data (see :attr:`gap_ledger`), or None."""
        ledger = self.gap_ledger
        return None if ledger is None else ledger.to_json()

    def _typed_records(self, name: str) -> list[msgspec.Struct]:
        self.read_metadata()
        return self._typed.get(name, [])

    # -- messages ---------------------------------------------------------------------

    def summary_channels(self) -> list[ChannelInfo]:
        """The channels a complete recording's summary lists (read at open, no scan).

        Returns:
            The channels; empty when the summary is missing or damaged (then only a scan
            finds them).
        """
        if not self._tail_ok or self._tail_reason is not None:
            return []
        return list(self.channels.values())

    def messages(self) -> Iterator[RecordedMessage]:
        """Yield every intact message in file order, then finalise :attr:`recovery`.

        Returns:
            An iterator of one :class:`RecordedMessage` per recorded ZeroMQ message.
        """
        # The scan's lists, flattened in C: no generator frame per message (the scan
        # clears the seq state when it starts, as a read begins).
        return itertools.chain.from_iterable(self._scan(want_messages=True))

    def message_batches(self) -> Iterator[list[RecordedMessage]]:
        """Yield every intact message in file order, in lists; then finalise :attr:`recovery`.

        The same messages as :meth:`messages`, for a reader that handles them a list
        at a time. A list never spans two chunks (its messages share ``offset``) and
        holds at most a few hundred messages, so memory stays bounded by a chunk.

        Returns:
            An iterator of lists of :class:`RecordedMessage`, none empty.
        """
        return self._scan(want_messages=True)

    def __iter__(self) -> Iterator[RecordedMessage]:
        return self.messages()

    def _damage(self, rep: RecoveryReport, pos: int, reason: str, *, chunk: bool) -> None:
        if chunk:
            rep.damaged_chunks += 1
        else:
            rep.damaged_records += 1
        if rep.first_damage_offset is None:
            rep.first_damage_offset = pos
        if rep.reason is None:
            rep.reason = reason

    def _scan(self, *, want_messages: bool) -> Iterator[list[RecordedMessage]]:
        if want_messages:
            self._seq_state.clear()
        size = self._size
        limit = self._data_limit
        rep = RecoveryReport(path=self.path, file_size=size)
        rep.expected_messages = self._expected
        meta: dict[str, list[dict[str, object]]] = {}
        typed: dict[str, list[msgspec.Struct]] = {}
        pos = self._data_start
        rep.last_good_offset = pos
        data_end = False
        channels_seen: set[int] = set()
        self._unknown_messages = self._foreign_messages = 0
        shrunk = False
        try:
            while True:
                if pos + _REC.size > limit:
                    if pos == size:
                        rep.stop_reason = "file ends before its footer"
                    elif pos < limit:
                        rep.stop_reason = f"file ends mid-record at byte {pos}"
                    else:
                        rep.stop_reason = "data section has no end record"
                    rep.reason = rep.reason or rep.stop_reason
                    break
                op, ln = _REC.unpack(self._pread(pos, _REC.size))
                body_at = pos + _REC.size
                if op == OP_DATA_END and ln == 4:
                    data_end = True
                    rep.last_good_offset = body_at + ln
                    break
                end: int | None = body_at + ln
                try:
                    if op == OP_CHUNK:
                        self._chunked = True
                        view, true_end, mismatch, stored = self._open_chunk(
                            pos, ln, limit, want=want_messages
                        )
                        end = true_end
                        if mismatch:
                            self._damage(
                                rep,
                                pos,
                                f"chunk at byte {pos} has a damaged length field",
                                chunk=False,
                            )
                        if view is not None:
                            # Streamed: at most _BATCH of a chunk's messages exist at once.
                            yield from self._chunk_messages(
                                view, pos, true_end, stored, rep, channels_seen
                            )
                            del view
                        pos = true_end
                        rep.last_good_offset = pos
                        continue
                    if ln > fmt.MAX_RECORD_BYTES or body_at + ln > limit:
                        raise _Damage(f"record at byte {pos} runs past the end of the file")
                    if op not in _DATA_OPS:
                        raise _Damage(
                            f"record at byte {pos} has an unexpected opcode 0x{op:02x}", end
                        )
                    body = self._pread(body_at, ln)
                    if op == OP_METADATA:
                        name, values = self._metadata(body)
                        if name in TYPED_RECORDS:
                            # Validated here, once: a malformed record is damage
                            # (ValueError below) and no accessor ever sees it.
                            rec = parse_record(name, values)
                            assert rec is not None
                            typed.setdefault(name, []).append(rec)
                        meta.setdefault(name, []).append(values)
                        if name == fmt.META_CHANNEL:
                            self._channel_note(values)
                        elif name == fmt.META_SEQ and want_messages:
                            self._seq_note(values)
                    elif op == OP_MESSAGE:
                        if self._chunked:
                            raise _Damage(f"message record outside a chunk at byte {pos}", end)
                        if want_messages:
                            one = self._message(memoryview(body), 0, len(body), pos)
                            if one is not None:
                                rep.messages += 1
                                channels_seen.add(one.channel.id)
                                if rep.seq_first is None:
                                    rep.seq_first = one.seq
                                rep.seq_last = one.seq
                                yield [one]
                    elif op == OP_CHANNEL:
                        self._channel(body)
                    elif op == OP_SCHEMA:
                        self._schema(body)
                    elif op == OP_MESSAGE_INDEX and not self._valid_message_index(ln, body):
                        raise _Damage(f"message index at byte {pos} is damaged", body_at + ln)
                except (_Damage, struct.error, UnicodeDecodeError, ValueError) as err:
                    damage = (
                        err
                        if isinstance(err, _Damage)
                        else _Damage(f"record at byte {pos} is damaged ({err})", end)
                    )
                    is_chunk = op == OP_CHUNK and damage.end is not None
                    nxt = (
                        damage.end
                        if damage.end is not None and self._plausible(damage.end)
                        else None
                    )
                    if nxt is None:
                        nxt = self._resync(pos + 1, limit)
                    if nxt is None:
                        if not self._tail_ok:
                            # Nothing intact follows and the file has no footer: the writer
                            # died while writing this record.
                            rep.truncated = True
                            rep.stop_reason = (
                                f"file ends mid-record at byte {pos}"
                                if op in _DATA_OPS
                                else f"record at byte {pos} is damaged and nothing intact follows"
                            )
                            rep.reason = rep.reason or rep.stop_reason
                            if op not in _DATA_OPS or is_chunk:
                                self._damage(rep, pos, damage.reason, chunk=is_chunk)
                            break
                        self._damage(rep, pos, damage.reason, chunk=is_chunk)
                        rep.skipped_bytes += limit - pos
                        pos = limit
                        continue
                    self._damage(rep, pos, damage.reason, chunk=is_chunk)
                    if damage.end is None or nxt != damage.end:
                        rep.skipped_bytes += nxt - pos
                    pos = nxt
                    continue
                assert end is not None
                pos = end
                rep.last_good_offset = pos
        except _Shrunk as err:
            # Another program truncated the file mid-read: what was read is kept.
            shrunk = True
            rep.stop_reason = f"{err}; it had {size} bytes at open"
            rep.reason = rep.reason or rep.stop_reason
        # Truncated: the file ends before its footer, whether or not data was lost.
        rep.truncated = (
            shrunk or (not data_end and not self._tail_ok) or self._tail_reason == "no footer"
        )
        if not data_end and self._tail_ok and rep.damaged_chunks + rep.damaged_records == 0:
            self._damage(rep, pos, rep.reason or "data section has no end record", chunk=False)
        rep.unknown_channel_messages = self._unknown_messages
        rep.skipped_messages = self._foreign_messages
        clean = rep.damaged_chunks == 0 and rep.damaged_records == 0
        rep.data_complete = data_end and clean
        if data_end and not self._tail_ok:
            rep.reason = rep.reason or (
                "file ends after its data section; its summary and footer are missing"
                if self._tail_reason == "no footer"
                else self._tail_reason
            )
        elif data_end and self._tail_reason is not None:
            rep.reason = rep.reason or self._tail_reason
        rep.complete = rep.data_complete and self._tail_ok and self._tail_reason is None
        if rep.complete:
            rep.reason = None
        rep.skipped_channels = len(self._foreign)
        if len(channels_seen) > 1:
            rep.seq_first = rep.seq_last = None
        self.metadata = meta
        self._typed = typed
        self._metadata_scanned = True
        if want_messages:
            self.recovery = rep

    # -- resynchronisation --------------------------------------------------------------

    def _plausible(self, pos: int) -> bool:
        """True when an intact-looking record (or the end of the data) starts at ``pos``."""
        if pos == self._data_limit or pos == self._size:
            return True
        raw = self._pread(pos, _REC.size)
        if len(raw) < _REC.size:
            return False
        op, ln = _REC.unpack(raw)
        if op == OP_DATA_END:
            return bool(ln == 4)
        if op in (OP_CHUNK, OP_METADATA, OP_MESSAGE_INDEX):
            return self._strong(pos, op, ln)
        if pos + _REC.size + ln > self._data_limit:
            return False
        if op == OP_MESSAGE:
            # Messages outside chunks only in an unchunked file (no CRC protects them).
            return not self._chunked and ln >= _MSG.size
        if op in (OP_SCHEMA, OP_CHANNEL) and ln <= fmt.MAX_STRING_BYTES:
            try:
                b = _Buf(self._pread(pos + _REC.size, ln))
                b.u16()
                if op == OP_SCHEMA:
                    b.string()
                    b.string()
                    b.raw(b.u32())
                else:
                    b.u16()
                    b.string()
                    b.string()
                    b.str_map()
                return bool(b.pos == ln)
            except (struct.error, UnicodeDecodeError):
                return False
        return False

    def _strong(self, pos: int, op: int, ln: int) -> bool:
        """Check a chunk/metadata/message-index record's inner lengths against its length."""
        body_at = pos + _REC.size
        if ln > fmt.MAX_RECORD_BYTES or body_at + ln > self._data_limit:
            return False
        if op == OP_CHUNK:
            if ln < _CHUNK_FIXED:
                return False
            head = self._pread(body_at, _CHUNK.size + 4)
            start, end_t, usize, _crc = _CHUNK.unpack_from(head)
            (clen,) = struct.unpack_from("<I", head, _CHUNK.size)
            if clen > 16 or start > end_t or usize > fmt.MAX_RECORD_BYTES:
                return False
            rest = self._pread(body_at + _CHUNK.size + 4, clen + 8)
            if len(rest) < clen + 8 or rest[:clen].decode("latin-1") not in fmt.COMPRESSIONS:
                return False
            (n,) = struct.unpack_from("<Q", rest, clen)
            return bool(_CHUNK_FIXED + clen + n == ln)
        if op == OP_METADATA:
            if ln < 8:
                return False
            (nlen,) = struct.unpack_from("<I", self._pread(body_at, 4))
            if 4 + nlen + 4 > ln:
                return False
            raw = self._pread(body_at + 4 + nlen, 4)
            (mlen,) = struct.unpack_from("<I", raw)
            return bool(4 + nlen + 4 + mlen == ln)
        if op == OP_MESSAGE_INDEX:
            if ln < 6:
                return False
            head = self._pread(body_at, 6)
            (alen,) = struct.unpack_from("<I", head, 2)
            return bool(6 + alen == ln and alen % 16 == 0)
        return False

    def _resync(self, start: int, limit: int) -> int | None:
        """Find the next intact-looking record at or after ``start``, before ``limit``."""
        pos = start
        while pos < limit:
            window = self._pread(pos, min(_SYNC_WINDOW + 16, limit - pos))
            # The window overlaps the next by 16 bytes so that a candidate's lookahead
            # never ends at the window's edge; candidates there are taken next time.
            for m in _SYNC.finditer(window):
                if m.start() >= _SYNC_WINDOW:
                    break
                cand = pos + m.start()
                op, ln = _REC.unpack(self._pread(cand, _REC.size))
                if self._strong(cand, op, ln):
                    return cand
            pos += _SYNC_WINDOW
        # The data section's end record sits right before the summary.
        if self._tail_ok:
            cand = limit - _DATA_END_LEN
            if cand >= start and self._pread(cand, _DATA_END_LEN)[: _REC.size] == _REC.pack(
                OP_DATA_END, 4
            ):
                return cand
        return None

    # -- records ------------------------------------------------------------------------

    def _metadata(self, body: bytes | memoryview) -> tuple[str, dict[str, object]]:
        b = _Buf(body)
        name = b.string()
        values = {k: _decode_meta_value(v) for k, v in b.str_map().items()}
        if b.pos != len(body):
            raise struct.error("metadata record has bytes after its map")
        return name, values

    @staticmethod
    def _valid_message_index(ln: int, body: bytes) -> bool:
        if ln < 6:
            return False
        (alen,) = struct.unpack_from("<I", body, 2)
        return bool(6 + alen == ln and alen % 16 == 0)

    def _schema(self, body: bytes | memoryview) -> None:
        b = _Buf(body)
        sid = b.u16()
        self._schemas[sid] = b.string()

    def _channel(self, body: bytes | memoryview) -> None:
        b = _Buf(body)
        cid = b.u16()
        sid = b.u16()
        name = b.string()
        encoding = b.string()
        md = b.str_map()
        if cid in self.channels or cid in self._foreign:
            return
        schema = self._schemas.get(sid)
        if encoding != fmt.MESSAGE_ENCODING or (schema is not None and schema != fmt.SCHEMA_NAME):
            self._foreign.add(cid)
            return
        self._define(
            cid,
            name,
            md.get(fmt.CHANNEL_ENDPOINT, name),
            md.get(fmt.CHANNEL_TOPIC, ""),
            md.get(fmt.CHANNEL_DP_RANK, ""),
        )

    def _channel_note(self, values: dict[str, object]) -> None:
        cid = values.get("id")
        if not isinstance(cid, int) or cid in self.channels or cid in self._foreign:
            return
        name = str(values.get("name", f"channel {cid}"))
        rank = values.get("dp_rank")
        self._define(
            cid,
            name,
            str(values.get("endpoint", name)),
            str(values.get("topic", "")),
            "" if rank is None else str(rank),
        )

    def _define(self, cid: int, name: str, endpoint: str, topic: str, rank: str) -> None:
        self.channels[cid] = ChannelInfo(
            id=cid,
            name=name,
            endpoint=endpoint,
            topic=topic,
            dp_rank=_parse_rank(rank),
            path=self.path,
        )

    def _seq_note(self, values: dict[str, object]) -> None:
        cid, seq = values.get("channel"), values.get("seq")
        if isinstance(cid, int) and isinstance(seq, int) and seq >= 0:
            # The next message on this channel carries these high bits; no wrap
            # heuristic applies to it.
            self._seq_state[cid] = (seq - (seq & fmt.SEQ_MASK), -1)

    def _message(
        self, view: bytes | memoryview, start: int, end: int, offset: int
    ) -> RecordedMessage | None:
        if end - start < _MSG.size:
            raise struct.error("message record is shorter than its header")
        cid, seq32, log_time, publish_time = _MSG.unpack_from(view, start)
        ch = self.channels.get(cid)
        if ch is None:
            if cid in self._foreign:
                self._foreign_messages += 1
                return None
            # Its channel record was lost with a damaged chunk: keep the message.
            ch = ChannelInfo(
                id=cid,
                name=f"channel {cid}",
                endpoint=f"unknown (channel {cid})",
                topic="",
                dp_rank=None,
                path=self.path,
            )
            self.channels[cid] = ch
            self._placeholders.add(cid)
        if cid in self._placeholders:
            self._unknown_messages += 1
        # Unwrap the 32-bit MCAP sequence. The writer leaves a kvtool.seq note before
        # any change of the high bits or restart; without one (another writer), a drop
        # from the top quarter to the bottom quarter is a wrap and any other drop a
        # publisher restart, which starts again from 0.
        high, last = self._seq_state.get(cid, (0, -1))
        if last >= _WRAP_FROM and seq32 < _WRAP_TO:
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

    def _open_chunk(
        self, pos: int, ln: int, limit: int, *, want: bool
    ) -> tuple[bytes | None, int, bool, int]:
        """Check the chunk at ``pos`` and decompress its records.

        Returns:
            The records (None unless ``want``), the chunk's end, a flag set when the
            record length disagrees with the chunk's inner lengths (one of them is
            damaged), and the chunk's stored records length.
        """
        body_at = pos + _REC.size
        head = self._pread(body_at, _CHUNK.size + 4 + 16 + 8)
        if len(head) < _CHUNK.size + 4:
            raise _Damage(f"chunk at byte {pos} runs past the end of the file")
        _start, _end, usize, crc = _CHUNK.unpack_from(head)
        (clen,) = struct.unpack_from("<I", head, _CHUNK.size)
        if clen > 16 or len(head) < _CHUNK.size + 4 + clen + 8:
            raise _Damage(f"chunk at byte {pos} has a damaged header")
        try:
            compression = head[_CHUNK.size + 4 : _CHUNK.size + 4 + clen].decode("ascii")
        except UnicodeDecodeError:
            raise _Damage(f"chunk at byte {pos} has a damaged header") from None
        (n,) = struct.unpack_from("<Q", head, _CHUNK.size + 4 + clen)
        true_end = body_at + _CHUNK_FIXED + clen + n
        outer_end = body_at + ln
        mismatch = true_end != outer_end
        if mismatch:
            # The record length and the records length disagree: follow whichever one
            # leads to an intact-looking next record.
            outer_n = ln - _CHUNK_FIXED - clen
            if outer_end <= limit and outer_n >= 0 and self._plausible(outer_end):
                n, true_end = outer_n, outer_end
            elif true_end > limit or not self._plausible(true_end):
                raise _Damage(
                    f"chunk at byte {pos} runs past the end of the file"
                    if outer_end > limit and true_end > limit
                    else f"chunk at byte {pos} has a damaged length"
                )
        if true_end > limit or n > fmt.MAX_RECORD_BYTES:
            raise _Damage(f"chunk at byte {pos} runs past the end of the file")
        if compression not in fmt.COMPRESSIONS:
            raise _Damage(
                f"chunk at byte {pos} uses compression {compression!r}, which this kvtool "
                "cannot read",
                true_end,
            )
        # Bound what decompression may produce before producing any of it: a few
        # kilobytes of zstd can claim gigabytes of zeros (issue 8.10).
        if usize > fmt.chunk_size_limit(compression, n):
            raise _Damage(
                f"chunk at byte {pos} states {usize} uncompressed bytes from {n} stored "
                f"(more than {fmt.chunk_size_limit(compression, n)} allowed); skipped as a "
                "decompression bomb",
                true_end,
            )
        if not want:
            return None, true_end, mismatch, n
        data = self._pread(body_at + _CHUNK_FIXED + clen, n)
        if compression == "zstd" and self._zstd is None:
            self._zstd = zstandard.ZstdDecompressor()
        try:
            records = _decompress(compression, data, usize, self._zstd)
        except Exception as err:  # any decompressor failure is damage
            raise _Damage(
                f"chunk at byte {pos} does not decompress ({type(err).__name__}: {err})",
                true_end,
            ) from None
        if len(records) != usize:
            raise _Damage(f"chunk at byte {pos} decompresses to the wrong size", true_end)
        # Checked once, here, before any of the chunk's records is read.
        if crc and _crc32(records) != crc:
            raise _Damage(f"chunk at byte {pos} fails its CRC check", true_end)
        return records, true_end, mismatch, n

    def _chunk_messages(
        self,
        records: bytes,
        pos: int,
        end: int,
        stored: int,
        rep: RecoveryReport,
        seen: set[int],
    ) -> Iterator[list[RecordedMessage]]:
        """Yield the messages of one decompressed chunk in lists, one record at a time.

        Nothing is built for the whole chunk: a list holds at most :data:`_BATCH`
        messages, so memory stays at the chunk's bytes plus a part of its messages (a
        list of them never holds more bytes than the chunk). Zero bytes where a record
        should start, a record that runs past the chunk, or more records than the
        chunk's stored size allows (:func:`~kvtool.recording.format.chunk_record_limit`)
        end the chunk as damage after the messages before it were yielded. The messages
        yielded are counted in ``rep`` (count, first and last seq) and their channels
        added to ``seen``.

        A message record that is whole, within the record budget and on a channel
        already defined takes a fast path (one unpack, the channel's seq state held in
        locals); every other record takes the general path, which makes every check in
        its order. Both do the same to a record that the fast path takes.

        Raises:
            _Damage: The chunk's records are damaged from some point on.
        """
        rpos = 0
        total = len(records)
        unpack = _REC.unpack_from
        unpack_msg = _MSG_REC.unpack_from
        head = _MSG_REC.size
        budget = fmt.chunk_record_limit(stored)
        count = 0
        fast_end = total - head
        channels = self.channels
        placeholders = self._placeholders
        seq_state = self._seq_state
        # The channel whose seq unwrap state is held in (high, last) instead of
        # seq_state; -1 for none. Written back before the general path runs.
        cur = -1
        cur_ch = _NO_CHANNEL
        high, last = 0, -1
        n = first = seq = 0
        out: list[RecordedMessage] = []
        put = out.append
        flush_at = _BATCH
        try:
            while rpos < total:
                if rpos <= fast_end and count < budget:
                    op, rln, cid, seq32, log_time, publish_time = unpack_msg(records, rpos)
                    rend = rpos + _REC.size + rln
                    if op == OP_MESSAGE and rln >= _MSG.size and rend <= total:
                        if cid != cur:
                            if cur >= 0:
                                seq_state[cur] = (high, last)
                                cur = -1
                            ch = channels.get(cid)
                            if ch is not None and cid not in placeholders:
                                cur, cur_ch = cid, ch
                                high, last = seq_state.get(cid, (0, -1))
                                seen.add(cid)
                        if cid == cur:
                            count += 1
                            # The unwrap of :meth:`_message`.
                            if last >= _WRAP_FROM and seq32 < _WRAP_TO:
                                high += 1 << 32
                            elif seq32 < last:
                                high = 0
                            last = seq32
                            seq = high + seq32
                            if not n:
                                first = seq
                            n += 1
                            put(
                                RecordedMessage(
                                    cur_ch,
                                    seq,
                                    log_time,
                                    publish_time,
                                    records[rpos + head : rend],
                                    pos,
                                )
                            )
                            rpos = rend
                            if n >= flush_at:
                                flush_at += _BATCH
                                yield out
                                out = []
                                put = out.append
                            continue
                if cur >= 0:
                    seq_state[cur] = (high, last)
                    cur = -1
                if rpos + _REC.size > total:
                    raise struct.error("record header runs past the end of the chunk")
                op, rln = unpack(records, rpos)
                if op == 0:
                    # Opcode 0 is no MCAP record: zero fill or garbage. Walking it nine
                    # bytes at a time is how 2 GiB of zeros cost 80 s (issue 8.10).
                    raise struct.error(f"zero bytes where a record should start (+{rpos})")
                count += 1
                if count > budget:
                    raise struct.error(
                        f"more than {budget} records for its {stored} stored bytes; the "
                        "rest is skipped"
                    )
                start = rpos + _REC.size
                rend = start + rln
                if rend > total:
                    raise struct.error("record runs past the end of the chunk")
                if op == OP_MESSAGE:
                    m = self._message(records, start, rend, pos)
                    if m is not None:
                        seen.add(m.channel.id)
                        seq = m.seq
                        if not n:
                            first = seq
                        n += 1
                        put(m)
                        if n >= flush_at:
                            flush_at += _BATCH
                            yield out
                            out = []
                            put = out.append
                elif op == OP_CHANNEL:
                    self._channel(records[start:rend])
                elif op == OP_SCHEMA:
                    self._schema(records[start:rend])
                rpos = rend
        except (struct.error, UnicodeDecodeError, ValueError) as err:
            # A chunk without a CRC whose records do not parse: what came before is kept.
            if out:
                yield out
            raise _Damage(f"chunk at byte {pos} holds a damaged record ({err})", end) from None
        else:
            if out:
                yield out
        finally:
            if cur >= 0:
                seq_state[cur] = (high, last)
            if n:
                rep.messages += n
                if rep.seq_first is None:
                    rep.seq_first = first
                rep.seq_last = seq


def open_recording(path: str | os.PathLike[str]) -> RecordingReader:
    """Open a recording for reading, checking identity and format version.

    Args:
        path: The recording.

    Returns:
        A reader; use it as a context manager.

    Raises:
        RecordingError: Not an MCAP file, another profile, or cannot be opened.
        TruncatedRecording: The file ends before its MCAP header.
        UnsupportedVersion: Written by a newer major format version.
    """
    return RecordingReader(path)
