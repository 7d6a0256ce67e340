"""Helpers for the recording tests: real captures written into real MCAP recordings."""

from __future__ import annotations

from pathlib import Path

from mcap.reader import make_reader

from kvtool.recording import RecordingWriter
from tests.conftest import capture_messages

BASE_NS = 1_764_000_000_000_000_000
STEP_NS = 10_000_000  # 10 ms between recorded batches
ENDPOINT = "tcp://127.0.0.1:5557"


def write_capture(
    path: Path,
    name: str = "full_only",
    *,
    limit: int | None = None,
    chunk_size: int = 4096,
    compression: str = "zstd",
    skip: set[int] | frozenset[int] = frozenset(),
    ledger: dict[str, object] | None = None,
    groups: list[dict[str, object]] | None = None,
    dp_rank: int | None = 0,
    endpoint: str = ENDPOINT,
) -> list[tuple[int, bytes]]:
    """Record a capture into ``path``; return the written ``(seq, payload)`` pairs."""
    msgs = capture_messages(name)[:limit]
    written: list[tuple[int, bytes]] = []
    with RecordingWriter(path, chunk_size=chunk_size, compression=compression) as w:
        ch = w.add_channel(endpoint, "", dp_rank)
        if groups is not None:
            w.add_groups(groups, "groups.json")
        for i, (_topic, seq, payload) in enumerate(msgs):
            if seq in skip:
                continue
            w.write(ch, seq, payload, BASE_NS + i * STEP_NS)
            written.append((seq, payload))
        w.close(ledger=ledger)
    return written


def chunk_extents(path: Path) -> list[tuple[int, int]]:
    """Return ``(start, end)`` of every chunk record and its message indexes, in order."""
    with open(path, "rb") as f:
        summary = make_reader(f).get_summary()
    assert summary is not None
    return sorted(
        (ci.chunk_start_offset, ci.chunk_start_offset + ci.chunk_length + ci.message_index_length)
        for ci in summary.chunk_indexes
    )


def chunk_bodies(path: Path) -> list[tuple[int, int]]:
    """Return ``(start, length)`` of every chunk record (without its message indexes)."""
    with open(path, "rb") as f:
        summary = make_reader(f).get_summary()
    assert summary is not None
    return sorted((ci.chunk_start_offset, ci.chunk_length) for ci in summary.chunk_indexes)
