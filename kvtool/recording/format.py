"""The kvtool profile on MCAP: names, encodings and metadata records of a recording.

A recording is an MCAP file with profile ``kvtool``. Each ZeroMQ message is one MCAP
message whose ``data`` is the msgpack payload byte for byte as received; ``log_time``
is the receive time (ns), ``publish_time`` the batch's ``ts`` (ns) when it decodes,
else the receive time, and ``sequence`` the low 32 bits of the publisher's seq.
There is one channel per (endpoint, topic); its metadata holds ``endpoint``,
``topic`` and ``dp_rank``. Metadata records (values are JSON strings):

- ``kvtool.recording`` — ``format_version``, ``kvtool_version``, ``start_time``,
  ``command_line``, ``endpoints``;
- ``kvtool.groups`` — ``groups``: the list ``get_kv_cache_group_metadata()`` returns,
  and ``source``; optionally ``channel`` when it applies to one channel only;
- ``kvtool.ungrouped`` — ``kind``, ``sliding_window``, ``source``; optionally ``channel``:
  the kind of events without ``group_idx`` (``--group-meta none=KIND[:WINDOW]``, which
  ``get_kv_cache_group_metadata()``'s list has no entry for), as ``replay --annotate -o``
  keeps it (issue 21). Optional: a reader that does not know it ignores it;
- ``kvtool.gaps`` — ``ledger``: written at close, the gap ledger (its shape and the
  structs for all three records are in ``recording/ledger.py``);
- ``kvtool.channel`` — ``id``, ``name``, ``endpoint``, ``topic``, ``dp_rank``: written
  outside any chunk when a channel is added, so a damaged first chunk (which holds the
  MCAP Channel record) does not orphan the channel's later messages;
- ``kvtool.seq`` — ``channel``, ``seq``, ``log_time``: written (after closing the open
  chunk) before a message whose full 64-bit seq has other high bits than the previous
  message's on that channel, or whose seq goes backwards (publisher restart). MCAP's
  ``sequence`` is 32-bit; readers add the high bits back from these notes.

Unknown metadata names and keys are ignored by readers. ``format_version`` is an int
(the major version) or a ``"MAJOR.MINOR"`` string; a reader reads every major version
up to its own and refuses a newer one. Minor versions only add optional records.

Version history:
    1: first version: profile ``kvtool``, msgpack channels, ``kvtool.recording``,
       ``kvtool.groups``, ``kvtool.gaps``, ``kvtool.channel`` and ``kvtool.seq``;
       later the optional ``kvtool.ungrouped`` (no new version: an optional record that
       older readers ignore, as unknown names are).
"""

from __future__ import annotations

from kvtool.errors import RecordingError, UnsupportedVersion

FORMAT_VERSION = 1
MCAP_MAGIC = b"\x89MCAP0\r\n"
PROFILE = "kvtool"
SCHEMA_NAME = "vllm.KVEventBatch"
SCHEMA_ENCODING = "jsonschema"
MESSAGE_ENCODING = "msgpack"

META_RECORDING = "kvtool.recording"
META_GROUPS = "kvtool.groups"
META_UNGROUPED = "kvtool.ungrouped"
META_GAPS = "kvtool.gaps"
META_CHANNEL = "kvtool.channel"
META_SEQ = "kvtool.seq"

CHANNEL_ENDPOINT = "endpoint"
CHANNEL_TOPIC = "topic"
CHANNEL_DP_RANK = "dp_rank"

DEFAULT_CHUNK_SIZE = 256 * 1024
"""Uncompressed bytes per chunk: bounds what a crash can lose besides the timed flush."""
DEFAULT_FLUSH_INTERVAL_NS = 1_000_000_000
"""The writer closes its open chunk and flushes at least this often."""
MAX_RECORD_BYTES = 1 << 31
"""Records longer than this are treated as damage, never allocated."""
MAX_STRING_BYTES = 1 << 20
"""Strings (profile, names, compression) longer than this are treated as damage."""
MAX_CHUNK_BYTES = 1 << 28
"""A chunk that states a larger uncompressed size is damage (the writer's are 256 KiB)."""
MAX_COMPRESSION_RATIO = 100
"""A compressed chunk may inflate to at most this many times its stored size (plus
:data:`COMPRESSION_SLACK_BYTES`); more is a decompression bomb, treated as damage. Real
recordings compress 4-20 times: msgpack KV events carry random block hashes."""
COMPRESSION_SLACK_BYTES = 64 * 1024
"""Uncompressed bytes any chunk may hold whatever its stored size."""
RECORD_SLACK = 16
"""Records any chunk may hold whatever its stored size."""
STORED_BYTES_PER_RECORD = 4
"""Beyond :data:`RECORD_SLACK`, a chunk holds at most one record per this many stored
bytes. A real message costs at least ~10 stored bytes (its seq and times differ from its
neighbour's); a flood of identical records costs far less and is damage."""
COMPRESSIONS = ("", "zstd", "lz4")
"""Chunk compressions the reader understands (MCAP's well-known ones)."""
SEQ_MASK = 0xFFFFFFFF
"""MCAP's ``sequence`` field holds the low 32 bits of the publisher's seq."""

# A JSON schema describing the payload, for tools (Foxglove, mcap info) that show it.
SCHEMA_DATA = b"""{
  "title": "vllm.KVEventBatch",
  "description": "vLLM KV-cache event batch (msgpack): [ts, events, data_parallel_rank]",
  "type": "array"
}"""


def chunk_size_limit(compression: str, stored: int) -> int:
    """Return the largest uncompressed size a chunk of ``stored`` bytes may state.

    Args:
        compression: The chunk's compression (``""`` for none).
        stored: The chunk's stored (compressed) records length.

    Returns:
        The bound: ``stored`` itself for an uncompressed chunk, else the ratio bound,
        never above :data:`MAX_CHUNK_BYTES`.
    """
    if not compression:
        return min(stored, MAX_CHUNK_BYTES)
    return min(MAX_COMPRESSION_RATIO * stored + COMPRESSION_SLACK_BYTES, MAX_CHUNK_BYTES)


def chunk_record_limit(stored: int) -> int:
    """Return the most records a chunk of ``stored`` bytes may hold before it is damage.

    Args:
        stored: The chunk's stored (compressed) records length.

    Returns:
        :data:`RECORD_SLACK` plus one record per :data:`STORED_BYTES_PER_RECORD` bytes.
    """
    return RECORD_SLACK + stored // STORED_BYTES_PER_RECORD


def channel_topic(endpoint: str, topic: str) -> str:
    """Return the MCAP channel topic for one (endpoint, ZMQ topic) pair.

    Args:
        endpoint: The ZeroMQ endpoint, e.g. ``tcp://127.0.0.1:5557``.
        topic: The ZeroMQ topic (vLLM's default is ``""``).

    Returns:
        ``endpoint`` alone for the empty topic, else ``endpoint#topic``.
    """
    return endpoint if not topic else f"{endpoint}#{topic}"


def parse_format_version(path: str, value: object) -> tuple[int, int]:
    """Parse a stored ``format_version`` (``1`` or ``"1.2"``) into (major, minor).

    Args:
        path: The recording, for the error message.
        value: The stored value.

    Returns:
        ``(major, minor)``.

    Raises:
        RecordingError: The value is not a version.
    """
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value, 0
    if isinstance(value, str):
        major, _, minor = value.partition(".")
        if major.isdigit() and (minor.isdigit() or not minor):
            return int(major), int(minor or 0)
    raise RecordingError(
        f"{path}: format_version {value!r} in the {META_RECORDING} record is not a "
        "version number; the recording's metadata is damaged"
    )


def check_format_version(path: str, value: object) -> None:
    """Refuse a recording whose major format version is newer than this kvtool reads.

    Args:
        path: The recording, for the error message.
        value: The stored ``format_version``.

    Raises:
        UnsupportedVersion: The major version is newer than :data:`FORMAT_VERSION`.
        RecordingError: The value is not a version.
    """
    major, minor = parse_format_version(path, value)
    if major > FORMAT_VERSION:
        raise UnsupportedVersion(
            f"{path}: recording format version {major}.{minor} is newer than this kvtool "
            f"reads (up to {FORMAT_VERSION}); upgrade kvtool (pip install -U kvtool)"
        )
