"""The one flat columnar table of a recording: one row per block event, built chunk by chunk.

A chunk is decoded by the numba scanner (:mod:`kvtool.scan`) straight into columns; a
payload it refuses (an error code) takes the msgspec path below, which stays the
reference (``decode_chunk(raw, decoder="msgspec")`` or ``KVTOOL_DECODER=msgspec`` take it
alone): both give the same rows and findings (tests/test_scan.py).

The msgspec path:
Payloads are decoded with a lean msgspec decoder that keeps only the fields the table
needs: ``block_hashes`` and ``token_ids`` stay :class:`msgspec.Raw` (no Python int per
hash or token), fields the table does not use are skipped, known media and kinds come
back as shared strings. A chunk is decoded in blocks of :data:`_BLOCK` payloads (one
msgspec call mapped over each), and each block's events are taken apart into columns
right away, while they are in the CPU cache: one C-level pass per field, and the raw
msgpack of the block's hash and token lists parsed with numpy (fixed-size elements --
9-byte ints, 32-byte hashes -- read by stride, anything else through msgspec per event):
never one Python statement per block hash in the common case. Rows are then built from
the columns with numpy. A batch the lean decoder refuses goes through
:func:`kvtool.protocol.decode_batch`, the one decoder that defines what a payload means
(unknown event types and malformed events are skipped and counted there), so both paths
give the same rows for every layout in PROTOCOL.md (tests compare them on every
capture). The lean path validates only the fields the table uses.

Memory: a chunk holds about :data:`DEFAULT_CHUNK_BYTES` of payload and its table;
:func:`prefetch` reads the next chunk in a thread while the current one is processed.
Reading (:func:`iter_raw_chunks`: recordings to undecoded, picklable :class:`RawChunk`)
and decoding (:func:`decode_chunk`) are separate steps, so decoding can run in worker
processes or on a Ray cluster (``report --jobs/--ray``) and come back in stream order.

Rows (see :data:`TABLE_SCHEMA`): one per hash of a ``BlockStored`` or ``BlockRemoved``,
one per ``AllBlocksCleared``, and one (with a null ``hash``) per ``BlockStored`` with
zero hashes, so that such a store still counts as a store event and its tokens.
``tokens`` holds the event's ``len(token_ids)`` on its first row (``block_index`` 0)
and 0 on the others, so summing it counts every token once.

Annotation (:class:`TableAnnotator`, :func:`annotate_table`) is the columnar adapter of
:mod:`kvtool.annotate`: the annotation of the whole input is resolved first
(:func:`kvtool.inputs.resolve_annotation`: metadata sources by precedence, else what
annotated stores say per (channel, data-parallel rank, group_idx)), then applied to each
chunk independently, so the answer does not depend on chunk order.
"""

from __future__ import annotations

import bisect
import contextlib
import io
import itertools
import os
import queue
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from itertools import chain, compress
from operator import attrgetter
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import msgspec
import polars as pl

try:  # optional: numpy makes the byte-level parsing of hashes and token counts faster
    import numpy as np
except ImportError:  # pragma: no cover - exercised by tests that hide numpy
    np = None  # type: ignore[assignment]

from kvtool import projections, protocol
from kvtool.annotate import KINDS, Annotation, GroupLearner, GroupTable, KindWindow
from kvtool.errors import KvtoolError, ProtocolError
from kvtool.inputs import MergeFindings, merge_messages, resolve_annotation
from kvtool.recording import ChannelInfo, RecordedMessage, open_recording
from kvtool.text import printable

if TYPE_CHECKING:
    from kvtool.replay import BatchFilter

Progress = Callable[[int, int], None]
"""A progress hook: ``(bytes done, bytes total)`` of the input files."""

STORED, REMOVED, CLEARED = 0, 1, 2
"""Codes of the ``type_code`` column."""

EVENT_TYPE_NAMES = ("BlockStored", "BlockRemoved", "AllBlocksCleared")
EVENT_TYPE = pl.Enum(list(EVENT_TYPE_NAMES))

UNANNOTATED = "unannotated"
"""Kind label of rows no metadata or annotated store gives a kind (not vLLM's ``unknown``)."""
UNATTRIBUTED = "unattributed"
"""Kind label of removes without ``group_idx`` whose hash is not live in exactly one group."""

TABLE_SCHEMA: dict[str, pl.DataType] = {
    "log_time": pl.Int64(),
    "ts": pl.Float64(),
    "seq": pl.Int64(),
    "recording": pl.String(),
    "channel": pl.String(),
    "channel_id": pl.UInt32(),
    "dp_rank": pl.Int64(),
    "type": EVENT_TYPE,
    "group_idx": pl.Int64(),
    "kind": pl.String(),
    "sliding_window": pl.Int64(),
    "hash": pl.Int64(),
    "tokens": pl.Int64(),
    "medium": pl.String(),
    "event_index": pl.Int64(),
    "block_index": pl.Int32(),
    "block_count": pl.Int32(),
    "payload_rank": pl.Int64(),
}
"""The flat table. ``event_index`` numbers events across the whole read (all files);
``block_index``/``block_count`` place the row inside its event; ``channel_id`` numbers
the publisher streams (endpoint, topic, rank) of one read, a stream held by several
files being one channel (``recording`` names the first input that holds it);
``kind``/``sliding_window`` are the wire values until :class:`TableAnnotator` sets them.
``dp_rank`` is the channel's data-parallel rank (its endpoint's: what every command takes;
the payload's only on a channel without one), ``payload_rank`` the rank the payload names
where it differs from that (null elsewhere; issue 24)."""

EXTRA_SCHEMA: dict[str, pl.DataType] = {
    "parent": pl.Int64(),
    "origin": pl.Int8(),
    "block_size": pl.Int64(),
}
"""Columns of the unlabelled table beside :data:`TABLE_SCHEMA` (the report's kernel reads
them, issue 21; a labelled table -- what ``export`` writes -- leaves them out): per row, its
event's ``parent_block_hash`` as a key (null: no parent, or one that is not a hash) and its
``origin`` (vllm-project/vllm#51699) as a code (:data:`ORIGIN_CODES`; 0: none or another
value). ``block_size`` (a store's, when it is an int64; else null) is made only when a
reader names it (not for ``keep=None``)."""

ORIGIN_CODES = {"NEW": 1, "REUSED": 2}
"""``origin`` values and their codes in the ``origin`` column."""

T = TypeVar("T")

_LABELS = ("recording", "channel", "type")

DEFAULT_CHUNK_BYTES = 16 << 20
"""Payload bytes decoded into one table chunk."""


# -- the lean decoder ------------------------------------------------------------------------

# The lean projection (kvtool.schema's "lean" fields; kvtool.projections makes the structs):
# block_hashes and token_ids stay Raw, and fields the table does not use are skipped.
# Every struct answers every lean field (a field its type lacks is a class attribute)
# and carries type_code (STORED, REMOVED, CLEARED).
_LEAN_STRUCTS = projections.build(
    projections.LEAN,
    module=__name__,
    names=("_Stored", "_Removed", "_Cleared"),
    array_names=("_StoredArrayLayout", "_RemovedArrayLayout", "_ClearedArrayLayout"),
)
_Stored, _Removed, _Cleared = _LEAN_STRUCTS.map
# Array-encoded events (vLLM <= 0.23): every position up to the last lean field.
_StoredArrayLayout, _RemovedArrayLayout, _ClearedArrayLayout = _LEAN_STRUCTS.array

_LEAN = protocol.BatchProjection(
    "lean", _LEAN_STRUCTS.map_union, _LEAN_STRUCTS.array_union, gc=False
)

# The media and kinds vLLM sends (PROTOCOL.md, annotate.KINDS). Decoded as literals they
# are shared strings, not one new string per event: decoding, reading and freeing them
# costs less. A value outside these fails the block, which the str decoder then takes.
_Medium = Literal["GPU", "CPU", "STORAGE", "FS", "OBJ", "CPU_TIER1", "CPU_PINNED", "cpu"]
if TYPE_CHECKING:
    _Kind = str
else:
    _Kind = Literal[KINDS]  # the one list of kinds (annotate.KINDS)

_VOCAB_STRUCTS = projections.build(
    projections.LEAN,
    module=__name__,
    names=("_VocabStored", "_VocabRemoved", "_VocabCleared"),
    overrides={"medium": (_Medium | None, None), "kv_cache_spec_kind": (_Kind | None, None)},
)
_VocabStored, _VocabRemoved, _VocabCleared = _VOCAB_STRUCTS.map
# Array-encoded events have no vocabulary decoder: they read as lean.
_VOCAB = protocol.BatchProjection(
    "vocab", _VOCAB_STRUCTS.map_union, _LEAN_STRUCTS.array_union, gc=False
)
_VOCAB_BACKOFF = 64
"""Blocks decoded with the str decoder alone after the vocabulary decoder failed one."""


class LeanBatch(msgspec.Struct):
    """One payload decoded for the table.

    Attributes:
        ts: The batch timestamp (publisher clock, float seconds).
        events: Events with ``block_hashes``, ``token_ids``, ``medium``, ``group_idx``,
            ``kv_cache_spec_kind`` and ``kv_cache_spec_sliding_window`` attributes.
        data_parallel_rank: The rank the batch names.
        skipped: Messages of events the decoder had to skip.
        unknown_tags: The tag of each skipped event of an unknown type (issue 21).
    """

    ts: float
    events: list[object]
    data_parallel_rank: int | None = None
    skipped: tuple[str, ...] = ()
    unknown_tags: tuple[str, ...] = ()


def decode_lean(raw: bytes | memoryview, *, seq: int | None = None) -> LeanBatch:
    """Decode one payload keeping only what the flat table needs.

    Tries the lean projection (``protocol.BatchProjection``); any payload it refuses
    goes through :func:`kvtool.protocol.decode_batch`, which skips (and names) bad events.

    Args:
        raw: The payload.
        seq: Its seq, for error messages.

    Returns:
        The batch.

    Raises:
        ProtocolError: The payload is not a batch at all.
    """
    hit = _LEAN.decode(raw)
    if hit is not None:
        b = hit[0]
        return LeanBatch(b.ts, b.events, b.data_parallel_rank)
    try:
        full = protocol.decode_batch(raw, seq=seq)
    except RecursionError as err:
        where = f"seq {seq}: " if seq is not None else ""
        raise ProtocolError(f"{where}malformed payload: nested too deeply", seq=seq) from err
    return LeanBatch(
        full.ts,
        [_lean_event(e) for e in full.events],
        full.data_parallel_rank,
        full.skipped,
        full.unknown_tags,
    )


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


def _lean_event(e: protocol.Event) -> object:
    """Convert an event of the full decoder into its lean form (token_ids: a header)."""
    if isinstance(e, protocol.BlockStored):
        return _Stored(
            block_hashes=msgspec.Raw(_RAW_ENC.encode(e.block_hashes)),
            token_ids=msgspec.Raw(_array_header(len(e.token_ids))),
            medium=e.medium,
            group_idx=e.group_idx,
            kv_cache_spec_kind=e.kv_cache_spec_kind,
            kv_cache_spec_sliding_window=e.kv_cache_spec_sliding_window,
            parent_block_hash=msgspec.Raw(_RAW_ENC.encode(_hash_or_none(e.parent_block_hash))),
            block_size=msgspec.Raw(_RAW_ENC.encode(_int64_or_none(e.block_size))),
        )
    if isinstance(e, protocol.BlockRemoved):
        return _Removed(
            block_hashes=msgspec.Raw(_RAW_ENC.encode(e.block_hashes)),
            medium=e.medium,
            group_idx=e.group_idx,
        )
    return _Cleared()


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


# -- reading recordings --------------------------------------------------------------------


@dataclass
class ChannelRef:
    """One publisher stream (endpoint, topic, rank) of a read, numbered across files.

    Attributes:
        id: The ``channel_id`` of its rows.
        recording: The path of the first input that holds the stream.
        info: The channel as the recording names it.
    """

    id: int
    recording: str
    info: ChannelInfo


MergeKey = tuple[int, str, str, int]
"""THE merge order's key of a message: (receive time, endpoint, topic, seq), as
:mod:`kvtool.inputs` orders messages across recordings."""

NO_KEY: MergeKey = (1 << 63, "", "", 0)
"""After every message's key."""

MAX_PROBLEMS = 20
"""Problem messages a read keeps (the counts cover all of them)."""


@dataclass
class ReadStats:
    """What a read decoded and what it had to skip.

    Attributes:
        recordings: Paths read.
        messages: Messages (batches) read.
        events: Events decoded.
        rows: Table rows built.
        payload_bytes: Payload bytes read.
        bad_batches: Payloads that were not a batch at all (skipped).
        skipped_events: Events skipped by the decoder.
        unknown_tags: Of those, the events of an unknown type, by tag (as sent, at most
            :data:`kvtool.protocol.MAX_UNKNOWN_TAGS` tags by name; issue 21).
        problems: Messages naming skipped batches/events: those about the earliest
            messages (:meth:`note`), the earliest first.
        problem_keys: The key of each problem's message (:data:`MergeKey`).
        damaged: One line per recording that was truncated or damaged.
        groups: ``group_idx`` metadata stored in each recording (path → list or None).
        channels: Every channel, by ``channel_id``.
        lost: One line per recording whose gap ledger names batches lost while recording.
        merge: What the same-batch rule found across inputs (:mod:`kvtool.inputs`).
        unselected: Batches read but left out by a selection (``--since``, ``--rank`` …).
        unordered: A read of some streams only (``streams``) met a batch of the input
            whose (receive time, endpoint, topic, seq) came before the previous one's.
        streams_seen: Every stream such a read met, kept or not.
        first_keys: By ``channel_id``: THE merge order's key (receive time, endpoint,
            topic, seq) of the channel's first message, which numbered it.
        payload_ranks: (``channel_id``, rank) → batches whose payload names that rank
            while their channel has another (issue 24: the channel's is kept).
    """

    recordings: list[str] = field(default_factory=list)
    messages: int = 0
    events: int = 0
    rows: int = 0
    payload_bytes: int = 0
    bad_batches: int = 0
    skipped_events: int = 0
    problems: list[str] = field(default_factory=list)
    damaged: list[str] = field(default_factory=list)
    unknown_tags: dict[str, int] = field(default_factory=dict)
    groups: dict[str, list[dict[str, object]] | None] = field(default_factory=dict)
    channels: dict[int, ChannelRef] = field(default_factory=dict)
    lost: list[str] = field(default_factory=list)
    merge: MergeFindings = field(default_factory=MergeFindings)
    unselected: int = 0
    unordered: bool = False
    streams_seen: set[tuple[str, str, int | None]] = field(default_factory=set)
    first_keys: dict[int, MergeKey] = field(default_factory=dict)

    problem_keys: list[MergeKey] = field(default_factory=list)
    payload_ranks: dict[tuple[int, int], int] = field(default_factory=dict)

    def rank_findings(self) -> list[str]:
        """One line per channel whose payloads name another data-parallel rank (issue 24).

        Returns:
            The lines, by ``channel_id``.
        """
        by_channel: dict[int, dict[int, int]] = {}
        for (cid, r), n in sorted(self.payload_ranks.items()):
            by_channel.setdefault(cid, {})[r] = n
        out = []
        for cid, named in by_channel.items():
            ref = self.channels.get(cid)
            name = printable(ref.info.name) if ref is not None else str(cid)
            rank = ref.info.dp_rank if ref is not None else None
            shown = ", ".join(f"{r} in {k} batch(es)" for r, k in named.items())
            out.append(
                f"channel {name} is data-parallel rank {rank} (its endpoint's), but its "
                f"payloads name data_parallel_rank {shown}: counted under rank {rank}; "
                "the payload's rank is kept in the payload_rank column"
            )
        return out

    def note(self, msg: str, key: MergeKey | None = None) -> None:
        """Keep a problem message: those about the earliest messages, in THE merge order.

        Keyed by the message a problem is about, the kept ones are the same however the
        read was split (chunks, processes, units of work): each part keeps its earliest
        :data:`MAX_PROBLEMS`, and noting them all into one keeps the earliest of all.

        Args:
            msg: The problem.
            key: Its message's key (None: after every message's).
        """
        k = key if key is not None else NO_KEY
        at = bisect.bisect_right(self.problem_keys, k)
        if at >= MAX_PROBLEMS:
            return
        self.problem_keys.insert(at, k)
        self.problems.insert(at, msg)
        if len(self.problems) > MAX_PROBLEMS:
            del self.problems[MAX_PROBLEMS:], self.problem_keys[MAX_PROBLEMS:]


_BLOCK = 64
"""Payloads decoded and taken apart together: their event objects are still in the CPU
cache while their fields are read and when they are freed (a whole chunk's are not)."""

_BATCH_SCHEMA = {
    "log_time": pl.Int64,
    "ts": pl.Float64,
    "seq": pl.Int64,
    "channel_id": pl.UInt32,
    "dp_rank": pl.Int64,
    "payload_rank": pl.Int64,
}


_Codes = tuple[Any, list[str]]
"""Strings as codes (int32, -1: None) into a vocabulary."""
_Ints = tuple[Any, Any]
"""Nullable ints as (int64 values, bool valid)."""


def _str_codes(values: list[str | None]) -> _Codes:
    """Encode strings as codes into their vocabulary (one value for all: no Python loop)."""
    n = len(values)
    if not n or values.count(values[0]) == n:
        one = values[0] if n else None
        words = [] if one is None else [one]
        return np.full(n, -1 if one is None else 0, dtype=np.int32), words
    vocab: dict[str | None, int] = {}
    codes = [vocab.setdefault(v, len(vocab)) for v in values]
    arr = np.array(codes, dtype=np.int32)
    if None in vocab:
        none = vocab[None]
        arr[arr == none] = -1
        arr[arr > none] -= 1
    return arr, [w for w in vocab if w is not None]


def _int_column(values: list[Any]) -> _Ints:
    """Nullable int64 values (an int no vLLM sends, outside int64, becomes null)."""
    s = pl.Series(values, dtype=pl.Int64, strict=False)
    if not s.null_count():
        return s.to_numpy(), np.ones(len(s), dtype=bool)
    return s.fill_null(0).to_numpy(), s.is_not_null().to_numpy()


def _merge_codes(parts: list[_Codes]) -> tuple[Any, list[str | None]]:
    """One code array over one vocabulary; None's code is ``len(vocab) - 1``."""
    vocab: dict[str, int] = {}
    out = []
    for codes, words in parts:
        remap = np.array([vocab.setdefault(w, len(vocab)) for w in words] + [-1], dtype=np.int32)
        out.append(remap[codes] if len(words) else np.full(len(codes), -1, dtype=np.int32))
    codes = np.concatenate(out) if out else np.zeros(0, dtype=np.int32)
    codes = np.where(codes < 0, len(vocab), codes)
    return codes, [*vocab, None]


def _nullable(values: Any, valid: Any) -> pl.Series:
    """An Int64 series, null where not ``valid``."""
    s = pl.Series(values, dtype=pl.Int64)
    if valid.all():
        return s
    return s.scatter(np.flatnonzero(~valid), None)


class _Pending:
    """Batches decoded but not yet turned into a table chunk, as columns.

    Per batch: receive time, ts, seq, channel, rank and event count. Per event: type
    code, hash count (and all the keys), ``group_idx`` and ``medium`` (codes into a
    vocabulary). Per store (the only type with them): ``len(token_ids)``, kind and
    window. The msgspec path (:meth:`add`) and the numba scanner (:meth:`add_scanned`)
    append the same numpy columns.
    """

    def __init__(self, media: bool = True) -> None:
        self.want_media = media  # False: the caller reads no ``medium`` (one pass fewer)
        self.log_time: list[int] = []
        self.ts: list[float] = []
        self.seq: list[int] = []
        self.chan: list[int] = []
        self.rank: list[int | None] = []
        self.payload_rank: list[int | None] = []
        self.n_events: list[int] = []
        self.n_ev = 0
        self.types: list[Any] = []
        self.counts: list[Any] = []
        self.keys: list[Any] = []
        self.invalid: list[int] = []
        self.groups: list[_Ints] = []
        self.media: list[_Codes] = []
        self.tokens: list[Any] = []
        self.kinds: list[_Codes] = []
        self.windows: list[_Ints] = []
        self.parents: list[_Ints] = []
        self.origins: list[_Codes] = []
        self.block_sizes: list[_Ints] = []

    def __len__(self) -> int:
        return len(self.ts)

    def _batches(
        self,
        ts: list[float],
        n_events: list[int],
        log_time: list[int],
        seq: list[int],
        chan: list[int],
        rank: list[int | None],
        payload_rank: list[int | None],
    ) -> None:
        self.log_time += log_time
        self.payload_rank += payload_rank
        self.seq += seq
        self.chan += chan
        self.rank += rank
        self.ts += ts
        self.n_events += n_events

    def add(
        self,
        batches: list[Any],
        log_time: list[int],
        seq: list[int],
        chan: list[int],
        rank: list[int | None],
        payload_rank: list[int | None],
    ) -> None:
        """Take a block of msgspec-decoded batches apart into the columns.

        One C-level pass per field; the raw hash and token lists are parsed here, while
        the block's bytes are in cache, with small arrays numpy allocates without new
        pages (a whole chunk's temporaries would be fresh memory every time).
        """
        evl = [b.events for b in batches]
        self._batches(
            [b.ts for b in batches], list(map(len, evl)), log_time, seq, chan, rank, payload_rank
        )
        events = list(chain.from_iterable(evl))
        base = self.n_ev
        self.n_ev += len(events)
        types = np.frombuffer(bytes([e.type_code for e in events]), dtype=np.uint8)
        self.types.append(types)
        counts, keys, invalid = _hash_columns([e.block_hashes for e in events])
        self.counts.append(counts)
        self.keys.append(keys)
        if invalid:
            self.invalid += [base + i for i in invalid]
        self.groups.append(_int_column([e.group_idx for e in events]))
        if self.want_media:
            self.media.append(_str_codes([e.medium for e in events]))
        at = np.flatnonzero(types == STORED).tolist()
        stores = events if len(at) == len(events) else list(map(events.__getitem__, at))
        if stores:
            # len(token_ids), read from each list's msgpack header.
            a, off, _lens = _np_joined([e.token_ids for e in stores])
            n_tok, _hl = _np_headers(a, off)
            self.tokens.append(np.maximum(n_tok, 0))
            self.kinds.append(_str_codes([e.kv_cache_spec_kind for e in stores]))
            self.windows.append(_int_column([e.kv_cache_spec_sliding_window for e in stores]))
            self.parents.append(_parent_keys([e.parent_block_hash for e in stores]))
            self.origins.append(_str_codes([e.origin for e in stores]))
            self.block_sizes.append(_block_sizes([e.block_size for e in stores]))

    def add_scanned(
        self,
        sc: Any,
        b: slice,
        e: slice,
        k: slice,
        log_time: list[int],
        seq: list[int],
        chan: list[int],
        rank: list[int | None],
        payload_rank: list[int | None],
    ) -> None:
        """Append payloads ``b`` of a :func:`kvtool.scan.scan` (their events ``e``, keys ``k``)."""
        ts, n_events = sc.ts[b].tolist(), sc.n_events[b].tolist()
        self._batches(ts, n_events, log_time, seq, chan, rank, payload_rank)
        types = sc.type_code[e]
        self.n_ev += len(types)
        self.types.append(types)
        self.counts.append(sc.n_hashes[e])
        self.keys.append(sc.keys[k])
        g = sc.group_idx[e]
        self.groups.append((g, g != scan_null()))
        if self.want_media:
            self.media.append((sc.medium[e], sc.vocab))
        store = types == STORED
        if store.any():
            all_stores = bool(store.all())

            def pick(a: Any) -> Any:
                return a[e] if all_stores else a[e][store]

            self.tokens.append(pick(sc.tokens))
            self.kinds.append((pick(sc.kind), sc.vocab))
            w = pick(sc.window)
            self.windows.append((w, w != scan_null()))
            self.parents.append((pick(sc.parent), pick(sc.has_parent).astype(bool)))
            self.origins.append((pick(sc.origin), sc.vocab))
            bs = pick(sc.block_size)
            self.block_sizes.append((bs, bs != scan_null()))

    def medium_column(self, keep: Any, row_event: Any, n_rows: int) -> pl.Series:
        """The ``medium`` of each row (constant when every event has the same one)."""
        if not self.media:
            return pl.Series([None], dtype=pl.String).new_from_index(0, n_rows)
        codes, vocab = _merge_codes(self.media)
        if keep is not None:
            codes = codes[keep]
        if not len(codes) or codes.min() == codes.max():
            one = vocab[int(codes[0])] if len(codes) else None
            return pl.Series([one], dtype=pl.String).new_from_index(0, n_rows)
        return pl.Series(vocab, dtype=pl.String).gather(np.take(codes, row_event))


def scan_null() -> Any:
    """The scanner's null marker of ints (:data:`kvtool.scan.NULL`)."""
    from kvtool import scan

    return scan.NULL


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


def _to_rows(s: pl.Series, index: Any) -> pl.Series:
    """The value of ``s`` at each of ``index`` (numpy unless it has nulls)."""
    if s.null_count():
        return s.gather(index)
    return pl.Series(np.take(s.to_numpy(), index), dtype=s.dtype)


def _build(
    p: _Pending,
    first_event: int,
    stats: ReadStats,
    wanted: tuple[str, ...] | None = None,
    streams: dict[int, tuple[str, str]] | None = None,
) -> pl.DataFrame:
    """Turn pending batches into one table chunk (only the ``wanted`` columns, if given).

    ``streams`` (``channel_id`` → endpoint, topic) keys the problems it notes.

    numpy over whole columns (no Python per event or hash): each event-level or
    batch-level column is taken to rows by one index.
    """
    n_batch = len(p)
    n_per_batch = np.array(p.n_events, dtype=np.int64)
    batches = pl.DataFrame(
        {
            "log_time": p.log_time,
            "ts": p.ts,
            "seq": p.seq,
            "channel_id": p.chan,
            "dp_rank": p.rank,
            "payload_rank": p.payload_rank,
        },
        schema=_BATCH_SCHEMA,
        strict=False,  # an int no vLLM sends (outside int64) becomes null, not an error
    )
    types = np.concatenate(p.types) if p.types else np.zeros(0, dtype=np.uint8)
    counts = np.concatenate(p.counts) if p.counts else np.zeros(0, dtype=np.int64)
    keys = np.concatenate(p.keys) if p.keys else np.zeros(0, dtype=np.int64)
    g_val = np.concatenate([v for v, _m in p.groups]) if p.groups else np.zeros(0, np.int64)
    g_ok = np.concatenate([m for _v, m in p.groups]) if p.groups else np.zeros(0, bool)
    # Each store's place among the stores; n_store (the null appended to kinds and
    # windows below) for the other types.
    n_store = sum(len(t) for t in p.tokens)
    store_of = np.full(len(types), n_store, dtype=np.int64)
    store_of[types == STORED] = np.arange(n_store, dtype=np.int64)
    ev_kept = None
    if p.invalid:
        # block_hashes that is not a list of hashes: the event is skipped (as the protocol
        # decoder would), its neighbours kept.
        batch_of = np.repeat(np.arange(n_batch, dtype=np.int64), n_per_batch)
        seqs = batches["seq"]
        for i in p.invalid[:5]:
            b = int(batch_of[i])
            stats.note(
                f"seq {seqs[b]}: malformed {EVENT_TYPE_NAMES[types[i]]} "
                "(block_hashes is not a list of hashes)",
                _key(streams or {}, p.log_time[b], p.chan[b], p.seq[b]),
            )
        stats.skipped_events += len(p.invalid)
        keep = np.ones(len(types), dtype=bool)
        keep[p.invalid] = False
        types, counts, store_of = types[keep], counts[keep], store_of[keep]
        g_val, g_ok = g_val[keep], g_ok[keep]
        n_per_batch = np.bincount(batch_of[keep], minlength=n_batch)
        ev_kept = keep
    n_ev = len(types)
    is_store = types == STORED
    # event -> rows: one per hash, one for an event without hashes.
    rows_per_event = np.maximum(counts, 1)
    ends = np.cumsum(rows_per_event)
    row_start = ends - rows_per_event
    n_rows = int(ends[-1]) if n_ev else 0
    batch_rows = np.concatenate(([0], ends))[np.cumsum(n_per_batch)]
    rows_per_batch = np.diff(batch_rows, prepend=0)
    row_event = np.repeat(np.arange(n_ev, dtype=np.int64), rows_per_event)
    row_batch = np.repeat(np.arange(n_batch, dtype=np.int64), rows_per_batch)

    # Stores alone carry token_ids, kind and window (the other types: 0, null, null).
    tokens = np.zeros(n_rows, dtype=np.int64)
    if n_store:
        tokens[row_start[is_store]] = np.concatenate(p.tokens)[store_of[is_store]]
    store_rows = np.take(store_of, row_event)

    def kind_rows() -> pl.Series:
        codes, vocab = _merge_codes(p.kinds)
        codes = np.append(codes, len(vocab) - 1)  # the null of the other types
        return pl.Series(vocab, dtype=pl.String).gather(np.take(codes, store_rows))

    def window_rows() -> pl.Series:
        w_val = np.concatenate([v for v, _m in p.windows] + [np.zeros(1, np.int64)])
        w_ok = np.concatenate([m for _v, m in p.windows] + [np.zeros(1, bool)])
        return _nullable(np.take(w_val, store_rows), np.take(w_ok, store_rows))

    def parent_rows() -> pl.Series:
        v = np.concatenate([v for v, _m in p.parents] + [np.zeros(1, np.int64)])
        ok = np.concatenate([m for _v, m in p.parents] + [np.zeros(1, bool)])
        return _nullable(np.take(v, store_rows), np.take(ok, store_rows))

    def origin_rows() -> pl.Series:
        codes, vocab = _merge_codes(p.origins)
        table = np.array([ORIGIN_CODES.get(str(v), 0) for v in vocab] or [0], dtype=np.int8)
        codes = np.append(codes, len(vocab) - 1)  # the other types: none
        return pl.Series(np.take(table, np.take(codes, store_rows)), dtype=pl.Int8)

    def block_size_rows() -> pl.Series:
        v = np.concatenate([v for v, _m in p.block_sizes] + [np.zeros(1, np.int64)])
        ok = np.concatenate([m for _v, m in p.block_sizes] + [np.zeros(1, bool)])
        return _nullable(np.take(v, store_rows), np.take(ok, store_rows))

    if n_rows == len(keys):
        hash_col = pl.Series(keys, dtype=pl.Int64)
    else:
        has = np.take(counts > 0, row_event)
        full = np.zeros(n_rows, dtype=np.int64)
        full[has] = keys
        hash_col = pl.Series(full, dtype=pl.Int64).scatter(np.flatnonzero(~has), None)
    # Each column is made only if wanted (a worker's consumer may read only some).
    make: dict[str, Callable[[], pl.Series]] = {
        "type_code": lambda: pl.Series(np.take(types, row_event), dtype=pl.UInt8),
        "group_idx": lambda: _nullable(np.take(g_val, row_event), np.take(g_ok, row_event)),
        "kind": kind_rows,
        "sliding_window": window_rows,
        "medium": lambda: p.medium_column(ev_kept, row_event, n_rows),
        "tokens": lambda: pl.Series(tokens, dtype=pl.Int64),
        "block_count": lambda: pl.Series(
            np.take(counts.astype(np.int32), row_event), dtype=pl.Int32
        ),
        **{c: partial(_to_rows, batches[c], row_batch) for c in _BATCH_SCHEMA},
        "event_index": lambda: pl.Series(
            row_event + first_event if first_event else row_event, dtype=pl.Int64
        ),
        "hash": lambda: hash_col,
        "block_index": lambda: pl.Series(
            (np.arange(n_rows, dtype=np.int64) - np.take(row_start, row_event)).astype(np.int32),
            dtype=pl.Int32,
        ),
    }
    extra: dict[str, Callable[[], pl.Series]] = {"parent": parent_rows, "origin": origin_rows}
    on_request: dict[str, Callable[[], pl.Series]] = {"block_size": block_size_rows}
    df = pl.DataFrame(
        {c: f() for c, f in make.items() if wanted is None or c in wanted}
        | {c: f() for c, f in extra.items() if wanted is None or c in wanted}
        | {c: f() for c, f in on_request.items() if wanted is not None and c in wanted}
    )
    stats.rows += n_rows
    stats.events += n_ev
    return df


def _finish(df: pl.DataFrame, stats: ReadStats, labels: bool) -> pl.DataFrame:
    if not labels:
        have = set(df.columns)  # a worker may have returned only some (RawChunk.keep)
        return df.select(
            [c for c in (*TABLE_SCHEMA, *EXTRA_SCHEMA) if c not in _LABELS and c in have]
            + ["type_code"]
        )
    names = {cid: (ref.recording, ref.info.name) for cid, ref in stats.channels.items()}
    recs = pl.DataFrame(
        {
            "channel_id": list(names),
            "recording": [v[0] for v in names.values()],
            "channel": [v[1] for v in names.values()],
        },
        schema={"channel_id": pl.UInt32, "recording": pl.String, "channel": pl.String},
    )
    df = df.join(recs, on="channel_id", how="left", maintain_order="left").with_columns(
        type=pl.col("type_code")
        .cast(pl.Int64)
        .replace_strict([0, 1, 2], list(EVENT_TYPE_NAMES), return_dtype=EVENT_TYPE)
    )
    return df.select([*TABLE_SCHEMA, "type_code"])


def _merged_messages(
    readers: list[Iterator[RecordedMessage]], findings: MergeFindings | None = None
) -> Iterator[tuple[int, RecordedMessage]]:
    """THE merge order (:func:`kvtool.inputs.merge_messages`): each batch once."""
    return merge_messages(readers, findings=findings)


@dataclass
class RawChunk:
    """The payloads of one table chunk, read but not decoded.

    Plain lists of ints and bytes, so it pickles cheaply: :func:`decode_chunk` may run in
    another process (``report --jobs``) or on a Ray worker (``report --ray``).

    Attributes:
        log_time: Receive time (ns) per batch.
        seq: Sequence number per batch.
        channel_id: Table ``channel_id`` per batch.
        dp_rank: The channel's data-parallel rank per batch (the table's ``dp_rank``; the
            batch's own rank only where the channel has none: issue 24).
        data: The payloads, byte for byte.
        where: ``channel_id`` → "path: channel" for problem messages.
        streams: ``channel_id`` → (endpoint, topic), for the problems' keys.
        ranks: Keep only batches of these data-parallel ranks (None: all); a batch's own
            rank is known once decoded, so this selection is made by :func:`decode_chunk`.
        annotation: Annotate the decoded rows with it too (:func:`annotate_table`), where
            they are decoded (a pool worker takes that work off the driver); None: leave
            them unannotated.
        channels: The chunk's channels by ``channel_id`` (needed with ``annotation``).
        keep: Return only these table columns (None: all), those the consumer reads: a
            table shipped from a worker process costs less the fewer columns it has.
    """

    log_time: list[int] = field(default_factory=list)
    seq: list[int] = field(default_factory=list)
    channel_id: list[int] = field(default_factory=list)
    dp_rank: list[int | None] = field(default_factory=list)
    data: list[bytes] = field(default_factory=list)
    where: dict[int, str] = field(default_factory=dict)
    streams: dict[int, tuple[str, str]] = field(default_factory=dict)
    bytes: int = 0
    ranks: frozenset[int | None] | None = None
    annotation: Annotation | None = None
    channels: dict[int, ChannelRef] | None = None
    keep: tuple[str, ...] | None = None


@dataclass
class DecodedChunk:
    """A decoded :class:`RawChunk`: its table (``event_index`` from 0) and what was skipped.

    Attributes:
        table: The rows (as :func:`_build` makes them; not yet labelled).
        events: Events decoded.
        rows: Rows built.
        bad_batches: Payloads that were not a batch.
        skipped_events: Events skipped.
        unknown_tags: Of those, the events of an unknown type, by tag.
        problems: Messages naming what was skipped, in stream order.
        problem_keys: Their messages' keys (:meth:`ReadStats.note`).
        payload_ranks: As :attr:`ReadStats.payload_ranks`, for this chunk.
        unselected: Batches left out by ``ranks``.
        out_of_range: When the chunk came with an annotation, the table is annotated and
            this counts its stores per group index outside a given metadata table (as
            :func:`annotate_table` does); None: not annotated.
    """

    table: pl.DataFrame
    events: int = 0
    rows: int = 0
    bad_batches: int = 0
    skipped_events: int = 0
    problems: list[str] = field(default_factory=list)
    unselected: int = 0
    out_of_range: dict[int, int] | None = None
    problem_keys: list[MergeKey] = field(default_factory=list)
    payload_ranks: dict[tuple[int, int], int] = field(default_factory=dict)
    unknown_tags: dict[str, int] = field(default_factory=dict)

    def __getstate__(self) -> dict[str, Any]:
        # A pool worker pickles its result back to the driver: polars' own pickling
        # (serialize) costs ~10x the Arrow IPC of the same table, and a zstd-compressed
        # IPC is ~2% of its size (the per-event columns repeat on each block's row), so
        # the pipe and the pickles copy ~0.5 MB a chunk instead of ~20 MB.
        state = dict(self.__dict__)
        table = state.pop("table")
        if table.width:
            buf = io.BytesIO()
            table.write_ipc(buf, compression="zstd")
            state["_ipc"] = buf.getvalue()
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        state = dict(state)
        ipc = state.pop("_ipc", None)
        state["table"] = pl.read_ipc(ipc) if ipc is not None else pl.DataFrame()
        self.__dict__.update(state)


DECODER_ENV = "KVTOOL_DECODER"
"""``msgspec`` in the environment makes :func:`decode_chunk` take the msgspec path alone."""

Decoder = Literal["numba", "msgspec"]


def _use_numba(decoder: Decoder | None) -> bool:
    if decoder is None:
        decoder = "msgspec" if os.environ.get(DECODER_ENV) == "msgspec" else "numba"
    return decoder == "numba" and np is not None


def decode_chunk(raw: RawChunk, *, decoder: Decoder | None = None) -> DecodedChunk:
    """Decode one chunk of payloads into table rows (pure; runs in any process).

    The numba scanner (:mod:`kvtool.scan`) reads the payloads into columns; a payload it
    refuses goes through the msgspec path (:func:`decode_lean`, the reference), so both
    give the same rows and the same findings.

    Args:
        raw: The payloads.
        decoder: ``numba`` (the scanner, msgspec for what it refuses) or ``msgspec``
            alone; default: ``numba`` unless :data:`DECODER_ENV` says ``msgspec``.

    Returns:
        The rows, ``event_index`` counted from 0 within the chunk.
    """
    st = ReadStats()
    pending = _Pending(media=raw.keep is None or "medium" in raw.keep)
    n = len(raw.data)
    if not len(raw.log_time) == len(raw.seq) == len(raw.channel_id) == len(raw.dp_rank) == n:
        raise ValueError("RawChunk columns differ in length")
    if _use_numba(decoder) and n:
        _decode_scanned(raw, st, pending)
    else:
        for i in range(0, n, _BLOCK):
            pending.add(*_decode_block(raw, slice(i, i + _BLOCK), st))
    keep = raw.keep
    if keep is not None and raw.annotation is not None:
        keep = (*keep, *_ANNOTATE_INPUT)
    table = _build(pending, 0, st, keep, raw.streams) if len(pending) else pl.DataFrame()
    out_of_range: dict[int, int] | None = None
    if raw.annotation is not None:
        out_of_range = {}
        if table.height:
            table = annotate_table(table, raw.annotation, raw.channels or {}, out_of_range)
    if raw.keep is not None and table.width:
        table = table.select([c for c in table.columns if c in raw.keep])
    return DecodedChunk(
        table,
        st.events,
        st.rows,
        st.bad_batches,
        st.skipped_events,
        st.problems,
        st.unselected,
        out_of_range,
        st.problem_keys,
        st.payload_ranks,
        st.unknown_tags,
    )


_ANNOTATE_INPUT = (
    "channel_id",
    "dp_rank",
    "type_code",
    "group_idx",
    "kind",
    "sliding_window",
    "block_index",
)
"""The columns :func:`annotate_table` reads."""

_Block = tuple[list[Any], list[int], list[int], list[int], list["int | None"], list["int | None"]]
_vocab_skip = [0]  # blocks left before the vocabulary decoder is tried again


def _decode_block(raw: RawChunk, sl: slice, st: ReadStats) -> _Block:
    """Decode some payloads of a chunk: batches, log_time, seq, channel_id, rank.

    Payloads of one stream all fit one lean decoder (the usual case), mapped in C over
    the block: the vocabulary one (known media and kinds) if it fits, else the str one;
    otherwise the block is decoded payload by payload (:func:`_decode_each`), bad
    batches and bad events skipped and named. All three give the same batches.
    """
    data = raw.data[sl]
    batches = None
    if _vocab_skip[0] > 0:  # (a heuristic: a race between threads only shifts a retry)
        _vocab_skip[0] -= 1
    else:
        batches = _VOCAB.decode_all(data)
        if batches is None:
            _vocab_skip[0] = _VOCAB_BACKOFF
    if batches is None:
        batches = _LEAN.decode_all(data)
    if batches is None:
        return _decode_each(raw, sl, st)
    log_time, seq, chan = raw.log_time[sl], raw.seq[sl], raw.channel_id[sl]
    own = [b.data_parallel_rank for b in batches]
    kept, differ = _ranks(own, raw.dp_rank[sl])
    ranks = raw.ranks
    if ranks is not None:
        sel = [r in ranks for r in kept]
        st.unselected += sel.count(False)
        batches = list(compress(batches, sel))
        log_time = list(compress(log_time, sel))
        seq = list(compress(seq, sel))
        chan = list(compress(chan, sel))
        kept = list(compress(kept, sel))
        differ = list(compress(differ, sel))
    _count_payload_ranks(st, chan, differ)
    return batches, log_time, seq, chan, kept, differ


def _ranks(own: list[Any], channel: list[int | None]) -> tuple[list[int | None], list[int | None]]:
    """Each batch's rank and its payload's rank where that differs (else None).

    A batch's rank is its channel's, else its payload's (:func:`kvtool.annotate.event_rank`).
    """
    kept = [c if c is not None else r for r, c in zip(own, channel, strict=True)]
    differ = [r if r is not None and r != k else None for r, k in zip(own, kept, strict=True)]
    return kept, differ


def _count_payload_ranks(st: ReadStats, chan: list[int], differ: list[int | None]) -> None:
    """Count the batches whose payload names another rank than their channel's."""
    if differ.count(None) == len(differ):
        return
    for cid, r in zip(chan, differ, strict=True):
        if r is not None:
            key = (cid, r)
            st.payload_ranks[key] = st.payload_ranks.get(key, 0) + 1


def _decode_scanned(raw: RawChunk, st: ReadStats, pending: _Pending) -> None:
    """Decode a chunk with the numba scanner; payloads it refuses take the msgspec path.

    The chunk is cut into runs of payloads the scanner decoded (appended as columns),
    payloads ``--rank`` leaves out, and payloads it refused (:func:`_decode_each`), kept
    in stream order.
    """
    from kvtool import scan

    data = raw.data
    n = len(data)
    offs = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, data), dtype=np.int64, count=n), out=offs[1:])
    buf = np.frombuffer(b"".join(data), dtype=np.uint8)
    sc = scan.scan(buf, offs)
    ev_at = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.where(sc.err == 0, sc.n_events, 0), out=ev_at[1:])
    key_at_ev = np.zeros(len(sc.type_code) + 1, dtype=np.int64)
    np.cumsum(sc.n_hashes, out=key_at_ev[1:])
    key_at = key_at_ev[ev_at]
    own = [r if r >= 0 else None for r in sc.rank.tolist()]
    kept, differ = _ranks(own, raw.dp_rank)
    # Per payload: 0 decoded, 1 refused (msgspec decodes it), 2 left out by --rank.
    cat = (sc.err != 0).astype(np.int8)
    ranks = raw.ranks
    if ranks is not None:
        out = np.array([r not in ranks for r in kept], dtype=bool) & (cat == 0)
        st.unselected += int(out.sum())
        cat[out] = 2
    cuts = [0, *(np.flatnonzero(np.diff(cat)) + 1).tolist(), n]
    for a, b in itertools.pairwise(cuts):
        kind = cat[a]
        if kind == 0:
            pending.add_scanned(
                sc,
                slice(a, b),
                slice(int(ev_at[a]), int(ev_at[b])),
                slice(int(key_at[a]), int(key_at[b])),
                raw.log_time[a:b],
                raw.seq[a:b],
                raw.channel_id[a:b],
                kept[a:b],
                differ[a:b],
            )
            _count_payload_ranks(st, raw.channel_id[a:b], differ[a:b])
        elif kind == 1:
            for i in range(a, b, _BLOCK):
                pending.add(*_decode_each(raw, slice(i, min(b, i + _BLOCK)), st))


def _key(streams: dict[int, tuple[str, str]], log_time: int, cid: int, seq: int) -> MergeKey:
    """The key of one of a chunk's messages, by its ``channel_id`` (:attr:`RawChunk.streams`)."""
    endpoint, topic = streams.get(cid, ("", ""))
    return (log_time, endpoint, topic, seq)


def _decode_each(raw: RawChunk, sl: slice, st: ReadStats) -> _Block:
    """Decode payloads one by one: bad batches and bad events are skipped and named."""
    out: _Block = ([], [], [], [], [], [])
    batches, log_times, seqs, chans, kept, differ = out
    ranks = raw.ranks
    for log_time, seq, cid, rank, data in zip(
        raw.log_time[sl],
        raw.seq[sl],
        raw.channel_id[sl],
        raw.dp_rank[sl],
        raw.data[sl],
        strict=True,
    ):
        try:
            b = decode_lean(data, seq=seq)
        except ProtocolError as err:
            st.bad_batches += 1
            st.note(f"{raw.where.get(cid, cid)}: {err}", _key(raw.streams, log_time, cid, seq))
            continue
        (kept_rank,), (other,) = _ranks([b.data_parallel_rank], [rank])
        if ranks is not None and kept_rank not in ranks:
            st.unselected += 1
            continue
        if b.skipped:
            st.skipped_events += len(b.skipped)
            if b.unknown_tags:
                protocol.count_unknown_tags(st.unknown_tags, Counter(b.unknown_tags).items())
            for text in b.skipped:
                st.note(f"{raw.where.get(cid, cid)}: {text}", _key(raw.streams, log_time, cid, seq))
        batches.append(b)
        log_times.append(log_time)
        seqs.append(seq)
        chans.append(cid)
        kept.append(kept_rank)
        differ.append(other)
    _count_payload_ranks(st, chans, differ)
    return out


def iter_raw_chunks(
    paths: Sequence[str | os.PathLike[str]],
    *,
    stats: ReadStats | None = None,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    select: BatchFilter | None = None,
    progress: Progress | None = None,
    streams: frozenset[tuple[str, str, int | None]] | None = None,
) -> Iterator[RawChunk]:
    """Read recordings into chunks of undecoded payloads, in stream order.

    Each recording is read chunk by chunk; several recordings are merged in THE merge
    order of :mod:`kvtool.inputs` (receive time, then channel, then seq), a batch found
    in several inputs counted once (``stats.merge`` says so). Channels are numbered per
    publisher stream (endpoint, topic, rank) in order of first appearance. After the last
    chunk, ``stats`` holds each recording's damage and lost batches.

    Args:
        paths: Recordings.
        stats: Receives recordings, channels, messages, payload bytes and damage.
        chunk_bytes: Payload bytes per chunk.
        select: Keep only these batches (``--channel``, ``--rank``, ``--since``,
            ``--until``, ``--seq``; :class:`kvtool.replay.BatchFilter`, the selection
            ``replay`` makes): times are receive times, relative ones counted from the
            first message of the (merged) input, as ``replay`` counts them.
        progress: Called with (bytes done, bytes total) of the input files as they are read.
        streams: Read only these publisher streams (endpoint, topic, rank): one unit of
            a report split by stream (:mod:`kvtool.report.partial`). The others are not
            counted at all; ``stats.unordered`` tells whether the whole input was in THE
            merge order's key order.

    Yields:
        Chunks of about ``chunk_bytes`` of payload.

    Raises:
        RecordingError: A recording cannot be opened.
    """
    st = stats if stats is not None else ReadStats()
    opened = []
    n = size = 0  # messages and payload bytes read but not yet counted in ``st``
    try:
        for path in paths:
            reader = open_recording(path)
            opened.append(reader)
        for reader in opened:
            st.recordings.append(reader.path)
            st.groups[reader.path] = reader.groups
        batches: Iterator[tuple[int, list[RecordedMessage]]]
        if len(opened) == 1:
            # One input is its own merge order (merge_messages pairs its messages with
            # 0): read it a list at a time, each list from one chunk.
            batches = ((0, b) for b in opened[0].message_batches())
        else:
            merged = _merged_messages([r.messages() for r in opened], st.merge)
            batches = ((i, [m]) for i, m in merged)
        # One channel_id per publisher stream (endpoint, topic, rank), whichever inputs
        # hold it: a stream split over several files (a file and its slice, consecutive
        # recordings) continues as one stream, as the merge's same-batch rule assumes.
        chan_ids: dict[tuple[str, str, int | None], int] = {}
        where: dict[int, str] = {}
        stream_of: dict[int, tuple[str, str]] = {}
        ranks = select.ranks if select is not None else None
        raw = RawChunk(ranks=ranks)
        keep = _selector(select, st) if select is not None else None
        sizes = [reader_size(r) for r in opened]
        total = sum(sizes)
        at = [0] * len(opened)
        done = 0
        # Work per list of messages, not per message: the columns are extended in C, a
        # list on one channel (the usual case) takes its channel_id and rank at once, and
        # the counts go to ``st`` with each chunk. A list's messages share one offset.
        get_channel, get_data = attrgetter("channel"), attrgetter("data")
        get_time, get_seq = attrgetter("log_time"), attrgetter("seq")
        last_ch: ChannelInfo | None = None
        cid = 0
        rank: int | None = None

        def number(ch: ChannelInfo, i: int, m: RecordedMessage) -> int:
            """The channel_id of a channel's stream, numbered when first met (at ``m``)."""
            key = (ch.endpoint, ch.topic, ch.dp_rank)
            got = chan_ids.get(key)
            if got is None:
                got = chan_ids[key] = len(chan_ids)
                st.channels[got] = ChannelRef(got, opened[i].path, ch)
                st.first_keys[got] = (m.log_time, ch.endpoint, ch.topic, m.seq)
                where[got] = f"{ch.path}: {ch.name}"
                stream_of[got] = (ch.endpoint, ch.topic)
            return got

        last_order: MergeKey | None = None
        for i, batch in batches:
            if progress is not None and batch[0].offset > at[i]:
                off = batch[0].offset
                done += min(off, sizes[i]) - at[i]
                at[i] = min(off, sizes[i])
                progress(done, total)
            if keep is None and streams is None:
                datas = list(map(get_data, batch))
                fill = sum(map(len, datas))
                if size + fill < chunk_bytes:
                    # The whole list goes into this chunk: nothing is yielded before its
                    # last message, so its channels may be numbered first.
                    k = len(batch)
                    chans = list(map(get_channel, batch))
                    if chans.count(last_ch) == k:
                        cids, rks = [cid] * k, [rank] * k
                    else:
                        cids, rks = [], []
                        for ch, m in zip(chans, batch, strict=True):
                            if ch is not last_ch:
                                last_ch, cid, rank = ch, number(ch, i, m), ch.dp_rank
                            cids.append(cid)
                            rks.append(rank)
                    raw.log_time.extend(map(get_time, batch))
                    raw.seq.extend(map(get_seq, batch))
                    raw.channel_id.extend(cids)
                    raw.dp_rank.extend(rks)
                    raw.data.extend(datas)
                    n += k
                    size += fill
                    continue
            # Message by message, as one loop over the merged messages would: a
            # selection counts what it leaves out as it goes, and a chunk that fills
            # inside this list ends exactly after the message that reaches chunk_bytes.
            for m in batch:
                ch = m.channel
                if streams is not None:
                    # One unit of a report split by stream: check THE merge order's key
                    # over every message, keep this unit's streams.
                    key = (ch.endpoint, ch.topic, ch.dp_rank)
                    order = (m.log_time, key[0], key[1], m.seq)
                    if last_order is not None and order < last_order:
                        st.unordered = True
                    last_order = order
                    st.streams_seen.add(key)
                    if key not in streams:
                        continue
                if keep is not None and not keep(m):
                    continue
                if ch is not last_ch:
                    last_ch, cid, rank = ch, number(ch, i, m), ch.dp_rank
                data = m.data
                raw.log_time.append(m.log_time)
                raw.seq.append(m.seq)
                raw.channel_id.append(cid)
                raw.dp_rank.append(rank)
                raw.data.append(data)
                n += 1
                size += len(data)
                if size >= chunk_bytes:
                    raw.bytes = size
                    st.messages += n
                    st.payload_bytes += size
                    n = size = 0
                    raw.where = dict(where)
                    raw.streams = dict(stream_of)
                    yield raw
                    raw = RawChunk(ranks=ranks)
        raw.bytes = size
        st.messages += n
        st.payload_bytes += size
        n = size = 0
        if raw.data:
            raw.where = dict(where)
            raw.streams = dict(stream_of)
            yield raw
        if progress is not None:
            progress(total, total)
        for reader in opened:
            rec = reader.recovery
            if not rec.complete:
                st.damaged.append(rec.summary())
            ledger = reader.gap_ledger
            # Lost batches, then a tail the replay socket never confirmed (issue 23): the
            # library's one wording (kvtool.recording.unconfirmed).
            from kvtool.recording.unconfirmed import ledger_lines

            st.lost += ledger_lines(str(reader.path), ledger, orphans=True)
    finally:
        st.messages += n
        st.payload_bytes += size
        for reader in opened:
            reader.close()


def reader_size(reader: Any) -> int:
    """The size in bytes of an opened recording's file (0 when unknown)."""
    try:
        return os.path.getsize(reader.path)
    except OSError:
        return 0


def _selector(select: BatchFilter, st: ReadStats) -> Callable[[RecordedMessage], bool]:
    """Return a test of each message against ``select`` (all but ``ranks``), counting misses.

    Receive-time bounds relative to the start count from the first message read.
    """
    bounds: list[int | None] = []
    channel_ok: dict[tuple[str, int], bool] = {}

    def keep(m: RecordedMessage) -> bool:
        if not bounds:
            bounds.append(select.since.resolve(m.log_time) if select.since is not None else None)
            bounds.append(select.until.resolve(m.log_time) if select.until is not None else None)
        since, until = bounds
        first, last = select.seq_first, select.seq_last
        ok = not (
            (since is not None and m.log_time < since)
            or (until is not None and m.log_time > until)
            or (first is not None and m.seq < first)
            or (last is not None and m.seq > last)
        )
        if ok and select.channels is not None:
            ch = m.channel
            key = (ch.path, ch.id)
            got = channel_ok.get(key)
            if got is None:
                got = channel_ok[key] = select.channel_match(ch.name, ch.endpoint)
            ok = got
        if not ok:
            st.unselected += 1
        return ok

    return keep


DecodeMap = Callable[[Iterator[RawChunk]], Iterator[DecodedChunk]]


@dataclass(frozen=True)
class ReadPlan:
    """A read as :func:`iter_tables` makes it, picklable.

    A process given it reads the same chunks, numbered the same: the chunking depends on
    the input alone.

    Attributes:
        paths: Recordings (paths the reading process can open).
        chunk_bytes: Payload bytes per chunk.
        select: Keep only these batches.
        streams: Read only these publisher streams.
        annotation: Annotate the chunks with it where they are decoded (None: not).
        keep: Return only these table columns (None: all).
    """

    paths: tuple[str, ...]
    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    select: BatchFilter | None = None
    streams: frozenset[tuple[str, str, int | None]] | None = None
    annotation: Annotation | None = None
    keep: tuple[str, ...] | None = None


@dataclass
class ShardItem:
    """What a reading process hands back (:func:`read_shard`).

    Attributes:
        chunk: A decoded chunk; None in the last item.
        read: The read side of the process's :class:`ReadStats` so far.
        progress: Bytes read of the inputs, and their total.
    """

    chunk: DecodedChunk | None
    read: ReadStats
    progress: tuple[int, int] | None = None


def read_shard(plan: ReadPlan, shard: int, shards: int) -> Iterator[ShardItem]:
    """Read the whole input and decode every ``shards``-th chunk, from chunk ``shard``.

    Each of ``shards`` processes runs this on the same plan: each reads everything (the
    reading is cheap next to decoding, and it is how each knows the chunks, channel ids
    and seqs of the stream without the others), decodes and annotates its own chunks,
    and hands them over; the consumer takes chunk ``i`` from process ``i % shards``, so
    no payload crosses between processes and the order is the stream's. A last item
    without a chunk carries the read's final stats (damage, lost batches).

    Args:
        plan: The read.
        shard: This process's number, from 0.
        shards: How many processes share the read.

    Yields:
        This shard's chunks in stream order, then the final item.
    """
    st = ReadStats()
    done: list[tuple[int, int]] = []

    def progress(n: int, total: int) -> None:
        done[:] = [(n, total)]

    raws = iter_raw_chunks(
        list(plan.paths),
        stats=st,
        chunk_bytes=plan.chunk_bytes,
        select=plan.select,
        progress=progress,
        streams=plan.streams,
    )
    mine: Iterator[RawChunk] = (raw for i, raw in enumerate(raws) if i % shards == shard)
    if plan.annotation is not None:
        mine = _with_annotation(mine, plan.annotation, st)
    if plan.keep is not None:
        mine = _keeping(mine, plan.keep)
    for raw in mine:
        yield ShardItem(decode_chunk(raw), st, done[0] if done else None)
    yield ShardItem(None, st, done[0] if done else None)


ShardMap = Callable[[ReadPlan], Iterator[ShardItem]]
"""Runs :func:`read_shard` in several processes and yields their items in stream order
(:func:`kvtool.report.parallel.shard_map`)."""


def _adopt_read(st: ReadStats, read: ReadStats, noted: int, decoded_unselected: int) -> int:
    """Take the read side of another process's stats into ``st``; return problems taken.

    The decode side (events, rows, skipped, the batches ``--rank`` left out) is counted
    by :func:`add_decoded` from each chunk, ``decoded_unselected`` of them so far; the
    read side is the reading process's, as :func:`iter_raw_chunks` keeps it.
    """
    st.recordings[:] = read.recordings
    st.groups.update(read.groups)
    st.channels.update(read.channels)  # the same dict: builders and annotators hold it
    st.first_keys.update(read.first_keys)
    st.messages = read.messages - decoded_unselected
    st.unselected = read.unselected + decoded_unselected
    st.payload_bytes = read.payload_bytes
    st.damaged[:] = read.damaged
    st.lost[:] = read.lost
    st.merge = read.merge
    st.unordered = read.unordered
    st.streams_seen = set(read.streams_seen)
    for text, key in zip(read.problems[noted:], read.problem_keys[noted:], strict=True):
        st.note(text, key)
    return len(read.problems)


"""Decodes raw chunks, in order: ``map(decode_chunk, ...)`` or a process pool's map."""


def add_decoded(d: DecodedChunk, stats: ReadStats) -> pl.DataFrame:
    """Count a decoded chunk into ``stats`` and number its events after the earlier ones.

    Args:
        d: The chunk, decoded in stream order after every chunk already added.
        stats: The read's stats.

    Returns:
        Its table with stream-wide ``event_index``.
    """
    first_event = stats.events
    stats.events += d.events
    stats.rows += d.rows
    stats.bad_batches += d.bad_batches
    stats.skipped_events += d.skipped_events
    protocol.count_unknown_tags(stats.unknown_tags, d.unknown_tags.items())
    # Batches dropped by --rank were counted as read by iter_raw_chunks.
    stats.messages -= d.unselected
    stats.unselected += d.unselected
    for text, key in zip(d.problems, d.problem_keys, strict=True):
        stats.note(text, key)
    for k, n in d.payload_ranks.items():
        stats.payload_ranks[k] = stats.payload_ranks.get(k, 0) + n
    if first_event and d.table.height and "event_index" in d.table.columns:
        return d.table.with_columns(pl.col("event_index") + first_event)
    return d.table


def iter_tables(
    paths: Sequence[str | os.PathLike[str]],
    *,
    stats: ReadStats | None = None,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    labels: bool = True,
    decode_map: DecodeMap | None = None,
    select: BatchFilter | None = None,
    progress: Progress | None = None,
    streams: frozenset[tuple[str, str, int | None]] | None = None,
    annotation: Annotation | None = None,
    out_of_range: dict[int, int] | None = None,
    keep: tuple[str, ...] | None = None,
    shard_map: ShardMap | None = None,
) -> Iterator[pl.DataFrame]:
    """Read recordings into flat table chunks (wire kinds; see :class:`TableAnnotator`).

    Reading (:func:`iter_raw_chunks`) and decoding (:func:`decode_chunk`) are separate
    steps so that decoding, the costly one, can run in other processes; the chunks come
    back in stream order, so the result does not depend on where they were decoded. A
    payload that is not a batch is skipped and counted in ``stats`` (with its seq), as
    is every undecodable event.

    Args:
        paths: Recordings.
        stats: Receives counts, channels, problems and damage; pass one to read them.
        chunk_bytes: Payload bytes per chunk (memory is bounded by about a chunk's table).
        labels: Add the ``recording``, ``channel`` and ``type`` string columns (the
            report works on ``channel_id`` and ``type_code`` and skips them).
        decode_map: Decodes the raw chunks in order (default: in this process).
        select: Keep only these batches (see :func:`iter_raw_chunks`).
        progress: Called with (bytes done, bytes total) of the input files.
        streams: Read only these publisher streams (see :func:`iter_raw_chunks`).
        annotation: Annotate the chunks with it (:func:`annotate_table`) where they are
            decoded, e.g. in ``decode_map``'s worker processes; None: not annotated.
        out_of_range: With ``annotation``: receives the stores per group index outside
            a given metadata table, as :func:`annotate_table` counts them.
        keep: The columns the caller reads; the decoder may return only these
            (:attr:`RawChunk.keep`), wherever it runs.
        shard_map: Reads and decodes in other processes, each reading the input itself
            (:func:`read_shard`; ``decode_map`` is then not used).

    Yields:
        Table chunks with the columns of :data:`TABLE_SCHEMA` (plus ``type_code``; with
        ``keep``, perhaps only those), in stream order; row order inside a chunk is
        stream order.

    Raises:
        RecordingError: A recording cannot be opened.
    """
    st = stats if stats is not None else ReadStats()
    decoded: Iterator[DecodedChunk]
    if shard_map is not None:
        plan = ReadPlan(
            tuple(os.fspath(p) for p in paths), chunk_bytes, select, streams, annotation, keep
        )
        decoded = _sharded(shard_map(plan), st, progress)
    else:
        raws = iter_raw_chunks(
            paths,
            stats=st,
            chunk_bytes=chunk_bytes,
            select=select,
            progress=progress,
            streams=streams,
        )
        if annotation is not None:
            raws = _with_annotation(raws, annotation, st)
        if keep is not None:
            raws = _keeping(raws, keep)
        decoded = map(decode_chunk, raws) if decode_map is None else decode_map(raws)
    for d in decoded:
        if annotation is not None:
            if d.out_of_range is None:  # a decoder that does not annotate
                d.out_of_range = {}
                if d.table.height:
                    d.table = annotate_table(d.table, annotation, st.channels, d.out_of_range)
            if out_of_range is not None:
                for g, n in d.out_of_range.items():
                    out_of_range[g] = out_of_range.get(g, 0) + n
        table = add_decoded(d, st)
        if table.height:
            yield _finish(table, st, labels)


def _with_annotation(
    raws: Iterator[RawChunk], annotation: Annotation, stats: ReadStats
) -> Iterator[RawChunk]:
    """Give each raw chunk the annotation and its channels, to be annotated when decoded."""
    for raw in raws:
        raw.annotation = annotation
        raw.channels = {cid: stats.channels[cid] for cid in set(raw.channel_id)}
        yield raw


def _sharded(
    items: Iterator[ShardItem], st: ReadStats, progress: Progress | None
) -> Iterator[DecodedChunk]:
    """The chunks of a :data:`ShardMap`, their read's stats taken into ``st`` as they come."""
    noted = unselected = 0
    for item in items:
        noted = _adopt_read(st, item.read, noted, unselected)
        if progress is not None and item.progress is not None:
            progress(*item.progress)
        if item.chunk is not None:
            unselected += item.chunk.unselected  # counted by add_decoded once yielded
            yield item.chunk


def _keeping(raws: Iterator[RawChunk], keep: tuple[str, ...]) -> Iterator[RawChunk]:
    for raw in raws:
        raw.keep = keep
        yield raw


_DONE = object()


def prefetch(items: Iterator[T], depth: int = 1) -> Iterator[T]:
    """Run an iterator in a background thread, ``depth`` items ahead of its consumer.

    Decoding is Python (it holds the GIL) while the report's per-chunk work is mostly
    polars (which releases it), so reading the next chunk overlaps processing this one.
    Exceptions of the producer are raised in the consumer; closing the returned
    generator stops the producer.

    Args:
        items: The iterator (e.g. :func:`iter_tables`).
        depth: How many items may wait (each is a table chunk in memory).

    Yields:
        The items, in order.
    """
    q: queue.Queue[object] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def run() -> None:
        try:
            for item in items:
                while not stop.is_set():
                    try:
                        q.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    break
        except BaseException as err:  # handed to the consumer
            q.put(_Raised(err))
            return
        finally:
            close = getattr(items, "close", None)
            if stop.is_set() and close is not None:
                close()
        q.put(_DONE)

    worker = threading.Thread(target=run, name="kvtool-prefetch", daemon=True)
    worker.start()
    try:
        while True:
            item = q.get()
            if item is _DONE:
                break
            if isinstance(item, _Raised):
                raise item.err
            yield item  # type: ignore[misc]
    finally:
        stop.set()
        while worker.is_alive():
            with contextlib.suppress(queue.Empty):
                q.get(timeout=0.1)
        worker.join()


@dataclass
class _Raised:
    err: BaseException


def read_table(
    paths: Sequence[str | os.PathLike[str]], *, stats: ReadStats | None = None
) -> pl.DataFrame:
    """Read recordings into one flat table (wire kinds, not annotated); for tests and small files.

    Args:
        paths: Recordings.
        stats: Receives counts and problems.

    Returns:
        The whole table.
    """
    chunks = list(iter_tables(paths, stats=stats))
    if not chunks:
        return empty_table()
    return pl.concat(chunks)


def empty_table() -> pl.DataFrame:
    """Return a table with no rows and the columns of :data:`TABLE_SCHEMA` (+ ``type_code``).

    Returns:
        The empty frame.
    """
    return pl.DataFrame(schema={**TABLE_SCHEMA, "type_code": pl.UInt8()})


# -- annotation ------------------------------------------------------------------------------

# The columnar adapter of kvtool.annotate: metadata and learned annotations are small
# frames joined on the real composite keys -- (channel_id, group_idx) for metadata,
# (channel_id, dp_rank, group_idx) for learned values -- never on a packed integer.
_META_SCHEMA = {
    "channel_id": pl.UInt32,
    "group_idx": pl.Int64,
    "m_kind": pl.String,
    "m_window": pl.Int64,
}
_LEARNED_SCHEMA = {
    "channel_id": pl.UInt32,
    "_rank": pl.Int64,
    "group_idx": pl.Int64,
    "l_kind": pl.String,
    "l_window": pl.Int64,
}
_NO_RANK = -1  # join key for a null dp_rank (ranks are >= 0)
_UNSET: Any = object()


def annotate_table(
    df: pl.DataFrame,
    annotation: Annotation,
    channels: dict[int, ChannelRef],
    out_of_range: dict[int, int] | None = None,
) -> pl.DataFrame:
    """Apply THE annotation to a table chunk (pure; any chunk, any order, any process).

    Stores and removes whose channel has metadata and whose ``group_idx`` is in it take
    the metadata's kind and window (vLLM's ``take_events`` rule; removes carry no kind,
    so they take their group's). On channels without metadata, rows whose kind is null
    (unannotated stores, removes) take their (channel, rank, group)'s learned value;
    stores that carry a kind keep it. ``AllBlocksCleared`` rows are never touched; removes
    without ``group_idx`` are left for the report's hash state.

    Args:
        df: A chunk of :func:`iter_tables` (needs ``channel_id``, ``dp_rank``,
            ``group_idx``, ``type_code``, ``kind``, ``sliding_window``, ``block_index``).
        annotation: The resolved annotation (:func:`kvtool.inputs.resolve_annotation`).
        channels: The read's channels by ``channel_id`` (:attr:`ReadStats.channels`).
        out_of_range: Receives stores per group index not in their metadata.

    Returns:
        The chunk, same columns and dtypes, ``kind``/``sliding_window`` set where known.
    """
    if df.height == 0:
        return df
    df = _annotate_ungrouped(df, annotation, channels)
    meta_rows, learned_rows, covered = _annotation_rows(annotation, channels)
    if not covered and not learned_rows:
        return df
    out = None
    if np is not None:
        out = _annotate_dense(df, meta_rows, learned_rows, covered, channels, out_of_range)
    if out is None:
        out = _annotate_join(df, meta_rows, learned_rows, covered, channels, out_of_range)
    return out


def _annotate_ungrouped(
    df: pl.DataFrame, annotation: Annotation, channels: dict[int, ChannelRef]
) -> pl.DataFrame:
    """Rows without ``group_idx`` (not clears) take ``--group-meta none=KIND`` (issue 21).

    The other passes match rows on their ``group_idx`` only, so they leave these alone.
    """
    given = {
        cid: kw
        for cid, ref in channels.items()
        if (kw := annotation.ungrouped_for(ref.info.name)) is not None
    }
    if not given or not df["group_idx"].null_count():
        return df
    ids = list(given)
    keys = pl.DataFrame(
        {
            "channel_id": ids,
            "_u_kind": [given[c][0] for c in ids],
            "_u_window": [given[c][1] for c in ids],
        },
        schema={"channel_id": df.schema["channel_id"], "_u_kind": pl.String, "_u_window": pl.Int64},
    )
    hit = (
        pl.col("group_idx").is_null()
        & (pl.col("type_code") != CLEARED)
        & pl.col("_u_kind").is_not_null()
    )
    return (
        df.join(keys, on="channel_id", how="left", maintain_order="left")
        .with_columns(
            kind=pl.when(hit)
            .then(pl.col("_u_kind"))
            .otherwise(pl.col("kind"))
            .cast(df.schema["kind"]),
            sliding_window=pl.when(hit)
            .then(pl.col("_u_window"))
            .otherwise(pl.col("sliding_window"))
            .cast(df.schema["sliding_window"]),
        )
        .drop("_u_kind", "_u_window")
    )


_MetaRow = tuple[int, int, "str | None", "int | None"]
_LearnedRow = tuple[int, int, int, "str | None", "int | None"]
_DENSE_CELLS = 1 << 20  # largest lookup table (channel x rank x group cells) of the fast path


def _annotation_rows(
    annotation: Annotation, channels: dict[int, ChannelRef]
) -> tuple[list[_MetaRow], list[_LearnedRow], list[int]]:
    """The annotation as rows keyed by channel id: metadata, learned values, covered ids."""
    meta_rows: list[_MetaRow] = []
    learned_rows: list[_LearnedRow] = []
    covered: list[int] = []
    by_channel: dict[str, list[tuple[int | None, int, KindWindow]]] = {}
    for (ch, rank, g), kw in annotation.learned.items():
        by_channel.setdefault(ch, []).append((rank, g, kw))
    for cid, ref in channels.items():
        table = annotation.table_for(ref.info.name)
        if table is not None:
            covered.append(cid)
            for info in table.groups.values():
                meta_rows.append((cid, info.group_idx, info.kind, info.sliding_window))
            continue
        for rank, g, (k, w) in by_channel.get(ref.info.name, ()):
            learned_rows.append((cid, _NO_RANK if rank is None else rank, g, k, w))
    return meta_rows, learned_rows, covered


def _annotate_dense(
    df: pl.DataFrame,
    meta_rows: list[_MetaRow],
    learned_rows: list[_LearnedRow],
    covered: list[int],
    channels: dict[int, ChannelRef],
    out_of_range: dict[int, int] | None,
) -> pl.DataFrame | None:
    """:func:`annotate_table` by numpy lookup tables indexed by (channel, rank, group).

    The keys of the annotation span few channels, ranks and groups, so a dense table over
    their ranges answers every row by one gather, where a join would hash every row.
    Rows whose channel, rank or group falls outside the keys' ranges match nothing, which
    keeps odd values (negative, huge, null) exact. Returns None when the keys' ranges are
    too wide (or a key repeats), leaving the chunk to :func:`_annotate_join`.
    """
    cid_s, g_s = df["channel_id"], df["group_idx"]
    if cid_s.null_count():
        return None
    cid = cid_s.to_numpy()
    has_g: Any = True
    if g_s.null_count():
        has_g = g_s.is_not_null().to_numpy()
        g_s = g_s.fill_null(0)
    g = g_s.to_numpy()
    tc = df["type_code"].to_numpy()
    not_cleared: Any = True if int(tc.max()) < CLEARED else tc != CLEARED
    kinds: list[pl.Series] = []
    windows: list[pl.Series] = []
    base = 0
    parts: list[tuple[Any, Any]] = []  # per table: (row -> cell, rows it sets)
    oor_counts: pl.DataFrame | None = None
    if covered:
        found = _dense_lookup(
            [(c, gi) for c, gi, _k, _w in meta_rows],
            [(k, w) for _c, _g, k, w in meta_rows],
            [cid, g],
            has_g,
        )
        if found is None:
            return None
        pos, known, cell_kind, cell_window = found
        if out_of_range is not None and known is not True:
            is_cov = np.zeros(int(cid.max()) + 1, dtype=bool)
            is_cov[[c for c in covered if c < len(is_cov)]] = True
            oor = (tc == STORED) & has_g & ~known & is_cov[cid]
            oor &= df["block_index"].to_numpy() == 0
            if oor.any():  # counted once the learned part cannot decline any more
                oor_counts = df["group_idx"].filter(pl.Series(oor)).value_counts()
        parts.append((pos, known & not_cleared))
        kinds.append(cell_kind)
        windows.append(cell_window)
        base = len(cell_kind)
    if learned_rows:
        ranks = np.zeros(int(cid.max()) + 1, dtype=np.int64)
        has_rank = np.zeros(len(ranks), dtype=bool)
        for c, ref in channels.items():
            if ref.info.dp_rank is not None and c < len(ranks):
                ranks[c] = ref.info.dp_rank
                has_rank[c] = True
        row_has = has_rank[cid]
        rank = ranks[cid]
        if not row_has.all():
            rank = np.where(row_has, rank, df["dp_rank"].fill_null(_NO_RANK).to_numpy())
        found = _dense_lookup(
            [(c, r, gi) for c, r, gi, _k, _w in learned_rows],
            [(k, w) for _c, _r, _g, k, w in learned_rows],
            [cid, rank, g],
            has_g,
        )
        if found is None:
            return None
        pos, known, cell_kind, cell_window = found
        nulls = df["kind"].null_count()
        if nulls != df.height:
            known = known & (df["kind"].is_null().to_numpy() if nulls else False)
        parts.append((pos + base if base else pos, known & not_cleared))
        kinds.append(cell_kind)
        windows.append(cell_window)
    if out_of_range is not None and oor_counts is not None:
        for gi, cnt in oor_counts.iter_rows():
            out_of_range[gi] = out_of_range.get(gi, 0) + cnt
    if not parts:
        return df
    if len(parts) == 1:
        pos, upd = parts[0]
    else:  # learned channels are never covered: the two never set one row
        (pos_m, upd_m), (pos_l, upd_l) = parts
        upd_l = np.broadcast_to(upd_l, cid.shape)
        pos = np.where(upd_l, pos_l, pos_m)
        upd = upd_m | upd_l
    if upd is False or (upd is not True and not upd.any()):
        return df
    if upd is not True and not upd.all():
        # Rows that keep their values gather them from behind the cells: one gather is
        # cheaper than a zip_with over every string.
        n_cells = sum(len(k) for k in kinds)
        pos = np.where(upd, pos, np.arange(n_cells, n_cells + len(upd)))
        kinds.append(df["kind"])
        windows.append(df["sliding_window"])
    cells = pl.DataFrame(
        [pl.concat(kinds).alias("kind"), pl.concat(windows).alias("sliding_window")]
    )
    return df.with_columns(cells[pl.Series(pos.astype(np.uint32))])  # a u32 row gather: fastest


def _dense_lookup(
    keys: list[tuple[int, ...]],
    vals: list[tuple[str | None, int | None]],
    cols: list[Any],
    has_g: Any,
) -> tuple[Any, Any, pl.Series, pl.Series] | None:
    """Each row's cell in a dense table over the keys' ranges, and whether it holds a value.

    Args:
        keys: The table's keys (channel, [rank,] group).
        vals: Their (kind, window).
        cols: The rows' key components (numpy arrays; the last one is the group).
        has_g: Rows whose group is not null (True: all).

    Returns:
        (row → cell as int64 array, rows whose cell holds a value (True: all), cells'
        kinds, cells' windows), or None when the table would be too large or a key repeats.
    """
    dims = len(cols)
    if not keys:
        lo, spans = [0] * dims, [1] * dims
    else:
        lo = [min(k[i] for k in keys) for i in range(dims)]
        spans = [max(k[i] for k in keys) - lo[i] + 1 for i in range(dims)]
    cells = 1
    for sp in spans:
        cells *= sp
    if cells > _DENSE_CELLS:
        return None
    tbl = np.full(cells, -1, dtype=np.int64)
    for n, key in enumerate(keys):
        pos = 0
        for i in range(dims):
            pos = pos * spans[i] + (key[i] - lo[i])
        if tbl[pos] != -1:
            return None  # a repeated key: the join's duplicate rows decide
        tbl[pos] = n
    filled = tbl >= 0
    vk = [vals[i][0] if i >= 0 else None for i in tbl.tolist()] if cells <= 4096 else None
    if vk is None:
        codes = pl.Series(np.where(filled, tbl, 0))
        cell_kind = pl.Series([k for k, _w in vals], dtype=pl.String).gather(codes)
        cell_window = pl.Series([w for _k, w in vals], dtype=pl.Int64).gather(codes)
    else:
        cell_kind = pl.Series(vk, dtype=pl.String)
        cell_window = pl.Series(
            [vals[i][1] if i >= 0 else None for i in tbl.tolist()], dtype=pl.Int64
        )
    filled &= cell_kind.is_not_null().to_numpy()  # a null kind sets nothing
    in_bounds = has_g is True and bool(keys)
    if in_bounds:
        for i in range(dims):
            if int(cols[i].min()) < lo[i] or int(cols[i].max()) > lo[i] + spans[i] - 1:
                in_bounds = False
                break
    pos_rows: Any = None
    ok: Any = True
    for i in range(dims):
        col = cols[i]
        if spans[i] == 1 and in_bounds:
            continue  # one value: adds nothing to the cell
        if not in_bounds:  # the bounds are keys, so int64 even for extreme groups
            hi = lo[i] + spans[i] - 1
            ok = ok & (col >= lo[i]) & (col <= hi)
            col = np.clip(col, lo[i], hi)
        part = col - lo[i] if lo[i] else col
        pos_rows = part if pos_rows is None else pos_rows * spans[i] + part
    if pos_rows is None:
        pos_rows = np.zeros(len(cols[0]), dtype=np.int64)
    pos_rows = pos_rows.astype(np.int64, copy=False)
    if in_bounds and filled.all():
        return pos_rows, True, cell_kind, cell_window
    known = filled[pos_rows]
    if ok is not True:
        known &= ok & has_g
    elif has_g is not True:
        known &= has_g
    return pos_rows, known, cell_kind, cell_window


def _annotate_join(
    df: pl.DataFrame,
    meta_rows: list[_MetaRow],
    learned_rows: list[_LearnedRow],
    covered: list[int],
    channels: dict[int, ChannelRef],
    out_of_range: dict[int, int] | None,
) -> pl.DataFrame:
    """:func:`annotate_table` by left joins on the composite keys (any key values)."""
    is_store = pl.col("type_code") == STORED
    if covered:
        meta = pl.DataFrame(meta_rows, schema=_META_SCHEMA, orient="row", strict=False)
        df = df.join(meta, on=["channel_id", "group_idx"], how="left", maintain_order="left")
        in_meta = pl.col("m_kind").is_not_null() & (pl.col("type_code") != CLEARED)
        if out_of_range is not None:
            oor = df.filter(
                is_store
                & pl.col("group_idx").is_not_null()
                & pl.col("m_kind").is_null()
                & pl.col("channel_id").is_in(covered)
                & (pl.col("block_index") == 0)
            )["group_idx"].value_counts()
            for g, n in oor.iter_rows():
                out_of_range[g] = out_of_range.get(g, 0) + n
        df = df.with_columns(
            kind=pl.when(in_meta).then(pl.col("m_kind")).otherwise(pl.col("kind")),
            sliding_window=pl.when(in_meta)
            .then(pl.col("m_window"))
            .otherwise(pl.col("sliding_window")),
        ).drop("m_kind", "m_window")
    if learned_rows:
        learned = pl.DataFrame(learned_rows, schema=_LEARNED_SCHEMA, orient="row", strict=False)
        df = df.with_columns(_rank=_rank_expr(channels)).join(
            learned, on=["channel_id", "_rank", "group_idx"], how="left", maintain_order="left"
        )
        use = (
            pl.col("kind").is_null()
            & pl.col("l_kind").is_not_null()
            & (pl.col("type_code") != CLEARED)
        )
        df = df.with_columns(
            kind=pl.when(use).then(pl.col("l_kind")).otherwise(pl.col("kind")),
            sliding_window=pl.when(use)
            .then(pl.col("l_window"))
            .otherwise(pl.col("sliding_window")),
        ).drop("_rank", "l_kind", "l_window")
    return df


def _rank_expr(channels: dict[int, ChannelRef]) -> pl.Expr:
    """The rank the annotation keys by (:func:`kvtool.annotate.event_rank`), as a column."""
    cids = [c for c, ref in channels.items() if ref.info.dp_rank is not None]
    ranks = [channels[c].info.dp_rank for c in cids]
    chan = pl.col("channel_id").replace_strict(cids, ranks, default=None, return_dtype=pl.Int64)
    return chan.fill_null(pl.col("dp_rank")).fill_null(_NO_RANK)


def learn_table(df: pl.DataFrame, channels: dict[int, ChannelRef]) -> GroupLearner:
    """The columnar learner adapter: what one chunk's annotated stores say (wire kinds).

    For a parallel reader: learn each chunk (any order, any process), combine with
    :meth:`kvtool.annotate.GroupLearner.merge`, resolve, then annotate each chunk with
    :func:`annotate_table`. Positions are merge positions (log_time, endpoint, topic,
    seq), so the result equals the one-pass learning of :func:`kvtool.inputs.learn`
    on channels without metadata (give it the chunk before annotation).

    Args:
        df: A chunk of :func:`iter_tables`, not annotated.
        channels: The read's channels by ``channel_id``.

    Returns:
        The chunk's learner.
    """
    learner = GroupLearner()
    ann = df.with_columns(dp_rank=_rank_expr(channels)).filter(
        (pl.col("type_code") == STORED)
        & pl.col("kind").is_not_null()
        & pl.col("group_idx").is_not_null()
        & (pl.col("block_index") == 0)
    )
    if ann.height == 0:
        return learner
    agg = (
        ann.sort("log_time", "seq", maintain_order=True)
        .group_by("channel_id", "dp_rank", "group_idx", "kind", "sliding_window")
        .agg(n=pl.len(), log_time=pl.col("log_time").first(), seq=pl.col("seq").first())
    )
    for cid, rank, g, k, w, n, t, seq in agg.iter_rows():
        ref = channels[cid]
        info = ref.info
        learner.observe_store(
            info.name,
            None if rank == _NO_RANK else rank,
            g,
            k,
            w,
            seq=seq,
            position=(t, info.endpoint, info.topic, seq),
            count=n,
        )
    return learner


@dataclass
class TableAnnotator:
    """Annotates table chunks with THE annotation of the input (:mod:`kvtool.annotate`).

    Chunks may come in any order: the annotation is resolved before the first chunk (a
    learning pass over the whole input, see :func:`kvtool.inputs.resolve_annotation`).

    Attributes:
        annotation: The resolved annotation.
        out_of_range: Stores per group index not in a given metadata table.
        report_mode: How the report's kernel reads parentless stores (``--report-mode``:
            ``auto``, ``full`` or ``incremental``; hit announcements, issue 21).
    """

    annotation: Annotation = field(default_factory=Annotation)
    out_of_range: dict[int, int] = field(default_factory=dict)
    _channels: dict[int, ChannelRef] = field(default_factory=dict)
    report_mode: str = "auto"

    @property
    def tables(self) -> dict[str, GroupTable | None]:
        """Recording path → the recording-wide metadata table in use (None: learned)."""
        out: dict[str, GroupTable | None] = {}
        for ref in self._channels.values():
            t = self.annotation.table_for(ref.info.name)
            if out.get(ref.recording) is None:
                out[ref.recording] = t
        return out

    @property
    def changes(self) -> set[tuple[int, int, KindWindow, KindWindow]]:
        """Deprecated (always empty): conflicts are in :meth:`findings`."""
        return set()

    def group_kind(
        self, channel_id: int, group_idx: int, event_index: int = 0, dp_rank: Any = _UNSET
    ) -> KindWindow | None:
        """Return (kind, window) of a group on a channel, as every command gives it.

        Args:
            channel_id: The channel.
            group_idx: The group.
            event_index: Ignored (kept for callers; the answer no longer depends on it).
            dp_rank: The events' rank; default: the channel's, else the single value
                learned for the group on any rank.

        Returns:
            From the channel's metadata, else learned, else None.
        """
        ref = self._channels.get(channel_id)
        if ref is None:
            return None
        ann = self.annotation
        table = ann.table_for(ref.info.name)
        if table is not None:
            info = table.lookup(group_idx)
            return (info.kind, info.sliding_window) if info is not None else None
        if dp_rank is not _UNSET:
            return ann.learned.get((ref.info.name, dp_rank, group_idx))
        got = ann.learned.get((ref.info.name, ref.info.dp_rank, group_idx))
        if got is not None:
            return got
        vals = {
            kw for (ch, _r, g), kw in ann.learned.items() if ch == ref.info.name and g == group_idx
        }
        return next(iter(vals)) if len(vals) == 1 else None

    def group_shape(self, channel_id: int, group_idx: int | None) -> tuple[int, bool]:
        """Return a group's block size and whether its channel has a Mamba group.

        From the channel's metadata (issue 21: partial entries, R2 of docs/SEMANTICS.md).

        Args:
            channel_id: The channel.
            group_idx: The group (None: none).

        Returns:
            (block size or 0, the metadata names a ``mamba`` group).
        """
        ref = self._channels.get(channel_id)
        if ref is None:
            return 0, False
        table = self.annotation.table_for(ref.info.name)
        if table is None:
            return 0, False
        info = table.lookup(group_idx) if group_idx is not None else None
        bs = info.block_size if info is not None and info.block_size else 0
        return bs, any(g.kind == "mamba" for g in table.groups.values())

    def group_indices(self, channel_id: int) -> tuple[int, ...] | None:
        """Return the group indices a channel's metadata names (None: no metadata).

        Args:
            channel_id: The channel.

        Returns:
            The indices, or None.
        """
        ref = self._channels.get(channel_id)
        if ref is None:
            return None
        table = self.annotation.table_for(ref.info.name)
        return None if table is None else tuple(sorted(table.groups))

    def sources(self) -> list[str]:
        """Return the metadata sources used, one per distinct source."""
        return self.annotation.sources()

    def findings(self, stats: ReadStats | None = None) -> list[str]:
        """Return the input-wide findings: same-batch copies and annotation conflicts.

        Args:
            stats: The read's stats (for the merge findings).

        Returns:
            One line each.
        """
        out = stats.merge.lines() if stats is not None else []
        if stats is not None:
            out.extend(stats.rank_findings())
        out.extend(c.describe() for c in self.annotation.conflicts)
        return out

    def adopt(self, stats: ReadStats, out_of_range: Iterable[dict[int, int]]) -> None:
        """Take over what other annotators saw (the units of a merged report).

        Args:
            stats: The merged read's stats (its channels).
            out_of_range: Each unit's stores per group index outside a given table.
        """
        self._channels.update(stats.channels)
        for part in out_of_range:
            for g, n in part.items():
                self.out_of_range[g] = self.out_of_range.get(g, 0) + n

    def __call__(self, df: pl.DataFrame, stats: ReadStats) -> pl.DataFrame:
        """Annotate one chunk.

        Args:
            df: A chunk from :func:`iter_tables`.
            stats: The read's stats (channels).

        Returns:
            The chunk with ``kind``/``sliding_window`` set where known.
        """
        self._channels.update(stats.channels)
        return annotate_table(df, self.annotation, stats.channels, self.out_of_range)


def make_annotator(
    recording_groups: dict[str, list[dict[str, object]] | None] | Sequence[str | os.PathLike[str]],
    *,
    groups_file: str | os.PathLike[str] | None = None,
    group_flags: Sequence[str] | None = None,
    report_mode: str = "auto",
) -> TableAnnotator:
    """Resolve THE annotation of the input (:func:`kvtool.inputs.resolve_annotation`).

    Args:
        recording_groups: The recordings: their paths, or :func:`recording_groups`'s
            result (its keys are the paths; the metadata is read again from the files,
            with the learning pass over the whole input when some channel has none).
        groups_file: ``--groups FILE``.
        group_flags: ``--group IDX=KIND[:WINDOW]`` flags.
        report_mode: ``--report-mode`` (:attr:`TableAnnotator.report_mode`).

    Returns:
        The annotator.

    Raises:
        MetadataError: Invalid metadata, or both a file and flags.
        RecordingError: A recording cannot be opened.
    """
    paths = list(recording_groups)
    return TableAnnotator(
        resolve_annotation(paths, groups_file=groups_file, group_flags=group_flags),
        report_mode=report_mode,
    )


def recording_groups(
    paths: Iterable[str | os.PathLike[str]],
) -> dict[str, list[dict[str, object]] | None]:
    """Read each recording's stored group metadata (cheap: headers only).

    Args:
        paths: Recordings.

    Returns:
        Path (as :func:`open_recording` names it) → the metadata list or None.

    Raises:
        RecordingError: A recording cannot be opened.
    """
    out: dict[str, list[dict[str, object]] | None] = {}
    for p in paths:
        with open_recording(p) as r:
            out[r.path] = r.groups
    return out


def iter_annotated(
    paths: Sequence[str | os.PathLike[str]],
    *,
    groups_file: str | os.PathLike[str] | None = None,
    group_flags: Sequence[str] | None = None,
    stats: ReadStats | None = None,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    annotator: TableAnnotator | None = None,
    select: BatchFilter | None = None,
    progress: Progress | None = None,
) -> Iterator[pl.DataFrame]:
    """Read and annotate: :func:`iter_tables` followed by a :class:`TableAnnotator`.

    Args:
        paths: Recordings.
        groups_file: ``--groups FILE``.
        group_flags: ``--group`` flags.
        stats: Receives counts and problems.
        chunk_bytes: Payload bytes per chunk.
        annotator: Use this annotator (default: :func:`make_annotator` of ``paths``).
        select: Keep only these batches (see :func:`iter_raw_chunks`).
        progress: Called with (bytes done, bytes total) of the input files.

    Yields:
        Annotated chunks.

    Raises:
        MetadataError: Invalid metadata.
        RecordingError: A recording cannot be opened.
    """
    st = stats if stats is not None else ReadStats()
    ann = annotator
    if ann is None:
        ann = make_annotator(paths, groups_file=groups_file, group_flags=group_flags)
    for df in iter_tables(
        paths, stats=st, chunk_bytes=chunk_bytes, select=select, progress=progress
    ):
        yield ann(df, st)


__all__ = [
    "CLEARED",
    "DEFAULT_CHUNK_BYTES",
    "EVENT_TYPE",
    "REMOVED",
    "STORED",
    "TABLE_SCHEMA",
    "UNANNOTATED",
    "UNATTRIBUTED",
    "ChannelRef",
    "DecodeMap",
    "DecodedChunk",
    "KvtoolError",
    "LeanBatch",
    "Progress",
    "RawChunk",
    "ReadPlan",
    "ReadStats",
    "ShardItem",
    "ShardMap",
    "TableAnnotator",
    "add_decoded",
    "annotate_table",
    "decode_chunk",
    "decode_lean",
    "empty_table",
    "hash_series",
    "iter_annotated",
    "iter_raw_chunks",
    "iter_tables",
    "learn_table",
    "make_annotator",
    "np",
    "prefetch",
    "read_shard",
    "read_table",
    "recording_groups",
    "token_counts",
]
