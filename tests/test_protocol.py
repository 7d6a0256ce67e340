"""Decoding every real vLLM capture, and every layout of PROTOCOL.md."""

from __future__ import annotations

from collections import Counter

import msgspec
import pytest

from kvtool.errors import ProtocolError
from kvtool.protocol import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    decode_batch,
    event_to_builtins,
    event_type,
    hash_key,
    peek_ts,
)
from tests.conftest import capture_messages, capture_truth


def test_capture_matches_truth(capture: str) -> None:
    truth = capture_truth(capture)
    msgs = capture_messages(capture)
    assert len(msgs) == truth["num_batches"]
    types: Counter[str] = Counter()
    blocks = tokens = 0
    by_kind: Counter[tuple[str | None, int | None]] = Counter()
    for _topic, seq, payload in msgs:
        batch = decode_batch(payload, seq=seq)
        assert batch.skipped == ()
        for ev in batch.events:
            types[event_type(ev)] += 1
            if isinstance(ev, BlockStored):
                blocks += len(ev.block_hashes)
                tokens += len(ev.token_ids)
                by_kind[(ev.kv_cache_spec_kind, ev.kv_cache_spec_sliding_window)] += len(
                    ev.block_hashes
                )
    assert dict(types) == truth["events_by_type"]
    assert blocks == truth["block_stored"]["total"]["blocks"]
    assert tokens == truth["block_stored"]["total"]["tokens"]
    if (
        "legacy_fields" in truth["wire"]
        and truth["wire"]["legacy_fields"]
        and ("kv_cache_spec_kind" not in truth["wire"]["legacy_fields"]["stored"])
    ):
        assert set(by_kind) == {(None, None)}
    else:
        expect = {
            (r["kind"], r["sliding_window"]): r["blocks"]
            for r in truth["block_stored"]["by_kind_window"]
        }
        assert dict(by_kind) == expect


def _enc(obj: object) -> bytes:
    return msgspec.msgpack.encode(obj)


@pytest.mark.parametrize(
    ("stored", "removed", "batch_rank"),
    [
        (["BlockStored", [1, -2], None, [1, 2, 3], 16, None], ["BlockRemoved", [1]], False),
        (["BlockStored", [1, -2], None, [1, 2, 3], 16, None], ["BlockRemoved", [1]], True),
        (["BlockStored", [1], 7, [1], 16, None, "GPU"], ["BlockRemoved", [1], "GPU"], True),
        (["BlockStored", [1], 7, [1], 16, None, "GPU", None], ["BlockRemoved", [1], "GPU"], True),
        (
            ["BlockStored", [1], 7, [1], 16, None, "GPU", "l", [None]],
            ["BlockRemoved", [1], "GPU"],
            True,
        ),
        (
            ["BlockStored", [1], 7, [1], 16, None, "GPU", None, [None], 2],
            ["BlockRemoved", [1], "GPU", 2],
            True,
        ),
        (
            ["BlockStored", [1], 7, [1], 16, None, "GPU", None, [None], 2, "sliding_window", 64],
            ["BlockRemoved", [1], "GPU", 2],
            True,
        ),
    ],
    ids=["initial", "+rank", "+medium", "+lora_name", "+extra_keys", "+group_idx", "+kind"],
)
def test_every_array_layout(stored: list, removed: list, batch_rank: bool) -> None:
    batch = [1.5, [stored, removed, ["AllBlocksCleared"]]] + ([3] if batch_rank else [])
    out = decode_batch(_enc(batch))
    assert out.event_encoding == "array"
    st, rm, cl = out.events
    assert isinstance(st, BlockStored) and st.block_hashes == stored[1]
    assert st.block_size == 16
    assert isinstance(rm, BlockRemoved) and rm.block_hashes == [1]
    assert isinstance(cl, AllBlocksCleared)
    assert out.data_parallel_rank == (3 if batch_rank else None)
    if len(stored) >= 10:
        assert st.group_idx == 2 and rm.group_idx == 2
    if len(stored) == 12:
        assert st.kv_cache_spec_kind == "sliding_window"
        assert st.kv_cache_spec_sliding_window == 64


def test_map_batch_map_events_unknown_fields_and_bytes_hashes() -> None:
    h = bytes(range(32))
    payload = _enc(
        {
            "ts": 2,
            "events": [
                {
                    "type": "BlockStored",
                    "block_hashes": [h],
                    "parent_block_hash": None,
                    "token_ids": [1],
                    "block_size": 16,
                    "lora_id": None,
                    "medium": "GPU",
                    "lora_name": None,
                    "future_field": {"x": 1},
                    "group_idx": 0,
                    "kv_cache_spec_kind": "brand_new_kind",
                },
            ],
            "data_parallel_rank": None,
        }
    )
    out = decode_batch(payload)
    (st,) = out.events
    assert isinstance(st, BlockStored)
    assert st.block_hashes == [h] and st.kv_cache_spec_kind == "brand_new_kind"
    assert out.batch_encoding == "map"
    assert event_to_builtins(st)["block_hashes"] == [h.hex()]
    assert hash_key(h) == int.from_bytes(h[-8:], "big", signed=True)


def test_unknown_event_type_is_skipped_and_neighbours_kept() -> None:
    payload = _enc(
        [
            1.0,
            [
                {"type": "BlockRemoved", "block_hashes": [5], "medium": None},
                {"type": "BlockMoved", "block_hashes": [5]},
                {"type": "BlockRemoved", "block_hashes": "oops", "medium": None},
                {"type": "AllBlocksCleared"},
            ],
            0,
        ]
    )
    out = decode_batch(payload, seq=42)
    assert [event_type(e) for e in out.events] == ["BlockRemoved", "AllBlocksCleared"]
    assert len(out.skipped) == 2
    assert out.skipped[0] == "seq 42: event 1: unknown event type 'BlockMoved'"
    assert out.skipped[1].startswith("seq 42: event 2: malformed BlockRemoved")


@pytest.mark.parametrize(
    "payload",
    [b"", b"\xc1", b"\x92\xa1x\x90", _enc([1.0]), _enc({"events": []}), _enc("str"), b"\x93\xcb"],
)
def test_malformed_payload_raises_protocol_error_with_seq(payload: bytes) -> None:
    with pytest.raises(ProtocolError, match=r"^seq 7: malformed payload") as info:
        decode_batch(payload, seq=7)
    assert info.value.seq == 7


def test_peek_ts() -> None:
    assert peek_ts(_enc([3.25, [], 0])) == 3.25
    assert peek_ts(_enc({"ts": 1, "events": []})) == 1.0
    assert peek_ts(b"\xc1") is None


def test_hash_key_signed_and_unsigned_agree() -> None:
    assert hash_key(-1) == -1
    assert hash_key((1 << 64) - 1) == -1
    assert hash_key(5) == 5


def test_pass_through_fields_of_unexpected_type_keep_the_event() -> None:
    """SGLang puts a {cache_salt} map at lora_name; odd values elsewhere cost nothing.

    The report's lean decoder never looks at these fields, so decode_batch must not
    drop the event either, or replay and report would count different events.
    """
    stored = [
        "BlockStored",
        [1, 2],
        {"x": 1},
        [5, "six", [7, 8]],
        "16",
        1.5,
        "GPU",
        {"cache_salt": "s"},
        "keys",
        0,
    ]
    payload = _enc(
        [
            1.0,
            [
                stored,
                {
                    "type": "BlockRemoved",
                    "block_hashes": [1],
                    "medium": "GPU",
                    "locality": 3,
                    "ownership": [1],
                },
            ],
            0,
        ]
    )
    out = decode_batch(payload)
    assert out.skipped == ()
    st, rm = out.events
    assert isinstance(st, BlockStored) and st.lora_name == {"cache_salt": "s"}
    assert len(st.token_ids) == 3 and st.group_idx == 0
    assert isinstance(rm, BlockRemoved) and rm.block_hashes == [1]


def test_batch_projection_every_batch_and_event_encoding() -> None:
    """One mechanism decodes a batch whole for each projection (full, lean, stats)."""
    from kvtool.protocol import BatchProjection

    class Ev(msgspec.Struct, tag_field="type", tag="BlockRemoved"):
        group_idx: int | None = None

    class EvA(msgspec.Struct, array_like=True, tag_field="type", tag="BlockRemoved"):
        block_hashes: object = None
        medium: object = None
        group_idx: int | None = None

    proj = BatchProjection("t", Ev, EvA)
    map_ev = {"type": "BlockRemoved", "block_hashes": [1], "group_idx": 3}
    arr_ev = ["BlockRemoved", [1], None, 3]
    for batch, benc, eenc in [
        ([1.0, [map_ev], 0], "array", "map"),
        ([1.0, [arr_ev]], "array", "array"),
        ({"ts": 1.0, "events": [map_ev]}, "map", "map"),
        ({"ts": 1.0, "events": [arr_ev], "data_parallel_rank": 2}, "map", "array"),
    ]:
        hit = proj.decode(_enc(batch))
        assert hit is not None
        out, got_benc, got_eenc = hit
        assert (got_benc, got_eenc) == (benc, eenc)
        assert [e.group_idx for e in out.events] == [3]
    assert proj.decode(b"") is None
    assert proj.decode(_enc([1.0, [{"type": "Nope"}]])) is None


def test_issue19_one_field_table_describes_every_struct_and_layout() -> None:
    """The structs, the lean array layouts and PROTOCOL.md's layout lengths agree with
    kvtool.schema (the one table every projection comes from)."""
    from kvtool import columns, protocol, schema

    # The full structs are the "full" projection; a field vLLM only proposes (origin,
    # vllm#51699) is lean-only until it is merged.
    assert protocol.BlockStored.__struct_fields__ == schema.projection("full", "stored")
    assert {f.name for f in schema.FIELDS} - set(schema.projection("full", "stored")) == {"origin"}
    assert protocol.BlockRemoved.__struct_fields__ == schema.REMOVED_MAP_FIELDS
    stored = schema.array_index("stored")
    removed = schema.array_index("removed")
    assert list(stored.values()) == list(range(1, len(stored) + 1))
    assert columns._StoredArrayLayout.__struct_fields__ == tuple(stored)
    assert columns._RemovedArrayLayout.__struct_fields__ == tuple(removed)
    order = list(schema.LAYOUTS)
    for layout, (n_stored, n_removed) in schema.LAYOUTS.items():
        upto = order[: order.index(layout) + 1]
        assert n_stored == 1 + sum(f.stored is not None and f.since in upto for f in schema.FIELDS)
        assert n_removed == 1 + sum(
            f.removed is not None and f.since in upto for f in schema.FIELDS
        )
    lean = set(schema.projection("lean", "stored"))
    assert lean == {n for n in columns._Stored.__struct_fields__}
    assert set(schema.projection("lean", "removed")) == set(columns._Removed.__struct_fields__)
