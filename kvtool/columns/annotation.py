"""The columnar adapter of :mod:`kvtool.annotate`: kinds and windows for table chunks.

The annotation of the whole input is resolved first
(:func:`kvtool.inputs.resolve_annotation`: metadata sources by precedence, else what
annotated stores say per (channel, data-parallel rank, group_idx)), then applied to each
chunk independently (:func:`annotate_table`, :class:`TableAnnotator`), so the answer does
not depend on chunk order.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import polars as pl

try:  # optional: numpy makes the byte-level parsing of hashes and token counts faster
    import numpy as np
except ImportError:  # pragma: no cover - exercised by tests that hide numpy
    np = None  # type: ignore[assignment]

from kvtool.annotate import Annotation, GroupLearner, GroupTable, KindWindow
from kvtool.columns.base import CLEARED, STORED, ChannelRef, ReadStats
from kvtool.inputs import resolve_annotation
from kvtool.recording import open_recording

_ANNOTATE_INPUT = (
    "channel_id",
    "dp_rank",
    "type_code",
    "group_idx",
    "kind",
    "sliding_window",
    "block_index",
)
"""The columns :func:`annotate_table` reads."""


# -- annotation ------------------------------------------------------------------------------

# The columnar adapter of kvtool.annotate: metadata and learned annotations are small
# frames joined on the real composite keys -- (channel_id, group_idx) for metadata,
# (channel_id, dp_rank, group_idx) for learned values -- never on a packed integer.
_META_SCHEMA = {
    "channel_id": pl.UInt32,
    "group_idx": pl.Int64,
    "m_kind": pl.String,
    "m_window": pl.Int64,
}
_LEARNED_SCHEMA = {
    "channel_id": pl.UInt32,
    "_rank": pl.Int64,
    "group_idx": pl.Int64,
    "l_kind": pl.String,
    "l_window": pl.Int64,
}
_NO_RANK = -1  # join key for a null dp_rank (ranks are >= 0)
_UNSET: Any = object()


def annotate_table(
    df: pl.DataFrame,
    annotation: Annotation,
    channels: dict[int, ChannelRef],
    out_of_range: dict[int, int] | None = None,
) -> pl.DataFrame:
    """Apply THE annotation to a table chunk (pure; any chunk, any order, any process).

    Stores and removes whose channel has metadata and whose ``group_idx`` is in it take
    the metadata's kind and window (vLLM's ``take_events`` rule; removes carry no kind,
    so they take their group's). On channels without metadata, rows whose kind is null
    (unannotated stores, removes) take their (channel, rank, group)'s learned value;
    stores that carry a kind keep it. ``AllBlocksCleared`` rows are never touched; removes
    without ``group_idx`` are left for the report's hash state.

    Args:
        df: A chunk of :func:`iter_tables` (needs ``channel_id``, ``dp_rank``,
            ``group_idx``, ``type_code``, ``kind``, ``sliding_window``, ``block_index``).
        annotation: The resolved annotation (:func:`kvtool.inputs.resolve_annotation`).
        channels: The read's channels by ``channel_id`` (:attr:`ReadStats.channels`).
        out_of_range: Receives stores per group index not in their metadata.

    Returns:
        The chunk, same columns and dtypes, ``kind``/``sliding_window`` set where known.
    """
    if df.height == 0:
        return df
    df = _annotate_ungrouped(df, annotation, channels)
    meta_rows, learned_rows, covered = _annotation_rows(annotation, channels)
    if not covered and not learned_rows:
        return df
    out = None
    if np is not None:
        out = _annotate_dense(df, meta_rows, learned_rows, covered, channels, out_of_range)
    if out is None:
        out = _annotate_join(df, meta_rows, learned_rows, covered, channels, out_of_range)
    return out


def _annotate_ungrouped(
    df: pl.DataFrame, annotation: Annotation, channels: dict[int, ChannelRef]
) -> pl.DataFrame:
    """Rows without ``group_idx`` (not clears) take ``--group-meta none=KIND`` (issue 21).

    The other passes match rows on their ``group_idx`` only, so they leave these alone.
    """
    given = {
        cid: kw
        for cid, ref in channels.items()
        if (kw := annotation.ungrouped_for(ref.info.name)) is not None
    }
    if not given or not df["group_idx"].null_count():
        return df
    ids = list(given)
    keys = pl.DataFrame(
        {
            "channel_id": ids,
            "_u_kind": [given[c][0] for c in ids],
            "_u_window": [given[c][1] for c in ids],
        },
        schema={"channel_id": df.schema["channel_id"], "_u_kind": pl.String, "_u_window": pl.Int64},
    )
    hit = (
        pl.col("group_idx").is_null()
        & (pl.col("type_code") != CLEARED)
        & pl.col("_u_kind").is_not_null()
    )
    return (
        df.join(keys, on="channel_id", how="left", maintain_order="left")
        .with_columns(
            kind=pl.when(hit)
            .then(pl.col("_u_kind"))
            .otherwise(pl.col("kind"))
            .cast(df.schema["kind"]),
            sliding_window=pl.when(hit)
            .then(pl.col("_u_window"))
            .otherwise(pl.col("sliding_window"))
            .cast(df.schema["sliding_window"]),
        )
        .drop("_u_kind", "_u_window")
    )


_MetaRow = tuple[int, int, "str | None", "int | None"]
_LearnedRow = tuple[int, int, int, "str | None", "int | None"]
_DENSE_CELLS = 1 << 20  # largest lookup table (channel x rank x group cells) of the fast path


def _annotation_rows(
    annotation: Annotation, channels: dict[int, ChannelRef]
) -> tuple[list[_MetaRow], list[_LearnedRow], list[int]]:
    """The annotation as rows keyed by channel id: metadata, learned values, covered ids."""
    meta_rows: list[_MetaRow] = []
    learned_rows: list[_LearnedRow] = []
    covered: list[int] = []
    by_channel: dict[str, list[tuple[int | None, int, KindWindow]]] = {}
    for (ch, rank, g), kw in annotation.learned.items():
        by_channel.setdefault(ch, []).append((rank, g, kw))
    for cid, ref in channels.items():
        table = annotation.table_for(ref.info.name)
        if table is not None:
            covered.append(cid)
            for info in table.groups.values():
                meta_rows.append((cid, info.group_idx, info.kind, info.sliding_window))
            continue
        for rank, g, (k, w) in by_channel.get(ref.info.name, ()):
            learned_rows.append((cid, _NO_RANK if rank is None else rank, g, k, w))
    return meta_rows, learned_rows, covered


def _annotate_dense(
    df: pl.DataFrame,
    meta_rows: list[_MetaRow],
    learned_rows: list[_LearnedRow],
    covered: list[int],
    channels: dict[int, ChannelRef],
    out_of_range: dict[int, int] | None,
) -> pl.DataFrame | None:
    """:func:`annotate_table` by numpy lookup tables indexed by (channel, rank, group).

    The keys of the annotation span few channels, ranks and groups, so a dense table over
    their ranges answers every row by one gather, where a join would hash every row.
    Rows whose channel, rank or group falls outside the keys' ranges match nothing, which
    keeps odd values (negative, huge, null) exact. Returns None when the keys' ranges are
    too wide (or a key repeats), leaving the chunk to :func:`_annotate_join`.
    """
    cid_s, g_s = df["channel_id"], df["group_idx"]
    if cid_s.null_count():
        return None
    cid = cid_s.to_numpy()
    has_g: Any = True
    if g_s.null_count():
        has_g = g_s.is_not_null().to_numpy()
        g_s = g_s.fill_null(0)
    g = g_s.to_numpy()
    tc = df["type_code"].to_numpy()
    not_cleared: Any = True if int(tc.max()) < CLEARED else tc != CLEARED
    kinds: list[pl.Series] = []
    windows: list[pl.Series] = []
    base = 0
    parts: list[tuple[Any, Any]] = []  # per table: (row -> cell, rows it sets)
    oor_counts: pl.DataFrame | None = None
    if covered:
        found = _dense_lookup(
            [(c, gi) for c, gi, _k, _w in meta_rows],
            [(k, w) for _c, _g, k, w in meta_rows],
            [cid, g],
            has_g,
        )
        if found is None:
            return None
        pos, known, cell_kind, cell_window = found
        if out_of_range is not None and known is not True:
            is_cov = np.zeros(int(cid.max()) + 1, dtype=bool)
            is_cov[[c for c in covered if c < len(is_cov)]] = True
            oor = (tc == STORED) & has_g & ~known & is_cov[cid]
            oor &= df["block_index"].to_numpy() == 0
            if oor.any():  # counted once the learned part cannot decline any more
                oor_counts = df["group_idx"].filter(pl.Series(oor)).value_counts()
        parts.append((pos, known & not_cleared))
        kinds.append(cell_kind)
        windows.append(cell_window)
        base = len(cell_kind)
    if learned_rows:
        ranks = np.zeros(int(cid.max()) + 1, dtype=np.int64)
        has_rank = np.zeros(len(ranks), dtype=bool)
        for c, ref in channels.items():
            if ref.info.dp_rank is not None and c < len(ranks):
                ranks[c] = ref.info.dp_rank
                has_rank[c] = True
        row_has = has_rank[cid]
        rank = ranks[cid]
        if not row_has.all():
            rank = np.where(row_has, rank, df["dp_rank"].fill_null(_NO_RANK).to_numpy())
        found = _dense_lookup(
            [(c, r, gi) for c, r, gi, _k, _w in learned_rows],
            [(k, w) for _c, _r, _g, k, w in learned_rows],
            [cid, rank, g],
            has_g,
        )
        if found is None:
            return None
        pos, known, cell_kind, cell_window = found
        nulls = df["kind"].null_count()
        if nulls != df.height:
            known = known & (df["kind"].is_null().to_numpy() if nulls else False)
        parts.append((pos + base if base else pos, known & not_cleared))
        kinds.append(cell_kind)
        windows.append(cell_window)
    if out_of_range is not None and oor_counts is not None:
        for gi, cnt in oor_counts.iter_rows():
            out_of_range[gi] = out_of_range.get(gi, 0) + cnt
    if not parts:
        return df
    if len(parts) == 1:
        pos, upd = parts[0]
    else:  # learned channels are never covered: the two never set one row
        (pos_m, upd_m), (pos_l, upd_l) = parts
        upd_l = np.broadcast_to(upd_l, cid.shape)
        pos = np.where(upd_l, pos_l, pos_m)
        upd = upd_m | upd_l
    if upd is False or (upd is not True and not upd.any()):
        return df
    if upd is not True and not upd.all():
        # Rows that keep their values gather them from behind the cells: one gather is
        # cheaper than a zip_with over every string.
        n_cells = sum(len(k) for k in kinds)
        pos = np.where(upd, pos, np.arange(n_cells, n_cells + len(upd)))
        kinds.append(df["kind"])
        windows.append(df["sliding_window"])
    cells = pl.DataFrame(
        [pl.concat(kinds).alias("kind"), pl.concat(windows).alias("sliding_window")]
    )
    return df.with_columns(cells[pl.Series(pos.astype(np.uint32))])  # a u32 row gather: fastest


def _dense_lookup(
    keys: list[tuple[int, ...]],
    vals: list[tuple[str | None, int | None]],
    cols: list[Any],
    has_g: Any,
) -> tuple[Any, Any, pl.Series, pl.Series] | None:
    """Each row's cell in a dense table over the keys' ranges, and whether it holds a value.

    Args:
        keys: The table's keys (channel, [rank,] group).
        vals: Their (kind, window).
        cols: The rows' key components (numpy arrays; the last one is the group).
        has_g: Rows whose group is not null (True: all).

    Returns:
        (row → cell as int64 array, rows whose cell holds a value (True: all), cells'
        kinds, cells' windows), or None when the table would be too large or a key repeats.
    """
    dims = len(cols)
    if not keys:
        lo, spans = [0] * dims, [1] * dims
    else:
        lo = [min(k[i] for k in keys) for i in range(dims)]
        spans = [max(k[i] for k in keys) - lo[i] + 1 for i in range(dims)]
    cells = 1
    for sp in spans:
        cells *= sp
    if cells > _DENSE_CELLS:
        return None
    tbl = np.full(cells, -1, dtype=np.int64)
    for n, key in enumerate(keys):
        pos = 0
        for i in range(dims):
            pos = pos * spans[i] + (key[i] - lo[i])
        if tbl[pos] != -1:
            return None  # a repeated key: the join's duplicate rows decide
        tbl[pos] = n
    filled = tbl >= 0
    vk = [vals[i][0] if i >= 0 else None for i in tbl.tolist()] if cells <= 4096 else None
    if vk is None:
        codes = pl.Series(np.where(filled, tbl, 0))
        cell_kind = pl.Series([k for k, _w in vals], dtype=pl.String).gather(codes)
        cell_window = pl.Series([w for _k, w in vals], dtype=pl.Int64).gather(codes)
    else:
        cell_kind = pl.Series(vk, dtype=pl.String)
        cell_window = pl.Series(
            [vals[i][1] if i >= 0 else None for i in tbl.tolist()], dtype=pl.Int64
        )
    filled &= cell_kind.is_not_null().to_numpy()  # a null kind sets nothing
    in_bounds = has_g is True and bool(keys)
    if in_bounds:
        for i in range(dims):
            if int(cols[i].min()) < lo[i] or int(cols[i].max()) > lo[i] + spans[i] - 1:
                in_bounds = False
                break
    pos_rows: Any = None
    ok: Any = True
    for i in range(dims):
        col = cols[i]
        if spans[i] == 1 and in_bounds:
            continue  # one value: adds nothing to the cell
        if not in_bounds:  # the bounds are keys, so int64 even for extreme groups
            hi = lo[i] + spans[i] - 1
            ok = ok & (col >= lo[i]) & (col <= hi)
            col = np.clip(col, lo[i], hi)
        part = col - lo[i] if lo[i] else col
        pos_rows = part if pos_rows is None else pos_rows * spans[i] + part
    if pos_rows is None:
        pos_rows = np.zeros(len(cols[0]), dtype=np.int64)
    pos_rows = pos_rows.astype(np.int64, copy=False)
    if in_bounds and filled.all():
        return pos_rows, True, cell_kind, cell_window
    known = filled[pos_rows]
    if ok is not True:
        known &= ok & has_g
    elif has_g is not True:
        known &= has_g
    return pos_rows, known, cell_kind, cell_window


def _annotate_join(
    df: pl.DataFrame,
    meta_rows: list[_MetaRow],
    learned_rows: list[_LearnedRow],
    covered: list[int],
    channels: dict[int, ChannelRef],
    out_of_range: dict[int, int] | None,
) -> pl.DataFrame:
    """:func:`annotate_table` by left joins on the composite keys (any key values)."""
    is_store = pl.col("type_code") == STORED
    if covered:
        meta = pl.DataFrame(meta_rows, schema=_META_SCHEMA, orient="row", strict=False)
        df = df.join(meta, on=["channel_id", "group_idx"], how="left", maintain_order="left")
        in_meta = pl.col("m_kind").is_not_null() & (pl.col("type_code") != CLEARED)
        if out_of_range is not None:
            oor = df.filter(
                is_store
                & pl.col("group_idx").is_not_null()
                & pl.col("m_kind").is_null()
                & pl.col("channel_id").is_in(covered)
                & (pl.col("block_index") == 0)
            )["group_idx"].value_counts()
            for g, n in oor.iter_rows():
                out_of_range[g] = out_of_range.get(g, 0) + n
        df = df.with_columns(
            kind=pl.when(in_meta).then(pl.col("m_kind")).otherwise(pl.col("kind")),
            sliding_window=pl.when(in_meta)
            .then(pl.col("m_window"))
            .otherwise(pl.col("sliding_window")),
        ).drop("m_kind", "m_window")
    if learned_rows:
        learned = pl.DataFrame(learned_rows, schema=_LEARNED_SCHEMA, orient="row", strict=False)
        df = df.with_columns(_rank=_rank_expr(channels)).join(
            learned, on=["channel_id", "_rank", "group_idx"], how="left", maintain_order="left"
        )
        use = (
            pl.col("kind").is_null()
            & pl.col("l_kind").is_not_null()
            & (pl.col("type_code") != CLEARED)
        )
        df = df.with_columns(
            kind=pl.when(use).then(pl.col("l_kind")).otherwise(pl.col("kind")),
            sliding_window=pl.when(use)
            .then(pl.col("l_window"))
            .otherwise(pl.col("sliding_window")),
        ).drop("_rank", "l_kind", "l_window")
    return df


def _rank_expr(channels: dict[int, ChannelRef]) -> pl.Expr:
    """The rank the annotation keys by (:func:`kvtool.annotate.event_rank`), as a column."""
    cids = [c for c, ref in channels.items() if ref.info.dp_rank is not None]
    ranks = [channels[c].info.dp_rank for c in cids]
    chan = pl.col("channel_id").replace_strict(cids, ranks, default=None, return_dtype=pl.Int64)
    return chan.fill_null(pl.col("dp_rank")).fill_null(_NO_RANK)


def learn_table(df: pl.DataFrame, channels: dict[int, ChannelRef]) -> GroupLearner:
    """The columnar learner adapter: what one chunk's annotated stores say (wire kinds).

    For a parallel reader: learn each chunk (any order, any process), combine with
    :meth:`kvtool.annotate.GroupLearner.merge`, resolve, then annotate each chunk with
    :func:`annotate_table`. Positions are merge positions (log_time, endpoint, topic,
    seq), so the result equals the one-pass learning of :func:`kvtool.inputs.learn`
    on channels without metadata (give it the chunk before annotation).

    Args:
        df: A chunk of :func:`iter_tables`, not annotated.
        channels: The read's channels by ``channel_id``.

    Returns:
        The chunk's learner.
    """
    learner = GroupLearner()
    ann = df.with_columns(dp_rank=_rank_expr(channels)).filter(
        (pl.col("type_code") == STORED)
        & pl.col("kind").is_not_null()
        & pl.col("group_idx").is_not_null()
        & (pl.col("block_index") == 0)
    )
    if ann.height == 0:
        return learner
    agg = (
        ann.sort("log_time", "seq", maintain_order=True)
        .group_by("channel_id", "dp_rank", "group_idx", "kind", "sliding_window")
        .agg(n=pl.len(), log_time=pl.col("log_time").first(), seq=pl.col("seq").first())
    )
    for cid, rank, g, k, w, n, t, seq in agg.iter_rows():
        ref = channels[cid]
        info = ref.info
        learner.observe_store(
            info.name,
            None if rank == _NO_RANK else rank,
            g,
            k,
            w,
            seq=seq,
            position=(t, info.endpoint, info.topic, seq),
            count=n,
        )
    return learner


@dataclass
class TableAnnotator:
    """Annotates table chunks with THE annotation of the input (:mod:`kvtool.annotate`).

    Chunks may come in any order: the annotation is resolved before the first chunk (a
    learning pass over the whole input, see :func:`kvtool.inputs.resolve_annotation`).

    Attributes:
        annotation: The resolved annotation.
        out_of_range: Stores per group index not in a given metadata table.
        report_mode: How the report's kernel reads parentless stores (``--report-mode``:
            ``auto``, ``full`` or ``incremental``; hit announcements, issue 21).
        lifetime_bounds: Also run R8's two extreme copy rules for the lifetime bound
            (``report --lifetime-bounds``; two more kernel states: about 1.7x the CPU).
    """

    annotation: Annotation = field(default_factory=Annotation)
    out_of_range: dict[int, int] = field(default_factory=dict)
    _channels: dict[int, ChannelRef] = field(default_factory=dict)
    report_mode: str = "auto"
    lifetime_bounds: bool = False

    @property
    def tables(self) -> dict[str, GroupTable | None]:
        """Recording path → the recording-wide metadata table in use (None: learned)."""
        out: dict[str, GroupTable | None] = {}
        for ref in self._channels.values():
            t = self.annotation.table_for(ref.info.name)
            if out.get(ref.recording) is None:
                out[ref.recording] = t
        return out

    @property
    def changes(self) -> set[tuple[int, int, KindWindow, KindWindow]]:
        """Deprecated (always empty): conflicts are in :meth:`findings`."""
        return set()

    def group_kind(
        self, channel_id: int, group_idx: int, event_index: int = 0, dp_rank: Any = _UNSET
    ) -> KindWindow | None:
        """Return (kind, window) of a group on a channel, as every command gives it.

        Args:
            channel_id: The channel.
            group_idx: The group.
            event_index: Ignored (kept for callers; the answer no longer depends on it).
            dp_rank: The events' rank; default: the channel's, else the single value
                learned for the group on any rank.

        Returns:
            From the channel's metadata, else learned, else None.
        """
        ref = self._channels.get(channel_id)
        if ref is None:
            return None
        ann = self.annotation
        table = ann.table_for(ref.info.name)
        if table is not None:
            info = table.lookup(group_idx)
            return (info.kind, info.sliding_window) if info is not None else None
        if dp_rank is not _UNSET:
            return ann.learned.get((ref.info.name, dp_rank, group_idx))
        got = ann.learned.get((ref.info.name, ref.info.dp_rank, group_idx))
        if got is not None:
            return got
        vals = {
            kw for (ch, _r, g), kw in ann.learned.items() if ch == ref.info.name and g == group_idx
        }
        return next(iter(vals)) if len(vals) == 1 else None

    def group_shape(self, channel_id: int, group_idx: int | None) -> tuple[int, bool]:
        """Return a group's block size and whether its channel has a Mamba group.

        From the channel's metadata (issue 21: partial entries, R2 of docs/SEMANTICS.md).

        Args:
            channel_id: The channel.
            group_idx: The group (None: none).

        Returns:
            (block size or 0, the metadata names a ``mamba`` group).
        """
        ref = self._channels.get(channel_id)
        if ref is None:
            return 0, False
        table = self.annotation.table_for(ref.info.name)
        if table is None:
            return 0, False
        info = table.lookup(group_idx) if group_idx is not None else None
        bs = info.block_size if info is not None and info.block_size else 0
        return bs, any(g.kind == "mamba" for g in table.groups.values())

    def group_indices(self, channel_id: int) -> tuple[int, ...] | None:
        """Return the group indices a channel's metadata names (None: no metadata).

        Args:
            channel_id: The channel.

        Returns:
            The indices, or None.
        """
        ref = self._channels.get(channel_id)
        if ref is None:
            return None
        table = self.annotation.table_for(ref.info.name)
        return None if table is None else tuple(sorted(table.groups))

    def sources(self) -> list[str]:
        """Return the metadata sources used, one per distinct source."""
        return self.annotation.sources()

    def findings(self, stats: ReadStats | None = None) -> list[str]:
        """Return the input-wide findings: same-batch copies and annotation conflicts.

        Args:
            stats: The read's stats (for the merge findings).

        Returns:
            One line each.
        """
        out = stats.merge.lines() if stats is not None else []
        if stats is not None:
            out.extend(stats.rank_findings())
        out.extend(c.describe() for c in self.annotation.conflicts)
        return out

    def adopt(self, stats: ReadStats, out_of_range: Iterable[dict[int, int]]) -> None:
        """Take over what other annotators saw (the units of a merged report).

        Args:
            stats: The merged read's stats (its channels).
            out_of_range: Each unit's stores per group index outside a given table.
        """
        self._channels.update(stats.channels)
        for part in out_of_range:
            for g, n in part.items():
                self.out_of_range[g] = self.out_of_range.get(g, 0) + n

    def __call__(self, df: pl.DataFrame, stats: ReadStats) -> pl.DataFrame:
        """Annotate one chunk.

        Args:
            df: A chunk from :func:`iter_tables`.
            stats: The read's stats (channels).

        Returns:
            The chunk with ``kind``/``sliding_window`` set where known.
        """
        self._channels.update(stats.channels)
        return annotate_table(df, self.annotation, stats.channels, self.out_of_range)


def make_annotator(
    recording_groups: dict[str, list[dict[str, object]] | None] | Sequence[str | os.PathLike[str]],
    *,
    groups_file: str | os.PathLike[str] | None = None,
    group_flags: Sequence[str] | None = None,
    report_mode: str = "auto",
    lifetime_bounds: bool = False,
) -> TableAnnotator:
    """Resolve THE annotation of the input (:func:`kvtool.inputs.resolve_annotation`).

    Args:
        recording_groups: The recordings: their paths, or :func:`recording_groups`'s
            result (its keys are the paths; the metadata is read again from the files,
            with the learning pass over the whole input when some channel has none).
        groups_file: ``--groups FILE``.
        group_flags: ``--group IDX=KIND[:WINDOW]`` flags.
        report_mode: ``--report-mode`` (:attr:`TableAnnotator.report_mode`).
        lifetime_bounds: ``--lifetime-bounds`` (:attr:`TableAnnotator.lifetime_bounds`).

    Returns:
        The annotator.

    Raises:
        MetadataError: Invalid metadata, or both a file and flags.
        RecordingError: A recording cannot be opened.
    """
    paths = list(recording_groups)
    return TableAnnotator(
        resolve_annotation(paths, groups_file=groups_file, group_flags=group_flags),
        report_mode=report_mode,
        lifetime_bounds=lifetime_bounds,
    )


def recording_groups(
    paths: Iterable[str | os.PathLike[str]],
) -> dict[str, list[dict[str, object]] | None]:
    """Read each recording's stored group metadata (cheap: headers only).

    Args:
        paths: Recordings.

    Returns:
        Path (as :func:`open_recording` names it) → the metadata list or None.

    Raises:
        RecordingError: A recording cannot be opened.
    """
    out: dict[str, list[dict[str, object]] | None] = {}
    for p in paths:
        with open_recording(p) as r:
            out[r.path] = r.groups
    return out
