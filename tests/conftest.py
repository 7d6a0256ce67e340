"""Shared fixtures: the real vLLM captures copied into tests/data/captures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.peer import read_frames

DATA = Path(__file__).parent / "data"
CAPTURES_DIR = DATA / "captures"
_ALL = sorted(p.name.removesuffix(".frames") for p in CAPTURES_DIR.glob("*.frames"))
CAPTURES = [c for c in _ALL if not c.startswith("sglang_")]
"""vLLM's captures (their truth files share one layout)."""
SGLANG_CAPTURES = [c for c in _ALL if c.startswith("sglang_")]
"""SGLang 0.5.23's captures (truth files of their own layout: captures/README.md)."""


def capture_messages(name: str) -> list[tuple[bytes, int, bytes]]:
    """Return a capture as ``(topic, seq, payload)`` tuples."""
    return read_frames(CAPTURES_DIR / f"{name}.frames")


def capture_truth(name: str) -> dict:
    """Return a capture's ``.truth.json``."""
    return json.loads((CAPTURES_DIR / f"{name}.truth.json").read_text())


@pytest.fixture(params=CAPTURES)
def capture(request: pytest.FixtureRequest) -> str:
    """Each capture's name in turn."""
    return request.param
