"""CLI command bodies (one module each) and the environment they share.

Each command parses its options, calls the library, renders and returns an
``ExitStatus``. Only this package and ``cli.py`` know about typer.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TextIO

from rich.console import Console

from kvtool.durations import parse_duration_ns
from kvtool.text import printable

if TYPE_CHECKING:
    from kvtool.render.progress import ProgressBar

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
        self.out = _Console(file=self.stdout, soft_wrap=True)
        self.err = _Console(file=self.stderr, stderr=True, soft_wrap=True)

    def progress(self, description: str, total: int | None, *, quiet: bool = False) -> ProgressBar:
        """Return a progress bar on stderr, drawn only on a terminal and without ``-q``.

        Args:
            description: What is being done (made printable by the caller).
            total: Bytes to do, when known.
            quiet: The command's ``-q`` (``self.quiet`` counts too).

        Returns:
            The bar (a no-op when not drawn); use it as a context manager.
        """
        from kvtool.render.progress import ProgressBar

        shown = not (quiet or self.quiet) and self.err.is_terminal
        return ProgressBar(self.err if shown else None, description, total)

    @property
    def stdout_is_tty(self) -> bool:
        """True when stdout is a terminal (pretty output), False when piped."""
        return bool(getattr(self.stdout, "isatty", lambda: False)())


class _Console(Console):
    """A console that never passes a control character through and survives ``| head``.

    Every plain string printed has its control characters escaped (newlines kept), so a
    message quoting a file or a peer cannot drive the terminal even if its author forgot
    :func:`kvtool.text.printable`. A reader going away (``kvtool report | head``) is not
    an error: rich's default exits with status 1; kvtool raises :class:`BrokenPipeError`,
    which the CLI maps to exit 0, after pointing stdout at /dev/null so the interpreter's
    final flush of it cannot fail (and exit 120) either.
    """

    def print(self, *objects: Any, **kwargs: Any) -> None:
        super().print(*(_safe(o) for o in objects), **kwargs)

    def on_broken_pipe(self) -> None:
        self.quiet = True
        try:
            fd = self.file.fileno()
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, fd)
            os.close(devnull)
        except (OSError, ValueError, AttributeError):
            pass  # not a real file (tests' StringIO): nothing will flush it at exit
        raise BrokenPipeError


def _safe(obj: object) -> object:
    if isinstance(obj, str) and not obj.isprintable():
        return "\n".join(printable(line) for line in obj.split("\n"))
    return obj


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
