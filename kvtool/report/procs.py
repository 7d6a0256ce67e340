"""How many ``--jobs`` threads a report uses by default.

No polars and no numpy here: the report command asks before it imports the report
library. ``--jobs`` are threads of the caller's process (:mod:`kvtool.report.parallel`);
nothing here starts a process or changes a process-wide setting.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence

PARALLEL_FROM_BYTES = 64 << 20
"""Inputs smaller than this in all are decoded by one thread by default.

Chosen when ``--jobs`` were processes (on a 10 MB recording the pool cost more than it took
over); with threads, ``--jobs 2`` on the 10 MB bench recording still takes 1.14x the wall
time of ``--jobs 1`` (bench/RESULTS.md, "Engine 2, threads"), so the default stays."""


SHARD_RATIO = 16
"""An input smaller on disk than a chunk's payload bytes over this (about one chunk of
payload: recordings are zstd, ~10x) is decoded by one thread even with ``--jobs``: there is
one chunk, nothing to share."""


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
            all, one decoding thread is used (the decode thread and the builder already
            keep two cores busy on such inputs).

    Returns:
        At least 1.
    """
    if paths and input_bytes(paths) < PARALLEL_FROM_BYTES:
        return 1
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


__all__ = [
    "PARALLEL_FROM_BYTES",
    "SHARD_RATIO",
    "default_jobs",
    "input_bytes",
]
