"""``--jobs`` and ``--ray``: the report's work on many cores or machines, exactly.

Two kinds of work, the same functions on a local process pool and on Ray:

- **Units** (:func:`kvtool.report.api.report_units`, run by :func:`map_units`): inputs
  that hold several publisher streams -- a file per rank, or one recorder's file of
  every rank -- are split into units that share no stream
  (:func:`kvtool.report.partial.plan_units`). Each unit is reported from empty
  state by :func:`kvtool.report.run.report_unit`, in a worker process or a Ray task
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
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, TypeVar

from kvtool.columns import (
    DecodedChunk,
    DecodeMap,
    Progress,
    RawChunk,
    ReadPlan,
    ShardItem,
    ShardMap,
    decode_chunk,
    read_shard,
)
from kvtool.errors import KvtoolError, UsageError
from kvtool.report.procs import (
    context,
    deferred_interrupt,
    init_worker,
    keep_big_buffers,
    one_polars_thread,
    start_server,
    stop_servers,
)

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


def _pool(jobs: int) -> ProcessPoolExecutor:
    """A process pool of ``jobs`` workers (:func:`kvtool.report.procs.context`)."""
    start_server()
    return ProcessPoolExecutor(max_workers=jobs, mp_context=context(), initializer=init_worker)


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


SHARD_POLL_S = 1.0
"""How often the driver, waiting for a reading process, checks that it is still alive."""

SHARD_STALL_S = 600.0
"""The longest a reading process may take to hand over its next chunk (one chunk takes
well under a second): past it, the report stops with an error instead of waiting on."""


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
    # Here, in the caller's thread (the main one: the server then ignores Ctrl-C, see
    # start_server), not in the thread that will iterate a run.
    start_server()
    started = [True]
    # The processes of runs not yet ended. A run is a generator: stopped by an exception
    # (Ctrl-C) in its consumer, its own ``finally`` runs only when it is collected, and
    # the fork server waits for every process it forked; ``close`` ends them first.
    live: list[_Readers] = []

    def run(plan: ReadPlan) -> Iterator[ShardItem]:
        start_server()  # (again: a no-op unless close() stopped it)
        started[0] = True
        readers: _Readers = ([], [])
        live.append(readers)
        procs, conns = readers
        try:
            _start_readers(plan, jobs, procs, conns)
            keep_big_buffers()
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
            _end(procs, conns)
            live[:] = [r for r in live if r is not readers]

    def close() -> None:
        while live:
            _end(*live.pop())
        if started[0]:
            stop_servers()

    return run, close


_Readers = tuple[list[multiprocessing.process.BaseProcess], list[Connection]]


def _start_readers(
    plan: ReadPlan,
    jobs: int,
    procs: list[multiprocessing.process.BaseProcess],
    conns: list[Connection],
) -> None:
    """Start ``jobs`` reading processes, adding each (and its pipe) as it starts."""
    ctx = context()
    with one_polars_thread():
        for k in range(jobs):
            recv, send = ctx.Pipe(duplex=False)
            conns.append(recv)
            proc = ctx.Process(
                target=_shard_worker,
                args=(plan, k, jobs, send),
                name=f"kvtool-read-{k}",
                daemon=True,
            )
            proc.start()
            procs.append(proc)
            send.close()


def _end(procs: list[multiprocessing.process.BaseProcess], conns: list[Connection]) -> None:
    """Stop reading processes (by their PIDs: this process started them) and close pipes."""
    for worker in procs:
        if worker.is_alive():
            worker.terminate()
        worker.join(timeout=5)
        if worker.is_alive():
            worker.kill()
            worker.join(timeout=5)
    for conn in conns:
        conn.close()
    procs.clear()
    conns.clear()


def _receive(
    conn: Connection, proc: multiprocessing.process.BaseProcess, stall_s: float = SHARD_STALL_S
) -> ShardItem:
    """The next item of a reading process; a process that died, failed or stalled raises."""
    deadline = time.monotonic() + stall_s
    while not conn.poll(min(SHARD_POLL_S, stall_s)):
        if not proc.is_alive() and not conn.poll(0):
            raise _died(proc)
        if time.monotonic() >= deadline:
            raise KvtoolError(
                f"a decoding process (pid {proc.pid}) handed over nothing for {stall_s:g} s; "
                "try --jobs 1"
            )
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
    init_worker()
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
    """Run ``func`` over ``tasks`` on a local process pool or as Ray tasks, in order.

    Args:
        func: A picklable function of one picklable task (a unit of work).
        tasks: The tasks.
        sizes: The input bytes of each task (for progress).
        jobs: Worker processes on this machine.
        ray_address: Run the tasks on this Ray cluster instead.
        progress: Called with (bytes done, bytes total) as tasks finish.

    Returns:
        Each task's result, in task order.

    Raises:
        UsageError: ``ray_address`` given but Ray is not installed.
        KvtoolError: A worker died, or the cluster cannot be reached.
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
    pool = _pool(min(jobs, len(tasks)))
    try:
        futures = [pool.submit(func, t) for t in tasks]
        for fut, size in zip(futures, sizes, strict=True):
            try:
                out.append(fut.result())
            except BrokenProcessPool as err:
                raise KvtoolError(f"a report worker process died ({err}); try --jobs 1") from err
            done += size
            if progress is not None:
                progress(done, total_bytes)
    finally:
        # Tasks not started are cancelled; the ones running end first (a worker stopped
        # while it sends its result would leave the pool's reader waiting on half a
        # message for ever). A Ctrl-C meanwhile is held until all have ended.
        with deferred_interrupt():
            pool.shutdown(wait=True, cancel_futures=True)
        stop_servers()
    return out


__all__ = [
    "RAY_INSTALL_HINT",
    "import_ray",
    "map_units",
    "ordered",
    "ray_decode_map",
    "shard_map",
]
