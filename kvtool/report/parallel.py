"""``--jobs`` and ``--ray``: the report's work on many cores or machines, exactly.

Two kinds of work, the same functions on a local process pool and on Ray:

- **Units** (:func:`report_units`): inputs that hold several publisher streams -- a file
  per rank, or one recorder's file of every rank -- are split into units that share no
  stream (:func:`kvtool.report.partial.plan_units`). Each unit is reported from empty
  state by :func:`kvtool.report.partial.report_unit`, in a worker process or a Ray task
  that reads its own files (Ray: paths every worker can read), and the partial reports
  merge exactly (:meth:`kvtool.report.ReportBuilder.from_partials`). When the merge
  cannot be exact (a recording out of THE merge order's key order) it declines and the
  caller reads everything in one ordered pass.
- **One stream**: a stream's live state carries from chunk to chunk (a remove in chunk 5
  pairs with its store in chunk 2), so the report is one ordered pass; only reading,
  decoding and annotating are spread out, and the tables come back *in stream order* to
  feed :class:`kvtool.report.ReportBuilder` exactly as a single-process run does, so every
  count, set, percentile and peak is identical to ``--jobs 1``.

  - Locally (:func:`shard_map`), each of ``--jobs`` processes reads the whole input
    itself and decodes every ``jobs``-th chunk (:func:`kvtool.columns.read_shard`):
    reading costs a tenth of decoding, and no payload crosses a pipe -- only each
    chunk's table, as compressed Arrow IPC.
  - On Ray (:func:`ray_decode_map`), the driver reads the recordings into raw chunks and
    hands them out (:func:`kvtool.columns.decode_chunk`: pure, picklable in and out):
    the payloads travel, the workers need not see the files.
- **Memory**: a chunk or two a process (a reading process waits on its pipe until its
  table is taken; Ray keeps ``in_flight`` chunks out), so memory stays flat as a
  recording grows, as in a single-process run.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import sys
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from multiprocessing.connection import Connection
from multiprocessing.context import ForkServerContext, SpawnContext
from typing import TYPE_CHECKING, TypeVar

from kvtool.columns import (
    DecodedChunk,
    DecodeMap,
    Progress,
    RawChunk,
    ReadPlan,
    ShardItem,
    ShardMap,
    TableAnnotator,
    decode_chunk,
    read_shard,
)
from kvtool.errors import KvtoolError, UsageError

if TYPE_CHECKING:
    from types import ModuleType

    from kvtool.report.aggregates import Report
    from kvtool.report.partial import Unit

T = TypeVar("T")
H = TypeVar("H")

RAY_INSTALL_HINT = "--ray needs Ray: pip install 'kvtool[ray]' (or pip install ray)"


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


def ordered(
    items: Iterator[RawChunk],
    submit: Callable[[RawChunk], H],
    result: Callable[[H], T],
    in_flight: int,
    head: H | None = None,
) -> Iterator[T]:
    """Submit items ahead (at most ``in_flight`` outstanding), yield results in item order.

    Args:
        items: The work, in order.
        submit: Starts one item; returns a handle.
        result: Waits for a handle's result.
        in_flight: How many items may be outstanding.
        head: The handle of an item submitted already, before ``items``.

    Yields:
        The results, in the order of ``items``.
    """
    pending: deque[H] = deque() if head is None else deque([head])
    for item in items:
        pending.append(submit(item))
        if len(pending) >= in_flight:
            yield result(pending.popleft())
    while pending:
        yield result(pending.popleft())


_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3
_BIG_BUFFERS = 32 << 20  # glibc's largest mmap threshold on 64-bit (HEAP_MAX_SIZE / 2)


def _keep_big_buffers() -> bool:
    """Let glibc's malloc reuse the heap for chunk-sized buffers instead of mmapping each.

    A chunk crosses the pipe as buffers of ~20 MB (the pickled raw chunk, the decoded
    table's IPC stream). Past its mmap threshold glibc maps each one fresh and unmaps it
    on free, so every chunk faults in ~40 MB of new pages on both ends (hundreds of
    thousands of page faults, seconds of system time on a 100 MB recording). Raising the
    threshold and keeping a padded heap top lets the next chunk reuse the same pages.

    Returns:
        True if set (glibc); False elsewhere (nothing changed).
    """
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
    ok = mallopt(_M_MMAP_THRESHOLD, _BIG_BUFFERS)
    ok &= mallopt(_M_TRIM_THRESHOLD, 4 * _BIG_BUFFERS)
    ok &= mallopt(_M_TOP_PAD, _BIG_BUFFERS)
    return bool(ok)


def _init_worker() -> None:
    """Set up a pool worker: Ctrl-C is the driver's to handle; big buffers are reused."""
    # Ctrl-C reaches the whole process group: the driver handles it (and shuts the pool
    # down); a worker dying of it would only blur the exit status.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _keep_big_buffers()


def _context() -> ForkServerContext | SpawnContext:
    """Processes forked from a server that imported kvtool once.

    Not a fork of this process, whose threads (polars' pool, the prefetch thread) must
    not be forked.
    """
    if not sys.platform.startswith("linux"):
        return multiprocessing.get_context("spawn")
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["kvtool.columns"])
    return ctx


def _pool(jobs: int) -> ProcessPoolExecutor:
    """A process pool of ``jobs`` workers (:func:`_context`)."""
    return ProcessPoolExecutor(max_workers=jobs, mp_context=_context(), initializer=_init_worker)


def _ray_connect(ray: ModuleType, address: str) -> bool:
    """Connect to the Ray cluster at ``address`` unless connected; True if connected here."""
    if ray.is_initialized():
        return False
    try:
        ray.init(address=address, include_dashboard=False, log_to_driver=False)
    except Exception as err:  # Ray raises ConnectionError, RuntimeError, ValueError...
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise KvtoolError(f"--ray {address}: cannot connect to the Ray cluster: {first}") from err
    return True


SHARD_POLL_S = 1.0
"""How often the driver, waiting for a reading process, checks that it is still alive."""


def shard_map(jobs: int) -> tuple[ShardMap, Callable[[], None]]:
    """A :data:`kvtool.columns.ShardMap` over ``jobs`` local processes.

    Each process reads the whole input itself and decodes and annotates every
    ``jobs``-th chunk (:func:`kvtool.columns.read_shard`); the tables come back over a
    pipe each, taken in stream order. No payload crosses a pipe and the driver neither
    reads nor decodes: it only builds the report. A process blocks on its pipe until
    the driver takes its chunk, so memory stays at a chunk or two a process.

    Args:
        jobs: Processes (>= 2).

    Returns:
        The map, and a function that stops what it started.
    """
    started = [False]

    def run(plan: ReadPlan) -> Iterator[ShardItem]:
        ctx = _context()
        procs: list[multiprocessing.process.BaseProcess] = []
        conns: list[Connection] = []
        name = "POLARS_MAX_THREADS"  # one polars thread a process: they share the cores
        was = os.environ.get(name)
        os.environ[name] = "1"
        try:
            for k in range(jobs):
                recv, send = ctx.Pipe(duplex=False)
                proc = ctx.Process(
                    target=_shard_worker,
                    args=(plan, k, jobs, send),
                    name=f"kvtool-read-{k}",
                    daemon=True,
                )
                proc.start()
                started[0] = True
                send.close()
                procs.append(proc)
                conns.append(recv)
        finally:
            if was is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = was
        try:
            _keep_big_buffers()
            i = 0
            while True:
                item = _receive(conns[i % jobs], procs[i % jobs])
                yield item
                if item.chunk is None:
                    break
                i += 1
            # The others have read to the end too: each sends its final item and ends.
            for k in range(jobs):
                if k != i % jobs:
                    _receive(conns[k], procs[k])
                procs[k].join(timeout=SHARD_POLL_S)
        finally:
            for worker in procs:
                if worker.is_alive():
                    worker.terminate()  # by its PID: this process started it
                worker.join(timeout=5)
                if worker.is_alive():
                    worker.kill()
                    worker.join(timeout=5)
            for conn in conns:
                conn.close()

    def close() -> None:
        if started[0]:
            _stop_forkserver()

    return run, close


def _receive(conn: Connection, proc: multiprocessing.process.BaseProcess) -> ShardItem:
    """The next item of a reading process; a process that died or failed raises."""
    while not conn.poll(SHARD_POLL_S):
        if not proc.is_alive() and not conn.poll(0):
            raise _died(proc)
    try:
        got = conn.recv()
    except (EOFError, OSError) as err:
        raise _died(proc) from err
    if isinstance(got, BaseException):
        raise got
    if not isinstance(got, ShardItem):
        raise KvtoolError(f"a decoding process sent {type(got).__name__}; try --jobs 1")
    return got


def _died(proc: multiprocessing.process.BaseProcess) -> KvtoolError:
    proc.join(timeout=SHARD_POLL_S)
    return KvtoolError(f"a decoding process died (exit code {proc.exitcode}); try --jobs 1")


def _shard_worker(plan: ReadPlan, shard: int, shards: int, conn: Connection) -> None:
    """A reading process: :func:`kvtool.columns.read_shard` onto its pipe."""
    _init_worker()
    try:
        for item in read_shard(plan, shard, shards):
            conn.send(item)
    except BrokenPipeError:
        pass  # the driver stopped reading: it is ending the report
    except BaseException as err:  # handed to the driver, which names it
        try:
            conn.send(err)
        except Exception:  # not picklable: its message
            with contextlib.suppress(OSError):
                conn.send(KvtoolError(f"{type(err).__name__}: {err}"))
    finally:
        conn.close()


def _stop_forkserver() -> None:
    """Stop the forkserver and resource-tracker processes the pool started.

    They would outlive the report by a moment and be left for init to reap. ``multiprocessing``
    offers no public call for it; their private ``_stop`` (used by CPython's own tests) closes
    each server's pipe and reaps it. Without it, they end when this process does.
    """
    from multiprocessing import forkserver, resource_tracker

    for server in (
        getattr(forkserver, "_forkserver", None),
        getattr(resource_tracker, "_resource_tracker", None),
    ):
        stop = getattr(server, "_stop", None)
        if callable(stop):
            with contextlib.suppress(OSError, ValueError, ChildProcessError):
                stop()


def import_ray() -> ModuleType:
    """Import Ray, or explain how to install it.

    Returns:
        The ``ray`` module.

    Raises:
        UsageError: Ray is not installed (exit status 2).
    """
    try:
        import ray
    except ImportError:
        raise UsageError(RAY_INSTALL_HINT) from None
    return ray


def ray_decode_map(address: str, in_flight: int = 8) -> tuple[DecodeMap, Callable[[], None]]:
    """A :data:`kvtool.columns.DecodeMap` running :func:`decode_chunk` as Ray tasks.

    Connects to the cluster at ``address`` unless this process is already connected
    (then that cluster is used, and left connected).

    Args:
        address: A Ray address (``ray://host:10001``, ``host:6379``, ``auto``).
        in_flight: Chunks outstanding at a time.

    Returns:
        The map, and a function that disconnects (when this call connected).

    Raises:
        UsageError: Ray is not installed.
        KvtoolError: The cluster cannot be reached.
    """
    ray = import_ray()
    connected_here = _ray_connect(ray, address)
    task = ray.remote(decode_chunk)

    def run(items: Iterator[RawChunk]) -> Iterator[DecodedChunk]:
        def result(ref: object) -> DecodedChunk:
            got: DecodedChunk = ray.get(ref)
            return got

        return ordered(items, task.remote, result, in_flight)

    def close() -> None:
        if connected_here:
            ray.shutdown()

    return run, close


def report_units(
    paths: Sequence[str | os.PathLike[str]],
    units: list[Unit],
    annotator: TableAnnotator,
    *,
    every_ns: int | None,
    chunk_bytes: int,
    clock: str,
    jobs: int,
    ray_address: str | None,
    progress: Progress | None = None,
) -> Report:
    """Report each unit on its own (pool or Ray) and merge the partial reports exactly.

    Args:
        paths: The recordings, in command-line order.
        units: Input indices per unit (:func:`kvtool.report.partial.plan_units`).
        annotator: The driver's annotator (THE annotation of the whole input).
        every_ns: Timeline bucket (ns), or None.
        chunk_bytes: Payload bytes per chunk.
        clock: The timeline's clock.
        jobs: Worker processes on this machine.
        ray_address: Run the units as Ray tasks on this cluster instead.
        progress: Called with (bytes done, bytes total) as units finish.

    Returns:
        The report.

    Raises:
        NotMergeable: The partial reports cannot be merged exactly.
        UsageError: ``ray_address`` given but Ray is not installed.
        KvtoolError: A worker died, or the cluster cannot be reached.
    """
    from kvtool.report.builder import ReportBuilder, finish_report
    from kvtool.report.partial import PartialReport, UnitTask, report_unit

    names = [os.fspath(p) for p in paths]
    # Ray workers run elsewhere (another working directory): they get absolute paths,
    # and the partial reports name each recording as the command line did.
    where = [os.path.abspath(n) for n in names] if ray_address is not None else names
    tasks = [
        UnitTask(
            paths=[where[i] for i in unit.inputs],
            names=[names[i] for i in unit.inputs],
            inputs=list(unit.inputs),
            streams=unit.streams,
            annotation=annotator.annotation,
            every_ns=every_ns,
            clock=clock,
            chunk_bytes=chunk_bytes,
        )
        for unit in units
    ]
    sizes = []
    for unit in units:
        total = 0
        for i in unit.inputs:
            with contextlib.suppress(OSError):
                total += os.stat(names[i]).st_size
        sizes.append(total)
    total_bytes = sum(sizes)
    done = 0
    parts: list[PartialReport] = []
    if ray_address is not None:
        ray = import_ray()
        connected_here = _ray_connect(ray, ray_address)
        try:
            task = ray.remote(report_unit)
            refs = [task.remote(t) for t in tasks]
            for ref, size in zip(refs, sizes, strict=True):
                parts.append(ray.get(ref))
                done += size
                if progress is not None:
                    progress(done, total_bytes)
        finally:
            if connected_here:
                ray.shutdown()
    else:
        pool = _pool(min(jobs, len(tasks)))
        try:
            futures = [pool.submit(report_unit, t) for t in tasks]
            for fut, size in zip(futures, sizes, strict=True):
                try:
                    parts.append(fut.result())
                except BrokenProcessPool as err:
                    raise KvtoolError(
                        f"a report worker process died ({err}); try --jobs 1"
                    ) from err
                done += size
                if progress is not None:
                    progress(done, total_bytes)
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
            _stop_forkserver()
    builder, stats = ReportBuilder.from_partials(parts, annotator.group_kind, every_ns, clock)
    annotator.adopt(stats, [p.out_of_range for p in parts])
    return finish_report(builder, annotator, stats)


__all__ = [
    "RAY_INSTALL_HINT",
    "SHARD_RATIO",
    "default_jobs",
    "import_ray",
    "input_bytes",
    "ordered",
    "ray_decode_map",
    "report_units",
    "shard_map",
]
