"""The live-block state: a multiset over (channel, group, hash), advanced one chunk at a time.

DESIGN.md "Report semantics": +1 per stored hash, -1 per removed hash, never below zero;
a store of a live key is *restored*, a remove of a key that is not live is an *orphan*;
``AllBlocksCleared`` empties its channel. Lifetimes pair the j-th effective remove of a
key with its j-th store (first in, first out).

The vectorised trick (a few whole-array numpy passes per chunk, no Python per block):

1. The entries still live from earlier chunks (:class:`Live`, one per live entry, sorted
   by key with stream order inside a key) and this chunk's block rows (stores +1,
   removes -1, in stream order) are stable-sorted by the key (hash, channel, group) so
   each key's rows are contiguous and keep their stream order (carried entries first:
   they are older); within a key, the clear *epoch* (how many ``AllBlocksCleared`` of the
   channel came before in the chunk) splits the rows further. One contiguous run of rows
   is a *segment*: one key in one epoch.
2. A prefix sum of the deltas, minus its value at the segment's start, gives each row's
   *unclamped* count (stores minus removes so far in the segment). The multiset never
   goes below zero, so the real count is the unclamped count minus the lowest value the
   unclamped count reached so far (when negative): a segmented running minimum. It is a
   single ``minimum.accumulate`` over the chunk after subtracting ``segment * stride``
   from each value (``stride`` larger than any count), which keeps earlier segments from
   leaking into later ones.
3. A remove whose count before it is 0 is an orphan; a store whose count before it is
   above 0 is a restore; every other remove is *effective*. The k-th effective remove of
   a segment pairs with the k-th store of the segment (FIFO): both are numbered by prefix
   sums, so the pairing is an index (a gather), not a join.
4. The stores no remove paired survive (the first k stores of a segment are the paired
   ones); those in the channel's last epoch are the new live state, already in key
   order, the others were dropped by a clear.

Keys are real composite keys (``channel_id``, ``group_idx``, ``hash``) in separate
arrays; a null ``group_idx`` (older vLLM) is its own group (``no_group``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import polars as pl

from kvtool.columns import np

if TYPE_CHECKING:
    from numpy.typing import NDArray

LIVE_SCHEMA: dict[str, pl.DataType] = {
    "row": pl.Int64(),
    "channel_id": pl.UInt32(),
    "group_idx": pl.Int64(),
    "hash": pl.Int64(),
    "store_ts": pl.Float64(),
    "gkey": pl.UInt32(),
}
"""The live entries as a DataFrame (:meth:`Live.frame`): one row per live entry, its
stream row, key, store time, and ``gkey`` (the report row it was stored under)."""

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

_I64 = "int64"


def _i64(values: Any) -> NDArray[Any]:
    return np.asarray(values, dtype=_I64)


@dataclass
class Live:
    """The live entries: one per cached block, sorted by key, stream order inside a key.

    The key order is that of :func:`key_order` (hash, then channel, then group, null
    groups first); entries of one key keep the order they were stored in, which is what
    FIFO lifetimes pair removes with. This is the whole state carried between chunks.

    Attributes:
        row: Stream row of the store (the builder's ``row`` numbering).
        channel_id: Channel.
        group_idx: Group (0 where ``no_group``).
        no_group: The store had no ``group_idx`` (older vLLM).
        hash: Block hash.
        store_ts: Store time (float seconds).
        gkey: Report row the entry was stored under.
    """

    row: NDArray[Any]
    channel_id: NDArray[Any]
    group_idx: NDArray[Any]
    no_group: NDArray[Any]
    hash: NDArray[Any]
    store_ts: NDArray[Any]
    gkey: NDArray[Any]

    @classmethod
    def empty(cls) -> Live:
        """Return a state with no entries."""
        z = np.zeros(0, dtype=_I64)
        return cls(z, z, z, np.zeros(0, dtype=bool), z, np.zeros(0), z)

    def __len__(self) -> int:
        return len(self.row)

    def frame(self) -> pl.DataFrame:
        """Return the entries as a DataFrame (:data:`LIVE_SCHEMA`, null group restored)."""
        group = pl.Series("group_idx", self.group_idx, dtype=pl.Int64)
        if self.no_group.any():
            group = group.scatter(np.flatnonzero(self.no_group), None)
        return pl.DataFrame(
            {
                "row": self.row,
                "channel_id": pl.Series(self.channel_id, dtype=pl.UInt32),
                "group_idx": group,
                "hash": self.hash,
                "store_ts": self.store_ts,
                "gkey": pl.Series(self.gkey, dtype=pl.UInt32),
            },
            schema=LIVE_SCHEMA,
        )


@dataclass
class Blocks:
    """One chunk's block rows (stores and removes with a hash), in stream order.

    Attributes:
        row: Stream row.
        channel_id: Channel.
        group_idx: Group (0 where ``no_group``).
        no_group: No ``group_idx``.
        hash: Block hash.
        epoch: Clears of the channel before the row in this chunk.
        ts: Time (float seconds).
        store: True for a store (+1), False for a remove (-1).
        gkey: Report row.
    """

    row: NDArray[Any]
    channel_id: NDArray[Any]
    group_idx: NDArray[Any]
    no_group: NDArray[Any]
    hash: NDArray[Any]
    epoch: NDArray[Any]
    ts: NDArray[Any]
    store: NDArray[Any]
    gkey: NDArray[Any]

    def __len__(self) -> int:
        return len(self.row)


@dataclass
class Step:
    """What one chunk did to the live state (indices are into the chunk's :class:`Blocks`).

    Attributes:
        orphan: Per block row: a remove of a key that was not live.
        restored: Per block row: a store of a key that was already live.
        remove: Block index of each effective remove (FIFO pair), in key order.
        store_ts: Store time of the entry each of those removes removed.
        store_gkey: Report row of that entry.
        live: The entries live after the chunk.
        dropped_channel: Channel of each entry a clear in this chunk dropped.
        dropped_epoch: The clear that dropped it is the channel's ``dropped_epoch``-th
            of the chunk (1-based).
        dropped_gkey: Report row of the dropped entry.
    """

    orphan: NDArray[Any]
    restored: NDArray[Any]
    remove: NDArray[Any]
    store_ts: NDArray[Any]
    store_gkey: NDArray[Any]
    live: Live
    dropped_channel: NDArray[Any]
    dropped_epoch: NDArray[Any]
    dropped_gkey: NDArray[Any]


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


def _constant(values: Any) -> bool:
    return len(values) == 0 or bool((values == values[0]).all())


def key_order(hash_: Any, channel: Any, group: Any, no_group: Any) -> Any:
    """The stable sort order of rows by (hash, channel_id, group_idx), null groups first.

    The order is exactly that of ``np.lexsort`` over the separate key columns (group with
    nulls first, then channel, then hash as the primary key): no packed key, any int64
    value. The signed hash is sorted as four 16-bit digits of its bits with the sign
    flipped (which orders them as signed values), each digit a linear-time radix pass;
    a key that is constant over the rows is left out (it does not change a stable
    order).

    Args:
        hash_: Int64 hashes.
        channel: Channel ids.
        group: Groups (any value where ``no_group``).
        no_group: True for a null group.

    Returns:
        The permutation.
    """
    if len(hash_) == 0:
        return np.zeros(0, dtype=np.intp)
    keys: list[Any] = []
    if no_group.any():
        keys += [np.where(no_group, 0, group), ~no_group]
    elif not _constant(group):
        keys.append(_small(group))
    if not _constant(channel):
        keys.append(_small(channel))
    h = hash_.view(np.uint64) ^ np.uint64(_SIGN)
    keys += [((h >> np.uint64(s)) & np.uint64(_DIGIT)).astype(np.uint16) for s in (0, 16, 32, 48)]
    return _stable_order(keys)


def _changes(values: Any, out: Any) -> None:
    """``out[1:] |= values[1:] != values[:-1]`` unless ``values`` is constant."""
    if not _constant(values):
        out[1:] |= values[1:] != values[:-1]


def step(live: Live, blocks: Blocks, final_epoch: Any) -> Step:
    """Advance the multiset by one chunk (see the module docstring for the method).

    Args:
        live: The entries live before the chunk.
        blocks: This chunk's block rows, in stream order.
        final_epoch: Indexed by ``channel_id``: the number of clears of each channel in
            this chunk (entries of earlier epochs were dropped by a clear); at least as
            long as the largest channel id of ``live`` and ``blocks`` plus one.

    Returns:
        The step's flags, FIFO pairs and the new live state.
    """
    n_live, n_blocks = len(live), len(blocks)
    m = n_live + n_blocks
    empty_b = np.zeros(n_blocks, dtype=bool)
    if m == 0:
        z = np.zeros(0, dtype=_I64)
        return Step(empty_b, empty_b, z, np.zeros(0), z, live, z, z, z)

    def both(a: Any, b: Any) -> Any:
        return np.concatenate([a, b]) if n_live else b

    h_all = both(live.hash, blocks.hash)
    c_all = both(live.channel_id, blocks.channel_id)
    g_all = both(live.group_idx, blocks.group_idx)
    ng_all = both(live.no_group, blocks.no_group)
    # Carried entries are older than the chunk's rows and both parts are in stream order
    # (inside a key), so a stable sort by the key keeps stream order inside each key.
    src = key_order(h_all, c_all, g_all, ng_all)
    h, c, g, ng = h_all[src], c_all[src], g_all[src], ng_all[src]
    ep = both(np.zeros(n_live, dtype=_I64), blocks.epoch)[src]
    is_store = both(np.ones(n_live, dtype=bool), blocks.store)[src]

    start = np.zeros(m, dtype=bool)
    start[0] = True
    start[1:] = h[1:] != h[:-1]
    for values in (c, g, ng, ep):
        _changes(values, start)
    first = np.flatnonzero(start)
    seg = np.cumsum(start) - 1
    delta = np.where(is_store, 1, -1)
    running = np.cumsum(delta)
    unclamped = running - (running - delta)[first][seg]
    # Segmented running minimum: one pass over the chunk, each segment shifted below all
    # earlier ones by segment * stride.
    shift = seg * (2 * m + 2)
    seg_min = np.minimum.accumulate(unclamped - shift) + shift
    count = unclamped - np.minimum(seg_min, 0)
    count_before = np.empty(m, dtype=count.dtype)
    count_before[0] = 0
    count_before[1:] = count[:-1]
    count_before[first] = 0
    orphan = ~is_store & (count_before == 0)
    restored = is_store & (src >= n_live) & (count_before > 0)
    effective = ~is_store & ~orphan

    # FIFO: the k-th effective remove of a segment pairs with the segment's k-th store.
    stores_run = np.cumsum(is_store)
    removes_run = np.cumsum(effective)
    stores_before = (stores_run - is_store)[first]
    removes_before = (removes_run - effective)[first]
    store_pos = np.flatnonzero(is_store)
    remove_pos = np.flatnonzero(effective)
    rseg = seg[remove_pos]
    paired = store_pos[stores_before[rseg] + removes_run[remove_pos] - removes_before[rseg] - 1]

    ts_all = both(live.store_ts, blocks.ts)
    gkey_all = both(live.gkey, blocks.gkey)
    row_all = both(live.row, blocks.row)
    paired_src = src[paired]

    out_orphan = empty_b.copy()
    out_orphan[src[orphan] - n_live] = True
    out_restored = empty_b.copy()
    out_restored[src[restored] - n_live] = True

    survives = is_store.copy()
    survives[paired] = False
    surv = np.flatnonzero(survives)
    fe = np.asarray(final_epoch)[c[surv]]
    keep = ep[surv] == fe
    kept, gone = surv[keep], surv[~keep]
    ks = src[kept]
    new_live = Live(row_all[ks], c[kept], g[kept], ng[kept], h[kept], ts_all[ks], gkey_all[ks])
    return Step(
        out_orphan,
        out_restored,
        src[remove_pos] - n_live,
        ts_all[paired_src],
        gkey_all[paired_src],
        new_live,
        c[gone],
        ep[gone] + 1,
        gkey_all[src[gone]],
    )


# -- the DataFrame face (tests, other front ends) ------------------------------------------


@dataclass
class LiveStep:
    """What one chunk did to the live state, as DataFrames (:func:`advance`).

    Attributes:
        blocks: The chunk's block rows with ``orphan`` and ``restored`` flags.
        pairs: One row per effective remove: ``row``, ``remove_ts``, ``remove_gkey`` and
            the ``store_ts`` and ``gkey`` of the entry it removed.
        live: The entries live after the chunk (:data:`LIVE_SCHEMA`, in key order).
        dropped: Entries an ``AllBlocksCleared`` in this chunk dropped: ``channel_id``,
            ``epoch`` (the clear that dropped them is the channel's ``epoch``-th), ``gkey``.
        new_stores: This chunk's stores (``gkey``, ``hash``), for distinct hashes.
    """

    blocks: pl.DataFrame
    pairs: pl.DataFrame
    live: pl.DataFrame
    dropped: pl.DataFrame
    new_stores: pl.DataFrame


def live_from_frame(live: pl.DataFrame) -> Live:
    """Return a :class:`Live` from a :data:`LIVE_SCHEMA` frame (re-sorted by key).

    Args:
        live: The entries, in stream order inside each key.

    Returns:
        The state.
    """
    g = live["group_idx"]
    state = Live(
        _i64(live["row"].to_numpy()),
        _i64(live["channel_id"].to_numpy()),
        _i64(g.fill_null(0).to_numpy()),
        g.is_null().to_numpy(),
        _i64(live["hash"].to_numpy()),
        np.asarray(live["store_ts"].to_numpy(), dtype=np.float64),
        _i64(live["gkey"].to_numpy()),
    )
    order = key_order(state.hash, state.channel_id, state.group_idx, state.no_group)
    return Live(*(getattr(state, f)[order] for f in Live.__dataclass_fields__))


def advance(blocks: pl.DataFrame, live: pl.DataFrame, final_epoch: pl.DataFrame) -> LiveStep:
    """Advance the multiset by one chunk, on DataFrames (a face of :func:`step`).

    Args:
        blocks: This chunk's block rows (:data:`BLOCK_SCHEMA`), in stream order.
        live: The entries live before the chunk (:data:`LIVE_SCHEMA`).
        final_epoch: ``channel_id`` → ``final_epoch``: the number of clears of each
            channel in this chunk (entries of earlier epochs were dropped by a clear).

    Returns:
        The step's flags, FIFO pairs and the new live state.
    """
    state = live_from_frame(live)
    g = blocks["group_idx"]
    b = Blocks(
        _i64(blocks["row"].to_numpy()),
        _i64(blocks["channel_id"].to_numpy()),
        _i64(g.fill_null(0).to_numpy()),
        g.is_null().to_numpy(),
        _i64(blocks["hash"].to_numpy()),
        _i64(blocks["epoch"].to_numpy()),
        np.asarray(blocks["ts"].to_numpy(), dtype=np.float64),
        blocks["delta"].to_numpy() > 0,
        _i64(blocks["gkey"].to_numpy()),
    )
    top = max(
        [
            0,
            *final_epoch["channel_id"].to_list(),
            *state.channel_id.tolist(),
            *b.channel_id.tolist(),
        ]
    )
    fe = np.zeros(int(top) + 1, dtype=_I64)
    for cid, e in final_epoch.select("channel_id", "final_epoch").iter_rows():
        fe[cid] = e
    s = step(state, b, fe)
    flagged = blocks.with_columns(orphan=pl.Series(s.orphan), restored=pl.Series(s.restored))
    removes = blocks[s.remove]
    pairs = pl.DataFrame(
        {
            "row": removes["row"],
            "remove_ts": removes["ts"],
            "remove_gkey": removes["gkey"],
            "store_ts": s.store_ts,
            "gkey": pl.Series(s.store_gkey, dtype=pl.UInt32),
        }
    )
    dropped = pl.DataFrame(
        {
            "channel_id": pl.Series(s.dropped_channel, dtype=pl.UInt32),
            "epoch": s.dropped_epoch,
            "gkey": pl.Series(s.dropped_gkey, dtype=pl.UInt32),
        }
    )
    new_stores = blocks.filter(pl.col("delta") > 0).select("gkey", "hash")
    return LiveStep(flagged, pairs, s.live.frame(), dropped, new_stores)
