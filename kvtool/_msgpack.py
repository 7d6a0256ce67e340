"""msgpack primitives for the numba kernels: value headers, iterative skipping, error codes.

Every read is bounds-checked against the value's end (``end``, the payload's); skipping
is iterative, with an explicit depth limit (:data:`MAX_DEPTH`). Used by the columnar
decoder, :mod:`kvtool.scan`.
"""

# ruff: noqa: SIM109, SIM110  (numba: no tuple membership or generators in the kernels)

from __future__ import annotations

from typing import Any

import numpy as np

from kvtool._jit import helper_kernel

# -- error codes (0: decoded) ------------------------------------------------------------

OK = 0
ERR_TRUNCATED = 1
"""A value runs past the payload's end."""
ERR_INVALID = 2
"""A byte that starts no msgpack value (``0xc1``)."""
ERR_DEPTH = 3
"""Nesting deeper than :data:`MAX_DEPTH`."""
ERR_BATCH = 4
"""The payload is not a batch (not an array/map, too short, no ``ts``/``events``)."""
ERR_TRAILING = 5
"""Bytes after the batch."""
ERR_TS = 6
"""``ts`` is not a float (or an int exactly representable as one)."""
ERR_RANK = 7
"""``data_parallel_rank`` is not nil or an int64."""
ERR_EVENTS = 8
"""``events`` is not an array, or an event is neither a map nor an array."""
ERR_MIXED = 9
"""Map and array events in one batch."""
ERR_TAG = 10
"""An event without a known type tag (unknown, missing, not a string)."""
ERR_KEY = 11
"""A map key that is not an ASCII string, or a known key twice."""
ERR_HASHES = 12
"""``block_hashes`` is not a list of ints and bytes."""
ERR_FIELD = 13
"""A field of the wrong type (medium/kind not nil or ASCII str, group/window not int)."""
ERR_RANGE = 14
"""An int outside int64 where the table keeps one."""
ERR_VOCAB = 15
"""More distinct strings in the chunk than :data:`MAX_VOCAB`."""
ERR_CAPACITY = 16
"""Internal: the output columns are full (the caller grows them and resumes)."""

ERROR_NAMES = {
    ERR_TRUNCATED: "truncated",
    ERR_INVALID: "invalid byte",
    ERR_DEPTH: "nested too deeply",
    ERR_BATCH: "not a batch",
    ERR_TRAILING: "trailing bytes",
    ERR_TS: "bad ts",
    ERR_RANK: "bad data_parallel_rank",
    ERR_EVENTS: "bad events",
    ERR_MIXED: "mixed event encodings",
    ERR_TAG: "unknown event type",
    ERR_KEY: "bad map key",
    ERR_HASHES: "block_hashes not a list of hashes",
    ERR_FIELD: "field of the wrong type",
    ERR_RANGE: "int out of range",
    ERR_VOCAB: "too many distinct strings",
}

MAX_DEPTH = 64
"""Deepest nesting the scanner skips; deeper values go to msgspec."""

# -- value classes of _head ---------------------------------------------------------------

_NIL, _BOOL, _INT, _UINT, _FLOAT, _STR, _BIN, _ARRAY, _MAP, _EXT = range(10)
_ERR = -1

# -- kernels ---------------------------------------------------------------------------------


def _define_borrow() -> Any:
    """An intrinsic: a view of an array without its reference count (see :func:`_scan`)."""
    from numba import types
    from numba.core import cgutils
    from numba.extending import intrinsic

    @intrinsic
    def _voidptr(typingctx: Any, addr: Any) -> Any:
        def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            return builder.inttoptr(args[0], cgutils.voidptr_t)

        return types.voidptr(addr), codegen

    return _voidptr


_voidptr = _define_borrow()


@helper_kernel
def _be(buf: Any, pos: Any, n: Any) -> Any:
    """Big-endian unsigned int of ``n`` bytes at ``pos``, as int64 bits (caller checks bounds)."""
    v: Any = np.int64(0)
    for k in range(n):
        v = (v << np.int64(8)) | np.int64(buf[pos + k])
    return v


@helper_kernel
def _head(buf: Any, pos: Any, end: Any) -> Any:
    """Read a value's header at ``pos``: (class, n, position after the header).

    ``n`` is the value of an int (``_UINT``: an unsigned one above int64, as its bits),
    the length of a str/bin/ext's data or of a float (4/8), the item count of an array,
    the pair count of a map. Class ``_ERR`` with n = an error code when the header (or a
    str/bin/ext's data) runs past ``end`` or the byte is invalid.
    """
    if pos >= end:
        return _ERR, ERR_TRUNCATED, pos
    b: Any = np.int64(buf[pos])
    p: Any = pos + 1
    if b <= 0x7F:
        return _INT, b, p
    if b >= 0xE0:
        return _INT, b - 256, p
    if b <= 0x8F:
        return _MAP, b & 0x0F, p
    if b <= 0x9F:
        return _ARRAY, b & 0x0F, p
    if b <= 0xBF:
        n = b & 0x1F
        if p + n > end:
            return _ERR, ERR_TRUNCATED, p
        return _STR, n, p
    if b == 0xC0:
        return _NIL, 0, p
    if b == 0xC1:
        return _ERR, ERR_INVALID, p
    if b == 0xC2 or b == 0xC3:
        return _BOOL, b - 0xC2, p
    # every other header has a fixed-size part after the first byte
    if b <= 0xC6:  # bin 8/16/32
        w = 1 << (b - 0xC4)
        if p + w > end:
            return _ERR, ERR_TRUNCATED, p
        n = _be(buf, p, w)
        p += w
        if n > end - p:
            return _ERR, ERR_TRUNCATED, p
        return _BIN, n, p
    if b <= 0xC9:  # ext 8/16/32: length, type byte, data
        w = 1 << (b - 0xC7)
        if p + w + 1 > end:
            return _ERR, ERR_TRUNCATED, p
        n = _be(buf, p, w)
        p += w + 1
        if n > end - p:
            return _ERR, ERR_TRUNCATED, p
        return _EXT, n, p
    if b <= 0xCB:  # float 32/64
        w = 4 if b == 0xCA else 8
        if p + w > end:
            return _ERR, ERR_TRUNCATED, p
        return _FLOAT, w, p
    if b <= 0xCF:  # uint 8..64
        w = 1 << (b - 0xCC)
        if p + w > end:
            return _ERR, ERR_TRUNCATED, p
        v = _be(buf, p, w)
        if w == 8 and v < 0:
            return _UINT, v, p + w
        return _INT, v, p + w
    if b <= 0xD3:  # int 8..64
        w = 1 << (b - 0xD0)
        if p + w > end:
            return _ERR, ERR_TRUNCATED, p
        v = _be(buf, p, w)
        if w < 8:
            sign = np.int64(1) << np.int64(8 * w - 1)
            if v >= sign:
                v -= sign << np.int64(1)
        return _INT, v, p + w
    if b <= 0xD8:  # fixext 1..16: type byte + data
        n = 1 << (b - 0xD4)
        if p + 1 + n > end:
            return _ERR, ERR_TRUNCATED, p
        return _EXT, n, p + 1
    if b <= 0xDB:  # str 8/16/32
        w = 1 << (b - 0xD9)
        if p + w > end:
            return _ERR, ERR_TRUNCATED, p
        n = _be(buf, p, w)
        p += w
        if n > end - p:
            return _ERR, ERR_TRUNCATED, p
        return _STR, n, p
    # 0xdc..0xdf: array 16/32, map 16/32
    w = 2 if (b == 0xDC or b == 0xDE) else 4
    if p + w > end:
        return _ERR, ERR_TRUNCATED, p
    n = _be(buf, p, w)
    return (_ARRAY if b <= 0xDD else _MAP), n, p + w


_SCALAR = np.zeros(256, dtype=np.int64)
"""Whole size of a scalar value by its first byte (0: a container, str/bin/ext, or invalid)."""
_SCALAR[0x00:0x80] = 1
_SCALAR[0xE0:0x100] = 1
_SCALAR[0xC0] = _SCALAR[0xC2] = _SCALAR[0xC3] = 1
for _b, _n in ((0xCA, 5), (0xCB, 9), (0xCC, 2), (0xCD, 3), (0xCE, 5), (0xCF, 9)):
    _SCALAR[_b] = _n
for _b, _n in ((0xD0, 2), (0xD1, 3), (0xD2, 5), (0xD3, 9), (0xD4, 3), (0xD5, 4), (0xD6, 6)):
    _SCALAR[_b] = _n
_SCALAR[0xD7], _SCALAR[0xD8] = 10, 18
_SCALAR[0xA0:0xC0] = np.arange(1, 33)  # fixstr: header + data


@helper_kernel
def _quick(buf: Any, pos: Any, end: Any) -> Any:
    """The end of a scalar or fixstr at ``pos`` (-1: anything else, or past ``end``).

    Small enough to be inlined: the hot loops take the common values without a call.
    """
    if pos >= end:
        return -1
    q = pos + _SCALAR[buf[pos]]
    if q == pos or q > end:
        return -1
    return q


@helper_kernel
def _skip(buf: Any, pos: Any, end: Any, stack: Any) -> Any:
    """Skip one whole value at ``pos``: (position after it, error code), iteratively.

    ``stack`` holds the items still to skip at each open level (at most ``len(stack)``).
    """
    depth = 0
    stack[0] = 1
    while True:
        left = stack[depth]
        # A run of scalars at this level (token ids, hashes) in a register, no call.
        while left > 0:
            q = _quick(buf, pos, end)
            if q < 0:
                break
            pos = q
            left -= 1
        if left == 0:
            if depth == 0:
                return pos, OK
            depth -= 1
            continue
        stack[depth] = left - 1
        cls, n, p = _head(buf, pos, end)
        if cls == _ERR:
            return p, n
        if cls == _STR or cls == _BIN or cls == _EXT or cls == _FLOAT:
            pos = p + n
        elif cls == _ARRAY or cls == _MAP:
            pos = p
            items = n if cls == _ARRAY else 2 * n
            if items > end - pos:  # every item is at least one byte
                return pos, ERR_TRUNCATED
            if items:
                depth += 1
                if depth >= len(stack):
                    return pos, ERR_DEPTH
                stack[depth] = items
        else:
            pos = p


@helper_kernel
def _same(buf: Any, at: Any, n: Any, names: Any, lo: Any, hi: Any) -> Any:
    """Whether ``buf[at:at+n]`` equals ``names[lo:hi]``."""
    if hi - lo != n:
        return False
    for k in range(n):
        if buf[at + k] != names[lo + k]:
            return False
    return True


@helper_kernel
def _ascii(buf: Any, at: Any, n: Any) -> Any:
    for k in range(n):
        if buf[at + k] >= 0x80:
            return False
    return True


__all__ = [
    "ERROR_NAMES",
    "ERR_BATCH",
    "ERR_CAPACITY",
    "ERR_DEPTH",
    "ERR_EVENTS",
    "ERR_FIELD",
    "ERR_HASHES",
    "ERR_INVALID",
    "ERR_KEY",
    "ERR_MIXED",
    "ERR_RANGE",
    "ERR_RANK",
    "ERR_TAG",
    "ERR_TRAILING",
    "ERR_TRUNCATED",
    "ERR_TS",
    "ERR_VOCAB",
    "MAX_DEPTH",
    "OK",
]
