"""kvtool: record, replay and report vLLM KV-cache events per cache kind and sliding window."""

from __future__ import annotations

__version__ = "0.1.0"

from kvtool.annotate import GroupInfo, GroupTable, annotate, load_groups_file, resolve_groups
from kvtool.errors import (
    EndpointError,
    ExitStatus,
    KvtoolError,
    MetadataError,
    ProtocolError,
    RecordingError,
    TruncatedRecording,
    UnsupportedVersion,
    UsageError,
)
from kvtool.info import RecordingInfo, summarize
from kvtool.protocol import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    decode_batch,
)
from kvtool.recording import (
    ChannelInfo,
    RecordedMessage,
    RecordingReader,
    RecordingWriter,
    RecoveryReport,
    open_recording,
)

__all__ = [
    "AllBlocksCleared",
    "BlockRemoved",
    "BlockStored",
    "ChannelInfo",
    "EndpointError",
    "ExitStatus",
    "GroupInfo",
    "GroupTable",
    "KVEventBatch",
    "KvtoolError",
    "MetadataError",
    "ProtocolError",
    "RecordedMessage",
    "RecordingError",
    "RecordingInfo",
    "RecordingReader",
    "RecordingWriter",
    "RecoveryReport",
    "TruncatedRecording",
    "UnsupportedVersion",
    "UsageError",
    "__version__",
    "annotate",
    "build_report",
    "decode_batch",
    "load_groups_file",
    "open_recording",
    "resolve_groups",
    "summarize",
]


def __getattr__(name: str) -> object:
    # The report pulls in polars (~0.3 s): import it only when it is asked for.
    if name == "build_report":
        from kvtool.report import build_report

        return build_report
    raise AttributeError(f"module 'kvtool' has no attribute {name!r}")
