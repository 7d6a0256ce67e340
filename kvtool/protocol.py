"""vLLM KV-event wire protocol: msgspec structs for every layout and the one batch decoder.

The structs mirror ``vllm/distributed/kv_events.py`` across versions (see PROTOCOL.md).
Fields are only ever appended, each with a default, so one struct reads every layout:
array-encoded events of vLLM <= 0.23 carry their fields positionally in declaration
order (shorter arrays simply leave later fields at their defaults, longer ones have
their extra elements ignored), and map-encoded events of vLLM >= 0.24 omit defaulted
fields. Unknown map keys are ignored. Decoding never touches the raw bytes.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, Literal, Protocol

import msgspec

from kvtool import projections, schema
from kvtool.errors import ProtocolError
from kvtool.projections import Hash, Int64
from kvtool.text import printable

EVENT_TYPES = schema.EVENT_TAGS

# Array index of each field inside an array-encoded event (index 0 is the tag), from
# the one field table (kvtool.schema).
STORED_ARRAY_INDEX = schema.array_index("stored")
REMOVED_ARRAY_INDEX = schema.array_index("removed")

_STRUCTS = projections.build(projections.FULL, module=__name__)

if TYPE_CHECKING:
    # What mypy sees. At run time the structs are generated from kvtool.schema's table
    # (kvtool.projections); tests/test_issue19_projections.py checks that every field here
    # is the generated one, in its order, with its type and default.
    class BlockStored(msgspec.Struct, tag_field="type", tag="BlockStored", frozen=True):
        """Blocks newly cached (or re-announced) in one KV cache group.

        Attributes:
            block_hashes: One hash per stored block (may be empty).
            parent_block_hash: Hash of the block before the first one, if any.
            token_ids: Every token of the newly cached range (SGLang EAGLE: pairs).
            block_size: Tokens per block (for a partial store, the tokens in it).
            lora_id: Deprecated LoRA id.
            medium: ``GPU``, ``CPU``, ``STORAGE`` … (vLLM >= 0.11).
            lora_name: LoRA adapter name (SGLang's array layout has a map here).
            extra_keys: Per-block extra hash keys (vLLM >= 0.17).
            group_idx: KV cache group index (vLLM >= 0.21).
            kv_cache_spec_kind: Kind of the group's KV cache spec (vLLM >= 0.22).
            kv_cache_spec_sliding_window: Sliding window of the group's spec, if any.
            locality: ``LOCAL`` or ``REMOTE`` (vLLM >= 0.26).
            ownership: Owner of the blocks (vLLM >= 0.29).
            session_id: Session the request belongs to (vLLM >= 0.28).
            lookahead_token_ids: Speculative lookahead tokens per block (vLLM 0.33).
            cache_salt: The salt the block hashes are namespaced by (SGLang 0.5.23 map
                events; its array layout puts a ``{cache_salt}`` map at ``lora_name``).
        """

        block_hashes: list[Hash] = msgspec.field(default_factory=list)
        parent_block_hash: object = None
        token_ids: list[object] = msgspec.field(default_factory=list)
        block_size: object = None
        lora_id: object = None
        medium: str | None = None
        lora_name: object = None
        extra_keys: object = None
        group_idx: Int64 | None = None
        kv_cache_spec_kind: str | None = None
        kv_cache_spec_sliding_window: Int64 | None = None
        locality: object = None
        ownership: object = None
        session_id: object = None
        lookahead_token_ids: object = None
        cache_salt: object = None

    class BlockRemoved(msgspec.Struct, tag_field="type", tag="BlockRemoved", frozen=True):
        """Cached blocks evicted (one event per hash in vLLM) — no kind, no window.

        Attributes:
            block_hashes: Hashes of the removed blocks.
            medium: Where they were cached.
            group_idx: KV cache group index (vLLM >= 0.21).
            locality: ``LOCAL`` or ``REMOTE``.
            ownership: Owner of the blocks.
        """

        block_hashes: list[Hash] = msgspec.field(default_factory=list)
        medium: str | None = None
        group_idx: Int64 | None = None
        locality: object = None
        ownership: object = None

    class AllBlocksCleared(msgspec.Struct, tag_field="type", tag="AllBlocksCleared", frozen=True):
        """The whole prefix cache was reset."""
else:
    BlockStored, BlockRemoved, AllBlocksCleared = _STRUCTS.map
    BlockStored.__doc__ = "Blocks newly cached (or re-announced) in one KV cache group."
    BlockRemoved.__doc__ = "Cached blocks evicted (one event per hash in vLLM): no kind, no window."
    AllBlocksCleared.__doc__ = "The whole prefix cache was reset."

# The array-encoded structs (vLLM <= 0.23: ``[tag, field, …]``) subclass the map ones.
_BlockStoredArray, _BlockRemovedArray, _AllBlocksClearedArray = _STRUCTS.array

Event = BlockStored | BlockRemoved | AllBlocksCleared
EventEncoding = Literal["map", "array"]

_MapEvent = _STRUCTS.map_union
_ArrayEvent = _STRUCTS.array_union


class _ArrayBatchRaw(msgspec.Struct, array_like=True):
    ts: float
    events: list[msgspec.Raw]
    data_parallel_rank: int | None = None


class _MapBatchRaw(msgspec.Struct):
    ts: float
    events: list[msgspec.Raw]
    data_parallel_rank: int | None = None


class _ArrayTs(msgspec.Struct, array_like=True):
    ts: float


class _MapTs(msgspec.Struct):
    ts: float


class KVEventBatch(msgspec.Struct, frozen=True):
    """One decoded ``KVEventBatch`` payload.

    Attributes:
        ts: The publisher's timestamp, float seconds on its clock.
        events: The events that decoded, in order.
        data_parallel_rank: The rank the batch names (None when absent or nil).
        batch_encoding: ``"array"`` (every vLLM release) or ``"map"``.
        event_encoding: ``"map"`` (vLLM >= 0.24) or ``"array"`` (older); ``"map"`` when empty.
        skipped: One message per event that could not be decoded (unknown type or
            malformed); its neighbours are kept.
        unknown_tags: The type tag of each skipped event whose tag kvtool does not know
            (``BlockInactive`` …), as sent (at most 64 characters; issue 21).
    """

    ts: float
    events: list[Event]
    data_parallel_rank: int | None = None
    batch_encoding: EventEncoding = "array"
    event_encoding: EventEncoding = "map"
    skipped: tuple[str, ...] = ()
    unknown_tags: tuple[str, ...] = ()


MAX_UNKNOWN_TAGS = 64
"""Distinct unknown event tags counted by name; the rest are counted under :data:`OTHER_TAGS`."""

OTHER_TAGS = "(other)"
"""The count of unknown tags past the first :data:`MAX_UNKNOWN_TAGS` distinct ones."""


def count_unknown_tags(counts: dict[str, int], tags: Iterable[tuple[str, int]]) -> None:
    """Add ``(tag, n)`` pairs to a count of unknown event tags, bounded (issue 21).

    At most :data:`MAX_UNKNOWN_TAGS` distinct tags are kept by name (tags come from the
    wire); any further one is counted under :data:`OTHER_TAGS`.

    Args:
        counts: The count to update, in place.
        tags: Tags with how many events carried each.
    """
    for tag, n in tags:
        if tag in counts or len(counts) < MAX_UNKNOWN_TAGS:
            counts[tag] = counts.get(tag, 0) + n
        else:
            counts[OTHER_TAGS] = counts.get(OTHER_TAGS, 0) + n


def unknown_tags_text(counts: dict[str, int]) -> str:
    """Show a count of unknown tags for a terminal: ``BlockInactive 3, BlockTransferred 1``.

    Tags come from the wire: each passes through :func:`kvtool.text.printable`.

    Args:
        counts: Tag → events.

    Returns:
        The tags, most frequent first, each with its count.
    """
    return ", ".join(f"{printable(t)} {n:,}" for t, n in sorted_unknown_tags(counts).items())


def sorted_unknown_tags(counts: dict[str, int]) -> dict[str, int]:
    """Return a count of unknown tags most frequent first (then by name), for output.

    Args:
        counts: Tag → events.

    Returns:
        The same counts, ordered.
    """
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


_RAW_DECODERS: dict[EventEncoding, msgspec.msgpack.Decoder[object]] = {
    "array": msgspec.msgpack.Decoder(_ArrayBatchRaw),
    "map": msgspec.msgpack.Decoder(_MapBatchRaw),
}
_TS_DECODERS: dict[EventEncoding, msgspec.msgpack.Decoder[object]] = {
    "array": msgspec.msgpack.Decoder(_ArrayTs),
    "map": msgspec.msgpack.Decoder(_MapTs),
}
_MAP_EVENT = msgspec.msgpack.Decoder(_MapEvent)
_ARRAY_EVENT = msgspec.msgpack.Decoder(_ArrayEvent)
_ANY = msgspec.msgpack.Decoder()

# What a decode of untrusted bytes may raise. msgspec raises RecursionError (not a
# DecodeError) for nesting deeper than the interpreter's recursion limit, also while
# merely skipping an unknown field, so a hostile or corrupt payload could otherwise
# escape as a crash (found by tests/test_properties.py).
_DECODE_ERRORS = (msgspec.DecodeError, msgspec.ValidationError, RecursionError)


# msgpack first byte -> (fixed extra bytes, bytes of a length field, children per count),
# for the iterative skipper below; fix* types are handled inline.
_SKIP: dict[int, tuple[int, int, int]] = {
    0xC0: (0, 0, 0),
    0xC2: (0, 0, 0),
    0xC3: (0, 0, 0),
    0xC4: (0, 1, 0),
    0xC5: (0, 2, 0),
    0xC6: (0, 4, 0),  # bin: length = bytes
    0xC7: (1, 1, 0),
    0xC8: (1, 2, 0),
    0xC9: (1, 4, 0),  # ext: type byte + data
    0xCA: (4, 0, 0),
    0xCB: (8, 0, 0),
    0xCC: (1, 0, 0),
    0xCD: (2, 0, 0),
    0xCE: (4, 0, 0),
    0xCF: (8, 0, 0),
    0xD0: (1, 0, 0),
    0xD1: (2, 0, 0),
    0xD2: (4, 0, 0),
    0xD3: (8, 0, 0),
    0xD4: (2, 0, 0),
    0xD5: (3, 0, 0),
    0xD6: (5, 0, 0),
    0xD7: (9, 0, 0),
    0xD8: (17, 0, 0),
    0xD9: (0, 1, 0),
    0xDA: (0, 2, 0),
    0xDB: (0, 4, 0),  # str
    0xDC: (0, 2, 1),
    0xDD: (0, 4, 1),  # array: length = items
    0xDE: (0, 2, 2),
    0xDF: (0, 4, 2),  # map: length = key/value pairs
}


def _skip(buf: memoryview, pos: int) -> int:
    """Return the end of the msgpack value at ``pos``, without recursion."""
    end = len(buf)
    pending = 1
    while pending:
        if pos >= end:
            raise msgspec.DecodeError("Input data was truncated")
        b = buf[pos]
        pos += 1
        pending -= 1
        if b <= 0x7F or b >= 0xE0:
            continue
        if b <= 0x8F:
            pending += 2 * (b & 0x0F)
        elif b <= 0x9F:
            pending += b & 0x0F
        elif b <= 0xBF:
            pos += b & 0x1F
        else:
            spec = _SKIP.get(b)
            if spec is None:
                raise msgspec.DecodeError(f"invalid msgpack byte 0x{b:02x}")
            fixed, lbytes, children = spec
            n = 0
            if lbytes:
                if pos + lbytes > end:
                    raise msgspec.DecodeError("Input data was truncated")
                n = int.from_bytes(buf[pos : pos + lbytes], "big")
                pos += lbytes
            if children:
                pending += children * n
            else:
                pos += fixed + n
    if pos > end:
        raise msgspec.DecodeError("Input data was truncated")
    return pos


def _container(buf: memoryview, pos: int, kind: str) -> tuple[int, int]:
    """Read an array or map header at ``pos``: (element count, position after it)."""
    if pos >= len(buf):
        raise msgspec.DecodeError("Input data was truncated")
    b = buf[pos]
    small, n16, n32 = (0x90, 0xDC, 0xDD) if kind == "array" else (0x80, 0xDE, 0xDF)
    if small <= b <= small + 0x0F:
        return b & 0x0F, pos + 1
    if b in (n16, n32):
        w = 2 if b == n16 else 4
        if pos + 1 + w > len(buf):
            raise msgspec.DecodeError("Input data was truncated")
        return int.from_bytes(buf[pos + 1 : pos + 1 + w], "big"), pos + 1 + w
    raise msgspec.ValidationError(f"Expected `{kind}`")


_FLOAT = msgspec.msgpack.Decoder(float)
_OPT_INT = msgspec.msgpack.Decoder(int | None)
_STR = msgspec.msgpack.Decoder(str)


def _split_batch(raw: bytes | memoryview, benc: EventEncoding) -> _ArrayBatchRaw | _MapBatchRaw:
    """Split a batch into its events' bytes without recursion (see ``decode_batch``)."""
    buf = memoryview(raw)
    fields: dict[str, tuple[int, int]] = {}
    if benc == "array":
        n, pos = _container(buf, 0, "array")
        if n < 2:
            raise msgspec.ValidationError(f"Expected `array` of at least length 2, got {n}")
        for i in range(n):
            start, pos = pos, _skip(buf, pos)
            if i < 3:
                fields[("ts", "events", "data_parallel_rank")[i]] = (start, pos)
    else:
        n, pos = _container(buf, 0, "map")
        for _ in range(n):
            kstart, pos = pos, _skip(buf, pos)
            start, pos = pos, _skip(buf, pos)
            try:
                key = _STR.decode(buf[kstart:start])
            except _DECODE_ERRORS:
                continue
            fields[key] = (start, pos)
    if pos != len(buf):
        raise msgspec.DecodeError("MessagePack data is malformed: trailing characters")
    if "ts" not in fields or "events" not in fields:
        raise msgspec.ValidationError("Object missing required field `ts` or `events`")
    ts = _FLOAT.decode(buf[slice(*fields["ts"])])
    rank = None
    if "data_parallel_rank" in fields:
        rank = _OPT_INT.decode(buf[slice(*fields["data_parallel_rank"])])
    count, pos = _container(buf, fields["events"][0], "array")
    events: list[msgspec.Raw] = []
    for _ in range(count):
        start, pos = pos, _skip(buf, pos)
        events.append(msgspec.Raw(buf[start:pos]))
    if benc == "array":
        return _ArrayBatchRaw(ts, events, rank)
    return _MapBatchRaw(ts, events, rank)


def _reason(err: Exception) -> str:
    if isinstance(err, RecursionError):
        return "nested too deeply to decode"
    return str(err)


def _batch_encoding(raw: bytes | memoryview) -> EventEncoding:
    if not raw:
        raise msgspec.DecodeError("empty payload")
    first = raw[0]
    if 0x80 <= first <= 0x8F or first in (0xDE, 0xDF):
        return "map"
    return "array"


def _event_encoding(raw: msgspec.Raw) -> EventEncoding:
    view = memoryview(raw)
    first = view[0] if len(view) else 0
    if 0x90 <= first <= 0x9F or first in (0xDC, 0xDD):
        return "array"
    return "map"


def _describe_event(raw: msgspec.Raw, err: Exception) -> tuple[str, str | None]:
    """Name an undecodable event: its type tag if it has one, and why it failed.

    Returns:
        The message, and the event's tag (at most 64 characters) when kvtool does not
        know it, else None.
    """
    try:
        obj = _ANY.decode(raw)
    except _DECODE_ERRORS:
        return f"undecodable event ({_reason(err)})", None
    tag: object = None
    if isinstance(obj, dict):
        tag = obj.get("type")
    elif isinstance(obj, list) and obj:
        tag = obj[0]
    if isinstance(tag, str) and tag not in EVENT_TYPES:
        return f"unknown event type {tag[:64]!r}", tag[:64]
    return f"malformed {tag if isinstance(tag, str) else 'event'} ({_reason(err)})", None


class DecodedBatch(Protocol):
    """What a :class:`BatchProjection` decode returns: the batch with its events."""

    ts: float
    events: list[Any]
    data_parallel_rank: int | None


class BatchProjection:
    """Whole-batch decoders for one choice of event structs, in every batch layout.

    vLLM batches are arrays (maps in one development revision) whose events are either
    all maps (vLLM >= 0.24) or all arrays (older). This builds the four batch wrappers
    for a pair of event unions, sniffs the batch encoding from the first byte, and tries
    first the event encoding that worked last (a stream does not change layout). The
    full decoder here, the report's lean column decoder and the recorder's status
    counter are three projections of the same batch through this one mechanism.

    Args:
        name: Prefix of the generated struct names.
        map_events: The union of map-encoded event structs.
        array_events: The union of array-encoded event structs.
        gc: Whether the generated batch structs are tracked by the GC.
    """

    def __init__(self, name: str, map_events: object, array_events: object, *, gc: bool = True):
        self._decoders: dict[tuple[EventEncoding, EventEncoding], msgspec.msgpack.Decoder[Any]] = {}
        for benc in ("array", "map"):
            for eenc, union in (("map", map_events), ("array", array_events)):
                struct = msgspec.defstruct(
                    f"{name}_{benc}_batch_{eenc}_events",
                    [
                        ("ts", float),
                        ("events", list[union]),  # type: ignore[valid-type]
                        ("data_parallel_rank", int | None, None),
                    ],
                    array_like=benc == "array",
                    gc=gc,
                )
                self._decoders[(benc, eenc)] = msgspec.msgpack.Decoder(struct)  # type: ignore[index]
        self._last: dict[EventEncoding, EventEncoding] = {"array": "map", "map": "map"}

    def decode(
        self, raw: bytes | memoryview, *, first: EventEncoding | None = None
    ) -> tuple[DecodedBatch, EventEncoding, EventEncoding] | None:
        """Decode a whole batch in one msgspec call, or return None if it does not fit.

        Args:
            raw: The payload.
            first: The event encoding to try first (default: the last that worked).

        Returns:
            ``(batch, batch_encoding, event_encoding)``, or None when neither event
            encoding decodes the payload (the caller then falls back to a slower path).
        """
        if not raw:
            return None
        benc = _batch_encoding(raw)
        guess = first or self._last[benc]
        for eenc in (guess, "array" if guess == "map" else "map"):
            try:
                batch = self._decoders[(benc, eenc)].decode(raw)
            except _DECODE_ERRORS:
                continue
            self._last[benc] = eenc
            return batch, benc, eenc
        return None

    def decode_all(self, raws: Sequence[bytes]) -> list[DecodedBatch] | None:
        """Decode many payloads of one stream with one decoder, or return None.

        A stream keeps its layout, so one decoder (the first payload's batch encoding,
        the event encoding that worked last, else the other) is mapped over all of them
        in C; if no decoder fits every payload (mixed layouts, damage), None is returned
        and the caller decodes payload by payload with :meth:`decode`. Each payload
        decodes as :meth:`decode` would decode it: a decoder for one batch encoding
        refuses the other, and a batch decodes in at most one event encoding (an event
        is either a map or an array; an empty list is the same batch in both).

        Args:
            raws: The payloads.

        Returns:
            The batches in order, or None.
        """
        if not raws or not raws[0]:
            return None
        benc = _batch_encoding(raws[0])
        guess = self._last[benc]
        for eenc in (guess, "array" if guess == "map" else "map"):
            try:
                batches = list(map(self._decoders[(benc, eenc)].decode, raws))
            except _DECODE_ERRORS:
                continue
            self._last[benc] = eenc
            return batches
        return None


_FULL = BatchProjection("kv", _MapEvent, _ArrayEvent)


def decode_batch(raw: bytes | memoryview, *, seq: int | None = None) -> KVEventBatch:
    """Decode one ZMQ payload (a msgpack ``KVEventBatch``) in any layout vLLM has sent.

    The whole batch is decoded in one msgspec call; only if that fails is it decoded
    event by event, so one unknown or malformed event is skipped (and named in
    ``skipped``) while its neighbours are kept.

    Args:
        raw: The payload frame, byte for byte as received.
        seq: The batch's sequence number, used in error messages.

    Returns:
        The decoded batch.

    Raises:
        ProtocolError: The payload is not a batch at all (not msgpack, no ``ts`` or
            ``events``, wrong types at the batch level).
    """
    where = f"seq {seq}: " if seq is not None else ""
    try:
        benc = _batch_encoding(raw)
    except msgspec.DecodeError as err:
        raise ProtocolError(f"{where}malformed payload: {err}", seq=seq) from err
    # Fast path: the whole batch in one msgspec call.
    hit = _FULL.decode(raw)
    if hit is not None:
        batch, benc, hit_eenc = hit
        return KVEventBatch(
            ts=batch.ts,
            events=batch.events,
            data_parallel_rank=batch.data_parallel_rank,
            batch_encoding=benc,
            event_encoding=hit_eenc if batch.events else "map",
        )
    try:
        rawb = _RAW_DECODERS[benc].decode(raw)
    except RecursionError as err:
        # Some event nests deeper than msgspec can even skip: split the batch without
        # recursion so that only that event is lost, not its neighbours.
        try:
            rawb = _split_batch(raw, benc)
        except _DECODE_ERRORS as err2:
            raise ProtocolError(f"{where}malformed payload: {_reason(err2)}", seq=seq) from err
    except _DECODE_ERRORS as err:
        raise ProtocolError(f"{where}malformed payload: {_reason(err)}", seq=seq) from err
    assert isinstance(rawb, _ArrayBatchRaw | _MapBatchRaw)
    eenc: EventEncoding = _event_encoding(rawb.events[0]) if rawb.events else "map"
    # Slow path: event by event, each in the encoding its own bytes show.
    events: list[Event] = []
    skipped: list[str] = []
    unknown: list[str] = []
    for i, ev_raw in enumerate(rawb.events):
        dec = _ARRAY_EVENT if _event_encoding(ev_raw) == "array" else _MAP_EVENT
        try:
            events.append(dec.decode(ev_raw))
        except _DECODE_ERRORS as err:
            text, tag = _describe_event(ev_raw, err)
            skipped.append(f"{where}event {i}: {text}")
            if tag is not None:
                unknown.append(tag)
    return KVEventBatch(
        ts=rawb.ts,
        events=events,
        data_parallel_rank=rawb.data_parallel_rank,
        batch_encoding=benc,
        event_encoding=eenc,
        skipped=tuple(skipped),
        unknown_tags=tuple(unknown),
    )


_FLOAT64 = struct.Struct(">d")
_FLOAT32 = struct.Struct(">f")


def peek_ts(raw: bytes | memoryview) -> float | None:
    """Return a payload's ``ts`` without decoding its events, or None if it has none.

    Args:
        raw: The payload frame.

    Returns:
        The batch timestamp in float seconds, or None for a payload that is not a batch.
    """
    # Every vLLM release sends an array batch whose ts is a float64: read it from the
    # header (the recorder calls this per message; a full skip of the events costs
    # ~5 us per 15 kB payload). Anything else takes the validating decoder.
    if len(raw) >= 10 and raw[0] in (0x92, 0x93):
        if raw[1] == 0xCB:
            return float(_FLOAT64.unpack_from(raw, 2)[0])
        if raw[1] == 0xCA:
            return float(_FLOAT32.unpack_from(raw, 2)[0])
    try:
        obj = _TS_DECODERS[_batch_encoding(raw)].decode(raw)
    except _DECODE_ERRORS:
        return None
    assert isinstance(obj, _ArrayTs | _MapTs)
    return obj.ts


def hash_key(h: Hash) -> int:
    """Map a block hash to one signed 64-bit integer key.

    Ints are taken modulo 2**64 into the signed range (vLLM's uint64 and SGLang's
    signed int64 agree); bytes map to their last 8 bytes big-endian, as vLLM's own
    conversion does.

    Args:
        h: The hash as sent.

    Returns:
        A value in [-2**63, 2**63).
    """
    if isinstance(h, bytes):
        h = int.from_bytes(h[-8:], "big")
    h &= 0xFFFFFFFFFFFFFFFF
    return h - (1 << 64) if h >= (1 << 63) else h


def event_to_builtins(event: Event) -> dict[str, object]:
    """Turn an event into a JSON-friendly dict: ``type`` first, bytes as lower-case hex.

    Args:
        event: A decoded event.

    Returns:
        ``{"type": …, field: value, …}`` with every field as decoded.
    """
    out: dict[str, object] = {"type": type(event).__struct_config__.tag}
    for name in event.__struct_fields__:
        out[name] = _jsonable(getattr(event, name))
    return out


def _jsonable(value: object) -> object:
    # Iterative, not recursive: msgspec decodes nesting almost as deep as the recursion
    # limit, so a recursive walk of such a value (e.g. in extra_keys) would raise
    # RecursionError in the caller (found by tests/test_properties.py, issue 5).
    if isinstance(value, bytes):
        return value.hex()
    if not isinstance(value, list | tuple | dict):
        return value
    root: list[object] = [None]
    stack: list[tuple[object, list[object] | dict[str, object], int | str]] = [(value, root, 0)]
    while stack:
        src, parent, key = stack.pop()
        out: object
        if isinstance(src, bytes):
            out = src.hex()
        elif isinstance(src, list | tuple):
            items: list[object] = [None] * len(src)
            stack.extend((v, items, i) for i, v in enumerate(src))
            out = items
        elif isinstance(src, dict):
            mapping: dict[str, object] = {}
            for k, v in src.items():
                mapping[str(k)] = None  # keep the key order
                stack.append((v, mapping, str(k)))
            out = mapping
        else:
            out = src
        parent[key] = out  # type: ignore[index]
    return root[0]


def event_type(event: Event) -> str:
    """Return the event's wire type tag (``BlockStored``, ``BlockRemoved``, …).

    Args:
        event: A decoded event.

    Returns:
        The tag string.
    """
    tag = type(event).__struct_config__.tag
    assert isinstance(tag, str)
    return tag


__all__ = [
    "EVENT_TYPES",
    "REMOVED_ARRAY_INDEX",
    "STORED_ARRAY_INDEX",
    "AllBlocksCleared",
    "BlockRemoved",
    "BlockStored",
    "Event",
    "EventEncoding",
    "Hash",
    "Int64",
    "KVEventBatch",
    "decode_batch",
    "event_to_builtins",
    "event_type",
    "hash_key",
    "peek_ts",
]
