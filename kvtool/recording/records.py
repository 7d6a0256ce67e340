"""The MCAP records of a recording: constants, framing, one record at a time, resync after damage.

:class:`RecordParser` is the first layer of :class:`kvtool.recording.reader.RecordingReader`:
the file, positioned reads that notice a shrinking file, the identity and tail checks of
opening, the schema, channel, metadata and message records, and the search for the next
record that checks out after damage. It calls nothing of the layers above it.
"""

from __future__ import annotations

import json
import os
import re
import stat
import struct
from typing import IO

import msgspec
import zstandard

from kvtool.errors import RecordingError, TruncatedRecording
from kvtool.recording import format as fmt

try:
    # ISA-L's CRC-32 (the same polynomial and result as zlib's) runs at memory speed
    # with carry-less multiplication; zlib 1.2's table walk made the check of every
    # decompressed chunk as costly as decompressing it (issue 10).
    from isal.isal_zlib import crc32 as crc32
except ImportError:  # pragma: no cover - isal is a dependency; zlib is the fallback
    from zlib import crc32 as crc32

from kvtool.recording.messages import (
    NOT_READ_YET,
    ChannelInfo,
    RecordedMessage,
    RecoveryReport,
)

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


class RecordParser:
    """The records of one recording file (the base of :class:`~kvtool.recording.RecordingReader`).

    Args:
        path: The recording.

    Raises:
        RecordingError: The file cannot be opened.
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
        # Not known until the messages are read: never "complete" before that.
        self.recovery = RecoveryReport(
            path=self.path, file_size=self._size, complete=False, reason=NOT_READ_YET
        )
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

    def close(self) -> None:
        """Close the file."""
        self._file.close()

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
        if crc and crc32(body) != crc:
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

    def _damage(self, rep: RecoveryReport, pos: int, reason: str, *, chunk: bool) -> None:
        if chunk:
            rep.damaged_chunks += 1
        else:
            rep.damaged_records += 1
        if rep.first_damage_offset is None:
            rep.first_damage_offset = pos
        if rep.reason is None:
            rep.reason = reason

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
