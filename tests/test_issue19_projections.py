"""Every event struct is generated from kvtool.schema's one field table (issue 19, item 1)."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import pickle

import msgspec
import pytest

from kvtool import projections, protocol, schema
from kvtool.projections import FULL, LEAN, LEARNER, STATUS, Spec

SPECS = (FULL, LEAN, STATUS, LEARNER)

# One future field of BlockStored (a new array layout puts it at position 12) that every
# projection reads, and one of map-encoded BlockRemoved that the full and lean ones read.
_FUTURE = (
    *schema.FIELDS,
    schema.EventField("future_idx", "int", 12, None, "future", frozenset(schema.PROJECTIONS)),
    schema.EventField(
        "future_tier", "str", None, None, "future", frozenset({"full", "lean"}), removed_map=True
    ),
)

_ENC = msgspec.msgpack.Encoder()


def _stored_array(future: object) -> list[object]:
    # tag, block_hashes, parent, token_ids, block_size, lora_id, medium, lora_name,
    # extra_keys, group_idx, kind, window, then the new position 12.
    return [
        "BlockStored",
        [1, 2],
        None,
        [5, 6],
        16,
        None,
        "GPU",
        None,
        None,
        0,
        "full",
        None,
        future,
    ]


def test_issue19_a_new_field_reaches_every_projection_that_lists_it() -> None:
    for spec in SPECS:
        structs = projections.build(spec, module=__name__, fields=_FUTURE)
        map_dec = msgspec.msgpack.Decoder(structs.map_union)  # type: ignore[call-overload]
        arr_dec = msgspec.msgpack.Decoder(structs.array_union)  # type: ignore[call-overload]
        stored = {"type": "BlockStored", "block_hashes": [1], "future_idx": 7, "future_tier": "T"}
        for ev in (
            map_dec.decode(_ENC.encode(stored)),
            arr_dec.decode(_ENC.encode(_stored_array(7))),
        ):
            assert ev.future_idx == 7, spec.name
        if spec.name in ("full", "lean"):
            assert map_dec.decode(_ENC.encode(stored)).future_tier == "T"
        else:
            assert "future_tier" not in structs.map[0].__struct_fields__
        # An int field of the table is refused outside int64 where the projection says so.
        for bad in ({**stored, "future_idx": 1 << 63}, _stored_array(1 << 63)):
            dec = arr_dec if isinstance(bad, list) else map_dec
            if spec.name == "status":
                assert dec.decode(_ENC.encode(bad)).future_idx == 1 << 63
            else:
                with pytest.raises(msgspec.ValidationError):
                    dec.decode(_ENC.encode(bad))
        removed = map_dec.decode(_ENC.encode({"type": "BlockRemoved", "future_tier": "T"}))
        if spec.name in ("full", "lean"):
            assert removed.future_tier == "T"
        else:
            assert not hasattr(removed, "future_tier")
        if spec.uniform:
            # Every lean/status struct answers every field the projection reads.
            for cls in (*structs.map, *structs.array):
                assert hasattr(cls, "future_idx") or "future_idx" in cls.__struct_fields__
    # Through the batch decoder, as the report's lean decoder uses it.
    lean = projections.build(LEAN, module=__name__, fields=_FUTURE)
    proj = protocol.BatchProjection("t", lean.map_union, lean.array_union, gc=False)
    hit = proj.decode(_ENC.encode([1.0, [_stored_array(9), ["AllBlocksCleared"]], 0]))
    assert hit is not None
    assert [getattr(e, "future_idx", "missing") for e in hit[0].events] == [9, None]
    assert [e.type_code for e in hit[0].events] == [0, 2]


def test_issue19_every_projection_is_the_tables() -> None:
    """The structs each decoder uses are the generated ones, with the table's fields."""
    from kvtool import columns, inputs
    from kvtool.capture import stats

    for union, spec in (
        (protocol._MapEvent, FULL),
        (columns._LEAN_STRUCTS.map_union, LEAN),
        (stats._STATUS.map_union, STATUS),
        (inputs._LEARN_STRUCTS.map_union, LEARNER),
    ):
        stored, removed, cleared = union.__args__  # type: ignore[attr-defined]
        assert set(stored.__struct_fields__) == set(schema.projection(spec.name, "stored"))
        assert set(removed.__struct_fields__) == set(schema.projection(spec.name, "removed"))
        assert cleared.__struct_fields__ == ()
    stored_arr = columns._LEAN_STRUCTS.array[0]
    assert stored_arr.__struct_fields__ == tuple(schema.array_index("stored"))
    # Bound in their modules under their own names: every one pickles.
    for structs in (
        protocol._STRUCTS,
        columns._LEAN_STRUCTS,
        stats._STATUS,
        inputs._LEARN_STRUCTS,
    ):
        for cls in (*structs.map, *structs.array):
            assert pickle.loads(pickle.dumps(cls())) == cls()
    vocab = columns._VOCAB_STRUCTS.map[0]
    assert pickle.loads(pickle.dumps(vocab(medium="GPU"))) == vocab(medium="GPU")


def test_issue19_the_type_checking_stubs_are_the_generated_structs() -> None:
    """protocol.py's TYPE_CHECKING classes (what mypy sees) name generated fields only, in
    their order, with their types and defaults."""
    tree = ast.parse(inspect.getsource(protocol))
    block = next(
        n
        for n in tree.body
        if isinstance(n, ast.If) and isinstance(n.test, ast.Name) and n.test.id == "TYPE_CHECKING"
    )
    ns = vars(protocol)
    seen = set()
    for cls in block.body:
        assert isinstance(cls, ast.ClassDef)
        real = ns[cls.name]
        fields = {f.name: f for f in msgspec.structs.fields(real)}
        stub = [s for s in cls.body if isinstance(s, ast.AnnAssign)]
        names = [s.target.id for s in stub]  # type: ignore[union-attr]
        order = [n for n in real.__struct_fields__ if n in names]
        assert names == order, cls.name
        for s in stub:
            f = fields[s.target.id]  # type: ignore[union-attr]
            assert eval(ast.unparse(s.annotation), ns) == f.type, f.name
            default = ast.unparse(s.value) if s.value is not None else ""
            if default == "msgspec.field(default_factory=list)":
                assert f.default_factory is list, f.name
            else:
                assert eval(default, ns) == f.default, f.name
        keywords = {k.arg: ast.literal_eval(k.value) for k in cls.keywords}
        config = real.__struct_config__
        assert (config.tag_field, config.tag, config.frozen) == (
            keywords["tag_field"],
            keywords["tag"],
            keywords.get("frozen", False),
        )
        seen.add(cls.name)
    assert seen == {"BlockStored", "BlockRemoved", "AllBlocksCleared"}


def test_issue19_specs_cover_every_wire_type() -> None:
    for spec in SPECS:
        assert set(spec.types) == set(schema.WIRE_TYPES), spec.name
        assert dataclasses.is_dataclass(spec) and isinstance(spec, Spec)
