"""One chunk's per-report-row counts (the :data:`~kvtool.report.aggregates.ADDITIVE` sums).

Pure: the chunk's columns and the state kernel's verdicts in, one int64 row per gkey out
(:class:`kvtool.report.builder.ReportBuilder` adds them up across chunks).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import polars as pl

from kvtool.columns import np
from kvtool.report import announce, kernel
from kvtool.report.aggregates import ADDITIVE
from kvtool.report.arrays import (
    ANNOUNCED,
    BLOCK_IN,
    BLOCK_OUT,
    CLASS_COLUMNS,
    I64,
    KEY_IN,
    KEY_OUT,
    NOT_A_BLOCK,
    NOT_AN_EVICTION,
    int_column,
)

if TYPE_CHECKING:
    from numpy.typing import NDArray


def chunk_counts(
    size: int,
    df: pl.DataFrame,
    gkey: NDArray[Any],
    is_clear: NDArray[Any],
    is_store: NDArray[Any],
    is_remove: NDArray[Any],
    has_hash: NDArray[Any],
    first_block: NDArray[Any],
    unattributed_orphan: NDArray[Any],
    moved: NDArray[Any],
    out: kernel.Out,
) -> NDArray[Any]:
    """Return the chunk's per-gkey sums of :data:`ADDITIVE` (one ``bincount`` each).

    ``gkey`` already puts the ``moved`` rows (orphan removes without group_idx) on
    the unattributed row.
    """
    rows = ~is_clear
    g = gkey[rows]

    def per(mask: NDArray[Any], keys: NDArray[Any] = g) -> NDArray[Any]:
        out: NDArray[Any] = np.bincount(keys[mask], minlength=size)
        return out

    tokens, _ = int_column(df, "tokens")
    add = np.zeros((size, len(ADDITIVE)), dtype=I64)
    st, rm, fb, hh = is_store[rows], is_remove[rows], first_block[rows], has_hash[rows]
    col = {c: i for i, c in enumerate(ADDITIVE)}
    add[:, col["store_events"]] = per(fb & st)
    add[:, col["blocks_stored"]] = per(hh & st)
    what = out.what[rows]
    announced = np.isin(what, ANNOUNCED)
    tok = tokens[rows]
    real = st & ~announced
    add[:, col["tokens_stored"]] = np.rint(
        np.bincount(g[real], weights=tok[real], minlength=size)
    ).astype(I64)
    # Hit announcements (R6, R7): no store; their hits, less the lookups repeated.
    add[:, col["hit_announced_blocks"]] = per(announced)
    add[:, col["tokens_announced"]] = np.rint(
        np.bincount(g[announced], weights=tok[announced], minlength=size)
    ).astype(I64)
    back_at = out.back_blocks[rows] > 0
    back_g = out.back_gkey[rows][back_at]
    add[:, col["failed_lookups"]] = per(back_at[back_at], back_g)
    add[:, col["hit_blocks"]] = add[:, col["hit_announced_blocks"]] - np.bincount(
        back_g, weights=out.back_blocks[rows][back_at], minlength=size
    ).astype(I64)
    add[:, col["hit_tokens"]] = add[:, col["tokens_announced"]] - np.bincount(
        back_g, weights=out.back_tokens[rows][back_at], minlength=size
    ).astype(I64)
    add[:, col["remove_events"]] = per(fb & rm)
    add[:, col["blocks_removed"]] = per(hh & rm)
    add[:, col["orphan_removes"]] = per((unattributed_orphan[rows] & hh) | (what == kernel.ORPHAN))
    add[:, col["stored_while_live"]] = per(what == kernel.WHILE_LIVE)
    add[:, col["blocks_recomputed"]] = per(what == kernel.RECOMPUTED)
    # Issue 21: stores and removes that are no block of their own (docs/SEMANTICS.md).
    add[:, col["blocks_stored"]] -= per(st & np.isin(what, NOT_A_BLOCK))
    add[:, col["blocks_removed"]] -= per(rm & np.isin(what, NOT_AN_EVICTION))
    for name, code in CLASS_COLUMNS:
        add[:, col[name]] = per(what == code)
    # The bounds where the wire cannot tell an announcement from a second copy: how
    # many more blocks each could be (the ambiguous runs counted as the other).
    add[:, col["blocks_stored_bound"]] = per(what == kernel.ANNOUNCED_AMBIGUOUS)
    add[:, col["hit_announced_blocks_bound"]] = per(out.note[rows] == announce.NOTE_AMBIGUOUS)
    add[:, col["ambiguous_copy_evictions"]] = per(out.note[rows] == kernel.NOTE_COPY)
    # Entries live at the end, as a sum: +1 per key a store adds, -1 per key a remove takes
    # off (under the report row it was stored under), minus the keys clears drop.
    taken = rm & np.isin(what, KEY_OUT)
    # (``live_keys``, the distinct keys, is read from the kernel's state: klive.py.)
    add[:, col["live_entries"]] = per(st & np.isin(what, KEY_IN)) - per(
        taken[taken], out.gkey[rows][taken]
    )
    if len(out.drop_gkey):
        add[:, col["blocks_cleared"]] = np.bincount(
            out.drop_gkey, weights=out.drop_n, minlength=size
        ).astype(I64)
        add[:, col["entries_cleared"]] = np.bincount(
            out.drop_gkey, weights=out.drop_keys, minlength=size
        ).astype(I64)
        add[:, col["live_entries"]] -= add[:, col["entries_cleared"]]
    return add


def live_deltas(
    what: NDArray[Any], stored: NDArray[Any], gkey: NDArray[Any], out: kernel.Out
) -> tuple[NDArray[Any], NDArray[Any], NDArray[Any], NDArray[Any]]:
    """The chunk's live-block deltas in stream order: (gkey, delta, row, is a clear's drop).

    +1 per stored block, -1 per effective remove (under the report row of the entry it
    removes), a clear's drops at its row. A physical block: +1 where a store makes or
    re-keys one, -1 where a remove takes one off (issue 21: extra keys and their removes
    change no block).
    """
    n = len(what)
    delta = (stored & np.isin(what, BLOCK_IN)).astype(I64)
    evicted = np.flatnonzero(np.isin(what, BLOCK_OUT))
    delta[evicted] = -1
    delta_gkey = gkey.copy()
    delta_gkey[evicted] = out.gkey[evicted]
    delta_row = np.arange(n)
    dropped = np.zeros(n, dtype=bool)
    if len(out.drop_row):
        # One delta per (clear, gkey) at the clear's own row: the drops' order inside
        # a clear cannot change a peak (all negative).
        # Before the row's own delta: a restart's row is a store or remove (a clear's
        # own delta is 0), and its drops come first.
        pos = np.searchsorted(delta_row, out.drop_row, side="left")
        delta = np.insert(delta, pos, -out.drop_n)
        delta_gkey = np.insert(delta_gkey, pos, out.drop_gkey)
        delta_row = np.insert(delta_row, pos, out.drop_row)
        dropped = np.insert(dropped, pos, True)
    return delta_gkey, delta, delta_row, dropped


__all__ = ["chunk_counts", "live_deltas"]
