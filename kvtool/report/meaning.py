"""What each row of the flat table meant (issue 21 Deliver 1): the export's ``meaning`` column.

The report's state kernel classifies every store and remove (docs/SEMANTICS.md R1-R10);
this turns its per-row verdict (``what`` and ``note``, int8 each, no Python object per
row) into one int8 code per row, and :func:`labels` into strings with polars. Summed per
group they are the report's columns:

============================  ====================================================
``meaning``                   report column
============================  ====================================================
``new_entry``                 ``blocks_stored`` (with the three below)
``partial_primary``           a new partial key that is its block's primary key
``recomputed``                ``blocks_recomputed``
``stored_while_live``         ``stored_while_live``
``partial_extra``             ``partial_extra_keys`` (a key on a cached block)
``rekey``                     ``rekeys``
``discarded_checkpoint``      a Mamba checkpoint stored and discarded in its batch
``hit_announcement``          ``hit_announced_blocks``
``eviction``                  ``blocks_removed`` (with ``orphan``)
``evicted_extra_key``         ``evicted_extra_keys``
``partial_promotion``         ``partial_promotions``
``rekey_remove``              ``rekey_removes``
``checkpoint_discard``        ``checkpoints_discarded``
``orphan``                    ``orphan_removes``
``clear``                     an ``AllBlocksCleared`` (``blocks_cleared`` counts blocks)
============================  ====================================================

A row the state does not see (another tier's, a hashless one) has none (null).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kvtool.columns import CLEARED, np
from kvtool.report import kernel

if TYPE_CHECKING:
    import polars as pl
    from numpy.typing import NDArray

MEANINGS = (
    "new_entry",
    "partial_primary",
    "recomputed",
    "stored_while_live",
    "partial_extra",
    "rekey",
    "discarded_checkpoint",
    "hit_announcement",
    "eviction",
    "evicted_extra_key",
    "partial_promotion",
    "rekey_remove",
    "checkpoint_discard",
    "orphan",
    "clear",
)
"""The ``meaning`` values, by code (code ``i`` is ``MEANINGS[i]``; -1: none)."""

_CODE = {m: i for i, m in enumerate(MEANINGS)}
_OF_WHAT = {
    kernel.FIRST: "new_entry",
    kernel.RECOMPUTED: "recomputed",
    kernel.WHILE_LIVE: "stored_while_live",
    kernel.EXTRA: "partial_extra",
    kernel.EXTRA_NOOP: "partial_extra",
    kernel.REKEY: "rekey",
    kernel.DISCARDED_STORE: "discarded_checkpoint",
    kernel.ANNOUNCED: "hit_announcement",
    kernel.ANNOUNCED_AMBIGUOUS: "hit_announcement",
    kernel.EVICTED: "eviction",
    kernel.EVICTED_EXTRA: "evicted_extra_key",
    kernel.PROMOTED: "partial_promotion",
    kernel.REKEY_REMOVE: "rekey_remove",
    kernel.DISCARD: "checkpoint_discard",
    kernel.ORPHAN: "orphan",
}
_LUT = np.full(128, -1, dtype=np.int8)
for _w, _m in _OF_WHAT.items():
    _LUT[_w] = _CODE[_m]


def codes(what: NDArray[Any], note: NDArray[Any], type_code: NDArray[Any]) -> NDArray[Any]:
    """One code per row (see :data:`MEANINGS`).

    Args:
        what: The kernel's verdict per row (:attr:`kvtool.report.builder.ReportBuilder.row_what`).
        note: Its note per row (``row_note``: :data:`kvtool.report.kernel.NOTE_PARTIAL`
            marks a partial primary key).
        type_code: The rows' ``type_code`` (a clear is :data:`kvtool.columns.CLEARED`).

    Returns:
        int8 codes, -1 where the row meant nothing to the state.
    """
    out: NDArray[Any] = _LUT[np.asarray(what, dtype=np.int64)]
    out[(np.asarray(what) == kernel.FIRST) & (np.asarray(note) == kernel.NOTE_PARTIAL)] = _CODE[
        "partial_primary"
    ]
    out[np.asarray(type_code) == CLEARED] = _CODE["clear"]
    return out


def labels(code: NDArray[Any]) -> pl.Series:
    """The ``meaning`` column of :func:`codes`: strings of :data:`MEANINGS`, null for -1."""
    import polars as pl

    return (
        pl.Series("meaning", code, dtype=pl.Int8)
        .replace_strict(
            list(range(len(MEANINGS))), list(MEANINGS), default=None, return_dtype=pl.String
        )
        .alias("meaning")
    )


__all__ = ["MEANINGS", "codes", "labels"]
