"""Property tests (hypothesis) for kvtool.protocol.decode_batch: fuzzing and layout roundtrips.

Issue 5, "Robustness 1. Payload fuzzing": whatever bytes arrive, ``decode_batch`` either
returns a batch or raises ``ProtocolError``; nothing else escapes, and one bad event never
costs its neighbours. The roundtrip half encodes generated events in every layout of
PROTOCOL.md (by hand, independently of kvtool's structs) and checks they decode back.

Deterministic: every test runs with ``derandomize=True`` and no example database.
"""

from __future__ import annotations

import itertools
import struct
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from kvtool.errors import ProtocolError
from kvtool.protocol import (
    EVENT_TYPES,
    REMOVED_ARRAY_INDEX,
    STORED_ARRAY_INDEX,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    decode_batch,
    event_to_builtins,
    event_type,
    hash_key,
    peek_ts,
)
from tests.conftest import CAPTURES, capture_messages

FUZZ = settings(
    max_examples=50,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
FEW = settings(FUZZ, max_examples=25)

_enc = msgspec.msgpack.encode
_any = msgspec.msgpack.Decoder()

PAYLOADS: list[bytes] = [p for name in CAPTURES for _t, _s, p in capture_messages(name)]
# Small payloads keep the byte-flip examples fast; keep the big ones too, but fewer.
PAYLOADS.sort(key=len)
SMALL_PAYLOADS = PAYLOADS[: max(1, len(PAYLOADS) * 3 // 4)]

STORED_FIELDS = list(BlockStored.__struct_fields__)
REMOVED_FIELDS = list(BlockRemoved.__struct_fields__)
# Fields vLLM's map encoding always writes (no default in vLLM), possibly nil.
STORED_REQUIRED = STORED_FIELDS[: STORED_FIELDS.index("extra_keys")]
REMOVED_REQUIRED = ["block_hashes", "medium"]


def check_decode(raw: bytes, seq: int | None = None) -> KVEventBatch | None:
    """Decode ``raw``; only ProtocolError may escape, and the result must be usable."""
    try:
        batch = decode_batch(raw, seq=seq)
    except ProtocolError as err:
        assert str(err)
        if seq is not None:
            assert err.seq == seq
            assert str(err).startswith(f"seq {seq}: ")
        return None
    assert isinstance(batch, KVEventBatch)
    assert isinstance(batch.ts, float)
    assert batch.data_parallel_rank is None or isinstance(batch.data_parallel_rank, int)
    for ev in batch.events:
        assert isinstance(ev, BlockStored | BlockRemoved | AllBlocksCleared)
        assert event_type(ev) in EVENT_TYPES
        event_to_builtins(ev)  # what replay --format jsonl does with each event
        if isinstance(ev, BlockStored | BlockRemoved):
            for h in ev.block_hashes:
                assert -(1 << 63) <= hash_key(h) < (1 << 63)
    for msg in batch.skipped:
        assert isinstance(msg, str) and msg
    # peek_ts (used by the recorder on every message) must not raise either.
    peek_ts(raw)
    return batch


# ---------------------------------------------------------------------------
# Strategies
# ---------------------------------------------------------------------------

msgpack_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(1 << 63), (1 << 64) - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=12)
    | st.binary(max_size=12)
)
msgpack_values = st.recursive(
    msgpack_scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)

hashes = (
    st.integers(0, (1 << 64) - 1)
    | st.integers(-(1 << 63), -1)
    | st.binary(min_size=32, max_size=32)
)
small_text = st.text(max_size=10)
opt_int = st.none() | st.integers(-(1 << 63), (1 << 64) - 1)
token = st.integers(0, (1 << 32) - 1)


@st.composite
def stored_fields(draw: st.DrawFn) -> dict[str, Any]:
    """Field values of one BlockStored, as vLLM 0.33 could send them."""
    n = draw(st.integers(0, 6))
    return {
        "block_hashes": draw(st.lists(hashes, min_size=n, max_size=n)),
        "parent_block_hash": draw(st.none() | hashes),
        "token_ids": draw(st.lists(token | st.lists(token, min_size=2, max_size=2), max_size=40)),
        "block_size": draw(st.none() | st.integers(1, 1024)),
        "lora_id": draw(opt_int),
        "medium": draw(st.none() | st.sampled_from(["GPU", "CPU", "STORAGE", "cpu", "CPU_TIER1"])),
        "lora_name": draw(
            st.none() | small_text | st.dictionaries(small_text, small_text, max_size=2)
        ),
        "extra_keys": draw(
            st.none()
            | st.lists(
                st.none() | st.lists(st.integers(0, 1000) | small_text, max_size=3),
                max_size=n,
                min_size=n,
            )
        ),
        "group_idx": draw(st.none() | st.integers(0, 63)),
        "kv_cache_spec_kind": draw(
            st.none()
            | st.sampled_from(["full_attention", "sliding_window", "mamba", "unknown"])
            | small_text
        ),
        "kv_cache_spec_sliding_window": draw(st.none() | st.integers(1, 1 << 20)),
        "locality": draw(st.none() | st.sampled_from(["LOCAL", "REMOTE"])),
        "ownership": draw(st.none() | small_text),
        "session_id": draw(st.none() | small_text),
        "lookahead_token_ids": draw(
            st.none() | st.lists(st.lists(token, max_size=3), max_size=n, min_size=n)
        ),
        "cache_salt": draw(st.none() | small_text),  # SGLang 0.5.23 (issue 21)
    }


@st.composite
def removed_fields(draw: st.DrawFn) -> dict[str, Any]:
    """Field values of one BlockRemoved."""
    return {
        "block_hashes": draw(st.lists(hashes, max_size=4)),
        "medium": draw(st.none() | st.sampled_from(["GPU", "CPU"])),
        "group_idx": draw(st.none() | st.integers(0, 63)),
        "locality": draw(st.none() | st.sampled_from(["LOCAL", "REMOTE"])),
        "ownership": draw(st.none() | small_text),
    }


events = st.one_of(
    st.tuples(st.just("BlockStored"), stored_fields()),
    st.tuples(st.just("BlockRemoved"), removed_fields()),
    st.tuples(st.just("AllBlocksCleared"), st.just({})),
)

# (stored array length, removed array length, batch length), tag included; PROTOCOL.md table.
ARRAY_LAYOUTS = {
    "initial": (6, 2, 2),
    "+rank": (6, 2, 3),
    "+medium": (7, 3, 3),
    "+lora_name": (8, 3, 3),
    "+extra_keys": (9, 3, 3),
    "+group_idx": (10, 4, 3),
    "+kind": (12, 4, 3),
}


def encode_map_event(tag: str, fields: dict[str, Any]) -> dict[str, Any]:
    """vLLM >= 0.24: a tagged map; defaulted fields omitted while they hold None."""
    required = {"BlockStored": STORED_REQUIRED, "BlockRemoved": REMOVED_REQUIRED}.get(tag, [])
    out: dict[str, Any] = {"type": tag}
    for name, value in fields.items():
        if name in required or value is not None:
            out[name] = value
    return out


def encode_array_event(tag: str, fields: dict[str, Any], layout: str) -> list[Any]:
    """vLLM <= 0.23: ``[tag, f1, f2, …]`` with every field of that layout present."""
    stored_len, removed_len, _ = ARRAY_LAYOUTS[layout]
    if tag == "BlockStored":
        names = sorted(STORED_ARRAY_INDEX, key=STORED_ARRAY_INDEX.__getitem__)[: stored_len - 1]
    elif tag == "BlockRemoved":
        names = sorted(REMOVED_ARRAY_INDEX, key=REMOVED_ARRAY_INDEX.__getitem__)[: removed_len - 1]
    else:
        names = []
    return [tag, *(fields[n] for n in names)]


def expected_fields(tag: str, fields: dict[str, Any], layout: str) -> dict[str, Any]:
    """What a decoder must see: fields outside an array layout are at their defaults."""
    if layout in ("map", "map-batch"):
        return fields
    encoded = encode_array_event(tag, fields, layout)[1:]
    if tag == "BlockStored":
        names = STORED_FIELDS
    elif tag == "BlockRemoved":
        names = REMOVED_FIELDS
    else:
        return {}
    out: dict[str, Any] = {n: None for n in names}
    out["block_hashes"] = []
    if tag == "BlockStored":
        out["token_ids"] = []
    out.update(zip(names, encoded, strict=False))
    return out


def decoded_fields(ev: Any) -> dict[str, Any]:
    return {n: getattr(ev, n) for n in ev.__struct_fields__}


def encode_batch(ts: float, evs: list[Any], rank: int | None, layout: str) -> bytes:
    if layout == "map-batch":
        return _enc({"ts": ts, "events": evs, "data_parallel_rank": rank})
    if layout != "map" and ARRAY_LAYOUTS[layout][2] == 2:
        return _enc([ts, evs])
    return _enc([ts, evs, rank])


def encode_events(evs: list[tuple[str, dict[str, Any]]], layout: str) -> list[Any]:
    if layout in ("map", "map-batch"):
        return [encode_map_event(t, f) for t, f in evs]
    return [encode_array_event(t, f, layout) for t, f in evs]


# ---------------------------------------------------------------------------
# Fuzzing: only ProtocolError escapes
# ---------------------------------------------------------------------------


@FUZZ
@given(st.binary(max_size=256), st.none() | st.integers(0, (1 << 64) - 1))
def test_random_bytes(raw: bytes, seq: int | None) -> None:
    check_decode(raw, seq)


@FUZZ
@given(st.lists(st.integers(0, 255), max_size=64).map(bytes))
def test_random_bytes_behind_a_batch_header(tail: bytes) -> None:
    # Random bytes where the events (or an event) would start, so the fuzzing goes deeper.
    head = b"\x93\xcb" + struct.pack(">d", 1.0)
    check_decode(head + tail)
    check_decode(head + b"\x91" + tail)
    check_decode(head + b"\x92" + _enc({"type": "AllBlocksCleared"}) + tail)


@FUZZ
@given(
    st.sampled_from(SMALL_PAYLOADS),
    st.lists(st.tuples(st.integers(0, 1 << 30), st.integers(0, 255)), min_size=1, max_size=8),
)
def test_real_payloads_with_byte_flips(payload: bytes, flips: list[tuple[int, int]]) -> None:
    data = bytearray(payload)
    for pos, value in flips:
        data[pos % len(data)] = value
    check_decode(bytes(data), seq=3)


@FUZZ
@given(st.sampled_from(PAYLOADS), st.floats(0, 1, exclude_max=True))
def test_real_payloads_truncated(payload: bytes, frac: float) -> None:
    cut = int(len(payload) * frac)
    with pytest.raises(ProtocolError, match=r"^seq 9: malformed payload"):
        decode_batch(payload[:cut], seq=9)
    assert check_decode(payload[:cut]) is None


@FUZZ
@given(st.sampled_from(SMALL_PAYLOADS), st.integers(0, 1 << 30), st.binary(min_size=1, max_size=16))
def test_real_payloads_with_inserted_bytes(payload: bytes, pos: int, junk: bytes) -> None:
    pos %= len(payload)
    check_decode(payload[:pos] + junk + payload[pos:])
    check_decode(payload[:pos] + payload[pos + len(junk) :])


def _good_pair(encoding: str) -> tuple[Any, Any, list[type]]:
    """Two good events (before and after the bad one) and their expected classes."""
    if encoding == "map":
        return (
            {"type": "BlockRemoved", "block_hashes": [11], "medium": "GPU", "group_idx": 0},
            {
                "type": "BlockStored",
                "block_hashes": [22, 23],
                "parent_block_hash": 11,
                "token_ids": list(range(32)),
                "block_size": 16,
                "lora_id": None,
                "medium": "GPU",
                "lora_name": None,
                "group_idx": 1,
                "kv_cache_spec_kind": "sliding_window",
                "kv_cache_spec_sliding_window": 64,
            },
            [BlockRemoved, BlockStored],
        )
    return (
        ["BlockRemoved", [11], "GPU", 0],
        [
            "BlockStored",
            [22, 23],
            11,
            list(range(32)),
            16,
            None,
            "GPU",
            None,
            None,
            1,
            "sliding_window",
            64,
        ],
        [BlockRemoved, BlockStored],
    )


def _check_neighbours_kept(raw: bytes, encoding: str) -> None:
    batch = check_decode(raw, seq=5)
    assert batch is not None, "a bad event must not sink its batch"
    first, last = batch.events[0], batch.events[-1]
    _, _, classes = _good_pair(encoding)
    assert isinstance(first, classes[0]) and first.block_hashes == [11]
    assert isinstance(last, classes[1]) and last.block_hashes == [22, 23]
    assert last.kv_cache_spec_sliding_window == 64
    # The bad event either decoded (the value happened to fit) or is named in skipped.
    assert len(batch.events) + len(batch.skipped) == 3
    for msg in batch.skipped:
        assert msg.startswith("seq 5: event 1: ")


WRONG_VALUE_CASES = (
    [("map", "BlockStored", f) for f in ["type", *STORED_FIELDS]]
    + [("map", "BlockRemoved", f) for f in ["type", *REMOVED_FIELDS]]
    + [("array", "BlockStored", f) for f in ["type", *STORED_ARRAY_INDEX]]
    + [("array", "BlockRemoved", f) for f in ["type", *REMOVED_ARRAY_INDEX]]
)


@FUZZ
@given(
    value=msgpack_values,
    stored=stored_fields(),
    removed=removed_fields(),
    batch_layout=st.sampled_from(["array", "map"]),
)
def test_wrong_type_in_every_field_keeps_neighbours(
    value: Any, stored: dict[str, Any], removed: dict[str, Any], batch_layout: str
) -> None:
    # Every field of every event layout gets the drawn value in turn.
    for encoding, tag, field in WRONG_VALUE_CASES:
        fields = stored if tag == "BlockStored" else removed
        if encoding == "map":
            bad: Any = encode_map_event(tag, fields)
            bad[field] = value
        else:
            bad = encode_array_event(tag, fields, "+kind")
            index = (
                0
                if field == "type"
                else (STORED_ARRAY_INDEX if tag == "BlockStored" else REMOVED_ARRAY_INDEX)[field]
            )
            bad[index] = value
        before, after, _ = _good_pair(encoding)
        evs = [before, bad, after]
        raw = (
            _enc([1.0, evs, 0])
            if batch_layout == "array"
            else _enc({"ts": 1.0, "events": evs, "data_parallel_rank": 0})
        )
        _check_neighbours_kept(raw, encoding)


@pytest.mark.parametrize("field", ["ts", "events", "data_parallel_rank"])
@FUZZ
@given(value=msgpack_values, batch_layout=st.sampled_from(["array", "map"]))
def test_wrong_type_in_batch_fields(field: str, value: Any, batch_layout: str) -> None:
    batch = {"ts": 1.0, "events": [{"type": "AllBlocksCleared"}], "data_parallel_rank": 0}
    batch[field] = value
    raw = _enc(list(batch.values()) if batch_layout == "array" else batch)
    out = check_decode(raw, seq=1)
    valid = {
        "ts": isinstance(value, int | float) and not isinstance(value, bool),
        "events": isinstance(value, list),
        "data_parallel_rank": value is None
        or (isinstance(value, int) and not isinstance(value, bool)),
    }[field]
    if not valid:
        assert out is None
    elif field != "events":
        assert out is not None and len(out.events) == 1
    if field == "ts" and valid and isinstance(value, float | int):
        assert out is not None and out.ts == float(value)


@FUZZ
@given(
    tag=st.text(max_size=20).filter(lambda t: t not in EVENT_TYPES)
    | st.integers(-(1 << 63), (1 << 64) - 1)
    | st.none(),
    encoding=st.sampled_from(["map", "array"]),
    rest=st.lists(msgpack_values, max_size=4),
)
def test_unknown_tags_are_skipped_not_fatal(tag: Any, encoding: str, rest: list[Any]) -> None:
    bad: Any = {"type": tag, "block_hashes": [1]} if encoding == "map" else [tag, *rest]
    before, after, _ = _good_pair(encoding)
    raw = _enc([2.0, [before, bad, after], None])
    _check_neighbours_kept(raw, encoding)
    batch = decode_batch(raw, seq=5)
    assert len(batch.skipped) == 1
    if isinstance(tag, str):
        assert "unknown event type" in batch.skipped[0]


@FUZZ
@given(
    ev=events,
    extra=st.dictionaries(
        st.text(max_size=12).filter(
            lambda k: k not in STORED_FIELDS and k not in REMOVED_FIELDS and k != "type"
        ),
        msgpack_values,
        min_size=1,
        max_size=4,
    ),
    extra_batch=st.dictionaries(
        st.text(max_size=8).filter(lambda k: k not in ("ts", "events", "data_parallel_rank")),
        msgpack_values,
        max_size=3,
    ),
    trailing=st.lists(msgpack_values, min_size=1, max_size=3),
)
def test_unknown_fields_are_ignored(
    ev: tuple[str, dict[str, Any]],
    extra: dict[str, Any],
    extra_batch: dict[str, Any],
    trailing: list[Any],
) -> None:
    tag, fields = ev
    # Map event with unknown keys, in a map batch with unknown keys.
    mapped = {**encode_map_event(tag, fields), **extra}
    raw = _enc({"ts": 1.0, "events": [mapped], "data_parallel_rank": 2, **extra_batch})
    batch = check_decode(raw)
    assert batch is not None and batch.skipped == ()
    (got,) = batch.events
    assert event_type(got) == tag and decoded_fields(got) == fields
    # Array event longer than any known layout (fields after the last known one), in an
    # array batch longer than three elements.
    n = 1 + (
        len(STORED_FIELDS)
        if tag == "BlockStored"
        else len(REMOVED_FIELDS)
        if tag == "BlockRemoved"
        else 0
    )
    arr = [tag, *(fields[k] for k in list(fields)[: n - 1]), *trailing]
    raw = _enc([1.0, [arr], 2, *trailing])
    batch = check_decode(raw)
    assert batch is not None and batch.skipped == ()
    (got,) = batch.events
    assert event_type(got) == tag and decoded_fields(got) == fields


def _nest(depth: int, kind: str) -> bytes:
    if kind == "array":
        return b"\x91" * depth + b"\xc0"
    return b"\x81\xa1k" * depth + b"\xc0"


DEEP_PLACES = ["payload", "ts", "events", "event", "known_field", "unknown_field", "hash", "rank"]


@FEW
@given(depth=st.integers(1, 5000))
def test_deep_nesting(depth: int) -> None:
    ts = b"\xcb" + struct.pack(">d", 1.0)
    good = _enc({"type": "BlockRemoved", "block_hashes": [7], "medium": None})
    stored_head = b"\x82\xa4type\xabBlockStored"
    for kind in ("array", "map"):
        nest = _nest(depth, kind)
        for where in DEEP_PLACES:
            raw = {
                "payload": nest,
                "ts": b"\x93" + nest + b"\x90\xc0",
                "events": b"\x93" + ts + nest + b"\xc0",
                "event": b"\x93" + ts + b"\x93" + good + nest + good + b"\xc0",
                "known_field": b"\x93"
                + ts
                + b"\x93"
                + good
                + stored_head
                + b"\xaaextra_keys"
                + nest
                + good
                + b"\xc0",
                "unknown_field": b"\x93"
                + ts
                + b"\x93"
                + good
                + stored_head
                + b"\xa9not_known"
                + nest
                + good
                + b"\xc0",
                "hash": b"\x93"
                + ts
                + b"\x93"
                + good
                + b"\x82\xa4type\xacBlockRemoved\xacblock_hashes\x91"
                + nest
                + good
                + b"\xc0",
                "rank": b"\x93" + ts + b"\x90" + nest,
            }[where]
            batch = check_decode(raw, seq=4)
            if where in ("event", "known_field", "unknown_field", "hash"):
                # However deep the bad event, its neighbours survive.
                assert batch is not None
                assert batch.events[0] == batch.events[-1]
                assert isinstance(batch.events[0], BlockRemoved)
                assert batch.events[0].block_hashes == [7]


def test_deep_nesting_regression_issue5() -> None:
    """Regression (issue 5): msgspec raised RecursionError, which escaped decode_batch; and
    an event nested too deeply for msgspec to skip must cost only itself."""
    deep = b"\x91" * 100_000 + b"\xc0"
    ts = b"\xcb" + struct.pack(">d", 1.0)
    good = _enc({"type": "BlockRemoved", "block_hashes": [7], "medium": None})
    for raw in (
        b"\x92" + ts + b"\x91" + deep,
        b"\x92" + ts + deep,
        b"\x92" + ts + b"\x91\x82\xa4type\xabBlockStored\xa7unknown" + deep,
        b"\x93" + ts + b"\x93" + good + deep + good + b"\x05",
    ):
        batch = decode_batch(raw, seq=1)
        assert [e for e in batch.events if not isinstance(e, BlockRemoved)] == []
        assert len(batch.skipped) == 1
        assert batch.skipped[0].startswith("seq 1: event ")
        assert peek_ts(raw) in (None, 1.0)
    raw = b"\x93" + ts + b"\x93" + good + deep + good + b"\x05"
    assert decode_batch(raw).events == [decode_batch(raw).events[0]] * 2
    assert decode_batch(raw).data_parallel_rank == 5
    # A deep ts (or a batch that is one deep array) is a payload error, as before.
    for raw in (b"\x92" + deep + b"\x90", deep, _enc({"ts": [1]}) + deep):
        with pytest.raises(ProtocolError, match=r"^seq 1: malformed payload"):
            decode_batch(raw, seq=1)


@FUZZ
@given(
    batch=st.one_of(
        st.lists(msgpack_values, min_size=2, max_size=5),
        st.dictionaries(
            st.sampled_from(["ts", "events", "data_parallel_rank", "x"]), msgpack_values, max_size=4
        ),
        st.tuples(
            st.floats(allow_nan=False),
            st.lists(msgpack_values, max_size=5),
            st.none() | st.integers(0, 9),
        ).map(list),
        st.fixed_dictionaries(
            {"ts": st.floats(allow_nan=False), "events": st.lists(msgpack_values, max_size=5)}
        ),
    )
)
def test_recursion_free_batch_splitter_agrees_with_msgspec(batch: Any) -> None:
    # The fallback splitter for deeply nested batches must see exactly what msgspec sees.
    from kvtool.protocol import _RAW_DECODERS, _split_batch

    raw = _enc(batch)
    benc = "map" if isinstance(batch, dict) else "array"
    try:
        want = _RAW_DECODERS[benc].decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError):
        with pytest.raises((msgspec.DecodeError, msgspec.ValidationError)):
            _split_batch(raw, benc)
        return
    got = _split_batch(raw, benc)
    assert (got.ts, got.data_parallel_rank) == (want.ts, want.data_parallel_rank)
    assert [bytes(e) for e in got.events] == [bytes(e) for e in want.events]


HUGE_HEADERS = {
    "array32": b"\xdd\xff\xff\xff\xff",
    "array32-2**31": b"\xdd\x80\x00\x00\x00",
    "map32": b"\xdf\xff\xff\xff\xff",
    "str32": b"\xdb\xff\xff\xff\xff",
    "bin32": b"\xc6\xff\xff\xff\xff",
    "ext32": b"\xc9\xff\xff\xff\xff\x01",
    "array16": b"\xdc\xff\xff",
    "map16": b"\xde\xff\xff",
}


HUGE_PLACES = [
    "payload",
    "ts",
    "events",
    "event",
    "block_hashes",
    "token_ids",
    "hash",
    "tag",
    "field_name",
    "unknown_field",
]


@FEW
@given(tail=st.binary(max_size=64))
def test_huge_declared_lengths(tail: bytes) -> None:
    ts = b"\xcb" + struct.pack(">d", 1.0)
    good = _enc({"type": "BlockRemoved", "block_hashes": [7], "medium": None})
    for h in HUGE_HEADERS.values():
        for where in HUGE_PLACES:
            raw = {
                "payload": h,
                "ts": b"\x92" + h,
                "events": b"\x93" + ts + h,
                "event": b"\x93" + ts + b"\x92" + good + h,
                "block_hashes": b"\x93"
                + ts
                + b"\x91\x82\xa4type\xacBlockRemoved\xacblock_hashes"
                + h,
                "token_ids": b"\x93" + ts + b"\x91\x82\xa4type\xabBlockStored\xa9token_ids" + h,
                "hash": b"\x93" + ts + b"\x91\x82\xa4type\xacBlockRemoved\xacblock_hashes\x91" + h,
                "tag": b"\x93" + ts + b"\x91\x81\xa4type" + h,
                "field_name": b"\x93" + ts + b"\x91\x82\xa4type\xacBlockRemoved" + h,
                "unknown_field": b"\x93" + ts + b"\x91\x82\xa4type\xacBlockRemoved\xa1x" + h,
            }[where]
            # The declared length runs past the end of the payload: a ProtocolError, and
            # nothing is allocated for the claimed size.
            assert check_decode(raw + tail, seq=2) is None


# ---------------------------------------------------------------------------
# Roundtrips: every layout decodes back to the values that were encoded
# ---------------------------------------------------------------------------


LAYOUTS = ["map", "map-batch", *ARRAY_LAYOUTS]


@FUZZ
@given(
    evs=st.lists(events, max_size=6),
    ts=st.floats(0, 4e9, allow_nan=False),
    rank=st.none() | st.integers(0, 1023),
)
def test_roundtrip_every_layout(
    evs: list[tuple[str, dict[str, Any]]], ts: float, rank: int | None
) -> None:
    for layout in LAYOUTS:
        raw = encode_batch(ts, encode_events(evs, layout), rank, layout)
        batch = check_decode(raw, seq=0)
        assert batch is not None, layout
        assert batch.skipped == ()
        assert batch.ts == ts
        batch_len = ARRAY_LAYOUTS[layout][2] if layout in ARRAY_LAYOUTS else 3
        assert batch.data_parallel_rank == (rank if batch_len == 3 else None)
        assert batch.batch_encoding == ("map" if layout == "map-batch" else "array")
        if evs:
            assert batch.event_encoding == ("map" if layout in ("map", "map-batch") else "array")
        assert len(batch.events) == len(evs)
        for (tag, fields), got in zip(evs, batch.events, strict=True):
            assert event_type(got) == tag, layout
            assert decoded_fields(got) == expected_fields(tag, fields, layout), layout
        assert peek_ts(raw) == ts


@FUZZ
@given(evs=st.lists(events, min_size=1, max_size=5), data=st.data())
def test_mixed_event_encodings_in_one_batch(
    evs: list[tuple[str, dict[str, Any]]], data: st.DataObject
) -> None:
    # Not something vLLM sends, but a decoder must not lose events over it.
    enc_per_event = data.draw(
        st.lists(st.sampled_from(["map", "+kind"]), min_size=len(evs), max_size=len(evs))
    )
    encoded = [
        encode_map_event(t, f) if e == "map" else encode_array_event(t, f, e)
        for (t, f), e in zip(evs, enc_per_event, strict=True)
    ]
    batch = check_decode(_enc([1.0, encoded, 0]))
    assert batch is not None and batch.skipped == ()
    for (tag, fields), e, got in zip(evs, enc_per_event, batch.events, strict=True):
        assert decoded_fields(got) == expected_fields(tag, fields, e)


@FEW
@given(st.sampled_from(PAYLOADS))
def test_real_payload_reencoded_generically_decodes_the_same(payload: bytes) -> None:
    # Decoding through the generic msgpack tree and re-encoding must not change the meaning.
    obj = _any.decode(payload)
    assume(isinstance(obj, list))
    a = decode_batch(payload)
    b = decode_batch(_enc(obj))
    assert a.events == b.events and a.ts == b.ts and a.skipped == b.skipped == ()


def test_event_to_builtins_deep_nesting_regression_issue5() -> None:
    """Regression (issue 5): a deeply nested field that msgspec decodes made the recursive
    event_to_builtins raise RecursionError (replay --format jsonl would crash)."""
    deep: Any = None
    for _ in range(800):
        deep = [deep, b"\x01"]
    raw = _enc([1.0, [{"type": "BlockStored", "block_hashes": [b"\xab"], "extra_keys": deep}]])
    (ev,) = decode_batch(raw).events
    out = event_to_builtins(ev)
    assert out["block_hashes"] == ["ab"]
    inner: Any = out["extra_keys"]
    for _ in range(800):
        assert inner[1] == "01"
        inner = inner[0]
    assert inner is None


# ---------------------------------------------------------------------------
# Report invariant: vLLM-shaped streams from bench/gen.py report exactly their truth
# ---------------------------------------------------------------------------

REPORT_COUNTS = (
    "store_events",
    "blocks_stored",
    "tokens_stored",
    "remove_events",
    "blocks_removed",
    "blocks_cleared",
    "live_blocks_end",
    "peak_live_blocks",
    "distinct_hashes",
    "restored_blocks",
    "orphan_removes",
)


def _load_gen() -> Any:
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "bench" / "gen.py"
    spec = importlib.util.spec_from_file_location("kvtool_bench_gen", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _report_diffs(rep: dict[str, Any], truth: dict[str, Any]) -> list[str]:
    diffs = [
        f"totals.{c}: {rep['totals'][c]} != {truth['totals'][c]}"
        for c in REPORT_COUNTS
        if rep["totals"][c] != truth["totals"][c]
    ]
    for table, key in (
        ("by_kind", "kind"),
        ("by_window", "sliding_window"),
        ("by_group", "group_idx"),
    ):
        got = {r[key]: r for r in rep[table]}
        want = {r[key]: r for r in truth[table]}
        if set(got) != set(want):
            diffs.append(f"{table} keys {sorted(got, key=str)} != {sorted(want, key=str)}")
            continue
        diffs += [
            f"{table}[{k}].{c}: {got[k][c]} != {want[k][c]}"
            for k in want
            for c in REPORT_COUNTS
            if got[k][c] != want[k][c]
        ]
    return diffs


@pytest.mark.slow
@settings(FUZZ, max_examples=3)
@given(
    seed=st.integers(0, 1 << 16),
    model=st.sampled_from(["gemma3", "mla-mamba", "full"]),
    layout=st.sampled_from(["map", "array"]),
    hash_type=st.sampled_from(["int", "bytes"]),
    pool=st.integers(200, 2000),
    running=st.integers(1, 12),
    reannounce=st.sampled_from([0.0, 0.3, 1.0]),
    chunk_bytes=st.sampled_from([1 << 12, 1 << 16, 1 << 24]),
)
def test_report_equals_reference_on_vllm_shaped_streams(
    tmp_path_factory: pytest.TempPathFactory,
    seed: int,
    model: str,
    layout: str,
    hash_type: str,
    pool: int,
    running: int,
    reannounce: float,
    chunk_bytes: int,
) -> None:
    """kvtool report == a plain reference computation (bench/gen.py's truth), whatever the
    model, layout, hash type, pool pressure, re-announce rate and report chunking."""
    import io
    import json

    from kvtool.render.report import render_json
    from kvtool.report import build_report

    gen = _load_gen()
    out = tmp_path_factory.mktemp("gen")
    gen.main(
        [
            "--name",
            "s",
            "--outdir",
            str(out),
            "--block-events",
            "3000",
            "--seed",
            str(seed),
            "--model",
            model,
            "--layout",
            layout,
            "--hash",
            hash_type,
            "--pool-blocks",
            str(pool),
            "--max-running",
            str(running),
            "--prefixes",
            "12",
            "--reannounce",
            str(reannounce),
            "--prefill-tokens",
            "512",
            "--warmup-steps",
            "15",
            "--no-frames",
        ]
    )
    truth = json.loads((out / "s.truth.json").read_text())
    buf = io.StringIO()
    # bench/gen.py's truth counts every stored hash as a store (its re-announced hits too,
    # and parentless stores of cached prefixes, which vLLM does not send): incremental mode.
    rep = build_report([out / "s.mcap"], chunk_bytes=chunk_bytes, report_mode="incremental")
    render_json(rep, buf)
    assert _report_diffs(json.loads(buf.getvalue()), truth) == []


# ---------------------------------------------------------------------------
# The report path has its own (lean, vectorised) decoder: it must survive bad payloads too
# ---------------------------------------------------------------------------


def _report_on(tmp_path: Any, payloads: list[bytes]) -> dict[str, Any]:
    import io
    import json

    from kvtool.recording import RecordingWriter
    from kvtool.render.report import render_json
    from kvtool.report import build_report

    path = tmp_path / "r.mcap"
    with RecordingWriter(path) as w:
        ch = w.add_channel("tcp://127.0.0.1:5557")
        for seq, p in enumerate(payloads):
            w.write(ch, seq, p, 1_000_000_000 * (seq + 1))
    buf = io.StringIO()
    render_json(build_report([path]), buf)
    out: dict[str, Any] = json.loads(buf.getvalue())
    return out


_GOOD_STORE = ["BlockStored", [1, 2], None, list(range(32)), 16, None, "GPU", None, None, 0]


def test_report_survives_deeply_nested_payload(tmp_path: Any) -> None:
    """Regression (issue 5): msgspec's RecursionError escaped the report's lean decoder."""
    ts = b"\xcb" + struct.pack(">d", 1.0)
    deep = b"\x93" + ts + b"\x91\x82\xa4type\xabBlockStored\xa9not_known" + b"\x91" * 5000
    payloads = [_enc([1.0, [_GOOD_STORE], 0]), deep + b"\xc0\xc0", _enc([2.0, [_GOOD_STORE], 0])]
    rep = _report_on(tmp_path, payloads)
    assert rep["totals"]["store_events"] == 2


def test_report_survives_negative_group_idx(tmp_path: Any) -> None:
    """Regression (issue 5): a group_idx <= -2 (one flipped byte) broke report's packed key."""
    bad = [*_GOOD_STORE[:-1], -4]
    rep = _report_on(tmp_path, [_enc([1.0, [_GOOD_STORE], 0]), _enc([2.0, [bad], 0])])
    assert rep["totals"]["store_events"] == 2


# -- report: the live-block state step against a plain multiset --------------------------------

_op = st.one_of(
    st.tuples(
        st.just("S"),
        st.integers(0, 1),
        st.sampled_from([0, 1, None, 2**24, 2**24 + 1]),
        st.integers(0, 4),
    ),
    st.tuples(
        st.just("R"),
        st.integers(0, 1),
        st.sampled_from([0, 1, None, 2**24, 2**24 + 1]),
        st.integers(0, 4),
    ),
    st.tuples(st.just("C"), st.integers(0, 1)),
)


def _state_reference(ops: list[tuple[Any, ...]]) -> dict[str, Any]:
    """A dict of deques: +1/-1 per key, never below 0, FIFO pairing, clears per channel.

    A store of a key stored before and not live is a recompute: its gap is the time since
    the key went, its distance the channel's effective removes since then (issue 20).
    """
    from collections import deque

    live: dict[tuple[Any, ...], deque[int]] = {}
    gone: dict[tuple[Any, ...], tuple[int, int]] = {}
    evictions = {0: 0, 1: 0}
    orphans = restored = 0
    lifetimes: list[int] = []
    recomputes: list[tuple[int, int]] = []
    for t, op in enumerate(ops):
        if op[0] == "C":
            for key in [k for k in live if k[0] == op[1]]:
                if live[key]:
                    gone[key] = (t, evictions[op[1]])
                del live[key]
            continue
        kind, cid, g, h = op
        q = live.setdefault((cid, g, h), deque())
        if kind == "S":
            restored += bool(q)
            if not q and (cid, g, h) in gone:
                when, at = gone[(cid, g, h)]
                recomputes.append((t - when, evictions[cid] - at))
            q.append(t)
        elif q:
            lifetimes.append(t - q.popleft())
            evictions[cid] += 1
            if not q:
                gone[(cid, g, h)] = (t, evictions[cid])
        else:
            orphans += 1
    left = sorted(((k, t) for k, q in live.items() for t in q), key=repr)
    return {
        "orphans": orphans,
        "restored": restored,
        "lifetimes": sorted(lifetimes),
        "live": left,
        "recomputes": sorted(recomputes),
    }


@settings(max_examples=150, deadline=None)
@given(ops=st.lists(_op, max_size=40), cuts=st.lists(st.integers(0, 40), max_size=4))
def test_issue19_state_kernel_equals_a_plain_multiset_over_any_chunking(
    ops: list[tuple[Any, ...]], cuts: list[int]
) -> None:
    import numpy as np

    from kvtool.report import kernel

    bounds = sorted({0, len(ops), *(c for c in cuts if c <= len(ops))})
    ks = kernel.State()
    orphans = restored = 0
    lifetimes: list[int] = []
    recomputes: list[tuple[int, int]] = []
    code = {"S": kernel.STORE, "R": kernel.REMOVE, "C": kernel.CLEAR}
    for lo, hi in itertools.pairwise(bounds):
        part = ops[lo:hi]
        full = [(*o, None, None)[:4] for o in part]
        out = kernel.step(
            ks,
            np.array([code[o[0]] for o in full], dtype=np.int8),
            np.array([o[1] for o in full], dtype=np.int64),
            np.array([o[2] or 0 for o in full], dtype=np.int64),
            np.array([o[0] != "C" and o[2] is None for o in full], dtype=bool),
            np.array([o[3] or 0 for o in full], dtype=np.int64),
            np.arange(lo, hi, dtype=np.float64),
            np.zeros(len(full), dtype=np.int64),
            1,
        )
        what = out.what
        orphans += int((what == kernel.ORPHAN).sum())
        restored += int((what == kernel.WHILE_LIVE).sum())
        ev = np.flatnonzero(what == kernel.EVICTED)
        lifetimes += [round(lo + i - out.ts[i]) for i in ev.tolist()]
        rc = np.flatnonzero(what == kernel.RECOMPUTED)
        recomputes += [(round(lo + i - out.ts[i]), int(out.distance[i])) for i in rc.tolist()]
    c, g, ng, h, t, _gk = ks.live_entries()
    got_live = sorted(
        (
            ((int(c[j]), None if ng[j] else int(g[j]), int(h[j])), round(t[j]))
            for j in range(len(c))
        ),
        key=repr,
    )
    want = _state_reference(ops)
    assert orphans == want["orphans"]
    assert restored == want["restored"]
    assert sorted(lifetimes) == want["lifetimes"]
    assert got_live == want["live"]
    assert sorted(recomputes) == want["recomputes"]
