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

from kvtool._jit import inline_kernel, kernel
from kvtool.columns import np
from kvtool.report import announce, kcopy
from kvtool.report.announce import ANNOUNCED, ANNOUNCED_AMBIGUOUS
from kvtool.report.announce import announce as _announce
from kvtool.report.kbase import (
    AUX_FILL as _AUX_FILL,
)
from kvtool.report.kbase import (
    BATCH as _BATCH,
)
from kvtool.report.kbase import (
    BITS as _BITS,
)
from kvtool.report.kbase import (
    BNEXT as _BNEXT,
)
from kvtool.report.kbase import (
    CLEAR,
    EMPTY,
    FLAG_CHANNEL_MAMBA,
    FLAG_MAMBA,
    FLAG_PREFIX,
    FLAG_TIER,
    FLAG_WINDOW,
    REMOVE,
    SKIP,
    STORE,
)
from kvtool.report.kbase import EVENT as _EVENT
from kvtool.report.kbase import LAST_BIT as _LAST_BIT
from kvtool.report.kbase import LIVE_BIT as _LIVE_BIT
from kvtool.report.kbase import OWNER as _OWNER
from kvtool.report.kbase import PARTIAL_BIT as _PARTIAL_BIT
from kvtool.report.kbase import ROW as _ROW
from kvtool.report.kbase import SLOT as _SLOT
from kvtool.report.kbase import STAMP as _STAMP
from kvtool.report.kbase import probe as _probe
from kvtool.report.kcopy import NOTE_COPY

if TYPE_CHECKING:
    from numpy.typing import NDArray

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

_EMPTY = EMPTY
_UNIT = 16  # tokens: vLLM's block sizes and hash units are multiples of it


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
    """The entry pool: one entry per live copy of a key, i.e. per (key, physical block).

    A physical block is its *primary* entry (``owner`` is itself) and the chain of its
    extra keys' entries (partial entries, issue 21), linked by ``bnext``.

    Attributes:
        ts: Store time (seconds).
        gkey: The report row it was stored under.
        next: The key's next younger copy, or the next free entry (-1: none).
        aux: Per entry, one row (one cache line) of: ``owner``, the block's primary
            entry; ``bnext``, the next entry of the same block (-1: none); ``slot``, the
            key's table slot; ``batch``, the batch it was stored in
            (:attr:`Shape.batch`); ``row``, its store's row in the call that stored it;
            ``bits``, 1: a partial primary key, 2: the last block of its store event,
            4: live; ``serial``, which allocation of the entry this is.
    """

    ts: NDArray[Any]
    gkey: NDArray[Any]
    next: NDArray[Any]
    aux: NDArray[Any]


def _entries(size: int, old: Entries | None = None) -> Entries:
    aux = np.empty((size, len(_AUX_FILL)), dtype=np.int64)
    aux[:] = _AUX_FILL
    if old is None:
        return Entries(
            np.zeros(size, np.float64), np.zeros(size, np.int32), np.full(size, -1, np.int32), aux
        )
    aux[: len(old.aux)] = old.aux
    return Entries(
        _grown(old.ts, size, 0.0), _grown(old.gkey, size, 0), _grown(old.next, size, -1), aux
    )


class Shape(NamedTuple):
    """Per row, what the classification of issue 21 reads beyond the key.

    All optional: :func:`step` without one classifies nothing, each hash one block.

    A batch (one ``KVEventBatch``) must not straddle two calls: the rules look ahead
    inside it, and take back an earlier row of it (a discarded checkpoint).

    Attributes:
        batch: The row's batch (a number that changes from one batch to the next).
        event: The row's event (its blocks share it).
        tokens: ``len(token_ids)`` of the row's event.
        hashes: Hashes in the row's event.
        last: The row is its event's last block.
        bs: The group's block size (0: unknown).
        flags: :data:`FLAG_MAMBA`, :data:`FLAG_WINDOW`, :data:`FLAG_CHANNEL_MAMBA`,
            :data:`FLAG_PREFIX`.
        has_parent: The row's event has a ``parent_block_hash`` (hit announcements have
            none; None: every row has one).
        parent: Its key.
        origin: The event's ``origin`` (:data:`kvtool.report.announce.ORIGIN_NEW`,
            ``ORIGIN_REUSED``; 0: none).
        window: The group's sliding window (0: none).
        want: The groups (a bit each) an announcement on the row's channel covers: its
            metadata's, else those seen on it up to the row.
        pbatch: The batch before the row's on its channel (-1: none).
    """

    batch: NDArray[Any]
    event: NDArray[Any]
    tokens: NDArray[Any]
    hashes: NDArray[Any]
    last: NDArray[Any]
    bs: NDArray[Any]
    flags: NDArray[Any]
    has_parent: NDArray[Any] | None = None
    parent: NDArray[Any] | None = None
    origin: NDArray[Any] | None = None
    window: NDArray[Any] | None = None
    want: NDArray[Any] | None = None
    pbatch: NDArray[Any] | None = None


def no_shape(n: int) -> Shape:
    """The shape of ``n`` rows that classifies nothing (every row its own batch and event)."""
    z = np.zeros(n, dtype=np.int64)
    r = np.arange(n, dtype=np.int64)
    return Shape(r, r, z, np.ones(n, np.int64), np.ones(n, np.bool_), z, np.zeros(n, np.int8))


class Channels(NamedTuple):
    """Per channel (one block pool).

    Attributes:
        head: First live key (slot, -1: none).
        evictions: Evictions so far (physical blocks).
        mamba: A Mamba group's row was seen (partial keys may be primary keys).
        announced: Certain hit announcements so far (issue 21, R6).
    """

    head: NDArray[Any]
    evictions: NDArray[Any]
    mamba: NDArray[Any]
    announced: NDArray[Any]


# meta: [keys in the table, entries ever handed out, head of the free list, live entries,
# allocations so far, live partial primary entries, live extra-key entries]
_KEYS, _USED, _FREE, _LIVE, _SERIAL, _PARTIALS, _EXTRAS = 0, 1, 2, 3, 4, 5, 6


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
        drop_n: How many of its physical blocks the clear dropped.
        drop_keys: How many of its keys (entries) the clear dropped.
        note: Per row: :data:`kvtool.report.announce.NOTE_AMBIGUOUS` (a store that could be
            a hit announcement; 0 else).
        back_blocks: Per row: hit blocks of an earlier announcement this lookup repeats
            (its allocation failed: counted once, R7).
        back_tokens: Its tokens.
        back_gkey: Its report row.
    """

    what: NDArray[Any]
    ts: NDArray[Any]
    gkey: NDArray[Any]
    distance: NDArray[Any]
    drop_row: NDArray[Any]
    drop_gkey: NDArray[Any]
    drop_n: NDArray[Any]
    drop_keys: NDArray[Any]
    note: NDArray[Any]
    back_blocks: NDArray[Any]
    back_tokens: NDArray[Any]
    back_gkey: NDArray[Any]


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
        rule: Which copy of a twice-cached key an eviction takes (R8:
            :data:`kvtool.report.kcopy.ADJACENT`, ``OLDEST`` or ``NEWEST``).
        bounds: Run the two extreme rules beside it (:attr:`shadows`, one state each):
            each :func:`step` adds their lifetimes to :attr:`bound_samples`.
    """

    def __init__(
        self, max_keys: int | None = None, rule: int = kcopy.ADJACENT, bounds: bool = False
    ) -> None:
        self.max_keys = max_keys
        self.rule = rule
        self.shadows = (
            [State(max_keys, kcopy.OLDEST), State(max_keys, kcopy.NEWEST)] if bounds else []
        )
        # Per shadow: (report row, remove time, store time) of each lifetime, per call.
        self.bound_samples: list[list[tuple[NDArray[Any], NDArray[Any], NDArray[Any]]]] = [
            [] for _ in self.shadows
        ]
        # Lifetimes no row carries: an evicted block's further keys whose removes did not
        # come in the batch (R8). Likewise (report row, remove time, store time).
        self.late_samples: list[tuple[NDArray[Any], NDArray[Any], NDArray[Any]]] = []
        self.forgotten = 0
        self.forgotten_ts: float | None = None
        self.table = _table(1 << 10)
        self.entries = _entries(0)
        self.channels = Channels(
            np.zeros(0, dtype=np.int64),
            np.zeros(0, dtype=np.int64),
            np.zeros(0, dtype=np.int8),
            np.zeros(0, dtype=np.int64),
        )
        # Per (channel, group), the last hit announcement counted (announce.py, R7).
        self.hits = np.zeros((0, announce.HIT_FIELDS), dtype=np.int64)
        self.hit_n = np.zeros(1, dtype=np.int64)
        self.meta = np.array([0, 0, -1, 0, 0, 0, 0], dtype=np.int64)
        # Live physical blocks per report row (a block counts under its primary key's).
        self.live_gkey = np.zeros(0, dtype=np.int64)

    @property
    def keys(self) -> int:
        """Keys in the table (every key ever stored)."""
        return int(self.meta[_KEYS])

    def reserve(self, stores: int, top_channel: int, gkeys: int, announcements: int = 0) -> None:
        """Make room for ``stores`` more stores, channels up to ``top_channel``, ``gkeys`` rows.

        Args:
            stores: Stores in the next call (each may add a key and an entry).
            top_channel: The largest channel id of the next call.
            gkeys: Report rows the next call may name.
            announcements: Events of the next call that may be hit announcements (each
                may add a hit record).
        """
        want_hits = int(self.hit_n[0]) + announcements
        if want_hits > len(self.hits):
            grown = np.zeros(
                (max(want_hits, 2 * len(self.hits), 16), announce.HIT_FIELDS), np.int64
            )
            grown[: len(self.hits)] = self.hits
            self.hits = grown
        if self.max_keys is not None and self.keys + stores > self.max_keys:
            self._forget(self.keys + stores - self.max_keys * 3 // 4, stores)
        cap = len(self.table.chan)
        need = self.keys + stores
        if 10 * need > 7 * cap:  # at most 70 % full: linear probing stays short
            while 10 * need > 7 * cap:
                cap *= 2
            new = _table(cap)
            _rehash(self.table, new, self.channels.head, self.entries, self.meta)
            self.table = new
        e = self.entries
        want = int(self.meta[_USED]) + stores
        if want > len(e.ts):
            self.entries = _entries(max(want, 2 * len(e.ts), 1 << 10), e)
        c = self.channels
        if top_channel >= len(c.head):
            size = top_channel + 1
            self.channels = Channels(
                _grown(c.head, size, -1),
                _grown(c.evictions, size, 0),
                _grown(c.mamba, size, 0),
                _grown(c.announced, size, 0),
            )
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
        _rehash(t, new, self.channels.head, self.entries, self.meta)
        self.table = new

    def live_entries(self) -> tuple[NDArray[Any], ...]:
        """Every live copy: channel, group, no_group, hash, store time, report row.

        Returns:
            Six arrays, one row per live copy; a key's copies oldest first.
        """
        n = int(self.meta[_LIVE])
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
def _rehash(old: Table, new: Table, chan_head: Any, e: Entries, meta: Any) -> None:
    """Move every key of ``old`` into ``new`` (emptier), re-pointing lists and slots.

    The channels' live-key lists and the live entries' key slots follow their keys.
    """
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
    for x in range(meta[_USED]):
        if e.aux[x, _BITS] & _LIVE_BIT:
            e.aux[x, _SLOT] = where[e.aux[x, _SLOT]]


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


@inline_kernel
def _link(t: Table, e: Entries, c: Channels, meta: Any, s: Any, x: Any, ch: Any) -> None:
    """Append entry ``x`` to key ``s``'s copies (into its channel's live list if new)."""
    count = t.copies[s]
    e.next[x] = -1
    e.aux[x, _SLOT] = s
    e.aux[x, _BITS] |= _LIVE_BIT
    if count == 0:
        t.head[s] = x
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
    meta[_LIVE] += 1


@inline_kernel
def _alloc(e: Entries, meta: Any, ts: Any, gkey: Any, batch: Any, row: Any, event: Any) -> Any:
    x = meta[_FREE]
    if x >= 0:
        meta[_FREE] = e.next[x]
    else:
        x = meta[_USED]
        meta[_USED] += 1
    e.ts[x] = ts
    e.gkey[x] = gkey
    e.next[x] = -1
    e.aux[x, _OWNER] = x
    e.aux[x, _BNEXT] = -1
    e.aux[x, _BATCH] = batch
    e.aux[x, _ROW] = row
    e.aux[x, _EVENT] = event
    e.aux[x, _BITS] = 0
    meta[_SERIAL] += 1
    e.aux[x, _STAMP] = meta[_SERIAL]
    return x


@inline_kernel
def _unlink(t: Table, e: Entries, c: Channels, meta: Any, x: Any, ts: Any, ch: Any) -> None:
    """Take entry ``x`` off its key's copies and free it (the key's gone time if last)."""
    s = e.aux[x, _SLOT]
    p = -1
    y = t.head[s]
    while y != x:
        p = y
        y = e.next[y]
    if p < 0:
        t.head[s] = e.next[x]
    else:
        e.next[p] = e.next[x]
    if t.tail[s] == x:
        t.tail[s] = p
    t.copies[s] -= 1
    if t.copies[s] == 0:
        t.tail[s] = -1
        t.gone_ts[s] = ts
        t.gone_evictions[s] = c.evictions[ch]
        pv, nx = t.prev[s], t.next[s]
        if pv >= 0:
            t.next[pv] = nx
        else:
            c.head[ch] = nx
        if nx >= 0:
            t.prev[nx] = pv
        t.prev[s] = -1
        t.next[s] = -1
    if e.aux[x, _BITS] & _PARTIAL_BIT:
        meta[_PARTIALS] -= 1
    if e.aux[x, _OWNER] != x:
        meta[_EXTRAS] -= 1
    e.aux[x, _BITS] = 0
    e.next[x] = meta[_FREE]
    meta[_FREE] = x
    meta[_LIVE] -= 1


@inline_kernel
def _find(lc: Any, lg: Any, ln: Any, n: Any, ch: Any, g: Any, ng: Any) -> Any:
    """The index of (channel, group, no_group) among the first ``n`` of a pending list."""
    for k in range(n):
        if lc[k] == ch and lg[k] == g and ln[k] == ng:
            return k
    return -1


@inline_kernel
def _is_partial(sh: Shape, i: Any) -> Any:
    """A partial entry's store (R2): one hash whose tokens are a hash unit of the block.

    One hash, fewer tokens than the group's block size, a multiple of 16 that divides it
    (vLLM aligns blocks and hash units to 16 tokens; an older vLLM's store of a block's
    first few tokens is no partial entry), in a group that is not a sliding window's.
    """
    tok = sh.tokens[i]
    bs = sh.bs[i]
    return (
        sh.hashes[i] == 1
        and tok > 0
        and tok < bs
        and tok % _UNIT == 0
        and bs % tok == 0
        and (sh.flags[i] & FLAG_WINDOW) == 0
    )


class _Pending(NamedTuple):
    """Per batch, what later rows of it resolve (docs/SEMANTICS.md, "Porting notes").

    ``fold_*``: keys of blocks taken off just now whose removes follow (R3); ``lf_*``:
    per group, the last full block stored (a partial's host, R2); ``pr_*``: per group, a
    promoted block awaiting its full key (R4); ``pk``: keys promoted whose re-store is an
    extra key; ``rk_*``: per group, a Mamba checkpoint block awaiting its new key (R5);
    ``late_*``: lifetimes of evicted blocks' further keys whose removes never came in
    their batch (R8: the entry's lifetime ends at the eviction all the same).
    ``n``: [folds, lf, pr, pk, rk, late].
    """

    fold_slot: NDArray[Any]
    fold_ts: NDArray[Any]
    fold_gkey: NDArray[Any]
    fold_rm: NDArray[Any]
    late_gkey: NDArray[Any]
    late_rm: NDArray[Any]
    late_st: NDArray[Any]
    lf_chan: NDArray[Any]
    lf_group: NDArray[Any]
    lf_nog: NDArray[Any]
    lf_entry: NDArray[Any]
    lf_serial: NDArray[Any]
    pr_chan: NDArray[Any]
    pr_group: NDArray[Any]
    pr_nog: NDArray[Any]
    pr_row: NDArray[Any]
    pr_ts: NDArray[Any]
    pr_open: NDArray[Any]
    pk: NDArray[Any]
    rk_chan: NDArray[Any]
    rk_group: NDArray[Any]
    rk_nog: NDArray[Any]
    n: NDArray[Any]


def _pending(n: int) -> _Pending:
    i64 = np.int64

    def z() -> NDArray[Any]:
        return np.zeros(n + 1, dtype=i64)

    def b() -> NDArray[Any]:
        return np.zeros(n + 1, dtype=np.bool_)

    def f() -> NDArray[Any]:
        return np.zeros(n + 1, dtype=np.float64)

    return _Pending(
        z(), f(), z(), f(), z(), f(), f(),
        z(), z(), b(), z(), z(),
        z(), z(), b(), z(), np.zeros(n + 1, np.float64), b(),
        z(),
        z(), z(), b(),
        np.zeros(6, dtype=i64),
    )  # fmt: skip


@inline_kernel
def _flush_folds(pd: _Pending) -> None:
    """Forget the folded keys whose removes did not come (at a batch's end, a clear).

    An evicted block's give their lifetime all the same (``late_*``).
    """
    for k in range(pd.n[0]):
        if np.isfinite(pd.fold_ts[k]):
            m = pd.n[5]
            pd.late_gkey[m] = pd.fold_gkey[k]
            pd.late_rm[m] = pd.fold_rm[k]
            pd.late_st[m] = pd.fold_ts[k]
            pd.n[5] = m + 1
    pd.n[0] = 0


@inline_kernel
def _settle(pd: _Pending, c: Channels, chan: Any, out: Out) -> None:
    """End a batch: a promoted block whose full key never came was evicted after all."""
    for k in range(pd.n[2]):
        if pd.pr_open[k]:
            r = pd.pr_row[k]
            out.what[r] = EVICTED
            out.ts[r] = pd.pr_ts[k]
            c.evictions[chan[r]] += 1
    _flush_folds(pd)
    for k in range(1, 5):
        pd.n[k] = 0


@inline_kernel
def _drop_block(
    t: Table,
    e: Entries,
    c: Channels,
    meta: Any,
    live_gkey: Any,
    x: Any,
    ts: Any,
    ch: Any,
    pd: _Pending,
    life: Any,
) -> Any:
    """Take the block holding entry ``x`` off the cache, with all its keys.

    The removes of its other keys follow (folded, R3); they give a lifetime where the
    block was evicted (``life``), none else (R8: NaN, which no lifetime pairs).

    Returns:
        The block's report row.
    """
    b = e.aux[x, _OWNER]
    g = e.gkey[b]
    y = b
    while y >= 0:
        ny = e.aux[y, _BNEXT]
        if y != x:
            k = pd.n[0]
            pd.fold_slot[k] = e.aux[y, _SLOT]
            pd.fold_ts[k] = e.ts[y] if life else np.nan
            pd.fold_gkey[k] = e.gkey[y]
            pd.fold_rm[k] = ts
            pd.n[0] = k + 1
        _unlink(t, e, c, meta, y, ts, ch)
        y = ny
    live_gkey[g] -= 1
    return g


@inline_kernel
def _block_has(t: Table, e: Entries, x: Any, h: Any, not_slot: Any) -> Any:
    """Whether the block of entry ``x`` carries key hash ``h`` (other than ``not_slot``)."""
    y = e.aux[x, _OWNER]
    while y >= 0:
        s = e.aux[y, _SLOT]
        if s != not_slot and t.hash[s] == h:
            return True
        y = e.aux[y, _BNEXT]
    return False


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
    sh: Shape,
    pd: _Pending,
    out: Out,
    cand: Any,
    mode: Any,
    hits: Any,
    hit_n: Any,
    cl: Any,
    rule: Any,
    lc: kcopy.Last,
) -> int:
    """Walk one chunk's rows in stream order (see the module docstring).

    Args:
        t: The hash table (room for every store of the chunk: :meth:`State.reserve`).
        e: The entry pool (likewise).
        c: Per channel (every channel of the chunk).
        meta: Keys, entries handed out, free-list head, live entries, allocations.
        live_gkey: Live physical blocks per report row (every report row of the chunk).
        op: Per row: :data:`SKIP`, :data:`STORE`, :data:`REMOVE` or :data:`CLEAR`.
        chan: Channel of each row.
        group: Group of each row (0 where ``no_group``).
        no_group: The row has no ``group_idx``.
        h: Block hash of each row.
        ts: Time of each row (seconds).
        gkey: Report row of each row.
        sh: Per row, the event's shape (:class:`Shape`).
        pd: Per-batch scratch (:func:`_pending`, one slot per row).
        out: Filled in (:class:`Out`); the drop arrays hold one slot per (clear, report
            row).
        cand: Rows where a hit announcement may start (:func:`announce.candidates`).
        mode: The report mode (:data:`kvtool.report.announce.MODES`).
        hits: The hit records (:attr:`State.hits`).
        hit_n: Hit records in use.
        cl: Scratch for :func:`kvtool.report.announce.announce`, one per row.
        rule: Which copy an eviction takes (:data:`kvtool.report.kcopy.ADJACENT`...).
        lc: Per-batch scratch of the copy rule (:func:`kvtool.report.kcopy.last_evicted`).

    Returns:
        The number of drops written to ``out``.
    """
    drops = 0
    scratch = np.zeros(len(live_gkey), dtype=np.int64)
    scratch_keys = np.zeros(len(live_gkey), dtype=np.int64)
    n_rows = len(op)
    cur = -1
    run_end = -1
    for i in range(n_rows):
        kind = op[i]
        if sh.batch[i] != cur:
            if pd.n[0] or pd.n[1] or pd.n[2] or pd.n[3] or pd.n[4]:
                _settle(pd, c, chan, out)
            lc.n[0] = 0
            cur = sh.batch[i]
        if kind == STORE:
            if cand[i] and i > run_end:
                run_end = _announce(
                    t, c.announced, hits, hit_n, op, chan, group, no_group, h, gkey, sh,
                    cand, i, mode, out, cl,
                )  # fmt: skip
            if out.what[i] >= ANNOUNCED:
                continue  # R6: a hit announced changes no state
            ch = chan[i]
            grp, ng = group[i], no_group[i]
            if sh.flags[i] & FLAG_MAMBA:
                c.mamba[ch] = 1
            s = _probe(t, ch, grp, ng, h[i])
            new_key = t.chan[s] == _EMPTY
            if new_key:
                t.chan[s] = ch
                t.group[s] = grp
                t.no_group[s] = ng
                t.hash[s] = h[i]
                meta[_KEYS] += 1
            count = t.copies[s]
            rk = _find(pd.rk_chan, pd.rk_group, pd.rk_nog, pd.n[4], ch, grp, ng)
            pr = _find(pd.pr_chan, pd.pr_group, pd.pr_nog, pd.n[2], ch, grp, ng)
            partial = _is_partial(sh, i)
            if partial and rk < 0:
                # R2: a partial entry; an extra key on the block of this batch that holds
                # it, unless the channel has partial hits (a Mamba group) and it is not
                # a promoted key's re-store (R4): then its block's primary key.
                host = -1
                promoted = False
                for k in range(pd.n[3]):
                    if pd.pk[k] == s:
                        promoted = True
                if promoted or not (c.mamba[ch] or sh.flags[i] & FLAG_CHANNEL_MAMBA):
                    k = _find(pd.lf_chan, pd.lf_group, pd.lf_nog, pd.n[1], ch, grp, ng)
                    if k >= 0:
                        x = pd.lf_entry[k]
                        if e.aux[x, _STAMP] == pd.lf_serial[k] and e.aux[x, _BITS] & _LIVE_BIT:
                            host = x
                if host >= 0:
                    if _block_has(t, e, host, h[i], -1):
                        out.what[i] = EXTRA_NOOP
                        continue
                    y = _alloc(e, meta, ts[i], gkey[i], sh.batch[i], i, sh.event[i])
                    e.aux[y, _OWNER] = host
                    e.aux[y, _BNEXT] = e.aux[host, _BNEXT]
                    e.aux[host, _BNEXT] = y
                    meta[_EXTRAS] += 1
                    _link(t, e, c, meta, s, y, ch)
                    out.what[i] = EXTRA
                    continue
            rekey = rk >= 0 if partial else (pr >= 0 and pd.pr_open[pr])
            if rekey:
                out.what[i] = REKEY
                if partial:
                    # R5: the Mamba checkpoint block gets this key (its old one went).
                    last = pd.n[4] - 1
                    pd.rk_chan[rk] = pd.rk_chan[last]
                    pd.rk_group[rk] = pd.rk_group[last]
                    pd.rk_nog[rk] = pd.rk_nog[last]
                    pd.n[4] = last
                else:
                    # R4: the promoted block gets its full key; the partial key's
                    # re-store that follows is an extra key on it.
                    pd.pr_open[pr] = False
                    pd.pk[pd.n[3]] = _probe(t, ch, grp, ng, h[pd.pr_row[pr]])
                    pd.n[3] += 1
            elif new_key:
                out.what[i] = FIRST
            elif count > 0:
                out.what[i] = WHILE_LIVE
            else:
                out.what[i] = RECOMPUTED
                out.ts[i] = t.gone_ts[s]
                out.distance[i] = c.evictions[ch] - t.gone_evictions[s]
            if not rekey and rk >= 0:
                last = pd.n[4] - 1  # a new block ends a pending re-key (as the model)
                pd.rk_chan[rk] = pd.rk_chan[last]
                pd.rk_group[rk] = pd.rk_group[last]
                pd.rk_nog[rk] = pd.rk_nog[last]
                pd.n[4] = last
            x = _alloc(e, meta, ts[i], gkey[i], sh.batch[i], i, sh.event[i])
            if partial and not rekey:
                e.aux[x, _BITS] |= _PARTIAL_BIT
                meta[_PARTIALS] += 1
                out.note[i] = NOTE_PARTIAL
            if sh.last[i]:
                e.aux[x, _BITS] |= _LAST_BIT
            _link(t, e, c, meta, s, x, ch)
            live_gkey[gkey[i]] += 1
            if not partial:
                k = _find(pd.lf_chan, pd.lf_group, pd.lf_nog, pd.n[1], ch, grp, ng)
                if k < 0:
                    k = pd.n[1]
                    pd.lf_chan[k] = ch
                    pd.lf_group[k] = grp
                    pd.lf_nog[k] = ng
                    pd.n[1] = k + 1
                pd.lf_entry[k] = x
                pd.lf_serial[k] = e.aux[x, _STAMP]
        elif kind == REMOVE:
            ch = chan[i]
            grp, ng = group[i], no_group[i]
            s = _probe(t, ch, grp, ng, h[i])
            folded = -1
            for k in range(pd.n[0]):
                if pd.fold_slot[k] == s and t.chan[s] != _EMPTY:
                    folded = k
                    break
            if folded >= 0:
                # R3: a further key of the block taken off just before.
                out.what[i] = EVICTED_EXTRA
                out.ts[i] = pd.fold_ts[folded]
                out.gkey[i] = pd.fold_gkey[folded]
                last = pd.n[0] - 1
                pd.fold_slot[folded] = pd.fold_slot[last]
                pd.fold_ts[folded] = pd.fold_ts[last]
                pd.fold_gkey[folded] = pd.fold_gkey[last]
                pd.fold_rm[folded] = pd.fold_rm[last]
                pd.n[0] = last
                continue
            if t.chan[s] == _EMPTY or t.copies[s] == 0:
                out.what[i] = ORPHAN
                continue
            x = t.head[s]
            # R4: the partial primary key of a block, stored again (one hash) later in
            # this batch and group: the block is promoted, not evicted.
            y = -1
            if meta[_PARTIALS] > 0:
                y = x
                while y >= 0:
                    if e.aux[y, _OWNER] == y and e.aux[y, _BITS] & _PARTIAL_BIT:
                        break
                    y = e.next[y]
            if y >= 0:
                j = i + 1
                again = False
                while j < n_rows and sh.batch[j] == cur:
                    if (
                        op[j] == STORE
                        and h[j] == h[i]
                        and chan[j] == ch
                        and group[j] == grp
                        and no_group[j] == ng
                        and sh.hashes[j] == 1
                    ):
                        again = True
                        break
                    j += 1
                if again:
                    out.what[i] = PROMOTED
                    out.ts[i] = e.ts[y]
                    out.gkey[i] = _drop_block(t, e, c, meta, live_gkey, y, ts[i], ch, pd, False)
                    k = pd.n[2]
                    pd.pr_chan[k] = ch
                    pd.pr_group[k] = grp
                    pd.pr_nog[k] = ng
                    pd.pr_row[k] = i
                    pd.pr_ts[k] = out.ts[i]
                    pd.pr_open[k] = True
                    pd.n[2] = k + 1
                    continue
            if sh.flags[i] & FLAG_MAMBA:
                # R5: every copy stored in this batch: a Mamba checkpoint re-keyed (the
                # next event of the group a partial store) or discarded.
                fresh = -1
                old = False
                y = x
                while y >= 0:
                    if e.aux[y, _BATCH] == cur and e.aux[y, _OWNER] == y:
                        fresh = y
                    else:
                        old = True
                    y = e.next[y]
                if not old and fresh >= 0:
                    j = i + 1
                    nxt = -1
                    while j < n_rows and sh.batch[j] == cur:
                        if (
                            op[j] != CLEAR
                            and chan[j] == ch
                            and group[j] == grp
                            and no_group[j] == ng
                            and sh.event[j] != sh.event[i]
                        ):
                            nxt = j
                            break
                        j += 1
                    out.ts[i] = e.ts[fresh]
                    if (
                        e.aux[fresh, _BITS] & _LAST_BIT
                        and nxt >= 0
                        and op[nxt] == STORE
                        and _is_partial(sh, nxt)
                    ):
                        out.what[i] = REKEY_REMOVE
                        k = pd.n[4]
                        pd.rk_chan[k] = ch
                        pd.rk_group[k] = grp
                        pd.rk_nog[k] = ng
                        pd.n[4] = k + 1
                    else:
                        out.what[i] = DISCARD
                        r = e.aux[fresh, _ROW]
                        w = out.what[r]
                        if w == FIRST or w == WHILE_LIVE or w == RECOMPUTED:  # noqa: SIM109
                            out.what[r] = DISCARDED_STORE
                    out.gkey[i] = _drop_block(t, e, c, meta, live_gkey, fresh, ts[i], ch, pd, False)
                    continue
            if t.copies[s] > 1:
                # R8: which copy (kvtool/report/kcopy.py).
                x, nc = kcopy.choose(t, e, s, i, cur, op, group, no_group, h, sh, rule, lc)
                if nc > 1:
                    out.note[i] = NOTE_COPY
            kcopy.remember(lc, e, x, ch, grp, ng)
            out.what[i] = EVICTED
            out.ts[i] = e.ts[x]
            c.evictions[ch] += 1
            out.gkey[i] = _drop_block(t, e, c, meta, live_gkey, x, ts[i], ch, pd, True)
        elif kind == CLEAR:
            ch = chan[i]
            _flush_folds(pd)
            for k in range(1, 5):
                pd.n[k] = 0
            lc.n[0] = 0
            if ch >= len(c.head):
                continue  # a channel that never stored: nothing to drop
            s = c.head[ch]
            while s >= 0:
                x = t.head[s]
                while x >= 0:
                    scratch_keys[e.gkey[x]] += 1
                    if e.aux[x, _OWNER] == x:
                        scratch[e.gkey[x]] += 1
                    nx = e.next[x]
                    if e.aux[x, _BITS] & _PARTIAL_BIT:
                        meta[_PARTIALS] -= 1
                    if e.aux[x, _OWNER] != x:
                        meta[_EXTRAS] -= 1
                    e.aux[x, _BITS] = 0
                    e.next[x] = meta[_FREE]
                    meta[_FREE] = x
                    meta[_LIVE] -= 1
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
                if scratch_keys[g]:
                    out.drop_row[drops] = i
                    out.drop_gkey[drops] = g
                    out.drop_n[drops] = scratch[g]
                    out.drop_keys[drops] = scratch_keys[g]
                    live_gkey[g] -= scratch[g]
                    scratch[g] = 0
                    scratch_keys[g] = 0
                    drops += 1
    _settle(pd, c, chan, out)
    return drops


@kernel
def _advance_plain(
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
    sh: Shape,
    cand: Any,
    mode: Any,
    hits: Any,
    hit_n: Any,
    cl: Any,
    rule: Any,
    lc: kcopy.Last,
) -> int:
    """:func:`advance` for a call where every hash is one block: the loop before issue 21.

    :func:`step` takes it when no row can be a partial entry or a Mamba group's and no
    extra key or partial block is live: then each rule of :func:`advance` keeps every
    hash one block, and this loop (which keeps the entries' block fields consistent for
    later calls) gives the same answers faster.

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
        sh: The rows' shape (read by the hit announcements' rules only).
        cand: As :func:`advance`'s (hit announcements, R6).
        mode: Likewise.
        hits: Likewise.
        hit_n: Likewise.
        cl: Likewise.
        rule: Likewise (R8: which copy an eviction takes).
        lc: Likewise.

    Returns:
        The number of drops written to ``out``.
    """
    drops = 0
    scratch = np.zeros(len(live_gkey), dtype=np.int64)
    run_end = -1
    cur = -1
    for i in range(len(op)):
        kind = op[i]
        if sh.batch[i] != cur:
            lc.n[0] = 0
            cur = sh.batch[i]
        if kind == STORE:
            if cand[i] and i > run_end:
                run_end = _announce(
                    t, c.announced, hits, hit_n, op, chan, group, no_group, h, gkey, sh,
                    cand, i, mode, out, cl,
                )  # fmt: skip
            if out.what[i] >= ANNOUNCED:
                continue  # R6: a hit announced changes no state
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
            e.aux[x, _OWNER] = x
            e.aux[x, _BNEXT] = -1
            e.aux[x, _SLOT] = s
            e.aux[x, _BATCH] = cur
            e.aux[x, _EVENT] = sh.event[i]
            e.aux[x, _BITS] = _LIVE_BIT
            meta[_LIVE] += 1
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
            if t.copies[s] > 1:
                # R8: which copy (kvtool/report/kcopy.py).
                x, nc = kcopy.choose(t, e, s, i, cur, op, group, no_group, h, sh, rule, lc)
                if nc > 1:
                    out.note[i] = NOTE_COPY
            kcopy.remember(lc, e, x, ch, group[i], no_group[i])
            out.what[i] = EVICTED
            out.ts[i] = e.ts[x]
            out.gkey[i] = e.gkey[x]
            live_gkey[e.gkey[x]] -= 1
            c.evictions[ch] += 1
            _unlink(t, e, c, meta, x, ts[i], ch)
        elif kind == CLEAR:
            ch = chan[i]
            lc.n[0] = 0
            if ch >= len(c.head):
                continue  # a channel that never stored: nothing to drop
            s = c.head[ch]
            while s >= 0:
                x = t.head[s]
                while x >= 0:
                    scratch[e.gkey[x]] += 1
                    nx = e.next[x]
                    e.aux[x, _BITS] = 0
                    meta[_LIVE] -= 1
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
                    out.drop_keys[drops] = scratch[g]
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
    shape: Shape | None = None,
    plain: bool | None = None,
    mode: int = announce.INCREMENTAL,
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
        shape: Per row, the event's shape (:class:`Shape`; None: :func:`no_shape`, each
            hash one block).
        plain: Walk with :func:`_advance_plain` (True), with :func:`advance` (False), or
            whichever gives the answer (None: plain where it is the same).
        mode: The report mode (:data:`kvtool.report.announce.MODES`; hit announcements,
            issue 21 R6): ``INCREMENTAL`` takes only events marked ``REUSED`` as ones.

    Returns:
        What each row was, and the clears' drops (trimmed to their number).
    """
    n = len(op)
    asked = plain
    is_store = op == STORE
    stores = int(is_store.sum())
    clears = int((op == CLEAR).sum())
    m = clears * max(gkeys, 1)
    out = Out(
        np.zeros(n, dtype=np.int8),
        np.zeros(n, dtype=np.float64),
        np.full(n, -1, dtype=np.int64),
        np.zeros(n, dtype=np.int64),
        np.zeros(m, dtype=np.int64),
        np.zeros(m, dtype=np.int64),
        np.zeros(m, dtype=np.int64),
        np.zeros(m, dtype=np.int64),
        np.zeros(n, dtype=np.int8),
        np.zeros(n, dtype=np.int64),
        np.zeros(n, dtype=np.int64),
        np.full(n, -1, dtype=np.int64),
    )
    if n == 0:
        return out
    i64 = np.int64
    sh = no_shape(n) if shape is None else shape

    def col(a: NDArray[Any] | None, dtype: Any, fill: Any) -> NDArray[Any]:
        if a is None:
            return np.full(n, fill, dtype=dtype)
        return np.ascontiguousarray(a, dtype=dtype)

    sh = Shape(
        col(sh.batch, i64, 0),
        col(sh.event, i64, 0),
        col(sh.tokens, i64, 0),
        col(sh.hashes, i64, 1),
        col(sh.last, np.bool_, True),
        col(sh.bs, i64, 0),
        col(sh.flags, np.int8, 0),
        col(sh.has_parent, np.bool_, True),
        col(sh.parent, i64, 0),
        col(sh.origin, np.int8, 0),
        col(sh.window, i64, 0),
        col(sh.want, i64, 0),
        col(sh.pbatch, i64, -1),
    )
    first = np.ones(n, dtype=bool)
    first[1:] = (sh.event[1:] != sh.event[:-1]) | (sh.batch[1:] != sh.batch[:-1])
    cand = announce.candidates(op, sh, mode, first)
    n_cand = int(cand.sum())
    state.reserve(stores, int(chan.max()), gkeys, n_cand)
    cl = np.zeros(n if n_cand else 1, dtype=i64)
    meta = state.meta
    if plain is None:
        plain = shape is None or (
            meta[_PARTIALS] == 0
            and meta[_EXTRAS] == 0
            and not (sh.flags & FLAG_MAMBA).any()
            and not (
                is_store
                & (sh.hashes == 1)
                & (sh.tokens > 0)
                & (sh.tokens < sh.bs)
                & (sh.tokens % _UNIT == 0)
                & ((sh.flags & FLAG_WINDOW) == 0)
            ).any()
        )
    args = (
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
    )
    ann = (np.int64(mode), state.hits, state.hit_n, cl, np.int64(state.rule), kcopy.last_evicted(n))
    if plain:
        drops = _advance_plain(*args, out, sh, cand, *ann)
    else:
        pd = _pending(n)
        drops = advance(*args, sh, pd, out, cand, *ann)
        m = int(pd.n[5])
        if m:
            late = (pd.late_gkey[:m].copy(), pd.late_rm[:m].copy(), pd.late_st[:m].copy())
            state.late_samples.append(late)
    for k, shadow in enumerate(state.shadows):
        # R8's bound: the same rows under the extreme rules (their own state).
        so = step(shadow, op, chan, group, no_group, h, ts, gkey, gkeys, shape, asked, mode)
        paired = np.flatnonzero((so.what == EVICTED) | (so.what == EVICTED_EXTRA))
        paired = paired[np.isfinite(so.ts[paired])]
        state.bound_samples[k].append((gkey[paired], ts[paired], so.ts[paired]))
        state.bound_samples[k].extend(shadow.late_samples)
        shadow.late_samples.clear()
    return out._replace(
        drop_row=out.drop_row[:drops],
        drop_gkey=out.drop_gkey[:drops],
        drop_n=out.drop_n[:drops],
        drop_keys=out.drop_keys[:drops],
    )


__all__ = [
    "ANNOUNCED",
    "ANNOUNCED_AMBIGUOUS",
    "CLEAR",
    "DISCARD",
    "DISCARDED_STORE",
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
    "MAKES_BLOCK",
    "NONE",
    "NOTE_COPY",
    "NOTE_PARTIAL",
    "ORPHAN",
    "PROMOTED",
    "RECOMPUTED",
    "REKEY",
    "REKEY_REMOVE",
    "REMOVE",
    "SKIP",
    "STORE",
    "WHILE_LIVE",
    "Out",
    "Shape",
    "State",
    "advance",
    "no_shape",
    "step",
]
