"""The numpy live-block state step (issue 10) against the polars step it replaced."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import polars as pl
import pytest

from kvtool.report import builder, state
from kvtool.report.aggregates import Peaks
from kvtool.report.state import BLOCK_SCHEMA, LIVE_SCHEMA

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


@pytest.mark.parametrize("seed", range(150))
def test_issue10_state_step_equals_the_polars_step(seed: int) -> None:
    # Nulls (no group), clears, repeated and extreme hashes, several channels, state
    # carried over chunks: every flag, FIFO pair, survivor and drop is the old step's.
    old_live = new_live = pl.DataFrame(schema=LIVE_SCHEMA)
    gkey_of: dict[Any, int] = {}
    first_row = 0
    for ops in _random_run(seed):
        blocks, final = _frames(ops, first_row, gkey_of)
        first_row += len(ops)
        o_blocks, o_pairs, o_live, o_dropped, o_new = _old_advance(blocks, old_live, final)
        got = state.advance(blocks, new_live, final)
        flags = ["row", "orphan", "restored"]
        assert _rows(got.blocks, flags) == _rows(o_blocks.filter(~pl.col("carried")), flags)
        pair_cols = ["row", "remove_ts", "remove_gkey", "store_ts", "gkey"]
        assert _rows(got.pairs, pair_cols) == _rows(o_pairs, pair_cols)
        assert _rows(got.live, list(LIVE_SCHEMA)) == _rows(o_live, list(LIVE_SCHEMA))
        drop_cols = ["channel_id", "epoch", "gkey"]
        assert _rows(got.dropped, drop_cols) == _rows(o_dropped, drop_cols)
        assert _rows(got.new_stores, ["gkey", "hash"]) == _rows(o_new, ["gkey", "hash"])
        # Entries of one key stay in stream (row) order: FIFO pairs the oldest first.
        for _key, part in got.live.group_by(list(_KEY)):
            assert part["row"].is_sorted()
        old_live, new_live = o_live, got.live


@pytest.mark.parametrize("groups", [[0, 1, 1 << 32, (1 << 32) + 1], [0, 1, 2, 3]])
def test_issue10_state_group_keys_with_colliding_buckets(groups: list[int]) -> None:
    # Keys that share the 32-bit bucket key (same low hash bits; groups and channels
    # whose mixes cancel, or packed one-to-one) still come out contiguous, each in its
    # original order.
    rng = np.random.default_rng(5)
    n = 5000
    high = rng.integers(0, 4, n).astype(np.int64) << 32
    low = rng.integers(0, 3, n).astype(np.int64)
    h = high | low
    c = rng.integers(0, 2, n).astype(np.int64)
    g = rng.choice(np.array(groups), n).astype(np.int64)
    ng = rng.random(n) < 0.1
    order, start = state.group_keys(h, c, g, ng)
    assert sorted(order.tolist()) == list(range(n))
    keys = list(
        zip(
            h[order].tolist(), c[order].tolist(), g[order].tolist(), ng[order].tolist(), strict=True
        )
    )
    seen: set[tuple[Any, ...]] = set()
    for i, key in enumerate(keys):
        if i == 0 or key != keys[i - 1]:
            assert start[i]
            assert key not in seen  # contiguous
            seen.add(key)
        else:
            assert not start[i]
            assert order[i] > order[i - 1]  # stable


def test_issue10_state_pack_is_exact_for_any_values() -> None:
    big = np.array([-(2**63), 2**63 - 1, 0, -(2**63), 5], dtype=np.int64)
    small = np.array([1, 1, 1, 1, 2], dtype=np.int64)
    packed = builder._pack([big, small, big])
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
    got = builder._linear_quantiles(values.copy())
    want = pl.DataFrame({"v": values}).select(
        pl.col("v").quantile(q, "linear").alias(str(q)) for q in (0.5, 0.9, 0.99)
    )
    assert got == list(want.row(0))


def test_by_group_rows_of_one_group_and_kind_are_ordered_by_window() -> None:
    # One group seen with two windows (two channels, say): the rows tie on (group, kind);
    # the window orders them, every time (polars' group_by hash order varies per call).
    from kvtool.report.aggregates import ADDITIVE
    from kvtool.report.builder import ReportBuilder

    seen = set()
    for _ in range(40):
        b = ReportBuilder()
        for key in [
            (0, "sliding_window", 128),
            (1, "full_attention", None),
            (0, "sliding_window", 64),
        ]:
            b._gkey_of(*key)
        b.counts = np.ones((3, len(ADDITIVE)), dtype=np.int64)
        by_group = b.tables()["by_group"]
        seen.add(tuple(zip(by_group["group_idx"], by_group["sliding_window"], strict=True)))
    assert seen == {((0, 64), (0, 128), (1, None))}
