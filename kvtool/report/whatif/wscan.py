"""What-if's columnar decoder: payload bytes straight into the columns the replay needs (numba).

The report's scanner (:mod:`kvtool.scan`) reads what the report's table holds; the
what-if also needs each store's ``parent_block_hash`` and ``block_size`` (it rebuilds
requests from parents). :func:`scan_whatif` reads one chunk's payloads with the same
msgpack primitives and the same rules (hash keys as :func:`kvtool.protocol.hash_key`,
ints inside int64, ASCII kinds, every read bounds-checked); a payload it does not take
(an error code) goes through the msgspec path, :mod:`kvtool.report.whatif.lean`, which
stays the reference.
"""

# ruff: noqa: SIM109  (numba: no tuple membership or generators in the kernels)

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numba.np.numpy_support import carray

from kvtool import schema
from kvtool._jit import kernel
from kvtool._msgpack import (
    _ARRAY,
    _BIN,
    _ERR,
    _INT,
    _MAP,
    _NIL,
    _STR,
    _UINT,
    ERR_BATCH,
    ERR_CAPACITY,
    ERR_EVENTS,
    ERR_FIELD,
    ERR_KEY,
    ERR_MIXED,
    ERR_TAG,
    ERR_TRAILING,
    ERR_TRUNCATED,
    MAX_DEPTH,
    OK,
    _ascii,
    _be,
    _head,
    _quick,
    _same,
    _skip,
    _voidptr,
)
from kvtool.scan import (
    MAX_VOCAB,
    NULL,
    _batch_map,
    _hashes,
    _names_blob,
    _opt_int,
    _opt_str,
    _tokens,
    _ts,
)

# Field codes of the what-if scanner.
W_SKIP, W_TYPE, W_HASHES, W_PARENT, W_TOKENS, W_BSIZE, W_GROUP, W_KIND, W_WINDOW = range(9)
_N_CODES = 9
_CODE_OF = {
    "type": W_TYPE,
    "block_hashes": W_HASHES,
    "parent_block_hash": W_PARENT,
    "token_ids": W_TOKENS,
    "block_size": W_BSIZE,
    "group_idx": W_GROUP,
    "kv_cache_spec_kind": W_KIND,
    "kv_cache_spec_sliding_window": W_WINDOW,
}
_KEY_NAMES = list(_CODE_OF)
_KEYS, _KEY_OFFS = _names_blob(_KEY_NAMES)
_KEY_CODES = np.array([_CODE_OF[n] for n in _KEY_NAMES], dtype=np.int64)
_KEY_AT = np.full((64, 256), -1, dtype=np.int64)
"""Map keys by (length, first byte) → index into the names (-1: not a key read here)."""
for _j, _name in enumerate(_KEY_NAMES):
    assert _KEY_AT[len(_name), ord(_name[0])] < 0, "two keys share length and first byte"
    _KEY_AT[len(_name), ord(_name[0])] = _j
_TAGS, _TAG_OFFS = _names_blob(list(schema.EVENT_TAGS))

_REMOVED_FIELDS = frozenset(("block_hashes", "group_idx"))
# Per type code (stored, removed, cleared): which codes it reads (the rest are ignored,
# as the lean structs ignore them).
_USES = np.zeros((3, _N_CODES), dtype=np.int64)
for _n, _c in _CODE_OF.items():
    if _n != "type":
        _USES[0, _c] = 1
        _USES[1, _c] = 1 if _n in _REMOVED_FIELDS else 0


def _positions(event: str) -> Any:
    idx = schema.array_index(event)  # type: ignore[arg-type]
    out = np.zeros(max(idx.values()) + 1, dtype=np.int64)
    for name, pos in idx.items():
        if name in _CODE_OF and (event == "stored" or name in _REMOVED_FIELDS):
            out[pos] = _CODE_OF[name]
    return out


_STORED_POS = _positions("stored")
_REMOVED_POS = _positions("removed")
_POS = np.zeros((3, max(len(_STORED_POS), len(_REMOVED_POS))), dtype=np.int64)
_POS[0, : len(_STORED_POS)] = _STORED_POS
_POS[1, : len(_REMOVED_POS)] = _REMOVED_POS
_POS_LEN = np.array([len(_STORED_POS), len(_REMOVED_POS), 0], dtype=np.int64)


@kernel
def _event(buf: Any, pos: Any, end: Any, stack: Any, fpos: Any) -> Any:
    """Locate one event's fields: (type code, encoding 0 map / 1 array, end, error)."""
    for k in range(_N_CODES):
        fpos[k] = -1
    cls, n, p = _head(buf, pos, end)
    if cls == _ERR:
        return -1, 0, p, n
    tcode = -1
    if cls == _MAP:
        for _i in range(n):
            if p < end and 0xA0 <= buf[p] <= 0xBF and p + 1 + (buf[p] & 0x1F) <= end:
                kc, kn, kp = _STR, np.int64(buf[p] & 0x1F), p + 1  # fixstr: no call
            else:
                kc, kn, kp = _head(buf, p, end)
            if kc == _ERR:
                return -1, 0, kp, kn
            if kc != _STR:
                return -1, 0, kp, ERR_KEY
            code = W_SKIP
            if 0 < kn < _KEY_AT.shape[0]:
                j = _KEY_AT[kn, buf[kp]]
                if j >= 0 and _same(buf, kp, kn, _KEYS, _KEY_OFFS[j], _KEY_OFFS[j + 1]):
                    code = _KEY_CODES[j]
            if code == W_SKIP and not _ascii(buf, kp, kn):
                return -1, 0, kp, ERR_KEY
            p = kp + kn
            if code != W_SKIP:
                if fpos[code] >= 0:
                    return -1, 0, p, ERR_KEY
                fpos[code] = p
            q = _quick(buf, p, end)
            if q >= 0:
                p = q
                continue
            p, err = _skip(buf, p, end, stack)
            if err != OK:
                return -1, 0, p, err
        tp = fpos[W_TYPE]
        if tp < 0:
            return -1, 0, p, ERR_TAG
        tc, tn, tq = _head(buf, tp, end)
        if tc != _STR:
            return -1, 0, p, ERR_TAG
        for t in range(3):
            if _same(buf, tq, tn, _TAGS, _TAG_OFFS[t], _TAG_OFFS[t + 1]):
                tcode = t
        if tcode < 0:
            return -1, 0, p, ERR_TAG
        for k in range(2, _N_CODES):
            if _USES[tcode, k] == 0:
                fpos[k] = -1
        return tcode, 0, p, OK
    if cls == _ARRAY:
        if n == 0:
            return -1, 1, p, ERR_TAG
        tc, tn, tq = _head(buf, p, end)
        if tc == _ERR:
            return -1, 1, tq, tn
        if tc != _STR:
            return -1, 1, tq, ERR_TAG
        for t in range(3):
            if _same(buf, tq, tn, _TAGS, _TAG_OFFS[t], _TAG_OFFS[t + 1]):
                tcode = t
        if tcode < 0:
            return -1, 1, tq, ERR_TAG
        p = tq + tn
        for i in range(1, n):
            if i < _POS_LEN[tcode]:
                code = _POS[tcode, i]
                if code != W_SKIP:
                    fpos[code] = p
            q = _quick(buf, p, end)
            if q >= 0:
                p = q
                continue
            p, err = _skip(buf, p, end, stack)
            if err != OK:
                return -1, 1, p, err
        return tcode, 1, p, OK
    return -1, 0, p, ERR_EVENTS


@kernel
def _one_hash(buf: Any, pos: Any, end: Any) -> Any:
    """A nil-or-hash field: (key, 1 if present, error code), keys as ``_hashes`` reads them."""
    if pos < 0:
        return np.int64(0), 0, OK
    c, v, q = _head(buf, pos, end)
    if c == _NIL:
        return np.int64(0), 0, OK
    if c == _INT or c == _UINT:
        return np.int64(v), 1, OK
    if c == _BIN:
        lo = q + v - 8 if v > 8 else q
        return np.int64(_be(buf, lo, q + v - lo)), 1, OK
    if c == _ERR:
        return np.int64(0), 0, v
    return np.int64(0), 0, ERR_FIELD


@kernel
def _events(
    buf: Any,
    pos: Any,
    end: Any,
    stack: Any,
    fpos: Any,
    ev0: Any,
    k0: Any,
    e_type: Any,
    e_nh: Any,
    e_group: Any,
    e_kind: Any,
    e_window: Any,
    e_tokens: Any,
    e_parent: Any,
    e_has_parent: Any,
    e_bsize: Any,
    keys: Any,
    voc_off: Any,
    voc_len: Any,
    counts: Any,
) -> Any:
    """Scan an ``events`` array: (end, events, keys, error code)."""
    cls, n_ev, p = _head(buf, pos, end)
    if cls == _ERR:
        return p, 0, 0, n_ev
    if cls != _ARRAY:
        return p, 0, 0, ERR_EVENTS
    if n_ev > end - p:
        return p, 0, 0, ERR_TRUNCATED
    if ev0 + n_ev > len(e_type):
        return p, 0, 0, ERR_CAPACITY
    enc0 = -1
    ev = ev0
    nk = k0
    for _j in range(n_ev):
        tcode, enc, p, err = _event(buf, p, end, stack, fpos)
        if err != OK:
            return p, 0, 0, err
        if enc0 < 0:
            enc0 = enc
        elif enc != enc0:
            return p, 0, 0, ERR_MIXED
        nh = 0
        if fpos[W_HASHES] >= 0:
            nh, err = _hashes(buf, fpos[W_HASHES], end, keys, nk)
            if err != OK:
                return p, 0, 0, err
        kind, err = _opt_str(buf, fpos[W_KIND], end, voc_off, voc_len, counts)
        if err != OK:
            return p, 0, 0, err
        g, has, err = _opt_int(buf, fpos[W_GROUP], end)
        if err != OK:
            return p, 0, 0, err
        w, has_w, err = _opt_int(buf, fpos[W_WINDOW], end)
        if err != OK:
            return p, 0, 0, err
        par, has_par, err = _one_hash(buf, fpos[W_PARENT], end)
        if err != OK:
            return p, 0, 0, err
        bs = np.int64(-1)
        at = fpos[W_BSIZE]
        if at >= 0:  # any value: an int is a block size, anything else none
            bc, bv, _bq = _head(buf, at, end)
            if bc == _INT or bc == _UINT:
                bs = np.int64(bv)
        e_type[ev] = tcode
        e_nh[ev] = nh
        e_group[ev] = g if has else NULL
        e_window[ev] = w if has_w else NULL
        e_kind[ev] = kind
        e_tokens[ev] = _tokens(buf, fpos[W_TOKENS], end)
        e_parent[ev] = par
        e_has_parent[ev] = has_par
        e_bsize[ev] = bs
        ev += 1
        nk += nh
    return p, n_ev, nk - k0, OK


@kernel
def _scan_body(
    buf: Any,
    offs: Any,
    first: Any,
    b_rank: Any,
    b_err: Any,
    b_nev: Any,
    e_type: Any,
    e_nh: Any,
    e_group: Any,
    e_kind: Any,
    e_window: Any,
    e_tokens: Any,
    e_parent: Any,
    e_has_parent: Any,
    e_bsize: Any,
    keys: Any,
    voc_off: Any,
    voc_len: Any,
    counts: Any,
    stack: Any,
    fpos: Any,
    bpos: Any,
    s8: Any,
    s4: Any,
    f8: Any,
    f4: Any,
) -> Any:
    """:func:`_scan`'s work, on borrowed arrays."""
    n_pay = len(offs) - 1
    for i in range(first, n_pay):
        start = offs[i]
        end = offs[i + 1]
        ev0 = counts[0]
        k0 = counts[1]
        b_nev[i] = 0
        b_err[i] = OK
        n_ev = 0
        n_k = 0
        cls, n, p = _head(buf, start, end)
        err = OK
        if cls == _ERR:
            err = n
        elif cls == _ARRAY:
            if n < 2:
                err = ERR_BATCH
            else:
                bpos[0] = p
                bpos[2] = -1
                p, err = _skip(buf, p, end, stack)
                if err == OK:
                    p, n_ev, n_k, err = _events(
                        buf, p, end, stack, fpos, ev0, k0, e_type, e_nh, e_group, e_kind,
                        e_window, e_tokens, e_parent, e_has_parent, e_bsize, keys,
                        voc_off, voc_len, counts,
                    )  # fmt: skip
                for j in range(2, n):
                    if err != OK:
                        break
                    if j == 2:
                        bpos[2] = p
                    p, err = _skip(buf, p, end, stack)
                if err == OK and p != end:
                    err = ERR_TRAILING
        elif cls == _MAP:
            err = _batch_map(buf, start, end, stack, bpos)
            if err == OK:
                _p, n_ev, n_k, err = _events(
                    buf, bpos[1], end, stack, fpos, ev0, k0, e_type, e_nh, e_group, e_kind,
                    e_window, e_tokens, e_parent, e_has_parent, e_bsize, keys, voc_off,
                    voc_len, counts,
                )  # fmt: skip
        else:
            err = ERR_BATCH
        if err == ERR_CAPACITY:
            return i
        if err == OK:
            _t, err = _ts(buf, bpos[0], end, s8, s4, f8, f4)  # checked as msgspec checks it
        if err == OK:
            rank, has, rerr = _opt_int(buf, bpos[2], end)
            if rerr != OK or (has and rank < 0):
                err = ERR_FIELD
            b_rank[i] = rank if has else -1
        if err == OK:
            counts[0] = ev0 + n_ev
            counts[1] = k0 + n_k
            b_nev[i] = n_ev
        else:
            b_err[i] = err
            counts[0] = ev0
            counts[1] = k0
    return n_pay


@kernel
def _scan(
    buf: Any,
    offs: Any,
    first: Any,
    b_rank: Any,
    b_err: Any,
    b_nev: Any,
    e_type: Any,
    e_nh: Any,
    e_group: Any,
    e_kind: Any,
    e_window: Any,
    e_tokens: Any,
    e_parent: Any,
    e_has_parent: Any,
    e_bsize: Any,
    keys: Any,
    voc_off: Any,
    voc_len: Any,
    counts: Any,
    stack: Any,
    fpos: Any,
    bpos: Any,
    s8: Any,
    s4: Any,
    f8: Any,
    f4: Any,
) -> Any:
    """Scan payloads ``first..`` into the columns; return where it stopped (full columns).

    Every array goes to the work as a borrowed view (no reference count), as in
    :func:`kvtool.scan._scan`; the caller holds them all for the call.
    """
    return _scan_body(
        carray(_voidptr(buf.ctypes.data), buf.shape, np.uint8),
        carray(_voidptr(offs.ctypes.data), offs.shape, np.int64),
        first,
        carray(_voidptr(b_rank.ctypes.data), b_rank.shape, np.int64),
        carray(_voidptr(b_err.ctypes.data), b_err.shape, np.int64),
        carray(_voidptr(b_nev.ctypes.data), b_nev.shape, np.int64),
        carray(_voidptr(e_type.ctypes.data), e_type.shape, np.uint8),
        carray(_voidptr(e_nh.ctypes.data), e_nh.shape, np.int64),
        carray(_voidptr(e_group.ctypes.data), e_group.shape, np.int64),
        carray(_voidptr(e_kind.ctypes.data), e_kind.shape, np.int32),
        carray(_voidptr(e_window.ctypes.data), e_window.shape, np.int64),
        carray(_voidptr(e_tokens.ctypes.data), e_tokens.shape, np.int64),
        carray(_voidptr(e_parent.ctypes.data), e_parent.shape, np.int64),
        carray(_voidptr(e_has_parent.ctypes.data), e_has_parent.shape, np.int64),
        carray(_voidptr(e_bsize.ctypes.data), e_bsize.shape, np.int64),
        carray(_voidptr(keys.ctypes.data), keys.shape, np.int64),
        carray(_voidptr(voc_off.ctypes.data), voc_off.shape, np.int64),
        carray(_voidptr(voc_len.ctypes.data), voc_len.shape, np.int64),
        carray(_voidptr(counts.ctypes.data), counts.shape, np.int64),
        carray(_voidptr(stack.ctypes.data), stack.shape, np.int64),
        carray(_voidptr(fpos.ctypes.data), fpos.shape, np.int64),
        carray(_voidptr(bpos.ctypes.data), bpos.shape, np.int64),
        carray(_voidptr(s8.ctypes.data), s8.shape, np.uint8),
        carray(_voidptr(s4.ctypes.data), s4.shape, np.uint8),
        carray(_voidptr(f8.ctypes.data), f8.shape, np.float64),
        carray(_voidptr(f4.ctypes.data), f4.shape, np.float32),
    )


@dataclass
class WScanned:
    """One chunk's what-if columns (numpy arrays).

    Attributes:
        rank: Per payload: its ``data_parallel_rank`` (-1: none).
        err: Per payload: an error code (0: scanned here; else decode it with msgspec).
        n_events: Per payload: events (0 where ``err``).
        type_code: Per event: 0 stored, 1 removed, 2 cleared.
        n_hashes: Per event.
        group_idx: Per event (:data:`kvtool.scan.NULL`: nil or absent).
        kind: Per event: vocabulary code (-1: nil).
        window: Per event (NULL: nil or absent).
        tokens: Per event: ``len(token_ids)``.
        parent: Per event: the parent's hash key (where ``has_parent``).
        has_parent: Per event: 1 when a store names a parent.
        block_size: Per event: the store's ``block_size`` (-1: none).
        keys: Every hash key, in event order.
        vocab: The strings of the kind codes.
    """

    rank: Any
    err: Any
    n_events: Any
    type_code: Any
    n_hashes: Any
    group_idx: Any
    kind: Any
    window: Any
    tokens: Any
    parent: Any
    has_parent: Any
    block_size: Any
    keys: Any
    vocab: list[str]


# type, hashes, group, kind, window, tokens, parent, has parent, block size
_DTYPES = (np.uint8, np.int64, np.int64, np.int32, np.int64, np.int64, np.int64, np.int64, np.int64)


def scan_whatif(buf: Any, offs: Any) -> WScanned:
    """Scan joined payloads into the what-if's columns.

    Args:
        buf: The payloads' bytes joined (uint8).
        offs: int64 offsets: payload ``i`` is ``buf[offs[i]:offs[i+1]]``.

    Returns:
        The columns; payloads with ``err != 0`` have no events in them.
    """
    n_pay = len(offs) - 1
    size = int(offs[-1] - offs[0]) if n_pay > 0 else 0
    b_rank = np.zeros(n_pay, dtype=np.int64)
    b_err = np.zeros(n_pay, dtype=np.int64)
    b_nev = np.zeros(n_pay, dtype=np.int64)
    ev_cap = max(16, size // 64)
    key_cap = max(16, size // 32)
    ev = [np.empty(ev_cap, dtype=t) for t in _DTYPES]
    keys = np.empty(key_cap, dtype=np.int64)
    voc_off = np.zeros(MAX_VOCAB, dtype=np.int64)
    voc_len = np.zeros(MAX_VOCAB, dtype=np.int64)
    counts = np.zeros(3, dtype=np.int64)
    stack = np.zeros(MAX_DEPTH, dtype=np.int64)
    fpos = np.zeros(_N_CODES, dtype=np.int64)
    bpos = np.zeros(3, dtype=np.int64)
    s8 = np.zeros(8, dtype=np.uint8)
    s4 = np.zeros(4, dtype=np.uint8)
    floats = (s8, s4, s8.view(np.float64), s4.view(np.float32))
    at = 0
    while True:
        at = _scan(  # type: ignore[call-arg]
            buf, offs, at, b_rank, b_err, b_nev, *ev, keys, voc_off, voc_len, counts,
            stack, fpos, bpos, *floats,
        )  # fmt: skip
        if at >= n_pay:
            break
        ev = [np.concatenate([a, np.empty(len(a), dtype=a.dtype)]) for a in ev]
        keys = np.concatenate([keys, np.empty(len(keys), dtype=np.int64)])
    n_ev, n_keys, n_voc = (int(x) for x in counts)
    vocab = [
        bytes(buf[int(o) : int(o) + int(n)]).decode("ascii")
        for o, n in zip(voc_off[:n_voc], voc_len[:n_voc], strict=True)
    ]
    t, nh, g, kind, w, tok, par, has_par, bs = (a[:n_ev] for a in ev)
    return WScanned(
        b_rank, b_err, b_nev, t, nh, g, kind, w, tok, par, has_par, bs, keys[:n_keys], vocab
    )


__all__ = ["WScanned", "scan_whatif"]
