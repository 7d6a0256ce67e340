"""The numba kernels of the columnar decoder (:mod:`kvtool.scan` calls them).

Field tables from :mod:`kvtool.schema` (names, codes, array positions), then the kernels,
each a step of the scan: a batch's map, its events, one event's fields, hash and token
lists; :func:`_scan` is the one entry called from Python (:func:`kvtool.scan.scan`). The
msgpack primitives and the error codes are :mod:`kvtool._msgpack`'s. Every read is
bounds-checked against the payload's end.
"""

# ruff: noqa: SIM109  (numba: no tuple membership or generators in the kernels)

from __future__ import annotations

import sys
from typing import Any

import numpy as np
from numba.np.numpy_support import carray

from kvtool import schema
from kvtool._jit import helper_kernel, kernel
from kvtool._msgpack import (  # the primitives and the error codes (re-exported)
    _ARRAY,
    _BIN,
    _ERR,
    _FLOAT,
    _INT,
    _MAP,
    _NIL,
    _STR,
    _UINT,
    ERR_BATCH,
    ERR_CAPACITY,
    ERR_EVENTS,
    ERR_FIELD,
    ERR_HASHES,
    ERR_KEY,
    ERR_MIXED,
    ERR_RANGE,
    ERR_RANK,
    ERR_TAG,
    ERR_TRAILING,
    ERR_TRUNCATED,
    ERR_TS,
    ERR_VOCAB,
    OK,
    _ascii,
    _be,
    _head,
    _quick,
    _same,
    _skip,
    _voidptr,
)

MAX_VOCAB = 256
"""Distinct medium/kind strings per chunk."""

# -- field codes, from the one field table ---------------------------------------------------

(F_SKIP, F_TYPE, F_HASHES, F_TOKENS, F_MEDIUM, F_GROUP, F_KIND, F_WINDOW, F_PARENT, F_ORIGIN,
 F_BSIZE) = range(11)  # fmt: skip
N_CODES = 11
_CODE_OF = {
    "block_hashes": F_HASHES,
    "token_ids": F_TOKENS,
    "medium": F_MEDIUM,
    "group_idx": F_GROUP,
    "kv_cache_spec_kind": F_KIND,
    "kv_cache_spec_sliding_window": F_WINDOW,
    "parent_block_hash": F_PARENT,
    "origin": F_ORIGIN,
    "block_size": F_BSIZE,
}
_LEAN_STORED = schema.projection("lean", "stored")
_LEAN_REMOVED = schema.projection("lean", "removed")
assert set(_LEAN_STORED) == set(_CODE_OF), "a lean field has no scanner code"


def _names_blob(names: list[str]) -> tuple[Any, Any]:
    data = b"".join(n.encode() for n in names)
    offs = np.zeros(len(names) + 1, dtype=np.int64)
    offs[1:] = np.cumsum([len(n.encode()) for n in names])
    return np.frombuffer(data, dtype=np.uint8).copy(), offs


# Map keys: "type" first, then the lean fields; their codes.
_KEY_NAMES = ["type", *_LEAN_STORED]
_KEYS, _KEY_OFFS = _names_blob(_KEY_NAMES)
_KEY_CODES = np.array([F_TYPE, *(_CODE_OF[n] for n in _LEAN_STORED)], dtype=np.int64)
_KEY_AT = np.full((64, 256), -1, dtype=np.int64)
"""Map keys by (length, first byte) → index into the names (-1: not a known key)."""
for _j, _name in enumerate(_KEY_NAMES):
    assert _KEY_AT[len(_name), ord(_name[0])] < 0, "two keys share length and first byte"
    _KEY_AT[len(_name), ord(_name[0])] = _j
_TAGS, _TAG_OFFS = _names_blob(list(schema.EVENT_TAGS))
_BATCH_KEYS, _BATCH_KEY_OFFS = _names_blob(["ts", "events", "data_parallel_rank"])


def _fields_of(names: tuple[str, ...]) -> Any:
    """Per field code: 1 when the event type reads that field."""
    used = np.zeros(N_CODES, dtype=np.int64)
    for n in names:
        used[_CODE_OF[n]] = 1
    return used


# Per type code (stored, removed, cleared): which field codes it reads.
_USES = np.stack(
    [_fields_of(_LEAN_STORED), _fields_of(_LEAN_REMOVED), np.zeros(N_CODES, dtype=np.int64)]
)


def _positions(event: str) -> Any:
    """Array position → field code for an array-encoded event type (0: skipped)."""
    idx = schema.array_index(event)  # type: ignore[arg-type]
    out = np.zeros(max(idx.values()) + 1, dtype=np.int64)
    for name, pos in idx.items():
        if name in _CODE_OF:
            out[pos] = _CODE_OF[name]
    return out


_STORED_POS = _positions("stored")
_REMOVED_POS = _positions("removed")
_POS = np.zeros((3, max(len(_STORED_POS), len(_REMOVED_POS))), dtype=np.int64)
_POS[0, : len(_STORED_POS)] = _STORED_POS
_POS[1, : len(_REMOVED_POS)] = _REMOVED_POS
_POS_LEN = np.array([len(_STORED_POS), len(_REMOVED_POS), 0], dtype=np.int64)


_LITTLE = sys.byteorder == "little"

NULL = np.int64(-(1 << 63))
"""``e_group``/``e_window`` of a nil (never a value: int64's minimum goes to msgspec)."""

# -- kernels ---------------------------------------------------------------------------------


@helper_kernel
def _intern(buf: Any, at: Any, n: Any, voc_off: Any, voc_len: Any, counts: Any) -> Any:
    """The vocabulary code of the ASCII string ``buf[at:at+n]`` (-1: vocabulary full)."""
    nv = counts[2]
    for v in range(nv):
        if voc_len[v] == n:
            o = voc_off[v]
            same = True
            for k in range(n):
                if buf[o + k] != buf[at + k]:
                    same = False
                    break
            if same:
                return v
    if nv >= len(voc_off):
        return -1
    voc_off[nv] = at
    voc_len[nv] = n
    counts[2] = nv + 1
    return nv


@helper_kernel
def _opt_str(buf: Any, pos: Any, end: Any, voc_off: Any, voc_len: Any, counts: Any) -> Any:
    """A nil-or-str field: (code, -1 for nil; error code)."""
    if pos < 0:
        return -1, OK
    cls, n, p = _head(buf, pos, end)
    if cls == _NIL:
        return -1, OK
    if cls != _STR or not _ascii(buf, p, n):
        return -1, ERR_FIELD
    code = _intern(buf, p, n, voc_off, voc_len, counts)
    if code < 0:
        return -1, ERR_VOCAB
    return code, OK


@helper_kernel
def _opt_int(buf: Any, pos: Any, end: Any) -> Any:
    """A nil-or-int field: (value, 1 if present, error code)."""
    if pos < 0:
        return 0, 0, OK
    cls, n, _p = _head(buf, pos, end)
    if cls == _NIL:
        return 0, 0, OK
    if cls == _INT and n != NULL:
        return n, 1, OK
    if cls == _UINT or cls == _INT:
        return 0, 0, ERR_RANGE
    return 0, 0, ERR_FIELD


@helper_kernel
def _event(
    buf: Any,
    pos: Any,
    end: Any,
    stack: Any,
    fpos: Any,
) -> Any:
    """Locate one event's fields: (type code, encoding 0 map / 1 array, position after, error).

    ``fpos[code]`` receives the position of each field's value (-1: absent).
    """
    for k in range(N_CODES):
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
            code = F_SKIP
            if 0 < kn < _KEY_AT.shape[0]:
                j = _KEY_AT[kn, buf[kp]]  # the one name of this length and first byte
                if j >= 0 and _same(buf, kp, kn, _KEYS, _KEY_OFFS[j], _KEY_OFFS[j + 1]):
                    code = _KEY_CODES[j]
            if code == F_SKIP and not _ascii(buf, kp, kn):
                return -1, 0, kp, ERR_KEY
            p = kp + kn
            if code != F_SKIP:
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
        tp = fpos[F_TYPE]
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
        for k in range(2, N_CODES):
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
                if code != F_SKIP:
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


@helper_kernel
def _ts(buf: Any, pos: Any, end: Any, s8: Any, s4: Any, f8: Any, f4: Any) -> Any:
    """The batch's ``ts``: (value, error code); ``f8``/``f4`` view ``s8``/``s4``."""
    cls, n, p = _head(buf, pos, end)
    if cls == _FLOAT:
        if n == 8:
            for k in range(8):  # big-endian bytes into the native scratch
                s8[7 - k if _LITTLE else k] = buf[p + k]
            return f8[0], OK
        for k in range(4):
            s4[3 - k if _LITTLE else k] = buf[p + k]
        return np.float64(f4[0]), OK
    if cls == _INT and -(1 << 53) <= n <= (1 << 53):
        return np.float64(n), OK
    return 0.0, ERR_TS


@helper_kernel
def _batch_map(buf: Any, start: Any, end: Any, stack: Any, bpos: Any) -> Any:
    """Locate a map batch's ts, events and rank (``bpos[0..2]``, -1: absent): error code."""
    bpos[0] = -1
    bpos[1] = -1
    bpos[2] = -1
    _cls, n, p = _head(buf, start, end)
    for _i in range(n):
        kc, kn, kp = _head(buf, p, end)
        if kc == _ERR:
            return kn
        if kc != _STR:
            return ERR_KEY
        slot = -1
        if _same(buf, kp, kn, _BATCH_KEYS, _BATCH_KEY_OFFS[0], _BATCH_KEY_OFFS[1]):
            slot = 0
        elif _same(buf, kp, kn, _BATCH_KEYS, _BATCH_KEY_OFFS[1], _BATCH_KEY_OFFS[2]):
            slot = 1
        elif _same(buf, kp, kn, _BATCH_KEYS, _BATCH_KEY_OFFS[2], _BATCH_KEY_OFFS[3]):
            slot = 2
        elif not _ascii(buf, kp, kn):
            return ERR_KEY
        p = kp + kn
        if slot >= 0:
            if bpos[slot] >= 0:
                return ERR_KEY
            bpos[slot] = p
        p, err = _skip(buf, p, end, stack)
        if err != OK:
            return err
    if bpos[0] < 0 or bpos[1] < 0:
        return ERR_BATCH
    if p != end:
        return ERR_TRAILING
    return OK


@helper_kernel
def _hashes(buf: Any, pos: Any, end: Any, keys: Any, at: Any) -> Any:
    """Read a ``block_hashes`` list into ``keys[at:]``: (count, error code).

    Ints are kept as signed 64-bit (uint64 reinterpreted); bytes map to their last 8
    bytes big-endian (:func:`kvtool.protocol.hash_key`). ``ERR_CAPACITY`` when ``keys``
    is full.
    """
    cls, n, p = _head(buf, pos, end)
    if cls != _ARRAY:
        return 0, ERR_HASHES if cls != _ERR else n
    if n > end - p:
        return 0, ERR_TRUNCATED
    if at + n > len(keys):
        return 0, ERR_CAPACITY
    for j in range(n):
        if p + 9 <= end and (buf[p] == 0xCF or buf[p] == 0xD3):  # 64-bit ints: no call
            v = np.int64(0)
            for k in range(1, 9):
                v = (v << np.int64(8)) | np.int64(buf[p + k])
            keys[at + j] = v
            p += 9
            continue
        if p + 34 <= end and buf[p] == 0xC4 and buf[p + 1] == 0x20:  # 32 bytes: no call
            v = np.int64(0)
            for k in range(26, 34):
                v = (v << np.int64(8)) | np.int64(buf[p + k])
            keys[at + j] = v
            p += 34
            continue
        c, v, q = _head(buf, p, end)
        if c == _INT or c == _UINT:
            keys[at + j] = v
            p = q
        elif c == _BIN:
            lo = q + v - 8 if v > 8 else q
            keys[at + j] = _be(buf, lo, q + v - lo)
            p = q + v
        elif c == _ERR:
            return 0, v
        else:
            return 0, ERR_HASHES
    return n, OK


@helper_kernel
def _tokens(buf: Any, pos: Any, end: Any) -> Any:
    """``len(token_ids)`` from its header (0: absent or not an array; already validated)."""
    if pos < 0:
        return 0
    cls, n, _p = _head(buf, pos, end)
    return n if cls == _ARRAY else 0


@helper_kernel
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
    e_medium: Any,
    e_kind: Any,
    e_window: Any,
    e_tokens: Any,
    e_parent: Any,
    e_has_parent: Any,
    e_origin: Any,
    e_bsize: Any,
    keys: Any,
    voc_off: Any,
    voc_len: Any,
    counts: Any,
) -> Any:
    """Scan an ``events`` array from ``ev0``/``k0``: (end, events, keys, error code)."""
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
        if fpos[F_HASHES] >= 0:
            nh, err = _hashes(buf, fpos[F_HASHES], end, keys, nk)
            if err != OK:
                return p, 0, 0, err
        # Nil and small values inline (every position here is of a value already
        # skipped, so inside the payload); anything else through the checked helpers.
        med = -1
        at = fpos[F_MEDIUM]
        if at >= 0 and buf[at] != 0xC0:
            med, err = _opt_str(buf, at, end, voc_off, voc_len, counts)
            if err != OK:
                return p, 0, 0, err
        kind = -1
        at = fpos[F_KIND]
        if at >= 0 and buf[at] != 0xC0:
            kind, err = _opt_str(buf, at, end, voc_off, voc_len, counts)
            if err != OK:
                return p, 0, 0, err
        g = NULL
        at = fpos[F_GROUP]
        if at >= 0 and buf[at] != 0xC0:
            if buf[at] <= 0x7F:
                g = np.int64(buf[at])
            else:
                g, _has, err = _opt_int(buf, at, end)
                if err != OK:
                    return p, 0, 0, err
        w = NULL
        at = fpos[F_WINDOW]
        if at >= 0 and buf[at] != 0xC0:
            if buf[at] <= 0x7F:
                w = np.int64(buf[at])
            else:
                w, _has, err = _opt_int(buf, at, end)
                if err != OK:
                    return p, 0, 0, err
        tok: Any = np.int64(0)
        at = fpos[F_TOKENS]
        if at >= 0:
            fix = 0x90 <= buf[at] <= 0x9F  # a fixarray: its count in the header byte
            tok = np.int64(buf[at] & 0x0F) if fix else _tokens(buf, at, end)
        # parent_block_hash: its key when it is a hash (int or bytes, as block_hashes);
        # nil, absent or any other value: no parent (as kvtool.columns reads it).
        par = np.int64(0)
        has_par = 0
        at = fpos[F_PARENT]
        if at >= 0 and buf[at] != 0xC0:
            pc, pv, pq = _head(buf, at, end)
            if pc == _INT or pc == _UINT:
                par = pv
                has_par = 1
            elif pc == _BIN:
                lo = pq + pv - 8 if pv > 8 else pq
                par = _be(buf, lo, pq + pv - lo)
                has_par = 1
        org = -1
        at = fpos[F_ORIGIN]
        if at >= 0 and buf[at] != 0xC0:
            org, err = _opt_str(buf, at, end, voc_off, voc_len, counts)
            if err != OK:
                return p, 0, 0, err
        # block_size: any value (typed loosely, as kvtool.columns reads it): an int64 is
        # a block size, anything else none (NULL; int64's minimum goes to msgspec).
        bs = NULL
        at = fpos[F_BSIZE]
        if at >= 0:
            if buf[at] <= 0x7F:
                bs = np.int64(buf[at])
            else:
                bc, bv, _bq = _head(buf, at, end)
                if bc == _INT:
                    if bv == NULL:
                        return p, 0, 0, ERR_RANGE
                    bs = bv
        e_parent[ev] = par
        e_has_parent[ev] = has_par
        e_origin[ev] = org
        e_bsize[ev] = bs
        e_type[ev] = tcode
        e_nh[ev] = nh
        e_group[ev] = g
        e_window[ev] = w
        e_medium[ev] = med
        e_kind[ev] = kind
        e_tokens[ev] = tok
        ev += 1
        nk += nh
    return p, n_ev, nk - k0, OK


@helper_kernel
def _scan_body(
    buf: Any,
    offs: Any,
    first: Any,
    b_ts: Any,
    b_rank: Any,
    b_err: Any,
    b_nev: Any,
    e_type: Any,
    e_nh: Any,
    e_group: Any,
    e_medium: Any,
    e_kind: Any,
    e_window: Any,
    e_tokens: Any,
    e_parent: Any,
    e_has_parent: Any,
    e_origin: Any,
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
                # [ts, events, rank, ...]: the events are scanned in place.
                bpos[0] = p
                bpos[2] = -1
                p, err = _skip(buf, p, end, stack)
                if err == OK:
                    p, n_ev, n_k, err = _events(
                        buf, p, end, stack, fpos, ev0, k0, e_type, e_nh, e_group,
                        e_medium, e_kind, e_window, e_tokens, e_parent, e_has_parent,
                        e_origin, e_bsize, keys, voc_off, voc_len, counts,
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
                    buf, bpos[1], end, stack, fpos, ev0, k0, e_type, e_nh, e_group,
                    e_medium, e_kind, e_window, e_tokens, e_parent, e_has_parent,
                    e_origin, e_bsize, keys, voc_off, voc_len, counts,
                )  # fmt: skip
        else:
            err = ERR_BATCH
        if err == ERR_CAPACITY:
            return i
        if err == OK:
            ts, err = _ts(buf, bpos[0], end, s8, s4, f8, f4)
            b_ts[i] = ts
        if err == OK:
            rank, has, rerr = _opt_int(buf, bpos[2], end)
            if rerr != OK or (has and rank < 0):
                err = ERR_RANK
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
    b_ts: Any,
    b_rank: Any,
    b_err: Any,
    b_nev: Any,
    e_type: Any,
    e_nh: Any,
    e_group: Any,
    e_medium: Any,
    e_kind: Any,
    e_window: Any,
    e_tokens: Any,
    e_parent: Any,
    e_has_parent: Any,
    e_origin: Any,
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

    ``counts`` = (events, keys, vocabulary entries) written so far. ``b_rank``: -1 for
    none (ranks are never negative: a negative one is ``ERR_RANK``). ``e_group``/
    ``e_window``: :data:`NULL` for nil.

    Every array goes to the work as a borrowed view (no reference count): the helpers
    take them at every value, and each pass of a counted array costs two atomic
    operations. Every array outlives the call: the caller holds them all (the scratch
    arrays ``stack`` … ``f4`` too: :func:`_scratch`).
    """
    return _scan_body(
        carray(_voidptr(buf.ctypes.data), buf.shape, np.uint8),
        carray(_voidptr(offs.ctypes.data), offs.shape, np.int64),
        first,
        carray(_voidptr(b_ts.ctypes.data), b_ts.shape, np.float64),
        carray(_voidptr(b_rank.ctypes.data), b_rank.shape, np.int64),
        carray(_voidptr(b_err.ctypes.data), b_err.shape, np.int64),
        carray(_voidptr(b_nev.ctypes.data), b_nev.shape, np.int64),
        carray(_voidptr(e_type.ctypes.data), e_type.shape, np.uint8),
        carray(_voidptr(e_nh.ctypes.data), e_nh.shape, np.int64),
        carray(_voidptr(e_group.ctypes.data), e_group.shape, np.int64),
        carray(_voidptr(e_medium.ctypes.data), e_medium.shape, np.int32),
        carray(_voidptr(e_kind.ctypes.data), e_kind.shape, np.int32),
        carray(_voidptr(e_window.ctypes.data), e_window.shape, np.int64),
        carray(_voidptr(e_tokens.ctypes.data), e_tokens.shape, np.int64),
        carray(_voidptr(e_parent.ctypes.data), e_parent.shape, np.int64),
        carray(_voidptr(e_has_parent.ctypes.data), e_has_parent.shape, np.uint8),
        carray(_voidptr(e_origin.ctypes.data), e_origin.shape, np.int32),
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
