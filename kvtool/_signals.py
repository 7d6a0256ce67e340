"""How a kvtool process takes Ctrl-C, SIGTERM and SIGHUP, installed before anything heavy loads.

Imported by the console script's entry point first of all (only ``signal`` and ``sys``),
so that an interrupt while Python still imports kvtool, typer or polars is one line and
exit 130, not a traceback, and SIGTERM or SIGHUP (a closed SSH session) is never Python's
default (an exit without unwinding: temporary outputs left beside the output, a
recording without its ledger, a terminal left on the alternate screen; issue 23).
"""

from __future__ import annotations

import contextlib
import signal
import sys

OWN_SIGNAL_HANDLERS = frozenset({"record"})
"""Commands that stop on SIGTERM, SIGHUP and Ctrl-C themselves (closing the recording they
write). ``top`` takes them as :func:`interrupt_once`: the KeyboardInterrupt unwinds its
screen (restored) and stops its recorder (the ``--record`` file closed with its ledger)."""

STOP_SIGNALS: tuple[signal.Signals, ...] = tuple(
    getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name)
)
"""The signals that end a command cleanly: Ctrl-C, SIGTERM, SIGHUP (where it exists)."""


_taken = False


def taken() -> bool:
    """True once :func:`interrupt_once` ran.

    Code that saved a SIGINT handler and restores it must then leave the signal ignored.
    """
    return _taken


def interrupt_once(signum: int, frame: object) -> None:
    """Ctrl-C, SIGTERM and SIGHUP end the command: temporary outputs removed, exit 130.

    Only the first: more of them while the command cleans up (a second Ctrl-C, or
    ``timeout`` signalling the process group as well as the process) are ignored, so the
    removal of a temporary output or the stop of worker processes is never cut half way
    (it would leave a 100 MB temporary file beside the output, or print a traceback).

    Nor when the interrupt is already unwinding: polars (>= 1.22) takes Ctrl-C itself
    during a query (a native SIGINT handler that raises its own KeyboardInterrupt out of
    the query) and passes the signal on, so this handler runs too, at the next moment
    Python checks for signals: inside the ``finally`` the first KeyboardInterrupt runs. A
    second one raised there cut that cleanup short (``top --record`` stopped by Ctrl-C
    during a snapshot never stopped its recorder thread: the recording was left truncated
    after its first flush, without the ``kvtool.ungrouped`` record and every batch;
    polars issue 23988).
    """
    global _taken
    _taken = True
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    if isinstance(sys.exc_info()[1], KeyboardInterrupt):
        return  # the same Ctrl-C, already unwinding: its cleanup goes on
    raise KeyboardInterrupt


def command_name(args: list[str]) -> str | None:
    """The command a kvtool command line runs (its first word that is not an option)."""
    return next((a for a in args if not a.startswith("-")), None)


def install(args: list[str]) -> None:
    """Take Ctrl-C, SIGTERM and SIGHUP with :func:`interrupt_once`, unless the command has its own.

    Args:
        args: The command line (without the program name).
    """
    if command_name(args) not in OWN_SIGNAL_HANDLERS:
        for sig in STOP_SIGNALS:
            signal.signal(sig, interrupt_once)


def interrupted() -> None:
    """Say so in one line and exit 130 (an interrupt outside any command's own handling)."""
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.write("kvtool: interrupted\n")
    sys.exit(130)
