"""Issues 19/20: the what-if's msgspec structs are generated from kvtool.schema's one table."""

from __future__ import annotations

import pickle

import msgspec

from kvtool import projections, schema
from kvtool.report.whatif import lean

_ENC = msgspec.msgpack.Encoder()


def test_the_whatif_structs_are_the_tables_whatif_fields() -> None:
    stored, removed, cleared = lean._STRUCTS.map
    assert set(stored.__struct_fields__) == set(schema.projection("whatif", "stored"))
    assert set(removed.__struct_fields__) == set(schema.projection("whatif", "removed"))
    assert cleared.__struct_fields__ == ()
    # Array-encoded stores: every position up to the last what-if field, in array order.
    assert lean._STRUCTS.array[0].__struct_fields__ == tuple(schema.array_index("stored"))
    assert lean._STRUCTS.array[1].__struct_fields__ == tuple(schema.array_index("removed"))
    # Every struct answers every field the replay reads, and pickles.
    wanted = {*schema.projection("whatif", "stored"), *schema.projection("whatif", "removed")}
    for cls in (*lean._STRUCTS.map, *lean._STRUCTS.array):
        assert all(hasattr(cls(), n) for n in wanted), cls.__name__
        assert pickle.loads(pickle.dumps(cls())) == cls()
        assert lean.CODES[cls] == cls.type_code  # type: ignore[attr-defined]


def test_a_new_whatif_field_is_one_row_of_the_table() -> None:
    future = (
        *schema.FIELDS,
        schema.EventField("future_idx", "int", 12, None, "future", frozenset({"full", "whatif"})),
    )
    structs = projections.build(lean.WHATIF, module=__name__, fields=future)
    ev = msgspec.msgpack.Decoder(structs.map_union).decode(  # type: ignore[call-overload]
        _ENC.encode({"type": "BlockStored", "block_hashes": [1], "future_idx": 7})
    )
    assert ev.future_idx == 7
    arr = ["BlockStored", [1], None, [5], 16, None, "GPU", None, None, 0, "full", None, 9]
    ev = msgspec.msgpack.Decoder(structs.array_union).decode(  # type: ignore[call-overload]
        _ENC.encode(arr)
    )
    assert ev.future_idx == 9
    assert not hasattr(structs.map[1](), "medium")  # not a what-if field


def test_lean_decode_reads_map_and_array_layouts_alike() -> None:
    hashes = [1, b"\x00" * 24 + (2).to_bytes(8, "big")]
    as_map = [
        1.0,
        [
            {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": None,
             "token_ids": [1, 2, 3], "block_size": 16, "group_idx": 1,
             "kv_cache_spec_kind": "sliding_window", "kv_cache_spec_sliding_window": 512},
            {"type": "BlockRemoved", "block_hashes": [1], "group_idx": 1},
            {"type": "AllBlocksCleared"},
        ],
        0,
    ]  # fmt: skip
    as_array = [
        1.0,
        [
            ["BlockStored", hashes, None, [1, 2, 3], 16, None, "GPU", None, None, 1,
             "sliding_window", 512],
            ["BlockRemoved", [1], "GPU", 1],
            ["AllBlocksCleared"],
        ],
        0,
    ]  # fmt: skip
    fields = ("group_idx", "parent_block_hash", "block_size", "kv_cache_spec_kind")
    seen = []
    for batch in (as_map, as_array):
        rank, events = lean.decode(_ENC.encode(batch), 1)
        assert rank == 0
        seen.append(
            [
                (lean.CODES[type(e)], bytes(e.block_hashes), *(getattr(e, f) for f in fields))  # type: ignore[attr-defined]
                for e in events
            ]
        )
    assert seen[0] == seen[1]
    assert [row[0] for row in seen[0]] == [lean.CODE_STORE, lean.CODE_REMOVE, lean.CODE_CLEAR]


def test_a_group_idx_outside_int64_is_skipped_as_the_report_skips_it() -> None:
    """The table's int fields are int64 in every projection (issue 24): such an event is
    malformed, the batch takes protocol's decoder, which skips it and keeps the rest."""
    batch = [
        1.0,
        [
            {"type": "BlockRemoved", "block_hashes": [1], "group_idx": (1 << 64) - 1},
            {"type": "BlockRemoved", "block_hashes": [2], "group_idx": 0},
        ],
        None,
    ]
    _rank, events = lean.decode(_ENC.encode(batch), 1)
    assert [e.group_idx for e in events] == [0]  # type: ignore[attr-defined]
