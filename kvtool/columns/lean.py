"""The msgspec path's decoder: the lean projection, a block of payloads at a time.

Payloads are decoded with a lean msgspec decoder that keeps only the fields the table
needs (``block_hashes`` and ``token_ids`` stay :class:`msgspec.Raw`; fields the table does
not use are skipped; known media and kinds come back as shared strings). A batch the lean
decoder refuses goes through :func:`kvtool.protocol.decode_batch`, the one decoder that
defines what a payload means (unknown event types and malformed events are skipped and
counted there), so both give the same rows for every layout in PROTOCOL.md.
"""

from __future__ import annotations

from collections import Counter
from itertools import compress
from typing import TYPE_CHECKING, Any, Literal

import msgspec

from kvtool import projections, protocol
from kvtool.annotate import KINDS
from kvtool.columns.base import RawChunk, ReadStats, _key
from kvtool.columns.hashes import _RAW_ENC, _array_header, _hash_or_none, _int64_or_none
from kvtool.errors import ProtocolError

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
