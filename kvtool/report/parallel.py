"""``--jobs`` and ``--ray``: the report's work on many cores or machines, exactly.

Two kinds of work, the same functions on local threads and on Ray:

- **Units** (:func:`kvtool.report.api.report_units`, run by :func:`map_units`): inputs
  that hold several publisher streams -- a file per rank, or one recorder's file of
  every rank -- are split into units that share no stream
  (:func:`kvtool.report.partial.plan_units`). Each unit is reported from empty
  state by :func:`kvtool.report.run.report_unit`, in a thread of this process or a Ray
  task that reads its own files (Ray: paths every worker can read), and the partial
  reports merge exactly (:meth:`kvtool.report.ReportBuilder.from_partials`). When the
  merge cannot be exact (a recording out of THE merge order's key order) it declines and
  the caller reads everything in one ordered pass.
- **One stream**: a stream's live state carries from chunk to chunk (a remove in chunk 5
  pairs with its store in chunk 2), so the report is one ordered pass; only decoding and
  annotating are spread out, and the tables come back *in stream order* to feed
  :class:`kvtool.report.ReportBuilder` exactly as a single-threaded run does, so every
  count, set, percentile and peak is identical to ``--jobs 1``.

  - Locally (:func:`thread_decode_map`), ``--jobs`` threads decode the raw chunks
    (:func:`kvtool.columns.decode_chunk`): the numba scanner and state kernel run
    without the GIL, and polars releases it, so the threads share the cores without
    copying a chunk between processes.
  - On Ray (:func:`ray_decode_map`), the driver reads the recordings into raw chunks and
    hands them out (:func:`kvtool.columns.decode_chunk`: pure, picklable in and out):
    the payloads travel, the workers need not see the files.
- **Memory**: ``jobs + 1`` chunks in flight (Ray: ``in_flight``), so memory stays flat as a
  recording grows, as in a single-threaded run.

Nothing here changes a process-wide setting (no fork server, no malloc tuning, no GIL
switch interval): ``--jobs`` is threads of the caller's process.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, TypeVar

from kvtool.columns import DecodedChunk, DecodeMap, Progress, RawChunk, decode_chunk
from kvtool.errors import KvtoolError, UsageError

if TYPE_CHECKING:
    from types import ModuleType


T = TypeVar("T")
H = TypeVar("H")
R = TypeVar("R")

RAY_INSTALL_HINT = "--ray needs Ray: pip install 'kvtool[ray]' (or pip install ray)"


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


RAY_PROBE_S = 5.0
"""How long ``--ray HOST:PORT`` may take to accept a TCP connection before it is refused."""


def _ray_reachable(address: str) -> None:
    """Refuse a ``HOST:PORT`` (or ``ray://HOST:PORT``) that accepts no TCP connection.

    ``ray.init`` retries an unreachable cluster for minutes and prints its own warnings
    (issue 23: ``--ray 127.0.0.1:1`` hung over 100 s): one bounded connect says it first.
    ``auto`` and ``local`` are Ray's own and are not probed.

    Raises:
        KvtoolError: Nothing listens there.
    """
    import socket

    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not port.isdigit() or address in ("auto", "local"):
        return
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=RAY_PROBE_S):
            pass
    except OSError as err:
        raise KvtoolError(
            f"--ray {address}: cannot connect to the Ray cluster: nothing accepts a connection "
            f"at {host}:{port} ({err.strerror or type(err).__name__})"
        ) from err


def _ray_connect(ray: ModuleType, address: str) -> bool:
    """Connect to the Ray cluster at ``address`` unless connected; True if connected here."""
    if ray.is_initialized():
        return False
    _ray_reachable(address)
    try:
        ray.init(address=address, include_dashboard=False, log_to_driver=False)
    except Exception as err:  # Ray raises ConnectionError, RuntimeError, ValueError...
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise KvtoolError(f"--ray {address}: cannot connect to the Ray cluster: {first}") from err
    return True


def thread_decode_map(jobs: int) -> tuple[DecodeMap, Callable[[], None]]:
    """A :data:`kvtool.columns.DecodeMap` running :func:`decode_chunk` on ``jobs`` threads.

    The chunks are decoded (and annotated, when they carry an annotation) ``jobs`` at a
    time and come back in stream order; at most ``jobs + 1`` are in flight.

    Args:
        jobs: Threads (>= 1).

    Returns:
        The map, and a function that stops its threads (after the chunks they decode).
    """
    pool = ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="kvtool-decode")

    def run(items: Iterator[RawChunk]) -> Iterator[DecodedChunk]:
        def submit(raw: RawChunk) -> Future[DecodedChunk]:
            return pool.submit(decode_chunk, raw)

        return ordered(items, submit, Future.result, jobs + 1)

    def close() -> None:
        pool.shutdown(wait=True, cancel_futures=True)

    return run, close


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


def map_units(
    func: Callable[[T], R],
    tasks: Sequence[T],
    sizes: Sequence[int],
    *,
    jobs: int,
    ray_address: str | None,
    progress: Progress | None = None,
) -> list[R]:
    """Run ``func`` over ``tasks`` on local threads or as Ray tasks, in order.

    Args:
        func: A function of one task (a unit of work; picklable, both, for Ray).
        tasks: The tasks.
        sizes: The input bytes of each task (for progress).
        jobs: Threads on this machine.
        ray_address: Run the tasks on this Ray cluster instead.
        progress: Called with (bytes done, bytes total) as tasks finish.

    Returns:
        Each task's result, in task order.

    Raises:
        UsageError: ``ray_address`` given but Ray is not installed.
        KvtoolError: The cluster cannot be reached.
    """
    total_bytes = sum(sizes)
    done = 0
    out: list[R] = []
    if ray_address is not None:
        ray = import_ray()
        connected_here = _ray_connect(ray, ray_address)
        try:
            remote = ray.remote(func)
            refs = [remote.remote(t) for t in tasks]
            for ref, size in zip(refs, sizes, strict=True):
                out.append(ray.get(ref))
                done += size
                if progress is not None:
                    progress(done, total_bytes)
        finally:
            if connected_here:
                ray.shutdown()
        return out
    return _thread_units(func, tasks, sizes, jobs=jobs, progress=progress)


def _thread_units(
    func: Callable[[T], R],
    tasks: Sequence[T],
    sizes: Sequence[int],
    *,
    jobs: int,
    progress: Progress | None,
) -> list[R]:
    """:func:`map_units` on ``jobs`` daemon threads of this process, results in task order.

    Daemon threads: a Ctrl-C ends the report at once (the units still running are
    abandoned with the process), instead of waiting for whole units to finish.
    """
    total_bytes = sum(sizes)
    done = 0
    results: list[Future[R]] = [Future() for _ in tasks]
    todo: deque[int] = deque(range(len(tasks)))
    lock = threading.Lock()

    def work() -> None:
        while True:
            with lock:
                if not todo:
                    return
                i = todo.popleft()
            fut = results[i]
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(func(tasks[i]))
            except BaseException as err:  # handed to the caller, which raises it
                fut.set_exception(err)

    threads = [
        threading.Thread(target=work, name=f"kvtool-unit-{k}", daemon=True)
        for k in range(max(1, min(jobs, len(tasks))))
    ]
    for t in threads:
        t.start()
    out: list[R] = []
    try:
        for fut, size in zip(results, sizes, strict=True):
            out.append(fut.result())
            done += size
            if progress is not None:
                progress(done, total_bytes)
    finally:
        with lock:
            todo.clear()  # units not started are not started
    for t in threads:
        t.join()
    return out


__all__ = [
    "RAY_INSTALL_HINT",
    "import_ray",
    "map_units",
    "ordered",
    "ray_decode_map",
    "thread_decode_map",
]
