"""Hash keys live now, per report row: the distinct keys among the state kernel's live copies.

A key (channel, group, hash; a channel is one publisher stream, so one rank) can sit in
two physical blocks (a second copy, docs/SEMANTICS.md R8): ``live_entries`` counts its
(key, block) entries, ``live_keys`` the key once. Read from the kernel's state at the
end (:meth:`kvtool.report.kstate.State.live_entries`), so it is the same for any chunking,
decoder or units of work (the units share no stream, so no key: their counts add).
Hit announcements (report mode full) store no entry, so they are no key.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kvtool.columns import np
from kvtool.report.arrays import I64, pack_keys

if TYPE_CHECKING:
    from numpy.typing import NDArray

    from kvtool.report.kstate import State


def live_keys(state: State, size: int) -> NDArray[Any]:
    """Distinct live hash keys per report row (``size`` rows; a key once per row it is live in)."""
    chan, group, no_group, h, _ts, gkey = state.live_entries()
    out = np.zeros(size, dtype=I64)
    if not len(gkey):
        return out
    packed = pack_keys([chan, group, no_group.astype(I64), h, gkey])
    _u, first = np.unique(packed, return_index=True)
    counted = np.bincount(gkey[first], minlength=size).astype(I64)
    out[: min(size, len(counted))] = counted[:size]
    return out


__all__ = ["live_keys"]
