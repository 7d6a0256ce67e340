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

import math
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import polars as pl

from kvtool.annotate import kind_label
from kvtool.columns import (
    CLEARED,
    REMOVED,
    STORED,
    UNATTRIBUTED,
    ChannelRef,
    ReadStats,
    TableAnnotator,
    np,
)
from kvtool.report import announce, attribution, kernel
from kvtool.report.aggregates import (
    ADDITIVE,
    COLUMNS,
    COUNT_COLUMNS,
    DEFAULT_CLOCK,
    EXACT_LIFETIMES,
    LIFETIME_COLUMNS,
    PLAUSIBLE_TS_MAX,
    PLAUSIBLE_TS_MIN,
    Peaks,
    check_clock,
    sorted_union,
)
from kvtool.report.lifebound import CopyBound
from kvtool.report.names import (
    ALIASES,
    DISTANCE_COLUMNS,
    GAP_COLUMNS,
    QUANTILE_COLUMNS,
    RATIO_COLUMNS,
)
from kvtool.report.partial import (
    NotMergeable,
    PartialReport,
    PeakLog,
    merge_peaks,
    merge_stats,
)
from kvtool.report.samples import LEVELS, Counts, Seconds, remap
from kvtool.report.timeline import (
    TIMELINE_SCHEMA,
    TIMELINE_SUMS,
    bucket_expr,
    data_span,
    timeline_frame,
    ts_ns,
)

if TYPE_CHECKING:
    from numpy.typing import NDArray


_BLOCK_IN = (*kernel.MAKES_BLOCK, kernel.REKEY, kernel.DISCARDED_STORE)
_BLOCK_OUT = (kernel.EVICTED, kernel.PROMOTED, kernel.REKEY_REMOVE, kernel.DISCARD)
_ANNOUNCED = (kernel.ANNOUNCED, kernel.ANNOUNCED_AMBIGUOUS)
_NOT_A_BLOCK = (
    kernel.EXTRA,
    kernel.EXTRA_NOOP,
    kernel.REKEY,
    kernel.DISCARDED_STORE,
    *_ANNOUNCED,
)
_PREFIX_KINDS = ("full_attention", "mla_attention", "sink_full_attention")
_NOT_AN_EVICTION = (kernel.EVICTED_EXTRA, kernel.PROMOTED, kernel.REKEY_REMOVE, kernel.DISCARD)
_KEY_IN = (*_BLOCK_IN, kernel.EXTRA)
_KEY_OUT = (*_BLOCK_OUT, kernel.EVICTED_EXTRA)
_CLASS_COLUMNS = (
    ("partial_extra_keys", kernel.EXTRA),
    ("evicted_extra_keys", kernel.EVICTED_EXTRA),
    ("rekeys", kernel.REKEY),
    ("partial_promotions", kernel.PROMOTED),
    ("rekey_removes", kernel.REKEY_REMOVE),
    ("checkpoints_discarded", kernel.DISCARD),
)
"""Issue 21: the kernel's classes of stores and removes (docs/SEMANTICS.md), as columns."""

ReportRow = tuple[int | None, str, int | None]
"""(group_idx, kind, sliding_window) of one report row."""

MediumRow = tuple[int | None, str, int | None, str | None]
"""(group_idx, kind, sliding_window, medium) of one report row of a builder made with
``by_medium`` (``kvtool serve``'s ``medium`` label)."""

_I64 = "int64"


def _column(df: pl.DataFrame, name: str, fill: int = 0) -> tuple[NDArray[Any], NDArray[Any] | None]:
    """Return a column as an int64 array (nulls as ``fill``) and its null mask (None: none)."""
    s = df[name]
    if s.null_count():
        return np.asarray(s.fill_null(fill).to_numpy(), dtype=_I64), s.is_null().to_numpy()
    return np.asarray(s.to_numpy(), dtype=_I64), None


def _plausible_ts(df: pl.DataFrame) -> NDArray[Any]:
    """:func:`~kvtool.report.aggregates.plausible_ts` on arrays (same floats)."""
    ts_s = df["ts"]
    if ts_s.null_count():
        ts_s = ts_s.fill_null(float("nan"))
    ts = np.asarray(ts_s.to_numpy(), dtype=np.float64)
    with np.errstate(invalid="ignore"):
        ok = np.isfinite(ts) & (ts >= PLAUSIBLE_TS_MIN) & (ts < PLAUSIBLE_TS_MAX)
    if ok.all():
        return ts
    fallback = df["log_time"].to_numpy().astype(np.float64) * 1e-9
    return np.where(ok, ts, fallback)


def _codes(strings: pl.Series) -> NDArray[Any]:
    """Codes of a few strings (null: -1), equal where the strings are, within one call."""
    return np.asarray(
        strings.cast(pl.Categorical).to_physical().cast(pl.Int64).fill_null(-1).to_numpy(),
        dtype=_I64,
    )


def _changes(values: NDArray[Any], out: NDArray[Any]) -> None:
    """``out[1:] |= values[1:] != values[:-1]`` unless ``values`` is constant."""
    if len(values) and not (values == values[0]).all():
        out[1:] |= values[1:] != values[:-1]


def _pack(cols: list[NDArray[Any]]) -> NDArray[Any]:
    """One int64 per row that is equal exactly where all ``cols`` (integer arrays) are.

    Each column is offset by its minimum and scaled by the span of the ones before it;
    when the spans' product would not fit, the columns are replaced by dense codes first.
    """
    lows = [int(v.min()) for v in cols]
    spans = [int(v.max()) - lo + 1 for v, lo in zip(cols, lows, strict=True)]
    if math.prod(spans) >= 1 << 62:
        dense = [np.unique(v, return_inverse=True) for v in cols]
        cols = [inv.reshape(-1) for _u, inv in dense]
        lows = [0] * len(cols)
        spans = [len(u) for u, _inv in dense]
        if math.prod(spans) >= 1 << 62:  # pragma: no cover - needs > 2**10 distinct of each
            packed = np.zeros(len(cols[0]), dtype=_I64)
            for codes, span in zip(cols, spans, strict=True):
                packed = np.unique(packed * span + codes, return_inverse=True)[1].reshape(-1)
            return packed
    packed = np.zeros(len(cols[0]), dtype=_I64)
    for values, lo, span in zip(cols, lows, spans, strict=True):
        packed = packed * span + (values.astype(_I64) - lo)
    return packed


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
    ) -> None:
        annotator = getattr(group_kind, "__self__", None)
        mode = report_mode or getattr(annotator, "report_mode", None) or "auto"
        if mode not in announce.MODES:
            raise ValueError(f"report mode {mode!r}: expected one of {', '.join(announce.MODES)}")
        self.report_mode: str = mode
        self.by_medium = by_medium
        self.max_keys = max_keys
        self.every_ns = every_ns
        self.clock = check_clock(clock)
        self.origin_ns = origin_ns
        self.group_kind = group_kind
        self.rows = 0
        self.registry: dict[ReportRow | MediumRow, int] = {}
        self.kstate = kernel.State(max_keys, bounds=True)
        self.copy_bound = CopyBound()  # R8's lifetime bound (kvtool/report/lifebound.py)
        self.counts: NDArray[Any] = np.zeros((0, len(ADDITIVE)), dtype=_I64)
        # Distinct stored hashes per gkey: a sorted, duplicate-free int64 array each, merged
        # with each chunk's new hashes now and then (sort-merge: no big hash tables).
        self.distinct: dict[int, NDArray[Any]] = {}
        self._distinct_parts: dict[int, list[NDArray[Any]]] = {}
        self._distinct_rows = 0
        self._distinct_size = 0
        self._distinct_counts: dict[tuple[int, ...], int] = {}
        self.life = Seconds()
        self.gaps = Seconds()
        self.distances = Counts()
        self.negative_lifetimes = 0
        self.peaks = Peaks()
        # Per (bucket, gkey) sums, plus chunks' rows not yet summed in (see ``timeline``).
        self._timeline = pl.DataFrame(schema=TIMELINE_SCHEMA)
        self._timeline_parts: list[pl.DataFrame] = []
        self._timeline_rows = 0
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
        self.row_gkey: NDArray[Any] = np.zeros(0, dtype=_I64)
        # The kernel's ``what`` of each row of the last chunk added (kernel.NONE ...).
        self.row_what: NDArray[Any] = np.zeros(0, dtype=np.int8)
        self.row_note: NDArray[Any] = np.zeros(0, dtype=np.int8)
        # Publisher restarts (a channel's seq going backwards): per channel, [restarts,
        # live blocks they dropped]; the kernel's channel of each stream now (a new one
        # from each restart on), the stream of each kernel channel, the last seq seen.
        self.restarts: dict[int, list[int]] = {}
        self._kchan: dict[int, int] = {}
        self._kreal: list[int] = []
        self._last_seq: dict[int, int] = {}
        # Live blocks at the end per gkey when merged from partial reports (no entries).
        self.live_end: dict[int, int] | None = None
        # Set by run_builder: the read's channels, and the peak log of a unit of work.
        self.streams: dict[int, ChannelRef] = {}
        self.peak_log: PeakLog | None = None
        # Issue 21: batches numbered so far, and per (channel, group) the block size and
        # whether the channel has a Mamba group (metadata, else learned: _shape).
        self._batches = 0
        self._group_shape: dict[tuple[int, int, bool], tuple[int, bool]] = {}
        self._learned_bs: dict[tuple[int, int, bool], int] = {}
        # Hit announcements (R6): per channel, its groups and its last batch number.
        self._announce_ctx = announce.ChannelContext()

    @property
    def timeline(self) -> pl.DataFrame:
        """Per (bucket, gkey) sums of ``stores``, ``removes`` and ``delta``."""
        if self._timeline_parts:
            self._sum_timeline()
        return self._timeline

    @timeline.setter
    def timeline(self, frame: pl.DataFrame) -> None:
        self._timeline = frame
        self._timeline_parts = []
        self._timeline_rows = 0

    def _sum_timeline(self) -> None:
        self._timeline = (
            pl.concat([self._timeline, *self._timeline_parts])
            .group_by("bucket", "gkey")
            .agg(*TIMELINE_SUMS)
        )
        self._timeline_parts = []
        self._timeline_rows = 0

    @property
    def levels(self) -> dict[str, dict[object, tuple[int, int]]]:
        """(live now, peak) per level key: ``kind``, ``window``, ``group``, ``total``."""
        return self.peaks.levels

    # -- registry of report rows (group_idx, kind, window) --------------------------------

    def _gkey_of(
        self, group_idx: int | None, kind: str, window: int | None, *medium: str | None
    ) -> int:
        key: ReportRow | MediumRow = (group_idx, kind, window, *medium)  # type: ignore[assignment]
        if key not in self.registry:
            self.registry[key] = len(self.registry)
        return self.registry[key]

    def _gkeys(
        self,
        df: pl.DataFrame,
        skip: NDArray[Any],
        unattributed: NDArray[Any],
        group: NDArray[Any],
        no_group: NDArray[Any],
    ) -> NDArray[Any]:
        """Return each row's report row (``gkey``; -1 where ``skip``: clears belong to none).

        A row's report row is (group_idx, kind_final, sliding_window): stores count under
        their own kind, removes under their group's; a remove left ``unattributed`` by
        :func:`kvtool.report.attribution.resolve_ungrouped` has no window; a row with no
        kind is ``unannotated`` (distinct from vLLM's own ``unknown``). Rows come in runs
        of one key (an event's blocks share it), so the keys are read at run starts only; the few
        distinct keys of the chunk are registered in order of first appearance, so
        numbering follows the stream.
        """
        n = df.height
        kind_s = df["kind"]
        # Runs of one kind string (nulls included) without coding every row: the kinds are
        # coded at run starts only (a categorical cast of the whole column costs more).
        kind_run = kind_s.rle_id().to_numpy()
        window, window_null = _column(df, "sliding_window")
        if window_null is None:
            window_null = np.zeros(n, dtype=bool)
        any_unattributed = bool(unattributed.any())
        if any_unattributed:
            window_null = window_null | unattributed
            window = np.where(unattributed, 0, window)
        cols: tuple[NDArray[Any], ...] = (
            group, no_group, kind_run, unattributed, window, window_null, skip
        )  # fmt: skip
        medium_s = df["medium"] if self.by_medium else None
        if medium_s is not None:
            cols = (*cols, medium_s.rle_id().to_numpy())
        change = np.zeros(n, dtype=bool)
        change[0] = True
        for values in cols:
            _changes(values, change)
        starts = np.flatnonzero(change)
        kind = np.asarray(
            kind_s.gather(starts)
            .cast(pl.Categorical)
            .to_physical()
            .cast(pl.Int64)
            .fill_null(-1)
            .to_numpy(),
            dtype=_I64,
        )
        if any_unattributed:
            kind = np.where(unattributed[starts], -2, kind)
        at = [group, no_group, None, window, window_null, skip]
        codes = [kind if values is None else values[starts] for values in at]
        if medium_s is not None:
            codes.append(_codes(medium_s.gather(starts)))
        packed = _pack(codes)
        _uniq, first, inverse = np.unique(packed, return_index=True, return_inverse=True)
        code_gkey = np.full(len(first), -1, dtype=_I64)
        for j in np.argsort(first).tolist():
            r = int(starts[first[j]])
            if skip[r]:
                continue
            # A kind spelled like kvtool's own labels keeps apart from them (issue 24).
            k_final = UNATTRIBUTED if unattributed[r] else kind_label(kind_s[r])
            code_gkey[j] = self._gkey_of(
                None if no_group[r] else int(group[r]),
                k_final,
                None if window_null[r] else int(window[r]),
                *(() if medium_s is None else (medium_s[r],)),
            )
        lengths = np.diff(np.append(starts, n))
        out: NDArray[Any] = np.repeat(code_gkey[inverse.reshape(-1)], lengths)
        return out

    def _registry_frame(self) -> pl.DataFrame:
        frame = pl.DataFrame(
            [(key[0], key[1], key[2], i) for key, i in self.registry.items()],
            schema={
                "group_idx": pl.Int64,
                "kind_final": pl.String,
                "sliding_window": pl.Int64,
                "gkey": pl.UInt32,
            },
            orient="row",
        )
        if self.by_medium:
            media = [key[3] if len(key) > 3 else None for key in self.registry]
            frame = frame.with_columns(medium=pl.Series(media, dtype=pl.String))
        return frame

    # -- one chunk ---------------------------------------------------------------------------

    def add(self, df: pl.DataFrame) -> None:
        """Process one annotated chunk (in stream order).

        Args:
            df: A chunk from :func:`kvtool.columns.iter_annotated`.
        """
        if df.height == 0:
            self.row_gkey = np.zeros(0, dtype=_I64)
            self.row_what = np.zeros(0, dtype=np.int8)
            self.row_note = np.zeros(0, dtype=np.int8)
            return
        n = df.height
        first_row = self.rows
        self.rows += n
        tc = df["type_code"].to_numpy()
        is_clear = tc == CLEARED
        is_store = tc == STORED
        is_remove = tc == REMOVED
        ts = _plausible_ts(df)
        lo, hi = float(ts.min()), float(ts.max())
        self.first_ts = lo if self.first_ts is None else min(self.first_ts, lo)
        self.last_ts = hi if self.last_ts is None else max(self.last_ts, hi)
        log_time = df["log_time"]
        rx_lo, rx_hi = int(log_time.min()), int(log_time.max())  # type: ignore[arg-type]
        self.first_rx = rx_lo if self.first_rx is None else min(self.first_rx, rx_lo)
        self.last_rx = rx_hi if self.last_rx is None else max(self.last_rx, rx_hi)
        if self.origin_ns is None and self.every_ns is not None:
            self.origin_ns = int(log_time[0]) if self.clock == "receive" else ts_ns(ts[0])
        hashes, hash_null = _column(df, "hash")
        has_hash = ~hash_null if hash_null is not None else np.ones(n, dtype=bool)
        group, group_null = _column(df, "group_idx")
        no_group = group_null if group_null is not None else np.zeros(n, dtype=bool)
        channel = np.asarray(df["channel_id"].to_numpy(), dtype=_I64)
        # The channels whose stores carry group_idx: there a remove without one needs the
        # (hash -> group) state; elsewhere -- old vLLM, no group_idx at all -- it is keyed
        # by (channel, no group, hash) like its stores.
        grouped = channel[is_store & ~no_group]
        if len(grouped):
            self.grouped_channels |= set(np.flatnonzero(np.bincount(grouped)).tolist())
        unattributed = unattributed_orphan = np.zeros(n, dtype=bool)
        if group_null is not None and (is_remove & no_group & has_hash).any():
            df = self._attribute(df.with_columns(row=pl.int_range(first_row, first_row + n)))
            if "unattributed" in df.columns:
                group, group_null = _column(df, "group_idx")
                no_group = group_null if group_null is not None else np.zeros(n, dtype=bool)
                unattributed = df["unattributed"].to_numpy() & is_remove
                unattributed_orphan = df["unattributed_orphan"].to_numpy()
        gkey = self._gkeys(df, is_clear, unattributed, group, no_group)
        block = has_hash & ~is_clear & ~unattributed
        op = np.zeros(n, dtype=np.int8)
        op[block & is_store] = kernel.STORE
        op[block & ~is_store] = kernel.REMOVE
        op[is_clear] = kernel.CLEAR
        seq, _ = _column(df, "seq")
        shape = self._shape(df, channel, seq, group, no_group, is_store, block)
        kchan, at, old = self._kernel_channels(channel, seq)
        out, restart_drop = self._step(op, kchan, group, no_group, hashes, ts, gkey, at, old, shape)
        if len(at):
            per_chan = np.bincount(
                channel[out.drop_row[restart_drop]],
                weights=out.drop_n[restart_drop],
                minlength=int(channel.max()) + 1,
            )
            for c in channel[at].tolist():
                self.restarts.setdefault(c, [0, 0])[0] += 1
            for c in set(channel[at].tolist()):
                self.restarts[c][1] += int(per_chan[c])
        what = out.what
        block_index = df["block_index"]
        if block_index.null_count():
            block_index = block_index.fill_null(-1)
        first_block = block_index.to_numpy() == 0
        moved = (what == kernel.ORPHAN) & no_group
        if moved.any():
            # Orphan removes without group_idx (old vLLM): the hash is live in no group, so
            # the remove is unattributed. Its row moves off the group it was keyed under
            # for everything from here (counts, peaks, timeline), as when the chunk
            # already attributed it (_attribute): chunk boundaries change nothing.
            gkey = gkey.copy()
            if self.by_medium:
                media = df["medium"].to_numpy()
                for m in dict.fromkeys(media[moved].tolist()):
                    gkey[moved & (media == m)] = self._gkey_of(None, UNATTRIBUTED, None, m)
            else:
                gkey[moved] = self._gkey_of(None, UNATTRIBUTED, None)
        self.row_gkey = gkey
        self.row_what = what  # the kernel's verdict per row (kvtool.report.tiers reads it)
        self.row_note = out.note  # and its note (kvtool.report.meaning reads it)
        self._add_counts(
            df,
            gkey,
            is_clear,
            is_store,
            is_remove,
            has_hash,
            first_block,
            unattributed_orphan,
            moved,
            out,
        )
        stored = op == kernel.STORE
        real = stored & ~np.isin(what, _ANNOUNCED)  # an announced hit stores nothing
        self._add_distinct(gkey[real], hashes[real])
        paired = np.flatnonzero((what == kernel.EVICTED) | (what == kernel.EVICTED_EXTRA))
        self._add_lifetimes(gkey[paired], ts[paired], out.ts[paired])
        self.copy_bound.take(self.kstate, EXACT_LIFETIMES, self.life)
        again = np.flatnonzero(what == kernel.RECOMPUTED)
        if len(again):
            gap = _seconds_between(out.ts[again], ts[again])
            finite = np.isfinite(gap)
            self.gaps.add(gkey[again][finite], np.maximum(gap[finite], 0.0), EXACT_LIFETIMES)
            self.distances.add(gkey[again], out.distance[again])
        # Live-block deltas in stream order: +1 per stored block, -1 per effective remove
        # (under the report row of the entry it removes), a clear's drops at its row.
        # A physical block: +1 where a store makes or re-keys one, -1 where a remove takes
        # one off (issue 21: extra keys and their removes change no block).
        delta = (stored & np.isin(what, _BLOCK_IN)).astype(_I64)
        evicted = np.flatnonzero(np.isin(what, _BLOCK_OUT))
        delta[evicted] = -1
        delta_gkey = gkey.copy()
        delta_gkey[evicted] = out.gkey[evicted]
        delta_row = np.arange(n)
        dropped = np.zeros(n, dtype=bool)
        if len(out.drop_row):
            # One delta per (clear, gkey) at the clear's own row: the drops' order inside
            # a clear cannot change a peak (all negative).
            # Before the row's own delta: a restart's row is a store or remove (a clear's
            # own delta is 0), and its drops come first.
            pos = np.searchsorted(delta_row, out.drop_row, side="left")
            delta = np.insert(delta, pos, -out.drop_n)
            delta_gkey = np.insert(delta_gkey, pos, out.drop_gkey)
            delta_row = np.insert(delta_row, pos, out.drop_row)
            dropped = np.insert(dropped, pos, True)
        rows: dict[int, ReportRow] = {i: (k[0], k[1], k[2]) for k, i in self.registry.items()}
        self.peaks.add(delta_gkey, delta, rows)
        if self.peak_log is not None:
            self._log_peaks(df, delta_row, delta_gkey, delta, rows)
        if self.every_ns is not None:
            # Blocks, as the tables count them (issue 21): extra keys, re-keys and
            # discarded checkpoints are no stored block, their removes no eviction.
            self._add_timeline(
                df,
                gkey,
                is_clear,
                is_store & ~np.isin(what, _NOT_A_BLOCK),
                is_remove & ~np.isin(what, _NOT_AN_EVICTION),
                has_hash,
                (delta_gkey, delta, delta_row, dropped),
            )

    def _shape(
        self,
        df: pl.DataFrame,
        channel: NDArray[Any],
        seq: NDArray[Any],
        group: NDArray[Any],
        no_group: NDArray[Any],
        is_store: NDArray[Any],
        counted: NDArray[Any],
    ) -> kernel.Shape:
        """Each row's batch, event and the event's shape, for the kernel's issue 21 rules.

        A batch is a run of rows of one message (channel, seq and receive time), numbered
        across chunks. A group's block size is its metadata's, else the smallest
        ``len(token_ids) / hashes`` of its multi-hash stores so far (exact for full
        attention; partial entries have one hash). For hit announcements (R6): the
        event's parent and ``origin`` (when the chunk has those columns), the group's
        window, the groups an announcement covers (the channel's metadata's, else those
        of its ``counted`` rows so far) and the channel's previous batch.
        """
        n = len(channel)
        log_time = df["log_time"].to_numpy()
        change = np.zeros(n, dtype=bool)
        change[0] = True
        for values in (channel, seq, log_time):
            _changes(values, change)
        batch = np.cumsum(change) + (self._batches - 1)
        self._batches = int(batch[-1]) + 1
        event = np.asarray(df["event_index"].fill_null(-1).to_numpy(), dtype=_I64)
        ev_change = np.zeros(n, dtype=bool)
        ev_change[0] = True
        _changes(event, ev_change)
        ev_change |= change
        starts = np.flatnonzero(ev_change)
        of = np.cumsum(ev_change) - 1
        lengths = np.diff(np.append(starts, n))
        count = lengths[of]
        last = np.ones(n, dtype=bool)
        last[:-1] = ev_change[1:]
        tokens, _ = _column(df, "tokens")
        tokens = tokens[starts][of]
        kind = df["kind"]
        flags = np.zeros(n, dtype=np.int8)
        flags[(kind == "mamba").fill_null(False).to_numpy()] |= kernel.FLAG_MAMBA
        window = df["sliding_window"].is_not_null() | kind.str.contains("sliding").fill_null(False)
        flags[window.to_numpy()] |= kernel.FLAG_WINDOW
        # Per event (a store's rows share its group; a remove's block size is not read):
        # its (channel, group)'s block size, and whether the channel has a Mamba group.
        ev_key = _pack([channel[starts], group[starts], no_group[starts].astype(_I64)])
        _u, first, inv = np.unique(ev_key, return_index=True, return_inverse=True)
        inv = inv.reshape(-1)
        annotator = getattr(self.group_kind, "__self__", None)
        # A multi-hash store's tokens per hash (else "none").
        none = np.iinfo(np.int64).max
        ev_tokens, ev_count = tokens[starts], lengths
        per_hash = np.where(is_store[starts] & (ev_count >= 2), ev_tokens // ev_count, none)
        ev_bs = np.zeros(len(starts), dtype=_I64)
        ev_mamba = np.zeros(len(starts), dtype=bool)
        order = np.argsort(inv, kind="stable")
        bounds = np.searchsorted(inv[order], np.arange(len(first) + 1))
        for j, r in enumerate(starts[first].tolist()):
            key = (int(channel[r]), int(group[r]), bool(no_group[r]))
            known = self._group_shape.get(key)
            if known is None:
                meta: tuple[int, bool] = (0, False)
                if annotator is not None and hasattr(annotator, "group_shape"):
                    meta = annotator.group_shape(key[0], None if key[2] else key[1])
                known = self._group_shape[key] = meta
            evs = order[bounds[j] : bounds[j + 1]]  # the key's events, in stream order
            size, mamba = known
            if size:
                ev_bs[evs] = size
            else:
                # Learned from the stores before each event (any chunking gives the same).
                run = np.minimum(
                    np.minimum.accumulate(per_hash[evs]), self._learned_bs.get(key, none)
                )
                self._learned_bs[key] = int(run[-1])
                ev_bs[evs] = np.where(run == none, 0, run)
            ev_mamba[evs] = mamba
        bs = ev_bs[of]
        flags[ev_mamba[of]] |= kernel.FLAG_CHANNEL_MAMBA
        flags[kind.is_in(_PREFIX_KINDS).fill_null(False).to_numpy()] |= kernel.FLAG_PREFIX
        if "medium" in df.columns:
            medium = df["medium"]
            tier = ~(medium.is_null() | (medium == "GPU").fill_null(False))
            flags[tier.to_numpy()] |= kernel.FLAG_TIER
        win, _ = _column(df, "sliding_window")
        if "parent" in df.columns:
            parent, parent_null = _column(df, "parent")
            has_parent = ~parent_null if parent_null is not None else np.ones(n, dtype=bool)
        else:
            parent, has_parent = np.zeros(n, dtype=_I64), np.ones(n, dtype=bool)
        if "origin" in df.columns:
            origin = np.asarray(df["origin"].fill_null(0).to_numpy(), dtype=np.int8)
        else:
            origin = np.zeros(n, dtype=np.int8)
        want, pbatch = announce.channel_context(
            channel, batch, group, no_group, counted, self._announce_ctx, annotator
        )
        return kernel.Shape(
            batch, event, tokens, count, last, bs, flags,
            has_parent, parent, origin, win, want, pbatch,
        )  # fmt: skip

    def _kernel_channels(
        self, channel: NDArray[Any], seq: NDArray[Any]
    ) -> tuple[NDArray[Any], NDArray[Any], NDArray[Any]]:
        """Each row's kernel channel, the rows where a restart begins, the channels they end.

        A row whose ``seq`` is below the previous row's of its channel (in this chunk or an
        earlier one; rows of one batch share a seq) begins a restart (PROTOCOL.md: the
        publisher restarted, its cache is new): from it on, the stream gets a new kernel
        channel, so no key, eviction count or live list carries over.
        """
        n = len(channel)
        kchan = np.empty(n, dtype=_I64)
        at_parts: list[NDArray[Any]] = []
        old_parts: list[NDArray[Any]] = []
        present = np.flatnonzero(np.bincount(channel)).tolist()
        for c in present:
            idx = np.arange(n) if len(present) == 1 else np.flatnonzero(channel == c)
            s = seq[idx]
            prev = np.empty_like(s)
            prev[1:] = s[:-1]
            prev[0] = self._last_seq.get(c, s[0])
            self._last_seq[c] = int(s[-1])
            base = self._kchan.get(c)
            if base is None:
                base = self._kchan[c] = len(self._kreal)
                self._kreal.append(c)
            back = s < prev
            if not back.any():
                kchan[idx] = base
                continue
            ids = [base]
            for _ in range(int(back.sum())):
                ids.append(len(self._kreal))
                self._kreal.append(c)
            self._kchan[c] = ids[-1]
            k = np.cumsum(back)
            kchan[idx] = np.asarray(ids, dtype=_I64)[k]
            at_parts.append(idx[back])
            old_parts.append(np.asarray(ids[:-1], dtype=_I64))
        if not at_parts:
            empty = np.zeros(0, dtype=_I64)
            return kchan, empty, empty
        at, old = np.concatenate(at_parts), np.concatenate(old_parts)
        order = np.argsort(at, kind="stable")
        return kchan, at[order], old[order]

    def _step(
        self,
        op: NDArray[Any],
        kchan: NDArray[Any],
        group: NDArray[Any],
        no_group: NDArray[Any],
        hashes: NDArray[Any],
        ts: NDArray[Any],
        gkey: NDArray[Any],
        at: NDArray[Any],
        old: NDArray[Any],
        shape: kernel.Shape | None = None,
    ) -> tuple[kernel.Out, NDArray[Any]]:
        """:func:`kernel.step` on the chunk, each restart preceded by a clear of its old channel.

        Before each restart's row ``at``, a clear of the kernel channel it ends (``old``):
        the old stream's live blocks are dropped as a clear drops them. The output is the
        chunk's rows' (drops at the restart's row), and per drop whether a restart made it.
        """
        size = len(self.registry)
        if len(at) == 0:
            out = kernel.step(
                self.kstate, op, kchan, group, no_group, hashes, ts, gkey, size, shape,
                mode=announce.MODES[self.report_mode],
            )  # fmt: skip
            return out, np.zeros(len(out.drop_row), dtype=bool)
        n, r = len(op), len(at)
        ins = np.insert
        out = kernel.step(
            self.kstate,
            ins(op, at, kernel.CLEAR),
            ins(kchan, at, old),
            ins(group, at, 0),
            ins(no_group, at, False),
            ins(hashes, at, 0),
            ins(ts, at, ts[at]),
            ins(gkey, at, 0),
            size,
            None if shape is None else _inserted(shape, at),
            mode=announce.MODES[self.report_mode],
        )
        rows = np.arange(n) + np.searchsorted(at, np.arange(n), side="right")
        orig = np.empty(n + r, dtype=_I64)
        orig[rows] = np.arange(n)
        orig[at + np.arange(r)] = at
        synthetic = np.zeros(n + r, dtype=bool)
        synthetic[at + np.arange(r)] = True
        return kernel.Out(
            out.what[rows],
            out.ts[rows],
            out.gkey[rows],
            out.distance[rows],
            orig[out.drop_row],
            out.drop_gkey,
            out.drop_n,
            out.drop_keys,
            out.note[rows],
            out.back_blocks[rows],
            out.back_tokens[rows],
            out.back_gkey[rows],
        ), synthetic[out.drop_row]

    def _log_peaks(
        self,
        df: pl.DataFrame,
        delta_row: NDArray[Any],
        delta_gkey: NDArray[Any],
        delta: NDArray[Any],
        rows: dict[int, ReportRow],
    ) -> None:
        """Hand the chunk's deltas, with their batches, to the peak log (partial reports)."""
        assert self.peak_log is not None
        streams = {
            cid: (ref.info.endpoint, ref.info.topic, ref.info.dp_rank)
            # A copy: the reading thread may number a new channel meanwhile.
            for cid, ref in self.streams.copy().items()
        }
        self.peak_log.add(
            df["log_time"].to_numpy()[delta_row],
            df["seq"].to_numpy()[delta_row],
            df["channel_id"].cast(pl.Int64).to_numpy()[delta_row],
            delta_gkey.astype(_I64, copy=False),
            delta,
            streams,
            rows,
        )

    def _live_end(self, size: int) -> NDArray[Any]:
        """Live blocks now per gkey (``size`` of them)."""
        if self.live_end is not None:
            out = np.zeros(size, dtype=_I64)
            for g, n in self.live_end.items():
                out[g] = n
            return out
        out = np.zeros(size, dtype=_I64)
        live = self.kstate.live_gkey[:size]
        out[: len(live)] = live
        return out

    def partial(
        self, stats: ReadStats, annotator: TableAnnotator, inputs: list[int]
    ) -> PartialReport:
        """This builder's state as a partial report (keyed by report row, not gkey).

        Args:
            stats: The read's stats.
            annotator: The annotator used.
            inputs: The recordings' indices in the command line.

        Returns:
            The partial report (:mod:`kvtool.report.partial`).
        """
        if self.by_medium:
            raise ValueError("a builder made with by_medium has no partial report")
        self._merge_distinct()
        log = self.peak_log if self.peak_log is not None else PeakLog()
        counts = {g: tuple(int(v) for v in row) for g, row in enumerate(self.counts.tolist())}
        ends = self._live_end(len(self.registry))
        live_end = {g: int(n) for g, n in enumerate(ends.tolist()) if n}
        return PartialReport(
            inputs=inputs,
            only=None,
            stats=stats,
            streams={
                cid: (ref.info.endpoint, ref.info.topic, ref.info.dp_rank)
                for cid, ref in stats.channels.items()
            },
            # Channels are numbered at their first message, rows or not (as one read
            # numbers them); a batch log's first keys only for a read that kept none.
            first_keys={**log.firsts, **stats.first_keys},
            rows=[(k[0], k[1], k[2]) for k in self.registry],
            counts=counts,
            live_end=live_end,
            distinct=dict(self.distinct),
            lifetimes=self.life.part(),
            copy_bound=self.copy_bound.part(),
            gaps=self.gaps.part(),
            distances=self.distances.frame(),
            negative_lifetimes=self.negative_lifetimes,
            ambiguous_removes=self.ambiguous_removes,
            first_ts=self.first_ts,
            last_ts=self.last_ts,
            first_rx=self.first_rx,
            last_rx=self.last_rx,
            origin_ns=self.origin_ns,
            grouped=set(self.grouped_channels),
            timeline=self.timeline if self.every_ns is not None else None,
            peaks=log,
            out_of_range=dict(annotator.out_of_range),
            restarts={c: (n, d) for c, (n, d) in self.restarts.items()},
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
        stats, channels = merge_stats(parts)
        origins = {p.origin_ns for p in parts if p.origin_ns is not None}
        if every_ns is not None and len(origins) > 1:
            raise NotMergeable("the units' timelines have different origins")
        b = cls(every_ns, group_kind, clock, origins.pop() if origins else None)
        row_ids = [{i: b._gkey_of(*key) for i, key in enumerate(p.rows)} for p in parts]
        b.peaks.levels = merge_peaks(parts, row_ids)
        counts: dict[int, list[int]] = {}
        live_end: dict[int, int] = {}
        distinct: dict[int, list[NDArray[Any]]] = {}
        timelines: list[pl.DataFrame] = []

        for i, (p, ids) in enumerate(zip(parts, row_ids, strict=True)):
            for g, values in p.counts.items():
                acc = counts.setdefault(ids[g], [0] * len(ADDITIVE))
                for k, v in enumerate(values):
                    acc[k] += v
            for g, n in p.live_end.items():
                live_end[ids[g]] = live_end.get(ids[g], 0) + n
            for g, h in p.distinct.items():
                distinct.setdefault(ids[g], []).append(h)
            if p.timeline is not None and p.timeline.height:
                timelines.append(remap(p.timeline, ids))
            b.negative_lifetimes += p.negative_lifetimes
            for c, (n, d) in p.restarts.items():
                acc = b.restarts.setdefault(channels[i].get(c, c), [0, 0])
                acc[0] += n
                acc[1] += d
            b.ambiguous_removes += p.ambiguous_removes
            for ts in (p.first_ts, p.last_ts):
                if ts is not None:
                    b.first_ts = ts if b.first_ts is None else min(b.first_ts, ts)
                    b.last_ts = ts if b.last_ts is None else max(b.last_ts, ts)
            # The first message (rows or not: each channel's first) and the last row.
            rx = [k[0] for k in p.first_keys.values()]
            rx += [t for t in (p.first_rx, p.last_rx) if t is not None]
            if rx:
                b.first_rx = min(rx) if b.first_rx is None else min(b.first_rx, *rx)
                b.last_rx = max(rx) if b.last_rx is None else max(b.last_rx, *rx)
            b.grouped_channels.update(channels[i][c] for c in p.grouped if c in channels[i])
        b.counts = np.zeros((len(b.registry), len(ADDITIVE)), dtype=_I64)
        for g, sums in counts.items():
            b.counts[g] = sums
        b.live_end = live_end
        b.distinct = {g: sorted_union(hs) for g, hs in distinct.items()}
        b.life = Seconds.merge(
            [(p.lifetimes, i) for p, i in zip(parts, row_ids, strict=True)], EXACT_LIFETIMES
        )
        b.copy_bound = CopyBound.merge(
            [(p.copy_bound, i) for p, i in zip(parts, row_ids, strict=True)], EXACT_LIFETIMES
        )
        b.gaps = Seconds.merge(
            [(p.gaps, i) for p, i in zip(parts, row_ids, strict=True)], EXACT_LIFETIMES
        )
        b.distances = Counts.merge([(p.distances, i) for p, i in zip(parts, row_ids, strict=True)])
        if timelines:
            b.timeline = pl.concat(timelines).group_by("bucket", "gkey").agg(*TIMELINE_SUMS)
        return b, stats

    def _attribute(self, df: pl.DataFrame) -> pl.DataFrame:
        """Resolve removes without group_idx on grouped channels (see attribution)."""
        if not attribution.needs_resolution(df, self.grouped_channels):
            return df
        kind_of_gkey = {i: (key[1], key[2]) for key, i in self.registry.items()}
        resolved, ambiguous = attribution.resolve_ungrouped(
            df, self._live_frame(), self.grouped_channels, kind_of_gkey, self.group_kind
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

    def _live_frame(self) -> pl.DataFrame:
        """The live entries (channel_id, group_idx, hash, gkey), a key's oldest first."""
        kchan, group, no_group, h, _ts, gkey = self.kstate.live_entries()
        chan = np.asarray(self._kreal, dtype=_I64)[kchan] if len(kchan) else kchan
        g = pl.Series("group_idx", group, dtype=pl.Int64)
        if no_group.any():
            g = g.scatter(np.flatnonzero(no_group), None)
        return pl.DataFrame(
            {
                "channel_id": pl.Series(chan, dtype=pl.UInt32),
                "group_idx": g,
                "hash": h,
                "gkey": pl.Series(gkey, dtype=pl.UInt32),
            }
        )

    def _add_counts(
        self,
        df: pl.DataFrame,
        gkey: NDArray[Any],
        is_clear: NDArray[Any],
        is_store: NDArray[Any],
        is_remove: NDArray[Any],
        has_hash: NDArray[Any],
        first_block: NDArray[Any],
        unattributed_orphan: NDArray[Any],
        moved: NDArray[Any],
        out: kernel.Out,
    ) -> None:
        """Add the chunk's per-gkey sums of :data:`ADDITIVE` (one ``bincount`` each).

        ``gkey`` already puts the ``moved`` rows (orphan removes without group_idx) on
        the unattributed row.
        """
        size = len(self.registry)
        rows = ~is_clear
        g = gkey[rows]

        def per(mask: NDArray[Any], keys: NDArray[Any] = g) -> NDArray[Any]:
            out: NDArray[Any] = np.bincount(keys[mask], minlength=size)
            return out

        tokens, _ = _column(df, "tokens")
        add = np.zeros((size, len(ADDITIVE)), dtype=_I64)
        st, rm, fb, hh = is_store[rows], is_remove[rows], first_block[rows], has_hash[rows]
        col = {c: i for i, c in enumerate(ADDITIVE)}
        add[:, col["store_events"]] = per(fb & st)
        add[:, col["blocks_stored"]] = per(hh & st)
        what = out.what[rows]
        announced = np.isin(what, _ANNOUNCED)
        tok = tokens[rows]
        real = st & ~announced
        add[:, col["tokens_stored"]] = np.rint(
            np.bincount(g[real], weights=tok[real], minlength=size)
        ).astype(_I64)
        # Hit announcements (R6, R7): no store; their hits, less the lookups repeated.
        add[:, col["hit_announced_blocks"]] = per(announced)
        add[:, col["tokens_announced"]] = np.rint(
            np.bincount(g[announced], weights=tok[announced], minlength=size)
        ).astype(_I64)
        back_at = out.back_blocks[rows] > 0
        back_g = out.back_gkey[rows][back_at]
        add[:, col["failed_lookups"]] = per(back_at[back_at], back_g)
        add[:, col["hit_blocks"]] = add[:, col["hit_announced_blocks"]] - np.bincount(
            back_g, weights=out.back_blocks[rows][back_at], minlength=size
        ).astype(_I64)
        add[:, col["hit_tokens"]] = add[:, col["tokens_announced"]] - np.bincount(
            back_g, weights=out.back_tokens[rows][back_at], minlength=size
        ).astype(_I64)
        add[:, col["remove_events"]] = per(fb & rm)
        add[:, col["blocks_removed"]] = per(hh & rm)
        add[:, col["orphan_removes"]] = per(
            (unattributed_orphan[rows] & hh) | (what == kernel.ORPHAN)
        )
        add[:, col["stored_while_live"]] = per(what == kernel.WHILE_LIVE)
        add[:, col["blocks_recomputed"]] = per(what == kernel.RECOMPUTED)
        # Issue 21: stores and removes that are no block of their own (docs/SEMANTICS.md).
        add[:, col["blocks_stored"]] -= per(st & np.isin(what, _NOT_A_BLOCK))
        add[:, col["blocks_removed"]] -= per(rm & np.isin(what, _NOT_AN_EVICTION))
        for name, code in _CLASS_COLUMNS:
            add[:, col[name]] = per(what == code)
        # The bounds where the wire cannot tell an announcement from a second copy: how
        # many more blocks each could be (the ambiguous runs counted as the other).
        add[:, col["blocks_stored_bound"]] = per(what == kernel.ANNOUNCED_AMBIGUOUS)
        add[:, col["hit_announced_blocks_bound"]] = per(out.note[rows] == announce.NOTE_AMBIGUOUS)
        add[:, col["ambiguous_copy_evictions"]] = per(out.note[rows] == kernel.NOTE_COPY)
        # Keys live at the end, as a sum: +1 per key a store adds, -1 per key a remove takes
        # off (under the report row it was stored under), minus the keys clears drop.
        taken = rm & np.isin(what, _KEY_OUT)
        add[:, col["live_keys"]] = per(st & np.isin(what, _KEY_IN)) - per(
            taken[taken], out.gkey[rows][taken]
        )
        if len(out.drop_gkey):
            add[:, col["blocks_cleared"]] = np.bincount(
                out.drop_gkey, weights=out.drop_n, minlength=size
            ).astype(_I64)
            add[:, col["keys_cleared"]] = np.bincount(
                out.drop_gkey, weights=out.drop_keys, minlength=size
            ).astype(_I64)
            add[:, col["live_keys"]] -= add[:, col["keys_cleared"]]
        if len(self.counts) < size:
            grown = np.zeros((size, len(ADDITIVE)), dtype=_I64)
            grown[: len(self.counts)] = self.counts
            self.counts = grown
        self.counts += add

    def _add_distinct(self, gk: NDArray[Any], h: NDArray[Any]) -> None:
        """Collect the chunk's stored hashes per gkey (merged now and then: amortised)."""
        if len(gk) == 0 or self.max_keys is not None:
            return
        keys = np.flatnonzero(np.bincount(gk))
        for key in keys.tolist():
            part = h if len(keys) == 1 else h[gk == key]
            self._distinct_parts.setdefault(key, []).append(part)
            self._distinct_rows += len(part)
        # Pending rows up to a quarter of the set (not all of it): still linear overall
        # (each merge is a timsort of sorted runs), and at 10x ~20 MB less peak memory.
        if self._distinct_rows > max(1 << 18, self._distinct_size // 4):
            self._merge_distinct()

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
                # One pair at a time: a level's sets (one per group, mostly the same
                # hashes) never all sit in one concatenation and its sorted copy.
                acc = parts[0]
                for part in parts[1:]:
                    acc = sorted_union([acc, part])
                got = len(acc)
            self._distinct_counts[key] = got
        return got

    def _level_distinct(self, members: dict[str, dict[object, list[int]]]) -> dict[str, list[int]]:
        """The distinct hashes of each level key's gkeys, per level, in ``members``' order."""
        self._merge_distinct()
        self._distinct_counts = {}
        return {
            col: [self._n_distinct(ids) for ids in keys.values()] for col, keys in members.items()
        } | {col: [] for col in ("L_total", "L_kind", "L_window", "L_group") if col not in members}

    def _merge_distinct(self) -> None:
        for gkey, parts in self._distinct_parts.items():
            old = self.distinct.get(gkey)
            self.distinct[gkey] = sorted_union([old, *parts] if old is not None else parts)
        self._distinct_parts = {}
        self._distinct_rows = 0
        self._distinct_size = sum(len(s) for s in self.distinct.values())

    def _add_lifetimes(
        self, gk: NDArray[Any], remove_ts: NDArray[Any], store_ts: NDArray[Any]
    ) -> None:
        """Lifetimes of this chunk's FIFO pairs, counted under the remove's report row.

        ts is float seconds since the epoch: the difference is taken at microsecond
        resolution so that float rounding of large timestamps does not show up (rounded
        half to even, scaled back by a multiplication: what polars computes for
        ``(r * 1e6).round() - (s * 1e6).round()) / 1e6``). A clock that steps backwards
        between store and remove gives a negative difference: it is clamped to 0 and
        counted (a finding), never reported as a negative lifetime.
        """
        if len(gk) == 0:
            return
        with np.errstate(invalid="ignore"):
            life = _seconds_between(store_ts, remove_ts)
            finite = np.isfinite(life)
            if not finite.all():  # a ts that is NaN or inf: none
                life, gk = life[finite], gk[finite]
            if len(life) == 0:
                return
            negative = int((life < 0).sum())
        if negative:
            self.negative_lifetimes += negative
            life = np.maximum(life, 0.0)
        self.life.add(gk, life, EXACT_LIFETIMES)

    def _add_timeline(
        self,
        df: pl.DataFrame,
        gkey: NDArray[Any],
        is_clear: NDArray[Any],
        is_store: NDArray[Any],
        is_remove: NDArray[Any],
        has_hash: NDArray[Any],
        deltas: tuple[NDArray[Any], NDArray[Any], NDArray[Any], NDArray[Any]],
    ) -> None:
        """Add per (bucket, gkey): block stores, removes, blocks cleared, live-block deltas.

        ``deltas``: each live-block change's gkey, amount, row, and whether it is a
        clear's drop (:meth:`add`).
        """
        assert self.every_ns is not None and self.origin_ns is not None
        delta_gkey, delta, delta_row, dropped = deltas
        bucket, bucket_null = _column(
            df.select(bucket=bucket_expr(self.clock, self.every_ns, self.origin_ns)), "bucket"
        )
        valid = ~bucket_null if bucket_null is not None else np.ones(len(bucket), dtype=bool)
        blk = has_hash & ~is_clear & valid
        dl = (delta_gkey >= 0) & valid[delta_row]
        b_rows = bucket[blk]
        frame = pl.DataFrame(
            {
                "bucket": np.concatenate([b_rows, bucket[delta_row[dl]]]),
                "gkey": pl.Series(np.concatenate([gkey[blk], delta_gkey[dl]]), dtype=pl.UInt32),
                "stores": np.concatenate([is_store[blk].astype(_I64), np.zeros(dl.sum(), _I64)]),
                "removes": np.concatenate([is_remove[blk].astype(_I64), np.zeros(dl.sum(), _I64)]),
                "cleared": np.concatenate(
                    [np.zeros(len(b_rows), _I64), np.where(dropped[dl], -delta[dl], 0)]
                ),
                "delta": np.concatenate([np.zeros(len(b_rows), _I64), delta[dl]]),
            },
            schema=TIMELINE_SCHEMA,
        )
        # Summed in with the others now and then, not per chunk: one group_by over many
        # chunks' rows costs less than re-aggregating the whole timeline each time.
        self._timeline_parts.append(frame)
        self._timeline_rows += frame.height
        if self._timeline_rows > max(1 << 20, self._timeline.height):
            self._sum_timeline()

    # -- the result ----------------------------------------------------------------------

    def _level_map(self) -> pl.DataFrame:
        return self._registry_frame().with_columns(
            L_kind=pl.col("kind_final"),
            L_window=pl.col("sliding_window"),
            L_group=pl.col("gkey").cast(pl.Int64),
            L_total=pl.lit(0, pl.Int64),
        )

    def tables(self, *, quantiles: bool = True) -> dict[str, pl.DataFrame]:
        """Return totals, by_kind, by_window, by_group as DataFrames.

        Args:
            quantiles: Compute the percentile columns (False: they are null; a reader
                of the samples themselves, ``kvtool serve``, skips their cost).

        Returns:
            The four tables (totals: one row).
        """
        reg = self._level_map()
        size = len(self.registry)
        counts = pl.DataFrame(
            {
                "gkey": pl.Series(np.arange(len(self.counts)), dtype=pl.UInt32),
                **{c: self.counts[:, i] for i, c in enumerate(ADDITIVE)},
                "live_blocks_end": self._live_end(size)[: len(self.counts)],
            }
        )
        base = (
            reg.join(counts, on="gkey", how="left")
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
        levels = reg.select("gkey", *LEVELS)
        members: dict[str, dict[object, list[int]]] = {}
        for _g, k, w, i in reg.select(
            "group_idx", "kind_final", "sliding_window", "gkey"
        ).iter_rows():
            for level, key in (("L_kind", k), ("L_window", w), ("L_group", i), ("L_total", 0)):
                members.setdefault(level, {}).setdefault(key, []).append(i)
        # The distinct hashes (sorts of the stored hashes) are counted in a thread while
        # this one takes the percentiles (partitions): numpy runs both without the GIL,
        # so they share the cores instead of taking turns.
        with ThreadPoolExecutor(1, thread_name_prefix="kvtool-distinct") as pool:
            counted = pool.submit(self._level_distinct, members)
            quants = (
                [
                    self.life.quantiles(levels, members, LIFETIME_COLUMNS, size),
                    self.copy_bound.quantiles(levels, members, size),
                    self.gaps.quantiles(levels, members, GAP_COLUMNS, size),
                    self.distances.quantiles(levels, members, DISTANCE_COLUMNS),
                ]
                if quantiles
                else []
            )
            distinct = counted.result()
        out: dict[str, pl.DataFrame] = {}
        for level, name in (
            ("total", "totals"),
            ("kind", "by_kind"),
            ("window", "by_window"),
            ("group", "by_group"),
        ):
            col = f"L_{level}"
            agg = base.group_by(col, maintain_order=True).agg(
                *[pl.col(c).sum().cast(pl.Int64) for c in (*ADDITIVE, "live_blocks_end")]
            )
            d = pl.DataFrame(
                {col: list(members.get(col, {})), "distinct_hashes": distinct[col]},
                schema={col: agg.schema[col], "distinct_hashes": pl.Int64},
            )
            level_peaks = self.levels[level]
            peaks = pl.DataFrame(
                {col: list(level_peaks), "peak_live_blocks": [v[1] for v in level_peaks.values()]},
                schema={col: agg.schema[col], "peak_live_blocks": pl.Int64},
            )
            t = agg.join(d, on=col, how="left", nulls_equal=True).join(
                peaks, on=col, how="left", nulls_equal=True
            )
            for q in quants:
                t = t.join(q[col], on=col, how="left", nulls_equal=True)
            if not quantiles:
                t = t.with_columns(pl.lit(None, pl.Float64).alias(c) for c in QUANTILE_COLUMNS)
            t = t.with_columns(
                pl.col("distinct_hashes").fill_null(0),
                pl.col("peak_live_blocks").fill_null(0),
                recompute_share=_share("blocks_recomputed", "blocks_stored"),
            )
            if level == "total":
                if t.height == 0:
                    t = empty_row()
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
                more = ["medium"] if self.by_medium else []
                keys = reg.select(col, "group_idx", *more, kind="kind_final", sw="sliding_window")
                out[name] = (
                    t.join(keys, on=col, how="left")
                    .select(
                        "group_idx", "kind", pl.col("sw").alias("sliding_window"), *more, *COLUMNS
                    )
                    # One group may hold rows of several windows (several channels):
                    # the window breaks the tie, so the order never depends on hashing.
                    .sort(["group_idx", "kind", "sliding_window", *more], nulls_last=True)
                )
        return {name: with_aliases(frame) for name, frame in out.items()}

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
        rows = self._level_map().select("gkey", kind="L_kind")
        per_bucket = (
            self.timeline.join(rows, on="gkey", how="left")
            .group_by("bucket", "kind")
            .agg(*TIMELINE_SUMS)
        )
        if span is None:
            span = self.timeline_span()
        frame, self.timeline_sparse = timeline_frame(per_bucket, self.every_ns, span)
        return frame


def _inserted(shape: kernel.Shape, at: NDArray[Any]) -> kernel.Shape:
    """``shape`` with each row ``at`` repeated before itself (a restart's clear's row)."""
    cols: list[Any] = [None if a is None else np.insert(a, at, a[at]) for a in shape]
    return kernel.Shape(*cols)


def _seconds_between(earlier: NDArray[Any], later: NDArray[Any]) -> NDArray[Any]:
    """``later - earlier`` in seconds, taken at microsecond resolution.

    ts is float seconds since the epoch: the difference of the rounded microseconds
    keeps float rounding of large timestamps from showing (rounded half to even, scaled
    back by a multiplication: what polars computes for ``(r * 1e6).round() -
    (s * 1e6).round()) / 1e6``).
    """
    with np.errstate(invalid="ignore"):
        out: NDArray[Any] = (np.rint(later * 1e6) - np.rint(earlier * 1e6)) * 1e-6
    return out


def _share(part: str, whole: str) -> pl.Expr:
    """``part / whole`` rounded to 6 decimals; null where ``whole`` is 0."""
    return (
        pl.when(pl.col(whole) > 0)
        .then((pl.col(part) / pl.col(whole)).round(6))
        .otherwise(pl.lit(None, pl.Float64))
    )


def empty_row() -> pl.DataFrame:
    """The totals of a report of nothing: 0 for every count, no ratio, no percentile."""
    return pl.DataFrame({c: [0] for c in COUNT_COLUMNS}).with_columns(
        *[pl.lit(None, pl.Float64).alias(c) for c in (*RATIO_COLUMNS, *QUANTILE_COLUMNS)]
    )


def with_aliases(frame: pl.DataFrame) -> pl.DataFrame:
    """``frame`` with each deprecated alias (``restored_blocks``) repeating its column last."""
    return frame.with_columns(
        pl.col(target).alias(alias) for alias, target in ALIASES.items() if target in frame.columns
    )


__all__ = [
    "COLUMNS",
    "COUNT_COLUMNS",
    "EXACT_LIFETIMES",
    "LIFETIME_COLUMNS",
    "ReportBuilder",
    "ReportRow",
    "empty_row",
    "with_aliases",
]
