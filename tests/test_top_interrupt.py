"""Ctrl-C during a polars query is one interrupt: the cleanup after it runs to its end.

polars (>= 1.22) takes SIGINT itself while a query runs: its native handler raises a
KeyboardInterrupt out of the query, and passes the signal on to Python's handler, so
kvtool's :func:`kvtool._signals.interrupt_once` ran too, at the next moment Python looked
for signals -- inside the ``finally`` already unwinding the first KeyboardInterrupt. That
second one cut the cleanup: ``top --record`` never stopped its recorder thread and left a
truncated recording without the metadata it was asked to store (the intermittent
``test_top_record_keeps_the_none_rule`` failure). Real polars, real signals, in a process
of its own.
"""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from kvtool import _signals

# The process installs kvtool's handlers as the console script does (before polars is
# imported), runs polars joins until a SIGINT it sends itself stops one, and then cleans
# up in a `finally` that calls functions (each a moment Python runs pending handlers).
SCRIPT = """
import os, signal, threading, time, traceback
from kvtool import _signals
_signals.install(["top"])
import polars as pl
a = pl.DataFrame({"k": list(range(200_000)), "v": list(range(200_000))})
b = pl.DataFrame({"k": list(range(0, 400_000, 2)), "w": list(range(200_000))})
threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
origin = "none"
try:
    while True:
        a.join(b, on="k", how="left")
except KeyboardInterrupt as err:
    last = traceback.extract_tb(err.__traceback__)[-1]
    origin = "kvtool" if last.name == "interrupt_once" else "polars"
    raise
finally:
    for _ in range(3):
        time.sleep(0.01)
    ignored = signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    print("cleaned up after", origin, "ignored:", ignored, flush=True)
"""


def _in_except() -> str:
    try:
        try:
            raise KeyboardInterrupt  # as polars raises its own out of a query
        except KeyboardInterrupt:
            _signals.interrupt_once(signal.SIGINT, None)
            return "returned"
    except KeyboardInterrupt:
        return "raised again"


def _in_finally() -> str:
    state = "raised again"
    try:
        try:
            raise KeyboardInterrupt
        finally:  # a finally unwinding it (run_plain's, stopping the recorder)
            _signals.interrupt_once(signal.SIGINT, None)
            state = "returned"
    except KeyboardInterrupt:
        return state


def test_interrupt_once_raises_once_and_not_while_an_interrupt_unwinds() -> None:
    """The handler's rule itself: a KeyboardInterrupt, unless one is being handled."""
    old = {s: signal.getsignal(s) for s in _signals.STOP_SIGNALS}
    try:
        with pytest.raises(KeyboardInterrupt):
            _signals.interrupt_once(signal.SIGINT, None)
        assert _signals.taken()
        assert all(signal.getsignal(s) == signal.SIG_IGN for s in _signals.STOP_SIGNALS)
        assert _in_except() == "returned"
        assert _in_finally() == "returned"
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        _signals._taken = False  # this process goes on


def test_ctrl_c_during_a_polars_query_lets_the_cleanup_finish() -> None:
    """A real SIGINT into a real polars join: one KeyboardInterrupt, the finally completes."""
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120, check=False
    )
    # Before: a second KeyboardInterrupt from interrupt_once inside the finally; nothing
    # printed, a traceback "During handling of the above exception" on stderr.
    assert "cleaned up after" in proc.stdout, proc.stderr
    assert "During handling" not in proc.stderr, proc.stderr
    assert proc.stderr.splitlines().count("KeyboardInterrupt") == 1, proc.stderr
    assert "ignored: True" in proc.stdout  # and later signals are ignored
