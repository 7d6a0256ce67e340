"""CLI command bodies (one module each) and the environment they share.

Each command parses its options, calls the library, renders and returns an
``ExitStatus``. Only this package and ``cli.py`` know about typer.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TextIO

from kvtool.durations import parse_duration_ns
from kvtool.errors import KvtoolError
from kvtool.outputs import check_std_streams_not_inputs, silence_fd
from kvtool.text import printable

if TYPE_CHECKING:
    from rich.console import Console

    from kvtool.render.progress import ProgressBar

__all__ = [
    "Env",
    "TextOutput",
    "check_inputs",
    "examples",
    "get_env",
    "lost_batches",
    "missing_batches",
    "parse_duration_ns",
]


class TextOutput:
    """Where a text command's data goes: stdout, or ``-o FILE`` written atomically.

    The one ``-o/--output`` of the text commands: ``-`` (or no -o) is stdout; a file is
    checked under kvtool's output rule before any work (``--force`` replaces only a text
    file) and written whole at :meth:`close`, so a failure leaves it as it was.

    Args:
        env: The command's environment.
        path: ``-o``, or None.
        force: ``--force``.
        inputs: Every file the command reads.

    Attributes:
        stream: Write text here.
    """

    def __init__(
        self,
        env: Env,
        path: str | os.PathLike[str] | None,
        *,
        force: bool,
        inputs: Iterable[str | os.PathLike[str] | None],
    ) -> None:
        import io

        from kvtool.outputs import OutputKind, check_output, is_stdout

        self.env = env
        self.force = force
        self.inputs = [i for i in inputs if i is not None]
        self.path = None if path is None or is_stdout(path) else path
        self._buf: io.StringIO | None = None
        self._console: Console | None = None
        self.stream: TextIO = env.stdout
        if self.path is not None:
            check_output(self.path, kind=OutputKind.TEXT, force=force, inputs=self.inputs)
            self._buf = io.StringIO()
            self.stream = self._buf

    @property
    def console(self) -> Console:
        """Or print rich tables here (200 columns wide into a file); made when first used."""
        if self._console is None:
            if self._buf is None:
                self._console = self.env.out
            else:
                from rich.console import Console

                self._console = Console(file=self._buf, width=200, soft_wrap=True)
        return self._console

    def close(self) -> None:
        """Write the file (or flush stdout)."""
        from kvtool.outputs import write_text

        if self._buf is not None and self.path is not None:
            write_text(self.path, self._buf.getvalue(), force=self.force, inputs=self.inputs)
        else:
            self.env.stdout.flush()


def examples(*lines: str) -> str:
    r"""Build the epilog that ends a command's help: 2-4 example command lines.

    Every command passes this to ``COMMAND_OPTIONS[name]["epilog"]``, so all help
    pages end the same way (click keeps a paragraph starting with ``\b`` unwrapped).

    Args:
        lines: Example commands, without the leading ``kvtool``.

    Returns:
        The epilog text.
    """
    body = "\n".join(f"  kvtool {line}" for line in lines)
    return f"\b\nExamples:\n{body}\n"


def check_inputs(inputs: Iterable[str | os.PathLike[str] | None]) -> None:
    """Checks every reading command makes on its inputs before any output is written.

    The one place report, replay, info, diff, export and top pass their inputs through:
    stdout or stderr redirected into an input (``kvtool report run.mcap 1<> run.mcap``)
    would overwrite the recording being read, so that is refused.

    Args:
        inputs: Every file the command reads (None entries are skipped).

    Raises:
        OutputError: fd 1 or 2 is one of the inputs.
    """
    check_std_streams_not_inputs([i for i in inputs if i is not None])


def lost_batches(paths: Iterable[str | os.PathLike[str]]) -> list[str]:
    """Say, one line per recording, which batches its gap ledger lists as lost.

    One policy for every reading command (as ``kvtool info``): a recording whose
    recorder lost batches finishes with exit status 3 (finished, but input is missing).
    Only record headers are read. Files that cannot be opened are left to the command,
    which reports them itself.

    Args:
        paths: The recordings.

    Returns:
        Lines naming the file, the count and the first lost seq ranges.
    """
    from kvtool.recording.reader import open_recording
    from kvtool.recording.unconfirmed import lost_line

    out: list[str] = []
    for path in paths:
        try:
            with open_recording(path) as reader:
                ledger = reader.gap_ledger
        except (KvtoolError, OSError):
            continue
        if ledger is None or ledger.lost <= 0:
            continue
        more = bool(ledger.lost_ranges_omitted)
        out.append(
            printable(lost_line(os.fspath(path), ledger.lost, ledger.lost_ranges, more=more))
        )
    return out


def missing_batches(paths: Iterable[str | os.PathLike[str]]) -> list[str]:
    """Say what each recording's gap ledger lists as missing: lost batches and unconfirmed tails.

    The exit policy of every command that reads a recording (issue 23): batches lost while
    recording (:func:`lost_batches`) and channel tails the replay socket never confirmed
    (:func:`kvtool.info.unconfirmed_lines`) are one line each, and the command exits 3.
    The what-if's condition stays :func:`lost_batches` (a tail missing after the last
    batch read changes no eviction order the prediction replays).

    Args:
        paths: The recordings.

    Returns:
        Per recording, its lost-batches line, then its unconfirmed-tails line.
    """
    from kvtool.recording.reader import open_recording
    from kvtool.recording.unconfirmed import unconfirmed_lines, unconfirmed_tails

    out: list[str] = []
    for path in dict.fromkeys(str(os.fspath(p)) for p in paths):  # a path given twice is said once
        out += lost_batches([path])
        try:
            with open_recording(path) as reader:
                ledger = reader.gap_ledger
        except (KvtoolError, OSError):
            continue
        out += [printable(x) for x in unconfirmed_lines(os.fspath(path), unconfirmed_tails(ledger))]
    return out


@dataclass
class Env:
    """Where a command writes: data to ``stdout``, talk to ``stderr`` (httpie's Environment).

    Attributes:
        stdout: The data stream.
        stderr: The talk stream.
        quiet: Suppress progress and status output.
    """

    stdout: TextIO
    stderr: TextIO
    quiet: bool = False
    _out: Console | None = field(default=None, init=False, repr=False, compare=False)
    _err: Console | None = field(default=None, init=False, repr=False, compare=False)

    # The consoles are made when first used: rich costs ~40 ms of start-up, and a
    # command that writes JSON or CSV to stdout and nothing to stderr never needs it.
    @property
    def out(self) -> Console:
        """A rich console on ``stdout`` for tables."""
        if self._out is None:
            self._out = _console_class()(file=self.stdout, soft_wrap=True)
        return self._out

    @property
    def err(self) -> Console:
        """A rich console on ``stderr`` for progress, status and errors."""
        if self._err is None:
            self._err = _console_class()(file=self.stderr, stderr=True, soft_wrap=True)
        return self._err

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

        shown = not (quiet or self.quiet) and _may_be_terminal(self.stderr) and self.err.is_terminal
        return ProgressBar(self.err if shown else None, description, total)

    @property
    def stdout_is_tty(self) -> bool:
        """True when stdout is a terminal (pretty output), False when piped."""
        return bool(getattr(self.stdout, "isatty", lambda: False)())


def _may_be_terminal(stream: TextIO) -> bool:
    """False only where rich's ``Console.is_terminal`` is False too, without importing rich.

    rich says "terminal" for a stream that is a tty, or when ``TTY_COMPATIBLE=1`` or a
    non-empty ``FORCE_COLOR`` says so; a redirected stderr (scripts, benchmarks) needs no
    rich to learn that no progress bar is drawn.
    """
    if os.environ.get("TTY_COMPATIBLE") == "1" or os.environ.get("FORCE_COLOR") is not None:
        return True
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty()) if isatty is not None else False
    except ValueError:
        return False


@functools.cache
def _console_class() -> type[Console]:
    from rich.console import Console

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
            except (OSError, ValueError, AttributeError):
                raise BrokenPipeError from None  # tests' StringIO: nothing flushes it
            silence_fd(fd)
            raise BrokenPipeError

    return _Console


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
