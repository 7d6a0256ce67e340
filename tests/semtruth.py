"""The physical figures of a ``truth.json`` row (tests/data/semantics*/): one reader for the tests.

A truth row (one group or one kind) holds what vLLM's instrumented ``BlockPool`` did; each figure
here is named by the report column it must equal. A test asks for the figures it checks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

Row = dict[str, Any]

FIGURES: dict[str, Callable[[Row], int]] = {
    # blocks the engine stored into the pool and kept: a transient Mamba checkpoint, stored
    # and discarded in one step, is not one (README of c1: 687 = 837 - 150)
    "blocks_stored": lambda t: (
        t["stores"]["physical_blocks_newly_cached"] - t["removes"]["physical_blocks_discarded"]
    ),
    "blocks_removed": lambda t: t["removes"]["physical_blocks_evicted"],
    "blocks_cleared": lambda t: t["reset"]["physical_blocks_cleared_by_reset"],
    "entries_cleared": lambda t: t["reset"]["entries_cleared_by_reset"],
    "live_blocks_end": lambda t: t["end"]["physical_cached_blocks_end"],
    "peak_live_blocks": lambda t: t["peak"]["peak_physical_cached_blocks"],
    "live_keys": lambda t: t["end"]["cached_hash_keys_end"],
    "live_entries": lambda t: t["end"]["cached_entries_end"],
    "stored_while_live": lambda t: t["stores"]["second_physical_copy_of_a_cached_key"],
    "blocks_recomputed": lambda t: t["stores"]["new_full_block_entries_insert_outcomes"][
        "recompute"
    ],
    "partial_extra_keys": lambda t: t["stores"]["extra_hash_keys_on_already_cached_block"],
    "rekeys": lambda t: t["stores"]["same_block_rekeyed_after_promotion_or_replace"],
    "partial_promotions": lambda t: (
        t["removes"]["partial_promotion_to_full_not_eviction"]
        + t["removes"]["partial_promotion_to_longer_partial_not_eviction"]
    ),
    "hit_announced_blocks": lambda t: t["stores"]["hit_reannouncements_report_mode_full"],
    "hit_blocks": lambda t: (
        t["stores"]["hit_reannouncements_report_mode_full"]
        - t["stores"]["hit_reannouncements_for_admissions_that_then_failed"]
    ),
    "tokens_stored": lambda t: t["stores"]["tokens_stored_real"],
    "tokens_announced": lambda t: t["stores"]["tokens_stored_announce"],
    "distinct_hashes": lambda t: t["distinct_hashes_really_cached"],
}
"""Report column → how the truth row gives it."""

BLOCKS = (
    "blocks_stored",
    "blocks_removed",
    "blocks_cleared",
    "entries_cleared",
    "live_blocks_end",
    "live_keys",
    "live_entries",
)
"""What every semantics test checks: stored, evicted, cleared and live physical blocks, keys."""


def physical(t: Row, names: Iterable[str]) -> dict[str, int]:
    """The truth's figures ``names`` for one group or kind row of truth.json.

    Args:
        t: The row (``by_group[i]`` or ``by_kind[i]``).
        names: Report columns, each a key of :data:`FIGURES`.

    Returns:
        Column → the truth's value.
    """
    return {k: int(FIGURES[k](t)) for k in names}


def columns(row: dict[str, object], names: Iterable[str]) -> dict[str, int]:
    """The same columns of one report row, to compare with :func:`physical`."""
    return {k: int(row[k]) for k in names}  # type: ignore[call-overload]
