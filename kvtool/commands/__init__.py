"""CLI command bodies (one module each) and the environment they share.

Each command parses its options, calls the library, renders and returns an
``ExitStatus``. Only this package and ``cli.py`` know about typer.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import TextIO

from rich.console import Console

from kvtool.durations import parse_duration_ns

__all__ = ["Env", "get_env", "parse_duration_ns"]


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
