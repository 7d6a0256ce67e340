"""What-if's lean decoding: only the fields the replay needs, hashes parsed in numba.

A :class:`kvtool.protocol.BatchProjection` of three lean event structs that share their
attribute names (so a batch's columns are taken with one comprehension per field): the
hash and token lists stay :class:`msgspec.Raw` and :func:`parse_ints` reads them from
the joined bytes (msgpack ints and bins; a bytes hash maps to its last 8 bytes
big-endian, as :func:`kvtool.protocol.hash_key`); a token list is counted from its
header. A payload the projection refuses goes through :func:`kvtool.protocol.decode_batch`.
"""

from __future__ import annotations

from typing import ClassVar

import msgspec
import numpy as np
import numpy.typing as npt

from kvtool import protocol
from kvtool._jit import kernel

I64 = npt.NDArray[np.int64]
U8 = npt.NDArray[np.uint8]

_EMPTY = msgspec.Raw(b"\x90")
_ENC = msgspec.msgpack.Encoder()

CODE_STORE, CODE_REMOVE, CODE_CLEAR = 0, 1, 2


class _Stored(msgspec.Struct, tag_field="type", tag="BlockStored", gc=False):
    block_hashes: msgspec.Raw = _EMPTY
    parent_block_hash: int | bytes | None = None
    token_ids: msgspec.Raw = _EMPTY
    block_size: int | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None


class _Absent(msgspec.Struct, gc=False):
    """Class-level values of the attributes an event type does not carry (not fields)."""

    parent_block_hash: ClassVar[None] = None
    token_ids: ClassVar[msgspec.Raw] = _EMPTY
    block_size: ClassVar[None] = None
    kv_cache_spec_kind: ClassVar[None] = None
    kv_cache_spec_sliding_window: ClassVar[None] = None


class _Removed(_Absent, tag_field="type", tag="BlockRemoved", gc=False):
    block_hashes: msgspec.Raw = _EMPTY
    group_idx: int | None = None


class _Cleared(_Absent, tag_field="type", tag="AllBlocksCleared", gc=False):
    block_hashes: ClassVar[msgspec.Raw] = _EMPTY
    group_idx: ClassVar[None] = None


class _StoredArray(msgspec.Struct, array_like=True, tag_field="type", tag="BlockStored", gc=False):
    block_hashes: msgspec.Raw = _EMPTY
    parent_block_hash: int | bytes | None = None
    token_ids: msgspec.Raw = _EMPTY
    block_size: int | None = None
    lora_id: msgspec.Raw = _EMPTY
    medium: msgspec.Raw = _EMPTY
    lora_name: msgspec.Raw = _EMPTY
    extra_keys: msgspec.Raw = _EMPTY
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None


class _RemovedArray(_Absent, array_like=True, tag_field="type", tag="BlockRemoved", gc=False):
    block_hashes: msgspec.Raw = _EMPTY
    medium: msgspec.Raw = _EMPTY
    group_idx: int | None = None


class _ClearedArray(_Absent, array_like=True, tag_field="type", tag="AllBlocksCleared", gc=False):
    block_hashes: ClassVar[msgspec.Raw] = _EMPTY
    group_idx: ClassVar[None] = None


CODES: dict[type, int] = {
    _Stored: CODE_STORE,
    _StoredArray: CODE_STORE,
    _Removed: CODE_REMOVE,
    _RemovedArray: CODE_REMOVE,
    _Cleared: CODE_CLEAR,
    _ClearedArray: CODE_CLEAR,
}
"""Event struct → event code (``CODE_*``)."""
EMPTY = _EMPTY
"""The raw empty list: the hash or token list of an event that has none."""


_LEAN = protocol.BatchProjection(
    "whatif", _Stored | _Removed | _Cleared, _StoredArray | _RemovedArray | _ClearedArray, gc=False
)


def restart() -> object:
    """Return an event that clears the pool (put where the publisher restarted)."""
    return _Cleared()


def decode(raw: bytes, seq: int) -> tuple[object, list[object]]:
    """Decode one payload into (batch rank, lean events).

    Args:
        raw: The payload.
        seq: Its seq, for errors.

    Returns:
        The batch's ``data_parallel_rank`` and events with the attributes of ``_Stored``.

    Raises:
        ProtocolError: The payload is not a batch.
    """
    hit = _LEAN.decode(raw)
    if hit is not None:
        b = hit[0]
        return b.data_parallel_rank, b.events
    full = protocol.decode_batch(raw, seq=seq)
    out: list[object] = []
    for ev in full.events:
        if isinstance(ev, protocol.BlockStored):
            par = ev.parent_block_hash
            bs = ev.block_size
            out.append(
                _Stored(
                    block_hashes=msgspec.Raw(_ENC.encode(list(ev.block_hashes))),
                    # A hash: an int or bytes (not a bool), as the report's table reads it.
                    parent_block_hash=(
                        par if isinstance(par, int | bytes) and not isinstance(par, bool) else None
                    ),
                    token_ids=msgspec.Raw(_ENC.encode([0] * len(ev.token_ids))),
                    block_size=bs if isinstance(bs, int) and not isinstance(bs, bool) else None,
                    group_idx=ev.group_idx,
                    kv_cache_spec_kind=ev.kv_cache_spec_kind,
                    kv_cache_spec_sliding_window=ev.kv_cache_spec_sliding_window,
                )
            )
        elif isinstance(ev, protocol.BlockRemoved):
            out.append(
                _Removed(
                    block_hashes=msgspec.Raw(_ENC.encode(list(ev.block_hashes))),
                    group_idx=ev.group_idx,
                )
            )
        else:
            out.append(_Cleared())
    return full.data_parallel_rank, out


@kernel
def _header(buf: U8, p: int) -> tuple[int, int]:
    """Return (elements, header bytes) of the msgpack array at ``p``, or (-1, 0)."""
    if p < 0 or p >= buf.shape[0]:
        return -1, 0
    b = buf[p]
    if b & 0xF0 == 0x90:
        return b & 0x0F, 1
    if b == 0xDC:
        if p + 3 > buf.shape[0]:
            return -1, 0
        return (buf[p + 1] << 8) | buf[p + 2], 3
    if b == 0xDD:
        if p + 5 > buf.shape[0]:
            return -1, 0
        return (buf[p + 1] << 24) | (buf[p + 2] << 16) | (buf[p + 3] << 8) | buf[p + 4], 5
    if b == 0xC0:  # nil: no hashes
        return 0, 1
    return -1, 0


@kernel
def _be(buf: U8, p: int, n: int) -> int:
    v = 0
    for i in range(n):
        v = (v << 8) | buf[p + i]
    return v


@kernel
def count_arrays(buf: U8, starts: I64) -> I64:
    """Return the element count of each msgpack array (``-1`` when not an array).

    Args:
        buf: The joined raw lists.
        starts: Where each list begins.

    Returns:
        One count per list.
    """
    out = np.empty(starts.shape[0], np.int64)
    for i in range(starts.shape[0]):
        out[i] = _header(buf, starts[i])[0]
    return out


@kernel
def parse_ints(buf: U8, starts: I64, counts: I64) -> tuple[I64, bool]:
    """Read every element of the msgpack int/bin arrays as a signed 64-bit key.

    Args:
        buf: The joined raw lists.
        starts: Where each list begins.
        counts: Their element counts (:func:`count_arrays`).

    Returns:
        The keys in order, and whether every element was an int or a bin. At the first
        element that is neither, or that would run past the buffer, it stops with False
        (the caller decodes those lists with msgspec): it never reads outside ``buf``.
    """
    total = 0
    for i in range(counts.shape[0]):
        total += max(counts[i], 0)
    out = np.zeros(total, np.int64)
    o = 0
    size = buf.shape[0]
    for i in range(starts.shape[0]):
        n, h = _header(buf, starts[i])
        p = starts[i] + h
        for _ in range(max(n, 0)):
            if p >= size:
                return out, False
            b = buf[p]
            # Bytes this element needs after its type byte (ints) or before its data (bins).
            need = 0
            if b == 0xCC or b == 0xD0 or b == 0xC4:
                need = 1
            elif b == 0xCD or b == 0xD1 or b == 0xC5:
                need = 2
            elif b == 0xCE or b == 0xD2 or b == 0xC6:
                need = 4
            elif b == 0xCF or b == 0xD3:
                need = 8
            if p + 1 + need > size:
                return out, False
            is_bin = b == 0xC4 or b == 0xC5 or b == 0xC6
            if is_bin and p + 1 + need + _be(buf, p + 1, need) > size:
                return out, False
            v = 0
            if b <= 0x7F:
                v = int(b)
                p += 1
            elif b >= 0xE0:
                v = int(b) - 256
                p += 1
            elif b == 0xCC or b == 0xD0:
                v = _be(buf, p + 1, 1)
                if b == 0xD0 and v >= 128:
                    v -= 256
                p += 2
            elif b == 0xCD or b == 0xD1:
                v = _be(buf, p + 1, 2)
                if b == 0xD1 and v >= 32768:
                    v -= 65536
                p += 3
            elif b == 0xCE or b == 0xD2:
                v = _be(buf, p + 1, 4)
                if b == 0xD2 and v >= 2147483648:
                    v -= 4294967296
                p += 5
            elif b == 0xCF or b == 0xD3:
                u = np.uint64(0)
                for j in range(8):
                    u = (u << np.uint64(8)) | np.uint64(buf[p + 1 + j])
                v = int(np.int64(u))  # wraps into the signed range, as hash_key
                p += 9
            elif b == 0xC4 or b == 0xC5 or b == 0xC6:
                w = 1 if b == 0xC4 else 2 if b == 0xC5 else 4
                ln = _be(buf, p + 1, w)
                q = p + 1 + w
                u = np.uint64(0)
                for j in range(max(ln - 8, 0), ln):
                    u = (u << np.uint64(8)) | np.uint64(buf[q + j])
                v = int(np.int64(u))
                p = q + ln
            else:
                return out, False  # not an int or a bin: msgspec decides what it is
            out[o] = v
            o += 1
    return out, True


__all__ = [
    "CODES",
    "CODE_CLEAR",
    "CODE_REMOVE",
    "CODE_STORE",
    "EMPTY",
    "count_arrays",
    "decode",
    "parse_ints",
]
