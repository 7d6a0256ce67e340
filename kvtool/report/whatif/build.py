"""What-if layout kernel: from one pool's event rows to the ops the simulation replays.

One sequential pass (numba) over a pool's events: each store's blocks get their depth
(1-based position in the request, from the parent's depth and the tokens the store spans, so
Mamba stores that skip blocks land where they belong); the stores of one scheduler step of
one request (one per group, same parent and last hash) form a *record*; a record whose
parent is the last block of an earlier record continues that request, any other starts one
(a lookup). A request's prompt is its first record and the records that store several blocks
or follow it at once (decode stores one block every ``block_size`` steps; without Mamba
groups, one block in the next batch continues the prompt only after a chunk the token budget
cut, else it is the first decode block). A second pass puts each record's start before the
removes its own allocation caused, where vLLM looked the request up.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from kvtool._jit import kernel
from kvtool.report.whatif.kernel import OP_CLEAR, OP_RECORD, OP_REMOVE, OP_STORE

I64 = npt.NDArray[np.int64]
IArr = npt.NDArray[np.signedinteger[Any]]

EV_STORE = 0
"""Event row types: ``BlockStored``."""
EV_REMOVE = 1
"""``BlockRemoved``."""
EV_CLEAR = 2
"""``AllBlocksCleared`` or a publisher restart."""

_COUNTED = -(1 << 62)

RESUME_BATCHES = 6
"""A request whose stores compute again another request's abandoned tail (the last block of
its chain, never continued) and go on past it, at most this many batches after that tail was
stored, is taken for a preempted request resuming mid-prefill (see :func:`build`). vLLM frees
a preempted request's blocks tail first (they stay cached, the tail is evicted first) and puts
it back at the head of the waiting queue, so it is scheduled again within a few steps once
blocks are free; a conversation's next turn also goes on past the old tail, but after its
user's pause, hence the short window."""

RESUME_TAIL_BATCHES = 16
"""And at most this many batches when the store ends at that tail: a request preempted while
decoding recomputes its prompt and generated tokens, which end where it stopped (decode
stores a block every ``block_size`` steps, so its tail may be that old when it is preempted);
a next turn's prompt always goes past it."""


@kernel
def _rehash(slot_hash: I64, slot_id: I64, cap: int) -> tuple[I64, I64]:
    """The table's entries in a table of ``cap`` slots."""
    mask = cap - 1
    new_hash = np.zeros(cap, np.int64)
    new_id = np.full(cap, -1, np.int64)
    for j in range(slot_id.shape[0]):
        if slot_id[j] < 0:
            continue
        h = slot_hash[j]
        s = ((h * np.int64(-7046029254386353131)) >> np.int64(17)) & mask
        while new_id[s] >= 0:
            s = (s + 1) & mask
        new_hash[s] = h
        new_id[s] = slot_id[j]
    return new_hash, new_id


@kernel
def intern(
    occ_hash: I64, par_hash: I64, ev_gpos: I64, ev_nh: I64, n_groups: int
) -> tuple[I64, I64, I64, I64, int, int]:
    """Number the hashes and the (group, hash) keys in order of first appearance.

    One open-addressing table over the 64-bit hashes (linear probing, at most half
    full, doubled as the distinct hashes grow: a recording repeats its hashes many times,
    so the table stays small and in cache) instead of sorting them.

    Args:
        occ_hash: The hash of each occurrence (a stored or removed block).
        par_hash: The parent hash of each store that names one.
        ev_gpos: The group position of each event.
        ev_nh: The hashes (occurrences) of each event.
        n_groups: Number of groups.

    Returns:
        The hash id of each occurrence and of each parent, the key id of each
        occurrence, the key of each ``hash_id * n_groups + group`` (-1: never seen),
        the number of hash ids and of keys.
    """
    cap = 1 << 12
    mask = cap - 1
    slot_hash = np.zeros(cap, np.int64)
    slot_id = np.full(cap, -1, np.int64)
    occ_hid = np.empty(occ_hash.shape[0], np.int64)
    par_hid = np.empty(par_hash.shape[0], np.int64)
    n_hid = 0
    for src in range(2):
        vals = occ_hash if src == 0 else par_hash
        out = occ_hid if src == 0 else par_hid
        for i in range(vals.shape[0]):
            h = vals[i]
            s = ((h * np.int64(-7046029254386353131)) >> np.int64(17)) & mask
            while slot_id[s] >= 0 and slot_hash[s] != h:
                s = (s + 1) & mask
            if slot_id[s] < 0:
                slot_hash[s] = h
                slot_id[s] = n_hid
                n_hid += 1
                if 2 * n_hid > cap:
                    cap *= 2
                    mask = cap - 1
                    slot_hash, slot_id = _rehash(slot_hash, slot_id, cap)
                    out[i] = n_hid - 1
                    continue
            out[i] = slot_id[s]
    key_of = np.full(n_hid * n_groups, -1, np.int64)
    occ_key = np.empty(occ_hash.shape[0], np.int64)
    n_keys = 0
    i = 0
    for e in range(ev_nh.shape[0]):
        g = ev_gpos[e]
        for _j in range(ev_nh[e]):
            c = occ_hid[i] * n_groups + g
            if key_of[c] < 0:
                key_of[c] = n_keys
                n_keys += 1
            occ_key[i] = key_of[c]
            i += 1
    return occ_hid, par_hid, occ_key, key_of, n_hid, n_keys


@kernel
def build(
    ev_type: I64,
    ev_gpos: I64,
    ev_h0: I64,
    ev_nh: I64,
    ev_parent: I64,
    ev_ntok: I64,
    ev_batch: I64,
    occ_hid: I64,
    occ_key: I64,
    key_of: I64,
    n_hid: int,
    n_groups: int,
    gbs: I64,
    like: IArr,
    budget_chunks: bool,
) -> tuple[IArr, IArr, IArr, IArr, IArr, I64, I64, I64, I64, I64, I64, I64, I64, I64, I64, I64]:
    """Lay out one pool's ops, records and requests (see the module docstring).

    Args:
        ev_type: Event row types (``EV_*``).
        ev_gpos: Group position of each event.
        ev_h0: Offset of each event's hashes in the occurrence arrays.
        ev_nh: Number of hashes of each event.
        ev_parent: Hash id of a store's parent, or -1.
        ev_ntok: Tokens of a store.
        ev_batch: Batch number of each event.
        occ_hid: Hash id of each hash occurrence.
        occ_key: Key id ((group, hash)) of each occurrence.
        key_of: The key id of each ``hash_id * n_groups + group`` (-1: none).
        n_hid: Number of hash ids.
        n_groups: Number of groups.
        gbs: Block size per group position.
        like: An empty array of the type of the op columns (``op_a``, ``op_depth``,
            ``op_group``, ``op_rec``): int32 when every key, record and depth fits it.
        budget_chunks: Only the token budget cuts a prompt into chunks (no Mamba group:
            vLLM's scheduler also splits a Mamba hybrid's prefill at block boundaries), so
            a one-block record in the next batch continues the prompt only after a chunk of
            about the largest record's size; else it is the first decode block.

    Returns:
        op_kind, op_a, op_depth, op_group, op_rec, rec_req, rec_s0, rec_depths,
        req_first_rec, req_l0, req_cap, req_c0, cand, req_p0, pre (see ``simulate``;
        ``pre`` holds each request's keys at depths ``req_l0``, ``req_l0 - 1``, … 1, the
        blocks the recorded engine hit, found through the parents), and the requests
        taken for preempted ones resuming (one element): a new request (its parent is no
        request's open tail) whose first store re-stores the abandoned tail of another
        (the last block of its chain, never continued) at most
        :data:`RESUME_BATCHES` batches after that tail was stored. A conversation's next
        turn looks the same but comes after the user's pause, not within a few steps.
    """
    n_ev = ev_type.shape[0]
    n_occ = occ_hid.shape[0]
    depth = np.full(n_hid, -1, np.int64)
    par_of = np.full(n_hid, -2, np.int64)  # -2: not seen as a stored block yet
    tail_req = np.full(n_hid, -1, np.int64)
    tail_gen = np.full(n_hid, -1, np.int64)
    tail_batch = np.full(n_hid, -1, np.int64)
    resumed = 0
    gen = 0
    # pass 1: base ops (one per hash, one per clear) and records (at most one per store)
    n_base = n_occ
    n_stores = 0
    for e in range(n_ev):
        if ev_type[e] == EV_CLEAR:
            n_base += 1
        elif ev_type[e] == EV_STORE:
            n_stores += 1
    # The ops are laid out in place: the base ops first, then (pass 2) moved up to make
    # room for the record starts (at most one per store).
    n_cap = n_base + n_stores + 1
    # In ``like``'s type: 32 bits unless the input is too large for them (the caller's
    # choice); the op codes in a byte.
    b_kind = np.empty(n_cap, np.int8)
    b_a = np.empty(n_cap, like.dtype)
    b_depth = np.zeros(n_cap, like.dtype)
    b_group = np.zeros(n_cap, like.dtype)
    b_rec = np.full(n_cap, -1, like.dtype)
    nb = 0
    rec_req = np.empty(n_stores + 1, np.int64)
    rec_batch = np.empty(n_stores + 1, np.int64)
    rec_base = np.empty(n_stores + 1, np.int64)
    rec_end = np.empty(n_stores + 1, np.int64)
    rec_h0 = np.full(n_stores + 1, -1, np.int64)
    rec_nh = np.zeros(n_stores + 1, np.int64)
    rec_pos = np.empty(n_stores + 1, np.int64)
    rec_par = np.full(n_stores + 1, -1, np.int64)
    n_rec = 0
    n_req = 0
    cur = -1
    cur_parent = -2
    cur_last = -2
    cur_mask = 0
    last_batch = -1
    lookup_pos = 0
    for e in range(n_ev):
        t = ev_type[e]
        if ev_batch[e] != last_batch:
            last_batch = ev_batch[e]
            cur = -1
            lookup_pos = nb
        if t == EV_REMOVE:
            cur = -1
            for j in range(ev_h0[e], ev_h0[e] + ev_nh[e]):
                b_kind[nb] = OP_REMOVE
                b_a[nb] = occ_key[j]
                b_group[nb] = ev_gpos[e]
                nb += 1
            continue
        if t == EV_CLEAR:
            cur = -1
            gen += 1
            b_kind[nb] = OP_CLEAR
            b_a[nb] = -1
            nb += 1
            lookup_pos = nb
            continue
        g = ev_gpos[e]
        nh = ev_nh[e]
        h0 = ev_h0[e]
        bs = gbs[g]
        span = ev_ntok[e] // bs if ev_ntok[e] > 0 else nh
        if span < nh:
            span = nh
        par = ev_parent[e]
        base = 0
        if par >= 0 and depth[par] >= 0:
            base = depth[par]
        first = base + span - nh + 1
        for i in range(nh):
            h = occ_hid[h0 + i]
            if depth[h] < 0:
                depth[h] = first + i
            if par_of[h] == -2 and span == nh:
                par_of[h] = par if i == 0 else occ_hid[h0 + i - 1]
        last = occ_hid[h0 + nh - 1] if nh > 0 else -1
        bit = 1 << (g % 63)
        if cur >= 0 and cur_parent == par and cur_last == last and (cur_mask & bit) == 0:
            r = cur
        else:
            r = n_rec
            n_rec += 1
            q = -1
            if par >= 0 and tail_gen[par] == gen and tail_req[par] >= 0:
                q = tail_req[par]
                tail_req[par] = -1
            if q < 0:
                q = n_req
                n_req += 1
            rec_req[r] = q
            rec_batch[r] = ev_batch[e]
            rec_base[r] = base
            rec_end[r] = base + span
            rec_pos[r] = lookup_pos
            rec_par[r] = par
            cur = r
            cur_parent = par
            cur_last = last
            cur_mask = 0
        cur_mask |= bit
        # A preempted request frees its blocks (they stay cached, its tail is evicted
        # first) and resumes: what was evicted meanwhile it stores again, up to its old
        # tail (and on, if it was preempted mid-prefill). Any store may do it: the hit can
        # end at an old tail its earlier turn left (a continuation), and the store of another
        # group of the same step joins the record of the first.
        q = rec_req[r]
        for i in range(nh):
            h = occ_hid[h0 + i]
            w = RESUME_TAIL_BATCHES if i == nh - 1 else RESUME_BATCHES
            if (
                tail_req[h] >= 0
                and tail_req[h] != q
                and tail_gen[h] == gen
                and ev_batch[e] - tail_batch[h] <= w
            ):
                resumed += 1
                tail_batch[h] = _COUNTED  # one resume per tail; the links stay
                break
        if cur_mask == bit and last >= 0:  # the record's first store: its tail
            tail_req[last] = q
            tail_gen[last] = gen
            tail_batch[last] = ev_batch[e]
        if span == nh and nh > rec_nh[r]:
            rec_h0[r] = h0
            rec_nh[r] = nh
        for i in range(nh):
            b_kind[nb] = OP_STORE
            b_a[nb] = occ_key[h0 + i]
            b_depth[nb] = first + i
            b_group[nb] = g
            b_rec[nb] = r
            nb += 1
        lookup_pos = nb
    # per record, the depths of its stores
    rec_s0 = np.zeros(n_rec + 1, np.int64)
    for i in range(nb):
        if b_kind[i] == OP_STORE:
            rec_s0[b_rec[i] + 1] += 1
    for r in range(n_rec):
        rec_s0[r + 1] += rec_s0[r]
    fill = rec_s0[:-1].copy()
    rec_depths = np.empty(rec_s0[n_rec], np.int64)
    for i in range(nb):
        if b_kind[i] == OP_STORE:
            rr = b_rec[i]
            rec_depths[fill[rr]] = b_depth[i]
            fill[rr] += 1
    # pass 2: record starts merged at their lookup positions (in place, from the end: an
    # op only moves up, past the ops not yet moved)
    n_ops = nb + n_rec
    o = n_ops
    r = n_rec - 1
    for i in range(nb, -1, -1):
        if i < nb:
            o -= 1
            b_kind[o] = b_kind[i]
            b_a[o] = b_a[i]
            b_depth[o] = b_depth[i]
            b_group[o] = b_group[i]
            b_rec[o] = b_rec[i]
        while r >= 0 and rec_pos[r] == i:
            o -= 1
            b_kind[o] = OP_RECORD
            b_a[o] = r
            b_depth[o] = 0
            b_group[o] = 0
            b_rec[o] = -1
            r -= 1
    op_kind = b_kind[:n_ops]
    op_a = b_a[:n_ops]
    op_depth = b_depth[:n_ops]
    op_group = b_group[:n_ops]
    op_rec = b_rec[:n_ops]
    # requests: records in order, the prompt run, candidate rows
    cnt = np.zeros(n_req + 1, np.int64)
    for r in range(n_rec):
        cnt[rec_req[r] + 1] += 1
    for q in range(n_req):
        cnt[q + 1] += cnt[q]
    by_req = np.empty(n_rec, np.int64)
    fill2 = cnt[:-1].copy()
    for r in range(n_rec):
        q = rec_req[r]
        by_req[fill2[q]] = r
        fill2[q] += 1
    req_first = np.empty(n_req, np.int64)
    req_l0 = np.empty(n_req, np.int64)
    req_cap = np.empty(n_req, np.int64)
    req_c0 = np.zeros(n_req + 1, np.int64)
    n_rows = 0
    rows_h = np.empty(rec_nh[:n_rec].sum() + 1, np.int64)  # at most one row per record hash
    # The largest record (blocks): a prefill chunk the token budget cut.
    big = 0
    for r in range(n_rec):
        big = max(big, rec_end[r] - rec_base[r])
    for q in range(n_req):
        r0 = by_req[cnt[q]]
        req_first[q] = r0
        l0 = rec_base[r0]
        req_l0[q] = l0
        expected = l0 + 1
        prev = -1
        stop = False
        for j in range(cnt[q], cnt[q + 1]):
            r = by_req[j]
            # A prompt goes on in the next step only where the budget cut its chunk; one
            # block in the next batch is else a decode block (its tokens are not the
            # prompt's: no lookup can hit it).
            if prev >= 0 and not (
                rec_end[r] - rec_base[r] >= 2
                or (
                    rec_batch[r] - rec_batch[prev] <= 1
                    and (not budget_chunks or rec_end[prev] - rec_base[prev] >= big - 1)
                )
            ):
                break
            prev = r
            if rec_nh[r] == 0:
                continue
            for i in range(rec_nh[r]):
                d = rec_base[r] + i + 1
                if d < expected:
                    continue
                if d > expected:
                    stop = True
                    break
                rows_h[n_rows] = occ_hid[rec_h0[r] + i]
                n_rows += 1
                expected += 1
            if stop:
                break
        req_cap[q] = expected - 1
        req_c0[q + 1] = n_rows
    cand = np.full((n_rows, n_groups), -1, np.int64)
    for i in range(n_rows):
        for g in range(n_groups):
            cand[i, g] = key_of[rows_h[i] * n_groups + g]
    # the blocks each request's recorded hit covered, deepest first, through the parents
    req_p0 = np.zeros(n_req + 1, np.int64)
    for q in range(n_req):
        n = 0
        h = rec_par[req_first[q]]
        while n < req_l0[q] and h >= 0:
            n += 1
            h = par_of[h]
        req_p0[q + 1] = req_p0[q] + n
    pre = np.full((req_p0[n_req], n_groups), -1, np.int64)
    for q in range(n_req):
        h = rec_par[req_first[q]]
        for i in range(req_p0[q], req_p0[q + 1]):
            for g in range(n_groups):
                pre[i, g] = key_of[h * n_groups + g]
            h = par_of[h]
    return (
        op_kind,
        op_a,
        op_depth,
        op_group,
        op_rec,
        rec_req[:n_rec].copy(),
        rec_s0,
        rec_depths,
        req_first,
        req_l0,
        req_cap,
        req_c0,
        cand,
        req_p0,
        pre,
        np.array([resumed], np.int64),
    )


__all__ = ["EV_CLEAR", "EV_REMOVE", "EV_STORE", "RESUME_BATCHES", "build", "intern"]
