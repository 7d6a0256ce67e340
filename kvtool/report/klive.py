"""Hash keys live now, per report row: the distinct keys among the state kernel's live copies.

A key (channel, group, hash; a channel is one publisher stream, so one rank) can sit in
two physical blocks (a second copy, docs/SEMANTICS.md R8): ``live_entries`` counts its
(key, block) entries, ``live_keys`` the key once, under the report row of its oldest live
copy (so the rows add up: by medium, a key cached in two media is one key of the report).
Read from the kernel's state at the end (:meth:`kvtool.report.kstate.State.live_entries`),
so it is the same for any chunking, decoder or units of work (the units share no stream,
so no key: their counts add). Hit announcements store no entry, so they are no key.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kvtool.columns import np
from kvtool.report.arrays import I64, pack_keys
from kvtool.report.names import ADDITIVE

if TYPE_CHECKING:
    from numpy.typing import NDArray

    from kvtool.report.kstate import State

LIVE_KEYS = ADDITIVE.index("live_keys")
"""``live_keys``' column in the :data:`~kvtool.report.names.ADDITIVE` sums."""


def live_keys(state: State, size: int) -> NDArray[Any]:
    """Distinct live hash keys per report row (``size`` rows), each under its oldest copy's."""
    chan, group, no_group, h, _ts, gkey = state.live_entries()
    out = np.zeros(size, dtype=I64)
    if not len(gkey):
        return out
    # A key's copies come together, oldest first: its first row is its oldest copy.
    _u, first = np.unique(pack_keys([chan, group, no_group.astype(I64), h]), return_index=True)
    counted = np.bincount(gkey[first], minlength=size).astype(I64)
    out[: min(size, len(counted))] = counted[:size]
    return out


def counts_now(counts: NDArray[Any], state: State, *, merged: bool = False) -> NDArray[Any]:
    """A builder's :data:`ADDITIVE` sums with ``live_keys`` read from its kernel state now.

    ``merged``: a builder filled from partial reports, whose sums carry their units' keys.
    """
    if merged:
        return counts
    out = counts.copy()
    out[:, LIVE_KEYS] = live_keys(state, len(out))
    return out


__all__ = ["LIVE_KEYS", "counts_now", "live_keys"]
