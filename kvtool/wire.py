"""Annotation on the wire: vLLM's ``take_events`` rule applied to a payload's bytes.

:func:`annotate_payload` patches the kind and window of the stores the rule
(:func:`kvtool.annotate.annotation_for`) annotates and keeps every other byte as it
was; ``replay --publish --annotate`` sends what it returns.
"""

from __future__ import annotations

import msgspec

from kvtool.annotate import ChannelRule, GroupTable, KindWindow, annotation_for
from kvtool.protocol import STORED_ARRAY_INDEX

_ANY = msgspec.msgpack.Decoder()
_ENC = msgspec.msgpack.Encoder()
_KIND_I = STORED_ARRAY_INDEX["kv_cache_spec_kind"]
_WINDOW_I = STORED_ARRAY_INDEX["kv_cache_spec_sliding_window"]
_GROUP_I = STORED_ARRAY_INDEX["group_idx"]
_LAST_ARRAY_LEN = _WINDOW_I + 1  # 12: tag + 11 fields, the last array layout
# Field order of a map-encoded BlockStored (msgspec writes the tag first, then fields in
# declaration order, omitting defaulted ones): keeps re-encoded maps in vLLM's order.
_MAP_ORDER = {
    name: i
    for i, name in enumerate(
        [
            "type",
            "block_hashes",
            "parent_block_hash",
            "token_ids",
            "block_size",
            "lora_id",
            "medium",
            "lora_name",
            "extra_keys",
            "group_idx",
            "kv_cache_spec_kind",
            "kv_cache_spec_sliding_window",
            "locality",
            "ownership",
            "session_id",
            "lookahead_token_ids",
        ]
    )
}


def _patch_map(ev: dict[object, object], info: KindWindow) -> bool:
    kind, window = info
    if (
        ev.get("kv_cache_spec_kind") == kind
        and ev.get("kv_cache_spec_sliding_window") == window
        and ("kv_cache_spec_sliding_window" in ev) == (window is not None)
    ):
        return False
    ev["kv_cache_spec_kind"] = kind
    if window is None:
        # vLLM omits defaulted fields in map events (omit_defaults=True).
        ev.pop("kv_cache_spec_sliding_window", None)
    else:
        ev["kv_cache_spec_sliding_window"] = window
    items = sorted(
        ev.items(),
        key=lambda kv: _MAP_ORDER.get(kv[0], len(_MAP_ORDER)),  # type: ignore[call-overload]
    )
    ev.clear()
    ev.update(items)
    return True


def _patch_array(ev: list[object], info: KindWindow) -> bool:
    kind, window = info
    if len(ev) > _WINDOW_I and ev[_KIND_I] == kind and ev[_WINDOW_I] == window:
        return False
    if len(ev) < _LAST_ARRAY_LEN:
        ev.extend([None] * (_LAST_ARRAY_LEN - len(ev)))
    ev[_KIND_I] = kind
    ev[_WINDOW_I] = window
    return True


_TOP = msgspec.msgpack.Decoder(list[msgspec.Raw] | dict[str, msgspec.Raw])
_RAW_LIST = msgspec.msgpack.Decoder(list[msgspec.Raw])


def _encode_map(ev: dict[object, object], map16: bool) -> bytes:
    # msgspec writes a Struct with omit_defaults under a map16 header whatever its size;
    # keep the header style the event was recorded with so the bytes stay vLLM's.
    if not map16:
        return _ENC.encode(ev)
    n = len(ev)
    parts = [b"\xde" + n.to_bytes(2, "big")]
    for k, v in ev.items():
        parts.append(_ENC.encode(k))
        parts.append(_ENC.encode(v))
    return b"".join(parts)


def _annotate_raw_event(
    raw: msgspec.Raw, rule: GroupTable | ChannelRule, bad: list[int]
) -> msgspec.Raw | None:
    """The wire adapter: patch one raw event by the rule; its new bytes, or None."""
    view = memoryview(raw)
    if not len(view):
        return None
    first = view[0]
    ev = _ANY.decode(raw)
    if isinstance(ev, dict):
        decision = annotation_for(
            str(ev.get("type")),
            ev.get("group_idx"),
            rule,
            ev.get("kv_cache_spec_kind"),
            ev.get("kv_cache_spec_sliding_window"),
        )
        if isinstance(decision, tuple):
            if _patch_map(ev, decision):
                return msgspec.Raw(_encode_map(ev, first == 0xDE))
        elif decision is not None:
            bad.append(decision)
    elif isinstance(ev, list) and ev:
        group = ev[_GROUP_I] if len(ev) > _GROUP_I else None
        kind = ev[_KIND_I] if len(ev) > _KIND_I else None
        window = ev[_WINDOW_I] if len(ev) > _WINDOW_I else None
        decision = annotation_for(str(ev[0]), group, rule, kind, window)
        if isinstance(decision, tuple):
            if _patch_array(ev, decision):
                return msgspec.Raw(_ENC.encode(ev))
        elif decision is not None:
            bad.append(decision)
    return None


def annotate_payload(payload: bytes, table: GroupTable | ChannelRule) -> tuple[bytes, list[int]]:
    """Annotate a payload on the wire, re-encoding it in the layout it was recorded in.

    Each ``BlockStored`` is patched by the same rule as :func:`kvtool.annotate.annotate`
    (:func:`kvtool.annotate.annotation_for`, or the :class:`kvtool.annotate.ChannelRule`
    a replay hands out per channel and rank). Only the events the rule changes are
    re-encoded (decoded generically, so every field, known or not, survives); every
    other byte is kept. Map events stay maps (kind and window keys in vLLM's field order,
    a None window omitted as vLLM does, the same map header), array events stay arrays
    (extended to the 12-element last array layout when shorter). A payload the rule does
    not change is returned as the same bytes.

    Args:
        payload: The recorded msgpack payload.
        table: The group metadata, or the rule of the payload's channel and rank.

    Returns:
        The payload to send, and the out-of-range group indices met (one per store).
    """
    try:
        top = _TOP.decode(payload)
        if isinstance(top, list):
            if len(top) < 2:
                return payload, []
            raw_events = top[1]
        else:
            raw_events = top.get("events")  # type: ignore[assignment]
            if raw_events is None:
                return payload, []
        events = _RAW_LIST.decode(raw_events)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return payload, []
    changed = False
    bad: list[int] = []
    for i, raw in enumerate(events):
        try:
            patched = _annotate_raw_event(raw, table, bad)
        except (msgspec.MsgspecError, TypeError, ValueError, RecursionError):
            # An event the generic codec cannot round-trip is sent as recorded.
            continue
        if patched is not None:
            events[i] = patched
            changed = True
    if not changed:
        return payload, bad
    new_events = msgspec.Raw(_ENC.encode(events))
    if isinstance(top, list):
        top[1] = new_events
        return _ENC.encode(top), bad
    top["events"] = new_events
    return _ENC.encode(top), bad


__all__ = ["annotate_payload"]
