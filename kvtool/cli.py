"""The kvtool command line: a thin typer layer that maps library errors to exit statuses."""

from __future__ import annotations

import contextlib
import errno
import functools
import gc
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ParamSpec, TextIO, cast

import kvtool
from kvtool import _jit, _signals
from kvtool.commands import get_env
from kvtool.errors import ExitStatus, KvtoolError
from kvtool.outputs import silence_fd

if TYPE_CHECKING:
    import typer

# typer (and the typer app) are imported and built when main() or ``app`` first needs
# them, not when this module is imported: a worker process of ``report --jobs`` imports
# the console script, hence this module, and needs none of it (~40 ms each).

P = ParamSpec("P")

_EPILOG = (
    "\b\n"
    "Formats (--format): table for people (info, report, diff); json (info,\n"
    "report, diff); csv (report); markdown (report, diff); replay: pretty or\n"
    "jsonl. -o/--output FILE writes a file (- is stdout where the output is a\n"
    "stream); --force replaces an existing file, or a directory kvtool made.\n"
    "\b\n"
    "Exit status: 0 done; 1 failed (or diff --fail-on, replay --check found\n"
    "something); 2 usage error; 3 done, but an input was damaged or batches were\n"
    "lost while recording (or never confirmed); 130 interrupted (Ctrl-C,\n"
    "SIGTERM, SIGHUP; record and serve end normally on them).\n"
    "\b\n"
    "Examples:\n"
    "  kvtool record tcp://gpu:5557 --replay-endpoint tcp://gpu:5558 -o run.mcap\n"
    "  kvtool info run.mcap\n"
    "  kvtool report run.mcap --by kind,window,group\n"
    "  kvtool replay run.mcap --type BlockRemoved --format jsonl | jq .hash"
)


@functools.cache
def _get_app() -> typer.Typer:
    """The typer app with its root options, and no command yet (see :func:`_register`)."""
    import typer

    from kvtool.commands._help import KvtoolGroup

    app = typer.Typer(
        name="kvtool",
        cls=KvtoolGroup,
        help="Record, replay and report vLLM KV-cache events, per cache kind and sliding window.",
        pretty_exceptions_show_locals=False,
        pretty_exceptions_enable=False,
        no_args_is_help=True,
        add_completion=False,
        # Plain help (kvtool.commands._help): help texts hold brackets like IDX=KIND[:WINDOW]
        # that rich markup would eat; panels and placeholders are rendered there instead.
        rich_markup_mode=None,
        context_settings={"help_option_names": ["-h", "--help"]},
        epilog=_EPILOG,
    )

    # Options as defaults (not Annotated): typer resolves this module's string
    # annotations in its globals, where typer is not imported.
    @app.callback()
    def _root(
        traceback: bool = typer.Option(
            False, "--traceback", help="Show the full traceback on an error."
        ),
        version: bool = typer.Option(
            False, "--version", callback=_version, is_eager=True, help="Print the version."
        ),
    ) -> None:
        """Record, replay and report vLLM KV-cache events, per cache kind and sliding window."""
        _state["traceback"] = traceback

    return app


_state = {"traceback": False}


def _version(value: bool) -> None:
    import typer

    if value:
        typer.echo(f"kvtool {kvtool.__version__}")
        raise typer.Exit()


def command(fn: Callable[P, ExitStatus | int | None]) -> Callable[P, None]:
    """Wrap a command body: translate errors to one line on stderr and an exit status.

    Args:
        fn: The command body; returns an ExitStatus (None means OK).

    Returns:
        The wrapped function, for ``app.command``.
    """

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> None:
        inner = sys.stdout
        guard = cast("TextIO", ReaderAwareStdout(inner))
        sys.stdout = guard
        try:
            _call(fn, args, kwargs)
        finally:
            if sys.stdout is guard:
                sys.stdout = inner

    return wrapper


def _call(fn: Callable[..., ExitStatus | int | None], args: Any, kwargs: Any) -> None:
    """Run a command body; errors become one line on stderr and an exit status."""
    import typer

    env = get_env()
    try:
        status = fn(*args, **kwargs)
    except typer.Exit:
        raise
    except KvtoolError as err:
        if _state["traceback"]:
            raise
        env.err.print(f"kvtool: {err}", markup=False, highlight=False)
        raise typer.Exit(int(err.exit_status)) from None
    except KeyboardInterrupt:
        env.err.print("kvtool: interrupted", markup=False, highlight=False)
        raise typer.Exit(int(ExitStatus.INTERRUPTED)) from None
    except BrokenPipeError:
        # A write that bypassed the guard found the reader gone: the command was cut
        # short, its status unknown; the reader chose to stop reading, not an error.
        _silence_stdout()
        raise typer.Exit(int(ExitStatus.OK)) from None
    except Exception as err:
        if _state["traceback"]:
            raise
        if isinstance(err, OSError) and _stdout_failed(err):
            _stdout_lost(err)
            raise typer.Exit(int(ExitStatus.FAILED)) from None
        env.err.print(
            f"kvtool: internal error: {type(err).__name__}: {err} "
            "(rerun with --traceback and report it)",
            markup=False,
            highlight=False,
        )
        raise typer.Exit(int(ExitStatus.FAILED)) from None
    if status:
        raise typer.Exit(int(status))


class ReaderAwareStdout:
    """stdout while a command runs: the reader going away (``| head``) does not end it.

    The first write (or flush) that finds the pipe closed points descriptor 1 at
    /dev/null and sets :attr:`reader_gone`; every later write is dropped. The command
    runs to its end and its exit status stands: a crossed ``diff --fail-on``, lost
    batches or a ``replay --check`` disagreement still exit non-zero behind ``| head``
    (issue 24; before, a broken pipe anywhere meant exit 0). Everything else is the
    stream's own (``buffer``, ``isatty``, ``fileno``, ``encoding``).

    Args:
        inner: The real stdout.

    Attributes:
        reader_gone: The reader closed the pipe; nothing written arrives anywhere.
    """

    def __init__(self, inner: TextIO) -> None:
        self.inner = inner
        self.reader_gone = False

    def write(self, text: str) -> int:
        """Write ``text``; once the reader is gone, drop it."""
        if not self.reader_gone:
            try:
                return self.inner.write(text)
            except BrokenPipeError:
                self._gone()
        return len(text)

    def writelines(self, lines: Any) -> None:
        """Write each line (see :meth:`write`)."""
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        """Flush; a reader gone meanwhile is not an error."""
        if self.reader_gone:
            with contextlib.suppress(OSError, ValueError):
                self.inner.flush()  # to /dev/null now: empties the buffer
            return
        try:
            self.inner.flush()
        except BrokenPipeError:
            self._gone()
            with contextlib.suppress(OSError, ValueError):
                self.inner.flush()

    def _gone(self) -> None:
        self.reader_gone = True
        try:
            fd = self.inner.fileno()
        except (OSError, ValueError, AttributeError):
            return  # not a real file (tests' streams)
        silence_fd(fd)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


# Errors a write to a full, failing or too-small stdout raises (``> /dev/full``).
_WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EIO, errno.EFBIG, errno.EDQUOT})


def _stdout_failed(err: OSError) -> bool:
    """True when ``err`` came from writing stdout, not from a file the command named.

    An error about a named file carries that file's name; a write to stdout is made by
    a frame that holds stdout, or an object (``self``) whose ``file``/``stream`` it is.
    """
    if err.filename is not None or err.errno not in _WRITE_ERRNOS:
        return False
    out = sys.stdout
    streams = [out, getattr(out, "buffer", None)]
    tb = err.__traceback__
    while tb is not None:
        for value in tb.tb_frame.f_locals.values():
            if any(value is s for s in streams if s is not None):
                return True
            # A rich Console (``file``) or a kvtool writer (``stream``) on stdout.
            if any(getattr(value, name, None) is out for name in ("file", "stream")):
                return True
        tb = tb.tb_next
    return False


def _stdout_lost(err: OSError) -> None:
    """Say stdout could not be written (one line), and keep the exit flush from failing."""
    reason = err.strerror or str(err)
    try:
        sys.stderr.write(f"kvtool: cannot write to stdout: {reason}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    _silence_stdout()


def _silence_stdout() -> None:
    # What is still buffered can never be written: fd 1 goes to /dev/null.
    try:
        fd = sys.stdout.fileno()
    except (OSError, ValueError, AttributeError):
        return  # not a real file (tests' streams): nothing flushes it at exit
    silence_fd(fd)


_registered: set[str] = set()
# Process-wide settings a command asks for its own process (``PROCESS_SETTINGS`` of its
# module), by command name; only :func:`main`, the process's entry, makes them.
_process_settings: dict[str, Callable[[], object]] = {}


def _command_modules() -> list[str]:
    import pkgutil

    import kvtool.commands as pkg

    return [m.name for m in pkgutil.iter_modules(pkg.__path__) if not m.name.startswith("_")]


def _register(only: str | None = None) -> typer.Typer:
    """Import command modules and add their commands to the app.

    A command module may pull in heavy libraries (polars for report, pyzmq for record),
    so the console script imports only the module of the command it runs.

    Args:
        only: The one module to load, or None for all of them.

    Returns:
        The app.
    """
    import importlib

    from kvtool.commands._help import KvtoolCommand

    app = _get_app()
    for name in [only] if only is not None else _command_modules():
        if name in _registered:
            continue
        _registered.add(name)
        module = importlib.import_module(f"kvtool.commands.{name}")
        _process_settings.update(getattr(module, "PROCESS_SETTINGS", {}))
        for cmd_name, fn in getattr(module, "COMMANDS", {}).items():
            options: dict[str, Any] = {"cls": KvtoolCommand}
            options.update(getattr(module, "COMMAND_OPTIONS", {}).get(cmd_name, {}))
            KvtoolCommand.panels[cmd_name] = getattr(module, "HELP_PANELS", {}).get(cmd_name, {})
            app.command(cmd_name, **options)(command(fn))
    return app


def _version_first(args: list[str]) -> bool:
    """True when ``--version`` (eager) is processed before ``--help`` would list commands.

    The root options take no values and click runs eager options in the order given, so
    with no command named, a ``--version`` ahead of any ``-h/--help`` answers alone.
    """
    for arg in args:
        if arg == "--version":
            return True
        if arg in ("-h", "--help", "--"):
            return False
    return False


def __getattr__(name: str) -> typer.Typer:
    # ``kvtool.cli.app`` (tests, docs, entry points of other tools) is the full app.
    if name == "app":
        return _register()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main() -> None:
    """Entry point of the ``kvtool`` console script.

    Click's own usage errors (unknown option, missing argument, bad value) become one
    line on stderr and exit status 2, like every other kvtool error.
    """
    args = sys.argv[1:]
    # numba caches kernels in a folder of this kvtool's sources (no stale machine code after
    # a change in another module), and a command that compiles (a cold run) says so once.
    _jit.use_a_cache_of_these_sources()
    _jit.say_when_compiling()
    # Python's default SIGTERM ends the process without unwinding: temporary files of
    # -o/--plot/export would stay beside the output (the console script installed this
    # already; `kvtool.cli.main()` called from Python gets it here).
    _signals.install(args)
    try:
        _main(args, _signals.command_name(args))
    except KeyboardInterrupt:
        # Before a command runs (importing typer, parsing) or after it: one line, never a
        # traceback; inside a command its wrapper says so and cleans up.
        _signals.interrupted()


def _main(args: list[str], wanted: str | None) -> None:
    import typer.main

    try:  # typer >= 0.22 vendors its own click
        from typer._click import exceptions as click_exc
    except ImportError:  # pragma: no cover - older typer uses click itself
        from click import exceptions as click_exc  # type: ignore[no-redef,import-not-found,unused-ignore]

    if wanted is None and _version_first(args):
        app = _get_app()  # `kvtool --version` prints before any command is looked at
    else:
        app = _register(wanted if wanted in _command_modules() else None)
    setting = _process_settings.get(wanted) if wanted is not None else None
    if setting is not None:
        # This process runs that command (the console script, not a library call): its
        # process-wide settings (serve: glibc's mmap threshold) are made here, once.
        setting()
    cmd = typer.main.get_command(app)
    try:
        rv = cmd.main(prog_name="kvtool", standalone_mode=False)
    except click_exc.NoArgsIsHelpError as err:
        err.show()
        sys.exit(int(ExitStatus.USAGE))
    except click_exc.UsageError as err:
        where = err.ctx.command_path if err.ctx is not None else "kvtool"
        sys.stderr.write(f"{where}: {err.format_message()} (see '{where} --help')\n")
        sys.exit(int(ExitStatus.USAGE))
    except typer.Abort:
        sys.stderr.write("kvtool: interrupted\n")
        sys.exit(int(ExitStatus.INTERRUPTED))
    except click_exc.ClickException as err:
        sys.stderr.write(f"kvtool: {err.format_message()}\n")
        sys.exit(err.exit_code)
    # The command is done and whatever is still alive lives until exit: the collector's
    # passes over it at shutdown (the modules of polars, numpy, typer: tens of ms) find
    # nothing kvtool needs; files are closed by the commands and the streams flushed here.
    gc.freeze()
    status = rv if isinstance(rv, int) else int(ExitStatus.OK)
    try:
        sys.stdout.flush()  # here, not at exit, where a failure would be a traceback
    except BrokenPipeError:
        _silence_stdout()  # the reader went away (`| head`): the command's status stands
        sys.exit(status)
    except ValueError:
        pass  # stdout already closed
    except OSError as err:
        _stdout_lost(err)
        sys.exit(int(ExitStatus.FAILED))
    sys.exit(status)
