"""CLI command bodies (one module each) and the environment they share.

Each command parses its options, calls the library, renders and returns an
``ExitStatus``. Only this package and ``cli.py`` know about typer.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from typing import TextIO

from rich.console import Console

from kvtool.errors import UsageError


@dataclass
class Env:
    """Where a command writes: data to ``stdout``, talk to ``stderr`` (httpie's Environment).

    Attributes:
        stdout: The data stream.
        stderr: The talk stream.
        out: A rich console on ``stdout`` for tables.
        err: A rich console on ``stderr`` for progress, status and errors.
        quiet: Suppress progress and status output.
    """

    stdout: TextIO
    stderr: TextIO
    out: Console = field(init=False)
    err: Console = field(init=False)
    quiet: bool = False

    def __post_init__(self) -> None:
        self.out = Console(file=self.stdout, soft_wrap=True)
        self.err = Console(file=self.stderr, stderr=True, soft_wrap=True)

    @property
    def stdout_is_tty(self) -> bool:
        """True when stdout is a terminal (pretty output), False when piped."""
        return bool(getattr(self.stdout, "isatty", lambda: False)())


_ENV: Env | None = None


def get_env() -> Env:
    """Return the environment of the running command (built from sys streams on first use).

    Returns:
        The current :class:`Env`.
    """
    global _ENV
    if _ENV is None or _ENV.stdout is not sys.stdout or _ENV.stderr is not sys.stderr:
        _ENV = Env(stdout=sys.stdout, stderr=sys.stderr)
    return _ENV


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


def parse_duration_ns(text: str, *, option: str = "duration") -> int:
    """Parse ``90``, ``1.5s``, ``250ms``, ``10m``, ``1h`` into ns (bare numbers are seconds).

    Args:
        text: The value as typed.
        option: The option name, for the error message.

    Returns:
        The duration in nanoseconds (> 0).

    Raises:
        UsageError: The text is not a positive duration.
    """
    m = _DURATION.match(text)
    if not m:
        raise UsageError(
            f"{option}: {text!r} is not a duration (try 90, 10s, 250ms, 10m or 1h)"
        )
    ns = int(float(m.group(1)) * _UNIT_NS[m.group(2) or "s"])
    if ns <= 0:
        raise UsageError(f"{option}: {text!r} must be greater than zero")
    return ns
