"""The what-if kernel: one pool's recorded event order replayed against a larger pool.

The model (vLLM 0.33's block pool, see the project's WHATIF notes): one free queue per
engine, least recently freed first, shared by every group. The order of the recorded
``BlockRemoved`` events is the pool's eviction order, so a pool ``K`` blocks larger keeps
what the recorded pool evicted for ``K`` more evictions: a *ghost* FIFO of evicted keys
(oldest first) with room for ``K`` entries, plus the room that hits at the larger pool leave
free (a hit allocates nothing). At each request's lookup the hit is extended with the
per-kind rules (full attention: every block up to the hit; sliding window: the last
``ceil((w-1)/block_size)`` blocks; Mamba: the state exactly at the hit) and capped where the
recorded engine itself stopped although its own cache held more (the prompt - 1 limit) even
after the removes of its step that precede its stores (a request scheduled before it in that
step, a running one's new decode block, may have evicted them first: then it is no cap, and
the larger pool looks up after those removes too). A store at the larger pool of a key that
is neither live nor ghost is a recompute; a store it would not make (inside the longer hit)
is saved. The recorded copies of a saved store the larger pool skips (sliding-window blocks
before the window) are *phantoms*: the larger pool's copy of such a key is an older one, and
a lookup that hits the key there takes that copy out of the ghost list, also below the
recorded hit. Where the larger pool holds no copy of a key the recorded hit needs (only
phantoms: its older copy was evicted), its own hit is shorter (:func:`_held_hit`): the
blocks between are computed again there, recomputes or duplicates, each taking a block. A
longer hit that reaches a block the recorded pool holds but did not touch (its hit stopped
before) takes the larger pool's copy out of the queue there (vLLM's touch): the recorded
copy, evicted later from its older place in the queue, is a phantom, and the request's
recorded store of the key stands for the larger pool's copy, freed again with the request.
The reverse: a sliding-window block of the recorded hit's window that the longer hit leaves
below its own window is not touched there, so the larger pool's copy keeps its older place
in the queue (where its last user freed it) while the recorded copy moves to the tail: the
recorded copy becomes a phantom and the larger pool's copy waits, held, until the recorded
pool evicts a block last used (stored or hit) after that copy's last use: the queue is in
order of freeing, so the waiting copy joins the ghost list just before it. A Mamba state hit
goes back to the queue's tail (vLLM frees it after the request's next step): where the
request stores that state at the recorded size too, its recorded copy (freed at about that
time) stands for the larger pool's; else the hit copy rejoins the ghost list's tail. A
recorded Mamba state hit on a key the recorded pool holds only in phantoms takes the larger
pool's older copy out of the queue, as for the other kinds. vLLM's scheduler also stops a
Mamba hybrid's prefill chunk at the shared-prefix junction (the full-attention hit's end,
when it is longer than the joint hit) and caches the state there: where the larger pool's
full-attention hit ends elsewhere than the recorded one, the recorded junction state is not
stored there and the state at the larger pool's junction is (a recompute when that key was
stored before and is not held).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from kvtool._jit import kernel
from kvtool.report.whatif import ghost

I64 = npt.NDArray[np.int64]
I32 = npt.NDArray[np.int32]
IArr = npt.NDArray[np.signedinteger[Any]]

KIND_FULL = 0
"""Group kinds of the kernel: full attention and every kind that needs the whole prefix."""
KIND_SLIDING = 1
"""Sliding-window groups (their hit needs the last blocks of the window only)."""
KIND_MAMBA = 2
"""Mamba groups (their hit needs the state at exactly the hit length)."""

OP_STORE = 0
"""Op codes: one stored block (``op_a`` is its key)."""
OP_REMOVE = 1
"""One removed block (``op_a`` is its key)."""
OP_CLEAR = 2
"""``AllBlocksCleared``: the pool starts afresh."""
OP_RECORD = 3
"""A record begins (``op_a`` is the record): a request's lookup point when it is the first."""


@kernel
def _cached(k: int, n0: I32, ph: I32, kin: I32, gc: I32, n0_only: bool) -> bool:
    if k < 0:
        return False
    if n0_only:
        return bool(n0[k] > 0)
    return bool(n0[k] - ph[k] + kin[k] + gc[k] > 0)


@kernel
def _lookup(
    cand: I64,
    c0: int,
    l0: int,
    cap: int,
    gkind: I64,
    gsw: I64,
    n0: I32,
    ph: I32,
    kin: I32,
    gc: I32,
    n0_only: bool,
) -> int:
    """Return the longest hit (blocks) in [l0, cap] under the per-kind rules."""
    n_groups = gkind.shape[0]
    hit = _fa_hit(cand, c0, l0, cap, gkind, n0, ph, kin, gc, n0_only)
    while hit > l0:
        ok = True
        row = c0 + hit - l0 - 1
        for g in range(n_groups):
            if gkind[g] == KIND_SLIDING:
                lo = max(hit - gsw[g] + 1, l0 + 1)
                for dd in range(lo, hit + 1):
                    if not _cached(cand[c0 + dd - l0 - 1, g], n0, ph, kin, gc, n0_only):
                        ok = False
                        break
            elif gkind[g] == KIND_MAMBA and not _cached(cand[row, g], n0, ph, kin, gc, n0_only):
                ok = False
            if not ok:
                break
        if ok:
            break
        hit -= 1
    return hit


@kernel
def _fa_hit(
    cand: I64,
    c0: int,
    l0: int,
    cap: int,
    gkind: I64,
    n0: I32,
    ph: I32,
    kin: I32,
    gc: I32,
    n0_only: bool,
) -> int:
    """The full-attention groups' own hit (blocks): vLLM's shared-prefix junction."""
    n_groups = gkind.shape[0]
    lfa = l0
    for d in range(l0 + 1, cap + 1):
        row = c0 + d - l0 - 1
        for g in range(n_groups):
            if gkind[g] == KIND_FULL and not _cached(cand[row, g], n0, ph, kin, gc, n0_only):
                return lfa
        lfa = d
    return lfa


@kernel
def _own_after_removes(
    i: int,
    op_kind: IArr,
    op_a: IArr,
    cand: I64,
    c0: int,
    l0: int,
    cap: int,
    gkind: I64,
    gsw: I64,
    n0: I32,
) -> int:
    """The recorded pool's own hit after the removes between lookup ``i`` and its stores.

    A step's removes before a request's first store are its own allocation's and those of
    the requests scheduled before it in that step (a running request's new decode block
    stores nothing), so the recorded lookup came somewhere among them: the pool held more
    than the recorded hit (the prompt - 1 cap) only if it still does after all of them.
    """
    zero = np.zeros(1, np.int32)
    j = i + 1
    while j < op_kind.shape[0] and op_kind[j] == OP_REMOVE:
        n0[op_a[j]] -= 1
        j += 1
    own = _lookup(cand, c0, l0, cap, gkind, gsw, n0, zero, zero, zero, True)
    for jj in range(i + 1, j):
        n0[op_a[jj]] += 1
    return own


@kernel
def _held_hit(
    pre: I64,
    p0: int,
    n_pre: int,
    l0: int,
    gkind: I64,
    gsw: I64,
    n0: I32,
    ph: I32,
    kin: I32,
    gc: I32,
) -> int:
    """Return the longest hit at or below the recorded one (``l0``) the larger pool holds.

    vLLM's lookup there can only hit what that pool holds: in a sliding-window group the
    last ``gsw`` blocks before the hit (all of them from the first block on, below a
    whole window). The recorded pool may hold such a block only in a copy the larger pool
    never made (a phantom: a longer hit there padded that position with the null block),
    and the larger pool's older copy may be evicted since: its hit is shorter there.
    Only sliding-window blocks are checked: a full-attention hit takes every block, so
    the larger pool holds what the recorded one hit (a phantom there is only which of
    two copies is counted), and Mamba states are where the recorded chunks ended. Only a
    block the recorded pool holds at the lookup, in phantom copies only, counts as not
    held: one it does not hold either (its stream stores no such window block, or lost
    it) says nothing of the larger pool, nor does a depth the parent chain does not give.
    """
    n_groups = gkind.shape[0]
    lp = l0
    while lp > 0:
        ok = True
        for g in range(n_groups):
            if gkind[g] != KIND_SLIDING:
                continue
            for d in range(max(lp - gsw[g] + 1, 1), lp + 1):
                j = l0 - d
                if j >= n_pre:
                    continue
                k = pre[p0 + j, g]
                # Not held there: the recorded pool holds it, in phantom copies only.
                if k >= 0 and n0[k] > 0 and not _cached(k, n0, ph, kin, gc, False):
                    ok = False
                    break
            if not ok:
                break
        if ok:
            return lp
        lp -= 1
    return 0


@kernel
def _mamba_stores(
    op_kind: IArr,
    op_depth: IArr,
    op_group: IArr,
    op_rec: IArr,
    rec_req: I64,
    gkind: I64,
    n_req: int,
) -> tuple[I64, I64]:
    """Per request, the Mamba states its records store: CSR offsets and ``depth * G + group``."""
    n_groups = gkind.shape[0]
    s0 = np.zeros(n_req + 1, np.int64)
    for i in range(op_kind.shape[0]):
        if op_kind[i] == OP_STORE and gkind[op_group[i]] == KIND_MAMBA:
            s0[rec_req[op_rec[i]] + 1] += 1
    for q in range(n_req):
        s0[q + 1] += s0[q]
    fill = s0[:-1].copy()
    code = np.empty(s0[n_req], np.int64)
    for i in range(op_kind.shape[0]):
        if op_kind[i] == OP_STORE and gkind[op_group[i]] == KIND_MAMBA:
            q = rec_req[op_rec[i]]
            code[fill[q]] = op_depth[i] * n_groups + op_group[i]
            fill[q] += 1
    return s0, code


@kernel
def _stores(s0: I64, code: I64, q: int, d: int, g: int, n_groups: int) -> bool:
    """Whether request ``q``'s records store its Mamba state at depth ``d`` of group ``g``."""
    c = d * n_groups + g
    j = s0[q]
    while j < s0[q + 1] and code[j] != c:
        j += 1
    return bool(j < s0[q + 1])


@kernel
def _junction_stops(
    op_kind: IArr,
    op_a: IArr,
    rec_req: I64,
    req_first_rec: I64,
    req_l0: I64,
    req_cap: I64,
    req_c0: I64,
    cand: I64,
    gkind: I64,
    ms0: I64,
    mcode: I64,
    n_keys: int,
) -> bool:
    """Whether the recorded engine caches Mamba states at shared-prefix junctions.

    Where a request's recorded full-attention hit ends beyond its joint hit (and before its
    prompt's end), an engine that stops prefill chunks at that junction stores the state
    there: true when at least half of such requests do.
    """
    n_groups = gkind.shape[0]
    live = np.zeros(n_keys, np.int32)
    zero = np.zeros(1, np.int32)
    could = 0
    shown = 0
    for i in range(op_kind.shape[0]):
        t = op_kind[i]
        if t == OP_STORE:
            live[op_a[i]] += 1
        elif t == OP_REMOVE:
            if live[op_a[i]] > 0:
                live[op_a[i]] -= 1
        elif t == OP_CLEAR:
            live[:] = 0
        else:
            r = op_a[i]
            q = rec_req[r]
            if req_first_rec[q] != r:
                continue
            l0 = req_l0[q]
            j0 = _fa_hit(cand, req_c0[q], l0, req_cap[q], gkind, live, zero, zero, zero, True)
            if j0 > l0 and j0 < req_cap[q]:
                could += 1
                for g in range(n_groups):
                    if gkind[g] == KIND_MAMBA and _stores(ms0, mcode, q, j0, g, n_groups):
                        shown += 1
                        break
    return shown > 0 and 2 * shown >= could


@kernel
def simulate(
    op_kind: IArr,
    op_a: IArr,
    op_depth: IArr,
    op_group: IArr,
    op_rec: IArr,
    rec_req: I64,
    rec_s0: I64,
    rec_depths: I64,
    req_first_rec: I64,
    req_l0: I64,
    req_cap: I64,
    req_c0: I64,
    cand: I64,
    req_p0: I64,
    pre: I64,
    gkind: I64,
    gsw: I64,
    n_keys: int,
    extra: int,
    rejoin: bool,
) -> tuple[I64, I64, I64, I64, I64, int, int]:
    """Replay one pool's ops against a pool ``extra`` blocks larger.

    Args:
        op_kind: Op codes (``OP_*``), in the recorded order.
        op_a: Key of a store or remove; record of ``OP_RECORD``.
        op_depth: Depth (1-based block position in its request) of a stored block.
        op_group: Group position of a store or remove.
        op_rec: Record of a store (-1 for other ops).
        rec_req: Request of each record.
        rec_s0: CSR offsets of each record's store depths in ``rec_depths``.
        rec_depths: The depths of every record's stored blocks.
        req_first_rec: Each request's first record (its lookup).
        req_l0: The recorded hit of each request (blocks).
        req_cap: The deepest block a lookup may reach (end of the prompt's blocks).
        req_c0: Offset of each request's candidate rows in ``cand``.
        cand: Per candidate depth (``req_l0 + 1`` …) and group, the key or -1.
        req_p0: Offset of each request's rows in ``pre``.
        pre: Per depth the recorded hit covered (``req_l0``, ``req_l0 - 1`` …) and
            group, the key or -1.
        gkind: Kernel kind of each group (``KIND_*``).
        gsw: Blocks a sliding-window hit needs, per group.
        n_keys: Number of keys.
        extra: K, the extra blocks.
        rejoin: A Mamba state hit at the larger pool rejoins the queue tail.

    Returns:
        Per group: recomputed, stored-while-live, saved stores, stores, first stores;
        the blocks of extra prefix hit over all requests; and the removes of keys not
        live (orphans: the stream began mid-way or lost batches).
    """
    n_groups = gkind.shape[0]
    n_ops = op_kind.shape[0]
    # Copies per key are small counts: 32 bits halve the replay's per-key memory.
    n0 = np.zeros(n_keys, np.int32)
    ph = np.zeros(n_keys, np.int32)
    kin = np.zeros(n_keys, np.int32)
    gc = np.zeros(n_keys, np.int32)
    seen = np.zeros(n_keys, np.bool_)
    # The ghost list gets one entry per remove, one per Mamba state a request's hit puts
    # back at the queue's tail, and one per block a shorter hit at the larger pool
    # computes again (rare: the list grows when they need room).
    n_ent = req_l0.shape[0] * n_groups + 1
    for i in range(n_ops):
        if op_kind[i] == OP_REMOVE:
            n_ent += 1
    ent_key = np.zeros(n_ent, np.int64)
    ent_alive = np.zeros(n_ent, np.bool_)
    ent_prev = np.full(n_ent, -1, np.int64)
    key_last = np.full(n_keys, -1, np.int64)
    # Sliding-window blocks a longer hit left untouched (see the module docstring): rows
    # the op of each key's last use in the recording (a store or a recorded hit), and the
    # use a waiting key's larger-pool copy was freed after (-1: not waiting); the waiting
    # copies in a heap by that op, each ``op * n_keys + key``.
    pend = np.full((2, n_keys), -1, np.int64)
    heap = np.zeros(req_l0.shape[0] * max(int(gsw.sum()), 1) + 1, np.int64)
    hn = np.zeros(1, np.int64)
    done_until = 0
    head = 0
    tail = 0
    free = extra
    req_hit = np.full(req_l0.shape[0], -1, np.int64)
    req_skip = np.full(req_l0.shape[0], -1, np.int64)
    ms0, mcode = _mamba_stores(op_kind, op_depth, op_group, op_rec, rec_req, gkind, req_l0.shape[0])
    mamba = bool((gkind == KIND_MAMBA).any())
    junctions = mamba and rejoin
    if junctions:
        junctions = _junction_stops(
            op_kind,
            op_a,
            rec_req,
            req_first_rec,
            req_l0,
            req_cap,
            req_c0,
            cand,
            gkind,
            ms0,
            mcode,
            n_keys,
        )
    rc = np.zeros(n_groups, np.int64)
    dup = np.zeros(n_groups, np.int64)
    saved = np.zeros(n_groups, np.int64)
    stores = np.zeros(n_groups, np.int64)
    first = np.zeros(n_groups, np.int64)
    hit_blocks = 0
    orphans = 0
    sliding = bool((gkind == KIND_SLIDING).any())
    for i in range(n_ops):
        t = op_kind[i]
        if t == OP_RECORD:
            r = op_a[i]
            q = rec_req[r]
            if req_first_rec[q] == r:
                l0 = req_l0[q]
                c0 = req_c0[q]
                cap = req_cap[q]
                p0 = req_p0[q]
                n_pre = req_p0[q + 1] - p0
                own = _lookup(cand, c0, l0, cap, gkind, gsw, n0, ph, kin, gc, True)
                if own > l0:
                    own = _own_after_removes(i, op_kind, op_a, cand, c0, l0, cap, gkind, gsw, n0)
                    if own <= l0:
                        # Not the cap: the removes of this step came before the recorded
                        # lookup, so the larger pool's lookup comes after them too.
                        done_until = i + 1
                        while done_until < n_ops and op_kind[done_until] == OP_REMOVE:
                            ent_key, ent_alive, ent_prev, tail, head, free, orphan = ghost.remove(
                                op_a[done_until],
                                n0,
                                ph,
                                kin,
                                gc,
                                pend,
                                heap,
                                hn,
                                ent_key,
                                ent_alive,
                                ent_prev,
                                key_last,
                                tail,
                                head,
                                free,
                            )
                            orphans += orphan
                            done_until += 1
                hit = l0
                if own <= l0:
                    hit = _lookup(cand, c0, l0, cap, gkind, gsw, n0, ph, kin, gc, False)
                # Where the larger pool does not hold the recorded hit (and no longer one
                # either), its hit is shorter: the blocks between are computed again.
                top = l0
                if hit <= l0 and n_pre > 0 and sliding:
                    top = _held_hit(pre, p0, n_pre, l0, gkind, gsw, n0, ph, kin, gc)
                for d in range(top + 1, l0 + 1):
                    j = l0 - d
                    if j >= n_pre:
                        continue
                    for g in range(n_groups):
                        k = pre[p0 + j, g]
                        if k < 0 or gkind[g] == KIND_MAMBA:
                            continue
                        stores[g] += 1
                        if _cached(k, n0, ph, kin, gc, False):
                            dup[g] += 1
                        elif seen[k]:
                            rc[g] += 1
                        else:
                            first[g] += 1  # the recording began after its first store
                        seen[k] = True
                        if ph[k] > 0:
                            ph[k] -= 1  # computed at the larger pool: no longer a phantom
                        else:
                            # The larger pool's own copy, freed to the queue's tail.
                            ent_key, ent_alive, ent_prev, tail = ghost.push(
                                k, ent_key, ent_alive, ent_prev, key_last, gc, tail
                            )
                        # It takes a block: a free one, else the queue's head is evicted.
                        head, free = ghost.take(head, tail, free, ent_key, ent_alive, gc)
                req_hit[q] = hit
                if junctions:
                    # vLLM stops a prefill chunk at the shared-prefix junction (where the
                    # full-attention hit ends beyond the joint one) and caches the Mamba
                    # state there: at the larger pool that junction moves with its hit.
                    j0 = _fa_hit(cand, c0, l0, cap, gkind, n0, ph, kin, gc, True)
                    j1 = _fa_hit(cand, c0, l0, cap, gkind, n0, ph, kin, gc, False)
                    if j1 != j0:
                        if j0 > hit and j0 < cap:
                            req_skip[q] = j0
                        if j1 > hit and j1 < cap:
                            row = c0 + j1 - l0 - 1
                            for g in range(n_groups):
                                k = cand[row, g]
                                if k < 0 or gkind[g] != KIND_MAMBA:
                                    continue
                                if _stores(ms0, mcode, q, j1, g, n_groups):
                                    continue
                                stores[g] += 1
                                if _cached(k, n0, ph, kin, gc, False):
                                    dup[g] += 1
                                elif seen[k]:
                                    rc[g] += 1
                                else:
                                    first[g] += 1
                                seen[k] = True
                                ent_key, ent_alive, ent_prev, tail = ghost.push(
                                    k, ent_key, ent_alive, ent_prev, key_last, gc, tail
                                )
                                head, free = ghost.take(head, tail, free, ent_key, ent_alive, gc)
                hit_blocks += hit - l0 + top - l0
                # The larger pool touches what it hits: ghost copies leave the queue.
                for d in range(l0 + 1, hit + 1):
                    row = c0 + d - l0 - 1
                    for g in range(n_groups):
                        k = cand[row, g]
                        if k < 0:
                            continue
                        kd = gkind[g]
                        if kd == KIND_SLIDING and d <= hit - gsw[g]:
                            continue
                        if kd == KIND_MAMBA and d != hit:
                            continue
                        # A Mamba state this request stores at N0 too (its recorded copy,
                        # freed as the larger pool frees the hit one, stands for it).
                        own_m = (
                            kd == KIND_MAMBA and rejoin and _stores(ms0, mcode, q, d, g, n_groups)
                        )
                        if pend[1, k] >= 0:
                            pend[1, k] = -1  # taken by this hit, as a held copy
                            continue
                        if n0[k] - ph[k] + kin[k] > 0 and (kd != KIND_MAMBA or own_m):
                            # The recorded pool holds it and did not touch it (its hit
                            # stopped before): this hit takes the larger pool's copy out of
                            # the queue, so the recorded copy, evicted from its older place,
                            # is a phantom; this request's store of it stands for it.
                            ph[k] += 1
                            kin[k] += 1
                            continue
                        if n0[k] - ph[k] + kin[k] > 0 or gc[k] <= 0:
                            continue
                        if kd == KIND_MAMBA and not rejoin:
                            continue  # the state stays where it was in the queue
                        ghost.unlink_last(k, ent_alive, ent_prev, key_last, gc)
                        if kd == KIND_MAMBA and rejoin and not own_m:
                            ent_key, ent_alive, ent_prev, tail = ghost.push(
                                k, ent_key, ent_alive, ent_prev, key_last, gc, tail
                            )
                        else:
                            kin[k] += 1
                # What the recorded engine hit too, the larger pool hits again. Where the
                # recorded pool holds the key only in copies the larger pool never made
                # (phantoms: a sliding-window block a longer hit skipped and the recorded
                # engine computed), the larger pool's copy is an older one in the ghost
                # list: the hit takes it out of the queue, and the recorded copy this
                # request touched stands for it from now on.
                for j in range(req_p0[q], req_p0[q + 1]):
                    d = l0 - (j - req_p0[q])
                    for g in range(n_groups):
                        k = pre[j, g]
                        if k < 0:
                            continue
                        kd = gkind[g]
                        used = pend[0, k]
                        if kd == KIND_FULL or (kd == KIND_SLIDING and d > l0 - gsw[g]):
                            pend[0, k] = i  # the recorded engine's hit touched it
                        elif kd == KIND_MAMBA and d == l0:
                            pend[0, k] = i
                        if d > top:
                            continue  # computed again above, not hit
                        if kd == KIND_MAMBA and (d != hit or not rejoin):
                            continue
                        if kd == KIND_SLIDING and d <= hit - gsw[g]:
                            if (
                                hit > l0
                                and d > l0 - gsw[g]
                                and used >= 0
                                and pend[1, k] < 0
                                and n0[k] - ph[k] + kin[k] > 0
                            ):
                                # The recorded hit touched it, the longer one does not: the
                                # larger pool's copy stays where its last use freed it.
                                ph[k] += 1
                                kin[k] += 1
                                ghost.wait(k, used, n_keys, pend, heap, hn)
                            continue
                        if pend[1, k] >= 0:
                            # Touched again here: the recorded copy stands for it again.
                            pend[1, k] = -1
                            kin[k] -= 1
                            ph[k] -= 1
                            continue
                        if n0[k] - ph[k] + kin[k] > 0 or gc[k] <= 0 or ph[k] <= 0:
                            continue
                        ghost.unlink_last(k, ent_alive, ent_prev, key_last, gc)
                        ph[k] -= 1
            hit = req_hit[q]
            if hit >= 0:
                # This record's saved stores allocate nothing at the larger pool.
                for j in range(rec_s0[r], rec_s0[r + 1]):
                    if rec_depths[j] <= hit:
                        free += 1
        elif t == OP_REMOVE:
            if i < done_until:
                continue  # taken before the lookup that follows it
            ent_key, ent_alive, ent_prev, tail, head, free, orphan = ghost.remove(
                op_a[i],
                n0,
                ph,
                kin,
                gc,
                pend,
                heap,
                hn,
                ent_key,
                ent_alive,
                ent_prev,
                key_last,
                tail,
                head,
                free,
            )
            orphans += orphan
        elif t == OP_CLEAR:
            n0[:] = 0
            ph[:] = 0
            kin[:] = 0
            gc[:] = 0
            ent_alive[:] = False
            key_last[:] = -1
            pend[:] = -1
            hn[0] = 0
            head = tail
            free = extra
        else:
            k = op_a[i]
            pend[0, k] = i
            g = op_group[i]
            q = rec_req[op_rec[i]]
            hit = req_hit[q]
            skip = gkind[g] == KIND_MAMBA and op_depth[i] == req_skip[q]
            if hit >= 0 and (op_depth[i] <= hit or skip):
                if kin[k] > 0:
                    kin[k] -= 1
                    pend[1, k] = -1
                else:
                    ph[k] += 1
                n0[k] += 1
                saved[g] += 1
                # Not stored at the larger pool: a block it hits was stored before (seen
                # already); one it skips (sliding window blocks before the window, Mamba
                # states before the hit) is never computed there, so a later store of
                # it is a first store, not a recompute.
                continue
            stores[g] += 1
            if seen[k]:
                if n0[k] - ph[k] + kin[k] + gc[k] > 0:
                    dup[g] += 1
                else:
                    rc[g] += 1
            else:
                first[g] += 1
            seen[k] = True
            n0[k] += 1
    return rc, dup, saved, stores, first, hit_blocks, orphans


@kernel
def recorded(
    op_kind: IArr, op_a: IArr, op_group: IArr, n_keys: int, n_groups: int
) -> tuple[I64, int]:
    """The recorded pool's own counts: what :func:`simulate` gives at ``extra=0``, cheaply.

    At the recorded size no hit is longer and nothing is saved, so a recompute is a store
    of a key stored before and not live, and an orphan a remove of a key not live.

    Returns:
        Recomputed blocks per group, and the removes of keys not live.
    """
    live = np.zeros(n_keys, np.int32)
    seen = np.zeros(n_keys, np.bool_)
    rc = np.zeros(n_groups, np.int64)
    orphans = 0
    for i in range(op_kind.shape[0]):
        t = op_kind[i]
        if t == OP_STORE:
            k = op_a[i]
            if seen[k] and live[k] <= 0:
                rc[op_group[i]] += 1
            seen[k] = True
            live[k] += 1
        elif t == OP_REMOVE:
            k = op_a[i]
            if live[k] <= 0:
                orphans += 1
            else:
                live[k] -= 1
        elif t == OP_CLEAR:
            live[:] = 0
    return rc, orphans


__all__ = [
    "KIND_FULL",
    "KIND_MAMBA",
    "KIND_SLIDING",
    "OP_CLEAR",
    "OP_RECORD",
    "OP_REMOVE",
    "OP_STORE",
    "recorded",
    "simulate",
]
