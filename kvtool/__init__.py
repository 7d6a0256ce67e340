"""kvtool: record, replay and report vLLM KV-cache events per cache kind and sliding window."""

from __future__ import annotations

__version__ = "0.1.0"

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
    "KVEventBatch",
    "KvtoolError",
    "MetadataError",
    "ProtocolError",
    "RecordedMessage",
    "RecordingError",
    "RecordingReader",
    "RecordingWriter",
    "RecoveryReport",
    "TruncatedRecording",
    "UnsupportedVersion",
    "UsageError",
    "__version__",
    "decode_batch",
    "open_recording",
]
