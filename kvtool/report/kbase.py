"""What the state kernel's modules share: the key table's probe, the row flags and codes.

The state kernel is :mod:`kvtool.report.kernel` (the rules loop and :func:`step`), over
:mod:`kvtool.report.kstate` (the key table, the entry pool, :class:`State`),
:mod:`kvtool.report.krules` (the per-batch bookkeeping of the issue 21 rules),
:mod:`kvtool.report.kcopy` (R8: which copy an eviction takes),
:mod:`kvtool.report.kplain` (the block-16 loop) and :mod:`kvtool.report.announce` (hit
announcements). Each imports only the ones below it; what they all read lives here.
"""

from __future__ import annotations

from typing import Any

from kvtool._jit import inline_kernel, kernel, prefetcher
from kvtool.columns import np

EMPTY = -1
"""``Table.cn`` of an empty slot."""

OWNER, BNEXT, SLOT, BATCH, ROW, BITS, STAMP, EVENT = range(8)
"""Columns of ``Entries.aux`` (one row, one cache line, per entry; see
:class:`kvtool.report.kstate.Entries`)."""
AUX_FILL = (-1, -1, -1, -1, -1, 0, 0, -1)
"""``Entries.aux`` of a fresh entry."""
PARTIAL_BIT, LAST_BIT, LIVE_BIT = 1, 2, 4
"""Bits of ``Entries.aux[:, BITS]``: a partial primary key, the last block of its store
event, live."""
SKIP, STORE, REMOVE, CLEAR = 0, 1, 2, 3
"""Row kinds, the kernel's input (``op``): a row the state does not see, a store of one
block, a remove of one block, an ``AllBlocksCleared`` of the row's channel."""

NONE, FIRST, WHILE_LIVE, RECOMPUTED, EVICTED, ORPHAN = 0, 1, 2, 3, 4, 5
"""What a row was (the kernel's output ``what``)."""

EXTRA, EXTRA_NOOP, REKEY, DISCARDED_STORE = 6, 7, 8, 9
"""What a store was beyond a new block (issue 21, docs/SEMANTICS.md): a partial key added
to a block already cached (R2), one that block already had, a new key on a block already
cached (a partial block promoted to full, R4; a Mamba checkpoint re-keyed, R5), a Mamba
checkpoint stored and discarded in the same batch (R5: it leaves ``blocks_stored``)."""

EVICTED_EXTRA, PROMOTED, REKEY_REMOVE, DISCARD = 10, 11, 12, 13
"""What a remove was beyond an eviction: a further key of a block evicted just before (R3),
a partial primary key replaced when its block fills (R4), a Mamba checkpoint's old key on
a re-key, a transient Mamba checkpoint discarded (R5)."""

NOTE_PARTIAL = 3
"""``Out.note`` of a store of a partial key that is its block's primary key (R2; the
export's ``meaning`` ``partial_primary``)."""

MAKES_BLOCK = (FIRST, WHILE_LIVE, RECOMPUTED)
"""The ``what`` of a store of a new physical block (``blocks_stored``)."""

UNIT = 16
"""Tokens: vLLM's block sizes and hash units are multiples of it."""

FLAG_MAMBA, FLAG_WINDOW, FLAG_CHANNEL_MAMBA, FLAG_PREFIX, FLAG_TIER = 1, 2, 4, 8, 16
"""Bits of :attr:`kvtool.report.kernel.Shape.flags`: the row's group is a Mamba group, a
sliding-window group (no partial entries), the row's channel has a Mamba group (its
metadata says so), the row's group hits by whole prefixes (full attention, MLA, sink:
vLLM's ``FullAttentionManager`` family), the row's ``medium`` is another tier than the GPU
block pool's (an offload: never a hit announcement)."""


@kernel
def mix(chan: Any, group: Any, no_group: Any, h: Any) -> Any:
    """splitmix64's finaliser over the key's parts (uint64 arithmetic throughout)."""
    x = np.uint64(h) ^ (np.uint64(chan) * np.uint64(0x9E3779B97F4A7C15))
    x ^= np.uint64(group) * np.uint64(0xC2B2AE3D27D4EB4F)
    if no_group:
        x ^= np.uint64(0x165667B19E3779F9)
    x ^= x >> np.uint64(30)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(27)
    x *= np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    return x


@inline_kernel
def code(chan: Any, no_group: Any) -> Any:
    """A key's channel and ``no_group`` as the table holds them (``Table.cn``)."""
    return np.int64(chan) * 2 + (1 if no_group else 0)


@kernel
def probe(t: Any, chan: Any, group: Any, no_group: Any, h: Any) -> Any:
    """The slot of the table ``t`` holding the key, or the empty slot where it would go."""
    mask = np.uint64(len(t.cn) - 1)
    s = np.int64(mix(chan, group, no_group, h) & mask)
    cn = code(chan, no_group)
    while True:
        c = t.cn[s]
        if c == EMPTY:
            return s
        if c == cn and t.hash[s] == h and t.group[s] == group:
            return s
        s = np.int64((np.uint64(s) + np.uint64(1)) & mask)


AHEAD = 16
"""How many rows ahead a per-row loop names the table slots it will probe (:func:`ahead`)."""

_prefetch = prefetcher()


@inline_kernel
def ahead(t: Any, op: Any, chan: Any, group: Any, no_group: Any, h: Any, i: Any) -> None:
    """Ask the CPU for the table slot of row ``i + AHEAD`` (a store's or a remove's key).

    Only a hint (:func:`kvtool._jit.prefetcher`): nothing is read or written, so the loop
    that calls it gives the same answers; its table's cache misses, one per array of the
    slot, overlap the rows before instead of stalling each probe in turn.
    """
    j = i + AHEAD
    if j >= len(op) or (op[j] != STORE and op[j] != REMOVE):
        return
    s = np.int64(mix(chan[j], group[j], no_group[j], h[j]) & np.uint64(len(t.cn) - 1))
    _prefetch(t.cn, s)
    _prefetch(t.hash, s)
    _prefetch(t.group, s)
    _prefetch(t.live, s)
    _prefetch(t.gone_ts, s)
    _prefetch(t.gone_evictions, s)


__all__ = [
    "AUX_FILL",
    "BATCH",
    "BITS",
    "BNEXT",
    "CLEAR",
    "DISCARD",
    "DISCARDED_STORE",
    "EMPTY",
    "EVENT",
    "EVICTED",
    "EVICTED_EXTRA",
    "EXTRA",
    "EXTRA_NOOP",
    "FIRST",
    "FLAG_CHANNEL_MAMBA",
    "FLAG_MAMBA",
    "FLAG_PREFIX",
    "FLAG_TIER",
    "FLAG_WINDOW",
    "LAST_BIT",
    "LIVE_BIT",
    "MAKES_BLOCK",
    "NONE",
    "NOTE_PARTIAL",
    "ORPHAN",
    "OWNER",
    "PARTIAL_BIT",
    "PROMOTED",
    "RECOMPUTED",
    "REKEY",
    "REKEY_REMOVE",
    "REMOVE",
    "ROW",
    "SKIP",
    "SLOT",
    "STAMP",
    "STORE",
    "UNIT",
    "WHILE_LIVE",
    "code",
    "mix",
    "probe",
]
