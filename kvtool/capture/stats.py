"""A lean decode of a batch for the recorder's live status: event types, group_idx, kind.

Fields the status does not need are skipped as Raw (no allocation), so it costs a
fraction of a full decode. Anything it cannot read goes through ``decode_batch``; a
payload that fails both is still written, raw (the recorder counts it undecodable).
"""

from __future__ import annotations

import operator
from collections import Counter
from typing import ClassVar

import msgspec

from kvtool.protocol import BatchProjection, decode_batch, event_type


class _SStored(msgspec.Struct, tag_field="type", tag="BlockStored", gc=False):
    code: ClassVar[int] = 0
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None


class _SRemoved(msgspec.Struct, tag_field="type", tag="BlockRemoved", gc=False):
    code: ClassVar[int] = 1
    group_idx: int | None = None
    kv_cache_spec_kind: ClassVar[None] = None


class _SCleared(msgspec.Struct, tag_field="type", tag="AllBlocksCleared", gc=False):
    code: ClassVar[int] = 2
    group_idx: ClassVar[None] = None
    kv_cache_spec_kind: ClassVar[None] = None


def _raw() -> msgspec.Raw:
    return msgspec.Raw()


class _SStoredA(msgspec.Struct, array_like=True, tag_field="type", tag="BlockStored", gc=False):
    code: ClassVar[int] = 0
    f1: msgspec.Raw = msgspec.field(default_factory=_raw)
    f2: msgspec.Raw = msgspec.field(default_factory=_raw)
    f3: msgspec.Raw = msgspec.field(default_factory=_raw)
    f4: msgspec.Raw = msgspec.field(default_factory=_raw)
    f5: msgspec.Raw = msgspec.field(default_factory=_raw)
    f6: msgspec.Raw = msgspec.field(default_factory=_raw)
    f7: msgspec.Raw = msgspec.field(default_factory=_raw)
    f8: msgspec.Raw = msgspec.field(default_factory=_raw)
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None


class _SRemovedA(msgspec.Struct, array_like=True, tag_field="type", tag="BlockRemoved", gc=False):
    code: ClassVar[int] = 1
    f1: msgspec.Raw = msgspec.field(default_factory=_raw)
    f2: msgspec.Raw = msgspec.field(default_factory=_raw)
    group_idx: int | None = None
    kv_cache_spec_kind: ClassVar[None] = None


class _SClearedA(
    msgspec.Struct, array_like=True, tag_field="type", tag="AllBlocksCleared", gc=False
):
    code: ClassVar[int] = 2
    group_idx: ClassVar[None] = None
    kv_cache_spec_kind: ClassVar[None] = None


_STAT_KEY = operator.attrgetter("code", "group_idx", "kv_cache_spec_kind")

_SMap = _SStored | _SRemoved | _SCleared
_SArr = _SStoredA | _SRemovedA | _SClearedA


_STATS = BatchProjection("stats", _SMap, _SArr, gc=False)

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
