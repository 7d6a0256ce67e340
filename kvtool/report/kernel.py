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
- a remove of a live key is *effective* (an eviction): it removes one copy of the key
  (R8, :mod:`kvtool.report.kcopy`: the copy whose further keys the next removes name,
  else one not stored in this batch, else the one stored with the block evicted just
  before, else the oldest), whose store time and report row make the lifetime;
- a remove of a key that is not live is an *orphan*.

Issue 21 (docs/SEMANTICS.md) classifies further what a row meant (partial keys, folded
evictions, promotions, Mamba re-keys and discards, hit announcements: the codes in
:mod:`kvtool.report.kbase`).

State carried between calls, all in arrays (:class:`State`):

- an open-addressing hash table over the key (linear probing, capacity a power of two,
  at most 70 % full: :meth:`State.reserve` grows it between calls). A key stays in the
  table once stored (that is what tells a recompute from a first store); per key: when
  and after how many evictions of its pool it last went from live to not live, and,
  while it is live, its record in the live keys' pool: the live count, the head and
  tail of its FIFO list of copies and its links in its channel's list of live keys (a
  clear walks that list only);
- an entry pool: one entry per live copy (store time, report row, next), with a free
  list;
- per channel: the head of its live-key list and its eviction count;
- per report row: its live copies now.

:func:`advance` is the rules' loop: one branch per row kind (store, remove, clear);
:func:`kvtool.report.kplain.advance_plain` the loop where every hash is one block. The
state lives in :mod:`kvtool.report.kstate`, the rules' per-batch bookkeeping in
:mod:`kvtool.report.krules`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

from kvtool._jit import kernel
from kvtool.columns import np
from kvtool.report import announce, kbase, kcopy, krules
from kvtool.report.announce import ANNOUNCED, ANNOUNCED_AMBIGUOUS
from kvtool.report.announce import announce as _announce
from kvtool.report.kbase import (
    CLEAR,
    DISCARD,
    DISCARDED_STORE,
    EVICTED,
    EVICTED_EXTRA,
    EXTRA,
    EXTRA_NOOP,
    FIRST,
    FLAG_CHANNEL_MAMBA,
    FLAG_MAMBA,
    FLAG_PREFIX,
    FLAG_TIER,
    FLAG_WINDOW,
    MAKES_BLOCK,
    NONE,
    NOTE_PARTIAL,
    ORPHAN,
    PROMOTED,
    RECOMPUTED,
    REKEY,
    REKEY_REMOVE,
    REMOVE,
    SKIP,
    STORE,
    UNIT,
    WHILE_LIVE,
)
from kvtool.report.kbase import code as _code
from kvtool.report.kbase import probe as _probe
from kvtool.report.kcopy import NOTE_COPY
from kvtool.report.kplain import advance_plain
from kvtool.report.kstate import EXTRAS as _EXTRAS
from kvtool.report.kstate import FREE as _FREE
from kvtool.report.kstate import KEYS as _KEYS
from kvtool.report.kstate import LIVE as _LIVE
from kvtool.report.kstate import PARTIALS as _PARTIALS
from kvtool.report.kstate import Channels, Entries, Live, State, Table, alloc, link, release

if TYPE_CHECKING:
    from numpy.typing import NDArray

_EMPTY = kbase.EMPTY
_OWNER, _BNEXT, _SLOT, _BATCH = kbase.OWNER, kbase.BNEXT, kbase.SLOT, kbase.BATCH
_ROW, _BITS, _STAMP, _EVENT = kbase.ROW, kbase.BITS, kbase.STAMP, kbase.EVENT
_PARTIAL_BIT, _LAST_BIT, _LIVE_BIT = kbase.PARTIAL_BIT, kbase.LAST_BIT, kbase.LIVE_BIT
_UNIT = UNIT
_advance_plain = advance_plain  # the name serve's warm-up test reads


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


@kernel
def advance(
    t: Table,
    lv: Live,
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
    pd: krules.Pending,
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
        lv: The live keys' pool (likewise).
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
                krules.settle(pd, c, chan, out)
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
            new_key = t.cn[s] == _EMPTY
            if new_key:
                t.cn[s] = _code(ch, ng)
                t.group[s] = grp
                t.hash[s] = h[i]
                meta[_KEYS] += 1
            count = lv.copies[t.live[s]] if t.live[s] >= 0 else 0
            rk = krules.find(pd.rk_chan, pd.rk_group, pd.rk_nog, pd.n[4], ch, grp, ng)
            pr = krules.find(pd.pr_chan, pd.pr_group, pd.pr_nog, pd.n[2], ch, grp, ng)
            partial = krules.is_partial(sh, i)
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
                    k = krules.find(pd.lf_chan, pd.lf_group, pd.lf_nog, pd.n[1], ch, grp, ng)
                    if k >= 0:
                        x = pd.lf_entry[k]
                        if e.aux[x, _STAMP] == pd.lf_serial[k] and e.aux[x, _BITS] & _LIVE_BIT:
                            host = x
                if host >= 0:
                    if krules.block_has(t, e, host, h[i], -1):
                        out.what[i] = EXTRA_NOOP
                        continue
                    y = alloc(e, meta, ts[i], gkey[i], sh.batch[i], i, sh.event[i])
                    e.aux[y, _OWNER] = host
                    e.aux[y, _BNEXT] = e.aux[host, _BNEXT]
                    e.aux[host, _BNEXT] = y
                    meta[_EXTRAS] += 1
                    link(t, lv, e, c, meta, s, y, ch)
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
            x = alloc(e, meta, ts[i], gkey[i], sh.batch[i], i, sh.event[i])
            if partial and not rekey:
                e.aux[x, _BITS] |= _PARTIAL_BIT
                meta[_PARTIALS] += 1
                out.note[i] = NOTE_PARTIAL
            if sh.last[i]:
                e.aux[x, _BITS] |= _LAST_BIT
            link(t, lv, e, c, meta, s, x, ch)
            live_gkey[gkey[i]] += 1
            if not partial:
                k = krules.find(pd.lf_chan, pd.lf_group, pd.lf_nog, pd.n[1], ch, grp, ng)
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
                if pd.fold_slot[k] == s and t.cn[s] != _EMPTY:
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
            r = t.live[s]
            if r < 0:
                out.what[i] = ORPHAN
                continue
            x = lv.head[r]
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
                    out.gkey[i] = krules.drop_block(
                        t, lv, e, c, meta, live_gkey, y, ts[i], ch, pd, False
                    )
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
                        and krules.is_partial(sh, nxt)
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
                    out.gkey[i] = krules.drop_block(
                        t, lv, e, c, meta, live_gkey, fresh, ts[i], ch, pd, False
                    )
                    continue
            if lv.copies[r] > 1:
                # R8: which copy (kvtool/report/kcopy.py).
                x, nc = kcopy.choose(t, lv, e, s, i, cur, op, group, no_group, h, sh, rule, lc)
                if nc > 1:
                    out.note[i] = NOTE_COPY
            kcopy.remember(lc, e, x, ch, grp, ng)
            out.what[i] = EVICTED
            out.ts[i] = e.ts[x]
            c.evictions[ch] += 1
            out.gkey[i] = krules.drop_block(t, lv, e, c, meta, live_gkey, x, ts[i], ch, pd, True)
        elif kind == CLEAR:
            ch = chan[i]
            krules.flush_folds(pd)
            for k in range(1, 5):
                pd.n[k] = 0
            lc.n[0] = 0
            if ch >= len(c.head):
                continue  # a channel that never stored: nothing to drop
            r = c.head[ch]
            while r >= 0:
                x = lv.head[r]
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
                nxt = lv.next[r]
                release(t, lv, meta, r, ts[i], c.evictions[ch])
                r = nxt
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
    krules.settle(pd, c, chan, out)
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
        plain: Walk with :func:`kvtool.report.kplain.advance_plain` (True), with
            :func:`advance` (False), or whichever gives the answer (None: plain where it
            is the same).
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
    if shape is None:
        # Every row its own batch: numbered below every real batch, across calls (R8 reads
        # whether a copy was stored in the remove's batch).
        sh = no_shape(n)
        sh = sh._replace(batch=-2 - state.unshaped - sh.batch)
        state.unshaped += n
    else:
        sh = shape

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
        state.live,
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
        drops = advance_plain(*args, out, sh, cand, *ann)
    else:
        pd = krules.pending(n)
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
