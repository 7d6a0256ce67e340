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
    "capture",
    "copy_batches",
    "decode_batch",
    "diff_recordings",
    "export_table",
    "load_groups_file",
    "open_recording",
    "publish_recording",
    "resolve_annotation",
    "resolve_groups",
    "summarize",
]


# Library entry points that pull in polars or pyzmq (~0.3 s): imported when first asked for.
_LAZY = {
    "build_report": "kvtool.report",
    "copy_batches": "kvtool.export",
    "diff_recordings": "kvtool.diff",
    "export_table": "kvtool.export",
    "publish_recording": "kvtool.publish",
    "resolve_annotation": "kvtool.inputs",
    "capture": "kvtool.capture",
}


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'kvtool' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
