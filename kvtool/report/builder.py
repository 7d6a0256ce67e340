"""Drives the report's parts chunk by chunk: attribution, live state, aggregates.

Pure: chunks of the flat table (:mod:`kvtool.columns`) in, a :class:`Report` of polars
DataFrames out; nothing here prints.

Per chunk (:meth:`ReportBuilder.add`), on numpy arrays of the chunk's columns:

1. rows get their stream position (``row``), a plausible ``ts``
   (:func:`~kvtool.report.aggregates.plausible_ts`) and their kernel channel: a stream
   gets a new one at each publisher restart (its seq going backwards), which drops the
   old one's live blocks as a clear does (counted as ``blocks_cleared``, and a finding);
2. removes without ``group_idx`` on grouped channels are attributed
   (:mod:`kvtool.report.attribution`), every row gets its report row (``gkey``: one per
   (group_idx, kind, window) seen, numbered in order of appearance);
3. the state kernel (:mod:`kvtool.report.kernel`) walks the chunk's block rows: orphans,
   stores while live, recomputes, FIFO lifetime pairs, blocks dropped by clears;
4. counts (one ``bincount`` per column over the gkeys), distinct hashes, lifetimes,
   recompute gaps and distances (:mod:`kvtool.report.samples`), peaks and the timeline
   take the chunk (:mod:`kvtool.report.aggregates`).

Between chunks only the kernel's state, the per-row totals, the distinct hashes, the
lifetimes and recompute gaps (or their histograms), the recompute distances (counts per
value), the peak levels and the timeline's (bucket, row) sums are
carried, so memory does not grow with the recording's length beyond that state.

Parallel work (``--jobs``, ``--ray``): see :mod:`kvtool.report.parallel`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import polars as pl

from kvtool.columns import (
    UNATTRIBUTED,
    ChannelRef,
    ReadStats,
    TableAnnotator,
    np,
)
from kvtool.report import announce, attribution, front, kernel, klive, lifetimes
from kvtool.report.aggregates import (
    ADDITIVE,
    COLUMNS,
    COUNT_COLUMNS,
    DEFAULT_CLOCK,
    EXACT_LIFETIMES,
    LIFETIME_COLUMNS,
    Peaks,
    check_clock,
)
from kvtool.report.arrays import (
    ANNOUNCED,
    I64,
    NOT_A_BLOCK,
    NOT_AN_EVICTION,
    MediumRow,
    ReportRow,
)
from kvtool.report.counting import chunk_counts, live_deltas
from kvtool.report.distinct import DistinctHashes
from kvtool.report.lifebound import CopyBound, Samples
from kvtool.report.merge import fill_from_partials, log_peaks, to_partial
from kvtool.report.partial import NotMergeable, PartialReport, PeakLog, merge_stats
from kvtool.report.restarts import KernelChannels, count_restarts, step
from kvtool.report.rows import gkey_of, level_map
from kvtool.report.samples import Counts, Seconds
from kvtool.report.shape import ShapeLearner
from kvtool.report.tables import empty_row, report_tables, with_aliases
from kvtool.report.timeline import (
    TIMELINE_SUMS,
    TimelineSums,
    data_span,
    timeline_frame,
    timeline_part,
)

if TYPE_CHECKING:
    from numpy.typing import NDArray


class ReportBuilder:
    """Feeds annotated table chunks through the live-block state and keeps the totals.

    State carried between chunks (all of it; every part merges by key):

    - ``registry``: report row (``gkey``) of each (group_idx, kind, window), numbered in
      order of first appearance in the stream;
    - ``kstate``: the state kernel's arrays (:class:`kvtool.report.kernel.State`);
    - ``counts``: per gkey, the :data:`~kvtool.report.aggregates.ADDITIVE` sums (an
      int64 array, one row per gkey);
    - ``distinct``: per gkey, a sorted duplicate-free int64 array of stored hashes (plus
      unmerged parts);
    - ``life`` and ``gaps``: lifetimes and recompute gaps per gkey
      (:class:`~kvtool.report.samples.Seconds`: exact, or a log histogram past
      :data:`~kvtool.report.aggregates.EXACT_LIFETIMES`); ``distances``: recompute
      distances per gkey (:class:`~kvtool.report.samples.Counts`, exact);
    - ``peaks``: live blocks now and at their highest per level key;
    - ``timeline``: per (bucket, gkey) sums (with ``every_ns``), buckets counted from
      ``origin_ns`` (:mod:`kvtool.report.timeline`);
    - ``rows``: rows seen (the ``row`` numbering), time spans (receive: ``first_rx``,
      ``last_rx``; publish: ``first_ts``, ``last_ts``), grouped channels.

    Args:
        every_ns: Timeline bucket (ns), or None for no timeline.
        group_kind: (channel_id, group_idx, event_index) -> (kind, window) of a group, for
            removes without group_idx attributed through the hash state
            (:meth:`kvtool.columns.TableAnnotator.group_kind`).
        clock: The timeline's clock: ``receive`` (the recorder's receive time, what
            ``info`` and ``replay --since`` read) or ``publish`` (the batch ``ts``).
        origin_ns: The timeline's time zero on ``clock`` (ns since the epoch;
            :func:`kvtool.report.timeline.input_origin`); None: the first row's time.
        by_medium: Key report rows by medium too (each row's ``medium`` column; by_group
            then has a ``medium`` column and a row per medium). The live-block state is
            keyed as always, so the rows of one (group, kind, window) add up to the row
            a builder without it gives.
        max_keys: Bound the state's memory (a long-running ``kvtool serve``): keep about
            this many keys for recompute detection (:class:`kvtool.report.kernel.State`
            ``max_keys``: the keys gone longest ago are forgotten, a later store of one is
            a first store) and no distinct hashes (``distinct_hashes`` is then 0). None:
            exact, every key kept (``kvtool report``).
        report_mode: ``--report-mode`` (None: the annotator's, else ``auto``).
        media_apart: Key each medium's rows apart (:func:`kvtool.report.arrays.tier_keys`:
            each tier is a cache of its own). False only for a builder fed one medium's
            rows (:mod:`kvtool.report.tiers`, which reads its kernel's keys as on the wire).
    """

    def __init__(
        self,
        every_ns: int | None = None,
        group_kind: attribution.GroupKind | None = None,
        clock: str = DEFAULT_CLOCK,
        origin_ns: int | None = None,
        *,
        by_medium: bool = False,
        max_keys: int | None = None,
        report_mode: str | None = None,
        media_apart: bool = True,
    ) -> None:
        annotator = getattr(group_kind, "__self__", None)
        mode = report_mode or getattr(annotator, "report_mode", None) or "auto"
        if mode not in announce.MODES:
            raise ValueError(f"report mode {mode!r}: expected one of {', '.join(announce.MODES)}")
        self.report_mode: str = mode
        self.media_apart = media_apart
        self.by_medium = by_medium
        self.max_keys = max_keys
        self.every_ns = every_ns
        self.clock = check_clock(clock)
        self.origin_ns = origin_ns
        self.group_kind = group_kind
        self.rows = 0
        self.registry: dict[ReportRow | MediumRow, int] = {}
        # R8's bound (two more kernel states) only when asked (--lifetime-bounds).
        bounds = bool(getattr(annotator, "lifetime_bounds", False))
        self.kstate = kernel.State(max_keys, bounds=bounds)
        self.copy_bound = CopyBound()  # R8's lifetime bound (kvtool/report/lifebound.py)
        self.counts: NDArray[Any] = np.zeros((0, len(ADDITIVE)), dtype=I64)
        self.hashes = DistinctHashes(enabled=max_keys is None)
        self.life = Seconds()
        self.gaps = Seconds()
        self.distances = Counts()
        self.negative_lifetimes = 0
        self.peaks = Peaks()
        # Per (bucket, gkey) sums, plus chunks' rows not yet summed in (see ``timeline``).
        self.sums = TimelineSums()
        self.timeline_sparse = False
        self.grouped_channels: set[int] = set()
        self.first_ts: float | None = None
        self.last_ts: float | None = None
        # Receive times (log_time, ns) of the first and last rows.
        self.first_rx: int | None = None
        self.last_rx: int | None = None
        self.ambiguous_removes = 0
        # The report row (gkey) of each row of the last chunk added, -1 for a clear: what
        # export files each block under, so both attribute a remove alike (issue 24).
        self.row_gkey: NDArray[Any] = np.zeros(0, dtype=I64)
        # The kernel's ``what`` of each row of the last chunk added (kernel.NONE ...).
        self.row_what: NDArray[Any] = np.zeros(0, dtype=np.int8)
        self.row_note: NDArray[Any] = np.zeros(0, dtype=np.int8)
        # Publisher restarts (a channel's seq going backwards): per channel, [restarts,
        # live blocks they dropped]; the kernel's channel of each stream now (a new one
        # from each restart on), the stream of each kernel channel, the last seq seen.
        self.restarts: dict[int, list[int]] = {}
        self.channels = KernelChannels()
        self._kchan = self.channels.kchan  # the same dict (kvtool.report.tiers reads it)
        # Live blocks at the end per gkey when merged from partial reports (no entries).
        self.live_end: dict[int, int] | None = None
        # Set by run_builder: the read's channels, and the peak log of a unit of work.
        self.streams: dict[int, ChannelRef] = {}
        self.peak_log: PeakLog | None = None
        # Issue 21: batches, block sizes and hit announcements' context (shape.py).
        self.shapes = ShapeLearner(group_kind)

    @property
    def timeline(self) -> pl.DataFrame:
        """Per (bucket, gkey) sums of ``stores``, ``removes`` and ``delta``."""
        return self.sums.frame

    @timeline.setter
    def timeline(self, frame: pl.DataFrame) -> None:
        self.sums.frame = frame

    @property
    def levels(self) -> dict[str, dict[object, tuple[int, int]]]:
        """(live now, peak) per level key: ``kind``, ``window``, ``group``, ``total``."""
        return self.peaks.levels

    # -- registry of report rows (group_idx, kind, window) --------------------------------

    # -- one chunk ---------------------------------------------------------------------------

    def add(self, df: pl.DataFrame) -> None:
        """Process one annotated chunk (in stream order).

        Args:
            df: A chunk from :func:`kvtool.columns.iter_annotated`.
        """
        if df.height == 0:
            self.row_gkey = np.zeros(0, dtype=I64)
            self.row_what = np.zeros(0, dtype=np.int8)
            self.row_note = np.zeros(0, dtype=np.int8)
            return
        self.back(front.front(self, df))

    def back(self, f: front.Front) -> None:
        """The chunk's kernel step and all that reads its output (after :func:`front.front`)."""
        self.after(self.kernel_step(f))

    def kernel_step(self, f: front.Front) -> front.Post:
        """The chunk's kernel step (:func:`front.front` before, :meth:`after` after).

        Of the front's state (:mod:`kvtool.report.front`) it reads none, and writes the
        registry only for an orphan remove without ``group_idx`` (not in a plain chunk).
        Of the state :meth:`after` keeps it touches none: the kernel's lifetimes for the
        copy bound leave the kernel state here, in the result.
        """
        df, gkey, no_group = f.df, f.gkey, f.no_group
        out, restart_drop = step(
            self.kstate, f.size, announce.MODES[self.report_mode],
            f.op, f.kchan, f.group, no_group, f.hashes, f.ts, gkey, f.at, f.old, f.shape,
        )  # fmt: skip
        what = out.what
        moved = (what == kernel.ORPHAN) & no_group
        if moved.any():
            # Orphan removes without group_idx (old vLLM): the hash is live in no group, so
            # the remove is unattributed. Its row moves off the group it was keyed under
            # for everything from here (counts, peaks, timeline), as when the chunk
            # already attributed it (front._attribute): chunk boundaries change nothing.
            gkey = gkey.copy()
            if self.by_medium:
                media = df["medium"].to_numpy()
                for m in dict.fromkeys(media[moved].tolist()):
                    gkey[moved & (media == m)] = gkey_of(self.registry, None, UNATTRIBUTED, None, m)
            else:
                gkey[moved] = gkey_of(self.registry, None, UNATTRIBUTED, None)
            f = f._replace(
                size=len(self.registry),
                rows={i: (k[0], k[1], k[2]) for k, i in self.registry.items()},
            )
        self.row_gkey = gkey
        self.row_what = what  # the kernel's verdict per row (kvtool.report.tiers reads it)
        self.row_note = out.note  # and its note (kvtool.report.meaning reads it)
        samples = Samples.of(self.kstate)
        return front.Post(f, gkey, out, restart_drop, moved, samples)

    def after(self, p: front.Post) -> None:
        """Everything of a chunk that reads the kernel's output (:meth:`kernel_step`)."""
        f, gkey, out, what, moved = p.front, p.gkey, p.out, p.out.what, p.moved
        df, size, rows, ts, wire_hashes = f.df, f.size, f.rows, f.ts, f.wire_hashes
        is_clear, is_store, is_remove, has_hash = f.is_clear, f.is_store, f.is_remove, f.has_hash
        count_restarts(self.restarts, f.channel, f.at, out, p.restart_drop)
        block_index = df["block_index"]
        if block_index.null_count():
            block_index = block_index.fill_null(-1)
        first_block = block_index.to_numpy() == 0
        add = chunk_counts(
            size,
            df,
            gkey,
            is_clear,
            is_store,
            is_remove,
            has_hash,
            first_block,
            f.unattributed_orphan,
            moved,
            out,
        )
        if len(self.counts) < size:
            grown = np.zeros((size, len(ADDITIVE)), dtype=I64)
            grown[: len(self.counts)] = self.counts
            self.counts = grown
        self.counts += add
        stored = f.op == kernel.STORE
        real = stored & ~np.isin(what, ANNOUNCED)  # an announced hit stores nothing
        self.hashes.add(gkey[real], wire_hashes[real])
        # Lifetimes, recompute gaps and distances: gathered in one place (lifetimes.py).
        self.negative_lifetimes += lifetimes.gather(
            self.life, self.gaps, self.distances, gkey, what, ts, out
        )
        self.copy_bound.take(p.samples, EXACT_LIFETIMES, self.life)
        delta_gkey, delta, delta_row, dropped = live_deltas(what, stored, gkey, out)
        self.peaks.add(delta_gkey, delta, rows)
        if self.peak_log is not None:
            log_peaks(self.peak_log, self.streams, df, delta_row, delta_gkey, delta, rows)
        if self.every_ns is not None:
            # Blocks, as the tables count them (issue 21): extra keys, re-keys and
            # discarded checkpoints are no stored block, their removes no eviction.
            assert self.origin_ns is not None
            self.sums.add(
                timeline_part(
                    self.clock,
                    self.every_ns,
                    self.origin_ns,
                    df,
                    gkey,
                    is_clear,
                    is_store & ~np.isin(what, NOT_A_BLOCK),
                    is_remove & ~np.isin(what, NOT_AN_EVICTION),
                    has_hash,
                    (delta_gkey, delta, delta_row, dropped),
                    what == kernel.RECOMPUTED,
                )
            )

    def live_now(self, size: int) -> NDArray[Any]:
        """Live blocks now per gkey (``size`` of them)."""
        if self.live_end is not None:
            out = np.zeros(size, dtype=I64)
            for g, n in self.live_end.items():
                out[g] = n
            return out
        out = np.zeros(size, dtype=I64)
        live = self.kstate.live_gkey[:size]
        out[: len(live)] = live
        return out

    def partial(
        self, stats: ReadStats, annotator: TableAnnotator, inputs: list[int]
    ) -> PartialReport:
        """This builder's state as a partial report (:func:`kvtool.report.merge.to_partial`)."""
        return to_partial(self, stats, annotator, inputs)

    @classmethod
    def from_partials(
        cls,
        parts: Sequence[PartialReport],
        group_kind: attribution.GroupKind | None,
        every_ns: int | None,
        clock: str,
    ) -> tuple[ReportBuilder, ReadStats]:
        """Merge partial reports of units that share no stream (exactly; see partial.py).

        Args:
            parts: The units' partial reports, in unit order.
            group_kind: As for the constructor.
            every_ns: The timeline bucket the units used.
            clock: The timeline's clock.

        Returns:
            A builder holding the merged state (ready for :func:`finish_report`) and the
            merged read stats.

        Raises:
            NotMergeable: The parts cannot be merged exactly.
        """
        stats, channels = merge_stats(parts)
        origins = {p.origin_ns for p in parts if p.origin_ns is not None}
        if every_ns is not None and len(origins) > 1:
            raise NotMergeable("the units' timelines have different origins")
        b = cls(every_ns, group_kind, clock, origins.pop() if origins else None)
        fill_from_partials(b, parts, channels)
        return b, stats

    # -- the result ----------------------------------------------------------------------

    def tables(self, *, quantiles: bool = True) -> dict[str, pl.DataFrame]:
        """Return totals, by_kind, by_window, by_group (:func:`kvtool.report.tables.report_tables`).

        Args:
            quantiles: Compute the percentile columns (False: they are null; a reader
                of the samples themselves, ``kvtool serve``, skips their cost).
        """
        return report_tables(
            level_map(self.registry, by_medium=self.by_medium),
            klive.counts_now(self.counts, self.kstate, merged=self.live_end is not None),
            self.live_now(len(self.registry)),
            (self.life, self.gaps, self.distances),
            self.hashes,
            self.levels,
            by_medium=self.by_medium,
            quantiles=quantiles,
            copy_bound=self.copy_bound,
            every_request_announces=self.report_mode == "full",
        )

    def timeline_span(self, first_rx: int | None = None) -> tuple[int, int] | None:
        """The data's (first, last) time on the timeline's clock, in ns after its origin.

        Args:
            first_rx: The first message's receive time, when it is before the first row's
                (a message without rows; receive clock only).

        Returns:
            The span; None before any row.
        """
        first = self.first_rx
        if first_rx is not None:
            first = first_rx if first is None else min(first, first_rx)
        return data_span(
            self.clock, self.origin_ns, (first, self.last_rx), (self.first_ts, self.last_ts)
        )

    def timeline_frame(self, span: tuple[int, int] | None = None) -> pl.DataFrame | None:
        """Return the timeline: per bucket and kind, stores, removes, cleared, live blocks.

        Args:
            span: The data's span (:meth:`timeline_span`); None: the one of the rows.

        Returns:
            See :func:`kvtool.report.timeline.timeline_frame`; None without ``every``.
        """
        if self.every_ns is None:
            return None
        rows = level_map(self.registry, by_medium=self.by_medium).select("gkey", kind="L_kind")
        per_bucket = (
            self.timeline.join(rows, on="gkey", how="left")
            .group_by("bucket", "kind")
            .agg(*TIMELINE_SUMS)
        )
        if span is None:
            span = self.timeline_span()
        frame, self.timeline_sparse = timeline_frame(per_bucket, self.every_ns, span)
        return frame


__all__ = [
    "COLUMNS",
    "COUNT_COLUMNS",
    "EXACT_LIFETIMES",
    "LIFETIME_COLUMNS",
    "MediumRow",
    "ReportBuilder",
    "ReportRow",
    "empty_row",
    "with_aliases",
]
