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
shows a second medium, so a stream with one medium costs no per-row work here (a tiered
one a Python step per block row of its channels).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import polars as pl

from kvtool.annotate import kind_label
from kvtool.columns import CLEARED, REMOVED, STORED, np
from kvtool.report import kernel
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

_ADDED = (kernel.FIRST, kernel.WHILE_LIVE, kernel.RECOMPUTED)
_NEW_HERE = (kernel.FIRST, kernel.RECOMPUTED)
_NULL = "\x00null"  # the builders' key of rows without a medium (never a medium's name)

_Copy = tuple[str, "int | None"]
"""(medium key, group_idx or None) of a hash's live copies."""


def _same_group(a: int | None, b: int | None) -> bool:
    """Two copies of a hash are one block's when their groups agree or one has none."""
    return a is None or b is None or a == b


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


def _nearest(target: str | None, candidates: list[str | None]) -> str | None:
    """The candidate medium nearest ``target``'s tier (ties: the higher tier, then name)."""
    t = TIER_RANKS.get(target) if target is not None else None

    def key(m: str | None) -> tuple[int, int, str]:
        r = TIER_RANKS.get(m) if m is not None else None
        if r is None or t is None:
            return (99, 99, m or "")
        return (abs(r - t), r, m or "")

    return min(candidates, key=key)


class TierSplit:
    """The ``--by medium`` split: a builder per medium, and the tier transitions.

    Args:
        group_kind: As for :class:`ReportBuilder`.
    """

    def __init__(self, group_kind: attribution.GroupKind | None) -> None:
        self.group_kind = group_kind
        self.builders: dict[str, ReportBuilder] = {}
        # Per channel: the media seen; per active channel (two media or more), per hash
        # the live copies per (medium, group or None), and the (medium, group) whose last
        # copy of a hash went in the current batch (seq); the kind of each group's stores.
        self.media: dict[int, set[str]] = {}
        self.live: dict[int, dict[int, dict[_Copy, int]]] = {}
        self.gone: dict[int, tuple[int, dict[int, set[_Copy]]]] = {}
        self.last_seq: dict[int, int] = {}
        self.group_kinds: dict[tuple[int, int | None], str] = {}
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
                self.builders[m] = ReportBuilder(None, self.group_kind)
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
            self._track(df, med_np, chan, tc, whats, set(active))

    def _seed(self, c: int) -> None:
        """Start tracking channel ``c`` from the media's kernels' live entries now."""
        live: dict[int, dict[_Copy, int]] = {}
        for m, b in self.builders.items():
            if c not in b._kchan:
                continue
            now = b._kchan[c]
            kchan, group, no_group, h, _ts, _gkey = b.kstate.live_entries()
            for k, g, ng, hh in zip(
                kchan.tolist(), group.tolist(), no_group.tolist(), h.tolist(), strict=True
            ):
                if k == now:
                    copies = live.setdefault(hh, {})
                    key = (m, None if ng else g)
                    copies[key] = copies.get(key, 0) + 1
        self.live[c] = live

    def _track(
        self,
        df: pl.DataFrame,
        med: NDArray[Any],
        chan: NDArray[Any],
        tc: NDArray[Any],
        whats: dict[str, tuple[NDArray[Any], NDArray[Any]]],
        active: set[int],
    ) -> None:
        """Walk the active channels' rows in stream order: liveness and transitions."""
        n = df.height
        what = np.zeros(n, dtype=np.int64)
        for m, (idx, w) in whats.items():
            sel = med[idx] == m  # a clear row is in every medium's part: keep its own
            what[idx[sel]] = w[sel]
        rows = np.flatnonzero(np.isin(chan, np.asarray(sorted(active), dtype=np.int64)))
        if not len(rows):
            return
        g_s, h_s = df["group_idx"], df["hash"]
        no_group = g_s.is_null().to_numpy()
        no_hash = h_s.is_null().to_numpy()
        group = np.asarray(g_s.fill_null(0).to_numpy(), dtype=np.int64)
        h = np.asarray(h_s.fill_null(0).to_numpy(), dtype=np.int64)
        seq = np.asarray(df["seq"].to_numpy(), dtype=np.int64)
        kinds = df["kind"].to_list()
        for i in rows.tolist():
            c = int(chan[i])
            s = int(seq[i])
            last = self.last_seq.get(c)
            self.last_seq[c] = s
            live = self.live[c]
            if last is not None and s < last:  # a publisher restart: a new cache
                live.clear()
            batch_seq, gone = self.gone.get(c, (s, {}))
            if batch_seq != s:
                gone = {}
            self.gone[c] = (s, gone)
            t = int(tc[i])
            if t == CLEARED:
                live.clear()
                gone.clear()
                continue
            if no_hash[i]:
                continue
            g = None if no_group[i] else int(group[i])
            m = str(med[i])
            hh = int(h[i])
            verdict = int(what[i])
            if t == STORED and verdict in _ADDED:
                if kinds[i] is not None and g is not None:
                    self.group_kinds[(c, g)] = kinds[i]
                copies = live.setdefault(hh, {})
                if verdict in _NEW_HERE:
                    # A copy elsewhere of the same group; an ungrouped side (an offloading
                    # connector's CPU events carry no group_idx) matches any group.
                    others = [k for k in copies if k[0] != m and _same_group(k[1], g)]
                    if not others:
                        others = [k for k in gone.get(hh, ()) if k[0] != m and _same_group(k[1], g)]
                    if others:
                        self._count(c, m, g, kinds[i], others)
                key = (m, g)
                copies[key] = copies.get(key, 0) + 1
            elif t == REMOVED and verdict == kernel.EVICTED:
                # Only media with live copies are kept: memory follows the live keys.
                held = live.get(hh)
                key = (m, g)
                if held is None or key not in held:
                    continue
                held[key] -= 1
                if held[key] <= 0:
                    del held[key]
                    if not held:
                        del live[hh]
                    gone.setdefault(hh, set()).add(key)

    def _count(self, c: int, m: str, g: int | None, kind: str | None, others: list[_Copy]) -> None:
        """Count one transition into ``m`` from the nearest medium of ``others``."""
        src = _nearest(_medium(m), [_medium(k[0]) for k in others])
        if kind is None:
            # An ungrouped store takes its source copies' kind when they agree on one.
            src_key = _NULL if src is None else src
            seen = {self.group_kinds.get((c, k[1])) for k in others if k[0] == src_key}
            seen.discard(None)
            kind = seen.pop() if len(seen) == 1 else None
        k = (kind_label(kind), src, _medium(m))
        self.transitions[k] = self.transitions.get(k, 0) + 1

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
