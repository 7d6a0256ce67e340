"""Which copy of a twice-cached key an eviction takes (docs/SEMANTICS.md R8), for the kernel.

vLLM evicts whichever copy of a key reaches the free-queue head first; the wire does not
say which. The state kernel (:mod:`kvtool.report.kernel`) takes, among the key's live
copies (oldest first):

1. the copies not stored in this batch, if there are any (a block cached in this step is
   not free yet);
2. of those, the copy whose further keys one of the next eight events of the group
   removes (exact: vLLM removes an evicted block's keys in a row);
3. else, by the rule: ``ADJACENT`` (the default) the copy made by the same store event as
   the block evicted just before in the group and batch (a request's blocks are freed
   together and sit side by side in the free queue), else the oldest; ``OLDEST`` the
   oldest; ``NEWEST`` the newest.

``OLDEST`` and ``NEWEST`` are the two extremes: the report runs them beside the default
(:attr:`kvtool.report.kstate.State.shadows`) and gives their lifetime quantiles as the
bound (``lifetime_pNN_s_bound_low`` / ``_high``). A lifetime is per (key, block) entry,
store to eviction; removes that are not evictions, clears and hit announcements give none.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

from kvtool._jit import inline_kernel
from kvtool.columns import np
from kvtool.report.kbase import BATCH, BNEXT, CLEAR, EVENT, OWNER, REMOVE, SLOT

if TYPE_CHECKING:
    from numpy.typing import NDArray

ADJACENT, OLDEST, NEWEST = 0, 1, 2
"""Copy rules (:class:`kvtool.report.kstate.State`'s ``rule``)."""

RULES = {"adjacent": ADJACENT, "oldest": OLDEST, "newest": NEWEST}
"""The rules by name (as ``tests/semantics_model.py`` spells them)."""

NOTE_COPY = 2
"""``Out.note`` of an eviction of a key with several candidate copies (finding
``copy_choice``; :data:`kvtool.report.announce.NOTE_AMBIGUOUS` marks stores)."""

LOOK_AHEAD = 8
"""Events of the group read after a remove for the copy whose further keys they name."""


class Last(NamedTuple):
    """Per (channel, group) of the current batch, the store event of the block evicted last.

    Attributes:
        chan: Channel.
        group: Group.
        nog: No ``group_idx``.
        batch: The evicted block's store batch.
        event: Its store event (index in that batch).
        nxt: Scratch: the hashes the next events remove (:data:`LOOK_AHEAD`).
        n: [entries in use].
    """

    chan: NDArray[Any]
    group: NDArray[Any]
    nog: NDArray[Any]
    batch: NDArray[Any]
    event: NDArray[Any]
    nxt: NDArray[Any]
    n: NDArray[Any]


def last_evicted(n: int) -> Last:
    """Room for ``n`` (channel, group) pairs."""
    i64 = np.int64
    return Last(
        np.zeros(n + 1, i64),
        np.zeros(n + 1, i64),
        np.zeros(n + 1, np.bool_),
        np.zeros(n + 1, i64),
        np.zeros(n + 1, i64),
        np.zeros(LOOK_AHEAD, i64),
        np.zeros(1, i64),
    )


@inline_kernel
def _slot_of(lc: Last, ch: Any, g: Any, ng: Any) -> Any:
    for k in range(lc.n[0]):
        if lc.chan[k] == ch and lc.group[k] == g and lc.nog[k] == ng:
            return k
    return -1


@inline_kernel
def remember(lc: Last, e: Any, x: Any, ch: Any, g: Any, ng: Any) -> None:
    """Note that the block of entry ``x`` was evicted (the ``ADJACENT`` rule reads it)."""
    k = _slot_of(lc, ch, g, ng)
    if k < 0:
        k = lc.n[0]
        lc.chan[k] = ch
        lc.group[k] = g
        lc.nog[k] = ng
        lc.n[0] = k + 1
    b = e.aux[x, OWNER]
    lc.batch[k] = e.aux[b, BATCH]
    lc.event[k] = e.aux[b, EVENT]


@inline_kernel
def _fresh(e: Any, y: Any, cur: Any) -> Any:
    """Entry ``y`` is a block stored in batch ``cur`` (a new block or a re-key)."""
    return e.aux[y, OWNER] == y and e.aux[y, BATCH] == cur


@inline_kernel
def choose(
    t: Any,
    lv: Any,
    e: Any,
    s: Any,
    i: Any,
    cur: Any,
    op: Any,
    group: Any,
    no_group: Any,
    h: Any,
    sh: Any,
    rule: Any,
    lc: Last,
) -> tuple[Any, Any]:
    """The copy of key slot ``s`` the remove at row ``i`` evicts (see the module docstring).

    ``lv``: the live keys' pool (the key's copies are its live record's).

    Returns:
        (its entry, how many copies it was chosen from).
    """
    ch_g, ng = group[i], no_group[i]
    head = lv.head[t.live[s]]
    nc = 0
    old = 0
    y = head
    while y >= 0:
        nc += 1
        if not _fresh(e, y, cur):
            old += 1
        y = e.next[y]
    cands = old if old > 0 else nc
    if cands <= 1:
        y = head
        while y >= 0:
            if old == 0 or not _fresh(e, y, cur):
                return y, cands
            y = e.next[y]
    # The hashes the next events of the group remove (each event's first).
    nn = 0
    seen = 0
    j = i + 1
    while j < len(op) and sh.batch[j] == cur and seen < LOOK_AHEAD:
        start = sh.event[j] != sh.event[j - 1] and op[j] != CLEAR
        if start and group[j] == ch_g and no_group[j] == ng:
            seen += 1
            if op[j] == REMOVE:
                lc.nxt[nn] = h[j]
                nn += 1
        j += 1
    k = _slot_of(lc, t.cn[s] >> 1, ch_g, ng)
    first = -1
    newest = -1
    same = -1
    y = head
    while y >= 0:
        if old == 0 or not _fresh(e, y, cur):
            if first < 0:
                first = y
            newest = y
            b = e.aux[y, OWNER]
            if (
                same < 0
                and k >= 0
                and e.aux[b, BATCH] == lc.batch[k]
                and e.aux[b, EVENT] == lc.event[k]
            ):
                same = y
            if nn:
                z = b
                while z >= 0:
                    zs = e.aux[z, SLOT]
                    if zs != s:
                        for m in range(nn):
                            if t.hash[zs] == lc.nxt[m]:
                                return y, cands
                    z = e.aux[z, BNEXT]
        y = e.next[y]
    if rule == NEWEST:
        return newest, cands
    if rule == ADJACENT and same >= 0:
        return same, cands
    return first, cands


__all__ = [
    "ADJACENT",
    "LOOK_AHEAD",
    "NEWEST",
    "NOTE_COPY",
    "OLDEST",
    "RULES",
    "Last",
    "choose",
    "last_evicted",
    "remember",
]
