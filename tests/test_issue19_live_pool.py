"""Issue 19: the state kernel's key table and its pool of live records, against a plain model.

The key table keeps every key ever stored (what a gone key needs); a key's copies, their
FIFO list and its links in its channel's live-key list are in a live record, taken when
the key goes live and given back to a free list when its last copy goes (kstate.py). Here
seeded streams of the shapes the sample recordings hardly reach (one key live, gone and
live again many times, clears of many live keys, orphan removes, table growth while many
keys are live, the bounded ``max_keys`` of ``serve``) go through :func:`kernel.step` in
random chunks, and every row's answer is checked against a dict-of-deques model; after
each call the live records are checked against the model too: one per live key, the rest
on the free list, never more than the most keys ever live at once (no leak).
"""

from __future__ import annotations

import itertools
from collections import deque

import numpy as np
import pytest

from kvtool.report import kbase, kernel, kstate

Key = tuple[int, int, bool, int]  # channel, group, no_group, hash


class Model:
    """Live copies per key (FIFO), when each gone key went, forgetting as ``max_keys`` does."""

    def __init__(self, max_keys: int | None) -> None:
        self.max_keys = max_keys
        self.live: dict[Key, deque[tuple[float, int]]] = {}
        self.gone: dict[Key, tuple[float, int]] = {}
        self.evictions: dict[int, int] = {}
        self.peak_live_keys = 0
        self.forgotten = 0

    def reserve(self, stores: int) -> None:
        """:meth:`kstate.State.reserve`'s forgetting: the keys gone longest ago, a quarter
        of the bound at least, down to three quarters of it."""
        m = self.max_keys
        keys = len(self.live) + len(self.gone)
        if m is None or keys + stores <= m:
            return
        k = min(keys + stores - m * 3 // 4, len(self.gone))
        if k <= 0 or k < m // 4:
            return
        for key in sorted(self.gone, key=lambda q: self.gone[q][0])[:k]:
            del self.gone[key]
        self.forgotten += k

    def step(self, op: int, key: Key, ts: float, gkey: int) -> tuple[int, float, int, int]:
        """One store or remove: (what, its time answer, its report row, distance)."""
        ch = key[0]
        q = self.live.get(key)
        if op == kernel.STORE:
            if q is not None:
                out = (kernel.WHILE_LIVE, 0.0, -1, 0)
            elif key in self.gone:
                when, at = self.gone.pop(key)
                out = (kernel.RECOMPUTED, when, -1, self.evictions.get(ch, 0) - at)
            else:
                out = (kernel.FIRST, 0.0, -1, 0)
            self.live.setdefault(key, deque()).append((ts, gkey))
            self.peak_live_keys = max(self.peak_live_keys, len(self.live))
            return out
        if q is None:
            return (kernel.ORPHAN, 0.0, -1, 0)
        stored, g = q.popleft()
        self.evictions[ch] = self.evictions.get(ch, 0) + 1
        if not q:
            del self.live[key]
            self.gone[key] = (ts, self.evictions[ch])
        return (kernel.EVICTED, stored, g, 0)

    def clear(self, ch: int, ts: float) -> dict[int, int]:
        """A clear of channel ``ch``: its copies dropped per report row."""
        drops: dict[int, int] = {}
        for key in [k for k in self.live if k[0] == ch]:
            for _t, g in self.live.pop(key):
                drops[g] = drops.get(g, 0) + 1
            self.gone[key] = (ts, self.evictions.get(ch, 0))
        return drops


def stream(seed: int, shape: str) -> tuple[list[np.ndarray], int | None]:
    """Rows of one shape: op, channel, group, no_group, hash, time, report row."""
    rng = np.random.default_rng(seed)
    n, chans, clears, pstore = 2500, 2, 0.0, 0.5
    max_keys: int | None = None
    if shape == "cycle":  # a handful of keys, live -> gone -> live again many times
        pool = 4
    elif shape == "clears":  # many live keys, cleared
        pool, chans, clears, pstore = 2000, 3, 0.004, 0.75
    elif shape == "orphans":
        pool, chans, pstore = 40, 4, 0.3
    elif shape == "growth":  # the table doubles (rehash) while thousands of keys are live
        pool, n, clears, pstore = 1 << 40, 6000, 0.0005, 0.8
    else:  # bounded: forgetting while a live set stays
        pool, n, pstore = 1 << 40, 6000, 0.5
        max_keys = int(rng.choice([40, 200, 1000]))
    op = np.where(rng.random(n) < pstore, kernel.STORE, kernel.REMOVE).astype(np.int8)
    op[rng.random(n) < clears] = kernel.CLEAR
    chan = rng.integers(0, chans, n)
    no_group = rng.random(n) < 0.2
    group = np.where(no_group, 0, rng.integers(0, 3, n))
    # Spread over all of int64 (negative hashes too): the key number times an odd constant.
    h = (rng.integers(0, pool, n).astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)).view(np.int64)
    if shape in ("bounded", "growth"):
        # A remove names a recent store (a live set of tens or thousands), or an orphan.
        back = 30 if shape == "bounded" else 3000
        for i in np.flatnonzero(op == kernel.REMOVE).tolist():
            if i and rng.random() < 0.95:
                j = max(0, i - int(rng.integers(1, back)))
                chan[i], group[i], no_group[i], h[i] = chan[j], group[j], no_group[j], h[j]
    ts = np.cumsum(rng.random(n) + 1e-3)  # distinct: the gone keys' order is strict
    gkey = rng.integers(0, 3, n)
    return [op, chan, group, no_group, h, ts, gkey], max_keys


def check_pool(st: kernel.State, model: Model) -> None:
    """One live record per live key with its copies, the rest free; channel lists whole."""
    t, lv, meta = st.table, st.live, st.meta
    free, r = 0, int(meta[kstate.LFREE])
    while r >= 0:
        assert lv.slot[r] == -1
        free, r = free + 1, int(lv.next[r])
    assert int(meta[kstate.LKEYS]) == len(model.live)
    assert free + len(model.live) == int(meta[kstate.LUSED])
    # Records come from the free list first: never more than the most keys live at once.
    assert int(meta[kstate.LUSED]) == model.peak_live_keys
    taken = np.flatnonzero((t.cn != kbase.EMPTY) & (t.live >= 0))
    assert len(taken) == len(model.live)
    for s in taken.tolist():
        r = int(t.live[s])
        key = (int(t.cn[s]) >> 1, int(t.group[s]), bool(t.cn[s] & 1), int(t.hash[s]))
        assert lv.slot[r] == s and lv.copies[r] == len(model.live[key])
    for ch in range(len(st.channels.head)):
        seen, prev, r = set(), -1, int(st.channels.head[ch])
        while r >= 0:
            assert lv.prev[r] == prev and r not in seen and int(t.cn[lv.slot[r]]) >> 1 == ch
            seen.add(r)
            prev, r = r, int(lv.next[r])
        assert len(seen) == sum(1 for k in model.live if k[0] == ch)
    assert st.keys == len(model.live) + len(model.gone)
    assert st.forgotten == model.forgotten


SHAPES = ("cycle", "clears", "orphans", "growth", "bounded")


@pytest.mark.parametrize("plain", [True, False], ids=["plain", "advance"])
@pytest.mark.parametrize("shape", SHAPES)
def test_issue19_live_pool_equals_a_plain_model(shape: str, plain: bool) -> None:
    for seed in range(3):
        rows, max_keys = stream(seed * 7 + SHAPES.index(shape), shape)
        op, chan, group, no_group, h, ts, gkey = rows
        n = len(op)
        rng = np.random.default_rng(seed)
        cuts = sorted({0, n, *rng.integers(0, n, 12).tolist()})
        st = kernel.State(max_keys)
        model = Model(max_keys)
        for lo, hi in itertools.pairwise(cuts):
            model.reserve(int((op[lo:hi] == kernel.STORE).sum()))
            p_op, p_chan, p_group, p_ng, p_h, p_ts, p_gkey = (a[lo:hi] for a in rows)
            out = kernel.step(st, p_op, p_chan, p_group, p_ng, p_h, p_ts, p_gkey, 3, None, plain)
            drops: dict[tuple[int, int], tuple[int, int]] = {}
            for j, (r, g, m, k) in enumerate(
                zip(out.drop_row, out.drop_gkey, out.drop_n, out.drop_keys, strict=True)
            ):
                drops[(int(r), int(g))] = (int(m), int(k))
                assert j == 0 or (out.drop_row[j - 1], out.drop_gkey[j - 1]) < (r, g)
            want_drops: dict[tuple[int, int], tuple[int, int]] = {}
            for i in range(lo, hi):
                where = f"{shape} seed {seed} row {i}"
                if op[i] == kernel.CLEAR:
                    for g, m in model.clear(int(chan[i]), float(ts[i])).items():
                        want_drops[(i - lo, g)] = (m, m)
                    continue
                key = (int(chan[i]), int(group[i]), bool(no_group[i]), int(h[i]))
                what, t_ans, g, dist = model.step(int(op[i]), key, float(ts[i]), int(gkey[i]))
                got = out.what[i - lo]
                assert got == what, where
                if what in (kernel.EVICTED, kernel.RECOMPUTED):
                    assert out.ts[i - lo] == t_ans, where
                if what == kernel.EVICTED:
                    assert out.gkey[i - lo] == g, where
                if what == kernel.RECOMPUTED:
                    assert out.distance[i - lo] == dist, where
            assert drops == want_drops, f"{shape} seed {seed} clears of rows {lo}..{hi}"
            check_pool(st, model)
        c, g, ng, hh, t, gk = st.live_entries()
        got_live = sorted(
            ((int(c[j]), int(g[j]), bool(ng[j]), int(hh[j])), float(t[j]), int(gk[j]))
            for j in range(len(c))
        )
        want_live = sorted((k, t, g) for k, q in model.live.items() for t, g in q)
        assert got_live == want_live
        # A key's copies come together, oldest first (its FIFO list).
        order = [((int(c[j]), int(g[j]), bool(ng[j]), int(hh[j])), t[j]) for j in range(len(c))]
        assert all(a[0] != b[0] or a[1] <= b[1] for a, b in itertools.pairwise(order))
        if shape == "bounded":
            assert model.forgotten > 0  # the bound was reached: keys were forgotten


def test_issue19_live_pool_stays_small_on_a_long_stream() -> None:
    """Half a million stores, each removed just after (a quarter million keys, 300 of them
    live and gone again 50 times): the table grows (or, bounded, forgets), the live
    records stay as few as the keys live at once (one)."""
    for max_keys in (None, 5000):
        st = kernel.State(max_keys)
        fresh = 0
        for call in range(100):
            n = 10_000
            keys = np.arange(fresh, fresh + n // 2, dtype=np.int64)
            if call % 2:  # every other call, the same 300 keys again
                keys = keys % 300
            else:
                fresh += n // 2
            h = np.repeat(keys, 2)
            op = np.tile(np.array([kernel.STORE, kernel.REMOVE], np.int8), n // 2)
            z = np.zeros(n, np.int64)
            ts = np.arange(n, dtype=np.float64) + call * n
            kernel.step(st, op, z, z, np.zeros(n, bool), h, ts, z, 1)
        assert int(st.meta[kstate.LUSED]) == 1 and int(st.meta[kstate.LKEYS]) == 0
        assert len(st.live.copies) <= 10_000  # sized for one call's stores, not the stream
        if max_keys is None:
            assert st.keys == 250_000
        else:
            assert st.keys <= max_keys + n and st.forgotten >= 250_000 - st.keys
