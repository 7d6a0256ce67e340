"""Issue 20: what-if rules that follow from vLLM's managers, on hand-made streams."""

from __future__ import annotations

from pathlib import Path

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
