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
    """The live entries: one per cached block.

    Entries of one key (channel, group, hash) are in the order they were stored in,
    which is what FIFO lifetimes pair removes with; the order between keys is arbitrary
    (:func:`step` leaves them grouped by key). This is the whole state carried between
    chunks; partial states of different channels concatenate.

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


_MIX_CHANNEL = 0x9E3779B1
_MIX_GROUP = 0x85EBCA77
_MIX_NO_GROUP = 0xC2B2AE3D
"""Odd 32-bit constants that spread channel and group over the bucket key's bits."""


def _constant(values: Any) -> bool:
    return len(values) == 0 or bool((values == values[0]).all())


def _changes(values: Any, out: Any) -> None:
    """``out[1:] |= values[1:] != values[:-1]`` unless ``values`` is constant."""
    if not _constant(values):
        out[1:] |= values[1:] != values[:-1]


def _lane(columns: list[Any]) -> Any:
    """The columns packed one-to-one into uint32 (offset, bit-shifted), or None if too wide."""
    if not columns:
        return None
    shift = 0
    lane = np.zeros(len(columns[0]), dtype=np.uint32)
    for values in columns:
        v = values.astype(np.int64)
        lo = int(v.min())
        bits = (int(v.max()) - lo).bit_length()
        if shift + bits > 32:
            return None
        lane |= (v - lo).astype(np.uint32) << np.uint32(shift)
        shift += bits
    return lane


def group_keys(hash_: Any, channel: Any, group: Any, no_group: Any) -> tuple[Any, Any]:
    """A stable order that makes each key (hash, channel, group) contiguous, and key starts.

    Rows are radix-sorted (two stable 16-bit passes: linear time) by a 32-bit *bucket
    key*: the hash's low 32 bits mixed with the channel and group. Equal keys have equal
    bucket keys, so each key is contiguous unless two keys share a bucket key (a few
    rows in a chunk of random hashes); those buckets are found by comparing each row
    with its neighbour and re-sorted by the full key, stably. Only contiguity and stream
    order inside a key matter to :func:`step`: the order between keys is arbitrary.

    Args:
        hash_: Int64 hashes.
        channel: Channel ids.
        group: Groups (any value where ``no_group``).
        no_group: True for a null group.

    Returns:
        The permutation, and per sorted row whether it starts a key.
    """
    m = len(hash_)
    if m == 0:
        return np.zeros(0, dtype=np.intp), np.zeros(0, dtype=bool)
    bucket = hash_.astype(np.uint32)
    parts = [hash_]
    lanes = [v for v in (channel, group, no_group) if not _constant(v)]
    lane = _lane(lanes)
    if lane is not None:
        # One-to-one in (channel, group, no_group) for a given hash: rows of one bucket
        # with the same hash hold the same key, so only the hash needs checking below.
        bucket ^= lane * np.uint32(_MIX_GROUP)
    else:
        for values, mix in zip(lanes, (_MIX_CHANNEL, _MIX_GROUP, _MIX_NO_GROUP), strict=False):
            bucket ^= values.astype(np.uint32) * np.uint32(mix)
            parts.append(values)
    order = np.argsort((bucket & np.uint32(0xFFFF)).astype(np.uint16), kind="stable")
    order = order[np.argsort((bucket >> np.uint32(16)).astype(np.uint16)[order], kind="stable")]
    sorted_bucket = bucket[order]
    start = np.empty(m, dtype=bool)
    start[0] = True
    np.not_equal(sorted_bucket[1:], sorted_bucket[:-1], out=start[1:])
    # Rows in the same bucket as the row before them: they must hold the same key.
    inner = np.flatnonzero(~start[1:]) + 1
    if len(inner) == 0:
        return order, start
    here, before = order[inner], order[inner - 1]
    differ = np.zeros(len(inner), dtype=bool)
    for values in parts:
        differ |= values[here] != values[before]
    if not differ.any():
        return order, start
    # Buckets holding several keys: re-sort their rows by the full key (stable, so a
    # key keeps stream order) inside the slots the bucket already occupies.
    run = np.cumsum(start) - 1
    firsts = np.flatnonzero(start)
    bad = np.unique(run[inner[differ]])
    lo = firsts[bad]
    hi = np.append(firsts, m)[bad + 1]
    lengths = hi - lo
    slots = np.repeat(lo - np.cumsum(lengths) + lengths, lengths) + np.arange(lengths.sum())
    rows = order[slots]
    sub = np.lexsort([values[rows] for values in reversed(parts)] + [run[slots]])
    rows = rows[sub]
    order[slots] = rows
    key_start = np.zeros(len(rows), dtype=bool)
    key_start[0] = True
    for values in parts:
        v = values[rows]
        key_start[1:] |= v[1:] != v[:-1]
    start[slots] = key_start | start[slots]
    return order, start


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
    src, start = group_keys(h_all, c_all, g_all, ng_all)
    is_store = both(np.ones(n_live, dtype=bool), blocks.store)[src]
    # A chunk with no clear has one epoch: nothing to split, nothing dropped.
    has_epochs = bool(np.asarray(final_epoch).any())
    ep = both(np.zeros(n_live, dtype=_I64), blocks.epoch)[src] if has_epochs else None
    if ep is not None:
        _changes(ep, start)
    first = np.flatnonzero(start)
    seg = np.cumsum(start) - 1
    # The running sum of the deltas (+1 store, -1 remove) comes from the running count of
    # stores: 2 * stores so far - rows so far (one prefix sum serves both).
    stores_run = np.cumsum(is_store)
    stores_before = stores_run[first] - is_store[first]
    running = 2 * stores_run - np.arange(1, m + 1)
    unclamped = running - (2 * stores_before - first)[seg]
    if unclamped.min() >= 0:
        # No remove of a key that is not live: nothing to clamp, no orphan, and the count
        # before a row is its count after minus its own +1/-1.
        orphan = np.zeros(m, dtype=bool)
        restored = is_store & (unclamped > 1)
        restored &= src >= n_live
        effective = ~is_store
    else:
        # Segmented running minimum: one pass over the chunk, each segment shifted below
        # all earlier ones by segment * stride.
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
    # Effective removes are numbered 0, 1, ... over the chunk; a segment's first one has
    # the number of those before the segment.
    store_pos = np.flatnonzero(is_store)
    remove_pos = np.flatnonzero(effective)
    rseg = seg[remove_pos]
    k = np.arange(len(remove_pos))
    if len(k):
        new_seg = np.empty(len(k), dtype=bool)
        new_seg[0] = True
        np.not_equal(rseg[1:], rseg[:-1], out=new_seg[1:])
        seg_first = np.flatnonzero(new_seg)
        k -= np.repeat(seg_first, np.diff(np.append(seg_first, len(k))))
    paired = store_pos[stores_before[rseg] + k]

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
    if ep is not None:
        keep = ep[surv] == np.asarray(final_epoch)[c_all[src[surv]]]
        kept, gone = surv[keep], surv[~keep]
    else:
        kept, gone = surv, surv[:0]
    ks, gs = src[kept], src[gone]
    new_live = Live(
        row_all[ks], c_all[ks], g_all[ks], ng_all[ks], h_all[ks], ts_all[ks], gkey_all[ks]
    )
    return Step(
        out_orphan,
        out_restored,
        src[remove_pos] - n_live,
        ts_all[paired_src],
        gkey_all[paired_src],
        new_live,
        c_all[gs],
        ep[gone] + 1 if ep is not None else np.zeros(0, dtype=_I64),
        gkey_all[gs],
    )


# -- the DataFrame face (tests, other front ends) ------------------------------------------


@dataclass
class LiveStep:
    """What one chunk did to the live state, as DataFrames (:func:`advance`).

    Attributes:
        blocks: The chunk's block rows with ``orphan`` and ``restored`` flags.
        pairs: One row per effective remove: ``row``, ``remove_ts``, ``remove_gkey`` and
            the ``store_ts`` and ``gkey`` of the entry it removed.
        live: The entries live after the chunk (:data:`LIVE_SCHEMA`, grouped by key).
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
    """Return a :class:`Live` from a :data:`LIVE_SCHEMA` frame.

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
    return state


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
