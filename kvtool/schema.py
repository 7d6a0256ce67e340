"""THE one table of vLLM KV-event fields, from which every projection of an event is made.

Each field of ``BlockStored`` and ``BlockRemoved`` is one :class:`EventField` row: its
name, its msgpack type, its position in the array-encoded event of each type (vLLM <=
0.23; index 0 is the tag), the layout that added it (PROTOCOL.md) and the projections
that read it. Every msgspec struct of an event is generated from :data:`FIELDS` by
:mod:`kvtool.projections` (protocol's full structs, the report's lean projection, the
recorder's status projection, the learner's, the what-if's), and so are the array
positions of :mod:`kvtool.protocol` and the field codes of the numba scanner
(:mod:`kvtool.scan`); a field a future vLLM sends is one more row here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

WireType = Literal["hashes", "hash", "ints", "int", "str", "any"]
"""``hashes``: list of hash (int or bytes); ``hash``: one or nil; ``ints``: list of ints;
``int``/``str``: that or nil; ``any``: passed through, never validated."""

WIRE_TYPES: tuple[WireType, ...] = get_args(WireType)

Projection = Literal["full", "lean", "status", "learner", "whatif"]
"""``full``: :mod:`kvtool.protocol`'s structs (every field); ``lean``: the report's table
(:mod:`kvtool.columns`, :mod:`kvtool.scan`); ``status``: the recorder's live counts
(:mod:`kvtool.capture.stats`); ``learner``: what the annotation learns from, of stores
only (:mod:`kvtool.inputs`); ``whatif``: the what-if replay's msgspec fallback
(:mod:`kvtool.report.whatif.lean`)."""

PROJECTIONS: tuple[Projection, ...] = get_args(Projection)


@dataclass(frozen=True)
class EventField:
    """One field of the wire events.

    Attributes:
        name: The field name (map key of map-encoded events).
        type: Its msgpack type (:data:`WireType`).
        stored: Position in an array-encoded ``BlockStored`` (None: added after the last
            array layout; every field is a field of ``BlockStored``).
        removed: Position in an array-encoded ``BlockRemoved`` (None: not in its array).
        since: The layout (PROTOCOL.md) that added it.
        projections: The projections that read it.
        removed_map: Also a field of a map-encoded ``BlockRemoved`` though not of its array.
    """

    name: str
    type: WireType
    stored: int | None
    removed: int | None
    since: str
    projections: frozenset[Projection]
    removed_map: bool = False

    @property
    def on_removed(self) -> bool:
        """Whether ``BlockRemoved`` has this field."""
        return self.removed is not None or self.removed_map


def _f(
    name: str,
    type_: WireType,
    stored: int | None,
    removed: int | None,
    since: str,
    *projections: Projection,
    removed_map: bool = False,
) -> EventField:
    projs = frozenset(("full", *projections))
    return EventField(name, type_, stored, removed, since, projs, removed_map)


FIELDS: tuple[EventField, ...] = (
    _f("block_hashes", "hashes", 1, 1, "initial", "lean", "whatif"),
    _f("parent_block_hash", "hash", 2, None, "initial", "lean", "whatif"),
    _f("token_ids", "ints", 3, None, "initial", "lean", "whatif"),
    _f("block_size", "any", 4, None, "initial", "lean", "learner", "whatif"),
    _f("lora_id", "any", 5, None, "initial"),
    _f("medium", "str", 6, 2, "medium", "lean"),
    _f("lora_name", "any", 7, None, "lora_name"),
    _f("extra_keys", "any", 8, None, "extra_keys"),
    _f("group_idx", "int", 9, 3, "group_idx", "lean", "status", "learner", "whatif"),
    _f("kv_cache_spec_kind", "str", 10, None, "spec_kind", "lean", "status", "learner", "whatif"),
    _f("kv_cache_spec_sliding_window", "int", 11, None, "spec_kind", "lean", "learner", "whatif"),
    _f("locality", "any", None, None, "map", removed_map=True),
    _f("ownership", "any", None, None, "map", removed_map=True),
    _f("session_id", "any", None, None, "map"),
    _f("lookahead_token_ids", "any", None, None, "map"),
    _f("cache_salt", "any", None, None, "map"),
    # vllm-project/vllm#51699 (proposed): "NEW" (cache_full_blocks) or "REUSED" (a hit
    # announced by emit_cached_block_events under kv_cache_report_mode="full").
    # Not in the full projection (yet): protocol's structs, and every command printing
    # their fields (replay, export), stay as they were until vLLM merges it.
    EventField("origin", "str", None, None, "map", frozenset({"lean"})),
)
"""Every event field, in ``BlockStored`` declaration order (removes: the same order;
:mod:`kvtool.projections` declares fields with an array position first, in its order)."""

REMOVED_MAP_FIELDS = tuple(f.name for f in FIELDS if f.on_removed)
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


def array_index(
    event: Literal["stored", "removed"], fields: tuple[EventField, ...] = FIELDS
) -> dict[str, int]:
    """Return field name → position in the array-encoded event (index 0 is the tag).

    Args:
        event: ``stored`` or ``removed``.
        fields: The field table (default: :data:`FIELDS`).

    Returns:
        The positions, in order.
    """
    out: dict[str, int] = {}
    for f in fields:
        pos = f.stored if event == "stored" else f.removed
        if pos is not None:
            out[f.name] = pos
    return dict(sorted(out.items(), key=lambda kv: kv[1]))


def event_fields(
    event: Literal["stored", "removed"], fields: tuple[EventField, ...] = FIELDS
) -> tuple[EventField, ...]:
    """Return the fields of one event type, in declaration order.

    Args:
        event: ``stored`` or ``removed``.
        fields: The field table (default: :data:`FIELDS`).

    Returns:
        The rows.
    """
    return tuple(f for f in fields if event == "stored" or f.on_removed)


def projection(
    name: Projection, event: Literal["stored", "removed"], fields: tuple[EventField, ...] = FIELDS
) -> tuple[str, ...]:
    """Return the fields of one event type a projection reads, in declaration order.

    The learner reads stores only (a remove or clear teaches it nothing).

    Args:
        name: The projection.
        event: ``stored`` or ``removed``.
        fields: The field table (default: :data:`FIELDS`).

    Returns:
        Field names.
    """
    if name == "learner" and event == "removed":
        return ()
    return tuple(f.name for f in event_fields(event, fields) if name in f.projections)


__all__ = [
    "EVENT_TAGS",
    "FIELDS",
    "LAYOUTS",
    "PROJECTIONS",
    "REMOVED_MAP_FIELDS",
    "WIRE_TYPES",
    "EventField",
    "Projection",
    "WireType",
    "array_index",
    "event_fields",
    "projection",
]
