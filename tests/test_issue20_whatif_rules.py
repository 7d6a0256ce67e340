"""Issue 20: what-if rules that follow from vLLM's managers, on hand-made streams."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvtool.report.whatif import parse_what_if, what_if
from tests.test_report import record_batches, removed, stored

FA = {"group": 0, "kind": "full_attention"}
MB = {"group": 1, "kind": "mamba"}


def _fa(hashes: list[int], parent: int | None) -> dict[str, object]:
    ev = stored(hashes, **FA)
    ev["parent_block_hash"] = parent
    return ev


def _state(h: int, parent: int | None, blocks: int) -> dict[str, object]:
    ev = stored([h], tokens=list(range(16 * blocks)), **MB)
    ev["parent_block_hash"] = parent
    return ev


def test_a_state_the_larger_pool_skips_is_a_first_store_later(tmp_path: Path) -> None:
    """A Mamba state before a longer hit is never computed at the larger pool, so storing
    it later is a first store there, not a recompute (the recording recomputes it)."""
    batches = [
        [_fa([1, 2, 3, 4], None), _state(4, None, 4)],
        [removed([4, 3, 2, 1], 0), removed([4], 1)],
        # At the larger pool this request hits 1-4 and the state at 4: the state at 2
        # (its first chunk's end) is never computed there.
        [_fa([1, 2], None), _state(2, None, 2)],
        [_fa([3, 4], 2), _state(4, 2, 2)],
        [_fa([5, 6], 4), _state(6, 4, 2)],
        [removed([6, 5, 4, 3, 2, 1], 0), removed([6, 4, 2], 1)],
        [_fa([1, 2], None), _state(2, None, 2)],
    ]
    path = record_batches(tmp_path / "m.mcap", batches)
    entry = what_if([path], parse_what_if("+20")).entries[0]
    rows = {r["kind"]: r for r in entry["by_kind"]}  # type: ignore[attr-defined]
    assert rows["mamba"]["blocks_recomputed_recorded"] == 2
    assert rows["mamba"]["blocks_recomputed"] == 0


@pytest.mark.parametrize("depth", [1, 20])
def test_a_recorded_hit_the_larger_pool_no_longer_holds_is_computed_again(depth: int) -> None:
    """The larger pool hits only what it holds (vLLM's lookup runs there, not here).

    A full-attention group and a sliding-window group (one block of window). Request 1
    hits blocks 1-2 at the larger pool, so it never computes the window block w1 that
    the recorded engine computes (a phantom there); the larger pool's older copy of w1
    is then evicted. Request 3's recorded hit of block 1 needs w1: the larger pool does
    not hold it, so its hit is shorter and w1 is computed again (a recompute), f1 too
    (a duplicate: still cached). With ``depth`` 20 the recorded hit is 20 blocks deep
    (f1/w1 at the deepest, 19 blocks stored earlier below them, whose window blocks were
    evicted).
    """
    import numpy as np

    from kvtool.report.whatif.kernel import (
        KIND_FULL,
        KIND_SLIDING,
        OP_RECORD,
        OP_REMOVE,
        OP_STORE,
        recorded,
        simulate,
    )

    f1, f2, w1, w2 = 0, 1, 2, 3
    xs = [4, 5, 6, 7, 8]
    ops: list[tuple[int, int, int, int, int]] = []  # kind, a, depth, group, record

    def rec(r: int) -> None:
        ops.append((OP_RECORD, r, 0, -1, -1))

    def store(k: int, d: int, g: int, r: int) -> None:
        ops.append((OP_STORE, k, d, g, r))

    def remove(k: int, g: int) -> None:
        ops.append((OP_REMOVE, k, 0, g, -1))

    rec(0)
    for k, d, g in ((f1, 1, 0), (f2, 2, 0), (w1, 1, 1), (w2, 2, 1)):
        store(k, d, g, 0)
    for k, g in ((w1, 1), (w2, 1), (f1, 0), (f2, 0)):
        remove(k, g)
    rec(1)  # the recorded engine recomputes 1-2; the larger pool hits them
    for k, d, g in ((f1, 1, 0), (f2, 2, 0), (w1, 1, 1), (w2, 2, 1)):
        store(k, d, g, 1)
    below = [(9 + 2 * i, 10 + 2 * i) for i in range(depth - 1)]  # (full, window) keys
    if below:
        # Another request stores 19 blocks; its window blocks are evicted (the full ones stay)
        rec(4)
        for d, (fk, wk) in enumerate(below, 1):
            store(fk, d, 0, 4)
            store(wk, d, 1, 4)
        for _fk, wk in below:
            remove(wk, 1)
    rec(2)  # filler: its evictions push the larger pool's older w1 out (and the rest)
    for d, k in enumerate(xs, 1):
        store(k, d, 0, 2)
    for k in xs:
        remove(k, 0)
    rec(3)  # a recorded hit of `depth` blocks, f1/w1 at the deepest (live copies)
    kind, a, op_depth, group, record = (np.array(c, np.int64) for c in zip(*ops, strict=True))
    i64 = np.int64
    n_keys = 9 + 2 * len(below)
    deep = [[f1, w1], *([fk, wk] for fk, wk in reversed(below))]  # depth, depth - 1, ...
    args = (
        kind,
        a,
        op_depth,
        group,
        record,
        np.array([0, 1, 2, 3, 4], i64),  # rec_req
        np.array([0, 4, 8, 13, 13, 13 + 2 * len(below)], i64),  # rec_s0
        np.array([1, 2, 1, 2, 1, 2, 1, 2, 1, 2, 3, 4, 5, *(d for d, _ in enumerate(below, 1)
                  for _g in range(2))], i64),  # rec_depths
        np.array([0, 1, 2, 3, 4], i64),  # req_first_rec
        np.array([0, 0, 0, depth, 0], i64),  # req_l0
        np.array([0, 2, 0, depth, 0], i64),  # req_cap
        np.array([0, 0, 2, 2, 2, 2], i64),  # req_c0
        np.array([[f1, w1], [f2, w2]], i64),  # cand (request 1, depths 1-2)
        np.array([0, 0, 0, 0, depth, depth], i64),  # req_p0
        np.array(deep, i64),  # pre (request 3, its depths deepest first)
        np.array([KIND_FULL, KIND_SLIDING], i64),
        np.array([0, 1], i64),  # gsw
        n_keys,
    )  # fmt: skip
    rc0, _orphans = recorded(kind, a, group, n_keys, 2)
    assert rc0.tolist() == [2, 2]  # request 1 recomputes 1-2 in both groups
    rc, dup, _saved, _stores, _first, hit, orphans = simulate(*args, 0, True)
    assert rc.tolist() == rc0.tolist() and hit == 0 and orphans == 0
    rc, dup, _saved, _stores, _first, hit, orphans = simulate(*args, 4, True)
    # w1 computed again at request 3, and f1 into a second copy: its hit is one block
    # shorter. The window below (evicted by the recorded pool too) says nothing of the
    # larger pool: taken as held there, as before this rule.
    assert rc.tolist() == [0, 1]
    assert dup.tolist() == [1, 0]
    assert hit == 2 - 1  # request 1 hits 2 blocks more, request 3 one fewer


def test_the_ghost_list_grows_keeping_its_entries() -> None:
    import numpy as np

    from kvtool.report.whatif.ghost import _grow

    key, alive, prev = np.arange(3, dtype=np.int64), np.ones(3, np.bool_), np.arange(3) - 1
    k2, a2, p2 = _grow(key, alive, prev)
    assert len(k2) == 7 and k2[:3].tolist() == [0, 1, 2] and a2.tolist() == [True] * 3 + [False] * 4
    assert p2.tolist() == [-1, 0, 1, -1, -1, -1, -1]
