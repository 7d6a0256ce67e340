"""Recordings: the kvtool profile on MCAP, its writer and its damage-tolerant reader."""

from __future__ import annotations

from kvtool.errors import RecordingPathError
from kvtool.recording.reader import (
    ChannelInfo,
    RecordedMessage,
    RecordingReader,
    RecoveryReport,
    check_input,
    open_recording,
)
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
