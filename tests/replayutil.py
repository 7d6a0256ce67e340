"""Helpers for the replay/annotate/publish tests: captures into recordings, stripping kinds."""

from __future__ import annotations

from pathlib import Path

import msgspec

from kvtool.protocol import STORED_ARRAY_INDEX
from kvtool.recording import RecordingWriter
from tests.conftest import capture_messages

BASE_NS = 1_764_000_000_000_000_000
STEP_NS = 1_000_000  # 1 ms between recorded batches
ENDPOINT = "tcp://127.0.0.1:5557"

_ANY = msgspec.msgpack.Decoder()
_ENC = msgspec.msgpack.Encoder()

KIND_INDEX = STORED_ARRAY_INDEX["kv_cache_spec_kind"]
WINDOW_INDEX = STORED_ARRAY_INDEX["kv_cache_spec_sliding_window"]


_TOP = msgspec.msgpack.Decoder(list[msgspec.Raw] | dict[str, msgspec.Raw])
_RAW_LIST = msgspec.msgpack.Decoder(list[msgspec.Raw])


def _encode_map16(ev: dict) -> bytes:
    # vLLM's msgspec writes map events (omit_defaults Structs) under a map16 header.
    return (
        b"\xde"
        + len(ev).to_bytes(2, "big")
        + b"".join(_ENC.encode(k) + _ENC.encode(v) for k, v in ev.items())
    )


def strip_payload(payload: bytes) -> bytes:
    """Remove kind/window from every BlockStored as an older vLLM would have sent it.

    Map events lose the two keys (same header style); array events are cut back to the
    layout before kinds existed (group_idx last). Everything else keeps its bytes.
    """
    top = _TOP.decode(payload)
    raw_events = top[1] if isinstance(top, list) else top["events"]
    events = _RAW_LIST.decode(raw_events)
    for i, raw in enumerate(events):
        ev = _ANY.decode(raw)
        if isinstance(ev, dict) and ev.get("type") == "BlockStored":
            ev.pop("kv_cache_spec_kind", None)
            ev.pop("kv_cache_spec_sliding_window", None)
            map16 = bytes(raw)[:1] == b"\xde"
            events[i] = msgspec.Raw(_encode_map16(ev) if map16 else _ENC.encode(ev))
        elif isinstance(ev, list) and ev and ev[0] == "BlockStored" and len(ev) > KIND_INDEX:
            del ev[KIND_INDEX:]
            events[i] = msgspec.Raw(_ENC.encode(ev))
    new = msgspec.Raw(_ENC.encode(events))
    if isinstance(top, list):
        top[1] = new
    else:
        top["events"] = new
    return _ENC.encode(top)


def write_recording(
    path: Path,
    messages: list[tuple[bytes, int, bytes]],
    *,
    endpoint: str = ENDPOINT,
    groups: list[dict[str, object]] | None = None,
    dp_rank: int | None = 0,
    base_ns: int = BASE_NS,
    step_ns: int = STEP_NS,
    chunk_size: int | None = None,
) -> Path:
    """Write ``(topic, seq, payload)`` messages into a recording, 1 ms apart."""
    kw = {} if chunk_size is None else {"chunk_size": chunk_size}
    with RecordingWriter(path, **kw) as w:  # type: ignore[arg-type]
        channels: dict[str, int] = {}
        for i, (topic, seq, payload) in enumerate(messages):
            t = topic.decode()
            if t not in channels:
                channels[t] = w.add_channel(endpoint, t, dp_rank)
            w.write(channels[t], seq, payload, base_ns + i * step_ns)
        if groups is not None:
            w.add_groups(groups, "test")
    return path


def capture_recording(
    tmp_path: Path,
    name: str,
    *,
    strip: bool = False,
    groups: list[dict[str, object]] | None = None,
    **kw: object,
) -> Path:
    """A capture as a recording (optionally with kinds stripped)."""
    msgs = capture_messages(name)
    if strip:
        msgs = [(t, s, strip_payload(p)) for t, s, p in msgs]
    suffix = ".stripped" if strip else ""
    return write_recording(
        tmp_path / f"{name}{suffix}.mcap",
        msgs,
        groups=groups,
        **kw,  # type: ignore[arg-type]
    )
