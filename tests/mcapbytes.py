"""Hand-made MCAP bytes for hostile-input tests: every record built field by field."""

from __future__ import annotations

import json
import struct
import zlib

import zstandard

MAGIC = b"\x89MCAP0\r\n"
BASE_NS = 1_764_000_000_000_000_000


def record(op: int, body: bytes) -> bytes:
    """One MCAP record: opcode, length, body."""
    return struct.pack("<BQ", op, len(body)) + body


def string(s: str | bytes) -> bytes:
    """An MCAP string (u32 length prefix)."""
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<I", len(b)) + b


def str_map(d: dict[str, str]) -> bytes:
    """An MCAP map<string, string>."""
    body = b"".join(string(k) + string(v) for k, v in d.items())
    return struct.pack("<I", len(body)) + body


def header(profile: str = "kvtool") -> bytes:
    """The Header record."""
    return record(0x01, string(profile) + string("hand-made"))


def schema(sid: int = 1) -> bytes:
    """The kvtool Schema record."""
    return record(
        0x03,
        struct.pack("<H", sid)
        + string("vllm.KVEventBatch")
        + string("jsonschema")
        + struct.pack("<I", 0),
    )


def channel(
    cid: int = 1,
    sid: int = 1,
    *,
    dp_rank: str = "0",
    endpoint: str = "tcp://127.0.0.1:5557",
    topic: str = "",
) -> bytes:
    """A msgpack Channel record with kvtool's channel metadata."""
    md = {"endpoint": endpoint, "topic": topic, "dp_rank": dp_rank}
    return record(
        0x04, struct.pack("<HH", cid, sid) + string(endpoint) + string("msgpack") + str_map(md)
    )


def message(seq: int, data: bytes = b"", cid: int = 1, log_time: int | None = None) -> bytes:
    """A Message record."""
    t = BASE_NS + seq * 1_000_000 if log_time is None else log_time
    return record(0x05, struct.pack("<HIQQ", cid, seq & 0xFFFFFFFF, t, t) + data)


def metadata(name: str, values: dict[str, object] | dict[str, str], *, raw: bool = False) -> bytes:
    """A Metadata record; values are JSON-encoded unless ``raw``."""
    enc = {k: (v if raw else json.dumps(v)) for k, v in values.items()}
    return record(0x0C, string(name) + str_map(enc))  # type: ignore[arg-type]


def chunk(
    records: bytes,
    *,
    compression: str = "zstd",
    usize: int | None = None,
    compressed: bytes | None = None,
    crc: bool = True,
) -> bytes:
    """A Chunk record holding ``records`` (or ``compressed`` as its stored bytes)."""
    if compressed is None:
        compressed = (
            zstandard.ZstdCompressor().compress(records) if compression == "zstd" else records
        )
    size = len(records) if usize is None else usize
    body = (
        struct.pack("<QQQI", BASE_NS, BASE_NS, size, zlib.crc32(records) if crc else 0)
        + string(compression)
        + struct.pack("<Q", len(compressed))
        + compressed
    )
    return record(0x06, body)


def zstd_zeros(n: int) -> bytes:
    """A zstd frame of ``n`` zero bytes made of RLE blocks: 4 bytes per 128 KiB (a bomb)."""
    block = 128 * 1024
    # Magic, then a frame header with no content size and a 128 KiB window.
    out = [struct.pack("<I", 0xFD2FB528), bytes([0x00, (17 - 10) << 3])]
    left = n
    while left:
        k = min(block, left)
        left -= k
        # Block header: last-block bit, type 1 (RLE), regenerated size; then the byte.
        out.append(struct.pack("<I", (1 if not left else 0) | (1 << 1) | (k << 3))[:3] + b"\x00")
    return b"".join(out)


def recording(*records: bytes, footer: bool = True) -> bytes:
    """A whole file: magic, header, the records, a data-end record, and a footer."""
    body = MAGIC + header() + b"".join(records) + record(0x0F, struct.pack("<I", 0))
    if footer:
        body += record(0x02, struct.pack("<QQI", 0, 0, 0)) + MAGIC
    return body


def kvtool_context() -> bytes:
    """The kvtool.recording metadata record the writer puts first."""
    return metadata(
        "kvtool.recording",
        {
            "format_version": 1,
            "kvtool_version": "0",
            "start_time": "2026-01-01T00:00:00Z",
            "command_line": ["kvtool"],
        },
    )
