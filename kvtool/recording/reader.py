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
import os
import struct
from collections.abc import Iterator

import msgspec

from kvtool.errors import RecordingError
from kvtool.recording import format as fmt
from kvtool.recording.chunks import ChunkReader
from kvtool.recording.ledger import (
    TYPED_RECORDS,
    GapLedger,
    GroupsRecord,
    RecordingContext,
    parse_record,
)

# Channels, messages and the recovery report live in kvtool.recording.messages, the
# record framing in kvtool.recording.records; their names stay importable here.
from kvtool.recording.messages import ChannelInfo, RecordedMessage, RecoveryReport
from kvtool.recording.records import (
    _DATA_OPS,
    _REC,
    OP_CHANNEL,
    OP_CHUNK,
    OP_DATA_END,
    OP_MESSAGE,
    OP_MESSAGE_INDEX,
    OP_METADATA,
    OP_SCHEMA,
    _Damage,
    _Shrunk,
    check_input,
)


class RecordingReader(ChunkReader):
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
        super().__init__(path)
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


__all__ = [
    "ChannelInfo",
    "RecordedMessage",
    "RecordingReader",
    "RecoveryReport",
    "check_input",
    "open_recording",
]
