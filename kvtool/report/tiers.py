"""Tiers (issue 21): ``report --by medium`` -- one report row per medium, tier transitions.

Each medium an event names (``GPU``, ``CPU``, ``STORAGE``; SGLang's ``CPU_PINNED``,
``DISK``, ``EXTERNAL``; an offloading connector's own) is a cache of its own: a block
stored on CPU is a new block there even while its GPU copy is live, and a remove on CPU
removes the CPU copy. So every medium gets its own :class:`ReportBuilder` (the report
engine, its kernel state keyed as always), fed that medium's rows and every
``AllBlocksCleared`` (which names no medium: it clears every tier of its channel), as
``--by rank`` gives each rank its own. Rows without a medium (vLLM before 0.11) are the
medium ``null``.

A **tier transition** is a store into one medium of a key (channel, rank, group, hash)
that is not live in that medium (the medium's kernel says a first store or a recompute:
a new copy there) but is live in another medium at that moment, or whose last copy in
another medium was removed earlier in the same batch (a move). It is counted per kind
as (``from_medium``, ``to_medium``, ``direction``): ``offload`` into a lower tier (GPU →
CPU → storage), ``load`` into a higher one, ``move`` between media of one tier or ones
kvtool cannot rank. When the key is live in several other media the nearest tier is the
source (ties: the higher). A copy without ``group_idx`` matches a copy of the same hash in
any group (vLLM's ``OffloadingConnector`` sends its CPU events without one); such a store
takes the kind of its source copies when they agree on one. The per-key liveness across
media is read from each medium's kernel verdicts (``what``: a store that added a copy, an
eviction that took one), and seeded from the kernels' live entries when a channel first
shows a second medium, so a stream with one medium costs no per-row work here; a tiered
one's rows go through one numba loop (:mod:`kvtool.report.tierstep`), no Python object
per row.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import polars as pl

from kvtool.annotate import kind_label
from kvtool.columns import CLEARED, np
from kvtool.report import tierstep
from kvtool.report.builder import ReportBuilder, empty_row, with_aliases

if TYPE_CHECKING:
    from numpy.typing import NDArray

    from kvtool.report import attribution

TIER_RANKS = {
    "GPU": 0,
    "CPU": 1,
    "CPU_PINNED": 1,
    "CPU_TIER1": 1,
    "cpu": 1,
    "CPU_TIER2": 2,
    "DISK": 3,
    "STORAGE": 3,
    "FS": 3,
    "OBJ": 3,
    "EXTERNAL": 3,
}
"""Tier of each medium kvtool knows (0 is the highest: GPU); others have none."""

TRANSITIONS_SCHEMA = {
    "kind": pl.String(),
    "from_medium": pl.String(),
    "to_medium": pl.String(),
    "direction": pl.String(),
    "blocks": pl.Int64(),
}
"""Columns of the ``tier_transitions`` table."""

_NULL = "\x00null"  # the builders' key of rows without a medium (never a medium's name)


def medium_sort_key(medium: str | None) -> tuple[int, int, str]:
    """Order media by tier (GPU first), then name; unranked after, null last.

    Args:
        medium: The medium, or None.

    Returns:
        The sort key.
    """
    if medium is None:
        return (2, 0, "")
    rank = TIER_RANKS.get(medium)
    return (0, rank, medium) if rank is not None else (1, 0, medium)


def direction(source: str | None, target: str | None) -> str:
    """``offload`` into a lower tier, ``load`` into a higher one, else ``move``.

    Args:
        source: The medium the block was live in.
        target: The medium it was stored into.

    Returns:
        The direction.
    """
    a = TIER_RANKS.get(source) if source is not None else None
    b = TIER_RANKS.get(target) if target is not None else None
    if a is None or b is None or a == b:
        return "move"
    return "offload" if b > a else "load"


class TierSplit:
    """The ``--by medium`` split: a builder per medium, and the tier transitions.

    Args:
        group_kind: As for :class:`ReportBuilder`.
    """

    def __init__(self, group_kind: attribution.GroupKind | None) -> None:
        self.group_kind = group_kind
        self.builders: dict[str, ReportBuilder] = {}
        # Per channel: the media seen. The channels showing two media or more are
        # tracked by the numba step (kvtool.report.tierstep): per (channel, hash) the live
        # copies per (medium, group or none), the copies whose last block went in the
        # current batch, and each group's kind; its ids of media, kinds and channels here.
        self.media: dict[int, set[str]] = {}
        self.live: set[int] = set()
        self.state: tierstep.TierState | None = None
        self._medium_ids: dict[str, int] = {}
        self._kind_ids: dict[str, int] = {}
        self._chan_ids: dict[int, int] = {}
        self.transitions: dict[tuple[str, str | None, str | None], int] = {}

    def add(self, df: pl.DataFrame) -> None:
        """Feed one annotated chunk (with its ``medium`` column), in stream order.

        Args:
            df: The chunk (:func:`kvtool.report.run.run_builder`'s, ``medium`` kept).
        """
        if df.height == 0:
            return
        tc = df["type_code"].to_numpy()
        is_clear = tc == CLEARED
        med = df["medium"].fill_null(_NULL)
        chan = np.asarray(df["channel_id"].to_numpy(), dtype=np.int64)
        blocks = pl.Series(~is_clear)
        if blocks.any():
            pairs = pl.DataFrame({"c": chan[~is_clear], "m": med.filter(blocks)}).unique()
            for c, m in pairs.iter_rows():
                self.media.setdefault(int(c), set()).add(m)
        for m in sorted(med.filter(blocks).unique().to_list()):
            if m not in self.builders:
                self.builders[m] = ReportBuilder(None, self.group_kind, media_apart=False)
                self._medium_ids[m] = len(self._medium_ids)
        active = [c for c, ms in self.media.items() if len(ms) > 1]
        for c in active:
            if c not in self.live:
                self._seed(c)
        whats: dict[str, tuple[NDArray[Any], NDArray[Any]]] = {}
        med_np = med.to_numpy()
        for m, b in self.builders.items():
            mine = (med_np == m) | is_clear
            if not mine.any():
                continue
            b.add(df.filter(pl.Series(mine)))
            whats[m] = (np.flatnonzero(mine), b.row_what)
        if active:
            self._track(df, med, med_np, chan, tc, whats, set(active))

    def _state(self) -> tierstep.TierState:
        if self.state is None:
            self.state = tierstep.TierState()
        return self.state

    def _chan_index(self, channels: NDArray[Any]) -> NDArray[Any]:
        """Dense indexes of channel ids (the step's per-channel arrays)."""
        for c in np.unique(channels).tolist():
            self._chan_ids.setdefault(int(c), len(self._chan_ids))
        self._state().channels(len(self._chan_ids))
        ids = np.asarray(sorted(self._chan_ids), dtype=np.int64)
        dense = np.asarray([self._chan_ids[int(c)] for c in ids], dtype=np.int64)
        return dense[np.searchsorted(ids, channels)]

    def _seed(self, c: int) -> None:
        """Start tracking channel ``c`` from the media's kernels' live entries now."""
        st = self._state()
        (ci,) = self._chan_index(np.asarray([c], dtype=np.int64)).tolist()
        for m, b in self.builders.items():
            if c not in b._kchan:
                continue
            now = b._kchan[c]
            kchan, group, no_group, h, _ts, _gkey = b.kstate.live_entries()
            mine = kchan == now
            h, group, no_group = h[mine], group[mine], no_group[mine]
            st.grow(len(h), len(h))
            tierstep.seed(
                ci,
                self._medium_ids[m],
                np.ascontiguousarray(h, dtype=np.int64),
                np.ascontiguousarray(group, dtype=np.int64),
                np.ascontiguousarray(no_group, dtype=np.bool_),
                (st.tab_c, st.tab_h, st.tab_live),
                (st.node_m, st.node_ng, st.node_g, st.node_n, st.node_next, st.free),
                st.meta,
            )
        self.live.add(c)

    def _media(self) -> tuple[NDArray[Any], NDArray[Any]]:
        """Per medium id: its tier rank (-1: none) and its place in name order."""
        keys = list(self._medium_ids)
        rank = np.asarray(
            [TIER_RANKS.get(m, -1) if m != _NULL else -1 for m in keys], dtype=np.int64
        )
        names = [_medium(m) or "" for m in keys]
        order = sorted(set(names))
        name_ord = np.asarray([order.index(n) for n in names], dtype=np.int64)
        return rank, name_ord

    def _kinds(self, kinds: pl.Series) -> NDArray[Any]:
        """Kind ids (-1: none) of a chunk's rows."""
        kinds = kinds.cast(pl.String)
        for k in kinds.drop_nulls().unique().to_list():
            self._kind_ids.setdefault(k, len(self._kind_ids))
        if not self._kind_ids:
            return np.full(len(kinds), -1, dtype=np.int64)
        ids = kinds.replace_strict(self._kind_ids, default=None, return_dtype=pl.Int64)
        return np.asarray(ids.fill_null(-1).to_numpy(), dtype=np.int64)

    def _track(
        self,
        df: pl.DataFrame,
        med: pl.Series,
        med_np: NDArray[Any],
        chan: NDArray[Any],
        tc: NDArray[Any],
        whats: dict[str, tuple[NDArray[Any], NDArray[Any]]],
        active: set[int],
    ) -> None:
        """Walk the active channels' rows in stream order (the numba step)."""
        n = df.height
        what = np.zeros(n, dtype=np.int64)
        for m, (idx, w) in whats.items():
            sel = med_np[idx] == m  # a clear row is in every medium's part: keep its own
            what[idx[sel]] = w[sel]
        rows = np.flatnonzero(np.isin(chan, np.asarray(sorted(active), dtype=np.int64)))
        if not len(rows):
            return
        sub = df[rows]
        g_s, h_s = sub["group_idx"], sub["hash"]
        mids = med.gather(rows).replace_strict(self._medium_ids, default=-1, return_dtype=pl.Int64)
        cols = (
            self._chan_index(chan[rows]),
            np.asarray(sub["seq"].to_numpy(), dtype=np.int64),
            np.asarray(tc[rows], dtype=np.int64),
            np.asarray(h_s.is_null().to_numpy(), dtype=np.bool_),
            np.asarray(g_s.is_null().to_numpy(), dtype=np.bool_),
            np.asarray(g_s.fill_null(0).to_numpy(), dtype=np.int64),
            np.asarray(h_s.fill_null(0).to_numpy(), dtype=np.int64),
            np.asarray(mids.to_numpy(), dtype=np.int64),
            what[rows],
            self._kinds(sub["kind"]),
        )
        st = self._state()
        media = self._media()
        out = tuple(np.zeros(len(rows), dtype=np.int64) for _ in range(3))
        st.meta[tierstep.N_OUT] = 0
        i = 0
        while True:
            i = tierstep.step(
                i,
                cols,
                (st.tab_c, st.tab_h, st.tab_live, st.tab_gone, st.tab_tag),
                (st.node_m, st.node_ng, st.node_g, st.node_n, st.node_next, st.free),
                (st.chan_last, st.chan_has_last, st.chan_batch),
                (st.gk_c, st.gk_g, st.gk_k),
                media,
                out,
                st.meta,
            )
            if i >= len(rows):
                break
            # Doubling, not room for the whole rest: a clear walks the whole key table.
            left = len(rows) - i
            st.grow(min(left, max(1024, int(st.meta[tierstep.USED]))), min(2 * left, 1 << 16))
            st.group_kinds(min(left, 1024))
        self._count(*(o[: int(st.meta[tierstep.N_OUT])] for o in out))

    def _count(self, kind: NDArray[Any], src: NDArray[Any], dst: NDArray[Any]) -> None:
        """Add the step's transitions (kind id, source and target medium ids) up."""
        if not len(kind):
            return
        kinds = [None, *self._kind_ids]  # id -1 (no kind) first
        media = list(self._medium_ids)
        trip, counts = np.unique(np.stack([kind, src, dst], axis=1), axis=0, return_counts=True)
        for (k, a, b), n in zip(trip.tolist(), counts.tolist(), strict=True):
            key = (kind_label(kinds[k + 1]), _medium(media[a]), _medium(media[b]))
            self.transitions[key] = self.transitions.get(key, 0) + n

    def tables(self) -> tuple[pl.DataFrame, pl.DataFrame]:
        """Return the ``by_medium`` table and the ``tier_transitions`` table."""
        media = sorted(self.builders, key=lambda m: medium_sort_key(_medium(m)))
        frame = pl.DataFrame({"medium": [_medium(m) for m in media]}, schema={"medium": pl.String})
        if media:
            totals = pl.concat(
                [self.builders[m].tables()["totals"] for m in media], how="vertical_relaxed"
            )
        else:
            totals = with_aliases(empty_row().clear())
        by_medium = pl.concat([frame, totals], how="horizontal")
        rows = sorted(
            self.transitions.items(),
            key=lambda kv: (kv[0][0], medium_sort_key(kv[0][1]), medium_sort_key(kv[0][2])),
        )
        trans = pl.DataFrame(
            [(k, a, b, direction(a, b), n) for (k, a, b), n in rows],
            schema=TRANSITIONS_SCHEMA,
            orient="row",
        )
        return by_medium, trans


def _medium(key: str) -> str | None:
    return None if key == _NULL else key


def tier_findings(by_medium: pl.DataFrame) -> list[str]:
    """A finding per store-only tier: stores and no removes, so residency is unbounded.

    A medium with stores and no remove at all, when it is not the GPU (or when another
    medium of the stream has removes): LMCache's MP connector sends such a tier.

    Args:
        by_medium: The ``by_medium`` table.

    Returns:
        The findings' lines.
    """
    rows = by_medium.to_dicts()
    any_removes = any(r["remove_events"] for r in rows)
    out: list[str] = []
    for r in rows:
        m = r["medium"]
        if not r["blocks_stored"] or r["remove_events"]:
            continue
        if (m is not None and m != "GPU") or any_removes:
            out.append(
                f"medium {m if m is not None else 'null'}: {r['blocks_stored']:,} blocks "
                "stored and none removed: a store-only tier (as LMCache's MP connector sends); "
                "its residency is unbounded: live and peak blocks count every block it was "
                "sent, and it has no lifetimes"
            )
    return out


__all__ = [
    "TIER_RANKS",
    "TRANSITIONS_SCHEMA",
    "TierSplit",
    "direction",
    "medium_sort_key",
    "tier_findings",
]
