"""Durations as people type them (``90``, ``1.5s``, ``250ms``, ``10m``, ``1h``) in ns."""

from __future__ import annotations

import re

from kvtool.errors import UsageError

_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(ns|us|ms|s|m|h|d)?\s*$")
_UNIT_NS = {
    "ns": 1,
    "us": 1_000,
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60_000_000_000,
    "h": 3_600_000_000_000,
    "d": 86_400_000_000_000,
}


def parse_duration_ns(text: str, *, option: str = "duration", allow_zero: bool = False) -> int:
    """Parse ``90``, ``1.5s``, ``250ms``, ``10m``, ``1h`` or ``1d`` into ns (bare number: seconds).

    Args:
        text: The value as typed.
        option: The option name, for the error message.
        allow_zero: Accept a zero duration.

    Returns:
        The duration in nanoseconds.

    Raises:
        UsageError: The text is not a duration (or is zero when that is not allowed).
    """
    m = _DURATION.match(text)
    if not m:
        raise UsageError(f"{option}: {text!r} is not a duration (try 90, 10s, 250ms, 10m or 1h)")
    ns = int(float(m.group(1)) * _UNIT_NS[m.group(2) or "s"])
    if ns <= 0 and not allow_zero:
        raise UsageError(f"{option}: {text!r} must be greater than zero")
    return ns
