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


__all__ = [
    "PARALLEL_FROM_BYTES",
    "SHARD_RATIO",
    "default_jobs",
    "input_bytes",
]
