"""THE one table of vLLM KV-event fields, from which every projection of an event is made.

Each field of ``BlockStored`` and ``BlockRemoved`` is one :class:`EventField` row: its
name, its msgpack type, its position in the array-encoded event of each type (vLLM <=
0.23; index 0 is the tag), the layout that added it (PROTOCOL.md) and the projections
that read it. The array positions of :mod:`kvtool.protocol`, the lean table decoder of
:mod:`kvtool.columns` and the numba scanner of :mod:`kvtool.scan` (field codes by name
and by array position) are generated from :data:`FIELDS`; a field a future vLLM sends is
one more row here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

WireType = Literal["hashes", "hash", "ints", "int", "str", "any"]
"""``hashes``: list of hash (int or bytes); ``hash``: one or nil; ``ints``: list of ints;
``int``/``str``: that or nil; ``any``: passed through, never validated."""

Projection = Literal["full", "lean", "status", "learner"]
"""``full``: :mod:`kvtool.protocol`'s structs (every field); ``lean``: the report's table
(:mod:`kvtool.columns`, :mod:`kvtool.scan`); ``status``: the recorder's live counts;
``learner``: what the annotation learns from (group, kind, window)."""


@dataclass(frozen=True)
class EventField:
    """One field of the wire events.

    Attributes:
        name: The field name (map key of map-encoded events).
        type: Its msgpack type (:data:`WireType`).
        stored: Position in an array-encoded ``BlockStored`` (None: not a field of it,
            or added after the last array layout).
        removed: Position in an array-encoded ``BlockRemoved`` (None: likewise).
        since: The layout (PROTOCOL.md) that added it.
        projections: The projections that read it.
    """

    name: str
    type: WireType
    stored: int | None
    removed: int | None
    since: str
    projections: frozenset[Projection]


def _f(
    name: str,
    type_: WireType,
    stored: int | None,
    removed: int | None,
    since: str,
    *projections: Projection,
) -> EventField:
    return EventField(name, type_, stored, removed, since, frozenset(("full", *projections)))


FIELDS: tuple[EventField, ...] = (
    _f("block_hashes", "hashes", 1, 1, "initial", "lean", "status"),
    _f("parent_block_hash", "hash", 2, None, "initial"),
    _f("token_ids", "ints", 3, None, "initial", "lean", "status"),
    _f("block_size", "any", 4, None, "initial"),
    _f("lora_id", "any", 5, None, "initial"),
    _f("medium", "str", 6, 2, "medium", "lean"),
    _f("lora_name", "any", 7, None, "lora_name"),
    _f("extra_keys", "any", 8, None, "extra_keys"),
    _f("group_idx", "int", 9, 3, "group_idx", "lean", "status", "learner"),
    _f("kv_cache_spec_kind", "str", 10, None, "spec_kind", "lean", "status", "learner"),
    _f("kv_cache_spec_sliding_window", "int", 11, None, "spec_kind", "lean", "learner"),
    _f("locality", "any", None, None, "map"),
    _f("ownership", "any", None, None, "map"),
    _f("session_id", "any", None, None, "map"),
    _f("lookahead_token_ids", "any", None, None, "map"),
    _f("cache_salt", "any", None, None, "map"),
)
"""Every event field, in ``BlockStored`` declaration order (removes: the same order)."""

REMOVED_MAP_FIELDS = ("block_hashes", "medium", "group_idx", "locality", "ownership")
"""The fields of a ``BlockRemoved`` (map-encoded events may carry the later ones)."""

LAYOUTS: dict[str, tuple[int, int]] = {
    "initial": (6, 2),
    "medium": (7, 3),
    "lora_name": (8, 3),
    "extra_keys": (9, 3),
    "group_idx": (10, 4),
    "spec_kind": (12, 4),
}
"""Array layouts: (BlockStored length, BlockRemoved length), tag included (PROTOCOL.md)."""

EVENT_TAGS = ("BlockStored", "BlockRemoved", "AllBlocksCleared")
"""The wire type tags, in the order of the table's ``type_code``."""


def array_index(event: Literal["stored", "removed"]) -> dict[str, int]:
    """Return field name → position in the array-encoded event (index 0 is the tag).

    Args:
        event: ``stored`` or ``removed``.

    Returns:
        The positions, in order.
    """
    out: dict[str, int] = {}
    for f in FIELDS:
        pos = f.stored if event == "stored" else f.removed
        if pos is not None:
            out[f.name] = pos
    return dict(sorted(out.items(), key=lambda kv: kv[1]))


def projection(name: Projection, event: Literal["stored", "removed"]) -> tuple[str, ...]:
    """Return the fields of one event type a projection reads, in declaration order.

    Args:
        name: The projection.
        event: ``stored`` or ``removed``.

    Returns:
        Field names.
    """
    names = [f.name for f in FIELDS if name in f.projections]
    if event == "removed":
        names = [n for n in names if n in REMOVED_MAP_FIELDS]
    return tuple(names)


__all__ = [
    "EVENT_TAGS",
    "FIELDS",
    "LAYOUTS",
    "REMOVED_MAP_FIELDS",
    "EventField",
    "Projection",
    "WireType",
    "array_index",
    "projection",
]
