"""Reading recordings into a report: one ordered pass, one unit of work, the finished report.

:func:`run_builder` reads, decodes and annotates the input and feeds a
:class:`~kvtool.report.builder.ReportBuilder` in stream order; :func:`finish_report` turns
a fed builder (or one merged from partial reports) into a :class:`Report`;
:func:`report_unit` is the map of ``--jobs``/``--ray`` units (a plain function of a
picklable task, run in any process); :class:`Splits` feeds the per-rank and per-channel
builders of ``--by rank``/``--by channel``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING

import msgspec
import polars as pl

from kvtool.columns import (
    DEFAULT_CHUNK_BYTES,
    ChannelRef,
    DecodeMap,
    Progress,
    ReadStats,
    TableAnnotator,
    iter_tables,
    prefetch,
)
from kvtool.protocol import sorted_unknown_tags
from kvtool.report import attribution
from kvtool.report.aggregates import DEFAULT_CLOCK, HIST_BINS_PER_OCTAVE, Report
from kvtool.report.builder import ReportBuilder, empty_row, with_aliases
from kvtool.report.findings import report_findings
from kvtool.report.front import Ahead
from kvtool.report.names import BUILDER_INPUT
from kvtool.report.partial import PartialReport, PeakLog, UnitTask
from kvtool.report.source import ChannelSource, Finding, ReportSource, TimelineSource
from kvtool.report.tiers import TierSplit, tier_findings
from kvtool.report.timeline import input_origin

ANNOUNCE_INPUT = ("parent", "origin", "medium")
"""The table columns the builder reads for hit announcements (issue 21): those made only on
request (:data:`kvtool.columns.EXTRA_SCHEMA`) and ``medium`` (only the GPU pool's stores
announce)."""

if TYPE_CHECKING:
    from kvtool.replay import BatchFilter


def report_with(
    paths: Sequence[str | os.PathLike[str]],
    annotator: TableAnnotator,
    *,
    every_ns: int | None = None,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    decode_map: DecodeMap | None = None,
    clock: str = DEFAULT_CLOCK,
    select: BatchFilter | None = None,
    progress: Progress | None = None,
    split: Sequence[str] = (),
) -> Report:
    """Build a report with a given annotator and decoder map (the pieces build_report picks).

    Decoded chunks reach the annotator and the builder in stream order, whatever
    ``decode_map`` does, so any annotator that works chunk by chunk in stream order plugs
    in here.

    Args:
        paths: Recordings.
        annotator: Annotates each table chunk (stream order).
        every_ns: Timeline bucket in ns, or None.
        chunk_bytes: Payload bytes per chunk.
        decode_map: Decodes raw chunks in order (default: a chunk ahead in a thread;
            :func:`kvtool.report.parallel.thread_decode_map` for ``--jobs``).
        clock: The timeline's clock (``receive`` or ``publish``).
        select: Report only these batches.
        progress: Called with (bytes done, bytes total) of the input files.
        split: Extra tables: ``rank`` (``by_rank``), ``channel`` (``by_channel``),
            ``medium`` (``by_medium`` and ``tier_transitions``).

    Returns:
        The report.
    """
    splits = Splits(split, annotator.group_kind)
    builder, stats = run_builder(
        paths,
        annotator,
        every_ns=every_ns,
        chunk_bytes=chunk_bytes,
        decode_map=decode_map,
        clock=clock,
        select=select,
        progress=progress,
        splits=splits,
    )
    rep = finish_report(builder, annotator, stats)
    return splits.finish(rep, stats)


def run_builder(
    paths: Sequence[str | os.PathLike[str]],
    annotator: TableAnnotator,
    *,
    every_ns: int | None = None,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    decode_map: DecodeMap | None = None,
    clock: str = DEFAULT_CLOCK,
    select: BatchFilter | None = None,
    progress: Progress | None = None,
    splits: Splits | None = None,
    peak_log: PeakLog | None = None,
    streams: frozenset[tuple[str, str, int | None]] | None = None,
    origin_ns: int | None = None,
) -> tuple[ReportBuilder, ReadStats]:
    """Read, decode, annotate and feed a builder, in stream order (no finishing).

    Args:
        paths: Recordings.
        annotator: Annotates each table chunk (stream order).
        every_ns: Timeline bucket in ns, or None.
        chunk_bytes: Payload bytes per chunk.
        decode_map: Decodes raw chunks in order (default: a chunk ahead in a thread;
            :func:`kvtool.report.parallel.thread_decode_map` for ``--jobs``).
        clock: The timeline's clock (``receive`` or ``publish``).
        select: Report only these batches.
        progress: Called with (bytes done, bytes total) of the input files.
        splits: Also feeds these per-rank/per-channel builders.
        peak_log: Logs the peaks per batch (for a merge with other units' partial reports).
        streams: Only these publisher streams (see :func:`kvtool.columns.iter_raw_chunks`).
        origin_ns: The timeline's time zero; None: the input's first message on ``clock``
            (:func:`kvtool.report.timeline.input_origin`), read here when ``every_ns``.

    Returns:
        The fed builder and the read's stats.
    """
    stats = ReadStats()
    if origin_ns is None and every_ns is not None:
        origin_ns = input_origin(paths, clock)
    builder = ReportBuilder(every_ns, annotator.group_kind, clock, origin_ns)
    builder.peak_log = peak_log
    builder.streams = stats.channels
    # With a decode map (other threads), the chunks are annotated
    # where they are decoded: the annotation is fixed before the first chunk, and the driver (the
    # ordered, single-threaded part) keeps only the builder. A TableAnnotator subclass
    # may annotate otherwise: it annotates here.
    in_worker = decode_map is not None and type(annotator) is TableAnnotator
    chunks = iter_tables(
        paths,
        stats=stats,
        chunk_bytes=chunk_bytes,
        labels=False,
        decode_map=decode_map,
        select=select,
        progress=progress,
        streams=streams,
        annotation=annotator.annotation if in_worker else None,
        out_of_range=annotator.out_of_range if in_worker else None,
        keep=(*BUILDER_INPUT, *ANNOUNCE_INPUT, *(splits.columns if splits is not None else ()))
        if in_worker or type(annotator) is TableAnnotator
        else None,
    )

    def annotated() -> Iterator[pl.DataFrame]:
        # Annotating is per chunk and needs no builder state: done in the prefetch thread,
        # it overlaps the builder (polars and numpy release the GIL).
        for chunk in chunks:
            if in_worker:
                annotator.adopt(stats, ())  # its channels, as annotator() records them
                yield chunk
            else:
                yield annotator(chunk, stats)

    # The numba scanner and state kernel run without the GIL, polars and numpy release
    # it: the decode thread and the builder here share the cores as they are, with no
    # process-wide setting (such as the GIL's switch interval) changed for them.
    # A plain chunk's work before the kernel runs in the prefetch thread too, what reads
    # the kernel's output in one more (front.py): this thread is left the kernel.
    ahead = Ahead(builder)
    items = prefetch(ahead.produce(annotated()))
    try:
        for item in items:
            df = ahead.add(item)
            if splits is not None:
                splits.add(df)
    finally:
        try:
            ahead.close()  # first: a producer waiting for a chunk to be added stops
        finally:
            items.close()
    return builder, stats


_SPLIT_COLUMN = {"rank": "dp_rank", "channel": "channel_id", "medium": "medium"}


class Splits:
    """``--by rank`` and ``--by channel``: one more builder per rank or channel.

    Each gets its rank's (channel's) rows only. The live state is keyed by channel, and a
    data-parallel rank publishes on its own channel, so each builder's state is the one
    its rows have in the whole report: its totals are that rank's (channel's) row.

    Args:
        split: ``rank``, ``channel`` and/or ``medium``.
        group_kind: As for :class:`ReportBuilder`.
    """

    def __init__(self, split: Sequence[str], group_kind: attribution.GroupKind | None) -> None:
        bad = [s for s in split if s not in _SPLIT_COLUMN]
        if bad:
            raise ValueError(f"unknown split {bad[0]!r}")
        self.group_kind = group_kind
        self.parts: dict[str, dict[object, ReportBuilder]] = {s: {} for s in split if s != "medium"}
        # --by medium: a builder per medium and the tier transitions (kvtool.report.tiers).
        self.tiers = TierSplit(group_kind) if "medium" in split else None

    @property
    def columns(self) -> tuple[str, ...]:
        """Table columns the splits read beyond the builder's own (``medium``)."""
        return ("medium",) if self.tiers is not None else ()

    def add(self, df: pl.DataFrame) -> None:
        """Feed one annotated chunk's rows to the builder of each rank (channel, medium)."""
        if self.tiers is not None:
            self.tiers.add(df)
        for by, builders in self.parts.items():
            for (key,), part in df.partition_by(_SPLIT_COLUMN[by], as_dict=True).items():
                b = builders.get(key)
                if b is None:
                    b = builders[key] = ReportBuilder(None, self.group_kind)
                b.add(part)

    def finish(self, rep: Report, stats: ReadStats) -> Report:
        """Return ``rep`` with ``by_rank``/``by_channel``/``by_medium`` tables."""
        if not self.parts and self.tiers is None:
            return rep
        out = dict(rep.__dict__)
        if self.tiers is not None:
            by_medium, transitions = self.tiers.tables()
            out["by_medium"] = by_medium
            out["tier_transitions"] = transitions
            out["findings"] = [*rep.findings, *tier_findings(by_medium)]
        if "rank" in self.parts:
            ranks = sorted(
                self.parts["rank"], key=lambda r: (r is None, r if isinstance(r, int) else 0)
            )
            out["by_rank"] = _split_table(
                [self.parts["rank"][r] for r in ranks], {"dp_rank": ranks}, {"dp_rank": pl.Int64()}
            )
        if "channel" in self.parts:
            ids = sorted(self.parts["channel"])  # type: ignore[type-var]
            refs = [stats.channels[int(i)] for i in ids]  # type: ignore[call-overload]
            out["by_channel"] = _split_table(
                [self.parts["channel"][i] for i in ids],
                {"channel": [r.info.name for r in refs]},
                {"channel": pl.String()},
            )
        return Report(**out)


def _split_table(
    builders: list[ReportBuilder], keys: dict[str, list[object]], schema: dict[str, pl.DataType]
) -> pl.DataFrame:
    totals = [b.tables()["totals"] for b in builders]
    frame = pl.DataFrame(keys, schema=schema)
    if not totals:
        return pl.concat([frame, with_aliases(empty_row().clear())], how="horizontal")
    return pl.concat([frame, pl.concat(totals, how="vertical_relaxed")], how="horizontal")


def report_from_chunks(
    chunks: Iterable[pl.DataFrame],
    *,
    stats: ReadStats | None = None,
    annotator: TableAnnotator | None = None,
    every_ns: int | None = None,
    clock: str = DEFAULT_CLOCK,
) -> Report:
    """Build a report from table chunks already read (tests, other front ends).

    Args:
        chunks: Chunks of :func:`kvtool.columns.iter_tables`, in stream order.
        stats: The read's stats.
        annotator: Annotates each chunk (default: learn from the stream).
        every_ns: Timeline bucket in ns.
        clock: The timeline's clock (``receive`` or ``publish``).

    Returns:
        The report.
    """
    st = stats if stats is not None else ReadStats()
    ann = annotator if annotator is not None else TableAnnotator()
    builder = ReportBuilder(every_ns, ann.group_kind, clock)
    for chunk in chunks:
        builder.add(ann(chunk, st))
    return finish_report(builder, ann, st)


def finish_report(builder: ReportBuilder, annotator: TableAnnotator, stats: ReadStats) -> Report:
    """Turn a fed :class:`ReportBuilder` into a :class:`Report`.

    Args:
        builder: The builder, after the last chunk.
        annotator: The annotator used (metadata source, learned kinds).
        stats: The read's stats.

    Returns:
        The report.
    """
    tabs = builder.tables()
    # The first message read (rows or not: each channel is numbered at its first).
    first_rx = min((k[0] for k in stats.first_keys.values()), default=None)
    if builder.first_rx is not None:
        first_rx = builder.first_rx if first_rx is None else min(first_rx, builder.first_rx)
    span = builder.timeline_span(first_rx if builder.clock == "receive" else None)
    timeline = builder.timeline_frame(span)
    findings = report_findings(tabs, builder, annotator, stats)
    # One duration on one clock: receive time, last row's message minus the first
    # message, what ``info`` says for the same file (issue 24).
    dur = None
    if first_rx is not None and builder.last_rx is not None:
        dur = (builder.last_rx - first_rx) / 1e9
    source = ReportSource(
        recordings=list(stats.recordings),
        channels=[
            ChannelSource(
                recording=ref.recording,
                channel=ref.info.name,
                endpoint=ref.info.endpoint,
                topic=ref.info.topic,
                dp_rank=ref.info.dp_rank,
            )
            for ref in stats.channels.values()
        ],
        group_metadata=annotator.sources(),
        batches=stats.messages,
        unselected_batches=stats.unselected,
        events=stats.events,
        block_rows=stats.rows,
        duration_s=dur,
        duration_clock="receive",
        timeline=_timeline_source(builder, span) if builder.every_ns is not None else None,
        lifetimes="exact"
        if not builder.life.binned
        else f"log histogram, {HIST_BINS_PER_OCTAVE} bins per doubling",
        recompute_gaps="exact"
        if not builder.gaps.binned
        else f"log histogram, {HIST_BINS_PER_OCTAVE} bins per doubling",
        skipped_batches=stats.bad_batches,
        skipped_events=stats.skipped_events,
        unknown_events=sorted_unknown_tags(stats.unknown_tags),
        damaged=[f.text for f in stats.damaged],
    )
    every_s = builder.every_ns / 1e9 if builder.every_ns is not None else None
    return Report(
        source=source,
        totals=tabs["totals"],
        by_kind=tabs["by_kind"],
        by_window=tabs["by_window"],
        by_group=tabs["by_group"],
        timeline=timeline,
        findings=findings,
        damaged=bool(stats.damaged or stats.bad_batches or stats.skipped_events),
        every_s=every_s,
    )


def _timeline_source(builder: ReportBuilder, span: tuple[int, int] | None) -> TimelineSource:
    """The timeline's clock, its time zero and the data's span on it (``source``)."""
    origin = builder.origin_ns
    return TimelineSource(
        clock=builder.clock,
        origin_s=origin / 1e9 if origin is not None else None,
        start_s=round(span[0] / 1e9, 9) if span is not None else None,
        end_s=round(span[1] / 1e9, 9) if span is not None else None,
    )


# -- a unit of work (--jobs, --ray) ---------------------------------------------------


def report_unit(task: UnitTask) -> PartialReport:
    """The map: read, decode and report one unit, from empty state (any thread or process).

    Args:
        task: The unit.

    Returns:
        Its partial report.
    """
    annotator = TableAnnotator(
        task.annotation, report_mode=task.report_mode, lifetime_bounds=task.lifetime_bounds
    )
    builder, stats = run_builder(
        task.paths,
        annotator,
        every_ns=task.every_ns,
        chunk_bytes=task.chunk_bytes,
        clock=task.clock,
        peak_log=PeakLog(),
        streams=task.streams,
        origin_ns=task.origin_ns,
    )
    if task.names != task.paths:
        _rename(stats, dict(zip(task.paths, task.names, strict=True)))
    part = builder.partial(stats, annotator, task.inputs)
    part.only = task.streams
    return part


def _rename(stats: ReadStats, names: dict[str, str]) -> None:
    """Name each recording in ``stats`` as the command line did (not as a worker opened it)."""
    stats.recordings = [names.get(p, p) for p in stats.recordings]
    stats.groups = {names.get(p, p): g for p, g in stats.groups.items()}
    for cid, ref in list(stats.channels.items()):
        info = msgspec.structs.replace(ref.info, path=names.get(ref.info.path, ref.info.path))
        stats.channels[cid] = ChannelRef(ref.id, names.get(ref.recording, ref.recording), info)

    def renamed(f: Finding) -> Finding:
        # The finding carries its recording's path; its line begins with it.
        if f.path is None or f.path not in names or not f.text.startswith(f.path):
            return f
        return Finding(f.kind, names[f.path] + f.text[len(f.path) :], names[f.path])

    def line(text: str) -> str:
        for old, new in names.items():
            if text.startswith(f"{old}: "):
                return new + text[len(old) :]
        return text

    stats.damaged = [renamed(f) for f in stats.damaged]
    stats.lost = [renamed(f) for f in stats.lost]
    stats.problems = [line(t) for t in stats.problems]


__all__ = [
    "Splits",
    "finish_report",
    "report_from_chunks",
    "report_unit",
    "report_with",
    "run_builder",
]
