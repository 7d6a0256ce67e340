"""The sequential state kernel: the live-block multiset, walked one block row at a time (numba).

DESIGN.md "Report semantics": the state is a multiset over the key (channel, group,
hash) -- a channel is one publisher stream (endpoint, topic, rank), so one engine and
one block pool. +1 per stored hash, -1 per removed hash, never below zero;
``AllBlocksCleared`` empties its channel. A publisher restart is not seen here: the builder
gives the restarted stream a new channel number and clears the old one (issue 23). What
each row is:

- a store of a key never stored before is a *first store*;
- a store of a key that is live is *stored while live* (a second copy, or a hit
  announced again);
- a store of a key stored earlier and not live now (evicted or cleared since) is a
  *recompute*: its *gap* is the time since the removal (or clear) that left the key
  with no copy, its *distance* the evictions in the pool (every effective remove of
  the channel, in any group) after that removal and before the store;
- a remove of a live key is *effective* (an eviction): it removes the key's oldest
  copy (first in, first out), whose store time and report row make the lifetime;
- a remove of a key that is not live is an *orphan*.

State carried between calls, all in arrays (:class:`State`):

- an open-addressing hash table over the key (linear probing, capacity a power of two,
  at most 70 % full: :meth:`State.reserve` grows it between calls). A key stays in the
  table once stored (that is what tells a recompute from a first store); per key: the
  live count, the head and tail of its FIFO list of copies, when and after how many
  evictions of its pool it last went from live to not live, and its links in its
  channel's list of live keys (a clear walks that list only);
- an entry pool: one entry per live copy (store time, report row, next), with a free
  list;
- per channel: the head of its live-key list and its eviction count;
- per report row: its live copies now.

:func:`advance` is the one loop: one branch per row kind (store, remove, clear).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

from kvtool._jit import kernel
from kvtool.columns import np

if TYPE_CHECKING:
    from numpy.typing import NDArray

SKIP, STORE, REMOVE, CLEAR = 0, 1, 2, 3
"""Row kinds, the kernel's input (``op``): a row the state does not see, a store of one
block, a remove of one block, an ``AllBlocksCleared`` of the row's channel."""

NONE, FIRST, WHILE_LIVE, RECOMPUTED, EVICTED, ORPHAN = 0, 1, 2, 3, 4, 5
"""What a row was (the kernel's output ``what``)."""

_EMPTY = -1


class Table(NamedTuple):
    """The hash table over (channel, group, no_group, hash): one slot per key ever stored.

    Attributes:
        chan: Channel of the slot's key (-1: an empty slot).
        group: Group (0 where ``no_group``).
        no_group: The key has no ``group_idx`` (older vLLM).
        hash: Block hash.
        copies: Live copies.
        head: Oldest live copy (entry index, -1: none).
        tail: Newest live copy.
        gone_ts: When the key last went from live to not live (seconds).
        gone_evictions: Its pool's eviction count just after that.
        prev: Previous live key of the channel (slot, -1: none).
        next: Next live key of the channel.
    """

    chan: NDArray[Any]
    group: NDArray[Any]
    no_group: NDArray[Any]
    hash: NDArray[Any]
    copies: NDArray[Any]
    head: NDArray[Any]
    tail: NDArray[Any]
    gone_ts: NDArray[Any]
    gone_evictions: NDArray[Any]
    prev: NDArray[Any]
    next: NDArray[Any]


class Entries(NamedTuple):
    """The entry pool: one entry per live copy of a key.

    Attributes:
        ts: Store time (seconds).
        gkey: The report row it was stored under.
        next: The key's next younger copy, or the next free entry (-1: none).
    """

    ts: NDArray[Any]
    gkey: NDArray[Any]
    next: NDArray[Any]


class Channels(NamedTuple):
    """Per channel (one block pool).

    Attributes:
        head: First live key (slot, -1: none).
        evictions: Effective removes so far.
    """

    head: NDArray[Any]
    evictions: NDArray[Any]


# meta: [keys in the table, entries ever handed out, head of the free list]
_KEYS, _USED, _FREE = 0, 1, 2


class Out(NamedTuple):
    """What one call found, per input row and per clear.

    Attributes:
        what: Per row: :data:`NONE`, :data:`FIRST`, :data:`WHILE_LIVE`,
            :data:`RECOMPUTED`, :data:`EVICTED` or :data:`ORPHAN`.
        ts: An eviction: the removed copy's store time; a recompute: when the key went.
        gkey: An eviction: the report row the removed copy was stored under (else -1).
        distance: A recompute: the pool's evictions between the key's removal and now.
        drop_row: Per (clear, report row) with copies dropped: the clear's row.
        drop_gkey: That report row.
        drop_n: How many of its copies the clear dropped.
    """

    what: NDArray[Any]
    ts: NDArray[Any]
    gkey: NDArray[Any]
    distance: NDArray[Any]
    drop_row: NDArray[Any]
    drop_gkey: NDArray[Any]
    drop_n: NDArray[Any]


def _table(capacity: int) -> Table:
    # Slots and entries are numbered in int32 (a table of 2**31 keys would need 120 GB):
    # 57 bytes a slot instead of 81.
    i32, i64 = np.int32, np.int64
    return Table(
        np.full(capacity, _EMPTY, dtype=i32),
        np.zeros(capacity, dtype=i64),
        np.zeros(capacity, dtype=np.bool_),
        np.zeros(capacity, dtype=i64),
        np.zeros(capacity, dtype=i32),
        np.full(capacity, -1, dtype=i32),
        np.full(capacity, -1, dtype=i32),
        np.zeros(capacity, dtype=np.float64),
        np.zeros(capacity, dtype=i64),
        np.full(capacity, -1, dtype=i32),
        np.full(capacity, -1, dtype=i32),
    )


def _grown(a: NDArray[Any], size: int, fill: Any) -> NDArray[Any]:
    out = np.full(size, fill, dtype=a.dtype)
    out[: len(a)] = a
    return out


class State:
    """The kernel's state, carried between chunks (see the module docstring).

    A fresh state is empty; :meth:`reserve` makes room before each :func:`advance`.

    Args:
        max_keys: Keep at most about this many keys (None: every key ever stored, exact).
            Past it, :meth:`reserve` forgets the keys that went not live the longest ago
            (down to three quarters of it, at least a quarter at a time; live keys are
            never forgotten, so at most a quarter of it is gone keys kept beside them when
            they alone pass it): a later store of a forgotten key is a first store, not a
            recompute. :attr:`forgotten` counts them, :attr:`forgotten_ts` is the newest
            removal time forgotten.
    """

    def __init__(self, max_keys: int | None = None) -> None:
        self.max_keys = max_keys
        self.forgotten = 0
        self.forgotten_ts: float | None = None
        self.table = _table(1 << 10)
        self.entries = Entries(
            np.zeros(0, dtype=np.float64), np.zeros(0, dtype=np.int32), np.zeros(0, np.int32)
        )
        self.channels = Channels(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))
        self.meta = np.array([0, 0, -1], dtype=np.int64)
        self.live_gkey = np.zeros(0, dtype=np.int64)

    @property
    def keys(self) -> int:
        """Keys in the table (every key ever stored)."""
        return int(self.meta[_KEYS])

    def reserve(self, stores: int, top_channel: int, gkeys: int) -> None:
        """Make room for ``stores`` more stores, channels up to ``top_channel``, ``gkeys`` rows.

        Args:
            stores: Stores in the next call (each may add a key and an entry).
            top_channel: The largest channel id of the next call.
            gkeys: Report rows the next call may name.
        """
        if self.max_keys is not None and self.keys + stores > self.max_keys:
            self._forget(self.keys + stores - self.max_keys * 3 // 4, stores)
        cap = len(self.table.chan)
        need = self.keys + stores
        if 10 * need > 7 * cap:  # at most 70 % full: linear probing stays short
            while 10 * need > 7 * cap:
                cap *= 2
            new = _table(cap)
            _rehash(self.table, new, self.channels.head)
            self.table = new
        e = self.entries
        want = int(self.meta[_USED]) + stores
        if want > len(e.ts):
            size = max(want, 2 * len(e.ts), 1 << 10)
            self.entries = Entries(
                _grown(e.ts, size, 0.0), _grown(e.gkey, size, 0), _grown(e.next, size, -1)
            )
        c = self.channels
        if top_channel >= len(c.head):
            size = top_channel + 1
            self.channels = Channels(_grown(c.head, size, -1), _grown(c.evictions, size, 0))
        if gkeys > len(self.live_gkey):
            self.live_gkey = _grown(self.live_gkey, gkeys, 0)

    def _forget(self, excess: int, stores: int) -> None:
        """Forget up to ``excess`` not-live keys, those gone longest ago, and rebuild the table.

        Linear probing cannot leave holes in a probe run: the kept keys move into a new
        table (sized for them and the next call's ``stores``), as when it grows.
        """
        t = self.table
        gone = np.flatnonzero((t.chan != _EMPTY) & (t.copies == 0))
        k = min(excess, len(gone))
        if k <= 0 or k < (self.max_keys or 0) // 4:
            # Mostly live keys (never forgotten): wait until a quarter of the bound can go,
            # so that a rebuild is not paid on every call (the gone keys stay below that).
            return
        drop = gone[np.argpartition(t.gone_ts[gone], k - 1)[:k]] if k < len(gone) else gone
        newest = float(t.gone_ts[drop].max())
        self.forgotten_ts = newest if self.forgotten_ts is None else max(self.forgotten_ts, newest)
        self.forgotten += k
        t.chan[drop] = _EMPTY  # not live: in no channel's live-key list, no entries
        self.meta[_KEYS] -= k
        cap = 1 << 10
        while 10 * (self.keys + stores) > 7 * cap:
            cap *= 2
        new = _table(cap)
        _rehash(t, new, self.channels.head)
        self.table = new

    def live_entries(self) -> tuple[NDArray[Any], ...]:
        """Every live copy: channel, group, no_group, hash, store time, report row.

        Returns:
            Six arrays, one row per live copy; a key's copies oldest first.
        """
        n = int(self.live_gkey.sum())
        out = (
            np.zeros(n, np.int64),
            np.zeros(n, np.int64),
            np.zeros(n, np.bool_),
            np.zeros(n, np.int64),
            np.zeros(n, np.float64),
            np.zeros(n, np.int64),
        )
        _live_entries(self.table, self.entries, *out)
        return out


@kernel
def _mix(chan: Any, group: Any, no_group: Any, h: Any) -> Any:
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


@kernel
def _probe(t: Table, chan: Any, group: Any, no_group: Any, h: Any) -> Any:
    """The slot holding the key, or the empty slot where it would go."""
    mask = np.uint64(len(t.chan) - 1)
    s = np.int64(_mix(chan, group, no_group, h) & mask)
    while True:
        c = t.chan[s]
        if c == _EMPTY:
            return s
        if c == chan and t.hash[s] == h and t.group[s] == group and t.no_group[s] == no_group:
            return s
        s = np.int64((np.uint64(s) + np.uint64(1)) & mask)


@kernel
def _rehash(old: Table, new: Table, chan_head: Any) -> None:
    """Move every key of ``old`` into ``new`` (emptier), and re-point the live-key lists."""
    where = np.full(len(old.chan), -1, dtype=np.int32)
    for s in range(len(old.chan)):
        c = old.chan[s]
        if c == _EMPTY:
            continue
        d = _probe(new, c, old.group[s], old.no_group[s], old.hash[s])
        where[s] = d
        new.chan[d] = c
        new.group[d] = old.group[s]
        new.no_group[d] = old.no_group[s]
        new.hash[d] = old.hash[s]
        new.copies[d] = old.copies[s]
        new.head[d] = old.head[s]
        new.tail[d] = old.tail[s]
        new.gone_ts[d] = old.gone_ts[s]
        new.gone_evictions[d] = old.gone_evictions[s]
    for s in range(len(old.chan)):
        d = where[s]
        if d >= 0:
            new.prev[d] = where[old.prev[s]] if old.prev[s] >= 0 else -1
            new.next[d] = where[old.next[s]] if old.next[s] >= 0 else -1
    for c in range(len(chan_head)):
        if chan_head[c] >= 0:
            chan_head[c] = where[chan_head[c]]


@kernel
def _live_entries(
    t: Table,
    e: Entries,
    chan: Any,
    group: Any,
    no_group: Any,
    h: Any,
    ts: Any,
    gkey: Any,
) -> None:
    n = 0
    for s in range(len(t.chan)):
        if t.chan[s] == _EMPTY:
            continue
        x = t.head[s]
        while x >= 0:
            chan[n] = t.chan[s]
            group[n] = t.group[s]
            no_group[n] = t.no_group[s]
            h[n] = t.hash[s]
            ts[n] = e.ts[x]
            gkey[n] = e.gkey[x]
            n += 1
            x = e.next[x]


@kernel
def advance(
    t: Table,
    e: Entries,
    c: Channels,
    meta: Any,
    live_gkey: Any,
    op: Any,
    chan: Any,
    group: Any,
    no_group: Any,
    h: Any,
    ts: Any,
    gkey: Any,
    out: Out,
) -> int:
    """Walk one chunk's rows in stream order (see the module docstring).

    Args:
        t: The hash table (room for every store of the chunk: :meth:`State.reserve`).
        e: The entry pool (likewise).
        c: Per channel (every channel of the chunk).
        meta: Keys, entries handed out, free-list head.
        live_gkey: Live copies per report row (every report row of the chunk).
        op: Per row: :data:`SKIP`, :data:`STORE`, :data:`REMOVE` or :data:`CLEAR`.
        chan: Channel of each row.
        group: Group of each row (0 where ``no_group``).
        no_group: The row has no ``group_idx``.
        h: Block hash of each row.
        ts: Time of each row (seconds).
        gkey: Report row of each row.
        out: Filled in (:class:`Out`); the drop arrays hold one slot per (clear, report
            row).

    Returns:
        The number of drops written to ``out``.
    """
    drops = 0
    scratch = np.zeros(len(live_gkey), dtype=np.int64)
    for i in range(len(op)):
        kind = op[i]
        if kind == STORE:
            ch = chan[i]
            s = _probe(t, ch, group[i], no_group[i], h[i])
            count = t.copies[s]
            if t.chan[s] == _EMPTY:
                t.chan[s] = ch
                t.group[s] = group[i]
                t.no_group[s] = no_group[i]
                t.hash[s] = h[i]
                meta[_KEYS] += 1
                out.what[i] = FIRST
            elif count > 0:
                out.what[i] = WHILE_LIVE
            else:
                out.what[i] = RECOMPUTED
                out.ts[i] = t.gone_ts[s]
                out.distance[i] = c.evictions[ch] - t.gone_evictions[s]
            x = meta[_FREE]
            if x >= 0:
                meta[_FREE] = e.next[x]
            else:
                x = meta[_USED]
                meta[_USED] += 1
            e.ts[x] = ts[i]
            e.gkey[x] = gkey[i]
            e.next[x] = -1
            if count == 0:
                t.head[s] = x
                # Into the channel's live-key list, at its head.
                first = c.head[ch]
                t.prev[s] = -1
                t.next[s] = first
                if first >= 0:
                    t.prev[first] = s
                c.head[ch] = s
            else:
                e.next[t.tail[s]] = x
            t.tail[s] = x
            t.copies[s] = count + 1
            live_gkey[gkey[i]] += 1
        elif kind == REMOVE:
            ch = chan[i]
            s = _probe(t, ch, group[i], no_group[i], h[i])
            if t.chan[s] == _EMPTY or t.copies[s] == 0:
                out.what[i] = ORPHAN
                continue
            x = t.head[s]
            out.what[i] = EVICTED
            out.ts[i] = e.ts[x]
            out.gkey[i] = e.gkey[x]
            live_gkey[e.gkey[x]] -= 1
            t.head[s] = e.next[x]
            e.next[x] = meta[_FREE]
            meta[_FREE] = x
            t.copies[s] -= 1
            c.evictions[ch] += 1
            if t.copies[s] == 0:
                t.tail[s] = -1
                t.gone_ts[s] = ts[i]
                t.gone_evictions[s] = c.evictions[ch]
                # Out of the channel's live-key list.
                p, n = t.prev[s], t.next[s]
                if p >= 0:
                    t.next[p] = n
                else:
                    c.head[ch] = n
                if n >= 0:
                    t.prev[n] = p
                t.prev[s] = -1
                t.next[s] = -1
        elif kind == CLEAR:
            ch = chan[i]
            if ch >= len(c.head):
                continue  # a channel that never stored: nothing to drop
            s = c.head[ch]
            while s >= 0:
                x = t.head[s]
                while x >= 0:
                    scratch[e.gkey[x]] += 1
                    nx = e.next[x]
                    e.next[x] = meta[_FREE]
                    meta[_FREE] = x
                    x = nx
                t.copies[s] = 0
                t.head[s] = -1
                t.tail[s] = -1
                t.gone_ts[s] = ts[i]
                t.gone_evictions[s] = c.evictions[ch]
                nxt = t.next[s]
                t.prev[s] = -1
                t.next[s] = -1
                s = nxt
            c.head[ch] = -1
            for g in range(len(scratch)):
                if scratch[g]:
                    out.drop_row[drops] = i
                    out.drop_gkey[drops] = g
                    out.drop_n[drops] = scratch[g]
                    live_gkey[g] -= scratch[g]
                    scratch[g] = 0
                    drops += 1
    return drops


def step(
    state: State,
    op: NDArray[Any],
    chan: NDArray[Any],
    group: NDArray[Any],
    no_group: NDArray[Any],
    h: NDArray[Any],
    ts: NDArray[Any],
    gkey: NDArray[Any],
    gkeys: int,
) -> Out:
    """Advance ``state`` by one chunk's rows (in stream order).

    Args:
        state: The state (changed in place).
        op: Per row: :data:`SKIP`, :data:`STORE`, :data:`REMOVE` or :data:`CLEAR`.
        chan: Channel id of each row.
        group: Group of each row (0 where ``no_group``).
        no_group: The row has no ``group_idx``.
        h: Block hash of each row.
        ts: Time of each row (float seconds).
        gkey: Report row of each row (any value where ``op`` is SKIP or CLEAR).
        gkeys: Report rows there are (every ``gkey`` of a store is below).

    Returns:
        What each row was, and the clears' drops (trimmed to their number).
    """
    n = len(op)
    is_store = op == STORE
    stores = int(is_store.sum())
    clears = int((op == CLEAR).sum())
    state.reserve(stores, int(chan.max()) if n else 0, gkeys)
    m = clears * max(gkeys, 1)
    out = Out(
        np.zeros(n, dtype=np.int8),
        np.zeros(n, dtype=np.float64),
        np.full(n, -1, dtype=np.int64),
        np.zeros(n, dtype=np.int64),
        np.zeros(m, dtype=np.int64),
        np.zeros(m, dtype=np.int64),
        np.zeros(m, dtype=np.int64),
    )
    if n == 0:
        return out
    i64 = np.int64
    drops = advance(
        state.table,
        state.entries,
        state.channels,
        state.meta,
        state.live_gkey,
        np.ascontiguousarray(op, dtype=np.int8),
        np.ascontiguousarray(chan, dtype=i64),
        np.ascontiguousarray(group, dtype=i64),
        np.ascontiguousarray(no_group, dtype=np.bool_),
        np.ascontiguousarray(h, dtype=i64),
        np.ascontiguousarray(ts, dtype=np.float64),
        np.ascontiguousarray(gkey, dtype=i64),
        out,
    )
    return out._replace(
        drop_row=out.drop_row[:drops], drop_gkey=out.drop_gkey[:drops], drop_n=out.drop_n[:drops]
    )


__all__ = [
    "CLEAR",
    "EVICTED",
    "FIRST",
    "NONE",
    "ORPHAN",
    "RECOMPUTED",
    "REMOVE",
    "SKIP",
    "STORE",
    "WHILE_LIVE",
    "Out",
    "State",
    "advance",
    "step",
]
