"""Distinct stored hashes per report row, and per level (kind, window, group, total).

Per gkey a sorted, duplicate-free int64 array, merged with each chunk's new hashes now
and then (sort-merge: no big hash tables).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kvtool.columns import np
from kvtool.report.aggregates import sorted_union

if TYPE_CHECKING:
    from numpy.typing import NDArray


class DistinctHashes:
    """The distinct stored hashes of each gkey (``sets``), plus chunks' parts not merged yet.

    Args:
        enabled: Keep hashes (False: a bounded builder, ``max_keys``; every count is 0).
    """

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.sets: dict[int, NDArray[Any]] = {}
        self._parts: dict[int, list[NDArray[Any]]] = {}
        self._rows = 0
        self._size = 0
        self._counts: dict[tuple[int, ...], int] = {}

    def add(self, gk: NDArray[Any], h: NDArray[Any]) -> None:
        """Collect the chunk's stored hashes per gkey (merged now and then: amortised)."""
        if len(gk) == 0 or not self.enabled:
            return
        keys = np.flatnonzero(np.bincount(gk))
        for key in keys.tolist():
            part = h if len(keys) == 1 else h[gk == key]
            self._parts.setdefault(key, []).append(part)
            self._rows += len(part)
        # Pending rows up to a quarter of the set (not all of it): still linear overall
        # (each merge is a timsort of sorted runs), and at 10x ~20 MB less peak memory.
        if self._rows > max(1 << 18, self._size // 4):
            self.merge()

    def count(self, ids: list[int]) -> int:
        """Distinct hashes stored in any of these gkeys (cached per set of gkeys)."""
        key = tuple(sorted(i for i in ids if i in self.sets))
        got = self._counts.get(key)
        if got is None:
            parts = [self.sets[i] for i in key]
            if not parts:
                got = 0
            elif len(parts) == 1:
                got = len(parts[0])
            else:
                # One pair at a time: a level's sets (one per group, mostly the same
                # hashes) never all sit in one concatenation and its sorted copy.
                acc = parts[0]
                for part in parts[1:]:
                    acc = sorted_union([acc, part])
                got = len(acc)
            self._counts[key] = got
        return got

    def per_level(self, members: dict[str, dict[object, list[int]]]) -> dict[str, list[int]]:
        """The distinct hashes of each level key's gkeys, per level, in ``members``' order."""
        self.merge()
        self._counts = {}
        return {
            col: [self.count(ids) for ids in keys.values()] for col, keys in members.items()
        } | {col: [] for col in ("L_total", "L_kind", "L_window", "L_group") if col not in members}

    def merge(self) -> None:
        """Merge the pending parts into the sets."""
        for gkey, parts in self._parts.items():
            old = self.sets.get(gkey)
            self.sets[gkey] = sorted_union([old, *parts] if old is not None else parts)
        self._parts = {}
        self._rows = 0
        self._size = sum(len(s) for s in self.sets.values())


__all__ = ["DistinctHashes"]
