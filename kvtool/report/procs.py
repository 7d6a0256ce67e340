"""Where ``--jobs`` work runs: how many processes, and the fork server they start from.

No polars and no numpy here: the report command asks for the fork server before it
imports the report library, so that the server's own imports (polars, numpy, kvtool:
~0.3 s of CPU) run on another core while this process makes its imports.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from multiprocessing.context import ForkServerContext, SpawnContext

from kvtool import _signals

PARALLEL_FROM_BYTES = 64 << 20
"""One stream smaller than this in all is decoded in one process by default.

Measured (bench/RESULTS.md): on a 10 MB recording, shipping chunks to worker processes costs
more than the decoding they take over (``--jobs 2`` 0.98x the time of the default, ``--jobs
1`` 0.80x); on a 104 MB one the pool pays (0.96x)."""


SHARD_RATIO = 16
"""An input smaller on disk than a chunk's payload bytes over this (about one chunk of
payload: recordings are zstd, ~10x) is read in one process even with ``--jobs``: starting
processes would cost more than the decoding they share."""


def input_bytes(paths: Sequence[str | os.PathLike[str]]) -> int:
    """The recordings' size in bytes on disk (those that cannot be read count 0)."""
    total = 0
    for p in paths:
        with contextlib.suppress(OSError):
            total += os.stat(p).st_size
    return total


def default_jobs(paths: Sequence[str | os.PathLike[str]] = ()) -> int:
    """The default of ``--jobs``: the machine's usable cores, or 1 for small inputs.

    Args:
        paths: The recordings; when they hold less than :data:`PARALLEL_FROM_BYTES` in
            all, one process is faster than a pool -- for one stream and for several
            (measured, bench/RESULTS.md 4c: two 10 MB ranks take 2.2 s in one process,
            whose decode thread and builder already keep two cores busy, and 2.5 s in a
            pool of two, whose workers first import polars and numpy).

    Returns:
        At least 1.
    """
    if paths and input_bytes(paths) < PARALLEL_FROM_BYTES:
        return 1
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8
_BIG_BUFFERS = 32 << 20  # glibc's largest mmap threshold on 64-bit (HEAP_MAX_SIZE / 2)


def keep_big_buffers() -> bool:
    """Let glibc's malloc reuse the heap for chunk-sized buffers instead of mmapping each.

    A chunk crosses the pipe as buffers of ~20 MB (the pickled raw chunk, the decoded
    table's IPC stream). Past its mmap threshold glibc maps each one fresh and unmaps it
    on free, so every chunk faults in ~40 MB of new pages on both ends (hundreds of
    thousands of page faults, seconds of system time on a 100 MB recording). Raising the
    threshold and keeping a padded heap top lets the next chunk reuse the same pages.

    Returns:
        True if set (glibc); False elsewhere (nothing changed).
    """
    return _mallopt(
        (_M_MMAP_THRESHOLD, _BIG_BUFFERS),
        (_M_TRIM_THRESHOLD, 4 * _BIG_BUFFERS),
        (_M_TOP_PAD, _BIG_BUFFERS),
    )


def one_arena() -> bool:
    """Keep glibc's malloc to one arena in this process, for the threads it starts later.

    The driver of ``--jobs N`` keeps big buffers (:func:`keep_big_buffers`); each of its
    threads (the reading thread, the distinct-hash count at the end) would otherwise get
    an arena of its own whose pages are never given back: the 10x ``--jobs 2`` driver
    peaked at 298 MB with them, 255 MB with one arena, in the same time. Call it before
    those threads start.

    Returns:
        True if set (glibc); False elsewhere (nothing changed).
    """
    return _mallopt((_M_ARENA_MAX, 1))


def give_back_big_buffers() -> bool:
    """Have glibc's malloc map every buffer of 1 MiB or more, and unmap it when freed.

    The opposite trade of :func:`keep_big_buffers`, for a process that runs for days
    (``kvtool serve``): glibc's threshold otherwise rises to each freed mapping's size (up
    to 32 MiB), and the state's tables of ~16 MiB arrays, rebuilt now and then, are then
    carved from the heap, whose holes are never given back: RSS grew by each rebuild.

    Returns:
        True if set (glibc); False elsewhere (nothing changed).
    """
    return _mallopt((_M_MMAP_THRESHOLD, 1 << 20))


def _mallopt(*settings: tuple[int, int]) -> bool:
    import ctypes
    import platform

    if platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    ok = 1
    for param, value in settings:
        ok &= mallopt(param, value)
    return bool(ok)


def init_worker() -> None:
    """Set up a pool worker: Ctrl-C is the driver's to handle; big buffers are reused."""
    # Ctrl-C reaches the whole process group: the driver handles it (and shuts the pool
    # down); a worker dying of it would only blur the exit status.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    keep_big_buffers()


def context() -> ForkServerContext | SpawnContext:
    """Processes forked from a server that imported kvtool once.

    Not a fork of this process, whose threads (polars' pool, the prefetch thread) must
    not be forked.
    """
    if not sys.platform.startswith("linux"):
        return multiprocessing.get_context("spawn")
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["kvtool.columns"])
    return ctx


@contextlib.contextmanager
def one_polars_thread() -> Iterator[None]:
    """Processes started inside run polars with one thread each: they share the cores.

    A fork server and the processes it forks read the variable when they import polars;
    this process's polars has long read it.
    """
    name = "POLARS_MAX_THREADS"
    was = os.environ.get(name)
    os.environ[name] = "1"
    try:
        yield
    finally:
        if was is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = was


def start_server() -> None:
    """Start the fork server now (Linux), while this process still imports.

    Its preload (:func:`context`) then overlaps this process's own start-up instead of
    delaying the first worker. :func:`stop_servers` stops it, used or not.
    """
    if not sys.platform.startswith("linux"):
        return
    from multiprocessing import forkserver

    one_arena()  # before this process starts its threads
    context()
    # Ctrl-C reaches the whole process group: the server, still importing, would print a
    # traceback of its own. Started with SIGINT ignored, it keeps ignoring it (as its
    # workers do; this process handles Ctrl-C and stops them).
    main = threading.current_thread() is threading.main_thread()
    was = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None
    try:
        with one_polars_thread():
            forkserver.ensure_running()
    finally:
        if main and not _signals.taken():  # a SIGTERM meanwhile: leave both ignored
            signal.signal(signal.SIGINT, was)


def stop_servers() -> None:
    """Stop the forkserver and resource-tracker processes the pool started.

    They would outlive the report by a moment and be left for init to reap. ``multiprocessing``
    offers no public call for it; their private ``_stop`` (used by CPython's own tests) closes
    each server's pipe and reaps it. Without it, they end when this process does.
    """
    from multiprocessing import forkserver, resource_tracker

    # A Ctrl-C in the middle of a stop would leave a server half stopped (its pipe
    # closed, its process not reaped), and the next stop failing: it waits until after.
    with deferred_interrupt():
        for server in (
            getattr(forkserver, "_forkserver", None),
            getattr(resource_tracker, "_resource_tracker", None),
        ):
            stop = getattr(server, "_stop", None)
            if callable(stop):
                with contextlib.suppress(OSError, ValueError, TypeError, ChildProcessError):
                    stop()


@contextlib.contextmanager
def deferred_interrupt() -> Iterator[None]:
    """Hold a Ctrl-C that arrives inside the block until it ends, then raise it.

    For cleanup that must not stop half way. Only the main thread receives signals; in
    another thread the block runs as it is.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    hit: list[int] = []

    def hold(signum: int, frame: object) -> None:
        hit.append(signum)

    was = signal.signal(signal.SIGINT, hold)
    try:
        yield
    finally:
        if not _signals.taken():  # a SIGTERM meanwhile: leave both ignored
            signal.signal(signal.SIGINT, was)
    if hit:
        if was is _signals.interrupt_once:
            _signals.interrupt_once(signal.SIGINT, None)  # ignoring the rest, as always
        raise KeyboardInterrupt


__all__ = [
    "PARALLEL_FROM_BYTES",
    "SHARD_RATIO",
    "context",
    "default_jobs",
    "deferred_interrupt",
    "give_back_big_buffers",
    "init_worker",
    "input_bytes",
    "keep_big_buffers",
    "one_arena",
    "one_polars_thread",
    "start_server",
    "stop_servers",
]
