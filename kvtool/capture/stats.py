"""A lean decode of a batch for the recorder's live status: event types, group_idx, kind.

Fields the status does not need are skipped as Raw (no allocation), so it costs a
fraction of a full decode. Anything it cannot read goes through ``decode_batch``; a
payload that fails both is still written, raw (the recorder counts it undecodable).
"""

from __future__ import annotations

import operator
from collections import Counter

from kvtool import projections
from kvtool.protocol import BatchProjection, decode_batch, event_type

# The status projection (kvtool.schema's "status" fields; kvtool.projections makes the
# structs): every struct answers group_idx and kv_cache_spec_kind, and carries type_code.
_STATUS = projections.build(
    projections.STATUS,
    module=__name__,
    names=("_SStored", "_SRemoved", "_SCleared"),
    array_names=("_SStoredA", "_SRemovedA", "_SClearedA"),
)
_SStored, _SRemoved, _SCleared = _STATUS.map
_SStoredA, _SRemovedA, _SClearedA = _STATUS.array
_STAT_KEY = operator.attrgetter("type_code", "group_idx", "kv_cache_spec_kind")

_STATS = BatchProjection("stats", _STATUS.map_union, _STATUS.array_union, gc=False)

# (type, group_idx, kind) per event; type 0 stored, 1 removed, 2 cleared
EvStat = tuple[int, int | None, str | None]
_CLEARED: EvStat = (2, None, None)


def event_count(raw: bytes) -> int | None:
    """Return the number of events a batch's header announces, or None if unsure.

    Reads the array header that follows the float ts of an array batch (every vLLM
    release); any other shape returns None (the caller decodes instead).
    """
    if len(raw) < 7 or raw[0] not in (0x92, 0x93):
        return None
    i = 10 if raw[1] == 0xCB else 6 if raw[1] == 0xCA else 0
    if not i or len(raw) <= i:
        return None
    b = raw[i]
    if 0x90 <= b <= 0x9F:
        return b & 0x0F
    if b == 0xDC and len(raw) >= i + 3:
        return int.from_bytes(raw[i + 1 : i + 3], "big")
    if b == 0xDD and len(raw) >= i + 5:
        return int.from_bytes(raw[i + 1 : i + 5], "big")
    return None


def stat_events(payload: bytes, seq: int) -> tuple[int, dict[EvStat, int]]:
    """Return ``(events, {(type, group_idx, kind): count})``; ProtocolError for garbage.

    Types are 0 (BlockStored), 1 (BlockRemoved), 2 (AllBlocksCleared).
    """
    hit = _STATS.decode(payload)
    if hit is not None:
        events = hit[0].events
        # Counted in C (attrgetter, Counter): no Python statement per event.
        return len(events), Counter(map(_STAT_KEY, events))
    agg: dict[EvStat, int] = {}
    get = agg.get
    full = decode_batch(payload, seq=seq)
    for e in full.events:
        t = event_type(e)
        key = (
            0 if t == "BlockStored" else 1 if t == "BlockRemoved" else 2,
            getattr(e, "group_idx", None),
            getattr(e, "kv_cache_spec_kind", None),
        )
        agg[key] = get(key, 0) + 1
    return len(full.events), agg
