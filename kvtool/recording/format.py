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
- ``kvtool.gaps`` — ``ledger``: written at close, the gap ledger (see capture.py).

Unknown metadata names and keys are ignored by readers.

Version history:
    1: first version.
"""

from __future__ import annotations

FORMAT_VERSION = 1
PROFILE = "kvtool"
SCHEMA_NAME = "vllm.KVEventBatch"
SCHEMA_ENCODING = "jsonschema"
MESSAGE_ENCODING = "msgpack"

META_RECORDING = "kvtool.recording"
META_GROUPS = "kvtool.groups"
META_GAPS = "kvtool.gaps"

CHANNEL_ENDPOINT = "endpoint"
CHANNEL_TOPIC = "topic"
CHANNEL_DP_RANK = "dp_rank"

DEFAULT_CHUNK_SIZE = 256 * 1024
"""Uncompressed bytes per chunk: bounds what a crash can lose besides the timed flush."""
DEFAULT_FLUSH_INTERVAL_NS = 1_000_000_000
"""The writer closes its open chunk and flushes at least this often."""
MAX_RECORD_BYTES = 1 << 31
"""Records longer than this are treated as damage, never allocated."""

# A JSON schema describing the payload, for tools (Foxglove, mcap info) that show it.
SCHEMA_DATA = b"""{
  "title": "vllm.KVEventBatch",
  "description": "vLLM KV-cache event batch (msgpack): [ts, events, data_parallel_rank]; see kvtool PROTOCOL.md",
  "type": "array"
}"""


def channel_topic(endpoint: str, topic: str) -> str:
    """Return the MCAP channel topic for one (endpoint, ZMQ topic) pair.

    Args:
        endpoint: The ZeroMQ endpoint, e.g. ``tcp://127.0.0.1:5557``.
        topic: The ZeroMQ topic (vLLM's default is ``""``).

    Returns:
        ``endpoint`` alone for the empty topic, else ``endpoint#topic``.
    """
    return endpoint if not topic else f"{endpoint}#{topic}"
