"""The live-block state: a multiset over (channel, group, hash), advanced one chunk at a time.

DESIGN.md "Report semantics": +1 per stored hash, -1 per removed hash, never below zero;
a store of a live key is *restored*, a remove of a key that is not live is an *orphan*;
``AllBlocksCleared`` empties its channel. Lifetimes pair the j-th effective remove of a
key with its j-th store (first in, first out).

The vectorised trick (one lazy polars query per chunk, no Python per block):

1. The entries still live from earlier chunks (``carried``, one row per live entry, in
   stream order) and this chunk's block rows (stores +1, removes -1) are stable-sorted by
   the key (hash, channel, group) so each key's rows are contiguous and keep their
   stream order; within a key, the clear *epoch* (how many ``AllBlocksCleared`` of the
   channel came before) splits the rows further. One contiguous run of rows is a
   *segment*: one key in one epoch.
2. A prefix sum of the deltas, minus its value at the segment's start, gives each row's
   *unclamped* count (stores minus removes so far in the segment). The multiset never
   goes below zero, so the real count is the unclamped count minus the lowest value the
   unclamped count reached so far (when negative): a segmented running minimum. It is a
   single ``cum_min`` over the whole chunk after subtracting ``segment * stride`` from each
   value (``stride`` larger than any count), which keeps earlier segments from leaking
   into later ones.
3. A remove whose count before it is 0 is an orphan; a store whose count before it is
   above 0 is a restore; every other remove is *effective*. The k-th effective remove of
   a segment pairs with the k-th store of the segment (FIFO): both are numbered by prefix
   sums, so the pairing is an index (``gather``), not a join.
4. Stores numbered beyond the segment's effective removes survive; those in the
   channel's last epoch are the new carried state, the others were dropped by a clear.

Keys are real composite keys (``channel_id``, ``group_idx``, ``hash``) in separate
columns; a null ``group_idx`` (older vLLM) is its own group.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import polars as pl

from kvtool.columns import np

LIVE_SCHEMA: dict[str, pl.DataType] = {
    "row": pl.Int64(),
    "channel_id": pl.UInt32(),
    "group_idx": pl.Int64(),
    "hash": pl.Int64(),
    "store_ts": pl.Float64(),
    "gkey": pl.UInt32(),
}
"""One row per live entry carried between chunks: its stream row, key, store time, and
``gkey`` (the report row it was stored under)."""

BLOCK_SCHEMA: dict[str, pl.DataType] = {
    "row": pl.Int64(),
    "channel_id": pl.UInt32(),
    "group_idx": pl.Int64(),
    "hash": pl.Int64(),
    "epoch": pl.Int64(),
    "ts": pl.Float64(),
    "delta": pl.Int64(),
    "carried": pl.Boolean(),
    "gkey": pl.UInt32(),
    "no_group": pl.Boolean(),
    "first_block": pl.Boolean(),
}
"""Input rows of :func:`advance`: this chunk's stores (+1) and removes (-1) with hashes."""

_KEY = ("hash", "channel_id", "group_idx")


@dataclass
class LiveStep:
    """What one chunk did to the live state.

    Attributes:
        blocks: The chunk's block rows with ``orphan`` and ``restored`` flags (sorted by key).
        pairs: One row per effective remove: ``row``, ``remove_ts``, ``remove_gkey`` and
            the ``store_ts`` and ``gkey`` of the entry it removed.
        live: The entries live after the chunk (:data:`LIVE_SCHEMA`, in stream order).
        dropped: Entries an ``AllBlocksCleared`` in this chunk dropped: ``channel_id``,
            ``epoch`` (the clear that dropped them is the channel's ``epoch``-th), ``gkey``.
        new_stores: This chunk's stores (``gkey``, ``hash``), for distinct hashes.
    """

    blocks: pl.DataFrame
    pairs: pl.DataFrame
    live: pl.DataFrame
    dropped: pl.DataFrame
    new_stores: pl.DataFrame


_SIGN = 1 << 63
_DIGIT = 0xFFFF


def _stable_order(keys: list[Any]) -> Any:
    """The stable sort order of rows by ``keys`` (numpy arrays, last key primary).

    A least-significant-digit radix sort: one stable ``argsort`` per key, least
    significant first, each on the rows as the earlier passes ordered them. numpy sorts
    16-bit integers stably by radix (linear time), and any other dtype by timsort, so the
    caller passes 16-bit digits where it can.
    """
    order = np.argsort(keys[0], kind="stable")
    for key in keys[1:]:
        order = order[np.argsort(key[order], kind="stable")]
    return order


def _small(values: Any) -> Any:
    """``values`` as uint16 if they all fit (radix-sortable), else unchanged."""
    if values.min() >= 0 and values.max() <= _DIGIT:
        return values.astype(np.uint16)
    return values


def _sort_by_key(rows: pl.DataFrame) -> pl.DataFrame:
    """Stable sort by (hash, channel_id, group_idx), null groups first.

    The order is exactly that of ``np.lexsort`` over the separate key columns (group with
    nulls first, then channel, then hash as the primary key): no packed key, any int64
    value. The signed hash is sorted as four 16-bit digits of its bits with the sign
    flipped (which orders them as signed values), each digit a linear-time radix pass;
    a key that is constant over the rows is left out (it does not change a stable
    order). Only contiguity of each key and stream order inside it matter to the state
    step, but keeping lexsort's order keeps every downstream sum in the same order.
    """
    if np is None or rows.height == 0:
        return rows.sort(list(_KEY), maintain_order=True)
    g = rows["group_idx"]
    c = rows["channel_id"]
    keys: list[Any] = []
    if g.null_count():
        keys += [g.fill_null(0).to_numpy(), g.is_not_null().to_numpy()]
    elif g.n_unique() > 1:
        keys.append(_small(g.to_numpy()))
    if c.n_unique() > 1:
        keys.append(_small(c.to_numpy()))
    h = rows["hash"].to_numpy().view(np.uint64) ^ np.uint64(_SIGN)
    keys += [((h >> np.uint64(s)) & np.uint64(_DIGIT)).astype(np.uint16) for s in (0, 16, 32, 48)]
    out: pl.DataFrame = rows[_stable_order(keys)]
    return out


def advance(blocks: pl.DataFrame, live: pl.DataFrame, final_epoch: pl.DataFrame) -> LiveStep:
    """Advance the multiset by one chunk (see the module docstring for the method).

    Args:
        blocks: This chunk's block rows (:data:`BLOCK_SCHEMA`), in stream order.
        live: The entries live before the chunk (:data:`LIVE_SCHEMA`), in stream order.
        final_epoch: ``channel_id`` → ``final_epoch``: the number of clears of each
            channel in this chunk (entries of earlier epochs were dropped by a clear).

    Returns:
        The step's flags, FIFO pairs and the new live state.
    """
    carried = live.select(
        "row",
        "channel_id",
        "group_idx",
        "hash",
        epoch=pl.lit(0, pl.Int64),
        ts="store_ts",
        delta=pl.lit(1, pl.Int64),
        carried=pl.lit(True),
        gkey="gkey",
        no_group=pl.lit(False),
        first_block=pl.lit(False),
    )
    rows = pl.concat([carried, blocks.select(list(BLOCK_SCHEMA))])
    # Carried entries are older than the chunk's rows and both parts are in stream order,
    # so a stable sort by the key keeps stream order inside each key.
    rows = _sort_by_key(rows)
    stride = 2 * rows.height + 2
    is_store = (pl.col("delta") > 0).cast(pl.Int64)

    def at_segment_start(expr: pl.Expr) -> pl.Expr:
        """The value of ``expr`` just before the segment's first row, on every row."""
        return pl.when("segment_start").then(expr).forward_fill()

    flagged = (
        rows.lazy()
        .with_columns(
            segment_start=pl.any_horizontal(
                pl.col(c).ne_missing(pl.col(c).shift(1)) for c in (*_KEY, "epoch")
            ).fill_null(True),
            running_sum=pl.col("delta").cum_sum(),
            running_stores=is_store.cum_sum(),
        )
        .with_columns(
            segment_end=pl.col("segment_start").shift(-1).fill_null(True),
            segment=pl.col("segment_start").cast(pl.Int64).cum_sum(),
            sum_before_segment=at_segment_start(pl.col("running_sum") - pl.col("delta")),
            stores_before_segment=at_segment_start(pl.col("running_stores") - is_store),
        )
        .with_columns(unclamped=pl.col("running_sum") - pl.col("sum_before_segment"))
        .with_columns(
            # Segmented running minimum: one cum_min over the chunk, each segment shifted
            # below all earlier ones by segment * stride.
            segment_min=(pl.col("unclamped") - pl.col("segment") * stride).cum_min()
            + pl.col("segment") * stride
        )
        .with_columns(count=pl.col("unclamped") - pl.min_horizontal("segment_min", pl.lit(0)))
        .with_columns(
            count_before=pl.when("segment_start").then(0).otherwise(pl.col("count").shift(1))
        )
        .with_columns(
            orphan=(pl.col("delta") < 0) & (pl.col("count_before") == 0),
            restored=(pl.col("delta") > 0) & ~pl.col("carried") & (pl.col("count_before") > 0),
        )
        .with_columns(effective_remove=((pl.col("delta") < 0) & ~pl.col("orphan")).cast(pl.Int64))
        .with_columns(running_removes=pl.col("effective_remove").cum_sum())
        .with_columns(
            removes_before_segment=at_segment_start(
                pl.col("running_removes") - pl.col("effective_remove")
            )
        )
        .with_columns(
            # The k-th effective remove of a segment pairs with its k-th store: its index
            # among all the chunk's stores (sorted order).
            store_index=pl.col("stores_before_segment")
            + pl.col("running_removes")
            - pl.col("removes_before_segment")
            - 1,
            segment_removes=pl.when("segment_end").then(pl.col("running_removes")).backward_fill()
            - pl.col("removes_before_segment"),
        )
        .select(
            "row",
            "channel_id",
            "group_idx",
            "hash",
            "epoch",
            "ts",
            "delta",
            "carried",
            "gkey",
            "no_group",
            "first_block",
            "running_stores",
            "stores_before_segment",
            "orphan",
            "restored",
            "effective_remove",
            "store_index",
            "segment_removes",
        )
        .collect()
    )
    stores = flagged.filter(pl.col("delta") > 0)
    removes = flagged.filter(pl.col("effective_remove") == 1)
    index = removes["store_index"]
    pairs = pl.DataFrame(
        {
            "row": removes["row"],
            "remove_ts": removes["ts"],
            "remove_gkey": removes["gkey"],
            "store_ts": stores["ts"].gather(index),
            "gkey": stores["gkey"].gather(index),
        }
    )
    survivors = (
        stores.lazy()
        .filter(
            pl.col("running_stores") - 1 - pl.col("stores_before_segment")
            >= pl.col("segment_removes")
        )
        .join(final_epoch.lazy(), on="channel_id", how="left")
        .with_columns(pl.col("final_epoch").fill_null(0))
        .collect()
    )
    new_live = (
        survivors.filter(pl.col("epoch") == pl.col("final_epoch"))
        .select("row", "channel_id", "group_idx", "hash", store_ts="ts", gkey="gkey")
        .sort("row")
    )
    dropped = survivors.filter(pl.col("epoch") < pl.col("final_epoch")).select(
        "channel_id", epoch=pl.col("epoch") + 1, gkey="gkey", store_ts="ts"
    )
    new_stores = stores.filter(~pl.col("carried")).select("gkey", "hash")
    return LiveStep(flagged, pairs, new_live, dropped, new_stores)
