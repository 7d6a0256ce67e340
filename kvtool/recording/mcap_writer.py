"""McapWriter: the MCAP records of a recording, written by kvtool through mcap's public records.

kvtool used ``mcap.writer.Writer`` and reached into it: it wrote the Writer's private
statistics and chunk buffer to append a message in one ``struct`` call (mcap's
``add_message`` builds a ``Message`` object per batch and writes it field by field, most of
the recorder's write cost), and it replaced the ``zstandard`` and ``lz4`` modules inside
``mcap.writer`` at import to bound a chunk's compression ratio. mcap's public Writer offers
neither (no message append without the object, no say over how a chunk is compressed), so
kvtool owns its data section here, following the MCAP specification
(https://mcap.dev/spec): every record is serialised by ``mcap.records`` (the library's public
record classes and ``mcap.data_stream.RecordBuilder``) except the Message record, which is
packed in one ``struct`` call with the same layout. The records, their order, the indexes,
the statistics, the summary and its offsets are exactly those ``mcap.writer.Writer`` writes
with its default options (chunked, every index, CRCs, no data-section CRC), so a recording's
bytes are what they were; the differential test (tests/test_issue19_writer.py) holds the two
byte for byte. Nothing of the mcap package is changed.
"""

from __future__ import annotations

import io
import struct
import zlib
from collections.abc import Callable, Sequence
from typing import IO

import zstandard
from mcap.data_stream import RecordBuilder
from mcap.opcode import Opcode
from mcap.records import (
    Channel,
    Chunk,
    ChunkIndex,
    DataEnd,
    Footer,
    Header,
    McapRecord,
    MessageIndex,
    Metadata,
    MetadataIndex,
    Schema,
    Statistics,
    SummaryOffset,
)

from kvtool.errors import RecordingError
from kvtool.recording import format as fmt

MCAP_MAGIC = b"\x89MCAP0\r\n"
COMPRESSIONS = ("zstd", "lz4", "")
"""The chunk compressions (MCAP's names; ``""`` stores chunks as they are)."""

# A Message record: opcode, record length, then channel id, sequence, log and publish time.
_MESSAGE_HEAD = struct.Struct("<BQHIQQ")
_MESSAGE_FIXED = 2 + 4 + 8 + 8
_FOOTER_HEAD = struct.Struct("<BQQQ")

_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_ZSTD_FHD = 0xE0  # single segment, 8-byte frame content size, no checksum, no dictionary
_ZSTD_BLOCK = 128 * 1024  # the largest block zstd allows
_LZ4_BLOCK = 64 * 1024  # the header's block size


def raw_zstd_frame(data: bytes) -> bytes:
    """Return ``data`` as a zstd frame of raw (stored, uncompressed) blocks.

    A standard zstd frame (RFC 8878 §3.1.1) that every zstd decoder reads back as
    ``data``, about as large as ``data`` itself.

    Args:
        data: The bytes.

    Returns:
        The frame.
    """
    out = bytearray(_ZSTD_MAGIC)
    out.append(_ZSTD_FHD)
    out += len(data).to_bytes(8, "little")
    view = memoryview(data)
    pos = 0
    while True:
        block = view[pos : pos + _ZSTD_BLOCK]
        pos += len(block)
        last = pos >= len(data)
        out += ((len(block) << 3) | int(last)).to_bytes(3, "little")  # block type 0: raw
        out += block
        if last:
            return bytes(out)


def raw_lz4_frame(data: bytes) -> bytes:
    """Return ``data`` as an LZ4 frame of uncompressed blocks (LZ4 frame format §3).

    The frame header comes from ``lz4`` itself (independent 64 KiB blocks, no checksums);
    each block's size has its high bit set: stored as is.

    Args:
        data: The bytes.

    Returns:
        The frame, which ``lz4.frame.decompress`` reads back as ``data``.
    """
    import lz4.frame  # type: ignore[import-untyped]

    header = lz4.frame.compress(
        b"", block_size=lz4.frame.BLOCKSIZE_MAX64KB, block_linked=False, store_size=False
    )[:7]
    out = bytearray(header)
    view = memoryview(data)
    for pos in range(0, len(data), _LZ4_BLOCK):
        block = view[pos : pos + _LZ4_BLOCK]
        out += (len(block) | 0x80000000).to_bytes(4, "little")
        out += block
    out += b"\x00\x00\x00\x00"  # end mark
    return bytes(out)


def _take(builder: RecordBuilder) -> bytes:
    """The bytes ``builder`` holds; it starts empty again (``end`` is unannotated in mcap)."""
    data: bytes = builder.end()  # type: ignore[no-untyped-call]
    return data


def check_compression(compression: str) -> None:
    """Raise :class:`RecordingError` unless chunks can be compressed with ``compression``."""
    _compressor(compression)


def _compressor(compression: str) -> Callable[[bytes], bytes]:
    """The chunk compressor for ``compression``, bounded by the reader's ratio limit.

    The reader bounds a chunk's decompression ratio (``format.chunk_size_limit``) so a
    hostile file cannot inflate without limit. A hostile *peer* can send payloads that
    compress beyond that bound (megabytes of zeros, the same reply again and again); such a
    chunk is stored in raw blocks of the same frame format instead, so kvtool never writes
    a file its own reader refuses and no received batch is lost. Every other chunk is
    compressed as ``mcap.writer.Writer`` compresses it (``zstandard.compress``,
    ``lz4.frame.compress``, their default levels), once.
    """
    if compression == "zstd":
        compress: Callable[[bytes], bytes] = zstandard.compress
        raw = raw_zstd_frame
    elif compression == "lz4":
        try:
            import lz4.frame
        except ImportError:
            raise RecordingError(
                "lz4 compression needs the lz4 package (pip install lz4); or use zstd"
            ) from None
        compress, raw = lz4.frame.compress, raw_lz4_frame
    elif compression == "":
        return lambda data: data
    else:
        raise RecordingError(f"unknown chunk compression {compression!r} (zstd, lz4 or none)")

    def bounded(data: bytes) -> bytes:
        out = compress(data)
        return raw(data) if fmt.chunk_size_limit(compression, len(out)) < len(data) else out

    return bounded


class McapWriter:
    """Writes one MCAP file: header, chunked data section, summary, footer.

    The calls and their effect on the file are those of ``mcap.writer.Writer`` with its
    defaults: Schema and Channel records go into the open chunk, a Metadata record is
    written outside any chunk (the open chunk stays open), a chunk is closed once its
    records pass ``chunk_size`` bytes or at :meth:`flush`, and :meth:`finish` writes the
    summary (schemas, channels, statistics, chunk and metadata indexes, the summary
    offsets) and the footer. The stream is never closed here.

    Args:
        stream: A binary stream that can ``tell()`` its position (buffered).
        chunk_size: Uncompressed bytes of records after which a chunk is closed.
        compression: ``"zstd"``, ``"lz4"`` or ``""`` (none).

    Raises:
        RecordingError: An unknown compression, or lz4 asked for and not installed.
    """

    def __init__(self, stream: IO[bytes], *, chunk_size: int, compression: str) -> None:
        self._stream = stream
        self._chunk_size = chunk_size
        self._compression = compression
        self._compress = _compressor(compression)
        self._builder = RecordBuilder()
        self._schemas: list[Schema] = []
        self._channels: list[Channel] = []
        self._chunk_indexes: list[ChunkIndex] = []
        self._metadata_indexes: list[MetadataIndex] = []
        # The open chunk: its records, its messages' times and per-channel message index.
        # A BytesIO, as mcap's: its getvalue() hands the chunk over without a copy, where a
        # bytearray grown and copied per chunk cost 4x the page faults and 2x the CPU.
        self._chunk = io.BytesIO()
        self._chunk_messages = 0
        self._chunk_start = 0
        self._chunk_end = 0
        self._chunk_index: dict[int, list[tuple[int, int]]] = {}
        # The file's statistics.
        self._message_counts: dict[int, int] = {}
        self._message_count = 0
        self._message_start = 0
        self._message_end = 0
        self._chunk_count = 0
        self._metadata_count = 0

    def _put(self, record: McapRecord) -> int:
        """Write ``record`` outside any chunk; return its length in bytes."""
        record.write(self._builder)
        data = _take(self._builder)
        self._stream.write(data)
        return len(data)

    def _chunked(self, record: McapRecord) -> None:
        """Append ``record`` to the open chunk."""
        record.write(self._builder)
        self._chunk.write(_take(self._builder))
        if self._chunk.tell() > self._chunk_size:
            self._close_chunk()

    def start(self, *, profile: str, library: str) -> None:
        """Write the magic and the Header record."""
        self._stream.write(MCAP_MAGIC)
        self._put(Header(profile=profile, library=library))

    def register_schema(self, name: str, encoding: str, data: bytes) -> int:
        """Add a Schema (in the open chunk, and in the summary); return its id (from 1)."""
        schema = Schema(id=len(self._schemas) + 1, data=data, encoding=encoding, name=name)
        self._schemas.append(schema)
        self._chunked(schema)
        return schema.id

    def register_channel(
        self, topic: str, message_encoding: str, schema_id: int, metadata: dict[str, str]
    ) -> int:
        """Add a Channel (in the open chunk, and in the summary); return its id (from 1)."""
        channel = Channel(
            id=len(self._channels) + 1,
            topic=topic,
            message_encoding=message_encoding,
            schema_id=schema_id,
            metadata=metadata,
        )
        self._channels.append(channel)
        self._chunked(channel)
        return channel.id

    def add_message(
        self, channel_id: int, log_time: int, data: bytes, publish_time: int, sequence: int
    ) -> None:
        """Append one Message record to the open chunk (one ``struct`` call, no object)."""
        if self._message_count == 0 or log_time < self._message_start:
            self._message_start = log_time
        if log_time > self._message_end:
            self._message_end = log_time
        self._message_counts[channel_id] = self._message_counts.get(channel_id, 0) + 1
        self._message_count += 1
        if self._chunk_messages == 0 or log_time < self._chunk_start:
            self._chunk_start = log_time
        if log_time > self._chunk_end:
            self._chunk_end = log_time
        chunk = self._chunk
        index = self._chunk_index.get(channel_id)
        if index is None:
            index = self._chunk_index[channel_id] = []
        index.append((log_time, chunk.tell()))
        self._chunk_messages += 1
        chunk.write(
            _MESSAGE_HEAD.pack(
                Opcode.MESSAGE,
                _MESSAGE_FIXED + len(data),
                channel_id,
                sequence,
                log_time,
                publish_time,
            )
        )
        chunk.write(data)
        if chunk.tell() > self._chunk_size:
            self._close_chunk()

    def add_metadata(self, name: str, data: dict[str, str]) -> None:
        """Write a Metadata record outside any chunk (the open chunk stays open)."""
        offset = self._stream.tell()
        length = self._put(Metadata(name=name, metadata=data))
        self._metadata_count += 1
        self._metadata_indexes.append(MetadataIndex(offset=offset, length=length, name=name))

    def _close_chunk(self) -> None:
        """Write the open chunk and its message indexes, if it holds a message."""
        if self._chunk_messages == 0:
            return  # its Schema/Channel records wait for the chunk of the next message
        self._chunk_count += 1
        data = self._chunk.getvalue()
        compressed = self._compress(data)
        chunk_offset = self._stream.tell()
        chunk_length = self._put(
            Chunk(
                compression=self._compression,
                data=compressed,
                message_start_time=self._chunk_start,
                message_end_time=self._chunk_end,
                uncompressed_crc=zlib.crc32(data),
                uncompressed_size=len(data),
            )
        )
        index_offset = self._stream.tell()
        offsets: dict[int, int] = {}
        for channel_id, records in self._chunk_index.items():
            offsets[channel_id] = index_offset + self._builder.count
            MessageIndex(channel_id=channel_id, records=records).write(self._builder)
        index_length = self._builder.count
        self._stream.write(_take(self._builder))
        self._chunk_indexes.append(
            ChunkIndex(
                message_start_time=self._chunk_start,
                message_end_time=self._chunk_end,
                chunk_start_offset=chunk_offset,
                chunk_length=chunk_length,
                message_index_offsets=offsets,
                message_index_length=index_length,
                compression=self._compression,
                compressed_size=len(compressed),
                uncompressed_size=len(data),
            )
        )
        self._chunk = io.BytesIO()
        self._chunk_messages = 0
        self._chunk_start = self._chunk_end = 0
        self._chunk_index = {}

    def flush(self) -> None:
        """Close the open chunk (if it holds a message) and flush the stream (no fsync)."""
        self._close_chunk()
        self._stream.flush()

    def finish(self) -> None:
        """Close the open chunk; write DataEnd, the summary, the footer and the magic."""
        self._close_chunk()
        self._put(DataEnd(data_section_crc=0))
        start = self._stream.tell()
        out = self._builder
        offsets: list[SummaryOffset] = []

        def group(opcode: int, records: Sequence[McapRecord]) -> None:
            first = out.count
            for record in records:
                record.write(out)
            offsets.append(
                SummaryOffset(
                    group_opcode=opcode, group_start=start + first, group_length=out.count - first
                )
            )

        stats = Statistics(
            attachment_count=0,
            channel_count=len(self._channels),
            channel_message_counts=self._message_counts,
            chunk_count=self._chunk_count,
            message_count=self._message_count,
            message_end_time=self._message_end,
            message_start_time=self._message_start,
            metadata_count=self._metadata_count,
            schema_count=len(self._schemas),
        )
        group(Opcode.SCHEMA, self._schemas)
        group(Opcode.CHANNEL, self._channels)
        group(Opcode.STATISTICS, [stats])
        group(Opcode.CHUNK_INDEX, self._chunk_indexes)
        group(Opcode.ATTACHMENT_INDEX, [])
        group(Opcode.METADATA_INDEX, self._metadata_indexes)
        offset_start = start + out.count
        for offset in offsets:
            offset.write(out)
        summary = _take(out)
        summary_start = start if summary else 0
        crc = zlib.crc32(
            _FOOTER_HEAD.pack(Opcode.FOOTER, 20, summary_start, offset_start), zlib.crc32(summary)
        )
        self._stream.write(summary)
        self._put(
            Footer(summary_start=summary_start, summary_offset_start=offset_start, summary_crc=crc)
        )
        self._stream.write(MCAP_MAGIC)
