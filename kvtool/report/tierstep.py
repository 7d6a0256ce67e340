"""The tier-transition step of ``report --by medium`` (:mod:`kvtool.report.tiers`), in numba.

One sequential loop over a chunk's block rows of the channels that show two media or more,
one branch per row kind, with no Python object per row. Its state lives in arrays carried
between chunks (:class:`TierState`):

- a key table over (channel, hash), open addressing with linear probing: per slot the
  list of the key's live copies and the list of the copies whose last block of a medium
  went in the channel's current batch (valid while the slot's batch tag is the channel's);
- a pool of list nodes, each a copy (medium, no_group, group) with its block count, and a
  stack of the free ones;
- per channel its last seq and the id of its current batch (a new id at every new seq and
  every ``AllBlocksCleared``: the batch's removed copies are then forgotten at once);
- the kind of each (channel, group) from its stores.

The loop stops early (returning where) when the pool or the table would run out; the
caller grows them (:meth:`TierState.grow`, dropping keys with no copy) and calls it again.
The rules are the ones :mod:`kvtool.report.tiers` states.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kvtool._jit import inline_kernel, kernel
from kvtool.report.kbase import mix

EMPTY = -1
"""A free slot's channel (channel indexes are dense, from 0)."""

_STORED, _REMOVED, _CLEARED = 0, 1, 2
_FIRST, _WHILE_LIVE, _RECOMPUTED, _EVICTED = 1, 2, 3, 4
USED, FREE, NEXT_BATCH, N_KINDS, N_OUT = 0, 1, 2, 3, 4
"""Indexes into :attr:`TierState.meta`."""


class TierState:
    """The step's state: arrays carried between chunks (see the module docstring).

    Args:
        slots: The key table's first size (a power of two).
        nodes: The node pool's first size.
    """

    def __init__(self, slots: int = 1024, nodes: int = 1024) -> None:
        self.meta = np.zeros(5, np.int64)
        self._table(slots)
        self._pool(nodes)
        self.chan_last = np.zeros(0, np.int64)
        self.chan_has_last = np.zeros(0, np.bool_)
        self.chan_batch = np.zeros(0, np.int64)
        self.gk_c = np.zeros(16, np.int64)
        self.gk_g = np.zeros(16, np.int64)
        self.gk_k = np.zeros(16, np.int64)

    def _table(self, slots: int) -> None:
        self.tab_c = np.full(slots, EMPTY, np.int64)
        self.tab_h = np.zeros(slots, np.int64)
        self.tab_live = np.full(slots, -1, np.int64)
        self.tab_gone = np.full(slots, -1, np.int64)
        self.tab_tag = np.full(slots, -1, np.int64)

    def _pool(self, nodes: int) -> None:
        self.node_m = np.zeros(nodes, np.int64)
        self.node_ng = np.zeros(nodes, np.bool_)
        self.node_g = np.zeros(nodes, np.int64)
        self.node_n = np.zeros(nodes, np.int64)
        self.node_next = np.full(nodes, -1, np.int64)
        self.free = np.arange(nodes - 1, -1, -1, dtype=np.int64)
        self.meta[FREE] = nodes

    def channels(self, n: int) -> None:
        """Make room for channel indexes below ``n``."""
        old = len(self.chan_last)
        if n > old:
            self.chan_last = np.concatenate([self.chan_last, np.zeros(n - old, np.int64)])
            self.chan_has_last = np.concatenate([self.chan_has_last, np.zeros(n - old, np.bool_)])
            self.chan_batch = np.concatenate([self.chan_batch, np.full(n - old, -1, np.int64)])

    def group_kinds(self, more: int) -> None:
        """Make room for ``more`` (channel, group) kinds."""
        need = int(self.meta[N_KINDS]) + more
        if need > len(self.gk_c):
            size = max(2 * len(self.gk_c), need)
            for name in ("gk_c", "gk_g", "gk_k"):
                old = getattr(self, name)
                new = np.zeros(size, np.int64)
                new[: len(old)] = old
                setattr(self, name, new)

    def grow(self, keys: int, nodes: int) -> None:
        """Make room for ``keys`` more keys and ``nodes`` more copies.

        The table is rebuilt without the keys that hold no copy (and the pool takes back
        the stale lists of removed copies) before it is made larger.
        """
        if int(self.meta[FREE]) < nodes:
            size = len(self.node_m)
            new = max(2 * size, size + nodes - int(self.meta[FREE]))
            for name, fill in (("node_m", 0), ("node_g", 0), ("node_n", 0), ("node_next", -1)):
                old = getattr(self, name)
                arr = np.full(new, fill, np.int64)
                arr[:size] = old
                setattr(self, name, arr)
            ng = np.zeros(new, np.bool_)
            ng[:size] = self.node_ng
            self.node_ng = ng
            n_free = int(self.meta[FREE])
            free = np.zeros(new, np.int64)
            free[:n_free] = self.free[:n_free]
            free[n_free : n_free + new - size] = np.arange(new - 1, size - 1, -1)
            self.free = free
            self.meta[FREE] = n_free + new - size
        if (int(self.meta[USED]) + keys) * 2 > len(self.tab_c):
            old = (self.tab_c, self.tab_h, self.tab_live, self.tab_gone, self.tab_tag)
            kept = _prune(*old, self.chan_batch, self.node_next, self.free, self.meta)
            size = len(self.tab_c)
            while (kept + keys) * 2 > size:
                size *= 2
            self._table(size)
            self.meta[USED] = _rehash(
                *old, self.tab_c, self.tab_h, self.tab_live, self.tab_gone, self.tab_tag
            )


@inline_kernel
def _find(tab_c: Any, tab_h: Any, c: Any, h: Any) -> Any:
    """The slot of key (c, h), or the free slot where it would go."""
    mask = np.uint64(len(tab_c) - 1)
    s = np.int64(mix(c, 0, False, h) & mask)
    while True:
        k = tab_c[s]
        if k == EMPTY or (k == c and tab_h[s] == h):
            return s
        s = np.int64((np.uint64(s) + np.uint64(1)) & mask)


@inline_kernel
def _free_list(head: Any, node_next: Any, free: Any, meta: Any) -> None:
    n = head
    while n >= 0:
        nxt = node_next[n]
        free[meta[FREE]] = n
        meta[FREE] += 1
        n = nxt


@kernel
def _prune(
    tab_c: Any,
    tab_h: Any,
    tab_live: Any,
    tab_gone: Any,
    tab_tag: Any,
    chan_batch: Any,
    node_next: Any,
    free: Any,
    meta: Any,
) -> int:
    """Free the stale lists of removed copies; return how many keys still hold a list."""
    kept = 0
    for s in range(len(tab_c)):
        c = tab_c[s]
        if c == EMPTY:
            continue
        if tab_gone[s] >= 0 and tab_tag[s] != chan_batch[c]:
            _free_list(tab_gone[s], node_next, free, meta)
            tab_gone[s] = -1
        if tab_live[s] >= 0 or tab_gone[s] >= 0:
            kept += 1
    return kept


@kernel
def _rehash(
    tab_c: Any,
    tab_h: Any,
    tab_live: Any,
    tab_gone: Any,
    tab_tag: Any,
    new_c: Any,
    new_h: Any,
    new_live: Any,
    new_gone: Any,
    new_tag: Any,
) -> int:
    """Move every key that holds a list into the new (empty) table; return how many."""
    used = 0
    for s in range(len(tab_c)):
        c = tab_c[s]
        if c == EMPTY or (tab_live[s] < 0 and tab_gone[s] < 0):
            continue
        d = _find(new_c, new_h, c, tab_h[s])
        new_c[d] = c
        new_h[d] = tab_h[s]
        new_live[d] = tab_live[s]
        new_gone[d] = tab_gone[s]
        new_tag[d] = tab_tag[s]
        used += 1
    return used


@inline_kernel
def _alloc(m: Any, ng: Any, g: Any, n: Any, nxt: Any, st: Any) -> Any:
    (node_m, node_ng, node_g, node_n, node_next, free, meta) = st
    meta[FREE] -= 1
    i = free[meta[FREE]]
    node_m[i] = m
    node_ng[i] = ng
    node_g[i] = g
    node_n[i] = n
    node_next[i] = nxt
    return i


@inline_kernel
def _key_rank(cm: Any, t: Any, rank: Any, name_ord: Any) -> Any:
    """The nearness of medium ``cm`` to target ``t`` (smaller is nearer), as a tuple."""
    if rank[cm] < 0 or rank[t] < 0:
        return (99, 99, name_ord[cm])
    return (abs(rank[cm] - rank[t]), rank[cm], name_ord[cm])


@inline_kernel
def _kind_of(c: Any, g: Any, gk_c: Any, gk_g: Any, gk_k: Any, meta: Any) -> Any:
    for j in range(meta[N_KINDS]):
        if gk_c[j] == c and gk_g[j] == g:
            return gk_k[j]
    return -1


@inline_kernel
def _set_kind(c: Any, g: Any, k: Any, gk_c: Any, gk_g: Any, gk_k: Any, meta: Any) -> None:
    for j in range(meta[N_KINDS]):
        if gk_c[j] == c and gk_g[j] == g:
            gk_k[j] = k
            return
    j = meta[N_KINDS]
    gk_c[j] = c
    gk_g[j] = g
    gk_k[j] = k
    meta[N_KINDS] += 1


@inline_kernel
def _source(
    head: Any, m: Any, ng: Any, g: Any, node: Any, rank: Any, name_ord: Any
) -> tuple[Any, Any]:
    """The nearest medium of the list's copies in another medium of a matching group.

    Returns (medium, 1) or (-1, 0) when no copy matches.
    """
    node_m, node_ng, node_g, node_next = node
    best = -1
    best_key = (0, 0, 0)
    n = head
    while n >= 0:
        if node_m[n] != m and (node_ng[n] or ng or node_g[n] == g):
            key = _key_rank(node_m[n], m, rank, name_ord)
            if best < 0 or key < best_key:
                best = node_m[n]
                best_key = key
        n = node_next[n]
    return best, 1 if best >= 0 else 0


@inline_kernel
def _source_kind(
    head: Any, c: Any, m: Any, ng: Any, g: Any, src: Any, node: Any, gk: Any, meta: Any
) -> Any:
    """The kind the matching copies in ``src`` agree on (their groups' stores), else -1."""
    node_m, node_ng, node_g, node_next = node
    gk_c, gk_g, gk_k = gk
    first = -1
    n = head
    while n >= 0:
        if node_m[n] == src and (node_ng[n] or ng or node_g[n] == g) and not node_ng[n]:
            k = _kind_of(c, node_g[n], gk_c, gk_g, gk_k, meta)
            if k >= 0:
                if first < 0:
                    first = k
                elif k != first:
                    return -1
        n = node_next[n]
    return first


@kernel
def seed(
    c: int,
    medium: int,
    h: Any,
    group: Any,
    no_group: Any,
    tab: Any,
    pool: Any,
    meta: Any,
) -> None:
    """Add live copies of ``medium`` on channel ``c`` (one per entry), as a kernel holds them.

    The caller made room (:meth:`TierState.grow`) for ``len(h)`` keys and copies.
    """
    tab_c, tab_h, tab_live = tab
    node_m, node_ng, node_g, node_n, node_next, free = pool
    st = (node_m, node_ng, node_g, node_n, node_next, free, meta)
    for i in range(len(h)):
        s = _find(tab_c, tab_h, c, h[i])
        if tab_c[s] == EMPTY:
            tab_c[s] = c
            tab_h[s] = h[i]
            tab_live[s] = -1
            meta[USED] += 1
        ng = no_group[i]
        g = 0 if ng else group[i]
        n = tab_live[s]
        while n >= 0 and not (node_m[n] == medium and node_ng[n] == ng and node_g[n] == g):
            n = node_next[n]
        if n >= 0:
            node_n[n] += 1
        else:
            tab_live[s] = _alloc(medium, ng, g, 1, tab_live[s], st)


@kernel
def step(
    start: int,
    rows: Any,
    tab: Any,
    pool: Any,
    chans: Any,
    gk: Any,
    media: Any,
    out: Any,
    meta: Any,
) -> int:
    """Walk block rows from ``start`` in stream order: liveness across media, transitions.

    Args:
        start: The first row to walk.
        rows: (channel index, seq, type code, no hash, no group, group, hash, medium id,
            the medium kernel's verdict, kind id or -1), one array each.
        tab: The key table's arrays (channel, hash, live list, gone list, batch tag).
        pool: The node arrays (medium, no_group, group, count, next) and the free stack.
        chans: Per channel index: last seq, has a last seq, current batch id.
        gk: The (channel, group) kinds: channel, group, kind id.
        media: Per medium id: tier rank (-1: none) and name order.
        out: Transitions found: kind id, source medium, target medium (``meta[N_OUT]`` of
            them so far).
        meta: Counters (:data:`USED`, :data:`FREE`, ...).

    Returns:
        The row it stopped at: ``len`` of the rows when done, less when the table or the
        pool must grow first.
    """
    cidx, seq, tc, no_hash, no_group, group, hashes, med, what, kind = rows
    tab_c, tab_h, tab_live, tab_gone, tab_tag = tab
    node_m, node_ng, node_g, node_n, node_next, free = pool
    chan_last, chan_has_last, chan_batch = chans
    gk_c, gk_g, gk_k = gk
    rank, name_ord = media
    out_k, out_s, out_d = out
    st = (node_m, node_ng, node_g, node_n, node_next, free, meta)
    node = (node_m, node_ng, node_g, node_next)
    cap = len(tab_c)
    for i in range(start, len(cidx)):
        if meta[FREE] < 2 or (meta[USED] + 1) * 2 > cap or meta[N_KINDS] >= len(gk_c):
            return i
        c = cidx[i]
        s = seq[i]
        new_batch = not chan_has_last[c] or s != chan_last[c]
        if chan_has_last[c] and s < chan_last[c]:
            _clear(c, tab_c, tab_live, node_next, free, meta)  # a publisher restart
        chan_last[c] = s
        chan_has_last[c] = True
        if new_batch:
            chan_batch[c] = meta[NEXT_BATCH]
            meta[NEXT_BATCH] += 1
        t = tc[i]
        if t == _CLEARED:
            _clear(c, tab_c, tab_live, node_next, free, meta)
            chan_batch[c] = meta[NEXT_BATCH]  # the batch's removed copies go too
            meta[NEXT_BATCH] += 1
            continue
        if no_hash[i]:
            continue
        ng = no_group[i]
        g = 0 if ng else group[i]
        m = med[i]
        h = hashes[i]
        v = what[i]
        if t == _STORED and v in (_FIRST, _WHILE_LIVE, _RECOMPUTED):
            if kind[i] >= 0 and not ng:
                _set_kind(c, g, kind[i], gk_c, gk_g, gk_k, meta)
            sl = _find(tab_c, tab_h, c, h)
            if tab_c[sl] == EMPTY:
                tab_c[sl] = c
                tab_h[sl] = h
                tab_live[sl] = -1
                tab_gone[sl] = -1
                tab_tag[sl] = -1
                meta[USED] += 1
            if v != _WHILE_LIVE:
                # A copy elsewhere of the same group (an ungrouped side matches any group);
                # else one whose last block went earlier in this batch (a move).
                head = tab_live[sl]
                src, found = _source(head, m, ng, g, node, rank, name_ord)
                if not found and tab_tag[sl] == chan_batch[c]:
                    head = tab_gone[sl]
                    src, found = _source(head, m, ng, g, node, rank, name_ord)
                if found:
                    k = kind[i]
                    if k < 0:
                        k = _source_kind(head, c, m, ng, g, src, node, gk, meta)
                    j = meta[N_OUT]
                    out_k[j] = k
                    out_s[j] = src
                    out_d[j] = m
                    meta[N_OUT] += 1
            n = tab_live[sl]
            while n >= 0 and not (node_m[n] == m and node_ng[n] == ng and node_g[n] == g):
                n = node_next[n]
            if n >= 0:
                node_n[n] += 1
            else:
                tab_live[sl] = _alloc(m, ng, g, 1, tab_live[sl], st)
        elif t == _REMOVED and v == _EVICTED:
            sl = _find(tab_c, tab_h, c, h)
            if tab_c[sl] == EMPTY:
                continue
            prev = -1
            n = tab_live[sl]
            while n >= 0 and not (node_m[n] == m and node_ng[n] == ng and node_g[n] == g):
                prev = n
                n = node_next[n]
            if n < 0:
                continue
            node_n[n] -= 1
            if node_n[n] > 0:
                continue
            if prev < 0:
                tab_live[sl] = node_next[n]
            else:
                node_next[prev] = node_next[n]
            free[meta[FREE]] = n
            meta[FREE] += 1
            if tab_tag[sl] != chan_batch[c]:
                _free_list(tab_gone[sl], node_next, free, meta)
                tab_gone[sl] = -1
                tab_tag[sl] = chan_batch[c]
            n = tab_gone[sl]
            while n >= 0 and not (node_m[n] == m and node_ng[n] == ng and node_g[n] == g):
                n = node_next[n]
            if n < 0:
                tab_gone[sl] = _alloc(m, ng, g, 0, tab_gone[sl], st)
    return len(cidx)


@inline_kernel
def _clear(c: Any, tab_c: Any, tab_live: Any, node_next: Any, free: Any, meta: Any) -> None:
    """Drop every live copy of channel ``c`` (a clear, a restart)."""
    for s in range(len(tab_c)):
        if tab_c[s] == c and tab_live[s] >= 0:
            _free_list(tab_live[s], node_next, free, meta)
            tab_live[s] = -1


__all__ = ["EMPTY", "TierState", "seed", "step"]
