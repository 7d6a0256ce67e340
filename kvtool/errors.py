"""The one exception tree of kvtool and the exit statuses the CLI maps it to."""

from __future__ import annotations

from enum import IntEnum


class ExitStatus(IntEnum):
    """Process exit statuses (httpie ``status.py``, mcap ``recover``)."""

    OK = 0
    FAILED = 1
    USAGE = 2
    DAMAGED = 3  # finished, but input was damaged or data was lost
    INTERRUPTED = 130


class KvtoolError(Exception):
    """Root of every error kvtool raises on purpose; the CLI prints it as one line."""

    exit_status: ExitStatus = ExitStatus.FAILED


class UsageError(KvtoolError):
    """A flag, argument or option value that cannot be used."""

    exit_status = ExitStatus.USAGE


class RecordingError(KvtoolError):
    """A recording that cannot be opened, read or written."""


class TruncatedRecording(RecordingError):
    """A recording whose end is missing or damaged; what was recovered is still usable."""

    exit_status = ExitStatus.DAMAGED


class UnsupportedVersion(RecordingError):
    """A recording written by a newer, incompatible kvtool format version."""


class ProtocolError(KvtoolError):
    """A payload or event that does not follow vLLM's KV-event protocol.

    Attributes:
        seq: The publisher sequence number of the batch, when known.
    """

    def __init__(self, message: str, *, seq: int | None = None) -> None:
        super().__init__(message)
        self.seq = seq


class MetadataError(KvtoolError):
    """KV cache group metadata (a groups file or ``--group`` flag) that cannot be used."""

    exit_status = ExitStatus.USAGE


class EndpointError(KvtoolError):
    """A ZeroMQ endpoint that is malformed or cannot be bound or connected."""

    exit_status = ExitStatus.USAGE


class OutputError(KvtoolError):
    """An output kvtool refuses to write.

    It is one of the inputs, it exists without ``--force``, it is a directory kvtool did not
    create, or another kvtool process holds it.
    """

    exit_status = ExitStatus.USAGE


class RecordingPathError(RecordingError, OutputError):
    """The output path of a recording cannot be used (see :mod:`kvtool.outputs` for the rule).

    It exists (without ``force``), is an input, is not kvtool's to replace, is locked by
    another writer, or cannot be created. A usage problem (exit status 2): the user picks
    another path or passes ``--force``.
    """

    exit_status = ExitStatus.USAGE


class ConnectTimeout(EndpointError):
    """Nothing connected and nothing arrived on an endpoint within the connect timeout."""

    exit_status = ExitStatus.FAILED


__all__ = [
    "ConnectTimeout",
    "EndpointError",
    "ExitStatus",
    "KvtoolError",
    "MetadataError",
    "OutputError",
    "ProtocolError",
    "RecordingError",
    "RecordingPathError",
    "TruncatedRecording",
    "UnsupportedVersion",
    "UsageError",
]
