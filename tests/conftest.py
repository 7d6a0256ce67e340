"""Shared fixtures: the real vLLM captures copied into tests/data/captures."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"
CAPTURES_DIR = DATA / "captures"
CAPTURES = sorted(p.name.removesuffix(".frames") for p in CAPTURES_DIR.glob("*.frames"))


def read_frames(path: Path) -> list[list[bytes]]:
    """Read a ``.frames`` capture: per message a u32 BE frame count, then u32 BE length + bytes."""
    data = path.read_bytes()
    off = 0
    msgs: list[list[bytes]] = []
    while off < len(data):
        (count,) = struct.unpack_from(">I", data, off)
        off += 4
        frames = []
        for _ in range(count):
            (ln,) = struct.unpack_from(">I", data, off)
            off += 4
            frames.append(data[off : off + ln])
            off += ln
        msgs.append(frames)
    return msgs


def capture_messages(name: str) -> list[tuple[bytes, int, bytes]]:
    """Return a capture as ``(topic, seq, payload)`` tuples."""
    frames = read_frames(CAPTURES_DIR / f"{name}.frames")
    return [(t, int.from_bytes(s[:8], "big"), p) for t, s, p in frames]


def capture_truth(name: str) -> dict:
    """Return a capture's ``.truth.json``."""
    return json.loads((CAPTURES_DIR / f"{name}.truth.json").read_text())


@pytest.fixture(params=CAPTURES)
def capture(request: pytest.FixtureRequest) -> str:
    """Each capture's name in turn."""
    return request.param
