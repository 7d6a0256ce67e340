"""The state kernel (issue 19) against the polars state step of issue 10, and helpers."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import polars as pl
import pytest

from kvtool.report import arrays, kernel, samples
from kvtool.report.aggregates import Peaks

LIVE_SCHEMA: dict[str, pl.DataType] = {
    "row": pl.Int64(),
    "channel_id": pl.UInt32(),
    "group_idx": pl.Int64(),
    "hash": pl.Int64(),
    "store_ts": pl.Float64(),
    "gkey": pl.UInt32(),
}
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

_KEY = ("hash", "channel_id", "group_idx")

# -- the polars state step before issue 10, verbatim (the reference) ----------------------

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
    if rows.height == 0:
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


def _old_advance(
    blocks: pl.DataFrame, live: pl.DataFrame, final_epoch: pl.DataFrame
) -> tuple[pl.DataFrame, ...]:
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
    return flagged, pairs, new_live, dropped, new_stores


# -- random chunks --------------------------------------------------------------------------


def _random_run(seed: int) -> list[list[tuple[Any, ...]]]:
    """Chunks of (op, channel, group, hash, ts) ops: stores, removes, clears."""
    rng = random.Random(seed)
    hashes = [
        rng.choice([0, 1, -1, 2**63 - 1, -(2**63), 7 << 32, 7, rng.getrandbits(63)])
        for _ in range(rng.randint(1, 6))
    ]
    groups: list[int | None] = rng.choice([[None], [0], [0, 1, None], [0, 70000, -3]])
    chunks = []
    t = 0
    for _ in range(rng.randint(1, 5)):
        ops: list[tuple[Any, ...]] = []
        for _ in range(rng.randint(0, 60)):
            t += 1
            r = rng.random()
            cid = rng.randint(0, 2)
            if r < 0.05:
                ops.append(("C", cid, None, None, float(t)))
            else:
                op = "S" if r < 0.55 else "R"
                ops.append((op, cid, rng.choice(groups), rng.choice(hashes), float(t)))
        chunks.append(ops)
    return chunks


def _frames(
    ops: list[tuple[Any, ...]], first_row: int, gkey_of: dict[Any, int]
) -> tuple[pl.DataFrame, pl.DataFrame]:
    epochs: dict[int, int] = {0: 0, 1: 0, 2: 0}
    rows = []
    for i, (op, cid, g, h, ts) in enumerate(ops):
        if op == "C":
            epochs[cid] += 1
            continue
        gkey = gkey_of.setdefault((op, g), len(gkey_of))
        rows.append(
            (
                first_row + i,
                cid,
                g,
                h,
                epochs[cid],
                ts,
                1 if op == "S" else -1,
                False,
                gkey,
                g is None,
                True,
            )
        )
    blocks = pl.DataFrame(rows, schema=BLOCK_SCHEMA, orient="row")
    final = pl.DataFrame(
        {"channel_id": list(epochs), "final_epoch": list(epochs.values())},
        schema={"channel_id": pl.UInt32, "final_epoch": pl.Int64},
    )
    return blocks, final


def _rows(df: pl.DataFrame, cols: list[str]) -> list[tuple[Any, ...]]:
    return sorted(df.select(cols).iter_rows(), key=repr)


def _kernel_step(
    ks: kernel.State, ops: list[tuple[Any, ...]], first_row: int, gkey_of: dict[Any, int]
) -> dict[str, list[tuple[Any, ...]]]:
    """One chunk through the kernel, its outputs in the old step's terms."""
    code = {"S": kernel.STORE, "R": kernel.REMOVE, "C": kernel.CLEAR}
    n = len(ops)
    op = np.array([code[o[0]] for o in ops], dtype=np.int8)
    chan = np.array([o[1] for o in ops], dtype=np.int64)
    group = np.array([0 if o[2] is None else o[2] for o in ops], dtype=np.int64)
    no_group = np.array([o[2] is None for o in ops], dtype=bool)
    h = np.array([0 if o[3] is None else o[3] for o in ops], dtype=np.int64)
    ts = np.array([o[4] for o in ops], dtype=np.float64)
    gkey = np.array(
        [-1 if o[0] == "C" else gkey_of.setdefault((o[0], o[2]), len(gkey_of)) for o in ops],
        dtype=np.int64,
    )
    out = kernel.step(ks, op, chan, group, no_group, h, ts, gkey, len(gkey_of))
    epoch_of = {}
    epochs: dict[int, int] = {}
    for i, o in enumerate(ops):
        if o[0] == "C":
            epochs[o[1]] = epochs.get(o[1], 0) + 1
            epoch_of[i] = epochs[o[1]]
    what = out.what.tolist()
    got: dict[str, list[tuple[Any, ...]]] = {
        "flags": [
            (first_row + i, what[i] == kernel.ORPHAN, what[i] == kernel.WHILE_LIVE)
            for i in range(n)
            if ops[i][0] != "C"
        ],
        "pairs": [
            (first_row + i, float(ts[i]), int(gkey[i]), float(out.ts[i]), int(out.gkey[i]))
            for i in range(n)
            if what[i] == kernel.EVICTED
        ],
        "dropped": [
            (int(chan[r]), epoch_of[int(r)], int(g))
            for r, g, k in zip(out.drop_row, out.drop_gkey, out.drop_n, strict=True)
            for _ in range(int(k))
        ],
    }
    c, g, ng, hh, t, gk = ks.live_entries()
    got["live"] = [
        (int(c[j]), None if ng[j] else int(g[j]), int(hh[j]), float(t[j]), int(gk[j]))
        for j in range(len(c))
    ]
    return {k: sorted(v, key=repr) for k, v in got.items()}


@pytest.mark.parametrize("seed", range(150))
def test_issue19_state_kernel_equals_the_polars_step(seed: int) -> None:
    # Nulls (no group), clears, repeated and extreme hashes, several channels, state
    # carried over chunks: every flag, FIFO pair, survivor and drop is the old step's.
    old_live = pl.DataFrame(schema=LIVE_SCHEMA)
    ks = kernel.State()
    gkey_of: dict[Any, int] = {}
    first_row = 0
    for ops in _random_run(seed):
        blocks, final = _frames(ops, first_row, gkey_of)
        o_blocks, o_pairs, o_live, o_dropped, _o_new = _old_advance(blocks, old_live, final)
        got = _kernel_step(ks, ops, first_row, gkey_of)
        first_row += len(ops)
        flags = ["row", "orphan", "restored"]
        assert got["flags"] == _rows(o_blocks.filter(~pl.col("carried")), flags)
        pair_cols = ["row", "remove_ts", "remove_gkey", "store_ts", "gkey"]
        assert got["pairs"] == _rows(o_pairs, pair_cols)
        live_cols = ["channel_id", "group_idx", "hash", "store_ts", "gkey"]
        assert got["live"] == _rows(o_live, live_cols)
        assert got["dropped"] == _rows(o_dropped, ["channel_id", "epoch", "gkey"])
        old_live = o_live


def _one_op(ks: kernel.State, op: int, hashes: Any, ts: float) -> kernel.Out:
    n = len(hashes)
    z = np.zeros(n, np.int64)
    return kernel.step(
        ks, np.full(n, op, np.int8), z, z, np.zeros(n, bool), hashes, np.full(n, ts), z, 1
    )


def test_issue19_state_kernel_grows_its_table_and_keeps_every_key() -> None:
    # Many keys over many calls: the table is rehashed several times; the live-key lists
    # survive (a clear still drops every live copy) and every key stays known (a re-store
    # after the clear is a recompute, never a first store).
    ks = kernel.State()
    rng = np.random.default_rng(3)
    hashes = rng.integers(-(2**63), 2**63 - 1, 20000, dtype=np.int64)
    for part in np.array_split(hashes, 7):
        assert (_one_op(ks, kernel.STORE, part, 1.0).what == kernel.FIRST).all()
    assert ks.keys == 20000 and 7 * len(ks.table.cn) >= 10 * 20000
    assert (_one_op(ks, kernel.REMOVE, hashes[:10], 2.0).what == kernel.EVICTED).all()
    clear = _one_op(ks, kernel.CLEAR, hashes[:1], 5.0)
    assert clear.drop_n.tolist() == [19990] and ks.live_gkey.tolist() == [0]
    again = _one_op(ks, kernel.STORE, hashes[:100], 7.0)
    assert (again.what == kernel.RECOMPUTED).all()
    # The first ten were evicted at 2 s (then nine more evictions of the pool), the rest
    # cleared at 5 s (ten evictions before, none after).
    assert again.ts.tolist() == [2.0] * 10 + [5.0] * 90
    assert again.distance.tolist() == list(range(9, -1, -1)) + [0] * 90


def test_issue10_state_pack_is_exact_for_any_values() -> None:
    big = np.array([-(2**63), 2**63 - 1, 0, -(2**63), 5], dtype=np.int64)
    small = np.array([1, 1, 1, 1, 2], dtype=np.int64)
    packed = arrays.pack_keys([big, small, big])
    pairs = list(zip(big.tolist(), small.tolist(), strict=True))
    for i in range(5):
        for j in range(5):
            assert (packed[i] == packed[j]) == (pairs[i] == pairs[j])


def _peaks_reference(
    gkeys: list[int], deltas: list[int], rows: dict[int, tuple[Any, str, Any]]
) -> dict[str, dict[object, tuple[int, int]]]:
    out: dict[str, dict[object, tuple[int, int]]] = {}
    for level in ("kind", "window", "group", "total"):

        def key(g: int, level: str = level) -> object:
            return {"kind": rows[g][1], "window": rows[g][2], "group": g, "total": 0}[level]

        present = {key(g) for g in gkeys if g >= 0}
        out[level] = {}
        for k in present:
            now = high = 0
            for g, d in zip(gkeys, deltas, strict=True):
                if g >= 0 and key(g) == k:
                    now += d
                    high = max(high, now)
            out[level][k] = (now, high)
    return out


@pytest.mark.parametrize("seed", range(50))
def test_issue10_state_peaks_equal_a_running_sum_per_level(seed: int) -> None:
    rng = random.Random(seed)
    rows: dict[int, tuple[int | None, str, int | None]] = {
        i: (i, rng.choice(["full_attention", "sliding_window", "mamba"]), rng.choice([None, 4]))
        for i in range(rng.randint(1, 8))
    }
    n = rng.randint(1, 200)
    gkeys = [rng.choice([-1, *rows]) for _ in range(n)]
    deltas = [rng.choice([1, 1, -1, -3, 0]) for _ in range(n)]
    p = Peaks()
    p.add(np.array(gkeys, dtype=np.int64), np.array(deltas, dtype=np.int64), rows)
    want = _peaks_reference(gkeys, deltas, rows)
    for level, keys in want.items():
        assert p.levels[level] == keys


@pytest.mark.parametrize("seed", range(20))
def test_issue10_state_lifetime_percentiles_equal_polars_linear_quantile(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 3000))
    values = np.rint(rng.exponential(float(rng.choice([0.01, 1.0, 100.0])), n) * 1e6) * 1e-6
    if seed % 4 == 0:
        values[: n // 2] = values[0]  # ties
    got = samples.linear_quantiles(values.copy())
    want = pl.DataFrame({"v": values}).select(
        pl.col("v").quantile(q, "linear").alias(str(q)) for q in (0.5, 0.9, 0.99)
    )
    assert got == list(want.row(0))


def test_by_group_rows_of_one_group_and_kind_are_ordered_by_window() -> None:
    # One group seen with two windows (two channels, say): the rows tie on (group, kind);
    # the window orders them, every time (polars' group_by hash order varies per call).
    from kvtool.report.aggregates import ADDITIVE
    from kvtool.report.builder import ReportBuilder
    from kvtool.report.rows import gkey_of

    seen = set()
    for _ in range(40):
        b = ReportBuilder()
        for key in [
            (0, "sliding_window", 128),
            (1, "full_attention", None),
            (0, "sliding_window", 64),
        ]:
            gkey_of(b.registry, *key)
        b.counts = np.ones((3, len(ADDITIVE)), dtype=np.int64)
        by_group = b.tables()["by_group"]
        seen.add(tuple(zip(by_group["group_idx"], by_group["sliding_window"], strict=True)))
    assert seen == {((0, 64), (0, 128), (1, None))}
