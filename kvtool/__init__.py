"""kvtool: record, replay and report vLLM KV-cache events per cache kind and sliding window."""

from __future__ import annotations

__version__ = "0.1.0"

import sys
import types
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvtool.annotate import GroupInfo, GroupTable, annotate, load_groups_file, resolve_groups
    from kvtool.capture import capture
    from kvtool.diff import diff_recordings
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
    from kvtool.export import copy_batches, export_table
    from kvtool.info import RecordingInfo, summarize
    from kvtool.inputs import resolve_annotation
    from kvtool.pacing import publish_recording
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
    from kvtool.report import build_report

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


# Every name is imported when first asked for: the console script imports this package
# first, and ``kvtool --version`` or a command that reads recordings should not pay for
# what it does not use (the mcap writer, pyzmq, polars).
_LAZY = {
    "AllBlocksCleared": "kvtool.protocol",
    "BlockRemoved": "kvtool.protocol",
    "BlockStored": "kvtool.protocol",
    "ChannelInfo": "kvtool.recording",
    "EndpointError": "kvtool.errors",
    "ExitStatus": "kvtool.errors",
    "GroupInfo": "kvtool.annotate",
    "GroupTable": "kvtool.annotate",
    "KVEventBatch": "kvtool.protocol",
    "KvtoolError": "kvtool.errors",
    "MetadataError": "kvtool.errors",
    "ProtocolError": "kvtool.errors",
    "RecordedMessage": "kvtool.recording",
    "RecordingError": "kvtool.errors",
    "RecordingInfo": "kvtool.info",
    "RecordingReader": "kvtool.recording",
    "RecordingWriter": "kvtool.recording",
    "RecoveryReport": "kvtool.recording",
    "TruncatedRecording": "kvtool.errors",
    "UnsupportedVersion": "kvtool.errors",
    "UsageError": "kvtool.errors",
    "annotate": "kvtool.annotate",
    "build_report": "kvtool.report",
    "capture": "kvtool.capture",
    "copy_batches": "kvtool.export",
    "decode_batch": "kvtool.protocol",
    "diff_recordings": "kvtool.diff",
    "export_table": "kvtool.export",
    "load_groups_file": "kvtool.annotate",
    "open_recording": "kvtool.recording",
    "publish_recording": "kvtool.pacing",
    "resolve_annotation": "kvtool.inputs",
    "resolve_groups": "kvtool.annotate",
    "summarize": "kvtool.info",
}


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'kvtool' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


class _Package(types.ModuleType):
    """The ``kvtool`` module, whose exported ``annotate`` is the function, as it always was.

    Importing the submodule ``kvtool.annotate`` binds it as an attribute of this package,
    which would hide the lazily imported function of the same name; that binding is
    skipped (``sys.modules`` holds the submodule, where imports find it).
    """

    def __setattr__(self, name: str, value: object) -> None:
        if name == "annotate" and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
