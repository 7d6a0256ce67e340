"""The msgspec structs of every projection of an event, generated from :mod:`kvtool.schema`.

A projection is the set of fields one decoder reads (``EventField.projections``) and how it
decodes each wire type: :mod:`kvtool.protocol`'s full structs type every field; the
report's lean structs keep hashes and tokens as undecoded :class:`msgspec.Raw`; the
recorder's status and the learner read a few fields of stores. For each projection
:func:`build` makes six tagged structs: map-encoded events (vLLM >= 0.24) with the fields
they read (any other key is ignored), and array-encoded ones (older) with every position
up to the last field they read, the others skipped as ``Raw``. A field added to
:data:`kvtool.schema.FIELDS` reaches every projection that lists it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Literal

import msgspec

from kvtool import schema
from kvtool.schema import EventField, Projection, WireType

Hash = int | bytes
"""``ExternalBlockHash``: a 64-bit int (signed in old vLLM and SGLang) or raw sha256 bytes."""

Int64 = Annotated[int, msgspec.Meta(ge=-(1 << 63), le=(1 << 63) - 1)]
"""``group_idx`` and ``kv_cache_spec_sliding_window`` as every projection decodes them.

msgpack ints reach 2**64 - 1, but kvtool's table keeps these fields as int64: a value
outside int64 makes its event malformed (skipped and named, in every command alike),
never a null that would merge distinct groups (issue 24).
"""

EMPTY = msgspec.Raw(b"\x90")
"""An empty msgpack array: the default of a list kept as ``Raw``."""
NIL = msgspec.Raw(b"\xc0")
"""msgpack nil: the default of any other field kept as ``Raw``."""

LIST = object()
"""Default marker: a fresh empty list per struct."""

Decoded = tuple[object, object]
"""How a projection decodes one wire type: (annotation, default or :data:`LIST`)."""

_RAW_LIST: Decoded = (msgspec.Raw, EMPTY)
_RAW: Decoded = (msgspec.Raw, NIL)
_INT64: Decoded = (Int64 | None, None)
_STR: Decoded = (str | None, None)
_OBJECT: Decoded = (object, None)

EventKind = Literal["stored", "removed", "cleared"]
_KINDS: tuple[EventKind, ...] = ("stored", "removed", "cleared")


@dataclass(frozen=True)
class Spec:
    """How one projection decodes what it reads.

    Attributes:
        name: The projection (:data:`kvtool.schema.Projection`).
        types: Wire type → (annotation, default).
        frozen: Whether the structs are frozen.
        gc: Whether the structs are tracked by the GC.
        uniform: Whether every struct answers every field the projection reads (a field
            its event type lacks is a class attribute holding the default) and carries
            ``type_code`` (0 stored, 1 removed, 2 cleared), so that one ``attrgetter``
            reads any event.
        positional: Whether each array-encoded struct is its map-encoded one read
            positionally (a subclass, so ``isinstance`` holds for both encodings; every
            field declared) rather than the positions up to the last field read.
    """

    name: Projection
    types: Mapping[WireType, Decoded]
    frozen: bool = False
    gc: bool = True
    uniform: bool = False
    positional: bool = False


FULL = Spec(
    "full",
    {
        "hashes": (list[Hash], LIST),
        # Fields kvtool only passes through are typed loosely, so a value of an
        # unexpected type (SGLang's array layout has a {cache_salt} map at lora_name)
        # never costs the event: every command then sees the same events as the
        # report's lean decoder.
        "hash": _OBJECT,
        "ints": (list[object], LIST),
        "int": _INT64,
        "str": _STR,
        "any": _OBJECT,
    },
    frozen=True,
    positional=True,
)
LEAN = Spec(
    "lean",
    {"hashes": _RAW_LIST, "ints": _RAW_LIST, "int": _INT64, "str": _STR, "hash": _RAW, "any": _RAW},
    frozen=True,
    gc=False,
    uniform=True,
)
STATUS = Spec(
    "status",
    # The live status counts what was sent: any msgpack int is a group there.
    {
        "hashes": _RAW,
        "ints": _RAW,
        "int": (int | None, None),
        "str": _STR,
        "hash": _RAW,
        "any": _RAW,
    },
    gc=False,
    uniform=True,
)
LEARNER = Spec(
    "learner",
    {"hashes": _RAW, "ints": _RAW, "int": _INT64, "str": _STR, "hash": _RAW, "any": _OBJECT},
    gc=False,
)


@dataclass(frozen=True)
class Structs:
    """The generated structs of one projection.

    Attributes:
        map: Map-encoded ``BlockStored``, ``BlockRemoved``, ``AllBlocksCleared``.
        array: Array-encoded ones.
    """

    map: tuple[type[msgspec.Struct], type[msgspec.Struct], type[msgspec.Struct]]
    array: tuple[type[msgspec.Struct], type[msgspec.Struct], type[msgspec.Struct]]

    @property
    def map_union(self) -> object:
        """The union of the map-encoded structs (for a decoder)."""
        a, b, c = self.map
        return a | b | c

    @property
    def array_union(self) -> object:
        """The union of the array-encoded structs."""
        a, b, c = self.array
        return a | b | c


def _field(name: str, decoded: Decoded) -> tuple[str, object, object]:
    ann, default = decoded
    if default is LIST:
        return (name, ann, msgspec.field(default_factory=list))
    return (name, ann, default)


def build(
    spec: Spec,
    *,
    module: str,
    names: tuple[str, str, str] = schema.EVENT_TAGS,
    array_names: tuple[str, str, str] = (
        "_BlockStoredArray",
        "_BlockRemovedArray",
        "_AllBlocksClearedArray",
    ),
    overrides: Mapping[str, Decoded] | None = None,
    fields: tuple[EventField, ...] = schema.FIELDS,
) -> Structs:
    """Generate the structs of one projection from the field table.

    Args:
        spec: The projection.
        module: The ``__module__`` of the structs: bound there under ``names`` and
            ``array_names``, they can be pickled.
        names: Class names of the map-encoded structs.
        array_names: Class names of the array-encoded structs.
        overrides: Field name → (annotation, default) for the map-encoded structs,
            over the spec's type (e.g. a vocabulary of literals).
        fields: The field table (default: :data:`kvtool.schema.FIELDS`).

    Returns:
        The structs.
    """
    by_name = {f.name: f for f in fields}
    reads = {
        "stored": schema.projection(spec.name, "stored", fields),
        "removed": schema.projection(spec.name, "removed", fields),
        "cleared": (),
    }

    def decoded(name: str) -> Decoded:
        return spec.types[by_name[name].type]

    absent = {n: decoded(n)[1] for n in (*reads["stored"], *reads["removed"])}

    def namespace(code: int, present: set[str]) -> dict[str, object]:
        if not spec.uniform:
            return {}
        ns: dict[str, object] = {n: d for n, d in absent.items() if n not in present}
        ns["type_code"] = code
        return ns

    def make(
        name: str, tag: str, flds: list[tuple[str, object, object]], code: int, array: bool
    ) -> type[msgspec.Struct]:
        return msgspec.defstruct(
            name,
            flds,
            module=module,
            namespace=namespace(code, {f[0] for f in flds}),
            tag_field="type",
            tag=tag,
            frozen=spec.frozen,
            array_like=array,
            gc=spec.gc,
        )

    maps: list[type[msgspec.Struct]] = []
    arrays: list[type[msgspec.Struct]] = []
    rows = zip(_KINDS, schema.EVENT_TAGS, names, array_names, strict=True)
    for code, (kind, tag, name, array_name) in enumerate(rows):
        positions = {} if kind == "cleared" else schema.array_index(kind, fields)
        # Declared in array order, then the map-only fields in table order: the full
        # array structs read their fields positionally in declaration order.
        wanted = sorted(reads[kind], key=lambda n: positions.get(n, len(positions) + 1))
        over = overrides or {}
        maps.append(
            make(name, tag, [_field(n, over.get(n) or decoded(n)) for n in wanted], code, False)
        )
        if spec.positional:
            arrays.append(
                msgspec.defstruct(
                    array_name,
                    [],
                    bases=(maps[-1],),
                    module=module,
                    tag_field="type",
                    tag=tag,
                    frozen=spec.frozen,
                    array_like=True,
                    gc=spec.gc,
                )
            )
            continue
        last = max((positions[n] for n in wanted if n in positions), default=0)
        flds = [
            _field(n, decoded(n) if n in wanted else _RAW)
            for n, pos in positions.items()
            if pos <= last
        ]
        arrays.append(make(array_name, tag, flds, code, True))
    return Structs((maps[0], maps[1], maps[2]), (arrays[0], arrays[1], arrays[2]))


__all__ = [
    "EMPTY",
    "FULL",
    "LEAN",
    "LEARNER",
    "NIL",
    "STATUS",
    "Hash",
    "Int64",
    "Spec",
    "Structs",
    "build",
]
