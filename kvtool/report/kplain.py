"""The state kernel's loop for a call where every hash is one block (block-16 streams).

:func:`kvtool.report.kernel.step` takes it where the issue 21 rules keep every hash one
block: the same answers as :func:`kvtool.report.kernel.advance`, faster.
"""

from __future__ import annotations

from typing import Any

from kvtool._jit import kernel
from kvtool.columns import np
from kvtool.report import kbase, kcopy
from kvtool.report.announce import ANNOUNCED
from kvtool.report.announce import announce as _announce
from kvtool.report.kbase import CLEAR, EVICTED, FIRST, ORPHAN, RECOMPUTED, REMOVE, STORE, WHILE_LIVE
from kvtool.report.kbase import ahead as _ahead
from kvtool.report.kbase import code as _code
from kvtool.report.kbase import probe as _probe
from kvtool.report.kcopy import NOTE_COPY
from kvtool.report.kstate import FREE as _FREE
from kvtool.report.kstate import KEYS as _KEYS
from kvtool.report.kstate import LIVE as _LIVE
from kvtool.report.kstate import USED as _USED
from kvtool.report.kstate import Channels, Entries, Live, Table, go_live, release, unlink

_EMPTY = kbase.EMPTY
_OWNER, _BNEXT, _SLOT, _BATCH = kbase.OWNER, kbase.BNEXT, kbase.SLOT, kbase.BATCH
_ROW, _BITS, _STAMP, _EVENT = kbase.ROW, kbase.BITS, kbase.STAMP, kbase.EVENT
_PARTIAL_BIT, _LAST_BIT, _LIVE_BIT = kbase.PARTIAL_BIT, kbase.LAST_BIT, kbase.LIVE_BIT


@kernel
def advance_plain(
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
    out: Any,
    sh: Any,
    cand: Any,
    mode: Any,
    hits: Any,
    hit_n: Any,
    cl: Any,
    rule: Any,
    lc: kcopy.Last,
) -> int:
    """``advance`` for a call where every hash is one block: the loop before issue 21.

    :func:`kvtool.report.kernel.step` takes it when no row can be a partial entry or a
    Mamba group's and no extra key or partial block is live: then each rule of
    :func:`kvtool.report.kernel.advance` keeps every hash one block, and this loop (which
    keeps the entries' block fields consistent for later calls) gives the same answers
    faster.

    Args:
        t: The hash table (room for every store of the chunk: :meth:`State.reserve`).
        lv: The live keys' pool (likewise).
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
        cand: As :func:`kvtool.report.kernel.advance`'s (hit announcements, R6).
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
        _ahead(t, op, chan, group, no_group, h, i)
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
            r = t.live[s]
            if t.cn[s] == _EMPTY:
                t.cn[s] = _code(ch, no_group[i])
                t.group[s] = group[i]
                t.hash[s] = h[i]
                meta[_KEYS] += 1
                out.what[i] = FIRST
            elif r >= 0:
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
            if r < 0:
                # Live now: a live record, at the head of the channel's live-key list.
                r = go_live(t, lv, c, meta, s, ch)
                lv.head[r] = x
            else:
                e.next[lv.tail[r]] = x
            lv.tail[r] = x
            lv.copies[r] += 1
            live_gkey[gkey[i]] += 1
        elif kind == REMOVE:
            ch = chan[i]
            s = _probe(t, ch, group[i], no_group[i], h[i])
            r = t.live[s]
            if r < 0:
                out.what[i] = ORPHAN
                continue
            x = lv.head[r]
            if lv.copies[r] > 1:
                # R8: which copy (kvtool/report/kcopy.py).
                x, nc = kcopy.choose(t, lv, e, s, i, cur, op, group, no_group, h, sh, rule, lc)
                if nc > 1:
                    out.note[i] = NOTE_COPY
            kcopy.remember(lc, e, x, ch, group[i], no_group[i])
            out.what[i] = EVICTED
            out.ts[i] = e.ts[x]
            out.gkey[i] = e.gkey[x]
            live_gkey[e.gkey[x]] -= 1
            c.evictions[ch] += 1
            unlink(t, lv, e, c, meta, x, ts[i], ch)
        elif kind == CLEAR:
            ch = chan[i]
            lc.n[0] = 0
            if ch >= len(c.head):
                continue  # a channel that never stored: nothing to drop
            r = c.head[ch]
            while r >= 0:
                x = lv.head[r]
                while x >= 0:
                    scratch[e.gkey[x]] += 1
                    nx = e.next[x]
                    e.aux[x, _BITS] = 0
                    meta[_LIVE] -= 1
                    e.next[x] = meta[_FREE]
                    meta[_FREE] = x
                    x = nx
                nxt = lv.next[r]
                release(t, lv, meta, r, ts[i], c.evictions[ch])
                r = nxt
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


__all__ = ["advance_plain"]
