"""Partial reports: a unit of work (a group of recordings) → a partial report, and the exact merge.

DESIGN.md "Scale": the report's work is a map (a file, rank or chunk range → a partial
report) and an exact merge. Here the unit is a group of recordings whose publisher
streams (endpoint, topic, rank) no other group holds -- a fleet's engines, each recorded
to its own file, are one unit each; files that share a stream (one recording split in
two) are one unit, read in THE merge order. The live-block state is keyed by channel, so
units share no state, and every part of a report merges exactly:

- counts, live blocks at the end, stores while live, recomputes, orphans and clears add;
- distinct hashes are the sorted union of each unit's sorted sets, per report row;
- lifetimes and recompute gaps are kept exactly while there are at most
  :data:`~kvtool.report.aggregates.EXACT_LIFETIMES` of them in all (quantiles are then
  exact, as in one process), else the units' values and histograms add into the same log
  histogram one process would have built (:class:`~kvtool.report.samples.Seconds`);
- recompute distances are counts per (row, value), which add
  (:class:`~kvtool.report.samples.Counts`);
- the timeline's (bucket, row) sums add: every unit buckets from the driver's origin (the
  input's first message, :mod:`kvtool.report.timeline`), so the buckets are the same;
- peaks need the streams' interleaving: each unit logs, per batch and level key (kind,
  window, group, total), the batch's net change of live blocks and the highest point
  inside it (:class:`PeakLog`); the merge orders every unit's batches as THE merge order
  does -- receive time, endpoint, topic, seq -- and takes the running maximum. That is
  the order one process reads them in when each recording is in that order itself (a
  recorder writes in receive order); a unit whose recordings are not, or two units with
  a batch at the very same (time, endpoint, topic, seq), make the merge decline
  (:class:`NotMergeable`) and the caller reads everything in one ordered pass instead.

The map (:func:`kvtool.report.run.report_unit`) is a plain function of picklable
arguments: the local process pool (``--jobs``) and Ray (``--ray``) run the same one,
and the driver merges (:meth:`kvtool.report.builder.ReportBuilder.from_partials`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

import polars as pl

from kvtool.annotate import Annotation
from kvtool.columns import NO_KEY, ChannelRef, MergeKey, ReadStats, np
from kvtool.protocol import count_unknown_tags
from kvtool.recording import open_recording
from kvtool.report.samples import SecondsPart
from kvtool.report.source import Finding

RowKey = tuple[int | None, str, int | None]
"""(group_idx, kind, sliding_window): one report row, the same in every unit."""

LevelKey = tuple[str, object]
"""A level of the peaks: ("kind", kind), ("window", window), ("group", RowKey), ("total", 0)."""

StreamKey = tuple[str, str, int | None]
"""A publisher stream: (endpoint, topic, rank)."""


class NotMergeable(Exception):
    """The units' partial reports cannot be merged exactly (read in one pass instead)."""


# -- planning ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Unit:
    """One unit of work: some recordings, and maybe only some of their streams.

    Attributes:
        inputs: Indices of its recordings in the command line, in that order.
        streams: Its streams, when the unit is part of one recording's streams (a
            recorder that subscribed to every rank writes them all to one file); None
            for every stream of its recordings.
    """

    inputs: tuple[int, ...]
    streams: frozenset[StreamKey] | None = None


def plan_units(paths: Sequence[str | os.PathLike[str]], split: int = 1) -> list[Unit]:
    """Group the inputs into units that share no publisher stream.

    The streams of a complete recording are listed in its summary (read without
    scanning); an input without one (cut short, damaged) puts every input in one unit.
    A unit that is a single recording of several streams is split into up to ``split``
    units of whole streams (each reads the file and keeps its own streams).

    Args:
        paths: The recordings, in command-line order.
        split: How many units one recording may become (the workers there are).

    Returns:
        The units, ordered by their first input; one unit holding every input when they
        cannot be split.

    Raises:
        RecordingError: A recording cannot be opened.
    """
    everything = [Unit(tuple(range(len(paths))))]
    streams: list[list[StreamKey]] = []
    for p in paths:
        with open_recording(p) as r:
            chans = r.summary_channels()
            if not chans:
                return everything
            listed = {(c.endpoint, c.topic, c.dp_rank): None for c in chans}
            streams.append(list(listed))
    parent = list(range(len(paths)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    owner: dict[StreamKey, int] = {}
    for i, keys in enumerate(streams):
        for k in keys:
            j = owner.setdefault(k, i)
            a, b = root(i), root(j)
            if a != b:
                parent[max(a, b)] = min(a, b)
    groups: dict[int, list[int]] = {}
    for i in range(len(paths)):
        groups.setdefault(root(i), []).append(i)
    units: list[Unit] = []
    for group in sorted(groups.values(), key=lambda g: g[0]):
        own = streams[group[0]]
        if len(group) == 1 and len(own) > 1 and split > 1:
            n = min(split, len(own))
            for part in range(n):
                units.append(Unit((group[0],), frozenset(own[part::n])))
        else:
            units.append(Unit(tuple(group)))
    return units


# -- the peak log ---------------------------------------------------------------------------


@dataclass
class PeakLog:
    """Per batch and level key: the net change of live blocks and the highest point inside.

    Fed by the :class:`~kvtool.report.builder.ReportBuilder` of one unit, chunk by chunk,
    with each chunk's live-block deltas in stream order. A batch is identified by its
    (receive time, endpoint, topic, seq); only batches that change a level are logged.

    Attributes:
        levels: The level keys logged, by their number in :meth:`frame`.
        ordered: False once a batch came before the one read ahead of it in THE merge
            order's key (receive time, endpoint, topic, seq).
        firsts: channel id → the merge-order key of its first batch with rows.
    """

    levels: list[LevelKey] = field(default_factory=list)
    ordered: bool = True
    firsts: dict[int, MergeKey] = field(default_factory=dict)
    _ids: dict[LevelKey, int] = field(default_factory=dict)
    _parts: list[pl.DataFrame] = field(default_factory=list)
    _last: MergeKey | None = None

    def add(
        self,
        log_time: Any,
        seq: Any,
        channel: Any,
        gkey: Any,
        delta: Any,
        streams: dict[int, StreamKey],
        rows: dict[int, RowKey],
    ) -> None:
        """Log one chunk's deltas.

        Args:
            log_time: Receive time (ns) of each delta's batch (numpy int64, stream order).
            seq: Seq of each delta's batch (numpy int64).
            channel: Channel id of each delta's batch (numpy int64).
            gkey: Report row of each delta (numpy int64, -1 for none).
            delta: The live-block change (numpy int64).
            streams: channel id → its stream (endpoint, topic, rank).
            rows: gkey → report row.
        """
        n = len(delta)
        if n == 0:
            return
        new = np.empty(n, dtype=bool)
        new[0] = True
        np.not_equal(log_time[1:], log_time[:-1], out=new[1:])
        new[1:] |= seq[1:] != seq[:-1]
        new[1:] |= channel[1:] != channel[:-1]
        starts = np.flatnonzero(new)
        ends = np.append(starts[1:], n) - 1
        b_time, b_seq = log_time[starts], seq[starts]
        b_ep = [streams[c][0] for c in channel[starts].tolist()]
        b_tp = [streams[c][1] for c in channel[starts].tolist()]
        self._check_order(b_time.tolist(), b_ep, b_tp, b_seq.tolist())
        for c, t, e, tp, q in zip(
            channel[starts].tolist(), b_time.tolist(), b_ep, b_tp, b_seq.tolist(), strict=True
        ):
            if c not in self.firsts:
                self.firsts[c] = (t, e, tp, q)
        members: dict[LevelKey, list[int]] = {}
        for g in np.unique(gkey[gkey >= 0]).tolist():
            row = rows[g]
            levels: tuple[LevelKey, ...] = (
                ("kind", row[1]),
                ("window", row[2]),
                ("group", row),
                ("total", 0),
            )
            for level in levels:
                members.setdefault(level, []).append(g)
        frames = []
        for level, ids in members.items():
            d = np.where(np.isin(gkey, ids), delta, 0)
            cs = np.cumsum(d)
            before = cs[starts] - d[starts]
            net = cs[ends] - before
            high = np.maximum.reduceat(cs, starts) - before
            keep = np.flatnonzero((net != 0) | (high > 0))
            if len(keep) == 0:
                continue
            lid = self._ids.get(level)
            if lid is None:
                lid = self._ids[level] = len(self.levels)
                self.levels.append(level)
            frames.append(
                pl.DataFrame(
                    {
                        "level": np.full(len(keep), lid, dtype=np.int64),
                        "log_time": b_time[keep],
                        "endpoint": [b_ep[i] for i in keep.tolist()],
                        "topic": [b_tp[i] for i in keep.tolist()],
                        "seq": b_seq[keep],
                        "net": net[keep],
                        "high": high[keep],
                    },
                    schema=PEAK_SCHEMA,
                )
            )
        if frames:
            self._parts.append(pl.concat(frames))

    def _check_order(self, t: list[int], ep: list[str], tp: list[str], seq: list[int]) -> None:
        keys = list(zip(t, ep, tp, seq, strict=True))
        if self._last is not None:
            keys.insert(0, self._last)
        if self.ordered:
            for a, b in pairwise(keys):
                if b < a:
                    self.ordered = False
                    break
        self._last = keys[-1]

    def frame(self) -> pl.DataFrame:
        """Every logged (batch, level) entry (:data:`PEAK_SCHEMA`), in stream order."""
        if not self._parts:
            return pl.DataFrame(schema=PEAK_SCHEMA)
        return pl.concat(self._parts)


PEAK_SCHEMA: dict[str, pl.DataType] = {
    "level": pl.Int64(),
    "log_time": pl.Int64(),
    "endpoint": pl.String(),
    "topic": pl.String(),
    "seq": pl.Int64(),
    "net": pl.Int64(),
    "high": pl.Int64(),
}
"""One logged (batch, level) entry: the batch's merge-order key, its net change of the
level's live blocks and the highest the level went inside it (both relative to the level
before the batch)."""


# -- the partial report -----------------------------------------------------------------------


@dataclass
class PartialReport:
    """What one unit's report is made of, keyed by values that mean the same in every unit.

    Attributes:
        inputs: The unit's inputs (indices in the command line).
        only: The streams it was limited to (a unit of one recording's streams), or None.
        stats: The unit's read statistics (channel ids are the unit's own).
        streams: channel id → (endpoint, topic, rank), for the unit's channels.
        first_keys: channel id → THE merge order's key of the channel's first batch.
        rows: The report rows, in the order the unit met them.
        counts: Additive counts per row (``rows`` index → the :data:`ADDITIVE` values).
        live_end: Live blocks at the end per row index.
        distinct: Sorted distinct stored hashes per row index (numpy int64).
        lifetimes: The lifetimes (:data:`~kvtool.report.samples.SecondsPart`).
        gaps: The recompute gaps (likewise).
        distances: The recompute distances (:data:`~kvtool.report.samples.COUNTS_SCHEMA`).
        negative_lifetimes: Lifetimes clamped at 0.
        ambiguous_removes: Removes without group_idx that could not be attributed.
        first_ts: Earliest plausible batch ts.
        last_ts: Latest plausible batch ts.
        first_rx: Earliest receive time (``log_time``, ns) of a row.
        last_rx: Latest receive time of a row.
        origin_ns: The timeline's time zero (the driver's, :class:`UnitTask`).
        grouped: The channels whose stores carried group_idx.
        timeline: Per (bucket, row) stores, removes, blocks cleared and live-block change,
            or None.
        peaks: The unit's :class:`PeakLog`.
        out_of_range: Stores per group index not in a given metadata table.
        restarts: Per channel, (publisher restarts, live blocks they dropped) (issue 23).
        copy_bound: Lifetimes under the two extreme copy rules
            (:data:`kvtool.report.lifebound.CopyBoundPart`; None: none kept).
    """

    inputs: list[int]
    only: frozenset[StreamKey] | None
    stats: ReadStats
    streams: dict[int, StreamKey]
    first_keys: dict[int, MergeKey]
    rows: list[RowKey]
    counts: dict[int, tuple[int, ...]]
    live_end: dict[int, int]
    distinct: dict[int, Any]
    lifetimes: SecondsPart
    gaps: SecondsPart
    distances: pl.DataFrame
    negative_lifetimes: int
    ambiguous_removes: int
    first_ts: float | None
    last_ts: float | None
    first_rx: int | None
    last_rx: int | None
    origin_ns: int | None
    grouped: set[int]
    timeline: pl.DataFrame | None
    peaks: PeakLog
    out_of_range: dict[int, int]
    restarts: dict[int, tuple[int, int]] = field(default_factory=dict)
    copy_bound: Any = None


@dataclass
class UnitTask:
    """One unit of work: its recordings and what every unit shares.

    Attributes:
        paths: The unit's recordings, in command-line order, as this worker opens them.
        names: The same recordings as the command line names them (for the report).
        inputs: Their indices in the command line.
        streams: Only these streams of the recordings (None: all).
        annotation: THE annotation of the whole input (resolved once by the driver).
        every_ns: Timeline bucket (ns), or None.
        clock: The timeline's clock.
        chunk_bytes: Payload bytes per chunk.
        origin_ns: The timeline's time zero for the whole input
            (:func:`kvtool.report.timeline.input_origin`): every unit buckets on one grid.
        report_mode: ``--report-mode`` (hit announcements, issue 21).
        lifetime_bounds: ``--lifetime-bounds`` (R8's bound, issue 21).
    """

    paths: list[str]
    names: list[str]
    inputs: list[int]
    streams: frozenset[StreamKey] | None
    annotation: Annotation
    every_ns: int | None
    clock: str
    chunk_bytes: int
    origin_ns: int | None = None
    report_mode: str = "auto"
    lifetime_bounds: bool = False


# -- the merge --------------------------------------------------------------------------------


def merge_stats(parts: Sequence[PartialReport]) -> tuple[ReadStats, list[dict[int, int]]]:
    """Merge the units' read statistics; channels numbered in THE merge order.

    Args:
        parts: The partial reports, in unit order.

    Returns:
        The merged stats, and per part its channel id → the merged channel id.

    Raises:
        NotMergeable: Two units hold the same stream.
    """
    covered: dict[int, set[StreamKey]] = {}
    for p in parts:
        if p.only is not None:
            covered.setdefault(p.inputs[0], set()).update(p.only)
    for p in parts:
        if p.only is not None:
            if p.stats.unordered:
                raise NotMergeable("a recording is not in receive-time order")
            if not p.stats.streams_seen <= covered[p.inputs[0]]:
                raise NotMergeable("a recording holds a stream its summary does not list")
    owners: dict[StreamKey, int] = {}
    firsts = []
    for i, p in enumerate(parts):
        for cid, key in p.streams.items():
            if owners.setdefault(key, i) != i:
                raise NotMergeable(f"stream {key} is in two units")
            firsts.append((p.first_keys.get(cid, NO_KEY), i, cid))
    firsts.sort()
    maps: list[dict[int, int]] = [{} for _ in parts]
    st = ReadStats()
    for gid, (_key, i, cid) in enumerate(firsts):
        maps[i][cid] = gid
        ref = parts[i].stats.channels[cid]
        st.channels[gid] = ChannelRef(gid, ref.recording, ref.info)
    by_input: dict[int, str] = {}
    damaged: dict[tuple[str, str], Finding] = {}
    lost: dict[tuple[str, str], Finding] = {}
    for i, p in enumerate(parts):
        s = p.stats
        for (cid, rank), n in s.payload_ranks.items():  # one rank: the channel's (issue 24)
            merged = (maps[i].get(cid, cid), rank)
            st.payload_ranks[merged] = st.payload_ranks.get(merged, 0) + n
        by_input.update(zip(p.inputs, s.recordings, strict=True))
        # Units that split one recording's streams each saw its damage and ledger.
        damaged.update(((f.path or "", f.text), f) for f in s.damaged)
        lost.update(((f.path or "", f.text), f) for f in s.lost)
        st.messages += s.messages
        st.events += s.events
        st.rows += s.rows
        st.payload_bytes += s.payload_bytes
        st.bad_batches += s.bad_batches
        st.skipped_events += s.skipped_events
        st.origin_rows += s.origin_rows
        count_unknown_tags(st.unknown_tags, s.unknown_tags.items())
        st.unselected += s.unselected
        for text, at in zip(s.problems, s.problem_keys, strict=True):
            st.note(text, at)  # the earliest of every unit's, in THE merge order
        st.groups.update(s.groups)
        st.merge.duplicates += s.merge.duplicates
        st.merge.differing += s.merge.differing
        for text in s.merge.examples:
            st.merge._note(text)
    st.recordings = [by_input[i] for i in sorted(by_input)]
    order = {path: n for n, path in enumerate(st.recordings)}

    def in_input_order(found: dict[tuple[str, str], Finding]) -> list[Finding]:
        return [f for _k, f in sorted(found.items(), key=lambda kf: order.get(kf[0][0], 0))]

    st.damaged = in_input_order(damaged)
    st.lost = in_input_order(lost)
    return st, maps


def merge_peaks(
    parts: Sequence[PartialReport], row_ids: list[dict[int, int]]
) -> dict[str, dict[object, tuple[int, int]]]:
    """Merge the units' peak logs in THE merge order: (live at the end, peak) per level key.

    Args:
        parts: The partial reports.
        row_ids: Per part, its row index → the merged report row (gkey).

    Returns:
        ``kind``/``window``/``group``/``total`` → key → (live at the end, peak).

    Raises:
        NotMergeable: A unit's recordings are not in THE merge order, or two units have a
            batch with the same key.
    """
    levels: dict[LevelKey, int] = {}
    frames = []
    for i, p in enumerate(parts):
        if not p.peaks.ordered:
            raise NotMergeable("a recording is not in receive-time order")
        local = []
        for level, key in p.peaks.levels:
            if level == "group":
                key = row_ids[i][p.rows.index(key)]  # type: ignore[arg-type]
            local.append(levels.setdefault((level, key), len(levels)))
        f = p.peaks.frame()
        if f.height:
            frames.append(
                f.with_columns(
                    level=pl.col("level").replace_strict(
                        list(range(len(local))), local, return_dtype=pl.Int64
                    ),
                    unit=pl.lit(i, pl.Int64),
                )
            )
    out: dict[str, dict[object, tuple[int, int]]] = {
        "kind": {},
        "window": {},
        "group": {},
        "total": {},
    }
    if not frames:
        return out
    keys = ["log_time", "endpoint", "topic", "seq"]
    allf = pl.concat(frames).sort(keys, maintain_order=True)
    clash = (
        allf.select(*keys, "unit")
        .unique()
        .group_by(keys)
        .agg(pl.len())
        .filter(pl.col("len") > 1)
        .height
    )
    if clash:
        raise NotMergeable("two units hold a batch with the same time, stream and seq")
    per_level = allf.group_by("level").agg(
        end=pl.col("net").sum(),
        peak=(pl.col("net").cum_sum() - pl.col("net") + pl.col("high")).max(),
    )
    names = {v: k for k, v in levels.items()}
    for lid, end, peak in per_level.iter_rows():
        level, key = names[lid]
        out[level][key] = (int(end), max(0, int(peak)))
    return out
