"""Hash and token lists of the msgspec path, parsed from their raw msgpack bytes.

``block_hashes`` and ``token_ids`` stay :class:`msgspec.Raw` in the lean decoder; they are
parsed here with numpy (fixed-size elements -- 9-byte ints, 32-byte hashes -- read by
stride, anything else through msgspec per event): never one Python statement per block
hash in the common case. Without numpy, polars does the same.
"""

from __future__ import annotations

from typing import Any

import msgspec
import polars as pl

try:  # optional: numpy makes the byte-level parsing of hashes and token counts faster
    import numpy as np
except ImportError:  # pragma: no cover - exercised by tests that hide numpy
    np = None  # type: ignore[assignment]

from kvtool import protocol
from kvtool.columns.base import _Ints

# Encodes the block hashes of an event the full decoder had to take (its ints and bytes
# as they came), so that one code path turns every event's hashes into columns.
_RAW_ENC = msgspec.msgpack.Encoder()
_HASH_LIST = msgspec.msgpack.Decoder(list[protocol.Hash])


def _array_header(n: int) -> bytes:
    if n < 16:
        return bytes([0x90 + n])
    if n < 1 << 16:
        return b"\xdc" + n.to_bytes(2, "big")
    return b"\xdd" + n.to_bytes(4, "big")


def token_counts(raws: list[bytes]) -> pl.Series:
    """Return the element count of each msgpack array, read from its header (vectorised).

    Args:
        raws: Encoded msgpack values (``token_ids`` as sent): an array, or nil.

    Returns:
        An Int64 series: the array lengths, 0 for nil or anything that is not an array.
    """
    b = pl.Series("tokens", raws, dtype=pl.Binary)
    h = b.bin.get(0, null_on_oob=True).cast(pl.Int64)
    fix = h - 0x90
    u16 = b.bin.slice(1, 2).bin.reinterpret(dtype=pl.UInt16, endianness="big").cast(pl.Int64)
    u32 = b.bin.slice(1, 4).bin.reinterpret(dtype=pl.UInt32, endianness="big").cast(pl.Int64)
    return (
        pl.select(
            pl.when((h >= 0x90) & (h <= 0x9F))
            .then(fix)
            .when(h == 0xDC)
            .then(u16)
            .when(h == 0xDD)
            .then(u32)
            .otherwise(0)
            .fill_null(0)
        )
        .to_series()
        .rename("tokens")
    )


# -- hashes -------------------------------------------------------------------------------


def _array_headers(big: pl.Series, off: pl.Series, lens: pl.Series) -> pl.DataFrame:
    """Decode the msgpack array header of each value: count ``n`` and header length ``hl``.

    ``big`` holds, per value, the whole joined buffer (one shared view); ``off``/``lens``
    locate each value in it. ``n`` is null when the value is not an array.
    """
    frame = pl.DataFrame({"b": big, "o": off, "L": lens})
    hdr = pl.col("b").bin.slice(pl.col("o"), pl.min_horizontal(pl.col("L"), pl.lit(5)))
    h = hdr.bin.get(0, null_on_oob=True).cast(pl.Int64)
    u16 = hdr.bin.slice(1, 2).bin.reinterpret(dtype=pl.UInt16, endianness="big").cast(pl.Int64)
    u32 = hdr.bin.slice(1, 4).bin.reinterpret(dtype=pl.UInt32, endianness="big").cast(pl.Int64)
    return frame.select(
        "o",
        "L",
        n=pl.when((h >= 0x90) & (h <= 0x9F))
        .then(h - 0x90)
        .when(h == 0xDC)
        .then(u16)
        .when(h == 0xDD)
        .then(u32),
        hl=pl.when(h == 0xDC).then(3).when(h == 0xDD).then(5).otherwise(1),
    )


def _hash_or_none(value: object) -> object:
    """A parent as the table reads it: a hash (int or bytes), else None."""
    return value if isinstance(value, int | bytes) and not isinstance(value, bool) else None


def _int64_or_none(value: object) -> int | None:
    """A ``block_size`` as the table reads it: an int inside int64, else None."""
    if isinstance(value, int) and not isinstance(value, bool) and -(1 << 63) <= value < 1 << 63:
        return value
    return None


def _block_sizes(raws: list[object]) -> _Ints:
    """Each undecoded ``block_size`` as an int (valid: it is an int inside int64).

    Vectorised for positive fixints (what vLLM sends); anything else through msgspec.
    """
    a, off, lens = _np_joined(raws)
    h = a[off]
    ok = (lens == 1) & (h <= 0x7F)
    sizes = np.where(ok, h, 0).astype(np.int64)
    for i in np.flatnonzero(~ok & ~((lens == 1) & (h == 0xC0))).tolist():
        value = _int64_or_none(msgspec.msgpack.decode(raws[i]))  # type: ignore[call-overload]
        if value is not None:
            sizes[i] = value
            ok[i] = True
    return sizes, ok


def _parent_keys(raws: list[object]) -> _Ints:
    """Each undecoded ``parent_block_hash`` as a key, and whether it is a hash at all.

    The key is :func:`protocol.hash_key`'s; nil, or a value of another type: no parent.
    Vectorised for nil, 9-byte ints and 32-byte bytes (what vLLM sends); anything else
    through msgspec, per event.
    """
    a, off, lens = _np_joined(raws)
    h = a[off]
    nine = (lens == 9) & ((h == 0xCF) | (h == 0xD3))
    b32 = (lens == 34) & (h == 0xC4) & (a[off + 1] == 0x20)
    at_every_byte = np.ndarray((len(a) - 8,), dtype=">i8", buffer=a, strides=(1,))
    keys = np.zeros(len(raws), dtype=np.int64)
    keys[nine] = at_every_byte[off[nine] + 1]
    keys[b32] = at_every_byte[off[b32] + 26]
    has = nine | b32
    for i in np.flatnonzero(~has & ~((lens == 1) & (h == 0xC0))).tolist():
        value = _hash_or_none(msgspec.msgpack.decode(raws[i]))  # type: ignore[call-overload]
        if value is not None:
            keys[i] = protocol.hash_key(value)  # type: ignore[arg-type]
            has[i] = True
    return keys, has


def _joined(raws: list[object]) -> tuple[pl.Series, pl.Series, pl.Series]:
    lens = pl.Series(list(map(len, raws)), dtype=pl.Int64)  # type: ignore[arg-type]
    buf = b"".join(raws)  # type: ignore[arg-type]
    big = pl.Series([buf], dtype=pl.Binary).new_from_index(0, len(raws))
    return big, lens.cum_sum() - lens, lens


def _np_headers(a: Any, off: Any) -> tuple[Any, Any]:
    """numpy: msgpack array count (-1: not an array) and header length at each offset."""
    h = a[off]
    n = h.astype(np.int64) - 0x90
    hl = np.ones(len(off), dtype=np.int64)
    other = np.flatnonzero((h & 0xF0) != 0x90)  # not a fixarray (rare: >= 16 elements)
    if len(other):
        h, o = h[other], off[other]
        u16 = (a[o + 1].astype(np.int64) << 8) | a[o + 2]
        u32 = (
            (a[o + 1].astype(np.int64) << 24)
            | (a[o + 2].astype(np.int64) << 16)
            | (a[o + 3].astype(np.int64) << 8)
            | a[o + 4]
        )
        n[other] = np.where(h == 0xDC, u16, np.where(h == 0xDD, u32, -1))
        hl[other] = np.where(h == 0xDC, 3, np.where(h == 0xDD, 5, 1))
    return n, hl


_SPARE = bytes(40)


def _np_joined(raws: list[object]) -> tuple[Any, Any, Any]:
    lens = np.fromiter(map(len, raws), dtype=np.int64, count=len(raws))  # type: ignore[arg-type]
    # Spare bytes: header and element reads near the end stay inside the buffer.
    buf = b"".join([*raws, _SPARE])  # type: ignore[list-item]
    a = np.frombuffer(buf, dtype=np.uint8)
    off = np.cumsum(lens) - lens
    return a, off, lens


def raw_token_counts(raws: list[object]) -> pl.Series:
    """``len(token_ids)`` of each undecoded msgpack ``token_ids`` (0 for nil), vectorised.

    Args:
        raws: :class:`msgspec.Raw` values (or bytes).

    Returns:
        An Int64 series.
    """
    if not raws:
        return pl.Series("tokens", [], dtype=pl.Int64)
    if np is not None:
        a, off, _lens = _np_joined(raws)
        n, _hl = _np_headers(a, off)
        return pl.Series("tokens", np.maximum(n, 0), dtype=pl.Int64)
    big, off, lens = _joined(raws)
    return _array_headers(big, off, lens)["n"].fill_null(0).rename("tokens")


def raw_hashes(raws: list[object]) -> tuple[pl.Series, pl.Series, list[int]]:
    """Decode the undecoded ``block_hashes`` of each event into signed 64-bit keys.

    Vectorised when every element is a 9-byte msgpack integer (``0xcf`` uint64 or
    ``0xd3`` int64: what vLLM and SGLang send for 64-bit hashes) or 32-byte raw bytes
    (``0xc4 0x20``); since each such element has a fixed size, checking the prefix at
    every stride position is an exact parse. Any other event's list is decoded by msgspec
    and mapped with :func:`protocol.hash_key`.

    Args:
        raws: One :class:`msgspec.Raw` per event.

    Returns:
        Hashes per event (Int64), all keys in event order (Int64), and the indices of
        events whose ``block_hashes`` is not a list of hashes (to be skipped).
    """
    n_ev = len(raws)
    if n_ev == 0:
        return pl.Series([], dtype=pl.Int64), pl.Series("hash", [], dtype=pl.Int64), []
    if np is not None:
        n, values, ev_of, fast_ok = _np_hashes(raws)
        total = len(values)
    else:
        n, values, ev_of, fast_ok, total = _pl_hashes(raws)
    slow = fast_ok.not_().arg_true().to_list()
    if not slow:
        return n, values.rename("hash"), []
    return _fix_slow(raws, n, values, ev_of, slow, total)


def _np_same_size_hashes(a: Any, off: Any, lens: Any, n: Any, hl: Any) -> Any:
    """The keys when every list holds hashes of one size (the usual case), else None.

    Each list is its header and then records of 9 bytes (``0xcf``/``0xd3`` + 8) or 34
    (``0xc4 0x20`` + 32); the last 8 bytes of each record are read through an int64 view
    at every byte offset. Every record's prefix is checked, so a list that only has the
    right length is not taken.
    """
    if not len(off) or (n < 0).any():
        return None
    elems = lens - hl
    total = int(n.sum())
    size = 9 if int(elems.sum()) == 9 * total else 34
    if not (elems == size * n).all():
        return None
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    start = np.cumsum(n) - n
    pos = np.repeat(off + hl - size * start, n) + size * np.arange(total, dtype=np.int64)
    p0 = a[pos]
    if size == 9:
        if not ((p0 == 0xCF) | (p0 == 0xD3)).all():
            return None
    elif not ((p0 == 0xC4) & (a[pos + 1] == 0x20)).all():
        return None
    # The joined buffer has spare bytes after the last list: every view stays inside.
    at_every_byte = np.ndarray((len(a) - 8,), dtype=">i8", buffer=a, strides=(1,))
    return at_every_byte[pos + (size - 8)].astype(np.int64)


def _np_hash_arrays(a: Any, off: Any, lens: Any) -> tuple[Any, Any, Any, Any]:
    """numpy: hashes per event, all keys, the event of each key, and which events parsed.

    ``a`` holds the joined raw lists (and spare bytes after them), ``off``/``lens`` place
    each event's in it. An event whose list is not all 9-byte ints or all 32-byte bytes
    is not ``ok``: its count is 0 and it has no keys here (:func:`_fix_slow` decodes it).
    """
    n_ev = len(off)
    n, hl = _np_headers(a, off)
    valid = n >= 0
    nn = np.where(valid, n, 0)
    fast = _np_same_size_hashes(a, off, lens, n, hl)
    if fast is not None:  # every event ok: the event of each key is not needed
        return nn, fast, None, valid
    stride = np.where(lens == hl + 9 * nn, 9, np.where(lens == hl + 34 * nn, 34, 0))
    ok = valid & ((nn == 0) | (stride > 0))
    nn = np.where(ok, nn, 0)
    total = int(nn.sum())
    ev_of = np.repeat(np.arange(n_ev, dtype=np.uint32), nn)
    start = np.cumsum(nn) - nn
    j = np.arange(total, dtype=np.int64) - np.repeat(start, nn)
    st = np.repeat(stride, nn)
    pos = np.repeat(off + hl, nn) + st * j
    p0 = a[pos]
    is9 = st == 9
    el_ok = np.where(is9, (p0 == 0xCF) | (p0 == 0xD3), (p0 == 0xC4) & (a[pos + 1] == 0x20))
    vstart = np.where(is9, pos + 1, pos + 26)
    acc = np.zeros(total, dtype=np.uint64)
    for k in range(8):  # big-endian, one byte column at a time (no (N, 8) temporary)
        acc = (acc << np.uint64(8)) | a[vstart + k]
    values = acc.view(np.int64)
    if not el_ok.all():
        bad_ev = np.unique(ev_of[~el_ok])
        ok[bad_ev] = False
    return np.where(ok, nn, 0), values, ev_of, ok


def _np_hashes(raws: list[object]) -> tuple[pl.Series, pl.Series, pl.Series, pl.Series]:
    n, values, ev_of, ok = _np_hash_arrays(*_np_joined(raws))
    if ev_of is None:
        ev_of = np.repeat(np.arange(len(n), dtype=np.uint32), n)
    return (
        pl.Series(n, dtype=pl.Int64),
        pl.Series("hash", values, dtype=pl.Int64),
        pl.Series(ev_of, dtype=pl.UInt32),
        pl.Series(ok, dtype=pl.Boolean),
    )


def _pl_hashes(raws: list[object]) -> tuple[pl.Series, pl.Series, pl.Series, pl.Series, int]:
    n_ev = len(raws)
    big, off, lens = _joined(raws)
    hd = _array_headers(big, off, lens).with_columns(
        stride=pl.when(pl.col("L") == pl.col("hl") + 9 * pl.col("n"))
        .then(9)
        .when(pl.col("L") == pl.col("hl") + 34 * pl.col("n"))
        .then(34),
    )
    n = hd["n"].fill_null(0)
    total = int(n.sum() or 0)
    fast_ok = (hd["n"].is_not_null() & ((hd["n"] == 0) | hd["stride"].is_not_null())).fill_null(
        False
    )
    if total:
        ev_of = pl.int_range(0, n_ev, eager=True, dtype=pl.UInt32).repeat_by(n).explode()
        ev_of = ev_of.drop_nulls()
        start = n.cum_sum() - n
        j = pl.int_range(0, total, eager=True, dtype=pl.Int64) - start.gather(ev_of)
        el = pl.DataFrame(
            {
                "b": big.gather(ev_of),
                "pos": (hd["o"] + hd["hl"]).gather(ev_of) + hd["stride"].gather(ev_of) * j,
                "stride": hd["stride"].gather(ev_of),
            }
        )
        b = pl.col("b")
        el = el.select(
            ok=pl.when(pl.col("stride") == 9)
            .then(b.bin.slice(pl.col("pos"), 1).is_in([b"\xcf", b"\xd3"]))
            .when(pl.col("stride") == 34)
            .then(b.bin.slice(pl.col("pos"), 2) == b"\xc4\x20")
            .otherwise(False),
            v=pl.when(pl.col("stride") == 9)
            .then(b.bin.slice(pl.col("pos") + 1, 8))
            .otherwise(b.bin.slice(pl.col("pos") + 26, 8))
            .bin.reinterpret(dtype=pl.UInt64, endianness="big")
            .reinterpret(signed=True),
        )
        values = el["v"]
        bad_el = ~el["ok"].fill_null(False)
        if bad_el.any():
            fast_ok = fast_ok & ~pl.Series([False] * n_ev, dtype=pl.Boolean).scatter(
                ev_of.filter(bad_el).unique(), True
            )
    else:
        values = pl.Series("hash", [], dtype=pl.Int64)
        ev_of = pl.Series([], dtype=pl.UInt32)
    return n, values, ev_of, fast_ok, total


def _fix_slow(
    raws: list[object],
    n: pl.Series,
    values: pl.Series,
    ev_of: pl.Series,
    slow: list[int],
    total: int,
) -> tuple[pl.Series, pl.Series, list[int]]:
    n_ev = len(raws)
    # Rare: other encodings (small ints, other byte lengths, mixtures): msgspec decodes them.
    invalid: list[int] = []
    fixed: dict[int, list[int]] = {}
    for i in slow:
        try:
            hs = _HASH_LIST.decode(raws[i])  # type: ignore[arg-type]
        except (msgspec.DecodeError, msgspec.ValidationError):
            invalid.append(i)
            hs = []
        fixed[i] = [protocol.hash_key(h) for h in hs]
    keep = (
        ~pl.Series([False] * n_ev, dtype=pl.Boolean).scatter(slow, True).gather(ev_of)
        if total
        else pl.Series([], dtype=pl.Boolean)
    )
    parts = (
        pl.DataFrame({"e": ev_of, "v": values}).filter(keep)
        if total
        else pl.DataFrame(schema={"e": pl.UInt32, "v": pl.Int64})
    )
    extra = pl.DataFrame(
        {"e": [i for i in slow for _ in fixed[i]], "v": [v for i in slow for v in fixed[i]]},
        schema={"e": pl.UInt32, "v": pl.Int64},
    )
    merged = pl.concat([parts, extra]).sort("e", maintain_order=True)
    n = n.scatter(slow, [len(fixed[i]) for i in slow])
    return n, merged["v"].rename("hash"), invalid


def hash_series(hashes: list[object]) -> pl.Series:
    """Turn a flat list of block hashes into signed 64-bit keys (:func:`protocol.hash_key`).

    Vectorised for the common cases (all unsigned ints, all signed ints, all bytes);
    a mixture goes through :func:`protocol.hash_key` one by one.

    Args:
        hashes: Ints (unsigned 64-bit or signed) or bytes.

    Returns:
        An Int64 series.
    """
    if not hashes:
        return pl.Series("hash", [], dtype=pl.Int64)
    for dtype in (pl.UInt64, pl.Int64):
        try:
            s = pl.Series("hash", hashes, dtype=dtype, strict=True)
        except (TypeError, OverflowError, pl.exceptions.PolarsError, ValueError):
            continue
        return s.reinterpret(signed=True) if dtype == pl.UInt64 else s
    try:
        b = pl.Series("hash", hashes, dtype=pl.Binary, strict=True)
    except (TypeError, pl.exceptions.PolarsError, ValueError):
        pass
    else:
        # vLLM's conversion: the last 8 bytes, big-endian; shorter hashes left-padded.
        sizes = b.bin.size()
        lo, hi = sizes.min(), sizes.max()
        if isinstance(lo, int) and lo == hi and lo >= 8:
            return (
                b.bin.slice(-8)
                .bin.reinterpret(dtype=pl.UInt64, endianness="big")
                .reinterpret(signed=True)
                .rename("hash")
            )
    return pl.Series("hash", [protocol.hash_key(h) for h in hashes], dtype=pl.Int64)  # type: ignore[arg-type]


def _hash_columns(raws: list[object]) -> tuple[Any, Any, list[int]]:
    """:func:`raw_hashes` as numpy arrays: hashes per event, all keys, invalid events."""
    if not raws:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), []
    n, values, ev_of, ok = _np_hash_arrays(*_np_joined(raws))
    if ok.all():
        return n, values, []
    slow = np.flatnonzero(~ok).tolist()
    n_s, v_s, invalid = _fix_slow(
        raws,
        pl.Series(n, dtype=pl.Int64),
        pl.Series("hash", values, dtype=pl.Int64),
        pl.Series(ev_of, dtype=pl.UInt32),
        slow,
        len(values),
    )
    return n_s.to_numpy(), v_s.to_numpy(), invalid
