"""Per-kind, per-window and per-group tables of block stores and evictions, built streaming.

Pure: chunks of the flat table (:mod:`kvtool.columns`) in, a :class:`Report` of polars
DataFrames out; nothing here prints.

Semantics (DESIGN.md "Report semantics"):

- Live blocks are a multiset keyed by (channel, group_idx, hash): +1 per stored hash,
  -1 per removed hash; ``AllBlocksCleared`` empties the channel and the blocks it drops
  count as ``blocks_cleared``. A store of a live key counts in ``restored_blocks``; a
  remove of a key that is not live counts in ``orphan_removes`` and changes nothing.
- A remove's kind and window come from its ``group_idx`` (metadata, else learned from
  annotated stores, see :class:`kvtool.columns.TableAnnotator`). A remove without
  ``group_idx`` (older vLLM) goes to the one group in which its hash is live; when the
  hash is live in no group or in several, it is ``unattributed`` (never guessed).
- An event counts once (``store_events``/``remove_events``) under the kind of its first
  block.
- Lifetimes pair the j-th effective remove of a key with its j-th store since the key
  was last empty (first in, first out), on the publisher clock (``ts``). Percentiles are
  exact (linear interpolation) up to :data:`EXACT_LIFETIMES` lifetimes; beyond that, a
  log histogram with 64 bins per doubling (relative error below 0.6 %); the JSON
  ``source.lifetimes`` says which was used.

Vectorised per chunk: rows are sorted by (key, clear epoch, stream position); per key a
prefix sum with a running minimum gives the clamped multiset count, from which orphans,
restores, FIFO pairs and the blocks still live follow. Between chunks only the live
entries (key, store time, group), the per-group totals, the distinct hashes stored and
the lifetimes (or their histogram) are carried, so memory does not grow with the
recording's length beyond that state (distinct hashes are kept as sorted per-group
sets, merged by sort, not in hash tables).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import polars as pl

from kvtool.columns import (
    CLEARED,
    DEFAULT_CHUNK_BYTES,
    REMOVED,
    STORED,
    UNANNOTATED,
    UNATTRIBUTED,
    ReadStats,
    TableAnnotator,
    iter_tables,
    make_annotator,
    np,
    prefetch,  # optional numpy (None when not installed)
    recording_groups,
)

COUNT_COLUMNS = (
    "store_events",
    "blocks_stored",
    "tokens_stored",
    "remove_events",
    "blocks_removed",
    "blocks_cleared",
    "live_blocks_end",
    "peak_live_blocks",
    "distinct_hashes",
    "restored_blocks",
    "orphan_removes",
)
LIFETIME_COLUMNS = ("lifetime_p50_s", "lifetime_p90_s", "lifetime_p99_s")
COLUMNS = COUNT_COLUMNS + LIFETIME_COLUMNS
"""Report columns, in DESIGN.md's names and order."""

TIMELINE_COLUMNS = ("time_s", "kind", "stores", "removes", "live_blocks")

MAX_DENSE_BUCKETS = 1_000_000
"""A timeline spanning more buckets lists only the buckets with events."""

EXACT_LIFETIMES = 1_000_000
"""Lifetimes kept exactly; past this many, a log histogram replaces them."""
_HIST_BINS_PER_OCTAVE = 64

_ADDITIVE = (
    "store_events",
    "blocks_stored",
    "tokens_stored",
    "remove_events",
    "blocks_removed",
    "blocks_cleared",
    "restored_blocks",
    "orphan_removes",
)
_NOGROUP = -1  # group_idx null inside state keys
_CK = 1 << 24  # state key: channel_id * _CK + group_idx + 1


def _finite(value: object) -> object:
    """JSON has no NaN or infinity: such floats (from a garbage ts) become None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


@dataclass
class Report:
    """A finished report.

    Attributes:
        source: What was read: recordings, channels, metadata source, counts.
        totals: One row with every column.
        by_kind: One row per kind (``unannotated``/``unattributed`` included).
        by_window: One row per sliding window (null: none or unknown).
        by_group: One row per (group_idx, kind, sliding_window).
        timeline: Per time bucket and kind (with ``every``), else None.
        findings: One line each for things that look wrong.
        damaged: True when input was skipped or a recording was damaged.
        every_s: The timeline bucket in seconds, or None.
    """

    source: dict[str, object]
    totals: pl.DataFrame
    by_kind: pl.DataFrame
    by_window: pl.DataFrame
    by_group: pl.DataFrame
    timeline: pl.DataFrame | None = None
    findings: list[str] = field(default_factory=list)
    damaged: bool = False
    every_s: float | None = None

    def to_dict(self) -> dict[str, object]:
        """Return the JSON contract: source, totals, by_kind, by_window, by_group (+ timeline).

        Returns:
            Plain Python objects (numbers, strings, None).
        """
        out: dict[str, object] = {
            "source": self.source,
            "totals": self.totals.to_dicts()[0] if self.totals.height else {},
            "by_kind": self.by_kind.to_dicts(),
            "by_window": self.by_window.to_dicts(),
            "by_group": self.by_group.to_dicts(),
        }
        if self.timeline is not None:
            out["timeline"] = self.timeline.to_dicts()
        return _finite(out)  # type: ignore[return-value]


_LIVE_SCHEMA = {
    "r": pl.Int64,
    "ck": pl.Int64,
    "hash": pl.Int64,
    "t": pl.Float64,
    "gkey": pl.UInt32,
}


class ReportBuilder:
    """Feeds annotated table chunks through the live-block state and keeps the totals.

    Args:
        every_ns: Timeline bucket (ns), or None for no timeline.
        group_kind: (channel_id, group_idx, event_index) -> (kind, window) of a group, for
            removes without group_idx attributed through the hash state
            (:meth:`kvtool.columns.TableAnnotator.group_kind`).
    """

    def __init__(
        self,
        every_ns: int | None = None,
        group_kind: Callable[[int, int, int], tuple[str, int | None] | None] | None = None,
    ) -> None:
        self.every_ns = every_ns
        self.group_kind = group_kind
        self.rows = 0
        self.registry: dict[tuple[int | None, str, int | None], int] = {}
        self.live = pl.DataFrame(schema=_LIVE_SCHEMA)
        self.counts = pl.DataFrame(schema={"gkey": pl.UInt32, **{c: pl.Int64 for c in _ADDITIVE}})
        # Distinct stored hashes per gkey: a sorted, duplicate-free Int64 series each, merged
        # with each chunk's new hashes now and then (sort-merge: no big hash tables).
        self.distinct: dict[int, pl.Series] = {}
        self._distinct_parts: dict[int, list[pl.Series]] = {}
        self._distinct_rows = 0
        self._distinct_size = 0
        self.lifetimes: list[pl.DataFrame] = []
        self.n_lifetimes = 0
        self.hist: pl.DataFrame | None = None
        self.levels: dict[str, dict[object, tuple[int, int]]] = {
            "kind": {},
            "window": {},
            "group": {},
            "total": {},
        }
        self.timeline = pl.DataFrame(
            schema={"bucket": pl.Int64, "gkey": pl.UInt32, "stores": pl.Int64,
                    "removes": pl.Int64, "delta": pl.Int64}
        )
        self.grouped_channels: set[int] = set()
        self.first_ts: float | None = None
        self.last_ts: float | None = None
        self.ambiguous_removes = 0

    # -- registry of (group_idx, kind, window) ----------------------------------------------

    def _gkeys(self, df: pl.DataFrame) -> pl.DataFrame:
        """Return df with ``gkey`` from (group_idx, kind_final, sliding_window).

        The three columns are hashed into one 64-bit key per row so that finding the few
        distinct combinations and mapping them to ids is a single-column operation.
        """
        combo = pl.struct("group_idx", "kind_final", "sliding_window").hash(seed=7)
        keyed = df.select(
            "group_idx", "kind_final", "sliding_window", h=combo,
            skip=pl.col("type_code") == CLEARED,
        )
        firsts = keyed.filter(~pl.col("skip")).unique(subset="h", keep="first")
        mapping: dict[int, int] = {}
        for g, k, w, h, _skip in firsts.iter_rows():
            key = (g, k, w)
            if key not in self.registry:
                self.registry[key] = len(self.registry)
            mapping[h] = self.registry[key]
        gkey = keyed["h"].replace_strict(
            list(mapping), list(mapping.values()), default=None, return_dtype=pl.UInt32
        )
        return df.with_columns(gkey=gkey)

    def _gkey_of(self, g: int | None, kind: str, window: int | None) -> int:
        key = (g, kind, window)
        if key not in self.registry:
            self.registry[key] = len(self.registry)
        return self.registry[key]

    def _registry_frame(self) -> pl.DataFrame:
        return pl.DataFrame(
            [(g, k, w, i) for (g, k, w), i in self.registry.items()],
            schema={"group_idx": pl.Int64, "kind_final": pl.String, "sliding_window": pl.Int64,
                    "gkey": pl.UInt32},
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
        df = df.with_columns(
            r=pl.int_range(self.rows, self.rows + n, dtype=pl.Int64),
            # State key part of the group: -1 for none; indices no vLLM sends (negative or
            # huge: garbage) share one bucket so the packed key stays exact.
            gk=pl.when(pl.col("group_idx").is_null())
            .then(pl.lit(_NOGROUP, pl.Int64))
            .when((pl.col("group_idx") < 0) | (pl.col("group_idx") > _CK - 3))
            .then(pl.lit(_CK - 3, pl.Int64))
            .otherwise(pl.col("group_idx")),
            # A batch whose ts is not a plausible time (not finite, or beyond year 5000)
            # is placed at its receive time.
            ts=pl.when(pl.col("ts").is_finite() & (pl.col("ts").abs() < 1e11))
            .then(pl.col("ts"))
            .otherwise(pl.col("log_time") / 1e9),
        )
        self.rows += n
        ts = df["ts"]
        lo, hi = ts.min(), ts.max()
        if isinstance(lo, float):
            self.first_ts = lo if self.first_ts is None else min(self.first_ts, lo)
        if isinstance(hi, float):
            self.last_ts = hi if self.last_ts is None else max(self.last_ts, hi)
        tc = pl.col("type_code")
        # Channels whose stores carry group_idx: there a remove without one needs the
        # (hash -> group) state; elsewhere (old vLLM: no group_idx at all) it is keyed
        # by (channel, no group, hash) like its stores.
        self.grouped_channels |= set(
            df.select(
                pl.col("channel_id")
                .filter((tc == STORED) & pl.col("group_idx").is_not_null())
                .unique()
            ).to_series()
        )
        needs = df.filter(
            (tc == REMOVED)
            & pl.col("group_idx").is_null()
            & pl.col("hash").is_not_null()
            & pl.col("channel_id").is_in(list(self.grouped_channels))
        )
        resolved: pl.DataFrame | None = None
        if needs.height:
            resolved = self._resolve_ungrouped(df)
            df = df.join(resolved, on="r", how="left", maintain_order="left").with_columns(
                gk=pl.coalesce("res_gk", "gk"),
                kind=pl.when(pl.col("res_gk").is_not_null())
                .then(pl.col("res_kind"))
                .otherwise(pl.col("kind")),
                sliding_window=pl.when(pl.col("res_gk").is_not_null())
                .then(pl.col("res_window"))
                .otherwise(pl.col("sliding_window")),
                group_idx=pl.when(pl.col("res_gk").is_not_null() & (pl.col("res_gk") >= 0))
                .then(pl.col("res_gk"))
                .otherwise(pl.col("group_idx")),
                exempt=pl.col("res_exempt").fill_null(False),
            )
        else:
            df = df.with_columns(exempt=pl.lit(False))
        # Clear epochs per channel.
        is_clear = (tc == CLEARED).cast(pl.Int64)
        one_channel = df["channel_id"].n_unique() == 1
        df = df.with_columns(
            epoch=is_clear.cum_sum() if one_channel else is_clear.cum_sum().over("channel_id"),
            ck=pl.col("channel_id").cast(pl.Int64) * _CK + pl.col("gk") + 1,
        )
        # Attribution before the state: stores by their own kind; removes by their group's
        # (an orphan remove without group_idx becomes unattributed after the state step).
        unattr = pl.col("exempt") & (tc == REMOVED)
        df = df.with_columns(
            kind_final=pl.when(unattr)
            .then(pl.lit(UNATTRIBUTED))
            .when(pl.col("kind").is_null())
            .then(pl.lit(UNANNOTATED))
            .otherwise(pl.col("kind")),
            sliding_window=pl.when(unattr).then(None).otherwise(pl.col("sliding_window")),
        )
        df = self._gkeys(df)
        has = pl.col("hash").is_not_null()
        first = pl.col("block_index") == 0
        # -- the multiset state, vectorised ---------------------------------------------------
        blk = (
            df.lazy()
            .filter(has & (tc != CLEARED) & ~pl.col("exempt"))
            .select(
                "r", "ck", "hash", "epoch", t="ts",
                d=pl.when(tc == STORED).then(pl.lit(1, pl.Int64)).otherwise(pl.lit(-1, pl.Int64)),
                carry=pl.lit(False), gkey="gkey",
                nogroup=pl.col("group_idx").is_null(), first=first,
            )
            .collect()
        )
        carry = self.live.select(
            "r", "ck", "hash", epoch=pl.lit(0, pl.Int64), t="t", d=pl.lit(1, pl.Int64),
            carry=pl.lit(True), gkey="gkey", nogroup=pl.lit(False), first=pl.lit(False),
        )
        # Both parts are in stream order (carried entries are older): two stable
        # single-column sorts (least significant key first) group the keys and keep that
        # order inside each key -- much cheaper than one multi-column sort.
        b = pl.concat([carry, blk])
        order = (
            b.select("ck", "hash", i=pl.int_range(pl.len(), dtype=pl.UInt32))
            .sort("ck", maintain_order=True)
            .sort("hash", maintain_order=True)
            .get_column("i")
        )
        b = b[order]
        big = 2 * b.height + 2
        add = (pl.col("d") > 0).cast(pl.Int64)
        b = (
            b.lazy()
            .with_columns(
                seg_start=(
                    (pl.col("hash") != pl.col("hash").shift(1))
                    | (pl.col("ck") != pl.col("ck").shift(1))
                    | (pl.col("epoch") != pl.col("epoch").shift(1))
                ).fill_null(True),
                cs=pl.col("d").cum_sum(),
                cadd=add.cum_sum(),
            )
            .with_columns(
                seg_end=pl.col("seg_start").shift(-1).fill_null(True),
                seg=pl.col("seg_start").cast(pl.Int64).cum_sum(),
                base=pl.when("seg_start").then(pl.col("cs") - pl.col("d")).forward_fill(),
                base_add=pl.when("seg_start").then(pl.col("cadd") - add).forward_fill(),
            )
            .with_columns(p=pl.col("cs") - pl.col("base"))
            .with_columns(cm=(pl.col("p") - pl.col("seg") * big).cum_min() + pl.col("seg") * big)
            .with_columns(c=pl.col("p") - pl.min_horizontal(pl.col("cm"), pl.lit(0)))
            .with_columns(c_prev=pl.when("seg_start").then(0).otherwise(pl.col("c").shift(1)))
            .with_columns(
                orphan=(pl.col("d") < 0) & (pl.col("c_prev") == 0),
                restored=(pl.col("d") > 0) & ~pl.col("carry") & (pl.col("c_prev") > 0),
            )
            .with_columns(eff=((pl.col("d") < 0) & ~pl.col("orphan")).cast(pl.Int64))
            .with_columns(ceff=pl.col("eff").cum_sum())
            .with_columns(
                base_eff=pl.when("seg_start").then(pl.col("ceff") - pl.col("eff")).forward_fill()
            )
            .with_columns(
                # The j-th effective remove of a key pairs with its j-th entry (FIFO): the
                # index of that entry among all entries of the chunk.
                pair=pl.col("base_add") + pl.col("ceff") - pl.col("base_eff") - 1,
                n_rm=pl.when("seg_end").then(pl.col("ceff")).backward_fill()
                - pl.col("base_eff"),
            )
            .select("r", "ck", "hash", "epoch", "t", "d", "carry", "gkey", "nogroup", "first",
                    "cadd", "base_add", "orphan", "restored", "eff", "pair", "n_rm")
            .collect()
        )
        adds = b.lazy().filter(pl.col("d") > 0).select(
            "r", "ck", "hash", "epoch", "t", "carry", "gkey", "cadd", "base_add", "n_rm"
        ).collect()
        survive = adds.filter((pl.col("cadd") - 1 - pl.col("base_add")) >= pl.col("n_rm"))
        rms = b.lazy().filter(pl.col("eff") == 1).select("r", "t", "gkey", "pair").collect()
        pair_idx = rms["pair"]
        pairs = pl.DataFrame(
            {
                "r": rms["r"],
                "t_rm": rms["t"],
                "rgkey": rms["gkey"],
                "t": adds["t"].gather(pair_idx),
                "gkey": adds["gkey"].gather(pair_idx),
            }
        )
        survive = survive.with_columns(channel_id=(pl.col("ck") // _CK).cast(pl.UInt32))
        final = df.group_by("channel_id").agg(final=pl.col("epoch").max())
        survive = survive.join(final, on="channel_id", how="left").with_columns(
            pl.col("final").fill_null(0)
        )
        self.live = survive.filter(pl.col("epoch") == pl.col("final")).select(
            list(_LIVE_SCHEMA)
        ).sort("r")
        cleared = survive.filter(pl.col("epoch") < pl.col("final"))
        if cleared.height:
            clears = df.filter(tc == CLEARED).select("channel_id", "epoch", "r", "ts")
            cleared = cleared.drop("r").with_columns(epoch=pl.col("epoch") + 1).join(
                clears, on=["channel_id", "epoch"], how="left"
            )
        else:
            cleared = cleared.with_columns(ts=pl.col("t"))
        # -- additive counts per gkey --------------------------------------------------------
        c_rows = (
            df.lazy()
            .select("gkey", "type_code", "block_index", "hash", "tokens")
            .filter(tc != CLEARED)
            .group_by(gt=pl.col("gkey").cast(pl.Int64) * 4 + tc.cast(pl.Int64))
            .agg(
                ev=first.sum().cast(pl.Int64),
                blocks=has.sum().cast(pl.Int64),
                tokens=pl.col("tokens").sum().cast(pl.Int64),
            )
            .with_columns(
                gkey=(pl.col("gt") // 4).cast(pl.UInt32),
                type_code=(pl.col("gt") % 4).cast(pl.UInt8),
            )
            .drop("gt")
            .collect()
        )
        c_rows = c_rows.with_columns(
            store_events=pl.when(tc == STORED).then("ev").otherwise(0),
            blocks_stored=pl.when(tc == STORED).then("blocks").otherwise(0),
            tokens_stored=pl.when(tc == STORED).then("tokens").otherwise(0),
            remove_events=pl.when(tc == REMOVED).then("ev").otherwise(0),
            blocks_removed=pl.when(tc == REMOVED).then("blocks").otherwise(0),
        ).drop("ev", "blocks", "tokens", "type_code")
        if resolved is not None:
            # Removes without group_idx live in no group: unattributed orphans.
            ex = df.filter(pl.col("res_orphan").fill_null(False) & has).group_by("gkey").agg(
                orphan_removes=pl.len().cast(pl.Int64)
            )
        else:
            ex = pl.DataFrame(schema={"gkey": pl.UInt32, "orphan_removes": pl.Int64})
        flags = b.group_by("gkey").agg(
            restored_blocks=pl.col("restored").sum().cast(pl.Int64),
            orphan_removes=(pl.col("orphan") & ~pl.col("nogroup")).sum().cast(pl.Int64),
        )
        # Orphan removes without group_idx (old vLLM): the hash is live in no group, so
        # the remove is unattributed -- move it off the group it was keyed under.
        moved = b.filter(pl.col("orphan") & pl.col("nogroup")).group_by("gkey").agg(
            n=pl.len().cast(pl.Int64), ev=pl.col("first").sum().cast(pl.Int64)
        )
        adj = []
        if moved.height:
            unattributed_gkey = self._gkey_of(None, UNATTRIBUTED, None)
            adj = [
                moved.select("gkey", blocks_removed=-pl.col("n"), remove_events=-pl.col("ev")),
                moved.select(
                    gkey=pl.lit(unattributed_gkey, pl.UInt32),
                    blocks_removed=pl.col("n"),
                    remove_events=pl.col("ev"),
                    orphan_removes=pl.col("n"),
                ),
            ]
        c_cl = cleared.group_by("gkey").agg(blocks_cleared=pl.len().cast(pl.Int64))
        chunk_counts = pl.concat([c_rows, flags, c_cl, ex, *adj], how="diagonal_relaxed")
        self.counts = (
            pl.concat([self.counts, chunk_counts], how="diagonal_relaxed")
            .fill_null(0)
            .group_by("gkey")
            .agg(*[pl.col(c).sum().cast(pl.Int64) for c in _ADDITIVE])
        )
        # -- distinct hashes (merged now and then: amortised) -------------------------------
        new = adds.filter(~pl.col("carry")).select("gkey", "hash")
        for (gkey,), part in new.group_by("gkey"):
            h = part["hash"].unique()
            self._distinct_parts.setdefault(int(gkey), []).append(h)  # type: ignore[arg-type,unused-ignore]
            self._distinct_rows += len(h)
        if self._distinct_rows > max(1 << 20, self._distinct_size):
            self._merge_distinct()
        # -- lifetimes (by the remove's attribution) ----------------------------------------
        # ts is float seconds since the epoch: difference at microsecond resolution so that
        # float rounding of large timestamps does not show up in the lifetimes.
        lt = pairs.select(
            gkey=pl.col("rgkey"),
            lifetime_s=((pl.col("t_rm") * 1e6).round() - (pl.col("t") * 1e6).round()) / 1e6,
        )
        self._add_lifetimes(lt)
        # -- live deltas in stream order: peaks and timeline -------------------------------
        # One delta per row, in stream order: +1 per stored block, -1 per effective remove
        # (counted against the entry it removes); each clear adds its drops at its row.
        r0 = self.rows - n
        delta = df.select(
            pl.when((tc == STORED) & has).then(pl.lit(1, pl.Int64)).otherwise(pl.lit(0, pl.Int64))
        ).to_series()
        dgkey = df["gkey"]
        if pairs.height:
            idx = pairs["r"] - r0
            delta = delta.scatter(idx, -1)
            dgkey = dgkey.scatter(idx, pairs["gkey"])
        deltas = pl.DataFrame({"r": df["r"], "gkey": dgkey, "t": df["ts"], "delta": delta})
        if cleared.height:
            drops = (
                cleared.group_by("r", "gkey")
                .agg(t=pl.col("ts").first(), delta=-pl.len().cast(pl.Int64))
                .sort("r")
                .select("r", "gkey", "t", "delta")
            )
            deltas = deltas.merge_sorted(drops, key="r")
        self._peaks(deltas)
        if self.every_ns is not None:
            self._timeline(df.filter(tc == STORED), df.filter(tc == REMOVED), deltas)

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
            self.distinct[gkey] = _sorted_union([old, *parts] if old is not None else parts)
        self._distinct_parts = {}
        self._distinct_rows = 0
        self._distinct_size = sum(len(s) for s in self.distinct.values())

    def _add_lifetimes(self, lt: pl.DataFrame) -> None:
        lt = lt.filter(pl.col("lifetime_s").is_finite())  # a ts that is NaN or inf: none
        if lt.height == 0:
            return
        if self.hist is None and self.n_lifetimes + lt.height <= EXACT_LIFETIMES:
            self.lifetimes.append(lt)
            self.n_lifetimes += lt.height
            return
        parts = [*self.lifetimes, lt]
        self.lifetimes = []
        self.n_lifetimes += lt.height
        h = pl.concat(parts).select("gkey", bin=_hist_bin(pl.col("lifetime_s"))).group_by(
            "gkey", "bin"
        ).agg(n=pl.len().cast(pl.Int64))
        if self.hist is not None:
            h = pl.concat([self.hist, h]).group_by("gkey", "bin").agg(pl.col("n").sum())
        self.hist = h

    def _level_map(self) -> pl.DataFrame:
        return self._registry_frame().with_columns(
            L_kind=pl.col("kind_final"),
            L_window=pl.col("sliding_window"),
            L_group=pl.col("gkey").cast(pl.Int64),
            L_total=pl.lit(0, pl.Int64),
        )

    def _peaks(self, deltas: pl.DataFrame) -> None:
        if deltas.height == 0:
            return
        by_gkey = {i: key for key, i in self.registry.items()}
        members: dict[tuple[str, object], list[int]] = {}
        for i in deltas["gkey"].drop_nulls().unique().to_list():
            _g, k, w = by_gkey[i]
            for level, key in (("kind", k), ("window", w), ("group", i), ("total", 0)):
                members.setdefault((level, key), []).append(i)
        if not members:
            return
        # Level keys with the same member groups share one running sum (e.g. a kind with
        # one group, or a window all of whose groups are one kind).
        sets: dict[tuple[int, ...], int] = {}
        exprs = []
        for ids in members.values():
            t = tuple(sorted(ids))
            if t in sets:
                continue
            n = sets[t] = len(sets)
            part = (
                pl.when(pl.col("gkey").is_in(list(t))).then(pl.col("delta")).otherwise(0)
                if len(t) < len(by_gkey)
                else pl.col("delta")
            )
            exprs += [part.cum_sum().max().alias(f"hi{n}"), part.sum().alias(f"end{n}")]
        got = deltas.lazy().select(exprs).collect().row(0)
        for (level, key), ids in members.items():
            n = sets[tuple(sorted(ids))]
            start = self.levels[level].get(key, (0, 0))[0]
            hi, end = got[2 * n] + start, got[2 * n + 1] + start
            old = self.levels[level].get(key, (0, 0))
            self.levels[level][key] = (end, max(old[1], hi, old[0]))

    def _timeline(self, stores: pl.DataFrame, removes: pl.DataFrame, deltas: pl.DataFrame) -> None:
        assert self.every_ns is not None
        ev = self.every_ns

        def bucket(c: str) -> pl.Expr:
            # Integer arithmetic on microseconds: float division would put rows right at a
            # bucket edge on either side depending on how polars evaluates it.
            # A ts that is not a finite number gets no bucket (strict=False: null).
            us = (pl.col(c) * 1e6).round().cast(pl.Int64, strict=False)
            if ev % 1000 == 0:  # whole microseconds: no overflow for any plausible ts
                return us.floordiv(ev // 1000)
            return (us * 1000).floordiv(ev)

        has = pl.col("hash").is_not_null()
        parts = [
            stores.filter(has).group_by(bucket("ts").alias("bucket"), "gkey").agg(
                stores=pl.len().cast(pl.Int64)
            ),
            removes.filter(has).group_by(bucket("ts").alias("bucket"), "gkey").agg(
                removes=pl.len().cast(pl.Int64)
            ),
            deltas.filter(pl.col("gkey").is_not_null())
            .group_by(bucket("t").alias("bucket"), "gkey").agg(
                delta=pl.col("delta").sum()
            ),
        ]
        chunk = pl.concat(parts, how="diagonal").filter(pl.col("bucket").is_not_null()).fill_null(0)
        self.timeline = (
            pl.concat([self.timeline, chunk], how="diagonal")
            .fill_null(0)
            .group_by("bucket", "gkey")
            .agg(pl.col("stores").sum(), pl.col("removes").sum(), pl.col("delta").sum())
        )

    # -- removes without group_idx on channels whose stores have one ----------------------

    def _resolve_ungrouped(self, df: pl.DataFrame) -> pl.DataFrame:
        """Sequentially attribute removes without group_idx by the (hash → group) state."""
        chans = list(self.grouped_channels)
        rows = df.filter(pl.col("channel_id").is_in(chans) & (
            (pl.col("type_code") == CLEARED) | pl.col("hash").is_not_null()
        )).select("r", "channel_id", "type_code", "gk", "group_idx", "hash", "kind",
                  "sliding_window", "event_index")
        count: dict[tuple[int, int, int], int] = {}
        kinds: dict[tuple[int, int, int], tuple[str | None, int | None]] = {}

        groups_of: dict[tuple[int, int], set[int]] = {}
        by_gkey = {i: (k, w) for (_g, k, w), i in self.registry.items()}
        live = self.live.select(
            channel_id=(pl.col("ck") // _CK).cast(pl.UInt32),
            gk=pl.col("ck") % _CK - 1,
            hash="hash",
            gkey="gkey",
        )
        for cid, gk, h, gkey in live.filter(pl.col("channel_id").is_in(chans)).iter_rows():
            count[(cid, gk, h)] = count.get((cid, gk, h), 0) + 1
            groups_of.setdefault((cid, h), set()).add(gk)
            k0, w0 = by_gkey[gkey]
            kinds[(cid, gk, h)] = (None if k0 == UNANNOTATED else k0, w0)
        out: list[tuple[int, int | None, str | None, int | None, bool, bool]] = []
        for r, cid, t, gk, g, h, k, w, e in rows.iter_rows():
            if t == CLEARED:
                for ckey in [ck for ck in count if ck[0] == cid]:
                    del count[ckey]
                for hkey in [hk for hk in groups_of if hk[0] == cid]:
                    del groups_of[hkey]
                continue
            if t == STORED:
                key = (cid, gk, h)
                count[key] = count.get(key, 0) + 1
                kinds[key] = (k, w)
                groups_of.setdefault((cid, h), set()).add(gk)
                continue
            if g is None:
                cands = [x for x in groups_of.get((cid, h), ()) if count.get((cid, x, h), 0) > 0]
                if len(cands) == 1:
                    gk = cands[0]
                    # The group's kind (metadata or learned); else what its store said.
                    known = self.group_kind(cid, gk, e) if self.group_kind and gk >= 0 else None
                    k2, w2 = known if known is not None else kinds.get((cid, gk, h), (k, w))
                    out.append((r, gk, k2, w2, False, False))
                else:
                    # Live in no group (orphan) or several (ambiguous): unattributed.
                    if len(cands) > 1:
                        self.ambiguous_removes += 1
                    out.append((r, None, None, None, True, not cands))
                    continue
            key = (cid, gk, h)
            c = count.get(key, 0)
            if c > 0:
                count[key] = c - 1
                if c == 1:
                    groups_of.get((cid, h), set()).discard(gk)
        return pl.DataFrame(
            out,
            schema={"r": pl.Int64, "res_gk": pl.Int64, "res_kind": pl.String,
                    "res_window": pl.Int64, "res_exempt": pl.Boolean, "res_orphan": pl.Boolean},
            orient="row",
        )

    # -- the result ----------------------------------------------------------------------

    def _lifetime_frame(self) -> pl.DataFrame:
        """(gkey, lifetime_s, n) rows: exact values (n=1) or histogram bin centres."""
        if self.hist is not None:
            return self.hist.select(
                "gkey", lifetime_s=_hist_centre(pl.col("bin")), n="n"
            )
        if not self.lifetimes:
            return pl.DataFrame(schema={"gkey": pl.UInt32, "lifetime_s": pl.Float64,
                                        "n": pl.Int64})
        return pl.concat(self.lifetimes).with_columns(n=pl.lit(1, pl.Int64))

    def tables(self) -> dict[str, pl.DataFrame]:
        """Return totals, by_kind, by_window, by_group as DataFrames.

        Returns:
            The four tables (totals: one row).
        """
        self._merge_distinct()
        self._distinct_counts: dict[tuple[int, ...], int] = {}
        reg = self._level_map()
        live_end = self.live.group_by("gkey").agg(live_blocks_end=pl.len().cast(pl.Int64))
        base = reg.join(self.counts, on="gkey", how="left").join(
            live_end, on="gkey", how="left"
        ).with_columns(
            *[pl.col(c).fill_null(0) for c in (*_ADDITIVE, "live_blocks_end")]
        ).filter(
            # A key every row of which moved elsewhere (e.g. orphans without group_idx).
            pl.any_horizontal(
                pl.col(c) != 0 for c in ("store_events", "blocks_stored", "remove_events",
                                         "blocks_removed", "blocks_cleared", "live_blocks_end")
            )
        ) if reg.height else reg.with_columns(
            *[pl.lit(0, pl.Int64).alias(c) for c in (*_ADDITIVE, "live_blocks_end")]
        )
        lts = self._lifetime_frame().join(reg.select("gkey", "L_kind", "L_window", "L_group",
                                                     "L_total"), on="gkey", how="left")
        members: dict[str, dict[object, list[int]]] = {}
        for _g, k, w, i in reg.select("group_idx", "kind_final", "sliding_window",
                                     "gkey").iter_rows():
            for level, key in (("L_kind", k), ("L_window", w), ("L_group", i), ("L_total", 0)):
                members.setdefault(level, {}).setdefault(key, []).append(i)
        out: dict[str, pl.DataFrame] = {}
        for level, name in (("total", "totals"), ("kind", "by_kind"), ("window", "by_window"),
                            ("group", "by_group")):
            col = f"L_{level}"
            agg = base.group_by(col).agg(
                *[pl.col(c).sum().cast(pl.Int64) for c in (*_ADDITIVE, "live_blocks_end")]
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
            q = _quantiles(lts, col)
            state = self.levels[level]
            peaks = pl.DataFrame(
                {col: list(state), "peak_live_blocks": [v[1] for v in state.values()]},
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
            ``time_s`` (bucket start, seconds after the first bucket), ``kind``, ``stores``,
            ``removes``, ``live_blocks``; None without ``every``.
        """
        if self.every_ns is None:
            return None
        reg = self._level_map().select("gkey", "L_kind")
        tl = self.timeline.join(reg, on="gkey", how="left").group_by("bucket", "L_kind").agg(
            pl.col("stores").sum(), pl.col("removes").sum(), pl.col("delta").sum()
        )
        if tl.height == 0:
            return pl.DataFrame(schema={"time_s": pl.Float64, "kind": pl.String,
                                        "stores": pl.Int64, "removes": pl.Int64,
                                        "live_blocks": pl.Int64})
        b0, b1 = tl["bucket"].min(), tl["bucket"].max()
        assert isinstance(b0, int) and isinstance(b1, int)
        kinds = tl["L_kind"].unique().sort()
        if b1 - b0 < MAX_DENSE_BUCKETS:
            buckets = pl.int_range(b0, b1 + 1, eager=True)
        else:
            # A ts far off (a garbage batch) would make a dense grid enormous: list only
            # the buckets that hold events.
            buckets = tl["bucket"].unique().sort()
        grid = pl.DataFrame({"bucket": buckets}).join(
            pl.DataFrame({"L_kind": kinds}), how="cross"
        )
        full = (
            grid.join(tl, on=["bucket", "L_kind"], how="left")
            .fill_null(0)
            .sort("L_kind", "bucket")
            .with_columns(live_blocks=pl.col("delta").cum_sum().over("L_kind"))
        )
        return full.select(
            time_s=((pl.col("bucket") - b0).cast(pl.Float64) * (self.every_ns / 1e9)).round(9),
            kind=pl.col("L_kind"),
            stores="stores",
            removes="removes",
            live_blocks="live_blocks",
        ).sort("time_s", "kind")


def _sorted_union(parts: list[pl.Series]) -> pl.Series:
    """The sorted set union of Int64 series (numpy's sort-merge when available)."""
    if np is not None:
        return pl.Series("hash", np.unique(np.concatenate([p.to_numpy() for p in parts])))
    return pl.concat(parts).unique().sort()


def _hist_bin(lifetime_s: pl.Expr) -> pl.Expr:
    ns = (lifetime_s * 1e9).round().clip(lower_bound=0)
    return (
        pl.when(ns < 1)
        .then(pl.lit(-1, pl.Int64))
        .otherwise((ns.log(2) * _HIST_BINS_PER_OCTAVE).floor().cast(pl.Int64, strict=False))
    )


def _hist_centre(b: pl.Expr) -> pl.Expr:
    return (
        pl.when(b < 0)
        .then(0.0)
        .otherwise((2.0 ** ((b.cast(pl.Float64) + 0.5) / _HIST_BINS_PER_OCTAVE)) / 1e9)
    )


def _quantiles(lts: pl.DataFrame, col: str) -> pl.DataFrame:
    """p50/p90/p99 per level key from (lifetime_s, n) rows."""
    if lts.height == 0:
        return pl.DataFrame(schema={col: lts.schema[col],
                                    **{c: pl.Float64 for c in LIFETIME_COLUMNS}})
    if lts["n"].max() == 1 and lts["n"].min() == 1:
        return lts.group_by(col).agg(
            lifetime_p50_s=pl.col("lifetime_s").quantile(0.5, "linear").round(6),
            lifetime_p90_s=pl.col("lifetime_s").quantile(0.9, "linear").round(6),
            lifetime_p99_s=pl.col("lifetime_s").quantile(0.99, "linear").round(6),
        )
    # Histogram: the first bin whose cumulative count reaches q of the total.
    s = lts.sort(col, "lifetime_s").with_columns(
        cum=pl.col("n").cum_sum().over(col), tot=pl.col("n").sum().over(col)
    )
    exprs = []
    for q, name in ((0.5, "lifetime_p50_s"), (0.9, "lifetime_p90_s"), (0.99, "lifetime_p99_s")):
        exprs.append(
            pl.col("lifetime_s").filter(pl.col("cum") >= pl.col("tot") * q).first().alias(name)
        )
    return s.group_by(col).agg(*exprs)


def _findings(rep: dict[str, pl.DataFrame], builder: ReportBuilder,
              annotator: TableAnnotator, stats: ReadStats) -> list[str]:
    out: list[str] = []
    tot = rep["totals"].to_dicts()[0]
    by_kind = {r["kind"]: r for r in rep["by_kind"].to_dicts()}
    stored = tot["blocks_stored"]
    un = by_kind.get(UNANNOTATED, {})
    if stored and un.get("blocks_stored", 0) == stored:
        if builder.grouped_channels:
            out.append(
                "no store was annotated with a kind: pass the group metadata with "
                "--groups FILE (get_kv_cache_group_metadata()) or --group IDX=KIND[:WINDOW]"
            )
        else:
            out.append(
                "no store carries group_idx or a kind (vLLM < 0.21): kinds cannot be known; "
                "every block is reported as unannotated"
            )
    removed = tot["blocks_removed"]
    unattr = by_kind.get(UNATTRIBUTED, {}).get("blocks_removed", 0)
    unann = by_kind.get(UNANNOTATED, {}).get("blocks_removed", 0)
    if removed and unattr + unann == removed:
        out.append(
            f"no remove could be attributed to a kind ({unattr} unattributed, {unann} "
            "unannotated): give the group metadata (--groups/--group)"
        )
    elif unattr:
        out.append(
            f"{unattr} removed block(s) without group_idx could not be attributed "
            "(hash live in no group or in several): reported as unattributed"
        )
    names = {cid: ref.info.name for cid, ref in stats.channels.items()}
    for cid, g, before, after in sorted(annotator.changes, key=str):
        out.append(
            f"group {g} on {names.get(cid, cid)} changes kind mid-stream: "
            f"{_kw(before)} -> {_kw(after)}"
        )
    evicting = {k: r["blocks_removed"] for k, r in by_kind.items()
                if r["blocks_removed"] and k not in (UNATTRIBUTED, UNANNOTATED)}
    if evicting:
        for k, r in by_kind.items():
            if k in (UNATTRIBUTED, UNANNOTATED) or k in evicting or not r["blocks_stored"]:
                continue
            other = ", ".join(f"{o} {n}" for o, n in sorted(evicting.items()))
            out.append(
                f"{k} stored {r['blocks_stored']} blocks but none was evicted while others "
                f"evicted ({other}): its removes may be missing from the stream"
            )
    if tot["orphan_removes"]:
        out.append(
            f"{tot['orphan_removes']} removed block(s) were not live (the stream began "
            "mid-way or batches were lost): counted as orphan_removes"
        )
    for g, n in sorted(annotator.out_of_range.items()):
        out.append(f"Group index `{g}` not in KV cache metadata ({n} store(s) left unannotated)")
    if stats.bad_batches or stats.skipped_events:
        out.append(
            f"skipped {stats.bad_batches} malformed payload(s) and {stats.skipped_events} "
            "undecodable event(s)" + (f"; first: {stats.problems[0]}" if stats.problems else "")
        )
    out.extend(stats.lost)
    out.extend(stats.damaged)
    out.extend(annotator.findings(stats))
    return out


def _kw(kw: tuple[str, int | None]) -> str:
    k, w = kw
    return k + (f" window {w}" if w is not None else "")


def build_report(
    paths: Sequence[str | os.PathLike[str]],
    *,
    groups_file: str | os.PathLike[str] | None = None,
    group_flags: Sequence[str] | None = None,
    every_ns: int | None = None,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
) -> Report:
    """Read recordings (several: one combined report) and build the report, streaming.

    Args:
        paths: Recordings.
        groups_file: ``--groups FILE``.
        group_flags: ``--group IDX=KIND[:WINDOW]`` flags.
        every_ns: Timeline bucket in ns, or None.
        chunk_bytes: Payload bytes per chunk.

    Returns:
        The report.

    Raises:
        RecordingError: A recording cannot be opened.
        MetadataError: Invalid group metadata.
    """
    stats = ReadStats()
    annotator = make_annotator(recording_groups(paths), groups_file=groups_file,
                               group_flags=group_flags)
    builder = ReportBuilder(every_ns, annotator.group_kind)
    chunks = iter_tables(paths, stats=stats, chunk_bytes=chunk_bytes, labels=False)
    for chunk in prefetch(chunks):
        builder.add(annotator(chunk, stats))
    return finish_report(builder, annotator, stats)


def report_from_chunks(
    chunks: Iterable[pl.DataFrame],
    *,
    stats: ReadStats | None = None,
    annotator: TableAnnotator | None = None,
    every_ns: int | None = None,
) -> Report:
    """Build a report from table chunks already read (tests, other front ends).

    Args:
        chunks: Chunks of :func:`kvtool.columns.iter_tables`, in stream order.
        stats: The read's stats.
        annotator: Annotates each chunk (default: learn from the stream).
        every_ns: Timeline bucket in ns.

    Returns:
        The report.
    """
    st = stats if stats is not None else ReadStats()
    ann = annotator if annotator is not None else TableAnnotator()
    builder = ReportBuilder(every_ns, ann.group_kind)
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
    findings = _findings(tabs, builder, annotator, stats)
    dur = None
    if builder.first_ts is not None and builder.last_ts is not None:
        dur = builder.last_ts - builder.first_ts
    source: dict[str, object] = {
        "recordings": list(stats.recordings),
        "channels": [
            {"recording": ref.recording, "channel": ref.info.name,
             "endpoint": ref.info.endpoint, "topic": ref.info.topic,
             "dp_rank": ref.info.dp_rank}
            for ref in stats.channels.values()
        ],
        "group_metadata": annotator.sources(),
        "batches": stats.messages,
        "events": stats.events,
        "block_rows": stats.rows,
        "duration_s": dur,
        "lifetimes": "exact" if builder.hist is None else
        f"log histogram, {_HIST_BINS_PER_OCTAVE} bins per doubling",
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
        timeline=builder.timeline_frame(),
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
    "build_report",
    "finish_report",
    "report_from_chunks",
]

