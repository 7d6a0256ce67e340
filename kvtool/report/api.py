"""The report's entry point: :func:`build_report` picks one pass, units of work, or shards.

One process reads every input in one ordered pass (:func:`kvtool.report.run.report_with`);
with ``--jobs``/``--ray``, inputs that share no stream are units of work reported apart
and merged exactly (:func:`report_units`), and one stream is decoded by other processes
on threads (:func:`kvtool.report.parallel.thread_decode_map`) or Ray tasks while this
thread keeps the state.
Modules import one way: registry, names → aggregates, samples, kernel, attribution →
timeline → partial → builder → run → parallel (no report state) → api.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING

from kvtool.columns import (
    DEFAULT_CHUNK_BYTES,
    DecodedChunk,
    DecodeMap,
    Progress,
    RawChunk,
    TableAnnotator,
    decode_chunk,
    make_annotator,
    recording_groups,
)
from kvtool.report import parallel, partial, procs
from kvtool.report.aggregates import DEFAULT_CLOCK, Report, check_clock
from kvtool.report.builder import ReportBuilder
from kvtool.report.partial import PartialReport, Unit, UnitTask
from kvtool.report.run import finish_report, report_unit, report_with
from kvtool.report.timeline import input_origin

if TYPE_CHECKING:
    from kvtool.replay import BatchFilter


def build_report(
    paths: Sequence[str | os.PathLike[str]],
    *,
    groups_file: str | os.PathLike[str] | None = None,
    group_flags: Sequence[str] | None = None,
    every_ns: int | None = None,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    jobs: int = 1,
    ray_address: str | None = None,
    clock: str = DEFAULT_CLOCK,
    select: BatchFilter | None = None,
    progress: Progress | None = None,
    split: Sequence[str] = (),
    raw_tap: Callable[[RawChunk], None] | None = None,
    report_mode: str = "auto",
    lifetime_bounds: bool = False,
) -> Report:
    """Read recordings (several: one combined report) and build the report, streaming.

    With ``jobs`` > 1 or ``ray_address``, the work runs on threads of this process or on
    a Ray cluster: inputs that hold several publisher streams are split into units of work
    whose partial reports merge exactly (:mod:`kvtool.report.partial`), one stream's
    payloads are decoded there and merged in stream order (:mod:`kvtool.report.parallel`).
    Either way the report is identical to a single-process one.

    Args:
        paths: Recordings.
        groups_file: ``--groups FILE``.
        group_flags: ``--group IDX=KIND[:WINDOW]`` flags.
        every_ns: Timeline bucket in ns, or None.
        chunk_bytes: Payload bytes per chunk.
        jobs: Threads on this machine (1: decoding a chunk ahead of the state, as always).
        ray_address: Run the work on the Ray cluster at this address instead.
        clock: The timeline's clock, ``receive`` or ``publish`` (lifetimes always use the
            batch ``ts``: the engine's own clock).
        select: Report only these batches (``--channel``, ``--rank``, ``--since``,
            ``--until``: :func:`kvtool.columns.iter_raw_chunks`).
        progress: Called with (bytes done, bytes total) of the input files.
        split: Extra tables: ``rank`` (``by_rank``), ``channel`` (``by_channel``).
        raw_tap: Called with every raw chunk this process reads, in stream order, before
            it is decoded (``--what-if`` takes the same read); only on the one-process
            path (``jobs`` 1, no Ray): elsewhere it is never called.
        report_mode: How parentless stores are read (``--report-mode``: ``auto``,
            ``full``, ``incremental``; hit announcements, docs/SEMANTICS.md R6).
        lifetime_bounds: Also give R8's lifetime bound (``lifetime_pNN_s_bound_low/high``:
            the two extreme copy rules, two more kernel states; else they are null).

    Returns:
        The report.

    Raises:
        RecordingError: A recording cannot be opened.
        MetadataError: Invalid group metadata.
        UsageError: ``ray_address`` given but Ray is not installed.
    """
    check_clock(clock)
    annotator = make_annotator(
        recording_groups(paths),
        groups_file=groups_file,
        group_flags=group_flags,
        report_mode=report_mode,
        lifetime_bounds=lifetime_bounds,
    )
    if (jobs > 1 or ray_address is not None) and select is None and not split:
        # Recordings that share no stream are separate units of work: each is reported
        # on its own (a worker, a Ray task) and the partial reports merged exactly.
        units = partial.plan_units(paths, split=jobs if ray_address is None else 1 << 16)
        if len(units) > 1:
            with contextlib.suppress(partial.NotMergeable):
                return report_units(
                    paths,
                    units,
                    annotator,
                    every_ns=every_ns,
                    chunk_bytes=chunk_bytes,
                    clock=clock,
                    jobs=jobs,
                    ray_address=ray_address,
                    progress=progress,
                )
    decode_map: DecodeMap | None = None
    close: Callable[[], None] | None = None
    if ray_address is not None:
        decode_map, close = parallel.ray_decode_map(ray_address)
    elif jobs > 1 and procs.input_bytes(paths) >= chunk_bytes // procs.SHARD_RATIO:
        decode_map, close = parallel.thread_decode_map(jobs)
    elif raw_tap is not None:
        decode_map = _tapped(raw_tap)
    try:
        return report_with(
            paths,
            annotator,
            every_ns=every_ns,
            chunk_bytes=chunk_bytes,
            decode_map=decode_map,
            clock=clock,
            select=select,
            progress=progress,
            split=split,
        )
    finally:
        if close is not None:
            close()


def _tapped(tap: Callable[[RawChunk], None]) -> DecodeMap:
    """A decode map that hands each raw chunk to ``tap`` and decodes it here."""

    def decode(raws: Iterable[RawChunk]) -> Iterator[DecodedChunk]:
        for raw in raws:
            tap(raw)
            yield decode_chunk(raw)

    return decode


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
    """Report each unit on its own (threads or Ray) and merge the partial reports exactly.

    Args:
        paths: The recordings, in command-line order.
        units: Input indices per unit (:func:`kvtool.report.partial.plan_units`).
        annotator: The driver's annotator (THE annotation of the whole input).
        every_ns: Timeline bucket (ns), or None.
        chunk_bytes: Payload bytes per chunk.
        clock: The timeline's clock.
        jobs: Threads on this machine.
        ray_address: Run the units as Ray tasks on this cluster instead.
        progress: Called with (bytes done, bytes total) as units finish.

    Returns:
        The report.

    Raises:
        NotMergeable: The partial reports cannot be merged exactly.
        UsageError: ``ray_address`` given but Ray is not installed.
        KvtoolError: The cluster cannot be reached.
    """
    names = [os.fspath(p) for p in paths]
    # Ray workers run elsewhere (another working directory): they get absolute paths,
    # and the partial reports name each recording as the command line did.
    where = [os.path.abspath(n) for n in names] if ray_address is not None else names
    # One time zero for every unit: their timelines' buckets are the same.
    origin = input_origin(paths, clock) if every_ns is not None else None
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
            origin_ns=origin,
            report_mode=annotator.report_mode,
            lifetime_bounds=annotator.lifetime_bounds,
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
    parts: list[PartialReport] = parallel.map_units(
        report_unit, tasks, sizes, jobs=jobs, ray_address=ray_address, progress=progress
    )
    builder, stats = ReportBuilder.from_partials(parts, annotator.group_kind, every_ns, clock)
    annotator.adopt(stats, [p.out_of_range for p in parts])
    return finish_report(builder, annotator, stats)


__all__ = ["build_report", "report_units"]
