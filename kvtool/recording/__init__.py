"""Recordings: the kvtool profile on MCAP, its writer and its damage-tolerant reader."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvtool.errors import RecordingPathError
from kvtool.recording.reader import (
    ChannelInfo,
    RecordedMessage,
    RecordingReader,
    RecoveryReport,
    check_input,
    open_recording,
)

if TYPE_CHECKING:
    from kvtool.recording.writer import RecordingWriter

__all__ = [
    "ChannelInfo",
    "RecordedMessage",
    "RecordingPathError",
    "RecordingReader",
    "RecordingWriter",
    "RecoveryReport",
    "check_input",
    "open_recording",
]


def __getattr__(name: str) -> object:
    # The writer pulls in the mcap package's writer (~30 ms); reading commands never need it.
    if name == "RecordingWriter":
        from kvtool.recording.writer import RecordingWriter

        return RecordingWriter
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
