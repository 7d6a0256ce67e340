"""Drives the report's parts chunk by chunk: attribution, live state, aggregates.

Pure: chunks of the flat table (:mod:`kvtool.columns`) in, a :class:`Report` of polars
DataFrames out; nothing here prints.

Per chunk (:meth:`ReportBuilder.add`):

1. rows get their stream position (``row``), a plausible ``ts``
   (:func:`~kvtool.report.aggregates.plausible_ts`) and their channel's clear epoch;
2. removes without ``group_idx`` on grouped channels are attributed
   (:mod:`kvtool.report.attribution`), every row gets its report row (``gkey``: one per
   (group_idx, kind, window) seen, numbered in order of appearance);
3. the live-block multiset advances (:mod:`kvtool.report.state`): orphans, restores,
   FIFO lifetime pairs, survivors, blocks dropped by clears;
4. counts, distinct hashes, lifetimes, peaks and the timeline take the chunk
   (:mod:`kvtool.report.aggregates`).

Between chunks only the live entries, the per-row totals, the distinct hashes, the
lifetimes (or their histogram), the peak levels and the timeline's (bucket, row) sums are
carried, so memory does not grow with the recording's length beyond that state.

Parallel work (``--jobs``, ``--ray``): see :mod:`kvtool.report.parallel`.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING

import polars as pl

from kvtool.columns import (
    CLEARED,
    DEFAULT_CHUNK_BYTES,
    REMOVED,
    STORED,
    UNATTRIBUTED,
    ChannelRef,
    DecodeMap,
    Progress,
    ReadStats,
    TableAnnotator,
    iter_tables,
    make_annotator,
    prefetch,
    recording_groups,
)
from kvtool.report import attribution, state
from kvtool.report.aggregates import (
    ADDITIVE,
    COLUMNS,
    COUNT_COLUMNS,
    DEFAULT_CLOCK,
    EXACT_LIFETIMES,
    HIST_BINS_PER_OCTAVE,
    LIFETIME_COLUMNS,
    Peaks,
    Report,
    bucket_expr,
    check_clock,
    hist_bin,
    hist_centre,
    plausible_ts,
    quantiles,
    sorted_union,
    timeline_frame,
)
from kvtool.report.findings import report_findings

if TYPE_CHECKING:
    from kvtool.replay import BatchFilter
    from kvtool.report.partial import PartialReport, PeakLog

ReportRow = tuple[int | None, str, int | None]
"""(group_idx, kind, sliding_window) of one report row."""

_COUNTS_SCHEMA: dict[str, pl.DataType] = {"gkey": pl.UInt32(), **{c: pl.Int64() for c in ADDITIVE}}
_TIMELINE_SCHEMA: dict[str, pl.DataType] = {
    "bucket": pl.Int64(),
    "gkey": pl.UInt32(),
    "stores": pl.Int64(),
    "removes": pl.Int64(),
    "delta": pl.Int64(),
}


class ReportBuilder:
    """Feeds annotated table chunks through the live-block state and keeps the totals.

    Args:
        every_ns: Timeline bucket (ns), or None for no timeline.
        group_kind: (channel_id, group_idx, event_index) -> (kind, window) of a group, for
            removes without group_idx attributed through the hash state
            (:meth:`kvtool.columns.TableAnnotator.group_kind`).
        clock: The timeline's clock: ``receive`` (the recorder's receive time, what
            ``info`` and ``replay --since`` read) or ``publish`` (the batch ``ts``).
    """

    def __init__(
        self,
        every_ns: int | None = None,
        group_kind: attribution.GroupKind | None = None,
        clock: str = DEFAULT_CLOCK,
    ) -> None:
        self.every_ns = every_ns
        self.clock = check_clock(clock)
        self.group_kind = group_kind
        self.rows = 0
        self.registry: dict[ReportRow, int] = {}
        self.live = pl.DataFrame(schema=state.LIVE_SCHEMA)
        self.counts = pl.DataFrame(schema=_COUNTS_SCHEMA)
        # Distinct stored hashes per gkey: a sorted, duplicate-free Int64 series each, merged
        # with each chunk's new hashes now and then (sort-merge: no big hash tables).
        self.distinct: dict[int, pl.Series] = {}
        self._distinct_parts: dict[int, list[pl.Series]] = {}
        self._distinct_rows = 0
        self._distinct_size = 0
        self._distinct_counts: dict[tuple[int, ...], int] = {}
        self.lifetimes: list[pl.DataFrame] = []
        self.n_lifetimes = 0
        self.negative_lifetimes = 0
        self.hist: pl.DataFrame | None = None
        self.peaks = Peaks()
        self.timeline = pl.DataFrame(schema=_TIMELINE_SCHEMA)
        self.timeline_sparse = False
        self.grouped_channels: set[int] = set()
        self.first_ts: float | None = None
        self.last_ts: float | None = None
        self.ambiguous_removes = 0
        # Live blocks at the end per gkey when merged from partial reports (no entries).
        self.live_end: dict[int, int] | None = None
        # Set by run_builder: the read's channels, and the peak log of a unit of work.
        self.streams: dict[int, ChannelRef] = {}
        self.peak_log: PeakLog | None = None

    @property
    def levels(self) -> dict[str, dict[object, tuple[int, int]]]:
        """(live now, peak) per level key: ``kind``, ``window``, ``group``, ``total``."""
        return self.peaks.levels

    # -- registry of report rows (group_idx, kind, window) --------------------------------

    def _gkey_of(self, group_idx: int | None, kind: str, window: int | None) -> int:
        key = (group_idx, kind, window)
        if key not in self.registry:
            self.registry[key] = len(self.registry)
        return self.registry[key]

    def _with_gkeys(self, df: pl.DataFrame) -> pl.DataFrame:
        """Return df with ``gkey``: the report row of (group_idx, kind_final, sliding_window).

        The few distinct combinations of a chunk are found once (in order of appearance,
        so numbering follows the stream) and joined back; clears belong to no row.
        """
        key_cols = ["group_idx", "kind_final", "sliding_window"]
        firsts = (
            df.lazy()
            .filter(pl.col("type_code") != CLEARED)
            .select(key_cols)
            .unique(maintain_order=True)
            .collect()
        )
        mapping = firsts.with_columns(
            gkey=pl.Series(
                [self._gkey_of(g, k, w) for g, k, w in firsts.iter_rows()], dtype=pl.UInt32
            )
        )
        joined = df.join(mapping, on=key_cols, how="left", nulls_equal=True, maintain_order="left")
        return joined.with_columns(gkey=pl.when(pl.col("type_code") != CLEARED).then("gkey"))

    def _registry_frame(self) -> pl.DataFrame:
        return pl.DataFrame(
            [(g, k, w, i) for (g, k, w), i in self.registry.items()],
            schema={
                "group_idx": pl.Int64,
                "kind_final": pl.String,
                "sliding_window": pl.Int64,
                "gkey": pl.UInt32,
            },
            orient="row",
        )

    # -- one chunk ---------------------------------------------------------------------------

    def add(self, df: pl.DataFrame) -> None:
        """Process one annotated chunk (in stream order).

        Args:
            df: A chunk from :func:`kvtool.columns.iter_annotated`.
        """
        if df.height == 0:
            return
        n = df.height
        first_row = self.rows
        tc = pl.col("type_code")
        df = df.with_columns(
            row=pl.int_range(first_row, first_row + n, dtype=pl.Int64),
            ts=plausible_ts(),
        )
        if self.every_ns is not None:
            df = df.with_columns(bucket=bucket_expr(self.clock, self.every_ns))
        self.rows += n
        # One pass for the chunk's facts: time span, channels, and the channels whose
        # stores carry group_idx (there a remove without one needs the (hash -> group)
        # state; elsewhere -- old vLLM, no group_idx at all -- it is keyed by
        # (channel, no group, hash) like its stores).
        facts = df.select(
            lo=pl.col("ts").min(),
            hi=pl.col("ts").max(),
            channels=pl.col("channel_id").n_unique(),
            grouped=pl.col("channel_id")
            .filter((tc == STORED) & pl.col("group_idx").is_not_null())
            .unique()
            .implode(),
            ungrouped_removes=(
                (tc == REMOVED) & pl.col("group_idx").is_null() & pl.col("hash").is_not_null()
            ).any(),
        ).row(0, named=True)
        lo, hi = facts["lo"], facts["hi"]
        if isinstance(lo, float):
            self.first_ts = lo if self.first_ts is None else min(self.first_ts, lo)
        if isinstance(hi, float):
            self.last_ts = hi if self.last_ts is None else max(self.last_ts, hi)
        self.grouped_channels |= set(facts["grouped"])
        if facts["ungrouped_removes"]:
            df = self._attribute(df)
        else:
            df = df.with_columns(unattributed=pl.lit(False), unattributed_orphan=pl.lit(False))
        one_channel = facts["channels"] == 1
        is_clear = (tc == CLEARED).cast(pl.Int64)
        df = df.with_columns(
            *attribution.final_kind(tc),
            epoch=is_clear.cum_sum() if one_channel else is_clear.cum_sum().over("channel_id"),
        )
        df = self._with_gkeys(df)
        has_hash = pl.col("hash").is_not_null()
        first_block = pl.col("block_index") == 0
        blocks = (
            df.lazy()
            .filter(has_hash & (tc != CLEARED) & ~pl.col("unattributed"))
            .select(
                "row",
                "channel_id",
                "group_idx",
                "hash",
                "epoch",
                "ts",
                delta=pl.when(tc == STORED)
                .then(pl.lit(1, pl.Int64))
                .otherwise(pl.lit(-1, pl.Int64)),
                carried=pl.lit(False),
                gkey="gkey",
                no_group=pl.col("group_idx").is_null(),
                first_block=first_block,
            )
            .collect()
        )
        final_epoch = df.group_by("channel_id").agg(final_epoch=pl.col("epoch").max())
        step = state.advance(blocks, self.live, final_epoch)
        self.live = step.live
        dropped = step.dropped
        if dropped.height:
            clears = df.filter(tc == CLEARED).select(
                "channel_id", "epoch", "row", *(["bucket"] if "bucket" in df.columns else [])
            )
            dropped = dropped.join(clears, on=["channel_id", "epoch"], how="left")
        self._add_counts(df, step, dropped)
        self._add_distinct(step.new_stores)
        self._add_lifetimes(step.pairs)
        deltas = self._live_deltas(df, step.pairs, dropped, first_row)
        rows = {i: key for key, i in self.registry.items()}
        self.peaks.add(deltas, rows)
        if self.peak_log is not None:
            self._log_peaks(df, deltas, first_row, rows)
        if self.every_ns is not None:
            self._add_timeline(df, deltas)

    def _log_peaks(
        self,
        df: pl.DataFrame,
        deltas: pl.DataFrame,
        first_row: int,
        rows: dict[int, ReportRow],
    ) -> None:
        """Hand the chunk's deltas, with their batches, to the peak log (partial reports)."""
        assert self.peak_log is not None
        at = (deltas["row"] - first_row).to_numpy()
        streams = {
            cid: (ref.info.endpoint, ref.info.topic, ref.info.dp_rank)
            for cid, ref in self.streams.items()
        }
        self.peak_log.add(
            df["log_time"].to_numpy()[at],
            df["seq"].to_numpy()[at],
            df["channel_id"].cast(pl.Int64).to_numpy()[at],
            deltas["gkey"].cast(pl.Int64).fill_null(-1).to_numpy(),
            deltas["delta"].to_numpy(),
            streams,
            rows,
        )

    def partial(self, stats: ReadStats, annotator: TableAnnotator, inputs: list[int]) -> PartialReport:
        """This builder's state as a partial report (keyed by report row, not gkey).

        Args:
            stats: The read's stats.
            annotator: The annotator used.
            inputs: The recordings' indices in the command line.

        Returns:
            The partial report (:mod:`kvtool.report.partial`).
        """
        from kvtool.report.partial import PartialReport, PeakLog

        self._merge_distinct()
        log = self.peak_log if self.peak_log is not None else PeakLog()
        counts = {
            int(r[0]): tuple(int(v) for v in r[1:])
            for r in self.counts.select("gkey", *ADDITIVE).iter_rows()
        }
        live_end = {
            int(g): int(n) for g, n in self.live.group_by("gkey").agg(pl.len()).iter_rows()
        }
        exact = pl.concat(self.lifetimes) if self.lifetimes else None
        return PartialReport(
            inputs=inputs,
            only=None,
            stats=stats,
            streams={
                cid: (ref.info.endpoint, ref.info.topic, ref.info.dp_rank)
                for cid, ref in stats.channels.items()
            },
            first_keys=dict(log.firsts),
            rows=list(self.registry),
            counts=counts,
            live_end=live_end,
            distinct={g: h.to_numpy() for g, h in self.distinct.items()},
            lifetimes=exact,
            hist=self.hist,
            n_lifetimes=self.n_lifetimes,
            negative_lifetimes=self.negative_lifetimes,
            ambiguous_removes=self.ambiguous_removes,
            first_ts=self.first_ts,
            last_ts=self.last_ts,
            grouped=bool(self.grouped_channels),
            timeline=self.timeline if self.every_ns is not None else None,
            peaks=log,
            out_of_range=dict(annotator.out_of_range),
        )

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
        from kvtool.report.partial import merge_peaks, merge_stats

        stats, _channels = merge_stats(parts)
        b = cls(every_ns, group_kind, clock)
        row_ids = [{i: b._gkey_of(*key) for i, key in enumerate(p.rows)} for p in parts]
        b.peaks.levels = merge_peaks(parts, row_ids)
        counts: dict[int, list[int]] = {}
        live_end: dict[int, int] = {}
        distinct: dict[int, list[pl.Series]] = {}
        exact: list[pl.DataFrame] = []
        hists: list[pl.DataFrame] = []
        timelines: list[pl.DataFrame] = []

        def remap(frame: pl.DataFrame, ids: dict[int, int]) -> pl.DataFrame:
            return frame.with_columns(
                gkey=pl.col("gkey").replace_strict(
                    list(ids), list(ids.values()), return_dtype=pl.UInt32
                )
            )

        for p, ids in zip(parts, row_ids, strict=True):
            for g, values in p.counts.items():
                acc = counts.setdefault(ids[g], [0] * len(ADDITIVE))
                for k, v in enumerate(values):
                    acc[k] += v
            for g, n in p.live_end.items():
                live_end[ids[g]] = live_end.get(ids[g], 0) + n
            for g, h in p.distinct.items():
                distinct.setdefault(ids[g], []).append(pl.Series("hash", h, dtype=pl.Int64))
            if p.lifetimes is not None and p.lifetimes.height:
                exact.append(remap(p.lifetimes, ids))
            if p.hist is not None:
                hists.append(remap(p.hist, ids))
            if p.timeline is not None and p.timeline.height:
                timelines.append(remap(p.timeline, ids))
            b.n_lifetimes += p.n_lifetimes
            b.negative_lifetimes += p.negative_lifetimes
            b.ambiguous_removes += p.ambiguous_removes
            for ts in (p.first_ts, p.last_ts):
                if ts is not None:
                    b.first_ts = ts if b.first_ts is None else min(b.first_ts, ts)
                    b.last_ts = ts if b.last_ts is None else max(b.last_ts, ts)
            if p.grouped:
                b.grouped_channels.add(0)
        b.counts = pl.DataFrame(
            [(g, *v) for g, v in counts.items()], schema=_COUNTS_SCHEMA, orient="row"
        )
        b.live_end = live_end
        b.distinct = {g: sorted_union(hs) for g, hs in distinct.items()}
        # One process keeps lifetimes exactly until it has seen more than EXACT_LIFETIMES,
        # then bins them all: the same rule on the merged count gives the same numbers.
        if hists or b.n_lifetimes > EXACT_LIFETIMES:
            binned = [
                f.select("gkey", bin=hist_bin(pl.col("lifetime_s"))).group_by("gkey", "bin").len("n")
                for f in exact
            ]
            b.hist = (
                pl.concat(
                    [*(h.select("gkey", "bin", pl.col("n").cast(pl.Int64)) for h in hists),
                     *(h.select("gkey", "bin", pl.col("n").cast(pl.Int64)) for h in binned)]
                )
                .group_by("gkey", "bin")
                .agg(pl.col("n").sum())
            )
        elif exact:
            b.lifetimes = [pl.concat(exact)]
        if timelines:
            b.timeline = (
                pl.concat(timelines)
                .group_by("bucket", "gkey")
                .agg(pl.col("stores").sum(), pl.col("removes").sum(), pl.col("delta").sum())
            )
        return b, stats

    def _attribute(self, df: pl.DataFrame) -> pl.DataFrame:
        """Resolve removes without group_idx on grouped channels (see attribution)."""
        if not attribution.needs_resolution(df, self.grouped_channels):
            return df.with_columns(unattributed=pl.lit(False), unattributed_orphan=pl.lit(False))
        kind_of_gkey = {i: (k, w) for (_g, k, w), i in self.registry.items()}
        resolved, ambiguous = attribution.resolve_ungrouped(
            df, self.live, self.grouped_channels, kind_of_gkey, self.group_kind
        )
        self.ambiguous_removes += ambiguous
        found = pl.col("resolved").fill_null(False)
        return df.join(resolved, on="row", how="left", maintain_order="left").with_columns(
            kind=pl.when(found).then(pl.col("resolved_kind")).otherwise(pl.col("kind")),
            sliding_window=pl.when(found)
            .then(pl.col("resolved_window"))
            .otherwise(pl.col("sliding_window")),
            group_idx=pl.when(found).then(pl.col("resolved_group")).otherwise(pl.col("group_idx")),
            unattributed=pl.col("unattributed").fill_null(False),
            unattributed_orphan=pl.col("unattributed_orphan").fill_null(False),
        )

    def _add_counts(self, df: pl.DataFrame, step: state.LiveStep, dropped: pl.DataFrame) -> None:
        tc = pl.col("type_code")
        has_hash = pl.col("hash").is_not_null()
        first_block = pl.col("block_index") == 0
        is_store, is_remove = tc == STORED, tc == REMOVED
        rows = (
            df.lazy()
            .filter(tc != CLEARED)
            .group_by("gkey")
            .agg(
                store_events=(first_block & is_store).sum().cast(pl.Int64),
                blocks_stored=(has_hash & is_store).sum().cast(pl.Int64),
                tokens_stored=pl.col("tokens").filter(is_store).sum().cast(pl.Int64),
                remove_events=(first_block & is_remove).sum().cast(pl.Int64),
                blocks_removed=(has_hash & is_remove).sum().cast(pl.Int64),
                # Removes without group_idx live in no group: unattributed orphans.
                orphan_removes=(pl.col("unattributed_orphan") & has_hash).sum().cast(pl.Int64),
            )
            .collect()
        )
        blocks = step.blocks
        flags = blocks.group_by("gkey").agg(
            restored_blocks=pl.col("restored").sum().cast(pl.Int64),
            orphan_removes=(pl.col("orphan") & ~pl.col("no_group")).sum().cast(pl.Int64),
        )
        # Orphan removes without group_idx (old vLLM): the hash is live in no group, so
        # the remove is unattributed -- move it off the group it was keyed under.
        moved = (
            blocks.filter(pl.col("orphan") & pl.col("no_group"))
            .group_by("gkey")
            .agg(n=pl.len().cast(pl.Int64), events=pl.col("first_block").sum().cast(pl.Int64))
        )
        adjust = []
        if moved.height:
            unattributed_gkey = self._gkey_of(None, UNATTRIBUTED, None)
            adjust = [
                moved.select("gkey", blocks_removed=-pl.col("n"), remove_events=-pl.col("events")),
                moved.select(
                    gkey=pl.lit(unattributed_gkey, pl.UInt32),
                    blocks_removed=pl.col("n"),
                    remove_events=pl.col("events"),
                    orphan_removes=pl.col("n"),
                ),
            ]
        cleared = dropped.group_by("gkey").agg(blocks_cleared=pl.len().cast(pl.Int64))
        self.counts = (
            pl.concat([self.counts, rows, flags, cleared, *adjust], how="diagonal_relaxed")
            .lazy()
            .fill_null(0)
            .group_by("gkey")
            .agg(*[pl.col(c).sum().cast(pl.Int64) for c in ADDITIVE])
            .collect()
        )

    def _add_distinct(self, new_stores: pl.DataFrame) -> None:
        """Collect the chunk's stored hashes per gkey (merged now and then: amortised)."""
        uniq = new_stores.unique()
        for (gkey,), part in uniq.partition_by("gkey", as_dict=True).items():
            h = part["hash"]
            self._distinct_parts.setdefault(int(gkey), []).append(h)
            self._distinct_rows += len(h)
        if self._distinct_rows > max(1 << 20, self._distinct_size):
            self._merge_distinct()

    def _live_deltas(
        self, df: pl.DataFrame, pairs: pl.DataFrame, dropped: pl.DataFrame, first_row: int
    ) -> pl.DataFrame:
        """Return one live-block delta per row, in stream order.

        +1 per stored block, -1 per effective remove (counted under the report row of the
        entry it removes); each clear adds its drops at its own row.
        """
        tc = pl.col("type_code")
        n = df.height
        delta = df.select(
            pl.when((tc == STORED) & pl.col("hash").is_not_null())
            .then(pl.lit(1, pl.Int64))
            .otherwise(pl.lit(0, pl.Int64))
        ).to_series()
        gkey = df["gkey"]
        if pairs.height:
            at = pairs["row"] - first_row
            delta = delta.scatter(at, -1)
            gkey = gkey.scatter(at, pairs["gkey"])
        # The timeline bucket of each delta (its row's): null without a timeline.
        bucket = (
            df["bucket"]
            if "bucket" in df.columns
            else pl.repeat(None, n, dtype=pl.Int64, eager=True)
        )
        deltas = pl.DataFrame({"row": df["row"], "gkey": gkey, "bucket": bucket, "delta": delta})
        if dropped.height:
            drop_bucket = (
                pl.col("bucket").first() if "bucket" in dropped.columns else pl.lit(None, pl.Int64)
            )
            drops = (
                dropped.group_by("row", "gkey")
                .agg(bucket=drop_bucket, delta=-pl.len().cast(pl.Int64))
                .sort("row")
                .select("row", "gkey", "bucket", "delta")
            )
            deltas = deltas.merge_sorted(drops, key="row")
        return deltas

    def _n_distinct(self, ids: list[int]) -> int:
        """Distinct hashes stored in any of these gkeys (cached per set of gkeys)."""
        key = tuple(sorted(i for i in ids if i in self.distinct))
        got = self._distinct_counts.get(key)
        if got is None:
            parts = [self.distinct[i] for i in key]
            if not parts:
                got = 0
            elif len(parts) == 1:
                got = len(parts[0])
            else:
                got = pl.concat(parts).n_unique()
            self._distinct_counts[key] = got
        return got

    def _merge_distinct(self) -> None:
        for gkey, parts in self._distinct_parts.items():
            old = self.distinct.get(gkey)
            self.distinct[gkey] = sorted_union([old, *parts] if old is not None else parts)
        self._distinct_parts = {}
        self._distinct_rows = 0
        self._distinct_size = sum(len(s) for s in self.distinct.values())

    def _add_lifetimes(self, pairs: pl.DataFrame) -> None:
        """Lifetimes of this chunk's FIFO pairs, counted under the remove's report row.

        ts is float seconds since the epoch: the difference is taken at microsecond
        resolution so that float rounding of large timestamps does not show up. A clock
        that steps backwards between store and remove gives a negative difference: it is
        clamped to 0 and counted (a finding), never reported as a negative lifetime.
        """
        lt = pairs.select(
            gkey=pl.col("remove_gkey"),
            lifetime_s=((pl.col("remove_ts") * 1e6).round() - (pl.col("store_ts") * 1e6).round())
            / 1e6,
        ).filter(pl.col("lifetime_s").is_finite())  # a ts that is NaN or inf: none
        if lt.height == 0:
            return
        negative = int((lt["lifetime_s"] < 0).sum())
        if negative:
            self.negative_lifetimes += negative
            lt = lt.with_columns(pl.col("lifetime_s").clip(lower_bound=0.0))
        if self.hist is None and self.n_lifetimes + lt.height <= EXACT_LIFETIMES:
            self.lifetimes.append(lt)
            self.n_lifetimes += lt.height
            return
        parts = [*self.lifetimes, lt]
        self.lifetimes = []
        self.n_lifetimes += lt.height
        h = (
            pl.concat(parts)
            .select("gkey", bin=hist_bin(pl.col("lifetime_s")))
            .group_by("gkey", "bin")
            .agg(n=pl.len().cast(pl.Int64))
        )
        if self.hist is not None:
            h = pl.concat([self.hist, h]).group_by("gkey", "bin").agg(pl.col("n").sum())
        self.hist = h

    def _add_timeline(self, df: pl.DataFrame, deltas: pl.DataFrame) -> None:
        tc = pl.col("type_code")
        blocks = (
            df.lazy()
            .filter(pl.col("hash").is_not_null() & (tc != CLEARED))
            .group_by("bucket", "gkey")
            .agg(
                stores=(tc == STORED).sum().cast(pl.Int64),
                removes=(tc == REMOVED).sum().cast(pl.Int64),
            )
        )
        live = (
            deltas.lazy()
            .filter(pl.col("gkey").is_not_null())
            .group_by("bucket", "gkey")
            .agg(delta=pl.col("delta").sum())
        )
        self.timeline = (
            pl.concat([self.timeline.lazy(), blocks, live], how="diagonal")
            .filter(pl.col("bucket").is_not_null())
            .fill_null(0)
            .group_by("bucket", "gkey")
            .agg(pl.col("stores").sum(), pl.col("removes").sum(), pl.col("delta").sum())
            .collect()
        )

    # -- the result ----------------------------------------------------------------------

    def _level_map(self) -> pl.DataFrame:
        return self._registry_frame().with_columns(
            L_kind=pl.col("kind_final"),
            L_window=pl.col("sliding_window"),
            L_group=pl.col("gkey").cast(pl.Int64),
            L_total=pl.lit(0, pl.Int64),
        )

    def _lifetime_frame(self) -> pl.DataFrame:
        """(gkey, lifetime_s, n) rows: exact values (n=1) or histogram bin centres."""
        if self.hist is not None:
            return self.hist.select("gkey", lifetime_s=hist_centre(pl.col("bin")), n="n")
        if not self.lifetimes:
            return pl.DataFrame(schema={"gkey": pl.UInt32, "lifetime_s": pl.Float64, "n": pl.Int64})
        return pl.concat(self.lifetimes).with_columns(n=pl.lit(1, pl.Int64))

    def tables(self) -> dict[str, pl.DataFrame]:
        """Return totals, by_kind, by_window, by_group as DataFrames.

        Returns:
            The four tables (totals: one row).
        """
        self._merge_distinct()
        self._distinct_counts = {}
        reg = self._level_map()
        if self.live_end is not None:
            live_end = pl.DataFrame(
                {"gkey": list(self.live_end), "live_blocks_end": list(self.live_end.values())},
                schema={"gkey": pl.UInt32, "live_blocks_end": pl.Int64},
            )
        else:
            live_end = self.live.group_by("gkey").agg(live_blocks_end=pl.len().cast(pl.Int64))
        base = (
            reg.join(self.counts, on="gkey", how="left")
            .join(live_end, on="gkey", how="left")
            .with_columns(*[pl.col(c).fill_null(0) for c in (*ADDITIVE, "live_blocks_end")])
            .filter(
                # A key every row of which moved elsewhere (e.g. orphans without group_idx).
                pl.any_horizontal(
                    pl.col(c) != 0
                    for c in (
                        "store_events",
                        "blocks_stored",
                        "remove_events",
                        "blocks_removed",
                        "blocks_cleared",
                        "live_blocks_end",
                    )
                )
            )
            if reg.height
            else reg.with_columns(
                *[pl.lit(0, pl.Int64).alias(c) for c in (*ADDITIVE, "live_blocks_end")]
            )
        )
        lts = self._lifetime_frame().join(
            reg.select("gkey", "L_kind", "L_window", "L_group", "L_total"), on="gkey", how="left"
        )
        members: dict[str, dict[object, list[int]]] = {}
        for _g, k, w, i in reg.select(
            "group_idx", "kind_final", "sliding_window", "gkey"
        ).iter_rows():
            for level, key in (("L_kind", k), ("L_window", w), ("L_group", i), ("L_total", 0)):
                members.setdefault(level, {}).setdefault(key, []).append(i)
        out: dict[str, pl.DataFrame] = {}
        for level, name in (
            ("total", "totals"),
            ("kind", "by_kind"),
            ("window", "by_window"),
            ("group", "by_group"),
        ):
            col = f"L_{level}"
            agg = base.group_by(col).agg(
                *[pl.col(c).sum().cast(pl.Int64) for c in (*ADDITIVE, "live_blocks_end")]
            )
            d = pl.DataFrame(
                {
                    col: list(members.get(col, {})),
                    "distinct_hashes": [
                        self._n_distinct(ids) for ids in members.get(col, {}).values()
                    ],
                },
                schema={col: agg.schema[col], "distinct_hashes": pl.Int64},
            )
            q = quantiles(lts, col)
            level_peaks = self.levels[level]
            peaks = pl.DataFrame(
                {col: list(level_peaks), "peak_live_blocks": [v[1] for v in level_peaks.values()]},
                schema={col: agg.schema[col], "peak_live_blocks": pl.Int64},
            )
            t = (
                agg.join(d, on=col, how="left", nulls_equal=True)
                .join(peaks, on=col, how="left", nulls_equal=True)
                .join(q, on=col, how="left", nulls_equal=True)
                .with_columns(
                    pl.col("distinct_hashes").fill_null(0), pl.col("peak_live_blocks").fill_null(0)
                )
            )
            if level == "total":
                if t.height == 0:
                    t = pl.DataFrame({c: [0] for c in COUNT_COLUMNS}).with_columns(
                        *[pl.lit(None, pl.Float64).alias(c) for c in LIFETIME_COLUMNS]
                    )
                out[name] = t.select(*COLUMNS)
            elif level == "kind":
                out[name] = t.rename({col: "kind"}).select("kind", *COLUMNS).sort("kind")
            elif level == "window":
                out[name] = (
                    t.rename({col: "sliding_window"})
                    .select("sliding_window", *COLUMNS)
                    .sort("sliding_window", nulls_last=False)
                )
            else:
                keys = reg.select(col, "group_idx", kind="kind_final", sw="sliding_window")
                out[name] = (
                    t.join(keys, on=col, how="left")
                    .select("group_idx", "kind", pl.col("sw").alias("sliding_window"), *COLUMNS)
                    .sort(["group_idx", "kind"], nulls_last=True)
                )
        return out

    def timeline_frame(self) -> pl.DataFrame | None:
        """Return the timeline: per bucket and kind, stores, removes, live blocks at its end.

        Returns:
            See :func:`kvtool.report.aggregates.timeline_frame`; None without ``every``.
        """
        if self.every_ns is None:
            return None
        rows = self._level_map().select("gkey", kind="L_kind")
        per_bucket = (
            self.timeline.join(rows, on="gkey", how="left")
            .group_by("bucket", "kind")
            .agg(pl.col("stores").sum(), pl.col("removes").sum(), pl.col("delta").sum())
        )
        frame, self.timeline_sparse = timeline_frame(per_bucket, self.every_ns)
        return frame


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
) -> Report:
    """Read recordings (several: one combined report) and build the report, streaming.

    With ``jobs`` > 1 or ``ray_address``, payloads are decoded in worker processes or on
    a Ray cluster and merged in stream order (:mod:`kvtool.report.parallel`): the report
    is identical to a single-process one.

    Args:
        paths: Recordings.
        groups_file: ``--groups FILE``.
        group_flags: ``--group IDX=KIND[:WINDOW]`` flags.
        every_ns: Timeline bucket in ns, or None.
        chunk_bytes: Payload bytes per chunk.
        jobs: Decoding processes on this machine (1: decode in this process).
        ray_address: Decode on the Ray cluster at this address instead.
        clock: The timeline's clock, ``receive`` or ``publish`` (lifetimes always use the
            batch ``ts``: the engine's own clock).
        select: Report only these batches (``--channel``, ``--rank``, ``--since``,
            ``--until``: :func:`kvtool.columns.iter_raw_chunks`).
        progress: Called with (bytes done, bytes total) of the input files.
        split: Extra tables: ``rank`` (``by_rank``), ``channel`` (``by_channel``).

    Returns:
        The report.

    Raises:
        RecordingError: A recording cannot be opened.
        MetadataError: Invalid group metadata.
        UsageError: ``ray_address`` given but Ray is not installed.
    """
    from kvtool.report import parallel, partial

    check_clock(clock)
    annotator = make_annotator(
        recording_groups(paths), groups_file=groups_file, group_flags=group_flags
    )
    if (jobs > 1 or ray_address is not None) and select is None and not split:
        # Recordings that share no stream are separate units of work: each is reported
        # on its own (a worker, a Ray task) and the partial reports merged exactly.
        units = partial.plan_units(paths, split=jobs if ray_address is None else 1 << 16)
        if len(units) > 1:
            with contextlib.suppress(partial.NotMergeable):
                return parallel.report_units(
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
    elif jobs > 1:
        decode_map, close = parallel.pool_decode_map(jobs)
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


_SWITCH_INTERVAL = 0.0005
"""GIL switch interval (s) while the report's decode thread and builder run together."""


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
        decode_map: Decodes raw chunks in order (default: here, a chunk ahead in a thread).
        clock: The timeline's clock (``receive`` or ``publish``).
        select: Report only these batches.
        progress: Called with (bytes done, bytes total) of the input files.
        split: Extra tables: ``rank`` (``by_rank``), ``channel`` (``by_channel``).

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
) -> tuple[ReportBuilder, ReadStats]:
    """Read, decode, annotate and feed a builder, in stream order (no finishing).

    Args:
        paths: Recordings.
        annotator: Annotates each table chunk (stream order).
        every_ns: Timeline bucket in ns, or None.
        chunk_bytes: Payload bytes per chunk.
        decode_map: Decodes raw chunks in order (default: here, a chunk ahead in a thread).
        clock: The timeline's clock (``receive`` or ``publish``).
        select: Report only these batches.
        progress: Called with (bytes done, bytes total) of the input files.
        splits: Also feeds these per-rank/per-channel builders.
        peak_log: Logs the peaks per batch (for a merge with other units' partial reports).
        streams: Only these publisher streams (see :func:`kvtool.columns.iter_raw_chunks`).

    Returns:
        The fed builder and the read's stats.
    """
    stats = ReadStats()
    builder = ReportBuilder(every_ns, annotator.group_kind, clock)
    builder.peak_log = peak_log
    builder.streams = stats.channels
    chunks = iter_tables(
        paths,
        stats=stats,
        chunk_bytes=chunk_bytes,
        labels=False,
        decode_map=decode_map,
        select=select,
        progress=progress,
        streams=streams,
    )

    def annotated() -> Iterator[pl.DataFrame]:
        # Annotating is per chunk and needs no builder state: done in the prefetch thread,
        # it overlaps the builder (both are mostly polars, which releases the GIL).
        for chunk in chunks:
            yield annotator(chunk, stats)

    # The decode thread runs Python (msgspec, list passes) holding the GIL, while the
    # builder here hands the GIL back at every polars query and then waits to get it
    # back: up to a switch interval (5 ms by default) each time. A shorter interval for
    # the loop keeps the builder -- the slower stage -- from idling.
    switch = sys.getswitchinterval()
    sys.setswitchinterval(_SWITCH_INTERVAL)
    try:
        for df in prefetch(annotated()):
            builder.add(df)
            if splits is not None:
                splits.add(df)
    finally:
        sys.setswitchinterval(switch)
    return builder, stats


_SPLIT_COLUMN = {"rank": "dp_rank", "channel": "channel_id"}


class Splits:
    """``--by rank`` and ``--by channel``: one more builder per rank or channel.

    Each gets its rank's (channel's) rows only. The live state is keyed by channel, and a
    data-parallel rank publishes on its own channel, so each builder's state is the one
    its rows have in the whole report: its totals are that rank's (channel's) row.

    Args:
        split: ``rank`` and/or ``channel``.
        group_kind: As for :class:`ReportBuilder`.
    """

    def __init__(self, split: Sequence[str], group_kind: attribution.GroupKind | None) -> None:
        bad = [s for s in split if s not in _SPLIT_COLUMN]
        if bad:
            raise ValueError(f"unknown split {bad[0]!r}")
        self.group_kind = group_kind
        self.parts: dict[str, dict[object, ReportBuilder]] = {s: {} for s in split}

    def add(self, df: pl.DataFrame) -> None:
        """Feed one annotated chunk's rows to the builder of each rank (channel)."""
        for by, builders in self.parts.items():
            for (key,), part in df.partition_by(_SPLIT_COLUMN[by], as_dict=True).items():
                b = builders.get(key)
                if b is None:
                    b = builders[key] = ReportBuilder(None, self.group_kind)
                b.add(part)

    def finish(self, rep: Report, stats: ReadStats) -> Report:
        """Return ``rep`` with ``by_rank``/``by_channel`` tables."""
        if not self.parts:
            return rep
        out = dict(rep.__dict__)
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
        return pl.concat(
            [frame, pl.DataFrame(schema=dict.fromkeys(COLUMNS, pl.Int64))], how="horizontal"
        )
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
    timeline = builder.timeline_frame()
    findings = report_findings(tabs, builder, annotator, stats)
    dur = None
    if builder.first_ts is not None and builder.last_ts is not None:
        dur = builder.last_ts - builder.first_ts
    source: dict[str, object] = {
        "recordings": list(stats.recordings),
        "channels": [
            {
                "recording": ref.recording,
                "channel": ref.info.name,
                "endpoint": ref.info.endpoint,
                "topic": ref.info.topic,
                "dp_rank": ref.info.dp_rank,
            }
            for ref in stats.channels.values()
        ],
        "group_metadata": annotator.sources(),
        "batches": stats.messages,
        **({"unselected_batches": stats.unselected} if stats.unselected else {}),
        "events": stats.events,
        "block_rows": stats.rows,
        "duration_s": dur,
        **({"clock": builder.clock} if builder.every_ns is not None else {}),
        "lifetimes": "exact"
        if builder.hist is None
        else f"log histogram, {HIST_BINS_PER_OCTAVE} bins per doubling",
        "skipped_batches": stats.bad_batches,
        "skipped_events": stats.skipped_events,
        "damaged": list(stats.damaged),
    }
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


__all__ = [
    "COLUMNS",
    "COUNT_COLUMNS",
    "EXACT_LIFETIMES",
    "LIFETIME_COLUMNS",
    "Report",
    "ReportBuilder",
    "Splits",
    "build_report",
    "finish_report",
    "report_from_chunks",
    "report_with",
]
