"""The state kernel's state: the key table, the live keys' and entry pools, :class:`State`.

See :mod:`kvtool.report.kernel` for what the state means. Here: the arrays
(:class:`Table`, :class:`Live`, :class:`Entries`, :class:`Channels`), their growth and
rehash between calls (:meth:`State.reserve`), and the pools' operations the loops share
(:func:`link`, :func:`alloc`, :func:`unlink`, :func:`go_live`, :func:`release`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

from kvtool._jit import inline_kernel, kernel
from kvtool.columns import np
from kvtool.report import announce, kbase, kcopy
from kvtool.report.kbase import probe as _probe

if TYPE_CHECKING:
    from numpy.typing import NDArray

_EMPTY = kbase.EMPTY
_OWNER, _BNEXT, _SLOT, _BATCH = kbase.OWNER, kbase.BNEXT, kbase.SLOT, kbase.BATCH
_ROW, _BITS, _STAMP, _EVENT = kbase.ROW, kbase.BITS, kbase.STAMP, kbase.EVENT
_PARTIAL_BIT, _LAST_BIT, _LIVE_BIT = kbase.PARTIAL_BIT, kbase.LAST_BIT, kbase.LIVE_BIT
_AUX_FILL = kbase.AUX_FILL


class Table(NamedTuple):
    """The hash table over (channel, group, no_group, hash): one slot per key ever stored.

    A slot holds what a key needs once it is gone (its key, when and after how many
    evictions it went); what only a live key needs is in the :class:`Live` pool, named by
    ``live`` (about ten thousand live keys against millions ever stored).

    Attributes:
        cn: The slot's channel and ``no_group`` in one number, ``2 * channel + no_group``
            (:func:`kvtool.report.kbase.code`; -1: an empty slot).
        group: Group (0 where ``no_group``).
        hash: Block hash.
        gone_ts: When the key last went from live to not live (seconds).
        gone_evictions: Its pool's eviction count just after that.
        live: The key's record in the :class:`Live` pool (-1: not live).
    """

    cn: NDArray[Any]
    group: NDArray[Any]
    hash: NDArray[Any]
    gone_ts: NDArray[Any]
    gone_evictions: NDArray[Any]
    live: NDArray[Any]


class Live(NamedTuple):
    """The live keys' pool: one record per live key.

    A record is taken when its key goes live and given back (to a free list through
    ``next``) when the key's last copy goes.

    Attributes:
        copies: Live copies (> 0 while taken).
        head: Oldest live copy (entry index).
        tail: Newest live copy.
        prev: Previous live key of the channel (record, -1: none).
        next: Next live key of the channel; in a free record, the next free one.
        slot: The key's table slot.
    """

    copies: NDArray[Any]
    head: NDArray[Any]
    tail: NDArray[Any]
    prev: NDArray[Any]
    next: NDArray[Any]
    slot: NDArray[Any]


def _live(size: int, old: Live | None = None) -> Live:
    if old is None:
        return Live(*(np.full(size, -1, dtype=np.int32) for _ in Live._fields))
    return Live(*(_grown(a, size, -1) for a in old))


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


class Channels(NamedTuple):
    """Per channel (one block pool).

    Attributes:
        head: First live key (its :class:`Live` record, -1: none).
        evictions: Evictions so far (physical blocks).
        mamba: A Mamba group's row was seen (partial keys may be primary keys).
        announced: Certain hit announcements so far (issue 21, R6).
    """

    head: NDArray[Any]
    evictions: NDArray[Any]
    mamba: NDArray[Any]
    announced: NDArray[Any]


# meta: [keys in the table, entries ever handed out, head of the free list, live entries,
# allocations so far, live partial primary entries, live extra-key entries, live-key
# records ever handed out, head of their free list, live keys]
KEYS, USED, FREE, LIVE, SERIAL, PARTIALS, EXTRAS = 0, 1, 2, 3, 4, 5, 6
LUSED, LFREE, LKEYS = 7, 8, 9
_KEYS, _USED, _FREE, _LIVE, _SERIAL, _PARTIALS, _EXTRAS = (
    KEYS,
    USED,
    FREE,
    LIVE,
    SERIAL,
    PARTIALS,
    EXTRAS,
)
_LUSED, _LFREE, _LKEYS = LUSED, LFREE, LKEYS


def _table(capacity: int) -> Table:
    # Slots, entries and live records are numbered in int32 (a table of 2**31 keys would
    # need 80 GB): 36 bytes a slot.
    return Table(*_table_keys(capacity), *(_blank(k, capacity) for k in range(3, 6)))


def _blank(field: int, capacity: int) -> NDArray[Any]:
    """A :class:`Table` array as an empty table holds it (:data:`_FIELD_FILL`)."""
    return np.full(capacity, _FIELD_FILL[field], dtype=_FIELD_DTYPE[field])


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
        # Rows stepped without a shape (each its own batch, numbered -2, -3, ...).
        self.unshaped = 0
        self.forgotten = 0
        self.forgotten_ts: float | None = None
        self.table = _table(1 << 10)
        self.live = _live(0)
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
        self.meta = np.array([0, 0, -1, 0, 0, 0, 0, 0, -1, 0], dtype=np.int64)
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
        cap = len(self.table.cn)
        need = self.keys + stores
        if 10 * need > 7 * cap:  # at most 70 % full: linear probing stays short
            while 10 * need > 7 * cap:
                cap *= 2
            self._rehash(cap)
        # Each store may take a live record: from the free list first, then new ones.
        want = max(int(self.meta[_LUSED]), int(self.meta[_LKEYS]) + stores)
        if want > len(self.live.copies):
            self.live = _live(max(want, 2 * len(self.live.copies), 1 << 10), self.live)
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
        gone = np.flatnonzero((t.cn != _EMPTY) & (t.live < 0))
        k = min(excess, len(gone))
        if k <= 0 or k < (self.max_keys or 0) // 4:
            # Mostly live keys (never forgotten): wait until a quarter of the bound can go,
            # so that a rebuild is not paid on every call (the gone keys stay below that).
            return
        drop = gone[np.argpartition(t.gone_ts[gone], k - 1)[:k]] if k < len(gone) else gone
        newest = float(t.gone_ts[drop].max())
        self.forgotten_ts = newest if self.forgotten_ts is None else max(self.forgotten_ts, newest)
        self.forgotten += k
        t.cn[drop] = _EMPTY  # not live: no live record, no entries
        self.meta[_KEYS] -= k
        cap = 1 << 10
        while 10 * (self.keys + stores) > 7 * cap:
            cap *= 2
        del t, gone, drop
        self._rehash(cap)

    def _rehash(self, cap: int) -> None:
        """Move every key into a table of ``cap`` slots, one array at a time.

        The new key arrays are filled first (each key's new slot, ``where``); then each
        other array of the old table is moved to its new slots and let go before the next
        is made: old and new tables are never alive whole at once (at the last doubling of
        a 10x recording that was 0.7 GB at the peak instead of 0.45).
        """
        fields = list(self.table)
        self.table = None  # type: ignore[assignment]  # its arrays go one by one below
        keys = _Keys(*_table_keys(cap))
        where = np.full(len(fields[0]), -1, dtype=np.int32)
        _place(Table(*fields), keys, where)
        fields[:3] = list(keys)
        del keys
        for k in range(3, len(fields)):
            old = fields[k]
            fields[k] = None  # type: ignore[call-overload]
            new = _blank(k, cap)
            _move(old, where, new)
            fields[k] = new
            del old, new
        self.table = Table(*fields)
        _repoint(where, self.live, self.entries, self.meta)

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
        _live_entries(self.table, self.live, self.entries, *out)
        return out


_FIELD_FILL = (_EMPTY, 0, 0, 0.0, 0, -1)
"""Each :class:`Table` array's value in an empty slot (as :func:`_table` makes them)."""
_FIELD_DTYPE = (np.int32, np.int64, np.int64, np.float64, np.int64, np.int32)
"""Each :class:`Table` array's dtype."""


class _Keys(NamedTuple):
    """A table's key arrays alone (what :func:`kvtool.report.kbase.probe` reads)."""

    cn: NDArray[Any]
    group: NDArray[Any]
    hash: NDArray[Any]


def _table_keys(capacity: int) -> list[NDArray[Any]]:
    return [_blank(k, capacity) for k in range(3)]


@kernel
def _place(old: Table, new: _Keys, where: Any) -> None:
    """Put every key of ``old`` into the (emptier) key arrays ``new``; ``where``: its slot."""
    for s in range(len(old.cn)):
        c = old.cn[s]
        if c == _EMPTY:
            continue
        d = _probe(new, c >> 1, old.group[s], c & 1, old.hash[s])
        where[s] = d
        new.cn[d] = c
        new.group[d] = old.group[s]
        new.hash[d] = old.hash[s]


@kernel
def _move(old: Any, where: Any, new: Any) -> None:
    """``new[where[s]] = old[s]`` for every placed slot ``s``."""
    for s in range(len(old)):
        d = where[s]
        if d >= 0:
            new[d] = old[s]


@kernel
def _repoint(where: Any, lv: Live, e: Entries, meta: Any) -> None:
    """The live records' and the live entries' key slots follow their keys."""
    for r in range(meta[_LUSED]):
        if lv.copies[r] > 0:
            lv.slot[r] = where[lv.slot[r]]
    for x in range(meta[_USED]):
        if e.aux[x, _BITS] & _LIVE_BIT:
            e.aux[x, _SLOT] = where[e.aux[x, _SLOT]]


@kernel
def _live_entries(
    t: Table,
    lv: Live,
    e: Entries,
    chan: Any,
    group: Any,
    no_group: Any,
    h: Any,
    ts: Any,
    gkey: Any,
) -> None:
    n = 0
    for s in range(len(t.cn)):
        r = t.live[s]
        if r < 0:
            continue
        x = lv.head[r]
        while x >= 0:
            chan[n] = t.cn[s] >> 1
            group[n] = t.group[s]
            no_group[n] = (t.cn[s] & 1) == 1
            h[n] = t.hash[s]
            ts[n] = e.ts[x]
            gkey[n] = e.gkey[x]
            n += 1
            x = e.next[x]


@inline_kernel
def go_live(t: Table, lv: Live, c: Channels, meta: Any, s: Any, ch: Any) -> Any:
    """Key ``s`` goes live: its live record (no copies yet), at its channel's list's head."""
    r = meta[_LFREE]
    if r >= 0:
        meta[_LFREE] = lv.next[r]
    else:
        r = meta[_LUSED]
        meta[_LUSED] += 1
    meta[_LKEYS] += 1
    t.live[s] = r
    lv.copies[r] = 0
    lv.head[r] = -1
    lv.tail[r] = -1
    lv.slot[r] = s
    first = c.head[ch]
    lv.prev[r] = -1
    lv.next[r] = first
    if first >= 0:
        lv.prev[first] = r
    c.head[ch] = r
    return r


@inline_kernel
def release(t: Table, lv: Live, meta: Any, r: Any, ts: Any, evictions: Any) -> None:
    """Live record ``r``'s key is gone (at ``ts``, ``evictions``): the record is freed.

    The caller takes it off its channel's live-key list (or drops the whole list).
    """
    s = lv.slot[r]
    t.gone_ts[s] = ts
    t.gone_evictions[s] = evictions
    t.live[s] = -1
    lv.copies[r] = 0
    lv.head[r] = -1
    lv.tail[r] = -1
    lv.prev[r] = -1
    lv.slot[r] = -1
    lv.next[r] = meta[_LFREE]
    meta[_LFREE] = r
    meta[_LKEYS] -= 1


@inline_kernel
def link(t: Table, lv: Live, e: Entries, c: Channels, meta: Any, s: Any, x: Any, ch: Any) -> None:
    """Append entry ``x`` to key ``s``'s copies (the key goes live if it was not)."""
    r = t.live[s]
    if r < 0:
        r = go_live(t, lv, c, meta, s, ch)
    count = lv.copies[r]
    e.next[x] = -1
    e.aux[x, _SLOT] = s
    e.aux[x, _BITS] |= _LIVE_BIT
    if count == 0:
        lv.head[r] = x
    else:
        e.next[lv.tail[r]] = x
    lv.tail[r] = x
    lv.copies[r] = count + 1
    meta[_LIVE] += 1


@inline_kernel
def alloc(e: Entries, meta: Any, ts: Any, gkey: Any, batch: Any, row: Any, event: Any) -> Any:
    """A fresh entry (from the free list, else a new one): a block of its own, not live."""
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
def unlink(
    t: Table, lv: Live, e: Entries, c: Channels, meta: Any, x: Any, ts: Any, ch: Any
) -> None:
    """Take entry ``x`` off its key's copies and free it (the key's gone time if last)."""
    s = e.aux[x, _SLOT]
    r = t.live[s]
    p = -1
    y = lv.head[r]
    while y != x:
        p = y
        y = e.next[y]
    if p < 0:
        lv.head[r] = e.next[x]
    else:
        e.next[p] = e.next[x]
    if lv.tail[r] == x:
        lv.tail[r] = p
    lv.copies[r] -= 1
    if lv.copies[r] == 0:
        pv, nx = lv.prev[r], lv.next[r]
        if pv >= 0:
            lv.next[pv] = nx
        else:
            c.head[ch] = nx
        if nx >= 0:
            lv.prev[nx] = pv
        release(t, lv, meta, r, ts, c.evictions[ch])
    if e.aux[x, _BITS] & _PARTIAL_BIT:
        meta[_PARTIALS] -= 1
    if e.aux[x, _OWNER] != x:
        meta[_EXTRAS] -= 1
    e.aux[x, _BITS] = 0
    e.next[x] = meta[_FREE]
    meta[_FREE] = x
    meta[_LIVE] -= 1


__all__ = [
    "EXTRAS",
    "FREE",
    "KEYS",
    "LFREE",
    "LIVE",
    "LKEYS",
    "LUSED",
    "PARTIALS",
    "SERIAL",
    "USED",
    "Channels",
    "Entries",
    "Live",
    "State",
    "Table",
    "alloc",
    "go_live",
    "link",
    "release",
    "unlink",
]
